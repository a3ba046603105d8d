//! The finite-context softmax attention layer, its empirical loss and exact gradients, chunked
//! over queries.
//!
//! For a context (keys = values) X_k ∈ ℝ^{d×n_k}, value matrix A ∈ ℝ^{k×d} and key-query matrix
//! B ∈ ℝ^{d×d}, the layer maps a query q ∈ ℝ^d to
//!
//! ```text
//! f_θ(q) = A X_k softmax(X_kᵀ Bᵀ q),      score_i(q) = qᵀ B x_i      (docs/convergence.md, §The model)
//! ```
//!
//! and its limit as n_k → ∞ is A Σ Bᵀ q ([`PopulationProblem`](super::PopulationProblem)).
//! For queries X_q ∈ ℝ^{d×n_q} with labels Y ∈ ℝ^{k×n_q} (docs/convergence.md, §Empirical loss; all column-wise):
//!
//! ```text
//! S = X_kᵀ Bᵀ X_q,  P = column-softmax(S),  Z = X_k P,  R = A Z − Y,   L̂ = ‖R‖_F²/(2n_q)
//! ∇_A L̂ = R Zᵀ / n_q
//! H = X_kᵀ Aᵀ R,    G = P ⊙ H − P ⊙ (1·colsum(P ⊙ H))          (softmax Jacobian, per column)
//! ∇_B L̂ = X_q Gᵀ X_kᵀ / n_q
//! ```
//!
//! Derivation of ∇_B: ∂L̂/∂p_j = X_kᵀAᵀr_j/n_q = h_j/n_q; the softmax Jacobian is diag(p) − ppᵀ,
//! so ∂L̂/∂s_j = (p_j ⊙ h_j − p_j (p_jᵀh_j))/n_q = g_j/n_q; and ∂S_ij/∂B = q_j x_iᵀ, hence
//! ∇_B = Σ_j q_j (X_k g_j)ᵀ / n_q.
//!
//! **Memory and parallelism.** Nothing n_k × n_q is ever formed: each query is processed on its
//! own with two scratch vectors of length n_k (scores/weights and H's column), queries are cut
//! into chunks of [`DEFAULT_QUERY_CHUNK`] that rayon processes in parallel (respecting
//! `RAYON_NUM_THREADS`), and the per-chunk partial sums are added in chunk order, so the result
//! does not depend on the number of threads. Memory is O(d·(n_k + n_q) + threads·n_k); time is
//! about 4·d·n_k·n_q multiply-adds and n_k·n_q exponentials per gradient.
//!
//! **Context modes** (docs/convergence.md, §Empirical loss; which one the paper uses is unknown, so all are offered):
//! see [`ContextMode`]. The in-context reading (prompts sharing M, docs/convergence.md §The model) is
//! [`EmpiricalProblem::from_prompts`]: each prompt is its own context and queries, the loss is
//! averaged over every query of every prompt.

use std::ops::Range;

use kappa_linalg::input::InputError;
use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::data::Sample;
use super::LossGrad;
use crate::error::{check_matrix, check_output, check_output_scalar, shape_str, Result};

/// Queries per parallel task.
pub const DEFAULT_QUERY_CHUNK: usize = 128;

/// Which training covariates are keys and which are queries in the empirical loss L̂_n.
///
/// Reconstruction (docs/convergence.md, §Empirical loss): "self-attention over the training covariates" leaves open whether
/// a query sees its own covariate (a logit x_jᵀBx_j biased upward) and whether keys and queries
/// come from disjoint halves. All three readings are settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextMode {
    /// Every covariate is a query and attends over all n covariates, itself included.
    SelfIncluded,
    /// Every covariate is a query and attends over the other n − 1 (its own logit is masked).
    SelfExcluded,
    /// The first ⌈n/2⌉ covariates are the keys, the remaining ⌊n/2⌋ are the queries.
    SplitKeys,
}

/// One context with its queries and labels.
#[derive(Clone, Debug)]
struct Episode {
    /// d×n_k, standard layout (row t holds coordinate t of every key, contiguous).
    keys: Array2<f64>,
    /// d×n_q.
    queries: Array2<f64>,
    /// k×n_q.
    labels: Array2<f64>,
    /// Which logits are masked.
    mask: KeyMask,
}

