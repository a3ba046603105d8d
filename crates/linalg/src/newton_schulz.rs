//! Newton–Schulz orthogonalization: Muon's quintic, the classical cubic, and per-step
//! coefficient schedules (Polar Express), on any [`Matrix`] backend.
//!
//! # Math
//!
//! Every iteration here applies an odd polynomial to the singular values while keeping the
//! singular vectors: for X = U Σ Vᵀ, a step with coefficients (a, b, c) is
//!
//!   X ← a·X + b·(XXᵀ)X + c·(XXᵀ)²X = U·p(Σ)·Vᵀ,  p(x) = a·x + b·x³ + c·x⁵,
//!
//! evaluated as A = XXᵀ, B = b·A + c·A·A, X ← a·X + B·X (three products; two when c = 0). The
//! first two are symmetric (A·A = A·Aᵀ), and [`Matrix::gram`] and [`Matrix::gram_add`] compute
//! them by BLAS `syrk` in half the flops where the backend allows (f32/f64 on the CPU; see
//! [`crate::syrk`]). The last is one product, (B + a·I)·X, instead of a scaled copy of X plus
//! B·X (one pass over X fewer per step, within the same error bound; docs/linalg.md).
//! The iteration first divides X by `normalization`·‖X‖_F (Frobenius ≥ spectral, so every
//! singular value lands in [0, 1/normalization]), and works on the *wide orientation* (X is
//! transposed when it has more rows than columns), so the Gram matrix A is min(m,n)². The result
//! is transposed back, so the output always has the input's shape.
//!
//! * **Muon's quintic** ([`MUON_QUINTIC`], 5 steps): p(x) = 3.4445x − 4.7750x³ + 2.0315x⁵. Its
//!   coefficients sum to 0.701, so it does *not* converge to the polar factor; it inflates
//!   small singular values fast and then keeps them in a band. Measured in `f64` (dense scalar
//!   sweep, and checked on random matrices by the tests): every normalized singular value
//!   x ∈ [[`MUON_BAND_THRESHOLD`], 1] ends in [`MUON_BAND`] = [0.6818, 1.1344] after 5 steps.
//!   Values below ≈ 0.0015 end below the band (x = 0.001 → ≈ 0.5), values in
//!   [0.0015, 0.0052] may overshoot to at most 1.2024.
//! * **The classical cubic** ([`CUBIC`]): p(x) = (3x − x³)/2 converges to 1 for every
//!   x ∈ (0, √3), so X → U Vᵀ, the polar factor ([`polar_factor`](crate::polar_factor)),
//!   quadratically once all σ are near 1. A normalized σ = x needs about log(1/x)/log(1.5) steps
//!   to get there.
//! * **Per-step schedules** ([`NsSchedule`]): a list of (a, b, c) and a normalization factor, e.g.
//!   Polar Express ([`NsSchedule::polar_express`]).
//!
//! # Conventions
//!
//! * Scale invariance: the normalization divides by ‖X‖_F exactly (computed without underflow),
//!   with **no additive epsilon**, so NS(αX) = NS(X) for every α > 0 down to the smallest
//!   normal numbers. (Keller Jordan's Muon divides by ‖X‖_F + 1e-7 and `torch.optim.Muon` by
//!   max(‖X‖_F, 1e-7), which change inputs of norm ≲ 1e-7 and break this.) The zero matrix is
//!   returned as the zero matrix. The normalization factor c must suit the element type: c and
//!   1/c normal numbers of it ([`newton_schulz`]'s errors).
//! * Cost per step, X ∈ ℝ^{r×s}, r ≤ s: 4r²s + 2r³ flops for a quintic step with general
//!   products (bf16, CUDA), 3r²s + r³ with the symmetric ones (f32/f64 on the CPU); a cubic step
//!   skips the A·A product (c = 0). Memory: two r×s and two r×r buffers.
//! * Accuracy: each step is a few matrix products, so rounding adds O(s·ε) relative error per
//!   step in the working precision (`f32`, `bf16` or `f64`); the band and convergence statements
//!   hold to that accuracy.

use crate::error::{LinalgError, Result};
use crate::input::InputError;
use crate::matrix::Matrix;

