//! What `vit-fmnist`, `gpt-sotu` and `bert-sentiment` share: a variant (a name and a spectral
//! correction), its training through [`kappa_train::train_variant`] with AdamW groups, and the
//! report (tables over seeds — κ and σ_min of the effective W_Q, W_K, W_V among them —, plots
//! of κ(W_Q), σ_min(W_Q), attention entropy and κ(J) over training, and a verdict per claim
//! computed from the data). An experiment that trains each variant in stages (pretraining,
//! then fine-tuning) reports each stage on its own ([`Stage`]).

use std::path::Path;

use anyhow::Result;
use kappa_models::{summarize, CorrectionConfig, HeadDiagnostics};
use kappa_train::{
    adamw_groups, train_variant, MetricsLine, Outcome, Record, Run, RunRecord, Task, TrainConfig,
    VariantId, VariantResult,
};
use serde::{Deserialize, Serialize};
use tch::nn;

use crate::plot::{LinePlot, Mark};
use crate::report::cells::{fixed, mean_std_or, sci, MISSING};
use crate::report::variants::read_variants;
use crate::report::verdict::{held, versus};
use crate::report::{Figures, Section};
use crate::stats::{mean, mean_std, median, per_step};

/// One model variant: a name (a label in tables) and its correction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// Table label.
    pub name: String,
    /// The correction.
    #[serde(alias = "conditioning")]
    pub correction: CorrectionConfig,
}

/// Trains variant `index` of a run with kappa-train's AdamW groups ([`adamw_groups`]): see
/// [`train_variant`] for resume and what is logged.
pub fn train_corrected<T: Task>(
    run: &mut Run,
    index: usize,
    variant: &Variant,
    train: &TrainConfig,
    build: impl FnOnce(&nn::VarStore) -> Result<T>,
    metric: impl FnOnce(&mut T) -> Result<f64>,
) -> Result<Outcome> {
    let id = VariantId {
        index,
        name: &variant.name,
    };
    let groups = |vs: &nn::VarStore| Ok(adamw_groups(vs, train)?);
    train_variant(run, id, train, build, groups, metric)
}

/// Mean seconds per step over the summaries that timed any step (a variant resumed at its last
/// step timed none).
fn mean_step_seconds(finals: &[VariantResult]) -> f64 {
    let timed: Vec<f64> = finals
        .iter()
        .map(|f| f.seconds_per_step)
        .filter(|&s| s > 0.0)
        .collect();
    timed.iter().sum::<f64>() / timed.len().max(1) as f64
}

/// How the shared report names and orders the headline metric.
pub struct ReportSpec {
    /// Column title of the headline metric.
    pub metric: &'static str,
    /// Multiplier for display (100 for a fraction shown in %).
    pub scale: f64,
    /// Whether larger is better (accuracy) or smaller (loss).
    pub higher_is_better: bool,
    /// The paper's numbers, labelled as such (empty: none).
    pub paper: &'static str,
    /// Report only the variants of one stage (`None`: every variant).
    pub stage: Option<Stage>,
}

/// One stage of variants trained in stages: the variants logged as `<name><suffix>`, shown as
/// `<name>`, with plots saved as `<files><plot>.png`.
#[derive(Clone, Copy, Debug)]
pub struct Stage {
    /// The suffix of the stage's variant names (` · MLM`).
    pub suffix: &'static str,
    /// The prefix of the stage's plot files (`mlm-`).
    pub files: &'static str,
}

impl Stage {
    /// The logged name of variant `name` in this stage.
    pub fn name(&self, name: &str) -> String {
        format!("{name}{}", self.suffix)
    }
}

/// The diagnostics of one evaluation, averaged over layers and heads ([`summarize`]).
#[derive(Clone, Copy, Debug)]
struct Diagnostics {
    kappa_wq: f64,
    sigma_min_wq: f64,
    /// Mean κ and σ_min of the effective W_K^h and W_V^h.
    kappa_wk: f64,
    sigma_min_wk: f64,
    kappa_wv: f64,
    sigma_min_wv: f64,
    entropy: f64,
    jacobian_kappa: f64,
    saturated: f64,
    /// The entropy of uniform attention, for comparison.
    uniform_entropy: f64,
}

