//! `cargo xtask bench --publish`: `docs/performance.md` from the results of the run just made,
//! so that the page says what was measured, where and how, and nobody types a figure.
//!
//! Three sources, each read for the files written since a thread count's run started
//! ([`collect`]): criterion's estimates ([`criterion`]: the median and its 95% confidence
//! interval of each benchmark; [`COMPARISONS`] pairs two functions of a group), the paired
//! comparisons the benches record themselves ([`records`]: a peer in a child process, single
//! steps alternated, the median per-pair ratio with its range; [`PAIRED`] lists them), and the
//! machine's limits (`--bench limits`: peak GEMM throughput and triad bandwidth). [`write()`]
//! renders the limits, then one table per comparison with kappa's rate under its work model
//! ([`bounds`]) and its fraction of the limit, under the CPU model, thread counts, date,
//! commit and command.

mod bounds;
mod comparisons;
mod criterion;
mod records;

use std::fs;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use self::bounds::Limits;
use self::comparisons::{Comparison, COMPARISONS, PAIRED};
use self::criterion::{fresh_estimates, rows_of, Row};
use self::records::Paired;
use crate::workspace::Workspace;

/// What one `cargo bench` run recorded: criterion's rows per comparison (by index into
/// [`COMPARISONS`]), the benches' paired records, and the limits where measured.
pub(crate) struct Run {
    rows: Vec<(usize, Row)>,
    paired: Vec<Paired>,
    limits: Option<Limits>,
}