/// One odd polynomial step p(x) = a·x + b·x³ + c·x⁵ (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolyStep {
    /// Coefficient of x.
    pub a: f64,
    /// Coefficient of x³.
    pub b: f64,
    /// Coefficient of x⁵.
    pub c: f64,
}

impl PolyStep {
    /// A step from its three coefficients.
    pub const fn new(a: f64, b: f64, c: f64) -> Self {
        Self { a, b, c }
    }

    /// p(x) = a·x + b·x³ + c·x⁵.
    pub fn eval(&self, x: f64) -> f64 {
        let x2 = x * x;
        x * (self.a + x2 * (self.b + x2 * self.c))
    }
}

/// Muon's quintic step (Keller Jordan): (3.4445, −4.7750, 2.0315).
pub const MUON_QUINTIC: PolyStep = PolyStep::new(3.4445, -4.7750, 2.0315);

/// The classical cubic Newton–Schulz step: (3/2, −1/2, 0).
pub const CUBIC: PolyStep = PolyStep::new(1.5, -0.5, 0.0);

/// The band [lo, hi] that 5 Muon quintic steps map every normalized singular value
/// x ∈ [[`MUON_BAND_THRESHOLD`], 1] into (f64; measured, see the module docs).
pub const MUON_BAND: (f64, f64) = (0.6818, 1.1344);

/// The smallest normalized singular value σ/‖X‖_F for which [`MUON_BAND`] holds.
pub const MUON_BAND_THRESHOLD: f64 = 0.0052;

