//! Single-head softmax self-attention on `ndarray`, with the spectral-conditioning corrections
//! applied as fixed additive terms, and the forward cache that the Jacobians are built from.
//!
//! # Math
//!
//! Tokens are rows: X ∈ ℝ^{N×D}. With W_Q, W_K, W_V ∈ ℝ^{D×k} and a score scale s > 0,
//!
//! Q = X W_Q, K = X W_K, V = X W_V, S = Q Kᵀ / s, P = softmax_row(S), A(X) = P V ∈ ℝ^{N×k}.
//!
//! The paper writes s = 1 ([`ScoreScale::One`], the default here); transformers use s = √k
//! ([`ScoreScale::InvSqrtK`]). Folding 1/s into W_Q leaves every κ unchanged, but not the size
//! of a λ·I_k correction relative to the weights. With a causal mask, P[i, j] = 0 for j > i.
//!
//! A correction C (see [`crate::correction`]) is a constant: the corrected block computes
//! A(X) with W_• + C_• in place of W_•. Gradients with respect to W are the plain attention's
//! gradients evaluated at W + C, and no parameter is added. The λ·I_k correction is applied
//! without forming W + λ I_k: X (W + λ E) = X W + λ X[:, offset..offset + k].

use kappa_linalg::input::{check_matrix, check_positive, check_shape, shape_str, InputError};
use kappa_linalg::product::{mat_mul_into, sequential, PARALLEL_MIN_MULS};
use kappa_linalg::Real;
use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, Axis};

use crate::correction::{Correction, IdentityShift, SvdCorrection};
use crate::error::{check_computed, AttentionError, Result};
use crate::softmax::softmax_in_place;

/// The score scale s in S = X W_Q W_Kᵀ Xᵀ / s.
///
/// With the `serde` feature it is written `"one"`, `"inv_sqrt_k"` or `{ custom = s }` (TOML:
/// `scale = "inv_sqrt_k"`, `scale = { custom = 2.0 }`); a custom s is checked where it is used
/// ([`ScoreScale::divisor`]), not when it is read.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum ScoreScale {
    /// s = 1, as the paper writes attention (the default).
    #[default]
    One,
    /// s = √k (k the head dimension), as transformers compute it.
    InvSqrtK,
    /// Any s > 0.
    Custom(f64),
}

impl ScoreScale {
    /// The divisor s for head dimension `k`, in f64.
    ///
    /// Errors: [`InputError::InvalidArgument`] (argument `scale`) for a custom s that is not
    /// finite and > 0; (argument `k`) for `InvSqrtK` with k = 0.
    pub fn divisor(self, k: usize) -> Result<f64> {
        match self {
            ScoreScale::One => Ok(1.0),
            ScoreScale::InvSqrtK if k == 0 => {
                Err(InputError::invalid("k", "the head dimension must be ≥ 1 for s = √k").into())
            }
            ScoreScale::InvSqrtK => Ok((k as f64).sqrt()),
            ScoreScale::Custom(s) => {
                check_positive("scale", s)?;
                Ok(s)
            }
        }
    }

    /// The divisor s in the precision `A` the scores are computed in: as
    /// [`ScoreScale::divisor`], and s rounded to `A` must be a finite *normal* number, so that
    /// neither s nor 1/s (used by the Jacobians) rounds to 0 or ∞. For f32 this refuses custom
    /// s outside about [1.2e-38, 3.4e38] (e.g. 1e-300, which f32 rounds to 0).
    ///
    /// Errors: as [`ScoreScale::divisor`]; [`InputError::InvalidArgument`] (argument
    /// `scale`) when s is not a normal number of `A`.
    pub fn divisor_in<A: Real>(self, k: usize) -> Result<A> {
        let s = self.divisor(k)?;
        let sa = A::from_f64_lossy(s);
        let inv = A::one() / sa;
        if sa.is_normal() && inv.is_finite() && inv != A::zero() {
            Ok(sa)
        } else {
            Err(InputError::invalid(
                "scale",
                format!(
                    "s = {s:e} is {sa:e} in {}: s must be a finite normal number there",
                    A::NAME
                ),
            )
            .into())
        }
    }
}

/// How a head computes its scores.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AttentionOptions {
    /// The score scale s (default: s = 1, the paper's form).
    pub scale: ScoreScale,
    /// Mask entries (i, j) with j > i (default: no mask).
    pub causal: bool,
}

