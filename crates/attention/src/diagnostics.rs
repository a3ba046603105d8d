//! Attention diagnostics that training logs: entropy per row, the largest logit, saturation, the
//! attention on the diagonal, and σ_max / σ_min / κ of each projection.
//!
//! # Why these numbers
//!
//! **Vanishing softmax gradient.** The softmax Jacobian of a row p is J = diag(p) − ppᵀ
//! (symmetric PSD, rows summing to 0), with ‖J‖_F² = Σ_i p_i² − 2 Σ_i p_i³ + (Σ_i p_i²)². For a
//! one-hot p every term cancels and J = 0: a saturated row passes no gradient to its scores.
//! This is the mechanism by which a DGram-constrained attention layer stalls and diverges once
//! its rows saturate (`docs/attention.md`, "Diagnostics"); `mean_softmax_jacobian_frobenius`
//! measures how close the rows are to it.
//!
//! **Collapse to the identity under λ·I_k.** With λ·I_k added to W_Q and W_K, the scores gain
//! λ² X[:, 0..k] X[:, 0..k]ᵀ plus cross terms; for LayerNorm-scaled tokens the diagonal term
//! λ²‖x_i[0..k]‖² dominates every off-diagonal one once λ is large (λ = 10 in the paper), so
//! each token attends to itself: mean diagonal probability → 1, entropy → 0, every row
//! saturated (`docs/attention.md`, "Diagnostics"). These numbers detect it.
//!
//! # Errors
//!
//! [`attention_diagnostics`] validates its inputs (an attention matrix has entries in [0, 1]),
//! and [`Forward::diagnostics`] returns its result rather than swallowing an error.

use kappa_linalg::input::{check_matrix, check_shape, InputError};
use kappa_linalg::Real;
use ndarray::ArrayView2;

use crate::attention::Forward;
use crate::error::{check_probabilities, Result};
use crate::scale::{singular_values_scaled, times_pow2_f64};

/// Row-wise statistics of an attention matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionDiagnostics {
    /// H_i = −Σ_j P[i, j] ln P[i, j] (nats; 0·ln 0 = 0) per row.
    pub entropy_per_row: Vec<f64>,
    /// The mean of `entropy_per_row`.
    pub mean_entropy: f64,
    /// The mean over rows of ln(#unmasked entries): the entropy of uniform attention.
    pub uniform_entropy: f64,
    /// The largest unmasked (scaled) score.
    pub max_logit: f64,
    /// The fraction of rows whose largest probability exceeds the threshold.
    pub saturated_fraction: f64,
    /// The threshold used for `saturated_fraction` (default 0.99).
    pub saturation_threshold: f64,
    /// The mean of P[i, i] over rows (1 for identity attention).
    pub mean_diagonal: f64,
    /// The mean over rows of ‖diag(p) − ppᵀ‖_F over the unmasked entries
    /// ([`softmax_jacobian_frobenius`]): 0 for one-hot rows, sqrt(n − 1)/n for uniform rows.
    pub mean_softmax_jacobian_frobenius: f64,
}

/// ‖diag(p) − ppᵀ‖_F of one probability row, in O(n) without forming the matrix:
/// ‖J‖_F² = Σ p_i² − 2 Σ p_i³ + (Σ p_i²)² (expand Σ_ij (δ_ij p_i − p_i p_j)²).
/// For uniform p over n entries it is sqrt(n − 1)/n; for one-hot p it is 0. For any
/// probability vector (entries in [0, 1] summing to 1) it lies in [0, 1): ‖J‖_F ≤ tr J =
/// 1 − Σ p_i² (J is PSD), and is finite.
///
/// A plain scalar helper: it does not validate p. An empty slice gives 0, a NaN entry gives
/// NaN, and entries far outside [0, 1] (|p_i| ≳ 1e102, where p_i³ overflows) may give NaN or
/// +∞; it never panics. [`attention_diagnostics`] validates its matrix before calling it.
///
/// ```
/// let u = kappa_attention::softmax_jacobian_frobenius(&[0.25; 4]);
/// assert!((u - 3f64.sqrt() / 4.0).abs() < 1e-15);
/// assert_eq!(kappa_attention::softmax_jacobian_frobenius(&[1.0, 0.0]), 0.0);
/// ```
pub fn softmax_jacobian_frobenius(p: &[f64]) -> f64 {
    let (s2, s3) = p
        .iter()
        .fold((0.0, 0.0), |(a, b), &x| (a + x * x, b + x * x * x));
    let sq = s2 - 2.0 * s3 + s2 * s2;
    // Clamp rounding below 0, but keep a NaN (f64::max would turn it into 0).
    if sq < 0.0 {
        0.0
    } else {
        sq.sqrt()
    }
}

/// The default saturation threshold: a row is saturated when > 99% of its mass is on one token.
pub const SATURATION_THRESHOLD: f64 = 0.99;

