//! The input checks of the workspace, written once: empty, non-finite and mis-shaped matrices
//! and vectors, and scalars out of their domain, reported as an [`InputError`].
//!
//! Every crate's error type carries these four cases in one variant, `Input(InputError)`, with
//! the same messages (`#[error(transparent)]`): [`LinalgError::Input`](crate::LinalgError::Input)
//! here, `AttentionError::Input` and `OptimError::Input` in kappa-attention and kappa-optim. Each
//! converts an [`InputError`] into it with `From`, so an entry point writes
//! `check_matrix("x", &x)?` (or `return Err(InputError::invalid("k", "must be ≥ 1").into())`) and
//! returns its own error type. `arg` is the caller's parameter as written in its signature (or
//! `field.name` for a field of a struct argument).
//!
//! A caller matches the input error inside its crate's error:
//!
//! ```
//! use kappa_linalg::input::{check_matrix, check_shape, InputError};
//! let x = ndarray::array![[1.0, f64::NAN]];
//! let e = check_matrix("x", &x.view()).unwrap_err();
//! assert_eq!(e.to_string(), "argument `x` has a non-finite entry NaN at (0, 1)");
//! let w = ndarray::Array2::<f64>::zeros((2, 3));
//! assert!(matches!(
//!     check_shape("w", &w.view(), 3, 3, "D×D"),
//!     Err(InputError::ShapeMismatch { arg: "w", .. })
//! ));
//! let e = kappa_linalg::LinalgError::from(check_matrix("x", &x.view()).unwrap_err());
//! assert!(matches!(
//!     e,
//!     kappa_linalg::LinalgError::Input(InputError::NonFinite { arg: "x", row: 0, col: 1, .. })
//! ));
//! ```

use ndarray::{ArrayView1, ArrayView2};

use crate::scalar::Real;

/// Bad input: what [`check_matrix`] and the other checks of this module report.
///
/// The crates' errors wrap it whole, unchanged and with the same message:
/// [`LinalgError::Input`](crate::LinalgError::Input), `AttentionError::Input`,
/// `OptimError::Input`. [`InputError::invalid`] and [`InputError::shape_mismatch`] build the two
/// cases a caller's own checks report most.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
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
        /// The offending value (NaN, inf or -inf).
        value: f64,
    },
    /// An argument's shape does not fit the other arguments.
    #[error("argument `{arg}` has shape {found}, expected {expected}")]
    ShapeMismatch {
        /// The argument's name.
        arg: &'static str,
        /// What was expected, in words (e.g. `"3×3 (the shape of wq)"`).
        expected: String,
        /// The shape that was passed, e.g. `"4×5"`.
        found: String,
    },
    /// A scalar argument is out of its domain.
    #[error("argument `{arg}` is invalid: {reason}")]
    InvalidArgument {
        /// The argument's name.
        arg: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl InputError {
    /// An [`InputError::InvalidArgument`]: `arg` is out of its domain, `reason` says how
    /// (the message reads ``argument `{arg}` is invalid: {reason}``).
    pub fn invalid(arg: &'static str, reason: impl Into<String>) -> Self {
        InputError::InvalidArgument {
            arg,
            reason: reason.into(),
        }
    }

    /// An [`InputError::ShapeMismatch`]: `arg` has the shape `found` (e.g. `"4×5"`, see
    /// [`shape_str`]) where `expected` was wanted, in words
    /// (the message reads ``argument `{arg}` has shape {found}, expected {expected}``).
    pub fn shape_mismatch(
        arg: &'static str,
        expected: impl Into<String>,
        found: impl Into<String>,
    ) -> Self {
        InputError::ShapeMismatch {
            arg,
            expected: expected.into(),
            found: found.into(),
        }
    }

    /// The argument the error is about.
    pub fn arg(&self) -> &'static str {
        match self {
            InputError::Empty { arg, .. }
            | InputError::NonFinite { arg, .. }
            | InputError::ShapeMismatch { arg, .. }
            | InputError::InvalidArgument { arg, .. } => arg,
        }
    }

    /// The argument's name, to rename it (see `error::rename`).
    pub(crate) fn arg_mut(&mut self) -> &mut &'static str {
        match self {
            InputError::Empty { arg, .. }
            | InputError::NonFinite { arg, .. }
            | InputError::ShapeMismatch { arg, .. }
            | InputError::InvalidArgument { arg, .. } => arg,
        }
    }
}

/// Formats a shape as `rows×cols`.
pub fn shape_str(rows: usize, cols: usize) -> String {
    format!("{rows}×{cols}")
}

