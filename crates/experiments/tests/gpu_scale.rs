//! The `gpu` scale's configs, checked on the CPU for one step: for each experiment that trains a
//! model (vit-fmnist, gpt-sotu, manifolds, bert-sentiment — its pretraining and fine-tuning —,
//! lra — every task at its gpu length —, lambda-readings — both models, every reading × λ),
//! `experiments/<name>/gpu.toml` builds its models at
//! their full width, trains one step of every variant the seed runs, logs, writes a checkpoint
//! and is "killed" there; resumed, it finishes step two, evaluates and ends completed.
//!
//! What the check changes, so that it takes seconds rather than hours on 2 cores: two steps of
//! batch 2 with an evaluation of one batch after each, one block instead of twelve (every block
//! has the same shapes), the training-set sizes of the fixture data, and, for manifolds, one
//! dual-ascent step instead of twenty. (Cutting msign's ten Polar Express iterations to two as
//! well was tried: the retraction onto the Stiefel manifold at initialization then ends far
//! from it, violation 0.64 > 0.05, and the run stops with that error — msign's iteration count
//! is part of what this check checks.) Widths, heads, context,
//! vocabulary, patches, variants, optimizers and their geometry are the file's. The experiments
//! that compute on the CPU only (random-spectra, theory, convergence, optim-geometry) run their
//! paper sizes at this scale; `builtin_configs.rs` checks that their files load.

use std::fs;
use std::path::Path;

use kappa_experiments::run::{Resumed, Run, RunContext, RunRecord, RunStatus};
use kappa_experiments::suite::bert_sentiment::{BertSentiment, FINE_TUNING, PRETRAINING};
use kappa_experiments::suite::gpt_sotu::GptSotu;
use kappa_experiments::suite::lambda_readings::{LambdaReadings, ModelSpec};
use kappa_experiments::suite::lra::{Config as LraConfig, Lra};
use kappa_experiments::suite::manifolds::Manifolds;
use kappa_experiments::suite::vit_fmnist::VitFmnist;
use kappa_experiments::{Experiment, Scale};
use kappa_train::{MetricsLine, Outcome, Record, TrainConfig};

fn context(name: &str, seed: u64, data: &Path) -> RunContext {
    RunContext {
        name: name.into(),
        scale: Scale::Gpu.name().into(),
        seed,
        threads: 2,
        device: "cpu".into(),
        data_dir: data.to_path_buf(),
        progress: false,
        stop: Default::default(),
    }
}

/// The SOTU fixture with each split repeated ten times: the context of 256 BPE tokens needs
/// more text than the fixture's few sentences.
fn write_sotu_text(dir: &Path) {
    kappa_models::data::fixtures::write_sotu(dir).unwrap();
    for split in ["train.txt", "val.txt"] {
        let text = fs::read_to_string(dir.join(split)).unwrap();
        fs::write(dir.join(split), vec![text; 10].join(" ")).unwrap();
    }
}

/// Two steps of batch 2, an evaluation of one batch and a checkpoint after each.
fn two_short_steps(train: &mut TrainConfig) {
    train.steps = 2;
    train.warmup_steps = 1;
    train.batch_size = 2;
    train.eval_every = 1;
    train.eval_batches = 1;
    train.log_every = 1;
    train.checkpoint_every = 1;
}

/// Runs `config` in `dir`: variant 0 is stopped after one step (its checkpoint written, no
/// `run.json`, as a killed process leaves it), then the folder is resumed to the end. Returns
/// the records of `metrics.jsonl`.
fn one_step_then_resume<E: Experiment>(
    e: &E,
    config: &E::Config,
    dir: &Path,
    ctx: RunContext,
) -> Vec<MetricsLine> {
    let mut run = Run::create(dir, ctx.clone(), config).unwrap();
    run.interrupt_variant_at(0, 1);
    let error = e.run(config, &mut run).unwrap_err();
    assert!(
        format!("{error:#}").contains("interrupted after step 1"),
        "{error:#}"
    );
    drop(run);
    assert!(dir.join("variant-0/checkpoint.safetensors").is_file());
    assert!(!dir.join("run.json").exists());

    let Resumed::Continued(mut run) = Run::resume(dir, ctx, config).unwrap() else {
        panic!("the interrupted run did not continue");
    };
    let status = e.run(config, &mut run).unwrap();
    assert_eq!(status, RunStatus::Completed);
    run.finish(status).unwrap();
    RunRecord::read(dir)
        .unwrap()
        .metrics::<MetricsLine>()
        .unwrap()
}

