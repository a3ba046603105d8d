//! "manifolds": *Different Layers, Different Manifolds* on a GPT — the paper's five module-wise
//! assignments (UNCONSTRAINED, ALL-STIEFEL, ALL-DGRAM, HETERO, HETERO-INV) trained with the
//! paper's optimizers and schedule, with the instability mechanism the paper argued measured
//! while training: σ_max of the constrained matrices, σ_max(W_Q)·σ_max(W_K) per head, the largest
//! attention logit, attention entropy and the softmax-Jacobian norm, and the dual ascent's own
//! statistics. Ablations on the first seed: DGram attention with the normalized dual, a lower
//! lr, the column-norm retraction, and (with its Stiefel twin) four times the lr.
//!
//! A diverged variant is a result: its `metrics.jsonl` ends with the divergence record and its
//! summary, and the report prints "diverged at step N" where the paper's table says "Unstable".

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use kappa_models::{GptConfig, TextCorpus, TokenizerKind};
use kappa_train::{
    modulewise_groups, train_language_model, MetricsLine, ModuleLabel, ModulewiseConfig,
    OptimizerStats, Outcome, Preset, Record, TrainConfig, VariantId,
};
use serde::{Deserialize, Serialize};
use tch::nn;

use crate::plot::{LinePlot, Mark};
use crate::report::cells::{over_seeds, MISSING};
use crate::report::variants::{read_variants, Variants};
use crate::report::{opened, Figures, Section};
use crate::run::{Run, RunRecord, RunStatus};
use crate::stats::{mean, mean_std, per_step};
use crate::Experiment;

/// The experiment (registered as `manifolds`).
pub struct Manifolds;

/// One trained configuration: a preset's assignment, possibly modified (an ablation).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// Table label.
    pub name: String,
    /// The paper's assignment it starts from.
    pub preset: Preset,
    /// The optimizers of the hidden matrices.
    pub modulewise: ModulewiseConfig,
    /// Ablations run on the first seed only.
    pub ablation: bool,
}

/// What `manifolds` runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The model; `vocab_size` 0 takes the tokenizer's.
    pub model: GptConfig,
    /// Characters or GPT-2 BPE of the SOTU text.
    pub tokenizer: TokenizerKind,
    /// Keep at most this many characters of each split.
    pub max_chars: Option<usize>,
    /// Training settings; `lr` is the AdamW peak (embeddings, gains), the Muon peak is each
    /// variant's `muon_lr`.
    pub train: TrainConfig,
    /// The variants, UNCONSTRAINED first.
    pub variants: Vec<Variant>,
    /// Validation batches for the final validation loss.
    pub final_eval_batches: usize,
    /// libtorch intra-op threads (0: the run's `--threads`). The CPU config uses 1 and steps the
    /// hidden matrices on 2 worker threads instead (`optimizer_threads`): these matrices are
    /// small, and libtorch's SVD (the paper's DGram retraction) on 2 OpenMP threads was
    /// measured 35× slower than on 1 on a loaded 2-core machine (1.7 s against 47 ms per step
    /// of a 256×64 matrix), while one OpenMP thread per worker keeps both cores busy.
    #[serde(default)]
    pub libtorch_threads: usize,
}

impl Experiment for Manifolds {
    type Config = Config;

