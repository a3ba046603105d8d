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
//! | [`device`], [`error`] | [`parse_device`], [`ModelsError`] |
//!
//! Training (the loop, optimizer groups, checkpoints, run folders) is the `kappa-train` crate.
//!
//! See `docs/models.md` for the conventions, the math next to the code and measured figures.

pub mod attention;
pub mod autocast;
pub mod data;
pub mod device;
pub mod diagnostics;
pub mod error;
pub mod float;
#[doc(hidden)]
pub mod fused;
pub mod gpt;
pub mod layers;
mod link;
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
pub use layers::{Block, Transformer};
pub use vit::{Vit, VitConfig};
