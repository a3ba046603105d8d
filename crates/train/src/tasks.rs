//! The tasks of the experiments, as [`Task`]s for the [`Trainer`](crate::Trainer):
//! next-token prediction with a [`Gpt`] on a [`TextCorpus`], image classification with a
//! [`Vit`] on [`ImageSplits`] (Fashion-MNIST, an IDX folder or a PNG image folder), and sequence
//! classification with a [`SequenceClassifier`] on [`SequenceSplits`] (the long-range tasks),
//! and masked language modelling with a [`MaskedLm`] on byte-level text
//! ([`MaskedLanguageModeling`]).
//!
//! Evaluation batches and the diagnostic batch are drawn with fixed seeds that do not depend
//! on the run's seed, so every run of an experiment is measured on the same data.

use tch::{Kind, Tensor};

use crate::trainer::{Eval, Part, Task};
use kappa_models::classifier::SequenceClassifier;
use kappa_models::data::sequences::SequenceSplits;
use kappa_models::data::Tokenizer;
use kappa_models::data::{ImageSplits, Split, TextCorpus};
use kappa_models::diagnostics::{diagnose, DiagnosticsConfig, HeadDiagnostics};
use kappa_models::error::{ModelsError, Result};
use kappa_models::gpt::Gpt;
use kappa_models::layers::Transformer;
use kappa_models::mlm::{mask_tokens, MaskedLm, MaskingRule, BYTE_VOCAB};
use kappa_models::vit::Vit;
use kappa_models::AttentionTrace;

/// The seed of the validation windows (shared by every run).
pub const EVAL_SEED: u64 = 0x5eed_e7a1;
/// The seed of the diagnostic batch (shared by every run).
pub const DIAGNOSTIC_SEED: u64 = 0xd1a6;

/// Character- or BPE-level language modeling.
#[derive(Debug)]
pub struct LanguageModeling {
    /// The model.
    pub model: Gpt,
    /// The data.
    pub corpus: TextCorpus,
    /// The data-order seed.
    pub seed: u64,
}

impl LanguageModeling {
    /// Checks that the model's vocabulary covers the tokenizer's and that both splits hold
    /// more than one context of tokens.
    pub fn new(model: Gpt, corpus: TextCorpus, seed: u64) -> Result<Self> {
        let (v, t) = (model.config().vocab_size, model.config().block_size);
        if corpus.tokenizer.vocab_size() > v {
            return Err(ModelsError::config(
                "model.vocab_size",
                format!(
                    "is {v}, smaller than the tokenizer's {}",
                    corpus.tokenizer.vocab_size()
                ),
            ));
        }
        for split in [Split::Train, Split::Validation] {
            let n = corpus.tokens(split).size()[0] as usize;
            if n < t + 1 {
                return Err(ModelsError::config(
                    "model.block_size",
                    format!("{t} needs more than the {n} tokens of the {split:?} split"),
                ));
            }
        }
        Ok(Self {
            model,
            corpus,
            seed,
        })
    }
}

impl Task for LanguageModeling {
    fn unit(&self) -> &'static str {
        "tokens"
    }

    fn train_loss(&mut self, step: u64, batch_size: usize, part: Part) -> Result<(Tensor, u64)> {
        let t = self.model.config().block_size;
        let (x, y) = self
            .corpus
            .batch(Split::Train, self.seed, step, batch_size, t)?;
        let (x, y) = (part.take(&x, batch_size)?, part.take(&y, batch_size)?);
        let units = part.range(batch_size).len() * t;
        Ok((self.model.loss(&x, &y)?, units as u64))
    }

    fn evaluate(&mut self, batches: usize, batch_size: usize) -> Result<Eval> {
        let t = self.model.config().block_size;
        let batches = batches.max(1);
        let mut total = 0.0;
        for i in 0..batches {
            let (x, y) =
                self.corpus
                    .batch(Split::Validation, EVAL_SEED, i as u64, batch_size, t)?;
            total += self.model.loss(&x, &y)?.double_value(&[]);
        }
        Ok(Eval {
            loss: total / batches as f64,
            accuracy: None,
        })
    }

    fn diagnostics(&mut self, config: &DiagnosticsConfig) -> Result<Vec<HeadDiagnostics>> {
        let t = self.model.config().block_size;
        let (x, _) = self.corpus.batch(
            Split::Validation,
            DIAGNOSTIC_SEED,
            0,
            config.samples.max(1),
            t,
        )?;
        let (_, traces) = self.model.forward_trace(&x, true);
        diagnose(&self.model, &traces, config)
    }

    fn after_step(&mut self, step: u64) -> Result<()> {
        self.model.refresh_correction(step)
    }

    fn transformer(&self) -> Option<&dyn Transformer> {
        Some(&self.model)
    }
}

