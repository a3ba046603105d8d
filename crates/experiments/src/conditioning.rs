//! What `vit-fmnist` and `gpt-sotu` share: a variant (a name and a spectral correction), the
//! their training through [`kappa_train::train_variant`] with AdamW groups,
//! and the report (tables over seeds, plots of κ(W_Q), σ_min(W_Q), attention entropy and κ(J)
//! over training, and a verdict per claim computed from the data).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use kappa_models::{summarize, Conditioning};
use kappa_train::{
    adamw_groups, train_variant, Final, Line, Outcome, Record, Run, RunRecord, RunStatus, Task,
    TrainConfig, VariantId,
};
use serde::{Deserialize, Serialize};
use tch::nn;

use crate::plot::{LinePlot, Mark};
use crate::report::Section;
use crate::stats::mean_std;

/// One model variant: a name (a label in tables) and its conditioning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// Table label.
    pub name: String,
    /// The correction.
    pub conditioning: Conditioning,
}

/// Trains variant `index` of a run with kappa-train's AdamW groups ([`adamw_groups`]): see
/// [`train_variant`] for resume and what is logged.
pub fn train_conditioned<T: Task>(
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
    let groups = |vs: &nn::VarStore| Ok(adamw_groups(vs, train));
    train_variant(run, id, train, build, groups, metric)
}

/// Mean seconds per step over the summaries that timed any step (a variant resumed at its last
/// step timed none).
fn mean_step_seconds(finals: &[Final]) -> f64 {
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
    /// The paper's numbers, labelled as such.
    pub paper: &'static str,
}

/// Per variant, per seed: the final summary and the diagnostic trajectory.
#[derive(Default)]
struct VariantData {
    finals: Vec<Final>,
    /// step → per-seed (κ(W_Q), σ_min(W_Q), entropy, κ(J), saturated).
    curves: BTreeMap<u64, Vec<[f64; 5]>>,
    /// The last eval of each seed: (κ(W_Q), σ_min(W_Q), entropy, κ(J), saturated, uniform H).
    last: Vec<[f64; 6]>,
}

