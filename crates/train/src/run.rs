//! Run folders: `config.toml`, `metrics.jsonl` and `run.json`, written by [`Run`] and read back
//! by [`RunRecord`], under the rules of [`crate::folder`].
//!
//! # Start, start over, resume
//!
//! [`Run::create`] starts a run in an absent or empty folder; a folder that holds anything is an
//! error ([`RunError::FolderInUse`]) that changes nothing. [`Run::start_over`] (`--fresh`)
//! deletes the run's own files first and nothing else. [`Run::resume`] (`--resume`) reuses a
//! folder: a completed or diverged run is [`Resumed::Finished`] and is not run again; an
//! interrupted or failed one is [`Resumed::Continued`]: `metrics.jsonl` is kept (minus a torn
//! last line) and appended to, and the caller decides what to skip and where to continue (see
//! [`crate::variants`] and [`Run::retain_metrics`]). Either way the folder's `config.toml` must
//! equal the config of this attempt, or the resume stops with [`RunError::ConfigChanged`],
//! naming the keys that differ: a run folder never mixes configs. A resume reads and checks
//! everything before it writes anything, so one that fails leaves the folder byte-identical.
//!
//! `metrics.jsonl` has one writer, [`Run::log`]: one JSON object per line, flushed to the disk
//! per line. `config.toml` and `run.json` are written atomically ([`folder::write_atomic`]).
//!
//! # One run on several ranks
//!
//! A data-parallel run ([`Run::data_parallel`]) has one folder, written by rank 0's [`Run`]
//! alone; every other rank holds a [`Run::follow`] of it, which reads the folder (the records
//! and checkpoint a resume continues from) and writes nothing.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};
use kappa_dist::Communicator;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use crate::context::RunContext;
use crate::error::{RunError, RunResult as Result};
use crate::folder;

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
    /// The machines and builds that computed the run, in the order they first did: one entry
    /// per distinct [`RunHost`], so a run resumed on another CPU or from another source has
    /// several. Empty where a folder's `run.json` does not record them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<RunHost>,
}

/// One process's machine and build, as [`RunInfo::hosts`] records them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunHost {
    /// The CPU ([`kappa_linalg::cpu_model`]: model name and vector level).
    pub cpu: String,
    /// The source the program was built from, as the environment variable [`SOURCE_ENV`]
    /// gives it (`cargo xtask reproduce` and `cargo xtask train` set the git commit, marked
    /// when the work tree had changes); empty when it is unset.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

/// The environment variable a program sets to name the source it was built from
/// ([`RunHost::source`]).
pub const SOURCE_ENV: &str = "KAPPA_SOURCE";

impl RunHost {
    /// This process's.
    pub fn this_process() -> Self {
        Self {
            cpu: kappa_linalg::cpu_model(),
            source: std::env::var(SOURCE_ENV).unwrap_or_default(),
        }
    }
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
    metrics: Metrics,
    started: Instant,
    started_unix: u64,
    earlier_seconds: f64,
    resumes: u32,
    /// [`RunInfo::hosts`] of the earlier attempts of a resumed run.
    earlier_hosts: Vec<RunHost>,
    interruption: Option<(usize, u64)>,
    /// The ranks of a data-parallel run ([`Run::data_parallel`]).
    comm: Option<Arc<dyn Communicator>>,
    /// A rank other than 0's view of the folder ([`Run::follow`]): it writes nothing.
    follower: bool,
}

/// `metrics.jsonl`'s writer, opened at the first write: a resume reads and checks the file but
/// changes it (cutting a torn last line to `keep` bytes) only when the run writes again.
struct Metrics {
    path: PathBuf,
    keep: Option<u64>,
    writer: Option<BufWriter<File>>,
    /// Whether this attempt has changed the file.
    changed: bool,
}

impl Metrics {
    fn new(path: PathBuf, keep: Option<u64>) -> Self {
        Self {
            path,
            keep,
            writer: None,
            changed: false,
        }
    }

    fn writer(&mut self) -> Result<&mut BufWriter<File>> {
        if self.writer.is_none() {
            let path = &self.path;
            let file = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| RunError::io(path, e))?;
            if let Some(keep) = self.keep.take() {
                file.set_len(keep).map_err(|e| RunError::io(path, e))?;
            }
            self.writer = Some(BufWriter::new(file));
        }
        self.changed = true;
        Ok(self.writer.as_mut().expect("opened above"))
    }

    /// Writes out what is buffered and flushes it to the disk.
    fn sync(&mut self) -> Result<()> {
        if let Some(w) = self.writer.as_mut() {
            let path = &self.path;
            w.flush().map_err(|e| RunError::io(path, e))?;
            w.get_ref().sync_data().map_err(|e| RunError::io(path, e))?;
        }
        Ok(())
    }
}

