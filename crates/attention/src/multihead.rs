//! Multi-head attention as H independent heads over fused projections, with both per-head
//! layouts of the λ·I_k correction.
//!
//! # Layout
//!
//! The fused weights are W_Q, W_K, W_V ∈ ℝ^{D×Hk}; head h uses columns h·k..(h+1)·k. The output
//! is the concatenation [A_1 … A_H] ∈ ℝ^{N×Hk} (no output projection: it does not enter the
//! theory).
//!
//! # Where λ·I_k goes ([`HeadLayout`])
//!
//! The paper's theory is single-head and does not say how I_k is laid out across heads. Both
//! readings are implemented:
//!
//! * [`HeadLayout::SameBlock`]: every head gets W^h + λ I_k, so every head adds λ·X[:, 0..k].
//! * [`HeadLayout::Shifted`]: head h gets W^h + λ E_h with E_h's identity block at rows
//!   h·k..(h+1)·k, i.e. the fused projection gets λ I_{D×Hk} (the natural drop-in for a fused
//!   qkv layer: Q = X W_Q + λ X[:, 0..Hk]). Requires Hk ≤ D.
//!
//! Every κ statement transfers between the two: a row permutation Π maps E_h onto I_k and
//! κ(Π M) = κ(M) (T12).

use kappa_linalg::input::{check_matrix, check_shape, InputError};
use kappa_linalg::Real;
use ndarray::{concatenate, s, Array2, ArrayView2, Axis};

use crate::attention::{AttentionOptions, SelfAttention};
use crate::correction::IdentityShift;
use crate::error::{check_computed, AttentionError, Result};

/// Where head h's λ·I_k block sits (see the module docs). With the `serde` feature it is written
/// `"same_block"` or `"shifted"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum HeadLayout {
    /// Every head adds λ·X[:, 0..k].
    #[default]
    SameBlock,
    /// Head h adds λ·X[:, h·k..(h+1)·k] (the fused λ·I_{D×Hk}).
    Shifted,
}

impl HeadLayout {
    /// The row offset of head `h`'s identity block for head dimension `k` (h·k for
    /// `Shifted`). Defined for every input: h·k saturates at `usize::MAX` instead of wrapping,
    /// an offset at which no block fits (an [`IdentityShift`] at it is refused when applied).
    pub fn offset(self, h: usize, k: usize) -> usize {
        match self {
            HeadLayout::SameBlock => 0,
            HeadLayout::Shifted => h.saturating_mul(k),
        }
    }
}

/// H heads of softmax self-attention over fused D×Hk projections, optionally with λ·I_k in a
/// [`HeadLayout`].
///
/// ```
/// use kappa_attention::{AttentionOptions, HeadLayout, MultiHeadAttention};
/// use ndarray::Array2;
/// let (n, d, heads) = (5, 8, 2);
/// let w = |o: f64| Array2::from_shape_fn((d, d), |(i, j)| ((i * d + j) as f64 + o).sin() * 0.1);
/// let x = Array2::from_shape_fn((n, d), |(i, j)| ((i + j) as f64).cos());
/// let mha = MultiHeadAttention::new(w(0.0), w(1.0), w(2.0), heads, AttentionOptions::default())?
///     .with_identity_shift(10.0, HeadLayout::Shifted)?;
/// assert_eq!(mha.forward(x.view())?.dim(), (n, d));
/// # Ok::<(), kappa_attention::AttentionError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MultiHeadAttention<A> {
    wq: Array2<A>,
    wk: Array2<A>,
    wv: Array2<A>,
    heads: usize,
    options: AttentionOptions,
    shift: Option<(f64, HeadLayout)>,
}

impl<A: Real> MultiHeadAttention<A> {
    /// H = `heads` heads over fused weights (each D×Hk).
    ///
    /// Errors: weights empty or non-finite, or of different shapes; `heads` zero or not dividing
    /// the number of columns (argument `heads`); an invalid custom scale.
    pub fn new(
        wq: Array2<A>,
        wk: Array2<A>,
        wv: Array2<A>,
        heads: usize,
        options: AttentionOptions,
    ) -> Result<Self> {
        check_matrix("wq", &wq.view())?;
        let (d, hk) = wq.dim();
        check_shape("wk", &wk.view(), d, hk, "the shape of wq")?;
        check_shape("wv", &wv.view(), d, hk, "the shape of wq")?;
        if heads == 0 || hk % heads != 0 {
            return Err(InputError::invalid(
                "heads",
                format!("must be ≥ 1 and divide the {hk} columns of the weights"),
            )
            .into());
        }
        options.scale.divisor_in::<A>(hk / heads)?;
        Ok(Self {
            wq,
            wk,
            wv,
            heads,
            options,
            shift: None,
        })
    }