/// One head of softmax self-attention with weights W_Q, W_K, W_V ∈ ℝ^{D×k} and an optional fixed
/// correction.
///
/// ```
/// use kappa_attention::{AttentionOptions, IdentityShift, SelfAttention};
/// use ndarray::Array2;
/// let (n, d, k) = (4, 6, 2);
/// let x = Array2::from_shape_fn((n, d), |(i, j)| ((i * d + j) as f64 * 0.7).sin());
/// let w = |o: f64| Array2::from_shape_fn((d, k), |(i, j)| ((i * k + j) as f64 + o).cos() * 0.3);
/// let head = SelfAttention::new(w(0.0), w(1.0), w(2.0), AttentionOptions::default())?;
/// let a = head.forward(x.view())?;
/// assert_eq!(a.output().dim(), (n, k));
/// // The same head with λ·I_k added to each projection (never forms W + λ I_k).
/// let shifted = head.clone().with_identity_shift(IdentityShift::new(1.0)?)?;
/// assert_eq!(shifted.parameter_count(), head.parameter_count());
/// # Ok::<(), kappa_attention::AttentionError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SelfAttention<A> {
    wq: Array2<A>,
    wk: Array2<A>,
    wv: Array2<A>,
    options: AttentionOptions,
    correction: Correction<A>,
}

impl<A: Real> SelfAttention<A> {
    /// A head with the given weights (all D×k, k ≥ 1, D ≥ 1) and options, without correction.
    ///
    /// Errors: any weight empty or non-finite (argument `wq`, `wk` or `wv`); `wk` or `wv` of a
    /// shape other than `wq`'s; an invalid custom scale.
    pub fn new(
        wq: Array2<A>,
        wk: Array2<A>,
        wv: Array2<A>,
        options: AttentionOptions,
    ) -> Result<Self> {
        check_matrix("wq", &wq.view())?;
        let (d, k) = wq.dim();
        check_shape("wk", &wk.view(), d, k, "the shape of wq")?;
        check_shape("wv", &wv.view(), d, k, "the shape of wq")?;
        options.scale.divisor_in::<A>(k)?;
        Ok(Self {
            wq,
            wk,
            wv,
            options,
            correction: Correction::None,
        })
    }

    /// The same head with λ·E added to each of W_Q, W_K, W_V (Theorem 3.8; E the D×k block
    /// identity at the shift's row offset), applied as X W + λ X[:, offset..offset + k].
    ///
    /// Errors: [`InputError::InvalidArgument`] (argument `shift`) when offset + k > D
    /// (checked without overflow, so any offset is safe) or λ is not finite in `A` (e.g. 1e300
    /// for f32); [`AttentionError::Overflow`] (argument `shift`) when W + λE overflows `A`.
    pub fn with_identity_shift(mut self, shift: IdentityShift) -> Result<Self> {
        let (d, k) = self.dims();
        shift.check_fits(d, k)?;
        shift.lambda_in::<A>("shift")?;
        self.correction = Correction::Shift(shift);
        self.check_effective("shift")?;
        Ok(self)
    }

    /// Checks that the effective weights W + C are finite (`arg` names the correction).
    fn check_effective(&self, arg: &'static str) -> Result<()> {
        for w in self.effective_weights() {
            check_computed(arg, &w.view(), "the corrected weights W + C")?;
        }
        Ok(())
    }

    /// The same head with Theorem 3.5's SVD correction C_• = σ_max(W_•) U_• V_•ᵀ added to each
    /// projection, computed from the current weights (so κ(W_• + C_•) = 2σ_max/(σ_max + σ_min)
    /// ≤ 2).
    ///
    /// Errors: [`AttentionError::Overflow`] (argument `self`) when σ_max or W + C overflows the
    /// element type (weights within a factor 2√(Dk) of its largest value); LAPACK failures.
    pub fn with_svd_correction(mut self) -> Result<Self> {
        let rename = |e: AttentionError| match e {
            AttentionError::Overflow { reason, .. } => AttentionError::Overflow {
                arg: "self",
                reason,
            },
            other => other,
        };
        let c = [
            SvdCorrection::new(self.wq.view()).map_err(rename)?,
            SvdCorrection::new(self.wk.view()).map_err(rename)?,
            SvdCorrection::new(self.wv.view()).map_err(rename)?,
        ];
        self.correction = Correction::Svd(Box::new(c));
        self.check_effective("self")?;
        Ok(self)
    }

