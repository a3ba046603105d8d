//! The spectral-conditioning corrections: Theorem 3.5's exact SVD correction, Theorem 3.8's
//! λ·I_k shift with its cheap "column scaling" implementation, and a scale-aware choice of λ.
//!
//! # What each guarantees
//!
//! Let W ∈ ℝ^{D×k}, r = min(D, k), σ₁ ≥ … ≥ σ_r its singular values, a = σ₁ = ‖W‖₂.
//!
//! * [`SvdCorrection`] (Theorem 3.5): C = σ₁ U Vᵀ from the thin SVD W = U Σ Vᵀ. Then
//!   W + C = U (Σ + σ₁ I) Vᵀ keeps W's singular vectors and has singular values σ_i + σ₁, so
//!   **κ(W + C) = 2σ₁ / (σ₁ + σ_r) ∈ [1, 2]**, strictly below 2 iff W has full rank r (for any
//!   W ≠ 0; this is exact, not a bound). Cost: one SVD per matrix.
//! * [`IdentityShift`] (Theorem 3.8): W + λ E with E = I_k, the D×k matrix with ones at (i, i)
//!   (or the same block shifted down by a row offset, for multi-head layouts). E has k singular
//!   values equal to 1, so by Weyl's inequality |σ_i(W + λE) − λ| ≤ a, and for **λ > a**:
//!   **κ(W + λE) ≤ (λ + a)/(λ − a)** (T8). Hence a strict decrease κ(W + λE) < κ(W) is
//!   guaranteed when **λ > a (κ(W) + 1)/(κ(W) − 1)** (T9), and κ(W + λE) → 1 as λ → ∞ (T11).
//!   Nothing is guaranteed for λ ≤ a: the shift can make κ *worse* (T10, see
//!   [`IdentityShift`]'s docs). The reading "‖W‖₂ ≤ 1, λ ≥ 2 ⇒ κ ≤ 3" of the paper's
//!   "λ ≥ 2 under specific conditions" is the case a ≤ 1, λ = 2 of the Weyl bound.
//! * [`LambdaPolicy`]: chooses λ from σ_max(W) (and κ(W)) so that one of the two guarantees
//!   above holds — a policy no paper states; the paper uses a fixed λ = 10 whatever the weight
//!   scale.
//!
//! All corrections are constants: they carry no gradient and add no parameter.

use kappa_linalg::input::{check_matrix, check_nonneg, check_positive, check_shape, InputError};
use kappa_linalg::{conditioning_from_singular_values, RankTolerance, Real};
use ndarray::{s, Array2, ArrayView2};

use crate::error::{check_computed, check_dense, AttentionError, Result};
use crate::scale::{singular_values_scaled, svd_scaled, times_pow2, times_pow2_f64};

/// The D×k "rectangular identity" I_k = [I_{k×k}; 0] (ones at (i, i), i < min(D, k)).
///
/// Errors: `d` or `k` zero (argument `d` or `k`); [`AttentionError::TooLarge`] when d·k exceeds
/// [`kappa_linalg::MAX_DENSE_ENTRIES`] (argument `d` or `k`, whichever is larger), checked
/// before anything is allocated.
///
/// ```
/// let e = kappa_attention::rect_identity::<f64>(3, 2)?;
/// assert_eq!(e, ndarray::array![[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]);
/// # Ok::<(), kappa_attention::AttentionError>(())
/// ```
pub fn rect_identity<A: Real>(d: usize, k: usize) -> Result<Array2<A>> {
    block_identity(d, k, 0)
}

/// The D×k block identity E with ones at (offset + i, i), i < k: rows offset..offset + k of E
/// form I_k. With offset = h·k it is head h's block of the fused D×D identity.
///
/// Errors: `d` or `k` zero; `offset + k > d` (argument `offset`, checked without overflow);
/// d·k above [`kappa_linalg::MAX_DENSE_ENTRIES`] (as [`rect_identity`]).
pub fn block_identity<A: Real>(d: usize, k: usize, offset: usize) -> Result<Array2<A>> {
    if d == 0 || k == 0 {
        return Err(
            InputError::invalid(if d == 0 { "d" } else { "k" }, "must be at least 1").into(),
        );
    }
    if offset.checked_add(k).is_none_or(|end| end > d) {
        return Err(InputError::invalid(
            "offset",
            format!("rows offset..offset + k = {offset}..{offset}+{k} exceed D = {d}"),
        )
        .into());
    }
    check_dense(if d >= k { "d" } else { "k" }, d, k)?;
    let mut e = Array2::zeros((d, k));
    for i in 0..k {
        e[[offset + i, i]] = A::one();
    }
    Ok(e)
}

