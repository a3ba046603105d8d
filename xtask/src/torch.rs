//! libtorch for `tch` 0.26: PyPI's `torch==2.13.0` in a virtual environment, or a folder given
//! through `LIBTORCH`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Result};

use crate::setup::Report;
use crate::workspace::{output_of, run, Workspace};

/// The PyTorch version `tch` 0.26 is written against; torch-sys refuses any other.
pub const TORCH_VERSION: &str = "2.13.0";

/// A libtorch that `tch` can build and run against.
pub struct Libtorch {
    /// The folder with `lib/` and `include/` (the installed `torch` Python package works).
    pub dir: PathBuf,
}

impl Libtorch {
    /// The folder with the shared libraries, for the runtime library path.
    pub fn lib_dir(&self) -> PathBuf {
        self.dir.join("lib")
    }
}

/// Finds or installs libtorch and reports which.
pub fn ensure(ws: &Workspace, report: &mut Report) -> Result<Libtorch> {
    if let Some(dir) = std::env::var_os("LIBTORCH").filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        check_libtorch_dir(&dir, "LIBTORCH")?;
        let version = check_version(&dir, "LIBTORCH")?;
        report.found(
            "libtorch",
            format!("{version} from LIBTORCH={}", dir.display()),
        );
        return Ok(Libtorch { dir });
    }

    let venv = ws.venv_dir();
    if let Some(dir) = torch_in_venv(&venv) {
        let version = check_version(&dir, "the virtual environment")?;
        check_libtorch_dir(&dir, "the virtual environment's torch")?;
        report.found("libtorch", format!("torch {version} in {}", venv.display()));
        return Ok(Libtorch { dir });
    }

    install(&venv)?;
    let Some(dir) = torch_in_venv(&venv) else {
        bail!(
            "pip reported success but no torch package is in {}; install it by hand:\n    {}",
            venv.display(),
            install_command(&venv)
        );
    };
    let version = check_version(&dir, "the virtual environment")?;
    check_libtorch_dir(&dir, "the virtual environment's torch")?;
    report.did(
        "libtorch",
        format!("installed torch {version} into {}", venv.display()),
    );
    Ok(Libtorch { dir })
}

fn install_command(venv: &Path) -> String {
    format!(
        "python3 -m venv {v} && {v}/bin/python -m pip install torch=={TORCH_VERSION}",
        v = venv.display()
    )
}

fn install(venv: &Path) -> Result<()> {
    eprintln!(
        "setup: installing torch=={TORCH_VERSION} from PyPI into {} (about 4.7 GB with its CUDA \
         libraries, a few minutes; needed only once)",
        venv.display()
    );
    let python = venv.join("bin/python");
    if !python.exists() {
        let Some(version) = output_of(Command::new("python3").arg("--version")) else {
            bail!(
                "python3 was not found; torch comes from PyPI and needs Python 3.10 or newer.\n\
                 Install it (Debian: `apt-get install -y python3 python3-venv`), then run `cargo \
                 xtask setup` again, or install libtorch yourself and set LIBTORCH to its folder."
            );
        };
        eprintln!("setup: using {}", version.trim());
        if let Err(e) = run(Command::new("python3").args(["-m", "venv"]).arg(venv)) {
            bail!(
                "{e}\ncould not create the virtual environment. On Debian `apt-get install -y \
                 python3-venv` provides the venv module; then run:\n    {}",
                install_command(venv)
            );
        }
    }
    let pip = run(Command::new(&python).args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        &format!("torch=={TORCH_VERSION}"),
    ]));
    if let Err(e) = pip {
        bail!(
            "{e}\ncould not install torch=={TORCH_VERSION} from PyPI. Check that pypi.org is \
             reachable and that there is about 10 GB free, then run:\n    {}",
            install_command(venv)
        );
    }
    Ok(())
}

