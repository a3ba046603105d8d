//! The tch backend: agreement with ndarray on the same inputs, and its input checks.
//!
//! Tolerances (f32 on CPU) are derived per input (docs/linalg.md, Tolerances of the tests):
//! Newton–Schulz by the Lipschitz propagation bound `ns_error_bound` in ε_f32 (libtorch's MKL and
//! OpenBLAS round differently; the bound covers any rounding of that size), the trait products by
//! entrywise γ_k bounds, singular values and polar factors by the documented SVD bound in ε_f32
//! plus the f32 cast. bf16 Newton–Schulz keeps its documented band max |Δ| ≤ 0.1 (the worst-case
//! bound in ε_bf16 = 2⁻⁷ is vacuous at 16×48).

use super::common::*;
use kappa_linalg::tch_backend::{array_from_tensor, tensor_from_array};
use kappa_linalg::{
    aol_gram_newton_schulz, aol_newton_schulz, gram_newton_schulz, newton_schulz,
    newton_schulz_cubic, newton_schulz_muon, newton_schulz_normed, singular_values, InputError,
    LinalgError, Matrix, Normed, NsSchedule, SvdDriver, GRAM_NS_RESTART,
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
            // Both f32 runs start from the same cast input: each within the ε_f32 bound of the
            // exact map. Against f64: the cast (u_f32 relative, as e0) plus both bounds.
            let (r, s_, x, _) = ns_inputs(&a, &sched);
            let b32 = ns_error_bound(&sched, r, s_, &x, f32::EPSILON as f64, 0.0);
            let b32c = ns_error_bound(&sched, r, s_, &x, f32::EPSILON as f64, U32);
            let b64 = ns_error_bound(&sched, r, s_, &x, f64::EPSILON, 0.0);
            prop_assert!(e32 <= 2.0 * b32, "tch vs ndarray f32: {e32} > {:e}", 2.0 * b32);
            prop_assert!(e64 <= b32c + b64, "tch vs ndarray f64: {e64} > {:e}", b32c + b64);
        }
    }

    #[test]
    fn gram_newton_schulz_on_tensors_agrees_with_newton_schulz(
        (m, n, seed) in dims(20),
        restart in 1usize..=3,
    ) {
        let a: Array2<f64> = gaussian(m, n, seed);
        for sched in [NsSchedule::muon(), NsSchedule::polar_express(10).unwrap(), NsSchedule::cubic(12).unwrap()] {
            let (r, s_, x, _) = ns_inputs(&a, &sched);
            // Gram NS on tensors against plain NS on ndarray from the same input (f64: the same
            // numbers; f32: the same cast): each run within its rounding bound of the exact map.
            for (kind, eps) in [(Kind::Double, f64::EPSILON), (Kind::Float, f32::EPSILON as f64)] {
                let t = tensor_from_array(a.view(), kind, Device::Cpu).unwrap();
                let g = array_from_tensor(&gram_newton_schulz(&t, &sched, restart).unwrap()).unwrap();
                let p = if kind == Kind::Double {
                    newton_schulz(&a, &sched).unwrap()
                } else {
                    newton_schulz(&a.mapv(|v| v as f32), &sched).unwrap().mapv(f64::from)
                };
                let e = (&g - &p).iter().map(|v| v * v).sum::<f64>().sqrt();
                let tol = gram_ns_error_bound(&sched, restart, r, s_, &x, eps, 0.0)
                    + ns_error_bound(&sched, r, s_, &x, eps, 0.0);
                prop_assert!(e <= tol, "{kind:?}: ‖GNS_tch − NS‖_F = {e:e} > {tol:e}");
            }
        }
    }

    #[test]
    fn aol_forms_agree_across_backends(
        (m, n, seed) in dims(20),
        restart in 1usize..=3,
        short in any::<bool>(),
    ) {
        let a: Array2<f64> = gaussian(m, n, seed);
        // Turbo-Muon's 4 steps, or the short designed schedule.
        let sched = if short { NsSchedule::aol_three_steps() } else { NsSchedule::turbo_muon(4) }.unwrap();
        let (dx, e0u) = super::aol::aol_reference(&a);
        let x = singular_values(dx.view(), SvdDriver::QrIteration).unwrap().to_vec();
        let (r, s_) = dx.dim();
        // Each run is within its rounding bound of the exact map of D·X, from the AOL rounding
        // (`aol_reference`) in its precision (and, in f32, the same cast input on both sides):
        // the plain form on tensors and on arrays differ by at most twice the plain bound, the
        // Gram form on tensors and the plain form on arrays by the Gram bound plus the plain one.
        for (kind, eps, u) in [(Kind::Double, f64::EPSILON, U64), (Kind::Float, f32::EPSILON as f64, U32)] {
            let t = tensor_from_array(a.view(), kind, Device::Cpu).unwrap();
            let plain = array_from_tensor(&aol_newton_schulz(&t, &sched).unwrap()).unwrap();
            let gram = array_from_tensor(&aol_gram_newton_schulz(&t, &sched, restart).unwrap()).unwrap();
            let nd = if kind == Kind::Double {
                aol_newton_schulz(&a, &sched).unwrap()
            } else {
                aol_newton_schulz(&a.mapv(|v| v as f32), &sched).unwrap().mapv(f64::from)
            };
            let e0 = 2.0 * e0u * u;
            let ns = ns_error_bound(&sched, r, s_, &x, eps, e0);
            let e = max_abs_diff(&plain, &nd);
            prop_assert!(e <= 2.0 * ns, "{kind:?}: max |AOL_tch − AOL_nd| = {e:e} > {:e}", 2.0 * ns);
            let tol = gram_ns_error_bound(&sched, restart, r, s_, &x, eps, e0) + ns;
            let e = max_abs_diff(&gram, &nd);
            prop_assert!(e <= tol, "{kind:?}: max |GAOL_tch − AOL_nd| = {e:e} > {tol:e}");
        }
    }

    #[test]
    fn trait_operations_agree((m, n, seed) in dims(16)) {
        let a: Array2<f64> = gaussian(m, n, seed);
        let b: Array2<f64> = gaussian(n, m, seed ^ 1);
        let (ta, tb) = (t32(&a), t32(&b));
        // Entrywise: the casts (u_f32 on each operand), the f32 product (γ^{f32}_k) and the f64
        // reference (γ_k), all relative to |A||B| (resp. |A||Aᵀ|, 0.5|A||B| + 2|C|).
        let entrywise = |got: &Array2<f64>, want: &Array2<f64>, mag: &Array2<f64>, k: usize| {
            let g = 3.0 * U32 + gamma_u(k + 2, U32) + gamma(k + 2);
            got.iter().zip(want.iter()).zip(mag.iter()).all(|((x, y), w)| (x - y).abs() <= g * w * 1.01)
        };
        let (aa, ab) = (a.mapv(f64::abs), b.mapv(f64::abs));
        let p = array_from_tensor(&Matrix::matmul(&ta, &tb).unwrap()).unwrap();
        prop_assert!(entrywise(&p, &a.dot(&b), &aa.dot(&ab), n));
        let g = array_from_tensor(&ta.gram().unwrap()).unwrap();
        prop_assert!(entrywise(&g, &a.dot(&a.t()), &aa.dot(&aa.t()), n));
        let c: Array2<f64> = gaussian(m, m, seed ^ 2);
        let mut tc = t32(&c);
        tc.gemm(0.5, &ta, &tb, -2.0).unwrap();
        let want = a.dot(&b) * 0.5 - &c * 2.0;
        let mag = aa.dot(&ab) * 0.5 + c.mapv(f64::abs) * 2.0;
        prop_assert!(entrywise(&array_from_tensor(&tc).unwrap(), &want, &mag, n));
        // 0.25·(a + 3a) in f32: the cast, 3a and the sum round (≤ u(1 + 3 + 4)|a|, ×0.25 exact).
        let mut ty = ta.duplicate().unwrap();
        ty.axpy(3.0, &ta).unwrap();
        ty.scale(0.25).unwrap();
        let ty = array_from_tensor(&ty).unwrap();
        prop_assert!(ty.iter().zip(a.iter()).all(|(x, y)| (x - y).abs() <= 3.0 * U32 * y.abs() * 1.01));
        // The cast (u_f32 relative in the norm) and the two sums of mn squares (γ^{f32}, γ).
        let f = Matrix::frobenius_norm(&ta).unwrap();
        let mn = m * n;
        prop_assert!((f - fro(&a)).abs() <= (U32 + gamma_u(mn + 1, U32) + gamma(mn + 1)) * fro(&a) * 1.01);
        // Each SVD within 30·max(m,n)·ε·σ₁ in its own precision (documented), plus the cast
        // (‖E‖₂ ≤ u_f32·‖A‖_F, Weyl).
        let s_t = ta.singular_values().unwrap();
        let s_n = Matrix::singular_values(&a).unwrap();
        let e_in = U32 * fro(&a);
        let stol = (svd_rel(m, n, f32::EPSILON as f64) + svd_rel(m, n, f64::EPSILON)) * s_n[0] * 1.01 + e_in;
        for (x, y) in s_t.iter().zip(s_n.iter()) {
            prop_assert!((x - y).abs() <= stol, "{x} vs {y}");
        }
        // Polar factors: both backward errors and the cast, amplified by 2/σ_k
        // (`polar_perturbation`; ∞, i.e. no claim, when they reach σ_k), plus each factor's loss
        // of orthogonality and the f32 output's rounding.
        let q_t = array_from_tensor(&ta.polar_factor().unwrap()).unwrap();
        let q_n = Matrix::polar_factor(&a).unwrap();
        let k = m.min(n);
        let e_fro = stol * (k as f64).sqrt() + e_in;
        let qtol = polar_perturbation(e_fro, s_n[k - 1] - stol)
            + 2.0 * stol / s_n[0] * (k as f64).sqrt()
            + U32;
        prop_assert!(max_abs_diff(&q_t, &q_n) <= qtol, "polar factors differ (tol {qtol:e})");
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
    // The documented band (docs/linalg.md, Accuracy: bf16 NS5 vs f64 ≤ 0.1); the worst-case
    // `ns_error_bound` in ε_bf16 = 2⁻⁷ exceeds 1 here, so it gives no claim of its own.
    assert!(e <= 0.1, "bf16 vs f64: {e}");
    // Polar factor on bf16 input goes through f32 and returns bf16.
    assert_eq!(t.polar_factor().unwrap().kind(), Kind::BFloat16);
}

