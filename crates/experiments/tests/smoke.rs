//! Every experiment runs at `--scale smoke` and the report is generated with a table and a PNG.

use std::fs;

use kappa_experiments::runner::{report, reproduce, select, Settings};
use kappa_experiments::Scale;

#[test]
fn every_experiment_runs_at_smoke_scale_and_the_report_has_tables_and_plots() {
    let results = std::env::temp_dir().join(format!("kappa-smoke-{}", std::process::id()));
    let _ = fs::remove_dir_all(&results);
    let experiments = select(&[]).unwrap();
    // Tiny fixture data in the real on-disk formats, so no experiment needs installed data.
    let data = results.join("data");
    kappa_models::data::fixtures::write_fashion_mnist(&data.join("fashion-mnist"), 80, 30, 0)
        .unwrap();
    kappa_models::data::fixtures::write_sotu(&data.join("sotu")).unwrap();
    kappa_models::data::fixtures::write_brown(&data.join("brown"), 20).unwrap();
    kappa_models::data::sequences::fixtures::write_movie_reviews(
        &data.join("movie-reviews"),
        60,
        0,
    )
    .unwrap();
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
        sets: &[],
        units: &[],
        stop: Default::default(),
        ranks: std::sync::Arc::new(kappa_dist::Single),
    };
    reproduce(&experiments, &settings).unwrap();
    report(Scale::Smoke, std::slice::from_ref(&results), &results, &[]).unwrap();

    // `--resume` over finished runs keeps every run folder as it is.
    let metrics = results.join("vit-fmnist/smoke/seed-1/metrics.jsonl");
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
    report(Scale::Smoke, std::slice::from_ref(&results), &results, &[]).unwrap();

    let text = fs::read_to_string(results.join("report.md")).unwrap();
    for e in &experiments {
        assert!(
            text.contains(&format!("## {}", e.name())),
            "no section for {}",
            e.name()
        );
    }
    assert!(text.contains("|---|"), "the report has no table");
    let images: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("![").and_then(|r| r.split_once("](")))
        .map(|(_, path)| path.trim_end_matches(')'))
        .collect();
    assert!(!images.is_empty(), "the report embeds no plot");
    for image in images {
        let bytes = fs::read(results.join(image)).unwrap();
        assert_eq!(&bytes[1..4], b"PNG", "{image} is not a PNG");
    }
    fs::remove_dir_all(&results).unwrap();
}

#[test]
fn unknown_experiments_are_named_in_the_error() {
    let err = select(&["no-such-thing".to_string()])
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("no-such-thing") && err.contains("random-spectra"),
        "{err}"
    );
}
