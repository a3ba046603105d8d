//! AOL-preconditioned Newton–Schulz: ‖D·X‖₂ ≤ 1, the band of the Turbo-Muon schedule, and the
//! measurements docs/linalg.md ("AOL") quotes: distance to msign(X), σ band, descent quality.

use super::common::*;
use kappa_linalg::{
    aol_gram_newton_schulz, aol_newton_schulz, newton_schulz, newton_schulz_muon, polar_factor,
    singular_values, NsSchedule, SvdDriver, GRAM_NS_RESTART, MUON_BAND,
};
use ndarray::{Array1, Array2, Axis};
use proptest::prelude::*;

fn sv(a: &Array2<f64>) -> Array1<f64> {
    singular_values(a.view(), SvdDriver::QrIteration).unwrap()
}

/// D·X in f64 for the wide orientation of `a` (rows of the r×s matrix scaled by
/// d_i = (Σ_j |(XXᵀ)_ij|)^{-1/2}), and the relative rounding δ of the computed d_i: the Gram
/// entries err by γ_s·(|X||X|ᵀ)_ij, so the row sum by γ_s·ρ_i relative, ρ_i = Σ_j(|X||X|ᵀ)_ij /
/// Σ_j|A_ij|, and the square root and division add 3u. ‖(D̃ − D)X‖_F ≤ max δ_i·‖DX‖_F ≤
/// max δ_i·√r (‖DX‖₂ ≤ 1); the exact prescaling by ‖X‖_F adds u√r. Returns (D·X, e0 per unit u)
/// — the e0 to pass to `ns_error_bound` is that times the working precision's u, doubled for
/// the bound's ε = 2u convention.
pub fn aol_reference(a: &Array2<f64>) -> (Array2<f64>, f64) {
    let x = if a.nrows() > a.ncols() {
        a.t().to_owned()
    } else {
        a.clone()
    };
    let (r, s) = x.dim();
    let g = x.dot(&x.t());
    let ax = x.mapv(f64::abs);
    let ga = ax.dot(&ax.t());
    let sums: Vec<f64> = g
        .rows()
        .into_iter()
        .map(|row| row.iter().map(|v| v.abs()).sum())
        .collect();
    let rho = ga
        .rows()
        .into_iter()
        .zip(&sums)
        .map(|(row, &t)| row.sum() / t)
        .fold(0.0f64, f64::max);
    let d = Array1::from_iter(sums.iter().map(|&t| 1.0 / t.sqrt()));
    let dx = &x * &d.view().insert_axis(Axis(1));
    (dx, (s as f64 * rho + 3.0 + 1.0) * (r as f64).sqrt())
}

/// ⟨X, O⟩/‖X‖_*: 1 for O = msign(X), the descent quality of a direction with ‖O‖₂ ≈ 1.
fn quality(x: &Array2<f64>, o: &Array2<f64>) -> f64 {
    let nuc: f64 = sv(x).sum();
    (x * o).sum() / nuc / sv(o)[0]
}

