//! The training loop every experiment uses: a validated TOML config, deterministic CPU runs,
//! kappa-optim's optimizer over parameter groups (AdamW by default), warmup + cosine learning rate, gradient
//! clipping, periodic evaluation with attention diagnostics, `metrics.jsonl` records,
//! safetensors checkpoints with exact resume, divergence detection and a progress bar.
//!
//! # The step
//!
//! For step index i = 0, 1, … (the (i+1)-th optimizer update):
//!
//! 1. Each group of the [`Optimizer`] runs at its own peak lr times the schedule's factor
//!    ([`kappa_optim::WarmupCosine`], [`TrainConfig::schedule`]): f(i) = (i+1)/(w+1) for i < w
//!    (warmup), then f(i) = m + (1 − m)·½(1 + cos(π·(i−w)/(S−w))) with m = min_lr/lr (cosine to
//!    m at step S). The groups at `lr` thus get lr(i) = min_lr + ½(1 + cos(…))·(lr − min_lr)
//!    ([`TrainConfig::lr_at`], the `lr` of training records).
//! 2. Gradients are dropped ([`Optimizer::zero_grad`], PyTorch's `zero_grad(set_to_none=True)`); the
//!    forward pass runs in f32, or under bf16 autocast with [`TrainPrecision::Bf16`]
//!    ([`kappa_models::autocast`]). loss = task loss on the batch of step i (a pure function of
//!    (seed, i); in parts with micro-batches or several ranks, see below); a non-finite loss
//!    stops the run as diverged, and so does a loss above
//!    `divergence_factor` × its reference ([`DivergenceReference`]: the first step's loss, or the
//!    best smoothed loss so far).
//! 3. Backward; ‖g‖ = (Σ‖g_p‖²)^{1/2} over every trainable tensor, in f64; if `grad_clip` > 0
//!    and ‖g‖ > clip, every gradient is scaled by clip/(‖g‖ + 1e-6) (PyTorch's
//!    `clip_grad_norm_`; [`Optimizer::clip_grad_norm`]). A non-finite ‖g‖ stops the run as
//!    diverged.
//! 4. [`Optimizer::step`] updates every group's tensors in place under `no_grad`. AdamW groups
//!    ([`adamw_groups`]) run kappa-optim's [`AdamW`](kappa_optim::AdamW), PyTorch's
//!    `torch.optim.AdamW`:
//!    p ← p(1 − lr·wd); m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²;
//!    p ← p − (lr/(1−β₁ᵗ))·m/(√v/√(1−β₂ᵗ) + ε), by default in one pass over the raw data of
//!    contiguous CPU f32 tensors ([`kappa_optim::AdamWKernel::Fused`]), each element in f64 and
//!    rounded once per stored value; with libtorch operations elsewhere
//!    ([`kappa_optim::AdamWKernel::Ops`]). Muon and manifold-Muon groups come from
//!    [`modulewise_groups`](crate::modulewise_groups).
//! 5. The task refreshes its spectral corrections (SVD, scale-aware λ) for the new weights.
//! 6. With `qk_clip` (off by default), QK-clip (Kimi K2's MuonClip, [`kappa_optim::qk_clip`]):
//!    the training forward captured every attention layer's input; for each layer, the
//!    per-head max logit S_h of that input with the **updated** weights is measured, and every
//!    head with S_h > τ has its effective query and key projections scaled by (τ/S_h)^α and
//!    (τ/S_h)^{1−α} ([`kappa_models::ConditionedAttention::clip_qk`]), so that afterwards every
//!    head's max logit on the step's layer inputs is τ at most. Whatever the groups'
//!    optimizers (AdamW, Muon, manifold Muon): on a manifold-constrained W_Q/W_K the rescale
//!    leaves the manifold and the group's next retraction brings W back (docs/train.md,
//!    "QK-clip"). Training records carry the window's largest measured logit and clipped-head
//!    count ([`QkClipStats`]).
//!
//! Training records carry each group's [`OptimizerStats`] (dual-ascent iterations and
//! violations for manifold Muon); evaluation records carry per-head attention diagnostics and,
//! with `matrix_diagnostics`, the spectrum of every hidden matrix ([`MatrixDiagnostics`]).
//!
//! # Data parallelism and micro-batches
//!
//! A step's batch (`batch_size` examples, a pure function of (seed, step)) is cut into P equal
//! runs of consecutive examples, its parts ([`Part`]): P = `batch_size / micro_batch_size`, or
//! the number of ranks W when `micro_batch_size` is 0. On W ranks ([`Trainer::data_parallel`],
//! over a kappa-dist [`Communicator`]) rank r takes parts r·P/W .. (r+1)·P/W, so what a rank
//! reads is a pure function of (seed, step, rank, P/W), and the batch as a whole does not depend
//! on W. Each rank runs forward and backward on its parts in turn (libtorch adds each part's
//! gradient to the sum of the previous ones), then:
//!
//! - loss = (Σ over ranks, in rank order, of Σ over the rank's parts, in part order, of the
//!   part's loss) / P, in f64: the same on every rank, so the divergence check decides the same
//!   everywhere;
//! - every gradient g ← (Σ_r g_r) / P: the ranks' sums added in rank order in their kind (f32),
//!   then divided once ([`kappa_dist::rules`]), before clipping, so ‖g‖ and the clip are the
//!   average's;
//! - every rank runs the optimizer step on the same gradients (Muon's and manifold Muon's
//!   blocks sharded over the ranks, below).
//!
//! With P = 1 (one rank and `micro_batch_size` 0 or `batch_size`) none of this adds an
//! operation. The sum of two parts is part 0 + part 1 however they fall to ranks, so 2 ranks
//! reproduce 1 rank with 2 micro-batches bit for bit. With more parts the grouping depends on
//! W: for P = 4, W = 1 and W = 4 both sum ((p₀ + p₁) + p₂) + p₃ while W = 2 sums
//! (p₀ + p₁) + (p₂ + p₃), which can differ in the last bit of a gradient element (float
//! addition is not associative); such runs agree to rounding, not bit for bit.
//!
//! **Optimizer state is replicated.** Every rank holds all of it (AdamW's moments, Muon's
//! momentum, NorMuon's second moments) and ends every step with the same weights. On more than
//! one rank the orthogonalizations are sharded ([`Optimizer::shard`]): each batch of same-shape
//! Muon or manifold-Muon blocks is split over the ranks, each rank steps its part, then every
//! block's new weight and state is gathered from the rank that stepped it, so each rank runs
//! about 1/W of the Newton–Schulz iterations (AdamW groups are stepped whole on every rank). The
//! price of replication is memory (each rank holds the whole state) and the exchange of the
//! momenta with the weights; the gain is that a checkpoint is the same as a one-process run's:
//! rank 0's weights and state, nothing per rank. A run saved on W ranks resumes on any W' that
//! divides P, bit for bit where the grouping of the sum is the same (W and W' in {1, P}, or
//! P = 2), to rounding otherwise. Every rank reads the same checkpoint file to resume.
//!
//! Rank 0 alone sends records to the sink, writes checkpoints and shows progress. Every rank
//! evaluates (the same model on the same validation batches, so none waits for another's
//! evaluation). Before each step the ranks add up their [`StopFlag`]s, so a SIGTERM that reaches
//! one rank stops all of them after the same step, with rank 0's checkpoint. A rank that fails
//! (an error, a panic) drops its communicator and the others fail at their next collective, an
//! error naming it, instead of waiting; the communicator's timeout bounds the wait for one that
//! stalls. QK-clip needs P = 1: it measures the logits of the step's one forward pass. For the
//! masked language model each part's loss is the mean over its own masked positions, so parts
//! weigh equally whatever their counts of masked positions.
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
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use kappa_dist::{Communicator, DistError, Single};
pub use kappa_optim::optimizer::OptimizerStats;
use kappa_optim::optimizer::{Group, Grouping, Optimizer, Rule, Update};
use kappa_optim::{AdamWConfig, WarmupCosine};
use serde::{Deserialize, Serialize};
use tch::{nn, Tensor};

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
    /// Examples (sequences or images) per step, over all ranks of a data-parallel run.
    pub batch_size: usize,
    /// Examples per forward pass (0: the whole batch of a rank, `batch_size` / ranks). A smaller
    /// value cuts the batch into `batch_size / micro_batch_size` parts (it must divide
    /// `batch_size`), each rank taking an equal run of consecutive parts and summing their
    /// gradients before the step (gradient accumulation); see "Data parallelism and
    /// micro-batches" in [the module docs](self).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub micro_batch_size: usize,
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
            micro_batch_size: 0,
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

