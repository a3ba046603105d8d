//! Muon's variants (docs/optim.md, "NorMuon, cautious weight decay, per-matrix lr, ≥ 3-D
//! weights"): NorMuon against its formula by hand, its two invariants (the update keeps Muon's
//! Frobenius norm; after the first step every neuron moves by the same norm), cautious weight
//! decay entry by entry, `step_scaled`, and (feature `tch`) the same steps on tensors, the
//! flattened ≥ 3-D step and the state checks.

use super::common::*;
use kappa_optim::*;
use ndarray::{Array2, Axis};
use proptest::prelude::*;

/// A NorMuon config on the exact msign (the normalization is what these tests check).
fn normuon(beta2: f64, axis: NeuronAxis, layout: Layout) -> MuonConfig {
    MuonConfig {
        lr: 0.05,
        weight_decay: 0.0,
        msign: Msign::Exact,
        layout,
        normuon: Some(NorMuon { beta2, axis }),
        ..MuonConfig::keller()
    }
}

/// The row norms of `a` (its columns when `rows` is false).
fn neuron_norms(a: &Array2<f64>, rows: bool) -> Vec<f64> {
    let axis = if rows { Axis(1) } else { Axis(0) };
    a.map_axis(axis, |v| v.iter().map(|x| x * x).sum::<f64>().sqrt())
        .to_vec()
}

proptest! {
    #![proptest_config(config(16))]

    /// With W₀ = 0 and no decay, W₁ = −lr·s·Ô: after step 4 of the normalization ‖Ô‖_F = ‖O‖_F
    /// = ‖msign(U)‖_F, and at the first step every neuron's norm is ‖O‖_F/√k (k neurons).
    /// Tolerance: Ô is O scaled by per-neuron factors and one global factor, each a ratio of
    /// length-n sums (γ_n relative each) — 4·γ_n + 4u relative in all, on norms ≤ ‖O‖_F.
    #[test]
    fn normuon_first_step_equalizes_neurons_and_keeps_the_norm(
        (m, n, seed) in shapes(), beta2 in 0.0f64..0.99, long_side in any::<bool>(),
    ) {
        let axis = if long_side { NeuronAxis::LongSide } else { NeuronAxis::Outputs };
        let cfg = normuon(beta2, axis, Layout::OutIn);
        let muon = Muon::new(cfg).unwrap();
        let g = gaussian(m, n, seed);
        let mut w = Array2::<f64>::zeros((m, n));
        let info = muon.step(&mut w, &g, &mut MuonState::new()).unwrap();
        let update = w.mapv(|x| -x / (cfg.lr * info.scale));
        let plain = Muon::new(MuonConfig { normuon: None, ..cfg }).unwrap();
        // msign is scale-invariant: the first step's momentum input c·G has O = msign(G).
        let o = plain.direction(&g).unwrap();
        let rows = axis.along_rows(m, n, Layout::OutIn);
        let k = if rows { m } else { n };
        let rel = 4.0 * gamma(m.max(n)) + 4.0 * U64;
        prop_assert!((fro(&update) - fro(&o)).abs() <= rel * fro(&o));
        let target = fro(&o) / (k as f64).sqrt();
        // ε = 1e-10 in √v + ε changes neuron i's norm by the relative amount ε·√d/(√(1−β₂)·‖O_i‖)
        // (d the neuron's length): the neurons differ by at most that for the smallest ‖O_i‖.
        let d = (if rows { n } else { m }) as f64;
        let smallest = neuron_norms(&o, rows).into_iter().fold(f64::INFINITY, f64::min);
        let eps_rel = NORMUON_EPS * d.sqrt() / ((1.0 - beta2).sqrt() * smallest);
        for (i, r) in neuron_norms(&update, rows).iter().enumerate() {
            let tol = rel * fro(&o) + 2.0 * eps_rel * target;
            prop_assert!((r - target).abs() <= tol, "neuron {i}: {r} vs {target}");
        }
    }

    /// Over several steps NorMuon's update keeps plain Muon's Frobenius norm (same gradients,
    /// same momentum, so the same O). Tolerance as above per step, on ‖O‖_F.
    #[test]
    fn normuon_keeps_muons_update_norm((m, n, seed) in shapes(), beta2 in 0.0f64..0.99) {
        let cfg = normuon(beta2, NeuronAxis::Outputs, Layout::InOut);
        let (nor, plain) = (Muon::new(cfg).unwrap(), Muon::new(MuonConfig { normuon: None, ..cfg }).unwrap());
        let (mut w1, mut w2) = (Array2::<f64>::zeros((m, n)), Array2::<f64>::zeros((m, n)));
        let (mut s1, mut s2) = (MuonState::new(), MuonState::new());
        let rel = 4.0 * gamma(m.max(n)) + 4.0 * U64;
        for i in 0..3 {
            let g = gaussian(m, n, seed ^ (i + 1));
            let (b1, b2) = (w1.clone(), w2.clone());
            nor.step(&mut w1, &g, &mut s1).unwrap();
            plain.step(&mut w2, &g, &mut s2).unwrap();
            let (d1, d2) = (fro(&(&w1 - &b1)), fro(&(&w2 - &b2)));
            // The differences W − W_before add the update's rounding: u·max|W| per entry.
            let slack = rel * d2 + 2.0 * U64 * max_abs(&w1).max(max_abs(&w2)) * ((m * n) as f64).sqrt();
            prop_assert!((d1 - d2).abs() <= slack, "step {i}: {d1} vs {d2}");
        }
        prop_assert_eq!(s1.second_moment().map(<[f64]>::len), Some(n)); // InOut: outputs are columns
    }
}

