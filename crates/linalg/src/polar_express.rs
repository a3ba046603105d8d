//! The Polar Express schedule generator (Amsel, Persson, Musco, Gower, arXiv 2505.16932): the
//! greedy minimax composition of odd polynomials for given bounds on the normalized singular
//! values, returned as an [`NsSchedule`] with its predicted error after every step.
//!
//! # Math
//!
//! A Newton–Schulz schedule applies p_T ∘ … ∘ p_1 to every normalized singular value x ∈ [ℓ, 1]
//! (see [`newton_schulz`](mod@crate::newton_schulz)), so the spectral-norm distance of the result
//! to the polar factor U·Vᵀ is max over those x of |1 − p_T(…p_1(x))|. Polar Express picks the
//! polynomials one at a time:
//!
//! * **One step.** On an interval [ℓ_t, u_t] ⊂ (0, ∞), p_t is the odd polynomial of degree d
//!   (d = 3: a·x + b·x³; d = 5: a·x + b·x³ + c·x⁵) that minimizes max |1 − p(x)| there. The odd
//!   polynomials of degree 2q + 1 form a Haar space on (0, ∞) (a non-zero one has at most q
//!   positive roots), so the minimizer is unique and is characterized by *equioscillation*:
//!   1 − p reaches its maximum modulus E with alternating signs at q + 2 points. p' is even of
//!   degree 2q, so p has at most q positive critical points; the q + 2 points are therefore
//!   both ends and all q critical points, and the error is largest, 1 − p = +E, at the left end.
//!   For d = 3 this gives a closed form, p = β·p_NS(α·x) with p_NS(x) = (3x − x³)/2,
//!   α = √(3/(u² + ℓu + ℓ²)), β = 4/(2 + ℓu(ℓ + u)α³). For d = 5 a simplified Remez exchange
//!   solves it: for trial points ℓ < q < r < u, the 4×4 linear system
//!   p(ℓ) = 1 − E, p(q) = 1 + E, p(r) = 1 − E, p(u) = 1 + E in (a, b, c, E) gives a polynomial
//!   that equioscillates on the trial points; the new q, r are its critical points,
//!   x² = (−3b ∓ √(9b² − 20ac))/(10c); repeat until E stops changing (|ΔE| ≤ 1e-15). Started
//!   from q = (3ℓ + u)/4, r = (ℓ + 3u)/4 (exact as ℓ → u) it takes a handful of exchanges. For
//!   ℓ/u ≥ 1 − 5·10⁻⁶ the solve is ill-posed and the answer is, to f64 precision, the degree-5
//!   Newton–Schulz step (15x − 10x³ + 3x⁵)/8 scaled to [0, u] (the *limit form*). Between
//!   1 − 10⁻³ and that threshold the 4×4 system's condition number (≈ (1 − ℓ/u)⁻⁴) can keep
//!   the exchange from settling (|ΔE| stays above 1e-15, or a critical point becomes complex);
//!   the limit form is then used too: p_NS(1 − t) = 1 − 2.5t³ + O(t⁴), so its error there is
//!   ≤ 2.5·(1 − ℓ/u)³ ≤ 2.5·10⁻⁹, above the optimum by less than that, and the next step
//!   cubes it.
//! * **Greedy is optimal.** The image of [ℓ_t, u_t] under p_t is [ℓ_{t+1}, u_{t+1}] =
//!   [p_t(ℓ_t), 2 − p_t(ℓ_t)] = [1 − E_t, 1 + E_t]. Choosing p_{t+1} optimally for that
//!   interval, and so on, gives the composition that is optimal among *all* T-fold compositions
//!   (the paper's Theorem 4.1): any other composition maps [ℓ, 1] onto an interval with a smaller
//!   ratio lower/upper end, and the best error of one more step depends only on that ratio. The
//!   error after T steps is 1 − ℓ_{T+1}.
//!
//! # The practical modifications (the paper's §4.4 and its published code)
//!
//! * **Cushioning.** Each p_t is solved on [max(ℓ_t, κ·u_t), u_t] instead of [ℓ_t, u_t], with
//!   κ = [`POLAR_EXPRESS_CUSHION`] ≈ 0.024 (the constant of the paper's code; its pseudocode
//!   writes u_t/10). Without it the first polynomials for small ℓ have huge coefficients and
//!   push some singular values near u_t down to ℓ_{t+1} while raising small ones by a far larger
//!   factor: p_t(σ)/σ ≪ max p_t/σ_max, and in low precision the rounding that the large
//!   singular directions leave in the small ones is then amplified. The cushioned p_t is then
//!   **recentred**: multiplied by 2/(p_t(ℓ_t) + max p_t) so that its image of the whole
//!   [ℓ_t, u_t] is again [ℓ_{t+1}, 2 − ℓ_{t+1}] — p is increasing on [0, κ·u_t], so p_t(ℓ_t) is
//!   still the minimum; for d = 5 the maximum 1 + E is p_t(u_t), for d = 3 it is p_t at the
//!   interior critical point √(−a/(3b)).
//! * **Safety factor s** (1.01 in the paper, 1.02 in modded-nanogpt). Rounding can leave a
//!   singular value slightly above u_t, and a polynomial can amplify that excess step after
//!   step. The input is normalized by s·‖X‖_F, and steps are replaced by p̃_t(x) = p_t(x/s),
//!   i.e. (a/s, b/s³, c/s⁵). [`SafetyRule`] says which steps, and whether the recursion sees
//!   them:
//!   - [`SafetyRule::InDesign`] (the default; the rule of the public generator, whose output
//!     modded-nanogpt runs): the scaled step drives the recursion, ℓ_{t+1} = p̃_t(ℓ_t) =
//!     p_t(ℓ_t/s), u_{t+1} = 2 − ℓ_{t+1}, so every polynomial is designed for the lower end the
//!     scaled steps before it actually produce. p_t is increasing on [0, ℓ_t] and
//!     max p_t = 1 + E_t, so p̃_t's image of [ℓ_t, u_t] lies in [ℓ_{t+1}, 1 + E_t] ⊂
//!     [ℓ_{t+1}, u_{t+1}] (the upper end is not tight). Every step is the optimal polynomial of
//!     its interval — from ℓ_t/u_t ≥ 1 − 5·10⁻⁶ on the limit form, the Newton–Schulz step
//!     scaled to [0, u_t] — and every step but the last is scaled. The last step is p_T itself:
//!     its image of [ℓ_T, u_T] is [1 − E_T, 1 + E_T], centred on 1. With s > 1 the scaled steps
//!     keep the intervals from converging: near 1 a step is close to the Newton–Schulz one,
//!     p_NS(1 − t) = 1 − 2.5t³ + O(t⁴), so it takes [1 − δ, 1 + δ] to about
//!     1 ± 2.5·(2δ + s − 1)³, whose fixed point is δ ≈ 2.5·(s − 1)³ (2.4·10⁻⁶ for s = 1.01,
//!     where the steps are the limit form); the unscaled last step then maps 1 ± δ to within
//!     about 2.5·(2δ)³ of 1.
//!   - [`SafetyRule::AfterDesign`]: the recursion runs on the unscaled p_t (ℓ_{t+1} =
//!     p_t(ℓ_t)), with the converged tail below, and afterwards every step before the tail, the
//!     last one included, is replaced by p̃_t. This is how the paper's code runs its table (1.01
//!     applied to all entries but the 8th, which is the tail).
//!
//!   For s > 1 the rules differ from the second step on: at ℓ = 10⁻³, 5 steps, s = 1.02,
//!   cushion 0.02 the default rule gives modded-nanogpt's table and maps σ/‖X‖_F ∈ [ℓ, 1] into
//!   [0.847, 1.141]; `AfterDesign` gives coefficients up to 10 % away (step 5) and
//!   [0.807, 1.121]. For s = 1 they differ only in the converged tail, by the factors
//!   u_t^{−1}, u_t^{−3}, u_t^{−5} (≤ 5(u_t − 1) ≤ 1.3·10⁻⁵ relative). The predicted bands
//!   ([`PolarExpressDesign::bands`]) are those of the schedule actually run, under either rule.
//! * **The converged tail** ([`SafetyRule::AfterDesign`]). Once the design interval is so narrow
//!   that the optimal polynomial is the Newton–Schulz step to f64 precision (ℓ_t/u_t ≥
//!   1 − 5·10⁻⁶, the threshold of the paper's solver), p_t is taken to be the plain
//!   Newton–Schulz step of degree d, unscaled and not recentred (they would change it by
//!   ≤ 5(1 − ℓ_t/u_t) relative), whose fixed point 1 is superattracting, and it is used
//!   *without* the safety factor (which would move the fixed point to ≈ 1 − 2·10⁻⁶). This is
//!   the paper's table's rule: its 8th and last entry is exactly (15/8, −10/8, 3/8), repeated
//!   for later steps and the only one left unscaled, although the greedy recursion gives for
//!   that step (ℓ_8/u_8 = 1 − 2.1·10⁻⁹) the step scaled to [1 − 1.04·10⁻⁹, 1 + 1.04·10⁻⁹],
//!   i.e. (15/8, −10/8, 3/8)·(1 − 1.04·10⁻⁹·(1, 3, 5)) — "numerically equal" in the paper's
//!   words. [`SafetyRule::InDesign`] uses that scaled step, as the public generator does.
//!
//! The published table [`POLAR_EXPRESS_COEFFICIENTS`](crate::POLAR_EXPRESS_COEFFICIENTS) is this
//! generator's [`PolarExpressDesign::polynomials`] for ℓ = 10⁻³, d = 5, 8 steps (and its schedule
//! for s = 1: exactly so under `AfterDesign`, to the tail's 5.2·10⁻⁹ under `InDesign`), to the
//! rounding of the Remez solves (tested, with a tolerance derived from the condition numbers of
//! the 4×4 systems); [`NsSchedule::polar_express`] is its
//! schedule with s = 1.01 under [`SafetyRule::AfterDesign`] ([`PolarExpressSpec::paper`]), and
//! modded-nanogpt's 5-step table the schedule of `PolarExpressSpec::new(1e-3, 5, 5, 1.02)` with
//! cushion 0.02.
//!
//! Cost: each step of degree 5 is a few 4×4 LAPACK solves (`dgesv`); 10 steps take well under a
//! millisecond.

