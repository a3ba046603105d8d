//! `cargo xtask reproduce --slurm`: the units of a reproduction as a Slurm job array, and a job
//! that builds the report once the array is done.
//!
//! xtask writes `<results>/slurm/<scale>/`: `units.txt` (one unit id per line, array index i
//! runs line i), `array.sbatch` (resources from the units' costs, preemption signal and requeue)
//! and `report.sbatch`; then submits both with `sbatch` (the report job depends on the array
//! with `afterany`), unless `--dry-run` or Slurm is absent. Every array task runs the built
//! `kappa-experiments` binary itself (so SIGTERM and SIGUSR1 reach the process that trains) with
//! `--unit`; a task that exits 75 (stopped, checkpoint written) is requeued and resumes.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Deserialize;

use crate::reproduce::shell_word;
use crate::workspace::{output_of, run};

/// The environment variable that names the source a run's program was built from
/// (`kappa_train::SOURCE_ENV`, recorded in each run folder's `run.json`).
pub(crate) const SOURCE_ENV: &str = "KAPPA_SOURCE";

/// The Slurm options of `cargo xtask reproduce`.
#[derive(Args, Clone, Debug, Default, PartialEq)]
pub struct SlurmArgs {
    /// Submit to Slurm with sbatch: `reproduce` as a job array over its units (one task per
    /// unit) and a dependent report job; `train` as one job, requeued and resumed when stopped.
    #[arg(long)]
    pub slurm: bool,
    /// Only write the scripts (`<results>/slurm/<scale>/`), do not submit them.
    #[arg(long, requires = "slurm")]
    pub dry_run: bool,
    /// `#SBATCH --partition`.
    #[arg(long, requires = "slurm")]
    pub partition: Option<String>,
    /// `#SBATCH --account`.
    #[arg(long, requires = "slurm")]
    pub account: Option<String>,
    /// `#SBATCH --time` of each task (`reproduce`: by default twice the longest expected unit,
    /// at least 10 min; `train`: by default the cluster's).
    #[arg(long, requires = "slurm", value_name = "D-HH:MM:SS")]
    pub time: Option<String>,
    /// GPUs per task (default: 1 when `--device` is cuda, else 0).
    #[arg(long, requires = "slurm")]
    pub gpus_per_task: Option<u32>,
    /// Any further `#SBATCH` option, e.g. `--sbatch-option=--qos=long` (repeatable).
    #[arg(long = "sbatch-option", requires = "slurm", value_name = "OPTION")]
    pub extra: Vec<String>,
}

/// How many processes train one model (one MPI rank each, started by `srun`): the options
/// `cargo xtask train --slurm` and `cargo xtask reproduce --slurm` share.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct RankArgs {
    /// `#SBATCH --nodes`.
    #[arg(long, requires = "slurm", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub nodes: u32,
    /// `#SBATCH --ntasks-per-node`: ranks per node (each one process with `--threads` threads).
    #[arg(long, requires = "slurm", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub ntasks_per_node: u32,
    /// srun's `--mpi` type for more than one rank: one the MPI library speaks (`pmix` for
    /// Debian's Open MPI, or `pmi2`; `srun --mpi=list` lists them).
    #[arg(long, requires = "slurm", default_value = "pmix", value_name = "TYPE")]
    pub srun_mpi: String,
}

impl Default for RankArgs {
    /// One process.
    fn default() -> Self {
        Self {
            nodes: 1,
            ntasks_per_node: 1,
            srun_mpi: "pmix".into(),
        }
    }
}

impl RankArgs {
    /// The number of ranks.
    pub fn count(&self) -> u32 {
        self.nodes * self.ntasks_per_node
    }

    /// The `#SBATCH` lines of the ranks' layout.
    fn write_layout(&self, s: &mut String) {
        let _ = writeln!(s, "#SBATCH --nodes={}", self.nodes);
        let _ = writeln!(s, "#SBATCH --ntasks-per-node={}", self.ntasks_per_node);
    }

    /// `srun` with the `--mpi` type when there is more than one rank.
    fn srun(&self) -> String {
        match self.count() > 1 {
            true => format!("srun --mpi={}", self.srun_mpi),
            false => "srun".into(),
        }
    }

