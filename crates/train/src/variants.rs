//! Training the variants of a run, with resume: each variant (a model with one conditioning,
//! one optimizer assignment, …) trains in turn into the same run folder, its records tagged
//! with its name in `metrics.jsonl` and its checkpoint in `variant-<i>/checkpoint.safetensors`.
//!
//! # Resume
//!
//! [`train_variant`] resumes by itself when its [`Run`] continues an unfinished run folder
//! ([`Run::resume`], `--resume`): a variant with a summary line in `metrics.jsonl` is not
//! retrained ([`finished_variant`]); the variant that was interrupted continues from its
//! checkpoint through [`Trainer::load_checkpoint`], after its records past the checkpoint's step
//! are dropped ([`resume_variant`]); later variants start afresh. Drivers of their own (a
//! training loop that is not a [`Trainer`]) call the same pieces: [`variant_checkpoint`],
//! [`finished_variant`], [`resume_variant`], [`stop_if_interrupted`] and
//! [`log_variant_summary`].

use std::path::{Path, PathBuf};

use kappa_models::{parse_device, Gpt, GptConfig, TextCorpus};
use serde::{Deserialize, Serialize};
use tch::nn;

use crate::error::RunError;
use crate::run::Run;
use crate::tasks::LanguageModeling;
use crate::trainer::{seeded, Outcome, Record, Summary, Task, Trainer};
use crate::TrainConfig;
use kappa_optim::optimizer::Group;

/// One line of `metrics.jsonl`: a training-loop record or a variant's final summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricsLine {
    /// The variant's name.
    pub variant: String,
    /// A record of the training loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<Record>,
    /// The variant's summary after training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<VariantResult>,
}

/// The former name of [`MetricsLine`].
#[deprecated(since = "0.2.0", note = "renamed `MetricsLine`")]
pub type Line = MetricsLine;

/// The former name of [`VariantResult`].
#[deprecated(since = "0.2.0", note = "renamed `VariantResult`")]
pub type Final = VariantResult;

/// The end of one variant's training.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantResult {
    /// How training ended.
    pub outcome: Outcome,
    /// The headline metric (test accuracy, validation loss, …; NaN unless completed).
    #[serde(with = "kappa_models::float")]
    pub metric: f64,
    /// Mean seconds per training step.
    pub seconds_per_step: f64,
    /// Units (images or tokens) per second.
    pub units_per_second: f64,
    /// The step training continued from after an interruption (`--resume`); the timings then
    /// cover only the steps after it (both are 0 when none were left).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at: Option<u64>,
}

/// What one variant is: its place in the run (the checkpoint folder) and its name (the tag of
/// its lines in `metrics.jsonl`, a label in tables).
#[derive(Clone, Copy, Debug)]
pub struct VariantId<'a> {
    /// 0-based position in the run.
    pub index: usize,
    /// The name.
    pub name: &'a str,
}

