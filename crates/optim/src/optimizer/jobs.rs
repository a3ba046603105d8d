//! A group's blocks as jobs for one step: the blocks of its parameters that have gradients,
//! batched by shape, kind and device ([`Jobs`], [`with_batch`]), and written back after the
//! step. The sharded and the unsharded step both run batches of jobs.

use tch::{Kind, Tensor};

use super::matrix::Resolved;
use super::stats::Accumulator;
use crate::error::{OptimError, Result};
use crate::MuonConfig;

/// `e` as the error of parameter `name`.
pub(crate) fn param_err(name: &str, e: OptimError) -> OptimError {
    OptimError::Param {
        name: name.to_string(),
        source: Box::new(e),
    }
}

/// What blocks of one batch share: size, kind, device.
type BatchKey = (Vec<i64>, Kind, tch::Device);

/// One block to step: its parameter's index, views of the block in the parameter and its
/// gradient, and the block's state.
pub(super) struct Job<'s, S> {
    pub(super) param: usize,
    pub(super) w: Tensor,
    pub(super) g: Tensor,
    pub(super) state: &'s mut S,
}

/// The blocks of a group's parameters that have gradients, and the stacks to write back.
pub(super) struct Jobs<'a, 's, S> {
    pub(super) names: &'a [String],
    params: &'a [Tensor],
    layouts: &'a [Resolved],
    pub(super) jobs: Vec<Job<'s, S>>,
    copies: Vec<(usize, Tensor)>,
}

/// Steps one batch: the blocks' weights, gradients and states, and the number of blocks of
/// the whole batch (the precision is decided on it, so that a part of a batch computes in the
/// type the whole would).
pub(super) trait StepBatch<S>:
    FnMut(&mut Accumulator, &mut [Tensor], &[Tensor], &mut [S], usize) -> Result<()>
{
}

impl<S, F> StepBatch<S> for F where
    F: FnMut(&mut Accumulator, &mut [Tensor], &[Tensor], &mut [S], usize) -> Result<()>
{
}

impl<'a, 's, S: Default> Jobs<'a, 's, S> {
    pub(super) fn collect(
        names: &'a [String],
        params: &'a [Tensor],
        layouts: &'a [Resolved],
        states: &'s mut [Vec<S>],
    ) -> Result<Self> {
        let mut jobs = Vec::new();
        let mut copies = Vec::new();
        for (i, ((p, layout), blocks)) in params.iter().zip(layouts).zip(states).enumerate() {
            let grad = p.grad();
            if !grad.defined() {
                continue;
            }
            let named = |e| param_err(&names[i], e);
            let (ws, view) = layout.stack(p, "w").map_err(named)?;
            let (gs, _) = layout.stack(&grad, "grad").map_err(named)?;
            let views = layout.views(&ws, "w").map_err(named)?;
            let grads = layout.views(&gs, "grad").map_err(named)?;
            for ((w, g), state) in views.into_iter().zip(grads).zip(blocks.iter_mut()) {
                jobs.push(Job {
                    param: i,
                    w,
                    g,
                    state,
                });
            }
            if !view {
                copies.push((i, ws));
            }
        }
        Ok(Self {
            names,
            params,
            layouts,
            jobs,
            copies,
        })
    }

