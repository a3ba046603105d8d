//! The `bert-sentiment` section: the accuracy table beside the paper's SST-2 row, the verdict
//! of each conditioned variant against the baseline (Welch's one-sided test, rule in
//! [`verdict`]), the pretraining loss curves, and the attention diagnostics of the pretrained
//! and the fine-tuned models ([`correction_report`] per stage).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use kappa_models::{CorrectionConfig, HeadLayout};
use kappa_train::{MetricsLine, Outcome, Record};

use super::{BertSentiment, Config, FINE_TUNING, PRETRAINING};
use crate::correction_study::{correction_report, ReportSpec, Stage};
use crate::plot::{LinePlot, Mark};
use crate::report::cells::{over_seeds, MISSING};
use crate::report::variants::read_variants;
use crate::report::{opened, Figures, Section};
use crate::run::RunRecord;
use crate::stats::{median, per_step, welch_less, TTest};
use crate::Experiment;

/// The paper's SST-2 accuracies (Crammed BERT, five seeds): baseline, with λ·I_k at λ = 10.
pub const PAPER_SST2: (f64, f64) = (92.3, 92.7);

/// What one stage of one variant logged in one run.
#[derive(Default)]
struct StageRun {
    /// The summary's metric when the stage completed.
    metric: Option<f64>,
    /// The last evaluation's accuracy.
    accuracy: Option<f64>,
    /// (step, training loss) and (step, held-out loss).
    train: Vec<(u64, f64)>,
    eval: Vec<(u64, f64)>,
}

impl StageRun {
    fn add(&mut self, line: MetricsLine) {
        match (line.record, line.summary) {
            (Some(Record::Train { step, loss, .. }), _) => self.train.push((step, loss)),
            (Some(Record::Eval { step, eval, .. }), _) => {
                self.eval.push((step, eval.loss));
                self.accuracy = eval.accuracy;
            }
            (_, Some(f)) if f.outcome == Outcome::Completed => self.metric = Some(f.metric),
            _ => {}
        }
    }
}

/// Logged variant name → one [`StageRun`] per run.
type Stages = BTreeMap<String, Vec<StageRun>>;

/// The values of `pick` over the runs of variant `name` in `stage` that have one.
fn values(
    stages: &Stages,
    stage: Stage,
    name: &str,
    pick: fn(&StageRun) -> Option<f64>,
) -> Vec<f64> {
    stages
        .get(&stage.name(name))
        .map(|runs| runs.iter().filter_map(pick).collect())
        .unwrap_or_default()
}

/// The section (module docs).
pub fn report(
    e: &BertSentiment,
    runs: &[RunRecord],
    out_dir: &Path,
    report_dir: &Path,
) -> Result<Section> {
    let mut section = opened(
        "bert-sentiment: crammed BERT, pretrained and fine-tuned on movie-review sentiment",
        e.claim(),
        runs,
    );
    let config: Option<Config> = runs.first().map(|r| r.config()).transpose()?;
    let Some(config) = config else {
        section.paragraph("No runs to report.");
        return Ok(section);
    };
    let stages = read_variants(runs, StageRun::add)?.runs;
    accuracy_table(&mut section, &config, &stages);
    verdict(&mut section, &config, &stages);
    loss_curves(
        &mut section,
        &config,
        &stages,
        &Figures::new(out_dir, report_dir),
    );
    for (stage, title, metric, scale, higher) in [
        (
            PRETRAINING,
            "Pretraining (masked LM)",
            "held-out masked-token loss (nats)",
            1.0,
            false,
        ),
        (
            FINE_TUNING,
            "Fine-tuning (movie reviews)",
            "test accuracy (%)",
            100.0,
            true,
        ),
    ] {
        section.paragraph(&format!(
            "**{title}: attention diagnostics** at the stage's evaluations (the fixed \
             diagnostic batch)."
        ));
        let spec = ReportSpec {
            metric,
            scale,
            higher_is_better: higher,
            paper: "",
            stage: Some(stage),
        };
        correction_report(&mut section, runs, out_dir, report_dir, &spec)?;
    }
    Ok(section)
}

/// The paper's SST-2 number for a variant: the baseline's for no conditioning, the
/// conditioned one for λ·I_k at λ = 10 in the fused reading (the paper's: absolute λ on the
/// LayerNorm's output); none otherwise.
fn paper_cell(correction: &CorrectionConfig) -> String {
    match *correction {
        CorrectionConfig::None => format!("{:.1}", PAPER_SST2.0),
        c if c == CorrectionConfig::identity(10.0, HeadLayout::Shifted) => {
            format!("{:.1}", PAPER_SST2.1)
        }
        _ => MISSING.into(),
    }
}

