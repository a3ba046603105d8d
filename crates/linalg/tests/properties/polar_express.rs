//! The Polar Express generator: the published tables (the paper's and modded-nanogpt's, under
//! both safety rules), the predicted bands (scalar map and matrix
//! iteration, f64 and f32), bad input.

use super::common::*;
use kappa_linalg::{
    condition_number, newton_schulz, singular_values, InputError, LinalgError, NsSchedule,
    PolarExpressDesign, PolarExpressSpec, PolyStep, SafetyRule, SvdDriver, MAX_NS_STEPS,
    POLAR_EXPRESS_COEFFICIENTS,
};
use ndarray::{Array1, Array2};
use proptest::prelude::*;

/// The componentwise relative tolerance of the Remez solution p (on [lo, u], cushioned lower
/// end) between two implementations of the same algorithm: both solve the same 4×4 system
/// M·(a, b, c, E) = 1 at the equioscillation points (lo, q, r, u; q, r the critical points of
/// p). LU with partial pivoting has backward error ≤ γ₁₂ (n = 4, growth ≤ 2³ absorbed in 3n),
/// the input points carry the previous steps' rounding (≤ γ₁₂ again, at the level of these
/// differences) and the exchange stops when |ΔE| ≤ 1e-15; each run is therefore within
/// κ₂(M)·(2γ₁₂ + 1e-15) of the exact solution in the 2-norm, relative to ‖(a, b, c, E)‖; the
/// two runs differ by twice that, and component i by that times ‖sol‖/|sol_i|. The recentring
/// multiplies by a factor computed with ≤ 8 roundings: + 8u.
fn remez_tolerance(p: &PolyStep, lo: f64, u: f64, coef: f64) -> f64 {
    let disc = (9.0 * p.b * p.b - 20.0 * p.a * p.c).sqrt();
    let q = ((-3.0 * p.b - disc) / (10.0 * p.c)).sqrt();
    let r = ((-3.0 * p.b + disc) / (10.0 * p.c)).sqrt();
    let row = |x: f64, s: f64| [x, x.powi(3), x.powi(5), s];
    let m = ndarray::arr2(&[row(lo, 1.0), row(q, -1.0), row(r, 1.0), row(u, -1.0)]);
    let kappa = condition_number(m.view()).unwrap();
    let norm = (p.a * p.a + p.b * p.b + p.c * p.c + 1.0).sqrt();
    2.0 * kappa * (2.0 * gamma(12) + 1e-15) * norm / coef.abs() + 8.0 * U64
}

