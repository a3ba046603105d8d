//! kappa-optim: optimizers for the geometry of attention training.
//!
//! Muon and manifold Muon (Stiefel and diagonal-Gram constraints), written once against
//! kappa-linalg's matrix trait so they update `ndarray` matrices and `tch` tensors alike, and the
//! preconditioned gradient descent with spectral initialization of *Training Dynamics of Softmax
//! Self-Attention*.
//!
//! This crate is being built (issues 5 and 6); today it only reserves its place in the workspace.
