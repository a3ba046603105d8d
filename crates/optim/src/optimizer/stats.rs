//! What each group's update did between two reads ([`Optimizer::take_stats`]).
//!
//! [`Optimizer::take_stats`]: super::Optimizer::take_stats

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::ManifoldStep;

/// What a group's update did since the statistics were last taken. The dual-ascent fields are
/// means over the block updates of manifold Muon (`None` for other updates).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OptimizerStats {
    /// Matrix (or block) updates; for AdamW, parameter updates.
    pub updates: u64,
    /// Seconds spent in the group's step.
    pub seconds: f64,
    /// Of `updates`, those whose msign computed in bf16 (Muon and manifold Muon groups; absent
    /// for AdamW). Under [`Precision::Auto`](crate::Precision::Auto) the working type depends on
    /// the device, the CPU and the matrix's size: this is the record of what a run computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msign_bf16: Option<u64>,
    /// Mean dual-ascent iterations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dual_steps: Option<f64>,
    /// Mean msign calls per update made by the tangent-problem solver (the dual ascent's K, 1
    /// for the square closed form, ADMM's 2 per iteration + 1): neither the retraction nor the
    /// diagnostic ‖G‖_* is counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msign_calls: Option<f64>,
    /// Mean final tangent violation ‖P(WᵀA + AᵀW)‖_F/n.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub violation: Option<f64>,
    /// Largest final tangent violation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub violation_max: Option<f64>,
    /// Mean ⟨G, A⟩/‖G‖_*: the share of the unconstrained (Muon) descent kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descent_ratio: Option<f64>,
    /// Updates whose dual ascent diverged (applied anyway under `OnDivergence::Apply`).
    #[serde(default)]
    pub diverged: u64,
    /// Largest manifold violation after the retraction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifold_violation_max: Option<f64>,
}

/// Sums over block updates since the last report.
#[derive(Debug, Default)]
pub(crate) struct Accumulator {
    pub(crate) updates: u64,
    pub(crate) seconds: f64,
    /// Updates that called msign, and those of them that computed it in bf16.
    msign: u64,
    msign_bf16: u64,
    dual: u64,
    dual_steps: f64,
    msign_calls: f64,
    violation: f64,
    violation_max: f64,
    descent_ratio: f64,
    descent_ratios: u64,
    diverged: u64,
    manifold_violation_max: f64,
}

impl Accumulator {
    /// One matrix (or block) update whose msign computed in `precision` (`"f32"`, `"bf16"`, …).
    pub(crate) fn add_update(&mut self, precision: &str) {
        self.updates += 1;
        self.msign += 1;
        self.msign_bf16 += u64::from(precision == "bf16");
    }

    pub(crate) fn add_manifold(&mut self, step: &ManifoldStep<Tensor>) {
        let d = &step.dual;
        self.add_update(step.precision);
        self.dual += 1;
        self.dual_steps += d.dual_steps as f64;
        self.msign_calls += d.msign_calls as f64;
        self.violation += d.violation;
        self.violation_max = self.violation_max.max(d.violation);
        if let Some(r) = d.descent_ratio {
            self.descent_ratio += r;
            self.descent_ratios += 1;
        }
        self.diverged += u64::from(d.diverged);
        self.manifold_violation_max = self.manifold_violation_max.max(step.manifold_violation);
    }

    /// Adds `other`'s counts and sums and takes the larger maxima (a worker's part of a step).
    pub(crate) fn merge(&mut self, other: &Accumulator) {
        self.updates += other.updates;
        self.seconds += other.seconds;
        self.msign += other.msign;
        self.msign_bf16 += other.msign_bf16;
        self.dual += other.dual;
        self.dual_steps += other.dual_steps;
        self.msign_calls += other.msign_calls;
        self.violation += other.violation;
        self.violation_max = self.violation_max.max(other.violation_max);
        self.descent_ratio += other.descent_ratio;
        self.descent_ratios += other.descent_ratios;
        self.diverged += other.diverged;
        self.manifold_violation_max = self
            .manifold_violation_max
            .max(other.manifold_violation_max);
    }

    /// Adds half of `twice`, the sums of two identical block updates (a block stepped beside a
    /// copy of itself): the counts and sums halved, the maxima as they are.
    #[cfg(feature = "dist")]
    pub(crate) fn add_half_of(&mut self, twice: &Accumulator) {
        self.updates += twice.updates / 2;
        self.msign += twice.msign / 2;
        self.msign_bf16 += twice.msign_bf16 / 2;
        self.dual += twice.dual / 2;
        self.dual_steps += twice.dual_steps / 2.0;
        self.msign_calls += twice.msign_calls / 2.0;
        self.violation += twice.violation / 2.0;
        self.violation_max = self.violation_max.max(twice.violation_max);
        self.descent_ratio += twice.descent_ratio / 2.0;
        self.descent_ratios += twice.descent_ratios / 2;
        self.diverged += twice.diverged / 2;
        self.manifold_violation_max = self
            .manifold_violation_max
            .max(twice.manifold_violation_max);
    }

    /// The number of entries of [`Accumulator::to_row`].
    #[cfg(feature = "dist")]
    pub(crate) const ROW: usize = 12;

    /// Every count, sum and maximum but `seconds`, as f64 (exact for counts below 2⁵³): what
    /// the ranks of a sharded step exchange ([`Accumulator::add_rows`]).
    #[cfg(feature = "dist")]
    pub(crate) fn to_row(&self) -> [f64; Self::ROW] {
        [
            self.updates as f64,
            self.dual as f64,
            self.dual_steps,
            self.msign_calls,
            self.violation,
            self.violation_max,
            self.descent_ratio,
            self.descent_ratios as f64,
            self.diverged as f64,
            self.manifold_violation_max,
            self.msign as f64,
            self.msign_bf16 as f64,
        ]
    }

    /// Adds the ranks' [`Accumulator::to_row`]s: counts and sums summed, maxima taken.
    #[cfg(feature = "dist")]
    pub(crate) fn add_rows<'a>(&mut self, rows: impl IntoIterator<Item = &'a [f64]>) {
        for r in rows {
            self.updates += r[0] as u64;
            self.dual += r[1] as u64;
            self.dual_steps += r[2];
            self.msign_calls += r[3];
            self.violation += r[4];
            self.violation_max = self.violation_max.max(r[5]);
            self.descent_ratio += r[6];
            self.descent_ratios += r[7] as u64;
            self.diverged += r[8] as u64;
            self.manifold_violation_max = self.manifold_violation_max.max(r[9]);
            self.msign += r[10] as u64;
            self.msign_bf16 += r[11] as u64;
        }
    }

    pub(crate) fn finish(self) -> OptimizerStats {
        let per = |x: f64, n: u64| (n > 0).then(|| x / n as f64);
        OptimizerStats {
            updates: self.updates,
            seconds: self.seconds,
            msign_bf16: (self.msign > 0).then_some(self.msign_bf16),
            dual_steps: per(self.dual_steps, self.dual),
            msign_calls: per(self.msign_calls, self.dual),
            violation: per(self.violation, self.dual),
            violation_max: (self.dual > 0).then_some(self.violation_max),
            descent_ratio: per(self.descent_ratio, self.descent_ratios),
            diverged: self.diverged,
            manifold_violation_max: (self.dual > 0).then_some(self.manifold_violation_max),
        }
    }
}
