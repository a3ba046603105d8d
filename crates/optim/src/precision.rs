//! The working precision of the orthogonalization (msign), chosen per backend and device.
//!
//! Muon's reference (and `torch.optim.Muon`) casts every update to bf16 before Newton–Schulz. That
//! is right on hardware that multiplies bf16 natively (GPUs; x86 CPUs with AVX512-BF16 or AMX-BF16;
//! Arm CPUs with the BF16 extension) and slow where libtorch has to emulate bf16 products: there
//! a bf16 orthogonalization costs many times an f32 one (`docs/optim.md`, "Precision per
//! device"). kappa therefore picks the precision per device ([`Precision::Auto`]):
//!
//! | tensor | Auto computes msign in |
//! |---|---|
//! | f64 (any device) | f64 |
//! | f32 / bf16 on CUDA | bf16 |
//! | f32 / bf16 on a CPU with native bf16 products ([`cpu_has_native_bf16`]), from [`AUTO_BF16_MIN_STEP_FLOPS`] per Newton–Schulz step (about 112×112 or 320×80), or from [`AUTO_BF16_MIN_STEP_FLOPS_AVX512_F32`] (about 144×144 or 64×1024) where libtorch's MKL multiplies f32 with AVX-512 and the CPU has no AMX-BF16 (`auto_bf16_min_step_flops`, feature `tch`); a batch counts whole | bf16 |
//! | f32 / bf16 on such a CPU, smaller matrices (bf16 products cost a fixed ≈ 18 µs per call there: f32 is faster and more accurate) | f32 |
//! | f32 / bf16 on any other CPU | f32 |
//! | `ndarray` matrices | their own type |
//!
//! [`cpu_has_native_bf16`] asks the CPU at run time (`is_x86_feature_detected!("avx512bf16")`,
//! which AMX-BF16 CPUs also report; `is_aarch64_feature_detected!("bf16")`), the instruction sets oneDNN (libtorch's
//! CPU matmul for bf16) uses for native bf16 GEMM; the environment variable `KAPPA_CPU_BF16=0|1`
//! overrides the answer (for tests, and for CPUs where the rule is wrong).
//!
//! Accuracy cost (measured by the tests and in `docs/optim.md`): an f32 msign agrees with the f64
//! one to ≈ 1e-5 entrywise; a bf16 msign carries 8 mantissa bits, so the singular values of a bf16
//! Polar Express output lie in ≈ [0.99, 1.01] (with libtorch's emulated bf16 products: [0.995, 1.002], docs/optim.md "Precision per device") and a
//! Stiefel retraction holds WᵀW = I only to ≈ 1e-2 — which is what the paper's runs had. Only the
//! msign calls change precision: momentum, the dual variable, products with W and the update
//! itself stay in the parameter's type.

use kappa_linalg::input::InputError;
use std::sync::OnceLock;

use kappa_linalg::{Matrix, Normed};
use serde::{Deserialize, Serialize};

use crate::elementwise::Elementwise;
use crate::error::Result;

/// The environment variable that overrides [`cpu_has_native_bf16`] (`0` or `1`).
pub const CPU_BF16_ENV: &str = "KAPPA_CPU_BF16";

/// The flops of one Newton–Schulz step, per library call, from which [`Precision::Auto`]
/// computes a CPU tensor's msign in bf16 (on CPUs with native bf16) where f32 products run at
/// AVX2 speed (below, in f32): libtorch's MKL on its generic path (an AMD CPU in a binary that
/// has not answered MKL's vendor check, `kappa_linalg::mkl`), and CPUs with AMX-BF16, whose
/// bf16 products are faster still (kept there unmeasured).
///
/// libtorch's bf16 products on the CPU (oneDNN) cost ≈ 18 µs per call whatever their size, f32
/// products (MKL) a few µs plus their arithmetic, so small matrices orthogonalize faster in f32
/// — and more accurately. Measured (AMD EPYC Zen 5, MKL's generic path, one msign of Muon's
/// quintic, bf16 time / f32 time, 1 thread): 64×64 2.0–2.5, 256×64 1.14–1.43, 96×96 0.81–1.05,
/// 112×112 0.64–0.77, 320×80 0.71–1.01, 128×128 0.55–0.75, 384×384 0.25–0.28 (2 threads move
/// the crossover up about 2×; the rule keeps the one-thread value, so that the choice depends
/// only on the shape and the process). 8·10⁶ sits between 96×96 (5.3·10⁶ per step: f32) and
/// 112×112 (8.4·10⁶: bf16).
pub const AUTO_BF16_MIN_STEP_FLOPS: f64 = 8e6;

