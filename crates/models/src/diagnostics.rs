//! Training-time diagnostics of every attention layer and head, computed on a fixed batch:
//! σ_min, σ_max and κ of the effective W_Q^h, W_K^h, W_V^h (with the correction), attention
//! entropy and saturation, and, for small models, the exact κ of the attention weight Jacobian
//! through kappa-attention.
//!
//! * Weights: the per-head D×k matrices W^h + C^h (the paper's orientation), through
//!   `kappa_attention::projection_stats` (κ = σ_max/σ_min, +∞ if numerically rank-deficient).
//! * Attention: `kappa_attention::attention_diagnostics` on P and S of the first `samples`
//!   sequences, averaged: mean row entropy (uniform: ln T for bidirectional attention), fraction
//!   of rows with more than 0.99 of their mass on one token, mean diagonal P\[i,i\], largest logit.
//! * Jacobian: J = ∂vec A/∂(vec W_Q, vec W_K, vec W_V) of one head on the layer's input X (after
//!   LN₁) of the first sequence, Nk × 3Dk, column-major vec (kappa-attention's convention), and
//!   its κ and κ⁺ (over the singular values above numpy's threshold). With biases, X is
//!   augmented with a column of ones and W with the bias row, so J is taken with respect to the
//!   whole affine projection. N is the whole sequence, or for causal attention its first
//!   `jacobian_max_tokens` tokens (exact: a causal prefix does not see later tokens);
//!   bidirectional sequences longer than that are skipped.

use kappa_attention::{
    attention_diagnostics, projection_stats, AttentionOptions, Kappa, SelfAttention,
    SATURATION_THRESHOLD,
};
use kappa_linalg::tch_backend::array_from_tensor;
use kappa_linalg::{singular_values, SvdDriver};
use ndarray::{concatenate, Array2, Axis};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::conditioned_attention::AttentionTrace;
use crate::error::{ModelsError, Result};
use crate::layers::Transformer;

mod config;
pub use config::DiagnosticsConfig;

/// σ_max, σ_min and κ of one projection.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spectrum {
    /// Largest singular value.
    #[serde(with = "crate::float")]
    pub sigma_max: f64,
    /// Smallest (k-th) singular value.
    #[serde(with = "crate::float")]
    pub sigma_min: f64,
    /// κ = σ_max/σ_min (+∞ when numerically rank-deficient).
    #[serde(with = "crate::float")]
    pub kappa: f64,
}

/// κ of the exact weight Jacobian of one head.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct JacobianStats {
    /// Tokens N used.
    pub tokens: usize,
    /// κ(J) (+∞ when numerically rank-deficient).
    #[serde(with = "crate::float")]
    pub kappa: f64,
    /// κ⁺(J), over the singular values above numpy's threshold.
    #[serde(with = "crate::float")]
    pub pseudo_kappa: f64,
    /// Numerical rank.
    pub rank: usize,
    /// min(Nk, 3Dk).
    pub full_rank: usize,
}

/// Everything measured for one head of one layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeadDiagnostics {
    /// Layer index.
    pub layer: usize,
    /// Head index.
    pub head: usize,
    /// Effective W_Q^h.
    pub wq: Spectrum,
    /// Effective W_K^h.
    pub wk: Spectrum,
    /// Effective W_V^h.
    pub wv: Spectrum,
    /// Mean row entropy of P (nats).
    #[serde(with = "crate::float")]
    pub entropy: f64,
    /// ln T (the entropy of uniform bidirectional attention).
    #[serde(with = "crate::float")]
    pub uniform_entropy: f64,
    /// Fraction of rows with max P > 0.99.
    #[serde(with = "crate::float")]
    pub saturated_fraction: f64,
    /// Mean of P[i, i].
    #[serde(with = "crate::float")]
    pub mean_diagonal: f64,
    /// Largest score.
    #[serde(with = "crate::float")]
    pub max_logit: f64,
    /// Mean over rows of ‖diag(p) − ppᵀ‖_F, the softmax Jacobian (0 when rows are one-hot).
    #[serde(with = "crate::float", default = "nan")]
    pub softmax_jacobian_frobenius: f64,
    /// The layer's λ (identity and scale-aware conditioning).
    pub lambda: Option<f64>,
    /// Exact Jacobian κ (when computed).
    pub jacobian: Option<JacobianStats>,
}

