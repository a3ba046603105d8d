//! The same steps on `tch` tensors (f32, CPU) and on `ndarray` f64: agreement within the
//! documented f32 tolerance, in-place updates through shared storage (as var-store parameters),
//! and the working precision chosen per device.
//!
//! Tolerances (max |Δ| over entries of W after the steps): Muon 1e-4 (entries of the update are
//! lr·O(1/√n), Polar Express in f32 agrees with f64 to ≈1e-5 relative); manifold Muon 2e-4 (20
//! f32 msign calls in the dual ascent plus the retraction), 1e-3 for square DGram, whose ascent
//! does not converge and amplifies rounding.

use super::common::*;
use kappa_linalg::tch_backend::{array_from_tensor, tensor_from_array};
use kappa_optim::manifold::*;
use kappa_optim::*;
use ndarray::Array2;
use tch::{Device, Kind, Tensor};

fn t32(a: &Array2<f64>) -> Tensor {
    tensor_from_array(a.view(), Kind::Float, Device::Cpu).unwrap()
}

#[test]
fn muon_steps_agree_across_backends_and_update_in_place() {
    for (m, n) in [(48, 16), (16, 48), (24, 24)] {
        let w0 = gaussian(m, n, 1) * 0.1;
        let grads: Vec<Array2<f64>> = (0..3).map(|i| gaussian(m, n, 10 + i)).collect();
        for cfg in [MuonConfig::keller(), MuonConfig::paper()] {
            let muon = Muon::new(cfg).unwrap();
            // F32 explicitly on tensors: Auto picks bf16 on CPUs with native bf16 products.
            let muon_t = Muon::new(MuonConfig {
                precision: Precision::F32,
                ..cfg
            })
            .unwrap();
            let mut w = w0.clone();
            let mut st = MuonState::new();
            let param = t32(&w0);
            let mut alias = param.shallow_clone();
            let mut st_t = MuonState::new();
            for g in &grads {
                muon.step(&mut w, g, &mut st).unwrap();
                let info = muon_t.step(&mut alias, &t32(g), &mut st_t).unwrap();
                assert_eq!(info.precision, "f32");
            }
            let got = array_from_tensor(&param).unwrap();
            let e = max_abs_diff(&got, &w);
            assert!(e <= 1e-4, "{m}×{n} {:?}: {e}", cfg.msign);
        }
    }
}

#[test]
fn manifold_steps_agree_across_backends() {
    for (m, n) in [(64, 24), (24, 64), (32, 32)] {
        for manifold in [
            Manifold::Stiefel,
            Manifold::dgram(),
            Manifold::DGram(DGramRetraction::ColumnNorms),
        ] {
            for dual in [
                DualAscent::paper().normalized(),
                DualAscent::preconditioned_feasible(),
            ] {
                let cfg = ManifoldMuonConfig {
                    dual,
                    ..ManifoldMuonConfig::paper(manifold)
                };
                let opt = ManifoldMuon::new(cfg).unwrap();
                let opt_t = ManifoldMuon::new(ManifoldMuonConfig {
                    precision: Precision::F32,
                    ..cfg
                })
                .unwrap();
                let mut w = gaussian(m, n, 2) * 0.05;
                opt.retract_onto(&mut w).unwrap();
                let param = t32(&w);
                let mut alias = param.shallow_clone();
                let (mut st, mut st_t) = (ManifoldState::new(), ManifoldState::new());
                for i in 0..2 {
                    let g = gaussian(m, n, 20 + i);
                    let a = opt.step(&mut w, &g, &mut st).unwrap();
                    let b = opt_t.step(&mut alias, &t32(&g), &mut st_t).unwrap();
                    assert_eq!(a.dual.msign_calls, b.dual.msign_calls);
                }
                let e = max_abs_diff(&array_from_tensor(&param).unwrap(), &w);
                // Square DGram's ascent does not converge (§10), which amplifies f32 rounding.
                let tol = if m == n && manifold != Manifold::Stiefel {
                    1e-3
                } else {
                    2e-4
                };
                assert!(e <= tol, "{m}×{n} {manifold:?} {dual:?}: {e}");
            }
        }
    }
}

#[test]
fn bf16_msign_is_available_and_loose() {
    // The paper's precision on a CPU (emulated, slow): σ of the Polar Express output within 1e-2.
    let x = gaussian(48, 16, 3);
    let t = t32(&x);
    let q = msign(&t, Msign::polar_express(), Precision::Bf16).unwrap();
    assert_eq!(q.kind(), Kind::Float, "returned in the input's kind");
    for s in sv(&array_from_tensor(&q).unwrap()) {
        assert!((s - 1.0).abs() <= 2e-2, "σ = {s}");
    }
    let tb = t.to_kind(Kind::BFloat16);
    assert_eq!(tb.working_name(Precision::Native).unwrap(), "bf16");
}

#[test]
fn auto_precision_follows_the_cpu_rule() {
    // CPU tensors: bf16 where the CPU multiplies bf16 natively, f32 elsewhere; f64 stays f64.
    let t = t32(&gaussian(8, 4, 1));
    let want = if cpu_has_native_bf16() { "bf16" } else { "f32" };
    assert_eq!(t.working_name(Precision::Auto).unwrap(), want);
    assert_eq!(
        t.to_kind(Kind::BFloat16)
            .working_name(Precision::Auto)
            .unwrap(),
        want
    );
    let d = t.to_kind(Kind::Double);
    assert_eq!(d.working_name(Precision::Auto).unwrap(), "f64");
    // Without the environment override, the answer is the hardware's.
    if std::env::var_os(precision::CPU_BF16_ENV).is_none() {
        assert_eq!(cpu_has_native_bf16(), precision::detect_native_bf16());
    }
    // ndarray computes in its own type whatever the CPU.
    assert_eq!(
        gaussian(4, 4, 1).working_name(Precision::Auto).unwrap(),
        "f64"
    );
}

#[test]
fn bf16_update_band_against_f32() {
    // The accuracy cost of bf16 msign (docs/optim.md): Polar Express σ within 2e-2 of 1 in bf16
    // and 1e-4 in f32; the Muon quintic stays in its band [0.68, 1.14] (+ bf16 slack) in both.
    let t = t32(&gaussian(96, 32, 4));
    for (p, pe_tol) in [(Precision::F32, 1e-4), (Precision::Bf16, 2e-2)] {
        let q = msign(&t, Msign::polar_express(), p).unwrap();
        for s in sv(&array_from_tensor(&q).unwrap()) {
            assert!((s - 1.0).abs() <= pe_tol, "{p:?} PE σ = {s}");
        }
        let q = msign(&t, Msign::MuonQuintic, p).unwrap();
        for s in sv(&array_from_tensor(&q).unwrap()) {
            assert!((0.67..=1.15).contains(&s), "{p:?} NS5 σ = {s}");
        }
    }
}
