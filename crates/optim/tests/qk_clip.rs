//! QK-clip: the factors, the row-block application on both backends, and the exact bound on
//! the logits of the same inputs, with and without a fixed correction C.

use kappa_optim::{
    clip_rows, fused_qkv_row_factors, scale_rows, HeadFactors, OptimError, QkClipConfig,
};
use ndarray::{s, Array2};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random(rows: usize, cols: usize, scale: f64, seed: u64) -> Array2<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Array2::from_shape_fn((rows, cols), |_| scale * (rng.gen::<f64>() * 2.0 - 1.0))
}

/// Per-head max of s·(x W_Q^hᵀ)(x W_K^hᵀ)ᵀ for a fused (3D × D) weight (libtorch's layout),
/// over all pairs (bidirectional).
fn max_logits(x: &Array2<f64>, w: &Array2<f64>, heads: usize, scale: f64) -> Vec<f64> {
    let d = x.ncols();
    let k = d / heads;
    let qkv = x.dot(&w.t());
    (0..heads)
        .map(|h| {
            let q = qkv.slice(s![.., h * k..(h + 1) * k]);
            let kk = qkv.slice(s![.., d + h * k..d + (h + 1) * k]);
            q.dot(&kk.t())
                .iter()
                .fold(f64::NEG_INFINITY, |m, &v| m.max(v * scale))
        })
        .collect()
}

#[test]
fn factors_split_gamma_by_alpha_and_leave_heads_under_tau_alone() {
    let clip = QkClipConfig {
        tau: 10.0,
        alpha: 0.25,
    };
    let f = clip.factors(&[5.0, 10.0, 40.0, f64::NEG_INFINITY]).unwrap();
    assert_eq!(f[0], HeadFactors::ONE);
    assert_eq!(f[1], HeadFactors::ONE, "S = τ is not clipped");
    assert_eq!(f[3], HeadFactors::ONE, "an empty head (−∞) is not clipped");
    let gamma: f64 = 0.25;
    assert!((f[2].query - gamma.powf(0.25)).abs() < 1e-15);
    assert!((f[2].key - gamma.powf(0.75)).abs() < 1e-15);
    assert!((f[2].query * f[2].key - gamma).abs() < 1e-15);
    assert!(f[2].is_clipped() && !f[0].is_clipped());
    // α = 0 and α = 1 put the whole shrink on one side.
    let keys_only = QkClipConfig {
        tau: 10.0,
        alpha: 0.0,
    }
    .head_factors(20.0)
    .unwrap();
    assert_eq!((keys_only.query, keys_only.key), (1.0, 0.5));
}

#[test]
fn bad_configs_and_non_finite_logits_are_typed_errors() {
    for (tau, alpha, arg) in [
        (0.0, 0.5, "tau"),
        (-1.0, 0.5, "tau"),
        (f64::INFINITY, 0.5, "tau"),
        (f64::NAN, 0.5, "tau"),
        (100.0, -0.1, "alpha"),
        (100.0, 1.5, "alpha"),
        (100.0, f64::NAN, "alpha"),
    ] {
        let err = QkClipConfig { tau, alpha }.validate().unwrap_err();
        assert!(
            matches!(&err, OptimError::Input(e) if e.arg() == arg),
            "{tau} {alpha}: {err}"
        );
    }
    for s in [f64::NAN, f64::INFINITY] {
        let err = QkClipConfig::default().factors(&[1.0, s]).unwrap_err();
        assert!(
            matches!(&err, OptimError::Input(e) if e.arg() == "max_logits"),
            "{err}"
        );
    }
    let mut w = Array2::<f64>::zeros((3, 2));
    let err = clip_rows(&mut w, None, &[0.5, 1.0]).unwrap_err();
    assert!(
        matches!(&err, OptimError::Input(e) if e.arg() == "s"),
        "{err}"
    );
    let c = Array2::<f64>::zeros((2, 2));
    assert!(clip_rows(&mut w, Some(&c), &[0.5, 1.0, 1.0]).is_err());
}