/// Diagnostics of an attention matrix `p` (N×M, rows summing to 1) and its scaled `scores`
/// (same shape); with `causal`, entries j > i are ignored for the largest logit and the uniform
/// entropy. `threshold` ∈ (0, 1] defines saturation.
///
/// Every field is finite: entropies in [0, ln M], fractions and the mean diagonal in [0, 1],
/// the largest logit as given.
///
/// Errors: `p` or `scores` empty or non-finite; `p` with an entry outside [0, 1] (argument
/// `p`); `scores` not of `p`'s shape; `threshold` outside (0, 1].
///
/// ```
/// use kappa_attention::{attention_diagnostics, softmax_rows};
/// let s = ndarray::array![[50.0, 0.0], [0.0, 0.0]];
/// let p = softmax_rows(s.view(), false)?;
/// let d = attention_diagnostics(p.view(), s.view(), false, 0.99)?;
/// assert_eq!(d.saturated_fraction, 0.5);
/// assert_eq!(d.max_logit, 50.0);
/// assert!((d.entropy_per_row[1] - 2f64.ln()).abs() < 1e-15);
/// # Ok::<(), kappa_attention::AttentionError>(())
/// ```
pub fn attention_diagnostics<A: Real>(
    p: ArrayView2<'_, A>,
    scores: ArrayView2<'_, A>,
    causal: bool,
    threshold: f64,
) -> Result<AttentionDiagnostics> {
    check_probabilities("p", &p)?;
    check_shape("scores", &scores, p.nrows(), p.ncols(), "the shape of p")?;
    if !(threshold > 0.0 && threshold <= 1.0) {
        return Err(InputError::invalid(
            "threshold",
            format!("must lie in (0, 1], found {threshold}"),
        )
        .into());
    }
    let n = p.nrows();
    let m = p.ncols();
    let mut entropy = Vec::with_capacity(n);
    let (mut max_logit, mut saturated, mut diag, mut uniform, mut jac) =
        (f64::NEG_INFINITY, 0usize, 0.0, 0.0, 0.0);
    let mut probs = Vec::with_capacity(m);
    for i in 0..n {
        let len = if causal { (i + 1).min(m) } else { m };
        let row = p.row(i);
        let mut h = 0.0;
        let mut pmax = 0.0f64;
        probs.clear();
        for j in 0..len {
            let x = row[j].to_f64_lossy();
            probs.push(x);
            if x > 0.0 {
                h -= x * x.ln();
            }
            pmax = pmax.max(x);
            max_logit = max_logit.max(scores[[i, j]].to_f64_lossy());
        }
        entropy.push(h.max(0.0));
        jac += softmax_jacobian_frobenius(&probs);
        saturated += usize::from(pmax > threshold);
        if i < m {
            diag += row[i].to_f64_lossy();
        }
        uniform += (len as f64).ln();
    }
    let nf = n as f64;
    Ok(AttentionDiagnostics {
        mean_entropy: entropy.iter().sum::<f64>() / nf,
        entropy_per_row: entropy,
        uniform_entropy: uniform / nf,
        max_logit,
        saturated_fraction: saturated as f64 / nf,
        saturation_threshold: threshold,
        mean_diagonal: diag / nf,
        mean_softmax_jacobian_frobenius: jac / nf,
    })
}

impl<A: Real> Forward<A> {
    /// [`attention_diagnostics`] of this forward pass with the default threshold 0.99.
    ///
    /// Errors: as [`attention_diagnostics`]. A forward pass only exists with finite scores and
    /// a P whose entries lie in [0, 1], so this returns `Ok` for every [`Forward`]; the error is
    /// passed on rather than hidden should that invariant ever break.
    pub fn diagnostics(&self) -> Result<AttentionDiagnostics> {
        attention_diagnostics(
            self.p.view(),
            self.scores.view(),
            self.causal,
            SATURATION_THRESHOLD,
        )
    }
}

/// σ_max, σ_min and κ of one projection matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProjectionStats {
    /// σ_max = ‖W‖₂.
    pub sigma_max: f64,
    /// σ_min, the min(D, k)-th singular value.
    pub sigma_min: f64,
    /// κ = σ_max/σ_min under kappa-linalg's rule (∞ when numerically rank-deficient).
    pub kappa: f64,
}

/// σ_max, σ_min and κ of a projection `w` (one SVD, singular values only).
///
/// Any finite scale works (the SVD is scaled as in [`crate::Kappa::of`]); σ beyond `f64::MAX`
/// is reported as +∞, κ stays exact.
///
/// Errors: `w` empty or non-finite; LAPACK failures.
///
/// ```
/// let s = kappa_attention::projection_stats(ndarray::array![[2.0, 0.0], [0.0, 0.5]].view())?;
/// assert_eq!((s.sigma_max, s.sigma_min, s.kappa), (2.0, 0.5, 4.0));
/// # Ok::<(), kappa_attention::AttentionError>(())
/// ```
pub fn projection_stats<A: Real>(w: ArrayView2<'_, A>) -> Result<ProjectionStats> {
    check_matrix("w", &w)?;
    let (s, e) = singular_values_scaled(w)?;
    let (m, n) = w.dim();
    let c = kappa_linalg::conditioning_from_singular_values(
        s.view(),
        m,
        n,
        kappa_linalg::RankTolerance::Numpy,
    )?;
    Ok(ProjectionStats {
        sigma_max: times_pow2_f64(c.sigma_max.to_f64_lossy(), e),
        sigma_min: times_pow2_f64(c.sigma_min.to_f64_lossy(), e),
        kappa: c.kappa.to_f64_lossy(),
    })
}
