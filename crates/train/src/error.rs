//! The errors of run folders and of the variant driver. Training itself reports
//! [`kappa_models::ModelsError`]; [`RunError::Training`] carries it through.

use std::path::{Path, PathBuf};

/// Why a run folder could not be written, read or continued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A file of the run folder could not be read or written.
    #[error("I/O error at {path}: {error}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The error, written after the path (not a `source()`, so that a chain of causes
        /// prints it once).
        error: std::io::Error,
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
    /// A run folder, or a file in it, cannot be used as it is (a bad name, a file that is a
    /// folder or a link loop, a run without its config or metrics): nothing was changed.
    #[error("{}: {reason}", dir.display())]
    Folder {
        /// The folder or file.
        dir: PathBuf,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// A fresh run was asked for in a folder that is not empty; nothing was changed.
    #[error("{}", in_use_message(dir, *holds_a_run, foreign))]
    FolderInUse {
        /// The run folder.
        dir: PathBuf,
        /// Whether it holds a run's own files ([`crate::folder::OWN_FILES`]).
        holds_a_run: bool,
        /// The names in it that are not a run's.
        foreign: Vec<String>,
    },
    /// The folder's `config.toml` differs from the config of this attempt.
    #[error(
        "{path} was written with a different config ({differences}); run with --fresh to \
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

fn in_use_message(dir: &Path, holds_a_run: bool, foreign: &[String]) -> String {
    let dir = dir.display();
    if !foreign.is_empty() {
        let mut listed: Vec<&str> = foreign.iter().take(5).map(String::as_str).collect();
        if foreign.len() > 5 {
            listed.push("…");
        }
        return format!(
            "{dir} holds files that are not a run's ({}); choose another run name or output \
             folder (a run never deletes what it did not write)",
            listed.join(", ")
        );
    }
    match holds_a_run {
        true => format!(
            "{dir} holds a run; --resume continues it, --fresh starts it over (deleting only \
             the run's own files)"
        ),
        false => format!("{dir} is not empty"),
    }
}

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
            error: source,
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
