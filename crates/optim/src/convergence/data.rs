//! The data model: Gaussian covariates x ~ N(0, Σ), labels y = M x + ε, and seeded samples.
//!
//! Reconstruction (docs/convergence.md, §The model): supervised linear regression whose predictor is a softmax
//! attention layer reading the covariates only. x ∈ ℝ^d, x ~ N(0, Σ) with Σ ≻ 0 and zero mean;
//! y = M x + ε ∈ ℝ^k with ε ~ N(0, σ² I_k) independent of x. Samples are stored column-wise:
//! X ∈ ℝ^{d×n}, Y ∈ ℝ^{k×n}.
//!
//! Synthetic models are built from a [`ModelSpec`]: Σ = O diag(λ) Oᵀ with eigenvalues
//! λ_i = κ(Σ)^{i/(d−1) − 1/2} (geometric in [κ^{−1/2}, κ^{1/2}], geometric mean 1) and O Haar
//! random (or the identity), and the *whitened target* T = M Σ^{1/2} = P diag(t) Qᵀ with
//! geometric singular values t_1 ≥ … ≥ t_r (r = min(k, d), t_1/t_r = κ(T)) that sum to
//! `nuclear_norm`, and Haar-random P, Q. Then M = T Σ^{-1/2}. The nuclear norm is the softmax
//! scale: at the balanced minimisers E‖Σ^{1/2} B*ᵀ x‖² = tr(D) = Σ t_i, and the
//! finite-context error grows like exp of it (docs/convergence.md, §The attention limit and
//! §Whitened coordinates), so it is the knob of the softmax-scale stress test.

use kappa_linalg::input::InputError;
use kappa_linalg::{polar_factor, psd_inv_sqrt, RankTolerance, SvdDriver};
use ndarray::{s, Array1, Array2, ArrayView2, Axis};
use rand::Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

use super::covariance::MAX_CONDITION;
use super::population::PopulationProblem;
use crate::error::{check_finite, check_matrix, check_output, check_range, shape_str, Result};

/// The most entries (2³⁰, 8 GiB of f64) of any matrix this module allocates on a caller's behalf
/// ([`gaussian`], [`DataModel::sample`], [`default_stiefel`](super::default_stiefel), …). A
/// larger request, or one whose size overflows `usize`, is [`InputError::InvalidArgument`]
/// naming the dimension, instead of a capacity-overflow panic or an allocation abort.
pub const MAX_ELEMENTS: usize = 1 << 30;

/// Checks that a `rows×cols` matrix fits in [`MAX_ELEMENTS`].
pub(crate) fn check_size(arg: &'static str, rows: usize, cols: usize) -> Result<()> {
    match rows.checked_mul(cols) {
        Some(n) if n <= MAX_ELEMENTS => Ok(()),
        _ => Err(InputError::invalid(
            arg,
            format!(
                "a {} matrix exceeds the size limit of {MAX_ELEMENTS} entries",
                shape_str(rows, cols)
            ),
        )
        .into()),
    }
}

/// How the covariance Σ of a synthetic model is built.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CovarianceSpec {
    /// κ(Σ) = λ_max/λ_min ≥ 1; eigenvalues geometric in [κ^{−1/2}, κ^{1/2}].
    pub kappa: f64,
    /// Haar-random eigenvectors (`true`) or the standard basis (`false`).
    pub random_basis: bool,
}

/// How the whitened target T = M Σ^{1/2} of a synthetic model is built.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetSpec {
    /// Σ_i t_i, the sum of T's singular values (> 0): the softmax scale E‖Σ^{1/2}B*ᵀx‖² at the
    /// balanced minimisers.
    pub nuclear_norm: f64,
    /// κ(T) = t_1/t_r ≥ 1 (ignored when r = min(k, d) = 1).
    pub kappa: f64,
}

