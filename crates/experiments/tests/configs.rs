//! Configs as data, end to end: `reproduce --config FILE` and `--set KEY=VALUE` through the
//! `kappa-experiments` binary (the options xtask forwards) and through the runner. A bad key or
//! value stops the command before any run, naming the file and the key; a `--set` shows in
//! the run's `config.toml` and `--resume` compares the resolved config; a copy of a built-in
//! file runs with `--config` alone; `--publish` keeps the sections of experiments that did not
//! run.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use kappa_cli::Set;
use kappa_experiments::config::ConfigSource;
use kappa_experiments::runner::{reproduce, select, Settings};
use kappa_experiments::Scale;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kappa-configs-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// `kappa-experiments reproduce --scale smoke --seeds 1 --threads 1 ARGS` with every folder in
/// `root`; returns whether it succeeded and its stderr.
fn reproduce_bin(root: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kappa-experiments"))
        .current_dir(root)
        .args([
            "reproduce",
            "--scale",
            "smoke",
            "--seeds",
            "1",
            "--threads",
            "1",
        ])
        .args([
            "--results",
            "results",
            "--data",
            "data",
            "--docs",
            "docs/results",
        ])
        .args(args)
        .env("OPENBLAS_NUM_THREADS", "1")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn builtin_text(name: &str) -> String {
    ConfigSource::builtin(name, Scale::Smoke)
        .unwrap()
        .text()
        .to_string()
}

#[test]
fn a_misspelt_key_stops_the_command_before_any_run_and_is_named() {
    let root = scratch("key");
    let file = root.join("mine.toml");
    let text = builtin_text("optim-geometry");
    assert!(text.contains("\nsteps = 40\n"));
    fs::write(&file, text.replace("\nsteps = 40\n", "\nstepz = 40\n")).unwrap();
    let (ok, stderr) = reproduce_bin(&root, &["--config", "mine.toml"]);
    assert!(!ok);
    assert!(
        stderr.contains("error: mine.toml: unknown field stepz (expected one of `d_in`"),
        "{stderr}"
    );
    assert!(!root.join("results").exists(), "a run started");

    // The same through the runner.
    let settings = Settings {
        scale: Scale::Smoke,
        seeds: Some(1),
        threads: 1,
        device: "cpu",
        results: &root.join("results"),
        data: &root.join("data"),
        resume: false,
        fresh: false,
        config: Some(&file),
        sets: &[],
        units: &[],
        stop: Default::default(),
        ranks: std::sync::Arc::new(kappa_dist::Single),
    };
    let err = reproduce(&select(&["optim-geometry".into()]).unwrap(), &settings).unwrap_err();
    assert!(
        format!("{err:#}").contains("unknown field stepz"),
        "{err:#}"
    );
    assert!(!root.join("results").exists(), "a run started");
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn bad_values_and_unknown_set_keys_are_named() {
    let root = scratch("value");
    let only = ["--only", "vit-fmnist"];
    for (set, expected) in [
        (
            "train.lr=x",
            "error: experiments/vit-fmnist/smoke.toml: train.lr: invalid type: string \"x\", \
             expected f64",
        ),
        (
            "train.lrr=0.1",
            "error: experiments/vit-fmnist/smoke.toml: --set train.lrr=0.1: unknown field \
             train.lrr (expected one of `steps`",
        ),
        (
            "train.lr=-1",
            "error: experiments/vit-fmnist/smoke.toml: invalid config: `train.lr` must be \
             finite and lie in (0, 10], found -1.0",
        ),
        (
            "variants.1.correction.lambda=-2",
            "error: experiments/vit-fmnist/smoke.toml: invalid config: \
             `variants.1.correction.lambda` must be finite and ≥ 0, found -2",
        ),
        (
            "variants.9.name=x",
            "error: experiments/vit-fmnist/smoke.toml: --set variants.9.name=x: variants has 5 \
             entries",
        ),
    ] {
        let (ok, stderr) = reproduce_bin(&root, &[&only[..], &["--set", set]].concat());
        assert!(!ok, "{set}");
        assert!(stderr.contains(expected), "--set {set}:\n{stderr}");
    }
    assert!(!root.join("results").exists(), "a run started");
    fs::remove_dir_all(&root).unwrap();
}

/// The `[config]` table of a run folder's `config.toml`.
fn recorded(dir: &Path) -> toml::Table {
    let text = fs::read_to_string(dir.join("config.toml")).unwrap();
    let mut file: toml::Table = toml::from_str(&text).unwrap();
    match file.remove("config") {
        Some(toml::Value::Table(t)) => t,
        other => panic!("no [config] in config.toml: {other:?}"),
    }
}

#[test]
fn a_set_is_recorded_in_config_toml_and_resume_compares_the_resolved_config() {
    let root = scratch("set");
    let seed = root.join("results/optim-geometry/smoke/seed-0");
    let run = |extra: &[&str]| {
        let args = [&["--only", "optim-geometry", "--set", "steps=3"][..], extra].concat();
        reproduce_bin(&root, &args)
    };
    let (ok, stderr) = run(&["--set", "log_every=2"]);
    assert!(ok, "{stderr}");
    let config = recorded(&seed);
    assert_eq!(config["steps"], toml::Value::Integer(3));
    assert_eq!(config["log_every"], toml::Value::Integer(2));
    assert_eq!(
        config["d_in"],
        toml::Value::Integer(32),
        "the rest is the built-in file"
    );

    // The same settings resume (the finished run is kept); another value is refused.
    let (ok, stderr) = run(&["--set", "log_every=2", "--resume"]);
    assert!(
        ok && stderr.contains("kept from an earlier run"),
        "{stderr}"
    );
    let (ok, stderr) = run(&["--resume"]);
    assert!(
        !ok && stderr.contains("config.log_every: 2 → 1"),
        "{stderr}"
    );
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_copy_of_a_builtin_file_runs_with_config_alone() {
    let root = scratch("copy");
    fs::write(root.join("mine.toml"), builtin_text("random-spectra")).unwrap();
    let (ok, stderr) = reproduce_bin(&root, &["--config", "mine.toml"]);
    assert!(ok, "{stderr}");
    let config = recorded(&root.join("results/random-spectra/smoke/seed-0"));
    let builtin = ConfigSource::builtin("random-spectra", Scale::Smoke).unwrap();
    let experiments = select(&["random-spectra".into()]).unwrap();
    assert_eq!(
        &config,
        experiments[0].resolve(&builtin, &[]).unwrap().table()
    );
    let report = fs::read_to_string(root.join("results/report.md")).unwrap();
    assert!(report.contains("<!-- kappa:section random-spectra scale=smoke"));

    // `--only` must agree with the file's `experiment` key; without either, it is an error.
    let (ok, stderr) = reproduce_bin(&root, &["--config", "mine.toml", "--only", "theory"]);
    assert!(!ok);
    assert!(
        stderr.contains("--only theory but the config file says `experiment = \"random-spectra\"`"),
        "{stderr}"
    );
    let anonymous = builtin_text("random-spectra").replace("experiment = \"random-spectra\"", "");
    fs::write(root.join("anonymous.toml"), anonymous).unwrap();
    let (ok, stderr) = reproduce_bin(&root, &["--config", "anonymous.toml"]);
    assert!(
        !ok && stderr.contains("--config needs the experiment"),
        "{stderr}"
    );
    let (ok, stderr) = reproduce_bin(
        &root,
        &[
            "--config",
            "anonymous.toml",
            "--only",
            "random-spectra",
            "--fresh",
        ],
    );
    assert!(ok, "{stderr}");
    let (ok, stderr) = reproduce_bin(&root, &["--config", "missing.toml"]);
    assert!(!ok && stderr.contains("missing.toml: "), "{stderr}");
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn publish_replaces_the_sections_that_ran_and_keeps_the_others() {
    let root = scratch("publish");
    let (ok, stderr) = reproduce_bin(&root, &["--only", "random-spectra", "--publish"]);
    assert!(ok, "{stderr}");
    let docs = root.join("docs/results/smoke/report.md");
    let first = fs::read_to_string(&docs).unwrap();
    let plots: Vec<PathBuf> = fs::read_dir(root.join("docs/results/smoke/random-spectra/smoke"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!plots.is_empty(), "no plots published");

    // A later run of another experiment, in a fresh results folder, adds its section.
    fs::remove_dir_all(root.join("results")).unwrap();
    let (ok, stderr) = reproduce_bin(&root, &["--only", "optim-geometry", "--publish"]);
    assert!(ok, "{stderr}");
    let second = fs::read_to_string(&docs).unwrap();
    let section = |text: &str, name: &str| {
        let start = text
            .find(&format!("<!-- kappa:section {name} "))
            .unwrap_or_else(|| panic!("no section {name}"));
        let end = text.find(&format!("<!-- kappa:end {name} -->")).unwrap();
        text[start..end].to_string()
    };
    assert_eq!(
        section(&second, "random-spectra"),
        section(&first, "random-spectra")
    );
    assert!(section(&second, "optim-geometry").contains("## optim-geometry"));
    assert!(plots.iter().all(|p| p.is_file()), "a kept plot was removed");
    assert!(
        second.find("kappa:section random-spectra") < second.find("kappa:section optim-geometry"),
        "sections are in registry order"
    );
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn sets_apply_to_every_selected_experiment_and_must_fit_each() {
    let root = scratch("sets");
    let sets: Vec<Set> = vec!["train.steps=2".parse().unwrap()];
    let settings = Settings {
        scale: Scale::Smoke,
        seeds: Some(1),
        threads: 1,
        device: "cpu",
        results: &root.join("results"),
        data: &root.join("data"),
        resume: false,
        fresh: false,
        config: None,
        sets: &sets,
        units: &[],
        stop: Default::default(),
        ranks: std::sync::Arc::new(kappa_dist::Single),
    };
    // gpt-sotu has a [train] table, random-spectra does not.
    let both = select(&["random-spectra".into(), "gpt-sotu".into()]).unwrap();
    let err = reproduce(&both, &settings).unwrap_err();
    assert!(
        format!("{err:#}")
            .contains("experiments/random-spectra/smoke.toml: --set train.steps=2: no table train"),
        "{err:#}"
    );
    assert!(!root.join("results").exists(), "a run started");
    fs::remove_dir_all(&root).unwrap();
}
