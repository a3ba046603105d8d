//! "lambda-readings": which reading of the paper's λ·I_k keeps λ = 10 from collapsing
//! attention. The same λ sweep runs under each reading the method admits — the per-head layout
//! (fused `λ·I_D` or the same block in every head), the score scale (1/√k or 1), the tokens the
//! shift adds (the LayerNorm's output or the normalized tokens before its gain), and λ's unit
//! (absolute, or a multiple of the weights' initial σ_max) — in trained models, with the
//! attention's entropy, saturation and mean diagonal at initialization and after training, and
//! the final metric. The report says which readings collapse at λ = 10, whether any reading
//! gains on its baseline, and what a user should set (docs/models.md, "The readings of λ·I_k").

mod report;

use std::path::Path;

use anyhow::{Context, Result};
use kappa_models::data::sequences::{ListOps, ListOpsConfig};
use kappa_models::mlm::{MaskedLm, MaskingRule};
use kappa_models::{
    CorrectionConfig, EncoderConfig, HeadLayout, LambdaUnit, ScoreScale, SequenceClassifier,
    SequenceClassifierConfig, ShiftInput, Split,
};
use kappa_train::{MaskedLanguageModeling, Outcome, SequenceClassification, Task, TrainConfig};
use serde::{Deserialize, Serialize};

use crate::correction_study::{train_corrected, Variant};
use crate::report::{opened, Section};
use crate::run::{Run, RunRecord, RunStatus};
use crate::suite::bert_sentiment::{corpus, Corpus};
use crate::Experiment;

/// The experiment (registered as `lambda-readings`).
pub struct LambdaReadings;

/// What `lambda-readings` runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The λ values swept under every reading (> 0; λ = 0, the baseline, is trained once per
    /// score scale).
    pub lambdas: Vec<f64>,
    /// The paper's λ (one of `lambdas`): the verdicts ask whether it collapses and gains.
    pub paper_lambda: f64,
    /// A cell collapsed when at least this share of attention rows (over layers, heads and
    /// sampled rows, at the last evaluation) put more than 0.99 of their mass on one token.
    pub collapse_saturated: f64,
    /// The readings, kappa's default first.
    pub readings: Vec<Reading>,
    /// The trained models.
    pub models: Vec<ModelSpec>,
}

/// One reading of λ·I_k: everything the paper leaves open about where λ·I_k goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reading {
    /// Table label.
    pub name: String,
    /// Which k columns of the tokens head h's shift adds.
    pub layout: HeadLayout,
    /// The score scale s of softmax(QKᵀ/s).
    pub scaling: ScoreScale,
    /// The tokens the shift adds.
    pub input: ShiftInput,
    /// What λ is measured in.
    pub unit: LambdaUnit,
}

impl Reading {
    /// This reading's correction at `lambda` (none at λ = 0).
    pub fn correction(&self, lambda: f64) -> CorrectionConfig {
        if lambda == 0.0 {
            return CorrectionConfig::None;
        }
        CorrectionConfig::Identity {
            lambda,
            layout: self.layout,
            unit: self.unit,
            input: self.input,
        }
    }
}

/// A model trained under every reading and λ.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelSpec {
    /// A long-range sequence classifier (exact or Nyström attention) on generated ListOps.
    ListOps {
        /// Table label.
        name: String,
        /// The model (its `scaling` and `conditioning` are each cell's).
        model: SequenceClassifierConfig,
        /// The generated splits.
        data: ListOpsConfig,
        /// Training settings.
        train: TrainConfig,
    },
    /// A crammed BERT (the `bert-sentiment` experiment's encoder) pretrained with masked
    /// language modelling on byte-level text; the metric is the held-out masked-byte accuracy.
    MaskedLm {
        /// Table label.
        name: String,
        /// The encoder (its `scaling` and `conditioning` are each cell's).
        model: EncoderConfig,
        /// The pretraining text.
        corpus: Corpus,
        /// BERT's masking rule.
        masking: MaskingRule,
        /// Held-out batches of the final metric.
        final_eval_batches: usize,
        /// Training settings.
        train: TrainConfig,
    },
}

