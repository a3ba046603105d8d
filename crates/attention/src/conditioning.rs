//! Condition numbers of the attention Jacobian and its blocks, their structural rank bounds, and
//! Theorem 3.4's upper bound evaluated from its parts.
//!
//! # The κ rule
//!
//! κ follows `kappa-linalg`'s one rule ([`kappa_linalg::cond`]): κ = σ₁/σ_r with r = min(m, n)
//! when the matrix has full numerical rank, **+∞ otherwise**; κ⁺ (pseudo condition number) is
//! σ₁ over the smallest singular value above the numpy threshold τ = σ₁·max(m, n)·ε. Both come
//! from one SVD, with the numerical rank.
//!
//! # Structural rank bounds (non-causal, generic weights of full column rank)
//!
//! * **Gauge null space** (T4): for E ∈ ℝ^{k×k}, (dW_Q, dW_K, dW_V) = (W_Q E, −W_K Eᵀ, 0) leaves
//!   S = X W_Q W_Kᵀ Xᵀ unchanged, so J annihilates a k²-dimensional space and
//!   rank J ≤ min(Nk, 3Dk − k²). When N > 3D − k, J has more rows than this rank: κ(J) = ∞.
//! * **K block**: if 1 ∈ range(X) (generic for N ≤ D), dW_K with X dW_K = 1 uᵀ shifts each score
//!   row by a constant, which softmax ignores: rank J_K ≤ k(N − 1) < Nk, so κ(J_K) = ∞ and only
//!   κ⁺(J_K) is informative. For N > D, rank J_K ≤ Dk.
//! * **Λ**: N zero eigenvalues (one per row; more if a row of P is one-hot), so κ(Λ) = ∞ and
//!   Theorem 3.4 can only mean κ⁺(Λ).
//!
//! # Theorem 3.4 (its form as implemented; `docs/attention.md`, "Readings the code fixes")
//!
//! κ(J) ≤ κ(X)³ · κ⁺(Λ) · κ(W_V) · (κ(W_Q) + κ(W_K)) + κ(X) · κ(P),
//!
//! with W the *effective* weights (W + C for a corrected head). The argument behind it bounds
//! each block (κ(J_Q) ≤ κ(X)³κ(W_V)κ(W_K)κ⁺(Λ), the K analogue, κ(J_V) = κ(PX) ≤ κ(P)κ(X)) and
//! adds them (κ([A B C]) ≤ κ(A) + κ(B) + κ(C)). Only the V step is a theorem; the others use
//! κ(AB) ≤ κ(A)κ(B) for rectangular factors, where it is false in general, and the sum step is
//! false in general too. [`theorem_3_4`] therefore *evaluates* the bound and reports whether it
//! held, with every part, rather than assuming it; `docs/attention.md` records the measured pass
//! rates (high for N ≤ D, lower for N > D).

use kappa_linalg::{conditioning_from_singular_values, Conditioning, RankTolerance, Real};

use crate::attention::Forward;
use crate::error::Result;
use crate::scale::{singular_values_scaled, times_pow2_f64};
use crate::softmax::softmax_jacobian_conditioning;

/// κ, κ⁺ and rank (f64) of one matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Kappa {
    /// κ (+∞ when numerically rank-deficient).
    pub kappa: f64,
    /// κ⁺ over the singular values above the threshold.
    pub pseudo_kappa: f64,
    /// Numerical rank.
    pub rank: usize,
    /// min(rows, cols).
    pub full_rank: usize,
    /// σ_max.
    pub sigma_max: f64,
    /// σ_min (the min(rows, cols)-th singular value).
    pub sigma_min: f64,
}