/// Which logits of a context are masked out of the softmax (for
/// [`EmpiricalProblem::from_context`]).
#[derive(Clone, Debug, PartialEq)]
pub enum KeyMask {
    /// Every query attends to every key.
    None,
    /// Query j does not attend to key j (needs n_q ≤ n_k; with queries = keys this is
    /// [`ContextMode::SelfExcluded`]).
    SelfExcluded,
    /// `masked[[i, j]]` = true masks key i out of query j's softmax (n_k×n_q). Every query must
    /// keep at least one key.
    Custom(Array2<bool>),
}

impl KeyMask {
    fn masked(&self, i: usize, j: usize) -> bool {
        match self {
            KeyMask::None => false,
            KeyMask::SelfExcluded => i == j,
            KeyMask::Custom(m) => m[[i, j]],
        }
    }
}

/// The empirical objective L̂_n(A, B) = (1/2N) Σ_queries ‖y_j − f_θ(x_j)‖² over one or more
/// contexts (N = total number of queries).
#[derive(Clone, Debug)]
pub struct EmpiricalProblem {
    episodes: Vec<Episode>,
    d: usize,
    k: usize,
    queries: usize,
    chunk: usize,
}

fn check_mask(mask: &KeyMask, n_k: usize, n_q: usize) -> Result<()> {
    let bad = |reason: String| Err(InputError::invalid("mask", reason).into());
    match mask {
        KeyMask::None => Ok(()),
        KeyMask::SelfExcluded if n_q > n_k => bad(format!(
            "SelfExcluded pairs query j with key j, so it needs n_q ≤ n_k, found {n_q} > {n_k}"
        )),
        KeyMask::SelfExcluded if n_k < 2 => bad("SelfExcluded needs at least 2 keys".into()),
        KeyMask::SelfExcluded => Ok(()),
        KeyMask::Custom(m) if m.dim() != (n_k, n_q) => bad(format!(
            "must be n_k×n_q = {}, found {}",
            shape_str(n_k, n_q),
            shape_str(m.nrows(), m.ncols())
        )),
        KeyMask::Custom(m) => match m.columns().into_iter().position(|c| c.iter().all(|&x| x)) {
            Some(j) => bad(format!("query {j} has every key masked")),
            None => Ok(()),
        },
    }
}

fn episode(sample: &Sample, mode: ContextMode) -> Result<Episode> {
    let n = sample.len();
    match mode {
        ContextMode::SelfIncluded | ContextMode::SelfExcluded => {
            if mode == ContextMode::SelfExcluded && n < 2 {
                return Err(InputError::invalid(
                    "sample",
                    "self-excluded attention needs at least 2 samples",
                )
                .into());
            }
            Ok(Episode {
                keys: sample.x().to_owned(),
                queries: sample.x().to_owned(),
                labels: sample.y().to_owned(),
                mask: if mode == ContextMode::SelfExcluded {
                    KeyMask::SelfExcluded
                } else {
                    KeyMask::None
                },
            })
        }
        ContextMode::SplitKeys => {
            if n < 2 {
                return Err(
                    InputError::invalid("sample", "split keys need at least 2 samples").into(),
                );
            }
            let (keys, queries) = sample.split(n.div_ceil(2))?;
            Ok(Episode {
                keys: keys.x().to_owned(),
                queries: queries.x().to_owned(),
                labels: queries.y().to_owned(),
                mask: KeyMask::None,
            })
        }
    }
}

impl EmpiricalProblem {
    /// The supervised reading: one training set, self-attention over its covariates.
    ///
    /// Errors: fewer than 2 samples for [`ContextMode::SelfExcluded`] or [`ContextMode::SplitKeys`].
    pub fn new(sample: &Sample, mode: ContextMode) -> Result<Self> {
        Self::from_prompts(std::slice::from_ref(sample), mode)
    }

