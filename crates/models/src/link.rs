//! libtorch before any other BLAS in the process's symbol lookup order.
//!
//! libtorch_cpu exports the Fortran BLAS and LAPACK names (`sgemm_`, `dgemm_`, `dgesdd_`, …)
//! that wrap its MKL, and calls them through the dynamic linker like any other library. The
//! system OpenBLAS (which kappa-linalg links for ndarray) exports the same names. Whichever
//! library comes first among the executable's needed libraries wins every such call, libtorch's
//! own included: when OpenBLAS came first, every libtorch matmul ran on OpenBLAS. Naming
//! libtorch_cpu here puts it among kappa-models' native libraries, which the linker places
//! before those of everything kappa-models depends on (kappa-linalg, openblas-src), so in any
//! binary that uses kappa-models libtorch_cpu precedes OpenBLAS and keeps its own GEMMs. The
//! Fortran LAPACK calls of kappa-linalg then resolve to libtorch's too (one LAPACK per process);
//! the CBLAS calls of ndarray (`cblas_*`, which libtorch does not export) stay with OpenBLAS.
//! `tests/blas_binding.rs` checks the bindings.

#[link(name = "torch_cpu", kind = "dylib")]
extern "C" {}
