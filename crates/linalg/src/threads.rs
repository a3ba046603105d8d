//! Rayon pools whose workers each stay on one CPU: [`pinned_pool_builder`].
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
//! Pinning is opt-in: two processes that each pin their workers to the first CPUs they may use
//! share those cores. A pool from [`pinned_pool_builder`] pins worker i to the i-th CPU of the
//! calling thread's affinity mask (the process's, which a cluster's scheduler sets to the job's
//! CPUs, unless the thread was restricted further), cycling when there are more workers than
//! CPUs. Elsewhere than Linux it builds an unpinned pool.
//!
//! ```
//! let pool = kappa_linalg::threads::pinned_pool_builder(2).build().unwrap();
//! let (a, b) = pool.install(|| rayon::join(|| 1, || 2));
//! assert_eq!(a + b, 3);
//! ```

// The affinity calls are FFI; each states its contract.
#![allow(unsafe_code)]

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