/// NorMuon by hand (`normuon_reference`) for three steps of the paper preset's SGD-Nesterov
/// momentum on the exact msign, against the optimizer: the final W and the second moment.
#[derive(Clone, Copy)]
struct Hand {
    beta2: f64,
    lr: f64,
}

impl Hand {
    /// W after the steps (inputs[0] = W₀, then the gradients), and v as a 1×m matrix.
    fn run(&self, inputs: &[Array2<f64>]) -> (Array2<f64>, Array2<f64>) {
        let mut w = inputs[0].clone();
        let (m, n) = w.dim();
        let (mut buf, mut v) = (Array2::<f64>::zeros((m, n)), Array2::<f64>::zeros((1, m)));
        for g in &inputs[1..] {
            buf = &buf * 0.95 + g;
            let u = g + &(&buf * 0.95);
            let o = msign(&u, Msign::Exact, Precision::Native).unwrap();
            let q = o.map_axis(Axis(1), |r| r.iter().map(|x| x * x).sum::<f64>() / n as f64);
            v = &v * self.beta2 + &(q.insert_axis(Axis(0)) * (1.0 - self.beta2));
            let mut hat = o.clone();
            for (mut row, vi) in hat.rows_mut().into_iter().zip(v.iter()) {
                row /= vi.sqrt() + NORMUON_EPS;
            }
            hat *= fro(&o) / fro(&hat);
            w = &w - &(&hat * self.lr);
        }
        (w, v)
    }
}

/// The two compute the same map in f64 in different orders, so the tolerance is `derived_tol`
/// with the map's measured amplification (common.rs). Injections per step: the SVD's backward
/// error γ_{4mn} (`svd_err`: 4mn unit roundoffs), the momentum (2), the normalization's sum,
/// square root, division and rescale (4) and the update (1); plus the inputs (1).
#[test]
fn normuon_matches_its_formula() {
    let (m, n) = (12, 7);
    let hand = Hand {
        beta2: 0.9,
        lr: 0.02,
    };
    let cfg = MuonConfig {
        lr: hand.lr,
        weight_decay: 0.0,
        msign: Msign::Exact,
        normuon: Some(NorMuon {
            beta2: hand.beta2,
            axis: NeuronAxis::Outputs,
        }),
        ..MuonConfig::paper()
    };
    let inputs: Vec<Array2<f64>> = std::iter::once(gaussian(m, n, 3) * 0.1)
        .chain((0..3).map(|i| gaussian(m, n, 40 + i)))
        .collect();
    let muon = Muon::new(cfg).unwrap();
    let (mut w, mut state) = (inputs[0].clone(), MuonState::new());
    for g in &inputs[1..] {
        muon.step(&mut w, g, &mut state).unwrap();
    }
    let (w_ref, v_ref) = hand.run(&inputs);
    let injections = 1 + 3 * (4 * m * n + 7);
    let amp_w = amplification(|x| hand.run(x).0, &inputs);
    let tol = derived_tol(injections, m.max(n), amp_w, max_abs(&w_ref));
    let d = max_abs_diff(&w, &w_ref);
    assert!(d <= tol, "W: {d:e} > {tol:e}");
    let v = Array2::from_shape_vec((1, m), state.second_moment().unwrap().to_vec()).unwrap();
    let amp_v = amplification(|x| hand.run(x).1, &inputs);
    let tol = derived_tol(injections, m.max(n), amp_v, max_abs(&v_ref));
    let d = max_abs_diff(&v, &v_ref);
    assert!(d <= tol, "second moment: {d:e} > {tol:e}");
}

