//! `cargo xtask test --slurm`: the Slurm path against a real Slurm, on loopback.
//!
//! Installs Debian's Slurm and munge when they are missing (as root), starts a one-node cluster
//! whose config, keys, spool and state live in a temporary folder (munge on its own socket,
//! slurmctld and slurmd on private ports, bound to 127.0.0.1), and then:
//!
//! 1. runs a small sweep (gpt-sotu at the smoke scale, 2 seeds, 300 steps) with a plain
//!    `reproduce`, the uninterrupted reference;
//! 2. submits the same sweep with `reproduce --slurm` (a job array and its report job);
//! 3. sends SIGTERM to the first task's unit mid-run (`scancel --signal=TERM`), which
//!    checkpoints, exits 75 and requeues itself;
//! 4. waits (bounded) until the queue is empty, and checks that the requeued unit resumed,
//!    that every unit's `metrics.jsonl` equals the reference's (timings and `resumed_at`
//!    aside), and that the report job wrote a report that misses nothing.
//!
//! 5. submits a job with `cargo xtask train --slurm --ntasks-per-node 2` (2 MPI ranks through
//!    `srun --mpi=pmix`), stops it with SIGUSR1 mid-run (`scancel --signal=USR1`): it exits 75
//!    and requeues itself, and the second attempt resumes; the metrics and checkpoint must equal
//!    the same job's on one process.
//!
//! Every step runs the binary that `cargo xtask test` built (its tests' build, with the feature
//! `mpi`; built here when missing), named to xtask by [`BINARY_ENV`]: a build with other
//! features would compile the dependency graph again, for the same code.
//!
//! The daemons are stopped and the folder removed however the test ends.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::cargo::{cargo, WORKSPACE_TESTS};
use crate::reproduce::BINARY_ENV;
use crate::setup::Toolchain;
use crate::workspace::{output_of, run, Workspace};

const PACKAGES: [&str; 4] = ["slurmctld", "slurmd", "slurm-client", "munge"];
const SWEEP: [&str; 14] = [
    "--scale",
    "smoke",
    "--only",
    "gpt-sotu",
    "--seeds",
    "2",
    "--threads",
    "1",
    "--set",
    "train.steps=300",
    "--set",
    "train.log_every=1",
    "--set",
    "train.eval_every=100",
];
const TIMEOUT: Duration = Duration::from_secs(900);

