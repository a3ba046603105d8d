//! Experiment configs are data. Each experiment's config per scale is the repository file
//! `experiments/<name>/<scale>.toml`, embedded in this crate (so the binary stands alone);
//! `reproduce --config FILE` reads a user's file instead, and `--set KEY=VALUE` changes keys of
//! either before the config is checked. [`ConfigSource::resolve`] does all of it before anything
//! runs, and every error names the file and the dotted key:
//!
//! | what is wrong | the error |
//! |---|---|
//! | TOML syntax | `my.toml: not valid TOML: …` |
//! | a value of the wrong type | `experiments/vit-fmnist/cpu.toml: train.lr: invalid type: string "x", expected f64` |
//! | a key the config does not have (config structs deny unknown fields) | `…: unknown field train.lrr (expected one of …)` |
//! | a `--set` of a key the config does not have | `…: --set train.lrr=1: unknown field train.lrr (…)` |
//! | the file's `experiment = "…"` names another experiment | `…: experiment = "theory", but this is the config of manifolds` |
//!
//! Values out of range are the experiment's to reject ([`crate::Experiment::validate`]); the
//! registry runs that check right after this one ([`crate::RegisteredExperiment::resolve`]).
//!
//! ```
//! use kappa_experiments::config::ConfigSource;
//! use kappa_experiments::suite::optim_geometry::Config;
//! use kappa_experiments::Scale;
//!
//! let source = ConfigSource::builtin("optim-geometry", Scale::Smoke)?;
//! let config: Config = source.resolve("optim-geometry", &["steps=7".parse()?])?;
//! assert_eq!(config.steps, 7);
//! let err = source.resolve::<Config>("optim-geometry", &["stepz=7".parse()?]).unwrap_err();
//! assert!(err.to_string().contains("--set stepz=7: unknown field stepz"), "{err}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Cow;
use std::path::Path;

use kappa_cli::Set;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::scale::Scale;

/// One built-in config file, `experiments/<experiment>/<scale>.toml`.
#[derive(Clone, Copy, Debug)]
pub struct Builtin {
    /// The experiment it configures.
    pub experiment: &'static str,
    /// Its scale.
    pub scale: Scale,
    /// The file's text.
    pub text: &'static str,
}

/// The files every experiment has, `experiments/<name>/{smoke,cpu,gpu,paper}.toml`.
macro_rules! builtin_files {
    ($($name:literal),* $(,)?) => {
        &[$(
            builtin_file!($name, Smoke, "smoke"),
            builtin_file!($name, Cpu, "cpu"),
            builtin_file!($name, Gpu, "gpu"),
            builtin_file!($name, Paper, "paper"),
        )*]
    };
}

macro_rules! builtin_file {
    ($name:literal, $scale:ident, $file:literal) => {
        Builtin {
            experiment: $name,
            scale: Scale::$scale,
            text: include_str!(concat!("../../../experiments/", $name, "/", $file, ".toml")),
        }
    };
}

/// Every experiment's files at the scales every experiment has (smoke, cpu, gpu, paper), in
/// registry order (the names are kappa-cli's list).
pub const BUILTIN: &[Builtin] = kappa_cli::with_experiment_names!(builtin_files);

/// The files of the scales only some experiments have: `long`, for the claims that need a long
/// horizon.
pub const BUILTIN_OPTIONAL: &[Builtin] = &[builtin_file!("manifolds", Long, "long")];

/// Every built-in file.
pub fn builtins() -> impl Iterator<Item = &'static Builtin> {
    BUILTIN.iter().chain(BUILTIN_OPTIONAL)
}

/// The scales `experiment` has built-in files for, cheapest first.
pub fn scales_of(experiment: &str) -> Vec<&'static str> {
    Scale::ALL
        .into_iter()
        .filter(|&s| has_builtin(experiment, s))
        .map(Scale::name)
        .collect()
}