impl Diagnostics {
    fn of(heads: &[HeadDiagnostics]) -> Self {
        let s = summarize(heads);
        let mean = |f: fn(&HeadDiagnostics) -> f64| {
            heads.iter().map(f).sum::<f64>() / heads.len().max(1) as f64
        };
        Self {
            kappa_wq: s.kappa_wq,
            sigma_min_wq: s.sigma_min_wq,
            kappa_wk: mean(|h| h.wk.kappa),
            sigma_min_wk: mean(|h| h.wk.sigma_min),
            kappa_wv: mean(|h| h.wv.kappa),
            sigma_min_wv: mean(|h| h.wv.sigma_min),
            entropy: s.entropy,
            jacobian_kappa: s.jacobian_kappa,
            saturated: s.saturated_fraction,
            uniform_entropy: heads.iter().map(|h| h.uniform_entropy).sum::<f64>()
                / heads.len() as f64,
        }
    }
}

/// What one variant logged in one run.
#[derive(Default)]
struct VariantRun {
    finals: Vec<VariantResult>,
    /// (step, diagnostics) of every evaluation.
    curve: Vec<(u64, Diagnostics)>,
}

impl VariantRun {
    fn add(&mut self, line: MetricsLine) {
        if let Some(f) = line.summary {
            self.finals.push(f);
        }
        if let Some(Record::Eval { step, heads, .. }) = line.record {
            if !heads.is_empty() {
                self.curve.push((step, Diagnostics::of(&heads)));
            }
        }
    }
}

/// One variant over every seed.
struct VariantData {
    name: String,
    finals: Vec<VariantResult>,
    /// Every seed's (step, diagnostics), run by run.
    curve: Vec<(u64, Diagnostics)>,
    /// Each seed's last evaluation.
    last: Vec<Diagnostics>,
}

impl VariantData {
    fn new(name: String, runs: Vec<VariantRun>) -> Self {
        let mut data = Self {
            name,
            finals: Vec::new(),
            curve: Vec::new(),
            last: Vec::new(),
        };
        for run in runs {
            data.last.extend(run.curve.last().map(|(_, d)| *d));
            data.finals.extend(run.finals);
            data.curve.extend(run.curve);
        }
        data
    }

    /// The headline metric of every completed seed.
    fn completed_metrics(&self) -> Vec<f64> {
        self.finals
            .iter()
            .filter(|f| f.outcome == Outcome::Completed)
            .map(|f| f.metric)
            .collect()
    }

    fn last(&self, value: fn(&Diagnostics) -> f64) -> Vec<f64> {
        self.last.iter().map(value).collect()
    }

    /// Mean and std over seeds of a diagnostic at the last evaluation.
    fn last_mean_std(&self, value: fn(&Diagnostics) -> f64) -> (f64, f64) {
        mean_std(&self.last(value))
    }

    /// Mean over seeds of a diagnostic at the last evaluation.
    fn last_mean(&self, value: fn(&Diagnostics) -> f64) -> f64 {
        mean(&self.last(value))
    }

    /// Median over seeds of κ(J) at the last evaluation.
    fn last_kappa_j(&self) -> f64 {
        median(&self.last(|d| d.jacobian_kappa))
    }
}

/// Every variant's data over the runs that did not fail, in the configured order; with a
/// stage, that stage's variants only, under their names without the stage's suffix.
fn read_data(runs: &[RunRecord], stage: Option<Stage>) -> Result<Vec<VariantData>> {
    let mut variants = read_variants(runs, VariantRun::add)?;
    Ok(variants
        .order
        .into_iter()
        .filter_map(|name| {
            let shown = match stage {
                Some(s) => name.strip_suffix(s.suffix)?.to_string(),
                None => name.clone(),
            };
            let runs = variants.runs.remove(&name).unwrap_or_default();
            Some(VariantData::new(shown, runs))
        })
        .collect())
}

/// The tables, plots and verdicts shared by `vit-fmnist` and `gpt-sotu`.
pub fn correction_report(
    section: &mut Section,
    runs: &[RunRecord],
    out_dir: &Path,
    report_dir: &Path,
    spec: &ReportSpec,
) -> Result<()> {
    let data = read_data(runs, spec.stage)?;
    if data.is_empty() {
        section.paragraph("No completed runs to report.");
        return Ok(());
    }
    final_table(section, &data, spec);
    projection_table(section, &data);
    let files = spec.stage.map_or("", |s| s.files);
    plots(section, &data, &Figures::new(out_dir, report_dir), files)?;
    verdict_table(section, &data, spec);
    collapse(section, &data);
    Ok(())
}

