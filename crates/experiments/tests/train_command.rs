//! `train --config FILE`: a user's GPT trains on a plain-text file, resumes after an interrupt
//! to the same records as an uninterrupted run, and writes its report; a ViT trains on a PNG
//! image folder, and a ViT that does not fit the folder is an error naming the key before any
//! run folder is written; a bad key or value in the file is an error naming it; the example
//! configs in `examples/train/` parse.

use std::fs;
use std::path::{Path, PathBuf};

use kappa_cli::Set;
use kappa_experiments::train::{run_train_command, train_job, DataSpec, TrainJob};
use kappa_models::data::fixtures;
use kappa_models::Normalize;
use kappa_train::{Line, Record, Run, RunContext, RunRecord, RunStatus};

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
    let config = r#"
name = "tiny-gpt"

[data]
kind = "text"
path = "input.txt"
tokenizer = "char"

[model]
kind = "gpt"
vocab_size = 0
block_size = 16
n_layer = 1
n_head = 2
n_embd = 16
mlp_ratio = 4
bias = true
scaling = "inv_sqrt_k"
conditioning = { kind = "identity", lambda = 1.0, layout = "shifted" }
fused_kernel = false

[train]
steps = 6
batch_size = 4
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
eps = 1e-8
grad_clip = 1.0
eval_every = 2
eval_batches = 2
log_every = 1
checkpoint_every = 2
divergence_factor = 4.0
diagnostics = { enabled = true, samples = 2, jacobian_max_tokens = 8 }
"#;
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
conditioning = { kind = "svd", every = 1 }
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
fn records(dir: &Path) -> Vec<Line> {
    let mut lines: Vec<Line> = RunRecord::read(dir).unwrap().metrics().unwrap();
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
    let straight = run_train_command(&config, &[], context(), &dir.join("a"), false).unwrap();
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
    let resumed = run_train_command(&config, &[], context(), &out, true).unwrap();
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
    let run = run_train_command(&config, &[], context(), &dir.join("runs"), false).unwrap();
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
        let err = run_train_command(&config, &set(setting), context(), &out, false).unwrap_err();
        let message = format!("{err:#}");
        assert!(message.contains(key), "{message}");
        assert!(message.contains("ant, bee, cat"), "{message}");
        assert!(!out.join("tiny-vit").exists(), "no run folder for a misfit");
    }
    // A folder that is not there is an error naming it; so is an image folder for a GPT.
    let err =
        run_train_command(&config, &set("data.dir=nowhere"), context(), &out, false).unwrap_err();
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