/// The salt that separates the masks' random stream from the windows' (both are seeded by the
/// run's seed and drawn on the step's stream).
pub const MASK_SALT: u64 = 0x6d61_736b_6564;

/// Masked language modelling (BERT) on byte-level text: the batch of step s is `batch_size`
/// windows of T = `seq_len` bytes ([`TextCorpus::batch`], seed and step) masked by BERT's rule
/// ([`mask_tokens`], seed ⊕ [`MASK_SALT`], stream s): a pure function of (seed, step).
/// Evaluation: the masked-token loss and accuracy on held-out windows and masks drawn with
/// [`EVAL_SEED`] (the same for every run), weighted by the predicted positions of each batch.
#[derive(Debug)]
pub struct MaskedLanguageModeling {
    /// The model.
    pub model: MaskedLm,
    /// Byte-level text.
    pub corpus: TextCorpus,
    /// BERT's masking rule.
    pub rule: MaskingRule,
    /// The data-order seed.
    pub seed: u64,
}

impl MaskedLanguageModeling {
    /// Checks that the corpus is byte-level, that the model's vocabulary holds the bytes and
    /// the special tokens, the rule, and that both splits hold more than one window.
    pub fn new(model: MaskedLm, corpus: TextCorpus, rule: MaskingRule, seed: u64) -> Result<Self> {
        if !matches!(corpus.tokenizer, Tokenizer::Bytes) {
            return Err(ModelsError::config(
                "tokenizer",
                format!("masked LM needs byte tokens, found {:?}", corpus.tokenizer),
            ));
        }
        let (v, t) = (model.config().vocab_size, model.config().seq_len);
        if v < BYTE_VOCAB {
            return Err(ModelsError::config(
                "model.vocab_size",
                format!("is {v}, fewer than the {BYTE_VOCAB} bytes and special tokens"),
            ));
        }
        rule.validate()?;
        for split in [Split::Train, Split::Validation] {
            let n = corpus.tokens(split).size()[0] as usize;
            if n < t + 1 {
                return Err(ModelsError::config(
                    "model.seq_len",
                    format!("{t} needs more than the {n} bytes of the {split:?} split"),
                ));
            }
        }
        Ok(Self {
            model,
            corpus,
            rule,
            seed,
        })
    }

    /// The masked batch (inputs, targets) of `step` drawn with `seed` from `split`.
    pub fn batch(
        &self,
        split: Split,
        seed: u64,
        step: u64,
        batch_size: usize,
    ) -> Result<(Tensor, Tensor)> {
        let t = self.model.config().seq_len;
        let (x, _) = self.corpus.batch(split, seed, step, batch_size, t)?;
        mask_tokens(&x, &self.rule, seed ^ MASK_SALT, step)
    }
}

impl Task for MaskedLanguageModeling {
    fn unit(&self) -> &'static str {
        "tokens"
    }

    /// The masks are drawn over the whole batch, then cut; each part's loss is the mean over
    /// its own masked positions, so the parts of a step weigh equally whatever their masked
    /// counts.
    fn train_loss(&mut self, step: u64, batch_size: usize, part: Part) -> Result<(Tensor, u64)> {
        let (x, y) = self.batch(Split::Train, self.seed, step, batch_size)?;
        let (x, y) = (part.take(&x, batch_size)?, part.take(&y, batch_size)?);
        let units = part.range(batch_size).len() * self.model.config().seq_len;
        Ok((self.model.loss(&x, &y)?.loss, units as u64))
    }

    fn evaluate(&mut self, batches: usize, batch_size: usize) -> Result<Eval> {
        let _guard = tch::no_grad_guard();
        let (mut loss, mut correct, mut predicted) = (0.0, 0i64, 0i64);
        for i in 0..batches.max(1) {
            let (x, y) = self.batch(Split::Validation, EVAL_SEED, i as u64, batch_size)?;
            let out = self.model.loss(&x, &y)?;
            loss += out.loss.double_value(&[]) * out.predicted as f64;
            correct += out.correct;
            predicted += out.predicted;
        }
        let n = predicted.max(1) as f64;
        Ok(Eval {
            loss: loss / n,
            accuracy: Some(correct as f64 / n),
        })
    }

    fn diagnostics(&mut self, config: &DiagnosticsConfig) -> Result<Vec<HeadDiagnostics>> {
        let (x, _) = self.batch(Split::Validation, DIAGNOSTIC_SEED, 0, config.samples.max(1))?;
        let (_, traces) = self.model.forward_trace(&x, true);
        diagnose(&self.model, &traces, config)
    }

    fn after_step(&mut self, step: u64) -> Result<()> {
        self.model.refresh_correction(step)
    }

    fn transformer(&self) -> Option<&dyn Transformer> {
        Some(&self.model)
    }
}

