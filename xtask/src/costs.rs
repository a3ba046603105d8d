//! `cargo xtask costs [--results DIR]… [--refresh]`: the run times of `experiments/costs.toml`
//! from the runs themselves.
//!
//! Every `run.json` under the results folders (`<results>/<name>/<scale>/seed-<n>/run.json`,
//! kappa-train's `RunInfo`) records the run's experiment and scale, its seed and libtorch
//! threads, how it ended and its wall seconds. The completed runs of each (experiment, scale)
//! that `costs.toml` has an entry for give that entry's `minutes` (the median over the seeds,
//! to 0.1 min) and `basis` ("measured: median of N seeds, X–Y min, ⟨CPU model⟩, --threads T,
//! ⟨date of the latest run⟩"); failed, diverged and interrupted runs do not count. The file is
//! edited in place with `toml_edit`, so its comments, layout and every other entry stay as they
//! are. Without `--refresh` the command only shows what a refresh would change.
//!
//! The CPU model is the one the runs' `run.json` files record (`hosts`, every CPU that computed
//! a run); where a run records none, this machine's (`/proc/cpuinfo`): refresh such runs on the
//! machine that ran them.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Args;
use serde::Deserialize;
use toml_edit::{DocumentMut, Value};

use crate::workspace::Workspace;

/// Arguments of `cargo xtask costs`.
#[derive(Args)]
pub struct CostsArgs {
    /// Results folders to read run.json files from (repeatable; default `results/`).
    #[arg(long = "results")]
    results: Vec<PathBuf>,
    /// Write the measured minutes into experiments/costs.toml (without it: only show them).
    #[arg(long)]
    refresh: bool,
}

/// The part of a `run.json` this command reads.
#[derive(Debug, Deserialize)]
struct RunJson {
    run: RunContext,
    status: String,
    wall_seconds: f64,
    started_unix: u64,
    /// The CPUs (and sources) that computed the run; absent in older folders.
    #[serde(default)]
    hosts: Vec<HostJson>,
}

/// One entry of `run.json`'s `hosts`.
#[derive(Debug, Deserialize)]
struct HostJson {
    cpu: String,
}

/// The run's context, as `run.json` records it.
#[derive(Debug, Deserialize)]
struct RunContext {
    #[serde(alias = "experiment")]
    name: String,
    scale: String,
    seed: u64,
    threads: usize,
}

/// One completed run.
#[derive(Clone, Debug, PartialEq)]
struct Completed {
    seed: u64,
    minutes: f64,
    threads: usize,
    started: u64,
    /// The CPUs its `run.json` records (empty: none recorded).
    cpus: Vec<String>,
}

/// The completed runs of one (experiment, scale).
type Runs = Vec<Completed>;

/// Every `run.json` under `dir` (any depth).
fn run_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for path in entries.flatten().map(|e| e.path()) {
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "run.json") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The completed runs under `dirs`, per (experiment, scale); a seed seen twice (the same unit
/// in two results folders) counts once, its latest run.
fn completed_runs(dirs: &[PathBuf]) -> BTreeMap<(String, String), Runs> {
    let mut by_seed: BTreeMap<(String, String, u64), Completed> = BTreeMap::new();
    for path in dirs.iter().flat_map(|d| run_files(d)) {
        let Some(run) = fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<RunJson>(&t).ok())
        else {
            eprintln!("xtask costs: skipping {} (not a run.json)", path.display());
            continue;
        };
        if run.status != "completed" {
            continue;
        }
        let value = Completed {
            seed: run.run.seed,
            minutes: run.wall_seconds / 60.0,
            threads: run.run.threads,
            started: run.started_unix,
            cpus: run.hosts.into_iter().map(|h| h.cpu).collect(),
        };
        let key = (run.run.name, run.run.scale, run.run.seed);
        if by_seed
            .get(&key)
            .is_none_or(|old| old.started <= value.started)
        {
            by_seed.insert(key, value);
        }
    }
    let mut runs: BTreeMap<(String, String), Runs> = BTreeMap::new();
    for ((name, scale, _), run) in by_seed {
        runs.entry((name, scale)).or_default().push(run);
    }
    runs
}

/// The median of `xs` (not empty).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        0.5 * (xs[n / 2 - 1] + xs[n / 2])
    }
}

