//! A sequence classifier for long-range tasks (Long Range Arena style) and for fine-tuning a
//! pretrained encoder: the shared [`Encoder`] (token embedding, learned positions, pre-LN
//! blocks with bidirectional attention — exact softmax or Nyström ([`AttentionKernel`]), either
//! with any conditioning — and a final LayerNorm) under the var-store path
//! [`ENCODER`], mean pooling over the non-padding tokens and a linear
//! head (`head`).
//!
//! Padding: tokens equal to `pad_id` are excluded from the pooled mean (a sequence of padding
//! only pools to 0); attention itself sees them as tokens (no attention mask: Nyström's segment
//! means have no masked form without changing its landmarks, and the same model with either
//! kernel must see the same inputs). Initialization as [`crate::vit`]: embeddings, positions and
//! head N(0, 0.02²), blocks as [`crate::layers::Block`].

use serde::{Deserialize, Serialize};
use tch::nn::Module as _;
use tch::{nn, Tensor};

use kappa_attention::ScoreScale;

use crate::check;
use crate::conditioned_attention::{
    AttentionConfig, AttentionKernel, AttentionTrace, CorrectionConfig,
};
use crate::encoder::{Encoder, EncoderConfig, ENCODER};
use crate::error::{ModelsError, Result};
use crate::layers::{ensure_weights_fit, Block, Transformer};
use crate::linear::Linear;

/// The size and attention settings of a [`SequenceClassifier`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SequenceClassifierConfig {
    /// Token vocabulary (including the padding token).
    pub vocab_size: usize,
    /// Sequence length T (every input is B×T; with Nyström, a multiple of the landmarks).
    pub seq_len: usize,
    /// The padding token, excluded from the pooled mean (`None`: no padding, as in pixel
    /// sequences, every position is pooled).
    pub pad_id: Option<i64>,
    /// Classes.
    pub num_classes: usize,
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

impl SequenceClassifierConfig {
    /// A model for tests: 16 tokens of a 12-token vocabulary, D = 16, 2 layers, 2 heads.
    pub fn tiny(kernel: AttentionKernel) -> Self {
        Self {
            vocab_size: 12,
            seq_len: 16,
            pad_id: Some(0),
            num_classes: 3,
            n_layer: 2,
            n_head: 2,
            n_embd: 16,
            mlp_ratio: 2,
            bias: false,
            scaling: ScoreScale::InvSqrtK,
            correction: CorrectionConfig::None,
            fused_kernel: true,
            kernel,
        }
    }

    /// The attention settings of every layer (bidirectional).
    pub fn attention(&self) -> AttentionConfig {
        self.encoder().attention()
    }

    /// The encoder part of the config.
    pub fn encoder(&self) -> EncoderConfig {
        EncoderConfig {
            vocab_size: self.vocab_size,
            seq_len: self.seq_len,
            n_layer: self.n_layer,
            n_head: self.n_head,
            n_embd: self.n_embd,
            mlp_ratio: self.mlp_ratio,
            bias: self.bias,
            scaling: self.scaling,
            correction: self.correction,
            fused_kernel: self.fused_kernel,
            kernel: self.kernel,
        }
    }

    /// A classifier on `encoder` with `num_classes` classes and the padding token `pad_id`
    /// (the fine-tuning model of a pretrained encoder).
    pub fn from_encoder(encoder: EncoderConfig, pad_id: Option<i64>, num_classes: usize) -> Self {
        Self {
            vocab_size: encoder.vocab_size,
            seq_len: encoder.seq_len,
            pad_id,
            num_classes,
            n_layer: encoder.n_layer,
            n_head: encoder.n_head,
            n_embd: encoder.n_embd,
            mlp_ratio: encoder.mlp_ratio,
            bias: encoder.bias,
            scaling: encoder.scaling,
            correction: encoder.correction,
            fused_kernel: encoder.fused_kernel,
            kernel: encoder.kernel,
        }
    }

    /// Checks every size; errors name the field.
    pub fn validate(&self) -> Result<()> {
        if self.num_classes == 0 {
            return Err(ModelsError::config("model.num_classes", "must be ≥ 1"));
        }
        self.encoder().validate()?;
        if let Some(pad) = self
            .pad_id
            .filter(|p| !(0..self.vocab_size as i64).contains(p))
        {
            return Err(ModelsError::config(
                "model.pad_id",
                format!(
                    "must be a token below vocab_size = {}, found {pad}",
                    self.vocab_size
                ),
            ));
        }
        Ok(())
    }
}

