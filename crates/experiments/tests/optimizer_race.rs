//! The `optimizer-race` experiment at smoke scale through the runner (`reproduce --only
//! optimizer-race`): every entrant trains at every lr of the grid, the per-entrant settings
//! reach the runs (the AdamW grid scales `train.lr`, the QK-clip entrant clips), and the report
//! has the ranking table with its verdict columns, the grid and timing tables and the plots.

use std::fs;

use kappa_experiments::runner::{report, reproduce, select, Settings};
use kappa_experiments::suite::optimizer_race::{Config, OptimizerRace};
use kappa_experiments::{Experiment, RunRecord, Scale};
use kappa_train::{MetricsLine, Record};

#[test]
fn reproduce_only_optimizer_race_writes_the_ranking() {
    let results = std::env::temp_dir().join(format!("kappa-race-{}", std::process::id()));
    let _ = fs::remove_dir_all(&results);
    let data = results.join("data");
    kappa_models::data::fixtures::write_sotu(&data.join("sotu")).unwrap();
    let experiments = select(&["optimizer-race".to_string()]).unwrap();
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

    let config = OptimizerRace.config(Scale::Smoke).unwrap();
    let runs = RunRecord::read_all(&results.join("optimizer-race").join("smoke")).unwrap();
    assert_eq!(runs.len(), 2);
    let lines: Vec<MetricsLine> = runs[0].metrics().unwrap();
    // Every entrant at every grid value finished with a summary.
    for e in &config.entrants {
        for &f in &config.lr_factors {
            let name = Config::variant_name(e, f);
            assert!(
                lines
                    .iter()
                    .any(|l| l.variant == name && l.summary.is_some()),
                "no summary for {name}"
            );
        }
    }
    // The AdamW grid scales train.lr: the peak logged at ×2 is twice the config's.
    let adamw = &config.entrants[0];
    let peak = max_lr(&lines, &Config::variant_name(adamw, 2.0));
    assert!((peak - 2.0 * config.train.lr).abs() < 1e-12, "{peak}");
    // Only the QK-clip entrant's records carry QK-clip statistics.
    let clipped = |name: &str| {
        lines.iter().any(|l| {
            l.variant == name
                && matches!(
                    &l.record,
                    Some(Record::Train {
                        qk_clip: Some(_),
                        ..
                    })
                )
        })
    };
    let qk = config
        .entrants
        .iter()
        .find(|e| e.qk_clip.is_some())
        .unwrap();
    assert!(clipped(&Config::variant_name(qk, 1.0)));
    assert!(!clipped(&Config::variant_name(adamw, 1.0)));

    let text = fs::read_to_string(results.join("report.md")).unwrap();
    assert!(text.contains("## optimizer-race"), "{text}");
    assert!(
        text.contains("| rank | entrant | best lr | steps to target (mean ± std) | reached |"),
        "{text}"
    );
    assert!(text.contains("| vs AdamW | vs Muon NS5 |"), "{text}");
    for e in &config.entrants {
        assert!(
            text.contains(&format!(" | {} | ", e.name)),
            "no row for {}",
            e.name
        );
    }
    assert!(
        text.contains("| entrant | lr×0.5 | lr×1 | lr×2 |"),
        "{text}"
    );
    assert!(text.contains("hidden-matrix optimizer ms/step"), "{text}");
    assert!(text.contains("optimizer-race-val-loss.png"), "{text}");
    fs::remove_dir_all(&results).unwrap();
}

/// The largest learning rate in the training records of `variant`.
fn max_lr(lines: &[MetricsLine], variant: &str) -> f64 {
    lines
        .iter()
        .filter(|l| l.variant == variant)
        .filter_map(|l| match &l.record {
            Some(Record::Train { lr, .. }) => Some(*lr),
            _ => None,
        })
        .fold(f64::NEG_INFINITY, f64::max)
}

#[test]
fn bad_race_settings_are_refused_before_any_run() {
    let mut c = OptimizerRace.config(Scale::Cpu).unwrap();
    c.train.eval_every = c.train.steps / 10;
    let err = format!("{:#}", OptimizerRace.validate(&c).unwrap_err());
    assert!(err.contains("train.eval_every"), "{err}");
    let mut c = OptimizerRace.config(Scale::Cpu).unwrap();
    c.race.compare_with.push("SGD".into());
    let err = format!("{:#}", OptimizerRace.validate(&c).unwrap_err());
    assert!(
        err.contains("race.compare_with.2: no entrant is named \"SGD\""),
        "{err}"
    );
    let mut c = OptimizerRace.config(Scale::Cpu).unwrap();
    c.lr_factors.push(1.0);
    let err = format!("{:#}", OptimizerRace.validate(&c).unwrap_err());
    assert!(err.contains("lr_factors.3: 1 is listed twice"), "{err}");
}
