//! Run folders: `config.toml`, `metrics.jsonl` and `run.json`, written by [`Run`] and read back
//! by [`RunRecord`].
//!
//! # Resume
//!
//! [`Run::create`] starts a folder afresh; [`Run::resume`] (behind `reproduce --resume`) reuses
//! one. A folder whose `run.json` says completed or diverged is [`Resumed::Finished`] and is not
//! run again; a folder without `run.json` (the process was killed) or whose run failed is
//! [`Resumed::Continued`]: `metrics.jsonl` is kept (minus a torn last line) and appended to, and
//! the experiment decides what to skip and where to continue (see
//! [`crate::experiments::vit_fmnist::train_variant`] and [`Run::retain_metrics`]); the registry
//! reruns the folder from the start instead for an experiment that cannot continue a run
//! ([`crate::Experiment::continues_interrupted_runs`]). Either way the
//! folder's `config.toml` must equal the config this build would write, or the resume stops with
//! [`ResumeError::ConfigChanged`], naming the keys that differ: a run folder never mixes configs.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::scale::Scale;

/// How a run ended. A diverged run is a result, not an error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum RunStatus {
    /// The run did everything its config asked for.
    Completed,
    /// Training stopped because the loss became non-finite or exploded.
    Diverged {
        /// The step at which divergence was detected.
        step: u64,
        /// What was detected.
        reason: String,
    },
    /// The run stopped with an error.
    Failed {
        /// The error, with its causes.
        error: String,
    },
}

/// Who ran what, where: the header of `config.toml` and the body of `run.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunContext {
    /// The experiment's registry name.
    pub experiment: String,
    /// The scale it ran at.
    pub scale: Scale,
    /// The seed of this run.
    pub seed: u64,
    /// BLAS / libtorch threads.
    pub threads: usize,
    /// `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// Where the data sets are.
    pub data_dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct ConfigFile<C> {
    run: RunContext,
    config: C,
}

/// `run.json`: the context, how the run ended, and how long it took.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunInfo {
    /// The context the run was started with.
    pub run: RunContext,
    /// How it ended.
    #[serde(flatten)]
    pub status: RunStatus,
    /// Wall-clock seconds from start to finish.
    pub wall_seconds: f64,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix: u64,
    /// How many times the run was resumed (`reproduce --resume`). `wall_seconds` then adds the
    /// time recorded by earlier failed attempts; time lost in a killed process is not counted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resumes: u32,
    /// The BLAS kernel the run's process used ([`kappa_linalg::blas_report`]), e.g.
    /// `OpenBLAS 0.3.21 … Haswell, kernel Haswell; CPU level Avx512`.
    #[serde(default)]
    pub blas: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Why a run folder cannot be resumed.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The folder's `config.toml` differs from the config of this build and these settings.
    #[error(
        "{path} was written with a different config ({differences}); run without --resume to \
         start the experiment over, or restore the settings it was run with",
        path = path.display(),
        differences = differences.join("; ")
    )]
    ConfigChanged {
        /// The `config.toml` that differs.
        path: PathBuf,
        /// One `key: old → new` entry per differing key (dotted TOML paths).
        differences: Vec<String>,
    },
}

/// What [`Run::resume`] found in a run folder.
pub enum Resumed {
    /// The folder holds no run (or no `config.toml`): it was created afresh.
    Started(Run),
    /// The run had been interrupted or had failed: it continues in the same folder.
    Continued(Run),
    /// The run had completed or diverged: nothing to do, here is its `run.json`.
    Finished(RunInfo),
}

/// A run folder being written.
pub struct Run {
    dir: PathBuf,
    context: RunContext,
    metrics: BufWriter<File>,
    started: Instant,
    started_unix: u64,
    earlier_seconds: f64,
    resumes: u32,
    interruption: Option<(usize, u64)>,
}

impl Run {
    /// Creates (or empties) `dir` and writes `config.toml`.
    pub fn create<C: Serialize>(dir: &Path, context: RunContext, config: &C) -> Result<Self> {
        if dir.exists() {
            fs::remove_dir_all(dir).with_context(|| format!("emptying {}", dir.display()))?;
        }
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        fs::write(dir.join("config.toml"), config_text(&context, config)?)?;
        let metrics = File::create(dir.join("metrics.jsonl"))?;
        Ok(Self::open(dir, context, metrics))
    }

