//! Iterative estimates of σ_max, σ_min and κ for matrices too large for a full SVD.
//!
//! All three work on the *tall orientation* A ∈ ℝ^{m×n}, m ≥ n (a wide input is transposed,
//! which changes no singular value), so that AᵀA ∈ ℝ^{n×n} has exactly the eigenvalues σ_i²,
//! i = 1..k, k = min(m, n) — for a wide matrix the Gram of the long side would add spurious zero
//! eigenvalues. Start vectors are Gaussian, drawn from a seeded ChaCha generator, so results
//! are reproducible. Each function reports whether its stopping test was met; hitting the
//! iteration cap is `converged: false`, not an error.
//!
//! Stopping tests use *residuals*, which are rigorous in one direction: a residual r for an
//! eigenvalue estimate λ of the symmetric AᵀA guarantees an eigenvalue within r of λ (and an
//! error of order r²/gap near convergence). What no iterative method can guarantee is that the
//! eigenvalue it found is the *extreme* one: a start vector with (almost) no component along the
//! extreme singular vector finds the next one. Random start vectors make this a probability-zero
//! event in exact arithmetic and rare in floating point.
//!
//! # Scale safety
//!
//! The iterations run on A itself when ‖A‖_F lies in a safe range ([1e-100, 1e100] for f64,
//! [1e-12, 1e12] for f32) and otherwise on the copy 2^k·A scaled exactly by the power of two
//! that brings max |a_ij| into [0.5, 1), so products and squared norms never over- or underflow
//! for any finite input (subnormal to near `MAX`). The returned σ estimates are scaled back;
//! when one exceeds the element type's `MAX` the function fails with
//! [`LinalgError::Overflow`] (argument `a`). κ̂ itself is scale-free.

use ndarray::linalg::general_mat_vec_mul;
use ndarray::{s, Array1, Array2, ArrayView1, ArrayView2, Axis, CowArray, Ix2, ShapeBuilder};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::error::{lapack_err, LinalgError, Result};
use crate::input::{check_finite, InputError};
use crate::scalar::{scaled_copy, Pow2, Real};

/// The largest accepted [`IterativeOptions::max_iter`]: 2²⁰. An iteration whose tolerance is below
/// what rounding allows (tol ≲ n·ε) runs to the cap, so an unbounded cap would be a hang.
pub const MAX_ITERATIONS: usize = 1 << 20;

/// Tolerance, iteration cap, seed and stopping rule of an iterative estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IterativeOptions {
    /// The stopping tolerance in (0, 1): a relative residual ([`StopRule::Residual`]) or a
    /// relative error of κ̂ ([`StopRule::ErrorEstimate`]). Default 1e-3.
    pub tol: f64,
    /// Maximum number of iterations (each costs two matrix–vector products with A). Default 300.
    pub max_iter: usize,
    /// Seed of the random start vector. Default 0.
    pub seed: u64,
    /// What `tol` bounds in [`condition_number_estimate`] (the power and inverse iterations
    /// always test the residual). Default [`StopRule::Residual`].
    pub stop: StopRule,
}

impl Default for IterativeOptions {
    fn default() -> Self {
        Self {
            tol: 1e-3,
            max_iter: 300,
            seed: 0,
            stop: StopRule::Residual,
        }
    }
}

/// When [`condition_number_estimate`] stops (see its docs, "Stopping rules").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StopRule {
    /// Both extreme Ritz values have relative residual ≤ `tol`: rigorous (a singular value lies
    /// within the residual of each), and conservative — the error is of order residual²/gap, so
    /// tol = 1e-3 typically gives κ̂ to 1e-5 or better.
    #[default]
    Residual,
    /// The estimated relative error of κ̂, [`KappaEstimate::error_estimate`], is ≤ `tol`: the
    /// Kato–Temple bound residual²/gap with the gap taken from the neighbouring Ritz values, and
    /// never below twice the last step's relative change of κ̂. Stops as soon as the requested
    /// accuracy is (estimated to be) reached; heuristic, because the true gap is unknown.
    ErrorEstimate,
}

impl IterativeOptions {
    fn validate(&self) -> Result<()> {
        if !(self.tol.is_finite() && self.tol > 0.0 && self.tol < 1.0) {
            return Err(InputError::invalid(
                "opts.tol",
                format!("must lie in (0, 1), found {}", self.tol),
            )
            .into());
        }
        if self.max_iter == 0 || self.max_iter > MAX_ITERATIONS {
            return Err(InputError::invalid(
                "opts.max_iter",
                format!(
                    "must lie in [1, MAX_ITERATIONS = 2^20], found {}",
                    self.max_iter
                ),
            )
            .into());
        }
        Ok(())
    }
}

/// An iterative estimate of one singular value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SigmaEstimate<A> {
    /// The estimate of σ.
    pub value: A,
    /// Iterations performed.
    pub iterations: usize,
    /// Whether the relative residual fell below `tol` (or the answer is exact, e.g. A = 0).
    pub converged: bool,
    /// The final relative residual ‖AᵀA v − λ v‖ / λ, λ = σ² (0 when exact).
    pub residual: f64,
}

