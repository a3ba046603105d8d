//! Properties 1–2 of docs/optim.md, "Properties → tests": msign properties (σ = 1, scale and sign invariance, = UVᵀ, skew-symmetry, zero σ),
//! the NS5 band and Polar Express to 1 ± 1e-6 (f64).

use super::common::*;
use kappa_linalg::{svd_thin, SvdDriver, MUON_BAND, MUON_QUINTIC};
use kappa_optim::{msign, Msign, Precision};
use ndarray::Array2;
use proptest::prelude::*;

fn exact(x: &Array2<f64>) -> Array2<f64> {
    msign(x, Msign::Exact, Precision::Native).unwrap()
}

proptest! {
    #![proptest_config(config(32))]

    #[test]
    fn exact_msign_is_the_polar_factor((m, n, seed) in shapes(), log_scale in -30.0f64..30.0) {
        let x = gaussian(m, n, seed);
        let q = exact(&x);
        // all σ = 1
        for s in sv(&q) {
            prop_assert!((s - 1.0).abs() <= 1e-12, "σ = {s}");
        }
        // = U Vᵀ of the SVD
        let f = svd_thin(x.view(), SvdDriver::DivideAndConquer).unwrap();
        prop_assert!(max_abs_diff(&q, &f.u.dot(&f.vt)) <= 1e-10);
        // scale invariance and oddness
        let c = 10f64.powf(log_scale);
        prop_assert!(max_abs_diff(&exact(&(&x * c)), &q) <= 1e-10);
        prop_assert!(max_abs_diff(&exact(&(-&x)), &(-&q)) <= 1e-12);
        // the same for the Newton–Schulz variants (scale invariant, odd)
        for method in [Msign::MuonQuintic, Msign::polar_express()] {
            let p = msign(&x, method, Precision::Native).unwrap();
            prop_assert!(max_abs_diff(&msign(&(&x * c), method, Precision::Native).unwrap(), &p) <= 1e-10);
            prop_assert!(max_abs_diff(&msign(&(-&x), method, Precision::Native).unwrap(), &(-&p)) <= 1e-14);
        }
    }

    #[test]
    fn msign_preserves_skew_symmetry(n in 2usize..24, seed in any::<u64>()) {
        // Odd n: the skew matrix is singular; the exact msign must keep its null direction at 0.
        let g = gaussian(n, n, seed);
        let skew = &g - &g.t();
        for method in [Msign::Exact, Msign::polar_express()] {
            let q = msign(&skew, method, Precision::Native).unwrap();
            prop_assert!(max_abs_diff(&q, &(-&q.t())) <= 1e-9, "{method:?}");
            let s = sv(&q);
            if n % 2 == 1 {
                prop_assert!(s[n - 1] <= 1e-9, "{method:?}: null σ = {}", s[n - 1]);
            }
        }
    }

    #[test]
    fn polar_express_reaches_one_and_ns5_stays_in_its_band(
        (m, n, seed) in shapes(), kappa in 1.0f64..100.0
    ) {
        // σ/‖X‖_F ≥ 1/(kappa·√k) ≥ 1e-3/… : above both thresholds for these sizes.
        let k = m.min(n);
        let s: Vec<f64> = (0..k).map(|i| kappa.powf(-(i as f64) / (k - 1).max(1) as f64)).collect();
        let x = with_spectrum(m, n, &s, seed);
        let pe = msign(&x, Msign::polar_express(), Precision::Native).unwrap();
        for v in sv(&pe) {
            prop_assert!((v - 1.0).abs() <= 1e-6, "Polar Express σ = {v}");
        }
        let ns = msign(&x, Msign::MuonQuintic, Precision::Native).unwrap();
        for v in sv(&ns) {
            prop_assert!(v >= MUON_BAND.0 - 1e-9 && v <= MUON_BAND.1 + 1e-9, "NS5 σ = {v}");
        }
    }

    #[test]
    fn newton_schulz_keeps_zero_singular_values_at_zero((m, n, seed) in shapes()) {
        let k = m.min(n);
        let mut s = vec![1.0; k];
        for v in s.iter_mut().skip(k / 2) {
            *v = 0.0;
        }
        let x = with_spectrum(m, n, &s, seed);
        for method in [Msign::Exact, Msign::MuonQuintic, Msign::polar_express()] {
            let q = msign(&x, method, Precision::Native).unwrap();
            let sq = sv(&q);
            prop_assert!(sq[k / 2..].iter().all(|v| *v <= 1e-6), "{method:?}: {sq:?}");
        }
    }
}

#[test]
fn scalar_maps_match_the_docs() {
    assert!((MUON_QUINTIC.a + MUON_QUINTIC.b + MUON_QUINTIC.c - 0.701).abs() < 1e-12);
    let pe = Msign::polar_express().schedule().unwrap();
    for i in 0..=1000 {
        let x = 10f64.powf(-3.0 + 3.0 * i as f64 / 1000.0) / 1.01;
        let y = pe.steps.iter().fold(x, |x, p| p.eval(x));
        assert!((y - 1.0).abs() <= 1e-6, "x = {x}: {y}");
    }
}

#[test]
fn the_zero_matrix_maps_to_zero() {
    let z = Array2::<f64>::zeros((4, 3));
    for method in [Msign::Exact, Msign::MuonQuintic, Msign::polar_express()] {
        assert_eq!(msign(&z, method, Precision::Native).unwrap(), z);
    }
}
