//! Iterative σ_max, σ_min and κ estimates against the full SVD.

use super::common::*;
use kappa_linalg::{
    condition_number, condition_number_estimate, sigma_max_power, sigma_min_inverse,
    singular_values, IterativeOptions, StopRule, SvdDriver,
};
use ndarray::{Array1, Array2, ShapeBuilder};
use proptest::prelude::*;

fn tight() -> IterativeOptions {
    IterativeOptions {
        tol: 1e-9,
        max_iter: 2000,
        seed: 3,
        ..Default::default()
    }
}

fn estimate_rule(tol: f64) -> IterativeOptions {
    IterativeOptions {
        tol,
        stop: StopRule::ErrorEstimate,
        ..Default::default()
    }
}

/// `s` with its `c` largest values replaced by a cluster of relative width `w` just below s[0],
/// and its `c` smallest by one just above s[k−1] (σ sorted descending).
fn clustered(s: &Array1<f64>, c: usize, w: f64) -> Array1<f64> {
    let k = s.len();
    let c = c.min(k / 2);
    let mut out = s.clone();
    for i in 0..c {
        let t = i as f64 / c as f64;
        out[i] = s[0] * (1.0 - w * t);
        out[k - 1 - i] = s[k - 1] * (1.0 + w * t);
    }
    out
}

/// The relative error |κ̂ − κ|/κ of the estimate under `opts`, with the estimate.
fn kappa_error(a: &Array2<f64>, opts: IterativeOptions) -> (f64, kappa_linalg::KappaEstimate<f64>) {
    let exact = condition_number(a.view()).unwrap();
    let e = condition_number_estimate(a.view(), opts).unwrap();
    ((e.kappa - exact).abs() / exact, e)
}

proptest! {
    #![proptest_config(kappa_testkit::config(24))]

    #[test]
    fn lanczos_kappa_matches_svd_from_below((m, n, seed) in (1usize..60, 1usize..20, any::<u64>()), lk in 0.0f64..4.0) {
        let k = m.min(n);
        let a = with_spectrum(m, n, &spectrum(k, 10f64.powf(lk), seed), seed);
        let exact = condition_number(a.view()).unwrap();
        let e = condition_number_estimate(a.view(), IterativeOptions::default()).unwrap();
        prop_assert!(e.converged, "{e:?}");
        prop_assert!(e.kappa <= exact * (1.0 + 1e-9), "κ̂ = {} > κ = {exact}", e.kappa);
        prop_assert!((e.kappa - exact).abs() <= 2e-3 * exact, "κ̂ = {}, κ = {exact}", e.kappa);
    }

    #[test]
    fn error_estimate_rule_finds_singular_values_to_the_requested_tolerance(
        (m, n, seed) in (2usize..48, any::<u64>()).prop_flat_map(|(n, seed)| (n..(6 * n).max(n + 1), Just(n), Just(seed))),
        lk in 0.0f64..4.0,
        family in 0usize..3,
        tol in prop::sample::select(vec![1e-2, 1e-3, 1e-4]),
    ) {
        // Graded (log-uniform σ, κ up to 1e4), Gaussian, and clustered extremes (three σ within
        // relative width tol/4 at both ends, κ up to 1e4).
        let k = m.min(n);
        let a = match family {
            0 => with_spectrum(m, n, &spectrum(k, 10f64.powf(lk), seed), seed),
            1 => gaussian(m, n, seed),
            _ => with_spectrum(m, n, &clustered(&spectrum(k, 10f64.powf(lk), seed), 3, tol / 4.0), seed),
        };
        let exact = condition_number(a.view()).unwrap();
        let e = condition_number_estimate(a.view(), estimate_rule(tol)).unwrap();
        prop_assert!(e.converged && e.error_estimate <= tol, "{e:?}");
        prop_assert!(e.kappa <= exact * (1.0 + 1e-9), "κ̂ = {} > κ = {exact}", e.kappa);
        // The two Ritz values it stopped at are singular values of A to the requested relative
        // accuracy (together). That they are the *extreme* ones is what no Krylov method can
        // promise (misconvergence, see the docs); the Gaussian test below checks κ itself.
        let sv = singular_values(a.view(), SvdDriver::QrIteration).unwrap();
        let distance = |t: f64| sv.iter().map(|s| (s - t).abs() / t).fold(f64::INFINITY, f64::min);
        let found = distance(e.sigma_max) + distance(e.sigma_min);
        prop_assert!(found <= tol, "distance {found:.2e} > tol {tol:e}: {e:?}");
    }

    #[test]
    fn power_and_inverse_iteration_find_extreme_singular_values((m, n, seed) in (1usize..40, 1usize..12, any::<u64>())) {
        // A gap between σ₁ and σ₂ (and σ_k and σ_{k−1}) keeps the linear convergence fast.
        let k = m.min(n);
        let mut s = spectrum(k, 10.0, seed);
        s[0] = 2.0;
        if k > 1 {
            s[k - 1] = 0.05;
        }
        let a = with_spectrum(m, n, &s, seed);
        let sv = singular_values(a.view(), SvdDriver::QrIteration).unwrap();
        let p = sigma_max_power(a.view(), tight()).unwrap();
        prop_assert!(p.converged);
        prop_assert!((p.value - sv[0]).abs() <= 1e-8 * sv[0], "{} vs {}", p.value, sv[0]);
        let q = sigma_min_inverse(a.view(), tight()).unwrap();
        prop_assert!(q.converged);
        prop_assert!((q.value - sv[k - 1]).abs() <= 1e-8 * sv[0], "{} vs {}", q.value, sv[k - 1]);
    }
}

