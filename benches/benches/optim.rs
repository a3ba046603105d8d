//! Benchmarks of kappa-optim on the tch backend (f32, CPU; Muon also with `Precision::Auto`,
//! bf16 on CPUs with native bf16 products): one Muon step against its bare
//! Newton–Schulz matmuls, one Stiefel and one DGram manifold-Muon step (paper preset, K = 20)
//! against one AdamW step (tch's), kappa's fused AdamW step against tch's (`kappa_adamw`), the
//! dual-ascent cost in msign units, and kappa's Muon against
//! `torch.optim.Muon` at the same shapes and on a GPT-2 block's four matrices, same thread count,
//! in f32 and bf16 (kappa's bf16 rows: the shipped quintic, AOL, the Gram Polar Express and AOL
//! as Gram Newton–Schulz): the peer is a child process stepping on command
//! (`benches/reference/muon_torch.py`), and single steps of the two alternate in one run.
//!
//! Group `optim_batch`: (a) Muon's step over all hidden matrices of a small GPT (4 layers ×
//! 256, 64 or 32 wide: QKV 3D×D, out D×D, fc 4D×D, proj D×4D, 16 matrices), one batched
//! call per shape (`Muon::step_batch`) against one `Muon::step` per matrix; (b) at 384², 768²
//! and 768×3072 the Muon step (Keller's config) beside its own bare msign (the same quintic, the
//! same precision), in f32 and Auto. Criterion times each side; the printed ratios (goals ≥ 3
//! and ≤ 1.1) come from a second, paired measurement ([`print_batch_summary`]): the two sides
//! alternate in one run, `KAPPA_BENCH_PAIRS` pairs per row (default 11), each side's sample the
//! mean of enough calls to last ≥ 50 ms; the batched rows also at GPT-2's depth (12 layers, 12
//! matrices per shape), where batching can reach further than 4 matrices per shape allow; then,
//! paired the same way, the f32 step with libtorch's MKL `syrk` against the step without it, and
//! a wide bf16 tensor's Gram matrix by row blocks (`Matrix::gram`) against libtorch's X·Xᵀ.
//!
//! Run: `KAPPA_BENCH_THREADS=1 cargo bench -p kappa-benches --bench optim` (and again with 2).
//! `KAPPA_BENCH_QUICK=1` keeps only 384×384 (a smoke run); `KAPPA_BENCH_VERSUS_ONLY=1` runs only
//! the side-by-side table against `torch.optim.Muon` (`KAPPA_BENCH_VERSUS_PAIRS` pairs per cell,
//! default 15; `KAPPA_BENCH_VERSUS_CELLS=f32,bf16 aol3` keeps only the rows of those labels),
//! `KAPPA_BENCH_BATCH_ONLY=1` only the paired batch summary. The manifold steps take seconds at the
//! larger shapes (20 Polar Express msigns of 10 steps each), so they are timed by hand (one warm-up,
//! then the median of `KAPPA_BENCH_REPS` runs, default 3) instead of through criterion.

// libtorch's MKL chooses kernels by CPU features, as in kappa's binaries (build.rs).
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

// Rust's allocations on mimalloc, which keeps freed pages for reuse (glibc returns N×N
// temporaries to the kernel; docs/architecture.md, "The memory allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::{Duration, Instant};

use criterion::{black_box, BenchmarkId, Criterion};
use kappa_benches::paired::{cpu_model, ratios, seconds, Spread};
use kappa_benches::peer::{reference_command, Peer};
use kappa_benches::record;
use kappa_benches::{
    configure_threads, fmt_ms, fmt_ratio, gaussian, median_seconds, ns_step_flops, shape_id,
};
use kappa_linalg::tch_backend::tensor_from_array;
use kappa_linalg::Matrix;
use kappa_optim::{
    msign, AdamW, AdamWConfig, AdamWKernel, AdamWState, Manifold, ManifoldMuon, ManifoldMuonConfig,
    ManifoldState, Msign, Muon, MuonConfig, MuonState, Precision, WorkingPrecision,
};
use ndarray::Array2;
use tch::nn::OptimizerConfig;
use tch::{Device, Kind, Tensor};

const GROUP: &str = "optim_f32";
const BATCH_GROUP: &str = "optim_batch";
/// Widths of the small GPTs whose matrices are stepped batched and one by one.
const GPT_WIDTHS: [usize; 3] = [256, 64, 32];
/// Layers of the GPT criterion times (matrices per shape).
const GPT_LAYERS: usize = 4;
/// Layers of the GPTs in the paired summary: the criterion one's, and GPT-2's 12.
const SUMMARY_LAYERS: [usize; 2] = [GPT_LAYERS, 12];
/// The shortest timed sample of the paired summary: each side repeats its call until one
/// sample lasts about this long, so a millisecond step is not timed by one clock reading.
const SAMPLE_SECONDS: f64 = 0.05;
/// Shapes of the step / own-msign comparison.
const RATIO_SHAPES: [(usize, usize); 3] = [(384, 384), (768, 768), (768, 3072)];
const PRECISIONS: [(&str, Precision); 2] = [("f32", Precision::F32), ("auto", Precision::Auto)];
const SHAPES: [(usize, usize); 5] = [
    (384, 384),
    (384, 1536),
    (768, 768),
    (768, 2304),
    (768, 3072),
];

