//! The warmup-cosine learning-rate schedule, as a factor of each parameter group's own peak rate.
//!
//! For step index i = 0, 1, … (the (i+1)-th update), w warmup steps, S steps in all and the floor
//! m ∈ [0, 1]:
//!
//! ```text
//! f(i) = (i + 1)/(w + 1)                               i < w       linear warmup
//! f(i) = m + (1 − m)·½(1 + cos(π·(i − w)/(S − w)))     w ≤ i < S   cosine from 1 to m at step S
//! f(i) = m                                             i ≥ S
//! ```
//!
//! A parameter group whose peak learning rate is η runs step i at η·f(i) ([`WarmupCosine::lr`]):
//! an AdamW group at its lr, a Muon group at its own peak directly. With m = min_lr/lr
//! ([`WarmupCosine::from_lrs`]) the group at lr gets, after warmup,
//! lr(i) = min_lr + (lr − min_lr)·½(1 + cos(π·(i − w)/(S − w))).
//!
//! # Rounding
//!
//! [`WarmupCosine::lr`] evaluates η·f(i) as (η·(i+1))/(w+1) in warmup and as φ + c·(η − φ), with
//! the floor φ = η·m and c = ½(1 + cos(…)), after it: the order of lr(i) above. For η = lr it
//! therefore reproduces that formula bit for bit whenever fl(lr·fl(min_lr/lr)) = min_lr (true for
//! the pairs 2e-3/2e-4, 3e-3/3e-4, 1e-3/1e-4, 5e-4/1e-5 and 1/0.1; not for 6e-4/6e-5, whose floor
//! is 1 ulp off, so the rates after warmup may differ in the last bit). For another peak the
//! result equals η·f(i) up to a few roundings, as any product of η and the factor does.

use kappa_linalg::input::InputError;
use serde::{Deserialize, Serialize};

use crate::error::{check_range, Result};

/// Linear warmup, then a cosine from 1 down to `min_factor` (see the module docs).
///
/// ```
/// use kappa_optim::WarmupCosine;
/// let s = WarmupCosine::new(10, 110, 0.1)?;
/// assert_eq!(s.factor(0), 1.0 / 11.0);
/// assert_eq!(s.factor(10), 1.0);
/// assert!((s.factor(60) - 0.55).abs() < 1e-15);
/// assert_eq!(s.factor(110), 0.1);
/// // A group with its own peak: 0.02 at the end of the warmup, 0.002 from step S on.
/// assert!((s.lr(0.02, 10) - 0.02).abs() < 1e-17 && s.lr(0.02, 500) == 0.002);
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmupCosine {
    /// Linear warmup steps w (< `steps`).
    pub warmup_steps: u64,
    /// Steps S of the whole schedule (≥ 1); the cosine reaches `min_factor` at step S.
    pub steps: u64,
    /// The floor m ∈ [0, 1] of the factor (min_lr/lr).
    pub min_factor: f64,
}

impl WarmupCosine {
    /// The schedule, validated ([`WarmupCosine::validate`]).
    pub fn new(warmup_steps: u64, steps: u64, min_factor: f64) -> Result<Self> {
        let s = Self {
            warmup_steps,
            steps,
            min_factor,
        };
        s.validate()?;
        Ok(s)
    }

    /// The schedule of a reference group with peak `lr` and final `min_lr`: m = min_lr/lr (not
    /// validated; `lr` = 0 gives a NaN floor, which [`WarmupCosine::validate`] refuses).
    pub fn from_lrs(warmup_steps: u64, steps: u64, lr: f64, min_lr: f64) -> Self {
        Self {
            warmup_steps,
            steps,
            min_factor: min_lr / lr,
        }
    }

    /// Checks `steps` ≥ 1, `warmup_steps` < `steps` and `min_factor` ∈ [0, 1].
    pub fn validate(&self) -> Result<()> {
        if self.steps == 0 {
            return Err(InputError::invalid("steps", "must be ≥ 1").into());
        }
        if self.warmup_steps >= self.steps {
            return Err(InputError::invalid(
                "warmup_steps",
                format!(
                    "must be < steps = {}, found {}",
                    self.steps, self.warmup_steps
                ),
            )
            .into());
        }
        Ok(check_range("min_factor", self.min_factor, 0.0, 1.0)?)
    }

