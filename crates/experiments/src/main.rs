//! The `kappa-experiments` binary, normally started by `cargo xtask reproduce`.
//!
//! - `kappa-experiments list [--only NAME]…` names the experiments and the claims they test.
//! - `kappa-experiments data-needs [--only NAME]…` prints the data sets they read.
//! - `kappa-experiments reproduce --scale S --results DIR --data DIR [--only NAME]… [--seeds N]
//!   [--resume]` runs them and writes `DIR/report.md`; `--resume` keeps finished runs and
//!   continues interrupted ones instead of starting over.
//! - `kappa-experiments report --scale S --results DIR` rebuilds the report from run folders.
//! - `kappa-experiments blas` says which BLAS kernel the process runs and how it was chosen.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use kappa_experiments::runner::{report, reproduce, select, Settings};
use kappa_experiments::Scale;

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
    only: Vec<String>,
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
        selection: Selection,
        /// smoke, cpu or paper.
        #[arg(long, default_value = "cpu")]
        scale: Scale,
        /// Seeds per experiment (default: each experiment's own).
        #[arg(long)]
        seeds: Option<u32>,
        /// BLAS and libtorch threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// cpu, cuda or cuda:N.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// The results folder.
        #[arg(long, default_value = "results")]
        results: PathBuf,
        /// The data folder that `cargo xtask setup` fills.
        #[arg(long, default_value = "data")]
        data: PathBuf,
        /// Keep the run folders already there: skip runs that completed or diverged, continue
        /// interrupted or failed ones from their checkpoints; a changed config is an error.
        #[arg(long)]
        resume: bool,
    },
    /// Say which BLAS kernel this process runs, how it was chosen, and whether it is a generic
    /// fallback (what every run's `run.json` records).
    Blas,
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
        Command::List(selection) => {
            for e in select(&selection.only)? {
                println!("{:<16} {}", e.name(), e.claim());
            }
        }
        Command::DataNeeds(selection) => {
            let needs: BTreeSet<&str> = select(&selection.only)?
                .iter()
                .flat_map(|e| e.data_needs().iter().copied())
                .collect();
            for need in needs {
                println!("{need}");
            }
        }
        Command::Reproduce {
            selection,
            scale,
            seeds,
            threads,
            device,
            results,
            data,
            resume,
        } => {
            let experiments = select(&selection.only)?;
            let settings = Settings {
                scale,
                seeds,
                threads,
                device: &device,
                results: &results,
                data: &data,
                resume,
            };
            reproduce(&experiments, &settings)?;
            report(scale, &results)?;
        }
        Command::Report { scale, results } => report(scale, &results)?,
    }
    Ok(())
}
