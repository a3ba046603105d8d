//! `kappa._kappa.Optimizer`: kappa-optim's [`Optimizer`] over Python tensors, and the presets the
//! Python classes start from. The Python package (`kappa/optim.py`) builds the settings of each
//! group as data; this module reads them with the serde forms of kappa-optim's configs, so every
//! option of the Rust API is reachable and named the same way.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Mutex;

use kappa_optim::optimizer::{Group, Grouping, MatrixSpec, Update};
use kappa_optim::{
    AdamWConfig, Admm, DualSolver, Manifold, ManifoldMuonConfig, MuonConfig, Optimizer,
};
use kappa_train::{modulewise_groups_of, ModuleLabel, ModulewiseConfig, Preset, TrainConfig};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use serde::Deserialize;

use crate::bridge::PyTensor;
use crate::error::ToPy;

/// One group's settings, as the Python side writes them (JSON).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupSpec {
    /// The group's name (unique).
    name: String,
    /// `{"muon": MuonConfig}`, `{"manifold": ManifoldMuonConfig}` or `{"adamw": AdamWConfig}`.
    update: UpdateSpec,
    /// The group's rate.
    lr: f64,
    /// How Muon and manifold Muon cut each parameter into matrices (default: the matrix itself).
    #[serde(default)]
    matrix: Option<MatrixSpec>,
    /// Stack same-shape blocks into one batched msign (default: kappa-optim's choice).
    #[serde(default)]
    batch: Option<bool>,
    /// One name per parameter, in the order of the tensors.
    names: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum UpdateSpec {
    Muon(MuonConfig),
    Manifold(ManifoldMuonConfig),
    Adamw(AdamWConfig),
}

impl From<UpdateSpec> for Update {
    fn from(spec: UpdateSpec) -> Self {
        match spec {
            UpdateSpec::Muon(c) => Update::Muon(c),
            UpdateSpec::Manifold(c) => Update::Manifold(c),
            UpdateSpec::Adamw(c) => Update::AdamW(c),
        }
    }
}

/// Reads JSON into `T`, naming the dotted key of a value that does not fit.
pub fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> PyResult<T> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).py()
}

fn group(spec: GroupSpec, params: Vec<PyTensor>) -> PyResult<Group> {
    if spec.names.len() != params.len() {
        return Err(PyValueError::new_err(format!(
            "group `{}`: {} names for {} tensors",
            spec.name,
            spec.names.len(),
            params.len()
        )));
    }
    let mut group = Group::new(spec.name, spec.update.into(), spec.lr);
    if let Some(matrix) = spec.matrix {
        group = group.with_matrix(matrix);
    }
    if let Some(batch) = spec.batch {
        group = group.with_batch(batch);
    }
    Ok(group.with_params(spec.names.into_iter().zip(params.into_iter().map(|p| p.0))))
}

/// kappa-optim's optimizer over tensors shared with Python (no copies: a step writes into the
/// parameters' own storage and reads their `.grad`).
#[pyclass(module = "kappa._kappa", name = "Optimizer", frozen)]
pub struct PyOptimizer {
    /// Locked for each call: a tch tensor may move between threads but not be shared, so a
    /// Python thread that calls the optimizer waits for one already inside it (every method
    /// takes `&self`, so pyo3's own borrow check never refuses a second thread).
    inner: Mutex<Optimizer>,
}

impl PyOptimizer {
    fn new_inner(optimizer: Optimizer) -> Self {
        Self {
            inner: Mutex::new(optimizer),
        }
    }

    /// Runs `f` on the optimizer without the GIL (so a Python thread that waits for the lock
    /// does not hold up the others). A panic inside (a defect in kappa, never an answer to bad
    /// input, which is a typed error) becomes a `RuntimeError` here rather than a
    /// `PanicException` (a `BaseException` that `except Exception` misses); it leaves the lock
    /// poisoned, so every later call says the optimizer is unusable: its state may be
    /// half-updated.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Optimizer) -> PyResult<T> + Send,
    ) -> PyResult<T> {
        let call = AssertUnwindSafe(|| {
            let mut inner = self.inner.lock().map_err(|_| {
                PyRuntimeError::new_err(
                    "the optimizer is unusable: an earlier call into it failed inside kappa; \
                     build a new one and load the last saved state",
                )
            })?;
            f(&mut inner)
        });
        py.detach(|| {
            std::panic::catch_unwind(call).unwrap_or_else(|payload| {
                let what = (payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".to_owned());
                Err(PyRuntimeError::new_err(format!(
                    "kappa's optimizer failed inside ({what}); it cannot be used further"
                )))
            })
        })
    }
}

#[pymethods]
impl PyOptimizer {
    /// `groups`: a JSON list of group settings; `params`: each group's tensors, in order.
    /// Building retracts manifold groups' matrices, so it runs without the GIL.
    #[new]
    fn new(py: Python<'_>, groups: &str, params: Vec<Vec<PyTensor>>) -> PyResult<Self> {
        let specs: Vec<GroupSpec> = from_json(groups)?;
        if specs.len() != params.len() {
            return Err(PyValueError::new_err(format!(
                "{} group settings for {} parameter lists",
                specs.len(),
                params.len()
            )));
        }
        let groups = specs
            .into_iter()
            .zip(params)
            .map(|(spec, params)| group(spec, params))
            .collect::<PyResult<Vec<_>>>()?;
        let optimizer = py.detach(|| Optimizer::new(groups).py())?;
        Ok(Self::new_inner(optimizer))
    }

