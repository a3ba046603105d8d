//! Properties 3–9 of docs/optim.md, "Properties → tests": manifold Muon on Stiefel and DGram — on-manifold after the step, tangency, the step's
//! spectral norm, the square closed form, the shared code path, the dual objective, and both
//! DGram retractions (including the paper's column-scale swap).

use super::common::*;
use kappa_optim::manifold::*;
use kappa_optim::*;
use ndarray::Array2;
use proptest::prelude::*;

fn exact_cfg(manifold: Manifold, lr: f64) -> ManifoldMuonConfig {
    ManifoldMuonConfig {
        lr,
        msign: Msign::Exact,
        dual: DualAscent::paper().normalized(),
        momentum: Momentum::none(),
        ..ManifoldMuonConfig::paper(manifold)
    }
}

/// A point on DGram: orthonormal columns scaled by descending norms in [0.5, 2].
fn dgram_point(m: usize, n: usize, seed: u64) -> Array2<f64> {
    let (r, c) = (m.max(n), m.min(n));
    let mut q = orthonormal(r, c, seed);
    for (j, mut col) in q.columns_mut().into_iter().enumerate() {
        col *= 2.0 - 1.5 * j as f64 / c as f64;
    }
    if m < n {
        q.t().to_owned()
    } else {
        q
    }
}

/// κ(Z₀) of the Stiefel ascent's start, Z₀ = G − W·sym(WᵀG) (Λ₀ = −¼(WᵀG + GᵀW)), tall.
fn kappa_z0(w: &Array2<f64>, g: &Array2<f64>) -> f64 {
    let (w, g) = (tall(w), tall(g));
    let s = w.t().dot(&g);
    let z0 = &g - &w.dot(&((&s + &s.t()) * 0.5));
    let sz = sv(&z0);
    sz[0] / sz[sz.len() - 1]
}

