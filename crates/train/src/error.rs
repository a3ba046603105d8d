//! The errors of run folders and of the variant driver. Training itself reports
//! [`kappa_models::ModelsError`]; [`RunError::Training`] carries it through.

use std::path::{Path, PathBuf};

/// Why a run folder could not be written, read or continued.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A file of the run folder could not be read or written.
    #[error("I/O error at {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file of the run folder does not parse (`line` is 1-based; 0 for a whole file).
    #[error("{path}{}: {reason}", line_suffix(*line))]
    Format {
        /// The file.
        path: PathBuf,
        /// The line of `metrics.jsonl`, or 0.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The folder's `config.toml` differs from the config of this attempt.
    #[error(
        "{path} was written with a different config ({differences}); run without --resume to \
         start over, or restore the settings it was run with",
        path = path.display(),
        differences = differences.join("; ")
    )]
    ConfigChanged {
        /// The `config.toml` that differs.
        path: PathBuf,
        /// One `key: old → new` entry per differing key (dotted TOML paths).
        differences: Vec<String>,
    },
    /// Training stopped after `step` steps because it was asked to ([`crate::Trainer::stop_after`]);
    /// the checkpoint holds those steps and `--resume` continues from it.
    #[error("interrupted after step {step} (checkpoint {}); --resume continues it", checkpoint.display())]
    Interrupted {
        /// Finished steps.
        step: u64,
        /// The checkpoint written at that step.
        checkpoint: PathBuf,
    },
    /// The training loop, a model or a data set failed.
    #[error(transparent)]
    Training(#[from] kappa_models::ModelsError),
}

/// The result of run-folder operations.
pub type RunResult<T> = std::result::Result<T, RunError>;

fn line_suffix(line: usize) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(":{line}")
    }
}

impl RunError {
    /// An I/O error at `path`.
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        RunError::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    /// A file (or line `line` of it, 1-based) that does not parse.
    pub fn format(path: impl AsRef<Path>, line: usize, reason: impl ToString) -> Self {
        RunError::Format {
            path: path.as_ref().to_path_buf(),
            line,
            reason: reason.to_string(),
        }
    }
}
