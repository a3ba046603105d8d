//! Covariance matrices: the check every Σ (and Σ̂) passes — square, finite, symmetric positive
//! definite with κ ≤ [`MAX_CONDITION`] — and its roots Σ^{1/2}, Σ^{-1/2}.
//!
//! Its own module so that the data model ([`DataModel`](super::DataModel)), the population
//! objective ([`PopulationProblem`](super::PopulationProblem)) and the moments all use it
//! without using each other in a circle.

use kappa_linalg::input::InputError;
use kappa_linalg::{condition_number, psd_inv_sqrt, psd_sqrt, LinalgError, RankTolerance};
use ndarray::{Array2, ArrayView2};

use crate::error::{check_matrix, check_output, OptimError, Result};

/// Largest κ(Σ) a [`DataModel`](super::DataModel) accepts (beyond it Σ^{-1/2} has no correct
/// digits to speak of).
pub const MAX_CONDITION: f64 = 1e12;

/// Checks a covariance-like matrix: square d×d, finite, symmetric PSD with κ ≤ [`MAX_CONDITION`];
/// returns (Σ^{1/2}, Σ^{-1/2}, κ).
pub(crate) fn covariance_roots(
    arg: &'static str,
    sigma: &ArrayView2<'_, f64>,
) -> Result<(Array2<f64>, Array2<f64>, f64)> {
    let d = sigma.nrows();
    check_matrix(arg, sigma, d, d, "square")?;
    if d == 0 {
        return Err(InputError::invalid(arg, "is empty").into());
    }
    // LAPACK takes standard layouts only: copy strided and negative-stride views.
    // (A fresh row-major copy: `as_standard_layout` keeps a 1×1 view's odd strides.)
    let sigma = Array2::from_shape_fn(sigma.dim(), |ij| sigma[ij]);
    let half = psd_sqrt(sigma.view(), RankTolerance::default()).map_err(|e| rename(e, arg))?;
    let kappa = condition_number(sigma.view()).map_err(|e| rename(e, arg))?;
    if !(kappa.is_finite() && kappa <= MAX_CONDITION) {
        return Err(InputError::invalid(
            arg,
            format!("must be positive definite with κ ≤ {MAX_CONDITION:e}, found κ = {kappa:e}"),
        )
        .into());
    }
    let inv_half =
        psd_inv_sqrt(sigma.view(), RankTolerance::default()).map_err(|e| rename(e, arg))?;
    check_output("Σ^{1/2}", arg, &half.view())?;
    check_output("Σ^{-1/2}", arg, &inv_half.view())?;
    Ok((half, inv_half, kappa))
}

/// A `kappa-linalg` error about its own argument (`p`, `a`, `s`) restated for the caller's
/// argument `arg`.
fn rename(e: LinalgError, arg: &'static str) -> OptimError {
    let reason = match &e {
        LinalgError::NotSymmetric {
            asymmetry,
            tolerance,
            ..
        } => {
            format!("is not symmetric: max |a_ij − a_ji| = {asymmetry:e} > {tolerance:e}")
        }
        LinalgError::NotPositiveSemidefinite {
            eigenvalue,
            tolerance,
            ..
        } => format!(
            "must be positive definite, found the eigenvalue {eigenvalue:e} (below −{tolerance:e})"
        ),
        LinalgError::NotSquare { rows, cols, .. } => format!("must be square, found {rows}×{cols}"),
        LinalgError::Input(InputError::InvalidArgument { reason, .. }) => reason.clone(),
        LinalgError::Input(InputError::NonFinite {
            row, col, value, ..
        }) => {
            return InputError::NonFinite {
                arg,
                row: *row,
                col: *col,
                value: *value,
            }
            .into()
        }
        _ => return OptimError::Linalg(e),
    };
    InputError::invalid(arg, reason).into()
}
