//! Multi-head self-attention with spectral correction: a fused QKV projection, causal or
//! bidirectional, libtorch's fused scaled-dot-product kernel, and the corrections of
//! *Spectral Conditioning of Attention* as fixed, non-trainable buffers.
//!
//! # Conventions
//!
//! Tokens are rows: X ∈ ℝ^{B×T×D}. The fused projection stores its weight as libtorch does,
//! `c_attn.weight` ∈ ℝ^{3D×D} (out × in), and computes `[Q K V] = X Wᵀ + b`. The paper's per-head
//! weight W_Q^h ∈ ℝ^{D×k} (in × out, k = D/H) is the transpose of the k×D block of rows
//! `h·k..(h+1)·k` of the first D rows; W_K^h and W_V^h come from the second and third D rows.
//!
//! # Corrections (the C's of `SpecA(X) = softmax(X(W_Q+C_Q)(W_K+C_K)ᵀXᵀ/s) X(W_V+C_V)`)
//!
//! * [`CorrectionConfig::Identity`]: C = λ·E with λ fixed. The projection folds λ into the weight:
//!   `X(W + λE)ᵀ` with `W + λE` formed by one fused 3D×D pass (`addcmul`) from W, the fixed
//!   pattern E (built once, not a variable) and the λ buffer. That costs 3D² element operations
//!   per forward, against B·T·3D for adding `λ·X[:, block]` to the projection output (the
//!   algebraically equal `XWᵀ + λ·shift(X)`), and the backward pass is plain linear's: since
//!   ∂(W + λE)/∂W = I, W's gradient is the gradient at W + λE and λ gets none. Two per-head
//!   layouts (kappa-attention's [`HeadLayout`]; docs/models.md, "Two per-head layouts"):
//!   - `Shifted` (the fused `W + λI_D` reading): head h of Q, K and V receives λ·X[:, hk..hk+k],
//!     so the shift of the whole projection is `λ·[X X X]`;
//!   - `SameBlock`: every head receives λ·X[:, 0..k] (the paper's single-head I_k repeated).
//! * [`CorrectionConfig::ScaleAware`]: the same shift with λ chosen from the weights by
//!   `kappa_attention::LambdaPolicy::TargetKappa(κ_t)` (λ = σ_max·(κ_t+1)/(κ_t−1), shared by the
//!   3H per-head matrices of the layer, so every κ(W^h + λE) ≤ κ_t by Weyl), chosen at
//!   initialization and, if `every > 0`, re-chosen every `every` optimizer steps without gradient.
//! * [`CorrectionConfig::Svd`]: Theorem 3.5's exact correction C^h = σ₁(W^h)·U^h V^hᵀ per head and
//!   projection, recomputed every `every` steps without gradient, so κ(W^h + C^h) < 2 right
//!   after each refresh.
//!
//! λ and C live in the var store as **non-trainable** buffers (`lambda`, `correction`): they are
//! saved in checkpoints, never receive a gradient and never enter the optimizer. The gradient
//! with respect to W is the ordinary attention gradient evaluated at W + C (docs/models.md, "The
//! method and its readings").
//!
//! # Score scale
//!
//! S = Q Kᵀ / s with kappa-attention's [`ScoreScale`]: s = √k ([`ScoreScale::InvSqrtK`], the
//! usual transformer, what every preset of this crate names), s = 1 ([`ScoreScale::One`], the
//! paper's formulas) or a custom s > 0 ([`ScoreScale::Custom`]; it must be a normal f32 number
//! so that neither s nor 1/s rounds to 0 or ∞ in the f32/bf16 scores). Folding 1/s into W_Q
//! leaves κ unchanged but changes the size of λ relative to the weights (docs/models.md, "λ and
//! the weight scale"). The per-head layouts are kappa-attention's [`HeadLayout`], the same type
//! its `MultiHeadAttention` uses.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use kappa_attention::{HeadLayout, InputError, LambdaPolicy, ScoreScale};
use kappa_optim::{clip_rows, fused_qkv_row_factors, HeadFactors, QkClipConfig};
use serde::{Deserialize, Serialize};
use tch::nn::Module as _;
use tch::{nn, Kind, Tensor};

use crate::error::{ModelsError, Result};
use crate::linear::Linear;
use crate::max_logit::{head_max_logits, to_vec, QkClipReport};
use crate::nystrom::{nystrom_attention, NystromConfig};

/// The spectral correction added to W_Q, W_K and W_V.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[serde(deny_unknown_fields)]
pub enum CorrectionConfig {
    /// Plain attention.
    #[default]
    None,
    /// C = λ·E, λ fixed (the paper: 10), one λ shared by Q, K and V.
    Identity {
        /// λ ≥ 0.
        lambda: f64,
        /// The per-head layout (`"shifted"` or `"same_block"`).
        layout: HeadLayout,
        /// What λ is measured in (`"absolute"`, the default, or `"initial_sigma_max"`).
        #[serde(default, skip_serializing_if = "LambdaUnit::is_absolute")]
        unit: LambdaUnit,
        /// Which tokens the shift adds (`"layer_norm_output"`, the default, or `"normalized"`).
        #[serde(default, skip_serializing_if = "ShiftInput::is_layer_norm_output")]
        input: ShiftInput,
    },
    /// C = λ·E with λ = σ_max·(κ_t+1)/(κ_t−1) chosen from the layer's current weights.
    ScaleAware {
        /// The κ bound the chosen λ guarantees (> 1).
        target_kappa: f64,
        /// The per-head layout (`"shifted"` or `"same_block"`).
        layout: HeadLayout,
        /// Re-choose λ every this many optimizer steps; 0 chooses it once at initialization.
        every: u64,
    },
    /// Theorem 3.5: C^h = σ₁ U^h V^hᵀ per head, recomputed without gradient.
    Svd {
        /// Recompute every this many optimizer steps (≥ 1).
        every: u64,
    },
}

/// What the λ of [`CorrectionConfig::Identity`] is measured in (docs/models.md, "The readings of
/// λ·I_k").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LambdaUnit {
    /// λ is the shift itself, whatever the weights' scale (the paper's reading).
    #[default]
    Absolute,
    /// λ is a multiple of the layer's largest σ_max(W^h) over its 3H per-head matrices at
    /// initialization: the shift is λ·σ̄₀, chosen once (kappa-attention's
    /// `LambdaPolicy::RelativeToSigmaMax`) and fixed after that.
    InitialSigmaMax,
}

impl LambdaUnit {
    fn is_absolute(&self) -> bool {
        *self == LambdaUnit::Absolute
    }
}

