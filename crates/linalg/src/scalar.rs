//! The real scalar types the `ndarray` backend computes in: `f32` and `f64`.

use ndarray::NdFloat;
use ndarray_linalg::Lapack;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A real floating-point type with LAPACK support: `f32` or `f64` (sealed).
///
/// Every `ndarray` entry point of this crate is generic over `A: Real`, so call sites written for
/// `f64` compile unchanged and `f32` works the same way, computing in `f32` throughout.
pub trait Real:
    NdFloat
    + Lapack
    + ndarray_linalg::Scalar<Real = Self>
    + Default
    + sealed::Sealed
    + crate::syrk::SyrkElement
    + crate::product_element::ProductElement
    + crate::exp_element::ExpElement
{
    /// Machine epsilon of the type: 2⁻²³ for `f32`, 2⁻⁵² for `f64`.
    const EPS: f64;
    /// The type's name, for messages.
    const NAME: &'static str;
    /// The smallest positive normal number of the type, as `f64` (2⁻¹²⁶ for `f32`, 2⁻¹⁰²² for
    /// `f64`).
    const NORMAL_MIN: f64;
    /// The largest finite number of the type, as `f64`.
    const FINITE_MAX: f64;
    /// Converts from `f64` (rounding to nearest for `f32`).
    fn from_f64_lossy(x: f64) -> Self;
    /// Converts to `f64` (exact).
    fn to_f64_lossy(self) -> f64;
    /// |x| (disambiguates `num_traits::Float::abs` from `ndarray_linalg::Scalar::abs`).
    fn fabs(self) -> Self {
        <Self as ndarray_linalg::Scalar>::abs(self)
    }
    /// √x (disambiguates like [`Real::fabs`]).
    fn fsqrt(self) -> Self {
        <Self as ndarray_linalg::Scalar>::sqrt(self)
    }
}

impl Real for f32 {
    const EPS: f64 = f32::EPSILON as f64;
    const NAME: &'static str = "f32";
    const NORMAL_MIN: f64 = f32::MIN_POSITIVE as f64;
    const FINITE_MAX: f64 = f32::MAX as f64;
    fn from_f64_lossy(x: f64) -> Self {
        x as f32
    }
    fn to_f64_lossy(self) -> f64 {
        f64::from(self)
    }
}

impl Real for f64 {
    const EPS: f64 = f64::EPSILON;
    const NAME: &'static str = "f64";
    const NORMAL_MIN: f64 = f64::MIN_POSITIVE;
    const FINITE_MAX: f64 = f64::MAX;
    fn from_f64_lossy(x: f64) -> Self {
        x
    }
    fn to_f64_lossy(self) -> f64 {
        self
    }
}

/// The Frobenius norm of an array of any dimension: the fast one-pass [`slice_norm`] over its
/// memory when it is contiguous (in any order), else [`scaled_norm`] over its elements.
pub(crate) fn array_norm<A: Real, S: ndarray::Data<Elem = A>, D: ndarray::Dimension>(
    a: &ndarray::ArrayBase<S, D>,
) -> f64 {
    match a.as_slice_memory_order() {
        Some(s) => slice_norm(s),
        None => scaled_norm(a.iter()),
    }
}

/// ‖x‖₂ of a slice, as [`scaled_norm`] but fast: Σ x² in `f64` over eight independent
/// accumulators (the loop vectorizes; a single running sum is bound by the add latency), falling
/// back to the scaled two-pass form only when the sum over- or underflowed. A non-finite entry
/// gives a non-finite result (so a finite result also proves every entry finite).
pub(crate) fn slice_norm<A: Real>(x: &[A]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (s, &v) in acc.iter_mut().zip(c) {
            let y = v.to_f64_lossy();
            *s += y * y;
        }
    }
    let mut sumsq: f64 = acc.iter().sum();
    for &v in tail {
        let y = v.to_f64_lossy();
        sumsq += y * y;
    }
    if sumsq.is_nan() {
        return f64::NAN;
    }
    if A::EPS > 1e-10 || (sumsq.is_finite() && sumsq > 1e-280) || x.is_empty() {
        return sumsq.sqrt();
    }
    scaled_norm(x.iter())
}

