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
        // S = fl(QD·Qᵀ): S_ij and S_ji are two length-n sums of the same products rounded in a
        // different order, each within γ_{n+1}·Σ_k|q_ik||q_jk|d_k ≤ γ_{n+1}·√λ_max·(1 + e_Q) of
        // the exact value (Cauchy–Schwarz on unit rows): 2γ_{n+1}·‖S‖₂, ‖S‖₂ ≤ ‖S‖_F.
        prop_assert!(max_abs_diff(&s, &s.t().to_owned()) <= 2.0 * gamma(n + 1) * 1.01 * fro(&s));
        // ?syevd's backward error (P = QΛQᵀ + E) and loss of orthogonality of Q (twice: S² =
        // QΛ^{½}QᵀQΛ^{½}Qᵀ), each 30·n·ε·‖P‖ — a choice, the documented SVD constant; the
        // rounding of forming S (2γ_{n+1}‖S‖², as above, in S·S twice) and of S·S (γ_n‖S‖_F²);
        // clipping eigenvalues in [−τ, 0) to 0 moves P by ≤ τ = n·ε·λ_max (the Numpy rule).
        let e = max_abs_diff(&s.dot(&s), &p);
        let sf = fro(&s);
        let tol = 3.0 * svd_rel(n, n, f64::EPSILON) * fro(&p)
            + (4.0 * gamma(n + 1) + gamma(n)) * sf * sf
            + n as f64 * f64::EPSILON * fro(&p);
        prop_assert!(e <= tol, "‖√P² − P‖ = {e} > {tol:e}");
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
        // W = fl(QΛ^{-½}Qᵀ) with P = QΛQᵀ + E: W·E·W ≤ ‖E‖/λ_min (E: ?syevd's backward error,
        // 30·n·ε·‖P‖, the documented constant as a choice), Q's loss of orthogonality entering
        // W P W twice on each side (≤ 4·30·n·ε·κ), W's own rounding (2·2γ_{n+1}·κ, as for S in
        // `sqrt_squared_is_p`) and the two products (γ_n·|W||P||W| ≤ 2γ_n·n·κ): all ×κ, κ = κ(P)
        // (no eigenvalue is floored: λ_min = 1/κ ≥ 1e-6 ≫ τ = n·ε·λ_max).
        let tol = (5.0 * svd_rel(n, n, f64::EPSILON) + 4.0 * gamma(n + 1) + 2.0 * n as f64 * gamma(n)) * kappa;
        prop_assert!(e <= tol, "‖W P W − I‖ = {e} > {tol:e}, κ = {kappa}");
    }
}

#[test]
fn floor_keeps_singular_inputs_finite() {
    let p = ndarray::array![[1.0f64, 1.0], [1.0, 1.0]];
    let w = psd_inv_sqrt(p.view(), RankTolerance::Numpy).unwrap();
    assert!(w.iter().all(|x| x.is_finite()));
    let w = psd_inv_sqrt(p.view(), RankTolerance::Absolute(1e-4)).unwrap();
    // Eigenvalues 2 and 0 → 1/√2 and 1/√1e-4 = 100 on the eigenvectors (1,1)/√2 and (1,−1)/√2.
    // The computed 0 is below 1e-4 (it is within 30·2·ε·2 of 0), so it is floored to 1e-4
    // exactly; W₀₀ = Σ q₀ₖ²/√λ_k errs by the eigenvectors' error (30·2·ε, the SVD constant as
    // a choice) twice, times the largest factor 100, plus γ₃ of the sum: bound ×100.
    let tol = (2.0 * svd_rel(2, 2, f64::EPSILON) + gamma(3)) * 100.0 * 1.01;
    assert!((w[[0, 0]] - (0.5 / 2f64.sqrt() + 50.0)).abs() <= tol, "{w}");
    let z = Array2::<f64>::zeros((3, 3));
    assert!(psd_inv_sqrt(z.view(), RankTolerance::Numpy).is_err());
    assert_eq!(psd_sqrt(z.view(), RankTolerance::Numpy).unwrap(), z);
}

#[test]
fn f32_inputs() {
    let g: Array2<f32> = gaussian(6, 6, 4);
    let p = g.dot(&g.t()) + Array2::<f32>::eye(6);
    let s = psd_sqrt(p.view(), RankTolerance::Numpy).unwrap();
    // `sqrt_squared_is_p`'s bound in f32 (ε_32, u_32), on f32 data (P formed in f32 is the input).
    let e32 = f32::EPSILON as f64;
    let (pf, sf) = (fro(&p), fro(&s));
    let tol = 3.0 * svd_rel(6, 6, e32) * pf
        + (4.0 * gamma_u(7, U32) + gamma_u(6, U32)) * sf * sf
        + 6.0 * e32 * pf;
    assert!(max_abs_diff(&s.dot(&s), &p) <= tol);
}
