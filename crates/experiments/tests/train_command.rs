//! `train --config FILE`: a user's GPT trains on a plain-text file, resumes after an interrupt
//! to the same records as an uninterrupted run, and writes its report; a ViT trains on a PNG
//! image folder, and a ViT that does not fit the folder is an error naming the key before any
//! run folder is written; a bad key or value in the file is an error naming it; the example
//! configs in `examples/train/` parse.

use std::fs;
use std::path::{Path, PathBuf};

use kappa_cli::Set;
use kappa_experiments::train::{run_train_command, train_job, DataSpec, Existing, TrainJob};
use kappa_models::data::fixtures;
use kappa_models::Normalize;
use kappa_train::{MetricsLine, Record, Run, RunContext, RunRecord, RunStatus};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kappa-train-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// A job file next to a small text, as a user would write them.
fn job_file(dir: &Path) -> PathBuf {
    let text: String = (0..60)
        .map(|i| format!("The state of the union is strong in year {i}. "))
        .collect();
    fs::write(dir.join("input.txt"), text).unwrap();
    let config = include_str!("fixtures/tiny_gpt.toml");
    let path = dir.join("job.toml");
    fs::write(&path, config).unwrap();
    path
}

/// A job file next to an image folder (3 classes × 6 training and 2 test RGB images of 8×8).
fn folder_job_file(dir: &Path) -> PathBuf {
    fixtures::write_image_folder(&dir.join("images"), &["cat", "ant", "bee"], (6, 2), 8, 1)
        .unwrap();
    let config = r#"
name = "tiny-vit"

[data]
kind = "image_folder"
dir = "images"
validation = 3

[model]
kind = "vit"
image_size = 8
channels = 3
patch_size = 4
num_classes = 3
n_layer = 1
n_head = 2
n_embd = 16
mlp_ratio = 2
bias = false
scaling = "inv_sqrt_k"
correction = { kind = "svd", every = 1 }
fused_kernel = true

[train]
steps = 6
batch_size = 5
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
weight_decay = 0.05
beta1 = 0.9
beta2 = 0.95
eps = 1e-8
grad_clip = 1.0
eval_every = 3
eval_batches = 0
log_every = 1
checkpoint_every = 3
divergence_factor = 4.0
diagnostics = { enabled = true, samples = 2, jacobian_max_tokens = 5 }
"#;
    let path = dir.join("vit.toml");
    fs::write(&path, config).unwrap();
    path
}

fn context() -> RunContext {
    RunContext {
        seed: 1,
        threads: 1,
        ..RunContext::default()
    }
    .quiet()
}

/// The records without wall-clock fields and resume markers.
fn records(dir: &Path) -> Vec<MetricsLine> {
    let mut lines: Vec<MetricsLine> = RunRecord::read(dir).unwrap().metrics().unwrap();
    for line in &mut lines {
        if let Some(Record::Train {
            units_per_second,
            seconds,
            ..
        }) = &mut line.record
        {
            *units_per_second = 0.0;
            *seconds = 0.0;
        }
        if let Some(s) = &mut line.summary {
            (s.seconds_per_step, s.units_per_second, s.resumed_at) = (0.0, 0.0, None);
        }
    }
    lines
}

