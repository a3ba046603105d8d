//! NorMuon (Li et al., 2025): Muon's orthogonalized update with a per-neuron second moment, so
//! that every neuron (row or column of the weight) moves at the same RMS, then rescaled to the
//! Frobenius norm Muon's update had.
//!
//! # Math
//!
//! For O = msign(U) ∈ ℝ^{m×n} (the update Muon would apply) and the neurons indexed by
//! i (the rows of O, or its columns, see [`NeuronAxis`]), with d the length of a neuron:
//!
//! 1. q_i = (1/d)·Σ_j O_ij², the mean square of neuron i;
//! 2. v_i ← β₂·v_i + (1 − β₂)·q_i (v = 0 before the first step, as `lerp` from zeros);
//! 3. Ô_ij = O_ij / (√v_i + ε), ε = [`NORMUON_EPS`] = 1e-10;
//! 4. the step uses Ô·‖O‖_F/‖Ô‖_F (Ô = 0 stays 0).
//!
//! Step 4 keeps the update's Frobenius norm, so the learning rate and the shape factor mean what
//! they mean for Muon; v has no bias correction because step 4 removes every common factor. At
//! the first step √v_i = √(1 − β₂)·√q_i, so every neuron of Ô has the same norm, and after step 4
//! each one's norm is ‖O‖_F/√k, k the number of neurons (tested). ε only matters
//! for a neuron whose whole history is zero (it then stays zero).
//!
//! The normalization runs in the parameter's type on the update msign returned; the second
//! moment is kept as one `f64` per neuron ([`MuonState::second_moment`](crate::MuonState)).

use serde::{Deserialize, Serialize};

use crate::elementwise::Elementwise;
use crate::error::{check_range, Result};
use crate::layout::Layout;

/// The ε added to √v in NorMuon's division (the reference implementation's value).
pub const NORMUON_EPS: f64 = 1e-10;

/// Which axis holds the neurons NorMuon normalizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NeuronAxis {
    /// The output neurons: rows for [`Layout::OutIn`], columns for [`Layout::InOut`] (the NorMuon
    /// paper's implementation).
    #[default]
    Outputs,
    /// The longer side: one value per row of a tall (or square) matrix, per column of a wide one
    /// (modded-nanogpt's and nanochat's form).
    LongSide,
}

impl NeuronAxis {
    /// Whether the neurons of an m×n matrix stored in `layout` are its rows.
    pub fn along_rows(&self, rows: usize, cols: usize, layout: Layout) -> bool {
        match self {
            NeuronAxis::Outputs => layout == Layout::OutIn,
            NeuronAxis::LongSide => rows >= cols,
        }
    }
}

/// NorMuon's settings (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NorMuon {
    /// The EMA factor β₂ ∈ [0, 1) of the per-neuron second moment (the paper: 0.95).
    pub beta2: f64,
    /// Which axis holds the neurons.
    #[serde(default)]
    pub axis: NeuronAxis,
}

impl Default for NorMuon {
    /// The paper's β₂ = 0.95 on the output neurons.
    fn default() -> Self {
        Self {
            beta2: 0.95,
            axis: NeuronAxis::Outputs,
        }
    }
}

impl NorMuon {
    /// Checks β₂ ∈ [0, 1).
    pub fn validate(&self) -> Result<()> {
        check_range("normuon.beta2", self.beta2, 0.0, 1.0)?;
        if self.beta2 >= 1.0 {
            return Err(kappa_linalg::InputError::invalid("normuon.beta2", "must be < 1").into());
        }
        Ok(())
    }

    /// Normalizes `o` in place (steps 1–4 of the module docs) and advances the second moment
    /// `second` (`None` before the first step; then one value per neuron).
    ///
    /// Errors: a `second` of the wrong length (a state from another parameter), backend failures.
    pub fn apply<M: Elementwise>(
        &self,
        o: &mut M,
        second: &mut Option<Vec<f64>>,
        layout: Layout,
    ) -> Result<()> {
        let (m, n) = o.shape();
        if self.axis.along_rows(m, n, layout) {
            self.apply_rows(o, second)
        } else {
            let mut t = o.duplicate()?.into_transpose();
            self.apply_rows(&mut t, second)?;
            o.copy_from(&t.into_transpose())?;
            Ok(())
        }
    }

    /// [`NorMuon::apply`] with the neurons on the rows of `o`.
    fn apply_rows<M: Elementwise>(&self, o: &mut M, second: &mut Option<Vec<f64>>) -> Result<()> {
        let q = o.row_mean_squares()?;
        let v = match second.take() {
            None => q.iter().map(|q| (1.0 - self.beta2) * q).collect::<Vec<_>>(),
            Some(v) if v.len() == q.len() => v
                .iter()
                .zip(&q)
                .map(|(v, q)| self.beta2 * v + (1.0 - self.beta2) * q)
                .collect(),
            Some(v) => {
                let e = kappa_linalg::InputError::shape_mismatch(
                    "state",
                    format!(
                        "a NorMuon second moment of {} values (one per neuron)",
                        q.len()
                    ),
                    format!(
                        "{} values (this state belongs to another parameter)",
                        v.len()
                    ),
                );
                *second = Some(v);
                return Err(e.into());
            }
        };
        let before = o.frobenius_norm()?;
        let factors: Vec<f64> = v.iter().map(|v| 1.0 / (v.sqrt() + NORMUON_EPS)).collect();
        o.scale_rows(&factors)?;
        let after = o.frobenius_norm()?;
        if after > 0.0 {
            o.scale(before / after)?;
        }
        *second = Some(v);
        Ok(())
    }
}
