//! The options of `report`: which run folders a report is built from, and what it should
//! cover.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use crate::names::ExperimentName;
use crate::scale::Scale;

/// The options of `cargo xtask report` and of `kappa-experiments report`.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct ReportArgs {
    /// The scale whose run folders are read.
    #[arg(long, default_value = "cpu")]
    pub scale: Scale,
    /// A results folder to read (repeatable: folders written by different machines are merged;
    /// a unit found in two of them is an error). Default: the workspace's `results/`.
    #[arg(long)]
    pub results: Vec<PathBuf>,
    /// Where `report.md` and its plots go (default: the first results folder).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The experiments whose units the report should cover (repeatable; default: all). Units
    /// without a run folder are named in the report, not an error.
    #[arg(long)]
    pub only: Vec<ExperimentName>,
    /// Seeds expected per experiment (default: each experiment's own).
    #[arg(long)]
    pub seeds: Option<u32>,
}

impl ReportArgs {
    /// The command line that parses back to these options.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut out: Vec<OsString> = vec!["--scale".into(), self.scale.name().into()];
        for dir in &self.results {
            out.extend(["--results".into(), dir.clone().into_os_string()]);
        }
        if let Some(dir) = &self.out {
            out.extend(["--out".into(), dir.clone().into_os_string()]);
        }
        for name in &self.only {
            out.extend(["--only".into(), name.0.clone().into()]);
        }
        if let Some(seeds) = self.seeds {
            out.extend(["--seeds".into(), seeds.to_string().into()]);
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
        let args: ReportArgs = parse_args([
            "--scale",
            "smoke",
            "--results",
            "a",
            "--results",
            "b",
            "--out",
            "m",
            "--only",
            "theory",
            "--seeds",
            "2",
        ])
        .unwrap();
        assert_eq!(args.results, [PathBuf::from("a"), PathBuf::from("b")]);
        assert_eq!(
            parse_args::<ReportArgs, _, _>(args.to_args()).unwrap(),
            args
        );
        let defaults: ReportArgs = parse_args::<ReportArgs, _, &str>([]).unwrap();
        assert!(defaults.results.is_empty() && defaults.out.is_none());
        assert!(parse_args::<ReportArgs, _, _>(["--only", "theroy"]).is_err());
    }
}
