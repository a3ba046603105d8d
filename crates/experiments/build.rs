//! Keeps libtorch's CUDA library among the `kappa-experiments` binary's needed libraries.
//!
//! kappa calls no function of `libtorch_cuda.so` directly: libtorch registers its CUDA backend
//! when that library is loaded. The linker drops a shared library none of whose symbols a
//! binary references (`--as-needed`, the default of Debian's and Ubuntu's toolchains), so
//! without this the binary would load only `libtorch_cpu.so` and `--device cuda` would find no
//! CUDA even on a GPU machine with a CUDA libtorch. Where `LIBTORCH` has no CUDA library (a
//! CPU-only libtorch) or is unset, nothing is added. `tests/blas_binding.rs` checks the result.
//!
//! It also exports the binary's `mkl_serv_intel_cpu_true` (`kappa_linalg::mkl_intel_path!` in
//! `main.rs`), so that libtorch's MKL asks it and takes its feature-based kernels on AMD CPUs
//! (`kappa_linalg::mkl`); `tests/blas_binding.rs` checks that too.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if linux {
        println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=mkl_serv_intel_cpu_true");
    }
    let Some(root) = std::env::var_os("LIBTORCH") else {
        return;
    };
    if linux && Path::new(&root).join("lib/libtorch_cuda.so").is_file() {
        // Only for this library: `--as-needed` applies again to whatever follows.
        println!("cargo:rustc-link-arg-bins=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
