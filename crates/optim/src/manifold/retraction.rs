//! Retractions back onto the Stiefel, DGram and Oblique manifolds, and the manifold violation
//! measures.
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
//! * Oblique ([`Manifold::Oblique`], diag(WᵀW) = 1): w_j ← w_j/‖w_j‖, the nearest point (each
//!   column is its own unit sphere). Computed on 2^k·W with ‖2^k·W‖_F ∈ [0.5, 2) (exact, and
//!   the map is invariant under a positive scale of each column), then d_j² = (WᵀW)_jj in the
//!   working type and w_j·(1/d_j). **Floor:** a column with d_j ≤ τ = 2⁻⁵⁰ there (so
//!   ‖w_j‖ ≤ 2⁻⁵⁰·‖W‖_F up to the factor 2 of the scaling band), zero included, is
//!   [`OptimError::ZeroColumn`](crate::OptimError::ZeroColumn), never 0/0 = NaN. Why 2⁻⁵⁰: above
//!   it d_j² ≥ 2⁻¹⁰⁰, far above f32's (and bf16's) smallest normal 2⁻¹²⁶, so the only
//!   subnormal contributions are entries' squares below 2⁻¹²⁶, each off by ≤ 2⁻¹⁵⁰, m of them
//!   ≤ m·2⁻⁵⁰ relative to d_j² — below f32's u = 2⁻²⁴ for m ≤ 2²⁶ — and 1/d_j ≤ 2⁵⁰ is finite in
//!   every working type: every accepted column is normalized to working precision, its squared
//!   norm within γ_{m+8} of 1 (`tests/muon/oblique.rs`, `oblique_bound`). A column that small
//!   next to the rest of W has no direction the data determine.
//!
//! Violation measures (scale-free, per unit of the diagonal):
//! Stiefel ‖WᵀW − I‖_F/√n; DGram ‖Off(WᵀW)‖_F/‖diag(WᵀW)‖₂ (0 for W = 0); Oblique
//! max_j |‖w_j‖² − 1| (the max, not the RMS: the constraint is n separate ones, and an RMS would
//! let a zero column of a 768-column W pass a 0.05 tolerance at 1/√768 = 0.036).

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
    /// diag(WᵀW) = 1: unit columns, singular values free (the product of n unit spheres).
    Oblique,
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
            Manifold::Oblique => super::Projector::Diagonal,
        }
    }

    /// `"Stiefel"`, `"DGram"` or `"Oblique"`.
    pub fn name(&self) -> &'static str {
        match self {
            Manifold::Stiefel => "Stiefel",
            Manifold::DGram(_) => "DGram",
            Manifold::Oblique => "Oblique",
        }
    }
}

/// Retracts tall `w` onto `manifold` (new matrix). Scale-safe: Stiefel through msign (which
/// scales internally); DGram on 2^k·W with ‖2^k·W‖_F ≈ 1 when W is far from unit scale, the
/// result scaled back by 2^−k (both DGram retractions are positively homogeneous and DGram is a
/// cone); Oblique at unit scale (module docs; a column below the floor is
/// [`OptimError::ZeroColumn`](crate::OptimError::ZeroColumn) naming `arg`). The result may be non-finite only when a DGram
/// column norm exceeds `f64::MAX`; callers check.
pub(crate) fn retract<M: WorkingPrecision>(
    w: &M,
    manifold: Manifold,
    method: Msign,
    precision: Precision,
    arg: &'static str,
) -> Result<M> {
    let retraction = match manifold {
        Manifold::Stiefel => return msign(w, method, precision),
        Manifold::DGram(r) => r,
        Manifold::Oblique => return retract_oblique(w, arg),
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

/// The Oblique floor τ on the column norms of W scaled to ‖W‖_F ∈ [0.5, 2) (module docs).
pub(crate) const OBLIQUE_FLOOR: f64 = 1.0 / (1u64 << 50) as f64;

/// `w` multiplied by an exact power of two to ‖·‖_F ∈ [0.5, 2) (a copy; `w` finite, non-zero).
fn unit_scaled<M: Matrix>(w: &M) -> Result<M> {
    let mut y = match power_of_two_scaled(w)? {
        Some((y, _)) => y,
        None => w.duplicate()?,
    };
    let f = y.frobenius_norm()?;
    if f > 0.0 && f.is_finite() && !(0.5..2.0).contains(&f) {
        // power_of_two_scaled leaves ‖W‖_F ∈ [2⁻²⁰, 2²⁰] alone: one more exact step.
        scale_by_power_of_two(&mut y, -f.log2().floor() as i32)?;
    }
    Ok(y)
}

/// The Oblique retraction w_j ← w_j/‖w_j‖ of tall finite `w` (module docs, floor included).
fn retract_oblique<M: Matrix>(w: &M, arg: &'static str) -> Result<M> {
    let mut y = unit_scaled(w)?;
    let fro = y.frobenius_norm()?;
    let yt = y.duplicate()?.into_transpose();
    let d2 = yt.matmul(&y)?.diagonal()?;
    let mut inv = Vec::with_capacity(d2.len());
    for (column, &s) in d2.iter().enumerate() {
        let d = s.max(0.0).sqrt(); // s is finite: ‖Y‖_F < 2
        if d <= OBLIQUE_FLOOR {
            return Err(crate::OptimError::ZeroColumn {
                arg,
                column,
                relative_norm: if fro > 0.0 { d / fro } else { 0.0 },
            });
        }
        inv.push(1.0 / d);
    }
    y.scale_columns(&inv)?;
    Ok(y)
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
        Manifold::Oblique => Ok(max_abs_shifted(&d, 1.0)),
    }
}

/// max_j |d_j − shift| (NaN-propagating: a NaN diagonal gives NaN).
fn max_abs_shifted(d: &[f64], shift: f64) -> f64 {
    d.iter().map(|x| (x - shift).abs()).fold(0.0, |m, v| {
        if v.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.max(v)
        }
    })
}

/// The violation of tall finite `w` (module docs) at any scale: DGram's measure is scale-free
/// and is computed on 2^k·W; Stiefel's on a huge W as 4^{−k}·‖YᵀY − 4^k·I‖_F/√n with Y = 2^k·W
/// (+∞ when that exceeds `f64::MAX`); a tiny W needs no care (WᵀW underflows harmlessly: the
/// measure is ≈ 1 there). Oblique's, like Stiefel's, as 4^{−k}·max_j |(YᵀY)_jj − 4^k| on a huge W.
pub(crate) fn violation_of<M: Matrix>(w: &M, manifold: Manifold) -> Result<f64> {
    if manifold == Manifold::Oblique {
        return oblique_violation_of(w);
    }
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

/// [`violation_of`] on Oblique: max_j |‖w_j‖² − 1|, through Y = 2^k·W when W is huge (k < 0).
fn oblique_violation_of<M: Matrix>(w: &M) -> Result<f64> {
    match power_of_two_scaled(w)? {
        Some((y, k)) if k < 0 => {
            let yt = y.duplicate()?.into_transpose();
            let d = yt.matmul(&y)?.diagonal()?;
            let half = 2f64.powi(-k);
            Ok(max_abs_shifted(&d, 2f64.powi(2 * k)) * half * half)
        }
        _ => {
            let wt = w.duplicate()?.into_transpose();
            violation_tall(w, &wt, Manifold::Oblique)
        }
    }
}