#[test]
fn tall_gaussian_estimate_is_within_one_percent() {
    let a: Array2<f64> = gaussian(2048, 128, 11);
    let exact = condition_number(a.view()).unwrap();
    let e = condition_number_estimate(a.view(), IterativeOptions::default()).unwrap();
    assert!(
        e.converged && (e.kappa - exact).abs() <= 1e-2 * exact,
        "{e:?} vs {exact}"
    );
    assert!(e.iterations < 128, "{e:?}");
    // Wide inputs are handled through the transpose.
    let w = a.t().to_owned();
    let ew = condition_number_estimate(w.view(), IterativeOptions::default()).unwrap();
    assert!((ew.kappa - exact).abs() <= 1e-2 * exact, "{ew:?}");
}

#[test]
fn rank_deficient_and_zero_inputs() {
    let l: Array2<f64> = gaussian(30, 3, 1);
    let r: Array2<f64> = gaussian(3, 8, 2);
    let a = l.dot(&r);
    let e = condition_number_estimate(a.view(), IterativeOptions::default()).unwrap();
    assert_eq!(e.kappa, f64::INFINITY, "{e:?}");
    let q = sigma_min_inverse(a.view(), IterativeOptions::default()).unwrap();
    assert!(
        q.value <= 1e-10 * sigma_max_power(a.view(), tight()).unwrap().value,
        "{q:?}"
    );
    let z = Array2::<f64>::zeros((5, 4));
    assert_eq!(
        condition_number_estimate(z.view(), IterativeOptions::default())
            .unwrap()
            .kappa,
        f64::INFINITY
    );
    assert_eq!(
        sigma_max_power(z.view(), IterativeOptions::default())
            .unwrap()
            .value,
        0.0
    );
    assert_eq!(
        sigma_min_inverse(z.view(), IterativeOptions::default())
            .unwrap()
            .value,
        0.0
    );
}