/// The Frobenius norm ‖x‖_F = sqrt(Σ x²) of any sequence of entries, without overflow or
/// underflow: entries are scaled by the largest magnitude first (two passes), and the sum is
/// accumulated in `f64`. Returns 0 for an empty or all-zero input.
pub(crate) fn scaled_norm<'a, A: Real>(iter: impl Iterator<Item = &'a A> + Clone) -> f64 {
    // Fast path, one pass: squares accumulated in f64 cannot overflow or underflow for f32
    // entries; for f64 entries fall back to the scaled two-pass form when they might have.
    let sumsq: f64 = iter
        .clone()
        .map(|&x| {
            let y = x.to_f64_lossy();
            y * y
        })
        .sum();
    if A::EPS > 1e-10 || (sumsq.is_finite() && sumsq > 1e-280) {
        return sumsq.sqrt();
    }
    let amax = iter
        .clone()
        .fold(0.0f64, |m, &x| m.max(x.to_f64_lossy().abs()));
    if amax == 0.0 || !amax.is_finite() {
        return amax;
    }
    let inv = 1.0 / amax;
    if inv.is_finite() {
        let s: f64 = iter
            .map(|&x| {
                let y = x.to_f64_lossy() * inv;
                y * y
            })
            .sum();
        amax * s.sqrt()
    } else {
        let s: f64 = iter
            .map(|&x| {
                let y = x.to_f64_lossy() / amax;
                y * y
            })
            .sum();
        amax * s.sqrt()
    }
}

/// The binary exponent e of a finite x ≠ 0: |x| = f·2^e with f ∈ [0.5, 1) (subnormals included).
pub(crate) fn binary_exponent(x: f64) -> i32 {
    let biased = ((x.to_bits() >> 52) & 0x7ff) as i32;
    if biased == 0 {
        // Subnormal: 2^64 is exact and makes it normal.
        binary_exponent(x * pow2(64)) - 64
    } else {
        biased - 1022
    }
}

/// 2^k as an `f64`, for k ∈ [−1022, 1023] (built from its bits, so exact).
pub(crate) fn pow2(k: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&k));
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// An exact scaling by a power of two, x ↦ x·2^k.
///
/// Multiplying by a power of two changes only the exponent, so it is exact unless the result
/// leaves the normal range; it is applied as two factors 2^⌊k/2⌋·2^⌈k/2⌉, each a normal number
/// of the element type (|k| ≤ 1100 for f64 and ≤ 280 for f32 keep each half representable), so
/// that scaling subnormal entries up, or entries near `MAX` down, is exact. The only rounding is
/// that entries below 2^−1074 (f64) after scaling down flush to 0 — entries smaller than 2^−1074
/// relative to the largest one, far below the ε·‖A‖ backward error of any factorization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pow2 {
    /// The exponent k.
    pub k: i32,
}

impl Pow2 {
    /// The identity scaling.
    pub const ONE: Pow2 = Pow2 { k: 0 };

    /// The scaling that maps a largest magnitude `amax` (finite, ≥ 0) into [0.5, 1): k = −e(amax).
    /// The identity for `amax == 0`.
    pub fn normalizing(amax: f64) -> Self {
        if amax == 0.0 || !amax.is_finite() {
            Pow2::ONE
        } else {
            Pow2 {
                k: -binary_exponent(amax),
            }
        }
    }

    /// The inverse scaling x ↦ x·2^−k.
    pub fn inverse(self) -> Self {
        Pow2 { k: -self.k }
    }

    fn halves(self) -> (f64, f64) {
        let h = self.k / 2;
        (pow2(h), pow2(self.k - h))
    }

    /// x·2^k in the element type (±∞ if it overflows).
    pub fn apply<A: Real>(self, x: A) -> A {
        if self.k == 0 {
            return x;
        }
        let (h1, h2) = self.halves();
        x * A::from_f64_lossy(h1) * A::from_f64_lossy(h2)
    }

