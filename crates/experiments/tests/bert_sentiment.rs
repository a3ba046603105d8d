//! The `bert-sentiment` experiment at smoke scale through the runner (`reproduce --only
//! bert-sentiment`) on fixture data: every variant is pretrained and fine-tuned, the
//! fine-tuning starts from the pretrained encoder (checked with a fine-tuning lr of 1e-12, so
//! that the fine-tuned encoder must still be the pretrained one), and the report has the
//! accuracy table beside the paper's row, the verdict, the loss curves and the diagnostics of
//! both stages.

use std::fs;

use kappa_experiments::runner::{report, reproduce, select, Settings};
use kappa_experiments::suite::bert_sentiment::{BertSentiment, FINE_TUNING, PRETRAINING};
use kappa_experiments::{Experiment, RunRecord, Scale};
use kappa_train::{MetricsLine, Outcome, Record};

#[test]
fn reproduce_only_bert_sentiment_pretrains_fine_tunes_and_reports() {
    let results = std::env::temp_dir().join(format!("kappa-bert-{}", std::process::id()));
    let _ = fs::remove_dir_all(&results);
    let data = results.join("data");
    kappa_models::data::fixtures::write_sotu(&data.join("sotu")).unwrap();
    kappa_models::data::fixtures::write_brown(&data.join("brown"), 20).unwrap();
    kappa_models::data::sequences::fixtures::write_movie_reviews(
        &data.join("movie-reviews"),
        60,
        0,
    )
    .unwrap();
    let experiments = select(&["bert-sentiment".to_string()]).unwrap();
    let sets: Vec<kappa_cli::Set> = ["finetune.lr=1e-12", "finetune.min_lr=1e-12"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let settings = Settings {
        scale: Scale::Smoke,
        seeds: Some(2),
        threads: 1,
        device: "cpu",
        results: &results,
        data: &data,
        resume: false,
        fresh: false,
        config: None,
        sets: &sets,
        units: &[],
        stop: Default::default(),
        ranks: std::sync::Arc::new(kappa_dist::Single),
    };
    reproduce(&experiments, &settings).unwrap();
    report(Scale::Smoke, std::slice::from_ref(&results), &results, &[]).unwrap();

    let config = BertSentiment.config(Scale::Smoke).unwrap();
    let runs = RunRecord::read_all(&results.join("bert-sentiment").join("smoke")).unwrap();
    assert_eq!(runs.len(), 2);
    let lines: Vec<MetricsLine> = runs[0].metrics().unwrap();
    for (i, v) in config.variants.iter().enumerate() {
        for (stage, index) in [(PRETRAINING, 2 * i), (FINE_TUNING, 2 * i + 1)] {
            let name = stage.name(&v.name);
            let summary = lines
                .iter()
                .find_map(|l| (l.variant == name).then_some(l.summary.as_ref()).flatten())
                .unwrap_or_else(|| panic!("no summary for {name}"));
            assert_eq!(summary.outcome, Outcome::Completed, "{name}");
            assert!(summary.metric.is_finite(), "{name}");
            let ckpt = runs[0]
                .dir
                .join(format!("variant-{index}/checkpoint.safetensors"));
            assert!(ckpt.is_file(), "{}", ckpt.display());
        }
        // The masked-LM evaluations carry an accuracy and the attention diagnostics.
        let evals = lines
            .iter()
            .filter(|l| l.variant == PRETRAINING.name(&v.name));
        assert!(evals.clone().any(|l| matches!(
            &l.record,
            Some(Record::Eval { eval, heads, .. }) if eval.accuracy.is_some() && !heads.is_empty()
        )));
    }
    // Fine-tuning started from the pretrained encoder. An AdamW step moves a weight by at most
    // lr·(1 + wd·|w|) when 1 − β₁ ≤ √(1 − β₂) (Kingma & Ba's bound on |m̂/√v̂|; 0.1 ≤ 0.14
    // here), and rounding to the nearest f32 at most doubles that, so 8 steps at lr 1e-12 move
    // it by < 2e-11: the fine-tuned encoder must be the pretrained one to 1e-10, while
    // pretraining moved it from its initialization by far more (so the check is not vacuous).
    let tensors = |index: usize| -> std::collections::HashMap<String, tch::Tensor> {
        let path = runs[0]
            .dir
            .join(format!("variant-{index}/checkpoint.safetensors"));
        tch::Tensor::read_safetensors(path)
            .unwrap()
            .into_iter()
            .collect()
    };
    let seed = runs[0].info.run.seed;
    for i in 0..config.variants.len() {
        let (pre, ft) = (tensors(2 * i), tensors(2 * i + 1));
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let model = config.model.with_correction(config.variants[i].correction);
        kappa_models::seeded(seed, || kappa_models::MaskedLm::new(&vs.root(), model)).unwrap();
        let init = vs.variables();
        let encoder: Vec<&String> = ft
            .keys()
            .filter(|k| k.starts_with("model/encoder."))
            .collect();
        assert!(!encoder.is_empty());
        let mut moved = 0.0f64;
        for name in encoder {
            let diff = (&ft[name] - &pre[name]).abs().max().double_value(&[]);
            assert!(diff < 1e-10, "{name} moved by {diff} in fine-tuning");
            let start = &init[name.strip_prefix("model/").unwrap()];
            moved = moved.max((&pre[name] - start).abs().max().double_value(&[]));
        }
        assert!(
            moved > 1e-4,
            "pretraining moved the encoder by {moved} only"
        );
    }

    // `--resume` over finished runs keeps every run folder as it is.
    let metrics = runs[1].dir.join("metrics.jsonl");
    let before = fs::read(&metrics).unwrap();
    let resumed = Settings {
        resume: true,
        fresh: false,
        stop: Default::default(),
        ranks: std::sync::Arc::new(kappa_dist::Single),
        ..settings
    };
    reproduce(&experiments, &resumed).unwrap();
    assert_eq!(fs::read(&metrics).unwrap(), before);

    let text = fs::read_to_string(results.join("report.md")).unwrap();
    assert!(text.contains("## bert-sentiment"), "{text}");
    for needle in [
        "| variant | MLM held-out loss | MLM held-out accuracy (%) | test accuracy (%) | seeds | paper SST-2 (%) |",
        "| 92.3 |",
        "| 92.7 |",
        "| variant | Δ accuracy (points) | t | p | verdict |",
        "Welch's one-sided t-test",
        "| variant | κ(W_Q) | σ_min(W_Q) | κ(W_K) | σ_min(W_K) | κ(W_V) | σ_min(W_V) |",
        "mlm-loss.png",
        "mlm-kappa_wq.png",
        "sentiment-entropy.png",
    ] {
        assert!(text.contains(needle), "the report lacks {needle:?}:\n{text}");
    }
    fs::remove_dir_all(&results).unwrap();
}
