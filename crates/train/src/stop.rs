//! Stopping a run on request, the way a cluster asks: Slurm sends SIGTERM before it preempts or
//! cancels a job, and the signal of `sbatch --signal` (SIGUSR1 by convention) before its time
//! limit, then kills it after a grace period.
//!
//! A [`StopFlag`] rides in the [`RunContext`](crate::RunContext). The [`Trainer`](crate::Trainer)
//! looks at it after every step: once it is raised, the trainer writes its checkpoint and returns
//! [`Outcome::Interrupted`](crate::Outcome::Interrupted), which the variant driver records as an
//! interrupted (resumable) run; resuming from that checkpoint ends with the same metrics as a run
//! that was never stopped (CPU, same threads). [`StopFlag::raise_on_signals`] raises it from
//! SIGTERM, SIGUSR1 and SIGINT (Ctrl-C; a second Ctrl-C exits at once); a test raises it by hand.
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

    /// Raises the flag when the process receives SIGTERM, SIGUSR1 or SIGINT (Ctrl-C) instead of
    /// dying at once: the holder stops at its next step, so a process that must end promptly
    /// should exit soon after [`StopFlag::is_raised`] turns true. A SIGINT that arrives while
    /// the flag is already raised (a second Ctrl-C) exits the process at once with status 130
    /// (128 + SIGINT, the shell's convention).
    #[cfg(unix)]
    pub fn raise_on_signals(&self) -> std::io::Result<()> {
        use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
        // Registered first, so it sees the flag as it was before this signal raised it.
        signal_hook::flag::register_conditional_shutdown(SIGINT, 130, Arc::clone(&self.0))?;
        for signal in [SIGTERM, SIGUSR1, SIGINT] {
            signal_hook::flag::register(signal, Arc::clone(&self.0))?;
        }
        Ok(())
    }

    /// Raises the flag on SIGTERM, SIGUSR1 or SIGINT: a no-op where there are no such signals.
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

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::{Duration, Instant};

    /// Run by [`a_second_ctrl_c_exits_at_once_with_130`] in a child process: a first SIGINT only
    /// raises the flag, a second ends the process.
    #[test]
    fn child_that_receives_two_ctrl_cs() {
        if std::env::var_os("KAPPA_STOP_CHILD").is_none() {
            return;
        }
        let stop = StopFlag::default();
        stop.raise_on_signals().unwrap();
        let me = std::process::id().to_string();
        Command::new("kill").args(["-INT", &me]).status().unwrap();
        let raised = Instant::now();
        while !stop.is_raised() && raised.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(stop.is_raised(), "the first Ctrl-C raises the flag");
        eprintln!("first Ctrl-C survived");
        Command::new("kill").args(["-INT", &me]).status().unwrap();
        std::thread::sleep(Duration::from_secs(20));
        eprintln!("second Ctrl-C ignored");
    }

    #[test]
    fn a_second_ctrl_c_exits_at_once_with_130() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "stop::tests::child_that_receives_two_ctrl_cs",
                "--nocapture",
            ])
            .env("KAPPA_STOP_CHILD", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("first Ctrl-C survived"), "{stderr}");
        assert_eq!(out.status.code(), Some(130), "{stderr}");
        assert!(!stderr.contains("second Ctrl-C ignored"), "{stderr}");
    }
}
