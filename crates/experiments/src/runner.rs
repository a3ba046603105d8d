//! Running selected experiments into run folders and building `report.md` from them.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kappa_cli::Set;
use kappa_dist::Communicator;

use crate::config::ConfigSource;
use crate::registry::{ResolvedConfig, Resumption};
use crate::report::document::OPEN;
use crate::report::{Part, Report};
use crate::run::{RunContext, RunInfo, RunRecord, RunStatus};
use crate::units::{pick, plan, unit_id, Unit};
use crate::{registry, RegisteredExperiment, Scale};
use kappa_train::{folder, StopFlag};

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

/// The experiments a command at `scale` covers: those named in `only`, else every experiment
/// with a built-in config at that scale (all of them, except at `long`).
pub fn select_at(only: &[String], scale: Scale) -> Result<Vec<Box<dyn RegisteredExperiment>>> {
    let mut chosen = select(only)?;
    if only.is_empty() {
        chosen.retain(|e| crate::config::has_builtin(e.name(), scale));
    }
    Ok(chosen)
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
    /// Start over where earlier run folders exist (`--fresh`): their own files are deleted
    /// first ([`kappa_train::folder::remove_own_files`]); anything else is kept. Without
    /// `resume` or `fresh`, an earlier run folder of a selected experiment at this scale is an
    /// error that changes nothing.
    pub fresh: bool,
    /// A config file to run instead of the built-in one (`--config`); only for a single
    /// experiment.
    pub config: Option<&'a Path>,
    /// `--set KEY=VALUE` changes, applied to every selected experiment's config.
    pub sets: &'a [Set],
    /// Run only these units (`--unit ID`; all when empty). A unit run reuses its folder as
    /// `resume` does and never touches another unit's.
    pub units: &'a [String],
    /// Raised (SIGTERM, SIGUSR1) to stop: the running unit checkpoints at its next step, no
    /// further unit starts, and [`reproduce`] returns [`Preempted`] (on every rank, when the
    /// flag of one is raised).
    pub stop: StopFlag,
    /// The ranks that run each unit together, one model trained data-parallel
    /// ([`RegisteredExperiment::resume_on_ranks`]; `reproduce --unit` under `mpirun` or
    /// `srun`), or [`kappa_dist::Single`]. On several ranks only the units of `units` run, each
    /// of an experiment that trains data-parallel ([`crate::Experiment::data_parallel`]), and
    /// rank 0 alone writes and prints.
    pub ranks: Arc<dyn Communicator>,
}

/// `reproduce` stopped because its [`StopFlag`] was raised: the units it names were left
/// unfinished (interrupted with a checkpoint, or not started) and continue when rerun with
/// `--resume` or `--unit`. The binary exits with [`Preempted::EXIT_CODE`] then.
#[derive(Debug, thiserror::Error)]
#[error("stopped on request (Ctrl-C, SIGTERM or SIGUSR1); unfinished: {}; --resume (or --unit) continues them", unfinished.join(", "))]
pub struct Preempted {
    /// The ids of the units that did not finish.
    pub unfinished: Vec<String>,
}

