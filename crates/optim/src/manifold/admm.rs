//! ADMM for manifold Muon's tangent problem, beside the dual ascent of [`super::dual`], and the
//! per-config choice between them ([`DualSolver`]).
//!
//! # Math (derived here; summary in docs/optim.md, "ADMM: the same problem split in two")
//!
//! The problem is the ascent's: max ⟨G, A⟩ over ‖A‖₂ ≤ 1 and A ∈ T_W, T_W = {A : P(WᵀA + AᵀW) = 0}
//! (tall W, m ≥ n). Split the two constraint sets — the spectral ball 𝔹 and the subspace T_W —
//! onto two copies of the variable:
//!
//! ```text
//! min −⟨G, A⟩ + ι_𝔹(A) + ι_T(B)   s.t.  A = B
//! ```
//!
//! Scaled ADMM with penalty ρ > 0 and dual U (the augmented Lagrangian
//! −⟨G, A⟩ + ι_𝔹(A) + ι_T(B) + (ρ/2)‖A − B + U‖²_F), each minimization in closed form:
//!
//! ```text
//! A ← argmin_{A ∈ 𝔹} −⟨G, A⟩ + (ρ/2)‖A − B + U‖²  = Π_𝔹(B − U + G/ρ)
//! B ← argmin_{B ∈ T} ‖A + U − B‖²                  = Π_T(A + U)
//! U ← U + A − B                                    = Π_N(A + U)   (N = T^⊥ = {2W·S})
//! ```
//!
//! Π_T is the tangent projection `project` already uses (`dual::TangentSpace`, one
//! implementation); U stays in the normal space N from the first update on, so Z = G − ρU is G
//! plus a normal matrix, Z = G + 2W·P(Λ) with Λ = −ρ·S for U = 2W·S: the ascent's dual variable,
//! returned as the multiplier. Every feasible A has ⟨G, A⟩ = ⟨Z, A⟩ ≤ ‖Z‖_* (weak duality,
//! as for the ascent), so one msign at the end certifies the returned direction
//! ([`DualReport::gap`]).
//!
//! **Π_𝔹 without an SVD.** For X = UΣVᵀ (thin, tall), Π_𝔹(X) = U·min(Σ, 1)·Vᵀ (spectral clipping
//! is the Frobenius projection onto the spectral ball) and min(σ, 1) = ½(σ + 1 − |σ − 1|), so with
//! O = msign(X) = UVᵀ, E = X − O = U(Σ − I)Vᵀ and K = sym(OᵀE) = V(Σ − I)Vᵀ (symmetric n×n):
//! msign(K) = V·sign(Σ − I)·Vᵀ (the SVD of a symmetric matrix is its eigendecomposition with the
//! signs moved to one side), msign(K)·K = V|Σ − I|Vᵀ, and
//!
//! ```text
//! Π_𝔹(X) = ½·(X + O − O·msign(K)·K)
//! ```
//!
//! — **two msign calls per iteration**, one m×n and one n×n (mn² against n³ flops per
//! Newton–Schulz product). With `Msign::Exact` both are SVD polar factors and the clip is exact
//! to rounding; a Newton–Schulz msign with band 1 ± b gives singular values within O(b) of
//! min(σ, 1) where the band holds, and where it does not (σ near 0 for O, σ near 1 for msign(K))
//! the error is at most the small quantity it multiplies (σ, resp. |σ − 1|). Null directions of
//! X stay 0. The returned direction is B rescaled into the ball (`dual::rescale_to_ball`, as
//! `project` does), so it is tangent whatever the Newton–Schulz error.
//!
//! **Start.** U₀ = Π_N(G)/ρ and B₀ = 0: the first A is Π_𝔹(Z₀/ρ) with Z₀ = Π_T(G), the tangent
//! part of the gradient (what the ascent's Λ₀ removes the normal part for).
//!
//! **Numerics.** G/ρ and U are both large when G is mostly normal (near a constrained optimum;
//! at the extreme G normal, Z₀ is rounding residue and ρ tiny), and only their difference
//! matters, so the code never forms them: since U stays normal, B = Π_T(A + U) = Π_T(A) and
//! A − B = Π_N(A) = 2W·S, and it keeps Y = G/ρ − U (Y₀ = Z₀/ρ, Y ← Y − Π_N(A), A = Π_𝔹(B + Y);
//! then Z = ρY) and Λ (Λ₀ = −S_G for G = Z₀ + 2W·S_G, Λ ← Λ − ρ·S). The same iteration in exact
//! arithmetic, without the cancellation G/ρ − U (found by a test on a normal G, where the
//! direct form returned a violation of 0.25 and a negative descent).
//!
//! **ρ, and why it is relative.** The iterates depend on G only through G/ρ, so ρ = `rho`·‖Z₀‖₂
//! (the 5-squaring upper estimate, [`super::spectral_norm_estimate`]) makes ADMM scale-invariant
//! in G by construction — no `normalize` option and none of the ascent's scale trap. At the
//! optimum X = A* + Z*/ρ, whose singular values are 1 + σ_i(Z*)/ρ on A*'s range: ρ at the scale
//! of Z's singular values keeps the clip informative (ρ ≫ ‖Z‖ makes A creep towards the boundary
//! by ‖Z₀‖/ρ per iteration; ρ ≪ σ_min(Z) makes every A the unconstrained msign, and U moves by
//! a full normal step, the ascent with a large α). [`Admm::standard`] takes `rho` = 0.5: on
//! fixed-seed 96×32 problems (f64, exact msign; Stiefel, DGram with column norms 2 → 0.5,
//! Oblique; Gaussian and ill-conditioned G) it reached every violation level in the fewest or
//! nearly the fewest iterations of `rho` ∈ {0.1, 0.25, 0.35, 0.5, 0.7, 1, 2} (docs/optim.md,
//! "ADMM: the same problem split in two"). Residual balancing (Boyd et al. 2011, §3.4.1:
//! with r = ‖A − B‖_F and s = (ρ/‖Z₀‖₂)·‖B − B_prev‖_F, both in units of A, ρ ← 2ρ when
//! r > 10·s, ρ ← ρ/2 when s > 10·r, U rescaled by the inverse factor so ρU is unchanged) is
//! the option `adaptive`: it rescues a badly chosen ρ (0.1 or 2) but did not improve ρ = 0.5
//! and sometimes slowed it, so it is off in the preset.
//!
//! **Stop** when the violation ‖P(WᵀA + AᵀW)‖_F/n of the ball iterate A — the ascent's measure
//! and `tol` — and 2‖B − B_prev‖_F/n (the same normalization) are both below `tol`, or after
//! `steps` iterations. The violation alone is no stopping rule here: an A inside the ball
//! (ρ ≥ ‖Z₀‖₂ makes the first one Z₀/ρ, tangent and interior) is tangent without being optimal;
//! the change of B is ADMM's dual residual. [`DualReport::violations`] has one entry per
//! iteration (2 msign calls): the larger of the two.