#[test]
fn bf16_gram_newton_schulz_computes_in_bf16_and_agrees_loosely() {
    // Tall, wide and square (a square Gaussian has σ_min near 0: the hard case for the Gram
    // recurrence), at the default period: the documented bf16 band of NS5 against f64, max |Δ| ≤ 0.1 (docs/linalg.md,
    // Accuracy), as plain NS5 in bf16 (`bf16_newton_schulz_computes_in_bf16_and_agrees_loosely`).
    for (m, n) in [(48, 16), (16, 48), (32, 32)] {
        let a: Array2<f64> = gaussian(m, n, 3);
        let t = tensor_from_array(a.view(), Kind::BFloat16, Device::Cpu).unwrap();
        let o = gram_newton_schulz(&t, &NsSchedule::muon(), GRAM_NS_RESTART).unwrap();
        assert_eq!(o.kind(), Kind::BFloat16);
        let e = max_abs_diff(
            &array_from_tensor(&o).unwrap(),
            &newton_schulz_muon(&a).unwrap(),
        );
        assert!(e <= 0.1, "{m}×{n}: bf16 Gram NS vs f64 NS: {e}");
    }
}

#[test]
fn bf16_gram_polar_express_keeps_the_band_at_periods_1_and_2() {
    // Polar Express ×5 (the schedule kappa-optim's `GramPolarExpress` runs) on tall and wide
    // inputs with graded spectra down to κ = 10² (inside the schedule's design range; gradients'
    // spectra decay) at periods 1 and 2 (the default): the documented bf16 band against the f64
    // iteration of the same schedule, as plain Newton–Schulz in bf16 keeps it (measured here:
    // 0.016–0.030 plain, 0.016–0.031 Gram). **Finding** kept as this test's reason: period 3
    // diverges in bf16 on such inputs (max |Δ| 4.1 at 16×48, 93 at 96×24; 1960 at 96×24 with
    // κ = 10³), though not at 768×3072 — the first three Polar Express steps' gain (≈ 130)
    // amplifies the Gram recurrence's bf16 rounding past recovery.
    let sched = NsSchedule::polar_express(5).unwrap();
    for (m, n, seed) in [(48, 16, 5), (16, 48, 6), (96, 24, 7), (24, 96, 8)] {
        let a = with_spectrum(m, n, &spectrum(m.min(n), 1e2, seed), seed);
        let t = tensor_from_array(a.view(), Kind::BFloat16, Device::Cpu).unwrap();
        let exact = newton_schulz(&a, &sched).unwrap();
        for restart in [1, GRAM_NS_RESTART] {
            let o = gram_newton_schulz(&t, &sched, restart).unwrap();
            let e = max_abs_diff(&array_from_tensor(&o).unwrap(), &exact);
            assert!(
                e <= 0.1,
                "{m}×{n}, period {restart}: bf16 Gram PE×5 vs f64: {e}"
            );
        }
    }
}

