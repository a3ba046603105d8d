//! AdamW with the semantics of `torch.optim.AdamW`: kappa's one AdamW (and Adam), on `ndarray`
//! arrays (f64, any dimension) and, with the `tch` feature, on groups of `tch::Tensor` parameters
//! (`AdamW::step_tensors`, `AdamWKernel`).
//!
//! # Math
//!
//! For a parameter p with gradient g, learning rate η (a schedule's, [`crate::schedule`]) and the
//! parameter's step count t (1 at its first step; m = v = 0 before it):
//!
//! ```text
//! p ← p·(1 − η·λ)                                  decoupled weight decay λ
//! m ← β₁·m + (1 − β₁)·g                            first moment
//! v ← β₂·v + (1 − β₂)·g²                           second moment
//! p ← p − (η/(1 − β₁ᵗ))·m / (√v/√(1 − β₂ᵗ) + ε)     ε added after the square root
//! ```
//!
//! that is p ← p − η·m̂/(√v̂ + ε) with the bias-corrected m̂ = m/(1 − β₁ᵗ), v̂ = v/(1 − β₂ᵗ).
//! Adam is AdamW with λ = 0 ([`AdamWConfig::adam`]); Adam's coupled (L2) weight decay is not
//! offered.
//!
//! # Evaluation order
//!
//! The math is one; each backend keeps the order of roundings that the results computed with it
//! depend on:
//!
//! * tch: torch's single-tensor loop. η/(1 − β₁ᵗ) and √(1 − β₂ᵗ) once per step in f64, then per
//!   element m, v (increment (1 − β₂)·g²), the denominator √v/√(1 − β₂ᵗ) + ε and
//!   ((η/(1 − β₁ᵗ))·m)/denominator. `AdamWKernel::Fused` computes each element so in f64 from the
//!   f32 data and rounds once per stored value (module `fused`); `AdamWKernel::Ops` runs
//!   libtorch's whole-tensor operations, each rounding to the tensor's kind.
//! * `ndarray` (f64): the textbook form η·m̂/(√v̂ + ε), evaluated as (η·(m/(1 − β₁ᵗ)))/
//!   (√(v/(1 − β₂ᵗ)) + ε) with v's increment ((1 − β₂)·g)·g: the order of the experiment
//!   baselines this AdamW replaced (optim-geometry's AdamW, the convergence module's Adam), whose
//!   numbers it reproduces bit for bit. The two orders differ by a few roundings (≤ 1e-14 over a
//!   few steps in the tests).

use kappa_linalg::input::InputError;
use ndarray::{Array, ArrayBase, ArrayView, Data, DataMut, Dimension, Zip};
use serde::{Deserialize, Serialize};

use crate::error::{check_range, Result};

#[cfg(feature = "tch")]
mod tch_backend;
#[cfg(feature = "tch")]
pub use tch_backend::AdamWKernel;

/// AdamW's hyper-parameters (the learning rate comes with each step, from a schedule).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdamWConfig {
    /// β₁ ∈ [0, 1): the first moment's decay.
    pub beta1: f64,
    /// β₂ ∈ [0, 1): the second moment's decay.
    pub beta2: f64,
    /// ε > 0, added to √v̂.
    pub eps: f64,
    /// Decoupled weight decay λ ≥ 0: p ← p·(1 − η·λ) before the step.
    pub weight_decay: f64,
}

impl AdamWConfig {
    /// `torch.optim.AdamW`'s defaults: β = (0.9, 0.999), ε = 1e-8, λ = 0.01.
    pub const fn torch() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }

    /// `torch.optim.Adam`'s defaults: β = (0.9, 0.999), ε = 1e-8, no weight decay.
    pub const fn adam() -> Self {
        Self {
            weight_decay: 0.0,
            ..Self::torch()
        }
    }

    /// (1 − β₁ᵗ, 1 − β₂ᵗ) at step `t` (1-based).
    pub(crate) fn bias_corrections(&self, t: u64) -> (f64, f64) {
        // β^t underflows to 0 long before t leaves i32.
        let t = i32::try_from(t).unwrap_or(i32::MAX);
        (1.0 - self.beta1.powi(t), 1.0 - self.beta2.powi(t))
    }

    /// Checks every field: β₁, β₂ ∈ [0, 1), ε finite and > 0, λ finite and ≥ 0. The error names
    /// the field (`beta1`, `beta2`, `eps`, `weight_decay`).
    pub fn validate(&self) -> Result<()> {
        check_range("beta1", self.beta1, 0.0, 1.0 - f64::EPSILON)?;
        check_range("beta2", self.beta2, 0.0, 1.0 - f64::EPSILON)?;
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(InputError::invalid(
                "eps",
                format!("must be finite and > 0, found {}", self.eps),
            )
            .into());
        }
        Ok(check_range(
            "weight_decay",
            self.weight_decay,
            0.0,
            f64::MAX,
        )?)
    }
}

