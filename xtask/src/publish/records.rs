//! The benches' own records (`kappa_benches::record`): the paired comparisons criterion does not
//! see, and the machine's limits, as JSON files under `target/criterion/kappa-paired/<bench>/`.
//! [`fresh`] reads those written since a run started; [`render`] turns a paired comparison into
//! a table like the criterion ones.

use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;

use super::bounds::{rate_cells, Bound, Limits};

/// A paired comparison as a bench wrote it.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct Paired {
    pub(crate) bench: String,
    pub(crate) name: String,
    pub(crate) title: String,
    pub(crate) what: String,
    pub(crate) peer: String,
    pub(crate) spread: String,
    pub(crate) model: String,
    pub(crate) rows: Vec<PairedRow>,
}

/// One row: a parameter and variant at a thread count.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct PairedRow {
    pub(crate) parameter: String,
    pub(crate) variant: String,
    pub(crate) threads: u32,
    pub(crate) kappa_s: Option<f64>,
    pub(crate) peer_s: Option<f64>,
    pub(crate) ratio: Ratio,
    pub(crate) pairs: u64,
    pub(crate) bound: Option<Bound>,
    pub(crate) work: Option<f64>,
}

/// kappa / peer: the median per-pair ratio and its range.
#[derive(Clone, Copy, Debug, Deserialize)]
pub(crate) struct Ratio {
    pub(crate) median: f64,
    pub(crate) lo: f64,
    pub(crate) hi: f64,
}

/// What one run's records hold.
#[derive(Default)]
pub(crate) struct Fresh {
    pub(crate) paired: Vec<Paired>,
    pub(crate) limits: Option<Limits>,
}

