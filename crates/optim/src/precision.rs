//! The working precision of the orthogonalization (msign), chosen per backend and device.
//!
//! Muon's reference (and `torch.optim.Muon`) casts every update to bf16 before Newton–Schulz. That
//! is right on GPUs with bf16 matrix units and very slow on CPUs without them, where libtorch
//! emulates bf16 products (measured on this project's CPU: ≈ 0.74 s for one `torch.optim.Muon`
//! step at 384×384 against ≈ 0.04 s for an f32 quintic iteration). kappa therefore picks the
//! precision per device ([`Precision::Auto`]): bf16 on CUDA, the parameter's own type otherwise
//! (f32 for f32 and bf16 parameters on CPU, f64 stays f64).
//!
//! Accuracy cost (measured by the tests): an f32 msign agrees with the f64 one to ≈ 1e-5
//! entrywise; a bf16 msign carries 8 mantissa bits, so the singular values of a bf16 Polar
//! Express output lie in ≈ [0.995, 1.002] (paper notes §3.3) and a Stiefel retraction holds
//! WᵀW = I only to ≈ 1e-2 — which is what the paper's runs had. Only the msign calls change
//! precision: momentum, the dual variable, products with W and the update itself stay in the
//! parameter's type.

use kappa_linalg::Matrix;
use serde::{Deserialize, Serialize};

use crate::error::{OptimError, Result};

/// Where msign (Newton–Schulz, Polar Express or the SVD) computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// bf16 on CUDA tensors (native bf16 matrix units); otherwise the parameter's own type,
    /// except that bf16 on CPU computes in f32 (bf16 is emulated there, and slower than f32).
    #[default]
    Auto,
    /// Always the parameter's own type.
    Native,
    /// f32 (on `ndarray` only for `Array2<f32>`).
    F32,
    /// bf16 (`tch` only), as the paper's and Muon's reference code do.
    Bf16,
}

/// The element-type conversions the optimizers need around msign. Implemented for
/// `ndarray::Array2<f32 | f64>` (which computes in its own type only) and, with the `tch`
/// feature, for `tch::Tensor`.
pub trait WorkingPrecision: Matrix {
    /// A copy of `self` converted to the precision `p` resolves to, or `None` when `self` is
    /// already in it. Errors: a precision the backend cannot compute in
    /// ([`OptimError::InvalidArgument`], argument `precision`).
    fn to_working(&self, p: Precision) -> Result<Option<Self>>;

    /// `self` converted to `like`'s element type (the inverse of [`to_working`](Self::to_working)).
    fn to_kind_of(&self, like: &Self) -> Result<Self>;

    /// The name of the element type `p` resolves to for this matrix (`"f32"`, `"bf16"`, `"f64"`).
    fn working_name(&self, p: Precision) -> Result<&'static str>;
}

impl<A: kappa_linalg::Real> WorkingPrecision for ndarray::Array2<A> {
    fn to_working(&self, p: Precision) -> Result<Option<Self>> {
        self.working_name(p).map(|_| None)
    }

    fn to_kind_of(&self, _like: &Self) -> Result<Self> {
        Ok(self.duplicate()?)
    }

    fn working_name(&self, p: Precision) -> Result<&'static str> {
        match p {
            Precision::Auto | Precision::Native => Ok(A::NAME),
            Precision::F32 if A::NAME == "f32" => Ok(A::NAME),
            other => Err(OptimError::InvalidArgument {
                arg: "precision",
                reason: format!(
                    "ndarray matrices compute in their own element type ({}); {other:?} needs \
                     the tch backend (or an Array2 of that type)",
                    A::NAME
                ),
            }),
        }
    }
}

#[cfg(feature = "tch")]
mod tch_impl {
    use super::*;
    use tch::{Kind, Tensor};

    fn kind_name(k: Kind) -> &'static str {
        match k {
            Kind::Float => "f32",
            Kind::BFloat16 => "bf16",
            Kind::Double => "f64",
            _ => "unsupported",
        }
    }

    fn resolve(t: &Tensor, p: Precision) -> Kind {
        let kind = t.kind();
        match p {
            Precision::Native => kind,
            Precision::F32 => Kind::Float,
            Precision::Bf16 => Kind::BFloat16,
            Precision::Auto => match (kind, t.device().is_cuda()) {
                (Kind::Double, _) => Kind::Double,
                (_, true) => Kind::BFloat16,
                (_, false) => Kind::Float,
            },
        }
    }

    fn backend(e: tch::TchError) -> OptimError {
        OptimError::Linalg(kappa_linalg::LinalgError::Backend {
            arg: "precision",
            message: e.to_string().lines().next().unwrap_or_default().to_string(),
        })
    }

    impl WorkingPrecision for Tensor {
        fn to_working(&self, p: Precision) -> Result<Option<Self>> {
            let k = resolve(self, p);
            if k == self.kind() {
                return Ok(None);
            }
            let _g = tch::no_grad_guard();
            self.f_to_kind(k).map(Some).map_err(backend)
        }

        fn to_kind_of(&self, like: &Self) -> Result<Self> {
            let _g = tch::no_grad_guard();
            self.f_to_kind(like.kind()).map_err(backend)
        }

        fn working_name(&self, p: Precision) -> Result<&'static str> {
            Ok(kind_name(resolve(self, p)))
        }
    }
}