/// Theorem 3.5's exact correction C = σ_max(W) · U Vᵀ for one projection W.
///
/// **Guarantee** (exact, any W ≠ 0): W + C has W's singular vectors and singular values
/// σ_i + σ_max, so κ(W + C) = 2σ_max/(σ_max + σ_min) ∈ [1, 2], strictly < 2 iff W has full rank.
/// It is recomputed whenever W changes (one SVD per projection per step in training).
///
/// ```
/// use kappa_attention::SvdCorrection;
/// use kappa_linalg::condition_number;
/// let w = ndarray::array![[100.0_f64, 0.0], [0.0, 0.01], [0.0, 0.0]];
/// let c = SvdCorrection::new(w.view())?;
/// let kappa = condition_number(c.apply(w.view())?.view())?;
/// assert!((kappa - c.corrected_kappa()).abs() < 1e-12 && kappa < 2.0);
/// # Ok::<(), kappa_attention::AttentionError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SvdCorrection<A> {
    c: Array2<A>,
    sigma_max: A,
    sigma_min: A,
}

impl<A: Real> SvdCorrection<A> {
    /// C = σ₁ U Vᵀ from the thin SVD of `w` (any shape, any layout).
    ///
    /// The SVD is taken of `w` scaled by a power of two to a largest entry in [1/2, 1) (exact;
    /// see `docs/attention.md`, "Scale behaviour"), so entries anywhere in the finite range work.
    ///
    /// Errors: `w` empty or non-finite (argument `w`); [`AttentionError::Overflow`] (argument
    /// `w`) when σ₁ or C is not representable (entries within a factor √(Dk) of the type's
    /// largest value); LAPACK failures.
    pub fn new(w: ArrayView2<'_, A>) -> Result<Self> {
        check_matrix("w", &w)?;
        let (f, e) = svd_scaled(w)?;
        let r = f.s.len();
        let (smax, smin) = (f.s[0], f.s[r - 1]);
        let c = f.u.dot(&f.vt).mapv(|x| times_pow2(x * smax, e));
        let sigma_max = times_pow2(smax, e);
        let sigma_min = times_pow2(smin, e);
        let sig = ndarray::arr2(&[[sigma_max]]);
        check_computed("w", &sig.view(), "σ_max(w)")?;
        check_computed("w", &c.view(), "the correction C = σ_max U Vᵀ")?;
        Ok(Self {
            c,
            sigma_max,
            sigma_min,
        })
    }

    /// The correction matrix C (same shape as W).
    pub fn matrix(&self) -> ArrayView2<'_, A> {
        self.c.view()
    }

    /// W + C.
    ///
    /// Errors: `w` empty, non-finite or not of C's shape; [`AttentionError::Overflow`]
    /// (argument `w`) when W + C overflows.
    pub fn apply(&self, w: ArrayView2<'_, A>) -> Result<Array2<A>> {
        check_shape("w", &w, self.c.nrows(), self.c.ncols(), "the shape of C")?;
        let out = &w + &self.c;
        check_computed("w", &out.view(), "W + C")?;
        Ok(out)
    }

    /// The closed form 2σ_max/(σ_max + σ_min) = 2/(1 + σ_min/σ_max) of κ(W + C), in [1, 2]
    /// (1 for W = 0, where C = 0). Evaluated in the second form, which cannot overflow.
    pub fn corrected_kappa(&self) -> A {
        let two = A::one() + A::one();
        if self.sigma_max == A::zero() {
            return A::one();
        }
        two / (A::one() + self.sigma_min / self.sigma_max)
    }

    /// σ_max(W).
    pub fn sigma_max(&self) -> A {
        self.sigma_max
    }

    /// σ_min(W), the min(D, k)-th singular value.
    pub fn sigma_min(&self) -> A {
        self.sigma_min
    }
}

