//! Which BLAS kernel this process runs, and whether it is a generic fallback.
//!
//! OpenBLAS built with `DYNAMIC_ARCH` (Debian's is) picks a kernel for the CPU when it loads. A
//! release older than the CPU may not know it and fall back to a generic SSE kernel ("Prescott",
//! "Core2", …), several times slower than the CPU allows. [`blas_report`] says which kernel is
//! running, what the CPU could use, and whether that is such a fallback; kappa's experiments
//! write it into every run's `run.json` and warn when it is generic.
//!
//! The environment variable `OPENBLAS_CORETYPE` overrides OpenBLAS's choice at load time; kappa
//! reports it and never changes it (some environments set it on purpose, where a kernel is
//! known to compute wrong results on a CPU).

use std::fmt;

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

/// What [`blas_report`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlasReport {
    /// The library and its build (`openblas_get_config`), or `None` without the
    /// `openblas-system` feature (another backend was linked; kappa cannot ask it).
    pub library: Option<String>,
    /// The kernel OpenBLAS runs (`openblas_get_corename`), e.g. `Haswell`.
    pub core: Option<String>,
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
}

impl fmt::Display for BlasReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.library, &self.core) {
            (Some(lib), Some(core)) => write!(f, "{lib}, kernel {core}")?,
            _ => write!(f, "a BLAS other than the system OpenBLAS (not inspected)")?,
        }
        write!(f, "; CPU level {:?}", self.cpu_level)?;
        if let Some(env) = &self.coretype_env {
            write!(f, "; OPENBLAS_CORETYPE={env} (from the environment)")?;
        }
        if self.is_generic_fallback() {
            write!(
                f,
                "; WARNING: a generic kernel on a CPU with {:?} — matrix products run several \
                 times slower than this CPU allows (a newer OpenBLAS knows this CPU)",
                self.cpu_level
            )?;
        }
        Ok(())
    }
}

/// Which BLAS kernel this process runs (see the module docs).
///
/// ```
/// let report = kappa_linalg::blas_report();
/// println!("{report}"); // e.g. "OpenBLAS 0.3.21 … Cooperlake, kernel Cooperlake; CPU level Avx512"
/// if report.is_generic_fallback() {
///     eprintln!("matrix products will be slow on this machine");
/// }
/// ```
pub fn blas_report() -> BlasReport {
    let (library, core) = openblas::names();
    let core_level = core
        .as_deref()
        .map_or(VectorLevel::Unknown, VectorLevel::of_openblas_core);
    BlasReport {
        library,
        core,
        coretype_env: std::env::var("OPENBLAS_CORETYPE")
            .ok()
            .filter(|v| !v.is_empty()),
        core_level,
        cpu_level: cpu_level(),
    }
}

#[cfg(feature = "openblas-system")]
#[allow(unsafe_code)]
mod openblas {
    use std::ffi::{c_char, CStr};

    extern "C" {
        fn openblas_get_config() -> *const c_char;
        fn openblas_get_corename() -> *const c_char;
    }

    fn owned(p: *const c_char) -> Option<String> {
        if p.is_null() {
            return None;
        }
        // SAFETY: OpenBLAS returns a pointer to a static NUL-terminated string (checked non-null
        // above), valid for the life of the process.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// The library's build string and kernel name.
    pub(super) fn names() -> (Option<String>, Option<String>) {
        // SAFETY: both functions take no arguments and only read OpenBLAS's global state, which
        // the library initializes when it is loaded (before `main`).
        let (config, core) = unsafe { (openblas_get_config(), openblas_get_corename()) };
        (owned(config), owned(core))
    }
}

#[cfg(not(feature = "openblas-system"))]
mod openblas {
    pub(super) fn names() -> (Option<String>, Option<String>) {
        (None, None)
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

    #[test]
    fn a_generic_kernel_on_an_avx2_cpu_is_a_fallback() {
        let report = |core: VectorLevel, cpu: VectorLevel| BlasReport {
            library: Some("OpenBLAS".into()),
            core: Some("x".into()),
            coretype_env: None,
            core_level: core,
            cpu_level: cpu,
        };
        assert!(report(VectorLevel::Sse, VectorLevel::Avx512).is_generic_fallback());
        assert!(report(VectorLevel::Sse, VectorLevel::Avx2).is_generic_fallback());
        assert!(!report(VectorLevel::Sse, VectorLevel::Avx).is_generic_fallback());
        assert!(!report(VectorLevel::Avx2, VectorLevel::Avx512).is_generic_fallback());
        assert!(!report(VectorLevel::Unknown, VectorLevel::Avx512).is_generic_fallback());
        let text = report(VectorLevel::Sse, VectorLevel::Avx512).to_string();
        assert!(text.contains("WARNING"), "{text}");
    }
}
