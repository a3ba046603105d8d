//! Data-parallel training throughput: the gpt-sotu `cpu` model and batch (2 layers × 64, 4 heads,
//! context 64, 32 sequences a step, AdamW) trained by kappa-train's `Trainer` on
//!
//! - A: one rank with one libtorch thread;
//! - B: two ranks with one libtorch thread each (kappa-dist's `Threads`: ranks as threads of one
//!   process, the batch split in two, gradients averaged every step);
//! - C: one rank with two libtorch threads (libtorch's intra-op parallelism).
//!
//! Each configuration runs in its own child process (the benchmark re-runs itself), `PAIRS`
//! times, alternating; a child trains `WARMUP + STEPS` steps and reports the tokens per second
//! of the last `STEPS` from the trainer's records (the step time, no evaluation). The summary
//! prints B / A (the speed-up of a second rank; 2 is perfect) and B / C (ranks against threads)
//! as median [min–max] of the per-pair ratios, and the bytes each rank sends per step.
//!
//! `cargo bench -p kappa-benches --bench data_parallel` (needs `LIBTORCH`, as every tch
//! benchmark; nothing else should run on the machine). `-- --quick`: 2 pairs of short runs.

// libtorch's MKL chooses kernels by CPU features, as in kappa's binaries (build.rs).
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

// Rust's allocations on mimalloc, as in kappa's binaries (docs/architecture.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use kappa_benches::paired::{cpu_model, ratios, Spread};
use kappa_benches::record;
use kappa_dist::{Communicator, Threads};
use kappa_models::data::fixtures;
use kappa_models::{Gpt, GptConfig, TextCorpus, TokenizerKind};
use kappa_train::{seeded, LanguageModeling, Record, RunContext, TrainConfig, Trainer};
use tch::{nn, Device};

const CHILD: &str = "KAPPA_DATA_PARALLEL_CHILD";
const TEXT: &str = "KAPPA_DATA_PARALLEL_TEXT";
const BATCH: usize = 32;
const CONTEXT: usize = 64;

/// Steps timed and steps before them, per child.
fn steps(quick: bool) -> (u64, u64) {
    if quick {
        (3, 8)
    } else {
        (10, 60)
    }
}

fn train_config(total: u64) -> TrainConfig {
    TrainConfig {
        steps: total,
        batch_size: BATCH,
        lr: 3e-3,
        min_lr: 3e-4,
        warmup_steps: 10,
        weight_decay: 0.1,
        grad_clip: 1.0,
        eval_every: total,
        eval_batches: 1,
        log_every: 1,
        ..TrainConfig::default()
    }
}

/// One rank's training run with `threads` libtorch threads (set on the calling thread: the count
/// is per thread); the `seconds` of each training record (rank 0; empty elsewhere).
fn train(dir: &Path, comm: Option<Arc<dyn Communicator>>, threads: usize, total: u64) -> Vec<f64> {
    let context = RunContext {
        seed: 0,
        threads,
        ..RunContext::default()
    }
    .quiet();
    context.apply_threads();
    let corpus = TextCorpus::load_sotu(dir, TokenizerKind::Char, None, Device::Cpu).expect("text");
    let vs = nn::VarStore::new(Device::Cpu);
    let mut cfg = GptConfig::cpu(corpus.tokenizer.vocab_size());
    cfg.block_size = CONTEXT;
    let gpt = seeded(0, || Gpt::new(&vs.root(), cfg)).expect("gpt");
    let mut task = LanguageModeling::new(gpt, corpus, 1).expect("task");
    let mut trainer = Trainer::new(&vs, train_config(total), &context).expect("trainer");
    if let Some(comm) = comm {
        trainer.data_parallel(comm).expect("data parallel");
    }
    let mut seconds = Vec::new();
    trainer
        .run(
            &mut task,
            &mut |r| {
                if let Record::Train { seconds: s, .. } = r {
                    seconds.push(*s);
                }
                Ok(())
            },
            None,
        )
        .expect("training");
    seconds
}

/// Child: tokens per second of the timed steps under `mode` (`A`, `B` or `C`), on the text in
/// `dir`.
fn child(mode: &str, dir: &Path, quick: bool) -> f64 {
    let (warmup, timed) = steps(quick);
    let total = warmup + timed;
    let seconds = match mode {
        "B" => {
            let runs = Threads::run(2, |comm| train(dir, Some(Arc::new(comm)), 1, total))
                .expect("two ranks");
            runs.into_iter().next().expect("rank 0")
        }
        "C" => train(dir, None, 2, total),
        _ => train(dir, None, 1, total),
    };
    let (from, to) = (seconds[warmup as usize - 1], seconds[total as usize - 1]);
    (timed as usize * BATCH * CONTEXT) as f64 / (to - from)
}

