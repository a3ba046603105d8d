//! Iterative σ_max, σ_min and κ estimates against the full SVD.

use super::common::*;
use kappa_linalg::{
    condition_number, condition_number_estimate, sigma_max_power, sigma_min_inverse,
    singular_values, IterativeOptions, KappaEstimate, StopRule, SvdDriver,
};
use ndarray::{Array1, Array2, ShapeBuilder};
use proptest::prelude::*;

fn tight() -> IterativeOptions {
    IterativeOptions {
        tol: 1e-9,
        max_iter: 2000,
        seed: 3,
        ..Default::default()
    }
}

fn estimate_rule(tol: f64) -> IterativeOptions {
    IterativeOptions {
        tol,
        stop: StopRule::ErrorEstimate,
        ..Default::default()
    }
}

/// `s` with its `c` largest values replaced by a cluster of relative width `w` just below s[0],
/// and its `c` smallest by one just above s[k−1] (σ sorted descending).
fn clustered(s: &Array1<f64>, c: usize, w: f64) -> Array1<f64> {
    let k = s.len();
    let c = c.min(k / 2);
    let mut out = s.clone();
    for i in 0..c {
        let t = i as f64 / c as f64;
        out[i] = s[0] * (1.0 - w * t);
        out[k - 1 - i] = s[k - 1] * (1.0 + w * t);
    }
    out
}

/// The relative error |κ̂ − κ|/κ of the estimate under `opts`, with the estimate.
fn kappa_error(a: &Array2<f64>, opts: IterativeOptions) -> (f64, KappaEstimate<f64>) {
    let exact = condition_number(a.view()).unwrap();
    let e = condition_number_estimate(a.view(), opts).unwrap();
    ((e.kappa - exact).abs() / exact, e)
}

/// The rounding slack of κ̂ against the SVD κ, relative: the Golub–Kahan–Lanczos process with
/// full reorthogonalization is backward stable (its B_j is the exact one of A + E), and we take
/// ‖E‖₂ ≤ δ = 30·max(m,n)·ε·‖A‖_F — a choice, the documented SVD constant (`svd_rel`), which also
/// bounds the reference SVD's error on σ (r = 30·max(m,n)·ε·σ₁). Ritz values of A + E interlace
/// its singular values, so κ̂ ≤ (σ₁ + δ)/(σ_k − δ) ≤ κ_svd·(1 + (δ + r)/σ̂₁)/(1 − (δ + r)/σ̂_k).
/// Returns that factor minus 1.
fn rounding_slack(a: &Array2<f64>, sv: &[f64]) -> f64 {
    let (m, n) = a.dim();
    let d = svd_rel(m, n, f64::EPSILON) * (fro(a) + sv[0]);
    let (s1, sk) = (sv[0], sv[sv.len() - 1]);
    (1.0 + d / s1) / (1.0 - d / sk) - 1.0
}

