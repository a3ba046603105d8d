//! [`Nccl`]: ranks as processes (or threads) with one GPU each, over NVIDIA's NCCL (feature
//! `nccl`).
//!
//! NCCL and the CUDA driver are loaded when a group is first formed (module `ffi`): building
//! needs neither, and a machine without them gets an error, not a crash. PyPI's `torch` brings
//! NCCL as `nvidia-nccl` (`libnccl.so.2`), which a process linking `libtorch_cuda` has loaded
//! already; `KAPPA_NCCL_LIBRARY` names another file.
//!
//! # How each collective runs
//!
//! NCCL moves bytes; the sums are libtorch's, on the GPU, in the order of [`rules`](crate::rules),
//! so a group over NCCL gives the same bits as one over threads or MPI:
//!
//! - **all-reduce** of N elements: every rank sends each peer p its shard p
//!   ([`shard_range`](crate::shard_range)) and receives the peers' copies of its own shard (one NCCL group of
//!   send/receive pairs, an all-to-all); it sums its W copies in rank order
//!   ([`reduce_in_rank_order`](crate::reduce_in_rank_order): bf16 and f16 in f32, rounded once), then an all-gather (the
//!   same pattern) returns every reduced shard to every rank. Each rank sends and receives
//!   2·N·(W−1)/W elements, what a ring all-reduce moves.
//! - **reduce-scatter** is the first half, **all-gather** the second, **broadcast** is
//!   `ncclBroadcast`, and **barrier** is the agreement below.
//! - **Agreement.** Before each collective the ranks exchange what they are about to call
//!   (operation, reduction, kind, element count, root: five integers), so calls that disagree
//!   fail with [`DistError::Mismatch`] instead of corrupting memory or hanging.
//!
//! # Streams and waiting
//!
//! Transfers run on the CUDA default stream, the one libtorch launches on (tch sets no other),
//! so they are ordered after the kernels that produced the tensors and before those that read
//! the results. Each collective returns when the stream is idle: the host polls
//! `cuStreamQuery` and `ncclCommGetAsyncError`, so a peer that died or stalls ends the call
//! with [`DistError::Transport`] or [`DistError::Timeout`] after the group's timeout
//! ([`Nccl::with_timeout`], default [`DEFAULT_TIMEOUT`]); the communicator is then aborted and
//! every later call fails with the same error. Under `mpirun` or `srun` the launcher also ends
//! the job when a process dies.
//!
//! # Forming a group
//!
//! One rank creates an [`NcclId`]; every rank passes it to [`Nccl::new`] with its rank, the
//! world size and its GPU. [`NcclId::share`] hands it over any other [`Communicator`] (MPI,
//! threads); [`NcclId::share_via_file`] through a file in a folder every rank sees (a job's
//! folder on a shared file system). `NCCL_SOCKET_IFNAME` chooses the network NCCL's bootstrap
//! listens on (`lo` for one machine).

// FFI into NCCL and the CUDA driver: every unsafe block states what makes it sound.
#![allow(unsafe_code)]

mod exchange;
mod ffi;

use std::fmt;
use std::path::Path;
use std::ptr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tch::{Device, Tensor};

use crate::error::{DistError, Op, Result};
use crate::rules::{write_into, Call, ReduceOp};
use crate::{Communicator, DEFAULT_TIMEOUT};

pub use ffi::UNIQUE_ID_BYTES;

const BACKEND: &str = "NCCL";

/// The version of the NCCL library this process loads, as (major, minor, patch).
pub fn version() -> Result<(u32, u32, u32)> {
    let api = ffi::nccl().map_err(|m| transport(0, m))?;
    let mut code = 0;
    // SAFETY: ncclGetVersion writes one int.
    check(api, 0, unsafe { (api.get_version)(&mut code) })?;
    let code = u32::try_from(code).unwrap_or(0);
    // NCCL_VERSION(X, Y, Z): X·1000 + Y·100 + Z up to 2.8, X·10000 + Y·100 + Z after.
    let (major, rest) = if code >= 10_000 {
        (code / 10_000, code % 10_000)
    } else {
        (code / 1000, code % 1000)
    };
    Ok((major, rest / 100, rest % 100))
}