/// Which tokens the shift λ·E adds in a pre-LN block, where the attention's input is
/// LN(x) = γ ⊙ x̂ + β with x̂ the normalized token (docs/models.md, "The readings of λ·I_k").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShiftInput {
    /// LN(x)·(W + λE): the correction is part of the projection that reads the LayerNorm's
    /// output, so the shift λ·E·LN(x) carries the learned gain γ and bias β.
    #[default]
    LayerNormOutput,
    /// LN(x)·W + λ·E·x̂: the correction acts on the normalized tokens before the gain, so the
    /// gain cannot scale the shift (the same as adding λE to diag(γ)·W, the weight that acts
    /// on x̂). A layer used outside a block has no x̂ and shifts its own input.
    Normalized,
}

impl ShiftInput {
    fn is_layer_norm_output(&self) -> bool {
        *self == ShiftInput::LayerNormOutput
    }
}

impl CorrectionConfig {
    /// `Identity` with the paper's reading: absolute λ, shifting the attention's input.
    pub fn identity(lambda: f64, layout: HeadLayout) -> Self {
        CorrectionConfig::Identity {
            lambda,
            layout,
            unit: LambdaUnit::Absolute,
            input: ShiftInput::LayerNormOutput,
        }
    }

    /// A short label for tables and plots (`baseline`, `λ=10`, `scale-aware κ≤1.5`, `svd/10`).
    pub fn label(&self) -> String {
        match *self {
            CorrectionConfig::None => "baseline".into(),
            CorrectionConfig::Identity {
                lambda,
                layout,
                unit,
                input,
            } => {
                let mut label = match unit {
                    LambdaUnit::Absolute => format!("λ={lambda}"),
                    LambdaUnit::InitialSigmaMax => format!("λ={lambda}·σ₀"),
                };
                if layout == HeadLayout::SameBlock {
                    label.push_str(" (same block)");
                }
                if input == ShiftInput::Normalized {
                    label.push_str(" (on x̂)");
                }
                label
            }
            CorrectionConfig::ScaleAware {
                target_kappa,
                every,
                ..
            } => format!("scale-aware κ≤{target_kappa} (every {every})"),
            CorrectionConfig::Svd { every } => format!("svd (every {every})"),
        }
    }

    /// Checks the correction's values; errors name the key under `field`
    /// (`variants.1.correction.lambda`).
    pub fn validate(&self, field: &str) -> Result<()> {
        match *self {
            CorrectionConfig::None => Ok(()),
            CorrectionConfig::Identity { lambda, .. } => {
                if lambda.is_finite() && lambda >= 0.0 {
                    Ok(())
                } else {
                    Err(ModelsError::config(
                        format!("{field}.lambda"),
                        format!("must be finite and ≥ 0, found {lambda}"),
                    ))
                }
            }
            CorrectionConfig::ScaleAware { target_kappa, .. } => {
                if target_kappa.is_finite() && target_kappa > 1.0 {
                    Ok(())
                } else {
                    Err(ModelsError::config(
                        format!("{field}.target_kappa"),
                        format!("must be finite and > 1, found {target_kappa}"),
                    ))
                }
            }
            CorrectionConfig::Svd { every } => {
                if every >= 1 {
                    Ok(())
                } else {
                    Err(ModelsError::config(
                        format!("{field}.every"),
                        "must be ≥ 1 (the correction is recomputed every `every` steps)",
                    ))
                }
            }
        }
    }
}

/// Everything an attention layer needs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionConfig {
    /// Model width D.
    pub n_embd: usize,
    /// Heads H (k = D/H).
    pub n_head: usize,
    /// Biases in the projections.
    pub bias: bool,
    /// Causal mask (GPT) or none (ViT).
    pub causal: bool,
    /// The score scale s (`"inv_sqrt_k"`, `"one"` or `{ custom = s }`); the layer multiplies
    /// the scores by 1/s.
    pub scaling: ScoreScale,
    /// The spectral correction.
    #[serde(alias = "conditioning")]
    pub correction: CorrectionConfig,
    /// Use libtorch's fused `scaled_dot_product_attention` when no probabilities are requested.
    pub fused_kernel: bool,
    /// Exact softmax attention (the default) or its Nyström approximation (bidirectional only).
    #[serde(default)]
    pub kernel: AttentionKernel,
}

/// The attention kernel: exact softmax, or Nyström's landmark approximation
/// ([`crate::nystrom`]). The conditioning acts on the projections, so it applies to both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionKernel {
    /// softmax(c·QKᵀ + mask)·V.
    #[default]
    Softmax,
    /// F·A⁺·(B·V) through landmarks, plus the optional convolution skip on V.
    Nystrom(NystromConfig),
}

impl AttentionConfig {
    /// Checks the sizes and the conditioning; `field` prefixes the names in errors.
    pub fn validate(&self, field: &str) -> Result<()> {
        if self.n_embd == 0 {
            return Err(ModelsError::config(
                format!("{field}.n_embd"),
                "must be ≥ 1",
            ));
        }
        if self.n_head == 0 || !self.n_embd.is_multiple_of(self.n_head) {
            return Err(ModelsError::config(
                format!("{field}.n_head"),
                format!(
                    "must be ≥ 1 and divide n_embd = {}, found {}",
                    self.n_embd, self.n_head
                ),
            ));
        }
        self.score_factor().map_err(|e| {
            let reason = match e {
                kappa_attention::AttentionError::Input(InputError::InvalidArgument {
                    reason,
                    ..
                }) => reason,
                other => other.to_string(),
            };
            ModelsError::config(format!("{field}.scaling"), reason)
        })?;
        if let AttentionKernel::Nystrom(n) = &self.kernel {
            if self.causal {
                return Err(ModelsError::config(
                    format!("{field}.kernel"),
                    "Nyström attention is bidirectional: it has no causal form",
                ));
            }
            n.validate(&format!("{field}.kernel.nystrom"))?;
        }
        self.correction.validate(&format!("{field}.correction"))
    }

    /// k = D/H.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head.max(1)
    }

    /// The multiplier 1/s of the scores for head dimension k: 1/√k, 1 or 1/s for a custom s.
    ///
    /// Errors: a custom s that is not a positive normal f32 (the scores are computed in f32 or
    /// bf16, so s and 1/s must both be finite and non-zero there), as kappa-attention's
    /// [`ScoreScale::divisor_in`] reports it.
    pub fn score_factor(&self) -> std::result::Result<f64, kappa_attention::AttentionError> {
        let k = self.head_dim();
        self.scaling.divisor_in::<f32>(k)?;
        Ok(1.0 / self.scaling.divisor(k)?)
    }
}

/// What [`ConditionedAttention::forward_trace`] keeps for diagnostics (detached).
#[derive(Debug)]
pub struct AttentionTrace {
    /// The layer input X (after the block's LayerNorm), B×T×D.
    pub input: Tensor,
    /// The scores S = Q Kᵀ/s before masking, B×H×T×T.
    pub scores: Tensor,
    /// The attention probabilities P, B×H×T×T.
    pub probs: Tensor,
}

