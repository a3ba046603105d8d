#![doc = include_str!("../README.md")]
//!
//! # Principal items
//!
//! | module | items |
//! |---|---|
//! | [`error`] | [`OptimError`], [`Result`]: the crate's one error enum; bad input is [`OptimError::Input`], carrying kappa-linalg's [`InputError`] (re-exported) |
//! | [`adamw`] | [`AdamW`], [`AdamWConfig`] (presets `torch`, `adam`), [`AdamWState`]; with `tch`: `AdamW::step_tensors`, `AdamWKernel` |
//! | [`schedule`] | [`WarmupCosine`]: linear warmup, then cosine, as a factor of each group's peak lr |
//! | [`muon`] | [`Muon`], [`MuonConfig`] (presets `keller`, `paper`; options NorMuon and cautious weight decay), [`MuonState`], [`UpdateScale`], [`Layout`] |
//! | `batched` (with `tch`) | `Muon::step_batch`, `Muon::step_batch_scaled`: same-shape tensors stepped with one batched Newton–Schulz call; `ManifoldMuon::step_batch`: their dual ascents in lock step |
//! | `optimizer` (with `tch`) | `Optimizer` over a model's parameters: `Grouping` and `Rule` (groups by name patterns and rank; `Grouping::muon_adamw`, the default split), `Group`, `Update`, `step`, `zero_grad`, schedules, `state_dict`/`save`/`load`; `MatrixSpec` (dimension numbers, split sizes, heads) |
//! | [`normuon`] | [`NorMuon`], [`NeuronAxis`]: NorMuon's per-neuron second moment |
//! | [`elementwise`] | [`Elementwise`]: the row-wise and masked operations of Muon's variants, on both backends |
//! | [`manifold`] | [`ManifoldMuon`], [`ManifoldMuonConfig`] (preset `paper`), [`ManifoldState`], [`Manifold`], [`DGramRetraction`], [`DualAscent`], [`DualReport`] |
//! | [`msign`](mod@msign) | [`msign()`], [`Msign`]: the exact polar factor, Muon's quintic (with the reference's and torch's normalizations), Polar Express (the paper's or a generated schedule), AOL-preconditioned Polar Express; the last two also as Gram Newton–Schulz |
//! | [`layout`] | [`Layout`]: which axis of a stored weight is fan-in (`OutIn`, `InOut`) |
//! | [`momentum`] | [`Momentum`], [`MomentumKind`] (EMA and SGD forms, Nesterov) |
//! | [`qk_clip`] | [`QkClipConfig`] (τ, α), [`HeadFactors`], [`clip_rows`], [`fused_qkv_row_factors`], [`scale_rows`]: Kimi K2's QK-clip on row blocks of any `Matrix` |
//! | [`precision`] | [`Precision`], [`WorkingPrecision`], [`cpu_has_native_bf16`] (msign's precision per device) |
//! | `fused` (with `tch`) | one-pass CPU f32 kernels: AdamW's update, Muon's momentum, `sum_of_squares` (the clipping norm) |
//! | [`convergence`] | [`DataModel`](convergence::DataModel), [`Sample`](convergence::Sample), [`EmpiricalProblem`](convergence::EmpiricalProblem), [`PopulationProblem`](convergence::PopulationProblem), [`Moments`](convergence::Moments), [`spectral_init`](convergence::spectral_init), [`Descent`](convergence::Descent), [`Settings`](convergence::Settings) |
//!
//! The convergence code is `f64` on `ndarray`, on top of `kappa-linalg` (PSD square roots, SVD, κ).

pub mod adamw;
#[cfg(feature = "tch")]
pub mod batched;
pub mod convergence;
pub mod elementwise;
pub mod error;
#[cfg(feature = "tch")]
pub mod fused;
pub mod layout;
pub mod manifold;
pub mod momentum;
pub mod msign;
pub mod muon;
pub mod normuon;
#[cfg(feature = "tch")]
pub mod optimizer;
pub mod precision;
pub mod qk_clip;
pub mod schedule;

#[cfg(feature = "tch")]
pub use adamw::AdamWKernel;
pub use adamw::{AdamW, AdamWConfig, AdamWState};
pub use elementwise::Elementwise;
pub use error::{OptimError, Result};
/// kappa-linalg's input error, the payload of the `Input` variant of this crate's error.
pub use kappa_linalg::input::InputError;
pub use layout::Layout;
pub use manifold::{
    Admm, DGramRetraction, DualAscent, DualReport, DualSolver, Manifold, ManifoldMuon,
    ManifoldMuonConfig, ManifoldState, ManifoldStep, OnDivergence, TangentSolution,
};
pub use momentum::{Momentum, MomentumKind, MomentumState};
pub use msign::{msign, Msign, MUON_REFERENCE_EPS, TORCH_MUON_EPS};
pub use muon::{Muon, MuonConfig, MuonState, MuonStep, UpdateScale};
pub use normuon::{NeuronAxis, NorMuon, NORMUON_EPS};
#[cfg(feature = "tch")]
pub use optimizer::{Group, Grouping, Optimizer, Rule, Update};
pub use precision::{cpu_has_native_bf16, Precision, WorkingPrecision};
pub use qk_clip::{clip_rows, fused_qkv_row_factors, scale_rows, HeadFactors, QkClipConfig};
pub use schedule::WarmupCosine;
