//! `cargo xtask bench --publish`: `docs/performance.md` from the results of the run just made,
//! so that the page says what was measured, where and how, and nobody types a figure.
//!
//! Three sources, each read for the files written since a thread count's run started
//! ([`collect`]): criterion's estimates ([`criterion`]: the median and its 95% confidence
//! interval of each benchmark; [`COMPARISONS`] pairs two functions of a group), the paired
//! comparisons the benches record themselves ([`records`]: a peer in a child process, single
//! steps alternated, the median per-pair ratio with its range; [`PAIRED`] lists them), and the
//! machine's limits (`--bench limits`: peak GEMM throughput and triad bandwidth).
//!
//! The page has one part per bench target, between the markers `<!-- kappa:bench NAME -->`
//! and `<!-- kappa:end NAME -->`: the run's command, commit, date, CPU and thread counts, the
//! limits measured in that run, then one table per comparison with kappa's rate under its work
//! model ([`bounds`]) and its fraction of the limit. [`write()`] replaces the parts of the
//! targets that ran and keeps the others ([`splice`]), so that one target can be measured
//! again without the hours a whole run takes.

mod bounds;
mod comparisons;
mod criterion;
mod records;

use std::fs;
use std::io::ErrorKind;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

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
    let source = source(ws);
    match source.split_once(' ') {
        Some((head, rest)) => format!("`{head}` {rest}"),
        None => format!("`{source}`"),
    }
}

/// The work tree's commit (12 hex digits), followed by " with uncommitted changes" when a
/// tracked file differs from it; "unknown" outside a git work tree. What a run folder records
/// as its source (`KAPPA_SOURCE`).
pub(crate) fn source(ws: &Workspace) -> String {
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
        Some(changes) if !changes.is_empty() => format!("{head} with uncommitted changes"),
        _ => head,
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
    let mut out = format!("\n### {}\n\n{}", c.title, c.what);
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

/// The page's header: what it is, how its parts are made and how to read a table.
fn render_header() -> String {
    format!(
        "# Performance\n\n\
         Generated by `cargo xtask bench --publish`; nothing here is typed by hand. The page has \
         one part per bench target, each from one run, which it names: command, commit, date, \
         CPU and thread counts. `cargo xtask bench --publish` measures every target again; \
         `cargo xtask bench --bench NAME --publish` measures one and keeps the other parts, so \
         parts can come from different runs and machines: compare figures within a part. Run it \
         on a machine where nothing else runs. What each benchmark measures, and what shapes its \
         figures, is in the crate pages: [linalg](linalg.md#performance), \
         [attention](attention.md#performance), [optim](optim.md#performance), \
         [models](models.md#performance), [manifolds](manifolds.md#performance). The Python \
         package's figures are in [performance-python.md](performance-python.md) (`cargo xtask \
         python --bench --publish`).\n\n\
         Each table compares kappa with its peer on the same inputs. Where criterion measured \
         both sides in turn, a table gives the medians of its samples and their ratio kappa / \
         peer (below 1: kappa is faster) with the range that the two medians' 95% confidence \
         intervals allow. Where the peer runs in a child process (PyTorch eager, \
         `torch.optim.Muon`, `torch.func.jacrev`) or the two sides must share the machine's \
         drift, the bench alternates single steps of the two and records the median per-pair \
         ratio with its range, each side's median time, and the work model.\n\n{}\n",
        bounds::LIMITS_METHOD
    )
}

/// The bench targets with a part on the page, in page order: those of [`COMPARISONS`], then
/// those of [`PAIRED`], each once.
fn targets() -> Vec<&'static str> {
    let mut out = Vec::new();
    for bench in COMPARISONS
        .iter()
        .map(|c| c.bench)
        .chain(PAIRED.iter().map(|p| p.0))
    {
        if !out.contains(&bench) {
            out.push(bench);
        }
    }
    out
}

