//! `cargo xtask`: the one place in kappa that knows about installs, files and processes.
//!
//! - `cargo xtask setup [--data LIST]` installs what the build and the experiments need
//!   (OpenBLAS, libtorch through PyPI's torch, the data sets), idempotently.
//! - `cargo xtask test` runs setup, then `fmt --check`, `clippy -D warnings` and the whole test
//!   suite. This is the README's test command and what CI runs.
//! - `cargo xtask reproduce [--scale S] [--only NAME]… [--resume]` runs the experiments and
//!   writes `results/report.md`; `--resume` keeps finished runs and continues interrupted ones.
//! - `cargo xtask bench [--threads N]` runs the criterion benchmarks.
//!
//! Every cargo call made from here gets `LIBTORCH` and the runtime library path, so nobody has
//! to export anything by hand.

mod cargo;
mod data;
mod setup;
mod tidy;
mod torch;
mod workspace;

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
    /// Setup, then `cargo fmt --check`, `cargo clippy -D warnings` and `cargo test` (release).
    Test,
    /// Run the experiments and write `results/report.md`.
    Reproduce(cargo::ReproduceArgs),
    /// Run the criterion benchmarks (nothing else should run on the machine meanwhile).
    Bench(cargo::BenchArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let ws = Workspace::locate()?;
    match cli.command {
        Command::Setup { data } => {
            setup::setup(&ws, &data)?;
        }
        Command::Test => cargo::test(&ws)?,
        Command::Reproduce(args) => cargo::reproduce(&ws, &args)?,
        Command::Bench(args) => cargo::bench(&ws, &args)?,
    }
    Ok(())
}
