//! The records of experiments that train several variants per run (`vit-fmnist`, `gpt-sotu`,
//! `manifolds`), grouped by variant: one value per run that logged the variant.

use std::collections::BTreeMap;

use anyhow::Result;
use kappa_train::Line;

use crate::run::{RunRecord, RunStatus};

/// Every variant's per-run values, and the variants in the order they first appear.
pub struct Variants<T> {
    /// Variant names in order of first appearance (the configured order; the baseline first).
    pub order: Vec<String>,
    /// Variant name → one value per run that logged it, in run order.
    pub runs: BTreeMap<String, Vec<T>>,
}

/// Reads the `metrics.jsonl` of every run that did not fail (a diverged variant is a result)
/// and folds each of its lines, in order, into that run's value of the line's variant.
pub fn read_variants<T: Default>(
    runs: &[RunRecord],
    mut add: impl FnMut(&mut T, Line),
) -> Result<Variants<T>> {
    let mut order = Vec::new();
    let mut all: BTreeMap<String, Vec<T>> = BTreeMap::new();
    for run in runs {
        if matches!(run.info.status, RunStatus::Failed { .. }) {
            continue;
        }
        let mut this: BTreeMap<String, T> = BTreeMap::new();
        for line in run.metrics::<Line>()? {
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