    /// Reuses `dir` if it holds a run of the same config: a completed or diverged run is
    /// [`Resumed::Finished`] (nothing is written), an interrupted or failed one is
    /// [`Resumed::Continued`] (its `run.json` is removed until the run finishes again, and a
    /// torn last line of `metrics.jsonl` is dropped). A folder without `config.toml` is created
    /// afresh. A different config is a [`ResumeError::ConfigChanged`].
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use kappa_experiments::run::{ResumeError, Resumed, Run, RunContext, RunStatus};
    /// use kappa_experiments::Scale;
    ///
    /// let dir = std::env::temp_dir().join(format!("kappa-doc-resume-{}", std::process::id()));
    /// let context = RunContext {
    ///     experiment: "demo".into(), scale: Scale::Smoke, seed: 0, threads: 1,
    ///     device: "cpu".into(), data_dir: "data".into(),
    /// };
    /// let config = BTreeMap::from([("steps", 4)]);
    /// Run::create(&dir, context.clone(), &config)?.finish(RunStatus::Completed)?;
    /// // The same config: the finished run is kept.
    /// assert!(matches!(Run::resume(&dir, context.clone(), &config)?, Resumed::Finished(_)));
    /// // Another config: an error naming the change, and the folder is left alone.
    /// let err = Run::resume(&dir, context, &BTreeMap::from([("steps", 5)])).err().unwrap();
    /// assert!(matches!(err.downcast_ref(), Some(ResumeError::ConfigChanged { .. })));
    /// assert!(err.to_string().contains("config.steps: 4 → 5"));
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), anyhow::Error>(())
    /// ```
    pub fn resume<C: Serialize>(dir: &Path, context: RunContext, config: &C) -> Result<Resumed> {
        let config_path = dir.join("config.toml");
        if !config_path.is_file() {
            return Ok(Resumed::Started(Self::create(dir, context, config)?));
        }
        ensure_same_config(&config_path, &config_text(&context, config)?)?;
        let previous = read_run_info(dir)?;
        if let Some(info) = &previous {
            if !matches!(info.status, RunStatus::Failed { .. }) {
                return Ok(Resumed::Finished(info.clone()));
            }
            fs::remove_file(dir.join("run.json"))?;
        }
        let metrics_path = dir.join("metrics.jsonl");
        drop_torn_last_line(&metrics_path)?;
        let metrics = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .with_context(|| format!("opening {}", metrics_path.display()))?;
        let mut run = Self::open(dir, context, metrics);
        if let Some(info) = previous {
            run.earlier_seconds = info.wall_seconds;
            run.resumes = info.resumes;
        }
        run.resumes += 1;
        Ok(Resumed::Continued(run))
    }

    fn open(dir: &Path, context: RunContext, metrics: File) -> Self {
        Self {
            dir: dir.to_path_buf(),
            context,
            metrics: BufWriter::new(metrics),
            started: Instant::now(),
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            earlier_seconds: 0.0,
            resumes: 0,
            interruption: None,
        }
    }

    /// Whether this run continues an earlier, unfinished one ([`Run::resume`]).
    pub fn is_resumed(&self) -> bool {
        self.resumes > 0
    }

    /// A test hook that stands in for killing the process: the training of variant `index`
    /// stops once `step` steps are done, right after its checkpoint is written, and
    /// [`crate::experiments::vit_fmnist::train_variant`] returns an error.
    pub fn interrupt_variant_at(&mut self, index: usize, step: u64) {
        self.interruption = Some((index, step));
    }

    /// The step at which [`Run::interrupt_variant_at`] stops variant `index`, if any.
    pub fn interruption_of(&self, index: usize) -> Option<u64> {
        self.interruption
            .and_then(|(i, step)| (i == index).then_some(step))
    }

    /// The run folder (for plots and checkpoints of this run).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The seed, scale, threads and device of this run.
    pub fn context(&self) -> &RunContext {
        &self.context
    }

    /// Appends one record to `metrics.jsonl` and flushes it, so that the file always holds
    /// every record logged before a checkpoint that was written after it (what resume needs).
    pub fn log<T: Serialize>(&mut self, record: &T) -> Result<()> {
        serde_json::to_writer(&mut self.metrics, record)?;
        self.metrics.write_all(b"\n")?;
        self.metrics.flush()?;
        Ok(())
    }

    /// Every record of this run's `metrics.jsonl` so far, parsed as `T`.
    pub fn metrics<T: DeserializeOwned>(&mut self) -> Result<Vec<T>> {
        self.metrics.flush()?;
        read_metrics(&self.dir.join("metrics.jsonl"))
    }

    /// Rewrites `metrics.jsonl` with only the records for which `keep` is true (in order), and
    /// returns how many were dropped. Resume uses it to drop the records an interrupted run
    /// logged after its last checkpoint, so that continuing does not duplicate them.
    pub fn retain_metrics<T: Serialize + DeserializeOwned>(
        &mut self,
        mut keep: impl FnMut(&T) -> bool,
    ) -> Result<usize> {
        let records: Vec<T> = self.metrics()?;
        let total = records.len();
        let kept: Vec<T> = records.into_iter().filter(|r| keep(r)).collect();
        let dropped = total - kept.len();
        if dropped == 0 {
            return Ok(0);
        }
        let path = self.dir.join("metrics.jsonl");
        let tmp = path.with_extension("jsonl.tmp");
        {
            let mut out = BufWriter::new(File::create(&tmp)?);
            for record in &kept {
                serde_json::to_writer(&mut out, record)?;
                out.write_all(b"\n")?;
            }
            out.flush()?;
        }
        fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))?;
        self.metrics = BufWriter::new(fs::OpenOptions::new().append(true).open(&path)?);
        Ok(dropped)
    }

    /// A progress bar for `len` units of work, labelled with the experiment and seed.
    pub fn progress(&self, len: u64, unit: &str) -> ProgressBar {
        let bar = ProgressBar::new(len);
        let template = format!(
            "{{prefix}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{msg}} ({{elapsed}}, ETA {{eta}})"
        );
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(format!(
            "{} seed {}",
            self.context.experiment, self.context.seed
        ));
        bar
    }

    /// Flushes the metrics and writes `run.json`.
    pub fn finish(mut self, status: RunStatus) -> Result<RunInfo> {
        self.metrics.flush()?;
        let info = RunInfo {
            run: self.context,
            status,
            wall_seconds: self.earlier_seconds + self.started.elapsed().as_secs_f64(),
            started_unix: self.started_unix,
            resumes: self.resumes,
            blas: kappa_linalg::blas_report().to_string(),
        };
        fs::write(
            self.dir.join("run.json"),
            serde_json::to_string_pretty(&info)?,
        )?;
        Ok(info)
    }
}