/// What `condition_number_estimate` guarantees for a converged estimate `e` of A (singular
/// values `sv`, descending), checked; returns whether the estimate **misconverged** (an extreme
/// Ritz value settled on an inner singular value):
///
/// 1. κ̂ ≤ κ·(1 + [`rounding_slack`]) always (Ritz values interlace).
/// 2. Each extreme Ritz value θ lies within ρθ/√2 (+ δ) of *some* singular value, ρ the reported
///    residual: Aṽ = θũ exactly and ‖Aᵀũ − θṽ‖ = ρθ, so (ũ; ṽ)/√2 has residual ρθ/√2 for the
///    Jordan–Wielandt matrix [[0, A], [Aᵀ, 0]], whose eigenvalues are ±σ_i and zeros; ρ < √2 rules
///    out the zeros (Parlett, *The Symmetric Eigenvalue Problem*, Thm 4.5.1).
/// 3. If those nearest singular values are σ₁ and σ_k (the Ritz values found the extremes),
///    κ ≤ κ̂·(1 + ρ/√2)/(1 − ρ/√2) by 2, i.e. |κ̂ − κ|/κ ≤ 1 − (1 − ρ/√2)/(1 + ρ/√2) (+ slack).
///    Otherwise the estimate misconverged, which no single-vector Krylov method can detect; its
///    frequency is tested by `misconvergence_is_rare`.
fn kappa_claims(a: &Array2<f64>, sv: &[f64], e: &KappaEstimate<f64>) -> Result<bool, String> {
    let k = sv.len();
    let exact = sv[0] / sv[k - 1];
    let slack = rounding_slack(a, sv);
    if e.kappa > exact * (1.0 + slack) {
        return Err(format!("κ̂ = {} > κ = {exact} (slack {slack:e})", e.kappa));
    }
    let (m, n) = a.dim();
    let d = svd_rel(m, n, f64::EPSILON) * (fro(a) + sv[0]);
    let r = e.residual / 2f64.sqrt();
    let nearest = |t: f64| {
        (0..k)
            .min_by(|&i, &j| (sv[i] - t).abs().total_cmp(&(sv[j] - t).abs()))
            .unwrap()
    };
    for (name, t) in [("σ̂_max", e.sigma_max), ("σ̂_min", e.sigma_min)] {
        let dist = distance_to_nearest(sv, t);
        if dist > r * t + d {
            return Err(format!(
                "{name} = {t} is {dist:e} from every σ (> ρθ/√2 + δ): {e:?}"
            ));
        }
    }
    let found = nearest(e.sigma_max) == 0 && nearest(e.sigma_min) == k - 1;
    if found {
        let band = 1.0 - (1.0 - r) / (1.0 + r) / (1.0 + slack);
        let err = (e.kappa - exact).abs() / exact;
        if err > band {
            return Err(format!(
                "|κ̂ − κ|/κ = {err:e} > {band:e} with the extremes found: {e:?}"
            ));
        }
    }
    Ok(!found)
}

/// A Lanczos draw of `lanczos_kappa_matches_svd_from_below`'s distribution.
fn lanczos_draw(m: usize, n: usize, seed: u64, lk: f64) -> (Array2<f64>, Vec<f64>) {
    let k = m.min(n);
    let a = with_spectrum(m, n, &spectrum(k, 10f64.powf(lk), seed), seed);
    let sv = singular_values(a.view(), SvdDriver::QrIteration)
        .unwrap()
        .to_vec();
    (a, sv)
}

/// The error bound of a converged power (or inverse) iteration value σ̂ = √λ against the SVD's σ:
/// the reported relative residual ρ = ‖Mv − λv‖/λ of M = AᵀA (or RᵀR) was computed with rounding
/// ≤ 2γ_{m+n}·‖A‖_F² (the two products, |fl(AᵀAv) − AᵀAv| ≤ γ_{m+n}|Aᵀ||A||v|, and λ's inner
/// product), so some eigenvalue of M is within ρλ + 2γ_{m+n}‖A‖_F² of λ (symmetric residual
/// bound, Parlett Thm 4.5.1); it is the extreme one here (the spectrum's gap 2 : ≤ 1 and 0.05 : ≥
/// 0.1 far exceeds that distance). So |σ̂ − σ| ≤ (ρλ + 2γ‖A‖_F²)/σ̂, plus `extra` (the QR's
/// backward error for the inverse iteration), the unscaling by ‖A‖_F (2u·‖A‖_F: the iteration
/// runs on A/‖A‖_F) and the reference SVD's 30·max(m,n)·ε·σ₁.
fn power_tol(a: &Array2<f64>, s1: f64, value: f64, residual: f64, extra: f64) -> f64 {
    let (m, n) = a.dim();
    let f = fro(a);
    let lambda = value * value;
    (residual * lambda + 2.0 * gamma(m + n) * f * f) / value
        + extra
        + 2.0 * U64 * f
        + svd_rel(m, n, f64::EPSILON) * s1
}