/// The name of one NCCL group (`ncclUniqueId`): created on one rank, given to every rank.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclId([u8; UNIQUE_ID_BYTES]);

impl fmt::Debug for NcclId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NcclId(..)")
    }
}

impl NcclId {
    /// A new id (`ncclGetUniqueId`, which starts NCCL's bootstrap listener on this host).
    pub fn new() -> Result<Self> {
        let api = ffi::nccl().map_err(|m| transport(0, m))?;
        let mut id = ffi::UniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: ncclGetUniqueId writes one ncclUniqueId.
        check(api, 0, unsafe { (api.get_unique_id)(&mut id) })?;
        Ok(Self(id.internal.map(|c| c as u8)))
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.0
    }

    /// An id from the bytes [`NcclId::as_bytes`] gave on another rank.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bytes: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            transport(
                0,
                format!(
                    "an NCCL id has {UNIQUE_ID_BYTES} bytes, found {}",
                    bytes.len()
                ),
            )
        })?;
        Ok(Self(bytes))
    }

    /// Rank 0 of `comm` creates the id and broadcasts it over `comm`; every rank returns it. If
    /// rank 0 cannot create one, every rank fails (rank 0 with NCCL's reason).
    pub fn share(comm: &dyn Communicator) -> Result<Self> {
        let created = (comm.rank() == 0).then(Self::new);
        let mut message = vec![0u8; 1 + UNIQUE_ID_BYTES];
        if let Some(Ok(id)) = &created {
            message[0] = 1;
            message[1..].copy_from_slice(&id.0);
        }
        let mut t = Tensor::from_slice(&message);
        comm.broadcast(&mut t, 0)?;
        if let Some(Err(e)) = created {
            return Err(e);
        }
        let bytes = Vec::<u8>::try_from(&t).map_err(|e| DistError::tensor(Op::Broadcast, 0, e))?;
        if bytes[0] != 1 {
            let reason = "rank 0 could not create the NCCL id".to_string();
            return Err(transport(comm.rank(), reason));
        }
        Self::from_bytes(&bytes[1..])
    }

    /// Through the file `path`, which every rank sees and which must be new to this run (name
    /// it after the job, e.g. with `SLURM_JOB_ID`): rank 0 creates the id and writes it (to a
    /// temporary name, then renamed, so no rank reads half a file); the others wait for it up
    /// to `timeout`.
    pub fn share_via_file(path: &Path, rank: usize, timeout: Duration) -> Result<Self> {
        share_bytes_via_file(path, rank, timeout, || Self::new().map(|id| id.0)).map(Self)
    }
}