impl Kappa {
    /// From the conditioning of 2^{-e}·A: κ, κ⁺ and the rank are scale invariant, σ is scaled
    /// back (in f64, where it can overflow to +∞ only for f64 input).
    fn from<A: Real>(c: Conditioning<A>, rows: usize, cols: usize, e: i32) -> Self {
        Self {
            kappa: c.kappa.to_f64_lossy(),
            pseudo_kappa: c.pseudo_kappa.to_f64_lossy(),
            rank: c.rank,
            full_rank: rows.min(cols),
            sigma_max: times_pow2_f64(c.sigma_max.to_f64_lossy(), e),
            sigma_min: times_pow2_f64(c.sigma_min.to_f64_lossy(), e),
        }
    }

    /// κ, κ⁺ and rank of any matrix (any layout) under the numpy threshold.
    ///
    /// The SVD is taken of `a` scaled by a power of two (exact; `docs/attention.md`, "Scale
    /// behaviour"), so every finite input works: κ, κ⁺ and the rank are exact as for a
    /// unit-scale matrix, and `sigma_max`/`sigma_min` are the true values rounded to f64
    /// (+∞ for σ beyond `f64::MAX`, which only f64 input within √(mn) of `f64::MAX` reaches).
    ///
    /// Errors: `a` empty or non-finite; LAPACK failures.
    pub fn of<A: Real>(a: ndarray::ArrayView2<'_, A>) -> Result<Self> {
        kappa_linalg::input::check_matrix("a", &a)?;
        let (m, n) = a.dim();
        let (s, e) = singular_values_scaled(a)?;
        let c = conditioning_from_singular_values(s.view(), m, n, RankTolerance::Numpy)?;
        Ok(Self::from(c, m, n, e))
    }
}

/// The conditioning of J = [J_Q J_K J_V] and of its blocks, with the structural rank bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JacobianConditioning {
    /// J_Q.
    pub q: Kappa,
    /// J_K.
    pub k: Kappa,
    /// J_V (κ(J_V) = κ(P X)).
    pub v: Kappa,
    /// J = [J_Q J_K J_V].
    pub full: Kappa,
    /// min(Nk, 3Dk − k²): the gauge bound on rank J.
    pub full_rank_bound: usize,
    /// k(N − 1) when N ≤ D, else min(N, D)·k: the row-shift bound on rank J_K.
    pub k_rank_bound: usize,
}

/// The structural bound min(Nk, 3Dk − k²) on rank J (gauge null space of dimension k²;
/// `docs/attention.md`, "Structural ranks").
///
/// Defined for every input: products saturate at `usize::MAX` instead of wrapping, and
/// 3Dk − k² is clamped at 0 (k > 3D leaves no rank beyond the gauge). Any size 0 gives 0.
pub fn full_rank_bound(n: usize, d: usize, k: usize) -> usize {
    let gauge = d.saturating_mul(3).saturating_mul(k);
    n.saturating_mul(k)
        .min(gauge.saturating_sub(k.saturating_mul(k)))
}

/// The structural bound on rank J_K: k(N − 1) for 1 ≤ N ≤ D (softmax ignores row shifts), else
/// min(N, D)·k.
///
/// Defined for every input: N = 0 (no tokens, an empty Jacobian) gives 0 rather than wrapping
/// k(0 − 1), and products saturate at `usize::MAX`.
pub fn k_rank_bound(n: usize, d: usize, k: usize) -> usize {
    if n == 0 {
        0
    } else if n <= d {
        k.saturating_mul(n - 1)
    } else {
        n.min(d).saturating_mul(k)
    }
}

impl<A: Real> Forward<A> {
    /// κ, κ⁺ and the numerical rank of J and of each block (dense; see
    /// [`Forward::jacobian_weights`] for the size limit), with the structural rank bounds.
    ///
    /// Cost: four SVDs (Nk × Dk three times, Nk × 3Dk once).
    ///
    /// Errors: as [`Forward::jacobian_weights`] and [`crate::WeightJacobian::full`]; LAPACK failures.
    pub fn jacobian_conditioning(&self) -> Result<JacobianConditioning> {
        let (n, d, k) = self.dims();
        let j = self.jacobian_weights()?;
        let q = Kappa::of(j.q.view())?;
        let kb = Kappa::of(j.k.view())?;
        let v = Kappa::of(j.v.view())?;
        let full = Kappa::of(j.full()?.view())?;
        Ok(JacobianConditioning {
            q,
            k: kb,
            v,
            full,
            full_rank_bound: full_rank_bound(n, d, k),
            k_rank_bound: k_rank_bound(n, d, k),
        })
    }
}

