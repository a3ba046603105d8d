//! `cargo xtask train --config FILE`: check the command line and the file (it exists and is
//! TOML) before any install or build, set up, build the `kappa-experiments` binary and forward
//! the options to its `train` subcommand, which checks every key and trains. The options are
//! kappa-cli's [`TrainArgs`], the struct the binary parses. With `--slurm` the binary runs as a
//! Slurm job instead ([`TrainSlurmArgs`]: nodes, ranks per node), one MPI rank per task.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use kappa_cli::TrainArgs;

use crate::data::DataSelection;
use crate::reproduce::{experiments_binary, shell_word};
use crate::setup;
use crate::slurm::{submit_train, train_script, TrainJob, TrainSlurmArgs};
use crate::workspace::{run, Workspace};

/// `cargo xtask train`.
pub fn train(ws: &Workspace, args: &TrainArgs, slurm: &TrainSlurmArgs) -> Result<()> {
    let (args, name) = check(args)?;
    let tc = setup::setup(ws, &DataSelection::default())?;
    if slurm.common.slurm {
        return submit(ws, &tc, &args, &name, slurm);
    }
    let mut cmd = experiments_binary(ws, &tc, args.threads);
    cmd.arg("train").args(args.to_args());
    crate::workspace::leave_ctrl_c_to_the_child()?;
    run(&mut cmd)
}

/// `--slurm`: builds the binary (with the feature `mpi` for several ranks, `nccl` on CUDA,
/// installing Open MPI where it is missing), copies it into `<out>/slurm/<name>/` (a later build
/// does not change a queued job's), writes `train.sbatch` there and submits it.
fn submit(
    ws: &Workspace,
    tc: &setup::Toolchain,
    args: &TrainArgs,
    name: &str,
    slurm: &TrainSlurmArgs,
) -> Result<()> {
    let built = crate::reproduce::slurm_binary(ws, tc, slurm.ranks.feature(&args.device.0))?;
    let dir = args.out.join("slurm").join(name);
    let logs = dir.join("logs");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let binary = dir.join("kappa-experiments");
    fs::copy(&built, &binary).with_context(|| format!("copying {}", built.display()))?;
    let plain = TrainArgs {
        resume: false,
        fresh: false,
        ..args.clone()
    };
    let words = plain.to_args().into_iter();
    let train_args = words.map(|a| shell_word(&a.to_string_lossy())).collect();
    let lib_dir = tc.libtorch.lib_dir();
    let job = TrainJob {
        name,
        binary: &binary,
        lib_dir: &lib_dir,
        train_args,
        first_attempt: (args.resume.then_some("--resume")).or(args.fresh.then_some("--fresh")),
        threads: args.threads,
        cuda: args.device.0.starts_with("cuda"),
        logs,
        source: crate::publish::source(ws),
    };
    submit_train(&dir, &train_script(&job, slurm), slurm.common.dry_run)?;
    Ok(())
}

/// The file exists and is TOML; the paths are made absolute (the binary starts in the
/// workspace root, the user gave them relative to where they are). Also returns the job's
/// `name` (the binary checks every key; a name that is not a plain word is its error).
fn check(args: &TrainArgs) -> Result<(TrainArgs, String)> {
    let path = &args.config;
    let text = crate::workspace::read_config_text(path)?;
    let table = toml::from_str::<toml::Table>(&text)
        .map_err(|e| anyhow::anyhow!("{}: not valid TOML: {e}", path.display()))?;
    let name = table.get("name").and_then(|v| v.as_str()).unwrap_or("job");
    // `--slurm`'s folder `<out>/slurm/<name>/` is made from it before the binary checks it.
    anyhow::ensure!(
        !name.is_empty() && !name.starts_with('.'),
        "{}: name = {name:?}: a run name is not empty and does not start with a dot",
        path.display()
    );
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let absolute =
        |p: &Path| -> Result<std::path::PathBuf> { Ok(std::env::current_dir()?.join(p)) };
    let args = TrainArgs {
        config: absolute(path)?,
        out: absolute(&args.out)?,
        ..args.clone()
    };
    Ok((args, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn a_missing_or_malformed_file_fails_before_setup() {
        let dir = std::env::temp_dir().join(format!("kappa-xtask-train-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let parse = |p: &Path| -> TrainArgs {
            kappa_cli::parse_args(["--config", p.to_str().unwrap()]).unwrap()
        };
        let missing = check(&parse(&dir.join("none.toml"))).unwrap_err();
        assert!(format!("{missing:#}").contains("none.toml"), "{missing:#}");
        let bad = dir.join("bad.toml");
        fs::write(&bad, "name = ").unwrap();
        let err = check(&parse(&bad)).unwrap_err();
        assert!(format!("{err:#}").contains("not valid TOML"), "{err:#}");
        let good = dir.join("good.toml");
        fs::write(&good, "name = \"x\"").unwrap();
        let (args, name) = check(&parse(&good)).unwrap();
        assert!(args.config.is_absolute() && args.out.is_absolute() && name == "x");
        for bad in ["", ".", ".."] {
            fs::write(&good, format!("name = {bad:?}")).unwrap();
            let err = check(&parse(&good)).unwrap_err();
            assert!(format!("{err:#}").contains("a run name"), "{err:#}");
        }
        // A folder (like a FIFO, which would block) is not read as a config.
        let err = check(&parse(&dir)).unwrap_err();
        assert!(format!("{err:#}").contains("not a regular file"), "{err:#}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
