//! QK-clip in the training loop: a tiny GPT at a learning rate that drives its logits past τ
//! keeps every head's max logit on the step's layer inputs at τ (up to rounding) after each
//! clipped step, and a run without the clip (or with one that never fires) is bit-identical.

use std::path::PathBuf;

use kappa_models::data::fixtures;
use kappa_models::{Gpt, GptConfig, ModelsError, TextCorpus, TokenizerKind, Transformer};
use kappa_optim::QkClipConfig;
use kappa_train::{seeded, LanguageModeling, Record, RunContext, TrainConfig, Trainer};
use tch::{nn, Device};

const STEPS: u64 = 40;

fn data_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kappa-train-qkclip-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    fixtures::write_sotu(&dir).unwrap();
    dir
}

fn config(qk_clip: Option<QkClipConfig>) -> TrainConfig {
    TrainConfig {
        // One step more than the test runs: the last step of a run evaluates, and evaluation
        // forwards replace the captured training input.
        steps: STEPS + 1,
        batch_size: 4,
        // Ten times the usual tiny-model lr and no weight decay: the logits grow fast.
        lr: 3e-2,
        min_lr: 3e-2,
        warmup_steps: 0,
        weight_decay: 0.0,
        eval_every: STEPS + 1,
        eval_batches: 1,
        log_every: 1,
        diagnostics: kappa_models::DiagnosticsConfig {
            enabled: false,
            ..Default::default()
        },
        qk_clip,
        ..TrainConfig::default()
    }
}

fn context() -> RunContext {
    RunContext {
        seed: 5,
        threads: 1,
        ..RunContext::default()
    }
    .quiet()
}

fn task(dir: &std::path::Path) -> (nn::VarStore, LanguageModeling) {
    let corpus = TextCorpus::load_sotu(dir, TokenizerKind::Char, None, Device::Cpu).unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let gpt = seeded(1, || {
        Gpt::new(&vs.root(), GptConfig::tiny(corpus.tokenizer.vocab_size()))
    })
    .unwrap();
    (vs, LanguageModeling::new(gpt, corpus, 5).unwrap())
}

/// Trains one step at a time; after each, `check` sees the model.
fn train_stepwise(
    dir: &std::path::Path,
    cfg: TrainConfig,
    mut check: impl FnMut(u64, &Gpt),
) -> Vec<Record> {
    // The run's one thread in force before the model is built (`RunContext::apply_threads`):
    // runs are compared bit for bit.
    context().apply_threads();
    let (vs, mut task) = task(dir);
    let mut trainer = Trainer::new(&vs, cfg, &context()).unwrap();
    let mut records = Vec::new();
    for step in 1..=STEPS {
        trainer.stop_after(step);
        let mut sink = |r: &Record| -> Result<(), ModelsError> {
            records.push(r.clone());
            Ok(())
        };
        trainer.run(&mut task, &mut sink, None).unwrap();
        check(step, &task.model);
    }
    records
}

fn losses(records: &[Record]) -> Vec<u64> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Train { loss, .. } => Some(loss.to_bits()),
            _ => None,
        })
        .collect()
}

/// See `crates/models/tests/max_logit.rs`: the first-order rounding bound of a k-term dot
/// product of D-term ones (2(D + 1) + k + 6 units of u = 2⁻²⁴), times 4 for Σ|…|/|s| at the
/// most aligned pair.
fn allowance(d: usize, k: usize) -> f64 {
    4.0 * (2.0 * (d as f64 + 1.0) + k as f64 + 6.0) * f64::from(f32::EPSILON) / 2.0
}

#[test]
fn the_clip_holds_every_head_at_tau_after_each_step_and_off_is_bit_identical() {
    let dir = data_dir();
    // Without the clip: the largest logit of each step's forward (the capture on by hand).
    let mut peak = Vec::new();
    let unclipped = train_stepwise(&dir, config(None), |step, gpt| {
        if step == 1 {
            gpt.capture_max_logits(true);
        } else {
            let m = gpt.captured_max_logits();
            peak.push(
                m.iter()
                    .flatten()
                    .flatten()
                    .copied()
                    .fold(f64::MIN, f64::max),
            );
        }
    });
    let (first, last) = (peak[0], peak.iter().copied().fold(f64::MIN, f64::max));
    // τ between the early logits and the peak: the unclipped run blows past it.
    let tau = first + 0.5 * (last - first);
    assert!(
        last > 1.5 * tau && tau > 0.0,
        "logits {first} → {last}, τ {tau}"
    );
    assert!(unclipped.iter().all(|r| !matches!(
        r,
        Record::Train {
            qk_clip: Some(_),
            ..
        }
    )));

    let clip = QkClipConfig { tau, alpha: 0.5 };
    let tol = allowance(16, 8);
    let relaxed = QkClipConfig {
        tau: tau * (1.0 + tol),
        alpha: 0.5,
    };
    let clipped = train_stepwise(&dir, config(Some(clip)), |step, gpt| {
        // Each layer's max logit on its captured input (the step's forward) with the
        // weights after the step and its clip: τ at most, up to rounding (a clip at
        // τ·(1 + tol) finds nothing to do).
        let reports = gpt.clip_qk(&relaxed).unwrap();
        assert_eq!(reports.len(), 2);
        for r in &reports {
            assert_eq!(
                r.clipped(),
                0,
                "step {step}: {:?} > τ = {tau}",
                r.max_logits
            );
        }
    });
    let stats: Vec<_> = clipped
        .iter()
        .filter_map(|r| match r {
            Record::Train { qk_clip, .. } => *qk_clip,
            _ => None,
        })
        .collect();
    assert_eq!(stats.len() as u64, STEPS);
    let fired = stats.iter().filter(|s| s.clipped_heads > 0).count();
    assert!(fired >= 5, "the clip fired on {fired} steps");
    for s in stats.iter().filter(|s| s.clipped_heads > 0) {
        assert!(s.max_logit > tau, "{s:?}");
    }
    let text = serde_json::to_string(&clipped[0]).unwrap();
    assert!(text.contains("\"qk_clip\":{\"max_logit\""), "{text}");

    // Off: no `qk_clip` key; a clip that never fires changes no bit of the losses.
    let off = serde_json::to_string(&unclipped[0]).unwrap();
    assert!(!off.contains("qk_clip"), "{off}");
    let never = QkClipConfig {
        tau: 1e30,
        alpha: 0.5,
    };
    let idle = train_stepwise(&dir, config(Some(never)), |_, _| {});
    assert_eq!(losses(&idle), losses(&unclipped));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn qk_clip_configs_are_validated_and_old_configs_parse_without_it() {
    let mut cfg = config(Some(QkClipConfig {
        tau: -1.0,
        alpha: 0.5,
    }));
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("train.qk_clip.tau"), "{err}");
    cfg.qk_clip = Some(QkClipConfig {
        tau: 100.0,
        alpha: 2.0,
    });
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("train.qk_clip.alpha"), "{err}");
    // The TOML of a config without the field parses to `None` and writes no `qk_clip`.
    let text = toml::to_string(&config(None)).unwrap();
    assert!(!text.contains("qk_clip"), "{text}");
    let back = TrainConfig::from_toml(&text).unwrap();
    assert_eq!(back.qk_clip, None);
    // (Before the first table, or it would land in `[diagnostics]`.)
    let with = format!("qk_clip = {{ tau = 50.0 }}\n{text}");
    let parsed = TrainConfig::from_toml(&with).unwrap();
    assert_eq!(
        parsed.qk_clip,
        Some(QkClipConfig {
            tau: 50.0,
            alpha: 0.5
        })
    );
}
