//! `Matrix::gram` and `Matrix::gram_add` (BLAS `syrk` where the layout allows, a general product
//! elsewhere): exactly symmetric, and within the dot-product bound of the f64 product on every
//! memory layout; on `tch` (feature), CPU tensors of every kind in both orientations are within
//! the same bound (bf16 with its own roundoff).
//!
//! The tolerance: every entry of α·X·Xᵀ + β·C is one length-k dot product plus one product and one
//! sum, so |fl − exact| ≤ γ_{k+2}·(|α|·(|X||X|ᵀ)_ij + |β|·|c_ij|) in the working precision
//! (Higham §3.5, with the two extra roundings counted as two more terms); the reference is
//! computed in f64 from the same (rounded) inputs, whose own error is below f32's γ by 2⁻²⁹.

use super::common::*;
use kappa_linalg::{Matrix, Real};
use ndarray::{Array2, ShapeBuilder};
use proptest::prelude::*;

/// The memory layouts a caller's matrix may have.
#[derive(Clone, Copy, Debug)]
enum Layout {
    RowMajor,
    ColumnMajor,
    /// Every other column of a wider matrix: no unit stride, so the general product.
    Strided,
}

const LAYOUTS: [Layout; 3] = [Layout::RowMajor, Layout::ColumnMajor, Layout::Strided];

fn with_layout<A: Real>(x: &Array2<A>, layout: Layout) -> Array2<A> {
    let (m, n) = x.dim();
    match layout {
        Layout::RowMajor => x.clone(),
        Layout::ColumnMajor => {
            let mut c = Array2::zeros((m, n).f());
            c.assign(x);
            c
        }
        Layout::Strided => {
            let mut wide = Array2::zeros((m, 2 * n));
            for j in 0..n {
                wide.column_mut(2 * j).assign(&x.column(j));
            }
            // An owned array keeps its strides when sliced in place.
            wide.slice_collapse(ndarray::s![.., ..;2]);
            wide
        }
    }
}

fn to64<A: Real>(a: &Array2<A>) -> Array2<f64> {
    a.mapv(|v| v.to_f64_lossy())
}

/// Checks `got` = α·X·Xᵀ + β·C (C symmetric) to the bound of the module docs, and exact symmetry.
fn check<A: Real>(
    got: &Array2<A>,
    x: &Array2<A>,
    alpha: f64,
    c: &Array2<A>,
    beta: f64,
) -> Result<(), String> {
    let (x, c, got) = (to64(x), to64(c), to64(got));
    let (m, k) = x.dim();
    let exact = alpha * x.dot(&x.t()) + beta * &c;
    let mag =
        alpha.abs() * x.mapv(f64::abs).dot(&x.mapv(f64::abs).t()) + beta.abs() * c.mapv(f64::abs);
    let g = gamma_u(k + 2, A::EPS / 2.0);
    for i in 0..m {
        for j in 0..m {
            if got[[i, j]] != got[[j, i]] {
                return Err(format!("not symmetric at ({i}, {j})"));
            }
            let err = (got[[i, j]] - exact[[i, j]]).abs();
            if err > g * mag[[i, j]] {
                return Err(format!(
                    "({i}, {j}): error {err:e} above γ·|·| = {:e}",
                    g * mag[[i, j]]
                ));
            }
        }
    }
    Ok(())
}

fn symmetric<A: Real>(m: usize, seed: u64) -> Array2<A> {
    let a: Array2<A> = gaussian(m, m, seed);
    let s = &a + &a.t();
    s.as_standard_layout().into_owned()
}

fn check_all<A: Real>(m: usize, n: usize, seed: u64) -> Result<(), String> {
    let x0: Array2<A> = gaussian(m, n, seed);
    let c = symmetric::<A>(m, seed ^ 7);
    for layout in LAYOUTS {
        let x = with_layout(&x0, layout);
        let at = |e: String| format!("{} {layout:?} {m}×{n}: {e}", A::NAME);
        check(&x.gram().unwrap(), &x, 1.0, &c, 0.0).map_err(at)?;
        check(&x.gram_add(-0.7, &c, 1.3).unwrap(), &x, -0.7, &c, 1.3).map_err(at)?;
        check(&x.gram_add(2.0, &c, 0.0).unwrap(), &x, 2.0, &c, 0.0).map_err(at)?;
    }
    // The Newton–Schulz use: b·A + c·A·A for a symmetric A (A·A = A·Aᵀ).
    let a = x0.gram().unwrap();
    check(
        &a.gram_add(2.0315, &a, -4.7750).unwrap(),
        &a,
        2.0315,
        &a,
        -4.7750,
    )
    .map_err(|e| format!("{} polynomial part {m}: {e}", A::NAME))?;
    check(
        &a.symmetric_square_add(2.0315, -4.7750).unwrap(),
        &a,
        2.0315,
        &a,
        -4.7750,
    )
    .map_err(|e| format!("{} symmetric_square_add {m}: {e}", A::NAME))
}

