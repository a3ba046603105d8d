//! Stopping a run on request, the way a cluster asks: Slurm sends SIGTERM before it preempts or
//! cancels a job, and the signal of `sbatch --signal` (SIGUSR1 by convention) before its time
//! limit, then kills it after a grace period.
//!
//! A [`StopFlag`] rides in the [`RunContext`](crate::RunContext). The [`Trainer`](crate::Trainer)
//! looks at it after every step: once it is raised, the trainer writes its checkpoint and returns
//! [`Outcome::Interrupted`](crate::Outcome::Interrupted), which the variant driver records as an
//! interrupted (resumable) run; resuming from that checkpoint ends with the same metrics as a run
//! that was never stopped (CPU, same threads). [`StopFlag::raise_on_signals`] raises it from
//! SIGTERM and SIGUSR1; a test raises it by hand.
//!
//! ```
//! let stop = kappa_train::StopFlag::default();
//! assert!(!stop.is_raised());
//! stop.clone().raise();
//! assert!(stop.is_raised(), "clones share the flag");
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared "stop at the next step" flag (clones share it).
#[derive(Clone, Debug, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    /// Asks every holder to stop at its next step.
    pub fn raise(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked for.
    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Raises the flag when the process receives SIGTERM or SIGUSR1 (instead of dying at once:
    /// the holder stops at its next step, so a process that must end promptly should exit soon
    /// after [`StopFlag::is_raised`] turns true).
    #[cfg(unix)]
    pub fn raise_on_signals(&self) -> std::io::Result<()> {
        use signal_hook::consts::{SIGTERM, SIGUSR1};
        for signal in [SIGTERM, SIGUSR1] {
            signal_hook::flag::register(signal, Arc::clone(&self.0))?;
        }
        Ok(())
    }

    /// Raises the flag on SIGTERM or SIGUSR1: a no-op where there are no such signals.
    #[cfg(not(unix))]
    pub fn raise_on_signals(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Not part of a context's identity: every two flags compare equal (a resumed run's context
/// equals the one it was started with).
impl PartialEq for StopFlag {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