    /// x·2^k in `f64` (±∞ if it overflows).
    pub fn apply_f64(self, x: f64) -> f64 {
        let (h1, h2) = self.halves();
        x * h1 * h2
    }
}

/// x·2^k in `f64` for any k (steps of at most 2^±1000, each exact until the result leaves the
/// normal range; a result that underflows is rounded at most twice, so within one subnormal ulp,
/// and one that overflows is ±∞).
pub(crate) fn scale_f64(x: f64, k: i64) -> f64 {
    let mut x = x;
    let mut k = k;
    while k != 0 && x != 0.0 && x.is_finite() {
        let step = k.clamp(-1000, 1000);
        x *= pow2(step as i32);
        k -= step;
    }
    x
}

/// max |a_ij| of a matrix in `f64` (0 for an empty one; exact). Over a contiguous matrix the
/// scan runs on the vector units (eight independent lanes). NaN-free input assumed: a NaN
/// entry may or may not be seen.
///
/// ```
/// let a = ndarray::array![[1.0, -7.5], [3.0, 2.0]];
/// assert_eq!(kappa_linalg::scalar::max_abs_entry(&a.view()), 7.5);
/// ```
pub fn max_abs_entry<A: Real>(a: &ndarray::ArrayView2<'_, A>) -> f64 {
    let Some(x) = a.as_slice_memory_order() else {
        return max_abs(a.iter());
    };
    let larger = |m: A, v: A| if v > m { v } else { m };
    fold_in_lanes(x, A::zero(), |m, v| larger(m, v.fabs()), larger).to_f64_lossy()
}

/// `step` folded over `x` in eight lanes (lane l takes the entries j ≡ l mod 8, in order, from
/// `init`), then the tail from `init`, then the lanes into the tail with `merge`, in order: a
/// fixed order whatever the CPU, which the vector units run eight at a time where a single
/// running fold would wait on each step's latency. For sums, maxima and "any NaN" scans.
///
/// ```
/// use kappa_linalg::scalar::fold_in_lanes;
/// let x: Vec<f64> = (1..=20).map(f64::from).collect();
/// assert_eq!(fold_in_lanes(&x, 0.0, |s, v| s + v, |s, t| s + t), 210.0);
/// ```
pub fn fold_in_lanes<T: Copy>(
    x: &[T],
    init: T,
    step: impl Fn(T, T) -> T,
    merge: impl Fn(T, T) -> T,
) -> T {
    let mut lanes = [init; 8];
    let mut chunks = x.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = step(*lane, v);
        }
    }
    let tail = chunks.remainder().iter().fold(init, |acc, &v| step(acc, v));
    lanes.iter().fold(tail, |acc, &l| merge(acc, l))
}

/// Σ widen(xᵢ)² in `f64`: eight lanes (lane l takes the entries j ≡ l mod 8, in order), the
/// lanes added in order, then the tail — a fixed order whatever the CPU. With `widen` exact
/// (f32 or bf16 to f64) no square overflows or underflows, so the sum's relative error is at
/// most about n/8 units of f64 roundoff, far below an f32 ulp.
///
/// ```
/// let x = [3.0f32, 4.0];
/// assert_eq!(kappa_linalg::scalar::sum_of_squares(&x, f64::from), 25.0);
/// ```
pub fn sum_of_squares<T: Copy>(x: &[T], widen: impl Fn(T) -> f64) -> f64 {
    let mut lanes = [0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            let v = widen(v);
            *lane += v * v;
        }
    }
    let tail: f64 = chunks
        .remainder()
        .iter()
        .map(|&v| widen(v) * widen(v))
        .sum();
    lanes.iter().sum::<f64>() + tail
}

