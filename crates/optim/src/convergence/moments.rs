//! Moments (Σ̂, M̂), the whitened coordinates (U, V), and the balanced spectral initialization.
//!
//! ```text
//! Σ̂ = X Xᵀ / n                      (no centring: the model is zero-mean, docs/convergence.md §The model)
//! M̂ = (Y Xᵀ)(X Xᵀ)^{-1} = (Y Xᵀ/n) Σ̂^{-1}     (least squares; YXᵀ/n alone estimates MΣ)
//! T̂ = M̂ Σ̂^{1/2} = P̂ D̂ Q̂ᵀ            (compact SVD, r = min(k, d) components)
//! ```
//!
//! Whitened coordinates (docs/convergence.md, §Whitened coordinates and the minimiser manifold): U = AΣ̂^{1/2}, V = Σ̂^{1/2}BᵀΣ̂^{1/2}, so that
//! AΣ̂Bᵀ = UVΣ̂^{-1/2} and the plug-in excess is ½‖UV − T̂‖_F². The balanced spectral
//! initialization (docs/convergence.md, §Spectral initialization) picks W ∈ ℝ^{r×d} with orthonormal rows (default [I_r 0]):
//!
//! ```text
//! U₀ = P̂ D̂^{1/2} W,   V₀ = Wᵀ D̂^{1/2} Q̂ᵀ      ⇒  U₀V₀ = T̂  and  U₀ᵀU₀ = V₀V₀ᵀ = WᵀD̂W
//! A₀ = U₀ Σ̂^{-1/2},   B₀ = Σ̂^{-1/2} V₀ᵀ Σ̂^{-1/2} ⇒  A₀Σ̂B₀ᵀ = M̂ exactly.
//! ```
//!
//! The identities are exact for Σ̂, not Σ (docs/convergence.md, §Spectral initialization): at finite n the *population* excess at
//! initialization is positive even without noise, and it falls like 1/n.

use kappa_linalg::input::InputError;
use kappa_linalg::{condition_number, svd_thin, Svd, SvdDriver};
use ndarray::{s, Array1, Array2, ArrayView2, Axis};

use super::covariance::{covariance_roots, MAX_CONDITION};
use super::data::{check_size, DataModel, Sample};
use crate::error::{check_matrix, check_output, overflow_as, OptimError, Result};

/// The plug-in moments of a training set and everything derived from them: Σ̂^{±1/2}, Σ̂^{-1},
/// M̂, T̂ and T̂'s compact SVD. Also the preconditioner and the regularizer's geometry.
#[derive(Clone, Debug)]
pub struct Moments {
    n: usize,
    sigma_hat: Array2<f64>,
    sigma_hat_half: Array2<f64>,
    sigma_hat_inv_half: Array2<f64>,
    sigma_hat_inv: Array2<f64>,
    m_hat: Array2<f64>,
    t_hat: Array2<f64>,
    t_svd: Svd<f64>,
    condition: f64,
}

impl Moments {
    /// Σ̂ and M̂ from a training set.
    ///
    /// Errors: [`OptimError::SingularCovariance`] when n < d or κ(Σ̂) > [`MAX_CONDITION`].
    ///
    /// ```
    /// use kappa_optim::convergence::{Moments, Sample};
    /// use kappa_optim::OptimError;
    /// let x = ndarray::array![[1.0, 2.0], [0.5, -1.0], [3.0, 0.0]]; // d = 3, n = 2
    /// let y = ndarray::array![[1.0, 0.0]];
    /// let err = Moments::estimate(&Sample::new(x, y)?).unwrap_err();
    /// assert!(matches!(err, OptimError::SingularCovariance { n: 2, d: 3, .. }));
    /// # Ok::<(), OptimError>(())
    /// ```
    pub fn estimate(sample: &Sample) -> Result<Self> {
        let (d, n) = (sample.dim(), sample.len());
        if n < d {
            return Err(OptimError::SingularCovariance {
                n,
                d,
                condition: f64::INFINITY,
            });
        }
        let x = sample.x();
        let sigma_hat = x.dot(&x.t()) / n as f64;
        check_output("sigma_hat", "the sample (x)", &sigma_hat.view())?;
        let sigma_hat = (&sigma_hat + &sigma_hat.t()) * 0.5;
        let condition = condition_number(sigma_hat.view())?;
        if !(condition.is_finite() && condition <= MAX_CONDITION) {
            return Err(OptimError::SingularCovariance { n, d, condition });
        }
        let cross = sample.y().dot(&x.t()) / n as f64;
        Self::build(sigma_hat, CrossOrM::Cross(cross), n)
    }

