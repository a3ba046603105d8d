//! Manifold Muon on the Oblique manifold (diag(WᵀW) = 1, docs/optim.md, "Oblique"): the
//! retraction lands on unit columns within its derived rounding bound, steps stay there, the
//! direction is tangent to the tolerance the dual reaches (n = 1: the first candidate is exact;
//! `feasible()`: to the derived projection bound), bad inputs are typed errors, and the serde
//! name is `oblique`.

use super::common::*;
use kappa_optim::manifold::*;
use kappa_optim::*;
use ndarray::Array2;
use proptest::prelude::*;

fn cfg(dual: DualAscent) -> ManifoldMuonConfig {
    ManifoldMuonConfig {
        lr: 0.02,
        msign: Msign::Exact,
        dual,
        momentum: Momentum::none(),
        ..ManifoldMuonConfig::paper(Manifold::Oblique)
    }
}

/// The bound on |‖x_j‖² − 1| of a retracted column as the test measures it (u = `u`, tall m
/// rows; retraction.rs, "Oblique"): the retraction scales W by 2^k exactly, computes
/// s = fl(‖y_j‖²) (≤ m rounded operations per term: s/‖y_j‖² is a product of ≤ m factors
/// (1 + δ)^{±1}), d = fl(√s), c = fl(1/d), casts c to the working type and rounds y_ij·c. In
/// ‖x_j‖² = Σ y_ij²·c²·(1 + δ_ij)² each of the four later roundings enters squared, so
/// ‖x_j‖²/1 is a product of ≤ m + 8 such factors: |‖x_j‖² − 1| ≤ γ_{m+8} (Higham, Lemma 3.1).
/// The test's own f64 sum of squares adds γ_m(u₆₄)·‖x_j‖².
fn oblique_bound(m: usize, u: f64) -> f64 {
    let g = |k: usize| k as f64 * u / (1.0 - k as f64 * u);
    let r = g(m + 8);
    r + gamma(m) * (1.0 + r)
}

/// max_j |‖w_j‖² − 1| in the tall orientation, in f64.
fn unit_column_error(w: &Array2<f64>) -> f64 {
    col_norms(w)
        .iter()
        .map(|d| (d * d - 1.0).abs())
        .fold(0.0, f64::max)
}

/// A Gaussian point retracted onto Oblique by the optimizer.
fn oblique_point(m: usize, n: usize, seed: u64) -> Array2<f64> {
    let mut w = gaussian(m, n, seed);
    ManifoldMuon::new(cfg(DualAscent::paper()))
        .unwrap()
        .retract_onto(&mut w)
        .unwrap();
    w
}