impl ModelSpec {
    /// The model's label.
    pub fn name(&self) -> &str {
        match self {
            ModelSpec::ListOps { name, .. } | ModelSpec::MaskedLm { name, .. } => name,
        }
    }

    /// What the final metric is (a fraction; the report shows it in %).
    pub fn metric(&self) -> &'static str {
        match self {
            ModelSpec::ListOps { .. } => "test accuracy",
            ModelSpec::MaskedLm { .. } => "held-out masked-byte accuracy",
        }
    }

    fn train(&self) -> &TrainConfig {
        match self {
            ModelSpec::ListOps { train, .. } | ModelSpec::MaskedLm { train, .. } => train,
        }
    }

    fn validate(&self, cell: &Cell) -> Result<()> {
        match self {
            ModelSpec::ListOps { model, data, .. } => {
                data.validate()?;
                cell.model_config(model).attention().validate("model")?;
            }
            ModelSpec::MaskedLm { model, masking, .. } => {
                masking.validate()?;
                cell.encoder_config(model).attention().validate("model")?;
            }
        }
        Ok(())
    }
}

/// One trained variant: a model under a reading at a λ (λ = 0: the baseline of a score scale).
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    /// The variant name in the run's records: `model / reading / λ=…` or `model / baseline …`.
    pub name: String,
    /// The score scale.
    pub scaling: ScoreScale,
    /// The correction.
    pub correction: CorrectionConfig,
}

impl Cell {
    fn model_config(&self, model: &SequenceClassifierConfig) -> SequenceClassifierConfig {
        SequenceClassifierConfig {
            scaling: self.scaling,
            correction: self.correction,
            ..*model
        }
    }

    fn encoder_config(&self, model: &EncoderConfig) -> EncoderConfig {
        EncoderConfig {
            scaling: self.scaling,
            correction: self.correction,
            ..*model
        }
    }
}

/// The variant name of a reading's cell at λ (λ = 0 is its score scale's baseline).
pub fn cell_name(model: &str, reading: &Reading, lambda: f64) -> String {
    if lambda == 0.0 {
        baseline_name(model, reading.scaling)
    } else {
        format!("{model} / {} / λ={lambda}", reading.name)
    }
}

fn baseline_name(model: &str, scaling: ScoreScale) -> String {
    match scaling {
        ScoreScale::InvSqrtK => format!("{model} / baseline (s = √k)"),
        ScoreScale::One => format!("{model} / baseline (s = 1)"),
        ScoreScale::Custom(s) => format!("{model} / baseline (s = {s})"),
    }
}

impl Config {
    /// The cells of one model, in training order: the baselines of the readings' score scales
    /// (each once), then every reading at every λ.
    pub fn cells(&self, model: &str) -> Vec<Cell> {
        let mut cells: Vec<Cell> = Vec::new();
        for r in &self.readings {
            let name = cell_name(model, r, 0.0);
            if !cells.iter().any(|c| c.name == name) {
                cells.push(Cell {
                    name,
                    scaling: r.scaling,
                    correction: CorrectionConfig::None,
                });
            }
        }
        for r in &self.readings {
            for &lambda in &self.lambdas {
                cells.push(Cell {
                    name: cell_name(model, r, lambda),
                    scaling: r.scaling,
                    correction: r.correction(lambda),
                });
            }
        }
        cells
    }
}

impl Experiment for LambdaReadings {
    type Config = Config;

