//! Square root and inverse square root of symmetric positive semidefinite matrices.
//!
//! Math: for symmetric P = Q Λ Qᵀ (eigendecomposition, LAPACK `?syevd` through `ndarray-linalg`),
//! P^{1/2} = Q Λ^{1/2} Qᵀ and P^{-1/2} = Q Λ^{-1/2} Qᵀ, both symmetric.
//!
//! Conventions, one threshold for both: τ from a [`RankTolerance`] applied to the eigenvalues
//! (default numpy's τ = λ_max·n·ε, with λ_max the largest |λ|).
//!
//! * P must be symmetric up to `max|P − Pᵀ| ≤ √ε·max|P|` (ε of the element type); it is then
//!   symmetrized, (P + Pᵀ)/2, before the eigendecomposition.
//! * Eigenvalues in [−τ, 0) are rounding noise and are set to 0; an eigenvalue below −τ is an
//!   error ([`LinalgError::NotPositiveSemidefinite`]).
//! * The inverse square root floors every eigenvalue at τ: λ ← max(λ, τ), so tiny and zero
//!   eigenvalues give 1/√τ instead of ∞. The zero matrix (τ = 0) is an error.
//!
//! Cost: one symmetric eigendecomposition (≈ 9n³ flops with vectors) plus two n³ products.
//! Accuracy: eigenvalues carry absolute error ≈ n·ε·‖P‖₂, so P^{1/2} is accurate to ≈ √(n·ε·‖P‖₂)
//! in the worst case (near-zero eigenvalues) and ‖(P^{1/2})² − P‖ ≈ n·ε·‖P‖₂; P^{-1/2} has
//! relative error ≈ n·ε·κ(P) when no eigenvalue is floored.
//!
//! Scale safety: the checks and the eigendecomposition run on P_s = 2^{2j}·P, the exact rescaling
//! by an even power of two with max |p_ij|·2^{2j} ∈ [0.25, 1), so nothing over- or underflows for
//! any finite P (subnormal to near `MAX`); then P^{1/2} = 2^{−j}·P_s^{1/2} and
//! P^{−1/2} = 2^{j}·P_s^{−1/2}, again exact. Both results are representable for every finite P
//! (‖P^{1/2}‖ ≤ √(n·max|p_ij|) and the floor τ keeps P^{−1/2} finite), and an
//! `Absolute(atol)` floor is applied in P's units.

use ndarray::{Array1, Array2, ArrayView2, Axis};
use ndarray_linalg::{EighInto, UPLO};

use crate::cond::RankTolerance;
use crate::error::{lapack_err, LinalgError, Result};
use crate::input::{check_matrix, InputError};
use crate::scalar::{max_abs, Pow2, Real};

/// The eigendecomposition of the rescaled P_s = 2^{2j}·P (values and τ in P_s's units).
struct Eig<A> {
    values: Array1<A>,
    vectors: Array2<A>,
    tau: A,
    /// 2^{2j}.
    scale: Pow2,
}

fn eig_psd<A: Real>(p: ArrayView2<'_, A>, tol: RankTolerance) -> Result<Eig<A>> {
    check_matrix("p", &p)?;
    let (rows, cols) = p.dim();
    if rows != cols {
        return Err(LinalgError::NotSquare {
            arg: "p",
            rows,
            cols,
        });
    }
    let mut scale = Pow2::normalizing(max_abs(p.iter()));
    scale.k -= scale.k.rem_euclid(2);
    // A standard-layout copy whatever the view's strides (LAPACK needs one).
    let p = Array2::from_shape_fn(p.dim(), |ij| scale.apply(p[ij]));
    let amax = p.iter().fold(A::zero(), |m, &x| m.max(x.fabs()));
    let asym = p
        .indexed_iter()
        .fold(A::zero(), |m, ((i, j), &x)| m.max((x - p[[j, i]]).fabs()));
    let sym_tol = amax * A::from_f64_lossy(A::EPS.sqrt());
    let back = scale.inverse();
    if asym > sym_tol {
        return Err(LinalgError::NotSymmetric {
            arg: "p",
            asymmetry: back.apply_f64(asym.to_f64_lossy()),
            tolerance: back.apply_f64(sym_tol.to_f64_lossy()),
        });
    }
    // `tol` after every check of `p` alone (arguments in signature order); the PSD test needs
    // both and comes last.
    tol.threshold::<A>(1.0, 1, 1)?;
    let half = A::from_f64_lossy(0.5);
    let sym = Array2::from_shape_fn(p.dim(), |(i, j)| (p[[i, j]] + p[[j, i]]) * half);
    let (values, vectors) = sym
        .eigh_into(UPLO::Lower)
        .map_err(lapack_err("p", "?syevd"))?;
    let lmax = values.iter().fold(A::zero(), |m, &x| m.max(x.fabs()));
    let tau = match tol {
        RankTolerance::Absolute(t) => A::from_f64_lossy(scale.apply_f64(t)),
        _ => A::from_f64_lossy(tol.threshold::<A>(lmax.to_f64_lossy(), rows, cols)?),
    };
    let lmin = values.iter().fold(A::infinity(), |m, &x| m.min(x));
    if lmin < -tau {
        return Err(LinalgError::NotPositiveSemidefinite {
            arg: "p",
            eigenvalue: back.apply_f64(lmin.to_f64_lossy()),
            tolerance: back.apply_f64(tau.to_f64_lossy()),
        });
    }
    Ok(Eig {
        values,
        vectors,
        tau,
        scale,
    })
}

