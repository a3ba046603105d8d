//! The `lambda-readings` report: per model, the final metric and the attention's mean diagonal
//! for every reading × λ, a verdict per reading (does the paper's λ collapse attention? which λ
//! is best, and does it beat its baseline beyond the noise?), and one computed answer over the
//! models: the readings that survive the paper's λ and what to set.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use kappa_models::HeadDiagnostics;
use kappa_train::{MetricsLine, Outcome, Record};

use super::{cell_name, Config, Reading};
use crate::report::cells::{fixed, over_seeds, MISSING};
use crate::report::variants::read_variants;
use crate::report::Section;
use crate::run::RunRecord;
use crate::stats::{mean, mean_std};

/// The attention of one evaluation, averaged over layers, heads and sampled rows.
#[derive(Clone, Copy, Debug, Default)]
pub struct Attention {
    /// Mean diagonal P[i,i].
    pub diagonal: f64,
    /// Fraction of rows with more than 0.99 of their mass on one token.
    pub saturated: f64,
    /// Entropy over the entropy of uniform attention.
    pub entropy_ratio: f64,
    /// The λ the layers computed with (mean; NaN without a shift).
    pub lambda: f64,
}

impl Attention {
    fn of(heads: &[HeadDiagnostics]) -> Self {
        let avg = |f: &dyn Fn(&HeadDiagnostics) -> f64| {
            heads.iter().map(f).sum::<f64>() / heads.len().max(1) as f64
        };
        Self {
            diagonal: avg(&|h| h.mean_diagonal),
            saturated: avg(&|h| h.saturated_fraction),
            entropy_ratio: avg(&|h| h.entropy / h.uniform_entropy),
            lambda: avg(&|h| h.lambda.unwrap_or(f64::NAN)),
        }
    }
}

/// What one cell logged in one run: its final metric (if completed) and its first and last
/// evaluations' attention.
#[derive(Default)]
struct CellRun {
    metric: Option<f64>,
    first: Option<Attention>,
    last: Option<Attention>,
}

impl CellRun {
    fn add(&mut self, line: MetricsLine) {
        if let Some(f) = line.summary {
            self.metric = (f.outcome == Outcome::Completed).then_some(f.metric);
        }
        if let Some(Record::Eval { heads, .. }) = line.record {
            if !heads.is_empty() {
                let a = Attention::of(&heads);
                self.first.get_or_insert(a);
                self.last = Some(a);
            }
        }
    }
}

/// One cell over seeds.
#[derive(Clone, Default)]
pub struct CellData {
    /// Completed seeds' final metrics.
    pub metrics: Vec<f64>,
    /// Each seed's first evaluation (initialization, with `eval_at_start`).
    pub first: Vec<Attention>,
    /// Each seed's last evaluation.
    pub last: Vec<Attention>,
}

impl CellData {
    fn new(runs: Vec<CellRun>) -> Self {
        let mut d = Self::default();
        for r in runs {
            d.metrics.extend(r.metric);
            d.first.extend(r.first);
            d.last.extend(r.last);
        }
        d
    }

    fn last_mean(&self, f: fn(&Attention) -> f64) -> f64 {
        mean(&self.last.iter().map(f).collect::<Vec<_>>())
    }

    fn first_mean(&self, f: fn(&Attention) -> f64) -> f64 {
        mean(&self.first.iter().map(f).collect::<Vec<_>>())
    }

    /// Whether the cell's attention collapsed into a hard one-token lookup at its last
    /// evaluation: at least `threshold` of the rows saturated.
    pub fn collapsed(&self, threshold: f64) -> Option<bool> {
        let s = self.last_mean(|a| a.saturated);
        (!s.is_nan()).then_some(s >= threshold)
    }
}

