//! A Vision Transformer: non-overlapping patch embedding (a P×P convolution with stride P), a
//! class token, learned positions, pre-LN blocks with bidirectional (optionally conditioned)
//! attention, a final LayerNorm and a linear head on the class token.
//!
//! With an image of side S, N = (S/P)² patches and N + 1 tokens. Initialization: patch
//! embedding, positions, class token and head N(0, 0.02²); blocks as in [`crate::layers::Block`]
//! with output projections N(0, (0.02/√(2L))²).

use serde::{Deserialize, Serialize};
use tch::nn::Module as _;
use tch::{nn, Tensor};

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
use crate::linear::Linear;

/// The size and the attention settings of a [`Vit`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VitConfig {
    /// Image side S (square images).
    pub image_size: usize,
    /// Input channels.
    pub channels: usize,
    /// Patch side P (divides S).
    pub patch_size: usize,
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
    /// The score scale s (every preset names it: `"inv_sqrt_k"`).
    pub scaling: ScoreScale,
    /// The spectral correction of every attention layer.
    #[serde(alias = "conditioning")]
    pub correction: CorrectionConfig,
    /// Use libtorch's fused attention kernel.
    pub fused_kernel: bool,
}

impl VitConfig {
    /// A model for tests on 28×28 gray images: P = 7 (17 tokens), D = 16, 2 layers, 2 heads.
    pub fn tiny() -> Self {
        Self {
            image_size: 28,
            channels: 1,
            patch_size: 7,
            num_classes: 10,
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

    /// Fashion-MNIST on 2 CPU cores: P = 7 (16 patches + class token), D = 64, 2 layers,
    /// 4 heads (k = 16), MLP ×2 (68 k parameters).
    pub fn cpu() -> Self {
        Self {
            n_layer: 2,
            n_head: 4,
            n_embd: 64,
            mlp_ratio: 2,
            ..Self::tiny()
        }
    }

    /// The ViT-B/16 layout: 224×224×3, P = 16 (197 tokens), D = 768, 12 layers, 12 heads,
    /// MLP ×4, biases, 1000 classes (86 M parameters).
    pub fn vit_b16() -> Self {
        Self {
            image_size: 224,
            channels: 3,
            patch_size: 16,
            num_classes: 1000,
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

    /// The same model with another correction.
    pub fn with_correction(self, correction: CorrectionConfig) -> Self {
        Self { correction, ..self }
    }

    /// The old name of [`VitConfig::with_correction`].
    #[deprecated(since = "0.2.0", note = "renamed `with_correction`")]
    pub fn with_conditioning(self, correction: CorrectionConfig) -> Self {
        self.with_correction(correction)
    }

    /// Tokens per image: (S/P)² + 1 (`usize::MAX` when that does not fit a `usize`).
    pub fn tokens(&self) -> usize {
        self.token_count()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(usize::MAX)
    }

    /// (S/P)² + 1 in u128 (`None` on overflow).
    fn token_count(&self) -> Option<u128> {
        let side = (self.image_size / self.patch_size.max(1)) as u128;
        side.checked_mul(side)?.checked_add(1)
    }

    /// The attention settings of every layer (not causal).
    pub fn attention(&self) -> AttentionConfig {
        AttentionConfig {
            n_embd: self.n_embd,
            n_head: self.n_head,
            bias: self.bias,
            causal: false,
            scaling: self.scaling,
            correction: self.correction,
            fused_kernel: self.fused_kernel,
            kernel: AttentionKernel::Softmax,
        }
    }

    /// The keys that size the model's weights, as errors name them.
    pub const WEIGHT_KEYS: &'static str = "model.image_size, model.channels, model.patch_size, \
        model.num_classes, model.n_layer, model.n_embd, model.mlp_ratio";

    /// Checks every size; errors name the field. The sizes have no fixed maximum: they are
    /// bounded by the memory they take ([`VitConfig::training_bytes`], checked where the batch
    /// is known; [`Vit::new`] checks the weights).
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("image_size", self.image_size),
            ("channels", self.channels),
            ("patch_size", self.patch_size),
            ("num_classes", self.num_classes),
            ("n_layer", self.n_layer),
            ("mlp_ratio", self.mlp_ratio),
        ] {
            if v == 0 {
                return Err(ModelsError::config(format!("model.{name}"), "must be ≥ 1"));
            }
        }
        if !self.image_size.is_multiple_of(self.patch_size) {
            return Err(ModelsError::config(
                "model.patch_size",
                format!(
                    "must divide image_size = {}, found {}",
                    self.image_size, self.patch_size
                ),
            ));
        }
        self.attention().validate("model")
    }

    /// Trainable parameters: the patch embedding (P²·C·D weights and D biases: it is a
    /// convolution, as in ViT), the class token D, the positions (N + 1)·D, L blocks
    /// ([`block_parameters`]), the final LayerNorm and the head; `None` on overflow of u128.
    pub fn parameters(&self) -> Option<u128> {
        let w = |x: usize| x as u128;
        let (d, b, classes) = (w(self.n_embd), u128::from(self.bias), w(self.num_classes));
        let p2c = w(self.patch_size)
            .checked_mul(w(self.patch_size))?
            .checked_mul(w(self.channels))?;
        let blocks = block_parameters(self.n_embd, self.mlp_ratio, self.bias)?;
        let per_width = [p2c, 2, self.token_count()?, 1 + b, classes]
            .into_iter()
            .try_fold(0u128, u128::checked_add)?;
        per_width
            .checked_mul(d)?
            .checked_add(w(self.n_layer).checked_mul(blocks)?)?
            .checked_add(b * classes)
    }

    /// [`VitConfig::parameters`] as a `usize` (`usize::MAX` when it does not fit one).
    pub fn parameter_count(&self) -> usize {
        self.parameters()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(usize::MAX)
    }

    /// The bytes of one training step of this model at `batch` images, with evaluation batches
    /// of `eval_batch` images and `diagnostics` at every evaluation ([`StepSize::bytes`] states
    /// the formula; the input is C·S² pixels, the output the class logits). `None` when it
    /// overflows u128.
    pub fn training_bytes(
        &self,
        batch: usize,
        eval_batch: usize,
        diagnostics: &DiagnosticsConfig,
    ) -> Option<u128> {
        let side = self.image_size as u128;
        StepSize {
            parameters: self.parameters()?,
            batch,
            eval_batch,
            tokens: usize::try_from(self.token_count()?).ok()?,
            n_embd: self.n_embd,
            n_head: self.n_head,
            n_layer: self.n_layer,
            mlp_ratio: self.mlp_ratio,
            causal: false,
            input: side.checked_mul(side)?.checked_mul(self.channels as u128)?,
            outputs: self.num_classes as u128,
            diagnostics: *diagnostics,
        }
        .bytes()
    }

    /// Forward FLOPs per image (2 × multiply–adds): patch embedding, blocks (projections, MLP,
    /// attention products) and head.
    pub fn flops_per_image(&self) -> f64 {
        let (d, r, n, l) = (
            self.n_embd as f64,
            self.mlp_ratio as f64,
            self.tokens() as f64,
            self.n_layer as f64,
        );
        let p2c = (self.patch_size * self.patch_size * self.channels) as f64;
        2.0 * ((n - 1.0) * p2c * d
            + l * (n * (4.0 + 2.0 * r) * d * d + 2.0 * n * n * d)
            + d * self.num_classes as f64)
    }
}

/// The Vision Transformer.
#[derive(Debug)]
pub struct Vit {
    cfg: VitConfig,
    /// D×C×P×P.
    pub patch_weight: Tensor,
    /// D.
    pub patch_bias: Tensor,
    /// 1×1×D.
    pub cls_token: Tensor,
    /// 1×(N+1)×D.
    pub pos_embed: Tensor,
    blocks: Vec<Block>,
    /// The final LayerNorm.
    pub ln_f: LayerNorm,
    /// D → classes.
    pub head: Linear,
}

impl Vit {
    /// Builds the model under `p` (call `tch::manual_seed` first for a reproducible init).
    ///
    /// ```
    /// use kappa_models::vit::{Vit, VitConfig};
    /// use tch::{nn, Device, Kind, Tensor};
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let vit = Vit::new(&vs.root(), VitConfig::tiny())?;
    /// let images = Tensor::zeros([3, 1, 28, 28], (Kind::Float, Device::Cpu));
    /// assert_eq!(vit.logits(&images)?.size(), vec![3, 10]);
    /// # Ok::<(), kappa_models::ModelsError>(())
    /// ```
    ///
    /// Errors: an invalid config ([`VitConfig::validate`]); on the CPU, weights that do not fit
    /// in this process's memory ([`ensure_weights_fit`]: an error naming the keys, where tch's
    /// initializers would panic on the failed allocation).
    pub fn new(p: &nn::Path<'_>, cfg: VitConfig) -> Result<Self> {
        cfg.validate()?;
        ensure_weights_fit(p, cfg.parameters(), "ViT", VitConfig::WEIGHT_KEYS)?;
        let (d, c, ps) = (
            cfg.n_embd as i64,
            cfg.channels as i64,
            cfg.patch_size as i64,
        );
        let init = nn::Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        };
        let patch_weight = p.f_var("patch_embed", &[d, c, ps, ps], init)?;
        let patch_bias = p.f_zeros("patch_bias", &[d])?;
        let cls_token = p.f_var("cls_token", &[1, 1, d], init)?;
        let pos_embed = p.f_var("pos_embed", &[1, cfg.tokens() as i64, d], init)?;
        let proj_std = 0.02 / (2.0 * cfg.n_layer as f64).sqrt();
        let blocks = (0..cfg.n_layer)
            .map(|i| Block::new(&(p / "h" / i), cfg.attention(), cfg.mlp_ratio, proj_std))
            .collect::<Result<Vec<_>>>()?;
        let ln_f = LayerNorm::new(&(p / "ln_f"), d, cfg.bias)?;
        let head = Linear::new(&(p / "head"), d, cfg.num_classes as i64, cfg.bias, 0.02)?;
        Ok(Self {
            cfg,
            patch_weight,
            patch_bias,
            cls_token,
            pos_embed,
            blocks,
            ln_f,
            head,
        })
    }

    /// The config.
    pub fn config(&self) -> &VitConfig {
        &self.cfg
    }

    /// Checks that `images` is B×C×S×S floating point on the model's device.
    fn check(&self, images: &Tensor) -> Result<()> {
        let s = self.cfg.image_size as i64;
        let size = images.size();
        if size.len() != 4 || size[1] != self.cfg.channels as i64 || size[2] != s || size[3] != s {
            return Err(ModelsError::Shape {
                arg: "images",
                reason: format!("expected B×{}×{s}×{s}, found {size:?}", self.cfg.channels),
            });
        }
        if !images.is_floating_point() {
            return Err(ModelsError::Shape {
                arg: "images",
                reason: format!("expected floating-point pixels, found {:?}", images.kind()),
            });
        }
        check::on_device(images, "images", "images", self.patch_weight.device())
    }

    /// Logits B×classes and, with `trace`, every layer's attention trace. `images` is not
    /// checked: [`Vit::try_forward_trace`] checks it first.
    ///
    /// # Panics
    ///
    /// On `images` that [`Vit::try_forward_trace`] rejects (libtorch's error, or an index out
    /// of bounds for a 0-dimensional tensor).
    pub fn forward_trace(&self, images: &Tensor, trace: bool) -> (Tensor, Vec<AttentionTrace>) {
        let b = images.size()[0];
        let ps = self.cfg.patch_size as i64;
        let patches = images
            .conv2d(
                &self.patch_weight,
                Some(&self.patch_bias),
                [ps, ps],
                [0, 0],
                [1, 1],
                1,
            )
            .flatten(2, 3)
            .transpose(1, 2);
        let cls = self.cls_token.expand([b, 1, self.cfg.n_embd as i64], false);
        let mut x = Tensor::cat(&[cls, patches], 1) + &self.pos_embed;
        let mut traces = Vec::new();
        for block in &self.blocks {
            let (y, tr) = block.forward_trace(&x, trace);
            x = y;
            traces.extend(tr);
        }
        let cls_out = self.ln_f.forward(&x).select(1, 0);
        (self.head.forward(&cls_out), traces)
    }

    /// [`Vit::forward_trace`] after checking `images`: B×C×S×S (`channels`, `image_size`),
    /// floating point, on the model's device.
    ///
    /// Errors: [`ModelsError::Shape`] naming `images`.
    pub fn try_forward_trace(
        &self,
        images: &Tensor,
        trace: bool,
    ) -> Result<(Tensor, Vec<AttentionTrace>)> {
        self.check(images)?;
        Ok(self.forward_trace(images, trace))
    }

    /// Checked logits B×classes.
    ///
    /// Errors: as [`Vit::try_forward_trace`].
    pub fn logits(&self, images: &Tensor) -> Result<Tensor> {
        Ok(self.try_forward_trace(images, false)?.0)
    }

    /// Mean cross-entropy against integer `labels` (B Int64 on the model's device, each in
    /// [0, `num_classes`)).
    ///
    /// Errors: [`ModelsError::Shape`] naming `images` (as [`Vit::try_forward_trace`]) or
    /// `labels`.
    pub fn loss(&self, images: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let logits = self.logits(images)?;
        let b = images.size()[0];
        check::labels(labels, b, self.cfg.num_classes, self.patch_weight.device())?;
        Ok(logits.cross_entropy_for_logits(labels))
    }
}

impl Transformer for Vit {
    fn blocks(&self) -> &[Block] {
        &self.blocks
    }
}

impl nn::Module for Vit {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.forward_trace(xs, false).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn parameter_count_matches_and_vit_b16_has_86m() {
        for bias in [false, true] {
            let cfg = VitConfig {
                bias,
                ..VitConfig::tiny()
            };
            let vs = nn::VarStore::new(Device::Cpu);
            let _m = Vit::new(&vs.root(), cfg).unwrap();
            let n: usize = vs.trainable_variables().iter().map(Tensor::numel).sum();
            assert_eq!(n, cfg.parameter_count());
        }
        let p = VitConfig::vit_b16().parameter_count();
        assert!((86_000_000..86_700_000).contains(&p), "{p}");
        assert_eq!(VitConfig::vit_b16().tokens(), 197);
    }

