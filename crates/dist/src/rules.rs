//! The rules every backend follows, written once: how a tensor is split into shards, in which
//! order and precision contributions are summed, and which calls are valid.
//!
//! # Shards
//!
//! [`Communicator::reduce_scatter`](crate::Communicator::reduce_scatter) and
//! [`Communicator::all_gather`](crate::Communicator::all_gather) cut a tensor of N elements
//! (flattened in row-major order) over W ranks as `torch.tensor_split` and `numpy.array_split`
//! do: with q = ⌊N/W⌋ and ρ = N mod W, rank r holds
//!
//! - len(r) = q + 1 for r < ρ, q otherwise;
//! - start(r) = r·q + min(r, ρ), so elements start(r) .. start(r) + len(r).
//!
//! The first ρ ranks hold one element more. The shards tile 0..N in rank order:
//! start(r) + len(r) = (r+1)·q + min(r+1, ρ) = start(r+1), and start(W) = W·q + ρ = N. With
//! N < W the last W − N shards are empty. [`shard_range`] computes it.
//!
//! # Sum order
//!
//! A sum over the ranks is ((x₀ + x₁) + x₂) + … + x_{W−1}, ascending in rank, element by
//! element, whatever the backend and whichever rank arrives first: the result is a pure function
//! of the contributions, so a run reproduces bit for bit. bf16 and f16 are widened to f32
//! (exactly), summed in f32 and rounded to their kind once at the end; every other kind is
//! summed in its own kind (f32 in f32, f64 in f64; integers wrap on overflow). The mean is that
//! sum divided by W in the same precision, before the one rounding. With W = 1 the sum and the
//! mean are the contribution itself, bit for bit.

use std::fmt;
use std::ops::Range;

use tch::{Kind, Tensor};

use crate::error::{DistError, Op, Result};

/// How contributions are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// x₀ + x₁ + … + x_{W−1}, in ascending rank order.
    Sum,
    /// The sum divided by W (floating-point kinds only).
    Mean,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
        })
    }
}

/// The elements of rank `rank`'s shard of `numel` elements split over `world` ranks (see the
/// [module docs](self#shards)); empty for `world` = 0 or `rank` ≥ `world`.
///
/// ```
/// // 11 elements over 3 ranks: 4, 4 and 3.
/// assert_eq!(kappa_dist::shard_range(11, 3, 0), 0..4);
/// assert_eq!(kappa_dist::shard_range(11, 3, 1), 4..8);
/// assert_eq!(kappa_dist::shard_range(11, 3, 2), 8..11);
/// ```
pub fn shard_range(numel: usize, world: usize, rank: usize) -> Range<usize> {
    if world == 0 || rank >= world {
        return 0..0;
    }
    let (q, rho) = (numel / world, numel % world);
    let start = rank * q + rank.min(rho);
    start..start + q + usize::from(rank < rho)
}

/// The kind a sum of `kind` is accumulated in ([module docs](self#sum-order)): f32 for bf16 and
/// f16, the kind itself for the other floating-point and integer kinds; `None` for kinds that
/// are not summed (bool, complex, quantized).
pub fn accumulation_kind(kind: Kind) -> Option<Kind> {
    match kind {
        Kind::BFloat16 | Kind::Half => Some(Kind::Float),
        Kind::Float | Kind::Double => Some(kind),
        Kind::Uint8 | Kind::Int8 | Kind::Int16 | Kind::Int | Kind::Int64 => Some(kind),
        _ => None,
    }
}

/// The flattened contributions `parts` (rank 0 first; one kind and element count) reduced in the
/// order and precision of the [module docs](self#sum-order), as a new 1-D tensor of their kind
/// on the first part's device that aliases none of them (the others are moved to that device).
pub fn reduce_in_rank_order(parts: &[Tensor], reduce: ReduceOp) -> Result<Tensor, tch::TchError> {
    let Some(first) = parts.first() else {
        return Ok(Tensor::new());
    };
    let kind = first.kind();
    let acc_kind = accumulation_kind(kind).unwrap_or(kind);
    let widened = |t: &Tensor, copy: bool| {
        t.f_reshape([-1])?
            .f_to_device_(first.device(), acc_kind, false, copy)
    };
    let mut acc = widened(first, true)?;
    for part in &parts[1..] {
        let _ = acc.f_add_(&widened(part, false)?)?;
    }
    if reduce == ReduceOp::Mean {
        let _ = acc.f_div_scalar_(parts.len() as f64)?;
    }
    acc.f_to_dtype(kind, false, false)
}