/// [`NcclId::share_via_file`] with the id's creation as a parameter.
fn share_bytes_via_file(
    path: &Path,
    rank: usize,
    timeout: Duration,
    create: impl FnOnce() -> Result<[u8; UNIQUE_ID_BYTES]>,
) -> Result<[u8; UNIQUE_ID_BYTES]> {
    let io =
        |what: &str, e: std::io::Error| transport(rank, format!("{what} {}: {e}", path.display()));
    if rank == 0 {
        let bytes = create()?;
        let partial = path.with_extension(format!("partial-{}", std::process::id()));
        std::fs::write(&partial, bytes).map_err(|e| io("cannot write", e))?;
        std::fs::rename(&partial, path).map_err(|e| io("cannot rename onto", e))?;
        return Ok(bytes);
    }
    let start = Instant::now();
    loop {
        match std::fs::read(path) {
            Ok(bytes) => {
                return NcclId::from_bytes(&bytes).map(|id| id.0);
            }
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("cannot read", e)),
            Err(_) if start.elapsed() >= timeout => {
                let reason = format!(
                    "rank 0 did not write the NCCL id to {} within {timeout:?}",
                    path.display()
                );
                return Err(transport(rank, reason));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// One rank of a group over NCCL: CUDA tensors on this rank's GPU.
pub struct Nccl {
    rank: usize,
    world: usize,
    device: usize,
    timeout: Duration,
    state: Mutex<State>,
}

struct State {
    comm: ffi::Comm,
    context: ffi::Context,
    failed: Option<DistError>,
}

// SAFETY: the communicator and the context are only used with `state` locked, one call at a
// time, as NCCL requires of a communicator.
unsafe impl Send for Nccl {}
unsafe impl Sync for Nccl {}

impl fmt::Debug for Nccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nccl")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Nccl {
    /// Joins group `id` as `rank` of `world` on CUDA device `device` (`ncclCommInitRank`, which
    /// returns once all `world` ranks have joined). One GPU per rank: two ranks on one GPU are
    /// refused by NCCL.
    pub fn new(id: &NcclId, rank: usize, world: usize, device: usize) -> Result<Self> {
        if world == 0 || rank >= world {
            let reason = format!("rank {rank} is not in 0..{world}");
            return Err(DistError::World { world, reason });
        }
        let api = ffi::nccl().map_err(|m| transport(rank, m))?;
        let context = primary_context(rank, device)?;
        let mut comm: ffi::Comm = ptr::null_mut();
        let raw = ffi::UniqueId {
            internal: id.0.map(|b| b as std::ffi::c_char),
        };
        let (w, r) = (to_c_int(rank, world)?, to_c_int(rank, rank)?);
        // SAFETY: comm receives the new communicator; the context of `device` is current.
        check(api, rank, unsafe {
            (api.comm_init_rank)(&mut comm, w, raw, r)
        })?;
        let state = Mutex::new(State {
            comm,
            context,
            failed: None,
        });
        Ok(Self {
            rank,
            world,
            device,
            timeout: DEFAULT_TIMEOUT,
            state,
        })
    }

    /// The same group with another timeout for each collective.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// This rank's GPU.
    pub fn device(&self) -> Device {
        Device::Cuda(self.device)
    }

    /// Runs one collective with the state locked and this GPU's context current; a failure
    /// aborts the communicator and is returned by every later call.
    fn collective<T>(&self, op: Op, f: impl FnOnce(&State) -> Result<T>) -> Result<T> {
        let mut st = self.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let driver = ffi::driver().map_err(|m| transport(self.rank, m))?;
        // SAFETY: the context was retained in `new` and lives as long as the process.
        cuda(self.rank, "cuCtxSetCurrent", unsafe {
            (driver.ctx_set_current)(st.context)
        })?;
        let out = f(&st);
        if let Err(e) = &out {
            if !matches!(e, DistError::Size { .. } | DistError::Argument { .. }) {
                self.abort(&mut st, op, e.clone());
            }
        }
        out
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn abort(&self, st: &mut State, _op: Op, e: DistError) {
        if let Ok(api) = ffi::nccl() {
            if !st.comm.is_null() {
                // SAFETY: the communicator is valid and not used again.
                unsafe { (api.comm_abort)(st.comm) };
            }
        }
        st.comm = ptr::null_mut();
        st.failed = Some(e);
    }

    /// Refuses a tensor that is not on this rank's GPU.
    fn on_device(&self, op: Op, t: &Tensor) -> Result<()> {
        if t.device() == self.device() {
            return Ok(());
        }
        let reason = format!(
            "NCCL takes CUDA tensors on cuda:{}, found a tensor on {:?}",
            self.device,
            t.device()
        );
        Err(DistError::Argument {
            op,
            rank: self.rank,
            reason,
        })
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        let st = self.lock();
        if let (Ok(api), false) = (ffi::nccl(), st.comm.is_null()) {
            // SAFETY: the communicator is valid, not aborted, and not used again.
            unsafe { (api.comm_destroy)(st.comm) };
        }
    }
}

impl Communicator for Nccl {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce(&self, t: &mut Tensor, reduce: ReduceOp) -> Result<()> {
        let op = Op::AllReduce;
        self.on_device(op, t)?;
        let call = Call::all_reduce(self.rank, t, reduce)?;
        self.collective(op, |st| {
            self.agree(st, &call)?;
            let flat = self.flat(op, t)?;
            let reduced = self.reduce_shards(st, op, &flat, reduce)?;
            let whole = self.gather_shards(st, op, &reduced, flat.numel())?;
            write_into(op, self.rank, t, &whole)
        })
    }

    fn reduce_scatter(&self, input: &Tensor, out: &mut Tensor, reduce: ReduceOp) -> Result<()> {
        let op = Op::ReduceScatter;
        self.on_device(op, input)?;
        self.on_device(op, out)?;
        let call = Call::reduce_scatter(self.rank, self.world, input, out, reduce)?;
        self.collective(op, |st| {
            self.agree(st, &call)?;
            let flat = self.flat(op, input)?;
            let reduced = self.reduce_shards(st, op, &flat, reduce)?;
            write_into(op, self.rank, out, &reduced)
        })
    }

    fn all_gather(&self, shard: &Tensor, out: &mut Tensor) -> Result<()> {
        let op = Op::AllGather;
        self.on_device(op, shard)?;
        self.on_device(op, out)?;
        let call = Call::all_gather(self.rank, self.world, shard, out)?;
        self.collective(op, |st| {
            self.agree(st, &call)?;
            let shard = self.flat(op, shard)?;
            let whole = self.gather_shards(st, op, &shard, out.numel())?;
            write_into(op, self.rank, out, &whole)
        })
    }

    fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        let op = Op::Broadcast;
        self.on_device(op, t)?;
        let call = Call::broadcast(self.rank, self.world, t, root)?;
        self.collective(op, |st| {
            self.agree(st, &call)?;
            let flat = self.flat(op, t)?;
            self.broadcast_bytes(st, op, &flat, root)?;
            write_into(op, self.rank, t, &flat)
        })
    }

    /// The agreement exchange: every rank has reached the barrier when it returns.
    fn barrier(&self) -> Result<()> {
        self.collective(Op::Barrier, |st| self.agree(st, &Call::barrier()))
    }

    fn tensor_device(&self) -> Option<Device> {
        Some(self.device())
    }
}

/// `DistError::Transport` of this backend.
fn transport(rank: usize, message: String) -> DistError {
    DistError::Transport {
        backend: BACKEND,
        rank,
        message,
    }
}

/// NCCL's `status` as a result.
fn check(api: &ffi::Nccl, rank: usize, status: std::ffi::c_int) -> Result<()> {
    if status == ffi::NCCL_SUCCESS {
        Ok(())
    } else {
        Err(transport(rank, api.message(status)))
    }
}

/// The CUDA driver's `status` of `call` as a result.
fn cuda(rank: usize, call: &str, status: std::ffi::c_int) -> Result<()> {
    if status == ffi::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(transport(
            rank,
            format!("{call} failed with CUDA error {status}"),
        ))
    }
}

fn to_c_int(rank: usize, n: usize) -> Result<std::ffi::c_int> {
    std::ffi::c_int::try_from(n).map_err(|_| transport(rank, format!("{n} does not fit a C int")))
}

/// Makes `device`'s primary context (the one libtorch's CUDA runtime uses) current on this
/// thread, and returns it.
fn primary_context(rank: usize, device: usize) -> Result<ffi::Context> {
    let driver = ffi::driver().map_err(|m| transport(rank, m))?;
    let ordinal = to_c_int(rank, device)?;
    let (mut dev, mut context) = (0, ptr::null_mut());
    // SAFETY: each call writes its one out-parameter; cuInit may be called more than once.
    unsafe {
        cuda(rank, "cuInit", (driver.init)(0))?;
        cuda(rank, "cuDeviceGet", (driver.device_get)(&mut dev, ordinal))?;
        cuda(
            rank,
            "cuDevicePrimaryCtxRetain",
            (driver.primary_ctx_retain)(&mut context, dev),
        )?;
        cuda(rank, "cuCtxSetCurrent", (driver.ctx_set_current)(context))?;
    }
    Ok(context)
}

#[cfg(test)]
mod tests;
