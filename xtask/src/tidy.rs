//! Tidy checks over the whole workspace: conventions that no compiler enforces.

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::{Path, PathBuf};

    use crate::workspace::Workspace;

    /// The files below `dir` whose extension is one of `exts` (skipping `target` and dot-folders).
    fn files_with(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
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
                files_with(&path, exts, out);
            } else if path
                .extension()
                .is_some_and(|e| exts.iter().any(|x| e == *x))
            {
                out.push(path);
            }
        }
    }

    /// Every Rust file in the workspace starts with a `//!` line saying what it is for (or, for a
    /// crate root, with its README included as the crate docs).
    #[test]
    fn every_module_has_a_module_doc() {
        let ws = Workspace::locate().unwrap();
        let mut files = Vec::new();
        for dir in ["crates", "xtask", "benches"] {
            files_with(&ws.root().join(dir), &["rs"], &mut files);
        }
        assert!(files.len() > 10, "found only {} Rust files", files.len());
        let missing: Vec<String> = files
            .iter()
            .filter(|f| {
                let text = fs::read_to_string(f).unwrap_or_default();
                let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                // A crate root may open with its README as the crate docs.
                !(first.starts_with("//!") || first.starts_with("#![doc = include_str!("))
            })
            .map(|f| f.strip_prefix(ws.root()).unwrap_or(f).display().to_string())
            .collect();
        assert!(
            missing.is_empty(),
            "these files do not start with a `//!` module doc:\n{}",
            missing.join("\n")
        );
    }

    /// The repository stands alone: no code or doc points to notes kept outside it (the theory
    /// each piece of code relies on is written in `docs/`).
    #[test]
    fn no_reference_leaves_the_repository() {
        let ws = Workspace::locate().unwrap();
        let mut files = vec![ws.root().join("README.md"), ws.root().join("CHANGELOG.md")];
        for dir in ["crates", "docs", "xtask", "benches"] {
            files_with(
                &ws.root().join(dir),
                &["rs", "md", "toml", "py"],
                &mut files,
            );
        }
        // Built at run time so that this file does not match itself.
        let patterns = [["notes ", "§"].concat(), ["shared", "/"].concat()];
        let hits: Vec<String> = files
            .iter()
            .flat_map(|f| {
                let text = fs::read_to_string(f).unwrap_or_default();
                let rel = f.strip_prefix(ws.root()).unwrap_or(f).display().to_string();
                text.lines()
                    .enumerate()
                    .filter(|(_, l)| patterns.iter().any(|p| l.contains(p.as_str())))
                    .map(|(i, l)| format!("{rel}:{}: {}", i + 1, l.trim()))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(
            hits.is_empty(),
            "references to notes outside the repository:\n{}",
            hits.join("\n")
        );
    }

    /// The layers of the workspace, lowest first (docs/architecture.md, "Crates and the direction
    /// of dependencies"): a crate depends only on crates of lower layers, so dependencies flow one
    /// way and each library can be used without the ones above it. `kappa-testkit` is dev-only:
    /// any crate may use it in tests, none in its library.
    const LAYERS: &[(&str, u32)] = &[
        ("kappa-testkit", 0),
        ("kappa-cli", 0),
        ("kappa-linalg", 1),
        ("kappa-attention", 2),
        ("kappa-optim", 2),
        ("kappa-models", 3),
        ("kappa-train", 4),
        ("kappa-experiments", 5),
        ("kappa-benches", 6),
        ("xtask", 6),
    ];

    /// The kappa crates named in one dependency table of a `Cargo.toml` (`[dependencies]`,
    /// `[dev-dependencies]`, `[build-dependencies]`, or a target-specific one ending so).
    fn kappa_dependencies(manifest: &str, table: &str) -> Vec<String> {
        let mut inside = false;
        let mut out = Vec::new();
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                let header = line.trim_matches(|c| c == '[' || c == ']');
                inside = header == table || header.ends_with(&format!(".{table}"));
                continue;
            }
            let name = line.split(['=', '.', ' ']).next().unwrap_or("");
            if inside && name.starts_with("kappa-") {
                out.push(name.to_string());
            }
        }
        out
    }

    #[test]
    fn dependencies_flow_from_higher_layers_to_lower_ones() {
        let ws = Workspace::locate().unwrap();
        let level = |name: &str| LAYERS.iter().find(|(n, _)| *n == name).map(|(_, l)| *l);
        let mut manifests = Vec::new();
        for dir in ["crates", "benches", "xtask"] {
            files_with(&ws.root().join(dir), &["toml"], &mut manifests);
        }
        manifests.retain(|m| m.file_name().is_some_and(|n| n == "Cargo.toml"));
        let mut wrong = Vec::new();
        for manifest in &manifests {
            let text = fs::read_to_string(manifest).unwrap();
            let Some(name) = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("name = "))
                .map(|n| n.trim_matches('"').to_string())
            else {
                continue;
            };
            let Some(own) = level(&name) else {
                wrong.push(format!(
                    "{name} is in no layer: add it to LAYERS and the doc"
                ));
                continue;
            };
            for table in ["dependencies", "build-dependencies"] {
                for dep in kappa_dependencies(&text, table) {
                    match level(&dep) {
                        _ if dep == "kappa-testkit" && !name.ends_with("benches") => {
                            wrong.push(format!("{name} uses the dev-only kappa-testkit"))
                        }
                        Some(l) if l < own || dep == "kappa-testkit" => {}
                        _ => wrong.push(format!("{name} (layer {own}) depends on {dep}")),
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        let doc = fs::read_to_string(ws.root().join("docs/architecture.md")).unwrap();
        for (name, _) in LAYERS {
            assert!(
                doc.contains(&format!("| `{name}` |")),
                "docs/architecture.md's table lacks {name}"
            );
        }
    }
}
