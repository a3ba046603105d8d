//! Properties 1–2 of docs/optim.md, "Properties → tests": msign properties (σ = 1, scale and sign invariance, = UVᵀ, skew-symmetry, zero σ),
//! the NS5 band and Polar Express to 1 ± 1e-6 (f64).
//!
//! Tolerances: every comparison of two computations is derived (common.rs, "Derived
//! tolerances") from u, the sizes and the input's measured conditioning (σ of the generated
//! matrix) or amplification; the bands (NS5 [0.6818, 1.1344], Polar Express 1 ± 1e-6) are the
//! documented accuracy of the algorithms (kappa_linalg::newton_schulz and kappa_optim::msign
//! module docs), widened only by the derived rounding of the f64 matrix computation.

use super::common::*;
use kappa_linalg::input::InputError;
use kappa_linalg::{svd_thin, NsSchedule, SvdDriver, MUON_BAND, MUON_BAND_THRESHOLD, MUON_QUINTIC};
use kappa_optim::{msign, Msign, OptimError, Precision};
use ndarray::Array2;
use proptest::prelude::*;

fn exact(x: &Array2<f64>) -> Array2<f64> {
    msign(x, Msign::Exact, Precision::Native).unwrap()
}

fn ns(method: Msign) -> NsSchedule {
    method.schedule().expect("a Newton–Schulz variant")
}

/// L = Π_k max_{0 < x ≤ 1.25} |p_k(x)/x|: the largest factor by which the schedule can multiply a
/// singular value (p_k(x)/x is the divided difference p_k[x, 0] = p_k[x, −0] that carries a
/// perturbation between a σ = x direction and a null one; at x → 0 it is a_k). Computed on a grid
/// of 10⁴ points, x ≤ 1.25 covering every iterate (the NS5 band ends at 1.1344, Polar Express
/// at 1 + 1e-6; the σ ≤ 1.2024 overshoot of the newton_schulz docs included).
fn null_amplification(s: &NsSchedule) -> f64 {
    s.steps
        .iter()
        .map(|p| {
            (1..=10_000)
                .map(|i| 1.25 * i as f64 / 10_000.0)
                .map(|x| (p.eval(x) / x).abs())
                .fold(p.a.abs(), f64::max)
        })
        .product()
}

/// The bound of `Exact`'s null singular values for X with singular values `s` (descending) of
/// rank `rank`, m×n: msign.rs's `exact` projects them out with the cubic Newton–Schulz sign of
/// H = QᵀX, ⌈ln(‖X‖_F/σ_r)/ln 1.5⌉ + 8 steps from H/‖H‖_F. The cubic's slope at 0 is 1.5, so the
/// null part of H — X's own (the last σ, relative to ‖X‖_F) plus the rounding of QᵀX and of each
/// step (NS_PRODUCTS·√k·u) — grows by at most null_amplification(cubic) ≈ 1.5^steps ≈
/// 26·‖X‖_F/σ_r (the module docs now state this bound; their former "≈ 10·κ_r·ε" was
/// exceeded, 5.9e-14 against 10·κ_r·ε + svd_err = 4.0e-14, found by exploring). Plus the check's
/// svd_err.
fn exact_null_tol(s: &[f64], rank: usize, m: usize, n: usize) -> f64 {
    let x_fro = s.iter().map(|v| v * v).sum::<f64>().sqrt();
    let steps = ((x_fro / s[rank - 1]).ln() / 1.5f64.ln()).ceil() as usize + 8;
    let e_in = s[rank..].iter().fold(0.0f64, |a, &b| a.max(b)) / x_fro;
    let per_step = NS_PRODUCTS as f64 * (m.max(n) as f64).sqrt() * U64;
    null_amplification(&NsSchedule::cubic(steps).expect("a step count far below MAX_NS_STEPS"))
        * (e_in + (steps + 1) as f64 * per_step)
        + svd_err(m, n)
}

/// Rounding injections of one Newton–Schulz step: the Gram product, its square, the product
/// with X (length ≤ max(m, n) inner products each, bounded by √k in [`derived_tol`]).
const NS_PRODUCTS: usize = 3;

