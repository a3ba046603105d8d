//! PSD square roots: sqrt(P)² = P and P^{-1/2} P P^{-1/2} = I.

use super::common::*;
use kappa_linalg::{condition_number, psd_inv_sqrt, psd_sqrt, RankTolerance};
use ndarray::Array2;
use proptest::prelude::*;

proptest! {
    #![proptest_config(config())]

    #[test]
    fn sqrt_squared_is_p((n, r, seed) in dims(14)) {
        // P = G Gᵀ, possibly rank-deficient (r < n).
        let g: Array2<f64> = gaussian(n, r, seed);
        let p = g.dot(&g.t());
        let s = psd_sqrt(p.view(), RankTolerance::Numpy).unwrap();
        prop_assert!(max_abs_diff(&s, &s.t().to_owned()) <= 1e-12 * fro(&s));
        let e = max_abs_diff(&s.dot(&s), &p);
        prop_assert!(e <= 100.0 * n as f64 * f64::EPSILON * fro(&p), "‖√P² − P‖ = {e}");
    }

    #[test]
    fn inverse_sqrt_whitens((n, seed) in (1usize..14, any::<u64>()), lk in 0.0f64..6.0) {
        let q = orthonormal(n, n, seed);
        let lam = spectrum(n, 10f64.powf(lk), seed);
        let p = (&q * &lam.view().insert_axis(ndarray::Axis(0))).dot(&q.t());
        let w = psd_inv_sqrt(p.view(), RankTolerance::Numpy).unwrap();
        let id = w.dot(&p).dot(&w);
        let kappa = condition_number(p.view()).unwrap();
        let e = max_abs_diff(&id, &Array2::eye(n));
        prop_assert!(e <= 100.0 * n as f64 * f64::EPSILON * kappa, "‖W P W − I‖ = {e}, κ = {kappa}");
    }
}

#[test]
fn floor_keeps_singular_inputs_finite() {
    let p = ndarray::array![[1.0f64, 1.0], [1.0, 1.0]];
    let w = psd_inv_sqrt(p.view(), RankTolerance::Numpy).unwrap();
    assert!(w.iter().all(|x| x.is_finite()));
    let w = psd_inv_sqrt(p.view(), RankTolerance::Absolute(1e-4)).unwrap();
    // Eigenvalues 2 and 0 → 1/√2 and 1/√1e-4 = 100 on the eigenvectors (1,1)/√2 and (1,−1)/√2.
    assert!((w[[0, 0]] - (0.5 / 2f64.sqrt() + 50.0)).abs() < 1e-9, "{w}");
    let z = Array2::<f64>::zeros((3, 3));
    assert!(psd_inv_sqrt(z.view(), RankTolerance::Numpy).is_err());
    assert_eq!(psd_sqrt(z.view(), RankTolerance::Numpy).unwrap(), z);
}

#[test]
fn f32_inputs() {
    let g: Array2<f32> = gaussian(6, 6, 4);
    let p = g.dot(&g.t()) + Array2::<f32>::eye(6);
    let s = psd_sqrt(p.view(), RankTolerance::Numpy).unwrap();
    assert!(max_abs_diff(&s.dot(&s), &p) <= 1e-4 * fro(&p));
}
