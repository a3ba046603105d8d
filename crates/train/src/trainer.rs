//! The training loop every experiment uses: a validated TOML config, deterministic CPU runs,
//! AdamW with parameter groups (pluggable per group), warmup + cosine learning rate, gradient
//! clipping, periodic evaluation with attention diagnostics, `metrics.jsonl` records,
//! safetensors checkpoints with exact resume, divergence detection and a progress bar.
//!
//! # The step
//!
//! For step index i = 0, 1, … (the (i+1)-th optimizer update):
//!
//! 1. Each [`ParamGroup`] runs at its own peak lr times the schedule's factor
//!    ([`kappa_optim::WarmupCosine`], [`TrainConfig::schedule`]): f(i) = (i+1)/(w+1) for i < w
//!    (warmup), then f(i) = m + (1 − m)·½(1 + cos(π·(i−w)/(S−w))) with m = min_lr/lr (cosine to
//!    m at step S). The groups at `lr` thus get lr(i) = min_lr + ½(1 + cos(…))·(lr − min_lr)
//!    ([`TrainConfig::lr_at`], the `lr` of training records).
//! 2. Gradients are dropped ([`GradientDropper`], PyTorch's `zero_grad(set_to_none=True)`); the
//!    forward pass runs in f32, or under bf16 autocast with [`TrainPrecision::Bf16`]
//!    ([`kappa_models::autocast`]). loss = task loss on the batch of step i (a pure function of
//!    (seed, i)); a non-finite loss stops the run as diverged, and so does a loss above
//!    `divergence_factor` × its reference ([`DivergenceReference`]: the first step's loss, or the
//!    best smoothed loss so far).
//! 3. Backward; ‖g‖ = (Σ‖g_p‖²)^{1/2} over every trainable tensor, in f64; if `grad_clip` > 0
//!    and ‖g‖ > clip, every gradient is scaled by clip/(‖g‖ + 1e-6) (PyTorch's
//!    `clip_grad_norm_`; [`clip_grad_norm`]). A non-finite ‖g‖ stops the run as diverged.
//! 4. Each [`ParamGroup`]'s [`GroupOptimizer`] updates its tensors in place under `no_grad`
//!    (the tch-rs custom-optimizer pattern). [`AdamWGroup`] runs kappa-optim's
//!    [`AdamW`], PyTorch's `torch.optim.AdamW`:
//!    p ← p(1 − lr·wd); m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²;
//!    p ← p − (lr/(1−β₁ᵗ))·m/(√v/√(1−β₂ᵗ) + ε), by default in one pass over the raw data of
//!    contiguous CPU f32 tensors ([`AdamWKernel::Fused`]), each element in f64 and rounded
//!    once per stored value; with libtorch operations elsewhere ([`AdamWKernel::Ops`]).
//! 5. The task refreshes its spectral corrections (SVD, scale-aware λ) for the new weights.
//! 6. With `qk_clip` (off by default), QK-clip (Kimi K2's MuonClip, [`kappa_optim::qk_clip`]):
//!    the training forward captured every attention layer's input; for each layer, the
//!    per-head max logit S_h of that input with the **updated** weights is measured, and every
//!    head with S_h > τ has its effective query and key projections scaled by (τ/S_h)^α and
//!    (τ/S_h)^{1−α} ([`kappa_models::ConditionedAttention::clip_qk`]), so that afterwards every
//!    head's max logit on the step's layer inputs is τ at most. Whatever the groups'
//!    optimizers (AdamW, Muon, manifold Muon): on a manifold-constrained W_Q/W_K the rescale
//!    leaves the manifold and the group's next retraction brings W back (docs/models.md,
//!    "QK-clip"). Training records carry the window's largest measured logit and clipped-head
//!    count ([`QkClipStats`]).
//!
//! Training records carry each group's [`OptimizerStats`] (dual-ascent iterations and
//! violations for manifold Muon); evaluation records carry per-head attention diagnostics and,
//! with `matrix_diagnostics`, the spectrum of every hidden matrix ([`MatrixDiagnostics`]).
//!
//! # Determinism and resume
//!
//! Initialization uses libtorch's generator seeded by the caller (`tch::manual_seed`); the data
//! order is counter-based (see [`kappa_models::data`]); no other randomness is used (no dropout). With
//! the same seed and thread count on the CPU, two runs give bit-identical losses. A checkpoint
//! holds every variable of the var store (weights and buffers such as λ and C), each group's
//! optimizer state, the step, the first loss (the divergence reference) and the data RNG's
//! complete state (seed and counter), so a resumed run reproduces the uninterrupted run exactly.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use kappa_optim::{AdamW, AdamWConfig, AdamWKernel, AdamWState, WarmupCosine};
use serde::{Deserialize, Serialize};
use tch::{nn, Kind, Tensor};

use crate::context::RunContext;
use crate::stop::StopFlag;
use kappa_models::diagnostics::{
    matrix_diagnostics, summarize, DiagnosticsConfig, HeadDiagnostics, MatrixDiagnostics,
};
use kappa_models::error::{ModelsError, Result};
use kappa_models::{QkClipReport, Transformer};
use kappa_optim::QkClipConfig;

/// [`kappa_models::seeded`]: libtorch's global generator seeded under a process-wide lock (one
/// lock for the workspace, so that model construction here and in kappa-models' callers never
/// interleaves draws).
pub use kappa_models::seeded;

/// Training settings (the `[train]` table of an experiment's TOML config). The seed, threads,
/// device and progress bar of a run are not here: they come from the [`RunContext`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Optimizer steps S.
    pub steps: u64,
    /// Examples (sequences or images) per step.
    pub batch_size: usize,
    /// Peak learning rate, in (0, [`MAX_LR`]].
    pub lr: f64,
    /// Learning rate at the end of the cosine.
    pub min_lr: f64,
    /// Linear warmup steps w (< S).
    pub warmup_steps: u64,
    /// Decoupled weight decay of the `decay` group (matrices other than embeddings), in
    /// [0, 1/lr): the decay factor 1 − lr·wd of a step stays positive.
    pub weight_decay: f64,
    /// AdamW β₁.
    pub beta1: f64,
    /// AdamW β₂.
    pub beta2: f64,
    /// AdamW ε.
    pub eps: f64,
    /// Gradient-norm clip (0 turns clipping off).
    pub grad_clip: f64,
    /// Evaluate (and diagnose) every this many steps, and after the last step.
    pub eval_every: u64,
    /// Batches per evaluation (the whole split for classification when 0). At most what the
    /// validation split holds; the caller that knows the data checks it (the `train` command
    /// does, after loading it).
    pub eval_batches: usize,
    /// Log a training record every this many steps.
    pub log_every: u64,
    /// Write a checkpoint every this many steps (≥ 1), when a path is given; one is also
    /// written after the last step and when a run is stopped (Ctrl-C, SIGTERM, SIGUSR1). A
    /// killed process loses at most this many steps; `steps` checkpoints only at the end.
    pub checkpoint_every: u64,
    /// Stop when the loss exceeds this multiple of its reference (> 1).
    pub divergence_factor: f64,
    /// What `divergence_factor` multiplies.
    #[serde(default)]
    pub divergence_reference: DivergenceReference,
    /// Evaluate (and diagnose) once before the first step too.
    #[serde(default)]
    pub eval_at_start: bool,
    /// At every evaluation, log [`MatrixDiagnostics`] of every hidden matrix (rank-2
    /// non-embedding parameter): singular values, Gram off-diagonal, column norms.
    #[serde(default)]
    pub matrix_diagnostics: bool,
    /// The precision of the training forward passes (weights, gradients and optimizer state
    /// are f32 either way; evaluations run in f32).
    #[serde(default)]
    pub precision: TrainPrecision,
    /// Diagnostics at every evaluation.
    pub diagnostics: DiagnosticsConfig,
    /// QK-clip after every optimizer step (`{ tau = 100.0, alpha = 0.5 }`); off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qk_clip: Option<QkClipConfig>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            steps: 1000,
            batch_size: 64,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 100,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            grad_clip: 1.0,
            eval_every: 100,
            eval_batches: 10,
            log_every: 10,
            checkpoint_every: 100,
            divergence_factor: 4.0,
            divergence_reference: DivergenceReference::First,
            eval_at_start: false,
            matrix_diagnostics: false,
            precision: TrainPrecision::F32,
            diagnostics: DiagnosticsConfig::default(),
            qk_clip: None,
        }
    }
}

