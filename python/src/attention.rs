//! `kappa.attention`: one head's exact weight Jacobian and its matrix-free products, Theorem
//! 3.4's bound, the SVD and λ·I_k corrections, and the attention diagnostics, on torch tensors.
//!
//! The head is A(X) = softmax(X W_Q (X W_K)ᵀ / s) X W_V with X ∈ ℝ^{N×D} and W ∈ ℝ^{D×k}; the
//! computations run in f64 on copies of the inputs (kappa-attention's ndarray code), and
//! results come back as f64 tensors. Vectorization is column-major, as in kappa-attention: the
//! Jacobian's row i + c·N is output entry A[i, c], its column d + e·D (+ D·k per block, in the
//! order Q, K, V) weight entry W[d, e].

use kappa_attention::{
    attention_diagnostics, theorem_3_4, AttentionOptions, Forward, IdentityShift, Kappa,
    ScoreScale, SelfAttention, SvdCorrection, SATURATION_THRESHOLD,
};
use ndarray::Array2;
use ndarray::Axis;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tch::{Kind, Tensor};

use crate::bridge::{empty_huge, f64_matrix_mut, PyTensor};
use crate::error::ToPy;
use crate::linalg::matrix;

/// The score scale s: `"one"` (s = 1, the paper's form), `"inv_sqrt_k"` (s = √k) or a number.
#[derive(FromPyObject)]
pub enum ScoreScaleArg {
    Name(String),
    Value(f64),
}

impl ScoreScaleArg {
    fn score_scale(&self) -> PyResult<ScoreScale> {
        match self {
            ScoreScaleArg::Name(n) if n == "one" => Ok(ScoreScale::One),
            ScoreScaleArg::Name(n) if n == "inv_sqrt_k" => Ok(ScoreScale::InvSqrtK),
            ScoreScaleArg::Name(n) => Err(crate::optim::unknown(
                "score scale",
                n,
                "one, inv_sqrt_k, a number",
            )),
            ScoreScaleArg::Value(s) => Ok(ScoreScale::Custom(*s)),
        }
    }
}

/// The forward pass of one head on copies of the inputs.
fn forward(
    x: &PyTensor,
    w: [&PyTensor; 3],
    scale: &ScoreScaleArg,
    causal: bool,
) -> PyResult<Forward<f64>> {
    let x = matrix(&x.0, "x")?;
    let [wq, wk, wv] = [(w[0], "wq"), (w[1], "wk"), (w[2], "wv")].map(|(t, n)| matrix(&t.0, n));
    let options = AttentionOptions {
        scale: scale.score_scale()?,
        causal,
    };
    let head = SelfAttention::new(wq?, wk?, wv?, options).py()?;
    head.forward(x.view()).py()
}

/// An f64 tensor of `a`'s values (copied in row-major order whatever `a`'s layout).
fn tensor(a: Array2<f64>) -> PyResult<PyTensor> {
    let a = a.as_standard_layout().into_owned();
    Tensor::try_from(a).map(PyTensor).py()
}

/// J = ∂vec A/∂[vec W_Q; vec W_K; vec W_V], an (N·k) × (3·D·k) f64 tensor.
#[pyfunction]
#[pyo3(signature = (x, wq, wk, wv, scale = ScoreScaleArg::Name("one".into()), causal = false))]
fn weight_jacobian(
    py: Python<'_>,
    x: PyTensor,
    wq: PyTensor,
    wk: PyTensor,
    wv: PyTensor,
    scale: ScoreScaleArg,
    causal: bool,
) -> PyResult<PyTensor> {
    let fwd = forward(&x, [&wq, &wk, &wv], &scale, causal)?;
    let (nk, dk) = block_shape(&fwd, 3)?;
    let mut full = empty_huge(&[nk as i64, 3 * dk as i64], Kind::Double)?;
    let view = f64_matrix_mut(&mut full)?;
    let (q, rest) = view.split_at(Axis(1), dk);
    let (k, v) = rest.split_at(Axis(1), dk);
    py.detach(|| fwd.jacobian_weights_into_views([q, k, v]))
        .py()?;
    Ok(PyTensor(full))
}

/// The blocks (J_Q, J_K, J_V) of J, each (N·k) × (D·k): the form to use when the full J is
/// beyond kappa's dense limit (2²⁸ entries), e.g. N = 197, D = 192, k = 64.
#[pyfunction]
#[pyo3(signature = (x, wq, wk, wv, scale = ScoreScaleArg::Name("one".into()), causal = false))]
fn weight_jacobian_blocks(
    py: Python<'_>,
    x: PyTensor,
    wq: PyTensor,
    wk: PyTensor,
    wv: PyTensor,
    scale: ScoreScaleArg,
    causal: bool,
) -> PyResult<(PyTensor, PyTensor, PyTensor)> {
    let fwd = forward(&x, [&wq, &wk, &wv], &scale, causal)?;
    let (nk, dk) = block_shape(&fwd, 1)?;
    let empty = || empty_huge(&[nk as i64, dk as i64], Kind::Double);
    let (mut q, mut k, mut v) = (empty()?, empty()?, empty()?);
    let views = [
        f64_matrix_mut(&mut q)?,
        f64_matrix_mut(&mut k)?,
        f64_matrix_mut(&mut v)?,
    ];
    py.detach(|| fwd.jacobian_weights_into_views(views)).py()?;
    Ok((PyTensor(q), PyTensor(k), PyTensor(v)))
}