/// Writes the report: one part per model, then the answer over models.
pub fn write(
    section: &mut Section,
    runs: &[RunRecord],
    _out_dir: &Path,
    _report_dir: &Path,
) -> Result<()> {
    let Some(config) = runs.first().map(|r| r.config::<Config>()).transpose()? else {
        section.paragraph("No completed runs to report.");
        return Ok(());
    };
    // Several readings share a baseline (one per score scale): cells are looked up, not taken.
    let cells: BTreeMap<String, CellData> = read_variants(runs, CellRun::add)?
        .runs
        .into_iter()
        .map(|(name, runs)| (name, CellData::new(runs)))
        .collect();
    let cell = |name: &str| cells.get(name).cloned().unwrap_or_default();
    let paper = config.paper_lambda;
    section.paragraph(&format!(
        "Every reading is trained at λ ∈ {:?} beside the baseline of its score scale (λ = 0). \
         A cell **collapsed** when at least {:.0}% of its attention rows put more than 0.99 of \
         their mass on one token at its last evaluation (over layers, heads and sampled rows, \
         then seeds): attention is then a hard lookup — of the token itself (the identity) when \
         the mean diagonal P[i,i] is near 1, else of a token whose shifted columns are longer \
         (⟨x_i, x_j⟩ exceeds ‖x_i‖² when ‖x_j‖ > ‖x_i‖ on those columns). Means ± sample std \
         over {} seed(s).",
        config.lambdas,
        100.0 * config.collapse_saturated,
        runs.len()
    ));
    let mut answers = Vec::new();
    for spec in &config.models {
        let model = spec.name();
        let grid: Vec<(Reading, CellData, Vec<CellData>)> = config
            .readings
            .iter()
            .map(|r| {
                let base = cell(&cell_name(model, r, 0.0));
                let cells = config
                    .lambdas
                    .iter()
                    .map(|&l| cell(&cell_name(model, r, l)))
                    .collect();
                (r.clone(), base, cells)
            })
            .collect();
        model_part(section, &config, model, spec.metric(), &grid);
        answers.push(Answer::of(&config, model, &grid, paper));
    }
    answer(section, &config, &answers);
    Ok(())
}

fn lambda_headers(config: &Config) -> Vec<String> {
    let mut h = vec!["reading".to_string(), "λ = 0".to_string()];
    h.extend(config.lambdas.iter().map(|l| format!("λ = {l}")));
    h
}

/// The two tables and the per-reading verdicts of one model.
fn model_part(
    section: &mut Section,
    config: &Config,
    model: &str,
    metric: &str,
    grid: &[(Reading, CellData, Vec<CellData>)],
) {
    let headers = lambda_headers(config);
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    section.paragraph(&format!("**{model}**: final {metric} (%)."));
    let rows: Vec<Vec<String>> = grid
        .iter()
        .map(|(r, base, cells)| {
            let mut row = vec![r.name.clone(), percent(&base.metrics)];
            row.extend(cells.iter().map(|c| percent(&c.metrics)));
            row
        })
        .collect();
    section.table(&headers, &rows);
    section.paragraph(&format!(
        "**{model}**: mean diagonal attention P[i,i] at initialization → after training (after \
         training: rows saturated, entropy over the uniform attention's; **collapsed** at ≥ \
         {:.0}% saturated rows).",
        100.0 * config.collapse_saturated
    ));
    let rows: Vec<Vec<String>> = grid
        .iter()
        .map(|(r, base, cells)| {
            let mut row = vec![r.name.clone(), attention_cell(base, config)];
            row.extend(cells.iter().map(|c| attention_cell(c, config)));
            row
        })
        .collect();
    section.table(&headers, &rows);
}

fn percent(values: &[f64]) -> String {
    over_seeds(&values.iter().map(|v| 100.0 * v).collect::<Vec<_>>(), 1)
}

fn attention_cell(c: &CellData, config: &Config) -> String {
    if c.last.is_empty() {
        return MISSING.into();
    }
    let (first, last) = (c.first_mean(|a| a.diagonal), c.last_mean(|a| a.diagonal));
    let sat = 100.0 * c.last_mean(|a| a.saturated);
    let entropy = c.last_mean(|a| a.entropy_ratio);
    let mark = if c.collapsed(config.collapse_saturated) == Some(true) {
        " **collapsed**"
    } else {
        ""
    };
    format!("{first:.2} → {last:.2} ({sat:.0}%, H/H_u {entropy:.2}){mark}")
}

