//! Condition numbers and rank: `condition_number`, `condition_number_with`,
//! `pseudo_condition_number`, `numerical_rank`, `conditioning`,
//! `conditioning_from_singular_values`, `RankTolerance::threshold`.

use super::support::*;
use super::svd::rank_interval;
use kappa_linalg::*;
use kappa_testkit::hostile::{Fuzz, Layout};
use ndarray::Array1;

/// The tolerances tried: valid ones (each rule) and invalid ones (error on `tol`).
fn tolerances() -> Vec<(RankTolerance, bool)> {
    vec![
        (RankTolerance::Numpy, true),
        (RankTolerance::Relative(1e-3), true),
        (RankTolerance::Absolute(0.0), true),
        (RankTolerance::Absolute(1e-3), true),
        (RankTolerance::Relative(-1.0), false),
        (RankTolerance::Absolute(f64::NAN), false),
        (RankTolerance::Relative(f64::INFINITY), false),
    ]
}

/// τ in A_s's units (see the cond module docs: an absolute threshold scales with A).
fn tau_scaled<A: Elem>(tol: RankTolerance, re: &Reference) -> f64 {
    let (m, n) = re.dim();
    match tol {
        RankTolerance::Numpy => re.s1() * m.max(n) as f64 * A::EPS,
        RankTolerance::Relative(r) => r * re.s1(),
        RankTolerance::Absolute(t) => scale2(t, -re.e),
    }
}

/// Whether κ̂ (or κ⁺ with the rank among `ranks`) is what the rule gives for some spectrum
/// within δ of the reference: +∞ when the rank can be below k (or 0 for κ⁺); otherwise
/// σ₁/σ_r ∈ [(σ₁ − δ)/(σ_r + δ), (σ₁ + δ)/(σ_r − δ)], widened by the final division's
/// rounding (2ε_A).
fn ratio_ok<A: Elem>(
    got: f64,
    re: &Reference,
    ranks: (usize, usize),
    pseudo: bool,
    delta: f64,
) -> bool {
    let k = re.s.len();
    let (lo, hi) = ranks;
    (lo..=hi).any(|r| {
        let bottom = if pseudo { r } else { k };
        if (pseudo && r == 0) || (!pseudo && r < k) {
            return got == f64::INFINITY;
        }
        let (s1, sr) = (re.s1(), re.s[bottom - 1]);
        let low = (s1 - delta) / (sr + delta) * (1.0 - 2.0 * A::EPS);
        let high = if sr > delta {
            (s1 + delta) / (sr - delta) * (1.0 + 2.0 * A::EPS)
        } else {
            f64::INFINITY
        };
        got >= low.min(1.0) && got <= high
    })
}

fn check_cond<A: Elem>(
    which: &str,
    a: Laid<A>,
    input: &Input,
    tol: RankTolerance,
    valid: bool,
) -> Check {
    let v = a.view();
    let r = match which {
        "condition_number" => condition_number(v).map(|x| x.to_f64_lossy()),
        "condition_number_with" => condition_number_with(v, tol).map(|x| x.to_f64_lossy()),
        "pseudo_condition_number" => pseudo_condition_number(v, tol).map(|x| x.to_f64_lossy()),
        _ => numerical_rank(v, tol).map(|x| x as f64),
    };
    if let Some(c) = input_error(&r, input, "a") {
        return c;
    }
    if !valid {
        return expect_err(&r, "InvalidArgument", "tol");
    }
    let Input::Finite(re) = input else {
        unreachable!()
    };
    let got = ok(r, which)?;
    let delta = re.sigma_tol::<A>();
    let ranks = rank_interval(&re.s, tau_scaled::<A>(tol, re), delta);
    let fine = match which {
        "numerical_rank" => (ranks.0..=ranks.1).contains(&(got as usize)),
        "pseudo_condition_number" => ratio_ok::<A>(got, re, ranks, true, delta),
        _ => ratio_ok::<A>(got, re, ranks, false, delta),
    };
    ensure(fine, || {
        format!(
            "{which} = {got:e}; reference σ = {:?} (scaled), ranks {ranks:?}",
            re.s
        )
    })
}

