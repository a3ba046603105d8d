//! The race's report section, from the run folders: the setup, the ranking at each entrant's
//! best lr with the verdicts of [`super::score`], the whole lr grid, the step times, and the
//! loss curves.

use std::path::Path;

use anyhow::Result;

use super::score::{self, Rule, Score};
use super::{Config, Entrant, OptimizerRace, Trace, Traces};
use crate::plot::{LinePlot, Mark};
use crate::report::cells::{over_seeds, MISSING};
use crate::report::variants::{read_variants, Variants};
use crate::report::{opened, Figures, Section};
use crate::run::RunRecord;
use crate::stats::{mean, per_step};
use crate::Experiment;

/// One entrant's runs over the grid, and its best grid value.
struct Standing<'a> {
    entrant: &'a Entrant,
    /// Per grid value, one score per seed.
    grid: Vec<Vec<Score>>,
    /// Per grid value, the traces.
    traces: Vec<&'a [Trace]>,
    best: Option<usize>,
}

impl<'a> Standing<'a> {
    fn new(config: &'a Config, entrant: &'a Entrant, traces: &'a Traces) -> Self {
        let target = config.race.target_val_loss;
        let runs: Vec<&[Trace]> = config
            .lr_factors
            .iter()
            .map(|&f| {
                traces
                    .get(&Config::variant_name(entrant, f))
                    .map_or(&[][..], Vec::as_slice)
            })
            .collect();
        let grid: Vec<Vec<Score>> = runs
            .iter()
            .map(|t| t.iter().map(|x| x.score(target)).collect())
            .collect();
        Self {
            entrant,
            best: score::best_lr(&grid),
            grid,
            traces: runs,
        }
    }

    /// The scores at the best grid value (none without runs).
    fn best_scores(&self) -> &[Score] {
        self.best.map_or(&[][..], |b| self.grid[b].as_slice())
    }

    /// The traces at the best grid value.
    fn best_traces(&self) -> &[Trace] {
        self.best.map_or(&[][..], |b| self.traces[b])
    }

    /// Every trace of the entrant, over the grid.
    fn all_traces(&self) -> impl Iterator<Item = &Trace> + '_ {
        self.traces.iter().flat_map(|t| t.iter())
    }
}

pub(super) fn report(
    e: &OptimizerRace,
    runs: &[RunRecord],
    out_dir: &Path,
    report_dir: &Path,
) -> Result<Section> {
    let mut section = opened(
        "optimizer-race: optimizers raced to a target loss on a fixed GPT",
        e.claim(),
        runs,
    );
    let Variants { runs: traces, .. } = read_variants(runs, Trace::add)?;
    let config: Option<Config> = runs.first().map(|run| run.config()).transpose()?;
    let Some(config) = config.filter(|_| !traces.is_empty()) else {
        section.paragraph("No completed runs to report.");
        return Ok(section);
    };
    let standings: Vec<Standing<'_>> = config
        .entrants
        .iter()
        .map(|entrant| Standing::new(&config, entrant, &traces))
        .collect();
    let rule = Rule {
        steps: config.train.steps,
        eval_every: config.train.eval_every,
        alpha: config.race.alpha,
    };
    section.paragraph(&setup(&config));
    ranking(&mut section, &config, &standings, &rule);
    grid_table(&mut section, &config, &standings);
    timing_table(&mut section, &config, &standings);
    plots(
        &mut section,
        &config,
        &standings,
        &Figures::new(out_dir, report_dir),
    );
    Ok(section)
}

/// What was raced, and the rule.
fn setup(c: &Config) -> String {
    let factors: Vec<String> = c.lr_factors.iter().map(|f| format!("×{f}")).collect();
    format!(
        "Setup: GPT with {} layers, d = {}, {} heads, context {}, {:?} tokens of the SOTU text; \
         every run {} steps of {} sequences ({} tokens per step), warmup {} then cosine to \
         {}× the peak, global clip {}, an evaluation ({} batches) every {} steps; {} entrants, \
         each at lr {} of its own default. Target validation loss {}. \
         **The rule** (α = {}): each entrant's best lr is the one with the lowest mean final \
         validation loss over seeds (a diverged seed counts as +∞); at it, *steps to target* is \
         the first evaluated step with a validation loss ≤ the target. Entrants rank by the share \
         of seeds that reached the target, then by mean steps to target (a miss counted as the \
         budget plus one evaluation interval), then by mean final loss. *A is faster than B* when \
         every seed of A reached the target and Welch's one-sided t-test on steps to target gives \
         p < α (B's misses counted as the budget plus an interval, a lower bound, so the test is \
         conservative; each sample's variance increased by Δ²/12 for the evaluation interval Δ); \
         *slower* when B is faster than A. The *entry rule* (modded-nanogpt's) asks that the \
         final losses lie below the target by the one-sample t-test, \
         t = (target − mean)·√n/s, p < α. Both tests need ≥ 2 seeds.",
        c.model.n_layer,
        c.model.n_embd,
        c.model.n_head,
        c.model.block_size,
        c.tokenizer,
        c.train.steps,
        c.train.batch_size,
        c.train.batch_size * c.model.block_size,
        c.train.warmup_steps,
        c.train.min_lr / c.train.lr,
        c.train.grad_clip,
        c.train.eval_batches,
        c.train.eval_every,
        c.entrants.len(),
        factors.join(", "),
        c.race.target_val_loss,
        c.race.alpha,
    )
}

