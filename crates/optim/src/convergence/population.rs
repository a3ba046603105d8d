//! The population (infinite-data) objective in closed form (Theorem 1) and its gradients.
//!
//! With n → ∞ the attention average X softmax(XᵀBᵀx) tends to ΣBᵀx (docs/convergence.md, §The attention limit: for x ~ N(0, Σ),
//! E[x e^{vᵀx}]/E[e^{vᵀx}] = Σv), so the layer tends to the *limit predictor* x ↦ AΣBᵀx and
//!
//! ```text
//! L(A,B) = E ½‖y − AΣBᵀx‖² = ½‖(AΣBᵀ − M)Σ^{1/2}‖_F² + ½kσ²      (Theorem 1; ½kσ² is [R])
//! E(A,B) = ½‖(AΣBᵀ − M)Σ^{1/2}‖_F²                                 (excess risk of the limit)
//! ```
//!
//! Gradients, with F = AΣBᵀ − M (so dL = ⟨FΣ, dF⟩ and dF = dA·ΣBᵀ + AΣ·dBᵀ):
//!
//! ```text
//! ∇_A L = F Σ B Σ,        ∇_B L = Σ Fᵀ A Σ.
//! ```

use kappa_linalg::input::InputError;
use ndarray::{Array2, ArrayView2};

use super::covariance::covariance_roots;
use super::LossGrad;
use crate::error::{check_matrix, check_output, check_output_scalar, check_range, Result};

/// The closed-form population objective of a model (Σ, M, σ).
#[derive(Clone, Debug)]
pub struct PopulationProblem {
    sigma: Array2<f64>,
    sigma_half: Array2<f64>,
    m: Array2<f64>,
    noise_std: f64,
}

impl PopulationProblem {
    /// The objective for Σ (d×d, symmetric positive definite), M (k×d) and σ ≥ 0.
    ///
    /// Errors: as [`DataModel::new`](super::DataModel::new).
    pub fn new(sigma: Array2<f64>, m: Array2<f64>, noise_std: f64) -> Result<Self> {
        let (sigma_half, _, _) = covariance_roots("sigma", &sigma.view())?;
        let d = sigma.nrows();
        check_matrix("m", &m.view(), m.nrows(), d, "k×d, d = Σ's size")?;
        if m.nrows() == 0 {
            return Err(InputError::invalid("m", "needs at least one row").into());
        }
        check_range("noise_std", noise_std, 0.0, f64::MAX)?;
        let sigma = (&sigma + &sigma.t()) * 0.5;
        Ok(Self {
            sigma,
            sigma_half,
            m: m.as_standard_layout().into_owned(),
            noise_std,
        })
    }

    /// d.
    pub fn dim(&self) -> usize {
        self.sigma.nrows()
    }

    /// k.
    pub fn outputs(&self) -> usize {
        self.m.nrows()
    }

    /// Σ.
    pub fn sigma(&self) -> &Array2<f64> {
        &self.sigma
    }

    /// Σ^{1/2}.
    pub fn sigma_half(&self) -> &Array2<f64> {
        &self.sigma_half
    }

    /// M.
    pub fn m(&self) -> &Array2<f64> {
        &self.m
    }

    /// σ.
    pub fn noise_std(&self) -> f64 {
        self.noise_std
    }

    /// The irreducible noise ½kσ².
    pub fn noise_floor(&self) -> f64 {
        0.5 * self.outputs() as f64 * self.noise_std * self.noise_std
    }

    pub(crate) fn check_params(
        &self,
        a: &ArrayView2<'_, f64>,
        b: &ArrayView2<'_, f64>,
    ) -> Result<()> {
        let (k, d) = (self.outputs(), self.dim());
        check_matrix("a", a, k, d, "k×d")?;
        check_matrix("b", b, d, d, "d×d")
    }

    /// F = AΣBᵀ − M, the error of the limit predictor's matrix.
    fn residual(&self, a: &ArrayView2<'_, f64>, b: &ArrayView2<'_, f64>) -> Array2<f64> {
        a.dot(&self.sigma).dot(&b.t()) - &self.m
    }