fn check_conditioning<A: Elem>(
    a: Laid<A>,
    input: &Input,
    tol: RankTolerance,
    valid: bool,
) -> Check {
    let r = conditioning(a.view(), tol);
    if let Some(c) = input_error(&r, input, "a") {
        return c;
    }
    if !valid {
        return expect_err(&r, "InvalidArgument", "tol");
    }
    let Input::Finite(re) = input else {
        unreachable!()
    };
    let delta = re.sigma_tol::<A>();
    match (
        &r,
        re.overflows::<A>(delta / re.s1().max(f64::MIN_POSITIVE)),
    ) {
        (Err(_), Some(true) | None) => return expect_err(&r, "Overflow", "a"),
        (Ok(_), Some(true)) => return Err("Ok, but σ₁ overflows".into()),
        _ => {}
    }
    let c = ok(r, "conditioning")?;
    let ranks = rank_interval(&re.s, tau_scaled::<A>(tol, re), delta);
    let smax = re.to_scaled(c.sigma_max.to_f64_lossy());
    let smin = re.to_scaled(c.sigma_min.to_f64_lossy());
    let k = re.s.len();
    ensure((ranks.0..=ranks.1).contains(&c.rank), || {
        format!("rank {} ∉ {ranks:?}", c.rank)
    })?;
    ensure((smax - re.s1()).abs() <= delta, || {
        format!("σ_max {smax:e} vs {:e}", re.s1())
    })?;
    ensure((smin - re.s[k - 1]).abs() <= delta, || {
        format!("σ_min {smin:e} vs {:e}", re.s[k - 1])
    })?;
    ensure(
        ratio_ok::<A>(c.kappa.to_f64_lossy(), re, ranks, false, delta),
        || format!("κ = {:e}", c.kappa),
    )
}

/// The four scale-free functions and `conditioning`, every input, layout and tolerance.
pub fn run<A: Elem>(fuzz: &mut Fuzz) {
    for (m, n) in SHAPES {
        for (name, x) in inputs::<A>(m, n) {
            let input = analyse(&x);
            for layout in Layout::ALL {
                let label = |f: &str, t: &RankTolerance| {
                    format!("{f}<{}>({name}, {layout:?}, {t:?}, {m}×{n})", A::NAME)
                };
                let (l, i) = (Laid::new(layout, &x), input.clone());
                fuzz.check(
                    label("condition_number", &RankTolerance::Numpy),
                    move || check_cond("condition_number", l, &i, RankTolerance::Numpy, true),
                );
                for (tol, valid) in tolerances() {
                    if !valid && layout != Layout::Standard {
                        continue;
                    }
                    for f in [
                        "condition_number_with",
                        "pseudo_condition_number",
                        "numerical_rank",
                    ] {
                        let (l, i) = (Laid::new(layout, &x), input.clone());
                        fuzz.check(label(f, &tol), move || check_cond(f, l, &i, tol, valid));
                    }
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(label("conditioning", &tol), move || {
                        check_conditioning(l, &i, tol, valid)
                    });
                }
            }
        }
    }
    from_singular_values::<A>(fuzz);
    thresholds::<A>(fuzz);
}

