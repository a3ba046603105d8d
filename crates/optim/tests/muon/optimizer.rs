//! Muon's step and both momentum forms (docs/optim.md, "Properties → tests" 1 and 10).

use super::common::*;
use kappa_optim::manifold::{
    DualAscent, Manifold, ManifoldMuon, ManifoldMuonConfig, ManifoldState,
};
use kappa_optim::*;
use ndarray::Array2;
use proptest::prelude::*;

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn muon_step_is_decay_then_scaled_msign((m, n, seed) in shapes(), wd in 0.0f64..0.5) {
        let w0 = gaussian(m, n, seed);
        let grads: Vec<Array2<f64>> = (0..3).map(|i| gaussian(m, n, seed ^ (i + 1))).collect();
        for (scale, layout) in [
            (UpdateScale::None, Layout::OutIn),
            (UpdateScale::Original, Layout::OutIn),
            (UpdateScale::Original, Layout::InOut),
            (UpdateScale::MatchRmsAdamw, Layout::OutIn),
        ] {
            let cfg = MuonConfig { lr: 0.03, weight_decay: wd, msign: Msign::Exact, scale, layout, ..MuonConfig::keller() };
            let muon = Muon::new(cfg).unwrap();
            let mut w = w0.clone();
            let mut state = MuonState::new();
            // The reference, by hand: EMA-Nesterov momentum, then msign.
            let mut w_ref = w0.clone();
            let mut buf = Array2::<f64>::zeros((m, n));
            // The tolerance accumulates per step: the code's U and the reference's differ by the
            // rounding of the momentum (a few operations per entry: rel ≤ 4u + the 1 − β
            // literal, ≤ 6u of ‖U‖_F in all), so their exact msigns differ by the polar
            // perturbation at σ_min(U) with the two SVDs' backward errors, scaled by lr·s; plus
            // the update's own rounding (2 operations, u·max|W| each, per step).
            let mut tol = 0.0;
            for g in &grads {
                let info = muon.step(&mut w, g, &mut state).unwrap();
                buf = &buf * 0.95 + g * 0.05;
                let u = g * 0.05 + &buf * 0.95;
                let o = msign(&u, Msign::Exact, Precision::Native).unwrap();
                let (fo, fi) = if layout == Layout::OutIn { (m, n) } else { (n, m) };
                let s = match scale {
                    UpdateScale::None => 1.0,
                    UpdateScale::Original => ((fo as f64) / (fi as f64)).max(1.0).sqrt(),
                    UpdateScale::MatchRmsAdamw => 0.2 * (m.max(n) as f64).sqrt(),
                };
                // The same IEEE operations (division, max, sqrt, product; all correctly
                // rounded) on the same integers: bitwise equal.
                prop_assert_eq!(info.scale, s);
                w_ref = &w_ref * (1.0 - 0.03 * wd) - &o * (0.03 * s);
                let su = sv(&u);
                let rel = 6.0 * U64 + 2.0 * svd_err(m, n);
                tol += 0.03 * s * (polar_perturbation(fro(&u), su[su.len() - 1], rel) + 2.0 * svd_err(m, n))
                    + 2.0 * U64 * max_abs(&w_ref);
            }
            let d = max_abs_diff(&w, &w_ref);
            prop_assert!(d <= tol, "{d:e} > {tol:e}");
            prop_assert_eq!(state.steps(), 3);
        }
    }

    #[test]
    fn the_step_has_spectral_norm_lr_without_scale((m, n, seed) in shapes()) {
        let w0 = gaussian(m, n, seed);
        let g = gaussian(m, n, seed ^ 5);
        let muon = Muon::new(MuonConfig { lr: 0.02, weight_decay: 0.0, msign: Msign::polar_express(), ..MuonConfig::paper() }).unwrap();
        let mut w = w0.clone();
        muon.step(&mut w, &g, &mut MuonState::new()).unwrap();
        // ΔW = −lr·PE(U) (weight decay 0): its spectral norm is lr times Polar Express's largest
        // σ, in the documented band 1 ± 1e-6 (msign.rs docs; σ_max/(1.01‖U‖_F) ≥ 1/(1.01·√k) ≫
        // 1e-3), plus the rounding of W − lr·O and of the subtraction (u·max|W| per entry, 2 of
        // them, ≤ 2u·max|W|·√(mn) in spectral norm, relative to lr) and the check's svd_err.
        let d = spectral(&(&w - &w0));
        let tol = 1e-6 + 2.0 * U64 * max_abs(&w0) * ((m * n) as f64).sqrt() / 0.02 + 2.0 * svd_err(m, n);
        prop_assert!((d / 0.02 - 1.0).abs() <= tol, "‖ΔW‖₂/lr = {} (tol {tol:e})", d / 0.02);
    }

    #[test]
    fn gram_polar_express_gives_the_polar_express_muon_step((m, n, seed) in shapes()) {
        // The same map (grads → W) computed two ways: Newton–Schulz on X and Gram Newton–Schulz
        // on XXᵀ (kappa-linalg: identical in exact arithmetic). Each run's injections as in
        // `both_momentum_forms_give_the_same_muon_step`, amplified as one at the inputs (`amp`,
        // measured on the plain run); the Gram run's r×r products (B, Q, T, R per step; XXᵀ and
        // Q·X per block) are amplified further by the gain of the factor Q they feed
        // (`gram_gain`).
        let grads: Vec<Array2<f64>> = (0..3).map(|i| gaussian(m, n, seed ^ (i + 21))).collect();
        let w0 = gaussian(m, n, seed);
        let run = |msign: Msign, grads: &[Array2<f64>]| {
            let muon = Muon::new(MuonConfig { msign, ..MuonConfig::paper() }).unwrap();
            let mut w = w0.clone();
            let mut st = MuonState::new();
            for g in grads {
                muon.step(&mut w, g, &mut st).unwrap();
            }
            w
        };
        let gram = Msign::gram_polar_express();
        let (a, b) = (run(Msign::polar_express(), &grads), run(gram, &grads));
        let amp = amplification(|g| run(Msign::polar_express(), g), &grads);
        let Msign::GramPolarExpress { steps, restart } = gram else { unreachable!() };
        let blocks = steps.div_ceil(restart);
        let gain = gram_gain(gram);
        let plain = (3 + 1 + 3 * steps + 2) * grads.len();
        let gram_inj = (3 + 1 + 4 * steps + 2 * blocks + 2) * grads.len();
        let tol = derived_tol(plain, m.max(n), amp, max_abs(&a))
            + gain * derived_tol(gram_inj, m.max(n), amp, max_abs(&b));
        let d = max_abs_diff(&a, &b);
        prop_assert!(d <= tol, "{d:e} > {tol:e} (Γ = {gain})");
    }

    #[test]
    fn both_momentum_forms_give_the_same_muon_step((m, n, seed) in shapes()) {
        // EMA buffer = (1−β)·SGD buffer by induction, so the Nesterov inputs differ by (1−β)
        // and msign (scale-invariant) makes the steps equal.
        let grads: Vec<Array2<f64>> = (0..4).map(|i| gaussian(m, n, seed ^ (i + 11))).collect();
        let w0 = gaussian(m, n, seed);
        let run = |momentum: Momentum, grads: &[Array2<f64>]| {
            let muon = Muon::new(MuonConfig { momentum, msign: Msign::polar_express(), ..MuonConfig::paper() }).unwrap();
            let mut w = w0.clone();
            let mut st = MuonState::new();
            for g in grads {
                muon.step(&mut w, g, &mut st).unwrap();
            }
            w
        };
        let (a, b) = (run(Momentum::keller(), &grads), run(Momentum::paper(), &grads));
        // Two roundings of one map (grads → W): its amplification is measured, and every
        // momentum update (3 operations), normalization and Newton–Schulz product of every step
        // is an injection, plus the updates of W.
        let amp = amplification(|g| run(Momentum::paper(), g), &grads);
        let per_step = 3 + 1 + 3 * 10 + 2;
        let tol = 2.0 * derived_tol(per_step * grads.len(), m.max(n), amp, max_abs(&b));
        prop_assert!(max_abs_diff(&a, &b) <= tol, "{} > {tol:e}", max_abs_diff(&a, &b));
    }
}