fn stiefel_point(m: usize, n: usize, seed: u64) -> Array2<f64> {
    let q = orthonormal(m.max(n), m.min(n), seed);
    if m < n {
        q.t().to_owned()
    } else {
        q
    }
}

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn stiefel_steps_stay_on_the_manifold_with_step_norm_lr((m, n, seed) in shapes()) {
        let opt = ManifoldMuon::new(exact_cfg(Manifold::Stiefel, 0.02)).unwrap();
        let w0 = stiefel_point(m, n, seed);
        let mut w = w0.clone();
        let g = gaussian(m, n, seed ^ 3);
        let step = opt.step(&mut w, &g, &mut ManifoldState::new()).unwrap();
        // The retraction is an exact msign: its SVD vectors are orthonormal to svd_err whatever
        // W − ηA's conditioning (common.rs, orthonormality_tol); the reported measure divides by √n.
        let tol = orthonormality_tol(m, n);
        prop_assert!(stiefel_error(&w) <= tol, "‖WᵀW − I‖_F = {} > {tol:e}", stiefel_error(&w));
        prop_assert!(step.manifold_violation <= tol / (m.min(n) as f64).sqrt());
        // Tangency (normalized dual: well scaled) is a convergence band, not a rounding
        // tolerance, and on these small Gaussian shapes not a fact: the K = 20 ascent needs
        // ~κ(Z₀) iterations (dual.rs, "Traps") and stopped above 1e-3 on 40×12 at κ(Z₀) = 3.91
        // (4.4e-3; the named regression below) and at κ(Z₀) = 3.20 (1.07e-3), both found by
        // exploring (the old premise "aspect ≥ 3" was a proxy; κ(Z₀) is not sufficient either).
        // What holds for every draw: the ascent is not flagged diverged and ends below its start.
        // The 1e-3 band is asserted where it is documented, 96×32 (docs/optim.md property 4,
        // tall_stiefel_direction_is_tangent_when_well_scaled), and for square shapes (closed form).
        if m == n {
            prop_assert!(step.dual.violation <= 1e-3, "violation {}", step.dual.violation);
        } else {
            prop_assert!(!step.dual.diverged && step.dual.violation < step.dual.initial_violation, "{:?}", step.dual);
        }
        if step.dual.violation <= 1e-4 {
            // docs/optim.md property 5 (a band of the method: the retraction's second-order
            // move and the normal part of a not-quite-tangent A, ‖S‖_F = n·violation/2 ≤ 1.2e-3).
            let r = spectral(&(&w - &w0)) / 0.02;
            prop_assert!((1.0 - 1e-3..=1.0 + 1e-2).contains(&r), "‖ΔW‖₂/η = {r}");
        }
        // The constrained descent never beats Muon's ‖G‖_* (Hölder: ⟨G, A⟩ ≤ ‖G‖_*·‖A‖₂): up to
        // ‖A‖₂ − 1 (the exact msign's σ, 2·svd_err) and the rounding of the two length-mn inner
        // products ⟨G, A⟩ and ⟨G, msign G⟩ (γ_mn·‖G‖_F·‖A‖_F ≤ γ_mn·√n·‖G‖_* each).
        let ratio = step.dual.descent_ratio.unwrap();
        let ratio_tol = 2.0 * svd_err(m, n) + 2.0 * gamma(m * n) * (m.min(n) as f64).sqrt();
        // > 0.5: a band (docs/optim.md property 8), not a rounding tolerance.
        prop_assert!(ratio <= 1.0 + ratio_tol && ratio > 0.5, "descent ratio {ratio}");
    }

    #[test]
    fn tall_stiefel_direction_is_tangent_when_well_scaled(seed in any::<u64>(), log_scale in -4.0f64..1.0) {
        // Normalizing G makes convergence independent of its scale (docs/optim.md, "Traps").
        let (m, n) = (96, 32);
        let w = orthonormal(m, n, seed);
        let g = gaussian(m, n, seed ^ 9) * 10f64.powf(log_scale);
        let opt = ManifoldMuon::new(exact_cfg(Manifold::Stiefel, 0.02)).unwrap();
        let (a, r) = opt.direction(&w, &g).unwrap();
        prop_assert!(r.violation <= 1e-3, "violation {}", r.violation);
        prop_assert!(!r.diverged);
        // A = exact msign: σ = 1 to its SVD's orthonormality, plus the check's backward error.
        prop_assert!((spectral(&a) - 1.0).abs() <= 4.0 * svd_err(m, n));
        // The dual objective improves from its start (well-scaled ascent).
        prop_assert!(r.dual_objective.last().unwrap() >= r.dual_objective.first().unwrap());
        prop_assert!(r.descent_ratio.unwrap() > 0.85);
    }

    #[test]
    fn square_stiefel_closed_form_equals_the_first_candidate(n in 4usize..32, seed in any::<u64>()) {
        let w = orthonormal(n, n, seed);
        let g = gaussian(n, n, seed ^ 1);
        let closed = stiefel_square_direction(&w, &g, Msign::Exact, Precision::Native).unwrap();
        let cfg = ManifoldMuonConfig { square_closed_form: false, ..exact_cfg(Manifold::Stiefel, 0.02) };
        let (a, r) = ManifoldMuon::new(cfg).unwrap().direction(&w, &g).unwrap();
        // Z₀ = ½W(WᵀG − GᵀW) only up to rounding: W orthogonal to svd_err, the products WᵀG,
        // W·Λ₀ (length n: γ_n each, relative to ‖G‖_F), so the two msign inputs differ by
        // rel = 2·svd_err + 3·γ_n relative, and their polar factors by the polar perturbation
        // at σ_r, the smallest non-zero σ of the skew part (odd n: one σ is 0, kept at 0 by both;
        // msign.rs, "Zero singular values") — plus each side's own svd_err.
        let s = w.t().dot(&g);
        let skew = &s - &s.t();
        let ss = sv(&skew);
        let s_r = ss[if n % 2 == 1 { n - 2 } else { n - 1 }];
        let rel = 2.0 * svd_err(n, n) + 3.0 * gamma(n);
        let tol = polar_perturbation(fro(&skew), s_r, rel) + 2.0 * svd_err(n, n);
        // The violation ‖WᵀA + AᵀW‖_F/n of A = W·X + ΔA: 2‖ΔA‖_F (ΔA within `tol` per entry:
        // ≤ n·tol in Frobenius) plus W's own non-orthogonality and the product's rounding.
        let v_tol = (2.0 * n as f64 * tol + 2.0 * orthonormality_tol(n, n)) / n as f64;
        // Odd n: the ascent's Z₀ = G + 2W·Λ₀ is ½W·skew only up to the rounding of cancelling
        // G's normal part, so its null σ is rounding, ≈ u·‖G‖_F, not 0; where that exceeds
        // msign's rank threshold τ = σ₁·n·ε (msign.rs, "Zero singular values") the first
        // candidate is the completed polar factor, violation exactly 2/n, and the ascent goes on
        // (found by exploring: n = 5, seed = 4455729575508624075, initial violation 0.4 = 2/5,
        // 5 msign calls). Which side of τ a rounding falls on is not a fact about the code, so
        // for odd n either outcome is accepted, each with its own assertions; the closed form
        // (exactly skew input) never completes.
        let completed = n % 2 == 1 && (r.initial_violation - 2.0 / n as f64).abs() <= v_tol;
        if completed {
            prop_assert!(r.msign_calls > 1 && r.violation < r.initial_violation, "{r:?}");
        } else {
            prop_assert!(max_abs_diff(&a, &closed) <= tol, "{} > {tol:e}", max_abs_diff(&a, &closed));
            prop_assert!(r.initial_violation <= v_tol, "{} > {v_tol:e}", r.initial_violation);
            // "Stops at k = 0" follows where the rounding bound is below the stop tolerance.
            if v_tol < cfg.dual.tol {
                prop_assert_eq!(r.msign_calls, 1, "the ascent stops at k = 0");
            }
        }
        let (_, rc) = ManifoldMuon::new(exact_cfg(Manifold::Stiefel, 0.02)).unwrap().direction(&w, &g).unwrap();
        prop_assert_eq!(rc.msign_calls, 1);
        prop_assert!(rc.violation <= v_tol, "{} > {v_tol:e}", rc.violation);
    }

    #[test]
    fn both_manifolds_share_one_code_path((m, n, seed) in shapes()) {
        // The optimizer's direction equals the bare ascent with the manifold's projector, bit
        // for bit; DGram is Stiefel with P = Off.
        let (m, n) = (m.max(n), m.min(n));
        if m == n {
            return Ok(());
        }
        let w = dgram_point(m, n, seed);
        let g = gaussian(m, n, seed ^ 2);
        for (manifold, proj) in [(Manifold::Stiefel, Projector::Identity), (Manifold::dgram(), Projector::OffDiagonal)] {
            let cfg = exact_cfg(manifold, 0.02);
            let (a, r) = ManifoldMuon::new(cfg).unwrap().direction(&w, &g).unwrap();
            let (b, rb) = tangent_direction(&w, &g, proj, &cfg.dual, cfg.msign, cfg.precision, true).unwrap();
            prop_assert_eq!(a, b);
            prop_assert_eq!(r, rb);
        }
    }

    #[test]
    fn dgram_steps_keep_columns_orthogonal((m, n, seed) in shapes()) {
        for retraction in [DGramRetraction::Paper, DGramRetraction::ColumnNorms] {
            let opt = ManifoldMuon::new(exact_cfg(Manifold::DGram(retraction), 0.02)).unwrap();
            let w0 = dgram_point(m, n, seed);
            let mut w = w0.clone();
            let g = gaussian(m, n, seed ^ 4);
            let mut st = ManifoldState::new();
            for _ in 0..3 {
                opt.step(&mut w, &g, &mut st).unwrap();
            }
            // Both retractions are Q·D with Q from an exact msign (orthonormal to svd_err):
            // Off(WᵀW) = D·Off(QᵀQ)·D, so d_max²·orthonormality_tol.
            let d_max = col_norms(&w).into_iter().fold(0.0, f64::max);
            let tol = d_max * d_max * orthonormality_tol(m, n);
            prop_assert!(off_diag(&w) <= tol, "{retraction:?}: ‖Off(WᵀW)‖_F = {} > {tol:e}", off_diag(&w));
            // Column norms (= σ) move by at most about the total step 3η (norms are sorted and
            // separated by more than 2·3η, so the paper's retraction does not swap them).
            let (d0, d1) = (col_norms(&w0), col_norms(&w));
            let worst = d0.iter().zip(&d1).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            prop_assert!(worst <= 3.0 * 0.02 * 1.05, "{retraction:?}: column norm moved {worst}");
        }
    }
}