impl Run {
    /// Starts a run in `dir`, which must be absent or empty ([`folder::ensure_empty`]: a folder
    /// holding a run is continued by [`Run::resume`] or started over by [`Run::start_over`]),
    /// and writes `config.toml`. The folder's name must be a plain name ([`folder::check_dir`]).
    pub fn create<C: Serialize>(dir: &Path, context: RunContext, config: &C) -> Result<Self> {
        folder::check_dir(dir)?;
        folder::ensure_empty(dir)?;
        Self::write_new(dir, context, config)
    }

    /// Starts a run in `dir` afresh (`--fresh`): deletes the run's own files there
    /// ([`folder::remove_own_files`]) and nothing else — a user's file in the folder stays
    /// where it is, and a folder whose `config.toml` is not a run's of `context.name` is an
    /// error — then writes `config.toml` as [`Run::create`] does.
    pub fn start_over<C: Serialize>(dir: &Path, context: RunContext, config: &C) -> Result<Self> {
        folder::check_dir(dir)?;
        folder::remove_own_files(dir, &context.name)?;
        Self::write_new(dir, context, config)
    }

    /// Creates `dir` if needed, writes `config.toml` and an empty `metrics.jsonl`.
    fn write_new<C: Serialize>(dir: &Path, context: RunContext, config: &C) -> Result<Self> {
        fs::create_dir_all(dir).map_err(|e| RunError::io(dir, e))?;
        let config_path = dir.join("config.toml");
        folder::write_atomic(&config_path, config_text(&context, config)?.as_bytes())?;
        let metrics_path = dir.join("metrics.jsonl");
        folder::write_atomic(&metrics_path, b"")?;
        Ok(Self::open(dir, context, Metrics::new(metrics_path, None)))
    }

    /// Reuses `dir` if it holds a run of the same config: a completed or diverged run is
    /// [`Resumed::Finished`] (nothing is written), an interrupted or failed one is
    /// [`Resumed::Continued`] (appended to; a torn last line of `metrics.jsonl` is cut when the
    /// run first writes). An absent or empty folder is [`Resumed::Started`]. A different config
    /// is a [`RunError::ConfigChanged`]. The folder's config is read through `C` before the
    /// comparison, so a key that today's `C` has and the folder lacks (a field added later,
    /// with a `#[serde(default)]`) takes its default rather than counting as a change; a key the
    /// folder has and `C` does not is still a change.
    ///
    /// Everything is read and checked before anything is written: a `config.toml`, `run.json`
    /// or `metrics.jsonl` that is missing from a run, unreadable, not a regular file or not
    /// parseable is an error naming it, and the folder is left byte-identical.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use kappa_train::run::{Resumed, Run, RunContext, RunStatus};
    /// use kappa_train::RunError;
    ///
    /// let dir = std::env::temp_dir().join(format!("kappa-doc-resume-{}", std::process::id()));
    /// # let _ = std::fs::remove_dir_all(&dir);
    /// let context = RunContext {
    ///     name: "demo".into(), scale: "smoke".into(), ..RunContext::default()
    /// };
    /// let config = BTreeMap::from([("steps".to_string(), 4)]);
    /// Run::create(&dir, context.clone(), &config)?.finish(RunStatus::Completed)?;
    /// // The same config: the finished run is kept.
    /// assert!(matches!(Run::resume(&dir, context.clone(), &config)?, Resumed::Finished(_)));
    /// // Another config: an error naming the change, and the folder is left alone.
    /// let other = BTreeMap::from([("steps".to_string(), 5)]);
    /// let err = Run::resume(&dir, context.clone(), &other).err().unwrap();
    /// assert!(matches!(err, RunError::ConfigChanged { .. }));
    /// assert!(err.to_string().contains("config.steps: 4 → 5"));
    /// // A fresh start over it must be asked for.
    /// assert!(matches!(Run::create(&dir, context, &other), Err(RunError::FolderInUse { .. })));
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resume<C: Serialize + DeserializeOwned>(
        dir: &Path,
        context: RunContext,
        config: &C,
    ) -> Result<Resumed> {
        folder::check_dir(dir)?;
        let config_path = dir.join("config.toml");
        if !folder::regular_or_absent(&config_path)? {
            if folder::own_files(dir)?.is_empty() {
                return Ok(Resumed::Started(Self::create(dir, context, config)?));
            }
            return Err(lost(&config_path, "the run's config"));
        }
        ensure_same_config::<C>(&config_path, &config_text(&context, config)?)?;
        let previous = read_run_info(dir)?;
        if let Some(info) = previous.as_ref().filter(|i| i.status.is_finished()) {
            return Ok(Resumed::Finished(info.clone()));
        }
        let metrics_path = dir.join("metrics.jsonl");
        if !folder::regular_or_absent(&metrics_path)? {
            return Err(lost(&metrics_path, "the run's metrics"));
        }
        let keep = complete_lines(&metrics_path)?;
        read_metrics::<serde_json::Value>(&metrics_path)?;
        let mut run = Self::open(dir, context, Metrics::new(metrics_path, Some(keep)));
        if let Some(info) = previous {
            run.earlier_seconds = info.wall_seconds;
            run.resumes = info.resumes;
            run.earlier_hosts = info.hosts;
        }
        run.resumes += 1;
        Ok(Resumed::Continued(run))
    }