    /// The in-context reading: several prompts sharing M, each attending over its own covariates.
    ///
    /// Errors: no prompt; prompts of different d or k; a prompt too small for `mode`.
    pub fn from_prompts(prompts: &[Sample], mode: ContextMode) -> Result<Self> {
        let first = prompts
            .first()
            .ok_or_else(|| InputError::invalid("prompts", "needs at least one prompt"))?;
        let (d, k) = (first.dim(), first.outputs());
        let mut episodes = Vec::with_capacity(prompts.len());
        for p in prompts {
            if (p.dim(), p.outputs()) != (d, k) {
                return Err(InputError::shape_mismatch(
                    "prompts",
                    format!("d = {d}, k = {k} in every prompt"),
                    format!("d = {}, k = {}", p.dim(), p.outputs()),
                )
                .into());
            }
            episodes.push(episode(p, mode)?);
        }
        let queries = episodes.iter().map(|e| e.queries.ncols()).sum();
        Ok(Self {
            episodes,
            d,
            k,
            queries,
            chunk: DEFAULT_QUERY_CHUNK,
        })
    }

    /// One context from its parts: keys X_k (d×n_k, also the values), queries X_q (d×n_q), labels
    /// Y (k×n_q) and a [`KeyMask`]. [`EmpiricalProblem::new`] is this with X_k, X_q read off a
    /// sample by a [`ContextMode`].
    ///
    /// Errors: an empty `keys` or `queries`, or no label rows (`ShapeMismatch`); `queries` or
    /// `labels` with the wrong shape, a non-finite entry; a mask of the wrong shape, a
    /// [`KeyMask::SelfExcluded`] with n_q > n_k, or a query with every key masked
    /// (`arg: "mask"`).
    ///
    /// ```
    /// use kappa_optim::convergence::{EmpiricalProblem, KeyMask};
    /// let keys = ndarray::array![[1.0, -0.5, 0.3], [0.2, 0.4, -1.0]];
    /// let queries = ndarray::array![[0.1, 0.7], [-0.3, 0.2]];
    /// let labels = ndarray::array![[0.5, -0.1]];
    /// let mask = KeyMask::Custom(ndarray::array![[true, false], [false, false], [false, true]]);
    /// let problem = EmpiricalProblem::from_context(keys, queries, labels, mask)?;
    /// assert_eq!(problem.num_queries(), 2);
    /// # Ok::<(), kappa_optim::OptimError>(())
    /// ```
    pub fn from_context(
        keys: Array2<f64>,
        queries: Array2<f64>,
        labels: Array2<f64>,
        mask: KeyMask,
    ) -> Result<Self> {
        let (d, n_k) = keys.dim();
        let n_q = queries.ncols();
        if d == 0 || n_k == 0 || n_q == 0 || labels.nrows() == 0 {
            return Err(InputError::shape_mismatch(
                if d == 0 || n_k == 0 {
                    "keys"
                } else if n_q == 0 {
                    "queries"
                } else {
                    "labels"
                },
                "non-empty d×n_k keys, d×n_q queries and k×n_q labels (k ≥ 1)",
                format!(
                    "keys {}, queries {}, labels {}",
                    shape_str(d, n_k),
                    shape_str(queries.nrows(), n_q),
                    shape_str(labels.nrows(), labels.ncols())
                ),
            )
            .into());
        }
        check_matrix("keys", &keys.view(), d, n_k, "d×n_k")?;
        check_matrix("queries", &queries.view(), d, n_q, "d×n_q, d = keys' rows")?;
        check_matrix(
            "labels",
            &labels.view(),
            labels.nrows(),
            n_q,
            "k×n_q, one column per query",
        )?;
        check_mask(&mask, n_k, n_q)?;
        let k = labels.nrows();
        Ok(Self {
            episodes: vec![Episode {
                keys: keys.as_standard_layout().into_owned(),
                queries,
                labels,
                mask,
            }],
            d,
            k,
            queries: n_q,
            chunk: DEFAULT_QUERY_CHUNK,
        })
    }

    /// The same problem with another number of queries per parallel task (≥ 1). The result does
    /// not depend on it beyond rounding; tests use it to cross chunk boundaries.
    pub fn with_query_chunk(mut self, chunk: usize) -> Result<Self> {
        if chunk == 0 {
            return Err(InputError::invalid("chunk", "must be at least 1").into());
        }
        self.chunk = chunk;
        Ok(self)
    }

    /// d.
    pub fn dim(&self) -> usize {
        self.d
    }

    /// k.
    pub fn outputs(&self) -> usize {
        self.k
    }