/// [`AUTO_BF16_MIN_STEP_FLOPS`] where libtorch's MKL multiplies f32 with its AVX-512 kernels
/// (its Intel code path on a CPU with AVX-512F: every Intel one, and an AMD one in a binary that
/// answers MKL's vendor check, as kappa's do) and bf16 products have no AMX-BF16: f32 is about
/// twice as fast there, so bf16 pays only from larger matrices. 2²⁴.
///
/// Measured (AMD EPYC Zen 5, one `Muon::step` on one matrix, bf16 time / f32 time, 1 thread,
/// two runs): 128×128 (1.3·10⁷ per step) 1.34–1.37, 64×768 (1.3·10⁷) 1.16–1.17, 96×384
/// (1.6·10⁷) 1.15–1.16, 64×1024 (1.7·10⁷) 0.91–0.92, 128×512 0.87, 256×256 0.75–0.76,
/// 768×768 0.66–0.72; the same build through MKL's generic path: 112×112 0.75, 128×128 0.69,
/// 64×768 0.66, 768×768 0.30. 2²⁴ ≈ 1.68·10⁷ sits between 96×384 (1.59·10⁷: f32) and 64×1024
/// (1.73·10⁷: bf16).
pub const AUTO_BF16_MIN_STEP_FLOPS_AVX512_F32: f64 = 16_777_216.0;

/// Flops of one quintic Newton–Schulz step on a matrix of shape `[.., m, n]` (leading
/// dimensions are a batch): B·(4r²s + 2r³) with r = min(m, n), s = max(m, n) — two r×s
/// products and one r×r, as [`AUTO_BF16_MIN_STEP_FLOPS`] counts them.
pub fn ns_step_flops(shape: &[i64]) -> f64 {
    let [batch @ .., m, n] = shape else {
        return 0.0;
    };
    let b: f64 = batch.iter().map(|&d| d as f64).product();
    let (r, s) = ((*m).min(*n) as f64, (*m).max(*n) as f64);
    b * r * r * (4.0 * s + 2.0 * r)
}

/// Whether this CPU has native bf16 matrix products, i.e. bf16 dot-product instructions that
/// libtorch's oneDNN GEMM uses: x86 AVX512-BF16 (which every AMX-BF16 CPU also has), Arm's BF16 extension. Asked once
/// per process (cached); `KAPPA_CPU_BF16=0|1` in the environment at the first call overrides the
/// detection. Decides what [`Precision::Auto`] does on CPU tensors.
pub fn cpu_has_native_bf16() -> bool {
    static ANSWER: OnceLock<bool> = OnceLock::new();
    *ANSWER.get_or_init(
        || match std::env::var(CPU_BF16_ENV).ok().as_deref().map(str::trim) {
            Some("1") | Some("true") => true,
            Some("0") | Some("false") => false,
            _ => detect_native_bf16(),
        },
    )
}

/// Whether this x86-64 CPU has AMX-BF16 tile products (CPUID leaf 7, EDX bit 22), which
/// libtorch's oneDNN uses for bf16 products; `false` on other architectures.
pub fn detect_amx_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        (std::arch::x86_64::__cpuid_count(7, 0).edx >> 22) & 1 == 1
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The hardware answer of [`cpu_has_native_bf16`], without the environment override.
pub fn detect_native_bf16() -> bool {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        // Every CPU with AMX-BF16 (Sapphire Rapids and later) also has AVX512-BF16; the AMX
        // feature test itself is not stable in Rust yet.
        std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("bf16")
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// Where msign (Newton–Schulz, Polar Express or the SVD) computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// bf16 where the device multiplies bf16 natively (CUDA tensors; CPU tensors when
    /// [`cpu_has_native_bf16`] and the matrix has at least [`AUTO_BF16_MIN_STEP_FLOPS`] per
    /// Newton–Schulz step, or [`AUTO_BF16_MIN_STEP_FLOPS_AVX512_F32`] where f32 products take
    /// AVX-512 and bf16 ones no AMX: the module docs), f32 on other CPUs (bf16 is emulated
    /// there, and slower than f32) and for smaller matrices; f64 stays f64, and `ndarray`
    /// matrices compute in their own type.
    #[default]
    Auto,
    /// Always the parameter's own type.
    Native,
    /// f32 (on `ndarray` only for `Array2<f32>`).
    F32,
    /// bf16 (`tch` only), as the paper's and Muon's reference code do.
    Bf16,
}

