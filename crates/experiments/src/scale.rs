//! The sizes an experiment runs at ([`Scale`]: `smoke`, `cpu`, `long`, `gpu`, `paper`; every
//! experiment has all but `long`, which only some have), defined in kappa-cli with the rest of
//! the `reproduce` command line and re-exported here.

pub use kappa_cli::Scale;
