//! The `kappa-experiments` binary, normally started by `cargo xtask reproduce`.
//!
//! - `kappa-experiments list [--only NAME]…` names the experiments and the claims they test.
//! - `kappa-experiments data-needs [--only NAME]…` prints the data sets they read.
//! - `kappa-experiments reproduce [OPTIONS] [--results DIR] [--data DIR] [--docs DIR]` runs
//!   them and writes `DIR/report.md`. The options are kappa-cli's [`ReproduceArgs`], the very
//!   ones `cargo xtask reproduce` parses and forwards: `--scale`, `--only`, `--seeds`,
//!   `--threads`, `--device`, `--config FILE`, `--set KEY=VALUE`, `--resume`, `--publish` (into
//!   `--docs`, default `docs/results`), `--list`.
//! - `kappa-experiments report --scale S [--results DIR]… [--out DIR]` builds the report from
//!   run folders, merging several results folders and naming missing or failed units.
//! - `kappa-experiments train --config FILE [--set KEY=VALUE]… [--seed N] [--threads N]
//!   [--device D] [--out DIR] [--resume]` trains one model on a user's data (kappa-cli's
//!   [`TrainArgs`]; see `kappa_experiments::train`). Built with the feature `mpi`, `mpirun -np N
//!   kappa-experiments train …` trains one model on N ranks (`kappa_experiments::ranks`).
//! - `kappa-experiments blas` says which BLAS kernel the process runs and how it was chosen, and
//!   which code path libtorch's MKL takes.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kappa_cli::{config_experiment, ExperimentName, ReportArgs, ReproduceArgs, Scale, TrainArgs};
use kappa_experiments::config::ConfigSource;
use kappa_experiments::publish::publish;
use kappa_experiments::runner::{
    plan_of, report, reproduce, resolve_configs, select, select_at, Preempted, Settings,
};
use kappa_experiments::units::{render, unit_ids};
use kappa_experiments::RegisteredExperiment;
use kappa_train::StopFlag;

// libtorch's MKL chooses its kernels by the CPU's features, not its vendor (AVX-512 on AMD CPUs
// that have it; `kappa_linalg::mkl`). Exported by `build.rs`.
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

// Rust's allocations on mimalloc, which keeps freed pages for reuse (glibc returns N×N
// temporaries to the kernel; docs/architecture.md, "The memory allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Without `--only`: the experiments that have this scale (all but a few have every one).
    #[arg(long)]
    scale: Option<Scale>,
}

impl Selection {
    fn experiments(&self) -> Result<Vec<Box<dyn RegisteredExperiment>>> {
        match self.scale {
            Some(scale) => select_at(&names(&self.only), scale),
            None => select(&names(&self.only)),
        }
    }
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
    /// Where `--publish` puts the report: this folder for the `cpu` scale, its `<scale>/`
    /// subfolder for the others (a published report holds one scale).
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
    /// Build the report from run folders: one results folder, or several written by different
    /// machines (merged). Units of the plan without a run folder, and failed runs, are named in
    /// the report; the command still succeeds.
    Report(ReportArgs),
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<Preempted>().is_some() => {
            eprintln!("reproduce: {e}");
            std::process::ExitCode::from(Preempted::EXIT_CODE)
        }
        Err(e) if e.is::<kappa_experiments::train::TrainStopped>() => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(kappa_cli::REQUEUE_EXIT_CODE)
        }
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
    // Before anything uses rayon: its workers pinned when they are one per CPU
    // (`KAPPA_PIN_THREADS` overrides; docs/architecture.md, "Where rayon's workers run").
    let pinning = kappa_linalg::threads::Pinning::from_env();
    kappa_linalg::threads::init_global_pool(0, pinning)?;
    let blas = kappa_linalg::blas_report();
    if blas.is_generic_fallback() {
        eprintln!("kappa-experiments: {blas}");
    }
    match cli.command {
        Command::Blas => {
            println!("{blas}");
            #[cfg(target_os = "linux")]
            println!("{}", kappa_linalg::mkl::mkl_dispatch());
        }
        Command::List(selection) => list(&selection.experiments()?),
        Command::DataNeeds(selection) => {
            let needs: BTreeSet<&str> = selection
                .experiments()?
                .iter()
                .flat_map(|e| e.data_needs().iter().copied())
                .collect();
            for need in needs {
                println!("{need}");
            }
        }
        Command::Reproduce { args, places } => run_reproduce(&args, &places)?,
        Command::Report(args) => {
            let results = if args.results.is_empty() {
                vec![PathBuf::from("results")]
            } else {
                args.results.clone()
            };
            let expected = unit_ids(
                &select_at(&names(&args.only), args.scale)?,
                args.scale,
                args.seeds,
            );
            let out = args.out.clone().unwrap_or_else(|| results[0].clone());
            let coverage = report(args.scale, &results, &out, &expected)?;
            for (what, ids) in [("missing", &coverage.missing), ("failed", &coverage.failed)] {
                if !ids.is_empty() {
                    eprintln!("report: {} {what}: {}", ids.len(), ids.join(", "));
                }
            }
        }
        Command::Train(args) => run_train(&args)?,
    }
    Ok(())
}

