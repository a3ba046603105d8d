//! libtorch's GEMMs are libtorch's: in a binary that links kappa-models (and through it
//! kappa-linalg's OpenBLAS), the dynamic linker binds libtorch_cpu's own `sgemm_`/`dgemm_` calls
//! to libtorch_cpu, not to OpenBLAS (see `src/link.rs`).
//!
//! The test re-runs this test binary with `LD_BIND_NOW=1 LD_DEBUG=bindings` (glibc's dynamic
//! linker then reports every symbol binding at start-up) and reads the report. Where the linker
//! reports nothing (not glibc), it says so and checks nothing.

use std::process::Command;

/// Does nothing: the child process runs only this, so its bindings are all start-up bindings.
#[test]
fn idle() {
    // Use tch, kappa-linalg (OpenBLAS) and kappa-models directly, like a user binary that
    // measures spectra and trains (and like kappa-models' `training` test, where OpenBLAS came
    // first among the needed libraries before `src/link.rs`).
    let _ = tch::Tensor::from(1.0f32);
    let a = ndarray::array![[2.0, 0.0], [0.0, 1.0]];
    assert_eq!(kappa_linalg::condition_number(a.view()).unwrap(), 2.0);
    let _ = kappa_models::GptConfig::tiny(8);
}

#[test]
fn libtorch_gemms_bind_to_libtorch() {
    if std::env::var_os("KAPPA_BLAS_BINDING_CHILD").is_some() {
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["--exact", "idle", "--test-threads", "1"])
        .env("LD_BIND_NOW", "1")
        .env("LD_DEBUG", "bindings")
        .env("KAPPA_BLAS_BINDING_CHILD", "1")
        .output()
        .expect("re-running the test binary");
    let report = String::from_utf8_lossy(&out.stderr);
    let bindings: Vec<&str> = report
        .lines()
        .filter(|l| l.contains("binding file"))
        .collect();
    if bindings.is_empty() {
        eprintln!("skipped: the dynamic linker reports no bindings here (not glibc?)");
        return;
    }
    let from_torch = |symbol: &str| {
        bindings
            .iter()
            .filter(|l| l.contains(symbol))
            .filter(|l| {
                l.split(" to ")
                    .next()
                    .is_some_and(|from| from.contains("libtorch_cpu"))
            })
            .copied()
            .collect::<Vec<_>>()
    };
    for symbol in ["`sgemm_'", "`dgemm_'"] {
        let lines = from_torch(symbol);
        assert!(
            !lines.is_empty(),
            "libtorch_cpu's {symbol} binding not found in the linker's report"
        );
        for line in lines {
            let target = line.split(" to ").nth(1).unwrap_or("");
            assert!(
                target.contains("libtorch_cpu"),
                "libtorch_cpu's {symbol} is bound to another library: {line}"
            );
        }
    }
}
