//! Benchmarks of kappa-attention: the exact weight Jacobian of one attention head (dense, and the
//! matrix-free VJP/JVP) against PyTorch, in f64.
//!
//! Run (both thread counts, one after the other, in one command):
//!
//! ```text
//! KAPPA_PYTHON=/path/to/venv/bin/python KAPPA_BENCH_THREADS=1,2 \
//!     cargo bench -p kappa-benches --bench attention
//! ```
//!
//! Settings (environment):
//!
//! * `KAPPA_BENCH_THREADS` — 1, 2 or `1,2` (each count in its own process, in turn; default 1).
//!   It sets OpenBLAS's and libtorch's threads, kappa's fill threads
//!   ([`kappa_attention::JacobianWorkspace::with_threads`]) and PyTorch's in the reference.
//! * `KAPPA_BENCH_ATTENTION_SHAPES` — `small` (N=64, D=64, k=16), `large` (N=197, D=192,
//!   k=64) or `all` (default).
//! * `KAPPA_BENCH_SECONDS` — criterion measurement time per function (default 5).
//! * `KAPPA_BENCH_CRITERION` — `0` skips the criterion part (the paired ratios still run).
//! * `KAPPA_BENCH_JAC_PAIRS` — alternating (kappa, jacrev) rounds per shape (default 5; a
//!   jacrev Jacobian at the large shape takes tens of seconds; 0 skips them).
//! * `KAPPA_PIN_THREADS` — `0` leaves kappa's rayon workers unpinned, `1` pins them (default:
//!   pinned when there is one per CPU, as in kappa's binaries;
//!   [`kappa_linalg::threads::init_global_pool`]).
//! * `KAPPA_BENCH_VJP_PAIRS` — alternating (kappa, autograd) VJP rounds (default 40, each of
//!   `KAPPA_BENCH_VJP_REPS` = 20 calls per side).
//! * `KAPPA_PYTHON` — the Python with torch that runs `benches/reference/jacobian_reference.py`
//!   (default: `$KAPPA_VENV/bin/python`, else the workspace's `.venv/bin/python`).
//!
//! Two parts. (1) Criterion timings of each function, and the largest difference between
//! kappa's Jacobian and the autograd one (rows by tch `run_backward`; goal ≤ 1e-10 relative to
//! max |J|). (2) The headline ratios, measured in alternating rounds so that both sides see the
//! same machine load, reported as the median and the min–max over rounds of the per-round
//! ratio:
//!
//! * Jacobian: seconds of `torch.func.jacrev` (the reference script, a child process) over
//!   kappa's, forward included on both sides; kappa "fresh" allocates its result each time
//!   ([`kappa_attention::JacobianWorkspace::take`] hands it out; goal ≥ 20×), "workspace"
//!   reuses it ([`kappa_attention::JacobianWorkspace::compute`]; goal ≥ 50×). Dropping kappa's
//!   fresh result and releasing jacrev's happen outside the timed regions.
//! * VJP: kappa's [`kappa_attention::Forward::vjp_weights`] from a cached forward pass over one
//!   tch autograd backward through a retained graph (goal ≤ 1.0), and forward + VJP over
//!   forward + backward.

// libtorch's MKL chooses kernels by CPU features, as in kappa's binaries (build.rs).
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

// Rust's allocations on mimalloc, which keeps freed pages for reuse (glibc returns N×N
// temporaries to the kernel; docs/architecture.md, "The memory allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{black_box, BenchmarkId, Criterion};
use kappa_attention::{AttentionOptions, JacobianWorkspace, ScoreScale, SelfAttention};
use kappa_benches::paired::Spread;
use kappa_benches::peer::{reference_command, Peer};
use kappa_benches::record;
use kappa_benches::{configure_threads, fmt_ms, fmt_ratio, gaussian, median_seconds};
use kappa_linalg::tch_backend::tensor_from_array;
use ndarray::Array2;
use tch::{Device, Kind, Tensor};

const GROUP: &str = "attention_jacobian_f64";
const SHAPES: [(&str, usize, usize, usize); 2] = [("small", 64, 64, 16), ("large", 197, 192, 64)];

struct Inputs {
    x: Array2<f64>,
    head: SelfAttention<f64>,
    g: Array2<f64>,
}

