//! Muon: momentum, then msign of the momentum, then a scaled, decoupled-weight-decay step, updating
//! the parameter in place on any [`WorkingPrecision`] backend (`ndarray` or `tch`).
//!
//! # Math
//!
//! For a weight W ∈ ℝ^{m×n} with gradient g, one step is
//!
//! 1. U from the momentum recursion ([`Momentum`]: EMA or SGD form, optionally Nesterov);
//! 2. O = msign(U) ([`Msign`]: exact, Muon's quintic, or Polar Express);
//! 3. W ← (1 − lr·λ)·W − lr·s·O, with decoupled weight decay λ and the shape factor s
//!    ([`UpdateScale`]).
//!
//! An orthogonalized m×n matrix has ‖O‖₂ = 1 and ‖O‖_F = sqrt(min(m, n)), so with s = 1 the
//! spectral norm of the step is lr (exactly for `Exact`/Polar Express, within the band
//! [0.6818, 1.1344] for the quintic) and its RMS is lr/sqrt(max(m, n)).
//!
//! | [`UpdateScale`] | s | RMS of the step |
//! |---|---|---|
//! | `None` (the paper's code) | 1 | lr/sqrt(max(m,n)) |
//! | `Original` (Keller, `torch.optim.Muon` default) | sqrt(max(1, fan_out/fan_in)) | lr·s/sqrt(max(m,n)) |
//! | `MatchRmsAdamw` (Moonlight) | 0.2·sqrt(max(m, n)) | 0.2·lr, a typical AdamW update RMS |
//!
//! # Layout (which axis is fan-in)
//!
//! `tch::nn::Linear` and `torch.nn.Linear` store weights as (out, in) ([`Layout::OutIn`], the
//! default); code that computes x·W stores (in, out) ([`Layout::InOut`]). `Original` uses
//! fan_out/fan_in, so the layout decides the factor for tall and wide matrices; the torch
//! reference hard-codes rows/cols = (out, in).

use kappa_linalg::input::InputError;
use kappa_linalg::Matrix;
use serde::{Deserialize, Serialize};

use crate::error::{check_range, from_linalg, Result};
use crate::momentum::{Momentum, MomentumState};
use crate::msign::{msign, Msign};
use crate::precision::{Precision, WorkingPrecision};

/// How the weight matrix is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// Rows are outputs, columns inputs: `nn.Linear`'s (out, in), y = W·x.
    #[default]
    OutIn,
    /// Rows are inputs, columns outputs: (in, out), y = x·W.
    InOut,
}

impl Layout {
    /// (fan_out, fan_in) of an m×n matrix stored in this layout.
    pub fn fans(&self, rows: usize, cols: usize) -> (usize, usize) {
        match self {
            Layout::OutIn => (rows, cols),
            Layout::InOut => (cols, rows),
        }
    }
}

/// The multiplier on the learning rate (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateScale {
    /// s = 1: the spectral norm of the step is lr (the paper's code).
    None,
    /// s = sqrt(max(1, fan_out/fan_in)) (Keller Jordan; `adjust_lr_fn="original"`).
    Original,
    /// s = 0.2·sqrt(max(m, n)) (Moonlight; `adjust_lr_fn="match_rms_adamw"`).
    MatchRmsAdamw,
}

impl UpdateScale {
    /// The factor s for an m×n matrix stored in `layout` (finite for every m, n; 1 for
    /// `Original` when fan_in = 0).
    pub fn factor(&self, rows: usize, cols: usize, layout: Layout) -> f64 {
        let (fan_out, fan_in) = layout.fans(rows, cols);
        match self {
            UpdateScale::None => 1.0,
            // fan_in = 0 (an empty matrix, which no step accepts): 1, not +∞.
            UpdateScale::Original if fan_in == 0 => 1.0,
            UpdateScale::Original => (fan_out as f64 / fan_in as f64).max(1.0).sqrt(),
            UpdateScale::MatchRmsAdamw => 0.2 * (rows.max(cols) as f64).sqrt(),
        }
    }
}