proptest! {
    #![proptest_config(config(32))]

    #[test]
    fn exact_msign_is_the_polar_factor((m, n, seed) in shapes(), log_scale in -30.0f64..30.0) {
        let x = gaussian(m, n, seed);
        let sx = sv(&x);
        let (x_fro, s_min) = (fro(&x), sx[sx.len() - 1]);
        let q = exact(&x);
        // all σ = 1: Q's orthonormality error svd_err, plus the backward error svd_err of the
        // SVD that measures it (Weyl: σ move by at most the perturbation's spectral norm).
        let sigma_tol = 2.0 * svd_err(m, n) * 2.0;
        for s in sv(&q) {
            prop_assert!((s - 1.0).abs() <= sigma_tol, "σ = {s} (tol {sigma_tol:e})");
        }
        // = U Vᵀ of another SVD (divide and conquer): two polar factors, each exact for X plus a
        // backward error svd_err·‖X‖_F, apart by at most the polar perturbation of their sum,
        // plus each one's own rounding (svd_err per entry of a unit-norm factor).
        let f = svd_thin(x.view(), SvdDriver::DivideAndConquer).unwrap();
        let polar_tol = polar_perturbation(x_fro, s_min, 2.0 * svd_err(m, n)) + 2.0 * svd_err(m, n);
        let d = max_abs_diff(&q, &f.u.dot(&f.vt));
        prop_assert!(d <= polar_tol, "{d:e} > {polar_tol:e}");
        // Scale invariance and oddness. c·X rounds every entry (relative u: ‖ΔX‖_F ≤ u‖X‖_F);
        // msign's own power-of-two scaling is exact (msign.rs, "Scale"); then as above. −X is
        // exact, so only the two SVDs' backward errors remain.
        let c = 10f64.powf(log_scale);
        let scale_tol = polar_perturbation(x_fro, s_min, U64 + 2.0 * svd_err(m, n)) + 2.0 * svd_err(m, n);
        let d = max_abs_diff(&exact(&(&x * c)), &q);
        prop_assert!(d <= scale_tol, "{d:e} > {scale_tol:e}");
        let d = max_abs_diff(&exact(&(-&x)), &(-&q));
        prop_assert!(d <= polar_tol, "{d:e} > {polar_tol:e}");
        // The same for the Newton–Schulz variants (scale invariant, odd).
        for method in [Msign::MuonQuintic, Msign::polar_express()] {
            let run = |x: &Array2<f64>| msign(x, method, Precision::Native).unwrap();
            let p = run(&x);
            // c·X vs X: the inputs differ by the rounding of c·X and of the two normalizations
            // (2 injections), then every step's products (NS_PRODUCTS each); the amplification of
            // one relative injection is measured on this X.
            let amp = amplification(|i| run(&i[0]), std::slice::from_ref(&x));
            let injections = 2 + NS_PRODUCTS * ns(method).steps.len();
            let tol = derived_tol(injections, m.max(n), amp, max_abs(&p));
            let d = max_abs_diff(&run(&(&x * c)), &p);
            prop_assert!(d <= tol, "{method:?}: {d:e} > {tol:e}");
            // Exactly odd: the iteration is X ↦ a·X + X·(b·XᵀX + c·(XᵀX)²) after X/‖X‖_F; the
            // Gram matrix of −X is bitwise that of X and every other operation is linear in X,
            // and IEEE rounding (to nearest, ties to even) commutes with negation.
            prop_assert_eq!(run(&(-&x)), -&p);
        }
    }

    #[test]
    fn msign_preserves_skew_symmetry(n in 2usize..24, seed in any::<u64>()) {
        // Odd n: the skew matrix is singular; the exact msign must keep its null direction at 0.
        // g − gᵀ is exactly skew (fl(a − b) = −fl(b − a)), and for odd n exactly singular.
        let g = gaussian(n, n, seed);
        let skew = &g - &g.t();
        let s = sv(&skew);
        // σ come in pairs; σ_r the smallest non-zero one (the last is the null one for odd n).
        let rank = if n % 2 == 1 { n - 1 } else { n };
        let (s_fro, s_r) = (fro(&skew), s[rank - 1]);
        // Exact: Q and −Qᵀ are the msign of S + E and of S + E' (−Eᵀ), E backward errors of one
        // SVD: apart by the polar perturbation of 2·svd_err on the rank-r part; the null
        // direction bounded by exact_null_tol.
        let q = exact(&skew);
        let tol = polar_perturbation(s_fro, s_r, 2.0 * svd_err(n, n)) + 2.0 * svd_err(n, n);
        let d = max_abs_diff(&q, &(-&q.t()));
        prop_assert!(d <= tol, "Exact: {d:e} > {tol:e}");
        if n % 2 == 1 {
            let null_tol = exact_null_tol(&s, rank, n, n);
            let sq = sv(&q);
            prop_assert!(sq[n - 1] <= null_tol, "Exact: null σ = {} > {null_tol:e}", sq[n - 1]);
        }
        // Polar Express: p(S) = S·q(SᵀS) is skew in exact arithmetic; rounding is not skew, so the
        // skew defect is the difference of two roundings of one map, each bounded by derived_tol
        // with the amplification of a (non-skew) perturbation measured on S. For odd n the null
        // direction v is an unstable fixed point (rounding there grows by null_amplification ≈
        // 2e4), so the defect is compared on the range of S, P·(Q + Qᵀ)·P with P = I − vvᵀ (the
        // stable part; found by exploring, n = 3), and the null σ is bounded separately below.
        let pe = Msign::polar_express();
        let p_range = if n % 2 == 1 {
            let v = svd_thin(skew.view(), SvdDriver::QrIteration).unwrap().vt.row(n - 1).to_owned();
            let vv = v.clone().insert_axis(ndarray::Axis(1)).dot(&v.insert_axis(ndarray::Axis(0)));
            Array2::<f64>::eye(n) - vv
        } else {
            Array2::<f64>::eye(n)
        };
        let run = |x: &Array2<f64>| p_range.dot(&msign(x, pe, Precision::Native).unwrap()).dot(&p_range);
        let q_full = msign(&skew, pe, Precision::Native).unwrap();
        let q = run(&skew);
        let amp = amplification(|i| run(&i[0]), std::slice::from_ref(&skew));
        // +2 injections: the two products with P.
        let tol = 2.0 * derived_tol(3 + NS_PRODUCTS * ns(pe).steps.len(), n, amp, max_abs(&q));
        let d = max_abs_diff(&q, &(-&q.t()));
        prop_assert!(d <= tol, "Polar Express: {d:e} > {tol:e}");
        let q = q_full;
        if n % 2 == 1 {
            // The null σ: the rounding injected at each step (≤ √n·u·NS_PRODUCTS relative, the
            // input's own null σ measured by `s`), amplified at most by the schedule's
            // null_amplification; plus the check's svd_err.
            let sched = ns(pe);
            let e_in = s[n - 1] / (sched.normalization * s_fro);
            let per_step = NS_PRODUCTS as f64 * (n as f64).sqrt() * U64;
            let null_tol = null_amplification(&sched) * (e_in + sched.steps.len() as f64 * per_step) + svd_err(n, n);
            let sq = sv(&q);
            prop_assert!(sq[n - 1] <= null_tol, "Polar Express: null σ = {} > {null_tol:e}", sq[n - 1]);
        }
    }

    #[test]
    fn polar_express_reaches_one_and_ns5_stays_in_its_band(
        (m, n, seed) in shapes(), kappa in 1.0f64..100.0
    ) {
        let k = m.min(n);
        let s: Vec<f64> = (0..k).map(|i| kappa.powf(-(i as f64) / (k - 1).max(1) as f64)).collect();
        let x = with_spectrum(m, n, &s, seed);
        // The premise of both bands, measured: σ_min/‖X‖_F ≥ 0.0052 (NS5) and ≥ 1e-3·1.01
        // (Polar Express normalizes by 1.01·‖X‖_F). (κ ≤ 100, k ≤ 24: ≥ 0.0057.)
        let ratio = s[k - 1] / fro(&x);
        prop_assert!(ratio >= MUON_BAND_THRESHOLD.max(1.01e-3), "premise: σ_min/‖X‖_F = {ratio}");
        // The bands are the scalar maps' (exact arithmetic; checked in scalar_maps_match_the_docs
        // and the newton_schulz docs). The f64 matrix iteration adds, at each step, a perturbation
        // of spectral norm ≤ NS_PRODUCTS·√k·u (k the longer side; Weyl: each σ moves by at most
        // that), carried to the end by at most the schedule's Lipschitz constant
        // L = Π max|p_k'| on [0, 1.25] (≤ 3.4445⁵ ≈ 488 for NS5); plus the check's svd_err.
        for (method, lo, hi) in [
            (Msign::polar_express(), 1.0 - 1e-6, 1.0 + 1e-6),
            (Msign::MuonQuintic, MUON_BAND.0, MUON_BAND.1),
        ] {
            let sched = ns(method);
            let lip: f64 = sched.steps.iter().map(|p| {
                (0..=10_000).map(|i| 1.25 * i as f64 / 10_000.0)
                    .map(|x| (p.a + 3.0 * p.b * x * x + 5.0 * p.c * x.powi(4)).abs())
                    .fold(0.0, f64::max)
            }).product();
            let slack = lip * sched.steps.len() as f64 * NS_PRODUCTS as f64 * (m.max(n) as f64).sqrt() * U64
                + 2.0 * svd_err(m, n);
            let q = msign(&x, method, Precision::Native).unwrap();
            for v in sv(&q) {
                prop_assert!(v >= lo - slack && v <= hi + slack, "{method:?} σ = {v} (slack {slack:e})");
            }
        }
    }

    #[test]
    fn newton_schulz_keeps_zero_singular_values_at_zero((m, n, seed) in shapes()) {
        let k = m.min(n);
        let mut s = vec![1.0; k];
        for v in s.iter_mut().skip(k / 2) {
            *v = 0.0;
        }
        let x = with_spectrum(m, n, &s, seed);
        // The "zero" σ of the computed X (rounding of U·diag(s)·Vᵀ), measured.
        let sx = sv(&x);
        let x_fro = fro(&x);
        let e_in = sx[k / 2..].iter().fold(0.0f64, |a, &b| a.max(b)) / x_fro;
        let q = exact(&x);
        // Exact: below the rank threshold τ = σ₁·max(m,n)·ε they are projected out, leaving at
        // most exact_null_tol.
        let tol = exact_null_tol(&sx, k / 2, m, n);
        let sq = sv(&q);
        prop_assert!(sq[k / 2..].iter().all(|v| *v <= tol), "Exact: {sq:?} (tol {tol:e})");
        for method in [Msign::MuonQuintic, Msign::polar_express()] {
            // Newton–Schulz: the input's null σ (relative to the normalization) and each step's
            // rounding, amplified by at most null_amplification (a_k at x → 0).
            let sched = ns(method);
            let per_step = NS_PRODUCTS as f64 * (m.max(n) as f64).sqrt() * U64;
            let tol = null_amplification(&sched)
                * (e_in / sched.normalization + sched.steps.len() as f64 * per_step)
                + svd_err(m, n);
            let sq = sv(&msign(&x, method, Precision::Native).unwrap());
            prop_assert!(sq[k / 2..].iter().all(|v| *v <= tol), "{method:?}: {sq:?} (tol {tol:e})");
        }
    }
}

