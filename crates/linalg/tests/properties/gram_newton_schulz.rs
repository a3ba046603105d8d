//! Gram Newton–Schulz: agreement with `newton_schulz` on the same schedule, the schedules' bands,
//! shapes, rank-deficient input and bad input.
//!
//! Tolerances: both iterations are within their first-order rounding bounds of the same exact
//! map (`gram_ns_error_bound`, `ns_error_bound`; docs/linalg.md, Tolerances of the tests), so
//! they differ by at most the sum. The Gram bound amplifies the rounding of each block's r×r
//! recurrence by the block's gain Π μ_M (‖Q‖₂ ≤ Π max|a + bt² + ct⁴|) and carries it through the
//! later steps by their Lipschitz constants; where it is vacuous (∞, f32 with strongly amplifying
//! schedules) the f64 comparison of the same case carries the claim.

use super::common::*;
use kappa_linalg::{
    gram_newton_schulz, newton_schulz, singular_values, InputError, LinalgError, NsSchedule,
    SvdDriver, GRAM_NS_RESTART, MUON_BAND, MUON_BAND_THRESHOLD,
};
use ndarray::{Array1, Array2};
use proptest::prelude::*;

fn sv(a: &Array2<f64>) -> Array1<f64> {
    singular_values(a.view(), SvdDriver::QrIteration).unwrap()
}

fn fro_diff<A: kappa_linalg::Real>(a: &Array2<A>, b: &Array2<A>) -> f64 {
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x.to_f64_lossy() - y.to_f64_lossy()).powi(2))
        .sum::<f64>()
        .sqrt()
}

