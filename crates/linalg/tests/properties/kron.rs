//! vec / Kronecker / commutation identities.

use super::common::*;
use kappa_linalg::{commutation_matrix, kron, kron_matvec, unvec, vec, Commutation};
use ndarray::Array2;
use proptest::prelude::*;

proptest! {
    #![proptest_config(config())]

    #[test]
    fn commutation_maps_vec_m_to_vec_m_transpose((m, n, seed) in dims(9)) {
        let a: Array2<f64> = gaussian(m, n, seed);
        let k = commutation_matrix::<f64>(m, n).unwrap();
        let lhs = k.dot(&vec(a.view()).unwrap());
        let rhs = vec(a.t()).unwrap();
        prop_assert_eq!(&lhs, &rhs);
        let c = Commutation::new(m, n).unwrap();
        prop_assert_eq!(c.apply(vec(a.view()).unwrap().view()).unwrap(), rhs.clone());
        prop_assert_eq!(c.apply_transpose(rhs.view()).unwrap(), vec(a.view()).unwrap());
        // Kᵀ = K_{n,m} = K⁻¹.
        prop_assert_eq!(k.t().to_owned(), commutation_matrix::<f64>(n, m).unwrap());
        prop_assert_eq!(k.t().dot(&k), Array2::<f64>::eye(m * n));
        let x: Array2<f64> = gaussian(m * n, 3, seed ^ 1);
        prop_assert_eq!(c.apply_rows(x.view()).unwrap(), k.dot(&x));
    }

    #[test]
    fn mixed_product_property(
        (p, q, seed) in dims(4),
        (r, s, t, u) in (1usize..4, 1usize..4, 1usize..4, 1usize..4),
    ) {
        // (A⊗B)(C⊗D) = AC ⊗ BD for A p×q, C q×t, B r×s, D s×u.
        let a: Array2<f64> = gaussian(p, q, seed);
        let c: Array2<f64> = gaussian(q, t, seed ^ 2);
        let b: Array2<f64> = gaussian(r, s, seed ^ 3);
        let d: Array2<f64> = gaussian(s, u, seed ^ 4);
        let lhs = kron(a.view(), b.view()).unwrap().dot(&kron(c.view(), d.view()).unwrap());
        let rhs = kron(a.dot(&c).view(), b.dot(&d).view()).unwrap();
        // Entrywise: the kron entries round once (u), the product of inner dimension q·s adds
        // γ_{qs}; on the right AC and BD add γ_q, γ_s and their kron u. All relative to the
        // same magnitude |A||C| ⊗ |B||D| = |A ⊗ B||C ⊗ D| (exact identity), computed here.
        let mag = kron(a.mapv(f64::abs).dot(&c.mapv(f64::abs)).view(), b.mapv(f64::abs).dot(&d.mapv(f64::abs)).view()).unwrap();
        let g = gamma(q * s + 2) + gamma(q + s + 1);
        for ((x, y), w) in lhs.iter().zip(rhs.iter()).zip(mag.iter()) {
            prop_assert!((x - y).abs() <= g * w * 1.01, "{x} vs {y}");
        }
    }

    #[test]
    fn vec_of_a_product_is_a_kronecker_matvec(
        (m, k, seed) in dims(5),
        (l, n) in (1usize..5, 1usize..5),
    ) {
        // vec(A M B) = (Bᵀ ⊗ A) vec(M), A m×k, M k×l, B l×n.
        let a: Array2<f64> = gaussian(m, k, seed);
        let mm: Array2<f64> = gaussian(k, l, seed ^ 5);
        let b: Array2<f64> = gaussian(l, n, seed ^ 6);
        let lhs = vec(a.dot(&mm).dot(&b).view()).unwrap();
        let bt = b.t().to_owned();
        let dense = kron(bt.view(), a.view()).unwrap().dot(&vec(mm.view()).unwrap());
        let implicit = kron_matvec(bt.view(), a.view(), vec(mm.view()).unwrap().view()).unwrap();
        // Entrywise against vec(|A||M||B|): (AM)B errs by γ_{k+l}; the dense matvec by u (kron
        // entries) + γ_{kl}; the implicit one (on exactly rescaled inputs) by γ_{k+l}.
        let mag = vec(a.mapv(f64::abs).dot(&mm.mapv(f64::abs)).dot(&b.mapv(f64::abs)).view()).unwrap();
        let g_dense = gamma(k + l) + gamma(k * l + 1);
        let g_impl = 2.0 * gamma(k + l);
        for ((x, y), w) in lhs.iter().zip(dense.iter()).zip(mag.iter()) {
            prop_assert!((x - y).abs() <= g_dense * w * 1.01);
        }
        for ((x, y), w) in lhs.iter().zip(implicit.iter()).zip(mag.iter()) {
            prop_assert!((x - y).abs() <= g_impl * w * 1.01);
        }
    }

    #[test]
    fn unvec_inverts_vec((m, n, seed) in dims(10)) {
        let a: Array2<f64> = gaussian(m, n, seed);
        prop_assert_eq!(unvec(vec(a.view()).unwrap().view(), m, n).unwrap(), a);
    }
}

#[test]
fn dense_index_convention() {
    // K[j + i·n, i + j·m] = 1.
    let (m, n) = (2, 3);
    let k = commutation_matrix::<f64>(m, n).unwrap();
    for i in 0..m {
        for j in 0..n {
            assert_eq!(k[[j + i * n, i + j * m]], 1.0);
        }
    }
    assert_eq!(k.sum(), (m * n) as f64);
    let c = Commutation::new(m, n).unwrap();
    // Row 1 = j + i·n with (i, j) = (0, 1) takes entry i + j·m = m.
    assert_eq!(c.source(1), Some(m));
    assert_eq!(c.source(m * n), None);
}

#[test]
fn implicit_commutation_for_sizes_too_large_to_store() {
    let c = Commutation::new(2000, 1500).unwrap();
    assert!(c.to_dense::<f64>().is_err());
    let v = ndarray::Array1::from_shape_fn(3_000_000, |i| i as f64);
    let w = c.apply(v.view()).unwrap();
    // Row j + i·n takes entry i + j·m.
    assert_eq!(w[7 + 3 * 1500], (3 + 7 * 2000) as f64);
}
