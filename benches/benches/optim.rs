//! Benchmarks of kappa-optim on the tch backend (f32, CPU; Muon also with `Precision::Auto`,
//! bf16 on CPUs with native bf16 products): one Muon step against its bare
//! Newton–Schulz matmuls, one Stiefel and one DGram manifold-Muon step (paper preset, K = 20)
//! against one AdamW step (tch's), the dual-ascent cost in msign units, and kappa's Muon against
//! `torch.optim.Muon` (run as a subprocess, `benches/reference/muon_torch.py`) at the same shapes
//! and thread count.
//!
//! Group `optim_batch`: (a) Muon's step over all hidden matrices of a small GPT (4 layers ×
//! 256 wide: QKV 768×256, out 256×256, fc 1024×256, proj 256×1024, 16 matrices), one batched
//! call per shape (`Muon::step_batch`) against one `Muon::step` per matrix; (b) at 384², 768²
//! and 768×3072 the Muon step (Keller's config) beside its own bare msign (the same quintic, the
//! same precision), in f32 and Auto, printed as a ratio (goal ≤ 1.1).
//!
//! Run: `KAPPA_BENCH_THREADS=1 cargo bench -p kappa-benches --bench optim` (and again with 2).
//! `KAPPA_BENCH_QUICK=1` keeps only 384×384 (a smoke run). The manifold steps take seconds at the
//! larger shapes (20 Polar Express msigns of 10 steps each), so they are timed by hand (one warm-up,
//! then the median of `KAPPA_BENCH_REPS` runs, default 3) instead of through criterion.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{black_box, BenchmarkId, Criterion};
use kappa_benches::{
    configure_threads, fmt_ms, fmt_ratio, gaussian, median_seconds, shape_id, NOT_RUN,
};
use kappa_linalg::tch_backend::tensor_from_array;
use kappa_linalg::Matrix;
use kappa_optim::{
    msign, Manifold, ManifoldMuon, ManifoldMuonConfig, ManifoldState, Msign, Muon, MuonConfig,
    MuonState, Precision, WorkingPrecision,
};
use ndarray::Array2;
use tch::nn::OptimizerConfig;
use tch::{Device, Kind, Tensor};

const GROUP: &str = "optim_f32";
const BATCH_GROUP: &str = "optim_batch";
/// The hidden matrices of one layer of the small GPT (4 layers × 256 wide).
const GPT_SHAPES: [(usize, usize); 4] = [(768, 256), (256, 256), (1024, 256), (256, 1024)];
const GPT_LAYERS: usize = 4;
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
    }
    g.finish();
}

/// The small GPT's matrices by shape: (parameters, gradients) per shape, `GPT_LAYERS` each.
fn gpt_matrices() -> Vec<(Vec<Tensor>, Vec<Tensor>)> {
    let mut seed = 100;
    GPT_SHAPES
        .iter()
        .map(|&(m, n)| {
            let mut one = || {
                seed += 1;
                t32(&gaussian(m, n, seed))
            };
            let ws: Vec<Tensor> = (0..GPT_LAYERS).map(|_| one()).collect();
            let gs: Vec<Tensor> = (0..GPT_LAYERS).map(|_| one()).collect();
            (ws, gs)
        })
        .collect()
}

fn keller(precision: Precision) -> Muon {
    Muon::new(MuonConfig {
        precision,
        ..MuonConfig::keller()
    })
    .expect("muon")
}