/// Whether `experiment` has a built-in file at `scale`.
pub fn has_builtin(experiment: &str, scale: Scale) -> bool {
    builtins().any(|b| b.experiment == experiment && b.scale == scale)
}

/// The top-level key that says which experiment a file configures.
pub const EXPERIMENT_KEY: &str = "experiment";

/// Why a config could not be read; every variant names where the config came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{origin}: {source}")]
    Read {
        /// The path.
        origin: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// There is no built-in file for this experiment and scale.
    #[error("no built-in config experiments/{experiment}/{scale}.toml (its scales: {})", scales_of(experiment).join(", "))]
    NoBuiltin {
        /// The experiment.
        experiment: String,
        /// The scale.
        scale: Scale,
    },
    /// The text is not TOML.
    #[error("{origin}: not valid TOML: {message}")]
    Syntax {
        /// The file.
        origin: String,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A key is unknown or its value does not fit.
    #[error("{origin}: {}{message}", set.as_ref().map(|s| format!("--set {s}: ")).unwrap_or_default())]
    Key {
        /// The file.
        origin: String,
        /// The `--set` that made the key, if one did.
        set: Option<String>,
        /// What is wrong, starting with the dotted key.
        message: String,
    },
    /// The file's `experiment` key names another experiment.
    #[error("{origin}: experiment = \"{found}\", but this is the config of {expected}")]
    OtherExperiment {
        /// The file.
        origin: String,
        /// What the file says.
        found: String,
        /// The experiment being configured.
        expected: String,
    },
    /// A value is out of range ([`crate::Experiment::validate`]).
    #[error("{origin}: {message}")]
    Invalid {
        /// The file.
        origin: String,
        /// The experiment's message, naming the key.
        message: String,
    },
}

/// A config's text and where it came from (the name errors start with).
#[derive(Clone, Debug)]
pub struct ConfigSource {
    origin: String,
    text: Cow<'static, str>,
}

impl ConfigSource {
    /// The built-in file of `experiment` at `scale`.
    pub fn builtin(experiment: &str, scale: Scale) -> Result<Self, ConfigError> {
        builtins()
            .find(|b| b.experiment == experiment && b.scale == scale)
            .map(|b| Self {
                origin: format!("experiments/{experiment}/{scale}.toml"),
                text: Cow::Borrowed(b.text),
            })
            .ok_or_else(|| ConfigError::NoBuiltin {
                experiment: experiment.to_string(),
                scale,
            })
    }

    /// A user's file (`--config FILE`).
    pub fn file(path: &Path) -> Result<Self, ConfigError> {
        let origin = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(Self::new(origin, text)),
            Err(source) => Err(ConfigError::Read { origin, source }),
        }
    }

    /// A config from `text`, named `origin` in errors.
    pub fn new(origin: impl Into<String>, text: impl Into<Cow<'static, str>>) -> Self {
        Self {
            origin: origin.into(),
            text: text.into(),
        }
    }

    /// The name errors start with: `experiments/<name>/<scale>.toml`, or the user's path.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The text as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The file's `experiment = "NAME"`, if it has one.
    pub fn experiment_key(&self) -> Result<Option<String>, ConfigError> {
        match self.table()?.remove(EXPERIMENT_KEY) {
            None => Ok(None),
            Some(toml::Value::String(name)) => Ok(Some(name)),
            Some(other) => Err(self.key_error(
                None,
                format!("{EXPERIMENT_KEY}: expected a string, found {other}"),
            )),
        }
    }

    /// The config of `experiment`: the text with `sets` applied, read into `C`. Unknown keys,
    /// values of the wrong type and `--set` keys that the config does not have are errors that
    /// name the key (see the module docs). Values are not range-checked here.
    pub fn resolve<C: DeserializeOwned + Serialize>(
        &self,
        experiment: &str,
        sets: &[Set],
    ) -> Result<C, ConfigError> {
        let mut table = self.table()?;
        match table.remove(EXPERIMENT_KEY) {
            None => {}
            Some(toml::Value::String(found)) if found == experiment => {}
            Some(toml::Value::String(found)) => {
                return Err(ConfigError::OtherExperiment {
                    origin: self.origin.clone(),
                    found,
                    expected: experiment.to_string(),
                })
            }
            Some(other) => {
                return Err(self.key_error(
                    None,
                    format!("{EXPERIMENT_KEY}: expected a string, found {other}"),
                ))
            }
        }
        let mut root = toml::Value::Table(table);
        let mut added = Vec::new();
        for set in sets {
            if apply(&mut root, set).map_err(|m| self.key_error(Some(set), m))? {
                added.push(set);
            }
        }
        let config: C = serde_path_to_error::deserialize(root).map_err(|e| {
            let key = dotted(e.path());
            let message = describe(&key, e.inner().message());
            let set = added
                .iter()
                .find(|s| key == s.key || key.starts_with(&format!("{}.", s.key)));
            self.key_error(set.copied(), message)
        })?;
        self.check_kept(&config, &added)?;
        Ok(config)
    }

    fn table(&self) -> Result<toml::Table, ConfigError> {
        toml::from_str(&self.text).map_err(|e| ConfigError::Syntax {
            origin: self.origin.clone(),
            message: e.message().to_string() + &line_of(&self.text, e.span()),
        })
    }

    /// A key added by `--set` that the config read without complaint but does not hold (a
    /// type that ignores unknown keys) is an error too: nothing is silently dropped.
    fn check_kept<C: Serialize>(&self, config: &C, added: &[&Set]) -> Result<(), ConfigError> {
        let back =
            toml::Value::try_from(config).map_err(|e| self.key_error(None, e.to_string()))?;
        for set in added {
            if lookup(&back, set).is_none() {
                let message = format!("unknown field {}", set.key);
                return Err(self.key_error(Some(set), message));
            }
        }
        Ok(())
    }

    fn key_error(&self, set: Option<&Set>, message: String) -> ConfigError {
        ConfigError::Key {
            origin: self.origin.clone(),
            set: set.map(ToString::to_string),
            message,
        }
    }
}

