//! Nyström attention (Xiong et al., *Nyströmformer*, 2021): softmax attention approximated
//! through m landmarks, O(T·m) time and memory instead of O(T²), for bidirectional (encoder)
//! attention.
//!
//! # Math
//!
//! Per head, with Q, K, V ∈ ℝ^{T×k}, score multiplier c (1/√k by default) and T = m·ℓ:
//!
//! * landmarks by segment means: Q̃_i = (1/ℓ)·Σ_{j<ℓ} Q_{iℓ+j}, K̃ likewise (m×k each);
//! * three small softmax kernels (row-wise softmax σ):
//!   F = σ(c·Q K̃ᵀ) ∈ ℝ^{T×m}, A = σ(c·Q̃ K̃ᵀ) ∈ ℝ^{m×m}, B = σ(c·Q̃ Kᵀ) ∈ ℝ^{m×T};
//! * the output Ŝ·V = F·A⁺·(B·V), with A⁺ the Moore–Penrose pseudo-inverse.
//!
//! With m = T the landmarks are the tokens themselves, F = A = B = S = σ(c·QKᵀ), and
//! F·A⁺·B = S·S⁺·S = S: the output is exact softmax attention (tested, with the exact
//! pseudo-inverse, to rounding times κ(S)).
//!
//! **The pseudo-inverse** ([`Pinv`]): `Exact` is libtorch's SVD-based `pinv`; `Iterative { steps }`
//! is the Nyströmformer's iteration (Razavi et al., 2014), matrix products only:
//! Z₀ = Aᵀ/(‖A‖₁·‖A‖_∞) (max column sum × max row sum), then
//! Z ← ¼·Z·(13I − AZ·(15I − AZ·(7I − AZ))). With the residual R = I − AZ one step is
//! Z ← Z·(I + R + R² + ¼R³), so R ← ¾R³ + ¼R⁴: cubic convergence to A⁻¹ once ‖R‖ < 1, which
//! Z₀'s scaling guarantees for a non-singular A (the eigenvalues of AZ₀ = AAᵀ/(‖A‖₁‖A‖_∞) lie in
//! (0, 1]); the Nyströmformer runs 6
//! steps. Each step costs four m×m products. On an ill-conditioned A (landmark kernels of
//! unstructured tokens are close to the rank-one uniform matrix) a few steps invert only A's
//! leading directions, which regularizes: measured in docs/models.md, where the exact
//! pseudo-inverse gives the worse approximation of softmax attention.
//!
//! **The skip connection** (optional, the Nyströmformer's): a depthwise convolution of V along
//! the sequence, kernel length r (33 in the paper), one filter per head, added to the output;
//! its weight (H×r) is the only trainable parameter Nyström attention adds.
//!
//! **Logits**: every Nyström logit is an average of exact logits (q·k̃ = mean_j q·k_j), so the
//! per-head max logit of exact attention ([`crate::max_logit`]) bounds every logit here.
//!
//! Cost per head: 4·T·m·k (F, B, B·V, F·(A⁺BV)) + 2·m²·k + the pseudo-inverse (4 m×m products
//! per step), against 4·T²·k for exact attention; memory T·m instead of T².

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::error::{ModelsError, Result};

/// How A⁺ is computed (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pinv {
    /// libtorch's SVD-based pseudo-inverse.
    Exact,
    /// The Nyströmformer's iteration, `steps` times (the paper: 6).
    Iterative {
        /// Iterations (≥ 1).
        steps: usize,
    },
}

/// The settings of Nyström attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NystromConfig {
    /// Landmarks m (≥ 1; must divide the sequence length).
    pub landmarks: usize,
    /// The pseudo-inverse of the landmark kernel.
    pub pinv: Pinv,
    /// Length r of the depthwise convolution skip on V (odd; 0: no skip).
    pub conv_kernel: usize,
}

impl NystromConfig {
    /// The Nyströmformer's settings for `landmarks`: 6 pseudo-inverse iterations and the
    /// 33-tap convolution skip.
    pub fn paper(landmarks: usize) -> Self {
        Self {
            landmarks,
            pinv: Pinv::Iterative { steps: 6 },
            conv_kernel: 33,
        }
    }

    /// Checks the settings; `field` prefixes the names in errors.
    pub fn validate(&self, field: &str) -> Result<()> {
        if self.landmarks == 0 {
            return Err(ModelsError::config(
                format!("{field}.landmarks"),
                "must be ≥ 1",
            ));
        }
        if let Pinv::Iterative { steps: 0 } = self.pinv {
            return Err(ModelsError::config(
                format!("{field}.pinv.iterative.steps"),
                "must be ≥ 1",
            ));
        }
        if self.conv_kernel != 0 && self.conv_kernel.is_multiple_of(2) {
            return Err(ModelsError::config(
                format!("{field}.conv_kernel"),
                format!("must be odd (centred) or 0, found {}", self.conv_kernel),
            ));
        }
        Ok(())
    }

