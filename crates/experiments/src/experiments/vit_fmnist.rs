//! "vit-fmnist": a ViT sized for 2 CPU cores on Fashion-MNIST, baseline against the spectral
//! corrections of *Spectral Conditioning of Attention* (λ·I_k at λ = 1 and the paper's λ = 10,
//! the scale-aware λ, the exact SVD correction), with the conditioning measured while training.
//!
//! This module also holds what `gpt-sotu` shares with it: the per-variant training driver, the
//! `metrics.jsonl` line format, and the report (tables over seeds, plots of κ(W_Q), σ_min(W_Q),
//! attention entropy and κ(J) over training, and a verdict per claim computed from the data).
//!
//! # Resume
//!
//! [`train_variant`] resumes by itself when its [`Run`] continues an unfinished run folder
//! ([`Run::resume`], `reproduce --resume`): a variant with a summary line in `metrics.jsonl` is
//! not retrained ([`finished_variant`]); the variant that was interrupted continues from
//! `variant-<i>/checkpoint.safetensors` through `Trainer::load_checkpoint`, after its records
//! past the checkpoint's step are dropped ([`resume_variant`]); later variants start afresh.
//! Experiments with their own training driver call the same helpers: [`variant_checkpoint`],
//! [`finished_variant`], [`resume_variant`], [`stop_if_interrupted`] and
//! [`log_variant_summary`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use kappa_models::{
    adamw_groups, seeded, summarize, Conditioning, FashionMnist, ImageClassification, Outcome,
    ParamGroup, Record, Split, Summary, Task, TrainConfig, Trainer, Vit, VitConfig,
};
use serde::{Deserialize, Serialize};
use tch::nn;

use crate::plot::{LinePlot, Mark};
use crate::report::{runs_table, Section};
use crate::run::{Run, RunRecord, RunStatus};
use crate::stats::mean_std;
use crate::Experiment;

/// The experiment (registered as `vit-fmnist`).
pub struct VitFmnist;

/// One model variant: a name (a label in tables) and its conditioning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// Table label.
    pub name: String,
    /// The correction.
    pub conditioning: Conditioning,
}

/// What `vit-fmnist` runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The model (its `conditioning` is replaced by each variant's).
    pub model: VitConfig,
    /// The variants, baseline first.
    pub variants: Vec<Variant>,
    /// Training settings (seed, threads and device come from the run context).
    pub train: TrainConfig,
    /// Training images held out for validation.
    pub validation: usize,
    /// At most this many training images.
    pub train_limit: Option<usize>,
}

/// One line of `metrics.jsonl`: a training-loop record or a variant's final summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Line {
    /// The variant's name.
    pub variant: String,
    /// A record of the training loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<Record>,
    /// The variant's summary after training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Final>,
}

/// The end of one variant's training.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Final {
    /// How training ended.
    pub outcome: Outcome,
    /// The headline metric: test accuracy (ViT) or validation loss (GPT).
    #[serde(with = "kappa_models::float")]
    pub metric: f64,
    /// Mean seconds per training step.
    pub seconds_per_step: f64,
    /// Units (images or tokens) per second.
    pub units_per_second: f64,
    /// The step training continued from after an interruption (`reproduce --resume`); the
    /// timings then cover only the steps after it (both are 0 when none were left).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at: Option<u64>,
}

/// The training config of a run: the experiment's, with the context's seed, threads and device.
pub fn train_config(base: &TrainConfig, run: &Run) -> TrainConfig {
    let c = run.context();
    TrainConfig {
        seed: c.seed,
        threads: c.threads,
        device: c.device.clone(),
        ..base.clone()
    }
}

