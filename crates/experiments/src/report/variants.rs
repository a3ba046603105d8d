//! The records of experiments that train several variants per run (`vit-fmnist`, `gpt-sotu`,
//! `manifolds`), grouped by variant: one value per run that logged the variant.

use std::collections::BTreeMap;

use anyhow::Result;
use kappa_train::MetricsLine;

use crate::run::{RunRecord, RunStatus};

/// Every variant's per-run values, and the variants in the order they first appear.
pub struct Variants<T> {
    /// Variant names in order of first appearance (the configured order; the baseline first).
    pub order: Vec<String>,
    /// Variant name → one value per run that logged it, in run order.
    pub runs: BTreeMap<String, Vec<T>>,
}

/// Reads the `metrics.jsonl` of every run and folds each of its lines, in order, into that run's
/// value of the line's variant. A run that did not fail contributes every variant (a diverged
/// variant is a result); a failed or interrupted run contributes only the variants it finished
/// (those with a summary line), so a long unit stopped part way still reports what it settled.
pub fn read_variants<T: Default>(
    runs: &[RunRecord],
    mut add: impl FnMut(&mut T, MetricsLine),
) -> Result<Variants<T>> {
    let mut order = Vec::new();
    let mut all: BTreeMap<String, Vec<T>> = BTreeMap::new();
    for run in runs {
        let lines = run.metrics::<MetricsLine>()?;
        let failed = matches!(run.info.status, RunStatus::Failed { .. });
        let finished: Vec<String> = lines
            .iter()
            .filter(|l| l.summary.is_some())
            .map(|l| l.variant.clone())
            .collect();
        let mut this: BTreeMap<String, T> = BTreeMap::new();
        for line in lines {
            if failed && !finished.contains(&line.variant) {
                continue;
            }
            if !order.contains(&line.variant) {
                order.push(line.variant.clone());
            }
            add(this.entry(line.variant.clone()).or_default(), line);
        }
        for (variant, value) in this {
            all.entry(variant).or_default().push(value);
        }
    }
    Ok(Variants { order, runs: all })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kappa_train::{Outcome, Run, RunContext, VariantResult};

    fn line(variant: &str, summary: bool) -> MetricsLine {
        MetricsLine {
            variant: variant.into(),
            record: None,
            summary: summary.then_some(VariantResult {
                outcome: Outcome::Completed,
                metric: 1.0,
                seconds_per_step: 0.1,
                units_per_second: 10.0,
                resumed_at: None,
            }),
        }
    }

    /// An interrupted run reports the variants it finished and drops the one it was training.
    #[test]
    fn an_interrupted_run_reports_its_finished_variants() {
        let dir = std::env::temp_dir().join(format!("kappa-variants-{}", std::process::id()));
        let mut run = Run::create(&dir, RunContext::default().quiet(), &0u8).unwrap();
        for l in [line("A", false), line("A", true), line("B", false)] {
            run.log(&l).unwrap();
        }
        let error = "interrupted after step 7".to_string();
        run.finish(RunStatus::Failed { error }).unwrap();
        let record = RunRecord::read(&dir).unwrap();
        let v = read_variants(&[record], |n: &mut usize, _| *n += 1).unwrap();
        assert_eq!(v.order, ["A"]);
        assert_eq!(v.runs["A"], [2]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
