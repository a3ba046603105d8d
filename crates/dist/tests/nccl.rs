//! The NCCL backend on GPUs, where there are any (the test passes with a note where there are
//! none; the unit tests in `src/nccl` cover what runs without a GPU): each collective over NCCL
//! gives the same bits as the same collective over threads, on every GPU count up to the
//! machine's (one rank per GPU, each rank a thread of this process), and a CPU tensor is refused.
#![cfg(feature = "nccl")]
// Loading libtorch's CUDA library by hand (below) is the one unsafe call.
#![allow(unsafe_code)]

use kappa_dist::{Communicator, DistError, Nccl, NcclId, ReduceOp, Threads};
use tch::{Device, Kind, Tensor};

/// Every collective on rank `comm.rank()`'s inputs, on `device`; the results, on the CPU.
fn collectives(comm: &dyn Communicator, device: Device) -> Result<Vec<Tensor>, DistError> {
    let (rank, world) = (comm.rank() as i64, comm.world());
    let mut out = Vec::new();
    for kind in [Kind::Float, Kind::Double, Kind::BFloat16] {
        // 13 elements: uneven shards at every world size above 1.
        let x = (Tensor::arange(13, (Kind::Double, Device::Cpu)) * 0.1 + rank as f64 * 1.7)
            .sin()
            .to_kind(kind)
            .to_device(device);
        for reduce in [ReduceOp::Sum, ReduceOp::Mean] {
            let mut t = x.copy();
            comm.all_reduce(&mut t, reduce)?;
            out.push(t.to_device(Device::Cpu));
        }
        let len = kappa_dist::shard_range(13, world, comm.rank()).len() as i64;
        let mut shard = Tensor::zeros([len], (kind, device));
        comm.reduce_scatter(&x, &mut shard, ReduceOp::Sum)?;
        let mut whole = Tensor::zeros([13], (kind, device));
        comm.all_gather(&shard, &mut whole)?;
        out.push(whole.to_device(Device::Cpu));
        let mut b = x.copy();
        comm.broadcast(&mut b, world - 1)?;
        out.push(b.to_device(Device::Cpu));
    }
    comm.barrier()?;
    Ok(out)
}

/// Loads `libtorch_cuda.so` beside the libtorch this test runs on, where there is one, and
/// keeps it: its initializers register libtorch's CUDA backend, which a test binary that calls
/// nothing in it directly would otherwise leave out (the linker drops unused libraries).
fn register_libtorch_cuda() {
    let Some(lib) = std::env::var_os("LIBTORCH")
        .map(|t| std::path::PathBuf::from(t).join("lib/libtorch_cuda.so"))
        .filter(|p| p.is_file())
    else {
        return;
    };
    // SAFETY: loading libtorch's own CUDA library into a process that uses libtorch runs its
    // registration code, as `import torch` does.
    if let Ok(lib) = unsafe { libloading::Library::new(&lib) } {
        std::mem::forget(lib);
    }
}

#[test]
fn nccl_gives_the_bits_threads_give_on_every_gpu_count() {
    register_libtorch_cuda();
    let gpus = tch::Cuda::device_count() as usize;
    if gpus == 0 {
        eprintln!("skipped: no CUDA device");
        return;
    }
    // NCCL's bootstrap listens on loopback only.
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    for world in 1..=gpus.min(4) {
        let expected = Threads::run(world, |comm| collectives(&comm, Device::Cpu)).unwrap();
        let got = Threads::run(world, |threads| {
            let id = NcclId::share(&threads)?;
            let nccl = Nccl::new(&id, threads.rank(), world, threads.rank())?;
            let refused = nccl.all_reduce_sum(&mut Tensor::zeros([2], tch::kind::FLOAT_CPU));
            assert!(
                matches!(refused, Err(DistError::Argument { .. })),
                "{refused:?}"
            );
            collectives(&nccl, nccl.device())
        })
        .unwrap();
        for (rank, (e, g)) in expected.into_iter().zip(got).enumerate() {
            for (i, (e, g)) in e.unwrap().iter().zip(g.unwrap()).enumerate() {
                assert!(
                    e.equal(&g),
                    "world {world}, rank {rank}, result {i}: {e} against {g}"
                );
            }
        }
    }
}
