//! A nanoGPT-style decoder: token and learned position embeddings, pre-LN blocks with causal
//! (optionally conditioned) attention and a GELU MLP, a final LayerNorm, and an output head
//! tied to the token embedding.
//!
//! logits = LN_f(blocks(wte\[idx\] + wpe\[0..T\])) · wteᵀ. Initialization follows nanoGPT: every
//! weight N(0, 0.02²) except the residual output projections (`attn.c_proj`, `mlp.c_proj`),
//! N(0, (0.02/√(2L))²); biases 0; LayerNorm gains 1.

use serde::{Deserialize, Serialize};
use tch::nn::Module as _;
use tch::{nn, Kind, Tensor};

use kappa_attention::ScoreScale;

use crate::check;
use crate::conditioned_attention::{
    AttentionConfig, AttentionKernel, AttentionTrace, CorrectionConfig,
};
use crate::diagnostics::DiagnosticsConfig;
use crate::error::{ModelsError, Result};
use crate::layers::{
    block_parameters, ensure_weights_fit, Block, LayerNorm, StepSize, Transformer,
};
use crate::mlm::IGNORE;

/// The size and the attention settings of a [`Gpt`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GptConfig {
    /// Vocabulary size V.
    pub vocab_size: usize,
    /// Context length T (the number of learned positions).
    pub block_size: usize,
    /// Blocks L.
    pub n_layer: usize,
    /// Heads H.
    pub n_head: usize,
    /// Width D.
    pub n_embd: usize,
    /// MLP hidden width over D (4 in GPT-2).
    pub mlp_ratio: usize,
    /// Biases in linear layers and LayerNorms.
    pub bias: bool,
    /// The score scale s (every preset names it: `"inv_sqrt_k"`).
    pub scaling: ScoreScale,
    /// The spectral correction of every attention layer.
    #[serde(alias = "conditioning")]
    pub correction: CorrectionConfig,
    /// Use libtorch's fused attention kernel.
    pub fused_kernel: bool,
}