/// f32 → bf16 (its bits), rounded to nearest with ties to even, as libtorch converts finite
/// values and ±∞. A finite value above the largest bf16 (by at least half its last unit) rounds
/// to ±∞. A NaN becomes the quiet NaN 0x7FC0 (libtorch's scalar conversion gives the same; its
/// vector kernels may write another NaN).
///
/// ```
/// use kappa_linalg::scalar::{bf16_bits_to_f64, f32_to_bf16_bits};
/// assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
/// assert_eq!(f32_to_bf16_bits(1.0 + 2f32.powi(-8)), 0x3F80); // a tie: down to even
/// assert_eq!(f32_to_bf16_bits(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82); // a tie: up to even
/// assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7F80); // +∞
/// assert!(bf16_bits_to_f64(f32_to_bf16_bits(f32::NAN)).is_nan());
/// ```
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let bias = ((bits >> 16) & 1) + 0x7FFF;
    let rounded = (bits.wrapping_add(bias) >> 16) as u16;
    // A select, not a branch, so that loops over it vectorize.
    if x.is_nan() {
        0x7FC0
    } else {
        rounded
    }
}

/// `x` rounded to bf16 ([`f32_to_bf16_bits`]) into `out`, in one read of `x`, with two sums
/// of squares in [`sum_of_squares`]'s order (the same lanes, each keeping its order, so the same
/// values bit for bit): Σ x² of the input and Σ bf16(x)² of what was written, the norm
/// `sum_of_squares` gives for `out`. `None` when `out`'s length is not `x`'s. Inlined into its
/// caller, so that a caller compiled for wider vector instructions (`#[target_feature]`) runs it
/// on them (the same bits: no product is fused into a sum).
///
/// ```
/// use kappa_linalg::scalar::{bf16_bits_to_f64, sum_of_squares, sums_of_squares_to_bf16};
/// let x: Vec<f32> = (0..19).map(|i| i as f32 / 7.0).collect();
/// let mut out = vec![0u16; x.len()];
/// let (input, rounded) = sums_of_squares_to_bf16(&x, &mut out).unwrap();
/// assert_eq!(input.to_bits(), sum_of_squares(&x, f64::from).to_bits());
/// assert_eq!(rounded.to_bits(), sum_of_squares(&out, bf16_bits_to_f64).to_bits());
/// assert_eq!(out[7], 0x3F80); // 7/7 = 1
/// ```
#[inline(always)]
pub fn sums_of_squares_to_bf16(x: &[f32], out: &mut [u16]) -> Option<(f64, f64)> {
    if out.len() != x.len() {
        return None;
    }
    let (mut input, mut rounded) = ([0f64; 8], [0f64; 8]);
    let mut chunks = x.chunks_exact(8);
    let mut outs = out.chunks_exact_mut(8);
    // Each value's bits are formed once and widened from a register (no read of `out`), so
    // that the loop vectorizes.
    let squares = |v: f32| {
        let bits = f32_to_bf16_bits(v);
        let (v, r) = (f64::from(v), bf16_bits_to_f64(bits));
        (bits, v * v, r * r)
    };
    for (chunk, o) in (&mut chunks).zip(&mut outs) {
        let lanes = input.iter_mut().zip(rounded.iter_mut());
        for (((i, r), &v), o) in lanes.zip(chunk).zip(o) {
            let (bits, v2, r2) = squares(v);
            *o = bits;
            *i += v2;
            *r += r2;
        }
    }
    let (mut input_tail, mut rounded_tail) = (0f64, 0f64);
    for (o, &v) in outs.into_remainder().iter_mut().zip(chunks.remainder()) {
        let (bits, v2, r2) = squares(v);
        *o = bits;
        input_tail += v2;
        rounded_tail += r2;
    }
    let total = |lanes: [f64; 8], tail: f64| lanes.iter().sum::<f64>() + tail;
    Some((total(input, input_tail), total(rounded, rounded_tail)))
}

/// `x`·`factor` in place for bf16 values given by their bits: each product formed in f32 and
/// rounded to bf16 ([`f32_to_bf16_bits`]), the values libtorch's `mul` of a bf16 tensor by an
/// f32 factor (or by a Scalar, which it keeps in f32) gives for finite products. Inlined into its
/// caller, so that a caller compiled for wider vector instructions (`#[target_feature]`) runs it
/// on them (the same bits).
#[cfg(feature = "tch")]
#[inline(always)]
pub(crate) fn scale_bf16_bits(x: &mut [u16], factor: f32) {
    for v in x.iter_mut() {
        *v = f32_to_bf16_bits(f32::from_bits(u32::from(*v) << 16) * factor);
    }
}

