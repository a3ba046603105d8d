//! The building blocks shared by GPT and ViT: `LayerNorm` (optional bias), the GELU MLP and the
//! pre-LN transformer block (the projections are [`crate::linear::Linear`]).
//!
//! Block: x ← x + Attn(LN₁(x)); x ← x + MLP(LN₂(x)), with MLP(x) = W₂ GELU(W₁x + b₁) + b₂ and
//! exact (erf) GELU, as in nanoGPT and ViT.

use tch::nn::Module as _;
use tch::{nn, Tensor};

use crate::conditioned_attention::{AttentionConfig, AttentionTrace, ConditionedAttention};
use crate::error::Result;
use crate::linear::Linear;
use crate::max_logit::QkClipReport;
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

/// A model made of [`Block`]s whose attention can be conditioned and diagnosed.
pub trait Transformer {
    /// The blocks, in order.
    fn blocks(&self) -> &[Block];

    /// Recomputes every layer's correction after optimizer step `step`
    /// ([`ConditionedAttention::refresh_conditioning`]).
    fn refresh_conditioning(&self, step: u64) -> Result<()> {
        self.blocks()
            .iter()
            .try_for_each(|b| b.attn.refresh_conditioning(step))
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
    use crate::conditioned_attention::{AttentionKernel, Conditioning, LambdaUnit, ShiftInput};
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
            conditioning: Conditioning::Identity {
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
