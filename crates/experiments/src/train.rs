//! `train --config FILE`: one model trained on a user's own data, the way nanoGPT is used — a
//! GPT on a plain-text file (characters or GPT-2 BPE), or a ViT on a folder of gray IDX files or
//! a folder of PNG images — with any of kappa's conditionings and optimizers, live progress,
//! evaluations with attention diagnostics, checkpoints, `--resume`, and a run folder with a small
//! report (loss curves and κ(W_Q), σ_min(W_Q), entropy over training).
//!
//! The config is a TOML file read into [`TrainJob`] (unknown keys and bad values are errors that
//! name them, `--set KEY=VALUE` overrides a field); relative data paths are read from the
//! config file's folder. The run folder `<out>/<name>/` holds the resolved config
//! (`config.toml`), `metrics.jsonl`, `run.json`, the checkpoint
//! (`variant-0/checkpoint.safetensors`, the weights at the last checkpoint), `report.md` and its
//! plots.
//!
//! # Data kinds (`[data] kind = …`)
//!
//! | kind | layout | splits | normalization |
//! |---|---|---|---|
//! | `text` | one UTF-8 file | the last `validation_fraction` of its characters is validation | — |
//! | `idx` | `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte` (N×S×S gray, any S) | the file's last `validation` training images; the t10k files are the test split | `normalize = "fashion_mnist"` (default: Fashion-MNIST's mean 0.2860 and std 0.3530, so Fashion-MNIST configs keep their numbers) or `"train_split"` |
//! | `image_folder` | `dir/train/<class>/*.png`, `dir/test/<class>/*.png` (torchvision's `ImageFolder`; gray or RGB, 8 or 16 bits, all S×S of one size) | `validation` training images chosen by a fixed permutation of the sorted paths ([`kappa_models::data::IMAGE_FOLDER_SPLIT_SEED`]); `test/` is the test split | `normalize = "train_split"` (default: each channel's mean and standard deviation over the training split) or `"fashion_mnist"` |
//!
//! Classes: an IDX folder has the largest label + 1 (or `num_classes` when stated), an image
//! folder the sorted names of `train/`'s folders. The ViT must fit the data: `model.image_size`,
//! `model.channels` and `model.num_classes` are checked against it, before any run folder is
//! written, by an error naming the key. See [`kappa_models::data::images`] for the details.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use kappa_cli::Set;
use kappa_dist::{Communicator, Single};
use kappa_models::{
    parse_device, summarize, GptConfig, ImageSplits, Normalize, Split, SplitOptions, TextCorpus,
    TokenizerKind, Vit, VitConfig,
};
use kappa_optim::optimizer::Group;
use kappa_train::{
    adamw_groups, modulewise_groups, train_language_model, train_variant, ImageClassification,
    MetricsLine, ModulewiseConfig, Outcome, Preset, Record, Resumed, Run, RunContext, RunError,
    RunRecord, RunStatus, TrainConfig, VariantId,
};
use serde::{Deserialize, Serialize};
use tch::{nn, Device};

use crate::config::ConfigSource;
use crate::plot::{LinePlot, Mark};
use crate::rank_zero::tell_ranks;
use crate::report::cells::MISSING;
use crate::report::Section;

/// A training job: what is trained on what, and how (the TOML file of `train --config`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainJob {
    /// The run's name: its folder under `--out`.
    pub name: String,
    /// The data.
    pub data: DataSpec,
    /// The model (its kind must fit the data: a GPT reads text, a ViT images).
    pub model: ModelSpec,
    /// The optimizer (AdamW unless set).
    #[serde(default)]
    pub optimizer: OptimizerSpec,
    /// The training loop.
    pub train: TrainConfig,
}

