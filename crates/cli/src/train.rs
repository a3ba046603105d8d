//! The options of `train`: a user's own training job (`cargo xtask train` and the
//! `kappa-experiments train` subcommand parse this one definition).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use crate::names::DeviceName;
use crate::reproduce::Set;

/// `train --config FILE [--set KEY=VALUE]… [--seed N] [--threads N] [--device D] [--out DIR]
/// [--resume | --fresh]`.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct TrainArgs {
    /// The job: a TOML file with `name`, `[data]`, `[model]`, `[optimizer]` and `[train]` (see
    /// `examples/train/` in the repository).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Override a field of the file (repeatable), e.g. `--set train.lr=3e-4`.
    #[arg(long, value_name = "KEY=VALUE")]
    pub set: Vec<Set>,
    /// The seed: initialization and data order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// BLAS and libtorch threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// cpu, cuda or cuda:N; unset, the environment's `KAPPA_DEVICE`, else cpu.
    #[arg(long, env = "KAPPA_DEVICE", default_value = "cpu")]
    pub device: DeviceName,
    /// The folder of run folders (the run goes to `<out>/<name>/`).
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    /// Continue the run folder of an interrupted run from its checkpoint (a finished run is
    /// kept; a changed config is an error).
    #[arg(long, conflicts_with = "fresh")]
    pub resume: bool,
    /// Start over in a run folder that already holds this run: its own files (config,
    /// metrics, checkpoints, report) are deleted first, anything else in the folder is kept.
    /// Without `--resume` or `--fresh`, a run folder that is not empty is an error.
    #[arg(long)]
    pub fresh: bool,
}

impl TrainArgs {
    /// The arguments that parse back into `self` (what xtask forwards to the binary).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut out: Vec<OsString> = vec!["--config".into(), self.config.clone().into()];
        for set in &self.set {
            out.extend(["--set".into(), set.to_string().into()]);
        }
        out.extend([
            "--seed".into(),
            self.seed.to_string().into(),
            "--threads".into(),
            self.threads.to_string().into(),
            "--device".into(),
            self.device.0.clone().into(),
            "--out".into(),
            self.out.clone().into(),
        ]);
        for (on, flag) in [(self.resume, "--resume"), (self.fresh, "--fresh")] {
            if on {
                out.push(flag.into());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_args;

    #[test]
    fn the_forwarded_arguments_parse_back_to_the_same_options() {
        let args: TrainArgs = parse_args([
            "--config",
            "my.toml",
            "--set",
            "train.lr=3e-4",
            "--seed",
            "3",
            "--resume",
        ])
        .unwrap();
        let again: TrainArgs = parse_args(args.to_args()).unwrap();
        assert_eq!(args, again);
        assert_eq!(again.set[0].key, "train.lr");
        assert!(
            parse_args::<TrainArgs, _, _>(["--seed", "1"]).is_err(),
            "--config is required"
        );
        assert!(parse_args::<TrainArgs, _, _>(["--config", "a", "--device", "tpu"]).is_err());
        let fresh: TrainArgs = parse_args(["--config", "a", "--fresh"]).unwrap();
        assert_eq!(
            parse_args::<TrainArgs, _, _>(fresh.to_args()).unwrap(),
            fresh
        );
        assert!(
            parse_args::<TrainArgs, _, _>(["--config", "a", "--fresh", "--resume"]).is_err(),
            "--fresh and --resume exclude each other"
        );
    }
}