#[test]
fn scalar_maps_match_the_docs() {
    // a + b + c in f64: the three literals are rounded (≤ u·|x| each), as are the two additions
    // (≤ u·|partial sum|) and the literal 0.701: an exact error bound.
    let (a, b, c) = (MUON_QUINTIC.a, MUON_QUINTIC.b, MUON_QUINTIC.c);
    let tol = U64 * (a.abs() + b.abs() + c.abs() + (a + b).abs() + (a + b + c).abs() + 0.701);
    assert!((a + b + c - 0.701).abs() <= tol);
    // Polar Express's documented band (msign.rs module docs, Amsel et al.): 1 ± 1e-6 after 10
    // steps for σ/‖X‖_F ∈ [1e-3, 1], i.e. x = σ/(1.01‖X‖_F). Not a comparison: the claim itself
    // (scalar evaluation rounds at ≈ 10·4·u ≈ 4e-15, far below it).
    let pe = Msign::polar_express().schedule().unwrap();
    for i in 0..=1000 {
        let x = 10f64.powf(-3.0 + 3.0 * i as f64 / 1000.0) / 1.01;
        let y = pe.steps.iter().fold(x, |x, p| p.eval(x));
        assert!((y - 1.0).abs() <= 1e-6, "x = {x}: {y}");
    }
}

