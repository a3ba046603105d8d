//! msign(X) = U·sign(Σ)·Vᵀ, the matrix sign (orthogonalization) that Muon and manifold Muon apply,
//! computed three ways: exactly through the SVD, by Muon's quintic Newton–Schulz, or by Polar
//! Express (what the paper's code ran).
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
//! | `MuonQuintic` | 5 steps of p(x) = 3.4445x − 4.7750x³ + 2.0315x⁵ after ‖X‖_F-normalization | in [0.6818, 1.1344] for σ/‖X‖_F ≥ 0.0052 (not 1: the coefficients sum to 0.701) |
//! | `PolarExpress { steps }` | Amsel et al.'s per-step table, normalization 1.01·‖X‖_F | 1 ± 1e-6 after 10 steps for σ/‖X‖_F ∈ [1e-3, 1] (f64) |
//!
//! # Traps (paper notes §1.2, §3.3, §10)
//!
//! * Normalizers differ in the references: Muon divides by ‖X‖_F + 1e-7, the paper's Polar
//!   Express by 1.01·‖X‖_F with no epsilon. kappa-linalg divides by (c·‖X‖_F) exactly, so both
//!   iterations here are scale-invariant down to the smallest normal numbers; an input of norm
//!   ≲ 1e-7 is *not* shrunk as it is in Muon's reference.
//! * Zero singular values: the Newton–Schulz iterations keep them at 0 (odd polynomials). A bare
//!   polar factor U·Vᵀ of a rank-deficient input completes the null directions to an orthonormal
//!   factor (σ = 1 there, not 0). That matters: a square skew-symmetric matrix of odd size is
//!   always singular, so the square Stiefel closed form W·msign(WᵀG − GᵀW) with a bare polar
//!   factor is *not tangent* for odd n (violation 2/n). `Exact` therefore checks the numerical
//!   rank (σ_i > τ = σ₁·max(m, n)·ε, numpy's rule, ε of the working type) and, when it is
//!   deficient, returns Q·Π with Q the polar factor and Π the projector on the row space, computed
//!   as the sign of the PSD factor H = QᵀX by the cubic Newton–Schulz iteration (null directions
//!   stay at ≈ 10·κ_r·ε). The zero matrix maps to the zero matrix in every variant.
//! * Inputs with σ/‖X‖_F below the thresholds (0.0052 for the quintic, 1e-3 for Polar Express) are
//!   not fully inflated: e.g. a square Gaussian's smallest σ end near 0.02 after NS5.

use kappa_linalg::{newton_schulz, Matrix, NsSchedule};
use serde::{Deserialize, Serialize};

use crate::error::{OptimError, Result};
use crate::precision::{Precision, WorkingPrecision};

/// How msign is computed (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Msign {
    /// The polar factor U·Vᵀ of the SVD (exact; for tests and f64 work).
    Exact,
    /// Muon's quintic Newton–Schulz, 5 steps (Keller Jordan's reference).
    MuonQuintic,
    /// Polar Express with per-step coefficients; the paper's code uses 10 steps.
    PolarExpress {
        /// Number of steps (≥ 1).
        steps: usize,
    },
}

impl Msign {
    /// Polar Express with 10 steps, the paper's msign.
    pub const fn polar_express() -> Self {
        Msign::PolarExpress { steps: 10 }
    }

    /// The Newton–Schulz schedule behind this variant (`None` for `Exact`).
    pub fn schedule(&self) -> Option<NsSchedule> {
        match *self {
            Msign::Exact => None,
            Msign::MuonQuintic => Some(NsSchedule::muon()),
            // `validate` rejects step counts beyond the linalg cap, so `ok()` drops no valid schedule.
            Msign::PolarExpress { steps } => NsSchedule::polar_express(steps).ok(),
        }
    }

