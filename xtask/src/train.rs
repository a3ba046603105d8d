//! `cargo xtask train --config FILE`: check the command line and the file (it exists and is
//! TOML) before any install or build, set up, build the `kappa-experiments` binary and forward
//! the options to its `train` subcommand, which checks every key and trains. The options are
//! kappa-cli's [`TrainArgs`], the struct the binary parses. With `--slurm` the binary runs as a
//! Slurm job instead ([`TrainSlurmArgs`]: nodes, ranks per node), one MPI rank per task.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use kappa_cli::TrainArgs;
use sha2::{Digest, Sha256};

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
/// installing Open MPI where it is missing), copies it into `<out>/slurm/<name>/` under a name
/// made from its contents ([`copy_by_content`]: a later build neither changes a queued job's
/// binary nor overwrites a running one), writes `train.sbatch` there and submits it.
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
    let binary = copy_by_content(&built, &dir)?;
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

/// `built` copied into `dir` as `kappa-experiments-<the first 16 hex digits of its sha256>`,
/// through a temporary file and a rename; a file of that name already there (the same bytes)
/// is used as it is. Returns the copy's path.
fn copy_by_content(built: &Path, dir: &Path) -> Result<PathBuf> {
    let mut hasher = Sha256::new();
    let mut file = fs::File::open(built).with_context(|| format!("reading {}", built.display()))?;
    std::io::copy(&mut file, &mut hasher)
        .with_context(|| format!("reading {}", built.display()))?;
    let hash = format!("{:x}", hasher.finalize());
    let binary = dir.join(format!("kappa-experiments-{}", &hash[..16]));
    if !binary.is_file() {
        let tmp = dir.join(format!(".kappa-experiments.{}.tmp", std::process::id()));
        fs::copy(built, &tmp).with_context(|| format!("copying {}", built.display()))?;
        fs::rename(&tmp, &binary).with_context(|| format!("writing {}", binary.display()))?;
    }
    Ok(binary)
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
    fn a_new_build_gets_a_new_name_and_leaves_the_old_copy_alone() {
        let dir = std::env::temp_dir().join(format!("kappa-xtask-copy-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let built = dir.join("built");
        fs::write(&built, "first build").unwrap();
        let first = copy_by_content(&built, &dir).unwrap();
        assert_eq!(copy_by_content(&built, &dir).unwrap(), first);
        fs::write(&built, "second build").unwrap();
        let second = copy_by_content(&built, &dir).unwrap();
        assert_ne!(second, first);
        assert_eq!(fs::read_to_string(&first).unwrap(), "first build");
        assert_eq!(fs::read_to_string(&second).unwrap(), "second build");
        let name = second.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("kappa-experiments-") && name.len() == 34,
            "{name}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

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
