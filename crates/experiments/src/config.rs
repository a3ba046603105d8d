//! Experiment configs are data. Each experiment's config per scale is the repository file
//! `experiments/<name>/<scale>.toml`, embedded in this crate (so the binary stands alone);
//! `reproduce --config FILE` reads a user's file instead, and `--set KEY=VALUE` changes keys of
//! either before the config is checked. [`ConfigSource::resolve`] does all of it before anything
//! runs, and every error names the file and the dotted key:
//!
//! | what is wrong | the error |
//! |---|---|
//! | TOML syntax | `my.toml: not valid TOML: …` (with the line and column) |
//! | an integer beyond 64 bits (the parser refuses it) | `my.toml: not valid TOML: model.n_layer: number too large to fit in target type at line 26, column 11` |
//! | a value of the wrong type | `experiments/vit-fmnist/cpu.toml: train.lr: invalid type: string "x", expected f64` |
//! | a value out of its type's range, or not one of its names, also inside a `kind = "…"` table | ``job.toml: model.n_layer: invalid value: integer `-1`, expected usize``, ``job.toml: data.tokenizer: unknown variant `bpe`, …`` |
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
/// horizon, and the series ([`kappa_cli::SERIES`]), which have `smoke`, `long` and `gpu` only.
pub const BUILTIN_OPTIONAL: &[Builtin] = &[
    builtin_file!("manifolds", Long, "long"),
    builtin_file!("scaling", Smoke, "smoke"),
    builtin_file!("scaling", Long, "long"),
    builtin_file!("scaling", Gpu, "gpu"),
];

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

/// The largest config file read: 16 MiB. A config is a few KiB of TOML (the largest built-in
/// file is under 16 KiB); a file a thousand times that is not one, and is refused before it is
/// read.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The top-level key that says which experiment a file configures.
pub const EXPERIMENT_KEY: &str = "experiment";

