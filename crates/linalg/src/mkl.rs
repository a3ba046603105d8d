//! libtorch's MKL on AMD CPUs: which code path its f32/f64 GEMM takes, and a binary's way to
//! give it the one the CPU can run.
//!
//! libtorch's x86-64 Linux builds link Intel MKL statically for their f32/f64 matrix products
//! (`libtorch_cpu.so`). MKL picks its kernels by vendor before features: on a CPU that is not
//! Intel's it runs its AVX2 kernels even where the CPU has AVX-512. Measured on an AMD EPYC Zen 5
//! (one thread, `torch.mm`, f32): 85–95 GFLOP/s at 512²–2048², against 215–223 with the vendor
//! check answered "Intel"; kappa's 4×4×256 GPT training step, 85 % GEMM, went from 280–299 to
//! 153–162 ms. `MKL_ENABLE_INSTRUCTIONS` and `MKL_CBWR` do not change the vendor branch.
//!
//! MKL asks `mkl_serv_intel_cpu_true()`, which `libtorch_cpu.so` exports and calls through its
//! procedure linkage table, so a definition exported by the executable comes first in symbol
//! lookup and answers for it. Which instructions MKL then uses still follows the CPU's feature
//! flags (an AMD CPU without AVX-512 keeps AVX2 kernels). This is process-wide, so no library
//! decides it: a binary opts in with [`mkl_intel_path!`](crate::mkl_intel_path) and exports the
//! symbol at link time (`build.rs`: `cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=
//! mkl_serv_intel_cpu_true`, GNU ld ≥ 2.35 or lld). `KAPPA_MKL_VENDOR_CHECK=keep` in the
//! environment makes the opted-in binary answer what MKL would (libtorch's own function).
//! [`mkl_dispatch`] reports which path the process takes; kappa's runs write it into `run.json`.
//!
//! The products change at the rounding level (another kernel, another summation order); kappa's
//! tests compare products with rounding bounds, not bits.
//!
//! This module also finds libtorch's MKL `?syrk` ([`libtorch_syrk_found`]), which gives CPU
//! tensors' symmetric products half a general product's flops on libtorch's own thread pool
//! (the `syrk` module's "Tensors"). Unlike the vendor check, it is used by the library itself:
//! it changes which routine computes a product, not what any other code in the process does.

// dlopen/dlsym and calls through the function pointers they return are unsafe by nature; each
// use states its contract.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CStr};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The name of MKL's vendor check.
const CHECK: &CStr = c"mkl_serv_intel_cpu_true";

/// The environment variable that keeps MKL's own vendor answer in a binary that opted in.
pub const VENDOR_CHECK_ENV: &str = "KAPPA_MKL_VENDOR_CHECK";

/// The code path libtorch's MKL takes in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MklDispatch {
    /// MKL's own answer: the CPU is Intel's (`None`: no MKL in the loaded libtorch, e.g. an Arm
    /// build, or a libtorch that does not export the check).
    pub vendor_intel: Option<bool>,
    /// This process answers the check itself ([`mkl_intel_path!`](crate::mkl_intel_path)).
    pub overridden: bool,
    /// The answer MKL gets: its Intel code path (kernels by feature flags) or its generic one.
    pub intel_path: Option<bool>,
}

impl fmt::Display for MklDispatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.vendor_intel, self.intel_path) {
            (Some(true), _) => write!(f, "libtorch MKL: Intel CPU, Intel code path"),
            (Some(false), Some(true)) => write!(
                f,
                "libtorch MKL: non-Intel CPU, Intel code path (vendor check answered by this binary)"
            ),
            (Some(false), _) if self.overridden => write!(
                f,
                "libtorch MKL: non-Intel CPU, generic code path ({VENDOR_CHECK_ENV}=keep)"
            ),
            (Some(false), _) => write!(f, "libtorch MKL: non-Intel CPU, generic code path"),
            (None, _) => write!(f, "libtorch MKL: not found"),
        }
    }
}

type Check = unsafe extern "C" fn() -> c_int;