#[test]
fn iteration_cap_reports_no_convergence() {
    let a: Array2<f64> = gaussian(200, 200, 5);
    let opts = IterativeOptions {
        tol: 1e-12,
        max_iter: 3,
        seed: 0,
        ..Default::default()
    };
    assert!(!condition_number_estimate(a.view(), opts).unwrap().converged);
    assert!(!sigma_max_power(a.view(), opts).unwrap().converged);
    // The error-estimate rule reports non-convergence the same way, with its estimate above tol.
    let capped = IterativeOptions {
        max_iter: 5,
        ..estimate_rule(1e-3)
    };
    let e = condition_number_estimate(a.view(), capped).unwrap();
    assert!(
        !e.converged && e.iterations == 5 && e.error_estimate > 1e-3,
        "{e:?}"
    );
    // A square Gaussian's σ_min sits at a dense edge: 40 steps are far from 1 %.
    let e = condition_number_estimate(
        a.view(),
        IterativeOptions {
            max_iter: 40,
            ..estimate_rule(1e-2)
        },
    )
    .unwrap();
    let (err, _) = kappa_error(
        &a,
        IterativeOptions {
            max_iter: 40,
            ..estimate_rule(1e-2)
        },
    );
    assert!(
        !e.converged && err > 1e-2 && e.error_estimate > 1e-2,
        "{e:?}, error {err}"
    );
}

#[test]
fn error_estimate_rule_stops_earlier_than_the_residual_rule() {
    let a: Array2<f64> = gaussian(2048, 128, 11);
    let (err_r, r) = kappa_error(
        &a,
        IterativeOptions {
            tol: 1e-2,
            ..Default::default()
        },
    );
    let (err_e, e) = kappa_error(&a, estimate_rule(1e-2));
    assert!(r.converged && e.converged, "{r:?} {e:?}");
    assert!(e.iterations < r.iterations, "{e:?} vs {r:?}");
    assert!(err_e <= 1e-2 && err_r <= 1e-2, "{err_e} {err_r}");
    // The estimate is above the true error (it is meant to be, with some margin).
    assert!(e.error_estimate >= err_e, "{e:?} vs {err_e}");
    // A complete Krylov space is exact: estimate 0.
    let small: Array2<f64> = gaussian(30, 4, 2);
    let s = condition_number_estimate(small.view(), estimate_rule(1e-12)).unwrap();
    assert!(
        s.converged && s.error_estimate == 0.0 && s.iterations <= 4,
        "{s:?}"
    );
}

#[test]
fn huge_and_tiny_scales() {
    let a: Array2<f64> = gaussian(40, 10, 8);
    let k = condition_number(a.view()).unwrap();
    for alpha in [1e-200, 1e200] {
        let b = a.mapv(|x| x * alpha);
        let e = condition_number_estimate(b.view(), IterativeOptions::default()).unwrap();
        assert!((e.kappa - k).abs() <= 2e-3 * k, "α = {alpha}: {e:?}");
        let p = sigma_max_power(b.view(), tight()).unwrap();
        assert!(p.value.is_finite() && p.value > 0.0);
    }
}

#[test]
fn one_pass_and_two_pass_products_give_the_same_estimate() {
    // A row-major tall A takes the fused one-pass step (Aᵀu_j recombined from AᵀA v_j); the same
    // matrix stored column-major takes two passes. Same Krylov space: same steps and κ̂, also for
    // ill-conditioned inputs where the fused step falls back to a direct product.
    for (lk, seed) in [(0.5, 1u64), (3.0, 2), (6.0, 3)] {
        let (m, n) = (400, 60);
        let a = with_spectrum(m, n, &spectrum(n, 10f64.powf(lk), seed), seed);
        let mut col_major = Array2::<f64>::zeros(a.raw_dim().f());
        col_major.assign(&a);
        assert!(a.is_standard_layout() && !col_major.is_standard_layout());
        for opts in [IterativeOptions::default(), estimate_rule(1e-2)] {
            let fused = condition_number_estimate(a.view(), opts).unwrap();
            let plain = condition_number_estimate(col_major.view(), opts).unwrap();
            assert_eq!(fused.iterations, plain.iterations, "{fused:?} vs {plain:?}");
            assert!(
                (fused.kappa - plain.kappa).abs() <= 1e-10 * plain.kappa,
                "κ = 1e{lk}: {fused:?} vs {plain:?}"
            );
        }
    }
}
