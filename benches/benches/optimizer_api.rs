//! Benchmarks of kappa-optim's optimizer API (`kappa_optim::optimizer`, on `tch`, CPU f32
//! parameters): what `Optimizer::step` costs over the calls it makes, what batching a split
//! QKV weight's head blocks buys, and the whole-model step against PyTorch's optimizers.
//!
//! The model is a GPT-2-shaped parameter set (`kappa_benches::gpt2`): GPT-2 small (12 blocks ×
//! 768: per block c_attn (2304, 768), attn c_proj (768, 768), c_fc (3072, 768), mlp c_proj
//! (768, 3072), two layer norms' gains and biases, the linears' biases; wte (50257, 768), wpe
//! (1024, 768)), or with `KAPPA_BENCH_QUICK=1` a 2 × 192 stand-in for smoke runs. Every parameter
//! gets a seeded gradient once; each step reads it and leaves it defined, so every step of
//! either side does the same work. kappa's side is grouped by
//! `Grouping::muon_adamw(MuonConfig::keller(), AdamWConfig::torch(), 3e-4)`: Muon (lr 0.02) on
//! the 48 hidden matrices, AdamW with weight decay on wte and wpe, AdamW without on the rank-1
//! parameters.
//!
//! Every figure is a ratio measured in one run with its two sides alternating: A first in even
//! pairs, B first in odd ones (`kappa_benches::paired`); printed as the median per-pair ratio
//! [min–max] with each side's median time. The heading names the CPU (`paired::cpu_model`), the
//! thread count and the path libtorch's MKL takes in this process.
//!
//! 1. **The API's own cost** (goal ≤ 1.02), at `Precision::F32` and `Precision::Auto`: one
//!    `Optimizer::step()` over the model against the calls it makes, made directly on the same
//!    parameter and gradient tensors with states of their own — `Muon::step_batch` once per shape
//!    (the group batches same-shape blocks: 4 calls of 12 matrices) and `AdamW::step_tensors` once
//!    per AdamW group (the fused kernel, a group's default), in the group order. The groups step on
//!    the calling thread (`Group::with_threads(1)`), as the direct calls do; what worker threads
//!    add is in 3. The optimizer's step also checks every gradient (size, kind, device, and one
//!    pass for finiteness); that pass alone (`kappa_optim::fused::all_finite` per gradient, as the
//!    check runs it) is timed too and printed beside the ratio, and so is each group's mean time
//!    per step on either side (the API's from `Optimizer::take_stats`, which leaves the check out).
//!    Each side runs twice first (a warm call, then one timed to size the samples); each sample is
//!    the mean of as many steps as last ≥ 50 ms (one at GPT-2 small, where a step takes seconds).
//!    Both sides run on the same thread pools, so no pause separates them.
//! 2. **Split orthogonalization** (goal ≥ 3 at one thread), f32 and Auto: the QKV weight (3d, d)
//!    seen through `MatrixSpec::matrix().split(Axis::Rows, [d, d, d]).heads(Axis::Rows, h)` in a
//!    one-group `Optimizer` on the calling thread (`with_threads(1)`: one batched Newton–Schulz
//!    call for all 3h head blocks) against one `Muon::step` per head block (3h calls on row views
//!    of the same weight and gradient, each block with its own state). Samples as in 1; at two
//!    threads each timed sample follows a 200 ms pause and one untimed call
//!    (`paired::alternate_settled`: the calls are short, and the rayon and OpenMP pools may both be
//!    awake). The ratio is per-block time / batched time.
//! 3. **Against PyTorch** (goal ≤ 0.8): kappa's `Optimizer::step` (as in 1, with its groups as
//!    built by default: at two threads each Muon batch is split over two workers of one libtorch
//!    thread each, `Group::with_threads`) against `torch.optim.Muon` on the hidden matrices plus
//!    `torch.optim.AdamW` on the rest, with the same split and settings
//!    (`benches/reference/optimizer_torch_peer.py`, a child process stepping on command; its step
//!    time is measured in Python), one step per sample after one warm step each (the reference's
//!    setup takes one more). torch's AdamW runs as torch ships it: `foreach=None, fused=None`,
//!    which on CPU tensors is its per-tensor for-loop (the script reports what torch chose, printed
//!    in the row). Cells: `f32` — kappa `Precision::F32`, the reference's Newton–Schulz swapped for
//!    the same quintic in f32 (as `muon_torch.py` does); `bf16` — kappa `Precision::Auto` (bf16 on
//!    CPUs with native bf16 products, which the heading says) against `torch.optim.Muon` as shipped
//!    (its Newton–Schulz in bf16), run only where the CPU multiplies bf16 natively (emulated bf16
//!    is 20–40× slower on both sides); `f32-mkl` (and `bf16-mkl` on request) — the same cells like
//!    for like, described next. At two threads each timed step follows a 200 ms pause (the other
//!    process's OpenMP workers go to sleep); there is no untimed wake-up step, as a step lasts far
//!    longer than the wake-up.
//!
//! **Like for like.** kappa's bench binaries answer MKL's vendor check themselves
//! (`kappa_linalg::mkl_intel_path!()` at the top of this file, exported by `benches/build.rs`):
//! libtorch's MKL then picks its kernels by the CPU's features — AVX-512 on AMD CPUs that have
//! it — where stock PyTorch on an AMD CPU runs MKL's AVX2 kernels (docs/architecture.md,
//! "libtorch's MKL on AMD CPUs"). The `-mkl` cells give the reference the same kernels the way a
//! PyTorch user can (the same section): a one-line library,
//! `int mkl_serv_intel_cpu_true(void) { return 1; }`, preloaded into the Python process
//! (`LD_PRELOAD`, set on the child after `peer::reference_command` clears it), which answers
//! the check first because `libtorch_cpu.so` calls it through its procedure linkage table. The
//! bench compiles the library with the system's C compiler (`$CC`, else `cc`) into a temporary
//! folder it removes afterwards, or takes a prebuilt one from `KAPPA_BENCH_MKL_SHIM`; the
//! script reports the answer MKL gets (`mkl_answer=1`), and a cell whose reference did not get
//! it is not run. The other way to compare like for like is the opposite one:
//! `KAPPA_MKL_VENDOR_CHECK=keep` puts kappa's side back on MKL's own choice, so the plain cells
//! then compare equal kernels. On Intel CPUs the two kinds of cell run the same kernels.
//!
//! **The allocator's state.** libtorch allocates through glibc's `malloc`, which returns freed
//! buffers of a few MiB to the kernel (they fault in again, page by page, when reused) until the
//! process has freed one block of 32 MiB or more, and keeps them mapped from then on (it raises
//! its thresholds itself). Which state a part measures in would depend on the parts that ran
//! before it: the split step, whose batch buffers are 3.5–7 MiB, ran markedly slower as the
//! first part than after part 1. The bench sets the later state at its start
//! (`kappa_benches::warm_allocator`, and the same thresholds for the reference through glibc's
//! `MALLOC_*_THRESHOLD_` variables): the state of any process that trains a model with a
//! 32 MiB tensor, GPT-2 small's embedding included.
//!
//! Run (nothing else should run on the machine meanwhile; at GPT-2 small one f32 step takes
//! seconds, so a full run takes several minutes per thread count):
//!
//! ```text
//! cargo xtask bench --threads 1,2 --bench optimizer_api
//! KAPPA_BENCH_THREADS=1 cargo bench -p kappa-benches --bench optimizer_api
//! ```
//!
//! Settings (environment):
//!
//! * `KAPPA_BENCH_THREADS` — 1 or 2 (libtorch, OpenBLAS and rayon; the reference too).
//! * `KAPPA_BENCH_QUICK=1` — the 2 × 192 model (smoke runs).
//! * `KAPPA_BENCH_PARTS` — a comma-separated subset of `api,split,torch` (default all three).
//! * `KAPPA_BENCH_PAIRS` — pairs per row of parts 1 and 3 (default 5).
//! * `KAPPA_BENCH_SPLIT_PAIRS` — pairs per row of part 2 (default 11).
//! * `KAPPA_BENCH_TORCH_CELLS` — a comma-separated subset of `f32,bf16,f32-mkl,bf16-mkl`
//!   (default `f32,bf16,f32-mkl`).
//! * `KAPPA_BENCH_MKL_SHIM` — a prebuilt library answering MKL's vendor check (else built).
//! * `KAPPA_PYTHON` or `KAPPA_VENV` — the Python with torch (`kappa_benches::peer::python`).

