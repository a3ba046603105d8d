//! The entrywise and row-wise operations of Muon's variants, on both backends: the row mean
//! squares and row scaling of NorMuon ([`crate::NorMuon`]), the sign-masked decay of cautious
//! weight decay ([`crate::MuonConfig::cautious_weight_decay`]), and momentum's recursion in one
//! pass where a backend has it ([`crate::Momentum`]; CPU f32 tensors, `crate::fused`).
//!
//! They are a supertrait of [`WorkingPrecision`](crate::WorkingPrecision), so every matrix Muon
//! steps has them: `ndarray::Array2<f32 | f64>` (loops in f64, one rounding per stored entry)
//! and, with the `tch` feature, `tch::Tensor` (whole-tensor operations on the tensor's device).
//! Row vectors cross to the host as `f64` (one value per row), as the `Matrix` trait's
//! `diagonal` and `scale_columns` do.

use kappa_linalg::Matrix;

use crate::error::Result;

/// Row-wise and masked entrywise operations (module docs).
pub trait Elementwise: Matrix {
    /// (1/n)·Σ_j x_ij² for every row i of the m×n matrix, as `f64`.
    fn row_mean_squares(&self) -> Result<Vec<f64>>;

    /// Scales row i by `s[i]` in place (X ← diag(s)·X); `s` must have one entry per row.
    fn scale_rows(&mut self, s: &[f64]) -> Result<()>;

    /// Multiplies, in place, every entry w_ij with w_ij·u_ij ≥ 0 by `factor` and leaves the
    /// others: W ← W ⊙ (1 − (1 − factor)·𝟙[W ⊙ U ≥ 0]). `update` must have `self`'s shape.
    fn masked_decay(&mut self, update: &Self, factor: f64) -> Result<()>;

    /// Momentum's recursion ([`crate::Momentum`]) with gradient `self`, `buffer` (`None`: zero
    /// before the first step), the gradient's weight w_g, β and Nesterov's flag, in one pass over
    /// the entries: `Some((B ← w_g·g + β·B, U = w_g·g + β·B_new or None))` where this backend has
    /// such a pass for these operands; `None` (the default) where it does not, or where
    /// `buffer`'s shape is not `self`'s, and the caller computes it operation by operation (whose
    /// checks report bad input). Non-finite entries propagate; nothing panics.
    fn momentum_in_one_pass(
        &self,
        buffer: Option<&Self>,
        grad_weight: f64,
        beta: f64,
        nesterov: bool,
    ) -> Option<(Self, Option<Self>)> {
        let _ = (buffer, grad_weight, beta, nesterov);
        None
    }
}

/// Checks that `s` has one entry per row of an m-row matrix.
fn check_rows(m: usize, s: &[f64]) -> Result<()> {
    if s.len() != m {
        return Err(kappa_linalg::InputError::shape_mismatch(
            "s",
            format!("{m} factors (one per row)"),
            format!("{}", s.len()),
        )
        .into());
    }
    Ok(())
}

fn check_same_shape<M: Matrix>(w: &M, u: &M) -> Result<()> {
    if w.shape() != u.shape() {
        let (a, b) = (w.shape(), u.shape());
        return Err(kappa_linalg::InputError::shape_mismatch(
            "update",
            format!("{}×{} (the shape of the weight)", a.0, a.1),
            format!("{}×{}", b.0, b.1),
        )
        .into());
    }
    Ok(())
}

impl<A: kappa_linalg::Real> Elementwise for ndarray::Array2<A> {
    fn row_mean_squares(&self) -> Result<Vec<f64>> {
        let n = self.ncols().max(1) as f64;
        Ok(self
            .rows()
            .into_iter()
            .map(|r| {
                r.iter()
                    .map(|&x| x.to_f64_lossy() * x.to_f64_lossy())
                    .sum::<f64>()
                    / n
            })
            .collect())
    }

    fn scale_rows(&mut self, s: &[f64]) -> Result<()> {
        check_rows(self.nrows(), s)?;
        for (mut row, &f) in self.rows_mut().into_iter().zip(s) {
            row.mapv_inplace(|x| A::from_f64_lossy(x.to_f64_lossy() * f));
        }
        Ok(())
    }

    fn masked_decay(&mut self, update: &Self, factor: f64) -> Result<()> {
        check_same_shape(self, update)?;
        ndarray::Zip::from(self).and(update).for_each(|w, &u| {
            if w.to_f64_lossy() * u.to_f64_lossy() >= 0.0 {
                *w = A::from_f64_lossy(w.to_f64_lossy() * factor);
            }
        });
        Ok(())
    }
}

#[cfg(feature = "tch")]
mod tch_impl {
    use super::*;
    use crate::error::libtorch;
    use tch::{Device, Kind, Tensor};

    impl Elementwise for Tensor {
        fn row_mean_squares(&self) -> Result<Vec<f64>> {
            let _g = tch::no_grad_guard();
            let ms = self
                .f_to_kind(Kind::Double)
                .and_then(|x| x.f_square())
                .and_then(|x| x.f_mean_dim(1, false, Kind::Double))
                .and_then(|x| x.f_to_device(Device::Cpu))
                .map_err(libtorch("self"))?;
            Vec::<f64>::try_from(&ms).map_err(libtorch("self"))
        }

        fn scale_rows(&mut self, s: &[f64]) -> Result<()> {
            check_rows(self.shape().0, s)?;
            let _g = tch::no_grad_guard();
            let f = Tensor::from_slice(s)
                .f_to_kind(self.kind())
                .and_then(|x| x.f_to_device(self.device()))
                .and_then(|x| x.f_view([s.len() as i64, 1]))
                .map_err(libtorch("s"))?;
            let _ = self.f_mul_(&f).map_err(libtorch("s"))?;
            Ok(())
        }

        fn masked_decay(&mut self, update: &Self, factor: f64) -> Result<()> {
            check_same_shape(self, update)?;
            let _g = tch::no_grad_guard();
            // f = 1 − (1 − factor)·𝟙[w·u ≥ 0], in the weight's type.
            let f = self
                .f_mul(update)
                .and_then(|p| p.f_ge(0.0))
                .and_then(|m| m.f_to_kind(self.kind()))
                .and_then(|m| m.f_mul_scalar(factor - 1.0))
                .and_then(|m| m.f_add_scalar(1.0))
                .map_err(libtorch("update"))?;
            let _ = self.f_mul_(&f).map_err(libtorch("update"))?;
            Ok(())
        }

        fn momentum_in_one_pass(
            &self,
            buffer: Option<&Self>,
            grad_weight: f64,
            beta: f64,
            nesterov: bool,
        ) -> Option<(Self, Option<Self>)> {
            crate::fused::momentum(self, buffer, grad_weight, beta, nesterov)
        }
    }
}
