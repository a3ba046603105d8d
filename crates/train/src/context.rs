//! The run context: what a run is called and how it runs (seed, threads, device, data folder,
//! progress, the stop flag). It is passed to a run, never copied into a model's or a trainer's config, so a
//! config file says what is trained and the command line says where and with which seed.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::stop::StopFlag;

/// Who runs what, where: the `[run]` table of a run folder's `config.toml` and the body of its
/// `run.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunContext {
    /// What runs: an experiment's registry name, or the name of a user's training run. Run
    /// folders written before kappa-train existed call it `experiment` (still read).
    #[serde(alias = "experiment")]
    pub name: String,
    /// The size the run was configured at (`smoke`, `cpu`, `paper`, or a user's own label).
    pub scale: String,
    /// The seed: the initialization and the data order.
    pub seed: u64,
    /// BLAS and libtorch intra-op threads (0 leaves libtorch's default).
    pub threads: usize,
    /// `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// Where the data sets are.
    pub data_dir: PathBuf,
    /// Show progress bars on stderr (hidden anyway when stderr is not a terminal). Not part of
    /// the run's identity: not written to `config.toml`.
    #[serde(skip, default = "shown")]
    pub progress: bool,
    /// Raised to stop training at the next step with a checkpoint ([`StopFlag`]; not part of
    /// the run's identity, not written anywhere).
    #[serde(skip)]
    pub stop: StopFlag,
}

fn shown() -> bool {
    true
}

impl Default for RunContext {
    /// A run named `train` at seed 0 on the CPU, libtorch's thread count, data in `data/`,
    /// progress shown.
    fn default() -> Self {
        Self {
            name: "train".into(),
            scale: String::new(),
            seed: 0,
            threads: 0,
            device: "cpu".into(),
            data_dir: PathBuf::from("data"),
            progress: true,
            stop: StopFlag::default(),
        }
    }
}

impl RunContext {
    /// The context with another seed.
    pub fn with_seed(self, seed: u64) -> Self {
        Self { seed, ..self }
    }

    /// The context without progress bars (tests, batch jobs).
    pub fn quiet(self) -> Self {
        Self {
            progress: false,
            ..self
        }
    }
}
