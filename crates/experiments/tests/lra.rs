//! The `lra` experiment at smoke scale through the runner (`reproduce --only lra`) on fixture
//! data: every task trains every variant (baseline, the paper's λ, the sweep, the scale-aware
//! λ) with a test accuracy in its summary, the report has the summary table with the paper's
//! numbers, Retrieval marked as not run, a verdict per claim and a plot per task; one task
//! alone runs with `--set tasks=[…]`; bad settings are refused before any run, naming the key.

use std::fs;
use std::path::Path;

use kappa_cli::Set;
use kappa_experiments::config::ConfigSource;
use kappa_experiments::runner::{report, reproduce, select, Settings};
use kappa_experiments::suite::lra::{Config, Lra, LraTask};
use kappa_experiments::{Experiment, RunRecord, Scale};
use kappa_train::{MetricsLine, Outcome};

fn fixtures(data: &Path) {
    kappa_models::data::fixtures::write_fashion_mnist(&data.join("fashion-mnist"), 80, 30, 0)
        .unwrap();
    kappa_models::data::sequences::fixtures::write_movie_reviews(
        &data.join("movie-reviews"),
        60,
        0,
    )
    .unwrap();
}

fn settings<'a>(results: &'a Path, data: &'a Path, sets: &'a [Set]) -> Settings<'a> {
    Settings {
        scale: Scale::Smoke,
        seeds: Some(2),
        threads: 1,
        device: "cpu",
        results,
        data,
        resume: false,
        fresh: false,
        config: None,
        sets,
        units: &[],
        stop: Default::default(),
        ranks: std::sync::Arc::new(kappa_dist::Single),
    }
}

#[test]
fn reproduce_only_lra_trains_every_variant_of_every_task_and_reports_verdicts() {
    let results = std::env::temp_dir().join(format!("kappa-lra-{}", std::process::id()));
    let _ = fs::remove_dir_all(&results);
    let data = results.join("data");
    fixtures(&data);
    let experiments = select(&["lra".to_string()]).unwrap();
    reproduce(&experiments, &settings(&results, &data, &[])).unwrap();
    report(Scale::Smoke, std::slice::from_ref(&results), &results, &[]).unwrap();

    let config = Lra.config(Scale::Smoke).unwrap();
    let runs = RunRecord::read_all(&results.join("lra").join("smoke")).unwrap();
    assert_eq!(runs.len(), 2);
    for run in &runs {
        let lines: Vec<MetricsLine> = run.metrics().unwrap();
        for &task in &config.tasks {
            for v in config.variants() {
                let name = Config::variant_name(task, &v);
                let summary = lines
                    .iter()
                    .find_map(|l| (l.variant == name).then_some(l.summary.as_ref()).flatten())
                    .unwrap_or_else(|| panic!("no summary for {name}"));
                if summary.outcome == Outcome::Completed {
                    assert!((0.0..=1.0).contains(&summary.metric), "{name}: {summary:?}");
                }
            }
        }
    }

    let text = fs::read_to_string(results.join("report.md")).unwrap();
    assert!(text.contains("## lra"), "{text}");
    assert!(
        text.contains("| task | paper: baseline → λ=10 | baseline | λ=10 (paper) | best λ |"),
        "{text}"
    );
    assert!(
        text.contains("| Retrieval | 79.8 → 80.6 (+0.8) | not run (no data) |"),
        "{text}"
    );
    for (name, task) in [
        ("ListOps", LraTask::Listops),
        ("Text", LraTask::Text),
        ("Image", LraTask::Image),
        ("Pathfinder", LraTask::Pathfinder),
    ] {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("no summary row for {name}"));
        let verdicts = ["reproduced", "not reproduced", "inconclusive"];
        let cells = row.split(" | ").skip(6);
        for cell in cells {
            assert!(verdicts.iter().any(|v| cell.contains(v)), "{row}");
        }
        let png = format!("lra-{}-validation.png", task.name());
        assert!(text.contains(&png), "{text}");
        let bytes = fs::read(results.join("lra").join("smoke").join(&png)).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
    }
    assert!(text.contains("(best λ)"), "{text}");
    fs::remove_dir_all(&results).unwrap();
}

#[test]
fn one_task_runs_alone_with_a_set() {
    let results = std::env::temp_dir().join(format!("kappa-lra-one-{}", std::process::id()));
    let _ = fs::remove_dir_all(&results);
    let data = results.join("data");
    fixtures(&data);
    let sets: Vec<Set> = vec!["tasks=[\"listops\"]".parse().unwrap()];
    let experiments = select(&["lra".to_string()]).unwrap();
    let one = Settings {
        seeds: Some(1),
        ..settings(&results, &data, &sets)
    };
    reproduce(&experiments, &one).unwrap();
    let runs = RunRecord::read_all(&results.join("lra").join("smoke")).unwrap();
    let lines: Vec<MetricsLine> = runs[0].metrics().unwrap();
    assert!(lines.iter().all(|l| l.variant.starts_with("listops: ")));
    assert!(lines.iter().any(|l| l.summary.is_some()));
    fs::remove_dir_all(&results).unwrap();
}

#[test]
fn bad_settings_are_refused_naming_the_key() {
    let source = ConfigSource::builtin("lra", Scale::Smoke).unwrap();
    let refused = |set: &str, key: &str| {
        let sets: Vec<Set> = vec![set.parse().unwrap()];
        let err = Lra.load(&source, &sets).unwrap_err().to_string();
        assert!(err.contains(key), "--set {set}: {err}");
    };
    refused(
        "tasks=[\"text\", \"text\"]",
        "tasks.1: text is listed twice",
    );
    refused("tasks=[\"retrieval\"]", "tasks");
    refused("tasks=[]", "tasks: need at least one");
    refused("correction.sweep=[0.1, 10.0]", "correction.sweep.1");
    refused("correction.sweep=[-1.0]", "correction.sweep.0");
    refused("alpha=1.5", "alpha");
    refused("data.text.seq_len=30", "model.kernel.nystrom.landmarks");
    refused("data.listops.max_length=4", "data.listops.max_length");
    refused(
        "correction.scale_aware.target_kappa=1.0",
        "correction.scale_aware.target_kappa",
    );
}
