//! Criterion's estimates: `target/criterion/<group>/<function>/<parameter>/new/` holds
//! `benchmark.json` (the benchmark's id) and `estimates.json` (the median and its 95% confidence
//! interval in nanoseconds). [`fresh_estimates`] reads those written since a run started;
//! [`rows_of`] pairs kappa's and the peer's at each parameter of every
//! [`Comparison`](super::Comparison).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::SystemTime;

use super::COMPARISONS;

/// A median time with its 95% confidence interval, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Estimate {
    pub(crate) median: f64,
    pub(crate) lo: f64,
    pub(crate) hi: f64,
}

/// One parameter (a shape) of a comparison, measured at one thread count.
#[derive(Debug, PartialEq)]
pub(crate) struct Row {
    pub(crate) parameter: String,
    pub(crate) threads: u32,
    pub(crate) kappa: Estimate,
    pub(crate) peer: Estimate,
}

/// Criterion's estimates under `criterion` written since `started`, keyed by (group, function,
/// parameter).
pub(crate) fn fresh_estimates(
    criterion: &Path,
    started: SystemTime,
) -> BTreeMap<(String, String, String), Estimate> {
    let mut found = BTreeMap::new();
    let mut stack = vec![criterion.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for path in entries.flatten().map(|e| e.path()) {
            if path.ends_with("new") {
                if let Some((key, est)) = read_benchmark(&path, started) {
                    found.insert(key, est);
                }
            } else if path.is_dir() && !path.ends_with("report") {
                stack.push(path);
            }
        }
    }
    found
}

/// The id and median estimate of the benchmark in a criterion `new/` folder, if it was written
/// since `started`.
fn read_benchmark(new: &Path, started: SystemTime) -> Option<((String, String, String), Estimate)> {
    let estimates = new.join("estimates.json");
    let written = fs::metadata(&estimates).and_then(|m| m.modified()).ok()?;
    if written < started {
        return None;
    }
    let id: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(new.join("benchmark.json")).ok()?).ok()?;
    let est: serde_json::Value = serde_json::from_str(&fs::read_to_string(estimates).ok()?).ok()?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    let key = (
        text(&id["group_id"]),
        text(&id["function_id"]),
        text(&id["value_str"]),
    );
    Some((key, estimate(&est["median"])?))
}

/// A criterion estimate (nanoseconds) in seconds.
fn estimate(median: &serde_json::Value) -> Option<Estimate> {
    let ns = |v: &serde_json::Value| v.as_f64().filter(|x| x.is_finite() && *x > 0.0);
    let ci = &median["confidence_interval"];
    Some(Estimate {
        median: ns(&median["point_estimate"])? * 1e-9,
        lo: ns(&ci["lower_bound"])? * 1e-9,
        hi: ns(&ci["upper_bound"])? * 1e-9,
    })
}

/// The rows of every comparison in `found`, measured at `threads`.
pub(crate) fn rows_of(
    found: &BTreeMap<(String, String, String), Estimate>,
    threads: u32,
) -> Vec<(usize, Row)> {
    let mut rows = Vec::new();
    for (i, c) in COMPARISONS.iter().enumerate() {
        for ((group, function, parameter), kappa) in found {
            if group != c.group || function != c.kappa {
                continue;
            }
            let peer_key = (group.clone(), c.peer.to_string(), parameter.clone());
            if let Some(peer) = found.get(&peer_key) {
                let scale = |e: Estimate| Estimate {
                    median: e.median * c.peer_factor,
                    lo: e.lo * c.peer_factor,
                    hi: e.hi * c.peer_factor,
                };
                let parameter = parameter.clone();
                rows.push((
                    i,
                    Row {
                        parameter,
                        threads,
                        kappa: *kappa,
                        peer: scale(*peer),
                    },
                ));
            }
        }
    }
    rows
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn est(ms: f64) -> Estimate {
        Estimate {
            median: ms * 1e-3,
            lo: ms * 0.9e-3,
            hi: ms * 1.1e-3,
        }
    }

    #[test]
    fn a_comparison_pairs_kappa_and_its_peer_at_each_shared_parameter() {
        let mut found = BTreeMap::new();
        let key = |g: &str, f: &str, p: &str| (g.to_string(), f.to_string(), p.to_string());
        found.insert(key("ns5_tch_f32", "ns5", "64x64"), est(10.0));
        found.insert(key("ns5_tch_f32", "sgemm_step", "64x64"), est(1.0));
        found.insert(key("ns5_tch_f32", "ns5", "768x768"), est(50.0)); // no peer: no row
        let rows = rows_of(&found, 2);
        assert_eq!(rows.len(), 1);
        let (i, row) = &rows[0];
        assert_eq!(COMPARISONS[*i].group, "ns5_tch_f32");
        assert_eq!((row.parameter.as_str(), row.threads), ("64x64", 2));
        // The GEMM bound is five steps' products.
        assert!((row.peer.median - 5e-3).abs() < 1e-15);
    }

    #[test]
    fn only_estimates_written_since_the_run_started_are_read() {
        let dir = std::env::temp_dir().join(format!("kappa-publish-{}", std::process::id()));
        let new = dir.join("condition_number/torch_cond/64x64/new");
        fs::create_dir_all(&new).unwrap();
        let id =
            r#"{"group_id":"condition_number","function_id":"torch_cond","value_str":"64x64"}"#;
        let median = r#"{"median":{"point_estimate":2e6,"confidence_interval":{"lower_bound":1.5e6,"upper_bound":2.5e6}}}"#;
        fs::write(new.join("benchmark.json"), id).unwrap();
        fs::write(new.join("estimates.json"), median).unwrap();
        let before = SystemTime::now() - std::time::Duration::from_secs(3600);
        let after = SystemTime::now() + std::time::Duration::from_secs(3600);
        let found = fresh_estimates(&dir, before);
        let key = (
            "condition_number".into(),
            "torch_cond".into(),
            "64x64".into(),
        );
        assert_eq!(
            found.get(&key),
            Some(&Estimate {
                median: 2e-3,
                lo: 1.5e-3,
                hi: 2.5e-3
            })
        );
        assert!(fresh_estimates(&dir, after).is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