/// The limits measured at `threads` in any of `runs`.
fn limits_at(runs: &[Run], threads: u32) -> Option<Limits> {
    runs.iter()
        .filter_map(|r| r.limits.clone())
        .find(|l| l.threads == threads)
}

/// `bench`'s criterion comparisons' sections, and the titles of those with no rows.
fn render_criterion(bench: &str, runs: &[Run], page: &mut String, absent: &mut Vec<String>) {
    let limits = |t: u32| limits_at(runs, t);
    for (i, c) in COMPARISONS
        .iter()
        .enumerate()
        .filter(|(_, c)| c.bench == bench)
    {
        let rows: Vec<&Row> = runs
            .iter()
            .flat_map(|r| r.rows.iter().filter(|(j, _)| *j == i).map(|(_, row)| row))
            .collect();
        if rows.is_empty() {
            absent.push(format!("- {}", c.title));
        } else {
            page.push_str(&render_comparison(c, &rows, &limits));
        }
    }
}

/// `bench`'s paired comparisons' sections (every run's records of one comparison merged), and
/// the titles of those with no record.
fn render_paired(bench: &str, runs: &[Run], page: &mut String, absent: &mut Vec<String>) {
    let limits = |t: u32| limits_at(runs, t);
    let mut names: Vec<String> = PAIRED
        .iter()
        .filter(|(b, ..)| *b == bench)
        .map(|(_, n, _)| n.to_string())
        .collect();
    for p in runs
        .iter()
        .flat_map(|r| &r.paired)
        .filter(|p| p.bench == bench)
    {
        if !names.contains(&p.name) {
            names.push(p.name.clone());
        }
    }
    for name in names {
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
                absent.push(format!("- {}", title.map_or("", |t| t.2)));
            }
        }
    }
}

const OPEN: &str = "<!-- kappa:bench ";
const CLOSE: &str = "<!-- kappa:end ";
const TAIL: &str = " -->";

/// `bench`'s part from `runs`: its provenance, the run's limits, its comparisons, and those of
/// its comparisons the run left out.
fn render_part(bench: &str, runs: &[Run], p: &Provenance) -> String {
    let mut part = format!("## `--bench {bench}`\n\n{}", p.table());
    let limits: Vec<&Limits> = runs.iter().filter_map(|r| r.limits.as_ref()).collect();
    part.push_str(&bounds::render_limits(&limits));
    let mut absent = Vec::new();
    render_criterion(bench, runs, &mut part, &mut absent);
    render_paired(bench, runs, &mut part, &mut absent);
    if !absent.is_empty() {
        part.push_str("\n### Not measured in this run\n\n");
        part.push_str(&absent.join("\n"));
        part.push('\n');
    }
    part
}

/// The part of a target that no published run has measured.
fn unmeasured_part(bench: &str) -> String {
    format!(
        "## `--bench {bench}`\n\nNot measured yet: `cargo xtask bench --bench {bench} \
         --publish` measures it.\n"
    )
}

/// The parts of a published page, by target, between their markers (the header is made anew).
/// Empty text has no parts; text without markers, an unclosed part or a marker that closes
/// another part is an error (a page edited by hand, or written by an older xtask).
fn parse_parts(page: &str) -> Result<Vec<(String, String)>> {
    let mut parts = Vec::new();
    let mut open: Option<(String, String)> = None;
    for (i, line) in page.lines().enumerate() {
        let name_of = |rest: &str| rest.strip_suffix(TAIL).unwrap_or(rest).to_string();
        if let Some(rest) = line.strip_prefix(OPEN) {
            if let Some((name, _)) = &open {
                bail!("line {}: part `{name}` is not closed", i + 1);
            }
            open = Some((name_of(rest), String::new()));
        } else if let Some(rest) = line.strip_prefix(CLOSE) {
            match open.take() {
                Some((name, text)) if name == name_of(rest) => parts.push((name, text)),
                _ => bail!("line {}: `{line}` closes no open part of that name", i + 1),
            }
        } else if let Some((_, text)) = &mut open {
            text.push_str(line);
            text.push('\n');
        }
    }
    if let Some((name, _)) = open {
        bail!("part `{name}` is not closed");
    }
    if parts.is_empty() && !page.trim().is_empty() {
        bail!("the page has no `{OPEN}NAME{TAIL}` markers, so its parts cannot be kept");
    }
    Ok(parts)
}

