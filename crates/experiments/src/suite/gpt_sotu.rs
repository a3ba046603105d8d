//! "gpt-sotu": a character-level GPT sized for 2 CPU cores on the State of the Union addresses,
//! baseline against spectrally conditioned attention (the paper's λ = 10 and the scale-aware λ),
//! with validation loss over seeds and the same training-time diagnostics as `vit-fmnist`.

use std::path::Path;

use anyhow::{Context, Result};
use kappa_models::{GptConfig, TextCorpus, TokenizerKind};
use kappa_train::{adamw_groups, train_language_model, Outcome, TrainConfig, VariantId};
use serde::{Deserialize, Serialize};
use tch::nn;

use crate::correction_study::{correction_report, ReportSpec, Variant};
use crate::report::{opened, Section};
use crate::run::{Run, RunRecord, RunStatus};
use crate::Experiment;

/// The experiment (registered as `gpt-sotu`).
pub struct GptSotu;

/// What `gpt-sotu` runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The model; `vocab_size` is set from the tokenizer and `conditioning` per variant.
    pub model: GptConfig,
    /// The variants, baseline first.
    pub variants: Vec<Variant>,
    /// Training settings (seed, threads and device come from the run context).
    pub train: TrainConfig,
    /// Characters or GPT-2 BPE.
    pub tokenizer: TokenizerKind,
    /// Keep at most this many characters of each split.
    pub max_chars: Option<usize>,
    /// Validation batches for the final validation loss.
    pub final_eval_batches: usize,
}

impl Experiment for GptSotu {
    type Config = Config;

    fn name(&self) -> &'static str {
        "gpt-sotu"
    }

    fn claim(&self) -> &'static str {
        "Spectrally conditioned attention improves a language model's validation loss and keeps \
         its attention projections and Jacobian better conditioned during training."
    }

    fn continues_interrupted_runs(&self) -> bool {
        true
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn data_needs(&self) -> &'static [&'static str] {
        &["sotu"]
    }

    fn validate(&self, c: &Config) -> Result<()> {
        anyhow::ensure!(!c.variants.is_empty(), "variants: need at least one");
        // The tokenizer sets the vocabulary; any size stands in for it here.
        let model = GptConfig {
            vocab_size: c.model.vocab_size.max(1),
            ..c.model
        };
        for (i, variant) in c.variants.iter().enumerate() {
            variant
                .correction
                .validate(&format!("variants.{i}.correction"))?;
            model
                .with_correction(variant.correction)
                .validate()
                .with_context(|| format!("variant {:?}", variant.name))?;
        }
        c.train.validate()?;
        anyhow::ensure!(c.final_eval_batches >= 1, "final_eval_batches: must be ≥ 1");
        Ok(())
    }

    fn run(&self, config: &Config, run: &mut Run) -> Result<RunStatus> {
        for (i, variant) in config.variants.iter().enumerate() {
            train_variant(run, config, i, variant)
                .with_context(|| format!("variant {}", variant.name))?;
        }
        Ok(RunStatus::Completed)
    }

    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        let mut section = opened(
            "gpt-sotu: spectrally conditioned GPT on State of the Union text",
            Experiment::claim(self),
            runs,
        );
        let spec = ReportSpec {
            metric: "validation loss (nats/char)",
            scale: 1.0,
            higher_is_better: false,
            paper: "The paper reports no language-model pretraining loss. Its closest rows are \
                    Crammed BERT on GLUE (average 78.6 → 79.4) and Nyströmformer on Long Range \
                    Arena (mean 58.70 → 59.42): different models, tasks and scales.",
            stage: None,
        };
        correction_report(&mut section, runs, out_dir, report_dir, &spec)?;
        Ok(section)
    }
}

/// Trains `variant` (with `config`'s model, text and training settings, AdamW on every
/// parameter) as variant `index` of `run`; its metric is the final validation loss.
pub fn train_variant(
    run: &mut Run,
    config: &Config,
    index: usize,
    variant: &Variant,
) -> Result<Outcome> {
    let train = &config.train;
    let device = kappa_models::parse_device(&run.context().device)?;
    let dir = run.context().data_dir.join(TextCorpus::SOTU);
    let corpus = TextCorpus::load_sotu(&dir, config.tokenizer, config.max_chars, device)?;
    let model = config.model.with_correction(variant.correction);
    let id = VariantId {
        index,
        name: &variant.name,
    };
    let groups = |vs: &nn::VarStore| Ok(adamw_groups(vs, train)?);
    train_language_model::<anyhow::Error>(
        run,
        id,
        train,
        model,
        corpus,
        groups,
        config.final_eval_batches,
    )
}