/// Where the data is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DataSpec {
    /// One plain-text file; the last `validation_fraction` of its characters is the validation
    /// split (nanoGPT's split).
    Text {
        /// The file.
        path: PathBuf,
        /// `char` or `gpt2_bpe`.
        tokenizer: TokenizerKind,
        /// In (0, 1); 0.1 unless set.
        #[serde(default = "a_tenth")]
        validation_fraction: f64,
    },
    /// A folder of gray IDX files in the MNIST layout (`train-images-idx3-ubyte`,
    /// `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`): N×S×S
    /// images of any side S.
    Idx {
        /// The folder.
        dir: PathBuf,
        /// Training images held out for validation (the file's last ones).
        validation: usize,
        /// At most this many training images.
        #[serde(default)]
        train_limit: Option<usize>,
        /// `fashion_mnist` (the default: Fashion-MNIST's constants, what configs written before
        /// this key existed got) or `train_split` (each channel's training-split statistics).
        #[serde(default)]
        normalize: Normalize,
        /// The number of classes, when some are absent from the files (the largest label + 1
        /// unless set).
        #[serde(default)]
        num_classes: Option<usize>,
    },
    /// A folder of PNG images in torchvision's `ImageFolder` layout: `dir/train/<class>/*.png`
    /// and `dir/test/<class>/*.png`; the classes are `train/`'s folder names, sorted.
    ImageFolder {
        /// The folder.
        dir: PathBuf,
        /// Training images held out for validation (chosen by a fixed permutation).
        validation: usize,
        /// At most this many training images.
        #[serde(default)]
        train_limit: Option<usize>,
        /// `train_split` (the default) or `fashion_mnist`.
        #[serde(default = "train_split")]
        normalize: Normalize,
    },
}

fn train_split() -> Normalize {
    Normalize::TrainSplit
}

fn a_tenth() -> f64 {
    0.1
}

/// The model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelSpec {
    /// A GPT (`vocab_size = 0` takes the tokenizer's).
    Gpt(GptConfig),
    /// A ViT.
    Vit(VitConfig),
}

/// The optimizer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum OptimizerSpec {
    /// AdamW on every parameter (`train.lr`, `train.weight_decay`, β and ε from `[train]`).
    #[default]
    Adamw,
    /// A module-wise assignment of *Different Layers, Different Manifolds* (GPT only): the
    /// preset's paper settings, with Muon's peak lr replaced when `muon_lr` is set.
    Modulewise {
        /// `UNCONSTRAINED`, `ALL-STIEFEL`, `ALL-DGRAM`, `HETERO` or `HETERO-INV`.
        preset: Preset,
        /// Muon's peak learning rate (the paper's 0.02 unless set).
        #[serde(default)]
        muon_lr: Option<f64>,
    },
}

impl OptimizerSpec {
    /// Checks the learning rate of a module-wise assignment (the preset's other settings are
    /// the paper's).
    pub fn validate(&self) -> Result<()> {
        if let OptimizerSpec::Modulewise {
            muon_lr: Some(lr), ..
        } = self
        {
            let max = kappa_train::trainer::MAX_LR;
            anyhow::ensure!(
                *lr > 0.0 && *lr <= max,
                "optimizer.muon_lr: must be finite and lie in (0, {max}], found {lr:?}"
            );
        }
        Ok(())
    }
}

impl TrainJob {
    /// Reads `path`, applies `sets`, checks every field, and reads relative data paths from the
    /// file's folder.
    pub fn load(path: &Path, sets: &[Set]) -> Result<Self> {
        let mut job: TrainJob = ConfigSource::file(path)?.resolve("train", sets)?;
        let base = path.parent().unwrap_or(Path::new("."));
        job.data.resolve_paths(base);
        job.validate()
            .with_context(|| format!("{}", path.display()))?;
        Ok(job)
    }

    /// Checks that the parts fit together and each is valid; errors name the field.
    pub fn validate(&self) -> Result<()> {
        kappa_train::folder::check_name(&self.name)
            .map_err(|why| anyhow::anyhow!("name: {why}"))?;
        self.train.validate()?;
        self.data.validate()?;
        self.optimizer.validate()?;
        self.check_model_fits_data()?;
        // Before the text is read a GPT's `vocab_size = 0` stands for a vocabulary of 1; the
        // check is repeated with the tokenizer's in `check_data`.
        self.ensure_step_fits(1)
    }