use ndarray::{arr2, Array1};
use ndarray_linalg::Solve;

use crate::error::{lapack_err, LinalgError, Result};
use crate::input::InputError;
use crate::newton_schulz::{NsSchedule, PolyStep, MAX_NS_STEPS};

/// The cushion κ of the published Polar Express code: each polynomial is solved on
/// [max(ℓ_t, κ·u_t), u_t] (module docs).
pub const POLAR_EXPRESS_CUSHION: f64 = 0.02407327424182761;

/// ℓ/u from which the optimal polynomial on [ℓ, u] is, to f64 precision, the Newton–Schulz step
/// scaled to [0, u] (the paper's threshold 1 − 5·10⁻⁶), and the converged tail begins.
const CONVERGED_RATIO: f64 = 1.0 - 5e-6;

/// ℓ/u above which a Remez exchange that does not settle falls back to the limit form (module
/// docs): the optimal error there is below the limit form's 2.5·(1 − ℓ/u)³ ≤ 2.5·10⁻⁹.
const NARROW_RATIO: f64 = 1.0 - 1e-3;

/// The most Remez exchanges per step before [`LinalgError::NoConvergence`] (a handful suffice).
const REMEZ_MAX_EXCHANGES: usize = 100;

/// How the safety factor s enters a generated schedule (module docs, "Safety factor"). For
/// s = 1 the rules differ only in the converged tail, by ≤ 5(u_t − 1) relative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SafetyRule {
    /// The rule of the public generator (the Polar Express repository's `optimal_composition`
    /// with a safety factor; modded-nanogpt's table is its output): the scaled step
    /// p̃_t(x) = p_t(x/s) drives the recursion, ℓ_{t+1} = p̃_t(ℓ_t), u_{t+1} = 2 − ℓ_{t+1}; every
    /// p_t is the optimal polynomial of its interval (the Newton–Schulz step scaled to [0, u_t]
    /// once ℓ_t/u_t ≥ 1 − 5·10⁻⁶), and the last step is p_T itself, unscaled.
    #[default]
    InDesign,
    /// The recursion runs on the unscaled p_t (ℓ_{t+1} = p_t(ℓ_t)) and ends in the converged
    /// tail, the plain Newton–Schulz step, once ℓ_t/u_t ≥ 1 − 5·10⁻⁶; afterwards every step
    /// before the tail, the last one included, becomes p_t(x/s). With ℓ = 10⁻³ and s = 1.01
    /// this is the paper's coefficient table with its run-time factor
    /// ([`NsSchedule::polar_express`]).
    AfterDesign,
}