/// Trains one variant: builds the task with `build`, runs the trainer (checkpoint in
/// `<run>/variant-<index>/checkpoint.safetensors`), logs every record, then logs the summary
/// with the headline metric from `metric`. In a resumed run ([`Run::resume`]) a variant that
/// finished before is not retrained (its logged outcome is returned), and an interrupted one
/// continues from its checkpoint (see the module docs).
pub fn train_variant<T: Task>(
    run: &mut Run,
    index: usize,
    variant: &Variant,
    train: &TrainConfig,
    build: impl FnOnce(&nn::VarStore) -> Result<T>,
    metric: impl FnOnce(&mut T) -> Result<f64>,
) -> Result<Outcome> {
    let groups = |vs: &nn::VarStore| Ok(adamw_groups(vs, train));
    train_variant_with(run, index, &variant.name, train, build, groups, metric)
}

/// [`train_variant`] with the optimizer groups built by `groups` (after the model, so its
/// variables exist): for experiments that assign other optimizers to some parameters.
pub fn train_variant_with<T: Task>(
    run: &mut Run,
    index: usize,
    name: &str,
    train: &TrainConfig,
    build: impl FnOnce(&nn::VarStore) -> Result<T>,
    groups: impl FnOnce(&nn::VarStore) -> Result<Vec<ParamGroup>>,
    metric: impl FnOnce(&mut T) -> Result<f64>,
) -> Result<Outcome> {
    if let Some(done) = finished_variant(run, name)? {
        return Ok(done.outcome);
    }
    let device = kappa_models::parse_device(&train.device)?;
    let vs = nn::VarStore::new(device);
    let mut task = seeded(train.seed, || build(&vs))?;
    let mut trainer = Trainer::with_groups(&vs, train.clone(), groups(&vs)?)?;
    trainer.set_label(format!(
        "{} seed {} {}",
        run.context().experiment,
        train.seed,
        name
    ));
    let ckpt = variant_checkpoint(run, index);
    let resumed_at = resume_variant(run, &mut trainer, name, &ckpt)?;
    if let Some(step) = run.interruption_of(index) {
        trainer.stop_after(step);
    }
    let summary = {
        let mut sink = |r: &Record| -> kappa_models::Result<()> {
            run.log(&Line {
                variant: name.to_string(),
                record: Some(r.clone()),
                summary: None,
            })
            .map_err(|e| kappa_models::ModelsError::Sink(format!("{e:#}")))
        };
        trainer.run(&mut task, &mut sink, Some(&ckpt))?
    };
    stop_if_interrupted(&summary.outcome, &ckpt)?;
    let value = match summary.outcome {
        Outcome::Completed => metric(&mut task)?,
        _ => f64::NAN,
    };
    log_variant_summary(run, name, &summary, value, resumed_at)?;
    Ok(summary.outcome)
}

/// Where variant `index` of a run keeps its checkpoint: `<run>/variant-<index>/checkpoint.safetensors`.
pub fn variant_checkpoint(run: &Run, index: usize) -> PathBuf {
    run.dir()
        .join(format!("variant-{index}"))
        .join("checkpoint.safetensors")
}

/// The summary line of variant `name` if an earlier attempt of this run finished it (only a
/// resumed run has earlier attempts); such a variant is not trained again.
pub fn finished_variant(run: &mut Run, name: &str) -> Result<Option<Final>> {
    if !run.is_resumed() {
        return Ok(None);
    }
    Ok(run
        .metrics::<Line>()?
        .into_iter()
        .filter(|l| l.variant == name)
        .find_map(|l| l.summary))
}

/// Prepares an unfinished variant of a resumed run: restores `checkpoint` into `trainer` when
/// it exists and drops the variant's records logged after the checkpoint's step (they will be
/// logged again, identically); without a checkpoint, drops all of its records. Returns the
/// step training continues from (`None`: from the start). Does nothing in a fresh run.
pub fn resume_variant(
    run: &mut Run,
    trainer: &mut Trainer<'_>,
    name: &str,
    checkpoint: &Path,
) -> Result<Option<u64>> {
    if !run.is_resumed() {
        return Ok(None);
    }
    let step = if checkpoint.is_file() {
        trainer
            .load_checkpoint(checkpoint)
            .with_context(|| format!("resuming variant {name}"))?;
        Some(trainer.step())
    } else {
        None
    };
    run.retain_metrics(|l: &Line| {
        l.variant != name
            || l.record
                .as_ref()
                .is_some_and(|r| step.is_some_and(|s| logged_by_step(r, s)))
    })?;
    Ok(step)
}