    fn open(dir: &Path, context: RunContext, metrics: Metrics) -> Self {
        Self {
            dir: dir.to_path_buf(),
            context,
            metrics,
            started: Instant::now(),
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            earlier_seconds: 0.0,
            resumes: 0,
            earlier_hosts: Vec::new(),
            interruption: None,
            comm: None,
            follower: false,
        }
    }

    /// Rank r > 0's view of the run folder `dir` that rank 0's [`Run`] writes, after rank 0
    /// created or resumed it (`resumed`: whether rank 0's run continues an earlier one). It
    /// reads the folder as rank 0's does; [`Run::log`], [`Run::retain_metrics`] and
    /// [`Run::finish`] write nothing.
    pub fn follow(dir: &Path, context: RunContext, resumed: bool) -> Self {
        let metrics = Metrics::new(dir.join("metrics.jsonl"), None);
        let mut run = Self::open(dir, context, metrics);
        run.resumes = u32::from(resumed);
        run.follower = true;
        run
    }

    /// Makes the run's training data-parallel over `comm`'s ranks: each variant's trainer joins
    /// them ([`Trainer::data_parallel`](crate::Trainer::data_parallel)). Rank 0 holds the
    /// writing [`Run`], the others a [`Run::follow`] of its folder.
    pub fn data_parallel(&mut self, comm: Arc<dyn Communicator>) {
        self.comm = Some(comm);
    }