/// `cargo xtask test --slurm`.
pub fn test(ws: &Workspace, tc: &Toolchain) -> Result<()> {
    install()?;
    crate::mpi_test::install()?;
    run(cargo(ws, tc).args(WORKSPACE_TESTS).arg("--no-run"))?;
    let binary = ws.target_dir().join("release").join("kappa-experiments");
    let xtask = |args: &[&str]| -> Result<Command> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(args)
            .env(BINARY_ENV, &binary)
            .current_dir(ws.root());
        Ok(cmd)
    };
    let root = std::env::temp_dir().join(format!("kappa-slurm-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let cluster = Cluster::start(&root.join("cluster"))?;
    let outcome =
        sweep(&xtask, &root, &cluster).and_then(|()| ranks_job(&xtask, ws, tc, &root, &cluster));
    drop(cluster);
    if outcome.is_ok() {
        let _ = fs::remove_dir_all(&root);
    }
    outcome?;
    eprintln!(
        "xtask test --slurm: the array ran, the preempted unit requeued and resumed exactly, \
         and so did a 2-task train job"
    );
    Ok(())
}

/// An `xtask` command (this program) with these arguments, on the tests' binary.
type Xtask<'a> = dyn Fn(&[&str]) -> Result<Command> + 'a;

fn sweep(xtask: &Xtask, root: &Path, cluster: &Cluster) -> Result<()> {
    let (plain, slurm) = (root.join("plain"), root.join("slurm"));
    run(xtask(&["reproduce"])?
        .args(SWEEP)
        .env("KAPPA_RESULTS", &plain))?;
    run(xtask(&["reproduce", "--slurm"])?
        .args(SWEEP)
        .env("KAPPA_RESULTS", &slurm)
        .env("SLURM_CONF", &cluster.conf))?;
    let unit = "gpt-sotu/smoke/seed-0";
    wait_for(&slurm.join(unit).join("metrics.jsonl"), 5)?;
    let array = cluster.output(&["squeue", "-h", "-n", "kappa-units", "-o", "%F"])?;
    let array = array
        .lines()
        .next()
        .context("the array is not in the queue")?
        .trim();
    run(cluster
        .command("scancel")
        .args(["--signal=TERM", &format!("{array}_1")]))?;
    cluster.wait_until_idle()?;
    let log = fs::read_to_string(
        slurm
            .join("slurm/smoke/logs")
            .join(format!("{array}_1.out")),
    )?;
    ensure!(
        log.contains("stopped on request") && log.contains("resumed"),
        "task 1 was not stopped and resumed:\n{log}"
    );
    for seed in 0..2 {
        let unit = format!("gpt-sotu/smoke/seed-{seed}");
        ensure!(
            metrics(&slurm.join(&unit))? == metrics(&plain.join(&unit))?,
            "{unit}: the Slurm run's metrics differ from the uninterrupted run's"
        );
    }
    let report =
        fs::read_to_string(slurm.join("report.md")).context("the report job wrote no report")?;
    ensure!(
        report.contains("## gpt-sotu") && !report.contains("**Missing units**"),
        "the report is incomplete:\n{report}"
    );
    Ok(())
}

/// Steps of the 2-task job: enough that SIGUSR1 arrives mid-run.
const RANKS_STEPS: &str = "train.steps=600";

/// `cargo xtask train --slurm --ntasks-per-node 2` (`srun --mpi=pmix`), stopped with SIGUSR1,
/// requeued and resumed, against the same job on one process.
fn ranks_job(
    xtask: &Xtask,
    ws: &Workspace,
    tc: &Toolchain,
    root: &Path,
    cluster: &Cluster,
) -> Result<()> {
    let dir = root.join("ranks");
    fs::create_dir_all(&dir)?;
    let job = crate::mpi_test::write_job(&dir)?;
    let slurm = dir.join("slurm");
    run(
        xtask(&["train", "--threads", "1", "--set", RANKS_STEPS, "--config"])?
            .arg(&job)
            .arg("--out")
            .arg(&slurm)
            .env("SLURM_CONF", &cluster.conf)
            .args(["--slurm", "--ntasks-per-node", "2"]),
    )?;
    let slurm_run = slurm.join("tiny-gpt");
    wait_for(&slurm_run.join("metrics.jsonl"), 5)?;
    let id = cluster.output(&["squeue", "-h", "-n", "kappa-train-tiny-gpt", "-o", "%i"])?;
    let id = id
        .lines()
        .next()
        .context("the train job is not in the queue")?
        .trim()
        .to_string();
    run(cluster.command("scancel").args(["--signal=USR1", &id]))?;
    cluster.wait_until_idle()?;
    let log_path = slurm.join("slurm/tiny-gpt/logs").join(format!("{id}.out"));
    let log = fs::read_to_string(&log_path).with_context(|| log_path.display().to_string())?;
    ensure!(
        log.contains("interrupted after step")
            && log.contains("attempt 2")
            && log.contains("train: wrote"),
        "the 2-task job was not stopped, requeued and finished:\n{log}"
    );
    // The reference: the same job on one process, here (the binary `--slurm` built for MPI
    // runs alone as a world of one).
    let single = dir.join("single");
    let binary = submitted_binary(&slurm.join("slurm/tiny-gpt"))?;
    let mut alone = Command::new(&binary);
    crate::cargo::with_toolchain(&mut alone, ws, tc);
    run(alone
        .args(["train", "--threads", "1", "--set", RANKS_STEPS, "--config"])
        .arg(&job)
        .arg("--out")
        .arg(&single))?;
    let single_run = single.join("tiny-gpt");
    ensure!(
        metrics(&slurm_run)? == metrics(&single_run)?,
        "the 2-task Slurm job's metrics differ from the same job's on one process"
    );
    let checkpoint = |run: &Path| fs::read(run.join("variant-0/checkpoint.safetensors"));
    ensure!(
        checkpoint(&slurm_run)? == checkpoint(&single_run)?,
        "the 2-task Slurm job's checkpoint differs from the same job's on one process"
    );
    Ok(())
}

/// `metrics.jsonl` of a run folder without what measures time or says where a run resumed.
pub(crate) fn metrics(dir: &Path) -> Result<Vec<serde_json::Value>> {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.retain(|k, _| !k.contains("second") && k != "resumed_at");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let path = dir.join("metrics.jsonl");
    let text = fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    text.lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l)?;
            strip(&mut v);
            Ok(v)
        })
        .collect()
}

