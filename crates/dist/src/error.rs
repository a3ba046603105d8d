//! [`DistError`]: what went wrong in a collective, on which rank, in which operation.

use std::fmt;
use std::time::Duration;

/// A collective operation (the `op` of every [`DistError`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`Communicator::all_reduce`](crate::Communicator::all_reduce).
    AllReduce,
    /// [`Communicator::reduce_scatter`](crate::Communicator::reduce_scatter).
    ReduceScatter,
    /// [`Communicator::all_gather`](crate::Communicator::all_gather).
    AllGather,
    /// [`Communicator::broadcast`](crate::Communicator::broadcast).
    Broadcast,
    /// [`Communicator::barrier`](crate::Communicator::barrier).
    Barrier,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
            Op::Broadcast => "broadcast",
            Op::Barrier => "barrier",
        })
    }
}

/// An error of a collective. Every variant names the operation and the rank at fault (or the
/// ranks missing); once a group has failed, every later collective of any of its ranks returns
/// the first error again, so no rank goes on alone.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// A tensor of a rank's call holds the wrong number of elements (a reduce-scatter output or
    /// an all-gather shard that is not this rank's shard of the split, [`crate::shard_range`]).
    #[error("{op} on rank {rank}: {what} holds {found} elements, the call needs {expected}")]
    Size {
        /// The operation.
        op: Op,
        /// The rank whose call it is.
        rank: usize,
        /// Which tensor (`out`, `shard`).
        what: &'static str,
        /// The elements the call needs.
        expected: usize,
        /// The elements it holds.
        found: usize,
    },
    /// An argument a rank's call cannot take: a root outside `0..world`, an element kind the
    /// operation does not reduce, an output of another kind than the input.
    #[error("{op} on rank {rank}: {reason}")]
    Argument {
        /// The operation.
        op: Op,
        /// The rank whose call it is.
        rank: usize,
        /// What is wrong, with the allowed values.
        reason: String,
    },
    /// The ranks called collectives that do not match: another operation, reduction, root,
    /// element kind or element count than rank 0's call of the same round.
    #[error("the ranks' calls disagree: rank 0 called {expected}, rank {rank} called {found}")]
    Mismatch {
        /// The first rank whose call differs from rank 0's.
        rank: usize,
        /// Rank 0's call.
        expected: String,
        /// That rank's call.
        found: String,
    },
    /// A rank dropped its communicator (it returned, failed or panicked) while the others
    /// waited for it in a collective.
    #[error("{op}: rank {rank} left the group (its communicator was dropped: the rank returned, failed or panicked) before taking part")]
    RankGone {
        /// The operation the others waited in.
        op: Op,
        /// The rank that left.
        rank: usize,
    },
    /// Ranks did not reach a collective within the group's timeout.
    #[error("{op}: rank(s) {missing:?} did not take part within the timeout of {waited:?}")]
    Timeout {
        /// The operation.
        op: Op,
        /// The ranks that were waited for.
        missing: Vec<usize>,
        /// The timeout.
        waited: Duration,
    },
    /// libtorch refused an operation on a rank's tensors.
    #[error("{op} on rank {rank}: libtorch: {message}")]
    Tensor {
        /// The operation.
        op: Op,
        /// The rank.
        rank: usize,
        /// libtorch's message.
        message: String,
    },
    /// A rank's thread panicked ([`Threads::run`](crate::Threads::run)).
    #[error("rank {rank} panicked: {message}")]
    Panicked {
        /// The rank.
        rank: usize,
        /// The panic's message.
        message: String,
    },
    /// The transport under a backend failed or cannot be used: its library cannot be loaded,
    /// it reports an error, or a peer it connects to is gone.
    #[error("rank {rank}: {backend}: {message}")]
    Transport {
        /// The backend (`MPI`, `NCCL`).
        backend: &'static str,
        /// The rank that saw the failure.
        rank: usize,
        /// The transport's message.
        message: String,
    },
    /// A group that cannot be formed (a world of 0 ranks, a thread that cannot start).
    #[error("a group of {world} ranks: {reason}")]
    World {
        /// The requested world size.
        world: usize,
        /// Why it cannot be formed.
        reason: String,
    },
}

/// The crate's result type.
pub type Result<T, E = DistError> = std::result::Result<T, E>;

impl DistError {
    /// libtorch's error `e` in `op` on `rank`.
    pub(crate) fn tensor(op: Op, rank: usize, e: tch::TchError) -> Self {
        DistError::Tensor {
            op,
            rank,
            message: e.to_string(),
        }
    }
}
