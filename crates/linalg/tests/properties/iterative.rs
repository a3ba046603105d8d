//! Iterative σ_max, σ_min and κ estimates against the full SVD.

use super::common::*;
use kappa_linalg::{
    condition_number, condition_number_estimate, sigma_max_power, sigma_min_inverse,
    singular_values, IterativeOptions, SvdDriver,
};
use ndarray::Array2;
use proptest::prelude::*;

fn tight() -> IterativeOptions {
    IterativeOptions {
        tol: 1e-9,
        max_iter: 2000,
        seed: 3,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..config() })]

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
    };
    assert!(!condition_number_estimate(a.view(), opts).unwrap().converged);
    assert!(!sigma_max_power(a.view(), opts).unwrap().converged);
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