    /// The head without its correction.
    pub fn without_correction(mut self) -> Self {
        self.correction = Correction::None;
        self
    }

    /// The correction in use.
    pub fn correction(&self) -> &Correction<A> {
        &self.correction
    }

    /// (D, k).
    pub fn dims(&self) -> (usize, usize) {
        self.wq.dim()
    }

    /// The options.
    pub fn options(&self) -> AttentionOptions {
        self.options
    }

    /// The trainable weights (W_Q, W_K, W_V), without correction.
    pub fn weights(&self) -> (ArrayView2<'_, A>, ArrayView2<'_, A>, ArrayView2<'_, A>) {
        (self.wq.view(), self.wk.view(), self.wv.view())
    }

    /// The number of trainable parameters, 3·D·k. A correction is a constant and adds none.
    pub fn parameter_count(&self) -> usize {
        3 * self.wq.len()
    }

    /// The weights the head effectively computes with, materialized: (W_Q + C_Q, W_K + C_K,
    /// W_V + C_V) (the plain weights without a correction).
    pub fn effective_weights(&self) -> [Array2<A>; 3] {
        [
            self.correction.apply(0, &self.wq),
            self.correction.apply(1, &self.wk),
            self.correction.apply(2, &self.wv),
        ]
    }

    /// The divisor s of the scores (validated in `A`'s precision by [`SelfAttention::new`]).
    pub fn score_divisor(&self) -> A {
        // `new` checked that `divisor_in` succeeds, so the fallback is never taken.
        self.options
            .scale
            .divisor_in(self.dims().1)
            .unwrap_or_else(|_| A::one())
    }

    /// The forward pass on tokens `x` (N×D, one token per row), keeping what the Jacobians need.
    ///
    /// Softmax is computed stably (each row shifted by its largest score), so every finite
    /// score matrix gives rows of P that sum to 1. What cannot be computed is a score or a
    /// projection whose magnitude exceeds the element type's range: then the forward pass
    /// refuses rather than return NaN.
    ///
    /// Errors: `x` empty or non-finite; `x` without D columns; [`AttentionError::Overflow`]
    /// (argument `x`) when Q, K, V, any score Q Kᵀ/s (masked ones included) or the output P V
    /// is not finite although `x` and the weights are (for example |x| ~ 1e160 with unit
    /// weights in f64, or |x| ~ 1e20 in f32).
    pub fn forward(&self, x: ArrayView2<'_, A>) -> Result<Forward<A>> {
        check_matrix("x", &x)?;
        let (d, k) = self.dims();
        if x.ncols() != d {
            return Err(InputError::shape_mismatch(
                "x",
                format!("D = {d} columns, to match the weights' {d} rows"),
                shape_str(x.nrows(), x.ncols()),
            )
            .into());
        }
        let (n, s) = (x.nrows(), self.score_divisor());
        let weights = self.effective_weights();
        let [mut q, mut kk, mut v, mut output] = [(); 4].map(|_| Array2::<A>::zeros((n, k)));
        let mut scores = Array2::<A>::zeros((n, n));
        let mut p = Array2::<A>::zeros((n, n));
        let out = AttendOut {
            scores: scores.view_mut(),
            p: p.view_mut(),
            output: output.view_mut(),
        };
        let causal = self.options.causal;
        let big = n.saturating_mul(n).saturating_mul(k) >= PARALLEL_MIN_MULS;
        if big && rayon::current_num_threads() > 1 {
            // Rows in two halves on two rayon tasks, each task's products on its own thread,
            // in one entry into the pool (as the weight VJP): Q, K and V by rows of X, then,
            // with K and V whole, the scores, P and the output by rows of Q. Every entry is the
            // same sum in the same order as on one thread.
            let half = n / 2;
            rayon::scope(|_| {
                let (x_top, x_bottom) = x.split_at(Axis(0), half);
                let [(q_top, q_bottom), (k_top, k_bottom), (v_top, v_bottom)] =
                    [&mut q, &mut kk, &mut v].map(|a| a.view_mut().split_at(Axis(0), half));
                rayon::join(
                    || sequential(|| self.project_rows(x_top, &weights, [q_top, k_top, v_top])),
                    || {
                        let rows = [q_bottom, k_bottom, v_bottom];
                        sequential(|| self.project_rows(x_bottom, &weights, rows))
                    },
                );
                let kv = (kk.view(), v.view());
                let (q_top, q_bottom) = q.view().split_at(Axis(0), half);
                let (out_top, out_bottom) = out.split_at(half);
                rayon::join(
                    || sequential(|| attend_rows(q_top, 0, kv, s, causal, out_top)),
                    || sequential(|| attend_rows(q_bottom, half, kv, s, causal, out_bottom)),
                );
            });
        } else {
            self.project_rows(x, &weights, [q.view_mut(), kk.view_mut(), v.view_mut()]);
            attend_rows(q.view(), 0, (kk.view(), v.view()), s, causal, out);
        }
        check_computed("x", &q.view(), "the queries Q = X W_Q")?;
        check_computed("x", &kk.view(), "the keys K = X W_K")?;
        check_computed("x", &v.view(), "the values V = X W_V")?;
        check_computed("x", &scores.view(), "the scores Q Kᵀ/s")?;
        check_computed("x", &output.view(), "the output P V")?;
        let [wq, wk, wv] = weights;
        Ok(Forward {
            x: x.to_owned(),
            wq,
            wk,
            wv,
            q,
            k: kk,
            v,
            scores,
            p,
            output,
            s,
            causal,
        })
    }