/// The inputs of the generator: bounds, degree, steps, safety factor and its rule, cushion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolarExpressSpec {
    /// ℓ ∈ (0, 1): the schedule is designed for σ/‖X‖_F ∈ [ℓ, 1].
    pub lower: f64,
    /// The odd degree d of every polynomial: 3 or 5.
    pub degree: usize,
    /// The number of steps T, 1 ≤ T ≤ [`MAX_NS_STEPS`].
    pub steps: usize,
    /// The safety factor s ≥ 1 (module docs); 1 turns it off.
    pub safety: f64,
    /// How s enters the schedule ([`SafetyRule::InDesign`] unless set otherwise).
    pub rule: SafetyRule,
    /// The cushion κ ∈ [0, 1) (module docs); 0 turns it off.
    pub cushion: f64,
}

/// The greedy recursion's output: the polynomials p_t, the steps run, the design intervals.
type Recursion = (Vec<PolyStep>, Vec<PolyStep>, Vec<(f64, f64)>);

/// What the generator returns: the schedule to run and what it is predicted to do.
#[derive(Debug, Clone, PartialEq)]
pub struct PolarExpressDesign {
    /// The schedule: steps p_t(x/s) or p_t as [`SafetyRule`] says, normalization s.
    pub schedule: NsSchedule,
    /// The optimal (cushioned, recentred) polynomials p_t before the safety factor.
    pub polynomials: Vec<PolyStep>,
    /// [ℓ_t, u_t], t = 1..=T + 1: the interval step t was designed for (in the converged tail:
    /// the image of the previous one), and last the interval the recursion reaches after step
    /// T, [ℓ_{T+1}, u_{T+1}]. Without a safety factor that is the image of [ℓ, 1] under the
    /// whole composition, whose error is max(1 − ℓ_{T+1}, u_{T+1} − 1).
    pub design_intervals: Vec<(f64, f64)>,
    /// After each step k of [`schedule`](Self::schedule) (k = 1..=T), the exact image
    /// [lo_k, hi_k] of all σ/‖X‖_F ∈ [ℓ, 1] under the first k steps (f64, computed from the
    /// critical points of each polynomial, so rounding-level accurate).
    pub bands: Vec<(f64, f64)>,
}

