//! Small statistics for reports: means, sample standard deviations, medians and per-step
//! summaries over seeds.

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
    fn per_step_summarizes_each_step_over_seeds() {
        let curve = per_step([(10, 1.0), (0, 4.0), (10, 3.0), (0, 2.0)], mean);
        assert_eq!(curve, [(0.0, 3.0), (10.0, 2.0)]);
    }
}