    /// The `kappa-experiments` feature that joins the ranks on `device`: none for one rank,
    /// `mpi` on the CPU, `nccl` on CUDA (MPI starts the ranks, NCCL exchanges the GPUs' tensors).
    pub fn feature(&self, device: &str) -> Option<&'static str> {
        match (self.count() > 1, device.starts_with("cuda")) {
            (false, _) => None,
            (true, false) => Some("mpi"),
            (true, true) => Some("nccl"),
        }
    }
}

/// The Slurm options of `cargo xtask train`: one model as one Slurm job, on
/// `nodes × ntasks-per-node` processes (MPI ranks through `srun`) when that is above 1.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct TrainSlurmArgs {
    /// `--slurm`, `--dry-run`, `--partition`, `--account`, `--time`, `--gpus-per-task`,
    /// `--sbatch-option`.
    #[command(flatten)]
    pub common: SlurmArgs,
    /// `--nodes`, `--ntasks-per-node`, `--srun-mpi`.
    #[command(flatten)]
    pub ranks: RankArgs,
}

/// What the train job runs: the binary, its library path and `train`'s arguments.
pub struct TrainJob<'a> {
    /// The job's name (the TOML's `name`).
    pub name: &'a str,
    /// The `kappa-experiments` binary the job runs (built with the feature `mpi` for several
    /// ranks).
    pub binary: &'a Path,
    /// libtorch's library folder.
    pub lib_dir: &'a Path,
    /// `train`'s arguments without `--resume` and `--fresh`.
    pub train_args: Vec<String>,
    /// The first attempt's `--resume` or `--fresh`, if the user gave one.
    pub first_attempt: Option<&'static str>,
    /// Threads per rank (`--cpus-per-task`).
    pub threads: usize,
    /// Whether it trains on CUDA.
    pub cuda: bool,
    /// Where the job's log goes (`<job id>.out`, both attempts appended).
    pub logs: PathBuf,
    /// The source the binary was built from (`KAPPA_SOURCE` in its run folders' `run.json`).
    pub source: String,
}

/// The script of a train job: `train` on every rank, `--resume` from the second attempt on,
/// and a requeue when it exits 75 (stopped on request: preemption, or SIGUSR1 two minutes
/// before the time limit).
pub fn train_script(job: &TrainJob<'_>, args: &TrainSlurmArgs) -> String {
    let gpus = args.common.gpus_per_task.unwrap_or(u32::from(job.cuda));
    let mut s = String::from("#!/bin/bash\n");
    let _ = writeln!(s, "#SBATCH --job-name=kappa-train-{}", job.name);
    args.ranks.write_layout(&mut s);
    let _ = writeln!(s, "#SBATCH --cpus-per-task={}", job.threads);
    if let Some(time) = &args.common.time {
        let _ = writeln!(s, "#SBATCH --time={time}");
    }
    if gpus > 0 {
        let _ = writeln!(s, "#SBATCH --gpus-per-task={gpus}");
    }
    requeue_options(&mut s, &format!("{}/%j.out", job.logs.display()));
    common_options(&mut s, &args.common);
    environment(&mut s, job.lib_dir, job.threads, &job.source);
    let _ = writeln!(
        s,
        "attempt=$(( ${{SLURM_RESTART_COUNT:-0}} + 1 ))\necho \"kappa: attempt $attempt\""
    );
    let first = job.first_attempt.unwrap_or("");
    let _ = writeln!(
        s,
        "if [ \"$attempt\" -gt 1 ]; then again=--resume; else again={first}; fi"
    );
    let _ = writeln!(
        s,
        "{} {} train {} $again",
        args.ranks.srun(),
        quote(job.binary),
        job.train_args.join(" ")
    );
    requeue_on_stop(&mut s, "$SLURM_JOB_ID");
    s
}