impl PolarExpressDesign {
    /// e_k = max(1 − lo_k, hi_k − 1) after each step: every σ/‖X‖_F ∈ [ℓ, 1] ends within 1 ± e_k
    /// after k steps (in exact arithmetic).
    pub fn errors(&self) -> Vec<f64> {
        self.bands
            .iter()
            .map(|&(lo, hi)| (1.0 - lo).max(hi - 1.0))
            .collect()
    }

    /// The predicted error after the last step, e_T (see [`PolarExpressDesign::errors`]).
    pub fn error(&self) -> f64 {
        self.errors().last().copied().unwrap_or(f64::INFINITY)
    }
}

impl PolarExpressSpec {
    /// A specification with the paper's cushion [`POLAR_EXPRESS_CUSHION`] and the public
    /// generator's [`SafetyRule::InDesign`].
    pub const fn new(lower: f64, degree: usize, steps: usize, safety: f64) -> Self {
        Self {
            lower,
            degree,
            steps,
            safety,
            rule: SafetyRule::InDesign,
            cushion: POLAR_EXPRESS_CUSHION,
        }
    }

    /// The paper's run-time schedule: ℓ = 10⁻³, d = 5, s = 1.01, the paper's cushion,
    /// [`SafetyRule::AfterDesign`] (its table with the factor applied afterwards; equal to
    /// [`NsSchedule::polar_express`] to the rounding of the Remez solves).
    pub const fn paper(steps: usize) -> Self {
        Self::new(1e-3, 5, steps, crate::POLAR_EXPRESS_SAFETY).with_rule(SafetyRule::AfterDesign)
    }