// libtorch's MKL chooses kernels by CPU features, as in kappa's binaries (build.rs).
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

// Rust's allocations on mimalloc, which keeps freed pages for reuse (glibc returns N×N
// temporaries to the kernel; docs/architecture.md, "The memory allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use kappa_benches::configure_threads;
use kappa_benches::gpt2::{leaf_with_grad, var_store_with_grads, Gpt2Shape};
use kappa_benches::paired::{cpu_model, ratios, seconds, Spread};
use kappa_benches::peer::{reference_command, Peer};
use kappa_benches::record::{self, Ratio, Row};
use kappa_optim::optimizer::{Axis, Group, Grouping, MatrixSpec, Optimizer, Update};
use kappa_optim::{
    AdamW, AdamWConfig, AdamWKernel, AdamWState, Muon, MuonConfig, MuonState, Precision,
    WorkingPrecision,
};
use tch::{Device, Kind, Tensor};

/// AdamW's peak rate on both sides (Muon's is `MuonConfig::keller()`'s 0.02).
const ADAMW_LR: f64 = 3e-4;
/// The shortest timed sample of parts 1 and 2: each side repeats its call until a sample lasts about
/// this long.
const SAMPLE_SECONDS: f64 = 0.05;
/// The pause before each timed sample at more than one thread.
const SETTLE: Duration = Duration::from_millis(200);
/// The parts `KAPPA_BENCH_PARTS` chooses from (all by default).
const PARTS: &str = "api,split,torch";
const PRECISIONS: [(&str, Precision); 2] = [("f32", Precision::F32), ("auto", Precision::Auto)];

