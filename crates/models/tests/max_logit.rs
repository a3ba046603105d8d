//! The per-head max-logit capture and QK-clip on the attention layers: the capture agrees with
//! the eval-time diagnostic and with the materialized masked scores, leaves the forward as it
//! was, and the clip brings every head of the captured input to τ or below.

use kappa_attention::{HeadLayout, ScoreScale};
use kappa_models::diagnostics::{diagnose, DiagnosticsConfig};
use kappa_models::max_logit::{head_max_logits, CHUNK_ENTRIES};
use kappa_models::{
    seeded, AttentionConfig, AttentionKernel, ConditionedAttention, CorrectionConfig, Gpt,
    GptConfig, Transformer,
};
use kappa_optim::QkClipConfig;
use tch::{nn, Device, Kind, Tensor};

const CPU: Device = Device::Cpu;

/// The reference: the whole B×H×T×T score matrix, masked, reduced per head.
fn materialized(q: &Tensor, k: &Tensor, scale: f64, causal: bool) -> Vec<f64> {
    let t = q.size()[2];
    let s = q.matmul(&k.transpose(-2, -1)) * scale;
    let s = if causal {
        s.masked_fill(
            &Tensor::ones([t, t], (Kind::Bool, CPU)).triu(1),
            f64::NEG_INFINITY,
        )
    } else {
        s
    };
    let m = s.amax([0, 2, 3], false);
    (0..m.size()[0]).map(|h| m.double_value(&[h])).collect()
}

fn values(m: &Tensor) -> Vec<f64> {
    (0..m.size()[0]).map(|h| m.double_value(&[h])).collect()
}

fn close(a: &[f64], b: &[f64], rel: f64) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= rel * y.abs().max(1.0))
}

#[test]
fn the_chunked_max_equals_the_materialized_one_and_excludes_the_future() {
    // B·H·T = 4400, so 953 query rows per chunk: two chunks, the second one partial.
    let (b, h, t, k) = (2, 2, 1100, 4);
    assert!(b * h * t * t > CHUNK_ENTRIES);
    // Draws under `seeded`'s lock: the tests of this binary run in parallel threads and share
    // libtorch's generator.
    let (q, kk) = seeded(0, || {
        let q = Tensor::randn([b, h, t, k], (Kind::Float, CPU));
        (q, Tensor::randn([b, h, t, k], (Kind::Float, CPU)))
    });
    // Huge logits with the last key, which only the last query (set to 0) may see.
    let _ = kk.narrow(2, t - 1, 1).narrow(3, 0, 1).fill_(1e3);
    let _ = q.narrow(2, t - 1, 1).fill_(0.0);
    for causal in [false, true] {
        let got = values(&head_max_logits(&q, &kk, 0.5, causal));
        let want = materialized(&q, &kk, 0.5, causal);
        assert!(
            close(&got, &want, 1e-6),
            "causal {causal}: {got:?} {want:?}"
        );
    }
    let open = values(&head_max_logits(&q, &kk, 0.5, false));
    let masked = values(&head_max_logits(&q, &kk, 0.5, true));
    for h in 0..2 {
        assert!(open[h] >= 500.0 && masked[h] < 100.0, "{open:?} {masked:?}");
    }
    let empty = Tensor::zeros([1, 3, 0, 4], (Kind::Float, CPU));
    assert!(values(&head_max_logits(&empty, &empty, 1.0, true))
        .iter()
        .all(|&m| m == f64::NEG_INFINITY));
}

#[test]
fn the_capture_matches_the_diagnostics_and_does_not_change_the_forward() {
    for correction in [
        CorrectionConfig::None,
        CorrectionConfig::identity(2.0, HeadLayout::Shifted),
    ] {
        let vs = nn::VarStore::new(CPU);
        let cfg = GptConfig {
            bias: true,
            ..GptConfig::tiny(9).with_correction(correction)
        };
        let (gpt, idx) = seeded(1, || {
            let gpt = Gpt::new(&vs.root(), cfg).unwrap();
            (gpt, Tensor::randint(9, [3, 16], (Kind::Int64, CPU)))
        });
        let plain = gpt.logits(&idx).unwrap();
        assert!(gpt.captured_max_logits().iter().all(Option::is_none));
        gpt.capture_max_logits(true);
        let captured_run = gpt.logits(&idx).unwrap();
        assert!(
            plain.equal(&captured_run),
            "the capture changed the forward"
        );
        let captured = gpt.captured_max_logits();
        let (_l, traces) = gpt.forward_trace(&idx, true);
        let config = DiagnosticsConfig {
            enabled: true,
            samples: 3,
            jacobian_max_tokens: 0,
        };
        let heads = diagnose(&gpt, &traces, &config).unwrap();
        for (layer, trace) in traces.iter().enumerate() {
            let got = captured[layer].clone().unwrap();
            let diag: Vec<f64> = heads
                .iter()
                .filter(|d| d.layer == layer)
                .map(|d| d.max_logit)
                .collect();
            assert!(
                close(&got, &diag, 1e-5),
                "{correction:?} {layer}: {got:?} {diag:?}"
            );
            // The trace's scores are unmasked: the reference masks them.
            let t = 16;
            let masked = trace.scores.masked_fill(
                &Tensor::ones([t, t], (Kind::Bool, CPU)).triu(1),
                f64::NEG_INFINITY,
            );
            let want = values(&masked.amax([0, 2, 3], false));
            assert!(close(&got, &want, 1e-5), "{layer}: {got:?} {want:?}");
            let unmasked = values(&trace.scores.amax([0, 2, 3], false));
            assert!(got
                .iter()
                .zip(&unmasked)
                .all(|(g, u)| *g <= u + 1e-5 * u.abs()));
        }
        gpt.capture_max_logits(false);
        assert!(gpt.captured_max_logits().iter().all(Option::is_none));
    }
}