    /// Checks that a sequence of `t` tokens splits into the landmarks' segments.
    pub fn check_length(&self, t: usize) -> Result<()> {
        if t == 0 || !t.is_multiple_of(self.landmarks) {
            return Err(ModelsError::Shape {
                arg: "x",
                reason: format!(
                    "Nyström attention with {} landmarks needs a sequence length divisible by \
                     them, found {t}",
                    self.landmarks
                ),
            });
        }
        Ok(())
    }
}

/// Segment means along the sequence axis: (…, T, k) → (…, m, k), T = m·ℓ.
fn segment_means(x: &Tensor, m: i64) -> Tensor {
    let mut size = x.size();
    let (t, k) = (size[size.len() - 2], size[size.len() - 1]);
    size.truncate(size.len() - 2);
    size.extend([m, t / m, k]);
    x.view(size.as_slice()).mean_dim(-2, false, x.kind())
}

/// The Nyströmformer's iterative pseudo-inverse of the batched square matrices `a` (…, m, m),
/// `steps` iterations from Z₀ = Aᵀ/(‖A‖₁‖A‖_∞) (module docs).
pub fn iterative_pinv(a: &Tensor, steps: usize) -> Tensor {
    let m = a.size()[a.dim() - 1];
    let eye = Tensor::eye(m, (a.kind(), a.device()));
    let abs = a.abs();
    let col = abs.sum_dim_intlist(-2, false, a.kind()).amax(-1, true);
    let row = abs.sum_dim_intlist(-1, false, a.kind()).amax(-1, true);
    let mut z = a.transpose(-2, -1) / (col * row).unsqueeze(-1);
    for _ in 0..steps {
        let az = a.matmul(&z);
        let inner = &eye * 7.0 - &az;
        let inner = &eye * 15.0 - az.matmul(&inner);
        let inner = &eye * 13.0 - az.matmul(&inner);
        z = z.matmul(&inner) * 0.25;
    }
    z
}

/// Nyström attention of per-head Q, K, V (B×H×T×k) with score multiplier `scale`; the caller has
/// checked the config and the length. Returns B×H×T×k (without the convolution skip).
pub fn nystrom_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    cfg: &NystromConfig,
) -> Tensor {
    let m = cfg.landmarks as i64;
    let (q_l, k_l) = (segment_means(q, m), segment_means(k, m));
    let kind = q.kind();
    let f = (q.matmul(&k_l.transpose(-2, -1)) * scale).softmax(-1, kind);
    let a = (q_l.matmul(&k_l.transpose(-2, -1)) * scale).softmax(-1, kind);
    let b = (q_l.matmul(&k.transpose(-2, -1)) * scale).softmax(-1, kind);
    let a_plus = match cfg.pinv {
        Pinv::Exact => pinv_exact(&a),
        Pinv::Iterative { steps } => iterative_pinv(&a, steps),
    };
    f.matmul(&a_plus.matmul(&b.matmul(v)))
}

/// libtorch's SVD pseudo-inverse, computed in f64 for f32/bf16 inputs (LAPACK's SVD in half
/// precision is unavailable on the CPU) and cast back.
fn pinv_exact(a: &Tensor) -> Tensor {
    let kind = a.kind();
    let wide = if kind == Kind::Double {
        a.shallow_clone()
    } else {
        a.to_kind(Kind::Double)
    };
    wide.linalg_pinv(1e-15, false).to_kind(kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn f64s(shape: &[i64], seed: u64) -> Tensor {
        crate::seeded(seed, || Tensor::randn(shape, (Kind::Double, Device::Cpu)))
    }

    /// The iteration against the exact pseudo-inverse on a well-conditioned softmax kernel
    /// (diagonally dominant logits; an unstructured kernel converges far more slowly, see the
    /// module docs): it converges cubically, so after 12 steps it is at rounding here; after 1
    /// step it is not (the test would notice an iteration that does nothing).
    #[test]
    fn the_iteration_converges_to_the_pseudo_inverse() {
        let eye = Tensor::eye(8, (Kind::Double, Device::Cpu)) * 4.0;
        let a = (f64s(&[3, 8, 8], 1) * 0.5 + eye).softmax(-1, Kind::Double);
        let exact = pinv_exact(&a);
        let rel = |z: &Tensor| {
            let d: f64 = (z - &exact).norm().double_value(&[]);
            d / exact.norm().double_value(&[])
        };
        assert!(rel(&iterative_pinv(&a, 12)) < 1e-10);
        assert!(rel(&iterative_pinv(&a, 1)) > 1e-3);
    }

    #[test]
    fn segment_means_average_consecutive_tokens() {
        let x = Tensor::arange(12, (Kind::Double, Device::Cpu)).view([1, 6, 2]);
        let m = segment_means(&x, 3);
        let want = Tensor::from_slice(&[1.0, 2.0, 5.0, 6.0, 9.0, 10.0]).view([1, 3, 2]);
        assert!(m.equal(&want));
    }
}
