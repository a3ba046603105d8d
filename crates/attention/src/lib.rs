//! kappa-attention: softmax attention and the theory of *Spectral Conditioning of Attention*.
//!
//! Single- and multi-head softmax attention on `ndarray`, the exact Jacobians of `vec A` with
//! respect to W_Q, W_K, W_V (Theorem 3.3, column-major), the condition-number bound of
//! Theorem 3.4, the SVD correction of Theorem 3.5 and the λ·I_k correction of Theorem 3.8, and the
//! attention diagnostics (entropy, saturation, largest logit) that training logs.
//!
//! This crate is being built (issue 4); today it only reserves its place in the workspace.
