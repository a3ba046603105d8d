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

/// Relative rounding of `spectral_norm_estimate`'s value for a tall m×n input (dual.rs: "within a
/// few n·ε of that interval"): the Gram GᵀG has ‖|G|ᵀ|G|‖_F ≤ ‖G‖_F² ≤ n·‖GᵀG‖_F, so relative
/// error ≤ n·γ_m, which the p-th power carries p-fold and the 1/(2p)-th root halves; squaring j
/// (relative error ≤ n·γ_n the same way) enters with weight 2^{-(j+1)}, summing to ≤ n·γ_n.
fn estimate_rel(m: usize, n: usize) -> f64 {
    n as f64 * (gamma(m) / 2.0 + gamma(n))
}

/// The band of ‖A‖₂ for a projected direction (docs/optim.md, "Bands of the feasible
/// directions"): `project_tangent` divides by the 10-squaring estimate, which is ≥ ‖Y‖₂ and
/// ≤ rank^{1/2¹¹}·‖Y‖₂ (dual.rs, `spectral_norm_estimate`; rank ≤ n), each up to
/// [`estimate_rel`], and the division rounds (u). Returns the true ‖A‖₂'s (lo, hi).
fn projected_norm_band(m: usize, n: usize) -> (f64, f64) {
    let e = estimate_rel(m, n);
    (
        (n as f64).powf(-1.0 / 2048.0) * (1.0 - e) - U64,
        1.0 + e + U64,
    )
}

/// Column-norm extremes of tall `w`.
fn d_range(w: &Array2<f64>) -> (f64, f64) {
    let d = col_norms(w);
    (
        d.iter().fold(f64::INFINITY, |a, &b| a.min(b)),
        d.iter().fold(0.0, |a, &b| a.max(b)),
    )
}

/// The constraint map C(X) = P(WᵀX + XᵀW) (tall), P = Off on DGram.
fn constraint(w: &Array2<f64>, x: &Array2<f64>, dgram: bool) -> Array2<f64> {
    let s = w.t().dot(x);
    let mut c = &s + &s.t();
    if dgram {
        c.diag_mut().fill(0.0);
    }
    c
}

/// The bound on the reported violation ‖C(A)‖_F/n of a direction projected by dual.rs's
/// `project_tangent` from one of `candidates` (the ascent's last candidate and the gradient;
/// it keeps one), W tall. The projection is Y = X − 2W·S, S from conjugate gradients on
/// op(S) = P(MS + SM), M = WᵀW (eigenvalues 2d_i² … on DGram, κ = (d_max/d_min)²), then A = Y/ν.
/// Exactly, C(Y) = 2·r with r = ½C(X) − op(S) the CG residual, so
/// ‖C(A)‖_F/n ≤ ρ·(cg + g)/n + (2d_max/n)·γ_{n+2}·(ξ + d_max·√n·ρ/(2d_min²)) + 2γ_m·d_max:
/// * ρ = ‖C(X)‖_F/‖X_tan‖₂ (= 2‖r₀‖/ν: how much larger the normal part is than the tangent one)
///   and ξ = ‖X‖_F/‖X_tan‖₂, computed here with S from the diagonal of op (exact on DGram up to
///   W's orthonormality error; a scale factor, so first order suffices);
/// * cg, the recursive residual ‖r_k‖/‖r₀‖ at exit: the stop 1e-14 (Stiefel, or the Jacobi
///   preconditioner, op's exact inverse up to W's orthonormality: κ_eff = 1), else the Chebyshev
///   bound 2√κ·((√κ − 1)/(√κ + 1))^k after k = max(2n, 8) iterations;
/// * g, the gap between recursive and true residual (Greenbaum, *Iterative Methods for Solving
///   Linear Systems*, §7.3): u·(k + 1)·(n + 1)·‖op‖·max‖S_j‖/‖r₀‖ ≤ u·(k + 1)·(n + 1)·(1 + κ^{3/2})
///   (CG iterates within √κ of the solution in norm, ‖S*‖ ≤ ‖r₀‖/(2d_min²)), plus M's own
///   rounding γ_m·κ;
/// * forming Y (γ_{n+1}·(|X| + 2|W||S|), ‖S‖_F ≤ ‖r₀‖/(2d_min²)) and dividing by ν (u), mapped
///   by C (‖C‖ ≤ 2d_max); the measure's own products (γ_m·‖w_i‖·‖a_j‖ per entry, twice).
fn projection_violation_tol(
    w: &Array2<f64>,
    candidates: &[&Array2<f64>],
    dgram: bool,
    preconditioned: bool,
) -> f64 {
    let (m, n) = w.dim();
    let (d_min, d_max) = d_range(w);
    let kappa = if dgram { (d_max / d_min).powi(2) } else { 1.0 };
    let k = (2 * n).max(8);
    let kappa_eff = if dgram && !preconditioned { kappa } else { 1.0 };
    let q = (kappa_eff.sqrt() - 1.0) / (kappa_eff.sqrt() + 1.0);
    let cg = (2.0 * kappa_eff.sqrt() * q.powi(k as i32)).max(1e-14);
    let g = U64 * ((k + 1) * (n + 1)) as f64 * (1.0 + kappa.powf(1.5)) + gamma(m) * kappa;
    let d2 = w.t().dot(w).diag().to_owned();
    let (nf, sq) = (n as f64, (n as f64).sqrt());
    candidates
        .iter()
        .map(|x| {
            let c = constraint(w, x, dgram);
            let s = Array2::from_shape_fn((n, n), |(i, j)| c[[i, j]] / (2.0 * (d2[i] + d2[j])));
            let nu = spectral(&(*x - &(w.dot(&s) * 2.0)));
            let (rho, xi) = (fro(&c) / nu, fro(x) / nu);
            rho * (cg + g) / nf
                + 2.0 * d_max / nf * gamma(n + 2) * (xi + d_max * sq * rho / (2.0 * d_min * d_min))
                + 2.0 * gamma(m) * d_max
        })
        .fold(0.0, f64::max)
}

