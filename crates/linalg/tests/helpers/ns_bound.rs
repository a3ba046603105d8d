//! The Newton–Schulz rounding bound both test binaries use (property and bad-input tests).

use kappa_linalg::NsSchedule;

/// max of f over [lo, hi] on a 2001-point grid plus `slope`·h (f's Lipschitz constant times the
/// grid spacing): an upper bound of the true maximum.
pub fn grid_max(lo: f64, hi: f64, slope: f64, f: impl Fn(f64) -> f64) -> f64 {
    let h = (hi - lo) / 2000.0;
    (0..=2000)
        .map(|i| f(lo + i as f64 * h))
        .fold(f64::NEG_INFINITY, f64::max)
        + slope * h
}

/// A first-order bound on ‖NS_computed(X) − NS_exact(X + E₀)‖_F for an r×s (wide orientation,
/// r ≤ s) input whose normalized singular values σ_i/(c‖X‖_F) are `x`, with unit `eps` (pass
/// the machine epsilon ε = 2u: a factor 2 of margin) and an initial perturbation `e0` of the
/// normalized input (Frobenius; 0 for the rounding alone). (docs/linalg.md, Tests):
///
/// Each step maps the singular values by p (tracked: `x` ← p(`x`)). As a matrix function on
/// matrices whose singular values lie in the hull H = [min x − E, max x + E], a step has the
/// Lipschitz constant L = max over H of max(|p'(t)|, |p(t)/t|) (the divided differences of an odd
/// polynomial applied to singular values, mean-value theorem). Its own rounding is at most
/// γ = (2r + s + 3)·eps·√r·(|a|ρ + |b|ρ³ + |c|ρ⁵), ρ = max H (three products of inner dimension
/// ≤ s or r; Frobenius ≤ √r·spectral). Errors propagate as E ← L·E + γ; by Weyl the computed
/// singular values stay within E of the tracked ones. The normalization X/(c‖X‖_F) errs by
/// (rs + 2)·eps relative (the norm and one scaling).
pub fn ns_error_bound(sched: &NsSchedule, r: usize, s: usize, x: &[f64], eps: f64, e0: f64) -> f64 {
    let mut x = x.to_vec();
    let hull = |x: &[f64]| {
        x.iter()
            .fold((f64::INFINITY, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)))
    };
    let mut e = e0 + (r * s + 2) as f64 * eps * hull(&x).1 * (r as f64).sqrt();
    for p in &sched.steps {
        let (a, b, c) = (p.a.abs(), p.b.abs(), p.c.abs());
        let (lo, hi) = hull(&x);
        let (l0, h0) = ((lo - e).max(0.0), hi + e);
        let d2 = 6.0 * b * h0 + 20.0 * c * h0.powi(3);
        let deriv = |t: f64| (p.a + 3.0 * p.b * t * t + 5.0 * p.c * t.powi(4)).abs();
        let ratio = |t: f64| (p.a + p.b * t * t + p.c * t.powi(4)).abs();
        let l = grid_max(l0, h0, d2, deriv).max(grid_max(l0, h0, d2, ratio));
        let g = (2 * r + s + 3) as f64
            * eps
            * (r as f64).sqrt()
            * (a * h0 + b * h0.powi(3) + c * h0.powi(5));
        e = l * e + g;
        if !e.is_finite() {
            // Vacuous (a strongly amplifying schedule on a nearly singular input): no claim.
            return f64::INFINITY;
        }
        x.iter_mut().for_each(|v| *v = p.eval(*v).abs());
    }
    e
}
