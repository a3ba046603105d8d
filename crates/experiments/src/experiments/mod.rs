//! The experiments, one module each.

pub mod convergence;
pub mod optim_geometry;
pub mod random_spectra;
pub mod theory;
