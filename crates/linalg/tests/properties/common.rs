//! Shared generators: seeded Gaussian matrices, random orthogonal factors, prescribed spectra.

use kappa_linalg::{singular_values, svd_thin, NsSchedule, Real, SvdDriver};
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

// ---------------------------------------------------------------------------------------------
// Derived tolerances (docs/linalg.md, "Tolerances of the tests"). Every tolerance comparing two
// floating-point computations is built from these, with the input-dependent quantities (σ₁, σ_k,
// gaps, ‖A‖_F, sizes) computed in the test that uses them.

/// f64's unit roundoff u = 2⁻⁵³.
pub const U64: f64 = f64::EPSILON / 2.0;

/// f32's unit roundoff 2⁻²⁴.
pub const U32: f64 = f32::EPSILON as f64 / 2.0;

/// γ_k = k·u/(1 − k·u) for unit roundoff `u` (Higham, *Accuracy and Stability of Numerical
/// Algorithms*, §3.1): |fl(xᵀy) − xᵀy| ≤ γ_k·|x|ᵀ|y| for a length-k inner product, so
/// |fl(AB) − AB| ≤ γ_k·|A||B| entrywise for an inner dimension k.
pub fn gamma_u(k: usize, u: f64) -> f64 {
    let ku = k as f64 * u;
    assert!(ku < 0.5, "γ_{k} undefined for u = {u:e}");
    ku / (1.0 - ku)
}

/// γ_k in f64.
pub fn gamma(k: usize) -> f64 {
    gamma_u(k, U64)
}

/// The constant c of the SVD bound c·max(m, n)·ε: **30, a choice**, the one docs/linalg.md
/// documents (Accuracy: ‖A − UΣVᵀ‖_F ≤ 30·max(m,n)·ε·‖A‖_F, |σ̂_i − σ_i| ≤ 30·max(m,n)·ε·σ₁) and
/// the bad-input test uses (`Reference::p`). LAPACK's Users' Guide (§4.9) gives p(m, n)·ε·σ₁ with
/// "a modestly growing function" p; Householder bidiagonalization is backward stable with
/// p = O(max(m, n)) (Higham, Thm 19.4 applied from both sides).
pub const SVD_C: f64 = 30.0;

/// The relative SVD bound 30·max(m, n)·ε for an m×n input in a type with machine epsilon `eps`
/// (ε = 2u, as the docs state it). Multiply by σ₁ (singular values, Weyl: the backward error E
/// moves every σ by ≤ ‖E‖₂) or by ‖A‖_F (the reconstruction residual). The same constant bounds
/// the loss of orthogonality of the computed U and V (‖UᵀU − I‖, Householder accumulation) and,
/// as a choice stated where it is used, the backward error of the other Householder-based
/// factorizations of the crate (thin QR of the inverse iteration, `?syevd` of the PSD roots, the
/// Golub–Kahan–Lanczos process with full reorthogonalization).
pub fn svd_rel(m: usize, n: usize, eps: f64) -> f64 {
    SVD_C * m.max(n) as f64 * eps
}

/// ‖QᵀQ − I‖₂ ≤ ‖QᵀQ − I‖_F of a computed Q (m×k, m ≥ k), measured, plus the rounding of forming
/// QᵀQ (γ_m per entry of size ≤ (1 + e), k² entries → k·γ_m): a rigorous upper bound on the
/// departure of Q from orthonormal columns.
pub fn orthonormality(q: &Array2<f64>) -> f64 {
    let k = q.ncols();
    let g = q.t().dot(q) - Array2::<f64>::eye(k);
    fro(&g) + k as f64 * gamma(q.nrows()) * 1.01
}

