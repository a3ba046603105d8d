//! Newton–Schulz: `newton_schulz` (valid, invalid and overflowing schedules), `newton_schulz_muon`,
//! `newton_schulz_cubic` (step counts 0 to huge), `gram_newton_schulz` (periods 0 to none), the
//! schedule constructors, `validate`, `scalar_map` and `PolyStep::eval`.

use super::support::*;
use kappa_linalg::*;
use kappa_testkit::hostile::{Fuzz, Layout};
use ndarray::Array2;

#[path = "../helpers/ns_bound.rs"]
mod ns_bound;
pub use ns_bound::{gram_ns_error_bound, grid_max, ns_error_bound};

/// A bound ρ_N on the spectral norm of the last iterate from ‖X₀‖₂ ≤ `hi`: each step's image
/// of [0, ρ_j + γ_j] (γ_j the step's own rounding, as in [`ns_error_bound`]; rounding moves
/// singular values by at most its norm, Weyl), so it holds for the computed iterates too.
fn ns_range(sched: &NsSchedule, r: usize, s: usize, hi: f64, eps: f64) -> f64 {
    sched
        .steps
        .iter()
        .fold(hi * (1.0 + (r * s + 2) as f64 * eps), |rho, p| {
            let (a, b, c) = (p.a.abs(), p.b.abs(), p.c.abs());
            let gamma = (2 * r + s + 3) as f64
                * eps
                * (r as f64).sqrt()
                * (a * rho + b * rho.powi(3) + c * rho.powi(5));
            let h0 = rho + gamma;
            let d1 = a + 3.0 * b * h0 * h0 + 5.0 * c * h0.powi(4);
            grid_max(0.0, h0, d1, |x| p.eval(x).abs())
        })
}

/// NS of the input (precision `A`, any layout and scale) against NS of the reference A_s (f64,
/// standard layout, unit scale): the same map, so they differ by the rounding bound of both.
fn check_ns<A: Elem>(got: Result<Array2<A>>, re: &Reference, sched: &NsSchedule) -> Check {
    let want = ok(newton_schulz(&re.a_s, sched), "reference NS")?;
    let y = to64(&ok(got, "newton_schulz")?);
    ensure(y.dim() == re.dim(), || format!("shape {:?}", y.dim()))?;
    let diff = (&y - &want).iter().map(|v| v * v).sum::<f64>().sqrt();
    if re.s1() == 0.0 {
        return ensure(diff == 0.0, || "NS(0) ≠ 0".into());
    }
    let (m, n) = re.dim();
    let (r, s) = (m.min(n), m.max(n));
    let fro = re.fro() * sched.normalization;
    let x: Vec<f64> = re.s.iter().map(|v| v / fro).collect();
    let hi = x[0];
    let tol = ns_error_bound(sched, r, s, &x, A::EPS, 0.0)
        + ns_error_bound(sched, r, s, &x, f64::EPSILON, 0.0);
    if tol.is_finite() && tol < 0.25 {
        return ensure(diff <= tol, || {
            format!("‖NS − NS_ref‖_F = {diff:e} > {tol:e}")
        });
    }
    // The bound is vacuous (a strongly amplifying schedule on a nearly singular input): check
    // what still holds, a finite result inside the iteration's range (‖Y‖_F ≤ √r·ρ_N).
    let bound = (r as f64).sqrt() * ns_range(sched, r, s, hi, A::EPS);
    let yf = y.iter().map(|v| v * v).sum::<f64>().sqrt();
    ensure(
        y.iter().all(|v| v.is_finite())
            && yf.partial_cmp(&bound) != Some(std::cmp::Ordering::Greater),
        || format!("‖Y‖_F = {yf:e} > {bound:e}"),
    )
}

/// Gram NS of the input (precision `A`, any layout and scale, period `restart`) against plain NS
/// of the reference A_s (f64): the same map, so within the Gram rounding bound in `A` plus the NS
/// bound in f64. Where that bound is vacuous (∞ or ≥ 0.25) only a finite result of the right
/// shape is claimed (the range argument of [`ns_range`] covers plain NS's iterates, not the Gram
/// recurrence's).
fn check_gram<A: Elem>(
    got: Result<Array2<A>>,
    re: &Reference,
    sched: &NsSchedule,
    restart: usize,
) -> Check {
    let want = ok(newton_schulz(&re.a_s, sched), "reference NS")?;
    let y = to64(&ok(got, "gram_newton_schulz")?);
    ensure(y.dim() == re.dim(), || format!("shape {:?}", y.dim()))?;
    let diff = (&y - &want).iter().map(|v| v * v).sum::<f64>().sqrt();
    if re.s1() == 0.0 {
        return ensure(diff == 0.0, || "GNS(0) ≠ 0".into());
    }
    let (m, n) = re.dim();
    let (r, s) = (m.min(n), m.max(n));
    let fro = re.fro() * sched.normalization;
    let x: Vec<f64> = re.s.iter().map(|v| v / fro).collect();
    let tol = gram_ns_error_bound(sched, restart, r, s, &x, A::EPS, 0.0)
        + ns_error_bound(sched, r, s, &x, f64::EPSILON, 0.0);
    if tol.is_finite() && tol < 0.25 {
        return ensure(diff <= tol, || {
            format!("‖GNS − NS_ref‖_F = {diff:e} > {tol:e}")
        });
    }
    ensure(y.iter().all(|v| v.is_finite()), || {
        "non-finite output".into()
    })
}

