//! Muon's and manifold Muon's blocks stepped once over the ranks of a data-parallel run
//! (feature `dist`, [`Optimizer::shard`]), as modded-nanogpt's, microsoft/dion's and
//! torchtitan's distributed Muon do.
//!
//! # What each rank steps
//!
//! A Muon or manifold-Muon group cuts its parameters into blocks ([`MatrixSpec`](super::MatrixSpec))
//! and batches the blocks of one shape, kind and device. Each batch of n blocks is split over the
//! W ranks by [`kappa_dist::shard_range`]: rank r steps blocks start(r) .. start(r) + len(r), the
//! first n mod W ranks one block more than the others. Every rank so owns about 1/W of every
//! shape, which balances the work without a cost model (blocks of one shape cost the same). A
//! batch of fewer blocks than ranks leaves the last W − n ranks without a block of it: they wait
//! for that batch's exchange (a model with one matrix per shape is not sped up). AdamW groups are
//! not sharded: every rank steps them whole, as without sharding. A group built
//! `with_batch(false)` is split the same way and steps its blocks one by one; manifold Muon's
//! `with_threads` is not used when sharded. A group's statistics ([`Optimizer::take_stats`])
//! count every rank's blocks: the ranks exchange them at the end of each step (a few numbers
//! per group), so they are those of the unsharded step; `seconds` is this rank's time.
//!
//! # What moves
//!
//! After stepping its blocks of a batch, each rank sends, per block, its new weight and its new
//! momentum buffer (in the weight's kind), and NorMuon's second moment (f64) when the group has
//! NorMuon: one [`Communicator::all_gather`] of the weights and momenta per batch, and one of the
//! second moments with NorMuon. Each rank's part of a gather is padded to ⌈n/W⌉ blocks (so that
//! the element split of `all_gather` falls on block boundaries); a rank then receives
//! (W − 1)·⌈n/W⌉ blocks' payload per batch against the least it needs, the n − len(r) blocks it
//! did not step: the same when W divides n, at most W − 1 blocks' more otherwise
//! ([`Optimizer::traffic`] counts both). The step count of every block advances on every rank.
//!
//! # Why the state stays replicated
//!
//! Every rank ends the step with every block's weight and state, as without sharding. Owning each
//! block's state on one rank (ZeRO-1) would divide the state's memory by W; replicated, the
//! momenta travel with the weights (twice the bytes) but a checkpoint is still a one-process
//! run's — rank 0's state, nothing per rank — and resumes on any number of ranks.
//!
//! # When the bits equal the unsharded step
//!
//! The ranks end every step with the same bits (each block is computed once and copied), and
//! those of the unsharded step when each matrix gets the same bits in a part of its batch as in
//! the whole. A rank steps its part with the batched call the whole batch takes, its working
//! precision decided on the whole batch's size (`Precision::Auto`'s rule). On the CPU,
//! libtorch's `bmm` gives a matrix the same bits in any batch of two or more at a fixed thread
//! count (MKL's `sgemm_batch` computes each matrix alone) but multiplies a batch of one with
//! another kernel (MKL's `sgemm` or libtorch's own), which rounds differently: so a part of one
//! block of a batch of several is stepped beside a copy of itself (one block's extra work, only
//! where a batch holds fewer than 2·W blocks). `tests/sharded.rs` checks the bits at one
//! libtorch thread per rank. On CUDA the same holds where cuBLAS's batched kernels compute each
//! matrix alone; it is not tested there.
//!
//! # Calling it
//!
//! Every rank must call [`Optimizer::step`] (with the same gradients: a data-parallel run
//! averages them first), since each step's exchanges are collectives. A rank whose step fails
//! before an exchange returns its error; the others fail in that exchange when it drops its
//! communicator, or after the communicator's timeout — an [`OptimError::Collective`] naming the
//! group, within an [`OptimError::Param`] naming the batch's parameters.
//!
//! [`Optimizer::shard`]: super::Optimizer::shard
//! [`Optimizer::take_stats`]: super::Optimizer::take_stats
//! [`Optimizer::traffic`]: super::Optimizer::traffic
//! [`Optimizer::step`]: super::Optimizer::step

use std::sync::Arc;
use std::time::Instant;

use kappa_dist::{shard_range, Communicator};
use tch::{Device, Kind, Tensor};

