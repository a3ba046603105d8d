#![doc = include_str!("../README.md")]
//!
//! # Principal items
//!
//! | module | principal items |
//! |---|---|
//! | [`conditioned_attention`] | [`ConditionedAttention`] (an `nn::Module`), [`AttentionConfig`], [`CorrectionConfig`] (none, λ·I_k, scale-aware λ, exact SVD); the layouts and score scales are kappa-attention's [`HeadLayout`] and [`ScoreScale`] (re-exported) |
//! | [`linear`] | `Linear` (N(0, σ²) init, optional bias) |
//! | [`layers`] | `LayerNorm`, `Mlp`, [`Block`] (pre-LN), the [`Transformer`] trait |
//! | [`gpt`] | [`Gpt`], [`GptConfig`] (`tiny`, `cpu`, `gpt2_small`) |
//! | [`vit`] | [`Vit`], [`VitConfig`] (`tiny`, `cpu`, `vit_b16`) |
//! | [`nystrom`] | [`NystromConfig`], [`Pinv`]: Nyström attention (landmarks, the iterative pseudo-inverse, the convolution skip) for bidirectional layers; [`nystrom::nystrom_attention`] |
//! | [`encoder`] | [`Encoder`], [`EncoderConfig`]: the bidirectional encoder of the sequence classifier and the masked LM; [`copy_encoder`], [`load_encoder`] (pretrained weights by name) |
//! | [`classifier`] | [`SequenceClassifier`], [`SequenceClassifierConfig`] (the encoder, mean pooling, a linear head) |
//! | [`mlm`] | [`MaskedLm`] (the encoder and a tied masked-LM head), [`MaskingRule`] and [`mask_tokens`] (BERT's 15 %, 80/10/10), the byte vocabulary (`PAD`, `MASK`) |
//! | [`data`] | [`ImageSplits`] (train/validation/test images and their classes) from [`FashionMnist`], any gray IDX folder or a PNG image folder (`train/<class>/*.png`, `test/<class>/*.png`); [`TextCorpus`] (SOTU or a text file; characters or GPT-2 BPE); deterministic batches, `fixtures` |
//! | [`max_logit`] | [`head_max_logits`](max_logit::head_max_logits) (per-head max of the masked logits, chunked, no gradient), [`QkClipReport`]; the opt-in capture is `ConditionedAttention::capture_max_logits`, QK-clip `ConditionedAttention::clip_qk` / `Transformer::clip_qk` |
//! | [`diagnostics`] | [`diagnose`]: σ and κ of the effective W_Q/W_K/W_V per head, attention entropy, saturation and softmax-Jacobian norm, exact κ(J); [`matrix_diagnostics`] (spectrum, Gram off-diagonal, column norms) |
//! | [`files`] | [`files::open_regular`], [`files::read_regular`]: data is read only from regular files (a directory, FIFO, socket, device or dangling link is an error naming it) |
//! | [`memory`] | [`memory::budget`] (what this process may still allocate: available memory, cgroup, `ulimit -v`), [`memory::ensure_fits`] |
//! | [`autocast`] | [`autocast::autocast`] (bf16 mixed precision as `torch.autocast`, on CPU and CUDA), [`autocast::native_bf16`] |
//! | [`seed`] | [`seeded`]: runs a closure with libtorch's global generator seeded, under a process-wide lock |
//! | [`float`] | serde for `f64` fields that may be ±∞ or NaN (written as `"inf"`, `"-inf"`, `"NaN"`) |
//! | [`device`], [`error`] | [`parse_device`], [`ModelsError`] |
//!
//! Training (the loop, optimizer groups, checkpoints, run folders) is the `kappa-train` crate.
//!
//! See `docs/models.md` for the conventions, the math next to the code and how each part is
//! tested.

pub mod autocast;
mod check;
pub mod classifier;
pub mod conditioned_attention;
pub mod data;
pub mod device;
pub mod diagnostics;
pub mod encoder;
pub mod error;
pub mod files;
pub mod float;
pub mod gpt;
pub mod layers;
pub mod linear;
mod link;
pub mod max_logit;
pub mod memory;
pub mod mlm;
pub mod nystrom;
pub mod seed;
pub mod vit;

pub use classifier::{SequenceClassifier, SequenceClassifierConfig};
pub use conditioned_attention::{
    AttentionConfig, AttentionKernel, AttentionTrace, ConditionedAttention, CorrectionConfig,
    LambdaUnit, ShiftInput,
};

/// The old name of [`CorrectionConfig`] ("conditioning" now means condition numbers only).
#[deprecated(since = "0.2.0", note = "renamed `CorrectionConfig`")]
pub type Conditioning = CorrectionConfig;
pub use data::{
    FashionMnist, ImageSet, ImageSplits, Normalize, Split, SplitOptions, TextCorpus, Tokenizer,
    TokenizerKind,
};
pub use device::parse_device;
pub use diagnostics::{
    diagnose, matrix_diagnostics, summarize, DiagnosticsConfig, HeadDiagnostics, MatrixDiagnostics,
};
pub use encoder::{copy_encoder, load_encoder, Encoder, EncoderConfig};
pub use error::{ModelsError, Result};
pub use gpt::{Gpt, GptConfig};
/// The per-head layout of λ·I_k and the score scale of a model config: kappa-attention's types
/// (one type each for the workspace), re-exported.
pub use kappa_attention::{HeadLayout, ScoreScale};
pub use layers::{Block, Transformer};
pub use max_logit::QkClipReport;
pub use mlm::{mask_tokens, MaskedLm, MaskingRule};
pub use nystrom::{NystromConfig, Pinv};
pub use seed::seeded;
pub use vit::{Vit, VitConfig};