/// The address `dlsym` finds for `name` in `handle` (RTLD_DEFAULT or a handle from dlopen).
fn symbol(handle: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `handle` is RTLD_DEFAULT or a live handle from dlopen; `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// The address of `name` in `libtorch_cpu.so`, if that library is loaded.
fn libtorch_symbol(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: RTLD_NOLOAD only returns a handle to an already loaded library (never loads or
    // initializes one); the name is NUL-terminated. The handle stays open for the process.
    let handle = unsafe {
        libc::dlopen(
            c"libtorch_cpu.so".as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        )
    };
    (!handle.is_null()).then(|| symbol(handle, name)).flatten()
}

/// The vendor check at `p`, as a function pointer.
fn as_check(p: *mut c_void) -> Check {
    // SAFETY: `p` is the non-null address of an exported `mkl_serv_intel_cpu_true`, whose C
    // signature is `int f(void)` (MKL's and the one `mkl_intel_path!` defines).
    unsafe { std::mem::transmute::<*mut c_void, Check>(p) }
}

/// libtorch's own vendor check (the definition in `libtorch_cpu.so`), if it is loaded.
fn libtorch_check() -> Option<Check> {
    libtorch_symbol(CHECK).map(as_check)
}

/// Which code path libtorch's MKL takes in this process (module docs).
pub fn mkl_dispatch() -> MklDispatch {
    let own = libtorch_check();
    let seen = symbol(libc::RTLD_DEFAULT, CHECK).map(as_check);
    // SAFETY: both are MKL's or `mkl_intel_path!`'s `int f(void)`, which only read CPUID and
    // the environment.
    let call = |c: Check| unsafe { c() } != 0;
    MklDispatch {
        vendor_intel: own.map(call),
        overridden: matches!((own, seen), (Some(a), Some(b)) if a as usize != b as usize),
        intel_path: own.and(seen).map(call),
    }
}

/// The answer of the vendor check [`mkl_intel_path!`](crate::mkl_intel_path) defines: "Intel"
/// (1), or libtorch's own answer when `KAPPA_MKL_VENDOR_CHECK=keep` (asked once per process).
pub fn vendor_check_answer() -> c_int {
    static ANSWER: OnceLock<c_int> = OnceLock::new();
    *ANSWER.get_or_init(|| {
        let keep = std::env::var(VENDOR_CHECK_ENV).is_ok_and(|v| v.trim() == "keep");
        match (keep, libtorch_check()) {
            // SAFETY: libtorch's `int mkl_serv_intel_cpu_true(void)`.
            (true, Some(own)) => unsafe { own() },
            _ => 1,
        }
    })
}

/// Defines MKL's vendor check in the binary that expands it, answering "Intel" so that libtorch's
/// MKL chooses its kernels by the CPU's feature flags (module docs: AVX-512 kernels on AMD CPUs
/// that have AVX-512, 2.3× the f32 GEMM throughput on a Zen 5). Expand it once, at the top
/// level of a binary crate, and export the symbol when linking that binary
/// (`cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=mkl_serv_intel_cpu_true` in its
/// build script); without the export it has no effect. Libraries must not expand it.
///
/// ```ignore
/// kappa_linalg::mkl_intel_path!();
/// fn main() {
///     println!("{}", kappa_linalg::mkl::mkl_dispatch());
/// }
/// ```
#[macro_export]
macro_rules! mkl_intel_path {
    () => {
        /// MKL's vendor check, answered by kappa-linalg (`kappa_linalg::mkl`).
        #[allow(unsafe_code)]
        #[no_mangle]
        pub extern "C" fn mkl_serv_intel_cpu_true() -> ::std::ffi::c_int {
            $crate::mkl::vendor_check_answer()
        }
    };
}

/// MKL's `?syrk` driver as `libtorch_cpu.so` exports it (`mkl_blas_ssyrk`, `mkl_blas_dsyrk`):
/// the Fortran interface — column-major, every argument by reference, integers of MKL's
/// internal width. They are passed as i64: on a little-endian CPU a value below 2³¹ reads the
/// same as a 32-bit or a 64-bit integer, so either width is right.
pub(crate) type SyrkFn<T> = unsafe extern "C" fn(
    uplo: *const std::ffi::c_char,
    trans: *const std::ffi::c_char,
    n: *const i64,
    k: *const i64,
    alpha: *const T,
    a: *const T,
    lda: *const i64,
    beta: *const T,
    c: *mut T,
    ldc: *const i64,
);

/// The element types of libtorch's MKL `?syrk` (f32, f64).
pub(crate) trait LibtorchSyrk: Copy + PartialEq + 'static {
    /// The exported name.
    const SYMBOL: &'static CStr;
    /// Where the resolved routine is kept, once per process.
    fn slot() -> &'static OnceLock<Option<SyrkFn<Self>>>;
    /// `x` in this type (the probe's small integers are exact).
    fn of(x: f64) -> Self;
}

impl LibtorchSyrk for f32 {
    const SYMBOL: &'static CStr = c"mkl_blas_ssyrk";
    fn slot() -> &'static OnceLock<Option<SyrkFn<Self>>> {
        static SLOT: OnceLock<Option<SyrkFn<f32>>> = OnceLock::new();
        &SLOT
    }
    fn of(x: f64) -> Self {
        x as f32
    }
}