/// A synthetic regression problem: dimensions, Σ, T and the noise level.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Covariate dimension d ≥ 1.
    pub d: usize,
    /// Output dimension k ≥ 1 (k = 1 is scalar regression).
    pub k: usize,
    /// The covariance.
    pub covariance: CovarianceSpec,
    /// The whitened target.
    pub target: TargetSpec,
    /// σ ≥ 0, the label noise standard deviation per output.
    pub noise_std: f64,
}

/// Geometric values v_i = hi·κ^{−i/(r−1)}, i = 0..r (just `hi` when r = 1).
fn geometric(r: usize, hi: f64, kappa: f64) -> Array1<f64> {
    if r == 1 {
        return Array1::from_elem(1, hi);
    }
    Array1::from_shape_fn(r, |i| hi * kappa.powf(-(i as f64) / (r - 1) as f64))
}

/// An m×n matrix with orthonormal columns (m ≥ n) or rows (m < n), Haar distributed: the polar
/// factor of a Gaussian matrix (Gaussian matrices are invariant under O₁ G O₂, and so is the
/// law of their polar factor).
pub fn haar_orthonormal<R: Rng + ?Sized>(m: usize, n: usize, rng: &mut R) -> Result<Array2<f64>> {
    if m == 0 || n == 0 {
        return Err(InputError::invalid(
            "shape",
            format!("needs positive dimensions, found {}", shape_str(m, n)),
        )
        .into());
    }
    let g = gaussian(m, n, rng)?;
    Ok(polar_factor(g.view(), SvdDriver::default())?)
}

/// An m×n matrix of i.i.d. N(0, 1) entries (m or n may be 0).
///
/// Errors: more than [`MAX_ELEMENTS`] entries (`arg: "shape"`).
pub fn gaussian<R: Rng + ?Sized>(m: usize, n: usize, rng: &mut R) -> Result<Array2<f64>> {
    check_size("shape", m, n)?;
    Ok(Array2::from_shape_simple_fn((m, n), || {
        rng.sample(StandardNormal)
    }))
}

impl ModelSpec {
    /// Checks the dimensions and scalars.
    pub fn validate(&self) -> Result<()> {
        if self.d == 0 || self.k == 0 {
            return Err(InputError::invalid(
                "spec",
                format!(
                    "d and k must be positive, found d = {}, k = {}",
                    self.d, self.k
                ),
            )
            .into());
        }
        check_size("spec", self.d, self.d)?;
        check_size("spec", self.k, self.k.max(self.d))?;
        check_range(
            "covariance.kappa",
            self.covariance.kappa,
            1.0,
            MAX_CONDITION,
        )?;
        check_range("target.kappa", self.target.kappa, 1.0, 1e12)?;
        check_range("target.nuclear_norm", self.target.nuclear_norm, 1e-300, 1e6)?;
        if self.target.nuclear_norm <= 0.0 {
            return Err(InputError::invalid("target.nuclear_norm", "must be positive").into());
        }
        Ok(check_range("noise_std", self.noise_std, 0.0, 1e6)?)
    }

    /// The eigenvalues of Σ, descending.
    ///
    /// Errors: as [`ModelSpec::validate`].
    pub fn covariance_eigenvalues(&self) -> Result<Array1<f64>> {
        self.validate()?;
        let kappa = self.covariance.kappa;
        Ok(geometric(self.d, kappa.sqrt(), kappa))
    }

    /// The singular values of T, descending, summing to `nuclear_norm`.
    ///
    /// Errors: as [`ModelSpec::validate`].
    pub fn target_singular_values(&self) -> Result<Array1<f64>> {
        self.validate()?;
        let t = geometric(self.k.min(self.d), 1.0, self.target.kappa);
        let sum = t.sum();
        Ok(t.mapv(|x| x * self.target.nuclear_norm / sum))
    }

