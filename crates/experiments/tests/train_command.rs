//! `train --config FILE`: a user's GPT trains on a plain-text file, resumes after an interrupt
//! to the same records as an uninterrupted run, and writes its report; a bad key or value in the
//! file is an error naming it; the example configs in `examples/train/` parse.

use std::fs;
use std::path::{Path, PathBuf};

use kappa_cli::Set;
use kappa_experiments::train::{run_train_command, train_job, TrainJob};
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
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/train");
    let mut n = 0;
    for entry in fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            TrainJob::load(&path, &[]).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 2, "an example per model kind");
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