    /// The blocks in batches: same shape, kind and device (in order of first appearance) when
    /// `batch`, else one by one.
    pub(super) fn batches(jobs: Vec<Job<'s, S>>, batch: bool) -> Vec<Vec<Job<'s, S>>> {
        if !batch {
            return jobs.into_iter().map(|j| vec![j]).collect();
        }
        let mut out: Vec<(BatchKey, Vec<Job<'s, S>>)> = Vec::new();
        for job in jobs {
            let key = (job.w.size(), job.w.kind(), job.w.device());
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(job),
                None => out.push((key, vec![job])),
            }
        }
        out.into_iter().map(|(_, v)| v).collect()
    }

    /// Runs `f` on each batch (the blocks' weights, gradients and states as slices; the states
    /// are moved in and back), then writes back the stacks that were copies.
    pub(super) fn run(
        self,
        batch: bool,
        stats: &mut Accumulator,
        mut f: impl StepBatch<S>,
    ) -> Result<()> {
        let (names, params, layouts, copies) = (self.names, self.params, self.layouts, self.copies);
        for batch in Self::batches(self.jobs, batch) {
            let count = batch.len();
            with_batch(names, batch, |ws, gs, states| {
                f(stats, ws, gs, states, count)
            })?;
        }
        write_back(names, params, layouts, &copies)
    }

    /// Splits the struct into its blocks and what [`write_back`] needs after them.
    #[cfg(feature = "dist")]
    pub(super) fn into_parts(self) -> (Vec<Job<'s, S>>, impl FnOnce() -> Result<()> + 'a) {
        let (names, params, layouts, copies) = (self.names, self.params, self.layouts, self.copies);
        (self.jobs, move || {
            write_back(names, params, layouts, &copies)
        })
    }
}

/// Runs `f` on one batch's weights, gradients and states (the states are moved in and back);
/// an error names the batch's parameters.
pub(super) fn with_batch<S: Default, R>(
    names: &[String],
    batch: Vec<Job<'_, S>>,
    f: impl FnOnce(&mut [Tensor], &[Tensor], &mut [S]) -> Result<R>,
) -> Result<R> {
    let params: Vec<usize> = batch.iter().map(|j| j.param).collect();
    let (mut ws, mut gs, mut slots) = (Vec::new(), Vec::new(), Vec::new());
    for j in batch {
        ws.push(j.w);
        gs.push(j.g);
        slots.push(j.state);
    }
    let mut states: Vec<S> = slots.iter_mut().map(|s| std::mem::take(*s)).collect();
    let result = f(&mut ws, &gs, &mut states);
    for (slot, s) in slots.into_iter().zip(states) {
        *slot = s;
    }
    result.map_err(|e| param_err(&names_of(names, &params), e))
}

/// Writes the stacks that were copies back into their parameters.
fn write_back(
    names: &[String],
    params: &[Tensor],
    layouts: &[Resolved],
    copies: &[(usize, Tensor)],
) -> Result<()> {
    for (i, stack) in copies {
        layouts[*i]
            .write_back(&params[*i], stack)
            .map_err(|e| param_err(&names[*i], e))?;
    }
    Ok(())
}

/// The length of NorMuon's second moment of a block `w` stepped by `c` (one value per neuron),
/// `None` without NorMuon.
pub(super) fn second_moment_len(c: &MuonConfig, w: &Tensor) -> Option<usize> {
    let (rows, cols) = kappa_linalg::Matrix::shape(w);
    let n = c.normuon?;
    Some(if n.axis.along_rows(rows, cols, c.layout) {
        rows
    } else {
        cols
    })
}

/// Steps one part of a batch on a worker thread: as [`StepBatch`], and shared by the workers.
pub(super) trait StepShared<S>:
    Fn(&mut Accumulator, &mut [Tensor], &[Tensor], &mut [S], usize) -> Result<()> + Sync
{
}

impl<S, F> StepShared<S> for F where
    F: Fn(&mut Accumulator, &mut [Tensor], &[Tensor], &mut [S], usize) -> Result<()> + Sync
{
}

/// How many worker threads step a group's blocks ([`Jobs::run_workers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Workers {
    /// libtorch's thread count on the calling thread, when the step is large enough and its
    /// parts balance ([`plan`]); else the calling thread alone.
    Auto,
    /// This many, whatever the work (1: the calling thread).
    Count(usize),
}

/// A batch's blocks or a contiguous part of them, with the whole batch's block count (the
/// precision is decided on it).
struct Part<'s, S> {
    batch: usize,
    jobs: Vec<Job<'s, S>>,
    count: usize,
}

impl<S> Part<'_, S> {
    /// The part's work in units of m·n·min(m, n) for m×n blocks: what one Newton–Schulz step
    /// of a block costs, up to a constant.
    fn cost(&self) -> f64 {
        let Some(job) = self.jobs.first() else {
            return 0.0;
        };
        let (m, n) = kappa_linalg::Matrix::shape(&job.w);
        (m * n * m.min(n)) as f64 * self.jobs.len() as f64
    }
}

/// Under [`Workers::Auto`], the smallest work a worker must get, in [`Part::cost`]'s units:
/// 2²⁰ is about 3·10⁷ flops of Newton–Schulz (five quintic steps), half a millisecond or more
/// on a CPU core, against the tens of microseconds a scoped thread takes to start and join.
const AUTO_MIN_LANE_COST: f64 = (1u64 << 20) as f64;

/// Under [`Workers::Auto`], the largest ratio of the busiest worker's work to an even share.
/// One thread per worker pays only while the imbalance stays below what a two-thread product
/// loses to its split (a step of GPT-2 small's Muon matrices took 0.84 of the time on two
/// one-thread workers that it took on two libtorch threads, docs/performance.md).
const AUTO_MAX_IMBALANCE: f64 = 1.15;