/// Theorem 3.8's cheap correction W ↦ W + λ E, E the D×k block identity at a row offset
/// (offset 0: the paper's rectangular I_k).
///
/// **Guarantee**: for λ > a = σ_max(W), κ(W + λE) ≤ (λ + a)/(λ − a)
/// ([`IdentityShift::weyl_bound`]); a strict decrease κ(W + λE) < κ(W) when
/// λ > a(κ(W) + 1)/(κ(W) − 1) ([`IdentityShift::guarantees_decrease`]). **No guarantee for
/// λ ≤ a**: e.g. D = 8, k = 4, W with top block ≈ −I and tiny other rows has κ(W) ≈ 1.04 but
/// κ(W + I_k) ≫ κ(W), because the shift cancels W's large singular directions.
///
/// The projection is computed as X W + λ X[:, offset..offset + k] ([`IdentityShift::project`]),
/// N·k extra multiplications against 2·N·D·k for X W: a relative cost of 1/(2D)
/// ([`identity_shift_flops`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdentityShift {
    lambda: f64,
    offset: usize,
}

impl IdentityShift {
    /// λ·I_k (offset 0).
    ///
    /// Errors: λ not finite or negative (argument `lambda`).
    ///
    /// ```
    /// use kappa_attention::IdentityShift;
    /// let x = ndarray::array![[1.0, 2.0, 3.0]];
    /// let w = ndarray::array![[0.5], [0.0], [1.0]];
    /// let shift = IdentityShift::new(10.0)?;
    /// // X (W + 10 I_1) = X W + 10 X[:, 0..1] = 3.5 + 10.
    /// assert_eq!(shift.project(x.view(), w.view())?[[0, 0]], 13.5);
    /// # Ok::<(), kappa_attention::AttentionError>(())
    /// ```
    pub fn new(lambda: f64) -> Result<Self> {
        Self::at_offset(lambda, 0)
    }

    /// λ·E with E's identity block starting at row `offset`.
    ///
    /// Errors: λ not finite or negative (argument `lambda`).
    pub fn at_offset(lambda: f64, offset: usize) -> Result<Self> {
        check_nonneg("lambda", lambda)?;
        Ok(Self { lambda, offset })
    }

    /// λ.
    pub fn lambda(&self) -> f64 {
        self.lambda
    }

    /// The row offset of the identity block.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Checks offset + k ≤ d without overflow (any offset, up to `usize::MAX`, is refused
    /// cleanly when it does not fit).
    pub(crate) fn check_fits(&self, d: usize, k: usize) -> Result<()> {
        if self.offset.checked_add(k).is_none_or(|end| end > d) {
            return Err(InputError::invalid(
                "shift",
                format!(
                    "the identity block at rows {}..{} + {k} does not fit in D = {d} rows",
                    self.offset, self.offset
                ),
            )
            .into());
        }
        Ok(())
    }

    /// λ in the precision `A` it is used in: it must stay finite there (λ = 1e300 is finite in
    /// f64 but ∞ in f32). A λ that rounds to 0 (e.g. 1e-50 in f32) is the shift by 0, not an
    /// error. `arg` names λ's holder in the caller's signature.
    pub(crate) fn lambda_in<A: Real>(&self, arg: &'static str) -> Result<A> {
        let l = A::from_f64_lossy(self.lambda);
        if l.is_finite() {
            Ok(l)
        } else {
            Err(InputError::invalid(
                arg,
                format!("λ = {:e} is not finite in {}", self.lambda, A::NAME),
            )
            .into())
        }
    }

    /// The D×k matrix λ E.
    ///
    /// Errors: as [`block_identity`]; λ not finite in `A` (argument `lambda`).
    pub fn matrix<A: Real>(&self, d: usize, k: usize) -> Result<Array2<A>> {
        let e = block_identity::<A>(d, k, self.offset)?;
        let l = self.lambda_in::<A>("lambda")?;
        Ok(e.mapv(|x| x * l))
    }

    /// W + λE, materialized (for analysis; training uses [`IdentityShift::project`]).
    ///
    /// Errors: `w` empty or non-finite; the block does not fit in `w`'s rows or λ is not finite
    /// in `A` (argument `shift`); [`AttentionError::Overflow`] (argument `w`) when W + λE
    /// overflows.
    pub fn apply<A: Real>(&self, w: ArrayView2<'_, A>) -> Result<Array2<A>> {
        check_matrix("w", &w)?;
        let (d, k) = w.dim();
        self.check_fits(d, k)?;
        let l = self.lambda_in::<A>("shift")?;
        let mut out = w.to_owned();
        for i in 0..k {
            out[[self.offset + i, i]] += l;
        }
        check_computed("w", &out.view(), "W + λE")?;
        Ok(out)
    }

