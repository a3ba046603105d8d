//! The building blocks shared by GPT and ViT: `LayerNorm` (optional bias), the GELU MLP and the
//! pre-LN transformer block (the projections are [`crate::linear::Linear`]).
//!
//! Block: x ← x + Attn(LN₁(x)); x ← x + MLP(LN₂(x)), with MLP(x) = W₂ GELU(W₁x + b₁) + b₂ and
//! exact (erf) GELU, as in nanoGPT and ViT.

use tch::nn::Module as _;
use tch::{nn, Tensor};

use crate::conditioned_attention::{AttentionConfig, AttentionTrace, ConditionedAttention};
use crate::diagnostics::DiagnosticsConfig;
use crate::error::Result;
use crate::linear::Linear;
use crate::max_logit::QkClipReport;
use crate::memory::ensure_fits;
use kappa_optim::QkClipConfig;

/// LayerNorm over the last dimension (ε = 1e-5) with gain 1 and, optionally, bias 0.
#[derive(Debug)]
pub struct LayerNorm {
    /// The gain γ.
    pub weight: Tensor,
    /// The bias β.
    pub bias: Option<Tensor>,
    dim: i64,
}

impl LayerNorm {
    /// Creates `weight` (and `bias`) under `p`.
    pub fn new(p: &nn::Path<'_>, dim: i64, bias: bool) -> Result<Self> {
        let weight = p.f_ones("weight", &[dim])?;
        let bias = if bias {
            Some(p.f_zeros("bias", &[dim])?)
        } else {
            None
        };
        Ok(Self { weight, bias, dim })
    }
}

impl LayerNorm {
    /// The normalized tokens x̂ = (x − μ)/√(σ² + ε), without the gain and bias.
    pub fn normalize(&self, xs: &Tensor) -> Tensor {
        xs.layer_norm([self.dim], None::<Tensor>, None::<Tensor>, 1e-5, true)
    }
}

impl nn::Module for LayerNorm {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs.layer_norm(
            [self.dim],
            Some(&self.weight),
            self.bias.as_ref(),
            1e-5,
            true,
        )
    }
}

/// The two-layer GELU MLP of a transformer block.
#[derive(Debug)]
pub struct Mlp {
    /// D → r·D.
    pub c_fc: Linear,
    /// r·D → D.
    pub c_proj: Linear,
}

impl nn::Module for Mlp {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.c_proj.forward(&self.c_fc.forward(xs).gelu("none"))
    }
}

/// A pre-LN transformer block.
#[derive(Debug)]
pub struct Block {
    /// LayerNorm before attention.
    pub ln_1: LayerNorm,
    /// The (conditioned) attention.
    pub attn: ConditionedAttention,
    /// LayerNorm before the MLP.
    pub ln_2: LayerNorm,
    /// The MLP.
    pub mlp: Mlp,
}

impl Block {
    /// Creates the block under `p`; the output projections get N(0, proj_std²) weights
    /// (nanoGPT: 0.02/√(2L)).
    pub fn new(
        p: &nn::Path<'_>,
        cfg: AttentionConfig,
        mlp_ratio: usize,
        proj_std: f64,
    ) -> Result<Self> {
        let d = cfg.n_embd as i64;
        let hidden = d * mlp_ratio as i64;
        Ok(Self {
            ln_1: LayerNorm::new(&(p / "ln_1"), d, cfg.bias)?,
            attn: ConditionedAttention::new(p / "attn", cfg, proj_std)?,
            ln_2: LayerNorm::new(&(p / "ln_2"), d, cfg.bias)?,
            mlp: Mlp {
                c_fc: Linear::new(&(p / "mlp" / "c_fc"), d, hidden, cfg.bias, 0.02)?,
                c_proj: Linear::new(&(p / "mlp" / "c_proj"), hidden, d, cfg.bias, proj_std)?,
            },
        })
    }

    /// The block on x (B×T×D), with the attention trace when asked.
    pub fn forward_trace(&self, x: &Tensor, trace: bool) -> (Tensor, Option<AttentionTrace>) {
        let x_hat = self
            .attn
            .shifts_normalized_tokens()
            .then(|| self.ln_1.normalize(x));
        let (a, t) = self
            .attn
            .forward_shifted(&self.ln_1.forward(x), x_hat.as_ref(), trace);
        let x = x + a;
        let y = &x + self.mlp.forward(&self.ln_2.forward(&x));
        (y, t)
    }
}

impl nn::Module for Block {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.forward_trace(xs, false).0
    }
}

