//! GEMM throughput of each path kappa multiplies matrices on, against libtorch's MKL (the
//! fastest GEMM this machine has), in one run: kappa-linalg's `product` (faer's kernels, run-time
//! CPU dispatch: every general ndarray product of kappa-linalg and kappa-attention), ndarray
//! f32/f64 (the system OpenBLAS with the kernel kappa-linalg runs: its `syrk`, LAPACK, and a
//! user's own `dot`), tch f32/f64/bf16 (libtorch), and for contrast: ndarray f32 on OpenBLAS's
//! generic "Prescott" kernel (what a CPU the library does not know gets without kappa's kernel
//! selection) and, where it is installed, a newer OpenBLAS (the `scipy-openblas32` wheel's, with
//! prefixed symbols, so it loads beside the system one: `pip install scipy-openblas32` into the
//! project's virtual environment).
//!
//! Every row alternates its path with the MKL call of the same size and element type (bf16 is
//! compared with MKL's f32) and prints the per-pair throughput ratio path/MKL: median and
//! min–max. Goal: ≥ 0.8 at 512² and above. At two threads each timed sample follows a pause, so
//! that the other library's idle threads have gone to sleep (`paired::alternate_settled`): the
//! table compares the libraries, not how one suffers in the other's wake (`step_env` measures
//! that, in a training step).
//!
//! A second table weighs "one LAPACK per process": the singular values by `dgesdd` (what
//! kappa-linalg's κ and SVD call) from OpenBLAS's LAPACK against MKL's (libtorch_cpu exports the
//! same Fortran names, and in a binary that links kappa-models the dynamic linker binds
//! kappa-linalg's LAPACK calls to libtorch's). Both libraries are in this process; each routine is
//! looked up in its own library (`dlopen(RTLD_NOLOAD)` + `dlsym`), so the two run side by side.
//!
//! `KAPPA_BENCH_THREADS=1|2 cargo bench -p kappa-benches --bench gemm` (or `cargo xtask bench`).

#![allow(unsafe_code)] // switching OpenBLAS's kernel for the contrast row (no BLAS call in flight)

// libtorch's MKL chooses kernels by CPU features, as in kappa's binaries (build.rs).
#[cfg(target_os = "linux")]
kappa_linalg::mkl_intel_path!();

// Rust's allocations on mimalloc, which keeps freed pages for reuse (glibc returns N×N
// temporaries to the kernel; docs/architecture.md, "The memory allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;

use kappa_benches::paired::{alternate_settled, cpu_model, ratios, Spread};
use kappa_benches::{configure_threads, gaussian, record};
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

/// The thread setting for faer (the SVD table): sequential at one thread, rayon's pool otherwise.
fn faer_par(threads: usize) -> faer::Par {
    if threads == 1 {
        faer::Par::Seq
    } else {
        faer::Par::rayon(threads)
    }
}

/// One n×n product by kappa-linalg's `product::mat_mul_into` (faer's kernels on ndarray
/// matrices, the path of kappa's general products; no allocation per call).
fn kappa_mm<A: kappa_linalg::Real>(n: usize) -> impl FnMut() {
    let (a, b) = (gaussian::<A>(n, n, 1), gaussian::<A>(n, n, 2));
    let mut c = Array2::<A>::zeros((n, n));
    move || kappa_linalg::product::mat_mul_into(A::one(), &a, &b, A::zero(), &mut c)
}

/// `cblas_sgemm` of a newer OpenBLAS with prefixed symbols (the `scipy-openblas32` wheel).
type Sgemm = unsafe extern "C" fn(
    layout: i32,
    ta: i32,
    tb: i32,
    m: i32,
    n: i32,
    k: i32,
    alpha: f32,
    a: *const f32,
    lda: i32,
    b: *const f32,
    ldb: i32,
    beta: f32,
    c: *mut f32,
    ldc: i32,
);

