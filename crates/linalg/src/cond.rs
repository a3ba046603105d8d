//! Condition numbers and numerical rank, under one rule.
//!
//! # The rule
//!
//! Let A ∈ ℝ^{m×n}, k = min(m, n), σ₁ ≥ … ≥ σ_k ≥ 0 its singular values and τ ≥ 0 a threshold
//! given by a [`RankTolerance`] (by default numpy's `matrix_rank` rule τ = σ₁·max(m, n)·ε, with ε
//! the machine epsilon of the element type). Then
//!
//! * the **numerical rank** is r = #{i : σ_i > τ};
//! * the **2-norm condition number** is κ(A) = σ₁/σ_k if r = k, and **κ(A) = +∞** if r < k
//!   (A is numerically rank-deficient, including A = 0). It is a value, never an error;
//! * the **pseudo condition number** is κ⁺(A) = σ₁/σ_r over the singular values above τ, for
//!   r ≥ 1, and κ⁺(0) = +∞ (the zero matrix has no singular value above any threshold).
//!
//! So κ⁺ = κ whenever κ is finite, κ ≥ 1 and κ⁺ ≥ 1 always, κ(αA) = κ(A) for α ≠ 0 (τ scales
//! with σ₁), and κ(Q) = 1 for Q with orthonormal rows or columns. With
//! `RankTolerance::Absolute(0.0)` the rule reduces to the raw ratio σ₁/σ_k (∞ only when σ_k is
//! exactly 0), which is numpy's `cond`.
//!
//! Why the default threshold: below τ a computed singular value carries no information, since the
//! SVD's backward error is of order max(m, n)·ε·σ₁ (see [`crate::svd`]). The default therefore
//! reports κ = ∞ exactly when the ratio could not be trusted to any digit.
//!
//! # Scale safety
//!
//! κ, κ⁺ and the rank do not depend on the scale of A, and they are computed from the
//! singular values of the exactly rescaled copy 2^k·A (see [`crate::svd`]), so they are defined
//! for every finite input, subnormal to near `MAX`, with no overflow. Only [`conditioning`]
//! also returns σ₁ and σ_k themselves, and fails with [`LinalgError::Overflow`] (argument `a`)
//! when σ₁ exceeds the element type's `MAX`. An `Absolute(atol)` threshold is applied in the
//! units of A (it is rescaled with A).

use ndarray::{ArrayView1, ArrayView2};

use crate::error::{LinalgError, Result};
use crate::input::{check_nonneg, check_vector, InputError};
use crate::scalar::{Pow2, Real};
use crate::svd::{scaled_singular_values, SvdDriver};

/// The threshold τ below which a singular value counts as zero (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RankTolerance {
    /// numpy's `matrix_rank` default: τ = σ₁·max(m, n)·ε (ε of the element type).
    #[default]
    Numpy,
    /// τ = rtol·σ₁, for a finite rtol ≥ 0.
    Relative(f64),
    /// τ = atol, for a finite atol ≥ 0.
    Absolute(f64),
}

impl RankTolerance {
    /// The threshold τ for a matrix with `rows`×`cols` entries of type `A` and largest singular
    /// value `sigma_max`.
    ///
    /// Errors: [`InputError::InvalidArgument`] (argument `tol`, the tolerance itself) for a
    /// negative or non-finite relative/absolute tolerance, and (argument `sigma_max`) for a
    /// negative or non-finite `sigma_max`. The result can overflow to +∞ only for
    /// `Relative(r)` with r·σ₁ > `f64::MAX`.
    pub fn threshold<A: Real>(self, sigma_max: f64, rows: usize, cols: usize) -> Result<f64> {
        // `self` (the caller's `tol`) first, then `sigma_max`: signature order.
        match self {
            RankTolerance::Numpy => {}
            RankTolerance::Relative(x) | RankTolerance::Absolute(x) => check_nonneg("tol", x)?,
        }
        check_nonneg("sigma_max", sigma_max)?;
        Ok(match self {
            RankTolerance::Numpy => sigma_max * rows.max(cols) as f64 * A::EPS,
            RankTolerance::Relative(r) => r * sigma_max,
            RankTolerance::Absolute(t) => t,
        })
    }
}

/// Everything the rule of this module derives from a spectrum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conditioning<A> {
    /// κ = σ₁/σ_k, or +∞ if the numerical rank is below k.
    pub kappa: A,
    /// κ⁺ = σ₁/σ_r over the singular values above τ; +∞ for the zero matrix.
    pub pseudo_kappa: A,
    /// The numerical rank r.
    pub rank: usize,
    /// σ₁.
    pub sigma_max: A,
    /// σ_k, the min(m, n)-th singular value (possibly 0).
    pub sigma_min: A,
    /// The threshold τ that was applied.
    pub threshold: A,
}