    /// The model's kind and keys against the data's kind, and against the optimizer.
    fn check_model_fits_data(&self) -> Result<()> {
        match (&self.model, &self.data) {
            (ModelSpec::Gpt(g), DataSpec::Text { .. }) => g.or_vocab(1).validate()?,
            (ModelSpec::Vit(v), DataSpec::Idx { num_classes, .. }) => {
                v.validate()?;
                if let Some(n) = num_classes.filter(|&n| n != v.num_classes) {
                    anyhow::bail!(
                        "model.num_classes: is {}, but data.num_classes is {n}",
                        v.num_classes
                    );
                }
            }
            (ModelSpec::Vit(v), DataSpec::ImageFolder { .. }) => v.validate()?,
            (ModelSpec::Gpt(_), _) => anyhow::bail!("data.kind: a GPT reads `text`"),
            (ModelSpec::Vit(_), _) => {
                anyhow::bail!("data.kind: a ViT reads `idx` or `image_folder` images")
            }
        }
        if let (ModelSpec::Vit(_), OptimizerSpec::Modulewise { .. }) =
            (&self.model, &self.optimizer)
        {
            anyhow::bail!(
                "optimizer.kind: the module-wise assignments label GPT weights; use adamw"
            );
        }
        Ok(())
    }

    /// Checks that one training step of the model fits in this process's memory
    /// ([`TrainConfig::ensure_gpt_step_fits`]), before anything is built. A GPT whose
    /// `vocab_size` is 0 takes `vocab`, the tokenizer's. The budget is this process's memory
    /// ([`kappa_models::memory::budget`]), the host's also for a run on a GPU.
    fn ensure_step_fits(&self, vocab: usize) -> Result<()> {
        match &self.model {
            ModelSpec::Gpt(g) => self.train.ensure_gpt_step_fits(&g.or_vocab(vocab))?,
            ModelSpec::Vit(v) => {
                let eval_batch = self.train.batch_size.max(TEST_BATCH);
                self.train.ensure_vit_step_fits(v, eval_batch)?
            }
        }
        Ok(())
    }

    /// Checks the job against its loaded data before training starts, in microseconds: the
    /// model's vocabulary and context against the text, a step's memory with the tokenizer's
    /// vocabulary, an image batch against the training
    /// split, and `train.eval_batches` and `train.diagnostics.samples` against the
    /// validation split ([`TrainConfig::check_validation_counts`]: a window of `block_size`
    /// tokens or an image is one example). Errors name the key and its bound.
    pub fn check_data(&self, data: &JobData) -> Result<()> {
        let batch = self.train.batch_size;
        let (examples, unit, zero) = match (&self.model, data) {
            (ModelSpec::Gpt(g), JobData::Text(corpus)) => {
                let vocab = corpus.tokenizer.vocab_size();
                anyhow::ensure!(
                    g.vocab_size == 0 || g.vocab_size >= vocab,
                    "model.vocab_size: is {}, smaller than the {vocab} symbols of the text's \
                     tokenizer (0 takes the tokenizer's)",
                    g.vocab_size
                );
                self.ensure_step_fits(vocab)?;
                let train = corpus.tokens(Split::Train).size()[0] as usize;
                anyhow::ensure!(
                    train > g.block_size,
                    "model.block_size: the training split has {train} tokens, fewer than \
                     block_size + 1 = {}",
                    g.block_size.saturating_add(1)
                );
                let windows = validation_windows(corpus, g.block_size)?;
                (windows, "windows", "0 evaluates one batch")
            }
            (ModelSpec::Vit(_), JobData::Images(images)) => {
                let n = images.train.len();
                anyhow::ensure!(
                    batch <= n,
                    "train.batch_size: must be at most the {n} images of the training split \
                     (data.train_limit and data.validation set it), found {batch}"
                );
                (
                    images.validation.len(),
                    "images",
                    "0 evaluates the whole split",
                )
            }
            _ => anyhow::bail!("data.kind: the data does not fit the model's kind"),
        };
        Ok(self.train.check_validation_counts(examples, unit, zero)?)
    }
}

