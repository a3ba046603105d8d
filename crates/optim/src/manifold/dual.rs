//! The dual ascent that finds manifold Muon's steepest spectral-norm direction in the tangent
//! space, for any Gram projector P (identity for Stiefel, Off for DGram, Diag for Oblique).
//!
//! # Math (derived here; summary in docs/optim.md, "Math")
//!
//! W ∈ ℝ^{m×n}, m ≥ n, on {W : P(WᵀW) = P(I)}; tangent space T_W = {A : P(WᵀA + AᵀW) = 0}. The
//! direction solves min_A ⟨G, A⟩ s.t. ‖A‖₂ ≤ 1, A ∈ T_W. With a symmetric multiplier Λ the
//! Lagrangian is ⟨G + 2W·P(Λ), A⟩, its minimum over the spectral ball is at
//! −msign(G + 2W·P(Λ)), and the dual function is D(Λ) = −‖G + 2W·P(Λ)‖_* (concave). Its
//! supergradient is −H with H = P(WᵀA + AᵀW), A = msign(G + 2W·P(Λ)). The code convention
//! (the paper's): the candidate is A (the step is W − η·A) and
//!
//! ```text
//! Λ₀ = −¼·P(WᵀG + GᵀW)
//! for k = 0 .. K−1:
//!     A = msign(G + 2W·P(Λ));  H = P(WᵀA + AᵀW)
//!     if ‖H‖_F/n < tol: stop
//!     Λ ← Λ − α·(1 − k/K)·H
//! ```
//!
//! For square Stiefel W (WWᵀ = I), G + 2WΛ₀ = ½·W(WᵀG − GᵀW) and its msign W·msign(WᵀG − GᵀW)
//! is exactly tangent, so the loop stops at k = 0 ([`stiefel_square_direction`] is that closed
//! form).
//!
//! # Oblique (P = Diag, diag(WᵀW) = 1)
//!
//! Λ = diag(λ), one multiplier per column: 2W·P(Λ) = 2W·diag(λ) scales column j of W by 2λ_j,
//! H = Diag(WᵀA + AᵀW) = 2·diag(w_jᵀa_j) and the reported violation is 2‖(w_jᵀa_j)_j‖₂/n. The
//! constraint operator C(A) = Diag(WᵀA + AᵀW), adjoint C*(Λ) = 2W·Λ, has
//! C·C*(Λ) = 2·Diag(WᵀW·Λ + Λ·WᵀW) = 4·diag(‖w_j‖²)·Λ = 4Λ on the manifold, a multiple of the
//! identity, so: Λ₀ = −½·diag(w_jᵀg_j) is the least-squares multiplier and
//! Z₀ = G − W·diag(w_jᵀg_j) is *exactly* the Frobenius projection of G onto T_W (column by
//! column); the Jacobi preconditioner is 1 up to the rounding of ‖w_j‖² (a no-op, as on
//! Stiefel); the tangent projection's conjugate gradients stop after one step (S = C(A)/4).
//!
//! **No closed form in general.** The dual D(λ) = −‖G + 2W·diag(λ)‖_* is n-dimensional, but
//! msign(Z) = Z·(ZᵀZ)^{−1/2} mixes the columns: a_j = Σ_k z_k·c_kj with C = (ZᵀZ)^{−1/2}, so
//! the optimality conditions w_jᵀa_j(λ) = Σ_{k≠j} (w_jᵀz_k)·c_kj = 0 (w_jᵀz_j = 0 at Z₀) are n
//! equations coupled through the inverse square root of an n×n Gram. (Square Stiefel has a
//! closed form because its normal space W·Sym is matched by an orthogonal W: Z₀ = ½W·skew and
//! msign keeps W·Skew; the Oblique normal space W·Diag has no such match.) msign(Z₀) — the
//! first candidate, so the loop stops at k = 0 — is the exact answer when it is tangent: for
//! n = 1 (msign(z) = z/‖z‖ ⊥ w) and whenever Z₀'s columns are mutually orthogonal (C
//! diagonal). Otherwise the ascent runs as on the other manifolds.
//!
//! # Traps
//!
//! * **Not scale-invariant** (docs/optim.md, "Traps"): the primal answer is invariant under G → cG, but α·H has
//!   a fixed O(1) size while Λ scales with G. With α = 0.1, K = 20, gradients with entries ~1e-4
//!   make the ascent diverge; entries ~1 barely move it. [`DualAscent::normalize`] rescales the
//!   problem before the ascent; the answer is unchanged in exact arithmetic. Off in the paper
//!   preset.
//! * **Normalize Z₀, not G.** The ascent starts at Λ₀, which (on Stiefel exactly) cancels the
//!   normal component W·sym(WᵀG) of G: everything after k = 0 works on Z₀ = G + 2W·P(Λ₀), and
//!   Λ − Λ₀ scales with Z₀, not with G. Near a constrained optimum G is mostly normal — in the
//!   optim-geometry experiment (least squares, κ(X) = 100, W 128×48 on Stiefel) ‖Z₀‖₂/‖G‖₂
//!   falls from 0.86 at step 0 to 0.025 from step 50 on — so the earlier rule "‖G‖₂ = 0.3" put
//!   Z₀ at ≈ 0.0075, the regime where α = 0.1 diverges (entries ~1e-4 above): final violation 0.28 and
//!   descents ⟨G, A⟩ down to −2.7× the optimum (the step *raised* the loss), worse than no
//!   normalization at all (0.07). `normalize` therefore sets ‖Z₀‖₂ (upper estimate) to the
//!   target.
//! * **Ill-conditioned Z₀ makes the dual stiff** (a property, not a bug). The dual is smooth
//!   near a full-rank Z with curvature ~ 1/σ_min(Z), so a first-order ascent needs ~κ(Z₀)
//!   iterations. Gaussian tall G have κ(Z₀) ≈ 4 (128×48) and converge in 20 steps (3.6e-4);
//!   the experiment's have κ(Z₀) ≈ 40–50 (σ of G spread over 10³–10⁴ by κ(X)² = 10⁴), and
//!   with K = 20 no fixed α brings the violation below ≈ 1e-2 (α = 0.01, K = 1500 reaches 1e-6,
//!   so the optimum is attainable: not a rank or non-smoothness problem).
//! * `tol` = 1e-6 essentially never triggers for tall matrices within 20 steps, so K is a fixed
//!   cost of K msign calls. Square DGram has no closed form and does not converge with
//!   α = 0.1, K = 20 (docs/optim.md, "DGram: a preconditioned dual ascent").
//! * Divergence is detected, not hidden: if the ascent's final violation is non-finite or exceeds
//!   `divergence_factor` × max(initial violation, tol), or the dual objective fell below
//!   `divergence_factor` × its starting value, or the returned direction has ⟨G, A⟩ < 0 (it
//!   would raise the loss), the step is reported as diverged (an error by default, see
//!   [`OnDivergence`]). Only the final value is compared with the start, so an ordinary
//!   non-monotone ascent is not flagged (experiment, paper default: 0 of 600 flagged, violations
//!   8e-2 → 1e-1); the 2939 of 3000 flagged with the old normalization were real failures
//!   (violation 0.054 → 0.26, descent 0.38× the optimum after projection). Default factor 2,
//!   calibrated on f64 runs: badly scaled ascents end at violations 5–10× their start (e.g.
//!   96×32 Stiefel, entries 1e-4: 0.038 → 0.35, descent ratio 0.08) or, for square DGram, with a
//!   dual objective 25× lower, while well-scaled ones end below their start.
//!
//! # Feasible directions ([`DualAscent::project`], preset [`DualAscent::feasible`])
//!
//! When the ascent stops short, its candidate A = msign(Z_K) has unit singular values but is not
//! tangent; the retraction then absorbs a normal step of size ~violation·η. With `project`, the
//! last candidate is orthogonally projected onto T_W and rescaled to unit spectral norm (see
//! `project_tangent`); the projected gradient is the fallback when it gives more descent. The
//! result is feasible, so weak duality certifies it: ⟨G, A⟩ ≤ p* ≤ min_k ‖Z_k‖_*, reported as
//! [`DualReport::gap`]. Measured on the experiment's Stiefel gradients (600 steps, f64): violation
//! ≈ 1e-16 instead of 0.08, certified gap median 0.12 (the true loss against a 1500-step
//! reference optimum: 5–10 %); on Gaussian 128×48 the projection changes the descent by < 0.5 %.
//! It costs two n×n conjugate-gradient solves (one step on Stiefel) and two spectral-norm
//! estimates per step, no extra msign. A smaller α (0.03) tightens the experiment's gap to 0.09;
//! warm-starting Λ from the previous step (suggested by the Modula docs) made it worse there
//! (0.18), because successive minibatch problems differ more than the ascent converges.
//!
//! # Preconditioned ascent ([`DualAscent::precondition`], preset [`DualAscent::preconditioned_feasible`])
//!
//! On DGram, W = Q·D (QᵀQ = I, D = diag(d) the column norms), and the constraint operator
//! C(A) = Off(WᵀA + AᵀW) with adjoint C*(Λ) = 2W·Λ gives C·C*(Λ) = 2·Off(D²Λ + ΛD²): diagonal in
//! the entry basis with entries 2(d_i² + d_j²). A plain dual step −α·H therefore moves the (i, j)
//! multiplier at a rate proportional to d_i² + d_j², a spread of (d_max/d_min)² on top of the
//! κ(Z₀) stiffness above; in the W = Q·D coordinates the tangency condition is
//! Off(D·B + Bᵀ·D) = 0 with B = QᵀA, whose scale is set by D. The preconditioned ascent divides
//! Λ₀ and every step entrywise by (d_i² + d_j²)/2 (Jacobi, [`kappa_linalg::Matrix::scale_entries`]):
//!
//! ```text
//! Λ₀ = −¼·P(WᵀG + GᵀW) ⊘ M,   Λ ← Λ − α(1 − k/K)·H ⊘ M,   M_ij = (d_i² + d_j²)/2
//! ```
//!
//! With M, Λ₀ removes G's normal component exactly (G + 2W·Λ₀ is the orthogonal projection of G
//! onto T_W; without it only when all d_j are equal), and the tangent projection's conjugate
//! gradients use the same preconditioner. On Stiefel (d = 1) M = 1 and nothing changes. Measured
//! (f64, exact msign, 36 DGram problems, column norms 0.5–2, 48×16 to 128×48): on gradients with
//! σ spread over 1e3 plus a normal part, `feasible()` gives ascent violation 0.46 (median) and a
//! certified gap 0.93; preconditioned (α = 0.1) 0.23 and 0.23; preconditioned with α = 0.03 (the
//! preset) 0.20 and 0.17 (max 0.22), no divergence flagged. On Gaussian gradients the
//! preconditioned ascent converges (violation ≤ 2e-3, gap ≤ 2e-3) where the plain one stops at
//! 0.016–0.047. The paper preset keeps the unpreconditioned ascent.