/// Theorem 3.4's bound evaluated from its parts, next to the exact κ(J).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Theorem34 {
    /// κ(X) over min(N, D) singular values.
    pub kappa_x: f64,
    /// κ(W_Q) (effective weights).
    pub kappa_wq: f64,
    /// κ(W_K).
    pub kappa_wk: f64,
    /// κ(W_V).
    pub kappa_wv: f64,
    /// κ⁺(Λ) over Λ's nonzero eigenvalues (κ(Λ) itself is ∞).
    pub pseudo_kappa_lambda: f64,
    /// Numerical rank of Λ (N² − N for a generic non-causal P).
    pub rank_lambda: usize,
    /// κ(P).
    pub kappa_p: f64,
    /// κ(X)³ κ⁺(Λ) κ(W_V) (κ(W_Q) + κ(W_K)) + κ(X) κ(P).
    pub rhs: f64,
    /// The exact conditioning of J and its blocks.
    pub jacobian: JacobianConditioning,
    /// The per-block right-hand sides of the argument: [κ(X)³κ(W_V)κ(W_K)κ⁺(Λ),
    /// κ(X)³κ(W_V)κ(W_Q)κ⁺(Λ), κ(P)κ(X)] for J_Q, J_K, J_V.
    pub block_rhs: [f64; 3],
}

impl Theorem34 {
    /// κ(J) ≤ rhs (false when κ(J) = ∞ and rhs is finite).
    pub fn holds(&self) -> bool {
        self.jacobian.full.kappa <= self.rhs
    }

    /// κ(J)/rhs (≤ 1 when the bound holds): **+∞ when κ(J) = ∞** (whatever the rhs, also when
    /// the rhs is ∞ too, where the plain quotient would be NaN), and 0 when only the rhs is ∞.
    /// Never NaN: rhs ≥ 1 because every κ is ≥ 1.
    pub fn ratio(&self) -> f64 {
        let kappa = self.jacobian.full.kappa;
        if kappa.is_infinite() {
            f64::INFINITY
        } else {
            kappa / self.rhs
        }
    }

    /// Whether the right-hand side is +∞ (some factor is rank-deficient), which makes the bound
    /// vacuous.
    pub fn is_vacuous(&self) -> bool {
        self.rhs.is_infinite()
    }

    /// Whether each per-block inequality of the argument held: [κ(J_Q) ≤ …, κ(J_K) ≤ …,
    /// κ(J_V) ≤ κ(P)κ(X)], with κ⁺ used for J_K (whose κ is structurally ∞ for N ≤ D).
    pub fn block_steps_hold(&self) -> [bool; 3] {
        [
            self.jacobian.q.kappa <= self.block_rhs[0],
            self.jacobian.k.pseudo_kappa <= self.block_rhs[1],
            self.jacobian.v.kappa <= self.block_rhs[2],
        ]
    }

    /// Whether the summation step κ(J) ≤ κ(J_Q) + κ⁺(J_K) + κ(J_V) held.
    pub fn sum_step_holds(&self) -> bool {
        let j = &self.jacobian;
        j.full.kappa <= j.q.kappa + j.k.pseudo_kappa + j.v.kappa
    }
}