/// Writes `train.sbatch` into `dir` and submits it unless `dry_run`; the job id when submitted.
pub fn submit_train(dir: &Path, script: &str, dry_run: bool) -> Result<Option<String>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    fs::write(dir.join("train.sbatch"), script)?;
    eprintln!("slurm: wrote {}", dir.join("train.sbatch").display());
    if dry_run {
        return Ok(None);
    }
    if output_of(Command::new("sbatch").arg("--version")).is_none() {
        bail!("sbatch is not on the PATH: run on a Slurm login node, or add --dry-run to only write the script");
    }
    let id = output_of(
        Command::new("sbatch")
            .args(["--parsable", "train.sbatch"])
            .current_dir(dir),
    )
    .context("sbatch train.sbatch failed")?;
    let id = id.trim().split(';').next().unwrap_or_default().to_string();
    eprintln!("slurm: submitted the train job as job {id}");
    Ok(Some(id))
}

/// A unit as `plan.json` lists it (the fields the scripts need).
#[derive(Debug, Deserialize)]
pub struct PlannedUnit {
    /// The unit id.
    pub id: String,
    /// Its expected cost.
    pub cost: PlannedCost,
}

/// A unit's expected cost.
#[derive(Debug, Deserialize)]
pub struct PlannedCost {
    /// Peak memory, GiB.
    pub memory_gib: f64,
    /// Expected wall minutes.
    pub minutes: f64,
}

/// What every task runs, beside the unit: the binary, its library path and its arguments.
pub struct Job<'a> {
    /// The built `kappa-experiments`.
    pub binary: &'a Path,
    /// libtorch's library folder.
    pub lib_dir: &'a Path,
    /// `reproduce` options every task repeats (scale, only, seeds, device, config, sets).
    pub reproduce_args: Vec<String>,
    /// `report` options of the report job.
    pub report_args: Vec<String>,
    /// Threads per task (`--cpus-per-task`).
    pub threads: usize,
    /// Whether the tasks run on CUDA.
    pub cuda: bool,
    /// Where the task and report logs go.
    pub logs: PathBuf,
    /// The source the binary was built from (`KAPPA_SOURCE` in its run folders' `run.json`).
    pub source: String,
}

/// The array script for `units`, each unit on `ranks` processes (one model trained
/// data-parallel when more than one).
pub fn array_script(
    units: &[PlannedUnit],
    job: &Job<'_>,
    args: &SlurmArgs,
    ranks: &RankArgs,
) -> String {
    let longest = units.iter().map(|u| u.cost.minutes).fold(0.0, f64::max);
    let memory = units.iter().map(|u| u.cost.memory_gib).fold(0.0, f64::max);
    let time = args
        .time
        .clone()
        .unwrap_or_else(|| slurm_time(2.0 * longest));
    let gpus = args.gpus_per_task.unwrap_or(u32::from(job.cuda));
    let mut s = String::from("#!/bin/bash\n");
    let _ = writeln!(s, "#SBATCH --job-name=kappa-units");
    let _ = writeln!(s, "#SBATCH --array=1-{}", units.len());
    let _ = writeln!(s, "#SBATCH --time={time}");
    if ranks.count() > 1 {
        ranks.write_layout(&mut s);
    }
    let _ = writeln!(s, "#SBATCH --cpus-per-task={}", job.threads);
    // Per node: each rank holds the whole model.
    let per_node = f64::from(ranks.ntasks_per_node);
    let _ = writeln!(
        s,
        "#SBATCH --mem={}G",
        (1.5 * memory * per_node).ceil().max(1.0)
    );
    if gpus > 0 {
        let _ = writeln!(s, "#SBATCH --gpus-per-task={gpus}");
    }
    requeue_options(&mut s, &format!("{}/%A_%a.out", job.logs.display()));
    common_options(&mut s, args);
    let _ = writeln!(
        s,
        "# One unit per task: line $SLURM_ARRAY_TASK_ID of units.txt. SIGTERM (preemption) or\n\
         # SIGUSR1 (120 s before the time limit) make the unit checkpoint and exit 75; the task is\n\
         # then requeued, and the unit resumes from its checkpoint."
    );
    let _ = writeln!(
        s,
        "cd {}",
        quote(job.logs.parent().unwrap_or(Path::new(".")))
    );
    let _ = writeln!(s, "unit=$(sed -n \"${{SLURM_ARRAY_TASK_ID}}p\" units.txt)");
    environment(&mut s, job.lib_dir, job.threads, &job.source);
    let _ = writeln!(
        s,
        "{} {} reproduce {} --unit \"$unit\"",
        ranks.srun(),
        quote(job.binary),
        job.reproduce_args.join(" ")
    );
    requeue_on_stop(&mut s, "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}");
    s
}

