//! Small statistics for reports: means, sample standard deviations, medians, per-step summaries
//! over seeds, least-squares lines with a 95% interval on the slope, and Student's t
//! distribution (its CDF through the regularized incomplete beta function) for one-sided
//! t-tests: Welch's two-sample test and the one-sample test against a threshold.

use std::collections::BTreeMap;

/// The mean (NaN for no values).
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

/// Mean and sample standard deviation (n − 1 in the denominator; 0 for a single value).
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    let mean = mean(values);
    match n {
        0 => (f64::NAN, f64::NAN),
        1 => (mean, 0.0),
        _ => {
            let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            (mean, var.sqrt())
        }
    }
}

/// The median of the values that are not NaN (NaN when there are none): the middle value, or
/// for an even count the mean of the middle two — except that an infinite one of those two is
/// the median (κ = ∞ marks a singular matrix, and the median of {1, ∞} is then ∞).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 || v[m - 1].is_infinite() || v[m].is_infinite() {
        v[m]
    } else {
        0.5 * (v[m - 1] + v[m])
    }
}

/// The upper median: the value at index ⌊n/2⌋ in sorted order, no averaging (`None` for no
/// values).
pub fn upper_median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The smallest and the largest value ((∞, −∞) for none).
pub fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

/// A curve over training from (step, value) pairs of every seed: per step, in step order,
/// `summary` (a [`mean`] or a [`median`]) of that step's values, in the order given.
pub fn per_step(
    points: impl IntoIterator<Item = (u64, f64)>,
    summary: impl Fn(&[f64]) -> f64,
) -> Vec<(f64, f64)> {
    let mut at: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for (step, value) in points {
        at.entry(step).or_default().push(value);
    }
    at.into_iter()
        .map(|(step, values)| (step as f64, summary(&values)))
        .collect()
}

/// Two-sided 97.5% quantile of Student's t with `df` degrees of freedom (tabulated to 30, then
/// 1.96 + 2.4/df).
pub fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df - 1],
        _ => 1.96 + 2.4 / df as f64,
    }
}

/// A least-squares line y = a + s·x with the slope's 95% interval half-width.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LineFit {
    /// a.
    pub intercept: f64,
    /// s.
    pub slope: f64,
    /// t₀.₉₇₅(m − 2)·se(s): the slope's 95% interval is s ± this.
    pub half_width: f64,
    /// How many points were fitted (m).
    pub points: usize,
    /// Their mean x̄.
    pub x_mean: f64,
    /// Σ(x − x̄)².
    pub sxx: f64,
    /// The residual variance SSE / (m − 2).
    pub residual_variance: f64,
}

impl LineFit {
    /// The fitted mean at `x`, a + s·x, and its 95% interval half-width
    /// t₀.₉₇₅(m − 2)·√(σ̂²·(1/m + (x − x̄)²/Sxx)): the interval of the line, not of a new point.
    /// Beyond the fitted x it is an extrapolation that assumes the line holds there.
    pub fn predict(&self, x: f64) -> (f64, f64) {
        let m = self.points as f64;
        let var = self.residual_variance * (1.0 / m + (x - self.x_mean).powi(2) / self.sxx);
        (
            self.intercept + self.slope * x,
            t975(self.points - 2) * var.sqrt(),
        )
    }

    /// Where the line crosses y: x = (y − a)/s (`None` for a slope of 0).
    pub fn crossing(&self, y: f64) -> Option<f64> {
        (self.slope != 0.0).then(|| (y - self.intercept) / self.slope)
    }
}

