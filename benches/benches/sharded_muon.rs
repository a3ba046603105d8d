//! Muon's orthogonalizations sharded over the ranks of a data-parallel run
//! (`Optimizer::shard`, kappa-optim's feature `dist`) against one rank stepping them all.
//!
//! The parameters are GPT-2 small's 48 hidden matrices (12 layers of c_attn 768×2304, attn
//! c_proj 768×768, mlp c_fc 768×3072 and mlp c_proj 3072×768; CPU f32), or with
//! `KAPPA_BENCH_QUICK=1` a 4-layer, 128-wide stand-in for smoke runs (4 matrices per shape, so
//! that each rank's part holds two: a part of one is stepped beside a copy of itself), in one
//! Muon group (`MuonConfig::keller()` at `Precision::F32`: one batch per shape). Every parameter
//! gets a seeded gradient once, which each step reads and leaves defined.
//!
//! Both sides run in one process on kappa-dist's `Threads` backend with W = 2 ranks, each rank
//! thread with one libtorch thread (`tch::set_num_threads(1)` on every thread: libtorch's OpenMP
//! thread count is a per-thread setting, so each rank thread sets its own). Per round, A is one
//! `Optimizer::step()` of an unsharded optimizer on rank 0 while rank 1 waits at a barrier, and
//! B is one step of the sharded optimizers on both ranks (rank 0's wall time: the step ends with
//! the exchanges, so both ranks finish together). A goes first in even rounds, B in odd ones.
//! Printed: the median per-round ratio B/A [min–max] with each side's median time; the same
//! ratio for B less its exchanges (`Traffic::seconds`: rank 0's own share of the
//! orthogonalizations and updates; goal ≤ 0.55); and the bytes rank 0 received per sharded step
//! against the least it needs (`Optimizer::traffic`: the weights and momenta of the blocks the
//! other rank stepped).
//!
//! Run (nothing else should run on the machine meanwhile; two cores at least):
//!
//! ```text
//! cargo bench -p kappa-benches --bench sharded_muon
//! KAPPA_BENCH_QUICK=1 KAPPA_BENCH_PAIRS=2 cargo bench -p kappa-benches --bench sharded_muon
//! ```
//!
//! Settings (environment): `KAPPA_BENCH_QUICK=1` (the small model), `KAPPA_BENCH_PAIRS`
//! (rounds, default 7; one untimed round first).

// libtorch's MKL chooses kernels by CPU features, as in kappa's binaries (build.rs).
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

// Rust's allocations on mimalloc, as every bench binary (docs/architecture.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;

use kappa_benches::gpt2::leaf_with_grad;
use kappa_benches::paired::{cpu_model, ratios, seconds, Spread};
use kappa_benches::{configure_threads, record};
use kappa_dist::{Communicator, Threads};
use kappa_optim::optimizer::{Group, Optimizer, Traffic};
use kappa_optim::{MuonConfig, Precision};

/// The ranks of the sharded side.
const WORLD: usize = 2;

/// The hidden matrices of `layers` GPT-2 blocks of width `d`, as (name, size).
fn hidden(layers: usize, d: i64) -> Vec<(String, Vec<i64>)> {
    let mut out = Vec::new();
    for l in 0..layers {
        out.push((format!("h.{l}.attn.c_attn.weight"), vec![d, 3 * d]));
        out.push((format!("h.{l}.attn.c_proj.weight"), vec![d, d]));
        out.push((format!("h.{l}.mlp.c_fc.weight"), vec![d, 4 * d]));
        out.push((format!("h.{l}.mlp.c_proj.weight"), vec![4 * d, d]));
    }
    out
}

/// A one-group Muon optimizer over fresh seeded copies of `params` (the same on every call).
fn optimizer(params: &[(String, Vec<i64>)]) -> Optimizer {
    let config = MuonConfig {
        precision: Precision::F32,
        ..MuonConfig::keller()
    };
    let tensors = params
        .iter()
        .enumerate()
        .map(|(i, (name, size))| (name.clone(), leaf_with_grad(size, 100 + i as i64)));
    Optimizer::new(vec![Group::muon("muon", config).with_params(tensors)])
        .expect("a valid Muon group")
}

/// What rank 0 measured: per round the unsharded and the sharded step's seconds and the sharded
/// step's seconds less its exchanges (its own share of the updates); the sharded step's traffic.
struct Measured {
    single: Vec<f64>,
    sharded: Vec<f64>,
    own_share: Vec<f64>,
    traffic: Traffic,
}

