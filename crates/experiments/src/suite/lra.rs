//! "lra": Long Range Arena on a Nyström-attention [`SequenceClassifier`], baseline against the
//! spectral conditioning of *Spectral Conditioning of Attention* — λ·I_k added to W_Q, W_K, W_V
//! at the paper's λ = 10, at the best λ of a small sweep, and the scale-aware λ — on the tasks of
//! [`kappa_models::data::sequences`]: ListOps, Text (bytes of movie reviews), Image (pixels of
//! Fashion-MNIST, optionally average-pooled to a smaller side; LRA reads gray CIFAR-10 the same
//! way) and Pathfinder. LRA's Retrieval task has
//! no data here; the report says so.
//!
//! Every run (one seed) trains, task by task, every variant of [`Config::variants`] through
//! [`crate::correction_study::train_corrected`] (so an interrupted run resumes, and a diverged
//! variant is a result); the headline metric is test accuracy. The report picks the
//! best λ of the sweep by validation accuracy and decides each claim by the rule in [`rule`].

pub mod rule;

mod report;

use std::path::Path;

use anyhow::{Context, Result};
use kappa_attention::ScoreScale;
use kappa_models::data::sequences::{
    image, listops, load_fashion_mnist, text, ImageSequenceConfig, ListOps, ListOpsConfig,
    MovieReviews, Pathfinder, PathfinderConfig, SequenceSet, SequenceSplits, TextConfig,
};
use kappa_models::{
    AttentionKernel, CorrectionConfig, FashionMnist, HeadLayout, SequenceClassifier,
    SequenceClassifierConfig, Split,
};
use kappa_train::{SequenceClassification, TrainConfig};
use serde::{Deserialize, Serialize};
use tch::Kind;

use crate::correction_study::{train_corrected, Variant};
use crate::report::Section;
use crate::run::{Run, RunRecord, RunStatus};
use crate::{Experiment, Scale};

/// The experiment (registered as `lra`).
pub struct Lra;

/// One task of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LraTask {
    /// Nested MIN/MAX/MED/SM expressions, 10 classes.
    Listops,
    /// Byte-level sentiment of movie-review sentences, 2 classes.
    Text,
    /// Fashion-MNIST as 784 pixel tokens, 10 classes.
    Image,
    /// Are the two dots joined by a path? 2 classes.
    Pathfinder,
}

impl LraTask {
    /// The name in configs, variant names and file names.
    pub fn name(self) -> &'static str {
        match self {
            LraTask::Listops => "listops",
            LraTask::Text => "text",
            LraTask::Image => "image",
            LraTask::Pathfinder => "pathfinder",
        }
    }
}

/// The model of every task; vocabulary, length, classes and padding come from the task.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    /// Blocks L.
    pub n_layer: usize,
    /// Heads H.
    pub n_head: usize,
    /// Width D.
    pub n_embd: usize,
    /// MLP hidden width over D.
    pub mlp_ratio: usize,
    /// Biases in linear layers and LayerNorms.
    pub bias: bool,
    /// The score scale s.
    pub scaling: ScoreScale,
    /// Exact softmax or Nyström attention (the landmarks must divide every task's length).
    pub kernel: AttentionKernel,
}

/// The scale-aware λ: chosen for κ ≤ `target_kappa`, re-chosen every `every` steps.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleAware {
    /// The κ bound (> 1).
    pub target_kappa: f64,
    /// Re-choose λ every this many steps (0: once, at initialization).
    pub every: u64,
}

/// The conditioned variants: λ·I_k at the paper's λ and at each λ of the sweep, and the
/// scale-aware λ.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorrectionSweep {
    /// The paper's λ (10).
    pub paper_lambda: f64,
    /// The sweep the best λ is chosen from (by validation accuracy, [`rule::best_lambda`]).
    pub sweep: Vec<f64>,
    /// The per-head layout of every correction.
    pub layout: HeadLayout,
    /// The scale-aware variant (absent: not run).
    pub scale_aware: Option<ScaleAware>,
}

/// What a variant is to the report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Role {
    /// No correction.
    Baseline,
    /// λ·I_k at the paper's λ.
    Paper,
    /// λ·I_k at one λ of the sweep.
    Sweep(f64),
    /// The scale-aware λ.
    ScaleAware,
}

/// One variant of a task: its role and the [`Variant`] trained.
#[derive(Clone, Debug)]
pub struct LraVariant {
    /// What it is.
    pub role: Role,
    /// Its label (without the task) and correction.
    pub variant: Variant,
}

