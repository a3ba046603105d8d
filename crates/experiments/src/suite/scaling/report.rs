//! The `scaling` section: each claim's effect at every width (mean and 95% interval over
//! seeds), its least-squares trend against log₂ D over every (width, seed) with the slope's 95%
//! interval, and a verdict on the direction.
//!
//! Effects are oriented so that a positive value is the paper's direction: a loss advantage
//! L(B) − L(A) where the paper has A below B, an accuracy or loss gain of λ·I_k over its
//! baseline. A trend is "flat" when the slope's interval holds 0; otherwise the effect grows or
//! shrinks with width, and where the line crosses 0 (or the paper's value) the report names the
//! width — an extrapolation that assumes the line holds beyond the widths trained.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use kappa_optim::Precision;
use kappa_train::{MetricsLine, Outcome, Preset, Record};

use super::{Config, Point, Scaling, Study};
use crate::plot::{LinePlot, Mark};
use crate::report::cells::{fixed, MISSING};
use crate::report::variants::read_variants;
use crate::report::{opened, Figures, Section};
use crate::run::RunRecord;
use crate::stats::{fit_line, mean, mean_std, per_step, t975, LineFit};
use crate::Experiment;

/// GPT-2 small's width, where the trends are read out (its head dimension is 64, not the
/// series' k: the read-out assumes the trend in D is what carries over).
const GPT2_SMALL_WIDTH: f64 = 768.0;

/// The heads' numbers at one evaluation.
#[derive(Clone, Copy, Debug, Default)]
struct Heads {
    /// The largest attention logit over heads.
    max_logit: f64,
    /// The largest σ_max(W_Q^h)·σ_max(W_K^h) over heads.
    qk: f64,
    /// Mean attention entropy over heads (nats).
    entropy: f64,
    /// Mean share of saturated rows (max P > 0.99) over heads.
    saturated: f64,
}

/// What one point logged in one run.
#[derive(Clone, Debug, Default)]
struct Trace {
    /// Every evaluation with head diagnostics: (step, heads).
    evals: Vec<(u64, Heads)>,
    /// The last of them.
    last: Option<Heads>,
    outcome: Option<Outcome>,
    metric: f64,
    seconds_per_step: f64,
    /// Hidden-matrix updates whose msign computed in bf16, summed over the training records;
    /// `None` while no record carries the count.
    msign_bf16: Option<u64>,
}

impl Trace {
    fn add(&mut self, line: MetricsLine) {
        if let Some(Record::Train { optimizers, .. }) = &line.record {
            for n in optimizers.values().filter_map(|s| s.msign_bf16) {
                *self.msign_bf16.get_or_insert(0) += n;
            }
        }
        if let Some(Record::Eval { heads, step, .. }) = &line.record {
            if !heads.is_empty() {
                let n = heads.len() as f64;
                let mut h = Heads {
                    max_logit: f64::NEG_INFINITY,
                    ..Heads::default()
                };
                for d in heads {
                    h.max_logit = h.max_logit.max(d.max_logit);
                    h.qk = h.qk.max(d.wq.sigma_max * d.wk.sigma_max);
                    h.entropy += d.entropy / n;
                    h.saturated += d.saturated_fraction / n;
                }
                self.evals.push((*step, h));
                self.last = Some(h);
            }
        }
        if let Some(f) = line.summary {
            self.outcome = Some(f.outcome);
            self.metric = f.metric;
            self.seconds_per_step = f.seconds_per_step;
        }
    }

    fn completed(&self) -> bool {
        self.outcome == Some(Outcome::Completed)
    }

    fn diverged_at(&self) -> Option<u64> {
        match self.outcome {
            Some(Outcome::Diverged { step, .. }) => Some(step),
            _ => None,
        }
    }
}

/// Seed → label → trace.
struct Traces(BTreeMap<u64, BTreeMap<String, Trace>>);

impl Traces {
    fn read(runs: &[RunRecord]) -> Result<Self> {
        let mut all = BTreeMap::new();
        for run in runs {
            let v = read_variants(std::slice::from_ref(run), Trace::add)?;
            let one = v
                .runs
                .into_iter()
                .filter_map(|(label, mut t)| t.pop().map(|t| (label, t)))
                .collect();
            all.insert(run.info.run.seed, one);
        }
        Ok(Self(all))
    }

    /// The traces of `point`, one per seed that has it.
    fn of(&self, point: &Point) -> Vec<(u64, &Trace)> {
        let label = point.label();
        self.0
            .iter()
            .filter_map(|(&seed, m)| m.get(&label).map(|t| (seed, t)))
            .collect()
    }
}

