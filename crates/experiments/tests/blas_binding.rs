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

/// Where the libtorch the build used has a CUDA library, the binary needs it (see build.rs):
/// otherwise `--device cuda` could not find a GPU. Read from the ELF dynamic section with
/// `readelf` (binutils); skipped, with a message, where there is no CUDA libtorch or no readelf.
#[test]
fn the_experiments_binary_loads_libtorchs_cuda_library_where_libtorch_has_one() {
    let Some(root) = std::env::var_os("LIBTORCH") else {
        eprintln!("skipped: LIBTORCH is not set, so the build's libtorch is unknown");
        return;
    };
    if !std::path::Path::new(&root)
        .join("lib/libtorch_cuda.so")
        .is_file()
    {
        eprintln!("skipped: this libtorch has no CUDA library");
        return;
    }
    let Ok(out) = Command::new("readelf")
        .args(["-d", env!("CARGO_BIN_EXE_kappa-experiments")])
        .output()
    else {
        eprintln!("skipped: no readelf");
        return;
    };
    let dynamic = String::from_utf8_lossy(&out.stdout);
    assert!(
        dynamic.contains("[libtorch_cuda.so]"),
        "libtorch_cuda.so is not a needed library of kappa-experiments:\n{dynamic}"
    );
}