    /// One step of every group (the GIL is released while it runs).
    fn step(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |o| o.step().py())
    }

    /// `n` steps on the gradients as they are, without returning to Python in between: the
    /// Rust side of the measurement of the Python boundary's cost (python/benches).
    fn step_repeated(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        self.with(py, |o| (0..n).try_for_each(|_| o.step().py()))
    }

    /// Sets every parameter's gradient to None.
    fn zero_grad(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |o| o.zero_grad().py())
    }

    /// Scales the gradients so their global 2-norm is at most `max_norm`; returns the norm.
    fn clip_grad_norm(&self, py: Python<'_>, max_norm: f64) -> PyResult<f64> {
        self.with(py, |o| o.clip_grad_norm(max_norm).py())
    }

    /// Makes the next step check every gradient's entries (after a `clip_grad_norm` whose
    /// finite norm would let it skip them) because the gradients changed since.
    fn recheck_gradients(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |o| {
            o.recheck_gradients();
            Ok(())
        })
    }

    /// Sets a group's rate.
    fn set_lr(&self, py: Python<'_>, group: &str, lr: f64) -> PyResult<()> {
        self.with(py, |o| o.set_lr(group, lr).py())
    }

    /// A group's rate (None for an unknown group).
    fn lr(&self, py: Python<'_>, group: &str) -> PyResult<Option<f64>> {
        self.with(py, |o| Ok(o.lr(group)))
    }

    /// Steps taken.
    #[getter]
    fn steps(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |o| Ok(o.steps()))
    }

    /// Each group's name and its parameters' names.
    fn groups(&self, py: Python<'_>) -> PyResult<Vec<(String, Vec<String>)>> {
        self.with(py, |o| {
            let groups = o.groups().iter();
            Ok(groups
                .map(|g| (g.name().to_owned(), g.names().to_vec()))
                .collect())
        })
    }

    /// The state, as (key, tensor) pairs (kappa-optim's `state_dict` keys).
    fn state_dict(&self, py: Python<'_>) -> PyResult<Vec<(String, PyTensor)>> {
        let state = self.with(py, |o| o.state_dict().py())?;
        Ok(state.into_iter().map(|(k, t)| (k, PyTensor(t))).collect())
    }

    /// Loads a state from `state_dict`, checking all of it before changing anything.
    fn load_state_dict(&self, py: Python<'_>, state: HashMap<String, PyTensor>) -> PyResult<()> {
        let state = state.into_iter().map(|(k, t)| (k, t.0)).collect();
        self.with(py, move |o| o.load_state_dict(&state).py())
    }

    /// Writes the state to a safetensors file (atomically).
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        self.with(py, |o| o.save(&path).py())
    }

    /// Reads the state from a safetensors file written by `save`.
    fn load(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        self.with(py, |o| o.load(&path).py())
    }
}

/// A Muon preset as JSON: `keller`, `torch` or `paper`.
#[pyfunction]
pub fn muon_config(preset: &str) -> PyResult<String> {
    let config = match preset {
        "keller" => MuonConfig::keller(),
        "torch" => MuonConfig::torch(),
        "paper" => MuonConfig::paper(),
        other => return Err(unknown("Muon preset", other, "keller, torch, paper")),
    };
    serde_json::to_string(&config).py()
}

/// Manifold Muon's paper settings on `manifold` (`stiefel`, `dgram`, `oblique`) as JSON, with
/// the tangent problem solved by `solver`: `ascent` (the paper's dual ascent) or `admm`
/// (kappa-optim's `Admm::standard`).
#[pyfunction]
#[pyo3(signature = (manifold, solver = "ascent"))]
pub fn manifold_config(manifold: &str, solver: &str) -> PyResult<String> {
    let manifold = match manifold {
        "stiefel" => Manifold::Stiefel,
        "dgram" => Manifold::dgram(),
        "oblique" => Manifold::Oblique,
        other => return Err(unknown("manifold", other, "stiefel, dgram, oblique")),
    };
    let solver = match solver {
        "ascent" => DualSolver::Ascent,
        "admm" => DualSolver::Admm(Admm::standard()),
        other => return Err(unknown("solver", other, "ascent, admm")),
    };
    let config = ManifoldMuonConfig {
        solver,
        ..ManifoldMuonConfig::paper(manifold)
    };
    serde_json::to_string(&config).py()
}

/// An AdamW preset as JSON: `torch` (weight decay 0.01) or `adam` (none).
#[pyfunction]
pub fn adamw_config(preset: &str) -> PyResult<String> {
    let config = match preset {
        "torch" => AdamWConfig::torch(),
        "adam" => AdamWConfig::adam(),
        other => return Err(unknown("AdamW preset", other, "torch, adam")),
    };
    serde_json::to_string(&config).py()
}

