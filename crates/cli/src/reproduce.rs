//! The options of `reproduce`, and the rule that picks the experiment of a `--config` file.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use clap::Args;

use crate::names::{unknown, DeviceName, ExperimentName, EXPERIMENTS};
use crate::scale::Scale;

/// The options of `cargo xtask reproduce` and of `kappa-experiments reproduce`.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct ReproduceArgs {
    /// smoke (used by tests), cpu (the default: sized for 2 cores), long (CPU-sized models
    /// trained long: only the experiments that have it), gpu (sized for one GPU) or paper (the
    /// papers' sizes, for GPU machines); `--plan` prints each unit's expected minutes. Picks the
    /// built-in config files (`experiments/<name>/<scale>.toml`) and names the results folder.
    #[arg(long, default_value = "cpu")]
    pub scale: Scale,
    /// Run only these experiments (repeatable); `--list` shows the names.
    #[arg(long)]
    pub only: Vec<ExperimentName>,
    /// Number of seeds per experiment (default: the experiment's own, usually 3).
    #[arg(long)]
    pub seeds: Option<u32>,
    /// Threads for BLAS and libtorch.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// cpu, cuda or cuda:N (experiments that train models); unset, the environment's
    /// `KAPPA_DEVICE`, else cpu.
    #[arg(long, env = "KAPPA_DEVICE", default_value = "cpu")]
    pub device: DeviceName,
    /// Run one experiment with this config file instead of its built-in one: the experiment is
    /// `--only NAME` or the file's `experiment = "NAME"` key (both: they must agree).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Change one key of the config before it is checked, e.g. `--set train.lr=3e-4`
    /// (repeatable; a dotted path into the TOML; the value is TOML, else a string). A key the
    /// config does not have is an error.
    #[arg(long, value_name = "KEY=VALUE")]
    pub set: Vec<Set>,
    /// Keep earlier run folders of this scale: skip runs that completed or diverged, continue
    /// interrupted or failed runs from their checkpoints (a changed config is an error).
    #[arg(long, conflicts_with = "fresh")]
    pub resume: bool,
    /// Start this scale's runs over where earlier run folders exist: their own files are
    /// deleted first (anything else in the folders is kept). Without `--resume` or `--fresh`,
    /// earlier run folders of a selected experiment at this scale are an error.
    #[arg(long)]
    pub fresh: bool,
    /// Afterwards, put the report sections of the experiments that ran, with their plots, into
    /// `docs/results/` (tracked by git; `docs/results/<scale>/` at a scale other than `cpu`); the
    /// sections of other experiments stay as they are.
    #[arg(long)]
    pub publish: bool,
    /// List the experiments and the paper claims they test, then stop.
    #[arg(long)]
    pub list: bool,
    /// List the units of work — one (experiment, seed) run each, with its id, expected cost and
    /// resolved config — print them and write `<results>/plan.json`, then stop.
    #[arg(long)]
    pub plan: bool,
    /// Run only this unit of the plan (repeatable; ids as `--plan` prints them, e.g.
    /// `vit-fmnist/cpu/seed-1`), reusing its folder in the results folder as `--resume` does,
    /// and write no report (`report` merges the units' folders).
    #[arg(long, value_name = "ID")]
    pub unit: Vec<String>,
}

impl ReproduceArgs {
    /// The command line that parses back to these options (what xtask forwards).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut out: Vec<OsString> = Vec::new();
        let mut pair = |flag: &str, value: OsString| {
            out.push(flag.into());
            out.push(value);
        };
        pair("--scale", self.scale.name().into());
        for name in &self.only {
            pair("--only", name.0.clone().into());
        }
        if let Some(seeds) = self.seeds {
            pair("--seeds", seeds.to_string().into());
        }
        pair("--threads", self.threads.to_string().into());
        pair("--device", self.device.0.clone().into());
        if let Some(config) = &self.config {
            pair("--config", config.clone().into_os_string());
        }
        for set in &self.set {
            pair("--set", set.to_string().into());
        }
        for unit in &self.unit {
            pair("--unit", unit.clone().into());
        }
        for (on, flag) in [
            (self.resume, "--resume"),
            (self.fresh, "--fresh"),
            (self.publish, "--publish"),
            (self.list, "--list"),
            (self.plan, "--plan"),
        ] {
            if on {
                out.push(flag.into());
            }
        }
        out
    }
}

/// One `--set KEY=VALUE`: a dotted key (`train.lr`, `variants.0.name`) and the value's text,
/// which the config loader reads as TOML (a string when it is not TOML).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    /// The dotted path, e.g. `train.lr`.
    pub key: String,
    /// The value as typed, e.g. `3e-4`.
    pub value: String,
}

impl Set {
    /// The parts of the dotted key.
    pub fn path(&self) -> impl Iterator<Item = &str> {
        self.key.split('.')
    }
}