impl GptConfig {
    /// A model for tests: D = 16, 2 layers, 2 heads, T = 16.
    pub fn tiny(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            block_size: 16,
            n_layer: 2,
            n_head: 2,
            n_embd: 16,
            mlp_ratio: 4,
            bias: false,
            scaling: ScoreScale::InvSqrtK,
            correction: CorrectionConfig::None,
            fused_kernel: true,
        }
    }

    /// A character-level model sized for 2 CPU cores: D = 64, 2 layers, 4 heads (k = 16),
    /// T = 64 (about 0.11 M parameters at V ≈ 100).
    pub fn cpu(vocab_size: usize) -> Self {
        Self {
            block_size: 64,
            n_layer: 2,
            n_head: 4,
            n_embd: 64,
            ..Self::tiny(vocab_size)
        }
    }

    /// GPT-2 small: V = 50257, T = 1024, 12 layers, 12 heads, D = 768, biases (124 M
    /// parameters).
    pub fn gpt2_small() -> Self {
        Self {
            vocab_size: 50257,
            block_size: 1024,
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
            mlp_ratio: 4,
            bias: true,
            scaling: ScoreScale::InvSqrtK,
            correction: CorrectionConfig::None,
            fused_kernel: true,
        }
    }

    /// The same model with `vocab_size` set to `vocab` when it is 0 (configs leave it 0 to take
    /// the tokenizer's).
    ///
    /// ```
    /// let c = kappa_models::GptConfig::tiny(0).or_vocab(98);
    /// assert_eq!((c.vocab_size, c.or_vocab(5).vocab_size), (98, 98));
    /// ```
    pub fn or_vocab(self, vocab: usize) -> Self {
        Self {
            vocab_size: if self.vocab_size == 0 {
                vocab
            } else {
                self.vocab_size
            },
            ..self
        }
    }

    /// The same model with another correction.
    pub fn with_correction(self, correction: CorrectionConfig) -> Self {
        Self { correction, ..self }
    }

    /// The old name of [`GptConfig::with_correction`].
    #[deprecated(since = "0.2.0", note = "renamed `with_correction`")]
    pub fn with_conditioning(self, correction: CorrectionConfig) -> Self {
        self.with_correction(correction)
    }

    /// The attention settings of every layer.
    pub fn attention(&self) -> AttentionConfig {
        AttentionConfig {
            n_embd: self.n_embd,
            n_head: self.n_head,
            bias: self.bias,
            causal: true,
            scaling: self.scaling,
            correction: self.correction,
            fused_kernel: self.fused_kernel,
            kernel: AttentionKernel::Softmax,
        }
    }

    /// The keys that size the model's weights, as errors name them.
    pub const WEIGHT_KEYS: &'static str =
        "model.vocab_size, model.block_size, model.n_layer, model.n_embd, model.mlp_ratio";

    /// Checks every size; errors name the field (`model.n_head`, ...). The sizes have no fixed
    /// maximum: they are bounded by the memory they take ([`GptConfig::training_bytes`],
    /// checked where the batch is known; [`Gpt::new`] checks the weights).
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
            ("n_layer", self.n_layer),
            ("mlp_ratio", self.mlp_ratio),
        ] {
            if v == 0 {
                return Err(ModelsError::config(format!("model.{name}"), "must be ≥ 1"));
            }
        }
        self.attention().validate("model")
    }

    /// Trainable parameters (the tied head counted once): (V + T)·D embeddings, L blocks
    /// ([`block_parameters`]) and the final LayerNorm; `None` when the count overflows u128.
    pub fn parameters(&self) -> Option<u128> {
        let (v, t, l, d) = (
            self.vocab_size as u128,
            self.block_size as u128,
            self.n_layer as u128,
            self.n_embd as u128,
        );
        let ln_f = d * (1 + u128::from(self.bias));
        let blocks = l.checked_mul(block_parameters(self.n_embd, self.mlp_ratio, self.bias)?)?;
        (v + t)
            .checked_mul(d)?
            .checked_add(blocks)?
            .checked_add(ln_f)
    }

    /// [`GptConfig::parameters`] as a `usize` (`usize::MAX` when it does not fit one).
    pub fn parameter_count(&self) -> usize {
        self.parameters()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(usize::MAX)
    }

    /// The bytes of one training step of this model at `batch` sequences of `block_size`
    /// tokens, with an evaluation batch of the same size and `diagnostics` at every
    /// evaluation ([`StepSize::bytes`] states the formula; the input is 2 words per token id,
    /// the output T·V logits). `None` when it overflows u128.
    pub fn training_bytes(&self, batch: usize, diagnostics: &DiagnosticsConfig) -> Option<u128> {
        let t = self.block_size as u128;
        StepSize {
            parameters: self.parameters()?,
            batch,
            eval_batch: batch,
            tokens: self.block_size,
            n_embd: self.n_embd,
            n_head: self.n_head,
            n_layer: self.n_layer,
            mlp_ratio: self.mlp_ratio,
            causal: true,
            input: 2 * t,
            outputs: t.checked_mul(self.vocab_size as u128)?,
            diagnostics: *diagnostics,
        }
        .bytes()
    }

    /// Forward FLOPs per token (multiply–adds × 2) for a context of `t` tokens: the matmuls
    /// 2·(12·L·D² + V·D) plus the attention products 2·L·2·t·D (half of them masked away
    /// for causal attention, counted in full as nanoGPT's estimate does).
    pub fn flops_per_token(&self, t: usize) -> f64 {
        let (l, d, v, r) = (
            self.n_layer as f64,
            self.n_embd as f64,
            self.vocab_size as f64,
            self.mlp_ratio as f64,
        );
        2.0 * (l * (4.0 + 2.0 * r) * d * d + v * d) + 2.0 * l * 2.0 * t as f64 * d
    }
}

/// The decoder.
#[derive(Debug)]
pub struct Gpt {
    cfg: GptConfig,
    /// Token embedding V×D (also the output head).
    pub wte: Tensor,
    /// Position embedding T×D.
    pub wpe: Tensor,
    blocks: Vec<Block>,
    /// The final LayerNorm.
    pub ln_f: LayerNorm,
}

impl Gpt {
    /// Builds the model under `p` (call `tch::manual_seed` first for a reproducible init).
    ///
    /// ```
    /// use kappa_models::gpt::{Gpt, GptConfig};
    /// use tch::{nn, Device, Kind, Tensor};
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let gpt = Gpt::new(&vs.root(), GptConfig::tiny(11))?;
    /// let idx = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
    /// assert_eq!(gpt.logits(&idx)?.size(), vec![1, 4, 11]);
    /// # Ok::<(), kappa_models::ModelsError>(())
    /// ```
    ///
    /// Errors: an invalid config ([`GptConfig::validate`]); on the CPU, weights that do not fit
    /// in this process's memory ([`ensure_weights_fit`]: an error naming the keys, where tch's
    /// initializers would panic on the failed allocation).
    pub fn new(p: &nn::Path<'_>, cfg: GptConfig) -> Result<Self> {
        cfg.validate()?;
        ensure_weights_fit(p, cfg.parameters(), "GPT", GptConfig::WEIGHT_KEYS)?;
        let d = cfg.n_embd as i64;
        let init = nn::Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        };
        let wte = p.f_var("wte", &[cfg.vocab_size as i64, d], init)?;
        let wpe = p.f_var("wpe", &[cfg.block_size as i64, d], init)?;
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
    pub fn config(&self) -> &GptConfig {
        &self.cfg
    }

