//! kappa-experiments: the experiment registry behind `cargo xtask reproduce`.
//!
//! An experiment is data: a typed config per [`Scale`] — the repository file
//! `experiments/<name>/<scale>.toml`, embedded here and checked at start ([`config`]; a user's
//! file through `--config`, single keys through `--set`) — a seed, and a run folder with
//! `config.toml` (the resolved config), `metrics.jsonl` and `run.json`. After the runs, each
//! experiment turns its run folders — never in-memory state — into a section of
//! `results/report.md`, with tables beside the papers' numbers and PNG plots; `--publish`
//! splices the sections of the experiments that ran into `docs/results/` ([`publish`]).
//!
//! The principal types: [`Experiment`] (what an experiment implements), [`config::ConfigSource`]
//! (a config file and its errors), [`Run`] (a run folder being written), [`RunRecord`] (a
//! finished run folder read back), [`plot::LinePlot`], [`report::Section`] and
//! [`report::Report`].

pub mod conditioning;
pub mod config;
pub mod plot;
pub mod publish;
pub mod registry;
pub mod report;
pub use kappa_train::run;
pub mod runner;
pub mod scale;
pub mod stats;
pub mod suite;
pub mod train;
pub mod units;

pub use registry::{registry, Experiment, RegisteredExperiment};
pub use report::Section;
pub use run::{Run, RunRecord, RunStatus};
pub use scale::Scale;

/// The code examples of the repository's README, compiled and run as doctests (this crate
/// depends on every library the README shows).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