/// One rank's call of a collective, checked against its own arguments ([`Call::all_reduce`],
/// …); backends compare the calls of one round to find ranks that disagree.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Call {
    pub op: Op,
    pub reduce: Option<ReduceOp>,
    pub kind: Option<Kind>,
    /// The elements of the whole tensor: the input of a reduction or broadcast, the output of an
    /// all-gather.
    pub numel: usize,
    pub root: Option<usize>,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.op)?;
        if let Some(reduce) = self.reduce {
            write!(f, "({reduce})")?;
        }
        if let Some(root) = self.root {
            write!(f, " from rank {root}")?;
        }
        if let Some(kind) = self.kind {
            write!(f, " of {} {kind:?} elements", self.numel)?;
        }
        Ok(())
    }
}

impl Call {
    /// [`Communicator::all_reduce`](crate::Communicator::all_reduce) of `t`.
    pub fn all_reduce(rank: usize, t: &Tensor, reduce: ReduceOp) -> Result<Self> {
        check_reducible(Op::AllReduce, rank, t.kind(), reduce)?;
        Ok(Self::of(Op::AllReduce, Some(reduce), t, None))
    }

    /// [`Communicator::reduce_scatter`](crate::Communicator::reduce_scatter) of `input` into
    /// `out`, which must be of its kind and hold this rank's shard.
    pub fn reduce_scatter(
        rank: usize,
        world: usize,
        input: &Tensor,
        out: &Tensor,
        reduce: ReduceOp,
    ) -> Result<Self> {
        let op = Op::ReduceScatter;
        check_reducible(op, rank, input.kind(), reduce)?;
        check_same_kind(op, rank, input, out, "input")?;
        let expected = shard_range(input.numel(), world, rank).len();
        check_size(op, rank, "out", expected, out.numel())?;
        Ok(Self::of(op, Some(reduce), input, None))
    }

    /// [`Communicator::all_gather`](crate::Communicator::all_gather) of `shard` into `out`: the
    /// shard must be of `out`'s kind and hold this rank's shard of `out`'s elements.
    pub fn all_gather(rank: usize, world: usize, shard: &Tensor, out: &Tensor) -> Result<Self> {
        let op = Op::AllGather;
        check_listed(op, rank, out.kind())?;
        check_same_kind(op, rank, shard, out, "shard")?;
        let expected = shard_range(out.numel(), world, rank).len();
        check_size(op, rank, "shard", expected, shard.numel())?;
        Ok(Self::of(op, None, out, None))
    }

    /// [`Communicator::broadcast`](crate::Communicator::broadcast) of `t` from `root`.
    pub fn broadcast(rank: usize, world: usize, t: &Tensor, root: usize) -> Result<Self> {
        check_listed(Op::Broadcast, rank, t.kind())?;
        if root >= world {
            return Err(DistError::Argument {
                op: Op::Broadcast,
                rank,
                reason: format!("the root must lie in 0..{world}, found {root}"),
            });
        }
        Ok(Self::of(Op::Broadcast, None, t, Some(root)))
    }

    /// [`Communicator::barrier`](crate::Communicator::barrier).
    pub fn barrier() -> Self {
        Self {
            op: Op::Barrier,
            reduce: None,
            kind: None,
            numel: 0,
            root: None,
        }
    }

    fn of(op: Op, reduce: Option<ReduceOp>, t: &Tensor, root: Option<usize>) -> Self {
        Self {
            op,
            reduce,
            kind: Some(t.kind()),
            numel: t.numel(),
            root,
        }
    }
}

