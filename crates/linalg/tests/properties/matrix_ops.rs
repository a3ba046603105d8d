//! The matrix-trait operations manifold Muon needs (`inner`, `diagonal`, `set_diagonal`,
//! `scale_columns`, `copy_from`): their definition on `ndarray`, their shape checks, and (feature `tch`) agreement
//! of the tensor backend, including that `copy_from` and `set_diagonal` write in place.

use super::common::*;
use kappa_linalg::{InputError, LinalgError, Matrix};
use ndarray::Array2;
use proptest::prelude::*;

proptest! {
    #![proptest_config(kappa_testkit::config(24))]

    #[test]
    fn diagonal_ops_match_their_definition((m, n, seed) in (1usize..12, 1usize..12, any::<u64>())) {
        let a: Array2<f64> = gaussian(m, n, seed);
        let k = m.min(n);
        let d = Matrix::diagonal(&a).unwrap();
        prop_assert_eq!(d.len(), k);
        for (i, v) in d.iter().enumerate() {
            prop_assert_eq!(*v, a[[i, i]]);
        }
        let mut b = a.clone();
        let new: Vec<f64> = (0..k).map(|i| i as f64 - 0.5).collect();
        b.set_diagonal(&new).unwrap();
        for i in 0..m {
            for j in 0..n {
                let want = if i == j { i as f64 - 0.5 } else { a[[i, j]] };
                prop_assert_eq!(b[[i, j]], want);
            }
        }
        let s: Vec<f64> = (0..n).map(|j| 1.0 + j as f64).collect();
        let mut c = a.clone();
        c.scale_columns(&s).unwrap();
        for i in 0..m {
            for j in 0..n {
                prop_assert_eq!(c[[i, j]], a[[i, j]] * s[j]);
            }
        }
        let e: Vec<f64> = (0..m * n).map(|t| 0.5 + t as f64).collect();
        let mut h = a.clone();
        h.scale_entries(&e).unwrap();
        for i in 0..m {
            for j in 0..n {
                prop_assert_eq!(h[[i, j]], a[[i, j]] * e[i * n + j]);
            }
        }
        let b2: Array2<f64> = gaussian(m, n, seed ^ 9);
        let want: f64 = a.iter().zip(b2.iter()).map(|(x, y)| x * y).sum();
        // Two length-mn sums of the same products, each within γ_{mn}·Σ|a||b| of the exact one.
        let mag: f64 = a.iter().zip(b2.iter()).map(|(x, y)| (x * y).abs()).sum();
        prop_assert!((a.inner(&b2).unwrap() - want).abs() <= 2.0 * gamma(m * n) * mag * 1.01);
        let mut z = Array2::<f64>::zeros((m, n));
        z.copy_from(&a).unwrap();
        prop_assert_eq!(z, a);
    }
}

#[test]
fn polar_factor_and_singular_values_come_from_one_svd() {
    for (m, n) in [(7, 4), (4, 7), (5, 5)] {
        let a: Array2<f64> = gaussian(m, n, 21);
        let (q, s) = a.polar_factor_and_singular_values().unwrap();
        // The same thin SVD call and the same product U·Vᵀ on the same input: bitwise equal.
        assert_eq!(q, a.polar_factor().unwrap());
        // `singular_values` runs LAPACK without vectors (another code path): both within the
        // documented 30·max(m,n)·ε·σ₁ of the exact σ.
        let want = Matrix::singular_values(&a).unwrap();
        let tol = 2.0 * svd_rel(m, n, f64::EPSILON) * want[0];
        assert!(s.iter().zip(&want).all(|(x, y)| (x - y).abs() <= tol));
    }
}

#[test]
fn the_new_operations_check_lengths_and_shapes() {
    let mut a: Array2<f64> = gaussian(3, 4, 1);
    assert!(matches!(
        a.set_diagonal(&[1.0, 2.0]),
        Err(LinalgError::Input(InputError::ShapeMismatch {
            arg: "d",
            ..
        }))
    ));
    assert!(matches!(
        a.scale_columns(&[1.0; 3]),
        Err(LinalgError::Input(InputError::ShapeMismatch {
            arg: "s",
            ..
        }))
    ));
    assert!(matches!(
        a.scale_entries(&[1.0; 11]),
        Err(LinalgError::Input(InputError::ShapeMismatch {
            arg: "s",
            ..
        }))
    ));
    let b: Array2<f64> = gaussian(4, 3, 1);
    assert!(matches!(
        a.copy_from(&b),
        Err(LinalgError::Input(InputError::ShapeMismatch {
            arg: "src",
            ..
        }))
    ));
}