fn fmt_ms((m, s): (f64, f64), scale: f64) -> String {
    if m.is_nan() {
        "n/a".into()
    } else {
        format!("{:.2} ± {:.2}", m * scale, s * scale)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| !x.is_nan());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// The tables, plots and verdicts shared by `vit-fmnist` and `gpt-sotu`.
pub fn conditioning_report(
    section: &mut Section,
    runs: &[RunRecord],
    out_dir: &Path,
    report_dir: &Path,
    spec: &ReportSpec,
) -> Result<()> {
    let mut order: Vec<String> = Vec::new();
    let mut data: BTreeMap<String, VariantData> = BTreeMap::new();
    for run in runs {
        if matches!(run.info.status, RunStatus::Failed { .. }) {
            continue;
        }
        let mut last: BTreeMap<String, [f64; 6]> = BTreeMap::new();
        for line in run.metrics::<Line>()? {
            if !order.contains(&line.variant) {
                order.push(line.variant.clone());
            }
            let entry = data.entry(line.variant.clone()).or_default();
            if let Some(f) = line.summary {
                entry.finals.push(f);
            }
            if let Some(Record::Eval { step, heads, .. }) = line.record {
                if heads.is_empty() {
                    continue;
                }
                let s = summarize(&heads);
                let uniform =
                    heads.iter().map(|h| h.uniform_entropy).sum::<f64>() / heads.len() as f64;
                entry.curves.entry(step).or_default().push([
                    s.kappa_wq,
                    s.sigma_min_wq,
                    s.entropy,
                    s.jacobian_kappa,
                    s.saturated_fraction,
                ]);
                last.insert(
                    line.variant.clone(),
                    [
                        s.kappa_wq,
                        s.sigma_min_wq,
                        s.entropy,
                        s.jacobian_kappa,
                        s.saturated_fraction,
                        uniform,
                    ],
                );
            }
        }
        for (v, l) in last {
            data.entry(v).or_default().last.push(l);
        }
    }
    if order.is_empty() {
        section.paragraph("No completed runs to report.");
        return Ok(());
    }
    let base_name = order[0].clone();
    let base_step = mean_step_seconds(&data[&base_name].finals);

    // The main table.
    let mut rows = Vec::new();
    for name in &order {
        let d = &data[name];
        let completed: Vec<f64> = d
            .finals
            .iter()
            .filter(|f| f.outcome == Outcome::Completed)
            .map(|f| f.metric)
            .collect();
        let diverged = d
            .finals
            .iter()
            .filter(|f| matches!(f.outcome, Outcome::Diverged { .. }))
            .count();
        let col = |i: usize| mean_std(&d.last.iter().map(|l| l[i]).collect::<Vec<_>>());
        let step = mean_step_seconds(&d.finals);
        rows.push(vec![
            name.clone(),
            format!("{}/{}", completed.len(), d.finals.len()),
            diverged.to_string(),
            fmt_ms(mean_std(&completed), spec.scale),
            fmt_ms(col(0), 1.0),
            fmt_ms(col(1), 1.0),
            format!("{:.3e}", median(d.last.iter().map(|l| l[3]).collect())),
            format!("{:.3} / {:.3}", col(2).0, col(5).0),
            format!("{:.1}%", 100.0 * col(4).0),
            format!(
                "{:.1} ({:+.1}%)",
                1e3 * step,
                100.0 * (step / base_step - 1.0)
            ),
        ]);
    }
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
    section.paragraph(spec.paper);

    // Plots over training.
    let titles = [
        ("kappa_wq", "κ(W_Q), mean over heads", true),
        ("sigma_min_wq", "σ_min(W_Q), mean over heads", true),
        (
            "entropy",
            "attention entropy (nats), mean over heads",
            false,
        ),
        (
            "kappa_j",
            "κ(J) of the attention weight Jacobian, median over heads",
            true,
        ),
    ];
    for (i, (file, title, log)) in titles.iter().enumerate() {
        let mut plot = LinePlot::new(title, "step", title.split(',').next().unwrap_or(title));
        if *log {
            plot = plot.log_y();
        }
        let mut any = false;
        for name in &order {
            let pts: Vec<(f64, f64)> = data[name]
                .curves
                .iter()
                .map(|(s, v)| (*s as f64, median(v.iter().map(|x| x[i]).collect())))
                .filter(|(_, y)| y.is_finite() && (!*log || *y > 0.0))
                .collect();
            if !pts.is_empty() {
                any = true;
                plot = plot.series(name, pts, Mark::Line);
            }
        }
        if any {
            let path = out_dir.join(format!("{file}.png"));
            plot.save(&path)?;
            section.image_file(title, &path, report_dir);
        }
    }

    // Verdicts per claim, conditioned variants against the baseline.
    let base = &data[&base_name];
    let bcol = |i: usize| mean_std(&base.last.iter().map(|l| l[i]).collect::<Vec<_>>()).0;
    let bmetric: Vec<f64> = base
        .finals
        .iter()
        .filter(|f| f.outcome == Outcome::Completed)
        .map(|f| f.metric)
        .collect();
    let (bm, bs) = mean_std(&bmetric);
    let bj = median(base.last.iter().map(|l| l[3]).collect());
    let mut verdicts = Vec::new();
    for name in order.iter().skip(1) {
        let d = &data[name];
        let col = |i: usize| mean_std(&d.last.iter().map(|l| l[i]).collect::<Vec<_>>()).0;
        let m: Vec<f64> = d
            .finals
            .iter()
            .filter(|f| f.outcome == Outcome::Completed)
            .map(|f| f.metric)
            .collect();
        let (mm, ms) = mean_std(&m);
        let j = median(d.last.iter().map(|l| l[3]).collect());
        let held = |ok: bool| if ok { "held" } else { "did not hold" };
        let better = if spec.higher_is_better {
            mm > bm
        } else {
            mm < bm
        };
        let margin = (mm - bm).abs() > (bs.powi(2) + ms.powi(2)).sqrt();
        verdicts.push(vec![
            name.clone(),
            format!(
                "{} ({:.4} vs {:.4})",
                held(col(1) > bcol(1)),
                col(1),
                bcol(1)
            ),
            format!(
                "{} ({:.3} vs {:.3})",
                held(col(0) < bcol(0)),
                col(0),
                bcol(0)
            ),
            if j.is_nan() || bj.is_nan() {
                "not measured".into()
            } else {
                format!("{} ({:.3e} vs {:.3e})", held(j < bj), j, bj)
            },
            if mm.is_nan() || bm.is_nan() {
                "no completed runs".into()
            } else {
                format!(
                    "{}{} ({:.2} vs {:.2}, Δ = {:+.2})",
                    held(better),
                    if margin { "" } else { ", within noise" },
                    mm * spec.scale,
                    bm * spec.scale,
                    (mm - bm) * spec.scale
                )
            },
        ]);
    }
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
        &verdicts,
    );
    // Collapse of attention onto the diagonal (docs/models.md, "Why a large λ collapses attention").
    let collapsed: Vec<String> = order
        .iter()
        .filter_map(|name| {
            let d = &data[name];
            let sat = mean_std(&d.last.iter().map(|l| l[4]).collect::<Vec<_>>()).0;
            let h = mean_std(&d.last.iter().map(|l| l[2]).collect::<Vec<_>>()).0;
            let u = mean_std(&d.last.iter().map(|l| l[5]).collect::<Vec<_>>()).0;
            (sat > 0.5).then(|| {
                format!(
                    "{name}: {:.1}% of attention rows put more than 0.99 of their mass on one \
                     token (entropy {h:.3} against {u:.3} for uniform attention)",
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
    Ok(())
}
