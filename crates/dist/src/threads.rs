//! [`Threads`]: a group of N ranks that are threads of one process, for tests of code that runs
//! on many ranks, under `cargo test` and without any transport.
//!
//! # How a collective runs
//!
//! The ranks share one state behind a mutex. Collectives are numbered per rank (rounds 0, 1, …);
//! in round k each rank leaves its call (checked against its own arguments) and a handle on its
//! tensor, and waits. The last rank to arrive checks that the calls agree with rank 0's
//! ([`DistError::Mismatch`] otherwise) and, for a reduction, computes the result once, on the
//! CPU, in the order of [`crate::rules`]. Each rank then writes its part into its own tensor,
//! outside the lock, so that the ranks copy at once: the reduction's part, or straight from the
//! other ranks' tensors (an all-gather's shards in rank order, a broadcast's root). When all
//! have written, round k + 1 opens. While a round is open no rank's tensor changes, since each
//! caller is blocked in it: a rank whose tensor the others read (an all-gather's shard, a
//! broadcast's root) returns only once every rank has written its part.
//!
//! # Failure
//!
//! Dropping a `Threads` (its rank returned or panicked) marks the rank gone: ranks waiting in a
//! round it never joined fail at once with [`DistError::RankGone`]. A rank waiting longer than
//! the group's timeout fails with [`DistError::Timeout`] naming the ranks it waited for. Either
//! way the group is failed: every later call of every rank returns the same error.

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tch::Tensor;

use crate::error::{DistError, Op, Result};
use crate::rules::{reduce_in_rank_order, shard_range, write_into, Call, ReduceOp};
use crate::Communicator;

/// How long a rank waits in a collective for the others by default: 5 minutes, longer than
/// any evaluation or checkpoint a rank runs between two collectives of a training step (the
/// others wait for it meanwhile). [`Threads::group`] takes another.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// One rank of a group of threads ([`Threads::run`], [`Threads::group`]).
pub struct Threads {
    rank: usize,
    /// This rank's next round.
    round: AtomicU64,
    shared: Arc<Shared>,
}

struct Shared {
    world: usize,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

/// The open round.
struct State {
    round: u64,
    /// Each rank's call and tensor (none for a broadcast's receivers and a barrier).
    calls: Vec<Option<(Call, Option<Tensor>)>>,
    /// Whether the result is computed (it is `None` for a barrier).
    complete: bool,
    result: Option<Tensor>,
    /// The ranks that have written their part of the result.
    took: Vec<bool>,
    gone: Vec<bool>,
    failed: Option<DistError>,
}

impl fmt::Debug for Threads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Threads")
            .field("rank", &self.rank)
            .field("world", &self.shared.world)
            .field("timeout", &self.shared.timeout)
            .finish()
    }
}

impl Threads {
    /// The `world` ranks of a new group whose collectives wait at most `timeout` for the
    /// others; hand each to one thread. Errors: a world of 0.
    pub fn group(world: usize, timeout: Duration) -> Result<Vec<Threads>> {
        if world == 0 {
            return Err(DistError::World {
                world,
                reason: "a group needs at least one rank".into(),
            });
        }
        let state = State {
            round: 0,
            calls: (0..world).map(|_| None).collect(),
            complete: false,
            result: None,
            took: vec![false; world],
            gone: vec![false; world],
            failed: None,
        };
        let shared = Arc::new(Shared {
            world,
            timeout,
            state: Mutex::new(state),
            changed: Condvar::new(),
        });
        let rank = |rank| Threads {
            rank,
            round: AtomicU64::new(0),
            shared: Arc::clone(&shared),
        };
        Ok((0..world).map(rank).collect())
    }

    /// Runs `f` on `world` threads, each with its rank of a new group ([`DEFAULT_TIMEOUT`]),
    /// and returns their results in rank order once all have returned.
    ///
    /// Errors: a world of 0, a thread that cannot start, or a rank that panicked
    /// ([`DistError::Panicked`], the lowest such rank); the other ranks' collectives then fail
    /// ([`DistError::RankGone`]) instead of waiting for it.
    ///
    /// ```
    /// use kappa_dist::{Communicator, Threads};
    /// let sums = Threads::run(3, |comm| {
    ///     let mut t = tch::Tensor::from_slice(&[comm.rank() as f32]);
    ///     comm.all_reduce_sum(&mut t).map(|()| t.double_value(&[0]))
    /// })?;
    /// assert_eq!(sums, [Ok(3.0), Ok(3.0), Ok(3.0)]); // 0 + 1 + 2 on every rank
    /// # Ok::<(), kappa_dist::DistError>(())
    /// ```
    pub fn run<R: Send>(world: usize, f: impl Fn(Threads) -> R + Sync) -> Result<Vec<R>> {
        Self::run_with_timeout(world, DEFAULT_TIMEOUT, f)
    }