fn inputs(n: usize, d: usize, k: usize) -> Inputs {
    let x: Array2<f64> = gaussian(n, d, 11);
    let scale = 1.0 / (d as f64).sqrt();
    let w = |seed| gaussian::<f64>(d, k, seed).mapv(|e| e * scale);
    let opts = AttentionOptions {
        scale: ScoreScale::InvSqrtK,
        causal: false,
    };
    let head = SelfAttention::new(w(12), w(13), w(14), opts).expect("head");
    Inputs {
        x,
        head,
        g: gaussian(n, k, 15),
    }
}

/// The head in tch: leaf weights with gradients, and its output A (N×k) with the graph kept.
struct TorchHead {
    weights: [Tensor; 3],
    output: Tensor,
}

fn torch_forward(inp: &Inputs) -> TorchHead {
    let to_t = |a: ndarray::ArrayView2<'_, f64>| {
        tensor_from_array(a, Kind::Double, Device::Cpu).expect("tensor")
    };
    let (wq, wk, wv) = inp.head.weights();
    let weights = [
        to_t(wq).set_requires_grad(true),
        to_t(wk).set_requires_grad(true),
        to_t(wv).set_requires_grad(true),
    ];
    let x = to_t(inp.x.view());
    let k = wq.ncols() as f64;
    let q = x.mm(&weights[0]);
    let kk = x.mm(&weights[1]);
    let v = x.mm(&weights[2]);
    let p = (q.mm(&kk.tr()) / k.sqrt()).softmax(-1, Kind::Double);
    let output = p.mm(&v);
    TorchHead { weights, output }
}

/// Row r = i + c·N of the autograd Jacobian ([vec ∂A[i,c]/∂W_Q; … W_K; … W_V], column-major),
/// written into `row`.
fn autograd_row(t: &TorchHead, n: usize, r: usize, row: &mut [f64]) {
    let (i, c) = ((r % n) as i64, (r / n) as i64);
    let out = t.output.get(i).get(c);
    let grads = Tensor::run_backward(&[&out], &t.weights, true, false);
    let block = row.len() / 3;
    for (b, g) in grads.iter().enumerate() {
        // vec (column-major) of a D×k tensor = the row-major flattening of its transpose.
        let flat = g.tr().contiguous().view([-1]);
        flat.copy_data(&mut row[b * block..(b + 1) * block], block);
    }
}

/// The full autograd Jacobian, one backward per output entry, into a reused row buffer.
fn autograd_jacobian(inp: &Inputs) -> f64 {
    let t = torch_forward(inp);
    let (n, d, k) = (inp.x.nrows(), inp.x.ncols(), inp.g.ncols());
    let mut row = vec![0.0; 3 * d * k];
    let mut acc = 0.0;
    for r in 0..n * k {
        autograd_row(&t, n, r, &mut row);
        acc += row[r % row.len()];
    }
    acc
}

/// ⟨G, A⟩ on a tch forward pass (graph kept): one backward of it is the autograd VJP.
struct TorchLoss {
    weights: [Tensor; 3],
    loss: Tensor,
}

fn torch_loss(inp: &Inputs) -> TorchLoss {
    let t = torch_forward(inp);
    let g = tensor_from_array(inp.g.view(), Kind::Double, Device::Cpu).expect("tensor");
    let loss = (&t.output * &g).sum(Kind::Double);
    TorchLoss {
        weights: t.weights,
        loss,
    }
}

/// One autograd backward through the retained graph: the gradients of ⟨G, A⟩.
fn autograd_backward(t: &TorchLoss) -> Vec<Tensor> {
    Tensor::run_backward(&[&t.loss], &t.weights, true, false)
}

/// Forward and one backward.
fn autograd_forward_backward(inp: &Inputs) -> Vec<Tensor> {
    let t = torch_loss(inp);
    Tensor::run_backward(&[&t.loss], &t.weights, false, false)
}

/// max |J_kappa − J_autograd| and max |J_kappa|, row by row.
fn compare(inp: &Inputs) -> (f64, f64) {
    let fwd = inp.head.forward(inp.x.view()).expect("forward");
    let j = fwd.jacobian_weights().expect("jacobian");
    let t = torch_forward(inp);
    let (n, d, k) = (inp.x.nrows(), inp.x.ncols(), inp.g.ncols());
    let dk = d * k;
    let mut row = vec![0.0; 3 * dk];
    let (mut diff, mut scale) = (0.0f64, 0.0f64);
    for r in 0..n * k {
        autograd_row(&t, n, r, &mut row);
        for (b, block) in j.blocks().iter().enumerate() {
            for (col, &ours) in block.row(r).iter().enumerate() {
                diff = diff.max((ours - row[b * dk + col]).abs());
                scale = scale.max(ours.abs());
            }
        }
    }
    (diff, scale)
}