/// Multi-head self-attention with a spectral correction (an `nn::Module`).
///
/// ```
/// use kappa_attention::{HeadLayout, ScoreScale};
/// use kappa_models::conditioned_attention::{
///     AttentionConfig, AttentionKernel, CorrectionConfig, ConditionedAttention,
/// };
/// use tch::{nn, Device, Kind, Tensor};
/// let vs = nn::VarStore::new(Device::Cpu);
/// let cfg = AttentionConfig {
///     n_embd: 16, n_head: 4, bias: false, causal: true, scaling: ScoreScale::InvSqrtK,
///     correction: CorrectionConfig::identity(1.0, HeadLayout::Shifted),
///     fused_kernel: true, kernel: AttentionKernel::Softmax,
/// };
/// let attn = ConditionedAttention::new(vs.root() / "attn", cfg, 0.02)?;
/// let x = Tensor::randn([2, 5, 16], (Kind::Float, Device::Cpu));
/// let y = attn.try_forward(&x)?;
/// assert_eq!(y.size(), vec![2, 5, 16]);
/// // λ is a buffer: the trainable parameters are those of plain attention.
/// assert_eq!(vs.trainable_variables().len(), 2);
/// # Ok::<(), kappa_models::ModelsError>(())
/// ```
#[derive(Debug)]
pub struct ConditionedAttention {
    cfg: AttentionConfig,
    /// 1/s, from the validated config.
    score_factor: f64,
    c_attn: Linear,
    c_proj: Linear,
    /// Scalar λ buffer (Identity, ScaleAware).
    lambda: Option<Tensor>,
    /// 3D×D correction buffer (Svd).
    correction: Option<Tensor>,
    /// The fixed 3D×D pattern E of the λ shift (Identity, ScaleAware); not a variable, so
    /// checkpoints and the var store are those of the unconditioned layout plus λ.
    pattern: Option<Tensor>,
    /// The opt-in record of the last forward's max logits and input.
    capture: Capture,
    /// Nyström's depthwise convolution skip on V (H×1×r×1), if configured.
    nystrom_conv: Option<Tensor>,
}

/// The max-logit capture of a layer: off by default; when on, every forward replaces `last`.
#[derive(Debug, Default)]
struct Capture {
    on: AtomicBool,
    last: Mutex<Option<Captured>>,
}

/// What one forward left: its input X (a detached handle on the tensor, no copy) and the
/// per-head max logits (H, f32).
#[derive(Debug)]
struct Captured {
    input: Tensor,
    /// The block's normalized tokens x̂, when the shift acts on them.
    normalized: Option<Tensor>,
    max_logits: Tensor,
}

impl ConditionedAttention {
    /// Creates the layer under `p`: `c_attn` (D → 3D) with N(0, 0.02²) weights, `c_proj`
    /// (D → D) with N(0, proj_std²) weights, zero biases, and the correction buffers, which
    /// are computed from the initial weights.
    pub fn new(p: nn::Path<'_>, cfg: AttentionConfig, proj_std: f64) -> Result<Self> {
        cfg.validate("attention")?;
        let score_factor = cfg.score_factor()?;
        let d = cfg.n_embd as i64;
        let c_attn = Linear::new(&(&p / "c_attn"), d, 3 * d, cfg.bias, 0.02)?;
        let c_proj = Linear::new(&(&p / "c_proj"), d, d, cfg.bias, proj_std)?;
        let lambda = match cfg.correction {
            CorrectionConfig::Identity { .. } | CorrectionConfig::ScaleAware { .. } => {
                Some(p.f_zeros_no_train("lambda", &[])?)
            }
            _ => None,
        };
        let correction = match cfg.correction {
            CorrectionConfig::Svd { .. } => Some(p.f_zeros_no_train("correction", &[3 * d, d])?),
            _ => None,
        };
        let nystrom_conv = match cfg.kernel {
            AttentionKernel::Nystrom(n) if n.conv_kernel > 0 => {
                // libtorch's Conv2d default: U(−1/√fan_in, 1/√fan_in), fan_in = r.
                let bound = 1.0 / (n.conv_kernel as f64).sqrt();
                let shape = [cfg.n_head as i64, 1, n.conv_kernel as i64, 1];
                let init = nn::Init::Uniform {
                    lo: -bound,
                    up: bound,
                };
                Some(p.f_var("nystrom_conv", &shape, init)?)
            }
            _ => None,
        };
        let mut layer = Self {
            cfg,
            score_factor,
            c_attn,
            c_proj,
            lambda,
            correction,
            pattern: None,
            capture: Capture::default(),
            nystrom_conv,
        };
        // The shift pattern (3D×D) and the first correction are no larger than c_attn's weight,
        // which the model's weight check (`layers::ensure_weights_fit`) bounded on the CPU:
        // tch's panicking calls below cannot be handed a size that does not fit.
        layer.pattern = layer.shift_pattern();
        layer.refresh_correction(0)?;
        Ok(layer)
    }

    /// The layer's config.
    pub fn config(&self) -> &AttentionConfig {
        &self.cfg
    }

    /// The trainable fused weight W (3D×D, out × in).
    pub fn qkv_weight(&self) -> &Tensor {
        &self.c_attn.weight
    }

    /// The fused bias (3D), if any.
    pub fn qkv_bias(&self) -> Option<&Tensor> {
        self.c_attn.bias.as_ref()
    }

    /// The current λ (Identity, ScaleAware), read from the buffer.
    pub fn lambda(&self) -> Option<f64> {
        self.lambda.as_ref().map(|l| l.double_value(&[]))
    }

    /// The current correction buffer C (Svd), 3D×D.
    pub fn correction(&self) -> Option<&Tensor> {
        self.correction.as_ref()
    }

    /// The 3D×D pattern E of the λ shift in libtorch's (out × in) layout: X(W + λE)ᵀ-style
    /// projection equals `X Wᵀ + λ·shift(X)`. `None` without an identity shift.
    pub fn shift_pattern(&self) -> Option<Tensor> {
        let layout = self.layout()?;
        let d = self.cfg.n_embd as i64;
        let k = self.cfg.head_dim() as i64;
        let h = self.cfg.n_head as i64;
        let opts = (self.c_attn.weight.kind(), self.c_attn.weight.device());
        Some(match layout {
            HeadLayout::Shifted => Tensor::eye(d, opts).repeat([3, 1]),
            HeadLayout::SameBlock => Tensor::eye(k, opts)
                .constant_pad_nd([0, d - k])
                .repeat([3 * h, 1]),
        })
    }

    fn layout(&self) -> Option<HeadLayout> {
        match self.cfg.correction {
            CorrectionConfig::Identity { layout, .. }
            | CorrectionConfig::ScaleAware { layout, .. } => Some(layout),
            _ => None,
        }
    }

    /// The effective fused weight W + C (3D×D, detached): what the layer computes with.
    pub fn effective_qkv_weight(&self) -> Tensor {
        tch::no_grad(|| {
            let w = self.c_attn.weight.detach();
            match (&self.lambda, &self.correction, self.shift_pattern()) {
                (Some(l), _, Some(e)) => w + e * l,
                (_, Some(c), _) => w + c,
                _ => w.copy(),
            }
        })
    }

