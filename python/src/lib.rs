//! The extension module `kappa._kappa` behind the Python package `kappa` (python/kappa): kappa's
//! optimizers, linear algebra and attention diagnostics on the `torch.Tensor`s of the PyTorch
//! that imports it, sharing their storage.
//!
//! Built with maturin (`python/pyproject.toml`); it links the libtorch of that PyTorch, so
//! `import torch` must run first (the package's `__init__.py` does). Errors arrive as Python
//! exceptions carrying kappa's message (the `error` module).

mod attention;
mod bridge;
mod error;
mod linalg;
mod optim;

use pyo3::prelude::*;

/// The module's contents; the Python package re-exports them under `kappa.optim`,
/// `kappa.linalg` and `kappa.attention`.
#[pymodule]
fn _kappa(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<optim::PyOptimizer>()?;
    m.add_function(wrap_pyfunction!(optim::muon_config, m)?)?;
    m.add_function(wrap_pyfunction!(optim::manifold_config, m)?)?;
    m.add_function(wrap_pyfunction!(optim::adamw_config, m)?)?;
    m.add_function(wrap_pyfunction!(optim::muon_adamw_groups, m)?)?;
    m.add_function(wrap_pyfunction!(optim::module_label, m)?)?;
    m.add_function(wrap_pyfunction!(optim::modulewise_config, m)?)?;
    m.add_function(wrap_pyfunction!(optim::modulewise_optimizer, m)?)?;
    m.add_function(wrap_pyfunction!(linalg::msign, m)?)?;
    m.add_function(wrap_pyfunction!(linalg::msign_config, m)?)?;
    m.add_function(wrap_pyfunction!(linalg::polar_express_coefficients, m)?)?;
    m.add_function(wrap_pyfunction!(linalg::condition_number, m)?)?;
    m.add_function(wrap_pyfunction!(linalg::condition_number_estimate, m)?)?;
    attention::register(m)?;
    Ok(())
}
