//! In the benchmark binaries (which link kappa-linalg's OpenBLAS, tch and kappa-models, like
//! this test binary), libtorch's GEMMs are libtorch's: the test re-runs its own binary with every
//! symbol bound at start-up and reads the dynamic linker's report.

use std::process::Command;

/// Does nothing beyond touching each library, so the child's bindings are start-up bindings.
#[test]
fn idle() {
    let _ = tch::Tensor::from(1.0f32);
    let a = kappa_benches::gaussian::<f64>(3, 3, 0);
    assert!(kappa_linalg::condition_number(a.view()).is_ok());
}

#[test]
fn libtorch_gemms_bind_to_libtorch() {
    if std::env::var_os("KAPPA_BLAS_BINDING_CHILD").is_some() {
        return;
    }
    let mut child = Command::new(std::env::current_exe().expect("the test binary's path"));
    child
        .args(["--exact", "idle", "--test-threads", "1"])
        .env("KAPPA_BLAS_BINDING_CHILD", "1");
    kappa_testkit::binding::assert_libtorch_keeps_its_gemms(child);
}
