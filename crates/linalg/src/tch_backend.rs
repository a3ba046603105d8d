//! The `tch::Tensor` backend of [`Matrix`] (feature `tch`): f32, bf16 and f64 tensors on CPU or
//! CUDA, and conversions to and from `ndarray`.
//!
//! Conventions:
//!
//! * A matrix is a 2-D tensor of kind `Float`, `BFloat16` or `Double`; anything else is rejected
//!   by [`Matrix::validate`] with [`InputError::ShapeMismatch`] or
//!   [`LinalgError::UnsupportedDtype`]. Products run in the tensor's own kind and on its device
//!   (bf16 is emulated, and slow, on CPUs without bf16 units: prefer f32 there).
//! * Every operation runs under `tch::no_grad_guard()`: the backend never records autograd
//!   history, so an optimizer can call it on parameters and gradients directly.
//! * Reductions that return a number ([`Matrix::frobenius_norm`]) compute in f64 on the device
//!   and synchronize with it. The SVD-based operations compute bf16 inputs in f32 (libtorch has no
//!   bf16 SVD) and return the input's kind.
//! * libtorch errors are returned as [`LinalgError::Backend`], never as panics. Calls that pass
//!   a scalar to libtorch (`scale`, `axpy`, `gemm`, `mul_add`, `frobenius_norm`) first check
//!   that every operand is a supported kind on the first operand's kind and device
//!   ([`LinalgError::UnsupportedDtype`]): tch turns a libtorch error inside such a call into a
//!   panic in the scalar's destructor, so it must not happen.
//! * The SVD-based operations run on an exact power-of-two rescaling of the input (max |x_ij|
//!   into [0.5, 1)), as the `ndarray` backend does (see [`crate::svd`]): entries near the kind's
//!   `MAX` cannot overflow the SVD. Singular values are scaled back in `f64`
//!   ([`LinalgError::Overflow`] beyond `f64::MAX`); the polar factor is scale-free.
//!
//! Backend agreement (tested): for f32 tensors on CPU, Newton–Schulz results agree with the
//! `ndarray` f32 backend to max |Δ| ≤ 1e-4 (entries are O(1/√n)), singular values to a relative
//! 1e-5·σ₁, and with the `ndarray` f64 backend to 1e-3; for bf16 to about 5e-2 (8 mantissa bits).

use crate::input::InputError;
use ndarray::{Array2, ArrayView2};
use tch::{Device, Kind, Tensor};

use crate::error::{LinalgError, Result};
use crate::matrix::Matrix;
use crate::scalar::{Pow2, Real};
use crate::syrk::syrk_tensor;

const SUPPORTED: &str = "Float (f32), BFloat16 (bf16), Double (f64)";

pub(crate) fn backend(arg: &'static str) -> impl FnOnce(tch::TchError) -> LinalgError {
    // libtorch appends a C++ backtrace to its messages; keep the first line.
    move |e| LinalgError::Backend {
        arg,
        message: e.to_string().lines().next().unwrap_or_default().to_string(),
    }
}

fn check_kind(arg: &'static str, kind: Kind) -> Result<()> {
    match kind {
        Kind::Float | Kind::BFloat16 | Kind::Double => Ok(()),
        other => Err(LinalgError::UnsupportedDtype {
            arg,
            dtype: format!("{other:?}"),
            supported: SUPPORTED,
        }),
    }
}

fn dims2(t: &Tensor) -> Option<(usize, usize)> {
    match t.size().as_slice() {
        [m, n] => Some((usize::try_from(*m).ok()?, usize::try_from(*n).ok()?)),
        _ => None,
    }
}

/// Whether every entry of a contiguous CPU f32, f64 or bf16 tensor is finite, scanned where it
/// lies on the vector units ([`crate::input::all_finite`], bf16 by its exponent bits
/// ([`crate::scalar::bf16_bits_all_finite`]): no libtorch call, no synchronization); `None`
/// for any other tensor. For a small matrix this is about a microsecond where
/// libtorch's sum and the read-back of its value are several.
#[allow(unsafe_code)]
pub(crate) fn all_finite_in_place(t: &Tensor) -> Option<bool> {
    if !t.defined() || t.device() != Device::Cpu || !t.is_contiguous() {
        return None;
    }
    // SAFETY: `t` is a defined, contiguous CPU tensor (checked above) of the kind each arm
    // matches, as `all_finite_entries` requires.
    match t.kind() {
        Kind::Float => Some(unsafe { all_finite_entries::<f32>(t) }),
        Kind::Double => Some(unsafe { all_finite_entries::<f64>(t) }),
        Kind::BFloat16 => Some(unsafe { all_finite_bf16(t) }),
        _ => None,
    }
}

/// A contiguous CPU f32 tensor converted to bf16 (the values of libtorch's `to_kind`, bit for
/// bit, for finite entries), with its norm, and ‖x‖_F of the input (the value of
/// [`Matrix::frobenius_norm`] for `x`), in one read of `x` instead of the three that converting,
/// summing the input's squares and then the result's take
/// ([`crate::scalar::sums_of_squares_to_bf16`], on AVX-512 or AVX2 where the CPU has them; the
/// same bits on each). Single-threaded: the norms' one lane order is what makes them
/// `frobenius_norm`'s. `None` when `x` is not a defined, contiguous CPU f32 tensor, is empty,
/// or has an entry that is not finite or whose bf16 rounding is not (then
/// [`Normed::new`](crate::Normed::new) on the converted tensor says which).
///
/// ```
/// use kappa_linalg::{tch_backend::to_bf16_normed, Matrix};
/// let x = tch::Tensor::from_slice(&[3.0f32, 4.0, 1.0 / 3.0, 1e-3]).reshape([2, 2]);
/// let (normed, fro) = to_bf16_normed(&x).unwrap();
/// assert_eq!(fro, Matrix::frobenius_norm(&x).unwrap());
/// assert_eq!(normed.fro(), Matrix::frobenius_norm(normed.matrix()).unwrap());
/// assert!(normed.matrix().equal(&x.to_kind(tch::Kind::BFloat16)));
/// ```
#[allow(unsafe_code)]
pub fn to_bf16_normed(x: &Tensor) -> Option<(crate::Normed<Tensor>, f64)> {
    let n = x.numel();
    let contiguous_f32 = x.defined() && x.kind() == Kind::Float && x.is_contiguous();
    if !contiguous_f32 || x.device() != Device::Cpu || n == 0 {
        return None;
    }
    let out = Tensor::f_empty(x.size(), (Kind::BFloat16, Device::Cpu)).ok()?;
    // SAFETY: `x` is a defined, contiguous CPU f32 tensor of n elements (checked above), alive
    // and only read while the caller borrows it; `out` was just allocated here as a contiguous
    // CPU bf16 tensor of n 16-bit elements, disjoint from `x`, and nothing else refers to it.
    let (input, rounded) = unsafe {
        let x = std::slice::from_raw_parts(x.data_ptr().cast::<f32>(), n);
        let o = std::slice::from_raw_parts_mut(out.data_ptr().cast::<u16>(), n);
        bf16_with_sums_of_squares(x, o)?
    };
    if !(input.is_finite() && rounded.is_finite()) {
        return None;
    }
    // The norm is `frobenius_norm`'s: the same in-place sum (`sums_of_squares_in_place`).
    Some((crate::Normed::from_parts(out, rounded.sqrt()), input.sqrt()))
}

