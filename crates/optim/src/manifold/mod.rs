//! Manifold Muon: the steepest spectral-norm step in the tangent space of the Stiefel manifold
//! (WᵀW = I), the diagonal-Gram manifold DGram (Off(WᵀW) = 0) or the Oblique manifold
//! (diag(WᵀW) = 1: unit columns), followed by a retraction —
//! Bernstein's dual-ascent formulation as the paper *Different Layers, Different Manifolds* ran
//! it, written once for every [`WorkingPrecision`] backend.
//!
//! # One step (docs/optim.md, "Math")
//!
//! 1. U from the momentum recursion (the paper: SGD-Nesterov, β = 0.95).
//! 2. Orientation: W is taken in its (out, in) form ([`Layout`]) and transposed when wide, so the
//!    constraint is always on the smaller Gram WᵀW (n×n, m ≥ n). `nn.Linear`'s wide
//!    `mlp.c_proj` therefore gets orthogonal *rows*; a square (out, in) matrix gets orthogonal
//!    columns (input features).
//! 3. Direction A by dual ascent ([`dual`]): A = msign(G + 2W·P(Λ)) with Λ ascending the dual
//!    −‖G + 2W·P(Λ)‖_*; for square Stiefel the closed form A = W·msign(WᵀG − GᵀW). P = Id
//!    (Stiefel), Off (DGram), Diag (Oblique: Λ diagonal, one multiplier per column; no closed
//!    form, [`dual`], "Oblique").
//! 4. W ← retract(W − η·A) ([`retraction`]). ‖η·A‖₂ = η: **the learning rate is the spectral norm
//!    of the tangent step**; after the retraction ‖ΔW‖₂ = η to O(η²) when the dual converged.
//!
//! No weight decay (the paper's manifold runs used none; on Stiefel the scale is fixed anyway).
//!
//! # Traps (docs/optim.md, "Traps")
//!
//! * The dual ascent is not scale-invariant ([`DualAscent::normalize`]; [`dual`], "Traps") and, with the
//!   SGD-form momentum, runs on a U about 20× larger than Muon's EMA input. On ill-conditioned
//!   gradients it does not converge in K = 20 steps at all ([`dual`], "Feasible directions";
//!   [`DualAscent::feasible`] makes the step tangent and certifies its descent). Its divergence is
//!   detected and reported ([`OnDivergence`]), not applied silently.
//! * Oblique constrains columns of the tall orientation: a wide matrix gets unit *rows*. Its
//!   retraction divides each column by its norm; a zero column (or one below the floor
//!   2⁻⁵⁰·‖W‖_F, [`retraction`]) is [`OptimError::ZeroColumn`], never a NaN.
//! * The paper's DGram retraction swaps column scales when column norms are unsorted (
//!   [`DGramRetraction`]).
//! * The fused QKV block: the paper constrains the whole 3d×d `c_attn` matrix, so under
//!   Stiefel only W_qᵀW_q + W_kᵀW_k + W_vᵀW_v = I holds (each slice has σ ≤ 1, none is
//!   orthogonal). Pass the fused matrix to reproduce the paper; pass slices to constrain each.
//! * Init: call [`ManifoldMuon::retract_onto`] once before training (the paper retracts the
//!   nanoGPT init). A first step on a matrix that is off its manifold by more than
//!   `manifold_tol` is [`OptimError::NotOnManifold`].
//! * Precision: with bf16 msign (the paper; `Precision::Auto` on CUDA, and on CPUs with native
//!   bf16 products for matrices above [`AUTO_BF16_MIN_STEP_FLOPS`]) the Stiefel constraint holds
//!   only to ≈ 1e-2 (max |σ − 1| ≈ 3.5e-3); f64 with `Msign::Exact` holds it to 1e-10.
//!
//!   [`AUTO_BF16_MIN_STEP_FLOPS`]: crate::precision::AUTO_BF16_MIN_STEP_FLOPS
//! * Cost: K msign calls per step (tol 1e-6 rarely triggers for tall matrices), plus one
//!   msign (Stiefel, DGram column-norm), one SVD (DGram paper) or one Gram product WᵀW (Oblique)
//!   for the retraction, plus one msign
//!   for the ‖G‖_* diagnostic when `diagnostics` is on.

pub mod admm;
#[cfg(feature = "tch")]
mod batched;
pub mod dual;
pub mod retraction;

