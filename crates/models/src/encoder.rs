//! The bidirectional pre-LN encoder that [`crate::classifier::SequenceClassifier`] and
//! [`crate::mlm::MaskedLm`] share: token embedding, learned positions, pre-LN blocks with
//! bidirectional attention (exact softmax or Nyström, either with any [`CorrectionConfig`]) and a
//! final LayerNorm. Both models build it under the var-store path [`ENCODER`], so the
//! encoder's variables have the same names in both (`encoder.wte`, `encoder.wpe`,
//! `encoder.h.<i>.…`, `encoder.ln_f.…`) and a pretrained encoder moves into a classifier by
//! name ([`copy_encoder`], [`load_encoder`]).
//!
//! Initialization (the classifier's and ViT's): embeddings and positions N(0, 0.02²), blocks as
//! [`crate::layers::Block`] with output projections N(0, (0.02/√(2L))²), LayerNorm gain 1.
//! Padding tokens are tokens to attention (no attention mask; see the classifier's docs).
//!
//! # Weight transfer
//!
//! The encoder's variables are exactly those whose name starts with `encoder.`; λ and the SVD
//! correction of conditioned layers are buffers under that prefix and move with the weights,
//! so a conditioned encoder keeps the correction it was trained with. A transfer copies every
//! encoder variable of the destination from the source's variable of the same name, and fails,
//! naming the variables, when a name is missing on either side or a shape or kind differs;
//! variables outside the encoder (the classifier head, the masked-LM head) are left alone.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::nn::Module as _;
use tch::{nn, Tensor};

use kappa_attention::ScoreScale;

use crate::check;
use crate::conditioned_attention::{
    AttentionConfig, AttentionKernel, AttentionTrace, CorrectionConfig,
};
use crate::error::{ModelsError, Result};
use crate::layers::{block_parameters, ensure_weights_fit, Block, LayerNorm, Transformer};

/// The var-store path of the encoder in every model that has one.
pub const ENCODER: &str = "encoder";

/// The size and attention settings of an [`Encoder`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncoderConfig {
    /// Token vocabulary (special tokens included).
    pub vocab_size: usize,
    /// Sequence length T (every input is B×T; with Nyström, a multiple of the landmarks).
    pub seq_len: usize,
    /// Blocks L.
    pub n_layer: usize,
    /// Heads H.
    pub n_head: usize,
    /// Width D.
    pub n_embd: usize,
    /// MLP hidden width over D.
    pub mlp_ratio: usize,
    /// Biases in linear layers and LayerNorms.
    pub bias: bool,
    /// The score scale s.
    pub scaling: ScoreScale,
    /// The spectral correction of every attention layer.
    #[serde(alias = "conditioning")]
    pub correction: CorrectionConfig,
    /// Use libtorch's fused attention kernel (softmax kernel only).
    pub fused_kernel: bool,
    /// Exact softmax or Nyström attention.
    pub kernel: AttentionKernel,
}

impl EncoderConfig {
    /// The same encoder with another correction.
    pub fn with_correction(self, correction: CorrectionConfig) -> Self {
        Self { correction, ..self }
    }

    /// The old name of [`EncoderConfig::with_correction`].
    #[deprecated(since = "0.2.0", note = "renamed `with_correction`")]
    pub fn with_conditioning(self, correction: CorrectionConfig) -> Self {
        self.with_correction(correction)
    }

    /// The attention settings of every layer (bidirectional).
    pub fn attention(&self) -> AttentionConfig {
        AttentionConfig {
            n_embd: self.n_embd,
            n_head: self.n_head,
            bias: self.bias,
            causal: false,
            scaling: self.scaling,
            correction: self.correction,
            fused_kernel: self.fused_kernel,
            kernel: self.kernel,
        }
    }

    /// The keys that size the encoder's weights, as errors name them.
    pub const WEIGHT_KEYS: &'static str =
        "model.vocab_size, model.seq_len, model.n_layer, model.n_embd, model.mlp_ratio";