/// The images of one evaluation batch of the test split, after training.
const TEST_BATCH: usize = 256;

/// The distinct windows of `block` tokens (and their next tokens) in the validation split:
/// len − block; an error naming `model.block_size` when there are none.
fn validation_windows(corpus: &TextCorpus, block: usize) -> Result<usize> {
    let len = corpus.tokens(Split::Validation).size()[0] as usize;
    let windows = len.saturating_sub(block);
    anyhow::ensure!(
        windows >= 1,
        "model.block_size: the validation split has {len} tokens, fewer than block_size + 1 = \
         {}",
        block.saturating_add(1)
    );
    Ok(windows)
}

impl DataSpec {
    /// Checks the sizes; errors name the key (`data.train_limit`) and its range. How many
    /// images there are is known only when they are read ([`JobData::load`]).
    pub fn validate(&self) -> Result<()> {
        let (validation, train_limit, num_classes) = match self {
            DataSpec::Text {
                validation_fraction: f,
                ..
            } => {
                anyhow::ensure!(
                    *f > 0.0 && *f < 1.0,
                    "data.validation_fraction: must lie in (0, 1), found {f}"
                );
                return Ok(());
            }
            DataSpec::Idx {
                validation,
                train_limit,
                num_classes,
                ..
            } => (*validation, *train_limit, *num_classes),
            DataSpec::ImageFolder {
                validation,
                train_limit,
                ..
            } => (*validation, *train_limit, None),
        };
        for (key, value) in [
            ("data.validation", Some(validation)),
            ("data.train_limit", train_limit),
            ("data.num_classes", num_classes),
        ] {
            anyhow::ensure!(value != Some(0), "{key}: must be ≥ 1, found 0");
        }
        Ok(())
    }

    /// The data's file or folder.
    pub fn dir(&self) -> &Path {
        match self {
            DataSpec::Text { path, .. } => path,
            DataSpec::Idx { dir, .. } | DataSpec::ImageFolder { dir, .. } => dir,
        }
    }

    fn resolve_paths(&mut self, base: &Path) {
        let path = match self {
            DataSpec::Text { path, .. } => path,
            DataSpec::Idx { dir, .. } | DataSpec::ImageFolder { dir, .. } => dir,
        };
        if path.is_relative() {
            *path = base.join(&*path);
        }
    }
}

/// A job's data, loaded.
#[derive(Debug)]
pub enum JobData {
    /// A GPT's text.
    Text(TextCorpus),
    /// A ViT's images.
    Images(ImageSplits),
}

impl JobData {
    /// Loads the data of `job` onto `device`; for a ViT, checks that the model fits the images
    /// (an error naming `model.image_size`, `model.channels` or `model.num_classes`); then the
    /// job against the data ([`TrainJob::check_data`]).
    pub fn load(job: &TrainJob, device: Device) -> Result<Self> {
        let data = match &job.data {
            DataSpec::Text {
                path,
                tokenizer,
                validation_fraction,
            } => JobData::Text(TextCorpus::from_file(
                path,
                *tokenizer,
                *validation_fraction,
                device,
            )?),
            DataSpec::Idx {
                dir,
                validation,
                train_limit,
                normalize,
                num_classes,
            } => {
                let options = split_options(*validation, *train_limit, *normalize);
                JobData::Images(ImageSplits::from_idx_dir(
                    dir,
                    &options,
                    *num_classes,
                    device,
                )?)
            }
            DataSpec::ImageFolder {
                dir,
                validation,
                train_limit,
                normalize,
            } => {
                let options = split_options(*validation, *train_limit, *normalize);
                JobData::Images(ImageSplits::from_image_folder(dir, &options, device)?)
            }
        };
        if let (ModelSpec::Vit(model), JobData::Images(images)) = (&job.model, &data) {
            images
                .check_model(model)
                .with_context(|| format!("the data in {}", job.data.dir().display()))?;
        }
        job.check_data(&data)
            .with_context(|| format!("the data in {}", job.data.dir().display()))?;
        Ok(data)
    }
}

