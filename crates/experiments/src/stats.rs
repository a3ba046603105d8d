//! Small statistics for reports: means, sample standard deviations, medians, per-step summaries
//! over seeds, and least-squares lines with a 95% interval on the slope.

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
    let se = (sse / (m - 2) as f64 / sxx).sqrt();
    Some(LineFit {
        intercept,
        slope,
        half_width: t975(m - 2) * se,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