/// Lower bound of a feasible direction's certified gap (dual.rs, `DualReport::gap`), which is
/// ≥ 0 in exact arithmetic for a tangent A with ‖A‖₂ ≤ 1 (weak duality). For every k,
/// ⟨G', A⟩ = ⟨Z_k, A⟩ − ⟨Λ_k, C(A)⟩ ≤ ‖Z_k‖_*·‖A‖₂ + ‖Λ_k‖_F·n·v (G' = scale·G, v the violation),
/// so the computed gap is ≥ −[(s_hi − 1) + (‖Λ‖·n·v + ΔD + ΔN)/‖Z‖_*]: s_hi the top of
/// [`projected_norm_band`]; ‖Λ_k‖_F ≤ w_max·(¼‖C(G')‖_F + α·n·Σ_j v_j) (Λ₀ and the dual steps
/// α(1 − j/K)·H_j ⊘ M, ‖H_j‖_F = n·v_j, w_max = 1/d_min² preconditioned, else 1); ΔD the
/// rounding of ⟨G', A⟩ (γ_mn·‖G'‖_F·‖A‖_F); ΔN that of the computed ‖Z_k‖_* = ⟨Ẑ, msign Ẑ⟩:
/// Ẑ = Z + γ_{n+1}(|G'| + 2|W||Λ|) (×√n into the nuclear norm) and the exact msign's backward
/// error and orthonormality, 3·√n·svd_err relative.
fn gap_floor(
    w: &Array2<f64>,
    g: &Array2<f64>,
    a: &Array2<f64>,
    r: &DualReport,
    dual: &DualAscent,
    dgram: bool,
) -> f64 {
    let (m, n) = w.dim();
    let (d_min, d_max) = d_range(w);
    let w_max = if dual.precondition {
        1.0 / (d_min * d_min)
    } else {
        1.0
    };
    let (nf, sq) = (n as f64, (n as f64).sqrt());
    let gs = g * r.gradient_scale;
    let lam = w_max
        * (0.25 * fro(&constraint(w, &gs, dgram))
            + dual.alpha * nf * r.violations.iter().sum::<f64>());
    let nuc = -r
        .dual_objective
        .iter()
        .fold(f64::NEG_INFINITY, |a, &b| a.max(b));
    let d_err = gamma(m * n) * fro(&gs) * fro(a);
    let n_err = sq * gamma(n + 1) * (fro(&gs) + 2.0 * d_max * sq * lam);
    let s_hi = projected_norm_band(m, n).1;
    (s_hi - 1.0) + (lam * nf * r.violation + d_err + n_err) / nuc + 3.0 * sq * svd_err(m, n)
}