#[test]
fn a_tall_but_stiff_stiefel_ascent_stops_short() {
    // The explore counterexample of stiefel_steps_stay_on_the_manifold_with_step_norm_lr
    // (manifold.proptest-regressions): aspect 40/12 ≥ 3 but κ(Z₀) = 3.91, and the normalized
    // K = 20 ascent ends at violation 4.4e-3 (history 6.4e-2 → 1.8e-1 → 4.4e-3: still descending).
    // A fact about the ascent, not rounding: it stops short while still descending (the last
    // violations decrease), not diverged. (K = 40 with the same linear decay only gets to 1.3e-3:
    // the stiffness, not the budget, sets it.)
    let (m, n, seed) = (40, 12, 10038269337903863962u64);
    let w = stiefel_point(m, n, seed);
    let g = gaussian(m, n, seed ^ 3);
    assert!(kappa_z0(&w, &g) > 3.8);
    let (_, r) = ManifoldMuon::new(exact_cfg(Manifold::Stiefel, 0.02))
        .unwrap()
        .direction(&w, &g)
        .unwrap();
    assert!(
        r.violation > 1e-3 && r.violation < r.initial_violation && !r.diverged,
        "{r:?}"
    );
    let v = &r.violations;
    assert!(v[v.len() - 1] < v[v.len() - 2], "{v:?}");
}