/// An iterative estimate of κ = σ_max/σ_min under the crate's κ rule (see [`crate::cond`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KappaEstimate<A> {
    /// κ̂ = σ̂_max/σ̂_min, or +∞ when σ̂_min ≤ σ̂_max·max(m, n)·ε (numerically rank-deficient).
    pub kappa: A,
    /// Estimate of σ₁.
    pub sigma_max: A,
    /// Estimate of σ_k, k = min(m, n).
    pub sigma_min: A,
    /// Lanczos steps performed (each costs one product with A and one with Aᵀ).
    pub iterations: usize,
    /// Whether both extreme Ritz values met the residual test (or the Krylov space was exhausted).
    pub converged: bool,
    /// The larger of the two final relative residuals.
    pub residual: f64,
    /// Estimated relative error |κ − κ̂|/κ (see [`StopRule::ErrorEstimate`]); 0 when the answer
    /// is exact (complete Krylov space, breakdown, A = 0), ∞ after a single step.
    pub error_estimate: f64,
}

/// Checks that `a` is non-empty and finite and returns ‖a‖_F, in one pass over `a` when it is
/// finite: Σ a² is finite exactly when every entry is (the norm falls back to a scaled sum on
/// overflow), so the entry-by-entry scan runs only to name a non-finite entry.
fn checked_norm<A: Real>(arg: &'static str, a: &ArrayView2<'_, A>) -> Result<f64> {
    let (rows, cols) = a.dim();
    if rows == 0 || cols == 0 {
        return Err(InputError::Empty { arg, rows, cols }.into());
    }
    let fro = crate::scalar::array_norm(a);
    if !fro.is_finite() {
        check_finite(arg, a)?;
    }
    Ok(fro)
}

fn tall<A: Real>(a: ArrayView2<'_, A>) -> ArrayView2<'_, A> {
    if a.nrows() >= a.ncols() {
        a
    } else {
        a.reversed_axes()
    }
}

/// A matrix whose products and squared norms cannot over- or underflow: `a` itself (borrowed, no
/// copy of a possibly large matrix) when its Frobenius norm `fro` lies in a safe range
/// ([1e-100, 1e100] for f64, [1e-12, 1e12] for f32), else the row-major copy 2^k·a with
/// max |a_ij|·2^k ∈ [0.5, 1) (exact; `fro` may be +∞ for finite entries near `MAX`). Returns the
/// matrix and the scaling.
fn normalized<A: Real>(a: ArrayView2<'_, A>, fro: f64) -> (CowArray<'_, A, Ix2>, Pow2) {
    let bound = if A::EPS > 1e-10 { 1e12 } else { 1e100 };
    if fro >= 1.0 / bound && fro <= bound {
        (CowArray::from(a), Pow2::ONE)
    } else {
        let (scaled, p) = scaled_copy(a);
        (CowArray::from(scaled), p)
    }
}

/// A σ estimate x of the scaled matrix 2^k·A, scaled back (x·2^−k), or
/// [`LinalgError::Overflow`] (argument `a`) when that exceeds the element type's `MAX`.
fn unscaled<A: Real>(x: A, p: Pow2, what: &str) -> Result<A> {
    let back = p.inverse();
    let y = back.apply(x);
    if y.is_finite() {
        Ok(y)
    } else {
        Err(LinalgError::Overflow {
            arg: "a",
            reason: format!(
                "{what} = {:e}·2^{} exceeds {}::MAX",
                x.to_f64_lossy(),
                back.k,
                A::NAME
            ),
        })
    }
}

fn start_vector<A: Real>(n: usize, seed: u64) -> Array1<A> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut v: Array1<A> = (0..n)
        .map(|_| A::from_f64_lossy(StandardNormal.sample(&mut rng)))
        .collect();
    let nv = norm(&v);
    v.mapv_inplace(|x| x / nv);
    v
}

fn norm<A: Real>(v: &Array1<A>) -> A {
    A::from_f64_lossy(crate::scalar::array_norm(v))
}

/// σ_max(A) = ‖A‖₂ by power iteration on AᵀA (tall orientation).
///
/// Math: v ← AᵀA v / ‖AᵀA v‖, λ = ‖A v‖² (the Rayleigh quotient), stopping when
/// ‖AᵀA v − λ v‖ ≤ tol·λ; returns sqrt(λ). Convergence is linear with ratio (σ₂/σ₁)², so it is
/// slow for clustered top singular values (use [`condition_number_estimate`], which runs
/// Lanczos, in that case). The estimate never exceeds σ₁ (up to rounding).
///
/// Cost: 4mn flops per iteration. Accuracy: on convergence, relative error ≲ tol/2 in σ, and
/// far less near convergence (error ~ residual²/gap).
///
/// Errors: `a` empty or non-finite (argument `a`); `opts.tol` outside (0, 1) (argument
/// `opts.tol`); `opts.max_iter` outside [1, [`MAX_ITERATIONS`]] (argument `opts.max_iter`);
/// [`LinalgError::Overflow`] (argument `a`) when the estimate exceeds the element type's `MAX`.
///
/// ```
/// use kappa_linalg::{sigma_max_power, IterativeOptions};
/// let a = ndarray::array![[3.0_f64, 0.0], [0.0, 1.0], [0.0, 0.0]];
/// let e = sigma_max_power(a.view(), IterativeOptions { tol: 1e-12, ..Default::default() }).unwrap();
/// assert!(e.converged && (e.value - 3.0).abs() < 1e-9);
/// ```
pub fn sigma_max_power<A: Real>(
    a: ArrayView2<'_, A>,
    opts: IterativeOptions,
) -> Result<SigmaEstimate<A>> {
    let fro = checked_norm("a", &a)?;
    opts.validate()?;
    let a = tall(a);
    if fro == 0.0 {
        return Ok(SigmaEstimate {
            value: A::zero(),
            iterations: 0,
            converged: true,
            residual: 0.0,
        });
    }
    let (a, scale) = normalized(a, fro);
    let a = a.view();
    let mut v = start_vector::<A>(a.ncols(), opts.seed);
    let mut lambda = A::zero();
    let mut residual = f64::INFINITY;
    for it in 1..=opts.max_iter {
        let u = a.dot(&v);
        let w = a.t().dot(&u);
        lambda = u.dot(&u);
        let r = norm(&(&w - &(&v * lambda)));
        residual = if lambda > A::zero() {
            (r / lambda).to_f64_lossy()
        } else {
            f64::INFINITY
        };
        let nw = norm(&w);
        if residual <= opts.tol || nw.is_zero() {
            return Ok(SigmaEstimate {
                value: unscaled(lambda.fsqrt(), scale, "σ₁")?,
                iterations: it,
                converged: residual <= opts.tol,
                residual,
            });
        }
        v = w / nw;
    }
    Ok(SigmaEstimate {
        value: unscaled(lambda.fsqrt(), scale, "σ₁")?,
        iterations: opts.max_iter,
        converged: false,
        residual,
    })
}

