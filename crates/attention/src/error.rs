//! The crate's one error type, and the input checks every public entry point runs first.
//!
//! Every error names the argument it is about (the parameter name as written in the function's
//! signature, or `field.name` for a field of a struct argument), so a message such as
//! ``argument `x` has a non-finite entry NaN at (2, 0)`` points straight at the bad value.
//!
//! The checks of empty, non-finite and mis-shaped arguments and of scalar domains are
//! kappa-linalg's ([`kappa_linalg::input`], one copy for the workspace): their
//! [`InputError`] converts into [`AttentionError::Input`], which carries it whole with its
//! message, so `check_matrix("x", &x)?` reports an [`AttentionError`]. The checks below are this
//! crate's own.

use kappa_linalg::input::{check_matrix, InputError};
use kappa_linalg::{LinalgError, Real};
use ndarray::ArrayView2;

/// Everything that can go wrong in `kappa-attention`.
///
/// Bad input is always reported through this enum; no public function panics on user input.
/// Empty matrices, NaN or ±∞ entries, mismatched shapes and invalid parameters are
/// [`AttentionError::Input`] (kappa-linalg's [`InputError`]). Errors of the numerical
/// kernel (`kappa-linalg`: LAPACK failures, results too large to form densely) are wrapped in
/// [`AttentionError::Linalg`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AttentionError {
    /// Bad input: an empty matrix or vector ([`InputError::Empty`]), a NaN or ±∞ entry
    /// ([`InputError::NonFinite`]), a shape that does not fit the other arguments
    /// ([`InputError::ShapeMismatch`]) or a scalar or option argument out of its domain
    /// ([`InputError::InvalidArgument`]), with its own message.
    #[error(transparent)]
    Input(#[from] InputError),
    /// A dense result would not fit in memory; use the matrix-free products instead.
    #[error("argument `{arg}` is too large: {reason}")]
    TooLarge {
        /// The argument's name.
        arg: &'static str,
        /// Why the result cannot be built.
        reason: String,
    },
    /// The requested guarantee cannot be met by any λ (for example a strict decrease of κ for a
    /// matrix whose κ is already 1).
    #[error("argument `{arg}`: {reason}")]
    Unattainable {
        /// The argument's name.
        arg: &'static str,
        /// Why.
        reason: String,
    },
    /// A result (or an intermediate that determines it, such as the scores Q Kᵀ/s) is not
    /// representable: its magnitude exceeds the largest finite value of the element type,
    /// although every input was finite. The argument named is the one whose scale decides it.
    #[error("argument `{arg}` is out of range: {reason}")]
    Overflow {
        /// The argument's name.
        arg: &'static str,
        /// What overflowed, and what to change.
        reason: String,
    },
    /// An error of the numerical kernel (`kappa-linalg`).
    #[error(transparent)]
    Linalg(#[from] LinalgError),
}

/// `Result` with [`AttentionError`].
pub type Result<T> = std::result::Result<T, AttentionError>;

/// Checks that a computed matrix is finite: [`AttentionError::Overflow`] naming `arg`, with
/// `what` saying which quantity overflowed, otherwise.
pub(crate) fn check_computed<A: Real>(
    arg: &'static str,
    a: &ArrayView2<'_, A>,
    what: &str,
) -> Result<()> {
    if kappa_linalg::input::all_finite(a) {
        return Ok(());
    }
    Err(AttentionError::Overflow {
        arg,
        reason: format!(
            "{what} has entries beyond the largest finite {} ({:e}); scale the input down",
            A::NAME,
            A::max_value().to_f64_lossy()
        ),
    })
}

/// Checks that a probability matrix (an attention matrix P) is non-empty, finite and has its
/// entries in [0, 1].
pub(crate) fn check_probabilities<A: Real>(arg: &'static str, p: &ArrayView2<'_, A>) -> Result<()> {
    check_matrix(arg, p)?;
    match p
        .indexed_iter()
        .find(|(_, &x)| !(x >= A::zero() && x <= A::one()))
    {
        None => Ok(()),
        Some(((i, j), x)) => Err(InputError::invalid(
            arg,
            format!("an attention matrix has entries in [0, 1], found {x} at ({i}, {j})"),
        )
        .into()),
    }
}

/// Checks that a dense rows×cols result stays within [`kappa_linalg::MAX_DENSE_ENTRIES`].
pub(crate) fn check_dense(arg: &'static str, rows: usize, cols: usize) -> Result<()> {
    match rows.checked_mul(cols) {
        Some(n) if n <= kappa_linalg::MAX_DENSE_ENTRIES => Ok(()),
        _ => Err(AttentionError::TooLarge {
            arg,
            reason: format!(
                "the dense result would be {rows}×{cols}, more than kappa_linalg::MAX_DENSE_ENTRIES \
                 = 2^28 entries; use the matrix-free products (jvp/vjp)"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kappa_linalg::input::{check_length, check_nonneg, check_shape};
    use ndarray::{array, Array2};

    /// Each input error is wrapped whole, unchanged (the same fields, compared by `Debug`, as NaN
    /// ≠ NaN) and with the same message.
    #[test]
    fn input_errors_are_wrapped_with_the_same_message() {
        let cases = [
            check_matrix("w", &Array2::<f32>::zeros((0, 2)).view()).unwrap_err(),
            check_matrix("x", &array![[1.0, f64::NAN]].view()).unwrap_err(),
            check_shape("wk", &array![[1.0]].view(), 2, 2, "the shape of wq").unwrap_err(),
            check_length("t", &array![1.0].view(), 3, "3·D·k").unwrap_err(),
            check_nonneg("lambda", -1.0).unwrap_err(),
        ];
        for e in cases {
            let text = e.to_string();
            let converted = AttentionError::from(e.clone());
            assert_eq!(converted.to_string(), text);
            let AttentionError::Input(inner) = &converted else {
                panic!("{e:?} became {converted:?}");
            };
            assert_eq!(format!("{inner:?}"), format!("{e:?}"));
        }
    }
}