    /// Checks that `idx` is B×T Int64 with 1 ≤ T ≤ `block_size`, on the model's device, with
    /// ids in [0, `vocab_size`).
    fn check(&self, idx: &Tensor) -> Result<()> {
        let size = idx.size();
        if size.len() != 2 || size[1] < 1 || size[1] > self.cfg.block_size as i64 {
            return Err(ModelsError::Shape {
                arg: "idx",
                reason: format!(
                    "expected B×T token ids with 1 ≤ T ≤ {}, found {size:?}",
                    self.cfg.block_size
                ),
            });
        }
        check::indices(
            idx,
            "idx",
            "token ids",
            self.cfg.vocab_size,
            None,
            self.wte.device(),
        )
    }

    /// Logits B×T×V and, with `trace`, every layer's attention trace. `idx` is not checked:
    /// [`Gpt::try_forward_trace`] checks it first.
    ///
    /// # Panics
    ///
    /// On an `idx` that [`Gpt::try_forward_trace`] rejects (libtorch's error, or an index out
    /// of bounds for fewer than 2 dimensions).
    pub fn forward_trace(&self, idx: &Tensor, trace: bool) -> (Tensor, Vec<AttentionTrace>) {
        let t = idx.size()[1];
        let pos = Tensor::arange(t, (Kind::Int64, idx.device()));
        let mut x = Tensor::embedding(&self.wte, idx, -1, false, false)
            + Tensor::embedding(&self.wpe, &pos, -1, false, false);
        let mut traces = Vec::new();
        for block in &self.blocks {
            let (y, tr) = block.forward_trace(&x, trace);
            x = y;
            traces.extend(tr);
        }
        let logits = self.ln_f.forward(&x).matmul(&self.wte.tr());
        (logits, traces)
    }

    /// [`Gpt::forward_trace`] after checking `idx`: B×T Int64 with 1 ≤ T ≤ `block_size`, on the
    /// model's device, with ids in [0, `vocab_size`).
    ///
    /// Errors: [`ModelsError::Shape`] naming `idx`.
    pub fn try_forward_trace(
        &self,
        idx: &Tensor,
        trace: bool,
    ) -> Result<(Tensor, Vec<AttentionTrace>)> {
        self.check(idx)?;
        Ok(self.forward_trace(idx, trace))
    }

    /// Checked logits B×T×V.
    ///
    /// Errors: as [`Gpt::try_forward_trace`].
    pub fn logits(&self, idx: &Tensor) -> Result<Tensor> {
        Ok(self.try_forward_trace(idx, false)?.0)
    }

    /// Mean next-token cross-entropy of `idx` against `targets` (both B×T Int64 on the model's
    /// device). Targets lie in [0, `vocab_size`) or are [`crate::mlm::IGNORE`] (-100,
    /// PyTorch's ignore index), which leaves the position out of the mean; with every position
    /// left out the mean is NaN.
    ///
    /// Errors: [`ModelsError::Shape`] naming `idx` (as [`Gpt::try_forward_trace`]) or
    /// `targets`.
    pub fn loss(&self, idx: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self.check(idx)?;
        if targets.size() != idx.size() {
            return Err(ModelsError::Shape {
                arg: "targets",
                reason: format!("expected {:?}, found {:?}", idx.size(), targets.size()),
            });
        }
        let v = self.cfg.vocab_size;
        check::indices(
            targets,
            "targets",
            "targets",
            v,
            Some(IGNORE),
            self.wte.device(),
        )?;
        let logits = self.forward_trace(idx, false).0;
        Ok(logits
            .view([-1, v as i64])
            .cross_entropy_for_logits(&targets.reshape([-1])))
    }
}

impl Transformer for Gpt {
    fn blocks(&self) -> &[Block] {
        &self.blocks
    }
}

impl nn::Module for Gpt {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.forward_trace(xs, false).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    /// Configs written before the rename (`conditioning = …`) read as `correction`; both names
    /// at once are a duplicate-field error, not a silent choice.
    #[test]
    fn the_old_key_conditioning_reads_as_correction() {
        let mut cfg = GptConfig::tiny(13).with_correction(CorrectionConfig::identity(
            10.0,
            kappa_attention::HeadLayout::Shifted,
        ));
        let new = serde_json::to_value(cfg).unwrap();
        let mut old = new.clone();
        let c = old.as_object_mut().unwrap().remove("correction").unwrap();
        old.as_object_mut()
            .unwrap()
            .insert("conditioning".into(), c.clone());
        assert_eq!(
            serde_json::from_value::<GptConfig>(old.clone()).unwrap(),
            cfg
        );
        old.as_object_mut().unwrap().insert("correction".into(), c);
        assert!(serde_json::from_value::<GptConfig>(old).is_err());
        cfg.correction = CorrectionConfig::None;
        assert_ne!(serde_json::from_value::<GptConfig>(new).unwrap(), cfg);
    }