/// Trains one variant: puts the run's thread count in force ([`RunContext::apply_threads`](crate::RunContext::apply_threads),
/// before anything is built), builds the task with `build` (libtorch's generator seeded with the
/// run's seed) on the run's device, the optimizer groups with `groups` (after the model, so its
/// variables exist), runs the trainer (checkpoint at [`variant_checkpoint`]), logs every record,
/// then logs the summary with the headline metric from `metric`. In a resumed run a variant that
/// finished before is not retrained (its logged outcome is returned), and an interrupted one
/// continues from its checkpoint (see the module docs). On the ranks of a data-parallel run
/// ([`Run::data_parallel`]) the trainer joins them once resumed.
pub fn train_variant<T: Task, E>(
    run: &mut Run,
    variant: VariantId<'_>,
    train: &TrainConfig,
    build: impl FnOnce(&nn::VarStore) -> Result<T, E>,
    groups: impl FnOnce(&nn::VarStore) -> Result<Vec<Group>, E>,
    metric: impl FnOnce(&mut T) -> Result<f64, E>,
) -> Result<Outcome, E>
where
    E: From<RunError> + From<kappa_models::ModelsError>,
{
    let name = variant.name;
    if let Some(done) = finished_variant(run, name)? {
        return Ok(done.outcome);
    }
    let context = run.context().clone();
    context.apply_threads();
    let vs = nn::VarStore::new(parse_device(&context.device)?);
    let mut task = seeded(context.seed, || build(&vs))?;
    let mut trainer = Trainer::with_groups(&vs, train.clone(), groups(&vs)?, &context)?;
    trainer.set_label(format!("{} seed {} {name}", context.name, context.seed));
    let ckpt = variant_checkpoint(run, variant.index);
    let resumed_at = resume_variant(run, &mut trainer, name, &ckpt)?;
    if let Some(comm) = run.communicator() {
        trainer.data_parallel(comm)?;
    }
    if let Some(step) = run.interruption_of(variant.index) {
        trainer.stop_after(step);
    }
    let summary = {
        let mut sink = |r: &Record| -> kappa_models::Result<()> {
            let line = MetricsLine {
                variant: name.to_string(),
                record: Some(r.clone()),
                summary: None,
            };
            run.log(&line)
                .map_err(|e| kappa_models::ModelsError::Sink(e.to_string()))
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

/// Trains one GPT variant with [`train_variant`]: `model` (its vocabulary from the corpus's
/// tokenizer when `model.vocab_size` is 0; on the CPU, checked first to fit in memory with
/// [`TrainConfig::ensure_gpt_step_fits`]; its evaluation counts against the validation split
/// with [`TrainConfig::check_validation_counts`]) on [`LanguageModeling`] of `corpus`, with the
/// optimizer groups of `groups`; the headline metric is the validation loss, the mean over
/// `eval_batches` batches of the training batch size.
pub fn train_language_model<E>(
    run: &mut Run,
    variant: VariantId<'_>,
    train: &TrainConfig,
    model: GptConfig,
    corpus: TextCorpus,
    groups: impl FnOnce(&nn::VarStore) -> Result<Vec<Group>, E>,
    eval_batches: usize,
) -> Result<Outcome, E>
where
    E: From<RunError> + From<kappa_models::ModelsError>,
{
    let seed = run.context().seed;
    let model = model.or_vocab(corpus.tokenizer.vocab_size());
    // A step that cannot fit is an error naming its keys before anything is built; on a GPU the
    // activations are not in this process's memory, and the device reports its own failure.
    if parse_device(&run.context().device)? == tch::Device::Cpu {
        train.ensure_gpt_step_fits(&model)?;
    }
    // Counts that cost time, against the distinct windows of the validation split.
    let tokens = corpus.tokens(kappa_models::Split::Validation).size()[0] as usize;
    let windows = tokens.saturating_sub(model.block_size).max(1);
    train.check_validation_counts(windows, "windows", "0 evaluates one batch")?;
    let batch_size = train.batch_size;
    let build = |vs: &nn::VarStore| {
        let gpt = Gpt::new(&vs.root(), model)?;
        Ok(LanguageModeling::new(gpt, corpus, seed)?)
    };
    let metric = |task: &mut LanguageModeling| {
        Ok(tch::no_grad(|| task.evaluate(eval_batches, batch_size))?.loss)
    };
    train_variant(run, variant, train, build, groups, metric)
}

/// Where variant `index` of a run keeps its checkpoint: `<run>/variant-<index>/checkpoint.safetensors`.
pub fn variant_checkpoint(run: &Run, index: usize) -> PathBuf {
    run.dir()
        .join(format!("variant-{index}"))
        .join(crate::folder::CHECKPOINT_FILE)
}

/// The summary line of variant `name` if an earlier attempt of this run finished it (only a
/// resumed run has earlier attempts); such a variant is not trained again.
pub fn finished_variant(run: &mut Run, name: &str) -> Result<Option<VariantResult>, RunError> {
    if !run.is_resumed() {
        return Ok(None);
    }
    Ok(run
        .metrics::<MetricsLine>()?
        .into_iter()
        .filter(|l| l.variant == name)
        .find_map(|l| l.summary))
}

/// Prepares an unfinished variant of a resumed run: restores `checkpoint` into `trainer` when
/// it exists (checked by [`Trainer::load_checkpoint`]) and drops the variant's records logged
/// after the checkpoint's step (they will be logged again, identically); without a checkpoint,
/// drops all of its records. Returns the step training continues from (`None`: from the
/// start). Does nothing in a fresh run.
///
/// A checkpoint path that is not a regular file (a folder, a link loop), a checkpoint that does
/// not fit the run, and a checkpoint past step 0 whose variant has no record in
/// `metrics.jsonl` (the history before it is gone) are errors, and nothing is changed.
pub fn resume_variant(
    run: &mut Run,
    trainer: &mut Trainer<'_>,
    name: &str,
    checkpoint: &Path,
) -> Result<Option<u64>, RunError> {
    if !run.is_resumed() {
        return Ok(None);
    }
    let step = if crate::folder::regular_or_absent(checkpoint)? {
        trainer.load_checkpoint(checkpoint)?;
        Some(trainer.step())
    } else {
        None
    };
    let keep = |l: &MetricsLine| {
        l.variant != name
            || l.record
                .as_ref()
                .is_some_and(|r| step.is_some_and(|s| logged_by_step(r, s)))
    };
    if let Some(s) = step {
        check_history(run, name, s, trainer.config().log_every)?;
    }
    run.retain_metrics(keep)?;
    Ok(step)
}

/// `Ok` when `metrics.jsonl` holds the last training record that a checkpoint at `step` implies
/// (the trainer logs every `log_every` steps): one at step ⌊step / log_every⌋ · log_every, when
/// that is past 0. Otherwise the history before the checkpoint is gone (an emptied or replaced
/// file), and continuing would leave a run whose records start in the middle.
fn check_history(run: &mut Run, name: &str, step: u64, log_every: u64) -> Result<(), RunError> {
    let last = step / log_every.max(1) * log_every.max(1);
    if last == 0 {
        return Ok(());
    }
    let logged = run.metrics::<MetricsLine>()?.iter().any(|l| {
        l.variant == name && matches!(l.record, Some(Record::Train { step: s, .. }) if s == last)
    });
    if logged {
        return Ok(());
    }
    Err(RunError::Folder {
        dir: run.dir().join("metrics.jsonl"),
        reason: format!(
            "has no training record of variant `{name}` at step {last}, which its checkpoint at \
             step {step} implies: the run's history is lost; nothing was changed (--fresh \
             starts the run over)"
        ),
    })
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
/// into [`RunError::Interrupted`], so the run is recorded as failed and `--resume` continues it.
pub fn stop_if_interrupted(outcome: &Outcome, checkpoint: &Path) -> Result<(), RunError> {
    match outcome {
        Outcome::Interrupted { step } => Err(RunError::Interrupted {
            step: *step,
            checkpoint: checkpoint.to_path_buf(),
        }),
        _ => Ok(()),
    }
}

/// Logs the summary line of variant `name`: how training ended, the headline metric, the
/// timings of this attempt, and where it resumed.
pub fn log_variant_summary(
    run: &mut Run,
    name: &str,
    summary: &Summary,
    metric: f64,
    resumed_at: Option<u64>,
) -> Result<(), RunError> {
    run.log(&MetricsLine {
        variant: name.to_string(),
        record: None,
        summary: Some(VariantResult {
            outcome: summary.outcome.clone(),
            metric,
            seconds_per_step: summary.seconds_per_step,
            units_per_second: summary.units_per_second,
            resumed_at,
        }),
    })
}
