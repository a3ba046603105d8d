//! The `kappa-experiments` binary, normally started by `cargo xtask reproduce`.
//!
//! - `kappa-experiments list [--only NAME]…` names the experiments and the claims they test.
//! - `kappa-experiments data-needs [--only NAME]…` prints the data sets they read.
//! - `kappa-experiments reproduce [OPTIONS] [--results DIR] [--data DIR] [--docs DIR]` runs
//!   them and writes `DIR/report.md`. The options are kappa-cli's [`ReproduceArgs`], the very
//!   ones `cargo xtask reproduce` parses and forwards: `--scale`, `--only`, `--seeds`,
//!   `--threads`, `--device`, `--config FILE`, `--set KEY=VALUE`, `--resume`, `--publish` (into
//!   `--docs`, default `docs/results`), `--list`.
//! - `kappa-experiments report --scale S --results DIR` rebuilds the report from run folders.
//! - `kappa-experiments train --config FILE [--set KEY=VALUE]… [--seed N] [--threads N]
//!   [--device D] [--out DIR] [--resume]` trains one model on a user's data (kappa-cli's
//!   [`TrainArgs`]; see `kappa_experiments::train`).
//! - `kappa-experiments blas` says which BLAS kernel the process runs and how it was chosen.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kappa_cli::{config_experiment, ExperimentName, ReproduceArgs, TrainArgs};
use kappa_experiments::config::ConfigSource;
use kappa_experiments::publish::publish;
use kappa_experiments::runner::{report, reproduce, select, Settings};
use kappa_experiments::{RegisteredExperiment, Scale};

#[derive(Parser)]
#[command(
    name = "kappa-experiments",
    about = "Run kappa's experiments and write the report"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct Selection {
    /// Only these experiments (repeatable).
    #[arg(long)]
    only: Vec<ExperimentName>,
}

/// Where the runs read and write (xtask passes the workspace's folders).
#[derive(clap::Args)]
struct Places {
    /// The results folder.
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// The data folder that `cargo xtask setup` fills.
    #[arg(long, default_value = "data")]
    data: PathBuf,
    /// Where `--publish` puts the report.
    #[arg(long, default_value = "docs/results")]
    docs: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Name every experiment and the paper claim it tests.
    List(Selection),
    /// Print the data sets the selected experiments read, one per line.
    DataNeeds(Selection),
    /// Run the selected experiments, then write the report.
    Reproduce {
        #[command(flatten)]
        args: ReproduceArgs,
        #[command(flatten)]
        places: Places,
    },
    /// Say which BLAS kernel this process runs, how it was chosen, and whether it is a generic
    /// fallback (what every run's `run.json` records).
    Blas,
    /// Train one model on your own data from a TOML job file.
    Train(TrainArgs),
    /// Rebuild the report from existing run folders.
    Report {
        /// smoke, cpu or paper.
        #[arg(long, default_value = "cpu")]
        scale: Scale,
        /// The results folder.
        #[arg(long, default_value = "results")]
        results: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The error and its causes; a backtrace only on request (`RUST_BACKTRACE` is often
            // set globally, and a backtrace for a typo helps nobody).
            eprintln!("error: {e:#}");
            if std::env::var_os("KAPPA_BACKTRACE").is_some_and(|v| v == "1") {
                eprintln!("\n{}", e.backtrace());
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let blas = kappa_linalg::blas_report();
    if blas.is_generic_fallback() {
        eprintln!("kappa-experiments: {blas}");
    }
    match cli.command {
        Command::Blas => println!("{blas}"),
        Command::List(selection) => list(&select(&names(&selection.only))?),
        Command::DataNeeds(selection) => {
            let needs: BTreeSet<&str> = select(&names(&selection.only))?
                .iter()
                .flat_map(|e| e.data_needs().iter().copied())
                .collect();
            for need in needs {
                println!("{need}");
            }
        }
        Command::Reproduce { args, places } => run_reproduce(&args, &places)?,
        Command::Report { scale, results } => report(scale, &results)?,
        Command::Train(args) => run_train(&args)?,
    }
    Ok(())
}

/// `reproduce`: resolve every config, run, write the report, and publish it when asked.
fn run_reproduce(args: &ReproduceArgs, places: &Places) -> Result<()> {
    let experiments = select(&selected(args)?)?;
    if args.list {
        list(&experiments);
        return Ok(());
    }
    let settings = Settings {
        scale: args.scale,
        seeds: args.seeds,
        threads: args.threads,
        device: &args.device.0,
        results: &places.results,
        data: &places.data,
        resume: args.resume,
        config: args.config.as_deref(),
        sets: &args.set,
    };
    reproduce(&experiments, &settings)?;
    report(args.scale, &places.results)?;
    if args.publish {
        let ran: Vec<&str> = experiments.iter().map(|e| e.name()).collect();
        publish(&places.results, &places.docs, &ran)?;
        eprintln!(
            "reproduce: published {} into {}",
            ran.join(", "),
            places.docs.display()
        );
    }
    Ok(())
}

/// The experiments `reproduce` runs: `--only`, or with `--config` the one experiment the file
/// configures (`--only NAME` or its `experiment = "NAME"` key).
fn selected(args: &ReproduceArgs) -> Result<Vec<String>> {
    let Some(path) = &args.config else {
        return Ok(names(&args.only));
    };
    let key = ConfigSource::file(path)?.experiment_key()?;
    let name = config_experiment(&args.only, key.as_deref())
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("--config {}", path.display()))?;
    Ok(vec![name.0])
}

fn names(only: &[ExperimentName]) -> Vec<String> {
    only.iter().map(|n| n.0.clone()).collect()
}

fn list(experiments: &[Box<dyn RegisteredExperiment>]) {
    for e in experiments {
        println!("{:<16} {}", e.name(), e.claim());
    }
}

fn run_train(args: &TrainArgs) -> Result<()> {
    let context = kappa_train::RunContext {
        seed: args.seed,
        threads: args.threads,
        device: args.device.0.clone(),
        ..kappa_train::RunContext::default()
    };
    let dir = kappa_experiments::train::run_train_command(
        &args.config,
        &args.set,
        context,
        &args.out,
        args.resume,
    )?;
    eprintln!("train: wrote {}", dir.join("report.md").display());
    Ok(())
}
