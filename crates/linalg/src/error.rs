//! The crate's one error type, and the input checks every public entry point runs first.
//!
//! Every error names the argument it is about (`arg`, the parameter name as written in the
//! function's signature) and the problem, so a message such as
//! ``argument `a` has a non-finite entry NaN at (2, 0)`` points straight at the bad value.
//!
//! # The error contract
//!
//! * Every public entry point returns a `LinalgError` or a documented value on any input: it
//!   never panics, never runs without end (iteration and step counts are capped:
//!   [`MAX_ITERATIONS`](crate::MAX_ITERATIONS), [`MAX_NS_STEPS`](crate::MAX_NS_STEPS)) and never
//!   aborts on allocation (dense results beyond [`MAX_DENSE_ENTRIES`] are
//!   [`LinalgError::TooLarge`]).
//! * `arg` is the caller's parameter as written in the signature (`a`, `tol`, `opts.max_iter`,
//!   `schedule.steps`, `self` for trait methods, `self.u` for a field of `self`).
//! * When several arguments are bad, the first one in signature order is reported; checks of
//!   one argument alone come before checks that involve several (shape agreement, PSD under τ).
//! * Finite input of any magnitude, subnormal to near `MAX`, is valid input. Scale-safe
//!   algorithms rescale exactly by powers of two, and only a result that is itself not
//!   representable is an error ([`LinalgError::Overflow`]).
//! * The checks of empty, non-finite and mis-shaped arguments and of scalar domains are
//!   [`crate::input`]'s, shared with the workspace's other crates; their [`InputError`] is
//!   reported whole, as [`LinalgError::Input`], with its own message.

use crate::input::InputError;

/// Largest dense result the crate builds (2²⁸ entries = 2 GiB of f64); beyond it, use the
/// implicit forms ([`Commutation`](crate::Commutation), [`kron_matvec`](crate::kron_matvec)).
/// A larger one is [`LinalgError::TooLarge`].
pub const MAX_DENSE_ENTRIES: usize = 1 << 28;

/// Everything that can go wrong in `kappa-linalg`.
///
/// Bad input is always reported through this enum; no public function panics on user input.
/// Empty matrices, NaN or ±∞ entries, mismatched shapes and invalid parameters are
/// [`LinalgError::Input`] (an [`InputError`]); the other variants are this crate's own checks
/// and failures.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LinalgError {
    /// Bad input: an empty matrix or vector ([`InputError::Empty`]), a NaN or ±∞ entry
    /// ([`InputError::NonFinite`]), a shape that does not fit the other arguments
    /// ([`InputError::ShapeMismatch`]) or a scalar or option argument out of its domain (negative
    /// tolerance, zero steps, ...: [`InputError::InvalidArgument`]), with its own message.
    #[error(transparent)]
    Input(#[from] InputError),
    /// A square matrix was required.
    #[error("argument `{arg}` must be square, found {rows}×{cols}")]
    NotSquare {
        /// The argument's name.
        arg: &'static str,
        /// Its number of rows.
        rows: usize,
        /// Its number of columns.
        cols: usize,
    },
    /// A symmetric matrix was required.
    #[error(
        "argument `{arg}` is not symmetric: max |a_ij − a_ji| = {asymmetry:e} exceeds the tolerance {tolerance:e}"
    )]
    NotSymmetric {
        /// The argument's name.
        arg: &'static str,
        /// The largest entrywise asymmetry found.
        asymmetry: f64,
        /// The tolerance it was compared with.
        tolerance: f64,
    },
    /// A positive semidefinite matrix was required.
    #[error(
        "argument `{arg}` is not positive semidefinite: it has the eigenvalue {eigenvalue:e}, below −{tolerance:e}"
    )]
    NotPositiveSemidefinite {
        /// The argument's name.
        arg: &'static str,
        /// The most negative eigenvalue.
        eigenvalue: f64,
        /// The tolerance below zero that is still accepted as zero.
        tolerance: f64,
    },
    /// The result would not fit in memory (or its size overflows `usize`).
    #[error("argument `{arg}` is too large: {reason}")]
    TooLarge {
        /// The argument's name.
        arg: &'static str,
        /// Why the result cannot be built.
        reason: String,
    },
    /// A finite input whose result does not fit the element type: a singular value, a norm or an
    /// entry of the result would exceed its largest finite number (`f64::MAX` ≈ 1.8e308,
    /// `f32::MAX` ≈ 3.4e38). The computation itself runs on an exactly rescaled copy and does
    /// not overflow; only the value to be returned would. Scale-free results (κ, rank, polar
    /// factor, Newton–Schulz) never report this.
    #[error("argument `{arg}`: the result overflows the element type: {reason}")]
    Overflow {
        /// The argument's name.
        arg: &'static str,
        /// Which value overflows, and its size as a power of two.
        reason: String,
    },
    /// A tensor has an element type the backend does not compute in.
    #[error("argument `{arg}` has element type {dtype}; supported: {supported}")]
    UnsupportedDtype {
        /// The argument's name.
        arg: &'static str,
        /// The element type found.
        dtype: String,
        /// The element types that are supported.
        supported: &'static str,
    },
    /// A LAPACK routine reported a failure (for example no convergence of the QR iteration).
    #[error("LAPACK ({routine}) failed on argument `{arg}`: {message}")]
    Lapack {
        /// The argument's name.
        arg: &'static str,
        /// The operation that failed.
        routine: &'static str,
        /// LAPACK's message.
        message: String,
    },
    /// An iterative design routine did not settle within its cap (the Polar Express generator's
    /// Remez exchange; it does not happen for valid inputs with the default cushion).
    #[error("argument `{arg}`: {routine} did not converge: {reason}")]
    NoConvergence {
        /// The argument's name.
        arg: &'static str,
        /// The routine that did not converge.
        routine: &'static str,
        /// What it was solving.
        reason: String,
    },
    /// libtorch reported an error (only with the `tch` feature).
    #[error("libtorch failed on argument `{arg}`: {message}")]
    Backend {
        /// The argument's name.
        arg: &'static str,
        /// libtorch's message.
        message: String,
    },
}

