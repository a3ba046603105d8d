//! msign(X) = U·sign(Σ)·Vᵀ, the matrix sign (orthogonalization) that Muon and manifold Muon apply,
//! computed exactly through the SVD, by Muon's quintic Newton–Schulz (with the exact
//! normalization, Keller Jordan's reference's added epsilon or `torch.optim.Muon`'s clamped
//! one), or by Polar Express (what the paper's code ran), directly or as Gram
//! Newton–Schulz, with a schedule generated for given bounds, or AOL-preconditioned (Turbo-Muon,
//! which computes msign(X·D) for a diagonal D).
//!
//! # Math
//!
//! For X = U Σ Vᵀ (thin SVD), msign(X) = U·sign(Σ)·Vᵀ: every non-zero singular value becomes 1.
//! It is the steepest-descent direction under the spectral norm: argmax_{‖A‖₂ ≤ 1} ⟨X, A⟩ =
//! msign(X), with maximum ‖X‖_* (the nuclear norm). It is odd (msign(−X) = −msign(X)), invariant
//! under X → cX for c > 0, and maps a square skew-symmetric X to a skew-symmetric matrix.
//!
//! | [`Msign`] | how | output singular values |
//! |---|---|---|
//! | `Exact` | polar factor U·Vᵀ of the SVD (LAPACK on `ndarray`, libtorch on tensors), null directions kept at 0 | 1 to rounding (f64: 1e-12), 0 for σ ≤ τ |
//! | `MuonQuintic` | 5 steps of p(x) = 3.4445x − 4.7750x³ + 2.0315x⁵ after X/‖X‖_F (exact, scale-invariant) | in [0.6818, 1.1344] for σ/‖X‖_F ≥ 0.0052 (not 1: the coefficients sum to 0.701) |
//! | `PolarExpress { steps }` | Amsel et al.'s per-step table, normalization 1.01·‖X‖_F | 1 ± 1e-6 after 10 steps for σ/‖X‖_F ∈ [1e-3, 1] (f64) |
//! | `PolarExpressDesigned { lower, steps, safety, cushion, rule }` | a schedule generated for σ/‖X‖_F ∈ [ℓ, 1] ([`kappa_linalg::PolarExpressSpec`], degree 5; cushion 0.024 and the public generator's safety rule [`kappa_linalg::SafetyRule::InDesign`] unless set: [`Msign::designed`]; [`Msign::modded_nanogpt`] is modded-nanogpt's table; cached), normalization s·‖X‖_F | inside the predicted band [`kappa_linalg::PolarExpressDesign::bands`] for σ/‖X‖_F ∈ [ℓ, 1] (f64) |
//! | `Aol { steps }` (`lower` absent) | Turbo-Muon: X·D, D = diag(Σ_i \|(XᵀX)_ij\|)^{-1/2} (small side; ‖X·D‖₂ ≤ 1) in place of X/‖X‖_F, then the last `steps` of the Turbo-Muon list ([`kappa_linalg::aol_newton_schulz`]) | computes msign(X·D) ≠ msign(X); 96×256 Gaussian, 4 steps: σ ∈ [0.978, 1.032] (NS5 [0.682, 1.134]), ⟨X, O⟩/‖X‖_* 0.966 (NS5 0.725), ‖msign(XD) − msign(X)‖_F/‖msign(X)‖_F 0.009; κ = 1e4: σ ∈ [0.0104, 1.144], quality 0.870 (NS5 0.743), distance 0.117 |
//! | `Aol { steps, lower: ℓ }` | the same AOL rescaling, then Polar Express designed for σ(X·D) ∈ [ℓ, 1] (no safety factor); [`Msign::aol_three_steps`] = 3 steps at ℓ = 0.03 | computes msign(X·D); 3 steps at ℓ = 0.03 (f64, square and tall Gaussians and κ = 1e4, 96×256 to 512²): σ_max ≤ 1.036, ⟨X, O⟩/(‖X‖_*·σ_max(O)) 0.942–0.965 (NS5 0.690–0.851, Turbo ×4 0.867–0.970), smallest σ 2.1–5.2× below NS5's where σ(X·D) ≪ ℓ |
//! | `GramAol { steps, restart, lower }` | `Aol { steps, lower }` run as Gram Newton–Schulz ([`kappa_linalg::aol_gram_newton_schulz`]): the AOL Gram matrix D·A·D starts the first block, r×r products only, re-formed every `restart` steps (at most 2 in bf16) | as `Aol { steps, lower }` to its rounding (the same map of X·D) |
//! | `GramPolarExpress { steps, restart }` | the same schedule as [`kappa_linalg::gram_newton_schulz()`]: r×r products only, XXᵀ re-formed every `restart` steps (default 2; at most 2 in bf16, where longer periods diverged) | as `PolarExpress` to its rounding: 1 ± 1e-6 after 10 steps for σ/‖X‖_F ∈ [1e-3, 1] (f64, restart 1–3; rounding bound derived in kappa-linalg's tests) |
//!
//! `MuonQuinticEps { eps }` runs the same five quintic steps after X/(‖X‖_F + eps) — Keller
//! Jordan's reference normalization with eps = [`MUON_REFERENCE_EPS`] = 1e-7
//! ([`Msign::muon_reference`]). It is *not* scale-invariant: an input with ‖X‖_F ≲ 100·eps is
//! shrunk (at ‖X‖_F = 1e-8·√(mn)-scale entries the outputs of the two variants differ by ≈ 25 %).
//! `MuonQuinticClamp { eps }` runs them after X/max(‖X‖_F, eps) — `torch.optim.Muon`'s
//! normalization with eps = [`TORCH_MUON_EPS`] = 1e-7 ([`Msign::torch_muon`]): exactly
//! `MuonQuintic` for ‖X‖_F ≥ eps, X/eps (not scale-invariant) below.
//!
//! # Zero singular values: sign(0) = 0, unlike `polar_factor`
//!
//! msign follows sign(0) = 0 in every variant: the zero matrix maps to the zero matrix and the
//! null directions of a rank-deficient X stay at 0. The Newton–Schulz iterations do this by
//! construction (odd polynomials fix 0). [`kappa_linalg::polar_factor`] instead returns U·Vᵀ over
//! all min(m, n) singular vectors, so its zero singular values map to **1** (an orthonormal
//! completion of the null directions, which is not unique). msign keeps 0 because
//!
//! * it is the steepest-descent direction: argmax_{‖A‖₂ ≤ 1} ⟨X, A⟩ has value ‖X‖_* whatever A
//!   does on the null directions, and sign(0) = 0 is the minimum-Frobenius-norm maximizer, the
//!   limit of every Newton–Schulz schedule and independent of the SVD routine;
//! * the completion breaks structure: a square skew-symmetric X of odd size is always singular,
//!   and its completed polar factor is not skew, so the square Stiefel closed form
//!   W·msign(WᵀG − GᵀW) would not be tangent (violation 2/n).
//!
//! `Exact` therefore checks the numerical rank (σ_i > τ = σ₁·max(m, n)·ε, numpy's rule, ε of the
//! working type) and, when it is deficient, returns Q·Π with Q the polar factor and Π the
//! projector on the row space, computed as the sign of the PSD factor H = QᵀX by the cubic
//! Newton–Schulz iteration (its steps ≈ log₁.₅(‖X‖_F/σ_r) each amplify rounding in the null
//! directions by ≤ 1.5, so they stay at ≈ 1.5^steps·ε ≈ 26·(‖X‖_F/σ_r)·ε, σ_r the smallest
//! singular value kept). Where a point *on* the Stiefel
//! manifold is needed (a retraction), the completion is the wrong answer too, because it is not
//! unique: `ManifoldMuon::retract_onto` reports a rank-deficient W as an error instead.
//!
//! # Scale: the whole representable range
//!
//! Before any arithmetic msign multiplies X by an exact power of two 2^k that brings ‖X‖_F into
//! [0.5, 2) whenever ‖X‖_F is outside [2⁻²⁰, 2²⁰] or overflows (entries near `f64::MAX`), and
//! only then converts to the working precision. The scaling is exact (no rounding: only the
//! exponent changes), so scale-invariant variants give the same answer on 1e-300, 1 and
//! f64::MAX/2 inputs, the SVD of `Exact` never sees entries whose squares overflow, and an f64
//! tensor of huge entries does not turn into ±∞ when cast to f32 or bf16.
//!
//! # Normalizers and thresholds
//!
//! Muon's reference divides by ‖X‖_F + 1e-7 (`MuonQuinticEps`), `torch.optim.Muon` by
//! max(‖X‖_F, 1e-7) (`MuonQuinticClamp`), the paper's Polar Express by 1.01·‖X‖_F with no
//! epsilon, `MuonQuintic` by ‖X‖_F exactly. Inputs with σ/‖X‖_F below the
//! thresholds (0.0052 for the quintic, 1e-3 for Polar Express) are not fully inflated: e.g. a
//! square Gaussian's smallest σ end near 0.02 after NS5. See docs/optim.md, "Math".