/// The least-squares line through the finite points (`None` for fewer than 3, or all at one x).
pub fn fit_line(points: &[(f64, f64)]) -> Option<LineFit> {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    let m = pts.len();
    if m < 3 {
        return None;
    }
    let xm = pts.iter().map(|p| p.0).sum::<f64>() / m as f64;
    let ym = pts.iter().map(|p| p.1).sum::<f64>() / m as f64;
    let sxx: f64 = pts.iter().map(|p| (p.0 - xm).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = pts.iter().map(|p| (p.0 - xm) * (p.1 - ym)).sum::<f64>() / sxx;
    let intercept = ym - slope * xm;
    let sse: f64 = pts
        .iter()
        .map(|p| (p.1 - intercept - slope * p.0).powi(2))
        .sum();
    let residual_variance = sse / (m - 2) as f64;
    Some(LineFit {
        intercept,
        slope,
        half_width: t975(m - 2) * (residual_variance / sxx).sqrt(),
        points: m,
        x_mean: xm,
        sxx,
        residual_variance,
    })
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms; relative error ≲ 1e-15).
pub fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1 − x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + G + 0.5;
    let sum = C[1..]
        .iter()
        .enumerate()
        .fold(C[0], |s, (i, c)| s + c / (x + i as f64 + 1.0));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

/// The regularized incomplete beta function I_x(a, b) = B(x; a, b)/B(a, b) for a, b > 0 and
/// x ∈ [0, 1], from its continued fraction (modified Lentz), used directly for
/// x < (a + 1)/(a + b + 2) and through I_x(a, b) = 1 − I_{1−x}(b, a) otherwise, where it
/// converges fast. NaN outside the domain.
pub fn incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if !(a > 0.0 && b > 0.0 && (0.0..=1.0).contains(&x)) {
        return f64::NAN;
    }
    if x == 0.0 || x == 1.0 {
        return x;
    }
    // x^a (1 − x)^b / (a B(a, b)), the prefactor of the fraction.
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    if x < (a + 1.0) / (a + b + 2.0) {
        ln_front.exp() * beta_fraction(x, a, b) / a
    } else {
        1.0 - ln_front.exp() * beta_fraction(1.0 - x, b, a) / b
    }
}

