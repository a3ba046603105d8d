//! A kernel switch is safe while OpenBLAS's thread pool is still starting.
//!
//! OpenBLAS's pthread build starts its workers when the library loads, so the start-up check
//! (and any early [`set_openblas_kernel`]) runs beside threads that read the kernel table as
//! they start. Without stopping them first, a few percent of processes crashed with SIGSEGV
//! inside `gotoblas_dynamic_init`. This test runs itself [`RUNS`] times as a fresh process whose
//! first act is to switch the kernel twice, then a threaded product, with 16 OpenBLAS threads so
//! that many workers are starting; every run must exit cleanly. (With the race, about 5% of
//! runs failed, so all 300 passing had odds of 0.95³⁰⁰ ≈ 2·10⁻⁷. Where the test links libtorch,
//! as in the workspace's build, loading it makes each run take about 0.2 s.)

// Switching the kernel is unsafe (no BLAS call may be in flight); the use below says why it holds.
#![allow(unsafe_code)]

use std::process::{Command, ExitCode};

use kappa_linalg::blas::{kernels_for_this_cpu, set_openblas_kernel};
use ndarray::Array2;

const RUNS: usize = 300;
const CHILD: &str = "KAPPA_KERNEL_SWITCH_CHILD";

fn main() -> ExitCode {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    if std::env::var_os("OPENBLAS_CORETYPE").is_some() {
        // The children drop it; said here so a reader of the log knows they switch anyway.
        eprintln!("note: OPENBLAS_CORETYPE is set here; the children run without it");
    }
    let exe = std::env::current_exe().expect("the test binary's own path");
    let mut failed = Vec::new();
    for run in 0..RUNS {
        let out = Command::new(&exe)
            .env(CHILD, "1")
            .env("OPENBLAS_NUM_THREADS", "16")
            .env_remove("OPENBLAS_CORETYPE")
            .output()
            .expect("spawning the test binary");
        if !out.status.success() {
            failed.push(format!(
                "run {run}: {} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    println!(
        "kernel switch at start: {} of {RUNS} runs failed",
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("{}", failed.join("\n"));
        ExitCode::FAILURE
    }
}

/// Switches to another kernel and back at once, then multiplies on OpenBLAS's threads.
fn child() -> ExitCode {
    let other = kernels_for_this_cpu()
        .first()
        .copied()
        .unwrap_or("Prescott");
    // SAFETY: this process has made no BLAS call and starts none until the switches return.
    let switched =
        unsafe { set_openblas_kernel(other).and_then(|_| set_openblas_kernel("Prescott")) };
    if let Err(e) = switched {
        // An OpenBLAS that cannot switch kernels has no race to test.
        eprintln!("no switch: {e}");
    }
    let n = 256;
    let a = Array2::from_shape_fn((n, n), |(i, j)| ((i * 7 + j * 3) % 11) as f64 - 5.0);
    let c = a.dot(&a.t());
    // C = A·Aᵀ is symmetric with a non-negative diagonal, exactly so for these small integers.
    let ok = (0..n).all(|i| c[[i, i]] >= 0.0 && (0..n).all(|j| c[[i, j]] == c[[j, i]]));
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