/// σ_min(A) = σ_k, k = min(m, n), by inverse iteration on AᵀA through a QR factorization.
///
/// Math: with the thin QR of the tall orientation A = Q R (R ∈ ℝ^{k×k} upper triangular),
/// AᵀA = RᵀR, so x ← (RᵀR)⁻¹v costs two triangular solves and never forms AᵀA (no squaring of
/// κ in the factorization). λ = ‖R v‖² is the Rayleigh quotient; the test is
/// ‖RᵀR v − λ v‖ ≤ tol·λ. Convergence is linear with ratio (σ_k/σ_{k−1})². An exactly zero
/// diagonal entry of R, or an overflowing solve, means σ_k is 0 to working precision and returns
/// 0 (converged).
///
/// Cost: the QR, 2mk² − 2k³/3 flops (about half of a singular-values-only SVD), then 4k² per
/// iteration. Accuracy: backward stable through R, so σ_k is found to ≈ ε·σ₁ absolute error plus
/// the iteration's tol/2 relative error.
///
/// Errors: as [`sigma_max_power`], and [`LinalgError::Lapack`] if the QR fails.
///
/// ```
/// use kappa_linalg::{sigma_min_inverse, IterativeOptions};
/// let a = ndarray::array![[3.0_f64, 0.0], [0.0, 0.5], [1.0, 0.0]];
/// let e = sigma_min_inverse(a.view(), IterativeOptions { tol: 1e-12, ..Default::default() }).unwrap();
/// assert!(e.converged && (e.value - 0.5).abs() < 1e-9);
/// ```
pub fn sigma_min_inverse<A: Real>(
    a: ArrayView2<'_, A>,
    opts: IterativeOptions,
) -> Result<SigmaEstimate<A>> {
    use ndarray_linalg::QR;
    let fro = checked_norm("a", &a)?;
    opts.validate()?;
    let a = tall(a);
    let k = a.ncols();
    let exact_zero = SigmaEstimate {
        value: A::zero(),
        iterations: 0,
        converged: true,
        residual: 0.0,
    };
    if fro == 0.0 {
        return Ok(exact_zero);
    }
    // Always the exactly rescaled row-major copy: the QR needs a copy anyway, and LAPACK a
    // standard layout.
    let (scaled, scale) = scaled_copy(a);
    let (_q, r) = scaled.qr().map_err(lapack_err("a", "?geqrf"))?;
    let r: Array2<A> = r.slice(s![..k, ..k]).to_owned();
    if r.diag().iter().any(|d| d.is_zero()) {
        return Ok(exact_zero);
    }
    let mut v = start_vector::<A>(k, opts.seed);
    let mut lambda;
    let mut residual = f64::INFINITY;
    let mut value = A::zero();
    for it in 1..=opts.max_iter {
        let x = solve_upper(&r, &solve_upper_transposed(&r, &v));
        let nx = norm(&x);
        if !nx.is_finite() || !x.iter().all(|e| e.is_finite()) {
            return Ok(SigmaEstimate {
                iterations: it,
                ..exact_zero
            });
        }
        v = x / nx;
        let rv = r.dot(&v);
        lambda = rv.dot(&rv);
        let w = r.t().dot(&rv);
        let rn = norm(&(&w - &(&v * lambda)));
        residual = (rn / lambda).to_f64_lossy();
        value = lambda.fsqrt();
        if residual <= opts.tol {
            return Ok(SigmaEstimate {
                value: unscaled(value, scale, "σ_k")?,
                iterations: it,
                converged: true,
                residual,
            });
        }
    }
    Ok(SigmaEstimate {
        value: unscaled(value, scale, "σ_k")?,
        iterations: opts.max_iter,
        converged: false,
        residual,
    })
}

/// Solves R x = b for upper triangular R by back substitution (O(k²)).
fn solve_upper<A: Real>(r: &Array2<A>, b: &Array1<A>) -> Array1<A> {
    let k = b.len();
    let mut x = b.clone();
    for i in (0..k).rev() {
        let mut v = x[i];
        for j in i + 1..k {
            v -= r[[i, j]] * x[j];
        }
        x[i] = v / r[[i, i]];
    }
    x
}

/// Solves Rᵀ x = b for upper triangular R by forward substitution (O(k²)).
fn solve_upper_transposed<A: Real>(r: &Array2<A>, b: &Array1<A>) -> Array1<A> {
    let k = b.len();
    let mut x = b.clone();
    for i in 0..k {
        let mut v = x[i];
        for j in 0..i {
            v -= r[[j, i]] * x[j];
        }
        x[i] = v / r[[i, i]];
    }
    x
}