/// Whether `record` belongs to the first `step` finished steps: what a checkpoint at `step`
/// has seen. Train and eval records carry the count of finished steps; a divergence record
/// carries the index of the step that diverged.
pub fn logged_by_step(record: &Record, step: u64) -> bool {
    match record {
        Record::Train { step: s, .. } | Record::Eval { step: s, .. } => *s <= step,
        Record::Diverged { step: i, .. } => *i < step,
    }
}

/// Turns [`Outcome::Interrupted`] (only [`Run::interrupt_variant_at`] stops a trainer early)
/// into an error, so the run is recorded as failed and `--resume` continues it.
pub fn stop_if_interrupted(outcome: &Outcome, checkpoint: &Path) -> Result<()> {
    if let Outcome::Interrupted { step } = outcome {
        bail!(
            "interrupted after step {step} (checkpoint {}); `reproduce --resume` continues it",
            checkpoint.display()
        );
    }
    Ok(())
}

/// Logs the summary line of variant `name`: how training ended, the headline metric, the
/// timings of this attempt, and where it resumed.
pub fn log_variant_summary(
    run: &mut Run,
    name: &str,
    summary: &Summary,
    metric: f64,
    resumed_at: Option<u64>,
) -> Result<()> {
    run.log(&Line {
        variant: name.to_string(),
        record: None,
        summary: Some(Final {
            outcome: summary.outcome.clone(),
            metric,
            seconds_per_step: summary.seconds_per_step,
            units_per_second: summary.units_per_second,
            resumed_at,
        }),
    })
}

/// Mean seconds per step over the summaries that timed any step (a variant resumed at its last
/// step timed none).
fn mean_step_seconds(finals: &[Final]) -> f64 {
    let timed: Vec<f64> = finals
        .iter()
        .map(|f| f.seconds_per_step)
        .filter(|&s| s > 0.0)
        .collect();
    timed.iter().sum::<f64>() / timed.len().max(1) as f64
}

impl Experiment for VitFmnist {
    type Config = Config;

