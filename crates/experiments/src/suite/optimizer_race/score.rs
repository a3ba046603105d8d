//! The race's scoring rule, on plain numbers: steps to the target loss, each entrant's best
//! learning rate, the ranking, and the two statistical verdicts (one entrant faster than
//! another; an entrant's final loss below the target).
//!
//! # The rule
//!
//! - **Steps to target** of one run: the first evaluated step whose validation loss is ≤ the
//!   target; "not reached" when no evaluation of the run is.
//! - **Best lr** of an entrant: the grid value with the lowest mean final validation loss over
//!   its seeds (a diverged seed counts as +∞, so a grid value with a diverged seed loses to
//!   any without one; ties go to the first value of the grid).
//! - **Ranking** (at each entrant's best lr): more seeds reaching the target first (as a share
//!   of the seeds run), then fewer mean steps to target — a run that did not reach it counted
//!   as S + Δ (the budget S plus one evaluation interval Δ), then the lower mean final loss;
//!   entrants with equal keys keep the config's order.
//! - **A is faster than B** when every seed of A reached the target and Welch's one-sided
//!   t-test that A's mean steps to target is below B's gives p < α, with B's misses counted as
//!   S + Δ (a lower bound of what B would have needed, so the test is conservative for A) and
//!   each sample's variance increased by Δ²/12, the variance of a crossing step known only to
//!   the evaluation interval. Both need ≥ 2 seeds; A is slower than B when B is faster than A;
//!   otherwise there is no difference at α.
//! - **Entry rule** (modded-nanogpt's record rule): the entrant's final losses at its best lr
//!   lie below the target by the one-sided one-sample t-test, t = (target − mean)·√n/s,
//!   p < α on n − 1 degrees of freedom.

use crate::stats::{mean, mean_below, mean_std, welch_less, TTest};

/// One run's result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Score {
    /// The first evaluated step with a validation loss ≤ the target.
    pub steps: Option<u64>,
    /// The final validation loss (NaN for a diverged or unfinished run).
    pub final_loss: f64,
}

/// The budget, the evaluation interval and the rule's constants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    /// Training steps S.
    pub steps: u64,
    /// Steps between evaluations Δ.
    pub eval_every: u64,
    /// The significance level α of both tests.
    pub alpha: f64,
}

impl Rule {
    /// What a run that did not reach the target counts as: S + Δ.
    pub fn censored(&self) -> f64 {
        (self.steps + self.eval_every) as f64
    }

    /// Δ²/12: the variance of a crossing step known only to the evaluation interval.
    pub fn resolution_variance(&self) -> f64 {
        (self.eval_every as f64).powi(2) / 12.0
    }

    /// Every run's steps to target, misses counted as S + Δ.
    pub fn steps(&self, scores: &[Score]) -> Vec<f64> {
        let c = self.censored();
        scores
            .iter()
            .map(|s| s.steps.map_or(c, |k| k as f64))
            .collect()
    }
}

/// The first step of `points` (step, validation loss), in step order, whose loss is ≤ `target`.
pub fn steps_to_target(points: &[(u64, f64)], target: f64) -> Option<u64> {
    points.iter().find(|(_, l)| *l <= target).map(|(s, _)| *s)
}

/// The runs that reached the target.
pub fn reached(scores: &[Score]) -> usize {
    scores.iter().filter(|s| s.steps.is_some()).count()
}

/// The final losses with a diverged or unfinished run (NaN) as +∞.
fn finals(scores: &[Score]) -> Vec<f64> {
    scores
        .iter()
        .map(|s| {
            if s.final_loss.is_nan() {
                f64::INFINITY
            } else {
                s.final_loss
            }
        })
        .collect()
}

/// The mean final loss, a diverged run counting as +∞ (NaN for no runs).
pub fn mean_final(scores: &[Score]) -> f64 {
    mean(&finals(scores))
}

/// The index of the best grid value: the lowest [`mean_final`], ties to the first; `None`
/// when no grid value has a run.
pub fn best_lr(grid: &[Vec<Score>]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, scores) in grid.iter().enumerate() {
        let m = mean_final(scores);
        if scores.is_empty() || m.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| m < b) {
            best = Some((i, m));
        }
    }
    best.map(|(i, _)| i)
}

/// The ranking of entrants (their runs at their best lr): indices into `entrants`, best first
/// (see the module docs). Entrants without runs are left out.
pub fn rank(entrants: &[Vec<Score>], rule: &Rule) -> Vec<usize> {
    let key = |s: &[Score]| {
        let share = reached(s) as f64 / s.len() as f64;
        (-share, mean(&rule.steps(s)), mean_final(s))
    };
    let mut order: Vec<usize> = (0..entrants.len())
        .filter(|&i| !entrants[i].is_empty())
        .collect();
    // A stable sort: equal keys keep the config's order.
    order.sort_by(|&a, &b| {
        let (ka, kb) = (key(&entrants[a]), key(&entrants[b]));
        ka.0.total_cmp(&kb.0)
            .then(ka.1.total_cmp(&kb.1))
            .then(ka.2.total_cmp(&kb.2))
    });
    order
}