fn is_zero(n: &usize) -> bool {
    *n == 0
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
        let micro = self.micro_batch_size;
        if micro > 0 && !self.batch_size.is_multiple_of(micro) {
            return bad(
                "micro_batch_size",
                format!(
                    "must divide batch_size = {} (or be 0: the whole batch of a rank), found \
                     {micro}",
                    self.batch_size
                ),
            );
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
        if self.qk_clip.is_some() && micro > 0 && micro < self.batch_size {
            return bad(
                "qk_clip",
                format!(
                    "measures the logits of a step's one forward pass, so it needs the whole \
                     batch in one (micro_batch_size 0 or batch_size = {}), found \
                     micro_batch_size {micro}",
                    self.batch_size
                ),
            );
        }
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

    /// The parts a step's batch is cut into on `world` ranks: `batch_size / micro_batch_size`,
    /// or `world` when `micro_batch_size` is 0 (one forward pass per rank). Errors name
    /// `train.batch_size` when the parts do not fall evenly to the ranks, and `train.qk_clip`
    /// when there is more than one part (QK-clip measures a step's one forward pass).
    pub fn parts(&self, world: usize) -> Result<usize> {
        let (b, micro) = (self.batch_size, self.micro_batch_size);
        let parts = if micro == 0 { world } else { b / micro.max(1) };
        if world == 0 || !parts.is_multiple_of(world) || !b.is_multiple_of(parts.max(1)) {
            let unit = if micro == 0 {
                format!("the {world} ranks")
            } else {
                format!("{world} ranks × micro_batch_size {micro}")
            };
            return Err(ModelsError::config(
                "train.batch_size",
                format!("must be a multiple of {unit}, found {b}"),
            ));
        }
        if self.qk_clip.is_some() && parts > 1 {
            return Err(ModelsError::config(
                "train.qk_clip",
                format!(
                    "measures the logits of a step's one forward pass, so it runs on one rank \
                     without micro-batches; this step has {parts} parts"
                ),
            ));
        }
        Ok(parts)
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

/// A kappa-optim error as [`ModelsError::Optimizer`].
pub(crate) fn optim_err(e: kappa_optim::OptimError) -> ModelsError {
    ModelsError::Optimizer(e.to_string())
}

/// A collective's error (a data-parallel step's weight broadcast, loss or gradient average or
/// stop agreement) as [`ModelsError::Collective`].
pub(crate) fn dist_err(e: DistError) -> ModelsError {
    ModelsError::Collective(e.to_string())
}

/// Whether a variable is one of kappa's embeddings (never weight-decayed): its last name
/// component is `wte`, `wpe`, `pos_embed` or `cls_token` ([`EMBEDDINGS`]).
pub fn is_embedding(name: &str) -> bool {
    EMBEDDINGS
        .iter()
        .any(|p| kappa_optim::optimizer::rules::matches(p, name))
}

/// The name patterns of kappa's embeddings (kappa-optim's glob patterns).
pub const EMBEDDINGS: &[&str] = &[
    "wte",
    "*.wte",
    "wpe",
    "*.wpe",
    "pos_embed",
    "*.pos_embed",
    "cls_token",
    "*.cls_token",
];

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

/// The default grouping: `decay` (tensors of rank ≥ 2 other than [`EMBEDDINGS`], AdamW with
/// the config's weight decay) and `no_decay` (gains, biases, embeddings; AdamW without decay),
/// both at the config's peak `lr`.
pub fn adamw_grouping(cfg: &TrainConfig) -> Grouping {
    Grouping::new()
        .rule(
            Rule::adamw("decay", cfg.adamw(cfg.weight_decay), cfg.lr)
                .ranks(2, usize::MAX)
                .except(EMBEDDINGS.iter().copied()),
        )
        .rule(Rule::adamw("no_decay", cfg.adamw(0.0), cfg.lr))
}

/// The groups of [`adamw_grouping`] over the trainable variables of `vs`.
pub fn adamw_groups(vs: &nn::VarStore, cfg: &TrainConfig) -> Result<Vec<Group>> {
    adamw_grouping(cfg)
        .assign(vs.variables())
        .map_err(optim_err)
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

/// Which part of a step's batch a forward pass takes: the batch of `batch_size` examples (a
/// pure function of the seed and the step) cut into `count` equal runs of consecutive
/// examples, and run `index` of them: examples index·b/count .. (index+1)·b/count, with
/// b = `batch_size` a multiple of `count` ([`TrainConfig::parts`] checks it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// Which run, in `0..count`.
    pub index: usize,
    /// How many runs.
    pub count: usize,
}

impl Part {
    /// The whole batch.
    pub const WHOLE: Part = Part { index: 0, count: 1 };

    /// The examples of this part of a batch of `batch_size`.
    pub fn range(&self, batch_size: usize) -> std::ops::Range<usize> {
        let len = batch_size / self.count.max(1);
        self.index * len..(self.index + 1) * len
    }

    /// This part's rows (dimension 0) of a batch tensor of `batch_size` rows: the tensor itself
    /// for the whole batch, a view otherwise.
    pub fn take(&self, batch: &Tensor, batch_size: usize) -> Result<Tensor> {
        if self.count == 1 {
            return Ok(batch.shallow_clone());
        }
        let range = self.range(batch_size);
        Ok(batch.f_narrow(0, range.start as i64, range.len() as i64)?)
    }
}

/// What a training run optimizes: a model, its data and its loss.
pub trait Task {
    /// What the throughput counts (`tokens`, `images`).
    fn unit(&self) -> &'static str;
    /// The loss of part `part` of the training batch of step index `step` (with its graph:
    /// the mean over the part's examples) and the number of units in the part. The batch is
    /// a pure function of the seed and `step`, the same whatever the part, so the parts of the
    /// ranks of a data-parallel run ([`Part`]) tile it.
    fn train_loss(&mut self, step: u64, batch_size: usize, part: Part) -> Result<(Tensor, u64)>;
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
    optimizer: Optimizer,
    step: u64,
    first_loss: Option<f64>,
    loss_ema: Option<f64>,
    best_ema: Option<f64>,
    stop_after: Option<u64>,
    stop: StopFlag,
    label: String,
    /// The ranks of a data-parallel run ([`Trainer::data_parallel`]; one process by default).
    comm: Arc<dyn Communicator>,
    /// The parts of every step's batch ([`TrainConfig::parts`] at the world size).
    parts: usize,
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
        let groups = adamw_groups(vs, &config)?;
        Self::with_groups(vs, config, groups, context)
    }

    /// A trainer whose kappa-optim [`Optimizer`] is built over `groups` after the context's
    /// thread count is applied (manifold groups retract their weights onto the manifold then);
    /// see [`Trainer::with_optimizer`].
    pub fn with_groups(
        vs: &'a nn::VarStore,
        config: TrainConfig,
        groups: Vec<Group>,
        context: &RunContext,
    ) -> Result<Self> {
        config.validate()?;
        context.apply_threads();
        let optimizer = Optimizer::new(groups).map_err(optim_err)?;
        Self::with_optimizer(vs, config, optimizer, context)
    }

    /// A trainer that steps `optimizer` (its schedule replaced by the config's warmup-cosine
    /// schedule; it must not have stepped yet). Every trainable variable of `vs` must be in it.
    pub fn with_optimizer(
        vs: &'a nn::VarStore,
        config: TrainConfig,
        mut optimizer: Optimizer,
        context: &RunContext,
    ) -> Result<Self> {
        config.validate()?;
        let placed: std::collections::HashSet<&str> = optimizer.params().map(|(n, _)| n).collect();
        let trainable = named_trainable(vs);
        if let Some((n, _)) = trainable.iter().find(|(n, _)| !placed.contains(n.as_str())) {
            return Err(ModelsError::config(
                "groups",
                format!("trainable variable `{n}` is in no group"),
            ));
        }
        if optimizer.steps() != 0 {
            return Err(ModelsError::Optimizer(format!(
                "the optimizer has taken {} steps; a trainer starts from a fresh one",
                optimizer.steps()
            )));
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
        optimizer.set_schedule(config.schedule());
        let parts = config.parts(1)?;
        Ok(Self {
            vs,
            config,
            seed: context.seed,
            progress: context.progress,
            optimizer,
            step: 0,
            first_loss: None,
            loss_ema: None,
            best_ema: None,
            stop_after: None,
            stop: context.stop.clone(),
            label: String::from("train"),
            comm: Arc::new(Single),
            parts,
        })
    }

    /// Makes this trainer one rank of a data-parallel run over `comm`'s group. Every rank
    /// builds the same task and trainer and calls this before training (after
    /// [`Trainer::load_checkpoint`] when resuming: every rank loads the same checkpoint);
    /// then rank 0's variables (weights and buffers) are copied to every rank, so all start from
    /// one model whatever their initialization. Training then gives each rank its parts of
    /// every batch and averages the gradients over the ranks, and, on more than one rank, the
    /// optimizer's Muon and manifold-Muon blocks are sharded over them ([`Optimizer::shard`]);
    /// rank 0 alone sends records to the sink, writes checkpoints and shows progress (see "Data
    /// parallelism and micro-batches" in [the module docs](self)).
    ///
    /// Errors: a batch that does not split evenly over the ranks ([`TrainConfig::parts`],
    /// naming `train.batch_size`), and a collective that fails (a rank that left, disagreed
    /// or stalled past its communicator's timeout).
    pub fn data_parallel(&mut self, comm: Arc<dyn Communicator>) -> Result<()> {
        let parts = self.config.parts(comm.world())?;
        let mut vars: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, var) in &mut vars {
            comm.broadcast(var, 0).map_err(dist_err)?;
        }
        self.optimizer.shard(Arc::clone(&comm));
        (self.comm, self.parts) = (comm, parts);
        Ok(())
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
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
        for (k, t) in self.optimizer.state_dict().map_err(optim_err)? {
            named.push((format!("{CKPT_OPTIM}{k}"), t));
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
        let state: HashMap<String, Tensor> = tensors
            .iter()
            .filter_map(|(k, t)| {
                let key = k.strip_prefix(CKPT_OPTIM)?;
                Some((key.to_string(), t.shallow_clone()))
            })
            .collect();
        if !state.contains_key("step") {
            return Err(err(format!(
                "it has no `{CKPT_OPTIM}step`: its optimizer state is in the layout of an \
                 earlier kappa version, which this one cannot resume (start the run over)"
            )));
        }
        let optimizer_steps = state["step"].f_int64_value(&[0]).ok();
        if optimizer_steps != Some(step as i64) {
            return Err(err(format!(
                "its optimizer's `{CKPT_OPTIM}step` ({optimizer_steps:?}) is not its step {step}"
            )));
        }
        // The optimizer checks its whole state before it changes anything; then the weights.
        self.optimizer
            .load_state_dict(&state)
            .map_err(|e| err(e.to_string()))?;
        let vars = self.vs.variables();
        tch::no_grad(|| -> Result<()> {
            for (name, var) in &vars {
                var.shallow_clone()
                    .f_copy_(&tensors[&format!("{CKPT_MODEL}{name}")])?;
            }
            Ok(())
        })?;
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
        if !self.progress || self.comm.rank() != 0 {
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
        for (name, p) in self.optimizer.params() {
            if p.dim() == 2 && !is_embedding(name) {
                out.push(matrix_diagnostics(name, p, MATRIX_SINGULAR_VALUES)?);
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

    /// The statistics of each Muon and manifold-Muon group since the last call.
    fn optimizer_stats(&mut self) -> BTreeMap<String, OptimizerStats> {
        let matrices: Vec<bool> = (self.optimizer.groups().iter())
            .map(|g| !matches!(g.update(), Update::AdamW(_)))
            .collect();
        let stats = self.optimizer.take_stats().into_iter().zip(matrices);
        stats.filter_map(|(s, m)| m.then_some(s)).collect()
    }

    /// Trains from the current step to the config's `steps` (or to [`Trainer::stop_after`], or
    /// the step after the context's [`StopFlag`] is raised on any rank), sending every record to
    /// `sink`; writes checkpoints to `checkpoint` when given (always when it stops early). On a
    /// data-parallel run ([`Trainer::data_parallel`]) only rank 0 sends records and writes
    /// checkpoints, and every rank returns once the last checkpoint is written.
    pub fn run<T: Task>(
        &mut self,
        task: &mut T,
        sink: &mut dyn FnMut(&Record) -> Result<()>,
        checkpoint: Option<&Path>,
    ) -> Result<Summary> {
        let first = self.comm.rank() == 0;
        let checkpoint = checkpoint.filter(|_| first);
        let mut first_only = |r: &Record| if first { sink(r) } else { Ok(()) };
        let sink: &mut dyn FnMut(&Record) -> Result<()> = &mut first_only;
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
        if self.optimizer.steps() != self.step {
            return Err(ModelsError::Optimizer(format!(
                "the optimizer took {} steps, the trainer {}",
                self.optimizer.steps(),
                self.step
            )));
        }
        let mut clip_window = self.start_qk_clip(&*task)?;
        if self.config.eval_at_start && self.step == 0 && end > 0 {
            last_eval = Some(self.evaluate(task, &bar, sink)?);
        }
        let schedule = self.config.schedule();
        while self.step < end && !self.agree_stop()? {
            let i = self.step;
            let t0 = Instant::now();
            let lr = schedule.lr(self.config.lr, i);
            self.optimizer.zero_grad().map_err(optim_err)?;
            let (loss_value, units) = self.forward_backward(task, i)?;
            if let Some(reason) = self.check_loss(loss_value) {
                return diverge(&bar, sink, i, reason, &clock, last_eval);
            }
            self.average_gradients()?;
            let clip = self.config.grad_clip;
            let grad_norm = self.optimizer.clip_grad_norm(clip).map_err(optim_err)?;
            if !grad_norm.is_finite() {
                let reason = format!("gradient norm is {grad_norm}");
                return diverge(&bar, sink, i, reason, &clock, last_eval);
            }
            self.optimizer.step().map_err(optim_err)?;
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
        if self.comm.world() > 1 {
            self.comm.barrier().map_err(dist_err)?;
        }
        Ok(clock.summary(outcome, last_eval))
    }

    /// Where the flags and losses the ranks exchange live: the communicator's device (the
    /// GPU over NCCL), else the CPU.
    fn exchange_device(&self) -> tch::Device {
        self.comm.tensor_device().unwrap_or(tch::Device::Cpu)
    }

    /// Whether to stop before the next step: the [`StopFlag`] is raised on any rank (all ranks
    /// agree, so they stop at the same step).
    fn agree_stop(&self) -> Result<bool> {
        let raised = self.stop.is_raised();
        if self.comm.world() == 1 {
            return Ok(raised);
        }
        let mut any =
            Tensor::from_slice(&[i64::from(raised)]).f_to_device(self.exchange_device())?;
        self.comm.all_reduce_sum(&mut any).map_err(dist_err)?;
        Ok(any.f_int64_value(&[0])? > 0)
    }

    /// The forward and backward passes of step `i` on this rank's parts of the batch (its
    /// gradients end as their sum, libtorch accumulating them in part order), and the step's
    /// loss and units over every rank: the mean of every part's loss (summed in f64, in part
    /// order within a rank, then over the ranks in rank order), the same on every rank.
    fn forward_backward<T: Task>(&self, task: &mut T, i: u64) -> Result<(f64, u64)> {
        let (world, batch) = (self.comm.world(), self.config.batch_size);
        let mine = self.parts / world;
        let mut losses = Vec::with_capacity(mine);
        let mut units = 0;
        for k in 0..mine {
            let part = Part {
                index: self.comm.rank() * mine + k,
                count: self.parts,
            };
            let (loss, n) = match self.config.precision {
                TrainPrecision::F32 => task.train_loss(i, batch, part)?,
                TrainPrecision::Bf16 => kappa_models::autocast::autocast(self.vs.device(), || {
                    task.train_loss(i, batch, part)
                })?,
            };
            losses.push(loss.double_value(&[]));
            units += n;
            loss.f_backward()?;
        }
        let mine_sum = losses.into_iter().reduce(|a, b| a + b).unwrap_or(0.0);
        if self.parts == 1 {
            return Ok((mine_sum, units));
        }
        let mut sum = Tensor::from_slice(&[mine_sum]).f_to_device(self.exchange_device())?;
        self.comm.all_reduce_sum(&mut sum).map_err(dist_err)?;
        let loss = sum.f_double_value(&[0])? / self.parts as f64;
        Ok((loss, units * world as u64))
    }

    /// Every gradient ← (the sum of its parts over every rank) / parts: the sum over the ranks
    /// in rank order (one flat buffer per element kind, in the optimizer's parameter order),
    /// then one division. Nothing with one part.
    fn average_gradients(&self) -> Result<()> {
        if self.parts == 1 {
            return Ok(());
        }
        let _guard = tch::no_grad_guard();
        let parts = self.parts as f64;
        let mut grads: Vec<Tensor> = (self.optimizer.params())
            .map(|(_, p)| p.grad())
            .filter(Tensor::defined)
            .collect();
        if self.comm.world() == 1 {
            for g in &mut grads {
                let _ = g.f_div_scalar_(parts)?;
            }
            return Ok(());
        }
        let mut kinds: Vec<tch::Kind> = Vec::new();
        for g in &grads {
            if !kinds.contains(&g.kind()) {
                kinds.push(g.kind());
            }
        }
        for kind in kinds {
            let mut same: Vec<&mut Tensor> =
                grads.iter_mut().filter(|g| g.kind() == kind).collect();
            let flat: Vec<Tensor> = same
                .iter()
                .map(|g| g.f_reshape([-1]))
                .collect::<std::result::Result<_, _>>()?;
            let mut flat = Tensor::f_cat(&flat, 0)?;
            self.comm.all_reduce_sum(&mut flat).map_err(dist_err)?;
            let _ = flat.f_div_scalar_(parts)?;
            let mut offset = 0;
            for g in &mut same {
                let n = g.numel() as i64;
                let average = flat.f_narrow(0, offset, n)?.f_view_as(g)?;
                g.f_copy_(&average)?;
                offset += n;
            }
        }
        Ok(())
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