/// Applies the rule of this module to precomputed singular values of a `rows`×`cols` matrix
/// (any order; they are sorted here).
///
/// Use it to get κ, κ⁺ and the rank from one SVD. Cost: O(k log k).
///
/// Errors: `s` empty or non-finite, `s` negative (argument `s`), `s.len() != min(rows, cols)`
/// (argument `s`), and an invalid `tol`.
///
/// ```
/// use kappa_linalg::{conditioning_from_singular_values, RankTolerance};
/// let s = ndarray::array![4.0, 2.0, 0.0];
/// let c = conditioning_from_singular_values(s.view(), 3, 3, RankTolerance::Numpy).unwrap();
/// assert_eq!((c.rank, c.kappa, c.pseudo_kappa), (2, f64::INFINITY, 2.0));
/// ```
pub fn conditioning_from_singular_values<A: Real>(
    s: ArrayView1<'_, A>,
    rows: usize,
    cols: usize,
    tol: RankTolerance,
) -> Result<Conditioning<A>> {
    check_vector("s", &s)?;
    let k = rows.min(cols);
    if s.len() != k {
        return Err(InputError::shape_mismatch(
            "s",
            format!("min(rows, cols) = {k} singular values"),
            format!("{} values", s.len()),
        )
        .into());
    }
    if let Some(i) = s.iter().position(|&x| x < A::zero()) {
        return Err(InputError::invalid(
            "s",
            format!("singular values are ≥ 0, found s[{i}] = {}", s[i]),
        )
        .into());
    }
    let mut v: Vec<A> = s.to_vec();
    v.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
    let tau = A::from_f64_lossy(tol.threshold::<A>(v[0].to_f64_lossy(), rows, cols)?);
    Ok(apply_rule(&v, tau))
}

/// The κ rule on descending singular values `v` (non-empty) with threshold `tau`.
fn apply_rule<A: Real>(v: &[A], tau: A) -> Conditioning<A> {
    let k = v.len();
    let (smax, smin) = (v[0], v[k - 1]);
    let rank = v.iter().filter(|&&x| x > tau).count();
    let inf = A::infinity();
    let kappa = if rank == k { smax / smin } else { inf };
    let pseudo_kappa = if rank == 0 { inf } else { smax / v[rank - 1] };
    Conditioning {
        kappa,
        pseudo_kappa,
        rank,
        sigma_max: smax,
        sigma_min: smin,
        threshold: tau,
    }
}

/// The rule applied to the singular values of the rescaled copy 2^k·A, and the scaling: κ, κ⁺
/// and the rank are those of A; σ and τ are 2^k times A's.
fn scaled_conditioning<A: Real>(
    a: ArrayView2<'_, A>,
    tol: RankTolerance,
) -> Result<(Conditioning<A>, Pow2)> {
    // Arguments in signature order (`a`, then `tol`), both before the expensive part.
    crate::input::check_matrix("a", &a)?;
    tol.threshold::<A>(1.0, 1, 1)?;
    let (s, p) = scaled_singular_values(a, SvdDriver::QrIteration)?;
    let (m, n) = a.dim();
    let tau = match tol {
        // An absolute threshold is in A's units: rescale it with A (may over/underflow, which
        // is then the right comparison: every σ below, or above, it).
        RankTolerance::Absolute(t) => p.apply_f64(t),
        _ => tol.threshold::<A>(s[0].to_f64_lossy(), m, n)?,
    };
    Ok((apply_rule(&s.to_vec(), A::from_f64_lossy(tau)), p))
}

/// κ, κ⁺, the numerical rank and the extreme singular values of `a`, from one SVD (singular
/// values only, [`SvdDriver::QrIteration`]).
///
/// Cost: one SVD, ~4mn² flops (m ≥ n). Accuracy: the relative error of a finite κ is at most
/// about p(m,n)·ε·κ (from the SVD's absolute error p(m,n)·ε·σ₁ in σ_k).
///
/// Errors: `a` empty or non-finite; an invalid `tol`; LAPACK failure;
/// [`LinalgError::Overflow`] (argument `a`) when σ₁ exceeds the element type's `MAX` (use
/// [`condition_number_with`], [`pseudo_condition_number`] or [`numerical_rank`], which are
/// scale-free and never overflow).
pub fn conditioning<A: Real>(a: ArrayView2<'_, A>, tol: RankTolerance) -> Result<Conditioning<A>> {
    let (c, p) = scaled_conditioning(a, tol)?;
    let back = p.inverse();
    let sigma_max = back.apply(c.sigma_max);
    if !sigma_max.is_finite() {
        return Err(LinalgError::Overflow {
            arg: "a",
            reason: format!(
                "σ₁ = {:e}·2^{} exceeds {}::MAX",
                c.sigma_max.to_f64_lossy(),
                back.k,
                A::NAME
            ),
        });
    }
    Ok(Conditioning {
        sigma_max,
        sigma_min: back.apply(c.sigma_min),
        threshold: back.apply(c.threshold),
        ..c
    })
}

