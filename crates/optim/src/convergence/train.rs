//! The structure-aware gradient descent (docs/convergence.md, §The algorithm) and its baselines, behind one [`Descent`].
//!
//! Objective Q = L + R, where L is the population loss or the empirical L̂_n ([`Objective`]) and
//! R is the balancing regularizer in the Σ̂ geometry (docs/convergence.md, §Regularizer; a reconstruction):
//!
//! ```text
//! C = AᵀA − BᵀΣ̂B,   D = Σ̂^{1/2} C Σ̂^{1/2} = UᵀU − VVᵀ,   R = (λ/4)‖D‖_F²
//! ∇_A R = λ A Σ̂CΣ̂,   ∇_B R = −λ Σ̂BΣ̂CΣ̂          (so ∇_U R = λUD, ∇_V R = −λDV)
//! ```
//!
//! The Σ̂-preconditioner (docs/convergence.md, §Preconditioner; a reconstruction of "data-dependent preconditioner") is
//! P^{-1}: (G_A, G_B) ↦ (G_A Σ̂^{-1}, Σ̂^{-1} G_B Σ̂^{-1}), which turns the step into plain GD in
//! the whitened coordinates (U, V). One step of the algorithm is therefore
//!
//! ```text
//! A ← A − η [∇_A L Σ̂^{-1}        + λ A Σ̂ C]
//! B ← B − η [Σ̂^{-1} ∇_B L Σ̂^{-1} − λ B Σ̂ C]
//! ```
//!
//! followed by the renormalization ([`Renormalization`]). Without the preconditioner the step
//! uses the Euclidean gradients (∇_A L + λAΣ̂CΣ̂, ∇_B L − λΣ̂BΣ̂CΣ̂). Adam ([`UpdateRule::Adam`])
//! applies to the same direction: it is the crate's [`AdamW`](crate::AdamW) without weight
//! decay, one state per matrix. Adam acts element by element with one step count for all, so
//! one state for A and one for B is the same as one state for the pair (A, B).
//!
//! Step size ([`StepSize::Relative`]): η = c / s with the smoothness scale s = d̂₁ = σ_max(T̂)
//! with the preconditioner (the whitened problem ½‖UV − T̂‖² has curvature ≈ d̂₁ near its
//! minimisers), and s = d̂₁·max(λ_max(Σ̂), λ_max(Σ̂)²) without it (the map B ↦ AΣBᵀΣ^{1/2} has
//! norm up to ‖U‖·λ_max(Σ)). For Adam, η = c.
//!
//! Every step is checked: a non-finite loss or parameter, or a loss above `divergence_factor`
//! times the first one, is [`OptimError::Diverged`] with the step at which it happened.

use kappa_linalg::input::{check_positive, InputError};
use kappa_linalg::{singular_values, SvdDriver};
use ndarray::{Array2, ArrayView2};
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::attention::{finite_context_excess, EmpiricalProblem};
use super::data::{check_size, gaussian};
use super::moments::Moments;
use super::population::PopulationProblem;
use super::rate::RateTracker;
use super::LossGrad;
use crate::adamw::{AdamW, AdamWConfig, AdamWState};
use crate::error::{check_matrix, check_range, overflow_as, OptimError, Result};

/// What keeps the softmax scale bounded (docs/convergence.md, §Renormalization: two reconstructions).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Renormalization {
    /// No renormalization.
    None,
    /// After every step, rescale so that ‖U‖_F = ‖V‖_F: c = √(‖V‖_F/‖U‖_F), A ← cA, B ← B/c.
    /// Keeps AΣ̂Bᵀ (and AΣBᵀ) exactly.
    Balance,
    /// After every step, if s = ‖Σ̂^{1/2}BΣ̂^{1/2}‖₂ > `max_scale`, B ← B·max_scale/s and
    /// A ← A·s/max_scale (product kept exactly).
    ClipSoftmaxScale {
        /// The largest allowed ‖V‖₂ (> 0).
        max_scale: f64,
    },
}

/// How η is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StepSize {
    /// η = c / s, s the smoothness scale of the module docs (η = c for Adam).
    Relative {
        /// The factor c > 0.
        c: f64,
    },
    /// η as given (> 0).
    Absolute {
        /// The step size.
        eta: f64,
    },
}

