//! Rayon pools whose workers each stay on one CPU: [`pinned_pool_builder`], and rayon's global
//! pool set up the way kappa's binaries set it up: [`init_global_pool`].
//!
//! kappa's threaded kernels (the products of [`crate::product`], kappa-attention's split forward
//! pass and weight VJP) hand work to rayon's workers a few times per call. After the process has
//! been idle for a few tens of milliseconds, Linux may wake the workers on the CPU of the thread
//! that woke them; until its load balancer spreads them again, two workers share one core and a
//! two-thread call runs at one thread's speed or slower. Measured (AMD EPYC Zen 5, 2 cores, the
//! weight VJP at N = 197, D = 192, k = 64, f64, 20 calls after a pause, medians of 40 rounds):
//! 0.28–0.30 ms per call in a steady loop; 0.40–0.46 ms after a 150 ms pause (both halves of a
//! `rayon::join` then ran on the same CPU in 200 of 200 tries, against 2–3 of 200 in a steady
//! loop) and after 150 ms of a busy main thread; 0.29 ms again after 200 calls. With the
//! workers pinned, 0.30–0.34 ms in every pattern.
//!
//! Pinning is a choice: two processes that each pin their workers to the first CPUs they may
//! use share those cores while others idle, and a pinned worker cannot leave a CPU that another
//! process keeps busy. [`Pinning::Auto`], what kappa's binaries use, pins only a pool with one
//! worker per CPU the process may use (and more than one): then every CPU has its worker, and
//! two such processes share every CPU alike.
//!
//! A pool from [`pinned_pool_builder`] pins worker i to the i-th CPU of the calling thread's
//! affinity mask (the process's, which a cluster's scheduler sets to the job's CPUs, unless the
//! thread was restricted further), cycling when there are more workers than CPUs. Elsewhere
//! than Linux it builds an unpinned pool.
//!
//! ```
//! let pool = kappa_linalg::threads::pinned_pool_builder(2).build().unwrap();
//! let (a, b) = pool.install(|| rayon::join(|| 1, || 2));
//! assert_eq!(a + b, 3);
//! ```

// The affinity calls are FFI; each states its contract.
#![allow(unsafe_code)]

/// Whether [`init_global_pool`] pins the workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Pinning {
    /// Pin when the pool has one worker per CPU the process may use, and more than one.
    #[default]
    Auto,
    /// Always pin (worker i on the i-th allowed CPU, cycling).
    Always,
    /// Never pin (rayon's own behaviour).
    Never,
}

impl Pinning {
    /// Whether a pool of `workers` is pinned where the process may use `cpus` CPUs (0: unknown).
    fn pins(self, workers: usize, cpus: usize) -> bool {
        match self {
            Pinning::Auto => workers > 1 && workers == cpus,
            Pinning::Always => cpus > 0,
            Pinning::Never => false,
        }
    }

    /// Reads `KAPPA_PIN_THREADS` (`1` always, `0` never, anything else or unset: auto), the
    /// switch kappa's binaries and benchmarks offer.
    pub fn from_env() -> Self {
        match std::env::var("KAPPA_PIN_THREADS").as_deref() {
            Ok("1") => Pinning::Always,
            Ok("0") => Pinning::Never,
            _ => Pinning::Auto,
        }
    }
}

/// Builds rayon's global pool with `threads` workers (0: rayon's own count, from
/// `RAYON_NUM_THREADS` or the number of CPUs), pinned as `pinning` says, and returns whether
/// it pinned them.
///
/// Errors: rayon's, when the global pool already exists (it starts on first use) or its
/// threads cannot be started.
pub fn init_global_pool(
    threads: usize,
    pinning: Pinning,
) -> Result<bool, rayon::ThreadPoolBuildError> {
    let count = match threads {
        0 => std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n: &usize| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        n => n,
    };
    let (builder, pin) = pool_builder(count, pinning);
    builder.build_global()?;
    // Only the first successful build reaches here, so the cell is empty.
    let _ = GLOBAL_POOL_PINNED.set(pin);
    Ok(pin)
}