fn spectrum(block: &Tensor) -> Result<(Array2<f64>, Spectrum)> {
    // block is k×D (libtorch layout); the paper's W^h is its transpose, D×k.
    let w = array_from_tensor(block)?.reversed_axes();
    let s = projection_stats(w.view())?;
    Ok((
        w.as_standard_layout().to_owned(),
        Spectrum {
            sigma_max: s.sigma_max,
            sigma_min: s.sigma_min,
            kappa: s.kappa,
        },
    ))
}

/// Diagnostics of every head of `model`, from traces of the fixed batch
/// (`forward_trace(.., true)`, one per layer).
pub fn diagnose<M: Transformer + ?Sized>(
    model: &M,
    traces: &[AttentionTrace],
    config: &DiagnosticsConfig,
) -> Result<Vec<HeadDiagnostics>> {
    let blocks = model.blocks();
    if traces.len() != blocks.len() {
        return Err(ModelsError::Shape {
            arg: "traces",
            reason: format!("{} traces for {} layers", traces.len(), blocks.len()),
        });
    }
    let _guard = tch::no_grad_guard();
    let mut out = Vec::new();
    for (layer, (block, trace)) in blocks.iter().zip(traces).enumerate() {
        let attn = &block.attn;
        let cfg = *attn.config();
        let (h, d, k) = (cfg.n_head, cfg.n_embd, cfg.head_dim());
        let heads = attn.head_blocks(&attn.effective_qkv_weight());
        let bias = attn.qkv_bias().map(|b| b.detach());
        let size = trace.probs.size();
        let (batch, t) = (size[0] as usize, size[2] as usize);
        let samples = config.samples.clamp(1, batch);
        let jac_tokens = Some(config.jacobian_tokens(t, cfg.causal)).filter(|&n| n > 0);
        let x0 = match jac_tokens {
            Some(n) => {
                let x = array_from_tensor(&trace.input.get(0).narrow(0, 0, n as i64))?;
                Some(if bias.is_some() {
                    concatenate(Axis(1), &[x.view(), Array2::ones((n, 1)).view()]).map_err(|e| {
                        ModelsError::Shape {
                            arg: "input",
                            reason: e.to_string(),
                        }
                    })?
                } else {
                    x
                })
            }
            None => None,
        };
        for head in 0..h {
            let (wq, sq) = spectrum(&heads.get(head as i64))?;
            let (wk, sk) = spectrum(&heads.get((h + head) as i64))?;
            let (wv, sv) = spectrum(&heads.get((2 * h + head) as i64))?;
            let (mut ent, mut sat, mut diag, mut uni, mut jac, mut maxl) =
                (0.0, 0.0, 0.0, 0.0, 0.0, f64::NEG_INFINITY);
            for s in 0..samples {
                let p = array_from_tensor(&trace.probs.get(s as i64).get(head as i64))?;
                let sc = array_from_tensor(&trace.scores.get(s as i64).get(head as i64))?;
                let a =
                    attention_diagnostics(p.view(), sc.view(), cfg.causal, SATURATION_THRESHOLD)?;
                ent += a.mean_entropy;
                sat += a.saturated_fraction;
                diag += a.mean_diagonal;
                uni += a.uniform_entropy;
                jac += a.mean_softmax_jacobian_frobenius;
                maxl = maxl.max(a.max_logit);
            }
            let m = samples as f64;
            let jacobian = match &x0 {
                Some(x) => {
                    let with_bias = |w: Array2<f64>, offset: usize| -> Result<Array2<f64>> {
                        match &bias {
                            Some(b) => {
                                let row = array_from_tensor(
                                    &b.narrow(0, (offset * d + head * k) as i64, k as i64)
                                        .view([1, k as i64]),
                                )?;
                                concatenate(Axis(0), &[w.view(), row.view()]).map_err(|e| {
                                    ModelsError::Shape {
                                        arg: "bias",
                                        reason: e.to_string(),
                                    }
                                })
                            }
                            None => Ok(w),
                        }
                    };
                    let one = SelfAttention::new(
                        with_bias(wq, 0)?,
                        with_bias(wk, 1)?,
                        with_bias(wv, 2)?,
                        AttentionOptions {
                            scale: cfg.scaling,
                            causal: cfg.causal,
                        },
                    )?;
                    let j = one.forward(x.view())?.jacobian_weights()?.full()?;
                    let kap = Kappa::of(j.view())?;
                    Some(JacobianStats {
                        tokens: x.nrows(),
                        kappa: kap.kappa,
                        pseudo_kappa: kap.pseudo_kappa,
                        rank: kap.rank,
                        full_rank: kap.full_rank,
                    })
                }
                None => None,
            };
            out.push(HeadDiagnostics {
                layer,
                head,
                wq: sq,
                wk: sk,
                wv: sv,
                entropy: ent / m,
                uniform_entropy: uni / m,
                saturated_fraction: sat / m,
                mean_diagonal: diag / m,
                max_logit: maxl,
                softmax_jacobian_frobenius: jac / m,
                lambda: attn.lambda(),
                jacobian,
            });
        }
    }
    Ok(out)
}

