//! `exp::exp_in_place` against a double-double reference: the error bound in ulp, the special
//! values, f32, and the same bits from the vector loops as from the scalar form.
//!
//! The bound (module docs' method; u = 2⁻⁵³, |fl(v) − v| ≤ u·|v|; |r| ≤ 0.347, so p = e^r lies
//! in [0.707, 1.415] and t = p − 1 in [−0.293, 0.415]). p = fl(1 + fl(r + w)), w = fl(r_lo +
//! fl(fl(r·r)·s)):
//!
//! * the final sum: ≤ ½ ulp of p;
//! * fl(r + w): ≤ ½ ulp of t ≤ u/4 (|t| < ½);
//! * w: fl(r·r) ≤ 0.12u·s, the product ≤ 0.068u, the sum with r_lo ≤ 0.068u, Horner's s
//!   (relative ≤ 0.65u) times r² ≤ 0.08u: ≤ 0.3u together;
//! * r + r_lo = x − n·ln 2 up to the rounding of n·ln2_lo (≤ 2·10⁻⁷u) and the Taylor remainder
//!   (≤ 6·10⁻¹⁸ relative, 0.055u·p ≤ 0.08u).
//!
//! One ulp of p is 2u for p ≥ 1 and u for p < 1: at most 0.5 + (0.25 + 0.3 + 0.08)/2 = 0.82
//! ulp, resp. 0.5 + 0.25 + 0.3 + 0.08 ≤ 1.13 ulp. The scalings by powers of two are exact for
//! normal results. Measured maxima are printed.

use kappa_linalg::exp::{exp, exp_in_place};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The derived bound (module docs) in ulp of the exact result.
const BOUND_ULP: f64 = 1.13;

/// A double-double number hi + lo, |lo| ≤ ulp(hi)/2.
#[derive(Clone, Copy)]
struct Dd(f64, f64);

fn two_sum(a: f64, b: f64) -> Dd {
    let s = a + b;
    let bb = s - a;
    Dd(s, (a - (s - bb)) + (b - bb))
}

fn quick(s: f64, e: f64) -> Dd {
    let h = s + e;
    Dd(h, e - (h - s))
}

fn add(x: Dd, y: Dd) -> Dd {
    let Dd(s, e) = two_sum(x.0, y.0);
    quick(s, e + x.1 + y.1)
}

fn mul(x: Dd, y: Dd) -> Dd {
    let p = x.0 * y.0;
    // `mul_add` is the correctly rounded fused operation on every platform (software if need be).
    let e = x.0.mul_add(y.0, -p);
    quick(p, e + x.0 * y.1 + x.1 * y.0)
}

fn div_int(x: Dd, k: f64) -> Dd {
    let q1 = x.0 / k;
    let p = mul(Dd(q1, 0.0), Dd(k, 0.0));
    let rem = add(x, Dd(-p.0, -p.1));
    quick(q1, rem.0 / k)
}

