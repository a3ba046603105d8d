//! Units of work: what `reproduce` runs, cut into independent pieces that a cluster can
//! schedule one by one.
//!
//! A unit is one (experiment, seed) run: its run folder `<results>/<name>/<scale>/seed-<n>/`
//! is its own, no other unit writes there, and its id is that folder's path under the results
//! folder (`vit-fmnist/cpu/seed-1`), so the id is stable and says where its output lies. An
//! experiment's variants are not separate units: they share the run's `metrics.jsonl` and run
//! in turn (a finished variant is kept when a unit resumes).
//!
//! Each unit carries its expected [`Cost`] at its scale, read from the repository's
//! `experiments/costs.toml` (the minutes measured at the cpu scale on a 2-core CPU, and
//! estimates, stated as such, for the larger scales), and, when the results folder already
//! holds a run of it, the minutes that run took.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::registry::ResolvedConfig;
use crate::report::cells::MISSING;
use crate::run::RunRecord;
use crate::{RegisteredExperiment, Scale};

/// The cost table, `experiments/costs.toml`: experiment → scale → cost.
const COSTS: &str = include_str!("../../../experiments/costs.toml");

/// What one unit needs, per seed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    /// Whether the unit wants a GPU at this scale (it runs on any `--device`).
    pub gpu: bool,
    /// Peak memory, GiB (GPU memory when `gpu`).
    pub memory_gib: f64,
    /// Expected wall minutes.
    pub minutes: f64,
    /// Where `minutes` comes from: a measurement (CPU, threads, what was timed) or an estimate
    /// (how it was made).
    pub basis: String,
}

/// One independent piece of a reproduction.
#[derive(Clone, Debug, Serialize)]
pub struct Unit {
    /// `<experiment>/<scale>/seed-<n>`: also the run folder under the results folder.
    pub id: String,
    /// The experiment's registry name.
    pub experiment: String,
    /// The scale.
    pub scale: String,
    /// The seed.
    pub seed: u32,
    /// The expected cost.
    pub cost: Cost,
    /// Minutes the unit's earlier run took (its `run.json`), when there is one.
    pub measured_minutes: Option<f64>,
    /// The resolved config the unit runs (what its `config.toml` records under `[config]`).
    pub config: toml::Table,
}

impl Unit {
    /// The unit's run folder under `results`.
    pub fn dir(&self, results: &Path) -> PathBuf {
        results.join(&self.id)
    }
}

/// The id of seed `seed` of `experiment` at `scale`.
pub fn unit_id(experiment: &str, scale: Scale, seed: u32) -> String {
    format!("{experiment}/{}/seed-{seed}", scale.name())
}

/// The ids of every unit of `experiments` at `scale` with `seeds` each (`None`: each
/// experiment's default): what a complete report covers.
pub fn unit_ids(
    experiments: &[Box<dyn RegisteredExperiment>],
    scale: Scale,
    seeds: Option<u32>,
) -> Vec<String> {
    experiments
        .iter()
        .flat_map(|e| (0..seeds_of(&**e, scale, seeds)).map(|s| unit_id(e.name(), scale, s)))
        .collect()
}

fn seeds_of(e: &dyn RegisteredExperiment, scale: Scale, seeds: Option<u32>) -> u32 {
    seeds.unwrap_or_else(|| e.default_seeds(scale))
}

/// The cost table, parsed.
pub fn cost_table() -> Result<BTreeMap<String, BTreeMap<String, Cost>>> {
    toml::from_str(COSTS).context("experiments/costs.toml")
}

/// The units of `experiments` with their resolved `configs`, `seeds` each (`None`: each
/// experiment's default), in registry order, seeds ascending; `results` is read for the
/// earlier runs' times.
pub fn plan(
    experiments: &[Box<dyn RegisteredExperiment>],
    configs: &[ResolvedConfig],
    scale: Scale,
    seeds: Option<u32>,
    results: &Path,
) -> Result<Vec<Unit>> {
    let costs = cost_table()?;
    let mut units = Vec::new();
    for (e, config) in experiments.iter().zip(configs) {
        let cost = costs
            .get(e.name())
            .and_then(|by_scale| by_scale.get(scale.name()))
            .with_context(|| {
                format!(
                    "experiments/costs.toml has no {}.{}",
                    e.name(),
                    scale.name()
                )
            })?;
        for seed in 0..seeds_of(&**e, scale, seeds) {
            let id = unit_id(e.name(), scale, seed);
            let measured_minutes = RunRecord::read(&results.join(&id))
                .ok()
                .map(|r| r.info.wall_seconds / 60.0);
            units.push(Unit {
                id,
                experiment: e.name().to_string(),
                scale: scale.name().to_string(),
                seed,
                cost: cost.clone(),
                measured_minutes,
                config: config.table().clone(),
            });
        }
    }
    Ok(units)
}

/// The units of `plan` named by `ids`, in plan order; an id not in the plan is an error that
/// lists the plan's ids.
pub fn pick<'a>(plan: &'a [Unit], ids: &[String]) -> Result<Vec<&'a Unit>> {
    for id in ids {
        if !plan.iter().any(|u| &u.id == id) {
            let known: Vec<&str> = plan.iter().map(|u| u.id.as_str()).collect();
            bail!(
                "--unit {id} is not a unit of this plan (same --scale, --only, --seeds and \
                 --config as the plan?); its units: {}",
                known.join(", ")
            );
        }
    }
    Ok(plan.iter().filter(|u| ids.contains(&u.id)).collect())
}

/// The plan as a table for the terminal: id, device, memory, expected and measured minutes,
/// and the total.
pub fn render(plan: &[Unit]) -> String {
    let mut out =
        String::from("unit                          wants  memory   expected  last run\n");
    for u in plan {
        let last = u
            .measured_minutes
            .map_or(MISSING.to_string(), |m| format!("{m:.1} min"));
        out.push_str(&format!(
            "{:<29} {:<6} {:>5.1} GiB {:>6.1} min  {last}\n",
            u.id,
            if u.cost.gpu { "gpu" } else { "cpu" },
            u.cost.memory_gib,
            u.cost.minutes,
        ));
    }
    let total: f64 = plan.iter().map(|u| u.cost.minutes).sum();
    out.push_str(&format!(
        "{} unit(s), {:.1} hours expected in all\n",
        plan.len(),
        total / 60.0
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_config_has_a_cost_and_every_cost_a_config() {
        let costs = cost_table().unwrap();
        for b in crate::config::builtins() {
            let cost = costs
                .get(b.experiment)
                .and_then(|s| s.get(b.scale.name()))
                .unwrap_or_else(|| panic!("no cost for {}.{}", b.experiment, b.scale));
            assert!(cost.minutes > 0.0 && cost.memory_gib > 0.0, "{cost:?}");
            assert!(!cost.basis.is_empty());
        }
        for (name, by_scale) in &costs {
            for scale in by_scale.keys() {
                let scale: Scale = scale.parse().unwrap();
                assert!(
                    crate::config::has_builtin(name, scale),
                    "costs.toml has {name}.{scale}, which has no config"
                );
            }
        }
    }
}
