//! Criterion benchmarks of kappa-linalg: Newton–Schulz against plain sgemm, SVD and κ against
//! torch.linalg (through tch), and the iterative κ estimate against the full-SVD κ.
//!
//! Run: `KAPPA_BENCH_THREADS=1 cargo bench -p kappa-benches --bench linalg` (and again with 2).
//! After the criterion output a summary table prints the ratios directly.

// libtorch's MKL chooses kernels by CPU features, as in kappa's binaries (build.rs).
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

// Rust's allocations on mimalloc, which keeps freed pages for reuse (glibc returns N×N
// temporaries to the kernel; docs/architecture.md, "The memory allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Duration;

use criterion::{black_box, BenchmarkId, Criterion};
use kappa_benches::{
    any_measured, configure_threads, fmt_ms, fmt_ratio, gaussian, median_seconds, ns_step_flops,
    shape_id, F32_SHAPES, F64_SHAPES, NOT_RUN_NOTE,
};
use kappa_linalg::tch_backend::tensor_from_array;
use kappa_linalg::{
    aol_newton_schulz, condition_number, condition_number_estimate, gram_newton_schulz,
    newton_schulz, newton_schulz_muon, sigma_max_power, sigma_min_inverse, singular_values,
    svd_thin, IterativeOptions, NsSchedule, PolarExpressSpec, StopRule, SvdDriver, GRAM_NS_RESTART,
};
use ndarray::{linalg::general_mat_mul, Array2, Axis};
use tch::{Device, Kind, Tensor};

const NS_ND: &str = "ns5_ndarray_f32";
const NS_TCH: &str = "ns5_tch_f32";
const SVD: &str = "singular_values";
const COND: &str = "condition_number";
const EST: &str = "kappa_estimate_f64";