fn selected_shapes() -> Vec<(&'static str, usize, usize, usize)> {
    let which = std::env::var("KAPPA_BENCH_ATTENTION_SHAPES").unwrap_or_default();
    SHAPES
        .iter()
        .copied()
        .filter(|(name, ..)| matches!(which.as_str(), "" | "all") || which == *name)
        .collect()
}

fn id(n: usize, d: usize, k: usize) -> String {
    format!("N{n}_D{d}_k{k}")
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn bench(c: &mut Criterion, threads: usize) {
    let mut g = c.benchmark_group(GROUP);
    for (name, n, d, k) in selected_shapes() {
        let inp = inputs(n, d, k);
        let p = id(n, d, k);
        // A fresh result every time (the workspace only holds the thread pool here).
        let mut fresh = JacobianWorkspace::with_threads(threads).expect("pool");
        g.bench_function(BenchmarkId::new("kappa_dense", &p), |b| {
            b.iter(|| {
                let fwd = inp.head.forward(black_box(inp.x.view())).expect("forward");
                fresh.compute(&fwd).expect("jacobian");
                black_box(fresh.take())
            })
        });
        // The documented reuse path: the workspace keeps its blocks.
        let mut ws = JacobianWorkspace::with_threads(threads).expect("pool");
        g.bench_function(BenchmarkId::new("kappa_dense_workspace", &p), |b| {
            b.iter(|| {
                let fwd = inp.head.forward(black_box(inp.x.view())).expect("forward");
                black_box(ws.compute(&fwd).expect("jacobian"));
            })
        });
        drop(ws);
        // Caller-owned blocks (every entry written, J_V's zeros included).
        let mut reuse = inp
            .head
            .forward(inp.x.view())
            .and_then(|f| f.jacobian_weights())
            .expect("jacobian");
        let pool = rayon_pool(threads);
        g.bench_function(BenchmarkId::new("kappa_dense_into", &p), |b| {
            b.iter(|| {
                let fwd = inp.head.forward(black_box(inp.x.view())).expect("forward");
                pool.install(|| fwd.jacobian_weights_into(&mut reuse))
                    .expect("jacobian");
                black_box(&reuse);
            })
        });
        drop(reuse);
        let fwd = inp.head.forward(inp.x.view()).expect("forward");
        g.bench_function(BenchmarkId::new("kappa_vjp", &p), |b| {
            b.iter(|| black_box(fwd.vjp_weights(black_box(inp.g.view())).expect("vjp")))
        });
        g.bench_function(BenchmarkId::new("kappa_forward_vjp", &p), |b| {
            b.iter(|| {
                let fwd = inp.head.forward(black_box(inp.x.view())).expect("forward");
                black_box(fwd.vjp_weights(inp.g.view()).expect("vjp"))
            })
        });
        g.bench_function(BenchmarkId::new("kappa_forward_jvp", &p), |b| {
            let (wq, wk, wv) = inp.head.weights();
            b.iter(|| {
                let fwd = inp.head.forward(black_box(inp.x.view())).expect("forward");
                black_box(fwd.jvp_weights(wq, wk, wv).expect("jvp"))
            })
        });
        let tl = torch_loss(&inp);
        g.bench_function(BenchmarkId::new("autograd_backward", &p), |b| {
            b.iter(|| black_box(autograd_backward(&tl)))
        });
        g.bench_function(BenchmarkId::new("autograd_forward_backward", &p), |b| {
            b.iter(|| black_box(autograd_forward_backward(&inp)))
        });
        // N·k backward passes: about 20 s per Jacobian at the large shape, so small only.
        if name == "small" {
            g.bench_function(BenchmarkId::new("autograd_rows_jacobian", &p), |b| {
                b.iter(|| black_box(autograd_jacobian(&inp)))
            });
        }
    }
    g.finish();
}

/// A rayon pool of `threads` threads (for the `_into` path, which runs on the current pool).
fn rayon_pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("rayon pool")
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    Some(num? / den?)
}

