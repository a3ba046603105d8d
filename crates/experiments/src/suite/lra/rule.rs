//! The two rules of the `lra` report, pure functions of the logged accuracies.
//!
//! **The best λ of the sweep** ([`best_lambda`]): each candidate λ has one final validation
//! accuracy per seed (the last evaluation, on the whole validation split), or none for a seed
//! where it diverged or logged no evaluation. A candidate is eligible when it has at least one
//! seed and a finite value on every seed it ran (a λ that diverged once is not the best); the
//! eligible candidate with the highest mean validation accuracy over its seeds is chosen, and a
//! tie of means goes to the smaller λ (the smaller intervention). No eligible candidate: no
//! best λ. The test split is never looked at.
//!
//! **The verdict on a claim "conditioning improves accuracy"** ([`verdict`]), from the test
//! accuracies of the baseline and the conditioned variant over seeds, at level α:
//!
//! 1. *not reproduced* when the conditioned variant diverged on more seeds than the baseline;
//! 2. *inconclusive* when either has fewer than 2 completed seeds (no test is possible);
//! 3. with Δ = mean(conditioned) − mean(baseline) and Welch's one-sided t-tests
//!    ([`welch_less`]): *reproduced* when Δ > 0 and the test that the baseline's mean is below
//!    the conditioned one's gives p < α; *not reproduced* when Δ < 0 and the opposite test
//!    gives p < α; *inconclusive* otherwise (the seeds cannot tell the two apart at α).

use crate::stats::{mean, welch_less, TTest};

/// One candidate λ of the sweep: its final validation accuracy per seed (`None`: the seed
/// diverged or logged no evaluation).
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// λ.
    pub lambda: f64,
    /// One value per seed that ran it.
    pub validation: Vec<Option<f64>>,
}

impl Candidate {
    /// The mean validation accuracy when the candidate is eligible (module docs).
    fn score(&self) -> Option<f64> {
        let values: Option<Vec<f64>> = self
            .validation
            .iter()
            .map(|v| v.filter(|x| x.is_finite()))
            .collect();
        values.filter(|v| !v.is_empty()).map(|v| mean(&v))
    }
}

/// The index of the best candidate (module docs), `None` when none is eligible.
pub fn best_lambda(candidates: &[Candidate]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, c) in candidates.iter().enumerate() {
        let Some(score) = c.score() else { continue };
        let better = match best {
            None => true,
            Some((b, s)) => score > s || (score == s && c.lambda < candidates[b].lambda),
        };
        if better {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

/// A variant's test accuracies over seeds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcomes {
    /// Test accuracy of every completed seed.
    pub accuracies: Vec<f64>,
    /// Seeds that diverged.
    pub diverged: usize,
}

/// The verdict on "conditioning improves accuracy" for one variant (module docs).
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Δ > 0 and significant at α.
    Reproduced {
        /// The mean difference, conditioned − baseline.
        delta: f64,
        /// The test that the baseline's mean is lower.
        test: TTest,
    },
    /// Δ < 0 and significant at α, or more divergence than the baseline.
    NotReproduced {
        /// Why, with the numbers.
        reason: String,
    },
    /// The seeds cannot decide.
    Inconclusive {
        /// Why, with the numbers.
        reason: String,
    },
}

impl Verdict {
    /// The table cell: the verdict in words, then its numbers.
    pub fn cell(&self) -> String {
        match self {
            Verdict::Reproduced { delta, test } => format!(
                "reproduced (Δ = {:+.2}, p = {})",
                100.0 * delta,
                p_value(test.p)
            ),
            Verdict::NotReproduced { reason } => format!("not reproduced ({reason})"),
            Verdict::Inconclusive { reason } => format!("inconclusive ({reason})"),
        }
    }
}

/// A p-value for a table: 3 significant digits, or `< 1e-4`.
pub fn p_value(p: f64) -> String {
    if p < 1e-4 {
        "< 1e-4".into()
    } else {
        format!("{p:.3}")
    }
}