/// The text of `config.toml`: the run context and the experiment's config.
fn config_text<C: Serialize>(context: &RunContext, config: &C) -> Result<String> {
    let file = ConfigFile {
        run: context.clone(),
        config,
    };
    toml::to_string_pretty(&file).context("serializing the config to TOML")
}

/// Fails with [`ResumeError::ConfigChanged`] unless the TOML at `path` equals `expected` as a
/// TOML value (formatting aside).
fn ensure_same_config(path: &Path, expected: &str) -> Result<()> {
    let on_disk: toml::Value = toml::from_str(
        &fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))?;
    let wanted: toml::Value = toml::from_str(expected).context("parsing the new config")?;
    let mut differences = Vec::new();
    toml_differences("", &on_disk, &wanted, &mut differences);
    if differences.is_empty() {
        Ok(())
    } else {
        Err(ResumeError::ConfigChanged {
            path: path.to_path_buf(),
            differences,
        }
        .into())
    }
}

/// Appends `key: old → new` for every leaf where `old` and `new` differ.
fn toml_differences(key: &str, old: &toml::Value, new: &toml::Value, out: &mut Vec<String>) {
    match (old, new) {
        (toml::Value::Table(a), toml::Value::Table(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let sub = if key.is_empty() {
                    k.clone()
                } else {
                    format!("{key}.{k}")
                };
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => toml_differences(&sub, x, y, out),
                    (Some(x), None) => out.push(format!("{sub}: {x} → (absent)")),
                    (None, Some(y)) => out.push(format!("{sub}: (absent) → {y}")),
                    (None, None) => {}
                }
            }
        }
        _ if old == new => {}
        _ => out.push(format!("{key}: {old} → {new}")),
    }
}

