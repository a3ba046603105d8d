//! No crate of the workspace has an import circle between its modules (module A uses B and B
//! uses A, directly or through others): see `kappa_testkit::imports`.

use kappa_testkit::imports::cycle_report;

#[test]
fn no_crate_has_an_import_circle() {
    let crates = kappa_testkit::crate_dir().join("..");
    let mut dirs: Vec<_> = std::fs::read_dir(&crates)
        .expect("the crates/ folder")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.join("Cargo.toml").is_file() && p.join("src").is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 6, "found only {dirs:?}");
    let reports: Vec<String> = dirs.iter().filter_map(|d| cycle_report(d)).collect();
    assert!(reports.is_empty(), "{}", reports.join("\n"));
}