fn layer(
    correction: CorrectionConfig,
    bias: bool,
    causal: bool,
) -> (nn::VarStore, ConditionedAttention) {
    let vs = nn::VarStore::new(CPU);
    let cfg = AttentionConfig {
        n_embd: 12,
        n_head: 3,
        bias,
        causal,
        scaling: ScoreScale::InvSqrtK,
        correction,
        fused_kernel: true,
        kernel: AttentionKernel::Softmax,
    };
    let attn = seeded(2, || {
        let attn = ConditionedAttention::new(vs.root() / "attn", cfg, 0.3).unwrap();
        tch::no_grad(|| {
            let _ = attn.qkv_weight().shallow_clone().g_mul_scalar_(40.0);
            if let Some(b) = attn.qkv_bias() {
                let _ = b.shallow_clone().normal_(0.0, 1.0);
            }
        });
        attn
    });
    (vs, attn)
}

/// The rounding allowance of the clip's bound, in units of f32's u = 2⁻²⁴: each logit is a
/// k-term dot product of entries that are D-term dot products (plus the bias), and the weights
/// are rounded once or, with a correction, three times, so |ŝ − s| ≤ (2(D + 1) + k + 6)·u·Σ|…|
/// to first order. The largest logit is the most aligned pair, whose terms barely cancel; a
/// factor 4 covers Σ|…|/|s| there.
fn allowance(d: usize, k: usize) -> f64 {
    4.0 * (2.0 * (d as f64 + 1.0) + k as f64 + 6.0) * f64::from(f32::EPSILON) / 2.0
}

#[test]
fn the_clip_brings_every_head_of_the_captured_input_to_tau() {
    for correction in [
        CorrectionConfig::None,
        CorrectionConfig::identity(3.0, HeadLayout::Shifted),
        CorrectionConfig::identity(3.0, HeadLayout::SameBlock),
        CorrectionConfig::Svd { every: 1 },
    ] {
        for (bias, causal) in [(false, true), (true, true), (true, false)] {
            let (_vs, attn) = layer(correction, bias, causal);
            attn.refresh_correction(1).unwrap();
            let x = seeded(3, || Tensor::randn([2, 7, 12], (Kind::Float, CPU)));
            let clip = QkClipConfig {
                tau: 1.0,
                alpha: 0.5,
            };
            assert!(
                attn.clip_qk(&clip).unwrap().is_none(),
                "nothing captured yet"
            );
            attn.capture_max_logits(true);
            let _ = attn.try_forward(&x).unwrap();
            let before = attn.max_logits(&x).unwrap();
            let mut sorted = before.clone();
            sorted.sort_by(f64::total_cmp);
            let tau = 0.5 * (sorted[0] + sorted[2]);
            assert!(
                sorted[0] < tau && tau < sorted[2] && tau > 0.0,
                "{before:?}"
            );
            let w_eff = attn.effective_qkv_weight();
            let clip = QkClipConfig { tau, alpha: 0.5 };
            let report = attn.clip_qk(&clip).unwrap().unwrap();
            assert!(close(&report.max_logits, &before, 0.0));
            assert!(report.clipped() >= 1 && report.clipped() < 3, "{report:?}");
            let after = attn.max_logits(&x).unwrap();
            let w_new = attn.effective_qkv_weight();
            let tol = allowance(12, 4);
            for h in 0..3 {
                let rows = |block: i64| (block * 12 + 4 * h as i64, 4);
                let f = report.factors[h];
                for (block, gamma) in [(0, f.query), (1, f.key), (2, 1.0)] {
                    let (start, len) = rows(block);
                    let old = w_eff.narrow(0, start, len);
                    let new = w_new.narrow(0, start, len);
                    let dev = (&new - &old * gamma).abs().max().double_value(&[]);
                    let scale = old.abs().max().double_value(&[]);
                    assert!(dev <= 1e-6 * scale, "{correction:?} head {h} block {block}");
                }
                if before[h] > tau {
                    assert!(
                        after[h] <= tau * (1.0 + tol),
                        "{correction:?} {h}: {}",
                        after[h]
                    );
                    assert!(
                        after[h] >= tau * (1.0 - tol),
                        "{correction:?} {h}: {}",
                        after[h]
                    );
                } else {
                    assert!(!f.is_clipped());
                    assert!((after[h] - before[h]).abs() <= tol * before[h].abs().max(1.0));
                }
            }
        }
    }
}

#[test]
fn scale_qk_checks_the_head_count() {
    let (_vs, attn) = layer(CorrectionConfig::None, false, true);
    assert!(attn.scale_qk(&[kappa_optim::HeadFactors::ONE]).is_err());
    assert!(attn
        .max_logits(&Tensor::zeros([1, 2, 5], (Kind::Float, CPU)))
        .is_err());
}