use kappa_linalg::input::InputError;
use kappa_linalg::{
    aol_gram_newton_schulz, aol_newton_schulz, gram_newton_schulz, newton_schulz,
    newton_schulz_normed, Matrix, Normed, NsSchedule, PolarExpressSpec, SafetyRule,
    GRAM_NS_RESTART, POLAR_EXPRESS_CUSHION,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::error::{check_range, Result};
use crate::precision::{Precision, WorkingPrecision};

/// The epsilon of Keller Jordan's Muon reference, X/(‖X‖_F + 1e-7) ([`Msign::muon_reference`]).
pub const MUON_REFERENCE_EPS: f64 = 1e-7;

/// The epsilon of `torch.optim.Muon` (its default `eps`), X/max(‖X‖_F, 1e-7)
/// ([`Msign::torch_muon`]).
pub const TORCH_MUON_EPS: f64 = 1e-7;

/// How msign is computed (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[serde(deny_unknown_fields)]
pub enum Msign {
    /// The polar factor U·Vᵀ of the SVD with zero singular values kept at 0 (exact; for tests and
    /// f64 work).
    Exact,
    /// Muon's quintic Newton–Schulz coefficients, 5 steps, after the exact normalization
    /// X/‖X‖_F: scale-invariant. (Keller Jordan's reference adds 1e-7 to the norm, that is
    /// [`Msign::MuonQuinticEps`]; `torch.optim.Muon` clamps the norm at 1e-7 from below, that is
    /// [`Msign::MuonQuinticClamp`].)
    MuonQuintic,
    /// Muon's quintic Newton–Schulz, 5 steps, after X/(‖X‖_F + eps): Keller Jordan's reference
    /// with eps = [`MUON_REFERENCE_EPS`] ([`Msign::muon_reference`]). eps ≥ 0, finite; eps = 0 is
    /// `MuonQuintic`. Not scale-invariant for ‖X‖_F ≲ 100·eps; below ‖X‖_F < 1e-16·eps the
    /// cubic and quintic terms vanish in f64 and the output is (Π a_i)·X/eps ≈ 487.9·X/eps.
    MuonQuinticEps {
        /// The epsilon added to ‖X‖_F.
        eps: f64,
    },
    /// Muon's quintic Newton–Schulz, 5 steps, after X/max(‖X‖_F, eps): `torch.optim.Muon`
    /// with eps = [`TORCH_MUON_EPS`] ([`Msign::torch_muon`]). eps ≥ 0, finite. For
    /// ‖X‖_F ≥ eps it is `MuonQuintic`, bit for bit; below it divides by eps (not
    /// scale-invariant), and below ‖X‖_F < 1e-16·eps the output is (Π a_i)·X/eps ≈ 487.9·X/eps.
    MuonQuinticClamp {
        /// The lower bound on the normalizer.
        eps: f64,
    },
    /// Polar Express with per-step coefficients; the paper's code uses 10 steps.
    PolarExpress {
        /// Number of steps (≥ 1).
        steps: usize,
    },
    /// Polar Express run as Gram Newton–Schulz ([`kappa_linalg::gram_newton_schulz()`]): the same
    /// map as `PolarExpress { steps }`, each step on the r×r Gram matrix (r = min(m, n)), cheaper
    /// for tall or wide X (s ≳ 2r).
    GramPolarExpress {
        /// Number of steps (≥ 1).
        steps: usize,
        /// Steps between re-formations of XXᵀ (≥ 1; [`kappa_linalg::GRAM_NS_RESTART`] = 2 by
        /// default, [`Msign::gram_polar_express`]).
        restart: usize,
    },
    /// Polar Express with a schedule generated for these bounds
    /// ([`kappa_linalg::PolarExpressSpec`]: degree 5, with `cushion` and `rule`; by default the
    /// paper's cushion and the public generator's rule, [`Msign::designed`]): designed for
    /// σ/‖X‖_F ∈ [`lower`, 1]. The paper's run-time table is `PolarExpress { steps }` (the
    /// generator's other rule, [`kappa_linalg::SafetyRule::AfterDesign`]). Generated schedules
    /// are cached per parameter set.
    PolarExpressDesigned {
        /// ℓ ∈ (0, 1), the smallest normalized singular value the schedule is designed for.
        lower: f64,
        /// Number of steps (1 ≤ steps ≤ [`kappa_linalg::MAX_NS_STEPS`]).
        steps: usize,
        /// Safety factor s ≥ 1 (1.01 in the paper; 1 turns it off).
        safety: f64,
        /// The cushion κ ∈ [0, 1) ([`kappa_linalg::POLAR_EXPRESS_CUSHION`] by default, the
        /// serde default; modded-nanogpt's table was generated with 0.02).
        #[serde(default = "paper_cushion", skip_serializing_if = "is_paper_cushion")]
        cushion: f64,
        /// How s enters the schedule ([`SafetyRule::InDesign`] by default; serde `in_design`,
        /// `after_design`).
        #[serde(default, with = "safety_rule", skip_serializing_if = "is_in_design")]
        rule: SafetyRule,
    },
    /// AOL-preconditioned Newton–Schulz ([`kappa_linalg::aol_newton_schulz`], "Turbo-Muon"):
    /// X·D with D = diag(Σ_i |(XᵀX)_ij|)^{-1/2} on the small side in place of X/‖X‖_F, then
    /// `steps` of a schedule: without `lower`, the last `steps` of the Turbo-Muon list (4 by
    /// default, [`Msign::aol`]); with `lower = ℓ`, Polar Express designed for σ(X·D) ∈ [ℓ, 1]
    /// (degree 5, no safety factor: ‖X·D‖₂ ≤ 1 is exact; [`Msign::aol_three_steps`] is 3 steps at
    /// ℓ = 0.03). It approximates **msign(X·D), not msign(X)** (the module docs quantify the
    /// difference).
    Aol {
        /// Number of steps: 1 to 5 for Turbo's list, 1 to [`kappa_linalg::MAX_NS_STEPS`] for a
        /// designed schedule.
        steps: usize,
        /// ℓ ∈ (0, 1) for a designed schedule; absent (`None`) for Turbo-Muon's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lower: Option<f64>,
    },
    /// `Aol { steps, lower }` run as Gram Newton–Schulz
    /// ([`kappa_linalg::aol_gram_newton_schulz`]): the same map of X·D, each step on r×r
    /// matrices, cheaper for tall or wide X (s ≳ 2r).
    GramAol {
        /// Number of steps (as `Aol`).
        steps: usize,
        /// Steps between re-formations of the Gram matrix (≥ 1; at most
        /// [`kappa_linalg::GRAM_NS_RESTART`] = 2 in bf16, the default of [`Msign::gram_aol`]).
        restart: usize,
        /// ℓ for a designed schedule (as `Aol`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lower: Option<f64>,
    },
}

impl Msign {
    /// Polar Express designed for σ/‖X‖_F ∈ [`lower`, 1] in `steps` steps with safety factor
    /// `safety`, the paper's cushion and the public generator's rule
    /// ([`Msign::PolarExpressDesigned`]).
    pub const fn designed(lower: f64, steps: usize, safety: f64) -> Self {
        Msign::PolarExpressDesigned {
            lower,
            steps,
            safety,
            cushion: POLAR_EXPRESS_CUSHION,
            rule: SafetyRule::InDesign,
        }
    }

    /// modded-nanogpt's Polar Express: ℓ = 10⁻³, 5 steps, s = 1.02, cushion 0.02, the public
    /// generator's rule — the schedule of its `polar_express_coeffs` table.
    pub const fn modded_nanogpt() -> Self {
        Msign::PolarExpressDesigned {
            lower: 1e-3,
            steps: 5,
            safety: 1.02,
            cushion: 0.02,
            rule: SafetyRule::InDesign,
        }
    }

    /// Polar Express with 10 steps, the paper's msign.
    pub const fn polar_express() -> Self {
        Msign::PolarExpress { steps: 10 }
    }

    /// Polar Express with 10 steps as Gram Newton–Schulz, restarted every
    /// [`GRAM_NS_RESTART`] = 2 steps.
    pub const fn gram_polar_express() -> Self {
        Msign::GramPolarExpress {
            steps: 10,
            restart: kappa_linalg::GRAM_NS_RESTART,
        }
    }

    /// AOL-preconditioned Newton–Schulz with the Turbo-Muon authors' 4 steps.
    pub const fn aol() -> Self {
        Msign::Aol {
            steps: kappa_linalg::TURBO_MUON_STEPS,
            lower: None,
        }
    }

    /// [`Msign::aol`] as Gram Newton–Schulz, restarted every [`GRAM_NS_RESTART`] = 2 steps.
    pub const fn gram_aol() -> Self {
        Msign::GramAol {
            steps: kappa_linalg::TURBO_MUON_STEPS,
            restart: kappa_linalg::GRAM_NS_RESTART,
            lower: None,
        }
    }

    /// AOL with kappa's short schedule ([`kappa_linalg::NsSchedule::aol_three_steps`]): 3 Polar
    /// Express steps designed for σ(X·D) ∈ [0.03, 1]. Three fifths of the quintic's products,
    /// with a higher descent quality than five quintic steps on every input measured (module
    /// docs).
    pub const fn aol_three_steps() -> Self {
        Msign::Aol {
            steps: kappa_linalg::AOL_SHORT_STEPS,
            lower: Some(kappa_linalg::AOL_SHORT_LOWER),
        }
    }

    /// [`Msign::aol_three_steps`] as Gram Newton–Schulz, restarted every [`GRAM_NS_RESTART`] = 2
    /// steps.
    pub const fn gram_aol_three_steps() -> Self {
        Msign::GramAol {
            steps: kappa_linalg::AOL_SHORT_STEPS,
            restart: kappa_linalg::GRAM_NS_RESTART,
            lower: Some(kappa_linalg::AOL_SHORT_LOWER),
        }
    }

    /// The former name of [`Msign::aol_three_steps`].
    #[deprecated(since = "0.2.0", note = "renamed `aol_three_steps`")]
    pub const fn aol_short() -> Self {
        Self::aol_three_steps()
    }

    /// The former name of [`Msign::gram_aol_three_steps`].
    #[deprecated(since = "0.2.0", note = "renamed `gram_aol_three_steps`")]
    pub const fn gram_aol_short() -> Self {
        Self::gram_aol_three_steps()
    }

    /// Keller Jordan's reference: the quintic after X/(‖X‖_F + 1e-7).
    pub const fn muon_reference() -> Self {
        Msign::MuonQuinticEps {
            eps: MUON_REFERENCE_EPS,
        }
    }

    /// `torch.optim.Muon`'s orthogonalization: the quintic after X/max(‖X‖_F, 1e-7).
    pub const fn torch_muon() -> Self {
        Msign::MuonQuinticClamp {
            eps: TORCH_MUON_EPS,
        }
    }

    /// The epsilon and its form for the quintic variants with an epsilon, `None` otherwise.
    fn eps_form(&self) -> Option<(f64, EpsForm)> {
        match *self {
            Msign::MuonQuinticEps { eps } => Some((eps, EpsForm::Add)),
            Msign::MuonQuinticClamp { eps } => Some((eps, EpsForm::Clamp)),
            _ => None,
        }
    }

    /// The Newton–Schulz schedule behind this variant (`None` for `Exact`). For
    /// `MuonQuinticEps` and `MuonQuinticClamp` the normalization factor shown is 1; the call
    /// uses 1 + eps/‖X‖_F and max(1, eps/‖X‖_F).
    pub fn schedule(&self) -> Option<NsSchedule> {
        match *self {
            Msign::Exact => None,
            Msign::MuonQuintic | Msign::MuonQuinticEps { .. } | Msign::MuonQuinticClamp { .. } => {
                Some(NsSchedule::muon())
            }
            // `validate` rejects step counts beyond the linalg cap, so `ok()` drops no valid schedule.
            Msign::PolarExpress { steps } | Msign::GramPolarExpress { steps, .. } => {
                NsSchedule::polar_express(steps).ok()
            }
            // `None` only for parameters `validate` rejects.
            Msign::PolarExpressDesigned {
                lower,
                steps,
                safety,
                cushion,
                rule,
            } => designed_schedule(designed_spec(lower, steps, safety, cushion, rule)),
            Msign::Aol { steps, lower } | Msign::GramAol { steps, lower, .. } => match lower {
                None => NsSchedule::turbo_muon(steps).ok(),
                Some(lower) => designed_schedule(PolarExpressSpec::new(lower, 5, steps, 1.0)),
            },
        }
    }

    /// Checks the parameters (Polar Express needs at least one step, its Gram form a restart
    /// period ≥ 1; eps finite and ≥ 0; a designed schedule ℓ ∈ (0, 1), 1 ≤ steps ≤
    /// `MAX_NS_STEPS` and s ≥ 1 finite; AOL 1 to 5 Turbo steps or a designed schedule as
    /// above, its Gram form a restart period ≥ 1).
    pub fn validate(&self) -> Result<()> {
        match *self {
            Msign::Exact | Msign::MuonQuintic => Ok(()),
            Msign::MuonQuinticEps { eps } | Msign::MuonQuinticClamp { eps } => {
                Ok(check_range("msign.eps", eps, 0.0, f64::MAX)?)
            }
            Msign::PolarExpress { steps } => validate_polar_express(steps),
            Msign::GramPolarExpress { steps, restart } => {
                validate_polar_express(steps).and_then(|()| validate_restart(restart))
            }
            Msign::PolarExpressDesigned {
                lower,
                steps,
                safety,
                cushion,
                ..
            } => validate_designed(lower, steps, safety).and_then(|()| {
                Ok(check_range(
                    "msign.cushion",
                    cushion,
                    0.0,
                    1.0 - f64::EPSILON,
                )?)
            }),
            Msign::Aol { steps, lower } => validate_aol(steps, lower),
            Msign::GramAol {
                steps,
                restart,
                lower,
            } => validate_aol(steps, lower).and_then(|()| validate_restart(restart)),
        }
    }

    /// Matrix products per call for X ∈ ℝ^{m×n} with r = min(m, n), s = max(m, n), in flops
    /// (`Exact` counts 0: its cost is an SVD). The Gram form: N steps in B = ⌈N/k⌉ blocks of
    /// k = `restart` steps cost B·4r²s (XXᵀ and Q·X per block) + (8N − 6B)·r³.
    pub fn flops(&self, m: usize, n: usize) -> f64 {
        let (r, s) = (m.min(n) as f64, m.max(n) as f64);
        let per_step = 4.0 * r * r * s + 2.0 * r * r * r;
        match *self {
            Msign::Exact => 0.0,
            Msign::MuonQuintic | Msign::MuonQuinticEps { .. } | Msign::MuonQuinticClamp { .. } => {
                5.0 * per_step
            }
            Msign::PolarExpress { steps }
            | Msign::PolarExpressDesigned { steps, .. }
            | Msign::Aol { steps, .. } => steps as f64 * per_step,
            Msign::GramPolarExpress { steps, restart } | Msign::GramAol { steps, restart, .. } => {
                let blocks = steps.div_ceil(restart.max(1)) as f64;
                blocks * 4.0 * r * r * s + (8.0 * steps as f64 - 6.0 * blocks) * r * r * r
            }
        }
    }
}

/// 1 ≤ steps ≤ `MAX_NS_STEPS` (argument `msign`).
fn validate_polar_express(steps: usize) -> Result<()> {
    if steps == 0 {
        return Err(InputError::invalid("msign", "Polar Express needs at least 1 step").into());
    }
    if steps > kappa_linalg::MAX_NS_STEPS {
        let why = format!("Polar Express with {steps} steps, more than kappa_linalg::MAX_NS_STEPS");
        return Err(InputError::invalid("msign", why).into());
    }
    Ok(())
}

/// A Gram form's restart period ≥ 1 (argument `msign.restart`).
fn validate_restart(restart: usize) -> Result<()> {
    if restart == 0 {
        let why = "Gram Newton–Schulz needs a restart period ≥ 1";
        return Err(InputError::invalid("msign.restart", why).into());
    }
    Ok(())
}

/// Turbo-Muon's 1 to 5 steps, or a designed schedule's parameters (safety 1).
fn validate_aol(steps: usize, lower: Option<f64>) -> Result<()> {
    match lower {
        Some(lower) => validate_designed(lower, steps, 1.0),
        None if steps == 0 || steps > kappa_linalg::TURBO_MUON_COEFFICIENTS.len() => {
            let why = format!("AOL (Turbo-Muon) has 1 to 5 steps, found {steps}");
            Err(InputError::invalid("msign.steps", why).into())
        }
        None => Ok(()),
    }
}

/// ℓ ∈ (0, 1), 1 ≤ steps ≤ `MAX_NS_STEPS`, s ≥ 1 finite (arguments `msign.lower`,
/// `msign.steps`, `msign.safety`).
fn validate_designed(lower: f64, steps: usize, safety: f64) -> Result<()> {
    if !(lower.is_finite() && lower > 0.0 && lower < 1.0) {
        let why = format!("must be in (0, 1), found {lower}");
        return Err(InputError::invalid("msign.lower", why).into());
    }
    if steps == 0 || steps > kappa_linalg::MAX_NS_STEPS {
        let why = format!("must be in 1..=MAX_NS_STEPS (2^16), found {steps}");
        return Err(InputError::invalid("msign.steps", why).into());
    }
    Ok(check_range("msign.safety", safety, 1.0, f64::MAX)?)
}

/// The most generated schedules kept (distinct parameter sets; beyond it they are regenerated).
const DESIGN_CACHE_CAP: usize = 64;

/// The spec of a designed schedule: degree 5, with its cushion and safety rule.
fn designed_spec(
    lower: f64,
    steps: usize,
    safety: f64,
    cushion: f64,
    rule: SafetyRule,
) -> PolarExpressSpec {
    PolarExpressSpec::new(lower, 5, steps, safety)
        .with_cushion(cushion)
        .with_rule(rule)
}

/// The generated schedule of `spec`, from a process-wide cache (a 10-step design took ≈ 13 µs
/// when measured, more than the whole msign of an 8×8 matrix, ≈ 5 µs). `None` for parameters
/// [`validate_designed`] rejects.
fn designed_schedule(spec: PolarExpressSpec) -> Option<NsSchedule> {
    type Key = (u64, usize, usize, u64, u64, bool);
    type Cache = Mutex<HashMap<Key, NsSchedule>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (
        spec.lower.to_bits(),
        spec.degree,
        spec.steps,
        spec.safety.to_bits(),
        spec.cushion.to_bits(),
        spec.rule == SafetyRule::InDesign,
    );
    let cache = CACHE.get_or_init(Cache::default);
    // A poisoned lock only means another thread panicked while holding it; the map is intact.
    if let Some(s) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Some(s.clone());
    }
    let schedule = spec.design().ok()?.schedule;
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    if map.len() < DESIGN_CACHE_CAP {
        map.insert(key, schedule.clone());
    }
    Some(schedule)
}