/// The comparisons' rows among the results of the run at `threads` that started at `started`,
/// and its records.
pub(crate) fn collect(ws: &Workspace, threads: u32, started: SystemTime) -> Run {
    let criterion = ws.target_dir().join("criterion");
    let found = fresh_estimates(&criterion, started);
    let records = records::fresh(&criterion.join("kappa-paired"), started);
    Run {
        rows: rows_of(&found, threads),
        paired: records.paired,
        limits: records.limits,
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
    /// This process's command line, the work tree's commit (and whether the tree has changes),
    /// today's date and this CPU.
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
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{} ({cpus} CPUs available to the process)", cpu_name())
}

/// The CPU's model name (`/proc/cpuinfo`; "unknown CPU" where there is none).
pub(crate) fn cpu_name() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string())
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
pub(crate) fn date(t: SystemTime) -> String {
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

/// One table row: the parameter, threads, both medians and the ratio with its range, then,
/// where the comparison has a work model, kappa's rate and its fraction of the limit.
fn render_row(c: &Comparison, r: &Row, limits: Option<&Limits>) -> String {
    let (k, p) = (r.kappa, r.peer);
    let mut row = format!(
        "| {} | {} | {:.3} | {:.3} | **{:.3}** [{:.3}–{:.3}] |",
        r.parameter,
        r.threads,
        k.median * 1e3,
        p.median * 1e3,
        k.median / p.median,
        k.lo / p.hi,
        k.hi / p.lo,
    );
    if let Some(model) = &c.work {
        let work = (model.of)(&r.parameter);
        let (rate, fraction) = bounds::rate_cells(work, Some(k.median), limits);
        row.push_str(&format!(" {rate} | {fraction} |"));
    }
    row
}

/// One criterion comparison's section.
fn render_comparison(
    c: &Comparison,
    rows: &[&Row],
    limits: &dyn Fn(u32) -> Option<Limits>,
) -> String {
    let mut out = format!("\n## {} (`--bench {}`)\n\n{}", c.title, c.bench, c.what);
    let header = "| shape | threads | kappa ms | peer ms | kappa / peer |";
    match &c.work {
        Some(model) => out.push_str(&format!(
            " Work of one kappa call: {}.\n\n{header} kappa rate | of the limit |\n\
             |---|---|---|---|---|---|---|\n",
            model.formula
        )),
        None => out.push_str(&format!("\n\n{header}\n|---|---|---|---|---|\n")),
    }
    for row in rows {
        out.push_str(&render_row(c, row, limits(row.threads).as_ref()));
        out.push('\n');
    }
    out
}

/// The page's header: what it is and where its numbers came from.
fn render_header(p: &Provenance) -> String {
    format!(
        "# Performance\n\n\
         Generated by `cargo xtask bench --publish` from the results of one run; run it again \
         (on a machine where nothing else runs) to replace every figure. What each benchmark \
         measures, and what shapes its figures, is in the crate pages: \
         [linalg](linalg.md#performance), [attention](attention.md#performance), \
         [optim](optim.md#performance), [models](models.md#performance), \
         [manifolds](manifolds.md#performance). The Python package's figures are in \
         [performance-python.md](performance-python.md) (`cargo xtask python --bench \
         --publish`).\n\n\
         {}\n\
         Each table compares kappa with its peer on the same inputs. Where criterion measured \
         both sides in turn, a table gives the medians of its samples and their ratio kappa / \
         peer (below 1: kappa is faster) with the range that the two medians' 95% confidence \
         intervals allow. Where the peer runs in a child process (PyTorch eager, \
         `torch.optim.Muon`, `torch.func.jacrev`) or the two sides must share the machine's \
         drift, the bench alternates single steps of the two and records the median per-pair \
         ratio with its range, each side's median time, and the work model.\n",
        p.table()
    )
}

/// The limits measured at `threads` in any of `runs`.
fn limits_at(runs: &[Run], threads: u32) -> Option<Limits> {
    runs.iter()
        .filter_map(|r| r.limits.clone())
        .find(|l| l.threads == threads)
}

/// The criterion comparisons' sections, and the titles of those with no rows.
fn render_criterion(runs: &[Run], page: &mut String, absent: &mut Vec<String>) {
    let limits = |t: u32| limits_at(runs, t);
    for (i, c) in COMPARISONS.iter().enumerate() {
        let rows: Vec<&Row> = runs
            .iter()
            .flat_map(|r| r.rows.iter().filter(|(j, _)| *j == i).map(|(_, row)| row))
            .collect();
        if rows.is_empty() {
            absent.push(format!("- {} (`--bench {}`)", c.title, c.bench));
        } else {
            page.push_str(&render_comparison(c, &rows, &limits));
        }
    }
}

/// The paired comparisons' sections (every run's records of one comparison merged), and the
/// titles of those with no record.
fn render_paired(runs: &[Run], page: &mut String, absent: &mut Vec<String>) {
    let limits = |t: u32| limits_at(runs, t);
    let mut names: Vec<(String, String)> = PAIRED
        .iter()
        .map(|(b, n, _)| (b.to_string(), n.to_string()))
        .collect();
    for p in runs.iter().flat_map(|r| &r.paired) {
        if !names.contains(&(p.bench.clone(), p.name.clone())) {
            names.push((p.bench.clone(), p.name.clone()));
        }
    }
    for (bench, name) in names {
        let tables: Vec<&Paired> = runs
            .iter()
            .flat_map(|r| &r.paired)
            .filter(|p| p.bench == bench && p.name == name)
            .collect();
        match tables.last() {
            Some(last) => page.push_str(&records::render(
                last,
                &records::merged_rows(&tables),
                &limits,
            )),
            None => {
                let title = PAIRED.iter().find(|(b, n, _)| *b == bench && *n == name);
                absent.push(format!(
                    "- {} (`--bench {bench}`)",
                    title.map_or("", |t| t.2)
                ));
            }
        }
    }
}

/// The whole page for `runs`.
fn render(runs: &[Run], p: &Provenance) -> String {
    let mut page = render_header(p);
    let limits: Vec<&Limits> = runs.iter().filter_map(|r| r.limits.as_ref()).collect();
    page.push_str(&bounds::render_limits(&limits));
    let mut absent = Vec::new();
    render_criterion(runs, &mut page, &mut absent);
    render_paired(runs, &mut page, &mut absent);
    if !absent.is_empty() {
        page.push_str("\n## Not measured in this run\n\n");
        page.push_str(&absent.join("\n"));
        page.push('\n');
    }
    page
}

/// Writes `docs/performance.md` from `runs` (one per thread count, in order).
pub(crate) fn write(ws: &Workspace, runs: &[Run], provenance: &Provenance) -> Result<()> {
    let path = ws.root().join("docs/performance.md");
    fs::write(&path, render(runs, provenance))
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("xtask bench: wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::criterion::tests::est;
    use super::*;

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

    /// A run with one criterion row of `group` and `kappa`, the limits at one thread, and
    /// `paired` records.
    fn run(group: &str, kappa: &str, parameter: &str, paired: Vec<Paired>) -> Run {
        let row = Row {
            parameter: parameter.into(),
            threads: 1,
            kappa: est(1.0),
            peer: est(2.0),
        };
        let i = COMPARISONS
            .iter()
            .position(|c| c.group == group && c.kappa == kappa)
            .unwrap();
        Run {
            rows: vec![(i, row)],
            paired,
            limits: Some(bounds::tests::limits(1)),
        }
    }

    #[test]
    fn the_page_names_its_provenance_and_each_comparison_it_has() {
        let page = render(
            &[run("condition_number", "kappa_linalg", "64x64", vec![])],
            &provenance(),
        );
        for needle in [
            "`cargo xtask bench --threads 1 --publish`",
            "`0123456789ab`",
            "2030-01-02",
            "Some CPU",
            "## The machine's limits (`--bench limits`)",
            "## Condition number against torch.linalg.cond (`--bench linalg`)",
            "Work of one kappa call: the Householder bidiagonalization",
            "| 64x64 | 1 | 1.000 | 2.000 | **0.500** [0.409–0.611] |",
            "## Not measured in this run",
            "- Muon step against its bare Newton–Schulz products (`--bench optim`)",
            "- Muon step against torch.optim.Muon (`--bench optim`)",
        ] {
            assert!(page.contains(needle), "the page lacks {needle:?}:\n{page}");
        }
    }

    #[test]
    fn a_row_shows_kappas_rate_and_its_fraction_of_the_limit() {
        // AdamW at 1000x1000: 28e6 bytes in 1 ms, 28 GB/s against the fixture's 20 GB/s triad.
        let page = render(
            &[run("optim_f32", "kappa_adamw", "1000x1000", vec![])],
            &provenance(),
        );
        let row =
            "| 1000x1000 | 1 | 1.000 | 2.000 | **0.500** [0.409–0.611] | 28.0 GB/s | 1.40 of \
                   triad |";
        assert!(page.contains(row), "{page}");
        // A comparison without a work model has no rate columns.
        let page = render(
            &[run(
                "attention_jacobian_f64",
                "kappa_dense_workspace",
                "N64_D64_k16",
                vec![],
            )],
            &provenance(),
        );
        assert!(page.contains("| N64_D64_k16 | 1 | 1.000 | 2.000 | **0.500** [0.409–0.611] |\n"));
    }

    #[test]
    fn paired_records_become_tables_and_missing_ones_are_named() {
        let record = r#"{"bench": "gemm", "name": "products_vs_libtorch", "title": "Products",
            "what": "n×n products.", "peer": "libtorch (MKL)", "spread": "min–max over pairs",
            "model": "2n³ flops a product", "rows": [{"parameter": "1024x1024",
            "variant": "kappa product f32 (faer)", "threads": 1, "kappa_s": 0.0215,
            "peer_s": 0.02, "ratio": {"median": 1.07, "lo": 1.0, "hi": 1.2}, "pairs": 15,
            "bound": "gemm_f32", "work": 2147483648.0}]}"#;
        let paired: Paired = serde_json::from_str(record).unwrap();
        let page = render(
            &[run(
                "condition_number",
                "kappa_linalg",
                "64x64",
                vec![paired],
            )],
            &provenance(),
        );
        for needle in [
            "## Products (`--bench gemm`)",
            "| 1024x1024 | kappa product f32 (faer) | 1 | 21.500 | 20.000 | **1.070** \
             [1.000–1.200] | 15 | 99.9 GFLOP/s | 1.00 of f32 GEMM |",
            "- Nyström attention against exact softmax attention (`--bench nystrom`)",
        ] {
            assert!(page.contains(needle), "the page lacks {needle:?}:\n{page}");
        }
        assert!(!page.contains("- Products against libtorch's GEMM"));
    }
}