use kappa_linalg::input::InputError;
use kappa_linalg::Matrix;
use serde::{Deserialize, Serialize};

/// The remedy when the ascent's products overflow f64 (entries near `f64::MAX`): no setting of
/// the ascent helps; the input must be rescaled.
const OVERFLOW_REMEDY: &str = "the gradient's entries are too large for f64 products (near \
    `f64::MAX`); rescale the gradient (msign and the direction are scale-invariant)";

use crate::error::{check_range, OptimError, Result};
use crate::msign::{msign, Msign};
use crate::precision::{Precision, WorkingPrecision};

/// The self-adjoint projector on symmetric n×n matrices that picks the manifold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Projector {
    /// P = Id: the Stiefel manifold WᵀW = I.
    Identity,
    /// P = Off (zero the diagonal): DGram, Off(WᵀW) = 0.
    OffDiagonal,
    /// P = Diag (keep only the diagonal): Oblique, diag(WᵀW) = 1.
    Diagonal,
}

impl Projector {
    /// Applies P in place.
    pub fn apply<M: Matrix>(&self, s: &mut M) -> Result<()> {
        match self {
            Projector::Identity => Ok(()),
            Projector::OffDiagonal => {
                let k = s.shape().0.min(s.shape().1);
                s.set_diagonal(&vec![0.0; k])?;
                Ok(())
            }
            Projector::Diagonal => {
                // 0·x on the off-diagonal: a non-finite entry there becomes NaN, which every
                // caller's finiteness check rejects as it rejects ±∞.
                let d = s.diagonal()?;
                s.scale(0.0)?;
                s.set_diagonal(&d)?;
                Ok(())
            }
        }
    }
}

