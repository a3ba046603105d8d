//! The commands that drive cargo: `test`, `reproduce` and `bench`, each after setup, each with
//! `LIBTORCH` and the runtime library path set.

use std::env;
use std::ffi::OsString;
use std::fs;
use std::process::Command;

use anyhow::{Context, Result};
use clap::Args;

use crate::data::DataSelection;
use crate::setup::{self, Toolchain};
use crate::workspace::{run, Workspace};

/// A `cargo` command in the workspace root that finds libtorch at build and at run time.
///
/// It also sets `OMP_WAIT_POLICY=PASSIVE` unless the caller chose a policy: kappa's processes
/// hold libtorch's OpenMP pool beside OpenBLAS, and on 2 cores OpenMP's spin-waiting threads made
/// a 2-thread training step 2–3× slower than a 1-thread one (measured; see docs/models.md).
fn cargo(ws: &Workspace, tc: &Toolchain) -> Command {
    let program = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(program);
    cmd.current_dir(ws.root());
    if env::var_os("OMP_WAIT_POLICY").is_none() {
        cmd.env("OMP_WAIT_POLICY", "PASSIVE");
    }
    cmd.env("LIBTORCH", &tc.libtorch.dir);
    let mut paths = vec![tc.libtorch.lib_dir()];
    if let Some(existing) = env::var_os("LD_LIBRARY_PATH") {
        paths.extend(env::split_paths(&existing));
    }
    cmd.env(
        "LD_LIBRARY_PATH",
        env::join_paths(paths).expect("library paths contain no separator"),
    );
    cmd
}

