//! Shared generators: seeded Gaussian matrices, random orthogonal factors, prescribed spectra.

use kappa_linalg::{svd_thin, Real, SvdDriver};
use ndarray::{Array1, Array2, Axis};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal, Uniform};

/// Case count for the cheap properties (kept small so the whole suite runs in seconds).
pub const CASES: u32 = 96;

pub fn config() -> ProptestConfig {
    kappa_testkit::config(CASES)
}

pub fn gaussian<A: Real>(rows: usize, cols: usize, seed: u64) -> Array2<A> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Array2::from_shape_simple_fn((rows, cols), || {
        A::from_f64_lossy(StandardNormal.sample(&mut rng))
    })
}

/// An m×k matrix with orthonormal columns (m ≥ k), from the SVD of a Gaussian matrix.
pub fn orthonormal(m: usize, k: usize, seed: u64) -> Array2<f64> {
    let g: Array2<f64> = gaussian(m, k, seed);
    svd_thin(g.view(), SvdDriver::QrIteration).expect("svd").u
}

/// U diag(s) Vᵀ with random orthonormal U (m×k), V (n×k), k = s.len() ≤ min(m, n).
pub fn with_spectrum(m: usize, n: usize, s: &Array1<f64>, seed: u64) -> Array2<f64> {
    let k = s.len();
    let u = orthonormal(m, k, seed);
    let v = orthonormal(n, k, seed.wrapping_add(1));
    (&u * &s.view().insert_axis(Axis(0))).dot(&v.t())
}

/// k singular values spread log-uniformly over [1/kappa, 1].
pub fn spectrum(k: usize, kappa: f64, seed: u64) -> Array1<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let d = Uniform::new_inclusive(0.0, 1.0);
    let mut s = Array1::from_shape_fn(k, |_| kappa.powf(-d.sample(&mut rng)));
    s[0] = 1.0;
    if k > 1 {
        s[k - 1] = 1.0 / kappa;
    }
    s
}

pub fn max_abs_diff<A: Real>(a: &Array2<A>, b: &Array2<A>) -> f64 {
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x.to_f64_lossy() - y.to_f64_lossy()).abs())
        .fold(0.0, f64::max)
}

pub fn fro<A: Real>(a: &Array2<A>) -> f64 {
    a.iter()
        .map(|x| x.to_f64_lossy().powi(2))
        .sum::<f64>()
        .sqrt()
}

/// (rows, cols, seed) with rows, cols in 1..=max.
pub fn dims(max: usize) -> impl Strategy<Value = (usize, usize, u64)> {
    (1..=max, 1..=max, any::<u64>())
}