    /// Draws Σ's basis and T's singular vectors and returns the model.
    ///
    /// ```
    /// use kappa_optim::convergence::{CovarianceSpec, DataModel, ModelSpec, TargetSpec};
    /// use rand::SeedableRng;
    /// let spec = ModelSpec {
    ///     d: 4, k: 2, noise_std: 0.1,
    ///     covariance: CovarianceSpec { kappa: 10.0, random_basis: true },
    ///     target: TargetSpec { nuclear_norm: 1.0, kappa: 2.0 },
    /// };
    /// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    /// let model = spec.build(&mut rng)?;
    /// let sample = model.sample(100, &mut rng)?;
    /// assert_eq!((sample.dim(), sample.outputs(), sample.len()), (4, 2, 100));
    /// # Ok::<(), kappa_optim::OptimError>(())
    /// ```
    pub fn build<R: Rng + ?Sized>(&self, rng: &mut R) -> Result<DataModel> {
        self.validate()?;
        let (d, k) = (self.d, self.k);
        let lambda = self.covariance_eigenvalues()?;
        let o = if self.covariance.random_basis {
            haar_orthonormal(d, d, rng)?
        } else {
            Array2::eye(d)
        };
        let sigma = (&o * &lambda.view().insert_axis(Axis(0))).dot(&o.t());
        let sigma = (&sigma + &sigma.t()) * 0.5;
        let r = k.min(d);
        let t_sv = self.target_singular_values()?;
        let p = haar_orthonormal(k, k, rng)?;
        let q = haar_orthonormal(d, r, rng)?;
        let t = (&p.slice(s![.., ..r]) * &t_sv.view().insert_axis(Axis(0))).dot(&q.t());
        let sigma_inv_half = psd_inv_sqrt(sigma.view(), RankTolerance::default())?;
        let m = t.dot(&sigma_inv_half);
        DataModel::new(sigma, m, self.noise_std)
    }
}

/// A regression model x ~ N(0, Σ), y = M x + ε, ε ~ N(0, σ² I_k): the ground truth of synthetic
/// experiments.
#[derive(Clone, Debug)]
pub struct DataModel {
    population: PopulationProblem,
}

impl DataModel {
    /// A model from Σ (d×d, symmetric positive definite, κ(Σ) ≤ [`MAX_CONDITION`]), M (k×d) and σ.
    ///
    /// Errors: non-square, non-symmetric, non-finite or (numerically) singular Σ; M of the wrong
    /// width or non-finite; σ negative or non-finite.
    pub fn new(sigma: Array2<f64>, m: Array2<f64>, noise_std: f64) -> Result<Self> {
        Ok(Self {
            population: PopulationProblem::new(sigma, m, noise_std)?,
        })
    }

    /// Covariate dimension d.
    pub fn dim(&self) -> usize {
        self.population.dim()
    }

    /// Output dimension k.
    pub fn outputs(&self) -> usize {
        self.population.outputs()
    }

    /// Σ.
    pub fn sigma(&self) -> &Array2<f64> {
        self.population.sigma()
    }

    /// Σ^{1/2}.
    pub fn sigma_half(&self) -> &Array2<f64> {
        self.population.sigma_half()
    }

    /// M.
    pub fn m(&self) -> &Array2<f64> {
        self.population.m()
    }

    /// σ, the label noise standard deviation.
    pub fn noise_std(&self) -> f64 {
        self.population.noise_std()
    }

    /// The whitened target T = M Σ^{1/2}.
    pub fn target(&self) -> Array2<f64> {
        self.m().dot(self.sigma_half())
    }

    /// The population objective (Theorem 1's closed form) of this model.
    pub fn population(&self) -> &PopulationProblem {
        &self.population
    }