/// The classifier (module docs).
#[derive(Debug)]
pub struct SequenceClassifier {
    cfg: SequenceClassifierConfig,
    /// The encoder (var-store path `encoder`).
    pub encoder: Encoder,
    /// D → classes.
    pub head: Linear,
}

impl SequenceClassifier {
    /// Builds the model under `p` (inside [`crate::seeded`] for a reproducible init).
    ///
    /// ```
    /// use kappa_models::classifier::{SequenceClassifier, SequenceClassifierConfig};
    /// use kappa_models::{AttentionKernel, NystromConfig};
    /// use tch::{nn, Device, Kind, Tensor};
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let cfg = SequenceClassifierConfig::tiny(AttentionKernel::Nystrom(NystromConfig::paper(4)));
    /// let model = SequenceClassifier::new(&vs.root(), cfg)?;
    /// let tokens = Tensor::ones([2, 16], (Kind::Int64, Device::Cpu));
    /// assert_eq!(model.logits(&tokens)?.size(), vec![2, 3]);
    /// # Ok::<(), kappa_models::ModelsError>(())
    /// ```
    ///
    /// Errors: an invalid config ([`SequenceClassifierConfig::validate`]); on the CPU, weights
    /// (the encoder's and the head's D·classes) that do not fit in this process's memory
    /// ([`ensure_weights_fit`]).
    pub fn new(p: &nn::Path<'_>, cfg: SequenceClassifierConfig) -> Result<Self> {
        cfg.validate()?;
        let classes = cfg.num_classes as u128;
        let head = (cfg.n_embd as u128 + u128::from(cfg.bias)).checked_mul(classes);
        let weights = cfg
            .encoder()
            .parameters()
            .zip(head)
            .map(|(e, h)| e.checked_add(h));
        let keys = format!("{}, model.num_classes", EncoderConfig::WEIGHT_KEYS);
        ensure_weights_fit(p, weights.flatten(), "classifier", &keys)?;
        let encoder = Encoder::new(&(p / ENCODER), cfg.encoder())?;
        let d = cfg.n_embd as i64;
        let head = Linear::new(&(p / "head"), d, cfg.num_classes as i64, cfg.bias, 0.02)?;
        Ok(Self { cfg, encoder, head })
    }

    /// The config.
    pub fn config(&self) -> &SequenceClassifierConfig {
        &self.cfg
    }

    /// Logits B×classes and, with `trace`, every layer's attention trace. `tokens` is not
    /// checked: [`SequenceClassifier::try_forward_trace`] checks it first.
    ///
    /// # Panics
    ///
    /// On `tokens` that [`Encoder::check`] rejects (libtorch's error).
    pub fn forward_trace(&self, tokens: &Tensor, trace: bool) -> (Tensor, Vec<AttentionTrace>) {
        let (h, traces) = self.encoder.forward_trace(tokens, trace);
        let pooled = pool(&h, tokens, self.cfg.pad_id);
        (self.head.forward(&pooled), traces)
    }

    /// [`SequenceClassifier::forward_trace`] after [`Encoder::check`]: `tokens` B×T Int64
    /// (T = `seq_len`) on the model's device, with ids in [0, `vocab_size`).
    ///
    /// Errors: [`ModelsError::Shape`] naming `tokens`.
    pub fn try_forward_trace(
        &self,
        tokens: &Tensor,
        trace: bool,
    ) -> Result<(Tensor, Vec<AttentionTrace>)> {
        self.encoder.check(tokens)?;
        Ok(self.forward_trace(tokens, trace))
    }

    /// Checked logits B×classes.
    ///
    /// Errors: as [`SequenceClassifier::try_forward_trace`].
    pub fn logits(&self, tokens: &Tensor) -> Result<Tensor> {
        Ok(self.try_forward_trace(tokens, false)?.0)
    }

    /// Mean cross-entropy against integer `labels` (B Int64 on the model's device, each in
    /// [0, `num_classes`)).
    ///
    /// Errors: [`ModelsError::Shape`] naming `tokens` (as
    /// [`SequenceClassifier::try_forward_trace`]) or `labels`.
    pub fn loss(&self, tokens: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let logits = self.logits(tokens)?;
        let b = tokens.size()[0];
        check::labels(labels, b, self.cfg.num_classes, self.encoder.wte.device())?;
        Ok(logits.cross_entropy_for_logits(labels))
    }
}