/// One effect: a value per (width, seed), positive in the paper's direction.
struct Effect {
    name: String,
    unit: &'static str,
    /// The paper's value, where it has one.
    paper: Option<f64>,
    values: Vec<(usize, f64)>,
}

impl Effect {
    fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.values.iter().map(|v| v.0).collect();
        w.dedup();
        w
    }

    /// Mean and 95% half-width over the seeds at `width` (NaN half-width for one seed).
    fn at(&self, width: usize) -> (f64, f64, usize) {
        let v: Vec<f64> = self
            .values
            .iter()
            .filter(|p| p.0 == width)
            .map(|p| p.1)
            .collect();
        let (m, s) = mean_std(&v);
        let n = v.len();
        let half = if n > 1 {
            t975(n - 1) * s / (n as f64).sqrt()
        } else {
            f64::NAN
        };
        (m, half, n)
    }

    fn fit(&self) -> Option<LineFit> {
        let pts: Vec<(f64, f64)> = self
            .values
            .iter()
            .map(|&(w, y)| ((w as f64).log2(), y))
            .collect();
        fit_line(&pts)
    }
}

/// "0.0123 ± 0.0045" (a half-width), or the mean alone without one.
fn with_interval(m: f64, half: f64, digits: usize) -> String {
    if m.is_nan() {
        MISSING.into()
    } else if half.is_nan() {
        fixed(m, digits)
    } else {
        format!("{m:.digits$} ± {half:.digits$}")
    }
}

/// The one-line verdict on an effect's direction with width.
fn direction(e: &Effect, digits: usize) -> String {
    let Some(fit) = e.fit() else {
        return format!(
            "{}: too few (width, seed) points for a trend (need 3 at 2 widths or more).",
            e.name
        );
    };
    let level = mean(&e.values.iter().map(|v| v.1).collect::<Vec<_>>());
    let (lo, hi) = (fit.slope - fit.half_width, fit.slope + fit.half_width);
    let slope = format!(
        "slope {:+.digits$} {} per doubling of D, 95% CI [{lo:+.digits$}, {hi:+.digits$}]",
        fit.slope, e.unit
    );
    let moving = if lo > 0.0 {
        Some(true)
    } else if hi < 0.0 {
        Some(false)
    } else {
        None
    };
    let what = match (moving, level >= 0.0) {
        (None, _) => "is flat with width".to_string(),
        (Some(up), true) => format!(
            "{} with width (toward {} the paper's direction)",
            if up { "widens" } else { "narrows" },
            if up { "more of" } else { "less of" }
        ),
        (Some(up), false) => format!(
            "is reversed and the reversal {} with width",
            if up { "narrows" } else { "widens" }
        ),
    };
    let (at, half) = fit.predict(GPT2_SMALL_WIDTH.log2());
    let mut text = format!(
        "{}: mean {level:+.digits$} {}; the effect {what} ({slope}). Read out at GPT-2 small's \
         D = 768 (an extrapolation): {at:+.digits$} ± {half:.digits$}",
        e.name, e.unit
    );
    let reach = |y: f64, name: String| {
        fit.crossing(y).filter(|&x| x > fit.x_mean).map(|x| {
            format!(
                "; the line reaches {name} at D ≈ {:.0} (extrapolated)",
                x.exp2()
            )
        })
    };
    let reached = match moving {
        Some(true) if level < 0.0 => reach(0.0, "0 (the paper's sign)".into()),
        Some(true) => e
            .paper
            .filter(|&p| p > level)
            .and_then(|p| reach(p, format!("the paper's {p:+.digits$}"))),
        Some(false) if level > 0.0 => reach(0.0, "0 (no effect)".into()),
        _ => None,
    };
    text += &reached.unwrap_or_default();
    text + "."
}

/// A table row per width and a column per effect: mean ± 95% half-width (n seeds).
fn effect_table(section: &mut Section, effects: &[Effect], digits: usize) {
    let mut widths: Vec<usize> = effects.iter().flat_map(|e| e.widths()).collect();
    widths.sort_unstable();
    widths.dedup();
    let mut headers = vec!["D".to_string()];
    headers.extend(effects.iter().map(|e| format!("{} ({})", e.name, e.unit)));
    let rows: Vec<Vec<String>> = widths
        .iter()
        .map(|&w| {
            let mut row = vec![w.to_string()];
            for e in effects {
                let (m, h, n) = e.at(w);
                row.push(if n == 0 {
                    MISSING.into()
                } else {
                    format!("{} (n={n})", with_interval(m, h, digits))
                });
            }
            row
        })
        .collect();
    let mut paper = vec!["paper (GPT-2 small / ViT-B)".to_string()];
    paper.extend(
        effects
            .iter()
            .map(|e| e.paper.map_or(MISSING.into(), |p| format!("{p:+.digits$}"))),
    );
    let mut all = rows;
    all.push(paper);
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    section.table(&headers, &all);
}