proptest! {
    #![proptest_config(kappa_testkit::config(32))]

    #[test]
    fn symmetric_products_are_symmetric_and_within_the_dot_product_bound((m, n, seed) in dims(40)) {
        check_all::<f32>(m, n, seed).map_err(TestCaseError::fail)?;
        check_all::<f64>(m, n, seed).map_err(TestCaseError::fail)?;
    }
}

#[test]
fn symmetric_products_at_blas_sized_shapes() {
    // Past the mirror's 64-wide tiles and BLAS's blocking, one and two threads alike.
    for (m, n) in [(130, 70), (70, 300), (257, 257)] {
        check_all::<f32>(m, n, 5).unwrap();
        check_all::<f64>(m, n, 6).unwrap();
    }
}

#[test]
fn gram_add_checks_the_shape_of_c() {
    let x: Array2<f64> = gaussian(3, 5, 1);
    let wrong: Array2<f64> = gaussian(3, 4, 2);
    let e = x.gram_add(1.0, &wrong, 1.0).unwrap_err();
    assert!(e.to_string().contains('c'), "{e}");
}

#[test]
fn symmetric_square_add_needs_a_square_matrix() {
    let x: Array2<f64> = gaussian(3, 5, 1);
    let e = x.symmetric_square_add(1.0, 1.0).unwrap_err();
    assert!(e.to_string().contains("self"), "{e}");
}

#[cfg(feature = "tch")]
mod tensors {
    use super::*;
    use kappa_linalg::tch_backend::{array_from_tensor, tensor_from_array};
    use tch::{Device, Kind, Tensor};

    fn tensor(a: &Array2<f64>, kind: Kind) -> Tensor {
        tensor_from_array(a.view(), kind, Device::Cpu).unwrap()
    }

    /// The precision (2·unit roundoff) `check_eps` takes for a kind; bf16: 8 significant bits.
    fn precision_of(kind: Kind) -> f64 {
        match kind {
            Kind::Float => f32::EPSILON as f64,
            Kind::Double => f64::EPSILON,
            _ => 2f64.powi(-7),
        }
    }

    /// A tensor's Gram products against the ndarray backend's on the same (rounded) values, for
    /// the tensor as stored and for a transposed view of its transpose (column-major).
    fn agree(m: usize, n: usize, seed: u64, kind: Kind) -> Result<(), String> {
        let x64: Array2<f64> = gaussian(m, n, seed);
        let c64 = symmetric::<f64>(m, seed ^ 3);
        let (x, c) = (tensor(&x64, kind), tensor(&c64, kind));
        let column_major = tensor(&x64.t().to_owned(), kind).tr();
        assert_eq!(column_major.stride(), vec![1, m as i64]);
        for view in [&x, &column_major] {
            let xr: Array2<f64> = array_from_tensor(view).unwrap();
            let cr: Array2<f64> = array_from_tensor(&c).unwrap();
            for (alpha, beta) in [(1.0, 0.0), (-0.7, 1.3)] {
                let got = view.gram_add(alpha, &c, beta).unwrap();
                assert_eq!(got.kind(), kind);
                let got: Array2<f64> = array_from_tensor(&got).unwrap();
                let eps = precision_of(kind);
                // Exact symmetry is `syrk`'s, which f32/f64 tensors take through libtorch's MKL
                // or, without it, only with one thread on each side (tests/syrk_tensors.rs checks
                // those cases, exact symmetry included, in a process of its own).
                check_eps(&got, &xr, alpha, &cr, beta, eps, false)
                    .map_err(|e| format!("{kind:?} {m}×{n} strides {:?}: {e}", view.stride()))?;
            }
            let g: Array2<f64> = array_from_tensor(&view.gram().unwrap()).unwrap();
            let want = xr.dot(&xr.t());
            let err = (&g - &want).iter().fold(0.0f64, |a, v| a.max(v.abs()));
            let bound = match kind {
                Kind::BFloat16 => 2f64.powi(-6) * (n as f64 + 2.0),
                Kind::Float => gamma_u(n + 2, U32),
                _ => gamma_u(n + 2, U64),
            } * xr
                .mapv(f64::abs)
                .dot(&xr.mapv(f64::abs).t())
                .iter()
                .fold(0.0f64, |a, v| a.max(*v));
            if err > bound {
                return Err(format!("{kind:?} gram {m}×{n}: {err:e} > {bound:e}"));
            }
        }
        Ok(())
    }

