//! `cargo xtask bench --publish`: `docs/performance.md` from the criterion results of the run
//! just made, so that the page says what was measured, where and how, and nobody types a figure.
//!
//! Criterion records each benchmark's estimates under `target/criterion/<group>/<function>/
//! <parameter>/new/` (`benchmark.json` names the benchmark, `estimates.json` holds the median and
//! its 95% confidence interval in nanoseconds). After each thread count's run, [`collect`] reads
//! the estimates written since that run started for every [`Comparison`]; [`write`] renders one
//! table per comparison (kappa against its peer, the ratio of the medians with the range their
//! confidence intervals allow) under the CPU model, thread counts, date, commit and command.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use crate::workspace::Workspace;

/// One comparison: two functions of one criterion group, compared at every parameter both
/// measured in a run.
pub(crate) struct Comparison {
    /// The `--bench` target that measures it.
    bench: &'static str,
    /// The criterion group id.
    group: &'static str,
    /// kappa's function id in the group.
    kappa: &'static str,
    /// The peer's function id in the group.
    peer: &'static str,
    /// What the peer's time is multiplied by before the ratio (5 for five GEMM steps).
    peer_factor: f64,
    /// The table's heading.
    title: &'static str,
    /// What is compared, in a sentence or two.
    what: &'static str,
}

/// Every comparison the benches record in criterion's files.
pub(crate) const COMPARISONS: &[Comparison] = &[
    Comparison {
        bench: "linalg",
        group: "singular_values",
        kappa: "gesvd",
        peer: "torch_svdvals",
        peer_factor: 1.0,
        title: "Singular values against torch.linalg",
        what:
            "kappa-linalg's `singular_values` (LAPACK's QR iteration, `gesvd`) against libtorch's \
               `svdvals` (through `torch.linalg.matrix_norm(A, 2)`), f32 and f64.",
    },
    Comparison {
        bench: "linalg",
        group: "condition_number",
        kappa: "kappa_linalg",
        peer: "torch_cond",
        peer_factor: 1.0,
        title: "Condition number against torch.linalg.cond",
        what:
            "kappa-linalg's `condition_number` (σ₁/σ_k from the singular values, +∞ at numerical \
               rank deficiency) against `torch.linalg.cond(A, 2)`.",
    },
    Comparison {
        bench: "linalg",
        group: "ns5_ndarray_f32",
        kappa: "ns5",
        peer: "sgemm_step",
        peer_factor: 5.0,
        title: "Newton–Schulz on ndarray against the GEMM bound",
        what:
            "Five quintic Newton–Schulz steps (`newton_schulz_muon`, f32 `ndarray`) against five \
               times one step's three products run as plain GEMMs on preallocated buffers: 1 is \
               the machine's GEMM throughput, below 1 the symmetric products' saving.",
    },
    Comparison {
        bench: "linalg",
        group: "ns5_tch_f32",
        kappa: "ns5",
        peer: "sgemm_step",
        peer_factor: 5.0,
        title: "Newton–Schulz on tch tensors against the GEMM bound",
        what: "The same on f32 `tch::Tensor`s, against libtorch's own GEMMs.",
    },
    Comparison {
        bench: "attention",
        group: "attention_jacobian_f64",
        kappa: "kappa_vjp",
        peer: "autograd_backward",
        peer_factor: 1.0,
        title: "Attention weight VJP against one autograd backward",
        what: "kappa-attention's weight VJP from a cached forward pass against one tch autograd \
               backward of the same head (retained graph), f64.",
    },
    Comparison {
        bench: "attention",
        group: "attention_jacobian_f64",
        kappa: "kappa_forward_vjp",
        peer: "autograd_forward_backward",
        peer_factor: 1.0,
        title: "Attention forward + VJP against forward + backward",
        what: "kappa-attention's forward pass and weight VJP against tch's forward and autograd \
               backward, f64.",
    },
    Comparison {
        bench: "attention",
        group: "attention_jacobian_f64",
        kappa: "kappa_dense_workspace",
        peer: "autograd_rows_jacobian",
        peer_factor: 1.0,
        title: "Dense weight Jacobian against autograd, row by row",
        what: "kappa-attention's exact weight Jacobian into a reused `JacobianWorkspace` (forward \
               pass included) against the same Jacobian from N·k autograd backwards (small shape).",
    },
    Comparison {
        bench: "optim",
        group: "optim_f32",
        kappa: "muon_step",
        peer: "ns5_bare",
        peer_factor: 1.0,
        title: "Muon step against its bare Newton–Schulz products",
        what: "kappa-optim's Muon step (Keller's settings, f32 tensors) against the five bare \
               quintic steps it orthogonalizes with: what the step costs beyond msign.",
    },
];

