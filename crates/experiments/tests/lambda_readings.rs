//! The `lambda-readings` experiment at smoke scale through the runner (`reproduce --only
//! lambda-readings`): every cell of every reading trains, each reading reaches the layers (the
//! λ they compute with, the score scale), and the report has the tables, the verdicts and the
//! computed answer. Bad settings are refused before any run.

use std::fs;

use kappa_experiments::runner::{report, reproduce, select, Settings};
use kappa_experiments::suite::lambda_readings::{cell_name, LambdaReadings};
use kappa_experiments::{Experiment, RunRecord, RunStatus, Scale};
use kappa_train::{MetricsLine, Record};

/// The mean λ the layers of `variant` reported at its first evaluation.
fn first_lambda(lines: &[MetricsLine], variant: &str) -> Option<f64> {
    lines
        .iter()
        .filter(|l| l.variant == variant)
        .find_map(|l| match &l.record {
            Some(Record::Eval { heads, .. }) if !heads.is_empty() => heads
                .iter()
                .map(|h| h.lambda)
                .sum::<Option<f64>>()
                .map(|s| s / heads.len() as f64),
            _ => None,
        })
}

#[test]
fn reproduce_only_lambda_readings_writes_the_reading_table() {
    let results = std::env::temp_dir().join(format!("kappa-readings-{}", std::process::id()));
    let _ = fs::remove_dir_all(&results);
    let data = results.join("data");
    kappa_models::data::fixtures::write_sotu(&data.join("sotu")).unwrap();
    kappa_models::data::fixtures::write_brown(&data.join("brown"), 20).unwrap();
    let experiments = select(&["lambda-readings".to_string()]).unwrap();
    let settings = Settings {
        scale: Scale::Smoke,
        seeds: Some(1),
        threads: 1,
        device: "cpu",
        results: &results,
        data: &data,
        resume: false,
        fresh: false,
        config: None,
        sets: &[],
        units: &[],
        stop: Default::default(),
        ranks: std::sync::Arc::new(kappa_dist::Single),
    };
    reproduce(&experiments, &settings).unwrap();
    report(Scale::Smoke, std::slice::from_ref(&results), &results, &[]).unwrap();

    let config = LambdaReadings.config(Scale::Smoke).unwrap();
    let runs = RunRecord::read_all(&results.join("lambda-readings").join("smoke")).unwrap();
    let lines: Vec<MetricsLine> = runs[0].metrics().unwrap();
    assert_eq!(runs[0].info.status, RunStatus::Completed);
    assert_eq!(config.models.len(), 2, "the classifier and the masked LM");
    for spec in &config.models {
        for cell in config.cells(spec.name()) {
            assert!(
                lines
                    .iter()
                    .any(|l| l.variant == cell.name && l.summary.is_some()),
                "no summary for {}",
                cell.name
            );
        }
    }
    let model = config.models[0].name();
    // Two score scales among the readings: two baselines, each trained once.
    let baselines = config
        .cells(model)
        .iter()
        .filter(|c| c.name.contains("baseline"))
        .count();
    assert_eq!(baselines, 2);
    // The absolute reading computes with λ itself; the relative one with λ·σ₀, σ₀ the
    // initial σ_max of N(0, 0.02²) 16×8 blocks, far below 1.
    let reading = |name: &str| config.readings.iter().find(|r| r.name == name).unwrap();
    let absolute = first_lambda(&lines, &cell_name(model, &config.readings[0], 10.0));
    assert_eq!(absolute, Some(10.0));
    let relative = first_lambda(&lines, &cell_name(model, reading("λ·σ_max(W₀)"), 10.0)).unwrap();
    assert!(relative > 0.0 && relative < 5.0, "{relative}");

    let text = fs::read_to_string(results.join("report.md")).unwrap();
    assert!(text.contains("## lambda-readings"), "{text}");
    assert!(
        text.contains("| reading | λ = 0 | λ = 1 | λ = 10 |"),
        "{text}"
    );
    assert!(
        text.contains(
            "| model | reading | λ the layers used | λ = 10 | Δ at λ = 10 | best λ (Δ) |"
        ),
        "{text}"
    );
    assert!(text.contains("**Answer.**"), "{text}");
    assert!(
        text.contains("crammed BERT (MLM)**: final held-out masked-byte accuracy"),
        "{text}"
    );
    for r in &config.readings {
        assert!(
            text.contains(&format!("| {} |", r.name)),
            "no row for {}",
            r.name
        );
    }
    // Readings that share a score scale share its baseline: every row has a λ = 0 cell.
    let accuracy = text.split("final test accuracy").nth(1).unwrap();
    for r in &config.readings {
        let head = format!("| {} |", r.name);
        let row = accuracy.lines().find(|l| l.starts_with(&head)).unwrap();
        assert!(!row.starts_with(&format!("{head} — |")), "{row}");
    }
    fs::remove_dir_all(&results).unwrap();
}

#[test]
fn bad_reading_settings_are_refused_before_any_run() {
    let mut c = LambdaReadings.config(Scale::Cpu).unwrap();
    c.paper_lambda = 7.0;
    let err = format!("{:#}", LambdaReadings.validate(&c).unwrap_err());
    assert!(
        err.contains("paper_lambda: must be one of lambdas"),
        "{err}"
    );
    let mut c = LambdaReadings.config(Scale::Cpu).unwrap();
    c.lambdas.push(0.0);
    let err = format!("{:#}", LambdaReadings.validate(&c).unwrap_err());
    assert!(err.contains("lambdas[") && err.contains("> 0"), "{err}");
    let mut c = LambdaReadings.config(Scale::Cpu).unwrap();
    c.collapse_saturated = 1.5;
    let err = format!("{:#}", LambdaReadings.validate(&c).unwrap_err());
    assert!(err.contains("collapse_saturated"), "{err}");
}