/// The effects' means per width (points), their 95% intervals (thin lines) and fitted trends
/// (thick lines), one colour per effect, on a log D axis.
fn effect_plot(title: &str, y: &str, effects: &[Effect]) -> LinePlot {
    let mut plot = LinePlot::new(title, "width D", y).log_x();
    for e in effects {
        let widths = e.widths();
        let means: Vec<(f64, f64)> = widths.iter().map(|&w| (w as f64, e.at(w).0)).collect();
        let band = |sign: f64| -> Vec<(f64, f64)> {
            widths
                .iter()
                .map(|&w| {
                    let (m, h, _) = e.at(w);
                    (w as f64, m + sign * h)
                })
                .collect()
        };
        plot = plot
            .series(&e.name, means, Mark::Points)
            .companion(band(-1.0), Mark::Reference)
            .companion(band(1.0), Mark::Reference);
        if let (Some(fit), Some(&lo), Some(&hi)) = (e.fit(), widths.first(), widths.last()) {
            let line = [lo, hi]
                .iter()
                .map(|&w| (w as f64, fit.predict((w as f64).log2()).0))
                .collect();
            plot = plot.companion(line, Mark::Line);
        }
    }
    plot
}

/// The effects' table, a verdict line each, and their plot (`title`, y label) as `file`.
fn effects_with_plot(
    section: &mut Section,
    figures: &Figures,
    effects: &[Effect],
    digits: usize,
    (title, y_label): (&str, &str),
    file: &str,
) {
    effect_table(section, effects, digits);
    for e in effects {
        section.paragraph(&format!("Verdict — {}", direction(e, digits)));
    }
    let plot = effect_plot(title, y_label, effects);
    figures.add_if_drawn(section, title, &plot, file);
}

/// The paired difference `f(a) − f(b)` per (width, seed) over the widths where both points of a
/// seed exist and `keep` holds for both.
fn paired(
    traces: &Traces,
    widths: &[usize],
    mut point: impl FnMut(usize, &str) -> Option<Point>,
    (a, b): (&str, &str),
    keep: impl Fn(&Trace) -> bool,
    f: impl Fn(&Trace) -> f64,
) -> Vec<(usize, f64)> {
    let mut out = Vec::new();
    for &w in widths {
        let (Some(pa), Some(pb)) = (point(w, a), point(w, b)) else {
            continue;
        };
        let tb: BTreeMap<u64, &Trace> = traces.of(&pb).into_iter().collect();
        for (seed, ta) in traces.of(&pa) {
            if let Some(tb) = tb.get(&seed) {
                if keep(ta) && keep(tb) {
                    out.push((w, f(ta) - f(tb)));
                }
            }
        }
    }
    out
}

/// The point of `study`'s variant `name` at `width`.
fn find(points: &[Point], study: Study, width: usize, name: &str) -> Option<Point> {
    points
        .iter()
        .find(|p| p.study == study && p.width == width && p.name == name)
        .cloned()
}

pub(super) fn report(
    e: &Scaling,
    runs: &[RunRecord],
    out_dir: &Path,
    report_dir: &Path,
) -> Result<Section> {
    let mut section = opened("scaling: how the claims move with width", e.claim(), runs);
    let Some(first) = runs.first() else {
        section.paragraph("No completed runs to report.");
        return Ok(section);
    };
    let config: Config = first.config()?;
    let traces = Traces::read(runs)?;
    let figures = Figures::new(out_dir, report_dir);
    if !config.manifold_widths.is_empty() {
        manifold_study(&mut section, &config, &traces, &figures);
    }
    if !config.conditioning_widths.is_empty() {
        conditioning_study(&mut section, &config, &traces, &figures);
    }
    Ok(section)
}

/// The name of the first non-ablation variant of `preset` in the manifold study.
fn preset_name(config: &Config, preset: Preset) -> Option<&str> {
    config
        .manifolds
        .variants
        .iter()
        .find(|v| v.preset == preset && !v.ablation)
        .map(|v| v.name.as_str())
}