/// Criterion's medians, per shape; a function the run did not measure (filtered out on the
/// command line) is left out rather than shown as missing.
fn summary(threads: usize) {
    println!("\n==== kappa-attention criterion medians (f64, threads = {threads}) ====");
    let rows = [
        (
            "kappa_dense",
            "kappa Jacobian, fresh result (forward included)",
        ),
        (
            "kappa_dense_workspace",
            "kappa Jacobian, JacobianWorkspace reuse",
        ),
        ("kappa_dense_into", "kappa Jacobian, jacobian_weights_into"),
        (
            "autograd_rows_jacobian",
            "tch autograd Jacobian, one backward per row",
        ),
        ("kappa_vjp", "kappa VJP (cached forward)"),
        (
            "autograd_backward",
            "tch autograd backward (retained graph)",
        ),
        ("kappa_forward_vjp", "kappa forward + VJP"),
        ("autograd_forward_backward", "tch forward + backward"),
        ("kappa_forward_jvp", "kappa forward + JVP"),
    ];
    for (_, n, d, k) in selected_shapes() {
        let p = id(n, d, k);
        println!("{p}:");
        for (f, what) in rows {
            if let Some(t) = median_seconds(GROUP, f, &p) {
                println!("  {what:<48} {:>12} ms", fmt_ms(Some(t)));
            }
        }
        let vjp = median_seconds(GROUP, "kappa_vjp", &p);
        let bwd = median_seconds(GROUP, "autograd_backward", &p);
        if let Some(r) = ratio(vjp, bwd) {
            println!(
                "  kappa VJP / autograd backward (medians)          {:>12}",
                fmt_ratio(Some(r))
            );
        }
    }
    for (_, n, d, k) in selected_shapes() {
        let (diff, scale) = compare(&inputs(n, d, k));
        let rel = diff / scale;
        println!(
            "{}: max |J_kappa − J_autograd| = {diff:.3e}, relative {rel:.3e} (goal ≤ 1e-10): {}",
            id(n, d, k),
            if rel <= 1e-10 { "yes" } else { "NO" }
        );
    }
}

/// A paired-ratio summary with its number of rounds, as the summary prints it, and each side's
/// median seconds per call where known (kappa's, the peer's).
struct Rounds(Spread, Option<f64>, Option<f64>);

impl std::fmt::Display for Rounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.0;
        write!(
            f,
            "{:.3} ({:.3}–{:.3}, {} rounds)",
            s.median, s.min, s.max, s.count
        )
    }
}

/// The jacrev reference as a child process (`benches/reference/jacobian_reference.py`).
struct Jacrev(Peer);

impl Jacrev {
    fn start(n: usize, d: usize, k: usize, threads: usize) -> Result<Self, String> {
        let mut cmd = reference_command("jacobian_reference.py", threads);
        cmd.args(["--n", &n.to_string(), "--d", &d.to_string()])
            .args(["--k", &k.to_string(), "--threads", &threads.to_string()]);
        let (peer, line) = Peer::start(cmd)?;
        let want = format!("ready {} {}", n * k, 3 * d * k);
        if line != want {
            return Err(format!(
                "expected {want:?} from jacobian_reference.py, got {line:?}"
            ));
        }
        Ok(Self(peer))
    }

    /// Seconds of one jacrev Jacobian, as the script measured it.
    fn time(&mut self) -> Result<f64, String> {
        let reply = self.0.ask_numbers("jac")?;
        reply
            .first()
            .copied()
            .ok_or_else(|| "an empty reply".into())
    }
}

