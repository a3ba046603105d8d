//! The tch backend: agreement with ndarray on the same inputs, and its input checks.
//!
//! Documented tolerances (f32 on CPU): Newton–Schulz outputs agree with the ndarray f32 backend to
//! max |Δ| ≤ 1e-4 and with the f64 backend to ≤ 1e-3 (entries are O(1)); singular values to
//! 1e-5·σ₁ (f32) ; bf16 Newton–Schulz to max |Δ| ≤ 0.1 (8-bit mantissa, 5 steps).

use super::common::*;
use kappa_linalg::tch_backend::{array_from_tensor, tensor_from_array};
use kappa_linalg::{
    newton_schulz, newton_schulz_cubic, newton_schulz_muon, LinalgError, Matrix, NsSchedule,
};
use ndarray::Array2;
use proptest::prelude::*;
use tch::{Device, Kind, Tensor};

fn t32(a: &Array2<f64>) -> Tensor {
    tensor_from_array(a.view(), Kind::Float, Device::Cpu).unwrap()
}

proptest! {
    #![proptest_config(kappa_testkit::config(24))]

    #[test]
    fn newton_schulz_agrees_across_backends((m, n, seed) in dims(24)) {
        let a: Array2<f64> = gaussian(m, n, seed);
        let a32 = a.mapv(|x| x as f32);
        let t = t32(&a);
        for sched in [NsSchedule::muon(), NsSchedule::cubic(12).unwrap(), NsSchedule::polar_express(10).unwrap()] {
            let nd64 = newton_schulz(&a, &sched).unwrap();
            let nd32 = newton_schulz(&a32, &sched).unwrap().mapv(f64::from);
            let th = array_from_tensor(&newton_schulz(&t, &sched).unwrap()).unwrap();
            let e32 = max_abs_diff(&th, &nd32);
            let e64 = max_abs_diff(&th, &nd64);
            prop_assert!(e32 <= 1e-4, "tch vs ndarray f32: {e32}");
            prop_assert!(e64 <= 1e-3, "tch vs ndarray f64: {e64}");
        }
    }

    #[test]
    fn trait_operations_agree((m, n, seed) in dims(16)) {
        let a: Array2<f64> = gaussian(m, n, seed);
        let b: Array2<f64> = gaussian(n, m, seed ^ 1);
        let (ta, tb) = (t32(&a), t32(&b));
        let p = array_from_tensor(&Matrix::matmul(&ta, &tb).unwrap()).unwrap();
        prop_assert!(max_abs_diff(&p, &a.dot(&b)) <= 1e-4 * (1.0 + fro(&p)));
        let g = array_from_tensor(&ta.gram().unwrap()).unwrap();
        prop_assert!(max_abs_diff(&g, &a.dot(&a.t())) <= 1e-4 * (1.0 + fro(&g)));
        let c: Array2<f64> = gaussian(m, m, seed ^ 2);
        let mut tc = t32(&c);
        tc.gemm(0.5, &ta, &tb, -2.0).unwrap();
        let want = a.dot(&b) * 0.5 - &c * 2.0;
        prop_assert!(max_abs_diff(&array_from_tensor(&tc).unwrap(), &want) <= 1e-4 * (1.0 + fro(&want)));
        let mut ty = ta.duplicate().unwrap();
        ty.axpy(3.0, &ta).unwrap();
        ty.scale(0.25).unwrap();
        prop_assert!(max_abs_diff(&array_from_tensor(&ty).unwrap(), &a) <= 1e-6 * (1.0 + fro(&a)));
        let f = Matrix::frobenius_norm(&ta).unwrap();
        prop_assert!((f - fro(&a)).abs() <= 1e-6 * fro(&a));
        let s_t = ta.singular_values().unwrap();
        let s_n = Matrix::singular_values(&a).unwrap();
        for (x, y) in s_t.iter().zip(s_n.iter()) {
            prop_assert!((x - y).abs() <= 1e-5 * s_n[0], "{x} vs {y}");
        }
        let q_t = array_from_tensor(&ta.polar_factor().unwrap()).unwrap();
        let q_n = Matrix::polar_factor(&a).unwrap();
        // The polar factor's sensitivity is 1/(σ_k + σ_{k−1}); skip nearly singular draws.
        if s_n[s_n.len() - 1] > 1e-2 * s_n[0] {
            prop_assert!(max_abs_diff(&q_t, &q_n) <= 1e-3, "polar factors differ");
        }
    }
}