/// The scipy-openblas32 library in the project's virtual environment, if installed: its
/// `cblas_sgemm`, its version string and its kernel name.
fn newer_openblas(threads: usize) -> Option<(Sgemm, String)> {
    let lib = std::fs::read_dir(kappa_benches::peer::venv().join("lib"))
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| {
            e.path()
                .join("site-packages/scipy_openblas32/lib/libscipy_openblas.so")
        })
        .find(|p| p.exists())?;
    let path = std::ffi::CString::new(lib.to_str()?).ok()?;
    // SAFETY: dlopen of a shared library by path; dlsym of functions whose C signatures are
    // `Sgemm`, `char *(void)` and `void (int)` in OpenBLAS's API (with the wheel's prefix).
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            return None;
        }
        let sym = |name: &std::ffi::CStr| {
            let p = libc::dlsym(h, name.as_ptr());
            (!p.is_null()).then_some(p)
        };
        let sgemm = std::mem::transmute::<*mut libc::c_void, Sgemm>(sym(c"scipy_cblas_sgemm")?);
        type Name = unsafe extern "C" fn() -> *const std::ffi::c_char;
        type SetThreads = unsafe extern "C" fn(i32);
        let config =
            std::mem::transmute::<*mut libc::c_void, Name>(sym(c"scipy_openblas_get_config")?);
        let set = std::mem::transmute::<*mut libc::c_void, SetThreads>(sym(
            c"scipy_openblas_set_num_threads",
        )?);
        set(threads as i32);
        let name = std::ffi::CStr::from_ptr(config())
            .to_string_lossy()
            .into_owned();
        Some((sgemm, name))
    }
}