#[test]
fn transposed_arrays_keep_their_semantics() {
    // A column-major (transposed) array: the ops act on the logical matrix, not the memory.
    let a: Array2<f64> = gaussian(5, 3, 7);
    let mut t = a.clone().reversed_axes();
    t.scale_columns(&[2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    for i in 0..3 {
        for j in 0..5 {
            assert_eq!(t[[i, j]], a[[j, i]] * (2.0 + j as f64));
        }
    }
    let mut t = a.clone().reversed_axes();
    let e: Vec<f64> = (0..15).map(|x| x as f64).collect();
    t.scale_entries(&e).unwrap();
    for i in 0..3 {
        for j in 0..5 {
            assert_eq!(t[[i, j]], a[[j, i]] * e[i * 5 + j]);
        }
    }
}

#[cfg(feature = "tch")]
mod tch_agreement {
    use super::*;
    use kappa_linalg::tch_backend::{array_from_tensor, tensor_from_array};
    use tch::{Device, Kind, Tensor};

    #[test]
    fn tensor_ops_agree_and_write_in_place() {
        for (m, n) in [(5, 3), (3, 5), (4, 4)] {
            let a: Array2<f64> = gaussian(m, n, 11);
            let k = m.min(n);
            for kind in [Kind::Float, Kind::Double] {
                let t = tensor_from_array(a.view(), kind, Device::Cpu).unwrap();
                let d = Matrix::diagonal(&t).unwrap();
                let dn = Matrix::diagonal(&a).unwrap();
                // The cast to the tensor's kind rounds each entry once (u_f32 bounds both kinds).
                for (x, y) in d.iter().zip(&dn) {
                    assert!((x - y).abs() <= U32 * y.abs());
                }
                let b: Array2<f64> = gaussian(m, n, 12);
                let tb = tensor_from_array(b.view(), kind, Device::Cpu).unwrap();
                // The casts (u_f32 on each factor, 2u relative per product), then two length-mn
                // sums (f64 accumulation on both, `Matrix::inner`'s docs; γ^{f32} covers a backend
                // summing in the kind), relative to Σ|a||b|.
                let want = a.inner(&b).unwrap();
                let mag: f64 = a.iter().zip(b.iter()).map(|(x, y)| (x * y).abs()).sum();
                let g = 2.0 * U32 + gamma_u(m * n, U32) + gamma(m * n);
                assert!((Matrix::inner(&t, &tb).unwrap() - want).abs() <= g * mag * 1.01);
                // A shallow clone shares storage, as var-store parameters do.
                let mut alias: Tensor = t.shallow_clone();
                alias.set_diagonal(&vec![0.0; k]).unwrap();
                let s: Vec<f64> = (0..n).map(|j| 0.5 + j as f64).collect();
                alias.scale_columns(&s).unwrap();
                let e: Vec<f64> = (0..m * n).map(|x| 1.0 - 0.1 * x as f64).collect();
                alias.scale_entries(&e).unwrap();
                let mut want = a.clone();
                want.set_diagonal(&vec![0.0; k]).unwrap();
                want.scale_columns(&s).unwrap();
                want.scale_entries(&e).unwrap();
                // Entrywise: the casts of a, s and e and the two products, six roundings u.
                let got = array_from_tensor(&t).unwrap();
                assert!(
                    got.iter()
                        .zip(want.iter())
                        .all(|(x, y)| (x - y).abs() <= 6.0 * U32 * y.abs() * 1.01),
                    "in-place ops on {kind:?}"
                );
                let src = tensor_from_array(a.t().view(), kind, Device::Cpu)
                    .unwrap()
                    .tr();
                alias.copy_from(&src).unwrap();
                // A copy of the cast values: u_f32 relative.
                let back = array_from_tensor(&t).unwrap();
                assert!(back
                    .iter()
                    .zip(a.iter())
                    .all(|(x, y)| (x - y).abs() <= U32 * y.abs()));
            }
        }
    }

    #[test]
    fn tensor_polar_factor_and_singular_values_agree() {
        let a: Array2<f64> = gaussian(9, 5, 3);
        for kind in [Kind::Float, Kind::Double, Kind::BFloat16] {
            let t = tensor_from_array(a.view(), kind, Device::Cpu).unwrap();
            let (q, s) = t.polar_factor_and_singular_values().unwrap();
            assert_eq!(q.kind(), kind);
            let (qa, sa) = a.polar_factor_and_singular_values().unwrap();
            // The input cast (u of the kind: 2⁻⁸ for bf16, whose SVD runs in f32), both SVDs'
            // documented bound (ε of the computing type), Weyl for σ; for Q the same errors
            // amplified by 2/σ_k (`polar_perturbation`), each factor's loss of orthogonality,
            // and the output's rounding to the kind.
            let (u_in, eps) = match kind {
                Kind::BFloat16 => (2f64.powi(-8), f32::EPSILON as f64),
                Kind::Float => (U32, f32::EPSILON as f64),
                _ => (0.0, f64::EPSILON),
            };
            let (m, n) = a.dim();
            let k = m.min(n);
            let e_in = u_in * fro(&a);
            let stol = (svd_rel(m, n, eps) + svd_rel(m, n, f64::EPSILON)) * sa[0] * 1.01 + e_in;
            let qtol = polar_perturbation(stol * (k as f64).sqrt() + e_in, sa[k - 1] - stol)
                + 2.0 * stol / sa[0] * (k as f64).sqrt()
                + u_in;
            let q64 = array_from_tensor(&q.to_kind(Kind::Double)).unwrap();
            assert!(max_abs_diff(&q64, &qa) <= qtol, "{kind:?}");
            assert!(
                s.iter().zip(&sa).all(|(x, y)| (x - y).abs() <= stol),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn tensor_ops_check_lengths() {
        let a: Array2<f64> = gaussian(3, 4, 1);
        let mut t = tensor_from_array(a.view(), Kind::Float, Device::Cpu).unwrap();
        assert!(t.set_diagonal(&[1.0]).is_err());
        assert!(t.scale_columns(&[1.0; 3]).is_err());
        assert!(t.scale_entries(&[1.0; 3]).is_err());
        let u = tensor_from_array(a.t().view(), Kind::Float, Device::Cpu).unwrap();
        assert!(t.copy_from(&u).is_err());
    }
}