/// The `torch` package folder inside a virtual environment, if one is installed there.
fn torch_in_venv(venv: &Path) -> Option<PathBuf> {
    let lib = fs::read_dir(venv.join("lib")).ok()?;
    let mut candidates: Vec<PathBuf> = lib
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages/torch"))
        .filter(|p| p.join("version.py").is_file())
        .collect();
    candidates.sort();
    candidates.pop()
}

/// Checks that a folder holds libtorch's shared libraries and headers, naming what is missing.
fn check_libtorch_dir(dir: &Path, origin: &str) -> Result<()> {
    let required = ["lib/libtorch_cpu.so", "lib/libc10.so", "include/torch"];
    let missing: Vec<&str> = required
        .iter()
        .copied()
        .filter(|rel| !dir.join(rel).exists())
        .collect();
    if !missing.is_empty() {
        bail!(
            "{origin} points at {}, which is not a libtorch folder: {} missing.\n\
             Fix: unset LIBTORCH so that setup installs torch=={TORCH_VERSION} into the \
             repository's .venv, or point LIBTORCH at the `torch` folder of a torch=={TORCH_VERSION} \
             install (python -c 'import torch, os; print(os.path.dirname(torch.__file__))') or at \
             an unpacked libtorch {TORCH_VERSION} archive.",
            dir.display(),
            missing.join(", ")
        );
    }
    Ok(())
}

/// Reads the version of a libtorch folder (`version.py` of the Python package, or the
/// `build-version` file of a libtorch archive) and checks it against [`TORCH_VERSION`].
fn check_version(dir: &Path, origin: &str) -> Result<String> {
    let version = fs::read_to_string(dir.join("version.py"))
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                let rest = line.strip_prefix("__version__")?;
                Some(
                    rest.trim_start_matches([' ', '='])
                        .trim()
                        .trim_matches('\'')
                        .trim_matches('"')
                        .to_string(),
                )
            })
        })
        .or_else(|| {
            fs::read_to_string(dir.join("build-version"))
                .ok()
                .map(|s| s.trim().to_string())
        });
    let Some(version) = version else {
        bail!(
            "{origin}: cannot tell the version of the libtorch in {} (neither version.py nor \
             build-version is there); tch 0.26 needs exactly {TORCH_VERSION}.",
            dir.display()
        );
    };
    let base = version.split('+').next().unwrap_or(&version);
    if base != TORCH_VERSION {
        bail!(
            "{origin}: the libtorch in {} is version {version}, but tch 0.26 needs exactly \
             {TORCH_VERSION}.\nFix: python -m pip install torch=={TORCH_VERSION} in that \
             environment, or unset LIBTORCH / remove {} so that setup installs the right one.",
            dir.display(),
            dir.display()
        );
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kappa-xtask-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_folder_without_libtorch_names_what_is_missing_and_the_fix() {
        let dir = scratch("empty");
        let err = check_libtorch_dir(&dir, "LIBTORCH")
            .unwrap_err()
            .to_string();
        assert!(err.contains("lib/libtorch_cpu.so"), "{err}");
        assert!(err.contains("unset LIBTORCH"), "{err}");
    }

    #[test]
    fn versions_are_read_from_the_python_package_and_checked() {
        let dir = scratch("version");
        fs::write(dir.join("version.py"), "__version__ = '2.13.0+cu130'\n").unwrap();
        assert_eq!(check_version(&dir, "test").unwrap(), "2.13.0+cu130");
        fs::write(dir.join("version.py"), "__version__ = '2.5.1'\n").unwrap();
        let err = check_version(&dir, "test").unwrap_err().to_string();
        assert!(
            err.contains("2.5.1") && err.contains(TORCH_VERSION),
            "{err}"
        );
    }

    #[test]
    fn versions_are_read_from_a_libtorch_archive() {
        let dir = scratch("archive");
        fs::write(dir.join("build-version"), "2.13.0+cpu\n").unwrap();
        assert_eq!(check_version(&dir, "test").unwrap(), "2.13.0+cpu");
    }
}
