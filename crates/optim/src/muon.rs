//! Muon: momentum, then msign of the momentum, then a scaled, decoupled-weight-decay step, updating
//! the parameter in place on any [`WorkingPrecision`] backend (`ndarray` or `tch`).
//!
//! # Math
//!
//! For a weight W ∈ ℝ^{m×n} with gradient g, one step is
//!
//! 1. U from the momentum recursion ([`Momentum`]: EMA or SGD form, optionally Nesterov);
//! 2. O = msign(U) ([`Msign`]: exact, Muon's quintic, Polar Express, AOL-preconditioned Polar
//!    Express; the last two also as Gram Newton–Schulz);
//! 3. optionally NorMuon's per-neuron normalization of O ([`NorMuon`], `normuon`);
//! 4. W ← (1 − lr·λ)·W − lr·s·O, with decoupled weight decay λ and the shape factor s
//!    ([`UpdateScale`]). With `cautious_weight_decay` the decay factor applies only to the
//!    entries with w_ij·o_ij ≥ 0, those the step −lr·s·O moves towards zero (Chen et al., 2025,
//!    "Cautious Weight Decay"); the others keep their value before the step.
//!
//! [`Muon::step_scaled`] runs a step at a per-matrix multiple of lr (modded-nanogpt's `lr_mul`).
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
pub use crate::layout::Layout;
use crate::momentum::{Momentum, MomentumState};
use crate::msign::{msign, msign_working, Msign};
use crate::normuon::NorMuon;
use crate::precision::{Precision, WorkingPrecision};

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

/// Muon's settings. Three named presets: [`MuonConfig::keller`], [`MuonConfig::torch`] and
/// [`MuonConfig::paper`].
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
    /// NorMuon's per-neuron normalization of the orthogonalized update ([`NorMuon`]); `None`
    /// (the default) is plain Muon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normuon: Option<NorMuon>,
    /// Cautious weight decay (Chen et al., 2025): decay only the entries whose update moves them
    /// towards zero, w_ij·o_ij ≥ 0 for the step −lr·s·O (module docs). `false`: every entry.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cautious_weight_decay: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl MuonConfig {
    /// Keller Jordan's Muon defaults: lr 0.02, momentum 0.95 EMA-Nesterov, 5 quintic
    /// Newton–Schulz steps after the exact X/‖X‖_F, `Original` shape scale, no weight decay,
    /// (out, in) layout.
    pub fn keller() -> Self {
        Self {
            lr: 0.02,
            weight_decay: 0.0,
            momentum: Momentum::keller(),
            msign: Msign::MuonQuintic,
            scale: UpdateScale::Original,
            layout: Layout::OutIn,
            precision: Precision::Auto,
            normuon: None,
            cautious_weight_decay: false,
        }
    }

    /// `torch.optim.Muon`'s defaults: lr 1e-3, weight decay 0.1, momentum 0.95 EMA-Nesterov
    /// (its `lerp` form), 5 quintic steps after X/max(‖X‖_F, 1e-7) ([`Msign::torch_muon`]),
    /// `Original` shape scale (`adjust_lr_fn = "original"`), (out, in) layout. The one
    /// difference: torch always runs the quintic in bf16, this preset in the precision
    /// [`Precision::Auto`] picks (set `precision` to match).
    pub fn torch() -> Self {
        Self {
            lr: 1e-3,
            weight_decay: 0.1,
            msign: Msign::torch_muon(),
            ..Self::keller()
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
            normuon: None,
            cautious_weight_decay: false,
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
        if let Some(n) = &self.normuon {
            n.validate()?;
        }
        self.msign.validate()
    }

    /// This config with NorMuon's normalization (β₂ = 0.95, output neurons).
    pub fn with_normuon(self) -> Self {
        Self {
            normuon: Some(NorMuon::default()),
            ..self
        }
    }
}

/// Per-parameter state of [`Muon`]: the momentum buffer, the step count and, for NorMuon, the
/// per-neuron second moment.
#[derive(Debug)]
pub struct MuonState<M> {
    momentum: MomentumState<M>,
    second_moment: Option<Vec<f64>>,
}

impl<M> Default for MuonState<M> {
    fn default() -> Self {
        Self {
            momentum: MomentumState::new(),
            second_moment: None,
        }
    }
}

impl<M> MuonState<M> {
    /// A fresh state (zero momentum, no steps).
    pub fn new() -> Self {
        Self::default()
    }

    /// Steps applied so far.
    pub fn steps(&self) -> u64 {
        self.momentum.steps()
    }

    /// The momentum buffer, once a step has been taken.
    pub fn buffer(&self) -> Option<&M> {
        self.momentum.buffer()
    }

    /// NorMuon's second moment v (one value per neuron), once a NorMuon step has been taken.
    pub fn second_moment(&self) -> Option<&[f64]> {
        self.second_moment.as_deref()
    }

