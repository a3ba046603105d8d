//! [`Mpi`]: ranks as processes started by `mpirun` (or `srun`), CPU tensors, over MPI
//! (feature `mpi`; rsmpi over the system's MPI library, Debian's Open MPI).
//!
//! # How each collective runs
//!
//! MPI moves bytes; the sums are libtorch's, on the CPU, in the order of
//! [`rules`](crate::rules), so a group over MPI gives the same bits as one over threads:
//!
//! - **all-reduce** of N elements: `MPI_Alltoallv` sends each peer p its shard p
//!   ([`shard_range`]) and brings this rank the peers' copies of its own shard; the rank sums
//!   its W copies in rank order ([`reduce_in_rank_order`]: bf16 and f16 in f32, rounded once),
//!   and `MPI_Allgatherv` returns every reduced shard to every rank. Each rank sends and
//!   receives 2·N·(W−1)/W elements, what a ring all-reduce moves.
//! - **reduce-scatter** is the first half, **all-gather** the second (straight into a
//!   contiguous output; a shard that lies in it, a gather in place, is sent from a copy, as MPI
//!   buffers must not overlap), **broadcast** is `MPI_Bcast`, and **barrier** is the agreement
//!   below.
//! - **Agreement.** Before each collective the ranks gather what they are about to call
//!   (operation, reduction, kind, element count, root: five integers, `MPI_Iallgather`), so
//!   calls that disagree fail on every rank with [`DistError::Mismatch`] instead of mixing
//!   buffers of other sizes; the group then stays failed. The gather is non-blocking and
//!   polled against the group's timeout ([`Mpi::with_timeout`], default [`DEFAULT_TIMEOUT`]).
//!
//! Elements travel as an MPI datatype of their byte size (any kind of 1, 2, 4 or 8 bytes), read
//! from and written to the tensors' memory directly; counts and offsets are MPI `int`s, so a
//! tensor holds fewer than 2³¹ elements.
//!
//! # Failure
//!
//! - A call whose arguments do not fit ([`DistError::Size`], [`DistError::Argument`]: a tensor
//!   not on the CPU, a kind of 16 bytes) fails on the calling rank before anything is sent.
//! - MPI's errors are fatal (`MPI_ERRORS_ARE_FATAL`, MPI's default): a transfer that fails ends
//!   the job with MPI's message.
//! - A rank that dies (killed, crashed) ends the job: `mpirun` (Open MPI) kills the other ranks
//!   and exits non-zero, naming the rank and its signal; `srun` does the same by default.
//! - Dropping an [`Mpi`] of more than one rank without [`Mpi::finalize`] (a rank that returns
//!   early with an error, or panics) calls `MPI_Abort`: the job ends with the rank's message,
//!   where otherwise the others would wait for it in their next collective and it would wait
//!   for them in `MPI_Finalize`.
//! - A rank that stalls without dying (a hung data loader, a deadlock) keeps the others waiting
//!   in the next collective's agreement no longer than the timeout: they fail with
//!   [`DistError::Timeout`], and when they drop their [`Mpi`] the job ends as above, the stalled
//!   rank with it. Once every rank has agreed, all of them are inside the exchange, which is
//!   MPI's own blocking call.

// The tensors' memory is handed to MPI as byte slices: every unsafe block states what makes it
// sound.
#![allow(unsafe_code)]

use std::fmt;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mpi::datatype::{Partition, PartitionMut, UserDatatype, View};
use mpi::environment::Universe;
use mpi::request::StaticScope;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Equivalence as _, Root as _};
use mpi::{Count, Threading};
use tch::{Device, Kind, Tensor};

use crate::error::{DistError, Op, Result};
use crate::rules::{check_agreement, reduce_in_rank_order, shard_range, write_into, Call};
use crate::{Communicator, ReduceOp, DEFAULT_TIMEOUT};

const BACKEND: &str = "MPI";

