//! What the diagnostics compute at every evaluation ([`DiagnosticsConfig`]), in a module of its
//! own: model configs size their memory with it, and the diagnostics themselves use the models.

use serde::{Deserialize, Serialize};

use crate::error::{ModelsError, Result};

/// What to compute at every evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiagnosticsConfig {
    /// Compute diagnostics at all.
    pub enabled: bool,
    /// Sequences of the fixed batch used for the attention statistics.
    pub samples: usize,
    /// Largest N for the exact Jacobian κ (0 turns it off). Its cost is one SVD of an
    /// Nk × 3Dk matrix per head.
    pub jacobian_max_tokens: usize,
}

impl DiagnosticsConfig {
    /// Checks the keys; errors name them under `field` (`train.diagnostics.samples`). The
    /// sizes have no fixed maximum: `samples` is bounded by the validation split and both by
    /// the memory they take (`StepSize::bytes` in [`crate::layers`]), where the data and the
    /// model are known.
    pub fn validate(&self, field: &str) -> Result<()> {
        if self.enabled && self.samples == 0 {
            return Err(ModelsError::config(
                format!("{field}.samples"),
                "must be ≥ 1 when the diagnostics are enabled",
            ));
        }
        Ok(())
    }

    /// The sequences of the fixed batch that are diagnosed: `samples` (at least 1) when
    /// enabled, none otherwise.
    pub fn diagnosed_samples(&self) -> usize {
        if self.enabled {
            self.samples.max(1)
        } else {
            0
        }
    }

    /// The tokens N of the exact Jacobian for sequences of `t` tokens: all of them when
    /// t ≤ `jacobian_max_tokens`, the first `jacobian_max_tokens` of a causal sequence (exact:
    /// a causal prefix does not see later tokens), none (0) otherwise.
    pub fn jacobian_tokens(&self, t: usize, causal: bool) -> usize {
        let max = self.jacobian_max_tokens;
        match () {
            _ if max == 0 => 0,
            _ if t <= max => t,
            _ if causal => max,
            _ => 0,
        }
    }
}

impl Default for DiagnosticsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            samples: 4,
            jacobian_max_tokens: 32,
        }
    }
}