/// A median time with its 95% confidence interval, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Estimate {
    median: f64,
    lo: f64,
    hi: f64,
}

/// One parameter (a shape) of a comparison, measured at one thread count.
#[derive(Debug, PartialEq)]
struct Row {
    parameter: String,
    threads: u32,
    kappa: Estimate,
    peer: Estimate,
}

/// The rows one `cargo bench` run recorded, per comparison (by index into [`COMPARISONS`]).
pub(crate) struct Run {
    rows: Vec<(usize, Row)>,
}

/// Criterion's estimates under `criterion` written since `started`, keyed by (group, function,
/// parameter).
fn fresh_estimates(
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
fn rows_of(
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

/// The comparisons' rows among the criterion results of the run at `threads` that started at
/// `started`.
pub(crate) fn collect(ws: &Workspace, threads: u32, started: SystemTime) -> Run {
    let found = fresh_estimates(&ws.target_dir().join("criterion"), started);
    Run {
        rows: rows_of(&found, threads),
    }
}

/// Where and how the numbers were taken.
pub(crate) struct Provenance {
    pub(crate) command: String,
    pub(crate) commit: String,
    pub(crate) date: String,
    pub(crate) cpu: String,
    pub(crate) threads: Vec<u32>,
}

impl Provenance {
    /// This process's command line, the work tree's commit, today's date and this CPU.
    pub(crate) fn now(ws: &Workspace, threads: &[u32]) -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        Self {
            command: format!("cargo xtask {}", args.join(" ")),
            commit: commit(ws),
            date: date(SystemTime::now()),
            cpu: cpu_model(),
            threads: threads.to_vec(),
        }
    }

    /// The provenance as the rows of a two-column markdown table (header included).
    pub(crate) fn table(&self) -> String {
        let threads: Vec<String> = self.threads.iter().map(u32::to_string).collect();
        format!(
            "| | |\n|---|---|\n| command | `{}` |\n| commit | {} |\n| date | {} |\n| CPU | {} |\n\
             | threads | {} |\n",
            self.command,
            self.commit,
            self.date,
            self.cpu,
            threads.join(", ")
        )
    }
}

/// The CPU model (`/proc/cpuinfo`) and how many CPUs this process may use.
fn cpu_model() -> String {
    let model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{model} ({cpus} CPUs available to the process)")
}

/// The commit the benches were built from, marked when the work tree had changes.
fn commit(ws: &Workspace) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(ws.root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(changes) if !changes.is_empty() => format!("`{head}` with uncommitted changes"),
        _ => format!("`{head}`"),
    }
}

