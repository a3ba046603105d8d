//! The tasks of the experiments, as [`Task`]s for the [`Trainer`](crate::Trainer):
//! next-token prediction with a [`Gpt`] on a [`TextCorpus`], image classification with a
//! [`Vit`] on [`ImageSplits`] (Fashion-MNIST, an IDX folder or a PNG image folder), and sequence
//! classification with a [`SequenceClassifier`] on [`SequenceSplits`] (the long-range tasks).
//!
//! Evaluation batches and the diagnostic batch are drawn with fixed seeds that do not depend
//! on the run's seed, so every run of an experiment is measured on the same data.

use tch::{Kind, Tensor};

use crate::trainer::{Eval, Task};
use kappa_models::classifier::SequenceClassifier;
use kappa_models::data::sequences::SequenceSplits;
use kappa_models::data::{ImageSet, ImageSplits, Split, TextCorpus};
use kappa_models::diagnostics::{diagnose, DiagnosticsConfig, HeadDiagnostics};
use kappa_models::error::{ModelsError, Result};
use kappa_models::gpt::Gpt;
use kappa_models::layers::Transformer;
use kappa_models::vit::Vit;

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

    fn train_loss(&mut self, step: u64, batch_size: usize) -> Result<(Tensor, u64)> {
        let t = self.model.config().block_size;
        let (x, y) = self
            .corpus
            .batch(Split::Train, self.seed, step, batch_size, t)?;
        Ok((self.model.loss(&x, &y)?, (batch_size * t) as u64))
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
        self.model.refresh_conditioning(step)
    }

    fn transformer(&self) -> Option<&dyn Transformer> {
        Some(&self.model)
    }
}

/// Image classification: a [`Vit`] on the splits of an image data set.
#[derive(Debug)]
pub struct ImageClassification {
    /// The model.
    pub model: Vit,
    /// The data.
    pub data: ImageSplits,
    /// The data-order seed.
    pub seed: u64,
}

impl ImageClassification {
    /// A task; the model must take the data's images (side, channels) into its classes
    /// ([`ImageSplits::check_model`]: the error names `model.image_size`, `model.channels` or
    /// `model.num_classes`).
    pub fn new(model: Vit, data: ImageSplits, seed: u64) -> Result<Self> {
        data.check_model(model.config())?;
        Ok(Self { model, data, seed })
    }

    fn set(&self, split: Split) -> &ImageSet {
        self.data.split(split)
    }

    /// Loss and accuracy on the first `limit` examples of a split (all when `None`), in
    /// chunks of `batch_size`, without gradient.
    pub fn evaluate_split(
        &self,
        split: Split,
        limit: Option<usize>,
        batch_size: usize,
    ) -> Result<Eval> {
        let set = self.set(split);
        let n = limit.map_or(set.len(), |l| l.min(set.len()));
        classification_eval(
            n,
            batch_size,
            |s, l| set.slice(s, l),
            |x| self.model.logits(x),
        )
    }
}

/// Mean cross-entropy and accuracy over the first `n` examples, in chunks of `batch_size`
/// (`slice(start, len)` gives inputs and labels), without gradient: the evaluation of every
/// classification task.
fn classification_eval(
    n: usize,
    batch_size: usize,
    slice: impl Fn(usize, usize) -> (Tensor, Tensor),
    logits: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Eval> {
    let _guard = tch::no_grad_guard();
    let (mut loss, mut correct) = (0.0, 0i64);
    let mut start = 0;
    while start < n {
        let len = batch_size.max(1).min(n - start);
        let (x, y) = slice(start, len);
        let logits = logits(&x)?;
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

impl Task for ImageClassification {
    fn unit(&self) -> &'static str {
        "images"
    }

    fn train_loss(&mut self, step: u64, batch_size: usize) -> Result<(Tensor, u64)> {
        let (x, y) = self.data.train.batch(self.seed, step, batch_size)?;
        Ok((self.model.loss(&x, &y)?, batch_size as u64))
    }

    fn evaluate(&mut self, batches: usize, batch_size: usize) -> Result<Eval> {
        let limit = (batches > 0).then_some(batches * batch_size);
        self.evaluate_split(Split::Validation, limit, batch_size)
    }

    fn diagnostics(&mut self, config: &DiagnosticsConfig) -> Result<Vec<HeadDiagnostics>> {
        let (x, _) = self.data.validation.slice(0, config.samples.max(1));
        let (_, traces) = self.model.forward_trace(&x, true);
        diagnose(&self.model, &traces, config)
    }

    fn after_step(&mut self, step: u64) -> Result<()> {
        self.model.refresh_conditioning(step)
    }

    fn transformer(&self) -> Option<&dyn Transformer> {
        Some(&self.model)
    }
}

/// Sequence classification: a [`SequenceClassifier`] on [`SequenceSplits`] (the long-range
/// tasks of [`kappa_models::data::sequences`]).
#[derive(Debug)]
pub struct SequenceClassification {
    /// The model.
    pub model: SequenceClassifier,
    /// The data.
    pub data: SequenceSplits,
    /// The data-order seed.
    pub seed: u64,
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
        if c.seq_len != data.seq_len {
            return Err(mismatch(
                "seq_len",
                c.seq_len.to_string(),
                data.seq_len.to_string(),
            ));
        }
        if c.num_classes != data.num_classes {
            let (m, d) = (c.num_classes.to_string(), data.num_classes.to_string());
            return Err(mismatch("num_classes", m, d));
        }
        if c.pad_id != data.pad_id {
            return Err(mismatch(
                "pad_id",
                format!("{:?}", c.pad_id),
                format!("{:?}", data.pad_id),
            ));
        }
        if c.vocab_size < data.vocab_size {
            let (m, d) = (c.vocab_size.to_string(), data.vocab_size.to_string());
            return Err(mismatch("vocab_size", m, d));
        }
        Ok(Self { model, data, seed })
    }

    /// Loss and accuracy on the first `limit` examples of a split (all when `None`), in
    /// chunks of `batch_size`, without gradient.
    pub fn evaluate_split(
        &self,
        split: Split,
        limit: Option<usize>,
        batch_size: usize,
    ) -> Result<Eval> {
        let set = self.data.split(split);
        let n = limit.map_or(set.len(), |l| l.min(set.len()));
        classification_eval(
            n,
            batch_size,
            |s, l| set.slice(s, l),
            |x| self.model.logits(x),
        )
    }
}

impl Task for SequenceClassification {
    fn unit(&self) -> &'static str {
        "sequences"
    }

    fn train_loss(&mut self, step: u64, batch_size: usize) -> Result<(Tensor, u64)> {
        let (x, y) = self.data.train.batch(self.seed, step, batch_size)?;
        Ok((self.model.loss(&x, &y)?, batch_size as u64))
    }

    fn evaluate(&mut self, batches: usize, batch_size: usize) -> Result<Eval> {
        let limit = (batches > 0).then_some(batches * batch_size);
        self.evaluate_split(Split::Validation, limit, batch_size)
    }

    fn diagnostics(&mut self, config: &DiagnosticsConfig) -> Result<Vec<HeadDiagnostics>> {
        let (x, _) = self.data.validation.slice(0, config.samples.max(1));
        let (_, traces) = self.model.forward_trace(&x, true);
        diagnose(&self.model, &traces, config)
    }

    fn after_step(&mut self, step: u64) -> Result<()> {
        self.model.refresh_conditioning(step)
    }

    fn transformer(&self) -> Option<&dyn Transformer> {
        Some(&self.model)
    }
}
