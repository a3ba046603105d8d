//! The experiment trait and the registry of every experiment `cargo xtask reproduce` knows.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use kappa_cli::Set;
use kappa_dist::Communicator;
use kappa_train::RunError;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::{ConfigError, ConfigSource};
use crate::rank_zero::tell_ranks;
use crate::report::Section;
use crate::run::{Resumed, Run, RunContext, RunInfo, RunRecord, RunStatus};
use crate::scale::Scale;
use crate::suite;

/// An experiment: a config per scale, a run per seed, and a report section made from run folders.
///
/// The configs are data: the built-in one of each scale is the file
/// `experiments/<name>/<scale>.toml` ([`crate::config`]), and `reproduce --config`/`--set`
/// change it without a rebuild. Every config is read and checked ([`Experiment::load`]) before
/// anything runs.
pub trait Experiment: Sync {
    /// Everything the experiment reads from its config file; recorded in each run's
    /// `config.toml`. Its structs deny unknown fields, so a misspelt key is an error.
    type Config: Serialize + DeserializeOwned;

    /// The registry name (`--only NAME`), also the results folder name.
    fn name(&self) -> &'static str;

    /// The paper claim this experiment tests, in one sentence.
    fn claim(&self) -> &'static str;

    /// Data sets (names of `cargo xtask setup --data`) the experiment reads.
    fn data_needs(&self) -> &'static [&'static str] {
        &[]
    }

    /// How many seeds to run when `--seeds` is not given.
    fn default_seeds(&self, _scale: Scale) -> u32 {
        3
    }

    /// Checks the values of a config, before anything runs: whatever would otherwise fail only
    /// later in a run, or silently give a meaningless one. Errors name the dotted key
    /// (`train.lr: …`). The default accepts every config that parses.
    fn validate(&self, _config: &Self::Config) -> Result<()> {
        Ok(())
    }

    /// The config of `source` with `sets` applied, parsed and [validated](Experiment::validate).
    fn load(&self, source: &ConfigSource, sets: &[Set]) -> Result<Self::Config, ConfigError> {
        let config = source.resolve(self.name(), sets)?;
        self.validate(&config).map_err(|e| ConfigError::Invalid {
            origin: source.origin().to_string(),
            message: format!("{e:#}"),
        })?;
        Ok(config)
    }

    /// The built-in config of a scale (the file `experiments/<name>/<scale>.toml`), checked.
    fn config(&self, scale: Scale) -> Result<Self::Config, ConfigError> {
        self.load(&ConfigSource::builtin(self.name(), scale)?, &[])
    }

    /// Whether [`Experiment::run`] can continue a run folder left by an interrupted or failed
    /// attempt (`reproduce --resume`): it skips what that attempt finished and continues from
    /// its checkpoints, as [`kappa_train::train_variant`] does when
    /// [`Run::is_resumed`]. When false (the default), `--resume` reruns such a folder from the
    /// start; finished runs are kept either way.
    fn continues_interrupted_runs(&self) -> bool {
        false
    }

    /// Whether a run can train data-parallel over several ranks (`reproduce --unit` under
    /// `mpirun` or `srun`): every model it trains goes through [`kappa_train::train_variant`]
    /// (which joins the run's ranks, [`Run::data_parallel`]), and it writes only through its
    /// [`Run`] (which writes nothing on ranks other than 0). False by default: the numerical
    /// experiments train no model to split.
    fn data_parallel(&self) -> bool {
        false
    }

    /// Runs once with `config`, logging to `run`; returns how the run ended.
    fn run(&self, config: &Self::Config, run: &mut Run) -> Result<RunStatus>;

    /// Builds the report section from the finished run folders of one scale. Plots go into
    /// `out_dir` (the scale folder); image paths in the section are relative to the report.
    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section>;
}

/// The object-safe face of [`Experiment`], used by the registry and the runner.
pub trait RegisteredExperiment: Sync {
    /// See [`Experiment::name`].
    fn name(&self) -> &'static str;
    /// See [`Experiment::claim`].
    fn claim(&self) -> &'static str;
    /// See [`Experiment::data_needs`].
    fn data_needs(&self) -> &'static [&'static str];
    /// See [`Experiment::default_seeds`].
    fn default_seeds(&self, scale: Scale) -> u32;
    /// Reads and checks the config of `source` with `sets` applied ([`Experiment::load`]).
    fn resolve(&self, source: &ConfigSource, sets: &[Set]) -> Result<ResolvedConfig, ConfigError>;
    /// Writes `config.toml` (the context and `config`) into a fresh run folder, runs, and
    /// writes `run.json`.
    fn execute(&self, dir: &Path, context: RunContext, config: &ResolvedConfig) -> Result<RunInfo>;
    /// Like [`RegisteredExperiment::execute`], but reuses the folder ([`Run::resume`]): a
    /// finished run is returned as it is, an unfinished one continues; a folder written with
    /// another config than `config` is an error.
    fn resume(
        &self,
        dir: &Path,
        context: RunContext,
        config: &ResolvedConfig,
    ) -> Result<Resumption>;
    /// See [`Experiment::data_parallel`].
    fn data_parallel(&self) -> bool;
    /// [`RegisteredExperiment::resume`] on every rank of `comm` at once, one run trained
    /// data-parallel: rank 0 resumes or creates the folder and tells the others whether there is
    /// training to do ([`tell_ranks`]); they follow its folder ([`Run::follow`]) and write
    /// nothing. Every rank returns when rank 0 has written `run.json`.
    fn resume_on_ranks(
        &self,
        dir: &Path,
        context: RunContext,
        config: &ResolvedConfig,
        comm: &Arc<dyn Communicator>,
    ) -> Result<Resumption>;
    /// See [`Experiment::report`].
    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section>;
}

