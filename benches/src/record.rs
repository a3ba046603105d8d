//! The benches' own records: what a bench measured outside criterion (paired ratios against a
//! peer in a child process, the machine's limits), as small JSON files beside criterion's, so
//! that `cargo xtask bench --publish` can put them on `docs/performance.md`.
//!
//! [`write()`] is the one place that writes them: `<criterion>/kappa-paired/<bench>/<name>.json`,
//! each with the time it was written (`written_unix`, seconds since 1970), the CPU model and the
//! body the bench gives. Two bodies exist:
//!
//! - a paired comparison ([`Paired`]): a title, what is compared, the peer, what the ratio's
//!   range is, the work model's formula, and rows of (parameter, variant, threads, both sides'
//!   median seconds, the ratio kappa / peer as median with its range, and optionally the work
//!   one kappa call does against a physical bound: flops for a GEMM bound, bytes for memory);
//! - the machine's limits (`benches/benches/limits.rs`): peak GEMM GFLOP/s and triad GB/s.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::paired::{cpu_model, Spread};

/// The physical limit a row's work is measured against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// f32 GEMM throughput (flops).
    GemmF32,
    /// bf16 GEMM throughput (flops).
    GemmBf16,
    /// f64 GEMM throughput (flops).
    GemmF64,
    /// Memory bandwidth (bytes).
    Memory,
}

impl Bound {
    /// The name the records and `docs/performance.md` use.
    pub fn name(self) -> &'static str {
        match self {
            Bound::GemmF32 => "gemm_f32",
            Bound::GemmBf16 => "gemm_bf16",
            Bound::GemmF64 => "gemm_f64",
            Bound::Memory => "memory",
        }
    }
}

/// The work of one kappa call: `amount` flops (a GEMM bound) or bytes (memory).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Work {
    /// Which limit it is measured against.
    pub bound: Bound,
    /// Flops or bytes of one call.
    pub amount: f64,
}

/// A ratio's median with its range (the range [`Paired::spread`] names).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ratio {
    /// The median per-pair ratio kappa / peer.
    pub median: f64,
    /// The range's lower end.
    pub lo: f64,
    /// The range's upper end.
    pub hi: f64,
    /// How many pairs.
    pub pairs: usize,
}

impl Ratio {
    /// A spread of per-pair ratios kappa / peer, its range min–max.
    pub fn of(s: Spread) -> Self {
        Self {
            median: s.median,
            lo: s.min,
            hi: s.max,
            pairs: s.count,
        }
    }

    /// A spread of per-pair ratios peer / kappa, turned into kappa / peer.
    pub fn inverse_of(s: Spread) -> Self {
        Self {
            median: 1.0 / s.median,
            lo: 1.0 / s.max,
            hi: 1.0 / s.min,
            pairs: s.count,
        }
    }
}

/// One row of a paired comparison.
#[derive(Clone, Debug)]
pub struct Row {
    /// The shape or size (as criterion's parameters: `384x1536`, `N64_D64_k16`, …).
    pub parameter: String,
    /// The variant within the comparison (`f32`, `bf16 aol`, …; empty when there is one).
    pub variant: String,
    /// Threads of both sides.
    pub threads: usize,
    /// kappa's median seconds per call, where measured.
    pub kappa_s: Option<f64>,
    /// The peer's median seconds per call, where measured.
    pub peer_s: Option<f64>,
    /// kappa / peer, per pair.
    pub ratio: Ratio,
    /// The work of one kappa call against its bound, where one applies.
    pub work: Option<Work>,
}

/// A paired comparison's summary, written by [`Paired::write`].
#[derive(Clone, Debug)]
pub struct Paired {
    /// The bench target (`optim`, `models`, …).
    pub bench: &'static str,
    /// The record's file name within the bench's folder.
    pub name: &'static str,
    /// The table's heading.
    pub title: String,
    /// What is compared, in a sentence or two.
    pub what: String,
    /// The peer's name.
    pub peer: String,
    /// What the ratio's range is ("min–max over pairs", "interquartile range over pairs").
    pub spread: &'static str,
    /// The work model's formula (empty when no bound applies).
    pub model: String,
    /// The rows.
    pub rows: Vec<Row>,
}

impl Paired {
    /// The summary as a JSON body for [`write()`].
    pub fn to_json(&self) -> Value {
        let rows: Vec<Value> = self.rows.iter().map(row_json).collect();
        json!({
            "kind": "paired",
            "title": self.title,
            "what": self.what,
            "peer": self.peer,
            "spread": self.spread,
            "model": self.model,
            "rows": rows,
        })
    }

    /// Writes the summary ([`write()`]); a summary without rows is not written.
    pub fn write(&self) {
        if !self.rows.is_empty() {
            write(self.bench, self.name, self.to_json());
        }
    }
}

fn row_json(r: &Row) -> Value {
    json!({
        "parameter": r.parameter,
        "variant": r.variant,
        "threads": r.threads,
        "kappa_s": r.kappa_s,
        "peer_s": r.peer_s,
        "ratio": { "median": r.ratio.median, "lo": r.ratio.lo, "hi": r.ratio.hi },
        "pairs": r.ratio.pairs,
        "bound": r.work.map(|w| w.bound.name()),
        "work": r.work.map(|w| w.amount),
    })
}

/// The folder the records live in: `<criterion>/kappa-paired`.
pub fn records_dir() -> Option<PathBuf> {
    Some(crate::criterion_dir()?.join("kappa-paired"))
}

/// `body` with the time and CPU added, as `<records_dir>/<bench>/<name>.json`; the path written,
/// or `None` (with a note on stderr) when it could not be: a record is a by-product of a bench,
/// never a reason for it to fail.
pub fn write(bench: &str, name: &str, body: Value) -> Option<PathBuf> {
    let written = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut record = json!({
        "bench": bench,
        "name": name,
        "written_unix": written,
        "cpu": cpu_model(),
    });
    if let (Some(all), Value::Object(fields)) = (record.as_object_mut(), body) {
        all.extend(fields);
    }
    let dir = records_dir()?.join(bench);
    let path = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(&record).unwrap_or_default();
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, text)) {
        Ok(()) => Some(path),
        Err(e) => {
            eprintln!("could not write {}: {e}", path.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inverse_ratio_swaps_its_range() {
        let s = Spread::of(vec![2.0, 4.0, 5.0]);
        let r = Ratio::inverse_of(s);
        assert_eq!((r.median, r.lo, r.hi, r.pairs), (0.25, 0.2, 0.5, 3));
    }

    #[test]
    fn a_paired_summary_names_its_bound_and_work_per_row() {
        let p = Paired {
            bench: "optim",
            name: "muon_vs_torch",
            title: "t".into(),
            what: "w".into(),
            peer: "torch.optim.Muon".into(),
            spread: "min–max over pairs",
            model: "5 (4r²s + 2r³)".into(),
            rows: vec![Row {
                parameter: "384x384".into(),
                variant: "f32".into(),
                threads: 2,
                kappa_s: Some(1e-3),
                peer_s: None,
                ratio: Ratio::of(Spread::of(vec![0.5, 0.7])),
                work: Some(Work {
                    bound: Bound::GemmF32,
                    amount: 1e9,
                }),
            }],
        };
        let v = p.to_json();
        assert_eq!(v["kind"], "paired");
        assert_eq!(v["rows"][0]["bound"], "gemm_f32");
        assert_eq!(v["rows"][0]["work"], 1e9);
        assert_eq!(v["rows"][0]["peer_s"], Value::Null);
        assert_eq!(v["rows"][0]["ratio"]["median"], 0.6);
    }
}