/// What to do when the dual ascent diverges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDivergence {
    /// Return [`OptimError::DualAscentDiverged`]; the parameter and state are left unchanged.
    #[default]
    Error,
    /// Apply the step anyway (as the paper's code did) and flag it in [`DualReport::diverged`].
    Apply,
}

/// Dual-ascent settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DualAscent {
    /// The dual step α > 0 (decayed linearly: α·(1 − k/K) at step k).
    pub alpha: f64,
    /// K ≥ 1, the most msign calls.
    pub steps: usize,
    /// Stop when ‖H‖_F/n < tol.
    pub tol: f64,
    /// Rescale the problem so that the tangent-projected gradient Z₀ = G + 2W·P(Λ₀) has this
    /// spectral norm before the ascent (`None`: the paper's unnormalized mode). See the module
    /// docs for why Z₀ and not G.
    pub normalize: Option<f64>,
    /// Project the ascent's last candidate onto the tangent space and rescale it to unit spectral
    /// norm, so the returned direction is feasible whether or not the ascent converged (off in
    /// the paper preset; see the module docs, "Feasible directions").
    #[serde(default)]
    pub project: bool,
    /// Precondition the ascent (module docs, "Preconditioned ascent"): divide Λ₀ and every dual
    /// step entrywise by (d_i² + d_j²)/2, d_j² = (WᵀW)_jj, the diagonal of the constraint
    /// operator Λ ↦ P(WᵀW·Λ + Λ·WᵀW); also preconditions the tangent projection. A no-op on
    /// Stiefel (d = 1); on DGram it removes the (d_max/d_min)² stiffness. Off in the presets.
    #[serde(default)]
    pub precondition: bool,
    /// Divergence threshold factor (> 1) on the violation, see the module docs.
    pub divergence_factor: f64,
    /// What to do on divergence.
    pub on_divergence: OnDivergence,
}

impl DualAscent {
    /// The paper's settings: α = 0.1, K = 20, tol = 1e-6, no normalization.
    pub const fn paper() -> Self {
        Self {
            alpha: 0.1,
            steps: 20,
            tol: 1e-6,
            normalize: None,
            project: false,
            precondition: false,
            divergence_factor: 2.0,
            on_divergence: OnDivergence::Error,
        }
    }

    /// Bernstein's Modula docs / Thinking Machines code: α = 0.01, K = 100, tol = 1e-6.
    pub const fn modula() -> Self {
        Self {
            alpha: 0.01,
            steps: 100,
            tol: 1e-6,
            normalize: None,
            project: false,
            precondition: false,
            divergence_factor: 2.0,
            on_divergence: OnDivergence::Error,
        }
    }

    /// The default target spectral norm for [`DualAscent::normalize`].
    pub const NORMALIZE_TARGET: f64 = 0.3;

    /// These settings with the problem normalized to ‖Z₀‖₂ = [`Self::NORMALIZE_TARGET`].
    pub const fn normalized(mut self) -> Self {
        self.normalize = Some(Self::NORMALIZE_TARGET);
        self
    }

    /// These settings with the returned direction projected onto the tangent space
    /// ([`DualAscent::project`]).
    pub const fn projected(mut self) -> Self {
        self.project = true;
        self
    }

    /// These settings with the ascent preconditioned by the column norms of W
    /// ([`DualAscent::precondition`]).
    pub const fn preconditioned(mut self) -> Self {
        self.precondition = true;
        self
    }

    /// The option for ill-conditioned gradients (module docs, "Feasible directions"): the paper's
    /// α = 0.1, K = 20, tol = 1e-6 on the problem normalized to ‖Z₀‖₂ = 0.3, and the last
    /// candidate projected onto the tangent space and rescaled to unit spectral norm.
    pub const fn feasible() -> Self {
        Self::paper().normalized().projected()
    }

    /// The option for DGram (module docs, "Preconditioned ascent"): [`DualAscent::feasible`] with
    /// the ascent preconditioned by the column norms and α = 0.03 (K = 20, tol = 1e-6). On
    /// Stiefel it is `feasible()` with α = 0.03.
    pub const fn preconditioned_feasible() -> Self {
        let mut d = Self::feasible().preconditioned();
        d.alpha = 0.03;
        d
    }