    /// Recomputes the correction buffers after optimizer step `step` (0 = initialization):
    /// the SVD correction when `step % every == 0`, the scale-aware λ at initialization and
    /// when `every > 0 && step % every == 0`. No gradient flows through this.
    pub fn refresh_correction(&self, step: u64) -> Result<()> {
        self.refresh(step)
    }

    /// The old name of [`ConditionedAttention::refresh_correction`].
    #[deprecated(since = "0.2.0", note = "renamed `refresh_correction`")]
    pub fn refresh_conditioning(&self, step: u64) -> Result<()> {
        self.refresh(step)
    }

    fn refresh(&self, step: u64) -> Result<()> {
        match self.cfg.correction {
            CorrectionConfig::None => Ok(()),
            CorrectionConfig::Identity { lambda, unit, .. } => {
                if step == 0 {
                    let value = match unit {
                        LambdaUnit::Absolute => lambda,
                        LambdaUnit::InitialSigmaMax => {
                            self.shared_lambda(LambdaPolicy::RelativeToSigmaMax(lambda))?
                        }
                    };
                    if let Some(l) = &self.lambda {
                        let _ = tch::no_grad(|| l.shallow_clone().f_fill_(value))?;
                    }
                }
                Ok(())
            }
            CorrectionConfig::ScaleAware {
                target_kappa,
                every,
                ..
            } => {
                if step == 0 || (every > 0 && step.is_multiple_of(every)) {
                    let value = self.shared_lambda(LambdaPolicy::TargetKappa(target_kappa))?;
                    if let Some(l) = &self.lambda {
                        let _ = tch::no_grad(|| l.shallow_clone().f_fill_(value))?;
                    }
                }
                Ok(())
            }
            CorrectionConfig::Svd { every } => {
                if step.is_multiple_of(every) {
                    if let Some(c) = &self.correction {
                        let new = self.svd_correction()?;
                        tch::no_grad(|| c.shallow_clone().f_copy_(&new))?;
                    }
                }
                Ok(())
            }
        }
    }

    /// The 3H per-head blocks of W (each k×D = W^hᵀ), detached, as a 3H×k×D tensor.
    pub fn head_blocks(&self, weight: &Tensor) -> Tensor {
        let (d, k, h) = (
            self.cfg.n_embd as i64,
            self.cfg.head_dim() as i64,
            self.cfg.n_head as i64,
        );
        weight.detach().reshape([3 * h, k, d])
    }

    /// One λ chosen by `policy` over the layer's 3H per-head matrices W^h (D×k).
    fn shared_lambda(&self, policy: LambdaPolicy) -> Result<f64> {
        let blocks = self.head_blocks(&self.c_attn.weight);
        let mut ws = Vec::with_capacity(blocks.size()[0] as usize);
        for i in 0..blocks.size()[0] {
            ws.push(kappa_linalg::tch_backend::array_from_tensor(
                &blocks.get(i).tr(),
            )?);
        }
        let views: Vec<_> = ws.iter().map(|w| w.view()).collect();
        Ok(policy.choose_shared(&views)?)
    }

    /// C = σ₁ U Vᵀ of every per-head block, in the fused 3D×D layout. For a block B = W^hᵀ,
    /// SVD(B) = V Σ Uᵀ, so σ₁ U_B V_Bᵀ = (σ₁ U_W V_Wᵀ)ᵀ: the correction of W^h, transposed like B.
    fn svd_correction(&self) -> Result<Tensor> {
        let d = self.cfg.n_embd as i64;
        let blocks = self.head_blocks(&self.c_attn.weight).to_kind(Kind::Double);
        let (u, s, v) = blocks.f_svd(true, true)?;
        let c = u.matmul(&v.transpose(-2, -1)) * s.narrow(1, 0, 1).unsqueeze(-1);
        Ok(c.reshape([3 * d, d]).to_kind(self.c_attn.weight.kind()))
    }

    /// The weight the projection multiplies by, with its graph back to W: W + λE (one fused
    /// 3D×D pass), W + C, or W itself.
    fn projection_weight(&self) -> Tensor {
        let w = &self.c_attn.weight;
        match (&self.lambda, &self.correction, &self.pattern) {
            (Some(lambda), _, Some(e)) => w.addcmul(&Self::matching(e, w), lambda),
            (_, Some(c), _) => w + c,
            _ => w.shallow_clone(),
        }
    }

    /// `t` in `like`'s kind and device (a no-op unless the var store was converted after
    /// construction, e.g. to bf16).
    fn matching(t: &Tensor, like: &Tensor) -> Tensor {
        if t.kind() == like.kind() && t.device() == like.device() {
            t.shallow_clone()
        } else {
            t.to_device(like.device()).to_kind(like.kind())
        }
    }

    /// `[Q K V]` = X(W + C)ᵀ + b (B×T×3D), with the correction folded into the weight; with
    /// [`ShiftInput::Normalized`] and the normalized tokens `x_hat` of a block, XWᵀ + b + λ·shift(x̂).
    fn project(&self, x: &Tensor, x_hat: Option<&Tensor>) -> Tensor {
        match (self.normalized_shift(x_hat), &self.lambda) {
            (Some(x_hat), Some(lambda)) => {
                let plain = x.linear(&self.c_attn.weight, self.c_attn.bias.as_ref());
                plain + self.shift(x_hat) * lambda
            }
            _ => x.linear(&self.projection_weight(), self.c_attn.bias.as_ref()),
        }
    }