    /// n i.i.d. draws: x = Σ^{1/2} g with g ~ N(0, I), y = M x + σ·ξ.
    ///
    /// Errors: n = 0 (a [`Sample`] is never empty) or a sample over [`MAX_ELEMENTS`] entries
    /// (`arg: "n"`); [`OptimError::Overflow`](crate::OptimError::Overflow) if the draws overflow
    /// (Σ or M near `f64::MAX`).
    pub fn sample<R: Rng + ?Sized>(&self, n: usize, rng: &mut R) -> Result<Sample> {
        let (d, k) = (self.dim(), self.outputs());
        if n == 0 {
            return Err(InputError::invalid("n", "a sample needs at least one draw").into());
        }
        check_size("n", d.max(k), n)?;
        let g = gaussian(d, n, rng)?;
        let x = self.sigma_half().dot(&g);
        let mut y = self.m().dot(&x);
        if self.noise_std() > 0.0 {
            y.scaled_add(self.noise_std(), &gaussian(k, n, rng)?);
        }
        check_output("x", "sigma", &x.view())?;
        check_output("y", "m, noise_std", &y.view())?;
        Ok(Sample { x, y })
    }

    /// n covariates only (test queries): x = Σ^{1/2} g, d×n (d×0 for n = 0).
    ///
    /// Errors: more than [`MAX_ELEMENTS`] entries (`arg: "n"`).
    pub fn sample_covariates<R: Rng + ?Sized>(&self, n: usize, rng: &mut R) -> Result<Array2<f64>> {
        check_size("n", self.dim(), n)?;
        Ok(self.sigma_half().dot(&gaussian(self.dim(), n, rng)?))
    }
}

/// A training set: covariates X ∈ ℝ^{d×n} and labels Y ∈ ℝ^{k×n}, column j is sample j.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    x: Array2<f64>,
    y: Array2<f64>,
}

impl Sample {
    /// A sample from its covariates and labels.
    ///
    /// Errors: an empty X, a Y with a different number of columns, a non-finite entry.
    pub fn new(x: Array2<f64>, y: Array2<f64>) -> Result<Self> {
        let (d, n) = x.dim();
        if d == 0 || n == 0 || y.nrows() == 0 {
            return Err(InputError::shape_mismatch(
                "x",
                "a non-empty d×n matrix and a k×n y with k ≥ 1",
                format!(
                    "x {}, y {}",
                    shape_str(d, n),
                    shape_str(y.nrows(), y.ncols())
                ),
            )
            .into());
        }
        check_finite("x", &x.view())?;
        check_matrix("y", &y.view(), y.nrows(), n, "one column per sample of x")?;
        Ok(Self {
            x: x.as_standard_layout().into_owned(),
            y: y.as_standard_layout().into_owned(),
        })
    }

    /// X, d×n.
    pub fn x(&self) -> ArrayView2<'_, f64> {
        self.x.view()
    }

    /// Y, k×n.
    pub fn y(&self) -> ArrayView2<'_, f64> {
        self.y.view()
    }

    /// n, the number of samples.
    pub fn len(&self) -> usize {
        self.x.ncols()
    }

    /// Always false (a sample is never empty).
    pub fn is_empty(&self) -> bool {
        self.x.ncols() == 0
    }

    /// d, the covariate dimension.
    pub fn dim(&self) -> usize {
        self.x.nrows()
    }

    /// k, the output dimension.
    pub fn outputs(&self) -> usize {
        self.y.nrows()
    }

    /// The first `first` samples and the rest (sample splitting).
    ///
    /// Errors: `first` = 0 or `first` ≥ n (both halves must be non-empty).
    pub fn split(&self, first: usize) -> Result<(Sample, Sample)> {
        let n = self.len();
        if first == 0 || first >= n {
            return Err(InputError::invalid(
                "first",
                format!("must be in 1..{n} so both parts are non-empty, found {first}"),
            )
            .into());
        }
        let part = |lo: usize, hi: usize| Sample {
            x: self.x.slice(s![.., lo..hi]).to_owned(),
            y: self.y.slice(s![.., lo..hi]).to_owned(),
        };
        Ok((part(0, first), part(first, n)))
    }
}