fn env_flag(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// `var` as a count ≥ 1, else `default`.
fn env_count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .max(1)
}

/// Whether the comma-separated list in `var` names `item` (unset: whether `default` does).
fn listed(var: &str, default: &str, item: &str) -> bool {
    let list = std::env::var(var).unwrap_or_else(|_| default.to_string());
    list.split(',').any(|l| l.trim() == item)
}

fn model() -> Gpt2Shape {
    if env_flag("KAPPA_BENCH_QUICK") {
        Gpt2Shape::QUICK
    } else {
        Gpt2Shape::SMALL
    }
}

fn keller(precision: Precision) -> MuonConfig {
    MuonConfig {
        precision,
        ..MuonConfig::keller()
    }
}

/// kappa's optimizer over the var store's parameters (module docs), its groups on `threads`
/// workers when given (else libtorch's count, the default).
fn gpt2_optimizer(
    vs: &tch::nn::VarStore,
    precision: Precision,
    threads: Option<usize>,
) -> Optimizer {
    let groups = Grouping::muon_adamw(keller(precision), AdamWConfig::torch(), ADAMW_LR)
        .assign(vs.variables())
        .expect("the GPT-2 groups");
    let groups = match threads {
        Some(n) => groups.into_iter().map(|g| g.with_threads(n)).collect(),
        None => groups,
    };
    Optimizer::new(groups).expect("the GPT-2 optimizer")
}

/// The pause of `alternate_settled` at more than one thread.
fn settle() -> Option<Duration> {
    (tch::get_num_threads() > 1).then_some(SETTLE)
}

fn main() {
    let threads = configure_threads();
    kappa_benches::warm_allocator();
    let shape = model();
    let auto = Tensor::zeros([shape.width, shape.width], (Kind::Float, Device::Cpu))
        .working_name(Precision::Auto)
        .unwrap_or("?");
    println!(
        "\nkappa-optim's optimizer API, {threads} thread(s), {}; {}; Precision::Auto resolves to \
         {auto} for a {w}×{w} matrix here (native bf16 products: {}).\nModel: GPT-2-shaped, {}.",
        cpu_model(),
        mkl_path(),
        kappa_optim::cpu_has_native_bf16(),
        shape.describe(),
        w = shape.width,
    );
    if listed("KAPPA_BENCH_PARTS", PARTS, "api") {
        print_api_cost(&shape);
    }
    if listed("KAPPA_BENCH_PARTS", PARTS, "split") {
        print_split(&shape);
    }
    if listed("KAPPA_BENCH_PARTS", PARTS, "torch") {
        print_versus_torch(threads, &shape);
    }
}

/// The code path libtorch's MKL takes in this process.
fn mkl_path() -> String {
    #[cfg(target_os = "linux")]
    return kappa_linalg::mkl::mkl_dispatch().to_string();
    #[cfg(not(target_os = "linux"))]
    return "libtorch MKL: not checked".to_string();
}

// ---------------------------------------------------------------------------------------------
// 1. The API's own cost.

/// The calls `Optimizer::step` makes for one group, made directly (module docs, 1): on the
/// group's own parameter tensors (detached: the same storage) and gradients, with states of
/// their own; and the seconds they took.
struct RawGroup {
    calls: RawCalls,
    seconds: f64,
    steps: u64,
}