/// The blocks of `batches` as parts on `workers` lanes: each batch split into at most
/// `workers` contiguous parts of near-equal size and at least two blocks, the parts placed
/// largest first on the least loaded lane. A part keeps its matrices' bits in the whole batch:
/// it is stepped with the whole batch's batched call and precision, and libtorch's CPU `bmm`
/// gives a matrix the same bits in any batch of two or more, but multiplies a batch of one with
/// another kernel (the `shard` module's docs, "When the bits equal"). `None` when fewer than two lanes get
/// work or, with `auto`, when the lanes' work is too small or too uneven to pay for threads:
/// then the batches whole, in order.
fn plan<S>(batches: Vec<Vec<Job<'_, S>>>, workers: usize, auto: bool) -> Plan<'_, S> {
    let mut parts = Vec::new();
    for (b, batch) in batches.into_iter().enumerate() {
        let count = batch.len();
        let pieces = workers.min(count / 2).max(1);
        let mut rest = batch.into_iter();
        for k in 0..pieces {
            let size = count / pieces + usize::from(k < count % pieces);
            parts.push(Part {
                batch: b,
                jobs: rest.by_ref().take(size).collect(),
                count,
            });
        }
    }
    let lanes = workers.min(parts.len());
    if lanes < 2 {
        return Err(whole(parts));
    }
    let costs: Vec<f64> = parts.iter().map(Part::cost).collect();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|&a, &b| costs[b].total_cmp(&costs[a]));
    let mut load = vec![0.0; lanes];
    let mut lane_of = vec![0; parts.len()];
    for i in order {
        let lane = (0..lanes).fold(0, |best, l| if load[l] < load[best] { l } else { best });
        load[lane] += costs[i];
        lane_of[i] = lane;
    }
    let (total, busiest) = (
        load.iter().sum::<f64>(),
        load.iter().fold(0.0, |a: f64, &b| a.max(b)),
    );
    let small = load.iter().any(|&l| l < AUTO_MIN_LANE_COST);
    if auto && (small || busiest > AUTO_MAX_IMBALANCE * total / lanes as f64) {
        return Err(whole(parts));
    }
    let mut out: Vec<Vec<Part<'_, S>>> = (0..lanes).map(|_| Vec::new()).collect();
    for (part, lane) in parts.into_iter().zip(lane_of) {
        out[lane].push(part);
    }
    Ok(out)
}

/// The parts by lane, or (no plan) the batches to step on the calling thread in order.
type Plan<'s, S> = std::result::Result<Vec<Vec<Part<'s, S>>>, Vec<Vec<Job<'s, S>>>>;

/// The batches `parts` were cut from (a batch's parts are consecutive), in order.
fn whole<'s, S>(parts: Vec<Part<'s, S>>) -> Vec<Vec<Job<'s, S>>> {
    let mut out: Vec<(usize, Vec<Job<'s, S>>)> = Vec::new();
    for part in parts {
        match out.last_mut() {
            Some((b, jobs)) if *b == part.batch => jobs.extend(part.jobs),
            _ => out.push((part.batch, part.jobs)),
        }
    }
    out.into_iter().map(|(_, jobs)| jobs).collect()
}

impl<S: Default + Send> Jobs<'_, '_, S> {
    /// [`Jobs::run`] with the batches' blocks on worker threads ([`plan`]): each worker steps
    /// its parts in turn on `max(1, t / lanes)` libtorch threads, t the calling thread's
    /// count, so that the workers together use what the caller would. Products of one libtorch
    /// thread each on independent blocks lose nothing to splitting one product over threads;
    /// a worker that kept libtorch's default would start an OpenMP team of every core, whose
    /// threads spin at each barrier (a manifold run at width 64 on a loaded 2-core machine
    /// took 7.7× as long per step). Setting a thread's count sets libtorch's default for new
    /// threads too, so the caller's is set again afterwards. The first error in lane order is
    /// returned; a lane stops at its first error, the others finish their parts.
    pub(super) fn run_workers(
        self,
        batch: bool,
        workers: Workers,
        stats: &mut Accumulator,
        f: &impl StepShared<S>,
    ) -> Result<()> {
        let (names, params, layouts, copies) = (self.names, self.params, self.layouts, self.copies);
        let intra_op = tch::get_num_threads();
        let (count, auto) = match workers {
            Workers::Auto => (usize::try_from(intra_op).unwrap_or(1), true),
            Workers::Count(n) => (n, false),
        };
        let lanes = match plan(Self::batches(self.jobs, batch), count, auto) {
            Ok(lanes) => lanes,
            Err(batches) => {
                for batch in batches {
                    let count = batch.len();
                    with_batch(names, batch, |ws, gs, ss| f(stats, ws, gs, ss, count))?;
                }
                return write_back(names, params, layouts, &copies);
            }
        };
        let per_lane = (intra_op / lanes.len() as i32).max(1);
        let done: Vec<(Accumulator, Result<()>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = lanes
                .into_iter()
                .map(|lane| scope.spawn(move || step_lane(names, lane, per_lane, f)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        let e = OptimError::Groups {
                            reason: "a worker thread panicked".into(),
                        };
                        (Accumulator::default(), Err(e))
                    })
                })
                .collect()
        });
        tch::set_num_threads(intra_op);
        let mut first_err = None;
        for (acc, result) in done {
            stats.merge(&acc);
            first_err = first_err.or(result.err());
        }
        match first_err {
            Some(e) => Err(e),
            None => write_back(names, params, layouts, &copies),
        }
    }
}

