//! `ManifoldMuon::step_batch` against one `ManifoldMuon::step` per matrix (tch, CPU, f64 and
//! f32), on Stiefel, DGram and Oblique, tall, wide and square, with the paper's ascent and the
//! normalized, projected and preconditioned ones.
//!
//! # Tolerance (derived, not tuned)
//!
//! Both paths take the same momentum (elementwise: the buffers are compared exactly), the same
//! per-matrix start and finish, and differ only in the rounding of the lock-step ascent's
//! batched calls: per iteration one `baddbmm` (Z), 3 products per Newton–Schulz step of the
//! batched msign and one `bmm` (the violation), each a product of length ≤ k (the longer
//! side). The per-matrix step's response d to its gradient perturbed by one unit roundoff u
//! (relative, random signs; the momentum is linear in g) is measured, floored at u·max|ΔW| (the
//! step's own rounding), and bounds the effect of one rounding injection, so per step
//! tol = (K·(2 + 3·s) + 3·s)·√k·max(d, u·max|ΔW|), s the Newton–Schulz steps and K the ascent's msign
//! calls (the √k of Higham & Mary, as `tch_backend.rs`), summed over the steps taken. The
//! iteration counts must agree exactly (no ascent here converges: a convergence decision at the
//! threshold could differ by a rounding, and is not what this test checks). The square Stiefel
//! closed form runs batched too (S = WᵀG and A = W·X as `bmm`, one batched msign, the batched
//! retraction: 2 + 6·s injections, the formula's value for its one msign call; its "converged"
//! only reports a violation at rounding level). Batches outside the batched routes (`Exact`
//! msign, ADMM off the closed form) run the per-matrix code and must agree bit for bit. The bound is pessimistic (measured: the f64 differences are
//! 1e-16–2e-14 against bounds of 4e-13–5e-11, f32 3e-6 against 1e-4–2e-2), so the f64 cases are
//! the ones that catch an algorithmic difference (a wrong step size or mask moves W by ≈ 1e-3).

use kappa_optim::manifold::{Admm, DualSolver};
use kappa_optim::*;
use tch::{Kind, Tensor};

use super::batched::{max_abs, ns_steps, unit, Draws};

fn copy_state(s: &ManifoldState<Tensor>) -> ManifoldState<Tensor> {
    MomentumState::from_parts(s.buffer().map(Tensor::copy), s.steps())
}

/// The settings under test and whether they run the lock-step ascent.
fn configs() -> Vec<(&'static str, ManifoldMuonConfig, bool)> {
    let base = |m: Manifold| ManifoldMuonConfig {
        lr: 0.05,
        precision: Precision::Native,
        dual: DualAscent {
            on_divergence: OnDivergence::Apply,
            ..DualAscent::paper()
        },
        ..ManifoldMuonConfig::paper(m)
    };
    let dgram = Manifold::DGram(DGramRetraction::ColumnNorms);
    vec![
        ("stiefel paper", base(Manifold::Stiefel), true),
        (
            "dgram paper",
            base(Manifold::DGram(DGramRetraction::Paper)),
            true,
        ),
        ("oblique", base(Manifold::Oblique), true),
        (
            "stiefel feasible",
            ManifoldMuonConfig {
                dual: DualAscent::feasible(),
                ..base(Manifold::Stiefel)
            },
            true,
        ),
        (
            "dgram preconditioned",
            ManifoldMuonConfig {
                dual: DualAscent {
                    on_divergence: OnDivergence::Apply,
                    ..DualAscent::preconditioned_feasible()
                },
                ..base(dgram)
            },
            true,
        ),
        (
            "stiefel exact",
            ManifoldMuonConfig {
                msign: Msign::Exact,
                ..base(Manifold::Stiefel)
            },
            false,
        ),
        (
            "stiefel admm",
            ManifoldMuonConfig {
                solver: DualSolver::Admm(Admm::standard()),
                ..base(Manifold::Stiefel)
            },
            false,
        ),
    ]
}

/// The measured response of one per-matrix step from (`w`, `state`) to `g` perturbed by u.
fn response(
    opt: &ManifoldMuon,
    w: &Tensor,
    g: &Tensor,
    state: &ManifoldState<Tensor>,
    u: f64,
    draws: &mut Draws,
) -> Tensor {
    let shape = [g.size()[0], g.size()[1]];
    let noise = draws.next(shape, g.kind()).sign() * u;
    let mut wp = w.copy();
    opt.step(&mut wp, &(g * (noise + 1.0)), &mut copy_state(state))
        .unwrap();
    wp
}