/// A rayon pool builder of `threads` workers (at least one), pinned as `pinning` says, and
/// whether it pins: for a pool of one's own, as [`init_global_pool`] sets up the global one.
pub fn pool_builder(threads: usize, pinning: Pinning) -> (rayon::ThreadPoolBuilder, bool) {
    let threads = threads.max(1);
    if pinning.pins(threads, allowed_cpus().len()) {
        (pinned_pool_builder(threads), true)
    } else {
        (rayon::ThreadPoolBuilder::new().num_threads(threads), false)
    }
}

/// Set by [`init_global_pool`].
static GLOBAL_POOL_PINNED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// rayon's global pool in words, for a run's records: its worker count and whether
/// [`init_global_pool`] pinned them, e.g. `rayon: 2 workers, pinned` (starts the pool with
/// rayon's defaults if nothing has yet).
pub fn global_pool_description() -> String {
    let workers = rayon::current_num_threads();
    let how = match GLOBAL_POOL_PINNED.get() {
        Some(true) => "pinned",
        Some(false) => "not pinned",
        None => "not pinned (rayon's defaults)",
    };
    format!("rayon: {workers} workers, {how}")
}

/// A rayon pool builder of `threads` workers, worker i pinned to the i-th CPU the process may
/// run on (module docs). Finish it with `build()` or `build_global()`; a worker whose pinning
/// the system refuses runs unpinned.
pub fn pinned_pool_builder(threads: usize) -> rayon::ThreadPoolBuilder {
    let cpus = allowed_cpus();
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .start_handler(move |index| {
            if !cpus.is_empty() {
                pin_current_thread(cpus[index % cpus.len()]);
            }
        })
}

/// The CPUs the calling thread may run on, in increasing order (empty where that is unknown).
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `cpu_set_t` is plain data for which all-zero is the empty set;
        // `sched_getaffinity` writes at most `size_of::<cpu_set_t>()` bytes into it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: pid 0 is this thread; `set` is valid for `size` bytes.
        if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
            return Vec::new();
        }
        let max = 8 * size;
        // SAFETY: every index is below the set's capacity in bits.
        (0..max)
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
            .collect()
    }
    #[cfg(not(target_os = "linux"))]
    {
        Vec::new()
    }
}

/// Restricts the calling thread to `cpu` (Linux; a refusal leaves it as it was).
fn pin_current_thread(cpu: usize) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: as in `allowed_cpus`; `cpu` came from the process's own mask, so it is below
        // the set's capacity.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpu;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_pins_only_a_pool_with_a_worker_per_cpu() {
        for (workers, cpus, auto) in [(2, 2, true), (8, 8, true), (1, 1, false), (1, 2, false)] {
            assert_eq!(
                Pinning::Auto.pins(workers, cpus),
                auto,
                "{workers} on {cpus}"
            );
        }
        assert!(!Pinning::Auto.pins(3, 2) && !Pinning::Auto.pins(2, 0));
        assert!(Pinning::Always.pins(1, 4) && !Pinning::Always.pins(2, 0));
        assert!(!Pinning::Never.pins(2, 2));
    }

    #[test]
    fn workers_run_on_their_own_cpus() {
        let cpus = allowed_cpus();
        if cfg!(target_os = "linux") {
            assert!(!cpus.is_empty());
        }
        let pool = pinned_pool_builder(2).build().unwrap();
        let on = pool.broadcast(|_| current_affinity());
        for (i, mask) in on.iter().enumerate() {
            if let Some(&cpu) = cpus.get(i % cpus.len().max(1)) {
                assert_eq!(mask, &vec![cpu], "worker {i}");
            }
        }
    }

    /// The calling thread's CPUs.
    fn current_affinity() -> Vec<usize> {
        allowed_cpus()
    }
}
