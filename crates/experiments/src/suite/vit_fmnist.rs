//! "vit-fmnist": a ViT sized for 2 CPU cores on Fashion-MNIST, baseline against the spectral
//! corrections of *Spectral Conditioning of Attention* (λ·I_k at λ = 1 and the paper's λ = 10,
//! the scale-aware λ, the exact SVD correction), with the conditioning measured while training.
//! The variants train one after another through [`kappa_train::variants`] (so an interrupted run
//! resumes); the report is [`crate::correction_study::correction_report`], shared with `gpt-sotu`.

use std::path::Path;

use anyhow::{Context, Result};
use kappa_models::{FashionMnist, Split, Vit, VitConfig};
use kappa_train::{ImageClassification, Outcome, TrainConfig};
use serde::{Deserialize, Serialize};

use crate::correction_study::{correction_report, train_corrected, ReportSpec, Variant};
use crate::report::{opened, Section};
use crate::run::{Run, RunRecord, RunStatus};
use crate::Experiment;

/// The experiment (registered as `vit-fmnist`).
pub struct VitFmnist;

/// What `vit-fmnist` runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The model (its `conditioning` is replaced by each variant's).
    pub model: VitConfig,
    /// The variants, baseline first.
    pub variants: Vec<Variant>,
    /// Training settings (seed, threads and device come from the run context).
    pub train: TrainConfig,
    /// Training images held out for validation.
    pub validation: usize,
    /// At most this many training images.
    pub train_limit: Option<usize>,
}

impl Experiment for VitFmnist {
    type Config = Config;

    fn name(&self) -> &'static str {
        "vit-fmnist"
    }

    fn claim(&self) -> &'static str {
        "Spectrally conditioned attention (W + λI_k, or the exact SVD correction) keeps a higher \
         σ_min and a lower κ of W_Q/W_K/W_V and of the attention Jacobian during training, and \
         improves ViT accuracy (ViT-B on ImageNet: 80.7 → 81.7)."
    }

    fn continues_interrupted_runs(&self) -> bool {
        true
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn data_needs(&self) -> &'static [&'static str] {
        &["fashion-mnist"]
    }

    fn validate(&self, c: &Config) -> Result<()> {
        anyhow::ensure!(!c.variants.is_empty(), "variants: need at least one");
        for (i, variant) in c.variants.iter().enumerate() {
            variant
                .correction
                .validate(&format!("variants.{i}.correction"))?;
            c.model
                .with_correction(variant.correction)
                .validate()
                .with_context(|| format!("variant {:?}", variant.name))?;
        }
        c.train.validate()?;
        if let Some(limit) = c.train_limit {
            anyhow::ensure!(
                limit > c.validation,
                "train_limit: must exceed validation = {} (the validation images come out of it), found {limit}",
                c.validation
            );
        }
        Ok(())
    }

    fn run(&self, config: &Config, run: &mut Run) -> Result<RunStatus> {
        let mut diverged = None;
        for (i, variant) in config.variants.iter().enumerate() {
            let outcome = train_variant(run, config, i, variant)
                .with_context(|| format!("variant {}", variant.name))?;
            if let Outcome::Diverged { step, reason } = outcome {
                diverged.get_or_insert((step, format!("{}: {reason}", variant.name)));
            }
        }
        let all = config.variants.len();
        Ok(match diverged {
            Some((step, reason)) if all == 1 => RunStatus::Diverged { step, reason },
            _ => RunStatus::Completed,
        })
    }

    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        let mut section = opened(
            "vit-fmnist: spectrally conditioned ViT on Fashion-MNIST",
            Experiment::claim(self),
            runs,
        );
        let spec = ReportSpec {
            metric: "test accuracy (%)",
            scale: 100.0,
            higher_is_better: true,
            paper: "Paper, ViT-B/16 on ImageNet-1k top-1 (a different model, data set and scale): \
                    baseline 80.7 (±0.41), + spectral conditioning 81.7 (±0.38), Δ = +1.0.",
            stage: None,
        };
        correction_report(&mut section, runs, out_dir, report_dir, &spec)?;
        Ok(section)
    }
}

/// Trains `variant` (with `config`'s model, data and training settings) as variant `index` of
/// `run`; its metric is the test accuracy.
pub fn train_variant(
    run: &mut Run,
    config: &Config,
    index: usize,
    variant: &Variant,
) -> Result<Outcome> {
    const TEST_BATCH: usize = 256;
    let train = &config.train;
    let seed = run.context().seed;
    let device = kappa_models::parse_device(&run.context().device)?;
    let model = config.model.with_correction(variant.correction);
    if device == tch::Device::Cpu {
        train.ensure_vit_step_fits(&model, TEST_BATCH)?;
    }
    let dir = run.context().data_dir.join(FashionMnist::SET);
    let data = FashionMnist::load(&dir, config.validation, config.train_limit, device)?;
    train_corrected(
        run,
        index,
        variant,
        train,
        |vs| {
            Ok(ImageClassification::new(
                Vit::new(&vs.root(), model)?,
                data,
                seed,
            )?)
        },
        |task| {
            Ok(task
                .evaluate_split(Split::Test, None, TEST_BATCH)?
                .accuracy
                .unwrap_or(f64::NAN))
        },
    )
}
