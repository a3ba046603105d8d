//! Criterion benchmarks of kappa-models: one training step (forward, backward, gradient
//! clipping, AdamW) of the CPU-sized GPT and ViT, baseline and λ·I_k-conditioned, and the same
//! step in PyTorch eager (`benches/reference/models_reference.py`, run with the virtual
//! environment's Python and the same libtorch, config and thread count).
//!
//! Run: `KAPPA_BENCH_THREADS=1 cargo bench -p kappa-benches --bench models` (and again with 2).
//! Settings (environment):
//!
//! * `KAPPA_BENCH_THREADS` — 1 or 2 (libtorch and OpenBLAS threads; also passed to the script).
//! * `KAPPA_BENCH_SECONDS` — criterion measurement time per function (default 5).
//! * `KAPPA_VENV` — the virtual environment holding torch (default `<workspace>/.venv`).
//! * `KAPPA_BENCH_REFERENCE_STEPS` — timed steps of the PyTorch script (default 30).
//! * `KAPPA_BENCH_PAIRS` — pairs of the paired overhead measurement (default 60; 0 skips it).
//!
//! After the criterion output a summary prints, per model: kappa's step time, PyTorch's, the
//! ratio kappa / PyTorch (goal ≤ 0.95), the conditioned step over the baseline step (the paper
//! reports +0.2%; goal ≤ 1%), images or tokens per second, and the model FLOP/s as a fraction
//! of this machine's sgemm throughput (a 1024² f32 matmul through the same libtorch).
//!
//! Criterion times the baseline and the conditioned model seconds apart, so on a shared machine
//! their ratio carries the drift of the load in between. A second, paired measurement then
//! alternates single steps of the two models (baseline first in even pairs, conditioned first
//! in odd ones) and prints the median and the interquartile range of the per-pair ratios of
//! wall time and of CPU time (summed over the process's threads): drift slower than a step
//! cancels within a pair, and time spent waiting for a core held by another process is not CPU
//! time.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{black_box, Criterion};
use kappa_benches::{configure_threads, fmt_ms, fmt_ratio, median_seconds, train_step};
use kappa_models::{
    adamw_groups, seeded, Conditioning, Gpt, GptConfig, Layout, ParamGroup, TrainConfig, Vit,
    VitConfig,
};
use tch::{nn, Device, Kind, Tensor};

const GROUP: &str = "models_train_step";
const GPT_BATCH: i64 = 32;
const VIT_BATCH: i64 = 64;
const LAMBDA: f64 = 10.0;

fn conditioning(lambda: f64) -> Conditioning {
    if lambda > 0.0 {
        Conditioning::Identity {
            lambda,
            layout: Layout::Shifted,
        }
    } else {
        Conditioning::None
    }
}

/// One training step as the `Trainer` takes it: zero gradients, loss, backward, global
/// gradient norm and clipping at 1, AdamW on the decay / no-decay groups.
struct Stepper {
    groups: Vec<ParamGroup>,
    params: Vec<Tensor>,
}

impl Stepper {
    fn new(vs: &nn::VarStore) -> Self {
        let groups = adamw_groups(vs, &TrainConfig::default());
        let params = groups
            .iter()
            .flat_map(|g| g.params.iter().map(Tensor::shallow_clone))
            .collect();
        Self { groups, params }
    }

    fn step(&mut self, loss: impl FnOnce() -> Tensor) {
        train_step(&mut self.groups, &self.params, 1e-3, loss);
    }
}

fn gpt_config() -> GptConfig {
    GptConfig::cpu(98)
}

fn vit_config() -> VitConfig {
    VitConfig::cpu()
}

/// A training step of the cpu GPT (B = 32, T = 64) with the given λ, owning its model.
fn gpt_step(lambda: f64) -> impl FnMut() {
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = gpt_config().with_conditioning(conditioning(lambda));
    let gpt = seeded(0, || Gpt::new(&vs.root(), cfg)).expect("gpt");
    let idx = seeded(1, || {
        Tensor::randint(
            98,
            [GPT_BATCH, cfg.block_size as i64],
            (Kind::Int64, Device::Cpu),
        )
    });
    let mut stepper = Stepper::new(&vs);
    move || {
        let _keep = &vs;
        stepper.step(|| black_box(gpt.loss(&idx, &idx).expect("loss")))
    }
}