fn split_options(
    validation: usize,
    train_limit: Option<usize>,
    normalize: Normalize,
) -> SplitOptions {
    SplitOptions {
        validation,
        train_limit,
        normalize,
    }
}

/// Trains `job` into `run` (a fresh or a resumed run folder) and returns how it ended.
pub fn train_job(job: &TrainJob, run: &mut Run) -> Result<RunStatus> {
    train_loaded(job, None, run)
}

/// [`train_job`] on data already loaded (`None`: loaded here).
fn train_loaded(job: &TrainJob, data: Option<JobData>, run: &mut Run) -> Result<RunStatus> {
    let device = parse_device(&run.context().device)?;
    let data = match data {
        Some(data) => data,
        None => JobData::load(job, device)?,
    };
    let outcome = match (&job.model, data) {
        (ModelSpec::Gpt(model), JobData::Text(corpus)) => train_gpt(job, *model, corpus, run)?,
        (ModelSpec::Vit(model), JobData::Images(images)) => train_vit(job, *model, images, run)?,
        _ => anyhow::bail!("the model's kind does not fit the data's (see TrainJob::validate)"),
    };
    Ok(match outcome {
        Outcome::Diverged { step, reason } => RunStatus::Diverged { step, reason },
        _ => RunStatus::Completed,
    })
}

fn variant_id(job: &TrainJob) -> VariantId<'_> {
    VariantId {
        index: 0,
        name: &job.name,
    }
}

/// A GPT on its corpus; the headline metric is the validation loss.
fn train_gpt(
    job: &TrainJob,
    model: GptConfig,
    corpus: TextCorpus,
    run: &mut Run,
) -> Result<Outcome> {
    let groups = |vs: &nn::VarStore| optimizer_groups(vs, &job.optimizer, &job.train);
    let batches = job.train.eval_batches.max(1);
    train_language_model::<anyhow::Error>(
        run,
        variant_id(job),
        &job.train,
        model,
        corpus,
        groups,
        batches,
    )
}

/// A ViT on its images; the headline metric is the test accuracy.
fn train_vit(
    job: &TrainJob,
    model: VitConfig,
    images: ImageSplits,
    run: &mut Run,
) -> Result<Outcome> {
    let seed = run.context().seed;
    train_variant::<_, anyhow::Error>(
        run,
        variant_id(job),
        &job.train,
        |vs| {
            Ok(ImageClassification::new(
                Vit::new(&vs.root(), model)?,
                images,
                seed,
            )?)
        },
        |vs| optimizer_groups(vs, &job.optimizer, &job.train),
        |task| {
            let eval = task.evaluate_split(Split::Test, None, TEST_BATCH)?;
            Ok(eval.accuracy.unwrap_or(f64::NAN))
        },
    )
}

fn optimizer_groups(
    vs: &nn::VarStore,
    optimizer: &OptimizerSpec,
    train: &TrainConfig,
) -> Result<Vec<Group>> {
    Ok(match optimizer {
        OptimizerSpec::Adamw => adamw_groups(vs, train)?,
        OptimizerSpec::Modulewise { preset, muon_lr } => {
            let paper = ModulewiseConfig::paper(*preset);
            let config = ModulewiseConfig {
                muon_lr: muon_lr.unwrap_or(paper.muon_lr),
                ..paper
            };
            modulewise_groups(vs, &config, train)?
        }
    })
}

/// What `train` does with a run folder that already exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// An error that changes nothing (the default: a run folder holds somebody's results).
    Refuse,
    /// Continue it (`--resume`): a finished run is kept, an interrupted one continues.
    Resume,
    /// Start over (`--fresh`): the run's own files are deleted first, nothing else.
    StartOver,
}