fn paper_cushion() -> f64 {
    POLAR_EXPRESS_CUSHION
}

fn is_paper_cushion(c: &f64) -> bool {
    c.to_bits() == POLAR_EXPRESS_CUSHION.to_bits()
}

fn is_in_design(r: &SafetyRule) -> bool {
    *r == SafetyRule::InDesign
}

/// [`SafetyRule`] as `in_design` / `after_design` (kappa-linalg has no serde).
mod safety_rule {
    use kappa_linalg::SafetyRule;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(rule: &SafetyRule, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match rule {
            SafetyRule::InDesign => "in_design",
            SafetyRule::AfterDesign => "after_design",
        })
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SafetyRule, D::Error> {
        match String::deserialize(d)?.as_str() {
            "in_design" => Ok(SafetyRule::InDesign),
            "after_design" => Ok(SafetyRule::AfterDesign),
            other => Err(serde::de::Error::unknown_variant(
                other,
                &["in_design", "after_design"],
            )),
        }
    }
}

/// Frobenius norms outside this range are brought into [0.5, 2) by an exact power of two before
/// msign, the SVD and the spectral-norm estimate (module docs, "Scale").
pub(crate) const SAFE_FRO: (f64, f64) = (9.5367431640625e-7, 1048576.0); // 2⁻²⁰, 2²⁰