/// A GPT-2 (small) block's matrices as `nn.Linear` weights: QKV, attention output, MLP in and
/// out — the "full set of matrices" row of the versus-torch table.
const GPT2_LAYER: [(usize, usize); 4] = [(2304, 768), (768, 768), (3072, 768), (768, 3072)];

fn shapes() -> Vec<(usize, usize)> {
    if std::env::var("KAPPA_BENCH_QUICK").is_ok_and(|v| v == "1") {
        SHAPES[..1].to_vec()
    } else {
        SHAPES.to_vec()
    }
}

fn t32(a: &Array2<f32>) -> Tensor {
    tensor_from_array(a.view(), Kind::Float, Device::Cpu).expect("tensor")
}

/// The five quintic steps' products, bare (wide orientation), as `torch.mm` calls.
fn ns_bare(x: &Tensor) -> Tensor {
    let mut x = x.shallow_clone();
    for _ in 0..5 {
        let gram = x.mm(&x.tr());
        let b = gram.mm(&gram);
        x = b.mm(&x);
    }
    x
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group(GROUP);
    for (m, n) in shapes() {
        let id = shape_id(m, n);
        let w0: Array2<f32> = gaussian(m, n, 1);
        let grad = t32(&gaussian(m, n, 2));
        let wide = if m > n {
            t32(&w0).tr().contiguous()
        } else {
            t32(&w0)
        };
        g.bench_function(BenchmarkId::new("ns5_bare", &id), |b| {
            b.iter(|| black_box(ns_bare(&wide)))
        });
        // kappa's Muon in f32 (the comparison) and with Precision::Auto (bf16 on CPUs
        // with native bf16 products, see `kappa_optim::cpu_has_native_bf16`).
        for (name, precision) in [
            ("muon_step", Precision::F32),
            ("muon_step_auto", Precision::Auto),
        ] {
            let muon = Muon::new(MuonConfig {
                precision,
                ..MuonConfig::keller()
            })
            .expect("muon");
            let mut w = t32(&w0);
            let mut st = MuonState::new();
            g.bench_function(BenchmarkId::new(name, &id), |b| {
                b.iter(|| muon.step(&mut w, &grad, &mut st).expect("step"))
            });
        }
        let pe = Msign::polar_express();
        g.bench_function(BenchmarkId::new("msign_pe10", &id), |b| {
            b.iter(|| msign(&grad, pe, Precision::Auto).expect("msign"))
        });
        // tch's AdamW on a var-store parameter with a fixed gradient.
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let p = vs.root().var_copy("w", &t32(&w0));
        let mut opt = tch::nn::AdamW::default().build(&vs, 1e-3).expect("adamw");
        (&p * &grad).sum(Kind::Float).backward();
        g.bench_function(BenchmarkId::new("adamw_step", &id), |b| {
            b.iter(|| opt.step())
        });
        // kappa-optim's AdamW (the fused kernel) on the same shape and gradient.
        let adamw = AdamW::new(AdamWConfig::torch()).expect("adamw");
        let (params, grads) = ([t32(&w0)], [grad.shallow_clone()]);
        let mut states = [AdamWState::new()];
        g.bench_function(BenchmarkId::new("kappa_adamw", &id), |b| {
            b.iter(|| {
                adamw
                    .step_tensors(&params, &grads, &mut states, 1e-3, AdamWKernel::default())
                    .expect("adamw step")
            })
        });
    }
    g.finish();
}

/// The hidden matrices of one layer of a GPT `d` wide: QKV, out, fc, proj.
fn gpt_shapes(d: usize) -> [(usize, usize); 4] {
    [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)]
}

/// A small GPT's matrices by shape: (parameters, gradients) per shape, `layers` each.
fn gpt_matrices(d: usize, layers: usize) -> Vec<(Vec<Tensor>, Vec<Tensor>)> {
    let mut seed = 100;
    gpt_shapes(d)
        .iter()
        .map(|&(m, n)| {
            let mut one = || {
                seed += 1;
                t32(&gaussian(m, n, seed))
            };
            let ws: Vec<Tensor> = (0..layers).map(|_| one()).collect();
            let gs: Vec<Tensor> = (0..layers).map(|_| one()).collect();
            (ws, gs)
        })
        .collect()
}