fn run_child(mode: &str, dir: &Path, quick: bool) -> f64 {
    let exe = std::env::current_exe().expect("the benchmark's own path");
    let mut cmd = Command::new(exe);
    cmd.env(CHILD, mode)
        .env(TEXT, dir)
        .env("RAYON_NUM_THREADS", "1");
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd.output().expect("running a child benchmark process");
    assert!(
        out.status.success(),
        "child {mode} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a child prints its tokens per second")
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if let (Ok(mode), Some(dir)) = (std::env::var(CHILD), std::env::var_os(TEXT)) {
        println!("{}", child(&mode, Path::new(&dir), quick));
        return;
    }
    let dir = std::env::temp_dir().join(format!("kappa-bench-dp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    fixtures::write_sotu(&dir).expect("text");
    let pairs = if quick { 2 } else { 5 };
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..pairs {
        let order: [(&str, &mut Vec<f64>); 3] = if i % 2 == 0 {
            [("A", &mut a), ("B", &mut b), ("C", &mut c)]
        } else {
            [("C", &mut c), ("B", &mut b), ("A", &mut a)]
        };
        for (mode, out) in order {
            out.push(run_child(mode, &dir, quick));
        }
    }
    let vocab = TextCorpus::load_sotu(&dir, TokenizerKind::Char, None, Device::Cpu)
        .expect("text")
        .tokenizer
        .vocab_size();
    let _ = std::fs::remove_dir_all(&dir);
    let parameters = {
        let vs = nn::VarStore::new(Device::Cpu);
        let _gpt = Gpt::new(&vs.root(), GptConfig::cpu(vocab)).expect("gpt");
        vs.trainable_variables()
            .iter()
            .map(|t| t.numel())
            .sum::<usize>()
    };
    println!(
        "==== data-parallel training, gpt-sotu cpu model (batch {BATCH}, context {CONTEXT}) ===="
    );
    println!("CPU: {}", cpu_model());
    let med = |t: &[f64]| Spread::of(t.to_vec()).median;
    println!(
        "tokens/s, median: A (1 rank × 1 thread) {:.0}, B (2 ranks × 1 thread) {:.0}, \
         C (1 rank × 2 threads) {:.0}",
        med(&a),
        med(&b),
        med(&c)
    );
    println!(
        "B / A (a second rank; 2 is perfect): {}",
        Spread::of(ratios(&b, &a))
    );
    println!(
        "B / C (ranks against libtorch threads): {}",
        Spread::of(ratios(&b, &c))
    );
    write_record(&a, &b, &c);
    // Every step averages the f32 gradient of every parameter over the ranks. An all-reduce must
    // move at least 2·(W − 1)/W of it per rank (reduce-scatter then all-gather): one gradient's
    // bytes at W = 2.
    println!(
        "gradient per step: {} parameters, {} bytes (the least a 2-rank all-reduce moves per rank)",
        parameters,
        4 * parameters
    );
}

/// The two ratios as the bench's record (`kappa_benches::record`): step times (the inverse of
/// tokens per second, pair by pair) of two ranks against one rank, and against two threads.
fn write_record(a: &[f64], b: &[f64], c: &[f64]) {
    let step_s = |tps: &[f64]| Some((BATCH * CONTEXT) as f64 / Spread::of(tps.to_vec()).median);
    let row = |variant: &str, peer: &[f64]| record::Row {
        parameter: format!("gpt-sotu cpu, batch {BATCH}, context {CONTEXT}"),
        variant: variant.to_string(),
        threads: 2,
        kappa_s: step_s(b),
        peer_s: step_s(peer),
        ratio: record::Ratio::of(Spread::of(ratios(peer, b))),
        work: None,
    };
    record::Paired {
        bench: "data_parallel",
        name: "ranks_vs_threads",
        title: "Data-parallel training: two ranks against one rank and against two threads".into(),
        what: "kappa-train's `Trainer` on the gpt-sotu `cpu` model, step time (the trainer's \
               records, no evaluation) on two ranks of one libtorch thread each (kappa-dist's \
               `Threads`) against one rank with one thread, and against one rank with two \
               libtorch threads; each configuration in its own child process, alternated. A \
               ratio of 0.5 against one rank is a perfect second rank."
            .into(),
        peer: "one rank".into(),
        spread: "min–max over pairs",
        model: String::new(),
        rows: vec![
            row("2 ranks × 1 thread / 1 rank × 1 thread", a),
            row("2 ranks × 1 thread / 1 rank × 2 threads", c),
        ],
    }
    .write();
}