    /// [`Threads::run`] with collectives that wait at most `timeout` for the other ranks.
    pub fn run_with_timeout<R: Send>(
        world: usize,
        timeout: Duration,
        f: impl Fn(Threads) -> R + Sync,
    ) -> Result<Vec<R>> {
        let comms = Self::group(world, timeout)?;
        let f = &f;
        std::thread::scope(|scope| {
            let handles: Vec<_> = (comms.into_iter())
                .map(|comm| {
                    let rank = comm.rank;
                    std::thread::Builder::new()
                        .name(format!("rank-{rank}"))
                        .spawn_scoped(scope, move || f(comm))
                        .map_err(|e| DistError::World {
                            world,
                            reason: format!("the thread of rank {rank} did not start: {e}"),
                        })
                })
                .collect();
            let mut results = Vec::with_capacity(world);
            let mut failure = None;
            for (rank, handle) in handles.into_iter().enumerate() {
                match handle.map(|h| h.join()) {
                    Ok(Ok(r)) => results.push(r),
                    Ok(Err(panic)) => {
                        let message = panic_message(panic.as_ref());
                        failure.get_or_insert(DistError::Panicked { rank, message });
                    }
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            failure.map_or(Ok(results), Err)
        })
    }

    /// One collective: leaves `call` and `data`, waits for the round's result, and hands it
    /// and the ranks' tensors (an all-gather's or a broadcast's, which `finish` reads) to
    /// `finish`, outside the lock, to write this rank's part.
    fn collective(
        &self,
        call: Call,
        data: Option<Tensor>,
        finish: impl FnOnce(Option<&Tensor>, &[Tensor]) -> Result<()>,
    ) -> Result<()> {
        let (op, sh) = (call.op, &*self.shared);
        let round = self.round.load(Ordering::SeqCst);
        let deadline = Instant::now() + sh.timeout;
        let mut st = sh.lock();
        // The previous round is over once every rank has written its part of it.
        while st.round != round && st.failed.is_none() {
            st = sh.wait_or_fail(st, deadline, op, |st, r| !st.took[r])?;
        }
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        st.calls[self.rank] = Some((call, data));
        if st.calls.iter().all(Option::is_some) {
            match tch::no_grad(|| complete_round(&st.calls, self.rank)) {
                Ok(result) => (st.result, st.complete) = (result, true),
                Err(e) => st.failed = Some(e),
            }
            sh.changed.notify_all();
        }
        while !st.complete && st.failed.is_none() {
            let gone = (0..sh.world).find(|&r| st.calls[r].is_none() && st.gone[r]);
            if let Some(rank) = gone {
                return Err(sh.fail(&mut st, DistError::RankGone { op, rank }));
            }
            st = sh.wait_or_fail(st, deadline, op, |st, r| st.calls[r].is_none())?;
        }
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let result = st.result.as_ref().map(Tensor::shallow_clone);
        let reads_inputs = matches!(op, Op::AllGather | Op::Broadcast);
        let inputs: Vec<Tensor> = (st.calls.iter().flatten())
            .filter_map(|(_, t)| t.as_ref().filter(|_| reads_inputs))
            .map(Tensor::shallow_clone)
            .collect();
        drop(st);
        let written = tch::no_grad(|| finish(result.as_ref(), &inputs));
        drop((result, inputs));
        let mut st = sh.lock();
        st.took[self.rank] = true;
        if st.took.iter().all(|&t| t) {
            st.next_round();
            sh.changed.notify_all();
        }
        self.round.store(round + 1, Ordering::SeqCst);
        // The others may still be reading this rank's tensor.
        while reads_inputs && st.round == round && st.failed.is_none() {
            st = sh.wait_or_fail(st, deadline, op, |st, r| !st.took[r])?;
        }
        written
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a change until `deadline`; past it, fails the group with a timeout naming the
    /// ranks for which `missing` holds.
    fn wait_or_fail<'a>(
        &self,
        st: MutexGuard<'a, State>,
        deadline: Instant,
        op: Op,
        missing: impl Fn(&State, usize) -> bool,
    ) -> Result<MutexGuard<'a, State>> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let mut st = st;
            let missing = (0..self.world).filter(|&r| missing(&st, r)).collect();
            let waited = self.timeout;
            return Err(self.fail(
                &mut st,
                DistError::Timeout {
                    op,
                    missing,
                    waited,
                },
            ));
        }
        let (st, _) = (self.changed.wait_timeout(st, left)).unwrap_or_else(PoisonError::into_inner);
        Ok(st)
    }

    /// Fails the group with `e` (or keeps its first failure) and wakes every rank.
    fn fail(&self, st: &mut State, e: DistError) -> DistError {
        let e = st.failed.get_or_insert(e).clone();
        self.changed.notify_all();
        e
    }
}

