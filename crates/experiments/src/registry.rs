//! The experiment trait and the registry of every experiment `cargo xtask reproduce` knows.

use std::path::Path;

use anyhow::Result;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::experiments;
use crate::report::Section;
use crate::run::{Resumed, Run, RunContext, RunInfo, RunRecord, RunStatus};
use crate::scale::Scale;

/// An experiment: a config per scale, a run per seed, and a report section made from run folders.
pub trait Experiment: Sync {
    /// Everything the experiment reads from `config.toml`.
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

    /// The config for a scale.
    fn config(&self, scale: Scale) -> Self::Config;

    /// Whether [`Experiment::run`] can continue a run folder left by an interrupted or failed
    /// attempt (`reproduce --resume`): it skips what that attempt finished and continues from
    /// its checkpoints, as [`crate::experiments::vit_fmnist::train_variant`] does when
    /// [`Run::is_resumed`]. When false (the default), `--resume` reruns such a folder from the
    /// start; finished runs are kept either way.
    fn continues_interrupted_runs(&self) -> bool {
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
    /// Writes `config.toml` into a fresh run folder, runs, and writes `run.json`.
    fn execute(&self, dir: &Path, context: RunContext) -> Result<RunInfo>;
    /// Like [`RegisteredExperiment::execute`], but reuses the folder ([`Run::resume`]): a
    /// finished run is returned as it is, an unfinished one continues.
    fn resume(&self, dir: &Path, context: RunContext) -> Result<Resumption>;
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
    fn execute(&self, dir: &Path, context: RunContext) -> Result<RunInfo> {
        let config = self.config(scale_of(&context)?);
        let run = Run::create(dir, context, &config)?;
        run_to_the_end(self, &config, run)
    }
    fn resume(&self, dir: &Path, context: RunContext) -> Result<Resumption> {
        let config = self.config(scale_of(&context)?);
        Ok(match Run::resume(dir, context.clone(), &config)? {
            Resumed::Started(run) => Resumption::Started(run_to_the_end(self, &config, run)?),
            Resumed::Continued(run) if self.continues_interrupted_runs() => {
                Resumption::Continued(run_to_the_end(self, &config, run)?)
            }
            Resumed::Continued(run) => {
                drop(run);
                let run = Run::create(dir, context, &config)?;
                Resumption::Restarted(run_to_the_end(self, &config, run)?)
            }
            Resumed::Finished(info) => Resumption::Skipped(info),
        })
    }
    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        Experiment::report(self, runs, out_dir, report_dir)
    }
}

/// Runs `experiment` into `run` and writes `run.json`; an error is recorded as a failed run.
fn run_to_the_end<E: Experiment>(
    experiment: &E,
    config: &E::Config,
    mut run: Run,
) -> Result<RunInfo> {
    let status = match Experiment::run(experiment, config, &mut run) {
        Ok(status) => status,
        Err(e) => RunStatus::Failed {
            error: format!("{e:#}"),
        },
    };
    Ok(run.finish(status)?)
}

/// The scale a run context names (the runner writes one of [`Scale`]'s names).
fn scale_of(context: &RunContext) -> Result<Scale> {
    context.scale.parse().map_err(anyhow::Error::msg)
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
        Box::new(experiments::random_spectra::RandomSpectra),
        Box::new(experiments::theory::Theory),
        Box::new(experiments::convergence::Convergence),
        Box::new(experiments::optim_geometry::OptimGeometry),
        Box::new(experiments::vit_fmnist::VitFmnist),
        Box::new(experiments::gpt_sotu::GptSotu),
        Box::new(experiments::manifolds::Manifolds),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo xtask reproduce` checks `--only` against its own list before it builds this crate;
    /// that list must name exactly the registry's experiments, in order.
    #[test]
    fn xtask_knows_every_experiment() {
        let names_rs = concat!(env!("CARGO_MANIFEST_DIR"), "/../../xtask/src/names.rs");
        let text = std::fs::read_to_string(names_rs).expect("xtask/src/names.rs");
        let list = text
            .split("pub const EXPERIMENTS: &[&str] = &[")
            .nth(1)
            .and_then(|rest| rest.split("];").next())
            .expect("the EXPERIMENTS list in xtask/src/names.rs");
        let xtask: Vec<&str> = list
            .split(',')
            .map(|s| s.trim().trim_matches('"'))
            .filter(|s| !s.is_empty())
            .collect();
        let ours: Vec<&str> = registry().iter().map(|e| e.name()).collect();
        assert_eq!(xtask, ours, "update EXPERIMENTS in xtask/src/names.rs");
    }
}
