//! Which BLAS kernel this process runs, and a fast one in place of a generic fallback.
//!
//! OpenBLAS built with `DYNAMIC_ARCH` (Debian's is) picks a kernel for the CPU when it loads. A
//! release older than the CPU may not know it and fall back to a generic SSE kernel ("Prescott",
//! "Core2", …), several times slower than the CPU allows: Debian's 0.3.21 does so on recent Intel
//! Xeons (family 6 model 207), where its own Skylake-X kernel runs 4–8× faster.
//!
//! kappa-linalg therefore checks the kernel once, when the program starts (an ELF `.init_array`
//! entry, which runs after the shared libraries are initialized and before `main`): if OpenBLAS
//! chose a generic SSE kernel on a CPU with AVX2 or more and the environment did not choose it
//! through `OPENBLAS_CORETYPE`, it asks OpenBLAS to re-initialize with the best of its own
//! kernels that the CPU's features allow (Cooperlake for AVX-512 with BF16, Skylake-X for
//! AVX-512, Haswell for AVX2 with FMA), through the library's exported
//! `gotoblas_dynamic_quit`/`gotoblas_dynamic_init` — the same path OpenBLAS takes at load time,
//! with `OPENBLAS_CORETYPE` set only for that call. OpenBLAS's thread pool, which it starts when
//! it loads and whose workers read the kernel table as they start, is stopped (its threads
//! joined, through the exported `blas_thread_shutdown_`, as OpenBLAS's own fork handler does)
//! before the switch; the next threaded call starts it again. A kernel set in the environment
//! is never replaced (some environments set one on purpose, where a kernel is known to compute
//! wrong results on a CPU).
//!
//! [`blas_report`] says which kernel runs, how it was chosen ([`KernelSelection`]), what the CPU
//! could use, and whether it is still a generic fallback; kappa's experiments write it into every
//! run's `run.json` and warn when it is generic.

// The FFI to OpenBLAS, the `.init_array` entry and the kernel switch are unsafe by nature; each
// use states its contract.
#![allow(unsafe_code)]

use std::fmt;
use std::sync::Mutex;

use crate::error::{LinalgError, Result};
use crate::input::InputError;
/// The widest x86-64 vector level a CPU or a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum VectorLevel {
    /// Unknown (not x86-64, or a kernel name kappa does not know).
    Unknown,
    /// SSE2/SSE3 only: the generic x86-64 kernels.
    Sse,
    /// AVX (Sandy Bridge, Bulldozer).
    Avx,
    /// AVX2 with FMA (Haswell, Zen).
    Avx2,
    /// AVX-512 F/BW/DQ/VL (Skylake-X and newer).
    Avx512,
}

impl VectorLevel {
    /// The level of the CPU this process runs on.
    pub fn of_this_cpu() -> Self {
        cpu_level()
    }

