//! AOL-preconditioned Newton–Schulz ("Turbo-Muon", Boissin, Massena, Mamalet, Serrurier,
//! arXiv 2512.04632): the Frobenius normalization replaced by the AOL rescaling of Prach &
//! Lampert (arXiv 2208.03160), which reuses the first Gram product, then a shorter schedule.
//!
//! # Math
//!
//! In the wide orientation X ∈ ℝ^{r×s}, r ≤ s (the small side has r rows; for a tall input
//! this is X ← X·D with D acting on the columns), with A = XXᵀ (r×r):
//!
//!   D = diag(d),  d_i = (Σ_j |A_ij|)^{-1/2},  X₁ = D·X,  A₁ = X₁X₁ᵀ = D·A·D.
//!
//! **‖D·X‖₂ ≤ 1.** D·A·D ≼ I ⟺ A ≼ D⁻² = diag(Σ_j |A_ij|), and diag(Σ_j |A_ij|) − A is
//! symmetric with diagonal entries Σ_{j≠i} |A_ij| ≥ 0 equal to its off-diagonal row sums in
//! modulus: diagonally dominant, hence PSD (Gershgorin). So every singular value of X₁ lies in
//! [0, 1] without ‖X‖_F, and A₁ comes from A by two diagonal scalings (no second product). For
//! a matrix with orthogonal rows D is exact (X₁ has all σ = 1); in general X₁ is closer to
//! orthogonal than X/‖X‖_F because each row is scaled by its own norm-like factor.
//!
//! **What it computes.** The schedule then runs on X₁ = D·X, so the result approximates
//! msign(D·X), *not* msign(X): the two agree only when D is a multiple of I (rows of equal
//! "Gram row mass"), or in the limit of orthogonal rows. msign(D·X) = U₁V₁ᵀ from the SVD of
//! D·X; it is still an orthogonal-factor direction with ⟨X, msign(D·X)⟩ > 0, but its descent
//! quality ⟨X, O⟩/‖X‖_* is below msign(X)'s value 1. The distances and qualities measured on
//! Gaussian and ill-conditioned inputs are in docs/linalg.md ("AOL").
//!
//! **The schedule** ([`NsSchedule::turbo_muon`]): the authors' code runs the last `steps` of
//! a five-step list ([`TURBO_MUON_COEFFICIENTS`], the per-step coefficients of Microsoft Dion's
//! Newton–Schulz), 4 by default; the first step uses A₁ and each later one forms its own Gram
//! matrix. A row that is exactly zero (Σ_j |A_ij| = 0) gets d_i = 0 and stays zero (sign(0) = 0);
//! the authors clamp the sum at 1e-7 (of the raw input) instead, which does the same for a zero
//! row but is not scale-invariant; here D·X is invariant under X → αX.
//!
//! **A short schedule** ([`NsSchedule::aol_three_steps`]): since ‖D·X‖₂ ≤ 1 exactly, the Polar
//! Express generator can design for σ(D·X) ∈ [ℓ, 1] with no safety factor. Three degree-5 steps
//! for ℓ = 0.03 map that interval into 1 ± 0.036. Against five quintic steps (Muon) and four
//! Turbo steps, on seeded square and tall Gaussians and κ = 10⁴ spectra (f64, 96×256 to 512²),
//! its descent quality ⟨X, O⟩/(‖X‖_*·σ_max(O)) is 0.942–0.965 against 0.690–0.851 (quintic) and
//! 0.867–0.970 (Turbo, ahead only on tall Gaussians, by ≤ 0.005); its σ_max(O) stays ≤ 1.036
//! (1.20 and 1.145). The price: directions with σ(D·X) ≪ ℓ are lifted less (the smallest σ of O
//! is 2.1–5.2× below the quintic's on the inputs that have such directions: square Gaussians,
//! κ = 10⁴). Measured by `aol_short_measurements` (docs/linalg.md, "AOL").
//!
//! **Scale.** The input is first normalized by ‖X‖_F exactly as in
//! [`newton_schulz`](crate::newton_schulz()) (exact powers of two around extreme norms): D·X is
//! invariant under X → αX, so this only keeps A = XXᵀ inside the element type's range, at the
//! cost of one rounding of X. The normalization factor c of the schedule divides D (X₁ = D·X/c);
//! the Turbo-Muon schedule has c = 1.
//!
//! Cost: identical to [`newton_schulz`](crate::newton_schulz()) with the same number of steps
//! (the first Gram product is the one AOL needs) plus O(r² + rs) for the scalings.