impl FromStr for Set {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let Some((key, value)) = s.split_once('=') else {
            return Err(format!("`{s}` is not KEY=VALUE (e.g. train.lr=3e-4)"));
        };
        let key = key.trim();
        let bad_part = |p: &str| {
            p.is_empty()
                || !p
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
        };
        if key.split('.').any(bad_part) {
            return Err(format!(
                "`{key}` is not a dotted key (parts of letters, digits, `_` and `-`, joined by `.`)"
            ));
        }
        Ok(Self {
            key: key.to_string(),
            value: value.to_string(),
        })
    }
}

impl fmt::Display for Set {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

/// The one experiment a `--config` file runs: `--only NAME` (exactly one), or the file's
/// `experiment = "NAME"` key (`key`); when both are given they must agree.
///
/// ```
/// use kappa_cli::{config_experiment, ExperimentName};
/// let theory = ExperimentName("theory".into());
/// assert_eq!(config_experiment(&[], Some("theory")).unwrap(), theory);
/// assert_eq!(config_experiment(&[theory.clone()], None).unwrap(), theory);
/// assert!(config_experiment(&[theory], Some("manifolds")).is_err());
/// assert!(config_experiment(&[], None).is_err());
/// ```
pub fn config_experiment(
    only: &[ExperimentName],
    key: Option<&str>,
) -> Result<ExperimentName, String> {
    let from_key = key
        .map(|k| {
            k.parse::<ExperimentName>().map_err(|_| {
                format!(
                    "`experiment = \"{k}\"`: {}",
                    unknown(k, EXPERIMENTS, "experiment")
                )
            })
        })
        .transpose()?;
    match (only, from_key) {
        ([], Some(name)) => Ok(name),
        ([one], None) => Ok(one.clone()),
        ([one], Some(name)) if *one == name => Ok(name),
        ([one], Some(name)) => Err(format!(
            "--only {one} but the config file says `experiment = \"{name}\"`"
        )),
        ([], None) => Err(
            "--config needs the experiment it configures: `--only NAME`, or an \
             `experiment = \"NAME\"` line in the file"
                .to_string(),
        ),
        (_, _) => Err(format!(
            "--config configures one experiment, but --only names {}",
            only.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ReproduceArgs, String> {
        crate::parse_args(args.iter().copied()).map_err(|e| e.to_string())
    }

    #[test]
    fn every_option_survives_forwarding() {
        let args = parse(&[
            "--scale",
            "smoke",
            "--only",
            "theory",
            "--only",
            "manifolds",
            "--seeds",
            "2",
            "--threads",
            "1",
            "--device",
            "cuda:1",
            "--config",
            "my dir/a.toml",
            "--set",
            "train.lr=3e-4",
            "--set",
            "variants=[\"a = b\"]",
            "--resume",
            "--publish",
            "--list",
            "--plan",
            "--unit",
            "theory/smoke/seed-1",
        ])
        .unwrap();
        let forwarded: Vec<String> = args
            .to_args()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        let forwarded: Vec<&str> = forwarded.iter().map(String::as_str).collect();
        assert_eq!(parse(&forwarded).unwrap(), args);
        assert_eq!(args.set[1].value, "[\"a = b\"]");
        // The defaults forward too.
        let defaults = parse(&[]).unwrap();
        assert_eq!(defaults.scale, Scale::Cpu);
        let forwarded: Vec<String> = defaults
            .to_args()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        let forwarded: Vec<&str> = forwarded.iter().map(String::as_str).collect();
        assert_eq!(parse(&forwarded).unwrap(), defaults);
    }

    #[test]
    fn typos_fail_while_parsing() {
        assert!(parse(&["--scale", "smok"])
            .unwrap_err()
            .contains("did you mean `smoke`"));
        assert!(parse(&["--only", "manifold"])
            .unwrap_err()
            .contains("did you mean `manifolds`"));
        assert!(parse(&["--device", "tpu"]).is_err());
        assert!(parse(&["--set", "train.lr"])
            .unwrap_err()
            .contains("KEY=VALUE"));
        assert!(parse(&["--set", "train..lr=1"])
            .unwrap_err()
            .contains("dotted key"));
        assert!(parse(&["--sett", "a=1"]).is_err());
    }

    #[test]
    fn sets_split_at_the_first_equals_sign() {
        let set: Set = "variants.0.name=a=b".parse().unwrap();
        assert_eq!(set.key, "variants.0.name");
        assert_eq!(set.value, "a=b");
        assert_eq!(set.path().collect::<Vec<_>>(), ["variants", "0", "name"]);
    }

    #[test]
    fn the_config_experiment_comes_from_only_or_the_file() {
        let name = |s: &str| ExperimentName(s.into());
        let err = config_experiment(&[], Some("thoery")).unwrap_err();
        assert!(err.contains("did you mean `theory`"), "{err}");
        let err = config_experiment(&[name("theory"), name("manifolds")], None).unwrap_err();
        assert!(err.contains("one experiment"), "{err}");
        let err = config_experiment(&[name("theory")], Some("manifolds")).unwrap_err();
        assert!(err.contains("--only theory"), "{err}");
    }
}