    /// N, the number of queries the loss averages over.
    pub fn num_queries(&self) -> usize {
        self.queries
    }

    fn check(&self, a: &ArrayView2<'_, f64>, b: &ArrayView2<'_, f64>) -> Result<()> {
        check_matrix("a", a, self.k, self.d, "k×d")?;
        check_matrix("b", b, self.d, self.d, "d×d")
    }

    /// L̂_n(A, B).
    ///
    /// Errors: A not k×d, B not d×d, a non-finite entry.
    pub fn loss(&self, a: ArrayView2<'_, f64>, b: ArrayView2<'_, f64>) -> Result<f64> {
        Ok(self.evaluate(a, b, false)?.loss)
    }

    /// L̂_n(A, B), its exact gradients, and the largest softmax weight over all queries.
    ///
    /// ```
    /// use kappa_optim::convergence::{ContextMode, EmpiricalProblem, Sample};
    /// let x = ndarray::array![[1.0, -0.5, 0.3], [0.2, 0.4, -1.0]];
    /// let y = ndarray::array![[0.7, -0.1, 0.2]];
    /// let problem = EmpiricalProblem::new(&Sample::new(x, y)?, ContextMode::SelfExcluded)?;
    /// let (a, b) = (ndarray::array![[0.5, -0.2]], ndarray::Array2::eye(2));
    /// let out = problem.loss_grad(a.view(), b.view())?;
    /// assert!(out.loss > 0.0 && out.grad_b.dim() == (2, 2));
    /// # Ok::<(), kappa_optim::OptimError>(())
    /// ```
    pub fn loss_grad(&self, a: ArrayView2<'_, f64>, b: ArrayView2<'_, f64>) -> Result<LossGrad> {
        self.evaluate(a, b, true)
    }

    fn evaluate(
        &self,
        a: ArrayView2<'_, f64>,
        b: ArrayView2<'_, f64>,
        grad: bool,
    ) -> Result<LossGrad> {
        self.check(&a, &b)?;
        let mut total = Partial::zeros(self.k, self.d);
        for ep in &self.episodes {
            let part = run_episode(
                &a,
                &b,
                ep,
                if grad { Pass::Grad } else { Pass::Loss },
                self.chunk,
            );
            total.add(&part);
        }
        let scale = 1.0 / self.queries as f64;
        let args = "a, b (or the sample)";
        check_output_scalar("the loss", args, total.loss)?;
        check_output_scalar("the softmax weights", args, total.max_weight)?;
        check_output("grad_a", args, &total.ga.view())?;
        check_output("grad_b", args, &total.gb.view())?;
        Ok(LossGrad {
            loss: total.loss * scale,
            grad_a: total.ga * scale,
            grad_b: total.gb * scale,
            max_weight: Some(total.max_weight),
        })
    }
}

/// The layer's outputs f_θ(q_j) = A X_k softmax(X_kᵀBᵀq_j) for queries X_q (d×n_q), as k×n_q.
///
/// Errors: shapes that do not fit (A k×d, B d×d, context d×n_k, queries d×n_q), an empty context,
/// a non-finite entry.
///
/// ```
/// use kappa_optim::convergence::attend;
/// let context = ndarray::array![[1.0, -1.0], [0.0, 0.0]];
/// let (a, b) = (ndarray::array![[1.0, 0.0]], ndarray::Array2::zeros((2, 2)));
/// // B = 0: uniform weights, the output is A times the context mean (0).
/// let out = attend(a.view(), b.view(), context.view(), ndarray::array![[3.0], [1.0]].view())?;
/// assert!(out[[0, 0]].abs() < 1e-15);
/// # Ok::<(), kappa_optim::OptimError>(())
/// ```
pub fn attend(
    a: ArrayView2<'_, f64>,
    b: ArrayView2<'_, f64>,
    context: ArrayView2<'_, f64>,
    queries: ArrayView2<'_, f64>,
) -> Result<Array2<f64>> {
    let ep = probe_episode(&a, &b, context, queries, None)?;
    let part = run_episode(&a, &b, &ep, Pass::Predict, DEFAULT_QUERY_CHUNK);
    let z = part.z.unwrap_or_else(|| Array2::zeros((a.ncols(), 0)));
    let out = a.dot(&z);
    check_output("the outputs", "a, b, context, queries", &out.view())?;
    Ok(out)
}