/// Waits until `path` has at least `lines` lines.
fn wait_for(path: &Path, lines: usize) -> Result<()> {
    let start = Instant::now();
    while fs::read_to_string(path).map_or(0, |t| t.lines().count()) < lines {
        ensure!(
            start.elapsed() < TIMEOUT,
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Installs Slurm and munge from the system's packages when a program is missing.
fn install() -> Result<()> {
    let missing = ["slurmctld", "slurmd", "sbatch", "munged"]
        .iter()
        .any(|p| output_of(Command::new("which").arg(p)).is_none());
    if !missing {
        return Ok(());
    }
    run(Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(PACKAGES)
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .context("installing Slurm needs root and Debian's packages (apt-get install slurmctld slurmd slurm-client munge)")
}

/// A one-node Slurm on loopback, stopped on drop.
struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
    daemons: Vec<Child>,
}

impl Cluster {
    fn start(dir: &Path) -> Result<Self> {
        let munge = dir.join("munge");
        fs::create_dir_all(&munge)?;
        for sub in ["state", "spool"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        let mut key = vec![0u8; 1024];
        std::io::Read::read_exact(&mut fs::File::open("/dev/urandom")?, &mut key)?;
        let key_file = munge.join("munge.key");
        fs::write(&key_file, key)?;
        run(Command::new("chmod").arg("400").arg(&key_file))?;
        let host = output_of(Command::new("hostname").arg("-s"))
            .context("hostname")?
            .trim()
            .to_string();
        let conf = dir.join("slurm.conf");
        fs::write(&conf, slurm_conf(dir, &host))?;
        let mut cluster = Self {
            dir: dir.to_path_buf(),
            conf,
            daemons: Vec::new(),
        };
        let socket = munge.join("sock");
        cluster.spawn(Command::new("munged").arg("-F").arg("-f").args([
            format!("--key-file={}", key_file.display()),
            format!("--socket={}", socket.display()),
            format!("--pid-file={}", munge.join("pid").display()),
            format!("--log-file={}", munge.join("log").display()),
            format!("--seed-file={}", munge.join("seed").display()),
        ]))?;
        std::thread::sleep(Duration::from_millis(500));
        let conf = cluster.conf.clone();
        cluster.spawn(Command::new("slurmctld").arg("-D").arg("-f").arg(&conf))?;
        cluster.spawn(Command::new("slurmd").arg("-D").arg("-f").arg(&conf))?;
        let start = Instant::now();
        while !cluster
            .output(&["sinfo", "-h", "-o", "%T"])?
            .contains("idle")
        {
            ensure!(
                start.elapsed() < Duration::from_secs(60),
                "the node never became idle"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(cluster)
    }

    fn spawn(&mut self, cmd: &mut Command) -> Result<()> {
        let child = cmd
            .env("SLURM_CONF", &self.conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("starting {:?}", cmd.get_program()))?;
        self.daemons.push(child);
        Ok(())
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", &self.conf);
        cmd
    }

    fn output(&self, argv: &[&str]) -> Result<String> {
        let out = self.command(argv[0]).args(&argv[1..]).output()?;
        if !out.status.success() {
            bail!("{argv:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits until no job is queued or running.
    fn wait_until_idle(&self) -> Result<()> {
        let start = Instant::now();
        while !self.output(&["squeue", "-h"])?.trim().is_empty() {
            ensure!(
                start.elapsed() < TIMEOUT,
                "jobs still queued after {} s (logs in {})",
                TIMEOUT.as_secs(),
                self.dir.display()
            );
            std::thread::sleep(Duration::from_secs(1));
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for daemon in self.daemons.iter_mut().rev() {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
    }
}

/// slurm.conf of a one-node cluster on 127.0.0.1 with everything under `dir`.
fn slurm_conf(dir: &Path, host: &str) -> String {
    let d = dir.display();
    format!(
        "ClusterName=kappatest\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort=16817\n\
         SlurmdPort=16818\nAuthType=auth/munge\nAuthInfo=socket={d}/munge/sock\n\
         CredType=cred/munge\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
         SlurmUser=root\nSlurmdUser=root\nStateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
         SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
         SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
         SchedulerType=sched/backfill\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
         ReturnToService=2\nMpiDefault=none\nJobRequeue=1\n\
         NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=8000 State=UNKNOWN\n\
         PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP\n"
    )
}

/// The binary `train --slurm` copied into `dir` (`kappa-experiments-<hash>`), the only one.
fn submitted_binary(dir: &Path) -> Result<PathBuf> {
    let copies: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| dir.display().to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            (p.file_name().and_then(|n| n.to_str()))
                .is_some_and(|n| n.starts_with("kappa-experiments-"))
        })
        .collect();
    match copies.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "expected one copy of the binary in {}, found {copies:?}",
            dir.display()
        ),
    }
}