    /// Rows of Q, K and V: X_rows W_• (+ the correction), into `out`.
    fn project_rows(
        &self,
        x: ArrayView2<'_, A>,
        effective: &[Array2<A>; 3],
        out: [ArrayViewMut2<'_, A>; 3],
    ) {
        for (which, out) in out.into_iter().enumerate() {
            self.project_into(x, which, &effective[which], out);
        }
    }

    /// X W_• (+ the correction) into `out`, without materializing W + λ I_k for the identity
    /// shift; `effective` is W_• + C_• (the product for the SVD correction).
    fn project_into(
        &self,
        x: ArrayView2<'_, A>,
        which: usize,
        effective: &Array2<A>,
        mut out: ArrayViewMut2<'_, A>,
    ) {
        let (one, zero) = (A::one(), A::zero());
        let w = [&self.wq, &self.wk, &self.wv][which];
        match &self.correction {
            Correction::None => mat_mul_into(one, &x, w, zero, &mut out),
            Correction::Shift(shift) => {
                // `with_identity_shift` checked offset + k ≤ D.
                let k = w.ncols();
                let lambda = A::from_f64_lossy(shift.lambda());
                mat_mul_into(one, &x, w, zero, &mut out);
                let off = shift.offset();
                out.scaled_add(lambda, &x.slice(s![.., off..off + k]));
            }
            Correction::Svd(_) => mat_mul_into(one, &x, effective, zero, &mut out),
        }
    }
}

/// The rows of the scores, P and the output that one call of [`attend_rows`] writes.
struct AttendOut<'a, A> {
    scores: ArrayViewMut2<'a, A>,
    p: ArrayViewMut2<'a, A>,
    output: ArrayViewMut2<'a, A>,
}

impl<'a, A> AttendOut<'a, A> {
    /// Rows [0, mid) and [mid, N).
    fn split_at(self, mid: usize) -> (Self, Self) {
        let (scores, p, output) = (
            self.scores.split_at(Axis(0), mid),
            self.p.split_at(Axis(0), mid),
            self.output.split_at(Axis(0), mid),
        );
        let top = AttendOut {
            scores: scores.0,
            p: p.0,
            output: output.0,
        };
        let bottom = AttendOut {
            scores: scores.1,
            p: p.1,
            output: output.1,
        };
        (top, bottom)
    }
}

/// For rows `q` of Q (row `first_row` first, for the causal mask) and K, V whole: the scores
/// S = Q Kᵀ/s, P = their row softmax and the output A = P V.
fn attend_rows<A: Real>(
    q: ArrayView2<'_, A>,
    first_row: usize,
    (k, v): (ArrayView2<'_, A>, ArrayView2<'_, A>),
    s: A,
    causal: bool,
    out: AttendOut<'_, A>,
) {
    let AttendOut {
        mut scores,
        mut p,
        mut output,
    } = out;
    // 1/s as the product's α: no pass of divisions (the same bits as Q Kᵀ/s when s is a power
    // of two, as √k for k = 4, 16, 64, 256).
    mat_mul_into(A::one() / s, &q, &k.t(), A::zero(), &mut scores);
    p.assign(&scores);
    softmax_in_place(p.view_mut(), first_row, causal);
    mat_mul_into(A::one(), &p, &v, A::zero(), &mut output);
}

