//! "scaling": how the headline claims move with width. The same models as `manifolds`,
//! `gpt-sotu` and `vit-fmnist`, trained at a series of widths D with the head dimension k fixed
//! (a width has D/k heads, as GPT-2 grows), each width a point of three curves:
//!
//! - the manifold study: the paper's five module-wise assignments trained to one accumulated
//!   spectral step Σηₜ at every width, their loss gaps, whether DGram attention diverges, and
//!   the mechanism the paper names: the largest attention logit against σ_max(W_Q)·σ_max(W_K);
//! - the conditioning study: a character GPT and a ViT with and without λ·I_k.
//!
//! The report fits each effect against log₂ D over every (width, seed) with a 95% interval on
//! the slope, and says which way the effect moves with width. One unit (a seed)
//! trains every point in turn and resumes from the point it stopped at.

mod report;

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::report::Section;
use crate::run::{Run, RunRecord, RunStatus};
use crate::suite::{gpt_sotu, manifolds, vit_fmnist};
use crate::Experiment;

/// The experiment (registered as `scaling`).
pub struct Scaling;

/// What `scaling` runs: three experiments' configs and the widths at which each is trained.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The head dimension k at every width: a model of width D has D / k heads.
    pub head_dim: usize,
    /// The widths D of the manifold study, ascending (empty: the study is not run).
    pub manifold_widths: Vec<usize>,
    /// The widths D of the conditioning study, ascending (empty: not run).
    pub conditioning_widths: Vec<usize>,
    /// The manifold study: the `manifolds` experiment's config, run at every manifold width
    /// (`model.n_embd` and `model.n_head` are the width's). Variants with `ablation = true` run
    /// on the first seed only.
    pub manifolds: manifolds::Config,
    /// The conditioning study's character GPT: `gpt-sotu`'s config, run at every conditioning
    /// width; its first variant is the baseline.
    pub gpt: gpt_sotu::Config,
    /// The conditioning study's ViT: `vit-fmnist`'s config, likewise.
    pub vit: vit_fmnist::Config,
}

/// The three studies of the series.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Study {
    /// The module-wise manifold assignments on the GPT.
    Manifolds,
    /// λ·I_k on the character GPT.
    Gpt,
    /// λ·I_k on the ViT.
    Vit,
}

impl Study {
    /// The label's first word.
    pub fn name(self) -> &'static str {
        match self {
            Study::Manifolds => "manifolds",
            Study::Gpt => "gpt",
            Study::Vit => "vit",
        }
    }
}

/// One trained model of a unit: a study's variant at a width.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Which study.
    pub study: Study,
    /// The width D.
    pub width: usize,
    /// The variant's index in its study's config.
    pub variant: usize,
    /// The variant's name there.
    pub name: String,
    /// Whether it runs on the first seed only.
    pub ablation: bool,
}

impl Point {
    /// The variant name in `metrics.jsonl`: `"<study> D=<width> <name>"`.
    pub fn label(&self) -> String {
        format!("{} D={} {}", self.study.name(), self.width, self.name)
    }
}

impl Config {
    /// Every point of a unit in training order — the manifold study width by width, then the
    /// GPT and the ViT at each conditioning width — first-seed ablations included. A point's
    /// position is its variant index in the run (its checkpoint folder).
    pub fn points(&self) -> Vec<Point> {
        let mut points = Vec::new();
        for &width in &self.manifold_widths {
            for (variant, v) in self.manifolds.variants.iter().enumerate() {
                points.push(Point {
                    study: Study::Manifolds,
                    width,
                    variant,
                    name: v.name.clone(),
                    ablation: v.ablation,
                });
            }
        }
        for &width in &self.conditioning_widths {
            for (study, variants) in [
                (Study::Gpt, &self.gpt.variants),
                (Study::Vit, &self.vit.variants),
            ] {
                for (variant, v) in variants.iter().enumerate() {
                    points.push(Point {
                        study,
                        width,
                        variant,
                        name: v.name.clone(),
                        ablation: false,
                    });
                }
            }
        }
        points
    }

    /// The manifold study's config at `width`.
    pub fn manifolds_at(&self, width: usize) -> manifolds::Config {
        let mut c = self.manifolds.clone();
        c.model.n_embd = width;
        c.model.n_head = width / self.head_dim;
        c
    }