/// The Polar Express coefficient table (Amsel et al., arXiv 2505.16932) as published, for steps
/// 0..7; the last entry is repeated for later steps. [`NsSchedule::polar_express`] applies the
/// safety factor to it.
pub const POLAR_EXPRESS_COEFFICIENTS: [PolyStep; 8] = [
    PolyStep::new(8.28721201814563, -23.595886519098837, 17.300387312530933),
    PolyStep::new(4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    PolyStep::new(3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    PolyStep::new(3.3184196573706015, -2.488488024314874, 0.51004894012372),
    PolyStep::new(2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    PolyStep::new(1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    PolyStep::new(1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    PolyStep::new(1.875, -1.25, 0.375),
];

/// The Polar Express safety factor s = 1.01: inputs are normalized by s·‖X‖_F, and the first
/// seven steps use (a/s, b/s³, c/s⁵).
pub const POLAR_EXPRESS_SAFETY: f64 = 1.01;

/// The most steps a schedule may have: 2¹⁶. Every schedule of this crate needs at most a few
/// hundred (the cubic reaches its quadratic phase from any normalized σ ≥ 2⁻¹⁰⁷⁴ in about
/// 1840 steps, log(2¹⁰⁷⁴)/log(1.5)); the cap turns an absurd step count into an error instead
/// of an allocation failure or a run without end.
pub const MAX_NS_STEPS: usize = 1 << 16;

fn check_steps(steps: usize) -> Result<()> {
    if steps > MAX_NS_STEPS {
        return Err(LinalgError::TooLarge {
            arg: "steps",
            reason: format!("{steps} Newton–Schulz steps, more than MAX_NS_STEPS = 2^16"),
        });
    }
    Ok(())
}

/// A Newton–Schulz schedule: one [`PolyStep`] per iteration, and the factor c in the initial
/// normalization X ← X / (c·‖X‖_F).
#[derive(Debug, Clone, PartialEq)]
pub struct NsSchedule {
    /// The steps, applied in order.
    pub steps: Vec<PolyStep>,
    /// The normalization factor c > 0 (1 for Muon and the cubic, 1.01 for Polar Express).
    pub normalization: f64,
}

impl NsSchedule {
    /// `steps` repetitions of one step, with the given normalization factor (checked when the
    /// schedule runs, see [`NsSchedule::validate`]).
    ///
    /// Errors: [`LinalgError::TooLarge`] (argument `steps`) beyond [`MAX_NS_STEPS`].
    pub fn repeated(step: PolyStep, steps: usize, normalization: f64) -> Result<Self> {
        check_steps(steps)?;
        Ok(Self {
            steps: vec![step; steps],
            normalization,
        })
    }

    /// Muon: 5 steps of [`MUON_QUINTIC`], normalization by ‖X‖_F.
    pub fn muon() -> Self {
        Self {
            steps: vec![MUON_QUINTIC; 5],
            normalization: 1.0,
        }
    }

    /// `steps` steps of the classical [`CUBIC`], normalization by ‖X‖_F.
    ///
    /// Errors: [`LinalgError::TooLarge`] (argument `steps`) beyond [`MAX_NS_STEPS`].
    pub fn cubic(steps: usize) -> Result<Self> {
        Self::repeated(CUBIC, steps, 1.0)
    }

    /// Polar Express with `steps` steps (the paper's code uses 10): the table
    /// [`POLAR_EXPRESS_COEFFICIENTS`], the first seven entries divided by
    /// (s, s³, s⁵), s = [`POLAR_EXPRESS_SAFETY`], the last entry repeated after step 7, and
    /// normalization by s·‖X‖_F. Every normalized x ∈ [10⁻³, 1]/s ends at 1 ± 10⁻⁶ after 10
    /// steps (f64).
    ///
    /// Errors: [`LinalgError::TooLarge`] (argument `steps`) beyond [`MAX_NS_STEPS`].
    pub fn polar_express(steps: usize) -> Result<Self> {
        check_steps(steps)?;
        let s = POLAR_EXPRESS_SAFETY;
        let last = POLAR_EXPRESS_COEFFICIENTS.len() - 1;
        let steps = (0..steps)
            .map(|i| {
                let p = POLAR_EXPRESS_COEFFICIENTS[i.min(last)];
                if i < last {
                    PolyStep::new(p.a / s, p.b / s.powi(3), p.c / s.powi(5))
                } else {
                    p
                }
            })
            .collect();
        Ok(Self {
            steps,
            normalization: s,
        })
    }

    /// The map this schedule applies to one singular value σ of a matrix with Frobenius norm
    /// `fro`: x = σ/(c·fro), then every step's polynomial. Useful to predict the output
    /// spectrum. Returns 0 for `fro == 0`; plain f64 arithmetic otherwise (NaN or ±∞ inputs,
    /// or an overflowing polynomial, give NaN or ±∞).
    pub fn scalar_map(&self, sigma: f64, fro: f64) -> f64 {
        if fro == 0.0 {
            return 0.0;
        }
        self.steps
            .iter()
            .fold(sigma / (self.normalization * fro), |x, p| p.eval(x))
    }

    /// Checks that the normalization is finite and positive, every coefficient finite and the
    /// number of steps at most [`MAX_NS_STEPS`].
    ///
    /// Errors: [`InputError::InvalidArgument`] (arguments `schedule.normalization`,
    /// `schedule.steps`), [`LinalgError::TooLarge`] (argument `schedule.steps`).
    pub fn validate(&self) -> Result<()> {
        if self.steps.len() > MAX_NS_STEPS {
            return Err(LinalgError::TooLarge {
                arg: "schedule.steps",
                reason: format!("{} steps, more than MAX_NS_STEPS = 2^16", self.steps.len()),
            });
        }
        if !(self.normalization.is_finite() && self.normalization > 0.0) {
            return Err(InputError::invalid(
                "schedule.normalization",
                format!("must be finite and > 0, found {}", self.normalization),
            )
            .into());
        }
        if let Some(i) = self
            .steps
            .iter()
            .position(|p| !(p.a.is_finite() && p.b.is_finite() && p.c.is_finite()))
        {
            return Err(InputError::invalid(
                "schedule.steps",
                format!("step {i} has a non-finite coefficient: {:?}", self.steps[i]),
            )
            .into());
        }
        Ok(())
    }
}

/// Runs a Newton–Schulz schedule on `x` (see the module docs for the math and conventions).
///
/// Returns a new matrix of `x`'s shape, element type and (for `tch`) device; `x` is not modified.
/// Cost per step for X ∈ ℝ^{r×s} in the wide orientation (r ≤ s): 2r²s (Gram) + 2r³ (A·A, only
/// when c ≠ 0) + 2r²s (B·X) flops.
///
/// Scale safety: defined for every finite `x`, subnormal to near `MAX`. When ‖X‖_F itself
/// overflows `f64` (entries near `f64::MAX`), X is first scaled by 2⁻⁶⁴ (exact; it cannot change
/// the normalized matrix beyond flushing entries 2⁻⁹⁵⁸ times smaller than the largest), and
/// when it is below 1e-290 (so that it may be subnormal and imprecise) by 2⁶⁰⁰ (exact); the
/// factor 1/(c·‖X‖_F) outside [1e-30, 1e30] is applied as two or three factors, each a normal
/// number of the element type, so none overflows or becomes subnormal in `f32`/`bf16`.
///
/// Errors: `x` empty or non-finite ([`InputError::Empty`], [`InputError::NonFinite`], argument
/// `x`); an invalid schedule ([`InputError::InvalidArgument`], [`LinalgError::TooLarge`]), also
/// a normalization factor c for which c or 1/c is not a normal number of `x`'s element type
/// ([`InputError::InvalidArgument`], argument `schedule.normalization`: X/(c·‖X‖_F) would
/// underflow or overflow; f32 and bf16 accept c ∈ [2⁻¹²⁶, 2¹²⁶], f64 c ∈ [2⁻¹⁰²², 2¹⁰²²]);
/// [`LinalgError::Overflow`] (argument `schedule`) when the polynomials of a user schedule
/// drive the iterate beyond the element type's range (never for the schedules of this crate,
/// whose iterates stay below 1.21 in spectral norm).
///
/// ```
/// use kappa_linalg::{newton_schulz, NsSchedule};
/// let x = ndarray::array![[2.0_f64, 0.0, 0.0], [0.0, 0.1, 0.0]];
/// let q = newton_schulz(&x, &NsSchedule::polar_express(10).unwrap()).unwrap();
/// assert!((q[[0, 0]] - 1.0).abs() < 1e-3 && (q[[1, 1]] - 1.0).abs() < 1e-3);
/// ```
pub fn newton_schulz<M: Matrix>(x: &M, schedule: &NsSchedule) -> Result<M> {
    // Arguments in signature order: `x`, then `schedule`.
    let (x, transposed) = prepare(x, schedule)?;
    iterate(x, transposed, schedule)
}

/// [`newton_schulz`] on a matrix it may take over, whose norm is already known: the same
/// result, bit for bit, without the pass that checks the entries, the copy and the pass that
/// sums the squares (a tall matrix is still copied into the wide orientation). Errors: those
/// of [`newton_schulz`] after the input's (a [`Normed`] matrix is finite and non-empty).
///
/// ```
/// use kappa_linalg::{newton_schulz, newton_schulz_normed, Normed, NsSchedule};
/// let x = ndarray::array![[2.0_f64, 1.0, 0.0], [0.0, 0.1, 1.0]];
/// let s = NsSchedule::muon();
/// let q = newton_schulz_normed(Normed::new(x.clone()).unwrap(), &s).unwrap();
/// assert_eq!(q, newton_schulz(&x, &s).unwrap());
/// ```
pub fn newton_schulz_normed<M: Matrix>(x: Normed<M>, schedule: &NsSchedule) -> Result<M> {
    schedule.validate()?;
    check_normalization(&x.matrix, schedule.normalization)?;
    let (m, n) = x.matrix.shape();
    let wide = match m > n {
        true => x.matrix.transposed_copy()?,
        false => x.matrix,
    };
    let (x, transposed) = normalized(wide, x.fro, m > n, schedule.normalization)?;
    iterate(x, transposed, schedule)
}

/// A matrix with its Frobenius norm ‖X‖_F, the value [`Matrix::frobenius_norm`] returns for it
/// (bit for bit), its entries known to be finite: the input of [`newton_schulz_normed`]. Made
/// by [`Normed::new`], or by a backend's conversion that sums the squares in the pass that
/// writes the matrix (`tch_backend::to_bf16_normed`).
#[derive(Debug)]
pub struct Normed<M> {
    matrix: M,
    fro: f64,
}

impl<M: Matrix> Normed<M> {
    /// `matrix` with its norm. Errors: `matrix` empty or with a non-finite entry (argument `x`).
    pub fn new(matrix: M) -> Result<Self> {
        matrix.validate("x")?;
        let fro = matrix.frobenius_norm()?;
        Ok(Self { matrix, fro })
    }

    /// For backends that compute `fro` as [`Matrix::frobenius_norm`] does, in the pass that
    /// wrote `matrix`, and have checked that it is finite (hence every entry is).
    #[cfg(feature = "tch")]
    pub(crate) fn from_parts(matrix: M, fro: f64) -> Self {
        Self { matrix, fro }
    }

    /// ‖X‖_F.
    pub fn fro(&self) -> f64 {
        self.fro
    }

    /// The matrix.
    pub fn matrix(&self) -> &M {
        &self.matrix
    }

    /// The matrix, without its norm.
    pub fn into_matrix(self) -> M {
        self.matrix
    }
}

/// The steps of `schedule` on a prepared input, then [`finish`].
fn iterate<M: Matrix>(mut x: Prepared<M>, transposed: bool, schedule: &NsSchedule) -> Result<M> {
    if let Some(x0) = x.as_mut() {
        for p in &schedule.steps {
            let b = poly_part(&x0.gram()?, p)?;
            *x0 = step_product(x0, b, p.a)?;
        }
    }
    finish(x, transposed)
}

/// a·X + B·X for the polynomial part B of one step, as (B + a·I)·X: one product, and B + a·I
/// costs O(r). Rounding a + B_ii (and, on tensors, a to the arithmetic type first) moves a
/// coefficient by at most 2u·(|a| + |B_ii|), which the product then accumulates within γ_r, the
/// bound of the summed form (docs/linalg.md).
fn step_product<M: Matrix>(x: &M, mut b: M, a: f64) -> Result<M> {
    b.add_to_diagonal(a)?;
    b.matmul(x)
}

/// The input of an iteration: `x` validated (with `schedule`), in the wide orientation (and
/// whether it was transposed), normalized to X/(c·‖X‖_F) with ‖X‖_F summed in `x`'s own
/// orientation — or `Ok(None)` in place of the matrix for the zero matrix, which every odd
/// polynomial keeps at zero. The scaling is documented at [`newton_schulz`].
pub(crate) fn prepare<M: Matrix>(x: &M, schedule: &NsSchedule) -> Result<(Prepared<M>, bool)> {
    x.validate("x")?;
    schedule.validate()?;
    check_normalization(x, schedule.normalization)?;
    let fro = x.frobenius_norm()?;
    let (m, n) = x.shape();
    let wide = match m > n {
        true => x.transposed_copy()?,
        false => x.duplicate()?,
    };
    normalized(wide, fro, m > n, schedule.normalization)
}

/// [`prepare`] from the wide copy `x` of a matrix of norm `fro`: the rescalings of
/// [`newton_schulz`]'s scale safety, then X/(c·‖X‖_F).
fn normalized<M: Matrix>(
    mut x: M,
    mut fro: f64,
    transposed: bool,
    c: f64,
) -> Result<(Prepared<M>, bool)> {
    if fro.is_infinite() {
        // Finite entries whose norm overflows f64: ‖X‖_F ≤ √(mn)·f64::MAX, so 2⁻⁶⁴ (exact)
        // brings it back for any mn < 2¹²⁸.
        x.scale(f64::powi(2.0, -64))?;
        fro = x.frobenius_norm()?;
    } else if fro > 0.0 && fro < 1e-290 {
        // (Only f64 entries get here.) A norm near the subnormal range carries few significant
        // bits; 2⁶⁰⁰ (exact for entries this small) restores full precision before dividing.
        x.scale(f64::powi(2.0, 600))?;
        fro = x.frobenius_norm()?;
    }
    if fro == 0.0 {
        return Ok((Prepared::Zero(x), transposed));
    }
    normalize(&mut x, fro, c)?;
    Ok((Prepared::Normalized(x), transposed))
}

/// What [`prepare`] hands an iteration: the normalized wide matrix, or the zero matrix (kept).
pub(crate) enum Prepared<M> {
    /// X/(c·‖X‖_F) in the wide orientation: the iterate to run the steps on.
    Normalized(M),
    /// The zero matrix (wide orientation), returned as it is.
    Zero(M),
}

impl<M> Prepared<M> {
    /// The iterate, `None` for the zero matrix.
    pub(crate) fn as_mut(&mut self) -> Option<&mut M> {
        match self {
            Prepared::Normalized(x) => Some(x),
            Prepared::Zero(_) => None,
        }
    }
}

/// The polynomial part B = b·A + c·A² of one step on a Gram matrix A (one product when c ≠ 0,
/// none otherwise); the step is then X ← a·X + B·X.
pub(crate) fn poly_part<M: Matrix>(gram: &M, p: &PolyStep) -> Result<M> {
    if p.c != 0.0 {
        // The Gram matrix is symmetric, so A·A = A·Aᵀ: a symmetric rank-k update (`syrk`) where
        // the backend has one.
        gram.symmetric_square_add(p.c, p.b)
    } else {
        let mut b = gram.duplicate()?;
        b.scale(p.b)?;
        Ok(b)
    }
}

/// The iteration's output: [`LinalgError::Overflow`] (argument `schedule`) when a user schedule
/// drove the iterate beyond the element type's range, otherwise the iterate in the input's
/// orientation.
pub(crate) fn finish<M: Matrix>(x: Prepared<M>, transposed: bool) -> Result<M> {
    let (Prepared::Normalized(x) | Prepared::Zero(x)) = x;
    // `validate` is the backends' cheapest all-finite check (one pass, no temporary on `tch`).
    if let Err(LinalgError::Input(InputError::NonFinite { .. })) = x.validate("schedule") {
        return Err(LinalgError::Overflow {
            arg: "schedule",
            reason: "the polynomial steps drove the iterate beyond the element type's range".into(),
        });
    }
    if transposed {
        // A copy rather than a view: a strided result slows every later pass over it (on `tch`
        // an update W − η·O with O a transposed view took several times a contiguous one).
        return x.transposed_copy();
    }
    Ok(x)
}

/// Checks that the normalization factor c of a schedule suits `x`'s element type: c and 1/c
/// must be normal numbers of the type ([`Matrix::normal_range`]). The normalized iterate
/// X/(c·‖X‖_F) has Frobenius norm 1/c, so for a smaller 1/c it is subnormal or zero — in f32,
/// c = 1e300 maps every input to the zero matrix — and for a larger one it overflows. Inside the
/// range its largest entry is ≥ 1/(c·√(mn)), non-zero (f32's subnormals reach 2⁻²³ below the
/// normal range, and mn < 2⁴⁶).
///
/// Errors: [`InputError::InvalidArgument`] (argument `schedule.normalization`).
pub(crate) fn check_normalization<M: Matrix>(x: &M, c: f64) -> Result<()> {
    let (lo, hi) = x.normal_range();
    let normal = |v: f64| (lo..=hi).contains(&v);
    if normal(c) && normal(1.0 / c) {
        return Ok(());
    }
    let why = format!(
        "{c:e}: it and its reciprocal must lie in the element type's normal range \
         [{lo:e}, {hi:e}] (X/(c·‖X‖_F) has norm 1/c, which would under- or overflow)"
    );
    Err(InputError::invalid("schedule.normalization", why).into())
}

/// X ← X/(c·fro) for fro > 0 finite and c > 0 with c, 1/c normal numbers of the element type
/// ([`check_normalization`]): as one factor when it lies in [1e-30, 1e30] (representable in
/// every element type), otherwise as two, 1/√fro and 1/(√fro·c), when the second is a normal
/// number of the element type, and otherwise as three, 1/√fro twice and 1/c. f32 and bf16 reach
/// only ~3.4e38 and are subnormal below ~1.2e-38, so a single factor 1/(c·fro) could overflow
/// or lose bits, and 1/(√fro·c) underflow (fro = 1e38, c = 1e30 gives 1e-49). 1/√fro is always
/// representable: ‖X‖_F lies in [2⁻¹⁴⁹, 2¹²⁸·√(mn)] for f32 entries and [1e-290, 2⁹⁶⁰·√(mn)] for
/// f64 ones after [`prepare`]'s exact rescalings.
fn normalize<M: Matrix>(x: &mut M, fro: f64, c: f64) -> Result<()> {
    let inv = (1.0 / fro) / c;
    if inv.is_finite() && (1e-30..=1e30).contains(&inv) {
        return x.scale(inv);
    }
    let (lo, hi) = x.normal_range();
    let (s1, s2) = (1.0 / fro.sqrt(), 1.0 / (fro.sqrt() * c));
    if (lo..=hi).contains(&s2) {
        x.scale(s1)?;
        x.scale(s2)
    } else {
        x.scale(s1)?;
        x.scale(s1)?;
        x.scale(1.0 / c)
    }
}

/// Muon's orthogonalization: 5 steps of [`MUON_QUINTIC`] after normalizing by ‖X‖_F, on the wide
/// orientation. Scale-invariant; the zero matrix maps to itself. Singular values of the result
/// lie in [`MUON_BAND`] when σ_min(X)/‖X‖_F ≥ [`MUON_BAND_THRESHOLD`].
///
/// Cost: 5·(4r²s + 2r³) flops for X ∈ ℝ^{r×s}, r ≤ s. Errors: as [`newton_schulz`].
///
/// ```
/// use kappa_linalg::{newton_schulz_muon, MUON_BAND};
/// let x = ndarray::array![[3.0, 1.0], [1.0, 2.0], [0.0, 1.0]];
/// let o = newton_schulz_muon(&x).unwrap();
/// let s = kappa_linalg::singular_values(o.view(), Default::default()).unwrap();
/// assert!(s.iter().all(|&v| v >= MUON_BAND.0 && v <= MUON_BAND.1));
/// ```
pub fn newton_schulz_muon<M: Matrix>(x: &M) -> Result<M> {
    newton_schulz(x, &NsSchedule::muon())
}

/// The classical cubic Newton–Schulz iteration, `steps` steps, converging to the polar factor
/// U Vᵀ (for full-rank X). Cost: 4r²s flops per step. Errors: as [`newton_schulz`], and
/// [`LinalgError::TooLarge`] (argument `steps`) beyond [`MAX_NS_STEPS`].
///
/// ```
/// use kappa_linalg::{newton_schulz_cubic, polar_factor, SvdDriver};
/// let x = ndarray::array![[3.0_f64, 1.0], [1.0, 2.0], [0.0, 1.0]];
/// let q = newton_schulz_cubic(&x, 30).unwrap();
/// let p = polar_factor(x.view(), SvdDriver::QrIteration).unwrap();
/// assert!((&q - &p).iter().all(|e| e.abs() < 1e-12));
/// ```
pub fn newton_schulz_cubic<M: Matrix>(x: &M, steps: usize) -> Result<M> {
    x.validate("x")?;
    newton_schulz(x, &NsSchedule::cubic(steps)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poly_step_evaluates_the_odd_polynomial() {
        let p = PolyStep::new(2.0, -3.0, 5.0);
        assert_eq!(p.eval(0.5), 2.0 * 0.5 - 3.0 * 0.125 + 5.0 * 0.03125);
        assert_eq!(CUBIC.eval(1.0), 1.0);
    }

    #[test]
    fn polar_express_schedule_applies_the_safety_factor() {
        let s = NsSchedule::polar_express(10).unwrap();
        assert_eq!(s.steps.len(), 10);
        assert_eq!(s.normalization, 1.01);
        let p0 = POLAR_EXPRESS_COEFFICIENTS[0];
        // (powi is not correctly rounded, so compare to a few ulps.)
        assert!((s.steps[0].a - p0.a / 1.01).abs() <= 1e-14 * p0.a.abs());
        assert!((s.steps[0].b - p0.b / (1.01 * 1.01 * 1.01)).abs() <= 1e-14 * p0.b.abs());
        assert!((s.steps[0].c - p0.c / 1.01f64.powf(5.0)).abs() <= 1e-14 * p0.c.abs());
        assert_eq!(s.steps[7], POLAR_EXPRESS_COEFFICIENTS[7]);
        assert_eq!(s.steps[9], POLAR_EXPRESS_COEFFICIENTS[7]);
        assert_eq!(NsSchedule::muon().steps, vec![MUON_QUINTIC; 5]);
    }

    #[test]
    fn a_normalization_outside_the_element_types_range_is_an_error_not_a_zero_matrix() {
        let x = ndarray::array![[0.6_f64, 0.0], [0.0, 0.8]];
        let sched = NsSchedule::repeated(CUBIC, 3, 1e300).unwrap();
        // f32: X/(1e300·‖X‖_F) is below f32's range; f64 holds it (norm 1e-300).
        match newton_schulz(&x.mapv(|v| v as f32), &sched) {
            Err(LinalgError::Input(InputError::InvalidArgument { arg, .. })) => {
                assert_eq!(arg, "schedule.normalization")
            }
            other => panic!("{other:?}"),
        }
        let y = newton_schulz(&x, &sched).unwrap();
        let want = sched.scalar_map(0.8, 1.0);
        assert!(want > 1e-300 && ((y[[1, 1]] - want) / want).abs() < 1e-15);
        // 1/c below f64's normal range: an error in f64 too.
        let sched = NsSchedule::repeated(CUBIC, 3, 1e308).unwrap();
        assert!(newton_schulz(&x, &sched).is_err());
    }

    #[test]
    fn a_huge_f32_input_with_a_large_normalization_is_not_flushed_to_zero() {
        // ‖X‖_F ≈ 1.1e38 and c = 1e30: X/(c·‖X‖_F) has entries ≈ 1e-30, inside f32's range,
        // while 1/(√‖X‖_F·c) ≈ 1e-49 is not.
        let x = ndarray::array![[1e38_f32, 0.0], [0.0, 5e37]];
        let sched = NsSchedule {
            steps: vec![],
            normalization: 1e30,
        };
        let y = newton_schulz(&x, &sched).unwrap();
        let fro = (1e76_f64 + 25e74).sqrt();
        for (i, v) in [(0, 1e38), (1, 5e37)] {
            let want = v / (1e30 * fro);
            let got = f64::from(y[[i, i]]);
            assert!(
                ((got - want) / want).abs() < 4.0 * f64::from(f32::EPSILON),
                "{got:e}"
            );
        }
    }

    #[test]
    fn one_step_on_a_diagonal_matrix_is_the_scalar_map() {
        let x = ndarray::array![[0.6_f64, 0.0], [0.0, 0.8]];
        let sched = NsSchedule::repeated(MUON_QUINTIC, 1, 1.0).unwrap();
        let y = newton_schulz(&x, &sched).unwrap();
        assert!((y[[0, 0]] - MUON_QUINTIC.eval(0.6)).abs() < 1e-15);
        assert!((y[[1, 1]] - MUON_QUINTIC.eval(0.8)).abs() < 1e-15);
        assert_eq!(y[[0, 1]], 0.0);
    }

    #[test]
    fn the_folded_step_is_the_summed_step_within_its_rounding_bound() {
        // a·X + B·X two ways in f32 — (B + a·I)·X and the product plus a·X — each within
        // γ_{r+2}·(|a|·|X| + |B|·|X|) of the exact value (f64 from the same f32 inputs): r
        // roundings in the product's sums, one for a + B_ii or a·X, one for the final sum.
        let (r, s) = (24, 60);
        let x = ndarray::Array2::from_shape_fn((r, s), |(i, j)| ((i * 7 + j * 13) as f32).sin());
        let x = x.mapv(|v| v / 8.0);
        let b = poly_part(&x.gram().unwrap(), &MUON_QUINTIC).unwrap();
        let a = MUON_QUINTIC.a;
        let folded = step_product(&x, b.clone(), a).unwrap();
        let summed = x.mul_add(1.0, &b, &x, a).unwrap();
        let (x64, b64) = (x.mapv(f64::from), b.mapv(f64::from));
        let exact = &x64 * a + b64.dot(&x64);
        let scale = x64.mapv(f64::abs) * a.abs() + b64.mapv(f64::abs).dot(&x64.mapv(f64::abs));
        let u = f64::from(f32::EPSILON) / 2.0;
        let gamma = (r + 2) as f64 * u / (1.0 - (r + 2) as f64 * u);
        for (name, y) in [("folded", &folded), ("summed", &summed)] {
            for ((y, e), m) in y.iter().zip(&exact).zip(&scale) {
                assert!((f64::from(*y) - e).abs() <= gamma * m, "{name}: {y} vs {e}");
            }
        }
        // The forms differ (a + B_ii rounds where a·X did): the fold is in use, not the sum.
        assert_ne!(folded, summed);
    }
}
