//! The transfers under [`Nccl`]'s collectives: the agreement on each call, the all-to-all of
//! shards, the gather of shards, the broadcast, and the wait for the stream.

// FFI into NCCL and the CUDA driver: every unsafe block states what makes it sound.
#![allow(unsafe_code)]

use std::ptr;
use std::time::{Duration, Instant};

use tch::{Kind, Tensor};

use super::{check, ffi, transport, Nccl, State};
use crate::error::{DistError, Op, Result};
use crate::rules::{check_agreement, reduce_in_rank_order, shard_range, Call, ReduceOp};

impl Nccl {
    /// Every rank's call, gathered; the first rank whose call differs from rank 0's fails the
    /// collective on every rank with [`DistError::Mismatch`].
    pub(super) fn agree(&self, st: &State, call: &Call) -> Result<()> {
        let op = call.op;
        let mine = Tensor::from_slice(&call.encode())
            .f_to(self.device())
            .map_err(|e| DistError::tensor(op, self.rank, e))?;
        let all = self.gather_shards(st, op, &mine, 5 * self.world)?;
        let all = Vec::<i64>::try_from(&all).map_err(|e| DistError::tensor(op, self.rank, e))?;
        check_agreement(&all)
    }

    /// `t` as a flat, contiguous tensor (a view of `t` when `t` is contiguous).
    pub(super) fn flat(&self, op: Op, t: &Tensor) -> Result<Tensor> {
        t.f_reshape([-1])
            .and_then(|f| f.f_contiguous())
            .map_err(|e| DistError::tensor(op, self.rank, e))
    }

    /// This rank's shard of the reduction of every rank's `flat`: an all-to-all of shards, then
    /// the sum of the W copies in rank order.
    pub(super) fn reduce_shards(
        &self,
        st: &State,
        op: Op,
        flat: &Tensor,
        reduce: ReduceOp,
    ) -> Result<Tensor> {
        let n = flat.numel();
        let mine = shard_range(n, self.world, self.rank).len();
        let to = self.shards(op, flat, n)?;
        let mut from = Vec::with_capacity(self.world);
        for (p, shard) in to.iter().enumerate() {
            from.push(if p == self.rank {
                shard.shallow_clone()
            } else {
                self.empty(op, mine, flat.kind())?
            });
        }
        self.swap(st, op, &to, &from)?;
        reduce_in_rank_order(&from, reduce).map_err(|e| DistError::tensor(op, self.rank, e))
    }

    /// The whole flat tensor of `n` elements whose shard on each rank is that rank's `mine`.
    pub(super) fn gather_shards(
        &self,
        st: &State,
        op: Op,
        mine: &Tensor,
        n: usize,
    ) -> Result<Tensor> {
        let whole = self.empty(op, n, mine.kind())?;
        let mut pieces = self.shards(op, &whole, n)?;
        let tensor = |e| DistError::tensor(op, self.rank, e);
        tch::no_grad(|| pieces[self.rank].f_copy_(mine)).map_err(tensor)?;
        let to: Vec<Tensor> = (0..self.world).map(|_| mine.shallow_clone()).collect();
        self.swap(st, op, &to, &pieces)?;
        Ok(whole)
    }

    /// `ncclBroadcast` of `flat`'s bytes from `root`, in place.
    pub(super) fn broadcast_bytes(
        &self,
        st: &State,
        op: Op,
        flat: &Tensor,
        root: usize,
    ) -> Result<()> {
        let api = ffi::nccl().map_err(|m| transport(self.rank, m))?;
        let bytes = flat.numel() * flat.kind().elt_size_in_bytes();
        if bytes > 0 {
            let root = super::to_c_int(self.rank, root)?;
            let p = flat.data_ptr();
            // SAFETY: p holds `bytes` bytes on this rank's GPU and lives until `wait` returns.
            let status = unsafe {
                (api.broadcast)(p, p, bytes, ffi::NCCL_UINT8, root, st.comm, ptr::null_mut())
            };
            check(api, self.rank, status)?;
        }
        self.wait(st, op)
    }