    fn name(&self) -> &'static str {
        "vit-fmnist"
    }

    fn claim(&self) -> &'static str {
        "Spectrally conditioned attention (W + λI_k, or the exact SVD correction) keeps a higher \
         σ_min and a lower κ of W_Q/W_K/W_V and of the attention Jacobian during training, and \
         improves ViT accuracy (ViT-B on ImageNet: 80.7 → 81.7)."
    }

    fn continues_interrupted_runs(&self) -> bool {
        true
    }

    fn data_needs(&self) -> &'static [&'static str] {
        &["fashion-mnist"]
    }

    fn validate(&self, c: &Config) -> Result<()> {
        anyhow::ensure!(!c.variants.is_empty(), "variants: need at least one");
        for variant in &c.variants {
            c.model
                .with_conditioning(variant.conditioning)
                .validate()
                .with_context(|| format!("variant {:?}", variant.name))?;
        }
        crate::config::validate_train(&c.train)?;
        if let Some(limit) = c.train_limit {
            anyhow::ensure!(
                limit > c.validation,
                "train_limit: must exceed validation = {} (the validation images come out of it), found {limit}",
                c.validation
            );
        }
        Ok(())
    }

    fn run(&self, config: &Config, run: &mut Run) -> Result<RunStatus> {
        let train = train_config(&config.train, run);
        let device = kappa_models::parse_device(&train.device)?;
        let dir = run.context().data_dir.join(FashionMnist::SET);
        let mut diverged = None;
        for (i, variant) in config.variants.iter().enumerate() {
            let model = config.model.with_conditioning(variant.conditioning);
            let data = FashionMnist::load(&dir, config.validation, config.train_limit, device)?;
            let outcome = train_variant(
                run,
                i,
                variant,
                &train,
                |vs| {
                    Ok(ImageClassification::new(
                        Vit::new(&vs.root(), model)?,
                        data,
                        train.seed,
                    )?)
                },
                |task| {
                    Ok(task
                        .evaluate_split(Split::Test, None, 256)?
                        .accuracy
                        .unwrap_or(f64::NAN))
                },
            )
            .with_context(|| format!("variant {}", variant.name))?;
            if let Outcome::Diverged { step, reason } = outcome {
                diverged.get_or_insert((step, format!("{}: {reason}", variant.name)));
            }
        }
        // A diverged variant is a result: the other variants still ran. The run is marked
        // diverged only when every variant diverged.
        let all = config.variants.len();
        Ok(match diverged {
            Some((step, reason)) if all == 1 => RunStatus::Diverged { step, reason },
            _ => RunStatus::Completed,
        })
    }

    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        let mut section = Section::new("vit-fmnist: spectrally conditioned ViT on Fashion-MNIST");
        section.paragraph(Experiment::claim(self));
        runs_table(&mut section, runs);
        let spec = ReportSpec {
            metric: "test accuracy (%)",
            scale: 100.0,
            higher_is_better: true,
            paper: "Paper, ViT-B/16 on ImageNet-1k top-1 (a different model, data set and scale): \
                    baseline 80.7 (±0.41), + spectral conditioning 81.7 (±0.38), Δ = +1.0.",
        };
        conditioning_report(&mut section, runs, out_dir, report_dir, &spec)?;
        Ok(section)
    }
}

/// How the shared report names and orders the headline metric.
pub struct ReportSpec {
    /// Column title of the headline metric.
    pub metric: &'static str,
    /// Multiplier for display (100 for a fraction shown in %).
    pub scale: f64,
    /// Whether larger is better (accuracy) or smaller (loss).
    pub higher_is_better: bool,
    /// The paper's numbers, labelled as such.
    pub paper: &'static str,
}

/// Per variant, per seed: the final summary and the diagnostic trajectory.
#[derive(Default)]
struct VariantData {
    finals: Vec<Final>,
    /// step → per-seed (κ(W_Q), σ_min(W_Q), entropy, κ(J), saturated).
    curves: BTreeMap<u64, Vec<[f64; 5]>>,
    /// The last eval of each seed: (κ(W_Q), σ_min(W_Q), entropy, κ(J), saturated, uniform H).
    last: Vec<[f64; 6]>,
}