    /// The GPT's config at `width`.
    pub fn gpt_at(&self, width: usize) -> gpt_sotu::Config {
        let mut c = self.gpt.clone();
        c.model.n_embd = width;
        c.model.n_head = width / self.head_dim;
        c
    }

    /// The ViT's config at `width`.
    pub fn vit_at(&self, width: usize) -> vit_fmnist::Config {
        let mut c = self.vit.clone();
        c.model.n_embd = width;
        c.model.n_head = width / self.head_dim;
        c
    }
}

/// Checks a width list: ascending, each a positive multiple of `head_dim`.
fn check_widths(key: &str, widths: &[usize], head_dim: usize) -> Result<()> {
    for (i, &w) in widths.iter().enumerate() {
        anyhow::ensure!(
            w > 0 && w % head_dim == 0,
            "{key}.{i}: a width must be a positive multiple of head_dim = {head_dim}, found {w}"
        );
        anyhow::ensure!(
            i == 0 || w > widths[i - 1],
            "{key}: widths must ascend, found {w} after {}",
            widths[i - 1]
        );
    }
    Ok(())
}

impl Experiment for Scaling {
    type Config = Config;

    fn name(&self) -> &'static str {
        "scaling"
    }

    fn claim(&self) -> &'static str {
        "Which way the headline claims move as the model widens: the manifold paper's order \
         HETERO < ALL-STIEFEL < UNCONSTRAINED, DGram attention's divergence through logit \
         growth, and the accuracy gain of λ·I_k."
    }

    fn data_needs(&self) -> &'static [&'static str] {
        &["sotu", "fashion-mnist"]
    }

    fn continues_interrupted_runs(&self) -> bool {
        true
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn validate(&self, c: &Config) -> Result<()> {
        anyhow::ensure!(
            c.head_dim >= 1,
            "head_dim: must be ≥ 1, found {}",
            c.head_dim
        );
        check_widths("manifold_widths", &c.manifold_widths, c.head_dim)?;
        check_widths("conditioning_widths", &c.conditioning_widths, c.head_dim)?;
        anyhow::ensure!(
            !c.manifold_widths.is_empty() || !c.conditioning_widths.is_empty(),
            "manifold_widths, conditioning_widths: both empty, nothing to run"
        );
        for &w in &c.manifold_widths {
            manifolds::Manifolds
                .validate(&c.manifolds_at(w))
                .with_context(|| format!("manifolds at D = {w}"))?;
        }
        for &w in &c.conditioning_widths {
            gpt_sotu::GptSotu
                .validate(&c.gpt_at(w))
                .with_context(|| format!("gpt at D = {w}"))?;
            vit_fmnist::VitFmnist
                .validate(&c.vit_at(w))
                .with_context(|| format!("vit at D = {w}"))?;
        }
        Ok(())
    }

    fn run(&self, config: &Config, run: &mut Run) -> Result<RunStatus> {
        let first_seed = run.context().seed == 0;
        let threads = run.context().threads;
        for (index, point) in config.points().into_iter().enumerate() {
            if point.ablation && !first_seed {
                continue;
            }
            let label = point.label();
            let trained = match point.study {
                Study::Manifolds => {
                    let c = config.manifolds_at(point.width);
                    if c.libtorch_threads > 0 {
                        run.pin_threads(c.libtorch_threads);
                    }
                    let mut v = c.variants[point.variant].clone();
                    v.name = label.clone();
                    let trained = manifolds::train_variant(run, &c, index, &v);
                    run.pin_threads(threads);
                    trained
                }
                Study::Gpt => {
                    let c = config.gpt_at(point.width);
                    let mut v = c.variants[point.variant].clone();
                    v.name = label.clone();
                    gpt_sotu::train_variant(run, &c, index, &v)
                }
                Study::Vit => {
                    let c = config.vit_at(point.width);
                    let mut v = c.variants[point.variant].clone();
                    v.name = label.clone();
                    vit_fmnist::train_variant(run, &c, index, &v)
                }
            };
            trained.with_context(|| label)?;
        }
        Ok(RunStatus::Completed)
    }

    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        report::report(self, runs, out_dir, report_dir)
    }
}