fn schedules() -> [NsSchedule; 3] {
    [
        NsSchedule::muon(),
        NsSchedule::polar_express(10).unwrap(),
        NsSchedule::cubic(12).unwrap(),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn gram_agrees_with_newton_schulz(
        (m, n, seed) in dims(20),
        restart in prop_oneof![Just(1usize), Just(2), Just(3), Just(usize::MAX)],
    ) {
        let a: Array2<f64> = gaussian(m, n, seed);
        let a32 = a.mapv(|x| x as f32);
        for sched in schedules() {
            let (r, s_, x, _) = ns_inputs(&a, &sched);
            // f64 and f32 (the f32 input is the cast of the f64 one; both runs start from it).
            for (eps, e) in [
                (f64::EPSILON, fro_diff(&gram_newton_schulz(&a, &sched, restart).unwrap(), &newton_schulz(&a, &sched).unwrap())),
                (f32::EPSILON as f64, fro_diff(&gram_newton_schulz(&a32, &sched, restart).unwrap(), &newton_schulz(&a32, &sched).unwrap())),
            ] {
                let tol = gram_ns_error_bound(&sched, restart, r, s_, &x, eps, 0.0)
                    + ns_error_bound(&sched, r, s_, &x, eps, 0.0);
                prop_assert!(e <= tol, "{m}×{n}, restart {restart}, ε = {eps:e}: ‖GNS − NS‖_F = {e:e} > {tol:e}");
            }
        }
        // The claim is not vacuous at the default period in f64.
        let sched = NsSchedule::muon();
        let (r, s_, x, _) = ns_inputs(&a, &sched);
        prop_assert!(gram_ns_error_bound(&sched, GRAM_NS_RESTART, r, s_, &x, f64::EPSILON, 0.0) < 1e-6);
    }

    #[test]
    fn gram_muon_maps_normalized_singular_values_into_the_band(
        (m, n, seed) in (1usize..40, 1usize..40, any::<u64>()),
        restart in 1usize..=3,
    ) {
        let a: Array2<f64> = gaussian(m, n, seed);
        let s = sv(&a);
        let f = s.iter().map(|x| x * x).sum::<f64>().sqrt();
        prop_assume!(s[s.len() - 1] / f >= MUON_BAND_THRESHOLD);
        let sched = NsSchedule::muon();
        let so = sv(&gram_newton_schulz(&a, &sched, restart).unwrap());
        // As `muon_quintic_maps_normalized_singular_values_into_the_band`, with the Gram bound:
        // within it (Frobenius, so by Weyl every σ) of the exact map of a matrix whose normalized
        // σ are within the SVD's error of the measured ones (e0), plus the output SVD's error.
        // (Periods 1–3, the default and its neighbours: beyond them the worst-case bound of
        // five unrestarted quintic steps exceeds 1e-3 on some inputs and says little.)
        let (r, s_, x, sv_err) = ns_inputs(&a, &sched);
        let tol = gram_ns_error_bound(&sched, restart, r, s_, &x, f64::EPSILON, sv_err)
            + svd_rel(m, n, f64::EPSILON) * so[0];
        prop_assert!(tol < 1e-3, "vacuous bound {tol:e}");
        for &y in so.iter() {
            prop_assert!(y >= MUON_BAND.0 - tol && y <= MUON_BAND.1 + tol, "σ = {y} outside {MUON_BAND:?} ± {tol:e}");
        }
    }

    #[test]
    fn gram_polar_express_reaches_one(
        (m, n, seed) in dims(16),
        lk in 0.0f64..2.5,
        restart in 1usize..=3,
    ) {
        let k = m.min(n);
        let a = with_spectrum(m, n, &spectrum(k, 10f64.powf(lk), seed), seed);
        let sched = NsSchedule::polar_express(10).unwrap();
        let so = sv(&gram_newton_schulz(&a, &sched, restart).unwrap());
        // σ_min/‖A‖_F ≥ 1e-3 (as `polar_express_reaches_one`): the scalar map's 1 ± 1e-6, the
        // Gram bound with the input SVD's error as e0, the output SVD's error.
        let (r, s_, x, sv_err) = ns_inputs(&a, &sched);
        let tol = 1e-6 + gram_ns_error_bound(&sched, restart, r, s_, &x, f64::EPSILON, sv_err)
            + svd_rel(m, n, f64::EPSILON) * so[0];
        prop_assert!(tol < 1e-3, "vacuous bound {tol:e}");
        prop_assert!(so.iter().all(|&v| (v - 1.0).abs() <= tol), "{so} (tol {tol:e})");
    }
}

#[test]
fn shapes_are_kept_and_zero_maps_to_zero() {
    for (m, n) in [(3, 5), (5, 3), (4, 4), (1, 7), (7, 1)] {
        let z = Array2::<f64>::zeros((m, n));
        assert_eq!(gram_newton_schulz(&z, &NsSchedule::muon(), 2).unwrap(), z);
        let a: Array2<f64> = gaussian(m, n, 3);
        let g = gram_newton_schulz(&a, &NsSchedule::muon(), GRAM_NS_RESTART).unwrap();
        assert_eq!(g.dim(), (m, n));
    }
}

#[test]
fn rank_deficient_input_keeps_its_zero_singular_values() {
    // Rank 3 in 12×5, 5×12 and 6×6: the exact map keeps σ = 0 at 0 (odd polynomials), so the
    // computed σ_4.. are within the rounding bound of 0 (Weyl) plus the output SVD's error.
    for (m, n) in [(12, 5), (5, 12), (6, 6)] {
        let s = Array1::from(vec![1.0, 0.3, 0.05]);
        let a = with_spectrum(m, n, &s, 11);
        for sched in schedules() {
            for restart in [1, 2, 3] {
                let o = gram_newton_schulz(&a, &sched, restart).unwrap();
                let so = sv(&o);
                let (r, s_, mut x, _) = ns_inputs(&a, &sched);
                // The exact input has σ_4.. = 0; the measured ones are SVD noise.
                x.iter_mut().skip(3).for_each(|v| *v = 0.0);
                let (gen_rel, gen_abs) = spectrum_generator_error(m, n, &s, 11);
                let e0 = (gen_rel + gen_abs) * (r as f64).sqrt();
                let tol = gram_ns_error_bound(&sched, restart, r, s_, &x, f64::EPSILON, e0)
                    + svd_rel(m, n, f64::EPSILON) * so[0];
                assert!(tol < 1e-3, "vacuous bound {tol:e}");
                for &v in so.iter().skip(3) {
                    assert!(
                        v <= tol,
                        "{m}×{n}, restart {restart}: zero σ became {v:e} > {tol:e}"
                    );
                }
                assert!(so[2] > 0.5, "{so}");
            }
        }
    }
}

#[test]
fn bad_input_gives_typed_errors() {
    let a: Array2<f64> = gaussian(4, 3, 1);
    let sched = NsSchedule::muon();
    let arg = input_error_arg;
    assert_eq!(arg(gram_newton_schulz(&a, &sched, 0)), "restart");
    let mut nan = a.clone();
    nan[[1, 2]] = f64::NAN;
    // The first bad argument in signature order is the one reported.
    assert_eq!(arg(gram_newton_schulz(&nan, &sched, 0)), "x");
    assert_eq!(
        arg(gram_newton_schulz(&Array2::<f64>::zeros((0, 3)), &sched, 2)),
        "x"
    );
    let bad = NsSchedule {
        normalization: 0.0,
        ..NsSchedule::muon()
    };
    assert_eq!(
        arg(gram_newton_schulz(&a, &bad, 0)),
        "schedule.normalization"
    );
    let mut inf = a.mapv(|v| v as f32);
    inf[[0, 0]] = f32::INFINITY;
    assert!(matches!(
        gram_newton_schulz(&inf, &sched, 2),
        Err(LinalgError::Input(InputError::NonFinite {
            arg: "x",
            row: 0,
            col: 0,
            ..
        }))
    ));
}

#[test]
fn is_scale_invariant_over_the_whole_range() {
    // The scaling is `newton_schulz`'s (shared code): exact powers of two at the extremes, so the
    // results at 1e-300 and 1e300 are those at unit scale up to the inputs' own rounding (one u
    // relative, as e0) and both runs' rounding bounds.
    let a: Array2<f64> = gaussian(9, 4, 5);
    let sched = NsSchedule::polar_express(10).unwrap();
    let base = gram_newton_schulz(&a, &sched, GRAM_NS_RESTART).unwrap();
    let (r, s_, x, _) = ns_inputs(&a, &sched);
    let tol = gram_ns_error_bound(&sched, GRAM_NS_RESTART, r, s_, &x, f64::EPSILON, U64)
        + gram_ns_error_bound(&sched, GRAM_NS_RESTART, r, s_, &x, f64::EPSILON, 0.0);
    for alpha in [1e-300, 1e-9, 1e300] {
        let y = gram_newton_schulz(&a.mapv(|v| v * alpha), &sched, GRAM_NS_RESTART).unwrap();
        let e = fro_diff(&y, &base);
        assert!(e <= tol, "α = {alpha}: {e:e} > {tol:e}");
    }
}