    /// Moments from a given Σ̂ (d×d, positive definite) and M̂ (k×d); `n` is recorded only.
    /// With the true Σ and M these are the oracle (n = ∞) moments.
    ///
    /// Errors: as [`DataModel::new`](super::DataModel::new).
    pub fn from_parts(sigma_hat: Array2<f64>, m_hat: Array2<f64>, n: usize) -> Result<Self> {
        Self::build(sigma_hat, CrossOrM::M(m_hat), n)
    }

    /// The oracle moments Σ̂ = Σ, M̂ = M of a model (n is recorded as `usize::MAX`).
    pub fn oracle(model: &DataModel) -> Result<Self> {
        Self::from_parts(model.sigma().clone(), model.m().clone(), usize::MAX)
    }

    fn build(sigma_hat: Array2<f64>, m: CrossOrM, n: usize) -> Result<Self> {
        let d = sigma_hat.nrows();
        let (sigma_hat_half, sigma_hat_inv_half, condition) =
            covariance_roots("sigma_hat", &sigma_hat.view())?;
        let sigma_hat = (&sigma_hat + &sigma_hat.t()) * 0.5;
        let sigma_hat_inv = sigma_hat_inv_half.dot(&sigma_hat_inv_half);
        let m_hat = match m {
            CrossOrM::Cross(c) => c.dot(&sigma_hat_inv),
            CrossOrM::M(m) => {
                check_matrix("m_hat", &m.view(), m.nrows(), d, "k×d")?;
                m
            }
        };
        if m_hat.nrows() == 0 {
            return Err(InputError::invalid("m_hat", "needs at least one row").into());
        }
        check_output("m_hat", "the sample (y)", &m_hat.view())?;
        let t_hat = m_hat.dot(&sigma_hat_half);
        check_output("t_hat", "the sample (y)", &t_hat.view())?;
        let t_svd = fix_signs(svd_thin(t_hat.view(), SvdDriver::default()).map_err(
            overflow_as("the singular values of T̂ = M̂·Σ̂^{1/2}", "m_hat, sigma_hat"),
        )?);
        Ok(Self {
            n,
            sigma_hat,
            sigma_hat_half,
            sigma_hat_inv_half,
            sigma_hat_inv,
            m_hat,
            t_hat,
            t_svd,
            condition,
        })
    }

    /// The number of samples the moments came from (`usize::MAX` for oracle moments).
    pub fn n(&self) -> usize {
        self.n
    }

    /// d.
    pub fn dim(&self) -> usize {
        self.sigma_hat.nrows()
    }

    /// k.
    pub fn outputs(&self) -> usize {
        self.m_hat.nrows()
    }

    /// Σ̂.
    pub fn sigma_hat(&self) -> &Array2<f64> {
        &self.sigma_hat
    }

    /// Σ̂^{1/2}.
    pub fn sigma_hat_half(&self) -> &Array2<f64> {
        &self.sigma_hat_half
    }

    /// Σ̂^{-1/2}.
    pub fn sigma_hat_inv_half(&self) -> &Array2<f64> {
        &self.sigma_hat_inv_half
    }

    /// Σ̂^{-1}.
    pub fn sigma_hat_inv(&self) -> &Array2<f64> {
        &self.sigma_hat_inv
    }

    /// κ(Σ̂).
    pub fn condition(&self) -> f64 {
        self.condition
    }

