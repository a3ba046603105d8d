//! Momentum for Muon and manifold Muon, in both forms the references use.
//!
//! With gradient g, buffer B (zero before the first step) and β:
//!
//! | [`MomentumKind`] | buffer | Nesterov input U | plain input U |
//! |---|---|---|---|
//! | `Ema` (Keller's Muon, `torch.optim.Muon`) | B ← β·B + (1−β)·g | (1−β)·g + β·B | B |
//! | `Sgd` (the paper's code) | B ← β·B + g | g + β·B | B |
//!
//! Trap: in steady state (g constant) the SGD buffer tends to g/(1−β) and the EMA buffer to g,
//! so the SGD form's U is about 1/(1−β) = 20× larger than the EMA form's for β = 0.95 (exactly:
//! EMA buffer = (1−β)·SGD buffer at every step, by induction). msign is scale-invariant, so Muon
//! does not care, but manifold Muon's dual ascent does (its step α has a fixed size while the
//! multiplier scales with U; docs/optim.md, "Traps").

use kappa_linalg::input::InputError;
use serde::{Deserialize, Serialize};

use crate::elementwise::Elementwise;
use crate::error::{check_range, from_linalg, Result};
use kappa_linalg::Matrix;

/// Which momentum recursion (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MomentumKind {
    /// Exponential moving average B ← β·B + (1−β)·g (Keller Jordan's Muon, `torch.optim.Muon`).
    Ema,
    /// Heavy-ball sum B ← β·B + g (the paper's code, PyTorch SGD's convention).
    Sgd,
}

/// Momentum settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Momentum {
    /// β ∈ [0, 1).
    pub beta: f64,
    /// The recursion.
    pub kind: MomentumKind,
    /// Use the Nesterov look-ahead input.
    pub nesterov: bool,
}

impl Momentum {
    /// Keller Jordan's Muon: β = 0.95, EMA, Nesterov.
    pub const fn keller() -> Self {
        Self {
            beta: 0.95,
            kind: MomentumKind::Ema,
            nesterov: true,
        }
    }

    /// The paper's code: β = 0.95, SGD sum, Nesterov.
    pub const fn paper() -> Self {
        Self {
            beta: 0.95,
            kind: MomentumKind::Sgd,
            nesterov: true,
        }
    }

    /// No momentum (U = g).
    pub const fn none() -> Self {
        Self {
            beta: 0.0,
            kind: MomentumKind::Sgd,
            nesterov: false,
        }
    }

    /// Checks β ∈ [0, 1).
    pub fn validate(&self) -> Result<()> {
        Ok(check_range(
            "momentum.beta",
            self.beta,
            0.0,
            1.0 - f64::EPSILON,
        )?)
    }

    /// One step: returns the new buffer and the input U for msign, leaving `buffer` untouched
    /// (the caller commits the new buffer only when the whole step succeeds).
    ///
    /// Errors: β outside [0, 1) (argument `momentum.beta`), `grad` empty or non-finite (argument
    /// `grad`), `buffer` of another shape than `grad` or non-finite (argument `buffer`).
    pub fn advance<M: Matrix>(&self, buffer: Option<&M>, grad: &M) -> Result<(M, M)> {
        self.validate()?;
        grad.validate("grad").map_err(from_linalg)?;
        if let Some(b) = buffer {
            if b.shape() != grad.shape() {
                return Err(InputError::shape_mismatch(
                    "buffer",
                    format!("{} (the shape of `grad`)", shape_str(grad.shape())),
                    shape_str(b.shape()),
                )
                .into());
            }
            b.validate("buffer").map_err(from_linalg)?;
        }
        with_input(self.advance_by_operations(buffer, grad)?)
    }

    /// [`Momentum::advance_lean`] for a batch [B, m, n] (`dims`) of CPU f32 gradients whose
    /// Muon input is converted to bf16: the new buffer, and the input already in bf16 with its
    /// norms, from one read of the gradient and buffer ([`crate::fused::momentum_to_bf16`]; the
    /// same values as advancing and then converting). `None` where that kernel does not apply.
    #[cfg(feature = "tch")]
    pub(crate) fn advance_to_bf16(
        &self,
        buffer: Option<&tch::Tensor>,
        grad: &tch::Tensor,
        dims: [i64; 3],
    ) -> Option<(tch::Tensor, kappa_linalg::NormedBatch, Vec<f64>)> {
        let (w_g, beta) = (self.grad_weight(), self.beta);
        crate::fused::momentum_to_bf16(grad, buffer, w_g, beta, self.nesterov, dims)
    }

    /// The weight of g in both recursions: 1 − β (EMA) or 1 (SGD).
    fn grad_weight(&self) -> f64 {
        match self.kind {
            MomentumKind::Ema => 1.0 - self.beta,
            MomentumKind::Sgd => 1.0,
        }
    }

    /// [`Momentum::advance`] on inputs the caller has checked.
    pub(crate) fn advance_unchecked<M: Elementwise>(
        &self,
        buffer: Option<&M>,
        grad: &M,
    ) -> Result<(M, M)> {
        with_input(self.advance_lean(buffer, grad)?)
    }