    /// What to change when this ascent diverged, as settings a user writes (for the report of a
    /// diverged ascent: [`ManifoldMuon::solve`](crate::manifold::ManifoldMuon::solve), or a step
    /// with [`OnDivergence::Apply`]).
    ///
    /// Unnormalized (the paper and Modula presets): `dual.normalize = Some(0.3)`
    /// ([`DualAscent::normalized`]), and the α that gives the *same* ascent on this gradient
    /// without normalizing: the ascent on s·G with α is the ascent on G with α/s (Λ scales with
    /// G and msign is scale-invariant, so Z and H are unchanged), and normalizing multiplies G by
    /// s = 0.3/‖Z₀‖₂, so `dual.alpha = α·‖Z₀‖₂/0.3` ([`DualReport::z0_norm`]). Normalized: a
    /// smaller α (a third) or `dual.project = true` ([`DualAscent::feasible`], a tangent direction
    /// whether or not the ascent converges). Always: `dual.on_divergence = OnDivergence::Apply`
    /// applies the step anyway, flagged in [`DualReport::diverged`].
    pub fn divergence_remedy(&self, report: &DualReport) -> String {
        let apply = "or `dual.on_divergence = OnDivergence::Apply` to apply the step anyway \
                     (flagged in `DualReport::diverged`)";
        match (self.normalize, report.z0_norm) {
            (None, Some(z0)) if z0 > 0.0 && z0.is_finite() => format!(
                "set `dual.normalize = Some({t})` (`DualAscent::paper().normalized()`: the \
                 problem is rescaled by {t}/‖Z₀‖₂ = {s:.3e}, the scale α = {a} is meant for), or \
                 equivalently on this gradient `dual.alpha = {a2:.3e}` (α·‖Z₀‖₂/{t}, ‖Z₀‖₂ = \
                 {z0:.3e}), {apply}",
                t = Self::NORMALIZE_TARGET,
                s = Self::NORMALIZE_TARGET / z0,
                a = self.alpha,
                a2 = self.alpha * z0 / Self::NORMALIZE_TARGET,
            ),
            (None, _) => format!(
                "set `dual.normalize = Some({t})` (`DualAscent::paper().normalized()`), {apply}",
                t = Self::NORMALIZE_TARGET
            ),
            (Some(_), _) => format!(
                "lower `dual.alpha` (e.g. `dual.alpha = {a3:.3e}`, a third of {a}), or set \
                 `dual.project = true` (`DualAscent::feasible()`: a tangent direction whether or \
                 not the ascent converges), {apply}",
                a = self.alpha,
                a3 = self.alpha / 3.0,
            ),
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        check_range("dual.alpha", self.alpha, f64::MIN_POSITIVE, f64::MAX)?;
        check_range("dual.tol", self.tol, 0.0, f64::MAX)?;
        check_range(
            "dual.divergence_factor",
            self.divergence_factor,
            1.0,
            f64::MAX,
        )?;
        if self.steps == 0 {
            return Err(InputError::invalid("dual.steps", "K must be at least 1").into());
        }
        if let Some(t) = self.normalize {
            check_range("dual.normalize", t, f64::MIN_POSITIVE, f64::MAX)?;
        }
        Ok(())
    }
}

/// Diagnostics of one direction computation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DualReport {
    /// msign calls in the ascent (K when it did not converge; 1 for the square closed form; for
    /// ADMM 2 per iteration + 1 for the certificate).
    pub msign_calls: usize,
    /// Dual updates applied to Λ.
    pub dual_steps: usize,
    /// ‖H‖_F/n at the initial multiplier Λ₀.
    pub initial_violation: f64,
    /// ‖H‖_F/n of the returned direction A (after the projection when
    /// [`DualAscent::project`] is on: then ≈ 0 up to rounding and W's own manifold error).
    pub violation: f64,
    /// ‖H‖_F/n of the ascent's last candidate, before any projection (equal to `violation`
    /// without projection). The divergence test reads this one.
    pub ascent_violation: f64,
    /// The direction was projected onto the tangent space and rescaled ([`DualAscent::project`]).
    pub projected: bool,
    /// Relative duality gap 1 − ⟨G, A⟩/min_k ‖G + 2W·P(Λ_k)‖_*: every feasible direction has
    /// ⟨G, A⟩ ≤ min_k ‖Z_k‖_* (weak duality), so when A is feasible (projected, or converged) the
    /// optimal descent is at most a factor 1/(1 − gap) above the achieved one. `None` for the
    /// square closed form (exact) and when G = 0.
    pub gap: Option<f64>,
    /// The violation fell below `tol`.
    pub converged: bool,
    /// The divergence test fired (only seen with [`OnDivergence::Apply`]).
    pub diverged: bool,
    /// ⟨G, A⟩ (the descent −⟨G, −A⟩ achieved per unit learning rate).
    pub descent: f64,
    /// ‖G‖_* (Muon's unconstrained descent), when diagnostics are on.
    pub nuclear_norm: Option<f64>,
    /// ⟨G, A⟩/‖G‖_* ≤ 1, when diagnostics are on.
    pub descent_ratio: Option<f64>,
    /// The tangent violation ‖H‖_F/n of each candidate, one per msign call, in order
    /// (`initial_violation` is the first, `ascent_violation` the last); for ADMM one per
    /// iteration, the larger of the ball iterate's violation and B's change (admm.rs, "Stop").
    pub violations: Vec<f64>,
    /// The dual objective −‖G' + 2W·P(Λ)‖_* at each msign call (G' the possibly normalized G;
    /// empty for the square closed form; for ADMM one entry, −‖G − ρU‖_* at the end). Up to
    /// msign's accuracy (exact for `Msign::Exact`).
    pub dual_objective: Vec<f64>,
    /// The factor G was multiplied by before the ascent (1 without normalization).
    pub gradient_scale: f64,
    /// An upper estimate of ‖Z₀‖₂, Z₀ = G + 2W·P(Λ₀) of the caller's (unnormalized) G: computed
    /// when [`DualAscent::normalize`] is on (it sets the scale) and when the ascent diverged (it
    /// sizes the advice of [`DualAscent::divergence_remedy`]); `None` otherwise.
    pub z0_norm: Option<f64>,
}

/// An upper estimate of ‖G‖₂ from ‖(GᵀG)^p‖_F^{1/(2p)}, p = 2^`squarings` (G tall, m ≥ n;
/// a wide G is estimated through GGᵀ, the same value).
///
/// In exact arithmetic it is never below ‖G‖₂ (‖S^p‖_F ≥ ‖S^p‖₂ = ‖G‖₂^{2p} for S = GᵀG) and at
/// most rank^{1/(2p)}·‖G‖₂ above it (1.11× for rank 768 with 5 squarings), and it is at most
/// ‖G‖_F (the value for `squarings = 0`); computed, it is within a few n·ε (relative) of that
/// interval. G is first scaled by an exact power of two to ‖G‖_F ∈ [0.5, 2) when its norm is far
/// from 1, so every finite G works, from subnormal entries to `f64::MAX` (docs/optim.md,
/// "Scale"); the result is +∞ only when ‖G‖₂ itself exceeds `f64::MAX`. Returns 0 for G = 0.
/// Cost: 2mn² + 2n³ flops per squaring; generic over the backend (no random start vectors, only
/// products).
///
/// Errors: `g` empty or non-finite (argument `g`), backend failures.
pub fn spectral_norm_estimate<M: Matrix>(g: &M, squarings: usize) -> Result<f64> {
    g.validate("g").map_err(crate::error::from_linalg)?;
    estimate(g, squarings)
}