impl<E: Experiment> RegisteredExperiment for E {
    fn name(&self) -> &'static str {
        Experiment::name(self)
    }
    fn claim(&self) -> &'static str {
        Experiment::claim(self)
    }
    fn data_needs(&self) -> &'static [&'static str] {
        Experiment::data_needs(self)
    }
    fn default_seeds(&self, scale: Scale) -> u32 {
        Experiment::default_seeds(self, scale)
    }
    fn resolve(&self, source: &ConfigSource, sets: &[Set]) -> Result<ResolvedConfig, ConfigError> {
        let config = self.load(source, sets)?;
        let table = toml::Table::try_from(&config).map_err(|e| ConfigError::Invalid {
            origin: source.origin().to_string(),
            message: e.to_string(),
        })?;
        Ok(ResolvedConfig {
            experiment: Experiment::name(self),
            origin: source.origin().to_string(),
            table,
        })
    }
    fn execute(&self, dir: &Path, context: RunContext, config: &ResolvedConfig) -> Result<RunInfo> {
        let config: E::Config = config.decode(Experiment::name(self))?;
        let run = Run::create(dir, context, &config)?;
        run_to_the_end(self, &config, run)
    }
    fn resume(
        &self,
        dir: &Path,
        context: RunContext,
        config: &ResolvedConfig,
    ) -> Result<Resumption> {
        let config: E::Config = config.decode(Experiment::name(self))?;
        Ok(match reopen(self, dir, context, &config)? {
            Reopened::Finished(info) => Resumption::Skipped(info),
            Reopened::Run(run, how) => how(run_to_the_end(self, &config, run)?),
        })
    }
    fn data_parallel(&self) -> bool {
        Experiment::data_parallel(self)
    }
    fn resume_on_ranks(
        &self,
        dir: &Path,
        context: RunContext,
        config: &ResolvedConfig,
        comm: &Arc<dyn Communicator>,
    ) -> Result<Resumption> {
        let config: E::Config = config.decode(Experiment::name(self))?;
        let (mut run, how) = if comm.rank() == 0 {
            match reopen(self, dir, context, &config)? {
                Reopened::Finished(info) => {
                    tell_ranks(&**comm, false, false)?;
                    return Ok(Resumption::Skipped(info));
                }
                Reopened::Run(run, how) => {
                    tell_ranks(&**comm, true, run.is_resumed())?;
                    (run, how)
                }
            }
        } else {
            match tell_ranks(&**comm, false, false)? {
                None => return Ok(Resumption::Skipped(RunRecord::read(dir)?.info)),
                Some(true) => (
                    Run::follow(dir, context, true),
                    Resumption::Continued as Kind,
                ),
                Some(false) => (
                    Run::follow(dir, context, false),
                    Resumption::Started as Kind,
                ),
            }
        };
        run.data_parallel(Arc::clone(comm));
        let (info, error) = run_recorded(self, &config, run)?;
        // A failure may leave the other ranks in another collective, where a barrier would
        // turn it into a mismatch on both: it goes to `Ranks::end`, which prints it with the
        // rank and ends the job. A stop on request stopped every rank after the same step.
        if let Some(e) = error.filter(|e| !is_interrupted(e)) {
            return Err(e.context(format!("{} (recorded in its run.json)", dir.display())));
        }
        // The others leave once rank 0 has written `run.json` (a launcher may end the job when
        // one process exits).
        comm.barrier()?;
        Ok(how(info))
    }
    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        Experiment::report(self, runs, out_dir, report_dir)
    }
}

/// How a run came about ([`Resumption`]'s variants but `Skipped`).
type Kind = fn(RunInfo) -> Resumption;

/// A run folder reused for `--resume` or `--unit`.
enum Reopened {
    /// Its run completed or diverged already.
    Finished(RunInfo),
    /// A run to train: started, continued, or restarted (an experiment that cannot continue an
    /// interrupted run, [`Experiment::continues_interrupted_runs`]).
    Run(Run, Kind),
}