use crate::error::Result;
use crate::gram_newton_schulz::run_blocks;
use crate::input::InputError;
use crate::matrix::Matrix;
use crate::newton_schulz::{check_normalization, finish, poly_part, prepare, NsSchedule, PolyStep};
use crate::polar_express::PolarExpressSpec;

/// The five-step coefficient list of the Turbo-Muon code (taken by it from Microsoft Dion's
/// Newton–Schulz); a run with N ≤ 5 steps uses the last N ([`NsSchedule::turbo_muon`]).
pub const TURBO_MUON_COEFFICIENTS: [PolyStep; 5] = [
    PolyStep::new(4.0848, -6.8946, 2.9270),
    PolyStep::new(3.9505, -6.3029, 2.6377),
    PolyStep::new(3.7418, -5.5913, 2.3037),
    PolyStep::new(2.8769, -3.1427, 1.2046),
    PolyStep::new(2.8366, -3.0525, 1.2012),
];

/// The number of Turbo-Muon steps its authors use: 4.
pub const TURBO_MUON_STEPS: usize = 4;

/// The steps of kappa's short AOL schedule ([`NsSchedule::aol_three_steps`]): 3.
pub const AOL_SHORT_STEPS: usize = 3;

/// The lower end ℓ of the interval [ℓ, 1] of σ(D·X) that [`NsSchedule::aol_three_steps`] is designed
/// for: 0.03.
pub const AOL_SHORT_LOWER: f64 = 0.03;

impl NsSchedule {
    /// The Turbo-Muon schedule: the last `steps` entries of [`TURBO_MUON_COEFFICIENTS`]
    /// (4 steps: from (3.9505, −6.3029, 2.6377) on), normalization factor 1. Meant for
    /// [`aol_newton_schulz`].
    ///
    /// Errors: [`InputError::InvalidArgument`] (argument `steps`) unless 1 ≤ steps ≤ 5.
    pub fn turbo_muon(steps: usize) -> Result<Self> {
        let n = TURBO_MUON_COEFFICIENTS.len();
        if steps == 0 || steps > n {
            let why = format!("Turbo-Muon has 1 to {n} steps, found {steps}");
            return Err(InputError::invalid("steps", why).into());
        }
        Ok(Self {
            steps: TURBO_MUON_COEFFICIENTS[n - steps..].to_vec(),
            normalization: 1.0,
        })
    }

    /// kappa's short AOL schedule: the Polar Express generator's [`AOL_SHORT_STEPS`] = 3
    /// degree-5 steps for σ(D·X) ∈ [[`AOL_SHORT_LOWER`], 1] = [0.03, 1], with no safety factor
    /// (s = 1: ‖D·X‖₂ ≤ 1 is exact, not an estimate). Meant for [`aol_newton_schulz`]: one step
    /// fewer than Turbo-Muon's 4 and two fewer than Muon's quintic ×5, with a higher descent
    /// quality than the quintic on every input measured and than Turbo ×4 on all but tall
    /// Gaussians (module docs, "A short schedule").
    ///
    /// Errors: none for these constants; the generator's errors otherwise
    /// ([`PolarExpressSpec::design`]).
    pub fn aol_three_steps() -> Result<Self> {
        let spec = PolarExpressSpec::new(AOL_SHORT_LOWER, 5, AOL_SHORT_STEPS, 1.0);
        Ok(spec.design()?.schedule)
    }