fn nan() -> f64 {
    f64::NAN
}

/// The spectral state of one weight matrix, in its tall orientation (transposed when it has
/// more columns than rows, so the Gram WᵀW is over the smaller side — the orientation manifold
/// Muon constrains). Logged at every evaluation for the matrices the optimizers constrain.
///
/// For W on DGram (Off(WᵀW) = 0) the singular values are the column norms; on Stiefel all are 1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatrixDiagnostics {
    /// The var-store name.
    pub name: String,
    /// Stored shape (rows, cols).
    pub shape: (usize, usize),
    /// All singular values, descending (empty when min(m, n) exceeds the limit given to
    /// [`matrix_diagnostics`]).
    pub singular_values: Vec<f64>,
    /// σ_max.
    #[serde(with = "crate::float")]
    pub sigma_max: f64,
    /// σ_min (the min(m, n)-th singular value).
    #[serde(with = "crate::float")]
    pub sigma_min: f64,
    /// σ_max/σ_min (∞ when σ_min = 0).
    #[serde(with = "crate::float")]
    pub kappa: f64,
    /// ‖Off(WᵀW)‖_F: 0 on DGram and Stiefel.
    #[serde(with = "crate::float")]
    pub off_gram: f64,
    /// ‖WᵀW − I‖_F/√n: 0 on Stiefel.
    #[serde(with = "crate::float")]
    pub stiefel_violation: f64,
    /// The smallest column norm (tall orientation).
    #[serde(with = "crate::float")]
    pub column_norm_min: f64,
    /// The largest column norm (tall orientation).
    #[serde(with = "crate::float")]
    pub column_norm_max: f64,
}

/// [`MatrixDiagnostics`] of `w` (any float kind, any device), keeping every singular value when
/// min(m, n) ≤ `keep_singular_values`. Cost: one f64 SVD of singular values only and one
/// Gram product.
///
/// Errors: `w` not 2-D, empty or non-finite.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// let w = Tensor::eye(4, (Kind::Float, Device::Cpu)).narrow(1, 0, 3) * 2.0;
/// let d = kappa_models::matrix_diagnostics("w", &w, 64)?;
/// assert_eq!(d.singular_values, vec![2.0, 2.0, 2.0]);
/// assert_eq!((d.off_gram, d.column_norm_max), (0.0, 2.0));
/// # Ok::<(), kappa_models::ModelsError>(())
/// ```
pub fn matrix_diagnostics(
    name: &str,
    w: &Tensor,
    keep_singular_values: usize,
) -> Result<MatrixDiagnostics> {
    let a = array_from_tensor(w)?;
    let shape = a.dim();
    let tall = if shape.0 >= shape.1 {
        a
    } else {
        a.reversed_axes()
    };
    let s = singular_values(tall.view(), SvdDriver::default())?.to_vec();
    let gram = tall.t().dot(&tall);
    let n = gram.nrows();
    let (mut off, mut eye) = (0.0, 0.0);
    for ((i, j), &g) in gram.indexed_iter() {
        let target = if i == j { 1.0 } else { 0.0 };
        eye += (g - target) * (g - target);
        if i != j {
            off += g * g;
        }
    }
    let norms: Vec<f64> = gram.diag().iter().map(|g| g.max(0.0).sqrt()).collect();
    let (smax, smin) = (s[0], s[s.len() - 1]);
    Ok(MatrixDiagnostics {
        name: name.to_string(),
        shape,
        singular_values: if n <= keep_singular_values {
            s
        } else {
            Vec::new()
        },
        sigma_max: smax,
        sigma_min: smin,
        kappa: if smin > 0.0 {
            smax / smin
        } else {
            f64::INFINITY
        },
        off_gram: off.sqrt(),
        stiefel_violation: (eye / n as f64).sqrt(),
        column_norm_min: norms.iter().copied().fold(f64::INFINITY, f64::min),
        column_norm_max: norms.iter().copied().fold(0.0, f64::max),
    })
}