pub use admm::{Admm, DualSolver};
pub use dual::{
    spectral_norm_estimate, stiefel_square_direction, tangent_direction, DualAscent, DualReport,
    OnDivergence, Projector,
};
pub use retraction::{DGramRetraction, Manifold};

use kappa_linalg::Matrix;
use serde::{Deserialize, Serialize};

use crate::error::{check_range, OptimError, Result};
use crate::layout::Layout;
use crate::momentum::{Momentum, MomentumState};
use crate::msign::Msign;
use crate::muon::{check_inputs_named, check_step_inputs};
use crate::precision::{Precision, WorkingPrecision};
use dual::{ascend, finish_report, stiefel_square, violation, TallProblem};
use retraction::{retract, violation_of};

/// Manifold Muon's settings. The named preset [`ManifoldMuonConfig::paper`] is the paper's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifoldMuonConfig {
    /// η > 0: the spectral norm of the tangent step.
    pub lr: f64,
    /// The constraint.
    pub manifold: Manifold,
    /// Momentum form.
    pub momentum: Momentum,
    /// Dual-ascent settings (used when `solver` is [`DualSolver::Ascent`]).
    pub dual: DualAscent,
    /// The solver of the tangent problem: the dual ascent (`dual`; the serde default, so configs
    /// without this field read as before) or ADMM ([`admm`]). The square Stiefel closed form,
    /// when on, takes precedence over both.
    #[serde(default, skip_serializing_if = "DualSolver::is_ascent")]
    pub solver: DualSolver,
    /// msign for the direction and for the Stiefel / column-norm retractions.
    pub msign: Msign,
    /// Which axis is fan-in (decides the orientation of square matrices).
    pub layout: Layout,
    /// Working precision of msign.
    pub precision: Precision,
    /// Use the closed form for square Stiefel matrices (equal to the ascent's first candidate).
    pub square_closed_form: bool,
    /// Compute ‖G‖_* and ⟨G, A⟩/‖G‖_* each step (one extra msign).
    pub diagnostics: bool,
    /// The largest manifold violation accepted at a parameter's first step (see
    /// [`ManifoldMuon::violation`]); the default 0.05 passes bf16 retractions and rejects
    /// Gaussian inits. Also the largest violation a retraction may end at
    /// ([`OptimError::NotRetractable`]).
    pub manifold_tol: f64,
    /// Return the final dual variable Λ in [`ManifoldStep::multiplier`] (off by default: an
    /// n×n matrix per step the caller may not want; [`ManifoldMuon::solve`] always returns it).
    #[serde(default)]
    pub keep_multiplier: bool,
}

impl ManifoldMuonConfig {
    /// The paper's settings on `manifold`: η = 0.02 (peak), SGD-Nesterov momentum 0.95, α = 0.1,
    /// K = 20, tol = 1e-6, no gradient normalization, Polar Express msign (10 steps), (out, in)
    /// layout, precision chosen per device, square Stiefel closed form, diagnostics on.
    pub fn paper(manifold: Manifold) -> Self {
        Self {
            lr: 0.02,
            manifold,
            momentum: Momentum::paper(),
            dual: DualAscent::paper(),
            solver: DualSolver::Ascent,
            msign: Msign::polar_express(),
            layout: Layout::OutIn,
            precision: Precision::Auto,
            square_closed_form: true,
            diagnostics: true,
            manifold_tol: 0.05,
            keep_multiplier: false,
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        check_range("lr", self.lr, 0.0, crate::muon::MuonConfig::MAX_LR)?;
        check_range("manifold_tol", self.manifold_tol, 0.0, f64::MAX)?;
        self.momentum.validate()?;
        self.dual.validate()?;
        self.solver.validate()?;
        self.msign.validate()
    }
}

/// Per-parameter state of [`ManifoldMuon`]: the momentum buffer and the step count.
pub type ManifoldState<M> = MomentumState<M>;

/// What one manifold-Muon step did.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifoldStep<M> {
    /// The direction A (in `w`'s orientation) of the tangent step W − η·A that the retraction
    /// then put back on the manifold: the same matrix [`ManifoldMuon::direction`] returns for
    /// the momentum input, without a second ascent.
    pub direction: M,
    /// The final dual variable Λ (see [`TangentSolution::multiplier`]), when
    /// [`ManifoldMuonConfig::keep_multiplier`] is on.
    pub multiplier: Option<M>,
    /// The dual ascent's diagnostics (including the violation history,
    /// [`DualReport::violations`]).
    pub dual: DualReport,
    /// [`ManifoldMuon::violation`] of the updated W.
    pub manifold_violation: f64,
    /// The precision msign ran in.
    pub precision: &'static str,
}

