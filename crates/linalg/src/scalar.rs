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
    NdFloat + Lapack + ndarray_linalg::Scalar<Real = Self> + Default + sealed::Sealed
{
    /// Machine epsilon of the type: 2⁻²³ for `f32`, 2⁻⁵² for `f64`.
    const EPS: f64;
    /// The type's name, for messages.
    const NAME: &'static str;
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

#[cfg(test)]
mod tests {
    use super::*;

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