/// What one model says about each reading.
struct Answer {
    model: String,
    /// Per reading: (name, collapsed at the paper's λ, best λ and its Δ over the baseline
    /// with whether Δ exceeds the noise).
    readings: Vec<ReadingAnswer>,
}

struct ReadingAnswer {
    name: String,
    /// The λ the layers computed with at the paper's λ, at initialization (mean over seeds).
    lambda_used: f64,
    collapsed_at_paper: Option<bool>,
    /// Δ of the metric at the paper's λ over the baseline, and whether it exceeds the noise.
    paper_gain: Option<(f64, bool)>,
    /// The best λ by mean metric, its Δ over the baseline and whether that exceeds the noise.
    best: Option<(f64, f64, bool)>,
}

/// Δ = mean(a) − mean(b) and whether |Δ| exceeds the root sum of squares of the two sample
/// stds (the rule of the other conditioning reports). With fewer than two seeds on a side
/// there is no noise estimate, and no Δ counts as beyond it.
fn gain(a: &[f64], b: &[f64]) -> Option<(f64, bool)> {
    let ((ma, sa), (mb, sb)) = (mean_std(a), mean_std(b));
    if ma.is_nan() || mb.is_nan() {
        return None;
    }
    let noise = (sa.powi(2) + sb.powi(2)).sqrt();
    let measured = a.len() >= 2 && b.len() >= 2 && !noise.is_nan();
    Some((ma - mb, measured && (ma - mb).abs() > noise))
}

impl Answer {
    fn of(
        config: &Config,
        model: &str,
        grid: &[(Reading, CellData, Vec<CellData>)],
        paper: f64,
    ) -> Self {
        let at = config.lambdas.iter().position(|&l| l == paper);
        let readings = grid
            .iter()
            .map(|(r, base, cells)| {
                let paper_cell = at.map(|i| &cells[i]);
                let best = config
                    .lambdas
                    .iter()
                    .zip(cells)
                    .filter_map(|(&l, c)| gain(&c.metrics, &base.metrics).map(|g| (l, g.0, g.1)))
                    .max_by(|a, b| a.1.total_cmp(&b.1));
                ReadingAnswer {
                    name: r.name.clone(),
                    lambda_used: paper_cell.map_or(f64::NAN, |c| c.first_mean(|a| a.lambda)),
                    collapsed_at_paper: paper_cell
                        .and_then(|c| c.collapsed(config.collapse_saturated)),
                    paper_gain: paper_cell.and_then(|c| gain(&c.metrics, &base.metrics)),
                    best,
                }
            })
            .collect();
        Self {
            model: model.to_string(),
            readings,
        }
    }
}

/// The verdict table over models and the computed recommendation.
fn answer(section: &mut Section, config: &Config, answers: &[Answer]) {
    let paper = config.paper_lambda;
    let mut rows = Vec::new();
    for a in answers {
        for r in &a.readings {
            rows.push(vec![
                a.model.clone(),
                r.name.clone(),
                if r.lambda_used.is_nan() {
                    MISSING.into()
                } else {
                    format!("{:.3}", r.lambda_used)
                },
                match r.collapsed_at_paper {
                    Some(true) => "collapses".into(),
                    Some(false) => "does not collapse".into(),
                    None => MISSING.into(),
                },
                r.paper_gain
                    .map_or(MISSING.into(), |(d, beyond)| delta(d, beyond)),
                r.best.map_or(MISSING.into(), |(l, d, beyond)| {
                    format!("λ = {l}: {}", delta(d, beyond))
                }),
            ]);
        }
    }
    section.paragraph(
        "Verdicts per reading (Δ: the model's metric minus the baseline's, in points; \"beyond \
         noise\" when |Δ| exceeds the root sum of squares of the two stds).",
    );
    section.table(
        &[
            "model",
            "reading",
            "λ the layers used",
            &format!("λ = {paper}"),
            &format!("Δ at λ = {paper}"),
            "best λ (Δ)",
        ],
        &rows,
    );
    section.paragraph(&recommendation(config, answers));
}

