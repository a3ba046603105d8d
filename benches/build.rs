//! Exports each bench binary's `mkl_serv_intel_cpu_true` (`kappa_linalg::mkl_intel_path!`
//! at the top of every bench), so that libtorch's MKL takes its feature-based kernels on AMD CPUs
//! as in the `kappa-experiments` binary (`kappa_linalg::mkl`); `KAPPA_MKL_VENDOR_CHECK=keep`
//! measures MKL's own choice.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux") {
        let arg = "-Wl,--export-dynamic-symbol=mkl_serv_intel_cpu_true";
        println!("cargo:rustc-link-arg-benches={arg}");
    }
}