#[test]
fn the_paper_dgram_retraction_swaps_unsorted_column_norms() {
    let (m, n) = (40, 6);
    let q = orthonormal(m, n, 5);
    let sorted = [2.0, 1.6, 1.2, 0.9, 0.6, 0.3];
    let unsorted = [0.3, 1.6, 2.0, 0.9, 1.2, 0.6];
    let scaled = |d: &[f64]| {
        let mut w = q.clone();
        for (j, mut c) in w.columns_mut().into_iter().enumerate() {
            c *= d[j];
        }
        w
    };
    let paper = ManifoldMuon::new(exact_cfg(Manifold::dgram(), 0.02)).unwrap();
    let colnorm = ManifoldMuon::new(exact_cfg(
        Manifold::DGram(DGramRetraction::ColumnNorms),
        0.02,
    ))
    .unwrap();
    // Sorted norms: both retractions are the identity on DGram. W = Q·D (Q orthonormal to
    // svd_err): the retraction's SVD moves its polar factor by the polar perturbation at
    // σ_min = d_min (backward error 2·svd_err: Q's own and the SVD's) and its σ by svd_err·‖W‖_F;
    // times d_max, plus the rounding of Q·D.
    let (d_max, d_min) = (2.0, 0.3);
    let w_fro = sorted.iter().map(|d| d * d).sum::<f64>().sqrt();
    let tol =
        d_max * polar_perturbation(w_fro, d_min, 2.0 * svd_err(m, n)) + 2.0 * svd_err(m, n) * w_fro;
    for opt in [&paper, &colnorm] {
        let w = scaled(&sorted);
        let mut r = w.clone();
        opt.retract_onto(&mut r).unwrap();
        assert!(
            max_abs_diff(&r, &w) <= tol,
            "{} > {tol:e}",
            max_abs_diff(&r, &w)
        );
    }
    // Unsorted: the paper's retraction returns Q·diag(sorted D) — the scales are permuted.
    let w = scaled(&unsorted);
    let mut r = w.clone();
    paper.retract_onto(&mut r).unwrap();
    assert!(max_abs_diff(&r, &scaled(&sorted)) <= tol);
    // The jump, exactly: ‖Q·(D_sorted − D)‖_F/‖Q·D‖_F = ‖sorted − unsorted‖₂/‖d‖₂ (Q orthonormal).
    let jump = sorted
        .iter()
        .zip(&unsorted)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f64>()
        .sqrt()
        / w_fro;
    // Entries within `tol`: ‖Δ‖_F ≤ √(mn)·tol for each of r and w against their exact values.
    let jump_tol = 2.0 * ((m * n) as f64).sqrt() * tol / w_fro;
    assert!(
        (fro(&(&r - &w)) / fro(&w) - jump).abs() <= jump_tol,
        "a large jump ({jump})"
    );
    assert!(jump > 0.3);
    let mut r = w.clone();
    colnorm.retract_onto(&mut r).unwrap();
    assert!(
        max_abs_diff(&r, &w) <= tol,
        "column-norm retraction keeps W"
    );
}

