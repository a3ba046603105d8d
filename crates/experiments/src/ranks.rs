//! The ranks of a `train` or `reproduce --unit` command started by a launcher: one process, or
//! one rank of several over MPI (feature `mpi`).
//!
//! A launcher tells each process it starts how many there are: Open MPI's `mpirun` sets
//! `OMPI_COMM_WORLD_SIZE` (which alone counts when set), MPICH's and Slurm's PMI `PMI_SIZE`,
//! Slurm `SLURM_NTASKS`. [`Ranks::join`]
//! compares those counts with the world MPI reports, and stops with an error naming both where
//! they differ: a binary built without MPI, or an `srun` whose `--mpi` type MPI does not speak,
//! would otherwise run N processes that each train the whole model alone and write one run
//! folder N times over.

use std::sync::Arc;

use anyhow::Result;
use kappa_dist::{Communicator, Single};

/// The environment variables through which launchers announce the number of processes.
pub const LAUNCHER_VARS: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"];

/// The process counts `env` announces ([`LAUNCHER_VARS`] that are set, with their values).
/// `mpirun`'s count alone when it is set: `mpirun` started the process, and the Slurm
/// allocation it may run in (whose `SLURM_NTASKS` the process inherits) can hold more tasks.
pub fn announced(env: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, String)> {
    let set: Vec<(&'static str, String)> = (LAUNCHER_VARS.iter())
        .filter_map(|&var| env(var).map(|v| (var, v.trim().to_string())))
        .collect();
    match set.iter().find(|(var, _)| *var == LAUNCHER_VARS[0]) {
        Some(mpirun) => vec![mpirun.clone()],
        None => set,
    }
}

/// Whether `announced` asks for more than one process.
pub fn several(announced: &[(&'static str, String)]) -> bool {
    announced
        .iter()
        .any(|(_, v)| v.parse::<usize>().map_or(true, |n| n > 1))
}

/// Checks the world MPI formed (`None`: a binary without MPI) against the counts the launcher
/// announced; the error names each count and what to do.
pub fn check_world(world: Option<usize>, announced: &[(&'static str, String)]) -> Result<()> {
    let counts = || {
        (announced.iter())
            .map(|(var, v)| format!("{var}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(world) = world else {
        anyhow::ensure!(
            !several(announced),
            "the launcher started this process as one of several ({}), but kappa-experiments \
             was built without MPI: each process would train the whole model alone. Build it \
             with `--features mpi` (cargo build --release -p kappa-experiments --features mpi) \
             or start one process",
            counts()
        );
        return Ok(());
    };
    let differs = (announced.iter()).find(|(_, v)| v.parse::<usize>().ok() != Some(world));
    if let Some((var, v)) = differs {
        anyhow::bail!(
            "MPI formed a world of {world} process(es), but {var}={v} ({}): the launcher's \
             processes are not connected by MPI, and each would train the whole model alone. \
             Under Slurm give srun the MPI type the MPI library was built for (`srun \
             --mpi=pmix`, or pmi2; `srun --mpi=list` lists them), or start the ranks with mpirun",
            counts()
        );
    }
    Ok(())
}

/// How long a rank waits for the others in a collective before the job fails: long enough for
/// rank 0 to prepare a data set and open the run while the others wait for its word (the
/// default of torch.distributed's CPU backends).
#[cfg(feature = "mpi")]
pub const RANK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// This process's place among the ranks of one training job.
pub enum Ranks {
    /// One process.
    One,
    /// One rank of an MPI job, exchanging CPU tensors over MPI.
    #[cfg(feature = "mpi")]
    Mpi(Arc<kappa_dist::Mpi>),
    /// One rank of an MPI job on one GPU, exchanging CUDA tensors over NCCL (MPI starts the
    /// ranks, hands them NCCL's id and ends the job when one fails).
    #[cfg(feature = "nccl")]
    Nccl(Arc<kappa_dist::Mpi>, Arc<kappa_dist::Nccl>),
}

impl Ranks {
    /// Joins the launcher's ranks for a run on `device` (`cpu`, `cuda`): with the feature `mpi`
    /// and a launcher that announced more than one process, MPI is initialized and its world
    /// checked against the announced counts ([`check_world`]); on `cuda` (feature `nccl`) each
    /// rank then takes one GPU ([`local_gpu`]) and the ranks form an NCCL group. Otherwise this
    /// is one process, and an announcement of several is an error.
    pub fn join(device: &str) -> Result<Self> {
        let announced = announced(|var| std::env::var(var).ok());
        if !several(&announced) {
            return Ok(Ranks::One);
        }
        Self::join_mpi(&announced, device.starts_with("cuda"))
    }

    #[cfg(feature = "mpi")]
    fn join_mpi(announced: &[(&'static str, String)], cuda: bool) -> Result<Self> {
        let mpi = kappa_dist::Mpi::init()?.with_timeout(RANK_TIMEOUT);
        if let Err(e) = check_world(Some(mpi.world()), announced) {
            // Every process of the launcher fails alike; none waits for another.
            let _ = mpi.finalize();
            return Err(e);
        }
        let mpi = Arc::new(mpi);
        if cuda {
            return Self::join_nccl(mpi);
        }
        Ok(Ranks::Mpi(mpi))
    }

    #[cfg(not(feature = "mpi"))]
    fn join_mpi(announced: &[(&'static str, String)], _cuda: bool) -> Result<Self> {
        check_world(None, announced).map(|()| Ranks::One)
    }

    /// Forms the NCCL group; a rank that fails to (no GPU, no NCCL) prints why and ends the
    /// job through [`Ranks::end`], since the others may wait for it in NCCL's setup.
    #[cfg(feature = "nccl")]
    fn join_nccl(mpi: Arc<kappa_dist::Mpi>) -> Result<Self> {
        match nccl_group(&mpi) {
            Ok(nccl) => Ok(Ranks::Nccl(mpi, Arc::new(nccl.with_timeout(RANK_TIMEOUT)))),
            Err(e) => Ranks::Mpi(mpi).end(Err(e)),
        }
    }

    #[cfg(all(feature = "mpi", not(feature = "nccl")))]
    fn join_nccl(mpi: Arc<kappa_dist::Mpi>) -> Result<Self> {
        let _ = Arc::try_unwrap(mpi).map(kappa_dist::Mpi::finalize);
        anyhow::bail!(
            "--device cuda on several ranks exchanges CUDA tensors over NCCL, but \
             kappa-experiments was built without it: build it with `--features nccl`, or train \
             on the CPU (--device cpu)"
        )
    }

    /// The communicator of the ranks ([`Single`] for one process).
    pub fn communicator(&self) -> Arc<dyn Communicator> {
        match self {
            Ranks::One => Arc::new(Single),
            #[cfg(feature = "mpi")]
            Ranks::Mpi(mpi) => Arc::clone(mpi) as Arc<dyn Communicator>,
            #[cfg(feature = "nccl")]
            Ranks::Nccl(_, nccl) => Arc::clone(nccl) as Arc<dyn Communicator>,
        }
    }

    /// The device this rank trains on, for the command's `device`: the rank's GPU over NCCL
    /// (`cuda:G`; an explicit `cuda:N` is an error there, since each rank takes its own),
    /// otherwise `device` itself.
    pub fn device(&self, device: &str) -> Result<String> {
        match self.communicator().tensor_device() {
            Some(tch::Device::Cuda(gpu)) => {
                anyhow::ensure!(
                    device == "cuda",
                    "--device {device} on several ranks: each rank takes its own GPU (by its \
                     local rank); give --device cuda"
                );
                Ok(format!("cuda:{gpu}"))
            }
            _ => Ok(device.to_string()),
        }
    }

    /// Ends the job's part on this rank with `result`. On several ranks a success finalizes
    /// MPI, and so does a stop on request ([`TrainStopped`](crate::train::TrainStopped) or
    /// [`Preempted`](crate::runner::Preempted): every rank stopped after the same step), whose
    /// error is then returned; any other failure is
    /// printed (`error: rank R of W: …`) and ends the whole job (`MPI_Abort`), so that no rank
    /// waits for this one; over NCCL the communicator is then left as it is, not destroyed.
    pub fn end<T>(self, result: Result<T>) -> Result<T> {
        match self {
            Ranks::One => result,
            #[cfg(feature = "nccl")]
            Ranks::Nccl(mpi, nccl) => {
                if matches!(&result, Err(e) if !stopped_on_request(e)) {
                    // `ncclCommDestroy` can wait for the ranks this failure left behind: leave
                    // the communicator to the `MPI_Abort` that follows.
                    std::mem::forget(nccl);
                } else {
                    drop(nccl);
                }
                Ranks::Mpi(mpi).end(result)
            }
            #[cfg(feature = "mpi")]
            Ranks::Mpi(mpi) => {
                let (rank, world) = (mpi.rank(), mpi.world());
                let stopped = matches!(&result, Err(e) if stopped_on_request(e));
                if let (Err(e), false) = (&result, stopped) {
                    eprintln!("error: rank {rank} of {world}: {e:#}");
                    mpi.abort(1)
                }
                match Arc::try_unwrap(mpi) {
                    Ok(mpi) => mpi.finalize().map_err(Into::into).and(result),
                    Err(mpi) => {
                        eprintln!("error: rank {rank} of {world}: MPI is still in use");
                        mpi.abort(1)
                    }
                }
            }
        }
    }
}

/// This rank's NCCL communicator on its GPU ([`local_gpu`]), with the id rank 0 shares over
/// `mpi`.
#[cfg(feature = "nccl")]
fn nccl_group(mpi: &kappa_dist::Mpi) -> Result<kappa_dist::Nccl> {
    let gpus = usize::try_from(tch::Cuda::device_count()).unwrap_or(0);
    let gpu = local_gpu(|var| std::env::var(var).ok(), gpus)?;
    let id = kappa_dist::NcclId::share(mpi)?;
    Ok(kappa_dist::Nccl::new(&id, mpi.rank(), mpi.world(), gpu)?)
}

/// The environment variables through which launchers announce a process's rank on its node:
/// Open MPI's `mpirun`, MPICH's, and Slurm's `srun` (the first set counts).
pub const LOCAL_RANK_VARS: [&str; 3] = [
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "SLURM_LOCALID",
];

/// The GPU of this rank among the `gpus` it sees: its local rank modulo `gpus` (the node's
/// ranks on distinct GPUs when there are as many; under `srun --gpus-per-task=1` each task sees
/// one GPU, its own, as device 0).
pub fn local_gpu(env: impl Fn(&str) -> Option<String>, gpus: usize) -> Result<usize> {
    anyhow::ensure!(gpus > 0, "--device cuda: this process sees no CUDA device");
    let local = LOCAL_RANK_VARS
        .iter()
        .find_map(|&var| env(var).map(|v| (var, v)));
    let Some((var, value)) = local else {
        anyhow::bail!(
            "--device cuda on several ranks: the launcher did not say which rank this is on its \
             node (none of {} is set), so no GPU can be chosen",
            LOCAL_RANK_VARS.join(", ")
        );
    };
    let local: usize =
        (value.trim().parse()).map_err(|_| anyhow::anyhow!("{var}={value} is not a local rank"))?;
    Ok(local % gpus)
}

/// Whether `e` is a stop on request (SIGINT, SIGTERM, SIGUSR1) of `train` or `reproduce`:
/// the run checkpointed, and `--resume` continues it.
pub fn stopped_on_request(e: &anyhow::Error) -> bool {
    e.is::<crate::train::TrainStopped>() || e.is::<crate::runner::Preempted>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        |name| {
            (vars.iter())
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn each_rank_takes_its_local_rank_s_gpu() {
        let mpirun = env(&[("OMPI_COMM_WORLD_LOCAL_RANK", "3"), ("SLURM_LOCALID", "0")]);
        assert_eq!(local_gpu(&mpirun, 4).unwrap(), 3);
        assert_eq!(local_gpu(&mpirun, 2).unwrap(), 1);
        let srun = env(&[("SLURM_LOCALID", "1")]);
        assert_eq!(
            local_gpu(&srun, 1).unwrap(),
            0,
            "--gpus-per-task=1: its own GPU"
        );
        assert!(local_gpu(&srun, 0)
            .unwrap_err()
            .to_string()
            .contains("no CUDA device"));
        let e = local_gpu(env(&[]), 2).unwrap_err().to_string();
        assert!(e.contains("SLURM_LOCALID"), "{e}");
        assert!(local_gpu(env(&[("MPI_LOCALRANKID", "x")]), 2).is_err());
    }

    #[test]
    fn one_process_needs_no_mpi_and_several_without_mpi_are_refused() {
        let none = announced(env(&[]));
        assert!(check_world(None, &none).is_ok());
        let one = announced(env(&[("SLURM_NTASKS", "1")]));
        assert!(!several(&one) && check_world(None, &one).is_ok());
        let two = announced(env(&[("OMPI_COMM_WORLD_SIZE", "2")]));
        let e = check_world(None, &two).unwrap_err().to_string();
        assert!(
            e.contains("OMPI_COMM_WORLD_SIZE=2") && e.contains("without MPI"),
            "{e}"
        );
    }

    #[test]
    fn an_mpi_world_that_differs_from_slurm_ntasks_is_refused_naming_both() {
        let four = announced(env(&[("SLURM_NTASKS", "4"), ("PMI_SIZE", "4")]));
        assert!(check_world(Some(4), &four).is_ok());
        let e = check_world(Some(1), &four).unwrap_err().to_string();
        assert!(
            e.contains("world of 1") && e.contains("SLURM_NTASKS=4"),
            "{e}"
        );
        assert!(e.contains("--mpi=pmix"), "{e}");
        let inside = announced(env(&[("SLURM_NTASKS", "8"), ("OMPI_COMM_WORLD_SIZE", "2")]));
        assert!(
            check_world(Some(2), &inside).is_ok(),
            "mpirun's count rules"
        );
        let garbled = announced(env(&[("SLURM_NTASKS", "four")]));
        assert!(several(&garbled) && check_world(Some(1), &garbled).is_err());
    }
}