/// The arithmetic of the training forward passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainPrecision {
    /// f32 throughout.
    #[default]
    F32,
    /// bf16 mixed precision in the style of `torch.autocast` ([`kappa_models::autocast`]): the
    /// forward pass of every training step runs under libtorch's bf16 autocast (matmuls,
    /// linear layers and attention on bf16 copies, reductions and the loss in f32). Only on a
    /// device with native bf16 ([`kappa_models::autocast::native_bf16`]): the trainer refuses it
    /// elsewhere.
    Bf16,
}

/// The loss that `divergence_factor` multiplies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DivergenceReference {
    /// The first step's loss: only a blow-up past the untrained loss counts.
    #[default]
    First,
    /// The lowest value so far of the loss's exponential moving average (weight 0.1 on the new
    /// loss), compared with the current average: a run that climbs back up from its best counts
    /// ("a configurable multiple of its best"), while one lucky low batch does not.
    Best,
}

/// The smoothing of [`DivergenceReference::Best`]: ema ← (1 − w)·ema + w·loss.
pub const LOSS_EMA_WEIGHT: f64 = 0.1;

/// The largest peak learning rate a config may set (`train.lr`, Muon's `muon_lr`): 10, 125
/// times the largest in any built-in config (Muon's 0.08), and far above any that trains these
/// models with AdamW, Muon or SGD: AdamW moves each weight by about lr per step, so at 10 one
/// step carries every weight (initialized at σ = 0.02) hundreds of standard deviations away.
/// A larger value is a typo (`3e4` for `3e-4`), refused before anything runs.
pub const MAX_LR: f64 = 10.0;

