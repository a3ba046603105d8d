//! The integration tests of kappa-linalg: proptest properties of every theorem-like claim, backend
//! agreement (feature `tch`) and bad-input errors. One binary, one module per topic.

mod properties {
    pub mod aol;
    pub mod bad_input;
    pub mod common;
    pub mod cond;
    pub mod exp;
    pub mod gram_newton_schulz;
    pub mod iterative;
    pub mod kron;
    pub mod matrix_ops;
    pub mod newton_schulz;
    pub mod polar_express;
    pub mod products;
    pub mod psd;
    pub mod svd;
    pub mod symmetric_products;
    #[cfg(feature = "tch")]
    pub mod tch_backend;
}