/// `x·2^k` with ‖x·2^k‖_F ∈ [0.5, 2), and k, when ‖x‖_F is outside [`SAFE_FRO`] or overflows;
/// `None` for the zero matrix and for norms inside the range. Each multiplication is by at most
/// 2^±60 (representable in f32 and bf16), so every step is exact. `x` must be finite.
pub(crate) fn power_of_two_scaled<M: Matrix>(x: &M) -> Result<Option<(M, i32)>> {
    power_of_two_scaled_from(x, x.frobenius_norm()?)
}

/// [`power_of_two_scaled`] with ‖x‖_F already known (`f`), saving a pass over `x`.
fn power_of_two_scaled_from<M: Matrix>(x: &M, f: f64) -> Result<Option<(M, i32)>> {
    if !needs_rescaling(f) {
        return Ok(None);
    }
    let (mut y, mut k, mut f) = (x.duplicate()?, 0i32, f);
    // ≤ 2200 binary orders of magnitude in f64, 60 per round: 40 rounds always suffice.
    for _ in 0..40 {
        if f.is_finite() && (0.5..2.0).contains(&f) {
            break;
        }
        let e = if f.is_finite() {
            (-f.log2().floor() as i32).clamp(-60, 60)
        } else {
            -60
        };
        y.scale(2f64.powi(e))?;
        k += e;
        f = y.frobenius_norm()?;
    }
    Ok(Some((y, k)))
}

