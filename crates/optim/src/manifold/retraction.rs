//! Retractions back onto the Stiefel and DGram manifolds, and the manifold violation measures.
//!
//! All functions take W in the tall orientation (m ≥ n).
//!
//! * Stiefel: W ← msign(W), the polar projection (the paper's and TML's choice; the Modula docs'
//!   exact alternative W·(I − AᵀA + AᵀA/sqrt(1+η²)) is not implemented).
//! * DGram, [`DGramRetraction::Paper`]: the SVD W = U S Vᵀ, then W ← (UVᵀ)·diag(S). **Trap:** column j of the polar factor gets the j-th *largest* singular value. On DGram
//!   W = Q·D, so UVᵀ = Q and the retraction returns Q·diag(sort_desc(D)): it is the identity only
//!   when the column norms are sorted descending (as right after the init retraction). If two
//!   column norms cross during training, their magnitudes are silently swapped — a jump of
//!   ≈ |d_i − d_j| in W.
//! * DGram, [`DGramRetraction::ColumnNorms`]: D = diag(‖w_j‖), W ← msign(W·D⁻¹)·D. Exact on DGram
//!   (keeps every column's norm, never permutes), but when a column norm is comparable to the step
//!   η the retraction can move W by several η (3–6× η measured on f64 runs, docs/optim.md "Traps"); a zero column
//!   stays unscaled (D⁻¹ uses 1 there).
//!
//! Violation measures (scale-free, per unit of the diagonal):
//! Stiefel ‖WᵀW − I‖_F/√n; DGram ‖Off(WᵀW)‖_F/‖diag(WᵀW)‖₂ (0 for W = 0).

use kappa_linalg::Matrix;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::msign::{msign, power_of_two_scaled, scale_by_power_of_two, Msign};
use crate::precision::{Precision, WorkingPrecision};

/// The DGram retraction (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DGramRetraction {
    /// The paper's (UVᵀ)·diag(S): faithful for reproduction, swaps column scales when column
    /// norms are not sorted descending.
    #[default]
    Paper,
    /// msign(W·D⁻¹)·D with D the column norms: keeps each column's norm.
    ColumnNorms,
}

/// Which manifold a matrix is constrained to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Manifold {
    /// WᵀW = I (all singular values 1).
    Stiefel,
    /// Off(WᵀW) = 0: orthogonal columns of free norms (σ_j = ‖w_j‖).
    #[serde(rename = "dgram")]
    DGram(DGramRetraction),
}

impl Manifold {
    /// DGram with the paper's retraction.
    pub const fn dgram() -> Self {
        Manifold::DGram(DGramRetraction::Paper)
    }

    /// The Gram projector P of the constraint P(WᵀW) = P(I).
    pub fn projector(&self) -> super::Projector {
        match self {
            Manifold::Stiefel => super::Projector::Identity,
            Manifold::DGram(_) => super::Projector::OffDiagonal,
        }
    }

    /// `"Stiefel"` or `"DGram"`.
    pub fn name(&self) -> &'static str {
        match self {
            Manifold::Stiefel => "Stiefel",
            Manifold::DGram(_) => "DGram",
        }
    }
}

/// Retracts tall `w` onto `manifold` (new matrix). Scale-safe: Stiefel through msign (which
/// scales internally); DGram on 2^k·W with ‖2^k·W‖_F ≈ 1 when W is far from unit scale, the
/// result scaled back by 2^−k (both DGram retractions are positively homogeneous and DGram is a
/// cone). The result may be non-finite only when a column norm exceeds `f64::MAX`; callers check.
pub(crate) fn retract<M: WorkingPrecision>(
    w: &M,
    manifold: Manifold,
    method: Msign,
    precision: Precision,
) -> Result<M> {
    let retraction = match manifold {
        Manifold::Stiefel => return msign(w, method, precision),
        Manifold::DGram(r) => r,
    };
    match power_of_two_scaled(w)? {
        None => retract_dgram(w, retraction, method, precision),
        Some((y, k)) => {
            let mut r = retract_dgram(&y, retraction, method, precision)?;
            scale_by_power_of_two(&mut r, -k)?;
            Ok(r)
        }
    }
}