#[test]
fn momentum_forms_differ_in_the_dual_ascent_unless_normalized() {
    let (m, n) = (48, 16);
    let grads: Vec<Array2<f64>> = (0..3).map(|i| gaussian(m, n, 40 + i) * 0.1).collect();
    let run = |momentum: Momentum, dual: DualAscent| {
        let opt = ManifoldMuon::new(ManifoldMuonConfig {
            momentum,
            dual,
            msign: Msign::Exact,
            ..ManifoldMuonConfig::paper(Manifold::Stiefel)
        })
        .unwrap();
        let mut w = orthonormal(m, n, 3);
        let mut st = ManifoldState::new();
        for g in &grads {
            opt.step(&mut w, g, &mut st).unwrap();
        }
        w
    };
    let plain = DualAscent::paper();
    let normalized = DualAscent::paper().normalized();
    let d_plain = max_abs_diff(
        &run(Momentum::keller(), plain),
        &run(Momentum::paper(), plain),
    );
    let d_norm = max_abs_diff(
        &run(Momentum::keller(), normalized),
        &run(Momentum::paper(), normalized),
    );
    // Agreement: two roundings of the normalized ascent (3 steps × K = 20 exact msigns, each
    // an SVD, a violation product and a dual update, + momentum, normalization, retraction); its
    // amplification measured on the gradients. "Differ" means beyond that bound.
    let run_norm = |g: &[Array2<f64>]| {
        let opt = ManifoldMuon::new(ManifoldMuonConfig {
            momentum: Momentum::paper(),
            dual: normalized,
            msign: Msign::Exact,
            ..ManifoldMuonConfig::paper(Manifold::Stiefel)
        })
        .unwrap();
        let mut w = orthonormal(m, n, 3);
        let mut st = ManifoldState::new();
        for g in g {
            opt.step(&mut w, g, &mut st).unwrap();
        }
        w
    };
    let amp = amplification(run_norm, &grads);
    let tol = 2.0 * derived_tol(3 * (20 * 3 + 6), m, amp, 1.0);
    assert!(
        d_plain > 100.0 * tol,
        "unnormalized ascents should differ: {d_plain} (rounding bound {tol:e})"
    );
    assert!(
        d_norm <= tol,
        "normalized ascents should agree: {d_norm} > {tol:e}"
    );
}