/// One rank of the processes of an MPI job (`MPI_COMM_WORLD`): CPU tensors. One per process.
///
/// ```no_run
/// use kappa_dist::{Communicator, Mpi};
/// // Started as `mpirun -np 2 program`: each process is one rank.
/// let comm = Mpi::init()?;
/// let mut g = tch::Tensor::from_slice(&[comm.rank() as f32; 4]);
/// comm.all_reduce_mean(&mut g)?; // 0.5 everywhere, on both ranks
/// comm.finalize()?; // a clean end; dropping it instead aborts the job (see the module docs)
/// # Ok::<(), kappa_dist::DistError>(())
/// ```
pub struct Mpi {
    rank: usize,
    world: usize,
    timeout: Duration,
    state: Mutex<State>,
}

struct State {
    /// `MPI_COMM_WORLD` (dropped before the universe).
    comm: SimpleCommunicator,
    /// MPI itself: finalized when dropped. `None` once [`Mpi::finalize`] took it.
    universe: Option<Universe>,
    failed: Option<DistError>,
}

// SAFETY: MPI is initialized with at least `MPI_THREAD_SERIALIZED`, and every MPI call goes
// through `state`'s lock, one at a time, whichever thread makes it.
unsafe impl Send for Mpi {}
unsafe impl Sync for Mpi {}