/// One rank's rounds: rank 0 also times the unsharded optimizer while the others wait.
fn rank(comm: Threads, params: &[(String, Vec<i64>)], rounds: usize) -> Option<Measured> {
    tch::set_num_threads(1);
    let comm: Arc<dyn Communicator> = Arc::new(comm);
    let first = comm.rank() == 0;
    let mut single = first.then(|| optimizer(params));
    let mut sharded = optimizer(params);
    sharded.shard(Arc::clone(&comm));
    let mut out = Measured {
        single: Vec::new(),
        sharded: Vec::new(),
        own_share: Vec::new(),
        traffic: Traffic::default(),
    };
    for round in 0..=rounds {
        let mut a = || {
            let t = single
                .as_mut()
                .map(|o| seconds(&mut || o.step().expect("a step")));
            comm.barrier().expect("the ranks meet");
            t
        };
        let mut b = || {
            comm.barrier().expect("the ranks meet");
            seconds(&mut || sharded.step().expect("a sharded step"))
        };
        let (ta, tb) = if round % 2 == 0 {
            let ta = a();
            (ta, b())
        } else {
            let tb = b();
            (a(), tb)
        };
        if round > 0 {
            out.single.extend(ta);
            out.sharded.push(tb);
            out.own_share.push(tb - sharded.traffic().seconds);
        }
    }
    out.traffic = sharded.traffic();
    first.then_some(out)
}

fn main() {
    let threads = configure_threads();
    let quick = std::env::var("KAPPA_BENCH_QUICK").is_ok_and(|v| v == "1");
    let rounds: usize = std::env::var("KAPPA_BENCH_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7)
        .max(1);
    let params = if quick {
        hidden(4, 128)
    } else {
        hidden(12, 768)
    };
    println!(
        "sharded Muon: {} hidden matrices ({}), f32, W = {WORLD} (Threads), 1 libtorch thread per rank; {} (KAPPA_BENCH_THREADS={threads})",
        params.len(),
        if quick { "4 × 128, quick" } else { "GPT-2 small" },
        cpu_model()
    );
    let results = Threads::run(WORLD, |comm| rank(comm, &params, rounds)).expect("the ranks run");
    let Some(Some(m)) = results.into_iter().next() else {
        eprintln!("rank 0 measured nothing");
        std::process::exit(1);
    };
    let ratio = Spread::of(ratios(&m.sharded, &m.single));
    write_record(&m, params.len(), quick);
    let share = Spread::of(ratios(&m.own_share, &m.single));
    let exchanges: Vec<f64> = (m.sharded.iter().zip(&m.own_share))
        .map(|(s, o)| s - o)
        .collect();
    println!(
        "per-rank step time, sharded / one rank: {ratio}; one rank {:.1} ms, sharded {:.1} ms, of which exchanges {:.1} ms (medians of {rounds} rounds)",
        1e3 * Spread::of(m.single.clone()).median,
        1e3 * Spread::of(m.sharded.clone()).median,
        1e3 * Spread::of(exchanges).median,
    );
    println!("per-rank orthogonalization (the step less its exchanges) / one rank: {share} (goal ≤ 0.55)");
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "bytes rank 0 received per sharded step: {:.1} MiB, least needed {:.1} MiB ({:.3}×)",
        mib(m.traffic.received),
        mib(m.traffic.minimum),
        m.traffic.received as f64 / m.traffic.minimum.max(1) as f64
    );
}

/// The sharded-against-one-rank ratio as the bench's record (`kappa_benches::record`).
fn write_record(m: &Measured, matrices: usize, quick: bool) {
    let model = if quick {
        "4 × 128, quick"
    } else {
        "GPT-2 small"
    };
    record::Paired {
        bench: "sharded_muon",
        name: "sharded_vs_one_rank",
        title: "Muon sharded over two ranks against one rank".into(),
        what: "One `Optimizer::step()` of Muon over a model's hidden matrices (f32, Keller's \
               settings), sharded over W = 2 ranks of kappa-dist's `Threads` (one libtorch \
               thread each), against one rank stepping them all; rounds alternated. `step`: \
               the whole sharded step; `own share`: the step less its exchanges (rank 0's \
               orthogonalizations and updates, `Traffic::seconds` subtracted per round). 0.5 is \
               a perfect split."
            .into(),
        peer: "one rank".into(),
        spread: "min–max over rounds",
        model: String::new(),
        rows: vec![
            row(m, &m.sharded, "step", matrices, model),
            row(m, &m.own_share, "own share", matrices, model),
        ],
    }
    .write();
}

/// The record's row for the sharded side's `seconds` (one per round) against one rank.
fn row(m: &Measured, seconds: &[f64], variant: &str, matrices: usize, model: &str) -> record::Row {
    record::Row {
        parameter: format!("{matrices} matrices ({model})"),
        variant: variant.into(),
        threads: WORLD,
        kappa_s: Some(Spread::of(seconds.to_vec()).median),
        peer_s: Some(Spread::of(m.single.clone()).median),
        ratio: record::Ratio::of(Spread::of(ratios(seconds, &m.single))),
        work: None,
    }
}
