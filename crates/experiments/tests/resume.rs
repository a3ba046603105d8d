//! `reproduce --resume`: a run interrupted part way and resumed writes the same `metrics.jsonl`
//! records (losses bit for bit) as an uninterrupted run; a finished run is kept as it is; a
//! changed config is an error that names what changed.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use kappa_experiments::config::ConfigSource;
use kappa_experiments::registry::{ResolvedConfig, Resumption};
use kappa_experiments::run::{Resumed, Run, RunContext, RunRecord, RunStatus};
use kappa_experiments::suite::random_spectra::RandomSpectra;
use kappa_experiments::suite::vit_fmnist::VitFmnist;
use kappa_experiments::{Experiment, RegisteredExperiment, Scale};
use kappa_train::{MetricsLine, Record, RunError};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kappa-resume-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn context(data: &Path) -> RunContext {
    RunContext {
        name: "vit-fmnist".into(),
        scale: Scale::Smoke.name().into(),
        seed: 0,
        threads: 1,
        device: "cpu".into(),
        data_dir: data.to_path_buf(),
        progress: false,
        stop: Default::default(),
    }
}

/// The built-in smoke config of `experiment`, as the runner hands it to the registry.
fn smoke_config(experiment: &dyn RegisteredExperiment) -> ResolvedConfig {
    let source = ConfigSource::builtin(experiment.name(), Scale::Smoke).unwrap();
    experiment.resolve(&source, &[]).unwrap()
}

/// The records of a run folder with the wall-clock fields zeroed (they differ between any two
/// runs) and the resume marker removed; everything else, losses included, must match exactly.
fn records_without_timings(dir: &Path) -> Vec<MetricsLine> {
    let run = RunRecord::read(dir).unwrap();
    run.metrics::<MetricsLine>()
        .unwrap()
        .into_iter()
        .map(|mut line| {
            if let Some(Record::Train {
                units_per_second,
                seconds,
                ..
            }) = &mut line.record
            {
                *units_per_second = 0.0;
                *seconds = 0.0;
            }
            if let Some(summary) = &mut line.summary {
                summary.seconds_per_step = 0.0;
                summary.units_per_second = 0.0;
                summary.resumed_at = None;
            }
            line
        })
        .collect()
}

/// What a killed process leaves behind beyond a checkpoint: a record logged after it and a
/// half-written line.
fn append_orphan_and_torn_lines(metrics: &Path, variant: &str, step: u64) {
    let orphan = MetricsLine {
        variant: variant.into(),
        record: Some(Record::Train {
            step,
            loss: 123.0,
            lr: 0.0,
            grad_norm: 0.0,
            units_per_second: 0.0,
            seconds: 0.0,
            optimizers: Default::default(),
            qk_clip: None,
        }),
        summary: None,
    };
    let mut file = fs::OpenOptions::new().append(true).open(metrics).unwrap();
    writeln!(file, "{}", serde_json::to_string(&orphan).unwrap()).unwrap();
    write!(file, "{{\"variant\":\"{variant}\",\"rec").unwrap();
}