impl Preempted {
    /// The exit status of a stopped run: `EX_TEMPFAIL` of sysexits.h, "try again later" (the
    /// Slurm script requeues the unit on it).
    pub const EXIT_CODE: u8 = kappa_cli::REQUEUE_EXIT_CODE;
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

/// Runs every selected experiment once per seed into `results/<name>/<scale>/seed-<n>/` (the
/// units of [`plan`]), replacing earlier runs of that experiment at that scale, or, with
/// `resume`, reusing them: completed and diverged runs are skipped, interrupted and failed runs
/// continue, and a run folder written with a different config stops the command with an error.
/// With `settings.units`, runs only those units, each reusing its own folder. Every config is
/// resolved first ([`resolve_configs`]), so a bad one stops the command before any run. Returns
/// the units whose run failed, each as `id: error`.
pub fn reproduce(
    experiments: &[Box<dyn RegisteredExperiment>],
    settings: &Settings<'_>,
) -> Result<Vec<String>> {
    let configs = resolve_configs(experiments, settings)?;
    let units = plan_of(experiments, &configs, settings)?;
    check_ranks(experiments, &units, settings)?;
    let chosen = if settings.units.is_empty() {
        if !settings.resume {
            clear_scale_folders(experiments, settings)?;
        }
        units.iter().collect()
    } else {
        pick(&units, settings.units)?
    };
    let started = Instant::now();
    let mut failed = Vec::new();
    for (done, unit) in chosen.iter().enumerate() {
        if stop_agreed(&*settings.ranks, &settings.stop)? {
            return Err(preempted(&chosen[done..]));
        }
        let speaks = settings.ranks.rank() == 0;
        if speaks {
            eprintln!("[{}/{}] {}", done + 1, chosen.len(), unit.id);
        }
        let index = experiments
            .iter()
            .position(|e| e.name() == unit.experiment)
            .expect("a unit of the plan names a selected experiment");
        let (info, how) = run_unit(&*experiments[index], &configs[index], unit, settings)?;
        if speaks {
            eprintln!(
                "      {} ({how}) in {:.1} s",
                describe(&info.status),
                info.wall_seconds
            );
        }
        if let RunStatus::Failed { error } = &info.status {
            failed.push(format!("{}: {error}", unit.id));
        }
        if stop_agreed(&*settings.ranks, &settings.stop)? && !info.status.is_finished() {
            return Err(preempted(&chosen[done..]));
        }
    }
    if settings.ranks.rank() == 0 {
        eprintln!(
            "reproduce: {} run(s) in {:.1} s",
            chosen.len(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(failed)
}

/// Whether the stop flag is raised on any rank: on several ranks every rank calls this at the
/// same points and learns the same answer, so that all of them stop, and exit as preempted,
/// where a signal reached one alone.
fn stop_agreed(comm: &dyn Communicator, stop: &StopFlag) -> Result<bool> {
    let raised = stop.is_raised();
    if comm.world() == 1 {
        return Ok(raised);
    }
    let device = comm.tensor_device().unwrap_or(tch::Device::Cpu);
    let mut any = tch::Tensor::from_slice(&[i64::from(raised)]).f_to_device(device)?;
    comm.all_reduce_sum(&mut any)?;
    Ok(any.f_int64_value(&[0])? > 0)
}

/// On several ranks, a command that runs named units (`--unit`), each of an experiment that
/// trains data-parallel; an error that says what to do otherwise.
fn check_ranks(
    experiments: &[Box<dyn RegisteredExperiment>],
    units: &[Unit],
    settings: &Settings<'_>,
) -> Result<()> {
    let world = settings.ranks.world();
    if world == 1 {
        return Ok(());
    }
    if settings.units.is_empty() {
        bail!(
            "reproduce on {world} ranks runs the units named by --unit, each one model trained \
             on every rank; give --unit ID (`reproduce --plan` lists them), or start one process"
        );
    }
    for unit in pick(units, settings.units)? {
        let shared = (experiments.iter()).any(|e| e.name() == unit.experiment && e.data_parallel());
        if !shared {
            bail!(
                "{}: {} trains no model that ranks can share; run it on one process (without \
                 mpirun, or with one srun task)",
                unit.id,
                unit.experiment
            );
        }
    }
    Ok(())
}

/// The units of `experiments` under `settings` (their `configs` resolved by
/// [`resolve_configs`]).
pub fn plan_of(
    experiments: &[Box<dyn RegisteredExperiment>],
    configs: &[ResolvedConfig],
    settings: &Settings<'_>,
) -> Result<Vec<Unit>> {
    plan(
        experiments,
        configs,
        settings.scale,
        settings.seeds,
        settings.results,
    )
}

/// A rerun without `--resume` starts every run of the selected experiments at this scale
/// afresh, so that the report never mixes configs: earlier run folders (`<results>/<name>/<scale>/*`
/// holding a run's own files) are an error naming them, or with `--fresh` lose their own files
/// ([`kappa_train::folder::remove_own_files`]) once every one of them is checked to hold a run
/// of its experiment; nothing else is deleted.
fn clear_scale_folders(
    experiments: &[Box<dyn RegisteredExperiment>],
    settings: &Settings<'_>,
) -> Result<()> {
    let mut earlier = Vec::new();
    for e in experiments {
        let scale_dir = settings.results.join(e.name()).join(settings.scale.name());
        for name in folder::entries(&scale_dir)? {
            let dir = scale_dir.join(name);
            if folder::file_kind(&dir)? == folder::FileKind::Directory
                && !folder::own_files(&dir)?.is_empty()
            {
                earlier.push((dir, e.name()));
            }
        }
    }
    if earlier.is_empty() {
        return Ok(());
    }
    if !settings.fresh {
        bail!(
            "earlier runs are in {} (and {} more run folder(s)); --resume keeps finished runs \
             and continues the others, --fresh starts them over (deleting only the runs' own \
             files); nothing was changed",
            earlier[0].0.display(),
            earlier.len() - 1
        );
    }
    // Every folder is checked before any is touched.
    for (dir, name) in &earlier {
        folder::ensure_run_of(dir, name)?;
    }
    for (dir, name) in &earlier {
        folder::remove_own_files(dir, name)?;
    }
    Ok(())
}

/// Runs one unit into its folder: afresh, or reusing it with `--resume` or `--unit`.
fn run_unit(
    experiment: &dyn RegisteredExperiment,
    config: &ResolvedConfig,
    unit: &Unit,
    settings: &Settings<'_>,
) -> Result<(RunInfo, &'static str)> {
    let context = RunContext {
        name: unit.experiment.clone(),
        scale: unit.scale.clone(),
        seed: u64::from(unit.seed),
        threads: settings.threads,
        device: settings.device.to_string(),
        data_dir: settings.data.to_path_buf(),
        progress: true,
        stop: settings.stop.clone(),
    };
    // In force for the whole unit, the parts that train no variant included (a variant applies
    // its run's count again, which `Run::pin_threads` may have changed).
    context.apply_threads();
    let dir = unit.dir(settings.results);
    if settings.ranks.world() > 1 {
        let resumed = experiment.resume_on_ranks(&dir, context, config, &settings.ranks)?;
        return Ok(how(resumed));
    }
    if !settings.resume && settings.units.is_empty() {
        return Ok((experiment.execute(&dir, context, config)?, "started"));
    }
    Ok(how(experiment.resume(&dir, context, config)?))
}

/// The run's `run.json` and how it came about, in a few words.
fn how(resumed: Resumption) -> (RunInfo, &'static str) {
    match resumed {
        Resumption::Skipped(info) => (info, "kept from an earlier run"),
        Resumption::Continued(info) => (info, "resumed"),
        Resumption::Restarted(info) => (info, "rerun from the start"),
        Resumption::Started(info) => (info, "started"),
    }
}

fn preempted(left: &[&Unit]) -> anyhow::Error {
    Preempted {
        unfinished: left.iter().map(|u| u.id.clone()).collect(),
    }
    .into()
}

/// How a run ended, in a few words.
fn describe(status: &RunStatus) -> String {
    match status {
        RunStatus::Completed => "completed".to_string(),
        RunStatus::Diverged { step, .. } => format!("diverged at step {step}"),
        RunStatus::Failed { error } => format!("FAILED: {error}"),
    }
}

/// What a report was built from, and what it lacks.
#[derive(Debug, Default)]
pub struct Coverage {
    /// Unit ids with no run folder (no `run.json`) in any results folder read.
    pub missing: Vec<String>,
    /// Run folders whose run failed or was interrupted.
    pub failed: Vec<String>,
}

/// Writes `<out>/report.md` for one scale from the run folders of every experiment found in
/// any of `sources` (results folders: one, or several written by different machines), with
/// its plots under `<out>/<name>/<scale>/`. `expected` lists the unit ids the report should
/// cover (the plan's); those without a run folder, and failed runs, are named in the report
/// and returned rather than failing. A unit found in two folders is an error.
pub fn report(
    scale: Scale,
    sources: &[PathBuf],
    out: &Path,
    expected: &[String],
) -> Result<Coverage> {
    let mut parts = Vec::new();
    let mut coverage = Coverage::default();
    let mut found = BTreeSet::new();
    for e in registry() {
        let runs = gather(e.name(), scale, sources)?;
        found.extend(
            runs.iter()
                .map(|r| unit_id(e.name(), scale, r.info.run.seed as u32)),
        );
        if runs.is_empty() {
            continue;
        }
        coverage.failed.extend(
            runs.iter()
                .filter(|r| !r.info.status.is_finished())
                .map(|r| r.dir.display().to_string()),
        );
        let scale_dir = out.join(e.name()).join(scale.name());
        fs::create_dir_all(&scale_dir)
            .with_context(|| format!("creating {}", scale_dir.display()))?;
        let section = e
            .report(&runs, &scale_dir, out)
            .with_context(|| format!("building the report section of {}", e.name()))?;
        parts.push(Part {
            name: e.name().to_string(),
            scale,
            seconds: runs.iter().map(|r| r.info.wall_seconds).sum(),
            markdown: section.to_markdown(),
        });
    }
    coverage.missing = expected
        .iter()
        .filter(|id| !found.contains(*id))
        .cloned()
        .collect();
    if parts.is_empty() {
        bail!(
            "no run folders for scale `{scale}` under {}; run `cargo xtask reproduce --scale \
             {scale}` first",
            sources
                .iter()
                .map(|s| s.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let path = out.join("report.md");
    let text = with_coverage(Report { parts }.render(), &coverage);
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("report: wrote {}", path.display());
    Ok(coverage)
}

/// The finished or failed runs of `experiment` at `scale` in every source, by seed; the same
/// seed in two sources is an error.
fn gather(experiment: &str, scale: Scale, sources: &[PathBuf]) -> Result<Vec<RunRecord>> {
    let mut by_seed = std::collections::BTreeMap::new();
    for source in sources {
        for run in RunRecord::read_all(&source.join(experiment).join(scale.name()))? {
            if let Some(other) = by_seed.insert(run.info.run.seed, run) {
                bail!(
                    "{} is in two results folders (one is {}); merge reads each unit once",
                    unit_id(experiment, scale, other.info.run.seed as u32),
                    other.dir.display()
                );
            }
        }
    }
    Ok(by_seed.into_values().collect())
}

/// The report's text with a paragraph naming the missing and failed units after its header
/// (nothing is added when there are none).
fn with_coverage(text: String, coverage: &Coverage) -> String {
    if coverage.missing.is_empty() && coverage.failed.is_empty() {
        return text;
    }
    let mut note = String::new();
    if !coverage.missing.is_empty() {
        note.push_str(&format!(
            "**Missing units** (no run folder in the results read; their sections cover the \
             other seeds): {}.\n\n",
            coverage.missing.join(", ")
        ));
    }
    if !coverage.failed.is_empty() {
        note.push_str(&format!(
            "**Failed or interrupted runs** (see run.json in each; `--resume` continues them): \
             {}.\n\n",
            coverage.failed.join(", ")
        ));
    }
    match text.find(OPEN) {
        Some(i) => format!("{}{note}{}", &text[..i], &text[i..]),
        None => text + &note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_raised_on_one_rank_stops_every_rank() {
        let agreed = kappa_dist::Threads::run(3, |comm| {
            let stop = StopFlag::default();
            if comm.rank() == 0 {
                stop.raise();
            }
            stop_agreed(&comm, &stop).unwrap()
        })
        .unwrap();
        assert_eq!(agreed, [true, true, true]);
        let calm =
            kappa_dist::Threads::run(2, |comm| stop_agreed(&comm, &StopFlag::default()).unwrap())
                .unwrap();
        assert_eq!(calm, [false, false]);
    }
}