use kappa_linalg::input::InputError;
use kappa_linalg::Matrix;
use serde::{Deserialize, Serialize};

use super::dual::{
    estimate, finish_report, jacobi_weights, rescale_to_ball, sym2, violation, DualAscent,
    DualReport, OnDivergence, Projector, TallProblem, TangentSpace,
};
use crate::error::{check_range, Result};
use crate::msign::{msign, Msign};
use crate::precision::{Precision, WorkingPrecision};

/// Squarings of the spectral-norm estimate that rescales the returned B: ‖A‖₂ ∈
/// [rank^{−1/2²¹}, 1] up to rounding (≥ 1 − 4e-6 for rank ≤ 4096), so a converged B loses no
/// visible descent to the rescaling (`project`'s 10 squarings cost up to 0.4 %); 20 n×n products
/// of the Gram, against ≈ 30 m×n×n products in one Polar Express msign.
const RESCALE_SQUARINGS: usize = 20;

/// Which solver finds manifold Muon's direction ([`super::ManifoldMuonConfig::solver`]).
///
/// Serde: the default (a missing `solver` field) is the dual ascent configured by
/// [`super::ManifoldMuonConfig::dual`], so every config written before this field existed reads
/// as before; in TOML `solver = "ascent"` or a `[solver.admm]` table.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DualSolver {
    /// The dual ascent with the settings in [`super::ManifoldMuonConfig::dual`].
    #[default]
    Ascent,
    /// ADMM (module docs) with these settings (`ManifoldMuonConfig::dual` is then unused).
    Admm(Admm),
}