/// Why a config could not be read; every variant names where the config came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{origin}: {error}")]
    Read {
        /// The path.
        origin: String,
        /// The I/O error (in the message, so not a `source` that an error chain would print
        /// twice).
        error: std::io::Error,
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

    /// A user's file (`--config FILE`): a regular file (a link to one is followed) of at most
    /// [`MAX_CONFIG_BYTES`]. Anything else is an error naming it before a byte is read: a FIFO
    /// would block the read until a writer came, a device such as `/dev/zero` never ends.
    pub fn file(path: &Path) -> Result<Self, ConfigError> {
        let origin = path.display().to_string();
        let read = || {
            let meta = std::fs::metadata(path)?;
            let refuse =
                |why: String| Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, why));
            if !meta.is_file() {
                return refuse("not a regular file (a config is a TOML text file)".into());
            }
            if meta.len() > MAX_CONFIG_BYTES {
                let size = kappa_models::memory::human_bytes(meta.len().into());
                let max = kappa_models::memory::human_bytes(MAX_CONFIG_BYTES.into());
                return refuse(format!("{size}, larger than the {max} a config may be"));
            }
            std::fs::read_to_string(path)
        };
        match read() {
            Ok(text) => Ok(Self::new(origin, text)),
            Err(error) => Err(ConfigError::Read { origin, error }),
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
        let config: C = serde_path_to_error::deserialize(root.clone()).map_err(|e| {
            let key = culprit::<C>(&root, dotted(e.path()), e.inner().message());
            let message = describe(&key, e.inner().message());
            let set = added
                .iter()
                .find(|s| key == s.key || key.starts_with(&format!("{}.", s.key)));
            self.key_error(set.copied(), message)
        })?;
        self.check_kept(&config, &added)?;
        self.check_fieldless_variants(&root, &config)?;
        Ok(config)
    }

    fn table(&self) -> Result<toml::Table, ConfigError> {
        toml::from_str(&self.text).map_err(|e| {
            let span = e.span();
            let key = span
                .as_ref()
                .and_then(|s| key_of_value_at(&self.text, s.start));
            ConfigError::Syntax {
                origin: self.origin.clone(),
                message: key.map(|k| format!("{k}: ")).unwrap_or_default()
                    + e.message()
                    + &line_of(&self.text, span),
            }
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

    /// A table tagged by `kind` whose variant has no fields (`[optimizer] kind = "adamw"`,
    /// `correction = { kind = "none" }`) is read by serde without a look at its other keys:
    /// such a key is an error here, as it is in every other table.
    fn check_fieldless_variants<C: Serialize>(
        &self,
        root: &toml::Value,
        config: &C,
    ) -> Result<(), ConfigError> {
        let back =
            toml::Value::try_from(config).map_err(|e| self.key_error(None, e.to_string()))?;
        match dropped_by_fieldless_variant(root, &back, "") {
            None => Ok(()),
            Some((key, kind)) => Err(self.key_error(
                None,
                format!("unknown field {key}: `kind = \"{kind}\"` takes no other keys"),
            )),
        }
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
/// The first key (dotted, below `prefix`) of a table in `file` tagged `kind = K` whose
/// counterpart in `back` (the config written back) holds `kind` alone, with that `K`: a key the
/// field-less variant dropped.
fn dropped_by_fieldless_variant(
    file: &toml::Value,
    back: &toml::Value,
    prefix: &str,
) -> Option<(String, String)> {
    let (toml::Value::Table(file), toml::Value::Table(back)) = (file, back) else {
        return None;
    };
    let key_of = |k: &str| match prefix {
        "" => k.to_string(),
        p => format!("{p}.{k}"),
    };
    let fieldless = back.len() == 1 && back.contains_key("kind");
    if let (true, Some(toml::Value::String(kind))) = (fieldless, file.get("kind")) {
        if let Some(extra) = file.keys().find(|k| *k != "kind") {
            return Some((key_of(extra), kind.clone()));
        }
    }
    file.iter().find_map(|(k, v)| {
        let below = back.get(k)?;
        dropped_by_fieldless_variant(v, below, &key_of(k))
    })
}

fn lookup<'v>(root: &'v toml::Value, set: &Set) -> Option<&'v toml::Value> {
    value_at(root, &set.path().map(String::from).collect::<Vec<_>>())
}

/// The dotted key of a value the TOML parser refused at byte `at` of `text` (an integer beyond
/// 64 bits): the text read again with a marker string in the value's place, and the key found
/// where the marker is. `None` when the span is not a value or the text has another error.
fn key_of_value_at(text: &str, at: usize) -> Option<String> {
    const MARKER: &str = "kappa: the value the TOML parser refused";
    let rest = text.get(at..)?;
    let token = |c: char| c.is_ascii_alphanumeric() || "+-._".contains(c);
    let len = rest.find(|c| !token(c)).unwrap_or(rest.len());
    if len == 0 {
        return None;
    }
    let marked = format!("{}\"{MARKER}\"{}", &text[..at], &rest[len..]);
    let root = toml::Value::Table(toml::from_str(&marked).ok()?);
    let mut paths = Vec::new();
    entries(&root, &mut Vec::new(), &mut paths);
    paths
        .into_iter()
        .find(|p| value_at(&root, p).and_then(toml::Value::as_str) == Some(MARKER))
        .map(|p| p.join("."))
}

/// The dotted key of a deserialization error of `root` into `C` that serde_path_to_error
/// reported at `key` with `message`. The path it records stops at a value that serde reads
/// into a buffer before deserializing it, as an internally tagged enum (`kind = "…"`) is;
/// below it the key is found by trial, deserializing `root` again with entries removed:
///
/// * a missing field `x`: the table under `key` (itself first) where adding `x` changes the
///   error ([`missing_from`]);
/// * any other error: serde stops at the first bad value in the order of the entries (a
///   table's `kind` first: the tag is read before the rest), so removing the entries from
///   the culprit on changes the error, and removing those after it does not. The culprit is
///   the last entry whose removal with all after it changes the error.
///
/// Otherwise `key` itself. Errors are rare and configs small: the trials take microseconds.
fn culprit<C: DeserializeOwned>(root: &toml::Value, key: String, message: &str) -> String {
    let base: Vec<String> = key
        .split('.')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let Some(below) = value_at(root, &base) else {
        return key;
    };
    let mut paths = Vec::new();
    entries(below, &mut base.clone(), &mut paths);
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split_once('`'));
    let found = match missing {
        Some((field, _)) => missing_from::<C>(root, base, paths, field, message),
        None => (0..paths.len()).rev().find_map(|from| {
            let mut trial = root.clone();
            paths[from..]
                .iter()
                .rev()
                .for_each(|p| remove_at(&mut trial, p));
            let same = C::deserialize(trial).is_err_and(|e| e.message() == message);
            (!same).then(|| paths[from].clone())
        }),
    };
    found.map_or(key, |p| p.join("."))
}

/// The path of the table under `base` (itself first, then `paths` in order) that lacks
/// `field`: adding it there changes the error `message` to one that is not about `field`
/// being unknown.
fn missing_from<C: DeserializeOwned>(
    root: &toml::Value,
    base: Vec<String>,
    paths: Vec<Vec<String>>,
    field: &str,
    message: &str,
) -> Option<Vec<String>> {
    let unknown = format!("unknown field `{field}`");
    let tables = std::iter::once(base).chain(paths);
    let lacks = |p: &Vec<String>| {
        value_at(root, p)
            .and_then(toml::Value::as_table)
            .is_some_and(|t| !t.contains_key(field))
    };
    tables
        .filter(lacks)
        .find(|p| {
            let mut trial = root.clone();
            if let Some(toml::Value::Table(t)) = value_at_mut(&mut trial, p) {
                t.insert(field.to_string(), toml::Value::Boolean(false));
            }
            match C::deserialize(trial) {
                Ok(_) => true,
                Err(e) => e.message() != message && !e.message().starts_with(&unknown),
            }
        })
        .map(|mut p| {
            p.push(field.to_string());
            p
        })
}

/// The path of every entry under `value`, each after `path`, in the order serde reads them:
/// depth first, a table's `kind` (an internally tagged enum's tag) first, then its keys in
/// order.
fn entries(value: &toml::Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let children: Vec<(String, &toml::Value)> = match value {
        toml::Value::Table(t) => {
            let (tag, rest): (Vec<_>, Vec<_>) = t.iter().partition(|(k, _)| *k == "kind");
            tag.into_iter()
                .chain(rest)
                .map(|(k, v)| (k.clone(), v))
                .collect()
        }
        toml::Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, v)| (i.to_string(), v))
            .collect(),
        _ => return,
    };
    for (key, child) in children {
        path.push(key);
        out.push(path.clone());
        entries(child, path, out);
        path.pop();
    }
}

