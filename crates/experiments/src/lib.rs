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
//! # Principal items
//!
//! | module | items |
//! |---|---|
//! | [`registry`](mod@registry) | [`Experiment`] (what an experiment implements: name, claim, config, `validate`, `run`, `report`), [`registry()`] (every experiment, in `--list` order), [`RegisteredExperiment`] |
//! | [`suite`] | the experiments, one module each (`suite::random_spectra`, …, `suite::lambda_readings`) |
//! | [`config`] | [`config::ConfigSource`]: a config file (built-in or a user's), `--set` overrides, errors naming the file and the dotted key |
//! | [`scale`] | [`Scale`]: `smoke`, `cpu`, `long`, `gpu`, `paper` (kappa-cli's, re-exported) |
//! | [`run`] | [`Run`] (a run folder being written), [`RunRecord`] (a finished run folder read back), [`RunStatus`]: kappa-train's, re-exported |
//! | [`runner`] | running the selected experiments into run folders and building the report |
//! | [`units`] | units of work (one experiment and seed each) with their expected cost from `experiments/costs.toml`: `--plan`, `--unit` |
//! | [`report`] | [`report::Report`] and [`Section`]: the report's sections between markers, tables of runs, cells, verdicts, figures |
//! | [`publish`] | `--publish`: the sections of the experiments that ran into `docs/results/` |
//! | [`plot`] | [`plot::LinePlot`]: PNG line and scatter plots with an embedded font |
//! | [`stats`] | means, standard deviations, medians, least-squares slopes with a 95% interval, Welch's t-test |
//! | [`correction_study`] | what `vit-fmnist`, `gpt-sotu` and `bert-sentiment` share: conditioned variants, their training and report |
//! | [`train`] | `train --config FILE`: one model on a user's own data (docs/train-your-own.md) |
//! | [`rank_zero`] | [`rank_zero::tell_ranks`]: rank 0's word to the other ranks of a data-parallel run (train or not, resumed or not) |
//! | [`ranks`] | [`ranks::Ranks`]: one process, or one rank of several over MPI (feature `mpi`) or NCCL (feature `nccl`); the launcher's process counts checked against MPI's |

pub mod config;
pub mod correction_study;
pub mod plot;
pub mod publish;
pub mod rank_zero;
pub mod ranks;
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
