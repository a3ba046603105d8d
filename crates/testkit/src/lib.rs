//! Test configuration shared by the workspace's property tests.
//!
//! Every property test takes its [`ProptestConfig`] from [`config`], so a verdict is a fact about
//! the code rather than about the day it ran:
//!
//! - **By default** (`cargo test`, `cargo xtask test`, CI) the generator is seeded with the fixed
//!   [`SEED`]: every run on every machine draws the same cases. Counterexamples kept in the
//!   regression files (below) are replayed first.
//! - **Exploring** (`KAPPA_EXPLORE=1`, which `cargo xtask test --explore` sets) draws fresh
//!   seeds and runs [`explore_factor`] times as many cases. A failure found there is shrunk and
//!   written to `<test file>.proptest-regressions` next to the test's source; commit that file
//!   and the case is replayed by every later run, in CI too. Then decide, as a finding, whether
//!   the claim or the test is wrong, and keep a named regression test for the case.
//!
//! ```
//! use proptest::prelude::*;
//!
//! // In a test file this is `proptest! { #![proptest_config(kappa_testkit::config(32))] … }`.
//! proptest!(kappa_testkit::config(32), |(a in 0u32..1000, b in 0u32..1000)| {
//!     prop_assert_eq!(a + b, b + a);
//! });
//! ```
//!
//! Besides the configuration: [`hostile`] (the bad-input harness), [`cli_cases`] (the same for
//! a command-line program: hostile files and configs, each run with a deadline and a memory
//! ceiling, checked for its exit status, its message and the files it must not touch),
//! [`binding`] (which library the dynamic linker binds a symbol to) [`imports`] (import
//! circles between a crate's modules) and [`Scratch`] (a test's folder, removed when the
//! test ends, passing or failing).

pub mod binding;
#[cfg(unix)]
pub mod cli_cases;
pub mod hostile;
pub mod imports;
pub mod scratch;

pub use scratch::Scratch;

use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence, RngSeed};

/// The seed of every non-exploring run ("kappa" in ASCII).
pub const SEED: u64 = 0x006b_6170_7061;

/// The environment variable that switches to fresh seeds and more cases.
pub const EXPLORE_VAR: &str = "KAPPA_EXPLORE";

/// The environment variable that sets the case multiplier of an exploring run (default 16).
pub const EXPLORE_FACTOR_VAR: &str = "KAPPA_EXPLORE_FACTOR";

/// Whether this run explores (fresh seeds, more cases).
pub fn exploring() -> bool {
    std::env::var(EXPLORE_VAR).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The case multiplier of an exploring run: `KAPPA_EXPLORE_FACTOR`, 16 when unset or unreadable.
pub fn explore_factor() -> u32 {
    std::env::var(EXPLORE_FACTOR_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&f| f > 0)
        .unwrap_or(16)
}

/// The configuration of a property test that runs `cases` cases in CI.
///
/// Fixed seed and `cases` cases by default; fresh seed and `cases × explore_factor()` cases when
/// exploring. Failures persist next to the test source in either mode (see the crate docs).
pub fn config(cases: u32) -> ProptestConfig {
    let explore = exploring();
    ProptestConfig {
        cases: if explore {
            cases.saturating_mul(explore_factor())
        } else {
            cases
        },
        rng_seed: if explore {
            RngSeed::Random
        } else {
            RngSeed::Fixed(SEED)
        },
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// The folder of the crate whose test, bench or example is running, read at run time from the
/// `CARGO_MANIFEST_DIR` cargo sets for it.
///
/// Not `env!("CARGO_MANIFEST_DIR")`: that is the folder the test was *compiled* in, and cargo
/// reuses a build from a shared target directory after the checkout moved (its fingerprints
/// of path crates are relative to the workspace), so a test would read another checkout's
/// files, or fail to find any. Panics with the reason outside cargo.
pub fn crate_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .expect("CARGO_MANIFEST_DIR is unset: run this through cargo (test, bench or run)")
}