use super::jobs::{with_batch, Jobs, StepBatch};
use super::stats::Accumulator;
use crate::error::{libtorch, OptimError, Result};
use crate::{InputError, ManifoldState, MomentumState, MuonState};

/// The bytes one rank received in the exchanges of a sharded step, the least it needed (the
/// weights and states of the blocks other ranks stepped; module docs, "What moves"), and the
/// time the exchanges took.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    /// Bytes received (the padding of the gathers included).
    pub received: u64,
    /// Bytes of the blocks this rank did not step.
    pub minimum: u64,
    /// Seconds this rank spent in the exchanges, waiting for the other ranks included: the
    /// rest of its sharded groups' step is its own share of their updates.
    pub seconds: f64,
}

/// The ranks a sharded optimizer steps over, and the last step's traffic.
#[derive(Debug)]
pub(super) struct Sharding {
    comm: Arc<dyn Communicator>,
    traffic: Traffic,
    /// The gathers' buffers, kept between steps ([`Scratch`]).
    scratch: Scratch,
}

impl Sharding {
    /// Sharding over `comm`'s ranks, with no traffic yet.
    pub(super) fn new(comm: Arc<dyn Communicator>) -> Self {
        Sharding {
            comm,
            traffic: Traffic::default(),
            scratch: Scratch::default(),
        }
    }

    /// What this rank received in the last step's exchanges.
    pub(super) fn traffic(&self) -> Traffic {
        self.traffic
    }
}

/// A block's state as it travels between ranks: its momentum buffer and NorMuon's second
/// moment after a step.
pub(super) trait Shipped: Default {
    /// The momentum buffer.
    fn buffer(&self) -> Option<&Tensor>;
    /// NorMuon's second moment.
    fn second(&self) -> Option<&[f64]>;
    /// The state after one more step, from the stepping rank's buffer and second moment.
    fn advance(&mut self, buffer: Tensor, second: Option<Vec<f64>>);
    /// A copy with its own buffer.
    fn duplicate(&self) -> Result<Self>;
}

impl Shipped for MuonState<Tensor> {
    fn buffer(&self) -> Option<&Tensor> {
        MuonState::buffer(self)
    }

    fn second(&self) -> Option<&[f64]> {
        self.second_moment()
    }

    fn advance(&mut self, buffer: Tensor, second: Option<Vec<f64>>) {
        let momentum = MomentumState::from_parts(Some(buffer), self.steps() + 1);
        *self = MuonState::from_momentum(momentum, second);
    }

    fn duplicate(&self) -> Result<Self> {
        let buffer = self.buffer().map(copy_of).transpose()?;
        let momentum = MomentumState::from_parts(buffer, self.steps());
        Ok(MuonState::from_momentum(
            momentum,
            self.second().map(<[f64]>::to_vec),
        ))
    }
}

impl Shipped for ManifoldState<Tensor> {
    fn buffer(&self) -> Option<&Tensor> {
        MomentumState::buffer(self)
    }

    fn second(&self) -> Option<&[f64]> {
        None
    }

    fn advance(&mut self, buffer: Tensor, _: Option<Vec<f64>>) {
        *self = MomentumState::from_parts(Some(buffer), self.steps() + 1);
    }

    fn duplicate(&self) -> Result<Self> {
        let buffer = MomentumState::buffer(self).map(copy_of).transpose()?;
        Ok(MomentumState::from_parts(buffer, self.steps()))
    }
}

/// A copy of `t` in storage of its own.
fn copy_of(t: &Tensor) -> Result<Tensor> {
    let out = Tensor::f_empty_like(t).map_err(libtorch("shard"))?;
    out.shallow_clone().f_copy_(t).map_err(libtorch("shard"))?;
    Ok(out)
}

/// Steps block `w` (of a batch of `count`) beside a copy of itself, and keeps the statistics of
/// one. libtorch's CPU `bmm` multiplies one matrix with another kernel than a batch of two or
/// more (MKL's `sgemm` or its own, against `sgemm_batch`), which rounds differently; as the
/// second of a pair, the block takes the batch's kernel (module docs, "When the bits equal").
fn step_beside_copy<S: Shipped>(
    stats: &mut Accumulator,
    w: &mut Tensor,
    g: &Tensor,
    s: &mut S,
    count: usize,
    f: &mut impl StepBatch<S>,
) -> Result<()> {
    let mut ws = [copy_of(w)?, w.shallow_clone()];
    let gs = [g.shallow_clone(), g.shallow_clone()];
    let mut states = [s.duplicate()?, std::mem::take(s)];
    let mut pair = Accumulator::default();
    let result = f(&mut pair, &mut ws, &gs, &mut states, count);
    let [_, stepped] = states;
    *s = stepped;
    result?;
    stats.add_half_of(&pair);
    Ok(())
}

