//! The Polar Express generator: the published table, the predicted bands (scalar map and matrix
//! iteration, f64 and f32), bad input.

use super::common::*;
use kappa_linalg::{
    condition_number, newton_schulz, singular_values, InputError, LinalgError, NsSchedule,
    PolarExpressSpec, PolyStep, SvdDriver, MAX_NS_STEPS, POLAR_EXPRESS_COEFFICIENTS,
};
use ndarray::{Array1, Array2};
use proptest::prelude::*;

/// The componentwise relative tolerance of the Remez solution p (on [lo, u], cushioned lower
/// end) between two implementations of the same algorithm: both solve the same 4×4 system
/// M·(a, b, c, E) = 1 at the equioscillation points (lo, q, r, u; q, r the critical points of
/// p). LU with partial pivoting has backward error ≤ γ₁₂ (n = 4, growth ≤ 2³ absorbed in 3n),
/// the input points carry the previous steps' rounding (≤ γ₁₂ again, at the level of these
/// differences) and the exchange stops when |ΔE| ≤ 1e-15; each run is therefore within
/// κ₂(M)·(2γ₁₂ + 1e-15) of the exact solution in the 2-norm, relative to ‖(a, b, c, E)‖; the
/// two runs differ by twice that, and component i by that times ‖sol‖/|sol_i|. The recentring
/// multiplies by a factor computed with ≤ 8 roundings: + 8u.
fn remez_tolerance(p: &PolyStep, lo: f64, u: f64, coef: f64) -> f64 {
    let disc = (9.0 * p.b * p.b - 20.0 * p.a * p.c).sqrt();
    let q = ((-3.0 * p.b - disc) / (10.0 * p.c)).sqrt();
    let r = ((-3.0 * p.b + disc) / (10.0 * p.c)).sqrt();
    let row = |x: f64, s: f64| [x, x.powi(3), x.powi(5), s];
    let m = ndarray::arr2(&[row(lo, 1.0), row(q, -1.0), row(r, 1.0), row(u, -1.0)]);
    let kappa = condition_number(m.view()).unwrap();
    let norm = (p.a * p.a + p.b * p.b + p.c * p.c + 1.0).sqrt();
    2.0 * kappa * (2.0 * gamma(12) + 1e-15) * norm / coef.abs() + 8.0 * U64
}

#[test]
fn the_generator_reproduces_the_published_table() {
    let d = PolarExpressSpec::paper(8).design().unwrap();
    let cushion = kappa_linalg::POLAR_EXPRESS_CUSHION;
    for (t, (p, q)) in d
        .polynomials
        .iter()
        .zip(POLAR_EXPRESS_COEFFICIENTS)
        .enumerate()
    {
        let (l, u) = d.design_intervals[t];
        for (mine, theirs) in [(p.a, q.a), (p.b, q.b), (p.c, q.c)] {
            // Step 7 is the converged tail: exactly the Newton–Schulz step, as published.
            let tol = if l / u >= 1.0 - 5e-6 {
                0.0
            } else {
                remez_tolerance(p, l.max(cushion * u), u, theirs)
            };
            let rel = ((mine - theirs) / theirs).abs();
            assert!(
                rel <= tol,
                "step {t}: {mine} vs {theirs}: rel {rel:e} > {tol:e}"
            );
        }
    }
    // The schedules with the safety factor: those of `NsSchedule::polar_express` for every
    // length, to the same tolerance plus the scaling's roundings (powi: ≤ 4 ulps, as there).
    for steps in [1, 5, 7, 8, 10, 12] {
        let mine = PolarExpressSpec::paper(steps).design().unwrap().schedule;
        let theirs = NsSchedule::polar_express(steps).unwrap();
        assert_eq!(mine.normalization, theirs.normalization);
        for (t, (p, q)) in mine.steps.iter().zip(&theirs.steps).enumerate() {
            let raw = d.polynomials[t.min(7)];
            let (l, u) = d.design_intervals[t.min(7)];
            for (x, y) in [(p.a, q.a), (p.b, q.b), (p.c, q.c)] {
                let tol = if t >= 7 {
                    0.0
                } else {
                    remez_tolerance(&raw, l.max(cushion * u), u, y) + 8.0 * U64
                };
                assert!(
                    ((x - y) / y).abs() <= tol,
                    "{steps} steps, step {t}: {x} vs {y}"
                );
            }
        }
    }
    // The documented claim of the paper's schedule: 1 ± 1e-6 after 10 steps on [1e-3, 1].
    assert!(PolarExpressSpec::paper(10).design().unwrap().error() < 1e-6);
}