/// A model that classifies a batch: the two classifiers of kappa-models, [`Vit`] and
/// [`SequenceClassifier`], as [`Classification`] uses them.
pub trait ClassifierModel: Transformer {
    /// Checked logits B×classes.
    fn logits(&self, x: &Tensor) -> Result<Tensor>;
    /// Mean cross-entropy against integer labels (with the graph).
    fn loss(&self, x: &Tensor, labels: &Tensor) -> Result<Tensor>;
    /// Logits and every layer's attention trace (unchecked).
    fn forward_trace(&self, x: &Tensor, trace: bool) -> (Tensor, Vec<AttentionTrace>);
}

/// Labelled splits a [`Classification`] draws from: the image and the sequence data sets.
pub trait ClassificationData {
    /// What the throughput counts (`images`, `sequences`).
    const UNIT: &'static str;
    /// The training batch of step `step` (a pure function of seed and step).
    fn train_batch(&self, seed: u64, step: u64, batch_size: usize) -> Result<(Tensor, Tensor)>;
    /// Examples in a split.
    fn split_len(&self, split: Split) -> usize;
    /// Examples `start..start + len` of a split, inputs and labels.
    fn split_slice(&self, split: Split, start: usize, len: usize) -> (Tensor, Tensor);
}

/// Both models have these methods inherently; the trait names them for [`Classification`].
macro_rules! classifier_model {
    ($model:ty) => {
        impl ClassifierModel for $model {
            fn logits(&self, x: &Tensor) -> Result<Tensor> {
                <$model>::logits(self, x)
            }
            fn loss(&self, x: &Tensor, labels: &Tensor) -> Result<Tensor> {
                <$model>::loss(self, x, labels)
            }
            fn forward_trace(&self, x: &Tensor, trace: bool) -> (Tensor, Vec<AttentionTrace>) {
                <$model>::forward_trace(self, x, trace)
            }
        }
    };
}
classifier_model!(Vit);
classifier_model!(SequenceClassifier);

/// The splits types of kappa-models share `train`, `split(…)` and the sets' `batch`, `len` and
/// `slice`.
macro_rules! classification_data {
    ($splits:ty, $unit:literal) => {
        impl ClassificationData for $splits {
            const UNIT: &'static str = $unit;
            fn train_batch(&self, seed: u64, step: u64, b: usize) -> Result<(Tensor, Tensor)> {
                self.train.batch(seed, step, b)
            }
            fn split_len(&self, split: Split) -> usize {
                self.split(split).len()
            }
            fn split_slice(&self, split: Split, start: usize, len: usize) -> (Tensor, Tensor) {
                self.split(split).slice(start, len)
            }
        }
    };
}
classification_data!(ImageSplits, "images");
classification_data!(SequenceSplits, "sequences");

/// Classification: a classifier model on labelled splits — [`ImageClassification`] (a [`Vit`]
/// on [`ImageSplits`]: Fashion-MNIST, an IDX folder or a PNG image folder) and
/// [`SequenceClassification`] (a [`SequenceClassifier`] on the long-range [`SequenceSplits`]).
#[derive(Debug)]
pub struct Classification<M, D> {
    /// The model.
    pub model: M,
    /// The data.
    pub data: D,
    /// The data-order seed.
    pub seed: u64,
}

/// Image classification: a [`Vit`] on the splits of an image data set.
pub type ImageClassification = Classification<Vit, ImageSplits>;

/// Sequence classification: a [`SequenceClassifier`] on [`SequenceSplits`] (the long-range
/// tasks of [`kappa_models::data::sequences`]).
pub type SequenceClassification = Classification<SequenceClassifier, SequenceSplits>;

