//! The largest pre-softmax logit of every head, S_h = max_{b, i, j allowed} s·q_i·k_j, computed
//! without gradient and without the whole B×H×T×T score matrix, and what QK-clip did with it.
//!
//! The queries are taken in chunks of rows, so that one chunk's scores hold at most
//! [`CHUNK_ENTRIES`] entries (B·H·rows·T ≤ 2²², 16 MiB in f32; at least one row); each chunk's
//! scores are reduced to a per-head maximum and dropped. Under a causal mask, the chunk of
//! query rows i₀..i₀+n only meets keys 0..i₀+n, and the future keys j > i inside it are set to
//! −∞ before the maximum, so masked positions never count. Cost: the products of the allowed
//! (and, within a chunk, the masked) pairs, 2·B·T²·D flops bidirectional and about B·T²·D causal
//! (D = H·k): the same as the attention's own QKᵀ, T/(12·D) (bidirectional) or T/(24·D)
//! (causal) of a block's forward matmuls (24·B·T·D² flops with a 4× MLP).

use kappa_optim::HeadFactors;
use tch::{Kind, Tensor};

/// The largest number of score entries one chunk materializes.
pub const CHUNK_ENTRIES: i64 = 1 << 22;

/// Per-head max of s·QKᵀ over the batch, as an f32 tensor of H entries (−∞ for T = 0), from
/// q, k of shape B×H×T×k; `causal` excludes the pairs j > i. No gradient flows.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// let q = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0]).view([1, 1, 2, 2]);
/// let k = Tensor::from_slice(&[0.0f32, 0.0, 0.0, 3.0]).view([1, 1, 2, 2]);
/// // Bidirectional: q₀·k₁ = 0, q₁·k₁ = 3; causal: q₀ sees k₀ only (0), q₁ sees both (3).
/// let m = kappa_models::max_logit::head_max_logits(&q, &k, 0.5, false);
/// assert_eq!(m.double_value(&[0]), 1.5);
/// let q = Tensor::from_slice(&[0.0f32, 1.0, 0.0, 0.0]).view([1, 1, 2, 2]);
/// // Causal: q₀ = (0, 1) would meet k₁ (3) but that pair is masked; q₁ = 0 gives 0.
/// assert_eq!(kappa_models::max_logit::head_max_logits(&q, &k, 1.0, true).double_value(&[0]), 0.0);
/// ```
pub fn head_max_logits(q: &Tensor, k: &Tensor, scale: f64, causal: bool) -> Tensor {
    let _guard = tch::no_grad_guard();
    let size = q.size();
    let (b, h, t) = (size[0], size[1], size[2]);
    let mut best = Tensor::full([h], f64::NEG_INFINITY, (Kind::Float, q.device()));
    if b == 0 || t == 0 {
        return best;
    }
    let rows = (CHUNK_ENTRIES / (b * h * t).max(1)).clamp(1, t);
    let mut start = 0;
    while start < t {
        let n = rows.min(t - start);
        let keys = if causal { start + n } else { t };
        let scores = q
            .narrow(2, start, n)
            .matmul(&k.narrow(2, 0, keys).transpose(-2, -1))
            * scale;
        let scores = if causal {
            let future = Tensor::ones([n, keys], (Kind::Bool, q.device())).triu(start + 1);
            scores.masked_fill(&future, f64::NEG_INFINITY)
        } else {
            scores
        };
        best = best.maximum(&scores.amax([0, 2, 3], false).to_kind(Kind::Float));
        start += n;
    }
    best
}

/// The per-head maxima of a tensor from [`head_max_logits`], as `f64`.
pub(crate) fn to_vec(m: &Tensor) -> Vec<f64> {
    let m = m.to_kind(Kind::Double).to_device(tch::Device::Cpu);
    (0..m.size()[0]).map(|i| m.double_value(&[i])).collect()
}

/// What QK-clip measured and did on one attention layer
/// ([`ConditionedAttention::clip_qk`](crate::ConditionedAttention::clip_qk)).
#[derive(Clone, Debug, PartialEq)]
pub struct QkClipReport {
    /// Each head's largest logit before the clip (on the captured input, current weights).
    pub max_logits: Vec<f64>,
    /// Each head's (γ_Q, γ_K), [`HeadFactors::ONE`] for the heads left alone.
    pub factors: Vec<HeadFactors>,
}

impl QkClipReport {
    /// How many heads were rescaled.
    pub fn clipped(&self) -> usize {
        self.factors.iter().filter(|f| f.is_clipped()).count()
    }

    /// The largest logit over the heads (−∞ without heads).
    pub fn max_logit(&self) -> f64 {
        self.max_logits
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max)
    }
}