#[test]
fn bad_specifications_are_typed_errors() {
    let ok = PolarExpressSpec::paper(5);
    let arg = |s: PolarExpressSpec| match s.design() {
        Err(LinalgError::Input(InputError::InvalidArgument { arg, .. })) => arg,
        Err(LinalgError::TooLarge { arg, .. }) => arg,
        other => panic!("{s:?}: {other:?}"),
    };
    for lower in [0.0, 1.0, -0.5, f64::NAN, f64::INFINITY] {
        assert_eq!(arg(PolarExpressSpec { lower, ..ok }), "lower");
    }
    for degree in [0, 1, 4, 7] {
        assert_eq!(arg(PolarExpressSpec { degree, ..ok }), "degree");
    }
    for steps in [0, MAX_NS_STEPS + 1] {
        assert_eq!(arg(PolarExpressSpec { steps, ..ok }), "steps");
    }
    for safety in [0.99, f64::NAN, f64::INFINITY] {
        assert_eq!(arg(PolarExpressSpec { safety, ..ok }), "safety");
    }
    for cushion in [-0.1, 1.0, f64::NAN] {
        assert_eq!(arg(PolarExpressSpec { cushion, ..ok }), "cushion");
    }
    // The first bad field in declaration order is reported.
    assert_eq!(
        arg(PolarExpressSpec {
            lower: 2.0,
            degree: 4,
            ..ok
        }),
        "lower"
    );
}

/// Log-uniform ℓ in [1e-6, 0.9], the degree, the steps and the safety factor.
fn specs() -> impl Strategy<Value = PolarExpressSpec> {
    (
        -6.0f64..-0.05,
        prop_oneof![Just(3usize), Just(5)],
        1usize..=12,
        1.0f64..1.05,
    )
        .prop_map(|(lk, degree, steps, safety)| {
            PolarExpressSpec::new(10f64.powf(lk), degree, steps, safety)
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_x_lands_in_the_predicted_band(spec in specs()) {
        let d = spec.design().unwrap();
        let sched = &d.schedule;
        let (lo, hi) = *d.bands.last().unwrap();
        let n = 400;
        let xs: Vec<f64> = (0..=n)
            .map(|i| spec.lower * (1.0 / spec.lower).powf(i as f64 / n as f64))
            .collect();
        // The computed scalar map and the computed band are each within the rounding bound of
        // the exact map (`ns_error_bound` for a 1×1 "matrix": the same products and sums, with
        // ε = 2u a factor 2 of margin), from the normalized values x/s.
        let normalized: Vec<f64> = xs.iter().map(|x| x / sched.normalization).collect();
        let tol = 2.0 * ns_error_bound(sched, 1, 1, &normalized, f64::EPSILON, 0.0);
        for &x in &xs {
            let y = sched.scalar_map(x, 1.0);
            prop_assert!(y >= lo - tol && y <= hi + tol, "x = {x}: {y} ∉ [{lo}, {hi}] ± {tol:e}");
        }
        // The band's error never exceeds the design error by more than the safety factor's
        // effect: without a safety factor they are the same numbers.
        if spec.safety == 1.0 {
            let (l, u) = *d.design_intervals.last().unwrap();
            prop_assert!((lo - l).abs() <= tol + 4.0 * U64 && (hi - u).abs() <= tol + 4.0 * U64);
        }
    }

    #[test]
    fn the_matrix_iteration_stays_in_the_band(
        (m, n, seed) in dims(14),
        lk in 0.0f64..2.5,
        steps in 3usize..=10,
    ) {
        let k = m.min(n);
        let s = spectrum(k, 10f64.powf(lk), seed);
        let a = with_spectrum(m, n, &s, seed);
        let sv_a = singular_values(a.view(), SvdDriver::QrIteration).unwrap();
        let f = fro(&a);
        // ℓ just below the smallest σ/‖A‖_F (the SVD's error included).
        let lower = (sv_a[k - 1] / f * (1.0 - 1e-9)).min(0.5);
        let d = PolarExpressSpec::new(lower, 5, steps, 1.01).design().unwrap();
        let (lo, hi) = *d.bands.last().unwrap();
        let (r, s_, x, sv_err) = ns_inputs(&a, &d.schedule);
        // f64: the rounding bound of the iteration (input SVD error as e0) + the output SVD.
        let o = newton_schulz(&a, &d.schedule).unwrap();
        let so = sv(&o);
        let tol = ns_error_bound(&d.schedule, r, s_, &x, f64::EPSILON, sv_err)
            + svd_rel(m, n, f64::EPSILON) * so[0];
        prop_assert!(so.iter().all(|&y| y >= lo - tol && y <= hi + tol), "f64 {so} ∉ [{lo}, {hi}] ± {tol:e}");
        // f32: the cast (u_f32 relative) and ε_f32 rounding.
        let o32 = newton_schulz(&a.mapv(|v| v as f32), &d.schedule).unwrap().mapv(f64::from);
        let so = sv(&o32);
        let tol = ns_error_bound(&d.schedule, r, s_, &x, f32::EPSILON as f64, sv_err + U32)
            + svd_rel(m, n, f64::EPSILON) * so[0];
        prop_assert!(so.iter().all(|&y| y >= lo - tol && y <= hi + tol), "f32 {so} ∉ [{lo}, {hi}] ± {tol:e}");
    }
}

fn sv(a: &Array2<f64>) -> Array1<f64> {
    singular_values(a.view(), SvdDriver::QrIteration).unwrap()
}