/// The new `minutes` (to 0.1, at least 0.1) and `basis` of an entry from its runs (not empty);
/// the CPUs are the ones the runs record, or `this_cpu` when one of them records none.
fn measured(runs: &Runs, this_cpu: &str) -> (f64, String) {
    let minutes: Vec<f64> = runs.iter().map(|r| r.minutes).collect();
    let (lo, hi) = minutes
        .iter()
        .fold((f64::INFINITY, 0f64), |(lo, hi), &m| (lo.min(m), hi.max(m)));
    // To 0.1 min as the range prints it (so 1.25 reads 1.2 in both), never below 0.1.
    let mid = format!("{:.1}", median(minutes.clone()))
        .parse::<f64>()
        .map_or(0.1, |m| m.max(0.1));
    let mut threads: Vec<String> = runs.iter().map(|r| r.threads.to_string()).collect();
    threads.sort();
    threads.dedup();
    let cpu = match runs.iter().all(|r| !r.cpus.is_empty()) {
        true => {
            let mut cpus: Vec<&str> = runs
                .iter()
                .flat_map(|r| &r.cpus)
                .map(String::as_str)
                .collect();
            cpus.sort();
            cpus.dedup();
            cpus.join(" and ")
        }
        false => this_cpu.to_string(),
    };
    let latest = runs.iter().map(|r| r.started).max().unwrap_or(0);
    let date = crate::publish::date(UNIX_EPOCH + Duration::from_secs(latest));
    let seeds = match runs.len() {
        1 => format!("1 seed, {lo:.1} min"),
        n => format!("median of {n} seeds, {lo:.1}–{hi:.1} min"),
    };
    let basis = format!(
        "measured: {seeds}, {cpu}, --threads {}, {date}",
        threads.join("/")
    );
    (mid, basis)
}

/// One entry's change, for the summary.
#[derive(Debug, PartialEq)]
struct Change {
    entry: String,
    old_minutes: Option<f64>,
    new_minutes: f64,
    basis: String,
}

/// Rewrites `minutes` and `basis` of the entries of `doc` that `runs` measured; returns what
/// changed and the measured pairs with no entry (left out: an entry needs a memory and a GPU
/// figure that only a person can give).
fn refresh(
    doc: &mut DocumentMut,
    runs: &BTreeMap<(String, String), Runs>,
    cpu: &str,
) -> (Vec<Change>, Vec<String>) {
    let (mut changes, mut missing) = (Vec::new(), Vec::new());
    for ((name, scale), seeds) in runs {
        let entry = doc
            .get_mut(name)
            .and_then(|t| t.get_mut(scale))
            .and_then(|e| e.as_inline_table_mut());
        let Some(entry) = entry else {
            missing.push(format!("{name}.{scale}"));
            continue;
        };
        let (minutes, basis) = measured(seeds, cpu);
        let old_minutes = entry.get("minutes").and_then(Value::as_float);
        let old_basis = entry.get("basis").and_then(Value::as_str).map(String::from);
        if old_minutes == Some(minutes) && old_basis.as_deref() == Some(basis.as_str()) {
            continue;
        }
        set(entry, "minutes", Value::from(minutes));
        set(entry, "basis", Value::from(basis.clone()));
        changes.push(Change {
            entry: format!("{name}.{scale}"),
            old_minutes,
            new_minutes: minutes,
            basis,
        });
    }
    (changes, missing)
}

/// Sets `key` of an inline table to `value`, keeping the spacing around the old value.
fn set(table: &mut toml_edit::InlineTable, key: &str, mut value: Value) {
    if let Some(old) = table.get_mut(key) {
        *value.decor_mut() = old.decor().clone();
        *old = value;
    } else {
        table.insert(key, value);
    }
}

/// The diff-like summary: one `-`/`+` pair per changed entry.
fn summary(changes: &[Change], missing: &[String]) -> String {
    let mut out = String::new();
    for c in changes {
        let old = c
            .old_minutes
            .map_or("none".to_string(), |m| format!("{m:.1}"));
        out.push_str(&format!(
            "- {} minutes = {old}\n+ {} minutes = {:.1} ({})\n",
            c.entry, c.entry, c.new_minutes, c.basis
        ));
    }
    if changes.is_empty() {
        out.push_str("no entry changes\n");
    }
    for m in missing {
        out.push_str(&format!(
            "  {m}: measured, but costs.toml has no entry (add it by hand)\n"
        ));
    }
    out
}