/// A job that can be stopped and requeued: SIGUSR1 two minutes before the time limit (kappa
/// checkpoints and exits 75 on it, as on preemption's SIGTERM), requeueable, its log at
/// `output` appended to by every attempt so that all stay readable.
fn requeue_options(s: &mut String, output: &str) {
    let _ = writeln!(s, "#SBATCH --signal=USR1@120");
    let _ = writeln!(s, "#SBATCH --requeue");
    let _ = writeln!(s, "#SBATCH --output={output}");
    let _ = writeln!(s, "#SBATCH --open-mode=append");
}

/// libtorch's libraries, the BLAS and rayon thread counts of a task, and the source the
/// binary was built from.
fn environment(s: &mut String, lib_dir: &Path, threads: usize, source: &str) {
    let _ = writeln!(s, "export LD_LIBRARY_PATH={}", quote(lib_dir));
    let _ = writeln!(
        s,
        "export OPENBLAS_NUM_THREADS={threads} RAYON_NUM_THREADS={threads}"
    );
    let _ = writeln!(s, "export {}={}", SOURCE_ENV, shell_word(source));
}

/// The script's end: requeue `job` (a shell word) when the step exited 75 (stopped on request,
/// checkpoint written), and exit with the step's status.
fn requeue_on_stop(s: &mut String, job: &str) {
    let _ = write!(
        s,
        "status=$?\nif [ \"$status\" -eq {} ]; then\n    scontrol requeue \"{job}\"\nfi\n\
         exit \"$status\"\n",
        kappa_cli::REQUEUE_EXIT_CODE
    );
}

/// The report job's script (submitted with a dependency on the array).
pub fn report_script(job: &Job<'_>, args: &SlurmArgs) -> String {
    let mut s =
        String::from("#!/bin/bash\n#SBATCH --job-name=kappa-report\n#SBATCH --time=30:00\n");
    let _ = writeln!(s, "#SBATCH --cpus-per-task=1\n#SBATCH --mem=4G");
    let _ = writeln!(s, "#SBATCH --output={}/report.out", job.logs.display());
    common_options(&mut s, args);
    let _ = writeln!(s, "export LD_LIBRARY_PATH={}", quote(job.lib_dir));
    let _ = writeln!(
        s,
        "{} report {}",
        quote(job.binary),
        job.report_args.join(" ")
    );
    s
}

fn common_options(s: &mut String, args: &SlurmArgs) {
    for (key, value) in [("partition", &args.partition), ("account", &args.account)] {
        if let Some(value) = value {
            let _ = writeln!(s, "#SBATCH --{key}={value}");
        }
    }
    for option in &args.extra {
        let _ = writeln!(s, "#SBATCH {option}");
    }
}

/// Minutes as Slurm's `D-HH:MM:SS`, at least 10 minutes, rounded up to a minute.
pub fn slurm_time(minutes: f64) -> String {
    let total = minutes.max(10.0).ceil() as u64;
    format!(
        "{}-{:02}:{:02}:00",
        total / 1440,
        total % 1440 / 60,
        total % 60
    )
}

