//! The experiments, one module each.

pub mod convergence;
pub mod gpt_sotu;
pub mod manifolds;
pub mod optim_geometry;
pub mod random_spectra;
pub mod theory;
pub mod vit_fmnist;