/// A training step of the cpu ViT (B = 64) with the given λ, owning its model.
fn vit_step(lambda: f64) -> impl FnMut() {
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = vit_config().with_conditioning(conditioning(lambda));
    let vit = seeded(0, || Vit::new(&vs.root(), cfg)).expect("vit");
    let (x, y) = seeded(1, || {
        (
            Tensor::randn([VIT_BATCH, 1, 28, 28], (Kind::Float, Device::Cpu)),
            Tensor::randint(10, [VIT_BATCH], (Kind::Int64, Device::Cpu)),
        )
    });
    let mut stepper = Stepper::new(&vs);
    move || {
        let _keep = &vs;
        stepper.step(|| black_box(vit.loss(&x, &y).expect("loss")))
    }
}

fn bench_step(c: &mut Criterion, id: &str, mut step: impl FnMut()) {
    c.benchmark_group(GROUP)
        .bench_function(id, |b| b.iter(&mut step));
}

/// Median and quartiles of a sample.
#[derive(Clone, Copy)]
struct Quartiles {
    median: f64,
    q1: f64,
    q3: f64,
}

impl Quartiles {
    fn of(mut xs: Vec<f64>) -> Self {
        xs.sort_by(f64::total_cmp);
        let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
        Self {
            median: at(0.5),
            q1: at(0.25),
            q3: at(0.75),
        }
    }
}

impl std::fmt::Display for Quartiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.3} ({:.3}–{:.3})", self.median, self.q1, self.q3)
    }
}

/// CPU time of this process so far, in nanoseconds, summed over its threads
/// (`CLOCK_PROCESS_CPUTIME_ID`). Time spent waiting for a core that another process holds is
/// not in it, which makes it steadier than wall time on a shared machine.
#[allow(unsafe_code)]
fn process_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid, exclusive pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// The conditioned step over the baseline step from `pairs` pairs of single steps taken back to
/// back (order alternating): quartiles of the per-pair ratios of wall time and of CPU time.
fn paired_ratio(
    mut baseline: impl FnMut(),
    mut conditioned: impl FnMut(),
    pairs: usize,
) -> (Quartiles, Option<Quartiles>) {
    let time = |f: &mut dyn FnMut()| {
        let (t, cpu) = (Instant::now(), process_cpu_ns());
        f();
        let cpu = cpu.zip(process_cpu_ns()).map(|(a, b)| (b - a) as f64);
        (t.elapsed().as_secs_f64(), cpu)
    };
    for _ in 0..3 {
        baseline();
        conditioned();
    }
    let (mut wall, mut cpu) = (Vec::with_capacity(pairs), Vec::with_capacity(pairs));
    for i in 0..pairs {
        let (b, c) = if i % 2 == 0 {
            let b = time(&mut baseline);
            (b, time(&mut conditioned))
        } else {
            let c = time(&mut conditioned);
            (time(&mut baseline), c)
        };
        wall.push(c.0 / b.0);
        if let (Some(cb), Some(cc)) = (b.1, c.1) {
            cpu.push(cc / cb);
        }
    }
    let cpu = (cpu.len() == pairs).then(|| Quartiles::of(cpu));
    (Quartiles::of(wall), cpu)
}

/// Sets flush-to-zero and denormals-are-zero for this thread (what PyTorch's
/// `set_flush_denormal(True)` does); returns whether it could.
#[allow(unsafe_code)]
fn flush_subnormals() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let mut csr: u32 = 0;
        // SAFETY: stmxcsr/ldmxcsr read and write this thread's SSE control register through a
        // valid pointer; FTZ (bit 15) and DAZ (bit 6) only change how subnormals are rounded.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack));
            csr |= (1 << 15) | (1 << 6);
            std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack));
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// sgemm FLOP/s of a 1024² f32 matmul through libtorch (best of 10 after a warmup).
fn sgemm_flops() -> f64 {
    let n = 1024;
    let a = Tensor::randn([n, n], (Kind::Float, Device::Cpu));
    let b = Tensor::randn([n, n], (Kind::Float, Device::Cpu));
    let _ = a.matmul(&b);
    let mut best = f64::INFINITY;
    for _ in 0..10 {
        let t = Instant::now();
        let c = a.matmul(&b);
        black_box(c.double_value(&[0, 0]));
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (n as f64).powi(3) / best
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// Seconds per step of the PyTorch reference, or the reason it could not run.
fn reference(
    model: &str,
    config: &str,
    batch: i64,
    lambda: f64,
    threads: usize,
) -> Result<f64, String> {
    let venv = std::env::var_os("KAPPA_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv"));
    let python = venv.join("bin/python");
    let script = workspace().join("benches/reference/models_reference.py");
    let steps = std::env::var("KAPPA_BENCH_REFERENCE_STEPS").unwrap_or_else(|_| "30".into());
    let out = Command::new(&python)
        .arg(&script)
        .args(["--model", model, "--config", config])
        .args(["--batch", &batch.to_string(), "--lam", &lambda.to_string()])
        .args(["--threads", &threads.to_string(), "--steps", &steps])
        .env("OMP_NUM_THREADS", threads.to_string())
        .env("OPENBLAS_NUM_THREADS", threads.to_string())
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("")
            .to_string());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    v["seconds_per_step"]
        .as_f64()
        .ok_or_else(|| "no seconds_per_step in the output".into())
}