/// The element-type conversions the optimizers need around msign. Implemented for
/// `ndarray::Array2<f32 | f64>` (which computes in its own type only) and, with the `tch`
/// feature, for `tch::Tensor`.
pub trait WorkingPrecision: Matrix + Elementwise {
    /// A copy of `self` converted to the precision `p` resolves to, or `None` when `self` is
    /// already in it (an `ndarray` matrix with a negative stride gets a standard-layout copy). Errors: a precision the backend cannot compute in
    /// ([`InputError::InvalidArgument`], argument `precision`).
    fn to_working(&self, p: Precision) -> Result<Option<Self>>;

    /// `self` converted to `like`'s element type (the inverse of [`to_working`](Self::to_working)).
    fn to_kind_of(&self, like: &Self) -> Result<Self>;

    /// The name of the element type `p` resolves to for this matrix (`"f32"`, `"bf16"`, `"f64"`).
    fn working_name(&self, p: Precision) -> Result<&'static str>;

    /// [`to_working`](Self::to_working) together with its norm (a [`Normed`] copy) and
    /// ‖self‖_F (the values of [`Matrix::frobenius_norm`]), from one pass over `self` where the
    /// backend has one: contiguous CPU f32 tensors with finite entries converted to bf16
    #[cfg_attr(
        feature = "tch",
        doc = "([`kappa_linalg::tch_backend::to_bf16_normed`])."
    )]
    #[cfg_attr(not(feature = "tch"), doc = "(`to_bf16_normed`, feature `tch`).")]
    /// `Ok(None)` elsewhere, and where `self` is already in the working type.
    fn to_working_with_norm(&self, p: Precision) -> Result<Option<(Normed<Self>, f64)>> {
        let _ = p;
        Ok(None)
    }

    /// W ← d·W + α·O for `self` = W and a direction O in the working type W converts to
    /// ([`to_working`](Self::to_working)), with d = `decay` (none when `None`), in one pass
    /// where the backend has one (contiguous CPU f32 weights and bf16 directions): the values of
    /// [`Matrix::scale`] and [`Matrix::axpy`] on O converted back. `Ok(false)`, with W
    /// unchanged, where it has not; the caller then converts O back.
    fn update_from_working(&mut self, decay: Option<f64>, alpha: f64, o: &Self) -> Result<bool> {
        let _ = (decay, alpha, o);
        Ok(false)
    }
}

impl<A: kappa_linalg::Real> WorkingPrecision for ndarray::Array2<A> {
    fn to_working(&self, p: Precision) -> Result<Option<Self>> {
        self.working_name(p)?;
        // LAPACK takes neither negative nor zero strides (a row-reversed view; a 1×1 or 1×n
        // slice of a larger array): such an array gets a fresh row-major copy.
        Ok(self.strides().iter().any(|&s| s <= 0).then(|| {
            let (r, c) = self.dim();
            Self::from_shape_fn((r, c), |(i, j)| self[[i, j]])
        }))
    }

    fn to_kind_of(&self, _like: &Self) -> Result<Self> {
        Ok(self.duplicate()?)
    }

    fn working_name(&self, p: Precision) -> Result<&'static str> {
        match p {
            Precision::Auto | Precision::Native => Ok(A::NAME),
            Precision::F32 if A::NAME == "f32" => Ok(A::NAME),
            other => Err(InputError::invalid(
                "precision",
                format!(
                    "ndarray matrices compute in their own element type ({}); {other:?} needs \
                     the tch backend (or an Array2 of that type)",
                    A::NAME
                ),
            )
            .into()),
        }
    }
}

#[cfg(feature = "tch")]
pub use tch_impl::auto_bf16_min_step_flops;
#[cfg(feature = "tch")]
pub(crate) use tch_impl::batch_precision;

#[cfg(feature = "tch")]
mod tch_impl {
    use super::*;
    use crate::error::libtorch;
    use tch::{Kind, Tensor};

