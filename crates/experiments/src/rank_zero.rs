//! What rank 0 of a data-parallel run decides and tells the other ranks before training: whether
//! there is training to do, and whether it continues an earlier run.

use anyhow::Result;
use kappa_dist::Communicator;
use tch::Tensor;

/// Rank 0 broadcasts whether there is training to do (`train`) and whether its run continues
/// an earlier one (`resumed`); every rank returns `None` (nothing to train) or `Some(resumed)`.
/// On one rank it only returns the arguments.
pub fn tell_ranks(comm: &dyn Communicator, train: bool, resumed: bool) -> Result<Option<bool>> {
    let device = comm.tensor_device().unwrap_or(tch::Device::Cpu);
    let mut flags =
        Tensor::from_slice(&[i64::from(train), i64::from(resumed)]).f_to_device(device)?;
    if comm.world() > 1 {
        comm.broadcast(&mut flags, 0)?;
    }
    let flags = Vec::<i64>::try_from(&flags.f_to_device(tch::Device::Cpu)?)?;
    Ok((flags[0] == 1).then_some(flags[1] == 1))
}
