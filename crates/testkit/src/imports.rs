//! Import circles between the modules of a crate: which module uses which, read from the source
//! of `src/`, and the groups of modules that use each other.
//!
//! A module is a file of `src/` (`lib.rs` is the root, `a/mod.rs` and `a.rs` are `a`,
//! `a/b.rs` is `a::b`; inline modules such as `mod tests` belong to their file). Module A
//! *uses* module B when A's code (comments excluded, tests included) names a path into B:
//! `use crate::b::…`, `use super::b::…`, `use b::…` for a child `b`, an expression
//! `crate::b::f()`, or a `"crate::b"` string (serde's `with = "…"`). A path through a
//! re-export (`crate::Item` where `lib.rs` has `pub use b::Item`) is followed to the module
//! that defines the item. Re-exports themselves (`pub use`, `pub(crate) use`) are not uses:
//! a parent that only re-exports its children is a facade, not a dependency.
//!
//! A circle is a strongly connected component of more than one module: A uses B and B uses A,
//! directly or through others. [`assert_no_import_cycles`] fails on one, naming every use inside
//! it with its file and line ([`cycle_report`]).
//!
//! ```
//! use kappa_testkit::imports::{cycles, ModuleGraph};
//! let graph = ModuleGraph::from_sources(&[
//!     ("lib.rs", "mod a; mod b; pub use a::A;"),
//!     ("a.rs", "use crate::b::B; pub struct A(B);"),
//!     ("b.rs", "pub struct B; fn f() -> crate::A { todo!() }"),
//! ]);
//! assert_eq!(cycles(&graph), vec![vec!["a".to_string(), "b".to_string()]]);
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module's path from the crate root, as segments (`[]` is the root).
type Module = Vec<String>;

/// The uses between the file modules of one crate.
#[derive(Clone, Debug, Default)]
pub struct ModuleGraph {
    /// Every file module, by its `::`-joined path (`""` is the root).
    pub modules: BTreeSet<String>,
    /// `from → to → the first place (file:line) where `from` names a path into `to``.
    pub uses: BTreeMap<String, BTreeMap<String, String>>,
}

/// One lexical token of Rust source: enough to follow paths and braces.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
    Str(String),
}

/// A token and its line (1-based).
type Lexed = Vec<(Tok, usize)>;

/// The module path of a file relative to `src/` (`None` for files that are no module: binaries).
fn module_of(rel: &Path) -> Option<Module> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop()?;
    if parts.first().is_some_and(|p| p == "bin") || file == "main.rs" {
        return None;
    }
    match file.strip_suffix(".rs")? {
        "lib" if parts.is_empty() => {}
        "mod" => {}
        stem => parts.push(stem.to_string()),
    }
    Some(parts)
}

/// Skips a string literal starting at `c[i]` (the opening quote, after any `r#…`); returns its
/// contents and the index after it.
fn string_at(c: &[char], i: usize, hashes: usize, line: &mut usize) -> (String, usize) {
    let mut j = i + 1;
    let mut s = String::new();
    while j < c.len() {
        let closes = c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#'));
        if closes {
            return (s, j + 1 + hashes);
        }
        if c[j] == '\\' && hashes == 0 {
            j += 1;
        }
        if c.get(j) == Some(&'\n') {
            *line += 1;
        }
        s.extend(c.get(j));
        j += 1;
    }
    (s, j)
}

/// The index after a comment starting at `c[i]` (`//` or a nested `/* … */`).
fn skip_comment(c: &[char], i: usize, line: &mut usize) -> usize {
    if c[i + 1] == '/' {
        return (i..c.len()).find(|&j| c[j] == '\n').unwrap_or(c.len());
    }
    let (mut j, mut depth) = (i + 2, 1);
    while j < c.len() && depth > 0 {
        match (c[j], c.get(j + 1)) {
            ('/', Some('*')) => (depth, j) = (depth + 1, j + 1),
            ('*', Some('/')) => (depth, j) = (depth - 1, j + 1),
            ('\n', _) => *line += 1,
            _ => {}
        }
        j += 1;
    }
    j
}

