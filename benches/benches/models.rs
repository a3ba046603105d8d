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
//! * `KAPPA_PYTHON` or `KAPPA_VENV` — the Python that runs the script (`kappa_benches::peer::python`).
//! * `KAPPA_BENCH_REFERENCE_STEPS` — timed steps of the PyTorch script (default 30).
//! * `KAPPA_BENCH_PAIRS` — pairs of the paired overhead measurement (default 60; 0 skips it).
//! * `KAPPA_BENCH_VERSUS_PAIRS` — pairs of the paired kappa-vs-PyTorch GPT measurement
//!   (default 40; 0 skips it).
//! * `KAPPA_BENCH_VERSUS_ONLY` — when set, run only that measurement (no criterion).
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
//!
//! Last, the GPT training step of kappa against PyTorch eager, alternating in one run: the
//! reference script runs as a child process (`--serve`) that takes one step per command and
//! reports its wall and CPU time measured in Python, so single steps of the two alternate
//! (kappa first in even pairs, PyTorch first in odd ones) on the same load. Both run the same
//! nanoGPT-style model with biases at 4 layers × 4 heads × 256 wide, context 128, batch 8, and
//! at the CPU preset (2 × 4 × 64, context 64, batch 32), at 1 and then 2 threads set in the
//! process; the table gives the medians of the step times, the median, interquartile range and
//! extremes of the per-pair ratios kappa / PyTorch, and the CPU-time ratio. The PyTorch step is
//! the default one (`AdamW` without foreach/fused arguments, `zero_grad()` dropping gradients,
//! `clip_grad_norm_` at 1); kappa's is the `Trainer`'s (fused AdamW, dropped gradients, the
//! same clipping). Only that section:
//! `KAPPA_BENCH_VERSUS_ONLY=1 cargo bench -p kappa-benches --bench models`.

// libtorch's MKL chooses kernels by CPU features, as in kappa's binaries (build.rs).
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

// Rust's allocations on mimalloc, which keeps freed pages for reuse (glibc returns N×N
// temporaries to the kernel; docs/architecture.md, "The memory allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{black_box, Criterion};
use kappa_benches::peer::{reference_command, Peer};
use kappa_benches::record;
use kappa_benches::{configure_threads, fmt_ms, fmt_ratio, median_seconds, train_step, NOT_RUN};
use kappa_models::{
    autocast::autocast, autocast::native_bf16, CorrectionConfig, Gpt, GptConfig, HeadLayout, Vit,
    VitConfig,
};
use kappa_optim::Optimizer;
use kappa_train::{adamw_groups, seeded, TrainConfig, TrainPrecision};
use tch::{nn, Device, Kind, Tensor};

const GROUP: &str = "models_train_step";
const GPT_BATCH: i64 = 32;
const VIT_BATCH: i64 = 64;
const LAMBDA: f64 = 10.0;

fn correction(lambda: f64) -> CorrectionConfig {
    if lambda > 0.0 {
        CorrectionConfig::identity(lambda, HeadLayout::Shifted)
    } else {
        CorrectionConfig::None
    }
}

/// One training step as the `Trainer` takes it: gradients dropped, loss, backward, global
/// gradient norm and clipping at 1, AdamW on the decay / no-decay groups.
struct Stepper {
    opt: Optimizer,
}

impl Stepper {
    fn new(vs: &nn::VarStore) -> Self {
        let groups = adamw_groups(vs, &TrainConfig::default()).expect("groups");
        let opt = Optimizer::new(groups).expect("optimizer");
        Self { opt }
    }