    fn name(&self) -> &'static str {
        "lambda-readings"
    }

    fn claim(&self) -> &'static str {
        "λ·I_k with the paper's default λ = 10 improves attention models; kappa finds that it \
         collapses attention to the identity at LayerNorm-scale tokens. Which reading of the \
         method (per-head layout, score scale, shift before or after the LayerNorm's gain, λ \
         absolute or relative to σ_max) keeps λ = 10 from collapsing, and does any of them gain?"
    }

    fn continues_interrupted_runs(&self) -> bool {
        true
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn default_seeds(&self, _scale: crate::Scale) -> u32 {
        2
    }

    fn data_needs(&self) -> &'static [&'static str] {
        // The masked-LM model reads SOTU and Brown (the built-in configs use both).
        &["sotu", "brown"]
    }

    fn validate(&self, c: &Config) -> Result<()> {
        validate_config(c)
    }

    fn run(&self, config: &Config, run: &mut Run) -> Result<RunStatus> {
        let mut index = 0;
        for spec in &config.models {
            for cell in config.cells(spec.name()) {
                train_cell(spec, &cell, index, run)
                    .with_context(|| format!("variant {}", cell.name))?;
                index += 1;
            }
        }
        // A collapsed or diverged cell is a result, not a failed run.
        Ok(RunStatus::Completed)
    }

    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        let mut section = opened(
            "lambda-readings: which reading of λ·I_k survives λ = 10",
            Experiment::claim(self),
            runs,
        );
        report::write(&mut section, runs, out_dir, report_dir)?;
        Ok(section)
    }
}

fn validate_config(c: &Config) -> Result<()> {
    anyhow::ensure!(!c.readings.is_empty(), "readings: need at least one");
    anyhow::ensure!(!c.models.is_empty(), "models: need at least one");
    for (i, &l) in c.lambdas.iter().enumerate() {
        anyhow::ensure!(
            l.is_finite() && l > 0.0,
            "lambdas[{i}]: must be finite and > 0 (λ = 0 is each score scale's baseline), found {l}"
        );
    }
    anyhow::ensure!(
        c.lambdas.contains(&c.paper_lambda),
        "paper_lambda: must be one of lambdas = {:?}, found {}",
        c.lambdas,
        c.paper_lambda
    );
    anyhow::ensure!(
        c.collapse_saturated > 0.0 && c.collapse_saturated <= 1.0,
        "collapse_saturated: must be in (0, 1], found {}",
        c.collapse_saturated
    );
    for (i, spec) in c.models.iter().enumerate() {
        spec.train()
            .validate()
            .with_context(|| format!("models[{i}].train"))?;
        anyhow::ensure!(
            spec.train().diagnostics.enabled,
            "models[{i}].train.diagnostics.enabled: the readings are judged by the attention \
             diagnostics, so they must be on"
        );
        for cell in c.cells(spec.name()) {
            spec.validate(&cell)
                .with_context(|| format!("models[{i}], variant {}", cell.name))?;
        }
    }
    Ok(())
}

/// Trains one cell (resuming it, or skipping it when an earlier attempt finished it).
fn train_cell(spec: &ModelSpec, cell: &Cell, index: usize, run: &mut Run) -> Result<Outcome> {
    let seed = run.context().seed;
    let device = kappa_models::parse_device(&run.context().device)?;
    let variant = Variant {
        name: cell.name.clone(),
        correction: cell.correction,
    };
    let accuracy = |eval: kappa_train::Eval| eval.accuracy.unwrap_or(f64::NAN);
    match spec {
        ModelSpec::ListOps {
            model, data, train, ..
        } => {
            let config = cell.model_config(model);
            // The splits are a function of the config alone (seed 0): every seed and cell
            // sees the same expressions; the seed changes the initialization and the order.
            let splits = ListOps::generate(data, 0, device)?;
            train_corrected(
                run,
                index,
                &variant,
                train,
                |vs| {
                    let m = SequenceClassifier::new(&vs.root(), config)?;
                    Ok(SequenceClassification::new(m, splits, seed)?)
                },
                |task| Ok(accuracy(task.evaluate_split(Split::Test, None, 256)?)),
            )
        }
        ModelSpec::MaskedLm {
            model,
            corpus: text,
            masking,
            final_eval_batches,
            train,
            ..
        } => {
            let config = cell.encoder_config(model);
            let text = corpus(text, run)?;
            let (rule, batches) = (*masking, *final_eval_batches);
            train_corrected(
                run,
                index,
                &variant,
                train,
                |vs| {
                    let m = MaskedLm::new(&vs.root(), config)?;
                    Ok(MaskedLanguageModeling::new(m, text, rule, seed)?)
                },
                |task| Ok(accuracy(task.evaluate(batches, train.batch_size)?)),
            )
        }
    }
}