    /// X (W + λE) computed as X W + λ X[:, offset..offset + k], never forming W + λE.
    ///
    /// Errors: `x` or `w` empty or non-finite; `w` without `x.ncols()` rows; the block does not
    /// fit or λ is not finite in `A` (argument `shift`); [`AttentionError::Overflow`] (argument
    /// `x`) when the product overflows.
    pub fn project<A: Real>(
        &self,
        x: ArrayView2<'_, A>,
        w: ArrayView2<'_, A>,
    ) -> Result<Array2<A>> {
        check_matrix("x", &x)?;
        check_matrix("w", &w)?;
        let (d, k) = w.dim();
        check_shape("x", &x, x.nrows(), d, "D columns, the rows of w")?;
        self.check_fits(d, k)?;
        let l = self.lambda_in::<A>("shift")?;
        let mut out = x.dot(&w);
        out.scaled_add(l, &x.slice(s![.., self.offset..self.offset + k]));
        check_computed("x", &out.view(), "X (W + λE)")?;
        Ok(out)
    }

    /// Weyl's bound (λ + σ_max)/(λ − σ_max) = (1 + r)/(1 − r), r = σ_max/λ, on κ(W + λE),
    /// evaluated in the second form (no overflow for λ near `f64::MAX`). `None` when there is no
    /// bound: λ ≤ σ_max, or `sigma_max` not a finite number ≥ 0 (it is a largest singular
    /// value).
    pub fn weyl_bound(&self, sigma_max: f64) -> Option<f64> {
        let valid = sigma_max.is_finite() && sigma_max >= 0.0;
        (valid && self.lambda > sigma_max).then(|| {
            let r = sigma_max / self.lambda;
            (1.0 + r) / (1.0 - r)
        })
    }

    /// Whether Theorem 3.8's sufficient condition λ > σ_max (κ + 1)/(κ − 1) holds for `w`
    /// (κ = ∞ reads as λ > σ_max; κ = 1 never holds).
    ///
    /// Errors: `w` empty or non-finite; LAPACK failures. Any finite scale works (the SVD is
    /// scaled; a threshold beyond `f64::MAX` is met by no λ, so the answer is `false`).
    pub fn guarantees_decrease<A: Real>(&self, w: ArrayView2<'_, A>) -> Result<bool> {
        check_matrix("w", &w)?;
        let (a, kappa) = sigma_max_and_kappa(w)?;
        Ok(match decrease_threshold(a, kappa) {
            Some(t) => self.lambda > t,
            None => false,
        })
    }
}

/// σ_max (f64, +∞ when beyond `f64::MAX`) and κ of a validated `w`, from one scaled SVD.
fn sigma_max_and_kappa<A: Real>(w: ArrayView2<'_, A>) -> Result<(f64, f64)> {
    let (s, e) = singular_values_scaled(w)?;
    let (m, n) = w.dim();
    let c = conditioning_from_singular_values(s.view(), m, n, RankTolerance::Numpy)?;
    Ok((
        times_pow2_f64(c.sigma_max.to_f64_lossy(), e),
        c.kappa.to_f64_lossy(),
    ))
}

/// Checks that a chosen λ is finite: [`AttentionError::Overflow`] naming `arg` otherwise.
fn finite_lambda(arg: &'static str, lambda: f64) -> Result<f64> {
    if lambda.is_finite() {
        Ok(lambda)
    } else {
        Err(AttentionError::Overflow {
            arg,
            reason: "the chosen λ exceeds f64::MAX".into(),
        })
    }
}

/// λ = σ_max·c for a policy multiplier c: [`AttentionError::Overflow`] naming `policy` when c
/// itself overflows (a margin near `f64::MAX`), else `w` when only the product does (λ scales
/// with w).
fn scaled_lambda(sigma_max: f64, c: f64) -> Result<f64> {
    finite_lambda("policy", c)?;
    finite_lambda("w", sigma_max * c)
}

