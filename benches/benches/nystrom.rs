//! Nyström attention against exact softmax attention: forward + backward of one bidirectional
//! attention layer (D = 64, 4 heads, batch 1, f32) at sequence lengths 256 to 4096, time and
//! peak memory, in one run.
//!
//! Three kernels per length: exact softmax through libtorch's fused `scaled_dot_product_attention`
//! (`softmax-fused`), exact softmax with the probabilities materialized (`softmax-explicit`, the
//! T×T matrix the Nyströmformer paper compares against), and `NystromConfig::paper(64)` (64
//! landmarks, 6 pseudo-inverse iterations, the 33-tap convolution skip).
//!
//! Time: the kernels alternate step by step (one forward + backward each, in rotating order), so
//! the machine's drift is shared; the table gives each kernel's median over the pairs and the
//! ratio to `softmax-fused`. Memory: each (kernel, length) runs once more in a fresh child
//! process (this binary, `KAPPA_NYSTROM_CASE=kernel:T`), which reports the growth of its peak
//! resident set (VmHWM) over the step, so one case's allocations cannot hide another's.
//!
//! Run: `KAPPA_BENCH_THREADS=1 cargo bench -p kappa-benches --bench nystrom` (and with 2).
//! `KAPPA_BENCH_PAIRS` sets the alternations per length (default 7).

// libtorch's MKL chooses kernels by CPU features, as in kappa's binaries (build.rs).
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

// Rust's allocations on mimalloc, which keeps freed pages for reuse (glibc returns N×N
// temporaries to the kernel; docs/architecture.md, "The memory allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::Command;
use std::time::Instant;

use kappa_benches::paired::{ratios, Spread};
use kappa_benches::{configure_threads, record};
use kappa_models::{
    AttentionConfig, AttentionKernel, ConditionedAttention, CorrectionConfig, NystromConfig,
    ScoreScale,
};
use tch::{nn, Device, Kind, Tensor};

const LENGTHS: [i64; 5] = [256, 512, 1024, 2048, 4096];
const KERNELS: [&str; 3] = ["softmax-fused", "softmax-explicit", "nystrom-64"];

fn layer(kernel: &str) -> (nn::VarStore, ConditionedAttention) {
    let vs = nn::VarStore::new(Device::Cpu);
    let (fused, kernel) = match kernel {
        "softmax-fused" => (true, AttentionKernel::Softmax),
        "softmax-explicit" => (false, AttentionKernel::Softmax),
        _ => (true, AttentionKernel::Nystrom(NystromConfig::paper(64))),
    };
    let cfg = AttentionConfig {
        n_embd: 64,
        n_head: 4,
        bias: false,
        causal: false,
        scaling: ScoreScale::InvSqrtK,
        correction: CorrectionConfig::None,
        fused_kernel: fused,
        kernel,
    };
    let attn = ConditionedAttention::new(vs.root() / "attn", cfg, 0.02).expect("layer");
    (vs, attn)
}

/// One forward + backward; seconds.
fn step(attn: &ConditionedAttention, vs: &nn::VarStore, x: &Tensor) -> f64 {
    let start = Instant::now();
    let y = attn.try_forward(x).expect("forward");
    y.square().mean(Kind::Float).backward();
    for v in vs.trainable_variables() {
        let _ = v.grad().zero_();
    }
    start.elapsed().as_secs_f64()
}

/// VmHWM of this process in KiB.
fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The child: one step of `kernel` at length `t`, printing the peak-RSS growth in MiB.
fn child(case: &str) {
    let (kernel, t) = case.split_once(':').expect("kernel:T");
    let t: i64 = t.parse().expect("T");
    let (vs, attn) = layer(kernel);
    let x = Tensor::randn([1, t, 64], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let before = peak_kib();
    step(&attn, &vs, &x);
    println!("{}", (peak_kib().saturating_sub(before)) as f64 / 1024.0);
}

fn memory_mib(kernel: &str, t: i64) -> Option<f64> {
    let exe = std::env::current_exe().ok()?;
    let out = Command::new(exe)
        .env("KAPPA_NYSTROM_CASE", format!("{kernel}:{t}"))
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .lines()
        .last()?
        .parse()
        .ok()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    if let Ok(case) = std::env::var("KAPPA_NYSTROM_CASE") {
        configure_threads();
        return child(&case);
    }
    let threads = configure_threads();
    let pairs: usize = std::env::var("KAPPA_BENCH_PAIRS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    println!("Nyström vs exact softmax attention, forward + backward, D = 64, 4 heads, batch 1, f32, {threads} thread(s), {pairs} alternations");
    println!("| T | kernel | median ms | × softmax-fused | peak RSS growth MiB |");
    println!("|---|---|---|---|---|");
    let mut rows = Vec::new();
    for t in LENGTHS {
        let layers: Vec<_> = KERNELS.iter().map(|k| layer(k)).collect();
        let x = Tensor::randn([1, t, 64], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        for (vs, attn) in &layers {
            step(attn, vs, &x); // warm-up
        }
        let mut times = vec![Vec::new(); KERNELS.len()];
        for p in 0..pairs {
            for i in 0..KERNELS.len() {
                let j = (i + p) % KERNELS.len();
                times[j].push(step(&layers[j].1, &layers[j].0, &x));
            }
        }
        for (i, kernel) in KERNELS.iter().enumerate().skip(1) {
            rows.push(record_row(t, kernel, threads, &times[i], &times[0]));
        }
        let medians: Vec<f64> = times.into_iter().map(median).collect();
        for (i, kernel) in KERNELS.iter().enumerate() {
            let mem = memory_mib(kernel, t).map_or("n/a".to_string(), |m| format!("{m:.1}"));
            println!(
                "| {t} | {kernel} | {:.2} | {:.3} | {mem} |",
                medians[i] * 1e3,
                medians[i] / medians[0]
            );
        }
    }
    write_record(rows);
}

/// One kernel's record row at length `t`: its times against softmax-fused's, pair by pair.
fn record_row(t: i64, kernel: &str, threads: usize, ours: &[f64], fused: &[f64]) -> record::Row {
    let d = 64.0;
    let tf = t as f64;
    record::Row {
        parameter: format!("T{t}"),
        variant: kernel.to_string(),
        threads,
        kappa_s: Some(median(ours.to_vec())),
        peer_s: Some(median(fused.to_vec())),
        ratio: record::Ratio::of(Spread::of(ratios(ours, fused))),
        work: Some(record::Work {
            bound: record::Bound::GemmF32,
            amount: 3.0 * (8.0 * tf * d * d + 4.0 * tf * tf * d),
        }),
    }
}

/// The kernels' record (`kappa_benches::record`).
fn write_record(rows: Vec<record::Row>) {
    record::Paired {
        bench: "nystrom",
        name: "nystrom_vs_exact",
        title: "Nyström attention against exact softmax attention".into(),
        what: "Forward + backward of one bidirectional attention layer (D = 64, 4 heads, batch \
               1, f32) at sequence length T: exact softmax with the probabilities materialized, \
               and Nyström attention (64 landmarks), against libtorch's fused exact softmax; \
               kernels alternated step by step."
            .into(),
        peer: "softmax-fused".into(),
        spread: "min–max over pairs",
        model: "the exact layer's work whichever kernel runs, forward and backward ≈ 3 × the \
                forward's 8TD² + 4T²D flops (the four D×D projections, the scores and the \
                weighted values): what Nyström's saving shows as"
            .into(),
        rows,
    }
    .write();
}