    /// The level an OpenBLAS kernel (its `openblas_get_corename` name, case-insensitive) uses.
    pub fn of_openblas_core(core: &str) -> Self {
        let core = core.to_ascii_lowercase();
        let is = |names: &[&str]| names.iter().any(|n| core == *n);
        if is(&["skylakex", "cooperlake", "sapphirerapids"]) {
            VectorLevel::Avx512
        } else if is(&["haswell", "zen", "excavator", "steamroller"]) {
            VectorLevel::Avx2
        } else if is(&["sandybridge", "bulldozer", "piledriver"]) {
            VectorLevel::Avx
        } else if is(&[
            "prescott",
            "core2",
            "penryn",
            "dunnington",
            "nehalem",
            "atom",
            "opteron",
            "opteron_sse3",
            "barcelona",
            "bobcat",
            "katmai",
            "coppermine",
            "northwood",
            "banias",
            "athlon",
            "nano",
            "generic",
        ]) {
            VectorLevel::Sse
        } else {
            VectorLevel::Unknown
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn cpu_level() -> VectorLevel {
    use std::arch::is_x86_feature_detected as has;
    if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
        VectorLevel::Avx512
    } else if has!("avx2") && has!("fma") {
        VectorLevel::Avx2
    } else if has!("avx") {
        VectorLevel::Avx
    } else {
        VectorLevel::Sse
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_level() -> VectorLevel {
    VectorLevel::Unknown
}

/// How the kernel in use was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelSelection {
    /// Nobody has looked (not OpenBLAS, or the start-up check did not run on this platform).
    NotInspected,
    /// OpenBLAS's own choice for this CPU, kept.
    Library,
    /// `OPENBLAS_CORETYPE` from the environment, kept.
    Environment,
    /// OpenBLAS fell back to the generic kernel `from`; kappa selected the one now running.
    Upgraded {
        /// The generic kernel OpenBLAS had chosen.
        from: String,
    },
    /// Set by a call of [`set_openblas_kernel`].
    Explicit,
}

/// What [`blas_report`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlasReport {
    /// The library and its build (`openblas_get_config`), or `None` without the
    /// `openblas-system` feature (another backend was linked; kappa cannot ask it).
    pub library: Option<String>,
    /// The kernel OpenBLAS runs (`openblas_get_corename`), e.g. `Haswell`.
    pub core: Option<String>,
    /// How that kernel was chosen.
    pub selection: KernelSelection,
    /// `OPENBLAS_CORETYPE` as set in the environment, if it is.
    pub coretype_env: Option<String>,
    /// The vector level of the kernel.
    pub core_level: VectorLevel,
    /// The vector level of this CPU.
    pub cpu_level: VectorLevel,
}

impl BlasReport {
    /// Whether the kernel is a generic fallback on a CPU that could do much better: an SSE-level
    /// kernel on a CPU with AVX2 or more. `false` when either level is unknown.
    pub fn is_generic_fallback(&self) -> bool {
        self.core_level == VectorLevel::Sse && self.cpu_level >= VectorLevel::Avx2
    }

    /// Whether the kernel uses a narrower vector level than the CPU has, e.g. Haswell's AVX2 on
    /// an AVX-512 CPU, which `OPENBLAS_CORETYPE` can force (on an AMD EPYC Zen 5: f32 GEMM at
    /// ≈ 105 GFLOP/s on Haswell, ≈ 200 on Cooperlake). `false` when either level is unknown.
    pub fn is_below_cpu(&self) -> bool {
        self.core_level != VectorLevel::Unknown && self.core_level < self.cpu_level
    }
}

impl fmt::Display for BlasReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.library, &self.core) {
            (Some(lib), Some(core)) => write!(f, "{lib}, kernel {core}")?,
            _ => write!(f, "a BLAS other than the system OpenBLAS (not inspected)")?,
        }
        write!(f, "; CPU level {:?}", self.cpu_level)?;
        if let KernelSelection::Upgraded { from } = &self.selection {
            write!(
                f,
                "; selected by kappa in place of OpenBLAS's generic {from}"
            )?;
        }
        if let Some(env) = &self.coretype_env {
            write!(f, "; OPENBLAS_CORETYPE={env} (from the environment)")?;
        }
        if self.is_below_cpu() && !self.is_generic_fallback() {
            write!(
                f,
                "; note: the kernel uses {:?}, this CPU has {:?}",
                self.core_level, self.cpu_level
            )?;
            if self.coretype_env.is_some() {
                write!(f, " (unset OPENBLAS_CORETYPE for its best kernel)")?;
            }
        }
        if self.is_generic_fallback() {
            write!(
                f,
                "; WARNING: a generic kernel on a CPU with {:?} — matrix products run several \
                 times slower than this CPU allows",
                self.cpu_level
            )?;
        }
        Ok(())
    }
}

/// How the current kernel was chosen; written by the start-up check and the setters below.
static SELECTION: Mutex<KernelSelection> = Mutex::new(KernelSelection::NotInspected);

fn record(selection: KernelSelection) {
    *SELECTION.lock().unwrap_or_else(|e| e.into_inner()) = selection;
}

fn coretype_env() -> Option<String> {
    std::env::var("OPENBLAS_CORETYPE")
        .ok()
        .filter(|v| !v.is_empty())
}

/// The number of threads the system OpenBLAS computes on, or `None` when kappa-linalg is built
/// without it (feature `openblas-system`) and cannot tell.
pub fn blas_threads() -> Option<usize> {
    openblas::threads()
}

/// This CPU's model name (the first `model name` of `/proc/cpuinfo`; "unknown" where there is
/// none) and its [`VectorLevel`]: what a run folder or a benchmark records of the machine.
///
/// ```
/// let cpu = kappa_linalg::cpu_model(); // e.g. "AMD EPYC 9B45 (Avx512)"
/// assert!(cpu.ends_with(')'));
/// ```
pub fn cpu_model() -> String {
    let name = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    format!("{name} ({:?})", cpu_level())
}

