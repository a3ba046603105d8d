//! The names `reproduce` accepts, checked while the command line is parsed: the experiments of
//! the registry in kappa-experiments (a test there keeps [`EXPERIMENTS`] equal to the registry)
//! and the devices. A near miss is answered with a suggestion.

use std::fmt;
use std::str::FromStr;

/// Expands `$callback![name, ...]` with the names of the experiments that have a config at every
/// scale but `long`, in the registry's order: the one list of these names, for code that needs
/// them as literals (kappa-experiments embeds each one's config files with `include_str!`).
/// [`EXPERIMENTS`] is this list followed by [`SERIES`].
///
/// ```
/// macro_rules! count { ($($name:literal),*) => { [$($name),*].len() } }
/// assert_eq!(
///     kappa_cli::with_experiment_names!(count) + kappa_cli::SERIES.len(),
///     kappa_cli::EXPERIMENTS.len()
/// );
/// ```
#[macro_export]
macro_rules! with_experiment_names {
    ($callback:ident) => {
        $callback![
            "random-spectra",
            "theory",
            "convergence",
            "optim-geometry",
            "vit-fmnist",
            "gpt-sotu",
            "manifolds",
            "optimizer-race",
            "lra",
            "bert-sentiment",
            "lambda-readings"
        ]
    };
}

/// The experiments that run only at the scales they name (`smoke`, `long`, `gpu`): series of
/// other experiments' models, too long for the default `cpu` suite. They follow the others in the
/// registry.
pub const SERIES: &[&str] = &["scaling"];

macro_rules! name_slice {
    ($($name:literal),*) => { &[$($name,)* "scaling"] };
}

/// The experiment names, in the registry's order.
pub const EXPERIMENTS: &[&str] = with_experiment_names!(name_slice);

/// An experiment name that is in the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExperimentName(pub String);

impl FromStr for ExperimentName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        one_of(s, EXPERIMENTS, "experiment").map(|s| Self(s.to_string()))
    }
}

impl fmt::Display for ExperimentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A device: `cpu`, `cuda` or `cuda:N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceName(pub String);

impl FromStr for DeviceName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let ordinal_ok = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
        match s {
            "cpu" | "cuda" => Ok(Self(s.to_string())),
            _ if s.strip_prefix("cuda:").is_some_and(ordinal_ok) => Ok(Self(s.to_string())),
            _ => Err(format!("unknown device `{s}`: use cpu, cuda or cuda:N")),
        }
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `s` if it is one of `allowed`, else [`unknown`]'s error.
fn one_of<'a>(s: &'a str, allowed: &[&str], what: &str) -> Result<&'a str, String> {
    if allowed.contains(&s) {
        Ok(s)
    } else {
        Err(unknown(s, allowed, what))
    }
}

/// The error for a name `s` that is not one of `allowed`: it names `what`, the allowed names,
/// and the closest one.
pub(crate) fn unknown(s: &str, allowed: &[&str], what: &str) -> String {
    let hint = closest(s, allowed)
        .map(|c| format!(" (did you mean `{c}`?)"))
        .unwrap_or_default();
    format!(
        "unknown {what} `{s}`{hint}; the {what}s are: {}",
        allowed.join(", ")
    )
}

/// The allowed name within edit distance 2 of `s`, if any.
fn closest<'a>(s: &str, allowed: &[&'a str]) -> Option<&'a str> {
    allowed
        .iter()
        .map(|a| (edit_distance(s, a), *a))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, a)| a)
}

/// The Levenshtein distance (insertions, deletions, substitutions) between `a` and `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_is_refused_with_a_suggestion() {
        let err = "manifold".parse::<ExperimentName>().unwrap_err();
        assert!(err.contains("did you mean `manifolds`"), "{err}");
        assert!(err.contains("random-spectra"), "{err}");
        assert!("bogus"
            .parse::<ExperimentName>()
            .unwrap_err()
            .contains("unknown experiment `bogus`;"));
        assert_eq!("theory".parse::<ExperimentName>().unwrap().0, "theory");
    }

    #[test]
    fn the_series_come_last() {
        assert!(EXPERIMENTS.ends_with(SERIES));
    }

    #[test]
    fn devices() {
        for ok in ["cpu", "cuda", "cuda:1"] {
            assert!(ok.parse::<DeviceName>().is_ok(), "{ok}");
        }
        for bad in ["cuda:", "cuda:x", "tpu"] {
            assert!(bad.parse::<DeviceName>().is_err(), "{bad}");
        }
    }
}