/// The UTC date of `t` as `YYYY-MM-DD` (the civil-from-days algorithm of H. Hinnant).
fn date(t: SystemTime) -> String {
    let days = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// One table row: the parameter, threads, both medians and the ratio with its range.
fn render_row(r: &Row) -> String {
    let (k, p) = (r.kappa, r.peer);
    format!(
        "| {} | {} | {:.3} | {:.3} | **{:.3}** [{:.3}–{:.3}] |",
        r.parameter,
        r.threads,
        k.median * 1e3,
        p.median * 1e3,
        k.median / p.median,
        k.lo / p.hi,
        k.hi / p.lo,
    )
}

/// The page's header: what it is and where its numbers came from.
fn render_header(p: &Provenance) -> String {
    format!(
        "# Performance\n\n\
         Generated by `cargo xtask bench --publish` from the criterion results of one run; run it \
         again (on a machine where nothing else runs) to replace every figure. What each \
         benchmark measures, and what shapes its figures, is in the crate pages: \
         [linalg](linalg.md#performance), [attention](attention.md#performance), \
         [optim](optim.md#performance), [models](models.md#performance), \
         [manifolds](manifolds.md#performance). The Python package's figures are in \
         [performance-python.md](performance-python.md) (`cargo xtask python --bench \
         --publish`).\n\n\
         {}\n\
         Each table compares kappa with its peer on the same inputs in the same process: the \
         medians of criterion's samples, and their ratio kappa / peer (below 1: kappa is faster) \
         with the range that the two medians' 95% confidence intervals allow.\n",
        p.table()
    )
}

/// The paired comparisons the benches print rather than record, and where to find them.
const PRINTED: &str = "\n## Printed by the benches\n\n\
Some comparisons run their peer in a child process (PyTorch eager, `torch.optim.Muon`, \
`torch.func.jacrev`) and alternate single steps of the two sides, which criterion does not \
record; the benches print them at the end of their run, as the median per-pair ratio with its \
range:\n\n\
| comparison | command | printed under |\n|---|---|---|\n\
| kappa's Muon step against `torch.optim.Muon`, f32 and every bf16 orthogonalizer | `cargo xtask bench --bench optim` | \"kappa's Muon step against torch.optim.Muon\" |\n\
| a GPT training step against PyTorch eager, f32 and bf16 autocast | `cargo xtask bench --bench models` | \"GPT training step, kappa / PyTorch eager\" |\n\
| the conditioned step against the baseline (control, λ = 0.001, λ = 10) | `cargo xtask bench --bench models` | \"conditioned step / baseline step\" |\n\
| attention's Jacobian against `torch.func.jacrev`, the VJP against a backward | `cargo xtask bench --bench attention` | \"kappa-attention paired ratios\" |\n\
| kappa-linalg's products, OpenBLAS and faer against libtorch's MKL | `cargo xtask bench --bench gemm` | its summary table |\n\
| Nyström attention against exact softmax attention, time and memory | `cargo xtask bench --bench nystrom` | its summary table |\n";

/// The whole page for `runs`.
fn render(runs: &[Run], p: &Provenance) -> String {
    let mut page = render_header(p);
    let mut absent = Vec::new();
    for (i, c) in COMPARISONS.iter().enumerate() {
        let rows: Vec<&Row> = runs
            .iter()
            .flat_map(|r| r.rows.iter().filter(|(j, _)| *j == i).map(|(_, row)| row))
            .collect();
        if rows.is_empty() {
            absent.push(format!("- {} (`--bench {}`)", c.title, c.bench));
            continue;
        }
        page.push_str(&format!(
            "\n## {} (`--bench {}`)\n\n{}\n\n| shape | threads | kappa ms | peer ms | kappa / peer |\n|---|---|---|---|---|\n",
            c.title, c.bench, c.what
        ));
        for row in rows {
            page.push_str(&render_row(row));
            page.push('\n');
        }
    }
    if !absent.is_empty() {
        page.push_str("\n## Not measured in this run\n\n");
        page.push_str(&absent.join("\n"));
        page.push('\n');
    }
    page.push_str(PRINTED);
    page
}

/// Writes `docs/performance.md` from `runs` (one per thread count, in order).
pub(crate) fn write(ws: &Workspace, runs: &[Run], threads: &[u32]) -> Result<()> {
    let provenance = Provenance::now(ws, threads);
    let path = ws.root().join("docs/performance.md");
    fs::write(&path, render(runs, &provenance))
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("xtask bench: wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est(ms: f64) -> Estimate {
        Estimate {
            median: ms * 1e-3,
            lo: ms * 0.9e-3,
            hi: ms * 1.1e-3,
        }
    }

    fn provenance() -> Provenance {
        Provenance {
            command: "cargo xtask bench --threads 1 --publish".into(),
            commit: "`0123456789ab`".into(),
            date: "2030-01-02".into(),
            cpu: "Some CPU (2 CPUs available to the process)".into(),
            threads: vec![1],
        }
    }

    #[test]
    fn dates_are_the_civil_utc_dates_of_unix_time() {
        let at = |days: u64| date(UNIX_EPOCH + std::time::Duration::from_secs(days * 86_400));
        assert_eq!(at(0), "1970-01-01");
        assert_eq!(at(59), "1970-03-01");
        assert_eq!(at(11_016), "2000-02-29");
        assert_eq!(at(20_789), "2026-12-02");
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
    fn the_page_names_its_provenance_and_each_comparison_it_has() {
        let row = Row {
            parameter: "64x64".into(),
            threads: 1,
            kappa: est(1.0),
            peer: est(2.0),
        };
        let i = COMPARISONS
            .iter()
            .position(|c| c.group == "condition_number")
            .unwrap();
        let page = render(
            &[Run {
                rows: vec![(i, row)],
            }],
            &provenance(),
        );
        for needle in [
            "`cargo xtask bench --threads 1 --publish`",
            "`0123456789ab`",
            "2030-01-02",
            "Some CPU",
            "## Condition number against torch.linalg.cond (`--bench linalg`)",
            "| 64x64 | 1 | 1.000 | 2.000 | **0.500** [0.409–0.611] |",
            "## Not measured in this run",
            "- Muon step against its bare Newton–Schulz products (`--bench optim`)",
        ] {
            assert!(page.contains(needle), "the page lacks {needle:?}:\n{page}");
        }
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