/// The update applied to the (preconditioned or Euclidean) gradient direction g.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum UpdateRule {
    /// θ ← θ − η g.
    Gd,
    /// Adam with bias correction: m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g²,
    /// θ ← θ − η m̂/(√v̂ + ε) ([`AdamW`](crate::AdamW) with weight decay 0).
    Adam {
        /// β₁ ∈ [0, 1).
        beta1: f64,
        /// β₂ ∈ [0, 1).
        beta2: f64,
        /// ε > 0.
        epsilon: f64,
    },
}

/// Every choice of the algorithm, so that the paper's algorithm and its baselines and ablations
/// run through one [`Descent`]. Reconstructed defaults are marked in [`Settings::algorithm`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Precondition with Σ̂ (the whitened geometry) or use Euclidean gradients in (A, B).
    pub preconditioner: bool,
    /// λ ≥ 0, the weight of the balancing regularizer (0 turns it off).
    pub lambda: f64,
    /// The renormalization after each step.
    pub renormalization: Renormalization,
    /// The step size rule.
    pub step: StepSize,
    /// GD or Adam.
    pub update: UpdateRule,
    /// A loss above this factor times the first loss counts as divergence (> 1).
    pub divergence_factor: f64,
    /// Steps in the running fit of μ (≥ 2).
    pub rate_window: usize,
}

impl Settings {
    /// The reconstructed algorithm: Σ̂-preconditioner on, λ = 0.5, [`Renormalization::Balance`],
    /// η = 0.2/σ_max(T̂), GD. Each value is our choice (docs/convergence.md, §Reconstruction choices): the
    /// paper's λ, step rule and renormalization are unknown.
    pub fn algorithm() -> Self {
        Self {
            preconditioner: true,
            lambda: 0.5,
            renormalization: Renormalization::Balance,
            step: StepSize::Relative { c: 0.2 },
            update: UpdateRule::Gd,
            divergence_factor: 1e6,
            rate_window: 20,
        }
    }

    /// Plain gradient descent on L in (A, B): no preconditioner, no regularizer, no
    /// renormalization, η = 0.2/s.
    pub fn plain_gd() -> Self {
        Self {
            preconditioner: false,
            lambda: 0.0,
            renormalization: Renormalization::None,
            ..Self::algorithm()
        }
    }

    /// Adam on L in (A, B) with learning rate `lr` and the usual β₁ = 0.9, β₂ = 0.999, ε = 1e-8.
    pub fn adam(lr: f64) -> Self {
        Self {
            step: StepSize::Absolute { eta: lr },
            update: UpdateRule::Adam {
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-8,
            },
            ..Self::plain_gd()
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        check_range("lambda", self.lambda, 0.0, 1e12)?;
        match self.step {
            StepSize::Relative { c } => check_positive("step.c", c)?,
            StepSize::Absolute { eta } => check_positive("step.eta", eta)?,
        }
        if let Renormalization::ClipSoftmaxScale { max_scale } = self.renormalization {
            check_positive("renormalization.max_scale", max_scale)?;
        }
        if let UpdateRule::Adam {
            beta1,
            beta2,
            epsilon,
        } = self.update
        {
            check_range("update.beta1", beta1, 0.0, 1.0 - f64::EPSILON)?;
            check_range("update.beta2", beta2, 0.0, 1.0 - f64::EPSILON)?;
            check_positive("update.epsilon", epsilon)?;
        }
        if !(self.divergence_factor.is_finite() && self.divergence_factor > 1.0) {
            return Err(InputError::invalid(
                "divergence_factor",
                format!("must be finite and > 1, found {}", self.divergence_factor),
            )
            .into());
        }
        if self.rate_window < 2 {
            return Err(InputError::invalid("rate_window", "must be at least 2").into());
        }
        Ok(())
    }
}

/// What the trainer minimises (plus the regularizer).
#[derive(Clone, Debug)]
pub enum Objective {
    /// The closed-form population loss (n = ∞).
    Population(PopulationProblem),
    /// The empirical loss L̂_n of the finite-context layer.
    Empirical(EmpiricalProblem),
}

impl Objective {
    fn dims(&self) -> (usize, usize) {
        match self {
            Objective::Population(p) => (p.outputs(), p.dim()),
            Objective::Empirical(e) => (e.outputs(), e.dim()),
        }
    }