/// The derived checks of a `project`ed direction (W, G tall): tangent to
/// [`projection_violation_tol`] (the candidates: the ascent's last one, recomputed with
/// `project` off — the same ascent — and G), ‖A‖₂ in [`projected_norm_band`] (widened by the
/// measuring SVD's svd_err·‖A‖_F), ⟨G, A⟩ > 0, gap ≥ −[`gap_floor`], descent ratio ≤ 1 +
/// [`ratio_tol`]. Returns the violation bound.
fn check_feasible(
    w: &Array2<f64>,
    g: &Array2<f64>,
    a: &Array2<f64>,
    r: &DualReport,
    cfg: &ManifoldMuonConfig,
    dgram: bool,
) -> std::result::Result<f64, String> {
    let (m, n) = w.dim();
    let meas = svd_err(m, n) * (n as f64).sqrt();
    let (band, v_tol) = if r.projected {
        let raw = ManifoldMuonConfig {
            dual: DualAscent {
                project: false,
                ..cfg.dual
            },
            ..*cfg
        };
        let (cand, _) = ManifoldMuon::new(raw).unwrap().direction(w, g).unwrap();
        (
            projected_norm_band(m, n),
            projection_violation_tol(w, &[&cand, g], dgram, cfg.dual.precondition),
        )
    } else {
        // Converged: the exact msign's candidate (σ = 1 to 2·svd_err), tangent to the stop tol.
        (
            (1.0 - 2.0 * svd_err(m, n), 1.0 + 2.0 * svd_err(m, n)),
            cfg.dual.tol,
        )
    };
    if r.violation > v_tol {
        return Err(format!("violation {} > {v_tol:e}", r.violation));
    }
    let s = spectral(a);
    if !(band.0 - meas..=band.1 + meas).contains(&s) {
        return Err(format!("‖A‖₂ = {s} outside {band:?} ± {meas:e}"));
    }
    if r.descent <= 0.0 {
        return Err(format!("descent {}", r.descent));
    }
    let floor = gap_floor(w, g, a, r, &cfg.dual, dgram);
    if r.gap.unwrap() < -floor {
        return Err(format!("gap {:?} < −{floor:e}", r.gap));
    }
    let rt = ratio_tol(m, n, band.1);
    if r.descent_ratio.unwrap() > 1.0 + rt {
        return Err(format!("descent ratio {:?} > 1 + {rt:e}", r.descent_ratio));
    }
    Ok(v_tol)
}

/// Hölder's ⟨G, A⟩ ≤ ‖G‖_*·‖A‖₂ for the descent ratio ⟨G, A⟩/⟨G, msign G⟩: up to ‖A‖₂ − 1 and the
/// rounding of the two length-mn inner products and the exact msign (as in
/// `stiefel_steps_stay_on_the_manifold_with_step_norm_lr`), for ‖A‖₂ ≤ `s_hi`.
fn ratio_tol(m: usize, n: usize, s_hi: f64) -> f64 {
    (s_hi - 1.0) + 2.0 * svd_err(m, n) + 2.0 * gamma(m * n) * (m.min(n) as f64).sqrt()
}