/// Checks that every entry of a matrix is finite (an empty matrix passes).
pub fn check_finite<A: Real>(arg: &'static str, a: &ArrayView2<'_, A>) -> Result<(), InputError> {
    if all_finite(a) {
        return Ok(());
    }
    let ((row, col), value) = a
        .indexed_iter()
        .find(|(_, x)| !x.is_finite())
        .map(|(ij, x)| (ij, x.to_f64_lossy()))
        .unwrap_or(((0, 0), f64::NAN));
    Err(InputError::NonFinite {
        arg,
        row,
        col,
        value,
    })
}

/// Whether every entry of `a` is finite. Over a contiguous array the test runs on the vector
/// units: 0·x is ±0 for finite x and NaN otherwise, summed in eight independent lanes (a sum
/// of zeros stays zero; one NaN makes it NaN), with no early exit.
///
/// ```
/// use kappa_linalg::input::all_finite;
/// let mut a = ndarray::Array2::<f64>::ones((3, 5));
/// assert!(all_finite(&a.view()));
/// a[[2, 4]] = f64::INFINITY;
/// assert!(!all_finite(&a.view()));
/// ```
pub fn all_finite<A: Real>(a: &ArrayView2<'_, A>) -> bool {
    let Some(x) = a.as_slice_memory_order() else {
        return a.iter().all(|x| x.is_finite());
    };
    let zero = A::zero();
    crate::scalar::fold_in_lanes(x, zero, |acc, v| acc + v * zero, |acc, l| acc + l) == zero
}

/// Checks that a matrix is non-empty and finite.
pub fn check_matrix<A: Real>(arg: &'static str, a: &ArrayView2<'_, A>) -> Result<(), InputError> {
    let (rows, cols) = a.dim();
    if rows == 0 || cols == 0 {
        return Err(InputError::Empty { arg, rows, cols });
    }
    check_finite(arg, a)
}

/// Checks that a matrix is `rows`×`cols` (`why` says why, for the message); its entries are not
/// looked at.
pub fn check_dims<A>(
    arg: &'static str,
    a: &ArrayView2<'_, A>,
    rows: usize,
    cols: usize,
    why: &str,
) -> Result<(), InputError> {
    if a.dim() == (rows, cols) {
        return Ok(());
    }
    Err(InputError::shape_mismatch(
        arg,
        format!("{} ({why})", shape_str(rows, cols)),
        shape_str(a.nrows(), a.ncols()),
    ))
}

/// Checks that a matrix is non-empty, finite and `rows`×`cols`, in that order
/// ([`check_matrix`], then [`check_dims`]).
pub fn check_shape<A: Real>(
    arg: &'static str,
    a: &ArrayView2<'_, A>,
    rows: usize,
    cols: usize,
    why: &str,
) -> Result<(), InputError> {
    check_matrix(arg, a)?;
    check_dims(arg, a, rows, cols, why)
}

/// Checks that a vector is non-empty and finite.
pub fn check_vector<A: Real>(arg: &'static str, v: &ArrayView1<'_, A>) -> Result<(), InputError> {
    if v.is_empty() {
        return Err(InputError::Empty {
            arg,
            rows: 0,
            cols: 1,
        });
    }
    match v.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(InputError::NonFinite {
            arg,
            row: i,
            col: 0,
            value: v[i].to_f64_lossy(),
        }),
    }
}

/// Checks that a vector is non-empty, finite and of length `len`, in that order.
pub fn check_length<A: Real>(
    arg: &'static str,
    v: &ArrayView1<'_, A>,
    len: usize,
    why: &str,
) -> Result<(), InputError> {
    check_vector(arg, v)?;
    if v.len() == len {
        return Ok(());
    }
    Err(InputError::shape_mismatch(
        arg,
        format!("length {len} ({why})"),
        format!("length {}", v.len()),
    ))
}

/// Checks that a scalar is finite and ≥ 0.
pub fn check_nonneg(arg: &'static str, x: f64) -> Result<(), InputError> {
    if x.is_finite() && x >= 0.0 {
        return Ok(());
    }
    Err(out_of_domain(arg, x, "≥ 0"))
}

/// Checks that a scalar is finite and > 0.
pub fn check_positive(arg: &'static str, x: f64) -> Result<(), InputError> {
    if x.is_finite() && x > 0.0 {
        return Ok(());
    }
    Err(out_of_domain(arg, x, "> 0"))
}

/// Checks that a scalar is finite and in `[lo, hi]`.
pub fn check_range(arg: &'static str, x: f64, lo: f64, hi: f64) -> Result<(), InputError> {
    if x.is_finite() && x >= lo && x <= hi {
        return Ok(());
    }
    Err(out_of_domain(arg, x, &format!("in [{lo}, {hi}]")))
}