    fn name(&self) -> &'static str {
        "manifolds"
    }

    fn claim(&self) -> &'static str {
        "Module-wise geometry matters: Stiefel attention with DGram MLPs (HETERO) trains a GPT \
         best (paper, GPT-2 small: 3.3544 against 3.3679 ALL-STIEFEL and 3.3855 UNCONSTRAINED), \
         while DGram on attention (ALL-DGRAM, HETERO-INV) is unstable through singular-value \
         growth and softmax saturation."
    }

    fn data_needs(&self) -> &'static [&'static str] {
        &["sotu"]
    }

    fn continues_interrupted_runs(&self) -> bool {
        true
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn validate(&self, c: &Config) -> Result<()> {
        anyhow::ensure!(!c.variants.is_empty(), "variants: need at least one");
        // The tokenizer sets the vocabulary when `vocab_size` is 0.
        GptConfig {
            vocab_size: c.model.vocab_size.max(1),
            ..c.model
        }
        .validate()?;
        c.train.validate()?;
        for (i, variant) in c.variants.iter().enumerate() {
            variant
                .modulewise
                .validate()
                .with_context(|| format!("variants.{i} ({:?})", variant.name))?;
        }
        anyhow::ensure!(c.final_eval_batches >= 1, "final_eval_batches: must be ≥ 1");
        Ok(())
    }

    fn run(&self, config: &Config, run: &mut Run) -> Result<RunStatus> {
        if config.libtorch_threads > 0 {
            run.pin_threads(config.libtorch_threads);
        }
        let first_seed = run.context().seed == 0;
        for (i, variant) in config.variants.iter().enumerate() {
            if variant.ablation && !first_seed {
                continue;
            }
            train_variant(run, config, i, variant)
                .with_context(|| format!("variant {}", variant.name))?;
        }
        Ok(RunStatus::Completed)
    }

    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        report(self, runs, out_dir, report_dir)
    }
}

/// Trains `variant` (with `config`'s model, text and training settings) as variant `index` of
/// `run`: its hidden matrices by the variant's module-wise assignment, the embeddings and gains by
/// AdamW; its metric is the final validation loss. (The caller pins `libtorch_threads`.)
pub fn train_variant(
    run: &mut Run,
    config: &Config,
    index: usize,
    variant: &Variant,
) -> Result<Outcome> {
    let train = TrainConfig {
        // The embeddings' decay is the assignment's; gains never decay.
        weight_decay: 0.0,
        ..config.train.clone()
    };
    let device = kappa_models::parse_device(&run.context().device)?;
    let dir = run.context().data_dir.join(TextCorpus::SOTU);
    let corpus = TextCorpus::load_sotu(&dir, config.tokenizer, config.max_chars, device)?;
    let id = VariantId {
        index,
        name: &variant.name,
    };
    let groups = |vs: &nn::VarStore| Ok(modulewise_groups(vs, &variant.modulewise, &train)?);
    train_language_model::<anyhow::Error>(
        run,
        id,
        &train,
        config.model,
        corpus,
        groups,
        config.final_eval_batches,
    )
}

/// One evaluation's headline numbers.
#[derive(Clone, Copy, Debug, Default)]
struct Point {
    step: u64,
    val_loss: f64,
    /// max over layers of σ_max(c_attn).
    qkv_sigma_max: f64,
    /// max over layers and heads of σ_max(W_Q^h)·σ_max(W_K^h).
    qk_product: f64,
    /// max over heads of the largest logit.
    max_logit: f64,
    /// mean attention entropy over heads.
    entropy: f64,
    /// mean softmax-Jacobian Frobenius norm over heads.
    jacobian: f64,
    /// max over MLP matrices of σ_max.
    mlp_sigma_max: f64,
}

/// Everything one variant logged in one run.
#[derive(Clone, Debug, Default)]
struct Trace {
    points: Vec<Point>,
    outcome: Option<Outcome>,
    metric: f64,
    seconds_per_step: f64,
    /// Per optimizer group, summed over the run's training records.
    optim: BTreeMap<String, GroupTotals>,
}

/// One optimizer group's statistics summed over training records (dual-ascent fields weighted
/// by updates, so dividing by `updates` gives the mean per matrix update).
#[derive(Clone, Copy, Debug, Default)]
struct GroupTotals {
    updates: f64,
    seconds: f64,
    dual_steps: f64,
    violation: f64,
    diverged: f64,
}

impl GroupTotals {
    fn add(&mut self, s: &OptimizerStats) {
        let u = s.updates as f64;
        self.updates += u;
        self.seconds += s.seconds;
        self.dual_steps += s.dual_steps.unwrap_or(f64::NAN) * u;
        self.violation += s.violation.unwrap_or(f64::NAN) * u;
        self.diverged += s.diverged as f64;
    }