pub fn unknown(what: &str, got: &str, allowed: &str) -> PyErr {
    PyValueError::new_err(format!("unknown {what} `{got}` (one of: {allowed})"))
}

/// The groups `Grouping::muon_adamw` places named parameters in: `(group, names)` for `muon`,
/// `adamw` and `adamw_no_decay` (kappa-optim's rules, so Python and Rust place alike).
#[pyfunction]
pub fn muon_adamw_groups(named: Vec<(String, PyTensor)>) -> PyResult<Vec<(String, Vec<String>)>> {
    let grouping = Grouping::muon_adamw(MuonConfig::torch(), AdamWConfig::torch(), 1.0);
    let groups = grouping
        .assign(named.into_iter().map(|(n, t)| (n, t.0)))
        .py()?;
    Ok(groups
        .iter()
        .map(|g| (g.name().to_owned(), g.names().to_vec()))
        .collect())
}

/// The label kappa's GPT naming gives the parameter `name` (`attention_qkv`, `attention_out`,
/// `mlp_in`, `mlp_out`, `embedding`, `norm_gain`, `bias`; kappa-train's `ModuleLabel::of`,
/// which also reads nanoGPT's names), or None.
#[pyfunction]
pub fn module_label(name: &str) -> PyResult<Option<String>> {
    ModuleLabel::of(name).map(|l| label_name(&l)).transpose()
}

fn label_name(label: &ModuleLabel) -> PyResult<String> {
    match serde_json::to_value(label).py()? {
        serde_json::Value::String(s) => Ok(s),
        other => Err(PyRuntimeError::new_err(format!(
            "label serialized as {other}"
        ))),
    }
}

/// The module-wise settings of the manifold paper for `preset` (`UNCONSTRAINED`, `ALL-STIEFEL`,
/// `ALL-DGRAM`, `HETERO`, `HETERO-INV`) as JSON: kappa-train's `ModulewiseConfig::paper`.
#[pyfunction]
pub fn modulewise_config(preset: &str) -> PyResult<String> {
    let preset: Preset =
        serde_json::from_value(serde_json::Value::String(preset.into())).map_err(|_| {
            unknown(
                "module-wise preset",
                preset,
                "UNCONSTRAINED, ALL-STIEFEL, ALL-DGRAM, HETERO, HETERO-INV",
            )
        })?;
    serde_json::to_string(&ModulewiseConfig::paper(preset)).py()
}

/// One group of a module-wise optimizer as Python sees it: name, algorithm (`muon`,
/// `manifold`, `adamw`), geometry (`muon`, `stiefel`, `dgram`, `oblique`, `adamw`), peak rate,
/// parameter names.
type GroupInfo = (String, &'static str, String, f64, Vec<String>);

/// The optimizer kappa-train's `modulewise_groups_of` builds for the named tensors, each with
/// its label (`labels[i]` for `named[i]`), under the module-wise `config` (JSON of
/// `ModulewiseConfig`); AdamW groups take `adamw = (lr, beta1, beta2, eps, weight_decay)`.
/// Returns the optimizer and its groups.
#[pyfunction]
pub fn modulewise_optimizer(
    py: Python<'_>,
    named: Vec<(String, PyTensor)>,
    labels: Vec<String>,
    config: &str,
    adamw: (f64, f64, f64, f64, f64),
) -> PyResult<(PyOptimizer, Vec<GroupInfo>)> {
    if labels.len() != named.len() {
        return Err(PyValueError::new_err(format!(
            "{} labels for {} parameters",
            labels.len(),
            named.len()
        )));
    }
    let mut by_name = HashMap::new();
    for ((name, _), label) in named.iter().zip(&labels) {
        let parsed: ModuleLabel = serde_json::from_value(serde_json::Value::String(label.clone()))
            .map_err(|_| {
                unknown(
                    &format!("module label of `{name}`"),
                    label,
                    "attention_qkv, attention_out, mlp_in, mlp_out, embedding, norm_gain, bias",
                )
            })?;
        by_name.insert(name.clone(), parsed);
    }
    let config: ModulewiseConfig = from_json(config)?;
    let (lr, beta1, beta2, eps, weight_decay) = adamw;
    let train = TrainConfig {
        lr,
        min_lr: 0.0,
        beta1,
        beta2,
        eps,
        weight_decay,
        ..TrainConfig::default()
    };
    let named = named.into_iter().map(|(n, t)| (n, t.0)).collect();
    let groups =
        modulewise_groups_of(named, &config, &train, |n, _| by_name.get(n).copied()).py()?;
    let infos = groups.iter().map(group_info).collect();
    let optimizer = py.detach(|| Optimizer::new(groups).py())?;
    Ok((PyOptimizer::new_inner(optimizer), infos))
}

fn group_info(g: &Group) -> GroupInfo {
    let algorithm = match g.update() {
        Update::Muon(_) => "muon",
        Update::Manifold(_) => "manifold",
        Update::AdamW(_) => "adamw",
    };
    let geometry = g.update().name().to_lowercase();
    (
        g.name().to_owned(),
        algorithm,
        geometry,
        g.lr(),
        g.names().to_vec(),
    )
}