    /// The former name of [`NsSchedule::aol_three_steps`].
    #[deprecated(since = "0.2.0", note = "renamed `aol_three_steps`")]
    pub fn aol_short() -> Result<Self> {
        Self::aol_three_steps()
    }
}

/// Runs `schedule` on D·X/c, the AOL-rescaled input (module docs), instead of X/(c·‖X‖_F).
///
/// Returns a new matrix of `x`'s shape, element type and (for `tch`) device; the zero matrix maps
/// to itself. The result approximates msign(D·X), which is not msign(X) (module docs).
///
/// Errors: `x` empty or non-finite ([`InputError::Empty`], [`InputError::NonFinite`], argument
/// `x`); an invalid schedule (as [`NsSchedule::validate`]), also a normalization factor c for
/// which c or 1/c is not a normal number of `x`'s element type ([`InputError::InvalidArgument`],
/// argument `schedule.normalization`: D·X/c would underflow or overflow);
/// [`LinalgError::Overflow`] (argument `schedule`) when a user schedule drives the iterate out
/// of range.
///
/// [`LinalgError::Overflow`]: crate::LinalgError::Overflow
///
/// ```
/// use kappa_linalg::{aol_newton_schulz, NsSchedule};
/// // Orthogonal rows of different lengths: D·X is orthonormal, and so is the result.
/// let x = ndarray::array![[3.0_f64, 0.0, 0.0], [0.0, 0.2, 0.0]];
/// let q = aol_newton_schulz(&x, &NsSchedule::turbo_muon(4)?)?;
/// assert!((q[[0, 0]] - q[[1, 1]]).abs() < 1e-12 && q[[0, 1]] == 0.0);
/// # Ok::<(), kappa_linalg::LinalgError>(())
/// ```
pub fn aol_newton_schulz<M: Matrix>(x: &M, schedule: &NsSchedule) -> Result<M> {
    // Arguments in signature order: `x`, then `schedule`.
    x.validate("x")?;
    schedule.validate()?;
    check_normalization(x, schedule.normalization)?;
    let (mut prepared, transposed) = prepare(x, &frobenius_only())?;
    if let Some(x0) = prepared.as_mut() {
        let mut gram = Some(aol_rescale(x0, schedule.normalization)?);
        for p in &schedule.steps {
            let a = match gram.take() {
                Some(a) => a,
                None => x0.gram()?,
            };
            let b = poly_part(&a, p)?;
            *x0 = x0.mul_add(1.0, &b, x0, p.a)?;
        }
    }
    finish(prepared, transposed)
}

/// [`aol_newton_schulz`] with the schedule run as Gram Newton–Schulz
/// ([`gram_newton_schulz()`](crate::gram_newton_schulz())): the same map of D·X in exact
/// arithmetic, with r×r products only and D·X·(D·X)ᵀ re-formed every `restart` steps; the AOL
/// Gram matrix D·A·D is the first block's (no product of its own). It pays where
/// `gram_newton_schulz` does, on tall or wide inputs (s ≳ 2r): 4 steps at restart 2 cost
/// 8r²s + 20r³ flops against 16r²s + 8r³ for [`aol_newton_schulz`].
///
/// Errors: as [`aol_newton_schulz`] (arguments `x`, `schedule`), and
/// [`InputError::InvalidArgument`] (argument `restart`) for `restart == 0`.
///
/// ```
/// use kappa_linalg::{aol_gram_newton_schulz, aol_newton_schulz, NsSchedule, GRAM_NS_RESTART};
/// let x = ndarray::array![[2.0_f64, 0.0, 0.3, 0.0], [0.0, 0.1, 0.0, 0.2]];
/// let sched = NsSchedule::turbo_muon(4)?;
/// let g = aol_gram_newton_schulz(&x, &sched, GRAM_NS_RESTART)?;
/// let p = aol_newton_schulz(&x, &sched)?;
/// assert!((&g - &p).iter().all(|e| e.abs() < 1e-12));
/// # Ok::<(), kappa_linalg::LinalgError>(())
/// ```
pub fn aol_gram_newton_schulz<M: Matrix>(
    x: &M,
    schedule: &NsSchedule,
    restart: usize,
) -> Result<M> {
    // Arguments in signature order: `x`, `schedule`, then `restart`.
    x.validate("x")?;
    schedule.validate()?;
    check_normalization(x, schedule.normalization)?;
    if restart == 0 {
        return Err(InputError::invalid("restart", "must be ≥ 1 (steps between restarts)").into());
    }
    let (mut prepared, transposed) = prepare(x, &frobenius_only())?;
    if let Some(x0) = prepared.as_mut() {
        let gram = aol_rescale(x0, schedule.normalization)?;
        run_blocks(x0, &schedule.steps, restart, Some(gram))?;
    }
    finish(prepared, transposed)
}