/// `run.json` of a folder, if there is one.
fn read_run_info(dir: &Path) -> Result<Option<RunInfo>> {
    let path = dir.join("run.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let info =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok(Some(info))
}

/// Cuts a file after its last newline: a process killed in the middle of a write leaves a
/// partial last line, which would otherwise glue onto the next record.
fn drop_torn_last_line(path: &Path) -> Result<()> {
    let Ok(bytes) = fs::read(path) else {
        return Ok(());
    };
    let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if keep < bytes.len() {
        fs::write(path, &bytes[..keep]).with_context(|| format!("repairing {}", path.display()))?;
    }
    Ok(())
}

/// Every line of a `metrics.jsonl`, parsed as `T`.
fn read_metrics<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    BufReader::new(file)
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let line = line?;
            serde_json::from_str(&line)
                .with_context(|| format!("{}:{}: bad record", path.display(), i + 1))
        })
        .collect()
}

/// A finished run folder, read back from disk.
pub struct RunRecord {
    /// The run folder.
    pub dir: PathBuf,
    /// The contents of `run.json`.
    pub info: RunInfo,
    config_text: String,
}

impl RunRecord {
    /// Reads `run.json` and `config.toml` from a run folder.
    pub fn read(dir: &Path) -> Result<Self> {
        let info_path = dir.join("run.json");
        let info: RunInfo = serde_json::from_str(
            &fs::read_to_string(&info_path)
                .with_context(|| format!("reading {}", info_path.display()))?,
        )
        .with_context(|| format!("parsing {}", info_path.display()))?;
        let config_text = fs::read_to_string(dir.join("config.toml"))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            info,
            config_text,
        })
    }

    /// All run folders (`seed-*` with a `run.json`) under `results/<experiment>/<scale>/`.
    pub fn read_all(scale_dir: &Path) -> Result<Vec<Self>> {
        let mut runs = Vec::new();
        let Ok(entries) = fs::read_dir(scale_dir) else {
            return Ok(runs);
        };
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("run.json").is_file())
            .collect();
        dirs.sort();
        for dir in dirs {
            runs.push(Self::read(&dir)?);
        }
        Ok(runs)
    }

    /// The experiment config this run used.
    pub fn config<C: DeserializeOwned>(&self) -> Result<C> {
        let file: ConfigFile<C> = toml::from_str(&self.config_text)
            .with_context(|| format!("parsing {}/config.toml", self.dir.display()))?;
        Ok(file.config)
    }

    /// Every record of `metrics.jsonl`, parsed as `T`.
    pub fn metrics<T: DeserializeOwned>(&self) -> Result<Vec<T>> {
        read_metrics(&self.dir.join("metrics.jsonl"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Cfg {
        sizes: Vec<usize>,
        rate: f64,
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Rec {
        step: u64,
        loss: f64,
    }

    #[test]
    fn a_run_folder_round_trips() {
        let dir = std::env::temp_dir().join(format!("kappa-run-{}", std::process::id()));
        let context = RunContext {
            experiment: "demo".into(),
            scale: Scale::Smoke,
            seed: 3,
            threads: 1,
            device: "cpu".into(),
            data_dir: "data".into(),
        };
        let cfg = Cfg {
            sizes: vec![1, 2],
            rate: 0.5,
        };
        let mut run = Run::create(&dir, context, &cfg).unwrap();
        run.log(&Rec { step: 1, loss: 2.0 }).unwrap();
        run.log(&Rec { step: 2, loss: 1.5 }).unwrap();
        let status = RunStatus::Diverged {
            step: 2,
            reason: "loss is NaN".into(),
        };
        run.finish(status.clone()).unwrap();

        let record = RunRecord::read(&dir).unwrap();
        assert_eq!(record.config::<Cfg>().unwrap(), cfg);
        assert_eq!(record.info.status, status);
        assert_eq!(record.info.run.seed, 3);
        let recs: Vec<Rec> = record.metrics().unwrap();
        assert_eq!(
            recs,
            vec![Rec { step: 1, loss: 2.0 }, Rec { step: 2, loss: 1.5 }]
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
