//! The machine's physical limits at the run's thread count, which `docs/performance.md` holds
//! kappa's achieved rates against:
//!
//! - GEMM throughput: the best of [`GEMM_REPS`] n×n products (n = [`GEMM_N`]) through libtorch
//!   (MKL on x86), 2n³ flops each, in f32, f64, and bf16 where the CPU has native bf16 products
//!   (`kappa_optim::cpu_has_native_bf16`; emulated bf16 is no limit anyone computes at);
//! - memory bandwidth: a STREAM-style triad `a[i] = b[i] + s·c[i]` over three f64 arrays of
//!   [`TRIAD_LEN`] elements (far beyond any cache) split over the run's rayon workers, the best
//!   of [`TRIAD_REPS`], counted as 24 bytes an element (two reads, one write; the write-allocate
//!   read a cache makes is not counted, as in STREAM).
//!
//! The figures are printed and written through `kappa_benches::record` as
//! `kappa-paired/limits/limits.json`. Run: `cargo bench -p kappa-benches --bench limits`
//! (`KAPPA_BENCH_THREADS` as every bench); `KAPPA_BENCH_QUICK=1` uses a 512² product and 2²⁰
//! elements (a smoke run, not a limit).

// libtorch's MKL chooses kernels by CPU features, as in kappa's binaries (build.rs).
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;

use criterion::black_box;
use kappa_benches::configure_threads;
use kappa_benches::paired::cpu_model;
use rayon::prelude::*;
use serde_json::json;
use tch::{Device, Kind, Tensor};

/// The GEMM's order.
const GEMM_N: i64 = 2048;
/// Timed products per element type (after one warm-up).
const GEMM_REPS: usize = 5;
/// Elements of each triad array (128 MiB of f64 each).
const TRIAD_LEN: usize = 1 << 24;
/// Timed triads (after one warm-up that also touches every page).
const TRIAD_REPS: usize = 10;

fn quick() -> bool {
    std::env::var("KAPPA_BENCH_QUICK").is_ok_and(|v| v == "1")
}

/// GFLOP/s of the best of [`GEMM_REPS`] n×n products of `kind` through libtorch.
fn gemm_gflops(n: i64, kind: Kind) -> f64 {
    let a = Tensor::randn([n, n], (Kind::Float, Device::Cpu)).to_kind(kind);
    let b = Tensor::randn([n, n], (Kind::Float, Device::Cpu)).to_kind(kind);
    let c = a.matmul(&b);
    let mut best = f64::INFINITY;
    for _ in 0..GEMM_REPS {
        let t = Instant::now();
        let _ = a.matmul_out(&c, &b);
        black_box(&c);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (n as f64).powi(3) / best * 1e-9
}

/// GB/s of the best of [`TRIAD_REPS`] triads over `len` f64 elements.
fn triad_gbs(len: usize) -> f64 {
    let (b, c) = (vec![1.0f64; len], vec![2.0f64; len]);
    let mut a = vec![0.0f64; len];
    let chunk = (len / (4 * rayon::current_num_threads())).max(4096);
    let mut triad = |s: f64| {
        a.par_chunks_mut(chunk)
            .zip(b.par_chunks(chunk))
            .zip(c.par_chunks(chunk))
            .for_each(|((a, b), c)| {
                for ((a, b), c) in a.iter_mut().zip(b).zip(c) {
                    *a = b + s * c;
                }
            });
    };
    triad(3.0);
    let mut best = f64::INFINITY;
    for rep in 0..TRIAD_REPS {
        let t = Instant::now();
        triad(black_box(rep as f64));
        best = best.min(t.elapsed().as_secs_f64());
    }
    black_box(&a);
    24.0 * len as f64 / best * 1e-9
}

fn main() {
    let threads = configure_threads();
    let (n, len) = if quick() {
        (512, 1 << 20)
    } else {
        (GEMM_N, TRIAD_LEN)
    };
    let f32 = gemm_gflops(n, Kind::Float);
    let f64 = gemm_gflops(n, Kind::Double);
    let bf16 = kappa_optim::cpu_has_native_bf16().then(|| gemm_gflops(n, Kind::BFloat16));
    let triad = triad_gbs(len);
    println!(
        "\n==== the machine's limits, {threads} thread(s), {} ====",
        cpu_model()
    );
    println!("GEMM {n}² through libtorch, best of {GEMM_REPS}: f32 {f32:.1} GFLOP/s, f64 {f64:.1} GFLOP/s, bf16 {}",
        bf16.map_or("— (no native bf16 products)".to_string(), |g| format!("{g:.1} GFLOP/s")));
    println!("triad over 3 × {len} f64, best of {TRIAD_REPS}: {triad:.1} GB/s");
    kappa_benches::record::write(
        "limits",
        "limits",
        json!({
            "kind": "limits",
            "threads": threads,
            "gemm_n": n,
            "gemm_f32_gflops": f32,
            "gemm_f64_gflops": f64,
            "gemm_bf16_gflops": bf16,
            "triad_len": len,
            "triad_gbs": triad,
        }),
    );
}
