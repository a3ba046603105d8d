//! [`Single`]: the group of one process. Every collective is the identity (a reduce-scatter or
//! all-gather copies its one shard, which is the whole tensor); arguments are checked as in
//! any group, so code that runs here runs unchanged on N ranks.

use tch::Tensor;

use crate::error::{Op, Result};
use crate::rules::{write_into, Call, ReduceOp};
use crate::Communicator;

/// World 1, rank 0: the collectives of one process.
///
/// ```
/// use kappa_dist::{Communicator, Single};
/// let mut t = tch::Tensor::from_slice(&[1.0f32, 2.0]);
/// Single.all_reduce_mean(&mut t)?;
/// assert_eq!(Vec::<f32>::try_from(&t).unwrap(), [1.0, 2.0]);
/// assert!(Single.broadcast(&mut t, 1).is_err(), "rank 1 does not exist");
/// # Ok::<(), kappa_dist::DistError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Single;

impl Communicator for Single {
    fn rank(&self) -> usize {
        0
    }

    fn world(&self) -> usize {
        1
    }

    /// The sum and the mean over one rank are `t` itself: nothing changes.
    fn all_reduce(&self, t: &mut Tensor, reduce: ReduceOp) -> Result<()> {
        Call::all_reduce(0, t, reduce).map(drop)
    }

    fn reduce_scatter(&self, input: &Tensor, out: &mut Tensor, reduce: ReduceOp) -> Result<()> {
        Call::reduce_scatter(0, 1, input, out, reduce)?;
        write_into(Op::ReduceScatter, 0, out, input)
    }

    fn all_gather(&self, shard: &Tensor, out: &mut Tensor) -> Result<()> {
        Call::all_gather(0, 1, shard, out)?;
        write_into(Op::AllGather, 0, out, shard)
    }

    fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        Call::broadcast(0, 1, t, root).map(drop)
    }

    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}