impl Sharding {
    /// Starts counting a step's traffic.
    pub(super) fn begin_step(&mut self) {
        self.traffic = Traffic::default();
    }

    /// Merges every group's statistics of the step just taken over the ranks (one
    /// [`Communicator::all_gather`] of a few numbers per group): each block was stepped on one
    /// rank, so counts and sums add and maxima are the ranks' largest. A group's `seconds` stay
    /// this rank's: the ranks step together.
    pub(super) fn merge_stats(
        &self,
        groups: &mut [(&mut Accumulator, &mut Accumulator)],
        device: Device,
    ) -> Result<()> {
        let row = Accumulator::ROW;
        let mine: Vec<f64> = (groups.iter())
            .flat_map(|(pending, _)| pending.to_row())
            .collect();
        let world = self.comm.world();
        let options = (Kind::Double, device);
        let tensors = || -> std::result::Result<(Tensor, Tensor), tch::TchError> {
            let out = Tensor::f_empty([(world * mine.len()) as i64], options)?;
            Ok((Tensor::f_from_slice(&mine)?.f_to_device(device)?, out))
        };
        let (mine, mut out) = tensors().map_err(libtorch("statistics"))?;
        self.comm
            .all_gather(&mine, &mut out)
            .map_err(|source| OptimError::Collective {
                group: "(statistics)".to_string(),
                source,
            })?;
        let all = (out.f_to_device(Device::Cpu))
            .and_then(Vec::<f64>::try_from)
            .map_err(libtorch("statistics"))?;
        let per_rank = groups.len() * row;
        for (i, (pending, stats)) in groups.iter_mut().enumerate() {
            let rows = (0..world).map(|r| &all[r * per_rank + i * row..][..row]);
            stats.add_rows(rows);
            **pending = Accumulator::default();
        }
        Ok(())
    }

    /// Steps this rank's part of each same-shape batch of `jobs` with `f` (batched when `batch`
    /// and the batch holds several blocks, else block by block), then gathers every block's
    /// weight and state; `second` is the length of a block's NorMuon second moment (`None`
    /// without NorMuon). Errors name the batch's parameters and, for an exchange, `group`.
    pub(super) fn run<S: Shipped>(
        &mut self,
        jobs: Jobs<'_, '_, S>,
        group: &str,
        batch: bool,
        stats: &mut Accumulator,
        second: impl Fn(&Tensor) -> Option<usize>,
        mut f: impl StepBatch<S>,
    ) -> Result<()> {
        let names = jobs.names;
        let (jobs, write_back) = jobs.into_parts();
        let (comm, world, rank) = (&*self.comm, self.comm.world(), self.comm.rank());
        let scratch = &mut self.scratch;
        for part in Jobs::batches(jobs, true) {
            let own = shard_range(part.len(), world, rank);
            let traffic = with_batch(names, part, |ws, gs, ss| {
                let n = ws.len();
                let (w, g, s) = (&mut ws[own.clone()], &gs[own.clone()], &mut ss[own.clone()]);
                if batch && n > 1 && w.len() == 1 {
                    step_beside_copy(stats, &mut w[0], &g[0], &mut s[0], n, &mut f)?;
                } else if batch && n > 1 && !w.is_empty() {
                    f(stats, w, g, s, n)?;
                } else {
                    for i in 0..w.len() {
                        let one = i..i + 1;
                        f(stats, &mut w[one.clone()], &g[one.clone()], &mut s[one], 1)?;
                    }
                }
                let mut exchange = Exchange {
                    comm,
                    group,
                    own: own.clone(),
                    scratch: &mut *scratch,
                };
                let started = Instant::now();
                let mut traffic = exchange.run(ws, ss, second(&ws[0]))?;
                traffic.seconds = started.elapsed().as_secs_f64();
                Ok(traffic)
            })?;
            self.traffic.received += traffic.received;
            self.traffic.minimum += traffic.minimum;
            self.traffic.seconds += traffic.seconds;
        }
        write_back()
    }
}