    /// The loss and its gradients at (A, B).
    pub fn loss_grad(&self, a: ArrayView2<'_, f64>, b: ArrayView2<'_, f64>) -> Result<LossGrad> {
        match self {
            Objective::Population(p) => p.loss_grad(a, b),
            Objective::Empirical(e) => e.loss_grad(a, b),
        }
    }
}

/// Ground truth for logging (synthetic runs only): the true population objective and, optionally,
/// a probe of the finite-context layer's test risk.
#[derive(Clone, Debug)]
pub struct Truth {
    /// The true (Σ, M, σ): gives E(A, B) at every step.
    pub population: PopulationProblem,
    /// Test queries attending over a context (the training covariates).
    pub probe: Option<Probe>,
}

/// The finite-context excess risk probe: fresh queries attending over a fixed context.
#[derive(Clone, Debug)]
pub struct Probe {
    /// The context (d×n_k), usually all training covariates.
    pub context: Array2<f64>,
    /// Test queries (d×n_test), drawn from N(0, Σ).
    pub queries: Array2<f64>,
    /// Evaluate every `every` steps (and at step 0); ≥ 1.
    pub every: usize,
}

/// What one step records, about the parameters θ_t *before* update t → t+1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// t, the number of updates applied so far.
    pub step: usize,
    /// The data loss L(θ_t) or L̂_n(θ_t).
    pub loss: f64,
    /// R(θ_t) = (λ/4)‖D‖_F².
    pub regularizer: f64,
    /// ‖∇Q(θ_t)‖ in whitened coordinates: √(‖∇_AQ Σ̂^{-1/2}‖_F² + ‖Σ̂^{-1/2}∇_BQ Σ̂^{-1/2}‖_F²),
    /// the same metric for every method.
    pub grad_norm: f64,
    /// E(θ_t), the population excess risk of the limit predictor (with a [`Truth`]).
    pub excess: Option<f64>,
    /// The finite-context excess risk on the probe (with a [`Probe`], every `every` steps).
    pub finite_excess: Option<f64>,
    /// The balance gap ‖D‖_F = ‖UᵀU − VVᵀ‖_F.
    pub balance_gap: f64,
    /// ‖A‖_F.
    pub a_norm: f64,
    /// ‖B‖_F.
    pub b_norm: f64,
    /// The largest softmax weight over all training queries (empirical objectives only).
    pub max_weight: Option<f64>,
    /// The running fit of the per-step contraction μ over the last `rate_window` steps, of E_t
    /// for population objectives with a truth, else of ‖∇Q‖² (both scale like dist²).
    pub rate: Option<f64>,
}

/// Adam on (A, B): the crate's AdamW (no weight decay) with one state per matrix.
struct AdamState {
    adam: AdamW,
    a: AdamWState<Array2<f64>>,
    b: AdamWState<Array2<f64>>,
}

/// Runs one of the methods (algorithm, baseline or ablation) step by step.
///
/// ```
/// use kappa_optim::convergence::*;
/// use rand::SeedableRng;
/// let spec = ModelSpec {
///     d: 3, k: 3, noise_std: 0.0,
///     covariance: CovarianceSpec { kappa: 10.0, random_basis: true },
///     target: TargetSpec { nuclear_norm: 1.0, kappa: 2.0 },
/// };
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
/// let model = spec.build(&mut rng)?;
/// let moments = Moments::estimate(&model.sample(500, &mut rng)?)?;
/// let (a0, b0) = spectral_init(&moments)?;
/// let objective = Objective::Population(model.population().clone());
/// let mut descent = Descent::new(objective, &moments, a0, b0, Settings::algorithm())?
///     .with_truth(Truth { population: model.population().clone(), probe: None });
/// let records = descent.run(200)?;
/// let (first, last) = (&records[0], records.last().unwrap());
/// assert!(last.excess.unwrap() < 1e-8 * first.excess.unwrap());
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
pub struct Descent {
    objective: Objective,
    moments: Moments,
    settings: Settings,
    a: Array2<f64>,
    b: Array2<f64>,
    eta: f64,
    step: usize,
    adam: Option<AdamState>,
    threshold: Option<f64>,
    tracker: RateTracker,
    truth: Option<Truth>,
}

