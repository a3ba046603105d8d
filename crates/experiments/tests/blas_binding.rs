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

/// The binary answers MKL's vendor check (`kappa_linalg::mkl_intel_path!`, exported by
/// build.rs), so libtorch's MKL takes its feature-based ("Intel") code path on every x86 CPU;
/// with `KAPPA_MKL_VENDOR_CHECK=keep` a non-Intel CPU is back on MKL's generic path. Skipped,
/// with a message, where the loaded libtorch has no MKL (an Arm build).
#[test]
fn libtorchs_mkl_chooses_kernels_by_cpu_features_in_the_experiments_binary() {
    let report = |keep: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kappa-experiments"));
        cmd.arg("blas");
        if keep {
            cmd.env("KAPPA_MKL_VENDOR_CHECK", "keep");
        } else {
            cmd.env_remove("KAPPA_MKL_VENDOR_CHECK");
        }
        let out = cmd.output().expect("running kappa-experiments blas");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let opted = report(false);
    eprintln!("{opted}");
    if opted.contains("libtorch MKL: not found") {
        eprintln!("skipped: this libtorch exports no MKL vendor check");
        return;
    }
    assert!(opted.contains("Intel code path"), "{opted}");
    let kept = report(true);
    if kept.contains("non-Intel CPU") {
        assert!(kept.contains("generic code path"), "{kept}");
    }
}