/// The buffers a step's gathers write into, kept between steps so that a step does not fault in
/// fresh pages for them (on the CPU, a gather of a GPT-2-small batch into new memory took about
/// as long as the copies themselves): one per payload (weights and momenta, NorMuon's second
/// moments), kind and device, as large as the largest gather yet. Each batch's gather is its
/// front part, and this rank's part of it is filled in place (the gather is in place: this
/// rank's shard is its own part of the output).
#[derive(Debug, Default)]
struct Scratch {
    buffers: Vec<(Payload, Kind, Device, Tensor)>,
}

/// What a gather carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Payload {
    WeightsAndMomenta,
    SecondMoments,
}

impl Scratch {
    /// The first `numel` elements of the buffer for `payload` of `options`, grown if needed.
    fn take(&mut self, payload: Payload, numel: i64, options: (Kind, Device)) -> Result<Tensor> {
        let at = (self.buffers.iter())
            .position(|(p, k, d, _)| (*p, *k, *d) == (payload, options.0, options.1));
        let fits = |t: &Tensor| t.numel() as i64 >= numel;
        let buffer = match at {
            Some(i) if fits(&self.buffers[i].3) => &self.buffers[i].3,
            found => {
                let fresh = Tensor::f_empty([numel], options).map_err(libtorch("shard"))?;
                let entry = (payload, options.0, options.1, fresh);
                let i = match found {
                    Some(i) => {
                        self.buffers[i] = entry;
                        i
                    }
                    None => {
                        self.buffers.push(entry);
                        self.buffers.len() - 1
                    }
                };
                &self.buffers[i].3
            }
        };
        buffer.f_narrow(0, 0, numel).map_err(libtorch("shard"))
    }
}

/// One batch's gathers: `own` is this rank's blocks of it.
struct Exchange<'c> {
    comm: &'c dyn Communicator,
    group: &'c str,
    own: std::ops::Range<usize>,
    scratch: &'c mut Scratch,
}

