//! The same steps on `tch` tensors (f32, CPU) and on `ndarray` f64: agreement within a derived
//! f32 tolerance, in-place updates through shared storage (as var-store parameters), and the
//! working precision chosen per device.
//!
//! # Tolerances (derived, not tuned)
//!
//! An f32 computation differs from the f64 one by rounding errors of relative size u = 2⁻²⁴
//! injected at every operation, each carried to the output by the pipeline's sensitivity. The
//! test measures that sensitivity itself: it reruns the f64 pipeline on the inputs rounded to f32
//! (exactly the inputs the f32 run sees), and d_in = max |Δ| between the two f64 outputs is the
//! effect of *one* injection of relative size u at the start (floored at u·max|out|, the output's
//! own f32 rounding, so a lucky d_in ≈ 0 cannot make the bound vacuous). Every later injection
//! passes through fewer operations, so it is amplified at most as much; with N injections (one
//! per input, per Newton–Schulz step, per retraction) and the √k growth of a length-k inner
//! product's rounding error (the probabilistic bound of Higham & Mary, k = the longer side), the
//! bound is
//!
//! ```text
//! tol = N · √k · max(d_in, u · max|out|)
//! ```
//!
//! Through an ascent that does not converge (square DGram; docs/optim.md, "DGram: a preconditioned dual ascent") the
//! K-step output amplifies rounding in a way no such bound makes useful, so the backends are
//! compared on the first candidate (K = 1: one msign of Z₀, plus the projection where the preset
//! has one) and, for the full ascent, only on quantities that do not depend on the noise: both
//! updated W are on the manifold to their precision, and the step's spectral norm is η.

use super::common::*;
use kappa_linalg::tch_backend::{array_from_tensor, tensor_from_array};
use kappa_optim::manifold::*;
use kappa_optim::*;
use ndarray::Array2;
use tch::{Device, Kind, Tensor};

/// f32's unit roundoff.
const U32: f64 = f32::EPSILON as f64 / 2.0;

fn t32(a: &Array2<f64>) -> Tensor {
    tensor_from_array(a.view(), Kind::Float, Device::Cpu).unwrap()
}

/// `a` rounded to f32 and back: the input the f32 run sees.
fn round32(a: &Array2<f64>) -> Array2<f64> {
    a.mapv(|x| x as f32 as f64)
}

/// The derived tolerance (module docs): `injections` rounding injections, inner products of
/// length `k`, the measured effect `d_in` of rounding the inputs, outputs of size `out_max`.
fn derived_tol(injections: usize, k: usize, d_in: f64, out_max: f64) -> f64 {
    injections as f64 * (k as f64).sqrt() * d_in.max(U32 * out_max)
}

