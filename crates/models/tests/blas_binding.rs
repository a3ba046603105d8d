//! libtorch's GEMMs are libtorch's: in a binary that links kappa-models (and through it
//! kappa-linalg's OpenBLAS), the dynamic linker binds libtorch_cpu's own `sgemm_`/`dgemm_` calls
//! to libtorch_cpu, not to OpenBLAS (see `src/link.rs`).
//!
//! The test re-runs this test binary with every symbol bound at start-up and reads the dynamic
//! linker's report ([`kappa_testkit::binding`]).

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
    kappa_testkit::binding::assert_this_test_binary_keeps_libtorchs_gemms("idle");
}
