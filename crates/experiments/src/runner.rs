//! Running selected experiments into run folders and building `report.md` from them.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kappa_cli::Set;

use crate::config::ConfigSource;
use crate::registry::{ResolvedConfig, Resumption};
use crate::report::{Part, Report};
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
    /// A config file to run instead of the built-in one (`--config`); only for a single
    /// experiment.
    pub config: Option<&'a Path>,
    /// `--set KEY=VALUE` changes, applied to every selected experiment's config.
    pub sets: &'a [Set],
}

/// Reads and checks the config of every selected experiment — the built-in file of the scale,
/// or `settings.config` — with `settings.sets` applied, before anything runs: a bad key or
/// value anywhere stops the command here, naming the file and the key.
pub fn resolve_configs(
    experiments: &[Box<dyn RegisteredExperiment>],
    settings: &Settings<'_>,
) -> Result<Vec<ResolvedConfig>> {
    if settings.config.is_some() && experiments.len() != 1 {
        bail!(
            "--config configures one experiment, but {} are selected",
            experiments.len()
        );
    }
    experiments
        .iter()
        .map(|e| {
            let source = match settings.config {
                Some(path) => ConfigSource::file(path)?,
                None => ConfigSource::builtin(e.name(), settings.scale)?,
            };
            Ok(e.resolve(&source, settings.sets)?)
        })
        .collect()
}

/// Runs every selected experiment once per seed into `results/<name>/<scale>/seed-<n>/`,
/// replacing earlier runs of that experiment at that scale, or, with `resume`, reusing them:
/// completed and diverged runs are skipped, interrupted and failed runs continue, and a run
/// folder written with a different config stops the command with an error. Every config is
/// resolved first ([`resolve_configs`]), so a bad one stops the command before any run.
pub fn reproduce(
    experiments: &[Box<dyn RegisteredExperiment>],
    settings: &Settings<'_>,
) -> Result<()> {
    let configs = resolve_configs(experiments, settings)?;
    let Settings {
        scale,
        seeds,
        threads,
        device,
        results,
        data,
        resume,
        ..
    } = *settings;
    let total: u32 = experiments
        .iter()
        .map(|e| seeds.unwrap_or_else(|| e.default_seeds(scale)))
        .sum();
    let mut done = 0;
    let started = Instant::now();
    for (e, config) in experiments.iter().zip(&configs) {
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
                match e.resume(&dir, context, config)? {
                    Resumption::Skipped(info) => (info, "kept from an earlier run"),
                    Resumption::Continued(info) => (info, "resumed"),
                    Resumption::Restarted(info) => (info, "rerun from the start"),
                    Resumption::Started(info) => (info, "started"),
                }
            } else {
                (e.execute(&dir, context, config)?, "started")
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
    let mut parts = Vec::new();
    let mut failures = Vec::new();
    for e in registry() {
        let scale_dir = results.join(e.name()).join(scale.name());
        let runs = RunRecord::read_all(&scale_dir)?;
        if runs.is_empty() {
            continue;
        }
        failures.extend(
            runs.iter()
                .filter(|r| matches!(r.info.status, RunStatus::Failed { .. }))
                .map(|r| r.dir.display().to_string()),
        );
        let section = e
            .report(&runs, &scale_dir, results)
            .with_context(|| format!("building the report section of {}", e.name()))?;
        parts.push(Part {
            name: e.name().to_string(),
            scale,
            seconds: runs.iter().map(|r| r.info.wall_seconds).sum(),
            markdown: section.to_markdown(),
        });
    }
    if parts.is_empty() {
        bail!(
            "no run folders for scale `{scale}` under {}; run `cargo xtask reproduce --scale \
             {scale}` first",
            results.display()
        );
    }
    let path = results.join("report.md");
    fs::write(&path, Report { parts }.render())
        .with_context(|| format!("writing {}", path.display()))?;
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