#[test]
fn the_toml_form_defaults_alpha_to_one_half_and_refuses_unknown_fields() {
    let c: QkClipConfig = serde_json::from_str(r#"{"tau": 50.0}"#).unwrap();
    assert_eq!(
        c,
        QkClipConfig {
            tau: 50.0,
            alpha: 0.5
        }
    );
    assert!(serde_json::from_str::<QkClipConfig>(r#"{"tau": 50.0, "beta": 1}"#).is_err());
    assert_eq!(
        QkClipConfig::default(),
        QkClipConfig {
            tau: 100.0,
            alpha: 0.5
        }
    );
}

#[test]
fn scale_rows_is_diag_times_the_matrix() {
    let m = random(3, 4, 1.0, 1);
    let s = [2.0, -1.0, 0.5];
    let out = scale_rows(m.clone(), &s).unwrap();
    for i in 0..3 {
        for j in 0..4 {
            assert_eq!(out[[i, j]], s[i] * m[[i, j]]);
        }
    }
    assert!(scale_rows(m, &[1.0]).is_err());
}

/// The clip brings every clipped head's max logit on the same inputs to τ and leaves the other
/// heads (and the value rows) exactly as they were; with a correction C it acts on W + C.
#[test]
fn the_clipped_heads_reach_tau_exactly_on_the_same_inputs() {
    let (n, d, heads) = (7, 8, 4);
    let k = d / heads;
    let scale = 1.0 / (k as f64).sqrt();
    let x = random(n, d, 1.0, 2);
    for with_correction in [false, true] {
        let mut w = random(3 * d, d, 3.0, 3);
        // A λ·I-style shift on each of the three D×D blocks.
        let c = with_correction.then(|| {
            let mut c = Array2::<f64>::zeros((3 * d, d));
            for b in 0..3 {
                for i in 0..d {
                    c[[b * d + i, i]] = 2.0;
                }
            }
            c
        });
        let effective = |w: &Array2<f64>| match &c {
            Some(c) => w + c,
            None => w.clone(),
        };
        let before = max_logits(&x, &effective(&w), heads, scale);
        let mut sorted = before.clone();
        sorted.sort_by(f64::total_cmp);
        // τ between the smallest and the largest head: some heads clip, some do not.
        let tau = 0.5 * (sorted[0] + sorted[heads - 1]);
        let clip = QkClipConfig { tau, alpha: 0.5 };
        let factors = clip.factors(&before).unwrap();
        let original = w.clone();
        clip_rows(&mut w, c.as_ref(), &fused_qkv_row_factors(&factors, k)).unwrap();
        let after = max_logits(&x, &effective(&w), heads, scale);
        for h in 0..heads {
            let rows = |b: usize| s![b * d + h * k..b * d + (h + 1) * k, ..];
            if before[h] > tau {
                assert!(
                    (after[h] - tau).abs() <= 1e-12 * tau,
                    "head {h}: {}",
                    after[h]
                );
            } else {
                assert_eq!(after[h], before[h], "head {h}");
                assert_eq!(w.slice(rows(0)), original.slice(rows(0)));
                assert_eq!(w.slice(rows(1)), original.slice(rows(1)));
            }
            assert_eq!(w.slice(rows(2)), original.slice(rows(2)), "value rows");
        }
        assert!(factors.iter().any(HeadFactors::is_clipped));
    }
}

#[cfg(feature = "tch")]
#[test]
fn the_tensor_backend_clips_in_place_like_ndarray() {
    use kappa_linalg::tch_backend::{array_from_tensor, tensor_from_array};
    let w0 = random(12, 4, 1.0, 4);
    let c0 = random(12, 4, 1.0, 5);
    let f = [
        HeadFactors {
            query: 0.5,
            key: 0.8,
        },
        HeadFactors::ONE,
    ];
    let rows = fused_qkv_row_factors(&f, 2);
    for correction in [false, true] {
        let mut expect = w0.clone();
        clip_rows(&mut expect, correction.then_some(&c0), &rows).unwrap();
        let (kind, cpu) = (tch::Kind::Double, tch::Device::Cpu);
        let t = tensor_from_array(w0.view(), kind, cpu)
            .unwrap()
            .set_requires_grad(true);
        let c = tensor_from_array(c0.view(), kind, cpu).unwrap();
        // A shallow clone of the parameter: its storage is written in place.
        clip_rows(&mut t.shallow_clone(), correction.then_some(&c), &rows).unwrap();
        let got = array_from_tensor(&t).unwrap();
        let diff = (&got - &expect)
            .mapv(f64::abs)
            .fold(0.0, |m: f64, &v| m.max(v));
        assert!(diff <= 1e-15, "correction {correction}: {diff}");
    }
}