/// The records under `dir` (`target/criterion/kappa-paired`) written since `started`.
pub(crate) fn fresh(dir: &Path, started: SystemTime) -> Fresh {
    let since = started
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut out = Fresh::default();
    let Ok(benches) = fs::read_dir(dir) else {
        return out;
    };
    let mut files: Vec<_> = benches
        .flatten()
        .filter_map(|b| fs::read_dir(b.path()).ok())
        .flat_map(|entries| entries.flatten().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    for path in files {
        let Some(v) = fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        else {
            continue;
        };
        if v["written_unix"].as_f64().is_none_or(|t| t < since) {
            continue;
        }
        match v["kind"].as_str() {
            Some("paired") => out.paired.extend(serde_json::from_value(v).ok()),
            Some("limits") => out.limits = serde_json::from_value(v).ok(),
            _ => {}
        }
    }
    out
}

/// The rows of `tables` (every run's records of one comparison) in order, a later run's row
/// replacing an earlier one's at the same parameter, variant and threads.
pub(crate) fn merged_rows(tables: &[&Paired]) -> Vec<PairedRow> {
    let mut rows: Vec<PairedRow> = Vec::new();
    for row in tables.iter().flat_map(|t| t.rows.iter()) {
        let same = |r: &PairedRow| {
            (&r.parameter, &r.variant, r.threads) == (&row.parameter, &row.variant, row.threads)
        };
        match rows.iter_mut().find(|r| same(r)) {
            Some(old) => *old = row.clone(),
            None => rows.push(row.clone()),
        }
    }
    rows
}

/// A number of seconds as milliseconds, or — .
fn ms(s: Option<f64>) -> String {
    s.map_or("—".to_string(), |s| format!("{:.3}", s * 1e3))
}

/// One paired comparison's section: heading, what it compares, how the ratio and the work are
/// counted, and the table (the rate columns only where a row has a work model).
pub(crate) fn render(
    table: &Paired,
    rows: &[PairedRow],
    limits: &dyn Fn(u32) -> Option<Limits>,
) -> String {
    let with_work = rows.iter().any(|r| r.work.is_some());
    let mut out = format!(
        "\n### {}\n\n{}\n\nkappa / {}: the median per-pair ratio (below 1: kappa is faster), \
         with the {}.",
        table.title, table.what, table.peer, table.spread
    );
    if with_work && !table.model.is_empty() {
        out.push_str(&format!(" Work of one kappa call: {}.", table.model));
    }
    out.push_str("\n\n| shape | variant | threads | kappa ms | peer ms | kappa / peer | pairs |");
    out.push_str(if with_work {
        " kappa rate | of the limit |\n|---|---|---|---|---|---|---|---|---|\n"
    } else {
        "\n|---|---|---|---|---|---|---|\n"
    });
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | **{:.3}** [{:.3}–{:.3}] | {} |",
            r.parameter,
            r.variant,
            r.threads,
            ms(r.kappa_s),
            ms(r.peer_s),
            r.ratio.median,
            r.ratio.lo,
            r.ratio.hi,
            r.pairs
        ));
        if with_work {
            let work = r.bound.zip(r.work);
            let (rate, fraction) = rate_cells(work, r.kappa_s, limits(r.threads).as_ref());
            out.push_str(&format!(" {rate} | {fraction} |"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAIRED: &str = r#"{
      "bench": "optim", "name": "muon_vs_torch", "written_unix": WRITTEN, "cpu": "Some CPU",
      "kind": "paired", "title": "Muon step against torch.optim.Muon", "what": "Steps.",
      "peer": "torch.optim.Muon", "spread": "min–max over pairs", "model": "5·(4r²s + 2r³)",
      "rows": [
        {"parameter": "384x384", "variant": "f32", "threads": 1, "kappa_s": 0.01,
         "peer_s": 0.02, "ratio": {"median": 0.5, "lo": 0.4, "hi": 0.6}, "pairs": 15,
         "bound": "gemm_f32", "work": 1e9},
        {"parameter": "gpt2-layer", "variant": "bf16 aol", "threads": 1, "kappa_s": null,
         "peer_s": null, "ratio": {"median": 0.8, "lo": 0.7, "hi": 0.9}, "pairs": 3,
         "bound": null, "work": null}
      ]
    }"#;

    const LIMITS: &str = r#"{
      "bench": "limits", "name": "limits", "written_unix": WRITTEN, "cpu": "Some CPU",
      "kind": "limits", "threads": 1, "gemm_n": 2048, "gemm_f32_gflops": 200.0,
      "gemm_f64_gflops": 100.0, "gemm_bf16_gflops": null, "triad_len": 16777216,
      "triad_gbs": 25.0
    }"#;

    /// A fixture records folder holding both records, written at `written` (Unix seconds).
    fn fixture(tag: &str, written: f64) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kappa-records-{tag}-{}", std::process::id()));
        let at = written.to_string();
        for (bench, name, text) in [
            ("optim", "muon_vs_torch", PAIRED),
            ("limits", "limits", LIMITS),
        ] {
            fs::create_dir_all(dir.join(bench)).unwrap();
            let path = dir.join(bench).join(format!("{name}.json"));
            fs::write(path, text.replace("WRITTEN", &at)).unwrap();
        }
        dir
    }

    fn now() -> f64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    }

    #[test]
    fn records_written_since_the_run_started_are_read_and_older_ones_are_not() {
        let dir = fixture("fresh", now());
        let hour = std::time::Duration::from_secs(3600);
        let found = fresh(&dir, SystemTime::now() - hour);
        assert_eq!(found.paired.len(), 1);
        assert_eq!(found.paired[0].rows.len(), 2);
        assert_eq!(found.paired[0].rows[0].bound, Some(Bound::GemmF32));
        let limits = found.limits.expect("the limits record");
        assert_eq!((limits.threads, limits.gemm_f32_gflops), (1, 200.0));
        let later = fresh(&dir, SystemTime::now() + hour);
        assert!(later.paired.is_empty() && later.limits.is_none());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_paired_table_shows_ratios_rates_and_fractions_of_the_limit() {
        let dir = fixture("render", now());
        let found = fresh(&dir, UNIX_EPOCH);
        let table = &found.paired[0];
        let limits = found.limits.clone();
        let text = render(table, &table.rows, &|t| {
            limits.clone().filter(|l| l.threads == t)
        });
        for needle in [
            "### Muon step against torch.optim.Muon\n",
            "kappa / torch.optim.Muon: the median per-pair ratio",
            "with the min–max over pairs. Work of one kappa call: 5·(4r²s + 2r³).",
            // 1e9 flops in 10 ms: 100 GFLOP/s, half of the 200 GFLOP/s f32 limit.
            "| 384x384 | f32 | 1 | 10.000 | 20.000 | **0.500** [0.400–0.600] | 15 | 100.0 GFLOP/s | \
             0.50 of f32 GEMM |",
            "| gpt2-layer | bf16 aol | 1 | — | — | **0.800** [0.700–0.900] | 3 | — | — |",
        ] {
            assert!(text.contains(needle), "the table lacks {needle:?}:\n{text}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A record that gives rows a work amount but no model text leaves the sentence out rather
    /// than print an empty one.
    #[test]
    fn a_table_without_a_work_model_has_no_work_sentence() {
        let dir = fixture("no-model", now());
        let mut table = fresh(&dir, UNIX_EPOCH).paired.remove(0);
        table.model.clear();
        let text = render(&table, &table.rows, &|_| None);
        assert!(!text.contains("Work of one kappa call"), "{text}");
        assert!(text.contains("kappa rate | of the limit |"), "{text}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_later_run_replaces_a_row_at_the_same_parameter_variant_and_threads() {
        let first: Paired = serde_json::from_str(&PAIRED.replace("WRITTEN", "0")).unwrap();
        let mut second = first.clone();
        second.rows.truncate(1);
        second.rows[0].ratio.median = 0.9;
        second.rows.push(PairedRow {
            threads: 2,
            ..second.rows[0].clone()
        });
        let rows = merged_rows(&[&first, &second]);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].ratio.median, 0.9);
        assert_eq!(
            (rows[2].parameter.as_str(), rows[2].threads),
            ("384x384", 2)
        );
    }
}
