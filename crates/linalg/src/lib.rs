#![doc = include_str!("../README.md")]
//!
//! # Principal items
//!
//! | module | items |
//! |---|---|
//! | [`error`] | [`LinalgError`], [`Result`], [`MAX_DENSE_ENTRIES`] — every entry point validates its input; bad input is [`LinalgError::Input`] |
//! | [`input`] | [`InputError`] and the input checks (`check_matrix`, `check_shape`, `check_vector`, `check_range`, …) that kappa-attention and kappa-optim use too |
//! | [`matrix`] | [`Matrix`], the backend trait (`ndarray::Array2<f32 \| f64>`; `tch::Tensor` with the `tch` feature) |
//! | [`svd`] | [`singular_values`], [`svd_thin`], [`svd_full`], [`polar_factor`] (zero σ ↦ 1), [`matrix_sign`] (zero σ ↦ 0), [`SvdDriver`], [`Svd`] |
//! | [`cond`] | [`condition_number`], [`pseudo_condition_number`], [`numerical_rank`], [`conditioning`], [`RankTolerance`] |
//! | [`iterative`] | [`sigma_max_power`], [`sigma_min_inverse`], [`condition_number_estimate`], [`MAX_ITERATIONS`] |
//! | [`newton_schulz`](mod@newton_schulz) | [`newton_schulz_muon`], [`newton_schulz_cubic`], [`newton_schulz()`], [`newton_schulz_normed`] (on a [`Normed`] matrix: the same bits without the first passes), [`NsSchedule`], [`MAX_NS_STEPS`] |
//! | `batched` (with `tch`) | `newton_schulz_batched` (a [B, m, n] tensor of same-shape matrices, each step one `bmm` and two `baddbmm` for the batch; per slice the result of `newton_schulz` to rounding), `newton_schulz_batched_normed` (the same with the slice norms known, `NormedBatch`), `to_bf16_batch_normed` (an f32 batch to bf16 with the slice norms, one read; `_from` for slices the caller writes), `newton_schulz_each` (the same on a list of matrices) |
//! | [`gram_newton_schulz`](mod@gram_newton_schulz) | [`gram_newton_schulz()`] (the same schedules on r×r Gram matrices, restarted every [`GRAM_NS_RESTART`] steps) |
//! | [`polar_express`](mod@polar_express) | [`PolarExpressSpec`], [`polar_express_schedule`], [`PolarExpressDesign`] (the greedy minimax schedule generator with its predicted error bands), [`SafetyRule`] (how the safety factor enters: the public generator's rule or the paper's run-time table's), [`POLAR_EXPRESS_CUSHION`] |
//! | [`aol`] | [`aol_newton_schulz`] (Turbo-Muon: AOL rescaling D·X in place of ‖X‖_F, then a schedule; computes msign(D·X)), [`aol_gram_newton_schulz`] (the same as Gram Newton–Schulz), [`NsSchedule::turbo_muon`], [`TURBO_MUON_COEFFICIENTS`], [`NsSchedule::aol_three_steps`] (3 designed steps) |
//! | [`psd`] | [`psd_sqrt`], [`psd_inv_sqrt`] |
//! | [`exp`](mod@exp) | [`exp::exp_in_place`] (e^x of a slice on the CPU's vector units, < 1.13 ulp, the same bits on every CPU) |
//! | [`kron`](mod@kron) | [`vec()`], [`unvec`], [`kron()`], [`kron_matvec`], [`commutation_matrix`], [`Commutation`] |
//! | [`product`] | [`product::mat_mul`], [`product::mat_mul_into`]: general products on faer's kernels, picked from the CPU's features at run time (drop-in for ndarray's `dot` and `general_mat_mul`; the bits do not depend on the thread count) |
//! | [`syrk`] | the symmetric products behind [`Matrix::gram`] and [`Matrix::gram_add`] (BLAS `?syrk`: half a general product's flops, an exactly symmetric result) |
//! | [`scalar`] | [`Real`] (`f32`, `f64`), [`scalar::max_abs_entry`], [`scalar::sum_of_squares`] (in f64 lanes, a fixed order; `sums_of_squares_to_bf16` also converts to bf16 in the same read) and the exact power-of-two rescaling behind the scale safety below |
//! | [`threads`] | [`threads::init_global_pool`] (rayon's pool as kappa's binaries set it up: pinned when it has a worker per CPU), [`threads::Pinning`], [`threads::pinned_pool_builder`] |
//! | `tch_backend` (with `tch`) | `impl Matrix for tch::Tensor`, `tensor_from_array`, `array_from_tensor`, `slice_frobenius_norms` (‖Xᵢ‖_F of every slice of a [B, m, n] tensor), `to_bf16_normed` (a CPU f32 tensor to bf16 with the norms of both, one read), `bf16_with_sums_of_squares` (that conversion on slices) |
//! | [`blas`] | [`blas_report`]: the OpenBLAS kernel this process runs (upgraded from a generic fallback); [`cpu_model`] |
//! | `mkl` (with `tch`, Linux) | `mkl_dispatch` (the code path libtorch's MKL takes), `mkl_intel_path!` (a binary's opt-in to MKL's feature-based kernels on AMD CPUs) |
//!
//! # Conventions
//!
//! * Element types: `f32` and `f64` on `ndarray` (generic over [`Real`]); `f32`, `bf16` and `f64`
//!   on `tch`. Computation happens in the input's precision.
//! * The κ rule: κ(A) = σ₁/σ_k (k = min(m, n)) when A has full numerical rank, and +∞ (a value,
//!   not an error) otherwise; see [`cond`].
//! * Vectorization is column-major: vec(A M B) = (Bᵀ ⊗ A) vec(M); see [`kron`](mod@kron).
//! * General products on `ndarray` run on faer's kernels ([`product`]); symmetric products
//!   ([`syrk`]) and LAPACK (SVD, QR, eigendecomposition, through `ndarray-linalg`) on the system
//!   OpenBLAS by default (feature `openblas-system`). On `tch` tensors every operation is
//!   libtorch's, in the tensor's own kind and on its device.
//!
//! # Bad input and scale safety
//!
//! Every public entry point returns a [`LinalgError`] or a documented value — it never panics,
//! never runs without end and never aborts on allocation. Errors name the caller's parameter
//! as written in the signature, and the first bad argument in signature order is the one
//! reported (see [`error`] for the whole contract). Any memory layout an `ArrayView2` can have
//! (column-major, strided, negative strides) is accepted: LAPACK gets a standard-layout copy.
//!
//! Finite input of any magnitude is valid input. The SVD, QR, eigendecomposition, the
//! iterations, Newton–Schulz's normalization and `kron_matvec` run on copies rescaled exactly by
//! powers of two (max |a_ij| into [0.5, 1)), so nothing over- or underflows between subnormal
//! entries and entries near `MAX`; only a returned value that is itself not representable
//! (σ₁ of a matrix with entries near `f64::MAX`, say) is an error,
//! [`LinalgError::Overflow`]. Scale-free results (κ, rank, polar factor, matrix sign,
//! Newton–Schulz) never overflow. A seeded bad-input test (`tests/bad_input_generated.rs`)
//! checks all of this on every entry point.

