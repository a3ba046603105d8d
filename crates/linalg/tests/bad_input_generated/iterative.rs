//! Iterative estimates: `sigma_max_power`, `sigma_min_inverse`, `condition_number_estimate`,
//! with valid and out-of-range options (tolerances, iteration counts 0 and huge).

use super::support::*;
use kappa_linalg::*;
use kappa_testkit::hostile::{Fuzz, Layout};

/// Options tried, and the argument an invalid one must be reported on.
fn options() -> Vec<(IterativeOptions, Option<&'static str>)> {
    let d = IterativeOptions::default();
    let with = |tol, max_iter| IterativeOptions { tol, max_iter, ..d };
    vec![
        (d, None),
        (with(1e-12, 300), None),
        (with(0.5, 1), None),
        (
            IterativeOptions {
                tol: 1e-2,
                stop: StopRule::ErrorEstimate,
                seed: 7,
                ..d
            },
            None,
        ),
        (with(0.0, 300), Some("opts.tol")),
        (with(1.0, 300), Some("opts.tol")),
        (with(-1e-3, 300), Some("opts.tol")),
        (with(f64::NAN, 300), Some("opts.tol")),
        (with(f64::INFINITY, 300), Some("opts.tol")),
        (with(1e-3, 0), Some("opts.max_iter")),
        (with(1e-3, MAX_ITERATIONS + 1), Some("opts.max_iter")),
        (with(1e-3, usize::MAX), Some("opts.max_iter")),
    ]
}

/// The rounding allowance on an iterative σ in A_s's units: the SVD bound of the reference
/// (which also exceeds the (n + 2)·ε_A relative rounding of a Rayleigh quotient ‖Av‖²).
fn delta<A: Elem>(re: &Reference) -> f64 {
    re.sigma_tol::<A>()
}

/// An estimate v of σ₁ (in A_s's units): never above σ₁ (the Rayleigh quotient is at most
/// σ₁²), and on convergence within tol·v of a singular value (the residual test
/// ‖AᵀAv − λv‖ ≤ tol·λ puts an eigenvalue σ_i² of AᵀA within tol·λ of λ = v², so
/// |σ_i − v| ≤ tol·v).
fn near_a_sigma(v: f64, re: &Reference, tol: f64, d: f64) -> bool {
    re.s.iter().any(|&s| (s - v).abs() <= tol * v + d)
}

/// What the shared part of every estimate's check decided.
enum Triage<'a> {
    /// The answer is judged: a non-finite input's error, an invalid option's error, or an
    /// `Overflow` (right only when σ₁ itself is at least near `A::MAX`).
    Done(Check),
    /// A finite input with valid options and a value: judge it against this reference, with
    /// this rounding slack.
    Value(&'a Reference, f64),
}

fn triage<'a, A: Elem, T>(
    r: &kappa_linalg::Result<T>,
    input: &'a Input,
    bad: Option<&str>,
) -> Triage<'a> {
    if let Some(c) = input_error(r, input, "a") {
        return Triage::Done(c);
    }
    if let Some(arg) = bad {
        return Triage::Done(expect_err(r, "InvalidArgument", arg));
    }
    let Input::Finite(re) = input else {
        unreachable!()
    };
    if let Err(LinalgError::Overflow { arg: "a", .. }) = r {
        return Triage::Done(ensure(re.overflows::<A>(0.5) != Some(false), || {
            "Overflow for a σ₁ far below MAX".into()
        }));
    }
    Triage::Value(re, delta::<A>(re))
}

fn check_power<A: Elem>(
    a: Laid<A>,
    input: &Input,
    opts: IterativeOptions,
    bad: Option<&str>,
) -> Check {
    let r = sigma_max_power(a.view(), opts);
    let (re, d) = match triage::<A, _>(&r, input, bad) {
        Triage::Done(c) => return c,
        Triage::Value(re, d) => (re, d),
    };
    let e = ok(r, "sigma_max_power")?;
    let v = re.to_scaled(e.value.to_f64_lossy());
    ensure(v <= re.s1() + d && v >= 0.0, || {
        format!("σ̂ = {v:e} above σ₁ = {:e}", re.s1())
    })?;
    if e.converged {
        ensure(near_a_sigma(v, re, opts.tol, d), || {
            format!("converged σ̂ = {v:e} far from every σ {:?}", re.s)
        })?;
    }
    Ok(())
}