fn delta(d: f64, beyond: bool) -> String {
    format!(
        "{:+.1}{}",
        100.0 * d,
        if beyond {
            " (beyond noise)"
        } else {
            " (within noise)"
        }
    )
}

/// The names of the readings for which `holds` is true in every model.
fn in_every_model<'a>(
    config: &'a Config,
    answers: &[Answer],
    holds: impl Fn(&ReadingAnswer) -> bool,
) -> Vec<&'a str> {
    config
        .readings
        .iter()
        .enumerate()
        .filter(|(i, _)| answers.iter().all(|a| holds(&a.readings[*i])))
        .map(|(_, r)| r.name.as_str())
        .collect()
}

/// The computed answer: which readings keep the paper's λ from collapsing in every model,
/// whether any gains beyond noise at it, and what to set.
fn recommendation(config: &Config, answers: &[Answer]) -> String {
    let paper = config.paper_lambda;
    let survivors = in_every_model(config, answers, |r| r.collapsed_at_paper == Some(false));
    let gaining = in_every_model(
        config,
        answers,
        |r| matches!(r.paper_gain, Some((d, true)) if d > 0.0),
    );
    let list = |v: &[&str]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join("; ")
        }
    };
    format!(
        "**Answer.** Readings under which λ = {paper} does not collapse attention in every \
         model: {}. Readings that gain on their baseline beyond noise at λ = {paper} in every \
         model (the paper's claim): {}. {}",
        list(&survivors),
        list(&gaining),
        advice(&survivors, &gaining, fixed(paper, 0))
    )
}

fn advice(survivors: &[&str], gaining: &[&str], paper: String) -> String {
    match (gaining.first(), survivors.first()) {
        (Some(r), _) => format!("Set: {r} (it reproduces a gain at λ = {paper})."),
        (None, Some(r)) => format!(
            "No reading reproduces the paper's gain here; if λ = {paper} must be used, {r} \
             keeps attention from collapsing."
        ),
        (None, None) => format!(
            "No reading keeps λ = {paper} from collapsing: use a small λ or the scale-aware \
             policy instead."
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gain_compares_means_against_the_root_sum_of_squares_of_the_stds() {
        let (d, beyond) = gain(&[0.5, 0.7], &[0.5, 0.5]).unwrap();
        assert!((d - 0.1).abs() < 1e-15 && !beyond);
        assert_eq!(gain(&[0.9, 0.9], &[0.5, 0.5]), Some((0.4, true)));
        assert_eq!(gain(&[], &[0.5]), None);
        // One seed on a side: no noise estimate, so no difference is beyond it.
        assert_eq!(gain(&[0.6], &[0.5, 0.5]).map(|g| g.1), Some(false));
    }

    #[test]
    fn a_cell_collapses_at_the_threshold_of_its_mean_last_saturation() {
        let at = |s| Attention {
            saturated: s,
            ..Attention::default()
        };
        let c = CellData {
            metrics: vec![],
            first: vec![at(0.1)],
            last: vec![at(0.75), at(0.25)],
        };
        assert_eq!(c.collapsed(0.5), Some(true));
        assert_eq!(c.collapsed(0.51), Some(false));
        assert_eq!(CellData::default().collapsed(0.5), None);
    }

    #[test]
    fn the_advice_follows_the_data() {
        assert!(advice(&["a"], &["b"], "10".into()).starts_with("Set: b"));
        assert!(advice(&["a"], &[], "10".into()).contains("a keeps"));
        assert!(advice(&[], &[], "10".into()).contains("No reading keeps"));
    }
}