    fn merge(&mut self, o: &GroupTotals) {
        self.updates += o.updates;
        self.seconds += o.seconds;
        self.dual_steps += o.dual_steps;
        self.violation += o.violation;
        self.diverged += o.diverged;
    }

    /// A manifold-Muon group (Muon groups report no dual statistics: NaN here).
    fn is_manifold(&self) -> bool {
        self.updates > 0.0 && !self.dual_steps.is_nan()
    }

    /// A manifold-Muon group that ran the ascent (not square Stiefel's closed form).
    fn runs_dual_ascent(&self) -> bool {
        self.is_manifold() && self.dual_steps > 0.0
    }
}

fn point(step: u64, eval_loss: f64, record: &Record) -> Option<Point> {
    let Record::Eval {
        heads, matrices, ..
    } = record
    else {
        return None;
    };
    let mut p = Point {
        step,
        val_loss: eval_loss,
        ..Point::default()
    };
    let n = heads.len().max(1) as f64;
    for h in heads {
        p.qk_product = p.qk_product.max(h.wq.sigma_max * h.wk.sigma_max);
        p.max_logit = p.max_logit.max(h.max_logit);
        p.entropy += h.entropy / n;
        p.jacobian += h.softmax_jacobian_frobenius / n;
    }
    for m in matrices {
        match ModuleLabel::of(&m.name) {
            Some(ModuleLabel::AttentionQkv) => p.qkv_sigma_max = p.qkv_sigma_max.max(m.sigma_max),
            Some(ModuleLabel::MlpIn | ModuleLabel::MlpOut) => {
                p.mlp_sigma_max = p.mlp_sigma_max.max(m.sigma_max)
            }
            _ => {}
        }
    }
    Some(p)
}

/// Variant name → one trace per seed, in run order.
type Traces = BTreeMap<String, Vec<Trace>>;

impl Trace {
    /// Adds one line of `metrics.jsonl`.
    fn add(&mut self, line: MetricsLine) {
        match (&line.record, &line.summary) {
            (Some(r @ Record::Eval { step, eval, .. }), _) => {
                self.points.extend(point(*step, eval.loss, r));
            }
            (Some(Record::Train { optimizers, .. }), _) => {
                for (g, s) in optimizers {
                    self.optim.entry(g.clone()).or_default().add(s);
                }
            }
            (_, Some(f)) => {
                self.outcome = Some(f.outcome.clone());
                self.metric = f.metric;
                self.seconds_per_step = f.seconds_per_step;
            }
            _ => {}
        }
    }
}

fn outcome_text(traces: &[Trace]) -> String {
    let diverged: Vec<String> = traces
        .iter()
        .filter_map(|t| match &t.outcome {
            Some(Outcome::Diverged { step, .. }) => Some(step.to_string()),
            _ => None,
        })
        .collect();
    if diverged.is_empty() {
        "stable".into()
    } else {
        format!(
            "diverged at step {} ({}/{} seeds)",
            diverged.join(", "),
            diverged.len(),
            traces.len()
        )
    }
}

fn final_losses(traces: &[Trace]) -> Vec<f64> {
    traces
        .iter()
        .filter(|t| t.outcome == Some(Outcome::Completed))
        .map(|t| t.metric)
        .collect()
}

/// Mean over seeds of `f` at each evaluation step present in any seed.
fn curve(traces: &[Trace], f: impl Fn(&Point) -> f64) -> Vec<(f64, f64)> {
    let points = traces.iter().flat_map(|t| t.points.iter());
    per_step(points.map(|p| (p.step, f(p))), mean)
}

/// Mean seconds per training step over the seeds of a variant.
fn seconds_per_step(traces: &[Trace]) -> f64 {
    traces.iter().map(|x| x.seconds_per_step).sum::<f64>() / traces.len().max(1) as f64
}