/// Per variant: the pretraining's held-out masked-token loss and accuracy, the fine-tuned
/// test accuracy over seeds, and the paper's SST-2 row.
fn accuracy_table(section: &mut Section, config: &Config, stages: &Stages) {
    let rows: Vec<Vec<String>> = config
        .variants
        .iter()
        .map(|v| {
            let pct = |x: Vec<f64>| x.into_iter().map(|a| 100.0 * a).collect::<Vec<_>>();
            let test = pct(values(stages, FINE_TUNING, &v.name, |r| r.metric));
            vec![
                v.name.clone(),
                over_seeds(&values(stages, PRETRAINING, &v.name, |r| r.metric), 3),
                over_seeds(
                    &pct(values(stages, PRETRAINING, &v.name, |r| r.accuracy)),
                    1,
                ),
                over_seeds(&test, 2),
                test.len().to_string(),
                paper_cell(&v.correction),
            ]
        })
        .collect();
    section.paragraph(
        "Test accuracy on the held-out movie-review sentences after pretraining and fine-tuning, \
         mean ± sample std over seeds, beside the paper's SST-2 row (Crammed BERT, five seeds; a \
         different model size, pretraining budget and data set: the comparison is of the \
         direction of the change, not of the level).",
    );
    section.table(
        &[
            "variant",
            "MLM held-out loss",
            "MLM held-out accuracy (%)",
            "test accuracy (%)",
            "seeds",
            "paper SST-2 (%)",
        ],
        &rows,
    );
}

/// The verdict of one conditioned variant against the baseline, from test accuracies:
/// **reproduced** when Welch's one-sided test finds the variant's mean above the baseline's
/// at level α; **not reproduced** when the same test finds it below; **inconclusive**
/// otherwise (no difference at α, or fewer than 2 seeds on a side).
pub fn verdict_of(variant: &[f64], baseline: &[f64], alpha: f64) -> (&'static str, Option<TTest>) {
    let better = welch_less(baseline, variant, 0.0);
    let worse = welch_less(variant, baseline, 0.0);
    match (better, worse) {
        (Some(t), _) if t.p < alpha => ("reproduced", Some(t)),
        (_, Some(t)) if t.p < alpha => ("not reproduced", Some(t)),
        (t, _) => ("inconclusive", t),
    }
}

/// The verdict paragraph and table (rule in [`verdict_of`]).
fn verdict(section: &mut Section, config: &Config, stages: &Stages) {
    let Some((base, rest)) = config.variants.split_first() else {
        return;
    };
    let acc = |name: &str| values(stages, FINE_TUNING, name, |r| r.metric);
    let b = acc(&base.name);
    let rows: Vec<Vec<String>> = rest
        .iter()
        .map(|v| {
            let a = acc(&v.name);
            let (word, test) = verdict_of(&a, &b, config.alpha);
            let delta = 100.0 * (crate::stats::mean(&a) - crate::stats::mean(&b));
            vec![
                v.name.clone(),
                format!("{delta:+.2}"),
                test.map_or(MISSING.into(), |t| format!("{:.2} ({:.1} df)", t.t, t.df)),
                test.map_or(MISSING.into(), |t| format!("{:.3}", t.p)),
                format!("**{word}**"),
            ]
        })
        .collect();
    section.paragraph(&format!(
        "Verdict per conditioned variant against `{}` (paper: Δ = {:+.1} points on SST-2). \
         Rule: Welch's one-sided t-test on the test accuracies over seeds — reproduced when the \
         variant's mean is above the baseline's at α = {}, not reproduced when it is below at \
         α, inconclusive otherwise (t and p of the test in the direction of the observed \
         difference).",
        base.name,
        PAPER_SST2.1 - PAPER_SST2.0,
        config.alpha
    ));
    section.table(
        &["variant", "Δ accuracy (points)", "t", "p", "verdict"],
        &rows,
    );
}

/// The pretraining's training and held-out masked-LM losses, median over seeds per step.
fn loss_curves(section: &mut Section, config: &Config, stages: &Stages, figures: &Figures<'_>) {
    let curve = |name: &str, pick: fn(&StageRun) -> &Vec<(u64, f64)>| {
        let runs = stages.get(&PRETRAINING.name(name));
        let points = runs
            .into_iter()
            .flatten()
            .flat_map(|r| pick(r).iter().copied());
        per_step(points, median)
    };
    let mut plot = LinePlot::new(
        "Masked-LM pretraining loss (median over seeds)",
        "step",
        "loss (nats per masked byte)",
    );
    for v in &config.variants {
        plot = plot
            .series(
                &format!("{} train", v.name),
                curve(&v.name, |r| &r.train),
                Mark::Line,
            )
            .series(
                &format!("{} held-out", v.name),
                curve(&v.name, |r| &r.eval),
                Mark::Points,
            );
    }
    figures.add_if_drawn(section, "masked-LM pretraining loss", &plot, "mlm-loss.png");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_follows_the_welch_test_in_either_direction() {
        let base = [0.70, 0.71, 0.69];
        assert_eq!(verdict_of(&[0.80, 0.81, 0.79], &base, 0.05).0, "reproduced");
        assert_eq!(
            verdict_of(&[0.60, 0.61, 0.59], &base, 0.05).0,
            "not reproduced"
        );
        assert_eq!(
            verdict_of(&[0.70, 0.72, 0.69], &base, 0.05).0,
            "inconclusive"
        );
        assert_eq!(verdict_of(&[0.9], &base, 0.05), ("inconclusive", None));
    }
}
