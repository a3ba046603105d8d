//! The Newton–Schulz rounding bound both test binaries use (property and bad-input tests).

use kappa_linalg::{NsSchedule, PolyStep};

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
        let l = step_lipschitz(p, l0, h0);
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

/// The Lipschitz constant of one step p as a matrix function on matrices whose singular values lie
/// in [l0, h0]: max(|p'(t)|, |p(t)/t|) there (see [`ns_error_bound`]), by [`grid_max`] with the
/// slope bound 6|b|h0 + 20|c|h0³ of both.
pub fn step_lipschitz(p: &PolyStep, l0: f64, h0: f64) -> f64 {
    let (b, c) = (p.b.abs(), p.c.abs());
    let d2 = 6.0 * b * h0 + 20.0 * c * h0.powi(3);
    let deriv = |t: f64| (p.a + 3.0 * p.b * t * t + 5.0 * p.c * t.powi(4)).abs();
    let ratio = |t: f64| (p.a + p.b * t * t + p.c * t.powi(4)).abs();
    grid_max(l0, h0, d2, deriv).max(grid_max(l0, h0, d2, ratio))
}

/// Upper bounds, over t ∈ [0, h], of |p(t)| (the step's image), |p(t)/t| = |a + bt² + ct⁴|
/// (the spectral norm of M = a·I + b·R + c·R² when R's eigenvalues are t² ≤ h²) and
/// |bt² + ct⁴| (that of B = M − a·I), by [`grid_max`] with slope bounds of each.
fn step_ranges(p: &PolyStep, h: f64) -> (f64, f64, f64) {
    let (a, b, c) = (p.a.abs(), p.b.abs(), p.c.abs());
    let d_image = a + 3.0 * b * h * h + 5.0 * c * h.powi(4);
    let d_ratio = 2.0 * b * h + 4.0 * c * h.powi(3);
    let image = grid_max(0.0, h, d_image, |t| p.eval(t).abs());
    let m = grid_max(0.0, h, d_ratio, |t| {
        (p.a + p.b * t * t + p.c * t.powi(4)).abs()
    });
    let bpart = grid_max(0.0, h, d_ratio, |t| (p.b * t * t + p.c * t.powi(4)).abs());
    (image, m, bpart)
}

