//! Tidy checks over the whole workspace: conventions that no compiler enforces.

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::{Path, PathBuf};

    use crate::workspace::Workspace;

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if name == "target" || name.to_string_lossy().starts_with('.') {
                continue;
            }
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every Rust file in the workspace starts with a `//!` line saying what it is for.
    #[test]
    fn every_module_has_a_module_doc() {
        let ws = Workspace::locate().unwrap();
        let mut files = Vec::new();
        for dir in ["crates", "xtask", "benches"] {
            rust_files(&ws.root().join(dir), &mut files);
        }
        assert!(files.len() > 10, "found only {} Rust files", files.len());
        let missing: Vec<String> = files
            .iter()
            .filter(|f| {
                let text = fs::read_to_string(f).unwrap_or_default();
                let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                !first.starts_with("//!")
            })
            .map(|f| f.strip_prefix(ws.root()).unwrap_or(f).display().to_string())
            .collect();
        assert!(
            missing.is_empty(),
            "these files do not start with a `//!` module doc:\n{}",
            missing.join("\n")
        );
    }
}