#[test]
fn retract_onto_puts_a_gaussian_init_on_the_manifold() {
    for (m, n) in [(48, 16), (16, 48), (20, 20)] {
        let g = gaussian(m, n, 8) * 0.02;
        for manifold in [Manifold::Stiefel, Manifold::dgram()] {
            let opt = ManifoldMuon::new(exact_cfg(manifold, 0.02)).unwrap();
            assert!(opt.violation(&g).unwrap() > 0.05 || m == n && manifold != Manifold::Stiefel);
            let mut w = g.clone();
            opt.retract_onto(&mut w).unwrap();
            // Stiefel ‖WᵀW − I‖_F/√n; DGram ‖Off(WᵀW)‖_F/‖diag(WᵀW)‖₂ = D·Off(QᵀQ)·D/‖d²‖
            // ≤ d_max²/‖d²‖₂ ≤ 1 times Q's: orthonormality_tol/√n bounds both.
            let tol = orthonormality_tol(m, n) / (m.min(n) as f64).sqrt();
            assert!(opt.violation(&w).unwrap() <= tol, "{manifold:?} {m}×{n}");
            if manifold == Manifold::dgram() {
                // σ kept, sorted descending across columns.
                let d = col_norms(&w);
                let s = sv(&g);
                // Two SVDs' σ of g (Weyl: svd_err·‖g‖_F each) and the column norm of
                // polar·diag(σ) (σ_j times the polar factor's svd_err).
                let tol = 3.0 * svd_err(m, n) * fro(&g);
                for (a, b) in d.iter().zip(&s) {
                    assert!((a - b).abs() <= tol, "{a} vs {b}");
                }
            }
        }
    }
}

#[test]
fn polar_express_holds_stiefel_to_its_accuracy() {
    // The paper's msign in f64: σ end at 1 ± 1e-6, so the constraint holds to ~1e-6, not 1e-10.
    let opt = ManifoldMuon::new(ManifoldMuonConfig {
        dual: DualAscent::paper().normalized(),
        ..ManifoldMuonConfig::paper(Manifold::Stiefel)
    })
    .unwrap();
    let mut w = orthonormal(64, 24, 1);
    let mut st = ManifoldState::new();
    for i in 0..5 {
        opt.step(&mut w, &gaussian(64, 24, 100 + i), &mut st)
            .unwrap();
    }
    // σ(W) ∈ 1 ± b with b = 1e-6 (the Polar Express band, msign.rs docs; W − ηA has σ/‖·‖_F
    // ≈ 1/√24 ≫ 1e-3) plus the f64 rounding of the last steps (≈ 3·√64·u, contracting near 1):
    // ‖WᵀW − I‖_F ≤ √n·((1 + b)² − 1).
    let b = 1e-6 + 3.0 * 8.0 * U64 + 2.0 * svd_err(64, 24);
    let tol = (24f64).sqrt() * ((1.0 + b) * (1.0 + b) - 1.0);
    let e = stiefel_error(&w);
    assert!(e <= tol, "‖WᵀW − I‖_F = {e} > {tol:e}");
}