/// Whether a matrix of Frobenius norm `f` needs [`power_of_two_scaled_from`]'s rescaling: a
/// norm that is not zero and not finite or outside [`SAFE_FRO`].
fn needs_rescaling(f: f64) -> bool {
    !(f == 0.0 || (f.is_finite() && (SAFE_FRO.0..=SAFE_FRO.1).contains(&f)))
}

/// Multiplies `x` by 2^k exactly, in factors of at most 2^±60 (representable in f32 and bf16).
/// The result over- or underflows only where x·2^k does.
pub(crate) fn scale_by_power_of_two<M: Matrix>(x: &mut M, k: i32) -> Result<()> {
    let mut left = k;
    while left != 0 {
        let e = left.clamp(-60, 60);
        x.scale(2f64.powi(e))?;
        left -= e;
    }
    Ok(())
}

/// The working type's unit roundoff-sized ε (f64 or f32's machine epsilon).
fn machine_eps(working: &str) -> f64 {
    if working == "f64" {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    }
}

/// Exact msign: the polar factor, with the null directions of a numerically rank-deficient input
/// mapped to 0 (module docs). `working` names the element type the computation runs in; `x` is
/// finite and scaled to a safe Frobenius norm by the caller.
fn exact<M: Matrix>(x: &M, working: &str) -> Result<M> {
    let s = x.singular_values()?;
    let (m, n) = x.shape();
    let s1 = s.first().copied().unwrap_or(0.0);
    if s1 == 0.0 {
        return Ok(x.duplicate()?);
    }
    if !s1.is_finite() {
        return Err(InputError::invalid(
            "x",
            format!("its SVD returned a non-finite largest singular value {s1}"),
        )
        .into());
    }
    let tau = s1 * m.max(n) as f64 * machine_eps(working);
    // σ₁ > τ unless max(m, n)·ε ≥ 1 (a dimension beyond 2²³ in f32): keep σ₁ then.
    let rank = s.iter().filter(|&&v| v > tau).count().max(1);
    let q = x.polar_factor()?;
    if rank == s.len() {
        return Ok(q);
    }
    // H = QᵀX (tall) or X·Qᵀ (wide): PSD, eigenvalues σ_1..σ_r and zeros; its sign is the
    // projector on the row (column) space. Cubic Newton–Schulz from ‖H‖_F-normalization needs
    // log(‖H‖_F/σ_r)/log(1.5) steps to reach the quadratic phase, then a few more.
    let fro = s.iter().map(|v| v * v).sum::<f64>().sqrt();
    let steps = ((fro / s[rank - 1]).ln() / 1.5f64.ln()).ceil().min(1e4) as usize + 8;
    let tall = m >= n;
    let h = if tall {
        q.duplicate()?.into_transpose().matmul(x)?
    } else {
        x.matmul(&q.duplicate()?.into_transpose())?
    };
    let p = newton_schulz(&h, &NsSchedule::cubic(steps)?)?;
    Ok(if tall { q.matmul(&p)? } else { p.matmul(&q)? })
}