/// Q·f(Λ)·Qᵀ, multiplied by `post` (an exact power of two).
fn compose<A: Real>(e: &Eig<A>, f: impl Fn(A) -> A, post: Pow2) -> Array2<A> {
    let d = e.values.mapv(f);
    let qd = &e.vectors * &d.view().insert_axis(Axis(0));
    qd.dot(&e.vectors.t()).mapv(|x| post.apply(x))
}

/// The principal square root P^{1/2} of a symmetric positive semidefinite `p`.
///
/// Eigenvalues in [−τ, 0) are treated as 0 (see the module docs).
///
/// Errors: `p` empty, non-finite, not square, not symmetric, or with an eigenvalue below −τ;
/// an invalid `tol`.
///
/// ```
/// use kappa_linalg::{psd_sqrt, RankTolerance};
/// let p = ndarray::array![[4.0_f64, 0.0], [0.0, 9.0]];
/// let r = psd_sqrt(p.view(), RankTolerance::Numpy).unwrap();
/// assert!((r[[0, 0]] - 2.0).abs() < 1e-14 && (r[[1, 1]] - 3.0).abs() < 1e-14);
/// ```
pub fn psd_sqrt<A: Real>(p: ArrayView2<'_, A>, tol: RankTolerance) -> Result<Array2<A>> {
    let e = eig_psd(p, tol)?;
    let half_back = Pow2 { k: -e.scale.k / 2 };
    Ok(compose(&e, |l| l.max(A::zero()).fsqrt(), half_back))
}

/// The inverse square root P^{-1/2} of a symmetric positive semidefinite `p`, with every
/// eigenvalue floored at τ (so it is finite for singular `p`; see the module docs).
///
/// Errors: as [`psd_sqrt`], and [`InputError::InvalidArgument`] when τ = 0 and `p` has a zero
/// eigenvalue (e.g. `p` = 0, or `RankTolerance::Absolute(0.0)` with a singular `p`).
///
/// ```
/// use kappa_linalg::{psd_inv_sqrt, RankTolerance};
/// let p = ndarray::array![[4.0_f64, 0.0], [0.0, 0.25]];
/// let r = psd_inv_sqrt(p.view(), RankTolerance::Numpy).unwrap();
/// assert!((r[[0, 0]] - 0.5).abs() < 1e-14 && (r[[1, 1]] - 2.0).abs() < 1e-14);
/// ```
pub fn psd_inv_sqrt<A: Real>(p: ArrayView2<'_, A>, tol: RankTolerance) -> Result<Array2<A>> {
    let e = eig_psd(p, tol)?;
    let floor = e.tau;
    if !(e.values.iter().all(|&l| l.max(floor) > A::zero())) {
        return Err(InputError::invalid(
            "p",
            "has a zero eigenvalue and the floor τ is 0; P^{-1/2} is undefined \
                     (pass a positive RankTolerance::Absolute floor)",
        )
        .into());
    }
    let r = compose(
        &e,
        |l| A::one() / l.max(floor).fsqrt(),
        Pow2 { k: e.scale.k / 2 },
    );
    if r.iter().all(|x| x.is_finite()) {
        Ok(r)
    } else {
        Err(LinalgError::Overflow {
            arg: "tol",
            reason: format!(
                "the floor τ is so small that P^(-1/2) exceeds {}::MAX",
                A::NAME
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_asymmetry_is_symmetrized_and_rounding_negatives_are_zeroed() {
        let p = ndarray::array![[2.0_f64, 1.0 + 1e-12], [1.0, 2.0]];
        let r = psd_sqrt(p.view(), RankTolerance::Numpy).unwrap();
        assert!((r.dot(&r) - ndarray::array![[2.0, 1.0], [1.0, 2.0]])
            .iter()
            .all(|e| e.abs() < 1e-11));
        // Eigenvalues 2 and −1e-17 (rounding noise): accepted, treated as 0.
        let q = ndarray::array![[1.0_f64, 1.0], [1.0, 1.0 - 1e-17]];
        assert!(psd_sqrt(q.view(), RankTolerance::Numpy).is_ok());
    }
}
