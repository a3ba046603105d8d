//! kappa's typed errors as Python exceptions, with kappa's message.
//!
//! Input the caller can fix (shapes, kinds, non-finite entries, settings, names, a damaged state)
//! raises `ValueError`; a file that cannot be read or written raises `OSError`; a computation that
//! fails on valid input (no convergence, a diverged solve, a LAPACK error) raises `RuntimeError`.

use kappa_attention::AttentionError;
use kappa_linalg::LinalgError;
use kappa_models::ModelsError;
use kappa_optim::OptimError;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

/// `result.py()?` turns any kappa error into the Python exception described in the module docs.
pub trait ToPy<T> {
    /// The value, or the error as a Python exception.
    fn py(self) -> Result<T, PyErr>;
}

impl<T, E: Into<Raised>> ToPy<T> for Result<T, E> {
    fn py(self) -> Result<T, PyErr> {
        self.map_err(|e| e.into().0)
    }
}

/// An error already classified as a Python exception.
pub struct Raised(pub PyErr);

fn value(e: impl std::fmt::Display) -> Raised {
    Raised(PyValueError::new_err(e.to_string()))
}

fn runtime(e: impl std::fmt::Display) -> Raised {
    Raised(PyRuntimeError::new_err(e.to_string()))
}

impl From<LinalgError> for Raised {
    fn from(e: LinalgError) -> Self {
        match e {
            LinalgError::Lapack { .. }
            | LinalgError::NoConvergence { .. }
            | LinalgError::Backend { .. } => runtime(e),
            _ => value(e),
        }
    }
}

impl From<OptimError> for Raised {
    fn from(e: OptimError) -> Self {
        match e {
            OptimError::Io { .. } => Raised(PyOSError::new_err(e.to_string())),
            OptimError::Linalg(inner) => inner.into(),
            OptimError::SingularCovariance { .. }
            | OptimError::Diverged { .. }
            | OptimError::NotRetractable { .. }
            | OptimError::DualAscentDiverged { .. } => runtime(e),
            _ => value(e),
        }
    }
}

impl From<AttentionError> for Raised {
    fn from(e: AttentionError) -> Self {
        match e {
            AttentionError::Linalg(inner) => inner.into(),
            AttentionError::Unattainable { .. } => runtime(e),
            _ => value(e),
        }
    }
}

impl From<tch::TchError> for Raised {
    fn from(e: tch::TchError) -> Self {
        runtime(format!("libtorch: {e}"))
    }
}

impl From<serde_json::Error> for Raised {
    fn from(e: serde_json::Error) -> Self {
        value(e)
    }
}

/// A settings error naming the dotted key that failed (`update.muon.momentum.beta: …`).
impl From<serde_path_to_error::Error<serde_json::Error>> for Raised {
    fn from(e: serde_path_to_error::Error<serde_json::Error>) -> Self {
        value(format!("{}: {}", e.path(), e.inner()))
    }
}

impl From<ModelsError> for Raised {
    fn from(e: ModelsError) -> Self {
        match e {
            ModelsError::Io { .. } => Raised(PyOSError::new_err(e.to_string())),
            ModelsError::InvalidConfig { .. } | ModelsError::Shape { .. } => value(e),
            _ => runtime(e),
        }
    }
}