fn retract_dgram<M: WorkingPrecision>(
    w: &M,
    retraction: DGramRetraction,
    method: Msign,
    precision: Precision,
) -> Result<M> {
    match retraction {
        DGramRetraction::Paper => {
            // LAPACK-safe strides (a copy only for negative or zero strides, see
            // `WorkingPrecision::to_working`), then one SVD for both factors.
            let fixed = w.to_working(Precision::Native)?;
            let (mut q, s) = fixed
                .as_ref()
                .unwrap_or(w)
                .polar_factor_and_singular_values()?;
            q.scale_columns(&s)?;
            Ok(q)
        }
        DGramRetraction::ColumnNorms => {
            let wt = w.duplicate()?.into_transpose();
            let d: Vec<f64> = wt
                .matmul(w)?
                .diagonal()?
                .into_iter()
                .map(|x| x.max(0.0).sqrt())
                .collect();
            let inv: Vec<f64> = d
                .iter()
                .map(|&x| if x > 0.0 { 1.0 / x } else { 1.0 })
                .collect();
            let mut x = w.duplicate()?;
            x.scale_columns(&inv)?;
            let mut q = msign(&x, method, precision)?;
            q.scale_columns(&d)?;
            Ok(q)
        }
    }
}

/// The violation of tall `w` (Wᵀ given as `wt`) at a scale where WᵀW is representable.
pub(crate) fn violation_tall<M: Matrix>(w: &M, wt: &M, manifold: Manifold) -> Result<f64> {
    let mut c = wt.matmul(w)?;
    let d = c.diagonal()?;
    let n = d.len() as f64;
    match manifold {
        Manifold::Stiefel => {
            c.set_diagonal(&d.iter().map(|x| x - 1.0).collect::<Vec<_>>())?;
            Ok(c.frobenius_norm()? / n.sqrt())
        }
        Manifold::DGram(_) => {
            let scale = d.iter().map(|x| x * x).sum::<f64>().sqrt();
            c.set_diagonal(&vec![0.0; d.len()])?;
            let off = c.frobenius_norm()?;
            Ok(if scale > 0.0 { off / scale } else { off })
        }
    }
}

/// The violation of tall finite `w` (module docs) at any scale: DGram's measure is scale-free
/// and is computed on 2^k·W; Stiefel's on a huge W as 4^{−k}·‖YᵀY − 4^k·I‖_F/√n with Y = 2^k·W
/// (+∞ when that exceeds `f64::MAX`); a tiny W needs no care (WᵀW underflows harmlessly: the
/// measure is ≈ 1 there).
pub(crate) fn violation_of<M: Matrix>(w: &M, manifold: Manifold) -> Result<f64> {
    let scaled = power_of_two_scaled(w)?;
    let (y, k) = match (&scaled, manifold) {
        (Some((y, k)), Manifold::DGram(_)) => (y, *k),
        (Some((y, k)), Manifold::Stiefel) if *k < 0 => (y, *k),
        _ => {
            let wt = w.duplicate()?.into_transpose();
            return violation_tall(w, &wt, manifold);
        }
    };
    let yt = y.duplicate()?.into_transpose();
    if let Manifold::DGram(_) = manifold {
        return violation_tall(y, &yt, manifold);
    }
    let mut c = yt.matmul(y)?;
    let d = c.diagonal()?;
    let shift = 2f64.powi(2 * k);
    c.set_diagonal(&d.iter().map(|x| x - shift).collect::<Vec<_>>())?;
    let n = d.len() as f64;
    let half = 2f64.powi(-k);
    Ok(c.frobenius_norm()? / n.sqrt() * half * half)
}
