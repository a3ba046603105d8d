//! The integration tests of Muon and manifold Muon: the testable claims listed in docs/optim.md, "Properties → tests"
//! as proptest properties, backend agreement (feature `tch`) and the error contract. One binary,
//! one module per topic; case counts are bounded (16–32) so the suite runs in seconds in release.

mod muon {
    pub mod admm;
    #[cfg(feature = "tch")]
    pub mod batched;
    pub mod common;
    pub mod errors;
    pub mod manifold;
    #[cfg(feature = "tch")]
    pub mod manifold_batched;
    pub mod msign;
    pub mod oblique;
    pub mod optimizer;
    #[cfg(feature = "tch")]
    pub mod tch_backend;
    pub mod variants;
}
