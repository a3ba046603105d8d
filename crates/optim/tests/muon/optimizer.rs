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
                prop_assert!((info.scale - s).abs() < 1e-15);
                w_ref = &w_ref * (1.0 - 0.03 * wd) - &o * (0.03 * s);
            }
            prop_assert!(max_abs_diff(&w, &w_ref) <= 1e-10);
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
        let d = spectral(&(&w - &w0));
        prop_assert!((d / 0.02 - 1.0).abs() <= 1e-5, "‖ΔW‖₂/lr = {}", d / 0.02);
    }

    #[test]
    fn both_momentum_forms_give_the_same_muon_step((m, n, seed) in shapes()) {
        // EMA buffer = (1−β)·SGD buffer by induction, so the Nesterov inputs differ by (1−β)
        // and msign (scale-invariant) makes the steps equal.
        let grads: Vec<Array2<f64>> = (0..4).map(|i| gaussian(m, n, seed ^ (i + 11))).collect();
        let w0 = gaussian(m, n, seed);
        let mut outs = Vec::new();
        for momentum in [Momentum::keller(), Momentum::paper()] {
            let muon = Muon::new(MuonConfig { momentum, msign: Msign::polar_express(), ..MuonConfig::paper() }).unwrap();
            let mut w = w0.clone();
            let mut st = MuonState::new();
            for g in &grads {
                muon.step(&mut w, g, &mut st).unwrap();
            }
            outs.push(w);
        }
        prop_assert!(max_abs_diff(&outs[0], &outs[1]) <= 1e-10);
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
    assert!(
        d_plain > 1e-6,
        "unnormalized ascents should differ: {d_plain}"
    );
    assert!(d_norm <= 1e-10, "normalized ascents should agree: {d_norm}");
}