/// `cargo xtask costs`: the summary, and with `--refresh` the rewritten `experiments/costs.toml`.
pub fn costs(ws: &Workspace, args: &CostsArgs) -> Result<()> {
    let results = if args.results.is_empty() {
        vec![ws.root().join("results")]
    } else {
        args.results.clone()
    };
    let path = ws.root().join("experiments/costs.toml");
    let text = fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let mut doc: DocumentMut = text
        .parse()
        .with_context(|| format!("parsing {}", path.display()))?;
    let runs = completed_runs(&results);
    let (changes, missing) = refresh(&mut doc, &runs, &crate::publish::cpu_name());
    print!("{}", summary(&changes, &missing));
    if args.refresh && !changes.is_empty() {
        fs::write(&path, doc.to_string()).with_context(|| path.display().to_string())?;
        eprintln!("xtask costs: wrote {}", path.display());
    } else if !args.refresh && !changes.is_empty() {
        eprintln!(
            "xtask costs: --refresh writes these into {}",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const COSTS: &str = "# The header comment stays.\n\n\
        [theory]\n\
        smoke = { gpu = false, memory_gib = 0.5, minutes = 0.2, basis = \"upper bound\" }\n\
        cpu = { gpu = false, memory_gib = 0.5, minutes = 0.8, basis = \"old\" } # kept\n\n\
        [convergence]\n\
        cpu = { gpu = false, memory_gib = 1.0, minutes = 3.0, basis = \"measured: 6 min\" }\n";

    /// Writes a run.json for `name`/`scale`/`seed` under `dir`.
    fn run_json(dir: &Path, name: &str, scale: &str, seed: u64, status: &str, seconds: f64) {
        let unit = dir.join(name).join(scale).join(format!("seed-{seed}"));
        fs::create_dir_all(&unit).unwrap();
        let text = format!(
            r#"{{"run": {{"name": "{name}", "scale": "{scale}", "seed": {seed}, "threads": 2,
                "device": "cpu", "data_dir": "data"}}, "status": "{status}",
                "wall_seconds": {seconds}, "started_unix": 1764547200, "blas": "OpenBLAS"}}"#
        );
        fs::write(unit.join("run.json"), text).unwrap();
    }

    /// A results folder: theory at cpu with three completed seeds (1.0, 1.5, 3.0 min) and a
    /// failed one; convergence at smoke (no entry); a stray file.
    fn fixture() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kappa-costs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (seed, seconds) in [(0, 60.0), (1, 90.0), (2, 180.0)] {
            run_json(&dir, "theory", "cpu", seed, "completed", seconds);
        }
        run_json(&dir, "theory", "cpu", 3, "failed", 1.0);
        run_json(&dir, "convergence", "smoke", 0, "completed", 12.0);
        fs::write(dir.join("theory/cpu/notes.txt"), "not a run").unwrap();
        dir
    }

    #[test]
    fn completed_runs_refresh_their_entry_and_nothing_else() {
        let dir = fixture();
        let runs = completed_runs(std::slice::from_ref(&dir));
        assert_eq!(runs[&("theory".into(), "cpu".into())].len(), 3);
        let mut doc: DocumentMut = COSTS.parse().unwrap();
        let (changes, missing) = refresh(&mut doc, &runs, "Some CPU");
        let basis = "measured: median of 3 seeds, 1.0–3.0 min, Some CPU, --threads 2, 2025-12-01";
        assert_eq!(
            changes,
            vec![Change {
                entry: "theory.cpu".into(),
                old_minutes: Some(0.8),
                new_minutes: 1.5,
                basis: basis.into(),
            }]
        );
        assert_eq!(missing, vec!["convergence.smoke".to_string()]);
        let want = COSTS.replace(
            "minutes = 0.8, basis = \"old\"",
            &format!("minutes = 1.5, basis = \"{basis}\""),
        );
        assert_eq!(doc.to_string(), want);
        // A second refresh from the same runs changes nothing.
        let (again, _) = refresh(&mut doc, &runs, "Some CPU");
        assert!(again.is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_summary_shows_each_change_as_a_minus_and_a_plus_line() {
        let change = Change {
            entry: "theory.cpu".into(),
            old_minutes: Some(0.8),
            new_minutes: 1.5,
            basis: "measured: …".into(),
        };
        let text = summary(&[change], &["convergence.smoke".into()]);
        assert!(text
            .starts_with("- theory.cpu minutes = 0.8\n+ theory.cpu minutes = 1.5 (measured: …)\n"));
        assert!(text.contains("convergence.smoke: measured, but costs.toml has no entry"));
        assert_eq!(summary(&[], &[]), "no entry changes\n");
    }

    #[test]
    fn the_basis_names_the_cpus_the_runs_record() {
        let run = |seed, cpus: &[&str]| Completed {
            seed,
            minutes: 2.0,
            threads: 1,
            started: 0,
            cpus: cpus.iter().map(|c| c.to_string()).collect(),
        };
        let (a, b) = ("AMD EPYC (Avx2)", "Intel Xeon (Avx512)");
        let recorded = vec![run(0, &[b]), run(1, &[a, b])];
        let (_, basis) = measured(&recorded, "This CPU");
        assert!(
            basis.contains(&format!(", {a} and {b}, --threads 1")),
            "{basis}"
        );
        // One run without a record: this machine's CPU stands for all.
        let mixed = vec![run(0, &[a]), run(1, &[])];
        let (_, basis) = measured(&mixed, "This CPU");
        assert!(basis.contains(", This CPU, --threads 1"), "{basis}");
    }

    #[test]
    fn one_seed_gives_its_own_minutes() {
        let runs = vec![Completed {
            seed: 0,
            minutes: 0.04,
            threads: 1,
            started: 0,
            cpus: Vec::new(),
        }];
        let (minutes, basis) = measured(&runs, "CPU");
        assert_eq!(minutes, 0.1); // never below 0.1
        assert_eq!(
            basis,
            "measured: 1 seed, 0.0 min, CPU, --threads 1, 1970-01-01"
        );
    }

    #[test]
    fn the_repositorys_costs_toml_parses_for_editing() {
        let text = include_str!("../../experiments/costs.toml");
        let mut doc: DocumentMut = text.parse().unwrap();
        // Nothing measured: the file is written back byte for byte.
        let (changes, _) = refresh(&mut doc, &BTreeMap::new(), "CPU");
        assert!(changes.is_empty());
        assert_eq!(doc.to_string(), text);
    }
}