/// The number of `#` of a raw string starting at `c[i]` (`r"`, `r#"`, `br"`), if it is one.
fn raw_string_hashes(c: &[char], i: usize) -> Option<(usize, usize)> {
    let start = if c[i] == 'b' { i + 1 } else { i };
    if c.get(start) != Some(&'r') {
        return None;
    }
    let hashes = c[start + 1..].iter().take_while(|&&h| h == '#').count();
    (c.get(start + 1 + hashes) == Some(&'"')).then_some((start + 1 + hashes, hashes))
}

/// Rust source as tokens: comments, numbers, lifetimes and character literals dropped.
fn lex(text: &str) -> Lexed {
    let c: Vec<char> = text.chars().collect();
    let (mut out, mut i, mut line) = (Vec::new(), 0, 1);
    while i < c.len() {
        let (ch, next) = (c[i], c.get(i + 1).copied());
        let at = line;
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch == '/' && matches!(next, Some('/' | '*')) {
            i = skip_comment(&c, i, &mut line);
        } else if let Some((quote, hashes)) = raw_string_hashes(&c, i) {
            let (s, j) = string_at(&c, quote, hashes, &mut line);
            out.push((Tok::Str(s), at));
            i = j;
        } else if ch == '"' || (ch == 'b' && next == Some('"')) {
            let (s, j) = string_at(&c, if ch == 'b' { i + 1 } else { i }, 0, &mut line);
            out.push((Tok::Str(s), at));
            i = j;
        } else if ch == '\'' {
            // 'x', '\n', '\u{..}' are characters; 'a (no closing quote) is a lifetime.
            i += match (next, c.get(i + 2)) {
                (Some('\\'), _) => (i + 3..c.len())
                    .find(|&j| c[j] == '\'')
                    .map_or(1, |j| j - i + 1),
                (Some(_), Some('\'')) => 3,
                _ => 1,
            };
        } else if ch.is_alphabetic() || ch == '_' {
            let j = (i..c.len()).find(|&j| !(c[j].is_alphanumeric() || c[j] == '_'));
            let j = j.unwrap_or(c.len());
            out.push((Tok::Ident(c[i..j].iter().collect()), at));
            i = j;
        } else if ch.is_ascii_digit() {
            i = (i..c.len())
                .find(|&j| !(c[j].is_alphanumeric() || c[j] == '_'))
                .unwrap_or(c.len());
        } else if ch == ':' && next == Some(':') {
            out.push((Tok::Sep, at));
            i += 2;
        } else {
            if !ch.is_whitespace() {
                out.push((Tok::Punct(ch), at));
            }
            i += 1;
        }
    }
    out
}

/// One path a `use` tree names: its segments as written and the name it binds (`*` for a glob).
#[derive(Clone, Debug)]
struct UseLeaf {
    path: Vec<String>,
    name: String,
}

fn ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