/// 2^e for an integer e ≥ −1074 (a normal or subnormal power of two; ∞ above 1023).
fn pow2(e: i64) -> f64 {
    if e > 1023 {
        f64::INFINITY
    } else if e >= -1022 {
        f64::from_bits(((e + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (e + 1074))
    }
}

/// e^x = m·2ⁿ with m = e^r to about 2⁻¹⁰⁴ relative as a double-double (|r| ≤ 0.35).
fn reference(x: f64) -> (Dd, i64) {
    const LN2: Dd = Dd(
        f64::from_bits(0x3fe6_2e42_fefa_39ef),
        f64::from_bits(0x3c7a_bc9e_3b39_803c),
    );
    let n = (x / LN2.0).round();
    let nl = mul(Dd(n, 0.0), LN2);
    let r = add(Dd(x, 0.0), Dd(-nl.0, -nl.1));
    let (mut sum, mut term) = (Dd(1.0, 0.0), Dd(1.0, 0.0));
    for k in 1..=27 {
        term = div_int(mul(term, r), k as f64);
        sum = add(sum, term);
    }
    (sum, n as i64)
}

/// |computed − e^x| in ulp of e^x (the subnormal spacing 2⁻¹⁰⁷⁴ below the normal range),
/// evaluated at the scale of m, where computed·2⁻ⁿ is exact.
fn ulp_error(computed: f64, x: f64) -> f64 {
    let (m, n) = reference(x);
    let (n1, n2) = (n.div_euclid(2), n - n.div_euclid(2));
    let scaled = computed * pow2(-n1) * pow2(-n2);
    // e^x's ulp is 2^(exponent(m) + n − 52), at least 2⁻¹⁰⁷⁴; at m's scale, 2⁻ⁿ times that.
    let m_exponent = ((m.0.to_bits() >> 52) as i64) - 1023;
    let ulp = pow2((m_exponent + n - 52).max(-1074) - n);
    ((scaled - m.0) - m.1).abs() / ulp
}

/// The largest error over `count` seeded points uniform in [lo, hi].
fn max_error(lo: f64, hi: f64, count: usize, seed: u64) -> (f64, f64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut xs: Vec<f64> = (0..count).map(|_| rng.gen_range(lo..=hi)).collect();
    let inputs = xs.clone();
    exp_in_place(&mut xs);
    let mut worst = (0.0, 0.0);
    for (&x, &y) in inputs.iter().zip(&xs) {
        let e = ulp_error(y, x);
        if e > worst.0 {
            worst = (e, x);
        }
    }
    worst
}

#[test]
fn error_bound_in_ulp() {
    for (lo, hi, seed) in [
        (-0.35, 0.35, 1),
        (-1.0, 1.0, 2),
        (-40.0, 0.0, 3),
        (-745.0, 709.7, 4),
    ] {
        let (err, at) = max_error(lo, hi, 1 << 17, seed);
        println!("exp on [{lo}, {hi}]: max error {err:.3} ulp (at x = {at:e})");
        assert!(
            err < BOUND_ULP,
            "{err} ulp at x = {at:e}, bound {BOUND_ULP}"
        );
    }
    // Subnormal results are rounded twice: p·2ⁿ, within 1 ulp of p (relative 2⁻⁵², so below
    // e^x·2⁻⁵² < 2⁻¹⁰⁷⁴ absolute), then to the spacing 2⁻¹⁰⁷⁴ (half of it): below 1.5 spacings.
    let (err, at) = max_error(-745.1, -708.5, 1 << 14, 5);
    println!("exp on [-745.1, -708.5] (subnormal results): max error {err:.3} spacings");
    assert!(err < 1.5, "{err} at {at:e}");
}

#[test]
fn special_values_and_the_ends_of_the_range() {
    assert!(exp(f64::NAN).is_nan());
    assert_eq!(exp(f64::INFINITY), f64::INFINITY);
    assert_eq!(exp(f64::NEG_INFINITY), 0.0);
    assert_eq!(exp(0.0), 1.0);
    assert_eq!(exp(-0.0), 1.0);
    assert_eq!(exp(f64::MAX), f64::INFINITY);
    assert_eq!(exp(-f64::MAX), 0.0);
    // ln(f64::MAX) = 709.782712893384: just below is finite and within the bound, just above +∞.
    let below = 709.78;
    assert!(ulp_error(exp(below), below) < BOUND_ULP);
    assert_eq!(exp(709.79), f64::INFINITY);
    // e^-745.13 is the smallest subnormal's half-way point: below it 0, above it 2⁻¹⁰⁷⁴.
    assert_eq!(exp(-745.2), 0.0);
    assert_eq!(exp(-745.0), f64::from_bits(1));
    // A power of two's logarithm: n exact, r ≈ 0.
    assert_eq!(exp(10.0 * std::f64::consts::LN_2), 1024.0);
}

#[test]
fn f32_is_the_f64_result_rounded() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut x: Vec<f32> = (0..10_000).map(|_| rng.gen_range(-100f32..88.0)).collect();
    let inputs = x.clone();
    exp_in_place(&mut x);
    for (&a, &y) in inputs.iter().zip(&x) {
        assert_eq!(y, exp(f64::from(a)) as f32, "x = {a}");
        // The f64 value is within 1.13 ulp of f64, so rounding to f32 is within 0.5 ulp of f32 plus
        // 2⁻²⁸ of one (2·2⁻⁵² relative against f32's 2⁻²³ spacing); f32's spacing is 2²⁹ f64 ulp
        // for normal f32 results.
        if y >= f32::MIN_POSITIVE && y.is_finite() {
            let in_f64_ulp = ulp_error(f64::from(y), f64::from(a));
            assert!(
                in_f64_ulp <= (0.5 + 2f64.powi(-28)) * 2f64.powi(29),
                "x = {a}"
            );
        }
    }
    let mut special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 89.0, -104.0];
    exp_in_place(&mut special);
    assert!(special[0].is_nan());
    assert_eq!(&special[1..], &[f32::INFINITY, 0.0, f32::INFINITY, 0.0]);
}

#[test]
fn the_vector_loops_give_the_scalar_bits() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for len in (0..70).chain([257, 1000]) {
        let x: Vec<f64> = (0..len).map(|_| rng.gen_range(-750.0..750.0)).collect();
        // An unaligned start, so the loop's head and tail both run.
        let mut y = x.clone();
        let start = len.min(1);
        exp_in_place(&mut y[start..]);
        for (a, b) in x[start..].iter().zip(&y[start..]) {
            assert_eq!(b.to_bits(), exp(*a).to_bits(), "len {len}, x = {a:e}");
        }
    }
}