#[test]
fn an_interrupted_run_resumes_to_the_records_of_an_uninterrupted_one() {
    let root = scratch("exact");
    let data = root.join("data");
    kappa_models::data::fixtures::write_fashion_mnist(&data.join("fashion-mnist"), 80, 30, 0)
        .unwrap();
    let experiment = VitFmnist;
    let config = Experiment::config(&experiment, Scale::Smoke).unwrap();
    assert!(config.variants.len() >= 3 && config.train.steps == 4);
    let resolved = smoke_config(&experiment);

    let whole = root.join("whole");
    let info = experiment
        .execute(&whole, context(&data), &resolved)
        .unwrap();
    assert_eq!(info.status, RunStatus::Completed);

    // Variant 0 finishes, variant 1 stops after 3 of its 4 steps (checkpoint written), and the
    // process "dies": no run.json, an orphan record past the checkpoint, a torn last line.
    let dir = root.join("interrupted");
    let mut run = Run::create(&dir, context(&data), &config).unwrap();
    run.interrupt_variant_at(1, 3);
    let error = Experiment::run(&experiment, &config, &mut run).unwrap_err();
    assert!(
        format!("{error:#}").contains("interrupted after step 3"),
        "{error:#}"
    );
    drop(run);
    assert!(!dir.join("run.json").exists());
    assert!(dir.join("variant-1/checkpoint.safetensors").is_file());
    assert!(!dir.join("variant-2").exists());
    append_orphan_and_torn_lines(&dir.join("metrics.jsonl"), &config.variants[1].name, 4);

    let resumed = experiment.resume(&dir, context(&data), &resolved).unwrap();
    let Resumption::Continued(info) = &resumed else {
        panic!("expected a continued run, got {resumed:?}");
    };
    assert_eq!(info.status, RunStatus::Completed);
    assert_eq!(info.resumes, 1);

    // Exact, within this process: both runs are made here with one thread and the same
    // libtorch (GEMM, SVD of the diagnostics), so the same operations in the same order give
    // the same bits. On another machine (MKL vs OpenBLAS) the losses could differ in the last
    // bits, so this test never compares records made by different processes.
    let expected = records_without_timings(&whole);
    let got = records_without_timings(&dir);
    assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "record {i} differs");
    }
    // Only the interrupted variant says where it resumed; variant 0 was not retrained.
    let summaries: Vec<_> = RunRecord::read(&dir)
        .unwrap()
        .metrics::<MetricsLine>()
        .unwrap()
        .into_iter()
        .filter_map(|l| l.summary)
        .collect();
    assert_eq!(summaries.len(), config.variants.len());
    assert_eq!(summaries[0].resumed_at, None);
    assert_eq!(summaries[1].resumed_at, Some(3));
    assert_eq!(summaries[2].resumed_at, None);

    // A finished run is kept as it is.
    let before = fs::read(dir.join("metrics.jsonl")).unwrap();
    let again = experiment.resume(&dir, context(&data), &resolved).unwrap();
    assert!(matches!(again, Resumption::Skipped(_)), "{again:?}");
    assert_eq!(fs::read(dir.join("metrics.jsonl")).unwrap(), before);
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_changed_config_is_an_error_that_names_the_change() {
    let root = scratch("config");
    let dir = root.join("seed-0");
    let config = Experiment::config(&VitFmnist, Scale::Smoke).unwrap();
    let run = Run::create(&dir, context(&root), &config).unwrap();
    run.finish(RunStatus::Failed {
        error: "stopped".into(),
    })
    .unwrap();

    let mut changed = config.clone();
    changed.train.steps += 1;
    let mut threads = context(&root);
    threads.threads = 2;
    for (ctx, cfg, key) in [
        (context(&root), &changed, "config.train.steps: 4 → 5"),
        (threads, &config, "run.threads: 1 → 2"),
    ] {
        let Err(error) = Run::resume(&dir, ctx, cfg) else {
            panic!("a changed config resumed");
        };
        match &error {
            RunError::ConfigChanged { differences, .. } => {
                assert_eq!(differences, &vec![key.to_string()]);
            }
            other => panic!("expected ConfigChanged, got {other:?} ({error})"),
        }
        assert!(format!("{error}").contains("with --fresh"), "{error}");
    }
    // The same config continues the failed run.
    assert!(matches!(
        Run::resume(&dir, context(&root), &config).unwrap(),
        Resumed::Continued(_)
    ));
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn an_experiment_that_cannot_continue_a_run_reruns_it_from_the_start() {
    let root = scratch("restart");
    let dir = root.join("seed-0");
    let context = RunContext {
        name: "random-spectra".into(),
        ..context(&root)
    };
    let config = smoke_config(&RandomSpectra);
    RandomSpectra
        .execute(&dir, context.clone(), &config)
        .unwrap();
    let lines = |dir: &Path| fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let complete = lines(&dir);
    assert!(!complete.is_empty());
    // Killed after it had logged everything: no run.json.
    fs::remove_file(dir.join("run.json")).unwrap();
    let resumed = RandomSpectra.resume(&dir, context, &config).unwrap();
    assert!(matches!(resumed, Resumption::Restarted(_)), "{resumed:?}");
    assert_eq!(resumed.info().status, RunStatus::Completed);
    assert_eq!(lines(&dir).lines().count(), complete.lines().count());
    // run.json records the BLAS kernels the process ran: OpenBLAS's, then libtorch's MKL path.
    let blas = &resumed.info().blas;
    assert!(
        blas.starts_with(&kappa_linalg::blas_report().to_string()),
        "{blas}"
    );
    assert!(blas.contains("CPU level"), "{blas}");
    #[cfg(target_os = "linux")]
    assert!(blas.contains("libtorch MKL"), "{blas}");
    fs::remove_dir_all(&root).unwrap();
}
