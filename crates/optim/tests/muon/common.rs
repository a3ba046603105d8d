//! Shared generators and measures for the Muon tests.

use kappa_linalg::{singular_values, svd_thin, SvdDriver};
use ndarray::{Array1, Array2, Axis};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

pub use kappa_testkit::config;

pub fn gaussian(rows: usize, cols: usize, seed: u64) -> Array2<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Array2::from_shape_simple_fn((rows, cols), || StandardNormal.sample(&mut rng))
}

/// m×k with orthonormal columns.
pub fn orthonormal(m: usize, k: usize, seed: u64) -> Array2<f64> {
    svd_thin(gaussian(m, k, seed).view(), SvdDriver::QrIteration)
        .expect("svd")
        .u
}

/// U diag(s) Vᵀ with random orthonormal factors.
pub fn with_spectrum(m: usize, n: usize, s: &[f64], seed: u64) -> Array2<f64> {
    let k = s.len();
    let u = orthonormal(m, k, seed);
    let v = orthonormal(n, k, seed.wrapping_add(7));
    let s = Array1::from(s.to_vec());
    (&u * &s.view().insert_axis(Axis(0))).dot(&v.t())
}

pub fn sv(a: &Array2<f64>) -> Vec<f64> {
    singular_values(a.view(), SvdDriver::QrIteration)
        .expect("svd")
        .to_vec()
}

pub fn spectral(a: &Array2<f64>) -> f64 {
    sv(a)[0]
}

pub fn fro(a: &Array2<f64>) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

pub fn max_abs_diff(a: &Array2<f64>, b: &Array2<f64>) -> f64 {
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Tall orientation.
pub fn tall(a: &Array2<f64>) -> Array2<f64> {
    if a.nrows() < a.ncols() {
        a.t().to_owned()
    } else {
        a.clone()
    }
}

/// ‖WᵀW − I‖_F in the tall orientation.
pub fn stiefel_error(w: &Array2<f64>) -> f64 {
    let w = tall(w);
    let n = w.ncols();
    fro(&(w.t().dot(&w) - Array2::<f64>::eye(n)))
}

/// ‖Off(WᵀW)‖_F in the tall orientation.
pub fn off_diag(w: &Array2<f64>) -> f64 {
    let w = tall(w);
    let mut c = w.t().dot(&w);
    c.diag_mut().fill(0.0);
    fro(&c)
}

/// Column norms (tall orientation).
pub fn col_norms(w: &Array2<f64>) -> Vec<f64> {
    tall(w)
        .columns()
        .into_iter()
        .map(|c| c.dot(&c).sqrt())
        .collect()
}

/// Shapes: tall, square and wide (exercises the transposes).
pub fn shapes() -> impl Strategy<Value = (usize, usize, u64)> {
    prop_oneof![
        Just((48usize, 16usize)),
        Just((16, 48)),
        Just((24, 24)),
        Just((40, 12)),
        Just((12, 40)),
        Just((32, 20)),
    ]
    .prop_flat_map(|(m, n)| (Just(m), Just(n), any::<u64>()))
}