/// The element kinds a call descriptor names, by index ([`Call::encode`]): the only kinds a
/// collective takes ([`check_listed`]), so that ranks that agree on a call agree on its bytes.
const KINDS: [Kind; 11] = [
    Kind::Uint8,
    Kind::Int8,
    Kind::Int16,
    Kind::Int,
    Kind::Int64,
    Kind::Half,
    Kind::Float,
    Kind::Double,
    Kind::Bool,
    Kind::BFloat16,
    Kind::ComplexFloat,
];

/// The operations a call descriptor names, by index ([`Call::encode`]).
#[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
const OPS: [Op; 5] = [
    Op::AllReduce,
    Op::ReduceScatter,
    Op::AllGather,
    Op::Broadcast,
    Op::Barrier,
];

#[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
impl Call {
    /// The call as five integers, what backends over a transport exchange to agree on a round:
    /// operation, reduction (0 none, 1 sum, 2 mean), kind (an index into [`KINDS`], −1 none; the
    /// constructors refuse any other kind, which would be −2), element count, root (−1 none).
    pub fn encode(&self) -> [i64; 5] {
        let op = OPS.iter().position(|o| *o == self.op).unwrap_or(0) as i64;
        let reduce = match self.reduce {
            None => 0,
            Some(ReduceOp::Sum) => 1,
            Some(ReduceOp::Mean) => 2,
        };
        let kind = self.kind.map_or(-1, |k| {
            KINDS.iter().position(|x| *x == k).map_or(-2, |i| i as i64)
        });
        let root = self.root.map_or(-1, |r| r as i64);
        [op, reduce, kind, self.numel as i64, root]
    }

    /// The call [`Call::encode`] wrote (a kind outside [`KINDS`] comes back as none).
    pub fn decode(v: [i64; 5]) -> Self {
        Call {
            op: OPS[usize::try_from(v[0]).unwrap_or(0).min(OPS.len() - 1)],
            reduce: match v[1] {
                1 => Some(ReduceOp::Sum),
                2 => Some(ReduceOp::Mean),
                _ => None,
            },
            kind: usize::try_from(v[2])
                .ok()
                .and_then(|i| KINDS.get(i).copied()),
            numel: usize::try_from(v[3]).unwrap_or(0),
            root: usize::try_from(v[4]).ok(),
        }
    }
}

/// The ranks' calls of one round as [`Call::encode`] wrote them, concatenated in rank order:
/// [`DistError::Mismatch`] naming the first rank whose call differs from rank 0's.
#[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
pub(crate) fn check_agreement(encoded: &[i64]) -> Result<()> {
    let calls: Vec<[i64; 5]> = (encoded.chunks_exact(5))
        .map(|c| [c[0], c[1], c[2], c[3], c[4]])
        .collect();
    match calls.iter().position(|c| *c != calls[0]) {
        None => Ok(()),
        Some(rank) => Err(DistError::Mismatch {
            rank,
            expected: Call::decode(calls[0]).to_string(),
            found: Call::decode(calls[rank]).to_string(),
        }),
    }
}

/// `kind` can be reduced by `reduce`: it has an [`accumulation_kind`], and a mean needs a
/// floating-point kind.
fn check_reducible(op: Op, rank: usize, kind: Kind, reduce: ReduceOp) -> Result<()> {
    let floating = matches!(
        kind,
        Kind::BFloat16 | Kind::Half | Kind::Float | Kind::Double
    );
    if accumulation_kind(kind).is_none() || (reduce == ReduceOp::Mean && !floating) {
        let allowed = match reduce {
            ReduceOp::Sum => "bf16, f16, f32, f64 or an integer kind",
            ReduceOp::Mean => "bf16, f16, f32 or f64",
        };
        return Err(DistError::Argument {
            op,
            rank,
            reason: format!("a {reduce} of {kind:?} elements: the kind must be {allowed}"),
        });
    }
    Ok(())
}

/// `kind` is one of [`KINDS`]: a kind outside them would reach the agreement as one code for
/// all (complex f16 and complex f64 alike), though their elements differ in size.
fn check_listed(op: Op, rank: usize, kind: Kind) -> Result<()> {
    if KINDS.contains(&kind) {
        return Ok(());
    }
    Err(DistError::Argument {
        op,
        rank,
        reason: format!("{kind:?} elements: a collective takes {KINDS:?}"),
    })
}

