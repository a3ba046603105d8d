//! GEMM throughput of each path kappa multiplies matrices on, against libtorch's MKL (the
//! fastest GEMM this machine has), in one run: ndarray f32/f64 (the system OpenBLAS, with the
//! kernel kappa-linalg runs), tch f32/f64/bf16 (libtorch), and for contrast ndarray f32 on
//! OpenBLAS's generic "Prescott" kernel (what a CPU the library does not know gets without
//! kappa's kernel selection).
//!
//! Every row alternates its path with the MKL call of the same size and element type (bf16 is
//! compared with MKL's f32) and prints the per-pair throughput ratio path/MKL: median and
//! min–max. Goal: ≥ 0.8 at 512² and above.
//!
//! A second table weighs "one LAPACK per process": the singular values by `dgesdd` (what
//! kappa-linalg's κ and SVD call) from OpenBLAS's LAPACK against MKL's (libtorch_cpu exports the
//! same Fortran names, and in a binary that links kappa-models the dynamic linker binds
//! kappa-linalg's LAPACK calls to libtorch's). Both libraries are in this process; each routine is
//! looked up in its own library (`dlopen(RTLD_NOLOAD)` + `dlsym`), so the two run side by side.
//!
//! `KAPPA_BENCH_THREADS=1|2 cargo bench -p kappa-benches --bench gemm` (or `cargo xtask bench`).

#![allow(unsafe_code)] // switching OpenBLAS's kernel for the contrast row (no BLAS call in flight)

use kappa_benches::paired::{alternate, cpu_model, ratios, Spread};
use kappa_benches::{configure_threads, gaussian};
use ndarray::linalg::general_mat_mul;
use ndarray::Array2;
use tch::{Device, Kind, Tensor};

const SIZES: [usize; 4] = [256, 512, 1024, 2048];

/// Pairs per size: enough for a median at small sizes, bounded time at 2048².
fn pairs(n: usize) -> usize {
    if n >= 2048 {
        7
    } else {
        15
    }
}

fn flops(n: usize) -> f64 {
    2.0 * (n as f64).powi(3)
}

/// Calls per timed sample: about a GFLOP, so that a sample lasts milliseconds, not microseconds.
fn reps(n: usize) -> usize {
    ((1e9 / flops(n)) as usize).max(1)
}

fn repeated(n: usize, mut f: impl FnMut()) -> impl FnMut() {
    move || {
        for _ in 0..reps(n) {
            f();
        }
    }
}

/// One n×n product on ndarray (`general_mat_mul`, no allocation per call).
fn ndarray_mm<A: kappa_linalg::Real + ndarray::LinalgScalar>(n: usize) -> impl FnMut() {
    let (a, b) = (gaussian::<A>(n, n, 1), gaussian::<A>(n, n, 2));
    let mut c = Array2::<A>::zeros((n, n));
    move || general_mat_mul(A::one(), &a, &b, A::zero(), &mut c)
}

/// One n×n product on libtorch (`mm_out`, no allocation per call).
fn torch_mm(n: usize, kind: Kind) -> impl FnMut() {
    let a = Tensor::randn([n as i64, n as i64], (Kind::Float, Device::Cpu)).to_kind(kind);
    let b = Tensor::randn([n as i64, n as i64], (Kind::Float, Device::Cpu)).to_kind(kind);
    let c = Tensor::zeros([n as i64, n as i64], (kind, Device::Cpu));
    move || {
        let _ = Tensor::mm_out(&c, &a, &b);
    }
}

fn row(n: usize, path: &str, ours: impl FnMut(), mkl: impl FnMut()) {
    let (mut ours, mut mkl) = (repeated(n, ours), repeated(n, mkl));
    let (t_ours, t_mkl) = alternate(&mut ours, &mut mkl, 2, pairs(n));
    let gf = |t: &[f64]| reps(n) as f64 * flops(n) / Spread::of(t.to_vec()).median * 1e-9;
    println!(
        "{:<6} {:<26} {:>9.1} {:>9.1}   {}",
        n,
        path,
        gf(&t_ours),
        gf(&t_mkl),
        Spread::of(ratios(&t_mkl, &t_ours))
    );
}

/// LAPACK's `dgesdd_` (Fortran calling convention: every argument by reference).
type Dgesdd = unsafe extern "C" fn(
    jobz: *const u8,
    m: *const i32,
    n: *const i32,
    a: *mut f64,
    lda: *const i32,
    s: *mut f64,
    u: *mut f64,
    ldu: *const i32,
    vt: *mut f64,
    ldvt: *const i32,
    work: *mut f64,
    lwork: *const i32,
    iwork: *mut i32,
    info: *mut i32,
);