/// Final values per variant, beside the paper's numbers.
fn final_table(section: &mut Section, data: &[VariantData], spec: &ReportSpec) {
    let base_step = mean_step_seconds(&data[0].finals);
    let scaled = |(m, s): (f64, f64), scale: f64| mean_std_or((m * scale, s * scale), 2, MISSING);
    let rows: Vec<Vec<String>> = data
        .iter()
        .map(|d| {
            let completed = d.completed_metrics();
            let diverged = d
                .finals
                .iter()
                .filter(|f| matches!(f.outcome, Outcome::Diverged { .. }))
                .count();
            let step = mean_step_seconds(&d.finals);
            vec![
                d.name.clone(),
                format!("{}/{}", completed.len(), d.finals.len()),
                diverged.to_string(),
                scaled(mean_std(&completed), spec.scale),
                scaled(d.last_mean_std(|d| d.kappa_wq), 1.0),
                scaled(d.last_mean_std(|d| d.sigma_min_wq), 1.0),
                sci(d.last_kappa_j(), 3),
                format!(
                    "{:.3} / {:.3}",
                    d.last_mean(|d| d.entropy),
                    d.last_mean(|d| d.uniform_entropy)
                ),
                format!("{:.1}%", 100.0 * d.last_mean(|d| d.saturated)),
                format!(
                    "{:.1} ({:+.1}%)",
                    1e3 * step,
                    100.0 * (step / base_step - 1.0)
                ),
            ]
        })
        .collect();
    section.paragraph(
        "Final values per variant, mean ± sample std over seeds (diagnostics: mean \
                       over layers and heads at the last evaluation; κ(J): median over seeds of \
                       the per-run median over heads of the exact weight-Jacobian κ).",
    );
    section.table(
        &[
            "variant",
            "completed",
            "diverged",
            spec.metric,
            "κ(W_Q)",
            "σ_min(W_Q)",
            "κ(J)",
            "entropy / uniform",
            "saturated rows",
            "ms/step (vs baseline)",
        ],
        &rows,
    );
    if !spec.paper.is_empty() {
        section.paragraph(spec.paper);
    }
}

/// κ and σ_min of the effective W_Q, W_K and W_V at the last evaluation, per variant.
fn projection_table(section: &mut Section, data: &[VariantData]) {
    type Value = fn(&Diagnostics) -> f64;
    let columns: [Value; 6] = [
        |d| d.kappa_wq,
        |d| d.sigma_min_wq,
        |d| d.kappa_wk,
        |d| d.sigma_min_wk,
        |d| d.kappa_wv,
        |d| d.sigma_min_wv,
    ];
    let rows: Vec<Vec<String>> = data
        .iter()
        .map(|d| {
            let mut row = vec![d.name.clone()];
            row.extend(
                columns
                    .iter()
                    .map(|&c| mean_std_or(d.last_mean_std(c), 3, MISSING)),
            );
            row
        })
        .collect();
    section.paragraph(
        "The effective projections W + C at the last evaluation, mean over layers and heads, \
         mean ± std over seeds.",
    );
    section.table(
        &[
            "variant",
            "κ(W_Q)",
            "σ_min(W_Q)",
            "κ(W_K)",
            "σ_min(W_K)",
            "κ(W_V)",
            "σ_min(W_V)",
        ],
        &rows,
    );
}

/// A diagnostic plotted over training: file stem, title, log axis, value.
type Diagnostic = (&'static str, &'static str, bool, fn(&Diagnostics) -> f64);

/// The diagnostics over training, median over seeds per step, one line per variant.
fn plots(
    section: &mut Section,
    data: &[VariantData],
    figures: &Figures<'_>,
    files: &str,
) -> Result<()> {
    let diagnostics: [Diagnostic; 4] = [
        ("kappa_wq", "κ(W_Q), mean over heads", true, |d| d.kappa_wq),
        ("sigma_min_wq", "σ_min(W_Q), mean over heads", true, |d| {
            d.sigma_min_wq
        }),
        (
            "entropy",
            "attention entropy (nats), mean over heads",
            false,
            |d| d.entropy,
        ),
        (
            "kappa_j",
            "κ(J) of the attention weight Jacobian, median over heads",
            true,
            |d| d.jacobian_kappa,
        ),
    ];
    for (file, title, log, value) in diagnostics {
        let mut plot = LinePlot::new(title, "step", title.split(',').next().unwrap_or(title));
        if log {
            plot = plot.log_y();
        }
        let mut any = false;
        for d in data {
            let pts: Vec<(f64, f64)> =
                per_step(d.curve.iter().map(|(s, x)| (*s, value(x))), median)
                    .into_iter()
                    .filter(|(_, y)| y.is_finite() && (!log || *y > 0.0))
                    .collect();
            if !pts.is_empty() {
                any = true;
                plot = plot.series(&d.name, pts, Mark::Line);
            }
        }
        if any {
            figures.add(section, title, &plot, &format!("{files}{file}.png"))?;
        }
    }
    Ok(())
}

