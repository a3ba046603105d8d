//! e^x of every element of a slice, on the CPU's vector units: [`exp_in_place`].
//!
//! A softmax over an N×N score matrix is N² exponentials; one scalar call to the platform's
//! `exp` per element (≈ 3.5 ns each, measured on an AMD EPYC Zen 5) made them the larger part of
//! an attention forward pass at N = 197. This loop runs 2–8 elements per instruction (38 809
//! values in 39–47 µs there, against 135–138 µs element by element).
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

/// Replaces every element x of `x` by e^x (module docs: method, accuracy, bits).
pub fn exp_in_place<A: crate::Real>(x: &mut [A]) {
    A::exp_slice(x);
}

/// e^x of one `f64`, exactly as [`exp_in_place`] computes it (the same bits).
pub fn exp(x: f64) -> f64 {
    crate::exp_element::exp_f64(x)
}