#[test]
fn bf16_gram_aol_keeps_the_band_at_periods_1_and_2() {
    // AOL + Turbo ×4 as Gram Newton–Schulz in bf16 (what kappa-optim's `GramAol` runs) against
    // the f64 plain form of the same map, on the graded spectra of
    // `bf16_gram_polar_express_keeps_the_band_at_periods_1_and_2` (κ = 10², and 10³ beyond the
    // Polar Express test's range): the documented bf16 band, max |Δ| ≤ 0.1, as plain AOL in bf16
    // keeps it (checked alongside). Measured: periods 1–2 0.017–0.060, plain 0.016–0.067 (κ = 1:
    // ≤ 0.0063). The period-3 runs are printed, not asserted: they reach 0.056–0.121, past the
    // band on two of these inputs (Turbo's per-block gains are ≈ 14.8 for two steps and ≈ 42 for
    // three), the reason kappa-optim refuses periods above 2 in bf16 for this form too. The short
    // designed schedule (no safety factor) is held to the same band, also at κ = 1 where every
    // σ(D·X) is 1 and bf16 rounding puts some just above its design interval: measured periods
    // 1–2 0.011–0.025, plain 0.010–0.026, period 3 up to 0.099.
    let turbo = NsSchedule::turbo_muon(4).unwrap();
    let short = NsSchedule::aol_three_steps().unwrap();
    for (name, sched) in [("Turbo ×4", &turbo), ("short ×3", &short)] {
        for kappa in [1.0, 1e2, 1e3] {
            for (m, n, seed) in [(48, 16, 5), (16, 48, 6), (96, 24, 7), (24, 96, 8)] {
                let a = with_spectrum(m, n, &spectrum(m.min(n), kappa, seed), seed);
                check_bf16_gram_aol(&a, sched, &format!("{name}, {m}×{n}, κ = {kappa}"));
            }
        }
    }
}

