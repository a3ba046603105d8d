//! The BLAS kernel in use is never a generic fallback, and kappa's switch away from one computes
//! the same products.
//!
//! One test function, so nothing else in this binary calls BLAS while the kernel is switched.
//! It checks, in order: that the start-up check ran; that the kernel running now is not a
//! generic SSE kernel on a CPU with AVX2 or more (skipped, with a message, where the environment
//! chose the kernel or the CPU is below AVX2); then it emulates the fallback of an OpenBLAS too
//! old for its CPU by selecting the generic "Prescott" kernel, upgrades it as the start-up check
//! does, and compares the products of the three kernels.

// Switching the kernel is unsafe (no BLAS call may be in flight); each use says why it holds.
#![allow(unsafe_code)]

use kappa_linalg::blas::{kernels_for_this_cpu, set_openblas_kernel, upgrade_generic_kernel};
use kappa_linalg::{blas_report, KernelSelection};
use ndarray::{Array2, Zip};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

const M: usize = 200;
const K: usize = 300;
const N: usize = 150;

fn gaussian(rows: usize, cols: usize, seed: u64) -> Array2<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Array2::from_shape_simple_fn((rows, cols), || StandardNormal.sample(&mut rng))
}

/// A·B in f32 and f64 (ndarray's BLAS path: `sgemm`, `dgemm`), widened to f64.
fn products(a: &Array2<f64>, b: &Array2<f64>) -> [Array2<f64>; 2] {
    let (a32, b32) = (a.mapv(|x| x as f32), b.mapv(|x| x as f32));
    [a32.dot(&b32).mapv(f64::from), a.dot(b)]
}

/// Two products of the same inputs by different summation orders: each is within
/// γ_K·(|A||B|)_ij of the exact one (Higham, *Accuracy and Stability*, Thm 3.5; γ_K =
/// K·u/(1 − K·u), u the unit roundoff), so they differ by at most 2·γ_K·(|A||B|)_ij.
fn assert_same_product(x: &Array2<f64>, y: &Array2<f64>, abs_ab: &Array2<f64>, u: f64, what: &str) {
    let k = K as f64;
    let gamma = k * u / (1.0 - k * u);
    Zip::indexed(x)
        .and(y)
        .and(abs_ab)
        .for_each(|(i, j), &x, &y, &m| {
            assert!(
                (x - y).abs() <= 2.0 * gamma * m,
                "{what}: C[{i},{j}] = {x} vs {y}, beyond 2γ_K·(|A||B|) = {}",
                2.0 * gamma * m
            );
        });
}

#[test]
fn the_kernel_is_never_a_generic_fallback() {
    let start = blas_report();
    eprintln!("BLAS at start: {start}");
    let Some(original) = start.core.clone() else {
        eprintln!("skipped: the linked BLAS is not the system OpenBLAS; kappa cannot inspect it");
        return;
    };
    assert_ne!(
        start.selection,
        KernelSelection::NotInspected,
        "the start-up check did not run"
    );
    if start.coretype_env.is_some() {
        eprintln!("skipped: OPENBLAS_CORETYPE chose the kernel; kappa keeps it");
        return;
    }
    assert!(
        !start.is_generic_fallback(),
        "a generic kernel runs on this CPU: {start}"
    );
    if kernels_for_this_cpu().is_empty() {
        eprintln!("skipped: this CPU is below AVX2; no fallback to emulate");
        return;
    }
    // The kernel the upgrade must pick: the first candidate for this CPU that this OpenBLAS
    // build has (an older build may lack Cooperlake, say).
    let best = kernels_for_this_cpu()
        .iter()
        // SAFETY: this is the binary's only test; no other thread calls BLAS.
        .find(|k| unsafe { set_openblas_kernel(k) }.is_ok())
        .expect("this OpenBLAS has none of the kernels for this CPU");
    for bad in ["", "Has\0well", "Haswell; rm"] {
        // SAFETY: as above.
        let refused = unsafe { set_openblas_kernel(bad) };
        assert!(refused.is_err(), "{bad:?} accepted: {refused:?}");
    }

    let (a, b) = (gaussian(M, K, 1), gaussian(K, N, 2));
    let abs_ab = a.mapv(f64::abs).dot(&b.mapv(f64::abs));
    let first = products(&a, &b);

    // SAFETY: this is the binary's only test; no other thread calls BLAS.
    let generic = unsafe { set_openblas_kernel("Prescott") }.expect("selecting Prescott");
    assert!(blas_report().is_generic_fallback(), "{}", blas_report());
    let on_generic = products(&a, &b);

    // SAFETY: as above.
    let selection = unsafe { upgrade_generic_kernel() };
    assert_eq!(selection, KernelSelection::Upgraded { from: generic });
    let upgraded = blas_report();
    assert!(!upgraded.is_generic_fallback(), "{upgraded}");
    assert!(
        upgraded
            .core
            .as_deref()
            .is_some_and(|c| c.eq_ignore_ascii_case(best)),
        "expected {best}: {upgraded}"
    );
    let on_upgraded = products(&a, &b);

    for (i, (u, name)) in [
        (f64::from(f32::EPSILON) / 2.0, "f32"),
        (f64::EPSILON / 2.0, "f64"),
    ]
    .into_iter()
    .enumerate()
    {
        assert_same_product(&on_generic[i], &on_upgraded[i], &abs_ab, u, name);
        assert_same_product(&first[i], &on_upgraded[i], &abs_ab, u, name);
    }

    // SAFETY: as above.
    let missing = unsafe { set_openblas_kernel("NoSuchKernel9") };
    assert!(missing.is_err(), "{missing:?}");
    assert!(
        !blas_report().is_generic_fallback(),
        "an unknown name changed the kernel"
    );
    // SAFETY: as above.
    let back = unsafe { set_openblas_kernel(&original) }.expect("restoring the kernel");
    assert!(back.eq_ignore_ascii_case(&original));
}