/// Slice i of the contiguous CPU tensor `x` = [B, m, n] times `factors[i]`, each product in the
/// kind's arithmetic and rounded once (f32 for bf16, with the factor rounded to f32): the values
/// of libtorch's `mul` by the factors as a [B, 1, 1] tensor of that arithmetic, in one pass, no
/// f32 intermediate for bf16. With `owned` (no other tensor shares `x`'s storage) the slices
/// are scaled in place and `x` itself is returned, else a new tensor: f32 and f64 written from
/// `x` in the one pass, bf16 (whose batches kappa's conversions own) a copy scaled in place.
/// `None` for another tensor, or a factor count that is not B.
#[allow(unsafe_code)]
pub(crate) fn scaled_slices(x: &Tensor, factors: &[f64], owned: bool) -> Option<Tensor> {
    let [b, m, n] = x.size()[..] else {
        return None;
    };
    let run = (m * n) as usize;
    let fits = x.defined() && x.is_contiguous() && x.device() == Device::Cpu;
    let kind_fits = matches!(x.kind(), Kind::BFloat16 | Kind::Float | Kind::Double);
    if !fits || !kind_fits || b <= 0 || run == 0 || factors.len() != b as usize {
        return None;
    }
    let count = b as usize * run;
    if !owned && x.kind() != Kind::BFloat16 {
        let out = x.f_empty_like().ok()?;
        // SAFETY: `x` is a defined, contiguous CPU f32 or f64 tensor of `count` elements
        // (checked above), only read here; `out` was just allocated like it (contiguous, same
        // kind and count), disjoint from it, and nothing else refers to it.
        unsafe {
            match x.kind() {
                Kind::Float => scale_into::<f32>(x, &out, count, run, factors, |f| f as f32),
                _ => scale_into::<f64>(x, &out, count, run, factors, |f| f),
            }
        }
        return Some(out);
    }
    let out = match owned {
        true => x.shallow_clone(),
        false => {
            let mut copy = x.f_empty_like().ok()?;
            copy.f_copy_(x).ok()?;
            copy
        }
    };
    // SAFETY: `out` is a defined, contiguous CPU tensor of `count` elements (checked above; a
    // copy keeps both) of the kind each arm matches (bf16 as its bits), and no other tensor
    // refers to its storage while this runs (`owned`, or a copy made here): this is the only
    // reference to the data.
    unsafe {
        match out.kind() {
            Kind::BFloat16 => {
                let os = std::slice::from_raw_parts_mut(out.data_ptr().cast::<u16>(), count);
                for (o, &f) in os.chunks_mut(run).zip(factors) {
                    scale_bf16(o, f as f32);
                }
            }
            Kind::Float => scale_in_place::<f32>(&out, count, run, factors, |f| f as f32),
            _ => scale_in_place::<f64>(&out, count, run, factors, |f| f),
        }
    }
    Some(out)
}

/// [`scaled_slices`]'s product of f32 or f64 slices into `out`, the factor converted by `cast`.
///
/// # Safety
///
/// `x` and `out` must be defined, contiguous CPU tensors of `count` elements of type `A`, with
/// disjoint storage; nothing else may write `x` or refer to `out` while this runs.
#[allow(unsafe_code)]
unsafe fn scale_into<A: Copy + std::ops::Mul<Output = A>>(
    x: &Tensor,
    out: &Tensor,
    count: usize,
    run: usize,
    factors: &[f64],
    cast: impl Fn(f64) -> A,
) {
    // SAFETY: by this function's contract.
    let (xs, os) = unsafe {
        (
            std::slice::from_raw_parts(x.data_ptr().cast::<A>(), count),
            std::slice::from_raw_parts_mut(out.data_ptr().cast::<A>(), count),
        )
    };
    for ((x, o), &f) in xs.chunks(run).zip(os.chunks_mut(run)).zip(factors) {
        let f = cast(f);
        o.iter_mut().zip(x).for_each(|(o, &v)| *o = v * f);
    }
}

/// [`scaled_slices`]'s product of f32 or f64 slices in place, the factor converted by `cast`.
///
/// # Safety
///
/// `out` must be a defined, contiguous CPU tensor of `count` elements of type `A` that nothing
/// else refers to while this runs.
#[allow(unsafe_code)]
unsafe fn scale_in_place<A: Copy + std::ops::MulAssign>(
    out: &Tensor,
    count: usize,
    run: usize,
    factors: &[f64],
    cast: impl Fn(f64) -> A,
) {
    // SAFETY: by this function's contract.
    let os = unsafe { std::slice::from_raw_parts_mut(out.data_ptr().cast::<A>(), count) };
    for (o, &f) in os.chunks_mut(run).zip(factors) {
        let f = cast(f);
        o.iter_mut().for_each(|v| *v *= f);
    }
}

/// [`crate::scalar::scale_bf16_bits`] compiled for AVX-512 or AVX2 where the CPU has them (the
/// same bits), the portable loop elsewhere.
#[allow(unsafe_code)]
fn scale_bf16(x: &mut [u16], factor: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
    {
        // SAFETY: the CPU supports the features the function enables (checked just above).
        return unsafe { scale_bf16_avx512(x, factor) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above), the only requirement.
        return unsafe { scale_bf16_avx2(x, factor) };
    }
    crate::scalar::scale_bf16_bits(x, factor)
}

