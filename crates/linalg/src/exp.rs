//! e^x of every element of a slice, on the CPU's vector units: [`exp_in_place`].
//!
//! A softmax over an N×N score matrix is N² exponentials; one scalar call to the platform's
//! `exp` per element (≈ 10 ns on a 2026 server core) made them the larger part of an attention
//! forward pass at N = 197. This loop runs 2–8 elements per instruction.
//!
//! # Method
//!
//! For x clamped to [−746, 746] (e^x rounds to 0 below and overflows above, in `f64`):
//!
//! 1. n = round(x·log₂e), by adding and subtracting 1.5·2⁵² (exact for |x·log₂e| < 2⁵¹);
//! 2. x − n·ln 2 = r + r_lo (Cody–Waite: ln2_hi has 32 significant bits, so h = x − n·ln2_hi is
//!    exact for |n| < 2²⁰; r = h − n·ln2_lo rounded, r_lo its rounding error), |r| ≤ 0.347;
//! 3. e^(r + r_lo) ≈ 1 + (r + (r_lo + r²·s)), s = 1/2! + r/3! + … + r¹¹/13! in Horner form
//!    (e^r's Taylor polynomial of degree 13; the remainder is below r¹⁴/14!·e^|r| ≤ 6·10⁻¹⁸
//!    relative, 0.03 ulp);
//! 4. e^x = p·2^⌊n/2⌋·2^(n−⌊n/2⌋): two exact power-of-two scalings (each factor is a normal
//!    number for |n| ≤ 1077), so a normal result is rounded once, a subnormal one twice.
//!
//! NaN stays NaN, −∞ gives 0 and +∞ gives +∞ (the clamp passes NaN through).
//!
//! # Accuracy
//!
//! The error of a normal `f64` result is below 1.13 ulp: the final sum's
//! half ulp, the sum r + w and the small part w = r_lo + r²·s (the derivation is in the
//! integration test `exp.rs`, which also measures the error against a double-double reference:
//! at most 0.82–0.86 ulp over 2¹⁷ seeded points in each of [−0.35, 0.35], [−1, 1], [−40, 0] and
//! [−745, 709.7]). A subnormal result is rounded twice: below 1.5 of its spacing 2⁻¹⁰⁷⁴
//! (measured 0.71). `f32` is computed in `f64` and rounded once more: below 0.5 ulp of `f32`
//! plus 2⁻²⁸ of one.
//!
//! # The same bits on every CPU
//!
//! The loop uses no fused multiply–add, and each element goes through the same IEEE operations
//! in the same order whatever the vector width: the results are the same bits with AVX-512,
//! AVX2 or the portable loop (tested against the scalar form), unlike a platform `exp`, which
//! may pick a variant by CPU feature.
//!
//! ```
//! let mut x = [0.0_f64, 1.0, -1.0, f64::NEG_INFINITY];
//! kappa_linalg::exp::exp_in_place(&mut x);
//! assert_eq!(x[0], 1.0);
//! assert!((x[1] - std::f64::consts::E).abs() <= f64::EPSILON * 3.0);
//! assert_eq!(x[3], 0.0);
//! ```

// The dispatch calls `#[target_feature]` functions after checking the CPU has the feature.
#![allow(unsafe_code)]

pub(crate) use element::ExpElement;

/// Replaces every element x of `x` by e^x (module docs: method, accuracy, bits).
pub fn exp_in_place<A: crate::Real>(x: &mut [A]) {
    A::exp_slice(x);
}

/// e^x of one `f64`, exactly as [`exp_in_place`] computes it (the same bits).
pub fn exp(x: f64) -> f64 {
    exp_f64(x)
}

const LOG2_E: f64 = std::f64::consts::LOG2_E;
/// ln 2 in two parts: 32 significant bits, and the rest (fdlibm's split).
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// 1.5·2⁵²: x + SHIFT − SHIFT rounds x to an integer for |x| < 2⁵¹.
const SHIFT: f64 = 6_755_399_441_055_744.0;
/// Beyond ±746 e^x rounds to 0 or overflows in `f64`; the clamp keeps n within ±1077.
const CLAMP: f64 = 746.0;
/// 1/k! for k = 13 down to 2 (each rounded once).
const INV_FACTORIAL: [f64; 12] = [
    1.0 / 6_227_020_800.0,
    1.0 / 479_001_600.0,
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
];