    /// A state restored from a checkpoint: the momentum buffer (None before the first step) and
    /// the number of steps applied.
    pub fn from_parts(buffer: Option<M>, steps: u64) -> Self {
        Self {
            momentum: MomentumState::from_parts(buffer, steps),
            second_moment: None,
        }
    }

    /// The momentum part of the state.
    pub fn momentum(&self) -> &MomentumState<M> {
        &self.momentum
    }

    /// A state from its momentum part and NorMuon's second moment (restored from a checkpoint).
    pub fn from_momentum(momentum: MomentumState<M>, second_moment: Option<Vec<f64>>) -> Self {
        Self {
            momentum,
            second_moment,
        }
    }

    /// This state with NorMuon's second moment restored (from a checkpoint).
    pub fn with_second_moment(self, second_moment: Option<Vec<f64>>) -> Self {
        Self {
            second_moment,
            ..self
        }
    }
}

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

/// Which entries a step checks for finiteness before it changes anything (shapes are always
/// checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entries {
    /// `w`, the gradient and the momentum buffer: every public per-matrix entry point.
    All,
    /// `w` only: the optimizer API ([`crate::optimizer`]), which checks every gradient once per
    /// step and whose buffers are finite (each made by a step from finite inputs, or checked by
    /// `load_state_dict`). A non-finite gradient or buffer that reaches a step anyway makes the
    /// momentum input non-finite, which msign reports (argument `x`) before anything changes.
    #[cfg(feature = "tch")]
    WeightOnly,
}

/// Checks that `grad` (and a momentum buffer) fit `w` and that all three are finite.
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
    check_entries(w, grad, grad_arg, buffer, Entries::All)
}

/// [`check_inputs_named`] with the finiteness of `entries` only.
pub(crate) fn check_entries<M: Matrix>(
    w: &M,
    grad: &M,
    grad_arg: &'static str,
    buffer: Option<&M>,
    entries: Entries,
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
    if entries == Entries::All {
        grad.validate(grad_arg).map_err(from_linalg)?;
    }
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
        if entries == Entries::All {
            b.validate("state").map_err(from_linalg)?;
        }
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
        self.step_scaled(w, grad, state, 1.0)
    }

    /// [`Muon::step`] at `lr_multiplier`·lr (a per-matrix learning-rate multiplier, as
    /// modded-nanogpt's `lr_mul`; the decay factor becomes 1 − multiplier·lr·λ). The multiplier
    /// must be finite and ≥ 0 with multiplier·lr·λ ≤ 1.
    pub fn step_scaled<M: WorkingPrecision>(
        &self,
        w: &mut M,
        grad: &M,
        state: &mut MuonState<M>,
        lr_multiplier: f64,
    ) -> Result<MuonStep> {
        self.step_entries(w, grad, state, lr_multiplier, Entries::All)
    }

    /// [`Muon::step_scaled`] checking the finiteness of `entries` only.
    pub(crate) fn step_entries<M: WorkingPrecision>(
        &self,
        w: &mut M,
        grad: &M,
        state: &mut MuonState<M>,
        lr_multiplier: f64,
        entries: Entries,
    ) -> Result<MuonStep> {
        let c = self.scaled_config(lr_multiplier)?;
        let buffer = state.momentum.buffer.as_ref();
        check_entries(w, grad, "grad", buffer, entries)?;
        self.step_checked(&c, w, grad, state)
    }

    /// The step at config `c` on inputs that passed [`check_step_inputs`] (a batch checks all
    /// its matrices first, then steps each without a second pass over them).
    pub(crate) fn step_checked<M: WorkingPrecision>(
        &self,
        c: &MuonConfig,
        w: &mut M,
        grad: &M,
        state: &mut MuonState<M>,
    ) -> Result<MuonStep> {
        let precision = w.working_name(c.precision)?;
        let (buffer, u) = c
            .momentum
            .advance_lean(state.momentum.buffer.as_ref(), grad)?;
        let input = u.as_ref().unwrap_or(&buffer);
        let (o, converted) = msign_working(input, c.msign, c.precision)?;
        let scale = update_from_direction(c, w, o, converted, state, buffer)?;
        Ok(MuonStep { scale, precision })
    }

    /// The config of a step at `lr_multiplier`·lr, validated (the multiplier first).
    pub(crate) fn scaled_config(&self, lr_multiplier: f64) -> Result<MuonConfig> {
        check_range("lr_multiplier", lr_multiplier, 0.0, f64::MAX)?;
        let c = MuonConfig {
            lr: self.config.lr * lr_multiplier,
            ..self.config
        };
        c.validate()?;
        Ok(c)
    }
}