    /// This specification with the safety rule `rule`.
    pub const fn with_rule(self, rule: SafetyRule) -> Self {
        Self { rule, ..self }
    }

    /// This specification with the cushion κ = `cushion`.
    pub const fn with_cushion(self, cushion: f64) -> Self {
        Self { cushion, ..self }
    }

    /// Checks every field (in declaration order).
    ///
    /// Errors: [`InputError::InvalidArgument`] (arguments `lower`, `degree`, `steps`, `safety`,
    /// `cushion`) for ℓ ∉ (0, 1), d ∉ {3, 5}, T = 0, s < 1 or non-finite, κ ∉ [0, 1);
    /// [`LinalgError::TooLarge`] (argument `steps`) for T > [`MAX_NS_STEPS`].
    pub fn validate(&self) -> Result<()> {
        if !(self.lower.is_finite() && self.lower > 0.0 && self.lower < 1.0) {
            let why = format!("must be in (0, 1), found {}", self.lower);
            return Err(InputError::invalid("lower", why).into());
        }
        if self.degree != 3 && self.degree != 5 {
            let why = format!("must be 3 or 5, found {}", self.degree);
            return Err(InputError::invalid("degree", why).into());
        }
        if self.steps == 0 {
            return Err(InputError::invalid("steps", "must be ≥ 1").into());
        }
        if self.steps > MAX_NS_STEPS {
            return Err(LinalgError::TooLarge {
                arg: "steps",
                reason: format!("{} steps, more than MAX_NS_STEPS = 2^16", self.steps),
            });
        }
        if !(self.safety.is_finite() && self.safety >= 1.0) {
            let why = format!("must be finite and ≥ 1, found {}", self.safety);
            return Err(InputError::invalid("safety", why).into());
        }
        if !(self.cushion.is_finite() && (0.0..1.0).contains(&self.cushion)) {
            let why = format!("must be in [0, 1), found {}", self.cushion);
            return Err(InputError::invalid("cushion", why).into());
        }
        Ok(())
    }

    /// Runs the generator (module docs).
    ///
    /// Errors: as [`PolarExpressSpec::validate`]; [`LinalgError::NoConvergence`] (argument
    /// `lower`) if a Remez solve does not settle in 100 exchanges and [`LinalgError::Lapack`]
    /// if its 4×4 solve fails (neither happens with a cushion ≥ 10⁻³).
    ///
    /// ```
    /// use kappa_linalg::PolarExpressSpec;
    /// let d = PolarExpressSpec::new(1e-3, 5, 10, 1.01).design()?;
    /// assert_eq!(d.schedule.steps.len(), 10);
    /// // After 10 steps every σ/‖X‖_F ∈ [1e-3, 1] is within 1 ± 1e-6.
    /// assert!(d.error() < 1e-6);
    /// # Ok::<(), kappa_linalg::LinalgError>(())
    /// ```
    pub fn design(&self) -> Result<PolarExpressDesign> {
        self.validate()?;
        let (polynomials, steps, design_intervals) = self.recursion()?;
        let schedule = NsSchedule {
            steps,
            normalization: self.safety,
        };
        let bands = bands(&schedule, self.lower);
        Ok(PolarExpressDesign {
            schedule,
            polynomials,
            design_intervals,
            bands,
        })
    }