fn max_abs(a: &Array2<f64>) -> f64 {
    a.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// Newton–Schulz steps of one msign call.
fn ns_steps(m: Msign) -> usize {
    match m {
        Msign::PolarExpress { steps } | Msign::GramPolarExpress { steps, .. } => steps,
        _ => 5,
    }
}

#[test]
fn muon_steps_agree_across_backends_and_update_in_place() {
    for (m, n) in [(48, 16), (16, 48), (24, 24)] {
        let w0 = gaussian(m, n, 1) * 0.1;
        let grads: Vec<Array2<f64>> = (0..3).map(|i| gaussian(m, n, 10 + i)).collect();
        let gram = MuonConfig {
            msign: Msign::gram_polar_express(),
            ..MuonConfig::paper()
        };
        for cfg in [MuonConfig::keller(), MuonConfig::paper(), gram] {
            let muon = Muon::new(cfg).unwrap();
            // F32 explicitly on tensors: Auto picks bf16 on CPUs with native bf16 products.
            let muon_t = Muon::new(MuonConfig {
                precision: Precision::F32,
                ..cfg
            })
            .unwrap();
            let run64 = |w0: &Array2<f64>, grads: &[Array2<f64>]| {
                let (mut w, mut st) = (w0.clone(), MuonState::new());
                for g in grads {
                    muon.step(&mut w, g, &mut st).unwrap();
                }
                w
            };
            let w = run64(&w0, &grads);
            let rounded: Vec<_> = grads.iter().map(round32).collect();
            let d_in = max_abs_diff(&run64(&round32(&w0), &rounded), &w);
            let param = t32(&w0);
            let mut alias = param.shallow_clone();
            let mut st_t = MuonState::new();
            for g in &grads {
                let info = muon_t.step(&mut alias, &t32(g), &mut st_t).unwrap();
                assert_eq!(info.precision, "f32");
            }
            let got = array_from_tensor(&param).unwrap();
            let e = max_abs_diff(&got, &w);
            // Injections: the inputs, then per step every NS step and the update itself; the
            // Gram form's r×r products (4 per step, 2 per block of 2) count Γ times each (the
            // gain of the factor they feed, `gram_gain`; Γ = 1 otherwise).
            let gram_products = match cfg.msign {
                Msign::GramPolarExpress { steps, restart } => {
                    4 * steps + 2 * steps.div_ceil(restart)
                }
                _ => 0,
            };
            let gram_part = gram_gain(cfg.msign)
                * derived_tol(gram_products * grads.len(), m.max(n), d_in, max_abs(&w));
            let injections = 1 + grads.len() * (ns_steps(cfg.msign) + 1);
            let tol = derived_tol(injections, m.max(n), d_in, max_abs(&w)) + gram_part;
            assert!(
                e <= tol,
                "{m}×{n} {:?}: {e} > {tol} (d_in {d_in})",
                cfg.msign
            );
        }
    }
}

/// The f64 steps of `opt` from `w0` with gradients `grads` (the final W and the reports).
fn manifold_run(
    opt: &ManifoldMuon,
    w0: &Array2<f64>,
    grads: &[Array2<f64>],
) -> (Array2<f64>, Vec<ManifoldStep<Array2<f64>>>) {
    let (mut w, mut st) = (w0.clone(), ManifoldState::new());
    let steps = grads
        .iter()
        .map(|g| opt.step(&mut w, g, &mut st).unwrap())
        .collect();
    (w, steps)
}

#[test]
fn manifold_steps_agree_across_backends() {
    for (m, n) in [(64, 24), (24, 64), (32, 32)] {
        for manifold in [
            Manifold::Stiefel,
            Manifold::dgram(),
            Manifold::DGram(DGramRetraction::ColumnNorms),
            Manifold::Oblique,
        ] {
            for preset in [
                DualAscent::paper().normalized(),
                DualAscent::preconditioned_feasible(),
            ] {
                let mut w0 = gaussian(m, n, 2) * 0.05;
                let full = ManifoldMuonConfig {
                    dual: preset,
                    ..ManifoldMuonConfig::paper(manifold)
                };
                ManifoldMuon::new(full)
                    .unwrap()
                    .retract_onto(&mut w0)
                    .unwrap();
                let grads: Vec<_> = (0..2).map(|i| gaussian(m, n, 20 + i)).collect();
                let label = format!("{m}×{n} {manifold:?} {preset:?}");
                first_candidate_agrees(full, &w0, &grads, &label);
                full_ascent_lands_on_the_manifold(full, &w0, &grads, &label);
            }
        }
    }
}

/// K = 1 (module docs): the steps through the first candidate agree within the derived bound.
fn first_candidate_agrees(
    full: ManifoldMuonConfig,
    w0: &Array2<f64>,
    grads: &[Array2<f64>],
    label: &str,
) {
    let cfg = ManifoldMuonConfig {
        dual: DualAscent {
            steps: 1,
            ..full.dual
        },
        ..full
    };
    let opt = ManifoldMuon::new(cfg).unwrap();
    let (w, _) = manifold_run(&opt, w0, grads);
    let rounded: Vec<_> = grads.iter().map(round32).collect();
    let d_in = max_abs_diff(&manifold_run(&opt, &round32(w0), &rounded).0, &w);
    let (param, reports) = tch_f32_run(cfg, w0, grads);
    for b in &reports {
        assert_eq!(b.dual.msign_calls, 1, "{label}");
    }
    let e = max_abs_diff(&array_from_tensor(&param).unwrap(), &w);
    // Injections: the inputs; per step the candidate's msign, the retraction's msign (or SVD),
    // the ‖G‖_* diagnostic does not reach W.
    let (m, n) = w0.dim();
    let injections = 1 + grads.len() * (2 * ns_steps(cfg.msign) + 2);
    let tol = derived_tol(injections, m.max(n), d_in, max_abs(&w));
    assert!(e <= tol, "{label}, K = 1: {e} > {tol} (d_in {d_in})");
}

/// `cfg` in f32 on a tch copy of `w0`, one step per gradient: the final parameter and the
/// step reports.
fn tch_f32_run(
    cfg: ManifoldMuonConfig,
    w0: &Array2<f64>,
    grads: &[Array2<f64>],
) -> (Tensor, Vec<ManifoldStep<Tensor>>) {
    let opt = ManifoldMuon::new(ManifoldMuonConfig {
        precision: Precision::F32,
        ..cfg
    })
    .unwrap();
    let param = t32(w0);
    let mut alias = param.shallow_clone();
    let mut state = ManifoldState::new();
    let reports = grads
        .iter()
        .map(|g| opt.step(&mut alias, &t32(g), &mut state).unwrap())
        .collect();
    (param, reports)
}

/// The full preset ascent: f32 and f64 both land on the manifold to their precision, with step
/// spectral norm η (noise-independent facts; module docs).
fn full_ascent_lands_on_the_manifold(
    cfg: ManifoldMuonConfig,
    w0: &Array2<f64>,
    grads: &[Array2<f64>],
    label: &str,
) {
    let (_, reports) = tch_f32_run(cfg, w0, grads);
    let (_, steps64) = manifold_run(&ManifoldMuon::new(cfg).unwrap(), w0, grads);
    // Polar Express in f32 leaves σ within 1 ± ≈ 1e-6 + k·u (module docs of msign): the
    // retracted W holds its constraint to ≈ √k·10·u relative, 1e-4 is that for k ≤ 64 with a
    // factor > 10 to spare; f64 to the 1e-6 of Polar Express itself.
    for (b, a) in reports.iter().zip(&steps64) {
        assert!(
            b.manifold_violation <= 1e-4,
            "{label}: f32 {}",
            b.manifold_violation
        );
        assert!(
            a.manifold_violation <= 1e-5,
            "{label}: f64 {}",
            a.manifold_violation
        );
        assert_eq!(b.direction.size(), [w0.nrows() as i64, w0.ncols() as i64]);
    }
}

#[test]
fn bf16_msign_is_available_and_loose() {
    // The paper's precision on a CPU (emulated, slow). Not a comparison of two computations but
    // bf16's accuracy band (docs/optim.md, "Precision per device": measured −2.3e-2/+4e-3 at
    // 384×384; 2e-2 is the documented band, ≈ 5·u_bf16 with u_bf16 = 2⁻⁸ ≈ 3.9e-3).
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
fn the_gram_form_refuses_long_periods_in_bf16_only() {
    // Period 3 diverged in bf16 on graded inputs (kappa-linalg's Gram tests): a clear error
    // naming the setting, before anything is computed; f32 and the default period still run.
    // The AOL Gram form alike (period 3 left the bf16 band in kappa-linalg's
    // `bf16_gram_aol_keeps_the_band_at_periods_1_and_2`).
    let t = t32(&gaussian(48, 16, 3));
    let longs = [
        Msign::GramPolarExpress {
            steps: 5,
            restart: 3,
        },
        Msign::GramAol {
            steps: 4,
            restart: 3,
            lower: None,
        },
    ];
    for long in longs {
        match msign(&t, long, Precision::Bf16) {
            Err(OptimError::Input(e)) => assert_eq!(e.arg(), "msign"),
            other => panic!("expected an input error on `msign`, got {other:?}"),
        }
        assert!(msign(&t, long, Precision::F32).is_ok());
    }
    assert!(msign(&t, Msign::gram_polar_express(), Precision::Bf16).is_ok());
    assert!(msign(&t, Msign::gram_aol(), Precision::Bf16).is_ok());
}

#[test]
fn auto_precision_follows_the_cpu_rule() {
    // CPU tensors: bf16 where the CPU multiplies bf16 natively and the matrix is large enough
    // (≥ auto_bf16_min_step_flops() per Newton–Schulz step), f32 elsewhere; f64 stays f64.
    let large = if cpu_has_native_bf16() { "bf16" } else { "f32" };
    let (small, big) = (t32(&gaussian(8, 4, 1)), t32(&gaussian(256, 256, 1)));
    for (t, want) in [(&small, "f32"), (&big, large)] {
        assert_eq!(t.working_name(Precision::Auto).unwrap(), want);
        let b = t.to_kind(Kind::BFloat16);
        assert_eq!(b.working_name(Precision::Auto).unwrap(), want);
    }
    // The boundary, counted per step: 96×96 below, 112×112 and 320×80 above; a batch counts
    // whole (four 64×192 matrices in one call are above, one is below).
    let flops = precision::ns_step_flops;
    assert!(flops(&[96, 96]) < precision::AUTO_BF16_MIN_STEP_FLOPS);
    assert!(flops(&[112, 112]) >= precision::AUTO_BF16_MIN_STEP_FLOPS);
    assert!(flops(&[320, 80]) >= precision::AUTO_BF16_MIN_STEP_FLOPS);
    assert!(flops(&[64, 192]) < precision::AUTO_BF16_MIN_STEP_FLOPS);
    assert!(flops(&[4, 64, 192]) >= precision::AUTO_BF16_MIN_STEP_FLOPS);
    assert_eq!(flops(&[64, 192]), flops(&[192, 64]));
    // Where f32 products take AVX-512 (and bf16 ones no AMX): 96×384 below, 64×1024 above.
    assert!(flops(&[96, 384]) < precision::AUTO_BF16_MIN_STEP_FLOPS_AVX512_F32);
    assert!(flops(&[64, 1024]) >= precision::AUTO_BF16_MIN_STEP_FLOPS_AVX512_F32);
    // This process uses one of the two, and Auto follows it on either side.
    let threshold = precision::auto_bf16_min_step_flops();
    assert!([
        precision::AUTO_BF16_MIN_STEP_FLOPS,
        precision::AUTO_BF16_MIN_STEP_FLOPS_AVX512_F32
    ]
    .contains(&threshold));
    for shape in [[96, 96], [112, 112], [96, 384], [64, 1024]] {
        let want = if flops(&shape) >= threshold {
            large
        } else {
            "f32"
        };
        let t = Tensor::zeros(shape, (Kind::Float, Device::Cpu));
        assert_eq!(t.working_name(Precision::Auto).unwrap(), want, "{shape:?}");
    }
    let batch = Tensor::zeros([8, 64, 192], (Kind::Float, Device::Cpu));
    assert_eq!(batch.working_name(Precision::Auto).unwrap(), large);
    let d = small.to_kind(Kind::Double);
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
    // The accuracy cost of bf16 msign (docs/optim.md, "Precision per device"): documented bands,
    // not comparisons. Polar Express σ within 2e-2 of 1 in bf16 (≈ 5·u_bf16) and 1e-4 in f32
    // (the 1e-6 band plus f32 rounding: 10 steps × 3 products × √96 · u_f32 ≈ 1.7e-5, with the
    // contraction near 1 keeping it there; 1e-4 leaves 6×); the Muon quintic stays in its band
    // [0.6818, 1.1344] (kappa_linalg::MUON_BAND; 96×32 Gaussian: σ_min/‖X‖_F ≈ 0.06 ≫ 0.0052),
    // widened by 0.0118/0.0156 ≈ 3·u_bf16 for bf16 rounding (measured band 0.68–1.14).
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

/// γ_k for unit roundoff `u`.
fn gamma_u(k: usize, u: f64) -> f64 {
    k as f64 * u / (1.0 - k as f64 * u)
}

#[test]
fn the_oblique_retraction_agrees_across_backends_entry_by_entry() {
    // Derived per entry (tests/muon/oblique.rs, `oblique_bound`): a backend computes
    // x_ij = y_ij·c_j with c_j/(1/‖y_j‖) a product of ≤ m/2 + 4 factors (1 + δ)^{±1} (the squared
    // norm's m roundings under the square root, then √, 1/d, the cast of c_j to the tensor's kind
    // and the product), so |x_ij − y_ij/‖y_j‖| ≤ γ_{m+8}·|x_ij|. The f32 run sees y rounded to f32
    // (relative u₃₂ per entry, which moves y_ij/‖y_j‖ by ≤ γ₂(u₃₂) relative). Hence
    // |x₃₂ − x₆₄| ≤ |x₆₄|·(γ_{m+10}(u₃₂) + 2γ_{m+8}(u₆₄)) to first order.
    for (m, n) in [(64, 24), (24, 64), (32, 32), (200, 3)] {
        let w0 = gaussian(m, n, 31) * 0.05;
        let opt = ManifoldMuon::new(ManifoldMuonConfig {
            precision: Precision::F32,
            ..ManifoldMuonConfig::paper(Manifold::Oblique)
        })
        .unwrap();
        let mut w64 = w0.clone();
        opt.retract_onto(&mut w64).unwrap();
        let param = t32(&w0);
        let mut alias = param.shallow_clone();
        opt.retract_onto(&mut alias).unwrap();
        let w32 = array_from_tensor(&param).unwrap();
        let k = m.max(n);
        let rel = gamma_u(k + 10, U32) + 2.0 * gamma(k + 8);
        for (a, b) in w32.iter().zip(&w64) {
            assert!(
                (a - b).abs() <= rel * b.abs(),
                "{m}×{n}: {a} vs {b} (rel {rel:e})"
            );
        }
        // The f32 parameter is on Oblique to f32's bound (the library's f32 measure adds γ_k).
        let v = opt.violation(&param).unwrap();
        let tol = gamma_u(k + 8, U32) + gamma_u(k, U32);
        assert!(v <= tol, "{m}×{n}: f32 violation {v:e} > {tol:e}");
        // A step in place keeps it there.
        let mut state = ManifoldState::new();
        let step = opt
            .step(&mut alias, &t32(&gaussian(m, n, 32)), &mut state)
            .unwrap();
        assert!(
            step.manifold_violation <= tol,
            "{m}×{n}: step {:e}",
            step.manifold_violation
        );
        assert!(opt.violation(&param).unwrap() <= tol);
    }
}

#[test]
fn oblique_bad_tensors_are_typed_errors() {
    let opt = ManifoldMuon::new(ManifoldMuonConfig::paper(Manifold::Oblique)).unwrap();
    let mut w = gaussian(8, 3, 40);
    w.column_mut(2).fill(0.0);
    let t = t32(&w);
    let mut alias = t.shallow_clone();
    let r = opt.retract_onto(&mut alias);
    assert!(
        matches!(
            r,
            Err(OptimError::ZeroColumn {
                arg: "w",
                column: 2,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(array_from_tensor(&t).unwrap(), round32(&w), "unchanged");
    // (tensor_from_array refuses NaN itself: write it into a finite tensor.)
    let mut nan = t32(&gaussian(8, 3, 41));
    let _ = nan.narrow(0, 1, 1).narrow(1, 1, 1).fill_(f64::NAN);
    let r = opt.retract_onto(&mut nan);
    assert!(
        matches!(
            r,
            Err(OptimError::Input(InputError::NonFinite { arg: "w", .. }))
        ),
        "{r:?}"
    );
}

/// Entries of a CPU f32 tensor.
fn f32_entries(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(&t.flatten(0, -1)).expect("f32 tensor")
}

/// The momentum recursion entry by entry, rounded as the one-pass form documents (libtorch's
/// AVX2/AVX-512 rounding): the factors rounded to f32, t = fl(w_g·g), every a + β·b one fused
/// multiply-add. Returns (B_new, U) with U = B_new without Nesterov.
fn momentum_reference(g: &[f32], old: Option<&[f32]>, m: &Momentum) -> (Vec<f32>, Vec<f32>) {
    let beta = m.beta as f32;
    let t = |g: f32| match m.kind {
        MomentumKind::Ema => g * (1.0 - m.beta) as f32,
        MomentumKind::Sgd => g,
    };
    let b: Vec<f32> = match old {
        Some(old) => g
            .iter()
            .zip(old)
            .map(|(&g, &o)| o.mul_add(beta, t(g)))
            .collect(),
        None => g.iter().map(|&g| t(g)).collect(),
    };
    let u = match m.nesterov {
        true => g
            .iter()
            .zip(&b)
            .map(|(&g, &b)| b.mul_add(beta, t(g)))
            .collect(),
        false => b.clone(),
    };
    (b, u)
}

/// `Elementwise::momentum_in_one_pass` with the factors of `m`.
fn one_pass(g: &Tensor, buffer: Option<&Tensor>, m: &Momentum) -> Option<(Tensor, Option<Tensor>)> {
    let grad_weight = match m.kind {
        MomentumKind::Ema => 1.0 - m.beta,
        MomentumKind::Sgd => 1.0,
    };
    g.momentum_in_one_pass(buffer, grad_weight, m.beta, m.nesterov)
}

/// The one-pass momentum of CPU f32 tensors (`Elementwise::momentum_in_one_pass`, the path every
/// Muon step on them takes) gives, bit for bit, the recursion rounded as documented, for every
/// form, with and without a buffer, on one and two threads, at sizes below a work unit, across
/// several units (with a tail) and above the threshold of the parallel pass (2²¹ entries); entries span small, large and
/// subnormal magnitudes and both signs of zero. Its U agrees with the operation-by-operation form
/// (`Momentum::advance`, whose bits depend on the libtorch kernel the CPU gets: equal on AVX2 and
/// AVX-512, each β·b rounded apart on the generic kernel) within the roundings that separate
/// them: B_new differs by ≤ u(2|B_new| + β|B|) and U by ≤ 2u|U| + uβ|B_new| + β·(that), so
/// |ΔU| ≤ u·(2|U| + β(3|B_new| + |B|)) to first order (×(1 + 4u) for the rest), u = 2⁻²⁴.
#[test]
fn one_pass_momentum_rounds_as_documented() {
    let forms = [
        Momentum::keller(),
        Momentum::paper(),
        Momentum::none(),
        Momentum {
            nesterov: false,
            ..Momentum::keller()
        },
        Momentum {
            beta: 0.9,
            kind: MomentumKind::Ema,
            nesterov: true,
        },
    ];
    let threads = tch::get_num_threads();
    for t in [1, 2] {
        tch::set_num_threads(t);
        for (seed, (m, n)) in [(1, 7), (33, 65), (130, 260), (401, 401), (1030, 2048)]
            .into_iter()
            .enumerate()
        {
            let mut next_seed = 900 + 2 * seed as u64;
            let mut draw = || {
                next_seed += 1;
                let a = gaussian(m, n, next_seed).mapv(|x| x * 10f64.powf(6.0 * x.tanh()));
                let a = t32(&a);
                // A subnormal, a large value and a negative zero in every matrix.
                let _ = a.get(0).get(0).fill_(1e-41);
                let _ = a.get(m as i64 - 1).get(n as i64 - 1).fill_(3e37);
                let _ = a.get(0).get(n as i64 - 1).fill_(-0.0);
                a
            };
            let (g, b) = (draw(), draw());
            let (gv, bv) = (f32_entries(&g), f32_entries(&b));
            for form in &forms {
                for buffer in [None, Some(&b)] {
                    let what = format!(
                        "{form:?}, {m}×{n}, buffer {}, {t} thread(s)",
                        buffer.is_some()
                    );
                    let (buf, u) =
                        one_pass(&g, buffer, form).expect("CPU f32 tensors take the one-pass form");
                    let u = u.unwrap_or_else(|| buf.shallow_clone());
                    let (b_ref, u_ref) = momentum_reference(&gv, buffer.map(|_| &bv[..]), form);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&f32_entries(&buf)), bits(&b_ref), "buffer: {what}");
                    assert_eq!(bits(&f32_entries(&u)), bits(&u_ref), "U: {what}");
                    let (_, u_ops) = form.advance(buffer, &g).expect("advance");
                    let unit = f64::from(f32::EPSILON) / 2.0;
                    let old = |i: usize| buffer.map_or(0.0, |_| f64::from(bv[i].abs()));
                    for (i, (&x, &y)) in
                        f32_entries(&u).iter().zip(&f32_entries(&u_ops)).enumerate()
                    {
                        let (u_i, b_i) = (f64::from(u_ref[i].abs()), f64::from(b_ref[i].abs()));
                        let first_order = 2.0 * u_i + form.beta * (3.0 * b_i + old(i));
                        let bound = unit * first_order * (1.0 + 4.0 * unit);
                        let d = (f64::from(x) - f64::from(y)).abs();
                        assert!(d <= bound, "U[{i}] {x} vs operations {y}: {what}");
                    }
                }
            }
        }
    }
    tch::set_num_threads(threads);
    // Operands the pass does not take: f64, a transposed view, a buffer of another shape.
    let g = t32(&gaussian(4, 6, 7));
    let m = Momentum::keller();
    assert!(one_pass(&g.to_kind(Kind::Double), None, &m).is_none());
    assert!(one_pass(&g.tr(), None, &m).is_none());
    // A buffer with the gradient's entry count but another shape: left to the operations,
    // whose checks report it.
    assert!(one_pass(&g, Some(&g.tr().contiguous()), &m).is_none());
}

/// Entries spanning small, large and subnormal magnitudes, both signs of zero, bf16 ties in both
/// directions and values that round up to ∞ in bf16, as a CPU f32 tensor.
fn spread_f32(m: usize, n: usize, seed: u64) -> Tensor {
    let a = gaussian(m, n, seed).mapv(|x| x * 10f64.powf(6.0 * x.tanh()));
    let a = t32(&a);
    let edges = [
        1e-41,
        -0.0,
        1.0 + f32::powi(2.0, -8),
        1.0 + 3.0 * f32::powi(2.0, -8),
        f32::MAX,
        -3.3961e38,
        -1.5e-39,
    ];
    for (j, &v) in edges.iter().enumerate().take(n) {
        let _ = a.get(0).get(j as i64).fill_(f64::from(v));
    }
    a
}

/// The conversion of a CPU f32 tensor to bf16 with both norms in one pass
/// (`WorkingPrecision::to_working_with_norm`, the path msign's input takes in bf16) gives
/// libtorch's conversion and `Matrix::frobenius_norm` of the input and of the result bit for bit:
/// rounding to nearest with ties to even (ties, overflow to ∞, subnormals and −0 included, as
/// the kernel writes them), each norm summed in the norm's own order. An input with an entry
/// whose rounding overflows is left to the general path (`None`), which rescales it first.
#[test]
fn bf16_conversion_with_the_norms_is_libtorchs_bit_for_bit() {
    use kappa_linalg::scalar::sums_of_squares_to_bf16;
    let bits = |t: &Tensor| t.view_dtype(Kind::Int16);
    let norm = |t: &Tensor| kappa_linalg::Matrix::frobenius_norm(t).unwrap().to_bits();
    for (m, n) in [(1, 7), (33, 65), (401, 401)] {
        let a = spread_f32(m, n, 70 + m as u64);
        let x = f32_entries(&a);
        let mut out = vec![0u16; x.len()];
        let (input, _) = sums_of_squares_to_bf16(&x, &mut out).unwrap();
        let out: Vec<i16> = out.iter().map(|&b| b as i16).collect();
        let kernel = Tensor::from_slice(&out).reshape([m as i64, n as i64]);
        assert!(kernel.equal(&bits(&a.to_kind(Kind::BFloat16))), "{m}×{n}");
        assert_eq!(input.sqrt().to_bits(), norm(&a), "{m}×{n}");
        assert!(a.to_working_with_norm(Precision::Bf16).unwrap().is_none());

        let a = a.clamp(-1e38, 1e38);
        let (normed, fro) = a
            .to_working_with_norm(Precision::Bf16)
            .unwrap()
            .expect("CPU f32 → bf16 takes the one-pass form");
        let want = a.to_kind(Kind::BFloat16);
        assert!(bits(normed.matrix()).equal(&bits(&want)), "{m}×{n}");
        assert_eq!(fro.to_bits(), norm(&a), "{m}×{n}");
        assert_eq!(normed.fro().to_bits(), norm(&want), "{m}×{n}");
        // Already in the working type, or not converted to bf16: no one-pass form.
        assert!(a.to_working_with_norm(Precision::F32).unwrap().is_none());
        assert!(want
            .to_working_with_norm(Precision::Bf16)
            .unwrap()
            .is_none());
    }
}

/// Muon's update of a CPU f32 weight from a bf16 direction in one pass
/// (`WorkingPrecision::update_from_working`) is W·d then fma(O, α, ·) bit for bit, on one and two
/// threads and above the parallel pass's threshold (2²¹ entries), with and without decay. It
/// agrees with `Matrix::scale` and `Matrix::axpy` on O converted to f32: equal on libtorch's AVX2
/// and AVX-512 kernels; its generic kernel rounds α·O apart, one rounding of at most u·|α·o|
/// before the sum's, so |Δ| ≤ u·(|α·o| + 2|w'|)·(1 + 4u), u = 2⁻²⁴. A weight that is not
/// contiguous is left to the caller (`Ok(false)`, unchanged).
#[test]
fn bf16_update_in_one_pass_rounds_as_documented() {
    let threads = tch::get_num_threads();
    let (alpha, d) = (-0.0217f64, 0.9993f64);
    for t in [1, 2] {
        tch::set_num_threads(t);
        for (m, n) in [(1, 7), (130, 260), (1030, 2048)] {
            let w0 = spread_f32(m, n, 90 + m as u64).clamp(-1e30, 1e30);
            let o = t32(&gaussian(m, n, 91 + m as u64)).to_kind(Kind::BFloat16);
            let (wv, ov) = (f32_entries(&w0), f32_entries(&o.to_kind(Kind::Float)));
            for decay in [None, Some(d)] {
                let what = format!("{m}×{n}, decay {decay:?}, {t} thread(s)");
                let mut w = w0.copy();
                assert!(w.update_from_working(decay, alpha, &o).unwrap(), "{what}");
                let (a32, d32) = (alpha as f32, decay.map(|d| d as f32));
                let want: Vec<u32> = (wv.iter().zip(&ov))
                    .map(|(&w, &o)| o.mul_add(a32, d32.map_or(w, |d| w * d)).to_bits())
                    .collect();
                let got: Vec<u32> = f32_entries(&w).iter().map(|x| x.to_bits()).collect();
                assert!(got == want, "bits: {what}");
                let mut ops = w0.copy();
                if let Some(d) = decay {
                    kappa_linalg::Matrix::scale(&mut ops, d).unwrap();
                }
                kappa_linalg::Matrix::axpy(&mut ops, alpha, &o.to_kind(Kind::Float)).unwrap();
                let u = f64::from(f32::EPSILON) / 2.0;
                for ((&x, &y), &o) in f32_entries(&w).iter().zip(&f32_entries(&ops)).zip(&ov) {
                    let bound = u * (f64::from(a32 * o).abs() + 2.0 * f64::from(x).abs());
                    let diff = (f64::from(x) - f64::from(y)).abs();
                    assert!(diff <= bound * (1.0 + 4.0 * u), "ops: {what}: {x} vs {y}");
                }
            }
        }
    }
    tch::set_num_threads(threads);
    let mut strided = t32(&gaussian(8, 6, 5)).tr();
    let o = t32(&gaussian(6, 8, 6)).to_kind(Kind::BFloat16);
    let before = strided.copy();
    assert!(!strided.update_from_working(None, 0.1, &o).unwrap());
    assert!(strided.equal(&before));
}