/// The paper's coefficient table (Amsel et al., arXiv 2505.16932, Algorithm 1; `coeffs_list` in
/// github.com/NoahAmsel/PolarExpress, polar_express.py): the unscaled polynomials for ℓ = 10⁻³,
/// degree 5, cushion 0.02407…, 8 steps. The paper's code runs them with the safety factor 1.01
/// applied to all entries but the last ([`NsSchedule::polar_express`]).
const PAPER_TABLE: [PolyStep; 8] = [
    PolyStep::new(8.28721201814563, -23.595886519098837, 17.300387312530933),
    PolyStep::new(4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    PolyStep::new(3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    PolyStep::new(3.3184196573706015, -2.488488024314874, 0.51004894012372),
    PolyStep::new(2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    PolyStep::new(1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    PolyStep::new(1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    PolyStep::new(1.875, -1.25, 0.375),
];

/// modded-nanogpt's Polar Express table (`polar_express_coeffs` in train_gpt.py,
/// github.com/KellerJordan/modded-nanogpt, from the record 2025-09-29_PolarExpress on; "computed
/// for num_iters=5, safety_factor=2e-2"): the public generator's output for ℓ = 10⁻³, degree 5,
/// 5 steps, safety factor 1.02 and cushion 0.02, as the iteration runs it (normalization
/// 1.02·‖X‖_F).
const MODDED_NANOGPT_TABLE: [PolyStep; 5] = [
    PolyStep::new(8.156554524902461, -22.48329292557795, 15.878769915207462),
    PolyStep::new(4.042929935166739, -2.808917465908714, 0.5000178451051316),
    PolyStep::new(3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    PolyStep::new(3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    PolyStep::new(2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
];

/// modded-nanogpt's setting: ℓ = 10⁻³, 5 steps, s = 1.02, cushion 0.02, the default rule.
fn modded_nanogpt_spec() -> PolarExpressSpec {
    PolarExpressSpec::new(1e-3, 5, 5, 1.02).with_cushion(0.02)
}

/// Asserts that `steps` equal `table` coefficient by coefficient to the Remez tolerance of the
/// design's step t. The published tables print Python's shortest round-trip form of each f64
/// (16–17 significant digits), so half a unit in their last digit is at most half an ulp; the
/// generator's own convergence tolerance ([`remez_tolerance`]: |ΔE| ≤ 1e-15 and the 4×4 solves'
/// rounding amplified by their condition number) is larger, and is the tolerance. `extra` adds
/// the scaling's roundings where `steps` are scaled copies of the design's polynomials.
/// Converged steps (ℓ_t/u_t ≥ 1 − 5·10⁻⁶), printed as the plain Newton–Schulz step: exact
/// under `AfterDesign`; under `InDesign` the generator runs that step scaled to [0, u_t], which
/// is 1 − u_t^{−k} ≤ 5(u_t − 1) away (k = 1, 3, 5), plus the recentring's 8 roundings.
fn assert_table(d: &Designed, steps: &[PolyStep], table: &[PolyStep], extra: f64) {
    assert_eq!(steps.len(), table.len());
    for (t, (p, q)) in steps.iter().zip(table).enumerate() {
        let raw = d.design.polynomials[t];
        let (l, u) = d.design.design_intervals[t];
        for (mine, theirs) in [(p.a, q.a), (p.b, q.b), (p.c, q.c)] {
            let tol = match d.spec.rule {
                _ if l / u < 1.0 - 5e-6 => {
                    remez_tolerance(&raw, l.max(d.spec.cushion * u), u, theirs) + extra
                }
                SafetyRule::AfterDesign => 0.0,
                SafetyRule::InDesign => 5.0 * (u - 1.0) + 8.0 * U64 + extra,
            };
            let rel = ((mine - theirs) / theirs).abs();
            assert!(
                rel <= tol,
                "step {t}: {mine} vs {theirs}: rel {rel:e} > {tol:e}"
            );
        }
    }
}

/// A design with the specification it was made from (for [`assert_table`]).
struct Designed {
    design: PolarExpressDesign,
    spec: PolarExpressSpec,
}

fn design(spec: PolarExpressSpec) -> Designed {
    Designed {
        design: spec.design().unwrap(),
        spec,
    }
}

#[test]
fn both_safety_rules_reproduce_the_papers_eight_step_table() {
    assert_eq!(POLAR_EXPRESS_COEFFICIENTS, PAPER_TABLE);
    for rule in [SafetyRule::InDesign, SafetyRule::AfterDesign] {
        // The table is the design without a safety factor (step 7 is converged: see
        // `assert_table`).
        let d = design(PolarExpressSpec::new(1e-3, 5, 8, 1.0).with_rule(rule));
        assert_table(&d, &d.design.schedule.steps, &PAPER_TABLE, 0.0);
        assert_table(&d, &d.design.polynomials, &PAPER_TABLE, 0.0);
    }
    // The AfterDesign rule's polynomials do not depend on s.
    let d = design(PolarExpressSpec::paper(8));
    assert_table(&d, &d.design.polynomials, &PAPER_TABLE, 0.0);
}

#[test]
fn the_after_design_rule_is_the_papers_run_time_schedule() {
    // The paper's code runs its table with (a/1.01, b/1.01³, c/1.01⁵) on all entries but the
    // last, which repeats unscaled; the scaling adds ≤ 4 ulps (powers and division) each side.
    let s = 1.01f64;
    for steps in [1, 5, 7, 8, 10, 12] {
        let run: Vec<PolyStep> = (0..steps)
            .map(|t| match PAPER_TABLE.get(t) {
                Some(p) if t < 7 => PolyStep::new(p.a / s, p.b / s.powi(3), p.c / s.powi(5)),
                _ => PAPER_TABLE[7],
            })
            .collect();
        let d = design(PolarExpressSpec::paper(steps));
        assert_eq!(d.design.schedule.normalization, s);
        assert_table(&d, &d.design.schedule.steps, &run, 8.0 * U64);
        let table = NsSchedule::polar_express(steps).unwrap();
        assert_table(&d, &table.steps, &run, 8.0 * U64);
    }
    // The documented claim of the paper's schedule: 1 ± 1e-6 after 10 steps on [1e-3, 1].
    assert!(PolarExpressSpec::paper(10).design().unwrap().error() < 1e-6);
}

#[test]
fn the_default_rule_reproduces_modded_nanogpts_five_step_table() {
    let d = design(modded_nanogpt_spec());
    assert_eq!(d.design.schedule.normalization, 1.02);
    // Steps 0–3 are scaled copies of the design's polynomials (≤ 4 ulps), the last is not.
    assert_table(
        &d,
        &d.design.schedule.steps,
        &MODDED_NANOGPT_TABLE,
        8.0 * U64,
    );
    // kappa's other rule does not give it: its step 4 differs by ≈ 10 % (coefficient c).
    let other = modded_nanogpt_spec().with_rule(SafetyRule::AfterDesign);
    let q = other.design().unwrap().schedule.steps[4];
    assert!(((q.c - MODDED_NANOGPT_TABLE[4].c) / MODDED_NANOGPT_TABLE[4].c).abs() > 0.05);
}

#[test]
fn modded_nanogpts_schedule_maps_every_singular_value_into_its_published_interval() {
    // [0.847, 1.141] for σ/‖X‖_F ∈ [1e-3, 1], printed to 3 decimals: half a unit of the last
    // digit, 5e-4, is the tolerance (the generator's own, ≈ 1e-12, is far smaller).
    let tol = 5e-4;
    let d = modded_nanogpt_spec().design().unwrap();
    let (lo, hi) = *d.bands.last().unwrap();
    assert!(
        (lo - 0.847).abs() <= tol && (hi - 1.141).abs() <= tol,
        "[{lo}, {hi}]"
    );
    // A matrix whose normalized singular values include the map's argmin (x = ℓ) and argmax
    // (found on a log grid), padded to unit norm: its output's extreme σ are the band's ends,
    // to the grid's resolution and the f64 rounding bound.
    let sched = &d.schedule;
    let n = 20_000;
    let x_hi = (0..=n)
        .map(|i| 1e-3 * 1e3f64.powf(i as f64 / n as f64))
        .max_by(|a, b| {
            sched
                .scalar_map(*a, 1.0)
                .total_cmp(&sched.scalar_map(*b, 1.0))
        })
        .unwrap();
    let pad = (1.0 - 1e-6 - x_hi * x_hi).sqrt();
    let s = Array1::from(vec![pad, x_hi, 1e-3]);
    let a = with_spectrum(3, 5, &s, 7);
    let o = newton_schulz(&a, sched).unwrap();
    let so = sv(&o);
    let (r, s_, x, sv_err) = ns_inputs(&a, sched);
    let bound = ns_error_bound(sched, r, s_, &x, f64::EPSILON, sv_err)
        + svd_rel(3, 5, f64::EPSILON) * so[0];
    let (o_lo, o_hi) = (so[2], so[0]);
    assert!(
        o_lo >= lo - bound && o_hi <= hi + bound,
        "[{o_lo}, {o_hi}] ∉ [{lo}, {hi}]"
    );
    assert!(
        (o_lo - 0.847).abs() <= tol + bound && (o_hi - 1.141).abs() <= tol + bound,
        "[{o_lo}, {o_hi}]"
    );
}

#[test]
fn bad_specifications_are_typed_errors() {
    let ok = PolarExpressSpec::paper(5);
    let arg = |s: PolarExpressSpec| match s.design() {
        Err(LinalgError::Input(InputError::InvalidArgument { arg, .. })) => arg,
        Err(LinalgError::TooLarge { arg, .. }) => arg,
        other => panic!("{s:?}: {other:?}"),
    };
    for lower in [0.0, 1.0, -0.5, f64::NAN, f64::INFINITY] {
        assert_eq!(arg(PolarExpressSpec { lower, ..ok }), "lower");
    }
    for degree in [0, 1, 4, 7] {
        assert_eq!(arg(PolarExpressSpec { degree, ..ok }), "degree");
    }
    for steps in [0, MAX_NS_STEPS + 1] {
        assert_eq!(arg(PolarExpressSpec { steps, ..ok }), "steps");
    }
    for safety in [0.99, f64::NAN, f64::INFINITY] {
        assert_eq!(arg(PolarExpressSpec { safety, ..ok }), "safety");
    }
    for cushion in [-0.1, 1.0, f64::NAN] {
        assert_eq!(arg(PolarExpressSpec { cushion, ..ok }), "cushion");
    }
    // The first bad field in declaration order is reported.
    assert_eq!(
        arg(PolarExpressSpec {
            lower: 2.0,
            degree: 4,
            ..ok
        }),
        "lower"
    );
}

/// Log-uniform ℓ in [1e-6, 0.9], the degree, the steps and the safety factor.
fn specs() -> impl Strategy<Value = PolarExpressSpec> {
    (
        -6.0f64..-0.05,
        prop_oneof![Just(3usize), Just(5)],
        1usize..=12,
        1.0f64..1.05,
    )
        .prop_map(|(lk, degree, steps, safety)| {
            PolarExpressSpec::new(10f64.powf(lk), degree, steps, safety)
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_x_lands_in_the_predicted_band(spec in specs()) {
        let d = spec.design().unwrap();
        let sched = &d.schedule;
        let (lo, hi) = *d.bands.last().unwrap();
        let n = 400;
        let xs: Vec<f64> = (0..=n)
            .map(|i| spec.lower * (1.0 / spec.lower).powf(i as f64 / n as f64))
            .collect();
        // The computed scalar map and the computed band are each within the rounding bound of
        // the exact map (`ns_error_bound` for a 1×1 "matrix": the same products and sums, with
        // ε = 2u a factor 2 of margin), from the normalized values x/s.
        let normalized: Vec<f64> = xs.iter().map(|x| x / sched.normalization).collect();
        let tol = 2.0 * ns_error_bound(sched, 1, 1, &normalized, f64::EPSILON, 0.0);
        for &x in &xs {
            let y = sched.scalar_map(x, 1.0);
            prop_assert!(y >= lo - tol && y <= hi + tol, "x = {x}: {y} ∉ [{lo}, {hi}] ± {tol:e}");
        }
        // The band's error never exceeds the design error by more than the safety factor's
        // effect: without a safety factor they are the same numbers.
        if spec.safety == 1.0 {
            let (l, u) = *d.design_intervals.last().unwrap();
            prop_assert!((lo - l).abs() <= tol + 4.0 * U64 && (hi - u).abs() <= tol + 4.0 * U64);
        }
    }

    #[test]
    fn the_matrix_iteration_stays_in_the_band(
        (m, n, seed) in dims(14),
        lk in 0.0f64..2.5,
        steps in 3usize..=10,
    ) {
        let k = m.min(n);
        let s = spectrum(k, 10f64.powf(lk), seed);
        let a = with_spectrum(m, n, &s, seed);
        let sv_a = singular_values(a.view(), SvdDriver::QrIteration).unwrap();
        let f = fro(&a);
        // ℓ just below the smallest σ/‖A‖_F (the SVD's error included).
        let lower = (sv_a[k - 1] / f * (1.0 - 1e-9)).min(0.5);
        let d = PolarExpressSpec::new(lower, 5, steps, 1.01).design().unwrap();
        let (lo, hi) = *d.bands.last().unwrap();
        let (r, s_, x, sv_err) = ns_inputs(&a, &d.schedule);
        // f64: the rounding bound of the iteration (input SVD error as e0) + the output SVD.
        let o = newton_schulz(&a, &d.schedule).unwrap();
        let so = sv(&o);
        let tol = ns_error_bound(&d.schedule, r, s_, &x, f64::EPSILON, sv_err)
            + svd_rel(m, n, f64::EPSILON) * so[0];
        prop_assert!(so.iter().all(|&y| y >= lo - tol && y <= hi + tol), "f64 {so} ∉ [{lo}, {hi}] ± {tol:e}");
        // f32: the cast (u_f32 relative) and ε_f32 rounding.
        let o32 = newton_schulz(&a.mapv(|v| v as f32), &d.schedule).unwrap().mapv(f64::from);
        let so = sv(&o32);
        let tol = ns_error_bound(&d.schedule, r, s_, &x, f32::EPSILON as f64, sv_err + U32)
            + svd_rel(m, n, f64::EPSILON) * so[0];
        prop_assert!(so.iter().all(|&y| y >= lo - tol && y <= hi + tol), "f32 {so} ∉ [{lo}, {hi}] ± {tol:e}");
    }
}

fn sv(a: &Array2<f64>) -> Array1<f64> {
    singular_values(a.view(), SvdDriver::QrIteration).unwrap()
}
