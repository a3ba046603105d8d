//! The three sizes every experiment has ([`Scale`]), defined in kappa-cli with the rest of the
//! `reproduce` command line and re-exported here.

pub use kappa_cli::Scale;