impl DualSolver {
    /// Whether this is the dual ascent (the default, left out when a config is written, so a
    /// config that does not choose ADMM reads and writes as it did before ADMM existed).
    pub fn is_ascent(&self) -> bool {
        matches!(self, DualSolver::Ascent)
    }

    /// `"ascent"` or `"admm"`.
    pub fn name(&self) -> &'static str {
        match self {
            DualSolver::Ascent => "ascent",
            DualSolver::Admm(_) => "admm",
        }
    }
}

/// ADMM settings (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admm {
    /// ρ relative to the tangent gradient: ρ = `rho`·‖Z₀‖₂ (> 0; module docs, "ρ").
    pub rho: f64,
    /// The most iterations (≥ 1), 2 msign calls each (plus 1 for the certificate).
    pub steps: usize,
    /// Stop when the violation ‖P(WᵀA + AᵀW)‖_F/n and the change 2‖ΔB‖_F/n are below `tol`.
    pub tol: f64,
    /// Residual balancing of ρ (module docs).
    pub adaptive: bool,
    /// What to do when the result is unusable (a negative ⟨G, A⟩; non-finite values are an
    /// error under both policies). [`Admm::standard`] errors; kappa-train's module-wise paper
    /// preset applies and counts diverged ascents, and an ADMM entry gets that policy only with
    /// `Apply` written in it (docs/optim.md, "Divergence under the module-wise preset"):
    ///
    /// ```
    /// use kappa_optim::manifold::{Admm, DualSolver, Manifold, ManifoldMuonConfig, OnDivergence};
    /// let solver = DualSolver::Admm(Admm { on_divergence: OnDivergence::Apply, ..Admm::standard() });
    /// let cfg = ManifoldMuonConfig { solver, ..ManifoldMuonConfig::paper(Manifold::Stiefel) };
    /// assert_eq!(cfg.solver.on_divergence(&cfg.dual), OnDivergence::Apply);
    /// assert!(cfg.validate().is_ok());
    /// ```
    pub on_divergence: OnDivergence,
}

impl Admm {
    /// ρ = 0.5·‖Z₀‖₂ without residual balancing, at most 10 iterations (20 msign calls, the
    /// paper ascent's budget, + 1 for the certificate), tol = 1e-6, divergence an error.
    pub const fn standard() -> Self {
        Self {
            rho: 0.5,
            steps: 10,
            tol: 1e-6,
            adaptive: false,
            on_divergence: OnDivergence::Error,
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        check_range("admm.rho", self.rho, f64::MIN_POSITIVE, f64::MAX)?;
        check_range("admm.tol", self.tol, 0.0, f64::MAX)?;
        if self.steps == 0 {
            return Err(InputError::invalid("admm.steps", "at least 1 iteration").into());
        }
        Ok(())
    }

    /// What to change when ADMM's result was unusable.
    pub fn divergence_remedy(&self) -> String {
        format!(
            "ADMM converges for every ρ in exact arithmetic, so this is rounding or msign \
             accuracy: use a more accurate msign (`msign = Msign::Exact` or more Polar Express \
             steps), more iterations (`admm.steps`, now {}), or the dual ascent \
             (`solver = DualSolver::Ascent`); or `admm.on_divergence = OnDivergence::Apply` to \
             apply the step anyway (flagged in `DualReport::diverged`)",
            self.steps
        )
    }
}

impl Default for Admm {
    fn default() -> Self {
        Self::standard()
    }
}

impl DualSolver {
    /// Checks the ADMM settings (the ascent's are checked with the config's `dual`).
    pub fn validate(&self) -> Result<()> {
        match self {
            DualSolver::Ascent => Ok(()),
            DualSolver::Admm(a) => a.validate(),
        }
    }