    /// The greedy recursion: the polynomials p_t, the steps the schedule runs (p_t or
    /// p_t(x/s), [`SafetyRule`]) and the intervals [ℓ_t, u_t] (T + 1 of them).
    fn recursion(&self) -> Result<Recursion> {
        let (mut l, mut u) = (self.lower, 1.0f64);
        let mut polys = Vec::with_capacity(self.steps);
        let mut steps = Vec::with_capacity(self.steps);
        let mut intervals = vec![(l, u)];
        for t in 0..self.steps {
            if self.rule == SafetyRule::AfterDesign && l / u >= CONVERGED_RATIO {
                // The converged tail: the plain Newton–Schulz step, unscaled (module docs).
                let p = newton_schulz_step(self.degree);
                (l, u) = odd_polynomial_image(&p, l, u);
                polys.push(p);
                steps.push(p);
            } else {
                let p = self.optimal(l.max(self.cushion * u), u)?;
                // Recentre over the whole [ℓ_t, u_t]: min p(ℓ_t), max 1 + E (module docs).
                let rho = 2.0 / (monomial(&p, l) + self.top(&p, u));
                let p = PolyStep::new(p.a * rho, p.b * rho, p.c * rho);
                let step = match self.rule {
                    SafetyRule::InDesign if t + 1 == self.steps => p,
                    _ => scaled(&p, self.safety),
                };
                let driver = match self.rule {
                    SafetyRule::InDesign => &step,
                    SafetyRule::AfterDesign => &p,
                };
                l = monomial(driver, l);
                u = 2.0 - l;
                polys.push(p);
                steps.push(step);
            }
            intervals.push((l, u));
        }
        Ok((polys, steps, intervals))
    }

    /// The optimal odd polynomial of `self.degree` on [l, u].
    fn optimal(&self, l: f64, u: f64) -> Result<PolyStep> {
        if self.degree == 3 {
            Ok(optimal_cubic(l, u))
        } else {
            optimal_quintic(l, u)
        }
    }

    /// max p = 1 + E on the design interval: p(u) for d = 5, p at the critical point for d = 3.
    fn top(&self, p: &PolyStep, u: f64) -> f64 {
        if self.degree == 5 {
            monomial(p, u)
        } else {
            monomial(p, (-p.a / (3.0 * p.b)).sqrt())
        }
    }
}

/// Runs the generator with the paper's cushion: `PolarExpressSpec::new(lower, degree, steps,
/// safety).design()`. Errors: as [`PolarExpressSpec::design`].
pub fn polar_express_schedule(
    lower: f64,
    degree: usize,
    steps: usize,
    safety: f64,
) -> Result<PolarExpressDesign> {
    PolarExpressSpec::new(lower, degree, steps, safety).design()
}

/// x ↦ p(x/s): (a/s, b/s³, c/s⁵), the powers by `powf` as the reference code's `**`.
fn scaled(p: &PolyStep, s: f64) -> PolyStep {
    PolyStep::new(p.a / s, p.b / s.powf(3.0), p.c / s.powf(5.0))
}

/// a·x + b·x³ + c·x⁵ summed as monomials, the order of the paper's code (the recursion's bounds
/// are computed exactly as there; [`PolyStep::eval`] uses Horner's rule).
fn monomial(p: &PolyStep, x: f64) -> f64 {
    p.a * x + p.b * x.powf(3.0) + p.c * x.powf(5.0)
}

/// The Newton–Schulz step of degree d: (3x − x³)/2 or (15x − 10x³ + 3x⁵)/8.
fn newton_schulz_step(degree: usize) -> PolyStep {
    if degree == 3 {
        PolyStep::new(1.5, -0.5, 0.0)
    } else {
        PolyStep::new(15.0 / 8.0, -10.0 / 8.0, 3.0 / 8.0)
    }
}

/// The optimal odd cubic on [l, u], in closed form (module docs).
fn optimal_cubic(l: f64, u: f64) -> PolyStep {
    let alpha = (3.0 / (u * u + l * u + l * l)).sqrt();
    let beta = 4.0 / (2.0 + l * u * (l + u) * alpha.powi(3));
    PolyStep::new(1.5 * alpha * beta, -0.5 * alpha.powi(3) * beta, 0.0)
}