    /// M̂.
    pub fn m_hat(&self) -> &Array2<f64> {
        &self.m_hat
    }

    /// T̂ = M̂Σ̂^{1/2}.
    pub fn t_hat(&self) -> &Array2<f64> {
        &self.t_hat
    }

    /// T̂'s singular values, descending (r = min(k, d) of them).
    pub fn t_singular_values(&self) -> &Array1<f64> {
        &self.t_svd.s
    }

    /// The largest eigenvalue of Σ̂ (from its square root: λ_max = σ_max(Σ̂^{1/2})²).
    pub fn sigma_hat_max_eigenvalue(&self) -> f64 {
        // Σ̂ is symmetric PD: its spectral norm is its largest eigenvalue; ‖·‖₂ ≤ ‖·‖_F is too
        // loose, so use the SVD of the d×d matrix (cheap).
        kappa_linalg::singular_values(self.sigma_hat.view(), SvdDriver::default())
            .map(|s| s[0])
            .unwrap_or_else(|_| self.sigma_hat.diag().iter().copied().fold(0.0, f64::max))
    }

    /// The plug-in limit predictor A Σ̂ Bᵀ X for queries X (d×n), k×n: the limit of the layer
    /// whose context has the training covariates' second moment Σ̂.
    ///
    /// Errors: as [`limit_predict_with`](super::limit_predict_with).
    pub fn limit_predict(
        &self,
        a: ArrayView2<'_, f64>,
        b: ArrayView2<'_, f64>,
        queries: ArrayView2<'_, f64>,
    ) -> Result<Array2<f64>> {
        super::limit_predict_with(self.sigma_hat.view(), a, b, queries)
    }

    /// (U, V) = (AΣ̂^{1/2}, Σ̂^{1/2}BᵀΣ̂^{1/2}).
    ///
    /// Errors: A not k×d or B not d×d (any number of rows k ≥ 0 for A), a non-finite entry,
    /// [`OptimError::Overflow`] when the products overflow.
    pub fn whiten(
        &self,
        a: ArrayView2<'_, f64>,
        b: ArrayView2<'_, f64>,
    ) -> Result<(Array2<f64>, Array2<f64>)> {
        self.change_basis(("a", "b"), a, b, &self.sigma_hat_half)
    }

    /// (A, B) = (UΣ̂^{-1/2}, Σ̂^{-1/2}VᵀΣ̂^{-1/2}), the inverse of [`Moments::whiten`].
    ///
    /// Errors: as [`Moments::whiten`], for `u` and `v`.
    pub fn unwhiten(
        &self,
        u: ArrayView2<'_, f64>,
        v: ArrayView2<'_, f64>,
    ) -> Result<(Array2<f64>, Array2<f64>)> {
        self.change_basis(("u", "v"), u, v, &self.sigma_hat_inv_half)
    }

    /// (X H, H Yᵀ H) after checking X (·×d) and Y (d×d).
    fn change_basis(
        &self,
        (xn, yn): (&'static str, &'static str),
        x: ArrayView2<'_, f64>,
        y: ArrayView2<'_, f64>,
        h: &Array2<f64>,
    ) -> Result<(Array2<f64>, Array2<f64>)> {
        let d = self.dim();
        check_matrix(xn, &x, x.nrows(), d, "k×d, d = Σ̂'s size")?;
        check_matrix(yn, &y, d, d, "d×d, d = Σ̂'s size")?;
        let (p, q) = (x.dot(h), h.dot(&y.t()).dot(h));
        check_output(xn, "the parameters", &p.view())?;
        check_output(yn, "the parameters", &q.view())?;
        Ok((p, q))
    }
}