#[test]
fn bf16_newton_schulz_computes_in_bf16_and_agrees_loosely() {
    let a: Array2<f64> = gaussian(16, 48, 3);
    let t = tensor_from_array(a.view(), Kind::BFloat16, Device::Cpu).unwrap();
    let o = newton_schulz_muon(&t).unwrap();
    assert_eq!(o.kind(), Kind::BFloat16);
    let nd = newton_schulz_muon(&a).unwrap();
    let e = max_abs_diff(&array_from_tensor(&o).unwrap(), &nd);
    assert!(e <= 0.1, "bf16 vs f64: {e}");
    // Polar factor on bf16 input goes through f32 and returns bf16.
    assert_eq!(t.polar_factor().unwrap().kind(), Kind::BFloat16);
}

#[test]
fn scale_invariance_for_tiny_f32_tensors() {
    let a: Array2<f64> = gaussian(12, 20, 4);
    let x = newton_schulz_muon(&t32(&a)).unwrap();
    for alpha in [1e-30, 1e-20, 1e-8, 1e20, 1e30] {
        let y = newton_schulz_muon(&t32(&a.mapv(|v| v * alpha))).unwrap();
        let e = max_abs_diff(
            &array_from_tensor(&x).unwrap(),
            &array_from_tensor(&y).unwrap(),
        );
        assert!(e <= 1e-5, "α = {alpha}: {e}");
    }
    let z = Tensor::zeros([3, 5], (Kind::Float, Device::Cpu));
    let o = newton_schulz_cubic(&z, 5).unwrap();
    assert_eq!(array_from_tensor(&o).unwrap(), Array2::<f64>::zeros((3, 5)));
}

#[test]
fn tch_inputs_are_checked() {
    let nan = Tensor::from_slice(&[1.0f32, f32::NAN, 0.0, 2.0]).view([2, 2]);
    match newton_schulz_muon(&nan) {
        Err(LinalgError::NonFinite {
            arg: "x",
            row: 0,
            col: 1,
            ..
        }) => {}
        other => panic!("{:?}", other.map(|_| ())),
    }
    let inf = Tensor::from_slice(&[1.0f32, 0.0, f32::NEG_INFINITY, 2.0]).view([2, 2]);
    assert!(matches!(
        newton_schulz_muon(&inf),
        Err(LinalgError::NonFinite {
            arg: "x",
            row: 1,
            col: 0,
            ..
        })
    ));
    let empty = Tensor::zeros([0, 4], (Kind::Float, Device::Cpu));
    assert!(matches!(
        newton_schulz_muon(&empty),
        Err(LinalgError::Empty { arg: "x", .. })
    ));
    let v = Tensor::zeros([4], (Kind::Float, Device::Cpu));
    assert!(matches!(
        newton_schulz_muon(&v),
        Err(LinalgError::ShapeMismatch { arg: "x", .. })
    ));
    let ints = Tensor::zeros([2, 2], (Kind::Int64, Device::Cpu));
    assert!(matches!(
        newton_schulz_muon(&ints),
        Err(LinalgError::UnsupportedDtype { arg: "x", .. })
    ));
    let a = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
    assert!(matches!(
        Matrix::matmul(&a, &a),
        Err(LinalgError::ShapeMismatch { arg: "rhs", .. })
    ));
    let mut c = Tensor::zeros([2, 2], (Kind::Float, Device::Cpu));
    assert!(matches!(
        c.gemm(1.0, &a, &a, 0.0),
        Err(LinalgError::ShapeMismatch { arg: "b", .. })
    ));
    assert!(matches!(
        c.axpy(1.0, &a),
        Err(LinalgError::ShapeMismatch { arg: "x", .. })
    ));
    let bad = ndarray::array![[f64::NAN]];
    assert!(matches!(
        tensor_from_array(bad.view(), Kind::Float, Device::Cpu),
        Err(LinalgError::NonFinite { arg: "a", .. })
    ));
    let ok = ndarray::array![[1.0]];
    assert!(matches!(
        tensor_from_array(ok.view(), Kind::Int, Device::Cpu),
        Err(LinalgError::UnsupportedDtype { arg: "kind", .. })
    ));
    assert!(matches!(
        array_from_tensor(&v),
        Err(LinalgError::ShapeMismatch { arg: "t", .. })
    ));
}

#[test]
fn requires_grad_inputs_are_not_tracked() {
    let a: Array2<f64> = gaussian(4, 6, 1);
    let t = t32(&a).set_requires_grad(true);
    let o = newton_schulz_muon(&t).unwrap();
    assert!(!o.requires_grad());
}
