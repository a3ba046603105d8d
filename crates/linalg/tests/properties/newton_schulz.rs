//! Newton–Schulz: cubic → polar factor, Muon's band, Polar Express, scale invariance.

use super::common::*;
use kappa_linalg::{
    newton_schulz, newton_schulz_cubic, newton_schulz_muon, polar_factor, singular_values, Matrix,
    NsSchedule, PolyStep, SvdDriver, MUON_BAND, MUON_BAND_THRESHOLD,
};
use ndarray::Array2;
use proptest::prelude::*;

fn sv(a: &Array2<f64>) -> ndarray::Array1<f64> {
    singular_values(a.view(), SvdDriver::QrIteration).unwrap()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn cubic_converges_to_the_svd_polar_factor(
        (m, n, seed) in dims(14),
        lk in 0.0f64..1.0,
        scale in prop_oneof![Just(1e-120), Just(1e-8), Just(1.0), Just(1e90)],
    ) {
        let k = m.min(n);
        let a = with_spectrum(m, n, &spectrum(k, 10f64.powf(lk), seed), seed).mapv(|x| x * scale);
        // σ_min/‖A‖_F ≥ 1/(10·√14) here, so 40 steps reach quadratic convergence.
        let q = newton_schulz_cubic(&a, 40).unwrap();
        let p = polar_factor(a.view(), SvdDriver::QrIteration).unwrap();
        prop_assert_eq!(q.dim(), (m, n));
        let e = max_abs_diff(&q, &p);
        // NS's rounding (`ns_error_bound`, Lipschitz constants of the 40 steps) + its truncation
        // (max_i |p⁴⁰(x_i) − 1|·√k, tracked by the scalar map) + the SVD polar factor's error:
        // backward error 30·max(m,n)·ε·‖A‖_F amplified by 2/σ_k (`polar_perturbation`) plus the
        // factors' loss of orthogonality (same constant). Frobenius bounds every entry.
        let sched = NsSchedule::cubic(40).unwrap();
        let (r, s_, x, _) = ns_inputs(&a, &sched);
        let trunc = x.iter().map(|&v| (sched.scalar_map(v, 1.0) - 1.0).abs()).fold(0.0, f64::max)
            * (k as f64).sqrt();
        let svd = svd_rel(m, n, f64::EPSILON);
        let tol = ns_error_bound(&sched, r, s_, &x, f64::EPSILON, 0.0)
            + trunc
            + polar_perturbation(svd, x[k - 1])
            + 2.0 * svd * (k as f64).sqrt();
        prop_assert!(e <= tol, "max |NS − UVᵀ| = {e} > {tol:e}");
    }

    #[test]
    fn muon_quintic_maps_normalized_singular_values_into_the_band(
        (m, n, seed) in (1usize..40, 1usize..40, any::<u64>()),
    ) {
        let a: Array2<f64> = gaussian(m, n, seed);
        let s = sv(&a);
        let fro = s.iter().map(|x| x * x).sum::<f64>().sqrt();
        prop_assume!(s[s.len() - 1] / fro >= MUON_BAND_THRESHOLD);
        let o = newton_schulz_muon(&a).unwrap();
        let so = sv(&o);
        // The prediction from the scalar map holds singular value by singular value.
        let sched = NsSchedule::muon();
        // The computed NS is within `ns_error_bound` (Frobenius, so by Weyl every σ) of the
        // exact map of a matrix whose normalized σ are within the SVD's error of the measured x
        // (passed as e0); measuring σ(NS) errs by 30·max(m,n)·ε·σ₁ more.
        let (r, s_, x, sv_err) = ns_inputs(&a, &sched);
        let tol = ns_error_bound(&sched, r, s_, &x, f64::EPSILON, sv_err)
            + svd_rel(m, n, f64::EPSILON) * so[0];
        for &y in so.iter() {
            prop_assert!(y >= MUON_BAND.0 - tol && y <= MUON_BAND.1 + tol, "σ = {y} outside {MUON_BAND:?} ± {tol:e}");
        }
        let mut predicted: Vec<f64> = s.iter().map(|&x| sched.scalar_map(x, fro)).collect();
        predicted.sort_by(|x, y| y.partial_cmp(x).unwrap());
        for (p, y) in predicted.iter().zip(so.iter()) {
            prop_assert!((p - y).abs() <= tol, "predicted {p}, got {y} (tol {tol:e})");
        }
    }

    #[test]
    fn newton_schulz_is_scale_invariant(
        (m, n, seed) in dims(12),
        alpha in prop_oneof![Just(1e-300), Just(1e-150), Just(1e-9), Just(1e-7), Just(3.7), Just(1e150), Just(1e300)],
    ) {
        let a: Array2<f64> = gaussian(m, n, seed);
        let b = a.mapv(|x| x * alpha);
        for sched in [NsSchedule::muon(), NsSchedule::cubic(8).unwrap(), NsSchedule::polar_express(10).unwrap()] {
            let x = newton_schulz(&a, &sched).unwrap();
            let y = newton_schulz(&b, &sched).unwrap();
            let e = max_abs_diff(&x, &y);
            // Both runs are within `ns_error_bound` of the exact map (NS rescales tiny and huge
            // inputs by exact powers of two); αA is A perturbed by its entries' rounding: u
            // relative for a normal result, and at most half the smallest subnormal 2⁻¹⁰⁷⁵ absolute
            // below that, i.e. e0 ≤ u + √(mn)·2⁻¹⁰⁷⁵/(α‖A‖_F) of the normalized input.
            let (r, s_, xs, _) = ns_inputs(&a, &sched);
            let sub = if alpha < 1.0 {
                ((m * n) as f64).sqrt() * f64::from_bits(1) / (alpha * fro(&a) * sched.normalization)
            } else {
                0.0
            };
            let tol = ns_error_bound(&sched, r, s_, &xs, f64::EPSILON, U64 + sub)
                + ns_error_bound(&sched, r, s_, &xs, f64::EPSILON, 0.0);
            prop_assert!(e <= tol, "α = {alpha}: max |NS(αA) − NS(A)| = {e} > {tol:e}");
        }
    }

    #[test]
    fn polar_express_reaches_one(
        (m, n, seed) in dims(16),
        lk in 0.0f64..2.5,
    ) {
        let k = m.min(n);
        let a = with_spectrum(m, n, &spectrum(k, 10f64.powf(lk), seed), seed);
        let o = newton_schulz(&a, &NsSchedule::polar_express(10).unwrap()).unwrap();
        // σ_min/‖A‖_F ≥ 10^{-2.5}/4 ≥ 1e-3 here: every σ ends at 1 ± 1e-6 — the documented band of
        // the scalar map (docs/linalg.md, Newton–Schulz table; `polar_express_scalar_map_claim`),
        // plus the rounding bound of the matrix iteration (with the input SVD's error as e0) and
        // the output SVD's 30·max(m,n)·ε.
        let so = sv(&o);
        let sched = NsSchedule::polar_express(10).unwrap();
        let (r, s_, x, sv_err) = ns_inputs(&a, &sched);
        let tol = 1e-6 + ns_error_bound(&sched, r, s_, &x, f64::EPSILON, sv_err)
            + svd_rel(m, n, f64::EPSILON) * so[0];
        prop_assert!(so.iter().all(|&x| (x - 1.0).abs() <= tol), "{so} (tol {tol:e})");
    }
}