/// [`spectral_norm_estimate`] without the input check, for the crate's own intermediate
/// matrices: NaN when `g` has a non-finite entry (callers test the result).
pub(crate) fn estimate<M: Matrix>(g: &M, squarings: usize) -> Result<f64> {
    let fro = g.frobenius_norm()?;
    if fro.is_nan() || (fro.is_infinite() && g.validate("g").is_err()) {
        return Ok(f64::NAN);
    }
    let (scaled, k) = match crate::msign::power_of_two_scaled(g)? {
        Some((y, k)) => (Some(y), k),
        None => (None, 0),
    };
    let est = unit_scale_estimate(scaled.as_ref().unwrap_or(g), squarings)?;
    // Undo the scaling in two halves (2^-k alone may overflow for subnormal inputs).
    let half = 2f64.powi(-k / 2);
    Ok(est * half * 2f64.powi(-k - (-k / 2)))
}

/// [`spectral_norm_estimate`] on a G of safe scale (no overflow in GᵀG and its powers, which are
/// renormalized to unit Frobenius norm at every squaring).
fn unit_scale_estimate<M: Matrix>(g: &M, squarings: usize) -> Result<f64> {
    let (m, n) = g.shape();
    let g = g.duplicate()?;
    let mut s = if m >= n { g.into_transpose() } else { g }.gram()?;
    let f = s.frobenius_norm()?;
    if f == 0.0 || !f.is_finite() {
        return Ok(f.sqrt());
    }
    s.scale(1.0 / f)?;
    let mut log = f.ln();
    let mut p = 1.0;
    for _ in 0..squarings.min(60) {
        let mut sq = s.matmul(&s)?;
        let f = sq.frobenius_norm()?;
        if f == 0.0 || !f.is_finite() {
            break;
        }
        sq.scale(1.0 / f)?;
        s = sq;
        log = 2.0 * log + f.ln();
        p *= 2.0;
    }
    Ok((log / p).exp().sqrt())
}

/// Returns X + Xᵀ for a square X.
pub(crate) fn sym2<M: Matrix>(x: M) -> Result<M> {
    let t = x.duplicate()?.into_transpose();
    let mut x = x;
    x.axpy(1.0, &t)?;
    Ok(x)
}

/// The tangent violation H = P(WᵀA + AᵀW) and ‖H‖_F/n. `wt` is Wᵀ.
pub(crate) fn violation<M: Matrix>(wt: &M, a: &M, proj: Projector) -> Result<(M, f64)> {
    let mut h = sym2(wt.matmul(a)?)?;
    proj.apply(&mut h)?;
    let n = h.shape().0 as f64;
    let v = h.frobenius_norm()? / n;
    Ok((h, v))
}

/// Inputs of the ascent, in the tall orientation (m ≥ n).
pub(crate) struct TallProblem<'a, M> {
    pub w: &'a M,
    pub wt: &'a M,
    pub g: &'a M,
}

/// Where the ascent starts (module docs): Λ₀ in the units of the ascent's G, that G when the
/// normalization changed it (the ascent runs on `scaled_g`, or on the caller's G when `None`),
/// the Jacobi weights when preconditioned, and the report so far.
pub(crate) struct AscentStart<M> {
    pub lam: M,
    pub scaled_g: Option<M>,
    pub weights: Option<Vec<f64>>,
    pub report: DualReport,
}

/// Λ₀ = −¼·P(WᵀG + GᵀW) (⊘ the Jacobi weights' inverse when preconditioned), so that
/// Z₀ = G + 2W·P(Λ₀) is G with its normal component removed: the ascent only ever works on Z₀
/// (module docs).
fn initial_multiplier<M: Matrix>(
    p: &TallProblem<'_, M>,
    proj: Projector,
    weights: Option<&[f64]>,
) -> Result<M> {
    let mut lam = sym2(p.wt.matmul(p.g)?)?;
    lam.scale(-0.25)?;
    proj.apply(&mut lam)?;
    if let Some(wts) = weights {
        lam.scale_entries(wts)?;
    }
    Ok(lam)
}

/// The ascent's starting point (Λ₀, the normalization of [`DualAscent::normalize`], the
/// Jacobi weights of [`DualAscent::precondition`]), shared by the per-matrix and the batched
/// ascent.
pub(crate) fn start_ascent<M: WorkingPrecision>(
    p: &TallProblem<'_, M>,
    proj: Projector,
    cfg: &DualAscent,
) -> Result<AscentStart<M>> {
    let mut report = DualReport {
        gradient_scale: 1.0,
        ..DualReport::default()
    };
    let weights = match cfg.precondition {
        true => Some(jacobi_weights(p.w, p.wt)?),
        false => None,
    };
    let mut lam = initial_multiplier(p, proj, weights.as_deref())?;
    let mut scaled_g = None;
    if let Some(target) = cfg.normalize {
        let est = estimate(&p.g.mul_add(2.0, p.w, &lam, 1.0)?, 5)?;
        report.z0_norm = Some(est);
        if est > 0.0 && est.is_finite() {
            report.gradient_scale = target / est;
            let mut gs = p.g.duplicate()?;
            gs.scale(report.gradient_scale)?;
            lam.scale(report.gradient_scale)?;
            scaled_g = Some(gs);
        }
    }
    Ok(AscentStart {
        lam,
        scaled_g,
        weights,
        report,
    })
}

/// The error for a Z = G + 2W·P(Λ) that overflowed (entries near `f64::MAX`): the ascent
/// cannot continue.
pub(crate) fn overflow<M: Matrix>(report: &DualReport, g: &M) -> Result<OptimError> {
    Ok(OptimError::DualAscentDiverged {
        steps: report.dual_steps,
        initial_violation: report.initial_violation,
        violation: f64::INFINITY,
        gradient_norm: g.frobenius_norm()?,
        remedy: OVERFLOW_REMEDY.to_string(),
    })
}