    /// Checks the parameters (Polar Express needs at least one step).
    pub fn validate(&self) -> Result<()> {
        match *self {
            Msign::PolarExpress { steps: 0 } => Err(OptimError::InvalidArgument {
                arg: "msign",
                reason: "Polar Express needs at least 1 step".into(),
            }),
            Msign::PolarExpress { steps } if steps > kappa_linalg::MAX_NS_STEPS => {
                Err(OptimError::InvalidArgument {
                    arg: "msign",
                    reason: format!(
                        "Polar Express with {steps} steps, more than kappa_linalg::MAX_NS_STEPS"
                    ),
                })
            }
            _ => Ok(()),
        }
    }

    /// Matrix products per call for X ∈ ℝ^{m×n} with r = min(m, n), s = max(m, n), in flops
    /// (`Exact` counts 0: its cost is an SVD).
    pub fn flops(&self, m: usize, n: usize) -> f64 {
        let (r, s) = (m.min(n) as f64, m.max(n) as f64);
        let per_step = 4.0 * r * r * s + 2.0 * r * r * r;
        match *self {
            Msign::Exact => 0.0,
            Msign::MuonQuintic => 5.0 * per_step,
            Msign::PolarExpress { steps } => steps as f64 * per_step,
        }
    }
}

/// Exact msign: the polar factor, with the null directions of a numerically rank-deficient input
/// mapped to 0 (module docs). `working` names the element type the computation runs in.
fn exact<M: Matrix>(x: &M, working: &str) -> Result<M> {
    let s = x.singular_values()?;
    let (m, n) = x.shape();
    let eps = if working == "f64" {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    };
    let s1 = s.first().copied().unwrap_or(0.0);
    if s1 == 0.0 {
        return Ok(x.duplicate()?);
    }
    let tau = s1 * m.max(n) as f64 * eps;
    let rank = s.iter().filter(|&&v| v > tau).count();
    let q = x.polar_factor()?;
    if rank == s.len() {
        return Ok(q);
    }
    // H = QᵀX (tall) or X·Qᵀ (wide): PSD, eigenvalues σ_1..σ_r and zeros; its sign is the
    // projector on the row (column) space. Cubic Newton–Schulz from ‖H‖_F-normalization needs
    // log(‖H‖_F/σ_r)/log(1.5) steps to reach the quadratic phase, then a few more.
    let fro = s.iter().map(|v| v * v).sum::<f64>().sqrt();
    let steps = ((fro / s[rank - 1]).ln() / 1.5f64.ln()).ceil() as usize + 8;
    let tall = m >= n;
    let h = if tall {
        q.duplicate()?.into_transpose().matmul(x)?
    } else {
        x.matmul(&q.duplicate()?.into_transpose())?
    };
    let p = newton_schulz(&h, &NsSchedule::cubic(steps)?)?;
    Ok(if tall { q.matmul(&p)? } else { p.matmul(&q)? })
}

/// msign(x) by `method`, computed in the working precision `precision` resolves to (see
/// [`Precision`]); the result has `x`'s shape and element type.
///
/// Errors: `x` empty or non-finite ([`OptimError::NonFinite`], argument `x`), a precision the
/// backend cannot use, an invalid method, libtorch or LAPACK failures.
///
/// ```
/// use kappa_optim::{msign, Msign, Precision};
/// let x = ndarray::array![[3.0_f64, 0.0], [0.0, -0.5], [0.0, 0.0]];
/// let q = msign(&x, Msign::Exact, Precision::Native)?;
/// assert!((q[[0, 0]] - 1.0).abs() < 1e-12 && (q[[1, 1]] + 1.0).abs() < 1e-12);
/// let p = msign(&x, Msign::polar_express(), Precision::Native)?;
/// assert!((p[[1, 1]] + 1.0).abs() < 1e-6);
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
pub fn msign<M: WorkingPrecision>(x: &M, method: Msign, precision: Precision) -> Result<M> {
    method.validate()?;
    x.validate("x").map_err(crate::error::from_linalg)?;
    let working = x.to_working(precision)?;
    let input = working.as_ref().unwrap_or(x);
    let out = match method.schedule() {
        Some(schedule) => newton_schulz(input, &schedule)?,
        None => exact(input, x.working_name(precision)?)?,
    };
    match working {
        Some(_) => out.to_kind_of(x),
        None => Ok(out),
    }
}
