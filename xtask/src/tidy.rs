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
        ("kappa-dist", 1),
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

    /// Docs that cannot drift from the code: the experiments of the registry, the workspace's
    /// crates and each crate's public modules are named where readers look for them, and no doc
    /// speaks of how the project was built. Each check is a function over file contents, so a
    /// fixture test can leave a name out and see it fail.
    mod docs {
        use std::fs;
        use std::path::{Path, PathBuf};

        use super::files_with;
        use crate::workspace::Workspace;

        /// The names in `names` that `text` never mentions as `` `name` ``.
        fn unnamed<'a>(text: &str, names: &[&'a str]) -> Vec<&'a str> {
            names
                .iter()
                .filter(|n| !text.contains(&format!("`{n}`")))
                .copied()
                .collect()
        }

        /// The first cell of every row of the first Markdown table after the line `heading`
        /// (the header and separator rows included, which name no crate).
        fn first_cells_after(text: &str, heading: &str) -> Vec<String> {
            text.lines()
                .skip_while(|l| l.trim() != heading)
                .skip(1)
                .skip_while(|l| !l.trim_start().starts_with('|'))
                .take_while(|l| l.trim_start().starts_with('|'))
                .filter_map(|l| l.trim().trim_start_matches('|').split('|').next())
                .map(|c| c.trim().to_string())
                .collect()
        }

        /// The names in `names` that no cell of `cells` mentions as `` `name` ``.
        fn missing_from_cells(cells: &[String], names: &[String]) -> Vec<String> {
            names
                .iter()
                .filter(|n| !cells.iter().any(|c| c.contains(&format!("`{n}`"))))
                .cloned()
                .collect()
        }

        /// The package names of the workspace's members (the root manifest's `members`).
        fn workspace_crates(root: &Path) -> Vec<String> {
            let manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap();
            let members: Vec<&str> = manifest
                .lines()
                .skip_while(|l| !l.trim_start().starts_with("members"))
                .skip(1)
                .take_while(|l| !l.trim_start().starts_with(']'))
                .filter_map(|l| l.trim().trim_end_matches(',').strip_prefix('"'))
                .map(|l| l.trim_end_matches('"'))
                .collect();
            members
                .iter()
                .map(|m| {
                    let text = fs::read_to_string(root.join(m).join("Cargo.toml")).unwrap();
                    text.lines()
                        .find_map(|l| l.trim().strip_prefix("name = "))
                        .map(|n| n.trim_matches('"').to_string())
                        .unwrap_or_else(|| panic!("{m}/Cargo.toml has no package name"))
                })
                .collect()
        }

        /// The modules a crate root declares public (`pub mod NAME;`).
        fn public_modules(lib_rs: &str) -> Vec<String> {
            lib_rs
                .lines()
                .filter_map(|l| l.trim().strip_prefix("pub mod "))
                .map(|l| l.trim_end_matches(';').trim().to_string())
                .collect()
        }

        /// The first cells of a crate root's `//!` module table (rows `//! | … |`), empty when
        /// the crate docs have none.
        fn module_table_cells(lib_rs: &str) -> Vec<String> {
            lib_rs
                .lines()
                .filter_map(|l| l.trim().strip_prefix("//! |"))
                .filter_map(|row| row.split('|').next())
                .map(|c| c.trim().to_string())
                .collect()
        }

        /// The public modules a crate root's module table leaves out; nothing when it has no
        /// module table.
        fn modules_missing_from_table(lib_rs: &str) -> Vec<String> {
            let cells = module_table_cells(lib_rs);
            if !cells.iter().any(|c| c == "module") {
                return Vec::new();
            }
            missing_from_cells(&cells, &public_modules(lib_rs))
        }

        /// Phrases that speak of how the project was built rather than of what is true now
        /// (working periods, tracker numbers, machines, dated results). Matched in lower case at
        /// the start of a word.
        const HISTORY: &[&str] = &[
            "session",
            "issue #",
            "the issue's",
            "build machine",
            "the project's 2-core",
            "the project's machine",
            "loaded machine",
            "earlier results",
            "earlier figures",
            "earlier tables",
            "today",
            "goal",
            "we fixed",
            "another engineer",
        ];

        /// Whether `line` holds an ISO date (`2026-12-03`).
        fn has_date(line: &str) -> bool {
            let b = line.as_bytes();
            let digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
            (0..b.len().saturating_sub(9)).any(|i| {
                let w = &b[i..i + 10];
                digits(&w[..4])
                    && w[4] == b'-'
                    && digits(&w[5..7])
                    && w[7] == b'-'
                    && digits(&w[8..])
            })
        }

        /// Whether `line` speaks of an issue by number (`issue 5`, `issue #12`).
        fn has_issue_number(line: &str) -> bool {
            line.match_indices("issue ")
                .any(|(i, _)| line[i + 6..].starts_with(|c: char| c.is_ascii_digit()))
        }

        /// The lines of `text` that speak of how the project was built, each with what gave it
        /// away; dates are allowed where `dates_allowed` (a generated page that says when its
        /// numbers were taken).
        fn history_lines(text: &str, dates_allowed: bool) -> Vec<(usize, String)> {
            let starts_word = |l: &str, i: usize| {
                !l[..i]
                    .chars()
                    .next_back()
                    .is_some_and(char::is_alphanumeric)
            };
            let mut hits = Vec::new();
            for (n, line) in text.lines().enumerate() {
                let lower = line.to_lowercase();
                let phrase = HISTORY
                    .iter()
                    .find(|p| lower.match_indices(*p).any(|(i, _)| starts_word(&lower, i)));
                let why = match phrase {
                    Some(p) => format!("\"{p}\""),
                    None if has_issue_number(&lower) => "an issue number".into(),
                    None if !dates_allowed && has_date(line) => "a date".into(),
                    None => continue,
                };
                hits.push((n + 1, why));
            }
            hits
        }

        /// The docs a reader meets: the README, `docs/*.md` and every crate's README (the
        /// CHANGELOG, which is history by design, and the generated report are not among them).
        pub(super) fn reader_docs(root: &Path) -> Vec<PathBuf> {
            let mut docs = vec![root.join("README.md")];
            let mut md = Vec::new();
            files_with(&root.join("docs"), &["md"], &mut md);
            docs.extend(
                md.into_iter()
                    .filter(|p| p.parent() == Some(&root.join("docs"))),
            );
            let mut readmes = Vec::new();
            for dir in ["crates", "python", "benches", "xtask"] {
                files_with(&root.join(dir), &["md"], &mut readmes);
            }
            docs.extend(readmes.into_iter().filter(|p| p.ends_with("README.md")));
            docs
        }

        #[test]
        fn every_experiment_of_the_registry_is_named_in_the_readme_and_reproduction_md() {
            let ws = Workspace::locate().unwrap();
            for doc in ["README.md", "docs/reproduction.md"] {
                let text = fs::read_to_string(ws.root().join(doc)).unwrap();
                let missing = unnamed(&text, kappa_cli::EXPERIMENTS);
                assert!(missing.is_empty(), "{doc} does not name {missing:?}");
            }
        }

        #[test]
        fn the_readmes_crate_table_lists_every_workspace_crate() {
            let ws = Workspace::locate().unwrap();
            let readme = fs::read_to_string(ws.root().join("README.md")).unwrap();
            let crates = workspace_crates(ws.root());
            assert!(crates.len() >= 10, "found only {crates:?}");
            let missing = missing_from_cells(&first_cells_after(&readme, "## Crates"), &crates);
            assert!(
                missing.is_empty(),
                "README.md's crate table lacks {missing:?}"
            );
        }

        #[test]
        fn every_module_table_names_each_public_module_of_its_crate() {
            let ws = Workspace::locate().unwrap();
            let mut roots = Vec::new();
            files_with(&ws.root().join("crates"), &["rs"], &mut roots);
            roots.retain(|p| p.ends_with("src/lib.rs"));
            assert!(roots.len() >= 8, "found only {} crate roots", roots.len());
            let wrong: Vec<String> = roots
                .iter()
                .filter_map(|p| {
                    let missing = modules_missing_from_table(&fs::read_to_string(p).unwrap());
                    let rel = p.strip_prefix(ws.root()).unwrap_or(p).display();
                    (!missing.is_empty()).then(|| format!("{rel}'s module table lacks {missing:?}"))
                })
                .collect();
            assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        }

        #[test]
        fn no_doc_speaks_of_how_the_project_was_built() {
            let ws = Workspace::locate().unwrap();
            let docs = reader_docs(ws.root());
            assert!(docs.len() > 10, "found only {} docs", docs.len());
            let hits: Vec<String> = docs
                .iter()
                .flat_map(|p| {
                    let text = fs::read_to_string(p).unwrap_or_default();
                    let rel = p.strip_prefix(ws.root()).unwrap_or(p).display().to_string();
                    // Generated pages carry the date and commit of the run that wrote them.
                    let generated = ["docs/performance.md", "docs/performance-python.md"]
                        .contains(&rel.as_str());
                    history_lines(&text, generated)
                        .into_iter()
                        .map(move |(n, why)| format!("{rel}:{n}: {why}"))
                })
                .collect();
            assert!(
                hits.is_empty(),
                "docs say how the project was built (say what is true now; history goes in the \
                 CHANGELOG and commit messages):\n{}",
                hits.join("\n")
            );
        }

        /// The phrases of [`HISTORY`] that never describe code: in doc comments "today's"
        /// (the current version of a type) and "goal" (a benchmark's target) are ordinary words.
        const HISTORY_IN_CODE: &[&str] = &[
            "session",
            "issue #",
            "the issue's",
            "build machine",
            "the project's machine",
            "earlier results",
            "earlier figures",
            "we fixed",
            "another engineer",
        ];

        /// The doc-comment lines (`//!`, `///`) of a Rust file that speak of how the project was
        /// built: a phrase of [`HISTORY_IN_CODE`] at the start of a word, or an issue number.
        fn history_in_doc_comments(text: &str) -> Vec<(usize, String)> {
            let mut hits = Vec::new();
            for (n, line) in text.lines().enumerate() {
                let doc = line.trim_start();
                if !(doc.starts_with("//!") || doc.starts_with("///")) {
                    continue;
                }
                let lower = doc.to_lowercase();
                let phrase = HISTORY_IN_CODE.iter().find(|p| {
                    lower.match_indices(*p).any(|(i, _)| {
                        !lower[..i]
                            .chars()
                            .next_back()
                            .is_some_and(char::is_alphanumeric)
                    })
                });
                match phrase {
                    Some(p) => hits.push((n + 1, format!("\"{p}\""))),
                    None if has_issue_number(&lower) => {
                        hits.push((n + 1, "an issue number".into()))
                    }
                    None => {}
                }
            }
            hits
        }

        /// What rustdoc shows a reader follows the same rule as the Markdown docs.
        #[test]
        fn no_doc_comment_speaks_of_how_the_project_was_built() {
            let ws = Workspace::locate().unwrap();
            let mut files = Vec::new();
            for dir in ["crates", "xtask", "benches", "python"] {
                files_with(&ws.root().join(dir), &["rs"], &mut files);
            }
            // This file holds the phrases themselves, and fixtures that use them.
            files.retain(|f| !f.ends_with("xtask/src/tidy.rs"));
            assert!(files.len() > 50, "found only {} Rust files", files.len());
            let hits: Vec<String> = files
                .iter()
                .flat_map(|p| {
                    let text = fs::read_to_string(p).unwrap_or_default();
                    let rel = p.strip_prefix(ws.root()).unwrap_or(p).display().to_string();
                    history_in_doc_comments(&text)
                        .into_iter()
                        .map(move |(n, why)| format!("{rel}:{n}: {why}"))
                })
                .collect();
            assert!(
                hits.is_empty(),
                "doc comments say how the project was built (say what is true now):\n{}",
                hits.join("\n")
            );
        }

        #[test]
        fn a_doc_comment_that_speaks_of_how_it_was_built_is_caught() {
            let code = "//! The step (issue 6's four parts).\n\
                        /// Measured in session 21.\n\
                        // issue 5: a plain comment is not documentation.\n\
                        /// A key that today's `C` has; the goal ≥ 3 of this benchmark.\n\
                        let s = \"issue 7\";\n";
            let hits = history_in_doc_comments(code);
            assert_eq!(
                hits,
                [
                    (1, "an issue number".to_string()),
                    (2, "\"session\"".to_string())
                ]
            );
        }

        #[test]
        fn a_doc_that_leaves_an_experiment_out_is_caught() {
            let names = ["theory", "lra", "bert-sentiment"];
            assert!(unnamed("`theory`, `lra` and `bert-sentiment`", &names).is_empty());
            assert_eq!(unnamed("`theory` and `lra`", &names), ["bert-sentiment"]);
            // A name inside another word or without its backticks does not count.
            assert_eq!(
                unnamed("`theory`, lra, `bert-sentiments`", &names),
                ["lra", "bert-sentiment"]
            );
        }

        #[test]
        fn a_crate_table_that_leaves_a_crate_out_is_caught() {
            let readme = "# x\n\n## Crates\n\n| crate | what |\n|---|---|\n\
                          | [`kappa-linalg`](crates/linalg) | SVD |\n| `xtask` | commands |\n\n\
                          Below the table: `kappa-optim`.\n";
            let cells = first_cells_after(readme, "## Crates");
            let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            assert!(missing_from_cells(&cells, &names(&["kappa-linalg", "xtask"])).is_empty());
            // Named only below the table, or in another column, is not listed.
            assert_eq!(
                missing_from_cells(&cells, &names(&["kappa-linalg", "kappa-optim", "xtask"])),
                ["kappa-optim"]
            );
            assert_eq!(
                missing_from_cells(&cells, &names(&["SVD"])),
                ["SVD"],
                "a second column is not the crate's name"
            );
        }

        #[test]
        fn a_module_table_that_leaves_a_public_module_out_is_caught() {
            let lib = "//! # Principal items\n//!\n//! | module | items |\n//! |---|---|\n\
                       //! | [`svd`] | the SVD |\n//! | [`exp`](mod@exp) | e^x |\n\
                       //! | `batched` (with `tch`) | batches |\n\npub mod svd;\npub mod exp;\n\
                       #[cfg(feature = \"tch\")]\npub mod batched;\nmod private;\n";
            assert!(modules_missing_from_table(lib).is_empty());
            let more = format!("{lib}pub mod product;\n");
            assert_eq!(modules_missing_from_table(&more), ["product"]);
            // A module named only in the items column is still missing from the table.
            let items_only = more.replace("| e^x |", "| e^x, see `product` |");
            assert_eq!(modules_missing_from_table(&items_only), ["product"]);
            // A crate root without a module table has nothing to check.
            assert!(modules_missing_from_table("//! A crate.\npub mod a;\n").is_empty());
        }

        #[test]
        fn a_doc_that_speaks_of_how_it_was_built_is_caught() {
            let clean =
                "The step takes 0.9× torch's time on one AVX-512 core (docs/performance.md).\n\
                         A subgoal of the issue: 12026-1 is no date.\n";
            assert!(history_lines(clean, false).is_empty());
            let dirty = "### Results (2026-12-03)\n\
                         Measured in session 21.\n\
                         Measured today on the build machine.\n\
                         The goal ≤ 0.8 holds.\n\
                         As issue 5 reported.\n\
                         Earlier results below.\n";
            let hits: Vec<usize> = history_lines(dirty, false).iter().map(|h| h.0).collect();
            assert_eq!(hits, [1, 2, 3, 4, 5, 6]);
            assert_eq!(history_lines(dirty, false)[0].1, "a date");
            // A generated page may say when its numbers were taken, and nothing else of the kind.
            assert_eq!(history_lines(dirty, true).len(), 5);
        }
    }

    /// Links that lead nowhere: a relative Markdown link to a file that does not exist or to a
    /// heading its target does not have, and a `docs/<name>.md` mention (in a comment, a config or
    /// a doc) of a page that does not exist or of a section the page does not have. Each check is
    /// a function over file contents and a lookup of the files it points to, so a fixture test
    /// can see it fail.
    mod links {
        use std::collections::HashMap;
        use std::fs;
        use std::path::{Component, Path, PathBuf};

        use super::docs::reader_docs;
        use super::files_with;
        use crate::workspace::Workspace;

        /// `path` with `.` and `..` resolved lexically (what a link's target names).
        fn normalize(path: &Path) -> PathBuf {
            let mut out = PathBuf::new();
            for part in path.components() {
                match part {
                    Component::CurDir => {}
                    Component::ParentDir => {
                        out.pop();
                    }
                    other => out.push(other),
                }
            }
            out
        }

        /// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as `-`.
        fn slug(heading: &str) -> String {
            heading
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        }

        /// The lines of `text` outside fenced code blocks, numbered from 1.
        fn prose_lines(text: &str) -> Vec<(usize, &str)> {
            let mut fenced = false;
            let mut out = Vec::new();
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("```") {
                    fenced = !fenced;
                } else if !fenced {
                    out.push((n + 1, line));
                }
            }
            out
        }

        /// The anchors of a Markdown text's headings (a repeated heading's get `-1`, `-2`, …).
        fn anchors(text: &str) -> Vec<String> {
            let mut seen: HashMap<String, usize> = HashMap::new();
            prose_lines(text)
                .into_iter()
                .filter_map(|(_, l)| l.strip_prefix('#'))
                .map(|h| slug(h.trim_start_matches('#')))
                .map(|a| {
                    let count = seen.entry(a.clone()).or_insert(0);
                    *count += 1;
                    if *count == 1 {
                        a
                    } else {
                        format!("{a}-{}", *count - 1)
                    }
                })
                .collect()
        }

        /// The targets of a Markdown text's inline links (`[text](target)`, images included)
        /// that stay in the repository: no scheme (`https:`, `mailto:`).
        fn relative_links(text: &str) -> Vec<(usize, String)> {
            let mut out = Vec::new();
            for (n, line) in prose_lines(text) {
                for (i, _) in line.match_indices("](") {
                    let rest = &line[i + 2..];
                    let target = rest.split([')', ' ']).next().unwrap_or("");
                    // A path: no scheme, no brackets or commas (`P[i,m](V[m,c] − …)` is math).
                    let path_like = target
                        .chars()
                        .all(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '/' | '#' | '-'));
                    if !target.is_empty() && path_like {
                        out.push((n, target.to_string()));
                    }
                }
            }
            out
        }

        /// The relative links of `doc` (at `doc_path`) that lead nowhere, each with why;
        /// `lookup` gives the text of an existing file (empty for a folder or a file that is not
        /// text) and `None` for a missing one.
        fn broken_links(
            doc_path: &Path,
            doc: &str,
            lookup: &dyn Fn(&Path) -> Option<String>,
        ) -> Vec<(usize, String)> {
            let dir = doc_path.parent().unwrap_or(Path::new(""));
            let mut out = Vec::new();
            for (n, target) in relative_links(doc) {
                let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let (path, text) = if file.is_empty() {
                    (doc_path.to_path_buf(), Some(doc.to_string()))
                } else {
                    let path = normalize(&dir.join(file));
                    let text = lookup(&path);
                    (path, text)
                };
                match text {
                    None => out.push((n, format!("{target}: no such file"))),
                    Some(text)
                        if !anchor.is_empty()
                            && path.extension().is_some_and(|e| e == "md")
                            && !anchors(&text).iter().any(|a| a == anchor) =>
                    {
                        out.push((n, format!("{target}: no such heading")))
                    }
                    Some(_) => {}
                }
            }
            out
        }

        /// A `docs/<name>.md` mention: its line, the page (from the repository's root), and the
        /// section it names when a quoted title follows (`docs/optim.md, "Math"`).
        struct Mention {
            line: usize,
            page: String,
            section: Option<String>,
        }

        /// The quoted title after a mention (`, "Title"`, ` ("Title"`, ` "Title"`); a quote right
        /// after the name closes a string literal and names nothing.
        fn quoted_section(rest: &str) -> Option<String> {
            let after = rest.strip_prefix(',').unwrap_or(rest);
            let after = after.trim_start();
            let after = after.strip_prefix('(').unwrap_or(after);
            if after.len() == rest.len() {
                return None;
            }
            let (title, _) = after.strip_prefix('"')?.split_once('"')?;
            title
                .starts_with(char::is_alphabetic)
                .then(|| title.to_string())
        }

        /// The `docs/<name>.md` pages that `text` mentions, with the sections they name.
        fn docs_mentions(text: &str) -> Vec<Mention> {
            let mut out = Vec::new();
            for (n, line) in text.lines().enumerate() {
                for (i, _) in line.match_indices("docs/") {
                    let inside_a_word = line[..i]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'));
                    let name: String = line[i + 5..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                        .collect();
                    let name = name.trim_end_matches('.');
                    if !inside_a_word && name.len() > 3 && name.ends_with(".md") {
                        out.push(Mention {
                            line: n + 1,
                            page: format!("docs/{name}"),
                            section: quoted_section(&line[i + 5 + name.len()..]),
                        });
                    }
                }
            }
            out
        }

        /// A title as [`section_titles`] compares it: no backticks or stars, lower case.
        fn plain(title: &str) -> String {
            let kept: String = title.chars().filter(|c| !matches!(c, '`' | '*')).collect();
            kept.trim().to_lowercase()
        }

        /// The titles a mention may name: a page's headings and bold paragraph openings
        /// (`**The memory allocator: …**`).
        fn section_titles(page: &str) -> Vec<String> {
            prose_lines(page)
                .into_iter()
                .filter_map(|(_, l)| {
                    l.strip_prefix('#')
                        .map(|h| h.trim_start_matches('#'))
                        .or_else(|| l.strip_prefix("**"))
                })
                .map(plain)
                .collect()
        }

        /// Why `mention` leads nowhere, if it does: its page does not exist under `root`, or no
        /// title of the page starts with the section it names.
        fn mention_problem(
            root: &Path,
            mention: &Mention,
            lookup: &dyn Fn(&Path) -> Option<String>,
        ) -> Option<String> {
            let Some(page) = lookup(&root.join(&mention.page)) else {
                return Some(format!("{} does not exist", mention.page));
            };
            let section = mention.section.as_ref()?;
            let wanted = plain(section);
            let found = section_titles(&page).iter().any(|t| t.starts_with(&wanted));
            (!found).then(|| format!("{}, \"{section}\": no such section", mention.page))
        }

        /// The files whose links and mentions are checked: the docs a reader meets, and every
        /// Rust file and TOML file (code comments and configs) of the workspace.
        fn checked_files(root: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
            let mut sources = Vec::new();
            for dir in [
                "crates",
                "xtask",
                "benches",
                "python",
                "experiments",
                "examples",
            ] {
                files_with(&root.join(dir), &["rs", "toml"], &mut sources);
            }
            sources.push(root.join("Cargo.toml"));
            (reader_docs(root), sources)
        }

        #[test]
        fn every_link_and_docs_mention_leads_to_a_file_and_heading_that_exist() {
            let ws = Workspace::locate().unwrap();
            let root = ws.root();
            let lookup = |p: &Path| {
                p.exists()
                    .then(|| fs::read_to_string(p).unwrap_or_default())
            };
            let (docs, sources) = checked_files(root);
            assert!(
                docs.len() > 10 && sources.len() > 100,
                "found too few files"
            );
            let mut wrong = Vec::new();
            for file in docs.iter().chain(&sources) {
                let text = fs::read_to_string(file).unwrap_or_default();
                let rel = file
                    .strip_prefix(root)
                    .unwrap_or(file)
                    .display()
                    .to_string();
                let is_doc = docs.contains(file);
                if is_doc {
                    for (n, why) in broken_links(file, &text, &lookup) {
                        wrong.push(format!("{rel}:{n}: {why}"));
                    }
                }
                for mention in docs_mentions(&text) {
                    if let Some(why) = mention_problem(root, &mention, &lookup) {
                        wrong.push(format!("{rel}:{}: {why}", mention.line));
                    }
                }
            }
            assert!(
                wrong.is_empty(),
                "links and mentions that lead nowhere (point them to where the content lives \
                 now):\n{}",
                wrong.join("\n")
            );
        }

        #[test]
        fn a_link_to_a_missing_file_or_heading_is_caught() {
            let page = "# B\n\n## Two words, `code` and λ·I_k\n\n## Same\n\n## Same\n";
            // Paths built at run time so that this file does not mention them.
            let in_docs = |name: &str| PathBuf::from(["docs/", name, ".md"].concat());
            let files: HashMap<PathBuf, &str> = [
                (in_docs("b"), page),
                (PathBuf::from("crates/linalg"), ""),
                (PathBuf::from("README.md"), "# kappa\n"),
            ]
            .into_iter()
            .collect();
            let lookup = |p: &Path| files.get(p).map(|t| t.to_string());
            let doc = "# A\n\nSee [b](b.md), [its section](b.md#two-words-code-and-λi_k), \
                       [the second](b.md#same-1), [the crate](../crates/linalg), \
                       [home](../README.md), [up](#a), [the web](https://x.org/gone.md), \
                       P[i,m](V[m,c] − A).\n\
                       ```text\n[in code](gone.md)\n```\n\
                       Broken: [gone](gone.md), [no section](b.md#missing), [no own](#nope), \
                       [third](b.md#same-2).\n";
            let broken = broken_links(&in_docs("a"), doc, &lookup);
            let why: Vec<&str> = broken.iter().map(|(_, w)| w.as_str()).collect();
            assert_eq!(
                why,
                [
                    "gone.md: no such file",
                    "b.md#missing: no such heading",
                    "#nope: no such heading",
                    "b.md#same-2: no such heading"
                ]
            );
            assert!(broken.iter().all(|(n, _)| *n == 7), "{broken:?}");
        }

        #[test]
        fn a_mention_of_a_missing_docs_page_or_section_is_caught() {
            // Built at run time so that this file does not mention the pages itself.
            let page = |name: &str| ["docs/", name, ".md"].concat();
            // A path inside another word, a page in a subfolder and a name without `.md` are
            // not mentions of a page; a quote right after the name closes a string.
            let text = format!(
                "//! See {}, \"Math\".\n// and `{}`.\n// ({} (\"Traps\"), {} \"Gone\")\n\
                 // Not: mydocs/x.md, docs/results/report.md, docs/guide, join(\"{}\", \"x\").\n",
                page("optim"),
                page("gone"),
                page("optim"),
                page("optim"),
                page("optim"),
            );
            let mentions = docs_mentions(&text);
            let named: Vec<(usize, Option<&str>)> = mentions
                .iter()
                .map(|m| (m.line, m.section.as_deref()))
                .collect();
            assert_eq!(
                named,
                [
                    (1, Some("Math")),
                    (2, None),
                    (3, Some("Traps")),
                    (3, Some("Gone")),
                    (4, None)
                ]
            );
            let optim = "# Optim\n\n## Math\n\n**Traps and what the code does.** Text.\n";
            let lookup = |p: &Path| (p == Path::new(&page("optim"))).then(|| optim.to_string());
            let problems: Vec<String> = mentions
                .iter()
                .filter_map(|m| mention_problem(Path::new(""), m, &lookup))
                .collect();
            assert_eq!(
                problems,
                [
                    format!("{} does not exist", page("gone")),
                    format!("{}, \"Gone\": no such section", page("optim")),
                ]
            );
        }
    }
}