impl Descent {
    /// A trainer at (A₀, B₀); `moments` give the preconditioner, the regularizer's Σ̂ and the
    /// step size scale.
    ///
    /// Errors: invalid settings; A₀, B₀ or the moments not matching the objective's k and d;
    /// non-finite A₀, B₀; T̂ = 0 with a relative step size.
    pub fn new(
        objective: Objective,
        moments: &Moments,
        a0: Array2<f64>,
        b0: Array2<f64>,
        settings: Settings,
    ) -> Result<Self> {
        settings.validate()?;
        check_params(&objective, moments, &a0.view(), &b0.view(), ("a0", "b0"))?;
        let eta = step_size(&settings, moments)?;
        let adam = match settings.update {
            UpdateRule::Adam {
                beta1,
                beta2,
                epsilon,
            } => Some(AdamState {
                adam: AdamW::new(AdamWConfig {
                    beta1,
                    beta2,
                    eps: epsilon,
                    weight_decay: 0.0,
                })?,
                a: AdamWState::new(),
                b: AdamWState::new(),
            }),
            UpdateRule::Gd => None,
        };
        Ok(Self {
            objective,
            moments: moments.clone(),
            tracker: RateTracker::new(settings.rate_window),
            settings,
            a: a0,
            b: b0,
            eta,
            step: 0,
            adam,
            threshold: None,
            truth: None,
        })
    }

    /// Adds ground truth for logging E (and the finite-context probe).
    pub fn with_truth(mut self, truth: Truth) -> Self {
        self.truth = Some(truth);
        self
    }

    /// The step size η in use.
    pub fn eta(&self) -> f64 {
        self.eta
    }

    /// The current parameters (A, B).
    pub fn params(&self) -> (&Array2<f64>, &Array2<f64>) {
        (&self.a, &self.b)
    }

    /// Updates applied so far.
    pub fn steps_done(&self) -> usize {
        self.step
    }

    /// Records θ_t and applies one update.
    ///
    /// Errors: [`OptimError::Diverged`] when θ_t's loss is non-finite or above the threshold, or
    /// when the update would make a parameter non-finite; its `step` is t, and the trainer is
    /// left at θ_t (finite), so [`Descent::steps_done`] equals the reported step.
    pub fn step(&mut self) -> Result<StepRecord> {
        self.advance(true)
    }

    /// Records θ_t without updating.
    pub fn record(&mut self) -> Result<StepRecord> {
        self.advance(false)
    }

    /// `m` updates and a final record: m + 1 records (θ_0 … θ_m).
    pub fn run(&mut self, m: usize) -> Result<Vec<StepRecord>> {
        let mut out = Vec::with_capacity(m.saturating_add(1).min(1 << 16));
        for _ in 0..m {
            out.push(self.step()?);
        }
        out.push(self.record()?);
        Ok(out)
    }

    fn advance(&mut self, update: bool) -> Result<StepRecord> {
        let ev = evaluate(
            &self.objective,
            &self.moments,
            self.a.view(),
            self.b.view(),
            &self.settings,
        )?;
        let q = &ev.quantities;
        let total = q.loss + q.regularizer;
        let threshold = *self
            .threshold
            .get_or_insert(self.settings.divergence_factor * total.abs().max(f64::MIN_POSITIVE));
        if !total.is_finite() || total > threshold {
            return Err(OptimError::Diverged {
                step: self.step,
                quantity: "loss",
                value: total,
                threshold,
            });
        }
        let record = self.record_of(q, !update)?;
        if !update {
            return Ok(record);
        }
        let (da, db) = ev.direction;
        let (a, b) = (self.a.view(), self.b.view());
        let (mut new_a, mut new_b) = match &mut self.adam {
            Some(st) => st.step(self.eta, a, b, &da, &db),
            None => gd_update(a, b, &da, &db, self.eta),
        };
        renormalize(
            &mut new_a,
            &mut new_b,
            &self.moments,
            self.settings.renormalization,
        )?;
        if !(new_a.iter().all(|x| x.is_finite()) && new_b.iter().all(|x| x.is_finite())) {
            return Err(OptimError::Diverged {
                step: self.step,
                quantity: "parameters",
                value: f64::NAN,
                threshold: f64::INFINITY,
            });
        }
        self.a = new_a;
        self.b = new_b;
        self.step += 1;
        Ok(record)
    }

