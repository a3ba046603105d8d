#![doc = include_str!("../README.md")]
//!
//! # Principal items
//!
//! | module | principal items |
//! |---|---|
//! | (root) | [`Communicator`]: rank, world, [`all_reduce`](Communicator::all_reduce), [`reduce_scatter`](Communicator::reduce_scatter), [`all_gather`](Communicator::all_gather), [`broadcast`](Communicator::broadcast), [`barrier`](Communicator::barrier) |
//! | [`single`] | [`Single`]: one process, world 1 |
//! | [`threads`] | [`Threads`]: N ranks as threads of one process ([`Threads::run`]) |
//! | `mpi` (feature `mpi`) | `Mpi`: one process per rank over MPI (`mpirun`, `srun`), CPU tensors |
//! | `nccl` (feature `nccl`) | `Nccl`: one GPU per rank over NCCL; `NcclId` |
//! | [`rules`] | [`shard_range`], [`ReduceOp`], the sum order ([`reduce_in_rank_order`]) |
//! | [`error`] | [`DistError`], [`Op`] |

pub mod error;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod rules;
pub mod single;
pub mod threads;

pub use error::{DistError, Op, Result};
#[cfg(feature = "mpi")]
pub use mpi::Mpi;
#[cfg(feature = "nccl")]
pub use nccl::{Nccl, NcclId};
pub use rules::{accumulation_kind, reduce_in_rank_order, shard_range, ReduceOp};
pub use single::Single;
pub use threads::{Threads, DEFAULT_TIMEOUT};

use tch::Tensor;

/// One rank's handle on a group of `world` ranks that run the same program: collectives on
/// `tch` tensors. Every rank of the group calls the same collectives in the same order, with
/// tensors of one kind and element count; a call blocks until every rank has made it.
///
/// - **Results.** Sums follow the fixed order and precision of [`rules`] (rank 0 + rank 1 + …,
///   bf16 and f16 accumulated in f32): every rank receives the same bits, and a rerun
///   reproduces them. Outputs are written in place, without gradient (a parameter that
///   requires grad can be the target).
/// - **Shards.** A reduce-scatter's output and an all-gather's input are this rank's shard of
///   the flattened tensor, cut by [`shard_range`] (the first N mod W ranks hold one element
///   more).
/// - **Failure.** A call whose arguments do not fit ([`DistError::Size`],
///   [`DistError::Argument`]) fails on the calling rank. Ranks whose calls disagree fail with
///   [`DistError::Mismatch`]; a rank that dropped its communicator makes the others fail
///   ([`DistError::RankGone`]); ranks that do not arrive within the backend's timeout make the
///   waiting ones fail ([`DistError::Timeout`]). After a failure every later call of the group
///   fails too: no rank hangs and none goes on alone.
/// - **Devices.** [`Single`] and [`Threads`] take tensors on any device (the threads exchange
///   CPU copies). A backend over a transport may refuse a device with [`DistError::Argument`]:
///   one over MPI takes CPU tensors, one over NCCL CUDA tensors on libtorch's current stream.
pub trait Communicator: Send + Sync + std::fmt::Debug {
    /// This rank, in `0..world()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world(&self) -> usize;

    /// `t` ← the reduction over the ranks of their `t` (every rank receives the result).
    fn all_reduce(&self, t: &mut Tensor, reduce: ReduceOp) -> Result<()>;

    /// `t` ← Σ_r t_r ([`Communicator::all_reduce`] with [`ReduceOp::Sum`]).
    fn all_reduce_sum(&self, t: &mut Tensor) -> Result<()> {
        self.all_reduce(t, ReduceOp::Sum)
    }

    /// `t` ← (Σ_r t_r) / W ([`Communicator::all_reduce`] with [`ReduceOp::Mean`]; one
    /// rounding for bf16 and f16).
    fn all_reduce_mean(&self, t: &mut Tensor) -> Result<()> {
        self.all_reduce(t, ReduceOp::Mean)
    }

    /// `out` ← this rank's shard ([`shard_range`] of `input.numel()`) of the reduction over the
    /// ranks of their flattened `input`. `out` is of `input`'s kind and holds the shard's
    /// element count (any shape).
    fn reduce_scatter(&self, input: &Tensor, out: &mut Tensor, reduce: ReduceOp) -> Result<()>;

    /// `out` ← the ranks' shards concatenated in rank order: `shard` is this rank's part
    /// ([`shard_range`] of `out.numel()`, any shape) and of `out`'s kind. `shard` may be a view
    /// of this rank's own part of a contiguous `out` (a gather in place, which saves a copy).
    fn all_gather(&self, shard: &Tensor, out: &mut Tensor) -> Result<()>;

    /// `t` ← rank `root`'s `t` (unchanged on the root).
    fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;

    /// The device whose tensors this backend takes (`None`: any): where a caller puts the small
    /// tensors it exchanges besides its own (a flag, a loss). CPU over MPI, the rank's GPU over
    /// NCCL.
    fn tensor_device(&self) -> Option<tch::Device> {
        None
    }
}