fn manifold_study(section: &mut Section, config: &Config, traces: &Traces, figures: &Figures) {
    let points = config.points();
    let widths = &config.manifold_widths;
    section.paragraph(&super::setup_manifolds(config));
    section.paragraph(&precision_paragraph(config, traces, &points));
    // Loss per preset and width.
    per_point_table(section, config, traces, &points);
    // The ordering: paper HETERO 3.3544 < ALL-STIEFEL 3.3679 < UNCONSTRAINED 3.3855.
    let pairs = [
        (Preset::Hetero, Preset::AllStiefel, 3.3679 - 3.3544),
        (Preset::AllStiefel, Preset::Unconstrained, 3.3855 - 3.3679),
        (Preset::Hetero, Preset::Unconstrained, 3.3855 - 3.3544),
    ];
    let mut effects = Vec::new();
    for (a, b, paper) in pairs {
        let (Some(na), Some(nb)) = (preset_name(config, a), preset_name(config, b)) else {
            continue;
        };
        effects.push(Effect {
            name: format!("{} below {}", na, nb),
            unit: "nats",
            paper: Some(paper),
            // L(B) − L(A): positive when A is below B, as in the paper.
            values: paired(
                traces,
                widths,
                |w, n| find(&points, Study::Manifolds, w, n),
                (nb, na),
                Trace::completed,
                |t| t.metric,
            ),
        });
    }
    section.paragraph(
        "**The ordering.** Final validation-loss advantage L(B) − L(A) of each pair the paper \
         orders A < B (positive: the paper's order), paired by seed; mean ± 95% interval over \
         seeds at each width (runs that diverged are left out of the pair), and the paper's gap \
         at GPT-2 small.",
    );
    effects_with_plot(
        section,
        figures,
        &effects,
        4,
        (
            "Loss advantage in the paper's order against width",
            "L(B) − L(A) (nats)",
        ),
        "ordering_vs_width.png",
    );
    mechanism(section, config, traces, &points, figures);
    lr_transfer(section, config, traces, &points);
}

/// What msign computed in: the configured working precision of the hidden-matrix optimizers
/// and, at each width, the training records' count of msign updates in bf16 over every seed
/// and variant ("not recorded" where a run's records carry no count).
fn precision_paragraph(config: &Config, traces: &Traces, points: &[Point]) -> String {
    let mut configured: Vec<Precision> = config
        .manifolds
        .variants
        .iter()
        .flat_map(|v| [v.modulewise.muon.precision, v.modulewise.manifold.precision])
        .collect();
    configured.sort_by_key(|&p| precision_name(p));
    configured.dedup();
    let names: Vec<String> = configured
        .iter()
        .map(|p| format!("`{}`", precision_name(*p)))
        .collect();
    let rule = if configured.contains(&Precision::Auto) {
        ". Under `auto` that is f32 on a CPU without native bf16 products and, on a CPU with \
         them (AVX512-BF16, AMX-BF16), bf16 for the matrices above its size rule (docs/optim.md, \
         \"Precision per device\"): a point's result depends on the CPU it ran on by more than \
         roundoff"
    } else {
        ", the same working type on every CPU"
    };
    let counts: Vec<Option<String>> = config
        .manifold_widths
        .iter()
        .map(|&w| {
            let traces: Vec<&Trace> = points
                .iter()
                .filter(|p| p.study == Study::Manifolds && p.width == w)
                .flat_map(|p| traces.of(p).into_iter().map(|(_, t)| t))
                .collect();
            let count: Option<u64> = traces.iter().map(|t| t.msign_bf16).sum();
            match count {
                Some(n) if !traces.is_empty() => Some(format!("D = {w}: {n}")),
                _ => None,
            }
        })
        .collect();
    let recorded = if counts.iter().all(Option::is_none) {
        "These runs' training records carry no count of the msign updates that ran in bf16."
            .to_string()
    } else {
        let cells: Vec<String> = (config.manifold_widths.iter().zip(&counts))
            .map(|(w, c)| c.clone().unwrap_or(format!("D = {w}: not recorded")))
            .collect();
        format!(
            "msign updates in bf16, summed over the training records of every seed and \
             variant: {}.",
            cells.join("; ")
        )
    };
    format!(
        "**Precision.** The hidden-matrix optimizers compute msign in {}{rule}. {recorded}",
        names.join(", ")
    )
}

/// A precision as its config files write it (its serde name).
fn precision_name(p: Precision) -> String {
    match serde_json::to_value(p) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{p:?}"),
    }
}