    /// Adds λ·I_k to every head's three projections in the given layout.
    ///
    /// Errors: λ not finite or negative, or not finite in `A` (argument `lambda`); `Shifted`
    /// with Hk > D, or k > D (argument `layout`); [`AttentionError::Overflow`] (argument
    /// `lambda`) when a corrected weight W + λE overflows `A`.
    pub fn with_identity_shift(mut self, lambda: f64, layout: HeadLayout) -> Result<Self> {
        IdentityShift::new(lambda)?.lambda_in::<A>("lambda")?;
        let (d, hk) = self.wq.dim();
        let k = hk / self.heads;
        if layout == HeadLayout::Shifted && hk > d {
            return Err(InputError::invalid(
                "layout",
                format!("Shifted needs H·k = {hk} ≤ D = {d}"),
            )
            .into());
        }
        if k > d {
            return Err(InputError::invalid(
                "layout",
                format!("the head dimension k = {k} exceeds D = {d}"),
            )
            .into());
        }
        self.shift = Some((lambda, layout));
        for h in 0..self.heads {
            self.head(h).map_err(|e| match e {
                AttentionError::Overflow { reason, .. } => AttentionError::Overflow {
                    arg: "lambda",
                    reason,
                },
                other => other,
            })?;
        }
        Ok(self)
    }

    /// Number of heads H.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// Head dimension k.
    pub fn head_dim(&self) -> usize {
        self.wq.ncols() / self.heads
    }

    /// Trainable parameters, 3·D·Hk (a correction adds none).
    pub fn parameter_count(&self) -> usize {
        3 * self.wq.len()
    }

    /// Head `h` as a [`SelfAttention`] (its weight columns and its shifted block), for per-head
    /// Jacobians and diagnostics.
    ///
    /// Errors: `h ≥ H` (argument `h`).
    pub fn head(&self, h: usize) -> Result<SelfAttention<A>> {
        if h >= self.heads {
            return Err(InputError::invalid(
                "h",
                format!("head {h} out of range for {} heads", self.heads),
            )
            .into());
        }
        let k = self.head_dim();
        let cols = s![.., h * k..(h + 1) * k];
        let head = SelfAttention::new(
            self.wq.slice(cols).to_owned(),
            self.wk.slice(cols).to_owned(),
            self.wv.slice(cols).to_owned(),
            self.options,
        )?;
        match self.shift {
            None => Ok(head),
            Some((lambda, layout)) => {
                head.with_identity_shift(IdentityShift::at_offset(lambda, layout.offset(h, k))?)
            }
        }
    }

    /// The fused projections (Q, K, V), each N×Hk, with the correction applied as
    /// X W + λ·(the shifted columns of X) — never forming W + λE.
    ///
    /// Errors: `x` empty, non-finite or without D columns; [`AttentionError::Overflow`]
    /// (argument `x`) when a projection overflows.
    pub fn project_qkv(&self, x: ArrayView2<'_, A>) -> Result<[Array2<A>; 3]> {
        let d = self.wq.nrows();
        check_shape("x", &x, x.nrows(), d, "D columns, the rows of the weights")?;
        let k = self.head_dim();
        let mut out = [x.dot(&self.wq), x.dot(&self.wk), x.dot(&self.wv)];
        if let Some((lambda, layout)) = self.shift {
            let l = A::from_f64_lossy(lambda);
            for m in &mut out {
                for h in 0..self.heads {
                    let off = layout.offset(h, k);
                    m.slice_mut(s![.., h * k..(h + 1) * k])
                        .scaled_add(l, &x.slice(s![.., off..off + k]));
                }
            }
        }
        for m in &out {
            check_computed("x", &m.view(), "a projection X W + λ X[:, block]")?;
        }
        Ok(out)
    }

    /// The concatenated head outputs [A_1 … A_H] ∈ ℝ^{N×Hk}.
    ///
    /// Errors: as [`SelfAttention::forward`] (overflow of the scores included).
    pub fn forward(&self, x: ArrayView2<'_, A>) -> Result<Array2<A>> {
        let outs = (0..self.heads)
            .map(|h| Ok(self.head(h)?.forward(x)?.output))
            .collect::<Result<Vec<_>>>()?;
        let views: Vec<ArrayView2<'_, A>> = outs.iter().map(|o| o.view()).collect();
        concatenate(Axis(1), &views).map_err(|e| InputError::invalid("x", e.to_string()).into())
    }
}