impl TrainConfig {
    /// Parses a `TrainConfig` from TOML and validates it.
    ///
    /// ```
    /// let cfg = kappa_train::TrainConfig::from_toml("steps = 10\nbatch_size = 4\nlr = 0.01\n\
    ///     min_lr = 0.001\nwarmup_steps = 2\nweight_decay = 0.1\nbeta1 = 0.9\nbeta2 = 0.95\n\
    ///     eps = 1e-8\ngrad_clip = 1.0\neval_every = 5\neval_batches = 2\nlog_every = 1\n\
    ///     checkpoint_every = 5\ndivergence_factor = 4.0\n\
    ///     diagnostics = { enabled = true, samples = 2, jacobian_max_tokens = 16 }\n")?;
    /// assert_eq!(cfg.steps, 10);
    /// let err = kappa_train::TrainConfig::from_toml("steps = 0").unwrap_err();
    /// # Ok::<(), kappa_models::ModelsError>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<Self> {
        let cfg: Self =
            toml::from_str(text).map_err(|e| ModelsError::config("train", e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every field; the error names the first bad one (`train.lr`, ...).
    pub fn validate(&self) -> Result<()> {
        let bad = |f: &str, r: String| Err(ModelsError::config(format!("train.{f}"), r));
        if self.steps == 0 {
            return bad("steps", "must be ≥ 1".into());
        }
        if self.batch_size == 0 {
            return bad("batch_size", "must be ≥ 1".into());
        }
        if !(self.lr > 0.0 && self.lr <= MAX_LR) {
            return bad(
                "lr",
                format!(
                    "must be finite and lie in (0, {MAX_LR}], found {:?}",
                    self.lr
                ),
            );
        }
        if !(self.min_lr.is_finite() && self.min_lr >= 0.0 && self.min_lr <= self.lr) {
            return bad(
                "min_lr",
                format!("must lie in [0, lr], found {}", self.min_lr),
            );
        }
        if self.warmup_steps >= self.steps {
            return bad(
                "warmup_steps",
                format!(
                    "must be < steps = {}, found {}",
                    self.steps, self.warmup_steps
                ),
            );
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay * self.lr < 1.0) {
            return bad(
                "weight_decay",
                format!(
                    "must lie in [0, 1/lr) (a step's decay factor 1 − lr·wd must stay > 0; \
                     lr = {}), found {}",
                    self.lr, self.weight_decay
                ),
            );
        }
        for (f, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return bad(f, format!("must lie in [0, 1), found {b}"));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad("eps", format!("must be > 0, found {}", self.eps));
        }
        if !(self.grad_clip.is_finite() && self.grad_clip >= 0.0) {
            return bad(
                "grad_clip",
                format!("must be ≥ 0, found {}", self.grad_clip),
            );
        }
        if self.eval_every == 0 {
            return bad("eval_every", "must be ≥ 1".into());
        }
        if self.log_every == 0 {
            return bad("log_every", "must be ≥ 1".into());
        }
        if self.checkpoint_every == 0 {
            return bad(
                "checkpoint_every",
                format!(
                    "must be ≥ 1 (steps = {} checkpoints only at the end)",
                    self.steps
                ),
            );
        }
        if !(self.divergence_factor.is_finite() && self.divergence_factor > 1.0) {
            return bad(
                "divergence_factor",
                format!("must be finite and > 1, found {}", self.divergence_factor),
            );
        }
        self.diagnostics.validate("train.diagnostics")?;
        if let Some(Err(e)) = self.qk_clip.map(|c| c.validate()) {
            let field = match &e {
                kappa_optim::OptimError::Input(input) => format!("qk_clip.{}", input.arg()),
                _ => "qk_clip".into(),
            };
            return bad(&field, e.to_string());
        }
        Ok(())
    }

    /// Checks that one training step of `model` at `batch_size`, with its evaluation and
    /// diagnostics, fits in this process's memory ([`kappa_models::layers::StepSize::bytes`]
    /// states the formula): sizes that cannot work are an error naming the keys that set
    /// them, before anything is built, where they would otherwise be a libtorch allocation
    /// failure (a panic in tch) or minutes of swapping. The vocabulary is `model.vocab_size`,
    /// which the caller sets to the tokenizer's first when it is 0.
    pub fn ensure_gpt_step_fits(&self, model: &kappa_models::GptConfig) -> Result<()> {
        let bytes = model.training_bytes(self.batch_size, &self.diagnostics);
        let keys = kappa_models::GptConfig::WEIGHT_KEYS;
        self.ensure_step_fits(bytes, "GPT", keys)
    }

    /// [`TrainConfig::ensure_gpt_step_fits`] for a ViT whose evaluations take batches of
    /// `eval_batch` images.
    pub fn ensure_vit_step_fits(
        &self,
        model: &kappa_models::VitConfig,
        eval_batch: usize,
    ) -> Result<()> {
        let bytes = model.training_bytes(self.batch_size, eval_batch, &self.diagnostics);
        let keys = kappa_models::VitConfig::WEIGHT_KEYS;
        self.ensure_step_fits(bytes, "ViT", keys)
    }

    fn ensure_step_fits(&self, bytes: Option<u128>, model: &str, keys: &str) -> Result<()> {
        const STEP_KEYS: &str = "model.n_head, train.batch_size, train.diagnostics.samples, \
            train.diagnostics.jacobian_max_tokens";
        let what = format!("one training step of this {model} (with its evaluation)");
        kappa_models::memory::ensure_fits(bytes, &what, &format!("{keys}, {STEP_KEYS}"))
    }

    /// Checks the counts that cost time against the `examples` distinct examples of the
    /// validation split (`unit`: `windows` of a language model's context, `images`):
    /// evaluating more than ⌈examples / batch_size⌉ batches (what holds each example once)
    /// or diagnosing more samples than there are examples only repeats work. `zero` says
    /// what `eval_batches = 0` means to the task. Errors name the key and its bound.
    pub fn check_validation_counts(&self, examples: usize, unit: &str, zero: &str) -> Result<()> {
        let batch = self.batch_size.max(1);
        let batches = examples.div_ceil(batch).max(1);
        if self.eval_batches > batches {
            return Err(ModelsError::config(
                "train.eval_batches",
                format!(
                    "must be at most {batches} (⌈{examples} validation {unit} / batch_size \
                     {batch}⌉; {zero}), found {}",
                    self.eval_batches
                ),
            ));
        }
        let samples = self.diagnostics.diagnosed_samples();
        if samples > examples {
            return Err(ModelsError::config(
                "train.diagnostics.samples",
                format!("must be at most the {examples} validation {unit}, found {samples}"),
            ));
        }
        Ok(())
    }

    /// The learning-rate schedule: warmup over `warmup_steps`, then cosine to the factor
    /// `min_lr`/`lr` at `steps` (a factor of each group's peak lr).
    pub fn schedule(&self) -> WarmupCosine {
        WarmupCosine::from_lrs(self.warmup_steps, self.steps, self.lr, self.min_lr)
    }

    /// The learning rate of step index `i` (0-based) of the groups whose peak is `lr`: linear
    /// warmup, then cosine to `min_lr` ([`TrainConfig::schedule`]).
    pub fn lr_at(&self, i: u64) -> f64 {
        self.schedule().lr(self.lr, i)
    }

    /// The AdamW hyper-parameters (`beta1`, `beta2`, `eps`) with weight decay `weight_decay`.
    pub fn adamw(&self, weight_decay: f64) -> AdamWConfig {
        AdamWConfig {
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay,
        }
    }
}

/// An optimizer for one parameter group: updates the group's tensors in place from their
/// `.grad()` (the tch-rs custom-optimizer pattern). Implement this to plug another optimizer
/// (Muon, manifold Muon, …) into [`Trainer`] for some of the parameters.
pub trait GroupOptimizer: std::fmt::Debug {
    /// A short name (`adamw`).
    fn name(&self) -> &str;
    /// One update of `params` (whose gradients are set) with learning rate `lr`. Called
    /// inside `no_grad`.
    fn step(&mut self, params: &[Tensor], lr: f64) -> Result<()>;
    /// The optimizer state as named tensors (saved in checkpoints).
    fn state(&self) -> Vec<(String, Tensor)>;
    /// Restores what [`GroupOptimizer::state`] returned.
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()>;
    /// What the optimizer did since the last call (logged with each training record);
    /// `None` when it keeps no statistics.
    fn take_stats(&mut self) -> Option<OptimizerStats> {
        None
    }
}

/// What a group's optimizer did between two training records. The dual-ascent fields are
/// means over the matrix updates of manifold Muon (`None` for other optimizers).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OptimizerStats {
    /// Matrix (or block) updates.
    pub updates: u64,
    /// Seconds spent in the optimizer's step.
    pub seconds: f64,
    /// Mean dual-ascent iterations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dual_steps: Option<f64>,
    /// Mean msign calls per update made by the tangent-problem solver (the dual ascent's K, 1
    /// for the square closed form, ADMM's 2 per iteration + 1): neither the retraction nor the
    /// diagnostic ‖G‖_* (`DualReport`'s descent statistics) is counted.
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

/// kappa-optim's [`AdamW`] over a group of tensors (their `.grad()`), one [`AdamWState`] per
/// tensor, created at the first step.
#[derive(Debug)]
pub struct AdamWGroup {
    config: AdamWConfig,
    kernel: AdamWKernel,
    states: Vec<AdamWState<Tensor>>,
}

impl AdamWGroup {
    /// AdamW with `config` and the default kernel ([`AdamWKernel::Fused`]); an invalid config
    /// is reported by the first step.
    pub fn new(config: AdamWConfig) -> Self {
        Self {
            config,
            kernel: AdamWKernel::default(),
            states: Vec::new(),
        }
    }

    /// The same optimizer with another kernel.
    ///
    /// ```
    /// use kappa_train::{AdamWGroup, AdamWKernel};
    /// let opt = AdamWGroup::new(kappa_optim::AdamWConfig::torch()).with_kernel(AdamWKernel::Ops);
    /// assert_eq!(opt.kernel(), AdamWKernel::Ops);
    /// ```
    pub fn with_kernel(self, kernel: AdamWKernel) -> Self {
        Self { kernel, ..self }
    }

    /// The kernel.
    pub fn kernel(&self) -> AdamWKernel {
        self.kernel
    }
}

/// A kappa-optim error as [`ModelsError::Optimizer`].
pub(crate) fn optim_err(e: kappa_optim::OptimError) -> ModelsError {
    ModelsError::Optimizer(e.to_string())
}

impl GroupOptimizer for AdamWGroup {
    fn name(&self) -> &str {
        "adamw"
    }

    fn step(&mut self, params: &[Tensor], lr: f64) -> Result<()> {
        let adamw = AdamW::new(self.config).map_err(optim_err)?;
        if self.states.is_empty() {
            self.states = params.iter().map(|_| AdamWState::new()).collect();
        }
        if self.states.len() != params.len() {
            return Err(ModelsError::config(
                "adamw",
                format!(
                    "the state holds moments for {} parameters, the group has {}",
                    self.states.len(),
                    params.len()
                ),
            ));
        }
        let grads: Vec<Tensor> = params.iter().map(Tensor::grad).collect();
        adamw
            .step_tensors(params, &grads, &mut self.states, lr, self.kernel)
            .map_err(optim_err)
    }

    /// `steps` (one count per tensor) and, for the tensors stepped so far, `exp_avg.<i>` and
    /// `exp_avg_sq.<i>`.
    fn state(&self) -> Vec<(String, Tensor)> {
        let steps: Vec<i64> = self.states.iter().map(|s| s.steps() as i64).collect();
        let mut out = vec![("steps".to_string(), Tensor::from_slice(&steps))];
        for (i, s) in self.states.iter().enumerate() {
            if let (Some(m), Some(v)) = (s.exp_avg(), s.exp_avg_sq()) {
                out.push((format!("exp_avg.{i}"), m.shallow_clone()));
                out.push((format!("exp_avg_sq.{i}"), v.shallow_clone()));
            }
        }
        out
    }

    /// Restores [`GroupOptimizer::state`]; also reads the earlier format, one step count `t`
    /// for the whole group.
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        let missing = |k: &str| ModelsError::Checkpoint {
            path: PathBuf::new(),
            reason: format!("AdamW state `{k}` is missing"),
        };
        let steps: Vec<u64> = match (state.get("steps"), state.get("t")) {
            (Some(s), _) => (0..s.numel() as i64)
                .map(|i| s.f_int64_value(&[i]).map(|n| n as u64))
                .collect::<std::result::Result<_, _>>()?,
            (None, Some(t)) => {
                let n = state.keys().filter(|k| k.starts_with("exp_avg.")).count();
                vec![t.f_int64_value(&[0])? as u64; n]
            }
            (None, None) => return Err(missing("steps")),
        };
        let mut states = Vec::with_capacity(steps.len());
        for (i, n) in steps.into_iter().enumerate() {
            let (a, b) = (format!("exp_avg.{i}"), format!("exp_avg_sq.{i}"));
            let moments = match (state.get(&a), state.get(&b)) {
                (Some(m), Some(v)) => Some((m.copy(), v.copy())),
                (None, None) if n == 0 => None,
                (None, _) => return Err(missing(&a)),
                (Some(_), None) => return Err(missing(&b)),
            };
            states.push(AdamWState::from_parts(moments, n));
        }
        self.states = states;
        Ok(())
    }
}

/// Drops gradients (sets them undefined, as PyTorch's `zero_grad(set_to_none=True)`) rather
/// than zeroing them in place: the next backward pass then stores each gradient as computed
/// instead of adding it to zeros (one write and one read-modify-write of parameter-sized
/// memory saved per step).
///
/// tch exposes no way to reset a tensor's gradient, but libtorch's C++ optimizers do:
/// `Optimizer::zero_grad(bool set_to_none = true)` (libtorch ≥ 2.0). This holds a C++ SGD
/// optimizer over the parameters that is never stepped; [`GradientDropper::drop_gradients`]
/// calls its `zero_grad()`.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// let w = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
/// let dropper = kappa_train::GradientDropper::new(&[w.shallow_clone()])?;
/// (&w * 2.0).sum(Kind::Float).backward();
/// assert!(w.grad().defined());
/// dropper.drop_gradients()?;
/// assert!(!w.grad().defined());
/// # Ok::<(), kappa_models::ModelsError>(())
/// ```
pub struct GradientDropper {
    optimizer: tch::COptimizer,
}

impl std::fmt::Debug for GradientDropper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GradientDropper")
    }
}