fn check_same_kind(op: Op, rank: usize, a: &Tensor, out: &Tensor, what: &str) -> Result<()> {
    if a.kind() != out.kind() {
        return Err(DistError::Argument {
            op,
            rank,
            reason: format!(
                "`out` is {:?}, the {what} {:?}: they must be of one kind",
                out.kind(),
                a.kind()
            ),
        });
    }
    Ok(())
}

fn check_size(
    op: Op,
    rank: usize,
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<()> {
    if expected != found {
        return Err(DistError::Size {
            op,
            rank,
            what,
            expected,
            found,
        });
    }
    Ok(())
}

/// Writes `src` (any shape, `dst`'s element count) into `dst` in place, without gradient.
pub(crate) fn write_into(op: Op, rank: usize, dst: &mut Tensor, src: &Tensor) -> Result<()> {
    tch::no_grad(|| src.f_reshape(dst.size()).and_then(|s| dst.f_copy_(&s)))
        .map_err(|e| DistError::tensor(op, rank, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_tile_every_length_in_rank_order_and_the_first_ranks_hold_the_extra_elements() {
        for world in 1..6 {
            for numel in 0..20 {
                let mut next = 0;
                for rank in 0..world {
                    let r = shard_range(numel, world, rank);
                    assert_eq!(r.start, next, "N {numel} W {world} r {rank}");
                    let expected = numel / world + usize::from(rank < numel % world);
                    assert_eq!(r.len(), expected, "N {numel} W {world} r {rank}");
                    next = r.end;
                }
                assert_eq!(next, numel, "N {numel} W {world}");
            }
        }
        assert_eq!(shard_range(5, 0, 0), 0..0);
        assert_eq!(shard_range(5, 2, 2), 0..0);
    }

    #[test]
    fn every_call_survives_its_five_integer_descriptor() {
        let t = Tensor::zeros([7], (Kind::BFloat16, tch::Device::Cpu));
        let out = Tensor::zeros([4], (Kind::BFloat16, tch::Device::Cpu));
        let calls = [
            Call::all_reduce(1, &t, ReduceOp::Mean).unwrap(),
            Call::reduce_scatter(0, 2, &t, &out, ReduceOp::Sum).unwrap(),
            Call::all_gather(0, 2, &out, &t).unwrap(),
            Call::broadcast(0, 3, &t, 2).unwrap(),
            Call::barrier(),
        ];
        for call in calls {
            assert_eq!(Call::decode(call.encode()), call);
        }
    }

    #[test]
    fn kinds_the_descriptor_cannot_name_are_refused() {
        let cpu = tch::Device::Cpu;
        for kind in [Kind::ComplexHalf, Kind::ComplexDouble, Kind::QInt8] {
            let Ok(t) = Tensor::f_zeros([4], (kind, cpu)) else {
                continue; // this libtorch cannot make one on the CPU
            };
            let e = Call::broadcast(0, 2, &t, 1).unwrap_err();
            assert!(matches!(e, DistError::Argument { .. }), "{e}");
            assert!(Call::all_gather(0, 1, &t, &t).is_err(), "{kind:?}");
        }
        let listed = Tensor::zeros([4], (Kind::ComplexFloat, cpu));
        let call = Call::broadcast(0, 2, &listed, 1).unwrap();
        assert!((0..KINDS.len() as i64).contains(&call.encode()[2]));
    }

    #[test]
    fn the_first_rank_whose_call_differs_from_rank_0s_is_named() {
        let t = Tensor::zeros([7], (Kind::Float, tch::Device::Cpu));
        let sum = Call::all_reduce(0, &t, ReduceOp::Sum).unwrap().encode();
        let mean = Call::all_reduce(0, &t, ReduceOp::Mean).unwrap().encode();
        assert_eq!(check_agreement(&[sum, sum].concat()), Ok(()));
        let e = check_agreement(&[sum, sum, mean, mean].concat()).unwrap_err();
        assert!(matches!(e, DistError::Mismatch { rank: 2, .. }), "{e}");
        assert!(e.to_string().contains("all_reduce(mean) of 7 Float"), "{e}");
    }
}