    /// `x_hat` when this layer shifts the normalized tokens and a block supplied them.
    fn normalized_shift<'a>(&self, x_hat: Option<&'a Tensor>) -> Option<&'a Tensor> {
        x_hat.filter(|_| self.shifts_normalized_tokens())
    }

    /// Whether the λ shift acts on the normalized tokens x̂ ([`ShiftInput::Normalized`]): a
    /// block then passes x̂ to [`ConditionedAttention::forward_shifted`].
    pub fn shifts_normalized_tokens(&self) -> bool {
        matches!(
            self.cfg.correction,
            CorrectionConfig::Identity {
                input: ShiftInput::Normalized,
                ..
            }
        )
    }

    /// The tokens the pattern E picks, tiled to B×T×3D without a product: `[x x x]` for the
    /// shifted layout, x[:, 0..k] repeated 3H times for the same-block one (equal to `x Eᵀ`).
    fn shift(&self, x: &Tensor) -> Tensor {
        match self.layout() {
            Some(HeadLayout::SameBlock) => {
                let k = self.cfg.head_dim() as i64;
                x.narrow(-1, 0, k)
                    .repeat([1, 1, 3 * self.cfg.n_head as i64])
            }
            _ => x.repeat([1, 1, 3]),
        }
    }

    /// Turns the max-logit capture on or off (off by default; off also forgets the last
    /// record). While it is on, every forward records, detached, the per-head max of its masked
    /// pre-softmax logits ([`crate::max_logit`]; the extra cost is the QKᵀ product once more,
    /// never the B×H×T×T matrix at once) and keeps a handle on its input X (no copy, but X
    /// stays alive until the next forward: one B×T×D activation per layer). Nothing the forward
    /// returns changes.
    pub fn capture_max_logits(&self, on: bool) {
        self.capture.on.store(on, Ordering::Relaxed);
        if !on {
            *self.last_capture() = None;
        }
    }

    /// The per-head max logits (H values) of the last forward while the capture was on.
    pub fn captured_max_logits(&self) -> Option<Vec<f64>> {
        self.last_capture().as_ref().map(|c| to_vec(&c.max_logits))
    }

    fn last_capture(&self) -> std::sync::MutexGuard<'_, Option<Captured>> {
        self.capture.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, x: &Tensor, x_hat: Option<&Tensor>, q: &Tensor, k: &Tensor) {
        let max_logits = head_max_logits(q, k, self.score_factor, self.cfg.causal);
        *self.last_capture() = Some(Captured {
            input: x.detach(),
            normalized: self.normalized_shift(x_hat).map(Tensor::detach),
            max_logits,
        });
    }

    /// The per-head max of the masked logits of X (B×T×D) with the current weights, without
    /// gradient: the Q and K rows of the projection (4·B·T·D² flops) and [`head_max_logits`].
    pub fn max_logits(&self, x: &Tensor) -> Result<Vec<f64>> {
        self.max_logits_shifted(x, None)
    }

    /// [`ConditionedAttention::max_logits`] of a block's input X with its normalized tokens x̂.
    fn max_logits_shifted(&self, x: &Tensor, x_hat: Option<&Tensor>) -> Result<Vec<f64>> {
        self.check_input(x)?;
        let _guard = tch::no_grad_guard();
        let size = x.size();
        let (b, t, d) = (size[0], size[1], size[2]);
        let (h, k) = (self.cfg.n_head as i64, self.cfg.head_dim() as i64);
        let qk = self.project(x, x_hat).narrow(-1, 0, 2 * d);
        let heads = |m: &Tensor| m.view([b, t, h, k]).transpose(1, 2);
        let parts = qk.split(d, -1);
        let m = head_max_logits(
            &heads(&parts[0]),
            &heads(&parts[1]),
            self.score_factor,
            self.cfg.causal,
        );
        Ok(to_vec(&m))
    }

    /// QK-clip on this layer (kappa-optim's [`kappa_optim::qk_clip`]): measures the per-head
    /// max logits of the last captured input with the **current** weights
    /// ([`ConditionedAttention::max_logits`]), and rescales the heads above τ
    /// ([`ConditionedAttention::scale_qk`]), so that on that input every head's max logit is
    /// at most τ afterwards. `None` (and nothing done) when no forward was captured.
    ///
    /// Errors: an invalid `clip`, or a non-finite logit ([`ModelsError::Optimizer`]).
    pub fn clip_qk(&self, clip: &QkClipConfig) -> Result<Option<QkClipReport>> {
        let (input, x_hat) = match self.last_capture().as_ref() {
            Some(c) => (
                c.input.shallow_clone(),
                c.normalized.as_ref().map(Tensor::shallow_clone),
            ),
            None => return Ok(None),
        };
        let max_logits = self.max_logits_shifted(&input, x_hat.as_ref())?;
        let factors = clip.factors(&max_logits).map_err(optim_err)?;
        let report = QkClipReport {
            max_logits,
            factors,
        };
        if report.clipped() > 0 {
            self.scale_qk(&report.factors)?;
        }
        Ok(Some(report))
    }

    /// Scales head h's effective query projection by `factors[h].query` and its key
    /// projection by `factors[h].key`, biases included, in place and without gradient. With a
    /// correction C (λ·E, or the SVD buffer) the effective weight W + C is what is scaled and
    /// C is kept: W ← W + (γ − 1)·(W + C) on those rows (kappa-optim's [`clip_rows`]), so the
    /// layer's logits on any input are multiplied by γ_Q·γ_K per head. A scale-aware λ or an
    /// SVD correction re-chosen later from the new W changes the effective weight again.
    ///
    /// Errors: not one factor pair per head ([`ModelsError::Shape`]).
    pub fn scale_qk(&self, factors: &[HeadFactors]) -> Result<()> {
        if factors.len() != self.cfg.n_head {
            return Err(ModelsError::Shape {
                arg: "factors",
                reason: format!(
                    "expected {} heads, found {}",
                    self.cfg.n_head,
                    factors.len()
                ),
            });
        }
        let rows = fused_qkv_row_factors(factors, self.cfg.head_dim());
        let w = &self.c_attn.weight;
        let correction = match (&self.lambda, &self.correction, &self.pattern) {
            (Some(lambda), _, Some(e)) => Some(Self::matching(e, w) * lambda),
            (_, Some(c), _) => Some(Self::matching(c, w)),
            _ => None,
        };
        clip_rows(&mut w.shallow_clone(), correction.as_ref(), &rows).map_err(optim_err)?;
        if let Some(b) = &self.c_attn.bias {
            let mut column = b.view([rows.len() as i64, 1]);
            clip_rows(&mut column, None, &rows).map_err(optim_err)?;
        }
        Ok(())
    }

    /// Checks `x` (B×T×D, floating point) and runs [`ConditionedAttention::forward_trace`]
    /// without a trace.
    pub fn try_forward(&self, x: &Tensor) -> Result<Tensor> {
        self.check_input(x)?;
        Ok(self.forward_trace(x, false).0)
    }

    fn check_input(&self, x: &Tensor) -> Result<()> {
        let size = x.size();
        if size.len() != 3 || size[2] != self.cfg.n_embd as i64 {
            return Err(ModelsError::Shape {
                arg: "x",
                reason: format!("expected B×T×{}, found {size:?}", self.cfg.n_embd),
            });
        }
        if !x.is_floating_point() {
            return Err(ModelsError::Shape {
                arg: "x",
                reason: format!("expected a floating-point tensor, found {:?}", x.kind()),
            });
        }
        if let AttentionKernel::Nystrom(n) = &self.cfg.kernel {
            n.check_length(size[1] as usize)?;
        }
        Ok(())
    }

    /// The forward pass on X (B×T×D). With `trace` (or without the fused kernel) the
    /// probabilities are computed explicitly — softmax(S + mask)·V — and returned; otherwise
    /// libtorch's `scaled_dot_product_attention` computes the same quantity. With the Nyström
    /// kernel the output is always Nyström's, and a trace holds the exact softmax scores and
    /// probabilities of the same Q, K (the kernel it approximates; T×T, for diagnostics).
    pub fn forward_trace(&self, x: &Tensor, trace: bool) -> (Tensor, Option<AttentionTrace>) {
        self.forward_shifted(x, None, trace)
    }

    /// [`ConditionedAttention::forward_trace`] inside a pre-LN block: `x` = LN(x₀) and `x_hat`
    /// the normalized tokens x̂ of x₀ (LayerNorm without gain and bias), which the λ shift adds
    /// under [`ShiftInput::Normalized`] (ignored otherwise).
    pub fn forward_shifted(
        &self,
        x: &Tensor,
        x_hat: Option<&Tensor>,
        trace: bool,
    ) -> (Tensor, Option<AttentionTrace>) {
        let size = x.size();
        let (b, t, d) = (size[0], size[1], size[2]);
        let h = self.cfg.n_head as i64;
        let k = d / h;
        let qkv = self.project(x, x_hat);
        let heads = |m: &Tensor| m.view([b, t, h, k]).transpose(1, 2);
        let parts = qkv.split(d, -1);
        let (q, kk, v) = (heads(&parts[0]), heads(&parts[1]), heads(&parts[2]));
        if self.capture.on.load(Ordering::Relaxed) {
            self.record(x, x_hat, &q, &kk);
        }
        let (y, record) = match &self.cfg.kernel {
            AttentionKernel::Nystrom(n) => {
                let record = trace.then(|| self.softmax_attention(x, &q, &kk, &v).1);
                (self.nystrom(&q, &kk, &v, n), record.flatten())
            }
            AttentionKernel::Softmax if self.cfg.fused_kernel && !trace => {
                let y = Tensor::scaled_dot_product_attention(
                    &q,
                    &kk,
                    &v,
                    None::<Tensor>,
                    0.0,
                    self.cfg.causal,
                    Some(self.score_factor),
                    false,
                );
                (y, None)
            }
            AttentionKernel::Softmax => {
                let (y, record) = self.softmax_attention(x, &q, &kk, &v);
                (y, record.filter(|_| trace))
            }
        };
        let y = y.transpose(1, 2).contiguous().view([b, t, d]);
        (self.c_proj.forward(&y), record)
    }

    /// softmax(c·QKᵀ + mask)·V with the probabilities materialized, and its trace.
    fn softmax_attention(
        &self,
        x: &Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> (Tensor, Option<AttentionTrace>) {
        let t = q.size()[2];
        let scores = q.matmul(&k.transpose(-2, -1)) * self.score_factor;
        let masked = if self.cfg.causal {
            let mask = Tensor::ones([t, t], (Kind::Bool, x.device())).triu(1);
            scores.masked_fill(&mask, f64::NEG_INFINITY)
        } else {
            scores.shallow_clone()
        };
        let p = masked.softmax(-1, x.kind());
        let y = p.matmul(v);
        let record = AttentionTrace {
            input: x.detach(),
            scores: scores.detach(),
            probs: p.detach(),
        };
        (y, Some(record))
    }
}

