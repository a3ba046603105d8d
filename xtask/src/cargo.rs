//! The commands that drive cargo: `test` and `bench` (and, through [`cargo`], `reproduce`), each
//! after setup, each with `LIBTORCH` and the runtime library path set.

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
/// It leaves OpenMP's wait policy to the caller: with libtorch's GEMMs on libtorch's own MKL (one
/// OpenMP pool for a training step), OpenMP's default spin-then-sleep beats the passive policy
/// at two threads (`benches/benches/step_env.rs` measures both; docs/architecture.md).
pub(crate) fn cargo(ws: &Workspace, tc: &Toolchain) -> Command {
    let program = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(program);
    cmd.current_dir(ws.root());
    with_toolchain(&mut cmd, ws, tc);
    cmd
}

/// Sets what a build of the workspace needs on `cmd`: `LIBTORCH`, the runtime library path, and
/// (when the venv has one) the venv's interpreter as pyo3's `PYO3_PYTHON`, so every build of
/// the Python package's crate (cargo's and maturin's) sees one interpreter and none rebuilds
/// another's.
pub(crate) fn with_toolchain(cmd: &mut Command, ws: &Workspace, tc: &Toolchain) {
    cmd.env("LIBTORCH", &tc.libtorch.dir);
    let mut paths = vec![tc.libtorch.lib_dir()];
    if let Some(existing) = env::var_os("LD_LIBRARY_PATH") {
        paths.extend(env::split_paths(&existing));
    }
    cmd.env(
        "LD_LIBRARY_PATH",
        env::join_paths(paths).expect("library paths contain no separator"),
    );
    let python = crate::python::python(ws);
    if python.exists() {
        cmd.env("PYO3_PYTHON", python);
    }
}

/// Arguments of `cargo xtask test`.
#[derive(Args)]
pub struct TestArgs {
    /// Hunt for counterexamples instead: fresh random seeds and 16× the cases in every property
    /// test (`KAPPA_EXPLORE_FACTOR` changes the factor), tests only. Failures are written next to
    /// the test source as `*.proptest-regressions`; commit them and CI replays them.
    #[arg(long)]
    explore: bool,
    /// Instead: the Slurm path against a real one-node Slurm on loopback (installs Debian's
    /// Slurm and munge as root when missing; a few minutes): a job array of units, one unit
    /// preempted with SIGTERM and requeued, its metrics equal to an uninterrupted run's.
    #[arg(long, conflicts_with = "explore")]
    slurm: bool,
    /// Only the MPI checks, which the whole run ends with (installs Debian's Open MPI and
    /// libclang as root when missing; about a minute after the build): kappa-dist's MPI backend
    /// under `mpirun` against the threads backend, a killed rank, and `train` on 2 ranks against
    /// 1 process.
    #[arg(long, conflicts_with_all = ["explore", "slurm"])]
    mpi: bool,
}

/// The features of every release build that `cargo xtask test` makes, so that one build serves
/// the lints, the tests and the MPI checks: kappa-experiments' `nccl`, which implies its `mpi`
/// and kappa-dist's `mpi` and `nccl`. Building them needs Open MPI's headers and libclang
/// ([`crate::mpi_test::install`], which `test` runs first); NCCL is loaded at run time, so no
/// build needs CUDA.
pub(crate) const TEST_FEATURES: &str = "kappa-experiments/nccl";

/// `cargo test` of the workspace with [`TEST_FEATURES`] in the release profile.
pub(crate) const WORKSPACE_TESTS: [&str; 6] = [
    "test",
    "--workspace",
    "--release",
    "--locked",
    "--features",
    TEST_FEATURES,
];

/// The libraries users depend on alone: they must build, test and document without libtorch.
const STANDALONE: &[&str] = &["kappa-linalg", "kappa-attention", "kappa-optim"];

/// The libraries published to crates.io.
const PUBLISHED: &[&str] = &[
    "kappa-linalg",
    "kappa-attention",
    "kappa-optim",
    "kappa-models",
    "kappa-dist",
    "kappa-train",
];