/// Steps 3–4 of the module docs from the direction `o`, which is still in the working type when
/// `converted`: the fused update where it applies ([`update_from_working`]), else `o` converted
/// back to `w`'s type and [`apply_update`]. Commits the new momentum `buffer` to `state`;
/// returns the shape factor s.
pub(crate) fn update_from_direction<M: WorkingPrecision>(
    c: &MuonConfig,
    w: &mut M,
    o: M,
    converted: bool,
    state: &mut MuonState<M>,
    buffer: M,
) -> Result<f64> {
    if !converted {
        return apply_update(c, w, o, state, buffer);
    }
    if let Some(scale) = update_from_working(c, w, &o)? {
        state.momentum.record_step(buffer);
        return Ok(scale);
    }
    let o = o.to_kind_of(w)?;
    apply_update(c, w, o, state, buffer)
}

/// The update of [`apply_update`] from a direction `o` still in the working type, in one pass
/// where the backend fuses it ([`WorkingPrecision::update_from_working`]) and the update is the
/// plain one (no NorMuon, no cautious decay): the shape factor s, or `None` with `w` unchanged
/// (the caller converts `o` back and runs [`apply_update`]). The caller commits the state.
fn update_from_working<M: WorkingPrecision>(
    c: &MuonConfig,
    w: &mut M,
    o: &M,
) -> Result<Option<f64>> {
    if c.normuon.is_some() || (c.weight_decay != 0.0 && c.cautious_weight_decay) {
        return Ok(None);
    }
    let (m, n) = w.shape();
    let scale = c.scale.factor(m, n, c.layout);
    let decay = (c.weight_decay != 0.0).then_some(1.0 - c.lr * c.weight_decay);
    Ok(w.update_from_working(decay, -c.lr * scale, o)?
        .then_some(scale))
}

/// Steps 3–4 of the module docs on the direction `o`, then commits the new momentum `buffer`
/// (and NorMuon's second moment) to `state`; returns the shape factor s. The update is
/// W ← decay·W (2 passes over W, or the masked decay) and W ← W − lr·s·O (an axpy: 5 passes).
pub(crate) fn apply_update<M: WorkingPrecision>(
    c: &MuonConfig,
    w: &mut M,
    mut o: M,
    state: &mut MuonState<M>,
    buffer: M,
) -> Result<f64> {
    let mut second = state.second_moment.clone();
    if let Some(n) = &c.normuon {
        n.apply(&mut o, &mut second, c.layout)?;
    }
    let (m, n) = w.shape();
    let scale = c.scale.factor(m, n, c.layout);
    let decay = 1.0 - c.lr * c.weight_decay;
    match (c.weight_decay != 0.0, c.cautious_weight_decay) {
        (false, _) => {}
        (true, false) => w.scale(decay)?,
        (true, true) => w.masked_decay(&o, decay)?,
    }
    w.axpy(-c.lr * scale, &o)?;
    state.momentum.record_step(buffer);
    state.second_moment = second;
    Ok(scale)
}

#[cfg(feature = "tch")]
impl Muon {
    /// [`Muon::step`] on a parameter of any rank ≥ 2, orthogonalized as the matrix
    /// (d₀, d₁·…·d_k) — a convolution filter (out, in, kh, kw) as (out, in·kh·kw), the flattening
    /// `torch.optim.Muon` applies. The shape factor and NorMuon's neurons see the flattened shape.
    /// `w` is updated in place through a view, so it must be contiguous; `grad` may be any
    /// layout of `w`'s shape; `state` holds the flattened momentum.
    ///
    /// Errors (nothing is modified): a rank below 2, `grad` of another shape, a non-contiguous
    /// `w` ([`InputError::InvalidArgument`]), and everything [`Muon::step`] reports.
    pub fn step_flattened(
        &self,
        w: &mut tch::Tensor,
        grad: &tch::Tensor,
        state: &mut MuonState<tch::Tensor>,
    ) -> Result<MuonStep> {
        let size = w.size();
        if size.len() < 2 {
            let msg = format!("a tensor of shape {size:?}; Muon needs rank ≥ 2 (use AdamW)");
            return Err(InputError::invalid("w", msg).into());
        }
        if grad.size() != size {
            let found = format!("{:?}", grad.size());
            return Err(InputError::shape_mismatch("grad", format!("{size:?}"), found).into());
        }
        if !w.is_contiguous() {
            let msg = "must be contiguous: Muon updates it in place through a 2-D view";
            return Err(InputError::invalid("w", msg).into());
        }
        let flat = [size[0], size[1..].iter().product()];
        let mut w2 = w.f_view(flat).map_err(crate::error::libtorch("w"))?;
        let g2 = grad
            .f_reshape(flat)
            .map_err(crate::error::libtorch("grad"))?;
        self.step(&mut w2, &g2, state)
    }
}