/// 2·(w_jᵀa_j) per column (tall), the diagonal of Diag(WᵀA + AᵀW).
fn tangency(w: &Array2<f64>, a: &Array2<f64>) -> Vec<f64> {
    let (w, a) = (tall(w), tall(a));
    (0..w.ncols())
        .map(|j| 2.0 * w.column(j).dot(&a.column(j)))
        .collect()
}

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn the_retraction_lands_on_unit_columns_and_keeps_their_directions(
        (m, n, seed) in shapes(),
        log_scale in -300.0f64..300.0,
    ) {
        let g = gaussian(m, n, seed) * 10f64.powf(log_scale);
        let mut w = g.clone();
        let opt = ManifoldMuon::new(cfg(DualAscent::paper())).unwrap();
        opt.retract_onto(&mut w).unwrap();
        let k = m.max(n);
        let tol = oblique_bound(k, U64);
        let e = unit_column_error(&w);
        prop_assert!(e <= tol, "max |‖w_j‖² − 1| = {e:e} > {tol:e}");
        // The reported measure is the same quantity computed by the library (its own γ_m).
        let v = opt.violation(&w).unwrap();
        prop_assert!(v <= tol, "violation {v:e} > {tol:e}");
        // Each column keeps its direction: w_j = g_j/‖g_j‖ entrywise to the same relative bound
        // (the entry is y_ij·c with c within γ_{m+8}/2 of 1/‖y_j‖, plus its own rounding).
        let (gt, wt) = (tall(&g), tall(&w));
        for j in 0..gt.ncols() {
            let c = gt.column(j);
            let s = c.iter().fold(0.0f64, |a, x| a.max(x.abs()));
            let unit: Vec<f64> = c.iter().map(|x| x / s).collect();
            let norm = unit.iter().map(|x| x * x).sum::<f64>().sqrt();
            for (i, x) in unit.iter().enumerate() {
                let want = x / norm;
                let d = (wt[[i, j]] - want).abs();
                prop_assert!(d <= 2.0 * tol * want.abs().max(f64::MIN_POSITIVE), "column {j}: {d:e}");
            }
        }
        // Idempotent to the same bound: a point on Oblique is (nearly) fixed.
        let mut again = w.clone();
        opt.retract_onto(&mut again).unwrap();
        prop_assert!(unit_column_error(&again) <= tol);
    }

    #[test]
    fn oblique_steps_stay_on_the_manifold_and_report_their_tangency((m, n, seed) in shapes()) {
        for dual in [DualAscent::paper().normalized(), DualAscent::feasible()] {
            let opt = ManifoldMuon::new(cfg(dual)).unwrap();
            let w0 = oblique_point(m, n, seed);
            let mut w = w0.clone();
            let g = gaussian(m, n, seed ^ 5);
            let step = opt.step(&mut w, &g, &mut ManifoldState::new()).unwrap();
            let k = m.max(n);
            let tol = oblique_bound(k, U64);
            prop_assert!(unit_column_error(&w) <= tol, "{}", unit_column_error(&w));
            prop_assert!(step.manifold_violation <= tol);
            // The reported violation ‖Diag(WᵀA + AᵀW)‖_F/n is the one measured here: both are
            // length-k inner products w_jᵀa_j, each within γ_k·‖w_j‖·‖a_j‖ (‖w_j‖² ≤ 1 + tol,
            // ‖a_j‖ ≤ ‖A‖₂ ≤ 1 + e, e = 1e-3 covering the projected band and the exact σ).
            let h = tangency(&w0, &step.direction);
            let nn = m.min(n) as f64;
            let measured = h.iter().map(|x| x * x).sum::<f64>().sqrt() / nn;
            let agree = 2.0 * 2.0 * gamma(k) * (1.0 + tol) * (1.0 + 1e-3) / nn.sqrt();
            prop_assert!((measured - step.dual.violation).abs() <= agree,
                "reported {} vs measured {measured}", step.dual.violation);
            prop_assert!(step.dual.descent > 0.0, "{:?}", step.dual);
            if step.dual.projected {
                prop_assert!(step.dual.violation <= feasible_bound(&w0, &g, &opt, &step.dual),
                    "feasible violation {}", step.dual.violation);
            } else if dual.project {
                // Not projected only when the ascent converged (dual.rs): below its stop test.
                prop_assert!(step.dual.converged && step.dual.violation < dual.tol, "{:?}", step.dual);
            } else {
                // A convergence band, not rounding: the ascent ends below its start, unflagged.
                prop_assert!(!step.dual.diverged, "{:?}", step.dual);
                prop_assert!(step.dual.violation <= step.dual.initial_violation);
            }
        }
    }

    #[test]
    fn one_column_is_solved_by_the_first_candidate(m in 2usize..64, seed in any::<u64>()) {
        // n = 1 (dual.rs, "Oblique"): Z₀ = g − w(wᵀg) is tangent and msign(Z₀) = Z₀/‖Z₀‖ keeps
        // it so: the ascent converges at k = 0 with one msign.
        let w = oblique_point(m, 1, seed);
        let g = gaussian(m, 1, seed ^ 7);
        let opt = ManifoldMuon::new(cfg(DualAscent::paper())).unwrap();
        let (a, r) = opt.direction(&w, &g).unwrap();
        // Rounding of the candidate's tangency: λ₀ = −½·fl(wᵀg) (γ_m·‖g‖), Z₀'s entries (2u
        // relative to |g_i| + |2w_iλ| ≤ 2‖g‖), the exact msign of an m×1 column (svd_err), and
        // the reported inner product (γ_m): |wᵀa| ≤ (γ_m + 4u)·‖g‖·(1 + tol)/‖Z₀‖ + svd_err +
        // γ_m, and the violation is 2|wᵀa|/n.
        let gn = fro(&g);
        let z0 = &g - &(&w * w.column(0).dot(&g.column(0)));
        let tol = oblique_bound(m, U64);
        let bound = 2.0 * ((gamma(m) + 4.0 * U64) * gn * (1.0 + tol) / fro(&z0)
            + svd_err(m, 1) + gamma(m));
        prop_assert!(r.violation <= bound, "violation {:e} > {bound:e}", r.violation);
        prop_assert!(bound < DualAscent::paper().tol, "bound {bound:e} above the stop test");
        prop_assert!(r.converged && r.msign_calls == 1, "{r:?}");
        prop_assert!((fro(&a) - 1.0).abs() <= 2.0 * svd_err(m, 1));
        // And it is Z₀'s direction: the descent ⟨g, a⟩ = ‖Z₀‖ (the optimum for one column).
        prop_assert!((r.descent - fro(&z0)).abs() <= 4.0 * (svd_err(m, 1) + gamma(m)) * gn);
    }
}

