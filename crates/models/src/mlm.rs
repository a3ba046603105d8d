//! Masked language modelling (BERT): the shared [`Encoder`] with a masked-LM head, BERT's
//! masking rule, and the byte-level vocabulary that pretraining and the movie-review
//! fine-tuning share.
//!
//! # Vocabulary
//!
//! Tokens are the UTF-8 bytes of the text (ids 0–255, [`TokenizerKind::Bytes`]), the padding
//! id [`PAD`] = 256 (the movie-review loader's) and the mask id [`MASK`] = 257: a vocabulary of
//! [`BYTE_VOCAB`] = 258, the same for the masked-LM model and the classifier it initializes.
//!
//! # The head
//!
//! At a selected position with final hidden state h (the encoder's LN_f output):
//! logits = LN(GELU(W_t h + b_t)) E^T + b, with E the token embedding `encoder.wte` (tied, as in
//! BERT), W_t ∈ ℝ^{D×D} N(0, 0.02²) (`mlm.transform`), LN with gain 1 (`mlm.ln`) and an output
//! bias b ∈ ℝ^V initialized 0 (`mlm.bias`). The head runs only on the selected positions, so
//! the loss — the mean cross-entropy over those positions — reads nothing else.
//!
//! # Masking ([`mask_tokens`], BERT's rule)
//!
//! In each sequence, of its n non-padding positions k = max(1, round(0.15·n)) are selected
//! uniformly without replacement (BERT's `create_pretraining_data` count); each selected
//! position becomes [`MASK`] with probability 0.8, a uniformly drawn byte (0–255, possibly the
//! same one) with probability 0.1, and stays unchanged otherwise. The targets are the original
//! tokens at the selected positions and [`IGNORE`] elsewhere. The draws come from ChaCha8
//! seeded by `seed` on stream `stream`, so a batch's masks are a pure function of (seed, step).
//!
//! [`TokenizerKind::Bytes`]: crate::data::TokenizerKind::Bytes

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::nn::Module as _;
use tch::{nn, Device, Kind, Tensor};

use crate::check;
use crate::conditioned_attention::AttentionTrace;
use crate::encoder::{Encoder, EncoderConfig, ENCODER};
use crate::error::{ModelsError, Result};
use crate::layers::{Block, LayerNorm, Transformer};
use crate::linear::Linear;

/// The padding id of byte-level text (one past the bytes).
pub const PAD: i64 = crate::data::sequences::text::PAD;
/// The mask id.
pub const MASK: i64 = PAD + 1;
/// Bytes, padding and mask.
pub const BYTE_VOCAB: usize = 258;
/// The target of a position that is not predicted.
pub const IGNORE: i64 = -100;

/// The fractions of BERT's masking rule.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaskingRule {
    /// Fraction of the non-padding positions selected for prediction (BERT: 0.15).
    pub select: f64,
    /// Of the selected, the fraction replaced by [`MASK`] (BERT: 0.8).
    pub mask: f64,
    /// Of the selected, the fraction replaced by a random byte (BERT: 0.1); the rest stay.
    pub random: f64,
}

impl Default for MaskingRule {
    /// BERT's 15 % / 80 % / 10 % / 10 %.
    fn default() -> Self {
        Self {
            select: 0.15,
            mask: 0.8,
            random: 0.1,
        }
    }
}

impl MaskingRule {
    /// Checks the fractions; errors name `masking.<field>`.
    pub fn validate(&self) -> Result<()> {
        let in_unit = |name: &str, v: f64, open_low: bool| {
            let ok = v.is_finite() && v <= 1.0 && if open_low { v > 0.0 } else { v >= 0.0 };
            if ok {
                Ok(())
            } else {
                Err(ModelsError::config(
                    format!("masking.{name}"),
                    format!(
                        "must lie in {}0, 1], found {v}",
                        if open_low { "(" } else { "[" }
                    ),
                ))
            }
        };
        in_unit("select", self.select, true)?;
        in_unit("mask", self.mask, false)?;
        in_unit("random", self.random, false)?;
        if self.mask + self.random > 1.0 {
            return Err(ModelsError::config(
                "masking.random",
                format!(
                    "mask + random must be ≤ 1, found {} + {}",
                    self.mask, self.random
                ),
            ));
        }
        Ok(())
    }
}