/// The portable loop compiled for AVX-512 (the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn scale_bf16_avx512(x: &mut [u16], factor: f32) {
    crate::scalar::scale_bf16_bits(x, factor)
}

/// The portable loop compiled for AVX2 (the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scale_bf16_avx2(x: &mut [u16], factor: f32) {
    crate::scalar::scale_bf16_bits(x, factor)
}

/// [`crate::scalar::sums_of_squares_to_bf16`] with the same bits, on AVX-512 where the CPU has
/// it (`avx512f`, `avx512bw`, `avx512vl`), written with its intrinsics (compiled from the
/// portable loop, the two sets of eight f64 lanes came out in 128-bit pieces and ran at a third
/// of the speed of one pass over memory); elsewhere the portable loop, compiled for AVX2 where
/// the CPU has it. What [`to_bf16_normed`] runs on a tensor's entries, for callers that produce
/// the f32 values themselves (kappa-optim's momentum writes them to a cache-sized scratch).
///
/// ```
/// use kappa_linalg::scalar::sums_of_squares_to_bf16;
/// use kappa_linalg::tch_backend::bf16_with_sums_of_squares;
/// let x: Vec<f32> = (0..37).map(|i| (i as f32).sin()).collect();
/// let (mut fast, mut portable) = (vec![0u16; 37], vec![0u16; 37]);
/// let a = bf16_with_sums_of_squares(&x, &mut fast).unwrap();
/// let b = sums_of_squares_to_bf16(&x, &mut portable).unwrap();
/// assert_eq!((a.0.to_bits(), a.1.to_bits(), &fast), (b.0.to_bits(), b.1.to_bits(), &portable));
/// ```
#[allow(unsafe_code)]
pub fn bf16_with_sums_of_squares(x: &[f32], o: &mut [u16]) -> Option<(f64, f64)> {
    #[cfg(target_arch = "x86_64")]
    if o.len() == x.len()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
    {
        // SAFETY: the CPU supports the three features the function enables (checked just
        // above), and `o` has `x`'s length, as it requires.
        return Some(unsafe { bf16_with_sums_of_squares_avx512(x, o) });
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above), the only requirement.
        return unsafe { bf16_with_sums_of_squares_avx2(x, o) };
    }
    crate::scalar::sums_of_squares_to_bf16(x, o)
}

/// The portable loop compiled for AVX2 (CPUs without AVX-512; the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn bf16_with_sums_of_squares_avx2(x: &[f32], o: &mut [u16]) -> Option<(f64, f64)> {
    crate::scalar::sums_of_squares_to_bf16(x, o)
}

/// The AVX-512 form of [`bf16_with_sums_of_squares`] for `o.len() == x.len()`: lane l of each
/// eight-lane f64 accumulator adds the squares of entries j ≡ l mod 8 in order, each square
/// rounded before its sum (a multiply, then an add), the lanes are then added in order and the
/// tail after them — the portable loop's order; each entry rounds to bf16 as
/// [`crate::scalar::f32_to_bf16_bits`] does (ties to even, NaN to 0x7FC0).
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512VL, and `o` must be as long as `x`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(unsafe_code)]
unsafe fn bf16_with_sums_of_squares_avx512(x: &[f32], o: &mut [u16]) -> (f64, f64) {
    use std::arch::x86_64::*;
    let body = x.len() / 8 * 8;
    let (one, bias) = (_mm256_set1_epi32(1), _mm256_set1_epi32(0x7FFF));
    let (high, quiet_nan) = (_mm256_set1_epi32(-65536), _mm256_set1_epi32(0x7FC0_0000));
    let (mut input, mut rounded) = (_mm512_setzero_pd(), _mm512_setzero_pd());
    for i in (0..body).step_by(8) {
        // SAFETY: i + 8 ≤ body ≤ x.len() = o.len(): eight entries of each are in bounds.
        let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) };
        let bits = _mm256_castps_si256(v);
        let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), one);
        let up = _mm256_add_epi32(_mm256_add_epi32(bits, bias), odd);
        let nan = _mm256_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        let r = _mm256_mask_blend_epi32(nan, _mm256_and_si256(up, high), quiet_nan);
        let out = _mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(r));
        // SAFETY: as the load above, for `o`.
        unsafe { _mm_storeu_si128(o.as_mut_ptr().add(i).cast::<__m128i>(), out) };
        let (v, r) = (_mm512_cvtps_pd(v), _mm512_cvtps_pd(_mm256_castsi256_ps(r)));
        input = _mm512_add_pd(input, _mm512_mul_pd(v, v));
        rounded = _mm512_add_pd(rounded, _mm512_mul_pd(r, r));
    }
    let lanes = |acc: __m512d| {
        let mut l = [0f64; 8];
        // SAFETY: `l` holds eight f64 values, the width of the store.
        unsafe { _mm512_storeu_pd(l.as_mut_ptr(), acc) };
        l.iter().sum::<f64>()
    };
    // The tail (fewer than 8 entries) by the portable loop, whose lanes are then all zero.
    let (tail_input, tail_rounded) =
        crate::scalar::sums_of_squares_to_bf16(&x[body..], &mut o[body..]).unwrap_or_default();
    (lanes(input) + tail_input, lanes(rounded) + tail_rounded)
}