/// Parses the use tree at `t[*i]` under `prefix` into `out`; leaves `*i` after it.
fn use_tree(t: &Lexed, i: &mut usize, prefix: Vec<String>, out: &mut Vec<UseLeaf>) {
    let mut path = prefix;
    if t.get(*i).map(|x| &x.0) == Some(&Tok::Sep) {
        *i += 1;
    }
    loop {
        match t.get(*i).map(|x| &x.0) {
            Some(Tok::Ident(s)) => {
                if s != "self" {
                    path.push(s.clone());
                }
                *i += 1;
                if t.get(*i).map(|x| &x.0) == Some(&Tok::Sep) {
                    *i += 1;
                    continue;
                }
                let mut name = path.last().cloned().unwrap_or_default();
                if ident(t.get(*i)) == Some("as") {
                    name = ident(t.get(*i + 1)).unwrap_or("_").to_string();
                    *i += 2;
                }
                out.push(UseLeaf { path, name });
                return;
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                out.push(UseLeaf {
                    path,
                    name: "*".into(),
                });
                return;
            }
            Some(Tok::Punct('{')) => {
                *i += 1;
                while !matches!(t.get(*i).map(|x| &x.0), None | Some(Tok::Punct('}'))) {
                    use_tree(t, i, path.clone(), out);
                    if t.get(*i).map(|x| &x.0) == Some(&Tok::Punct(',')) {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            _ => return,
        }
    }
}

/// The segments of the expression path at `t[i]` (`crate::a::b`, stopping at the first segment
/// not followed by `::`).
fn expr_path(t: &Lexed, mut i: usize) -> Vec<String> {
    let mut path = Vec::new();
    while let Some(s) = ident(t.get(i)) {
        path.push(s.to_string());
        if t.get(i + 1).map(|x| &x.0) != Some(&Tok::Sep) {
            break;
        }
        i += 2;
    }
    path
}

/// What one file names: every path with its line and whether it is a re-export.
#[derive(Debug, Default)]
struct FileUses {
    /// (the module the path is written in, incl. inline modules; the path; its line).
    paths: Vec<(Module, Vec<String>, usize)>,
    /// (inline-module path, leaf) of `pub use` trees.
    reexports: Vec<(Module, UseLeaf)>,
}

/// Whether `s` is a path: identifiers joined by `::`.
fn is_path(s: &str) -> bool {
    s.split("::").all(|seg| {
        seg.chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
            && seg.chars().all(|c| c.is_alphanumeric() || c == '_')
    })
}

/// Whether the `use` at `t[i]` is public (`pub use`, `pub(crate) use`, …).
fn is_pub_use(t: &Lexed, i: usize) -> bool {
    match i.checked_sub(1).and_then(|j| t.get(j)).map(|x| &x.0) {
        Some(Tok::Ident(s)) => s == "pub",
        Some(Tok::Punct(')')) => (0..i)
            .rev()
            .find(|&j| t[j].0 == Tok::Punct('('))
            .is_some_and(|j| ident(j.checked_sub(1).and_then(|k| t.get(k))) == Some("pub")),
        _ => false,
    }
}

/// Collects the paths of one file (module `file`), tracking inline `mod name { … }` blocks.
fn file_uses(file: &[String], t: &Lexed) -> FileUses {
    let mut uses = FileUses::default();
    let (mut depth, mut inline): (usize, Vec<(String, usize)>) = (0, Vec::new());
    let mut i = 0;
    while i < t.len() {
        let here: Module = file
            .iter()
            .cloned()
            .chain(inline.iter().map(|m| m.0.clone()))
            .collect();
        let line = t[i].1;
        let after_sep = i > 0 && t[i - 1].0 == Tok::Sep;
        match &t[i].0 {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                inline.retain(|m| m.1 <= depth);
            }
            Tok::Ident(s) if s == "mod" => {
                if let (Some(name), Some((Tok::Punct('{'), _))) =
                    (ident(t.get(i + 1)), t.get(i + 2))
                {
                    inline.push((name.to_string(), depth + 1));
                }
            }
            Tok::Ident(s) if s == "use" && !after_sep => {
                let public = is_pub_use(t, i);
                let mut leaves = Vec::new();
                let mut j = i + 1;
                use_tree(t, &mut j, Vec::new(), &mut leaves);
                for leaf in leaves {
                    if public {
                        uses.reexports.push((here.clone(), leaf));
                    } else {
                        uses.paths.push((here.clone(), leaf.path, line));
                    }
                }
                i = j;
                continue;
            }
            Tok::Ident(s) if matches!(s.as_str(), "crate" | "super" | "self") && !after_sep => {
                let dollar = i > 0 && t[i - 1].0 == Tok::Punct('$');
                if !dollar && t.get(i + 1).map(|x| &x.0) == Some(&Tok::Sep) {
                    uses.paths.push((here.clone(), expr_path(t, i), line));
                }
            }
            Tok::Str(s) if s.starts_with("crate::") && is_path(s) => {
                let path = s.split("::").map(str::to_string).collect();
                uses.paths.push((here.clone(), path, line));
            }
            _ => {}
        }
        i += 1;
    }
    uses
}

/// The absolute path of `path` written in module `here` (`None` for an external crate or a
/// name that is no child module).
fn absolute(here: &[String], path: &[String], modules: &BTreeSet<Module>) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    let mut base = here.to_vec();
    let mut rest = rest;
    match first.as_str() {
        "crate" => base.clear(),
        "self" => {}
        "super" => {
            base.pop();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        child => {
            // A path relative to the current module: only a child file module is ours.
            let mut m = file_module(here, modules);
            m.push(child.to_string());
            if !modules.contains(&m) {
                return None;
            }
            return Some(m.into_iter().chain(rest.iter().cloned()).collect());
        }
    }
    Some(base.into_iter().chain(rest.iter().cloned()).collect())
}

/// The file module that contains (possibly inline) module `m`: its longest known prefix.
fn file_module(m: &[String], modules: &BTreeSet<Module>) -> Module {
    (0..=m.len())
        .rev()
        .map(|n| m[..n].to_vec())
        .find(|p| modules.contains(p))
        .unwrap_or_default()
}

/// The file module that defines what the absolute path `abs` names, following re-exports.
fn resolve(
    abs: &[String],
    modules: &BTreeSet<Module>,
    reexports: &BTreeMap<(Module, String), Vec<String>>,
    depth: usize,
) -> Module {
    let m = file_module(abs, modules);
    match abs.get(m.len()) {
        Some(name) if depth < 16 => match reexports.get(&(m.clone(), name.clone())) {
            Some(target) => {
                let full: Vec<String> = target.iter().chain(&abs[m.len() + 1..]).cloned().collect();
                resolve(&full, modules, reexports, depth + 1)
            }
            None => m,
        },
        _ => m,
    }
}

fn join(m: &[String]) -> String {
    m.join("::")
}

impl ModuleGraph {
    /// The graph of a crate directory (its `src/`). Panics on an unreadable directory or file
    /// (a test's setup error).
    pub fn of_crate(crate_dir: &Path) -> Self {
        let src = crate_dir.join("src");
        let mut files = Vec::new();
        collect_rs(&src, &mut files);
        let texts: Vec<(String, String)> = files
            .iter()
            .map(|f| {
                let rel = f.strip_prefix(&src).expect("under src/");
                let text = fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                (rel.to_string_lossy().into_owned(), text)
            })
            .collect();
        let refs: Vec<(&str, &str)> = texts
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        Self::from_sources(&refs)
    }

    /// The graph of files given as (path relative to `src/`, source text).
    pub fn from_sources(files: &[(&str, &str)]) -> Self {
        let parsed: Vec<(String, Module, FileUses)> = files
            .iter()
            .filter_map(|(rel, text)| {
                let m = module_of(Path::new(rel))?;
                Some((rel.to_string(), m.clone(), file_uses(&m, &lex(text))))
            })
            .collect();
        let modules: BTreeSet<Module> = parsed.iter().map(|p| p.1.clone()).collect();
        let mut reexports = BTreeMap::new();
        for (_, file, uses) in &parsed {
            for (here, leaf) in &uses.reexports {
                if let Some(abs) = absolute(here, &leaf.path, &modules) {
                    reexports.insert((file.clone(), leaf.name.clone()), abs);
                }
            }
        }
        let mut graph = ModuleGraph {
            modules: modules.iter().map(|m| join(m)).collect(),
            uses: BTreeMap::new(),
        };
        for (rel, file, uses) in &parsed {
            for (here, path, line) in &uses.paths {
                let Some(abs) = absolute(here, path, &modules) else {
                    continue;
                };
                let to = resolve(&abs, &modules, &reexports, 0);
                if &to != file {
                    let from = graph.uses.entry(join(file)).or_default();
                    from.entry(join(&to))
                        .or_insert_with(|| format!("src/{rel}:{line}"));
                }
            }
        }
        graph
    }
}

/// Every `.rs` file under `dir`, recursively, in a fixed order.
fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect_rs(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The import circles of `graph`: its strongly connected components of two or more modules,
/// each sorted, in a fixed order (Tarjan's algorithm).
pub fn cycles(graph: &ModuleGraph) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g ModuleGraph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph.uses.get(v).into_iter().flat_map(|m| m.keys()) {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    self.low.entry(v).and_modify(|l| *l = (*l).min(lw));
                } else if self.stack.contains(&w) {
                    let iw = self.index[w];
                    self.low.entry(v).and_modify(|l| *l = (*l).min(iw));
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|&x| x == v).unwrap_or(0);
                let mut scc: Vec<String> = self.stack.drain(at..).map(str::to_string).collect();
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in &graph.modules {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out.sort();
    t.out
}

/// The import circles of the crate at `crate_dir`, each with every use inside it and its file
/// and line, as a message; `None` when it has none.
pub fn cycle_report(crate_dir: &Path) -> Option<String> {
    let graph = ModuleGraph::of_crate(crate_dir);
    let found = cycles(&graph);
    if found.is_empty() {
        return None;
    }
    let mut msg = format!("import circles in {}:\n", crate_dir.display());
    for scc in &found {
        msg.push_str(&format!("  {{{}}}\n", scc.join(", ")));
        for from in scc {
            for (to, at) in graph.uses.get(from).into_iter().flatten() {
                if scc.contains(to) {
                    msg.push_str(&format!("    {from} uses {to} ({at})\n"));
                }
            }
        }
    }
    msg.push_str("  move what both need into a module of its own so the uses go one way");
    Some(msg)
}

/// Panics with the [`cycle_report`] when the crate at `crate_dir` has an import circle.
pub fn assert_no_import_cycles(crate_dir: &Path) {
    if let Some(msg) = cycle_report(crate_dir) {
        panic!("{msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> ModuleGraph {
        ModuleGraph::from_sources(files)
    }

    #[test]
    fn a_circle_through_use_lines_is_found_and_a_one_way_chain_is_not() {
        let lib = "pub mod a; pub mod b; pub mod c;";
        let circle = graph(&[
            ("lib.rs", lib),
            ("a.rs", "use crate::b::{x, y::Z};"),
            ("b.rs", "use super::c::*;"),
            ("c.rs", "use crate::{a::A as Q, d};"),
        ]);
        assert_eq!(cycles(&circle), vec![vec!["a", "b", "c"]]);
        let chain = graph(&[
            ("lib.rs", lib),
            ("a.rs", "use crate::b::x;"),
            ("b.rs", "use crate::c::y;"),
            ("c.rs", "fn f() {}"),
        ]);
        assert!(cycles(&chain).is_empty());
    }

    #[test]
    fn reexports_are_followed_but_are_no_uses_themselves() {
        // The parent re-exports its children, and children use the parent's own items: no
        // circle. A child that reaches a sibling through the parent's re-export: a use of it.
        let files = [
            (
                "lib.rs",
                "mod conv; pub use conv::{Data, Pop}; pub struct Root;",
            ),
            (
                "conv/mod.rs",
                "mod data; mod pop; pub use data::Data; pub use pop::*; pub struct Loss;",
            ),
            (
                "conv/data.rs",
                "use super::Loss; use crate::Root; use super::pop::Pop;",
            ),
            ("conv/pop.rs", "fn f() -> crate::Data { todo!() }"),
        ];
        let g = graph(&files);
        assert_eq!(
            g.uses["conv::pop"].keys().collect::<Vec<_>>(),
            vec!["conv::data"]
        );
        assert_eq!(cycles(&g), vec![vec!["conv::data", "conv::pop"]]);
    }

    #[test]
    fn comments_strings_tests_and_inline_modules_are_read_right() {
        let g = graph(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod float;"),
            (
                "a.rs",
                "//! [`crate::b::X`] in a doc comment is no use\n\
                 /* crate::b::Y */ const S: &str = \"crate::b is text\";\n\
                 #[serde(with = \"crate::float\")] struct T;\n\
                 fn f<'a>(c: char) -> bool { c == '\"' }\n\
                 #[cfg(test)] mod tests { use super::*; use super::super::b::Z; }",
            ),
            (
                "b.rs",
                "pub(crate) use crate::a::T; fn g() { let _ = self::h; }",
            ),
            ("float.rs", ""),
        ]);
        let a: Vec<&String> = g.uses["a"].keys().collect();
        assert_eq!(a, vec!["b", "float"]);
        assert_eq!(g.uses["a"]["b"], "src/a.rs:5");
        assert!(!g.uses.contains_key("b"), "{g:?}");
    }
}
