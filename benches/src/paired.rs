//! Paired, alternating timings: the ratio of two computations measured side by side in one run.
//!
//! Each pair times A and B back to back, in alternating order (A first on even pairs, B first on
//! odd ones), so slow drifts of the machine (frequency, a neighbour's load) hit both sides alike
//! and cancel in the per-pair ratio. The summary is the median ratio with the spread (min–max)
//! over pairs.

use std::time::Instant;

/// Median and range of a sample.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    /// The median.
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
    /// How many values.
    pub count: usize,
}

impl Spread {
    /// The median, min and max of `xs` (which must not be empty).
    pub fn of(mut xs: Vec<f64>) -> Self {
        assert!(!xs.is_empty(), "a spread of no values");
        xs.sort_by(f64::total_cmp);
        let n = xs.len();
        let median = if n % 2 == 1 {
            xs[n / 2]
        } else {
            0.5 * (xs[n / 2 - 1] + xs[n / 2])
        };
        Self {
            median,
            min: xs[0],
            max: xs[n - 1],
            count: n,
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.3} [{:.3}–{:.3}]", self.median, self.min, self.max)
    }
}

/// Seconds one call of `f` takes.
pub fn seconds(f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// Times `a` and `b` in `pairs` alternating pairs after `warmup` untimed pairs; returns the
/// seconds of each side, pair by pair.
pub fn alternate(
    a: &mut dyn FnMut(),
    b: &mut dyn FnMut(),
    warmup: usize,
    pairs: usize,
) -> (Vec<f64>, Vec<f64>) {
    alternate_settled(a, b, warmup, pairs, None)
}

/// [`alternate`], and with `settle`, each timed call is preceded by a pause of that length and
/// one untimed call: when A and B run on different thread pools (OpenBLAS's pthreads, libtorch's
/// OpenMP), the pool that just worked spins idle for a while and takes cores from the other;
/// the pause lets it go to sleep, so each side is timed on its own rather than in the other's
/// wake (that interference is measured separately, without `settle`).
pub fn alternate_settled(
    a: &mut dyn FnMut(),
    b: &mut dyn FnMut(),
    warmup: usize,
    pairs: usize,
    settle: Option<std::time::Duration>,
) -> (Vec<f64>, Vec<f64>) {
    for _ in 0..warmup {
        a();
        b();
    }
    let timed = |f: &mut dyn FnMut()| {
        if let Some(pause) = settle {
            std::thread::sleep(pause);
            f();
        }
        seconds(f)
    };
    let (mut ta, mut tb) = (Vec::with_capacity(pairs), Vec::with_capacity(pairs));
    for i in 0..pairs {
        if i % 2 == 0 {
            ta.push(timed(a));
            tb.push(timed(b));
        } else {
            tb.push(timed(b));
            ta.push(timed(a));
        }
    }
    (ta, tb)
}

/// `a` and `b` alternated in `pairs` pairs ([`alternate_settled`] with `warmup` and `settle`),
/// each sample the mean of as many calls as fill `sample_seconds` (counted once per side from a
/// warm call): the per-pair ratio a/b and each side's seconds per call.
pub fn per_call(
    a: &mut dyn FnMut(),
    b: &mut dyn FnMut(),
    warmup: usize,
    pairs: usize,
    settle: Option<std::time::Duration>,
    sample_seconds: f64,
) -> [Spread; 3] {
    let calls = |f: &mut dyn FnMut()| {
        f();
        ((sample_seconds / seconds(f).max(1e-7)).ceil() as usize).max(1)
    };
    let (na, nb) = (calls(a), calls(b));
    let mut many_a = || (0..na).for_each(|_| a());
    let mut many_b = || (0..nb).for_each(|_| b());
    let (ta, tb) = alternate_settled(&mut many_a, &mut many_b, warmup, pairs, settle);
    let ta: Vec<f64> = ta.iter().map(|t| t / na as f64).collect();
    let tb: Vec<f64> = tb.iter().map(|t| t / nb as f64).collect();
    [Spread::of(ratios(&ta, &tb)), Spread::of(ta), Spread::of(tb)]
}

/// The per-pair ratios `num[i] / den[i]`.
pub fn ratios(num: &[f64], den: &[f64]) -> Vec<f64> {
    num.iter().zip(den).map(|(n, d)| n / d).collect()
}

/// The CPU's model name and its vector level, for the heading of a summary
/// ([`kappa_linalg::cpu_model`]).
pub use kappa_linalg::cpu_model;