fn configure(c: Criterion) -> Criterion {
    c.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

fn wide(x: &Array2<f32>) -> Array2<f32> {
    if x.nrows() > x.ncols() {
        x.t().as_standard_layout().to_owned()
    } else {
        x.clone()
    }
}

fn bench_newton_schulz(c: &mut Criterion) {
    let mut g = c.benchmark_group(NS_ND);
    for (m, n) in F32_SHAPES {
        let id = shape_id(m, n);
        let x: Array2<f32> = gaussian(m, n, 1);
        let xw = wide(&x);
        let (r, s) = xw.dim();
        let (mut gram, mut a2, mut out) = (
            Array2::<f32>::zeros((r, r)),
            Array2::<f32>::zeros((r, r)),
            Array2::<f32>::zeros((r, s)),
        );
        // The three products of one quintic step, into preallocated buffers: plain sgemm.
        g.bench_function(BenchmarkId::new("sgemm_step", &id), |b| {
            b.iter(|| {
                general_mat_mul(1.0, &xw, &xw.t(), 0.0, &mut gram);
                general_mat_mul(1.0, &gram, &gram, 0.0, &mut a2);
                general_mat_mul(1.0, &a2, &xw, 0.0, &mut out);
                black_box(&out);
            })
        });
        g.bench_function(BenchmarkId::new("ns5", &id), |b| {
            b.iter(|| newton_schulz_muon(black_box(&x)).expect("ns5"))
        });
        // The same 5 quintic steps as Gram Newton–Schulz (r×r products, restart every 2).
        let muon = NsSchedule::muon();
        g.bench_function(BenchmarkId::new("gram_ns5", &id), |b| {
            b.iter(|| gram_newton_schulz(black_box(&x), &muon, GRAM_NS_RESTART).expect("gram"))
        });
        // Period 3 (allowed in f32 and f64; bf16 keeps 2): two blocks instead of three.
        g.bench_function(BenchmarkId::new("gram_ns5_p3", &id), |b| {
            b.iter(|| gram_newton_schulz(black_box(&x), &muon, 3).expect("gram"))
        });
    }
    g.finish();

    let mut g = c.benchmark_group(NS_TCH);
    for (m, n) in F32_SHAPES {
        let id = shape_id(m, n);
        let x: Array2<f32> = gaussian(m, n, 1);
        let t = tensor_from_array(x.view(), Kind::Float, Device::Cpu).expect("tensor");
        let tw = tensor_from_array(wide(&x).view(), Kind::Float, Device::Cpu).expect("tensor");
        g.bench_function(BenchmarkId::new("sgemm_step", &id), |b| {
            b.iter(|| {
                let gram = tw.mm(&tw.tr());
                let a2 = gram.mm(&gram);
                black_box(a2.mm(&tw))
            })
        });
        g.bench_function(BenchmarkId::new("ns5", &id), |b| {
            b.iter(|| newton_schulz_muon(black_box(&t)).expect("ns5"))
        });
        let muon = NsSchedule::muon();
        g.bench_function(BenchmarkId::new("gram_ns5", &id), |b| {
            b.iter(|| gram_newton_schulz(black_box(&t), &muon, GRAM_NS_RESTART).expect("gram"))
        });
        g.bench_function(BenchmarkId::new("gram_ns5_p3", &id), |b| {
            b.iter(|| gram_newton_schulz(black_box(&t), &muon, 3).expect("gram"))
        });
    }
    g.finish();
}

/// The orthogonalizer comparison group (ndarray f32): NS5, a generated Polar Express schedule,
/// AOL + Turbo-Muon ×4 and AOL + the short schedule at the tall shapes of the models and a square one.
const ORTHO: &str = "linalg/orthogonalizers";

/// The shapes of the orthogonalizer comparison: 384×1536, 768×3072 (tall MLP factors) and 768².
const ORTHO_SHAPES: [(usize, usize); 3] = [(1536, 384), (3072, 768), (768, 768)];

/// The orthogonalizers: (name, schedule, AOL-preconditioned?).
fn orthogonalizers() -> [(&'static str, NsSchedule, bool); 4] {
    let designed = PolarExpressSpec::new(1e-3, 5, 5, 1.01)
        .design()
        .expect("design")
        .schedule;
    let turbo = NsSchedule::turbo_muon(kappa_linalg::TURBO_MUON_STEPS).expect("turbo");
    [
        ("ns5", NsSchedule::muon(), false),
        ("pe_designed5", designed, false),
        ("aol4", turbo, true),
        (
            "aol3_short",
            NsSchedule::aol_three_steps().expect("short"),
            true,
        ),
    ]
}

/// σ_min, σ_max of the f32 output (computed once, untimed, in f64).
fn output_band(o: &Array2<f32>) -> (f64, f64) {
    let s = singular_values(o.mapv(f64::from).view(), SvdDriver::default()).expect("svd");
    (s[s.len() - 1], s[0])
}

fn bench_orthogonalizers(c: &mut Criterion) {
    let mut g = c.benchmark_group(ORTHO);
    for (m, n) in ORTHO_SHAPES {
        let id = shape_id(m, n);
        let x: Array2<f32> = gaussian(m, n, 1);
        for (name, sched, aol) in orthogonalizers() {
            let run = |x: &Array2<f32>| {
                if aol {
                    aol_newton_schulz(x, &sched).expect("aol")
                } else {
                    newton_schulz(x, &sched).expect("ns")
                }
            };
            let (lo, hi) = output_band(&run(&x));
            println!("{ORTHO} {name} {id}: output σ ∈ [{lo:.4}, {hi:.4}]");
            g.bench_function(BenchmarkId::new(name, &id), |b| {
                b.iter(|| run(black_box(&x)))
            });
        }
    }
    g.finish();
}

/// The orthogonalizer table of the summary: median time beside NS5's.
fn ortho_summary() {
    println!("\nOrthogonalizers, ndarray f32 (median ms; σ bands printed with the runs)");
    for (m, n) in ORTHO_SHAPES {
        let id = shape_id(m, n);
        let ns5 = median_seconds(ORTHO, "ns5", &id);
        for (name, _, _) in orthogonalizers() {
            if let Some(t) = median_seconds(ORTHO, name, &id) {
                let rel = ns5
                    .map(|b| format!("{:.2}× NS5", t / b))
                    .unwrap_or_default();
                println!("{id:<10} {name:<13} {:>9.2} ms  {rel}", t * 1e3);
            }
        }
    }
}

/// torch.linalg.svdvals on CPU. tch's `linalg_svdvals` always passes the CUDA-only `driver`
/// argument (an error on CPU) and `torch.svd(compute_uv=False)` takes a ~3× slower path, so this
/// calls `torch.linalg.matrix_norm(A, 2)`, which is `svdvals(A).amax()` (same kernel as
/// `torch.linalg.svdvals`, plus a max over k values).
fn torch_svdvals(t: &Tensor) -> Tensor {
    t.linalg_norm(2, [0i64, 1].as_slice(), false, None::<Kind>)
}

fn bench_svd_and_cond(c: &mut Criterion) {
    let mut g = c.benchmark_group(SVD);
    for (m, n, dt) in shapes_with_dtype() {
        let id = shape_id(m, n);
        match dt {
            Kind::Float => {
                let a: Array2<f32> = gaussian(m, n, 2);
                let t = tensor_from_array(a.view(), dt, Device::Cpu).expect("tensor");
                g.bench_function(BenchmarkId::new("gesvd", &id), |b| {
                    b.iter(|| singular_values(black_box(a.view()), SvdDriver::QrIteration))
                });
                g.bench_function(BenchmarkId::new("gesdd", &id), |b| {
                    b.iter(|| singular_values(black_box(a.view()), SvdDriver::DivideAndConquer))
                });
                g.bench_function(BenchmarkId::new("torch_svdvals", &id), |b| {
                    b.iter(|| torch_svdvals(black_box(&t)))
                });
            }
            _ => {
                let a: Array2<f64> = gaussian(m, n, 2);
                let t = tensor_from_array(a.view(), dt, Device::Cpu).expect("tensor");
                g.bench_function(BenchmarkId::new("gesvd", &id), |b| {
                    b.iter(|| singular_values(black_box(a.view()), SvdDriver::QrIteration))
                });
                g.bench_function(BenchmarkId::new("gesdd", &id), |b| {
                    b.iter(|| singular_values(black_box(a.view()), SvdDriver::DivideAndConquer))
                });
                g.bench_function(BenchmarkId::new("torch_svdvals", &id), |b| {
                    b.iter(|| torch_svdvals(black_box(&t)))
                });
            }
        }
    }
    g.finish();
    let mut gc = c.benchmark_group(COND);
    for (m, n, dt) in shapes_with_dtype() {
        let id = shape_id(m, n);
        match dt {
            Kind::Float => {
                let a: Array2<f32> = gaussian(m, n, 3);
                let t = tensor_from_array(a.view(), dt, Device::Cpu).expect("tensor");
                gc.bench_function(BenchmarkId::new("kappa_linalg", &id), |b| {
                    b.iter(|| condition_number(black_box(a.view())))
                });
                gc.bench_function(BenchmarkId::new("torch_cond", &id), |b| {
                    b.iter(|| black_box(&t).linalg_cond(2))
                });
            }
            _ => {
                let a: Array2<f64> = gaussian(m, n, 3);
                let t = tensor_from_array(a.view(), dt, Device::Cpu).expect("tensor");
                gc.bench_function(BenchmarkId::new("kappa_linalg", &id), |b| {
                    b.iter(|| condition_number(black_box(a.view())))
                });
                gc.bench_function(BenchmarkId::new("torch_cond", &id), |b| {
                    b.iter(|| black_box(&t).linalg_cond(2))
                });
            }
        }
    }
    gc.finish();
}

fn shapes_with_dtype() -> Vec<(usize, usize, Kind)> {
    F32_SHAPES
        .iter()
        .map(|&(m, n)| (m, n, Kind::Float))
        .chain(F64_SHAPES.iter().map(|&(m, n)| (m, n, Kind::Double)))
        .collect()
}

/// A tall matrix with singular values spaced geometrically from 1 down to 1e-3 (κ = 1000).
fn graded(m: usize, n: usize) -> Array2<f64> {
    let g: Array2<f64> = gaussian(m, n, 5);
    let f = svd_thin(g.view(), SvdDriver::QrIteration).expect("svd");
    let k = f.s.len();
    let s = ndarray::Array1::from_shape_fn(k, |i| 10f64.powf(-3.0 * i as f64 / (k - 1) as f64));
    (&f.u * &s.view().insert_axis(Axis(0))).dot(&f.vt)
}

fn estimate_inputs() -> Vec<(String, Array2<f64>)> {
    let mut v: Vec<(String, Array2<f64>)> = F64_SHAPES
        .iter()
        .map(|&(m, n)| (shape_id(m, n), gaussian(m, n, 4)))
        .collect();
    v.push(("graded_4096x256".to_string(), graded(4096, 256)));
    v
}

/// The Lanczos variants timed: the default (residual ≤ 1e-3), the residual rule at 1e-2 and the
/// error-estimate rule at 1e-2 (the goal's 1 %).
fn estimate_variants() -> [(&'static str, IterativeOptions); 3] {
    let at_one_percent = IterativeOptions {
        tol: 1e-2,
        ..Default::default()
    };
    [
        ("lanczos", IterativeOptions::default()),
        ("lanczos_residual_1e-2", at_one_percent),
        (
            "lanczos_estimate_1e-2",
            IterativeOptions {
                stop: StopRule::ErrorEstimate,
                ..at_one_percent
            },
        ),
    ]
}

fn bench_estimate(c: &mut Criterion) {
    let mut g = c.benchmark_group(EST);
    let opts = IterativeOptions::default();
    for (id, a) in estimate_inputs() {
        g.bench_function(BenchmarkId::new("full_svd", &id), |b| {
            b.iter(|| condition_number(black_box(a.view())))
        });
        for (name, o) in estimate_variants() {
            g.bench_function(BenchmarkId::new(name, &id), |b| {
                b.iter(|| condition_number_estimate(black_box(a.view()), o))
            });
        }
        g.bench_function(BenchmarkId::new("power_sigma_max", &id), |b| {
            b.iter(|| sigma_max_power(black_box(a.view()), opts))
        });
        g.bench_function(BenchmarkId::new("inverse_sigma_min", &id), |b| {
            b.iter(|| sigma_min_inverse(black_box(a.view()), opts))
        });
    }
    g.finish();
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    Some(num? / den?)
}

/// Gram Newton–Schulz over NS5: t(ns5)/t(gram_ns5) at periods 2 and 3 (goal ≥ 1.3 on tall
/// shapes).
fn gram_summary() {
    println!("\nGram Newton–Schulz (the same 5 quintic steps): speed-up t(ns5) / t(gram) at restart periods 2 and 3 (goal ≥ 1.3 on tall shapes)");
    println!(
        "{:<10} {:<8} {:>10} {:>10}",
        "shape", "backend", "period 2", "period 3"
    );
    for (group, backend) in [(NS_ND, "ndarray"), (NS_TCH, "tch")] {
        for (m, n) in F32_SHAPES {
            let id = shape_id(m, n);
            let ns = median_seconds(group, "ns5", &id);
            let [p2, p3] = ["gram_ns5", "gram_ns5_p3"].map(|name| median_seconds(group, name, &id));
            if !any_measured(&[p2, p3]) {
                continue;
            }
            let (r2, r3) = (fmt_ratio(ratio(ns, p2)), fmt_ratio(ratio(ns, p3)));
            println!("{id:<10} {backend:<8} {r2:>10} {r3:>10}");
        }
    }
}

fn summary(threads: usize) {
    println!("\n==== kappa-linalg benchmark summary (threads = {threads}, medians) ====");
    println!("\nNewton–Schulz quintic, 5 steps, f32: throughput as a fraction of plain sgemm");
    println!("(fraction = 5 × t(sgemm_step) / t(ns5); sgemm_step = the 3 products of one step; goal ≥ 0.90)");
    println!(
        "{:<10} {:<8} {:>14} {:>10} {:>12} {:>10} {:>9}",
        "shape", "backend", "sgemm_step ms", "ns5 ms", "sgemm GF/s", "ns5 GF/s", "fraction"
    );
    for (group, backend) in [(NS_ND, "ndarray"), (NS_TCH, "tch")] {
        for (m, n) in F32_SHAPES {
            let id = shape_id(m, n);
            let step = median_seconds(group, "sgemm_step", &id);
            let ns = median_seconds(group, "ns5", &id);
            let fl = ns_step_flops(m, n);
            if !any_measured(&[step, ns]) {
                continue;
            }
            println!(
                "{:<10} {:<8} {:>14} {:>10} {:>12} {:>10} {:>9}",
                id,
                backend,
                fmt_ms(step),
                fmt_ms(ns),
                fmt_ratio(step.map(|t| fl / t * 1e-9)),
                fmt_ratio(ns.map(|t| 5.0 * fl / t * 1e-9)),
                fmt_ratio(ratio(step.map(|t| 5.0 * t), ns)),
            );
        }
    }
    gram_summary();
    println!(
        "\nSingular values and κ against torch.linalg (ratio = ours / torch; < 1 means faster)"
    );
    println!(
        "{:<10} {:<4} {:>9} {:>9} {:>9} {:>11} {:>11} {:>9} {:>10} {:>9}",
        "shape",
        "type",
        "gesvd ms",
        "gesdd ms",
        "torch ms",
        "gesvd/torch",
        "gesdd/torch",
        "κ ms",
        "torch κ ms",
        "κ/torch"
    );
    for (m, n, dt) in shapes_with_dtype() {
        let id = shape_id(m, n);
        let gesvd = median_seconds(SVD, "gesvd", &id);
        let gesdd = median_seconds(SVD, "gesdd", &id);
        let torch = median_seconds(SVD, "torch_svdvals", &id);
        let k = median_seconds(COND, "kappa_linalg", &id);
        let tk = median_seconds(COND, "torch_cond", &id);
        if !any_measured(&[gesvd, gesdd, torch, k, tk]) {
            continue;
        }
        println!(
            "{:<10} {:<4} {:>9} {:>9} {:>9} {:>11} {:>11} {:>9} {:>10} {:>9}",
            id,
            if dt == Kind::Float { "f32" } else { "f64" },
            fmt_ms(gesvd),
            fmt_ms(gesdd),
            fmt_ms(torch),
            fmt_ratio(ratio(gesvd, torch)),
            fmt_ratio(ratio(gesdd, torch)),
            fmt_ms(k),
            fmt_ms(tk),
            fmt_ratio(ratio(k, tk)),
        );
    }
    println!("\nIterative κ (Golub–Kahan–Lanczos) against the full-SVD κ, f64");
    println!("(goal at 4096x256: speedup ≥ 10 with relative error ≤ 1%)");
    println!(
        "{:<16} {:<22} {:>9} {:>10} {:>8} {:>6} {:>9} {:>10} {:>9}",
        "input",
        "variant",
        "svd ms",
        "lanczos ms",
        "speedup",
        "steps",
        "converged",
        "rel. error",
        "estimate"
    );
    for (id, a) in estimate_inputs() {
        let full = median_seconds(EST, "full_svd", &id);
        let exact = condition_number(a.view());
        for (name, o) in estimate_variants() {
            let lz = median_seconds(EST, name, &id);
            if !any_measured(&[full, lz]) {
                continue;
            }
            // The estimate's accuracy columns come from one more call, outside the timing; an
            // error there is a finding and is printed as such.
            let est = match condition_number_estimate(a.view(), o) {
                Ok(e) => e,
                Err(e) => {
                    println!("{id:<16} {name:<22} estimate failed: {e}");
                    continue;
                }
            };
            let err = exact.as_ref().map(|k| (est.kappa - k).abs() / k);
            println!(
                "{:<16} {:<22} {:>9} {:>10} {:>8} {:>6} {:>9} {:>10} {:>9}",
                id,
                name,
                fmt_ms(full),
                fmt_ms(lz),
                fmt_ratio(ratio(full, lz)),
                est.iterations,
                est.converged,
                err.map_or_else(|e| format!("SVD failed: {e}"), |e| format!("{e:.2e}")),
                format!("{:.1e}", est.error_estimate),
            );
        }
        let (power, inverse) = (
            median_seconds(EST, "power_sigma_max", &id),
            median_seconds(EST, "inverse_sigma_min", &id),
        );
        if any_measured(&[power, inverse]) {
            println!(
                "{:<16} {:<22} power σmax {} ms, inverse σmin {} ms",
                id,
                "",
                fmt_ms(power),
                fmt_ms(inverse),
            );
        }
    }
    println!("{NOT_RUN_NOTE}");
}

fn main() {
    let threads = configure_threads();
    let mut c = configure(Criterion::default()).configure_from_args();
    bench_newton_schulz(&mut c);
    bench_svd_and_cond(&mut c);
    bench_estimate(&mut c);
    bench_orthogonalizers(&mut c);
    c.final_summary();
    summary(threads);
    ortho_summary();
}