/// The finite-context excess risk estimate (1/n_q) Σ_j ½‖f_θ(q_j) − M q_j‖² over test queries
/// q_j ~ N(0, Σ) that attend over `context` (the training covariates): the excess test risk of
/// the layer itself rather than of its limit (docs/convergence.md, §Error definitions). Unbiased for the excess over the noise
/// floor ½kσ² given the context.
///
/// Errors: as [`attend`], and M not k×d.
pub fn finite_context_excess(
    a: ArrayView2<'_, f64>,
    b: ArrayView2<'_, f64>,
    context: ArrayView2<'_, f64>,
    queries: ArrayView2<'_, f64>,
    m: ArrayView2<'_, f64>,
) -> Result<f64> {
    let ep = probe_episode(&a, &b, context, queries, Some(m))?;
    let n_q = ep.queries.ncols();
    let part = run_episode(&a, &b, &ep, Pass::Loss, DEFAULT_QUERY_CHUNK);
    check_output_scalar(
        "the excess",
        "a, b, context, queries, m",
        part.loss / n_q as f64,
    )
}

fn probe_episode(
    a: &ArrayView2<'_, f64>,
    b: &ArrayView2<'_, f64>,
    context: ArrayView2<'_, f64>,
    queries: ArrayView2<'_, f64>,
    m: Option<ArrayView2<'_, f64>>,
) -> Result<Episode> {
    let (k, d) = a.dim();
    if k == 0 || d == 0 {
        return Err(
            InputError::shape_mismatch("a", "a non-empty k×d matrix", shape_str(k, d)).into(),
        );
    }
    check_matrix("a", a, k, d, "k×d")?;
    check_matrix("b", b, d, d, "d×d, d = a's columns")?;
    if context.ncols() == 0 || queries.ncols() == 0 {
        return Err(InputError::shape_mismatch(
            "context",
            "at least one key and one query",
            format!(
                "context {}, queries {}",
                shape_str(context.nrows(), context.ncols()),
                shape_str(queries.nrows(), queries.ncols())
            ),
        )
        .into());
    }
    check_matrix("context", &context, d, context.ncols(), "d×n_k")?;
    check_matrix("queries", &queries, d, queries.ncols(), "d×n_q")?;
    let labels = match m {
        Some(m) => {
            check_matrix("m", &m, k, d, "k×d")?;
            m.dot(&queries)
        }
        None => Array2::zeros((k, queries.ncols())),
    };
    Ok(Episode {
        keys: context.as_standard_layout().into_owned(),
        queries: queries.to_owned(),
        labels,
        mask: KeyMask::None,
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Loss,
    Grad,
    Predict,
}

struct Partial {
    loss: f64,
    ga: Array2<f64>,
    gb: Array2<f64>,
    max_weight: f64,
    /// Attention averages X_k p_j as columns (Predict only).
    z: Option<Array2<f64>>,
}

impl Partial {
    fn zeros(k: usize, d: usize) -> Self {
        Self {
            loss: 0.0,
            ga: Array2::zeros((k, d)),
            gb: Array2::zeros((d, d)),
            max_weight: 0.0,
            z: None,
        }
    }

    fn add(&mut self, other: &Partial) {
        self.loss += other.loss;
        self.ga += &other.ga;
        self.gb += &other.gb;
        self.max_weight = self.max_weight.max(other.max_weight);
    }
}

/// Σ a_i b_i with four accumulators (vectorizes; the order is fixed, so results are reproducible).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..4 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// y ← y + α x.
fn axpy(alpha: f64, x: &[f64], y: &mut [f64]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

fn run_episode(
    a: &ArrayView2<'_, f64>,
    b: &ArrayView2<'_, f64>,
    ep: &Episode,
    pass: Pass,
    chunk: usize,
) -> Partial {
    let (k, d) = a.dim();
    let n_q = ep.queries.ncols();
    // v_j = Bᵀ q_j, so score_i(q_j) = v_jᵀ x_i.
    let vq = b.t().dot(&ep.queries);
    let starts: Vec<usize> = (0..n_q).step_by(chunk.max(1)).collect();
    let parts: Vec<Partial> = starts
        .into_par_iter()
        .map(|lo| chunk_pass(a, ep, &vq, lo..(lo + chunk).min(n_q), pass, k, d))
        .collect();
    let mut total = Partial::zeros(k, d);
    let mut zs = Vec::new();
    for p in &parts {
        total.add(p);
        if let Some(z) = &p.z {
            zs.push(z.view());
        }
    }
    if pass == Pass::Predict {
        total.z = ndarray::concatenate(ndarray::Axis(1), &zs).ok();
    }
    total
}

fn chunk_pass(
    a: &ArrayView2<'_, f64>,
    ep: &Episode,
    vq: &Array2<f64>,
    range: Range<usize>,
    pass: Pass,
    k: usize,
    d: usize,
) -> Partial {
    let n_k = ep.keys.ncols();
    // Episode keys are in standard layout, so every row is a contiguous slice.
    let rows: Vec<&[f64]> = ep
        .keys
        .rows()
        .into_iter()
        .map(|r| r.to_slice().unwrap_or(&[]))
        .collect();
    let mut out = Partial::zeros(k, d);
    let mut p = vec![0.0f64; n_k];
    let mut h = vec![0.0f64; if pass == Pass::Grad { n_k } else { 0 }];
    let mut z = vec![0.0f64; d];
    let mut w = vec![0.0f64; d];
    let mut zcols = if pass == Pass::Predict {
        Some(Array2::zeros((d, range.len())))
    } else {
        None
    };
    for (col, j) in range.clone().enumerate() {
        // Scores s_i = v_jᵀ x_i, then a max-shifted softmax.
        p.iter_mut().for_each(|x| *x = 0.0);
        for (t, row) in rows.iter().enumerate() {
            axpy(vq[[t, j]], row, &mut p);
        }
        for (i, x) in p.iter_mut().enumerate() {
            if ep.mask.masked(i, j) {
                *x = f64::NEG_INFINITY;
            }
        }
        let mx = p.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut total = 0.0;
        for x in p.iter_mut() {
            *x = (*x - mx).exp();
            total += *x;
        }
        let inv = 1.0 / total;
        p.iter_mut().for_each(|x| *x *= inv);
        // The largest weight is exp(0)/total.
        out.max_weight = out.max_weight.max(inv);
        for (t, row) in rows.iter().enumerate() {
            z[t] = dot(&p, row);
        }
        if let Some(zc) = zcols.as_mut() {
            for t in 0..d {
                zc[[t, col]] = z[t];
            }
            continue;
        }
        // r = A z − y_j.
        let mut r = vec![0.0f64; k];
        let mut rr = 0.0;
        for (o, ro) in r.iter_mut().enumerate() {
            let mut v = -ep.labels[[o, j]];
            for t in 0..d {
                v += a[[o, t]] * z[t];
            }
            *ro = v;
            rr += v * v;
        }
        out.loss += 0.5 * rr;
        if pass != Pass::Grad {
            continue;
        }
        for (o, ro) in r.iter().enumerate() {
            for (t, zt) in z.iter().enumerate() {
                out.ga[[o, t]] += ro * zt;
            }
        }
        // w = Aᵀr, h_i = wᵀx_i, g_i = p_i (h_i − wᵀz), u = Σ_i g_i x_i, ∇_B += q_j uᵀ.
        let mut wz = 0.0;
        for t in 0..d {
            w[t] = (0..k).map(|o| a[[o, t]] * r[o]).sum();
            wz += w[t] * z[t];
        }
        h.iter_mut().for_each(|x| *x = 0.0);
        for (t, row) in rows.iter().enumerate() {
            axpy(w[t], row, &mut h);
        }
        for (hi, pi) in h.iter_mut().zip(&p) {
            *hi = pi * (*hi - wz);
        }
        for (i, x) in h.iter_mut().enumerate() {
            if ep.mask.masked(i, j) {
                *x = 0.0;
            }
        }
        for (t, row) in rows.iter().enumerate() {
            let u = dot(&h, row);
            for s in 0..d {
                out.gb[[s, t]] += ep.queries[[s, j]] * u;
            }
        }
    }
    out.z = zcols;
    out
}