/// A path as a single-quoted shell word.
fn quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// Writes `units.txt` and the two scripts into `dir`; submits them unless `dry_run` (or
/// without `sbatch` on the PATH, which is an error then). Returns the array's job id when
/// submitted.
pub fn write_and_submit(
    dir: &Path,
    units: &[PlannedUnit],
    job: &Job<'_>,
    args: &SlurmArgs,
    ranks: &RankArgs,
) -> Result<Option<String>> {
    if units.is_empty() {
        bail!("the plan has no units");
    }
    fs::create_dir_all(&job.logs).with_context(|| format!("creating {}", job.logs.display()))?;
    let ids: String = units.iter().map(|u| format!("{}\n", u.id)).collect();
    fs::write(dir.join("units.txt"), ids)?;
    fs::write(
        dir.join("array.sbatch"),
        array_script(units, job, args, ranks),
    )?;
    fs::write(dir.join("report.sbatch"), report_script(job, args))?;
    eprintln!("slurm: wrote {} ({} units)", dir.display(), units.len());
    if args.dry_run {
        return Ok(None);
    }
    if output_of(Command::new("sbatch").arg("--version")).is_none() {
        bail!("sbatch is not on the PATH: run on a Slurm login node, or add --dry-run to only write the scripts");
    }
    let array = output_of(
        Command::new("sbatch")
            .arg("--parsable")
            .arg("array.sbatch")
            .current_dir(dir),
    )
    .context("sbatch array.sbatch failed")?;
    let array = array
        .trim()
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    run(Command::new("sbatch")
        .arg(format!("--dependency=afterany:{array}"))
        .arg("report.sbatch")
        .current_dir(dir))?;
    eprintln!("slurm: submitted the array as job {array} and its report job after it");
    Ok(Some(array))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units() -> Vec<PlannedUnit> {
        [
            "theory/cpu/seed-0",
            "gpt-sotu/cpu/seed-0",
            "gpt-sotu/cpu/seed-1",
        ]
        .iter()
        .zip([0.8, 2.3, 2.3])
        .map(|(id, minutes)| PlannedUnit {
            id: id.to_string(),
            cost: PlannedCost {
                memory_gib: 1.0,
                minutes,
            },
        })
        .collect()
    }

    fn job<'a>(binary: &'a Path, lib: &'a Path, cuda: bool) -> Job<'a> {
        Job {
            binary,
            lib_dir: lib,
            reproduce_args: vec!["--scale".into(), "cpu".into()],
            report_args: vec!["--scale".into(), "cpu".into()],
            threads: 2,
            cuda,
            logs: PathBuf::from("/scratch/results/slurm/cpu/logs"),
            source: "0123456789ab with uncommitted changes".into(),
        }
    }

    #[test]
    fn the_array_has_one_task_per_unit_and_requeues_a_stopped_one() {
        let (bin, lib) = (Path::new("/k/kappa-experiments"), Path::new("/t/lib"));
        let args = SlurmArgs {
            slurm: true,
            partition: Some("gpu".into()),
            extra: vec!["--qos=long".into()],
            ..SlurmArgs::default()
        };
        let script = array_script(&units(), &job(bin, lib, false), &args, &RankArgs::default());
        for line in [
            "#SBATCH --array=1-3",
            "#SBATCH --time=0-00:10:00",
            "#SBATCH --cpus-per-task=2",
            "#SBATCH --mem=2G",
            "#SBATCH --signal=USR1@120",
            "#SBATCH --requeue",
            "#SBATCH --open-mode=append",
            "#SBATCH --partition=gpu",
            "#SBATCH --qos=long",
            "srun '/k/kappa-experiments' reproduce --scale cpu --unit \"$unit\"",
            "if [ \"$status\" -eq 75 ]; then",
        ] {
            assert!(script.contains(line), "no `{line}` in\n{script}");
        }
        assert!(!script.contains("--gpus-per-task") && !script.contains("--ntasks-per-node"));
        let ranks = RankArgs {
            ntasks_per_node: 2,
            ..RankArgs::default()
        };
        let on_ranks = array_script(&units(), &job(bin, lib, false), &args, &ranks);
        for line in [
            "#SBATCH --nodes=1",
            "#SBATCH --ntasks-per-node=2",
            "#SBATCH --mem=3G",
            "srun --mpi=pmix '/k/kappa-experiments' reproduce --scale cpu --unit \"$unit\"",
        ] {
            assert!(on_ranks.contains(line), "no `{line}` in\n{on_ranks}");
        }
        assert_eq!(
            (ranks.feature("cuda"), ranks.feature("cpu")),
            (Some("nccl"), Some("mpi"))
        );
        assert_eq!(RankArgs::default().feature("cuda"), None);
        let cuda = array_script(&units(), &job(bin, lib, true), &args, &RankArgs::default());
        assert!(cuda.contains("#SBATCH --gpus-per-task=1"));
        let report = report_script(&job(bin, lib, false), &args);
        assert!(report.contains("'/k/kappa-experiments' report --scale cpu"));
    }

    #[test]
    fn a_train_job_runs_its_ranks_through_srun_and_resumes_when_requeued() {
        let (bin, lib) = (Path::new("/k/kappa-experiments"), Path::new("/t/lib"));
        let job = |first_attempt, cuda| TrainJob {
            name: "tiny",
            binary: bin,
            lib_dir: lib,
            train_args: vec!["--config".into(), "/j/job.toml".into()],
            first_attempt,
            threads: 4,
            cuda,
            logs: PathBuf::from("/runs/slurm/tiny/logs"),
            source: "0123456789ab".into(),
        };
        let parse = |argv: &[&str]| {
            #[derive(clap::Parser)]
            struct Cli {
                #[command(flatten)]
                slurm: TrainSlurmArgs,
            }
            let argv = std::iter::once("xtask").chain(argv.iter().copied());
            <Cli as clap::Parser>::try_parse_from(argv).map(|c| c.slurm)
        };
        let ranks = parse(&["--slurm", "--nodes", "2", "--ntasks-per-node", "4"]).unwrap();
        assert_eq!(ranks.ranks.count(), 8);
        let script = train_script(&job(Some("--fresh"), true), &ranks);
        for line in [
            "#SBATCH --job-name=kappa-train-tiny",
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=4",
            "#SBATCH --cpus-per-task=4",
            "#SBATCH --gpus-per-task=1",
            "#SBATCH --requeue",
            "#SBATCH --signal=USR1@120",
            "#SBATCH --output=/runs/slurm/tiny/logs/%j.out",
            "export OPENBLAS_NUM_THREADS=4 RAYON_NUM_THREADS=4",
            "export KAPPA_SOURCE=0123456789ab",
            "if [ \"$attempt\" -gt 1 ]; then again=--resume; else again=--fresh; fi",
            "srun --mpi=pmix '/k/kappa-experiments' train --config /j/job.toml $again",
            "if [ \"$status\" -eq 75 ]; then",
        ] {
            assert!(script.contains(line), "no `{line}` in\n{script}");
        }
        assert!(
            !script.contains("--time"),
            "the cluster's default time applies"
        );
        let one = parse(&["--slurm", "--srun-mpi", "pmi2", "--time", "1:00:00"]).unwrap();
        let script = train_script(&job(None, false), &one);
        assert!(
            script.contains("srun '/k/kappa-experiments' train"),
            "{script}"
        );
        assert!(script.contains("#SBATCH --time=1:00:00") && !script.contains("gpus"));
        assert!(parse(&["--slurm", "--nodes", "0"]).is_err());
        assert!(parse(&["--ntasks-per-node", "2"]).is_err(), "needs --slurm");
    }

    #[test]
    fn times_are_slurm_durations_of_whole_minutes() {
        assert_eq!(slurm_time(0.5), "0-00:10:00");
        assert_eq!(slurm_time(61.2), "0-01:02:00");
        assert_eq!(slurm_time(2.0 * 5600.0), "7-18:40:00");
    }

    #[test]
    fn a_dry_run_writes_the_unit_list_and_both_scripts() {
        let dir = std::env::temp_dir().join(format!("xtask-slurm-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let (bin, lib) = (Path::new("/k/kappa-experiments"), Path::new("/t/lib"));
        let mut job = job(bin, lib, false);
        job.logs = dir.join("logs");
        let args = SlurmArgs {
            slurm: true,
            dry_run: true,
            ..SlurmArgs::default()
        };
        assert_eq!(
            write_and_submit(&dir, &units(), &job, &args, &RankArgs::default()).unwrap(),
            None
        );
        let ids = fs::read_to_string(dir.join("units.txt")).unwrap();
        assert_eq!(
            ids,
            "theory/cpu/seed-0\ngpt-sotu/cpu/seed-0\ngpt-sotu/cpu/seed-1\n"
        );
        assert!(dir.join("array.sbatch").is_file() && dir.join("report.sbatch").is_file());
        assert!(dir.join("logs").is_dir());
        fs::remove_dir_all(&dir).unwrap();
    }
}
