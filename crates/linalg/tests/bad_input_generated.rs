//! The seeded bad-input run of kappa-linalg: every public entry point, on hostile matrices
//! (NaN/±∞, empty, 1×1, zero, rank one, 1e±300, near `MAX`, subnormal, mismatched shapes) in
//! every memory layout (standard, column-major, strided, row-reversed), f32 and f64, and on
//! out-of-range parameters. Each call runs under `kappa_testkit::hostile::Fuzz` (deadline,
//! caught panics) and its answer is checked: the documented error naming the right argument,
//! or a value within a derived tolerance of an f64 reference computed on the exactly rescaled
//! input. Fixed seeds: every run makes the same calls.

mod bad_input_generated {
    pub mod cond;
    pub mod iterative;
    pub mod kron;
    pub mod matrix;
    pub mod newton_schulz;
    pub mod psd;
    pub mod support;
    pub mod svd;
    #[cfg(feature = "tch")]
    pub mod tch_backend;
}

use bad_input_generated::*;
use kappa_testkit::hostile::Fuzz;

#[test]
fn svd_entry_points() {
    let mut fuzz = Fuzz::new("kappa-linalg svd");
    svd::run::<f64>(&mut fuzz);
    svd::run::<f32>(&mut fuzz);
    assert!(fuzz.finish() >= 1500);
}

#[test]
fn cond_entry_points() {
    let mut fuzz = Fuzz::new("kappa-linalg cond");
    cond::run::<f64>(&mut fuzz);
    cond::run::<f32>(&mut fuzz);
    assert!(fuzz.finish() >= 1500);
}

#[test]
fn iterative_entry_points() {
    let mut fuzz = Fuzz::new("kappa-linalg iterative");
    iterative::run::<f64>(&mut fuzz);
    iterative::run::<f32>(&mut fuzz);
    assert!(fuzz.finish() >= 1500);
}

#[test]
fn newton_schulz_entry_points() {
    let mut fuzz = Fuzz::new("kappa-linalg newton_schulz");
    newton_schulz::run::<f64>(&mut fuzz);
    newton_schulz::run::<f32>(&mut fuzz);
    assert!(fuzz.finish() >= 1500);
}

#[test]
fn psd_entry_points() {
    let mut fuzz = Fuzz::new("kappa-linalg psd");
    psd::run::<f64>(&mut fuzz);
    psd::run::<f32>(&mut fuzz);
    assert!(fuzz.finish() >= 500);
}

#[test]
fn kron_entry_points() {
    let mut fuzz = Fuzz::new("kappa-linalg kron");
    kron::run::<f64>(&mut fuzz);
    kron::run::<f32>(&mut fuzz);
    assert!(fuzz.finish() >= 1000);
}

#[test]
fn matrix_trait_entry_points() {
    let mut fuzz = Fuzz::new("kappa-linalg Matrix for Array2");
    matrix::run::<f64>(&mut fuzz);
    matrix::run::<f32>(&mut fuzz);
    assert!(fuzz.finish() >= 1000);
}

#[cfg(feature = "tch")]
#[test]
fn tch_backend_entry_points() {
    let mut fuzz = Fuzz::new("kappa-linalg tch backend");
    tch_backend::run(&mut fuzz);
    assert!(fuzz.finish() >= 80);
}
