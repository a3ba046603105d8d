//! `kappa.linalg`: msign (every schedule), the Polar Express generator and condition numbers on
//! torch tensors.

use kappa_linalg::{IterativeOptions, PolarExpressSpec, SafetyRule};
use kappa_optim::{Msign, Precision};
use ndarray::{Array2, ArrayD, Ix2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tch::{Device, Kind, Tensor};

use crate::bridge::PyTensor;
use crate::error::ToPy;
use crate::optim::{from_json, unknown};

/// The named msign presets, each one of kappa-optim's `Msign` constructors.
const MSIGN_PRESETS: &str = "exact, muon_quintic, muon_reference, torch_muon, polar_express, \
     modded_nanogpt, gram_polar_express, aol, gram_aol, aol_three_steps, gram_aol_three_steps";

/// An `Msign` from a preset name or its JSON form (`{"polar_express": {"steps": 8}}`).
pub fn parse_msign(method: &str) -> PyResult<Msign> {
    Ok(match method {
        "exact" => Msign::Exact,
        "muon_quintic" => Msign::MuonQuintic,
        "muon_reference" => Msign::muon_reference(),
        "torch_muon" => Msign::torch_muon(),
        "polar_express" => Msign::polar_express(),
        "modded_nanogpt" => Msign::modded_nanogpt(),
        "gram_polar_express" => Msign::gram_polar_express(),
        "aol" => Msign::aol(),
        "gram_aol" => Msign::gram_aol(),
        // The `_short` names are the former ones, still accepted.
        "aol_three_steps" | "aol_short" => Msign::aol_three_steps(),
        "gram_aol_three_steps" | "gram_aol_short" => Msign::gram_aol_three_steps(),
        json if json.trim_start().starts_with(['{', '"']) => from_json(json)?,
        other => return Err(unknown("msign", other, MSIGN_PRESETS)),
    })
}

/// The JSON form of an msign preset (the Python side edits it into a variant of its own).
#[pyfunction]
pub fn msign_config(method: &str) -> PyResult<String> {
    serde_json::to_string(&parse_msign(method)?).py()
}

fn parse_precision(precision: &str) -> PyResult<Precision> {
    serde_json::from_value(serde_json::Value::String(precision.to_owned()))
        .map_err(|_| unknown("precision", precision, "auto, native, f32, bf16"))
}

/// msign(x) = U·Vᵀ of a matrix, or of each matrix of a stack (leading dimensions are batch).
#[pyfunction]
#[pyo3(signature = (x, method = "polar_express", precision = "auto"))]
pub fn msign(py: Python<'_>, x: PyTensor, method: &str, precision: &str) -> PyResult<PyTensor> {
    let (method, precision) = (parse_msign(method)?, parse_precision(precision)?);
    let x = x.0;
    let size = x.size();
    if size.len() < 2 || size.contains(&0) {
        return Err(PyValueError::new_err(format!(
            "msign needs a matrix or a stack of matrices with no empty dimension, got a tensor \
             of shape {size:?}"
        )));
    }
    let one = |m: &Tensor| kappa_optim::msign(m, method, precision).py();
    py.detach(move || {
        let _guard = tch::no_grad_guard();
        if size.len() == 2 {
            return one(&x).map(PyTensor);
        }
        let (rows, cols) = (size[size.len() - 2], size[size.len() - 1]);
        let stack = x.f_reshape([-1, rows, cols]).py()?;
        let slices = (0..stack.size()[0])
            .map(|i| one(&stack.f_get(i).py()?))
            .collect::<PyResult<Vec<_>>>()?;
        let stacked = Tensor::f_stack(&slices, 0).and_then(|t| t.f_reshape(&size));
        Ok(PyTensor(stacked.py()?))
    })
}

/// The coefficients (a, b, c) of each step p(x) = a·x + b·x³ + c·x⁵ of a Polar Express
/// schedule designed for singular values in [lower, 1].
#[pyfunction]
#[pyo3(signature = (lower, steps, safety = 1.0, cushion = kappa_linalg::POLAR_EXPRESS_CUSHION, rule = "in_design", degree = 5))]
pub fn polar_express_coefficients(
    lower: f64,
    steps: usize,
    safety: f64,
    cushion: f64,
    rule: &str,
    degree: usize,
) -> PyResult<Vec<(f64, f64, f64)>> {
    let rule = match rule {
        "in_design" => SafetyRule::InDesign,
        "after_design" => SafetyRule::AfterDesign,
        other => return Err(unknown("safety rule", other, "in_design, after_design")),
    };
    let spec = PolarExpressSpec {
        lower,
        degree,
        steps,
        safety,
        rule,
        cushion,
    };
    let design = spec.design().py()?;
    Ok(design
        .schedule
        .steps
        .iter()
        .map(|p| (p.a, p.b, p.c))
        .collect())
}

/// A matrix as an f64 ndarray (a copy: the SVD-based quantities run in f64 on the CPU).
pub fn matrix(x: &Tensor, arg: &str) -> PyResult<Array2<f64>> {
    let cpu = x
        .f_to_device(Device::Cpu)
        .and_then(|t| t.f_to_kind(Kind::Double))
        .py()?;
    let array: ArrayD<f64> = (&cpu)
        .try_into()
        .map_err(|e| PyValueError::new_err(format!("{arg}: {e}")))?;
    let dims = array.shape().to_vec();
    array.into_dimensionality::<Ix2>().map_err(|_| {
        PyValueError::new_err(format!(
            "{arg} must be a matrix, got a tensor of shape {dims:?}"
        ))
    })
}

/// κ(A) = σ₁/σ_min(m,n) by the SVD (+∞ below full numerical rank).
#[pyfunction]
pub fn condition_number(py: Python<'_>, a: PyTensor) -> PyResult<f64> {
    let a = matrix(&a.0, "a")?;
    py.detach(|| kappa_linalg::condition_number(a.view())).py()
}

/// κ(A) by power iteration on AᵀA and inverse iteration (no SVD): a dict with `kappa`,
/// `sigma_max`, `sigma_min`, `iterations`, `converged`, `residual`, `error_estimate`.
#[pyfunction]
#[pyo3(signature = (a, tol = 1e-3, max_iter = 300, seed = 0))]
pub fn condition_number_estimate<'py>(
    py: Python<'py>,
    a: PyTensor,
    tol: f64,
    max_iter: usize,
    seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let a = matrix(&a.0, "a")?;
    let opts = IterativeOptions {
        tol,
        max_iter,
        seed,
        ..Default::default()
    };
    let e = py
        .detach(|| kappa_linalg::condition_number_estimate(a.view(), opts))
        .py()?;
    let out = PyDict::new(py);
    out.set_item("kappa", e.kappa)?;
    out.set_item("sigma_max", e.sigma_max)?;
    out.set_item("sigma_min", e.sigma_min)?;
    out.set_item("iterations", e.iterations)?;
    out.set_item("converged", e.converged)?;
    out.set_item("residual", e.residual)?;
    out.set_item("error_estimate", e.error_estimate)?;
    Ok(out)
}
