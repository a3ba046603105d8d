//! "optimizer-race": the optimizers raced on one fixed GPT, in the spirit of modded-nanogpt's
//! optimization track — the model, data, batch and token budget fixed, the score the number of
//! steps to a target validation loss. Each entrant (an optimizer: a [`ModulewiseConfig`] for the
//! hidden matrices, optionally QK-clip) trains at every value of a small lr grid for every seed;
//! the report takes each entrant's best lr by the mean final validation loss and ranks the
//! entrants there by the rule in [`score`]: steps to target, then final loss, with Welch's
//! one-sided t-test deciding "faster than" and modded-nanogpt's entry rule on the final loss.

pub mod score;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use kappa_models::{GptConfig, TextCorpus, TokenizerKind};
use kappa_optim::QkClipConfig;
use kappa_train::{
    modulewise_groups, train_language_model, MetricsLine, ModulewiseConfig, Outcome, Record,
    TrainConfig, VariantId,
};
use serde::{Deserialize, Serialize};
use tch::nn;

use crate::report::Section;
use crate::run::{Run, RunRecord, RunStatus};
use crate::Experiment;

mod report;

/// The experiment (registered as `optimizer-race`).
pub struct OptimizerRace;

/// Which learning rate the grid multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TunedLr {
    /// `train.lr` and `train.min_lr`: AdamW's peak, on every parameter of an all-AdamW entrant.
    Adamw,
    /// `modulewise.muon_lr`: the Muon / manifold-Muon peak of the hidden matrices (embeddings
    /// and gains keep AdamW at `train.lr`).
    Muon,
}

/// One entrant: an optimizer for the hidden matrices, raced at every lr of the grid.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entrant {
    /// Table label.
    pub name: String,
    /// The lr the grid multiplies.
    pub tuned: TunedLr,
    /// How the hidden matrices are optimized.
    pub modulewise: ModulewiseConfig,
    /// QK-clip for this entrant's runs (replaces `train.qk_clip`; absent: the train config's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qk_clip: Option<QkClipConfig>,
}

/// The scoring rule's constants ([`score`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Race {
    /// The target validation loss (nats per token).
    pub target_val_loss: f64,
    /// The significance level of the tests.
    pub alpha: f64,
    /// Entrants every entrant is compared with (a verdict column each), by name.
    pub compare_with: Vec<String>,
}

/// What `optimizer-race` runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The model; `vocab_size` 0 takes the tokenizer's.
    pub model: GptConfig,
    /// Characters or GPT-2 BPE of the SOTU text.
    pub tokenizer: TokenizerKind,
    /// Keep at most this many characters of each split.
    pub max_chars: Option<usize>,
    /// Training settings shared by every run; `weight_decay` is that of hidden matrices under
    /// AdamW (embeddings: the entrant's `embedding_weight_decay`; gains: none).
    pub train: TrainConfig,
    /// The lr grid: multiples of each entrant's tuned lr.
    pub lr_factors: Vec<f64>,
    /// The scoring rule.
    pub race: Race,
    /// The entrants.
    pub entrants: Vec<Entrant>,
    /// Validation batches for the final validation loss.
    pub final_eval_batches: usize,
    /// libtorch intra-op threads (0: the run's `--threads`).
    #[serde(default)]
    pub libtorch_threads: usize,
}

impl Config {
    /// The variant name of `entrant` at grid value `factor`: `NAME, lr×FACTOR`.
    pub fn variant_name(entrant: &Entrant, factor: f64) -> String {
        format!("{}, lr×{factor}", entrant.name)
    }

    /// The tuned lr of `entrant` at `factor`.
    pub fn lr_of(&self, entrant: &Entrant, factor: f64) -> f64 {
        factor
            * match entrant.tuned {
                TunedLr::Adamw => self.train.lr,
                TunedLr::Muon => entrant.modulewise.muon_lr,
            }
    }

    /// The train config and hidden-matrix optimizers of `entrant` at `factor`.
    pub fn settings(&self, entrant: &Entrant, factor: f64) -> (TrainConfig, ModulewiseConfig) {
        let mut train = self.train.clone();
        let mut modulewise = entrant.modulewise;
        match entrant.tuned {
            TunedLr::Adamw => {
                train.lr *= factor;
                train.min_lr *= factor;
            }
            TunedLr::Muon => modulewise.muon_lr *= factor,
        }
        if entrant.qk_clip.is_some() {
            train.qk_clip = entrant.qk_clip;
        }
        (train, modulewise)
    }
}

impl Experiment for OptimizerRace {
    type Config = Config;