/// Orthogonalizes `x` against the first `j` columns of `basis` (classical Gram–Schmidt, repeated
/// once when the norm drops by more than 1/√2: "twice is enough").
fn reorthogonalize<A: Real>(basis: &Array2<A>, j: usize, x: &mut Array1<A>) {
    reorthogonalize_tracked(basis, j, x, None);
}

/// [`reorthogonalize`], adding the coefficients subtracted along each basis column to `coef`
/// (length ≥ j) when given: x_after = x_before − basis[.., ..j]·Δcoef.
fn reorthogonalize_tracked<A: Real>(
    basis: &Array2<A>,
    j: usize,
    x: &mut Array1<A>,
    mut coef: Option<&mut Array1<A>>,
) {
    if j == 0 {
        return;
    }
    let b = basis.slice(s![.., ..j]);
    for _ in 0..2 {
        let before = norm(x);
        let c = b.t().dot(x);
        *x -= &b.dot(&c);
        if let Some(k) = coef.as_deref_mut() {
            let mut head = k.slice_mut(s![..j]);
            head += &c;
        }
        if norm(x) > before * A::from_f64_lossy(std::f64::consts::FRAC_1_SQRT_2) {
            break;
        }
    }
}

/// A copy of the column-major `basis` with `cols` columns (the new ones zero).
fn with_more_columns<A: Real>(basis: &Array2<A>, cols: usize) -> Array2<A> {
    let mut grown = Array2::zeros((basis.nrows(), cols).f());
    grown.slice_mut(s![.., ..basis.ncols()]).assign(basis);
    grown
}

/// A·v and Aᵀ(A·v) in **one pass** over a row-major A: for each block of rows (≈ 512 KB f64, so it
/// is still in cache for the second product) p_B = A_B·v, then w += A_Bᵀ·p_B. The step of
/// [`condition_number_estimate`] is bound by memory traffic (two products of an 8 MB matrix
/// per step at 4096×256), and this reads A once instead of twice.
fn fused_products<A: Real>(a: &ArrayView2<'_, A>, v: ArrayView1<'_, A>) -> (Array1<A>, Array1<A>) {
    let (m, n) = a.dim();
    let rows = ((1usize << 16) / n.max(1)).clamp(8, m.max(8));
    let mut p = Array1::<A>::zeros(m);
    let mut w = Array1::<A>::zeros(n);
    for (block, mut pb) in a
        .axis_chunks_iter(Axis(0), rows)
        .zip(p.axis_chunks_iter_mut(Axis(0), rows))
    {
        general_mat_vec_mul(A::one(), &block, &v, A::zero(), &mut pb);
        general_mat_vec_mul(A::one(), &block.t(), &pb, A::one(), &mut w);
    }
    (p, w)
}

/// The fused step's Aᵀu_j = (Aᵀp − Σ_i coef_i·Aᵀu_i)/α is used only when
/// α·‖Aᵀu_j‖ ≥ this × ‖A‖·‖A v_j‖: the rounding of Aᵀp (≈ ε‖A‖‖p‖) is then at most ε/this
/// relative to the vector itself (else Aᵀu_j is recomputed by a second pass). Small ‖Aᵀu_j‖ —
/// the directions of small singular values — therefore always get the direct product.
const FUSED_GUARD: f64 = 0.01;