/// The page after a run of `measured` targets: their parts from `runs`, every other target's
/// part kept from `old` (the published page; empty if none), or marked as not measured.
fn splice(old: &str, runs: &[Run], p: &Provenance, measured: &[&str]) -> Result<String> {
    let kept = parse_parts(old)?;
    let mut page = render_header();
    for bench in targets() {
        let part = if measured.contains(&bench) {
            render_part(bench, runs, p)
        } else if let Some((_, text)) = kept.iter().find(|(name, _)| name == bench) {
            text.clone()
        } else {
            unmeasured_part(bench)
        };
        let body = part.trim_matches('\n');
        page.push_str(&format!(
            "\n{OPEN}{bench}{TAIL}\n{body}\n{CLOSE}{bench}{TAIL}\n"
        ));
    }
    Ok(page)
}

/// Writes `docs/performance.md` from `runs` (one per thread count, in order) of the bench
/// targets `bench` names (every target when `None`), keeping the published parts of the others.
pub(crate) fn write(
    ws: &Workspace,
    runs: &[Run],
    provenance: &Provenance,
    bench: Option<&str>,
) -> Result<()> {
    let path = ws.root().join("docs/performance.md");
    let old = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let measured: Vec<&str> = bench.map_or_else(|| targets().to_vec(), |b| vec![b]);
    if let Some(b) = bench.filter(|b| !targets().contains(b)) {
        eprintln!("xtask bench: `{b}` has no part on the page; the page keeps its parts");
    }
    let page = splice(&old, runs, provenance, &measured)
        .with_context(|| format!("keeping the parts of {}", path.display()))?;
    fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
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

    /// The page of `runs` of every target, written over no earlier page.
    fn page(runs: &[Run]) -> String {
        splice("", runs, &provenance(), &targets()).unwrap()
    }

    /// `bench`'s part of `page`, between its markers.
    fn part_of(page: &str, bench: &str) -> String {
        let parts = parse_parts(page).unwrap();
        parts.into_iter().find(|(n, _)| n == bench).unwrap().1
    }

    #[test]
    fn each_part_names_its_provenance_and_each_comparison_it_has() {
        let page = page(&[run("condition_number", "kappa_linalg", "64x64", vec![])]);
        let linalg = part_of(&page, "linalg");
        for needle in [
            "## `--bench linalg`",
            "`cargo xtask bench --threads 1 --publish`",
            "`0123456789ab`",
            "2030-01-02",
            "Some CPU",
            "The machine's limits in this run (GEMM n = 2048",
            "### Condition number against torch.linalg.cond\n",
            "Work of one kappa call: the Householder bidiagonalization",
            "| 64x64 | 1 | 1.000 | 2.000 | **0.500** [0.409–0.611] |",
            "### Not measured in this run",
            "- Singular values against torch.linalg",
        ] {
            assert!(
                linalg.contains(needle),
                "the part lacks {needle:?}:\n{linalg}"
            );
        }
        let optim = part_of(&page, "optim");
        assert!(optim.contains("- Muon step against its bare Newton–Schulz products"));
        assert!(optim.contains("- Muon step against torch.optim.Muon"));
        assert!(page.starts_with("# Performance\n"));
        assert_eq!(parse_parts(&page).unwrap().len(), targets().len());
    }

    #[test]
    fn a_row_shows_kappas_rate_and_its_fraction_of_the_limit() {
        // AdamW at 1000x1000: 28e6 bytes in 1 ms, 28 GB/s against the fixture's 20 GB/s triad.
        let page = page(&[run("optim_f32", "kappa_adamw", "1000x1000", vec![])]);
        let row =
            "| 1000x1000 | 1 | 1.000 | 2.000 | **0.500** [0.409–0.611] | 28.0 GB/s | 1.40 of \
                   triad |";
        assert!(page.contains(row), "{page}");
        // A comparison without a work model has no rate columns.
        let page = page_of_one(
            "attention_jacobian_f64",
            "kappa_dense_workspace",
            "N64_D64_k16",
        );
        assert!(page.contains("| N64_D64_k16 | 1 | 1.000 | 2.000 | **0.500** [0.409–0.611] |\n"));
    }

    fn page_of_one(group: &str, kappa: &str, parameter: &str) -> String {
        page(&[run(group, kappa, parameter, vec![])])
    }

    fn products_record() -> Paired {
        let record = r#"{"bench": "gemm", "name": "products_vs_libtorch", "title": "Products",
            "what": "n×n products.", "peer": "libtorch (MKL)", "spread": "min–max over pairs",
            "model": "2n³ flops a product", "rows": [{"parameter": "1024x1024",
            "variant": "kappa product f32 (faer)", "threads": 1, "kappa_s": 0.0215,
            "peer_s": 0.02, "ratio": {"median": 1.07, "lo": 1.0, "hi": 1.2}, "pairs": 15,
            "bound": "gemm_f32", "work": 2147483648.0}]}"#;
        serde_json::from_str(record).unwrap()
    }

    #[test]
    fn paired_records_become_tables_and_missing_ones_are_named() {
        let runs = [run(
            "condition_number",
            "kappa_linalg",
            "64x64",
            vec![products_record()],
        )];
        let page = page(&runs);
        let gemm = part_of(&page, "gemm");
        for needle in [
            "### Products\n",
            "| 1024x1024 | kappa product f32 (faer) | 1 | 21.500 | 20.000 | **1.070** \
             [1.000–1.200] | 15 | 99.9 GFLOP/s | 1.00 of f32 GEMM |",
        ] {
            assert!(gemm.contains(needle), "the part lacks {needle:?}:\n{gemm}");
        }
        assert!(!gemm.contains("Not measured"));
        let nystrom = part_of(&page, "nystrom");
        assert!(nystrom.contains("- Nyström attention against exact softmax attention"));
    }

    #[test]
    fn publishing_one_target_keeps_every_other_part() {
        let first = page(&[run(
            "condition_number",
            "kappa_linalg",
            "64x64",
            vec![products_record()],
        )]);
        let later = Provenance {
            commit: "`ba9876543210`".into(),
            ..provenance()
        };
        let runs = [run("optim_f32", "kappa_adamw", "1000x1000", vec![])];
        let second = splice(&first, &runs, &later, &["optim"]).unwrap();
        for bench in targets().into_iter().filter(|&b| b != "optim") {
            assert_eq!(part_of(&first, bench), part_of(&second, bench), "{bench}");
        }
        let optim = part_of(&second, "optim");
        assert!(optim.contains("`ba9876543210`") && optim.contains("| 1000x1000 | 1 |"));
        // Publishing the same again changes nothing; a page never published starts from the
        // targets' placeholders.
        assert_eq!(splice(&second, &runs, &later, &["optim"]).unwrap(), second);
        let fresh = splice("", &runs, &later, &["optim"]).unwrap();
        assert!(
            part_of(&fresh, "gemm").contains("Not measured yet: `cargo xtask bench --bench gemm")
        );
    }

    #[test]
    fn a_page_whose_parts_cannot_be_read_is_an_error_and_is_kept() {
        let runs = [run("optim_f32", "kappa_adamw", "1000x1000", vec![])];
        let p = provenance();
        for bad in [
            "# Performance\n\n## Some table\n",
            "<!-- kappa:bench optim -->\n## x\n",
            "<!-- kappa:bench optim -->\n<!-- kappa:end gemm -->\n",
            "<!-- kappa:bench a -->\n<!-- kappa:bench b -->\n",
        ] {
            assert!(splice(bad, &runs, &p, &["optim"]).is_err(), "{bad:?}");
        }
    }
}