#[test]
fn the_zero_matrix_maps_to_zero() {
    let z = Array2::<f64>::zeros((4, 3));
    for method in [Msign::Exact, Msign::MuonQuintic, Msign::polar_express()] {
        assert_eq!(msign(&z, method, Precision::Native).unwrap(), z);
    }
}

/// The designed Polar Express and AOL variants: serde names, validation, flops, schedules.
#[test]
fn designed_and_aol_variants_round_trip_and_validate() {
    let designed = Msign::designed(1e-3, 10, 1.01);
    for (m, json) in [
        (
            designed,
            r#"{"polar_express_designed":{"lower":0.001,"steps":10,"safety":1.01}}"#,
        ),
        (Msign::aol(), r#"{"aol":{"steps":4}}"#),
    ] {
        assert_eq!(serde_json::to_string(&m).unwrap(), json);
        assert_eq!(serde_json::from_str::<Msign>(json).unwrap(), m);
        assert!(m.validate().is_ok());
        assert_eq!(
            m.flops(8, 32),
            Msign::PolarExpress {
                steps: ns(m).steps.len()
            }
            .flops(8, 32)
        );
    }
    // The existing spelling keeps parsing.
    let pe: Msign = serde_json::from_str(r#"{"polar_express":{"steps":10}}"#).unwrap();
    assert_eq!(pe, Msign::polar_express());
    for bad in [
        Msign::designed(0.0, 10, 1.01),
        Msign::designed(1.0, 10, 1.01),
        Msign::designed(1e-3, 0, 1.01),
        Msign::designed(1e-3, 10, 0.5),
        Msign::designed(1e-3, 10, f64::NAN),
        Msign::Aol {
            steps: 0,
            lower: None,
        },
        Msign::Aol {
            steps: 6,
            lower: None,
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
        assert!(bad.schedule().is_none(), "{bad:?}");
        assert!(msign(&Array2::<f64>::eye(3), bad, Precision::Native).is_err());
    }
    // The designed schedule is the generator's under its default safety rule (the public
    // generator's), bit for bit; the paper's run-time table (`PolarExpress { steps }`) is the
    // other rule, which kappa-linalg's tests compare with the published tables.
    let spec = kappa_linalg::PolarExpressSpec::new(1e-3, 5, 10, 1.01);
    assert_eq!(spec.rule, kappa_linalg::SafetyRule::InDesign);
    assert_eq!(ns(designed), spec.design().unwrap().schedule);
}

/// The Gram form of AOL: serde name, validation, flops (the Gram form's count), its bf16
/// period limit, and the linalg routine bit for bit.
#[test]
fn gram_aol_variant_round_trips_validates_and_is_the_linalg_routine() {
    let m = Msign::gram_aol();
    let json = r#"{"gram_aol":{"steps":4,"restart":2}}"#;
    assert_eq!(serde_json::to_string(&m).unwrap(), json);
    assert_eq!(serde_json::from_str::<Msign>(json).unwrap(), m);
    assert!(m.validate().is_ok());
    assert_eq!(ns(m), NsSchedule::turbo_muon(4).unwrap());
    let gram_pe = Msign::GramPolarExpress {
        steps: 4,
        restart: 2,
    };
    assert_eq!(m.flops(64, 256), gram_pe.flops(64, 256));
    assert!(m.flops(64, 256) < Msign::aol().flops(64, 256));
    for (bad, arg) in [
        (
            Msign::GramAol {
                steps: 0,
                restart: 2,
                lower: None,
            },
            "msign.steps",
        ),
        (
            Msign::GramAol {
                steps: 6,
                restart: 2,
                lower: None,
            },
            "msign.steps",
        ),
        (
            Msign::GramAol {
                steps: 4,
                restart: 0,
                lower: None,
            },
            "msign.restart",
        ),
    ] {
        match bad.validate() {
            Err(OptimError::Input(InputError::InvalidArgument { arg: a, .. })) => {
                assert_eq!(a, arg)
            }
            other => panic!("{bad:?}: {other:?}"),
        }
        assert!(msign(&Array2::<f64>::eye(3), bad, Precision::Native).is_err());
    }
    let x: Array2<f64> = gaussian(12, 40, 7);
    let o = msign(&x, m, Precision::Native).unwrap();
    let direct =
        kappa_linalg::aol_gram_newton_schulz(&x, &NsSchedule::turbo_muon(4).unwrap(), 2).unwrap();
    assert_eq!(o, direct);
}

/// The AOL variants with a designed schedule (`lower`): serde (the field absent for Turbo's
/// schedule, so older configs read unchanged), the designed schedule with no safety factor
/// (`NsSchedule::aol_three_steps` for the presets), validation in declaration order, flops, and both
/// forms bit for bit their linalg routines.
#[test]
fn aol_short_variants_round_trip_validate_and_are_the_linalg_routines() {
    let (plain, gram) = (Msign::aol_three_steps(), Msign::gram_aol_three_steps());
    for (m, json) in [
        (plain, r#"{"aol":{"steps":3,"lower":0.03}}"#),
        (gram, r#"{"gram_aol":{"steps":3,"restart":2,"lower":0.03}}"#),
    ] {
        assert_eq!(serde_json::to_string(&m).unwrap(), json);
        assert_eq!(serde_json::from_str::<Msign>(json).unwrap(), m);
        assert!(m.validate().is_ok());
        assert_eq!(ns(m), NsSchedule::aol_three_steps().unwrap());
    }
    assert_eq!(ns(plain).normalization, 1.0);
    assert_eq!(plain.flops(96, 96), 0.6 * Msign::MuonQuintic.flops(96, 96));
    let designed = |steps, lower| Msign::Aol {
        steps,
        lower: Some(lower),
    };
    // More than Turbo's 5 steps are fine with a designed schedule.
    assert!(designed(7, 1e-3).validate().is_ok());
    for (bad, arg) in [
        (designed(3, 0.0), "msign.lower"),
        (designed(3, 1.0), "msign.lower"),
        (designed(3, f64::NAN), "msign.lower"),
        (designed(0, 0.03), "msign.steps"),
        (
            Msign::GramAol {
                steps: 3,
                restart: 0,
                lower: Some(0.03),
            },
            "msign.restart",
        ),
    ] {
        match bad.validate() {
            Err(OptimError::Input(InputError::InvalidArgument { arg: a, .. })) => {
                assert_eq!(a, arg, "{bad:?}")
            }
            other => panic!("{bad:?}: {other:?}"),
        }
        assert!(msign(&Array2::<f64>::eye(3), bad, Precision::Native).is_err());
    }
    let x: Array2<f64> = gaussian(12, 40, 7);
    let short = NsSchedule::aol_three_steps().unwrap();
    assert_eq!(
        msign(&x, plain, Precision::Native).unwrap(),
        kappa_linalg::aol_newton_schulz(&x, &short).unwrap()
    );
    assert_eq!(
        msign(&x, gram, Precision::Native).unwrap(),
        kappa_linalg::aol_gram_newton_schulz(&x, &short, 2).unwrap()
    );
}

/// msign's AOL variant is `aol_newton_schulz` (no power-of-two prescaling for ‖X‖_F inside
/// [2⁻²⁰, 2²⁰]: the same arithmetic, bit for bit), and its output is msign(X·D), not msign(X).
#[test]
fn aol_variant_is_the_linalg_routine() {
    let x: Array2<f64> = gaussian(12, 40, 7);
    let o = msign(&x, Msign::aol(), Precision::Native).unwrap();
    let direct = kappa_linalg::aol_newton_schulz(&x, &NsSchedule::turbo_muon(4).unwrap()).unwrap();
    assert_eq!(o, direct);
    let d = msign(&x, Msign::designed(1e-3, 10, 1.01), Precision::Native).unwrap();
    let p = msign(&x, Msign::polar_express(), Precision::Native).unwrap();
    assert_eq!(d.dim(), p.dim());
}

/// `MuonQuinticClamp` (torch.optim.Muon's normalization): serde name, validation, flops, and
/// the documented equalities — `MuonQuintic` bit for bit when ‖X‖_F ≥ eps, the quintic of X/eps
/// below.
#[test]
fn the_clamped_quintic_is_the_plain_one_above_eps_and_divides_by_eps_below() {
    let m = Msign::torch_muon();
    let json = r#"{"muon_quintic_clamp":{"eps":1e-7}}"#;
    assert_eq!(serde_json::to_string(&m).unwrap(), json);
    assert_eq!(serde_json::from_str::<Msign>(json).unwrap(), m);
    assert!(m.validate().is_ok());
    assert_eq!(m.flops(8, 32), Msign::MuonQuintic.flops(8, 32));
    let x = gaussian(5, 9, 3);
    let run = |x: &Array2<f64>, method| msign(x, method, Precision::Native).unwrap();
    assert_eq!(run(&x, m), run(&x, Msign::MuonQuintic));
    // ‖X‖_F = 1e-8 < eps: the quintic of X/eps = 0.1·X/‖X‖_F, the schedule with normalization
    // 10 on X. Two roundings of one map (the scaled copy and the normalizations: 3 injections,
    // then the products), its amplification measured.
    let tiny = &x * (1e-8 / fro(&x));
    let tenth = NsSchedule {
        normalization: 10.0,
        ..NsSchedule::muon()
    };
    let want = kappa_linalg::newton_schulz(&x, &tenth).unwrap();
    let amp = amplification(|i| run(&i[0], m), std::slice::from_ref(&tiny));
    let tol = 2.0 * derived_tol(3 + NS_PRODUCTS * 5, 9, amp, max_abs(&want));
    let d = max_abs_diff(&run(&tiny, m), &want);
    assert!(d <= tol, "{d:e} > {tol:e}");
    // The plain quintic divides by ‖X‖_F instead, and lands elsewhere.
    assert!(max_abs_diff(&run(&tiny, Msign::MuonQuintic), &want) > 0.1);
}

/// `Msign::modded_nanogpt()` runs kappa-linalg's design for modded-nanogpt's setting (ℓ = 10⁻³,
/// 5 steps, s = 1.02, cushion 0.02, the public generator's rule; that design is checked against
/// the published table in kappa-linalg's tests); the cushion and the rule are serde fields that a
/// config may leave out, and a cushion outside [0, 1) is refused.
#[test]
fn the_designed_msign_takes_a_cushion_and_a_safety_rule() {
    let spec = |rule| {
        kappa_linalg::PolarExpressSpec::new(1e-3, 5, 5, 1.02)
            .with_cushion(0.02)
            .with_rule(rule)
    };
    let modded = Msign::modded_nanogpt();
    assert_eq!(
        ns(modded),
        spec(kappa_linalg::SafetyRule::InDesign)
            .design()
            .unwrap()
            .schedule
    );
    let after = Msign::PolarExpressDesigned {
        lower: 1e-3,
        steps: 5,
        safety: 1.02,
        cushion: 0.02,
        rule: kappa_linalg::SafetyRule::AfterDesign,
    };
    assert_eq!(
        ns(after),
        spec(kappa_linalg::SafetyRule::AfterDesign)
            .design()
            .unwrap()
            .schedule
    );
    assert_ne!(ns(after), ns(modded));
    let json = r#"{"polar_express_designed":{"lower":0.001,"steps":5,"safety":1.02,"cushion":0.02,"rule":"after_design"}}"#;
    assert_eq!(serde_json::to_string(&after).unwrap(), json);
    assert_eq!(serde_json::from_str::<Msign>(json).unwrap(), after);
    let bad_rule = json.replace("after_design", "sideways");
    assert!(serde_json::from_str::<Msign>(&bad_rule).is_err());
    for cushion in [-0.1, 1.0, f64::NAN] {
        let bad = Msign::PolarExpressDesigned {
            lower: 1e-3,
            steps: 5,
            safety: 1.02,
            cushion,
            rule: kappa_linalg::SafetyRule::InDesign,
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("msign.cushion"), "{e}");
    }
}