/// κ(A) estimated from σ_max and σ_min by Golub–Kahan–Lanczos bidiagonalization.
///
/// Math: with the tall orientation A ∈ ℝ^{m×n} and a random unit v₁, the recurrences
/// α_j u_j = A v_j − β_{j−1} u_{j−1}, β_j v_{j+1} = Aᵀ u_j − α_j v_j (with full
/// reorthogonalization of both bases) give A V_j = U_j B_j with B_j upper bidiagonal. The
/// singular values θ of B_j (Ritz values) approximate those of A from inside the spectrum, the
/// extreme ones first. For B_j = P Θ Qᵀ the Ritz vectors satisfy A ṽ = θ ũ exactly and
/// ‖Aᵀ ũ − θ ṽ‖ = β_j |P_{j,i}|, the residual tested against tol·θ for both the largest and
/// the smallest Ritz value. The result follows the crate's κ rule: κ̂ = ∞ when
/// σ̂_min ≤ σ̂_max·max(m, n)·ε.
///
/// Stopping rules (`opts.stop`):
/// - [`StopRule::Residual`] (default): both relative residuals ρ = β_j|P_{j,i}|/θ ≤ tol. A
///   rigorous test, but the error of θ is of order ρ²/gap, far below ρ near convergence:
///   tol = 1e-3 on a 4096×256 Gaussian takes 30 steps and gives κ̂ to 2e-6.
/// - [`StopRule::ErrorEstimate`]: stop when the estimated relative error of κ̂,
///   e = e_max + e_min with e = min(ρ, ρ²/δ) (Kato–Temple with the relative gap δ = |θ_o² − θ²|/θ²
///   to the neighbouring Ritz value θ_o), and at least twice the last step's relative change of
///   κ̂, is ≤ tol at two consecutive steps, with both ρ ≤ 2·tol; e is reported as
///   [`KappaEstimate::error_estimate`]. It asks for the accuracy requested, no more: tol = 1e-2
///   takes 16 steps on the same Gaussian (true error 2e-3). It is an estimate, not a bound (the
///   Ritz gap can exceed the true gap); tested: the Ritz values it stops at lie within tol of
///   singular values of A on graded, Gaussian and clustered spectra.
///
/// Neither rule can see a singular value that the Krylov space has not reached: when the extreme
/// σ has a close neighbour, the extreme Ritz value can settle on the neighbour with a small
/// residual (misconvergence, a limit of every single-vector Krylov method). On random test
/// spectra this happened in 0–4 % of cases at tol = 1e-2 under either rule (see docs/linalg.md).
///
/// Either way `converged: false` means the cap was hit before the test passed.
///
/// Cost: per step two matrix–vector products (4mn flops) plus O((m + n)·j) for the
/// reorthogonalization and O(j) for the Ritz values; for well-separated extremes a few tens of
/// steps. The products are bound by memory traffic, so for a row-major (standard layout) tall A
/// both come from **one pass** over A: A·v_j and Aᵀ(A·v_j) block by block, and
/// Aᵀu_j = (Aᵀp − Σ_i c_i·Aᵀu_i)/α_j by linearity from the stored Aᵀu_i (p = A·v_j, c the
/// coefficients the recurrence and the reorthogonalization subtracted). The recombination is used
/// only when α_j·‖Aᵀu_j‖ ≥ 0.01·‖A‖·‖p‖, so its rounding stays within 100ε of the vector; the
/// directions of small singular values get a direct second pass (tested: one- and two-pass runs
/// agree to 1e-10 up to κ = 1e6). Other layouts take two passes. At most min(n, max_iter) steps: after n steps the Krylov space is complete and the
/// Ritz values are exact. Memory: (m + n)·steps.
///
/// Accuracy: σ̂_max ≤ σ₁ and σ̂_min ≥ σ_k (Ritz values interlace), so κ̂ ≤ κ: the estimate is
/// from below, with relative error about tol (usually much less) under `Residual` and up to
/// about tol under `ErrorEstimate`.
///
/// Errors: as [`sigma_max_power`].
///
/// ```
/// use kappa_linalg::{condition_number, condition_number_estimate, IterativeOptions, StopRule};
/// let a = ndarray::Array2::from_shape_fn((40, 6), |(i, j)| ((i * 7 + j * 3) % 11) as f64 + (i == j) as u8 as f64);
/// let e = condition_number_estimate(a.view(), IterativeOptions::default()).unwrap();
/// let k = condition_number(a.view()).unwrap();
/// assert!(e.converged && (e.kappa - k).abs() <= 1e-3 * k);
/// // Ask for 1 % and stop as soon as the estimated error is below it.
/// let opts = IterativeOptions { tol: 1e-2, stop: StopRule::ErrorEstimate, ..Default::default() };
/// let e = condition_number_estimate(a.view(), opts).unwrap();
/// assert!(e.converged && e.error_estimate <= 1e-2 && (e.kappa - k).abs() <= 1e-2 * k);
/// ```
pub fn condition_number_estimate<A: Real>(
    a: ArrayView2<'_, A>,
    opts: IterativeOptions,
) -> Result<KappaEstimate<A>> {
    let fro = checked_norm("a", &a)?;
    opts.validate()?;
    let a = tall(a);
    let (m, n) = a.dim();
    if fro == 0.0 {
        return Ok(KappaEstimate {
            kappa: A::infinity(),
            sigma_max: A::zero(),
            sigma_min: A::zero(),
            iterations: 0,
            converged: true,
            residual: 0.0,
            error_estimate: 0.0,
        });
    }
    let (a, scale) = normalized(a, fro);
    let a = a.view();
    let steps = opts.max_iter.min(n);
    let tiny = A::from_f64_lossy(A::EPS * (m.max(n) as f64));
    let mut vb: Array2<A> = Array2::zeros((n, steps + 1).f());
    // U grows by doubling (a full m × steps block would be zeroed up front: 8 MB at 4096×256,
    // for a run that typically needs 20–30 columns).
    let mut ub: Array2<A> = Array2::zeros((m, steps.min(32)).f());
    // One pass over A per step when its rows are contiguous (the usual tall, row-major case);
    // the columns Aᵀu_i are kept for the linear recombination (n × steps, small).
    let fused = a.is_standard_layout();
    let mut atu_basis: Array2<A> = Array2::zeros((if fused { n } else { 0 }, steps).f());
    let mut alphas: Vec<A> = Vec::with_capacity(steps);
    let mut betas: Vec<A> = Vec::with_capacity(steps);
    vb.column_mut(0).assign(&start_vector::<A>(n, opts.seed));
    let mut result = None;
    let mut previous_kappa: Option<f64> = None;
    let mut previous_estimate = f64::INFINITY;
    let mut norm_estimate = 0.0f64;
    for j in 0..steps {
        if j == ub.ncols() {
            ub = with_more_columns(&ub, (2 * j).min(steps));
        }
        // u_j (and, fused, Aᵀ A v_j from the same pass over A)
        let (mut p, atp) = if fused {
            let (p, w) = fused_products(&a, vb.column(j));
            (p, Some(w))
        } else {
            (a.dot(&vb.column(j)), None)
        };
        let p_norm = norm(&p);
        let mut coef = Array1::<A>::zeros(j);
        if j > 0 {
            p.scaled_add(-betas[j - 1], &ub.column(j - 1));
            coef[j - 1] = betas[j - 1];
        }
        reorthogonalize_tracked(&ub, j, &mut p, Some(&mut coef));
        let alpha = norm(&p);
        let rank_deficient = alpha <= tiny;
        alphas.push(if rank_deficient { A::zero() } else { alpha });
        if !rank_deficient {
            ub.column_mut(j).assign(&(p / alpha));
        }
        // v_{j+1}
        let mut q = if rank_deficient {
            Array1::zeros(n)
        } else {
            // Aᵀu_j = (Aᵀp − Σ_i coef_i·Aᵀu_i)/α by linearity when the cancellation is mild.
            let recombined = atp.map(|mut x| {
                if j > 0 {
                    x -= &atu_basis.slice(s![.., ..j]).dot(&coef);
                }
                x / alpha
            });
            // Rounding in Aᵀp is ≈ ε‖A‖‖p‖; relative to α‖Aᵀu_j‖ it must stay ≤ ε/FUSED_GUARD.
            let norm_a = A::from_f64_lossy(norm_estimate).max(p_norm);
            let atu = match recombined {
                Some(x) if alpha * norm(&x) >= A::from_f64_lossy(FUSED_GUARD) * norm_a * p_norm => {
                    x
                }
                _ => a.t().dot(&ub.column(j)),
            };
            if fused {
                atu_basis.column_mut(j).assign(&atu);
            }
            let mut q = atu;
            q.scaled_add(-alpha, &vb.column(j));
            q
        };
        reorthogonalize(&vb, j + 1, &mut q);
        let beta = norm(&q);
        betas.push(beta);
        // The neighbouring Ritz values (two more bisections) only feed the error estimate: every
        // step under `ErrorEstimate`, once at the end under `Residual`.
        let with_gaps = opts.stop == StopRule::ErrorEstimate;
        let ritz = extreme_ritz(&alphas, &betas, beta.to_f64_lossy(), with_gaps);
        norm_estimate = norm_estimate.max(ritz.max.theta);
        let theta_max = A::from_f64_lossy(ritz.max.theta);
        let theta_min = A::from_f64_lossy(ritz.min.theta);
        let kappa_now = ritz.max.theta / ritz.min.theta;
        let change = match previous_kappa {
            Some(k) if kappa_now.is_finite() => (kappa_now - k).abs() / kappa_now,
            _ => f64::INFINITY,
        };
        previous_kappa = Some(kappa_now);
        let estimate_of = |r: &ExtremeRitz| r.error_estimate().max(2.0 * change);
        let error_estimate = estimate_of(&ritz);
        let small_residuals = ritz
            .max
            .relative_residual()
            .max(ritz.min.relative_residual())
            <= RESIDUAL_GUARD * opts.tol;
        let confirmed =
            error_estimate <= opts.tol && previous_estimate <= opts.tol && small_residuals;
        previous_estimate = error_estimate;
        let size = j + 1;
        let breakdown = beta <= tiny || rank_deficient;
        let tau = theta_max * tiny;
        let below = theta_min <= tau && ritz.min.residual <= opts.tol * theta_max.to_f64_lossy();
        let done = match opts.stop {
            StopRule::Residual => {
                ritz.max.relative_residual() <= opts.tol
                    && (ritz.min.relative_residual() <= opts.tol || below)
            }
            StopRule::ErrorEstimate => {
                confirmed || (below && ritz.max.relative_residual() <= opts.tol)
            }
        };
        let complete = size == n;
        if done || breakdown || complete || j + 1 == steps {
            let exact = breakdown || complete;
            result = Some(Finished {
                theta_max,
                theta_min,
                iterations: size,
                converged: done || exact,
                residual: ritz
                    .max
                    .relative_residual()
                    .max(ritz.min.relative_residual()),
                error_estimate: if exact {
                    0.0
                } else if with_gaps {
                    error_estimate
                } else {
                    estimate_of(&extreme_ritz(&alphas, &betas, beta.to_f64_lossy(), true))
                },
            });
            break;
        }
        vb.column_mut(j + 1).assign(&(q / beta));
    }
    let f = result.unwrap_or(Finished {
        theta_max: A::zero(),
        theta_min: A::zero(),
        iterations: 0,
        converged: false,
        residual: f64::INFINITY,
        error_estimate: f64::INFINITY,
    });
    let kappa = if f.theta_min <= f.theta_max * tiny {
        A::infinity()
    } else {
        f.theta_max / f.theta_min
    };
    Ok(KappaEstimate {
        kappa,
        sigma_max: unscaled(f.theta_max, scale, "σ₁")?,
        sigma_min: unscaled(f.theta_min, scale, "σ_k")?,
        iterations: f.iterations,
        converged: f.converged,
        residual: f.residual,
        error_estimate: f.error_estimate,
    })
}