/// The rule on given spectra, replicated from the module docs.
fn from_singular_values<A: Elem>(fuzz: &mut Fuzz) {
    let (max, sub) = (A::from_f64_lossy(A::MAX), A::from_f64_lossy(A::MIN_SUB));
    let f = A::from_f64_lossy;
    let cases: Vec<(&str, Vec<A>, usize, usize, Want)> = vec![
        ("well conditioned", vec![f(2.0), f(1.0)], 2, 3, None),
        ("unsorted", vec![f(0.5), f(2.0)], 2, 2, None),
        ("rank deficient", vec![f(1.0), A::zero()], 2, 2, None),
        ("zero", vec![A::zero(), A::zero()], 2, 2, None),
        ("near MAX", vec![max, f(1.0)], 2, 2, None),
        ("subnormal", vec![sub, sub], 2, 2, None),
        ("huge rows", vec![f(1.0), f(0.5)], usize::MAX, 2, None),
        (
            "NaN",
            vec![A::nan(), f(1.0)],
            2,
            2,
            Some(("NonFinite", "s")),
        ),
        (
            "inf",
            vec![A::infinity(), f(1.0)],
            2,
            2,
            Some(("NonFinite", "s")),
        ),
        (
            "negative",
            vec![f(1.0), f(-1.0)],
            2,
            2,
            Some(("InvalidArgument", "s")),
        ),
        ("empty", vec![], 0, 2, Some(("Empty", "s"))),
        (
            "too many",
            vec![f(3.0), f(2.0), f(1.0)],
            2,
            2,
            Some(("ShapeMismatch", "s")),
        ),
        ("rows 0", vec![f(1.0)], 0, 1, Some(("ShapeMismatch", "s"))),
    ];
    for (what, s, rows, cols, want) in cases {
        for (tol, valid) in tolerances() {
            let s = Array1::from(s.clone());
            fuzz.check(
                format!(
                    "conditioning_from_singular_values<{}>({what}, {tol:?})",
                    A::NAME
                ),
                move || {
                    let r = conditioning_from_singular_values(s.view(), rows, cols, tol);
                    match want {
                        Some((v, arg)) => expect_err(&r, v, arg),
                        None if !valid => expect_err(&r, "InvalidArgument", "tol"),
                        None => rule_matches(&ok(r, what)?, &s, rows, cols, tol),
                    }
                },
            );
        }
    }
}

fn rule_matches<A: Elem>(
    c: &Conditioning<A>,
    s: &Array1<A>,
    rows: usize,
    cols: usize,
    tol: RankTolerance,
) -> Check {
    let mut v = s.to_vec();
    v.sort_by(|a, b| b.partial_cmp(a).unwrap());
    let s1 = v[0].to_f64_lossy();
    let tau = A::from_f64_lossy(match tol {
        RankTolerance::Numpy => s1 * rows.max(cols) as f64 * A::EPS,
        RankTolerance::Relative(r) => r * s1,
        RankTolerance::Absolute(t) => t,
    });
    let rank = v.iter().filter(|&&x| x > tau).count();
    let k = v.len();
    let kappa = if rank == k {
        v[0] / v[k - 1]
    } else {
        A::infinity()
    };
    let pseudo = if rank == 0 {
        A::infinity()
    } else {
        v[0] / v[rank - 1]
    };
    let same = |a: A, b: A| a == b || (a.is_nan() && b.is_nan());
    ensure(
        c.rank == rank
            && same(c.kappa, kappa)
            && same(c.pseudo_kappa, pseudo)
            && c.threshold == tau,
        || format!("{c:?}, expected rank {rank}, κ {kappa:?}, κ⁺ {pseudo:?}, τ {tau:?}"),
    )
}

/// `RankTolerance::threshold`: `tol` checked first, then `sigma_max`; otherwise the formula.
fn thresholds<A: Elem>(fuzz: &mut Fuzz) {
    for (tol, valid) in tolerances() {
        for sigma in [1.0, 0.0, f64::MAX, 5e-324, -1.0, f64::NAN, f64::INFINITY] {
            for (rows, cols) in [(3, 2), (usize::MAX, 1)] {
                fuzz.check(
                    format!(
                        "RankTolerance::threshold<{}>({tol:?}, {sigma}, {rows}, {cols})",
                        A::NAME
                    ),
                    move || {
                        let r = tol.threshold::<A>(sigma, rows, cols);
                        if !valid {
                            return expect_err(&r, "InvalidArgument", "tol");
                        }
                        if !(sigma.is_finite() && sigma >= 0.0) {
                            return expect_err(&r, "InvalidArgument", "sigma_max");
                        }
                        let want = match tol {
                            RankTolerance::Numpy => sigma * rows.max(cols) as f64 * A::EPS,
                            RankTolerance::Relative(x) => x * sigma,
                            RankTolerance::Absolute(t) => t,
                        };
                        let got = ok(r, "threshold")?;
                        ensure(got == want, || format!("{got:e} ≠ {want:e}"))
                    },
                );
            }
        }
    }
}