/// How a quintic variant with an epsilon forms its normalizer from ‖X‖_F.
#[derive(Debug, Clone, Copy)]
enum EpsForm {
    /// ‖X‖_F + eps (`MuonQuinticEps`, Keller Jordan's reference).
    Add,
    /// max(‖X‖_F, eps) (`MuonQuinticClamp`, `torch.optim.Muon`).
    Clamp,
}

impl EpsForm {
    /// The factor c of the normalization X/(c·‖X‖_F) for r = eps/‖X‖_F: 1 + r, or max(1, r).
    fn factor(self, ratio: f64) -> f64 {
        match self {
            EpsForm::Add => 1.0 + ratio,
            EpsForm::Clamp => ratio.max(1.0),
        }
    }
}

/// The quintic after X/(‖X‖_F + eps) or X/max(‖X‖_F, eps) (`form`). `fro` is ‖X‖_F of the
/// caller's input (before any power-of-two scaling, which the normalization factor
/// c = `form.factor(eps/‖X‖_F)` ignores).
fn quintic_eps<M: Matrix>(x: &M, fro: f64, eps: f64, form: EpsForm) -> Result<M> {
    let schedule = NsSchedule::muon();
    if fro == 0.0 {
        return Ok(x.duplicate()?);
    }
    let ratio = eps / fro;
    if ratio > 1e16 || !ratio.is_finite() {
        // Both normalizers are eps to f64 precision, and X/eps has norm < 1e-16: p(y) = a·y
        // to f64 precision at every step.
        let gain = schedule.steps.iter().map(|p| p.a).product::<f64>() / eps;
        let mut out = x.duplicate()?;
        out.scale(gain)?;
        return Ok(out);
    }
    let schedule = NsSchedule {
        normalization: form.factor(ratio),
        ..schedule
    };
    Ok(newton_schulz(x, &schedule)?)
}