/// A gradient shaped like the optim-geometry experiment's at the Stiefel loss floor: an
/// ill-conditioned part (σ geometric from 1 to 1e-3) plus a normal component W·S that is
/// `normal`× larger (S symmetric; off-diagonal for DGram, whose W·diag(·) part is tangent).
fn floor_gradient(w: &Array2<f64>, manifold: Manifold, normal: f64, seed: u64) -> Array2<f64> {
    let (m, n) = w.dim();
    let s: Vec<f64> = (0..n)
        .map(|i| 1e-3f64.powf(i as f64 / (n - 1) as f64))
        .collect();
    // Its own seed: with W's seed, with_spectrum's left factor *is* W's column basis
    // (`orthonormal(m, n, seed)`), G lies in span(W), Z₀ = W·skew is tangent and the paper's
    // ascent converges at k = 0 — comparisons with it then compare rounding noise.
    let tangentish = with_spectrum(m, n, &s, tangent_seed(seed));
    let x = gaussian(n, n, seed ^ 5);
    let mut sym = &x + &x.t();
    if manifold != Manifold::Stiefel {
        sym.diag_mut().fill(0.0);
    }
    let normal_part = w.dot(&sym);
    let k = normal * spectral(&tangentish) / spectral(&normal_part);
    tangentish + normal_part * k
}

/// The seed of [`floor_gradient`]'s ill-conditioned part, distinct from W's.
fn tangent_seed(seed: u64) -> u64 {
    seed ^ 0x005e_ed0f_7a4e
}

fn tall_shapes() -> impl Strategy<Value = (usize, usize, u64)> {
    prop_oneof![Just((48usize, 16usize)), Just((64, 24)), Just((96, 32))]
        .prop_flat_map(|(m, n)| (Just(m), Just(n), any::<u64>()))
}

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn normalization_ignores_the_normal_component((m, n, seed) in tall_shapes(), log_c in -3.0f64..3.0) {
        // Regression (optim-geometry, κ(X) = 100): on Stiefel Λ₀ cancels any normal component
        // W·S, so the normalized ascent must give the same direction for G and G + c·W·S.
        // Normalizing G itself (the previous rule) shrank the tangent part by ‖Z₀‖/‖G‖ ≈ 0.025
        // at the loss floor and made the ascent diverge (final violation 0.28, negative
        // descents). (On DGram with unequal column norms Λ₀ cancels W·S only approximately.)
        let (manifold, w) = (Manifold::Stiefel, stiefel_point(m, n, seed));
        let g = gaussian(m, n, seed ^ 11);
        let s: Vec<f64> = (0..n).map(|i| 1e-3f64.powf(i as f64 / (n - 1) as f64)).collect();
        let g_normal = floor_gradient(&w, manifold, 10f64.powf(log_c), seed) - with_spectrum(m, n, &s, tangent_seed(seed));
        let opt = ManifoldMuon::new(exact_cfg(manifold, 0.02)).unwrap();
        let (a, r) = opt.direction(&w, &g).unwrap();
        let (b, rb) = opt.direction(&w, &(&g + &g_normal)).unwrap();
        prop_assert!(max_abs_diff(&a, &b) <= 1e-8, "{}", max_abs_diff(&a, &b));
        prop_assert!((r.violation - rb.violation).abs() <= 1e-8);
    }

    #[test]
    fn feasible_option_gives_tangent_unit_steps_on_ill_conditioned_gradients(
        (m, n, seed) in tall_shapes(), log_normal in -1.0f64..2.0, log_scale in -4.0f64..1.0,
    ) {
        for (manifold, w) in [(Manifold::Stiefel, stiefel_point(m, n, seed)), (Manifold::dgram(), dgram_point(m, n, seed))] {
            let g = floor_gradient(&w, manifold, 10f64.powf(log_normal), seed) * 10f64.powf(log_scale);
            let cfg = ManifoldMuonConfig { dual: DualAscent::feasible(), ..exact_cfg(manifold, 0.02) };
            let (a, r) = ManifoldMuon::new(cfg).unwrap().direction(&w, &g).unwrap();
            // Tangent to rounding, spectral norm in [0.99, 1], a certified gap.
            // (1e-8: the projection subtracts a normal part up to 100× the tangent one.)
            prop_assert!(r.violation <= 1e-8, "{manifold:?}: violation {}", r.violation);
            let s = spectral(&a);
            prop_assert!((0.99..=1.0 + 1e-12).contains(&s), "‖A‖₂ = {s}");
            prop_assert!(r.descent > 0.0, "{manifold:?}: descent {}", r.descent);
            prop_assert!(!r.diverged || manifold != Manifold::Stiefel, "{r:?}");
            // Stiefel: certified within 35 % of the optimal descent. DGram with column norms in
            // [0.5, 2] is harder (see docs/optim.md): only a valid certificate is asserted.
            let gap = r.gap.unwrap();
            let top = if manifold == Manifold::Stiefel { 0.35 } else { 1.0 };
            prop_assert!((-1e-9..top).contains(&gap), "{manifold:?}: gap {gap}");
            prop_assert!(r.descent_ratio.unwrap() <= 1.0 + 1e-12);
        }
    }

    #[test]
    fn feasible_option_keeps_converged_gaussian_ascents(seed in any::<u64>(), log_scale in -4.0f64..1.0) {
        // On Gaussian gradients (where the ascent converges: dual.rs, "Traps") the projection changes
        // little: certified within 1 % of the optimal descent.
        let (m, n) = (96, 32);
        let w = orthonormal(m, n, seed);
        let g = gaussian(m, n, seed ^ 9) * 10f64.powf(log_scale);
        let cfg = ManifoldMuonConfig { dual: DualAscent::feasible(), ..exact_cfg(Manifold::Stiefel, 0.02) };
        let (_, r) = ManifoldMuon::new(cfg).unwrap().direction(&w, &g).unwrap();
        prop_assert!(r.ascent_violation <= 1e-3 && r.violation <= 1e-10);
        prop_assert!(r.gap.unwrap() <= 1e-2, "gap {}", r.gap.unwrap());
    }
}