    fn kind_name(k: Kind) -> &'static str {
        match k {
            Kind::Float => "f32",
            Kind::BFloat16 => "bf16",
            Kind::Double => "f64",
            _ => "unsupported",
        }
    }

    /// The flops per Newton–Schulz step from which [`Precision::Auto`] computes a CPU tensor's
    /// msign in bf16 in this process (asked once, cached):
    /// [`AUTO_BF16_MIN_STEP_FLOPS_AVX512_F32`] where libtorch's MKL takes its Intel code path
    /// (`kappa_linalg::mkl::mkl_dispatch`) on a CPU with AVX-512F and without AMX-BF16
    /// ([`detect_amx_bf16`]), [`AUTO_BF16_MIN_STEP_FLOPS`] everywhere else.
    pub fn auto_bf16_min_step_flops() -> f64 {
        static FLOPS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
        *FLOPS.get_or_init(|| {
            if f32_takes_avx512() && !detect_amx_bf16() {
                AUTO_BF16_MIN_STEP_FLOPS_AVX512_F32
            } else {
                AUTO_BF16_MIN_STEP_FLOPS
            }
        })
    }

    /// Whether libtorch's MKL multiplies f32 with its AVX-512 kernels in this process.
    fn f32_takes_avx512() -> bool {
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        {
            kappa_linalg::mkl::mkl_dispatch().intel_path == Some(true)
                && std::arch::is_x86_feature_detected!("avx512f")
        }
        #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
        {
            false
        }
    }

    fn resolve(t: &Tensor, p: Precision) -> Kind {
        resolve_batch(t, p, 1)
    }

    /// The kind `p` resolves to for `t` when `t`'s msign runs in one library call with
    /// `count − 1` more matrices of its shape (a batched Newton–Schulz): `Auto`'s size rule
    /// counts the flops of the whole call.
    fn resolve_batch(t: &Tensor, p: Precision, count: usize) -> Kind {
        let kind = t.kind();
        match p {
            Precision::Native => kind,
            Precision::F32 => Kind::Float,
            Precision::Bf16 => Kind::BFloat16,
            Precision::Auto => match (kind, t.device().is_cuda()) {
                (Kind::Double, _) => Kind::Double,
                (_, true) => Kind::BFloat16,
                (_, false)
                    if cpu_has_native_bf16()
                        && count as f64 * ns_step_flops(&t.size())
                            >= auto_bf16_min_step_flops() =>
                {
                    Kind::BFloat16
                }
                (_, false) => Kind::Float,
            },
        }
    }

    /// `p` made explicit for a batch of `count` matrices like `first` orthogonalized in one
    /// call ([`Precision::Auto`] decided on the batch's flops), so that every path of a
    /// batched step computes in the same type.
    pub(crate) fn batch_precision(first: &Tensor, count: usize, p: Precision) -> Precision {
        match resolve_batch(first, p, count) {
            k if k == first.kind() => Precision::Native,
            Kind::BFloat16 => Precision::Bf16,
            _ => Precision::F32,
        }
    }

    impl WorkingPrecision for Tensor {
        fn to_working(&self, p: Precision) -> Result<Option<Self>> {
            let k = resolve(self, p);
            if k == self.kind() {
                return Ok(None);
            }
            let _g = tch::no_grad_guard();
            self.f_to_kind(k).map(Some).map_err(libtorch("precision"))
        }

        fn to_kind_of(&self, like: &Self) -> Result<Self> {
            let _g = tch::no_grad_guard();
            self.f_to_kind(like.kind()).map_err(libtorch("precision"))
        }

        fn working_name(&self, p: Precision) -> Result<&'static str> {
            Ok(kind_name(resolve(self, p)))
        }

        fn to_working_with_norm(&self, p: Precision) -> Result<Option<(Normed<Self>, f64)>> {
            if self.kind() != Kind::Float || resolve(self, p) != Kind::BFloat16 {
                return Ok(None);
            }
            let _g = tch::no_grad_guard();
            Ok(kappa_linalg::tch_backend::to_bf16_normed(self))
        }

        fn update_from_working(
            &mut self,
            decay: Option<f64>,
            alpha: f64,
            o: &Self,
        ) -> Result<bool> {
            Ok(crate::fused::update_from_bf16(self, decay, alpha, o).is_some())
        }
    }
}