/// The tangent-space problem's answer at one point ([`ManifoldMuon::solve`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TangentSolution<M> {
    /// The direction A, in `w`'s orientation (the step is W − η·A).
    pub direction: M,
    /// The dual variable Λ (symmetric n×n, n = the smaller side of W, in the tall orientation
    /// W ∈ ℝ^{m×n}, m ≥ n, and in the caller's units of G) whose candidate msign(G + 2W·P(Λ)) the
    /// ascent returned last (before any [`DualAscent::project`]); for the square Stiefel closed
    /// form Λ₀ = −¼·(WᵀG + GᵀW).
    pub multiplier: M,
    /// The diagnostics.
    pub report: DualReport,
}

/// Manifold Muon (see the module docs).
///
/// ```
/// use kappa_optim::manifold::{Manifold, ManifoldMuon, ManifoldMuonConfig, ManifoldState};
/// use kappa_optim::Msign;
/// let mut w = ndarray::array![[1.0_f64, 0.2], [0.1, 1.0], [0.3, -0.4]];
/// let opt = ManifoldMuon::new(ManifoldMuonConfig {
///     lr: 0.05,
///     msign: Msign::Exact,
///     ..ManifoldMuonConfig::paper(Manifold::Stiefel)
/// })?;
/// opt.retract_onto(&mut w)?; // put the init on the manifold
/// let g = ndarray::array![[0.3_f64, -0.1], [0.2, 0.05], [-0.1, 0.2]];
/// let step = opt.step(&mut w, &g, &mut ManifoldState::new())?;
/// let wtw = w.t().dot(&w);
/// assert!((&wtw - &ndarray::Array2::<f64>::eye(2)).iter().all(|e| e.abs() < 1e-10));
/// assert!(step.dual.descent > 0.0);
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ManifoldMuon {
    config: ManifoldMuonConfig,
}