/// The data of every task.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// The seed of the generated data sets (ListOps, Pathfinder): the same for every run, so
    /// runs differ only in initialization and batch order.
    pub seed: u64,
    /// ListOps' splits and lengths.
    pub listops: ListOpsConfig,
    /// Text's length and held-out sizes.
    pub text: TextConfig,
    /// Image's validation split and training limit.
    pub image: ImageSequenceConfig,
    /// The side S the 28×28 images are average-pooled to (S must divide 28; 28: the full
    /// images), so Image has T = S² pixel tokens.
    pub image_side: usize,
    /// Pathfinder's image size, paths and splits.
    pub pathfinder: PathfinderConfig,
    /// Test accuracy on at most this many test examples (the first of the split; absent: all).
    pub test_limit: Option<usize>,
}

/// What `lra` runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The tasks, in order (a subset of listops, text, image, pathfinder).
    pub tasks: Vec<LraTask>,
    /// The data.
    pub data: DataConfig,
    /// The model.
    pub model: ModelShape,
    /// The conditioned variants.
    #[serde(alias = "conditioning")]
    pub correction: CorrectionSweep,
    /// Significance level of the verdicts ([`rule::verdict`]).
    pub alpha: f64,
    /// Training settings of every task (seed, threads and device come from the run context).
    pub train: TrainConfig,
}

/// Examples per forward pass when the test split is evaluated.
const TEST_BATCH: usize = 128;

impl Config {
    /// The variants of every task, baseline first: the paper's λ, the sweep, the scale-aware λ.
    pub fn variants(&self) -> Vec<LraVariant> {
        let c = &self.correction;
        let identity = |lambda| CorrectionConfig::identity(lambda, c.layout);
        let one = |role, name: String, correction| LraVariant {
            role,
            variant: Variant { name, correction },
        };
        let mut out = vec![
            one(Role::Baseline, "baseline".into(), CorrectionConfig::None),
            one(
                Role::Paper,
                format!("λ={} (paper)", c.paper_lambda),
                identity(c.paper_lambda),
            ),
        ];
        for &lambda in &c.sweep {
            out.push(one(
                Role::Sweep(lambda),
                format!("λ={lambda}"),
                identity(lambda),
            ));
        }
        if let Some(s) = c.scale_aware {
            let correction = CorrectionConfig::ScaleAware {
                target_kappa: s.target_kappa,
                layout: c.layout,
                every: s.every,
            };
            let name = format!("scale-aware κ≤{}", s.target_kappa);
            out.push(one(Role::ScaleAware, name, correction));
        }
        out
    }

    /// The name of `variant` of `task` in `metrics.jsonl`: `TASK: LABEL`.
    pub fn variant_name(task: LraTask, variant: &LraVariant) -> String {
        format!("{}: {}", task.name(), variant.variant.name)
    }

    /// (sequence length, vocabulary, classes, padding token) of a task's data.
    pub fn shape_of(&self, task: LraTask) -> (usize, usize, usize, Option<i64>) {
        match task {
            LraTask::Listops => (
                self.data.listops.max_length,
                listops::SYMBOLS.len(),
                10,
                Some(listops::PAD),
            ),
            LraTask::Text => (self.data.text.seq_len, 257, 2, Some(text::PAD)),
            LraTask::Image => (self.data.image_side.pow(2), 256, 10, None),
            LraTask::Pathfinder => (self.data.pathfinder.size.pow(2), 256, 2, None),
        }
    }

    /// The classifier of `task` with `conditioning`.
    pub fn model_of(
        &self,
        task: LraTask,
        correction: CorrectionConfig,
    ) -> SequenceClassifierConfig {
        let (seq_len, vocab_size, num_classes, pad_id) = self.shape_of(task);
        let m = &self.model;
        SequenceClassifierConfig {
            vocab_size,
            seq_len,
            pad_id,
            num_classes,
            n_layer: m.n_layer,
            n_head: m.n_head,
            n_embd: m.n_embd,
            mlp_ratio: m.mlp_ratio,
            bias: m.bias,
            scaling: m.scaling,
            correction,
            fused_kernel: true,
            kernel: m.kernel,
        }
    }

    /// Loads (or generates) the splits of `task`.
    fn load(&self, task: LraTask, data_dir: &Path, device: tch::Device) -> Result<SequenceSplits> {
        Ok(match task {
            LraTask::Listops => ListOps::generate(&self.data.listops, self.data.seed, device)?,
            LraTask::Text => {
                MovieReviews::load(&data_dir.join(MovieReviews::SET), &self.data.text, device)?
            }
            LraTask::Image => {
                let d = load_fashion_mnist(
                    &data_dir.join(FashionMnist::SET),
                    &self.data.image,
                    device,
                )?;
                pool_pixels(d, self.data.image_side)
            }
            LraTask::Pathfinder => {
                Pathfinder::generate(&self.data.pathfinder, self.data.seed, device)?
            }
        })
    }
}

