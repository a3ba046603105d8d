//! Criterion benchmarks of kappa-attention: the exact weight Jacobian of one attention head
//! (dense, and the matrix-free products) against the same Jacobian built by reverse-mode
//! autograd through tch (one backward per output entry), in f64.
//!
//! Run: `KAPPA_BENCH_THREADS=1 cargo bench -p kappa-benches --bench attention` (and again with
//! 2). Settings (environment):
//!
//! * `KAPPA_BENCH_THREADS` — 1 or 2 (OpenBLAS and libtorch threads; default 1).
//! * `KAPPA_BENCH_ATTENTION_SHAPES` — `small` (N=64, D=64, k=16), `large` (N=197, D=192,
//!   k=64) or `all` (default).
//! * `KAPPA_BENCH_SECONDS` — criterion measurement time per function (default 5).
//!
//! After the criterion output a summary prints, per shape: the medians, the speedup of kappa's
//! dense Jacobian over the autograd Jacobian (goal ≥ 20×; "reuse" writes into preallocated
//! blocks, "kappa" allocates them fresh each time), the matrix-free VJP against one
//! autograd backward, and the max abs difference between the two Jacobians (goal ≤ 1e-10
//! relative to max |J|).
//!
//! The autograd Jacobian computes every row (N·k backward passes through a retained graph) and
//! copies it into a reused row buffer, so its memory stays at one row; kappa's dense Jacobian is
//! materialized in full (3 blocks of N·k × D·k: 3.7 GB of f64 at the large shape).

use std::time::Duration;

use criterion::{black_box, BenchmarkId, Criterion};
use kappa_attention::{AttentionOptions, ScoreScale, SelfAttention};
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

/// One autograd VJP: the gradients of ⟨G, A⟩.
fn autograd_vjp(inp: &Inputs) -> Vec<Tensor> {
    let t = torch_forward(inp);
    let g = tensor_from_array(inp.g.view(), Kind::Double, Device::Cpu).expect("tensor");
    let loss = (&t.output * &g).sum(Kind::Double);
    Tensor::run_backward(&[&loss], &t.weights, false, false)
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

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group(GROUP);
    for (_, n, d, k) in selected_shapes() {
        let inp = inputs(n, d, k);
        let p = id(n, d, k);
        g.bench_function(BenchmarkId::new("kappa_dense", &p), |b| {
            b.iter(|| {
                let fwd = inp.head.forward(black_box(inp.x.view())).expect("forward");
                black_box(fwd.jacobian_weights().expect("jacobian"))
            })
        });
        // The same, writing into reused blocks (as repeated evaluations would).
        let mut reuse = inp
            .head
            .forward(inp.x.view())
            .and_then(|f| f.jacobian_weights())
            .expect("jacobian");
        g.bench_function(BenchmarkId::new("kappa_dense_reuse", &p), |b| {
            b.iter(|| {
                let fwd = inp.head.forward(black_box(inp.x.view())).expect("forward");
                fwd.jacobian_weights_into(&mut reuse).expect("jacobian");
                black_box(&reuse);
            })
        });
        g.bench_function(BenchmarkId::new("kappa_vjp", &p), |b| {
            b.iter(|| {
                let fwd = inp.head.forward(black_box(inp.x.view())).expect("forward");
                black_box(fwd.vjp_weights(inp.g.view()).expect("vjp"))
            })
        });
        g.bench_function(BenchmarkId::new("kappa_jvp", &p), |b| {
            let (wq, wk, wv) = inp.head.weights();
            b.iter(|| {
                let fwd = inp.head.forward(black_box(inp.x.view())).expect("forward");
                black_box(fwd.jvp_weights(wq, wk, wv).expect("jvp"))
            })
        });
        g.bench_function(BenchmarkId::new("autograd_vjp", &p), |b| {
            b.iter(|| black_box(autograd_vjp(&inp)))
        });
        g.bench_function(BenchmarkId::new("autograd_jacobian", &p), |b| {
            b.iter(|| black_box(autograd_jacobian(&inp)))
        });
    }
    g.finish();
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    Some(num? / den?)
}

fn summary(threads: usize) {
    println!("\n==== kappa-attention benchmark summary (f64, threads = {threads}, medians) ====");
    println!("Exact weight Jacobian [J_Q J_K J_V] (forward included) against autograd through tch");
    println!("(one backward per output entry); goal: speedup ≥ 20, max |ΔJ| ≤ 1e-10·max |J|.");
    println!(
        "{:<16} {:>9} {:>9} {:>12} {:>8} {:>8} {:>8} {:>8} {:>14} {:>8} {:>11} {:>11} {:>5}",
        "shape",
        "kappa ms",
        "reuse ms",
        "autograd ms",
        "speedup",
        "reuse x",
        "vjp ms",
        "jvp ms",
        "autograd vjp ms",
        "vjp x",
        "max |ΔJ|",
        "relative",
        "ok"
    );
    for (_, n, d, k) in selected_shapes() {
        let p = id(n, d, k);
        let dense = median_seconds(GROUP, "kappa_dense", &p);
        let dense_reuse = median_seconds(GROUP, "kappa_dense_reuse", &p);
        let auto = median_seconds(GROUP, "autograd_jacobian", &p);
        let vjp = median_seconds(GROUP, "kappa_vjp", &p);
        let jvp = median_seconds(GROUP, "kappa_jvp", &p);
        let avjp = median_seconds(GROUP, "autograd_vjp", &p);
        let (diff, scale) = compare(&inputs(n, d, k));
        let rel = diff / scale;
        println!(
            "{:<16} {:>9} {:>9} {:>12} {:>8} {:>8} {:>8} {:>8} {:>14} {:>8} {:>11.3e} {:>11.3e} {:>5}",
            p,
            fmt_ms(dense),
            fmt_ms(dense_reuse),
            fmt_ms(auto),
            fmt_ratio(ratio(auto, dense)),
            fmt_ratio(ratio(auto, dense_reuse)),
            fmt_ms(vjp),
            fmt_ms(jvp),
            fmt_ms(avjp),
            fmt_ratio(ratio(avjp, vjp)),
            diff,
            rel,
            if rel <= 1e-10 { "yes" } else { "NO" }
        );
    }
}

fn main() {
    let threads = configure_threads();
    let seconds: u64 = std::env::var("KAPPA_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(seconds))
        .configure_from_args();
    bench(&mut c);
    c.final_summary();
    summary(threads);
}