/// The 2-norm condition number κ(A) = σ₁/σ_k, k = min(m, n), with the default rank rule
/// ([`RankTolerance::Numpy`]): +∞ for numerically rank-deficient `a` (see the module docs).
///
/// Works for any rectangular shape. Cost: one SVD (singular values only).
///
/// Errors: [`InputError::Empty`] and [`InputError::NonFinite`] for argument `a`. Defined for
/// every finite input (scale-free, see the module docs).
///
/// ```
/// use kappa_linalg::condition_number;
/// let a = ndarray::array![[2.0, 0.0], [0.0, 0.5], [0.0, 0.0]];
/// assert_eq!(condition_number(a.view()).unwrap(), 4.0);
/// let singular = ndarray::array![[1.0, 2.0], [2.0, 4.0]];
/// assert_eq!(condition_number(singular.view()).unwrap(), f64::INFINITY);
/// ```
pub fn condition_number<A: Real>(a: ArrayView2<'_, A>) -> Result<A> {
    Ok(scaled_conditioning(a, RankTolerance::Numpy)?.0.kappa)
}

/// κ(A) under an explicit [`RankTolerance`] (e.g. `Absolute(0.0)` for the raw ratio σ₁/σ_k).
///
/// ```
/// use kappa_linalg::{condition_number_with, RankTolerance};
/// let a = ndarray::array![[1.0, 0.0], [0.0, 1e-17]];
/// assert_eq!(condition_number_with(a.view(), RankTolerance::Numpy).unwrap(), f64::INFINITY);
/// assert_eq!(condition_number_with(a.view(), RankTolerance::Absolute(0.0)).unwrap(), 1e17);
/// ```
pub fn condition_number_with<A: Real>(a: ArrayView2<'_, A>, tol: RankTolerance) -> Result<A> {
    Ok(scaled_conditioning(a, tol)?.0.kappa)
}

/// The pseudo condition number κ⁺(A) = σ₁/σ_r over the r singular values above the threshold
/// (numpy's rule by default): the conditioning of A on its numerical range, as needed for
/// matrices that are singular by construction (e.g. the softmax Jacobian diag(p) − ppᵀ, whose
/// rows sum to 0). +∞ only for the zero matrix.
///
/// ```
/// use kappa_linalg::{pseudo_condition_number, RankTolerance};
/// // diag(p) − ppᵀ for p = (1/2, 1/4, 1/4) has rank 2 (its rows sum to 0).
/// let p = [0.5, 0.25, 0.25];
/// let j = ndarray::Array2::from_shape_fn((3, 3), |(i, k)| (i == k) as u8 as f64 * p[i] - p[i] * p[k]);
/// let k = pseudo_condition_number(j.view(), RankTolerance::Numpy).unwrap();
/// assert!(k.is_finite() && k >= 1.0);
/// ```
pub fn pseudo_condition_number<A: Real>(a: ArrayView2<'_, A>, tol: RankTolerance) -> Result<A> {
    Ok(scaled_conditioning(a, tol)?.0.pseudo_kappa)
}

/// The numerical rank r = #{σ_i > τ} (numpy's `matrix_rank` with [`RankTolerance::Numpy`]).
///
/// ```
/// use kappa_linalg::{numerical_rank, RankTolerance};
/// let a = ndarray::array![[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]];
/// assert_eq!(numerical_rank(a.view(), RankTolerance::Numpy).unwrap(), 1);
/// ```
pub fn numerical_rank<A: Real>(a: ArrayView2<'_, A>, tol: RankTolerance) -> Result<usize> {
    Ok(scaled_conditioning(a, tol)?.0.rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_threshold() {
        let t = RankTolerance::Numpy.threshold::<f64>(2.0, 3, 5).unwrap();
        assert_eq!(t, 2.0 * 5.0 * f64::EPSILON);
        let t = RankTolerance::Numpy.threshold::<f32>(1.0, 4, 2).unwrap();
        assert_eq!(t, 4.0 * f64::from(f32::EPSILON));
        assert_eq!(
            RankTolerance::Relative(0.1)
                .threshold::<f64>(3.0, 1, 1)
                .unwrap(),
            0.30000000000000004
        );
        assert_eq!(
            RankTolerance::Absolute(0.5)
                .threshold::<f64>(3.0, 1, 1)
                .unwrap(),
            0.5
        );
    }

    #[test]
    fn rule_on_given_spectra() {
        let s = ndarray::array![1.0, 0.5, 1e-20];
        let c = conditioning_from_singular_values(s.view(), 3, 4, RankTolerance::Numpy).unwrap();
        assert_eq!((c.rank, c.kappa, c.pseudo_kappa), (2, f64::INFINITY, 2.0));
        let raw = conditioning_from_singular_values(s.view(), 3, 4, RankTolerance::Absolute(0.0))
            .unwrap();
        assert_eq!((raw.rank, raw.kappa), (3, 1e20));
        // Unsorted input is sorted.
        let u = ndarray::array![0.5, 2.0];
        let c = conditioning_from_singular_values(u.view(), 2, 2, RankTolerance::Numpy).unwrap();
        assert_eq!((c.sigma_max, c.sigma_min, c.kappa), (2.0, 0.5, 4.0));
    }
}