/// Evaluates Theorem 3.4 on a forward pass: every factor of the right-hand side, the exact κ(J)
/// and its blocks. κ(X), κ(W_•), κ(P) follow the κ rule (∞ when rank-deficient); Λ uses κ⁺.
///
/// Cost: the dense Jacobian and its SVDs (see [`Forward::jacobian_conditioning`]), plus N SVDs
/// of N×N for Λ. The rhs is evaluated in f64 and is +∞ when a factor is ∞ or the product
/// overflows (then [`Theorem34::is_vacuous`]).
///
/// Errors: as [`Forward::jacobian_conditioning`] (the dense Jacobian is built first, so an
/// oversized or overflowing one is refused before any other work); LAPACK failures.
///
/// ```
/// use kappa_attention::{theorem_3_4, AttentionOptions, SelfAttention};
/// use ndarray::Array2;
/// let x = Array2::from_shape_fn((3, 6), |(i, j)| ((7 * i + 3 * j) as f64).sin());
/// let w = |o: usize| Array2::from_shape_fn((6, 2), |(i, j)| ((5 * i + j + o) as f64).cos() * 0.5);
/// let head = SelfAttention::new(w(0), w(1), w(2), AttentionOptions::default())?;
/// let t = theorem_3_4(&head.forward(x.view())?)?;
/// assert!(t.jacobian.full.kappa.is_finite() && t.rhs > 1.0);
/// assert!(t.jacobian.full.rank <= t.jacobian.full_rank_bound);
/// # Ok::<(), kappa_attention::AttentionError>(())
/// ```
pub fn theorem_3_4<A: Real>(fwd: &Forward<A>) -> Result<Theorem34> {
    let jacobian = fwd.jacobian_conditioning()?;
    let kx = Kappa::of(fwd.x.view())?.kappa;
    let kq = Kappa::of(fwd.wq.view())?.kappa;
    let kk = Kappa::of(fwd.wk.view())?.kappa;
    let kv = Kappa::of(fwd.wv.view())?.kappa;
    let lam = softmax_jacobian_conditioning(fwd.p.view())?;
    let kl = lam.pseudo_kappa.to_f64_lossy();
    let kp = Kappa::of(fwd.p.view())?.kappa;
    let rhs = kx.powi(3) * kl * kv * (kq + kk) + kx * kp;
    Ok(Theorem34 {
        kappa_x: kx,
        kappa_wq: kq,
        kappa_wk: kk,
        kappa_wv: kv,
        pseudo_kappa_lambda: kl,
        rank_lambda: lam.rank,
        kappa_p: kp,
        rhs,
        jacobian,
        block_rhs: [
            kx.powi(3) * kv * kk * kl,
            kx.powi(3) * kv * kq * kl,
            kp * kx,
        ],
    })
}

/// κ, κ⁺ and rank of a matrix from its singular values (a thin wrapper over
/// [`kappa_linalg::conditioning_from_singular_values`] returning [`Kappa`]).
///
/// Errors: as the wrapped function (`s` empty, non-finite or negative, or not of length
/// min(rows, cols); argument `s`).
pub fn kappa_from_singular_values(s: &[f64], rows: usize, cols: usize) -> Result<Kappa> {
    let s = ndarray::Array1::from(s.to_vec());
    let c = conditioning_from_singular_values(s.view(), rows, cols, RankTolerance::Numpy)?;
    Ok(Kappa::from(c, rows, cols, 0))
}

/// The singular values (f64, descending) of the full weight Jacobian of a forward pass.
///
/// Errors: as [`Forward::jacobian_weights`]; LAPACK failures. (The SVD is scaled as in
/// [`Kappa::of`]; a σ beyond `f64::MAX` is reported as +∞.)
pub fn jacobian_singular_values<A: Real>(fwd: &Forward<A>) -> Result<Vec<f64>> {
    let j = fwd.jacobian_weights()?.full()?;
    let (s, e) = singular_values_scaled(j.view())?;
    Ok(s.iter()
        .map(|x| times_pow2_f64(x.to_f64_lossy(), e))
        .collect())
}
