//! `Muon::step_batch` against one `Muon::step` per matrix (tch, CPU, f64 and f32).
//!
//! # Tolerance (derived, not tuned)
//!
//! The momentum does not depend on W, so both paths feed msign the same U bit for bit (the
//! buffers are compared exactly); they differ only in the rounding of the batched products of
//! Newton–Schulz. The per-matrix step's response d to its gradient perturbed by one unit
//! roundoff u (relative, random signs; momentum is linear in g, so U moves by the same relative
//! u) is measured, floored at u·max|ΔW| (the step's own rounding), and bounds the effect of one
//! rounding injection; the batched path injects 3 per Newton–Schulz step into products of length
//! ≤ k (the longer side), so tol = 3·steps·√k·max(d, u·max|ΔW|) per Muon step (the √k of
//! Higham & Mary, as `tch_backend.rs`), summed over the steps taken. Variants that are not
//! batched (`Exact`) must agree exactly. The common batch runs as one bank (momentum on the
//! stacked matrices: elementwise, so the buffers still agree bit for bit); a tiny momentum input
//! and a batch of fresh and older states take the per-matrix path, and are in the test too.

use kappa_linalg::tch_backend::tensor_from_array;
use kappa_optim::*;
use tch::{Device, Kind, Tensor};

use super::common::gaussian;

/// Seeded Gaussian tensors, independent of libtorch's global generator, which the tests of this
/// binary (parallel threads) would share and interleave: every draw is the same on every run.
pub struct Draws(pub u64);

impl Draws {
    pub fn next(&mut self, shape: [i64; 2], kind: Kind) -> Tensor {
        self.0 += 1;
        let a = gaussian(shape[0] as usize, shape[1] as usize, self.0);
        tensor_from_array(a.view(), kind, Device::Cpu).unwrap()
    }
}

/// The unit roundoff of a tensor kind (f32's for f32 and bf16 arithmetic).
pub fn unit(kind: Kind) -> f64 {
    match kind {
        Kind::Double => f64::EPSILON / 2.0,
        _ => f32::EPSILON as f64 / 2.0,
    }
}

/// max |t| as f64.
pub fn max_abs(t: &Tensor) -> f64 {
    t.abs().max().to_kind(Kind::Double).double_value(&[])
}

/// A deep copy of a state.
fn copy_state(s: &MuonState<Tensor>) -> MuonState<Tensor> {
    let m = MomentumState::from_parts(s.buffer().map(Tensor::copy), s.steps());
    MuonState::from_momentum(m, s.second_moment().map(<[f64]>::to_vec))
}

/// The Newton–Schulz steps of a schedule msign.
pub fn ns_steps(m: Msign) -> usize {
    match m {
        Msign::PolarExpress { steps } | Msign::PolarExpressDesigned { steps, .. } => steps,
        _ => 5,
    }
}

fn configs() -> Vec<MuonConfig> {
    let f64_native = |c: MuonConfig| MuonConfig {
        precision: Precision::Native,
        lr: 0.05,
        ..c
    };
    vec![
        f64_native(MuonConfig::keller()),
        f64_native(MuonConfig::paper()),
        MuonConfig {
            cautious_weight_decay: true,
            ..f64_native(MuonConfig::paper().with_normuon())
        },
        MuonConfig {
            msign: Msign::Exact,
            ..f64_native(MuonConfig::paper())
        },
    ]
}

/// The measured response of one per-matrix step from (`w`, `state`) to `g` perturbed by u.
fn response(
    muon: &Muon,
    w: &Tensor,
    g: &Tensor,
    state: &MuonState<Tensor>,
    u: f64,
    draws: &mut Draws,
) -> Tensor {
    let noise = draws.next([g.size()[0], g.size()[1]], g.kind()).sign() * u;
    let gp = g * (noise + 1.0);
    let mut wp = w.copy();
    muon.step(&mut wp, &gp, &mut copy_state(state)).unwrap();
    wp
}