/// Verdicts per claim, each conditioned variant against the baseline (the first variant).
fn verdict_table(section: &mut Section, data: &[VariantData], spec: &ReportSpec) {
    let base = &data[0];
    let rows: Vec<Vec<String>> = data[1..]
        .iter()
        .map(|d| verdict_row(d, base, spec))
        .collect();
    section.paragraph(
        "Verdicts at this scale, each conditioned variant against the baseline \
                       (final evaluation, means over seeds; \"within noise\" when the difference \
                       of means is below the root sum of squares of the two standard deviations).",
    );
    section.table(
        &[
            "variant",
            "higher σ_min(W_Q)",
            "lower κ(W_Q)",
            "lower κ(J)",
            &format!("better {}", spec.metric),
        ],
        &rows,
    );
}

/// One variant's verdicts against the baseline.
fn verdict_row(d: &VariantData, base: &VariantData, spec: &ReportSpec) -> Vec<String> {
    let sigma = (
        d.last_mean(|d| d.sigma_min_wq),
        base.last_mean(|d| d.sigma_min_wq),
    );
    let kappa = (d.last_mean(|d| d.kappa_wq), base.last_mean(|d| d.kappa_wq));
    let (j, bj) = (d.last_kappa_j(), base.last_kappa_j());
    vec![
        d.name.clone(),
        versus(sigma.0 > sigma.1, fixed(sigma.0, 4), fixed(sigma.1, 4)),
        versus(kappa.0 < kappa.1, fixed(kappa.0, 3), fixed(kappa.1, 3)),
        if j.is_nan() || bj.is_nan() {
            "not measured".into()
        } else {
            versus(j < bj, sci(j, 3), sci(bj, 3))
        },
        metric_verdict(
            mean_std(&d.completed_metrics()),
            mean_std(&base.completed_metrics()),
            spec,
        ),
    ]
}

/// Whether the headline metric improved on the baseline's, and whether by more than the noise.
fn metric_verdict((mm, ms): (f64, f64), (bm, bs): (f64, f64), spec: &ReportSpec) -> String {
    if mm.is_nan() || bm.is_nan() {
        return "no completed runs".into();
    }
    let better = if spec.higher_is_better {
        mm > bm
    } else {
        mm < bm
    };
    let margin = (mm - bm).abs() > (bs.powi(2) + ms.powi(2)).sqrt();
    format!(
        "{}{} ({:.2} vs {:.2}, Δ = {:+.2})",
        held(better),
        if margin { "" } else { ", within noise" },
        mm * spec.scale,
        bm * spec.scale,
        (mm - bm) * spec.scale
    )
}

/// Collapse of attention onto the diagonal (docs/models.md, "Why a large λ collapses
/// attention"): the variants where most attention rows saturated.
fn collapse(section: &mut Section, data: &[VariantData]) {
    let collapsed: Vec<String> = data
        .iter()
        .filter_map(|d| {
            let sat = d.last_mean(|d| d.saturated);
            let h = d.last_mean(|d| d.entropy);
            let u = d.last_mean(|d| d.uniform_entropy);
            (sat > 0.5).then(|| {
                format!(
                    "{}: {:.1}% of attention rows put more than 0.99 of their mass on one \
                     token (entropy {h:.3} against {u:.3} for uniform attention)",
                    d.name,
                    100.0 * sat
                )
            })
        })
        .collect();
    section.paragraph(&if collapsed.is_empty() {
        "No variant collapsed attention (fewer than half of the rows saturated in every variant)."
            .to_string()
    } else {
        format!(
            "Attention collapse (a large λ makes λ²X_kX_kᵀ dominate the scores, so \
             each token attends to itself): {}.",
            collapsed.join("; ")
        )
    });
}