#[test]
fn a_job_trains_resumes_exactly_and_writes_its_report() {
    let dir = scratch("resume");
    let config = job_file(&dir);
    let straight =
        run_train_command(&config, &[], context(), &dir.join("a"), Existing::Refuse).unwrap();
    let report = fs::read_to_string(straight.join("report.md")).unwrap();
    assert!(report.contains("| step | val loss |"), "{report}");
    assert!(straight.join("loss.png").is_file() && straight.join("spectra.png").is_file());
    assert!(straight.join("variant-0/checkpoint.safetensors").is_file());

    // Interrupted after 3 of 6 steps (a stand-in for a kill), then `--resume`.
    let job = TrainJob::load(&config, &[]).unwrap();
    let out = dir.join("b");
    let ctx = RunContext {
        name: job.name.clone(),
        scale: "train".into(),
        data_dir: dir.clone(),
        ..context()
    };
    let mut run = Run::create(&out.join(&job.name), ctx, &job).unwrap();
    run.interrupt_variant_at(0, 3);
    let err = train_job(&job, &mut run).unwrap_err();
    assert!(
        format!("{err:#}").contains("interrupted after step 3"),
        "{err:#}"
    );
    run.finish(RunStatus::Failed {
        error: format!("{err:#}"),
    })
    .unwrap();
    let resumed = run_train_command(&config, &[], context(), &out, Existing::Resume).unwrap();
    assert_eq!(records(&resumed), records(&straight));
    assert_eq!(RunRecord::read(&resumed).unwrap().info.resumes, 1);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_vit_trains_on_an_image_folder_and_reports_its_test_accuracy() {
    let dir = scratch("folder");
    let config = folder_job_file(&dir);
    let job = TrainJob::load(&config, &[]).unwrap();
    assert!(matches!(
        job.data,
        DataSpec::ImageFolder {
            normalize: Normalize::TrainSplit,
            ..
        }
    ));
    let run =
        run_train_command(&config, &[], context(), &dir.join("runs"), Existing::Refuse).unwrap();
    assert_eq!(run, dir.join("runs/tiny-vit"));
    let report = fs::read_to_string(run.join("report.md")).unwrap();
    assert!(
        report.contains("| step | val loss | accuracy |"),
        "{report}"
    );
    assert!(report.contains("completed; test accuracy"), "{report}");
    assert!(run.join("loss.png").is_file() && run.join("spectra.png").is_file());
    assert!(run.join("variant-0/checkpoint.safetensors").is_file());
    let lines = records(&run);
    let evals: Vec<_> = lines
        .iter()
        .filter_map(|l| match &l.record {
            Some(Record::Eval { eval, heads, .. }) => Some((eval.accuracy, heads.len())),
            _ => None,
        })
        .collect();
    // Evaluations at steps 3 and 6, on the 3 validation images, with 2 heads diagnosed.
    assert_eq!(evals.len(), 2, "{evals:?}");
    assert!(
        evals.iter().all(|(a, h)| a.is_some() && *h == 2),
        "{evals:?}"
    );
    let summary = lines.iter().rev().find_map(|l| l.summary.as_ref()).unwrap();
    // The headline metric is the accuracy on the 6 test images: a multiple of 1/6.
    let sixths = summary.metric * 6.0;
    assert!((sixths - sixths.round()).abs() < 1e-9, "{}", summary.metric);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_vit_that_does_not_fit_the_image_folder_is_an_error_naming_the_key() {
    let dir = scratch("misfit");
    let config = folder_job_file(&dir);
    let set = |s: &str| vec![s.parse::<Set>().unwrap()];
    let out = dir.join("runs");
    for (setting, key) in [
        ("model.num_classes=10", "model.num_classes"),
        ("model.channels=1", "model.channels"),
        ("model.image_size=16", "model.image_size"),
    ] {
        let err = run_train_command(&config, &set(setting), context(), &out, Existing::Refuse)
            .unwrap_err();
        let message = format!("{err:#}");
        assert!(message.contains(key), "{message}");
        assert!(message.contains("ant, bee, cat"), "{message}");
        assert!(!out.join("tiny-vit").exists(), "no run folder for a misfit");
    }
    // A folder that is not there is an error naming it; so is an image folder for a GPT.
    let err = run_train_command(
        &config,
        &set("data.dir=nowhere"),
        context(),
        &out,
        Existing::Refuse,
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("nowhere"), "{err:#}");
    let text = fs::read_to_string(&config).unwrap();
    let idx = text.replace("kind = \"image_folder\"", "kind = \"idx\"\nnum_classes = 4");
    fs::write(&config, idx).unwrap();
    let err = TrainJob::load(&config, &[]).unwrap_err();
    assert!(format!("{err:#}").contains("model.num_classes"), "{err:#}");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_key_or_value_is_an_error_that_names_it() {
    let dir = scratch("bad");
    let config = job_file(&dir);
    let set = |s: &str| vec![s.parse::<Set>().unwrap()];
    let err = TrainJob::load(&config, &set("train.lrr=1")).unwrap_err();
    assert!(format!("{err:#}").contains("train.lrr"), "{err:#}");
    let err = TrainJob::load(&config, &set("train.lr=fast")).unwrap_err();
    assert!(format!("{err:#}").contains("train.lr"), "{err:#}");
    let err = TrainJob::load(&config, &set("model.kind=vit")).unwrap_err();
    assert!(format!("{err:#}").contains("model"), "{err:#}");
    // --set changes what is trained, and the run folder records the resolved value.
    let job = TrainJob::load(&config, &set("train.lr=1e-3")).unwrap();
    assert_eq!(job.train.lr, 1e-3);
    let text = fs::read_to_string(&config)
        .unwrap()
        .replace("fused_kernel = false\n", "");
    fs::write(&config, text).unwrap();
    let err = TrainJob::load(&config, &[]).unwrap_err();
    assert!(format!("{err:#}").contains("fused_kernel"), "{err:#}");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_example_configs_parse_and_validate() {
    let examples = kappa_testkit::crate_dir().join("../../examples/train");
    let mut n = 0;
    for entry in fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            TrainJob::load(&path, &[]).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 3, "an example per model kind and image data kind");
}

#[test]
fn the_binary_names_a_bad_key() {
    let dir = scratch("binary");
    let config = job_file(&dir);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kappa-experiments"))
        .args(["train", "--config"])
        .arg(&config)
        .args(["--set", "train.stepz=3", "--out"])
        .arg(dir.join("runs"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("train.stepz"), "{stderr}");
    fs::remove_dir_all(&dir).unwrap();
}

/// The text of the error of loading `config` with `sets`.
fn load_error(config: &Path, sets: &[&str]) -> String {
    let sets: Vec<Set> = sets.iter().map(|s| s.parse().unwrap()).collect();
    match TrainJob::load(config, &sets) {
        Ok(_) => panic!("{} with {sets:?} loaded", config.display()),
        Err(e) => format!("{e:#}"),
    }
}

/// The text of the error of loading the job of `config` with `sets` and then its data.
fn data_error(config: &Path, sets: &[&str]) -> String {
    let sets: Vec<Set> = sets.iter().map(|s| s.parse().unwrap()).collect();
    let job = TrainJob::load(config, &sets).unwrap();
    match kappa_experiments::train::JobData::load(&job, tch::Device::Cpu) {
        Ok(_) => panic!("the data of {} with {sets:?} loaded", config.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn a_size_whose_training_step_cannot_fit_in_memory_is_an_error_naming_the_keys() {
    let dir = scratch("sizes");
    let (gpt, vit) = (job_file(&dir), folder_job_file(&dir));
    let cases: [(&Path, &[&str], &str); 10] = [
        (&gpt, &["model.n_layer=1000000000"], "model.n_layer"),
        (&gpt, &["model.block_size=1000000000"], "model.block_size"),
        (&gpt, &["model.n_embd=1000000000"], "model.n_embd"),
        (
            &gpt,
            &["model.vocab_size=1000000000000"],
            "model.vocab_size",
        ),
        (&gpt, &["model.mlp_ratio=1000000000"], "model.mlp_ratio"),
        (&gpt, &["train.batch_size=1000000000"], "train.batch_size"),
        (
            &gpt,
            &["train.diagnostics.samples=1000000000"],
            "train.diagnostics.samples",
        ),
        (
            &gpt,
            &[
                "model.block_size=1000000",
                "train.diagnostics.jacobian_max_tokens=1000000",
            ],
            "train.diagnostics.jacobian_max_tokens",
        ),
        (&vit, &["model.image_size=1000000000"], "model.image_size"),
        (
            &vit,
            &["train.batch_size=1000000000000"],
            "train.batch_size",
        ),
    ];
    for (config, sets, key) in cases {
        let err = load_error(config, sets);
        assert!(
            err.contains(key) && err.contains("one training step of this"),
            "{err}"
        );
        assert!(err.contains("more than the"), "{err}");
    }
    // Sizes whose product overflows 128 bits are the same error.
    let huge = [
        "model.vocab_size=9223372036854775807",
        "model.n_embd=9223372036854775806",
    ];
    let err = load_error(&gpt, &huge);
    assert!(
        err.contains("more than 2^128 bytes") && err.contains("model.n_embd"),
        "{err}"
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn counts_beyond_the_validation_split_are_errors_naming_the_key_and_the_bound() {
    let dir = scratch("counts");
    let gpt = job_file(&dir);
    // 2 690 characters: 269 of validation, 253 windows of 16 tokens, ⌈253/4⌉ = 64 batches.
    let err = data_error(&gpt, &["train.eval_batches=1000000000"]);
    assert!(
        err.contains("`train.eval_batches` must be at most 64 (⌈253 validation windows"),
        "{err}"
    );
    let err = data_error(&gpt, &["train.diagnostics.samples=5000"]);
    assert!(
        err.contains("`train.diagnostics.samples` must be at most the 253 validation windows"),
        "{err}"
    );
    // 3 validation images, batches of 5.
    let vit = folder_job_file(&dir);
    let err = data_error(&vit, &["train.eval_batches=2"]);
    assert!(
        err.contains("`train.eval_batches` must be at most 1 "),
        "{err}"
    );
    let err = data_error(&vit, &["train.diagnostics.samples=4"]);
    assert!(
        err.contains("`train.diagnostics.samples` must be at most the 3"),
        "{err}"
    );
    let err = data_error(&vit, &["data.train_limit=2"]);
    assert!(
        err.contains("train.batch_size: must be at most the 2 images"),
        "{err}"
    );
    // A vocabulary smaller than the text's, and a training split shorter than one context.
    let err = data_error(&gpt, &["model.vocab_size=5"]);
    assert!(
        err.contains("model.vocab_size: is 5, smaller than the"),
        "{err}"
    );
    let err = data_error(&gpt, &["data.validation_fraction=0.995"]);
    assert!(
        err.contains("model.block_size: the training split has"),
        "{err}"
    );
    // Nothing was written: the checks come before the run folder.
    let out = dir.join("runs");
    let sets = ["train.eval_batches=1000000000".parse().unwrap()];
    assert!(run_train_command(&gpt, &sets, context(), &out, Existing::Refuse).is_err());
    assert!(!out.join("tiny-gpt").exists());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn out_of_range_and_mistyped_values_are_errors_naming_the_dotted_key() {
    let dir = scratch("ranges");
    let (gpt, vit) = (job_file(&dir), folder_job_file(&dir));
    for (config, set, expected) in [
        (
            &gpt,
            "train.lr=1e300",
            "train.lr` must be finite and lie in (0, 10]",
        ),
        (&gpt, "train.lr=nan", "train.lr` must be finite"),
        (
            &gpt,
            "train.weight_decay=1000",
            "train.weight_decay` must lie in [0, 1/lr)",
        ),
        (
            &gpt,
            "data.tokenizer=bpe",
            "data.tokenizer: unknown variant `bpe`",
        ),
        (
            &gpt,
            "data.validation_fraction=0",
            "data.validation_fraction: must lie in (0, 1)",
        ),
        (
            &gpt,
            "model.n_layer=-1",
            "model.n_layer: invalid value: integer `-1`",
        ),
        (
            &gpt,
            "model.correction.kind=bogus",
            "model.correction.kind: unknown variant",
        ),
        (
            &gpt,
            "model.correction.lambda=x",
            "model.correction.lambda: invalid type",
        ),
        (
            &vit,
            "data.train_limit=0",
            "data.train_limit: must be ≥ 1, found 0",
        ),
        (
            &vit,
            "data.validation=0",
            "data.validation: must be ≥ 1, found 0",
        ),
        (
            &vit,
            "model.num_classes=-3",
            "model.num_classes: invalid value: integer `-3`",
        ),
    ] {
        let err = load_error(config, &[set]);
        assert!(err.contains(expected), "--set {set}: {err}");
    }
    // An integer beyond 64 bits stops the TOML parser: its key, line and column are named.
    let text = fs::read_to_string(&gpt).unwrap();
    let big = text.replace("n_layer = 1\n", "n_layer = 99999999999999999999\n");
    let line = 1 + text.lines().position(|l| l == "n_layer = 1").unwrap();
    fs::write(&gpt, big).unwrap();
    let err = load_error(&gpt, &[]);
    assert!(
        err.contains(&format!(
            "not valid TOML: model.n_layer: number too large to fit in target type at \
             line {line}, column 11"
        )),
        "{err}"
    );
    // A module-wise optimizer's Muon lr has the same range as train.lr.
    let muon = "\n[optimizer]\nkind = \"modulewise\"\npreset = \"HETERO\"\nmuon_lr = 1e9\n";
    fs::write(&gpt, text.clone() + muon).unwrap();
    let err = load_error(&gpt, &[]);
    assert!(
        err.contains("optimizer.muon_lr: must be finite and lie in (0, 10]"),
        "{err}"
    );
    // "Every 0 steps" is no schedule: checkpointing only at the end is `steps`.
    fs::write(&gpt, text).unwrap();
    let err = load_error(&gpt, &["train.checkpoint_every=0"]);
    assert!(
        err.contains("`train.checkpoint_every` must be ≥ 1"),
        "{err}"
    );
    fs::remove_dir_all(&dir).unwrap();
}