/// bf16 AOL (plain, and Gram at periods 1, 2, 3) against the f64 plain map on `a`: max |Δ| ≤ 0.1
/// except at period 3 (printed).
fn check_bf16_gram_aol(a: &Array2<f64>, sched: &NsSchedule, case: &str) {
    let t = tensor_from_array(a.view(), Kind::BFloat16, Device::Cpu).unwrap();
    let exact = aol_newton_schulz(a, sched).unwrap();
    let plain = max_abs_diff(
        &array_from_tensor(&aol_newton_schulz(&t, sched).unwrap()).unwrap(),
        &exact,
    );
    assert!(plain <= 0.1, "{case}: bf16 AOL vs f64: {plain}");
    for restart in [1, GRAM_NS_RESTART, 3] {
        let o = aol_gram_newton_schulz(&t, sched, restart).unwrap();
        assert_eq!(o.kind(), Kind::BFloat16);
        let e = max_abs_diff(&array_from_tensor(&o).unwrap(), &exact);
        println!("{case}, period {restart}: bf16 Gram AOL {e:.4}, plain {plain:.4}");
        assert!(
            restart > GRAM_NS_RESTART || e <= 0.1,
            "{case}, period {restart}: bf16 Gram AOL vs f64: {e}"
        );
    }
}