impl ImageClassification {
    /// A task; the model must take the data's images (side, channels) into its classes
    /// ([`ImageSplits::check_model`]: the error names `model.image_size`, `model.channels` or
    /// `model.num_classes`).
    pub fn new(model: Vit, data: ImageSplits, seed: u64) -> Result<Self> {
        data.check_model(model.config())?;
        Ok(Self { model, data, seed })
    }
}

impl SequenceClassification {
    /// A task; the model must read the data's sequences: its `seq_len`, `num_classes` and
    /// `pad_id` equal the data's and its vocabulary covers the data's (errors name the key).
    pub fn new(model: SequenceClassifier, data: SequenceSplits, seed: u64) -> Result<Self> {
        let c = model.config();
        let mismatch = |key: &str, model: String, data: String| {
            ModelsError::config(
                format!("model.{key}"),
                format!("is {model}, the data's is {data}"),
            )
        };
        let checks = [
            (
                "seq_len",
                c.seq_len != data.seq_len,
                c.seq_len.to_string(),
                data.seq_len.to_string(),
            ),
            (
                "num_classes",
                c.num_classes != data.num_classes,
                c.num_classes.to_string(),
                data.num_classes.to_string(),
            ),
            (
                "pad_id",
                c.pad_id != data.pad_id,
                format!("{:?}", c.pad_id),
                format!("{:?}", data.pad_id),
            ),
            (
                "vocab_size",
                c.vocab_size < data.vocab_size,
                c.vocab_size.to_string(),
                data.vocab_size.to_string(),
            ),
        ];
        if let Some((key, _, m, d)) = checks.into_iter().find(|c| c.1) {
            return Err(mismatch(key, m, d));
        }
        Ok(Self { model, data, seed })
    }
}

impl<M: ClassifierModel, D: ClassificationData> Classification<M, D> {
    /// Loss and accuracy on the first `limit` examples of a split (all when `None`), in
    /// chunks of `batch_size`, without gradient.
    pub fn evaluate_split(
        &self,
        split: Split,
        limit: Option<usize>,
        batch_size: usize,
    ) -> Result<Eval> {
        let len = self.data.split_len(split);
        let n = limit.map_or(len, |l| l.min(len));
        let _guard = tch::no_grad_guard();
        let (mut loss, mut correct) = (0.0, 0i64);
        let mut start = 0;
        while start < n {
            let len = batch_size.max(1).min(n - start);
            let (x, y) = self.data.split_slice(split, start, len);
            let logits = self.model.logits(&x)?;
            loss += logits.cross_entropy_for_logits(&y).double_value(&[]) * len as f64;
            correct += logits
                .argmax(-1, false)
                .eq_tensor(&y)
                .sum(Kind::Int64)
                .int64_value(&[]);
            start += len;
        }
        let n = n.max(1) as f64;
        Ok(Eval {
            loss: loss / n,
            accuracy: Some(correct as f64 / n),
        })
    }
}

impl<M: ClassifierModel, D: ClassificationData> Task for Classification<M, D> {
    fn unit(&self) -> &'static str {
        D::UNIT
    }

    fn train_loss(&mut self, step: u64, batch_size: usize, part: Part) -> Result<(Tensor, u64)> {
        let (x, y) = self.data.train_batch(self.seed, step, batch_size)?;
        let (x, y) = (part.take(&x, batch_size)?, part.take(&y, batch_size)?);
        let units = part.range(batch_size).len();
        Ok((self.model.loss(&x, &y)?, units as u64))
    }

    fn evaluate(&mut self, batches: usize, batch_size: usize) -> Result<Eval> {
        let limit = (batches > 0).then_some(batches * batch_size);
        self.evaluate_split(Split::Validation, limit, batch_size)
    }

    fn diagnostics(&mut self, config: &DiagnosticsConfig) -> Result<Vec<HeadDiagnostics>> {
        let (x, _) = self
            .data
            .split_slice(Split::Validation, 0, config.samples.max(1));
        let (_, traces) = self.model.forward_trace(&x, true);
        diagnose(&self.model, &traces, config)
    }

    fn after_step(&mut self, step: u64) -> Result<()> {
        self.model.refresh_correction(step)
    }

    fn transformer(&self) -> Option<&dyn Transformer> {
        Some(&self.model)
    }
}
