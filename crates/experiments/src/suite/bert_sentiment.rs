//! "bert-sentiment": a crammed BERT at the size of the machine. Each variant (a conditioning of
//! W_Q, W_K, W_V; the same at both stages) is pretrained with masked language modelling on
//! byte-level State of the Union and Brown text for a fixed budget
//! ([`kappa_train::MaskedLanguageModeling`]), then its encoder is copied by name into a
//! [`SequenceClassifier`] ([`kappa_models::load_encoder`] from the pretraining checkpoint) and
//! fine-tuned on the movie-review sentences ([`MovieReviews`], an SST-2-like binary split);
//! the headline is the test accuracy against the paper's SST-2 row. Both stages train through
//! [`crate::correction_study::train_corrected`], so an interrupted run resumes at either stage.

mod report;

use std::path::Path;

use anyhow::{Context, Result};
use kappa_models::data::sequences::{MovieReviews, TextConfig};
use kappa_models::mlm::{MaskedLm, MaskingRule, BYTE_VOCAB, PAD};
use kappa_models::{
    load_encoder, EncoderConfig, SequenceClassifier, SequenceClassifierConfig, Split, TextCorpus,
    TokenizerKind,
};
use kappa_train::variants::variant_checkpoint;
use kappa_train::{
    MaskedLanguageModeling, Outcome, SequenceClassification, Task, TrainConfig, CKPT_MODEL,
};
use serde::{Deserialize, Serialize};

use crate::correction_study::{train_corrected, Stage, Variant};
use crate::report::Section;
use crate::run::{Run, RunRecord, RunStatus};
use crate::scale::Scale;
use crate::Experiment;

/// The experiment (registered as `bert-sentiment`).
pub struct BertSentiment;

/// The pretraining stage's variants: `<name> · MLM`, plots `mlm-*.png`.
pub const PRETRAINING: Stage = Stage {
    suffix: " · MLM",
    files: "mlm-",
};
/// The fine-tuning stage's variants: `<name> · fine-tuned`, plots `sentiment-*.png`.
pub const FINE_TUNING: Stage = Stage {
    suffix: " · fine-tuned",
    files: "sentiment-",
};

/// A text of the pretraining corpus.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PretrainingText {
    /// The State of the Union addresses (`train.txt` / `val.txt`).
    Sotu,
    /// The Brown corpus (every 10th file held out).
    Brown,
}

/// The pretraining text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Corpus {
    /// The texts, joined by a newline in this order (each split separately).
    pub texts: Vec<PretrainingText>,
    /// Keep at most this many characters of each text's each split.
    pub max_chars: Option<usize>,
}

/// The movie-review sentences held out (the sequence length is the model's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sentences {
    /// Validation sentences (the fine-tuning evaluations).
    pub validation: usize,
    /// Test sentences (the headline accuracy).
    pub test: usize,
}

/// What `bert-sentiment` runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The encoder (`vocab_size` = 258: bytes, padding, mask; `conditioning` per variant).
    pub model: EncoderConfig,
    /// The pretraining text.
    pub corpus: Corpus,
    /// BERT's masking rule.
    pub masking: MaskingRule,
    /// Pretraining (masked LM).
    pub pretrain: TrainConfig,
    /// Held-out batches of the final masked-LM loss (the pretraining stage's metric).
    pub final_eval_batches: usize,
    /// The movie-review splits.
    pub sentences: Sentences,
    /// Fine-tuning (all weights, the classifier head new).
    pub finetune: TrainConfig,
    /// The significance level of the verdict's Welch test.
    pub alpha: f64,
    /// The variants, baseline first.
    pub variants: Vec<Variant>,
}

impl Config {
    /// The movie-review loader's settings: the model's sequence length.
    pub fn text(&self) -> TextConfig {
        TextConfig {
            seq_len: self.model.seq_len,
            validation: self.sentences.validation,
            test: self.sentences.test,
        }
    }
}

impl Experiment for BertSentiment {
    type Config = Config;