/// Which BLAS kernel this process runs (see the module docs).
///
/// ```
/// let report = kappa_linalg::blas_report();
/// println!("{report}"); // e.g. "OpenBLAS 0.3.21 … Cooperlake, kernel Cooperlake; CPU level Avx512"
/// assert!(!report.is_generic_fallback() || report.coretype_env.is_some());
/// ```
pub fn blas_report() -> BlasReport {
    let (library, core) = openblas::names();
    let core_level = core
        .as_deref()
        .map_or(VectorLevel::Unknown, VectorLevel::of_openblas_core);
    BlasReport {
        library,
        core,
        selection: SELECTION.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        coretype_env: coretype_env(),
        core_level,
        cpu_level: cpu_level(),
    }
}

/// OpenBLAS kernels for this CPU's features, best first (empty off x86-64 or below AVX2).
pub fn kernels_for_this_cpu() -> &'static [&'static str] {
    kernels_for(cpu_level(), cpu_has_avx512_bf16())
}

fn kernels_for(level: VectorLevel, bf16: bool) -> &'static [&'static str] {
    match level {
        VectorLevel::Avx512 if bf16 => &["Cooperlake", "SkylakeX", "Haswell"],
        VectorLevel::Avx512 => &["SkylakeX", "Haswell"],
        VectorLevel::Avx2 => &["Haswell"],
        _ => &[],
    }
}

#[cfg(target_arch = "x86_64")]
fn cpu_has_avx512_bf16() -> bool {
    std::arch::is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has_avx512_bf16() -> bool {
    false
}

/// Replaces a generic-fallback kernel by the best one this CPU allows (what the start-up check
/// does) and returns how the kernel in use is now chosen. Does nothing when
/// `OPENBLAS_CORETYPE` is set, when the kernel is not a generic fallback, or when the OpenBLAS
/// linked cannot switch kernels (a build without `DYNAMIC_ARCH`).
///
/// # Safety
/// No BLAS or LAPACK call may be in flight on any thread, and none may start until this
/// returns: OpenBLAS swaps its kernel table underneath them. (The start-up check calls it
/// before `main`, before any BLAS call; OpenBLAS's own workers are stopped for the switch.)
pub unsafe fn upgrade_generic_kernel() -> KernelSelection {
    let selection = choose_upgrade();
    record(selection.clone());
    selection
}

fn choose_upgrade() -> KernelSelection {
    if !openblas::linked() {
        return KernelSelection::NotInspected;
    }
    if coretype_env().is_some() {
        return KernelSelection::Environment;
    }
    let before = blas_report();
    let Some(from) = before.core.clone().filter(|_| before.is_generic_fallback()) else {
        return KernelSelection::Library;
    };
    for &kernel in kernels_for_this_cpu() {
        // SAFETY: forwarded from the caller's contract.
        if unsafe { openblas::switch_to(kernel) }
            .is_some_and(|now| now.eq_ignore_ascii_case(kernel))
        {
            return KernelSelection::Upgraded { from };
        }
    }
    // None of the candidates took: go back to what OpenBLAS had chosen.
    // SAFETY: as above.
    let _ = unsafe { openblas::switch_to(&from) };
    KernelSelection::Library
}

/// Makes OpenBLAS run the kernel `name` (one of its `OPENBLAS_CORETYPE` names, e.g. `Haswell`,
/// `SkylakeX`, `Prescott`) and returns the name it reports now. For measurements and tests: it
/// refuses when `OPENBLAS_CORETYPE` is set (the environment's choice is kept), and with an
/// OpenBLAS that cannot switch kernels or does not have `name` (then the kernel is unchanged).
///
/// # Safety
/// As for [`upgrade_generic_kernel`]: no BLAS or LAPACK call in flight on any thread.
pub unsafe fn set_openblas_kernel(name: &str) -> Result<String> {
    let refuse = |reason: String| LinalgError::from(InputError::invalid("name", reason));
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(refuse(format!(
            "`{name}` is not a kernel name (letters, digits and `_`, e.g. `Haswell`)"
        )));
    }
    if let Some(env) = coretype_env() {
        return Err(refuse(format!(
            "OPENBLAS_CORETYPE={env} is set in the environment; kappa keeps it"
        )));
    }
    if !openblas::can_switch() {
        return Err(refuse(
            "the linked BLAS is not an OpenBLAS that can switch kernels (DYNAMIC_ARCH)".into(),
        ));
    }
    let before = openblas::names().1.unwrap_or_default();
    // SAFETY: forwarded from the caller's contract.
    let now = unsafe { openblas::switch_to(name) }.unwrap_or_default();
    if now.eq_ignore_ascii_case(name) {
        record(KernelSelection::Explicit);
        return Ok(now);
    }
    // SAFETY: as above.
    let _ = unsafe { openblas::switch_to(&before) };
    Err(refuse(format!(
        "this OpenBLAS has no kernel `{name}` (it reported `{now}`); kept `{before}`"
    )))
}

