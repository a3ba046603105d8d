//! kappa-cli: the `reproduce`, `report` and `train` command lines, defined once for `cargo xtask`
//! and the `kappa-experiments` binary.
//!
//! xtask parses [`ReproduceArgs`] before it installs or builds anything, so a typo in `--scale`,
//! `--only`, `--device` or `--set` fails in milliseconds; it then forwards exactly what it parsed
//! ([`ReproduceArgs::to_args`]) to the binary, which parses the same struct again. This crate
//! depends on clap alone (serde behind the `serde` feature): no libtorch, nothing slow to build.
//!
//! ```
//! use clap::Parser;
//! use kappa_cli::{ReproduceArgs, Scale};
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     reproduce: ReproduceArgs,
//! }
//!
//! let cli = Cli::try_parse_from(["x", "--scale", "smoke", "--only", "theory", "--set", "train.lr=3e-4"])
//!     .unwrap();
//! assert_eq!(cli.reproduce.scale, Scale::Smoke);
//! // What xtask forwards parses to the same options.
//! let again = Cli::try_parse_from(
//!     std::iter::once("x".into()).chain(cli.reproduce.to_args()),
//! )
//! .unwrap();
//! assert_eq!(again.reproduce, cli.reproduce);
//! assert!(Cli::try_parse_from(["x", "--scale", "smok"]).is_err());
//! ```

mod names;
mod parse;
mod report;
mod reproduce;
mod scale;
mod train;

pub use names::{DeviceName, ExperimentName, EXPERIMENTS, SERIES};
pub use parse::parse_args;
pub use report::ReportArgs;
pub use reproduce::{config_experiment, ReproduceArgs, Set};
pub use scale::Scale;
pub use train::TrainArgs;

/// The exit status of a `reproduce` that stopped on SIGTERM or SIGUSR1 with its unit
/// checkpointed: `EX_TEMPFAIL` of sysexits.h, "try again later". The binary exits with it, xtask
/// forwards it, and the Slurm script requeues a task on it.
pub const REQUEUE_EXIT_CODE: u8 = 75;