/// The value of a `--set`: its text read as a TOML value, or as a string when it is not TOML
/// (`3e-4` is a float, `[1, 2]` an array, `{ kind = "svd", every = 1 }` a table, `cpu` and
/// `"cpu"` the string `cpu`).
pub fn set_value(text: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_string()))
}

/// Puts `set` into `root` along its dotted path (a number indexes an array). Returns whether
/// the last key was new; a missing table or array entry on the way is an error.
fn apply(root: &mut toml::Value, set: &Set) -> Result<bool, String> {
    let parts: Vec<&str> = set.path().collect();
    let (last, parents) = parts.split_last().ok_or("an empty key")?;
    let mut here = root;
    for (i, part) in parents.iter().enumerate() {
        here = child(here, &parts[..i], part)?;
    }
    let value = set_value(&set.value);
    match here {
        toml::Value::Table(t) => Ok(t.insert(last.to_string(), value).is_none()),
        _ => {
            *child(here, parents, last)? = value;
            Ok(false)
        }
    }
}

/// The entry `part` of the table at `path`, or entry number `part` of the array there.
fn child<'v>(
    value: &'v mut toml::Value,
    path: &[&str],
    part: &str,
) -> Result<&'v mut toml::Value, String> {
    let here = if path.is_empty() {
        "the top level".to_string()
    } else {
        path.join(".")
    };
    match value {
        toml::Value::Table(t) => t.get_mut(part).ok_or_else(|| {
            let key = [path, &[part]].concat().join(".");
            format!("no table {key} in this config")
        }),
        toml::Value::Array(a) => {
            let len = a.len();
            part.parse::<usize>()
                .ok()
                .and_then(|i| a.get_mut(i))
                .ok_or_else(|| format!("{here} has {len} entries"))
        }
        _ => Err(format!("{here} is a value, not a table")),
    }
}