impl fmt::Debug for Mpi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mpi")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Mpi {
    /// Initializes MPI (`MPI_Init_thread`, serialized calls from any thread) and joins
    /// `MPI_COMM_WORLD`: the rank and world size are the launcher's (`mpirun -np N`, `srun`);
    /// a process started alone is rank 0 of 1. Errors: MPI was initialized before in this
    /// process, or its library does not allow calls from several threads.
    pub fn init() -> Result<Self> {
        let Some((universe, level)) = mpi::initialize_with_threading(Threading::Serialized) else {
            let why = "MPI is initialized already: one Mpi per process".to_string();
            return Err(transport(0, why));
        };
        let comm = universe.world();
        let (rank, world) = (comm.rank() as usize, comm.size() as usize);
        if level < Threading::Serialized {
            let why =
                format!("the MPI library offers thread level {level:?}, kappa needs Serialized");
            return Err(transport(rank, why));
        }
        let state = State {
            comm,
            universe: Some(universe),
            failed: None,
        };
        Ok(Self {
            rank,
            world,
            timeout: DEFAULT_TIMEOUT,
            state: Mutex::new(state),
        })
    }

    /// The same rank with another timeout: how long a collective waits for the other ranks to
    /// reach it before it fails with [`DistError::Timeout`] (see the module docs). Give every
    /// rank the same timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Ends this rank's part in the job: a barrier, then `MPI_Finalize`. Call it on every rank
    /// once training is over (dropping the [`Mpi`] instead aborts the job). Errors: the
    /// barrier's (the group failed, or the ranks disagree).
    ///
    /// After ranks disagreed ([`DistError::Mismatch`], which every rank sees alike) the ranks
    /// still finalize without a barrier; after any other failure this returns it and the drop
    /// aborts the job.
    pub fn finalize(self) -> Result<()> {
        let failed = self.lock().failed.clone();
        match failed {
            Some(DistError::Mismatch { .. }) => {}
            Some(e) => return Err(e),
            None => self.barrier()?,
        }
        let mut st = self.lock();
        drop(st.universe.take());
        Ok(())
    }

    /// Ends the whole job now (`MPI_Abort` with `code`): every rank's process exits, and
    /// `mpirun` exits non-zero. For a rank that cannot go on, after it printed why.
    pub fn abort(&self, code: i32) -> ! {
        self.lock().comm.abort(code)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one collective with the state locked; a failure other than a call's own arguments
    /// fails the group, and every later call returns it.
    fn collective<T>(&self, call: &Call, f: impl FnOnce(&State) -> Result<T>) -> Result<T> {
        let mut st = self.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let out = self.agree(&st, call).and_then(|()| f(&st));
        if let Err(e) = &out {
            st.failed = Some(e.clone());
        }
        out
    }

    /// Refuses a tensor that is not on the CPU, or whose elements are not 1, 2, 4 or 8 bytes.
    fn check(&self, op: Op, t: &Tensor) -> Result<()> {
        let reason = if t.device() != Device::Cpu {
            format!("MPI takes CPU tensors, found a tensor on {:?}", t.device())
        } else if !matches!(t.kind().elt_size_in_bytes(), 1 | 2 | 4 | 8) {
            format!(
                "MPI takes elements of 1, 2, 4 or 8 bytes, found {:?}",
                t.kind()
            )
        } else if Count::try_from(t.numel()).is_err() {
            format!("MPI takes fewer than 2^31 elements, found {}", t.numel())
        } else {
            return Ok(());
        };
        Err(DistError::Argument {
            op,
            rank: self.rank,
            reason,
        })
    }

    fn tensor_err(&self, op: Op) -> impl Fn(tch::TchError) -> DistError + '_ {
        move |e| DistError::tensor(op, self.rank, e)
    }

    /// This rank's shard of the reduction of every rank's `flat` (contiguous, 1-D): an
    /// all-to-all of shards, then the sum of the W copies in rank order.
    fn reduce_shards(&self, st: &State, op: Op, flat: &Tensor, reduce: ReduceOp) -> Result<Tensor> {
        let (n, w) = (flat.numel(), self.world);
        let mine = shard_range(n, w, self.rank).len();
        let from = Tensor::f_empty([(w * mine) as i64], (flat.kind(), Device::Cpu))
            .map_err(self.tensor_err(op))?;
        let send = Shards::of(n, w);
        let recv = Shards::even(mine, w);
        let dt = element_type(flat.kind());
        // SAFETY: both tensors are contiguous CPU tensors of their counts' elements, alive and
        // not otherwise used until the call returns; `from` is written by MPI only.
        unsafe {
            let (s, r) = (bytes(flat), bytes_mut(&from));
            let s = View::with_count_and_datatype(s, n as Count, &dt);
            let mut r =
                mpi::datatype::MutView::with_count_and_datatype(r, (w * mine) as Count, &dt);
            let s = Partition::new(&s, &send.counts[..], &send.displs[..]);
            let mut r = PartitionMut::new(&mut r, &recv.counts[..], &recv.displs[..]);
            st.comm.all_to_all_varcount_into(&s, &mut r);
        }
        let parts = (0..w)
            .map(|p| from.f_narrow(0, (p * mine) as i64, mine as i64))
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.tensor_err(op))?;
        reduce_in_rank_order(&parts, reduce).map_err(self.tensor_err(op))
    }

    /// The whole flat tensor of `n` elements whose shard on each rank is that rank's `mine`
    /// (contiguous, 1-D).
    fn gather_shards(&self, st: &State, op: Op, mine: &Tensor, n: usize) -> Result<Tensor> {
        let whole =
            Tensor::f_empty([n as i64], (mine.kind(), Device::Cpu)).map_err(self.tensor_err(op))?;
        self.gather_shards_into(st, mine, &whole);
        Ok(whole)
    }

    /// `whole` (contiguous, on the CPU) ← the ranks' `mine` (contiguous, 1-D, not overlapping
    /// `whole`) in rank order.
    fn gather_shards_into(&self, st: &State, mine: &Tensor, whole: &Tensor) {
        let n = whole.numel();
        let recv = Shards::of(n, self.world);
        let dt = element_type(mine.kind());
        // SAFETY: as in `reduce_shards`; `whole` is written by MPI only, and the two do not
        // overlap (the callers' contract).
        unsafe {
            let (s, r) = (bytes(mine), bytes_mut(whole));
            let s = View::with_count_and_datatype(s, mine.numel() as Count, &dt);
            let mut r = mpi::datatype::MutView::with_count_and_datatype(r, n as Count, &dt);
            let mut r = PartitionMut::new(&mut r, &recv.counts[..], &recv.displs[..]);
            st.comm.all_gather_varcount_into(&s, &mut r);
        }
    }

    /// `MPI_COMM_WORLD`'s calls of this round, gathered: [`DistError::Mismatch`] on every rank
    /// when one differs from rank 0's, [`DistError::Timeout`] when not every rank arrives
    /// within the timeout.
    fn agree(&self, st: &State, call: &Call) -> Result<()> {
        // Buffers of the request's own: after a timeout it stays pending and MPI may still
        // write them, so they are freed only once it has completed.
        let send: *mut [i64; 5] = Box::into_raw(Box::new(call.encode()));
        let recv: *mut [i64] = Box::into_raw(vec![0i64; 5 * self.world].into_boxed_slice());
        // SAFETY: both point to live allocations, freed below only after the request completed.
        let (send_ref, recv_ref): (&'static [i64; 5], &'static mut [i64]) =
            unsafe { (&*send, &mut *recv) };
        let mut request = st
            .comm
            .immediate_all_gather_into(StaticScope, &send_ref[..], recv_ref);
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            match request.test() {
                Ok(_) => break,
                Err(pending) => request = pending,
            }
            if start.elapsed() >= self.timeout {
                // SAFETY: the request is left pending, unregistered from a scope that tracks
                // nothing; its buffers are leaked, so MPI may still write them.
                let _ = unsafe { request.into_raw() };
                return Err(DistError::Timeout {
                    op: call.op,
                    missing: (0..self.world).filter(|&r| r != self.rank).collect(),
                    waited: self.timeout,
                });
            }
            polls += 1;
            pause(polls);
        }
        // SAFETY: the request has completed, so MPI no longer reads `send` nor writes `recv`;
        // both came from `Box::into_raw` above and are freed once, here.
        let all = unsafe {
            drop(Box::from_raw(send));
            Box::from_raw(recv)
        };
        check_agreement(&all)
    }

    /// `t` as a flat, contiguous tensor (a view of `t` when `t` is contiguous).
    fn flat(&self, op: Op, t: &Tensor) -> Result<Tensor> {
        t.f_reshape([-1])
            .and_then(|f| f.f_contiguous())
            .map_err(self.tensor_err(op))
    }
}