/// Final loss (or "diverged at step N") and seconds per step per variant and width.
fn per_point_table(section: &mut Section, config: &Config, traces: &Traces, points: &[Point]) {
    let widths = &config.manifold_widths;
    let mut headers = vec!["variant".to_string()];
    headers.extend(widths.iter().map(|w| format!("D = {w}")));
    let rows: Vec<Vec<String>> = config
        .manifolds
        .variants
        .iter()
        .filter(|v| !v.ablation)
        .map(|v| {
            let mut row = vec![v.name.clone()];
            for &w in widths {
                let cell = find(points, Study::Manifolds, w, &v.name).map(|p| {
                    let ts = traces.of(&p);
                    if ts.is_empty() {
                        return MISSING.to_string();
                    }
                    let losses: Vec<f64> = ts
                        .iter()
                        .filter(|(_, t)| t.completed())
                        .map(|(_, t)| t.metric)
                        .collect();
                    let diverged: Vec<String> = ts
                        .iter()
                        .filter_map(|(_, t)| t.diverged_at())
                        .map(|s| s.to_string())
                        .collect();
                    let spent = mean(
                        &ts.iter()
                            .map(|(_, t)| t.seconds_per_step)
                            .collect::<Vec<_>>(),
                    );
                    let (m, s) = mean_std(&losses);
                    let mut c = if losses.is_empty() {
                        MISSING.to_string()
                    } else {
                        format!("{m:.4} ± {s:.4}")
                    };
                    if !diverged.is_empty() {
                        c += &format!(", diverged at {}", diverged.join(", "));
                    }
                    format!("{c} ({spent:.3} s/step)")
                });
                row.push(cell.unwrap_or_else(|| MISSING.into()));
            }
            row
        })
        .collect();
    section.paragraph(
        "Final validation loss (nats/char), mean ± sample std over the seeds that completed, \
         the steps at which others diverged, and the mean seconds per training step.",
    );
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    section.table(&headers, &rows);
}

/// DGram attention's divergence and its mechanism: logit growth against the bound's width factor.
fn mechanism(
    section: &mut Section,
    config: &Config,
    traces: &Traces,
    points: &[Point],
    figures: &Figures,
) {
    let k = config.head_dim as f64;
    let widths = &config.manifold_widths;
    let mut rows = Vec::new();
    let mut growth = Vec::new();
    let mut plot = LinePlot::new(
        "Largest attention logit at the end against width",
        "width D",
        "max logit",
    )
    .log_x()
    .log_y();
    for v in config.manifolds.variants.iter().filter(|v| !v.ablation) {
        let mut logits = Vec::new();
        let mut normalized = Vec::new();
        let mut curve = Vec::new();
        let mut row = vec![v.name.clone()];
        for &w in widths {
            let Some(p) = find(points, Study::Manifolds, w, &v.name) else {
                row.push(MISSING.into());
                continue;
            };
            let ts = traces.of(&p);
            let diverged = ts.iter().filter(|(_, t)| t.diverged_at().is_some()).count();
            let ends: Vec<Heads> = ts.iter().filter_map(|(_, t)| t.last).collect();
            if ends.is_empty() {
                row.push(match ts.is_empty() {
                    true => MISSING.into(),
                    false => format!("{MISSING}, diverged {diverged}/{}", ts.len()),
                });
                continue;
            }
            for h in &ends {
                logits.push((w, h.max_logit.log2()));
                // The bound's width factor at fixed σσ: ‖x‖² ≈ D (unit-variance LayerNorm
                // output), so logit ≤ D·σ_max(W_Q)·σ_max(W_K)/√k.
                normalized.push((w, (h.max_logit / h.qk).log2()));
            }
            let logit = mean(&ends.iter().map(|h| h.max_logit).collect::<Vec<_>>());
            let qk = mean(&ends.iter().map(|h| h.qk).collect::<Vec<_>>());
            let sat = mean(&ends.iter().map(|h| h.saturated).collect::<Vec<_>>());
            let entropy = mean(&ends.iter().map(|h| h.entropy).collect::<Vec<_>>());
            curve.push((w as f64, logit));
            row.push(format!(
                "{logit:.2} / {qk:.2} / {:.1}% / {:.0}% / {entropy:.2}, diverged {diverged}/{}",
                100.0 * logit / (qk * w as f64 / k.sqrt()),
                100.0 * sat,
                ts.len()
            ));
        }
        plot = plot.series(&v.name, curve, Mark::Line);
        rows.push(row);
        growth.push((v.name.clone(), logits, normalized));
    }
    section.paragraph(&format!(
        "**DGram attention and its mechanism.** At the last evaluation, means over seeds: the \
         largest attention logit / the largest σ_max(W_Q^h)·σ_max(W_K^h) / the logit as a share \
         of the bound D·σσ/√k (LayerNorm output of unit variance, k = {}) / the share of \
         saturated attention rows (more than 0.99 of a row's mass on one token) / the mean \
         attention entropy (nats), and how many seeds diverged. The bound's ‖x‖² ≤ D holds for unit LayerNorm gains; gains that training \
         raises let a logit exceed the share 100%, even with σσ = 1 (Stiefel attention). The \
         paper's DGram-attention runs (ALL-DGRAM, HETERO-INV) diverged at GPT-2 small, where \
         D/√k = 96.",
        config.head_dim
    ));
    let mut headers = vec!["variant".to_string()];
    headers.extend(
        widths
            .iter()
            .map(|w| format!("D = {w} (D/√k = {:.0})", *w as f64 / k.sqrt())),
    );
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    section.table(&headers, &rows);
    for (name, logits, normalized) in growth {
        let logit = Effect {
            name: format!("{name}: log₂ max logit"),
            unit: "",
            paper: None,
            values: logits,
        };
        let per_qk = Effect {
            name: format!("{name}: log₂(max logit / σσ)"),
            unit: "",
            paper: None,
            values: normalized,
        };
        section.paragraph(&format!(
            "Verdict — {} {}",
            slope_line(&logit),
            slope_line(&per_qk)
        ));
    }
    section.paragraph(
        "The bound grows as D at fixed σσ (slope 1 of log₂(max logit / σσ) against log₂ D); \
         a slope near 1 says the logits grow with width as the bound allows, a slope near 0 \
         that width alone does not raise them.",
    );
    figures.add_if_drawn(
        section,
        "max logit against width",
        &plot,
        "max_logit_vs_width.png",
    );
    for preset in [Preset::AllDGram, Preset::HeteroInv] {
        let Some(name) = preset_name(config, preset) else {
            continue;
        };
        section.paragraph(&format!(
            "Verdict — {}",
            divergence_line(name, widths, traces, points)
        ));
        let mut over_time = LinePlot::new(
            &format!("{name}: largest attention logit during training"),
            "step",
            "max logit (mean over seeds)",
        )
        .log_y();
        for &w in widths {
            if let Some(p) = find(points, Study::Manifolds, w, name) {
                let evals = traces.of(&p).into_iter().flat_map(|(_, t)| t.evals.iter());
                let curve = per_step(evals.map(|(s, h)| (*s, h.max_logit)), mean);
                over_time = over_time.series(&format!("D = {w}"), curve, Mark::Line);
            }
        }
        let file = format!("max_logit_over_steps_{}.png", preset.name().to_lowercase());
        figures.add_if_drawn(
            section,
            &format!("{name} max logit over steps"),
            &over_time,
            &file,
        );
    }
}