/// The state in which the Lanczos loop of [`condition_number_estimate`] stopped.
struct Finished<A> {
    theta_max: A,
    theta_min: A,
    iterations: usize,
    converged: bool,
    residual: f64,
    error_estimate: f64,
}

/// [`StopRule::ErrorEstimate`] also requires both relative residuals ≤ this × tol: a Ritz value
/// with a large residual and a (spuriously) large Ritz gap is not trusted.
const RESIDUAL_GUARD: f64 = 2.0;

/// An extreme Ritz value θ of the bidiagonal B_j, its residual and its nearest Ritz neighbour.
#[derive(Debug, Clone, Copy)]
struct RitzValue {
    /// θ.
    theta: f64,
    /// ‖Aᵀũ − θṽ‖ = β_j·|P_{j,i}| (A ṽ = θ ũ holds exactly).
    residual: f64,
    /// The next Ritz value inward (θ₂ for θ_max, θ_{j−1} for θ_min); `None` for j = 1.
    neighbour: Option<f64>,
}

impl RitzValue {
    fn relative_residual(&self) -> f64 {
        if self.theta > 0.0 {
            self.residual / self.theta
        } else {
            0.0
        }
    }

    /// Estimated relative error of θ: min(ρ, ρ²/δ), ρ the relative residual and
    /// δ = |θ_o² − θ²|/θ² the relative gap to the neighbour θ_o in AᵀA's spectrum.
    ///
    /// θ² is the Rayleigh quotient of AᵀA at ṽ with residual ‖AᵀAṽ − θ²ṽ‖ = θ·r, so by
    /// Kato–Temple the nearest eigenvalue λ satisfies |λ − θ²| ≤ θ²r²/gap, i.e.
    /// |σ − θ|/θ ≤ ρ²/(2δ) — with the true gap, which the Ritz gap only estimates (from inside
    /// the spectrum, so usually too large early on); dropping the ½ leaves a factor 2 of margin.
    fn error_estimate(&self) -> f64 {
        let rho = self.relative_residual();
        match self.neighbour {
            Some(o) if self.theta > 0.0 => {
                let delta = (o * o - self.theta * self.theta).abs() / (self.theta * self.theta);
                if delta > 0.0 {
                    rho.min(rho * rho / delta)
                } else {
                    rho
                }
            }
            _ => rho,
        }
    }
}