/// Records candidate `k`'s dual objective −⟨Z, A⟩ and violation `v`; true when the ascent
/// stops at it (converged below `tol`, or a non-finite violation).
pub(crate) fn record(report: &mut DualReport, k: usize, objective: f64, v: f64, tol: f64) -> bool {
    report.msign_calls += 1;
    report.dual_objective.push(objective);
    if k == 0 {
        report.initial_violation = v;
    }
    report.violation = v;
    report.violations.push(v);
    report.converged = v < tol;
    report.converged || !v.is_finite()
}

impl DualAscent {
    /// The step size of dual update `k`: α·(1 − k/K).
    pub(crate) fn step_size(&self, k: usize) -> f64 {
        self.alpha * (1.0 - k as f64 / self.steps as f64)
    }
}

/// The dual ascent (module docs) on tall W, G: returns the candidate A (step W − η·A), the
/// multiplier Λ of the last candidate (in the caller's units of G) and the diagnostics.
/// Divergence is reported in the report, not as an error (the caller decides).
pub(crate) fn ascend<M: WorkingPrecision>(
    p: &TallProblem<'_, M>,
    proj: Projector,
    cfg: &DualAscent,
    method: Msign,
    precision: Precision,
    diagnostics: bool,
) -> Result<(M, M, DualReport)> {
    let AscentStart {
        mut lam,
        scaled_g,
        weights,
        mut report,
    } = start_ascent(p, proj, cfg)?;
    let g = scaled_g.as_ref().unwrap_or(p.g);
    let mut a = None;
    for k in 0..cfg.steps {
        let z = g.mul_add(2.0, p.w, &lam, 1.0)?;
        if !z.frobenius_norm()?.is_finite() {
            return Err(overflow(&report, p.g)?);
        }
        let cand = msign(&z, method, precision)?;
        let (h, v) = violation(p.wt, &cand, proj)?;
        let stop = record(&mut report, k, -z.inner(&cand)?, v, cfg.tol);
        a = Some(cand);
        if stop {
            break;
        }
        if k + 1 < cfg.steps {
            let mut step = h;
            if let Some(wts) = &weights {
                step.scale_entries(wts)?;
            }
            lam.axpy(-cfg.step_size(k), &step)?;
            report.dual_steps += 1;
        }
    }
    let a = a.ok_or_else(|| InputError::invalid("dual.steps", "K must be at least 1"))?;
    let ascent = Ascent {
        a,
        lam,
        report,
        g_sign: None,
    };
    let weights = weights.as_deref();
    finish_ascent(
        p,
        proj,
        cfg,
        weights,
        ascent,
        method,
        precision,
        diagnostics,
    )
}

/// What the ascent's loop ended with: the last candidate, its multiplier (in the units of the
/// ascent's G) and the report.
pub(crate) struct Ascent<M> {
    pub a: M,
    pub lam: M,
    pub report: DualReport,
    /// msign(G) of the caller's G when already computed (the ‖G‖_* diagnostic).
    pub g_sign: Option<M>,
}

/// After the loop (shared by the per-matrix and the batched ascent): the optional projection
/// onto the tangent space ([`DualAscent::project`]), the descent diagnostics, the certified gap,
/// the divergence test, and Λ back in the caller's units.
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish_ascent<M: WorkingPrecision>(
    p: &TallProblem<'_, M>,
    proj: Projector,
    cfg: &DualAscent,
    weights: Option<&[f64]>,
    ascent: Ascent<M>,
    method: Msign,
    precision: Precision,
    diagnostics: bool,
) -> Result<(M, M, DualReport)> {
    let Ascent {
        mut a,
        mut lam,
        mut report,
        g_sign,
    } = ascent;
    report.ascent_violation = report.violation;
    if cfg.project && !report.converged && report.violation.is_finite() {
        // Two feasible candidates: the projected ascent candidate and the projected gradient
        // (a safe fallback when the ascent went astray); keep the one with the larger descent.
        let from_ascent = project_tangent(p.w, p.wt, &a, proj, weights)?;
        let from_gradient = project_tangent(p.w, p.wt, p.g, proj, weights)?;
        a = if p.g.inner(&from_gradient)? > p.g.inner(&from_ascent)? {
            from_gradient
        } else {
            from_ascent
        };
        report.violation = violation(p.wt, &a, proj)?.1;
        report.projected = true;
    }
    match g_sign {
        Some(sign) if diagnostics => describe_descent(&mut report, p.g, &a, Some(&sign))?,
        _ => finish_report(&mut report, p.g, &a, method, precision, diagnostics)?,
    }
    // Weak duality on the (possibly normalized) problem: ⟨G', A⟩ ≤ min_k ‖Z_k‖_*.
    let best = report
        .dual_objective
        .iter()
        .fold(f64::NEG_INFINITY, |m, &d| m.max(d));
    if best < 0.0 && best.is_finite() {
        report.gap = Some(1.0 - report.gradient_scale * report.descent / -best);
    }
    report.diverged = diverged(&report, cfg);
    if report.diverged && report.z0_norm.is_none() {
        // Size the advice (DualAscent::divergence_remedy): ‖Z₀‖₂ of the caller's G, from Λ₀.
        let lam0 = initial_multiplier(p, proj, weights)?;
        report.z0_norm = Some(estimate(&p.g.mul_add(2.0, p.w, &lam0, 1.0)?, 5)?);
    }
    // Λ in the caller's units: the ascent ran on G' = gradient_scale·G.
    if report.gradient_scale != 1.0 {
        lam.scale(1.0 / report.gradient_scale)?;
    }
    Ok((a, lam, report))
}

/// The feasible direction nearest the candidate `a`: orthogonally projected (Frobenius) onto
/// T_W = {A : P(WᵀA + AᵀW) = 0} and rescaled to spectral norm ≤ 1 (module docs, "Feasible
/// directions"). `wt` is Wᵀ.
///
/// The projection is [`TangentSpace::project`]; the rescaling divides by an upper estimate of the
/// spectral norm (≤ 1.004× high for rank ≤ 4096), so ‖A‖₂ ∈ [0.996, 1] ([`rescale_to_ball`]).
pub(crate) fn project_tangent<M: Matrix>(
    w: &M,
    wt: &M,
    a: &M,
    proj: Projector,
    weights: Option<&[f64]>,
) -> Result<M> {
    let space = TangentSpace::new(w, wt, proj, weights)?;
    let (out, _) = space.project(a)?;
    rescale_to_ball(out, 10)
}