/// BERT's masking of byte-level `tokens` (B×T Int64; module docs): (inputs, targets), both
/// B×T Int64 on the device of `tokens`.
pub fn mask_tokens(
    tokens: &Tensor,
    rule: &MaskingRule,
    seed: u64,
    stream: u64,
) -> Result<(Tensor, Tensor)> {
    rule.validate()?;
    let size = tokens.size();
    if size.len() != 2 || tokens.kind() != Kind::Int64 {
        return Err(ModelsError::Shape {
            arg: "tokens",
            reason: format!("expected B×T Int64, found {size:?} {:?}", tokens.kind()),
        });
    }
    let t = size[1] as usize;
    let mut inputs = Vec::<i64>::try_from(tokens.flatten(0, -1).to_device(Device::Cpu))?;
    let mut targets = vec![IGNORE; inputs.len()];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    for (row, tgt) in inputs
        .chunks_mut(t.max(1))
        .zip(targets.chunks_mut(t.max(1)))
    {
        let mut candidates: Vec<usize> = (0..row.len()).filter(|&i| row[i] != PAD).collect();
        let n = candidates.len();
        if n == 0 {
            continue;
        }
        let k = ((rule.select * n as f64).round() as usize).clamp(1, n);
        for j in 0..k {
            let pick = rng.gen_range(j..n);
            candidates.swap(j, pick);
            let i = candidates[j];
            tgt[i] = row[i];
            let u: f64 = rng.gen();
            if u < rule.mask {
                row[i] = MASK;
            } else if u < rule.mask + rule.random {
                row[i] = rng.gen_range(0..256);
            }
        }
    }
    let device = tokens.device();
    let shape = [size[0], size[1]];
    Ok((
        Tensor::from_slice(&inputs).view(shape).to_device(device),
        Tensor::from_slice(&targets).view(shape).to_device(device),
    ))
}

/// A masked language model: the [`Encoder`] (path `encoder`) and the masked-LM head (path
/// `mlm`; module docs).
#[derive(Debug)]
pub struct MaskedLm {
    /// The encoder.
    pub encoder: Encoder,
    /// W_t, D → D.
    pub transform: Linear,
    /// The head's LayerNorm.
    pub ln: LayerNorm,
    /// The output bias (V).
    pub bias: Tensor,
}

/// The masked-LM loss of a batch and how many of its predictions were right.
#[derive(Debug)]
pub struct MlmOutput {
    /// Mean cross-entropy over the selected positions (with the graph).
    pub loss: Tensor,
    /// Selected positions whose arg-max prediction is the target.
    pub correct: i64,
    /// Selected positions.
    pub predicted: i64,
}

impl MaskedLm {
    /// Builds the model under `p` (inside [`crate::seeded`] for a reproducible init): the
    /// encoder's variables first, in the classifier's order, then the head's.
    ///
    /// ```
    /// use kappa_models::encoder::EncoderConfig;
    /// use kappa_models::mlm::{mask_tokens, MaskedLm, MaskingRule, BYTE_VOCAB};
    /// use kappa_models::{AttentionKernel, CorrectionConfig, ScoreScale};
    /// use tch::{nn, Device, Kind, Tensor};
    /// let cfg = EncoderConfig { vocab_size: BYTE_VOCAB, seq_len: 16, n_layer: 1, n_head: 2,
    ///     n_embd: 16, mlp_ratio: 2, bias: false, scaling: ScoreScale::InvSqrtK,
    ///     correction: CorrectionConfig::None, fused_kernel: true, kernel: AttentionKernel::Softmax };
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let model = MaskedLm::new(&vs.root(), cfg)?;
    /// let text = Tensor::from_slice(b"the state of the union is strong").narrow(0, 0, 32)
    ///     .to_kind(Kind::Int64).view([2, 16]);
    /// let (inputs, targets) = mask_tokens(&text, &MaskingRule::default(), 0, 0)?;
    /// let out = model.loss(&inputs, &targets)?;
    /// assert_eq!(out.predicted, 2 * 2); // round(0.15 · 16) = 2 per sequence
    /// # Ok::<(), kappa_models::ModelsError>(())
    /// ```
    pub fn new(p: &nn::Path<'_>, cfg: EncoderConfig) -> Result<Self> {
        let encoder = Encoder::new(&(p / ENCODER), cfg)?;
        let (d, v) = (cfg.n_embd as i64, cfg.vocab_size as i64);
        let head = p / "mlm";
        let transform = Linear::new(&(&head / "transform"), d, d, cfg.bias, 0.02)?;
        let ln = LayerNorm::new(&(&head / "ln"), d, cfg.bias)?;
        let bias = head.f_zeros("bias", &[v])?;
        Ok(Self {
            encoder,
            transform,
            ln,
            bias,
        })
    }