#[test]
fn scale_invariance_for_tiny_f32_tensors() {
    let a: Array2<f64> = gaussian(12, 20, 4);
    let x = newton_schulz_muon(&t32(&a)).unwrap();
    // Two f32 runs, each within `ns_error_bound` (ε_f32) of the exact map; the second input is
    // perturbed by its rounding (α·a in f64, then the f32 cast: u_64 + u_f32 relative, as e0;
    // entries stay normal in f32 for these α).
    let sched = NsSchedule::muon();
    let (r, s_, xs, _) = ns_inputs(&a, &sched);
    let tol = ns_error_bound(&sched, r, s_, &xs, f32::EPSILON as f64, 0.0)
        + ns_error_bound(&sched, r, s_, &xs, f32::EPSILON as f64, 2.0 * U32 + U64);
    for alpha in [1e-30, 1e-20, 1e-8, 1e20, 1e30] {
        let y = newton_schulz_muon(&t32(&a.mapv(|v| v * alpha))).unwrap();
        let e = max_abs_diff(
            &array_from_tensor(&x).unwrap(),
            &array_from_tensor(&y).unwrap(),
        );
        assert!(e <= tol, "α = {alpha}: {e} > {tol:e}");
    }
    let z = Tensor::zeros([3, 5], (Kind::Float, Device::Cpu));
    let o = newton_schulz_cubic(&z, 5).unwrap();
    assert_eq!(array_from_tensor(&o).unwrap(), Array2::<f64>::zeros((3, 5)));
}

#[test]
fn a_normalization_outside_the_kinds_range_is_an_error_on_tensors_and_batches() {
    // c = 1e300: X/(c·‖X‖_F) has norm 1e-300, below f32's and bf16's range, inside f64's.
    let sched = NsSchedule::repeated(kappa_linalg::CUBIC, 3, 1e300).unwrap();
    let is_normalization_error = |r: kappa_linalg::Result<Tensor>| {
        matches!(
            r,
            Err(LinalgError::Input(InputError::InvalidArgument {
                arg: "schedule.normalization",
                ..
            }))
        )
    };
    let a: Array2<f64> = gaussian(3, 5, 1);
    for kind in [Kind::Float, Kind::BFloat16, Kind::Double] {
        let x = tensor_from_array(a.view(), kind, Device::Cpu).unwrap();
        let batch = Tensor::stack(&[x.shallow_clone(), x.shallow_clone()], 0);
        let single = newton_schulz(&x, &sched);
        let batched = kappa_linalg::newton_schulz_batched(&batch, &sched);
        if kind == Kind::Double {
            assert!(single.is_ok() && batched.is_ok(), "{kind:?}");
        } else {
            assert!(is_normalization_error(single), "{kind:?}");
            assert!(is_normalization_error(batched), "{kind:?}");
        }
    }
}

#[test]
fn tch_inputs_are_checked() {
    let nan = Tensor::from_slice(&[1.0f32, f32::NAN, 0.0, 2.0]).view([2, 2]);
    match newton_schulz_muon(&nan) {
        Err(LinalgError::Input(InputError::NonFinite {
            arg: "x",
            row: 0,
            col: 1,
            ..
        })) => {}
        other => panic!("{:?}", other.map(|_| ())),
    }
    let inf = Tensor::from_slice(&[1.0f32, 0.0, f32::NEG_INFINITY, 2.0]).view([2, 2]);
    assert!(matches!(
        newton_schulz_muon(&inf),
        Err(LinalgError::Input(InputError::NonFinite {
            arg: "x",
            row: 1,
            col: 0,
            ..
        }))
    ));
    let empty = Tensor::zeros([0, 4], (Kind::Float, Device::Cpu));
    assert!(matches!(
        newton_schulz_muon(&empty),
        Err(LinalgError::Input(InputError::Empty { arg: "x", .. }))
    ));
    let v = Tensor::zeros([4], (Kind::Float, Device::Cpu));
    assert!(matches!(
        newton_schulz_muon(&v),
        Err(LinalgError::Input(InputError::ShapeMismatch {
            arg: "x",
            ..
        }))
    ));
    let ints = Tensor::zeros([2, 2], (Kind::Int64, Device::Cpu));
    assert!(matches!(
        newton_schulz_muon(&ints),
        Err(LinalgError::UnsupportedDtype { arg: "x", .. })
    ));
    let a = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
    assert!(matches!(
        Matrix::matmul(&a, &a),
        Err(LinalgError::Input(InputError::ShapeMismatch {
            arg: "rhs",
            ..
        }))
    ));
    let mut c = Tensor::zeros([2, 2], (Kind::Float, Device::Cpu));
    assert!(matches!(
        c.gemm(1.0, &a, &a, 0.0),
        Err(LinalgError::Input(InputError::ShapeMismatch {
            arg: "b",
            ..
        }))
    ));
    assert!(matches!(
        c.axpy(1.0, &a),
        Err(LinalgError::Input(InputError::ShapeMismatch {
            arg: "x",
            ..
        }))
    ));
    let bad = ndarray::array![[f64::NAN]];
    assert!(matches!(
        tensor_from_array(bad.view(), Kind::Float, Device::Cpu),
        Err(LinalgError::Input(InputError::NonFinite { arg: "a", .. }))
    ));
    let ok = ndarray::array![[1.0]];
    assert!(matches!(
        tensor_from_array(ok.view(), Kind::Int, Device::Cpu),
        Err(LinalgError::UnsupportedDtype { arg: "kind", .. })
    ));
    assert!(matches!(
        array_from_tensor(&v),
        Err(LinalgError::Input(InputError::ShapeMismatch {
            arg: "t",
            ..
        }))
    ));
}