/// msign(x) by `method`, computed in the working precision `precision` resolves to (see
/// [`Precision`]); the result has `x`'s shape and element type.
///
/// Every finite input is accepted, from subnormal to `f64::MAX` entries (module docs, "Scale").
/// Errors: `x` empty or non-finite ([`InputError::Empty`], [`InputError::NonFinite`], argument
/// `x`), a precision the backend cannot use, an invalid method (also `GramPolarExpress` with
/// restart > 2 in bf16, [`InputError::InvalidArgument`] on `msign`), libtorch or LAPACK failures.
///
/// ```
/// use kappa_optim::{msign, Msign, Precision};
/// let x = ndarray::array![[3.0_f64, 0.0], [0.0, -0.5], [0.0, 0.0]];
/// let q = msign(&x, Msign::Exact, Precision::Native)?;
/// assert!((q[[0, 0]] - 1.0).abs() < 1e-12 && (q[[1, 1]] + 1.0).abs() < 1e-12);
/// let p = msign(&x, Msign::polar_express(), Precision::Native)?;
/// assert!((p[[1, 1]] + 1.0).abs() < 1e-6);
/// // Scale-safe: the same answer near f64::MAX.
/// let big = msign(&(&x * 1e307), Msign::polar_express(), Precision::Native)?;
/// assert!((&big - &p).iter().all(|e| e.abs() < 1e-12));
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
pub fn msign<M: WorkingPrecision>(x: &M, method: Msign, precision: Precision) -> Result<M> {
    let (out, converted) = msign_working(x, method, precision)?;
    match converted {
        true => out.to_kind_of(x),
        false => Ok(out),
    }
}

/// [`msign`] before its result returns to `x`'s type: the result and whether it is in the
/// working type (then `to_kind_of(x)` gives `msign`'s value).
pub(crate) fn msign_working<M: WorkingPrecision>(
    x: &M,
    method: Msign,
    precision: Precision,
) -> Result<(M, bool)> {
    method.validate()?;
    // `Working::of` finds a non-finite entry from the norm it computes anyway (one pass over x
    // instead of two); an empty x, and any failure before it, get `validate`'s error.
    let (rows, cols) = x.shape();
    if rows == 0 || cols == 0 {
        x.validate("x").map_err(crate::error::from_linalg)?;
    }
    let checked = |e| input_error_or(x, e);
    check_gram_period(method, x.working_name(precision).map_err(checked)?)?;
    let w = Working::of(x, precision).map_err(checked)?;
    let converted = w.converted();
    let input = w.input(x);
    if let Some((eps, form)) = method.eps_form() {
        let ratio = eps / w.fro;
        if w.scaled.is_some() && (ratio > 1e16 || ratio.is_nan()) {
            // The linear regime needs the unscaled input (its output is ∝ X).
            return Ok((quintic_eps(x, w.fro, eps, form)?, false));
        }
        return Ok((quintic_eps(input, w.fro, eps, form)?, converted));
    }
    let out = match (method, method.schedule()) {
        (Msign::GramPolarExpress { restart, .. }, Some(schedule)) => {
            gram_newton_schulz(input, &schedule, restart)?
        }
        (Msign::Aol { .. }, Some(schedule)) => aol_newton_schulz(input, &schedule)?,
        (Msign::GramAol { restart, .. }, Some(schedule)) => {
            aol_gram_newton_schulz(input, &schedule, restart)?
        }
        (_, Some(schedule)) => w.newton_schulz(x, &schedule)?,
        (_, None) => exact(input, x.working_name(precision)?)?,
    };
    Ok((out, converted))
}