    /// [`check`] for f64 data with the precision `eps` (2·unit roundoff) of the computation;
    /// exact symmetry only where asked.
    pub(crate) fn check_eps(
        got: &Array2<f64>,
        x: &Array2<f64>,
        alpha: f64,
        c: &Array2<f64>,
        beta: f64,
        eps: f64,
        symmetric_exactly: bool,
    ) -> Result<(), String> {
        let (m, k) = x.dim();
        let exact = alpha * x.dot(&x.t()) + beta * c;
        let mag = alpha.abs() * x.mapv(f64::abs).dot(&x.mapv(f64::abs).t())
            + beta.abs() * c.mapv(f64::abs);
        // bf16 results are rounded once more on output: one more unit of its roundoff.
        let g = gamma_u(k + 3, eps / 2.0);
        for i in 0..m {
            for j in 0..m {
                if symmetric_exactly && got[[i, j]] != got[[j, i]] {
                    return Err(format!("not symmetric at ({i}, {j})"));
                }
                let err = (got[[i, j]] - exact[[i, j]]).abs();
                if err > g * mag[[i, j]] {
                    return Err(format!("({i}, {j}): error {err:e} > {:e}", g * mag[[i, j]]));
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(kappa_testkit::config(24))]

        #[test]
        fn tensor_symmetric_products_agree_with_the_bound((m, n, seed) in dims(24)) {
            for kind in [Kind::Float, Kind::Double] {
                agree(m, n, seed, kind).map_err(TestCaseError::fail)?;
            }
        }
    }

    /// b·A + c·A² of a symmetric tensor A (Newton–Schulz's polynomial part) by
    /// `symmetric_square_add` against the f64 product of the same rounded entries, within the
    /// bound of `check_eps` (A·A = A·Aᵀ, so the dot-product bound is the same); with more than
    /// one thread the f32/f64 tensors take the general product too (`syrk` needs one on each
    /// side), so this covers the path libtorch computes.
    fn square_agrees(m: usize, seed: u64, kind: Kind) -> Result<(), String> {
        let a64 = symmetric::<f64>(m, seed);
        let a = tensor(&a64, kind);
        let ar: Array2<f64> = array_from_tensor(&a).unwrap();
        for (alpha, beta) in [(2.0315, -4.7750), (1.0, 0.0), (-0.7, 1.3)] {
            let got = a.symmetric_square_add(alpha, beta).unwrap();
            assert_eq!(got.kind(), kind);
            let got: Array2<f64> = array_from_tensor(&got).unwrap();
            check_eps(&got, &ar, alpha, &ar, beta, precision_of(kind), false)
                .map_err(|e| format!("{kind:?} {m}² (α {alpha}, β {beta}): {e}"))?;
        }
        Ok(())
    }

    #[test]
    fn tensor_symmetric_squares_agree_with_the_bound() {
        for kind in [Kind::Float, Kind::Double, Kind::BFloat16] {
            // bf16: the bound with bf16's roundoff is defined (k·u < ½) up to k ≈ 60 only.
            let largest = if kind == Kind::BFloat16 { 33 } else { 130 };
            for (m, seed) in [(1, 1), (7, 2), (33, 3), (130, 4)] {
                if m <= largest {
                    square_agrees(m, seed, kind).unwrap();
                }
            }
        }
        let wide = tensor(&gaussian::<f64>(3, 5, 1), Kind::Float);
        let e = wide.symmetric_square_add(1.0, 1.0).unwrap_err();
        assert!(e.to_string().contains("self"), "{e}");
    }

    /// Wide CPU bf16 matrices of ≥ 768 rows take the row-block Gram (`syrk` module docs): exactly
    /// symmetric, and each entry one bf16 rounding of an f32 dot product, so within
    /// γ_s(f32)·(|X||X|ᵀ)_ij + u_bf16·|fl32_ij| of the exact product of the rounded entries
    /// (u_bf16 = 2⁻⁸, |fl32_ij| ≤ |exact_ij| + γ_s(f32)·(|X||X|ᵀ)_ij); 800 rows leave a last
    /// block of 32.
    #[test]
    fn wide_bf16_grams_are_exactly_symmetric_and_within_the_f32_accumulation_bound() {
        for (m, n, seed) in [(768, 1536, 21), (800, 2400, 22)] {
            let x = tensor(&gaussian::<f64>(m, n, seed), Kind::BFloat16);
            let xr: Array2<f64> = array_from_tensor(&x).unwrap();
            let got: Array2<f64> = array_from_tensor(&x.gram().unwrap()).unwrap();
            let exact = xr.dot(&xr.t());
            let mag = xr.mapv(f64::abs).dot(&xr.mapv(f64::abs).t());
            let g = gamma_u(n, U32);
            for i in 0..m {
                for j in 0..m {
                    assert_eq!(got[[i, j]], got[[j, i]], "{m}×{n}: ({i}, {j})");
                    let accumulated = g * mag[[i, j]];
                    let bound = accumulated + 2f64.powi(-8) * (exact[[i, j]].abs() + accumulated);
                    let err = (got[[i, j]] - exact[[i, j]]).abs();
                    assert!(err <= bound, "{m}×{n} ({i}, {j}): {err:e} > {bound:e}");
                }
            }
        }
    }

    #[test]
    fn bf16_tensors_take_the_general_product() {
        // bf16 products accumulate in f32 inside libtorch; the bound above with bf16's roundoff
        // covers both the accumulation and the final rounding.
        for (m, n) in [(5, 9), (9, 5), (33, 40)] {
            agree(m, n, 11, Kind::BFloat16).unwrap();
        }
    }
}
