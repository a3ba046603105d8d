//! Run folders: `config.toml`, `metrics.jsonl` and `run.json`, written by [`Run`] and read back
//! by [`RunRecord`].
//!
//! # Resume
//!
//! [`Run::create`] starts a folder afresh; [`Run::resume`] (behind `reproduce --resume`) reuses
//! one. A folder whose `run.json` says completed or diverged is [`Resumed::Finished`] and is not
//! run again; a folder without `run.json` (the process was killed) or whose run failed is
//! [`Resumed::Continued`]: `metrics.jsonl` is kept (minus a torn last line) and appended to, and
//! the caller decides what to skip and where to continue (see [`crate::variants`] and
//! [`Run::retain_metrics`]). Either way the folder's `config.toml` must equal the config of this
//! attempt, or the resume stops with [`RunError::ConfigChanged`], naming the keys that differ: a
//! run folder never mixes configs.
//!
//! `metrics.jsonl` has one writer, [`Run::log`]: one JSON object per line, flushed per line.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use crate::context::RunContext;
use crate::error::{RunError, RunResult as Result};

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

impl RunStatus {
    /// Whether the run is over: completed or diverged (a failed or interrupted run continues
    /// when resumed).
    pub fn is_finished(&self) -> bool {
        !matches!(self, RunStatus::Failed { .. })
    }
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
    /// The BLAS kernels the run's process used: OpenBLAS's ([`kappa_linalg::blas_report`]) and,
    /// on Linux, the code path of libtorch's MKL (`kappa_linalg::mkl::mkl_dispatch`), e.g.
    /// `OpenBLAS 0.3.21 … Haswell, kernel Haswell; CPU level Avx512; libtorch MKL: non-Intel
    /// CPU, Intel code path (vendor check answered by this binary); rayon: 2 workers, pinned` (the
    /// last part: `kappa_linalg::threads::global_pool_description`).
    #[serde(default)]
    pub blas: String,
}

