//! The crate's one error type, and the input checks every public entry point runs first.
//!
//! Every error names the argument it is about (the parameter name as written in the function's
//! signature, or `field.name` for a field of a struct argument), so a message such as
//! ``argument `x` has a non-finite entry NaN at (2, 0)`` points straight at the bad value.

use kappa_linalg::{LinalgError, Real};
use ndarray::{ArrayView1, ArrayView2};

/// Everything that can go wrong in `kappa-attention`.
///
/// Bad input (empty matrices, NaN or ±∞ entries, mismatched shapes, invalid parameters) is always
/// reported through this enum; no public function panics on user input. Errors of the numerical
/// kernel (`kappa-linalg`: LAPACK failures, results too large to form densely) are wrapped in
/// [`AttentionError::Linalg`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AttentionError {
    /// A matrix or vector argument has no entries.
    #[error("argument `{arg}` is empty (shape {rows}×{cols}); a non-empty matrix is required")]
    Empty {
        /// The argument's name.
        arg: &'static str,
        /// Its number of rows (the length, for a vector).
        rows: usize,
        /// Its number of columns (1 for a vector).
        cols: usize,
    },
    /// A matrix or vector argument has a NaN or ±∞ entry.
    #[error("argument `{arg}` has a non-finite entry {value} at ({row}, {col})")]
    NonFinite {
        /// The argument's name.
        arg: &'static str,
        /// Row of the first non-finite entry (the index, for a vector).
        row: usize,
        /// Column of the first non-finite entry (0 for a vector).
        col: usize,
        /// The offending value.
        value: f64,
    },
    /// An argument's shape does not fit the other arguments.
    #[error("argument `{arg}` has shape {found}, expected {expected}")]
    ShapeMismatch {
        /// The argument's name.
        arg: &'static str,
        /// What was expected, in words.
        expected: String,
        /// What was passed, e.g. `"4×5"`.
        found: String,
    },
    /// A scalar or option argument is out of its domain.
    #[error("argument `{arg}` is invalid: {reason}")]
    InvalidArgument {
        /// The argument's name.
        arg: &'static str,
        /// What is wrong with it.
        reason: String,
    },
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

/// Formats a shape as `rows×cols`.
pub(crate) fn shape_str(rows: usize, cols: usize) -> String {
    format!("{rows}×{cols}")
}

/// Checks that a matrix is non-empty and finite.
pub(crate) fn check_matrix<A: Real>(arg: &'static str, a: &ArrayView2<'_, A>) -> Result<()> {
    let (rows, cols) = a.dim();
    if rows == 0 || cols == 0 {
        return Err(AttentionError::Empty { arg, rows, cols });
    }
    if a.iter().all(|x| x.is_finite()) {
        return Ok(());
    }
    let ((row, col), value) = a
        .indexed_iter()
        .find(|(_, x)| !x.is_finite())
        .map(|(ij, x)| (ij, x.to_f64_lossy()))
        .unwrap_or(((0, 0), f64::NAN));
    Err(AttentionError::NonFinite {
        arg,
        row,
        col,
        value,
    })
}

/// Checks that a matrix is non-empty, finite and of the given shape.
pub(crate) fn check_shape<A: Real>(
    arg: &'static str,
    a: &ArrayView2<'_, A>,
    rows: usize,
    cols: usize,
    why: &str,
) -> Result<()> {
    check_matrix(arg, a)?;
    if a.dim() != (rows, cols) {
        return Err(AttentionError::ShapeMismatch {
            arg,
            expected: format!("{} ({why})", shape_str(rows, cols)),
            found: shape_str(a.nrows(), a.ncols()),
        });
    }
    Ok(())
}

/// Checks that a vector is non-empty, finite and of the given length.
pub(crate) fn check_vector<A: Real>(
    arg: &'static str,
    v: &ArrayView1<'_, A>,
    len: usize,
    why: &str,
) -> Result<()> {
    if v.is_empty() {
        return Err(AttentionError::Empty {
            arg,
            rows: 0,
            cols: 1,
        });
    }
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(AttentionError::NonFinite {
            arg,
            row: i,
            col: 0,
            value: v[i].to_f64_lossy(),
        });
    }
    if v.len() != len {
        return Err(AttentionError::ShapeMismatch {
            arg,
            expected: format!("length {len} ({why})"),
            found: format!("length {}", v.len()),
        });
    }
    Ok(())
}

/// Checks that a scalar is finite (and, with `positive`, > 0; otherwise ≥ 0).
pub(crate) fn check_scalar(arg: &'static str, x: f64, positive: bool) -> Result<()> {
    let ok = x.is_finite() && if positive { x > 0.0 } else { x >= 0.0 };
    if ok {
        Ok(())
    } else {
        Err(AttentionError::InvalidArgument {
            arg,
            reason: format!(
                "must be finite and {} 0, found {x}",
                if positive { ">" } else { "≥" }
            ),
        })
    }
}

/// Checks that a computed matrix is finite: [`AttentionError::Overflow`] naming `arg`, with
/// `what` saying which quantity overflowed, otherwise.
pub(crate) fn check_computed<A: Real>(
    arg: &'static str,
    a: &ArrayView2<'_, A>,
    what: &str,
) -> Result<()> {
    if a.iter().all(|x| x.is_finite()) {
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
        Some(((i, j), x)) => Err(AttentionError::InvalidArgument {
            arg,
            reason: format!("an attention matrix has entries in [0, 1], found {x} at ({i}, {j})"),
        }),
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