/// The pixel splits (28×28 images as 784 tokens) average-pooled to `side`×`side` (`side`
/// divides 28), each pooled gray level rounded to the nearest integer (so still in 0..=255).
fn pool_pixels(d: SequenceSplits, side: usize) -> SequenceSplits {
    if side == image::SIDE {
        return d;
    }
    let f = (image::SIDE / side) as i64;
    let pool = |s: &SequenceSet| {
        let n = s.tokens.size()[0];
        let full = image::SIDE as i64;
        let tokens = s
            .tokens
            .view([n, 1, full, full])
            .to_kind(Kind::Float)
            .avg_pool2d([f, f], [f, f], [0, 0], false, true, None::<i64>)
            .round()
            .to_kind(Kind::Int64)
            .view([n, (side * side) as i64]);
        SequenceSet {
            tokens,
            labels: s.labels.shallow_clone(),
        }
    };
    SequenceSplits {
        train: pool(&d.train),
        validation: pool(&d.validation),
        test: pool(&d.test),
        seq_len: side * side,
        ..d
    }
}

/// A second handle on the same tensors (the variants of a task share one copy of its data).
fn share(d: &SequenceSplits) -> SequenceSplits {
    let set = |s: &SequenceSet| SequenceSet {
        tokens: s.tokens.shallow_clone(),
        labels: s.labels.shallow_clone(),
    };
    SequenceSplits {
        train: set(&d.train),
        validation: set(&d.validation),
        test: set(&d.test),
        vocab_size: d.vocab_size,
        num_classes: d.num_classes,
        pad_id: d.pad_id,
        seq_len: d.seq_len,
    }
}

impl Experiment for Lra {
    type Config = Config;

    fn name(&self) -> &'static str {
        "lra"
    }

    fn claim(&self) -> &'static str {
        "Spectral conditioning (λ·I_k added to W_Q, W_K, W_V, λ = 10) improves a Nyströmformer's \
         Long Range Arena accuracy on every task (five trials): ListOps 37.1 → 37.8, Text \
         63.8 → 64.8, Retrieval 79.8 → 80.6, Image 39.9 → 40.2, Pathfinder 72.9 → 73.7."
    }

    fn continues_interrupted_runs(&self) -> bool {
        true
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn data_needs(&self) -> &'static [&'static str] {
        &["movie-reviews", "fashion-mnist"]
    }

    /// Five at the paper scale, as the paper's five trials; three otherwise.
    fn default_seeds(&self, scale: Scale) -> u32 {
        if scale == Scale::Paper {
            5
        } else {
            3
        }
    }

    fn validate(&self, c: &Config) -> Result<()> {
        validate_lists(c)?;
        c.data.listops.validate()?;
        c.data.pathfinder.validate()?;
        for (key, v) in [
            ("data.text.seq_len", c.data.text.seq_len),
            ("data.text.validation", c.data.text.validation),
            ("data.text.test", c.data.text.test),
            ("data.image.validation", c.data.image.validation),
            ("data.test_limit", c.data.test_limit.unwrap_or(1)),
        ] {
            anyhow::ensure!(v >= 1, "{key}: must be at least 1, found 0");
        }
        let side = c.data.image_side;
        anyhow::ensure!(
            side >= 1 && image::SIDE.is_multiple_of(side),
            "data.image_side: must divide {}, found {side}",
            image::SIDE
        );
        anyhow::ensure!(
            c.alpha > 0.0 && c.alpha < 1.0,
            "alpha: must lie in (0, 1), found {}",
            c.alpha
        );
        for &task in &c.tasks {
            for v in c.variants() {
                c.model_of(task, v.variant.correction)
                    .validate()
                    .with_context(|| format!("task {} ({})", task.name(), v.variant.name))?;
            }
        }
        c.train.validate()?;
        Ok(())
    }

    fn run(&self, config: &Config, run: &mut Run) -> Result<RunStatus> {
        let seed = run.context().seed;
        let device = kappa_models::parse_device(&run.context().device)?;
        let data_dir = run.context().data_dir.clone();
        let variants = config.variants();
        for (t, &task) in config.tasks.iter().enumerate() {
            // Loaded when the first unfinished variant of the task needs it.
            let mut loaded: Option<SequenceSplits> = None;
            for (i, v) in variants.iter().enumerate() {
                let name = Config::variant_name(task, v);
                let variant = Variant {
                    name: name.clone(),
                    correction: v.variant.correction,
                };
                let model = config.model_of(task, v.variant.correction);
                let build = |vs: &tch::nn::VarStore| -> Result<SequenceClassification> {
                    let splits = match &loaded {
                        Some(d) => share(d),
                        None => {
                            let d = config.load(task, &data_dir, device)?;
                            let splits = share(&d);
                            loaded = Some(d);
                            splits
                        }
                    };
                    let classifier = SequenceClassifier::new(&vs.root(), model)?;
                    Ok(SequenceClassification::new(classifier, splits, seed)?)
                };
                let test = |task: &mut SequenceClassification| {
                    let eval =
                        task.evaluate_split(Split::Test, config.data.test_limit, TEST_BATCH)?;
                    Ok(eval.accuracy.unwrap_or(f64::NAN))
                };
                let index = t * variants.len() + i;
                // A diverged variant is a result (its summary says so); the others still run.
                train_corrected(run, index, &variant, &config.train, build, test)
                    .with_context(|| format!("variant {name}"))?;
            }
        }
        Ok(RunStatus::Completed)
    }

    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        report::report(self, runs, out_dir, report_dir)
    }
}