/// The method of the module docs for one element.
#[inline(always)]
fn exp_f64(x: f64) -> f64 {
    let x = x.clamp(-CLAMP, CLAMP);
    let t = x * LOG2_E + SHIFT;
    let nf = t - SHIFT;
    // t lies in [2⁵², 2⁵³), where its low mantissa bits are n in two's complement.
    let n = (t.to_bits() as i64).wrapping_sub(SHIFT.to_bits() as i64);
    // r + rl = x − n·ln 2: h is exact, r = h − c rounded and rl its rounding error.
    let (h, c) = (x - nf * LN2_HI, nf * LN2_LO);
    let r = h - c;
    let rl = (h - r) - c;
    // s = (e^r − 1 − r)/r² = 1/2! + r/3! + … + r¹¹/13!, then e^(r + rl) ≈ 1 + (r + (rl + r²·s)).
    let mut s = INV_FACTORIAL[0];
    for c in &INV_FACTORIAL[1..] {
        s = s * r + c;
    }
    let p = 1.0 + (r + (rl + r * r * s));
    // ⌊n/2⌋ without an arithmetic shift (n + 2048 > 0), then 2^(n₁) and 2^(n − n₁) as bits.
    let n1 = (((n + 2048) as u64) >> 1) as i64 - 1024;
    let pow2 = |e: i64| f64::from_bits(((e + 1023) as u64) << 52);
    p * pow2(n1) * pow2(n - n1)
}

#[inline(always)]
fn exp_f64_loop(x: &mut [f64]) {
    for v in x {
        *v = exp_f64(*v);
    }
}

#[inline(always)]
fn exp_f32_loop(x: &mut [f32]) {
    for v in x {
        *v = exp_f64(f64::from(*v)) as f32;
    }
}

/// The loops compiled for AVX-512 and AVX2, chosen at run time (the same bits as the portable
/// loop: no FMA).
#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx512f")]
    pub(super) fn f64_avx512(x: &mut [f64]) {
        super::exp_f64_loop(x);
    }
    #[target_feature(enable = "avx2")]
    pub(super) fn f64_avx2(x: &mut [f64]) {
        super::exp_f64_loop(x);
    }
    #[target_feature(enable = "avx512f")]
    pub(super) fn f32_avx512(x: &mut [f32]) {
        super::exp_f32_loop(x);
    }
    #[target_feature(enable = "avx2")]
    pub(super) fn f32_avx2(x: &mut [f32]) {
        super::exp_f32_loop(x);
    }
}

/// Runs `avx512`, `avx2` or `portable` on `x`, the widest the CPU has.
#[cfg(target_arch = "x86_64")]
fn dispatch<T>(
    x: &mut [T],
    avx512: unsafe fn(&mut [T]),
    avx2: unsafe fn(&mut [T]),
    portable: fn(&mut [T]),
) {
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: `avx512` requires only AVX-512F, which this CPU has (checked above).
        return unsafe { avx512(x) };
    }
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: `avx2` requires only AVX2, which this CPU has (checked above).
        return unsafe { avx2(x) };
    }
    portable(x)
}

mod element {
    /// The element types [`super::exp_in_place`] takes (f32, f64); a bound of [`crate::Real`]
    /// that only this crate can name or implement.
    pub trait ExpElement: Sized {
        /// e^x of every element, in place.
        fn exp_slice(x: &mut [Self]);
    }

    impl ExpElement for f64 {
        fn exp_slice(x: &mut [f64]) {
            #[cfg(target_arch = "x86_64")]
            super::dispatch(
                x,
                super::x86::f64_avx512,
                super::x86::f64_avx2,
                super::exp_f64_loop,
            );
            #[cfg(not(target_arch = "x86_64"))]
            super::exp_f64_loop(x);
        }
    }

    impl ExpElement for f32 {
        fn exp_slice(x: &mut [f32]) {
            #[cfg(target_arch = "x86_64")]
            super::dispatch(
                x,
                super::x86::f32_avx512,
                super::x86::f32_avx2,
                super::exp_f32_loop,
            );
            #[cfg(not(target_arch = "x86_64"))]
            super::exp_f32_loop(x);
        }
    }
}
