//! The crate's one error type, `OptimError`, and the input checks its entry points share.
//!
//! Every variant names the argument or the quantity it is about. Bad input (empty or mis-shaped
//! matrices, NaN or ±∞ entries, parameters out of their domain, too few samples) is always
//! reported through this enum; no public function of `kappa-optim` panics on user input. Further
//! modules (Muon, manifold Muon) add their variants here.
//!
//! The checks of empty, non-finite and mis-shaped arguments and of scalar ranges are
//! kappa-linalg's ([`kappa_linalg::input`], one copy for the workspace): their [`InputError`]
//! converts into [`OptimError::Input`], which carries it whole with its message. A kappa-linalg
//! check of a caller's argument (`Matrix::validate` on `grad`, `w`, ...) is reported the same
//! way, so a NaN gradient is `OptimError::Input(InputError::NonFinite { arg: "grad", .. })` and
//! an empty one `OptimError::Input(InputError::Empty { arg: "grad", .. })` (0.1.0 reported
//! the empty one as `OptimError::Linalg(LinalgError::Empty)`).

use kappa_linalg::input::{check_dims, InputError};
use ndarray::ArrayView2;

/// Everything that can go wrong in `kappa-optim`.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum OptimError {
    /// Bad input: an empty matrix ([`InputError::Empty`]), a NaN or ±∞ entry
    /// ([`InputError::NonFinite`]), a shape that does not fit the other arguments
    /// ([`InputError::ShapeMismatch`]) or a scalar or option argument out of its domain
    /// ([`InputError::InvalidArgument`]), with its own message.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The sample covariance Σ̂ = XXᵀ/n is singular or numerically so (for example n < d), so
    /// Σ̂^{-1/2}, the least-squares M̂ and the preconditioner do not exist.
    #[error(
        "the sample covariance Σ̂ is singular: {n} sample(s) in dimension d = {d} \
         (κ(Σ̂) = {condition:e}); at least d linearly independent covariates are needed"
    )]
    SingularCovariance {
        /// Number of samples the moments were estimated from.
        n: usize,
        /// Covariate dimension.
        d: usize,
        /// κ(Σ̂) (+∞ when rank deficient).
        condition: f64,
    },
    /// An iterative method diverged: the loss or a parameter became non-finite, or the loss grew
    /// past the divergence threshold. Usually the step size is too large.
    #[error(
        "diverged at step {step}: {quantity} = {value:e} (threshold {threshold:e}); \
         the step size is probably too large"
    )]
    Diverged {
        /// The step (number of updates applied so far) at which divergence was detected.
        step: usize,
        /// What was detected (`"loss"` or `"parameters"`).
        quantity: &'static str,
        /// The offending value.
        value: f64,
        /// The threshold it crossed (+∞ for a non-finite value).
        threshold: f64,
    },
    /// A manifold-Muon parameter is not on its manifold at its first step (it was never
    /// retracted onto it, e.g. a fresh Gaussian init). Call `ManifoldMuon::retract_onto` once
    /// before training.
    #[error(
        "argument `w` is not on the {manifold} manifold at its first step: violation {violation:e} \
         > tolerance {tol:e}; call `ManifoldMuon::retract_onto` once before training"
    )]
    NotOnManifold {
        /// `"Stiefel"`, `"DGram"` or `"Oblique"`.
        manifold: &'static str,
        /// The measured violation (`ManifoldMuon::violation`).
        violation: f64,
        /// The tolerance it exceeded.
        tol: f64,
    },
    /// A retraction did not land on its manifold: its result is off by more than the tolerance
    /// (`ManifoldMuonConfig::manifold_tol`). On Stiefel: W is numerically rank-deficient (the zero
    /// matrix included; its nearest Stiefel points are not unique) or too ill-conditioned for a
    /// Newton–Schulz msign; on DGram's column-norm retraction: linearly dependent non-zero
    /// columns; on DGram: column norms beyond `f64::MAX`. Nothing was modified.
    #[error(
        "argument `{arg}` cannot be retracted onto the {manifold} manifold: the retraction ends \
         at violation {violation:e} > tolerance {tol:e} (W is numerically rank-deficient or \
         ill-conditioned for a Newton–Schulz msign — try `Msign::Exact` — or its column norms \
         overflow)"
    )]
    NotRetractable {
        /// The argument's name (`"w"`).
        arg: &'static str,
        /// `"Stiefel"`, `"DGram"` or `"Oblique"`.
        manifold: &'static str,
        /// The violation of the retracted matrix (+∞ when it is not representable).
        violation: f64,
        /// The tolerance it exceeded.
        tol: f64,
    },
    /// The Oblique retraction (each column divided by its norm) met a column without a
    /// direction: of norm 0, or below the retraction's floor 2⁻⁵⁰·‖W‖_F, where its squared norm
    /// is no longer computed to working precision (`manifold::retraction`, "Oblique"). Nothing
    /// was modified.
    #[error(
        "argument `{arg}` cannot be retracted onto the Oblique manifold: column {column} has \
         norm {relative_norm:e}·‖W‖_F, at or below the floor 2^-50 (a zero column has no \
         direction to normalize)"
    )]
    ZeroColumn {
        /// The argument's name (`"w"`).
        arg: &'static str,
        /// The column's index in the tall orientation (rows ≥ columns).
        column: usize,
        /// Its norm relative to ‖W‖_F (0 for a zero column).
        relative_norm: f64,
    },
    /// Manifold Muon's dual ascent diverged: the tangent violation of the final candidate is
    /// non-finite or grew past `divergence_factor` times its starting value. The step was not
    /// applied and the optimizer state is unchanged. Usually the gradient is badly scaled for
    /// the dual step α; `remedy` says which setting to change, and to what, for this gradient
    /// (`DualAscent::divergence_remedy`).
    #[error(
        "the manifold-Muon dual ascent diverged after {steps} step(s): tangent violation \
         {violation:e} (started at {initial_violation:e}, gradient Frobenius norm \
         {gradient_norm:e}); the step was not applied. To fix: {remedy}"
    )]
    DualAscentDiverged {
        /// Dual steps taken.
        steps: usize,
        /// ‖H‖_F/n at the initial multiplier.
        initial_violation: f64,
        /// ‖H‖_F/n of the final candidate.
        violation: f64,
        /// ‖G‖_F of the (momentum) gradient the ascent started from.
        gradient_norm: f64,
        /// What to change, and to what ([`DualAscent::divergence_remedy`](crate::DualAscent::divergence_remedy)).
        remedy: String,
    },
    /// An error in the update or the saved state of one parameter of an
    #[cfg_attr(feature = "tch", doc = "[`Optimizer`](crate::optimizer::Optimizer),")]
    #[cfg_attr(not(feature = "tch"), doc = "`Optimizer` (feature `tch`),")]
    /// naming it (for an error of a batched call, the parameters of the batch; for one of a
    /// whole group, the group).
    #[error("parameter `{name}`: {source}")]
    Param {
        /// The parameter's name.
        name: String,
        /// What went wrong.
        source: Box<OptimError>,
    },
    /// Parameter groups that do not make an optimizer: a parameter no rule places, one in two
    /// groups, an empty group, two groups of one name, an invalid config in a group.
    #[error("optimizer groups: {reason}")]
    Groups {
        /// What is wrong, naming the groups and parameters.
        reason: String,
    },
    /// A collective of a sharded [`Optimizer`](crate::optimizer::Optimizer) step failed
    /// (feature `dist`): a rank left, disagreed or stalled past the communicator's timeout. The
    /// step is incomplete on this rank (some blocks are updated, others not).
    #[cfg(feature = "dist")]
    #[error("group `{group}`: the exchange between the ranks failed: {source}")]
    Collective {
        /// The group whose blocks were exchanged.
        group: String,
        /// The collective's error.
        source: kappa_dist::DistError,
    },
    /// A saved optimizer state that does not fit the optimizer: a key missing, left over or of
    /// the wrong size, kind or values. Nothing was loaded.
    #[error("optimizer state `{key}`: {reason}")]
    State {
        /// The state's key (`state/<param>/…`).
        key: String,
        /// What does not fit.
        reason: String,
    },
    /// Reading or writing an optimizer state file failed.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        error: String,
    },
    /// A `kappa-linalg` routine failed (SVD, PSD square root, condition number).
    #[error(transparent)]
    Linalg(#[from] kappa_linalg::LinalgError),
    /// A computed quantity overflowed f64 although every input was finite (inputs too large in
    /// magnitude, e.g. entries near 1e300 whose products exceed `f64::MAX`). Nothing was
    /// returned; rescale the named arguments.
    #[error(
        "`{quantity}` overflowed f64 from finite inputs; rescale `{args}` (entries too large in magnitude)"
    )]
    Overflow {
        /// The quantity that became non-finite.
        quantity: &'static str,
        /// The arguments it was computed from.
        args: &'static str,
    },
}