/// The start-up check: runs before `main` in every Linux executable that links kappa-linalg.
#[cfg(all(feature = "openblas-system", target_os = "linux"))]
#[used]
#[link_section = ".init_array"]
static CHECK_AT_START: extern "C" fn() = check_at_start;

#[cfg(all(feature = "openblas-system", target_os = "linux"))]
extern "C" fn check_at_start() {
    // A panic must not unwind into the C runtime; the check is best-effort.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: before `main`, after the libraries' initializers: no BLAS call has been made;
        // OpenBLAS's starting workers are joined by the switch itself.
        unsafe { upgrade_generic_kernel() }
    });
}

#[cfg(feature = "openblas-system")]
mod openblas {
    use std::ffi::{c_char, c_void, CStr};

    extern "C" {
        fn openblas_get_config() -> *const c_char;
        fn openblas_get_corename() -> *const c_char;
        fn openblas_get_num_threads() -> std::ffi::c_int;
    }

    /// The number of threads OpenBLAS computes on.
    pub(super) fn threads() -> Option<usize> {
        // SAFETY: takes no arguments and reads OpenBLAS's thread count, set at load time.
        Some(unsafe { openblas_get_num_threads() }.max(1) as usize)
    }

    fn owned(p: *const c_char) -> Option<String> {
        if p.is_null() {
            return None;
        }
        // SAFETY: OpenBLAS returns a pointer to a static NUL-terminated string (checked non-null
        // above), valid for the life of the process.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    pub(super) fn linked() -> bool {
        true
    }

    /// The library's build string and kernel name.
    pub(super) fn names() -> (Option<String>, Option<String>) {
        // SAFETY: both functions take no arguments and only read OpenBLAS's global state, which
        // the library initializes when it is loaded (before `main`).
        let (config, core) = unsafe { (openblas_get_config(), openblas_get_corename()) };
        (owned(config), owned(core))
    }

    type Hook = unsafe extern "C" fn();

    /// The exported functions a kernel switch needs, looked up at run time so that every
    /// OpenBLAS build links: `gotoblas_dynamic_quit`/`gotoblas_dynamic_init` (only `DYNAMIC_ARCH`
    /// builds have them) and `blas_thread_shutdown_` (only builds with their own thread pool).
    struct Hooks {
        quit: Hook,
        init: Hook,
        stop_workers: Option<Hook>,
    }

    fn find(name: &CStr) -> Option<Hook> {
        // SAFETY: dlsym with RTLD_DEFAULT searches the loaded objects; `name` is NUL-terminated.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        // SAFETY: a non-null result is the address of the exported function; the three looked
        // up here all have the C signature `void f(void)`.
        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, Hook>(p) })
    }

    fn hooks() -> Option<Hooks> {
        Some(Hooks {
            quit: find(c"gotoblas_dynamic_quit")?,
            init: find(c"gotoblas_dynamic_init")?,
            stop_workers: find(c"blas_thread_shutdown_"),
        })
    }

    pub(super) fn can_switch() -> bool {
        hooks().is_some()
    }

    /// Re-initializes OpenBLAS with `OPENBLAS_CORETYPE=kernel` for that call only; returns the
    /// kernel it reports afterwards (OpenBLAS falls back to its default for an unknown name).
    ///
    /// OpenBLAS's own thread pool starts when the library loads, and each worker's first act
    /// reads the kernel table (it allocates its buffer and, finding the table unset, selects a
    /// kernel itself). So the pool is stopped first, its threads joined, as OpenBLAS's own fork
    /// handler does; the next threaded call starts it again on the new kernel.
    ///
    /// # Safety
    /// No BLAS call in flight on any thread; no other thread reading the environment.
    pub(super) unsafe fn switch_to(kernel: &str) -> Option<String> {
        let hooks = hooks()?;
        std::env::set_var("OPENBLAS_CORETYPE", kernel);
        // SAFETY: the caller guarantees no BLAS call is in flight; `stop_workers` joins the
        // pool's threads (idle, or finishing their start-up), after which no thread but this
        // one touches OpenBLAS; `quit` clears the kernel table pointer and `init` selects and
        // initializes a kernel from OPENBLAS_CORETYPE.
        unsafe {
            if let Some(stop) = hooks.stop_workers {
                stop();
            }
            (hooks.quit)();
            (hooks.init)();
        }
        std::env::remove_var("OPENBLAS_CORETYPE");
        names().1
    }
}