/// [`RunInfo::blas`] for this process.
fn blas_description() -> String {
    let openblas = kappa_linalg::blas_report();
    let rayon = kappa_linalg::threads::global_pool_description();
    #[cfg(target_os = "linux")]
    return format!("{openblas}; {}; {rayon}", kappa_linalg::mkl::mkl_dispatch());
    #[cfg(not(target_os = "linux"))]
    return format!("{openblas}; {rayon}");
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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
            fs::remove_dir_all(dir).map_err(|e| RunError::io(dir, e))?;
        }
        fs::create_dir_all(dir).map_err(|e| RunError::io(dir, e))?;
        let config_path = dir.join("config.toml");
        fs::write(&config_path, config_text(&context, config)?)
            .map_err(|e| RunError::io(&config_path, e))?;
        let metrics_path = dir.join("metrics.jsonl");
        let metrics = File::create(&metrics_path).map_err(|e| RunError::io(&metrics_path, e))?;
        Ok(Self::open(dir, context, metrics))
    }

    /// Reuses `dir` if it holds a run of the same config: a completed or diverged run is
    /// [`Resumed::Finished`] (nothing is written), an interrupted or failed one is
    /// [`Resumed::Continued`] (its `run.json` is removed until the run finishes again, and a
    /// torn last line of `metrics.jsonl` is dropped). A folder without `config.toml` is created
    /// afresh. A different config is a [`RunError::ConfigChanged`]. The folder's config is read
    /// through `C` before the comparison, so a key that today's `C` has and the folder lacks
    /// (a field added later, with a `#[serde(default)]`) takes its default rather than counting
    /// as a change; a key the folder has and `C` does not is still a change.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use kappa_train::run::{Resumed, Run, RunContext, RunStatus};
    /// use kappa_train::RunError;
    ///
    /// let dir = std::env::temp_dir().join(format!("kappa-doc-resume-{}", std::process::id()));
    /// let context = RunContext {
    ///     name: "demo".into(), scale: "smoke".into(), ..RunContext::default()
    /// };
    /// let config = BTreeMap::from([("steps".to_string(), 4)]);
    /// Run::create(&dir, context.clone(), &config)?.finish(RunStatus::Completed)?;
    /// // The same config: the finished run is kept.
    /// assert!(matches!(Run::resume(&dir, context.clone(), &config)?, Resumed::Finished(_)));
    /// // Another config: an error naming the change, and the folder is left alone.
    /// let other = BTreeMap::from([("steps".to_string(), 5)]);
    /// let err = Run::resume(&dir, context, &other).err().unwrap();
    /// assert!(matches!(err, RunError::ConfigChanged { .. }));
    /// assert!(err.to_string().contains("config.steps: 4 → 5"));
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resume<C: Serialize + DeserializeOwned>(
        dir: &Path,
        context: RunContext,
        config: &C,
    ) -> Result<Resumed> {
        let config_path = dir.join("config.toml");
        if !config_path.is_file() {
            return Ok(Resumed::Started(Self::create(dir, context, config)?));
        }
        ensure_same_config::<C>(&config_path, &config_text(&context, config)?)?;
        let previous = read_run_info(dir)?;
        if let Some(info) = &previous {
            if !matches!(info.status, RunStatus::Failed { .. }) {
                return Ok(Resumed::Finished(info.clone()));
            }
            let info = dir.join("run.json");
            fs::remove_file(&info).map_err(|e| RunError::io(&info, e))?;
        }
        let metrics_path = dir.join("metrics.jsonl");
        drop_torn_last_line(&metrics_path)?;
        let metrics = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .map_err(|e| RunError::io(&metrics_path, e))?;
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

    /// A stand-in for killing the process (tests of resume use it): the training of variant
    /// `index` ([`crate::variants`]) stops once `step` steps are done, right after its
    /// checkpoint is written, and the driver returns [`RunError::Interrupted`].
    pub fn interrupt_variant_at(&mut self, index: usize, step: u64) {
        self.interruption = Some((index, step));
    }

    /// The step at which [`Run::interrupt_variant_at`] stops variant `index`, if any.
    pub fn interruption_of(&self, index: usize) -> Option<u64> {
        self.interruption
            .and_then(|(i, step)| (i == index).then_some(step))
    }

    /// Pins the libtorch threads of this run's training to `threads` (an experiment whose config
    /// knows better than the command line, e.g. one OpenMP thread beside its own worker pool);
    /// `run.json` records the pinned count. `config.toml` keeps the requested one, so resuming
    /// with the same command line matches.
    pub fn pin_threads(&mut self, threads: usize) {
        self.context.threads = threads;
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
        let path = self.dir.join("metrics.jsonl");
        let line = serde_json::to_vec(record).map_err(|e| RunError::format(&path, 0, e))?;
        (|| {
            self.metrics.write_all(&line)?;
            self.metrics.write_all(b"\n")?;
            self.metrics.flush()
        })()
        .map_err(|e| RunError::io(&path, e))
    }

    /// Every record of this run's `metrics.jsonl` so far, parsed as `T`.
    pub fn metrics<T: DeserializeOwned>(&mut self) -> Result<Vec<T>> {
        let path = self.dir.join("metrics.jsonl");
        self.metrics.flush().map_err(|e| RunError::io(&path, e))?;
        read_metrics(&path)
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
        write_lines(&tmp, &kept)?;
        fs::rename(&tmp, &path).map_err(|e| RunError::io(&path, e))?;
        let file = fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| RunError::io(&path, e))?;
        self.metrics = BufWriter::new(file);
        Ok(dropped)
    }

    /// A progress bar for `len` units of work, labelled with the run's name and seed; hidden
    /// when the context asks for no progress.
    pub fn progress(&self, len: u64, unit: &str) -> ProgressBar {
        let bar = ProgressBar::new(len);
        let template = format!(
            "{{prefix}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{msg}} ({{elapsed}}, ETA {{eta}})"
        );
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(format!("{} seed {}", self.context.name, self.context.seed));
        if !self.context.progress {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        bar
    }

    /// Flushes the metrics and writes `run.json`.
    pub fn finish(mut self, status: RunStatus) -> Result<RunInfo> {
        let metrics = self.dir.join("metrics.jsonl");
        self.metrics
            .flush()
            .map_err(|e| RunError::io(&metrics, e))?;
        let info = RunInfo {
            run: self.context,
            status,
            wall_seconds: self.earlier_seconds + self.started.elapsed().as_secs_f64(),
            started_unix: self.started_unix,
            resumes: self.resumes,
            blas: blas_description(),
        };
        let path = self.dir.join("run.json");
        let text =
            serde_json::to_string_pretty(&info).map_err(|e| RunError::format(&path, 0, e))?;
        fs::write(&path, text).map_err(|e| RunError::io(&path, e))?;
        Ok(info)
    }
}