/// The value at `path` (table keys and array indices).
fn value_at<'v>(root: &'v toml::Value, path: &[String]) -> Option<&'v toml::Value> {
    path.iter().try_fold(root, |here, part| match here {
        toml::Value::Table(t) => t.get(part),
        toml::Value::Array(a) => a.get(part.parse::<usize>().ok()?),
        _ => None,
    })
}

/// [`value_at`], mutable.
fn value_at_mut<'v>(root: &'v mut toml::Value, path: &[String]) -> Option<&'v mut toml::Value> {
    path.iter().try_fold(root, |here, part| match here {
        toml::Value::Table(t) => t.get_mut(part),
        toml::Value::Array(a) => a.get_mut(part.parse::<usize>().ok()?),
        _ => None,
    })
}

/// Removes the value at `path`, if there is one.
fn remove_at(root: &mut toml::Value, path: &[String]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    match value_at_mut(root, parent) {
        Some(toml::Value::Table(t)) => {
            t.remove(last);
        }
        Some(toml::Value::Array(a)) => {
            if let Some(i) = last.parse::<usize>().ok().filter(|&i| i < a.len()) {
                a.remove(i);
            }
        }
        _ => {}
    }
}

/// A deserializer path as the dotted TOML key (`variants.2.correction.lambda`).
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

    /// An internally tagged enum inside another, as model and data tables are.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
    enum Shape {
        Square { side: u32, color: Color, fill: Fill },
        Circle { radius: f64 },
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Color {
        Red,
        Blue,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
    enum Fill {
        Solid,
        Hatched { every: u64 },
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Drawing {
        name: String,
        shape: Shape,
    }

    const DRAWING: &str = "name = \"d\"\n\n[shape]\nkind = \"square\"\nside = 3\ncolor = \"red\"\n\
                           fill = { kind = \"hatched\", every = 2 }\n";

    fn drawing(text: &str, sets: &[&str]) -> Result<Drawing, String> {
        let sets: Vec<Set> = sets.iter().map(|s| s.parse().unwrap()).collect();
        ConfigSource::new("d.toml", text.to_string())
            .resolve("demo", &sets)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn an_error_inside_a_tagged_table_names_the_full_dotted_key() {
        assert!(drawing(DRAWING, &[]).is_ok());
        for (edit, start) in [
            (
                "shape.side=-1",
                "d.toml: shape.side: invalid value: integer `-1`, expected u32",
            ),
            (
                "shape.side=5000000000",
                "d.toml: shape.side: invalid value: integer `5000000000`, expected u32",
            ),
            (
                "shape.side=1.5",
                "d.toml: shape.side: invalid type: floating point",
            ),
            (
                "shape.color=mauve",
                "d.toml: shape.color: unknown variant `mauve`",
            ),
            (
                "shape.fill.every=-2",
                "d.toml: shape.fill.every: invalid value: integer `-2`",
            ),
            (
                "shape.fill.kind=dotted",
                "d.toml: shape.fill.kind: unknown variant `dotted`",
            ),
            (
                "shape.kind=hexagon",
                "d.toml: shape.kind: unknown variant `hexagon`",
            ),
            (
                "shape.sides=4",
                "d.toml: --set shape.sides=4: unknown field shape.sides (",
            ),
            (
                "shape.fill.dots=4",
                "d.toml: --set shape.fill.dots=4: unknown field shape.fill.dots",
            ),
        ] {
            let err = drawing(DRAWING, &[edit]).unwrap_err();
            assert!(err.starts_with(start), "--set {edit}: {err}");
        }
        // Two bad values: the first one read is named.
        let err = drawing(DRAWING, &["shape.side=-1", "shape.fill.every=-2"]).unwrap_err();
        assert!(err.starts_with("d.toml: shape.fill.every: "), "{err}");
        let missing = [
            (DRAWING.replace("side = 3\n", ""), "shape.side"),
            (DRAWING.replace(", every = 2", ""), "shape.fill.every"),
        ];
        for (text, key) in missing {
            let err = drawing(&text, &[]).unwrap_err();
            assert!(
                err.starts_with(&format!("d.toml: {key}: missing field")),
                "{err}"
            );
        }
    }

    #[test]
    fn a_key_beside_a_fieldless_kind_is_an_error_not_dropped() {
        let solid = DRAWING.replace("{ kind = \"hatched\", every = 2 }", "{ kind = \"solid\" }");
        assert!(drawing(&solid, &[]).is_ok());
        let text = solid.replace("\"solid\" }", "\"solid\", every = 2 }");
        let err = drawing(&text, &[]).unwrap_err();
        assert_eq!(
            err,
            "d.toml: unknown field shape.fill.every: `kind = \"solid\"` takes no other keys"
        );
    }

    #[test]
    fn an_integer_too_large_for_toml_is_a_syntax_error_naming_its_key_and_line() {
        let text = DRAWING.replace("side = 3", "side = 99999999999999999999");
        let err = drawing(&text, &[]).unwrap_err();
        assert!(
            err.starts_with("d.toml: not valid TOML: shape.side: number too large")
                && err.ends_with("at line 5, column 8"),
            "{err}"
        );
        let text = DRAWING.replace("every = 2", "every = 99999999999999999999");
        let err = drawing(&text, &[]).unwrap_err();
        assert!(
            err.contains("TOML: shape.fill.every: number too large"),
            "{err}"
        );
        // From --set, the number is not TOML: it is read as a string, named as well.
        let err = drawing(DRAWING, &["shape.side=99999999999999999999"]).unwrap_err();
        assert!(
            err.starts_with("d.toml: shape.side: invalid type: string"),
            "{err}"
        );
        // Text that is not TOML at all has no key.
        let err = drawing(&DRAWING.replace("side = 3", "side = = 3"), &[]).unwrap_err();
        assert!(
            err.starts_with("d.toml: not valid TOML: ") && err.contains("line 5"),
            "{err}"
        );
    }

    #[test]
    fn a_config_path_that_is_not_a_small_regular_file_is_refused_before_it_is_read() {
        let dir = std::env::temp_dir().join(format!("kappa-config-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.toml");
        std::fs::File::create(&big)
            .and_then(|f| f.set_len(MAX_CONFIG_BYTES + 1))
            .unwrap();
        let mut cases = vec![
            (dir.clone(), "not a regular file"),
            (big, "larger than the 16.000 MiB a config may be"),
        ];
        if cfg!(unix) {
            cases.push(("/dev/zero".into(), "not a regular file"));
        }
        for (path, why) in cases {
            let err = ConfigSource::file(&path).unwrap_err().to_string();
            assert!(
                err.starts_with(&path.display().to_string()) && err.contains(why),
                "{err}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
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
        let mut names: Vec<&str> = BUILTIN.iter().step_by(4).map(|b| b.experiment).collect();
        names.extend(kappa_cli::SERIES);
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