    /// The factor f(i) ∈ [0, 1] of step index `i` (0-based).
    pub fn factor(&self, i: u64) -> f64 {
        self.lr(1.0, i)
    }

    /// The learning rate `peak`·f(i) of step index `i` for a group whose peak rate is `peak`,
    /// evaluated in the order of the module docs ("Rounding").
    pub fn lr(&self, peak: f64, i: u64) -> f64 {
        let w = self.warmup_steps;
        if i < w {
            return peak * (i + 1) as f64 / (w + 1) as f64;
        }
        let floor = peak * self.min_factor;
        if i >= self.steps {
            return floor;
        }
        let ratio = (i - w) as f64 / (self.steps - w) as f64;
        let coeff = 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos());
        floor + coeff * (peak - floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference formula of the module docs, in terms of lr and min_lr.
    fn reference(s: &WarmupCosine, lr: f64, min_lr: f64, i: u64) -> f64 {
        let w = s.warmup_steps;
        if i < w {
            return lr * (i + 1) as f64 / (w + 1) as f64;
        }
        if i >= s.steps {
            return min_lr;
        }
        let ratio = (i - w) as f64 / (s.steps - w) as f64;
        let coeff = 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos());
        min_lr + coeff * (lr - min_lr)
    }

    #[test]
    fn the_reference_group_gets_the_lr_min_lr_formula_bit_for_bit_when_the_floor_is_exact() {
        for (lr, min_lr) in [
            (2e-3, 2e-4),
            (3e-3, 3e-4),
            (1e-3, 1e-4),
            (5e-4, 1e-5),
            (1.0, 0.1),
        ] {
            let s = WarmupCosine::from_lrs(7, 200, lr, min_lr);
            s.validate().unwrap();
            assert_eq!(lr * s.min_factor, min_lr);
            for i in 0..=210 {
                assert_eq!(
                    s.lr(lr, i),
                    reference(&s, lr, min_lr, i),
                    "{lr} {min_lr} step {i}"
                );
            }
        }
        // 6e-4/6e-5: the floor is one rounding off, the rates after warmup within 2 ulps.
        let (lr, min_lr) = (6e-4, 6e-5);
        let s = WarmupCosine::from_lrs(7, 200, lr, min_lr);
        for i in 0..=210 {
            let (got, want) = (s.lr(lr, i), reference(&s, lr, min_lr, i));
            assert!((got - want).abs() <= 2.0 * f64::EPSILON * want, "step {i}");
            if i < 7 {
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn the_factor_is_monotone_in_each_phase_and_scales_every_peak() {
        let s = WarmupCosine::new(5, 50, 0.1).unwrap();
        let f: Vec<f64> = (0..60).map(|i| s.factor(i)).collect();
        assert!(f[..5].windows(2).all(|w| w[0] < w[1]) && f[4] < 1.0);
        assert_eq!(f[5], 1.0);
        assert!(f[5..50].windows(2).all(|w| w[0] >= w[1]));
        assert!(f.iter().all(|&x| (0.0..=1.0).contains(&x)));
        assert!(f[50..].iter().all(|&x| x == 0.1));
        for (i, &fi) in f.iter().enumerate() {
            let lr = s.lr(0.02, i as u64);
            assert!(
                (lr - 0.02 * fi).abs() <= 4.0 * f64::EPSILON * 0.02,
                "step {i}"
            );
        }
    }

    #[test]
    fn bad_schedules_are_refused() {
        for (s, arg) in [
            (WarmupCosine::new(0, 0, 0.1), "steps"),
            (WarmupCosine::new(5, 5, 0.1), "warmup_steps"),
            (WarmupCosine::new(0, 5, 1.5), "min_factor"),
            (WarmupCosine::new(0, 5, f64::NAN), "min_factor"),
        ] {
            let e = s.unwrap_err().to_string();
            assert!(e.contains(arg), "{arg}: {e}");
        }
        assert!(WarmupCosine::from_lrs(0, 5, 0.0, 0.0).validate().is_err());
    }
}
