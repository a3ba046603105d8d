//! `cargo xtask setup`: OpenBLAS, libtorch and the data sets, each found or installed, with a
//! line saying which.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Result};

use crate::data::{self, DataSelection};
use crate::torch::{self, Libtorch};
use crate::workspace::{is_root, output_of, run, Workspace};

/// What setup found and what it changed.
#[derive(Default)]
pub struct Report {
    changed: usize,
}

impl Report {
    /// Something was already in place.
    pub fn found(&mut self, what: &str, detail: String) {
        eprintln!("setup: {what:<14} present: {detail}");
    }

    /// Something was installed or converted.
    pub fn did(&mut self, what: &str, detail: String) {
        self.changed += 1;
        eprintln!("setup: {what:<14} {detail}");
    }

    fn finish(&self) {
        if self.changed == 0 {
            eprintln!("setup: everything was already in place; nothing to do");
        } else {
            eprintln!("setup: done ({} change(s))", self.changed);
        }
    }
}

/// What the rest of xtask needs from setup.
pub struct Toolchain {
    /// The libtorch every cargo call builds and runs against.
    pub libtorch: Libtorch,
}

/// Finds or installs everything, then the requested data sets.
pub fn setup(ws: &Workspace, data: &DataSelection) -> Result<Toolchain> {
    let mut report = Report::default();
    openblas(&mut report)?;
    let libtorch = torch::ensure(ws, &mut report)?;
    for set in &data.0 {
        data::ensure(*set, &ws.data_dir(), &mut report)?;
    }
    report.finish();
    Ok(Toolchain { libtorch })
}

/// Installs the data sets an experiment run needs (after the toolchain is known).
pub fn data_only(ws: &Workspace, data: &DataSelection) -> Result<()> {
    let mut report = Report::default();
    for set in &data.0 {
        data::ensure(*set, &ws.data_dir(), &mut report)?;
    }
    Ok(())
}

const OPENBLAS_PACKAGE: &str = "libopenblas-dev";
const OPENBLAS_LIBS: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/libopenblas.so",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so",
    "/usr/lib64/libopenblas.so",
];

/// OpenBLAS with LAPACK for ndarray-linalg's `openblas-system` backend.
fn openblas(report: &mut Report) -> Result<()> {
    let dpkg = output_of(Command::new("dpkg-query").args([
        "-W",
        "-f=${Status}|${Version}",
        OPENBLAS_PACKAGE,
    ]));
    if let Some(status) = &dpkg {
        if let Some((state, version)) = status.split_once('|') {
            if state.ends_with(" installed") {
                report.found("openblas", format!("{OPENBLAS_PACKAGE} {version}"));
                return Ok(());
            }
        }
    } else if let Some(lib) = OPENBLAS_LIBS.iter().find(|p| Path::new(p).exists()) {
        report.found("openblas", (*lib).to_string());
        return Ok(());
    }
    if dpkg.is_none() && output_of(Command::new("apt-get").arg("--version")).is_none() {
        bail!(
            "OpenBLAS (with LAPACK) was not found and this is not a Debian-like system. Install \
             your distribution's OpenBLAS development package (it must provide libopenblas.so \
             with LAPACK), then run `cargo xtask setup` again."
        );
    }
    if !is_root() {
        bail!(
            "{OPENBLAS_PACKAGE} is not installed and installing it needs root. Run:\n    sudo \
             apt-get update && sudo apt-get install -y {OPENBLAS_PACKAGE}\nthen `cargo xtask \
             setup` again."
        );
    }
    let install = || {
        run(Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", OPENBLAS_PACKAGE])
            .env("DEBIAN_FRONTEND", "noninteractive"))
    };
    if install().is_err() {
        run(Command::new("apt-get").arg("update"))?;
        install()?;
    }
    report.did(
        "openblas",
        format!("installed {OPENBLAS_PACKAGE} with apt-get"),
    );
    Ok(())
}
