//! Fitting the geometric rate μ of a sequence v_t ≈ C μ^t by least squares on log v_t.
//!
//! ```text
//! log v_t = a + t·log μ + noise;   slope = Σ(t − t̄)(ℓ_t − ℓ̄) / Σ(t − t̄)²,   μ = e^{slope}
//! se(slope) = √(Σ residual² / (m − 2) / Σ(t − t̄)²)
//! ```

use serde::{Deserialize, Serialize};

/// A fitted geometric rate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateFit {
    /// μ = exp(slope), the per-step contraction factor.
    pub mu: f64,
    /// The slope log μ.
    pub log_mu: f64,
    /// Standard error of the slope (0 with two points).
    pub std_err: f64,
    /// R² of the log-linear fit (1 when the points are exactly geometric).
    pub r_squared: f64,
    /// Number of points used.
    pub points: usize,
}

/// Fits v_t ≈ C μ^t to `(t, v_t)` pairs. Points that are not finite and positive are skipped;
/// `None` with fewer than two usable points or a single distinct t.
///
/// ```
/// use kappa_optim::convergence::geometric_rate;
/// let pts: Vec<(f64, f64)> = (0..30).map(|t| (t as f64, 3.0 * 0.8f64.powi(t))).collect();
/// let fit = geometric_rate(&pts).unwrap();
/// assert!((fit.mu - 0.8).abs() < 1e-12 && fit.r_squared > 0.999_999);
/// ```
pub fn geometric_rate(points: &[(f64, f64)]) -> Option<RateFit> {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .filter(|(t, v)| t.is_finite() && v.is_finite() && *v > 0.0)
        .map(|&(t, v)| (t, v.ln()))
        .collect();
    let m = pts.len();
    if m < 2 {
        return None;
    }
    let tm = pts.iter().map(|p| p.0).sum::<f64>() / m as f64;
    let lm = pts.iter().map(|p| p.1).sum::<f64>() / m as f64;
    let stt: f64 = pts.iter().map(|p| (p.0 - tm).powi(2)).sum();
    if stt <= 0.0 {
        return None;
    }
    let stl: f64 = pts.iter().map(|p| (p.0 - tm) * (p.1 - lm)).sum();
    let slope = stl / stt;
    let sse: f64 = pts
        .iter()
        .map(|p| (p.1 - lm - slope * (p.0 - tm)).powi(2))
        .sum();
    let sll: f64 = pts.iter().map(|p| (p.1 - lm).powi(2)).sum();
    let std_err = if m > 2 {
        (sse / (m - 2) as f64 / stt).sqrt()
    } else {
        0.0
    };
    let r_squared = if sll > 0.0 { 1.0 - sse / sll } else { 1.0 };
    Some(RateFit {
        mu: slope.exp(),
        log_mu: slope,
        std_err,
        r_squared,
        points: m,
    })
}

/// The running fit over the last `window` values.
#[derive(Clone, Debug)]
pub(crate) struct RateTracker {
    window: usize,
    values: std::collections::VecDeque<f64>,
}

impl RateTracker {
    pub(crate) fn new(window: usize) -> Self {
        Self {
            window,
            values: std::collections::VecDeque::with_capacity(window),
        }
    }

    /// Adds v_t; returns μ fitted over the window once it is full of positive finite values.
    pub(crate) fn push(&mut self, v: f64) -> Option<f64> {
        if self.values.len() == self.window {
            self.values.pop_front();
        }
        self.values.push_back(v);
        if self.values.len() < self.window || !self.values.iter().all(|x| x.is_finite() && *x > 0.0)
        {
            return None;
        }
        let pts: Vec<(f64, f64)> = self
            .values
            .iter()
            .enumerate()
            .map(|(i, &x)| (i as f64, x))
            .collect();
        geometric_rate(&pts).map(|f| f.mu)
    }
}
