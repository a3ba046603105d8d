//! Preconditioned gradient descent for softmax attention on linear regression: the model, the
//! objectives, the algorithm and its baselines (Goel, Soltanolkotabi, Bartlett, *Training
//! Dynamics of Softmax Self-Attention: Fast Global Convergence via Preconditioning*).
//!
//! The paper's full text was not available; this module implements the reconstruction written down in `docs/convergence.md`, where every
//! guessed choice is a setting (§Reconstruction choices) and the claim → code → test map is.
//!
//! # The model (docs/convergence.md, §The model, §Population loss)
//!
//! x ~ N(0, Σ) ∈ ℝ^d, y = Mx + ε ∈ ℝ^k, ε ~ N(0, σ²I). A softmax attention layer with value
//! matrix A ∈ ℝ^{k×d} and key-query matrix B ∈ ℝ^{d×d} predicts, for a query q attending over a
//! context X_k, f_θ(q) = A X_k softmax(X_kᵀBᵀq) ([`attend`]). As n → ∞ the layer tends to the
//! limit predictor AΣBᵀq, and (Theorem 1) the population loss is
//! L(A,B) = ½‖(AΣBᵀ − M)Σ^{1/2}‖_F² + ½kσ² ([`PopulationProblem`]). Training minimises the
//! empirical loss L̂_n over self-attention on the training covariates ([`EmpiricalProblem`],
//! [`ContextMode`]).
//!
//! # The algorithm (docs/convergence.md, §The algorithm)
//!
//! 1. [`Moments::estimate`]: Σ̂ = XXᵀ/n, M̂ = YXᵀ(XXᵀ)^{-1}, T̂ = M̂Σ̂^{1/2} and its SVD.
//! 2. [`spectral_init`]: the balanced point of the estimated minimiser manifold.
//! 3. [`Descent`] with [`Settings::algorithm`]: Σ̂-preconditioned GD on L̂_n + (λ/4)‖D‖²,
//!    renormalized after every step, η = c/σ_max(T̂).
//!
//! Baselines and ablations are other [`Settings`] and initializations through the same trainer:
//! [`Settings::plain_gd`], [`Settings::adam`], `preconditioner: false`, `lambda: 0.0`,
//! [`random_init`].
//!
//! ```
//! use kappa_optim::convergence::*;
//! use rand::SeedableRng;
//! let spec = ModelSpec {
//!     d: 3, k: 1, noise_std: 0.1,
//!     covariance: CovarianceSpec { kappa: 10.0, random_basis: true },
//!     target: TargetSpec { nuclear_norm: 1.0, kappa: 1.0 },
//! };
//! let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
//! let model = spec.build(&mut rng)?;
//! let sample = model.sample(400, &mut rng)?;
//! let moments = Moments::estimate(&sample)?;
//! let (a0, b0) = spectral_init(&moments)?;
//! let objective = Objective::Empirical(EmpiricalProblem::new(&sample, ContextMode::SplitKeys)?);
//! let mut descent = Descent::new(objective, &moments, a0, b0, Settings::algorithm())?;
//! let records = descent.run(5)?;
//! assert_eq!(records.len(), 6);
//! # Ok::<(), kappa_optim::OptimError>(())
//! ```

use ndarray::Array2;

mod attention;
mod covariance;
mod data;
mod moments;
mod population;
mod rate;
mod train;

pub use attention::{
    attend, finite_context_excess, ContextMode, EmpiricalProblem, KeyMask, DEFAULT_QUERY_CHUNK,
};
pub use covariance::MAX_CONDITION;
pub use data::{
    gaussian, haar_orthonormal, CovarianceSpec, DataModel, ModelSpec, Sample, TargetSpec,
    MAX_ELEMENTS,
};
pub use moments::{default_stiefel, spectral_init, spectral_init_with, Moments};
pub use population::{limit_predict_with, PopulationProblem};
pub use rate::{geometric_rate, RateFit};
pub use train::{
    pgd_step, random_init, renormalize, Descent, Objective, PgdStep, Probe, Renormalization,
    Settings, StepQuantities, StepRecord, StepSize, Truth, UpdateRule,
};

/// The old name of [`Descent`] (kappa-train's `Trainer` is the training loop of tch models).
#[deprecated(since = "0.2.0", note = "renamed `Descent`")]
pub type Trainer = Descent;

/// A loss value, its gradients with respect to A (k×d) and B (d×d), and, for the finite-context
/// layer, the largest softmax weight over all queries (a saturation indicator: 1/n_k is uniform
/// attention, 1 is a one-hot softmax).
#[derive(Clone, Debug, PartialEq)]
pub struct LossGrad {
    /// The loss.
    pub loss: f64,
    /// ∂loss/∂A.
    pub grad_a: Array2<f64>,
    /// ∂loss/∂B.
    pub grad_b: Array2<f64>,
    /// The largest softmax weight (empirical objectives only).
    pub max_weight: Option<f64>,
}