/// `"32 (2 heads), 64 (4 heads)"`.
fn widths_text(widths: &[usize], head_dim: usize) -> String {
    widths
        .iter()
        .map(|w| format!("{w} ({} heads)", w / head_dim))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the manifold study trained.
fn setup_manifolds(c: &Config) -> String {
    let m = &c.manifolds;
    let first = m.variants.first().map(|v| &v.modulewise);
    let muon_lr = first.map_or(f64::NAN, |v| v.muon_lr);
    format!(
        "**Manifold study.** The `manifolds` GPT ({} layers, context {}, {:?} tokens of the \
         SOTU text) at widths D = {}: the head dimension k = {} is fixed and heads grow with D, \
         as from GPT-2 small to large, so the logit bound's width factor D/√k doubles with D. \
         Every width trains {} steps of {} sequences with the same Muon / manifold-Muon peak lr \
         {muon_lr} (warmup {} {}), an accumulated spectral step Σηₜ = {:.1} (the paper's \
         DGram-attention runs diverged at Σηₜ ≈ 290 and 350): with Muon's spectral-norm step \
         the lr needs no width rule, which the lr table below checks. Divergence: the smoothed \
         training loss above {} × its best.",
        m.model.n_layer,
        m.model.block_size,
        m.tokenizer,
        widths_text(&c.manifold_widths, c.head_dim),
        c.head_dim,
        m.train.steps,
        m.train.batch_size,
        m.train.warmup_steps,
        manifolds::after_warmup(&m.train),
        manifolds::spectral_step(&m.train, muon_lr, m.train.steps),
        m.train.divergence_factor,
    )
}

/// What the conditioning study trained.
fn setup_conditioning(c: &Config) -> String {
    let names = |vs: &[crate::correction_study::Variant]| {
        vs.iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "**Conditioning study.** At widths D = {} (k = {}): the `gpt-sotu` character GPT ({} \
         layers, context {}, {} steps of {} sequences; variants {}) and the `vit-fmnist` ViT \
         ({} layers, {} steps of {} images; variants {}), each trained with AdamW as in its own \
         experiment.",
        widths_text(&c.conditioning_widths, c.head_dim),
        c.head_dim,
        c.gpt.model.n_layer,
        c.gpt.model.block_size,
        c.gpt.train.steps,
        c.gpt.train.batch_size,
        names(&c.gpt.variants),
        c.vit.model.n_layer,
        c.vit.train.steps,
        c.vit.train.batch_size,
        names(&c.vit.variants),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::Scale;

    fn smoke() -> Config {
        Scaling.config(Scale::Smoke).unwrap()
    }

    #[test]
    fn points_run_the_manifold_widths_then_both_models_per_conditioning_width() {
        let c = smoke();
        let points = c.points();
        let (m, g, v) = (
            c.manifolds.variants.len(),
            c.gpt.variants.len(),
            c.vit.variants.len(),
        );
        assert_eq!(
            points.len(),
            c.manifold_widths.len() * m + c.conditioning_widths.len() * (g + v)
        );
        assert_eq!(
            points[0].label(),
            format!("manifolds D={} UNCONSTRAINED", c.manifold_widths[0])
        );
        let first_gpt = c.manifold_widths.len() * m;
        assert_eq!(points[first_gpt].study, Study::Gpt);
        assert_eq!(points[first_gpt + g].study, Study::Vit);
        // Labels are unique: they key the metrics.
        let mut labels: Vec<String> = points.iter().map(Point::label).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), points.len());
    }

    #[test]
    fn a_width_sets_the_model_width_and_heads() {
        let c = smoke();
        let m = c.manifolds_at(32);
        assert_eq!((m.model.n_embd, m.model.n_head), (32, 32 / c.head_dim));
        assert_eq!(c.vit_at(16).model.n_head, 16 / c.head_dim);
    }

    #[test]
    fn widths_must_ascend_and_divide_by_the_head_dimension() {
        let mut c = smoke();
        c.manifold_widths = vec![8, 6];
        let err = format!("{:#}", Scaling.validate(&c).unwrap_err());
        assert!(
            err.contains("manifold_widths.1: a width must be a positive multiple of head_dim = 4"),
            "{err}"
        );
        c.manifold_widths = vec![16, 8];
        let err = format!("{:#}", Scaling.validate(&c).unwrap_err());
        assert!(
            err.contains("manifold_widths: widths must ascend, found 8 after 16"),
            "{err}"
        );
        c.manifold_widths = vec![];
        c.conditioning_widths = vec![];
        assert!(Scaling.validate(&c).is_err());
    }
}