/// `y / ν` with ν the `squarings`-squaring upper estimate of ‖y‖₂ (unchanged when ν is 0 or
/// non-finite): ‖y/ν‖₂ ∈ [rank^{−1/2^{squarings+1}}, 1] up to rounding
/// ([`spectral_norm_estimate`]); `project` uses 10 squarings (‖A‖₂ ≥ 0.996 for rank ≤ 4096).
pub(crate) fn rescale_to_ball<M: Matrix>(mut y: M, squarings: usize) -> Result<M> {
    let norm = estimate(&y, squarings)?;
    if norm > 0.0 && norm.is_finite() {
        y.scale(1.0 / norm)?;
    }
    Ok(y)
}

/// The tangent space T_W = {A : C(A) = 0}, C(A) = P(WᵀA + AᵀW), of tall W, with its orthogonal
/// (Frobenius) projection: the one implementation behind `project` and the ADMM solver
/// ([`super::admm`]).
///
/// With the adjoint C*(S) = 2W·S (S symmetric, P(S) = S) the normal space is {2W·S}, and
/// Π_T(X) = X − 2W·S with S solving P(M·S + S·M) = ½·C(X), M = WᵀW, by (Jacobi-preconditioned
/// when `weights` are given) conjugate gradients on that symmetric positive-definite operator
/// (eigenvalues m_i + m_j on DGram: it converges in ≤ n steps, in a handful when the column norms
/// are close, in one with the Jacobi weights on DGram and Oblique and on Stiefel, where
/// S = C(X)/4).
pub(crate) struct TangentSpace<'a, M> {
    w: &'a M,
    wt: &'a M,
    gram: M,
    proj: Projector,
    weights: Option<&'a [f64]>,
}

impl<'a, M: Matrix> TangentSpace<'a, M> {
    /// T_W for tall `w` (`wt` = Wᵀ), projector `proj`, CG preconditioner `weights`
    /// ([`jacobi_weights`], row-major) or none.
    pub(crate) fn new(
        w: &'a M,
        wt: &'a M,
        proj: Projector,
        weights: Option<&'a [f64]>,
    ) -> Result<Self> {
        Ok(Self {
            w,
            wt,
            gram: wt.matmul(w)?,
            proj,
            weights,
        })
    }

    /// (Π_T(x), S) with x − Π_T(x) = 2W·S the normal component of `x`.
    pub(crate) fn project(&self, x: &M) -> Result<(M, M)> {
        let (c, _) = violation(self.wt, x, self.proj)?;
        self.project_measured(x, c)
    }

    /// [`TangentSpace::project`] given c = C(x) = P(WᵀX + XᵀW) (the H of [`violation`]), for a
    /// caller that measured it already (ADMM: one m×n×n product less per iteration).
    pub(crate) fn project_measured(&self, x: &M, c: M) -> Result<(M, M)> {
        let s = self.normal_multiplier(c)?;
        Ok((x.mul_add(-2.0, self.w, &s, 1.0)?, s))
    }

    /// S with P(M·S + S·M) = ½·`c`, c = C(x), by conjugate gradients (type docs).
    fn normal_multiplier(&self, c: M) -> Result<M> {
        let op = |s: &M| -> Result<M> {
            let mut y = sym2(self.gram.matmul(s)?)?;
            self.proj.apply(&mut y)?;
            Ok(y)
        };
        // Preconditioned CG: z = weights ∘ r (plain CG without weights).
        let precondition = |r: &M| -> Result<M> {
            let mut z = r.duplicate()?;
            if let Some(wts) = self.weights {
                z.scale_entries(wts)?;
            }
            Ok(z)
        };
        let mut r = c;
        r.scale(0.5)?;
        let n = r.shape().0;
        let mut s = r.duplicate()?;
        s.scale(0.0)?;
        let mut z = precondition(&r)?;
        let mut dir = z.duplicate()?;
        let mut rz = r.inner(&z)?;
        let stop = r.inner(&r)? * 1e-28;
        for _ in 0..(2 * n).max(8) {
            let rr = r.inner(&r)?;
            if rr <= stop || rr == 0.0 || rz <= 0.0 {
                break;
            }
            let ad = op(&dir)?;
            let curv = dir.inner(&ad)?;
            if curv <= 0.0 || !curv.is_finite() {
                break;
            }
            let step = rz / curv;
            s.axpy(step, &dir)?;
            r.axpy(-step, &ad)?;
            z = precondition(&r)?;
            let rz_new = r.inner(&z)?;
            dir.scale(rz_new / rz)?;
            dir.axpy(1.0, &z)?;
            rz = rz_new;
        }
        Ok(s)
    }
}

/// The Jacobi preconditioner of the constraint operator Λ ↦ P(WᵀW·Λ + Λ·WᵀW), row-major:
/// 2/(d_i² + d_j²) with d_j² = (WᵀW)_jj (1 where that sum is not positive). On DGram the operator
/// is exactly diagonal with entries d_i² + d_j² in the entry basis, so this is its inverse up to
/// the factor 2 that makes it 1 on Stiefel. `wt` is Wᵀ.
pub(crate) fn jacobi_weights<M: Matrix>(w: &M, wt: &M) -> Result<Vec<f64>> {
    let d2 = wt.matmul(w)?.diagonal()?;
    Ok(d2
        .iter()
        .flat_map(|&a| {
            d2.iter().map(move |&b| {
                let sum = a + b;
                if sum > 0.0 && sum.is_finite() {
                    2.0 / sum
                } else {
                    1.0
                }
            })
        })
        .collect())
}

/// The divergence test (module docs): a non-finite violation, a violation that grew past
/// `divergence_factor`·max(initial, tol), or a dual objective that *fell* below
/// `divergence_factor` × its starting value (both are negative: the ascent went the wrong way).
fn diverged(r: &DualReport, cfg: &DualAscent) -> bool {
    let f = cfg.divergence_factor;
    let objective_fell = match (r.dual_objective.first(), r.dual_objective.last()) {
        (Some(&first), Some(&last)) => last < f * first,
        _ => false,
    };
    let v = r.ascent_violation;
    !v.is_finite() || v > f * r.initial_violation.max(cfg.tol) || objective_fell || r.descent < 0.0
}