/// `train --config FILE`: loads the job, trains it in `<out>/<name>/` (what happens to a folder
/// that exists is `existing`'s choice), writes the report, and returns the run folder.
pub fn run_train_command(
    config: &Path,
    sets: &[Set],
    context: RunContext,
    out: &Path,
    existing: Existing,
) -> Result<PathBuf> {
    run_train_ranks(config, sets, context, out, existing, Arc::new(Single))
}

/// [`run_train_command`] on every rank of `comm` (`mpirun -np N … train`): one model trained
/// data-parallel ([`kappa_train::Trainer::data_parallel`]), each rank taking its parts of every
/// batch. Rank 0 alone writes the run folder (config, metrics, checkpoint, `run.json`, report);
/// it decides whether there is training to do and tells the others, which then read the same
/// folder ([`Run::follow`]: the checkpoint a resume continues from). Every rank loads the data.
pub fn run_train_ranks(
    config: &Path,
    sets: &[Set],
    context: RunContext,
    out: &Path,
    existing: Existing,
    comm: Arc<dyn Communicator>,
) -> Result<PathBuf> {
    let job = TrainJob::load(config, sets)?;
    let context = RunContext {
        name: job.name.clone(),
        scale: "train".into(),
        data_dir: config.parent().unwrap_or(Path::new(".")).to_path_buf(),
        ..context
    };
    context.apply_threads();
    let dir = out.join(&job.name);
    let device = parse_device(&context.device)?;
    let exchanged = comm.tensor_device();
    anyhow::ensure!(
        comm.world() == 1 || exchanged.is_none_or(|d| d == device),
        "--device {}: these ranks exchange tensors on {} (MPI: the CPU; NCCL: each rank's GPU, \
         with --device cuda)",
        context.device,
        match exchanged {
            Some(Device::Cuda(gpu)) => format!("cuda:{gpu}"),
            _ => "the CPU".to_string(),
        }
    );
    let (run, data) = if comm.rank() == 0 {
        let (run, data) = open_run(&job, &dir, context, existing)?;
        let resumed = run.as_ref().is_some_and(Run::is_resumed);
        tell_ranks(&*comm, run.is_some(), resumed)?;
        (run, data)
    } else {
        match tell_ranks(&*comm, false, false)? {
            None => (None, None),
            Some(resumed) => {
                let data = JobData::load(&job, device)?;
                (Some(Run::follow(&dir, context, resumed)), Some(data))
            }
        }
    };
    if let Some(mut run) = run {
        if comm.world() > 1 {
            run.data_parallel(Arc::clone(&comm));
        }
        let trained = train_loaded(&job, data, &mut run);
        let interrupted = (trained.as_ref().err())
            .is_some_and(|e| matches!(e.downcast_ref(), Some(RunError::Interrupted { .. })));
        let status = trained.unwrap_or_else(|e| RunStatus::Failed {
            error: format!("{e:#}"),
        });
        let info = run.finish(status)?;
        // A stop on request ends every rank after the same step: the others wait until rank 0
        // has written `run.json` before the job ends.
        if interrupted && comm.world() > 1 {
            comm.barrier()?;
        }
        if let RunStatus::Failed { error } = info.status {
            if interrupted {
                // Its error already says that --resume continues it.
                return Err(TrainStopped {
                    message: format!(
                        "{error} (the run folder {} keeps what was done)",
                        dir.display()
                    ),
                }
                .into());
            }
            anyhow::bail!(
                "{error} (the run folder {} keeps what was done; --resume continues it)",
                dir.display()
            );
        }
    }
    if comm.rank() == 0 {
        write_report(&dir)?;
    }
    Ok(dir)
}

/// A `train` run stopped on request (SIGINT, SIGTERM, SIGUSR1) after a checkpoint: every rank
/// stopped after the same step, and `--resume` continues the run. The binary exits with
/// [`kappa_cli::REQUEUE_EXIT_CODE`] on it, so that a Slurm script can requeue the job.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct TrainStopped {
    /// What stopped, and where the run folder is.
    pub message: String,
}