    /// Trainable parameters: (V + T)·D embeddings, L blocks ([`block_parameters`]) and the
    /// final LayerNorm (Nyström's convolutions, H·r each, not counted); `None` on overflow of
    /// u128.
    pub fn parameters(&self) -> Option<u128> {
        let d = self.n_embd as u128;
        let embeddings = (self.vocab_size as u128 + self.seq_len as u128).checked_mul(d)?;
        let blocks = (self.n_layer as u128).checked_mul(block_parameters(
            self.n_embd,
            self.mlp_ratio,
            self.bias,
        )?)?;
        let ln_f = d * (1 + u128::from(self.bias));
        embeddings.checked_add(blocks)?.checked_add(ln_f)
    }

    /// Checks every size; errors name the field (`model.<field>`). The sizes have no fixed
    /// maximum: [`Encoder::new`] checks that the weights fit in memory.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("seq_len", self.seq_len),
            ("n_layer", self.n_layer),
            ("mlp_ratio", self.mlp_ratio),
        ] {
            if v == 0 {
                return Err(ModelsError::config(format!("model.{name}"), "must be ≥ 1"));
            }
        }
        if let AttentionKernel::Nystrom(n) = &self.kernel {
            if !self.seq_len.is_multiple_of(n.landmarks.max(1)) {
                return Err(ModelsError::config(
                    "model.kernel.nystrom.landmarks",
                    format!(
                        "must divide seq_len = {}, found {}",
                        self.seq_len, n.landmarks
                    ),
                ));
            }
        }
        self.attention().validate("model")
    }
}

/// The encoder (module docs).
#[derive(Debug)]
pub struct Encoder {
    cfg: EncoderConfig,
    /// vocab×D.
    pub wte: Tensor,
    /// 1×T×D.
    pub wpe: Tensor,
    blocks: Vec<Block>,
    /// The final LayerNorm.
    pub ln_f: LayerNorm,
}

impl Encoder {
    /// Builds the encoder under `p` (models put it at `root / ENCODER`), drawing the
    /// variables in the order wte, wpe, blocks, ln_f.
    ///
    /// Errors: an invalid config ([`EncoderConfig::validate`]); on the CPU, weights that do not
    /// fit in this process's memory ([`ensure_weights_fit`]).
    pub fn new(p: &nn::Path<'_>, cfg: EncoderConfig) -> Result<Self> {
        cfg.validate()?;
        ensure_weights_fit(p, cfg.parameters(), "encoder", EncoderConfig::WEIGHT_KEYS)?;
        let d = cfg.n_embd as i64;
        let init = nn::Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        };
        let wte = p.f_var("wte", &[cfg.vocab_size as i64, d], init)?;
        let wpe = p.f_var("wpe", &[1, cfg.seq_len as i64, d], init)?;
        let proj_std = 0.02 / (2.0 * cfg.n_layer as f64).sqrt();
        let blocks = (0..cfg.n_layer)
            .map(|i| Block::new(&(p / "h" / i), cfg.attention(), cfg.mlp_ratio, proj_std))
            .collect::<Result<Vec<_>>>()?;
        let ln_f = LayerNorm::new(&(p / "ln_f"), d, cfg.bias)?;
        Ok(Self {
            cfg,
            wte,
            wpe,
            blocks,
            ln_f,
        })
    }

    /// The config.
    pub fn config(&self) -> &EncoderConfig {
        &self.cfg
    }

    /// Checks that `tokens` is B×T Int64 (T = `seq_len`) on the model's device with ids in
    /// [0, `vocab_size`).
    ///
    /// Errors: [`ModelsError::Shape`] naming `tokens`.
    pub fn check(&self, tokens: &Tensor) -> Result<()> {
        let size = tokens.size();
        let t = self.cfg.seq_len as i64;
        if size.len() != 2 || size[1] != t {
            return Err(ModelsError::Shape {
                arg: "tokens",
                reason: format!("expected B×{t} tokens, found {size:?}"),
            });
        }
        check::indices(
            tokens,
            "tokens",
            "token ids",
            self.cfg.vocab_size,
            None,
            self.wte.device(),
        )
    }

    /// The final hidden states LN_f(x_L) (B×T×D) and, with `trace`, every layer's attention
    /// trace. `tokens` is not checked: [`Encoder::try_forward_trace`] checks it first.
    ///
    /// # Panics
    ///
    /// On `tokens` that [`Encoder::check`] rejects (libtorch's error).
    pub fn forward_trace(&self, tokens: &Tensor, trace: bool) -> (Tensor, Vec<AttentionTrace>) {
        let mut x = Tensor::embedding(&self.wte, tokens, -1, false, false) + &self.wpe;
        let mut traces = Vec::new();
        for block in &self.blocks {
            let (y, tr) = block.forward_trace(&x, trace);
            x = y;
            traces.extend(tr);
        }
        (self.ln_f.forward(&x), traces)
    }

    /// [`Encoder::forward_trace`] after [`Encoder::check`].
    ///
    /// Errors: [`ModelsError::Shape`] naming `tokens`.
    pub fn try_forward_trace(
        &self,
        tokens: &Tensor,
        trace: bool,
    ) -> Result<(Tensor, Vec<AttentionTrace>)> {
        self.check(tokens)?;
        Ok(self.forward_trace(tokens, trace))
    }
}