/// Per-parameter state of [`AdamW`]: the moments m and v (created at the parameter's first step)
/// and the number of steps applied (t of the bias correction). Keep one per parameter.
#[derive(Debug, Clone)]
pub struct AdamWState<A> {
    pub(crate) moments: Option<(A, A)>,
    pub(crate) steps: u64,
}

impl<A> Default for AdamWState<A> {
    fn default() -> Self {
        Self {
            moments: None,
            steps: 0,
        }
    }
}

impl<A> AdamWState<A> {
    /// A fresh state (zero moments, no steps).
    pub fn new() -> Self {
        Self::default()
    }

    /// Steps applied so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The first moment m (`exp_avg`), once a step has been taken.
    pub fn exp_avg(&self) -> Option<&A> {
        self.moments.as_ref().map(|(m, _)| m)
    }

    /// The second moment v (`exp_avg_sq`), once a step has been taken.
    pub fn exp_avg_sq(&self) -> Option<&A> {
        self.moments.as_ref().map(|(_, v)| v)
    }

    /// A state restored from a checkpoint: the moments (m, v) (None before the first step: zeros
    /// are created at the next one) and the number of steps applied.
    pub fn from_parts(moments: Option<(A, A)>, steps: u64) -> Self {
        Self { moments, steps }
    }
}

/// The scalars of one step of one parameter on tch, in f64 (torch's order, see the module docs).
#[cfg(feature = "tch")]
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdamWScalars {
    /// 1 − η·λ.
    pub decay: f64,
    /// β₁.
    pub beta1: f64,
    /// β₂.
    pub beta2: f64,
    /// η/(1 − β₁ᵗ).
    pub step_size: f64,
    /// √(1 − β₂ᵗ).
    pub bc2_sqrt: f64,
    /// ε.
    pub eps: f64,
}

#[cfg(feature = "tch")]
impl AdamWScalars {
    /// The scalars of step `t` (1-based) at learning rate `lr`.
    pub(crate) fn new(config: &AdamWConfig, lr: f64, t: u64) -> Self {
        let (bc1, bc2) = config.bias_corrections(t);
        Self {
            decay: 1.0 - lr * config.weight_decay,
            beta1: config.beta1,
            beta2: config.beta2,
            step_size: lr / bc1,
            bc2_sqrt: bc2.sqrt(),
            eps: config.eps,
        }
    }

    /// The new moments (β₁m + (1−β₁)g, β₂v + (1−β₂)g²) of one element.
    #[inline(always)]
    pub(crate) fn moments(&self, m: f64, v: f64, g: f64) -> (f64, f64) {
        (
            self.beta1 * m + (1.0 - self.beta1) * g,
            self.beta2 * v + (1.0 - self.beta2) * (g * g),
        )
    }

    /// The new parameter p·(1 − η·λ) − step_size·m/(√v/√(1−β₂ᵗ) + ε) of one element, from the
    /// new moments.
    #[inline(always)]
    pub(crate) fn param(&self, p: f64, m: f64, v: f64) -> f64 {
        let denom = v.sqrt() / self.bc2_sqrt + self.eps;
        self.decay * p - self.step_size * m / denom
    }
}

/// AdamW (see the module docs).
///
/// ```
/// use kappa_optim::{AdamW, AdamWConfig, AdamWState};
/// let mut w = ndarray::array![[1.0, 1.0]];
/// let adamw = AdamW::new(AdamWConfig { weight_decay: 0.1, ..AdamWConfig::torch() })?;
/// let mut state = AdamWState::new();
/// adamw.step(&mut w, &ndarray::array![[2.0, -3.0]], 0.1, &mut state)?;
/// // The first step moves each entry by −lr·g/(|g| + ε) = −lr·sign(g), after the decay 1 − lr·λ.
/// assert!((w[[0, 0]] - (0.99 - 0.1)).abs() < 1e-8 && (w[[0, 1]] - (0.99 + 0.1)).abs() < 1e-8);
/// assert_eq!(state.steps(), 1);
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
#[derive(Debug, Clone)]
pub struct AdamW {
    config: AdamWConfig,
}