/// The continued fraction 1/(1 + d₁/(1 + d₂/(1 + …))) of I_x(a, b), with
/// d_{2m+1} = −(a + m)(a + b + m)x / ((a + 2m)(a + 2m + 1)) and
/// d_{2m} = m(b − m)x / ((a + 2m − 1)(a + 2m)), evaluated by the modified Lentz method.
fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let clamp = |v: f64| if v.abs() < TINY { TINY } else { v };
    let mut c = 1.0;
    let mut d = 1.0 / clamp(1.0 - (a + b) * x / (a + 1.0));
    let mut h = d;
    for m in 1..=300 {
        let m = m as f64;
        let even = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 / clamp(1.0 + even * d);
        c = clamp(1.0 + even / c);
        h *= d * c;
        let odd = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 / clamp(1.0 + odd * d);
        c = clamp(1.0 + odd / c);
        let delta = d * c;
        h *= delta;
        if (delta - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

/// P(T ≤ t) for Student's t with `df` > 0 degrees of freedom (not necessarily an integer):
/// with x = ν/(ν + t²), P(T ≤ t) = 1 − ½·I_x(ν/2, ½) for t ≥ 0 and ½·I_x(ν/2, ½) for t < 0.
/// ±∞ give 1 and 0; NaN for a NaN t or df ≤ 0.
pub fn student_t_cdf(t: f64, df: f64) -> f64 {
    if t.is_nan() || df.is_nan() || df <= 0.0 {
        return f64::NAN;
    }
    if t.is_infinite() {
        return if t > 0.0 { 1.0 } else { 0.0 };
    }
    let tail = 0.5 * incomplete_beta(df / (df + t * t), 0.5 * df, 0.5);
    if t >= 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// A one-sided t-test's statistic, degrees of freedom and p-value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TTest {
    /// t.
    pub t: f64,
    /// Degrees of freedom ν.
    pub df: f64,
    /// P(T ≥ t) under the null hypothesis.
    pub p: f64,
}

impl TTest {
    /// The test of statistic t = `diff`/`se` on ν = `df`: an `se` of 0 gives t = ±∞ (p 0 or 1)
    /// for a nonzero `diff` and t = 0 (p ½) for none.
    fn of(diff: f64, se: f64, df: f64) -> Self {
        let t = if se > 0.0 {
            diff / se
        } else if diff == 0.0 {
            0.0
        } else {
            diff.signum() * f64::INFINITY
        };
        Self {
            t,
            df,
            p: 1.0 - student_t_cdf(t, df),
        }
    }
}

/// Welch's one-sided test that the mean of `a` is below the mean of `b`, each sample's variance
/// increased by `extra_variance` (a measurement's own variance, e.g. the Δ²/12 of a value
/// rounded up to a multiple of Δ):
/// t = (mean_b − mean_a)/√(v_a/n_a + v_b/n_b), ν by Welch–Satterthwaite,
/// ν = (v_a/n_a + v_b/n_b)² / ((v_a/n_a)²/(n_a − 1) + (v_b/n_b)²/(n_b − 1)).
/// `None` when either sample has fewer than 2 values.
pub fn welch_less(a: &[f64], b: &[f64], extra_variance: f64) -> Option<TTest> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let moments = |x: &[f64]| {
        let (m, s) = mean_std(x);
        (
            m,
            (s * s + extra_variance) / x.len() as f64,
            x.len() as f64 - 1.0,
        )
    };
    let ((ma, va, da), (mb, vb, db)) = (moments(a), moments(b));
    let se2 = va + vb;
    let df = if se2 > 0.0 {
        se2 * se2 / (va * va / da + vb * vb / db)
    } else {
        da + db
    };
    Some(TTest::of(mb - ma, se2.sqrt(), df))
}

/// The one-sample one-sided test that the mean of `x` is below `threshold`:
/// t = (threshold − mean)·√n / s on n − 1 degrees of freedom. `None` for fewer than 2 values.
pub fn mean_below(x: &[f64], threshold: f64) -> Option<TTest> {
    if x.len() < 2 {
        return None;
    }
    let (m, s) = mean_std(x);
    let n = x.len() as f64;
    Some(TTest::of(threshold - m, s / n.sqrt(), n - 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// y = x + (0.1, −0.1, −0.1, 0.1) at x = 0..3: slope 1, intercept 0, σ̂² = 0.04/2, x̄ = 1.5,
    /// Sxx = 5; the line's interval at x is 4.303·√(0.02·(1/4 + (x − 1.5)²/5)).
    #[test]
    fn line_predictions_and_crossings() {
        let fit = fit_line(&[(0.0, 0.1), (1.0, 0.9), (2.0, 1.9), (3.0, 3.1)]).unwrap();
        assert!((fit.slope - 1.0).abs() < 1e-12 && fit.intercept.abs() < 1e-12);
        let (y, h) = fit.predict(1.5);
        assert!((y - 1.5).abs() < 1e-12);
        assert!((h - 4.303 * (0.02f64 / 4.0).sqrt()).abs() < 1e-12);
        let (y, h) = fit.predict(5.5);
        assert!((y - 5.5).abs() < 1e-12);
        assert!((h - 4.303 * (0.02f64 * 3.45).sqrt()).abs() < 1e-12);
        assert!((fit.crossing(2.0).unwrap() - 2.0).abs() < 1e-12);
    }

    #[test]
    fn mean_and_sample_std() {
        let (m, s) = mean_std(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        assert!((s - (5.0f64 / 3.0).sqrt()).abs() < 1e-15);
        assert_eq!(mean_std(&[7.0]), (7.0, 0.0));
        assert!(mean_std(&[]).0.is_nan());
        assert_eq!(mean(&[1.0, 2.0]), 1.5);
        assert!(mean(&[]).is_nan());
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[1.0, 3.0]), 2.0);
        assert_eq!(median(&[1.0, f64::INFINITY]), f64::INFINITY);
        assert_eq!(median(&[f64::NAN, 1.0, 5.0, 3.0]), 3.0);
        assert!(median(&[f64::NAN]).is_nan());
        assert_eq!(upper_median(&[1.0, 3.0]), Some(3.0));
        assert_eq!(upper_median(&[4.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(upper_median(&[]), None);
        assert_eq!(min_max(&[2.0, -1.0, 5.0]), (-1.0, 5.0));
    }

    #[test]
    fn line_fit_recovers_a_slope_and_covers_it() {
        let pts: Vec<(f64, f64)> = (0..20)
            .map(|i| {
                (
                    i as f64,
                    2.0 - 0.5 * i as f64 + 0.01 * ((i * 7 % 5) as f64 - 2.0),
                )
            })
            .collect();
        let l = fit_line(&pts).unwrap();
        assert!((l.slope + 0.5).abs() < 0.01 && l.half_width < 0.01);
        assert!((l.slope - l.half_width..=l.slope + l.half_width).contains(&-0.5));
        assert_eq!(fit_line(&pts[..2]), None);
    }

    #[test]
    fn per_step_summarizes_each_step_over_seeds() {
        let curve = per_step([(10, 1.0), (0, 4.0), (10, 3.0), (0, 2.0)], mean);
        assert_eq!(curve, [(0.0, 3.0), (10.0, 2.0)]);
    }

    #[test]
    fn ln_gamma_matches_factorials_and_half_integers() {
        for (x, f) in [(1.0, 1.0), (2.0, 1.0), (5.0, 24.0), (11.0, 3_628_800.0f64)] {
            assert!((ln_gamma(x) - f.ln()).abs() < 1e-12, "{x}");
        }
        let sqrt_pi = std::f64::consts::PI.sqrt();
        assert!((ln_gamma(0.5) - sqrt_pi.ln()).abs() < 1e-12);
        assert!((ln_gamma(1.5) - (0.5 * sqrt_pi).ln()).abs() < 1e-12);
    }

    #[test]
    fn incomplete_beta_has_its_closed_forms() {
        // I_x(1, 1) = x, I_x(a, 1) = x^a, I_x(1, b) = 1 − (1 − x)^b.
        for x in [0.0, 0.1, 0.5, 0.9, 1.0] {
            assert!((incomplete_beta(x, 1.0, 1.0) - x).abs() < 1e-13);
            assert!((incomplete_beta(x, 3.0, 1.0) - x.powi(3)).abs() < 1e-13);
            assert!((incomplete_beta(x, 1.0, 2.5) - (1.0 - (1.0 - x).powf(2.5))).abs() < 1e-13);
        }
        // Symmetry I_x(a, b) = 1 − I_{1−x}(b, a).
        let (a, b) = (2.3, 7.1);
        let s = incomplete_beta(0.3, a, b) + incomplete_beta(0.7, b, a);
        assert!((s - 1.0).abs() < 1e-13);
        assert!(incomplete_beta(1.5, 1.0, 1.0).is_nan());
        assert!(incomplete_beta(0.5, 0.0, 1.0).is_nan());
    }

    #[test]
    fn student_t_cdf_matches_closed_forms_and_tables() {
        // ν = 1 is Cauchy: ½ + atan(t)/π; ν = 2: ½ + t/(2√(2 + t²)).
        for t in [-3.0, -0.5, 0.0, 0.7, 2.0, 10.0f64] {
            let cauchy = 0.5 + t.atan() / std::f64::consts::PI;
            assert!((student_t_cdf(t, 1.0) - cauchy).abs() < 1e-13, "{t}");
            let two = 0.5 + t / (2.0 * (2.0 + t * t).sqrt());
            assert!((student_t_cdf(t, 2.0) - two).abs() < 1e-13, "{t}");
        }
        // The tabulated two-sided 97.5% quantiles: P(T ≤ t₀.₉₇₅) = 0.975 (3 decimals in the table).
        for df in [3, 5, 10, 30] {
            let p = student_t_cdf(t975(df), df as f64);
            assert!((p - 0.975).abs() < 2e-5, "df {df}: {p}");
        }
        assert_eq!(student_t_cdf(f64::INFINITY, 3.0), 1.0);
        assert_eq!(student_t_cdf(f64::NEG_INFINITY, 3.0), 0.0);
        assert!(student_t_cdf(1.0, 0.0).is_nan());
    }

    #[test]
    fn welch_and_one_sample_tests() {
        // Hand-computed: means 10 and 13, variances 1 and 4, n = 3 each: se² = 5/3, t = 3/√(5/3)
        // = 2.3238, ν = (5/3)² / ((1/3)²/2 + (4/3)²/2) = 2.9412, one-sided p = 0.05224 (by numerical integration of the density).
        let a = [9.0, 10.0, 11.0];
        let b = [11.0, 13.0, 15.0];
        let w = welch_less(&a, &b, 0.0).unwrap();
        assert!((w.t - 3.0 / (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert!((w.df - 50.0 / 17.0).abs() < 1e-12);
        assert!((w.p - 0.05224).abs() < 1e-4, "{}", w.p);
        // The reverse direction is the complement.
        let r = welch_less(&b, &a, 0.0).unwrap();
        assert!((r.p + w.p - 1.0).abs() < 1e-12);
        // Identical constant samples: no difference (p ½); different constants: p 0.
        assert_eq!(welch_less(&[4.0, 4.0], &[4.0, 4.0], 0.0).unwrap().p, 0.5);
        assert_eq!(welch_less(&[4.0, 4.0], &[6.0, 6.0], 0.0).unwrap().p, 0.0);
        // A measurement variance keeps constant samples finite.
        let q = welch_less(&[4.0, 4.0], &[6.0, 6.0], 1.0).unwrap();
        assert!(q.t.is_finite() && q.p > 0.0 && q.p < 0.5);
        assert_eq!(welch_less(&[1.0], &[2.0, 3.0], 0.0), None);
        // One sample: mean 3.2 of [3.1, 3.2, 3.3], s = 0.1, against 3.4: t = 0.2·√3/0.1 = 3.4641,
        // p = 0.03709 (numerical integration).
        let m = mean_below(&[3.1, 3.2, 3.3], 3.4).unwrap();
        assert!((m.t - 2.0 * 3.0f64.sqrt()).abs() < 1e-9 && m.df == 2.0);
        assert!((m.p - 0.03709).abs() < 1e-4, "{}", m.p);
        assert_eq!(mean_below(&[3.0], 3.4), None);
    }
}