    fn name(&self) -> &'static str {
        "bert-sentiment"
    }

    fn claim(&self) -> &'static str {
        "Spectrally conditioned attention (λ·I_k added to W_Q, W_K, W_V, λ = 10) in a crammed \
         BERT, pretrained with masked language modelling and fine-tuned, improves its sentiment \
         accuracy (SST-2, five seeds: 92.3 → 92.7)."
    }

    fn continues_interrupted_runs(&self) -> bool {
        true
    }

    fn data_parallel(&self) -> bool {
        true
    }

    /// Five seeds at the paper's scale, as the paper; three elsewhere.
    fn default_seeds(&self, scale: Scale) -> u32 {
        if scale == Scale::Paper {
            5
        } else {
            3
        }
    }

    fn data_needs(&self) -> &'static [&'static str] {
        &["sotu", "brown", "movie-reviews"]
    }

    fn validate(&self, c: &Config) -> Result<()> {
        anyhow::ensure!(!c.variants.is_empty(), "variants: need at least one");
        for (i, v) in c.variants.iter().enumerate() {
            anyhow::ensure!(
                !c.variants[..i].iter().any(|o| o.name == v.name),
                "variants.{i}.name: {:?} is listed twice",
                v.name
            );
            v.correction.validate(&format!("variants.{i}.correction"))?;
            c.model
                .with_correction(v.correction)
                .validate()
                .with_context(|| format!("variant {:?}", v.name))?;
        }
        anyhow::ensure!(
            c.model.vocab_size == BYTE_VOCAB,
            "model.vocab_size: must be {BYTE_VOCAB} (256 bytes, padding, mask), found {}",
            c.model.vocab_size
        );
        anyhow::ensure!(
            !c.corpus.texts.is_empty(),
            "corpus.texts: need at least one"
        );
        c.masking.validate()?;
        c.pretrain.validate().context("pretrain")?;
        c.finetune.validate().context("finetune")?;
        anyhow::ensure!(c.final_eval_batches >= 1, "final_eval_batches: must be ≥ 1");
        anyhow::ensure!(
            c.sentences.validation >= 1 && c.sentences.test >= 1,
            "sentences: validation and test must be ≥ 1"
        );
        anyhow::ensure!(
            c.alpha > 0.0 && c.alpha < 1.0,
            "alpha: must lie in (0, 1), found {}",
            c.alpha
        );
        Ok(())
    }

    fn run(&self, config: &Config, run: &mut Run) -> Result<RunStatus> {
        for (i, variant) in config.variants.iter().enumerate() {
            let pretrained = pretrain(config, run, i, variant)
                .with_context(|| format!("variant {} (pretraining)", variant.name))?;
            if pretrained == Outcome::Completed {
                finetune(config, run, i, variant)
                    .with_context(|| format!("variant {} (fine-tuning)", variant.name))?;
            }
        }
        Ok(RunStatus::Completed)
    }

    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        report::report(self, runs, out_dir, report_dir)
    }
}

/// The byte-level pretraining corpus from the run's data folder (also `lambda-readings`'
/// masked-LM model's text).
pub fn corpus(corpus: &Corpus, run: &Run) -> Result<TextCorpus> {
    let data = &run.context().data_dir;
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for text in &corpus.texts {
        let max = corpus.max_chars;
        let (t, v) = match text {
            PretrainingText::Sotu => TextCorpus::read_sotu(&data.join(TextCorpus::SOTU), max)?,
            PretrainingText::Brown => TextCorpus::read_brown(&data.join(TextCorpus::BROWN), max)?,
        };
        train.push(t);
        val.push(v);
    }
    let device = kappa_models::parse_device(&run.context().device)?;
    Ok(TextCorpus::from_texts(
        &train.join("\n"),
        &val.join("\n"),
        TokenizerKind::Bytes,
        device,
    )?)
}

/// Pretrains variant `i` (run variant 2i, `<name> · MLM`); the metric is the held-out
/// masked-token loss over `final_eval_batches` batches.
fn pretrain(config: &Config, run: &mut Run, i: usize, variant: &Variant) -> Result<Outcome> {
    let staged = Variant {
        name: PRETRAINING.name(&variant.name),
        correction: variant.correction,
    };
    let model = config.model.with_correction(variant.correction);
    let text = corpus(&config.corpus, run)?;
    let (seed, rule) = (run.context().seed, config.masking);
    let (batches, batch) = (config.final_eval_batches, config.pretrain.batch_size);
    train_corrected(
        run,
        2 * i,
        &staged,
        &config.pretrain,
        |vs| {
            let mlm = MaskedLm::new(&vs.root(), model)?;
            Ok(MaskedLanguageModeling::new(mlm, text, rule, seed)?)
        },
        |task| Ok(task.evaluate(batches, batch)?.loss),
    )
}

/// Fine-tunes variant `i` (run variant 2i + 1, `<name> · fine-tuned`) from the encoder of its
/// pretraining checkpoint; the metric is the test accuracy.
fn finetune(config: &Config, run: &mut Run, i: usize, variant: &Variant) -> Result<Outcome> {
    let staged = Variant {
        name: FINE_TUNING.name(&variant.name),
        correction: variant.correction,
    };
    let encoder = config.model.with_correction(variant.correction);
    let device = kappa_models::parse_device(&run.context().device)?;
    let dir = run.context().data_dir.join(MovieReviews::SET);
    let data = MovieReviews::load(&dir, &config.text(), device)?;
    let checkpoint = variant_checkpoint(run, 2 * i);
    let seed = run.context().seed;
    train_corrected(
        run,
        2 * i + 1,
        &staged,
        &config.finetune,
        |vs| {
            let cfg = SequenceClassifierConfig::from_encoder(encoder, Some(PAD), data.num_classes);
            let model = SequenceClassifier::new(&vs.root(), cfg)?;
            load_encoder(&checkpoint, CKPT_MODEL, vs)
                .with_context(|| format!("the pretrained encoder of {}", variant.name))?;
            Ok(SequenceClassification::new(model, data, seed)?)
        },
        |task| {
            let eval = task.evaluate_split(Split::Test, None, 256)?;
            Ok(eval.accuracy.unwrap_or(f64::NAN))
        },
    )
}