/// The threshold a (κ + 1)/(κ − 1) of Theorem 3.8's sufficient condition (a for κ = ∞), or
/// `None` for κ ≤ 1.
fn decrease_threshold(a: f64, kappa: f64) -> Option<f64> {
    if kappa.is_infinite() {
        Some(a)
    } else if kappa > 1.0 {
        Some(a * (kappa + 1.0) / (kappa - 1.0))
    } else {
        None
    }
}

/// How to choose λ for [`IdentityShift`].
///
/// The paper fixes λ = 10 whatever the weight scale; `SufficientDecrease` and `TargetKappa`
/// choose λ from σ_max(W) so that a guarantee of [`IdentityShift`] holds, and
/// `RelativeToSigmaMax` reads the paper's λ in units of σ_max(W) (no guarantee, but the same
/// effect on κ at every weight scale).
///
/// With the `serde` feature it is written `{ fixed = λ }`, `{ target_kappa = κ_t }`,
/// `{ sufficient_decrease = { margin = m } }` or `{ relative_to_sigma_max = c }`; the parameter
/// is checked when λ is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum LambdaPolicy {
    /// A fixed λ ≥ 0 (the paper: 10). No guarantee.
    Fixed(f64),
    /// λ = (1 + margin) · σ_max (κ + 1)/(κ − 1) with margin > 0: Theorem 3.8's sufficient
    /// condition holds, so κ(W + λE) < κ(W) is **guaranteed**. Unattainable for κ(W) = 1.
    SufficientDecrease {
        /// The relative margin above the threshold (> 0).
        margin: f64,
    },
    /// λ = σ_max (κ_t + 1)/(κ_t − 1) for a target κ_t > 1: by Weyl, κ(W + λE) ≤ κ_t is
    /// **guaranteed** (the least λ for which the Weyl bound meets the target).
    TargetKappa(f64),
    /// λ = c · σ_max(W) for c ≥ 0: the fixed λ read relative to the weights' scale. Since
    /// κ(W + cσ_max E) depends on W/σ_max only, the result is scale-invariant; by Weyl,
    /// κ ≤ (c + 1)/(c − 1) for c > 1.
    RelativeToSigmaMax(f64),
}

impl LambdaPolicy {
    /// The λ this policy chooses for `w`.
    ///
    /// Errors: `w` empty or non-finite (argument `w`); an invalid policy parameter (argument
    /// `policy`); [`AttentionError::Unattainable`] for `SufficientDecrease` with κ(w) = 1 or
    /// w = 0; [`AttentionError::Overflow`] when the chosen λ = σ_max(w)·c exceeds `f64::MAX`
    /// (argument `policy` when the policy's multiplier c itself does, e.g. a margin near
    /// `f64::MAX`; else `w`, whose scale λ follows); LAPACK failures. The λ returned is always finite and ≥ 0.
    ///
    /// ```
    /// use kappa_attention::{IdentityShift, LambdaPolicy};
    /// use kappa_linalg::condition_number;
    /// let w = ndarray::array![[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]];
    /// let lambda = LambdaPolicy::TargetKappa(1.5).choose(w.view())?;
    /// assert_eq!(lambda, 15.0); // 3 · (1.5 + 1)/(1.5 − 1)
    /// let shifted = IdentityShift::new(lambda)?.apply(w.view())?;
    /// assert!(condition_number(shifted.view())? <= 1.5);
    /// # Ok::<(), kappa_attention::AttentionError>(())
    /// ```
    pub fn choose<A: Real>(&self, w: ArrayView2<'_, A>) -> Result<f64> {
        match *self {
            LambdaPolicy::Fixed(l) => {
                check_nonneg("policy", l)?;
                check_matrix("w", &w)?;
                Ok(l)
            }
            LambdaPolicy::SufficientDecrease { margin } => {
                check_positive("policy", margin)?;
                check_matrix("w", &w)?;
                let (a, kappa) = sigma_max_and_kappa(w)?;
                finite_lambda("w", a)?;
                if a == 0.0 {
                    return Err(AttentionError::Unattainable {
                        arg: "w",
                        reason: "w is zero; any λ > 0 gives κ(λE) = 1".into(),
                    });
                }
                match decrease_threshold(1.0, kappa) {
                    Some(c) => scaled_lambda(a, (1.0 + margin) * c),
                    None => Err(AttentionError::Unattainable {
                        arg: "w",
                        reason: format!(
                            "κ(w) = {kappa} is already 1, so no λ decreases it strictly"
                        ),
                    }),
                }
            }
            LambdaPolicy::TargetKappa(target) => {
                if !(target.is_finite() && target > 1.0) {
                    return Err(InputError::invalid(
                        "policy",
                        format!("the target κ must be finite and > 1, found {target}"),
                    )
                    .into());
                }
                check_matrix("w", &w)?;
                let (a, _) = sigma_max_and_kappa(w)?;
                finite_lambda("w", a)?;
                scaled_lambda(a, (target + 1.0) / (target - 1.0))
            }
            LambdaPolicy::RelativeToSigmaMax(c) => {
                check_nonneg("policy", c)?;
                check_matrix("w", &w)?;
                let (a, _) = sigma_max_and_kappa(w)?;
                finite_lambda("w", a)?;
                scaled_lambda(a, c)
            }
        }
    }