#[test]
fn feasible_steps_stay_on_the_manifold_with_step_norm_lr() {
    // The step of the projected direction has ‖ΔW‖₂/η within [0.99, 1.01] (the retraction
    // adds O(η)) although the ascent itself did not converge.
    for manifold in [Manifold::Stiefel, Manifold::dgram()] {
        let w0 = if manifold == Manifold::Stiefel {
            stiefel_point(96, 32, 3)
        } else {
            dgram_point(96, 32, 3)
        };
        let g = floor_gradient(&w0, manifold, 30.0, 3);
        let mut cfg = exact_cfg(manifold, 0.02);
        cfg.dual = DualAscent::paper();
        let (_, paper) = ManifoldMuon::new(cfg).unwrap().direction(&w0, &g).unwrap();
        cfg.dual = DualAscent::feasible();
        let opt = ManifoldMuon::new(cfg).unwrap();
        let mut w = w0.clone();
        let step = opt.step(&mut w, &g, &mut ManifoldState::new()).unwrap();
        // The premise (a fact about the problem, far above rounding): the paper's ascent stops
        // short; the projected direction is tangent to rounding (≤ 1e-10 ≈ n²·ε·‖W‖² for n = 32
        // with the projection's normal part up to 30× the tangent one).
        assert!(paper.violation >= 1e-3, "{manifold:?}: premise {paper:?}");
        assert!(
            step.dual.violation <= 1e-10,
            "{manifold:?}: {:?}",
            step.dual
        );
        assert!(step.manifold_violation <= 1e-10);
        let r = spectral(&(&w - &w0)) / 0.02;
        assert!((0.99..=1.01).contains(&r), "{manifold:?}: ‖ΔW‖₂/η = {r}");
    }
}

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn preconditioned_dgram_steps_are_tangent_on_ill_conditioned_gradients(
        (m, n, seed) in tall_shapes(), log_normal in -1.0f64..2.0, log_scale in -4.0f64..1.0,
    ) {
        // The case `feasible()` could only make tangent (certified gap up to 0.99): DGram with
        // column norms in [0.5, 2] and gradients with σ spread over 1e3 plus a normal part.
        let w = dgram_point(m, n, seed);
        let g = floor_gradient(&w, Manifold::dgram(), 10f64.powf(log_normal), seed) * 10f64.powf(log_scale);
        let cfg = ManifoldMuonConfig { dual: DualAscent::preconditioned_feasible(), ..exact_cfg(Manifold::dgram(), 0.02) };
        let (a, r) = ManifoldMuon::new(cfg).unwrap().direction(&w, &g).unwrap();
        prop_assert!(r.violation <= 1e-8, "violation {}", r.violation);
        let s = spectral(&a);
        prop_assert!((0.99..=1.0 + 1e-12).contains(&s), "‖A‖₂ = {s}");
        prop_assert!(r.descent > 0.0 && !r.diverged, "{r:?}");
        // Certified within 35 % of the optimal descent, the bound the Stiefel case meets.
        let gap = r.gap.unwrap();
        prop_assert!((-1e-9..0.35).contains(&gap), "gap {gap}");
        prop_assert!(r.descent_ratio.unwrap() <= 1.0 + 1e-12);
    }

    #[test]
    fn preconditioning_converges_dgram_ascents_on_gaussian_gradients(seed in any::<u64>(), log_scale in -4.0f64..1.0) {
        let (m, n) = (96, 32);
        let w = dgram_point(m, n, seed);
        let g = gaussian(m, n, seed ^ 9) * 10f64.powf(log_scale);
        let run = |dual: DualAscent| {
            let cfg = ManifoldMuonConfig { dual, ..exact_cfg(Manifold::dgram(), 0.02) };
            ManifoldMuon::new(cfg).unwrap().direction(&w, &g).unwrap().1
        };
        let plain = run(DualAscent::paper().normalized());
        let pre = run(DualAscent::paper().normalized().preconditioned());
        // The ascent itself converges (no projection involved) and the gap closes.
        prop_assert!(pre.ascent_violation <= 2e-3, "{pre:?}");
        prop_assert!(pre.ascent_violation < plain.ascent_violation, "{} vs {}", pre.ascent_violation, plain.ascent_violation);
        let full = run(DualAscent::preconditioned_feasible());
        prop_assert!(full.gap.unwrap() <= 1e-2, "gap {}", full.gap.unwrap());
    }

    #[test]
    fn preconditioning_is_a_no_op_on_stiefel((m, n, seed) in tall_shapes()) {
        let w = stiefel_point(m, n, seed);
        let g = gaussian(m, n, seed ^ 5);
        let dir = |dual: DualAscent| {
            let cfg = ManifoldMuonConfig { dual, ..exact_cfg(Manifold::Stiefel, 0.02) };
            ManifoldMuon::new(cfg).unwrap().direction(&w, &g).unwrap().0
        };
        let d = max_abs_diff(&dir(DualAscent::paper().normalized()), &dir(DualAscent::paper().normalized().preconditioned()));
        prop_assert!(d <= 1e-10, "{d}");
    }
}