/// The derived bound on `feasible()`'s reported violation on Oblique (dual.rs, "Oblique"; the
/// general form is docs/optim.md, "Bands of the feasible directions"). The direction is
/// A = Y/ν, Y = X − 2W·S with X the ascent's last candidate or the normalized gradient G' and S
/// from conjugate gradients on op = 2·diag(‖w_j‖²) = 2(1 ± tol)·I: per column
/// |w_jᵀy_j| ≤ |r_j| + (2γ_m + 8u)·‖x_j‖ (the CG residual r; the computed r₀ = fl(w_jᵀx_j) and
/// the operator's diagonal (γ_m each), the two roundings of y_ij = x_ij − 2w_ij·S_j with
/// |S_j| ≤ ‖x_j‖(1 + tol)/2 (4u), the CG updates (4u)), CG stopping at ‖r‖_F ≤ 1e-14·‖r₀‖_F
/// ≤ 1e-14·√n·max‖x_j‖(1 + tol) (its test; one step reaches it, the operator being 2(1 ± tol)·I
/// with tol ≤ 1e-14 here), then ν ≥ ‖Y‖₂·(1 − e) (the estimate, e ≤ 1e-10 for these sizes:
/// n·(γ_m/2 + γ_n)), and the reported inner product adds γ_m(1 + e). X is not observable, so the
/// bound takes the worse of both: max‖x_j‖ over the candidate (the same ascent without the
/// projection, run here) and G', and min over both of ‖P_T X‖₂ (computed exactly here, column by
/// column: P_T X = X − W·diag(w_jᵀx_j/‖w_j‖²)). Violation = ‖H‖_F/n ≤ 2√n·max|w_jᵀa_j|/n.
fn feasible_bound(w: &Array2<f64>, g: &Array2<f64>, opt: &ManifoldMuon, r: &DualReport) -> f64 {
    let (w, g) = (tall(w), tall(g));
    let (m, n) = w.dim();
    let plain = DualAscent {
        project: false,
        ..opt.config().dual
    };
    let (cand, _) = tangent_direction(
        &w,
        &g,
        Projector::Diagonal,
        &plain,
        Msign::Exact,
        Precision::Native,
        false,
    )
    .unwrap();
    let scaled = &g * r.gradient_scale;
    let project = |x: &Array2<f64>| {
        let mut p = x.clone();
        for j in 0..n {
            let wj = w.column(j);
            let c = wj.dot(&x.column(j)) / wj.dot(&wj);
            let mut pj = p.column_mut(j);
            pj.scaled_add(-c, &wj);
        }
        p
    };
    let col_max = |x: &Array2<f64>| col_norms(x).into_iter().fold(0.0, f64::max);
    let x_max = col_max(&cand).max(col_max(&scaled));
    let nu = spectral(&project(&cand)).min(spectral(&project(&scaled)));
    let tol = oblique_bound(m, U64);
    let e = n as f64 * (gamma(m) / 2.0 + gamma(n));
    let nf = n as f64;
    let per_column = ((2.0 * gamma(m) + 8.0 * U64) * x_max
        + 1e-14 * nf.sqrt() * x_max * (1.0 + tol))
        / (nu * (1.0 - e))
        + gamma(m) * (1.0 + e);
    2.0 * nf.sqrt() * per_column / nf
}