impl Exchange<'_> {
    /// Gathers every block's weight and momentum (and NorMuon's second moment of `second`
    /// values when given) from the rank that stepped it; returns the bytes moved. A block's
    /// momentum is copied into its state's buffer where that has the block's size and kind.
    fn run<S: Shipped>(
        &mut self,
        ws: &mut [Tensor],
        states: &mut [S],
        second: Option<usize>,
    ) -> Result<Traffic> {
        let (like, e) = (&ws[0], ws[0].numel() as i64);
        let options = (like.kind(), like.device());
        let mut pieces = Vec::with_capacity(2 * self.own.len());
        for (w, s) in ws[self.own.clone()].iter().zip(&states[self.own.clone()]) {
            pieces.push(flat(w)?);
            pieces.push(flat(momentum_of(w, s)?)?);
        }
        let payload = Payload::WeightsAndMomenta;
        let (weights, mut traffic) = self.gather(payload, pieces, 2 * e, ws.len(), options)?;
        let seconds = match second {
            Some(len) => {
                let mut pieces = Vec::with_capacity(self.own.len());
                for s in &states[self.own.clone()] {
                    pieces.push(second_of(s, len, like.device())?);
                }
                let options = (Kind::Double, like.device());
                let payload = Payload::SecondMoments;
                let (t, more) = self.gather(payload, pieces, len as i64, ws.len(), options)?;
                traffic.received += more.received;
                traffic.minimum += more.minimum;
                Some((t, len as i64))
            }
            None => None,
        };
        for i in (0..ws.len()).filter(|i| !self.own.contains(i)) {
            let slot = self.slot(i, ws.len());
            let row = weights.f_narrow(0, slot * 2 * e, 2 * e);
            let size = ws[i].size();
            let buffer = match states[i].buffer() {
                Some(b) if b.size() == size && b.kind() == ws[i].kind() => b.shallow_clone(),
                _ => Tensor::f_empty_like(&ws[i]).map_err(libtorch("shard"))?,
            };
            row.and_then(|row| {
                ws[i].f_copy_(&row.f_narrow(0, 0, e)?.f_view(&size[..])?)?;
                buffer
                    .shallow_clone()
                    .f_copy_(&row.f_narrow(0, e, e)?.f_view(&size[..])?)
            })
            .map_err(libtorch("shard"))?;
            let second = match &seconds {
                Some((t, len)) => Some(to_f64s(t, slot * len, *len)?),
                None => None,
            };
            states[i].advance(buffer, second);
        }
        Ok(traffic)
    }

    /// The ranks' `pieces` (this rank's blocks, `per` elements each) gathered in block order
    /// into the front of the scratch buffer for `payload`, each rank's part padded (with
    /// zeros) to the most blocks a rank steps of a batch of `n`.
    fn gather(
        &mut self,
        payload: Payload,
        pieces: Vec<Tensor>,
        per: i64,
        n: usize,
        options: (Kind, Device),
    ) -> Result<(Tensor, Traffic)> {
        let (world, rank) = (self.comm.world(), self.comm.rank());
        let most = shard_range(n, world, 0).len() as i64;
        let mut out = self
            .scratch
            .take(payload, world as i64 * most * per, options)?;
        let fill = || -> std::result::Result<Tensor, tch::TchError> {
            let mine = out.f_narrow(0, rank as i64 * most * per, most * per)?;
            let mut start = 0;
            for piece in &pieces {
                let len = piece.numel() as i64;
                mine.f_narrow(0, start, len)?.f_copy_(piece)?;
                start += len;
            }
            let _ = mine.f_narrow(0, start, most * per - start)?.f_zero_()?;
            Ok(mine)
        };
        let mine = fill().map_err(libtorch("shard"))?;
        self.comm
            .all_gather(&mine, &mut out)
            .map_err(|source| OptimError::Collective {
                group: self.group.to_string(),
                source,
            })?;
        let bytes = |blocks: i64| (blocks * per) as u64 * options.0.elt_size_in_bytes() as u64;
        let traffic = Traffic {
            received: bytes((world as i64 - 1) * most),
            minimum: bytes((n - self.own.len()) as i64),
            seconds: 0.0,
        };
        Ok((out, traffic))
    }

    /// Where block `i` of a batch of `n` lies in a gather: its rank's part, then its place in it.
    fn slot(&self, i: usize, n: usize) -> i64 {
        let world = self.comm.world();
        let most = shard_range(n, world, 0).len();
        let (rank, range) = (0..world)
            .map(|r| (r, shard_range(n, world, r)))
            .find(|(_, range)| range.contains(&i))
            .unwrap_or((0, 0..0));
        (rank * most + i - range.start) as i64
    }
}

/// `t` flattened (a copy when it is not contiguous).
fn flat(t: &Tensor) -> Result<Tensor> {
    t.f_reshape([-1]).map_err(libtorch("shard"))
}

/// The momentum buffer of a block `w` just stepped: of `w`'s size and kind.
fn momentum_of<'s, S: Shipped>(w: &Tensor, s: &'s S) -> Result<&'s Tensor> {
    match s.buffer() {
        Some(b) if b.size() == w.size() && b.kind() == w.kind() => Ok(b),
        Some(b) => Err(InputError::shape_mismatch(
            "state",
            format!("a momentum buffer of {:?} {:?}", w.size(), w.kind()),
            format!("{:?} {:?}", b.size(), b.kind()),
        )
        .into()),
        None => Err(InputError::invalid("state", "has no momentum buffer after a step").into()),
    }
}

/// NorMuon's second moment of a block just stepped, `len` values, as an f64 tensor on `device`.
fn second_of<S: Shipped>(s: &S, len: usize, device: Device) -> Result<Tensor> {
    match s.second() {
        Some(v) if v.len() == len => Tensor::from_slice(v)
            .f_to_device(device)
            .map_err(libtorch("shard")),
        found => Err(InputError::shape_mismatch(
            "state",
            format!("a NorMuon second moment of {len} values"),
            format!("{} values", found.map_or(0, <[f64]>::len)),
        )
        .into()),
    }
}

/// The `len` values of the f64 tensor `t` from `start` on.
fn to_f64s(t: &Tensor, start: i64, len: i64) -> Result<Vec<f64>> {
    t.f_narrow(0, start, len)
        .and_then(|c| c.f_to_device(Device::Cpu))
        .and_then(|c| Vec::<f64>::try_from(&c))
        .map_err(libtorch("shard"))
}