/// `dgesdd_` as defined by the already-loaded library `lib` (not whichever the linker bound).
fn dgesdd_of(lib: &std::ffi::CStr) -> Option<Dgesdd> {
    // SAFETY: RTLD_NOLOAD only returns a handle to a library already loaded; dlsym on that handle
    // looks the name up in it. A non-null result is LAPACK's dgesdd_, whose signature is `Dgesdd`.
    unsafe {
        let handle = libc::dlopen(lib.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if handle.is_null() {
            return None;
        }
        let f = libc::dlsym(handle, c"dgesdd_".as_ptr());
        (!f.is_null()).then(|| std::mem::transmute::<*mut libc::c_void, Dgesdd>(f))
    }
}

/// Singular values of an m×n matrix by `f`, with its workspace allocated once.
fn singular_values(f: Dgesdd, m: usize, n: usize) -> impl FnMut() {
    let a0: Vec<f64> = gaussian::<f64>(m, n, 3).t().iter().copied().collect(); // column-major
    let (mi, ni) = (m as i32, n as i32);
    let mut a = a0.clone();
    let mut s = vec![0.0; m.min(n)];
    let mut iwork = vec![0i32; 8 * m.min(n)];
    let lwork = (3 * m.min(n) + (7 * m.min(n)).max(m.max(n))) as i32 + 64;
    let mut work = vec![0.0; lwork as usize];
    let (mut u, mut vt, one) = ([0.0f64; 1], [0.0f64; 1], 1i32);
    move || {
        a.copy_from_slice(&a0);
        let mut info = 0;
        // SAFETY: all buffers have the sizes dgesdd documents for JOBZ='N' (lwork ≥
        // 3·min + max(max(m,n), 7·min)); U and VT are not referenced with JOBZ='N'.
        unsafe {
            f(
                b"N".as_ptr(),
                &mi,
                &ni,
                a.as_mut_ptr(),
                &mi,
                s.as_mut_ptr(),
                u.as_mut_ptr(),
                &one,
                vt.as_mut_ptr(),
                &one,
                work.as_mut_ptr(),
                &lwork,
                iwork.as_mut_ptr(),
                &mut info,
            );
        }
        assert_eq!(info, 0, "dgesdd failed");
    }
}

fn lapack_table() {
    let (Some(openblas), Some(mkl)) = (
        dgesdd_of(c"libopenblas.so.0"),
        dgesdd_of(c"libtorch_cpu.so"),
    ) else {
        println!("(no LAPACK comparison: OpenBLAS or libtorch_cpu not found in this process)");
        return;
    };
    println!("\nSingular values (dgesdd, JOBZ='N', f64): OpenBLAS's LAPACK against MKL's");
    println!("ratio = t(MKL) / t(OpenBLAS) per alternated pair (> 1: OpenBLAS faster)");
    println!(
        "{:<10} {:>14} {:>10}   ratio",
        "shape", "OpenBLAS ms", "MKL ms"
    );
    for (m, n) in [(256, 256), (1024, 1024), (4096, 256)] {
        let (mut ob, mut mk) = (singular_values(openblas, m, n), singular_values(mkl, m, n));
        let pairs = if m * n >= 1 << 20 { 7 } else { 15 };
        let (t_ob, t_mk) = alternate(&mut ob, &mut mk, 2, pairs);
        let ms = |t: &[f64]| Spread::of(t.to_vec()).median * 1e3;
        println!(
            "{:<10} {:>14.2} {:>10.2}   {}",
            format!("{m}x{n}"),
            ms(&t_ob),
            ms(&t_mk),
            Spread::of(ratios(&t_mk, &t_ob))
        );
    }
}

fn main() {
    let threads = configure_threads();
    let blas = kappa_linalg::blas_report();
    println!("==== GEMM throughput against libtorch's MKL (threads = {threads}) ====");
    println!("CPU: {}", cpu_model());
    println!("BLAS: {blas}");
    println!("ratio = path GFLOP/s / MKL GFLOP/s per alternated pair: median [min–max]; goal ≥ 0.8 at n ≥ 512");
    println!(
        "{:<6} {:<26} {:>9} {:>9}   ratio",
        "n", "path", "GFLOP/s", "MKL"
    );
    for n in SIZES {
        row(
            n,
            "ndarray f32 (OpenBLAS)",
            ndarray_mm::<f32>(n),
            torch_mm(n, Kind::Float),
        );
        row(
            n,
            "ndarray f64 (OpenBLAS)",
            ndarray_mm::<f64>(n),
            torch_mm(n, Kind::Double),
        );
        row(
            n,
            "tch f32 (MKL, self)",
            torch_mm(n, Kind::Float),
            torch_mm(n, Kind::Float),
        );
        row(
            n,
            "tch bf16 vs MKL f32",
            torch_mm(n, Kind::BFloat16),
            torch_mm(n, Kind::Float),
        );
    }
    let Some(original) = blas.core.clone() else {
        return;
    };
    // SAFETY: single-threaded here; no BLAS call is in flight.
    match unsafe { kappa_linalg::blas::set_openblas_kernel("Prescott") } {
        Ok(_) => {
            for n in SIZES {
                row(
                    n,
                    "ndarray f32 (generic)",
                    ndarray_mm::<f32>(n),
                    torch_mm(n, Kind::Float),
                );
            }
            // SAFETY: as above.
            let _ = unsafe { kappa_linalg::blas::set_openblas_kernel(&original) };
        }
        Err(e) => println!("(no generic-kernel contrast: {e})"),
    }
    lapack_table();
}