/// The mean of `h` (B×T×D) over the positions whose token is not `pad_id` (B×D; 0 for a
/// sequence of padding only), or over every position without a padding token.
fn pool(h: &Tensor, tokens: &Tensor, pad_id: Option<i64>) -> Tensor {
    let Some(pad_id) = pad_id else {
        return h.mean_dim(1, false, h.kind());
    };
    let keep = tokens.ne(pad_id).to_kind(h.kind()).unsqueeze(-1);
    let count = keep.sum_dim_intlist(1, false, h.kind()).clamp_min(1.0);
    (h * &keep).sum_dim_intlist(1, false, keep.kind()) / count
}

impl Transformer for SequenceClassifier {
    fn blocks(&self) -> &[Block] {
        self.encoder.blocks()
    }
}

impl nn::Module for SequenceClassifier {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.forward_trace(xs, false).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nystrom::{NystromConfig, Pinv};
    use tch::{Device, Kind};

    fn tokens(seed: u64) -> Tensor {
        crate::seeded(seed, || {
            Tensor::randint_low(1, 12, [4, 16], (Kind::Int64, Device::Cpu))
        })
    }

    #[test]
    fn both_kernels_give_chance_level_loss_and_gradients() {
        for kernel in [
            AttentionKernel::Softmax,
            AttentionKernel::Nystrom(NystromConfig::paper(4)),
        ] {
            tch::manual_seed(0);
            let vs = nn::VarStore::new(Device::Cpu);
            let m = SequenceClassifier::new(&vs.root(), SequenceClassifierConfig::tiny(kernel))
                .unwrap();
            let x = tokens(1);
            let loss = m.loss(&x, &Tensor::from_slice(&[0i64, 1, 2, 0])).unwrap();
            assert!(
                (loss.double_value(&[]) - 3f64.ln()).abs() < 0.2,
                "{kernel:?}"
            );
            loss.backward();
            for t in vs.trainable_variables() {
                assert!(t.grad().defined());
            }
        }
    }

    #[test]
    fn pooling_averages_the_kept_positions_only() {
        let h = crate::seeded(5, || Tensor::randn([2, 16, 8], (Kind::Double, Device::Cpu)));
        let mut ids = vec![3i64; 32];
        ids[10..16].fill(0);
        ids[16..].fill(0); // the second sequence is padding only
        let t = Tensor::from_slice(&ids).view([2, 16]);
        let pooled = pool(&h, &t, Some(0));
        let want = h.get(0).narrow(0, 0, 10).mean_dim(0, false, Kind::Double);
        assert!(pooled.get(0).allclose(&want, 1e-12, 1e-12, false));
        assert_eq!(pooled.get(1).abs().max().double_value(&[]), 0.0);
        // Without a padding token every position counts, 0 included.
        let all = pool(&h, &t, None);
        assert!(all.allclose(&h.mean_dim(1, false, Kind::Double), 1e-12, 1e-12, false));
    }

    #[test]
    fn bad_tokens_labels_and_configs_are_errors() {
        let exact = NystromConfig {
            landmarks: 5,
            pinv: Pinv::Exact,
            conv_kernel: 0,
        };
        let e = SequenceClassifierConfig::tiny(AttentionKernel::Nystrom(exact)).validate();
        assert!(e.unwrap_err().to_string().contains("landmarks"));
        let bad_pad = SequenceClassifierConfig {
            pad_id: Some(12),
            ..SequenceClassifierConfig::tiny(AttentionKernel::Softmax)
        };
        assert!(bad_pad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("pad_id"));
        let vs = nn::VarStore::new(Device::Cpu);
        let m = SequenceClassifier::new(
            &vs.root(),
            SequenceClassifierConfig::tiny(AttentionKernel::Softmax),
        )
        .unwrap();
        let too_big = Tensor::full([1, 16], 12, (Kind::Int64, Device::Cpu));
        assert!(m
            .logits(&too_big)
            .unwrap_err()
            .to_string()
            .contains("token ids"));
        assert!(m
            .logits(&Tensor::zeros([1, 15], (Kind::Int64, Device::Cpu)))
            .is_err());
        assert!(m.loss(&tokens(2), &Tensor::from_slice(&[0i64])).is_err());
    }
}