/// `cargo xtask test`: setup, then formatting, lints and every test, in the release profile
/// (shared with reproduce and bench so libtorch's C++ wrapper is compiled once).
pub fn test(ws: &Workspace) -> Result<()> {
    let tc = setup::setup(ws, &DataSelection::default())?;
    run(cargo(ws, &tc).args(["fmt", "--all", "--check"]))
        .context("formatting differs; run `cargo fmt --all`")?;
    run(cargo(ws, &tc).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--release",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(cargo(ws, &tc).args(["test", "--workspace", "--release", "--locked"]))?;
    eprintln!("xtask test: formatting, lints and tests all passed");
    Ok(())
}

/// Arguments of `cargo xtask reproduce`.
#[derive(Args)]
pub struct ReproduceArgs {
    /// smoke (seconds, used by tests), cpu (the default: the suite in about an hour on 2 cores),
    /// or paper (the papers' sizes, for a GPU machine).
    #[arg(long, default_value = "cpu")]
    scale: String,
    /// Run only these experiments (repeatable); `--list` shows the names.
    #[arg(long)]
    only: Vec<String>,
    /// Number of seeds per experiment (default: the experiment's own, usually 3).
    #[arg(long)]
    seeds: Option<u32>,
    /// Threads for BLAS and libtorch.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// cpu or cuda (experiments that train models).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// List the experiments and the paper claims they test, then stop.
    #[arg(long)]
    list: bool,
    /// Afterwards, copy the report and its plots into `docs/results/` (tracked by git), so the
    /// repository shows the figures of the last run.
    #[arg(long)]
    publish: bool,
    /// Keep earlier run folders of this scale: skip runs that completed or diverged, continue
    /// interrupted or failed runs from their checkpoints (a changed config is an error).
    #[arg(long)]
    resume: bool,
}

/// `cargo xtask reproduce`: setup, build the experiment runner, install the data it needs, run.
pub fn reproduce(ws: &Workspace, args: &ReproduceArgs) -> Result<()> {
    let tc = setup::setup(ws, &DataSelection::default())?;
    let runner = |extra: &[&str]| {
        let mut cmd = cargo(ws, &tc);
        cmd.args([
            "run",
            "--release",
            "--locked",
            "--quiet",
            "-p",
            "kappa-experiments",
            "--",
        ]);
        cmd.args(extra);
        let threads = args.threads.to_string();
        cmd.env("OPENBLAS_NUM_THREADS", &threads)
            .env("RAYON_NUM_THREADS", &threads);
        cmd
    };
    let mut selection: Vec<String> = Vec::new();
    for name in &args.only {
        selection.extend(["--only".to_string(), name.clone()]);
    }
    let selection: Vec<&str> = selection.iter().map(String::as_str).collect();

    if args.list {
        return run(runner(&["list"]).args(&selection));
    }

    // The runner says which data sets the selected experiments read; setup installs those.
    let needs = runner(&["data-needs"])
        .args(&selection)
        .output()
        .context("could not run the experiment runner")?;
    if !needs.status.success() {
        anyhow::bail!(
            "the experiment runner failed:\n{}",
            String::from_utf8_lossy(&needs.stderr)
        );
    }
    let needs = String::from_utf8_lossy(&needs.stdout);
    let data: DataSelection = needs
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(",")
        .parse()
        .map_err(anyhow::Error::msg)?;
    setup::data_only(ws, &data)?;

    let mut cmd = runner(&["reproduce"]);
    cmd.args(&selection)
        .arg("--scale")
        .arg(&args.scale)
        .arg("--threads")
        .arg(args.threads.to_string())
        .arg("--device")
        .arg(&args.device)
        .arg("--results")
        .arg(ws.results_dir())
        .arg("--data")
        .arg(ws.data_dir());
    if let Some(seeds) = args.seeds {
        cmd.arg("--seeds").arg(seeds.to_string());
    }
    if args.resume {
        cmd.arg("--resume");
    }
    run(&mut cmd)?;
    if args.publish {
        publish(ws)?;
    }
    Ok(())
}

/// Copies `results/report.md` and every PNG it embeds into `docs/results/`, replacing what was
/// there, so links keep working relative to the copied report.
fn publish(ws: &Workspace) -> Result<()> {
    let results = ws.results_dir();
    let docs = ws.root().join("docs/results");
    let report = fs::read_to_string(results.join("report.md")).context("reading the report")?;
    if docs.exists() {
        fs::remove_dir_all(&docs)?;
    }
    fs::create_dir_all(&docs)?;
    for line in report.lines() {
        let Some((_, rest)) = line.strip_prefix("![").and_then(|l| l.split_once("](")) else {
            continue;
        };
        let rel = rest.trim_end_matches(')');
        let target = docs.join(rel);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(results.join(rel), &target).with_context(|| format!("copying {rel}"))?;
    }
    fs::write(docs.join("report.md"), report)?;
    eprintln!(
        "xtask reproduce: published the report to {}",
        docs.display()
    );
    Ok(())
}

/// Arguments of `cargo xtask bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Threads for BLAS and libtorch inside the benchmarks.
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// Run only this benchmark target (linalg, attention, optim, models).
    #[arg(long)]
    bench: Option<String>,
    /// Arguments passed to criterion (a filter, `--quick`, …).
    #[arg(last = true)]
    criterion: Vec<String>,
}

/// `cargo xtask bench`: the criterion benchmarks with a fixed thread count.
pub fn bench(ws: &Workspace, args: &BenchArgs) -> Result<()> {
    let tc = setup::setup(ws, &DataSelection::default())?;
    eprintln!(
        "xtask bench: {} thread(s); nothing else should run on this machine while it measures",
        args.threads
    );
    let threads = args.threads.to_string();
    let mut cmd = cargo(ws, &tc);
    cmd.args(["bench", "--locked", "-p", "kappa-benches"]);
    if let Some(bench) = &args.bench {
        cmd.args(["--bench", bench]);
    }
    run(cmd
        .arg("--")
        .args(&args.criterion)
        .env("KAPPA_BENCH_THREADS", &threads)
        .env("OPENBLAS_NUM_THREADS", &threads)
        .env("RAYON_NUM_THREADS", &threads))
}