impl AdamW {
    /// AdamW with `config` (validated).
    pub fn new(config: AdamWConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self { config })
    }

    /// The settings.
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// One step on `p` in place, with gradient `grad`, learning rate `lr` and this parameter's
    /// `state`.
    ///
    /// Errors (nothing is modified), all [`OptimError::Input`](crate::OptimError::Input): `lr`
    /// negative or not finite ([`InputError::InvalidArgument`]), `grad` or `state` of another
    /// shape than `p` ([`InputError::ShapeMismatch`]), a NaN or ±∞ in `p`, `grad` or the state's
    /// moments ([`InputError::NonFinite`]; its (row, col) index the array with its leading axes
    /// flattened into rows).
    pub fn step<S, T, D>(
        &self,
        p: &mut ArrayBase<S, D>,
        grad: &ArrayBase<T, D>,
        lr: f64,
        state: &mut AdamWState<Array<f64, D>>,
    ) -> Result<()>
    where
        S: DataMut<Elem = f64>,
        T: Data<Elem = f64>,
        D: Dimension,
    {
        check_lr(lr)?;
        check_shape("grad", grad.shape(), p.shape(), "the shape of `p`")?;
        check_finite("p", p.view())?;
        check_finite("grad", grad.view())?;
        if let Some((m, v)) = &state.moments {
            let why = "moments of the shape of `p` (this state belongs to another parameter)";
            check_shape("state", m.shape(), p.shape(), why)?;
            check_shape("state", v.shape(), p.shape(), why)?;
            check_finite("state", m.view())?;
            check_finite("state", v.view())?;
        }
        self.step_unchecked(p, grad, lr, state);
        Ok(())
    }

    /// [`AdamW::step`] on inputs the caller has checked (a non-finite input gives non-finite
    /// output, no error).
    pub(crate) fn step_unchecked<S, T, D>(
        &self,
        p: &mut ArrayBase<S, D>,
        grad: &ArrayBase<T, D>,
        lr: f64,
        state: &mut AdamWState<Array<f64, D>>,
    ) where
        S: DataMut<Elem = f64>,
        T: Data<Elem = f64>,
        D: Dimension,
    {
        let t = state.steps + 1;
        let AdamWConfig {
            beta1: b1,
            beta2: b2,
            eps,
            weight_decay,
        } = self.config;
        let (c1, c2) = self.config.bias_corrections(t);
        let decay = 1.0 - lr * weight_decay;
        let (m, v) = state
            .moments
            .get_or_insert_with(|| (Array::zeros(p.raw_dim()), Array::zeros(p.raw_dim())));
        // The ndarray order of the module docs.
        Zip::from(p)
            .and(grad)
            .and(m)
            .and(v)
            .for_each(|p, &g, m, v| {
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                *p = decay * *p - lr * (*m / c1) / ((*v / c2).sqrt() + eps);
            });
        state.steps = t;
    }
}

/// Checks that a learning rate is finite and ≥ 0.
pub(crate) fn check_lr(lr: f64) -> Result<()> {
    Ok(check_range("lr", lr, 0.0, f64::MAX)?)
}

/// A shape as `2×3×4` (`scalar` for 0 dimensions).
pub(crate) fn dims_str(shape: &[usize]) -> String {
    if shape.is_empty() {
        return "scalar".into();
    }
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    dims.join("×")
}

/// Checks that `found` equals `expected`.
pub(crate) fn check_shape(
    arg: &'static str,
    found: &[usize],
    expected: &[usize],
    why: &str,
) -> Result<()> {
    if found == expected {
        Ok(())
    } else {
        Err(InputError::shape_mismatch(
            arg,
            format!("{} ({why})", dims_str(expected)),
            dims_str(found),
        )
        .into())
    }
}