/// One per-matrix step of the reference `w` and the tolerance it adds (module docs):
/// 3·steps·√k·max(d, u·max|ΔW|), d the step's response to g perturbed by u, for
/// `(u, k, steps)` = `rounding`.
fn reference_step(
    muon: &Muon,
    w: &mut Tensor,
    g: &Tensor,
    state: &mut MuonState<Tensor>,
    (u, k, steps): (f64, f64, usize),
    draws: &mut Draws,
) -> f64 {
    let before = w.copy();
    let wp = response(muon, &before, g, state, u, draws);
    muon.step(w, g, state).unwrap();
    let d = max_abs(&(&wp - &*w));
    let floor = u * max_abs(&(&*w - &before));
    3.0 * steps as f64 * k.sqrt() * d.max(floor)
}

#[test]
fn a_batched_step_matches_one_step_per_matrix() {
    let mut draws = Draws(3 << 16);
    for cfg in configs() {
        let muon = Muon::new(cfg).unwrap();
        for kind in [Kind::Double, Kind::Float] {
            for (b, m, n) in [(3, 24, 40), (2, 48, 16)] {
                let mut wb: Vec<Tensor> = (0..b).map(|_| draws.next([m, n], kind) * 0.1).collect();
                let mut w1: Vec<Tensor> = wb.iter().map(Tensor::copy).collect();
                let mut sb: Vec<MuonState<Tensor>> = (0..b).map(|_| MuonState::new()).collect();
                let mut s1: Vec<MuonState<Tensor>> = (0..b).map(|_| MuonState::new()).collect();
                let (u, k) = (unit(kind), m.max(n) as f64);
                let mut tol = vec![0.0; b];
                for step in 0..3 {
                    let mut g: Vec<Tensor> = (0..b).map(|_| draws.next([m, n], kind)).collect();
                    // The batch's per-matrix path: a momentum input whose norm msign rescales
                    // (‖U‖_F ≈ 3e-8 < 2⁻²⁰) and, a step later, one fresh state beside older ones.
                    if step == 0 && b == 2 {
                        g[1] = &g[1] * 1e-9;
                    }
                    if step == 1 && b == 3 {
                        (sb[0], s1[0]) = (MuonState::new(), MuonState::new());
                    }
                    let report = muon.step_batch(&mut wb, &g, &mut sb).unwrap();
                    assert_eq!(report.len(), b);
                    for i in 0..b {
                        let rounding = (u, k, ns_steps(cfg.msign));
                        let (w, s) = (&mut w1[i], &mut s1[i]);
                        tol[i] += reference_step(&muon, w, &g[i], s, rounding, &mut draws);
                        if cfg.msign == Msign::Exact {
                            tol[i] = 0.0;
                        }
                        let diff = max_abs(&(&wb[i] - &w1[i]));
                        let what =
                            format!("{:?} {kind:?} {m}×{n} step {step} matrix {i}", cfg.msign);
                        assert!(diff <= tol[i], "{what}: {diff:e} > {:e}", tol[i]);
                        let (bb, b1) = (sb[i].buffer().unwrap(), s1[i].buffer().unwrap());
                        assert!(bb.equal(b1), "{what}: momentum buffers differ");
                        assert_eq!(sb[i].steps(), s1[i].steps());
                        assert_eq!(
                            sb[i].second_moment().is_some(),
                            s1[i].second_moment().is_some()
                        );
                    }
                }
            }
        }
    }
}