impl GradientDropper {
    /// A dropper over `params`.
    pub fn new(params: &[Tensor]) -> Result<Self> {
        let mut optimizer = tch::COptimizer::sgd(0.0, 0.0, 0.0, 0.0, false)?;
        for p in params {
            optimizer.add_parameters(p, 0)?;
        }
        Ok(Self { optimizer })
    }

    /// Sets every parameter's gradient undefined.
    pub fn drop_gradients(&self) -> Result<()> {
        Ok(self.optimizer.zero_grad()?)
    }
}

/// The global gradient norm ‖g‖ = (Σ_p ‖g_p‖²)^{1/2} over the defined gradients of `params`,
/// accumulated in f64; when `clip` > 0 and ‖g‖ > clip (and finite), every gradient is scaled by
/// clip/(‖g‖ + 10⁻⁶) (PyTorch's `clip_grad_norm_`). Returns ‖g‖ before clipping. Call it
/// inside `no_grad`.
///
/// Contiguous CPU f32 gradients are summed in one pass over their raw data (each square exact
/// in f64, fixed chunks added in order: the value does not depend on the thread count); other
/// gradients through libtorch (`to_kind(Double).square().sum()`).
pub fn clip_grad_norm(params: &[Tensor], clip: f64) -> Result<f64> {
    let grads: Vec<Tensor> = params.iter().map(Tensor::grad).collect();
    let total = match kappa_optim::fused::sum_of_squares(&grads) {
        Some(sum) => sum,
        None => {
            let mut total: Option<Tensor> = None;
            for g in grads.iter().filter(|g| g.defined()) {
                let sq = g.f_to_kind(Kind::Double)?.f_square()?.f_sum(Kind::Double)?;
                total = Some(match total {
                    Some(t) => t.f_add(&sq.f_to_device(t.device())?)?,
                    None => sq,
                });
            }
            total.map_or(Ok(0.0), |t| t.f_double_value(&[]))?
        }
    };
    let norm = total.sqrt();
    if clip > 0.0 && norm.is_finite() && norm > clip {
        let scale = clip / (norm + 1e-6);
        for g in &grads {
            if g.defined() {
                let _ = g.shallow_clone().f_mul_scalar_(scale)?;
            }
        }
    }
    Ok(norm)
}

/// Named trainable tensors updated by one optimizer.
#[derive(Debug)]
pub struct ParamGroup {
    /// The group name (a checkpoint prefix).
    pub name: String,
    /// The var-store names of the tensors, in order.
    pub names: Vec<String>,
    /// The tensors (shallow clones of the var-store variables).
    pub params: Vec<Tensor>,
    /// The group's peak learning rate; step i runs at `lr`·f(i), f the schedule's factor
    /// ([`TrainConfig::schedule`]).
    pub lr: f64,
    /// The optimizer.
    pub optimizer: Box<dyn GroupOptimizer>,
}

/// Whether a variable is an embedding (never weight-decayed): its last name component is
/// `wte`, `wpe`, `pos_embed` or `cls_token`.
pub fn is_embedding(name: &str) -> bool {
    matches!(
        name.rsplit('.').next(),
        Some("wte" | "wpe" | "pos_embed" | "cls_token")
    )
}

/// The trainable variables of `vs`, sorted by name (a deterministic order).
pub fn named_trainable(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The default groups: `decay` (tensors of rank ≥ 2 other than embeddings, AdamW with the
/// config's weight decay) and `no_decay` (gains, biases, embeddings; AdamW without decay), both
/// at the config's peak `lr`.
pub fn adamw_groups(vs: &nn::VarStore, cfg: &TrainConfig) -> Vec<ParamGroup> {
    let (mut decay, mut rest) = (Vec::new(), Vec::new());
    for (name, t) in named_trainable(vs) {
        if t.dim() >= 2 && !is_embedding(&name) {
            decay.push((name, t));
        } else {
            rest.push((name, t));
        }
    }
    let group = |name: &str, items: Vec<(String, Tensor)>, wd: f64| {
        let (names, params) = items.into_iter().unzip();
        ParamGroup {
            name: name.into(),
            names,
            params,
            lr: cfg.lr,
            optimizer: Box::new(AdamWGroup::new(cfg.adamw(wd))),
        }
    };
    vec![
        group("decay", decay, cfg.weight_decay),
        group("no_decay", rest, 0.0),
    ]
}

/// Evaluation results.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Eval {
    /// Mean loss.
    #[serde(with = "kappa_models::float")]
    pub loss: f64,
    /// Accuracy in [0, 1] (classification).
    pub accuracy: Option<f64>,
}

/// What a training run optimizes: a model, its data and its loss.
pub trait Task {
    /// What the throughput counts (`tokens`, `images`).
    fn unit(&self) -> &'static str;
    /// The loss of the training batch of step index `step` (with its graph) and the number
    /// of units in the batch.
    fn train_loss(&mut self, step: u64, batch_size: usize) -> Result<(Tensor, u64)>;
    /// Evaluation on the validation split (no gradient).
    fn evaluate(&mut self, batches: usize, batch_size: usize) -> Result<Eval>;
    /// Per-head diagnostics on a fixed batch.
    fn diagnostics(&mut self, config: &DiagnosticsConfig) -> Result<Vec<HeadDiagnostics>>;
    /// Called after optimizer step `step` (1-based count of finished steps): refresh the
    /// spectral corrections.
    fn after_step(&mut self, _step: u64) -> Result<()> {
        Ok(())
    }
    /// The model's attention layers, for QK-clip (`None`: the task has none, and a config
    /// with `qk_clip` is refused).
    fn transformer(&self) -> Option<&dyn Transformer> {
        None
    }
}

/// QK-clip over the steps of one training record's window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QkClipStats {
    /// The largest logit measured (after each update, before its clip) over every head and
    /// layer in the window.
    #[serde(with = "kappa_models::float")]
    pub max_logit: f64,
    /// Heads rescaled in the window, summed over its steps and layers.
    pub clipped_heads: u64,
}