/// A(X) = softmax(X W_Q W_Kᵀ Xᵀ / s) X W_V for one head, without keeping the forward cache.
///
/// Errors: as [`SelfAttention::new`] and [`SelfAttention::forward`].
///
/// ```
/// use kappa_attention::{attention, AttentionOptions};
/// let x = ndarray::array![[1.0, 0.0], [0.0, 1.0]];
/// let w = ndarray::array![[1.0], [0.0]];
/// let a = attention(x.view(), w.view(), w.view(), w.view(), AttentionOptions::default())?;
/// // Scores [[1, 0], [0, 0]]: row 0 attends e/(1+e) to token 0, row 1 uniformly.
/// let e = 1f64.exp();
/// assert!((a[[0, 0]] - e / (1.0 + e)).abs() < 1e-15 && (a[[1, 0]] - 0.5).abs() < 1e-15);
/// # Ok::<(), kappa_attention::AttentionError>(())
/// ```
pub fn attention<A: Real>(
    x: ArrayView2<'_, A>,
    wq: ArrayView2<'_, A>,
    wk: ArrayView2<'_, A>,
    wv: ArrayView2<'_, A>,
    options: AttentionOptions,
) -> Result<Array2<A>> {
    let head = SelfAttention::new(wq.to_owned(), wk.to_owned(), wv.to_owned(), options)?;
    Ok(head.forward(x)?.output)
}

/// The result of a forward pass and everything the Jacobians are built from.
///
/// The weights stored here are the *effective* ones (W + C), because a fixed correction makes the
/// Jacobian with respect to W equal to the plain attention's Jacobian at W + C. The Jacobians are
/// methods of this type (see [`crate::jacobian`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Forward<A> {
    pub(crate) x: Array2<A>,
    pub(crate) wq: Array2<A>,
    pub(crate) wk: Array2<A>,
    pub(crate) wv: Array2<A>,
    pub(crate) q: Array2<A>,
    pub(crate) k: Array2<A>,
    pub(crate) v: Array2<A>,
    pub(crate) scores: Array2<A>,
    pub(crate) p: Array2<A>,
    pub(crate) output: Array2<A>,
    pub(crate) s: A,
    pub(crate) causal: bool,
}

impl<A: Real> Forward<A> {
    /// A(X) = P V, N×k.
    pub fn output(&self) -> ArrayView2<'_, A> {
        self.output.view()
    }
    /// The attention matrix P = softmax_row(S), N×N.
    pub fn attention_matrix(&self) -> ArrayView2<'_, A> {
        self.p.view()
    }
    /// The scaled scores S = Q Kᵀ / s, N×N (masked entries keep their raw value; P is 0 there).
    pub fn scores(&self) -> ArrayView2<'_, A> {
        self.scores.view()
    }
    /// The tokens X, N×D.
    pub fn tokens(&self) -> ArrayView2<'_, A> {
        self.x.view()
    }
    /// Q = X (W_Q + C_Q), N×k.
    pub fn queries(&self) -> ArrayView2<'_, A> {
        self.q.view()
    }
    /// K = X (W_K + C_K), N×k.
    pub fn keys(&self) -> ArrayView2<'_, A> {
        self.k.view()
    }
    /// V = X (W_V + C_V), N×k.
    pub fn values(&self) -> ArrayView2<'_, A> {
        self.v.view()
    }
    /// The effective weights (W_Q + C_Q, W_K + C_K, W_V + C_V), each D×k.
    pub fn effective_weights(&self) -> (ArrayView2<'_, A>, ArrayView2<'_, A>, ArrayView2<'_, A>) {
        (self.wq.view(), self.wk.view(), self.wv.view())
    }
    /// The score divisor s.
    pub fn score_divisor(&self) -> A {
        self.s
    }
    /// Whether the causal mask was applied.
    pub fn is_causal(&self) -> bool {
        self.causal
    }
    /// (N, D, k).
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.x.nrows(), self.x.ncols(), self.wq.ncols())
    }
}
