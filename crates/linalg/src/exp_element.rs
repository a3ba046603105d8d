//! The kernels of [`crate::exp`] (its docs: method, accuracy, bits) and the sealed element
//! bound [`ExpElement`], in a module of their own so that `scalar` (which names the bound) and
//! `exp` (which uses `Real`) depend on it one way.

// The dispatch calls `#[target_feature]` functions after checking the CPU has the feature.
#![allow(unsafe_code)]

pub(crate) use element::ExpElement;

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
pub(crate) fn exp_f64(x: f64) -> f64 {
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
    /// The element types [`crate::exp::exp_in_place`] takes (f32, f64); a bound of
    /// [`crate::Real`] that only this crate can name or implement.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop's name and the loop.
    type Loop<T> = (&'static str, fn(&mut [T]));

    /// Each loop this CPU can run — portable, and AVX2 and AVX-512 where present — gives the
    /// scalar kernel's bits (the module's claim that the vector width changes nothing); the
    /// integration test covers only the loop the dispatch picks.
    #[test]
    fn every_loop_gives_the_scalar_bits() {
        let x64: Vec<f64> = (0..1000)
            .map(|i| (i as f64 * 0.7539).sin() * 760.0)
            .chain([
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                0.0,
                -0.0,
                709.79,
            ])
            .collect();
        let x32: Vec<f32> = x64.iter().map(|&v| v as f32).collect();
        let want64: Vec<u64> = x64.iter().map(|&v| exp_f64(v).to_bits()).collect();
        let want32: Vec<u32> = x32
            .iter()
            .map(|&v| (exp_f64(f64::from(v)) as f32).to_bits())
            .collect();
        let mut loops64: Vec<Loop<f64>> = vec![("portable", exp_f64_loop)];
        let mut loops32: Vec<Loop<f32>> = vec![("portable", exp_f32_loop)];
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY (both closures): called only where the CPU has the feature (checked here).
            if std::arch::is_x86_feature_detected!("avx2") {
                loops64.push(("avx2", |x| unsafe { x86::f64_avx2(x) }));
                loops32.push(("avx2", |x| unsafe { x86::f32_avx2(x) }));
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                loops64.push(("avx512", |x| unsafe { x86::f64_avx512(x) }));
                loops32.push(("avx512", |x| unsafe { x86::f32_avx512(x) }));
            }
        }
        for (name, run) in loops64 {
            let mut y = x64.clone();
            run(&mut y);
            let got: Vec<u64> = y.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want64, "f64 {name}");
        }
        for (name, run) in loops32 {
            let mut y = x32.clone();
            run(&mut y);
            let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want32, "f32 {name}");
        }
    }
}