#[test]
fn requires_grad_inputs_are_not_tracked() {
    let a: Array2<f64> = gaussian(4, 6, 1);
    let t = t32(&a).set_requires_grad(true);
    let o = newton_schulz_muon(&t).unwrap();
    assert!(!o.requires_grad());
}

/// The in-place f64 sum of squares (contiguous CPU f32 and bf16) against libtorch's reduction
/// in f64 on the same entries: each square is exact in f64, so the two sums differ only by f64
/// additions, at most n units of f64 roundoff relative (n ≤ 4,096 here: ≤ 1e-12).
#[test]
fn frobenius_norms_of_f32_and_bf16_tensors_match_the_f64_reduction() {
    for (m, n, seed) in [(1, 1, 1), (3, 7, 2), (64, 64, 3), (17, 129, 4)] {
        let a: Array2<f64> = gaussian(m, n, seed);
        for scale in [1e-30, 1.0, 1e30] {
            for kind in [Kind::Float, Kind::BFloat16] {
                let t = (t32(&a) * scale).to_kind(kind);
                let exact = t.to_kind(Kind::Double).norm().double_value(&[]);
                for (x, layout) in [(t.shallow_clone(), "row-major"), (t.tr(), "transposed")] {
                    let got = Matrix::frobenius_norm(&x).unwrap();
                    let rel = (got - exact).abs() / exact;
                    assert!(
                        rel <= 1e-12,
                        "{m}×{n} {kind:?} ×{scale:e} {layout}: {rel:e}"
                    );
                }
            }
        }
    }
    let bad = t32(&gaussian(3, 4, 5));
    let _ = bad.get(1).get(2).fill_(f64::NAN);
    assert!(Matrix::frobenius_norm(&bad).unwrap().is_nan());
    let _ = bad.get(1).get(2).fill_(f64::INFINITY);
    assert_eq!(Matrix::frobenius_norm(&bad).unwrap(), f64::INFINITY);
    let batch = Tensor::stack(&[t32(&gaussian(5, 6, 6)), t32(&gaussian(5, 6, 7))], 0);
    let norms = kappa_linalg::tch_backend::slice_frobenius_norms(&batch, "x").unwrap();
    for (i, got) in norms.into_iter().enumerate() {
        assert_eq!(got, Matrix::frobenius_norm(&batch.get(i as i64)).unwrap());
    }
    // A matrix, or a tensor of another kind, is an error, not a list of row norms.
    let matrix = t32(&gaussian(5, 6, 8));
    let shape = kappa_linalg::tch_backend::slice_frobenius_norms(&matrix, "x");
    assert!(matches!(
        shape,
        Err(LinalgError::Input(InputError::ShapeMismatch {
            arg: "x",
            ..
        }))
    ));
    let ints = Tensor::zeros([2, 3, 4], (Kind::Int64, Device::Cpu));
    let kind = kappa_linalg::tch_backend::slice_frobenius_norms(&ints, "x");
    assert!(matches!(
        kind,
        Err(LinalgError::UnsupportedDtype { arg: "x", .. })
    ));
}