/// The band of ‖ΔW‖₂/η for one step W₁ = R(W₀ − η·A) with A tangent to within `v` (the report's
/// violation) and ‖A‖₂ ∈ [s_lo, s_hi] (docs/optim.md, "Bands of the feasible directions"):
/// ‖R(X) − X‖₂ ≤ c·η²·s² with c = ½ on Stiefel (polar retraction of a tangent ξ: (W + ξ)(I +
/// ξᵀξ)^{-1/2}, exactly) and c = 2/d_min on DGram (both retractions: XᵀX = D̃² + η²·Off(AᵀA),
/// so R moves X by ≤ η²s²/d_min to first order; doubled for the O(η³/d_min²) rest, η/d_min <
/// 0.04 here), the normal part of A (2W·S with op(S) = ½C(A): ‖·‖_F ≤ d_max·n·v/(2d_min²),
/// removed by R), and the rounding of the retraction (its polar factor within the polar
/// perturbation of 2·svd_err at σ_min ≥ d_min − η, times d_max, and the paper's σ within
/// svd_err·‖X‖_F) and of the measured σ (svd_err·‖ΔW‖_F ≤ svd_err·√n·2η).
fn step_norm_band(
    w0: &Array2<f64>,
    lr: f64,
    v: f64,
    (s_lo, s_hi): (f64, f64),
    dgram: bool,
) -> (f64, f64) {
    let w0 = tall(w0);
    let (m, n) = w0.dim();
    let (d_min, d_max) = d_range(&w0);
    let c = if dgram { 2.0 / d_min } else { 0.5 };
    let normal = d_max * n as f64 * v / (2.0 * d_min * d_min);
    let x_fro = d_max * (n as f64).sqrt();
    let round = (d_max * polar_perturbation(x_fro, d_min - lr, 2.0 * svd_err(m, n))
        + svd_err(m, n) * x_fro)
        / lr
        + 2.0 * svd_err(m, n) * (n as f64).sqrt();
    let lo = s_lo / (1.0 + (lr * s_lo).powi(2)).sqrt() - c * lr * s_hi * s_hi - normal - round;
    (lo, s_hi + c * lr * s_hi * s_hi + normal + round)
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
            let (lr, k) = (0.02, m.min(n) as f64);
            let (d_lo, d_hi) = d_range(&tall(&w0));
            // Envelope of the norms over the 3 steps: each moves a column by ≤ η·‖A‖₂ and
            // ‖A‖₂ ≤ 1 + 2·svd_err < 1.01 (exact msign) — plus the retraction's part, which is
            // second order and inside the 1 %.
            let (d_lo, d_hi) = (d_lo - 3.0 * lr * 1.01, d_hi + 3.0 * lr * 1.01);
            let mut bound = 0.0;
            for _ in 0..3 {
                let off0 = off_diag(&w);
                let step = opt.step(&mut w, &g, &mut st).unwrap();
                let s_a = spectral(&step.direction);
                let x_fro = d_hi * k.sqrt();
                let off = off0 + lr * k * step.dual.violation + 2.0 * lr * lr * s_a * s_a;
                bound += lr * s_a + off / d_lo + svd_err(m, n) * x_fro + gamma(m.max(n)) * d_hi;
            }
            // Both retractions are Q·D with Q from an exact msign (orthonormal to svd_err):
            // Off(WᵀW) = D·Off(QᵀQ)·D, so d_max²·orthonormality_tol.
            let d_max = col_norms(&w).into_iter().fold(0.0, f64::max);
            let tol = d_max * d_max * orthonormality_tol(m, n);
            prop_assert!(off_diag(&w) <= tol, "{retraction:?}: ‖Off(WᵀW)‖_F = {} > {tol:e}", off_diag(&w));
            // Column norms move by at most Σ_steps bound_k: W − ηA moves column j by ≤ η‖A‖₂;
            // ColumnNorms keeps those norms, Paper replaces them by σ of X = W − ηA, which by
            // Weyl on XᵀX = Diag + Off are within ‖Off(XᵀX)‖₂/d_lo of the sorted column norms,
            // ‖Off(XᵀX)‖₂ ≤ ‖Off(WᵀW)‖ + η·n·v + 2η²‖A‖₂² (v the step's tangent violation);
            // sorting is 1-Lipschitz in max-norm, so swaps (norms 1.5/c apart may cross) cost
            // nothing more. Plus the rounding: σ by svd_err·‖X‖_F, norms by γ_m·d.
            let (d0, d1) = (col_norms(&w0), col_norms(&w));
            let worst = d0.iter().zip(&d1).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            prop_assert!(worst <= bound, "{retraction:?}: column norm moved {worst} > {bound:e}");
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
fn retract_onto_falls_back_to_the_exact_polar_factor_below_the_schedules_floor() {
    // A square init with σ from 1 down to 1e-7: Polar Express is designed for σ/‖W‖_F ≥ 1e-3,
    // so its msign leaves the small σ far from 1 and misses the tolerance; the retraction then
    // takes the exact polar factor U·Vᵀ.
    let n = 24;
    let s: Vec<f64> = (0..n)
        .map(|i| 10f64.powf(-7.0 * i as f64 / (n - 1) as f64))
        .collect();
    let g = with_spectrum(n, n, &s, 3);
    let opt = ManifoldMuon::new(ManifoldMuonConfig::paper(Manifold::Stiefel)).unwrap();
    let mut w = g.clone();
    opt.retract_onto(&mut w).unwrap();
    let u = orthonormal(n, n, 3);
    let v = orthonormal(n, n, 3u64.wrapping_add(7));
    let polar = u.dot(&v.t());
    // W = U·diag(s)·Vᵀ is formed with f64 rounding (γ_n relative) and the SVD adds its backward
    // error (svd_err): the polar factor's first-order bound over σ_min = 1e-7.
    let tol = polar_perturbation(fro(&g), s[n - 1], svd_err(n, n) + gamma(n));
    assert!(
        max_abs_diff(&w, &polar) <= tol,
        "{} > {tol}",
        max_abs_diff(&w, &polar)
    );
    assert!(stiefel_error(&w) <= orthonormality_tol(n, n));
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
        let g_total = &g + &g_normal;
        let (a, r) = opt.direction(&w, &g).unwrap();
        let (b, rb) = opt.direction(&w, &g_total).unwrap();
        // Equal in exact arithmetic for an exactly orthonormal W. Tolerance: two roundings of
        // the normalized ascent (K = 20 exact msigns, each an SVD, a violation product and a
        // dual update, + Λ₀ and the normalization: 20·3 + 6 injections, as in
        // optimizer.rs's momentum_forms_… test), each with its amplification measured at its
        // own input (G + c·W·S rounds at the larger scale max|G + c·W·S|); plus W's
        // non-orthogonality E = WᵀW − I: Λ₀ cancels c·W·S only up to ½c·W(SE + ES),
        // ‖·‖_F ≤ ‖c·W·S‖₂·‖E‖_F (‖W‖₂ ≈ 1), an input perturbation of that size.
        let dir = |x: &[Array2<f64>]| opt.direction(&w, &x[0]).unwrap().0;
        let amp_a = amplification(dir, std::slice::from_ref(&g));
        let amp_b = amplification(dir, std::slice::from_ref(&g_total));
        let tol = derived_tol(20 * 3 + 6, m, amp_a, 1.0)
            + derived_tol(20 * 3 + 6, m, amp_b, 1.0)
            + amp_b * stiefel_error(&w) * spectral(&g_normal) / max_abs(&g_total);
        prop_assert!(max_abs_diff(&a, &b) <= tol, "{} > {tol:e}", max_abs_diff(&a, &b));
        // The violation ‖WᵀA + AᵀW‖_F/n moves by ≤ 2‖W‖₂‖ΔA‖_F/n (‖ΔA‖_F ≤ √(mn)·tol), plus
        // each measure's own products (2γ_m per entry of size ≤ 1, n² entries, /n).
        let v_tol = 2.0 * ((m * n) as f64).sqrt() * tol / n as f64 + 4.0 * gamma(m);
        prop_assert!((r.violation - rb.violation).abs() <= v_tol, "{} > {v_tol:e}", (r.violation - rb.violation).abs());
    }

    #[test]
    fn feasible_option_gives_tangent_unit_steps_on_ill_conditioned_gradients(
        (m, n, seed) in tall_shapes(), log_normal in -1.0f64..2.0, log_scale in -4.0f64..1.0,
    ) {
        for (manifold, w) in [(Manifold::Stiefel, stiefel_point(m, n, seed)), (Manifold::dgram(), dgram_point(m, n, seed))] {
            let g = floor_gradient(&w, manifold, 10f64.powf(log_normal), seed) * 10f64.powf(log_scale);
            let cfg = ManifoldMuonConfig { dual: DualAscent::feasible(), ..exact_cfg(manifold, 0.02) };
            let (a, r) = ManifoldMuon::new(cfg).unwrap().direction(&w, &g).unwrap();
            let dgram = manifold != Manifold::Stiefel;
            prop_assert!(check_feasible(&w, &g, &a, &r, &cfg, dgram).is_ok(), "{manifold:?}: {}", check_feasible(&w, &g, &a, &r, &cfg, dgram).unwrap_err());
            prop_assert!(!r.diverged || manifold != Manifold::Stiefel, "{r:?}");
            // Stiefel: certified within 35 % of the optimal descent. DGram with column norms in
            // [0.5, 2] is harder (see docs/optim.md): only a valid certificate is asserted.
            // (Bands of the method, docs/optim.md "DGram: a preconditioned dual ascent".)
            let top = if manifold == Manifold::Stiefel { 0.35 } else { 1.0 };
            prop_assert!(r.gap.unwrap() < top, "{manifold:?}: gap {:?}", r.gap);
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
        let (a, r) = ManifoldMuon::new(cfg).unwrap().direction(&w, &g).unwrap();
        // Bands of the method: the ascent's 1e-3 (property 4 at this shape,
        // tall_stiefel_direction_is_tangent_when_well_scaled) and the 1 % gap (dual.rs,
        // "Feasible directions": < 0.5 % change on Gaussian 128×48).
        prop_assert!(r.ascent_violation <= 1e-3, "{r:?}");
        prop_assert!(check_feasible(&w, &g, &a, &r, &cfg, false).is_ok(), "{}", check_feasible(&w, &g, &a, &r, &cfg, false).unwrap_err());
        prop_assert!(r.gap.unwrap() <= 1e-2, "gap {}", r.gap.unwrap());
    }
}

#[test]
fn feasible_steps_stay_on_the_manifold_with_step_norm_lr() {
    // The step of the projected direction has ‖ΔW‖₂/η within the derived step band
    // (step_norm_band: the retraction adds O(η)) although the ascent itself did not converge.
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
        // short; the projected direction passes the derived checks (check_feasible).
        assert!(paper.violation >= 1e-3, "{manifold:?}: premise {paper:?}");
        let dgram = manifold != Manifold::Stiefel;
        let v_tol = check_feasible(&w0, &g, &step.direction, &step.dual, &cfg, dgram)
            .unwrap_or_else(|e| panic!("{manifold:?}: {e}"));
        // The retraction is an exact msign (Stiefel) or Q·D with Q one (DGram): on the manifold
        // to orthonormality_tol/√n in the reported measure (as in retract_onto_puts_…).
        let m_tol = orthonormality_tol(96, 32) / 32f64.sqrt();
        assert!(
            step.manifold_violation <= m_tol,
            "{} > {m_tol:e}",
            step.manifold_violation
        );
        let (lo, hi) = step_norm_band(&w0, 0.02, v_tol, projected_norm_band(96, 32), dgram);
        let r = spectral(&(&w - &w0)) / 0.02;
        assert!(
            (lo..=hi).contains(&r),
            "{manifold:?}: ‖ΔW‖₂/η = {r} outside [{lo}, {hi}]"
        );
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
        prop_assert!(check_feasible(&w, &g, &a, &r, &cfg, true).is_ok(), "{}", check_feasible(&w, &g, &a, &r, &cfg, true).unwrap_err());
        prop_assert!(!r.diverged, "{r:?}");
        // Certified within 35 % of the optimal descent, the bound the Stiefel case meets (a band
        // of the method: docs/optim.md, "DGram: a preconditioned dual ascent", max 0.22).
        prop_assert!(r.gap.unwrap() < 0.35, "gap {:?}", r.gap);
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
        let dir_g = |g: &Array2<f64>| {
            let cfg = ManifoldMuonConfig { dual: DualAscent::paper().normalized().preconditioned(), ..exact_cfg(Manifold::Stiefel, 0.02) };
            ManifoldMuon::new(cfg).unwrap().direction(&w, g).unwrap().0
        };
        let d = max_abs_diff(&dir(DualAscent::paper().normalized()), &dir(DualAscent::paper().normalized().preconditioned()));
        // On Stiefel the Jacobi weights 2/(d_i² + d_j²) are 1 only up to W's orthonormality:
        // e_W = max_j |(WᵀW)_jj − 1| (+ u for the scaling), applied to Λ₀ and every dual step
        // (K + 1 relative perturbations of Λ, each entering like an input perturbation of that
        // relative size, √m for the products, as in derived_tol); plus two roundings of the
        // normalized ascent (20·3 + 6 injections, as in normalization_ignores_…).
        let amp = amplification(|x| dir_g(&x[0]), std::slice::from_ref(&g));
        let e_w = w.t().dot(&w).diag().iter().fold(0.0f64, |a, &x| a.max((x - 1.0).abs())) + U64;
        let tol = 2.0 * derived_tol(20 * 3 + 6, m, amp, 1.0) + 21.0 * (m as f64).sqrt() * amp * e_w;
        prop_assert!(d <= tol, "{d} > {tol:e}");
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
        let v_tol = check_feasible(&w0, &g, &step.direction, &step.dual, &cfg, true)
            .unwrap_or_else(|e| panic!("{retraction:?}: {e}"));
        // Off(WᵀW) = D·Off(QᵀQ)·D (as in dgram_steps_keep_columns_orthogonal).
        let d_max = col_norms(&w).into_iter().fold(0.0, f64::max);
        let off_tol = d_max * d_max * orthonormality_tol(96, 32);
        assert!(off_diag(&w) <= off_tol, "{} > {off_tol:e}", off_diag(&w));
        let (lo, hi) = step_norm_band(&w0, 0.02, v_tol, projected_norm_band(96, 32), true);
        let r = spectral(&(&w - &w0)) / 0.02;
        assert!(
            (lo..=hi).contains(&r),
            "{retraction:?}: ‖ΔW‖₂/η = {r} outside [{lo}, {hi}]"
        );
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