proptest! {
    #![proptest_config(config(16))]

    /// Cautious weight decay is plain decay on the entries with w·o ≥ 0 and no decay elsewhere:
    /// per entry the same two IEEE operations (scale, then axpy) as the plain step or the
    /// decay-free step, so the result equals one of them bit for bit, chosen by the sign of w·o
    /// with o = msign(U) computed by the optimizer's own `direction`.
    #[test]
    fn cautious_decay_masks_entry_by_entry((m, n, seed) in shapes(), wd in 0.01f64..2.0) {
        let base = MuonConfig { lr: 0.05, weight_decay: wd, ..MuonConfig::paper() };
        let cautious = Muon::new(MuonConfig { cautious_weight_decay: true, ..base }).unwrap();
        let plain = Muon::new(base).unwrap();
        let free = Muon::new(MuonConfig { weight_decay: 0.0, ..base }).unwrap();
        let (w0, g) = (gaussian(m, n, seed), gaussian(m, n, seed ^ 9));
        let run = |opt: &Muon| {
            let mut w = w0.clone();
            opt.step(&mut w, &g, &mut MuonState::new()).unwrap();
            w
        };
        let (wc, wp, wf) = (run(&cautious), run(&plain), run(&free));
        let (_, u) = base.momentum.advance(None, &g).unwrap();
        let o = cautious.direction(&u).unwrap();
        let mut decayed = 0;
        for ((i, j), &x) in wc.indexed_iter() {
            let expected = if w0[[i, j]] * o[[i, j]] >= 0.0 { decayed += 1; wp[[i, j]] } else { wf[[i, j]] };
            prop_assert_eq!(x.to_bits(), expected.to_bits(), "entry ({}, {})", i, j);
        }
        // Both cases occur on Gaussian inputs (about half the entries each).
        prop_assert!(decayed > 0 && decayed < m * n);
    }

    /// `step_scaled(·, c)` is the step of the config with lr·c, bit for bit.
    #[test]
    fn step_scaled_is_a_step_at_the_multiplied_lr((m, n, seed) in shapes(), c in 0.0f64..4.0) {
        let base = MuonConfig { lr: 0.05, weight_decay: 0.1, ..MuonConfig::paper() };
        let (w0, g) = (gaussian(m, n, seed), gaussian(m, n, seed ^ 5));
        let mut a = w0.clone();
        Muon::new(base).unwrap().step_scaled(&mut a, &g, &mut MuonState::new(), c).unwrap();
        let mut b = w0.clone();
        Muon::new(MuonConfig { lr: 0.05 * c, ..base }).unwrap().step(&mut b, &g, &mut MuonState::new()).unwrap();
        prop_assert_eq!(a, b);
    }
}

#[test]
fn bad_variant_settings_are_named_and_change_nothing() {
    for beta2 in [1.0, -0.1, f64::NAN] {
        let cfg = MuonConfig {
            normuon: Some(NorMuon {
                beta2,
                axis: NeuronAxis::Outputs,
            }),
            ..MuonConfig::keller()
        };
        let e = Muon::new(cfg).unwrap_err().to_string();
        assert!(e.contains("normuon.beta2"), "{e}");
    }
    let muon = Muon::new(MuonConfig::keller().with_normuon()).unwrap();
    let mut w = gaussian(6, 4, 1);
    let w0 = w.clone();
    // A state whose second moment belongs to another parameter (5 neurons, not 6).
    let mut st = MuonState::new().with_second_moment(Some(vec![1.0; 5]));
    let e = muon.step(&mut w, &gaussian(6, 4, 2), &mut st).unwrap_err();
    assert!(e.to_string().contains("state"), "{e}");
    assert_eq!(w, w0);
    assert_eq!(st.steps(), 0);
    assert_eq!(st.second_moment().map(<[f64]>::len), Some(5));
    for c in [-1.0, f64::NAN, f64::INFINITY] {
        let e = muon.step_scaled(&mut w, &gaussian(6, 4, 2), &mut MuonState::new(), c);
        assert!(e.unwrap_err().to_string().contains("lr_multiplier"));
    }
    assert_eq!(w, w0);
}

#[test]
fn variant_fields_default_to_plain_muon_in_toml() {
    let text = r#"
        lr = 0.02
        weight_decay = 0.1
        scale = "none"
        layout = "out_in"
        precision = "auto"
        momentum = { beta = 0.95, kind = "sgd", nesterov = true }
        msign = { polar_express = { steps = 10 } }
    "#;
    let cfg: MuonConfig = toml::from_str(text).unwrap();
    assert_eq!(cfg, MuonConfig::paper());
    let with = format!("{text}\ncautious_weight_decay = true\nnormuon = {{ beta2 = 0.9 }}\n");
    let cfg: MuonConfig = toml::from_str(&with).unwrap();
    assert!(cfg.cautious_weight_decay);
    assert_eq!(
        cfg.normuon,
        Some(NorMuon {
            beta2: 0.9,
            axis: NeuronAxis::Outputs
        })
    );
    // Plain Muon serializes without the new keys, so old run folders compare equal.
    let out = toml::to_string(&MuonConfig::paper()).unwrap();
    assert!(
        !out.contains("normuon") && !out.contains("cautious"),
        "{out}"
    );
}