impl Default for QkClipStats {
    /// An empty window: no logit yet (−∞), no head clipped.
    fn default() -> Self {
        Self {
            max_logit: f64::NEG_INFINITY,
            clipped_heads: 0,
        }
    }
}

impl QkClipStats {
    fn add(&mut self, reports: &[QkClipReport]) {
        for r in reports {
            self.max_logit = self.max_logit.max(r.max_logit());
            self.clipped_heads += r.clipped() as u64;
        }
    }
}

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// A training step.
    Train {
        /// Finished steps.
        step: u64,
        /// The step's training loss.
        #[serde(with = "kappa_models::float")]
        loss: f64,
        /// The step's learning rate.
        lr: f64,
        /// Gradient norm before clipping.
        #[serde(with = "kappa_models::float")]
        grad_norm: f64,
        /// Units (tokens or images) per second since the previous training record.
        units_per_second: f64,
        /// Seconds since the run (or the resumed run) started.
        seconds: f64,
        /// Per-group optimizer statistics since the previous training record.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        optimizers: BTreeMap<String, OptimizerStats>,
        /// QK-clip since the previous training record (with `qk_clip` only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        qk_clip: Option<QkClipStats>,
    },
    /// An evaluation.
    Eval {
        /// Finished steps.
        step: u64,
        /// Validation loss and accuracy.
        #[serde(flatten)]
        eval: Eval,
        /// Per-head diagnostics (empty when disabled).
        heads: Vec<HeadDiagnostics>,
        /// Hidden-matrix spectra (empty unless `matrix_diagnostics`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        matrices: Vec<MatrixDiagnostics>,
    },
    /// The run stopped because it diverged.
    Diverged {
        /// The step index at which it was detected.
        step: u64,
        /// Why.
        reason: String,
    },
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// All steps done.
    Completed,
    /// Stopped by [`Trainer::stop_after`] or the context's [`StopFlag`] before the last step,
    /// with a checkpoint (resume it later).
    Interrupted {
        /// Finished steps.
        step: u64,
    },
    /// Stopped by the divergence check.
    Diverged {
        /// The step index at which it was detected.
        step: u64,
        /// Why.
        reason: String,
    },
}

/// Summary of a run (or of the part run by one `run` call).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// How it ended.
    pub outcome: Outcome,
    /// The last evaluation.
    pub last_eval: Option<Eval>,
    /// Wall seconds of this call.
    pub seconds: f64,
    /// Mean training throughput (units/s) of this call, evaluation excluded.
    pub units_per_second: f64,
    /// Mean seconds per training step (forward, backward, optimizer) of this call.
    pub seconds_per_step: f64,
}

/// Drives a [`Task`] with the optimizer groups over the variables of a var store.
pub struct Trainer<'a> {
    vs: &'a nn::VarStore,
    config: TrainConfig,
    seed: u64,
    progress: bool,
    groups: Vec<ParamGroup>,
    step: u64,
    first_loss: Option<f64>,
    loss_ema: Option<f64>,
    best_ema: Option<f64>,
    stop_after: Option<u64>,
    stop: StopFlag,
    label: String,
}

/// The prefix of the model's variables in a checkpoint: variable `v` is stored as `model/v`.
pub const CKPT_MODEL: &str = "model/";
const CKPT_OPTIM: &str = "optim/";
/// Matrices with at most this many singular values log all of them.
const MATRIX_SINGULAR_VALUES: usize = 1024;

/// Wall-clock accounting of one [`Trainer::run`] call.
struct Clock {
    started: Instant,
    train_seconds: f64,
    units: u64,
    steps: u64,
}

impl Clock {
    fn summary(&self, outcome: Outcome, last_eval: Option<Eval>) -> Summary {
        Summary {
            outcome,
            last_eval,
            seconds: self.started.elapsed().as_secs_f64(),
            units_per_second: if self.train_seconds > 0.0 {
                self.units as f64 / self.train_seconds
            } else {
                0.0
            },
            seconds_per_step: if self.steps > 0 {
                self.train_seconds / self.steps as f64
            } else {
                0.0
            },
        }
    }
}

impl<'a> Trainer<'a> {
    /// A trainer with the default AdamW groups ([`adamw_groups`]); validates the config and
    /// applies the context's thread count. The context's seed is the run's identity in
    /// checkpoints (a checkpoint of another seed is refused); its device is the var store's.
    pub fn new(vs: &'a nn::VarStore, config: TrainConfig, context: &RunContext) -> Result<Self> {
        let groups = adamw_groups(vs, &config);
        Self::with_groups(vs, config, groups, context)
    }

    /// A trainer with custom groups; every trainable variable must be in exactly one group.
    /// Groups that compute when built (`modulewise_groups` retracts the initial weights onto
    /// their manifolds) ran at the thread count in force then: apply the context first
    /// ([`RunContext::apply_threads`]) for them to run at the count training runs at.
    pub fn with_groups(
        vs: &'a nn::VarStore,
        config: TrainConfig,
        groups: Vec<ParamGroup>,
        context: &RunContext,
    ) -> Result<Self> {
        config.validate()?;
        let mut seen = BTreeMap::new();
        for g in &groups {
            if g.names.len() != g.params.len() {
                return Err(ModelsError::config(
                    format!("groups.{}", g.name),
                    "names and params differ in length",
                ));
            }
            for n in &g.names {
                if seen.insert(n.clone(), g.name.clone()).is_some() {
                    return Err(ModelsError::config(
                        format!("groups.{}", g.name),
                        format!("`{n}` is in two groups"),
                    ));
                }
            }
        }
        for (n, _) in named_trainable(vs) {
            if !seen.contains_key(&n) {
                return Err(ModelsError::config(
                    "groups",
                    format!("trainable variable `{n}` is in no group"),
                ));
            }
        }
        if config.precision == TrainPrecision::Bf16
            && !kappa_models::autocast::native_bf16(vs.device())
        {
            return Err(ModelsError::config(
                "train.precision",
                format!(
                    "bf16 needs native bf16 arithmetic (avx512_bf16 or amx_bf16 on x86-64, \
                     bf16 on aarch64, or CUDA), which {:?} lacks",
                    vs.device()
                ),
            ));
        }
        context.apply_threads();
        Ok(Self {
            vs,
            config,
            seed: context.seed,
            progress: context.progress,
            groups,
            step: 0,
            first_loss: None,
            loss_ema: None,
            best_ema: None,
            stop_after: None,
            stop: context.stop.clone(),
            label: String::from("train"),
        })
    }