/// How entrant A compares with entrant B on steps to target.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// A is faster: the test that A needs fewer steps has p < α.
    Faster(TTest),
    /// A is slower: the test that B needs fewer steps has p < α.
    Slower(TTest),
    /// Neither test has p < α (the test of A faster, or when only the other was possible,
    /// that one).
    NoDifference(TTest),
    /// No test is possible: fewer than 2 seeds on a side, or neither reached the target in
    /// every seed.
    NotTested,
}

/// A against B under `rule` (see the module docs).
pub fn compare(a: &[Score], b: &[Score], rule: &Rule) -> Verdict {
    let v = rule.resolution_variance();
    let all = |s: &[Score]| !s.is_empty() && reached(s) == s.len();
    let faster = all(a)
        .then(|| welch_less(&rule.steps(a), &rule.steps(b), v))
        .flatten();
    let slower = all(b)
        .then(|| welch_less(&rule.steps(b), &rule.steps(a), v))
        .flatten();
    match (faster, slower) {
        (Some(t), _) if t.p < rule.alpha => Verdict::Faster(t),
        (_, Some(t)) if t.p < rule.alpha => Verdict::Slower(t),
        (Some(t), _) | (None, Some(t)) => Verdict::NoDifference(t),
        (None, None) => Verdict::NotTested,
    }
}

impl Verdict {
    /// The table cell: `faster (p = 0.003)`, `slower (p = …)`, `no difference (p = …)` or `—`.
    pub fn cell(&self) -> String {
        match self {
            Verdict::Faster(t) => format!("faster (p = {})", p_value(t.p)),
            Verdict::Slower(t) => format!("slower (p = {})", p_value(t.p)),
            Verdict::NoDifference(t) => format!("no difference (p = {})", p_value(t.p)),
            Verdict::NotTested => crate::report::cells::MISSING.into(),
        }
    }
}

/// The entry rule: the one-sample test that the mean final loss is below `target` (`None`
/// for fewer than 2 runs); a diverged run fails it (its loss is +∞).
pub fn entry(scores: &[Score], target: f64) -> Option<TTest> {
    let f = finals(scores);
    if f.iter().any(|x| x.is_infinite()) {
        return (f.len() >= 2).then_some(TTest {
            t: f64::NEG_INFINITY,
            df: f.len() as f64 - 1.0,
            p: 1.0,
        });
    }
    mean_below(&f, target)
}

/// The entry rule's cell: `qualifies (p = …)`, `does not qualify (p = …)`, or the reason it
/// was not tested.
pub fn entry_cell(scores: &[Score], target: f64, alpha: f64) -> String {
    match entry(scores, target) {
        Some(t) if t.p < alpha => format!("qualifies (p = {})", p_value(t.p)),
        Some(t) => format!("does not qualify (p = {})", p_value(t.p)),
        None => format!("not tested ({} seed)", scores.len()),
    }
}

/// A p-value for a table: 4 decimals, `< 1e-4` below that.
pub fn p_value(p: f64) -> String {
    if p < 1e-4 {
        "< 1e-4".into()
    } else {
        format!("{p:.4}")
    }
}