/// The text of `config.toml`: the run context and the config.
fn config_text<C: Serialize>(context: &RunContext, config: &C) -> Result<String> {
    let file = ConfigFile {
        run: context.clone(),
        config,
    };
    toml::to_string_pretty(&file).map_err(|e| RunError::format("config.toml", 0, e))
}

/// Fails with [`RunError::ConfigChanged`] unless the TOML at `path` equals `expected` as a
/// TOML value (formatting aside), after [`renamed_keys`] and [`with_todays_defaults`].
fn ensure_same_config<C: Serialize + DeserializeOwned>(path: &Path, expected: &str) -> Result<()> {
    let text = fs::read_to_string(path).map_err(|e| RunError::io(path, e))?;
    let mut on_disk: toml::Value =
        toml::from_str(&text).map_err(|e| RunError::format(path, 0, e))?;
    renamed_keys(&mut on_disk);
    with_todays_defaults::<C>(&mut on_disk);
    let wanted: toml::Value =
        toml::from_str(expected).map_err(|e| RunError::format("the new config", 0, e))?;
    let mut differences = Vec::new();
    toml_differences("", &on_disk, &wanted, &mut differences);
    if differences.is_empty() {
        Ok(())
    } else {
        Err(RunError::ConfigChanged {
            path: path.to_path_buf(),
            differences,
        })
    }
}

/// Replaces the `[config]` table of a folder's `config.toml` by itself read through today's
/// `C` and written again, which fills the fields `C` gained since with their serde defaults.
/// A table `C` cannot read (a removed or misspelt key, a value of another type) is left as it
/// is, so that the comparison names what differs.
fn with_todays_defaults<C: Serialize + DeserializeOwned>(file: &mut toml::Value) {
    let Some(old) = file.get_mut("config") else {
        return;
    };
    let Ok(read) = old.clone().try_into::<C>() else {
        return;
    };
    if let Ok(again) = toml::Value::try_from(&read) {
        *old = again;
    }
}

/// Reads an older run folder's `config.toml` in today's names: `[run] experiment` is
/// `[run] name` (renamed when run folders moved into kappa-train). Only a rename is undone
/// here; a config whose fields changed is a changed config.
fn renamed_keys(file: &mut toml::Value) {
    let Some(run) = file.get_mut("run").and_then(toml::Value::as_table_mut) else {
        return;
    };
    if !run.contains_key("name") {
        if let Some(name) = run.remove("experiment") {
            run.insert("name".into(), name);
        }
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
    let text = fs::read_to_string(&path).map_err(|e| RunError::io(&path, e))?;
    let info = serde_json::from_str(&text).map_err(|e| RunError::format(&path, 0, e))?;
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
        fs::write(path, &bytes[..keep]).map_err(|e| RunError::io(path, e))?;
    }
    Ok(())
}

/// Every line of a `metrics.jsonl`, parsed as `T`.
fn read_metrics<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let file = File::open(path).map_err(|e| RunError::io(path, e))?;
    BufReader::new(file)
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let line = line.map_err(|e| RunError::io(path, e))?;
            serde_json::from_str(&line).map_err(|e| RunError::format(path, i + 1, e))
        })
        .collect()
}

