//! Units of work: the plan lists one unit per (experiment, seed); running the units one at a
//! time, into two results folders even, and merging gives the report a plain `reproduce`
//! writes (timings aside); a missing unit is named in the report instead of failing it. A unit
//! on two ranks (threads) is the unit on one process.

use std::fs;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use kappa_cli::Set;
use kappa_dist::Threads;
use kappa_experiments::runner::{report, reproduce, resolve_configs, select, Settings};
use kappa_experiments::units::plan;
use kappa_experiments::Scale;

/// Experiments quick at smoke scale, one with trained variants and one without.
const EXPERIMENTS: [&str; 2] = ["theory", "gpt-sotu"];

fn settings<'a>(results: &'a Path, data: &'a Path, units: &'a [String]) -> Settings<'a> {
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
        sets: &[],
        units,
        stop: Default::default(),
        ranks: std::sync::Arc::new(kappa_dist::Single),
    }
}

/// A report with what measures time masked: the section markers' and header's seconds, and
/// every cell of a column whose header names a time (ms, s/step, seconds, wall s, per second).
fn without_timings(report: &str) -> String {
    let mut timed: Vec<usize> = Vec::new();
    let mut out = String::new();
    for line in report.lines() {
        let line = if line.starts_with("<!-- kappa:section ") {
            line.split(" seconds=").next().unwrap().to_string()
        } else if line.starts_with("Total wall time") {
            String::from("Total wall time")
        } else if line.starts_with('|') {
            let cells: Vec<&str> = line.split('|').collect();
            if !line.contains("---") && cells.iter().any(|c| is_timing(c)) {
                timed = (0..cells.len()).filter(|&i| is_timing(cells[i])).collect();
            }
            let masked: Vec<&str> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| if timed.contains(&i) { "t" } else { c })
                .collect();
            masked.join("|")
        } else {
            timed.clear();
            line.to_string()
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn is_timing(header: &str) -> bool {
    ["ms/", "s/step", "seconds", "per second", "/s)", "wall s"]
        .iter()
        .any(|k| header.contains(k))
}

fn scratch(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("kappa-units-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let data = root.join("data");
    kappa_models::data::fixtures::write_sotu(&data.join("sotu")).unwrap();
    root
}

#[test]
fn units_run_one_at_a_time_and_merged_give_the_plain_report() {
    let root = scratch("merge");
    let data = root.join("data");
    let experiments = select(&EXPERIMENTS.map(String::from)).unwrap();
    let plain = root.join("plain");
    reproduce(&experiments, &settings(&plain, &data, &[])).unwrap();
    report(Scale::Smoke, std::slice::from_ref(&plain), &plain, &[]).unwrap();

    let configs = resolve_configs(&experiments, &settings(&plain, &data, &[])).unwrap();
    let units = plan(&experiments, &configs, Scale::Smoke, Some(2), &plain).unwrap();
    let ids: Vec<&str> = units.iter().map(|u| u.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "theory/smoke/seed-0",
            "theory/smoke/seed-1",
            "gpt-sotu/smoke/seed-0",
            "gpt-sotu/smoke/seed-1"
        ]
    );
    assert!(units.iter().all(|u| u.measured_minutes.is_some()));

    // Each unit alone, alternately into two results folders (two machines), then merged.
    let (a, b) = (root.join("a"), root.join("b"));
    for (i, id) in ids.iter().enumerate() {
        let one = [id.to_string()];
        let folder = if i % 2 == 0 { &a } else { &b };
        reproduce(&experiments, &settings(folder, &data, &one)).unwrap();
    }
    let merged = root.join("merged");
    let expected: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    let coverage = report(Scale::Smoke, &[a.clone(), b.clone()], &merged, &expected).unwrap();
    assert!(coverage.missing.is_empty() && coverage.failed.is_empty());
    let read = |p: &Path| fs::read_to_string(p.join("report.md")).unwrap();
    let (merged_text, plain_text) = (
        without_timings(&read(&merged)),
        without_timings(&read(&plain)),
    );
    for (m, p) in merged_text.lines().zip(plain_text.lines()) {
        assert_eq!(m, p);
    }
    assert_eq!(merged_text, plain_text);

    // A unit that never ran is named, and the report is still written.
    fs::remove_dir_all(b.join("gpt-sotu/smoke/seed-1")).unwrap();
    let coverage = report(Scale::Smoke, &[a, b], &merged, &expected).unwrap();
    assert_eq!(coverage.missing, ["gpt-sotu/smoke/seed-1"]);
    assert!(read(&merged).contains("**Missing units**"));
    assert!(read(&merged).contains("gpt-sotu/smoke/seed-1"));
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_unit_not_in_the_plan_is_an_error_naming_the_plan() {
    let root = scratch("unknown");
    let data = root.join("data");
    let experiments = select(&["theory".to_string()]).unwrap();
    let one = ["theory/smoke/seed-7".to_string()];
    let err = reproduce(&experiments, &settings(&root.join("r"), &data, &one)).unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("--unit theory/smoke/seed-7 is not a unit of this plan")
            && text.contains("theory/smoke/seed-1"),
        "{text}"
    );
    assert!(!root.join("r/theory").exists(), "a unit ran");
    fs::remove_dir_all(&root).unwrap();
}

/// `metrics.jsonl` of `dir` without what measures time.
fn metrics_without_timings(dir: &Path) -> Vec<serde_json::Value> {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.retain(|k, _| !k.contains("second"));
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let text = fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let lines = text.lines().map(|l| serde_json::from_str(l).unwrap());
    lines
        .map(|mut v| {
            strip(&mut v);
            v
        })
        .collect()
}

#[test]
fn a_unit_on_two_ranks_is_the_unit_on_one_process_and_a_numerical_one_is_refused() {
    let root = scratch("ranks");
    let data = root.join("data");
    let unit = ["gpt-sotu/smoke/seed-0".to_string()];
    // Two parts of every batch on both: the sums run in the same order.
    let sets = ["train.micro_batch_size=2".parse::<Set>().unwrap()];
    let (one, two) = (root.join("one"), root.join("two"));
    let experiments = select(&["gpt-sotu".to_string()]).unwrap();
    let alone = Settings {
        sets: &sets,
        ..settings(&one, &data, &unit)
    };
    reproduce(&experiments, &alone).unwrap();
    let on_ranks = |experiments: &[&str], results: &Path, units: &[String], sets: &[Set]| {
        let names: Vec<String> = experiments.iter().map(|e| e.to_string()).collect();
        let experiments = select(&names).unwrap();
        Threads::run(2, |comm| {
            tch::set_num_threads(1);
            let s = Settings {
                sets,
                ranks: Arc::new(comm),
                ..settings(results, &data, units)
            };
            reproduce(&experiments, &s).map_err(|e| format!("{e:#}"))
        })
        .unwrap()
    };
    for (rank, result) in on_ranks(&["gpt-sotu"], &two, &unit, &sets)
        .into_iter()
        .enumerate()
    {
        assert_eq!(result, Ok(Vec::new()), "rank {rank}");
    }
    let run = |root: &Path| root.join(&unit[0]);
    assert_eq!(
        metrics_without_timings(&run(&one)),
        metrics_without_timings(&run(&two))
    );
    let checkpoint = |root: &Path| fs::read(run(root).join("variant-0/checkpoint.safetensors"));
    assert!(checkpoint(&one).unwrap() == checkpoint(&two).unwrap());

    let theory = ["theory/smoke/seed-0".to_string()];
    for result in on_ranks(&["theory"], &root.join("theory"), &theory, &[]) {
        let e = result.unwrap_err();
        assert!(
            e.contains("theory trains no model that ranks can share"),
            "{e}"
        );
    }
    for result in on_ranks(&["gpt-sotu"], &root.join("all"), &[], &[]) {
        let e = result.unwrap_err();
        assert!(e.contains("give --unit ID"), "{e}");
    }
    assert!(!root.join("theory").exists() && !root.join("all").exists());
    fs::remove_dir_all(&root).unwrap();
}
