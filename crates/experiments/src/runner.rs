//! Running selected experiments into run folders and building `report.md` from them.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::registry::Resumption;
use crate::report::write_report;
use crate::run::{RunContext, RunRecord, RunStatus};
use crate::{registry, RegisteredExperiment, Scale};

/// The experiments named in `only` (all when empty), in registry order; unknown names are errors.
pub fn select(only: &[String]) -> Result<Vec<Box<dyn RegisteredExperiment>>> {
    let all = registry();
    let known: BTreeSet<&str> = all.iter().map(|e| e.name()).collect();
    for name in only {
        if !known.contains(name.as_str()) {
            bail!(
                "unknown experiment `{name}`; known: {}",
                known.into_iter().collect::<Vec<_>>().join(", ")
            );
        }
    }
    Ok(all
        .into_iter()
        .filter(|e| only.is_empty() || only.iter().any(|n| n == e.name()))
        .collect())
}

/// Where and how runs execute.
pub struct Settings<'a> {
    /// The scale of every run.
    pub scale: Scale,
    /// Seeds per experiment; `None` uses each experiment's default.
    pub seeds: Option<u32>,
    /// BLAS / libtorch threads.
    pub threads: usize,
    /// `cpu`, `cuda` or `cuda:N`.
    pub device: &'a str,
    /// The results folder.
    pub results: &'a Path,
    /// The data folder.
    pub data: &'a Path,
    /// Reuse existing run folders instead of replacing them: finished runs are skipped,
    /// interrupted or failed ones continue ([`crate::run::Run::resume`]).
    pub resume: bool,
}

/// Runs every selected experiment once per seed into `results/<name>/<scale>/seed-<n>/`,
/// replacing earlier runs of that experiment at that scale, or, with `resume`, reusing them:
/// completed and diverged runs are skipped, interrupted and failed runs continue, and a run
/// folder written with a different config stops the command with an error.
pub fn reproduce(
    experiments: &[Box<dyn RegisteredExperiment>],
    settings: &Settings<'_>,
) -> Result<()> {
    let Settings {
        scale,
        seeds,
        threads,
        device,
        results,
        data,
        resume,
    } = *settings;
    let total: u32 = experiments
        .iter()
        .map(|e| seeds.unwrap_or_else(|| e.default_seeds(scale)))
        .sum();
    let mut done = 0;
    let started = Instant::now();
    for e in experiments {
        let scale_dir = results.join(e.name()).join(scale.name());
        // A rerun replaces the experiment's previous runs at this scale, so the report never
        // mixes configs; a resumed one checks each folder's config instead.
        if !resume && scale_dir.exists() {
            fs::remove_dir_all(&scale_dir)
                .with_context(|| format!("emptying {}", scale_dir.display()))?;
        }
        for seed in 0..seeds.unwrap_or_else(|| e.default_seeds(scale)) {
            done += 1;
            eprintln!("[{done}/{total}] {} seed {seed} ({scale})", e.name());
            let context = RunContext {
                name: e.name().to_string(),
                scale: scale.name().to_string(),
                seed: u64::from(seed),
                threads,
                device: device.to_string(),
                data_dir: data.to_path_buf(),
                progress: true,
            };
            let dir = scale_dir.join(format!("seed-{seed}"));
            let (info, how) = if resume {
                match e.resume(&dir, context)? {
                    Resumption::Skipped(info) => (info, "kept from an earlier run"),
                    Resumption::Continued(info) => (info, "resumed"),
                    Resumption::Restarted(info) => (info, "rerun from the start"),
                    Resumption::Started(info) => (info, "started"),
                }
            } else {
                (e.execute(&dir, context)?, "started")
            };
            eprintln!(
                "      {} ({how}) in {:.1} s",
                describe(&info.status),
                info.wall_seconds
            );
        }
    }
    eprintln!(
        "reproduce: {total} run(s) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// How a run ended, in a few words.
fn describe(status: &RunStatus) -> String {
    match status {
        RunStatus::Completed => "completed".to_string(),
        RunStatus::Diverged { step, .. } => format!("diverged at step {step}"),
        RunStatus::Failed { error } => format!("FAILED: {error}"),
    }
}

/// Writes `results/report.md` for one scale from every experiment's run folders; fails (after
/// writing) when a run failed.
pub fn report(scale: Scale, results: &Path) -> Result<()> {
    let mut sections = Vec::new();
    let mut total_seconds = 0.0;
    let mut failures = Vec::new();
    for e in registry() {
        let scale_dir = results.join(e.name()).join(scale.name());
        let runs = RunRecord::read_all(&scale_dir)?;
        if runs.is_empty() {
            continue;
        }
        total_seconds += runs.iter().map(|r| r.info.wall_seconds).sum::<f64>();
        failures.extend(
            runs.iter()
                .filter(|r| matches!(r.info.status, RunStatus::Failed { .. }))
                .map(|r| r.dir.display().to_string()),
        );
        let section = e
            .report(&runs, &scale_dir, results)
            .with_context(|| format!("building the report section of {}", e.name()))?;
        sections.push(section);
    }
    if sections.is_empty() {
        bail!(
            "no run folders for scale `{scale}` under {}; run `cargo xtask reproduce --scale \
             {scale}` first",
            results.display()
        );
    }
    let path = results.join("report.md");
    write_report(&path, scale, &sections, total_seconds)?;
    eprintln!("report: wrote {}", path.display());
    if !failures.is_empty() {
        bail!(
            "{} run(s) failed (see run.json in each): {}",
            failures.len(),
            failures.join(", ")
        );
    }
    Ok(())
}
