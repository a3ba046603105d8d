//! Exact power-of-two scaling, so that SVDs and linear maps only ever see entries of moderate
//! size (see `docs/attention.md`, "Scale behaviour").
//!
//! # Why it is exact
//!
//! Multiplying by 2^e only changes the exponent of a binary floating-point number, so it is exact
//! unless the result leaves the normal range. The SVD commutes with it: σ_i(2^e A) = 2^e σ_i(A)
//! with the same singular vectors, and κ, κ⁺ and the numerical rank are scale invariant (the
//! numpy threshold τ = σ₁·max(m, n)·ε scales with σ₁). A linear map f satisfies
//! f(t) = 2^e f(2^{-e} t). So an input whose largest entry is near the overflow threshold (where
//! LAPACK's bidiagonal QR iteration can receive ∞ from an overflowing column norm and never
//! return) or deep in the subnormal range is first brought to a largest entry in [1/2, 1), and
//! the result is scaled back, overflowing only if the true value is not representable.
//!
//! Entries that are tiny *relative to the largest one* may underflow when scaled down; they are
//! below 2^{-1074}·2^e ≈ ε·max|a|·2^{-1000}, far below the SVD's own backward error ε·‖A‖₂.

use kappa_linalg::{singular_values, svd_thin, Real, Svd, SvdDriver};
use ndarray::{Array1, Array2, ArrayView2};

use crate::error::{check_computed, Result};

/// The largest |entry| of `a`, in f64 (exact for f32 and f64).
pub(crate) fn max_abs<A: Real>(a: &ArrayView2<'_, A>) -> f64 {
    kappa_linalg::scalar::max_abs_entry(a)
}

/// The half-width L of the band [2^{-L}, 2^L] of largest entries that need no scaling: a
/// quarter of the exponent range, so that squares, column norms and products of two such
/// entries stay finite and normal (f64: L = 256, f32: L = 32).
fn band<A: Real>() -> i32 {
    if A::EPS > 1e-10 {
        128 / 4
    } else {
        1024 / 4
    }
}

/// The exponent e with max|a|·2^{-e} ∈ [1/2, 1), or 0 when no scaling is needed (largest entry
/// within the band, or zero).
pub(crate) fn exponent_for<A: Real>(amax: f64) -> i32 {
    if amax == 0.0 || !amax.is_finite() {
        return 0;
    }
    let e = amax.log2().floor() as i32 + 1;
    if e.abs() <= band::<A>() {
        0
    } else {
        e
    }
}

/// 2^e as f64, exact for |e| ≤ 1022 (normal); used in two halves by [`times_pow2`].
fn pow2(e: i32) -> f64 {
    2f64.powi(e)
}

/// x·2^e, applied in two halves so that each factor is a normal number of `A` (for every e
/// this module produces), hence exact while x·2^e is normal.
pub(crate) fn times_pow2<A: Real>(x: A, e: i32) -> A {
    let h = e / 2;
    x * A::from_f64_lossy(pow2(h)) * A::from_f64_lossy(pow2(e - h))
}

/// x·2^e in f64 (+∞ when it overflows, 0 when it underflows).
pub(crate) fn times_pow2_f64(x: f64, e: i32) -> f64 {
    times_pow2(x, e)
}

/// A standard-layout copy of `a` multiplied by 2^{-e}.
pub(crate) fn scaled_copy<A: Real>(a: &ArrayView2<'_, A>, e: i32) -> Array2<A> {
    let mut out = Array2::zeros(a.raw_dim());
    out.assign(a);
    if e != 0 {
        out.mapv_inplace(|x| times_pow2(x, -e));
    }
    out
}

/// The singular values of 2^{-e} a, descending, and e (see the module docs). `a` must be
/// validated (non-empty, finite) by the caller.
pub(crate) fn singular_values_scaled<A: Real>(a: ArrayView2<'_, A>) -> Result<(Array1<A>, i32)> {
    let e = exponent_for::<A>(max_abs(&a));
    let s = singular_values(scaled_copy(&a, e).view(), SvdDriver::default())?;
    Ok((s, e))
}

/// The thin SVD of 2^{-e} a and e. `a` must be validated by the caller.
pub(crate) fn svd_scaled<A: Real>(a: ArrayView2<'_, A>) -> Result<(Svd<A>, i32)> {
    let e = exponent_for::<A>(max_abs(&a));
    let f = svd_thin(scaled_copy(&a, e).view(), SvdDriver::default())?;
    Ok((f, e))
}

/// Evaluates a linear map f at validated, finite arguments `ts` as 2^e·f(2^{-e}·ts), with e
/// from the largest entry of all of them ([`exponent_for`]; e = 0 in the normal range, where
/// this is f itself). By linearity the value is the same in exact arithmetic, and the scaled
/// evaluation neither overflows on huge nor underflows on tiny arguments.
///
/// Errors: [`crate::AttentionError::Overflow`] naming `inner` when f at the scaled arguments is not
/// finite (the map's own coefficients are out of range), `outer` when only the scaled-back
/// result is (the true value is not representable).
pub(crate) fn linear<'a, A: Real, const N: usize, const M: usize>(
    ts: [ArrayView2<'a, A>; N],
    names: (&'static str, &'static str),
    what: &str,
    f: impl for<'b> FnOnce([ArrayView2<'b, A>; N]) -> [Array2<A>; M],
) -> Result<[Array2<A>; M]> {
    let (inner, outer) = names;
    let amax = ts.iter().fold(0.0f64, |m, t| m.max(max_abs(t)));
    let e = exponent_for::<A>(amax);
    // In the normal range (e = 0) f sees the arguments themselves: no copy.
    let mut out = if e == 0 {
        f(ts)
    } else {
        let owned = ts.map(|t| scaled_copy(&t, e));
        f(owned.each_ref().map(|a| a.view()))
    };
    for o in out.iter_mut() {
        check_computed(inner, &o.view(), what)?;
        if e != 0 {
            o.mapv_inplace(|x| times_pow2(x, e));
            check_computed(outer, &o.view(), what)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_is_exact_and_only_outside_the_band() {
        assert_eq!(exponent_for::<f64>(1.0), 0);
        assert_eq!(exponent_for::<f64>(1e70), 0);
        // Outside the band the scaled largest entry lies in [1/4, 1] (log2 may round up by one).
        for x in [1e300, f64::MAX, 1e-300, 5e-324] {
            let y = times_pow2(x, -exponent_for::<f64>(x));
            assert!((0.25..=1.0).contains(&y), "{x:e} → {y:e}");
        }
        for x in [1e30f32, f32::MAX, 1e-30, 1e-45] {
            let y = times_pow2(x, -exponent_for::<f32>(f64::from(x)));
            assert!((0.25..=1.0).contains(&y), "{x:e} → {y:e}");
        }
        let x = 0.75 * f64::MAX;
        assert_eq!(times_pow2(times_pow2(x, -1024), 1024), x);
        let y = 3.0f32 * f32::MAX / 4.0;
        assert_eq!(times_pow2(times_pow2(y, -128), 128), y);
        assert_eq!(times_pow2_f64(f64::MAX, 1), f64::INFINITY);
    }
}