/// `x` with at most 6 significant decimals and no trailing zeros.
fn short(x: f64) -> String {
    let s = format!("{x:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// The ranking table and the headline lines under it.
fn ranking(section: &mut Section, c: &Config, standings: &[Standing<'_>], rule: &Rule) {
    let best: Vec<Vec<Score>> = standings.iter().map(|s| s.best_scores().to_vec()).collect();
    let order = score::rank(&best, rule);
    let mut headers: Vec<String> = [
        "rank",
        "entrant",
        "best lr",
        "steps to target (mean ± std)",
        "reached",
        "final val loss (mean ± std)",
        "s/step",
        "entry rule",
    ]
    .map(String::from)
    .to_vec();
    headers.extend(c.race.compare_with.iter().map(|n| format!("vs {n}")));
    let rows: Vec<Vec<String>> = order
        .iter()
        .enumerate()
        .map(|(rank, &i)| ranking_row(rank + 1, c, standings, i, rule))
        .collect();
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    section.table(&headers, &rows);
    section.paragraph(&headline(c, standings, &order));
}

/// One row of the ranking table.
fn ranking_row(
    rank: usize,
    c: &Config,
    standings: &[Standing<'_>],
    i: usize,
    rule: &Rule,
) -> Vec<String> {
    let s = &standings[i];
    let scores = s.best_scores();
    let factor = s.best.map_or(f64::NAN, |b| c.lr_factors[b]);
    let reached_steps: Vec<f64> = scores
        .iter()
        .filter_map(|x| x.steps)
        .map(|k| k as f64)
        .collect();
    let step_s: Vec<f64> = s.best_traces().iter().map(|t| t.seconds_per_step).collect();
    let mut row = vec![
        rank.to_string(),
        s.entrant.name.clone(),
        format!("{} (×{factor})", short(c.lr_of(s.entrant, factor))),
        over_seeds(&reached_steps, 0),
        format!("{}/{}", score::reached(scores), scores.len()),
        final_cell(scores),
        format!("{:.4}", mean(&step_s)),
        score::entry_cell(scores, c.race.target_val_loss, c.race.alpha),
    ];
    for name in &c.race.compare_with {
        let other = standings.iter().find(|o| &o.entrant.name == name);
        row.push(match other {
            Some(o) if o.entrant.name != s.entrant.name => {
                score::compare(scores, o.best_scores(), rule).cell()
            }
            _ => MISSING.into(),
        });
    }
    row
}

/// Mean ± std of the finite final losses, with the number of diverged runs.
fn final_cell(scores: &[Score]) -> String {
    let finite: Vec<f64> = scores
        .iter()
        .map(|s| s.final_loss)
        .filter(|l| !l.is_nan())
        .collect();
    let diverged = scores.len() - finite.len();
    let cell = over_seeds(&finite, 4);
    if diverged > 0 {
        format!("{cell} ({diverged} diverged)")
    } else {
        cell
    }
}

/// The winner, and where the first compared entrant (the baseline) reached the target.
fn headline(c: &Config, standings: &[Standing<'_>], order: &[usize]) -> String {
    let mut lines = Vec::new();
    if let Some(&first) = order.first() {
        lines.push(format!(
            "- **First: {}** (the order above is the rule's; a verdict column says whether a \
             difference is significant).",
            standings[first].entrant.name
        ));
    }
    let baseline = c
        .race
        .compare_with
        .first()
        .and_then(|n| standings.iter().find(|s| &s.entrant.name == n));
    if let Some(b) = baseline {
        let (m, _) = score::reached_steps(b.best_scores());
        let at = if m.is_nan() {
            "did not reach the target at its best lr".to_string()
        } else {
            format!(
                "reached the target at step {m:.0} on average at its best lr, {:.0} % of the \
                 budget (the target is meant to fall at 60–80 % of it at the cpu scale)",
                100.0 * m / c.train.steps as f64
            )
        };
        lines.push(format!("- {}: {at}.", b.entrant.name));
    }
    lines.join("\n")
}

/// Every grid value of every entrant: final loss and seeds that reached the target.
fn grid_table(section: &mut Section, c: &Config, standings: &[Standing<'_>]) {
    let mut headers = vec!["entrant".to_string()];
    headers.extend(c.lr_factors.iter().map(|f| format!("lr×{f}")));
    let rows: Vec<Vec<String>> = standings
        .iter()
        .map(|s| {
            let mut row = vec![s.entrant.name.clone()];
            for (j, scores) in s.grid.iter().enumerate() {
                let mark = if s.best == Some(j) { " (best)" } else { "" };
                row.push(if scores.is_empty() {
                    MISSING.into()
                } else {
                    format!(
                        "{}, reached {}/{}{mark}",
                        final_cell(scores),
                        score::reached(scores),
                        scores.len()
                    )
                });
            }
            row
        })
        .collect();
    section.paragraph(
        "The lr grid: final validation loss (mean ± std over seeds) and the seeds that reached \
         the target, at each multiple of the entrant's default lr.",
    );
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    section.table(&headers, &rows);
}

/// Wall time per training step, over every run of an entrant, and the hidden-matrix
/// optimizers' share.
fn timing_table(section: &mut Section, c: &Config, standings: &[Standing<'_>]) {
    let step_time = |s: &Standing<'_>| {
        mean(
            &s.all_traces()
                .map(|t| t.seconds_per_step)
                .collect::<Vec<_>>(),
        )
    };
    let base = c
        .race
        .compare_with
        .first()
        .and_then(|n| standings.iter().find(|s| &s.entrant.name == n))
        .map_or(f64::NAN, step_time);
    let rows: Vec<Vec<String>> = standings
        .iter()
        .filter(|s| s.all_traces().next().is_some())
        .map(|s| {
            let t = step_time(s);
            let (secs, steps) = s.all_traces().fold((0.0, 0u64), |(a, b), x| {
                (a + x.optimizer_seconds, b + x.steps)
            });
            vec![
                s.entrant.name.clone(),
                format!("{t:.4}"),
                if base.is_finite() {
                    format!("{:.2}", t / base)
                } else {
                    MISSING.into()
                },
                if secs > 0.0 && steps > 0 {
                    format!("{:.2}", 1e3 * secs / steps as f64)
                } else {
                    MISSING.into()
                },
            ]
        })
        .collect();
    let base_name = c
        .race
        .compare_with
        .first()
        .map_or("the baseline", String::as_str);
    section.paragraph(
        "Step time per optimizer, over every run of the entrant: the whole training step \
         (forward, backward, optimizers; the model is the same, so differences are the \
         optimizer's), and the milliseconds per step spent in the Muon / manifold-Muon updates of \
         the hidden matrices (— where they are AdamW). Times are wall clock on whatever machine \
         ran the seeds.",
    );
    let versus = format!("× {base_name}");
    section.table(
        &[
            "entrant",
            "s/step",
            versus.as_str(),
            "hidden-matrix optimizer ms/step",
        ],
        &rows,
    );
}

/// The validation loss over training at each entrant's best lr (mean over seeds) with the
/// target, and the final loss over the lr grid.
fn plots(section: &mut Section, c: &Config, standings: &[Standing<'_>], figures: &Figures<'_>) {
    let target = c.race.target_val_loss;
    let mut curves = LinePlot::new(
        "optimizer-race: validation loss at each entrant's best lr",
        "step",
        "validation loss",
    );
    for s in standings {
        let points = s
            .best_traces()
            .iter()
            .flat_map(|t| t.points.iter().copied());
        curves = curves.series(&s.entrant.name, per_step(points, mean), Mark::Line);
    }
    let target_line = vec![(0.0, target), (c.train.steps as f64, target)];
    curves = curves.series("target", target_line, Mark::Reference);
    figures.add_if_drawn(
        section,
        "optimizer-race validation loss",
        &curves,
        "optimizer-race-val-loss.png",
    );
    let mut sweep = LinePlot::new(
        "optimizer-race: final validation loss over the lr grid",
        "multiple of the default lr",
        "final validation loss",
    )
    .log_x();
    for s in standings {
        let points: Vec<(f64, f64)> = c
            .lr_factors
            .iter()
            .zip(&s.grid)
            .filter(|(_, g)| !g.is_empty())
            .map(|(&f, g)| (f, score::mean_final(g)))
            .collect();
        sweep = sweep.series(&s.entrant.name, points, Mark::Line);
    }
    figures.add_if_drawn(
        section,
        "optimizer-race lr grid",
        &sweep,
        "optimizer-race-lr-grid.png",
    );
}