/// A bf16 value (its bits) widened exactly to `f64`.
#[inline(always)]
pub fn bf16_bits_to_f64(bits: u16) -> f64 {
    f64::from(f32::from_bits(u32::from(bits) << 16))
}

/// Whether every bf16 value (given by its bits) is finite: its exponent field is not all ones
/// (the bits of ±∞ and every NaN). One pass with no early exit, which the compiler vectorizes.
///
/// ```
/// use kappa_linalg::scalar::bf16_bits_all_finite;
/// let (one, inf, nan) = (0x3F80u16, 0x7F80u16, 0xFFC1u16);
/// assert!(bf16_bits_all_finite(&[one, 0x0001, 0x8000, 0x7F7F]));
/// assert!(!bf16_bits_all_finite(&[one, inf]) && !bf16_bits_all_finite(&[nan, one]));
/// ```
pub fn bf16_bits_all_finite(bits: &[u16]) -> bool {
    const EXPONENT: u16 = 0x7F80;
    bits.iter()
        .fold(0u16, |any, &b| any | u16::from(b & EXPONENT == EXPONENT))
        == 0
}

/// max |a_ij| in `f64` (0 for an empty array; NaN-free input assumed).
pub(crate) fn max_abs<'a, A: Real>(iter: impl Iterator<Item = &'a A>) -> f64 {
    iter.fold(0.0f64, |m, &x| m.max(x.to_f64_lossy().abs()))
}

/// A copy of `a` that LAPACK accepts, scaled exactly by the power of two that brings
/// max |a_ij| into [0.5, 1), and that scaling. A column-major input stays column-major (so
/// LAPACK sees the same layout as an unscaled copy would give it); every other layout — row-major,
/// strided, negative strides — becomes row-major.
pub(crate) fn scaled_copy<A: Real>(a: ndarray::ArrayView2<'_, A>) -> (ndarray::Array2<A>, Pow2) {
    let column_major = !a.is_standard_layout() && a.t().is_standard_layout();
    scaled_copy_in(a, column_major)
}

/// [`scaled_copy`] in the layout that shows LAPACK the tall orientation of `a`: column-major
/// when m ≥ n, row-major (which LAPACK reads as the n×m transpose) when m < n. For what is
/// invariant under transposition (singular values): LAPACK's SVD drivers first reduce a tall
/// matrix by QR, and a wide one is much slower in them — MKL's `dgesdd` took 187 ms on a
/// 256×4096 matrix against 32 ms on its 4096×256 transpose (values only, one thread; the gemm
/// bench), OpenBLAS's 84 against 36.
pub(crate) fn scaled_copy_tall<A: Real>(
    a: ndarray::ArrayView2<'_, A>,
) -> (ndarray::Array2<A>, Pow2) {
    let (m, n) = a.dim();
    scaled_copy_in(a, m >= n)
}

fn scaled_copy_in<A: Real>(
    a: ndarray::ArrayView2<'_, A>,
    column_major: bool,
) -> (ndarray::Array2<A>, Pow2) {
    use ndarray::ShapeBuilder;
    let p = Pow2::normalizing(max_abs(a.iter()));
    let mut out = if column_major {
        ndarray::Array2::zeros(a.dim().f())
    } else {
        ndarray::Array2::zeros(a.dim())
    };
    ndarray::Zip::from(&mut out)
        .and(&a)
        .for_each(|o, &x| *o = p.apply(x));
    (out, p)
}

#[cfg(test)]
mod pow2_tests {
    use super::*;

