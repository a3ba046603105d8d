//! Run folders: `config.toml`, `metrics.jsonl` and `run.json`, written by [`Run`] and read back
//! by [`RunRecord`].

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
}

/// A run folder being written.
pub struct Run {
    dir: PathBuf,
    context: RunContext,
    metrics: BufWriter<File>,
    started: Instant,
    started_unix: u64,
}

impl Run {
    /// Creates (or empties) `dir` and writes `config.toml`.
    pub fn create<C: Serialize>(dir: &Path, context: RunContext, config: &C) -> Result<Self> {
        if dir.exists() {
            fs::remove_dir_all(dir).with_context(|| format!("emptying {}", dir.display()))?;
        }
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let file = ConfigFile {
            run: context.clone(),
            config,
        };
        let text = toml::to_string_pretty(&file).context("serializing the config to TOML")?;
        fs::write(dir.join("config.toml"), text)?;
        let metrics = BufWriter::new(File::create(dir.join("metrics.jsonl"))?);
        Ok(Self {
            dir: dir.to_path_buf(),
            context,
            metrics,
            started: Instant::now(),
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        })
    }

    /// The run folder (for plots and checkpoints of this run).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The seed, scale, threads and device of this run.
    pub fn context(&self) -> &RunContext {
        &self.context
    }

    /// Appends one record to `metrics.jsonl`.
    pub fn log<T: Serialize>(&mut self, record: &T) -> Result<()> {
        serde_json::to_writer(&mut self.metrics, record)?;
        self.metrics.write_all(b"\n")?;
        Ok(())
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
            wall_seconds: self.started.elapsed().as_secs_f64(),
            started_unix: self.started_unix,
        };
        fs::write(
            self.dir.join("run.json"),
            serde_json::to_string_pretty(&info)?,
        )?;
        Ok(info)
    }
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
        let path = self.dir.join("metrics.jsonl");
        let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
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