/// `transposed_copy` is a deep, row-major copy of the transpose, also where the transpose of a
/// row or column would already count as contiguous; a tall matrix's Newton–Schulz result is
/// row-major and the bits of the wide iteration on that copy (its norm, summed in the tall
/// order, gives the same normalization factor here).
#[test]
fn tall_matrices_iterate_on_a_row_major_copy_of_their_transpose() {
    for (m, n) in [(5, 1), (1, 5), (48, 16)] {
        let x = t32(&gaussian(m, n, 8));
        let c = Matrix::transposed_copy(&x).unwrap();
        assert_eq!(c.size(), [n as i64, m as i64]);
        assert!(c.is_contiguous());
        assert_ne!(c.data_ptr(), x.data_ptr(), "{m}×{n}: a copy, not a view");
        assert!(c.equal(&x.tr()), "{m}×{n}");
    }
    let x = t32(&gaussian(48, 16, 9));
    let tall = newton_schulz_muon(&x).unwrap();
    let wide = newton_schulz_muon(&x.tr().contiguous()).unwrap();
    assert!(tall.is_contiguous());
    assert!(tall.equal(&wide.tr()));
}

/// `newton_schulz_normed` is `newton_schulz` without its first passes: the same bits on wide
/// and tall f32 and bf16 tensors (300×800 takes the row-block Gram in bf16), from `Normed::new`
/// and from the one-pass bf16 conversion, whose norms are `frobenius_norm`'s. The conversion
/// declines what it cannot norm: f64, a strided view, an empty tensor, a NaN, an entry that
/// rounds to ∞ in bf16.
#[test]
fn normed_newton_schulz_is_newton_schulz_bit_for_bit() {
    use kappa_linalg::tch_backend::to_bf16_normed;
    let s = NsSchedule::muon();
    for (m, n) in [(16, 48), (48, 16), (1, 5), (300, 800)] {
        let x = t32(&gaussian(m, n, 31));
        for kind in [Kind::Float, Kind::BFloat16] {
            let xk = x.to_kind(kind);
            let want = newton_schulz(&xk, &s).unwrap();
            let got = newton_schulz_normed(Normed::new(xk.copy()).unwrap(), &s).unwrap();
            assert!(got.equal(&want), "{m}×{n} {kind:?}");
        }
        let (normed, fro) = to_bf16_normed(&x).unwrap();
        assert_eq!(fro.to_bits(), Matrix::frobenius_norm(&x).unwrap().to_bits());
        let want = newton_schulz(&x.to_kind(Kind::BFloat16), &s).unwrap();
        let got = newton_schulz_normed(normed, &s).unwrap();
        assert!(got.equal(&want), "{m}×{n} from f32");
    }
    let x = t32(&gaussian(4, 6, 32));
    let with = |v: f64| {
        let y = x.copy();
        let _ = y.get(2).get(3).fill_(v);
        y
    };
    for (t, what) in [
        (x.to_kind(Kind::Double), "f64"),
        (x.tr(), "a transposed view"),
        (x.narrow(0, 0, 0), "empty"),
        (with(f64::NAN), "NaN"),
        (with(f64::from(f32::MAX)), "rounds to ∞"),
    ] {
        assert!(to_bf16_normed(&t).is_none(), "{what}");
    }
    assert!(matches!(
        Normed::new(with(f64::NAN)),
        Err(LinalgError::Input(InputError::NonFinite { arg: "x", .. }))
    ));
}

/// `validate` of a bf16 tensor (scanned in place by its exponent bits when contiguous, by
/// libtorch otherwise) finds NaN, +∞ and −∞ at every position, contiguous and transposed, and
/// passes the finite extremes: the largest bf16 (≈ 3.39e38), the smallest subnormal, −0.
#[test]
fn bf16_validate_finds_every_non_finite_entry() {
    let (m, n) = (3, 37);
    let base = || Tensor::ones([m, n], (Kind::BFloat16, Device::Cpu));
    let extremes = base();
    let _ = extremes.get(0).get(0).fill_(3.3895e38);
    let _ = extremes.get(1).get(5).fill_(-9.2e-41);
    let _ = extremes.get(2).get(36).fill_(-0.0);
    assert!(extremes.validate("x").is_ok());
    assert!(extremes.tr().validate("x").is_ok());
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        for at in 0..m * n {
            let t = base();
            let _ = t.get(at / n).get(at % n).fill_(bad);
            for (x, layout) in [(t.shallow_clone(), "row-major"), (t.tr(), "transposed")] {
                match x.validate("x") {
                    Err(LinalgError::Input(InputError::NonFinite { arg: "x", .. })) => {}
                    other => panic!("{bad} at {at}, {layout}: {other:?}"),
                }
            }
        }
    }
}