    /// The record of θ_t: the step's quantities plus the truth's E, the probe and the rate.
    /// The probe runs every `every` steps and at a final record (`last`).
    fn record_of(&mut self, q: &StepQuantities, last: bool) -> Result<StepRecord> {
        let (a, b) = (self.a.view(), self.b.view());
        let excess = match &self.truth {
            Some(t) => Some(t.population.excess(a, b)?),
            None => None,
        };
        let finite_excess = match &self.truth {
            Some(Truth {
                population,
                probe: Some(p),
            }) if last || self.step.is_multiple_of(p.every.max(1)) => Some(finite_context_excess(
                a,
                b,
                p.context.view(),
                p.queries.view(),
                population.m().view(),
            )?),
            _ => None,
        };
        let tracked = match (&self.objective, excess) {
            (Objective::Population(_), Some(e)) => e,
            _ => q.grad_norm * q.grad_norm,
        };
        Ok(StepRecord {
            step: self.step,
            loss: q.loss,
            regularizer: q.regularizer,
            grad_norm: q.grad_norm,
            excess,
            finite_excess,
            balance_gap: q.balance_gap,
            a_norm: frob(&self.a),
            b_norm: frob(&self.b),
            max_weight: q.max_weight,
            rate: self.tracker.push(tracked),
        })
    }
}

impl AdamState {
    /// One bias-corrected Adam update of (A, B) along the direction (G_A, G_B). Unchecked: a
    /// non-finite direction gives non-finite parameters, which the caller reports as divergence.
    fn step(
        &mut self,
        eta: f64,
        a: ArrayView2<'_, f64>,
        b: ArrayView2<'_, f64>,
        da: &Array2<f64>,
        db: &Array2<f64>,
    ) -> (Array2<f64>, Array2<f64>) {
        let (mut new_a, mut new_b) = (a.to_owned(), b.to_owned());
        self.adam.step_unchecked(&mut new_a, da, eta, &mut self.a);
        self.adam.step_unchecked(&mut new_b, db, eta, &mut self.b);
        (new_a, new_b)
    }
}

/// What one evaluation at θ = (A, B) gives, before any update (the fields of [`StepRecord`]
/// that need no ground truth).
#[derive(Clone, Debug, PartialEq)]
pub struct StepQuantities {
    /// The data loss L(θ) or L̂_n(θ).
    pub loss: f64,
    /// R(θ) = (λ/4)‖D‖_F².
    pub regularizer: f64,
    /// ‖∇Q(θ)‖ in whitened coordinates (see [`StepRecord::grad_norm`]).
    pub grad_norm: f64,
    /// ‖D‖_F = ‖UᵀU − VVᵀ‖_F.
    pub balance_gap: f64,
    /// The largest softmax weight (empirical objectives only).
    pub max_weight: Option<f64>,
}

/// One step of the algorithm from θ = (A, B): the new parameters, the quantities at θ, and the
/// update direction (preconditioned or Euclidean gradient of Q at θ).
#[derive(Clone, Debug, PartialEq)]
pub struct PgdStep {
    /// A after the update and the renormalization.
    pub a: Array2<f64>,
    /// B after the update and the renormalization.
    pub b: Array2<f64>,
    /// The step size η used.
    pub eta: f64,
    /// Loss, regularizer, gradient norm, balance gap, saturation at θ.
    pub quantities: StepQuantities,
    /// The direction (G_A, G_B) the update moved against (before η and the renormalization).
    pub direction: (Array2<f64>, Array2<f64>),
}