    /// One λ shared by several matrices (the paper shares λ across W_Q, W_K, W_V): the largest
    /// of the λ chosen for each, which keeps every guarantee (the Weyl bound decreases in λ).
    ///
    /// Errors: `ws` empty (argument `ws`); as [`LambdaPolicy::choose`] for each.
    pub fn choose_shared<A: Real>(&self, ws: &[ArrayView2<'_, A>]) -> Result<f64> {
        if ws.is_empty() {
            return Err(InputError::Empty {
                arg: "ws",
                rows: 0,
                cols: 0,
            }
            .into());
        }
        ws.iter()
            .try_fold(0.0f64, |m, w| Ok(m.max(self.choose(w.view())?)))
    }
}

/// The extra multiplications of the cheap λ·I_k projection against the projection itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShiftFlops {
    /// N·k multiplications by λ.
    pub extra_multiplies: u64,
    /// 2·N·D·k flops of X W.
    pub projection_flops: u64,
    /// extra / projection = 1/(2D).
    pub ratio: f64,
}

/// FLOP count of X W + λ X[:, block] against X W for X ∈ ℝ^{N×D}, W ∈ ℝ^{D×k} (T15). For the
/// fused multi-head form pass k = D (N·D against 2·N·D²): the ratio is 1/(2D) either way.
///
/// Defined for every input: counts saturate at `u64::MAX` instead of wrapping; the ratio is
/// computed in f64 from n·k and 2·n·d·k (so it stays 1/(2D) whatever the counts). Any size 0
/// gives all zeros (no projection, no block, no overhead).
///
/// ```
/// let f = kappa_attention::identity_shift_flops(197, 768, 64);
/// assert_eq!(f.ratio, 1.0 / (2.0 * 768.0));
/// ```
pub fn identity_shift_flops(n: usize, d: usize, k: usize) -> ShiftFlops {
    let (n64, d64, k64) = (n as u64, d as u64, k as u64);
    let extra = n64.saturating_mul(k64);
    let proj = extra.saturating_mul(d64).saturating_mul(2);
    if n == 0 || d == 0 || k == 0 {
        return ShiftFlops {
            extra_multiplies: 0,
            projection_flops: 0,
            ratio: 0.0,
        };
    }
    let nk = n as f64 * k as f64;
    let ratio = nk / (2.0 * nk * d as f64);
    ShiftFlops {
        extra_multiplies: extra,
        projection_flops: proj,
        ratio,
    }
}

/// The fixed correction a head computes with.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Correction<A> {
    /// Plain attention.
    #[default]
    None,
    /// λ·E on each of W_Q, W_K, W_V (Theorem 3.8).
    Shift(IdentityShift),
    /// σ_max U Vᵀ on each of W_Q, W_K, W_V (Theorem 3.5), in that order.
    Svd(Box<[SvdCorrection<A>; 3]>),
}

impl<A: Real> Correction<A> {
    /// W + C for projection `which` (0 = Q, 1 = K, 2 = V); shapes are checked by the caller.
    pub(crate) fn apply(&self, which: usize, w: &Array2<A>) -> Array2<A> {
        match self {
            Correction::None => w.clone(),
            Correction::Shift(shift) => {
                let mut out = w.clone();
                let l = A::from_f64_lossy(shift.lambda);
                for i in 0..w.ncols() {
                    out[[shift.offset + i, i]] += l;
                }
                out
            }
            Correction::Svd(c) => w + &c[which].c,
        }
    }
}