impl State {
    fn next_round(&mut self) {
        self.calls.iter_mut().for_each(|c| *c = None);
        self.took.iter_mut().for_each(|t| *t = false);
        (self.result, self.complete) = (None, false);
        self.round += 1;
    }
}

/// The result of a round whose every call is in (computed by rank `by`): an error naming the
/// first rank whose call differs from rank 0's, else the reduction (on the CPU), or nothing:
/// an all-gather and a broadcast are read from the ranks' tensors, a barrier has no result.
fn complete_round(calls: &[Option<(Call, Option<Tensor>)>], by: usize) -> Result<Option<Tensor>> {
    let calls: Vec<&(Call, Option<Tensor>)> = calls.iter().flatten().collect();
    let first = &calls[0].0;
    if let Some((rank, (call, _))) = calls.iter().enumerate().find(|(_, (c, _))| c != first) {
        return Err(DistError::Mismatch {
            rank,
            expected: first.to_string(),
            found: call.to_string(),
        });
    }
    match first.op {
        Op::AllReduce | Op::ReduceScatter => {
            let parts: Vec<Tensor> = (calls.iter())
                .filter_map(|(_, t)| t.as_ref().map(Tensor::shallow_clone))
                .collect();
            reduce_in_rank_order(&parts, first.reduce.unwrap_or(ReduceOp::Sum))
                .map(Some)
                .map_err(|e| DistError::tensor(first.op, by, e))
        }
        Op::AllGather | Op::Broadcast | Op::Barrier => Ok(None),
    }
}

/// Writes the ranks' `shards` into `out` in rank order: straight into its elements when it is
/// contiguous, else through one concatenation.
fn gather_into(rank: usize, shards: &[Tensor], out: &mut Tensor) -> Result<()> {
    let op = Op::AllGather;
    let flat = |t: &Tensor| t.f_reshape([-1]);
    if !out.is_contiguous() {
        let all = (shards.iter().map(flat).collect::<Result<Vec<_>, _>>())
            .and_then(|flats| Tensor::f_cat(&flats, 0));
        return write_into(
            op,
            rank,
            out,
            &all.map_err(|e| DistError::tensor(op, rank, e))?,
        );
    }
    let copied = out.f_view([-1]).and_then(|whole| {
        let mut start = 0;
        shards.iter().try_for_each(|shard| {
            let n = shard.numel() as i64;
            let mut part = whole.f_narrow(0, start, n)?;
            start += n;
            part.f_copy_(&flat(shard)?)
        })
    });
    copied.map_err(|e| DistError::tensor(op, rank, e))
}

impl Drop for Threads {
    /// Marks the rank gone: ranks waiting for it in a collective fail at once.
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.gone[self.rank] = true;
        self.shared.changed.notify_all();
    }
}

/// The text of a panic's payload (a `&str` or a `String`; a placeholder otherwise).
fn panic_message(panic: &(dyn Any + Send)) -> String {
    (panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

impl Communicator for Threads {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn all_reduce(&self, t: &mut Tensor, reduce: ReduceOp) -> Result<()> {
        let call = Call::all_reduce(self.rank, t, reduce)?;
        let mine = t.shallow_clone();
        self.collective(call, Some(mine), |result, _| match result {
            Some(r) => write_into(Op::AllReduce, self.rank, t, r),
            None => Ok(()),
        })
    }

    fn reduce_scatter(&self, input: &Tensor, out: &mut Tensor, reduce: ReduceOp) -> Result<()> {
        let (op, rank) = (Op::ReduceScatter, self.rank);
        let call = Call::reduce_scatter(rank, self.world(), input, out, reduce)?;
        let range = shard_range(input.numel(), self.world(), rank);
        self.collective(
            call,
            Some(input.shallow_clone()),
            |result, _| match result {
                Some(r) => {
                    let shard = r.f_narrow(0, range.start as i64, range.len() as i64);
                    write_into(
                        op,
                        rank,
                        out,
                        &shard.map_err(|e| DistError::tensor(op, rank, e))?,
                    )
                }
                None => Ok(()),
            },
        )
    }

    fn all_gather(&self, shard: &Tensor, out: &mut Tensor) -> Result<()> {
        let call = Call::all_gather(self.rank, self.world(), shard, out)?;
        self.collective(call, Some(shard.shallow_clone()), |_, shards| {
            gather_into(self.rank, shards, out)
        })
    }

    fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        let call = Call::broadcast(self.rank, self.world(), t, root)?;
        let mine = (self.rank == root).then(|| t.shallow_clone());
        self.collective(call, mine, |_, from_root| match from_root {
            [r] if self.rank != root => write_into(Op::Broadcast, self.rank, t, r),
            _ => Ok(()),
        })
    }

    fn barrier(&self) -> Result<()> {
        self.collective(Call::barrier(), None, |_, _| Ok(()))
    }
}