enum RawCalls {
    /// One `Muon::step_batch` per shape, in order of first appearance (the group's batches).
    Muon { muon: Muon, batches: Vec<RawBatch> },
    /// One `AdamW::step_tensors` over the group.
    AdamW {
        adamw: AdamW,
        lr: f64,
        params: Vec<Tensor>,
        grads: Vec<Tensor>,
        states: Vec<AdamWState<Tensor>>,
    },
}

/// Same-shape matrices stepped by one `Muon::step_batch`.
struct RawBatch {
    ws: Vec<Tensor>,
    grads: Vec<Tensor>,
    states: Vec<MuonState<Tensor>>,
}

impl RawGroup {
    fn of(group: &Group) -> Self {
        let params: Vec<Tensor> = group.params().iter().map(Tensor::detach).collect();
        let grads: Vec<Tensor> = group.params().iter().map(Tensor::grad).collect();
        let calls = match *group.update() {
            Update::Muon(c) => RawCalls::Muon {
                muon: Muon::new(MuonConfig {
                    lr: group.lr(),
                    ..c
                })
                .expect("muon"),
                batches: same_shape_batches(params, grads),
            },
            Update::AdamW(c) => RawCalls::AdamW {
                adamw: AdamW::new(c).expect("adamw"),
                lr: group.lr(),
                states: params.iter().map(|_| AdamWState::new()).collect(),
                params,
                grads,
            },
            Update::Manifold(_) => panic!("Grouping::muon_adamw makes no manifold group"),
        };
        Self {
            calls,
            seconds: 0.0,
            steps: 0,
        }
    }

    fn step(&mut self) {
        let started = Instant::now();
        match &mut self.calls {
            RawCalls::Muon { muon, batches } => {
                for b in batches {
                    muon.step_batch(&mut b.ws, &b.grads, &mut b.states)
                        .expect("step_batch");
                }
            }
            RawCalls::AdamW {
                adamw,
                lr,
                params,
                grads,
                states,
            } => adamw
                .step_tensors(params, grads, states, *lr, AdamWKernel::default())
                .expect("step_tensors"),
        }
        self.seconds += started.elapsed().as_secs_f64();
        self.steps += 1;
    }
}

/// `ws` and their gradients in batches of one shape each, in order of first appearance.
fn same_shape_batches(ws: Vec<Tensor>, grads: Vec<Tensor>) -> Vec<RawBatch> {
    let mut out: Vec<RawBatch> = Vec::new();
    for (w, g) in ws.into_iter().zip(grads) {
        let batch = match out.iter_mut().position(|b| b.ws[0].size() == w.size()) {
            Some(i) => &mut out[i],
            None => {
                out.push(RawBatch {
                    ws: Vec::new(),
                    grads: Vec::new(),
                    states: Vec::new(),
                });
                out.last_mut().expect("just pushed")
            }
        };
        batch.ws.push(w);
        batch.grads.push(g);
        batch.states.push(MuonState::new());
    }
    out
}

/// One pass over every gradient as `Optimizer::step`'s finiteness check makes it (one
/// `all_finite` per gradient): the median seconds of three.
fn finiteness_pass_seconds(opt: &Optimizer) -> f64 {
    let grads: Vec<Tensor> = opt.params().map(|(_, p)| p.grad()).collect();
    let mut pass = || {
        for g in &grads {
            let _ = kappa_optim::fused::all_finite(std::slice::from_ref(g));
        }
    };
    Spread::of((0..3).map(|_| seconds(&mut pass)).collect()).median
}

