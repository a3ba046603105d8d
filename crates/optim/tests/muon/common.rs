//! Shared generators and measures for the Muon tests.

use kappa_linalg::{singular_values, svd_thin, SvdDriver};
use kappa_optim::Msign;
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

// ---------------------------------------------------------------------------------------------
// Derived tolerances (docs/optim.md, "Tolerances of the Muon tests"). Every tolerance comparing
// two f64 computations is built from these, with the quantities they need computed in the test.

/// f64's unit roundoff u = 2⁻⁵³.
pub const U64: f64 = f64::EPSILON / 2.0;

/// γ_k = k·u/(1 − k·u) (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1): the
/// worst-case relative error bound of k rounded operations in sequence (a length-k sum or inner
/// product: |fl(xᵀy) − xᵀy| ≤ γ_k·|x|ᵀ|y|).
pub fn gamma(k: usize) -> f64 {
    let ku = k as f64 * U64;
    ku / (1.0 - ku)
}

/// The normwise backward error, and the loss of orthogonality of the computed singular vectors,
/// of a Householder-based SVD of an m×n matrix (LAPACK's QR iteration or divide and conquer, and
/// the polar factor U·Vᵀ formed from it): γ̃_{mn} = γ_{c·mn} (Higham, Thm 19.4 for Householder
/// QR; bidiagonalization applies the same reflections from both sides), with c = 4, one for each
/// stage: bidiagonalization, the bidiagonal SVD, accumulating U and V, forming U·Vᵀ. Relative to
/// ‖X‖_F; it does not depend on the conditioning of X.
pub fn svd_err(m: usize, n: usize) -> f64 {
    gamma(4 * m * n)
}

/// First-order perturbation bound of the polar factor of a full-rank m×n X (m ≥ n or its
/// transpose): with X = UΣVᵀ, a perturbation E moves Q = UVᵀ by dQ = U·K·Vᵀ + U_⊥·F·Σ⁻¹·Vᵀ,
/// K_ij = (Ẽ_ij − Ẽ_ji)/(σ_i + σ_j), Ẽ = UᵀEV, F = U_⊥ᵀEV, so ‖dQ‖_F ≤ √2·‖E‖_F/σ_min; the
/// factor 2 here covers the second-order term while ‖E‖ ≪ σ_min. `rel` is ‖E‖_F/‖X‖_F; the
/// result bounds ‖ΔQ‖_F (hence every entry).
pub fn polar_perturbation(x_fro: f64, sigma_min: f64, rel: f64) -> f64 {
    2.0 * rel * x_fro / sigma_min
}

/// The relative perturbation size of [`amplification`]: f32's unit roundoff 2⁻²⁴, far above
/// f64 rounding (so the probe is not noise) and small enough that the response is linear for
/// the amplifications met here (δ·A < 1e-2 is checked by [`amplification`]).
pub const PROBE: f64 = f32::EPSILON as f64 / 2.0;

/// The measured amplification of an input perturbation through `f` (the method of
/// tch_backend.rs's module docs, in f64): every input entry moves by δ·max|x|·r_ij, r_ij = ±1
/// from a seeded generator, δ = [`PROBE`], and the result is max|f(perturbed) − f|/δ: the effect
/// of one rounding injection of size u·max|x| per entry. The perturbation is absolute (not
/// relative to each entry) because that is the shape of the rounding errors of the products
/// inside (γ_k·|A|·|B| per entry): it also excites directions that the inputs' structure leaves
/// empty, e.g. the null direction of an odd skew matrix (whose zero diagonal a relative
/// perturbation never moves; found by `msign_preserves_skew_symmetry`, n = 3).
pub fn amplification(f: impl Fn(&[Array2<f64>]) -> Array2<f64>, inputs: &[Array2<f64>]) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(0x0a3b_1f1e);
    let perturbed: Vec<Array2<f64>> = inputs
        .iter()
        .map(|x| {
            let size = PROBE * max_abs(x);
            x.mapv(|v| {
                let r: f64 = StandardNormal.sample(&mut rng);
                v + size * r.signum()
            })
        })
        .collect();
    let a = max_abs_diff(&f(&perturbed), &f(inputs)) / PROBE;
    // Linear regime: the largest change the probe causes is δ·A < 1e-2, where the Newton–Schulz
    // polynomials are linear to |b|·x²/a ≤ 3e-4 relative (Polar Express's first step, b/a = −2.85).
    assert!(
        a * PROBE < 1e-2,
        "probe not in the linear regime: δ·A = {}",
        a * PROBE
    );
    a
}

/// The tolerance of a comparison between two f64 computations of the same map (tch_backend.rs's
/// module docs with u = 2⁻⁵³): `injections` rounding injections of relative size u, each
/// amplified at most as much as one at the inputs (`amp`, from [`amplification`]), √k the
/// probabilistic growth of a length-k inner product's rounding error (Higham & Mary), floored at
/// u·`out_max`, the outputs' own rounding.
pub fn derived_tol(injections: usize, k: usize, amp: f64, out_max: f64) -> f64 {
    injections as f64 * (k as f64).sqrt() * (amp * U64).max(U64 * out_max)
}

pub fn max_abs(a: &Array2<f64>) -> f64 {
    a.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// Bound of ‖QᵀQ − I‖_F for Q an msign/retraction output formed from a computed SVD (its
/// vectors orthonormal to [`svd_err`]), measured by [`stiefel_error`]: 2·svd_err (QᵀQ − I picks
/// up the error of Q twice) per column (√n), plus the rounding of the measure itself (the
/// length-m inner products of QᵀQ: γ_m per entry, n² entries of size ≤ 1 → n·γ_m).
pub fn orthonormality_tol(m: usize, n: usize) -> f64 {
    let (m, n) = (m.max(n), m.min(n));
    2.0 * svd_err(m, n) * (n as f64).sqrt() + n as f64 * gamma(m)
}

/// The most a rounding injection into Gram Newton–Schulz's r×r recurrence is amplified beyond
/// one at its input: the gain of the accumulated factor Q it feeds, ‖Q‖₂ ≤ Γ = max over blocks of
/// Π_j max_{t ∈ [0, 1.25]} |a_j + b_j t² + c_j t⁴| (Q is the product of the steps' M = p(R)/√R
/// on iterates whose σ stay below 1.25; grid of step 1e-5, the ratio is a smooth quartic).
/// 1 for the other variants.
pub fn gram_gain(method: Msign) -> f64 {
    let (Msign::GramPolarExpress { restart, .. }, Some(sched)) = (method, method.schedule()) else {
        return 1.0;
    };
    let ratio_max = |p: &kappa_linalg::PolyStep| {
        (0..=125_000)
            .map(|i| {
                let t = i as f64 * 1e-5;
                (p.a + p.b * t * t + p.c * t.powi(4)).abs()
            })
            .fold(0.0, f64::max)
    };
    sched
        .steps
        .chunks(restart)
        .map(|block| block.iter().map(ratio_max).product::<f64>())
        .fold(0.0, f64::max)
}