/// What `with_spectrum(m, n, s, seed)` perturbs the prescribed spectrum `s` by: it forms
/// fl(U·diag(s)·Vᵀ) with U, V orthonormal only to e_U = ‖UᵀU − I‖₂, e_V. Writing U = Q_U·H_U
/// (polar, ‖H_U − I‖₂ ≤ e_U since H_U² = UᵀU), σ_i(H_U S H_V) ∈ s_i·[(1 − e_U)(1 − e_V),
/// (1 + e_U)(1 + e_V)] (σ_i(XSY) ≤ ‖X‖‖Y‖σ_i(S) both ways): a *relative* error `rel`. The product
/// rounds by γ_{k+1}·|U||S||V|ᵀ entrywise, ‖·‖₂ ≤ ‖·‖_F ≤ γ_{k+1}·‖U‖_F·σ₁·‖V‖_F ≤ γ_{k+1}·k·σ₁·(1 +
/// e)²: an *absolute* error `abs` (Weyl). Returns (rel, abs), recomputing U and V (deterministic).
pub fn spectrum_generator_error(m: usize, n: usize, s: &Array1<f64>, seed: u64) -> (f64, f64) {
    let k = s.len();
    let eu = orthonormality(&orthonormal(m, k, seed));
    let ev = orthonormality(&orthonormal(n, k, seed.wrapping_add(1)));
    let rel = eu + ev + eu * ev;
    let s1 = s.iter().fold(0.0f64, |a, &x| a.max(x));
    (rel, gamma(k + 1) * k as f64 * s1 * (1.0 + rel))
}

/// Polar-factor perturbation (Higham, *Functions of Matrices*, Thm 8.9 for square A; Li & Sun
/// for m ≠ n): ‖Q(A + E) − Q(A)‖_F ≤ 2‖E‖_F/(σ_k(A) + σ_k(A + E)) (square),
/// and ≤ 2‖E‖_F/σ_k-type for rectangular A; we use 2‖E‖_F/(σ_k − ‖E‖₂) for both, valid while
/// ‖E‖₂ < σ_k (checked: ∞ otherwise).
pub fn polar_perturbation(e_fro: f64, sigma_k: f64) -> f64 {
    if e_fro < sigma_k {
        2.0 * e_fro / (sigma_k - e_fro)
    } else {
        f64::INFINITY
    }
}

#[path = "../helpers/ns_bound.rs"]
mod ns_bound;
pub use ns_bound::{gram_ns_error_bound, ns_error_bound};

/// The normalized singular values σ_i/(c·‖X‖_F) of `a` under `sched` and (r, s) = (min, max) of
/// its shape, for [`ns_error_bound`]; with the SVD's error of those values (30·max(m,n)·ε·x₁,
/// absolute), which callers comparing against a prediction from them add as `e0`.
pub fn ns_inputs(a: &Array2<f64>, sched: &NsSchedule) -> (usize, usize, Vec<f64>, f64) {
    let (m, n) = a.dim();
    let s = singular_values(a.view(), SvdDriver::QrIteration).expect("svd");
    let f = fro(a) * sched.normalization;
    let x: Vec<f64> = s.iter().map(|v| v / f).collect();
    let sv_err = svd_rel(m, n, f64::EPSILON) * x[0];
    (m.min(n), m.max(n), x, sv_err)
}

/// The distance |x − v| from `x` to the nearest of `values`.
pub fn distance_to_nearest(values: &[f64], x: f64) -> f64 {
    values
        .iter()
        .map(|s| (s - x).abs())
        .fold(f64::INFINITY, f64::min)
}

/// The argument an empty, non-finite or invalid input is reported as (panics on anything else).
pub fn input_error_arg(r: kappa_linalg::Result<Array2<f64>>) -> &'static str {
    use kappa_linalg::{InputError, LinalgError};
    match r {
        Err(LinalgError::Input(
            InputError::Empty { arg, .. }
            | InputError::NonFinite { arg, .. }
            | InputError::InvalidArgument { arg, .. },
        )) => arg,
        other => panic!("expected an input error, got {:?}", other.map(|_| "Ok(..)")),
    }
}
