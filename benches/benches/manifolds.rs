//! Criterion benchmarks of the module-wise assignments of *Different Layers, Different
//! Manifolds*: one training step (forward, backward, clipping, every group's optimizer) of the
//! `manifolds` experiment's CPU GPT under each of the five presets, and one Polar Express msign
//! at each hidden-matrix shape.
//!
//! Run: `KAPPA_BENCH_THREADS=1 cargo bench -p kappa-benches --bench manifolds` (or
//! `cargo xtask bench --threads 1 --bench manifolds`). Settings (environment):
//! `KAPPA_BENCH_THREADS` (1 or 2), `KAPPA_BENCH_SECONDS` (criterion measurement time, default 5),
//! `KAPPA_BENCH_D` (model width, default 64).
//!
//! Each preset runs three times: one optimizer call per matrix; `+batch`
//! (`ModulewiseConfig::batch`: same-shape matrices stepped together, the manifold groups' dual
//! ascents in lock step, msign's `Precision::Auto` decided on each batch's flops, so bf16 on
//! CPUs with native bf16 where the single matrix computes in f32); and `+batch-f32` (batched,
//! msign in f32, the prediction's precision). After the criterion output a summary prints, per
//! run: the step time and its ratio to UNCONSTRAINED, the time inside the Muon / manifold-Muon updates and its share of the step,
//! the msign calls those updates made, and the time those calls predict (calls × one msign of
//! the matrix's shape, timed here) — the goal is measured / predicted ≤ 1, i.e. no overhead
//! beyond the msign count (20 dual steps + 1 retraction per tall matrix); then the same per
//! group; then the same ratio alternating: per preset the three runs take turns, two steps each per
//! round, with msign re-timed every round (`KAPPA_BENCH_MANIFOLD_ROUNDS`, default 8), as medians
//! with their range, beside each run's optimizer time over the per-matrix run's.
//!
//! Then, per hidden-matrix shape, the tangent-problem solvers alone (group
//! `manifolds_tangent_solvers`): the dual ascent (`DualAscent::feasible()`) against ADMM
//! (`Admm::standard()`) on a Stiefel point with a Gaussian gradient, each run to the same
//! violation (1e-3, at most 200 msign calls), with the msign calls each needed printed.

// libtorch's MKL chooses kernels by CPU features, as in kappa's binaries (build.rs).
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

// Rust's allocations on mimalloc, which keeps freed pages for reuse (glibc returns N×N
// temporaries to the kernel; docs/architecture.md, "The memory allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use criterion::{black_box, Criterion};
use kappa_benches::paired::Spread;
use kappa_benches::record::{self, Ratio, Row};
use kappa_benches::{configure_threads, fmt_ms, fmt_ratio, median_seconds, train_step, NOT_RUN};
use kappa_models::{Gpt, GptConfig};
use kappa_optim::Optimizer;
use kappa_optim::{
    msign, Admm, DualAscent, DualSolver, Manifold, ManifoldMuon, ManifoldMuonConfig, Msign,
    Precision,
};
use kappa_train::{modulewise_groups, seeded, ModulewiseConfig, Preset, TrainConfig};
use tch::{nn, Device, Kind, Tensor};

const GROUP: &str = "manifolds_train_step";
const SOLVERS: &str = "manifolds_tangent_solvers";
/// The violation both solvers are run to.
const SOLVER_TOL: f64 = 1e-3;
const BATCH: i64 = 16;
const VOCAB: usize = 98;
const LR: f64 = 6e-4;

fn model(d: usize) -> GptConfig {
    GptConfig {
        vocab_size: VOCAB,
        block_size: 128,
        n_layer: 4,
        n_head: (d / 32).max(1),
        n_embd: d,
        ..GptConfig::tiny(VOCAB)
    }
}

/// One training step as the `Trainer` takes it, with the preset's groups.
struct Stepper {
    opt: Optimizer,
}

impl Stepper {
    fn new(vs: &nn::VarStore, preset: Preset, run: Run) -> Self {
        let train = TrainConfig {
            lr: LR,
            ..TrainConfig::default()
        };
        let mut cfg = ModulewiseConfig {
            batch: run != Run::PerMatrix,
            ..ModulewiseConfig::paper(preset)
        };
        if run == Run::BatchedF32 {
            cfg.muon.precision = Precision::F32;
            cfg.manifold.precision = Precision::F32;
        }
        let groups = modulewise_groups(vs, &cfg, &train).expect("groups");
        let opt = Optimizer::new(groups).expect("optimizer");
        Self { opt }
    }

