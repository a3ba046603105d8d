//! Where things live: the repository root, the virtual environment, the data and results folders.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The kappa checkout that xtask works on.
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// The repository root: the parent of this crate's manifest directory, as cargo says at
    /// run time (`cargo xtask`, `cargo test`), else where xtask was compiled. The run-time value
    /// matters for xtask's tests: cargo reuses their build from a shared target directory after
    /// the checkout moved, and the compiled-in path would then be another checkout's.
    pub fn locate() -> Result<Self> {
        let manifest = env::var_os("CARGO_MANIFEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
        let root = manifest
            .parent()
            .context("xtask's manifest directory has no parent")?
            .to_path_buf();
        if !root.join("Cargo.toml").is_file() {
            bail!("{} is not the kappa workspace root", root.display());
        }
        Ok(Self { root })
    }

    /// The repository root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The Python virtual environment that holds `torch==2.13.0`: `$KAPPA_VENV`, or `.venv` in
    /// the repository (git-ignored).
    pub fn venv_dir(&self) -> PathBuf {
        env_path("KAPPA_VENV").unwrap_or_else(|| self.root.join(".venv"))
    }

    /// The data folder: `$KAPPA_DATA`, or `data` in the repository (git-ignored).
    pub fn data_dir(&self) -> PathBuf {
        env_path("KAPPA_DATA").unwrap_or_else(|| self.root.join("data"))
    }

    /// Cargo's target folder: `$CARGO_TARGET_DIR`, or `target` in the repository.
    pub fn target_dir(&self) -> PathBuf {
        env_path("CARGO_TARGET_DIR").unwrap_or_else(|| self.root.join("target"))
    }

    /// The results folder that `reproduce` writes: `$KAPPA_RESULTS`, or `results` in the
    /// repository (git-ignored).
    pub fn results_dir(&self) -> PathBuf {
        env_path("KAPPA_RESULTS").unwrap_or_else(|| self.root.join("results"))
    }
}

fn env_path(name: &str) -> Option<PathBuf> {
    env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// A command that ran and did not succeed: its command line and exit status (xtask exits with
/// the same code when it is the one that says "try again later", [`kappa_cli::REQUEUE_EXIT_CODE`]).
#[derive(Debug)]
pub struct Failed {
    /// The command line.
    pub line: String,
    /// How it ended.
    pub status: std::process::ExitStatus,
}

impl Failed {
    /// The exit code xtask forwards for `error`: the child's when a command that xtask ran
    /// stopped for a requeue, else none (xtask exits 1).
    pub fn forwarded_code(error: &anyhow::Error) -> Option<u8> {
        let failed = error.chain().find_map(|e| e.downcast_ref::<Failed>())?;
        let requeue = kappa_cli::REQUEUE_EXIT_CODE;
        (failed.status.code() == Some(i32::from(requeue))).then_some(requeue)
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` failed ({})", self.line, self.status)
    }
}

impl std::error::Error for Failed {}

/// Runs a command with inherited output, failing with the command line ([`Failed`]) when it
/// does not succeed.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = describe(cmd);
    eprintln!("$ {line}");
    let started = std::time::Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        return Err(Failed { line, status }.into());
    }
    // Where a long command's time went, for logs such as CI's (quick commands say nothing).
    let took = started.elapsed().as_secs_f64();
    if took >= 10.0 {
        eprintln!("$ (that took {took:.0} s)");
    }
    Ok(())
}

/// Lets Ctrl-C reach the child alone: the terminal sends SIGINT to xtask and to the training
/// binary it runs (one process group); the binary checkpoints and says how to resume, and xtask
/// stays to report how it ended instead of dying first. A no-op where there are no signals.
pub fn leave_ctrl_c_to_the_child() -> Result<()> {
    #[cfg(unix)]
    signal_hook::flag::register(
        signal_hook::consts::SIGINT,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    )
    .context("installing the SIGINT handler")?;
    Ok(())
}

/// The largest config file read: a TOML config of kappa is a few KiB; 16 MiB leaves room for any
/// hand-written one and keeps a wrong path (a data file, a disk image) from being read whole.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The text of a config file given on the command line: a regular file (not a FIFO, which
/// would block, or a folder) of at most [`MAX_CONFIG_BYTES`], in UTF-8; errors name the path.
pub fn read_config_text(path: &Path) -> Result<String> {
    let meta = std::fs::metadata(path).with_context(|| format!("--config {}", path.display()))?;
    if !meta.is_file() {
        bail!("--config {}: not a regular file", path.display());
    }
    if meta.len() > MAX_CONFIG_BYTES {
        bail!(
            "--config {}: {} bytes, more than a config file's {MAX_CONFIG_BYTES}",
            path.display(),
            meta.len()
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("--config {}", path.display()))
}

/// Runs a command and returns its standard output, or `None` when it cannot start or fails.
pub fn output_of(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `program arg1 arg2 …`, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Whether this process runs as root (so `apt-get install` can work without sudo).
pub fn is_root() -> bool {
    output_of(Command::new("id").arg("-u")).is_some_and(|s| s.trim() == "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requeue_status_is_forwarded_and_other_failures_are_not() {
        let status = |code: i32| {
            let err = run(Command::new("sh").args(["-c", &format!("exit {code}")])).unwrap_err();
            Failed::forwarded_code(&err.context("reproduce"))
        };
        assert_eq!(status(75), Some(75));
        assert_eq!(status(1), None);
        assert_eq!(status(3), None);
        assert!(run(&mut Command::new("true")).is_ok());
    }
}