/// The schedules AOL runs with: the last 1–5 Turbo-Muon steps, and the short designed schedule.
fn schedules() -> impl Strategy<Value = NsSchedule> {
    prop_oneof![
        (1usize..=5).prop_map(|k| NsSchedule::turbo_muon(k).unwrap()),
        Just(NsSchedule::aol_three_steps().unwrap()),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn aol_lands_in_the_band_of_its_rescaled_input(
        (m, n, seed) in dims(16),
        lk in 0.0f64..3.0,
        sched in schedules(),
    ) {
        let k = m.min(n);
        let a = with_spectrum(m, n, &spectrum(k, 10f64.powf(lk), seed), seed);
        let (dx, e0u) = aol_reference(&a);
        let x = sv(&dx);
        let (r, s_) = dx.dim();
        // AOL's theorem: ‖D·X‖₂ ≤ 1 (+ the SVD's error).
        prop_assert!(x[0] <= 1.0 + svd_rel(r, s_, f64::EPSILON), "‖DX‖₂ = {}", x[0]);
        for (eps, u, to32) in [(f64::EPSILON, U64, false), (f32::EPSILON as f64, U32, true)] {
            let o = if to32 {
                aol_newton_schulz(&a.mapv(|v| v as f32), &sched).unwrap().mapv(f64::from)
            } else {
                aol_newton_schulz(&a, &sched).unwrap()
            };
            let so = sv(&o);
            // The prediction: the scalar map of σ(D·X), σ by σ, within the iteration's rounding
            // bound from the AOL error (and the f32 cast, u√r) and the SVDs' errors.
            let cast = if to32 { U32 * (r as f64).sqrt() } else { 0.0 };
            let e0 = 2.0 * e0u * u + cast + svd_rel(r, s_, f64::EPSILON);
            let tol = ns_error_bound(&sched, r, s_, &x.to_vec(), eps, e0)
                + svd_rel(m, n, f64::EPSILON) * so[0];
            let mut predicted: Vec<f64> = x.iter().map(|&v| sched.scalar_map(v, 1.0)).collect();
            predicted.sort_by(|p, q| q.partial_cmp(p).unwrap());
            for (p, y) in predicted.iter().zip(so.iter()) {
                prop_assert!((p - y).abs() <= tol, "f32 {to32}: predicted {p}, got {y} (tol {tol:e})");
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// The Gram form runs the same map of D·X: both start from the same computed D·X (shared
    /// code, bit for bit) and each is within its rounding bound of the exact map from it
    /// (`gram_ns_error_bound`, `ns_error_bound`, with the AOL rounding as input error as in
    /// `aol_lands_in_the_band_of_its_rescaled_input`), so they differ by at most the sum.
    #[test]
    fn aol_gram_agrees_with_aol_newton_schulz(
        (m, n, seed) in dims(20),
        lk in 0.0f64..2.0,
        sched in schedules(),
        restart in prop_oneof![Just(1usize), Just(2), Just(3), Just(usize::MAX)],
    ) {
        let k = m.min(n);
        let a = with_spectrum(m, n, &spectrum(k, 10f64.powf(lk), seed), seed);
        let (dx, e0u) = aol_reference(&a);
        let x = sv(&dx).to_vec();
        let (r, s_) = dx.dim();
        let a32 = a.mapv(|v| v as f32);
        for (eps, u, e) in [
            (f64::EPSILON, U64, max_abs_diff(
                &aol_gram_newton_schulz(&a, &sched, restart).unwrap(),
                &aol_newton_schulz(&a, &sched).unwrap())),
            (f32::EPSILON as f64, U32, max_abs_diff(
                &aol_gram_newton_schulz(&a32, &sched, restart).unwrap(),
                &aol_newton_schulz(&a32, &sched).unwrap())),
        ] {
            let e0 = 2.0 * e0u * u + svd_rel(r, s_, f64::EPSILON);
            let tol = gram_ns_error_bound(&sched, restart, r, s_, &x, eps, e0)
                + ns_error_bound(&sched, r, s_, &x, eps, e0);
            prop_assert!(e <= tol, "{m}×{n}, restart {restart}, ε = {eps:e}: max |Δ| = {e:e} > {tol:e}");
        }
        // The claim is not vacuous at the default period in f64.
        let e0 = 2.0 * e0u * U64 + svd_rel(r, s_, f64::EPSILON);
        let bound = gram_ns_error_bound(&sched, GRAM_NS_RESTART, r, s_, &x, f64::EPSILON, e0);
        prop_assert!(bound < 1e-6, "vacuous bound {bound:e}");
    }
}

#[test]
fn aol_gram_checks_its_arguments_in_order() {
    let a: Array2<f64> = gaussian(4, 9, 1);
    let sched = NsSchedule::turbo_muon(4).unwrap();
    let arg = input_error_arg;
    assert_eq!(arg(aol_gram_newton_schulz(&a, &sched, 0)), "restart");
    let mut nan = a.clone();
    nan[[2, 3]] = f64::NAN;
    assert_eq!(arg(aol_gram_newton_schulz(&nan, &sched, 0)), "x");
    let bad = NsSchedule {
        normalization: 0.0,
        ..sched.clone()
    };
    assert_eq!(
        arg(aol_gram_newton_schulz(&a, &bad, 0)),
        "schedule.normalization"
    );
    // Shapes kept, zero to zero, a zero row stays zero (as the plain form).
    for (m, n) in [(3, 8), (8, 3), (5, 5), (1, 6)] {
        let z = Array2::<f64>::zeros((m, n));
        assert_eq!(aol_gram_newton_schulz(&z, &sched, 2).unwrap(), z);
        let g: Array2<f64> = gaussian(m, n, 2);
        assert_eq!(aol_gram_newton_schulz(&g, &sched, 2).unwrap().dim(), (m, n));
    }
    let mut b: Array2<f64> = gaussian(4, 11, 5);
    b.row_mut(1).fill(0.0);
    let ob = aol_gram_newton_schulz(&b, &sched, GRAM_NS_RESTART).unwrap();
    assert!(ob.row(1).iter().all(|&v| v == 0.0));
}

#[test]
fn aol_is_scale_invariant_and_keeps_zero() {
    let a: Array2<f64> = gaussian(6, 9, 3);
    let sched = NsSchedule::turbo_muon(4).unwrap();
    let o = aol_newton_schulz(&a, &sched).unwrap();
    for alpha in [1e-300, 1e-9, 7.0, 1e300] {
        let p = aol_newton_schulz(&a.mapv(|v| v * alpha), &sched).unwrap();
        // Both are within the rounding bound of the same exact map (the scaled input is exact
        // for powers of ten only to u relative per entry, inside e0).
        let (dx, e0u) = aol_reference(&a);
        let x = sv(&dx).to_vec();
        let tol = 2.0 * ns_error_bound(&sched, 6, 9, &x, f64::EPSILON, 2.0 * e0u * U64 + U64);
        assert!(max_abs_diff(&o, &p) <= tol, "α = {alpha}");
    }
    let z = Array2::<f64>::zeros((4, 7));
    assert_eq!(aol_newton_schulz(&z, &sched).unwrap(), z);
    // A zero row stays zero.
    let mut b: Array2<f64> = gaussian(4, 7, 5);
    b.row_mut(2).fill(0.0);
    let ob = aol_newton_schulz(&b, &sched).unwrap();
    assert!(ob.row(2).iter().all(|&v| v == 0.0));
}

/// The measurements of docs/linalg.md ("AOL"), printed with `--nocapture`; the assertions pin
/// the documented ranges (they are measurements, not rounding tolerances).
#[test]
fn aol_measurements() {
    let turbo = NsSchedule::turbo_muon(4).unwrap();
    for (name, kappa) in [("gaussian", None), ("ill-conditioned κ=1e4", Some(1e4))] {
        let (m, n) = (96, 256);
        let a: Array2<f64> = match kappa {
            None => gaussian(m, n, 11),
            Some(kp) => with_spectrum(m, n, &spectrum(m, kp, 11), 11),
        };
        let exact = polar_factor(a.view(), SvdDriver::QrIteration).unwrap();
        let (dx, _) = aol_reference(&a);
        let exact_dx = polar_factor(dx.view(), SvdDriver::QrIteration).unwrap();
        let aol = aol_newton_schulz(&a, &turbo).unwrap();
        let ns5 = newton_schulz_muon(&a).unwrap();
        let pe = newton_schulz(&a, &NsSchedule::polar_express(5).unwrap()).unwrap();
        let spec = |o: &Array2<f64>| sv(o).to_vec();
        let dist = fro(&(&exact_dx - &exact)) / fro(&exact);
        let band = |o: &Array2<f64>| {
            let s = spec(o);
            (s[s.len() - 1], s[0])
        };
        println!(
            "{name}: ‖msign(DX) − msign(X)‖_F/‖msign(X)‖_F = {dist:.4}; σ band AOL×4 {:?}, NS5 {:?}, PE×5 {:?}; quality msign(DX) {:.4}, AOL×4 {:.4}, NS5 {:.4}, PE×5 {:.4}",
            band(&aol), band(&ns5), band(&pe),
            quality(&a, &exact_dx), quality(&a, &aol), quality(&a, &ns5), quality(&a, &pe)
        );
        // The documented measurements (docs/linalg.md, "AOL"), to their printed digits.
        let (dist_doc, q_dx_doc, q_aol_doc) = if kappa.is_none() {
            (0.0089, 1.0000, 0.9661)
        } else {
            (0.1171, 0.9928, 0.8702)
        };
        assert!((dist - dist_doc).abs() < 1e-4, "{name}: {dist}");
        assert!((quality(&a, &exact_dx) - q_dx_doc).abs() < 1e-4);
        assert!((quality(&a, &aol) - q_aol_doc).abs() < 1e-4);
        // AOL×4 beats NS5 in band and quality on both inputs; NS5 stays in its documented band
        // on the Gaussian (σ_min/‖X‖_F ≥ 0.0052 there).
        assert!(quality(&a, &aol) > quality(&a, &ns5));
        if kappa.is_none() {
            let (lo, hi) = band(&aol);
            assert!(lo > 0.97 && hi < 1.04, "{lo} {hi}");
            let (lo, hi) = band(&ns5);
            assert!(lo >= MUON_BAND.0 && hi <= MUON_BAND.1);
        }
    }
}

/// The short schedule against Muon's quintic ×5 and Turbo ×4 (docs/linalg.md, "AOL": the
/// table is this test's output with `--nocapture`): descent quality ⟨X, O⟩/(‖X‖_*·σ_max(O)),
/// the σ band of O, on seeded Gaussian and ill-conditioned inputs, square and tall, f64. The
/// assertions are the claims the docs make (measurements, not rounding tolerances): a higher
/// quality than five quintic steps on every input, and σ_max(O) within the design's predicted
/// 1 + e₃ (e₃ = 0.036 from `PolarExpressSpec::design`, plus 10⁻⁶ for the rounding of a
/// three-step f64 map of σ ≤ 1).
#[test]
fn aol_short_measurements() {
    let short = NsSchedule::aol_three_steps().unwrap();
    let design = kappa_linalg::PolarExpressSpec::new(
        kappa_linalg::AOL_SHORT_LOWER,
        5,
        kappa_linalg::AOL_SHORT_STEPS,
        1.0,
    )
    .design()
    .unwrap();
    let turbo = NsSchedule::turbo_muon(4).unwrap();
    println!("| input | quality: NS5 | Turbo ×4 | short ×3 | σ band: NS5 | Turbo ×4 | short ×3 |");
    for (m, n) in [(256, 256), (512, 512), (96, 256), (384, 768)] {
        for kappa in [None, Some(1e4)] {
            let a: Array2<f64> = match kappa {
                None => gaussian(m, n, 7),
                Some(kp) => with_spectrum(m, n, &spectrum(m.min(n), kp, 7), 7),
            };
            let band = |o: &Array2<f64>| {
                let s = sv(o);
                (s[s.len() - 1], s[0])
            };
            let ns5 = newton_schulz_muon(&a).unwrap();
            let t4 = aol_newton_schulz(&a, &turbo).unwrap();
            let s3 = aol_newton_schulz(&a, &short).unwrap();
            let q = [quality(&a, &ns5), quality(&a, &t4), quality(&a, &s3)];
            let b = [band(&ns5), band(&t4), band(&s3)];
            let input = kappa.map_or("Gaussian".to_string(), |k| format!("κ = {k:e}"));
            println!(
                "| {m}×{n} {input} | {:.3} | {:.3} | {:.3} | [{:.4}, {:.3}] | [{:.4}, {:.3}] | [{:.4}, {:.3}] |",
                q[0], q[1], q[2], b[0].0, b[0].1, b[1].0, b[1].1, b[2].0, b[2].1
            );
            assert!(
                q[2] > q[0],
                "{m}×{n} {input}: short {} vs NS5 {}",
                q[2],
                q[0]
            );
            assert!(
                b[2].1 <= 1.0 + design.error() + 1e-6,
                "{m}×{n} {input}: {}",
                b[2].1
            );
        }
    }
    assert!((design.error() - 0.036).abs() < 5e-4, "{}", design.error());
}