fn check_inverse<A: Elem>(
    a: Laid<A>,
    input: &Input,
    opts: IterativeOptions,
    bad: Option<&str>,
) -> Check {
    let r = sigma_min_inverse(a.view(), opts);
    let (re, d) = match triage::<A, _>(&r, input, bad) {
        Triage::Done(c) => return c,
        Triage::Value(re, d) => (re, d),
    };
    let e = ok(r, "sigma_min_inverse")?;
    let v = re.to_scaled(e.value.to_f64_lossy());
    let k = re.s.len();
    if e.converged && v == 0.0 {
        // Documented: 0 means σ_k is zero to working precision (a zero pivot of R, or an
        // overflowing solve: σ_k below ε·σ₁ up to the QR's backward error).
        return ensure(re.s[k - 1] <= d, || {
            format!("0 returned, but σ_k = {:e}", re.s[k - 1])
        });
    }
    ensure(v <= re.s1() + d, || format!("σ̂ = {v:e} above σ₁"))?;
    if e.converged {
        ensure(near_a_sigma(v, re, opts.tol, d), || {
            format!("converged σ̂ = {v:e} far from every σ {:?}", re.s)
        })?;
    }
    Ok(())
}

fn check_lanczos<A: Elem>(
    a: Laid<A>,
    input: &Input,
    opts: IterativeOptions,
    bad: Option<&str>,
) -> Check {
    let r = condition_number_estimate(a.view(), opts);
    let (re, d) = match triage::<A, _>(&r, input, bad) {
        Triage::Done(c) => return c,
        Triage::Value(re, d) => (re, d),
    };
    let e = ok(r, "condition_number_estimate")?;
    let (smax, smin) = (
        re.to_scaled(e.sigma_max.to_f64_lossy()),
        re.to_scaled(e.sigma_min.to_f64_lossy()),
    );
    let k = re.s.len();
    // Ritz values interlace: σ_k ≤ θ_min ≤ θ_max ≤ σ₁ (up to rounding).
    ensure(
        smax <= re.s1() + d && smin >= re.s[k - 1] - d && smin <= smax + d,
        || {
            format!(
                "Ritz values [{smin:e}, {smax:e}] outside [{:e}, {:e}]",
                re.s[k - 1],
                re.s1()
            )
        },
    )?;
    let kappa = e.kappa.to_f64_lossy();
    ensure(kappa >= 1.0 - 2.0 * A::EPS, || format!("κ̂ = {kappa:e} < 1"))
}

/// The three estimates on every input, layout and option set (invalid options on the standard
/// layout only: they are checked before any work).
pub fn run<A: Elem>(fuzz: &mut Fuzz) {
    for (m, n) in SHAPES {
        for (name, x) in inputs::<A>(m, n) {
            let input = analyse(&x);
            for layout in Layout::ALL {
                for (opts, bad) in options() {
                    if bad.is_some() && layout != Layout::Standard {
                        continue;
                    }
                    let label = |f: &str| {
                        format!(
                            "{f}<{}>({name}, {layout:?}, tol {}, max_iter {}, {m}×{n})",
                            A::NAME,
                            opts.tol,
                            opts.max_iter
                        )
                    };
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(label("sigma_max_power"), move || {
                        check_power(l, &i, opts, bad)
                    });
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(label("sigma_min_inverse"), move || {
                        check_inverse(l, &i, opts, bad)
                    });
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(label("condition_number_estimate"), move || {
                        check_lanczos(l, &i, opts, bad)
                    });
                }
            }
        }
    }
    // An unattainable tolerance with the largest accepted cap: it must stop (at the cap).
    let x: ndarray::Array2<A> = ndarray::Array2::from_shape_fn((3, 2), |(i, j)| {
        A::from_f64_lossy(1.0 + (i * 2 + j) as f64 * 0.37)
    });
    let input = analyse(&x);
    let opts = IterativeOptions {
        tol: 1e-300,
        max_iter: MAX_ITERATIONS,
        ..Default::default()
    };
    let (l, i) = (Laid::new(Layout::Standard, &x), input);
    fuzz.check(
        format!(
            "sigma_max_power<{}>(tol 1e-300, max_iter MAX_ITERATIONS)",
            A::NAME
        ),
        move || check_power(l, &i, opts, None),
    );
}