/// Trainable parameters of one [`Block`] of width `d` and MLP ratio `r`: (4 + 2r)·D² weights
/// (QKV 3D², output projection D², MLP 2rD²) and 2D LayerNorm gains, plus with biases (5 + r)·D
/// projection biases and 2D LayerNorm biases. `None` when the count overflows u128.
pub fn block_parameters(d: usize, r: usize, bias: bool) -> Option<u128> {
    let (d, r, b) = (d as u128, r as u128, u128::from(bias));
    let weights = (4 + 2 * r).checked_mul(d.checked_mul(d)?)?;
    let vectors = (2 + 2 * b + (5 + r) * b).checked_mul(d)?;
    weights.checked_add(vectors)
}

/// f32 values a pre-LN [`Block`] keeps per token for the backward pass, in units of the width
/// D, besides the MLP's hidden activations (2·r·D: before and after the GELU) and the
/// attention matrices: LN₁'s input and normalized tokens (2), q, k and v (3), the attention
/// output and its projection (2), the residual sum (1), LN₂'s input and normalized tokens (2),
/// the MLP's output (1), and the conditioning's shifted q, k and v (3).
pub const SAVED_WIDTHS: u128 = 14;

/// What sets the memory of one training step of a model made of pre-LN [`Block`]s
/// ([`StepSize::bytes`]); `GptConfig::training_bytes` and `VitConfig::training_bytes` fill it in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepSize {
    /// Trainable parameters P.
    pub parameters: u128,
    /// Examples per training step B.
    pub batch: usize,
    /// Examples per evaluation batch E.
    pub eval_batch: usize,
    /// Tokens per example T.
    pub tokens: usize,
    /// Width D.
    pub n_embd: usize,
    /// Heads H.
    pub n_head: usize,
    /// Blocks L.
    pub n_layer: usize,
    /// MLP ratio r.
    pub mlp_ratio: usize,
    /// Whether the attention is causal (it sets the Jacobian's tokens).
    pub causal: bool,
    /// f32 words of one example's input I (token ids are i64: 2 words each; pixels 1).
    pub input: u128,
    /// Output logits O of one example (T·V for a GPT, the classes for a classifier).
    pub outputs: u128,
    /// The diagnostics of every evaluation.
    pub diagnostics: DiagnosticsConfig,
}

impl StepSize {
    /// The bytes of one training step, evaluation and diagnosis, in f32 words × 4 (`None` on
    /// overflow), with k = D/H, s = 2·H·T² (the attention scores and probabilities of one
    /// layer), a = T·D·([`SAVED_WIDTHS`] + 2r) + s (what one layer keeps of one example),
    /// n the diagnosed samples and N the Jacobian's tokens
    /// ([`DiagnosticsConfig::jacobian_tokens`]):
    ///
    /// * state 4·P: weights, gradients and two optimizer slots (AdamW's m and v; Muon keeps
    ///   one momentum, so two bound every optimizer of kappa);
    /// * training B·(L·a + I + 2·O): every layer's saved tensors, the input, the logits and
    ///   their log-softmax;
    /// * evaluation E·(a + I + 2·O): without a graph only one layer's tensors live at a time;
    /// * diagnostics, when enabled: n·L·(s + T·D) (every layer's traces: scores, probabilities
    ///   and input) and 6·(N·k)·(3·(D+1)·k): the Jacobian of one head in f64 and two more of its
    ///   size for the SVD.
    ///
    /// The attention matrices are counted in full: libtorch's fused kernel keeps less, so this
    /// is an upper bound where it runs.
    pub fn bytes(&self) -> Option<u128> {
        let w = |x: usize| x as u128;
        let (t, d, h, l) = (
            w(self.tokens),
            w(self.n_embd),
            w(self.n_head),
            w(self.n_layer),
        );
        let scores = (2 * h).checked_mul(t.checked_mul(t)?)?;
        let widths = SAVED_WIDTHS.checked_add(2 * w(self.mlp_ratio))?;
        let layer = t.checked_mul(d)?.checked_mul(widths)?.checked_add(scores)?;
        let ends = self.input.checked_add(self.outputs.checked_mul(2)?)?;
        let train = l.checked_mul(layer)?.checked_add(ends)?;
        let eval = layer.checked_add(ends)?;
        let n = w(self.diagnostics.diagnosed_samples());
        let traces = n
            .checked_mul(l)?
            .checked_mul(scores.checked_add(t.checked_mul(d)?)?)?;
        let k = d / h.max(1);
        let jacobian_tokens = match self.diagnostics.enabled {
            true => self.diagnostics.jacobian_tokens(self.tokens, self.causal),
            false => 0,
        };
        let rows = w(jacobian_tokens).checked_mul(k)?;
        let jacobian = rows
            .checked_mul(3 * (d + 1))?
            .checked_mul(k)?
            .checked_mul(6)?;
        let words = [
            self.parameters.checked_mul(4)?,
            train.checked_mul(w(self.batch))?,
            eval.checked_mul(w(self.eval_batch))?,
            traces,
            jacobian,
        ]
        .into_iter()
        .try_fold(0u128, u128::checked_add)?;
        words.checked_mul(4)
    }
}

