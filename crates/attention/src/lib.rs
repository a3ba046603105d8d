#![doc = include_str!("../README.md")]
//!
//! # Principal items
//!
//! | module | items |
//! |---|---|
//! | [`attention`](mod@attention) | [`SelfAttention`] (one head), [`Forward`] (the forward cache), [`attention()`], [`AttentionOptions`], [`ScoreScale`] |
//! | [`jacobian`] | [`Forward::jacobian_weights`], [`JacobianWorkspace`] (reused blocks, threads), [`Forward::jacobian_input`], `jvp_*`/`vjp_*`, [`WeightJacobian`], [`WeightSet`] |
//! | [`softmax`] | [`softmax_rows`], Λ: [`softmax_jacobian_dense`], [`softmax_jacobian_apply`], [`softmax_jacobian_singular_values`] |
//! | [`conditioning`] | [`theorem_3_4`], [`Theorem34`], [`JacobianConditioning`], [`Kappa`], [`full_rank_bound`] |
//! | [`correction`] | [`SvdCorrection`] (Thm 3.5), [`IdentityShift`] (Thm 3.8), [`LambdaPolicy`], [`rect_identity`], [`identity_shift_flops`] |
//! | [`multihead`] | [`MultiHeadAttention`], [`HeadLayout`] |
//! | [`diagnostics`] | [`attention_diagnostics`], [`AttentionDiagnostics`], [`projection_stats`] |
//! | [`instances`] | [`Theorem34Instance`] (random instances of Theorem 3.4, as the tests and the `theory` experiment draw them), [`TokenRegime`] |
//! | [`error`] | [`AttentionError`], [`Result`]; bad input is [`AttentionError::Input`], carrying kappa-linalg's [`InputError`] (re-exported) |
//!
//! # Conventions
//!
//! * Tokens are rows: X ∈ ℝ^{N×D}; weights W ∈ ℝ^{D×k}; A(X) = softmax_row(X W_Q W_Kᵀ Xᵀ / s) X W_V
//!   with s = 1 (the paper's form, the default) or √k.
//! * **Vectorization is column-major**, vec(A M B) = (Bᵀ ⊗ A) vec(M): the Jacobian row
//!   i + c·N is output entry A[i, c] and column d + e·D is W[d, e].
//! * κ follows kappa-linalg's rule: σ₁/σ_min(m,n) at full numerical rank, +∞ otherwise; κ⁺ is the
//!   pseudo condition number over the singular values above numpy's threshold.
//!
//! # Features
//!
//! * `serde`: `Serialize`/`Deserialize` for the config-like types [`ScoreScale`]
//!   (`"one"`, `"inv_sqrt_k"`, `{ custom = s }`), [`AttentionOptions`], [`HeadLayout`]
//!   (`"same_block"`, `"shifted"`) and [`LambdaPolicy`], in snake_case.
//! * `openblas-system` (default): LAPACK from the system OpenBLAS, through kappa-linalg.
//!
//! # Error contract
//!
//! Every public function validates its input and returns [`AttentionError`] or a documented
//! value; none panics, hangs or aborts on user input. Each error names the argument it is about:
//! bad input is [`AttentionError::Input`], carrying kappa-linalg's [`InputError`] — empty or
//! non-finite matrices ([`InputError::Empty`], [`InputError::NonFinite`]), shapes
//! ([`InputError::ShapeMismatch`]), parameters out of their domain
//! ([`InputError::InvalidArgument`]: λ, the score scale, offsets (checked without overflow), an
//! attention matrix with entries outside [0, 1], …) —; dense results above
//! [`kappa_linalg::MAX_DENSE_ENTRIES`] refused before allocating ([`AttentionError::TooLarge`]),
//! and finite inputs whose result is not representable ([`AttentionError::Overflow`]).
//! Parameters are validated in the precision they are used in: `ScoreScale::Custom(1e-300)` is
//! refused for an f32 head (it rounds to 0) but accepted for f64. Size helpers
//! ([`k_rank_bound`], [`full_rank_bound`], [`identity_shift_flops`]) are defined for every input
//! (saturating, 0 for an empty size). `docs/attention.md` ("Error contract") has the full table;
//! `tests/bad_input.rs` checks it over every entry point.
//!
//! # Scale behaviour
//!
//! Softmax is computed stably, so every finite score matrix gives probability rows. The scores
//! grow like |x|²|w|²: the forward pass refuses (with `Overflow` naming `x`) when Q, K, V, a
//! score or the output is not finite, instead of returning a NaN P. SVD-based quantities (κ,
//! σ, the SVD correction, the λ policies) and the matrix-free products are evaluated on inputs
//! scaled by an exact power of two, so they work across the whole finite range; κ is scale
//! invariant and comes out as for a unit-scale matrix (`docs/attention.md`, "Scale behaviour").

pub mod attention;
pub mod conditioning;
pub mod correction;
pub mod diagnostics;
pub mod error;
pub mod instances;
pub mod jacobian;
pub mod multihead;
mod scale;
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
pub use instances::{Theorem34Instance, TokenRegime};
pub use jacobian::{JacobianWorkspace, WeightJacobian, WeightSet};
/// kappa-linalg's input error, the payload of the `Input` variant of this crate's error.
pub use kappa_linalg::input::InputError;
pub use multihead::{HeadLayout, MultiHeadAttention};
pub use softmax::{
    softmax_jacobian_apply, softmax_jacobian_conditioning, softmax_jacobian_dense,
    softmax_jacobian_singular_values, softmax_row_jacobian, softmax_rows,
};
