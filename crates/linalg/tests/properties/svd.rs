//! SVD: reconstruction, ordering, orthogonality, and the two LAPACK drivers against each other.

use super::common::*;
use kappa_linalg::{singular_values, svd_full, svd_thin, Real, SvdDriver};
use ndarray::{Array1, Array2};
use proptest::prelude::*;

const DRIVERS: [SvdDriver; 2] = [SvdDriver::QrIteration, SvdDriver::DivideAndConquer];

fn check_orthonormal_cols(q: &Array2<f64>, tol: f64) -> Result<(), TestCaseError> {
    let g = q.t().dot(q);
    let e = max_abs_diff(&g, &Array2::eye(g.nrows()));
    prop_assert!(e <= tol, "QᵀQ − I = {e}");
    Ok(())
}

fn check_svd<A: Real>(m: usize, n: usize, seed: u64, kappa: f64) -> Result<(), TestCaseError> {
    let k = m.min(n);
    let a64 = with_spectrum(m, n, &spectrum(k, kappa, seed), seed);
    let a: Array2<A> = a64.mapv(A::from_f64_lossy);
    let eps = A::EPS;
    let norm_a = fro(&a);
    // The documented SVD bound (docs/linalg.md, Accuracy; `svd_rel`): 30·max(m,n)·ε.
    let p = svd_rel(m, n, eps);
    // The prescribed spectrum is σ(a64) only up to the generator's error (relative `gen_rel`,
    // absolute `gen_abs`, `spectrum_generator_error`), and the cast to A moves σ by ≤ u_A·‖A‖_F
    // (Weyl; u_A = 0 for f64, where the cast is the identity).
    let (gen_rel, gen_abs) = spectrum_generator_error(m, n, &spectrum(k, kappa, seed), seed);
    let cast = if A::EPS < 1e-10 { 0.0 } else { U32 * fro(&a64) };
    for driver in DRIVERS {
        let thin = svd_thin(a.view(), driver).unwrap();
        prop_assert_eq!(thin.u.dim(), (m, k));
        prop_assert_eq!(thin.vt.dim(), (k, n));
        // Backward stability: the residual does not depend on κ.
        let r = fro(&(&a - &thin.reconstruct().unwrap()));
        prop_assert!(r <= p * norm_a, "residual {r} ({driver:?})");
        let full = svd_full(a.view(), driver).unwrap();
        prop_assert_eq!(full.u.dim(), (m, m));
        prop_assert_eq!(full.vt.dim(), (n, n));
        let r = fro(&(&a - &full.reconstruct().unwrap()));
        prop_assert!(r <= p * norm_a, "full residual {r}");
        let s = singular_values(a.view(), driver).unwrap();
        prop_assert_eq!(s.len(), k);
        prop_assert!(s.iter().all(|&x| x >= A::zero()));
        prop_assert!(s.windows(2).into_iter().all(|w| w[0] >= w[1]));
        // Singular values are accurate to 30·max(m,n)·ε·σ₁ absolutely (relative error ≲ ε·κ_i),
        // plus the generator's and the cast's perturbation of the prescribed spectrum.
        let exact = spectrum(k, kappa, seed);
        let mut sorted = exact.to_vec();
        sorted.sort_by(|x, y| y.partial_cmp(x).unwrap());
        let s1 = sorted[0] * (1.0 + gen_rel) + gen_abs + cast;
        for (i, (&got, &want)) in s.iter().zip(sorted.iter()).enumerate() {
            let err = (got.to_f64_lossy() - want).abs();
            let tol = p * s1 + gen_rel * want + gen_abs + cast;
            prop_assert!(err <= tol, "σ_{i}: {got:?} vs {want} (tol {tol})");
        }
    }
    if A::EPS < 1e-10 {
        // Loss of orthogonality of Householder-accumulated factors: the same 30·max(m,n)·ε
        // (`svd_rel`), plus the rounding of forming QᵀQ (γ_max(m,n) per entry).
        let tol = svd_rel(m, n, f64::EPSILON) + gamma(m.max(n));
        let uf = svd_full(a64.view(), SvdDriver::QrIteration).unwrap();
        check_orthonormal_cols(&uf.u, tol)?;
        check_orthonormal_cols(&uf.vt.t().to_owned(), tol)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn svd_f64_reconstructs_sorted_nonnegative((m, n, seed) in dims(12), lk in 0.0f64..10.0) {
        check_svd::<f64>(m, n, seed, 10f64.powf(lk))?;
    }

    #[test]
    fn svd_f32_reconstructs_sorted_nonnegative((m, n, seed) in dims(12), lk in 0.0f64..4.0) {
        check_svd::<f32>(m, n, seed, 10f64.powf(lk))?;
    }

    #[test]
    fn drivers_agree_on_gaussian_matrices((m, n, seed) in dims(24)) {
        let a: Array2<f64> = gaussian(m, n, seed);
        let s1 = singular_values(a.view(), SvdDriver::QrIteration).unwrap();
        let s2 = singular_values(a.view(), SvdDriver::DivideAndConquer).unwrap();
        // Each driver is within 30·max(m,n)·ε·σ₁ of the exact σ (documented bound): twice that.
        let tol = 2.0 * svd_rel(m, n, f64::EPSILON) * s1[0];
        prop_assert!((&s1 - &s2).iter().all(|d| d.abs() <= tol), "{s1} vs {s2}");
    }
}

#[test]
fn zero_and_rank_one_matrices() {
    let z = Array2::<f64>::zeros((3, 5));
    for d in DRIVERS {
        assert_eq!(
            singular_values(z.view(), d).unwrap(),
            Array1::<f64>::zeros(3)
        );
    }
    let u = ndarray::array![[1.0f64], [2.0], [2.0]];
    let v = ndarray::array![[3.0, 4.0]];
    // uv is formed exactly (small integers); σ = (15, 0) within the SVD bound 30·3·ε·15.
    let a = u.dot(&v);
    let tol = svd_rel(3, 2, f64::EPSILON) * 15.0;
    for d in DRIVERS {
        let s = singular_values(a.view(), d).unwrap();
        assert!((s[0] - 15.0).abs() <= tol && s[1].abs() <= tol, "{s}");
    }
}

#[test]
fn graded_matrix_drivers_agree_to_relative_accuracy_of_large_values() {
    // Singular values 1 … 1e-12: both drivers get every σ to the absolute SVD bound
    // 30·max(m,n)·ε·σ₁ (documented), plus the generator's perturbation of the prescribed spectrum
    // (relative gen_rel, absolute gen_abs): the small ones to ε·σ₁ absolute, not relative.
    let s = Array1::from_shape_fn(40, |i| 10f64.powf(-12.0 * i as f64 / 39.0));
    let a = with_spectrum(60, 40, &s, 7);
    let (gen_rel, gen_abs) = spectrum_generator_error(60, 40, &s, 7);
    let q = singular_values(a.view(), SvdDriver::QrIteration).unwrap();
    let d = singular_values(a.view(), SvdDriver::DivideAndConquer).unwrap();
    for i in 0..40 {
        let tol = svd_rel(60, 40, f64::EPSILON) * (1.0 + gen_rel) + gen_rel * s[i] + gen_abs;
        assert!((q[i] - s[i]).abs() <= tol, "qr σ_{i} {} vs {}", q[i], s[i]);
        assert!((d[i] - s[i]).abs() <= tol, "dc σ_{i} {} vs {}", d[i], s[i]);
    }
}
