//! A test's scratch folder, removed when the test ends, passing or failing.
//!
//! A test that writes checkpoints of full-width models leaves gigabytes behind if it removes
//! its folder only on success; repeated failing runs on one machine then fill its disk and turn
//! one failure into many. [`Scratch`] removes the folder on drop, which runs during a panic's
//! unwinding too.

use std::fs;
use std::path::{Path, PathBuf};

/// A fresh folder `kappa-<name>-<pid>` under the system's temporary folder, deleted with
/// everything in it when the value is dropped.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Creates the folder, first removing what an earlier process with the same id left.
    ///
    /// # Panics
    /// If the folder cannot be created (a test helper: the test fails with the reason).
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("kappa-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        Self { path }
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `self.path().join(rel)`.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.path.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::Scratch;

    #[test]
    fn the_folder_is_removed_when_a_test_panics() {
        let kept = std::panic::catch_unwind(|| {
            let s = Scratch::new("scratch-panics");
            std::fs::write(s.join("file"), b"x").unwrap();
            let path = s.path().to_path_buf();
            assert!(path.join("file").is_file());
            std::panic::panic_any(path);
        })
        .unwrap_err();
        let path = kept.downcast::<std::path::PathBuf>().unwrap();
        assert!(!path.exists(), "{} left behind", path.display());
    }
}