/// `Result` with [`LinalgError`].
pub type Result<T> = std::result::Result<T, LinalgError>;

/// Wraps an `ndarray-linalg` error.
pub(crate) fn lapack_err(
    arg: &'static str,
    routine: &'static str,
) -> impl FnOnce(ndarray_linalg::error::LinalgError) -> LinalgError {
    move |e| LinalgError::Lapack {
        arg,
        routine,
        message: e.to_string(),
    }
}

/// The same error naming `to` instead of `from` (for entry points that delegate to another one
/// whose parameter has a different name, e.g. `Matrix::singular_values(&self)` → `a`).
pub(crate) fn rename(e: LinalgError, from: &'static str, to: &'static str) -> LinalgError {
    use LinalgError as E;
    let fix = |arg: &mut &'static str| {
        if *arg == from {
            *arg = to;
        }
    };
    let mut e = e;
    match &mut e {
        E::Input(input) => fix(input.arg_mut()),
        E::NotSquare { arg, .. }
        | E::NotSymmetric { arg, .. }
        | E::NotPositiveSemidefinite { arg, .. }
        | E::TooLarge { arg, .. }
        | E::Overflow { arg, .. }
        | E::UnsupportedDtype { arg, .. }
        | E::Lapack { arg, .. }
        | E::NoConvergence { arg, .. }
        | E::Backend { arg, .. } => fix(arg),
    }
    e
}

/// Checks that a dense `rows`×`cols` result fits [`MAX_DENSE_ENTRIES`]
/// (so building it can neither overflow `usize` nor abort on allocation).
pub(crate) fn check_dense(arg: &'static str, rows: usize, cols: usize) -> Result<()> {
    match rows.checked_mul(cols) {
        Some(n) if n <= MAX_DENSE_ENTRIES => Ok(()),
        _ => Err(LinalgError::TooLarge {
            arg,
            reason: format!(
                "the dense result would be {rows}×{cols}, more than MAX_DENSE_ENTRIES = 2^28 \
                 entries"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{check_matrix, check_nonneg, check_shape, check_vector};
    use ndarray::{array, Array2};

    /// Each input error is wrapped whole, unchanged (the same fields, compared by `Debug`, as NaN
    /// ≠ NaN) and with the same message.
    #[test]
    fn input_errors_are_wrapped_with_the_same_message() {
        let nan = array![[1.0, f64::NAN]];
        let cases = [
            check_matrix("w", &Array2::<f32>::zeros((0, 2)).view()).unwrap_err(),
            check_vector("v", &array![1.0f32, f32::NAN].view()).unwrap_err(),
            check_shape("x", &array![[1.0]].view(), 2, 2, "D×D").unwrap_err(),
            check_nonneg("tol", f64::NAN).unwrap_err(),
        ];
        for e in cases {
            let text = e.to_string();
            let converted = LinalgError::from(e.clone());
            assert_eq!(converted.to_string(), text);
            let LinalgError::Input(inner) = &converted else {
                panic!("{e:?} became {converted:?}");
            };
            assert_eq!(format!("{inner:?}"), format!("{e:?}"));
        }
        assert!(matches!(
            LinalgError::from(check_matrix("a", &nan.view()).unwrap_err()),
            LinalgError::Input(InputError::NonFinite {
                arg: "a",
                row: 0,
                col: 1,
                ..
            })
        ));
    }

    /// `rename` renames the argument of an input error too, and nothing else.
    #[test]
    fn rename_reaches_the_input_error() {
        let e = rename(InputError::invalid("a", "must be ≥ 1").into(), "a", "self");
        assert_eq!(e.to_string(), "argument `self` is invalid: must be ≥ 1");
        let e = rename(InputError::invalid("b", "x").into(), "a", "self");
        assert_eq!(e.to_string(), "argument `b` is invalid: x");
    }
}
