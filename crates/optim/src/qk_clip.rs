//! QK-clip, the weight rescale of Kimi K2's MuonClip: after an optimizer step, every attention
//! head whose largest pre-softmax logit exceeded a threshold τ has its query and key weights
//! scaled down so that the same logit would be exactly τ.
//!
//! # The math
//!
//! Head h's logit of query token i and key token j is S^h_ij = s·(x_i W_Q^h)·(x_j W_K^h), s the
//! score factor (1/√k usually). It is bilinear in (W_Q^h, W_K^h): scaling W_Q^h by a and W_K^h
//! by b scales every S^h_ij by a·b. With S_h = max_ij S^h_ij over the step's batch and
//!
//! ```text
//! γ_h = τ / S_h  if S_h > τ,  else 1;     γ_Q^h = γ_h^α,   γ_K^h = γ_h^{1−α},   α ∈ [0, 1],
//! W_Q^h ← γ_Q^h·W_Q^h,   W_K^h ← γ_K^h·W_K^h,
//! ```
//!
//! the rescaled weights give S^h_ij·γ_h for the same inputs, so the largest is exactly τ
//! (Kimi: τ = 100, α = ½, which splits the shrink evenly between queries and keys). A bias
//! b_Q^h, b_K^h makes the projection affine, q = x W_Qᵀ + b_Q: scaling the bias by the same
//! factor keeps q ↦ γ_Q·q exact, so biases are scaled with their rows.
//!
//! # A fixed correction C (spectral conditioning)
//!
//! When the projection is q = x(W + C)ᵀ with a fixed, non-trainable C (kappa-models' λ·E shift
//! or its SVD correction), the logit is bilinear in the *effective* weights W + C, not in W:
//! scaling W alone by γ scales q by neither γ nor anything else fixed. The clip therefore acts
//! on the effective weight and writes the trainable one so that C stays as it is:
//!
//! ```text
//! W ← W + (γ − 1)·(W + C),   so that   W_new + C = γ·(W + C)   exactly (in real arithmetic).
//! ```
//!
//! With C = 0 this is Kimi's W ← γ·W. Rows whose factor is 1 are not touched at all. If C is
//! recomputed from W later (a scale-aware λ, an SVD correction), the effective weight changes
//! again at that refresh; the bound holds until then.
//!
//! # Layout
//!
//! [`clip_rows`] scales rows of any [`Matrix`] (`ndarray` or, with `tch`, a `Tensor` written in
//! place), so the caller picks the rows: for a fused (out × in) projection `[Q; K; V]` of
//! width D = H·k, head h's query rows are h·k..(h+1)·k and its key rows D + h·k..D + (h+1)·k
//! ([`fused_qkv_row_factors`]). Rows are scaled through [`Matrix::scale_columns`] of the
//! transpose ([`scale_rows`]), an O(1) view on both backends.

use kappa_linalg::input::InputError;
use kappa_linalg::Matrix;
use serde::{Deserialize, Serialize};

use crate::error::{from_linalg, Result};

/// The threshold and the split of QK-clip.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QkClipConfig {
    /// The largest allowed logit τ (> 0, finite; Kimi K2: 100).
    pub tau: f64,
    /// The share α of the shrink put on the queries, γ_Q = γ^α, γ_K = γ^{1−α} (in [0, 1];
    /// default ½).
    #[serde(default = "half")]
    pub alpha: f64,
}

fn half() -> f64 {
    0.5
}

impl Default for QkClipConfig {
    /// Kimi K2's settings: τ = 100, α = ½.
    fn default() -> Self {
        Self {
            tau: 100.0,
            alpha: 0.5,
        }
    }
}

/// The factors of one head: its query rows are multiplied by `query`, its key rows by `key`
/// (both 1 when the head is not clipped).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadFactors {
    /// γ_Q = γ^α.
    pub query: f64,
    /// γ_K = γ^{1−α}.
    pub key: f64,
}

impl HeadFactors {
    /// Both factors 1.
    pub const ONE: Self = Self {
        query: 1.0,
        key: 1.0,
    };

    /// Whether the head is rescaled.
    pub fn is_clipped(&self) -> bool {
        *self != Self::ONE
    }
}