/// One n×n product by a newer OpenBLAS's `cblas_sgemm` (row-major, no transposes).
fn newer_mm(sgemm: Sgemm, n: usize) -> impl FnMut() {
    let (a, b) = (gaussian::<f32>(n, n, 1), gaussian::<f32>(n, n, 2));
    let mut c = vec![0.0f32; n * n];
    let ni = n as i32;
    move || {
        // SAFETY: a, b are n×n row-major (standard layout), c holds n·n floats.
        unsafe {
            sgemm(
                101,
                111,
                111,
                ni,
                ni,
                ni,
                1.0,
                a.as_ptr(),
                ni,
                b.as_ptr(),
                ni,
                0.0,
                c.as_mut_ptr(),
                ni,
            )
        }
    }
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

/// The pause before each timed sample at more than one thread (OpenBLAS's idle threads spin for
/// up to 2^28 cycles, about 0.1 s, before they sleep; see `alternate_settled`).
fn settle() -> Option<std::time::Duration> {
    (THREADS.load(std::sync::atomic::Ordering::Relaxed) > 1)
        .then(|| std::time::Duration::from_millis(150))
}

static THREADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

/// The rows measured so far, for the record `main` writes at the end.
static ROWS: std::sync::Mutex<Vec<record::Row>> = std::sync::Mutex::new(Vec::new());

/// One path against MKL at n, printed and kept for the record (the bound by the path's element
/// type: bf16, f64, else f32).
fn row(n: usize, path: &str, ours: impl FnMut(), mkl: impl FnMut()) {
    let (mut ours, mut mkl) = (repeated(n, ours), repeated(n, mkl));
    let (t_ours, t_mkl) = alternate_settled(&mut ours, &mut mkl, 2, pairs(n), settle());
    let per_call = |t: &[f64]| Spread::of(t.to_vec()).median / reps(n) as f64;
    let gf = |t: &[f64]| flops(n) / per_call(t) * 1e-9;
    println!(
        "{:<6} {:<26} {:>9.1} {:>9.1}   {}",
        n,
        path,
        gf(&t_ours),
        gf(&t_mkl),
        Spread::of(ratios(&t_mkl, &t_ours))
    );
    let bound = if path.contains("bf16") {
        record::Bound::GemmBf16
    } else if path.contains("f64") {
        record::Bound::GemmF64
    } else {
        record::Bound::GemmF32
    };
    let row = record::Row {
        parameter: format!("{n}x{n}"),
        variant: path.to_string(),
        threads: THREADS.load(std::sync::atomic::Ordering::Relaxed),
        kappa_s: Some(per_call(&t_ours)),
        peer_s: Some(per_call(&t_mkl)),
        ratio: record::Ratio::of(Spread::of(ratios(&t_ours, &t_mkl))),
        work: Some(record::Work {
            bound,
            amount: flops(n),
        }),
    };
    ROWS.lock().map(|mut rows| rows.push(row)).ok();
}

/// Writes the rows [`row`] kept as the bench's record (`kappa_benches::record`).
fn write_record() {
    let rows = ROWS.lock().map(|r| r.clone()).unwrap_or_default();
    record::Paired {
        bench: "gemm",
        name: "products_vs_libtorch",
        title: "Products against libtorch's GEMM".into(),
        what: "n×n products on each path (kappa-linalg's faer products, ndarray on OpenBLAS, \
               tch itself, a newer OpenBLAS where installed) against libtorch's MKL GEMM of the \
               same size (f32 for the bf16 row), alternated pair by pair; \"kappa\" is the \
               path named in the variant."
            .into(),
        peer: "libtorch (MKL)".into(),
        spread: "min–max over pairs",
        model: "2n³ flops a product".into(),
        rows,
    }
    .write();
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

/// Singular values of an m×n matrix by faer (its own SVD, values only).
fn faer_singular_values(m: usize, n: usize) -> impl FnMut() {
    let a = gaussian::<f64>(m, n, 3);
    let a = faer::Mat::<f64>::from_fn(m, n, |i, j| a[[i, j]]);
    move || {
        black_box(a.singular_values().expect("faer SVD"));
    }
}

fn lapack_table(threads: usize) {
    let (Some(openblas), Some(mkl)) = (
        dgesdd_of(c"libopenblas.so.0"),
        dgesdd_of(c"libtorch_cpu.so"),
    ) else {
        println!("(no LAPACK comparison: OpenBLAS or libtorch_cpu not found in this process)");
        return;
    };
    faer::set_global_parallelism(faer_par(threads));
    println!(
        "\nSingular values (f64, values only): OpenBLAS's dgesdd and faer against MKL's dgesdd"
    );
    println!("ratio = t(MKL) / t(path) per alternated pair (> 1: the path is faster than MKL)");
    println!(
        "{:<10} {:<16} {:>9} {:>9}   ratio",
        "shape", "path", "path ms", "MKL ms"
    );
    // 256×4096 is how LAPACK sees a row-major 4096×256 array (kappa-linalg passes the transpose).
    for (m, n) in [(256, 256), (1024, 1024), (4096, 256), (256, 4096)] {
        let pairs = if m * n >= 1 << 20 { 7 } else { 15 };
        let ms = |t: &[f64]| Spread::of(t.to_vec()).median * 1e3;
        let show = |path: &str, mut ours: Box<dyn FnMut()>| {
            let mut mk = singular_values(mkl, m, n);
            let (t_ours, t_mk) = alternate_settled(&mut ours, &mut mk, 2, pairs, settle());
            println!(
                "{:<10} {:<16} {:>9.2} {:>9.2}   {}",
                format!("{m}x{n}"),
                path,
                ms(&t_ours),
                ms(&t_mk),
                Spread::of(ratios(&t_mk, &t_ours))
            );
        };
        show("OpenBLAS dgesdd", Box::new(singular_values(openblas, m, n)));
        show("faer", Box::new(faer_singular_values(m, n)));
    }
}

fn main() {
    let threads = configure_threads();
    THREADS.store(threads, std::sync::atomic::Ordering::Relaxed);
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
        let (f32_mkl, f64_mkl) = (|| torch_mm(n, Kind::Float), || torch_mm(n, Kind::Double));
        row(n, "ndarray f32 (OpenBLAS)", ndarray_mm::<f32>(n), f32_mkl());
        row(n, "ndarray f64 (OpenBLAS)", ndarray_mm::<f64>(n), f64_mkl());
        row(
            n,
            "tch f32 (MKL, self)",
            torch_mm(n, Kind::Float),
            f32_mkl(),
        );
        row(
            n,
            "tch bf16 vs MKL f32",
            torch_mm(n, Kind::BFloat16),
            f32_mkl(),
        );
        row(n, "kappa product f32 (faer)", kappa_mm::<f32>(n), f32_mkl());
        row(n, "kappa product f64 (faer)", kappa_mm::<f64>(n), f64_mkl());
    }
    match newer_openblas(threads) {
        Some((sgemm, name)) => {
            println!("newer OpenBLAS: {name}");
            for n in SIZES {
                row(
                    n,
                    "f32, newer OpenBLAS",
                    newer_mm(sgemm, n),
                    torch_mm(n, Kind::Float),
                );
            }
        }
        None => {
            println!("(no newer-OpenBLAS rows: scipy-openblas32 is not in the virtual environment)")
        }
    }
    if let Some(original) = blas.core.clone() {
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
    }
    write_record();
    lapack_table(threads);
}
