//! The GPT training step under two process environments, alternated in one run: what a setting
//! that only takes effect when a process starts costs or saves.
//!
//! Two comparisons, each at 1 and 2 threads, each in `PAIRS` alternating pairs of child
//! processes (the benchmark re-runs itself; a child times `STEPS` steps after warm-up):
//!
//! - `OMP_WAIT_POLICY`: unset (OpenMP's default: idle threads spin a while before sleeping)
//!   against `PASSIVE` (idle threads sleep at once), which `cargo xtask` used to set.
//! - the same, with both thread pools busy: each step also multiplies two 384×384 f32 matrices
//!   on ndarray (OpenBLAS's own threads), as a training run that measures spectra between steps
//!   does.
//! - link order: the binary as linked (kappa-linalg's OpenBLAS and kappa-models' libtorch) against
//!   the same binary with `LD_PRELOAD` of libtorch_cpu (libtorch first whatever the link order):
//!   equal within noise when libtorch's GEMMs are libtorch's in the binary as linked.
//!
//! `cargo bench -p kappa-benches --bench step_env` (needs `LIBTORCH`, as every tch benchmark).

// libtorch's MKL chooses kernels by CPU features, as in kappa's binaries (build.rs).
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

// Rust's allocations on mimalloc, which keeps freed pages for reuse (glibc returns N×N
// temporaries to the kernel; docs/architecture.md, "The memory allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

use kappa_benches::paired::{cpu_model, ratios, Spread};
use kappa_models::{Gpt, GptConfig};
use kappa_train::{adamw_groups, seeded, TrainConfig};
use tch::{nn, Device, Kind, Tensor};

const PAIRS: usize = 7;
const STEPS: usize = 20;
const CHILD: &str = "KAPPA_STEP_ENV_CHILD";
const MIXED: &str = "KAPPA_STEP_ENV_MIXED";

/// Child: seconds per training step of the cpu GPT (batch 32, context 64), median of `STEPS`;
/// with `mixed`, each step also runs one ndarray (OpenBLAS) product.
fn child(threads: i32, mixed: bool) -> f64 {
    tch::set_num_threads(threads);
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = GptConfig::cpu(98);
    let gpt = seeded(0, || Gpt::new(&vs.root(), cfg)).expect("gpt");
    let idx = seeded(1, || {
        Tensor::randint(98, [32, cfg.block_size as i64], (Kind::Int64, Device::Cpu))
    });
    let groups = adamw_groups(&vs, &TrainConfig::default()).expect("groups");
    let mut opt = kappa_optim::Optimizer::new(groups).expect("optimizer");
    let (a, b) = (
        kappa_benches::gaussian::<f32>(384, 384, 1),
        kappa_benches::gaussian::<f32>(384, 384, 2),
    );
    let mut step = || {
        kappa_benches::train_step(&mut opt, || black_box(gpt.loss(&idx, &idx).expect("loss")));
        if mixed {
            black_box(a.dot(&b));
        }
    };
    for _ in 0..3 {
        step();
    }
    let mut times: Vec<f64> = (0..STEPS)
        .map(|_| {
            let t = Instant::now();
            step();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[STEPS / 2]
}

/// Runs a child with `threads` and the extra environment; returns its seconds per step.
fn run_child(threads: usize, env: &[(&str, Option<&str>)]) -> f64 {
    let exe = std::env::current_exe().expect("the benchmark's own path");
    let mut cmd = Command::new(exe);
    cmd.env(CHILD, threads.to_string())
        .env("OPENBLAS_NUM_THREADS", threads.to_string())
        .env("OMP_NUM_THREADS", threads.to_string())
        .env_remove("OMP_WAIT_POLICY");
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd.output().expect("running a child benchmark process");
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a child prints its seconds per step")
}

fn compare(name: &str, threads: usize, a: &[(&str, Option<&str>)], b: &[(&str, Option<&str>)]) {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for i in 0..PAIRS {
        if i % 2 == 0 {
            ta.push(run_child(threads, a));
            tb.push(run_child(threads, b));
        } else {
            tb.push(run_child(threads, b));
            ta.push(run_child(threads, a));
        }
    }
    let ms = |t: &[f64]| Spread::of(t.to_vec()).median * 1e3;
    println!(
        "{:<34} {:>7} {:>9.2} {:>9.2}   {}",
        name,
        threads,
        ms(&ta),
        ms(&tb),
        Spread::of(ratios(&tb, &ta))
    );
}

fn main() {
    if let Some(threads) = std::env::var(CHILD).ok().and_then(|t| t.parse().ok()) {
        println!("{}", child(threads, std::env::var_os(MIXED).is_some()));
        return;
    }
    let torch_cpu = std::env::var("LIBTORCH")
        .map(|l| format!("{l}/lib/libtorch_cpu.so"))
        .ok();
    println!("==== cpu GPT training step (batch 32, context 64) under two environments ====");
    println!("CPU: {}", cpu_model());
    println!("ratio = B / A per alternated pair of processes: median [min–max]");
    println!(
        "{:<34} {:>7} {:>9} {:>9}   ratio",
        "A → B", "threads", "A ms", "B ms"
    );
    for threads in [1, 2] {
        compare(
            "OMP_WAIT_POLICY PASSIVE → default",
            threads,
            &[("OMP_WAIT_POLICY", Some("PASSIVE"))],
            &[],
        );
        compare(
            "mixed: OMP PASSIVE → default",
            threads,
            &[("OMP_WAIT_POLICY", Some("PASSIVE")), (MIXED, Some("1"))],
            &[(MIXED, Some("1"))],
        );
        match &torch_cpu {
            Some(lib) => compare(
                "as linked → LD_PRELOAD libtorch",
                threads,
                &[],
                &[("LD_PRELOAD", Some(lib.as_str()))],
            ),
            None => println!("(LIBTORCH is not set: no link-order comparison)"),
        }
    }
}
