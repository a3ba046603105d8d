//! Which library the dynamic linker binds each symbol reference to, from glibc's own report.
//!
//! A program started with `LD_BIND_NOW=1 LD_DEBUG=bindings` makes glibc's dynamic linker resolve
//! every symbol at start-up and print one line per binding (`binding file A [0] to B [0]: normal
//! symbol `name'`). [`start_up_bindings`] runs a command that way and parses the lines;
//! [`assert_libtorch_keeps_its_gemms`] checks that libtorch_cpu's own `sgemm_`/`dgemm_` calls bind
//! to libtorch_cpu, not to another BLAS that exports the same names (OpenBLAS does).

use std::process::Command;

/// One binding the dynamic linker reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The object whose reference was bound.
    pub from: String,
    /// The object that defines the symbol it was bound to.
    pub to: String,
    /// The symbol's name.
    pub symbol: String,
}

/// Parses one line of glibc's `LD_DEBUG=bindings` report (`None` for other lines).
pub fn parse_binding(line: &str) -> Option<Binding> {
    let rest = line.split_once("binding file ")?.1;
    let (from, rest) = rest.split_once(" [")?;
    let rest = rest.split_once(" to ")?.1;
    let (to, rest) = rest.split_once(" [")?;
    let symbol = rest.split_once('`')?.1.split_once('\'')?.0;
    Some(Binding {
        from: from.to_string(),
        to: to.to_string(),
        symbol: symbol.to_string(),
    })
}

/// Runs `command` with every symbol bound at start-up and returns the bindings the dynamic
/// linker reported, or `None` where it reports none (not glibc). Panics when the command cannot
/// be started (a test's setup error).
pub fn start_up_bindings(mut command: Command) -> Option<Vec<Binding>> {
    let out = command
        .env("LD_BIND_NOW", "1")
        .env("LD_DEBUG", "bindings")
        .output()
        .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
    let report = String::from_utf8_lossy(&out.stderr);
    let bindings: Vec<Binding> = report.lines().filter_map(parse_binding).collect();
    (!bindings.is_empty()).then_some(bindings)
}

/// Asserts that in the process `command` starts, libtorch_cpu's references to `sgemm_` and
/// `dgemm_` bind to libtorch_cpu itself. Prints a message and checks nothing where the dynamic
/// linker reports no bindings.
pub fn assert_libtorch_keeps_its_gemms(command: Command) {
    let shown = format!("{command:?}");
    let Some(bindings) = start_up_bindings(command) else {
        eprintln!("skipped: the dynamic linker reports no bindings here (not glibc?)");
        return;
    };
    for symbol in ["sgemm_", "dgemm_"] {
        let from_torch: Vec<&Binding> = bindings
            .iter()
            .filter(|b| b.symbol == symbol && b.from.contains("libtorch_cpu"))
            .collect();
        assert!(
            !from_torch.is_empty(),
            "{shown}: libtorch_cpu's {symbol} binding not found in the linker's report"
        );
        for b in from_torch {
            assert!(
                b.to.contains("libtorch_cpu"),
                "{shown}: libtorch_cpu's {symbol} is bound to {}",
                b.to
            );
        }
    }
}

/// Set in the child that [`assert_this_test_binary_keeps_libtorchs_gemms`] starts.
pub const CHILD_VAR: &str = "KAPPA_BLAS_BINDING_CHILD";

/// [`assert_libtorch_keeps_its_gemms`] for the running test binary: re-runs it with only the
/// test `idle` (which should touch the libraries and do nothing else, so the child's bindings
/// are start-up bindings). Does nothing inside that child.
pub fn assert_this_test_binary_keeps_libtorchs_gemms(idle: &str) {
    if std::env::var_os(CHILD_VAR).is_some() {
        return;
    }
    let mut child = Command::new(std::env::current_exe().expect("the test binary's path"));
    child
        .args(["--exact", idle, "--test-threads", "1"])
        .env(CHILD_VAR, "1");
    assert_libtorch_keeps_its_gemms(child);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_line_parses() {
        let line =
            "    4242:\tbinding file /x/libtorch_cpu.so [0] to /usr/lib/libopenblas.so.0 [0]: \
                    normal symbol `sgemm_'";
        assert_eq!(
            parse_binding(line),
            Some(Binding {
                from: "/x/libtorch_cpu.so".into(),
                to: "/usr/lib/libopenblas.so.0".into(),
                symbol: "sgemm_".into(),
            })
        );
        assert_eq!(
            parse_binding("    4242:\tsymbol=sgemm_;  lookup in file=x"),
            None
        );
    }
}