/// The two extreme Ritz values of B_j.
struct ExtremeRitz {
    max: RitzValue,
    min: RitzValue,
}

impl ExtremeRitz {
    /// Estimated relative error of κ̂ = θ_max/θ_min: κ̂/κ ≥ (1 − e_max)/(1 + e_min), so
    /// (κ − κ̂)/κ ≤ e_max + e_min.
    fn error_estimate(&self) -> f64 {
        self.max.error_estimate() + self.min.error_estimate()
    }
}

/// The extreme Ritz values of the upper bidiagonal B_j (diagonal `alphas`, superdiagonal
/// `betas[..j−1]`) with residuals from β_j = `beta`, through its Golub–Kahan tridiagonal (O(j)
/// work each, see [`gk_ritz`]); with `with_gaps`, also their inner neighbours (else `None`,
/// and the error estimates fall back to the residuals).
fn extreme_ritz<A: Real>(alphas: &[A], betas: &[A], beta: f64, with_gaps: bool) -> ExtremeRitz {
    let j = alphas.len();
    let off: Vec<f64> = (0..j)
        .flat_map(|i| {
            let al = alphas[i].to_f64_lossy();
            let be = (i + 1 < j).then(|| betas[i].to_f64_lossy());
            std::iter::once(al).chain(be)
        })
        .collect();
    // The tridiagonal has order 2j and eigenvalues ±θ_i: θ_min has index j, θ_max 2j − 1.
    let (t_max, p_max) = gk_ritz(&off, 2 * j - 1);
    let (t_min, p_min) = gk_ritz(&off, j);
    let neighbours =
        (with_gaps && j > 1).then(|| (gk_eigenvalue(&off, 2 * j - 2), gk_eigenvalue(&off, j + 1)));
    ExtremeRitz {
        max: RitzValue {
            theta: t_max,
            residual: beta * p_max,
            neighbour: neighbours.map(|n| n.0),
        },
        min: RitzValue {
            theta: t_min,
            residual: beta * p_min,
            neighbour: neighbours.map(|n| n.1),
        },
    }
}

/// Number of eigenvalues below `x` of the symmetric tridiagonal matrix with zero diagonal and
/// off-diagonal `e` (Sturm count through the LDLᵀ recurrence).
fn sturm_count(e: &[f64], x: f64) -> usize {
    let mut count = 0;
    let mut d = -x;
    let guard = f64::MIN_POSITIVE / f64::EPSILON;
    for i in 0..=e.len() {
        if i > 0 {
            d = -x - e[i - 1] * e[i - 1] / d;
        }
        if d == 0.0 {
            d = -guard;
        }
        if d < 0.0 {
            count += 1;
        }
    }
    count
}