/// Muon's settings. Two named presets: [`MuonConfig::keller`] and [`MuonConfig::paper`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MuonConfig {
    /// Learning rate (> 0; the spectral norm of the step when `scale` is `None`).
    pub lr: f64,
    /// Decoupled weight decay λ ≥ 0: W ← (1 − lr·λ)·W before the step.
    pub weight_decay: f64,
    /// Momentum form.
    pub momentum: Momentum,
    /// How msign is computed.
    pub msign: Msign,
    /// The multiplier on lr.
    pub scale: UpdateScale,
    /// Which axis is fan-in.
    pub layout: Layout,
    /// Working precision of msign.
    pub precision: Precision,
}

impl MuonConfig {
    /// Keller Jordan's Muon defaults: lr 0.02, momentum 0.95 EMA-Nesterov, 5 quintic
    /// Newton–Schulz steps, `Original` shape scale, no weight decay, (out, in) layout. With
    /// `lr = 1e-3, weight_decay = 0.1` it is `torch.optim.Muon`'s default (whose only other
    /// difference is the 1e-7 in its normalizer and its unconditional bf16).
    pub fn keller() -> Self {
        Self {
            lr: 0.02,
            weight_decay: 0.0,
            momentum: Momentum::keller(),
            msign: Msign::MuonQuintic,
            scale: UpdateScale::Original,
            layout: Layout::OutIn,
            precision: Precision::Auto,
        }
    }

    /// The paper's unconstrained baseline: lr 0.02 (peak), momentum 0.95 in SGD-Nesterov form,
    /// Polar Express (10 steps), no shape scale, decoupled weight decay 0.1.
    pub fn paper() -> Self {
        Self {
            lr: 0.02,
            weight_decay: 0.1,
            momentum: Momentum::paper(),
            msign: Msign::polar_express(),
            scale: UpdateScale::None,
            layout: Layout::OutIn,
            precision: Precision::Auto,
        }
    }

    /// The largest learning rate accepted (also by manifold Muon): the one that keeps every
    /// update representable in the narrowest parameter type. An update is lr·s·O with msign's
    /// |O_ij| ≤ 1.2 (its widest documented band) and a shape scale s ≤ √(max side) ≤ 2¹⁶ for any
    /// matrix that fits in memory, so lr ≤ 1e32 keeps |lr·s·O| ≤ 1e32·2¹⁶·1.2 ≈ 8e36 below
    /// f32/bf16's largest value, 3.4e38. Larger values (up to `f64::MAX`) are refused; ordinary
    /// learning rates are 1e-4–1e-1, and deliberately huge ones (to provoke divergence in a test
    /// of divergence handling) stay legal.
    pub const MAX_LR: f64 = 1e32;

    /// Checks every field: lr ∈ [0, [`MuonConfig::MAX_LR`]], weight_decay ≥ 0 with
    /// lr·weight_decay ≤ 1 (else the decay factor 1 − lr·λ is negative and the weights flip
    /// sign), β ∈ [0, 1), a valid msign.
    pub fn validate(&self) -> Result<()> {
        check_range("lr", self.lr, 0.0, Self::MAX_LR)?;
        check_range("weight_decay", self.weight_decay, 0.0, f64::MAX)?;
        let decay = self.lr * self.weight_decay;
        if decay > 1.0 {
            return Err(InputError::invalid(
                "weight_decay",
                format!(
                    "lr·weight_decay = {decay:e} > 1: the decay factor 1 − lr·weight_decay would \
                     be negative and flip the weights' sign; lower weight_decay or lr"
                ),
            )
            .into());
        }
        self.momentum.validate()?;
        self.msign.validate()
    }
}

/// Per-parameter state of [`Muon`]: the momentum buffer and the step count.
pub type MuonState<M> = MomentumState<M>;

/// What one Muon step did.
#[derive(Debug, Clone, PartialEq)]
pub struct MuonStep {
    /// The multiplier s applied to lr.
    pub scale: f64,
    /// The precision msign ran in (`"f32"`, `"bf16"`, `"f64"`).
    pub precision: &'static str,
}