impl QkClipConfig {
    /// Checks τ > 0 finite and α ∈ [0, 1].
    ///
    /// ```
    /// use kappa_optim::QkClipConfig;
    /// assert!(QkClipConfig::default().validate().is_ok());
    /// assert!(QkClipConfig { tau: 0.0, alpha: 0.5 }.validate().is_err());
    /// assert!(QkClipConfig { tau: 100.0, alpha: 1.5 }.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<()> {
        if !(self.tau.is_finite() && self.tau > 0.0) {
            return Err(InputError::invalid(
                "tau",
                format!("must be finite and > 0, found {}", self.tau),
            )
            .into());
        }
        if !(0.0..=1.0).contains(&self.alpha) {
            return Err(InputError::invalid(
                "alpha",
                format!("must lie in [0, 1], found {}", self.alpha),
            )
            .into());
        }
        Ok(())
    }

    /// The factors of one head with largest logit `s`: γ = τ/s when s > τ (γ_Q = γ^α,
    /// γ_K = γ^{1−α}, so γ_Q·γ_K = γ), [`HeadFactors::ONE`] otherwise.
    ///
    /// Errors: an invalid config ([`QkClipConfig::validate`]); `s` NaN or +∞ (no finite
    /// rescale brings it to τ).
    ///
    /// ```
    /// use kappa_optim::{HeadFactors, QkClipConfig};
    /// let clip = QkClipConfig { tau: 100.0, alpha: 0.5 };
    /// assert_eq!(clip.head_factors(80.0)?, HeadFactors::ONE);
    /// let f = clip.head_factors(400.0)?; // γ = 1/4
    /// assert_eq!((f.query, f.key), (0.5, 0.5));
    /// # Ok::<(), kappa_optim::OptimError>(())
    /// ```
    pub fn head_factors(&self, s: f64) -> Result<HeadFactors> {
        self.validate()?;
        if s.is_nan() || s == f64::INFINITY {
            return Err(InputError::invalid(
                "max_logits",
                format!("must be finite (or −∞ for an empty head), found {s}"),
            )
            .into());
        }
        if s <= self.tau {
            return Ok(HeadFactors::ONE);
        }
        let gamma = self.tau / s;
        Ok(HeadFactors {
            query: gamma.powf(self.alpha),
            key: gamma.powf(1.0 - self.alpha),
        })
    }

    /// [`QkClipConfig::head_factors`] of every head's largest logit.
    pub fn factors(&self, max_logits: &[f64]) -> Result<Vec<HeadFactors>> {
        max_logits.iter().map(|&s| self.head_factors(s)).collect()
    }
}

/// The row factors of a fused (out × in) projection `[Q; K; V]` with `heads.len()` heads of
/// `head_dim` rows each: `3·H·k` factors, γ_Q^h on the query rows of head h, γ_K^h on its key
/// rows, 1 on the value rows.
///
/// ```
/// use kappa_optim::{fused_qkv_row_factors, HeadFactors};
/// let f = [HeadFactors::ONE, HeadFactors { query: 0.5, key: 0.25 }];
/// assert_eq!(fused_qkv_row_factors(&f, 1), vec![1.0, 0.5, 1.0, 0.25, 1.0, 1.0]);
/// ```
pub fn fused_qkv_row_factors(heads: &[HeadFactors], head_dim: usize) -> Vec<f64> {
    let rows = |pick: fn(&HeadFactors) -> f64| {
        heads
            .iter()
            .flat_map(move |f| std::iter::repeat_n(pick(f), head_dim))
    };
    let values = std::iter::repeat_n(1.0, heads.len() * head_dim);
    rows(|f| f.query)
        .chain(rows(|f| f.key))
        .chain(values)
        .collect()
}

/// Row i of `m` multiplied by `s[i]` (diag(s)·m), through the transpose's column scaling.
/// On `tch` a shallow clone of a tensor passed here is scaled in place (the transposes are
/// views of the same storage).
///
/// Errors: `s.len()` ≠ rows (argument `s`).
pub fn scale_rows<M: Matrix>(m: M, s: &[f64]) -> Result<M> {
    let mut t = m.into_transpose();
    t.scale_columns(s).map_err(from_linalg)?;
    Ok(t.into_transpose())
}

/// QK-clip on row blocks of `w`, in place: W ← W + diag(g − 1)·(W + C) with g = `row_factors`
/// and C = `correction`, so that the effective weight W + C becomes diag(g)·(W + C) and C is
/// unchanged. Without a correction this is Kimi's W ← diag(g)·W, one rounding per entry, and
/// rows with factor 1 are left bit for bit; with one, each changed entry is rounded three times
/// (W + C, the product, the sum) and rows with factor 1 keep their values (0·(W + C) is added).
/// Nothing is computed when every factor is 1.
///
/// Errors: `row_factors.len()` ≠ rows of `w` (argument `s`); a correction of another shape
/// (argument `x`), kind or device.
///
/// ```
/// use kappa_optim::clip_rows;
/// let mut w = ndarray::array![[1.0, 2.0], [3.0, 4.0]];
/// let c = ndarray::array![[10.0, 0.0], [0.0, 10.0]];
/// clip_rows(&mut w, Some(&c), &[0.5, 1.0])?;
/// // Row 0: W + C = [11, 2] becomes [5.5, 1], so W = [−4.5, 1]; row 1 is untouched.
/// assert_eq!(w, ndarray::array![[-4.5, 1.0], [3.0, 4.0]]);
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
pub fn clip_rows<M: Matrix>(w: &mut M, correction: Option<&M>, row_factors: &[f64]) -> Result<()> {
    let (rows, _) = w.shape();
    if row_factors.len() != rows {
        return Err(InputError::shape_mismatch(
            "s",
            format!("{rows} row factors"),
            format!("{}", row_factors.len()),
        )
        .into());
    }
    if row_factors.iter().all(|&g| g == 1.0) {
        return Ok(());
    }
    let Some(c) = correction else {
        let scaled = scale_rows(w.duplicate().map_err(from_linalg)?, row_factors)?;
        return w.copy_from(&scaled).map_err(from_linalg);
    };
    let mut effective = w.duplicate().map_err(from_linalg)?;
    effective.axpy(1.0, c).map_err(from_linalg)?;
    let delta: Vec<f64> = row_factors.iter().map(|g| g - 1.0).collect();
    let step = scale_rows(effective, &delta)?;
    w.axpy(1.0, &step).map_err(from_linalg)
}