/// `cargo xtask test`: setup, then formatting, lints, every test, the standalone libraries,
/// the docs and the packages (see [`checks`]), in the release profile (shared with reproduce and
/// bench so libtorch's C++ wrapper is compiled once).
pub fn test(ws: &Workspace, args: &TestArgs) -> Result<()> {
    let tc = setup::setup(ws, &DataSelection::default())?;
    if args.slurm {
        return crate::slurm_test::test(ws, &tc);
    }
    crate::mpi_test::install()?;
    if args.mpi {
        return crate::mpi_test::test(ws, &tc);
    }
    if args.explore {
        run(cargo(ws, &tc)
            .args(WORKSPACE_TESTS)
            .env("KAPPA_EXPLORE", "1"))?;
        eprintln!("xtask test --explore: no counterexample found this time");
        return Ok(());
    }
    crate::python::prepare_tests(ws)?;
    warn_if_disk_is_short(ws);
    let started = std::time::Instant::now();
    // Only `cargo package`'s verification uses these, so clearing them first is the same as
    // clearing them just before it.
    forget_packaged_sources()?;
    run(cargo(ws, &tc).args(clean_packaged_builds()))?;
    for (what, mut cmd) in checks(ws, &tc) {
        eprintln!("xtask test: {what}");
        run(&mut cmd)?;
    }
    eprintln!("xtask test: the MPI backend and training over mpirun (feature mpi)");
    crate::mpi_test::test(ws, &tc)?;
    eprintln!(
        "xtask test: formatting, lints, tests, standalone builds, docs and packages all passed ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The free space under which `test` warns: a release build of the workspace with its tests,
/// the Python package and the checkpoints the tests write take about this much.
const TEST_DISK_GIB: u64 = 20;

/// Prints the free space of the target folder's file system, with a warning when it is under
/// [`TEST_DISK_GIB`]: a test that fails for want of disk then says so before its own message.
fn warn_if_disk_is_short(ws: &Workspace) {
    let dir = ws.target_dir();
    let _ = fs::create_dir_all(&dir);
    let Some(free) = free_gib(&dir) else { return };
    if free < TEST_DISK_GIB {
        eprintln!(
            "xtask test: warning: {free} GiB free under {} (a full run needs about {TEST_DISK_GIB} \
             GiB; tests that write checkpoints fail when the disk fills)",
            dir.display()
        );
    } else {
        eprintln!("xtask test: {free} GiB free under {}", dir.display());
    }
}

/// Free GiB of the file system holding `dir`, from POSIX `df -Pk` (none where it is missing).
fn free_gib(dir: &std::path::Path) -> Option<u64> {
    let out = crate::workspace::output_of(Command::new("df").arg("-Pk").arg(dir))?;
    let kib: u64 = out
        .lines()
        .nth(1)?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()?;
    Some(kib / (1024 * 1024))
}

/// Removes cargo's extracted copies of earlier `cargo package` tarballs of our libraries.
///
/// `cargo package` verifies each library against the others' fresh tarballs through a local
/// registry, and cargo extracts those into `$CARGO_HOME/registry/src/<that registry>/NAME-VERSION`
/// — once: since the version does not change between runs, a later verification would build
/// against the stale extraction. Only those folders go (our crates under registries other than
/// crates.io's); nothing else is touched. See also [`clean_packaged_builds`].
fn forget_packaged_sources() -> Result<()> {
    let home = env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry/src")) else {
        return Ok(());
    };
    let Ok(registries) = fs::read_dir(&src) else {
        return Ok(());
    };
    for registry in registries.flatten() {
        if registry
            .file_name()
            .to_string_lossy()
            .starts_with("index.crates.io-")
        {
            continue;
        }
        for entry in fs::read_dir(registry.path())?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if PUBLISHED.iter().any(|p| name.starts_with(&format!("{p}-"))) {
                fs::remove_dir_all(entry.path())
                    .with_context(|| format!("removing {}", entry.path().display()))?;
            }
        }
    }
    Ok(())
}

/// `cargo clean` of the libraries' debug builds, which only `cargo package`'s verification makes:
/// cargo treats a registry source as immutable, so an earlier verification's build of
/// kappa-linalg 0.1.0 would be reused against the new tarball. Dependencies (torch-sys) stay.
fn clean_packaged_builds() -> Vec<&'static str> {
    let mut args = vec!["clean", "--profile", "dev"];
    args.extend(PUBLISHED.iter().flat_map(|p| ["-p", p]));
    args
}

/// The steps of `cargo xtask test`, in order, each with what it checks.
fn checks(ws: &Workspace, tc: &Toolchain) -> Vec<(&'static str, Command)> {
    let step = |what: &'static str, args: &[&str]| {
        let mut cmd = cargo(ws, tc);
        cmd.args(args);
        (what, cmd)
    };
    let clippy = [
        "clippy",
        "--workspace",
        "--all-targets",
        "--release",
        "--locked",
        "--features",
        TEST_FEATURES,
        "--",
        "-D",
        "warnings",
    ];
    let docs = [
        "doc",
        "--workspace",
        "--no-deps",
        "--release",
        "--locked",
        "--features",
        TEST_FEATURES,
    ];
    let mut docs = step("docs (warnings are errors)", &docs);
    docs.1.env("RUSTDOCFLAGS", "-D warnings");
    // Verified: each package is built from its own tarball, as crates.io would.
    let mut packages = vec!["package", "--locked", "--allow-dirty"];
    packages.extend(PUBLISHED.iter().flat_map(|p| ["-p", p]));
    let mut packages = step(
        "packages (cargo package of the published libraries)",
        &packages,
    );
    // `cargo package` verifies in the dev profile, where a build of the tch crates compiles
    // libtorch's C++ wrapper once more: without debug info (which nothing reads here) it and
    // everything else compile and link faster.
    packages.1.env("CARGO_PROFILE_DEV_DEBUG", "false");
    let mut steps = vec![
        step("formatting", &["fmt", "--all", "--check"]),
        step("lints (with the MPI and NCCL backends)", &clippy),
        step(
            "tests (with the MPI and NCCL backends; the GPU tests where a GPU is)",
            &WORKSPACE_TESTS,
        ),
        (
            "python package: built into the venv (maturin develop)",
            crate::python::develop(ws, tc),
        ),
        ("python package: pytest", crate::python::pytest(ws)),
        docs,
        packages,
    ];
    steps.extend(standalone(ws));
    steps
}