/// "ALL-DGRAM diverged in 2 of 12 runs: at D = 128 (steps 5100, 6300)", or "in none".
fn divergence_line(name: &str, widths: &[usize], traces: &Traces, points: &[Point]) -> String {
    let mut runs = 0;
    let mut at = Vec::new();
    for &w in widths {
        let Some(p) = find(points, Study::Manifolds, w, name) else {
            continue;
        };
        let ts = traces.of(&p);
        runs += ts.len();
        let steps: Vec<String> = ts
            .iter()
            .filter_map(|(_, t)| t.diverged_at())
            .map(|s| s.to_string())
            .collect();
        if !steps.is_empty() {
            at.push((w, steps));
        }
    }
    let count: usize = at.iter().map(|(_, s)| s.len()).sum();
    if at.is_empty() {
        return format!(
            "{name} diverged in none of its {runs} runs, at any width: the paper's instability \
             does not appear at these widths and this Σηₜ."
        );
    }
    let cells: Vec<String> = at
        .iter()
        .map(|(w, s)| format!("D = {w} (step {})", s.join(", ")))
        .collect();
    format!(
        "{name} diverged in {count} of its {runs} runs: {}.",
        cells.join("; ")
    )
}

/// "NAME: slope s, 95% CI [lo, hi] per doubling of D."
fn slope_line(e: &Effect) -> String {
    match e.fit() {
        Some(f) => format!(
            "{}: slope {:+.3} per doubling of D, 95% CI [{:+.3}, {:+.3}].",
            e.name,
            f.slope,
            f.slope - f.half_width,
            f.slope + f.half_width
        ),
        None => format!("{}: too few points for a trend.", e.name),
    }
}