    fn step(&mut self, loss: impl FnOnce() -> Tensor) {
        train_step(&mut self.opt, loss);
    }

    /// Drops the statistics gathered so far.
    fn reset_stats(&mut self) {
        let _ = self.opt.take_stats();
    }

    /// Per group: (stored shape of its matrices, updates, seconds, msign calls in total).
    fn stats(&mut self) -> BTreeMap<String, ((i64, i64), u64, f64, f64)> {
        let mut out = BTreeMap::new();
        let sizes: Vec<Vec<i64>> = self
            .opt
            .groups()
            .iter()
            .map(|g| g.params()[0].size())
            .collect();
        let matrices: Vec<bool> = (self.opt.groups().iter())
            .map(|g| !matches!(g.update(), kappa_optim::Update::AdamW(_)))
            .collect();
        let stats = self.opt.take_stats().into_iter().zip(sizes).zip(matrices);
        for (((name, s), size), matrix) in stats {
            if matrix {
                let calls = s.msign_calls.map_or(s.updates as f64, |c| {
                    // dual ascent + diagnostics, plus one retraction per update
                    (c + 1.0) * s.updates as f64
                });
                out.insert(name, ((size[0], size[1]), s.updates, s.seconds, calls));
            }
        }
        out
    }
}

/// How a preset's optimizers run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Run {
    /// One optimizer call per matrix.
    PerMatrix,
    /// Same-shape matrices together (`ModulewiseConfig::batch`), msign's precision `Auto`
    /// decided on each batch.
    Batched,
    /// Batched with msign in f32, the precision the prediction's single msign takes here.
    BatchedF32,
}

const RUNS: [Run; 3] = [Run::PerMatrix, Run::Batched, Run::BatchedF32];

/// The bench name of a preset's run.
fn run_name(preset: Preset, run: Run) -> String {
    match run {
        Run::PerMatrix => preset.name().to_string(),
        Run::Batched => format!("{}+batch", preset.name()),
        Run::BatchedF32 => format!("{}+batch-f32", preset.name()),
    }
}