/// The bank in bf16 (f32 weights, `Precision::Bf16`: the momentum written straight to bf16 with
/// its norms, the update from the bf16 direction) against one step per matrix, which converts
/// and updates one matrix at a time: the same buffers bit for bit, the weights within the
/// tolerance of the module docs with bf16's unit roundoff 2⁻⁹ (the perturbation that measures
/// the response must survive the conversion to bf16).
#[test]
fn a_bf16_bank_step_matches_one_step_per_matrix() {
    let mut draws = Draws(5 << 16);
    let cfg = MuonConfig {
        precision: Precision::Bf16,
        lr: 0.05,
        ..MuonConfig::keller()
    };
    let muon = Muon::new(cfg).unwrap();
    let (b, m, n) = (3, 16, 40);
    let mut wb: Vec<Tensor> = (0..b)
        .map(|_| draws.next([m, n], Kind::Float) * 0.1)
        .collect();
    let mut w1: Vec<Tensor> = wb.iter().map(Tensor::copy).collect();
    let mut sb: Vec<MuonState<Tensor>> = (0..b).map(|_| MuonState::new()).collect();
    let mut s1: Vec<MuonState<Tensor>> = (0..b).map(|_| MuonState::new()).collect();
    let (u, k) = (2f64.powi(-9), n as f64);
    let mut tol = vec![0.0; b];
    for step in 0..3 {
        let g: Vec<Tensor> = (0..b).map(|_| draws.next([m, n], Kind::Float)).collect();
        let report = muon.step_batch(&mut wb, &g, &mut sb).unwrap();
        assert!(report.iter().all(|r| r.precision == "bf16"));
        for i in 0..b {
            let (w, s) = (&mut w1[i], &mut s1[i]);
            tol[i] += reference_step(&muon, w, &g[i], s, (u, k, 5), &mut draws);
            let diff = max_abs(&(&wb[i] - &w1[i]));
            assert!(
                diff <= tol[i],
                "step {step} matrix {i}: {diff:e} > {:e}",
                tol[i]
            );
            let (bb, b1) = (sb[i].buffer().unwrap(), s1[i].buffer().unwrap());
            assert!(
                bb.equal(b1),
                "step {step} matrix {i}: momentum buffers differ"
            );
        }
    }
}

#[test]
fn bad_batches_are_rejected_before_anything_changes() {
    let muon = Muon::new(MuonConfig::paper()).unwrap();
    let mut draws = Draws(4 << 16);
    let kind = Kind::Float;
    let w0: Vec<Tensor> = (0..3).map(|_| draws.next([8, 6], kind)).collect();
    let mut ws: Vec<Tensor> = w0.iter().map(Tensor::copy).collect();
    let mut states: Vec<MuonState<Tensor>> = (0..3).map(|_| MuonState::new()).collect();
    let arg = |r: Result<Vec<MuonStep>>| match r {
        Err(OptimError::Input(e)) => e.arg(),
        other => panic!("expected an input error, got {other:?}"),
    };
    let grads: Vec<Tensor> = (0..3).map(|_| draws.next([8, 6], kind)).collect();
    assert_eq!(
        arg(muon.step_batch(&mut ws, &grads[..2], &mut states)),
        "grads"
    );
    assert_eq!(
        arg(muon.step_batch(&mut ws, &grads, &mut states[..1])),
        "states"
    );
    let _ = grads[2].get(1).get(1).fill_(f64::NAN);
    assert_eq!(arg(muon.step_batch(&mut ws, &grads, &mut states)), "grad");
    let mut mixed = vec![ws[0].copy(), draws.next([6, 8], kind)];
    let mut two: Vec<MuonState<Tensor>> = (0..2).map(|_| MuonState::new()).collect();
    assert_eq!(
        arg(muon.step_batch(&mut mixed, &grads[..2], &mut two)),
        "ws"
    );
    for (w, w0) in ws.iter().zip(&w0) {
        assert!(w.equal(w0), "a parameter was modified on error");
    }
    assert!(states
        .iter()
        .all(|s| s.steps() == 0 && s.buffer().is_none()));
    assert!(muon.step_batch(&mut [], &[], &mut []).unwrap().is_empty());
}