#[cfg(feature = "tch")]
mod tch_backend {
    use super::*;
    use kappa_linalg::tch_backend::{array_from_tensor, tensor_from_array};
    use tch::{Device, Kind, Tensor};

    fn t64(a: &Array2<f64>) -> Tensor {
        tensor_from_array(a.view(), Kind::Double, Device::Cpu).unwrap()
    }

    /// NorMuon with cautious decay, three steps, on f64 tensors (Polar Express in f64) against
    /// `ndarray` f64: the same map computed by two libraries, so the tolerance is
    /// `derived_tol` with the measured amplification of the whole three-step map (common.rs).
    /// Injections: the inputs, then per step the 10 Newton–Schulz steps, the normalization and
    /// the update.
    #[test]
    fn variants_agree_across_backends() {
        for (m, n) in [(24, 10), (10, 24)] {
            let cfg = MuonConfig {
                lr: 0.05,
                weight_decay: 0.2,
                precision: Precision::Native,
                cautious_weight_decay: true,
                normuon: Some(NorMuon::default()),
                ..MuonConfig::paper()
            };
            let muon = Muon::new(cfg).unwrap();
            let run64 = |inputs: &[Array2<f64>]| {
                let (mut w, mut st) = (inputs[0].clone(), MuonState::new());
                for g in &inputs[1..] {
                    muon.step(&mut w, g, &mut st).unwrap();
                }
                w
            };
            let inputs: Vec<Array2<f64>> = std::iter::once(gaussian(m, n, 1) * 0.1)
                .chain((0..3).map(|i| gaussian(m, n, 20 + i)))
                .collect();
            let w = run64(&inputs);
            let amp = amplification(run64, &inputs);
            let param = t64(&inputs[0]);
            let (mut alias, mut st) = (param.shallow_clone(), MuonState::new());
            for g in &inputs[1..] {
                muon.step(&mut alias, &t64(g), &mut st).unwrap();
            }
            let e = max_abs_diff(&array_from_tensor(&param).unwrap(), &w);
            let tol = derived_tol(1 + 3 * 12, m.max(n), amp, max_abs(&w));
            assert!(e <= tol, "{m}×{n}: {e} > {tol} (amplification {amp})");
        }
    }

    /// A 4-D filter steps as its (out, in·kh·kw) flattening, in place, bit for bit.
    #[test]
    fn four_d_weights_step_as_their_flattening() {
        let muon = Muon::new(MuonConfig {
            precision: Precision::Native,
            ..MuonConfig::keller()
        })
        .unwrap();
        let w0 = gaussian(6, 3 * 2 * 2, 4);
        let g = gaussian(6, 12, 5);
        let param = t64(&w0).view([6, 3, 2, 2]);
        let mut alias = param.shallow_clone();
        let grad = t64(&g).view([6, 3, 2, 2]);
        let mut st = MuonState::new();
        muon.step_flattened(&mut alias, &grad, &mut st).unwrap();
        let mut flat = t64(&w0);
        muon.step(&mut flat, &t64(&g), &mut MuonState::new())
            .unwrap();
        assert_eq!(param.size(), [6, 3, 2, 2]);
        let got = array_from_tensor(&param.view([6, 12])).unwrap();
        assert_eq!(got, array_from_tensor(&flat).unwrap());
        assert_eq!(st.steps(), 1);
        // Rank 1, a mismatched gradient and a non-contiguous weight are errors that change nothing.
        let before = param.copy();
        let mut bias = Tensor::zeros([6], (Kind::Double, Device::Cpu));
        let bias_grad = bias.copy();
        let e = muon.step_flattened(&mut bias, &bias_grad, &mut MuonState::new());
        assert!(e.unwrap_err().to_string().contains("rank"));
        let e = muon.step_flattened(&mut alias, &t64(&g), &mut st);
        assert!(e.unwrap_err().to_string().contains("grad"));
        let mut strided = param.transpose(0, 1);
        let e = muon.step_flattened(&mut strided, &grad.transpose(0, 1), &mut st);
        assert!(e.unwrap_err().to_string().contains("contiguous"));
        assert!(param.equal(&before));
        assert_eq!(st.steps(), 1);
    }
}