    fn name(&self) -> &'static str {
        "optimizer-race"
    }

    fn claim(&self) -> &'static str {
        "At a fixed model, data and token budget, orthogonalized updates (Muon and its \
         variants) reach a target validation loss in fewer steps than AdamW, each optimizer at \
         its best learning rate (the premise of modded-nanogpt's optimization track)."
    }

    fn data_needs(&self) -> &'static [&'static str] {
        &["sotu"]
    }

    fn continues_interrupted_runs(&self) -> bool {
        true
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn validate(&self, c: &Config) -> Result<()> {
        GptConfig {
            vocab_size: c.model.vocab_size.max(1),
            ..c.model
        }
        .validate()?;
        c.train.validate()?;
        validate_race(c)?;
        for (i, e) in c.entrants.iter().enumerate() {
            for &f in &c.lr_factors {
                let (train, modulewise) = c.settings(e, f);
                let check = || -> Result<()> {
                    train.validate()?;
                    modulewise.validate()?;
                    Ok(())
                };
                check().with_context(|| format!("entrants.{i} ({:?}) at lr×{f}", e.name))?;
            }
        }
        anyhow::ensure!(c.final_eval_batches >= 1, "final_eval_batches: must be ≥ 1");
        Ok(())
    }

    fn run(&self, config: &Config, run: &mut Run) -> Result<RunStatus> {
        if config.libtorch_threads > 0 {
            run.pin_threads(config.libtorch_threads);
        }
        let device = kappa_models::parse_device(&run.context().device)?;
        let dir = run.context().data_dir.join(TextCorpus::SOTU);
        let grid = config.lr_factors.len();
        for (i, entrant) in config.entrants.iter().enumerate() {
            for (j, &factor) in config.lr_factors.iter().enumerate() {
                let (train, modulewise) = config.settings(entrant, factor);
                let corpus =
                    TextCorpus::load_sotu(&dir, config.tokenizer, config.max_chars, device)?;
                let name = Config::variant_name(entrant, factor);
                let id = VariantId {
                    index: i * grid + j,
                    name: &name,
                };
                let groups = |vs: &nn::VarStore| Ok(modulewise_groups(vs, &modulewise, &train)?);
                train_language_model::<anyhow::Error>(
                    run,
                    id,
                    &train,
                    config.model,
                    corpus,
                    groups,
                    config.final_eval_batches,
                )
                .with_context(|| format!("variant {name}"))?;
            }
        }
        Ok(RunStatus::Completed)
    }

    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        report::report(self, runs, out_dir, report_dir)
    }
}

/// The grid, the rule and the resolution of steps to target: the grid's values positive and
/// distinct, the entrant names distinct and those compared with among them, α in (0, 1), the
/// target finite, and an evaluation at least every 5 % of the run.
fn validate_race(c: &Config) -> Result<()> {
    anyhow::ensure!(!c.entrants.is_empty(), "entrants: need at least one");
    anyhow::ensure!(!c.lr_factors.is_empty(), "lr_factors: need at least one");
    for (i, f) in c.lr_factors.iter().enumerate() {
        anyhow::ensure!(
            f.is_finite() && *f > 0.0,
            "lr_factors.{i}: must be finite and > 0, found {f}"
        );
        anyhow::ensure!(
            !c.lr_factors[..i].contains(f),
            "lr_factors.{i}: {f} is listed twice"
        );
    }
    for (i, e) in c.entrants.iter().enumerate() {
        anyhow::ensure!(
            !c.entrants[..i].iter().any(|o| o.name == e.name),
            "entrants.{i}.name: {:?} is listed twice",
            e.name
        );
    }
    for (i, name) in c.race.compare_with.iter().enumerate() {
        anyhow::ensure!(
            c.entrants.iter().any(|e| &e.name == name),
            "race.compare_with.{i}: no entrant is named {name:?}"
        );
    }
    let r = &c.race;
    anyhow::ensure!(
        r.target_val_loss.is_finite() && r.target_val_loss > 0.0,
        "race.target_val_loss: must be finite and > 0, found {}",
        r.target_val_loss
    );
    anyhow::ensure!(
        r.alpha > 0.0 && r.alpha < 1.0,
        "race.alpha: must lie in (0, 1), found {}",
        r.alpha
    );
    anyhow::ensure!(
        c.train.eval_every * 20 <= c.train.steps,
        "train.eval_every: {} is more than 5 % of train.steps = {} (steps to target would be \
         known only that coarsely)",
        c.train.eval_every,
        c.train.steps
    );
    Ok(())
}

/// Everything one run of one variant logged.
#[derive(Clone, Debug, Default)]
pub(crate) struct Trace {
    /// (step, validation loss) of every evaluation, in order.
    points: Vec<(u64, f64)>,
    outcome: Option<Outcome>,
    metric: f64,
    seconds_per_step: f64,
    /// Seconds in the hidden-matrix optimizers that report them (Muon, manifold Muon).
    optimizer_seconds: f64,
    /// The last training step logged.
    steps: u64,
}

impl Trace {
    /// Adds one line of `metrics.jsonl`.
    fn add(&mut self, line: MetricsLine) {
        match (&line.record, &line.summary) {
            (Some(Record::Eval { step, eval, .. }), _) => self.points.push((*step, eval.loss)),
            (
                Some(Record::Train {
                    step, optimizers, ..
                }),
                _,
            ) => {
                self.steps = *step;
                self.optimizer_seconds += optimizers.values().map(|s| s.seconds).sum::<f64>();
            }
            (_, Some(f)) => {
                self.outcome = Some(f.outcome.clone());
                self.metric = f.metric;
                self.seconds_per_step = f.seconds_per_step;
            }
            _ => {}
        }
    }

    /// The run's score against `target`: NaN final loss unless it completed.
    fn score(&self, target: f64) -> score::Score {
        score::Score {
            steps: score::steps_to_target(&self.points, target),
            final_loss: if self.outcome == Some(Outcome::Completed) {
                self.metric
            } else {
                f64::NAN
            },
        }
    }
}

/// Variant name → one trace per seed, in run order.
type Traces = BTreeMap<String, Vec<Trace>>;
