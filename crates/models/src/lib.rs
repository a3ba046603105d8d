//! kappa-models: transformers on libtorch through `tch`.
//!
//! Attention modules with spectral conditioning, GPT and ViT, data loaders for the data sets that
//! `cargo xtask setup` installs, and the training loop every experiment uses (issue 7). Today the
//! crate holds the device selection every model will use, and its tests prove that `tch` links
//! against the libtorch that setup installed.

pub mod device;

pub use device::{parse_device, ModelsError};