#[cfg(not(feature = "openblas-system"))]
mod openblas {
    pub(super) fn linked() -> bool {
        false
    }

    pub(super) fn names() -> (Option<String>, Option<String>) {
        (None, None)
    }

    pub(super) fn threads() -> Option<usize> {
        None
    }

    pub(super) fn can_switch() -> bool {
        false
    }

    pub(super) unsafe fn switch_to(_kernel: &str) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "openblas-system")]
    #[test]
    fn the_system_openblas_is_inspected() {
        let r = blas_report();
        assert!(
            r.library.as_deref().is_some_and(|l| l.contains("OpenBLAS")),
            "{r:?}"
        );
        assert!(r.core.as_deref().is_some_and(|c| !c.is_empty()), "{r:?}");
        eprintln!("{r}");
    }

    #[test]
    fn kernel_names_map_to_levels() {
        assert_eq!(VectorLevel::of_openblas_core("Prescott"), VectorLevel::Sse);
        assert_eq!(VectorLevel::of_openblas_core("HASWELL"), VectorLevel::Avx2);
        assert_eq!(
            VectorLevel::of_openblas_core("Cooperlake"),
            VectorLevel::Avx512
        );
        assert_eq!(VectorLevel::of_openblas_core("Zen"), VectorLevel::Avx2);
        assert_eq!(
            VectorLevel::of_openblas_core("NewCore9"),
            VectorLevel::Unknown
        );
    }

    fn report(core: VectorLevel, cpu: VectorLevel) -> BlasReport {
        BlasReport {
            library: Some("OpenBLAS".into()),
            core: Some("x".into()),
            selection: KernelSelection::Library,
            coretype_env: None,
            core_level: core,
            cpu_level: cpu,
        }
    }

    #[test]
    fn a_narrower_kernel_than_the_cpu_is_noted_not_warned() {
        use VectorLevel::*;
        assert!(report(Avx2, Avx512).is_below_cpu());
        assert!(!report(Avx512, Avx512).is_below_cpu());
        assert!(!report(Unknown, Avx512).is_below_cpu());
        assert!(!report(Avx512, Unknown).is_below_cpu());
        let forced = BlasReport {
            selection: KernelSelection::Environment,
            coretype_env: Some("Haswell".into()),
            ..report(Avx2, Avx512)
        };
        let text = forced.to_string();
        assert!(
            text.contains("note: the kernel uses Avx2, this CPU has Avx512"),
            "{text}"
        );
        assert!(text.contains("unset OPENBLAS_CORETYPE"), "{text}");
        assert!(!text.contains("WARNING"), "{text}");
        assert!(!report(Avx512, Avx512).to_string().contains("note"));
    }

    #[test]
    fn a_generic_kernel_on_an_avx2_cpu_is_a_fallback() {
        assert!(report(VectorLevel::Sse, VectorLevel::Avx512).is_generic_fallback());
        assert!(report(VectorLevel::Sse, VectorLevel::Avx2).is_generic_fallback());
        assert!(!report(VectorLevel::Sse, VectorLevel::Avx).is_generic_fallback());
        assert!(!report(VectorLevel::Avx2, VectorLevel::Avx512).is_generic_fallback());
        assert!(!report(VectorLevel::Unknown, VectorLevel::Avx512).is_generic_fallback());
        let text = report(VectorLevel::Sse, VectorLevel::Avx512).to_string();
        assert!(text.contains("WARNING"), "{text}");
    }
}