/// (N·k, D·k) for a forward pass, refused (ValueError naming the size) when `blocks` such blocks
/// side by side exceed kappa's dense limit, [`kappa_linalg::MAX_DENSE_ENTRIES`] entries.
fn block_shape(fwd: &Forward<f64>, blocks: usize) -> PyResult<(usize, usize)> {
    let (n, d, k) = fwd.dims();
    let (nk, dk) = (n * k, d * k);
    let entries = nk.checked_mul(dk).and_then(|e| e.checked_mul(blocks));
    match entries {
        Some(e) if e <= kappa_linalg::MAX_DENSE_ENTRIES => Ok((nk, dk)),
        _ => Err(PyValueError::new_err(format!(
            "the Jacobian's {blocks} block(s) of {nk}×{dk} exceed kappa's dense limit of {} \
             entries{}",
            kappa_linalg::MAX_DENSE_ENTRIES,
            if blocks > 1 {
                "; use weight_jacobian_blocks"
            } else {
                ""
            }
        ))),
    }
}

/// J·t for the tangent t = (dW_Q, dW_K, dW_V) without forming J: an N×k tensor.
#[pyfunction]
#[pyo3(signature = (x, wq, wk, wv, dwq, dwk, dwv, scale = ScoreScaleArg::Name("one".into()), causal = false))]
#[allow(clippy::too_many_arguments)]
fn jvp_weights(
    py: Python<'_>,
    x: PyTensor,
    wq: PyTensor,
    wk: PyTensor,
    wv: PyTensor,
    dwq: PyTensor,
    dwk: PyTensor,
    dwv: PyTensor,
    scale: ScoreScaleArg,
    causal: bool,
) -> PyResult<PyTensor> {
    let fwd = forward(&x, [&wq, &wk, &wv], &scale, causal)?;
    let (dq, dk, dv) = (
        matrix(&dwq.0, "dwq")?,
        matrix(&dwk.0, "dwk")?,
        matrix(&dwv.0, "dwv")?,
    );
    tensor(
        py.detach(|| fwd.jvp_weights(dq.view(), dk.view(), dv.view()))
            .py()?,
    )
}

/// Jᵀ·g for an N×k cotangent g without forming J: (dW_Q, dW_K, dW_V), each D×k.
#[pyfunction]
#[pyo3(signature = (x, wq, wk, wv, g, scale = ScoreScaleArg::Name("one".into()), causal = false))]
#[allow(clippy::too_many_arguments)]
fn vjp_weights(
    py: Python<'_>,
    x: PyTensor,
    wq: PyTensor,
    wk: PyTensor,
    wv: PyTensor,
    g: PyTensor,
    scale: ScoreScaleArg,
    causal: bool,
) -> PyResult<(PyTensor, PyTensor, PyTensor)> {
    let fwd = forward(&x, [&wq, &wk, &wv], &scale, causal)?;
    let g = matrix(&g.0, "g")?;
    let w = py.detach(|| fwd.vjp_weights(g.view())).py()?;
    Ok((tensor(w.q)?, tensor(w.k)?, tensor(w.v)?))
}

fn kappa_dict<'py>(py: Python<'py>, k: &Kappa) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kappa", k.kappa)?;
    d.set_item("pseudo_kappa", k.pseudo_kappa)?;
    d.set_item("rank", k.rank)?;
    d.set_item("full_rank", k.full_rank)?;
    d.set_item("sigma_max", k.sigma_max)?;
    d.set_item("sigma_min", k.sigma_min)?;
    Ok(d)
}