/// Whether the Muon lr transfers across widths: the UNCONSTRAINED variants at other lrs.
fn lr_transfer(section: &mut Section, config: &Config, traces: &Traces, points: &[Point]) {
    let variants: Vec<_> = config
        .manifolds
        .variants
        .iter()
        .filter(|v| v.preset == Preset::Unconstrained)
        .collect();
    if variants.len() < 2 {
        return;
    }
    let widths = &config.manifold_widths;
    let mut best = Vec::new();
    let rows: Vec<Vec<String>> = widths
        .iter()
        .map(|&w| {
            let mut row = vec![w.to_string()];
            let mut here = Vec::new();
            for v in &variants {
                // The first seed: the only one every variant ran on.
                let loss = find(points, Study::Manifolds, w, &v.name)
                    .and_then(|p| traces.of(&p).into_iter().next())
                    .filter(|(_, t)| t.completed())
                    .map(|(_, t)| t.metric);
                row.push(loss.map_or(MISSING.into(), |l| fixed(l, 4)));
                if let Some(l) = loss {
                    here.push((l, v.modulewise.muon_lr));
                }
            }
            // A width counts once every lr has a completed run there.
            let best_here = here.iter().min_by(|a, b| a.0.total_cmp(&b.0));
            if let (true, Some(&(_, lr))) = (here.len() == variants.len(), best_here) {
                best.push(lr);
            }
            row
        })
        .collect();
    let mut headers = vec!["D".to_string()];
    headers.extend(
        variants
            .iter()
            .map(|v| format!("{} (Muon lr {})", v.name, v.modulewise.muon_lr)),
    );
    section.paragraph(
        "**Does the Muon lr transfer across widths?** With the spectral-norm step (the update's \
         spectral norm is the lr, whatever the shape), the best lr should not depend on width. \
         Final validation loss of UNCONSTRAINED at each lr, first seed.",
    );
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    section.table(&headers, &rows);
    section.paragraph(&format!("Verdict — {}", lr_verdict(&best, widths.len())));
}