/// `gram_newton_schulz` on one input and layout: Muon and Polar Express at periods 1, 2 and
/// none, and `restart` = 0 (an error on `restart` once `x` is valid).
fn gram_calls<A: Elem>(fuzz: &mut Fuzz, name: &str, x: &Array2<A>, input: &Input, layout: Layout) {
    let (m, n) = x.dim();
    for sched in [NsSchedule::muon(), NsSchedule::polar_express(10).unwrap()] {
        for restart in [0, 1, GRAM_NS_RESTART, usize::MAX] {
            let (l, i, sched) = (Laid::new(layout, x), input.clone(), sched.clone());
            fuzz.check(
                format!(
                    "gram_newton_schulz<{}>({name}, {layout:?}, {} steps, restart {restart}, {m}×{n})",
                    A::NAME,
                    sched.steps.len()
                ),
                move || {
                    let r = gram_newton_schulz(&l.view().to_owned(), &sched, restart);
                    if let Some(c) = input_error(&r, &i, "x") {
                        return c;
                    }
                    let Input::Finite(re) = &i else { unreachable!() };
                    if restart == 0 {
                        return expect_err(&r, "InvalidArgument", "restart");
                    }
                    check_gram(r, re, &sched, restart)
                },
            );
        }
    }
}

/// The schedules tried, with the error they must give on a valid nonzero input of type `A`.
fn schedules<A: Elem>() -> Vec<(&'static str, NsSchedule, Want)> {
    let blow_up = NsSchedule {
        steps: vec![PolyStep::new(1e200, 0.0, 0.0); 3],
        normalization: 1.0,
    };
    // A normalization c is usable when c and 1/c are normal numbers of the element type
    // (X/(c·‖X‖_F) has norm 1/c): f32 [2⁻¹²⁶, 2¹²⁶] ≈ [1.2e-38, 8.5e37], f64 [2⁻¹⁰²², 2¹⁰²²].
    let usable = |c: f64| {
        // The smallest normal number is the smallest subnormal over ε (2⁻¹⁴⁹/2⁻²³ in f32).
        let normal = |v: f64| (A::MIN_SUB / A::EPS..=A::MAX).contains(&v);
        normal(c) && normal(1.0 / c)
    };
    let scaled = |what, steps: Vec<PolyStep>, c: f64| {
        let want = (!usable(c)).then_some(("InvalidArgument", "schedule.normalization"));
        (
            what,
            NsSchedule {
                steps,
                normalization: c,
            },
            want,
        )
    };
    vec![
        scaled("cubic, c = 1e300", vec![CUBIC; 3], 1e300),
        scaled("no steps, c = 1e-39", vec![], 1e-39),
        scaled("cubic, c = 1e308", vec![CUBIC; 3], 1e308),
        scaled("cubic, c = 1e30", vec![CUBIC; 3], 1e30),
        scaled("no steps, c = 1e-30", vec![], 1e-30),
        ("muon", NsSchedule::muon(), None),
        ("cubic(8)", NsSchedule::cubic(8).unwrap(), None),
        (
            "polar_express(10)",
            NsSchedule::polar_express(10).unwrap(),
            None,
        ),
        (
            "no steps, c = 2",
            NsSchedule {
                steps: vec![],
                normalization: 2.0,
            },
            None,
        ),
        (
            "NaN normalization",
            NsSchedule {
                steps: vec![],
                normalization: f64::NAN,
            },
            Some(("InvalidArgument", "schedule.normalization")),
        ),
        (
            "zero normalization",
            NsSchedule {
                steps: vec![CUBIC],
                normalization: 0.0,
            },
            Some(("InvalidArgument", "schedule.normalization")),
        ),
        (
            "inf coefficient",
            NsSchedule {
                steps: vec![PolyStep::new(1.0, f64::INFINITY, 0.0)],
                normalization: 1.0,
            },
            Some(("InvalidArgument", "schedule.steps")),
        ),
        ("overflowing", blow_up, Some(("Overflow", "schedule"))),
    ]
}

fn check_schedule<A: Elem>(
    a: Laid<A>,
    input: &Input,
    sched: &NsSchedule,
    want: Option<(&str, &str)>,
) -> Check {
    let x = a.view().to_owned();
    let r = newton_schulz(&x, sched);
    if let Some(c) = input_error(&r, input, "x") {
        return c;
    }
    let Input::Finite(re) = input else {
        unreachable!()
    };
    match want {
        // The overflowing schedule keeps the zero matrix at zero.
        Some(("Overflow", _)) if re.s1() == 0.0 => check_ns(
            r,
            re,
            &NsSchedule {
                steps: vec![],
                normalization: 1.0,
            },
        ),
        Some((v, arg)) => expect_err(&r, v, arg),
        None => check_ns(r, re, sched),
    }
}

