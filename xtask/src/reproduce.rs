//! `cargo xtask reproduce`: check the command line, set up, build the experiment runner, install
//! the data it needs, run it.
//!
//! The options are kappa-cli's [`ReproduceArgs`], the same struct the `kappa-experiments` binary
//! parses, so a typo in `--scale`, `--only`, `--device` or `--set` fails here in milliseconds.
//! `--config FILE` is checked here too before any install or build — that it exists, is TOML,
//! and names one experiment (`--only` or its `experiment` key) — and its keys and values in the
//! binary, before any run. xtask then forwards exactly what it parsed
//! ([`ReproduceArgs::to_args`]); the binary writes the report and, with `--publish`, splices it
//! into `docs/results/` (`docs/results/<scale>/` at a scale other than `cpu`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use kappa_cli::{config_experiment, ExperimentName, ReportArgs, ReproduceArgs};

use crate::slurm::{write_and_submit, Job, PlannedUnit, RankArgs, SlurmArgs};

use crate::cargo::cargo;
use crate::data::DataSelection;
use crate::setup;
use crate::workspace::{run, Workspace};

/// `cargo xtask reproduce`.
pub fn reproduce(ws: &Workspace, args: &ReproduceArgs) -> Result<()> {
    let (args, selection) = check(args)?;
    let tc = setup::setup(ws, &DataSelection::default())?;
    let runner = |extra: &[&str]| {
        let mut cmd = experiments_binary(ws, &tc, args.threads);
        cmd.args(extra);
        cmd
    };
    let mut forwarded = runner(&["reproduce"]);
    forwarded
        .args(args.to_args())
        .arg("--results")
        .arg(ws.results_dir())
        .arg("--data")
        .arg(ws.data_dir())
        .arg("--docs")
        .arg(ws.root().join("docs/results"));
    if args.list {
        return run(&mut forwarded);
    }

    setup::data_only(ws, &data_needs(ws, &tc, &args, &selection)?)?;
    crate::workspace::leave_ctrl_c_to_the_child()?;
    run(&mut forwarded)
}