    fn step(&mut self, loss: impl FnOnce() -> Tensor) {
        train_step(&mut self.opt, loss);
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
    gpt_step_of(
        gpt_config().with_correction(correction(lambda)),
        GPT_BATCH,
        TrainPrecision::F32,
    )
}

/// A training step of the GPT `cfg` on batches of `batch` sequences, owning its model, with
/// the forward pass at `precision` (as the `Trainer` runs it).
fn gpt_step_of(cfg: GptConfig, batch: i64, precision: TrainPrecision) -> impl FnMut() {
    let vs = nn::VarStore::new(Device::Cpu);
    let gpt = seeded(0, || Gpt::new(&vs.root(), cfg)).expect("gpt");
    let idx = seeded(1, || {
        Tensor::randint(
            cfg.vocab_size as i64,
            [batch, cfg.block_size as i64],
            (Kind::Int64, Device::Cpu),
        )
    });
    let mut stepper = Stepper::new(&vs);
    move || {
        let _keep = &vs;
        stepper.step(|| {
            let loss = || gpt.loss(&idx, &idx).expect("loss");
            black_box(match precision {
                TrainPrecision::F32 => loss(),
                TrainPrecision::Bf16 => autocast(Device::Cpu, loss),
            })
        })
    }
}

/// A training step of the cpu ViT (B = 64) with the given λ, owning its model.
fn vit_step(lambda: f64) -> impl FnMut() {
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = vit_config().with_correction(correction(lambda));
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

/// The command running `benches/reference/models_reference.py` for a model, config, batch, λ
/// and thread count.
fn models_reference(model: &str, config: &str, batch: i64, lambda: f64, threads: usize) -> Command {
    let mut cmd = reference_command("models_reference.py", threads);
    cmd.args(["--model", model, "--config", config])
        .args(["--batch", &batch.to_string(), "--lam", &lambda.to_string()])
        .args(["--threads", &threads.to_string()]);
    cmd
}

/// Seconds per step of the PyTorch reference, or the reason it could not run.
fn reference(
    model: &str,
    config: &str,
    batch: i64,
    lambda: f64,
    threads: usize,
) -> Result<f64, String> {
    let steps = std::env::var("KAPPA_BENCH_REFERENCE_STEPS").unwrap_or_else(|_| "30".into());
    let out = models_reference(model, config, batch, lambda, threads)
        .args(["--steps", &steps])
        .output()
        .map_err(|e| format!("the reference script: {e}"))?;
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

/// The PyTorch reference as a child process stepping on command (`models_reference.py
/// --serve`): it builds the same model, then runs one training step per `step` line and answers
/// with that step's wall and CPU seconds, measured inside Python.
struct ReferenceServer(Peer);

impl ReferenceServer {
    fn start(
        model: &str,
        config: &str,
        batch: i64,
        threads: usize,
        precision: TrainPrecision,
    ) -> Result<Self, String> {
        let mut cmd = models_reference(model, config, batch, 0.0, threads);
        if precision == TrainPrecision::Bf16 {
            cmd.arg("--bf16");
        }
        cmd.arg("--serve");
        match Peer::start(cmd)? {
            (peer, ready) if ready == "ready" => Ok(Self(peer)),
            (_, other) => Err(format!("expected `ready`, got {other:?}")),
        }
    }

    /// One step: (wall seconds, CPU seconds).
    fn step(&mut self) -> Result<(f64, f64), String> {
        match self.0.ask_numbers("step")?.as_slice() {
            &[wall, cpu] => Ok((wall, cpu)),
            other => Err(format!("unexpected answer {other:?}")),
        }
    }
}

/// Paired single steps of kappa and of the PyTorch reference (kappa first in even pairs,
/// PyTorch first in odd ones), after 3 warm-up steps of each.
struct VersusPyTorch {
    kappa_ms: f64,
    torch_ms: f64,
    wall: Quartiles,
    cpu: Option<Quartiles>,
    min: f64,
    max: f64,
    pairs: usize,
}

fn versus_pytorch(
    mut kappa: impl FnMut(),
    torch: &mut ReferenceServer,
    pairs: usize,
) -> Result<VersusPyTorch, String> {
    let mut ours = || {
        let (t, cpu) = (Instant::now(), process_cpu_ns());
        kappa();
        let cpu = cpu
            .zip(process_cpu_ns())
            .map(|(a, b)| (b - a) as f64 * 1e-9);
        (t.elapsed().as_secs_f64(), cpu)
    };
    for _ in 0..3 {
        ours();
        torch.step()?;
    }
    let (mut k, mut p, mut wall, mut cpu) = (vec![], vec![], vec![], vec![]);
    for i in 0..pairs {
        let (a, b) = if i % 2 == 0 {
            let a = ours();
            (a, torch.step()?)
        } else {
            let b = torch.step()?;
            (ours(), b)
        };
        k.push(a.0);
        p.push(b.0);
        wall.push(a.0 / b.0);
        if let Some(c) = a.1 {
            cpu.push(c / b.1);
        }
    }
    let (min, max) = wall
        .iter()
        .fold((f64::INFINITY, 0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    Ok(VersusPyTorch {
        kappa_ms: Quartiles::of(k).median * 1e3,
        torch_ms: Quartiles::of(p).median * 1e3,
        wall: Quartiles::of(wall),
        cpu: (cpu.len() == pairs && pairs > 0).then(|| Quartiles::of(cpu)),
        min,
        max,
        pairs,
    })
}

/// The GPTs of the kappa-vs-PyTorch comparison: nanoGPT-style sizes with biases (a
/// 4 layers × 4 heads × 256 wide, context 128, batch 8, and the CPU preset at the bench's batch).
fn versus_models() -> [(&'static str, GptConfig, i64); 2] {
    let wide = GptConfig {
        block_size: 128,
        n_layer: 4,
        n_head: 4,
        n_embd: 256,
        bias: true,
        ..GptConfig::cpu(98)
    };
    let preset = GptConfig {
        bias: true,
        ..GptConfig::cpu(98)
    };
    [
        ("4×4×256, T=128, B=8", wide, 8),
        ("cpu preset 2×4×64, T=64, B=32", preset, GPT_BATCH),
    ]
}

/// The GPT training step of kappa against PyTorch eager, alternating single steps in one run,
/// at 1 and 2 libtorch threads (set in this process with `tch::set_num_threads`; the PyTorch
/// child gets the same count).
fn gpt_versus_pytorch(pairs: usize) {
    println!("\nGPT training step, kappa / PyTorch eager, {pairs} alternating pairs (goal ≤ 0.95)");
    println!("| model | threads | kappa ms | PyTorch ms | wall ratio, median (IQR) | min–max | CPU-time ratio, median (IQR) |");
    println!("|---|---|---|---|---|---|---|");
    let mut precisions = vec![TrainPrecision::F32];
    if native_bf16(Device::Cpu) {
        precisions.push(TrainPrecision::Bf16);
    } else {
        println!("(no bf16 rows: this CPU has no native bf16, avx512_bf16 or amx_bf16)");
    }
    let restore = tch::get_num_threads();
    let mut rows = Vec::new();
    for threads in [1usize, 2] {
        tch::set_num_threads(threads as i32);
        for (label, cfg, batch) in versus_models() {
            for &precision in &precisions {
                let variant = match precision {
                    TrainPrecision::F32 => "f32",
                    TrainPrecision::Bf16 => "bf16 autocast",
                };
                let run = VersusRun {
                    cfg,
                    batch,
                    threads,
                    precision,
                };
                if let Some(r) = versus_row(&format!("{label}, {variant}"), &run, pairs) {
                    rows.push(versus_record_row(label, variant, &run, &r));
                }
            }
        }
    }
    tch::set_num_threads(restore);
    record::Paired {
        bench: "models",
        name: "gpt_vs_eager",
        title: "GPT training step against PyTorch eager".into(),
        what: "kappa's GPT training step (the `Trainer`'s: fused AdamW, gradient clipping) \
               against the same model's step in PyTorch eager in a child process, single steps \
               alternated, f32 and bf16 autocast."
            .into(),
        peer: "PyTorch eager".into(),
        spread: "min–max over pairs",
        model: "forward and backward ≈ 3 × the forward's flops, 3 · flops_per_token(T) · B·T \
                (`GptConfig::flops_per_token`: the matrix products and attention scores)"
            .into(),
        rows,
    }
    .write();
}

/// One GPT of the kappa-vs-PyTorch table, as run.
struct VersusRun {
    cfg: GptConfig,
    batch: i64,
    threads: usize,
    precision: TrainPrecision,
}

/// The record row of one kappa-vs-PyTorch result.
fn versus_record_row(
    label: &str,
    variant: &str,
    run: &VersusRun,
    r: &VersusPyTorch,
) -> record::Row {
    let t = run.cfg.block_size;
    let flops = 3.0 * run.cfg.flops_per_token(t) * (run.batch as usize * t) as f64;
    let bound = match run.precision {
        TrainPrecision::F32 => record::Bound::GemmF32,
        TrainPrecision::Bf16 => record::Bound::GemmBf16,
    };
    record::Row {
        parameter: label.to_string(),
        variant: variant.to_string(),
        threads: run.threads,
        kappa_s: Some(r.kappa_ms * 1e-3),
        peer_s: Some(r.torch_ms * 1e-3),
        ratio: record::Ratio {
            median: r.wall.median,
            lo: r.min,
            hi: r.max,
            pairs: r.pairs,
        },
        work: Some(record::Work {
            bound,
            amount: flops,
        }),
    }
}

/// One row of the kappa-vs-PyTorch table, printed; the result where the reference ran.
fn versus_row(label: &str, run: &VersusRun, pairs: usize) -> Option<VersusPyTorch> {
    let VersusRun {
        cfg,
        batch,
        threads,
        precision,
    } = *run;
    let config = serde_json::to_string(&cfg).unwrap_or_default();
    let result =
        ReferenceServer::start("gpt", &config, batch, threads, precision).and_then(|mut torch| {
            versus_pytorch(gpt_step_of(cfg, batch, precision), &mut torch, pairs)
        });
    match result {
        Ok(r) => {
            println!(
                "| {label} | {threads} | {:.2} | {:.2} | {} | {:.3}–{:.3} | {} |",
                r.kappa_ms,
                r.torch_ms,
                r.wall,
                r.min,
                r.max,
                r.cpu.map_or(NOT_RUN.to_string(), |q| q.to_string()),
            );
            Some(r)
        }
        Err(e) => {
            println!("| {label} | {threads} | {NOT_RUN} | {NOT_RUN} | reference failed: {e} | | |");
            None
        }
    }
}

/// The conditioned-against-baseline record (`kappa_benches::record`), rows still to come.
fn conditioned_record() -> record::Paired {
    record::Paired {
        bench: "models",
        name: "conditioned_vs_baseline",
        title: "Conditioned training step against the baseline step".into(),
        what: "A step of the CPU GPT and ViT with conditioned attention against the same \
               model's baseline step, single steps alternated (control: a second baseline \
               model; λ = 0.001 conditions without collapsing attention). Here \"kappa\" is the \
               conditioned step and the peer the baseline."
            .into(),
        peer: "baseline step".into(),
        spread: "interquartile range over pairs",
        model: String::new(),
        rows: Vec::new(),
    }
}

fn main() {
    let threads = configure_threads();
    let versus_pairs: usize = std::env::var("KAPPA_BENCH_VERSUS_PAIRS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    if std::env::var_os("KAPPA_BENCH_VERSUS_ONLY").is_some() {
        gpt_versus_pytorch(versus_pairs);
        return;
    }
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
        let mut record = conditioned_record();
        for (label, lambda) in rows {
            for (name, (wall, cpu)) in [
                ("gpt", paired_ratio(gpt_step(0.0), gpt_step(lambda), pairs)),
                ("vit", paired_ratio(vit_step(0.0), vit_step(lambda), pairs)),
            ] {
                record.rows.push(record::Row {
                    parameter: name.to_string(),
                    variant: label.to_string(),
                    threads,
                    kappa_s: None,
                    peer_s: None,
                    ratio: record::Ratio {
                        median: wall.median,
                        lo: wall.q1,
                        hi: wall.q3,
                        pairs,
                    },
                    work: None,
                });
                let cpu = cpu.map_or(NOT_RUN.to_string(), |q| q.to_string());
                println!("| {name} | {label} | {wall} | {cpu} |");
            }
        }
        record.write();
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
                ours.map_or(NOT_RUN.into(), |s| format!("{:.0}", units / s)),
                ours.map_or(NOT_RUN.into(), |s| format!("{:.2}", flops / s / 1e9)),
                ours.map_or(NOT_RUN.into(), |s| format!("{:.3}", flops / s / peak)),
            );
        }
    }
    if versus_pairs > 0 {
        gpt_versus_pytorch(versus_pairs);
    }
}
