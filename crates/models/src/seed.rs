//! Reproducible draws from libtorch's global generator.
//!
//! libtorch's CPU generator is one per process: two threads that seed it and draw (initialize a
//! model, sample inputs) at the same time interleave their draws, and neither gets the tensors
//! its seed promises. [`seeded`] holds a process-wide lock around the seed and the draws, so
//! every caller of it gets the same tensors in every run, whatever other threads do — as long
//! as they draw through [`seeded`] too.

static GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `f` with libtorch's global CPU generator seeded by `seed`, holding a process-wide lock
/// so that no other caller of `seeded` draws from the generator in between.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// let a = kappa_models::seeded(3, || Tensor::randn([4], (Kind::Float, Device::Cpu)));
/// let b = kappa_models::seeded(3, || Tensor::randn([4], (Kind::Float, Device::Cpu)));
/// assert!(a.equal(&b));
/// ```
pub fn seeded<T>(seed: u64, f: impl FnOnce() -> T) -> T {
    let _lock = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(seed as i64);
    f()
}
