//! The experiments, one module each.

pub mod random_spectra;
pub mod theory;
