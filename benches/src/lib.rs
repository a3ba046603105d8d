//! kappa-benches: shared helpers for the criterion benchmarks (threads, inputs, summaries).

// kappa-models names libtorch_cpu among its native libraries, which keeps libtorch's GEMMs on
// libtorch's MKL in every binary that links it (docs/architecture.md, "libtorch keeps its own
// BLAS"); rustc links only the crates a binary references, so this crate references it for every
// bench binary (`tests/blas_binding.rs` checks the result).
extern crate kappa_models as _;

pub mod gpt2;
pub mod paired;
pub mod peer;
pub mod record;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

use ndarray::Array2;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// The f32 shapes of the transformer sizes used in kappa (rows, cols).
pub const F32_SHAPES: [(usize, usize); 5] =
    [(64, 64), (384, 384), (384, 1536), (768, 768), (768, 3072)];

/// The f64 shapes (rows, cols).
pub const F64_SHAPES: [(usize, usize); 3] = [(256, 256), (1024, 1024), (4096, 256)];

/// Reads `KAPPA_BENCH_THREADS` (1 or 2; default 1), makes OpenBLAS, rayon (kappa's products) and
/// libtorch use that many threads, and returns it. Rayon's pool is set up as in kappa's binaries
/// (`kappa_linalg::threads::init_global_pool`: pinned when it has a worker per CPU;
/// `KAPPA_PIN_THREADS` overrides).
///
/// OpenBLAS reads `OPENBLAS_NUM_THREADS` once, when the library is loaded, and rayon its
/// `RAYON_NUM_THREADS` when its global pool starts, so when either variable does not already hold
/// the requested count the benchmark re-executes itself with both set (and `OMP_NUM_THREADS` for
/// libtorch's OpenMP pool) and exits with the child's status.
pub fn configure_threads() -> usize {
    RUN_START.get_or_init(SystemTime::now);
    let threads = match std::env::var("KAPPA_BENCH_THREADS").ok().as_deref() {
        None | Some("") | Some("1") => 1,
        Some("2") => 2,
        Some(other) => {
            eprintln!("KAPPA_BENCH_THREADS must be 1 or 2, found {other:?}");
            std::process::exit(2);
        }
    };
    let want = threads.to_string();
    let has = |var| std::env::var(var).ok();
    let set = |var| has(var).as_deref() == Some(want.as_str());
    if !set("OPENBLAS_NUM_THREADS") || !set("RAYON_NUM_THREADS") {
        let exe = std::env::current_exe().expect("the benchmark's own path");
        let status = Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("OPENBLAS_NUM_THREADS", &want)
            .env("OMP_NUM_THREADS", &want)
            .env("RAYON_NUM_THREADS", &want)
            .env("KAPPA_BENCH_THREADS", &want)
            .status()
            .expect("re-executing the benchmark with OPENBLAS_NUM_THREADS set");
        std::process::exit(status.code().unwrap_or(1));
    }
    tch::set_num_threads(threads as i32);
    // kappa's products on rayon's global pool as kappa's binaries set it up (pinned when it has
    // a worker per CPU; `KAPPA_PIN_THREADS=0` or `1` overrides).
    let pinning = kappa_linalg::threads::Pinning::from_env();
    if let Err(e) = kappa_linalg::threads::init_global_pool(threads, pinning) {
        eprintln!("rayon's global pool was already set up: {e}");
    }
    eprintln!("{}", kappa_linalg::threads::global_pool_description());
    threads
}

/// glibc's `malloc` thresholds (bytes) in a process that has freed a block of 32 MiB or more:
/// glibc then raises its mmap threshold to that block's size, capped at 32 MiB, and its trim
/// threshold to twice the mmap threshold (docs/architecture.md, "The memory allocator").
/// Before, freed buffers of a few MiB go back to the kernel and fault in again when reused; after,
/// they stay mapped. A bench that sets these at its start measures every part in that state
/// instead of one that depends on which parts ran before it.
pub const WARM_MALLOC_THRESHOLDS: [(&str, usize); 2] = [
    ("MALLOC_MMAP_THRESHOLD_", 32 << 20),
    ("MALLOC_TRIM_THRESHOLD_", 64 << 20),
];

/// Sets [`WARM_MALLOC_THRESHOLDS`] in this process (`mallopt`; nothing off glibc).
#[allow(unsafe_code)]
pub fn warm_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let [(_, mmap), (_, trim)] = WARM_MALLOC_THRESHOLDS;
        // SAFETY: `mallopt` only changes two of glibc's tuning parameters, under the lock of its
        // allocator state (other threads may allocate meanwhile); the parameter numbers and
        // values are valid for it.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap as libc::c_int);
            libc::mallopt(libc::M_TRIM_THRESHOLD, trim as libc::c_int);
        }
    }
}

/// Gives a child process [`WARM_MALLOC_THRESHOLDS`] through glibc's environment variables, so
/// that a peer measures in the allocator state [`warm_allocator`] gives this process.
pub fn warm_allocator_for(cmd: &mut Command) {
    for (var, bytes) in WARM_MALLOC_THRESHOLDS {
        cmd.env(var, bytes.to_string());
    }
}