    #[test]
    fn parameter_count_matches_the_var_store_and_gpt2_small_has_124m() {
        for bias in [false, true] {
            let cfg = GptConfig {
                bias,
                ..GptConfig::tiny(13)
            };
            let vs = nn::VarStore::new(Device::Cpu);
            let _m = Gpt::new(&vs.root(), cfg).unwrap();
            let n: usize = vs.trainable_variables().iter().map(Tensor::numel).sum();
            assert_eq!(n, cfg.parameter_count());
        }
        let p = GptConfig::gpt2_small().parameter_count();
        assert!((124_000_000..124_500_000).contains(&p), "{p}");
    }

    #[test]
    fn the_training_bytes_follow_the_stated_formula_and_an_overflow_is_none() {
        // V = 10, T = 16, L = 2, H = 2 (k = 8), D = 16, r = 4.
        let cfg = GptConfig::tiny(10);
        let off = DiagnosticsConfig {
            enabled: false,
            samples: 2,
            jacobian_max_tokens: 8,
        };
        let p = cfg.parameters().unwrap();
        // a = T·D·(14 + 2r) + 2·H·T² = 5632 + 1024; I + 2·O = 2·16 + 2·160.
        let (a, ends) = (6656, 352);
        let words = 4 * p + 3 * (2 * a + ends) + 3 * (a + ends);
        assert_eq!(cfg.training_bytes(3, &off), Some(4 * words));
        // Diagnostics: n·L·(2·H·T² + T·D) traces and 6·(N·k)·(3·(D + 1)·k) for the Jacobian of
        // the first N = 8 tokens.
        let on = DiagnosticsConfig {
            enabled: true,
            ..off
        };
        let diagnosis = 2 * 2 * (1024 + 256) + 6 * (8 * 8) * (3 * 17 * 8);
        assert_eq!(cfg.training_bytes(3, &on), Some(4 * (words + diagnosis)));
        let huge = GptConfig {
            vocab_size: usize::MAX,
            n_embd: usize::MAX - 1,
            ..cfg
        };
        assert_eq!(huge.parameters(), None);
        assert_eq!(huge.training_bytes(1, &off), None);
        assert_eq!(huge.parameter_count(), usize::MAX);
    }

    #[test]
    fn a_gpt_too_large_for_memory_is_an_error_naming_its_keys_before_a_weight_is_built() {
        let vs = nn::VarStore::new(Device::Cpu);
        for cfg in [
            GptConfig {
                n_layer: 1_000_000_000,
                ..GptConfig::tiny(13)
            },
            GptConfig {
                n_embd: usize::MAX - 1,
                ..GptConfig::tiny(13)
            },
        ] {
            let err = Gpt::new(&vs.root(), cfg).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, ModelsError::TooLarge { .. }), "{text}");
            assert!(text.contains("model.n_layer, model.n_embd"), "{text}");
        }
        assert!(vs.variables().is_empty());
    }

    #[test]
    fn causality_future_tokens_do_not_change_past_logits() {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let m = Gpt::new(&vs.root(), GptConfig::tiny(7)).unwrap();
        let a = Tensor::from_slice(&[1i64, 2, 3, 4, 5]).view([1, 5]);
        let b = Tensor::from_slice(&[1i64, 2, 3, 6, 0]).view([1, 5]);
        let (la, lb) = (m.logits(&a).unwrap(), m.logits(&b).unwrap());
        let d = (la.narrow(1, 0, 3) - lb.narrow(1, 0, 3))
            .abs()
            .max()
            .double_value(&[]);
        assert!(d < 1e-6, "{d}");
        assert!(
            (la.narrow(1, 3, 1) - lb.narrow(1, 3, 1))
                .abs()
                .max()
                .double_value(&[])
                > 1e-6
        );
    }

    #[test]
    fn loss_starts_near_log_vocab_and_gradients_reach_every_parameter() {
        tch::manual_seed(1);
        let vs = nn::VarStore::new(Device::Cpu);
        let m = Gpt::new(
            &vs.root(),
            GptConfig::tiny(20).with_correction(CorrectionConfig::identity(
                1.0,
                kappa_attention::HeadLayout::Shifted,
            )),
        )
        .unwrap();
        let idx = Tensor::randint(20, [3, 16], (Kind::Int64, Device::Cpu));
        let loss = m.loss(&idx, &idx.roll([1], [1])).unwrap();
        assert!((loss.double_value(&[]) - 20f64.ln()).abs() < 0.3);
        loss.backward();
        for t in vs.trainable_variables() {
            assert!(t.grad().defined());
        }
        assert!(m
            .logits(&Tensor::zeros([1, 17], (Kind::Int64, Device::Cpu)))
            .is_err());
        assert!(m
            .logits(&Tensor::zeros([1, 4], (Kind::Float, Device::Cpu)))
            .is_err());
    }
}