/// Theorem 3.4 on one head: κ(J) against its bound
/// rhs = κ(X)³ κ⁺(Λ) κ(W_V) (κ(W_Q) + κ(W_K)) + κ(X) κ(P). A dict with the factors (`kappa_x`, `kappa_wq`, `kappa_wk`, `kappa_wv`,
/// `pseudo_kappa_lambda`, `rank_lambda`, `kappa_p`), `rhs`, `holds`, `ratio` (κ(J)/rhs),
/// `block_rhs`, and `jacobian`: the κ of J and of its Q, K, V blocks (`full`, `q`, `k`, `v`).
#[pyfunction]
#[pyo3(name = "theorem_3_4", signature = (x, wq, wk, wv, scale = ScoreScaleArg::Name("one".into()), causal = false))]
fn theorem_3_4_bound<'py>(
    py: Python<'py>,
    x: PyTensor,
    wq: PyTensor,
    wk: PyTensor,
    wv: PyTensor,
    scale: ScoreScaleArg,
    causal: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let fwd = forward(&x, [&wq, &wk, &wv], &scale, causal)?;
    let t = py.detach(|| theorem_3_4(&fwd)).py()?;
    let d = PyDict::new(py);
    d.set_item("kappa_x", t.kappa_x)?;
    d.set_item("kappa_wq", t.kappa_wq)?;
    d.set_item("kappa_wk", t.kappa_wk)?;
    d.set_item("kappa_wv", t.kappa_wv)?;
    d.set_item("pseudo_kappa_lambda", t.pseudo_kappa_lambda)?;
    d.set_item("rank_lambda", t.rank_lambda)?;
    d.set_item("kappa_p", t.kappa_p)?;
    d.set_item("rhs", t.rhs)?;
    d.set_item("block_rhs", t.block_rhs.to_vec())?;
    d.set_item("holds", t.holds())?;
    d.set_item("ratio", t.ratio())?;
    let j = PyDict::new(py);
    j.set_item("full", kappa_dict(py, &t.jacobian.full)?)?;
    j.set_item("q", kappa_dict(py, &t.jacobian.q)?)?;
    j.set_item("k", kappa_dict(py, &t.jacobian.k)?)?;
    j.set_item("v", kappa_dict(py, &t.jacobian.v)?)?;
    d.set_item("jacobian", j)?;
    Ok(d)
}

/// The exact correction C = σ_max(W)·U Vᵀ of W (Theorem 3.5): W + C has κ(W + C) =
/// (2σ_max)/(σ_max + σ_min). Returns C (f64).
#[pyfunction]
fn svd_correction(py: Python<'_>, w: PyTensor) -> PyResult<PyTensor> {
    let w = matrix(&w.0, "w")?;
    let c = py.detach(|| SvdCorrection::new(w.view()).map(|c| c.matrix().to_owned()));
    tensor(c.py()?)
}

/// λ·E, the D×k block identity at row `offset` scaled by λ (Theorem 3.8's cheap correction):
/// W + λ·E shifts each σ(W) by at most λ (Weyl). Returns λ·E (f64).
#[pyfunction]
#[pyo3(signature = (d, k, lam, offset = 0))]
fn identity_shift(d: usize, k: usize, lam: f64, offset: usize) -> PyResult<PyTensor> {
    let shift = IdentityShift::at_offset(lam, offset).py()?;
    tensor(shift.matrix::<f64>(d, k).py()?)
}

/// Attention diagnostics of one head's probabilities `p` (N×N, rows summing to 1) and scores:
/// `mean_entropy`, `uniform_entropy`, `max_logit`, `saturated_fraction` (rows whose largest
/// probability exceeds `threshold`), `mean_diagonal`, `mean_softmax_jacobian_frobenius`,
/// `entropy_per_row`.
#[pyfunction]
#[pyo3(signature = (p, scores, causal = false, threshold = SATURATION_THRESHOLD))]
fn diagnostics<'py>(
    py: Python<'py>,
    p: PyTensor,
    scores: PyTensor,
    causal: bool,
    threshold: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let (p, scores) = (matrix(&p.0, "p")?, matrix(&scores.0, "scores")?);
    if p.dim() != scores.dim() {
        return Err(PyValueError::new_err(format!(
            "p is {:?} and scores {:?}: they must have one shape",
            p.dim(),
            scores.dim()
        )));
    }
    let a =
        (py.detach(|| attention_diagnostics(p.view(), scores.view(), causal, threshold))).py()?;
    let d = PyDict::new(py);
    d.set_item("mean_entropy", a.mean_entropy)?;
    d.set_item("uniform_entropy", a.uniform_entropy)?;
    d.set_item("max_logit", a.max_logit)?;
    d.set_item("saturated_fraction", a.saturated_fraction)?;
    d.set_item("saturation_threshold", a.saturation_threshold)?;
    d.set_item("mean_diagonal", a.mean_diagonal)?;
    d.set_item(
        "mean_softmax_jacobian_frobenius",
        a.mean_softmax_jacobian_frobenius,
    )?;
    d.set_item("entropy_per_row", a.entropy_per_row)?;
    Ok(d)
}

/// Adds the attention functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(weight_jacobian, m)?)?;
    m.add_function(wrap_pyfunction!(weight_jacobian_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(jvp_weights, m)?)?;
    m.add_function(wrap_pyfunction!(vjp_weights, m)?)?;
    m.add_function(wrap_pyfunction!(theorem_3_4_bound, m)?)?;
    m.add_function(wrap_pyfunction!(svd_correction, m)?)?;
    m.add_function(wrap_pyfunction!(identity_shift, m)?)?;
    m.add_function(wrap_pyfunction!(diagnostics, m)?)?;
    m.add("SATURATION_THRESHOLD", SATURATION_THRESHOLD)?;
    Ok(())
}