#[test]
fn muon_band_from_a_dense_scalar_sweep() {
    // Measure the band of the scalar map on [threshold, 1] and check the documented constants
    // contain it tightly.
    let sched = NsSchedule::muon();
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    let n = 200_000;
    for i in 0..=n {
        let x = MUON_BAND_THRESHOLD * (1.0 / MUON_BAND_THRESHOLD).powf(i as f64 / n as f64);
        let y = sched.scalar_map(x, 1.0);
        lo = lo.min(y);
        hi = hi.max(y);
    }
    // 1e-4 is not a rounding tolerance: the documented constants are the measured extremes rounded
    // outward to four decimals (docs/linalg.md), so they lie within one unit of the 4th decimal.
    // (A grid minimum is not a proof of the continuous one; the sweep's spacing is 2.6e-5
    // relative.)
    assert!(
        lo >= MUON_BAND.0 && lo < MUON_BAND.0 + 1e-4,
        "measured lower end {lo}"
    );
    assert!(
        hi <= MUON_BAND.1 && hi > MUON_BAND.1 - 1e-4,
        "measured upper end {hi}"
    );
    // Below the threshold the map can overshoot (up to ≈ 1.2024) or stay small.
    assert!(sched.scalar_map(0.001, 1.0) < MUON_BAND.0);
    assert!(
        (0..1000)
            .map(|i| sched.scalar_map(0.0015 + 3.7e-6 * i as f64, 1.0))
            .fold(0.0, f64::max)
            > MUON_BAND.1
    );
    // a + b + c ≠ 1: the quintic does not converge to 1.
    let p = kappa_linalg::MUON_QUINTIC;
    // Two decimal additions of O(1) values: ≤ 3u·5 absolute, bounded by 1e-14.
    assert!((p.a + p.b + p.c - 0.701).abs() <= 3.0 * U64 * 5.0);
}

