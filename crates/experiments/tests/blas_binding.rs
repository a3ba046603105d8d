//! In the `kappa-experiments` binary that `cargo xtask reproduce` runs, libtorch's GEMMs are
//! libtorch's (not OpenBLAS's, which the binary also links), and OpenBLAS's kernel is not a
//! generic fallback: the binary's `--help` is started with every symbol bound at start-up, and its
//! `blas` command reports the kernel.

use std::process::Command;

#[test]
fn the_experiments_binary_keeps_libtorchs_gemms() {
    let mut help = Command::new(env!("CARGO_BIN_EXE_kappa-experiments"));
    help.arg("--help");
    kappa_testkit::binding::assert_libtorch_keeps_its_gemms(help);
}

#[test]
fn the_experiments_binary_runs_no_generic_kernel() {
    let out = Command::new(env!("CARGO_BIN_EXE_kappa-experiments"))
        .arg("blas")
        .output()
        .expect("running kappa-experiments blas");
    assert!(out.status.success());
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!("{report}");
    if std::env::var_os("OPENBLAS_CORETYPE").is_some() {
        eprintln!("skipped: OPENBLAS_CORETYPE chose the kernel; kappa keeps it");
        return;
    }
    assert!(report.contains("kernel"), "no kernel reported: {report}");
    assert!(!report.contains("WARNING"), "{report}");
}
