//! `product::mat_mul_into` (faer's kernels) on every memory layout: within the dot-product bound
//! of the f64 product, β = 0 never reads C, and shapes up to and past faer's thread thresholds.
//!
//! The tolerance: every entry of α·A·B + β·C is one length-k dot product plus one product and one
//! sum, so |fl − exact| ≤ γ_{k+2}·(|α|·(|A||B|)_ij + |β|·|c_ij|) in the working precision
//! (Higham §3.5); the reference is computed in f64 from the same rounded inputs (for f64 inputs
//! its own error is of the same bound, hence the factor 2 there).

use super::common::*;
use kappa_linalg::product::{is_sequential, mat_mul, mat_mul_into, sequential};
use kappa_linalg::Real;
use ndarray::{s, Array2, ArrayView2, ShapeBuilder};
use proptest::prelude::*;

fn to64<A: Real>(a: &ArrayView2<'_, A>) -> Array2<f64> {
    a.mapv(|v| v.to_f64_lossy())
}

/// `a` in one of four layouts: row-major, column-major, every other column of a wider matrix,
/// or rows reversed (a negative stride).
fn layout<A: Real>(a: &Array2<A>, which: usize) -> Array2<A> {
    let (m, n) = a.dim();
    match which % 4 {
        0 => a.clone(),
        1 => {
            let mut c = Array2::zeros((m, n).f());
            c.assign(a);
            c
        }
        2 => {
            let mut wide = Array2::zeros((m, 2 * n));
            wide.slice_mut(s![.., ..;2]).assign(a);
            wide.slice_collapse(s![.., ..;2]);
            wide
        }
        _ => {
            let mut r = a.slice(s![..;-1, ..]).to_owned();
            r.slice_collapse(s![..;-1, ..]);
            r
        }
    }
}

/// Checks `got` = α·A·B + β·C to the bound of the module docs.
fn check<A: Real>(
    got: &Array2<A>,
    (a, b, c): (&Array2<A>, &Array2<A>, &Array2<A>),
    (alpha, beta): (f64, f64),
) -> Result<(), String> {
    let (a, b, c, got) = (
        to64(&a.view()),
        to64(&b.view()),
        to64(&c.view()),
        to64(&got.view()),
    );
    let exact = a.dot(&b) * alpha + &(c.clone() * beta);
    let mag =
        a.mapv(f64::abs).dot(&b.mapv(f64::abs)) * alpha.abs() + &(c.mapv(f64::abs) * beta.abs());
    let factor = if A::EPS < 1e-10 { 2.0 } else { 1.0 };
    let g = factor * gamma_u(a.ncols() + 2, A::EPS / 2.0);
    for ((&x, &e), &m) in got.iter().zip(&exact).zip(&mag) {
        if (x - e).abs() > g * m {
            return Err(format!("|{x} − {e}| > {g:e}·{m}"));
        }
    }
    Ok(())
}

fn agrees<A: Real>(
    m: usize,
    k: usize,
    n: usize,
    seed: u64,
    lay: usize,
    beta: f64,
) -> Result<(), String> {
    let a = layout(&gaussian::<A>(m, k, seed), lay);
    let b = layout(&gaussian::<A>(k, n, seed + 1), lay / 4);
    let c0 = gaussian::<A>(m, n, seed + 2);
    let mut c = layout(&c0, lay / 16);
    let alpha = 0.75;
    mat_mul_into(
        A::from_f64_lossy(alpha),
        &a,
        &b,
        A::from_f64_lossy(beta),
        &mut c,
    );
    check(&c, (&a, &b, &c0), (alpha, beta))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn products_are_within_the_dot_product_bound_on_every_layout(
        (m, k, seed) in dims(40), n in 1usize..40, lay in 0usize..64, beta in prop_oneof![Just(0.0), Just(1.0), Just(-0.5)]
    ) {
        agrees::<f64>(m, k, n, seed, lay, beta).map_err(TestCaseError::fail)?;
        agrees::<f32>(m, k, n, seed, lay, beta).map_err(TestCaseError::fail)?;
    }
}

/// Products large enough for faer's threads (past `PARALLEL_MIN_ENTRIES` and `_MULS`), in
/// one-, two- and three-thread pools: each within the bound, and bit-identical to each other
/// (faer splits the result, not the sums, among threads).
#[test]
fn products_past_the_thread_thresholds_are_within_the_bound_and_thread_independent() {
    let a = gaussian::<f64>(300, 260, 11);
    let b = gaussian::<f64>(280, 260, 12);
    let pool = |threads| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    };
    let reference = pool(1).install(|| mat_mul(&a, &b.t()));
    for threads in [1, 2, 3] {
        pool(threads).install(|| {
            agrees::<f64>(150, 120, 140, 7, 5, 0.0).unwrap();
            agrees::<f32>(150, 120, 140, 8, 0, 1.0).unwrap();
            assert_eq!(mat_mul(&a, &b.t()), reference, "{threads} threads");
            // Inside `sequential` the product stays on this thread: the same bits.
            assert_eq!(sequential(|| mat_mul(&a, &b.t())), reference);
        });
    }
}

/// `sequential` nests, and restores the caller's setting on return and when its closure
/// panics.
#[test]
fn sequential_nests_and_restores_on_unwind() {
    let a = gaussian::<f64>(200, 150, 3);
    let reference = mat_mul(&a, &a.t());
    assert!(!is_sequential());
    let nested = sequential(|| {
        let inner = sequential(|| mat_mul(&a, &a.t()));
        assert!(is_sequential(), "still inside the outer call");
        inner
    });
    assert_eq!(nested, reference);
    assert!(!is_sequential());
    let caught = std::panic::catch_unwind(|| sequential(|| panic!("inside")));
    assert!(caught.is_err());
    assert!(!is_sequential());
}

/// β = 0 overwrites C without reading it (NaN in C does not reach the result), as BLAS does;
/// empty inner dimension gives β·C.
#[test]
fn zero_beta_does_not_read_c_and_empty_products_are_zero() {
    let a = gaussian::<f64>(3, 4, 1);
    let b = gaussian::<f64>(4, 5, 2);
    let mut c = Array2::from_elem((3, 5), f64::NAN);
    mat_mul_into(1.0, &a, &b, 0.0, &mut c);
    assert!(c.iter().all(|x| x.is_finite()));
    let z = mat_mul(&Array2::<f64>::zeros((3, 0)), &Array2::<f64>::zeros((0, 5)));
    assert_eq!(z, Array2::<f64>::zeros((3, 5)));
}