impl LibtorchSyrk for f64 {
    const SYMBOL: &'static CStr = c"mkl_blas_dsyrk";
    fn slot() -> &'static OnceLock<Option<SyrkFn<Self>>> {
        static SLOT: OnceLock<Option<SyrkFn<f64>>> = OnceLock::new();
        &SLOT
    }
    fn of(x: f64) -> Self {
        x
    }
}

/// Whether CPU tensors may take libtorch's MKL `?syrk` ([`use_libtorch_syrk`]).
static SYRK_ON: AtomicBool = AtomicBool::new(true);

/// Lets CPU tensors' symmetric products take libtorch's MKL `?syrk` (`true`, the default) or
/// not (`false`: OpenBLAS's `syrk` while libtorch and OpenBLAS each run one thread, the general
/// product otherwise), process-wide, from the next product on. For comparisons, and a way out
/// should a libtorch build's MKL misbehave; results differ only by rounding.
pub fn use_libtorch_syrk(on: bool) {
    SYRK_ON.store(on, Ordering::Relaxed);
}

/// libtorch's MKL `?syrk` for `T` where this process has one ([`resolved_syrk`]) and
/// [`use_libtorch_syrk`] allows it.
pub(crate) fn libtorch_syrk<T: LibtorchSyrk>() -> Option<SyrkFn<T>> {
    SYRK_ON
        .load(Ordering::Relaxed)
        .then(resolved_syrk::<T>)
        .flatten()
}

/// libtorch's MKL `?syrk` for `T`, if this process has one that computes the probe right
/// (resolved and probed once; `None` without MKL in the loaded libtorch, or on a big-endian
/// CPU, where the integer-width argument of [`SyrkFn`] does not hold).
fn resolved_syrk<T: LibtorchSyrk>() -> Option<SyrkFn<T>> {
    *T::slot().get_or_init(|| {
        if cfg!(target_endian = "big") {
            return None;
        }
        // One libtorch product first, so that MKL has been entered through its public interface
        // before its internal driver is called (an earlier try, with 32-bit integers, crashed
        // calling `mkl_blas_ssyrk` in a process where libtorch had run no product).
        let one = tch::Tensor::f_ones([2, 2], (tch::Kind::Float, tch::Device::Cpu)).ok()?;
        let _ = one.f_mm(&one).ok()?;
        let p = libtorch_symbol(T::SYMBOL)?;
        // SAFETY: a non-null result is the exported routine, whose Fortran signature is
        // `SyrkFn` (MKL's `?syrk` interface; the probe below checks it computes as one).
        let f = unsafe { std::mem::transmute::<*mut c_void, SyrkFn<T>>(p) };
        syrk_probe_passes(f).then_some(f)
    })
}

/// Whether `f` computes X·Xᵀ for X = [[1, 2], [3, 4], [5, 6]] (row-major) into the row-major
/// upper triangle exactly, leaving the strict lower triangle as it was.
fn syrk_probe_passes<T: LibtorchSyrk>(f: SyrkFn<T>) -> bool {
    let x: Vec<T> = (1..=6).map(|v| T::of(f64::from(v))).collect();
    let mut c = vec![T::of(-1.0); 9];
    let (n, k) = (3i64, 2i64);
    let (alpha, beta) = (T::of(1.0), T::of(0.0));
    // SAFETY: `x` holds the 2×3 column-major Xᵀ (lda 2) and `c` a 3×3 matrix (ldc 3), as the
    // routine reads and writes them for uplo 'L', trans 'T', n 3, k 2.
    unsafe {
        f(
            c"L".as_ptr(),
            c"T".as_ptr(),
            &n,
            &k,
            &alpha,
            x.as_ptr(),
            &k,
            &beta,
            c.as_mut_ptr(),
            &n,
        )
    };
    let want = [5.0, 11.0, 17.0, -1.0, 25.0, 39.0, -1.0, -1.0, 61.0];
    c.iter().zip(want).all(|(&got, w)| got == T::of(w))
}

/// Whether this process has libtorch's own MKL `ssyrk` and `dsyrk` (found and probed; the
/// `syrk` module's "Tensors"), which CPU tensors' symmetric products (`Matrix::gram`,
/// `gram_add`) take — half a general product's flops at any thread count — unless
/// [`use_libtorch_syrk`]`(false)`.
pub fn libtorch_syrk_found() -> bool {
    resolved_syrk::<f32>().is_some() && resolved_syrk::<f64>().is_some()
}
