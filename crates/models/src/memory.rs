//! How much memory this process may still take, and a check that a planned allocation fits.
//!
//! Sizes a user controls (a config key, a file header) are checked against [`budget`] before
//! anything is allocated, so that an impossible size is an error naming its key or file instead
//! of an abort (`memory allocation of … failed` under an address-space limit), a libtorch
//! `bad_alloc`, or minutes of swapping. The budget is the least of what the machine and the
//! process limits leave, each read from a file on Linux (no `unsafe`):
//!
//! | limit | read from | left |
//! |---|---|---|
//! | physical memory | `/proc/meminfo` `MemAvailable` | as read |
//! | cgroup v2 (Slurm, containers) | `/sys/fs/cgroup/memory.max`, `memory.current` | max − current |
//! | address space (`ulimit -v`) | `/proc/self/limits` "Max address space", `/proc/self/status` `VmSize` | limit − size |
//!
//! Where none can be read (another OS), the budget is [`FALLBACK_BYTES`]. A planned size is an
//! estimate from a formula (stated where it is made); it fits when it is at most the budget. The
//! check is a guard against sizes that cannot work, not a promise that one that passes will:
//! other allocations come after it.

use std::fmt;
use std::fs;

use crate::error::{ModelsError, Result};

/// The budget where no limit can be read: 16 GiB.
pub const FALLBACK_BYTES: u64 = 16 << 30;

/// Bytes this process may still allocate, and which limit set that figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The bytes left under the tightest limit.
    pub bytes: u64,
    /// The limit: `available memory`, `cgroup memory.max`, `address-space limit` or `fallback`.
    pub source: &'static str,
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", human_bytes(self.bytes as u128), self.source)
    }
}

/// The tightest of the limits in the module table, read now.
pub fn budget() -> Budget {
    let candidates = [
        (available_memory(), "available memory"),
        (cgroup_left(), "cgroup memory.max"),
        (address_space_left(), "address-space limit"),
    ];
    candidates
        .into_iter()
        .filter_map(|(bytes, source)| bytes.map(|bytes| Budget { bytes, source }))
        .min_by_key(|b| b.bytes)
        .unwrap_or(Budget {
            bytes: FALLBACK_BYTES,
            source: "fallback",
        })
}

/// `Ok` when `bytes` (`None`: the size overflowed) fits in [`budget`]; otherwise an
/// [`ModelsError::TooLarge`] saying what needed it (`what`, e.g. `the model's parameters and
/// AdamW state`) and which keys or file set the size (`culprit`, e.g. `model.n_embd,
/// model.n_layer` or a path).
pub fn ensure_fits(bytes: Option<u128>, what: &str, culprit: &str) -> Result<()> {
    let budget = budget();
    match bytes {
        Some(b) if b <= u128::from(budget.bytes) => Ok(()),
        _ => Err(ModelsError::TooLarge {
            culprit: culprit.to_string(),
            what: what.to_string(),
            needed: bytes.map_or_else(|| "more than 2^128 bytes".into(), human_bytes),
            budget: budget.to_string(),
        }),
    }
}

/// `n` bytes in binary units, three significant figures (`1.50 GiB`).
pub fn human_bytes(n: u128) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{n} B"),
        // Past 1024 EiB the figure only says "impossibly large": in powers of two.
        _ if value >= 1024.0 => format!("2^{:.1} B", (n as f64).log2()),
        _ => format!("{value:.3} {}", UNITS[unit]),
    }
}

/// A `key: value kB` line of a `/proc` file, in bytes.
fn proc_kib(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

fn available_memory() -> Option<u64> {
    proc_kib(&fs::read_to_string("/proc/meminfo").ok()?, "MemAvailable:")
}

fn cgroup_left() -> Option<u64> {
    let read = |f: &str| fs::read_to_string(format!("/sys/fs/cgroup/{f}")).ok();
    let max: u64 = read("memory.max")?.trim().parse().ok()?; // "max" (no limit) fails here
    let current: u64 = read("memory.current")?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

fn address_space_left() -> Option<u64> {
    let limits = fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    // "Max address space  <soft> <hard> bytes": the soft limit, "unlimited" when none.
    let soft: u64 = line["Max address space".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let used = proc_kib(&fs::read_to_string("/proc/self/status").ok()?, "VmSize:")?;
    Some(soft.saturating_sub(used))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_positive_and_an_overflowed_or_huge_size_is_an_error_naming_its_culprit() {
        let b = budget();
        assert!(b.bytes > 0, "{b}");
        assert!(ensure_fits(Some(1), "one byte", "x").is_ok());
        for size in [None, Some(u128::from(b.bytes) * 4 + (1 << 40))] {
            let err = ensure_fits(size, "the test's tensor", "model.n_embd").unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("model.n_embd") && text.contains("the test's tensor"),
                "{text}"
            );
        }
    }

    #[test]
    fn proc_lines_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(proc_kib(text, "MemAvailable:"), Some(2048 * 1024));
        assert_eq!(proc_kib(text, "VmSize:"), None);
        assert_eq!(human_bytes(1536), "1.500 KiB");
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(1 << 100), "2^100.0 B");
    }
}