    #[test]
    fn exponents_and_exact_scaling() {
        assert_eq!(binary_exponent(1.0), 1);
        assert_eq!(binary_exponent(0.75), 0);
        assert_eq!(binary_exponent(f64::MAX), 1024);
        assert_eq!(binary_exponent(f64::MIN_POSITIVE), -1021);
        assert_eq!(binary_exponent(5e-324), -1073);
        for x in [f64::MAX, 3.0, 1e-300, 5e-324, 1e-320] {
            let p = Pow2::normalizing(x);
            let y = p.apply(x);
            assert!((0.5..1.0).contains(&y), "{x} → {y}");
            assert_eq!(p.inverse().apply(y), x);
        }
        let p = Pow2::normalizing(f32::MAX as f64);
        let y = p.apply(f32::MAX);
        assert!((0.5..1.0).contains(&y) && p.inverse().apply(y) == f32::MAX);
        let tiny = f32::from_bits(1);
        let p = Pow2::normalizing(tiny as f64);
        assert_eq!(p.inverse().apply(p.apply(tiny)), tiny);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_abs_entry_finds_the_largest_at_every_position() {
        // Every position of a 5×7 matrix (the lanes and the tail), either sign, contiguous,
        // transposed and strided; f32 and subnormals too.
        for at in 0..35 {
            for sign in [1.0, -1.0] {
                let mut a = ndarray::Array2::<f64>::from_shape_fn((5, 7), |(i, j)| {
                    -((i * 7 + j) as f64) * 1e-3
                });
                a[[at / 7, at % 7]] = sign * 9.25;
                assert_eq!(max_abs_entry(&a.view()), 9.25, "{at}");
                assert_eq!(max_abs_entry(&a.t()), 9.25, "{at}");
                let strided = a.slice(ndarray::s![.., ..;3]);
                let expect = if (at % 7) % 3 == 0 { 9.25 } else { 0.034 };
                assert_eq!(max_abs_entry(&strided), expect, "{at}");
            }
        }
        let tiny = ndarray::Array2::<f32>::from_elem((3, 3), -f32::from_bits(1));
        assert_eq!(max_abs_entry(&tiny.view()), f64::from(f32::from_bits(1)));
        assert_eq!(
            max_abs_entry(&ndarray::Array2::<f64>::zeros((0, 4)).view()),
            0.0
        );
    }

    #[test]
    fn slice_norm_agrees_with_scaled_norm() {
        let cases: [&[f64]; 6] = [
            &[3e300, 4e300],
            &[3e-300, 4e-300],
            &[3e-320, 4e-320],
            &[],
            &[0.0; 13],
            &[1.0, -2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0],
        ];
        for c in cases {
            let (fast, slow) = (slice_norm(c), scaled_norm(c.iter()));
            assert!(
                (fast - slow).abs() <= 1e-15 * slow,
                "{c:?}: {fast} vs {slow}"
            );
        }
        assert!(slice_norm(&[1.0, f64::NAN, 2.0]).is_nan());
        assert!(!slice_norm(&[1.0, f64::INFINITY]).is_finite());
        assert!((slice_norm(&[3e-30f32, 4e-30]) - 5e-30).abs() <= 1e-36);
        let a = ndarray::Array2::from_shape_fn((5, 7), |(i, j)| (i * 7 + j) as f64 - 10.0);
        let expect = scaled_norm(a.iter());
        assert!((array_norm(&a) - expect).abs() <= 1e-14 * expect);
        assert!((array_norm(&a.t()) - expect).abs() <= 1e-14 * expect);
        assert!(
            (array_norm(&a.slice(ndarray::s![.., 1..3]))
                - scaled_norm(a.slice(ndarray::s![.., 1..3]).iter()))
            .abs()
                <= 1e-13
        );
    }

    #[test]
    fn scaled_norm_survives_extreme_magnitudes() {
        let big = [3e300f64, 4e300];
        assert!((scaled_norm(big.iter()) - 5e300).abs() <= 1e286);
        let tiny = [3e-300f64, 4e-300];
        assert!((scaled_norm(tiny.iter()) - 5e-300).abs() <= 1e-314);
        let sub = [3e-320f64, 4e-320];
        assert!(scaled_norm(sub.iter()) > 0.0);
        let f = [3e-30f32, 4e-30];
        assert!((scaled_norm(f.iter()) - 5e-30).abs() <= 1e-36);
        assert_eq!(scaled_norm::<f64>([0.0, 0.0].iter()), 0.0);
        assert_eq!(scaled_norm::<f64>([].iter()), 0.0);
    }
}