/// One (preconditioned) gradient step on Q = L + R from (A, B) with the GD rule, η from
/// `settings.step` exactly as a [`Descent`] chooses it, then the renormalization (module docs).
/// The [`Descent`] runs this same update; use it to step without a trainer's state.
///
/// Errors: invalid settings, or `settings.update` = Adam (`arg: "settings.update"`: Adam keeps
/// moment estimates between steps, so it needs a [`Descent`]); A, B or the moments not matching
/// the objective; non-finite A or B; T̂ = 0 with a relative step; [`OptimError::Diverged`]
/// (step 0) when the loss or the new parameters are not finite.
///
/// ```
/// use kappa_optim::convergence::*;
/// let sigma = ndarray::array![[2.0, 0.3], [0.3, 1.0]];
/// let m = ndarray::array![[0.5, -1.0]];
/// let moments = Moments::from_parts(sigma.clone(), m.clone(), 1000)?;
/// let objective = Objective::Population(PopulationProblem::new(sigma, m, 0.0)?);
/// let (a0, b0) = spectral_init(&moments)?;
/// let a0 = a0 * 1.2; // off the minimisers
/// let step = pgd_step(&objective, &moments, a0.view(), b0.view(), &Settings::algorithm())?;
/// let next = objective.loss_grad(step.a.view(), step.b.view())?.loss;
/// assert!(next < step.quantities.loss);
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
pub fn pgd_step(
    objective: &Objective,
    moments: &Moments,
    a: ArrayView2<'_, f64>,
    b: ArrayView2<'_, f64>,
    settings: &Settings,
) -> Result<PgdStep> {
    settings.validate()?;
    if matches!(settings.update, UpdateRule::Adam { .. }) {
        return Err(InputError::invalid(
            "settings.update",
            "pgd_step is the GD rule; Adam keeps state between steps, use a Descent",
        )
        .into());
    }
    check_params(objective, moments, &a, &b, ("a", "b"))?;
    let eta = step_size(settings, moments)?;
    let ev = evaluate(objective, moments, a, b, settings)?;
    let (da, db) = &ev.direction;
    let (mut new_a, mut new_b) = gd_update(a, b, da, db, eta);
    renormalize(&mut new_a, &mut new_b, moments, settings.renormalization)?;
    if !(new_a.iter().all(|x| x.is_finite()) && new_b.iter().all(|x| x.is_finite())) {
        return Err(OptimError::Diverged {
            step: 0,
            quantity: "parameters",
            value: f64::NAN,
            threshold: f64::INFINITY,
        });
    }
    Ok(PgdStep {
        a: new_a,
        b: new_b,
        eta,
        quantities: ev.quantities,
        direction: ev.direction,
    })
}

/// θ − η·(G_A, G_B).
fn gd_update(
    a: ArrayView2<'_, f64>,
    b: ArrayView2<'_, f64>,
    da: &Array2<f64>,
    db: &Array2<f64>,
    eta: f64,
) -> (Array2<f64>, Array2<f64>) {
    (&a - &(da * eta), &b - &(db * eta))
}

/// The quantities at θ and the update direction.
struct Evaluation {
    quantities: StepQuantities,
    direction: (Array2<f64>, Array2<f64>),
}

/// Loss, regularizer and gradients of Q at θ (module docs), and the direction: preconditioned
/// (whitened GD) or Euclidean.
fn evaluate(
    objective: &Objective,
    mo: &Moments,
    a: ArrayView2<'_, f64>,
    b: ArrayView2<'_, f64>,
    settings: &Settings,
) -> Result<Evaluation> {
    let lg = objective.loss_grad(a, b)?;
    let (s, lambda) = (mo.sigma_hat(), settings.lambda);
    // C = AᵀA − BᵀΣ̂B, D = Σ̂^{1/2}CΣ̂^{1/2}.
    let c = a.t().dot(&a) - b.t().dot(s).dot(&b);
    let dmat = mo.sigma_hat_half().dot(&c).dot(mo.sigma_hat_half());
    let gap = frob(&dmat);
    // Euclidean gradients of Q.
    let sc = s.dot(&c);
    let scs = sc.dot(s);
    let ga = &lg.grad_a + &(a.dot(&scs) * lambda);
    let gb = &lg.grad_b - &(s.dot(&b).dot(&scs) * lambda);
    let ih = mo.sigma_hat_inv_half();
    let grad_norm = (frob(&ga.dot(ih)).powi(2) + frob(&ih.dot(&gb).dot(ih)).powi(2)).sqrt();
    let direction = if settings.preconditioner {
        let inv = mo.sigma_hat_inv();
        (
            lg.grad_a.dot(inv) + a.dot(&sc) * lambda,
            inv.dot(&lg.grad_b).dot(inv) - b.dot(&sc) * lambda,
        )
    } else {
        (ga, gb)
    };
    Ok(Evaluation {
        quantities: StepQuantities {
            loss: lg.loss,
            regularizer: 0.25 * lambda * gap * gap,
            grad_norm,
            balance_gap: gap,
            max_weight: lg.max_weight,
        },
        direction,
    })
}