/// Reuses the run folder `dir` for `experiment` with `config` ([`Run::resume`]).
fn reopen<E: Experiment>(
    experiment: &E,
    dir: &Path,
    context: RunContext,
    config: &E::Config,
) -> Result<Reopened> {
    Ok(match Run::resume(dir, context.clone(), config)? {
        Resumed::Finished(info) => Reopened::Finished(info),
        Resumed::Started(run) => Reopened::Run(run, Resumption::Started),
        Resumed::Continued(run) if experiment.continues_interrupted_runs() => {
            Reopened::Run(run, Resumption::Continued)
        }
        Resumed::Continued(run) => {
            drop(run);
            Reopened::Run(
                Run::start_over(dir, context, config)?,
                Resumption::Restarted,
            )
        }
    })
}

/// Runs `experiment` into `run` and writes `run.json`; an error is recorded as a failed run.
fn run_to_the_end<E: Experiment>(experiment: &E, config: &E::Config, run: Run) -> Result<RunInfo> {
    Ok(run_recorded(experiment, config, run)?.0)
}

/// [`run_to_the_end`], with the experiment's error (recorded as a failed run) beside its
/// `run.json`.
fn run_recorded<E: Experiment>(
    experiment: &E,
    config: &E::Config,
    mut run: Run,
) -> Result<(RunInfo, Option<anyhow::Error>)> {
    let (status, error) = match Experiment::run(experiment, config, &mut run) {
        Ok(status) => (status, None),
        Err(e) => {
            let error = format!("{e:#}");
            (RunStatus::Failed { error }, Some(e))
        }
    };
    Ok((run.finish(status)?, error))
}

/// Whether `e` is a stop on request: the run checkpointed after a step every rank agreed on.
fn is_interrupted(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref(), Some(RunError::Interrupted { .. }))
}

/// An experiment's config after `--config`, `--set` and [`Experiment::validate`]: the table
/// its runs record under `[config]` in `config.toml` (every field, defaults included).
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedConfig {
    experiment: &'static str,
    origin: String,
    table: toml::Table,
}

impl ResolvedConfig {
    /// The experiment it configures.
    pub fn experiment(&self) -> &'static str {
        self.experiment
    }

    /// Where it was read from (`experiments/<name>/<scale>.toml` or the `--config` path).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The config as TOML.
    pub fn table(&self) -> &toml::Table {
        &self.table
    }

    /// The typed config again (it was read from this very table, so this fails only when
    /// `experiment` is not the one it was resolved for).
    fn decode<C: DeserializeOwned>(&self, experiment: &str) -> Result<C> {
        anyhow::ensure!(
            experiment == self.experiment,
            "the config of {} was given to {experiment}",
            self.experiment
        );
        toml::Value::Table(self.table.clone())
            .try_into()
            .with_context(|| format!("{}: re-reading the resolved config", self.origin))
    }
}

/// What [`RegisteredExperiment::resume`] did with a run folder.
#[derive(Clone, Debug)]
pub enum Resumption {
    /// There was no run: it ran from the start.
    Started(RunInfo),
    /// An interrupted or failed run continued where it stopped.
    Continued(RunInfo),
    /// An interrupted or failed run of an experiment that cannot continue one
    /// ([`Experiment::continues_interrupted_runs`]) ran again from the start.
    Restarted(RunInfo),
    /// The run had completed or diverged already and was not run again.
    Skipped(RunInfo),
}

impl Resumption {
    /// The `run.json` of the run, however it came about.
    pub fn info(&self) -> &RunInfo {
        match self {
            Resumption::Started(i)
            | Resumption::Continued(i)
            | Resumption::Restarted(i)
            | Resumption::Skipped(i) => i,
        }
    }
}

/// Every experiment, in report order.
pub fn registry() -> Vec<Box<dyn RegisteredExperiment>> {
    vec![
        Box::new(suite::random_spectra::RandomSpectra),
        Box::new(suite::theory::Theory),
        Box::new(suite::convergence::Convergence),
        Box::new(suite::optim_geometry::OptimGeometry),
        Box::new(suite::vit_fmnist::VitFmnist),
        Box::new(suite::gpt_sotu::GptSotu),
        Box::new(suite::manifolds::Manifolds),
        Box::new(suite::optimizer_race::OptimizerRace),
        Box::new(suite::lra::Lra),
        Box::new(suite::bert_sentiment::BertSentiment),
        Box::new(suite::lambda_readings::LambdaReadings),
        Box::new(suite::scaling::Scaling),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo xtask reproduce` checks `--only` against kappa-cli's list before it builds this
    /// crate; that list must name exactly the registry's experiments, in order.
    #[test]
    fn the_command_line_knows_every_experiment() {
        let ours: Vec<&str> = registry().iter().map(|e| e.name()).collect();
        assert_eq!(
            kappa_cli::EXPERIMENTS,
            ours,
            "update EXPERIMENTS in crates/cli/src/names.rs"
        );
    }

    /// Every built-in file parses into its experiment's config and passes its checks.
    #[test]
    fn every_builtin_config_loads() {
        for b in crate::config::builtins() {
            let e = registry()
                .into_iter()
                .find(|e| e.name() == b.experiment)
                .unwrap();
            let source = ConfigSource::builtin(b.experiment, b.scale).unwrap();
            if let Err(err) = e.resolve(&source, &[]) {
                panic!("{err}");
            }
        }
    }
}