/// Rank 0's run folder for `job` (what happens to one that exists is `existing`'s choice), or
/// `None` for a resumed run that is finished, with the data when it was loaded (before a fresh
/// folder is written, so a job that does not fit its data leaves none).
fn open_run(
    job: &TrainJob,
    dir: &Path,
    context: RunContext,
    existing: Existing,
) -> Result<(Option<Run>, Option<JobData>)> {
    if existing == Existing::Refuse {
        kappa_train::folder::ensure_empty(dir)?;
    }
    // The data is loaded (and the model checked against it) before a fresh run folder is
    // written; a run folder that is resumed loads it only when there is training left to do.
    let resuming = existing == Existing::Resume
        && kappa_train::folder::regular_or_absent(&dir.join("config.toml"))?;
    let data = match resuming {
        true => None,
        false => Some(JobData::load(job, parse_device(&context.device)?)?),
    };
    let run = match existing {
        Existing::Resume => match Run::resume(dir, context, job)? {
            Resumed::Started(run) | Resumed::Continued(run) => Some(run),
            Resumed::Finished(_) => None,
        },
        Existing::StartOver => Some(Run::start_over(dir, context, job)?),
        Existing::Refuse => Some(Run::create(dir, context, job)?),
    };
    Ok((run, data))
}

/// One evaluation's numbers for the report.
struct EvalPoint {
    step: u64,
    loss: f64,
    accuracy: Option<f64>,
    kappa_wq: f64,
    sigma_min_wq: f64,
    entropy: f64,
}

/// Writes `report.md` and its plots into the run folder from `metrics.jsonl`.
pub fn write_report(dir: &Path) -> Result<()> {
    let record = RunRecord::read(dir)?;
    let job: TrainJob = record.config()?;
    let lines: Vec<MetricsLine> = record.metrics()?;
    let train: Vec<(f64, f64)> = lines
        .iter()
        .filter_map(|l| match &l.record {
            Some(Record::Train { step, loss, .. }) => Some((*step as f64, *loss)),
            _ => None,
        })
        .collect();
    let evals = eval_points(&lines);
    let mut section = Section::new(&format!("{}: training report", job.name));
    section.paragraph(&summary_paragraph(&job, &record, &lines));
    let rows: Vec<Vec<String>> = evals.iter().map(eval_row).collect();
    section.table(
        &[
            "step",
            "val loss",
            "accuracy",
            "κ(W_Q)",
            "σ_min(W_Q)",
            "entropy",
        ],
        &rows,
    );
    plot_curves(&mut section, dir, &train, &evals)?;
    let path = dir.join("report.md");
    kappa_train::folder::write_atomic(&path, section.to_markdown().as_bytes())?;
    Ok(())
}

fn eval_points(lines: &[MetricsLine]) -> Vec<EvalPoint> {
    lines
        .iter()
        .filter_map(|l| match &l.record {
            Some(Record::Eval {
                step, eval, heads, ..
            }) => {
                let s = summarize(heads);
                let known = !heads.is_empty();
                let or_nan = |x: f64| if known { x } else { f64::NAN };
                Some(EvalPoint {
                    step: *step,
                    loss: eval.loss,
                    accuracy: eval.accuracy,
                    kappa_wq: or_nan(s.kappa_wq),
                    sigma_min_wq: or_nan(s.sigma_min_wq),
                    entropy: or_nan(s.entropy),
                })
            }
            _ => None,
        })
        .collect()
}

fn eval_row(e: &EvalPoint) -> Vec<String> {
    let num = |x: f64| {
        if x.is_nan() {
            MISSING.to_string()
        } else {
            format!("{x:.4}")
        }
    };
    vec![
        e.step.to_string(),
        num(e.loss),
        e.accuracy
            .map_or(MISSING.into(), |a| format!("{:.2}%", 100.0 * a)),
        num(e.kappa_wq),
        num(e.sigma_min_wq),
        num(e.entropy),
    ]
}