/// The lr-transfer verdict from the best lr at each width where every lr has a completed run.
fn lr_verdict(best: &[f64], widths: usize) -> String {
    let listed = best
        .iter()
        .map(|l| l.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let verdict = if best.len() < widths {
        format!(
            "only {} of the {widths} widths have completed runs at every lr, so no verdict yet",
            best.len()
        )
    } else if best.windows(2).all(|p| p[0] == p[1]) {
        "the same at every width: the lr transfers across this range".into()
    } else {
        "it moves with width: the lr does not transfer across this range".into()
    };
    format!("the best Muon lr by width: {listed}; {verdict}.")
}

fn conditioning_study(section: &mut Section, config: &Config, traces: &Traces, figures: &Figures) {
    let points = config.points();
    let widths = &config.conditioning_widths;
    section.paragraph(&super::setup_conditioning(config));
    let mut effects = Vec::new();
    for (study, variants, scale, unit, paper) in [
        (Study::Gpt, &config.gpt.variants, -1.0, "nats", None),
        (Study::Vit, &config.vit.variants, 100.0, "points", Some(1.0)),
    ] {
        let Some(base) = variants.first() else {
            continue;
        };
        for v in variants.iter().skip(1) {
            effects.push(Effect {
                name: format!("{} {} over {}", study.name(), v.name, base.name),
                unit,
                paper,
                values: paired(
                    traces,
                    widths,
                    |w, n| find(&points, study, w, n),
                    (&v.name, &base.name),
                    Trace::completed,
                    |t| scale * t.metric,
                ),
            });
        }
    }
    section.paragraph(
        "**The gain of λ·I_k.** The conditioned variant's gain over its baseline, paired by \
         seed (GPT: the fall in validation loss, nats/char; ViT: the rise in test accuracy, \
         points), mean ± 95% interval over seeds at each width; the paper's ViT-B gain on \
         ImageNet is +1.0 point.",
    );
    effects_with_plot(
        section,
        figures,
        &effects,
        3,
        ("Gain of λ·I_k against width", "gain"),
        "conditioning_vs_width.png",
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An effect y = slope·log₂ D + offset at D = 16, 32, 64, 128 over three seeds whose
    /// deviations (−ε, 0, +ε) cancel at every width, so the fit is exact in slope and offset.
    fn effect(slope: f64, offset: f64, eps: f64, paper: Option<f64>) -> Effect {
        let mut values = Vec::new();
        for w in [16usize, 32, 64, 128] {
            for d in [-eps, 0.0, eps] {
                values.push((w, slope * (w as f64).log2() + offset + d));
            }
        }
        Effect {
            name: "A below B".into(),
            unit: "nats",
            paper,
            values,
        }
    }

    /// Traces of every manifold point of `config` on one seed: `count(width)` bf16 updates each.
    fn traces_counting(config: &Config, count: impl Fn(usize) -> Option<u64>) -> Traces {
        let labels = config
            .points()
            .into_iter()
            .filter(|p| p.study == Study::Manifolds)
            .map(|p| {
                let trace = Trace {
                    msign_bf16: count(p.width),
                    ..Trace::default()
                };
                (p.label(), trace)
            })
            .collect();
        Traces(BTreeMap::from([(0, labels)]))
    }

    #[test]
    fn the_precision_paragraph_says_what_each_width_computed_in() {
        let mut config = Scaling.config(crate::scale::Scale::Smoke).unwrap();
        assert_eq!(config.manifold_widths, [8, 16, 32]);
        let points = config.points();
        let variants = config.manifolds.variants.len() as u64;
        let text = |c: &Config, t: &Traces| precision_paragraph(c, t, &points);
        // The smoke config runs `auto`: the paragraph says the result depends on the CPU.
        let none = text(&config, &traces_counting(&config, |_| None));
        assert!(none.contains("msign in `auto`"), "{none}");
        assert!(none.contains("depends on the CPU"), "{none}");
        assert!(none.contains("carry no count"), "{none}");
        // Counts are summed over a width's variants; a width without them is named.
        let counts = |w| match w {
            8 => Some(0),
            16 => None,
            _ => Some(5),
        };
        let some = text(&config, &traces_counting(&config, counts));
        let expected = format!("D = 8: 0; D = 16: not recorded; D = 32: {}.", 5 * variants);
        assert!(some.ends_with(&expected), "{some}");
        // f32 everywhere: the same on every CPU.
        for v in &mut config.manifolds.variants {
            v.modulewise.muon.precision = Precision::F32;
            v.modulewise.manifold.precision = Precision::F32;
        }
        let f32 = text(&config, &traces_counting(&config, |_| Some(0)));
        assert!(
            f32.contains("msign in `f32`, the same working type"),
            "{f32}"
        );
        assert!(f32.ends_with("D = 8: 0; D = 16: 0; D = 32: 0."), "{f32}");
    }

    #[test]
    fn a_growing_effect_widens_and_reaches_the_papers_value() {
        // Mean over log₂ D = 4..7 is 5.5: level 0.01·5.5 − 0.05 = +0.005; the line reaches the
        // paper's 0.0135 at log₂ D = 6.35, D ≈ 82.
        let text = direction(&effect(0.01, -0.05, 1e-3, Some(0.0135)), 4);
        assert!(text.contains("mean +0.0050 nats"), "{text}");
        assert!(text.contains("widens with width"), "{text}");
        assert!(text.contains("slope +0.0100"), "{text}");
        assert!(
            text.contains("reaches the paper's +0.0135 at D ≈ 82"),
            "{text}"
        );
        // Read out at D = 768: 0.01·log₂ 768 − 0.05 = 0.0458.
        assert!(
            text.contains("D = 768 (an extrapolation): +0.0458"),
            "{text}"
        );
    }

    #[test]
    fn a_reversed_effect_that_shrinks_names_where_it_would_change_sign() {
        // Level 0.01·5.5 − 0.08 = −0.025; the line crosses 0 at log₂ D = 8, D = 256.
        let text = direction(&effect(0.01, -0.08, 1e-3, Some(0.0135)), 4);
        assert!(
            text.contains("is reversed and the reversal narrows"),
            "{text}"
        );
        assert!(
            text.contains("reaches 0 (the paper's sign) at D ≈ 256"),
            "{text}"
        );
        let text = direction(&effect(-0.01, 0.03, 1e-3, None), 4);
        assert!(
            text.contains("is reversed and the reversal widens"),
            "{text}"
        );
        assert!(!text.contains("reaches"), "{text}");
    }

    #[test]
    fn a_positive_effect_that_falls_narrows_toward_zero() {
        // Level −0.01·5.5 + 0.1 = +0.045; zero at log₂ D = 10.
        let text = direction(&effect(-0.01, 0.1, 1e-3, None), 4);
        assert!(text.contains("narrows with width"), "{text}");
        assert!(text.contains("reaches 0 (no effect) at D ≈ 1024"), "{text}");
    }

    #[test]
    fn noise_larger_than_the_slope_is_flat() {
        let text = direction(&effect(0.001, 0.0, 0.05, Some(0.0135)), 4);
        assert!(text.contains("is flat with width"), "{text}");
        assert!(!text.contains("reaches"), "{text}");
    }

    #[test]
    fn the_lr_verdict_waits_for_every_width() {
        assert!(lr_verdict(&[0.025, 0.025], 4).contains("only 2 of the 4 widths"));
        assert!(lr_verdict(&[0.025, 0.025], 2).contains("transfers"));
        assert!(lr_verdict(&[0.025, 0.05], 2).contains("does not transfer"));
    }

    #[test]
    fn one_width_gives_no_trend_and_a_cell_without_interval() {
        let e = Effect {
            name: "x".into(),
            unit: "",
            paper: None,
            values: vec![(32, 1.0), (32, 3.0)],
        };
        assert!(direction(&e, 2).contains("too few"));
        let (m, half, n) = e.at(32);
        // t₀.₉₇₅(1) · √2 / √2 = 12.706.
        assert_eq!((m, n), (2.0, 2));
        assert!((half - 12.706).abs() < 1e-12);
        assert!(e.at(64).0.is_nan() && e.at(64).2 == 0);
    }
}