#[test]
fn preconditioned_dgram_steps_stay_on_the_manifold_with_step_norm_lr() {
    let w0 = dgram_point(96, 32, 3);
    let g = floor_gradient(&w0, Manifold::dgram(), 30.0, 3);
    for retraction in [DGramRetraction::Paper, DGramRetraction::ColumnNorms] {
        let manifold = Manifold::DGram(retraction);
        let mut cfg = exact_cfg(manifold, 0.02);
        cfg.dual = DualAscent::preconditioned_feasible();
        let mut w = w0.clone();
        let step = ManifoldMuon::new(cfg)
            .unwrap()
            .step(&mut w, &g, &mut ManifoldState::new())
            .unwrap();
        assert!(step.dual.violation <= 1e-10, "{:?}", step.dual);
        assert!(off_diag(&w) <= 1e-10, "{}", off_diag(&w));
        let r = spectral(&(&w - &w0)) / 0.02;
        assert!((0.99..=1.01).contains(&r), "{retraction:?}: ‖ΔW‖₂/η = {r}");
    }
}

#[test]
fn the_paper_preset_stays_unpreconditioned_and_old_configs_deserialize() {
    for m in [Manifold::Stiefel, Manifold::dgram()] {
        let c = ManifoldMuonConfig::paper(m);
        assert_eq!(c.dual, DualAscent::paper());
        assert!(!c.dual.precondition && !c.dual.project && c.dual.normalize.is_none());
    }
    // A config written before `precondition` existed still reads (serde default: off).
    let old = r#"{"alpha":0.1,"steps":20,"tol":1e-6,"normalize":null,"divergence_factor":2.0,"on_divergence":"error"}"#;
    let d: DualAscent = serde_json::from_str(old).unwrap();
    assert_eq!(d, DualAscent::paper());
}