impl Drop for Mpi {
    /// Without [`Mpi::finalize`], a rank of several aborts the job (see the module docs).
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if st.universe.is_some() && self.world > 1 {
            eprintln!(
                "kappa-dist: rank {} of {} ends the MPI job: its communicator was dropped \
                 without Mpi::finalize (the rank failed or returned early)",
                self.rank, self.world
            );
            st.comm.abort(1);
        }
    }
}

/// Between two polls of a pending agreement: yield for the first thousand (ranks that arrive
/// together meet within microseconds), then sleep 50 µs, doubling to 0.5 ms, so that a rank
/// that waits long costs little CPU and learns of the last arrival within half a millisecond.
fn pause(polls: u32) {
    if polls < 1000 {
        std::thread::yield_now();
    } else {
        let micros = 50u64 << (polls - 1000).min(4);
        std::thread::sleep(Duration::from_micros(micros.min(500)));
    }
}

/// The counts and offsets, in elements, of the W shards of a tensor.
struct Shards {
    counts: Vec<Count>,
    displs: Vec<Count>,
}

impl Shards {
    /// The shards of [`shard_range`] of `n` elements over `w` ranks.
    fn of(n: usize, w: usize) -> Self {
        Self::from_ranges((0..w).map(|p| shard_range(n, w, p)))
    }

    /// `w` runs of `len` elements, one after the other.
    fn even(len: usize, w: usize) -> Self {
        Self::from_ranges((0..w).map(|p| p * len..(p + 1) * len))
    }

    fn from_ranges(ranges: impl Iterator<Item = Range<usize>>) -> Self {
        // The callers checked that every tensor holds fewer than 2^31 elements.
        let (counts, displs) = ranges.map(|r| (r.len() as Count, r.start as Count)).unzip();
        Self { counts, displs }
    }
}

/// An MPI datatype of one element of `kind`: its bytes, contiguous.
fn element_type(kind: Kind) -> UserDatatype {
    UserDatatype::contiguous(
        kind.elt_size_in_bytes() as Count,
        &u8::equivalent_datatype(),
    )
}

/// Where the byte slice of an empty tensor points: aligned, not null, and not 1, which Open MPI
/// reads as `MPI_IN_PLACE` (the address of an empty Rust slice of bytes is 1).
const EMPTY: std::ptr::NonNull<u8> = std::ptr::NonNull::<u64>::dangling().cast();

/// The bytes of a contiguous CPU tensor.
///
/// # Safety
/// `t` is contiguous and on the CPU, and nobody writes it while the slice lives.
unsafe fn bytes(t: &Tensor) -> &[u8] {
    let n = t.numel() * t.kind().elt_size_in_bytes();
    if n == 0 {
        return std::slice::from_raw_parts(EMPTY.as_ptr(), 0);
    }
    std::slice::from_raw_parts(t.data_ptr() as *const u8, n)
}