    #[test]
    fn a_vit_too_large_for_memory_is_an_error_naming_its_keys_before_a_weight_is_built() {
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = VitConfig {
            image_size: 1 << 40,
            patch_size: 1,
            ..VitConfig::tiny()
        };
        // (2⁴⁰)² + 1 tokens do not fit a usize; their 2⁸⁴ position weights fit a u128, not
        // the memory.
        assert_eq!(cfg.tokens(), usize::MAX);
        assert_eq!(
            cfg.training_bytes(1, 1, &DiagnosticsConfig::default()),
            None
        );
        let err = Vit::new(&vs.root(), cfg).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ModelsError::TooLarge { .. }), "{text}");
        assert!(text.contains("model.image_size"), "{text}");
        assert!(vs.variables().is_empty());
    }

    #[test]
    fn shapes_gradients_and_traces() {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let m = Vit::new(
            &vs.root(),
            VitConfig::tiny().with_correction(CorrectionConfig::Svd { every: 1 }),
        )
        .unwrap();
        let x = Tensor::randn([4, 1, 28, 28], (Kind::Float, Device::Cpu));
        let y = Tensor::from_slice(&[0i64, 3, 9, 1]);
        let loss = m.loss(&x, &y).unwrap();
        assert!((loss.double_value(&[]) - 10f64.ln()).abs() < 0.3);
        loss.backward();
        for t in vs.trainable_variables() {
            assert!(t.grad().defined());
        }
        let (_l, traces) = m.forward_trace(&x, true);
        assert_eq!(traces.len(), 2);
        assert_eq!(traces[0].probs.size(), vec![4, 2, 17, 17]);
        assert!(m
            .logits(&Tensor::zeros([1, 1, 27, 27], (Kind::Float, Device::Cpu)))
            .is_err());
        assert!(m.loss(&x, &Tensor::from_slice(&[0i64, 1])).is_err());
        let bad = VitConfig {
            patch_size: 5,
            ..VitConfig::tiny()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("patch_size"));
    }
}