/// `reproduce`: resolve every config, run, write the report, and publish it when asked. Under
/// `mpirun -np N`, or `srun` with N tasks (a build with the feature `mpi`; `nccl` for
/// `--device cuda`), this process is one of N ranks that train each unit named by `--unit`
/// together.
fn run_reproduce(args: &ReproduceArgs, places: &Places) -> Result<()> {
    let ranks = kappa_experiments::ranks::Ranks::join(&args.device.0)?;
    let comm = ranks.communicator();
    let result = ranks
        .device(&args.device.0)
        .and_then(|device| reproduce_on(args, places, &device, comm));
    ranks.end(result)
}

fn reproduce_on(
    args: &ReproduceArgs,
    places: &Places,
    device: &str,
    ranks: std::sync::Arc<dyn kappa_dist::Communicator>,
) -> Result<()> {
    let experiments = select_at(&selected(args)?, args.scale)?;
    if args.list {
        list(&experiments);
        return Ok(());
    }
    let stop = StopFlag::default();
    stop.raise_on_signals()
        .context("installing the SIGINT/SIGTERM/SIGUSR1 handlers")?;
    let settings = Settings {
        scale: args.scale,
        seeds: args.seeds,
        threads: args.threads,
        device,
        results: &places.results,
        data: &places.data,
        resume: args.resume,
        fresh: args.fresh,
        config: args.config.as_deref(),
        sets: &args.set,
        units: &args.unit,
        stop: stop.clone(),
        ranks,
    };
    if args.plan {
        return write_plan(&experiments, &settings);
    }
    exit_after_grace(&stop);
    let failed = reproduce(&experiments, &settings)?;
    let failures = || anyhow::anyhow!("{} run(s) failed:\n{}", failed.len(), failed.join("\n"));
    if !args.unit.is_empty() {
        return match failed.is_empty() {
            true => Ok(()),
            false => Err(failures()),
        };
    }
    let expected = unit_ids(&experiments, args.scale, args.seeds);
    let sources = std::slice::from_ref(&places.results);
    let coverage = match report(args.scale, sources, &places.results, &expected) {
        Ok(coverage) => coverage,
        // No report without run folders: the failures are what to say.
        Err(_) if !failed.is_empty() => return Err(failures()),
        Err(e) => return Err(e),
    };
    if !coverage.failed.is_empty() {
        anyhow::bail!(
            "{} run(s) failed (see run.json in each): {}",
            coverage.failed.len(),
            coverage.failed.join(", ")
        );
    }
    if args.publish {
        let ran: Vec<&str> = experiments.iter().map(|e| e.name()).collect();
        let docs = match args.scale {
            Scale::Cpu => places.docs.clone(),
            other => places.docs.join(other.name()),
        };
        publish(&places.results, &docs, &ran)?;
        eprintln!(
            "reproduce: published {} into {}",
            ran.join(", "),
            docs.display()
        );
    }
    Ok(())
}

/// `reproduce --plan`: the units, printed and written to `<results>/plan.json`.
fn write_plan(
    experiments: &[Box<dyn RegisteredExperiment>],
    settings: &Settings<'_>,
) -> Result<()> {
    let configs = resolve_configs(experiments, settings)?;
    let units = plan_of(experiments, &configs, settings)?;
    print!("{}", render(&units));
    std::fs::create_dir_all(settings.results)?;
    let path = settings.results.join("plan.json");
    std::fs::write(&path, serde_json::to_string_pretty(&units)?)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("plan: wrote {}", path.display());
    Ok(())
}

/// Once `stop` is raised, gives the running unit `KAPPA_STOP_GRACE_SECONDS` (default 60) to
/// checkpoint and return, then exits with [`Preempted::EXIT_CODE`] anyway: an experiment that
/// does not train through kappa-train's trainer does not look at the flag, and its unit reruns
/// from the start (its folder lacks `run.json`, so `--resume` and `--unit` restart it).
fn exit_after_grace(stop: &StopFlag) {
    let grace = std::env::var("KAPPA_STOP_GRACE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60.0);
    let stop = stop.clone();
    std::thread::spawn(move || {
        while !stop.is_raised() {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(grace));
        eprintln!("reproduce: stop requested {grace} s ago; exiting without waiting for the unit");
        std::process::exit(i32::from(Preempted::EXIT_CODE));
    });
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
    use kappa_experiments::train::Existing;
    let stop = StopFlag::default();
    stop.raise_on_signals()
        .context("installing the SIGINT/SIGTERM/SIGUSR1 handlers")?;
    // Under `mpirun -np N` (a build with the feature `mpi`; `nccl` for `--device cuda`) this
    // process is one of N ranks.
    let ranks = kappa_experiments::ranks::Ranks::join(&args.device.0)?;
    let comm = ranks.communicator();
    let rank = comm.rank();
    let existing = match (args.resume, args.fresh) {
        (true, _) => Existing::Resume,
        (_, true) => Existing::StartOver,
        _ => Existing::Refuse,
    };
    // Every failure from here on goes through `ranks.end`, which prints it with the rank.
    let dir = ranks.device(&args.device.0).and_then(|device| {
        let context = kappa_train::RunContext {
            seed: args.seed,
            threads: args.threads,
            device,
            stop,
            ..kappa_train::RunContext::default()
        };
        kappa_experiments::train::run_train_ranks(
            &args.config,
            &args.set,
            context,
            &args.out,
            existing,
            comm,
        )
    });
    let dir = ranks.end(dir)?;
    if rank == 0 {
        eprintln!("train: wrote {}", dir.join("report.md").display());
    }
    Ok(())
}