#[test]
fn polar_express_scalar_map_claim() {
    let sched = NsSchedule::polar_express(10).unwrap();
    for i in 0..=10_000 {
        let x = 1e-3 * (1e3f64).powf(i as f64 / 10_000.0);
        let y = sched.scalar_map(x, 1.0);
        assert!((y - 1.0).abs() <= 1e-6, "x = {x}: {y}");
    }
}

#[test]
fn zero_matrix_maps_to_zero_and_shapes_are_kept() {
    for (m, n) in [(3, 5), (5, 3), (4, 4)] {
        let z = Array2::<f64>::zeros((m, n));
        let o = newton_schulz_muon(&z).unwrap();
        assert_eq!(o, z);
        let a: Array2<f64> = gaussian(m, n, 1);
        assert_eq!(newton_schulz_muon(&a).unwrap().dim(), (m, n));
    }
}

#[test]
fn muon_differs_from_the_epsilon_normalized_reference_only_for_tiny_inputs() {
    // The Muon reference divides by ‖X‖_F + 1e-7; for ‖X‖_F = 1e-10 that shrinks X 1000-fold
    // and its output singular values fall far below the band. Ours does not.
    let a: Array2<f64> = gaussian(8, 24, 2);
    let tiny = a.mapv(|x| x * 1e-10 / a.frobenius_norm().unwrap());
    let o = newton_schulz_muon(&tiny).unwrap();
    let s = sv(&o);
    assert!(
        s.iter().all(|&x| x >= MUON_BAND.0 && x <= MUON_BAND.1),
        "{s}"
    );
    // Emulate the reference: normalize by ‖X‖_F + 1e-7, then the 5 steps.
    let mut x = tiny.mapv(|x| x / (1e-10 + 1e-7));
    let p = kappa_linalg::MUON_QUINTIC;
    for _ in 0..5 {
        let g = x.dot(&x.t());
        let b = &g * p.b + &g.dot(&g) * p.c;
        x = &x * p.a + &b.dot(&x);
    }
    let sr = sv(&x);
    assert!(
        sr[sr.len() - 1] < 0.5,
        "reference output σ_min = {}",
        sr[sr.len() - 1]
    );
}

#[test]
fn per_step_schedules_validate() {
    let a: Array2<f64> = gaussian(3, 4, 1);
    let bad = NsSchedule {
        steps: vec![PolyStep::new(f64::NAN, 0.0, 0.0)],
        normalization: 1.0,
    };
    assert!(newton_schulz(&a, &bad).is_err());
    let bad = NsSchedule {
        steps: vec![],
        normalization: 0.0,
    };
    assert!(newton_schulz(&a, &bad).is_err());
    // Zero steps: the normalized input.
    let none = NsSchedule {
        steps: vec![],
        normalization: 2.0,
    };
    // X/(2‖X‖_F): the norm (12 terms, γ₁₂ relative), the division and the re-measured norm.
    let x = newton_schulz(&a, &none).unwrap();
    assert!((x.frobenius_norm().unwrap() - 0.5).abs() <= 0.5 * (2.0 * gamma(12) + 2.0 * U64));
}