/// Writes `records` to `path`, one JSON object per line.
fn write_lines<T: Serialize>(path: &Path, records: &[T]) -> Result<()> {
    let file = File::create(path).map_err(|e| RunError::io(path, e))?;
    let mut out = BufWriter::new(file);
    for record in records {
        serde_json::to_writer(&mut out, record).map_err(|e| RunError::format(path, 0, e))?;
        out.write_all(b"\n").map_err(|e| RunError::io(path, e))?;
    }
    out.flush().map_err(|e| RunError::io(path, e))
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
        let text = fs::read_to_string(&info_path).map_err(|e| RunError::io(&info_path, e))?;
        let info: RunInfo =
            serde_json::from_str(&text).map_err(|e| RunError::format(&info_path, 0, e))?;
        let config_path = dir.join("config.toml");
        let config_text =
            fs::read_to_string(&config_path).map_err(|e| RunError::io(&config_path, e))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            info,
            config_text,
        })
    }

    /// All run folders (sub-folders with a `run.json`) of `scale_dir`, in name order (the
    /// experiments keep `seed-*` folders under `results/<experiment>/<scale>/`).
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

    /// The config this run used.
    pub fn config<C: DeserializeOwned>(&self) -> Result<C> {
        let file: ConfigFile<C> = toml::from_str(&self.config_text)
            .map_err(|e| RunError::format(self.dir.join("config.toml"), 0, e))?;
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

    /// `Cfg` as a later version of the code has it: one field more, with a default.
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    #[serde(deny_unknown_fields)]
    struct CfgWithWarmup {
        sizes: Vec<usize>,
        rate: f64,
        #[serde(default)]
        warmup: u64,
    }

    /// `Cfg` with a field less.
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    #[serde(deny_unknown_fields)]
    struct CfgWithoutRate {
        sizes: Vec<usize>,
    }

    #[test]
    fn a_field_added_with_its_default_is_no_change_but_another_value_or_a_removed_field_is() {
        let dir = std::env::temp_dir().join(format!("kappa-run-added-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let context = RunContext::default();
        let old = Cfg {
            sizes: vec![4],
            rate: 0.5,
        };
        Run::create(&dir, context.clone(), &old)
            .unwrap()
            .finish(RunStatus::Completed)
            .unwrap();
        let later = |warmup| CfgWithWarmup {
            sizes: vec![4],
            rate: 0.5,
            warmup,
        };
        let resumed = Run::resume(&dir, context.clone(), &later(0)).unwrap();
        assert!(matches!(resumed, Resumed::Finished(_)));
        let differences = |result: Result<Resumed>| match result {
            Err(RunError::ConfigChanged { differences, .. }) => differences,
            Err(other) => panic!("expected ConfigChanged, got {other}"),
            Ok(_) => panic!("a changed config resumed"),
        };
        let changed = differences(Run::resume(&dir, context.clone(), &later(5)));
        assert_eq!(changed, ["config.warmup: 0 → 5"]);
        let fewer = CfgWithoutRate { sizes: vec![4] };
        let removed = differences(Run::resume(&dir, context, &fewer));
        assert_eq!(removed, ["config.rate: 0.5 → (absent)"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_run_folder_round_trips() {
        let dir = std::env::temp_dir().join(format!("kappa-run-{}", std::process::id()));
        let context = RunContext {
            name: "demo".into(),
            scale: "smoke".into(),
            seed: 3,
            threads: 1,
            ..RunContext::default()
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

    #[test]
    fn a_folder_that_calls_the_run_experiment_still_resumes_and_reads() {
        let dir = std::env::temp_dir().join(format!("kappa-run-old-{}", std::process::id()));
        let context = RunContext {
            name: "demo".into(),
            scale: "cpu".into(),
            ..RunContext::default()
        };
        let cfg = Cfg {
            sizes: vec![4],
            rate: 0.1,
        };
        Run::create(&dir, context.clone(), &cfg)
            .unwrap()
            .finish(RunStatus::Completed)
            .unwrap();
        // What a run folder of the earlier layout says: `experiment` where today's says `name`.
        for file in ["config.toml", "run.json"] {
            let path = dir.join(file);
            let text = fs::read_to_string(&path).unwrap();
            let old = text.replacen("name = ", "experiment = ", 1);
            let old = old.replacen("\"name\":", "\"experiment\":", 1);
            assert_ne!(old, text, "{file} has no name to rename");
            fs::write(&path, old).unwrap();
        }
        assert_eq!(RunRecord::read(&dir).unwrap().info.run.name, "demo");
        let resumed = Run::resume(&dir, context.clone(), &cfg).unwrap();
        assert!(matches!(resumed, Resumed::Finished(_)));
        // A changed field is still a changed config.
        let other = Cfg { rate: 0.2, ..cfg };
        let err = Run::resume(&dir, context, &other).err().unwrap();
        assert!(err.to_string().contains("config.rate: 0.1 → 0.2"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