/// Means over heads and layers of the headline diagnostics (for progress lines and plots).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiagnosticsSummary {
    /// Mean κ(W_Q^h).
    #[serde(with = "crate::float")]
    pub kappa_wq: f64,
    /// Mean σ_min(W_Q^h).
    #[serde(with = "crate::float")]
    pub sigma_min_wq: f64,
    /// Mean entropy.
    #[serde(with = "crate::float")]
    pub entropy: f64,
    /// Mean saturated fraction.
    #[serde(with = "crate::float")]
    pub saturated_fraction: f64,
    /// Median κ(J) over the heads where it was computed (NaN if none).
    #[serde(with = "crate::float")]
    pub jacobian_kappa: f64,
}

/// Summarizes per-head diagnostics.
pub fn summarize(heads: &[HeadDiagnostics]) -> DiagnosticsSummary {
    let n = heads.len().max(1) as f64;
    let mean = |f: &dyn Fn(&HeadDiagnostics) -> f64| heads.iter().map(f).sum::<f64>() / n;
    let mut jac: Vec<f64> = heads
        .iter()
        .filter_map(|h| h.jacobian.map(|j| j.kappa))
        .collect();
    jac.sort_by(f64::total_cmp);
    let median = if jac.is_empty() {
        f64::NAN
    } else if jac.len() % 2 == 1 {
        jac[jac.len() / 2]
    } else {
        0.5 * (jac[jac.len() / 2 - 1] + jac[jac.len() / 2])
    };
    DiagnosticsSummary {
        kappa_wq: mean(&|h| h.wq.kappa),
        sigma_min_wq: mean(&|h| h.wq.sigma_min),
        entropy: mean(&|h| h.entropy),
        saturated_fraction: mean(&|h| h.saturated_fraction),
        jacobian_kappa: median,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditioned_attention::CorrectionConfig;
    use crate::gpt::{Gpt, GptConfig};
    use crate::vit::{Vit, VitConfig};
    use kappa_attention::HeadLayout;
    use tch::{nn, Device, Kind};

    #[test]
    fn every_head_of_every_layer_is_diagnosed() {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = GptConfig {
            bias: true,
            ..GptConfig::tiny(9)
        };
        let gpt = Gpt::new(&vs.root(), cfg).unwrap();
        let idx = Tensor::randint(9, [3, 16], (Kind::Int64, Device::Cpu));
        let (_l, traces) = gpt.forward_trace(&idx, true);
        let config = DiagnosticsConfig {
            enabled: true,
            samples: 2,
            jacobian_max_tokens: 6,
        };
        let d = diagnose(&gpt, &traces, &config).unwrap();
        assert_eq!(d.len(), 4);
        for h in &d {
            assert!(h.wq.kappa >= 1.0 && h.wq.sigma_min > 0.0 && h.wq.sigma_max >= h.wq.sigma_min);
            assert!(h.entropy > 0.0 && h.entropy <= h.uniform_entropy + 1e-9);
            let j = h.jacobian.unwrap();
            assert_eq!(j.tokens, 6);
            // Causal attention: the first row attends to itself only, so J has null directions.
            assert!(j.pseudo_kappa >= 1.0 && j.rank <= j.full_rank);
        }
        let text = serde_json::to_string(&d).unwrap();
        let back: Vec<HeadDiagnostics> = serde_json::from_str(&text).unwrap();
        assert_eq!(back.len(), 4);
        assert!(summarize(&d).kappa_wq >= 1.0);
    }

    #[test]
    fn a_large_identity_shift_collapses_attention_and_flattens_the_spectrum() {
        let run = |c: CorrectionConfig| {
            tch::manual_seed(1);
            let vs = nn::VarStore::new(Device::Cpu);
            let vit = Vit::new(&vs.root(), VitConfig::tiny().with_correction(c)).unwrap();
            let x = Tensor::randn([2, 1, 28, 28], (Kind::Float, Device::Cpu));
            let (_l, traces) = vit.forward_trace(&x, true);
            summarize(&diagnose(&vit, &traces, &DiagnosticsConfig::default()).unwrap())
        };
        let base = run(CorrectionConfig::None);
        let ten = run(CorrectionConfig::identity(10.0, HeadLayout::Shifted));
        assert!(base.saturated_fraction < 0.1, "{base:?}");
        assert!(ten.saturated_fraction > 0.9, "{ten:?}");
        assert!(ten.kappa_wq < base.kappa_wq && ten.sigma_min_wq > base.sigma_min_wq);
        assert!(base.jacobian_kappa.is_finite());
    }
}
