//! In the `kappa-experiments` binary that `cargo xtask reproduce` runs, libtorch's GEMMs are
//! libtorch's (not OpenBLAS's, which the binary also links), and OpenBLAS's kernel is not a
//! generic fallback: the binary's `--help` is started with every symbol bound at start-up.

use std::process::Command;

#[test]
fn the_experiments_binary_keeps_libtorchs_gemms() {
    let mut help = Command::new(env!("CARGO_BIN_EXE_kappa-experiments"));
    help.arg("--help");
    kappa_testkit::binding::assert_libtorch_keeps_its_gemms(help);
}