impl ConditionedAttention {
    /// Nyström attention of the heads ([`crate::nystrom`]) plus the convolution skip on V.
    fn nystrom(&self, q: &Tensor, k: &Tensor, v: &Tensor, cfg: &NystromConfig) -> Tensor {
        let y = nystrom_attention(q, k, v, self.score_factor, cfg);
        match &self.nystrom_conv {
            Some(w) => {
                let pad = (cfg.conv_kernel / 2) as i64;
                let w = Self::matching(w, v);
                y + v.conv2d(
                    &w,
                    None::<Tensor>,
                    [1, 1],
                    [pad, 0],
                    [1, 1],
                    self.cfg.n_head as i64,
                )
            }
            None => y,
        }
    }
}

/// A kappa-optim error as [`ModelsError::Optimizer`].
fn optim_err(e: kappa_optim::OptimError) -> ModelsError {
    ModelsError::Optimizer(e.to_string())
}

impl nn::Module for ConditionedAttention {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.forward_trace(xs, false).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn cfg(correction: CorrectionConfig, causal: bool, bias: bool) -> AttentionConfig {
        AttentionConfig {
            n_embd: 12,
            n_head: 3,
            bias,
            causal,
            scaling: ScoreScale::InvSqrtK,
            correction,
            fused_kernel: true,
            kernel: AttentionKernel::Softmax,
        }
    }

    fn build(c: AttentionConfig, seed: i64) -> (nn::VarStore, ConditionedAttention) {
        tch::manual_seed(seed);
        let vs = nn::VarStore::new(Device::Cpu);
        // A larger weight scale than 0.02 so that the correction matters numerically.
        let attn = ConditionedAttention::new(vs.root() / "attn", c, 0.3).unwrap();
        tch::no_grad(|| {
            let _ = attn.c_attn.weight.shallow_clone().g_mul_scalar_(10.0);
        });
        (vs, attn)
    }