/// The sign convention of T̂'s SVD: each left singular vector p̂_i (column of P̂) has its entry of
/// largest magnitude positive (the first such entry on a tie); q̂_i is flipped with it, so
/// P̂D̂Q̂ᵀ is unchanged. LAPACK's signs depend on the driver and the machine, and the spectral
/// initialization depends on them (flipping (p̂_i, q̂_i) moves U₀ = P̂D̂^{1/2}W to P̂D̂^{1/2}JW,
/// J = diag(±1)), so the convention makes the initialization a function of T̂ alone (up to
/// rounding when two entries of p̂_i tie in magnitude, or when singular values coincide and the
/// vectors themselves are not unique). It is applied to P̂ because P̂ is shared by T̂ and by
/// T̂O for every orthogonal O (docs/convergence.md §"Exact invariances").
fn fix_signs(mut svd: Svd<f64>) -> Svd<f64> {
    let r = svd.s.len();
    for i in 0..r.min(svd.u.ncols()).min(svd.vt.nrows()) {
        let col = svd.u.column(i);
        let lead = col.iter().copied().fold(
            0.0f64,
            |best, x| if x.abs() > best.abs() { x } else { best },
        );
        if lead < 0.0 {
            svd.u.column_mut(i).mapv_inplace(|x| -x);
            svd.vt.row_mut(i).mapv_inplace(|x| -x);
        }
    }
    svd
}

enum CrossOrM {
    Cross(Array2<f64>),
    M(Array2<f64>),
}

/// The default W₀ = [I_r 0] ∈ ℝ^{r×d} (orthonormal rows when r ≤ d; r > d gives [I_d; 0], which
/// [`spectral_init_with`] rejects).
///
/// Errors: more than [`MAX_ELEMENTS`](super::MAX_ELEMENTS) entries (`arg: "shape"`).
pub fn default_stiefel(r: usize, d: usize) -> Result<Array2<f64>> {
    check_size("shape", r, d)?;
    let mut w = Array2::zeros((r, d));
    for i in 0..r.min(d) {
        w[[i, i]] = 1.0;
    }
    Ok(w)
}

/// The balanced spectral initialization (A₀, B₀) with W₀ = [I_r 0] (see the module docs).
///
/// ```
/// use kappa_optim::convergence::{spectral_init, Moments};
/// let sigma = ndarray::array![[2.0, 0.3], [0.3, 1.0]];
/// let m = ndarray::array![[0.5, -1.0]];
/// let moments = Moments::from_parts(sigma.clone(), m.clone(), 1000)?;
/// let (a, b) = spectral_init(&moments)?;
/// let product = a.dot(&sigma).dot(&b.t()); // AΣ̂Bᵀ = M̂
/// assert!((&product - &m).iter().all(|e| e.abs() < 1e-12));
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
pub fn spectral_init(moments: &Moments) -> Result<(Array2<f64>, Array2<f64>)> {
    let r = moments.t_singular_values().len();
    spectral_init_with(moments, default_stiefel(r, moments.dim())?.view())
}

/// The balanced point (A, B) of the estimated minimiser manifold Ŝ* for a given W ∈ ℝ^{r×d}
/// with orthonormal rows (r = min(k, d)). With oracle moments these are the points of S*.
///
/// Errors: W not r×d, non-finite, or with rows that are not orthonormal (‖WWᵀ − I‖_max > 1e-8).
pub fn spectral_init_with(
    moments: &Moments,
    w: ArrayView2<'_, f64>,
) -> Result<(Array2<f64>, Array2<f64>)> {
    let svd = &moments.t_svd;
    let r = svd.s.len();
    let d = moments.dim();
    check_matrix("w", &w, r, d, "r×d, r = min(k, d)")?;
    let gram = w.dot(&w.t()) - Array2::<f64>::eye(r);
    let off = gram.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    if off > 1e-8 {
        return Err(InputError::invalid(
            "w",
            format!("must have orthonormal rows, max |WWᵀ − I| = {off:e}"),
        )
        .into());
    }
    let root = svd.s.mapv(f64::sqrt);
    let p_root = &svd.u.slice(s![.., ..r]) * &root.view().insert_axis(Axis(0));
    let u = p_root.dot(&w);
    let root_qt = &svd.vt.slice(s![..r, ..]) * &root.view().insert_axis(Axis(1));
    let v = w.t().dot(&root_qt);
    moments.unwhiten(u.view(), v.view())
}
