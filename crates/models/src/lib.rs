#![doc = include_str!("../README.md")]
//!
//! # Principal items
//!
//! | module | principal items |
//! |---|---|
//! | [`attention`] | [`ConditionedAttention`] (an `nn::Module`), [`AttentionConfig`], [`Conditioning`] (none, λ·I_k, scale-aware λ, exact SVD), [`Layout`], [`ScoreScaling`] |
//! | [`layers`] | `Linear`, `LayerNorm`, `Mlp`, [`Block`] (pre-LN), the [`Transformer`] trait |
//! | [`gpt`] | [`Gpt`], [`GptConfig`] (`tiny`, `cpu`, `gpt2_small`) |
//! | [`vit`] | [`Vit`], [`VitConfig`] (`tiny`, `cpu`, `vit_b16`) |
//! | [`data`] | [`FashionMnist`] (IDX), [`TextCorpus`] (SOTU; characters or GPT-2 BPE), deterministic batches, `fixtures` |
//! | [`diagnostics`] | [`diagnose`]: σ and κ of the effective W_Q/W_K/W_V per head, attention entropy, saturation and softmax-Jacobian norm, exact κ(J); [`matrix_diagnostics`] (spectrum, Gram off-diagonal, column norms) |
//! | [`train`] | [`TrainConfig`], [`Trainer`] (AdamW groups, schedule, clipping, eval, checkpoints, resume, divergence, progress), [`Task`], [`Record`], [`GroupOptimizer`], [`AdamWGroup`] |
//! | [`modulewise`] | [`ModuleLabel`], [`Geometry`], [`Assignment`], [`Preset`] (the five assignments of *Different Layers, Different Manifolds*), [`ModulewiseConfig`], [`modulewise_groups`], [`MuonGroup`], [`ManifoldGroup`] |
//! | [`tasks`] | [`LanguageModeling`], [`ImageClassification`] |
//! | [`device`], [`error`] | [`parse_device`], [`ModelsError`] |
//!
//! See `docs/models.md` for the conventions, the math next to the code and measured figures.

pub mod attention;
pub mod autocast;
pub mod data;
pub mod device;
pub mod diagnostics;
pub mod error;
pub mod float;
pub mod gpt;
pub mod layers;
mod link;
pub mod modulewise;
pub mod tasks;
pub mod train;
pub mod vit;

pub use attention::{
    AttentionConfig, AttentionTrace, ConditionedAttention, Conditioning, Layout, ScoreScaling,
};
pub use data::{FashionMnist, Split, TextCorpus, Tokenizer, TokenizerKind};
pub use device::parse_device;
pub use diagnostics::{
    diagnose, matrix_diagnostics, summarize, DiagnosticsConfig, HeadDiagnostics, MatrixDiagnostics,
};
pub use error::{ModelsError, Result};
pub use gpt::{Gpt, GptConfig};
pub use kappa_optim::AdamWKernel;
pub use layers::{Block, Transformer};
pub use modulewise::{
    modulewise_groups, Assignment, Geometry, ManifoldGroup, ModuleLabel, ModulewiseConfig,
    MuonGroup, Preset,
};
pub use tasks::{ImageClassification, LanguageModeling};
pub use train::{
    adamw_groups, clip_grad_norm, seeded, AdamWGroup, DivergenceReference, Eval, GradientDropper,
    GroupOptimizer, JsonlSink, OptimizerStats, Outcome, ParamGroup, Record, Summary, Task,
    TrainConfig, TrainPrecision, Trainer,
};
pub use vit::{Vit, VitConfig};