/// Converts the error of a `kappa-linalg` check of a caller's argument (`Matrix::validate`):
/// its input error becomes the crate's own [`OptimError::Input`] (so a NaN gradient is
/// `OptimError::Input(InputError::NonFinite { arg: "grad", .. })`), anything else stays
/// [`OptimError::Linalg`].
pub(crate) fn from_linalg(e: kappa_linalg::LinalgError) -> OptimError {
    match e {
        kappa_linalg::LinalgError::Input(e) => OptimError::Input(e),
        other => OptimError::Linalg(other),
    }
}

/// A libtorch failure in a call on argument `arg`: [`LinalgError::Backend`] with the first
/// line of libtorch's message (the rest is its C++ backtrace).
///
/// [`LinalgError::Backend`]: kappa_linalg::LinalgError::Backend
#[cfg(feature = "tch")]
pub(crate) fn libtorch(arg: &'static str) -> impl Fn(tch::TchError) -> OptimError {
    move |e| {
        OptimError::Linalg(kappa_linalg::LinalgError::Backend {
            arg,
            message: e.to_string().lines().next().unwrap_or_default().to_string(),
        })
    }
}

/// Converts a `kappa-linalg` error from a call on an intermediate result: a result that does not
/// fit in f64 ([`LinalgError::Overflow`](kappa_linalg::LinalgError::Overflow), which would name
/// the linalg routine's own parameter) becomes [`OptimError::Overflow`] naming the quantity and
/// the caller's arguments it was computed from.
pub(crate) fn overflow_as(
    quantity: &'static str,
    args: &'static str,
) -> impl FnOnce(kappa_linalg::LinalgError) -> OptimError {
    move |e| match e {
        kappa_linalg::LinalgError::Overflow { .. } => OptimError::Overflow { quantity, args },
        other => OptimError::Linalg(other),
    }
}