/// The lists of the config: tasks present and distinct; λ values finite, ≥ 0, distinct and
/// not the paper's; the scale-aware target above 1.
fn validate_lists(c: &Config) -> Result<()> {
    anyhow::ensure!(!c.tasks.is_empty(), "tasks: need at least one");
    for (i, t) in c.tasks.iter().enumerate() {
        anyhow::ensure!(
            !c.tasks[..i].contains(t),
            "tasks.{i}: {} is listed twice",
            t.name()
        );
    }
    let k = &c.correction;
    anyhow::ensure!(
        k.paper_lambda.is_finite() && k.paper_lambda >= 0.0,
        "correction.paper_lambda: must be finite and ≥ 0, found {}",
        k.paper_lambda
    );
    for (i, &l) in k.sweep.iter().enumerate() {
        anyhow::ensure!(
            l.is_finite() && l >= 0.0,
            "correction.sweep.{i}: must be finite and ≥ 0, found {l}"
        );
        anyhow::ensure!(
            !k.sweep[..i].contains(&l) && l != k.paper_lambda,
            "correction.sweep.{i}: λ = {l} is listed twice (the sweep and paper_lambda \
             must be distinct)"
        );
    }
    if let Some(s) = k.scale_aware {
        anyhow::ensure!(
            s.target_kappa.is_finite() && s.target_kappa > 1.0,
            "correction.scale_aware.target_kappa: must be finite and > 1, found {}",
            s.target_kappa
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Tensor};

    /// Pooling 28×28 to 14×14 averages each 2×2 block and rounds to the nearest level; side 28
    /// leaves the splits as they are.
    #[test]
    fn pooled_pixels_are_rounded_block_means() {
        // Image 0: pixel (r, c) = r + c, whose 2×2 block means are 2(R + C) + 1 exactly.
        // Image 1: one lit pixel of 1 per block gives means of 0.25 → 0; three give 0.75 → 1.
        let mut ids = Vec::new();
        for r in 0..28i64 {
            for c in 0..28i64 {
                ids.push(r + c);
            }
        }
        for r in 0..28i64 {
            for c in 0..28i64 {
                let lit = if r < 14 {
                    r % 2 == 0 && c % 2 == 0
                } else {
                    r % 2 == 0 || c % 2 == 0
                };
                ids.push(i64::from(lit));
            }
        }
        let set = || SequenceSet {
            tokens: Tensor::from_slice(&ids).view([2, 784]),
            labels: Tensor::from_slice(&[3i64, 4]),
        };
        let splits = || SequenceSplits {
            train: set(),
            validation: set(),
            test: set(),
            vocab_size: 256,
            num_classes: 10,
            pad_id: None,
            seq_len: 784,
        };
        let p = pool_pixels(splits(), 14);
        assert_eq!(p.seq_len, 196);
        assert_eq!(p.test.tokens.size(), [2, 196]);
        assert_eq!(p.test.tokens.device(), Device::Cpu);
        let got: Vec<i64> = Vec::try_from(p.test.tokens.view([-1])).unwrap();
        for r in 0..14 {
            for c in 0..14 {
                assert_eq!(got[r * 14 + c], 2 * (r + c) as i64 + 1);
                assert_eq!(got[196 + r * 14 + c], i64::from(r >= 7));
            }
        }
        assert_eq!(Vec::<i64>::try_from(&p.test.labels).unwrap(), [3, 4]);
        let same = pool_pixels(splits(), 28);
        assert_eq!(same.seq_len, 784);
        assert!(same.train.tokens.equal(&set().tokens));
    }
}