    /// The W shards of a flat `t` of `n` elements, as views.
    fn shards(&self, op: Op, t: &Tensor, n: usize) -> Result<Vec<Tensor>> {
        (0..self.world)
            .map(|p| {
                let r = shard_range(n, self.world, p);
                t.f_narrow(0, r.start as i64, r.len() as i64)
                    .map_err(|e| DistError::tensor(op, self.rank, e))
            })
            .collect()
    }

    fn empty(&self, op: Op, n: usize, kind: Kind) -> Result<Tensor> {
        Tensor::f_empty([n as i64], (kind, self.device()))
            .map_err(|e| DistError::tensor(op, self.rank, e))
    }

    /// Sends `to[p]` to every peer p and receives `from[p]` from it, as one NCCL group, then
    /// waits for the transfers. Entries at this rank's index are not sent.
    fn swap(&self, st: &State, op: Op, to: &[Tensor], from: &[Tensor]) -> Result<()> {
        let api = ffi::nccl().map_err(|m| transport(self.rank, m))?;
        let bytes = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
        let null = ptr::null_mut();
        // SAFETY: group calls take no arguments.
        check(api, self.rank, unsafe { (api.group_start)() })?;
        let mut status = ffi::NCCL_SUCCESS;
        for p in (0..self.world).filter(|p| *p != self.rank) {
            let peer = super::to_c_int(self.rank, p)?;
            // SAFETY: each pointer holds the given bytes on this rank's GPU, and the tensors
            // live until `wait` has seen the transfers finish.
            unsafe {
                if status == ffi::NCCL_SUCCESS && bytes(&to[p]) > 0 {
                    let (s, n) = (to[p].data_ptr(), bytes(&to[p]));
                    status = (api.send)(s, n, ffi::NCCL_UINT8, peer, st.comm, null);
                }
                if status == ffi::NCCL_SUCCESS && bytes(&from[p]) > 0 {
                    let (r, n) = (from[p].data_ptr(), bytes(&from[p]));
                    status = (api.recv)(r, n, ffi::NCCL_UINT8, peer, st.comm, null);
                }
            }
        }
        // SAFETY: closes the group opened above, whatever happened inside it.
        let end = unsafe { (api.group_end)() };
        check(api, self.rank, status)?;
        check(api, self.rank, end)?;
        self.wait(st, op)
    }

    /// Returns once the default stream is idle; fails when NCCL reports an asynchronous error
    /// (a peer that died) or the group's timeout passes first.
    fn wait(&self, st: &State, op: Op) -> Result<()> {
        let api = ffi::nccl().map_err(|m| transport(self.rank, m))?;
        let driver = ffi::driver().map_err(|m| transport(self.rank, m))?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            // SAFETY: queries the current context's default stream.
            let s = unsafe { (driver.stream_query)(ptr::null_mut()) };
            if s == ffi::CUDA_SUCCESS {
                return Ok(());
            }
            if s != ffi::CUDA_ERROR_NOT_READY {
                let m = format!("{op}: CUDA error {s} on the default stream");
                return Err(transport(self.rank, m));
            }
            let mut async_error = ffi::NCCL_SUCCESS;
            // SAFETY: writes one ncclResult_t.
            check(api, self.rank, unsafe {
                (api.comm_get_async_error)(st.comm, &mut async_error)
            })?;
            if async_error != ffi::NCCL_SUCCESS && async_error != ffi::NCCL_IN_PROGRESS {
                return Err(transport(
                    self.rank,
                    format!("{op}: {}", api.message(async_error)),
                ));
            }
            if start.elapsed() >= self.timeout {
                let missing = (0..self.world).filter(|r| *r != self.rank).collect();
                return Err(DistError::Timeout {
                    op,
                    missing,
                    waited: self.timeout,
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}