/// The exact ‖X‖_F normalization of `prepare` with no steps: AOL's D·X is scale-invariant, so
/// this only keeps X·Xᵀ inside the element type's range.
fn frobenius_only() -> NsSchedule {
    NsSchedule {
        steps: Vec::new(),
        normalization: 1.0,
    }
}

/// X ← D·X/c in place (X wide, finite, non-zero) and returns its Gram matrix D·A·D/c² formed
/// from A = XXᵀ by scalings. d_i = 0 for a zero row.
fn aol_rescale<M: Matrix>(x: &mut M, c: f64) -> Result<M> {
    let mut a = x.gram()?;
    let d: Vec<f64> = a
        .abs_row_sums()?
        .iter()
        .map(|&s| if s > 0.0 { 1.0 / (s.sqrt() * c) } else { 0.0 })
        .collect();
    scale_rows(x, &d)?;
    a.scale_columns(&d)?;
    scale_rows(&mut a, &d)?;
    Ok(a)
}

/// A ← diag(d)·A, as the column scaling of Aᵀ (the transposes are O(1)).
fn scale_rows<M: Matrix>(a: &mut M, d: &[f64]) -> Result<()> {
    let mut t = a.duplicate()?.into_transpose();
    t.scale_columns(d)?;
    *a = t.into_transpose();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turbo_muon_takes_the_last_steps() {
        let s = NsSchedule::turbo_muon(4).unwrap();
        assert_eq!(s.steps, TURBO_MUON_COEFFICIENTS[1..].to_vec());
        assert_eq!(s.normalization, 1.0);
        assert!(NsSchedule::turbo_muon(0).is_err() && NsSchedule::turbo_muon(6).is_err());
    }

    #[test]
    fn aol_bounds_the_spectral_norm_by_one() {
        let mut x = ndarray::array![[1.0_f64, 2.0, 0.5], [0.3, -1.0, 4.0]];
        let a = aol_rescale(&mut x, 1.0).unwrap();
        let s = crate::Matrix::singular_values(&x).unwrap();
        assert!(s[0] <= 1.0 + 1e-14, "{s:?}");
        let direct = x.dot(&x.t());
        assert!((&a - &direct).iter().all(|e| e.abs() < 1e-14));
    }

    #[test]
    fn a_normalization_outside_the_element_types_range_is_an_error_in_both_aol_forms() {
        let x = ndarray::array![[1.0_f32, 2.0, 0.5], [0.3, -1.0, 4.0]];
        let sched = NsSchedule {
            normalization: 1e300,
            ..NsSchedule::turbo_muon(4).unwrap()
        };
        let arg = |r: Result<ndarray::Array2<f32>>| match r {
            Err(crate::LinalgError::Input(InputError::InvalidArgument { arg, .. })) => arg,
            other => panic!("{other:?}"),
        };
        assert_eq!(arg(aol_newton_schulz(&x, &sched)), "schedule.normalization");
        assert_eq!(
            arg(aol_gram_newton_schulz(&x, &sched, 2)),
            "schedule.normalization"
        );
        // f64 holds D·X/1e300.
        assert!(aol_newton_schulz(&x.mapv(f64::from), &sched).is_ok());
    }
}