impl Transformer for Encoder {
    fn blocks(&self) -> &[Block] {
        &self.blocks
    }
}

/// Whether a var-store name belongs to the encoder (starts with `encoder.`).
pub fn is_encoder_variable(name: &str) -> bool {
    name.strip_prefix(ENCODER)
        .is_some_and(|rest| rest.starts_with('.'))
}

/// Copies every encoder variable of `to` from the variable of the same name in `from` (see
/// the module docs); returns the names copied, sorted.
///
/// Errors: [`ModelsError::Transfer`] naming the variables missing from `from`, those `from`
/// has and `to` lacks, and each shape or kind mismatch.
pub fn copy_encoder(from: &nn::VarStore, to: &nn::VarStore) -> Result<Vec<String>> {
    transfer(&from.variables(), to, "the source model")
}

/// [`copy_encoder`] from a safetensors file whose tensor names are the var-store names behind
/// `prefix` (kappa-train's checkpoints store variable `v` as `model/v`: pass `"model/"`).
///
/// Errors: [`ModelsError::Checkpoint`] when the file cannot be read; [`ModelsError::Transfer`]
/// as for [`copy_encoder`].
pub fn load_encoder(path: &Path, prefix: &str, to: &nn::VarStore) -> Result<Vec<String>> {
    let tensors = Tensor::read_safetensors(path).map_err(|e| ModelsError::Checkpoint {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let vars: HashMap<String, Tensor> = tensors
        .into_iter()
        .filter_map(|(k, t)| k.strip_prefix(prefix).map(|n| (n.to_string(), t)))
        .collect();
    transfer(&vars, to, &path.display().to_string())
}

/// The transfer itself: every check first, then the copies (nothing is written on an error).
fn transfer(
    from: &HashMap<String, Tensor>,
    to: &nn::VarStore,
    source: &str,
) -> Result<Vec<String>> {
    let dst: HashMap<String, Tensor> = to
        .variables()
        .into_iter()
        .filter(|(n, _)| is_encoder_variable(n))
        .collect();
    let mut names: Vec<String> = dst.keys().cloned().collect();
    names.sort();
    let mut problems = Vec::new();
    let mut extra: Vec<&String> = from
        .keys()
        .filter(|n| is_encoder_variable(n) && !dst.contains_key(*n))
        .collect();
    extra.sort();
    if !extra.is_empty() {
        problems.push(format!(
            "{source} has encoder variables the model lacks: {extra:?}"
        ));
    }
    for name in &names {
        match from.get(name) {
            None => problems.push(format!("`{name}` is missing from {source}")),
            Some(src) if src.size() != dst[name].size() || src.kind() != dst[name].kind() => {
                problems.push(format!(
                    "`{name}` is {:?} {:?} in {source} and {:?} {:?} in the model",
                    src.size(),
                    src.kind(),
                    dst[name].size(),
                    dst[name].kind()
                ))
            }
            Some(_) => {}
        }
    }
    if names.is_empty() {
        problems.push("the model has no encoder variables".into());
    }
    if !problems.is_empty() {
        return Err(ModelsError::Transfer(problems.join("; ")));
    }
    tch::no_grad(|| -> Result<()> {
        for name in &names {
            let src = from[name].to_device(dst[name].device());
            dst[name].shallow_clone().f_copy_(&src)?;
        }
        Ok(())
    })?;
    Ok(names)
}