proptest! {
    #![proptest_config(kappa_testkit::config(24))]

    #[test]
    fn lanczos_kappa_matches_svd_from_below((m, n, seed) in (1usize..60, 1usize..20, any::<u64>()), lk in 0.0f64..4.0) {
        // The claim (docs/linalg.md, "Conventions", Iterative estimates): a lower bound always;
        // within the residual band of κ whenever the extreme Ritz values found σ₁ and σ_k;
        // misconvergence onto an inner σ is possible (kept: `misconvergence_*` below) and rare.
        let (a, sv) = lanczos_draw(m, n, seed, lk);
        let e = condition_number_estimate(a.view(), IterativeOptions::default()).unwrap();
        prop_assert!(e.converged, "{e:?}");
        kappa_claims(&a, &sv, &e).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn error_estimate_rule_finds_singular_values_to_the_requested_tolerance(
        (m, n, seed) in (2usize..48, any::<u64>()).prop_flat_map(|(n, seed)| (n..(6 * n).max(n + 1), Just(n), Just(seed))),
        lk in 0.0f64..4.0,
        family in 0usize..3,
        tol in prop::sample::select(vec![1e-2, 1e-3, 1e-4]),
    ) {
        // Graded (log-uniform σ, κ up to 1e4), Gaussian, and clustered extremes (three σ within
        // relative width tol/4 at both ends, κ up to 1e4).
        let k = m.min(n);
        let a = match family {
            0 => with_spectrum(m, n, &spectrum(k, 10f64.powf(lk), seed), seed),
            1 => gaussian(m, n, seed),
            _ => with_spectrum(m, n, &clustered(&spectrum(k, 10f64.powf(lk), seed), 3, tol / 4.0), seed),
        };
        let sv = singular_values(a.view(), SvdDriver::QrIteration).unwrap();
        let sv = sv.as_slice().unwrap();
        let exact = sv[0] / sv[k - 1];
        let e = condition_number_estimate(a.view(), estimate_rule(tol)).unwrap();
        // The stopping rule itself (exact logic, no rounding in the comparison).
        prop_assert!(e.converged && e.error_estimate <= tol, "{e:?}");
        // A lower bound up to rounding (see `rounding_slack`).
        let slack = rounding_slack(&a, sv);
        prop_assert!(e.kappa <= exact * (1.0 + slack), "κ̂ = {} > κ = {exact}", e.kappa);
        // The two Ritz values it stopped at are singular values of A to the requested relative
        // accuracy (together). That they are the *extreme* ones is what no Krylov method can
        // promise (misconvergence, see the docs); the Gaussian test below checks κ itself.
        // The band is the documented heuristic claim of the rule (docs/linalg.md, "Conventions",
        // Iterative estimates: "the Ritz values it stops at are singular values to tol"), plus
        // the reference SVD's error 30·max(m,n)·ε·σ₁ on each distance (relative to θ).
        let distance = |t: f64| distance_to_nearest(sv, t) / t;
        let found = distance(e.sigma_max) + distance(e.sigma_min);
        let r = svd_rel(m, n, f64::EPSILON) * sv[0];
        let band = tol + r / e.sigma_max + r / e.sigma_min;
        prop_assert!(found <= band, "distance {found:.2e} > {band:e}: {e:?}");
    }

    #[test]
    fn power_and_inverse_iteration_find_extreme_singular_values((m, n, seed) in (1usize..40, 1usize..12, any::<u64>())) {
        // A gap between σ₁ and σ₂ (and σ_k and σ_{k−1}) keeps the linear convergence fast.
        let k = m.min(n);
        let mut s = spectrum(k, 10.0, seed);
        s[0] = 2.0;
        if k > 1 {
            s[k - 1] = 0.05;
        }
        let a = with_spectrum(m, n, &s, seed);
        let sv = singular_values(a.view(), SvdDriver::QrIteration).unwrap();
        let p = sigma_max_power(a.view(), tight()).unwrap();
        prop_assert!(p.converged);
        let tol = power_tol(&a, sv[0], p.value, p.residual, 0.0);
        prop_assert!((p.value - sv[0]).abs() <= tol, "{} vs {} (tol {tol:e})", p.value, sv[0]);
        let q = sigma_min_inverse(a.view(), tight()).unwrap();
        prop_assert!(q.converged);
        // R is the exact factor of A + E, ‖E‖₂ ≤ 30·max(m,n)·ε·‖A‖_F (Householder QR, Higham
        // Thm 19.4; the constant a choice, the documented SVD one): σ_k(R) within ‖E‖ of σ_k(A).
        let qr = svd_rel(m, n, f64::EPSILON) * fro(&a);
        let tol = power_tol(&a, sv[0], q.value, q.residual, qr);
        prop_assert!((q.value - sv[k - 1]).abs() <= tol, "{} vs {} (tol {tol:e})", q.value, sv[k - 1]);
    }
}

#[test]
fn tall_gaussian_estimate_is_within_one_percent() {
    // The benchmark asks for 1 % (docs/linalg.md, "Performance", `kappa_estimate_f64`); the
    // derived claim is tighter: this fixed input's estimate finds the extremes, so
    // `kappa_claims`' residual band holds.
    let a: Array2<f64> = gaussian(2048, 128, 11);
    let sv = singular_values(a.view(), SvdDriver::QrIteration)
        .unwrap()
        .to_vec();
    let e = condition_number_estimate(a.view(), IterativeOptions::default()).unwrap();
    assert!(e.converged, "{e:?}");
    assert_eq!(kappa_claims(&a, &sv, &e), Ok(false), "{e:?}");
    assert!((e.kappa - sv[0] / sv[127]).abs() <= 1e-2 * sv[0] / sv[127]);
    assert!(e.iterations < 128, "{e:?}");
    // Wide inputs are handled through the transpose.
    let w = a.t().to_owned();
    let ew = condition_number_estimate(w.view(), IterativeOptions::default()).unwrap();
    assert_eq!(kappa_claims(&w, &sv, &ew), Ok(false), "{ew:?}");
}

#[test]
fn rank_deficient_and_zero_inputs() {
    let l: Array2<f64> = gaussian(30, 3, 1);
    let r: Array2<f64> = gaussian(3, 8, 2);
    let a = l.dot(&r);
    let e = condition_number_estimate(a.view(), IterativeOptions::default()).unwrap();
    assert_eq!(e.kappa, f64::INFINITY, "{e:?}");
    // fl(L·R) has σ₄.. ≤ ‖fl(LR) − LR‖₂ ≤ γ₃·‖|L||R|‖_F; the QR's backward error adds
    // 30·max(m,n)·ε·‖A‖_F (choice: the SVD constant), and a converged inverse iteration is within
    // its residual of that (relative ρ ≤ tol, so a factor 1 + tol).
    let q = sigma_min_inverse(a.view(), IterativeOptions::default()).unwrap();
    let abs_lr = l.mapv(f64::abs).dot(&r.mapv(f64::abs));
    let bound = (gamma(3) * fro(&abs_lr) + svd_rel(30, 8, f64::EPSILON) * fro(&a)) * (1.0 + 1e-3);
    assert!(q.value <= bound, "{q:?} > {bound:e}");
    let z = Array2::<f64>::zeros((5, 4));
    assert_eq!(
        condition_number_estimate(z.view(), IterativeOptions::default())
            .unwrap()
            .kappa,
        f64::INFINITY
    );
    assert_eq!(
        sigma_max_power(z.view(), IterativeOptions::default())
            .unwrap()
            .value,
        0.0
    );
    assert_eq!(
        sigma_min_inverse(z.view(), IterativeOptions::default())
            .unwrap()
            .value,
        0.0
    );
}

#[test]
fn iteration_cap_reports_no_convergence() {
    let a: Array2<f64> = gaussian(200, 200, 5);
    let opts = IterativeOptions {
        tol: 1e-12,
        max_iter: 3,
        seed: 0,
        ..Default::default()
    };
    assert!(!condition_number_estimate(a.view(), opts).unwrap().converged);
    assert!(!sigma_max_power(a.view(), opts).unwrap().converged);
    // The error-estimate rule reports non-convergence the same way, with its estimate above tol.
    let capped = IterativeOptions {
        max_iter: 5,
        ..estimate_rule(1e-3)
    };
    let e = condition_number_estimate(a.view(), capped).unwrap();
    assert!(
        !e.converged && e.iterations == 5 && e.error_estimate > 1e-3,
        "{e:?}"
    );
    // A square Gaussian's σ_min sits at a dense edge: 40 steps are far from 1 %.
    let e = condition_number_estimate(
        a.view(),
        IterativeOptions {
            max_iter: 40,
            ..estimate_rule(1e-2)
        },
    )
    .unwrap();
    let (err, _) = kappa_error(
        &a,
        IterativeOptions {
            max_iter: 40,
            ..estimate_rule(1e-2)
        },
    );
    // Not a tolerance comparing two computations but a fact about this fixed input: after 40 of
    // ≈ 200 needed steps a square Gaussian's σ_min (at a dense edge) is far from found.
    assert!(
        !e.converged && err > 1e-2 && e.error_estimate > 1e-2,
        "{e:?}, error {err}"
    );
}

#[test]
fn error_estimate_rule_stops_earlier_than_the_residual_rule() {
    let a: Array2<f64> = gaussian(2048, 128, 11);
    let sv = singular_values(a.view(), SvdDriver::QrIteration)
        .unwrap()
        .to_vec();
    let (_, r) = kappa_error(
        &a,
        IterativeOptions {
            tol: 1e-2,
            ..Default::default()
        },
    );
    let (err_e, e) = kappa_error(&a, estimate_rule(1e-2));
    assert!(r.converged && e.converged, "{r:?} {e:?}");
    assert!(e.iterations < r.iterations, "{e:?} vs {r:?}");
    // Residual rule: the derived band (`kappa_claims`, extremes found); ErrorEstimate: its
    // documented heuristic band, tol (docs/linalg.md), plus the reference SVD's relative error
    // on κ (twice 30·max(m,n)·ε·σ₁/σ_k).
    assert_eq!(kappa_claims(&a, &sv, &r), Ok(false), "{r:?}");
    assert_eq!(kappa_claims(&a, &sv, &e), Ok(false), "{e:?}");
    let r_svd = 2.0 * svd_rel(2048, 128, f64::EPSILON) * sv[0] / sv[127];
    assert!(err_e <= 1e-2 + r_svd, "{err_e}");
    // The estimate is above the true error (it is meant to be; a fact about this input with a
    // wide margin: measured 3.5e-3 against 1.8e-4, docs/linalg.md, "Conventions", Iterative
    // estimates).
    assert!(e.error_estimate >= err_e, "{e:?} vs {err_e}");
    // A complete Krylov space is exact: estimate 0.
    let small: Array2<f64> = gaussian(30, 4, 2);
    let s = condition_number_estimate(small.view(), estimate_rule(1e-12)).unwrap();
    assert!(
        s.converged && s.error_estimate == 0.0 && s.iterations <= 4,
        "{s:?}"
    );
}

#[test]
fn huge_and_tiny_scales() {
    let a: Array2<f64> = gaussian(40, 10, 8);
    for alpha in [1e-200, 1e200] {
        let b = a.mapv(|x| x * alpha);
        let sv = singular_values(b.view(), SvdDriver::QrIteration)
            .unwrap()
            .to_vec();
        let e = condition_number_estimate(b.view(), IterativeOptions::default()).unwrap();
        // The residual band of `kappa_claims` (extremes found), in b's own units.
        assert_eq!(kappa_claims(&b, &sv, &e), Ok(false), "α = {alpha}: {e:?}");
        let p = sigma_max_power(b.view(), tight()).unwrap();
        assert!(p.value.is_finite() && p.value > 0.0);
    }
}

#[test]
fn one_pass_and_two_pass_products_give_the_same_estimate() {
    // A row-major tall A takes the fused one-pass step (Aᵀu_j recombined from AᵀA v_j); the same
    // matrix stored column-major takes two passes. Same Krylov space: same steps and κ̂, also for
    // ill-conditioned inputs where the fused step falls back to a direct product.
    for (lk, seed) in [(0.5, 1u64), (3.0, 2), (6.0, 3)] {
        let (m, n) = (400, 60);
        let a = with_spectrum(m, n, &spectrum(n, 10f64.powf(lk), seed), seed);
        let mut col_major = Array2::<f64>::zeros(a.raw_dim().f());
        col_major.assign(&a);
        assert!(a.is_standard_layout() && !col_major.is_standard_layout());
        for opts in [IterativeOptions::default(), estimate_rule(1e-2)] {
            let fused = condition_number_estimate(a.view(), opts).unwrap();
            let plain = condition_number_estimate(col_major.view(), opts).unwrap();
            assert_eq!(fused.iterations, plain.iterations, "{fused:?} vs {plain:?}");
            // Both found the extremes; each is then within the Kato–Temple bound of κ (below),
            // and within the rounding slack: they differ by at most the sum.
            let sv = singular_values(a.view(), SvdDriver::QrIteration)
                .unwrap()
                .to_vec();
            assert_eq!(kappa_claims(&a, &sv, &fused), Ok(false), "{fused:?}");
            assert_eq!(kappa_claims(&a, &sv, &plain), Ok(false), "{plain:?}");
            let tol =
                kato_temple(&sv, &fused) + kato_temple(&sv, &plain) + 2.0 * rounding_slack(&a, &sv);
            assert!(
                (fused.kappa - plain.kappa).abs() <= tol * plain.kappa,
                "κ = 1e{lk}: {fused:?} vs {plain:?} (tol {tol:e})"
            );
        }
    }
}

/// The Kato–Temple bound of κ̂'s relative error for an estimate whose Ritz values found σ₁ and
/// σ_k: for M = AᵀA the Ritz vector ṽ has Rayleigh quotient θ² and residual ‖Mṽ − θ²ṽ‖ = θ·ρθ
/// (ρ the reported relative residual), so |θ² − σ²| ≤ (ρθ²)²/g with g the distance from θ² to
/// the rest of the spectrum (Kato–Temple; Parlett Thm 10.2.1), taken from the SVD minus
/// |θ² − σ²|'s own residual bound. Each extreme's relative error in σ is |θ² − σ²|/(σ(θ + σ)).
fn kato_temple(sv: &[f64], e: &KappaEstimate<f64>) -> f64 {
    let k = sv.len();
    let one = |t: f64, i: usize| {
        let res = e.residual * t * t;
        let g = (0..k)
            .filter(|&j| j != i)
            .map(|j| (sv[j] * sv[j] - t * t).abs())
            .fold(f64::INFINITY, f64::min)
            - res;
        let d2 = if g > 0.0 {
            (res * res / g).min(res)
        } else {
            res
        };
        d2 / (sv[i] * (t + sv[i]))
    };
    let (a, b) = (one(e.sigma_max, 0), one(e.sigma_min, k - 1));
    (1.0 + a) / (1.0 - b) - 1.0
}

/// The counterexample of issue "lanczos at 500 cases": the property at 500 proptest cases (the
/// fixed seed) stops on this 5×5 draw (persisted in iterative.proptest-regressions): κ̂ =
/// 3.2665 for κ = 3.2826, 0.49 % low with residual < 1e-3 — σ̂_min sits on σ₄, not σ₅. Kept as
/// the named case of the misconvergence the claim allows.
#[test]
fn misconvergence_regression_5x5() {
    let (a, sv) = lanczos_draw(5, 5, 9882025448127972878, 0.51622099243487);
    let e = condition_number_estimate(a.view(), IterativeOptions::default()).unwrap();
    assert!(e.converged, "{e:?}");
    assert_eq!(kappa_claims(&a, &sv, &e), Ok(true), "{e:?} vs {sv:?}");
}

/// The 17×17 misconvergence of docs/linalg.md ("Conventions", Iterative estimates; found by a
/// random scan of that shape): κ̂ 0.34 % low with residual 4.3e-4, σ̂_min on σ₁₆.
#[test]
fn misconvergence_regression_17x17() {
    let (a, sv) = lanczos_draw(17, 17, 2099019525815302519, 1.850239531088362);
    let e = condition_number_estimate(a.view(), IterativeOptions::default()).unwrap();
    assert!(e.converged, "{e:?}");
    assert_eq!(kappa_claims(&a, &sv, &e), Ok(true), "{e:?} vs {sv:?}");
}

/// Misconvergence is rare: on 400 seeded draws of the property's distribution, at most 3 % — the
/// rate docs/linalg.md documents for the `Residual` rule (0–3 % per family) — misconverge, and
/// every draw satisfies `kappa_claims`. Measured: 0.1 % (3 of 3000 on a scan), so a count far
/// below the threshold: the verdict does not hinge on the last bits of one draw.
#[test]
fn misconvergence_is_rare() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x1a2c);
    let draws = 400;
    let mut missed = 0;
    for _ in 0..draws {
        let (m, n) = (rng.gen_range(1..60), rng.gen_range(1..20));
        let (seed, lk) = (rng.gen::<u64>(), rng.gen_range(0.0..4.0));
        let (a, sv) = lanczos_draw(m, n, seed, lk);
        let e = condition_number_estimate(a.view(), IterativeOptions::default()).unwrap();
        assert!(e.converged, "{e:?}");
        missed += kappa_claims(&a, &sv, &e).unwrap() as usize;
    }
    assert!(
        missed * 100 <= 3 * draws,
        "{missed} of {draws} misconverged"
    );
}
