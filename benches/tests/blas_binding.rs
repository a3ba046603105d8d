//! In the benchmark binaries (which link kappa-linalg's OpenBLAS, tch and kappa-models, like
//! this test binary), libtorch's GEMMs are libtorch's: the test re-runs its own binary with every
//! symbol bound at start-up and reads the dynamic linker's report.

/// Does nothing beyond touching each library, so the child's bindings are start-up bindings.
#[test]
fn idle() {
    let _ = tch::Tensor::from(1.0f32);
    let a = kappa_benches::gaussian::<f64>(3, 3, 0);
    assert!(kappa_linalg::condition_number(a.view()).is_ok());
}

#[test]
fn libtorch_gemms_bind_to_libtorch() {
    kappa_testkit::binding::assert_this_test_binary_keeps_libtorchs_gemms("idle");
}
