//! The run folders a section is made from: the table of runs, the completed ones, their records.

use anyhow::Result;
use serde::de::DeserializeOwned;

use super::section::Section;
use crate::run::{RunRecord, RunStatus};

/// A section titled `title` that opens with the paper claim and the [table of runs](runs_table).
pub fn opened(title: &str, claim: &str, runs: &[RunRecord]) -> Section {
    let mut section = Section::new(title);
    section.paragraph(claim);
    runs_table(&mut section, runs);
    section
}

/// One line per run: seed, status, wall time, threads, device, and the CPUs and sources that
/// computed it ([`RunInfo::hosts`](kappa_train::RunInfo::hosts)), so a report says what it was
/// made from and where.
pub fn runs_table(section: &mut Section, runs: &[RunRecord]) {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let hosts = &r.info.hosts;
            vec![
                r.info.run.seed.to_string(),
                status(&r.info.status),
                format!("{:.1}", r.info.wall_seconds),
                r.info.run.threads.to_string(),
                r.info.run.device.clone(),
                distinct(hosts.iter().map(|h| h.cpu.as_str())),
                distinct(hosts.iter().map(|h| h.source.as_str())),
            ]
        })
        .collect();
    let header = [
        "seed", "status", "wall s", "threads", "device", "CPU", "source",
    ];
    section.table(&header, &rows);
}

/// The distinct non-empty values in order of first appearance, joined by "; "; "not recorded"
/// when there are none.
fn distinct<'a>(values: impl Iterator<Item = &'a str>) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for v in values.filter(|v| !v.is_empty()) {
        if !seen.contains(&v) {
            seen.push(v);
        }
    }
    match seen.is_empty() {
        true => "not recorded".to_string(),
        false => seen.join("; "),
    }
}

/// How a run ended, on one line.
fn status(status: &RunStatus) -> String {
    match status {
        RunStatus::Completed => "completed".to_string(),
        RunStatus::Diverged { step, reason } => format!("diverged at step {step} ({reason})"),
        RunStatus::Failed { error } => format!("failed: {}", error.replace('\n', " ")),
    }
}

/// The runs that completed, in order (a diverged or failed run of a one-shot experiment has no
/// full set of records).
pub fn completed(runs: &[RunRecord]) -> Vec<&RunRecord> {
    runs.iter()
        .filter(|r| r.info.status == RunStatus::Completed)
        .collect()
}

/// Every record of the `metrics.jsonl` of `runs`, in run order.
pub fn records<R: DeserializeOwned>(runs: &[&RunRecord]) -> Result<Vec<R>> {
    let mut all = Vec::new();
    for run in runs {
        all.extend(run.metrics::<R>()?);
    }
    Ok(all)
}

/// [`records`], each with the seed of its run.
pub fn seeded_records<R: DeserializeOwned>(runs: &[&RunRecord]) -> Result<Vec<(u64, R)>> {
    let mut all = Vec::new();
    for run in runs {
        let seed = run.info.run.seed;
        all.extend(run.metrics::<R>()?.into_iter().map(|r| (seed, r)));
    }
    Ok(all)
}