/// The data sets the selected experiments read at the scale (the runner says; setup installs
/// them).
fn data_needs(
    ws: &Workspace,
    tc: &setup::Toolchain,
    args: &ReproduceArgs,
    selection: &[ExperimentName],
) -> Result<DataSelection> {
    let mut needs = experiments_binary(ws, tc, args.threads);
    needs.args(["data-needs", "--scale", args.scale.name()]);
    for name in selection {
        needs.args(["--only", &name.0]);
    }
    let needs = needs
        .output()
        .context("could not run the experiment runner")?;
    if !needs.status.success() {
        bail!(
            "the experiment runner failed:\n{}",
            String::from_utf8_lossy(&needs.stderr)
        );
    }
    String::from_utf8_lossy(&needs.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(",")
        .parse()
        .map_err(anyhow::Error::msg)
}

/// `cargo xtask reproduce --slurm`: setup and data, the runner built once (with the feature
/// `mpi` when each unit runs on several `ranks`, `nccl` on CUDA), its plan, then the job array
/// over the plan's units and the report job ([`crate::slurm`]).
pub fn slurm(
    ws: &Workspace,
    args: &ReproduceArgs,
    slurm: &SlurmArgs,
    ranks: &RankArgs,
) -> Result<()> {
    let (args, selection) = check(args)?;
    if args.list || args.plan || !args.unit.is_empty() {
        bail!("--slurm runs the whole plan: drop --list, --plan and --unit");
    }
    let tc = setup::setup(ws, &DataSelection::default())?;
    setup::data_only(ws, &data_needs(ws, &tc, &args, &selection)?)?;
    let binary = slurm_binary(ws, &tc, ranks.feature(&args.device.0))?;
    let (results, data) = (ws.results_dir(), ws.data_dir());
    let task_args = ReproduceArgs {
        resume: false,
        publish: false,
        ..args.clone()
    };
    let places = |mut v: Vec<String>| {
        v.extend(["--results".into(), results.display().to_string()]);
        v.extend(["--data".into(), data.display().to_string()]);
        v
    };
    let mut plan = experiments_binary(ws, &tc, args.threads);
    plan.arg("reproduce")
        .args(task_args.to_args())
        .arg("--plan");
    plan.args(places(Vec::new()));
    run(&mut plan)?;
    let plan_path = results.join("plan.json");
    let text = fs::read_to_string(&plan_path).with_context(|| plan_path.display().to_string())?;
    let units: Vec<PlannedUnit> = serde_json::from_str(&text).context("reading plan.json")?;
    let dir = results.join("slurm").join(args.scale.name());
    let lib_dir = tc.libtorch.lib_dir();
    let words = |v: Vec<std::ffi::OsString>| -> Vec<String> {
        v.into_iter()
            .map(|a| shell_word(&a.to_string_lossy()))
            .collect()
    };
    let report = ReportArgs {
        scale: args.scale,
        results: vec![results.clone()],
        out: None,
        only: args.only.clone(),
        seeds: args.seeds,
    };
    let job = Job {
        binary: &binary,
        lib_dir: &lib_dir,
        reproduce_args: places(words(task_args.to_args())),
        report_args: words(report.to_args()),
        threads: args.threads,
        cuda: args.device.0.starts_with("cuda"),
        logs: dir.join("logs"),
        source: crate::publish::source(ws),
    };
    write_and_submit(&dir, &units, &job, slurm, ranks)?;
    Ok(())
}

/// The variable naming a `kappa-experiments` binary that xtask runs instead of building one:
/// `reproduce`, `train`, `report` and the scripts of `--slurm` then use it as it is (a binary
/// built elsewhere, or with other features; `--slurm` over several ranks needs one built with
/// `mpi`). `cargo xtask test --slurm` sets it to the binary the tests built.
pub const BINARY_ENV: &str = "KAPPA_EXPERIMENTS_BINARY";

/// The binary [`BINARY_ENV`] names, where it is set.
fn prebuilt() -> Option<PathBuf> {
    prebuilt_from(std::env::var_os(BINARY_ENV))
}

/// [`prebuilt`] from the variable's value: none when unset or empty, otherwise the path made
/// absolute (the binary may be started from another folder than the user's).
fn prebuilt_from(value: Option<std::ffi::OsString>) -> Option<PathBuf> {
    let binary = value.filter(|v| !v.is_empty())?;
    Some(std::path::absolute(&binary).unwrap_or_else(|_| PathBuf::from(binary)))
}

/// The runner that `--slurm`'s scripts start: [`prebuilt`] where it is set, otherwise built
/// (with `feature` where one is given, installing Open MPI where it is missing).
pub(crate) fn slurm_binary(
    ws: &Workspace,
    tc: &setup::Toolchain,
    feature: Option<&str>,
) -> Result<PathBuf> {
    if let Some(binary) = prebuilt() {
        return existing(binary);
    }
    let mut build = cargo(ws, tc);
    build.args(["build", "--release", "--locked", "-p", "kappa-experiments"]);
    if let Some(feature) = feature {
        crate::mpi_test::install()?;
        build.args(["--features", feature]);
    }
    run(&mut build)?;
    Ok(ws.target_dir().join("release").join("kappa-experiments"))
}

/// `binary` where it is a file, else an error naming [`BINARY_ENV`].
fn existing(binary: PathBuf) -> Result<PathBuf> {
    ensure!(
        binary.is_file(),
        "{BINARY_ENV}={}: no such file",
        binary.display()
    );
    Ok(binary)
}

/// `s` as one shell word (single-quoted when it has anything but safe characters).
pub(crate) fn shell_word(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./:=,".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `cargo xtask report`: the binary's `report` over the given results folders (the workspace's
/// `results/` when none is given), relative paths taken from where xtask was started.
pub fn report(ws: &Workspace, args: &ReportArgs) -> Result<()> {
    let absolute = |p: &Path| std::path::absolute(p).with_context(|| p.display().to_string());
    let mut args = args.clone();
    args.results = if args.results.is_empty() {
        vec![ws.results_dir()]
    } else {
        args.results
            .iter()
            .map(|p| absolute(p))
            .collect::<Result<_>>()?
    };
    args.out = args.out.as_deref().map(absolute).transpose()?;
    let tc = setup::setup(ws, &DataSelection::default())?;
    let mut cmd = experiments_binary(ws, &tc, 1);
    cmd.arg("report").args(args.to_args());
    run(&mut cmd)
}

/// `cargo run` of the `kappa-experiments` binary (built in release, with the lock file), or the
/// binary [`BINARY_ENV`] names, with its BLAS and rayon pools at `threads`; the subcommand and
/// its options follow.
pub fn experiments_binary(ws: &Workspace, tc: &setup::Toolchain, threads: usize) -> Command {
    let mut cmd = match prebuilt() {
        Some(binary) => {
            let mut cmd = Command::new(binary);
            cmd.current_dir(ws.root());
            crate::cargo::with_toolchain(&mut cmd, ws, tc);
            cmd
        }
        None => {
            let mut cmd = cargo(ws, tc);
            let run = ["run", "--release", "--locked", "--quiet"];
            cmd.args(run).args(["-p", "kappa-experiments", "--"]);
            cmd
        }
    };
    let threads = threads.to_string();
    cmd.env("OPENBLAS_NUM_THREADS", &threads)
        .env("RAYON_NUM_THREADS", &threads)
        .env(crate::slurm::SOURCE_ENV, crate::publish::source(ws));
    cmd
}

/// What can be checked before setup beyond parsing: a `--config` file exists, is TOML, and
/// configures one experiment. Returns the arguments to forward (the file's path made absolute,
/// since the runner starts in the workspace root) and the selected experiments.
fn check(args: &ReproduceArgs) -> Result<(ReproduceArgs, Vec<ExperimentName>)> {
    let Some(path) = &args.config else {
        return Ok((args.clone(), args.only.clone()));
    };
    let absolute = path
        .canonicalize()
        .with_context(|| format!("--config {}", path.display()))?;
    let name = config_file_experiment(path, &args.only)?;
    let forwarded = ReproduceArgs {
        config: Some(absolute),
        ..args.clone()
    };
    Ok((forwarded, vec![name]))
}

/// The experiment the TOML file at `path` configures ([`config_experiment`]).
fn config_file_experiment(path: &Path, only: &[ExperimentName]) -> Result<ExperimentName> {
    let text = crate::workspace::read_config_text(path)?;
    let table: toml::Table = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: not valid TOML: {e}", path.display()))?;
    let key = match table.get("experiment") {
        None => None,
        Some(toml::Value::String(name)) => Some(name.as_str()),
        Some(other) => bail!(
            "{}: experiment: expected a string, found {other}",
            path.display()
        ),
    };
    config_experiment(only, key)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("--config {}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn scratch(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-config-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        fs::write(&path, text).unwrap();
        path
    }

    fn checked(args: &[&str]) -> Result<(ReproduceArgs, Vec<ExperimentName>), String> {
        let args: ReproduceArgs =
            kappa_cli::parse_args(args.iter().copied()).map_err(|e| e.to_string())?;
        check(&args).map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn a_config_file_is_checked_before_setup() {
        let good = scratch("good.toml", "experiment = \"theory\"\nbound_trials = 3\n");
        let (forwarded, selection) = checked(&["--config", good.to_str().unwrap()]).unwrap();
        assert_eq!(selection, [ExperimentName("theory".into())]);
        assert!(forwarded.config.unwrap().is_absolute());

        let err = checked(&["--config", "/no/such/file.toml"]).unwrap_err();
        assert!(err.contains("--config /no/such/file.toml"), "{err}");
        let bad = scratch("bad.toml", "experiment = \"theory\"\nbound_trials = \n");
        let err = checked(&["--config", bad.to_str().unwrap()]).unwrap_err();
        assert!(
            err.contains("bad.toml: not valid TOML") && err.contains("line 2"),
            "{err}"
        );
        let err =
            checked(&["--config", good.to_str().unwrap(), "--only", "manifolds"]).unwrap_err();
        assert!(
            err.contains("--only manifolds but the config file says"),
            "{err}"
        );
        let anonymous = scratch("anonymous.toml", "bound_trials = 3\n");
        let err = checked(&["--config", anonymous.to_str().unwrap()]).unwrap_err();
        assert!(err.contains("--config needs the experiment"), "{err}");
    }

    #[test]
    fn without_a_config_file_the_selection_is_only() {
        let (forwarded, selection) = checked(&["--only", "theory", "--set", "a.b=1"]).unwrap();
        assert_eq!(selection, [ExperimentName("theory".into())]);
        assert_eq!(forwarded.set[0].key, "a.b");
        assert!(checked(&["--only", "theroy"]).is_err());
    }

    #[test]
    fn a_named_binary_is_made_absolute_and_must_exist() {
        assert_eq!(prebuilt_from(None), None);
        assert_eq!(prebuilt_from(Some("".into())), None);
        let named = prebuilt_from(Some("bin/kappa-experiments".into())).unwrap();
        assert!(named.is_absolute() && named.ends_with("bin/kappa-experiments"));
        let err = existing(PathBuf::from("/no/such/binary")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "KAPPA_EXPERIMENTS_BINARY=/no/such/binary: no such file"
        );
        let this = std::env::current_exe().unwrap();
        assert_eq!(existing(this.clone()).unwrap(), this);
    }
}