    /// Finished steps.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The config.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Makes [`Trainer::run`] return [`Outcome::Interrupted`] once `step` steps are done
    /// (the learning-rate schedule still spans the config's `steps`).
    pub fn stop_after(&mut self, step: u64) {
        self.stop_after = Some(step);
    }

    /// The progress bar's prefix.
    pub fn set_label(&mut self, label: impl Into<String>) {
        self.label = label.into();
    }

    /// Writes a checkpoint (safetensors): `model/<var>` for every var-store variable,
    /// `optim/<group>/<state>`, `trainer/step`, `trainer/first_loss`, `trainer/loss_ema`,
    /// `trainer/best_ema`, `rng/seed`, `rng/counter`.
    pub fn save_checkpoint(&self, path: &Path) -> Result<()> {
        let mut named: Vec<(String, Tensor)> = self
            .vs
            .variables()
            .into_iter()
            .map(|(n, t)| (format!("{CKPT_MODEL}{n}"), t.detach()))
            .collect();
        for g in &self.groups {
            for (k, t) in g.optimizer.state() {
                named.push((format!("{CKPT_OPTIM}{}/{k}", g.name), t));
            }
        }
        named.push((
            "trainer/step".into(),
            Tensor::from_slice(&[self.step as i64]),
        ));
        named.push((
            "trainer/first_loss".into(),
            Tensor::from_slice(&[self.first_loss.unwrap_or(f64::NAN)]),
        ));
        for (key, value) in [
            ("trainer/loss_ema", self.loss_ema),
            ("trainer/best_ema", self.best_ema),
        ] {
            named.push((key.into(), Tensor::from_slice(&[value.unwrap_or(f64::NAN)])));
        }
        named.push(("rng/seed".into(), Tensor::from_slice(&[self.seed as i64])));
        named.push((
            "rng/counter".into(),
            Tensor::from_slice(&[self.step as i64]),
        ));
        named.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|e| ModelsError::io(dir, e))?;
            }
        }
        let cpu: Vec<(String, Tensor)> = named
            .into_iter()
            .map(|(n, t)| (n, t.to_device(tch::Device::Cpu).contiguous()))
            .collect();
        // Write to a temporary file and rename, so a crash never leaves a torn checkpoint.
        let tmp = path.with_extension("safetensors.tmp");
        Tensor::write_safetensors(&cpu, &tmp).map_err(|e| ModelsError::Checkpoint {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        // Flushed to the disk before the rename, and the folder after it: a crash leaves the
        // previous checkpoint or this one (`crate::folder::write_atomic`'s rule).
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| ModelsError::io(&tmp, e))?;
        crate::folder::commit(&tmp, path).map_err(|e| err_of_run(path, e))
    }

    /// Restores a checkpoint written by [`Trainer::save_checkpoint`] into this trainer's var
    /// store and optimizers, after checking all of it against the run ([`check_checkpoint`]):
    /// nothing is restored from a checkpoint that fails a check.
    pub fn load_checkpoint(&mut self, path: &Path) -> Result<()> {
        let err = |reason: String| ModelsError::Checkpoint {
            path: path.to_path_buf(),
            reason,
        };
        if !path.is_file() {
            return Err(err("not a regular file".into()));
        }
        let tensors: HashMap<String, Tensor> = Tensor::read_safetensors(path)
            .map_err(|e| err(e.to_string()))?
            .into_iter()
            .collect();
        let step = check_checkpoint(&tensors, &self.vs.variables(), self.seed, &self.config)
            .map_err(err)?;
        let vars = self.vs.variables();
        let device = self.vs.device();
        tch::no_grad(|| -> Result<()> {
            for (name, var) in &vars {
                var.shallow_clone()
                    .f_copy_(&tensors[&format!("{CKPT_MODEL}{name}")])?;
            }
            Ok(())
        })?;
        for g in &mut self.groups {
            let prefix = format!("{CKPT_OPTIM}{}/", g.name);
            let state: HashMap<String, Tensor> = tensors
                .iter()
                .filter_map(|(k, t)| {
                    k.strip_prefix(&prefix)
                        .map(|s| (s.to_string(), t.to_device(device)))
                })
                .collect();
            g.optimizer
                .load_state(&state)
                .map_err(|e| err(format!("group `{}`: {e}", g.name)))?;
        }
        self.step = step;
        let scalar = |k: &str| {
            tensors
                .get(k)
                .and_then(|t| t.f_double_value(&[0]).ok())
                .filter(|x| x.is_finite())
        };
        self.first_loss = scalar("trainer/first_loss");
        // Absent in checkpoints written before the `best` reference existed.
        self.loss_ema = scalar("trainer/loss_ema");
        self.best_ema = scalar("trainer/best_ema");
        Ok(())
    }

    fn progress_bar(&self, unit: &str) -> ProgressBar {
        if !self.progress {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new(self.config.steps);
        let template = format!(
            "{{prefix}} [{{bar:30}}] {{pos}}/{{len}} steps {{msg}} ({{elapsed}}, ETA {{eta}}) [{unit}]"
        );
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(self.label.clone());
        bar.set_position(self.step);
        bar
    }

    fn eval_record<T: Task>(&self, task: &mut T) -> Result<Record> {
        let eval =
            tch::no_grad(|| task.evaluate(self.config.eval_batches, self.config.batch_size))?;
        let heads = if self.config.diagnostics.enabled {
            tch::no_grad(|| task.diagnostics(&self.config.diagnostics))?
        } else {
            Vec::new()
        };
        let matrices = if self.config.matrix_diagnostics {
            self.matrix_diagnostics()?
        } else {
            Vec::new()
        };
        Ok(Record::Eval {
            step: self.step,
            eval,
            heads,
            matrices,
        })
    }

    /// [`MatrixDiagnostics`] of every rank-2 non-embedding parameter, in group order.
    fn matrix_diagnostics(&self) -> Result<Vec<MatrixDiagnostics>> {
        let _guard = tch::no_grad_guard();
        let mut out = Vec::new();
        for g in &self.groups {
            for (name, p) in g.names.iter().zip(&g.params) {
                if p.dim() == 2 && !is_embedding(name) {
                    out.push(matrix_diagnostics(name, p, MATRIX_SINGULAR_VALUES)?);
                }
            }
        }
        Ok(out)
    }

    /// Updates the divergence reference with this step's loss; the reason when it diverged.
    fn check_loss(&mut self, loss: f64) -> Option<String> {
        if !loss.is_finite() {
            return Some(format!("loss is {loss}"));
        }
        let first = *self.first_loss.get_or_insert(loss);
        let ema = match self.loss_ema {
            Some(e) => (1.0 - LOSS_EMA_WEIGHT) * e + LOSS_EMA_WEIGHT * loss,
            None => loss,
        };
        self.loss_ema = Some(ema);
        let best = self.best_ema.map_or(ema, |b| b.min(ema));
        self.best_ema = Some(best);
        let factor = self.config.divergence_factor;
        match self.config.divergence_reference {
            DivergenceReference::First if loss > factor * first => Some(format!(
                "loss {loss:.4} exceeds {factor} × the first loss {first:.4}"
            )),
            DivergenceReference::Best if ema > factor * best => Some(format!(
                "smoothed loss {ema:.4} exceeds {factor} × its best {best:.4}"
            )),
            _ => None,
        }
    }

    /// Each group's optimizer statistics since the last call.
    fn optimizer_stats(&mut self) -> BTreeMap<String, OptimizerStats> {
        self.groups
            .iter_mut()
            .filter_map(|g| g.optimizer.take_stats().map(|s| (g.name.clone(), s)))
            .collect()
    }

    /// Trains from the current step to the config's `steps` (or to [`Trainer::stop_after`], or
    /// the step after the context's [`StopFlag`] is raised), sending every record to `sink`;
    /// writes checkpoints to `checkpoint` when given (always when it stops early).
    pub fn run<T: Task>(
        &mut self,
        task: &mut T,
        sink: &mut dyn FnMut(&Record) -> Result<()>,
        checkpoint: Option<&Path>,
    ) -> Result<Summary> {
        let mut clock = Clock {
            started: Instant::now(),
            train_seconds: 0.0,
            units: 0,
            steps: 0,
        };
        let bar = self.progress_bar(task.unit());
        let (mut window_units, mut window_start) = (0u64, Instant::now());
        let mut last_eval = None;
        let end = self
            .stop_after
            .map_or(self.config.steps, |s| s.min(self.config.steps));
        let params: Vec<Tensor> = self
            .groups
            .iter()
            .flat_map(|g| g.params.iter().map(Tensor::shallow_clone))
            .collect();
        let dropper = GradientDropper::new(&params)?;
        let mut clip_window = self.start_qk_clip(&*task)?;
        if self.config.eval_at_start && self.step == 0 && end > 0 {
            last_eval = Some(self.evaluate(task, &bar, sink)?);
        }
        let schedule = self.config.schedule();
        while self.step < end && !self.stop.is_raised() {
            let i = self.step;
            let t0 = Instant::now();
            let lr = schedule.lr(self.config.lr, i);
            dropper.drop_gradients()?;
            let batch = self.config.batch_size;
            let (loss, units) = match self.config.precision {
                TrainPrecision::F32 => task.train_loss(i, batch)?,
                TrainPrecision::Bf16 => kappa_models::autocast::autocast(self.vs.device(), || {
                    task.train_loss(i, batch)
                })?,
            };
            let loss_value = loss.double_value(&[]);
            if let Some(reason) = self.check_loss(loss_value) {
                return diverge(&bar, sink, i, reason, &clock, last_eval);
            }
            loss.f_backward()?;
            let grad_norm = tch::no_grad(|| clip_grad_norm(&params, self.config.grad_clip))?;
            if !grad_norm.is_finite() {
                let reason = format!("gradient norm is {grad_norm}");
                return diverge(&bar, sink, i, reason, &clock, last_eval);
            }
            tch::no_grad(|| -> Result<()> {
                for g in &mut self.groups {
                    g.optimizer.step(&g.params, schedule.lr(g.lr, i))?;
                }
                Ok(())
            })?;
            self.step += 1;
            tch::no_grad(|| task.after_step(self.step))?;
            if let (Some(clip), Some(window)) = (&self.config.qk_clip, &mut clip_window) {
                window.add(&qk_clip(task, clip)?);
            }
            clock.train_seconds += t0.elapsed().as_secs_f64();
            clock.units += units;
            clock.steps += 1;
            window_units += units;
            let step = self.step;
            if step.is_multiple_of(self.config.log_every) || step == self.config.steps {
                let window = window_start.elapsed().as_secs_f64().max(1e-9);
                let ups = window_units as f64 / window;
                let optimizers = self.optimizer_stats();
                sink(&Record::Train {
                    step,
                    loss: loss_value,
                    lr,
                    grad_norm,
                    units_per_second: ups,
                    seconds: clock.started.elapsed().as_secs_f64(),
                    optimizers,
                    qk_clip: clip_window.as_mut().map(std::mem::take),
                })?;
                bar.set_message(format!(
                    "loss {loss_value:.4} · {} {}/s",
                    human(ups),
                    task.unit()
                ));
                window_units = 0;
                window_start = Instant::now();
            }
            if step.is_multiple_of(self.config.eval_every) || step == self.config.steps {
                last_eval = Some(self.evaluate(task, &bar, sink)?);
                window_start = Instant::now();
            }
            if let Some(path) = checkpoint {
                let every = self.config.checkpoint_every;
                if step.is_multiple_of(every.max(1)) || step == self.config.steps {
                    self.save_checkpoint(path)?;
                }
            }
            bar.set_position(step);
        }
        bar.finish_and_clear();
        let outcome = if self.step >= self.config.steps {
            Outcome::Completed
        } else {
            if let Some(path) = checkpoint {
                self.save_checkpoint(path)?;
            }
            Outcome::Interrupted { step: self.step }
        };
        Ok(clock.summary(outcome, last_eval))
    }

    /// With `qk_clip`: turns the task's max-logit capture on (it stays on after the run, so
    /// the last step's record can be inspected; `Transformer::capture_max_logits(false)` turns
    /// it off) and opens an empty window; refuses a task without attention layers.
    fn start_qk_clip<T: Task>(&self, task: &T) -> Result<Option<QkClipStats>> {
        if self.config.qk_clip.is_none() {
            return Ok(None);
        }
        let model = task.transformer().ok_or_else(|| {
            ModelsError::config(
                "train.qk_clip",
                "needs a task with attention layers (`Task::transformer`)",
            )
        })?;
        model.capture_max_logits(true);
        Ok(Some(QkClipStats::default()))
    }

    /// One evaluation: the record goes to `sink`, a line to the progress bar.
    fn evaluate<T: Task>(
        &self,
        task: &mut T,
        bar: &ProgressBar,
        sink: &mut dyn FnMut(&Record) -> Result<()>,
    ) -> Result<Eval> {
        let record = self.eval_record(task)?;
        let Record::Eval { eval, heads, .. } = &record else {
            unreachable!("eval_record returns Record::Eval")
        };
        let eval = *eval;
        let extra = if heads.is_empty() {
            String::new()
        } else {
            let s = summarize(heads);
            format!(" κ(W_Q) {:.2} H {:.2}", s.kappa_wq, s.entropy)
        };
        bar.println(format!(
            "{} step {}: val loss {:.4}{}{extra}",
            self.label,
            self.step,
            eval.loss,
            eval.accuracy
                .map_or(String::new(), |a| format!(" acc {:.2}%", 100.0 * a))
        ));
        sink(&record)?;
        Ok(eval)
    }
}