/// The value at the dotted key of `set` in `root`, if there is one.
fn lookup<'v>(root: &'v toml::Value, set: &Set) -> Option<&'v toml::Value> {
    set.path().try_fold(root, |here, part| match here {
        toml::Value::Table(t) => t.get(part),
        toml::Value::Array(a) => a.get(part.parse::<usize>().ok()?),
        _ => None,
    })
}

/// A deserializer path as the dotted TOML key (`variants.2.conditioning.lambda`).
fn dotted(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let parts: Vec<String> = path
        .iter()
        .map(|segment| match segment {
            Segment::Seq { index } => index.to_string(),
            Segment::Map { key } => key.clone(),
            Segment::Enum { variant } => variant.clone(),
            Segment::Unknown => "?".to_string(),
        })
        .collect();
    parts.join(".")
}

/// The message of a deserialization error at `key`, starting with the dotted key: serde's
/// "unknown field `lrr`, expected one of …" becomes "unknown field train.lrr (expected one of …)".
fn describe(key: &str, message: &str) -> String {
    let unknown = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split_once('`'));
    match unknown {
        Some((field, rest)) => {
            let full = if key == field || key.ends_with(&format!(".{field}")) {
                key.to_string()
            } else if key.is_empty() || key == "." {
                field.to_string()
            } else {
                format!("{key}.{field}")
            };
            let rest = rest.trim_start_matches(", ");
            if rest.is_empty() {
                format!("unknown field {full}")
            } else {
                format!("unknown field {full} ({rest})")
            }
        }
        None if key.is_empty() || key == "." => message.to_string(),
        None => format!("{key}: {message}"),
    }
}