/// Muon (see the module docs).
///
/// ```
/// use kappa_optim::{Muon, MuonConfig, MuonState};
/// let mut w = ndarray::Array2::<f64>::eye(3);
/// let g = ndarray::array![[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]];
/// let muon = Muon::new(MuonConfig { lr: 0.1, ..MuonConfig::paper() })?;
/// let mut state = MuonState::new();
/// muon.step(&mut w, &g, &mut state)?;
/// // Weight decay 0.1·lr, then −lr·msign(g): msign(g) = diag(1, 1, 0) to ≈1e-6 (Polar Express).
/// assert!((w[[0, 0]] - (0.99 - 0.1)).abs() < 1e-6 && (w[[2, 2]] - 0.99).abs() < 1e-12);
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Muon {
    config: MuonConfig,
}

/// Checks that `grad` (and a momentum buffer) fit `w` and that both are finite.
pub(crate) fn check_step_inputs<M: Matrix>(w: &M, grad: &M, buffer: Option<&M>) -> Result<()> {
    check_inputs_named(w, grad, "grad", buffer)
}

/// [`check_step_inputs`] for an entry point whose gradient argument is called `grad_arg`.
pub(crate) fn check_inputs_named<M: Matrix>(
    w: &M,
    grad: &M,
    grad_arg: &'static str,
    buffer: Option<&M>,
) -> Result<()> {
    w.validate("w").map_err(from_linalg)?;
    if grad.shape() != w.shape() {
        return Err(InputError::shape_mismatch(
            grad_arg,
            format!("{}×{} (the shape of `w`)", w.shape().0, w.shape().1),
            format!("{}×{}", grad.shape().0, grad.shape().1),
        )
        .into());
    }
    grad.validate(grad_arg).map_err(from_linalg)?;
    if let Some(b) = buffer {
        if b.shape() != w.shape() {
            return Err(InputError::shape_mismatch(
                "state",
                format!(
                    "a momentum buffer of shape {}×{} (this state belongs to another parameter)",
                    w.shape().0,
                    w.shape().1
                ),
                format!("{}×{}", b.shape().0, b.shape().1),
            )
            .into());
        }
        // A NaN buffer (a corrupted checkpoint, an earlier NaN gradient fed in by hand) is the
        // caller's `state` argument, not msign's internal `x`.
        b.validate("state").map_err(from_linalg)?;
    }
    Ok(())
}

impl Muon {
    /// Muon with `config` (validated).
    pub fn new(config: MuonConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self { config })
    }

    /// The settings.
    pub fn config(&self) -> &MuonConfig {
        &self.config
    }

    /// Changes the learning rate (for schedules). Errors as [`MuonConfig::validate`] (argument
    /// `lr`, or `weight_decay` when lr·weight_decay would exceed 1); the rate is kept on error.
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        MuonConfig { lr, ..self.config }.validate()?;
        self.config.lr = lr;
        Ok(())
    }

    /// The orthogonalized update O = msign(U) for the momentum input U, without applying it.
    pub fn direction<M: WorkingPrecision>(&self, u: &M) -> Result<M> {
        msign(u, self.config.msign, self.config.precision)
    }

    /// One step on `w` in place, with gradient `grad` and this parameter's `state`.
    ///
    /// Errors (nothing is modified): `grad` or `state` of the wrong shape
    /// ([`InputError::ShapeMismatch`]), NaN/±∞ in `w` or `grad` ([`InputError::NonFinite`]), a
    /// precision the backend cannot use, backend failures.
    pub fn step<M: WorkingPrecision>(
        &self,
        w: &mut M,
        grad: &M,
        state: &mut MuonState<M>,
    ) -> Result<MuonStep> {
        check_step_inputs(w, grad, state.buffer.as_ref())?;
        let c = &self.config;
        let precision = w.working_name(c.precision)?;
        let (buffer, u) = c.momentum.advance_unchecked(state.buffer.as_ref(), grad)?;
        let o = self.direction(&u)?;
        let (m, n) = w.shape();
        let scale = c.scale.factor(m, n, c.layout);
        if c.weight_decay != 0.0 {
            w.scale(1.0 - c.lr * c.weight_decay)?;
        }
        w.axpy(-c.lr * scale, &o)?;
        state.record_step(buffer);
        Ok(MuonStep { scale, precision })
    }
}