/// QK-clip on every attention layer of the task, without gradient.
/// Checks a checkpoint's tensors against the run before any is used, and returns its step:
/// - `rng/seed` equals the run's seed;
/// - `trainer/step` lies in [0, `train.steps`] and `rng/counter` (the data order's position)
///   equals it;
/// - the model variables match the model's in names, count, shapes and kinds;
/// - every model variable and optimizer state is finite (a checkpoint of NaN weights would
///   resume into a diverged run).
///
/// The error says which check failed.
pub fn check_checkpoint(
    tensors: &HashMap<String, Tensor>,
    vars: &HashMap<String, Tensor>,
    seed: u64,
    config: &TrainConfig,
) -> std::result::Result<u64, String> {
    let int = |k: &str| -> std::result::Result<i64, String> {
        let t = tensors.get(k).ok_or_else(|| format!("`{k}` is missing"))?;
        t.f_int64_value(&[0])
            .map_err(|e| format!("`{k}` is not one integer: {e}"))
    };
    let found = int("rng/seed")? as u64;
    if found != seed {
        return Err(format!(
            "it was written by a run with seed {found}, this run has seed {seed}"
        ));
    }
    let step = int("trainer/step")?;
    if !(0..=config.steps as i64).contains(&step) {
        return Err(format!(
            "its step {step} lies outside [0, train.steps = {}]",
            config.steps
        ));
    }
    let counter = int("rng/counter")?;
    if counter != step {
        return Err(format!(
            "its data-order counter {counter} differs from its step {step}"
        ));
    }
    check_variables(tensors, vars)?;
    for (name, t) in tensors {
        let state = name.starts_with(CKPT_MODEL) || name.starts_with(CKPT_OPTIM);
        if state && t.is_floating_point() && !all_finite(t) {
            return Err(format!("`{name}` holds a NaN or an infinity"));
        }
    }
    Ok(step as u64)
}