/// Every variant in `names` trained two steps with finite losses and completed; variant 0
/// resumed at step 1.
fn assert_trained(lines: &[MetricsLine], names: &[String]) {
    for name in names {
        let of = |l: &&MetricsLine| &l.variant == name;
        let steps: Vec<(u64, f64)> = lines
            .iter()
            .filter(of)
            .filter_map(|l| match &l.record {
                Some(Record::Train { step, loss, .. }) => Some((*step, *loss)),
                _ => None,
            })
            .collect();
        assert_eq!(
            steps.iter().map(|s| s.0).collect::<Vec<_>>(),
            [1, 2],
            "{name}"
        );
        assert!(steps.iter().all(|s| s.1.is_finite()), "{name}: {steps:?}");
        let evals = lines
            .iter()
            .filter(of)
            .filter(|l| matches!(l.record, Some(Record::Eval { .. })));
        assert!(evals.count() >= 2, "{name}: an evaluation after each step");
        let summary = lines
            .iter()
            .filter(of)
            .find_map(|l| l.summary.as_ref())
            .unwrap();
        assert_eq!(summary.outcome, Outcome::Completed, "{name}");
        let resumed = if name == &names[0] { Some(1) } else { None };
        assert_eq!(summary.resumed_at, resumed, "{name}");
    }
}

/// Trains `config` as the module docs say, in a scratch folder holding the fixture data that
/// `write_data` writes, and checks that each of `names` trained and completed.
fn check<E: Experiment>(
    e: &E,
    seed: u64,
    config: &E::Config,
    names: &[String],
    write_data: impl FnOnce(&Path),
) {
    // Removed when the check ends, failing or not: each holds checkpoints of a full-width model.
    let root = kappa_testkit::Scratch::new(&format!("gpu-scale-{}", e.name()));
    let data = root.join("data");
    write_data(&data);
    let ctx = context(e.name(), seed, &data);
    let lines = one_step_then_resume(e, config, &root.join("run"), ctx);
    assert_trained(&lines, names);
}

#[test]
fn vit_fmnist_gpu_config_trains_checkpoints_and_resumes_on_the_cpu() {
    let mut config = VitFmnist.config(Scale::Gpu).unwrap();
    assert_eq!(
        (config.model.n_embd, config.model.n_head),
        (384, 6),
        "ViT-S"
    );
    config.model.n_layer = 1;
    two_short_steps(&mut config.train);
    config.validation = 20;
    let names: Vec<String> = config.variants.iter().map(|v| v.name.clone()).collect();
    check(&VitFmnist, 0, &config, &names, |data| {
        let dir = data.join("fashion-mnist");
        kappa_models::data::fixtures::write_fashion_mnist(&dir, 60, 20, 0).unwrap();
    });
}

#[test]
fn gpt_sotu_gpu_config_trains_checkpoints_and_resumes_on_the_cpu() {
    let mut config = GptSotu.config(Scale::Gpu).unwrap();
    assert_eq!(
        (config.model.n_embd, config.model.n_layer),
        (768, 12),
        "GPT-2 small"
    );
    config.model.n_layer = 1;
    two_short_steps(&mut config.train);
    config.final_eval_batches = 1;
    let names: Vec<String> = config.variants.iter().map(|v| v.name.clone()).collect();
    check(&GptSotu, 0, &config, &names, |data| {
        write_sotu_text(&data.join("sotu"))
    });
}

/// Seed 1, which runs the five presets (the ablations run on seed 0 only and differ from them
/// in numbers, not in code paths this check could miss).
#[test]
fn manifolds_gpu_config_trains_checkpoints_and_resumes_on_the_cpu() {
    let mut config = Manifolds.config(Scale::Gpu).unwrap();
    assert_eq!(
        (config.model.n_embd, config.model.n_layer),
        (768, 12),
        "GPT-2 small"
    );
    config.model.n_layer = 1;
    two_short_steps(&mut config.train);
    config.final_eval_batches = 1;
    for v in &mut config.variants {
        v.modulewise.manifold.dual.steps = 1;
    }
    let presets = config.variants.iter().filter(|v| !v.ablation);
    let names: Vec<String> = presets.map(|v| v.name.clone()).collect();
    assert_eq!(names.len(), 5);
    check(&Manifolds, 1, &config, &names, |data| {
        write_sotu_text(&data.join("sotu"))
    });
}