/// The libraries alone, outside the workspace's feature unification and without libtorch in
/// the environment: `cargo test` of each, a build without the default LAPACK backend, and
/// kappa-models', kappa-dist's and kappa-train's docs in tch's doc-only mode (what docs.rs builds). All in
/// the release profile and the workspace's target folder, so that the dependencies whose
/// features are the same as in the workspace's build (most of them) are not built again.
fn standalone(ws: &Workspace) -> Vec<(&'static str, Command)> {
    let bare = |args: &[&str]| {
        let program = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
        let mut cmd = Command::new(program);
        cmd.current_dir(ws.root())
            .env_remove("LIBTORCH")
            .env_remove("LIBTORCH_USE_PYTORCH")
            .args(args);
        cmd
    };
    let with = |verb: &'static str, extra: &[&'static str]| {
        let mut args = vec![verb];
        args.extend(STANDALONE.iter().flat_map(|p| ["-p", p]));
        args.extend(extra);
        bare(&args)
    };
    let mut docs_rs = bare(&[
        "doc",
        "--no-deps",
        "--release",
        "--locked",
        "-p",
        "kappa-models",
        "-p",
        "kappa-dist",
        "-p",
        "kappa-train",
        "--features",
        "kappa-models/doc-only,kappa-dist/doc-only,kappa-train/doc-only",
    ]);
    docs_rs.env("RUSTDOCFLAGS", "-D warnings");
    vec![
        (
            "standalone libraries: tests without libtorch",
            with("test", &["--release", "--locked"]),
        ),
        (
            "standalone libraries: build without the default OpenBLAS backend",
            with("check", &["--release", "--locked", "--no-default-features"]),
        ),
        (
            "kappa-models, kappa-dist and kappa-train docs without libtorch (docs.rs mode)",
            docs_rs,
        ),
    ]
}

/// Arguments of `cargo xtask bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Threads for BLAS and libtorch inside the benchmarks (a count, or a list such as 1,2: one
    /// whole run per count, in turn)
    #[arg(long, default_value = "1", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
    threads: Vec<u32>,
    /// Run only this benchmark target (linalg, attention, optim, models, manifolds, gemm,
    /// nystrom, step_env, optimizer_api, data_parallel, sharded_muon, limits; with `--publish`,
    /// `limits` runs too).
    #[arg(long)]
    bench: Option<String>,
    /// Write this run's results into docs/performance.md: the part of each bench target that ran
    /// (every target, or the one `--bench` names; the other parts are kept), with the CPU,
    /// thread counts, date, commit and this command, the machine's limits, and one table per
    /// comparison of kappa against its peer with kappa's fraction of the limit.
    #[arg(long)]
    publish: bool,
    /// Arguments passed to criterion (a filter, `--quick`, …).
    #[arg(last = true)]
    criterion: Vec<String>,
}

/// `cargo xtask bench`: the criterion benchmarks with a fixed thread count, once per count of
/// `--threads`.
pub fn bench(ws: &Workspace, args: &BenchArgs) -> Result<()> {
    let tc = setup::setup(ws, &DataSelection::default())?;
    // The commit and tree state the benches are built from: taken before they run, since the
    // tree may change during a long run.
    let provenance = crate::publish::Provenance::now(ws, &args.threads);
    let mut published = Vec::new();
    for &threads in &args.threads {
        let started = std::time::SystemTime::now();
        eprintln!(
            "xtask bench: {threads} thread(s); nothing else should run on this machine while it \
             measures"
        );
        let threads_n = threads;
        let threads = threads.to_string();
        let mut cmd = cargo(ws, &tc);
        cmd.args(["bench", "--locked", "-p", "kappa-benches"]);
        // The PyTorch columns run the reference scripts with the Python of the environment that
        // setup installed torch into (`kappa_benches::peer::python`; `KAPPA_PYTHON` overrides it).
        cmd.env("KAPPA_VENV", ws.venv_dir());
        if let Some(bench) = &args.bench {
            cmd.args(["--bench", bench]);
            // A part's figures are read against the machine's limits measured in the same run.
            if args.publish && bench != "limits" {
                cmd.args(["--bench", "limits"]);
            }
        }
        run(cmd
            .arg("--")
            .args(&args.criterion)
            .env("KAPPA_BENCH_THREADS", &threads)
            .env("OPENBLAS_NUM_THREADS", &threads)
            .env("RAYON_NUM_THREADS", &threads))?;
        if args.publish {
            published.push(crate::publish::collect(ws, threads_n, started));
        }
    }
    if args.publish {
        crate::publish::write(ws, &published, &provenance, args.bench.as_deref())?;
    }
    Ok(())
}