/// One worker's parts, stepped in turn on `threads` libtorch threads without gradient
/// recording (the mode is per thread, and the blocks are views of leaves).
fn step_lane<S: Default>(
    names: &[String],
    lane: Vec<Part<'_, S>>,
    threads: i32,
    f: &impl StepShared<S>,
) -> (Accumulator, Result<()>) {
    tch::set_num_threads(threads);
    let _guard = tch::no_grad_guard();
    let mut acc = Accumulator::default();
    for part in lane {
        let count = part.count;
        let stepped = with_batch(names, part.jobs, |ws, gs, ss| {
            f(&mut acc, ws, gs, ss, count)
        });
        if let Err(e) = stepped {
            return (acc, Err(e));
        }
    }
    (acc, Ok(()))
}

/// The names of the parameters `indices` point at (each once), for an error of a batch.
pub(super) fn names_of(names: &[String], indices: &[usize]) -> String {
    let mut seen: Vec<usize> = indices.to_vec();
    seen.dedup();
    let listed: Vec<&str> = seen.iter().take(3).map(|&i| names[i].as_str()).collect();
    let more = seen.len().saturating_sub(3);
    if more > 0 {
        format!("{} (and {more} more in the batch)", listed.join("`, `"))
    } else {
        listed.join("`, `")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `counts[i]` blocks of size `shapes[i]`, as batches of jobs on `states`.
    fn batches<'s>(
        shapes: &[[i64; 2]],
        counts: &[usize],
        states: &'s mut [u8],
    ) -> Vec<Vec<Job<'s, u8>>> {
        let mut states = states.iter_mut();
        let mut out = Vec::new();
        for (shape, &count) in shapes.iter().zip(counts) {
            let jobs = (0..count)
                .map(|_| Job {
                    param: 0,
                    w: Tensor::zeros(*shape, (Kind::Float, tch::Device::Cpu)),
                    g: Tensor::zeros(*shape, (Kind::Float, tch::Device::Cpu)),
                    state: states.next().expect("enough states"),
                })
                .collect();
            out.push(jobs);
        }
        out
    }

    /// Each lane's part sizes and block counts.
    fn lanes(plan: Plan<'_, u8>) -> Vec<Vec<(usize, usize)>> {
        let lanes = plan.unwrap_or_else(|_| panic!("a plan"));
        let sizes =
            |lane: &Vec<Part<'_, u8>>| lane.iter().map(|p| (p.jobs.len(), p.count)).collect();
        lanes.iter().map(sizes).collect()
    }

    #[test]
    fn batches_split_into_even_parts_that_keep_their_batch_count() {
        let mut states = [0; 15];
        let plan = plan(
            batches(&[[768, 768], [64, 64]], &[12, 3], &mut states),
            2,
            false,
        );
        // Largest first on the least loaded lane: 6 + 6 large, then the 3 small whole (a part
        // of one block would round differently from its batch).
        assert_eq!(lanes(plan), vec![vec![(6, 12), (3, 3)], vec![(6, 12)]]);
    }

    #[test]
    fn auto_keeps_small_or_uneven_work_whole_on_the_caller() {
        let mut states = [0; 30];
        // 12 blocks of 32×32: 32³·6 = 2·10⁵ units a lane, under the floor of 2²⁰.
        let small = plan(batches(&[[32, 32]], &[12], &mut states[..12]), 2, true);
        assert_eq!(
            small
                .err()
                .map(|b| b.iter().map(Vec::len).collect::<Vec<_>>()),
            Some(vec![12])
        );
        // One large block and one a quarter of its size: lanes of 1 and 1/4, far from even;
        // returned whole and in order.
        let uneven = plan(
            batches(&[[1024, 1024], [512, 512]], &[1, 2], &mut states[12..15]),
            2,
            true,
        );
        let whole: Option<Vec<usize>> = uneven.err().map(|b| b.iter().map(Vec::len).collect());
        assert_eq!(whole, Some(vec![1, 2]));
        // Explicitly asked for, the same work is spread anyway.
        let forced = plan(
            batches(&[[1024, 1024], [512, 512]], &[1, 2], &mut states[15..18]),
            2,
            false,
        );
        assert_eq!(lanes(forced), vec![vec![(1, 1)], vec![(2, 2)]]);
    }
}