/// A first-order bound on ‖GNS_computed(X) − NS_exact(X + E₀)‖_F for Gram Newton–Schulz with
/// restart period `restart` (arguments as [`ns_error_bound`]; docs/linalg.md, Tests).
///
/// Between restarts the exact block maps X to Q·X with Q = f(G), G = XXᵀ; the computed block
/// differs by (i) the initial perturbation carried through the block's exact map (Lipschitz
/// constants of its steps, as in [`ns_error_bound`]) and (ii) its own rounding, bounded by
/// tracking Frobenius errors e_R, e_M, e_Q of R, M = a·I + B, Q against their exact values, whose
/// spectral norms are bounded by ρ_R = ρ² (ρ ≥ |P_j(t)|, the iterate's range), μ_M ≥ |p(t)/t| and
/// μ_Q = Π μ_M (all over t ∈ [0, ρ], [`step_ranges`]):
///
/// * G = fl(XXᵀ): e_R = s·eps·‖X‖_F² ≤ s·eps·r·ρ² (inner dimension s, γ_s ≤ s·eps with eps = 2u);
/// * M̃ = m(R̃) + rounding: m(R̃) − m(R) = b·ΔR + c·(R̃² − R²), so
///   e_M ≤ |b|·e_R + |c|·((ρ_R + e_R)² − ρ_R²) + (r + 2)·eps·(|c|·F_R² + |b|·F_R) + eps·√r·μ̄_M;
/// * Q ← a·Q + B·Q: e_Q ← (μ_M + e_M)(μ_Q + e_Q) − μ_M·μ_Q + (r + 2)·eps·(F_B + |a|)·F_Q
///   (the first step of a block sets Q = M̃, e_Q = e_M);
/// * R ← M·R·M (two products): e_R ← (μ_M + e_M)²(ρ_R + e_R) − μ_M²ρ_R
///   + (r + 2)·eps·(F_B + |a|)·(F_R + F_T), F_T = √r·(μ_M + e_M)(ρ_R + e_R) bounding T = M·R;
/// * Q·X: e ← e_Q·ρ_X + (r + 1)·eps·F_Q·F_X;
///
/// with F_Y = √r·(bound + error) the Frobenius bounds of the computed Y (Frobenius ≤ √r·spectral;
/// a product's rounding is ≤ γ_k·|A||B| entrywise, ≤ γ_k·‖A‖_F‖B‖_F in Frobenius). A perturbed
/// product expands into terms with at least one error factor, each bounded by the product of
/// norms, whence the (μ + e)(ν + f) − μν forms.
pub fn gram_ns_error_bound(
    sched: &NsSchedule,
    restart: usize,
    r: usize,
    s: usize,
    x: &[f64],
    eps: f64,
    e0: f64,
) -> f64 {
    let sq = (r as f64).sqrt();
    let hi0 = x.iter().fold(0.0f64, |h, &v| h.max(v));
    let mut e = e0 + (r * s + 2) as f64 * eps * hi0 * sq;
    let mut x = x.to_vec();
    for block in sched.steps.chunks(restart.max(1)) {
        let hull = x
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)));
        // (i) the carried error through the block's exact map, (ii) its own rounding.
        let mut carried = e;
        let rho_x = hull.1 + e;
        // ‖X̃‖_F ≤ ‖x‖₂ + e; fl(XXᵀ) errs by γ_s·|X||X|ᵀ, ≤ γ_s·‖X̃‖_F² in Frobenius.
        let f_x = norm2(&x) + e;
        let (mut rho, mut e_r) = (rho_x, s as f64 * eps * f_x * f_x);
        let (mut mu_q, mut e_q) = (1.0, 0.0);
        for (j, p) in block.iter().enumerate() {
            let (lo, hi) = x
                .iter()
                .fold((f64::INFINITY, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)));
            // ‖R‖_F ≤ ‖X_j‖_F·‖X_j‖₂ for the exact iterate of X̃, ‖X_j‖_F ≤ ‖x_j‖₂ + carried.
            let f_r = (norm2(&x) + carried) * rho + e_r;
            carried *= step_lipschitz(p, (lo - carried).max(0.0), hi + carried);
            x.iter_mut().for_each(|v| *v = p.eval(*v).abs());
            let (a, b, c) = (p.a.abs(), p.b.abs(), p.c.abs());
            let (image, mu_m, mu_b) = step_ranges(p, rho);
            let rho_r = rho * rho;
            let e_m = b * e_r
                + c * ((rho_r + e_r).powi(2) - rho_r * rho_r)
                + (r + 2) as f64 * eps * (c * f_r * f_r + b * f_r)
                + eps * sq * (mu_m + b * e_r + c * e_r * (2.0 * rho_r + e_r));
            let f_b = sq * (mu_b + e_m);
            if j == 0 {
                e_q = e_m;
            } else {
                let f_q = sq * (mu_q + e_q);
                e_q = (mu_m + e_m) * (mu_q + e_q) - mu_m * mu_q
                    + (r + 2) as f64 * eps * (f_b + a) * f_q;
            }
            mu_q *= mu_m;
            let f_t = (mu_m + e_m) * f_r;
            e_r = (mu_m + e_m).powi(2) * (rho_r + e_r) - mu_m * mu_m * rho_r
                + (r + 2) as f64 * eps * (f_b + a) * (f_r + f_t);
            rho = image;
        }
        let f_q = sq * (mu_q + e_q);
        e = carried + e_q * rho_x + (r + 1) as f64 * eps * f_q * f_x;
        if !e.is_finite() {
            return f64::INFINITY;
        }
    }
    e
}

fn norm2(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum::<f64>().sqrt()
}