/// Σ x² in `f64` of every consecutive run of `run` entries of a contiguous CPU f32 or bf16
/// tensor, read in place ([`crate::scalar::sum_of_squares`]: squares of either type cannot
/// overflow or underflow in f64); `None` for other tensors. It replaces a libtorch reduction
/// with `dtype = f64`, which first writes an f64 copy: 3.2 ms against 0.4 ms for a 3072×768 f32
/// matrix on one thread of an Intel Xeon with AVX-512.
#[allow(unsafe_code)]
fn sums_of_squares_in_place(t: &Tensor, run: usize) -> Option<Vec<f64>> {
    if !t.defined() || t.device() != Device::Cpu || !t.is_contiguous() || run == 0 {
        return None;
    }
    let n = t.numel();
    if n == 0 {
        return Some(Vec::new());
    }
    // SAFETY: `t` is a defined, contiguous CPU tensor of n > 0 entries (checked above) of the
    // kind each arm matches (bf16 entries are 16-bit values, read as their bits); the data is
    // alive while `t` is borrowed and only read here.
    match t.kind() {
        Kind::Float => {
            let x = unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<f32>(), n) };
            let sum = |c: &[f32]| crate::scalar::sum_of_squares(c, f64::from);
            Some(x.chunks(run).map(sum).collect())
        }
        Kind::BFloat16 => {
            let x = unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<u16>(), n) };
            let sum = |c: &[u16]| crate::scalar::sum_of_squares(c, crate::scalar::bf16_bits_to_f64);
            Some(x.chunks(run).map(sum).collect())
        }
        _ => None,
    }
}

/// ‖Xᵢ‖_F of every slice of a 3-D tensor [B, m, n], each the value
/// [`Matrix::frobenius_norm`] returns for the slice alone where that is the in-place sum
/// (contiguous CPU f32 and bf16), otherwise by one libtorch reduction in f64 (equal to it above
/// 1e-140, where f64 squares keep their bits). A slice with a NaN entry has norm NaN, one with
/// an infinite entry +∞. Errors (naming `arg`): a tensor that is not 3-D
/// ([`InputError::ShapeMismatch`]), a kind other than f32, bf16 or f64, a libtorch failure.
pub fn slice_frobenius_norms(x: &Tensor, arg: &'static str) -> Result<Vec<f64>> {
    let [_, m, n] = x.size()[..] else {
        let found = format!("{:?}", x.size());
        return Err(InputError::shape_mismatch(arg, "a 3-D tensor [B, m, n]", found).into());
    };
    check_kind(arg, x.kind())?;
    let run = (m * n).max(0) as usize;
    if let Some(sums) = sums_of_squares_in_place(x, run) {
        return Ok(sums.into_iter().map(f64::sqrt).collect());
    }
    let _g = tch::no_grad_guard();
    x.f_norm_scalaropt_dim_dtype(2.0, [1i64, 2], false, Kind::Double)
        .and_then(|t| Vec::<f64>::try_from(&t))
        .map_err(backend(arg))
}

/// [`all_finite_in_place`]'s scan of the entries as a slice of `A`.
///
/// # Safety
///
/// `t` must be a defined, contiguous CPU tensor whose element type is `A`; it must not be
/// written while this runs.
#[allow(unsafe_code)]
unsafe fn all_finite_entries<A: Real>(t: &Tensor) -> bool {
    let n = t.numel();
    if n == 0 {
        return true;
    }
    // SAFETY: by this function's contract the data pointer addresses n > 0 initialized,
    // aligned values of `A`, alive while `t` is borrowed and only read here.
    let x = unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<A>(), n) };
    crate::input::all_finite(&ndarray::ArrayView1::from(x).insert_axis(ndarray::Axis(0)))
}

/// [`all_finite_in_place`]'s scan of a bf16 tensor's entries as their bits.
///
/// # Safety
///
/// `t` must be a defined, contiguous CPU bf16 tensor; it must not be written while this runs.
#[allow(unsafe_code)]
unsafe fn all_finite_bf16(t: &Tensor) -> bool {
    let n = t.numel();
    if n == 0 {
        return true;
    }
    // SAFETY: by this function's contract the data pointer addresses n > 0 initialized 16-bit
    // values, alive while `t` is borrowed and only read here.
    let bits = unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<u16>(), n) };
    crate::scalar::bf16_bits_all_finite(bits)
}