/// The `k`-th smallest eigenvalue (0-based, k ≥ (len(e) + 1)/2, so non-negative) of the
/// zero-diagonal tridiagonal with off-diagonal `e`, by bisection with Sturm counts on
/// [0, Gershgorin bound] to about 2ε relative accuracy. O(len(e)) per bisection step.
fn gk_eigenvalue(e: &[f64], k: usize) -> f64 {
    let n = e.len() + 1;
    let bound = (0..n)
        .map(|i| {
            let l = if i > 0 { e[i - 1].abs() } else { 0.0 };
            let r = if i < e.len() { e[i].abs() } else { 0.0 };
            l + r
        })
        .fold(0.0, f64::max);
    if bound == 0.0 {
        return 0.0;
    }
    let (mut lo, mut hi) = (0.0f64, bound * (1.0 + 4.0 * f64::EPSILON));
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if sturm_count(e, mid) > k {
            hi = mid;
        } else {
            lo = mid;
        }
        if hi - lo <= 2.0 * f64::EPSILON * hi.max(f64::MIN_POSITIVE) {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// The `k`-th smallest eigenvalue (0-based) of the zero-diagonal tridiagonal with off-diagonal `e`,
/// and the magnitude of the last component of the left singular vector of the bidiagonal B it
/// comes from (see [`condition_number_estimate`]).
///
/// The Golub–Kahan tridiagonal of an upper bidiagonal B (diagonal α, superdiagonal β) has the
/// off-diagonal (α₁, β₁, α₂, …, α_j) and eigenvalues ±θ_i (θ the singular values of B); the
/// eigenvector of +θ interleaves (q₁, p₁, q₂, p₂, …)/√2, q and p the right and left singular
/// vectors. Bisection on it finds every θ to high relative accuracy (Demmel–Kahan), and two
/// steps of inverse iteration give the eigenvector. O(j) work.
fn gk_ritz(e: &[f64], k: usize) -> (f64, f64) {
    let n = e.len() + 1;
    let theta = gk_eigenvalue(e, k);
    if theta == 0.0 && e.iter().all(|x| *x == 0.0) {
        return (0.0, 0.0);
    }
    // Inverse iteration on T − θI: tridiagonal LU with partial pivoting.
    let mut z = vec![1.0 / (n as f64).sqrt(); n];
    for _ in 0..2 {
        z = tridiag_solve_zero_diag(e, theta, &z);
        let nz = z.iter().map(|x| x * x).sum::<f64>().sqrt();
        if !(nz.is_finite() && nz > 0.0) {
            return (theta, 1.0);
        }
        z.iter_mut().for_each(|x| *x /= nz);
    }
    // The last entry of z is p_j/√2.
    (theta, (z[n - 1] * std::f64::consts::SQRT_2).abs().min(1.0))
}

/// Solves (T − θI) x = b for the zero-diagonal tridiagonal T with off-diagonal `e`, by Gaussian
/// elimination with partial pivoting; exact zero pivots are replaced by a tiny number (the
/// standard device of inverse iteration).
fn tridiag_solve_zero_diag(e: &[f64], theta: f64, b: &[f64]) -> Vec<f64> {
    let n = b.len();
    let tiny = f64::EPSILON
        * e.iter()
            .fold(theta.abs(), |m, x| m.max(x.abs()))
            .max(f64::MIN_POSITIVE);
    // Row i: sub[i]·x[i−1] + diag[i]·x[i] + sup[i]·x[i+1]; after pivoting a second superdiagonal
    // appears (sup2).
    let mut diag = vec![-theta; n];
    let mut sup: Vec<f64> = (0..n).map(|i| if i + 1 < n { e[i] } else { 0.0 }).collect();
    let mut sup2 = vec![0.0; n];
    let mut rhs = b.to_vec();
    let mut sub: Vec<f64> = (0..n).map(|i| if i > 0 { e[i - 1] } else { 0.0 }).collect();
    for i in 0..n.saturating_sub(1) {
        // Eliminate sub[i+1] using row i (or swap rows i and i+1 first).
        if sub[i + 1].abs() > diag[i].abs() {
            // swap rows i and i+1
            let (d_i, s_i, s2_i, r_i) = (diag[i], sup[i], sup2[i], rhs[i]);
            diag[i] = sub[i + 1];
            sup[i] = diag[i + 1];
            sup2[i] = sup[i + 1];
            rhs[i] = rhs[i + 1];
            sub[i + 1] = d_i;
            diag[i + 1] = s_i;
            sup[i + 1] = s2_i;
            rhs[i + 1] = r_i;
        }
        if diag[i] == 0.0 {
            diag[i] = tiny;
        }
        let l = sub[i + 1] / diag[i];
        diag[i + 1] -= l * sup[i];
        if i + 2 < n {
            sup[i + 1] -= l * sup2[i];
        }
        rhs[i + 1] -= l * rhs[i];
        sub[i + 1] = 0.0;
    }
    if diag[n - 1] == 0.0 {
        diag[n - 1] = tiny;
    }
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        let mut v = rhs[i];
        if i + 1 < n {
            v -= sup[i] * x[i + 1];
        }
        if i + 2 < n {
            v -= sup2[i] * x[i + 2];
        }
        x[i] = v / diag[i];
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::svd::{svd_full, SvdDriver};

    #[test]
    fn golub_kahan_ritz_matches_dense_svd() {
        let alphas = [1.3, 0.7, 2.1, 0.05, 1.0];
        let betas = [0.4, 1.1, 0.3, 0.9];
        let j = alphas.len();
        let mut b = Array2::<f64>::zeros((j, j));
        let mut off = Vec::new();
        for i in 0..j {
            b[[i, i]] = alphas[i];
            off.push(alphas[i]);
            if i + 1 < j {
                b[[i, i + 1]] = betas[i];
                off.push(betas[i]);
            }
        }
        let f = svd_full(b.view(), SvdDriver::QrIteration).unwrap();
        let (tmax, pmax) = gk_ritz(&off, 2 * j - 1);
        let (tmin, pmin) = gk_ritz(&off, j);
        assert!(
            (tmax - f.s[0]).abs() <= 1e-14 * f.s[0],
            "{tmax} vs {}",
            f.s[0]
        );
        assert!(
            (tmin - f.s[j - 1]).abs() <= 1e-13 * f.s[j - 1],
            "{tmin} vs {}",
            f.s[j - 1]
        );
        assert!((pmax - f.u[[j - 1, 0]].abs()).abs() < 1e-10);
        assert!((pmin - f.u[[j - 1, j - 1]].abs()).abs() < 1e-10);
    }

    #[test]
    fn sturm_count_of_2x2() {
        // [[0, 2], [2, 0]] has eigenvalues ±2.
        assert_eq!(sturm_count(&[2.0], -3.0), 0);
        assert_eq!(sturm_count(&[2.0], 0.0), 1);
        assert_eq!(sturm_count(&[2.0], 3.0), 2);
    }

    #[test]
    fn estimates_on_a_diagonal_matrix() {
        let mut a = Array2::<f64>::zeros((30, 10));
        for i in 0..10 {
            a[[i, i]] = 1.0 + i as f64;
        }
        let tight = IterativeOptions {
            tol: 1e-10,
            ..Default::default()
        };
        let e = condition_number_estimate(a.view(), tight).unwrap();
        assert!(e.converged);
        assert!((e.kappa - 10.0).abs() < 1e-8, "{e:?}");
        let p = sigma_max_power(a.view(), tight).unwrap();
        assert!((p.value - 10.0).abs() < 1e-6, "{p:?}");
        let q = sigma_min_inverse(a.view(), tight).unwrap();
        assert!((q.value - 1.0).abs() < 1e-8, "{q:?}");
    }
}