fn report(e: &Manifolds, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
    let mut section = opened(
        "manifolds: module-wise manifold Muon on a GPT (Different Layers, Different Manifolds)",
        e.claim(),
        runs,
    );
    let Variants {
        order,
        runs: traces,
    } = read_variants(runs, Trace::add)?;
    if order.is_empty() {
        section.paragraph("No completed runs to report.");
        return Ok(section);
    }
    let config: Option<Config> = runs.first().map(|run| run.config()).transpose()?;
    if let Some(c) = &config {
        section.paragraph(&setup(c));
    }
    results_table(&mut section, &order, &traces);
    verdicts(&mut section, &order, &traces, config.as_ref());
    dual_table(&mut section, &order, &traces);
    plots(
        &mut section,
        &order,
        &traces,
        &Figures::new(out_dir, report_dir),
    );
    Ok(section)
}

/// The accumulated spectral step Σₜ ηₜ of the first `steps` steps of a variant whose Muon peak
/// lr is `muon_lr`. A Muon or manifold-Muon step has spectral norm ηₜ (up to the retraction's
/// O(ηₜ²)), so by Weyl's inequality |σᵢ(W + ΔW) − σᵢ(W)| ≤ ‖ΔW‖₂ no singular value of a hidden
/// matrix can have moved by more than this sum: the horizon on which the paper's DGram-attention
/// runs diverged (Σηₜ ≈ 290 and 350).
pub(crate) fn spectral_step(train: &TrainConfig, muon_lr: f64, steps: u64) -> f64 {
    let schedule = train.schedule();
    (0..steps).map(|i| schedule.lr(muon_lr, i)).sum()
}

/// "then cosine to a tenth", "then constant", … : the schedule after the warmup.
pub(crate) fn after_warmup(train: &TrainConfig) -> String {
    let m = train.min_lr / train.lr;
    if m == 1.0 {
        "then constant".into()
    } else if (m - 0.1).abs() < 1e-12 {
        "then cosine to a tenth".into()
    } else {
        format!("then cosine to {m}× the peak")
    }
}

/// What was trained, beside what the paper trained.
fn setup(c: &Config) -> String {
    let first = c.variants.first().map(|v| &v.modulewise);
    let muon_lr = first.map_or(f64::NAN, |m| m.muon_lr);
    format!(
        "Setup: GPT with {} layers, d = {}, {} heads, context {}, {:?} tokens of the SOTU \
         text; {} steps of {} sequences ({} tokens per step); AdamW peak lr {} on \
         embeddings and gains, Muon / manifold-Muon peak lr {} (spectral norm of a step), \
         warmup {} {}, an accumulated spectral step Σηₜ = {:.1} over the run (the paper's \
         DGram-attention runs diverged at Σηₜ ≈ 290 and 350); global clip {}; dual ascent α = {}, K = {}; \
         msign Polar Express; libtorch threads {}, optimizer worker threads {}. Divergence: \
         the smoothed training loss above {} × its best. \
         The paper ran GPT-2 small (12 × 768, context 1024) on OpenWebText for 50k steps of \
         65,536 tokens: this is a far smaller model trained far shorter.",
        c.model.n_layer,
        c.model.n_embd,
        c.model.n_head,
        c.model.block_size,
        c.tokenizer,
        c.train.steps,
        c.train.batch_size,
        c.train.batch_size * c.model.block_size,
        c.train.lr,
        muon_lr,
        c.train.warmup_steps,
        after_warmup(&c.train),
        spectral_step(&c.train, muon_lr, c.train.steps),
        c.train.grad_clip,
        first.map_or(f64::NAN, |m| m.manifold.dual.alpha),
        first.map_or(0, |m| m.manifold.dual.steps),
        if c.libtorch_threads > 0 {
            c.libtorch_threads.to_string()
        } else {
            "as the run".into()
        },
        first.map_or(1, |m| m.optimizer_threads),
        c.train.divergence_factor,
    )
}

