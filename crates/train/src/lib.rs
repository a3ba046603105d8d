#![doc = include_str!("../README.md")]
//!
//! # Principal items
//!
//! | module | principal items |
//! |---|---|
//! | [`trainer`] | [`TrainConfig`], [`Trainer`] (optimizer groups, schedule, clipping, eval, checkpoints, resume, divergence, progress, micro-batches, data parallelism over kappa-dist ranks with [`Trainer::data_parallel`]), [`Task`], [`Part`], [`Record`]; the optimizer is kappa-optim's [`Optimizer`](kappa_optim::Optimizer) over [`adamw_groups`] or [`modulewise_groups`] |
//! | [`modulewise`] | [`ModuleLabel`], [`Geometry`], [`Assignment`], [`Preset`] (the five assignments of *Different Layers, Different Manifolds*), [`ModulewiseConfig`], [`LrMultipliers`], [`modulewise_groups`], [`modulewise_groups_by`] (any model whose variables a labelling function places), [`modulewise_groups_of`] (named tensors, e.g. a PyTorch module's) |
//! | [`tasks`] | [`LanguageModeling`], [`Classification`] ([`ImageClassification`], [`SequenceClassification`]) |
//! | [`context`] | [`RunContext`]: name, scale, seed, threads, device, data folder, progress, stop flag |
//! | [`stop`] | [`StopFlag`]: stop at the next step with a checkpoint (SIGTERM, SIGUSR1) |
//! | [`folder`] | the run folder's rules: [`folder::check_name`], own files, [`folder::write_atomic`], what `--fresh` deletes |
//! | [`run`] | [`Run`]: a run folder (`config.toml`, `metrics.jsonl`, `run.json`), resume, [`RunRecord`] to read one back |
//! | [`variants`] | [`train_variant`]: the variants of a run trained in turn, each resumable; [`train_language_model`] for a GPT variant |
//! | [`error`] | [`RunError`] (run folders; training errors are [`kappa_models::ModelsError`]) |
//!
//! See `docs/train.md` for the training loop's concepts, math and tests, and
//! `docs/performance.md` for measured figures.

pub mod context;
pub mod error;
pub mod folder;
pub mod modulewise;
pub mod run;
pub mod stop;
pub mod tasks;
pub mod trainer;
pub mod variants;

pub use context::RunContext;
pub use error::{RunError, RunResult};
pub use kappa_optim::AdamWKernel;

pub use modulewise::{
    modulewise_groups, modulewise_groups_by, modulewise_groups_of, Assignment, Geometry,
    LrMultipliers, ModuleLabel, ModulewiseConfig, Preset,
};
pub use run::{Resumed, Run, RunHost, RunInfo, RunRecord, RunStatus, SOURCE_ENV};
pub use stop::StopFlag;
pub use tasks::{
    Classification, ClassificationData, ClassifierModel, ImageClassification, LanguageModeling,
    MaskedLanguageModeling, SequenceClassification,
};
pub use trainer::{
    adamw_grouping, adamw_groups, seeded, DivergenceReference, Eval, OptimizerStats, Outcome, Part,
    QkClipStats, Record, Summary, Task, TrainConfig, TrainPrecision, Trainer, CKPT_MODEL,
};
pub use variants::{train_language_model, train_variant, MetricsLine, VariantId, VariantResult};
#[allow(deprecated)]
pub use variants::{Final, Line};