fn main() {
    let threads = configure_threads();
    let seconds: u64 = std::env::var("KAPPA_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(seconds))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(10);
    bench_step(&mut c, "gpt_cpu_baseline", gpt_step(0.0));
    bench_step(&mut c, "gpt_cpu_lambda10", gpt_step(LAMBDA));
    bench_step(&mut c, "vit_cpu_baseline", vit_step(0.0));
    bench_step(&mut c, "vit_cpu_lambda10", vit_step(LAMBDA));
    c.final_summary();
    let pairs: usize = std::env::var("KAPPA_BENCH_PAIRS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    if pairs > 0 {
        println!(
            "\nconditioned step / baseline step, {pairs} alternating pairs, {threads} thread(s)"
        );
        println!(
            "(control: a second baseline model; λ=0.001 conditions without collapsing attention):"
        );
        println!("| model | conditioned | wall-time ratio, median (IQR) | CPU-time ratio, median (IQR) |");
        println!("|---|---|---|---|");
        let mut rows = vec![("control", 0.0), ("λ=0.001", 1e-3), ("λ=10", LAMBDA)];
        // λ = 10 saturates the softmax; the flushed row tests whether the remaining cost is
        // subnormal arithmetic. MXCSR is per thread, so only a one-thread run is covered.
        if threads == 1 && flush_subnormals() {
            rows.push(("λ=10, subnormals flushed (both)", LAMBDA));
        }
        for (label, lambda) in rows {
            for (name, (wall, cpu)) in [
                ("gpt", paired_ratio(gpt_step(0.0), gpt_step(lambda), pairs)),
                ("vit", paired_ratio(vit_step(0.0), vit_step(lambda), pairs)),
            ] {
                let cpu = cpu.map_or("n/a".to_string(), |q| q.to_string());
                println!("| {name} | {label} | {wall} | {cpu} |");
            }
        }
    }

    let peak = sgemm_flops();
    let gpt = gpt_config();
    let vit = vit_config();
    let t = gpt.block_size;
    let models = [
        (
            "gpt",
            serde_json::to_string(&gpt).unwrap_or_default(),
            GPT_BATCH,
            // forward + backward ≈ 3 × forward
            3.0 * gpt.flops_per_token(t) * (GPT_BATCH as usize * t) as f64,
            (GPT_BATCH as usize * t) as f64,
            "tokens",
        ),
        (
            "vit",
            serde_json::to_string(&vit).unwrap_or_default(),
            VIT_BATCH,
            3.0 * vit.flops_per_image() * VIT_BATCH as f64,
            VIT_BATCH as f64,
            "images",
        ),
    ];
    println!(
        "\nkappa-models training step, {threads} thread(s); sgemm (1024², libtorch): {:.1} GFLOP/s",
        peak / 1e9
    );
    println!("| model | variant | kappa ms | PyTorch ms | kappa / PyTorch | conditioned / baseline | units/s | model GFLOP/s | fraction of sgemm |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, config, batch, flops, units, unit) in &models {
        let base = median_seconds(GROUP, &format!("{name}_cpu_baseline"), "");
        for (variant, lambda) in [("baseline", 0.0), ("λ=10", LAMBDA)] {
            let id = if lambda > 0.0 { "lambda10" } else { "baseline" };
            let ours = median_seconds(GROUP, &format!("{name}_cpu_{id}"), "");
            let theirs = reference(name, config, *batch, lambda, threads);
            if let Err(e) = &theirs {
                eprintln!("PyTorch reference for {name} {variant} did not run: {e}");
            }
            let theirs = theirs.ok();
            let ratio = ours.zip(theirs).map(|(a, b)| a / b);
            let overhead = ours.zip(base).map(|(a, b)| a / b);
            println!(
                "| {name} | {variant} | {} | {} | {} | {} | {} {unit} | {} | {} |",
                fmt_ms(ours),
                fmt_ms(theirs),
                fmt_ratio(ratio),
                fmt_ratio(overhead),
                ours.map_or("n/a".into(), |s| format!("{:.0}", units / s)),
                ours.map_or("n/a".into(), |s| format!("{:.2}", flops / s / 1e9)),
                ours.map_or("n/a".into(), |s| format!("{:.3}", flops / s / peak)),
            );
        }
    }
}