fn bench_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group(BATCH_GROUP);
    for (pname, precision) in PRECISIONS {
        let muon = keller(precision);
        let mut mats = gpt_matrices();
        let mut states: Vec<Vec<MuonState<Tensor>>> = mats
            .iter()
            .map(|(ws, _)| ws.iter().map(|_| MuonState::new()).collect())
            .collect();
        g.bench_function(BenchmarkId::new("gpt_per_matrix", pname), |b| {
            b.iter(|| {
                for ((ws, gs), st) in mats.iter_mut().zip(&mut states) {
                    for ((w, gr), s) in ws.iter_mut().zip(gs.iter()).zip(st.iter_mut()) {
                        muon.step(w, gr, s).expect("step");
                    }
                }
            })
        });
        g.bench_function(BenchmarkId::new("gpt_batched", pname), |b| {
            b.iter(|| {
                for ((ws, gs), st) in mats.iter_mut().zip(&mut states) {
                    muon.step_batch(ws, gs, st).expect("step_batch");
                }
            })
        });
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

/// Prints group `optim_batch`'s ratios (after criterion has run it).
fn print_batch_summary() {
    println!("\nMuon batched over a 4-layer × 256 GPT's 16 matrices, and step / own msign:");
    for (pname, _) in PRECISIONS {
        let per = median_seconds(BATCH_GROUP, "gpt_per_matrix", pname);
        let bat = median_seconds(BATCH_GROUP, "gpt_batched", pname);
        println!(
            "{pname:<5} GPT: per matrix {} ms, batched {} ms, speed-up {} (goal ≥ 3)",
            fmt_ms(per),
            fmt_ms(bat),
            fmt_ratio(ratio(per, bat))
        );
        for (m, n) in RATIO_SHAPES {
            let id = format!("{}_{pname}", shape_id(m, n));
            let step = median_seconds(BATCH_GROUP, "step", &id);
            let own = median_seconds(BATCH_GROUP, "own_msign", &id);
            println!(
                "{pname:<5} {:<10} step {} ms, own msign {} ms, step/msign {} (goal ≤ 1.1)",
                shape_id(m, n),
                fmt_ms(step),
                fmt_ms(own),
                fmt_ratio(ratio(step, own))
            );
        }
    }
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

/// kappa Muon's update band at this shape (σ of msign(U) for the first step from zero momentum)
/// in `precision`.
fn kappa_band(m: usize, n: usize, precision: Precision) -> (f64, f64) {
    let g = t32(&gaussian(m, n, 2));
    let o = msign(&g, Msign::MuonQuintic, precision).expect("msign");
    let s = o.to_kind(Kind::Double).singular_values().expect("svd");
    (s[s.len() - 1], s[0])
}

fn torch_reference(threads: usize, shapes: &[(usize, usize)]) -> Option<serde_json::Value> {
    let root = kappa_testkit::crate_dir();
    let python = std::env::var_os("KAPPA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("../.venv/bin/python"));
    let out = Command::new(python)
        .arg(root.join("reference/muon_torch.py"))
        .arg(threads.to_string())
        .args(shapes.iter().map(|&(m, n)| shape_id(m, n)))
        .env("OMP_NUM_THREADS", threads.to_string())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "torch reference failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last()?).ok()
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b?)
}

fn main() {
    let threads = configure_threads();
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
    let torch = torch_reference(threads, &shapes);
    let auto = Tensor::zeros([1, 1], (Kind::Float, Device::Cpu))
        .working_name(Precision::Auto)
        .unwrap_or("?");
    println!(
        "\nkappa-optim on CPU, {threads} thread(s) (medians; manifold steps: median of {reps}); \
         Precision::Auto resolves to {auto} here (native bf16 products: {})",
        kappa_optim::cpu_has_native_bf16()
    );
    println!(
        "{:<10} {:>9} {:>9} {:>7} {:>9} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>8} {:>17} {:>17}",
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
        "torch ms",
        "torch/kappa",
        "σ band kappa|torch"
    );
    for (m, n) in shapes {
        let id = shape_id(m, n);
        let get = |f: &str| median_seconds(GROUP, f, &id);
        let (muon, ns, adamw, ms) = (
            get("muon_step"),
            get("ns5_bare"),
            get("adamw_step"),
            get("msign_pe10"),
        );
        let mt = manifold_times(m, n, reps);
        let (klo, khi) = kappa_band(m, n, Precision::F32);
        let (alo, ahi) = kappa_band(m, n, Precision::Auto);
        let muon_auto = get("muon_step_auto");
        let tr = torch.as_ref().map(|t| &t[&id]);
        let tsec = tr.and_then(|t| t["seconds"].as_f64());
        let tband = tr.map_or(NOT_RUN.into(), |t| {
            format!(
                "{:.3}-{:.3}",
                t["sigma_min"].as_f64().unwrap_or(f64::NAN),
                t["sigma_max"].as_f64().unwrap_or(f64::NAN)
            )
        });
        println!(
            "{:<10} {:>9} {:>9} {:>7} {:>9} {:>10.1} {:>10.1} {:>8.0} {:>8.0} {:>9} {:>9} {:>8} {:>17} {:>8.3}-{:.3}|{}",
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
            fmt_ms(tsec),
            fmt_ratio(ratio(tsec, muon)),
            klo,
            khi,
            tband,
        );
        println!(
            "{:<10} Auto ({auto}): muon {} ms, torch/kappa-auto {}, σ band {alo:.3}-{ahi:.3}",
            id,
            fmt_ms(muon_auto),
            fmt_ratio(ratio(tsec, muon_auto)),
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
         with the retraction and the ‖G‖_* diagnostic). torch/kappa: torch.optim.Muon step (bf16) / \
         kappa Muon step (f32), goal ≥ 10; the Auto line repeats it with kappa's per-device precision."
    );
}