/// A new (empty) Muon state for every matrix of `mats` ([`gpt_matrices`]'s layout).
fn fresh_states(mats: &[(Vec<Tensor>, Vec<Tensor>)]) -> Vec<Vec<MuonState<Tensor>>> {
    mats.iter()
        .map(|(ws, _)| ws.iter().map(|_| MuonState::new()).collect())
        .collect()
}

fn keller(precision: Precision) -> Muon {
    Muon::new(MuonConfig {
        precision,
        ..MuonConfig::keller()
    })
    .expect("muon")
}

/// One Muon step over a `d`-wide GPT's 16 matrices: one call per matrix, and one batched call
/// per shape.
fn bench_gpt_matrices(
    g: &mut criterion::BenchmarkGroup<criterion::measurement::WallTime>,
    muon: &Muon,
    d: usize,
    pname: &str,
) {
    let id = format!("{d}_{pname}");
    let mut mats = gpt_matrices(d, GPT_LAYERS);
    let mut states = fresh_states(&mats);
    g.bench_function(BenchmarkId::new("gpt_per_matrix", &id), |b| {
        b.iter(|| {
            for ((ws, gs), st) in mats.iter_mut().zip(&mut states) {
                for ((w, gr), s) in ws.iter_mut().zip(gs.iter()).zip(st.iter_mut()) {
                    muon.step(w, gr, s).expect("step");
                }
            }
        })
    });
    g.bench_function(BenchmarkId::new("gpt_batched", &id), |b| {
        b.iter(|| {
            for ((ws, gs), st) in mats.iter_mut().zip(&mut states) {
                muon.step_batch(ws, gs, st).expect("step_batch");
            }
        })
    });
}

fn bench_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group(BATCH_GROUP);
    for (pname, precision) in PRECISIONS {
        let muon = keller(precision);
        for d in GPT_WIDTHS {
            bench_gpt_matrices(&mut g, &muon, d, pname);
        }
        for (m, n) in RATIO_SHAPES {
            let id = format!("{}_{pname}", shape_id(m, n));
            let mut w = t32(&gaussian(m, n, 1));
            let grad = t32(&gaussian(m, n, 2));
            let mut st = MuonState::new();
            g.bench_function(BenchmarkId::new("step", &id), |b| {
                b.iter(|| muon.step(&mut w, &grad, &mut st).expect("step"))
            });
            g.bench_function(BenchmarkId::new("own_msign", &id), |b| {
                b.iter(|| black_box(muon.direction(&grad).expect("msign")))
            });
        }
    }
    g.finish();
}