/// The dual ascent (module docs) on tall `w` (m ≥ n) and `g` of the same shape, with projector
/// `proj`: returns the candidate A (the step is W − η·A) and the diagnostics, with divergence only
/// flagged in the report. This is the code path of every manifold ([`Projector::Identity`] for
/// Stiefel, [`Projector::OffDiagonal`] for DGram, [`Projector::Diagonal`] for Oblique); the
/// optimizer adds orientation, momentum, the square closed form and the retraction.
///
/// Errors: `w` wide (argument `w`), `g` of another shape (argument `g`), non-finite input,
/// invalid settings, [`OptimError::DualAscentDiverged`] when G + 2W·P(Λ) overflows.
pub fn tangent_direction<M: WorkingPrecision>(
    w: &M,
    g: &M,
    proj: Projector,
    cfg: &DualAscent,
    method: Msign,
    precision: Precision,
    diagnostics: bool,
) -> Result<(M, DualReport)> {
    cfg.validate()?;
    crate::muon::check_inputs_named(w, g, "g", None)?;
    let (m, n) = w.shape();
    if m < n {
        return Err(InputError::shape_mismatch(
            "w",
            "a tall matrix (rows ≥ cols); transpose wide matrices first",
            format!("{m}×{n}"),
        )
        .into());
    }
    let wt = w.duplicate()?.into_transpose();
    let (a, _, report) = ascend(
        &TallProblem { w, wt: &wt, g },
        proj,
        cfg,
        method,
        precision,
        diagnostics,
    )?;
    Ok((a, report))
}

/// Fills the descent diagnostics (with the caller's unnormalized G); msign(G) for ‖G‖_* is
/// computed with `method` in `precision` when `diagnostics` is on.
pub(crate) fn finish_report<M: WorkingPrecision>(
    report: &mut DualReport,
    g: &M,
    a: &M,
    method: Msign,
    precision: Precision,
    diagnostics: bool,
) -> Result<()> {
    let g_sign = match diagnostics {
        true => Some(msign(g, method, precision)?),
        false => None,
    };
    describe_descent(report, g, a, g_sign.as_ref())
}

/// ⟨G, A⟩ and, given msign(G), ‖G‖_* = ⟨G, msign(G)⟩ and their ratio.
fn describe_descent<M: Matrix>(
    report: &mut DualReport,
    g: &M,
    a: &M,
    g_sign: Option<&M>,
) -> Result<()> {
    report.descent = g.inner(a)?;
    if let Some(sign) = g_sign {
        let nuc = g.inner(sign)?;
        report.nuclear_norm = Some(nuc);
        report.descent_ratio = Some(if nuc > 0.0 { report.descent / nuc } else { 0.0 });
    }
    Ok(())
}

/// The closed-form Stiefel direction for a square orthogonal W: A = W·msign(WᵀG − GᵀW), which is
/// exactly tangent (WᵀA + AᵀW = 0) and equals the dual ascent's first candidate, and its
/// multiplier Λ₀ = −¼·(WᵀG + GᵀW). `wt` is Wᵀ.
pub(crate) fn stiefel_square<M: WorkingPrecision>(
    w: &M,
    wt: &M,
    g: &M,
    method: Msign,
    precision: Precision,
) -> Result<(M, M)> {
    let s = wt.matmul(g)?;
    let st = s.duplicate()?.into_transpose();
    let mut skew = st.duplicate()?;
    skew.scale(-1.0)?;
    skew.axpy(1.0, &s)?;
    let mut lam = s;
    lam.axpy(1.0, &st)?;
    lam.scale(-0.25)?;
    if !skew.frobenius_norm()?.is_finite() {
        return Err(square_overflow(g)?);
    }
    let x = msign(&skew, method, precision)?;
    Ok((w.matmul(&x)?, lam))
}

/// The error of a square closed form whose WᵀG overflowed (G near f64::MAX): no direction can
/// be formed from this gradient.
pub(crate) fn square_overflow<M: Matrix>(g: &M) -> Result<OptimError> {
    Ok(OptimError::DualAscentDiverged {
        steps: 0,
        initial_violation: f64::INFINITY,
        violation: f64::INFINITY,
        gradient_norm: g.frobenius_norm()?,
        remedy: OVERFLOW_REMEDY.to_string(),
    })
}

/// The closed-form Stiefel direction A = W·msign(WᵀG − GᵀW) for a square orthogonal `w` (in its
/// own orientation; see the module docs). Errors: `w` not square (argument `w`), `g` of another
/// shape (argument `g`), non-finite input, and [`OptimError::DualAscentDiverged`] when WᵀG
/// overflows (entries near `f64::MAX`).
///
/// ```
/// use kappa_optim::manifold::stiefel_square_direction;
/// use kappa_optim::{Msign, Precision};
/// let w = ndarray::Array2::<f64>::eye(2);
/// let g = ndarray::array![[0.0, 1.0], [0.0, 0.0]];
/// let a = stiefel_square_direction(&w, &g, Msign::Exact, Precision::Native)?;
/// // WᵀG − GᵀW = [[0, 1], [−1, 0]], already orthogonal: A is that rotation generator.
/// assert!((a[[0, 1]] - 1.0).abs() < 1e-12 && (a[[1, 0]] + 1.0).abs() < 1e-12);
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
pub fn stiefel_square_direction<M: WorkingPrecision>(
    w: &M,
    g: &M,
    method: Msign,
    precision: Precision,
) -> Result<M> {
    crate::muon::check_inputs_named(w, g, "g", None)?;
    let (m, n) = w.shape();
    if m != n {
        return Err(InputError::shape_mismatch("w", "a square matrix", format!("{m}×{n}")).into());
    }
    let wt = w.duplicate()?.into_transpose();
    Ok(stiefel_square(w, &wt, g, method, precision)?.0)
}