    /// The divergence policy of this solver (`ascent` is the config's `dual`).
    pub fn on_divergence(&self, ascent: &DualAscent) -> OnDivergence {
        match self {
            DualSolver::Ascent => ascent.on_divergence,
            DualSolver::Admm(a) => a.on_divergence,
        }
    }
}

/// Π_𝔹(X) = U·min(Σ, 1)·Vᵀ from two msign calls (module docs, "Π_𝔹 without an SVD").
pub(crate) fn clip_to_ball<M: WorkingPrecision>(
    x: &M,
    method: Msign,
    precision: Precision,
) -> Result<M> {
    let o = msign(x, method, precision)?;
    let mut e = x.duplicate()?;
    e.axpy(-1.0, &o)?;
    let ot = o.duplicate()?.into_transpose();
    let mut k = sym2(ot.matmul(&e)?)?;
    k.scale(0.5)?;
    let abs_k = msign(&k, method, precision)?.matmul(&k)?;
    // ½·(X + O − O·|K|)
    let mut out = o.mul_add(-1.0, &o, &abs_k, 1.0)?;
    out.axpy(1.0, x)?;
    out.scale(0.5)?;
    Ok(out)
}

/// The ADMM iterates that change from one iteration to the next, in the stable form (module
/// docs, "Numerics"): Y = G/ρ − U (so Z = ρY) instead of U, and Λ with Z = G + 2W·Λ.
struct Iterate<M> {
    b: M,
    y: M,
    lam: M,
    rho: f64,
}

/// ADMM (module docs) on tall W, G: returns the direction (B rescaled into the ball; the step is
/// W − η·A), the multiplier Λ = −ρ·S (Z = G + 2W·P(Λ), in the caller's units) and the
/// diagnostics. Unusable results are only flagged in the report (the caller decides).
pub(crate) fn admm<M: WorkingPrecision>(
    p: &TallProblem<'_, M>,
    proj: Projector,
    cfg: &Admm,
    method: Msign,
    precision: Precision,
    diagnostics: bool,
) -> Result<(M, M, DualReport)> {
    let weights = jacobi_weights(p.w, p.wt)?;
    let space = TangentSpace::new(p.w, p.wt, proj, Some(&weights))?;
    let mut report = DualReport {
        gradient_scale: 1.0,
        projected: true,
        ..DualReport::default()
    };
    let (z0, s0) = space.project(p.g)?;
    let z0_norm = estimate(&z0, 5)?;
    report.z0_norm = Some(z0_norm);
    if !(z0_norm > 0.0 && z0_norm.is_finite()) {
        // G is normal (Z₀ = 0: every tangent A has ⟨G, A⟩ = 0) or the scale is unusable.
        return zero_direction(
            p,
            proj,
            z0,
            s0,
            report,
            z0_norm,
            method,
            precision,
            diagnostics,
        );
    }
    let rho = cfg.rho * z0_norm;
    // U₀ = Π_N(G)/ρ: Y₀ = G/ρ − U₀ = Z₀/ρ, Λ₀ = −S_G (G = Z₀ + 2W·S_G).
    let mut lam = s0;
    lam.scale(-1.0)?;
    let mut b = z0.duplicate()?;
    b.scale(0.0)?;
    let mut y = z0;
    y.scale(1.0 / rho)?;
    let mut it = Iterate { b, y, lam, rho };
    let n = p.w.shape().1 as f64;
    for k in 0..cfg.steps {
        let r = iterate(&space, p.wt, proj, &mut it, method, precision)?;
        // The stopping residual: the ascent's violation measure of A, and B's change in the
        // same normalization (module docs, "Stop").
        let (v, change) = (r.violation, 2.0 * r.change / n);
        let residual = if v.is_nan() || change.is_nan() {
            f64::NAN
        } else {
            v.max(change)
        };
        report.msign_calls += 2;
        report.dual_steps += 1;
        if k == 0 {
            report.initial_violation = residual;
        }
        report.violations.push(residual);
        report.violation = residual;
        if !residual.is_finite() {
            break;
        }
        if residual < cfg.tol {
            report.converged = true;
            break;
        }
        if cfg.adaptive && k + 1 < cfg.steps {
            balance(&mut it, &r, z0_norm)?;
        }
    }
    report.ascent_violation = report.violation;
    finish(p, proj, it, report, method, precision, diagnostics)
}

/// What one iteration measured.
struct Residuals {
    /// ‖P(WᵀA + AᵀW)‖_F/n of the ball iterate A (the ascent's violation measure).
    violation: f64,
    /// ‖A − B‖_F (= ‖U_new − U_old‖_F), the primal residual.
    primal: f64,
    /// ‖B − B_prev‖_F.
    change: f64,
}

/// One ADMM iteration (module docs) in place, in the stable form: with U normal,
/// B = Π_T(A + U) = Π_T(A) and A − B = Π_N(A) = 2W·S, so Y ← Y − 2W·S and Λ ← Λ − ρ·S.
fn iterate<M: WorkingPrecision>(
    space: &TangentSpace<'_, M>,
    wt: &M,
    proj: Projector,
    it: &mut Iterate<M>,
    method: Msign,
    precision: Precision,
) -> Result<Residuals> {
    // A = Π_𝔹(B − U + G/ρ) = Π_𝔹(B + Y)
    let mut x = it.b.duplicate()?;
    x.axpy(1.0, &it.y)?;
    let a = clip_to_ball(&x, method, precision)?;
    // C(A), measured once: the reported violation and the projection's right-hand side.
    let (c, violation) = violation(wt, &a, proj)?;
    let (b, s) = space.project_measured(&a, c)?;
    let mut normal = a;
    normal.axpy(-1.0, &b)?;
    let mut db = b.duplicate()?;
    db.axpy(-1.0, &it.b)?;
    let r = Residuals {
        violation,
        primal: normal.frobenius_norm()?,
        change: db.frobenius_norm()?,
    };
    it.y.axpy(-1.0, &normal)?;
    it.lam.axpy(-it.rho, &s)?;
    it.b = b;
    Ok(r)
}

/// Residual balancing (module docs): with r = ‖A − B‖_F and s = (ρ/‖Z₀‖₂)·‖ΔB‖_F, ρ ← 2ρ
/// (U ← ½U, so Y ← ½Y) when r > 10·s and ρ ← ρ/2 (Y ← 2Y) when s > 10·r; ρU, Z = ρY and Λ are
/// unchanged.
fn balance<M: Matrix>(it: &mut Iterate<M>, r: &Residuals, z0_norm: f64) -> Result<()> {
    let s = it.rho / z0_norm * r.change;
    let factor = if r.primal > 10.0 * s {
        2.0
    } else if s > 10.0 * r.primal {
        0.5
    } else {
        return Ok(());
    };
    it.rho *= factor;
    it.y.scale(1.0 / factor)?;
    Ok(())
}

/// The direction and report when Z₀ = Π_T(G) is 0 (or its norm unusable): A = 0 (every tangent
/// direction has ⟨G, A⟩ = 0), Λ the least-squares multiplier of G.
#[allow(clippy::too_many_arguments)]
fn zero_direction<M: WorkingPrecision>(
    p: &TallProblem<'_, M>,
    proj: Projector,
    mut a: M,
    s: M,
    mut report: DualReport,
    z0_norm: f64,
    method: Msign,
    precision: Precision,
    diagnostics: bool,
) -> Result<(M, M, DualReport)> {
    if z0_norm.is_finite() {
        a.scale(0.0)?;
    }
    let (_, v) = violation(p.wt, &a, proj)?;
    report.initial_violation = v;
    report.violation = v;
    report.ascent_violation = v;
    report.violations.push(v);
    report.converged = v.is_finite();
    finish_report(&mut report, p.g, &a, method, precision, diagnostics)?;
    report.diverged = !v.is_finite();
    let mut lam = s;
    lam.scale(-1.0)?;
    Ok((a, lam, report))
}

/// The feasible direction from the last B, the certificate ‖Z‖_* (one msign), Λ = −ρ·S.
fn finish<M: WorkingPrecision>(
    p: &TallProblem<'_, M>,
    proj: Projector,
    it: Iterate<M>,
    mut report: DualReport,
    method: Msign,
    precision: Precision,
    diagnostics: bool,
) -> Result<(M, M, DualReport)> {
    let a = rescale_to_ball(it.b, RESCALE_SQUARINGS)?;
    report.violation = violation(p.wt, &a, proj)?.1;
    let lam = it.lam;
    // Z = G − ρU = ρY (= G + 2W·Λ); ‖Z‖_* = ⟨Z, msign(Z)⟩ bounds every feasible descent.
    let mut z = it.y;
    z.scale(it.rho)?;
    let nuclear = z.inner(&msign(&z, method, precision)?)?;
    report.msign_calls += 1;
    report.dual_objective.push(-nuclear);
    finish_report(&mut report, p.g, &a, method, precision, diagnostics)?;
    if nuclear > 0.0 && nuclear.is_finite() {
        report.gap = Some(1.0 - report.descent / nuclear);
    }
    report.diverged = !report.ascent_violation.is_finite()
        || !report.violation.is_finite()
        || report.descent < 0.0;
    Ok((a, lam, report))
}