    /// E(A,B) = ½‖(AΣBᵀ − M)Σ^{1/2}‖_F², the excess risk of the limit predictor.
    ///
    /// Errors: A not k×d, B not d×d, a non-finite entry.
    pub fn excess(&self, a: ArrayView2<'_, f64>, b: ArrayView2<'_, f64>) -> Result<f64> {
        self.check_params(&a, &b)?;
        let e = self.residual(&a, &b).dot(&self.sigma_half);
        check_output_scalar(
            "the excess",
            ARGS,
            0.5 * e.iter().map(|x| x * x).sum::<f64>(),
        )
    }

    /// L(A,B) = E(A,B) + ½kσ².
    pub fn loss(&self, a: ArrayView2<'_, f64>, b: ArrayView2<'_, f64>) -> Result<f64> {
        check_output_scalar("the loss", ARGS, self.excess(a, b)? + self.noise_floor())
    }

    /// L and its exact gradients ∇_A L = FΣBΣ, ∇_B L = ΣFᵀAΣ.
    pub fn loss_grad(&self, a: ArrayView2<'_, f64>, b: ArrayView2<'_, f64>) -> Result<LossGrad> {
        self.check_params(&a, &b)?;
        let f = self.residual(&a, &b);
        let fs = f.dot(&self.sigma);
        let loss = 0.5 * (&fs * &f).sum() + self.noise_floor();
        let grad_a = fs.dot(&b).dot(&self.sigma);
        let grad_b = fs.t().dot(&a).dot(&self.sigma);
        check_output_scalar("the loss", ARGS, loss)?;
        check_output("grad_a", ARGS, &grad_a.view())?;
        check_output("grad_b", ARGS, &grad_b.view())?;
        Ok(LossGrad {
            loss,
            grad_a,
            grad_b,
            max_weight: None,
        })
    }

    /// The limit predictor's outputs A Σ Bᵀ X for queries X (d×n), k×n.
    pub fn limit_predict(
        &self,
        a: ArrayView2<'_, f64>,
        b: ArrayView2<'_, f64>,
        queries: ArrayView2<'_, f64>,
    ) -> Result<Array2<f64>> {
        self.check_params(&a, &b)?;
        limit_predict_with(self.sigma.view(), a, b, queries)
    }
}

const ARGS: &str = "a, b (or Σ, M)";

/// The limit predictor's outputs A S Bᵀ X for any covariance S: the true Σ (as
/// [`PopulationProblem::limit_predict`]) or an estimate Σ̂ (as
/// [`Moments::limit_predict`](super::Moments::limit_predict)). S is not required to be
/// positive definite here: the formula is just a product.
///
/// Errors: S not d×d (d ≥ 1), A not k×d, B not d×d, queries not d×n, a non-finite entry;
/// [`OptimError::Overflow`](crate::OptimError::Overflow) when the product overflows.
///
/// ```
/// use kappa_optim::convergence::limit_predict_with;
/// let sigma_hat = ndarray::array![[2.0, 0.0], [0.0, 1.0]];
/// let (a, b) = (ndarray::array![[1.0, 0.0]], ndarray::Array2::eye(2));
/// let out = limit_predict_with(sigma_hat.view(), a.view(), b.view(), ndarray::array![[1.0], [3.0]].view())?;
/// assert_eq!(out[[0, 0]], 2.0);
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
pub fn limit_predict_with(
    sigma: ArrayView2<'_, f64>,
    a: ArrayView2<'_, f64>,
    b: ArrayView2<'_, f64>,
    queries: ArrayView2<'_, f64>,
) -> Result<Array2<f64>> {
    let d = sigma.nrows();
    if d == 0 {
        return Err(InputError::invalid("sigma", "is empty").into());
    }
    check_matrix("sigma", &sigma, d, d, "square")?;
    check_matrix("a", &a, a.nrows(), d, "k×d, d = Σ's size")?;
    check_matrix("b", &b, d, d, "d×d")?;
    check_matrix("queries", &queries, d, queries.ncols(), "d×n")?;
    let out = a.dot(&sigma).dot(&b.t()).dot(&queries);
    check_output("the predictions", "a, b, sigma, queries", &out.view())?;
    Ok(out)
}