/// The optimal odd quintic on [l, u] by the simplified Remez exchange (module docs).
fn optimal_quintic(l: f64, u: f64) -> Result<PolyStep> {
    let limit = PolyStep::new(
        (15.0 / 8.0) / u,
        (-10.0 / 8.0) / u.powf(3.0),
        (3.0 / 8.0) / u.powf(5.0),
    );
    if l / u >= CONVERGED_RATIO {
        return Ok(limit);
    }
    let (mut q, mut r) = ((3.0 * l + u) / 4.0, (l + 3.0 * u) / 4.0);
    let mut old_e = f64::INFINITY;
    for _ in 0..REMEZ_MAX_EXCHANGES {
        let row = |x: f64, sign: f64| [x, x.powf(3.0), x.powf(5.0), sign];
        let (rl, rq, rr, ru) = (row(l, 1.0), row(q, -1.0), row(r, 1.0), row(u, -1.0));
        let lhs = arr2(&[rl, rq, rr, ru]);
        let sol: Array1<f64> = lhs
            .solve_into(Array1::ones(4))
            .map_err(lapack_err("lower", "dgesv"))?;
        let (a, b, c, e) = (sol[0], sol[1], sol[2], sol[3]);
        if (old_e - e).abs() <= 1e-15 {
            return Ok(PolyStep::new(a, b, c));
        }
        old_e = e;
        let disc = (9.0 * b * b - 20.0 * a * c).sqrt();
        (q, r) = (
            ((-3.0 * b - disc) / (10.0 * c)).sqrt(),
            ((-3.0 * b + disc) / (10.0 * c)).sqrt(),
        );
        if !(q.is_finite() && r.is_finite() && e.is_finite()) {
            break;
        }
    }
    if l / u >= NARROW_RATIO {
        // The 4×4 system is numerically singular here (its condition number grows like
        // (1 − l/u)⁻⁴); the limit form errs by ≤ 2.5(1 − l/u)³ ≤ 2.5e-9 (module docs).
        return Ok(limit);
    }
    Err(LinalgError::NoConvergence {
        arg: "lower",
        routine: "Polar Express Remez exchange",
        reason: format!("no equioscillating quintic found on [{l:e}, {u:e}]"),
    })
}

/// The exact image [min, max] of [lo, hi] ⊂ [0, ∞) under an odd polynomial: the values at both
/// ends and at the critical points inside (x² a root of a + 3b·y + 5c·y² = 0).
pub fn odd_polynomial_image(p: &PolyStep, lo: f64, hi: f64) -> (f64, f64) {
    let mut vals = vec![p.eval(lo), p.eval(hi)];
    let ys: Vec<f64> = if p.c == 0.0 {
        if p.b == 0.0 {
            vec![]
        } else {
            vec![-p.a / (3.0 * p.b)]
        }
    } else {
        let disc = 9.0 * p.b * p.b - 20.0 * p.a * p.c;
        if disc < 0.0 {
            vec![]
        } else {
            let d = disc.sqrt();
            vec![
                (-3.0 * p.b - d) / (10.0 * p.c),
                (-3.0 * p.b + d) / (10.0 * p.c),
            ]
        }
    };
    for y in ys {
        let x = y.sqrt();
        if y > 0.0 && x > lo && x < hi {
            vals.push(p.eval(x));
        }
    }
    vals.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        })
}

/// The images of σ/‖X‖_F ∈ [ℓ, 1] (x = σ/(s‖X‖_F) ∈ [ℓ/s, 1/s]) after each step of `schedule`.
fn bands(schedule: &NsSchedule, lower: f64) -> Vec<(f64, f64)> {
    let c = schedule.normalization;
    let mut band = (lower / c, 1.0 / c);
    schedule
        .steps
        .iter()
        .map(|p| {
            band = odd_polynomial_image(p, band.0.max(0.0), band.1);
            band
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cubic_closed_form_equioscillates() {
        let (l, u) = (0.1, 1.0);
        let p = optimal_cubic(l, u);
        let x = (-p.a / (3.0 * p.b)).sqrt();
        let e = 1.0 - p.eval(l);
        assert!((p.eval(u) - (1.0 - e)).abs() < 1e-14);
        assert!((p.eval(x) - (1.0 + e)).abs() < 1e-14);
    }

    #[test]
    fn the_image_of_an_odd_polynomial_includes_its_critical_values() {
        let p = PolyStep::new(1.5, -0.5, 0.0);
        assert_eq!(odd_polynomial_image(&p, 0.0, 1.5), (0.0, 1.0));
        let (lo, hi) = odd_polynomial_image(&crate::MUON_QUINTIC, 0.1, 1.0);
        assert!(lo <= crate::MUON_QUINTIC.eval(1.0) && hi > 1.1);
    }
}