/// "must be finite and {domain}, found {x}".
fn out_of_domain(arg: &'static str, x: f64, domain: &str) -> InputError {
    InputError::invalid(arg, format!("must be finite and {domain}, found {x}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, Array2};

    #[test]
    fn all_finite_finds_every_non_finite_entry() {
        // Every position of a 7×9 matrix (lanes and tail of the fast path), each kind of
        // non-finite value, contiguous and strided (the element-wise path).
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            for at in 0..63 {
                let mut a = Array2::<f64>::from_elem((7, 9), f64::MAX);
                a[[at / 9, at % 9]] = bad;
                assert!(!all_finite(&a.view()), "{bad} at {at}");
                assert!(!all_finite(&a.t()), "{bad} at {at}, transposed");
                let strided = a.slice(ndarray::s![.., ..;2]);
                assert_eq!(
                    all_finite(&strided),
                    at % 9 % 2 == 1,
                    "{bad} at {at}, strided"
                );
            }
        }
        let ok = Array2::<f32>::from_elem((3, 11), -f32::MAX);
        assert!(all_finite(&ok.view()));
    }

    #[test]
    fn checks_name_the_argument_and_the_entry() {
        let a = array![[1.0, 2.0], [f64::NEG_INFINITY, 0.0]];
        let e = check_matrix("w", &a.view()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "argument `w` has a non-finite entry -inf at (1, 0)"
        );
        let z = Array2::<f32>::zeros((0, 2));
        assert_eq!(
            check_matrix("w", &z.view()),
            Err(InputError::Empty {
                arg: "w",
                rows: 0,
                cols: 2
            })
        );
        assert!(check_finite("w", &z.view()).is_ok());
        let v = array![1.0f32, f32::NAN];
        assert!(matches!(
            check_vector("v", &v.view()),
            Err(InputError::NonFinite {
                arg: "v",
                row: 1,
                ..
            })
        ));
        assert_eq!(
            check_length("t", &array![1.0, 2.0].view(), 3, "3·D·k")
                .unwrap_err()
                .to_string(),
            "argument `t` has shape length 2, expected length 3 (3·D·k)"
        );
    }

    #[test]
    fn shapes_are_checked_after_the_entries_by_check_shape_only() {
        let nan = array![[f64::NAN, 0.0]];
        assert!(matches!(
            check_shape("x", &nan.view(), 2, 2, "D×D"),
            Err(InputError::NonFinite { .. })
        ));
        assert_eq!(
            check_dims("x", &nan.view(), 2, 2, "D×D")
                .unwrap_err()
                .to_string(),
            "argument `x` has shape 1×2, expected 2×2 (D×D)"
        );
        assert!(check_dims("x", &nan.view(), 1, 2, "").is_ok());
    }

    #[test]
    fn constructors_build_the_variant_and_arg_names_it() {
        let e = InputError::invalid("k", "must be ≥ 1");
        assert_eq!(
            e,
            InputError::InvalidArgument {
                arg: "k",
                reason: "must be ≥ 1".into()
            }
        );
        assert_eq!(e.to_string(), "argument `k` is invalid: must be ≥ 1");
        let e = InputError::shape_mismatch("b", "2×2 (d×d)", shape_str(1, 2));
        assert_eq!(
            e,
            InputError::ShapeMismatch {
                arg: "b",
                expected: "2×2 (d×d)".into(),
                found: "1×2".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "argument `b` has shape 1×2, expected 2×2 (d×d)"
        );
        assert_eq!(e.arg(), "b");
        let nan = check_matrix("w", &array![[f64::NAN]].view()).unwrap_err();
        assert_eq!(nan.arg(), "w");
        let empty = check_vector("v", &ndarray::Array1::<f64>::zeros(0).view()).unwrap_err();
        assert_eq!(empty.arg(), "v");
    }

    #[test]
    fn scalar_domains_and_their_messages() {
        assert!(check_nonneg("tol", -0.0).is_ok());
        assert!(check_nonneg("tol", f64::NAN).is_err());
        assert_eq!(
            check_positive("scale", 0.0).unwrap_err().to_string(),
            "argument `scale` is invalid: must be finite and > 0, found 0"
        );
        assert_eq!(
            check_nonneg("lambda", -1.0).unwrap_err().to_string(),
            "argument `lambda` is invalid: must be finite and ≥ 0, found -1"
        );
        assert_eq!(
            check_range("lr", 2.0, 0.0, 1.0).unwrap_err().to_string(),
            "argument `lr` is invalid: must be finite and in [0, 1], found 2"
        );
        assert!(check_range("lr", f64::INFINITY, 0.0, f64::INFINITY).is_err());
    }
}