/// BERT-base sizes (12 × 768, 128 bytes); the pretraining of the baseline is the variant that is
/// killed after one step and resumed, and every fine-tuning starts from its pretraining's
/// checkpoint.
#[test]
fn bert_sentiment_gpu_config_pretrains_fine_tunes_and_resumes_on_the_cpu() {
    let mut config = BertSentiment.config(Scale::Gpu).unwrap();
    assert_eq!(
        (
            config.model.n_embd,
            config.model.n_layer,
            config.model.seq_len
        ),
        (768, 12, 128),
        "BERT-base"
    );
    config.model.n_layer = 1;
    two_short_steps(&mut config.pretrain);
    two_short_steps(&mut config.finetune);
    config.final_eval_batches = 1;
    config.sentences.validation = 4;
    config.sentences.test = 4;
    let names: Vec<String> = config
        .variants
        .iter()
        .flat_map(|v| [PRETRAINING.name(&v.name), FINE_TUNING.name(&v.name)])
        .collect();
    check(&BertSentiment, 0, &config, &names, |data| {
        write_sotu_text(&data.join("sotu"));
        kappa_models::data::fixtures::write_brown(&data.join("brown"), 20).unwrap();
        let reviews = data.join("movie-reviews");
        kappa_models::data::sequences::fixtures::write_movie_reviews(&reviews, 24, 0).unwrap();
    });
}

/// Every task at its gpu length (ListOps and Text 1024 tokens, Image 784 pixels, Pathfinder
/// 32×32) with every variant; the generated sets and the fixture data are cut to a few
/// examples (their lengths are the file's).
#[test]
fn lra_gpu_config_trains_checkpoints_and_resumes_on_the_cpu() {
    let mut config = Lra.config(Scale::Gpu).unwrap();
    assert_eq!(config.data.listops.max_length, 1024, "LRA-like length");
    config.model.n_layer = 1;
    two_short_steps(&mut config.train);
    let d = &mut config.data;
    (d.listops.train, d.listops.validation, d.listops.test) = (8, 4, 4);
    (
        d.pathfinder.train,
        d.pathfinder.validation,
        d.pathfinder.test,
    ) = (8, 4, 4);
    (d.text.validation, d.text.test) = (4, 4);
    d.image.validation = 20;
    d.test_limit = Some(4);
    let names: Vec<String> = config
        .tasks
        .iter()
        .flat_map(|&t| {
            config
                .variants()
                .into_iter()
                .map(move |v| LraConfig::variant_name(t, &v))
        })
        .collect();
    check(&Lra, 0, &config, &names, |data| {
        kappa_models::data::fixtures::write_fashion_mnist(&data.join("fashion-mnist"), 60, 20, 0)
            .unwrap();
        let reviews = data.join("movie-reviews");
        kappa_models::data::sequences::fixtures::write_movie_reviews(&reviews, 24, 0).unwrap();
    });
}

/// Both trained models at their gpu sizes (the ListOps Nyströmformer at length 2000, the masked
/// LM at BERT-base width), every reading × λ; the generated ListOps set is cut to a few
/// expressions.
#[test]
fn lambda_readings_gpu_config_trains_checkpoints_and_resumes_on_the_cpu() {
    let mut config = LambdaReadings.config(Scale::Gpu).unwrap();
    for spec in &mut config.models {
        match spec {
            ModelSpec::ListOps {
                model, data, train, ..
            } => {
                assert_eq!(model.seq_len, 2000, "LRA's ListOps length");
                model.n_layer = 1;
                (data.train, data.validation, data.test) = (8, 4, 4);
                two_short_steps(train);
            }
            ModelSpec::MaskedLm {
                model,
                train,
                final_eval_batches,
                ..
            } => {
                assert_eq!((model.n_embd, model.n_layer), (768, 12), "BERT-base");
                model.n_layer = 1;
                *final_eval_batches = 1;
                two_short_steps(train);
            }
        }
    }
    let names: Vec<String> = config
        .models
        .iter()
        .flat_map(|m| config.cells(m.name()).into_iter().map(|c| c.name))
        .collect();
    check(&LambdaReadings, 0, &config, &names, |data| {
        write_sotu_text(&data.join("sotu"));
        kappa_models::data::fixtures::write_brown(&data.join("brown"), 20).unwrap();
    });
}