fn fmt_ms((m, s): (f64, f64), scale: f64) -> String {
    if m.is_nan() {
        "n/a".into()
    } else {
        format!("{:.2} ± {:.2}", m * scale, s * scale)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| !x.is_nan());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// The tables, plots and verdicts shared by `vit-fmnist` and `gpt-sotu`.
pub fn conditioning_report(
    section: &mut Section,
    runs: &[RunRecord],
    out_dir: &Path,
    report_dir: &Path,
    spec: &ReportSpec,
) -> Result<()> {
    let mut order: Vec<String> = Vec::new();
    let mut data: BTreeMap<String, VariantData> = BTreeMap::new();
    for run in runs {
        if matches!(run.info.status, RunStatus::Failed { .. }) {
            continue;
        }
        let mut last: BTreeMap<String, [f64; 6]> = BTreeMap::new();
        for line in run.metrics::<Line>()? {
            if !order.contains(&line.variant) {
                order.push(line.variant.clone());
            }
            let entry = data.entry(line.variant.clone()).or_default();
            if let Some(f) = line.summary {
                entry.finals.push(f);
            }
            if let Some(Record::Eval { step, heads, .. }) = line.record {
                if heads.is_empty() {
                    continue;
                }
                let s = summarize(&heads);
                let uniform =
                    heads.iter().map(|h| h.uniform_entropy).sum::<f64>() / heads.len() as f64;
                entry.curves.entry(step).or_default().push([
                    s.kappa_wq,
                    s.sigma_min_wq,
                    s.entropy,
                    s.jacobian_kappa,
                    s.saturated_fraction,
                ]);
                last.insert(
                    line.variant.clone(),
                    [
                        s.kappa_wq,
                        s.sigma_min_wq,
                        s.entropy,
                        s.jacobian_kappa,
                        s.saturated_fraction,
                        uniform,
                    ],
                );
            }
        }
        for (v, l) in last {
            data.entry(v).or_default().last.push(l);
        }
    }
    if order.is_empty() {
        section.paragraph("No completed runs to report.");
        return Ok(());
    }
    let base_name = order[0].clone();
    let base_step = mean_step_seconds(&data[&base_name].finals);

    // The main table.
    let mut rows = Vec::new();
    for name in &order {
        let d = &data[name];
        let completed: Vec<f64> = d
            .finals
            .iter()
            .filter(|f| f.outcome == Outcome::Completed)
            .map(|f| f.metric)
            .collect();
        let diverged = d
            .finals
            .iter()
            .filter(|f| matches!(f.outcome, Outcome::Diverged { .. }))
            .count();
        let col = |i: usize| mean_std(&d.last.iter().map(|l| l[i]).collect::<Vec<_>>());
        let step = mean_step_seconds(&d.finals);
        rows.push(vec![
            name.clone(),
            format!("{}/{}", completed.len(), d.finals.len()),
            diverged.to_string(),
            fmt_ms(mean_std(&completed), spec.scale),
            fmt_ms(col(0), 1.0),
            fmt_ms(col(1), 1.0),
            format!("{:.3e}", median(d.last.iter().map(|l| l[3]).collect())),
            format!("{:.3} / {:.3}", col(2).0, col(5).0),
            format!("{:.1}%", 100.0 * col(4).0),
            format!(
                "{:.1} ({:+.1}%)",
                1e3 * step,
                100.0 * (step / base_step - 1.0)
            ),
        ]);
    }
    section.paragraph(
        "Final values per variant, mean ± sample std over seeds (diagnostics: mean \
                       over layers and heads at the last evaluation; κ(J): median over seeds of \
                       the per-run median over heads of the exact weight-Jacobian κ).",
    );
    section.table(
        &[
            "variant",
            "completed",
            "diverged",
            spec.metric,
            "κ(W_Q)",
            "σ_min(W_Q)",
            "κ(J)",
            "entropy / uniform",
            "saturated rows",
            "ms/step (vs baseline)",
        ],
        &rows,
    );
    section.paragraph(spec.paper);

    // Plots over training.
    let titles = [
        ("kappa_wq", "κ(W_Q), mean over heads", true),
        ("sigma_min_wq", "σ_min(W_Q), mean over heads", true),
        (
            "entropy",
            "attention entropy (nats), mean over heads",
            false,
        ),
        (
            "kappa_j",
            "κ(J) of the attention weight Jacobian, median over heads",
            true,
        ),
    ];
    for (i, (file, title, log)) in titles.iter().enumerate() {
        let mut plot = LinePlot::new(title, "step", title.split(',').next().unwrap_or(title));
        if *log {
            plot = plot.log_y();
        }
        let mut any = false;
        for name in &order {
            let pts: Vec<(f64, f64)> = data[name]
                .curves
                .iter()
                .map(|(s, v)| (*s as f64, median(v.iter().map(|x| x[i]).collect())))
                .filter(|(_, y)| y.is_finite() && (!*log || *y > 0.0))
                .collect();
            if !pts.is_empty() {
                any = true;
                plot = plot.series(name, pts, Mark::Line);
            }
        }
        if any {
            let path = out_dir.join(format!("{file}.png"));
            plot.save(&path)?;
            section.image_file(title, &path, report_dir);
        }
    }

    // Verdicts per claim, conditioned variants against the baseline.
    let base = &data[&base_name];
    let bcol = |i: usize| mean_std(&base.last.iter().map(|l| l[i]).collect::<Vec<_>>()).0;
    let bmetric: Vec<f64> = base
        .finals
        .iter()
        .filter(|f| f.outcome == Outcome::Completed)
        .map(|f| f.metric)
        .collect();
    let (bm, bs) = mean_std(&bmetric);
    let bj = median(base.last.iter().map(|l| l[3]).collect());
    let mut verdicts = Vec::new();
    for name in order.iter().skip(1) {
        let d = &data[name];
        let col = |i: usize| mean_std(&d.last.iter().map(|l| l[i]).collect::<Vec<_>>()).0;
        let m: Vec<f64> = d
            .finals
            .iter()
            .filter(|f| f.outcome == Outcome::Completed)
            .map(|f| f.metric)
            .collect();
        let (mm, ms) = mean_std(&m);
        let j = median(d.last.iter().map(|l| l[3]).collect());
        let held = |ok: bool| if ok { "held" } else { "did not hold" };
        let better = if spec.higher_is_better {
            mm > bm
        } else {
            mm < bm
        };
        let margin = (mm - bm).abs() > (bs.powi(2) + ms.powi(2)).sqrt();
        verdicts.push(vec![
            name.clone(),
            format!(
                "{} ({:.4} vs {:.4})",
                held(col(1) > bcol(1)),
                col(1),
                bcol(1)
            ),
            format!(
                "{} ({:.3} vs {:.3})",
                held(col(0) < bcol(0)),
                col(0),
                bcol(0)
            ),
            if j.is_nan() || bj.is_nan() {
                "not measured".into()
            } else {
                format!("{} ({:.3e} vs {:.3e})", held(j < bj), j, bj)
            },
            if mm.is_nan() || bm.is_nan() {
                "no completed runs".into()
            } else {
                format!(
                    "{}{} ({:.2} vs {:.2}, Δ = {:+.2})",
                    held(better),
                    if margin { "" } else { ", within noise" },
                    mm * spec.scale,
                    bm * spec.scale,
                    (mm - bm) * spec.scale
                )
            },
        ]);
    }
    section.paragraph(
        "Verdicts at this scale, each conditioned variant against the baseline \
                       (final evaluation, means over seeds; \"within noise\" when the difference \
                       of means is below the root sum of squares of the two standard deviations).",
    );
    section.table(
        &[
            "variant",
            "higher σ_min(W_Q)",
            "lower κ(W_Q)",
            "lower κ(J)",
            &format!("better {}", spec.metric),
        ],
        &verdicts,
    );
    // Collapse of attention onto the diagonal (docs/models.md, "Why a large λ collapses attention").
    let collapsed: Vec<String> = order
        .iter()
        .filter_map(|name| {
            let d = &data[name];
            let sat = mean_std(&d.last.iter().map(|l| l[4]).collect::<Vec<_>>()).0;
            let h = mean_std(&d.last.iter().map(|l| l[2]).collect::<Vec<_>>()).0;
            let u = mean_std(&d.last.iter().map(|l| l[5]).collect::<Vec<_>>()).0;
            (sat > 0.5).then(|| {
                format!(
                    "{name}: {:.1}% of attention rows put more than 0.99 of their mass on one \
                     token (entropy {h:.3} against {u:.3} for uniform attention)",
                    100.0 * sat
                )
            })
        })
        .collect();
    section.paragraph(&if collapsed.is_empty() {
        "No variant collapsed attention (fewer than half of the rows saturated in every variant)."
            .to_string()
    } else {
        format!(
            "Attention collapse (a large λ makes λ²X_kX_kᵀ dominate the scores, so \
             each token attends to itself): {}.",
            collapsed.join("; ")
        )
    });
    Ok(())
}