    /// The lean form of [`Momentum::advance`] on checked inputs: the new buffer and, with
    /// Nesterov, the input U (`None`: U is the new buffer itself, no copy) — in one pass over the
    /// entries where the backend has one ([`Elementwise::momentum_in_one_pass`]: CPU f32
    /// tensors, reading g and B and writing B and U, 4 passes and 2 allocations), else by
    /// [`Momentum::advance_by_operations`]. The same bits either way where libtorch's `axpy`
    /// is a fused multiply-add (its AVX2 and AVX-512 kernels); its generic kernel rounds β·B
    /// apart, one rounding per sum away (docs/optim.md, "Passes per step").
    pub(crate) fn advance_lean<M: Elementwise>(
        &self,
        buffer: Option<&M>,
        grad: &M,
    ) -> Result<(M, Option<M>)> {
        let (w_g, beta) = (self.grad_weight(), self.beta);
        if let Some(done) = grad.momentum_in_one_pass(buffer, w_g, beta, self.nesterov) {
            return Ok(done);
        }
        self.advance_by_operations(buffer, grad)
    }

    /// [`Momentum::advance_lean`] by the `Matrix` trait's operations: the new buffer and, with
    /// Nesterov, the input U (`None`: U is the new buffer itself, no copy). Each entry is
    /// t = fl(w_g·g), then t + β·B and t + β·B_new rounded as the backend's `axpy` rounds
    /// (ndarray: fl(t + fl(β·B)); CPU tensors: libtorch's kernel, a fused multiply-add on AVX2
    /// and AVX-512).
    ///
    /// With N the entries of g, one pass reads or writes N values: t = w_g·g is formed once (a
    /// copy, 2 passes, and a scaling, 2 more, skipped for the SGD form's w_g = 1); the buffer is
    /// t + β·B in new storage (a copy of t and an `axpy`); Nesterov's U reuses t (an `axpy`).
    /// With a 3-pass `axpy` (CPU tensors) Keller's EMA-Nesterov form takes 12 passes and 5
    /// library calls, 2 allocations of the result size. The old buffer is not overwritten, so a
    /// step that fails later (msign of an overflowed U) leaves the state as it was.
    pub(crate) fn advance_by_operations<M: Matrix>(
        &self,
        buffer: Option<&M>,
        grad: &M,
    ) -> Result<(M, Option<M>)> {
        let (b, g_weight) = (self.beta, self.grad_weight());
        let mut t = grad.duplicate()?;
        if g_weight != 1.0 {
            t.scale(g_weight)?;
        }
        let Some(old) = buffer else {
            // B = 0 before the first step: B_new = t, and U = t + β·t for Nesterov.
            if !self.nesterov {
                return Ok((t, None));
            }
            let buf = t.duplicate()?;
            t.axpy(b, &buf)?;
            return Ok((buf, Some(t)));
        };
        if !self.nesterov {
            t.axpy(b, old)?;
            return Ok((t, None));
        }
        let mut buf = t.duplicate()?;
        buf.axpy(b, old)?;
        t.axpy(b, &buf)?;
        Ok((buf, Some(t)))
    }
}

/// (B_new, U) from the lean form's (B_new, U or `None`): U is a copy of B_new without Nesterov.
fn with_input<M: Matrix>((buf, u): (M, Option<M>)) -> Result<(M, M)> {
    let u = match u {
        Some(u) => u,
        None => buf.duplicate()?,
    };
    Ok((buf, u))
}

fn shape_str((r, c): (usize, usize)) -> String {
    crate::error::shape_str(r, c)
}

/// Per-parameter state of Muon and manifold Muon: the momentum buffer (created at the first
/// step) and the number of steps applied. [`MuonState`](crate::MuonState) and
/// [`ManifoldState`](crate::ManifoldState) are this type; keep one per parameter and optimizer.
#[derive(Debug)]
pub struct MomentumState<M> {
    pub(crate) buffer: Option<M>,
    pub(crate) steps: u64,
}

impl<M> Default for MomentumState<M> {
    fn default() -> Self {
        Self {
            buffer: None,
            steps: 0,
        }
    }
}

impl<M> MomentumState<M> {
    /// A fresh state (zero momentum, no steps).
    pub fn new() -> Self {
        Self::default()
    }

    /// Steps applied so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The momentum buffer, once a step has been taken.
    pub fn buffer(&self) -> Option<&M> {
        self.buffer.as_ref()
    }

    /// A state restored from a checkpoint: the momentum buffer (None before the first step) and
    /// the number of steps applied.
    pub fn from_parts(buffer: Option<M>, steps: u64) -> Self {
        Self { buffer, steps }
    }

    /// Stores the advanced buffer after a step was applied.
    pub(crate) fn record_step(&mut self, buffer: M) {
        self.buffer = Some(buffer);
        self.steps += 1;
    }
}