fn seconds(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// Alternating rounds of kappa's Jacobian (fresh and workspace) and jacrev; the order within a
/// round flips every round.
fn paired_jacobian(
    inp: &Inputs,
    threads: usize,
    rounds: usize,
) -> Result<(Rounds, Rounds), String> {
    let (n, d, k) = (inp.x.nrows(), inp.x.ncols(), inp.g.ncols());
    let mut jr = Jacrev::start(n, d, k, threads)?;
    let mut fresh = JacobianWorkspace::with_threads(threads).map_err(|e| e.to_string())?;
    let mut ws = JacobianWorkspace::with_threads(threads).map_err(|e| e.to_string())?;
    let mut kappa_fresh = || {
        let mut out = None;
        let t = seconds(|| {
            let fwd = inp.head.forward(inp.x.view()).expect("forward");
            fresh.compute(&fwd).expect("jacobian");
            out = fresh.take();
        });
        drop(black_box(out));
        t
    };
    let mut kappa_ws = || {
        seconds(|| {
            let fwd = inp.head.forward(inp.x.view()).expect("forward");
            black_box(ws.compute(&fwd).expect("jacobian"));
        })
    };
    // Warm-up: the workspace allocates here.
    kappa_fresh();
    kappa_ws();
    let (mut rf, mut rw) = (Vec::new(), Vec::new());
    let (mut tfs, mut tws, mut tjs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (tf, tw, tj);
        if round % 2 == 0 {
            tf = kappa_fresh();
            tw = kappa_ws();
            tj = jr.time()?;
        } else {
            tj = jr.time()?;
            tw = kappa_ws();
            tf = kappa_fresh();
        }
        rf.push(tj / tf);
        rw.push(tj / tw);
        tfs.push(tf);
        tws.push(tw);
        tjs.push(tj);
        eprintln!(
            "round {round}: jacrev {:.1} ms, kappa fresh {:.1} ms, workspace {:.1} ms",
            tj * 1e3,
            tf * 1e3,
            tw * 1e3
        );
    }
    let med = |t: Vec<f64>| Some(Spread::of(t).median);
    let jacrev = med(tjs);
    Ok((
        Rounds(Spread::of(rf), med(tfs), jacrev),
        Rounds(Spread::of(rw), med(tws), jacrev),
    ))
}

/// Alternating blocks of `reps` kappa VJPs and `reps` autograd backwards (then the same with
/// the forward pass included); per block, kappa's time over tch's.
/// Alternating rounds of kappa's VJP and one autograd backward (and of forward + VJP against
/// forward + backward). At more than one thread each timed round follows a pause and one untimed
/// call (`paired::alternate_settled`): kappa's products run on OpenBLAS's threads and
/// libtorch's on its OpenMP pool, and whichever pool just worked spins idle for a while and
/// takes the cores from the other.
fn paired_vjp(inp: &Inputs, rounds: usize, reps: usize, threads: usize) -> (Rounds, Rounds) {
    let fwd = inp.head.forward(inp.x.view()).expect("forward");
    let tl = torch_loss(inp);
    let mut kappa = || {
        for _ in 0..reps {
            black_box(fwd.vjp_weights(black_box(inp.g.view())).expect("vjp"));
        }
    };
    let mut torch = || {
        for _ in 0..reps {
            black_box(autograd_backward(&tl));
        }
    };
    let mut kappa_fb = || {
        for _ in 0..reps {
            let f = inp.head.forward(black_box(inp.x.view())).expect("forward");
            black_box(f.vjp_weights(inp.g.view()).expect("vjp"));
        }
    };
    let mut torch_fb = || {
        for _ in 0..reps {
            black_box(autograd_forward_backward(inp));
        }
    };
    let settle = (threads > 1).then(|| Duration::from_millis(150));
    let pairs = |a: &mut dyn FnMut(), b: &mut dyn FnMut()| {
        let (ta, tb) = kappa_benches::paired::alternate_settled(a, b, 1, rounds, settle);
        let per_call = |t: &[f64]| Spread::of(t.to_vec()).median / reps as f64;
        eprintln!(
            "  per call, medians of the rounds: kappa {:.3} ms, autograd {:.3} ms",
            per_call(&ta) * 1e3,
            per_call(&tb) * 1e3
        );
        Rounds(
            Spread::of(kappa_benches::paired::ratios(&ta, &tb)),
            Some(per_call(&ta)),
            Some(per_call(&tb)),
        )
    };
    (
        pairs(&mut kappa, &mut torch),
        pairs(&mut kappa_fb, &mut torch_fb),
    )
}

fn paired(threads: usize) {
    let jac_rounds = env_usize("KAPPA_BENCH_JAC_PAIRS", 5);
    let vjp_rounds = env_usize("KAPPA_BENCH_VJP_PAIRS", 40).max(1);
    let reps = env_usize("KAPPA_BENCH_VJP_REPS", 20).max(1);
    println!(
        "\n==== kappa-attention paired ratios (f64, threads = {threads}; median (min–max) over \
         alternating rounds) ===="
    );
    let mut record = paired_record();
    for (_, n, d, k) in selected_shapes() {
        let inp = inputs(n, d, k);
        let p = id(n, d, k);
        let (vjp, fb) = paired_vjp(&inp, vjp_rounds, reps, threads);
        println!("{p}: kappa VJP / autograd backward:            {vjp}  (goal ≤ 1.0)");
        println!("{p}: kappa forward+VJP / forward+backward:     {fb}");
        let (nf, df, kf) = (n as f64, d as f64, k as f64);
        let vjp_flops = 6.0 * nf * df * kf + 8.0 * nf * nf * kf;
        let fwd_flops = 6.0 * nf * df * kf + 4.0 * nf * nf * kf;
        let row = |variant: &str, r: &Rounds, flops: Option<f64>| record::Row {
            parameter: p.clone(),
            variant: variant.to_string(),
            threads,
            kappa_s: r.1,
            peer_s: r.2,
            ratio: record::Ratio::of(r.0),
            work: flops.map(|amount| record::Work {
                bound: record::Bound::GemmF64,
                amount,
            }),
        };
        record
            .rows
            .push(row("VJP / backward", &vjp, Some(vjp_flops)));
        let fb_flops = vjp_flops + fwd_flops;
        record
            .rows
            .push(row("forward+VJP / forward+backward", &fb, Some(fb_flops)));
        if jac_rounds == 0 {
            continue;
        }
        match paired_jacobian(&inp, threads, jac_rounds) {
            Ok((fresh, ws)) => {
                println!("{p}: jacrev / kappa Jacobian, fresh result:   {fresh}  (goal ≥ 20)");
                println!("{p}: jacrev / kappa Jacobian, workspace:      {ws}  (goal ≥ 50)");
                for (variant, r) in [
                    ("Jacobian, fresh result", &fresh),
                    ("Jacobian, workspace", &ws),
                ] {
                    record.rows.push(record::Row {
                        ratio: record::Ratio::inverse_of(r.0),
                        ..row(variant, r, None)
                    });
                }
            }
            Err(e) => println!(
                "{p}: jacrev reference did not run ({e}); set KAPPA_PYTHON to a Python with \
                 torch"
            ),
        }
    }
    record.write();
}

/// The paired ratios' record (`kappa_benches::record`), rows still to come.
fn paired_record() -> record::Paired {
    record::Paired {
        bench: "attention",
        name: "paired_ratios",
        title: "Attention's VJP against autograd, its Jacobian against torch.func.jacrev".into(),
        what: "One f64 attention head (N tokens, D wide, k per head): kappa-attention's weight \
               VJP from a cached forward pass against one tch autograd backward, forward + VJP \
               against forward + backward, and the exact weight Jacobian (fresh result, or into \
               a reused workspace; forward included) against `torch.func.jacrev` in a child \
               process; rounds alternated."
            .into(),
        peer: "autograd / jacrev".into(),
        spread: "min–max over rounds",
        model: "forward 6NDk + 4N²k flops (the three projections, the scores and the weighted \
                values), the weight VJP 6NDk + 8N²k (the three weight gradients, and the score \
                and value products' two gradients each)"
            .into(),
        rows: Vec::new(),
    }
}

fn main() {
    // `KAPPA_BENCH_THREADS=1,2`: this benchmark once per count, each in its own process
    // (OpenBLAS fixes its thread count when it loads).
    if let Ok(list) = std::env::var("KAPPA_BENCH_THREADS") {
        if list.contains(',') {
            let exe = std::env::current_exe().expect("the benchmark's own path");
            let mut code = 0;
            for t in list.split(',').map(str::trim) {
                let status = Command::new(&exe)
                    .args(std::env::args_os().skip(1))
                    .env("KAPPA_BENCH_THREADS", t)
                    .env_remove("OPENBLAS_NUM_THREADS")
                    .status()
                    .expect("running the benchmark for one thread count");
                code = code.max(status.code().unwrap_or(1));
            }
            std::process::exit(code);
        }
    }
    let threads = configure_threads();
    if env_usize("KAPPA_BENCH_CRITERION", 1) != 0 {
        let seconds: u64 = std::env::var("KAPPA_BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5);
        let mut c = Criterion::default()
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(seconds))
            .configure_from_args();
        bench(&mut c, threads);
        c.final_summary();
        summary(threads);
    }
    paired(threads);
}