#[test]
fn bad_inputs_are_typed_errors() {
    let opt = ManifoldMuon::new(cfg(DualAscent::paper())).unwrap();
    // A zero column (tall orientation) has no direction: ZeroColumn naming it, W unchanged.
    let mut w = gaussian(8, 3, 1);
    w.column_mut(1).fill(0.0);
    let before = w.clone();
    match opt.retract_onto(&mut w) {
        Err(OptimError::ZeroColumn {
            arg: "w",
            column: 1,
            relative_norm,
        }) => {
            assert_eq!(relative_norm, 0.0)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(w, before);
    // Wide: the tall orientation's column 2 is row 2.
    let mut wide = gaussian(3, 8, 2);
    wide.row_mut(2).fill(0.0);
    assert!(matches!(
        opt.retract_onto(&mut wide),
        Err(OptimError::ZeroColumn { column: 2, .. })
    ));
    // The zero matrix: column 0.
    let mut z = Array2::<f64>::zeros((5, 2));
    assert!(matches!(
        opt.retract_onto(&mut z),
        Err(OptimError::ZeroColumn { column: 0, .. })
    ));
    // Below the floor (2⁻⁵⁰·‖W‖_F, up to the scaling band's factor 2): a column 2⁻⁵² as large
    // is refused, one 2⁻⁴⁸ as large is normalized (its squared norm is still a normal f64).
    for (p, refused) in [(-52, true), (-48, false)] {
        let mut w = gaussian(8, 3, 3);
        w.column_mut(0).mapv_inplace(|x| x * 2f64.powi(p));
        let r = opt.retract_onto(&mut w);
        assert_eq!(
            matches!(r, Err(OptimError::ZeroColumn { column: 0, .. })),
            refused,
            "2^{p}: {r:?}"
        );
        if !refused {
            assert!(unit_column_error(&w) <= oblique_bound(8, U64));
        }
    }
    // NaN: the input error, never a NaN result.
    let mut w = gaussian(6, 2, 4);
    w[[3, 1]] = f64::NAN;
    assert!(matches!(
        opt.retract_onto(&mut w),
        Err(OptimError::Input(InputError::NonFinite { arg: "w", .. }))
    ));
    let w = oblique_point(6, 2, 5);
    let mut g = gaussian(6, 2, 6);
    g[[0, 0]] = f64::NAN;
    let mut w1 = w.clone();
    let r = opt.step(&mut w1, &g, &mut ManifoldState::new());
    assert!(
        matches!(
            r,
            Err(OptimError::Input(InputError::NonFinite { arg: "grad", .. }))
        ),
        "{r:?}"
    );
    assert_eq!(w1, w);
    // Off the manifold at the first step (a Gaussian init, or a zero column): NotOnManifold.
    for bad in [gaussian(6, 2, 7), {
        let mut b = w.clone();
        b.column_mut(0).fill(0.0);
        b
    }] {
        let mut b1 = bad.clone();
        let r = opt.step(&mut b1, &gaussian(6, 2, 8), &mut ManifoldState::new());
        assert!(
            matches!(
                r,
                Err(OptimError::NotOnManifold {
                    manifold: "Oblique",
                    ..
                })
            ),
            "{r:?}"
        );
        assert_eq!(b1, bad);
    }
}

#[test]
fn the_serde_name_is_oblique_and_old_names_still_read() {
    assert_eq!(
        serde_json::to_string(&Manifold::Oblique).unwrap(),
        r#""oblique""#
    );
    assert_eq!(
        serde_json::from_str::<Manifold>(r#""oblique""#).unwrap(),
        Manifold::Oblique
    );
    assert_eq!(Manifold::Oblique.name(), "Oblique");
    assert_eq!(Manifold::Oblique.projector(), Projector::Diagonal);
    assert_eq!(
        serde_json::to_string(&Projector::Diagonal).unwrap(),
        r#""diagonal""#
    );
    let c = ManifoldMuonConfig::paper(Manifold::Oblique);
    let back: ManifoldMuonConfig =
        serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
    // The existing names are unchanged (old configs read as before).
    assert_eq!(
        serde_json::to_string(&Manifold::Stiefel).unwrap(),
        r#""stiefel""#
    );
    assert_eq!(
        serde_json::to_string(&Manifold::dgram()).unwrap(),
        r#"{"dgram":"paper"}"#
    );
}