/// `validate`'s error for `x` (argument `x`: its layout, kind or entries) where it has one,
/// otherwise `e`.
fn input_error_or<M: Matrix>(x: &M, e: crate::OptimError) -> crate::OptimError {
    match x.validate("x") {
        Err(v) => crate::error::from_linalg(v),
        Ok(()) => e,
    }
}

/// The Gram form's restart period in bf16 may not exceed [`GRAM_NS_RESTART`]: with three
/// Polar Express steps per block (gain ≈ 130) the Gram recurrence's bf16 rounding diverged on
/// small inputs with graded spectra (max |Δ| 4.1 at 16×48 and 93 at 96×24 with κ = 10², against
/// ≤ 0.03 at period 2; kappa-linalg's `bf16_gram_polar_express_keeps_the_band_at_periods_1_and_2`).
/// The AOL Gram form likewise: period 3 reached 0.121 where periods 1–2 stay ≤ 0.060
/// (`bf16_gram_aol_keeps_the_band_at_periods_1_and_2`).
fn check_gram_period(method: Msign, working: &str) -> Result<()> {
    match method {
        Msign::GramPolarExpress { restart, .. } | Msign::GramAol { restart, .. }
            if working == "bf16" && restart > GRAM_NS_RESTART =>
        {
            let why = format!(
                "{method:?} with restart {restart} in bf16: periods above {GRAM_NS_RESTART} \
                 let the bf16 Gram recurrence diverge on ill-conditioned inputs; use restart ≤ \
                 {GRAM_NS_RESTART} or Precision::F32"
            );
            Err(InputError::invalid("msign", why).into())
        }
        _ => Ok(()),
    }
}

/// msign's input in its working precision (module docs, "Scale"): `x` multiplied by an exact
/// power of two when ‖x‖_F is outside the safe range, then converted to the working type.
/// One norm of `x` (reused for `MuonQuinticEps`), at most one scaled copy and one conversion.
pub(crate) struct Working<M> {
    /// ‖x‖_F of the caller's input.
    pub(crate) fro: f64,
    /// The power-of-two scaled copy, when one was needed.
    pub(crate) scaled: Option<M>,
    /// The converted copy, when the working type differs from `x`'s.
    converted: Option<Converted<M>>,
}

/// The converted copy of [`Working`], with its own norm where the conversion computed it in the
/// same pass (then Newton–Schulz needs no pass of its own before its first step).
enum Converted<M> {
    Plain(M),
    Normed(Normed<M>),
}

impl<M: WorkingPrecision> Working<M> {
    /// The working input of `x` for `precision`. A non-finite entry is the error `validate`
    /// reports (argument `x`), checked only when the norm is not finite (finite f32/bf16 entries
    /// always give a finite f64 norm; finite f64 entries may overflow it and pass), so a caller
    /// that has not validated `x` pays no separate pass.
    pub(crate) fn of(x: &M, precision: Precision) -> Result<Self> {
        // The conversion and both norms in one pass where the backend has it (kept unless the
        // input's norm asks for a rescaling first).
        if let Some((normed, fro)) = x.to_working_with_norm(precision)? {
            if !needs_rescaling(fro) {
                return Ok(Self {
                    fro,
                    scaled: None,
                    converted: Some(Converted::Normed(normed)),
                });
            }
        }
        let fro = x.frobenius_norm()?;
        if !fro.is_finite() {
            x.validate("x").map_err(crate::error::from_linalg)?;
        }
        let scaled = power_of_two_scaled_from(x, fro)?.map(|(y, _)| y);
        let working = scaled.as_ref().unwrap_or(x).to_working(precision)?;
        Ok(Self {
            fro,
            scaled,
            converted: working.map(Converted::Plain),
        })
    }

    /// Whether the iteration runs on a converted copy (its output is in the working type).
    pub(crate) fn converted(&self) -> bool {
        self.converted.is_some()
    }

    /// The matrix the iteration runs on (`x` itself when neither copy was needed).
    pub(crate) fn input<'a>(&'a self, x: &'a M) -> &'a M {
        let converted = self.converted.as_ref().map(|c| match c {
            Converted::Plain(m) => m,
            Converted::Normed(n) => n.matrix(),
        });
        converted.or(self.scaled.as_ref()).unwrap_or(x)
    }

    /// [`newton_schulz`] on the input, without its first passes where the norm is known.
    fn newton_schulz(self, x: &M, schedule: &NsSchedule) -> kappa_linalg::Result<M> {
        match self.converted {
            Some(Converted::Normed(normed)) => newton_schulz_normed(normed, schedule),
            _ => newton_schulz(self.input(x), schedule),
        }
    }

    /// An output in the working type, back in `x`'s type (no copy when they are the same).
    #[cfg(feature = "tch")]
    pub(crate) fn back(&self, out: M, x: &M) -> Result<M> {
        match self.converted {
            Some(_) => out.to_kind_of(x),
            None => Ok(out),
        }
    }
}
