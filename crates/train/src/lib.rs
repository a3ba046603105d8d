#![doc = include_str!("../README.md")]
//!
//! # Principal items
//!
//! | module | principal items |
//! |---|---|
//! | [`trainer`] | [`TrainConfig`], [`Trainer`] (optimizer groups, schedule, clipping, eval, checkpoints, resume, divergence, progress), [`Task`], [`Record`], [`GroupOptimizer`], [`AdamW`] |
//! | [`modulewise`] | [`ModuleLabel`], [`Geometry`], [`Assignment`], [`Preset`] (the five assignments of *Different Layers, Different Manifolds*), [`ModulewiseConfig`], [`modulewise_groups`], [`MuonGroup`], [`ManifoldGroup`] |
//! | [`tasks`] | [`LanguageModeling`], [`ImageClassification`] |
//!
//! See `docs/models.md` for the training loop's conventions and measured figures.

pub mod modulewise;
pub mod tasks;
pub mod trainer;

pub use modulewise::{
    modulewise_groups, Assignment, Geometry, ManifoldGroup, ModuleLabel, ModulewiseConfig,
    MuonGroup, Preset,
};
pub use tasks::{ImageClassification, LanguageModeling};
pub use trainer::{
    adamw_groups, clip_grad_norm, seeded, AdamW, AdamWKernel, DivergenceReference, Eval,
    GradientDropper, GroupOptimizer, JsonlSink, OptimizerStats, Outcome, ParamGroup, Record,
    Summary, Task, TrainConfig, TrainPrecision, Trainer,
};
