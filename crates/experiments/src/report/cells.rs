//! Table cells: a mean ± std, a number that may be missing, and what stands for a missing one.

/// What a cell shows where there is no value.
pub const MISSING: &str = "—";

/// `m ± s`, both with `digits` decimals.
///
/// ```
/// assert_eq!(kappa_experiments::report::cells::mean_std((1.0, 0.25), 2), "1.00 ± 0.25");
/// ```
pub fn mean_std((m, s): (f64, f64), digits: usize) -> String {
    format!("{m:.digits$} ± {s:.digits$}")
}

/// [`mean_std`], or `missing` where there was nothing to average (the mean is NaN).
pub fn mean_std_or(ms: (f64, f64), digits: usize, missing: &str) -> String {
    if ms.0.is_nan() {
        missing.into()
    } else {
        mean_std(ms, digits)
    }
}

/// The mean ± sample std of one value per seed: [`MISSING`] for none (a NaN mean), the mean
/// alone for one seed, `m ± s` for more.
pub fn over_seeds(values: &[f64], digits: usize) -> String {
    let (m, s) = crate::stats::mean_std(values);
    if m.is_nan() {
        MISSING.into()
    } else if values.len() > 1 {
        mean_std((m, s), digits)
    } else {
        format!("{m:.digits$}")
    }
}

/// `value` written by `write`, or [`MISSING`].
pub fn or_missing(value: Option<f64>, write: impl FnOnce(f64) -> String) -> String {
    value.map_or_else(|| MISSING.into(), write)
}

/// `x` with `digits` decimals.
pub fn fixed(x: f64, digits: usize) -> String {
    format!("{x:.digits$}")
}

/// `x` in scientific notation with `digits` decimals (`1.50e-3`).
pub fn sci(x: f64, digits: usize) -> String {
    format!("{x:.digits$e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_written_as_the_reports_always_wrote_them() {
        assert_eq!(mean_std((2.5, 1.2909944487358056), 4), "2.5000 ± 1.2910");
        assert_eq!(mean_std_or((f64::NAN, f64::NAN), 2, "n/a"), "n/a");
        assert_eq!(mean_std_or((0.5, 0.0), 2, "n/a"), "0.50 ± 0.00");
        assert_eq!(over_seeds(&[], 4), "—");
        assert_eq!(over_seeds(&[3.25], 4), "3.2500");
        assert_eq!(over_seeds(&[1.0, 2.0], 4), "1.5000 ± 0.7071");
        assert_eq!(or_missing(None, |x| fixed(x, 2)), "—");
        assert_eq!(or_missing(Some(0.126), |x| fixed(x, 2)), "0.13");
        assert_eq!(sci(0.00123, 2), "1.23e-3");
        assert_eq!(sci(f64::INFINITY, 3), "inf");
    }
}