    fn x(seed: i64) -> Tensor {
        tch::manual_seed(seed);
        Tensor::randn([2, 5, 12], (Kind::Float, Device::Cpu))
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    /// The reference computation: plain attention with the materialized weight W + C.
    fn reference(attn: &ConditionedAttention, x: &Tensor, w: &Tensor) -> Tensor {
        let c = attn.config();
        let (b, t, d) = (x.size()[0], x.size()[1], x.size()[2]);
        let h = c.n_head as i64;
        let k = d / h;
        let qkv = x.linear(w, attn.c_attn.bias.as_ref());
        let parts = qkv.split(d, -1);
        let heads = |m: &Tensor| m.view([b, t, h, k]).transpose(1, 2);
        let s = heads(&parts[0]).matmul(&heads(&parts[1]).transpose(-2, -1))
            * c.score_factor().unwrap();
        let s = if c.causal {
            s.masked_fill(
                &Tensor::ones([t, t], (Kind::Bool, Device::Cpu)).triu(1),
                f64::NEG_INFINITY,
            )
        } else {
            s
        };
        let y = s.softmax(-1, Kind::Float).matmul(&heads(&parts[2]));
        attn.c_proj
            .forward(&y.transpose(1, 2).contiguous().view([b, t, d]))
    }

    #[test]
    fn shapes_and_gradients_of_every_variant() {
        for correction in [
            CorrectionConfig::None,
            CorrectionConfig::identity(2.0, HeadLayout::Shifted),
            CorrectionConfig::identity(2.0, HeadLayout::SameBlock),
            CorrectionConfig::ScaleAware {
                target_kappa: 1.5,
                layout: HeadLayout::Shifted,
                every: 1,
            },
            CorrectionConfig::Svd { every: 1 },
        ] {
            for bias in [false, true] {
                let (vs, attn) = build(cfg(correction, true, bias), 1);
                let y = attn.try_forward(&x(2)).unwrap();
                assert_eq!(y.size(), vec![2, 5, 12]);
                y.square().sum(Kind::Float).backward();
                let trainable = vs.trainable_variables();
                assert_eq!(trainable.len(), if bias { 4 } else { 2 }, "{correction:?}");
                for t in &trainable {
                    let g = t.grad();
                    assert!(g.defined() && g.size() == t.size());
                    assert!(g.abs().sum(Kind::Float).double_value(&[]) > 0.0);
                }
                // The buffers exist, are not trainable and got no gradient.
                for (name, t) in vs.variables() {
                    if name.ends_with("lambda") || name.ends_with("correction") {
                        assert!(!t.requires_grad(), "{name}");
                        assert!(!t.grad().defined(), "{name}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_correction_adds_no_trainable_parameter() {
        let count = |c| {
            let (vs, _a) = build(cfg(c, false, true), 3);
            vs.trainable_variables()
                .iter()
                .map(Tensor::numel)
                .sum::<usize>()
        };
        let base = count(CorrectionConfig::None);
        assert_eq!(base, 12 * 36 + 36 + 12 * 12 + 12);
        for c in [
            CorrectionConfig::identity(10.0, HeadLayout::Shifted),
            CorrectionConfig::ScaleAware {
                target_kappa: 2.0,
                layout: HeadLayout::SameBlock,
                every: 0,
            },
            CorrectionConfig::Svd { every: 5 },
        ] {
            assert_eq!(count(c), base, "{c:?}");
        }
    }

    #[test]
    fn the_cheap_path_equals_the_materialized_weight() {
        for correction in [
            CorrectionConfig::identity(3.0, HeadLayout::Shifted),
            CorrectionConfig::identity(3.0, HeadLayout::SameBlock),
            CorrectionConfig::ScaleAware {
                target_kappa: 1.5,
                layout: HeadLayout::Shifted,
                every: 0,
            },
            CorrectionConfig::Svd { every: 1 },
        ] {
            for causal in [false, true] {
                let (_vs, attn) = build(cfg(correction, causal, true), 4);
                let xs = x(5);
                let w_eff = attn.effective_qkv_weight();
                let cheap = attn.try_forward(&xs).unwrap();
                let materialized = reference(&attn, &xs, &w_eff);
                let base = reference(&attn, &xs, attn.qkv_weight());
                let diff = max_diff(&cheap, &materialized);
                assert!(diff < 1e-4, "{correction:?}: {diff}");
                // ... and the correction changes the output.
                assert!(max_diff(&cheap, &base) > 1e-3, "{correction:?}");
            }
        }
    }

    #[test]
    fn the_materialized_pattern_is_lambda_times_the_identity_blocks() {
        let (_vs, attn) = build(
            cfg(
                CorrectionConfig::identity(2.5, HeadLayout::SameBlock),
                false,
                false,
            ),
            6,
        );
        let e = attn.shift_pattern().unwrap();
        // Head 1 of K (rows 12 + 4..8) gets I_k at columns 0..4 (same block).
        let block = e.narrow(0, 16, 4);
        let expect = Tensor::eye(4, (Kind::Float, Device::Cpu)).constant_pad_nd([0, 8]);
        assert!(block.equal(&expect));
        let diff = attn.effective_qkv_weight() - attn.qkv_weight().detach();
        assert!(max_diff(&diff, &(e * 2.5)) < 1e-6);
    }

    #[test]
    fn gradients_are_plain_gradients_at_the_corrected_weight() {
        for correction in [
            CorrectionConfig::identity(3.0, HeadLayout::Shifted),
            CorrectionConfig::Svd { every: 1 },
        ] {
            let (_vs, attn) = build(cfg(correction, true, true), 7);
            let xs = x(8);
            attn.try_forward(&xs)
                .unwrap()
                .square()
                .sum(Kind::Float)
                .backward();
            let g = attn.qkv_weight().grad().copy();
            // Plain attention at W' = W + C, W' a fresh leaf.
            let w_eff = attn.effective_qkv_weight().set_requires_grad(true);
            reference(&attn, &xs, &w_eff)
                .square()
                .sum(Kind::Float)
                .backward();
            let rel = max_diff(&g, &w_eff.grad()) / g.abs().max().double_value(&[]);
            assert!(rel < 1e-4, "{correction:?}: {rel}");
        }
    }

    #[test]
    fn the_fused_kernel_matches_the_explicit_softmax() {
        for causal in [false, true] {
            for scaling in [
                ScoreScale::InvSqrtK,
                ScoreScale::One,
                ScoreScale::Custom(2.5),
            ] {
                let mut c = cfg(CorrectionConfig::None, causal, true);
                c.scaling = scaling;
                let (_vs, attn) = build(c, 9);
                let xs = x(10);
                let fused = attn.forward_trace(&xs, false).0;
                let (explicit, trace) = attn.forward_trace(&xs, true);
                let diff = max_diff(&fused, &explicit);
                assert!(diff < 1e-5, "causal {causal}, {scaling:?}: {diff}");
                let p = trace.unwrap().probs;
                assert_eq!(p.size(), vec![2, 3, 5, 5]);
                let rows = p.sum_dim_intlist(-1, false, Kind::Float);
                assert!(max_diff(&rows, &rows.ones_like()) < 1e-5);
                if causal {
                    assert_eq!(p.get(0).get(0).double_value(&[0, 1]), 0.0);
                }
            }
        }
    }

    #[test]
    fn the_svd_correction_bounds_kappa_by_two_and_scale_aware_meets_its_target() {
        let kappas = |attn: &ConditionedAttention| -> Vec<f64> {
            let blocks = attn.head_blocks(&attn.effective_qkv_weight());
            (0..blocks.size()[0])
                .map(|i| {
                    let a = kappa_linalg::tch_backend::array_from_tensor(&blocks.get(i)).unwrap();
                    kappa_linalg::condition_number(a.view()).unwrap()
                })
                .collect()
        };
        let (_vs, svd) = build(cfg(CorrectionConfig::Svd { every: 1 }, false, false), 11);
        svd.refresh_correction(1).unwrap();
        assert!(kappas(&svd).iter().all(|&k| k < 2.0), "{:?}", kappas(&svd));
        let (_vs, sa) = build(
            cfg(
                CorrectionConfig::ScaleAware {
                    target_kappa: 1.5,
                    layout: HeadLayout::Shifted,
                    every: 1,
                },
                false,
                false,
            ),
            12,
        );
        sa.refresh_correction(1).unwrap();
        assert!(sa.lambda().unwrap() > 0.0);
        assert!(
            kappas(&sa).iter().all(|&k| k <= 1.5 + 1e-4),
            "{:?}",
            kappas(&sa)
        );
    }

    #[test]
    fn bad_inputs_and_configs_are_errors() {
        let (_vs, attn) = build(cfg(CorrectionConfig::None, false, false), 13);
        let wrong = Tensor::zeros([2, 5, 7], (Kind::Float, Device::Cpu));
        assert!(matches!(
            attn.try_forward(&wrong),
            Err(ModelsError::Shape { .. })
        ));
        let ints = Tensor::zeros([2, 5, 12], (Kind::Int64, Device::Cpu));
        assert!(attn.try_forward(&ints).is_err());
        let mut c = cfg(
            CorrectionConfig::identity(-1.0, HeadLayout::Shifted),
            false,
            false,
        );
        let err = c.validate("model").unwrap_err().to_string();
        assert!(err.contains("model.correction.lambda"), "{err}");
        c.correction = CorrectionConfig::None;
        for bad in [0.0, -1.0, f64::NAN, 1e-300, 1e300] {
            c.scaling = ScoreScale::Custom(bad);
            let err = c.validate("model").unwrap_err().to_string();
            assert!(err.contains("`model.scaling`"), "{bad}: {err}");
            // The input error's reason, not kappa-attention's whole message.
            assert!(!err.contains("argument `scale`"), "{bad}: {err}");
        }
        c.scaling = ScoreScale::Custom(4.0);
        assert!(c.validate("model").is_ok());
        assert_eq!(c.score_factor().unwrap(), 0.25);
        c.scaling = ScoreScale::InvSqrtK;
        c.n_head = 5;
        assert!(c
            .validate("m")
            .unwrap_err()
            .to_string()
            .contains("m.n_head"));
    }

    fn reading(
        lambda: f64,
        layout: HeadLayout,
        unit: LambdaUnit,
        input: ShiftInput,
    ) -> CorrectionConfig {
        CorrectionConfig::Identity {
            lambda,
            layout,
            unit,
            input,
        }
    }

    /// λ·σ₀: the shift is λ times the largest σ_max of the 3H per-head blocks at initialization,
    /// and it follows the weights' scale exactly (a power-of-two rescale of W rescales it by the
    /// same power: singular values are computed on an exactly rescaled copy).
    #[test]
    fn a_relative_lambda_is_lambda_times_the_initial_sigma_max() {
        let c = reading(
            2.0,
            HeadLayout::Shifted,
            LambdaUnit::InitialSigmaMax,
            ShiftInput::LayerNormOutput,
        );
        let (_vs, attn) = build(cfg(c, false, false), 7);
        // `build` scales W after construction: choose λ again, as at initialization.
        attn.refresh_correction(0).unwrap();
        let blocks = attn.head_blocks(attn.qkv_weight()).to_kind(Kind::Double);
        let (_, singular, _) = blocks.svd(true, false);
        let sigma = singular.max().double_value(&[]);
        let got = attn.lambda().unwrap();
        // σ̂ from LAPACK within 50·max(m, n)·ε·σ (kappa-linalg's SVD bound), times λ = 2, and
        // the λ buffer is f32: one more rounding, half an f32 ulp of λ.
        let tol = 2.0 * 50.0 * 12.0 * f64::EPSILON * sigma
            + 4.0 * f64::EPSILON * got
            + f64::from(f32::EPSILON) / 2.0 * got;
        assert!(
            (got - 2.0 * sigma).abs() <= tol,
            "λ = {got}, 2σ₀ = {}",
            2.0 * sigma
        );
        tch::no_grad(|| {
            let _ = attn.c_attn.weight.shallow_clone().g_mul_scalar_(4.0);
        });
        attn.refresh_correction(0).unwrap();
        assert_eq!(attn.lambda().unwrap(), 4.0 * got);
        // Chosen once: later steps keep it.
        tch::no_grad(|| {
            let _ = attn.c_attn.weight.shallow_clone().g_mul_scalar_(0.5);
        });
        attn.refresh_correction(10).unwrap();
        assert_eq!(attn.lambda().unwrap(), 4.0 * got);
    }

    /// Under `ShiftInput::Normalized` the projection is LN(x)·Wᵀ + b + λ·x̂·Eᵀ, checked in f64
    /// against the materialized pattern E within the rounding of the two sums: every entry is
    /// a sum of at most D + 2 products, so each side is within γ_{D+2}·(|h||W|ᵀ + |b| + λ|x̂|Eᵀ)
    /// of the exact value (Higham, Thm 3.5), and the two within twice that.
    #[test]
    fn the_normalized_reading_shifts_the_tokens_before_the_gain() {
        for layout in [HeadLayout::Shifted, HeadLayout::SameBlock] {
            let c = reading(3.0, layout, LambdaUnit::Absolute, ShiftInput::Normalized);
            let (mut vs, attn) = build(cfg(c, false, true), 8);
            vs.double();
            assert!(attn.shifts_normalized_tokens());
            tch::manual_seed(9);
            let x0 = Tensor::randn([2, 5, 12], (Kind::Double, Device::Cpu));
            let x_hat = x0.layer_norm([12], None::<Tensor>, None::<Tensor>, 1e-5, true);
            let gain = Tensor::rand([12], (Kind::Double, Device::Cpu)) * 2.0 + 0.5;
            let h = &x_hat * &gain;
            let got = attn.project(&h, Some(&x_hat));
            let (w, b) = (attn.qkv_weight(), attn.qkv_bias().unwrap());
            let e = attn.shift_pattern().unwrap().to_kind(Kind::Double);
            let expect = h.linear(w, Some(b)) + x_hat.linear(&e, None::<Tensor>) * 3.0;
            let magnitude = h.abs().linear(&w.abs(), Some(b.abs()))
                + x_hat.abs().linear(&e, None::<Tensor>) * 3.0;
            let gamma = 14.0 * f64::EPSILON / 2.0 / (1.0 - 14.0 * f64::EPSILON / 2.0);
            let excess = ((&got - &expect).abs() - magnitude * (2.0 * gamma)).max();
            assert!(excess.double_value(&[]) <= 0.0, "{layout:?}");
            // The gain is not 1, so shifting LN(x) instead is a different layer.
            assert!(max_diff(&got, &attn.project(&h, None)) > 1e-3, "{layout:?}");
        }
    }

    #[test]
    fn readings_round_trip_and_old_configs_parse() {
        let old: CorrectionConfig =
            serde_json::from_str(r#"{"kind": "identity", "lambda": 10.0, "layout": "shifted"}"#)
                .unwrap();
        assert_eq!(old, CorrectionConfig::identity(10.0, HeadLayout::Shifted));
        // The default reading is written as before (built-in config files stay unchanged).
        assert!(!serde_json::to_string(&old).unwrap().contains("unit"));
        let c = reading(
            0.3,
            HeadLayout::SameBlock,
            LambdaUnit::InitialSigmaMax,
            ShiftInput::Normalized,
        );
        let text = serde_json::to_string(&c).unwrap();
        assert!(
            text.contains(r#""unit":"initial_sigma_max""#)
                && text.contains(r#""input":"normalized""#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<CorrectionConfig>(&text).unwrap(), c);
        assert_eq!(c.label(), "λ=0.3·σ₀ (same block) (on x̂)");
        let bad = r#"{"kind": "identity", "lambda": 1.0, "layout": "shifted", "unit": "relative"}"#;
        assert!(serde_json::from_str::<CorrectionConfig>(bad).is_err());
    }
}
