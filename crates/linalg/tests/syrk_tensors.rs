//! The `syrk` path of `Matrix::gram` / `Matrix::gram_add` for CPU tensors: libtorch's own MKL
//! `?syrk` at any thread count where libtorch has MKL, else OpenBLAS's while libtorch and
//! OpenBLAS each compute on one thread (the `syrk` module docs say why). Those thread counts are
//! process-wide, so this test binary holds the tests that set them, one at a time (`THREADS`).
//!
//! The tolerance is the dot-product bound of `properties/symmetric_products.rs`:
//! |fl − exact| ≤ γ_{k+2}·(|α|·(|X||X|ᵀ)_ij + |β|·|c_ij|) in the tensor's precision; and the
//! result must be exactly symmetric (one triangle computed, the other copied).
#![cfg(all(feature = "tch", feature = "openblas-system"))]
// One FFI call: OpenBLAS's thread-count setter, which kappa-linalg does not wrap.
#![allow(unsafe_code)]

use kappa_linalg::tch_backend::{array_from_tensor, tensor_from_array};
use kappa_linalg::Matrix;
use ndarray::Array2;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use tch::{Device, Kind, Tensor};

extern "C" {
    fn openblas_set_num_threads(n: std::ffi::c_int);
}

/// Held by each test while it sets and uses the process-wide thread counts.
static THREADS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sets libtorch's and OpenBLAS's thread counts to `n`.
fn set_threads(n: i32) {
    // SAFETY: sets OpenBLAS's thread count; the caller holds `THREADS`, so no other test of this
    // binary calls BLAS meanwhile.
    unsafe { openblas_set_num_threads(n) };
    tch::set_num_threads(n);
}

fn gaussian(m: usize, n: usize, seed: u64) -> Array2<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Array2::from_shape_simple_fn((m, n), || StandardNormal.sample(&mut rng))
}

fn check(got: &Tensor, x: &Array2<f64>, alpha: f64, c: &Array2<f64>, beta: f64, unit: f64) {
    let got: Array2<f64> = array_from_tensor(got).unwrap();
    let (m, k) = x.dim();
    let exact = alpha * x.dot(&x.t()) + beta * c;
    let ax = x.mapv(f64::abs);
    let mag = alpha.abs() * ax.dot(&ax.t()) + beta.abs() * c.mapv(f64::abs);
    let gamma = (k + 2) as f64 * unit / (1.0 - (k + 2) as f64 * unit);
    for i in 0..m {
        for j in 0..m {
            assert_eq!(got[[i, j]], got[[j, i]], "not symmetric at ({i}, {j})");
            let err = (got[[i, j]] - exact[[i, j]]).abs();
            assert!(
                err <= gamma * mag[[i, j]],
                "({i}, {j}): {err:e} > {:e}",
                gamma * mag[[i, j]]
            );
        }
    }
}

/// Where the loaded libtorch has MKL (x86-64 Linux builds), tensors take its `syrk`.
#[test]
fn libtorch_mkl_syrk_is_found_where_libtorch_has_mkl() {
    let _held = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    let mkl = kappa_linalg::mkl::mkl_dispatch().vendor_intel.is_some();
    assert_eq!(kappa_linalg::mkl::libtorch_syrk_found(), mkl);
}

/// libtorch's MKL `syrk` at one and two threads where libtorch has it (elsewhere two threads take
/// the general product, symmetric only to rounding, so that case is not asserted there), and,
/// switched off, OpenBLAS's at one thread (the path of a libtorch without MKL): within the bound
/// and exactly symmetric each time.
#[test]
fn tensors_take_syrk_at_one_and_two_threads() {
    let _held = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    set_threads(1);
    symmetric_products_within_the_bound();
    if kappa_linalg::mkl::libtorch_syrk_found() {
        set_threads(2);
        symmetric_products_within_the_bound();
    }
    kappa_linalg::mkl::use_libtorch_syrk(false);
    set_threads(1);
    assert_eq!(kappa_linalg::blas::blas_threads(), Some(1));
    symmetric_products_within_the_bound();
    kappa_linalg::mkl::use_libtorch_syrk(true);
}

/// `gram` and `gram_add` on row-major, column-major and strided tensors of both kinds, at the
/// thread counts set by the caller.
fn symmetric_products_within_the_bound() {
    for (kind, unit) in [
        (Kind::Float, f32::EPSILON as f64 / 2.0),
        (Kind::Double, f64::EPSILON / 2.0),
    ] {
        for (m, n) in [(1, 1), (1, 9), (9, 1), (7, 9), (70, 33), (130, 300)] {
            let x64 = gaussian(m, n, (m * 1000 + n) as u64);
            let c0 = gaussian(m, m, 3);
            let c64 = &c0 + &c0.t();
            let to = |a: &Array2<f64>| tensor_from_array(a.view(), kind, Device::Cpu).unwrap();
            let (x, c) = (to(&x64), to(&c64));
            // The values as rounded to `kind`, the reference's inputs.
            let xr: Array2<f64> = array_from_tensor(&x).unwrap();
            let cr: Array2<f64> = array_from_tensor(&c).unwrap();
            let column_major = to(&x64.t().to_owned()).tr();
            let strided =
                to(&ndarray::concatenate![ndarray::Axis(1), x64, x64]).slice(1, 0, 2 * n as i64, 2);
            for view in [&x, &column_major] {
                check(&view.gram().unwrap(), &xr, 1.0, &cr, 0.0, unit);
                check(
                    &view.gram_add(-0.7, &c, 1.3).unwrap(),
                    &xr,
                    -0.7,
                    &cr,
                    1.3,
                    unit,
                );
            }
            let sr: Array2<f64> = array_from_tensor(&strided).unwrap();
            check(
                &strided.gram_add(2.0, &c, 0.5).unwrap(),
                &sr,
                2.0,
                &cr,
                0.5,
                unit,
            );
        }
    }
}

/// At this size (r²s ≥ 2²²) on one thread the batched Newton–Schulz runs every slice through
/// the per-matrix iteration (its symmetric products): each slice must be the one-by-one result
/// bit for bit, and its singular values inside Muon's band (to 1e-3, the backends' documented
/// f32 agreement of Newton–Schulz results, 1e-4, ten times over).
#[test]
fn batched_newton_schulz_with_symmetric_products_agrees_slice_by_slice() {
    let _held = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    set_threads(1);
    let schedule = kappa_linalg::NsSchedule::muon();
    let slices: Vec<Tensor> = (0..3)
        .map(|i| {
            tensor_from_array(gaussian(160, 200, 40 + i).view(), Kind::Float, Device::Cpu).unwrap()
        })
        .collect();
    let batched = kappa_linalg::batched::newton_schulz_each(&slices, &schedule).unwrap();
    for (x, got) in slices.iter().zip(&batched) {
        let want = kappa_linalg::newton_schulz(x, &schedule).unwrap();
        assert!(got.equal(&want), "batched differs from one by one");
        let s = got.to_kind(Kind::Double).singular_values().unwrap();
        let (lo, hi) = kappa_linalg::MUON_BAND;
        assert!(
            s.iter().all(|&v| v > lo - 1e-3 && v < hi + 1e-3),
            "σ outside the band: {s:?}"
        );
    }
}