// Links the system OpenBLAS, which provides the cblas symbols behind ndarray's `blas` feature.
#[cfg(feature = "openblas-system")]
use openblas_src as _;

pub mod aol;
#[cfg(feature = "tch")]
pub mod batched;
pub mod blas;
pub mod cond;
pub mod error;
pub mod exp;
mod exp_element;
pub mod gram_newton_schulz;
pub mod input;
pub mod iterative;
pub mod kron;
pub mod matrix;
#[cfg(all(feature = "tch", target_os = "linux"))]
pub mod mkl;
pub mod newton_schulz;
pub mod polar_express;
pub mod product;
mod product_element;
pub mod psd;
pub mod scalar;
pub mod svd;
pub mod syrk;
#[cfg(feature = "tch")]
pub mod tch_backend;
pub mod threads;

pub use aol::{
    aol_gram_newton_schulz, aol_newton_schulz, AOL_SHORT_LOWER, AOL_SHORT_STEPS,
    TURBO_MUON_COEFFICIENTS, TURBO_MUON_STEPS,
};
#[cfg(feature = "tch")]
pub use batched::{
    newton_schulz_batched, newton_schulz_batched_normed, newton_schulz_each, slices_go_alone,
    NormedBatch,
};
pub use blas::{blas_report, cpu_model, BlasReport, KernelSelection, VectorLevel};
pub use cond::{
    condition_number, condition_number_with, conditioning, conditioning_from_singular_values,
    numerical_rank, pseudo_condition_number, Conditioning, RankTolerance,
};
pub use error::{LinalgError, Result, MAX_DENSE_ENTRIES};
pub use gram_newton_schulz::{gram_newton_schulz, GRAM_NS_RESTART};
pub use input::InputError;
pub use iterative::{
    condition_number_estimate, sigma_max_power, sigma_min_inverse, IterativeOptions, KappaEstimate,
    SigmaEstimate, StopRule, MAX_ITERATIONS,
};
pub use kron::{commutation_matrix, kron, kron_matvec, unvec, vec, Commutation};
pub use matrix::Matrix;
pub use newton_schulz::{
    newton_schulz, newton_schulz_cubic, newton_schulz_muon, newton_schulz_normed, Normed,
    NsSchedule, PolyStep, CUBIC, MAX_NS_STEPS, MUON_BAND, MUON_BAND_THRESHOLD, MUON_QUINTIC,
    POLAR_EXPRESS_COEFFICIENTS, POLAR_EXPRESS_SAFETY,
};
pub use polar_express::{
    odd_polynomial_image, polar_express_schedule, PolarExpressDesign, PolarExpressSpec, SafetyRule,
    POLAR_EXPRESS_CUSHION,
};
pub use psd::{psd_inv_sqrt, psd_sqrt};
pub use scalar::Real;
pub use svd::{matrix_sign, polar_factor, singular_values, svd_full, svd_thin, Svd, SvdDriver};
