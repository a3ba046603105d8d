//! `cargo xtask test`'s MPI checks: kappa-dist's MPI backend and one model trained over
//! `mpirun`, on loopback, each command under a timeout.
//!
//! Installs Debian's Open MPI and libclang (rsmpi's bindings are generated at build time) when
//! they are missing (as root) and builds what `cargo xtask test` builds: the workspace's tests
//! with [`TEST_FEATURES`](crate::cargo::TEST_FEATURES), a build that also makes the binary and
//! kappa-dist's `mpi_check` example (after the tests, it is up to date already). Then:
//!
//! 1. `mpi_check collectives` on 2 and 3 ranks: every collective gives the bits of the threads
//!    backend (kappa-dist's `examples/mpi_check.rs`);
//! 2. `mpi_check kill`: a rank killed with SIGKILL mid-run ends the job, non-zero, naming the
//!    signal; `mpi_check leave`: a rank that drops its communicator ends the job, non-zero;
//!    `mpi_check stall`: a rank that sleeps instead of reaching a collective makes the other fail
//!    with a timeout, which ends the job, non-zero, within a minute;
//! 3. `train` on 2 ranks gives the metrics and checkpoint of the same job on 1 process, bit for
//!    bit (the job's `micro_batch_size` makes 2 parts of every batch on both);
//! 4. a 2-rank `train` stopped with SIGUSR1 (forwarded by `mpirun`) resumes on 1 process to the
//!    same metrics;
//! 5. the binary started alone with `SLURM_NTASKS=2` (as a wrong `srun --mpi` type starts it)
//!    stops with an error naming the counts;
//! 6. `reproduce --unit` of the manifolds study's smoke unit on 2 ranks gives the metrics and
//!    checkpoints of the same unit on 1 process (2 micro-batches on both), and a unit of an
//!    experiment that trains no model (theory) is refused on 2 ranks.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::cargo::{cargo, WORKSPACE_TESTS};
use crate::setup::Toolchain;
use crate::workspace::{describe, output_of, run, Workspace};

const PACKAGES: [&str; 3] = ["openmpi-bin", "libopenmpi-dev", "libclang-dev"];

/// `mpirun` on loopback only, with more ranks than cores allowed.
const MPIRUN: [&str; 9] = [
    "--oversubscribe",
    "--mca",
    "btl",
    "self,tcp",
    "--mca",
    "btl_tcp_if_include",
    "lo",
    "--mca",
    "oob_tcp_if_include",
];

/// The longest any one command of these checks may take.
const TIMEOUT: Duration = Duration::from_secs(180);