/// `Result` with [`OptimError`].
pub type Result<T> = std::result::Result<T, OptimError>;

// The workspace's input checks (kappa-linalg's, written once), for this crate's modules; their
// `InputError` converts into `OptimError::Input`.
pub(crate) use kappa_linalg::input::{check_finite, check_range, shape_str};

/// Checks that `a` is `rows×cols` (with the expectation spelled out for the message), then that
/// it is finite; an empty matrix of that shape passes (unlike kappa-linalg's `check_matrix`).
pub(crate) fn check_matrix(
    arg: &'static str,
    a: &ArrayView2<'_, f64>,
    rows: usize,
    cols: usize,
    why: &str,
) -> Result<()> {
    check_dims(arg, a, rows, cols, why)?;
    Ok(check_finite(arg, a)?)
}

/// Checks that a computed matrix is finite (after finite inputs): [`OptimError::Overflow`] if not.
pub(crate) fn check_output(
    quantity: &'static str,
    args: &'static str,
    a: &ArrayView2<'_, f64>,
) -> Result<()> {
    if a.iter().all(|x| x.is_finite()) {
        Ok(())
    } else {
        Err(OptimError::Overflow { quantity, args })
    }
}

/// Checks that a computed scalar is finite (after finite inputs): [`OptimError::Overflow`] if not.
pub(crate) fn check_output_scalar(
    quantity: &'static str,
    args: &'static str,
    x: f64,
) -> Result<f64> {
    if x.is_finite() {
        Ok(x)
    } else {
        Err(OptimError::Overflow { quantity, args })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kappa_linalg::input::check_matrix as check_non_empty;
    use kappa_linalg::LinalgError;
    use ndarray::{array, Array2};

    /// Each input error is wrapped whole, unchanged (the same fields, compared by `Debug`, as NaN
    /// ≠ NaN) and with the same message, and so is the
    /// input error of a kappa-linalg check of a caller's argument.
    #[test]
    fn input_errors_are_wrapped_with_the_same_message() {
        let cases = [
            check_finite("grad", &array![[1.0, f64::NAN]].view()).unwrap_err(),
            check_dims("b", &array![[1.0]].view(), 2, 2, "d×d").unwrap_err(),
            check_range("lr", -1.0, 0.0, 1.0).unwrap_err(),
            check_non_empty("w", &Array2::<f64>::zeros((0, 3)).view()).unwrap_err(),
        ];
        for e in cases {
            let text = e.to_string();
            let converted = OptimError::from(e.clone());
            assert_eq!(converted.to_string(), text);
            let OptimError::Input(inner) = &converted else {
                panic!("{e:?} became {converted:?}");
            };
            assert_eq!(format!("{inner:?}"), format!("{e:?}"));
            let checked = from_linalg(LinalgError::from(e.clone()));
            assert_eq!(checked.to_string(), text);
            let OptimError::Input(inner) = &checked else {
                panic!("{e:?} via kappa-linalg became {checked:?}");
            };
            assert_eq!(format!("{inner:?}"), format!("{e:?}"));
        }
        let lapack = LinalgError::Lapack {
            arg: "a",
            routine: "gesvd",
            message: "no convergence".into(),
        };
        assert!(matches!(
            from_linalg(lapack),
            OptimError::Linalg(LinalgError::Lapack { arg: "a", .. })
        ));
        // The shape is checked before the entries, and an empty matrix of the shape passes.
        let nan = array![[f64::NAN]];
        assert!(matches!(
            check_matrix("m", &nan.view(), 2, 1, "k×d"),
            Err(OptimError::Input(InputError::ShapeMismatch {
                arg: "m",
                ..
            }))
        ));
        assert!(check_matrix("m", &Array2::zeros((0, 3)).view(), 0, 3, "k×d").is_ok());
    }
}
