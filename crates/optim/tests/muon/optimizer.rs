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