/// Whether the memory of two contiguous CPU tensors overlaps.
fn overlaps(a: &Tensor, b: &Tensor) -> bool {
    let span = |t: &Tensor| {
        let start = t.data_ptr() as usize;
        start..start + t.numel() * t.kind().elt_size_in_bytes()
    };
    let (a, b) = (span(a), span(b));
    a.start < b.end && b.start < a.end
}

/// The bytes of a contiguous CPU tensor, to be written.
///
/// # Safety
/// `t` is contiguous and on the CPU, and nobody else reads or writes it while the slice lives.
#[allow(clippy::mut_from_ref)]
unsafe fn bytes_mut(t: &Tensor) -> &mut [u8] {
    let n = t.numel() * t.kind().elt_size_in_bytes();
    if n == 0 {
        return std::slice::from_raw_parts_mut(EMPTY.as_ptr(), 0);
    }
    std::slice::from_raw_parts_mut(t.data_ptr() as *mut u8, n)
}

impl Communicator for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce(&self, t: &mut Tensor, reduce: ReduceOp) -> Result<()> {
        let op = Op::AllReduce;
        self.check(op, t)?;
        let call = Call::all_reduce(self.rank, t, reduce)?;
        self.collective(&call, |st| {
            let flat = self.flat(op, t)?;
            let reduced = self.reduce_shards(st, op, &flat, reduce)?;
            let whole = self.gather_shards(st, op, &reduced, flat.numel())?;
            write_into(op, self.rank, t, &whole)
        })
    }

    fn reduce_scatter(&self, input: &Tensor, out: &mut Tensor, reduce: ReduceOp) -> Result<()> {
        let op = Op::ReduceScatter;
        self.check(op, input)?;
        self.check(op, out)?;
        let call = Call::reduce_scatter(self.rank, self.world, input, out, reduce)?;
        self.collective(&call, |st| {
            let flat = self.flat(op, input)?;
            let reduced = self.reduce_shards(st, op, &flat, reduce)?;
            write_into(op, self.rank, out, &reduced)
        })
    }

    fn all_gather(&self, shard: &Tensor, out: &mut Tensor) -> Result<()> {
        let op = Op::AllGather;
        self.check(op, shard)?;
        self.check(op, out)?;
        let call = Call::all_gather(self.rank, self.world, shard, out)?;
        self.collective(&call, |st| {
            let shard = self.flat(op, shard)?;
            if !out.is_contiguous() {
                let whole = self.gather_shards(st, op, &shard, out.numel())?;
                return write_into(op, self.rank, out, &whole);
            }
            // Straight into `out`; MPI's send and receive buffers must not overlap, so a shard
            // that lies in `out` (a gather in place) is sent from a copy.
            let send = match overlaps(&shard, out) {
                true => Tensor::f_empty_like(&shard)
                    .and_then(|mut copy| copy.f_copy_(&shard).map(|()| copy))
                    .map_err(self.tensor_err(op))?,
                false => shard,
            };
            self.gather_shards_into(st, &send, out);
            Ok(())
        })
    }

    fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        let op = Op::Broadcast;
        self.check(op, t)?;
        let call = Call::broadcast(self.rank, self.world, t, root)?;
        self.collective(&call, |st| {
            // A copy: `t` may be a view whose memory is not contiguous.
            let flat = (self.flat(op, t)?)
                .f_to_device_(Device::Cpu, t.kind(), false, true)
                .map_err(self.tensor_err(op))?;
            let dt = element_type(flat.kind());
            // SAFETY: `flat` is a contiguous CPU tensor of its own, alive until the call
            // returns; MPI reads it on the root and writes it elsewhere.
            unsafe {
                let b = bytes_mut(&flat);
                let n = flat.numel() as Count;
                let mut b = mpi::datatype::MutView::with_count_and_datatype(b, n, &dt);
                st.comm.process_at_rank(root as i32).broadcast_into(&mut b);
            }
            write_into(op, self.rank, t, &flat)
        })
    }

    /// The agreement exchange: every rank has reached the barrier when it returns.
    fn barrier(&self) -> Result<()> {
        self.collective(&Call::barrier(), |_| Ok(()))
    }

    fn tensor_device(&self) -> Option<tch::Device> {
        Some(tch::Device::Cpu)
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