/// Checks, before a model is built under `p` on the CPU, that its `parameters` fit in this
/// process's memory three times over: the weights, and the two temporaries of their N(μ, σ²)
/// initialization (tch draws N(0, 1) and returns ·σ + μ, whose allocation panics on failure
/// instead of returning an error). `model` names it (`GPT`), `keys` the config keys that size
/// it. On a GPU the weights are not in this process's memory, and nothing is checked.
pub fn ensure_weights_fit(
    p: &nn::Path<'_>,
    parameters: Option<u128>,
    model: &str,
    keys: &str,
) -> Result<()> {
    if p.device() != tch::Device::Cpu {
        return Ok(());
    }
    let bytes = parameters.and_then(|n| n.checked_mul(3 * 4));
    ensure_fits(
        bytes,
        &format!("the {model}'s weights as they are built"),
        keys,
    )
}

/// A model made of [`Block`]s whose attention can be conditioned and diagnosed.
pub trait Transformer {
    /// The blocks, in order.
    fn blocks(&self) -> &[Block];

    /// Recomputes every layer's correction after optimizer step `step`
    /// ([`ConditionedAttention::refresh_correction`]).
    fn refresh_correction(&self, step: u64) -> Result<()> {
        self.blocks()
            .iter()
            .try_for_each(|b| b.attn.refresh_correction(step))
    }

    /// The old name of [`Transformer::refresh_correction`].
    #[deprecated(since = "0.2.0", note = "renamed `refresh_correction`")]
    fn refresh_conditioning(&self, step: u64) -> Result<()> {
        self.refresh_correction(step)
    }

    /// Turns every layer's max-logit capture on or off
    /// ([`ConditionedAttention::capture_max_logits`]).
    fn capture_max_logits(&self, on: bool) {
        self.blocks()
            .iter()
            .for_each(|b| b.attn.capture_max_logits(on));
    }

    /// Every layer's per-head max logits of the last captured forward, in layer order.
    fn captured_max_logits(&self) -> Vec<Option<Vec<f64>>> {
        self.blocks()
            .iter()
            .map(|b| b.attn.captured_max_logits())
            .collect()
    }

    /// QK-clip on every layer, each on its own captured input ([`ConditionedAttention::clip_qk`]);
    /// the layers without a capture are skipped.
    fn clip_qk(&self, clip: &QkClipConfig) -> Result<Vec<QkClipReport>> {
        let mut reports = Vec::new();
        for b in self.blocks() {
            reports.extend(b.attn.clip_qk(clip)?);
        }
        Ok(reports)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditioned_attention::{AttentionKernel, CorrectionConfig, LambdaUnit, ShiftInput};
    use kappa_attention::{HeadLayout, ScoreScale};
    use tch::{Device, Kind};

    /// A block hands its attention the normalized tokens of its input only under the
    /// `Normalized` reading, and the layer uses them: the block's attention output is exactly
    /// `forward_shifted(LN(x), x̂)`, which differs from shifting LN(x) once the gain is not 1.
    #[test]
    fn a_block_passes_the_normalized_tokens_to_its_attention() {
        let cfg = AttentionConfig {
            n_embd: 12,
            n_head: 3,
            bias: false,
            causal: true,
            scaling: ScoreScale::InvSqrtK,
            correction: CorrectionConfig::Identity {
                lambda: 2.0,
                layout: HeadLayout::Shifted,
                unit: LambdaUnit::Absolute,
                input: ShiftInput::Normalized,
            },
            fused_kernel: true,
            kernel: AttentionKernel::Softmax,
        };
        let vs = nn::VarStore::new(Device::Cpu);
        let block = crate::seeded(10, || Block::new(&(vs.root() / "b"), cfg, 2, 0.02)).unwrap();
        tch::no_grad(|| {
            let _ = block.ln_1.weight.shallow_clone().fill_(3.0);
        });
        let xs = crate::seeded(11, || Tensor::randn([2, 5, 12], (Kind::Float, Device::Cpu)));
        let h = block.ln_1.forward(&xs);
        let (shifted, _) = block
            .attn
            .forward_shifted(&h, Some(&block.ln_1.normalize(&xs)), false);
        let (on_ln, _) = block.attn.forward_trace(&h, false);
        let x1 = &xs + &shifted;
        let want = &x1 + block.mlp.forward(&block.ln_2.forward(&x1));
        assert!(block.forward_trace(&xs, false).0.equal(&want));
        let apart = (&shifted - &on_ln).abs().max().double_value(&[]);
        assert!(apart > 1e-4, "{apart}");
    }
}