/// " at line L, column C" for a byte span of `text`.
fn line_of(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(start) = span.map(|s| s.start.min(text.len())) else {
        return String::new();
    };
    let before = &text[..text.floor_char_boundary(start)];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!(" at line {line}, column {column}")
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Train {
        lr: f64,
        steps: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Demo {
        train: Train,
        names: Vec<String>,
        #[serde(default)]
        extra: std::collections::BTreeMap<String, f64>,
    }

    const TEXT: &str =
        "experiment = \"demo\"\nnames = [\"a\", \"b\"]\n\n[train]\nlr = 0.1\nsteps = 3\n";

    fn resolve(text: &str, sets: &[&str]) -> Result<Demo, String> {
        let sets: Vec<Set> = sets.iter().map(|s| s.parse().unwrap()).collect();
        ConfigSource::new("demo.toml", text.to_string())
            .resolve("demo", &sets)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_file_reads_into_its_config() {
        let demo = resolve(TEXT, &[]).unwrap();
        assert_eq!(demo.train.lr, 0.1);
        assert_eq!(demo.names, ["a", "b"]);
    }

    #[test]
    fn errors_name_the_file_and_the_dotted_key() {
        let err = resolve(&TEXT.replace("lr = 0.1", "lr = \"x\""), &[]).unwrap_err();
        assert_eq!(
            err,
            "demo.toml: train.lr: invalid type: string \"x\", expected f64"
        );
        let err = resolve(&TEXT.replace("lr = 0.1", "lrr = 0.1"), &[]).unwrap_err();
        assert!(
            err.starts_with("demo.toml: unknown field train.lrr (expected one of `lr`"),
            "{err}"
        );
        let err = resolve(
            &TEXT.replace("names = [\"a\", \"b\"]", "names = [\"a\", 2]"),
            &[],
        )
        .unwrap_err();
        assert!(
            err.starts_with("demo.toml: names.1: invalid type: integer `2`"),
            "{err}"
        );
        let err = resolve(&TEXT.replace("steps = 3", "steps = "), &[]).unwrap_err();
        assert!(
            err.starts_with("demo.toml: not valid TOML: ") && err.contains("at line 6"),
            "{err}"
        );
        let err = resolve(&TEXT.replace("\"demo\"", "\"other\""), &[]).unwrap_err();
        assert_eq!(
            err,
            "demo.toml: experiment = \"other\", but this is the config of demo"
        );
    }

    #[test]
    fn sets_change_keys_and_refuse_unknown_ones() {
        let demo = resolve(
            TEXT,
            &[
                "train.lr=3e-4",
                "names=[\"c\"]",
                "names.0=d",
                "train.limit=5",
            ],
        )
        .unwrap();
        assert_eq!(
            demo.train,
            Train {
                lr: 3e-4,
                steps: 3,
                limit: Some(5)
            }
        );
        assert_eq!(demo.names, ["d"]);
        let err = resolve(TEXT, &["train.lrr=1"]).unwrap_err();
        assert!(
            err.starts_with("demo.toml: --set train.lrr=1: unknown field train.lrr ("),
            "{err}"
        );
        let err = resolve(TEXT, &["train.lr=x"]).unwrap_err();
        assert_eq!(
            err,
            "demo.toml: train.lr: invalid type: string \"x\", expected f64"
        );
        let err = resolve(TEXT, &["model.width=3"]).unwrap_err();
        assert_eq!(
            err,
            "demo.toml: --set model.width=3: no table model in this config"
        );
        let err = resolve(TEXT, &["names.5=x"]).unwrap_err();
        assert_eq!(err, "demo.toml: --set names.5=x: names has 2 entries");
        let err = resolve(TEXT, &["train.lr.x=1"]).unwrap_err();
        assert_eq!(
            err,
            "demo.toml: --set train.lr.x=1: train.lr is a value, not a table"
        );
        // A map accepts any key, and keeps it: no error.
        let demo = resolve(&format!("{TEXT}\n[extra]\n"), &["extra.k=1.5"]).unwrap();
        assert_eq!(demo.extra["k"], 1.5);
    }

    #[test]
    fn a_set_key_that_a_lenient_type_would_drop_is_an_error() {
        #[derive(Debug, Serialize, Deserialize)]
        struct Lenient {
            a: u32,
        }
        let source = ConfigSource::new("lenient.toml", "a = 1\n");
        let sets = ["b=2".parse().unwrap()];
        let err = source.resolve::<Lenient>("x", &sets).unwrap_err();
        assert_eq!(err.to_string(), "lenient.toml: --set b=2: unknown field b");
    }

    #[test]
    fn set_values_are_toml_or_strings() {
        assert_eq!(set_value("3e-4"), toml::Value::Float(3e-4));
        assert_eq!(set_value("7"), toml::Value::Integer(7));
        assert_eq!(set_value("true"), toml::Value::Boolean(true));
        assert_eq!(set_value("cpu"), toml::Value::String("cpu".into()));
        assert_eq!(set_value("\"cpu\""), toml::Value::String("cpu".into()));
        assert_eq!(set_value("a = b"), toml::Value::String("a = b".into()));
        assert!(set_value("[1, 2]").is_array());
        assert!(set_value("{ kind = \"svd\", every = 1 }").is_table());
    }

    #[test]
    fn every_builtin_file_names_its_experiment() {
        let names: Vec<&str> = BUILTIN.iter().step_by(4).map(|b| b.experiment).collect();
        assert_eq!(names, kappa_cli::EXPERIMENTS);
        for b in builtins() {
            let source = ConfigSource::builtin(b.experiment, b.scale).unwrap();
            assert_eq!(
                source.experiment_key().unwrap().as_deref(),
                Some(b.experiment)
            );
            let origin = format!("experiments/{}/{}.toml", b.experiment, b.scale);
            assert_eq!(source.origin(), origin);
        }
        assert!(has_builtin("manifolds", Scale::Long));
        assert!(!has_builtin("theory", Scale::Long));
        let err = ConfigSource::builtin("theory", Scale::Long).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no built-in config experiments/theory/long.toml (its scales: smoke, cpu, gpu, paper)"
        );
    }
}