/// B matrices of `shape` on the optimizer's manifold, retracted with the exact (SVD) msign: a
/// Newton–Schulz retraction cannot reach Stiefel from a square Gaussian whose smallest singular
/// value is tiny.
fn on_manifold(
    opt: &ManifoldMuon,
    b: usize,
    shape: [i64; 2],
    kind: Kind,
    draws: &mut Draws,
) -> Vec<Tensor> {
    let exact = ManifoldMuon::new(ManifoldMuonConfig {
        msign: Msign::Exact,
        ..*opt.config()
    })
    .unwrap();
    (0..b)
        .map(|_| {
            let mut w = draws.next(shape, kind);
            exact.retract_onto(&mut w).unwrap();
            w
        })
        .collect()
}

fn check_case(name: &str, cfg: ManifoldMuonConfig, batched: bool, kind: Kind, shape: [i64; 2]) {
    check_scaled(name, cfg, batched, kind, shape, 1.0);
}

/// A seed per case, from its name and shape (so that every case draws its own numbers).
fn case_seed(name: &str, kind: Kind, shape: [i64; 2]) -> u64 {
    let text = format!("{name} {kind:?} {shape:?}");
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// [`check_case`] with gradients scaled by `scale` (the tolerance is relative to each step's
/// own response, so it holds at any scale).
fn check_scaled(
    name: &str,
    cfg: ManifoldMuonConfig,
    batched: bool,
    kind: Kind,
    shape: [i64; 2],
    scale: f64,
) {
    let seed = case_seed(name, kind, shape) << 16;
    let opt = ManifoldMuon::new(cfg).unwrap();
    let b = 3;
    let mut draws = Draws(seed);
    let mut wb = on_manifold(&opt, b, shape, kind, &mut draws);
    let mut w1: Vec<Tensor> = wb.iter().map(Tensor::copy).collect();
    let mut sb: Vec<ManifoldState<Tensor>> = (0..b).map(|_| ManifoldState::new()).collect();
    let mut s1: Vec<ManifoldState<Tensor>> = (0..b).map(|_| ManifoldState::new()).collect();
    let (u, k) = (unit(kind), shape[0].max(shape[1]) as f64);
    let mut tol = vec![0.0; b];
    for step in 0..3 {
        let g: Vec<Tensor> = (0..b).map(|_| draws.next(shape, kind) * scale).collect();
        let reports = opt.step_batch(&mut wb, &g, &mut sb).unwrap();
        assert_eq!(reports.len(), b);
        for i in 0..b {
            let what = format!("{name} {kind:?} {shape:?} step {step} matrix {i}");
            let before = w1[i].copy();
            let wp = response(&opt, &before, &g[i], &s1[i], u, &mut draws);
            let one = opt.step(&mut w1[i], &g[i], &mut s1[i]).unwrap();
            let calls = one.dual.msign_calls as f64;
            assert_eq!(reports[i].dual.msign_calls, one.dual.msign_calls, "{what}");
            assert_eq!(reports[i].dual.dual_steps, one.dual.dual_steps, "{what}");
            let ascent_converged = one.dual.converged && one.dual.dual_steps > 0;
            assert!(
                !batched || !ascent_converged,
                "{what}: a converged case (see the module docs)"
            );
            let d = max_abs(&(&wp - &w1[i]));
            let floor = u * max_abs(&(&w1[i] - &before));
            // The ascent's candidates, and the Stiefel retraction's msign (batched too).
            let s = ns_steps(cfg.msign) as f64;
            let injections = calls * (2.0 + 3.0 * s) + 3.0 * s;
            tol[i] += injections * k.sqrt() * d.max(floor);
            if !batched {
                tol[i] = 0.0;
            }
            let diff = max_abs(&(&wb[i] - &w1[i]));
            assert!(diff <= tol[i], "{what}: {diff:e} > {:e}", tol[i]);
            let (bb, b1) = (sb[i].buffer().unwrap(), s1[i].buffer().unwrap());
            assert!(bb.equal(b1), "{what}: momentum buffers differ");
            assert_eq!(sb[i].steps(), s1[i].steps());
            assert_eq!(reports[i].precision, one.precision, "{what}");
            assert_eq!(
                reports[i].dual.nuclear_norm.is_some(),
                one.dual.nuclear_norm.is_some(),
                "{what}"
            );
        }
    }
}

#[test]
fn a_batched_manifold_step_matches_one_step_per_matrix() {
    for (name, cfg, batched) in configs() {
        for kind in [Kind::Double, Kind::Float] {
            for shape in [[40, 16], [12, 36]] {
                check_case(name, cfg, batched, kind, shape);
            }
        }
    }
}

#[test]
fn square_matrices_batch_on_dgram_and_take_the_closed_form_on_stiefel() {
    let (_, dgram, _) = configs()[1];
    let (_, stiefel, _) = configs()[0];
    let (_, admm, _) = configs()[6];
    for kind in [Kind::Double, Kind::Float] {
        check_case("dgram square", dgram, true, kind, [20, 20]);
        check_case("stiefel square", stiefel, true, kind, [20, 20]);
        // The closed form needs no solver: ADMM's square Stiefel matrices batch as well.
        check_case("stiefel square admm", admm, true, kind, [20, 20]);
    }
}

#[test]
fn huge_gradients_take_the_closed_form_as_one_step_does() {
    let (_, stiefel, _) = configs()[0];
    // S = WᵀG near 1e161: its squares overflow the stacked norm, not the rescaled one, so the
    // batch runs msign per slice and agrees with the per-matrix step as at unit scale.
    check_scaled(
        "stiefel square 1e160",
        stiefel,
        true,
        Kind::Double,
        [12, 12],
        1e160,
    );
    // Entries near f64::MAX: the momentum input and S overflow outright; the batch fails with
    // the per-matrix step's error and changes nothing.
    let opt = ManifoldMuon::new(stiefel).unwrap();
    let mut draws = Draws(14 << 16);
    let w0 = on_manifold(&opt, 3, [12, 12], Kind::Double, &mut draws);
    let mut ws: Vec<Tensor> = w0.iter().map(Tensor::copy).collect();
    let mut grads: Vec<Tensor> = (0..3).map(|_| draws.next([12, 12], Kind::Double)).collect();
    grads[1] = grads[1].ones_like() * 1e308;
    let mut states: Vec<ManifoldState<Tensor>> = (0..3).map(|_| ManifoldState::new()).collect();
    let err = opt.step_batch(&mut ws, &grads, &mut states).unwrap_err();
    let one = opt
        .step(&mut w0[1].copy(), &grads[1], &mut ManifoldState::new())
        .unwrap_err();
    assert!(
        matches!(err, OptimError::DualAscentDiverged { steps: 0, .. }),
        "{err}"
    );
    assert_eq!(err.to_string(), one.to_string());
    for (w, w0) in ws.iter().zip(&w0) {
        assert!(w.equal(w0), "a failed batch modified a matrix");
    }
    assert!(states.iter().all(|s| s.buffer().is_none()));
}

#[test]
fn a_bad_matrix_fails_the_batch_before_anything_changes() {
    let (_, cfg, _) = configs()[0];
    let opt = ManifoldMuon::new(cfg).unwrap();
    let mut draws = Draws(13 << 16);
    let kind = Kind::Double;
    let w0 = on_manifold(&opt, 3, [24, 8], kind, &mut draws);
    let mut ws: Vec<Tensor> = w0.iter().map(Tensor::copy).collect();
    let mut states: Vec<ManifoldState<Tensor>> = (0..3).map(|_| ManifoldState::new()).collect();
    let mut grads: Vec<Tensor> = (0..3).map(|_| draws.next([24, 8], kind)).collect();
    let _ = grads[2].get(1).get(3).fill_(f64::NAN);
    let err = opt.step_batch(&mut ws, &grads, &mut states).unwrap_err();
    assert!(matches!(err, OptimError::Input(_)), "{err}");
    // Off the manifold at the first step.
    grads[2] = draws.next([24, 8], kind);
    ws[1] = draws.next([24, 8], kind);
    let err = opt.step_batch(&mut ws, &grads, &mut states).unwrap_err();
    assert!(matches!(err, OptimError::NotOnManifold { .. }), "{err}");
    ws[1] = w0[1].copy();
    for (w, w0) in ws.iter().zip(&w0) {
        assert!(w.equal(w0), "a failed batch modified a matrix");
    }
    assert!(states
        .iter()
        .all(|s| s.buffer().is_none() && s.steps() == 0));
    // Lengths and shapes.
    let err = opt
        .step_batch(&mut ws, &grads[..2], &mut states)
        .unwrap_err();
    assert!(err.to_string().contains("grads"), "{err}");
    let mut mixed = vec![ws[0].copy(), draws.next([8, 24], kind)];
    let err = opt
        .step_batch(&mut mixed, &grads[..2], &mut states[..2])
        .unwrap_err();
    assert!(err.to_string().contains("ws"), "{err}");
    assert!(opt.step_batch(&mut [], &[], &mut []).unwrap().is_empty());
}