/// Checks that every entry is finite; the first that is not is reported at (row, col) of the
/// array's 2-D view (leading axes flattened into rows, the last axis the columns).
fn check_finite<D: Dimension>(arg: &'static str, a: ArrayView<'_, f64, D>) -> Result<()> {
    let cols = a.shape().last().copied().unwrap_or(1).max(1);
    match a.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        None => Ok(()),
        Some((k, &value)) => Err(InputError::NonFinite {
            arg,
            row: k / cols,
            col: k % cols,
            value,
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OptimError;
    use ndarray::{array, Array1, Array3};

    #[test]
    fn the_first_step_is_minus_lr_times_the_sign_of_the_gradient() {
        // m̂ = g and v̂ = g² at t = 1, so the step is −lr·g/(|g| + ε).
        let adamw = AdamW::new(AdamWConfig::adam()).unwrap();
        let mut p = Array1::from(vec![1.0, 1.0, 1.0]);
        let mut s = AdamWState::new();
        adamw
            .step(&mut p, &array![2.0, -3.0, 0.0], 0.1, &mut s)
            .unwrap();
        assert!((p[0] - 0.9).abs() < 1e-8 && (p[1] - 1.1).abs() < 1e-8 && p[2] == 1.0);
        assert_eq!(s.steps(), 1);
        assert!((s.exp_avg().unwrap()[1] + 0.3).abs() < 1e-15);
    }

    /// The recursion against its closed form after t steps with a constant gradient:
    /// m = (1 − β₁ᵗ)g and v = (1 − β₂ᵗ)g², so m̂ = g, v̂ = g² at every step and each step is
    /// p ← p(1 − ηλ) − η·g/(|g| + ε) (3-D, to cover any dimension).
    #[test]
    fn a_constant_gradient_gives_the_closed_form_and_the_weight_decay_is_decoupled() {
        let cfg = AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let adamw = AdamW::new(cfg).unwrap();
        let mut p = Array3::<f64>::from_elem((2, 3, 2), 1.0);
        let g = Array3::<f64>::from_shape_fn((2, 3, 2), |(i, j, k)| (i + j + k) as f64 - 2.0);
        let mut s = AdamWState::new();
        let (lr, mut want) = (0.01, p.clone());
        for _ in 0..5 {
            adamw.step(&mut p, &g, lr, &mut s).unwrap();
            want.zip_mut_with(&g, |w, &g| {
                *w = *w * (1.0 - lr * cfg.weight_decay) - lr * g / (g.abs() + cfg.eps)
            });
        }
        let err = (&p - &want).iter().fold(0.0f64, |a, x| a.max(x.abs()));
        assert!(err < 1e-12, "{err:e}");
        assert_eq!(s.steps(), 5);
    }

    #[test]
    fn bad_input_is_an_error_and_nothing_changes() {
        let adamw = AdamW::new(AdamWConfig::torch()).unwrap();
        let mut p = array![[1.0, 2.0], [3.0, 4.0]];
        let mut s = AdamWState::new();
        let before = p.clone();
        let cases: [(&str, Result<()>); 4] = [
            (
                "lr",
                adamw.step(&mut p, &array![[1.0, 1.0], [1.0, 1.0]], -1.0, &mut s),
            ),
            ("grad", adamw.step(&mut p, &array![[1.0, 1.0]], 0.1, &mut s)),
            (
                "grad",
                adamw.step(&mut p, &array![[1.0, f64::NAN], [0.0, 0.0]], 0.1, &mut s),
            ),
            ("p", {
                let mut q = array![[1.0, 1.0], [f64::INFINITY, 1.0]];
                adamw.step(&mut q, &array![[1.0, 1.0], [1.0, 1.0]], 0.1, &mut s)
            }),
        ];
        for (arg, r) in cases {
            let e = r.unwrap_err().to_string();
            assert!(e.contains(&format!("`{arg}`")), "{arg}: {e}");
        }
        assert_eq!(p, before);
        assert_eq!(s.steps(), 0);
        let mut other = AdamWState::from_parts(Some((array![[0.0]], array![[0.0]])), 1);
        let e = adamw
            .step(&mut p, &array![[1.0, 1.0], [1.0, 1.0]], 0.1, &mut other)
            .unwrap_err();
        assert!(
            matches!(
                e,
                OptimError::Input(InputError::ShapeMismatch { arg: "state", .. })
            ),
            "{e}"
        );
        for (field, bad) in [
            (
                "beta1",
                AdamWConfig {
                    beta1: 1.0,
                    ..AdamWConfig::torch()
                },
            ),
            (
                "beta2",
                AdamWConfig {
                    beta2: -0.1,
                    ..AdamWConfig::torch()
                },
            ),
            (
                "eps",
                AdamWConfig {
                    eps: 0.0,
                    ..AdamWConfig::torch()
                },
            ),
            (
                "weight_decay",
                AdamWConfig {
                    weight_decay: f64::NAN,
                    ..AdamWConfig::torch()
                },
            ),
        ] {
            let e = AdamW::new(bad).unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn the_config_round_trips_through_serde() {
        let cfg = AdamWConfig::torch();
        let text = serde_json::to_string(&cfg).unwrap();
        assert_eq!(serde_json::from_str::<AdamWConfig>(&text).unwrap(), cfg);
        assert!(serde_json::from_str::<AdamWConfig>(r#"{"beta1":0.9}"#).is_err());
    }
}