/// Decides the claim for `conditioned` against `baseline` at level `alpha` (module docs).
pub fn verdict(baseline: &Outcomes, conditioned: &Outcomes, alpha: f64) -> Verdict {
    if conditioned.diverged > baseline.diverged {
        return Verdict::NotReproduced {
            reason: format!(
                "diverged on {} seed(s), the baseline on {}",
                conditioned.diverged, baseline.diverged
            ),
        };
    }
    let (b, c) = (&baseline.accuracies, &conditioned.accuracies);
    let (Some(up), Some(down)) = (welch_less(b, c, 0.0), welch_less(c, b, 0.0)) else {
        return Verdict::Inconclusive {
            reason: format!(
                "{} and {} completed seeds; a test needs 2 on each side",
                b.len(),
                c.len()
            ),
        };
    };
    let delta = mean(c) - mean(b);
    if delta > 0.0 && up.p < alpha {
        Verdict::Reproduced { delta, test: up }
    } else if delta < 0.0 && down.p < alpha {
        Verdict::NotReproduced {
            reason: format!(
                "Δ = {:+.2}, lower with p = {}",
                100.0 * delta,
                p_value(down.p)
            ),
        }
    } else {
        let p = if delta >= 0.0 { up.p } else { down.p };
        Verdict::Inconclusive {
            reason: format!("Δ = {:+.2}, p = {} ≥ α", 100.0 * delta, p_value(p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(lambda: f64, validation: &[Option<f64>]) -> Candidate {
        Candidate {
            lambda,
            validation: validation.to_vec(),
        }
    }

    fn done(accuracies: &[f64]) -> Outcomes {
        Outcomes {
            accuracies: accuracies.to_vec(),
            diverged: 0,
        }
    }

    #[test]
    fn the_best_lambda_has_the_highest_mean_validation_accuracy() {
        let c = [
            cand(0.1, &[Some(0.50), Some(0.60)]),
            cand(0.3, &[Some(0.58), Some(0.58)]),
            cand(1.0, &[Some(0.70), Some(0.40)]),
        ];
        // Means 0.55, 0.58, 0.55.
        assert_eq!(best_lambda(&c), Some(1));
    }

    #[test]
    fn a_tie_goes_to_the_smaller_lambda_whatever_the_order() {
        let c = [
            cand(3.0, &[Some(0.6), Some(0.4)]),
            cand(0.3, &[Some(0.5), Some(0.5)]),
            cand(1.0, &[Some(0.4), Some(0.6)]),
        ];
        assert_eq!(best_lambda(&c), Some(1));
        let reversed: Vec<Candidate> = c.iter().rev().cloned().collect();
        assert_eq!(reversed[best_lambda(&reversed).unwrap()].lambda, 0.3);
    }

    #[test]
    fn a_lambda_with_a_missing_or_diverged_seed_is_not_eligible() {
        let c = [
            cand(0.1, &[Some(0.9), None]),
            cand(0.3, &[Some(0.9), Some(f64::NAN)]),
            cand(1.0, &[]),
            cand(3.0, &[Some(0.2), Some(0.3)]),
        ];
        assert_eq!(best_lambda(&c), Some(3));
        assert_eq!(best_lambda(&c[..3]), None);
        assert_eq!(best_lambda(&[]), None);
    }

    #[test]
    fn a_clear_gain_is_reproduced_and_a_clear_loss_is_not() {
        let base = done(&[0.60, 0.61, 0.62]);
        let better = done(&[0.70, 0.71, 0.72]);
        match verdict(&base, &better, 0.05) {
            Verdict::Reproduced { delta, test } => {
                assert!((delta - 0.10).abs() < 1e-12);
                assert!(test.p < 0.05);
            }
            v => panic!("{v:?}"),
        }
        let v = verdict(&better, &base, 0.05);
        assert!(matches!(v, Verdict::NotReproduced { .. }), "{v:?}");
        assert!(
            v.cell().starts_with("not reproduced (Δ = -10.00"),
            "{}",
            v.cell()
        );
    }

    #[test]
    fn overlapping_seeds_and_too_few_seeds_are_inconclusive() {
        let base = done(&[0.60, 0.70, 0.65]);
        let noisy = done(&[0.62, 0.72, 0.64]);
        let v = verdict(&base, &noisy, 0.05);
        assert!(matches!(v, Verdict::Inconclusive { .. }), "{v:?}");
        // A small loss within the noise is inconclusive too, not "not reproduced".
        let v = verdict(&noisy, &base, 0.05);
        assert!(matches!(v, Verdict::Inconclusive { .. }), "{v:?}");
        let one = done(&[0.9]);
        let v = verdict(&base, &one, 0.05);
        assert!(v.cell().contains("a test needs 2"), "{}", v.cell());
        // Equal samples: Δ = 0, never reproduced.
        let v = verdict(&base, &base, 0.05);
        assert!(matches!(v, Verdict::Inconclusive { .. }), "{v:?}");
    }

    #[test]
    fn more_divergence_than_the_baseline_is_not_reproduced() {
        let base = done(&[0.60, 0.61, 0.62]);
        let unstable = Outcomes {
            accuracies: vec![0.9, 0.9],
            diverged: 1,
        };
        let v = verdict(&base, &unstable, 0.05);
        assert!(v.cell().contains("diverged on 1 seed(s)"), "{}", v.cell());
        // Divergence on both sides equally is left to the test on the completed seeds.
        let both = Outcomes {
            accuracies: base.accuracies.clone(),
            diverged: 1,
        };
        let v = verdict(&both, &unstable, 0.05);
        assert!(matches!(v, Verdict::Reproduced { .. }), "{v:?}");
    }
}