/// The paper's table beside ours: validation loss, stability and time per step.
fn results_table(section: &mut Section, order: &[String], traces: &Traces) {
    let base_step = traces
        .get(Preset::Unconstrained.name())
        .map_or(f64::NAN, |t| seconds_per_step(t));
    let rows: Vec<Vec<String>> = order
        .iter()
        .map(|name| result_row(name, &traces[name], base_step))
        .collect();
    section.table(
        &[
            "assignment",
            "paper val loss",
            "val loss (mean ± std)",
            "completed",
            "stability",
            "s/step",
            "× UNCONSTRAINED",
            "optimizer share",
        ],
        &rows,
    );
    section.paragraph(
        "Validation loss is in nats per token of this corpus and tokenizer; the paper's column \
         is GPT-2 BPE on OpenWebText, a different scale: compare orderings, not values. \
         \"optimizer share\" is the part of the training step spent in the Muon and manifold-Muon \
         updates (dual ascent and retraction).",
    );
}

/// One assignment's row of [`results_table`].
fn result_row(name: &str, t: &[Trace], base_step: f64) -> Vec<String> {
    let losses = final_losses(t);
    let paper = match Preset::ALL.iter().find(|p| p.name() == name) {
        Some(p) => p
            .paper_val_loss()
            .map_or("Unstable".to_string(), |l| format!("{l:.4}")),
        None => MISSING.into(),
    };
    let step = seconds_per_step(t);
    let (opt_s, train_s) = t.iter().fold((0.0, 0.0), |(a, b), x| {
        let steps = x.points.last().map_or(0, |p| p.step) as f64;
        (
            a + x.optim.values().map(|v| v.seconds).sum::<f64>(),
            b + x.seconds_per_step * steps,
        )
    });
    vec![
        name.to_string(),
        paper,
        over_seeds(&losses, 4),
        format!("{}/{}", losses.len(), t.len()),
        outcome_text(t),
        format!("{step:.3}"),
        if base_step.is_finite() {
            format!("{:.2}", step / base_step)
        } else {
            MISSING.into()
        },
        if train_s > 0.0 {
            format!("{:.0}%", 100.0 * opt_s / train_s)
        } else {
            MISSING.into()
        },
    ]
}

fn mean_of(traces: &Traces, p: Preset) -> (f64, f64) {
    let l = traces
        .get(p.name())
        .map(|t| final_losses(t))
        .unwrap_or_default();
    mean_std(&l)
}

