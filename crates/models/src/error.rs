//! The one error enum of kappa-models: every public function that a caller can get wrong returns
//! [`ModelsError`].

use std::path::PathBuf;

/// Errors of kappa-models.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelsError {
    /// The device name is not `cpu`, `cuda` or `cuda:N`.
    #[error("unknown device `{0}`: use cpu, cuda or cuda:N")]
    UnknownDevice(String),
    /// A CUDA device was asked for but libtorch sees fewer devices.
    #[error("device `{name}` was requested but libtorch sees {available} CUDA device(s)")]
    CudaUnavailable {
        /// The requested device name.
        name: String,
        /// How many CUDA devices libtorch reports.
        available: usize,
    },
    /// A configuration value is out of range or inconsistent with another.
    #[error("invalid config: `{field}` {reason}")]
    InvalidConfig {
        /// The offending field (dotted path, e.g. `model.n_head`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A data set is not where the loader looks for it.
    #[error("data set `{set}` is missing: {path} does not exist or is incomplete; {hint}")]
    MissingData {
        /// The data set: the setup name of an installable one (`fashion-mnist`, `sotu`), or
        /// the kind of a user's folder (`idx`, `image_folder`).
        set: String,
        /// The file or folder that was not found.
        path: PathBuf,
        /// What to do: the `cargo xtask setup` command, or the layout the loader expects.
        hint: String,
    },
    /// A data file exists but its contents are not what the loader expects.
    #[error("bad data in {path}: {reason}")]
    BadData {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A size set by a config key or a file header would take more memory than this process
    /// may still allocate ([`crate::memory`]).
    #[error(
        "{culprit}: {what} would need {needed}, more than the {budget} this process may allocate"
    )]
    TooLarge {
        /// The config keys or the file that set the size.
        culprit: String,
        /// What would be allocated.
        what: String,
        /// The planned size, in words.
        needed: String,
        /// The budget it was checked against, and its source.
        budget: String,
    },
    /// A checkpoint cannot be read, does not match the model, or cannot be written.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// An argument (mostly a tensor) has a shape, size, kind or device, or entries (token ids,
    /// targets or labels out of range), that the operation cannot take.
    #[error("bad argument `{arg}`: {reason}")]
    Shape {
        /// The argument.
        arg: &'static str,
        /// Expected against found.
        reason: String,
    },
    /// File-system errors, with the path involved.
    #[error("I/O error at {path}: {error}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The error, written after the path (not a `source()`, so that a chain of causes
        /// prints it once).
        error: std::io::Error,
    },
    /// Pretrained encoder weights that do not fit the model (names every mismatch).
    #[error("encoder weight transfer: {0}")]
    Transfer(String),
    /// The GPT-2 tokenizer could not be built or could not decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A metrics sink (for example an experiment's `metrics.jsonl`) refused a record.
    #[error("metrics sink: {0}")]
    Sink(String),
    /// An optimizer (Muon, manifold Muon) refused a step: non-finite gradient, a weight off its
    /// manifold, a diverging dual ascent.
    #[error("optimizer: {0}")]
    Optimizer(String),
    /// A collective of a data-parallel run failed: another rank stopped, timed out or sent a
    /// tensor of another shape.
    #[error("data-parallel collective: {0}")]
    Collective(String),
    /// An error raised by libtorch.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// An error from kappa-attention (diagnostics, λ policies).
    #[error(transparent)]
    Attention(#[from] kappa_attention::AttentionError),
    /// An error from kappa-linalg (tensor ↔ array conversion).
    #[error(transparent)]
    Linalg(#[from] kappa_linalg::LinalgError),
    /// A data path names something other than a regular file or a symbolic link to one (a
    /// directory, FIFO, socket, device or dangling link); refused before it is opened
    /// ([`crate::files`]).
    #[error("{path} is {kind}, not a regular file; only regular files are read as data")]
    NotRegularFile {
        /// The path.
        path: PathBuf,
        /// What it is, in words (`a FIFO (named pipe)`).
        kind: &'static str,
    },
}

impl ModelsError {
    /// An [`ModelsError::InvalidConfig`] for `field`.
    pub fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidConfig {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// A [`ModelsError::MissingData`] for a set that `cargo xtask setup --data SET` installs.
    pub fn missing_set(set: &str, path: impl Into<PathBuf>) -> Self {
        Self::MissingData {
            set: set.into(),
            path: path.into(),
            hint: format!("install it with `cargo xtask setup --data {set}`"),
        }
    }

    /// A [`ModelsError::BadData`] for `path`.
    pub fn bad_data(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::BadData {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// An [`ModelsError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            error: source,
        }
    }
}

/// `Result` with [`ModelsError`].
pub type Result<T, E = ModelsError> = std::result::Result<T, E>;