/// NS on every input, layout and schedule; `newton_schulz_muon` and `newton_schulz_cubic`.
pub fn run<A: Elem>(fuzz: &mut Fuzz) {
    for (m, n) in SHAPES {
        for (name, x) in inputs::<A>(m, n) {
            let input = analyse(&x);
            for layout in Layout::ALL {
                gram_calls(fuzz, &name, &x, &input, layout);
                for (what, sched, want) in schedules::<A>() {
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(
                        format!(
                            "newton_schulz<{}>({name}, {layout:?}, {what}, {m}×{n})",
                            A::NAME
                        ),
                        move || check_schedule(l, &i, &sched, want),
                    );
                }
                let (l, i) = (Laid::new(layout, &x), input.clone());
                fuzz.check(
                    format!(
                        "newton_schulz_muon<{}>({name}, {layout:?}, {m}×{n})",
                        A::NAME
                    ),
                    move || {
                        let r = newton_schulz_muon(&l.view().to_owned());
                        match input_error(&r, &i, "x") {
                            Some(c) => c,
                            None => check_schedule(l, &i, &NsSchedule::muon(), None),
                        }
                    },
                );
                for steps in [0, 8, MAX_NS_STEPS + 1, usize::MAX] {
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(
                        format!(
                            "newton_schulz_cubic<{}>({name}, {layout:?}, {steps}, {m}×{n})",
                            A::NAME
                        ),
                        move || {
                            let r = newton_schulz_cubic(&l.view().to_owned(), steps);
                            if let Some(c) = input_error(&r, &i, "x") {
                                return c;
                            }
                            let Input::Finite(re) = &i else {
                                unreachable!()
                            };
                            match NsSchedule::cubic(steps) {
                                Ok(sched) => check_ns(r, re, &sched),
                                Err(_) => expect_err(&r, "TooLarge", "steps"),
                            }
                        },
                    );
                }
            }
        }
    }
    schedule_api(fuzz);
}

/// The schedule constructors, `validate`, `scalar_map` and `PolyStep::eval`.
fn schedule_api(fuzz: &mut Fuzz) {
    for steps in [0, 1, 10, MAX_NS_STEPS, MAX_NS_STEPS + 1, usize::MAX] {
        let fine = steps <= MAX_NS_STEPS;
        fuzz.check(format!("NsSchedule constructors({steps})"), move || {
            for (f, r) in [
                ("repeated", NsSchedule::repeated(CUBIC, steps, 1.0)),
                ("cubic", NsSchedule::cubic(steps)),
                ("polar_express", NsSchedule::polar_express(steps)),
            ] {
                match (fine, r) {
                    (true, Ok(s)) => {
                        ensure(s.steps.len() == steps && s.validate().is_ok(), || {
                            format!("{f}: {} steps", s.steps.len())
                        })?
                    }
                    (false, r) => expect_err(&r, "TooLarge", "steps")?,
                    (true, Err(e)) => return Err(format!("{f}: {e}")),
                }
            }
            Ok(())
        });
    }
    fuzz.check("NsSchedule::validate(too many steps)", || {
        let s = NsSchedule {
            steps: vec![CUBIC; MAX_NS_STEPS + 1],
            normalization: 1.0,
        };
        expect_err(&s.validate(), "TooLarge", "schedule.steps")
    });
    for (sigma, fro) in [
        (0.5, 1.0),
        (0.0, 0.0),
        (1.0, 0.0),
        (f64::NAN, 1.0),
        (1.0, f64::INFINITY),
        (f64::MAX, 1e-300),
        (5e-324, 1.0),
    ] {
        fuzz.check(
            format!("NsSchedule::scalar_map({sigma}, {fro})"),
            move || {
                let s = NsSchedule::polar_express(10).unwrap();
                let got = s.scalar_map(sigma, fro);
                let want = if fro == 0.0 {
                    0.0
                } else {
                    s.steps
                        .iter()
                        .fold(sigma / (s.normalization * fro), |x, p| p.eval(x))
                };
                ensure(got == want || (got.is_nan() && want.is_nan()), || {
                    format!("{got} ≠ {want}")
                })
            },
        );
        fuzz.check(format!("PolyStep::eval({sigma})"), move || {
            let got = MUON_QUINTIC.eval(sigma);
            let x2 = sigma * sigma;
            let want = sigma * (MUON_QUINTIC.a + x2 * (MUON_QUINTIC.b + x2 * MUON_QUINTIC.c));
            ensure(got == want || (got.is_nan() && want.is_nan()), || {
                format!("{got} ≠ {want}")
            })
        });
    }
}