/// A seeded Gaussian matrix.
pub fn gaussian<A: kappa_linalg::Real>(rows: usize, cols: usize, seed: u64) -> Array2<A> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Array2::from_shape_simple_fn((rows, cols), || {
        A::from_f64_lossy(StandardNormal.sample(&mut rng))
    })
}

/// `rows`x`cols` as a benchmark parameter string.
pub fn shape_id(rows: usize, cols: usize) -> String {
    format!("{rows}x{cols}")
}

/// Flops of one quintic Newton–Schulz step on an m×n matrix (wide orientation r = min, s = max):
/// Gram 2r²s, A·A 2r³, B·X 2r²s.
pub fn ns_step_flops(rows: usize, cols: usize) -> f64 {
    let (r, s) = (rows.min(cols) as f64, rows.max(cols) as f64);
    4.0 * r * r * s + 2.0 * r * r * r
}

fn criterion_dir() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("CRITERION_HOME") {
        return Some(PathBuf::from(h));
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return Some(PathBuf::from(t).join("criterion"));
    }
    // target/release/deps/linalg-<hash>
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.parent()?.join("criterion"))
}

/// The directory criterion writes an id's results under: the characters ?"/\*<>:|^ become `_`
/// and the name is cut to 64 bytes at a character boundary (criterion 0.5's rule on Unix), so
/// a group named `linalg/orthogonalizers` lives in `linalg_orthogonalizers`.
pub fn criterion_dir_name(id: &str) -> String {
    const UNSAFE: [char; 10] = ['?', '"', '/', '\\', '*', '<', '>', ':', '|', '^'];
    let mut name = id.replace(&UNSAFE[..], "_");
    let mut end = name.len().min(64);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name.truncate(end);
    name
}

/// When this benchmark process started ([`configure_threads`] records it): criterion results
/// older than this are from an earlier run (or a benchmark this run's filter left out).
static RUN_START: OnceLock<SystemTime> = OnceLock::new();

/// The median time in seconds criterion recorded for `group/function/parameter` in this run:
/// `None` when this run did not measure it (filtered out), never an earlier run's figure.
pub fn median_seconds(group: &str, function: &str, parameter: &str) -> Option<f64> {
    let path = criterion_dir()?
        .join(criterion_dir_name(group))
        .join(criterion_dir_name(function))
        .join(criterion_dir_name(parameter))
        .join("new")
        .join("estimates.json");
    if let Some(start) = RUN_START.get() {
        let written = std::fs::metadata(&path).and_then(|m| m.modified()).ok()?;
        if written < *start {
            return None;
        }
    }
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"].as_f64().map(|ns| ns * 1e-9)
}

/// What a summary cell shows for a figure this run did not measure (see [`NOT_RUN_NOTE`]).
pub const NOT_RUN: &str = "—";

/// The legend printed under a summary whose rows may be partly filtered out.
pub const NOT_RUN_NOTE: &str = "(— : not measured in this run: its benchmark was filtered out)";

/// Formats an optional ratio.
pub fn fmt_ratio(x: Option<f64>) -> String {
    x.map_or_else(|| NOT_RUN.to_string(), |x| format!("{x:.3}"))
}

/// Formats optional seconds as milliseconds.
pub fn fmt_ms(x: Option<f64>) -> String {
    x.map_or_else(|| NOT_RUN.to_string(), |x| format!("{:.3}", x * 1e3))
}

/// Whether any of a summary row's figures was measured in this run (rows with none are left out
/// of the summary rather than printed empty).
pub fn any_measured(figures: &[Option<f64>]) -> bool {
    figures.iter().any(Option::is_some)
}

/// One optimizer step as `kappa_train::Trainer` takes it, after `loss` (with its graph):
/// gradients dropped, backward, the global gradient norm clipped at 1
/// ([`kappa_optim::Optimizer::clip_grad_norm`]), then every group's update at its peak lr.
pub fn train_step(opt: &mut kappa_optim::Optimizer, loss: impl FnOnce() -> tch::Tensor) {
    opt.zero_grad().expect("dropping gradients");
    loss().backward();
    opt.clip_grad_norm(1.0).expect("gradient norm");
    opt.step().expect("optimizer step");
}

#[cfg(test)]
mod tests {
    use super::criterion_dir_name;

    #[test]
    fn criterion_dir_names_follow_criterion() {
        assert_eq!(
            criterion_dir_name("linalg/orthogonalizers"),
            "linalg_orthogonalizers"
        );
        assert_eq!(
            criterion_dir_name("a?b:c|d^e<f>g*h\\i\"j"),
            "a_b_c_d_e_f_g_h_i_j"
        );
        assert_eq!(criterion_dir_name("384x1536"), "384x1536");
        let long = "é".repeat(40); // 80 bytes: cut to 64, on a character boundary
        assert_eq!(criterion_dir_name(&long), "é".repeat(32));
    }
}