fn summary_paragraph(job: &TrainJob, record: &RunRecord, lines: &[MetricsLine]) -> String {
    let model = match &job.model {
        ModelSpec::Gpt(g) => format!(
            "GPT ({} layers, {} heads, width {})",
            g.n_layer, g.n_head, g.n_embd
        ),
        ModelSpec::Vit(v) => format!(
            "ViT ({} layers, {} heads, width {})",
            v.n_layer, v.n_head, v.n_embd
        ),
    };
    let conditioning = match &job.model {
        ModelSpec::Gpt(g) => g.correction.label(),
        ModelSpec::Vit(v) => v.correction.label(),
    };
    let last = lines.iter().rev().find_map(|l| l.summary.as_ref());
    let end = match (&record.info.status, last) {
        (RunStatus::Completed, Some(f)) => match &job.model {
            ModelSpec::Gpt(_) => format!("completed; validation loss {:.4}", f.metric),
            ModelSpec::Vit(_) => format!("completed; test accuracy {:.2}%", 100.0 * f.metric),
        },
        (RunStatus::Diverged { step, reason }, _) => format!("diverged at step {step}: {reason}"),
        (status, _) => format!("{status:?}"),
    };
    let weights = match record.info.status {
        RunStatus::Completed => "The trained weights are `variant-0/checkpoint.safetensors`.",
        _ => {
            "`variant-0/checkpoint.safetensors`, where it exists, holds the weights of the last \
             checkpoint before the run ended."
        }
    };
    format!(
        "{model}, attention {conditioning}, optimizer {}, {} steps of batch {} at peak lr {}, \
         seed {}, {} thread(s) on {}: {end}. Wall time {:.1} s. {weights}",
        optimizer_label(&job.optimizer),
        job.train.steps,
        job.train.batch_size,
        job.train.lr,
        record.info.run.seed,
        record.info.run.threads,
        record.info.run.device,
        record.info.wall_seconds
    )
}

fn optimizer_label(optimizer: &OptimizerSpec) -> String {
    match optimizer {
        OptimizerSpec::Adamw => "AdamW".into(),
        OptimizerSpec::Modulewise { preset, muon_lr } => match muon_lr {
            Some(lr) => format!("module-wise {preset:?} (Muon lr {lr})"),
            None => format!("module-wise {preset:?}"),
        },
    }
}

fn plot_curves(
    section: &mut Section,
    dir: &Path,
    train: &[(f64, f64)],
    evals: &[EvalPoint],
) -> Result<()> {
    let points = |f: &dyn Fn(&EvalPoint) -> f64| -> Vec<(f64, f64)> {
        evals
            .iter()
            .map(|e| (e.step as f64, f(e)))
            .filter(|(_, y)| y.is_finite())
            .collect()
    };
    let train: Vec<(f64, f64)> = train
        .iter()
        .copied()
        .filter(|(_, y)| y.is_finite())
        .collect();
    let validation = points(&|e| e.loss);
    if train.is_empty() && validation.is_empty() {
        section.paragraph("No finite loss was recorded, so there is no loss plot.");
        return Ok(());
    }
    let loss = LinePlot::new("loss", "step", "loss")
        .series("train", train, Mark::Line)
        .series("validation", validation, Mark::Points);
    let file = dir.join("loss.png");
    loss.save(&file)?;
    section.image_file("loss curves", &file, dir);
    let kappa = points(&|e| e.kappa_wq);
    if !kappa.is_empty() {
        let spectra = LinePlot::new("attention spectra (mean over heads)", "step", "value")
            .log_y()
            .series("κ(W_Q)", kappa, Mark::Line)
            .series("σ_min(W_Q)", points(&|e| e.sigma_min_wq), Mark::Line)
            .series("entropy", points(&|e| e.entropy), Mark::Line);
        let file = dir.join("spectra.png");
        spectra.save(&file)?;
        section.image_file("κ, σ_min and entropy over training", &file, dir);
    }
    Ok(())
}