/// Each group's mean milliseconds per step, through the API (the group's own step, without the
/// gradient check) and direct, over every step each side has taken: "name api / direct".
fn per_group(opt: &mut Optimizer, steps: u64, raw: &[RawGroup]) -> String {
    let per_step = |s: f64, n: u64| 1e3 * s / n.max(1) as f64;
    opt.take_stats()
        .iter()
        .zip(raw)
        .map(|((name, stats), r)| {
            let (api, direct) = (per_step(stats.seconds, steps), per_step(r.seconds, r.steps));
            format!("{name} {api:.2} / {direct:.2}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_api_cost(shape: &Gpt2Shape) {
    let pairs = env_count("KAPPA_BENCH_PAIRS", 5);
    println!(
        "\n1. The API's own cost: Optimizer::step / the calls it makes (Muon::step_batch per \
         shape, AdamW::step_tensors per group) on the same tensors, {pairs} pairs; goal ≤ 1.02"
    );
    let mut rows = Vec::new();
    for (pname, precision) in PRECISIONS {
        let vs = var_store_with_grads(shape, 1);
        let mut opt = gpt2_optimizer(&vs, precision, Some(1));
        let mut raw: Vec<RawGroup> = opt.groups().iter().map(RawGroup::of).collect();
        let check = finiteness_pass_seconds(&opt);
        // One step of each side first, its time left out of the per-group means: it creates the
        // optimizer states (first-touch of their memory).
        opt.step().expect("Optimizer::step");
        raw.iter_mut().for_each(RawGroup::step);
        let _ = opt.take_stats();
        raw.iter_mut().for_each(|r| (r.seconds, r.steps) = (0.0, 0));
        let warm = opt.steps();
        let mut api = || opt.step().expect("Optimizer::step");
        let mut direct = || raw.iter_mut().for_each(RawGroup::step);
        let [ratio, a, b] = paired_calls(&mut api, &mut direct, pairs, None);
        let steps = opt.steps() - warm;
        println!(
            "{pname:<5} Optimizer::step {:>10.2} ms, direct calls {:>10.2} ms, ratio {ratio}; \
             the finiteness pass alone {:.2} ms ({:.2} % of the direct step)\n      \
             per group, mean ms per step (API / direct): {}",
            a.median * 1e3,
            b.median * 1e3,
            check * 1e3,
            100.0 * check / b.median,
            per_group(&mut opt, steps, &raw),
        );
        rows.push(row(shape, pname, a, b, Ratio::of(ratio)));
    }
    record::Paired {
        bench: "optimizer_api",
        name: "api_cost",
        title: "The optimizer API's step against the calls it makes".into(),
        what: "One `Optimizer::step()` of Muon on GPT-2's hidden matrices plus AdamW on the rest \
               (`Grouping::muon_adamw`, CPU f32 parameters) against the per-matrix calls it makes \
               (`Muon::step_batch` per shape, `AdamW::step_tensors` per group) on the same \
               tensors, both on the calling thread (`Group::with_threads(1)`); the API adds the \
               gradient checks and the grouping. 1 is no cost."
            .into(),
        peer: "direct calls".into(),
        spread: "min–max over pairs",
        model: String::new(),
        rows,
    }
    .write();
}

/// A row of the model's name, `variant`, this run's threads, both sides' medians and `ratio`.
fn row(shape: &Gpt2Shape, variant: &str, kappa: Spread, peer: Spread, ratio: Ratio) -> Row {
    Row {
        parameter: model_name(shape),
        variant: variant.to_string(),
        threads: tch::get_num_threads() as usize,
        kappa_s: Some(kappa.median),
        peer_s: Some(peer.median),
        ratio,
        work: None,
    }
}

/// The model's short name on the published page.
fn model_name(shape: &Gpt2Shape) -> String {
    match *shape == Gpt2Shape::SMALL {
        true => "GPT-2 small".into(),
        false => format!("{} × {} (quick)", shape.layers, shape.width),
    }
}

/// `a` and `b` alternated in `pairs` pairs after each ran twice (a warm call, then one timed to
/// size the samples), each sample the mean of as many calls as fill [`SAMPLE_SECONDS`], with a
/// pause and an untimed call before each timed sample when `settle` is given
/// ([`alternate_settled`]): the per-pair ratio a/b and each side's seconds per call.
fn paired_calls(
    a: &mut dyn FnMut(),
    b: &mut dyn FnMut(),
    pairs: usize,
    settle: Option<Duration>,
) -> [Spread; 3] {
    kappa_benches::paired::per_call(a, b, 0, pairs, settle, SAMPLE_SECONDS)
}

// ---------------------------------------------------------------------------------------------
// 2. Split orthogonalization.

/// The QKV weight of `shape` stepped per head block (A) and batched through a group (B).
fn split_row(shape: &Gpt2Shape, precision: Precision, pairs: usize) -> [Spread; 3] {
    let (d, h) = (shape.width, shape.heads);
    let spec = MatrixSpec::matrix()
        .split(Axis::Rows, [d as usize; 3])
        .heads(Axis::Rows, h as usize);
    let p = leaf_with_grad(&[3 * d, d], 7);
    let group = Group::muon("qkv", keller(precision))
        .with_matrix(spec)
        .with_threads(1)
        .with_param("h.0.attn.c_attn.weight", p.shallow_clone());
    let mut opt = Optimizer::new(vec![group]).expect("the QKV optimizer");
    let muon = Muon::new(keller(precision)).expect("muon");
    let (rows, blocks) = (d / h, 3 * h);
    let (w, g) = (p.detach(), p.grad());
    let mut ws: Vec<Tensor> = (0..blocks).map(|i| w.narrow(0, i * rows, rows)).collect();
    let gs: Vec<Tensor> = (0..blocks).map(|i| g.narrow(0, i * rows, rows)).collect();
    let mut states: Vec<MuonState<Tensor>> = gs.iter().map(|_| MuonState::new()).collect();
    let mut per_block = || {
        for ((w, g), s) in ws.iter_mut().zip(&gs).zip(&mut states) {
            muon.step(w, g, s).expect("Muon::step");
        }
    };
    let mut batched = || opt.step().expect("Optimizer::step");
    paired_calls(&mut per_block, &mut batched, pairs, settle())
}

fn print_split(shape: &Gpt2Shape) {
    let pairs = env_count("KAPPA_BENCH_SPLIT_PAIRS", 11);
    let (d, h) = (shape.width, shape.heads);
    println!(
        "\n2. Split orthogonalization: QKV ({}×{d}) as split [{d}, {d}, {d}] × {h} heads ({} \
         blocks of {}×{d}): one Muon::step per block / one Optimizer::step (batched), {pairs} \
         pairs; goal ≥ 3 at one thread",
        3 * d,
        3 * h,
        d / h
    );
    let mut rows = Vec::new();
    for (pname, precision) in PRECISIONS {
        let [speedup, per, bat] = split_row(shape, precision, pairs);
        println!(
            "{pname:<5} per block {:>9.3} ms, batched {:>9.3} ms, speed-up {speedup}",
            per.median * 1e3,
            bat.median * 1e3,
        );
        let mut r = row(shape, pname, bat, per, Ratio::inverse_of(speedup));
        r.parameter = format!("QKV {}×{d}, {} blocks of {}×{d}", 3 * d, 3 * h, d / h);
        // Keller's five Newton–Schulz steps per block; `auto`'s working type depends on the
        // CPU, so only the f32 row is held against a GEMM bound.
        let flops =
            5.0 * (3 * h) as f64 * kappa_benches::ns_step_flops((d / h) as usize, d as usize);
        r.work = (precision == Precision::F32).then_some(record::Work {
            bound: record::Bound::GemmF32,
            amount: flops,
        });
        rows.push(r);
    }
    record::Paired {
        bench: "optimizer_api",
        name: "split_heads",
        title: "Split orthogonalization: a QKV weight's head blocks batched against one call each"
            .into(),
        what: "Muon on a fused QKV weight seen as 3 × heads row blocks \
               (`MatrixSpec::matrix().split(..).heads(..)`: one batched Newton–Schulz call \
               through `Optimizer::step` on the calling thread) against one `Muon::step` per \
               block on row views of the same weight. The blocks' arithmetic is the same either \
               way, so what batching can save is the per-call overhead and the small products' \
               lower GEMM throughput."
            .into(),
        peer: "one call per block".into(),
        spread: "min–max over pairs",
        model: "Keller's five quintic Newton–Schulz steps on each r×s block, 5·(4r²s + 2r³) \
                flops a block (the f32 rows only: `auto`'s working type depends on the CPU)"
            .into(),
        rows,
    }
    .write();
}

// ---------------------------------------------------------------------------------------------
// 3. Against PyTorch.

/// One cell of the table against PyTorch.
struct TorchCell {
    /// Its name in `KAPPA_BENCH_TORCH_CELLS`.
    id: &'static str,
    /// kappa's precision.
    kappa: Precision,
    /// The reference's Newton–Schulz: "f32" or "bf16" (as shipped).
    torch: &'static str,
    /// The reference on the MKL kernels kappa's binaries take (module docs, "Like for like").
    same_mkl: bool,
}

const CELLS: [TorchCell; 4] = [
    TorchCell {
        id: "f32",
        kappa: Precision::F32,
        torch: "f32",
        same_mkl: false,
    },
    TorchCell {
        id: "bf16",
        kappa: Precision::Auto,
        torch: "bf16",
        same_mkl: false,
    },
    TorchCell {
        id: "f32-mkl",
        kappa: Precision::F32,
        torch: "f32",
        same_mkl: true,
    },
    TorchCell {
        id: "bf16-mkl",
        kappa: Precision::Auto,
        torch: "bf16",
        same_mkl: true,
    },
];

/// A library answering MKL's vendor check "Intel" (module docs, "Like for like"): prebuilt
/// (`KAPPA_BENCH_MKL_SHIM`) or compiled into a temporary folder that is removed on drop.
struct VendorShim {
    library: PathBuf,
    temp: Option<PathBuf>,
}

impl VendorShim {
    fn get() -> Result<Self, String> {
        if let Some(lib) = std::env::var_os("KAPPA_BENCH_MKL_SHIM") {
            return Ok(Self {
                library: PathBuf::from(lib),
                temp: None,
            });
        }
        let dir = std::env::temp_dir().join(format!("kappa-mkl-shim-{}", std::process::id()));
        let shim = Self {
            library: dir.join("libkappa_mkl_intel.so"),
            temp: Some(dir.clone()),
        };
        let source = dir.join("mkl_intel.c");
        std::fs::create_dir_all(&dir)
            .and_then(|_| {
                std::fs::write(&source, "int mkl_serv_intel_cpu_true(void) { return 1; }\n")
            })
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
        let status = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&shim.library)
            .arg(&source)
            .status()
            .map_err(|e| format!("{cc:?} (set KAPPA_BENCH_MKL_SHIM or CC): {e}"))?;
        match status.success() {
            true => Ok(shim),
            false => Err(format!("{cc:?} failed to build the vendor-check library")),
        }
    }
}

impl Drop for VendorShim {
    fn drop(&mut self) {
        if let Some(dir) = &self.temp {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The reference process, with `shim` preloaded when given; checks its ready line and returns
/// the peer with that line's details (torch version, MKL's answers).
fn start_reference(threads: usize, shim: Option<&VendorShim>) -> Result<(Peer, String), String> {
    let mut cmd = reference_command("optimizer_torch_peer.py", threads);
    kappa_benches::warm_allocator_for(&mut cmd);
    cmd.arg(threads.to_string());
    if let Some(shim) = shim {
        cmd.env("LD_PRELOAD", &shim.library);
    }
    let (peer, ready) = Peer::start(cmd)?;
    let Some(details) = ready.strip_prefix("ready ") else {
        return Err(format!("expected a `ready` line, got {ready:?}"));
    };
    if shim.is_some() && !details.contains("mkl_answer=1") {
        return Err(format!(
            "the preloaded library did not answer for MKL ({details})"
        ));
    }
    Ok((peer, details.to_string()))
}

/// One cell's measurement: each side's seconds and the per-pair ratio kappa / torch, with the
/// AdamW implementation torch chose.
struct Versus {
    kappa: Spread,
    torch: Spread,
    ratio: Spread,
    adamw: String,
}

/// The setup of `cell` on both sides: the reference's reply checked against `shape`
/// (parameter count), kappa's var store and optimizer.
fn setup_cell(
    peer: &mut Peer,
    cell: &TorchCell,
    shape: &Gpt2Shape,
) -> Result<(tch::nn::VarStore, Optimizer, String), String> {
    let Gpt2Shape {
        width,
        layers,
        vocab,
        context,
        ..
    } = *shape;
    let lr = MuonConfig::keller().lr;
    let request = format!(
        "setup {width} {layers} {vocab} {context} {} {lr} {ADAMW_LR}",
        cell.torch
    );
    let reply = peer.ask(&request)?;
    let words: Vec<&str> = reply.split_whitespace().collect();
    let &[count, _, adamw] = words.as_slice() else {
        return Err(format!("unexpected reply {reply:?} to {request:?}"));
    };
    if count.parse::<i64>().ok() != Some(shape.numel()) {
        return Err(format!(
            "the reference holds {count} parameters, kappa {}",
            shape.numel()
        ));
    }
    let vs = var_store_with_grads(shape, 1);
    let opt = gpt2_optimizer(&vs, cell.kappa, None);
    Ok((vs, opt, adamw.to_string()))
}

/// kappa's step against the reference's, alternated (kappa first in even pairs) after one warm
/// pair (the reference's setup took one step already).
fn versus_cell(
    peer: &mut Peer,
    cell: &TorchCell,
    shape: &Gpt2Shape,
    pairs: usize,
) -> Result<Versus, String> {
    let (_vs, mut opt, adamw) = setup_cell(peer, cell, shape)?;
    let pause = || settle().into_iter().for_each(std::thread::sleep);
    let mut kappa = || -> Result<f64, String> {
        pause();
        Ok(seconds(&mut || opt.step().expect("Optimizer::step")))
    };
    let mut torch = || -> Result<f64, String> {
        pause();
        let reply = peer.ask_numbers("step")?;
        reply
            .first()
            .copied()
            .ok_or_else(|| "an empty reply".into())
    };
    kappa()?;
    torch()?;
    let (mut tk, mut tt) = (Vec::with_capacity(pairs), Vec::with_capacity(pairs));
    for i in 0..pairs {
        if i % 2 == 0 {
            tk.push(kappa()?);
            tt.push(torch()?);
        } else {
            tt.push(torch()?);
            tk.push(kappa()?);
        }
    }
    Ok(Versus {
        ratio: Spread::of(ratios(&tk, &tt)),
        kappa: Spread::of(tk),
        torch: Spread::of(tt),
        adamw,
    })
}

/// The cells this run measures (`KAPPA_BENCH_TORCH_CELLS`), bf16 ones only where the CPU has
/// native bf16 products.
fn chosen_cells() -> Vec<&'static TorchCell> {
    let native = kappa_optim::cpu_has_native_bf16();
    if !native {
        println!("(bf16 cells skipped: this CPU has no native bf16 products)");
    }
    CELLS
        .iter()
        .filter(|c| listed("KAPPA_BENCH_TORCH_CELLS", "f32,bf16,f32-mkl", c.id))
        .filter(|c| native || c.torch != "bf16")
        .collect()
}

fn print_versus_torch(threads: usize, shape: &Gpt2Shape) {
    let pairs = env_count("KAPPA_BENCH_PAIRS", 5);
    println!(
        "\n3. kappa's Optimizer::step against torch.optim.Muon + torch.optim.AdamW (foreach=None, \
         fused=None), {pairs} pairs; kappa/torch the median per-pair ratio [min–max]; goal ≤ 0.8"
    );
    let cells = chosen_cells();
    let mut rows = Vec::new();
    for same_mkl in [false, true] {
        let group: Vec<&TorchCell> = cells
            .iter()
            .copied()
            .filter(|c| c.same_mkl == same_mkl)
            .collect();
        if group.is_empty() {
            continue;
        }
        let shim = match same_mkl.then(VendorShim::get).transpose() {
            Ok(s) => s,
            Err(e) => return println!("like-for-like cells not run: {e}"),
        };
        let (mut peer, details) = match start_reference(threads, shim.as_ref()) {
            Ok(p) => p,
            Err(e) => {
                println!(
                    "torch reference{} not run: {e}",
                    if same_mkl { " (like for like)" } else { "" }
                );
                continue;
            }
        };
        println!("reference: torch {details}");
        for cell in group {
            match versus_cell(&mut peer, cell, shape, pairs) {
                Ok(v) => {
                    println!(
                        "{:<9} kappa {:>10.2} ms, torch {:>10.2} ms, kappa/torch {} (torch AdamW: {})",
                        cell.id,
                        v.kappa.median * 1e3,
                        v.torch.median * 1e3,
                        v.ratio,
                        v.adamw,
                    );
                    rows.push(row(shape, cell.id, v.kappa, v.torch, Ratio::of(v.ratio)));
                }
                Err(e) => println!("{:<9} not run: {e}", cell.id),
            }
        }
    }
    record::Paired {
        bench: "optimizer_api",
        name: "optimizer_vs_torch",
        title: "The whole-model optimizer step against torch.optim.Muon + torch.optim.AdamW".into(),
        what: "kappa's `Optimizer::step()` (Muon on GPT-2's hidden matrices, AdamW on the rest; \
               groups as built by default, so at two threads each Muon batch is split over two \
               workers of one libtorch thread each) against `torch.optim.Muon` plus \
               `torch.optim.AdamW` (as shipped: `foreach=None, fused=None`) with the same split \
               and settings, in a child process. `f32`: both \
               orthogonalize in f32 (the reference's Newton–Schulz swapped for the same quintic \
               in f32); `bf16`: kappa's `Precision::Auto` against the reference as shipped (bf16 \
               Newton–Schulz), only on CPUs with native bf16 products; `-mkl`: the reference \
               with libtorch's MKL on the kernels kappa's binaries take (the vendor check \
               answered by a preloaded library), so that the ratio measures kappa, not MKL's \
               CPU dispatch."
            .into(),
        peer: "torch.optim.Muon + AdamW".into(),
        spread: "min–max over pairs",
        model: String::new(),
        rows,
    }
    .write();
}
