#![doc = include_str!("../README.md")]
//!
//! # Principal items
//!
//! | module | items |
//! |---|---|
//! | [`attention`](mod@attention) | [`SelfAttention`] (one head), [`Forward`] (the forward cache), [`attention()`], [`AttentionOptions`], [`ScoreScale`] |
//! | [`jacobian`] | [`Forward::jacobian_weights`], [`Forward::jacobian_input`], `jvp_*`/`vjp_*`, [`WeightJacobian`], [`WeightSet`] |
//! | [`softmax`] | [`softmax_rows`], Λ: [`softmax_jacobian_dense`], [`softmax_jacobian_apply`], [`softmax_jacobian_singular_values`] |
//! | [`conditioning`] | [`theorem_3_4`], [`Theorem34`], [`JacobianConditioning`], [`Kappa`], [`full_rank_bound`] |
//! | [`correction`] | [`SvdCorrection`] (Thm 3.5), [`IdentityShift`] (Thm 3.8), [`LambdaPolicy`], [`rect_identity`], [`identity_shift_flops`] |
//! | [`multihead`] | [`MultiHeadAttention`], [`HeadLayout`] |
//! | [`diagnostics`] | [`attention_diagnostics`], [`AttentionDiagnostics`], [`projection_stats`] |
//! | [`error`] | [`AttentionError`], [`Result`] |
//!
//! # Conventions
//!
//! * Tokens are rows: X ∈ ℝ^{N×D}; weights W ∈ ℝ^{D×k}; A(X) = softmax_row(X W_Q W_Kᵀ Xᵀ / s) X W_V
//!   with s = 1 (the paper's form, the default) or √k.
//! * **Vectorization is column-major**, vec(A M B) = (Bᵀ ⊗ A) vec(M): the Jacobian row
//!   i + c·N is output entry A[i, c] and column d + e·D is W[d, e].
//! * κ follows kappa-linalg's rule: σ₁/σ_min(m,n) at full numerical rank, +∞ otherwise; κ⁺ is the
//!   pseudo condition number over the singular values above numpy's threshold.
//! * Every function validates its input and returns [`AttentionError`]; none panics on user
//!   input.

pub mod attention;
pub mod conditioning;
pub mod correction;
pub mod diagnostics;
pub mod error;
pub mod jacobian;
pub mod multihead;
pub mod softmax;

pub use attention::{attention, AttentionOptions, Forward, ScoreScale, SelfAttention};
pub use conditioning::{
    full_rank_bound, jacobian_singular_values, k_rank_bound, kappa_from_singular_values,
    theorem_3_4, JacobianConditioning, Kappa, Theorem34,
};
pub use correction::{
    block_identity, identity_shift_flops, rect_identity, Correction, IdentityShift, LambdaPolicy,
    ShiftFlops, SvdCorrection,
};
pub use diagnostics::{
    attention_diagnostics, projection_stats, softmax_jacobian_frobenius, AttentionDiagnostics,
    ProjectionStats, SATURATION_THRESHOLD,
};
pub use error::{AttentionError, Result};
pub use jacobian::{WeightJacobian, WeightSet};
pub use multihead::{HeadLayout, MultiHeadAttention};
pub use softmax::{
    softmax_jacobian_apply, softmax_jacobian_conditioning, softmax_jacobian_dense,
    softmax_jacobian_singular_values, softmax_row_jacobian, softmax_rows,
};