/// Matrices large enough that the batched Newton–Schulz would orthogonalize them one by one
/// (`kappa_linalg::slices_go_alone`: r²s ≥ 2²², here 64²·1024) are stepped one by one without
/// stacking: bit for bit `Muon::step`'s results, and a NaN in the last gradient changes nothing.
#[test]
fn a_batch_of_large_matrices_is_stepped_one_by_one_with_the_same_bits() {
    let muon = Muon::new(MuonConfig {
        precision: Precision::F32,
        ..MuonConfig::keller()
    })
    .unwrap();
    let like = Tensor::zeros([0], (Kind::Float, Device::Cpu));
    if !kappa_linalg::slices_go_alone(&like, 64, 1024) {
        eprintln!("skipped: no symmetric product for f32 tensors here, so the batch is stacked");
        return;
    }
    let mut draws = Draws(900);
    let ws: Vec<Tensor> = (0..3)
        .map(|_| draws.next([64, 1024], Kind::Float))
        .collect();
    let grads: Vec<Tensor> = (0..3)
        .map(|_| draws.next([64, 1024], Kind::Float))
        .collect();
    let mut batched: Vec<Tensor> = ws.iter().map(Tensor::copy).collect();
    let mut states: Vec<MuonState<Tensor>> = (0..3).map(|_| MuonState::new()).collect();
    for _ in 0..2 {
        muon.step_batch(&mut batched, &grads, &mut states).unwrap();
    }
    for (i, (w, g)) in ws.iter().zip(&grads).enumerate() {
        let (mut one, mut state) = (w.copy(), MuonState::new());
        for _ in 0..2 {
            muon.step(&mut one, g, &mut state).unwrap();
        }
        assert!(one.equal(&batched[i]), "matrix {i}");
    }
    let before: Vec<Tensor> = batched.iter().map(Tensor::copy).collect();
    let bad = grads.iter().map(Tensor::copy).collect::<Vec<_>>();
    let _ = bad[2].get(5).get(7).fill_(f64::NAN);
    let err = muon
        .step_batch(&mut batched, &bad, &mut states)
        .unwrap_err();
    assert!(err.to_string().contains("grad"), "{err}");
    assert!(batched.iter().zip(&before).all(|(a, b)| a.equal(b)));
    assert!(states.iter().all(|s| s.steps() == 2));
}

/// The row blocks of one weight (a fused QKV split by heads), stepped as views of it, take the
/// bank path without copies: the same bits as a batch of separate copies of the blocks, written
/// into the weight itself, with momentum buffers left as consecutive blocks of one storage; a
/// NaN in one block's gradient rows is reported and changes nothing.
#[test]
fn row_blocks_of_one_weight_step_as_views_with_the_bits_of_copies() {
    let muon = Muon::new(MuonConfig {
        precision: Precision::F32,
        ..MuonConfig::keller()
    })
    .unwrap();
    let (blocks, rows, n) = (6i64, 8i64, 24i64);
    let mut draws = Draws(5 << 16);
    let weight = draws.next([blocks * rows, n], Kind::Float);
    let grad = draws.next([blocks * rows, n], Kind::Float);
    let block = |t: &Tensor, i: i64| t.narrow(0, i * rows, rows);
    let mut views: Vec<Tensor> = (0..blocks).map(|i| block(&weight, i)).collect();
    let grads: Vec<Tensor> = (0..blocks).map(|i| block(&grad, i)).collect();
    let mut copies: Vec<Tensor> = views.iter().map(Tensor::copy).collect();
    let copied_grads: Vec<Tensor> = grads.iter().map(Tensor::copy).collect();
    let fresh = || (0..blocks).map(|_| MuonState::new()).collect::<Vec<_>>();
    let (mut sv, mut sc) = (fresh(), fresh());
    for step in 0..3 {
        muon.step_batch(&mut views, &grads, &mut sv).unwrap();
        muon.step_batch(&mut copies, &copied_grads, &mut sc)
            .unwrap();
        for i in 0..blocks as usize {
            assert!(
                copies[i].equal(&block(&weight, i as i64)),
                "step {step} block {i}"
            );
            assert!(sv[i].buffer().unwrap().equal(sc[i].buffer().unwrap()));
        }
        let first = sv[0].buffer().unwrap().data_ptr() as usize;
        let bytes = (rows * n) as usize * 4;
        for (i, s) in sv.iter().enumerate() {
            assert_eq!(s.buffer().unwrap().data_ptr() as usize, first + i * bytes);
        }
    }
    let before = weight.copy();
    let _ = grad.get(3 * rows + 1).get(2).fill_(f64::NAN);
    let err = muon.step_batch(&mut views, &grads, &mut sv).unwrap_err();
    assert!(err.to_string().contains("grad"), "{err}");
    assert!(weight.equal(&before), "a NaN gradient changed the weight");
    assert!(sv.iter().all(|s| s.steps() == 3));
}