/// Pairs per row of the paired summary: `KAPPA_BENCH_PAIRS` (default 11, at least 3).
fn summary_pairs() -> usize {
    std::env::var("KAPPA_BENCH_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(11usize)
        .max(3)
}

/// `a` and `b` alternated in `pairs` pairs ([`alternate_settled`], settled when libtorch runs
/// more than one thread), each sample the mean of as many calls as fill [`SAMPLE_SECONDS`]
/// (counted once per side from a warm call): the per-pair ratio a/b and each side's seconds.
fn paired_per_call(
    a: &mut dyn FnMut(),
    b: &mut dyn FnMut(),
    pairs: usize,
) -> (Spread, Spread, Spread) {
    let settle = (tch::get_num_threads() > 1).then_some(Duration::from_millis(200));
    let [r, ta, tb] = kappa_benches::paired::per_call(a, b, 1, pairs, settle, SAMPLE_SECONDS);
    (r, ta, tb)
}

/// One row of the batched comparison: a `layers`-deep, `d`-wide GPT's matrices stepped one call
/// per matrix (A) and one batched call per shape (B); the ratio is A/B (the speed-up).
fn batched_row(muon: &Muon, d: usize, layers: usize, pairs: usize) -> (Spread, Spread, Spread) {
    let (mut mats, mut mats_b) = (gpt_matrices(d, layers), gpt_matrices(d, layers));
    let (mut states, mut batched) = (fresh_states(&mats), fresh_states(&mats_b));
    let mut per_matrix = || {
        for ((ws, gs), st) in mats.iter_mut().zip(&mut states) {
            for ((w, gr), s) in ws.iter_mut().zip(gs.iter()).zip(st.iter_mut()) {
                muon.step(w, gr, s).expect("step");
            }
        }
    };
    let mut one_batch = || {
        for ((ws, gs), st) in mats_b.iter_mut().zip(&mut batched) {
            muon.step_batch(ws, gs, st).expect("step_batch");
        }
    };
    paired_per_call(&mut per_matrix, &mut one_batch, pairs)
}

/// Group `optim_batch`'s ratios, measured again in alternating pairs (criterion times each side
/// alone, one after the other, which a drifting machine turns into ratio noise): the speed-up of
/// batching a small GPT's matrices, and a Muon step over its own msign.
fn print_batch_summary() {
    let pairs = summary_pairs();
    println!(
        "\nMuon batched over a small GPT's matrices, and step / own msign, {} thread(s), {} — \
         alternated in one run, {pairs} pairs per row; ms are medians, ratios the median \
         per-pair ratio [min–max]:",
        tch::get_num_threads(),
        cpu_model()
    );
    for (pname, precision) in PRECISIONS {
        let muon = keller(precision);
        for layers in SUMMARY_LAYERS {
            for d in GPT_WIDTHS {
                let (speedup, per, bat) = batched_row(&muon, d, layers, pairs);
                println!(
                    "{pname:<5} GPT {layers:>2} × {d:<4} ({:>2} matrices): per matrix {:>8.3} ms, \
                     batched {:>8.3} ms, speed-up {speedup} (goal ≥ 3)",
                    4 * layers,
                    per.median * 1e3,
                    bat.median * 1e3,
                );
            }
        }
        for (m, n) in RATIO_SHAPES {
            let mut w = t32(&gaussian(m, n, 1));
            let grad = t32(&gaussian(m, n, 2));
            let mut st = MuonState::new();
            let mut step = || {
                let _ = black_box(muon.step(&mut w, &grad, &mut st).expect("step"));
            };
            let mut own = || {
                let _ = black_box(muon.direction(&grad).expect("msign"));
            };
            let (r, s, o) = paired_per_call(&mut step, &mut own, pairs);
            println!(
                "{pname:<5} {:<10} step {:>8.3} ms, own msign {:>8.3} ms, step/msign {r} (goal ≤ 1.1)",
                shape_id(m, n),
                s.median * 1e3,
                o.median * 1e3,
            );
        }
    }
    print_syrk_rows(pairs);
    print_row_block_rows(pairs);
}

/// The wide shapes of [`print_row_block_rows`] (r ≥ 768 rows, s ≥ 2r columns).
const ROW_BLOCK_SHAPES: [(usize, usize); 3] = [(768, 2304), (768, 3072), (1024, 4096)];

/// A wide CPU bf16 tensor's Gram matrix as `Matrix::gram` computes it (row blocks, mirrored:
/// `kappa_linalg::syrk`) against libtorch's general product X·Xᵀ, alternated in pairs, where the
/// CPU multiplies bf16 natively.
fn print_row_block_rows(pairs: usize) {
    if !kappa_optim::cpu_has_native_bf16() {
        return println!("(bf16 Gram rows skipped: this CPU has no native bf16 products)");
    }
    for (m, n) in ROW_BLOCK_SHAPES {
        let x = t32(&gaussian(m, n, 3)).to_kind(tch::Kind::BFloat16);
        let mut blocks = || {
            let _ = black_box(Matrix::gram(&x).expect("gram"));
        };
        let mut general = || {
            let _ = black_box(x.matmul(&x.tr()));
        };
        let (r, a, b) = paired_per_call(&mut blocks, &mut general, pairs);
        println!(
            "bf16  {:<10} Gram by row blocks {:>8.3} ms, libtorch's X·Xᵀ {:>8.3} ms, ratio {r}",
            shape_id(m, n),
            a.median * 1e3,
            b.median * 1e3,
        );
    }
}

/// kappa's f32 Muon step with libtorch's MKL `syrk` for the Gram products against the same step
/// without it (`kappa_linalg::mkl::use_libtorch_syrk`: the general product at more than one
/// thread, OpenBLAS's `syrk` at one), alternated in pairs: what the symmetric products give here.
fn print_syrk_rows(pairs: usize) {
    #[cfg(target_os = "linux")]
    {
        use kappa_linalg::mkl::{libtorch_syrk_found, use_libtorch_syrk};
        if !libtorch_syrk_found() {
            return println!("(libtorch has no MKL syrk in this process)");
        }
        let muon = keller(Precision::F32);
        for (m, n) in shapes() {
            let grad = t32(&gaussian(m, n, 2));
            let (mut w_on, mut w_off) = (t32(&gaussian(m, n, 1)), t32(&gaussian(m, n, 1)));
            let (mut st_on, mut st_off) = (MuonState::new(), MuonState::new());
            let mut with = || {
                use_libtorch_syrk(true);
                let _ = black_box(muon.step(&mut w_on, &grad, &mut st_on).expect("step"));
            };
            let mut without = || {
                use_libtorch_syrk(false);
                let _ = black_box(muon.step(&mut w_off, &grad, &mut st_off).expect("step"));
            };
            let (r, a, b) = paired_per_call(&mut with, &mut without, pairs);
            println!(
                "f32   {:<10} step with libtorch's syrk {:>8.3} ms, without {:>8.3} ms, ratio {r}",
                shape_id(m, n),
                a.median * 1e3,
                b.median * 1e3,
            );
        }
        use_libtorch_syrk(true);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = pairs;
}

/// Median seconds of `reps` calls after one warm-up.
fn time_by_hand(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

struct ManifoldTimes {
    stiefel: f64,
    dgram: f64,
    /// DGram with `DualAscent::preconditioned_feasible()` (paper settings otherwise).
    dgram_pre: f64,
    /// The paper's DGram retraction alone (one SVD).
    dgram_retraction: f64,
    stiefel_calls: usize,
    dgram_calls: usize,
}

fn manifold_step_time(m: usize, n: usize, reps: usize, cfg: ManifoldMuonConfig) -> (f64, usize) {
    let grad = t32(&gaussian(m, n, 2)) * 0.01;
    let mut cfg = cfg;
    cfg.dual.on_divergence = kappa_optim::OnDivergence::Apply;
    let opt = ManifoldMuon::new(cfg).expect("manifold");
    let mut w = t32(&gaussian(m, n, 1)) * 0.02;
    opt.retract_onto(&mut w).expect("retract");
    let mut st = ManifoldState::new();
    let mut calls = 0;
    let t = time_by_hand(reps, || {
        calls = opt
            .step(&mut w, &grad, &mut st)
            .expect("step")
            .dual
            .msign_calls;
    });
    (t, calls)
}

fn manifold_times(m: usize, n: usize, reps: usize) -> ManifoldTimes {
    let (stiefel, stiefel_calls) =
        manifold_step_time(m, n, reps, ManifoldMuonConfig::paper(Manifold::Stiefel));
    let (dgram, dgram_calls) =
        manifold_step_time(m, n, reps, ManifoldMuonConfig::paper(Manifold::dgram()));
    let (dgram_pre, _) = manifold_step_time(
        m,
        n,
        reps,
        ManifoldMuonConfig {
            dual: kappa_optim::DualAscent::preconditioned_feasible(),
            ..ManifoldMuonConfig::paper(Manifold::dgram())
        },
    );
    let opt = ManifoldMuon::new(ManifoldMuonConfig::paper(Manifold::dgram())).expect("manifold");
    let w = t32(&gaussian(m, n, 1));
    let dgram_retraction = time_by_hand(reps, || {
        let mut x = w.copy();
        opt.retract_onto(&mut x).expect("retract");
    });
    ManifoldTimes {
        stiefel,
        dgram,
        dgram_pre,
        dgram_retraction,
        stiefel_calls,
        dgram_calls,
    }
}

/// kappa Muon's update band over `shapes` (σ of msign(U) for the first step from zero momentum,
/// the extremes over the matrices) with `cell`'s orthogonalizer and precision.
fn kappa_band(shapes: &[(usize, usize)], cell: &Cell) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for &(m, n) in shapes {
        let g = t32(&gaussian(m, n, 2));
        let o = msign(&g, cell.msign_for((m, n)), cell.precision).expect("msign");
        let s = o.to_kind(Kind::Double).singular_values().expect("svd");
        (lo, hi) = (lo.min(s[s.len() - 1]), hi.max(s[0]));
    }
    (lo, hi)
}

/// kappa's Muon step against `torch.optim.Muon`'s on a set of matrices (one shape, or a GPT
/// layer's) in one precision: single steps (of every matrix) alternated pair by pair (kappa
/// first in even pairs), each side timed in its own process.
struct VersusTorch {
    kappa: Spread,
    torch: Spread,
    /// kappa / torch, pair by pair.
    ratio: Spread,
    kappa_band: (f64, f64),
    torch_band: (f64, f64),
}

/// One row kind of the table: kappa's Muon (Keller's settings) with `msign` in `precision`,
/// against `torch.optim.Muon` in `torch` ("f32": its quintic run in f32; "bf16": as shipped).
struct Cell {
    label: &'static str,
    torch: &'static str,
    precision: Precision,
    msign: Msign,
}

impl Cell {
    /// The cell's orthogonalizer for one m×n matrix: a Gram form where it pays (s ≥ 2r),
    /// else the same schedule run plainly.
    fn msign_for(&self, shape: (usize, usize)) -> Msign {
        match self.msign {
            Msign::GramAol { steps, lower, .. } if !gram_pays(shape) => Msign::Aol { steps, lower },
            Msign::GramPolarExpress { steps, .. } if !gram_pays(shape) => {
                Msign::PolarExpress { steps }
            }
            other => other,
        }
    }
}

/// The Gram forms pay only on shapes at least twice as long as wide.
fn gram_pays((m, n): (usize, usize)) -> bool {
    m.max(n) >= 2 * m.min(n)
}

const F32: Cell = Cell {
    label: "f32",
    torch: "f32",
    precision: Precision::F32,
    msign: Msign::MuonQuintic,
};
const BF16: Cell = Cell {
    label: "bf16",
    torch: "bf16",
    precision: Precision::Bf16,
    msign: Msign::MuonQuintic,
};
/// Polar Express ×5 as Gram Newton–Schulz in bf16 (a narrower σ band than the quintic's at the
/// same step count, fewer flops where s ≥ 2r): the same precision as the shipped torch step.
const BF16_GRAM: Cell = Cell {
    label: "bf16 gram",
    torch: "bf16",
    precision: Precision::Bf16,
    msign: Msign::GramPolarExpress {
        steps: 5,
        restart: kappa_linalg::GRAM_NS_RESTART,
    },
};

/// Turbo-Muon in bf16: AOL rescaling, then 4 steps (one fewer than the quintic, the first Gram
/// product reused). It computes msign(X·D), not msign(X): the σ band column shows what it buys.
const BF16_AOL: Cell = Cell {
    label: "bf16 aol",
    torch: "bf16",
    precision: Precision::Bf16,
    msign: Msign::aol(),
};

/// Turbo-Muon as Gram Newton–Schulz in bf16 (period 2): AOL's Gram matrix starts the first
/// block; 8r²s + 20r³ flops against the quintic's 20r²s + 10r³.
const BF16_AOL_GRAM: Cell = Cell {
    label: "bf16 aol gram",
    torch: "bf16",
    precision: Precision::Bf16,
    msign: Msign::gram_aol(),
};

/// AOL with kappa's short schedule in bf16: 3 Polar Express steps designed for σ(X·D) ∈
/// [0.03, 1] (three fifths of the quintic's products, a higher descent quality than it on every
/// input kappa-linalg measures).
const BF16_AOL_SHORT: Cell = Cell {
    label: "bf16 aol3",
    torch: "bf16",
    precision: Precision::Bf16,
    msign: Msign::aol_three_steps(),
};

/// The short schedule as Gram Newton–Schulz in bf16 (period 2): 8r²s + 12r³ flops.
const BF16_AOL_SHORT_GRAM: Cell = Cell {
    label: "bf16 aol3 gram",
    torch: "bf16",
    precision: Precision::Bf16,
    msign: Msign::gram_aol_three_steps(),
};

/// Pairs per cell: `KAPPA_BENCH_VERSUS_PAIRS` (default 15), fewer when a cell passes 30 s (at
/// least 3).
fn versus_torch(
    torch: &mut Peer,
    shapes: &[(usize, usize)],
    cell: &Cell,
) -> Result<VersusTorch, String> {
    let ids: Vec<String> = shapes.iter().map(|&(m, n)| shape_id(m, n)).collect();
    let band = torch.ask_numbers(&format!("setup {} {}", ids.join(","), cell.torch))?;
    let &[lo, hi] = band.as_slice() else {
        return Err(format!("unexpected band {band:?}"));
    };
    let mut matrices = Vec::new();
    for &(m, n) in shapes {
        let muon = Muon::new(MuonConfig {
            precision: cell.precision,
            msign: cell.msign_for((m, n)),
            ..MuonConfig::keller()
        })
        .map_err(|e| e.to_string())?;
        let (w, grad) = (t32(&gaussian(m, n, 1)), t32(&gaussian(m, n, 2)));
        matrices.push((muon, w, grad, MuonState::new()));
    }
    let mut kappa_step = || {
        seconds(&mut || {
            for (muon, w, grad, st) in matrices.iter_mut() {
                muon.step(w, grad, st).expect("step");
            }
        })
    };
    let torch_step = |torch: &mut Peer| -> Result<f64, String> {
        let reply = torch.ask_numbers("step")?;
        reply
            .first()
            .copied()
            .ok_or_else(|| "an empty reply".to_string())
    };
    for _ in 0..2 {
        kappa_step();
        torch_step(torch)?;
    }
    // With more than one thread, the process that just stepped keeps its OpenMP workers spinning
    // for a while and takes cores from the other: before each timed step a pause lets them go to
    // sleep, then one untimed step wakes this side's own workers (as
    // `paired::alternate_settled` does), the same for both sides.
    let settle = tch::get_num_threads() > 1;
    let pause = || std::thread::sleep(Duration::from_millis(200));
    let mut kappa_timed = || {
        if settle {
            pause();
            kappa_step();
        }
        kappa_step()
    };
    let torch_timed = |torch: &mut Peer| -> Result<f64, String> {
        if settle {
            pause();
            torch_step(torch)?;
        }
        torch_step(torch)
    };
    let pairs = std::env::var("KAPPA_BENCH_VERSUS_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15usize);
    let (mut tk, mut tt) = (Vec::new(), Vec::new());
    let start = Instant::now();
    for i in 0..pairs.max(3) {
        if i >= 3 && start.elapsed() > Duration::from_secs(30) {
            break;
        }
        if i % 2 == 0 {
            tk.push(kappa_timed());
            tt.push(torch_timed(torch)?);
        } else {
            tt.push(torch_timed(torch)?);
            tk.push(kappa_timed());
        }
    }
    Ok(VersusTorch {
        ratio: Spread::of(ratios(&tk, &tt)),
        kappa: Spread::of(tk),
        torch: Spread::of(tt),
        kappa_band: kappa_band(shapes, cell),
        torch_band: (lo, hi),
    })
}

/// The side-by-side table: kappa's Muon against `torch.optim.Muon` in f32 and bf16 at `shapes`.
fn print_versus_torch(threads: usize, shapes: &[(usize, usize)]) {
    let native = kappa_optim::cpu_has_native_bf16();
    println!(
        "\nkappa's Muon step against torch.optim.Muon, {threads} thread(s), {} — single steps \
         alternated in one run; ms are medians, kappa/torch the median per-pair ratio \
         [min–max]. Goal ≤ 0.8 in f32, and in bf16 where the CPU has native bf16 ({native} here).",
        cpu_model()
    );
    let started = Peer::start({
        let mut cmd = reference_command("muon_torch.py", threads);
        cmd.arg(threads.to_string());
        cmd
    });
    let mut torch = match started {
        Ok((peer, ready)) if ready == "ready" => peer,
        Ok((_, other)) => return println!("torch reference: expected `ready`, got {other:?}"),
        Err(e) => return println!("torch reference not run: {e}"),
    };
    println!(
        "{:<11} {:<14} {:>9} {:>9} {:>24} {:>13} {:>13}",
        "shape", "prec", "kappa ms", "torch ms", "kappa/torch", "σ band kappa", "σ band torch"
    );
    let cells: &[Cell] = if native {
        &[
            F32,
            BF16,
            BF16_AOL,
            BF16_GRAM,
            BF16_AOL_GRAM,
            BF16_AOL_SHORT,
            BF16_AOL_SHORT_GRAM,
        ]
    } else {
        // Emulated bf16 products run 20–40× slower than f32 (measured on an AMD EPYC without
        // bf16 units: 571 vs 31 ms per 384² step) on both sides; kappa's Auto picks f32 there.
        println!("(bf16 rows skipped: this CPU has no native bf16 products)");
        &[F32]
    };
    let mut record = versus_record();
    for (id, group) in versus_rows(shapes) {
        // A Gram row on one shape where it does not pay would only repeat its plain row.
        let repeats = |c: &&Cell| group.len() == 1 && c.msign_for(group[0]) != c.msign;
        for cell in cells.iter().filter(|c| !repeats(c) && chosen(c)) {
            match versus_torch(&mut torch, &group, cell) {
                Ok(v) => {
                    println!(
                        "{id:<11} {:<14} {:>9.2} {:>9.2} {:>24} {:>6.3}-{:.3} {:>6.3}-{:.3}",
                        cell.label,
                        v.kappa.median * 1e3,
                        v.torch.median * 1e3,
                        v.ratio.to_string(),
                        v.kappa_band.0,
                        v.kappa_band.1,
                        v.torch_band.0,
                        v.torch_band.1,
                    );
                    record
                        .rows
                        .push(versus_record_row(&id, &group, cell, threads, &v));
                }
                Err(e) => println!("{id:<11} {:<14} not run: {e}", cell.label),
            }
        }
    }
    record.write();
}

/// The versus-torch table's record (`kappa_benches::record`), rows still to come.
fn versus_record() -> record::Paired {
    record::Paired {
        bench: "optim",
        name: "muon_vs_torch",
        title: "Muon step against torch.optim.Muon".into(),
        what: "kappa-optim's Muon step (Keller's settings; f32, and in bf16 every orthogonalizer) \
               against `torch.optim.Muon`'s in a child process, single steps alternated; \
               `gpt2-layer` steps a GPT-2 block's four matrices."
            .into(),
        peer: "torch.optim.Muon".into(),
        spread: "min–max over pairs",
        model: "the quintic's five Newton–Schulz steps per m×n matrix, 5·(4r²s + 2r³) flops \
                (r = min(m, n), s = max(m, n)), whichever orthogonalizer the row runs: the work \
                the step stands for, so that rows compare on one scale"
            .into(),
        rows: Vec::new(),
    }
}

/// One row of the versus-torch record.
fn versus_record_row(
    id: &str,
    group: &[(usize, usize)],
    cell: &Cell,
    threads: usize,
    v: &VersusTorch,
) -> record::Row {
    let flops: f64 = group.iter().map(|&(m, n)| 5.0 * ns_step_flops(m, n)).sum();
    let bound = match cell.precision {
        Precision::F32 => record::Bound::GemmF32,
        _ => record::Bound::GemmBf16,
    };
    record::Row {
        parameter: id.to_string(),
        variant: cell.label.to_string(),
        threads,
        kappa_s: Some(v.kappa.median),
        peer_s: Some(v.torch.median),
        ratio: record::Ratio::of(v.ratio),
        work: Some(record::Work {
            bound,
            amount: flops,
        }),
    }
}

/// Whether the run asked for this cell: `KAPPA_BENCH_VERSUS_CELLS`, a comma-separated list of
/// row labels (`f32`, `bf16 aol3 gram`, ...), keeps only those; unset, every cell runs.
fn chosen(cell: &Cell) -> bool {
    std::env::var("KAPPA_BENCH_VERSUS_CELLS")
        .map_or(true, |list| list.split(',').any(|l| l.trim() == cell.label))
}

/// The table's rows: each shape alone (Gram rows only where they pay), then, unless the run is
/// a quick one, a GPT-2 layer's four matrices in one optimizer (Gram rows run their plain form
/// on the square one).
fn versus_rows(shapes: &[(usize, usize)]) -> Vec<(String, Vec<(usize, usize)>)> {
    let mut rows: Vec<_> = shapes
        .iter()
        .map(|&s| (shape_id(s.0, s.1), vec![s]))
        .collect();
    if !std::env::var("KAPPA_BENCH_QUICK").is_ok_and(|v| v == "1") {
        rows.push(("gpt2-layer".to_string(), GPT2_LAYER.to_vec()));
    }
    rows
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b?)
}

fn main() {
    let threads = configure_threads();
    if std::env::var("KAPPA_BENCH_VERSUS_ONLY").is_ok_and(|v| v == "1") {
        return print_versus_torch(threads, &shapes());
    }
    if std::env::var("KAPPA_BENCH_BATCH_ONLY").is_ok_and(|v| v == "1") {
        return print_batch_summary();
    }
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    bench(&mut c);
    bench_batch(&mut c);
    c.final_summary();
    print_batch_summary();
    let reps = std::env::var("KAPPA_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3usize)
        .max(1);
    let shapes = shapes();
    let auto = Tensor::zeros([1, 1], (Kind::Float, Device::Cpu))
        .working_name(Precision::Auto)
        .unwrap_or("?");
    println!(
        "\nkappa-optim on CPU, {threads} thread(s) (medians; manifold steps: median of {reps}); \
         Precision::Auto resolves to {auto} here (native bf16 products: {})",
        kappa_optim::cpu_has_native_bf16()
    );
    println!(
        "{:<10} {:>9} {:>9} {:>7} {:>9} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "shape",
        "muon ms",
        "ns5 ms",
        "m/ns5",
        "adamw ms",
        "stiefel ms",
        "dgram ms",
        "st/adamw",
        "dg/adamw",
        "msign ms",
        "dual/msg",
        "Auto ms",
    );
    for &(m, n) in &shapes {
        let id = shape_id(m, n);
        let get = |f: &str| median_seconds(GROUP, f, &id);
        let (muon, ns, adamw, ms) = (
            get("muon_step"),
            get("ns5_bare"),
            get("adamw_step"),
            get("msign_pe10"),
        );
        let mt = manifold_times(m, n, reps);
        let muon_auto = get("muon_step_auto");
        println!(
            "{:<10} {:>9} {:>9} {:>7} {:>9} {:>10.1} {:>10.1} {:>8.0} {:>8.0} {:>9} {:>9} {:>9}",
            id,
            fmt_ms(muon),
            fmt_ms(ns),
            fmt_ratio(ratio(muon, ns)),
            fmt_ms(adamw),
            mt.stiefel * 1e3,
            mt.dgram * 1e3,
            ratio(Some(mt.stiefel), adamw).unwrap_or(f64::NAN),
            ratio(Some(mt.dgram), adamw).unwrap_or(f64::NAN),
            fmt_ms(ms),
            fmt_ratio(ratio(Some(mt.stiefel), ms)),
            fmt_ms(muon_auto),
        );
        println!(
            "{:<10} DGram: step / msign {} ({} ascent msigns + 1 diagnostic + retraction of {} msign = 1 SVD); \
             preconditioned-feasible step {:.1} ms = {} msign; Stiefel ascent msigns {}",
            id,
            fmt_ratio(ratio(Some(mt.dgram), ms)),
            mt.dgram_calls,
            fmt_ratio(ratio(Some(mt.dgram_retraction), ms)),
            mt.dgram_pre * 1e3,
            fmt_ratio(ratio(Some(mt.dgram_pre), ms)),
            mt.stiefel_calls,
        );
    }
    println!(
        "m/ns5: Muon step / its 5 bare quintic steps (goal ≤ 1.1). st/adamw, dg/adamw: manifold step / \
         tch AdamW step. dual/msg: Stiefel step / one Polar Express msign (K = 20 → ≈ 20–22 expected \
         with the retraction and the ‖G‖_* diagnostic). Auto: kappa's Muon step with \
         Precision::Auto ({auto} here)."
    );
    print_versus_torch(threads, &shapes);
}
