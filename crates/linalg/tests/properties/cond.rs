//! Condition numbers: κ ≥ 1, scale invariance, κ(Q) = 1, the rank rule.

use super::common::*;
use kappa_linalg::{
    condition_number, condition_number_with, conditioning, numerical_rank, pseudo_condition_number,
    singular_values, RankTolerance, SvdDriver,
};
use ndarray::{Array1, Array2};
use proptest::prelude::*;

proptest! {
    #![proptest_config(config())]

    #[test]
    fn kappa_at_least_one_and_scale_invariant(
        (m, n, seed) in dims(16),
        lk in 0.0f64..8.0,
        alpha in prop_oneof![Just(1e-150), Just(-3.7), Just(1e150), Just(2.0), 1e-3f64..1e3],
    ) {
        let k = m.min(n);
        let a = with_spectrum(m, n, &spectrum(k, 10f64.powf(lk), seed), seed);
        let kappa = condition_number(a.view()).unwrap();
        prop_assert!(kappa >= 1.0);
        let scaled = a.mapv(|x| x * alpha);
        let ks = condition_number(scaled.view()).unwrap();
        // Scaling rounds every entry once (relative u; entries stay normal here), a perturbation
        // of ‖E‖₂ ≤ u·‖αA‖_F; each SVD errs by ≤ 30·max(m,n)·ε·σ₁ (documented). So every σ of
        // the two computations differs (in A's units) by δ ≤ 2·30·max(m,n)·ε·σ₁ + u·‖A‖_F, and
        // κ's ratio by ≤ (1 + δ/σ₁)/(1 − δ/σ_k) − 1.
        let s = singular_values(a.view(), SvdDriver::QrIteration).unwrap();
        let d = 2.0 * svd_rel(m, n, f64::EPSILON) * s[0] + U64 * fro(&a);
        let tol = (1.0 + d / s[0]) / (1.0 - d / s[k - 1]) - 1.0;
        prop_assert!((ks - kappa).abs() <= tol * kappa, "κ(αA) = {ks}, κ(A) = {kappa}");
        // With full rank, the pseudo condition number is κ.
        let c = conditioning(a.view(), RankTolerance::Numpy).unwrap();
        prop_assert_eq!(c.rank, k);
        prop_assert_eq!(c.pseudo_kappa, c.kappa);
    }

    #[test]
    fn orthonormal_matrices_have_kappa_one((m, n, seed) in dims(20)) {
        let (big, small) = (m.max(n), m.min(n));
        let q = orthonormal(big, small, seed);
        let q = if m >= n { q } else { q.t().to_owned() };
        let kappa = condition_number(q.view()).unwrap();
        // σ(Q) ⊂ [1 − e, 1 + e], e = ‖QᵀQ − I‖₂ (measured, `orthonormality`: σ² are QᵀQ's
        // eigenvalues, |σ − 1| ≤ |σ² − 1|), and the SVD errs by 30·max(m,n)·ε·σ₁ (documented).
        let e = orthonormality(&if m >= n { q.clone() } else { q.t().to_owned() })
            + svd_rel(m, n, f64::EPSILON) * 1.01;
        let tol = (1.0 + e) / (1.0 - e) - 1.0;
        prop_assert!((kappa - 1.0).abs() <= tol, "κ(Q) = {kappa} (tol {tol:e})");
    }

    #[test]
    fn rank_deficient_matrices_have_infinite_kappa_and_finite_pseudo_kappa(
        (m, n, seed) in (3usize..16, 3usize..16, any::<u64>()),
        r in 1usize..3,
    ) {
        let l: Array2<f64> = gaussian(m, r, seed);
        let rr: Array2<f64> = gaussian(r, n, seed.wrapping_add(9));
        let a = l.dot(&rr);
        let c = conditioning(a.view(), RankTolerance::Numpy).unwrap();
        prop_assert_eq!(c.rank, r);
        prop_assert_eq!(c.kappa, f64::INFINITY);
        prop_assert!(c.pseudo_kappa.is_finite() && c.pseudo_kappa >= 1.0);
        prop_assert_eq!(numerical_rank(a.view(), RankTolerance::Numpy).unwrap(), r);
        prop_assert_eq!(pseudo_condition_number(a.view(), RankTolerance::Numpy).unwrap(), c.pseudo_kappa);
    }
}

#[test]
fn zero_matrix_is_rank_zero_with_infinite_kappas() {
    let z = Array2::<f64>::zeros((4, 3));
    let c = conditioning(z.view(), RankTolerance::Numpy).unwrap();
    assert_eq!(
        (c.rank, c.kappa, c.pseudo_kappa),
        (0, f64::INFINITY, f64::INFINITY)
    );
    assert_eq!(condition_number(z.view()).unwrap(), f64::INFINITY);
}

#[test]
fn tolerance_variants_follow_the_rule() {
    // A diagonal matrix is its own SVD in LAPACK's arithmetic too: the Householder reflector of
    // a vector with zero tail is the identity (dlarfg: τ = 0), ?bdsqr splits at zero
    // off-diagonals, and the power-of-two scaling is exact. So σ̂ are the entries and
    // κ̂ = fl(1/fl(1e-9)), within 2u relative of 1e9 (the entry's and the division's rounding);
    // the same for κ⁺ = fl(1/fl(1e-3)).
    let a = Array2::from_diag(&Array1::from(vec![1.0f64, 1e-3, 1e-9]));
    assert!((condition_number(a.view()).unwrap() - 1e9).abs() <= 2.0 * U64 * 1e9);
    assert_eq!(
        condition_number_with(a.view(), RankTolerance::Relative(1e-6)).unwrap(),
        f64::INFINITY
    );
    assert!(
        (pseudo_condition_number(a.view(), RankTolerance::Relative(1e-6)).unwrap() - 1e3).abs()
            <= 2.0 * U64 * 1e3
    );
    assert_eq!(
        numerical_rank(a.view(), RankTolerance::Absolute(1e-2)).unwrap(),
        1
    );
    // numpy's rule in f32: τ = σ₁·3·2⁻²³ ≈ 3.6e-7.
    let b = Array2::from_diag(&Array1::from(vec![1.0f32, 1e-5, 1e-7]));
    assert_eq!(numerical_rank(b.view(), RankTolerance::Numpy).unwrap(), 2);
    assert_eq!(condition_number(b.view()).unwrap(), f32::INFINITY);
}

#[test]
fn softmax_jacobian_pseudo_condition_number() {
    // J = diag(p) − ppᵀ has rank T − 1 (J·1 = 0); κ⁺ is finite, κ is infinite.
    let p = [0.1, 0.2, 0.3, 0.4];
    let j = Array2::from_shape_fn(
        (4, 4),
        |(i, k)| if i == k { p[i] } else { 0.0 } - p[i] * p[k],
    );
    let c = conditioning(j.view(), RankTolerance::Numpy).unwrap();
    assert_eq!(c.rank, 3);
    assert_eq!(c.kappa, f64::INFINITY);
    assert!(c.pseudo_kappa.is_finite() && c.pseudo_kappa > 1.0);
}