/// "first → last" of a per-evaluation value, one entry per seed, joined by "; ".
fn first_to_last(traces: &[Trace], value: impl Fn(&Point) -> String) -> String {
    traces
        .iter()
        .filter_map(|t| Some((t.points.first()?, t.points.last()?)))
        .map(|(a, b)| format!("{} → {}", value(a), value(b)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The paper's claims, one bullet each, judged from the traces.
fn verdicts(section: &mut Section, order: &[String], traces: &Traces, config: Option<&Config>) {
    let mut lines = vec![ordering(traces)];
    lines.extend(divergences(traces, config));
    lines.extend(dual_ascent(order, traces));
    lines.push(stiefel_logits(traces));
    lines.extend(ablations(order, traces));
    section.paragraph(&lines.join("\n"));
}

/// The paper's ordering of final validation losses, HETERO < ALL-STIEFEL < UNCONSTRAINED.
fn ordering(traces: &Traces) -> String {
    let (h, hs) = mean_of(traces, Preset::Hetero);
    let (st, sts) = mean_of(traces, Preset::AllStiefel);
    let (u, us) = mean_of(traces, Preset::Unconstrained);
    let absent: Vec<&str> = [
        (h, Preset::Hetero),
        (st, Preset::AllStiefel),
        (u, Preset::Unconstrained),
    ]
    .iter()
    .filter(|(loss, _)| loss.is_nan())
    .map(|(_, p)| p.name())
    .collect();
    let ordering = if !absent.is_empty() {
        format!(
            "cannot be judged (no completed run of {})",
            absent.join(", ")
        )
    } else if h < st && st < u {
        let separated = st - h > hs.max(sts) && u - st > sts.max(us);
        format!(
            "holds here ({h:.4} < {st:.4} < {u:.4}){}",
            if separated {
                ", with gaps larger than the seed spread"
            } else {
                ", but the gaps are within the seed spread"
            }
        )
    } else {
        format!("does not hold here: HETERO {h:.4}, ALL-STIEFEL {st:.4}, UNCONSTRAINED {u:.4}")
    };
    format!(
        "- **Ordering HETERO < ALL-STIEFEL < UNCONSTRAINED** (paper 3.3544 < 3.3679 < 3.3855): \
         {ordering}."
    )
}

/// DGram attention diverging (the paper's "Unstable"), with the growth of σ_max(QKV) and of the
/// logits, and unconstrained Muon's growth for reference.
fn divergences(traces: &Traces, config: Option<&Config>) -> Vec<String> {
    let mut lines = Vec::new();
    for p in [Preset::AllDGram, Preset::HeteroInv] {
        let Some(t) = traces.get(p.name()) else {
            continue;
        };
        let steps: Vec<u64> = t
            .iter()
            .filter_map(|x| match x.outcome {
                Some(Outcome::Diverged { step, .. }) => Some(step),
                _ => None,
            })
            .collect();
        let growth = first_to_last(t, |p| format!("{:.2}", p.qkv_sigma_max));
        let logits = first_to_last(t, |p| format!("{:.3}", p.max_logit));
        lines.push(format!(
            "- **{} diverges** (paper: Unstable): {} of {} seeds diverged here{}. σ_max of the \
             fused QKV matrix (first → last evaluation, per seed): {}; largest attention logit: \
             {}.",
            p.name(),
            steps.len(),
            t.len(),
            divergence_horizon(&steps, p, config),
            growth,
            logits
        ));
    }
    if let Some(t) = traces.get(Preset::Unconstrained.name()) {
        let growth = first_to_last(t, |p| format!("{:.2}", p.qkv_sigma_max));
        lines.push(format!(
            "- For reference, unconstrained Muon (weight decay 0.1) moves σ_max of the fused QKV \
             matrix {} over the same steps.",
            growth
        ));
    }
    lines
}

/// ", at step N (Σηₜ = X)" for each diverged seed of preset `p` (nothing when none diverged).
fn divergence_horizon(steps: &[u64], p: Preset, config: Option<&Config>) -> String {
    let Some(c) = config else {
        return String::new();
    };
    let muon_lr = c
        .variants
        .iter()
        .find(|v| v.name == p.name())
        .map_or(f64::NAN, |v| v.modulewise.muon_lr);
    let at: Vec<String> = steps
        .iter()
        .map(|&step| {
            format!(
                "step {step} (Σηₜ = {:.1})",
                spectral_step(&c.train, muon_lr, step)
            )
        })
        .collect();
    if at.is_empty() {
        String::new()
    } else {
        format!(", at {}", at.join(", "))
    }
}

/// How far from tangent the paper's dual ascent leaves its directions (presets only).
fn dual_ascent(order: &[String], traces: &Traces) -> Option<String> {
    let mut dual = Vec::new();
    for name in order.iter().filter(|n| !n.contains(", ")) {
        let (mut updates, mut violation, mut diverged) = (0.0, 0.0, 0.0);
        for t in &traces[name] {
            for v in t.optim.values().filter(|v| v.runs_dual_ascent()) {
                updates += v.updates;
                violation += v.violation;
                diverged += v.diverged;
            }
        }
        if updates > 0.0 {
            dual.push(format!(
                "{name}: mean violation {:.2}, {:.0}% flagged diverging",
                violation / updates,
                100.0 * diverged / updates
            ));
        }
    }
    (!dual.is_empty()).then(|| {
        format!(
            "- **The paper's dual ascent** (α = 0.1, K = 20, unnormalized) on the matrices that \
             run it (all but square Stiefel, which has a closed form): {}. The steps taken are \
             therefore not tangent: the constraint is restored by the retraction, not by the \
             direction (see the table below and docs/optim.md).",
            dual.join("; ")
        )
    })
}

/// The largest logit of the Stiefel-attention presets at their last evaluation.
fn stiefel_logits(traces: &Traces) -> String {
    let logits: Vec<String> = [Preset::AllStiefel, Preset::Hetero]
        .iter()
        .filter_map(|p| {
            let t = traces.get(p.name())?;
            let last = t
                .iter()
                .filter_map(|x| x.points.last())
                .map(|q| q.max_logit);
            Some(format!(
                "{} {:.1}",
                p.name(),
                last.fold(f64::NEG_INFINITY, f64::max)
            ))
        })
        .collect();
    if logits.is_empty() {
        return "- **Stiefel attention bounds the logits** (σ_max(W_Q)·σ_max(W_K) ≤ 1): cannot be \
                judged (no completed run of ALL-STIEFEL or HETERO)."
            .into();
    }
    format!(
        "- **Stiefel attention bounds the logits** (σ_max(W_Q)·σ_max(W_K) ≤ 1): largest logit \
         at the last evaluation {}.",
        logits.join(", ")
    )
}

/// The ablations (variant names with a ", "): final loss and stability.
fn ablations(order: &[String], traces: &Traces) -> Option<String> {
    let ablations: Vec<String> = order
        .iter()
        .filter(|n| n.contains(", "))
        .filter_map(|n| {
            let t = traces.get(n)?;
            Some(format!(
                "{n}: {} ({})",
                over_seeds(&final_losses(t), 4),
                outcome_text(t)
            ))
        })
        .collect();
    (!ablations.is_empty())
        .then(|| format!("- **Ablations** (first seed): {}.", ablations.join("; ")))
}

fn dual_table(section: &mut Section, order: &[String], traces: &Traces) {
    let mut rows = Vec::new();
    for name in order {
        let mut groups: BTreeMap<String, GroupTotals> = BTreeMap::new();
        for t in &traces[name] {
            for (g, v) in &t.optim {
                groups.entry(g.clone()).or_default().merge(v);
            }
        }
        for (g, v) in groups {
            if !v.is_manifold() {
                continue;
            }
            rows.push(vec![
                name.clone(),
                g,
                format!("{:.1}", v.dual_steps / v.updates),
                format!("{:.2e}", v.violation / v.updates),
                format!("{}", v.diverged),
                format!("{:.2}", 1e3 * v.seconds / v.updates),
            ]);
        }
    }
    if rows.is_empty() {
        return;
    }
    section.paragraph(
        "Dual ascent per constrained group, over all updates of all seeds: mean iterations, \
         mean final tangent violation ‖P(WᵀA + AᵀW)‖_F/n, updates whose ascent diverged (applied, \
         as the paper's code did), and milliseconds per matrix update.",
    );
    section.table(
        &[
            "assignment",
            "group",
            "dual steps",
            "violation",
            "diverged updates",
            "ms/update",
        ],
        &rows,
    );
}

/// A quantity plotted over training: file stem, label, value, log axis.
type Metric = (&'static str, &'static str, fn(&Point) -> f64, bool);

/// The quantities over training, mean over seeds, one line per variant (ablations thinner).
fn plots(section: &mut Section, order: &[String], traces: &Traces, figures: &Figures<'_>) {
    let metrics: [Metric; 6] = [
        ("val-loss", "validation loss", |p| p.val_loss, false),
        (
            "qkv-sigma-max",
            "max over layers of σ_max(c_attn)",
            |p| p.qkv_sigma_max,
            true,
        ),
        (
            "qk-product",
            "max over heads of σ_max(W_Q)·σ_max(W_K)",
            |p| p.qk_product,
            true,
        ),
        (
            "max-logit",
            "largest attention logit",
            |p| p.max_logit,
            false,
        ),
        (
            "entropy",
            "mean attention entropy (nats)",
            |p| p.entropy,
            false,
        ),
        (
            "softmax-jacobian",
            "mean ‖diag(p) − ppᵀ‖_F",
            |p| p.jacobian,
            false,
        ),
    ];
    for (file, label, f, log) in metrics {
        let mut plot = LinePlot::new(&format!("manifolds: {label}"), "step", label);
        if log {
            plot = plot.log_y();
        }
        for name in order {
            let mark = if name.contains(", ") {
                Mark::Reference
            } else {
                Mark::Line
            };
            plot = plot.series(name, curve(&traces[name], f), mark);
        }
        let alt = format!("manifolds {label}");
        figures.add_if_drawn(section, &alt, &plot, &format!("manifolds-{file}.png"));
    }
}
