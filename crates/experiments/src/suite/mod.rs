//! The suite: the experiments, one module each (`kappa_experiments::suite::<name>`), in
//! the order of [`crate::registry()`].

pub mod bert_sentiment;
pub mod convergence;
pub mod gpt_sotu;
pub mod lambda_readings;
pub mod lra;
pub mod manifolds;
pub mod optim_geometry;
pub mod optimizer_race;
pub mod random_spectra;
pub mod scaling;
pub mod theory;
pub mod vit_fmnist;
