//! The experiment trait and the registry of every experiment `cargo xtask reproduce` knows.

use std::path::Path;

use anyhow::Result;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::experiments;
use crate::report::Section;
use crate::run::{Run, RunRecord, RunStatus};
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
    fn execute(&self, dir: &Path, context: crate::run::RunContext) -> Result<crate::run::RunInfo>;
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
    fn execute(&self, dir: &Path, context: crate::run::RunContext) -> Result<crate::run::RunInfo> {
        let config = self.config(context.scale);
        let mut run = Run::create(dir, context, &config)?;
        let status = match Experiment::run(self, &config, &mut run) {
            Ok(status) => status,
            Err(e) => RunStatus::Failed {
                error: format!("{e:#}"),
            },
        };
        run.finish(status)
    }
    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        Experiment::report(self, runs, out_dir, report_dir)
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