    /// The ranks of a data-parallel run ([`Run::data_parallel`]); `None` on one process.
    pub fn communicator(&self) -> Option<Arc<dyn Communicator>> {
        self.comm.clone()
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

    /// Appends one record to `metrics.jsonl` as one line and flushes it to the disk, so that
    /// the file holds every record logged before a checkpoint written after it (what resume
    /// needs); a crash mid-line leaves a torn last line, which a resume drops.
    pub fn log<T: Serialize>(&mut self, record: &T) -> Result<()> {
        if self.follower {
            return Ok(());
        }
        let path = self.metrics.path.clone();
        let mut line = serde_json::to_vec(record).map_err(|e| RunError::format(&path, 0, e))?;
        line.push(b'\n');
        self.metrics
            .writer()?
            .write_all(&line)
            .map_err(|e| RunError::io(&path, e))?;
        self.metrics.sync()
    }

    /// Every record of this run's `metrics.jsonl` so far, parsed as `T` (a torn last line
    /// aside).
    pub fn metrics<T: DeserializeOwned>(&mut self) -> Result<Vec<T>> {
        self.metrics.sync()?;
        read_metrics(&self.metrics.path)
    }

    /// Rewrites `metrics.jsonl` with only the records for which `keep` is true (in order),
    /// atomically ([`folder::write_atomic`]), and returns how many were dropped. Resume uses it
    /// to drop the records an interrupted run logged after its last checkpoint, so that
    /// continuing does not duplicate them.
    pub fn retain_metrics<T: Serialize + DeserializeOwned>(
        &mut self,
        mut keep: impl FnMut(&T) -> bool,
    ) -> Result<usize> {
        let records: Vec<T> = self.metrics()?;
        let total = records.len();
        let kept: Vec<T> = records.into_iter().filter(|r| keep(r)).collect();
        let dropped = total - kept.len();
        if dropped == 0 || self.follower {
            return Ok(0);
        }
        let path = self.metrics.path.clone();
        let mut text = Vec::new();
        for record in &kept {
            serde_json::to_writer(&mut text, record).map_err(|e| RunError::format(&path, 0, e))?;
            text.push(b'\n');
        }
        folder::write_atomic(&path, &text)?;
        self.metrics = Metrics::new(path, None);
        self.metrics.changed = true;
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

    /// Flushes the metrics to the disk and writes `run.json` atomically. A resumed run that
    /// failed before it wrote anything (its folder could not be continued) leaves `run.json`
    /// as it was, so the folder stays byte-identical; the info is returned all the same.
    pub fn finish(mut self, status: RunStatus) -> Result<RunInfo> {
        self.metrics.sync()?;
        let untouched = self.is_resumed() && !self.metrics.changed;
        let mut hosts = self.earlier_hosts;
        let host = RunHost::this_process();
        if !hosts.contains(&host) {
            hosts.push(host);
        }
        let info = RunInfo {
            run: self.context,
            status,
            wall_seconds: self.earlier_seconds + self.started.elapsed().as_secs_f64(),
            started_unix: self.started_unix,
            resumes: self.resumes,
            blas: blas_description(),
            hosts,
        };
        if self.follower || (untouched && !info.status.is_finished()) {
            return Ok(info);
        }
        let path = self.dir.join("run.json");
        let text =
            serde_json::to_string_pretty(&info).map_err(|e| RunError::format(&path, 0, e))?;
        folder::write_atomic(&path, text.as_bytes())?;
        Ok(info)
    }
}

/// A [`RunError::Folder`] for a file a run cannot continue without.
fn lost(path: &Path, what: &str) -> RunError {
    RunError::Folder {
        dir: path.to_path_buf(),
        reason: format!(
            "{what} is missing from a folder that holds a run; nothing was changed (--fresh \
             starts the run over)"
        ),
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
/// TOML value (formatting aside), after [`renamed_keys`], [`with_todays_defaults`] and
/// [`placement_aside`].
fn ensure_same_config<C: Serialize + DeserializeOwned>(path: &Path, expected: &str) -> Result<()> {
    let text = fs::read_to_string(path).map_err(|e| RunError::io(path, e))?;
    let mut on_disk: toml::Value =
        toml::from_str(&text).map_err(|e| RunError::format(path, 0, e))?;
    renamed_keys(&mut on_disk);
    with_todays_defaults::<C>(&mut on_disk);
    let mut wanted: toml::Value =
        toml::from_str(expected).map_err(|e| RunError::format("the new config", 0, e))?;
    placement_aside(&mut on_disk);
    placement_aside(&mut wanted);
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

/// Sets aside what says where a run's process runs rather than what it trains, both still
/// recorded: `[run] data_dir` is not compared (the same data found by another path: a relative
/// or absolute `--config`, a moved checkout), and `[run] device` is compared by its kind
/// (`cuda:1` as `cuda`: each rank of several takes its own GPU, so a run saved by one process
/// on `cuda` continues on four ranks, and the other way round; `cpu` and `cuda` still differ).
fn placement_aside(file: &mut toml::Value) {
    let Some(run) = file.get_mut("run").and_then(toml::Value::as_table_mut) else {
        return;
    };
    run.remove("data_dir");
    if let Some(toml::Value::String(device)) = run.get_mut("device") {
        if let Some((kind, _)) = device.split_once(':') {
            *device = kind.to_string();
        }
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
    if !folder::regular_or_absent(&path)? {
        return Ok(None);
    }
    let text = fs::read_to_string(&path).map_err(|e| RunError::io(&path, e))?;
    let info = serde_json::from_str(&text).map_err(|e| RunError::format(&path, 0, e))?;
    Ok(Some(info))
}

/// The length of a file up to and including its last newline: a process killed in the middle
/// of a write leaves a partial last line, which is not a record.
fn complete_lines(path: &Path) -> Result<u64> {
    let bytes = fs::read(path).map_err(|e| RunError::io(path, e))?;
    Ok(bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) as u64)
}

/// Every complete line of a `metrics.jsonl`, parsed as `T` (a torn last line, without its
/// newline, is not a record yet).
fn read_metrics<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let bytes = fs::read(path).map_err(|e| RunError::io(path, e))?;
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    bytes[..complete]
        .split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.is_empty())
        .map(|(i, line)| serde_json::from_slice(line).map_err(|e| RunError::format(path, i + 1, e)))
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
    /// experiments keep `seed-*` folders under `results/<experiment>/<scale>/`). A folder whose
    /// `run.json` is not a regular file, cannot be read or does not parse is an error naming it;
    /// a folder without one (a run that was never finished) is not listed.
    pub fn read_all(scale_dir: &Path) -> Result<Vec<Self>> {
        let mut runs = Vec::new();
        for name in folder::entries(scale_dir)? {
            let dir = scale_dir.join(&name);
            if folder::file_kind(&dir)? != folder::FileKind::Directory {
                continue;
            }
            if folder::regular_or_absent(&dir.join("run.json"))? {
                runs.push(Self::read(&dir)?);
            }
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
    fn a_run_resumes_on_another_gpu_index_or_data_path_but_not_another_device_kind() {
        let dir = std::env::temp_dir().join(format!("kappa-run-place-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let saved = RunContext {
            device: "cuda:2".into(),
            data_dir: PathBuf::from("examples"),
            ..RunContext::default()
        };
        let cfg = Cfg {
            sizes: vec![4],
            rate: 0.5,
        };
        (Run::create(&dir, saved, &cfg).unwrap())
            .finish(RunStatus::Completed)
            .unwrap();
        let elsewhere = RunContext {
            device: "cuda".into(),
            data_dir: std::env::temp_dir().join("examples"),
            ..RunContext::default()
        };
        let resumed = Run::resume(&dir, elsewhere.clone(), &cfg).unwrap();
        assert!(matches!(resumed, Resumed::Finished(_)));
        let on_cpu = RunContext {
            device: "cpu".into(),
            ..elsewhere
        };
        match Run::resume(&dir, on_cpu, &cfg) {
            Err(RunError::ConfigChanged { differences, .. }) => {
                assert_eq!(differences, ["run.device: \"cuda\" → \"cpu\""])
            }
            _ => panic!("a cuda run resumed on the CPU"),
        }
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

    /// `run.json` names the CPU and source of every process that computed the run, once each:
    /// a run resumed elsewhere keeps the earlier host and adds its own; one resumed where it
    /// ran adds nothing; a folder without hosts reads as none.
    #[test]
    fn run_json_records_each_host_that_computed_the_run_once() {
        let dir = std::env::temp_dir().join(format!("kappa-run-hosts-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let context = RunContext {
            name: "demo".into(),
            ..RunContext::default()
        };
        let cfg = Cfg {
            sizes: vec![2],
            rate: 0.3,
        };
        let failed = || RunStatus::Failed {
            error: "killed".into(),
        };
        let info = Run::create(&dir, context.clone(), &cfg)
            .unwrap()
            .finish(failed())
            .unwrap();
        let here = RunHost::this_process();
        assert!(here.cpu.ends_with(')'), "{here:?}");
        assert_eq!(info.hosts, std::slice::from_ref(&here));
        // The same host resuming adds nothing.
        let Ok(Resumed::Continued(mut run)) = Run::resume(&dir, context.clone(), &cfg) else {
            panic!("not continued");
        };
        run.log(&Rec { step: 1, loss: 1.0 }).unwrap();
        assert_eq!(
            run.finish(failed()).unwrap().hosts,
            std::slice::from_ref(&here)
        );
        // Another machine's attempt in run.json: kept, first.
        let path = dir.join("run.json");
        let mut json: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        json["hosts"] = serde_json::json!([{ "cpu": "Other CPU (Avx2)", "source": "0123abcd" }]);
        fs::write(&path, json.to_string()).unwrap();
        let Ok(Resumed::Continued(mut run)) = Run::resume(&dir, context.clone(), &cfg) else {
            panic!("not continued");
        };
        run.log(&Rec { step: 2, loss: 0.5 }).unwrap();
        let info = run.finish(RunStatus::Completed).unwrap();
        let other = RunHost {
            cpu: "Other CPU (Avx2)".into(),
            source: "0123abcd".into(),
        };
        assert_eq!(info.hosts, [other, here]);
        assert_eq!(RunRecord::read(&dir).unwrap().info.hosts, info.hosts);
        // A run.json without hosts reads as none.
        json.as_object_mut().unwrap().remove("hosts");
        fs::write(&path, json.to_string()).unwrap();
        assert!(RunRecord::read(&dir).unwrap().info.hosts.is_empty());
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