/// torch.optim.Muon's orthogonalization (`_zeropower_via_newtonschulz` in torch/optim/_muon.py),
/// in f64: the wide orientation (X transposed when it has more rows than columns),
/// X/max(‖X‖_F, eps), then 5 steps A = X·Xᵀ, B = b·A + c·A·A, X = a·X + B·X with
/// (a, b, c) = (3.4445, −4.7750, 2.0315).
fn torch_newton_schulz(g: &Array2<f64>, eps: f64) -> Array2<f64> {
    let (a, b, c) = (3.4445, -4.7750, 2.0315);
    let tall = g.nrows() > g.ncols();
    let mut x = if tall { g.t().to_owned() } else { g.clone() };
    x /= fro(&x).max(eps);
    for _ in 0..5 {
        let gram = x.dot(&x.t());
        let poly = &gram * b + gram.dot(&gram) * c;
        x = &x * a + poly.dot(&x);
    }
    if tall {
        x.t().to_owned()
    } else {
        x
    }
}

/// torch.optim.Muon's defaults: lr 1e-3, weight decay 0.1, momentum 0.95 with Nesterov, eps 1e-7,
/// adjust_lr_fn "original".
const TORCH_LR: f64 = 1e-3;
const TORCH_WD: f64 = 0.1;

/// Steps of torch.optim.Muon (`_single_tensor_muon`) from `w0` at its defaults: buf.lerp_(g,
/// 1 − β), U = g.lerp(buf, β) (torch's lerp: start + w·(end − start) for w < 0.5, end −
/// (end − start)·(1 − w) otherwise), O = NS(U), W ← W·(1 − lr·λ), W ← W − lr·√max(1, rows/cols)·O.
fn torch_muon(w0: &Array2<f64>, grads: &[Array2<f64>]) -> Array2<f64> {
    let beta = 0.95;
    let (rows, cols) = w0.dim();
    let adjusted_lr = TORCH_LR * (rows as f64 / cols as f64).max(1.0).sqrt();
    let mut w = w0.clone();
    let mut buf = Array2::<f64>::zeros(w0.dim());
    for g in grads {
        buf = &buf + &((g - &buf) * (1.0 - beta));
        let u = &buf - &((&buf - g) * (1.0 - beta));
        let o = torch_newton_schulz(&u, 1e-7);
        w *= 1.0 - TORCH_LR * TORCH_WD;
        w = &w - &(o * adjusted_lr);
    }
    w
}

#[test]
fn the_torch_preset_is_torch_optim_muons_update_on_unit_and_tiny_gradients() {
    // A tall 6×4 (the transpose rule, and the shape factor √1.5), with gradient entries of unit
    // size and of size 1e-8: there ‖U‖_F ≈ 5e-8 < eps = 1e-7, where max(‖X‖_F, eps) and
    // ‖X‖_F + eps differ most (≈ 25 %); at unit scale they differ by ≈ 1e-7 relative in the
    // normalization.
    let cfg = MuonConfig {
        precision: Precision::Native,
        ..MuonConfig::torch()
    };
    assert_eq!((cfg.lr, cfg.weight_decay), (TORCH_LR, TORCH_WD));
    let muon = Muon::new(cfg).unwrap();
    let w0 = gaussian(6, 4, 3);
    for scale in [1.0, 1e-8] {
        let grads: Vec<Array2<f64>> = (0..3).map(|i| gaussian(6, 4, 40 + i) * scale).collect();
        // The orthogonalized update alone: two roundings of one map (the normalization's 2
        // injections and 3 products per step), its amplification measured on this input.
        let u = &grads[0];
        let o = muon.direction(u).unwrap();
        let theirs = torch_newton_schulz(u, 1e-7);
        let amp = amplification(
            |x| torch_newton_schulz(&x[0], 1e-7),
            std::slice::from_ref(u),
        );
        let tol = 2.0 * derived_tol(2 + 3 * 5, 6, amp, max_abs(&theirs));
        let d = max_abs_diff(&o, &theirs);
        assert!(d <= tol, "scale {scale}: msign {d:e} > {tol:e}");
        // Three whole steps (momentum, msign, decay, shape factor): per step the momentum's 4
        // operations, the update's 3 and the msign's 17 injections.
        let mut w = w0.clone();
        let mut state = MuonState::new();
        for g in &grads {
            muon.step(&mut w, g, &mut state).unwrap();
        }
        let theirs = torch_muon(&w0, &grads);
        let amp = amplification(|g| torch_muon(&w0, g), &grads);
        let tol = 2.0 * derived_tol((4 + 3 + 17) * grads.len(), 6, amp, max_abs(&theirs));
        let d = max_abs_diff(&w, &theirs);
        assert!(d <= tol, "scale {scale}: step {d:e} > {tol:e}");
    }
}