/// The MPI checks, after the rest of `cargo xtask test`.
pub fn test(ws: &Workspace, tc: &Toolchain) -> Result<()> {
    let started = Instant::now();
    install()?;
    // One build for the tests and these checks: other features or `-p` would build the
    // dependency graph again with other features (minutes), for the same code.
    run(cargo(ws, tc).args(WORKSPACE_TESTS).arg("--no-run"))?;
    let release = ws.target_dir().join("release");
    let scratch = scratch();
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch)?;
    let checked = collectives(ws, tc, &release.join("examples/mpi_check"))
        .and_then(|()| train(ws, tc, &release.join("kappa-experiments"), &scratch))
        .and_then(|()| reproduce(ws, tc, &release.join("kappa-experiments"), &scratch));
    if checked.is_ok() {
        let _ = fs::remove_dir_all(&scratch);
    }
    checked?;
    eprintln!(
        "xtask test: MPI checks passed ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Installs Open MPI and libclang from the system's packages when one is missing.
pub(crate) fn install() -> Result<()> {
    let installed = |p: &str| {
        output_of(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
            .is_some_and(|s| s.contains("install ok installed"))
    };
    if PACKAGES.iter().all(|p| installed(p)) {
        return Ok(());
    }
    run(Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(PACKAGES)
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .context(
        "the MPI checks need Open MPI and libclang: installing them needs root and Debian's \
         packages (apt-get install openmpi-bin libopenmpi-dev libclang-dev)",
    )
}

/// The collectives on 2 and 3 ranks, a killed rank, a rank that leaves and a rank that stalls.
fn collectives(ws: &Workspace, tc: &Toolchain, check: &Path) -> Result<()> {
    for np in [2, 3] {
        let (status, out) = mpirun(ws, tc, np, check.as_os_str(), &["collectives"])?;
        let agreed = out.matches("equal the threads backend's").count();
        ensure!(
            status.success() && agreed == np,
            "mpi_check collectives on {np} ranks ({status}):\n{out}"
        );
    }
    let (status, out) = mpirun(ws, tc, 2, check.as_os_str(), &["kill"])?;
    ensure!(
        !status.success() && out.contains("signal 9"),
        "a rank killed with SIGKILL did not end the job with an error ({status}):\n{out}"
    );
    let (status, out) = mpirun(ws, tc, 2, check.as_os_str(), &["leave"])?;
    ensure!(
        !status.success() && out.contains("without Mpi::finalize"),
        "a rank that dropped its communicator did not end the job ({status}):\n{out}"
    );
    // The stalled rank sleeps two minutes; the job must end well before, within the group's
    // 2 s timeout plus start-up and MPI_Abort.
    let start = Instant::now();
    let (status, out) = mpirun(ws, tc, 2, check.as_os_str(), &["stall"])?;
    let took = start.elapsed();
    ensure!(
        !status.success()
            && out.contains("did not take part within the timeout")
            && took < Duration::from_secs(60),
        "a stalled rank did not end the job through the others' timeout ({status}, {:.0} s):\n{out}",
        took.as_secs_f64()
    );
    Ok(())
}

/// `cmd` under [`TIMEOUT`], its output (stdout and stderr) to `log`; the exit status and the
/// output. A command past the timeout is killed and is an error.
fn with_timeout(cmd: &mut Command, log: &Path) -> Result<(ExitStatus, String)> {
    let child = spawn_logged(cmd, log)?;
    wait_bounded(child, Instant::now(), &describe(cmd), log)
}

/// Starts `cmd` with its output (stdout and stderr) to `log`.
fn spawn_logged(cmd: &mut Command, log: &Path) -> Result<Child> {
    let line = describe(cmd);
    eprintln!("$ {line}");
    let file = fs::File::create(log)?;
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    cmd.spawn()
        .with_context(|| format!("could not start `{line}`"))
}

/// Waits for `child` (started at `start`) until [`TIMEOUT`]; its status and `log`'s output. A
/// child past the timeout is killed and is an error.
fn wait_bounded(
    mut child: Child,
    start: Instant,
    line: &str,
    log: &Path,
) -> Result<(ExitStatus, String)> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok((status, fs::read_to_string(log).unwrap_or_default()));
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            let out = fs::read_to_string(log).unwrap_or_default();
            bail!("`{line}` did not end within {TIMEOUT:?}:\n{out}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `mpirun -np N program args…` on loopback (as root where need be) under [`TIMEOUT`].
fn mpirun(
    ws: &Workspace,
    tc: &Toolchain,
    np: usize,
    program: &std::ffi::OsStr,
    args: &[&str],
) -> Result<(ExitStatus, String)> {
    let mut cmd = mpirun_command(ws, tc, np, program, args);
    with_timeout(&mut cmd, &log_file(np, args))
}

fn mpirun_command(
    ws: &Workspace,
    tc: &Toolchain,
    np: usize,
    program: &std::ffi::OsStr,
    args: &[&str],
) -> Command {
    let mut cmd = Command::new("mpirun");
    crate::cargo::with_toolchain(&mut cmd, ws, tc);
    cmd.args(MPIRUN)
        .args(["lo", "-np", &np.to_string()])
        .arg(program)
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .current_dir(ws.root());
    cmd
}

/// The folder of the checks' files (removed when they pass).
fn scratch() -> PathBuf {
    std::env::temp_dir().join(format!("kappa-mpi-{}", std::process::id()))
}

/// The output of a command of `np` processes whose first argument is `args[0]`.
fn log_file(np: usize, args: &[&str]) -> PathBuf {
    let what = args.first().copied().unwrap_or("run").replace('/', "-");
    scratch().join(format!("{what}-{np}.log"))
}

/// kappa's tiny GPT job (`crates/experiments/tests/fixtures/tiny_gpt.toml`, which
/// `train_command.rs` runs as it is).
const TINY_GPT: &str = include_str!("../../crates/experiments/tests/fixtures/tiny_gpt.toml");

/// The tiny GPT job for seconds of training on several ranks: 200 steps of 4 sequences cut into
/// 2 micro-batches, module-wise Muon (sharded over the ranks), a checkpoint every 5 steps.
fn job() -> Result<String> {
    let mut job: toml_edit::DocumentMut = TINY_GPT.parse().context("tiny_gpt.toml")?;
    let train = &mut job["train"];
    for (key, value) in [
        ("steps", 200),
        ("micro_batch_size", 2),
        ("eval_every", 100),
        ("checkpoint_every", 5),
    ] {
        train[key] = toml_edit::value(value);
    }
    let mut optimizer = toml_edit::Table::new();
    optimizer["kind"] = toml_edit::value("modulewise");
    optimizer["preset"] = toml_edit::value("HETERO");
    job["optimizer"] = toml_edit::Item::Table(optimizer);
    Ok(job.to_string())
}

/// Writes [`job`] (`job.toml`, named `tiny-gpt`) and its text into `dir`; the job's path.
pub(crate) fn write_job(dir: &Path) -> Result<PathBuf> {
    let text: String = (0..60)
        .map(|i| format!("The state of the union is strong in year {i}. "))
        .collect();
    fs::write(dir.join("input.txt"), text)?;
    let path = dir.join("job.toml");
    fs::write(&path, job()?)?;
    Ok(path)
}

/// `train` on 2 ranks against 1 process, a 2-rank run resumed on 1 process, and the refusal of
/// a world that differs from `SLURM_NTASKS`.
fn train(ws: &Workspace, tc: &Toolchain, binary: &Path, dir: &Path) -> Result<()> {
    let job = write_job(dir)?;
    let train_args = |out: &Path| -> Vec<String> {
        let (job, out) = (job.display().to_string(), out.display().to_string());
        let args = ["train", "--config", &job, "--out", &out, "--threads", "1"];
        args.iter().map(|s| s.to_string()).collect()
    };
    let one = |out: &Path, extra: &[&str]| -> Result<()> {
        let mut cmd = Command::new(binary);
        crate::cargo::with_toolchain(&mut cmd, ws, tc);
        cmd.args(train_args(out)).args(extra);
        let (status, log) = with_timeout(&mut cmd, &log_file(1, &["train"]))?;
        ensure!(status.success(), "{} ({status}):\n{log}", describe(&cmd));
        Ok(())
    };
    let (ranks, single, resumed) = (dir.join("ranks"), dir.join("single"), dir.join("resumed"));
    let args = train_args(&ranks);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, out) = mpirun(ws, tc, 2, binary.as_os_str(), &args)?;
    ensure!(status.success(), "train on 2 ranks ({status}):\n{out}");
    one(&single, &[])?;
    let run = |root: &Path| root.join("tiny-gpt");
    ensure!(
        crate::slurm_test::metrics(&run(&ranks))? == crate::slurm_test::metrics(&run(&single))?,
        "train on 2 ranks: the metrics differ from the same job's on 1 process"
    );
    let checkpoint = |root: &Path| fs::read(run(root).join("variant-0/checkpoint.safetensors"));
    ensure!(
        checkpoint(&ranks)? == checkpoint(&single)?,
        "train on 2 ranks: the checkpoint differs from the same job's on 1 process"
    );
    stop_on_two_ranks(ws, tc, binary, &train_args(&resumed), &run(&resumed))?;
    one(&resumed, &["--resume"])?;
    ensure!(
        crate::slurm_test::metrics(&run(&resumed))? == crate::slurm_test::metrics(&run(&single))?,
        "a 2-rank run resumed on 1 process: the metrics differ from the uninterrupted run's"
    );
    let mut alone = Command::new(binary);
    crate::cargo::with_toolchain(&mut alone, ws, tc);
    alone
        .args(train_args(&dir.join("alone")))
        .env("SLURM_NTASKS", "2");
    let (status, out) = with_timeout(&mut alone, &log_file(1, &["alone"]))?;
    ensure!(
        !status.success() && out.contains("world of 1") && out.contains("SLURM_NTASKS=2"),
        "a process alone with SLURM_NTASKS=2 was not refused ({status}):\n{out}"
    );
    Ok(())
}

/// `reproduce --unit manifolds/smoke/seed-0` on 2 ranks against 1 process, on a small text in
/// the place of the SOTU addresses; a theory unit refused on 2 ranks.
fn reproduce(ws: &Workspace, tc: &Toolchain, binary: &Path, dir: &Path) -> Result<()> {
    let data = dir.join("data");
    let sotu = data.join("sotu");
    fs::create_dir_all(&sotu)?;
    let text = |n: usize| -> String {
        (0..n)
            .map(|i| format!("The state of the union is strong in year {i}. "))
            .collect()
    };
    fs::write(sotu.join("train.txt"), text(400))?;
    fs::write(sotu.join("val.txt"), text(100))?;
    let args = |unit: &str, results: &Path| -> Vec<String> {
        let experiment = unit.split('/').next().unwrap_or(unit);
        let words = [
            "reproduce",
            "--scale",
            "smoke",
            "--only",
            experiment,
            "--unit",
            unit,
        ];
        let mut args: Vec<String> = words.iter().map(|s| s.to_string()).collect();
        args.extend(["--threads", "1"].map(String::from));
        if experiment == "manifolds" {
            args.extend(["--set", "train.micro_batch_size=2"].map(String::from));
        }
        args.extend(["--data".into(), data.display().to_string()]);
        args.extend(["--results".into(), results.display().to_string()]);
        args
    };
    let unit = "manifolds/smoke/seed-0";
    let (ranks, single) = (dir.join("reproduce-ranks"), dir.join("reproduce-single"));
    let on_ranks = args(unit, &ranks);
    let on_ranks: Vec<&str> = on_ranks.iter().map(String::as_str).collect();
    let (status, out) = mpirun(ws, tc, 2, binary.as_os_str(), &on_ranks)?;
    ensure!(
        status.success(),
        "reproduce --unit on 2 ranks ({status}):\n{out}"
    );
    let mut one = Command::new(binary);
    crate::cargo::with_toolchain(&mut one, ws, tc);
    one.args(args(unit, &single));
    let (status, out) = with_timeout(&mut one, &log_file(1, &["reproduce"]))?;
    ensure!(status.success(), "{} ({status}):\n{out}", describe(&one));
    let run = |root: &Path| root.join(unit);
    ensure!(
        crate::slurm_test::metrics(&run(&ranks))? == crate::slurm_test::metrics(&run(&single))?,
        "reproduce --unit {unit} on 2 ranks: the metrics differ from the unit's on 1 process"
    );
    for variant in ["variant-0", "variant-2"] {
        let checkpoint =
            |root: &Path| fs::read(run(root).join(variant).join("checkpoint.safetensors"));
        ensure!(
            checkpoint(&ranks)? == checkpoint(&single)?,
            "reproduce --unit {unit} on 2 ranks: {variant}'s checkpoint differs from 1 process's"
        );
    }
    let theory = args("theory/smoke/seed-0", &dir.join("reproduce-theory"));
    let theory: Vec<&str> = theory.iter().map(String::as_str).collect();
    let (status, out) = mpirun(ws, tc, 2, binary.as_os_str(), &theory)?;
    ensure!(
        !status.success() && out.contains("trains no model that ranks can share"),
        "a theory unit on 2 ranks was not refused ({status}):\n{out}"
    );
    Ok(())
}

/// Starts `train` on 2 ranks and sends `mpirun` SIGUSR1 (which it forwards to the ranks, whose
/// stop flag it raises) once 5 records are logged; the ranks stop after one step, rank 0 with a
/// checkpoint, and every rank exits 75 (stopped, `--resume` continues it).
fn stop_on_two_ranks(
    ws: &Workspace,
    tc: &Toolchain,
    binary: &Path,
    args: &[String],
    run: &Path,
) -> Result<()> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let log = log_file(2, &["stopped"]);
    let mut cmd = mpirun_command(ws, tc, 2, binary.as_os_str(), &args);
    let start = Instant::now();
    let mut child = spawn_logged(&mut cmd, &log)?;
    let metrics = run.join("metrics.jsonl");
    let lines = || fs::read_to_string(&metrics).map_or(0, |t| t.lines().count());
    while lines() < 5 && start.elapsed() < TIMEOUT && child.try_wait()?.is_none() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-USR1", &pid]).status();
    let (status, out) = wait_bounded(child, start, &describe(&cmd), &log)?;
    ensure!(
        status.code() == Some(i32::from(kappa_cli::REQUEUE_EXIT_CODE))
            && out.contains("interrupted after step"),
        "the 2-rank run was not stopped by SIGUSR1 with exit status {} ({status}):\n{out}",
        kappa_cli::REQUEUE_EXIT_CODE
    );
    Ok(())
}
