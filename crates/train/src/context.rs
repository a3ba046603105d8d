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
    /// libtorch's intra-op threads, its MKL products included (0 leaves libtorch's default); put
    /// in force by [`RunContext::apply_threads`].
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

    /// Puts [`RunContext::threads`] in force (nothing when 0): libtorch's intra-op thread count
    /// on the calling thread, and the count that threads which start using libtorch later take.
    ///
    /// A run applies it before it builds anything ([`crate::train_variant`] and
    /// [`crate::Trainer`]'s constructors do), so that the initialization, the initial retraction
    /// onto a manifold and training all run at one count. Kernel results can depend on the count
    /// (how a reduction or MKL's `syrk` splits its sums: on an AMD Zen 4, a 32×96 Gram product
    /// rounded differently on one thread and on two), and a thread that has not set it runs at
    /// the count some other thread last set, or at libtorch's default, the machine's core count.
    pub fn apply_threads(&self) {
        if self.threads > 0 {
            tch::set_num_threads(i32::try_from(self.threads).unwrap_or(i32::MAX));
        }
    }

    /// The context without progress bars (tests, batch jobs).
    pub fn quiet(self) -> Self {
        Self {
            progress: false,
            ..self
        }
    }
}