    /// The encoder's config.
    pub fn config(&self) -> &EncoderConfig {
        self.encoder.config()
    }

    /// Final hidden states (B×T×D) and, with `trace`, the attention traces. `tokens` is not
    /// checked: [`MaskedLm::try_forward_trace`] checks it first.
    ///
    /// # Panics
    ///
    /// On `tokens` that [`Encoder::check`] rejects (libtorch's error).
    pub fn forward_trace(&self, tokens: &Tensor, trace: bool) -> (Tensor, Vec<AttentionTrace>) {
        self.encoder.forward_trace(tokens, trace)
    }

    /// [`MaskedLm::forward_trace`] after [`Encoder::check`]: `tokens` B×T Int64 (T = `seq_len`)
    /// on the model's device, with ids in [0, `vocab_size`).
    ///
    /// Errors: [`ModelsError::Shape`] naming `tokens`.
    pub fn try_forward_trace(
        &self,
        tokens: &Tensor,
        trace: bool,
    ) -> Result<(Tensor, Vec<AttentionTrace>)> {
        self.encoder.try_forward_trace(tokens, trace)
    }

    /// The head on hidden states h (…×D): logits …×V.
    pub fn head(&self, h: &Tensor) -> Tensor {
        let z = self.ln.forward(&self.transform.forward(h).gelu("none"));
        z.linear(&self.encoder.wte, Some(&self.bias))
    }

    /// The masked-LM loss of `inputs` (B×T) against `targets` (B×T Int64 on the model's
    /// device, in [0, `vocab_size`) where a position is predicted and [`IGNORE`] elsewhere): the
    /// head runs on the selected positions only.
    ///
    /// Errors: [`ModelsError::Shape`] naming `tokens` for bad inputs (as [`Encoder::check`]),
    /// or `targets` for a bad shape, kind or device, targets outside the vocabulary, or no
    /// selected position.
    pub fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<MlmOutput> {
        self.encoder.check(inputs)?;
        if targets.size() != inputs.size() {
            return Err(ModelsError::Shape {
                arg: "targets",
                reason: format!("expected {:?}, found {:?}", inputs.size(), targets.size()),
            });
        }
        let v = self.config().vocab_size;
        check::indices(
            targets,
            "targets",
            "targets",
            v,
            Some(IGNORE),
            self.encoder.wte.device(),
        )?;
        let flat = targets.flatten(0, -1);
        let selected = flat.ne(IGNORE).nonzero().squeeze_dim(1);
        let predicted = selected.size()[0];
        if predicted == 0 {
            return Err(ModelsError::Shape {
                arg: "targets",
                reason: format!("expected a selected position (a target other than {IGNORE})"),
            });
        }
        let y = flat.index_select(0, &selected);
        let (h, _) = self.forward_trace(inputs, false);
        let d = h.size()[2];
        let logits = self.head(&h.reshape([-1, d]).index_select(0, &selected));
        let correct = tch::no_grad(|| {
            logits
                .argmax(-1, false)
                .eq_tensor(&y)
                .sum(Kind::Int64)
                .int64_value(&[])
        });
        Ok(MlmOutput {
            loss: logits.cross_entropy_for_logits(&y),
            correct,
            predicted,
        })
    }
}

impl Transformer for MaskedLm {
    fn blocks(&self) -> &[Block] {
        self.encoder.blocks()
    }
}