/// Checks that every operand of a call that takes a scalar argument (`mul_scalar`, `baddbmm`,
/// `norm`) has a supported kind, and the kind and device of the first: libtorch errors inside
/// such calls surface in tch as a panic (the scalar's destructor unwraps the pending error), so
/// they must not reach libtorch.
fn check_operands(ops: &[(&'static str, &Tensor)]) -> Result<()> {
    let Some(&(_, first)) = ops.first() else {
        return Ok(());
    };
    for &(arg, t) in ops {
        check_kind(arg, t.kind())?;
        if t.kind() != first.kind() || t.device() != first.device() {
            return Err(LinalgError::UnsupportedDtype {
                arg,
                dtype: format!("{:?} on {:?}", t.kind(), t.device()),
                supported: "the kind and device of the first operand",
            });
        }
    }
    Ok(())
}

fn check_2d(arg: &'static str, t: &Tensor) -> Result<(usize, usize)> {
    dims2(t).ok_or_else(|| {
        InputError::shape_mismatch(arg, "a 2-D tensor (a matrix)", format!("{:?}", t.size())).into()
    })
}

fn shape_err(arg: &'static str, expected: String, found: (usize, usize)) -> LinalgError {
    InputError::shape_mismatch(arg, expected, crate::input::shape_str(found.0, found.1)).into()
}

/// α·A·B + β·C as a new tensor (operands checked by the caller; β = 0 ignores C, as BLAS does).
///
/// f32/f64 on the CPU: `addmm_` on β·C, with α folded into A (tch's `addmm` takes neither α nor
/// β), because libtorch's `baddbmm` runs a batch of one on one thread there (B·X at 768×3072 f32
/// on 2 threads: 33.9 ms against 21.4; `docs/linalg.md`, "Products on tensors"). Rounding: one
/// for β·C, one for α·A (none when α = 1), the product's k and one for the sum: within γ_{k+3}.
/// Elsewhere (bf16 on the CPU, CUDA) one fused `baddbmm`, rounded once, as `torch.addmm` does.
fn product_plus(alpha: f64, a: &Tensor, b: &Tensor, c: &Tensor, beta: f64) -> tch::Result<Tensor> {
    if c.device() != Device::Cpu || !matches!(c.kind(), Kind::Float | Kind::Double) {
        return c
            .f_unsqueeze(0)?
            .f_baddbmm(&a.f_unsqueeze(0)?, &b.f_unsqueeze(0)?, beta, alpha)?
            .f_squeeze_dim(0);
    }
    let scaled_a = (alpha != 1.0).then(|| a.f_mul_scalar(alpha)).transpose()?;
    let a = scaled_a.as_ref().unwrap_or(a);
    if beta == 0.0 {
        return a.f_matmul(b);
    }
    let mut out = c.f_mul_scalar(beta)?;
    let _ = out.f_addmm_(a, b)?;
    Ok(out)
}

/// Whether a tensor's Gram products take `syrk`: a CPU f32/f64 tensor, by libtorch's own MKL
/// where it has one (at any thread count), else by OpenBLAS while libtorch and OpenBLAS each
/// compute on one thread ("Tensors" in the `syrk` module docs: two pools contend otherwise).
pub(crate) fn takes_syrk(x: &Tensor) -> bool {
    x.device() == Device::Cpu
        && matches!(x.kind(), Kind::Float | Kind::Double)
        && (crate::syrk::libtorch_syrk_for(x.kind())
            || (tch::get_num_threads() == 1 && crate::blas::blas_threads() == Some(1)))
}

/// [`syrk_tensor`] where [`takes_syrk`], `Ok(None)` (the general product) elsewhere.
fn syrk_where_taken(x: &Tensor, alpha: f64, c: Option<(&Tensor, f64)>) -> Result<Option<Tensor>> {
    if !takes_syrk(x) {
        return Ok(None);
    }
    syrk_tensor(x, alpha, c).map_err(backend("self"))
}

/// Copies an `ndarray` matrix into a new 2-D tensor of the given kind on the given device.
///
/// Errors: `a` empty or non-finite; `kind` not one of f32/bf16/f64; libtorch failures.
///
/// ```
/// use kappa_linalg::tch_backend::{array_from_tensor, tensor_from_array};
/// let a = ndarray::array![[1.0, 2.0], [3.0, 4.0]];
/// let t = tensor_from_array(a.view(), tch::Kind::Float, tch::Device::Cpu).unwrap();
/// assert_eq!(array_from_tensor(&t).unwrap(), a);
/// ```
pub fn tensor_from_array<A: Real>(
    a: ArrayView2<'_, A>,
    kind: Kind,
    device: Device,
) -> Result<Tensor> {
    crate::input::check_matrix("a", &a)?;
    check_kind("kind", kind)?;
    let (m, n) = a.dim();
    let data: Vec<f64> = a.iter().map(|x| x.to_f64_lossy()).collect();
    let _g = tch::no_grad_guard();
    Tensor::from_slice(&data)
        .f_view([m as i64, n as i64])
        .and_then(|t| t.f_to_kind(kind))
        .and_then(|t| t.f_to_device(device))
        .map_err(backend("a"))
}

/// Copies a 2-D tensor (any supported kind and device) into an `Array2<f64>`.
///
/// Errors: `t` not 2-D or of an unsupported kind; libtorch failures. Non-finite entries are
/// copied as they are.
pub fn array_from_tensor(t: &Tensor) -> Result<Array2<f64>> {
    let (m, n) = check_2d("t", t)?;
    check_kind("t", t.kind())?;
    let _g = tch::no_grad_guard();
    let flat = t
        .f_to_device(Device::Cpu)
        .and_then(|x| x.f_to_kind(Kind::Double))
        .and_then(|x| x.f_contiguous())
        .and_then(|x| x.f_reshape([-1]))
        .map_err(backend("t"))?;
    let v = Vec::<f64>::try_from(&flat).map_err(backend("t"))?;
    Array2::from_shape_vec((m, n), v).map_err(|e| LinalgError::Backend {
        arg: "t",
        message: e.to_string(),
    })
}

/// The SVD input: the tensor (bf16 promoted to f32, libtorch has no bf16 SVD) scaled exactly by
/// the power of two that brings max |x_ij| into [0.5, 1), applied as two factors (each a normal
/// number of f32 and f64), and that scaling. Unscaled, entries near the kind's `MAX` overflow
/// the SVD's column norms (see `crate::svd`).
fn scaled_work(t: &Tensor) -> Result<(Tensor, Pow2)> {
    let work = if t.kind() == Kind::BFloat16 {
        t.f_to_kind(Kind::Float).map_err(backend("self"))?
    } else {
        t.shallow_clone()
    };
    let amax = work
        .f_abs()
        .and_then(|x| x.f_max())
        .and_then(|x| x.f_double_value(&[]))
        .map_err(backend("self"))?;
    let p = Pow2::normalizing(amax);
    if p == Pow2::ONE {
        return Ok((work, p));
    }
    let h = p.k / 2;
    let scaled = work
        .f_mul_scalar(f64::powi(2.0, h))
        .and_then(|x| x.f_mul_scalar(f64::powi(2.0, p.k - h)))
        .map_err(backend("self"))?;
    Ok((scaled, p))
}

/// The polar factor U·Vᵀ (in the input's kind) from one SVD of the scaled input, with the
/// scaled singular values and the scaling.
fn polar_and_scaled_sigma(t: &Tensor) -> Result<(Tensor, Tensor, Pow2)> {
    t.validate("self")?;
    let _g = tch::no_grad_guard();
    let (work, p) = scaled_work(t)?;
    let (u, s, v) = work.f_svd(true, true).map_err(backend("self"))?;
    let q = u
        .f_matmul(&v.f_tr().map_err(backend("self"))?)
        .and_then(|q| q.f_to_kind(t.kind()))
        .map_err(backend("self"))?;
    Ok((q, s, p))
}

/// The singular values of the scaled SVD input, scaled back in f64; [`LinalgError::Overflow`]
/// (argument `self`) beyond `f64::MAX`.
fn sigma_back(s: &Tensor, p: Pow2) -> Result<Vec<f64>> {
    let s = s
        .f_to_device(Device::Cpu)
        .and_then(|x| x.f_to_kind(Kind::Double))
        .map_err(backend("self"))?;
    let v = Vec::<f64>::try_from(&s).map_err(backend("self"))?;
    crate::matrix::sigma_f64(v.into_iter(), p)
}

impl Matrix for Tensor {
    fn shape(&self) -> (usize, usize) {
        dims2(self).unwrap_or((0, 0))
    }

    fn normal_range(&self) -> (f64, f64) {
        match self.kind() {
            Kind::Double => (f64::NORMAL_MIN, f64::FINITE_MAX),
            // bf16 has f32's exponent range and 8 significant bits: its largest finite number
            // is (2 − 2⁻⁷)·2¹²⁷.
            Kind::BFloat16 => (f32::NORMAL_MIN, (2.0 - 2f64.powi(-7)) * 2f64.powi(127)),
            _ => (f32::NORMAL_MIN, f32::FINITE_MAX),
        }
    }

    fn validate(&self, arg: &'static str) -> Result<()> {
        let (rows, cols) = check_2d(arg, self)?;
        check_kind(arg, self.kind())?;
        if rows == 0 || cols == 0 {
            return Err(InputError::Empty { arg, rows, cols }.into());
        }
        if all_finite_in_place(self) == Some(true) {
            return Ok(());
        }
        let _g = tch::no_grad_guard();
        // Fast path, one pass and no temporary: a sum in the tensor's own kind is NaN or ±∞
        // when any entry is, and finite entries make it non-finite only by overflowing, so a
        // finite sum proves every entry finite. A non-finite sum takes the exact search below.
        let sum = self
            .f_sum(self.kind())
            .and_then(|s| s.f_double_value(&[]))
            .map_err(backend(arg))?;
        if sum.is_finite() {
            return Ok(());
        }
        let finite = self.f_isfinite().map_err(backend(arg))?;
        let all = finite
            .f_all()
            .map_err(backend(arg))?
            .f_int64_value(&[])
            .map_err(backend(arg))?;
        if all != 0 {
            return Ok(());
        }
        let bad = finite
            .f_logical_not()
            .and_then(|b| b.f_nonzero())
            .map_err(backend(arg))?;
        let row = bad.f_int64_value(&[0, 0]).map_err(backend(arg))?;
        let col = bad.f_int64_value(&[0, 1]).map_err(backend(arg))?;
        let value = self.f_double_value(&[row, col]).map_err(backend(arg))?;
        Err(InputError::NonFinite {
            arg,
            row: row as usize,
            col: col as usize,
            value,
        }
        .into())
    }

    fn into_transpose(self) -> Self {
        // `t()` panics on tensors of more than two dimensions; swap the last two there, and keep
        // anything else (0-D) as it is — `validate` rejects such tensors anyway.
        self.f_tr()
            .or_else(|_| self.f_transpose(-2, -1))
            .unwrap_or(self)
    }

    fn matmul(&self, rhs: &Self) -> Result<Self> {
        let l = check_2d("self", self)?;
        let r = check_2d("rhs", rhs)?;
        if l.1 != r.0 {
            return Err(shape_err("rhs", format!("{} rows", l.1), r));
        }
        crate::error::check_dense("rhs", l.0, r.1)?;
        let _g = tch::no_grad_guard();
        self.f_matmul(rhs).map_err(backend("rhs"))
    }

    fn gram(&self) -> Result<Self> {
        let (m, _) = check_2d("self", self)?;
        crate::error::check_dense("self", m, m)?;
        check_operands(&[("self", self)])?;
        let _g = tch::no_grad_guard();
        if let Some(out) = syrk_where_taken(self, 1.0, None)? {
            return Ok(out);
        }
        if let Some(out) = crate::syrk::row_block_gram(self).map_err(backend("self"))? {
            return Ok(out);
        }
        self.f_matmul(&self.tr()).map_err(backend("self"))
    }

    fn gram_add(&self, alpha: f64, c: &Self, beta: f64) -> Result<Self> {
        let (m, _) = check_2d("self", self)?;
        let sc = check_2d("c", c)?;
        if sc != (m, m) {
            return Err(shape_err("c", crate::input::shape_str(m, m), sc));
        }
        check_operands(&[("self", self), ("c", c)])?;
        let _g = tch::no_grad_guard();
        if let Some(out) = syrk_where_taken(self, alpha, Some((c, beta)))? {
            return Ok(out);
        }
        product_plus(alpha, self, &self.tr(), c, beta).map_err(backend("self"))
    }

    fn symmetric_square_add(&self, alpha: f64, beta: f64) -> Result<Self> {
        let (m, n) = check_2d("self", self)?;
        if m != n {
            return Err(shape_err("self", crate::input::shape_str(m, m), (m, n)));
        }
        if takes_syrk(self) {
            return self.gram_add(alpha, self, beta);
        }
        check_operands(&[("self", self)])?;
        let _g = tch::no_grad_guard();
        // S·S, not S·Sᵀ: libtorch's fused bf16 product is slow with a transposed operand
        // (768² on one thread: 3.05 ms against 2.13), and torch.optim.Muon multiplies A·A too.
        product_plus(alpha, self, self, self, beta).map_err(backend("self"))
    }

    fn gemm(&mut self, alpha: f64, a: &Self, b: &Self, beta: f64) -> Result<()> {
        let sa = check_2d("a", a)?;
        let sb = check_2d("b", b)?;
        let sc = check_2d("self", self)?;
        if sa.1 != sb.0 {
            return Err(shape_err("b", format!("{} rows", sa.1), sb));
        }
        if sc != (sa.0, sb.1) {
            return Err(shape_err("self", crate::input::shape_str(sa.0, sb.1), sc));
        }
        check_operands(&[("self", self), ("a", a), ("b", b)])?;
        let _g = tch::no_grad_guard();
        *self = product_plus(alpha, a, b, self, beta).map_err(backend("a"))?;
        Ok(())
    }

    fn mul_add(&self, alpha: f64, a: &Self, b: &Self, beta: f64) -> Result<Self> {
        let sa = check_2d("a", a)?;
        let sb = check_2d("b", b)?;
        let sc = check_2d("self", self)?;
        if sa.1 != sb.0 {
            return Err(shape_err("b", format!("{} rows", sa.1), sb));
        }
        if sc != (sa.0, sb.1) {
            return Err(shape_err("self", crate::input::shape_str(sa.0, sb.1), sc));
        }
        check_operands(&[("self", self), ("a", a), ("b", b)])?;
        let _g = tch::no_grad_guard();
        product_plus(alpha, a, b, self, beta).map_err(backend("a"))
    }

    fn scale(&mut self, alpha: f64) -> Result<()> {
        check_operands(&[("self", self)])?;
        let _g = tch::no_grad_guard();
        let _ = self.f_mul_scalar_(alpha).map_err(backend("self"))?;
        Ok(())
    }

    fn axpy(&mut self, alpha: f64, x: &Self) -> Result<()> {
        let s = check_2d("self", self)?;
        let sx = check_2d("x", x)?;
        if s != sx {
            return Err(shape_err("x", crate::input::shape_str(s.0, s.1), sx));
        }
        check_operands(&[("self", self), ("x", x)])?;
        let _g = tch::no_grad_guard();
        // One pass (self + x·α by `addcmul_`, α a 0-d tensor of self's kind, rounded as
        // `mul_scalar` rounds it) instead of a scaled temporary and an add: 3 memory passes, not
        // 5. An α beyond f32's range keeps the general path (and libtorch's error).
        let factor = match (self.device(), self.kind()) {
            (Device::Cpu, Kind::Float) if (alpha as f32).is_finite() => {
                Some(Tensor::from(alpha as f32))
            }
            (Device::Cpu, Kind::Double) => Some(Tensor::from(alpha)),
            _ => None,
        };
        if let Some(a) = factor {
            let _ = self.f_addcmul_(x, &a).map_err(backend("x"))?;
            return Ok(());
        }
        // bf16: libtorch keeps a Scalar factor in f32 for bf16 arithmetic, a 0-d bf16 tensor
        // would round α to 8 bits; CUDA: a host scalar needs no copy to the device.
        let scaled = x.f_mul_scalar(alpha).map_err(backend("x"))?;
        let _ = self.f_add_(&scaled).map_err(backend("x"))?;
        Ok(())
    }

    fn frobenius_norm(&self) -> Result<f64> {
        check_2d("self", self)?;
        check_operands(&[("self", self)])?;
        let _g = tch::no_grad_guard();
        if let Some(sum) = sums_of_squares_in_place(self, self.numel()) {
            return Ok(sum.iter().sum::<f64>().sqrt());
        }
        // One reduction in f64: squares of f32/bf16 entries cannot overflow or underflow there.
        let direct = self
            .f_norm_scalaropt_dim_dtype(2.0, [0i64, 1], false, Kind::Double)
            .and_then(|x| x.f_double_value(&[]))
            .map_err(backend("self"))?;
        if self.kind() != Kind::Double || (direct.is_finite() && direct > 1e-140) {
            return Ok(direct);
        }
        let d = self.shallow_clone();
        // Scale by max |x| first so that squares of large f64 entries cannot overflow.
        let amax = d
            .f_abs()
            .and_then(|x| x.f_max())
            .and_then(|x| x.f_double_value(&[]))
            .map_err(backend("self"))?;
        if amax == 0.0 || !amax.is_finite() {
            return Ok(amax);
        }
        let n = d
            .f_div_scalar(amax)
            .and_then(|x| x.f_norm())
            .and_then(|x| x.f_double_value(&[]))
            .map_err(backend("self"))?;
        Ok(amax * n)
    }

    fn duplicate(&self) -> Result<Self> {
        let _g = tch::no_grad_guard();
        self.f_detach_copy().map_err(backend("self"))
    }

    fn transposed_copy(&self) -> Result<Self> {
        let (m, n) = check_2d("self", self)?;
        let _g = tch::no_grad_guard();
        // A fresh row-major tensor, then one strided copy: `contiguous()` would return a view
        // (no copy) where the transpose already counts as contiguous (a row or a column).
        let out = Tensor::f_empty([n as i64, m as i64], (self.kind(), self.device()));
        out.and_then(|mut t| t.f_copy_(&self.f_tr()?).map(|_| t))
            .map_err(backend("self"))
    }

    fn singular_values(&self) -> Result<Vec<f64>> {
        self.validate("self")?;
        let _g = tch::no_grad_guard();
        let (work, p) = scaled_work(self)?;
        // `torch.svd(compute_uv=False)` is `torch.linalg.svdvals` without the CUDA-only `driver`
        // argument that tch's `linalg_svdvals` always passes.
        let (_, s, _) = work.f_svd(true, false).map_err(backend("self"))?;
        sigma_back(&s, p)
    }

    fn polar_factor(&self) -> Result<Self> {
        // Scale-free: no σ is scaled back, so no overflow for any finite input.
        Ok(polar_and_scaled_sigma(self)?.0)
    }

    fn polar_factor_and_singular_values(&self) -> Result<(Self, Vec<f64>)> {
        let (q, s, p) = polar_and_scaled_sigma(self)?;
        Ok((q, sigma_back(&s, p)?))
    }

    fn inner(&self, other: &Self) -> Result<f64> {
        let s = check_2d("self", self)?;
        let so = check_2d("other", other)?;
        if s != so {
            return Err(shape_err("other", crate::input::shape_str(s.0, s.1), so));
        }
        let _g = tch::no_grad_guard();
        // Products and the sum in f64 on the device: no bf16/f32 rounding in the reduction.
        self.f_to_kind(Kind::Double)
            .and_then(|a| Ok((a, other.f_to_kind(Kind::Double)?)))
            .and_then(|(a, b)| a.f_mul(&b))
            .and_then(|p| p.f_sum(Kind::Double))
            .and_then(|x| x.f_double_value(&[]))
            .map_err(backend("other"))
    }

    fn diagonal(&self) -> Result<Vec<f64>> {
        check_2d("self", self)?;
        let _g = tch::no_grad_guard();
        let d = self
            .f_diagonal(0, 0, 1)
            .and_then(|x| x.f_to_device(Device::Cpu))
            .and_then(|x| x.f_to_kind(Kind::Double))
            .map_err(backend("self"))?;
        Vec::<f64>::try_from(&d).map_err(backend("self"))
    }

    fn set_diagonal(&mut self, d: &[f64]) -> Result<()> {
        let (m, n) = check_2d("self", self)?;
        crate::matrix::check_len("d", d.len(), m.min(n), "one entry per diagonal element")?;
        let _g = tch::no_grad_guard();
        let src = Tensor::from_slice(d)
            .f_to_kind(self.kind())
            .and_then(|x| x.f_to_device(self.device()))
            .map_err(backend("d"))?;
        let mut diag = self.f_diagonal(0, 0, 1).map_err(backend("self"))?;
        diag.f_copy_(&src).map_err(backend("d"))?;
        Ok(())
    }

    fn add_to_diagonal(&mut self, a: f64) -> Result<()> {
        check_2d("self", self)?;
        check_operands(&[("self", self)])?;
        let _g = tch::no_grad_guard();
        let mut diag = self.f_diagonal(0, 0, 1).map_err(backend("self"))?;
        let _ = diag.f_add_scalar_(a).map_err(backend("self"))?;
        Ok(())
    }

    fn abs_row_sums(&self) -> Result<Vec<f64>> {
        check_2d("self", self)?;
        check_kind("self", self.kind())?;
        let _g = tch::no_grad_guard();
        let sums = self
            .f_abs()
            .and_then(|a| a.f_sum_dim_intlist([1i64].as_slice(), false, Kind::Double))
            .and_then(|a| a.f_to_device(Device::Cpu))
            .map_err(backend("self"))?;
        Vec::<f64>::try_from(&sums).map_err(backend("self"))
    }

    fn scale_columns(&mut self, s: &[f64]) -> Result<()> {
        let (_, n) = check_2d("self", self)?;
        crate::matrix::check_len("s", s.len(), n, "one factor per column")?;
        let _g = tch::no_grad_guard();
        let factors = Tensor::from_slice(s)
            .f_to_kind(self.kind())
            .and_then(|x| x.f_to_device(self.device()))
            .and_then(|x| x.f_view([1, n as i64]))
            .map_err(backend("s"))?;
        let _ = self.f_mul_(&factors).map_err(backend("s"))?;
        Ok(())
    }

    fn scale_entries(&mut self, s: &[f64]) -> Result<()> {
        let (m, n) = check_2d("self", self)?;
        crate::matrix::check_len("s", s.len(), m * n, "one factor per entry (row-major)")?;
        let _g = tch::no_grad_guard();
        let factors = Tensor::from_slice(s)
            .f_to_kind(self.kind())
            .and_then(|x| x.f_to_device(self.device()))
            .and_then(|x| x.f_view([m as i64, n as i64]))
            .map_err(backend("s"))?;
        let _ = self.f_mul_(&factors).map_err(backend("s"))?;
        Ok(())
    }

    fn copy_from(&mut self, src: &Self) -> Result<()> {
        let s = check_2d("self", self)?;
        let ss = check_2d("src", src)?;
        if s != ss {
            return Err(shape_err("src", crate::input::shape_str(s.0, s.1), ss));
        }
        let _g = tch::no_grad_guard();
        self.f_copy_(src).map_err(backend("src"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `add_to_diagonal` on a tensor adds to the min(rows, cols) diagonal entries only, as the
    /// trait's default (diagonal, then set_diagonal) does (f64: both exact); a tensor that is
    /// not 2-D, or of another kind, is a typed error and stays as it was.
    #[test]
    fn add_to_diagonal_adds_to_the_diagonal_only() {
        let cpu = (Kind::Double, Device::Cpu);
        for shape in [[3, 5], [5, 3]] {
            let mut t = Tensor::arange(15, cpu).reshape(shape);
            let mut want = array_from_tensor(&t).unwrap();
            want.diag_mut().iter_mut().for_each(|v| *v += 2.5);
            t.add_to_diagonal(2.5).unwrap();
            assert_eq!(array_from_tensor(&t).unwrap(), want, "{shape:?}");
        }
        let mut flat = Tensor::zeros([4], cpu);
        assert!(matches!(
            flat.add_to_diagonal(1.0),
            Err(LinalgError::Input(InputError::ShapeMismatch {
                arg: "self",
                ..
            }))
        ));
        let mut ints = Tensor::zeros([2, 2], (Kind::Int64, Device::Cpu));
        assert!(matches!(
            ints.add_to_diagonal(1.0),
            Err(LinalgError::UnsupportedDtype { arg: "self", .. })
        ));
        assert_eq!(ints.abs().sum(Kind::Int64).int64_value(&[]), 0);
    }

    /// The conversion with both sums of squares, on whatever vector unit this CPU has, writes
    /// and sums exactly what the portable loop does, for every length up to a few lanes past
    /// 32 and every kind of entry: ties both ways, subnormals, ±0, values rounding to ∞, ±∞, NaN.
    #[test]
    fn the_vector_conversion_is_the_portable_one_bit_for_bit() {
        let specials = [
            1.0 + f32::powi(2.0, -8),
            1.0 + 3.0 * f32::powi(2.0, -8),
            -1.5e-39,
            1e-41,
            -0.0,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
        ];
        for n in 0..45 {
            let x: Vec<f32> = (0..n)
                .map(|i| match i % 4 {
                    0 => specials[(i / 4) % specials.len()],
                    _ => (i as f32 * 0.37).sin() * 10f32.powi(i as i32 % 9 - 4),
                })
                .collect();
            let (mut fast, mut portable) = (vec![0u16; n], vec![0u16; n]);
            let f = super::bf16_with_sums_of_squares(&x, &mut fast).unwrap();
            let p = crate::scalar::sums_of_squares_to_bf16(&x, &mut portable).unwrap();
            assert_eq!(fast, portable, "length {n}");
            let bits = |(a, b): (f64, f64)| (a.to_bits(), b.to_bits());
            assert_eq!(bits(f), bits(p), "length {n}");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                let mut wide = vec![0u16; n];
                // SAFETY: the CPU supports AVX2 (checked just above).
                #[allow(unsafe_code)]
                let a = unsafe { super::bf16_with_sums_of_squares_avx2(&x, &mut wide) }.unwrap();
                assert_eq!((wide, bits(a)), (portable, bits(p)), "AVX2, length {n}");
            }
        }
        let finite: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.61).cos() * 3.0).collect();
        let (mut fast, mut portable) = (vec![0u16; 1000], vec![0u16; 1000]);
        let f = super::bf16_with_sums_of_squares(&finite, &mut fast).unwrap();
        let p = crate::scalar::sums_of_squares_to_bf16(&finite, &mut portable).unwrap();
        assert_eq!(
            (fast, f.0.to_bits(), f.1.to_bits()),
            (portable, p.0.to_bits(), p.1.to_bits())
        );
        let mut short = vec![0u16; 3];
        assert!(super::bf16_with_sums_of_squares(&finite[..4], &mut short).is_none());
    }
}
