//! Tidy: no function in `crates/experiments/src` is longer than 150 lines, counted from its `fn`
//! line to the closing brace at the same indentation (rustfmt's layout), so that a report stays
//! a list of named steps rather than one long body. A failure names each file, line and
//! function, with its length.

use std::fs;
use std::path::{Path, PathBuf};

/// The longest a function may be, in lines.
const MAX_LINES: usize = 150;

/// One function of the source: where it starts, its name and its length in lines.
#[derive(Debug, PartialEq)]
struct Function {
    line: usize,
    name: String,
    lines: usize,
}

/// The name of the function that `line` declares (`pub(crate) const unsafe fn name<…>(…`), if
/// it declares one.
fn declared_fn(line: &str) -> Option<String> {
    let mut words = line.split_whitespace();
    let mut previous = "";
    while let Some(word) = words.next() {
        match word {
            "fn" => {
                let name: String = words
                    .next()?
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                return (!name.is_empty()).then_some(name);
            }
            "pub" | "const" | "async" | "unsafe" | "extern" | "default" => {}
            // `pub(crate)`, `pub(in some::path)`.
            w if w.starts_with("pub(") => {
                if !w.ends_with(')') {
                    words.by_ref().find(|w| w.ends_with(')'))?;
                }
            }
            // The ABI of `extern "C" fn`.
            w if previous == "extern" && w.starts_with('"') => {}
            _ => return None,
        }
        previous = word;
    }
    None
}

/// The length of the function declared at `lines[start]`: `None` for a declaration without a
/// body (a trait method), an error when no closing brace stands at its indentation.
fn length(lines: &[&str], start: usize) -> Result<Option<usize>, String> {
    for line in &lines[start..] {
        if line.contains('{') {
            break;
        }
        if line.trim_end().ends_with(';') {
            return Ok(None);
        }
    }
    let first = lines[start].trim_end();
    if first.contains('{')
        && first.ends_with('}')
        && first.matches('{').count() == first.matches('}').count()
    {
        return Ok(Some(1));
    }
    let indent = &first[..first.len() - first.trim_start().len()];
    let close = format!("{indent}}}");
    lines[start + 1..]
        .iter()
        .position(|l| l.trim_end() == close)
        .map(|p| Some(p + 2))
        .ok_or_else(|| format!("no closing brace at the indentation of line {}", start + 1))
}

/// Every function with a body in `source`, in order.
fn functions(source: &str) -> Result<Vec<Function>, String> {
    let lines: Vec<&str> = source.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = declared_fn(line) else {
            continue;
        };
        if let Some(n) = length(&lines, i)? {
            found.push(Function {
                line: i + 1,
                name,
                lines: n,
            });
        }
    }
    Ok(found)
}

/// The `.rs` files below `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|x| x == "rs") {
            files.push(path);
        }
    }
    files
}

#[test]
fn no_function_in_src_is_longer_than_150_lines() {
    let crate_dir = &kappa_testkit::crate_dir();
    let mut count = 0;
    let mut too_long = Vec::new();
    for file in rust_files(&crate_dir.join("src")) {
        let shown = file
            .strip_prefix(crate_dir)
            .unwrap_or(&file)
            .display()
            .to_string();
        let source = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{shown}: {e}"));
        let found = functions(&source).unwrap_or_else(|e| panic!("{shown}: {e}"));
        count += found.len();
        too_long.extend(
            found
                .into_iter()
                .filter(|f| f.lines > MAX_LINES)
                .map(|f| format!("{shown}:{} fn {}: {} lines", f.line, f.name, f.lines)),
        );
    }
    // The scanner must see the crate's functions at all (several hundred), or it proves nothing.
    assert!(count > 200, "only {count} functions found in src/");
    assert!(
        too_long.is_empty(),
        "functions longer than {MAX_LINES} lines (split them into named steps):\n{}",
        too_long.join("\n")
    );
}

#[test]
fn the_scanner_measures_from_fn_to_the_brace_at_its_indentation() {
    let source = r#"
pub trait T {
    fn declared(&self) -> u32;
    fn provided(&self) -> u32 {
        1
    }
}

pub(crate) fn one_line() -> u32 { 2 }

/// fn in a comment is no function.
fn long_signature(
    a: u32,
) -> u32
where
    u32: Copy,
{
    fn nested() {}
    let f = |x: fn(u32) -> u32| x(a);
    f(|y| y)
}
"#;
    let found = functions(source).unwrap();
    let summary: Vec<(&str, usize, usize)> = found
        .iter()
        .map(|f| (f.name.as_str(), f.line, f.lines))
        .collect();
    assert_eq!(
        summary,
        [
            ("provided", 4, 3),
            ("one_line", 9, 1),
            ("long_signature", 12, 10),
            ("nested", 18, 1),
        ]
    );
    assert!(functions("fn broken() {\n  }\n").is_err());
}