/// Median seconds of one Polar Express msign of a `shape` matrix (the precision `Auto` picks).
fn msign_seconds(shape: (i64, i64)) -> f64 {
    let x = seeded(7, || {
        Tensor::randn([shape.0, shape.1], (Kind::Float, Device::Cpu))
    });
    let mut times = Vec::new();
    for i in 0..25 {
        let t = Instant::now();
        let o = msign(&x, Msign::polar_express(), Precision::Auto).expect("msign");
        black_box(o.double_value(&[0, 0]));
        if i >= 5 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Rounds of the alternating table (`KAPPA_BENCH_MANIFOLD_ROUNDS`, default 8).
fn rounds() -> usize {
    std::env::var("KAPPA_BENCH_MANIFOLD_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8)
}

/// One round of a run: two training steps, then the optimizer's time per step over its
/// msign-count prediction with msign timed in the same round (`msign` caches one timing per
/// shape per round).
fn paired_round(
    stepper: &mut Stepper,
    step: &mut dyn FnMut(&mut Stepper),
    msign: &mut BTreeMap<(i64, i64), f64>,
) -> (f64, f64) {
    stepper.reset_stats();
    step(stepper);
    step(stepper);
    let (mut seconds, mut predicted) = (0.0, 0.0);
    for (shape, _updates, s, n) in stepper.stats().values() {
        let one = *msign.entry(*shape).or_insert_with(|| msign_seconds(*shape));
        seconds += s / 2.0;
        predicted += n / 2.0 * one;
    }
    (seconds, seconds / predicted)
}

/// Per preset, the three runs alternate round by round (order rotated each round) with msign
/// re-timed every round, so load drifts hit all of them alike: the optimizer's time per step
/// over its msign-count prediction, and the batched runs' optimizer time over the per-matrix
/// run's, as medians with their range over rounds.
fn paired_table(cfg: GptConfig, idx: &Tensor) {
    let rounds = rounds();
    println!("\nalternating, {rounds} rounds of 2 steps per run (median [min–max] over rounds):");
    println!("| preset | run | optimizer ms/step | measured / predicted | optimizer time / per-matrix run's |");
    println!("|---|---|---|---|---|");
    let mut rows = Vec::new();
    for preset in Preset::ALL {
        let mut runs: Vec<(Run, Gpt, Stepper, nn::VarStore)> = RUNS
            .iter()
            .map(|&run| {
                let vs = nn::VarStore::new(Device::Cpu);
                let gpt = seeded(0, || Gpt::new(&vs.root(), cfg)).expect("gpt");
                let stepper = Stepper::new(&vs, preset, run);
                (run, gpt, stepper, vs)
            })
            .collect();
        let mut results: Vec<Vec<(f64, f64)>> = vec![Vec::new(); runs.len()];
        for round in 0..rounds {
            let mut msign = BTreeMap::new();
            for k in 0..runs.len() {
                let i = (k + round) % runs.len();
                let (_, gpt, stepper, _) = &mut runs[i];
                let mut step = |s: &mut Stepper| s.step(|| gpt.loss(idx, idx).expect("loss"));
                results[i].push(paired_round(stepper, &mut step, &mut msign));
            }
        }
        for (i, (run, ..)) in runs.iter().enumerate() {
            let ms: Vec<f64> = results[i].iter().map(|r| r.0 * 1e3).collect();
            let ratio: Vec<f64> = results[i].iter().map(|r| r.1).collect();
            let versus: Vec<f64> = results[i]
                .iter()
                .zip(&results[0])
                .map(|(r, base)| r.0 / base.0)
                .collect();
            let predicted: Vec<f64> = results[i].iter().map(|r| r.0 / r.1).collect();
            println!(
                "| {} | {} | {} | {} | {} |",
                preset.name(),
                run_name(preset, *run),
                Spread::of(ms.clone()),
                Spread::of(ratio.clone()),
                Spread::of(versus)
            );
            rows.push(Row {
                parameter: format!("d = {}, {} layers", cfg.n_embd, cfg.n_layer),
                variant: run_name(preset, *run),
                threads: tch::get_num_threads() as usize,
                kappa_s: Some(Spread::of(ms).median / 1e3),
                peer_s: Some(Spread::of(predicted).median),
                ratio: Ratio::of(Spread::of(ratio)),
                work: None,
            });
        }
    }
    record::Paired {
        bench: "manifolds",
        name: "optimizer_vs_msign_count",
        title: "Module-wise optimizers against their msign count".into(),
        what: "The optimizer part of one training step of the manifolds experiment's GPT under \
               each preset (Muon, manifold Muon on Stiefel and DGram, AdamW), per matrix, \
               batched (`+batch`) and batched in f32 (`+batch-f32`), against what its msign \
               calls predict: the calls it made times one Polar Express msign of each matrix's \
               shape, timed in the same round. 1 is no overhead beyond the msign count; runs \
               alternate round by round."
            .into(),
        peer: "msign calls × one msign".into(),
        spread: "min–max over rounds",
        model: String::new(),
        rows,
    }
    .write();
}

/// The ascent and ADMM settings that stop at [`SOLVER_TOL`] (or after 200 msign calls).
fn solver_configs() -> [(&'static str, ManifoldMuonConfig); 2] {
    let base = ManifoldMuonConfig {
        diagnostics: false,
        square_closed_form: false,
        ..ManifoldMuonConfig::paper(Manifold::Stiefel)
    };
    let ascent = DualAscent {
        steps: 200,
        tol: SOLVER_TOL,
        ..DualAscent::feasible()
    };
    let admm = Admm {
        steps: 100,
        tol: SOLVER_TOL,
        ..Admm::standard()
    };
    [
        (
            "ascent",
            ManifoldMuonConfig {
                dual: ascent,
                ..base
            },
        ),
        (
            "admm",
            ManifoldMuonConfig {
                solver: DualSolver::Admm(admm),
                ..base
            },
        ),
    ]
}

/// Benchmarks both solvers' direction at `shape` (Stiefel point, Gaussian gradient) and prints
/// the msign calls each needed to reach [`SOLVER_TOL`].
fn bench_solvers(c: &mut Criterion, shape: (i64, i64)) {
    for (name, cfg) in solver_configs() {
        let opt = ManifoldMuon::new(cfg).expect("solver config");
        let mut w = seeded(11, || {
            Tensor::randn([shape.0, shape.1], (Kind::Float, Device::Cpu))
        });
        opt.retract_onto(&mut w).expect("retract");
        let g = seeded(12, || {
            Tensor::randn([shape.0, shape.1], (Kind::Float, Device::Cpu))
        });
        let (_, report) = opt.direction(&w, &g).expect("direction");
        println!(
            "{}×{} {name}: {} msign calls, violation {:.2e}, gap {:?}",
            shape.0, shape.1, report.msign_calls, report.ascent_violation, report.gap
        );
        c.benchmark_group(SOLVERS)
            .bench_function(format!("{}x{}/{name}", shape.0, shape.1), |b| {
                b.iter(|| black_box(opt.direction(&w, &g).expect("direction")))
            });
    }
}

fn main() {
    let threads = configure_threads();
    let seconds: u64 = std::env::var("KAPPA_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let d: usize = std::env::var("KAPPA_BENCH_D")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let cfg = model(d);
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(seconds))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(10);
    let idx = seeded(1, || {
        Tensor::randint(
            VOCAB as i64,
            [BATCH, cfg.block_size as i64],
            (Kind::Int64, Device::Cpu),
        )
    });
    let mut optimizer = BTreeMap::new();
    for preset in Preset::ALL {
        for run in RUNS {
            let vs = nn::VarStore::new(Device::Cpu);
            let gpt = seeded(0, || Gpt::new(&vs.root(), cfg)).expect("gpt");
            let mut stepper = Stepper::new(&vs, preset, run);
            let name = run_name(preset, run);
            c.benchmark_group(GROUP).bench_function(&name, |b| {
                b.iter(|| stepper.step(|| black_box(gpt.loss(&idx, &idx).expect("loss"))))
            });
            // Ten more steps for the optimizer's own accounting.
            stepper.reset_stats();
            for _ in 0..10 {
                stepper.step(|| gpt.loss(&idx, &idx).expect("loss"));
            }
            optimizer.insert(name, stepper.stats());
        }
    }
    c.final_summary();

    let mut shapes: BTreeMap<(i64, i64), f64> = BTreeMap::new();
    for groups in optimizer.values() {
        for (shape, ..) in groups.values() {
            shapes
                .entry(*shape)
                .or_insert_with(|| msign_seconds(*shape));
        }
    }
    for shape in shapes.keys() {
        bench_solvers(&mut c, *shape);
    }
    println!(
        "\nmodule-wise assignments, GPT d={d} L={} T={} batch {BATCH}, {threads} thread(s)",
        cfg.n_layer, cfg.block_size
    );
    println!("one Polar Express msign (10 steps, precision Auto):");
    for (s, t) in &shapes {
        println!("  {}×{}: {}", s.0, s.1, fmt_ms(Some(*t)));
    }
    println!("| preset | step ms | × UNCONSTRAINED | optimizer ms/step | optimizer share | msign calls/step | predicted ms/step | measured / predicted |");
    println!("|---|---|---|---|---|---|---|---|");
    let base = median_seconds(GROUP, Preset::Unconstrained.name(), "");
    let runs = Preset::ALL
        .into_iter()
        .flat_map(|p| RUNS.map(|r| run_name(p, r)));
    for name in runs {
        let step = median_seconds(GROUP, &name, "");
        let groups = &optimizer[&name];
        let (mut seconds, mut calls, mut predicted) = (0.0, 0.0, 0.0);
        for (shape, _updates, s, n) in groups.values() {
            seconds += s / 10.0;
            calls += n / 10.0;
            predicted += n / 10.0 * shapes[shape];
        }
        println!(
            "| {name} | {} | {} | {} | {} | {calls:.0} | {} | {} |",
            fmt_ms(step),
            fmt_ratio(step.zip(base).map(|(a, b)| a / b)),
            fmt_ms(Some(seconds)),
            step.map_or(NOT_RUN.into(), |s| format!("{:.0}%", 100.0 * seconds / s)),
            fmt_ms(Some(predicted)),
            fmt_ratio(Some(seconds / predicted)),
        );
    }
    paired_table(cfg, &idx);
    println!("\nper group (ms per step: measured / predicted):");
    for (run, groups) in &optimizer {
        let parts: Vec<String> = groups
            .iter()
            .map(|(g, (shape, _, s, n))| {
                let predicted = n / 10.0 * shapes[shape];
                format!("{g} {:.2}/{:.2}", s / 10.0 * 1e3, predicted * 1e3)
            })
            .collect();
        println!("  {run}: {}", parts.join(", "));
    }
}