/// Mean ± std of the steps of the runs that reached the target (NaN mean for none).
pub fn reached_steps(scores: &[Score]) -> (f64, f64) {
    let s: Vec<f64> = scores
        .iter()
        .filter_map(|s| s.steps)
        .map(|k| k as f64)
        .collect();
    mean_std(&s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Rule = Rule {
        steps: 100,
        eval_every: 5,
        alpha: 0.05,
    };

    fn runs(steps: &[Option<u64>], loss: f64) -> Vec<Score> {
        steps
            .iter()
            .enumerate()
            .map(|(i, &s)| Score {
                steps: s,
                final_loss: loss + 0.01 * i as f64,
            })
            .collect()
    }

    #[test]
    fn steps_to_target_is_the_first_evaluation_at_or_below_it() {
        let points = [(0, 4.0), (5, 3.0), (10, 2.5), (15, 2.6), (20, 2.0)];
        assert_eq!(steps_to_target(&points, 2.5), Some(10));
        assert_eq!(steps_to_target(&points, 1.0), None);
        assert_eq!(steps_to_target(&[], 1.0), None);
    }

    #[test]
    fn the_best_lr_has_the_lowest_mean_final_loss_and_a_diverged_seed_loses() {
        let diverged = vec![
            Score {
                steps: Some(10),
                final_loss: 1.0,
            },
            Score {
                steps: None,
                final_loss: f64::NAN,
            },
        ];
        let grid = vec![runs(&[None, None], 3.0), diverged, runs(&[None, None], 2.5)];
        assert_eq!(best_lr(&grid), Some(2));
        // Ties go to the first grid value; empty grid values are skipped.
        let tie = vec![vec![], runs(&[None], 2.0), runs(&[None], 2.0)];
        assert_eq!(best_lr(&tie), Some(1));
        assert_eq!(best_lr(&[vec![], vec![]]), None);
        // Every value diverged: the first is kept (all +∞).
        let nan = Score {
            steps: None,
            final_loss: f64::NAN,
        };
        assert_eq!(best_lr(&[vec![nan], vec![nan]]), Some(0));
    }

    #[test]
    fn the_ranking_puts_reached_first_then_fewer_steps_then_lower_loss() {
        let entrants = vec![
            runs(&[None, None, None], 2.0), // 0: never reached, lower loss
            runs(&[Some(50), Some(55), Some(60)], 2.9), // 1
            runs(&[Some(30), Some(35), Some(40)], 3.0), // 2: fastest
            runs(&[None, None, None], 2.5), // 3: never reached
            runs(&[Some(30), Some(35), Some(40)], 2.8), // 4: as fast as 2, lower loss
            runs(&[Some(20), None, Some(20)], 1.0), // 5: 2 of 3 reached
            vec![],                         // 6: no runs
        ];
        assert_eq!(rank(&entrants, &RULE), [4, 2, 1, 5, 0, 3]);
        // Equal keys keep the config's order.
        let same = vec![runs(&[Some(10)], 2.0), runs(&[Some(10)], 2.0)];
        assert_eq!(rank(&same, &RULE), [0, 1]);
    }

    #[test]
    fn faster_slower_and_no_difference() {
        let fast = runs(&[Some(30), Some(35), Some(30)], 2.0);
        let slow = runs(&[Some(60), Some(65), Some(60)], 2.0);
        assert!(matches!(compare(&fast, &slow, &RULE), Verdict::Faster(t) if t.p < 0.05));
        assert!(matches!(compare(&slow, &fast, &RULE), Verdict::Slower(t) if t.p < 0.05));
        // Identical steps at the evaluation resolution: p = ½ both ways.
        let same = compare(&fast, &fast, &RULE);
        assert!(
            matches!(same, Verdict::NoDifference(t) if t.p == 0.5),
            "{same:?}"
        );
        assert!(same.cell().starts_with("no difference (p = 0.5000"));
        // One interval apart in every seed, 3 seeds each: the resolution variance Δ²/12 keeps
        // t finite, t = 5/√(2·(25/12)/3) = 4.243 on 4 degrees of freedom, p = 0.0066.
        let near = runs(&[Some(35), Some(35), Some(35)], 2.0);
        let nearer = runs(&[Some(30), Some(30), Some(30)], 2.0);
        let Verdict::Faster(t) = compare(&nearer, &near, &RULE) else {
            panic!("not faster")
        };
        assert!((t.t - 18.0f64.sqrt()).abs() < 1e-12 && (t.df - 4.0).abs() < 1e-12);
        assert!((t.p - 0.0066).abs() < 1e-4, "{}", t.p);
    }

    #[test]
    fn misses_count_as_the_budget_plus_an_interval() {
        let fast = runs(&[Some(30), Some(35), Some(30)], 2.0);
        let missed = runs(&[None, None, None], 2.0);
        assert_eq!(RULE.steps(&missed), [105.0; 3]);
        assert!(matches!(compare(&fast, &missed, &RULE), Verdict::Faster(_)));
        assert!(matches!(compare(&missed, &fast, &RULE), Verdict::Slower(_)));
        // Neither reached in every seed: no test.
        let partly = runs(&[Some(30), None, Some(30)], 2.0);
        assert_eq!(compare(&partly, &missed, &RULE), Verdict::NotTested);
        assert_eq!(compare(&partly, &missed, &RULE).cell(), "—");
    }

    #[test]
    fn one_seed_is_not_tested() {
        let a = runs(&[Some(10)], 2.0);
        let b = runs(&[Some(90)], 2.0);
        assert_eq!(compare(&a, &b, &RULE), Verdict::NotTested);
        assert_eq!(entry(&a, 3.0), None);
        assert_eq!(entry_cell(&a, 3.0, 0.05), "not tested (1 seed)");
    }

    #[test]
    fn the_entry_rule_tests_the_final_loss_against_the_target() {
        // Final losses 2.00, 2.01, 2.02: well below 2.5, not below 2.0.
        let r = runs(&[None, None, None], 2.0);
        assert!(entry_cell(&r, 2.5, 0.05).starts_with("qualifies (p = "));
        assert!(entry_cell(&r, 2.0, 0.05).starts_with("does not qualify (p = "));
        let mut d = r.clone();
        d[1].final_loss = f64::NAN;
        assert_eq!(entry(&d, 2.5).map(|t| t.p), Some(1.0));
        assert_eq!(p_value(1e-6), "< 1e-4");
    }
}