/// The checkpoint's `model/` tensors are the model's variables: the same names and count, shapes
/// and kinds.
fn check_variables(
    tensors: &HashMap<String, Tensor>,
    vars: &HashMap<String, Tensor>,
) -> std::result::Result<(), String> {
    let in_file = tensors.keys().filter(|k| k.starts_with(CKPT_MODEL)).count();
    if in_file != vars.len() {
        return Err(format!(
            "it holds {in_file} model variables, the model has {}",
            vars.len()
        ));
    }
    for (name, var) in vars {
        let key = format!("{CKPT_MODEL}{name}");
        let src = tensors
            .get(&key)
            .ok_or_else(|| format!("`{key}` is missing"))?;
        if src.size() != var.size() || src.kind() != var.kind() {
            return Err(format!(
                "`{name}` is {:?} {:?} in the file and {:?} {:?} in the model",
                src.size(),
                src.kind(),
                var.size(),
                var.kind()
            ));
        }
    }
    Ok(())
}

/// Whether every entry of `t` is finite (false when libtorch cannot tell).
fn all_finite(t: &Tensor) -> bool {
    t.f_isfinite()
        .and_then(|f| f.f_all())
        .and_then(|a| a.f_int64_value(&[]))
        .is_ok_and(|v| v == 1)
}

/// A run-folder error met while writing a checkpoint, as the trainer's error.
fn err_of_run(path: &Path, e: crate::RunError) -> ModelsError {
    ModelsError::Checkpoint {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

fn qk_clip<T: Task>(task: &T, clip: &QkClipConfig) -> Result<Vec<QkClipReport>> {
    match task.transformer() {
        Some(model) => tch::no_grad(|| model.clip_qk(clip)),
        None => Ok(Vec::new()),
    }
}

/// Stops a run as diverged: the record goes to `sink`, the progress bar keeps the reason.
fn diverge(
    bar: &ProgressBar,
    sink: &mut dyn FnMut(&Record) -> Result<()>,
    step: u64,
    reason: String,
    clock: &Clock,
    last_eval: Option<Eval>,
) -> Result<Summary> {
    bar.abandon_with_message(format!("diverged at step {step}: {reason}"));
    sink(&Record::Diverged {
        step,
        reason: reason.clone(),
    })?;
    Ok(clock.summary(Outcome::Diverged { step, reason }, last_eval))
}

fn human(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    /// A leaf parameter equal to `p` whose gradient is exactly `g` (the gradient of ⟨p, g⟩).
    fn param_with_grad(p: &Tensor, g: &Tensor) -> Tensor {
        let p = p.copy().set_requires_grad(true);
        (&p * g).sum(p.kind()).backward();
        p
    }

    #[test]
    fn the_adamw_state_round_trips_through_safetensors_fresh_stepped_and_in_the_old_format() {
        let dir = std::env::temp_dir().join(format!("kappa-adamw-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("state.safetensors");
        let round_trip = |opt: &AdamWGroup| {
            Tensor::write_safetensors(&opt.state(), &file).unwrap();
            let saved: HashMap<String, Tensor> = Tensor::read_safetensors(&file)
                .unwrap()
                .into_iter()
                .collect();
            let mut back = AdamWGroup::new(AdamWConfig::torch());
            back.load_state(&saved).unwrap();
            back
        };
        // Before the first step: no moments, and the next step starts them.
        let fresh = AdamWGroup::new(AdamWConfig::torch());
        assert!(round_trip(&fresh).states.is_empty());
        let cpu = (Kind::Float, Device::Cpu);
        let g = Tensor::from_slice(&[1.0f32, -2.0]);
        let params = [
            param_with_grad(&Tensor::ones([2], cpu), &g),
            Tensor::zeros([3], cpu).set_requires_grad(true),
        ];
        let mut opt = AdamWGroup::new(AdamWConfig::torch());
        tch::no_grad(|| opt.step(&params, 1e-2)).unwrap();
        let back = round_trip(&opt);
        assert_eq!(back.states.len(), 2);
        assert_eq!((back.states[0].steps(), back.states[1].steps()), (1, 0));
        assert!(back.states[0]
            .exp_avg()
            .unwrap()
            .equal(opt.states[0].exp_avg().unwrap()));
        assert!(back.states[1].exp_avg().is_none());
        // The earlier format: one step count `t` for the group.
        let mut old = HashMap::new();
        old.insert("t".to_string(), Tensor::from_slice(&[4i64]));
        old.insert("exp_avg.0".to_string(), Tensor::zeros([2], cpu));
        old.insert("exp_avg_sq.0".to_string(), Tensor::zeros([2], cpu));
        let mut legacy = AdamWGroup::new(AdamWConfig::torch());
        legacy.load_state(&old).unwrap();
        assert_eq!(legacy.states.len(), 1);
        assert_eq!(legacy.states[0].steps(), 4);
        old.remove("exp_avg_sq.0");
        assert!(legacy.load_state(&old).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn dropped_gradients_are_undefined_and_the_clip_norm_matches_libtorch() {
        let cpu = (Kind::Float, Device::Cpu);
        let (a, b) = seeded(2, || {
            (Tensor::randn([300, 70], cpu), Tensor::randn([9], cpu))
        });
        let params = [param_with_grad(&a, &(&a * 3.0)), param_with_grad(&b, &b)];
        let want = tch::no_grad(|| {
            let g: f64 = params
                .iter()
                .map(|p| {
                    p.grad()
                        .to_kind(Kind::Double)
                        .square()
                        .sum(Kind::Double)
                        .double_value(&[])
                })
                .sum();
            g.sqrt()
        });
        let before: Vec<Tensor> = params.iter().map(|p| p.grad().copy()).collect();
        let norm = tch::no_grad(|| clip_grad_norm(&params, 1.0)).unwrap();
        // Two f64 sums of the same exact squares in different orders: ≤ n·2⁻⁵³ relative each.
        let n = (300 * 70 + 9) as f64;
        assert!(
            (norm - want).abs() <= 2.0 * n * f64::powi(2.0, -53) * want,
            "{norm} {want}"
        );
        let scale = 1.0 / (norm + 1e-6);
        for (p, g) in params.iter().zip(&before) {
            assert!(p.grad().equal(&(g * scale)));
        }
        let dropper = GradientDropper::new(&params).unwrap();
        dropper.drop_gradients().unwrap();
        assert!(params.iter().all(|p| !p.grad().defined()));
        // The next backward pass stores a fresh gradient (not added to an old one).
        (&params[1] * 2.0).sum(Kind::Float).backward();
        assert!(params[1].grad().equal(&Tensor::full([9], 2.0, cpu)));
    }
}