/// Checks A (k×d), B (d×d) against the objective and the moments against the objective.
fn check_params(
    objective: &Objective,
    moments: &Moments,
    a: &ArrayView2<'_, f64>,
    b: &ArrayView2<'_, f64>,
    (an, bn): (&'static str, &'static str),
) -> Result<()> {
    let (k, d) = objective.dims();
    check_matrix(an, a, k, d, "k×d of the objective")?;
    check_matrix(bn, b, d, d, "d×d of the objective")?;
    if (moments.outputs(), moments.dim()) != (k, d) {
        return Err(InputError::shape_mismatch(
            "moments",
            format!("k = {k}, d = {d} of the objective"),
            format!("k = {}, d = {}", moments.outputs(), moments.dim()),
        )
        .into());
    }
    Ok(())
}

/// η from the settings (module docs, "Step size").
fn step_size(settings: &Settings, moments: &Moments) -> Result<f64> {
    match (settings.step, settings.update) {
        (StepSize::Absolute { eta }, _) => Ok(eta),
        (StepSize::Relative { c }, UpdateRule::Adam { .. }) => Ok(c),
        (StepSize::Relative { c }, UpdateRule::Gd) => {
            let d1 = moments.t_singular_values()[0];
            let scale = if settings.preconditioner {
                d1
            } else {
                let l = moments.sigma_hat_max_eigenvalue();
                d1 * l.max(l * l)
            };
            if !(scale.is_finite() && scale > 0.0) {
                return Err(InputError::invalid(
                    "moments",
                    "T̂ = 0, so a relative step size has no scale; pass an absolute one",
                )
                .into());
            }
            Ok(c / scale)
        }
    }
}

fn frob(a: &Array2<f64>) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// Applies a [`Renormalization`] in place (product AΣ̂Bᵀ unchanged).
///
/// Errors (A and B unchanged): A not ·×d or B not d×d for the moments' d; a non-positive or
/// non-finite `max_scale` (`arg: "max_scale"`). Non-finite entries are left as they are (the
/// [`Descent`] reports them as divergence).
pub fn renormalize(
    a: &mut Array2<f64>,
    b: &mut Array2<f64>,
    moments: &Moments,
    rule: Renormalization,
) -> Result<()> {
    let d = moments.dim();
    if a.ncols() != d || b.dim() != (d, d) {
        return Err(InputError::shape_mismatch(
            if a.ncols() != d { "a" } else { "b" },
            format!("a k×{d} and b {d}×{d} (d = Σ̂'s size)"),
            format!(
                "a {}×{}, b {}×{}",
                a.nrows(),
                a.ncols(),
                b.nrows(),
                b.ncols()
            ),
        )
        .into());
    }
    if let Renormalization::ClipSoftmaxScale { max_scale } = rule {
        check_positive("max_scale", max_scale)?;
    }
    if !(a.iter().all(|x| x.is_finite()) && b.iter().all(|x| x.is_finite())) {
        return Ok(());
    }
    match rule {
        Renormalization::None => {}
        Renormalization::Balance => {
            let h = moments.sigma_hat_half();
            let (u, v) = (a.dot(h), h.dot(&b.t()).dot(h));
            let (nu, nv) = (frob(&u), frob(&v));
            if nu > 0.0 && nv > 0.0 && nu.is_finite() && nv.is_finite() {
                let c = (nv / nu).sqrt();
                a.mapv_inplace(|x| x * c);
                b.mapv_inplace(|x| x / c);
            }
        }
        Renormalization::ClipSoftmaxScale { max_scale } => {
            let h = moments.sigma_hat_half();
            let v = h.dot(&*b).dot(h);
            if !v.iter().all(|x| x.is_finite()) {
                return Ok(());
            }
            let s = singular_values(v.view(), SvdDriver::default())
                .map_err(overflow_as("σ₁(Σ̂^{1/2}·B·Σ̂^{1/2})", "b"))?[0];
            if s > max_scale && s.is_finite() {
                let f = max_scale / s;
                b.mapv_inplace(|x| x * f);
                a.mapv_inplace(|x| x / f);
            }
        }
    }
    Ok(())
}

/// Small random initialization: A and B with i.i.d. N(0, scale²) entries.
pub fn random_init<R: Rng + ?Sized>(
    k: usize,
    d: usize,
    scale: f64,
    rng: &mut R,
) -> Result<(Array2<f64>, Array2<f64>)> {
    check_range("scale", scale, 0.0, 1e6)?;
    check_size("d", d, d)?;
    check_size("k", k, d)?;
    Ok((gaussian(k, d, rng)? * scale, gaussian(d, d, rng)? * scale))
}