impl ManifoldMuon {
    /// Manifold Muon with `config` (validated).
    pub fn new(config: ManifoldMuonConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self { config })
    }

    /// The settings.
    pub fn config(&self) -> &ManifoldMuonConfig {
        &self.config
    }

    /// Changes η (for schedules). Errors: η outside [0, `MuonConfig::MAX_LR`] (argument `lr`).
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_range("lr", lr, 0.0, crate::muon::MuonConfig::MAX_LR)?;
        self.config.lr = lr;
        Ok(())
    }

    /// Whether an m×n matrix is transposed to reach the tall (out, in) orientation.
    fn flip(&self, rows: usize, cols: usize) -> bool {
        let in_out = self.config.layout == Layout::InOut;
        let (r, c) = if in_out { (cols, rows) } else { (rows, cols) };
        in_out != (r < c)
    }

    fn tall<M: Matrix>(x: &M, flip: bool) -> Result<M> {
        let d = x.duplicate()?;
        Ok(if flip { d.into_transpose() } else { d })
    }

    /// How far `w` is from the manifold: Stiefel ‖WᵀW − I‖_F/√n, DGram
    /// ‖Off(WᵀW)‖_F/‖diag(WᵀW)‖₂, Oblique max_j |‖w_j‖² − 1| (tall orientation, n = the smaller
    /// side; 0 for W = 0 on DGram, 1 for a zero column on Oblique). Computed without overflow for
    /// every finite W; the Stiefel and Oblique measures are +∞ when they exceed `f64::MAX` (‖W‖
    /// beyond ≈ 1e154). Errors: `w` empty or non-finite (argument `w`).
    pub fn violation<M: WorkingPrecision>(&self, w: &M) -> Result<f64> {
        w.validate("w").map_err(crate::error::from_linalg)?;
        let (m, n) = w.shape();
        violation_of(&Self::tall(w, self.flip(m, n))?, self.config.manifold)
    }

    /// Puts `w` on the manifold in place with the configured retraction (for the init; the
    /// paper retracts nanoGPT's Gaussian init). For DGram's paper retraction the column norms
    /// come out sorted descending. Every finite `w` of any scale is accepted.
    ///
    /// Errors (`w` unchanged): `w` empty or non-finite ([`OptimError::Input`]: `Empty`,
    /// `NonFinite`); a `w` whose
    /// retraction does not land on the manifold within `manifold_tol`
    /// ([`OptimError::NotRetractable`]): on Stiefel a numerically rank-deficient W (the zero
    /// matrix included) — its nearest Stiefel points are not unique, and msign keeps null
    /// directions at 0 (see [`msign`](crate::msign())); on DGram with the column-norm retraction,
    /// linearly dependent non-zero columns; on DGram, column norms beyond `f64::MAX`. The zero
    /// matrix is on DGram (free column norms, zero included) and is kept. On Oblique a column
    /// of norm 0 or below 2⁻⁵⁰·‖W‖_F ([`retraction`], "floor") is [`OptimError::ZeroColumn`]
    /// (argument `w`, the column's tall index).
    ///
    /// A `w` that the configured msign does not bring onto the manifold (a Newton–Schulz
    /// schedule designed for σ/‖W‖_F above a floor, against a square Gaussian init whose
    /// smallest singular values fall below it) is retracted again with the exact polar factor
    /// ([`Msign::Exact`], an SVD): the init is retracted once, so its cost does not matter, and
    /// the error remains only for a `w` no msign can retract.
    pub fn retract_onto<M: WorkingPrecision>(&self, w: &mut M) -> Result<()> {
        w.validate("w").map_err(crate::error::from_linalg)?;
        let (m, n) = w.shape();
        let flip = self.flip(m, n);
        let tall = Self::tall(w, flip)?;
        let (r, _) = match self.retract_checked(&tall, "w") {
            Err(OptimError::NotRetractable { .. }) if self.config.msign != Msign::Exact => {
                let c = &self.config;
                let exact = retract(&tall, c.manifold, Msign::Exact, c.precision, "w")?;
                self.checked(exact, "w")?
            }
            other => other?,
        };
        w.copy_from(&if flip { r.into_transpose() } else { r })?;
        Ok(())
    }

    /// The retraction of tall `x`, checked to land on the manifold (errors name `arg`), and its
    /// [`violation_of`] (measured once: the step reports it).
    fn retract_checked<M: WorkingPrecision>(&self, x: &M, arg: &'static str) -> Result<(M, f64)> {
        let c = &self.config;
        self.checked(retract(x, c.manifold, c.msign, c.precision, arg)?, arg)
    }

    /// A retraction `r` checked to land on the manifold (errors name `arg`), with its
    /// [`violation_of`].
    fn checked<M: WorkingPrecision>(&self, r: M, arg: &'static str) -> Result<(M, f64)> {
        let c = &self.config;
        let v = if r.frobenius_norm()?.is_finite() {
            violation_of(&r, c.manifold)?
        } else {
            f64::INFINITY
        };
        if v.is_nan() || v > c.manifold_tol {
            return Err(OptimError::NotRetractable {
                arg,
                manifold: c.manifold.name(),
                violation: v,
                tol: c.manifold_tol,
            });
        }
        Ok((r, v))
    }

    /// Whether an m×n matrix (tall orientation) takes the square Stiefel closed form.
    fn takes_closed_form(&self, m: usize, n: usize) -> bool {
        let c = &self.config;
        c.manifold == Manifold::Stiefel && m == n && c.square_closed_form
    }

    /// The report of a closed-form direction `a` for `g` at W (`wt` = Wᵀ): one msign, no
    /// ascent; the violation of `a` and, with diagnostics, ‖G‖_*.
    fn closed_form_report<M: WorkingPrecision>(&self, wt: &M, g: &M, a: &M) -> Result<DualReport> {
        let c = &self.config;
        let (_, v) = violation(wt, a, Projector::Identity)?;
        let mut report = DualReport {
            msign_calls: 1,
            initial_violation: v,
            violation: v,
            ascent_violation: v,
            violations: vec![v],
            converged: v < c.dual.tol,
            gradient_scale: 1.0,
            ..DualReport::default()
        };
        finish_report(&mut report, g, a, c.msign, c.precision, c.diagnostics)?;
        Ok(report)
    }

    fn direction_tall<M: WorkingPrecision>(
        &self,
        w: &M,
        wt: &M,
        g: &M,
    ) -> Result<(M, M, DualReport)> {
        let c = &self.config;
        let (m, n) = w.shape();
        if self.takes_closed_form(m, n) {
            let (a, lam) = stiefel_square(w, wt, g, c.msign, c.precision)?;
            let report = self.closed_form_report(wt, g, &a)?;
            return Ok((a, lam, report));
        }
        let problem = TallProblem { w, wt, g };
        let proj = c.manifold.projector();
        match &c.solver {
            DualSolver::Ascent => {
                ascend(&problem, proj, &c.dual, c.msign, c.precision, c.diagnostics)
            }
            DualSolver::Admm(cfg) => {
                admm::admm(&problem, proj, cfg, c.msign, c.precision, c.diagnostics)
            }
        }
    }

    /// The tangent direction A for gradient (or momentum) `g` at `w`, in `w`'s orientation, the
    /// final dual variable Λ and the ascent's diagnostics (with the violation history). Nothing is
    /// modified; divergence is only flagged in the report.
    ///
    /// Errors: `g` of another shape than `w` (argument `g`), `w` or `g` empty or non-finite.
    pub fn solve<M: WorkingPrecision>(&self, w: &M, g: &M) -> Result<TangentSolution<M>> {
        check_inputs_named(w, g, "g", None)?;
        let (m, n) = w.shape();
        let flip = self.flip(m, n);
        let wt = Self::tall(w, flip)?;
        let wtt = wt.duplicate()?.into_transpose();
        let gt = Self::tall(g, flip)?;
        let (a, multiplier, report) = self.direction_tall(&wt, &wtt, &gt)?;
        Ok(TangentSolution {
            direction: if flip { a.into_transpose() } else { a },
            multiplier,
            report,
        })
    }

    /// [`ManifoldMuon::solve`] without the dual variable: the direction A and the diagnostics.
    pub fn direction<M: WorkingPrecision>(&self, w: &M, g: &M) -> Result<(M, DualReport)> {
        self.solve(w, g).map(|s| (s.direction, s.report))
    }

    /// One step on `w` in place (see the module docs). The report carries the direction A, so
    /// there is no need for a separate [`ManifoldMuon::direction`] call.
    ///
    /// Errors (nothing is modified, the state is unchanged): shapes ([`OptimError::Input`]:
    /// `ShapeMismatch`), NaN/±∞ in `w`, `grad` or the momentum buffer in `state`
    /// ([`OptimError::Input`]: `NonFinite`), `w`
    /// off its manifold at its first step ([`OptimError::NotOnManifold`]), a diverging dual
    /// ascent with [`OnDivergence::Error`], or a non-finite one whatever `on_divergence`
    /// ([`OptimError::DualAscentDiverged`]), a step W − η·A that overflows
    /// ([`OptimError::Diverged`], quantity `"parameters"`), a retraction that does not land on the
    /// manifold ([`OptimError::NotRetractable`], argument `w`), on Oblique a step that left a
    /// column of norm (nearly) 0 ([`OptimError::ZeroColumn`]), backend failures.
    pub fn step<M: WorkingPrecision>(
        &self,
        w: &mut M,
        grad: &M,
        state: &mut ManifoldState<M>,
    ) -> Result<ManifoldStep<M>> {
        let prepared = self.prepare(w, grad, state)?;
        let direction = self.direction_tall(&prepared.w_tall, &prepared.wt, &prepared.u_tall)?;
        let moved = self.advance(prepared, state.steps, direction)?;
        self.land(moved, None)?.commit(w, state)
    }

    /// A step's checks and its momentum, before the direction: nothing is modified.
    fn prepare<M: WorkingPrecision>(
        &self,
        w: &M,
        grad: &M,
        state: &ManifoldState<M>,
    ) -> Result<Prepared<M>> {
        check_step_inputs(w, grad, state.buffer.as_ref())?;
        let c = &self.config;
        let precision = w.working_name(c.precision)?;
        let (m, n) = w.shape();
        let flip = self.flip(m, n);
        let w_tall = Self::tall(w, flip)?;
        let wt = w_tall.duplicate()?.into_transpose();
        if state.steps == 0 {
            let v = violation_of(&w_tall, c.manifold)?;
            if v.is_nan() || v > c.manifold_tol {
                return Err(OptimError::NotOnManifold {
                    manifold: c.manifold.name(),
                    violation: v,
                    tol: c.manifold_tol,
                });
            }
        }
        let (buffer, u) = c.momentum.advance_unchecked(state.buffer.as_ref(), grad)?;
        Ok(Prepared {
            flip,
            w_tall,
            wt,
            u_tall: if flip { u.into_transpose() } else { u },
            buffer,
            precision,
        })
    }

    /// The divergence check and W − η·A (tall), checked for overflow: with [`ManifoldMuon::land`],
    /// every error of [`ManifoldMuon::step`] after the direction.
    fn advance<M: WorkingPrecision>(
        &self,
        prepared: Prepared<M>,
        steps: u64,
        (a, lam, report): (M, M, DualReport),
    ) -> Result<Moved<M>> {
        let c = &self.config;
        let Prepared {
            flip,
            w_tall,
            u_tall,
            buffer,
            precision,
            ..
        } = prepared;
        let unusable = !report.ascent_violation.is_finite() || !a.frobenius_norm()?.is_finite();
        let on_divergence = c.solver.on_divergence(&c.dual);
        if unusable || (report.diverged && on_divergence == OnDivergence::Error) {
            return Err(OptimError::DualAscentDiverged {
                steps: report.dual_steps,
                initial_violation: report.initial_violation,
                violation: report.ascent_violation,
                gradient_norm: u_tall.frobenius_norm()?,
                remedy: match &c.solver {
                    DualSolver::Ascent => c.dual.divergence_remedy(&report),
                    DualSolver::Admm(a) => a.divergence_remedy(),
                },
            });
        }
        let mut moved = w_tall;
        moved.axpy(-c.lr, &a)?;
        let moved_norm = moved.frobenius_norm()?;
        if !moved_norm.is_finite() && moved.validate("w").is_err() {
            return Err(OptimError::Diverged {
                step: steps as usize,
                quantity: "parameters",
                value: moved_norm,
                threshold: f64::INFINITY,
            });
        }
        Ok(Moved {
            moved,
            flip,
            buffer,
            precision,
            direction: (a, lam, report),
        })
    }

    /// The retraction of a moved W (`retraction` when it was computed already, batched),
    /// checked, and the step's report.
    fn land<M: WorkingPrecision>(
        &self,
        moved: Moved<M>,
        retraction: Option<M>,
    ) -> Result<Settled<M>> {
        let c = &self.config;
        let Moved {
            moved,
            flip,
            buffer,
            precision,
            direction: (a, lam, report),
        } = moved;
        let (new, manifold_violation) = match retraction {
            Some(r) => self.checked(r, "w")?,
            None => self.retract_checked(&moved, "w")?,
        };
        let orient = |x: M| if flip { x.into_transpose() } else { x };
        Ok(Settled {
            new: orient(new),
            buffer,
            step: ManifoldStep {
                direction: orient(a),
                multiplier: c.keep_multiplier.then_some(lam),
                dual: report,
                manifold_violation,
                precision,
            },
        })
    }
}

/// One matrix's step after [`ManifoldMuon::advance`]: W − η·A in the tall orientation, before
/// its retraction.
struct Moved<M> {
    moved: M,
    flip: bool,
    buffer: M,
    precision: &'static str,
    direction: (M, M, DualReport),
}

/// One matrix's step after [`ManifoldMuon::prepare`]: W, Wᵀ and the momentum input U in the
/// tall orientation, the momentum buffer to keep, the working precision's name.
struct Prepared<M> {
    flip: bool,
    w_tall: M,
    wt: M,
    u_tall: M,
    buffer: M,
    precision: &'static str,
}

/// One matrix's step, computed and not yet applied ([`ManifoldMuon::land`]).
struct Settled<M> {
    /// The retracted W in the caller's orientation.
    new: M,
    buffer: M,
    step: ManifoldStep<M>,
}

impl<M: WorkingPrecision> Settled<M> {
    /// Writes the new W and the momentum buffer.
    fn commit(self, w: &mut M, state: &mut ManifoldState<M>) -> Result<ManifoldStep<M>> {
        w.copy_from(&self.new)?;
        state.record_step(self.buffer);
        Ok(self.step)
    }
}
