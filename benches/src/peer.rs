//! The PyTorch side of a side-by-side benchmark: a reference script in `benches/reference/`,
//! run by the project's Python as a child process that works on command.
//!
//! The protocol is one line each way: the script prints one line when it is ready (a header the
//! caller checks), then answers every request line with one reply line, and exits on `quit`
//! (sent when the [`Peer`] is dropped). Because the child stays alive, its timings can alternate
//! with kappa's in one run (see [`crate::paired`]) rather than being taken before or after.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The workspace's root directory (the parent of this crate's).
pub fn workspace_root() -> PathBuf {
    kappa_testkit::crate_dir()
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// The virtual environment that holds torch: `$KAPPA_VENV`, or `<workspace>/.venv` (the same
/// rule as `cargo xtask setup`).
pub fn venv() -> PathBuf {
    std::env::var_os("KAPPA_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv"))
}

/// The Python that runs the reference scripts: `$KAPPA_PYTHON` (which `cargo xtask bench`
/// sets), else the one in [`venv`].
pub fn python() -> PathBuf {
    std::env::var_os("KAPPA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| venv().join("bin/python"))
}

/// A command running `benches/reference/<script>` with [`python`] on `threads` threads (the
/// OpenMP, MKL and OpenBLAS pools all told). The reference runs without `LD_PRELOAD`: a library
/// preloaded into the bench (an allocator, docs/architecture.md) applies to kappa's side only.
pub fn reference_command(script: &str, threads: usize) -> Command {
    let mut cmd = Command::new(python());
    cmd.env_remove("LD_PRELOAD");
    cmd.arg(workspace_root().join("benches/reference").join(script));
    for var in ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"] {
        cmd.env(var, threads.to_string());
    }
    cmd
}

/// A reference script running as a child process, answering one line per request.
pub struct Peer {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Peer {
    /// Starts `cmd` with piped stdin/stdout (stderr goes to ours) and returns the peer with the
    /// first line it printed (its ready header, for the caller to check).
    pub fn start(mut cmd: Command) -> Result<(Self, String), String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
        let input = child.stdin.take().ok_or("no stdin")?;
        let output = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut peer = Self {
            child,
            input,
            output,
        };
        let ready = peer.line()?;
        Ok((peer, ready))
    }

    /// Sends one request line and returns the reply line.
    pub fn ask(&mut self, request: &str) -> Result<String, String> {
        writeln!(self.input, "{request}").map_err(|e| e.to_string())?;
        self.input.flush().map_err(|e| e.to_string())?;
        self.line()
    }

    /// [`Peer::ask`], with the reply parsed as whitespace-separated numbers.
    pub fn ask_numbers(&mut self, request: &str) -> Result<Vec<f64>, String> {
        let reply = self.ask(request)?;
        reply
            .split_whitespace()
            .map(|w| w.parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("unexpected reply {reply:?} to {request:?}"))
    }

    fn line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        match self.output.read_line(&mut line) {
            Ok(0) => Err("the reference exited (run it by hand to see why)".into()),
            Ok(_) => Ok(line.trim().to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = writeln!(self.input, "quit");
        let _ = self.input.flush();
        let _ = self.child.wait();
    }
}
