//! `cargo xtask`: the one place in kappa that knows about installs, files and processes.
//!
//! - `cargo xtask setup [--data LIST]` installs what the build and the experiments need
//!   (OpenBLAS, libtorch through PyPI's torch, the data sets), idempotently.
//! - `cargo xtask test` runs setup, then `fmt --check`, `clippy -D warnings` and the whole test
//!   suite. This is the README's test command and what CI runs.
//! - `cargo xtask reproduce [--scale S] [--only NAME]… [--config FILE] [--set KEY=VALUE]…
//!   [--resume] [--publish]` runs the experiments and writes `results/report.md`; the options
//!   are kappa-cli's, checked before anything is installed or built.
//! - `cargo xtask reproduce --slurm [--partition P] [--time T] [--dry-run] …` writes the units as
//!   a Slurm job array with a dependent report job and submits them (see docs/cluster.md).
//! - `cargo xtask report [--scale S] [--results DIR]… [--out DIR]` builds the report from run
//!   folders written anywhere (units run on other machines), naming missing or failed units.
//! - `cargo xtask bench [--threads N[,M…]] [--bench NAME] [--publish]` runs the criterion
//!   benchmarks (once per count) and writes the parts of docs/performance.md that ran.
//! - `cargo xtask costs [--results DIR]… [--refresh]` sets the measured minutes of
//!   `experiments/costs.toml` from the finished runs' run.json files.
//! - `cargo xtask python [--bench [--threads N[,M…]] [--publish]]` builds the Python package
//!   `kappa` into the project's virtual environment (`cargo xtask test` does too, then runs its
//!   pytest suite), and runs its benchmarks.
//!
//! Every cargo call made from here gets `LIBTORCH` and the runtime library path, so nobody has
//! to export anything by hand.

mod cargo;
mod costs;
mod data;
mod mpi_test;
mod publish;
mod python;
mod python_bench;
mod reproduce;
mod setup;
mod slurm;
mod slurm_test;
mod tidy;
mod torch;
mod train;
mod workspace;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::data::DataSelection;
use crate::workspace::Workspace;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Set up, test, reproduce and benchmark kappa"
)]
struct Cli {
    /// On failure, also print where in xtask the error arose (a backtrace; it is also printed
    /// when `KAPPA_BACKTRACE=1`). `RUST_BACKTRACE` alone does not turn it on.
    #[arg(long, global = true)]
    backtrace: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what the build and the experiments need; does nothing when all is present.
    Setup {
        /// Data sets to install: `all`, `none`, or a comma-separated list of
        /// fashion-mnist, sotu, movie-reviews, brown.
        #[arg(long, default_value = "none")]
        data: DataSelection,
    },
    /// Setup, then formatting, lints, every test, the standalone libraries, docs and packages.
    Test(cargo::TestArgs),
    /// Run the experiments and write `results/report.md` (or, with `--slurm`, submit them to a
    /// Slurm cluster as a job array of units).
    Reproduce {
        #[command(flatten)]
        args: kappa_cli::ReproduceArgs,
        #[command(flatten)]
        slurm: slurm::SlurmArgs,
        /// With `--slurm`: each unit on `--nodes` × `--ntasks-per-node` ranks.
        #[command(flatten)]
        ranks: slurm::RankArgs,
    },
    /// Build the report from run folders, merging several results folders (`--results`,
    /// repeatable; default `results/`) and naming missing or failed units.
    Report(kappa_cli::ReportArgs),
    /// Train one model on your own data from a TOML job file (see `examples/train/`), here or,
    /// with `--slurm`, as a Slurm job on one or more processes.
    Train {
        #[command(flatten)]
        args: kappa_cli::TrainArgs,
        #[command(flatten)]
        slurm: slurm::TrainSlurmArgs,
    },
    /// Run the criterion benchmarks (nothing else should run on the machine meanwhile).
    Bench(cargo::BenchArgs),
    /// Show, and with `--refresh` write, the minutes of experiments/costs.toml that the
    /// completed runs' run.json files measured (median over seeds).
    Costs(costs::CostsArgs),
    /// Build the Python package `kappa` (python/) into the project's virtual environment
    /// (`--bench`: then run its benchmarks; `--publish`: write docs/performance-python.md).
    Python(python::PythonArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let backtrace = cli.backtrace || std::env::var_os("KAPPA_BACKTRACE").is_some_and(|v| v == "1");
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if backtrace {
                eprintln!("\n{}", e.backtrace());
            }
            workspace::Failed::forwarded_code(&e).map_or(ExitCode::FAILURE, ExitCode::from)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let ws = Workspace::locate()?;
    match cli.command {
        Command::Setup { data } => {
            setup::setup(&ws, &data)?;
        }
        Command::Test(args) => cargo::test(&ws, &args)?,
        Command::Reproduce { args, slurm, ranks } if slurm.slurm => {
            reproduce::slurm(&ws, &args, &slurm, &ranks)?
        }
        Command::Reproduce { args, .. } => reproduce::reproduce(&ws, &args)?,
        Command::Report(args) => reproduce::report(&ws, &args)?,
        Command::Train { args, slurm } => train::train(&ws, &args, &slurm)?,
        Command::Bench(args) => cargo::bench(&ws, &args)?,
        Command::Costs(args) => costs::costs(&ws, &args)?,
        Command::Python(args) => python::install(&ws, &args)?,
    }
    Ok(())
}
