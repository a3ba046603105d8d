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
    /// Up to libtorch's thread count on the calling thread: the most workers that each get
    /// enough work and balance ([`choose`]); else the calling thread alone. Blocks off the CPU
    /// stay on the calling thread ([`worker_count`]).
    Auto,
    /// This many, whatever the work (1: the calling thread).
    Count(usize),
}

/// A batch's blocks or a contiguous part of them, with the whole batch's block count (the
/// precision is decided on it).
struct Part<'s, S> {
    jobs: Vec<Job<'s, S>>,
    count: usize,
}

/// Where a part of a batch goes: the batch, the part's length and its worker (parts of a batch
/// are contiguous and in order).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Cut {
    batch: usize,
    len: usize,
    lane: usize,
}

/// Under [`Workers::Auto`], the smallest work a worker must get, in units of m·n·min(m, n)
/// per m×n block (one Newton–Schulz step's products, up to a constant): 2²⁰ is about 3·10⁷
/// flops of five quintic steps, half a millisecond or more on a CPU core, against the tens of
/// microseconds a scoped thread takes to start and join.
const AUTO_MIN_LANE_COST: f64 = (1u64 << 20) as f64;

/// Under [`Workers::Auto`], the largest ratio of the busiest worker's work to an even share:
/// workers of one libtorch thread each pay only while the imbalance stays below what a product
/// loses to being split over threads (docs/performance.md has the whole-model step).
const AUTO_MAX_IMBALANCE: f64 = 1.15;

/// The lanes to lay out and whether [`choose`] may take fewer: `Auto` offers libtorch's
/// `intra_op` count when every block is on the CPU and one lane otherwise. A CUDA kernel is
/// queued on the device's stream and returns at once; host threads would queue on the same
/// stream, and libtorch's thread count does not govern the device, so workers only add threads.
fn worker_count(workers: Workers, intra_op: i32, on_cpu: bool) -> (usize, bool) {
    match workers {
        Workers::Auto if on_cpu => (usize::try_from(intra_op).unwrap_or(1), true),
        Workers::Auto => (1, false),
        Workers::Count(n) => (n, false),
    }
}

/// The cost of one block of `batch`, in [`AUTO_MIN_LANE_COST`]'s units.
fn block_cost<S>(batch: &[Job<'_, S>]) -> f64 {
    batch.first().map_or(0.0, |job| {
        let (m, n) = kappa_linalg::Matrix::shape(&job.w);
        (m * n * m.min(n)) as f64
    })
}

/// Batches of `counts[i]` blocks of cost `costs[i]` on `workers` lanes: each batch cut into at
/// most `workers` contiguous parts of near-equal size and at least two blocks, the parts placed
/// largest first on the least loaded lane (lowest index on ties). A part keeps its matrices'
/// bits in the whole batch: it is stepped with the whole batch's batched call and precision,
/// and libtorch's CPU `bmm` gives a matrix the same bits in any batch of two or more but
/// multiplies a batch of one with another kernel (the `shard` module's docs, "When the bits
/// equal"). Returns the cuts in batch order and each lane's load.
fn layout(counts: &[usize], costs: &[f64], workers: usize) -> (Vec<Cut>, Vec<f64>) {
    let mut cuts = Vec::new();
    for (batch, &count) in counts.iter().enumerate() {
        let pieces = workers.min(count / 2).max(1);
        for k in 0..pieces {
            let len = count / pieces + usize::from(k < count % pieces);
            cuts.push(Cut {
                batch,
                len,
                lane: 0,
            });
        }
    }
    let lanes = workers.min(cuts.len()).max(1);
    let cost = |c: &Cut| costs[c.batch] * c.len as f64;
    let mut order: Vec<usize> = (0..cuts.len()).collect();
    order.sort_by(|&a, &b| cost(&cuts[b]).total_cmp(&cost(&cuts[a])));
    let mut load = vec![0.0; lanes];
    for i in order {
        let lane = (0..lanes).fold(0, |best, l| if load[l] < load[best] { l } else { best });
        load[lane] += cost(&cuts[i]);
        cuts[i].lane = lane;
    }
    (cuts, load)
}

/// The cuts to step on worker threads, or `None` for the calling thread: the layout on
/// `workers` lanes when `auto` is off and at least two lanes get work; with `auto`, the layout
/// on the most lanes, `workers` down to 2, in which every lane gets at least
/// [`AUTO_MIN_LANE_COST`] and the busiest at most [`AUTO_MAX_IMBALANCE`] times an even share.
fn choose(counts: &[usize], costs: &[f64], workers: usize, auto: bool) -> Option<Vec<Cut>> {
    let fits = |load: &[f64]| {
        let total: f64 = load.iter().sum();
        let busiest = load.iter().fold(0.0, |a: f64, &b| a.max(b));
        let least = load.iter().fold(f64::INFINITY, |a: f64, &b| a.min(b));
        least >= AUTO_MIN_LANE_COST && busiest <= AUTO_MAX_IMBALANCE * total / load.len() as f64
    };
    let tries = if auto { 2..=workers } else { workers..=workers };
    tries.rev().find_map(|w| {
        let (cuts, load) = layout(counts, costs, w);
        (load.len() >= 2 && (!auto || fits(&load))).then_some(cuts)
    })
}

/// `batches` cut by `cuts` (from [`choose`] on these batches), as each lane's parts.
fn lanes_of<'s, S>(batches: Vec<Vec<Job<'s, S>>>, cuts: &[Cut]) -> Vec<Vec<Part<'s, S>>> {
    let lanes = cuts.iter().map(|c| c.lane + 1).max().unwrap_or(0);
    let mut out: Vec<Vec<Part<'s, S>>> = (0..lanes).map(|_| Vec::new()).collect();
    let mut cuts = cuts.iter().peekable();
    for (b, batch) in batches.into_iter().enumerate() {
        let count = batch.len();
        let mut rest = batch.into_iter();
        while let Some(cut) = cuts.next_if(|c| c.batch == b) {
            let jobs = rest.by_ref().take(cut.len).collect();
            out[cut.lane].push(Part { jobs, count });
        }
    }
    out
}

impl<S: Default + Send> Jobs<'_, '_, S> {
    /// Runs `f` on each batch (the blocks' weights, gradients and states as slices; the states are
    /// moved in and back), then writes back the stacks that were copies. The batches' blocks go to
    /// worker threads where [`choose`] lays them out, else the calling thread steps each batch
    /// whole in order. Each worker steps its parts in turn on `max(1, t / lanes)` libtorch threads,
    /// t the calling thread's count, so that the workers together use what the caller would.
    /// Products of one libtorch thread each on independent blocks lose nothing to splitting one
    /// product over threads; a worker that kept libtorch's default would start an OpenMP team of
    /// every core, whose threads spin at each barrier (a manifold run at width 64 on a loaded
    /// 2-core machine took 7.7× as long per step). Setting a thread's count sets libtorch's default
    /// for new threads too, so the caller's is set again afterwards. The first error in lane order
    /// is returned; a lane stops at its first error, the others finish their parts.
    pub(super) fn run_workers(
        self,
        batch: bool,
        workers: Workers,
        stats: &mut Accumulator,
        f: &impl StepShared<S>,
    ) -> Result<()> {
        let (names, params, layouts, copies) = (self.names, self.params, self.layouts, self.copies);
        let intra_op = tch::get_num_threads();
        let batches = Self::batches(self.jobs, batch);
        let on_cpu = batches
            .iter()
            .flatten()
            .all(|j| j.w.device() == tch::Device::Cpu);
        let (count, auto) = worker_count(workers, intra_op, on_cpu);
        let counts: Vec<usize> = batches.iter().map(Vec::len).collect();
        let costs: Vec<f64> = batches.iter().map(|b| block_cost(b)).collect();
        let Some(cuts) = choose(&counts, &costs, count, auto) else {
            for batch in batches {
                let count = batch.len();
                with_batch(names, batch, |ws, gs, ss| f(stats, ws, gs, ss, count))?;
            }
            return write_back(names, params, layouts, &copies);
        };
        let lanes = lanes_of(batches, &cuts);
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

    fn cut(batch: usize, len: usize, lane: usize) -> Cut {
        Cut { batch, len, lane }
    }

    #[test]
    fn batches_split_into_even_parts_of_two_blocks_or_more() {
        let costs = [768f64.powi(3), 64f64.powi(3)];
        // Largest first on the least loaded lane: 6 + 6 large, then the 3 small whole (a part
        // of one block would round differently from its batch).
        let cuts = choose(&[12, 3], &costs, 2, false);
        assert_eq!(cuts, Some(vec![cut(0, 6, 0), cut(0, 6, 1), cut(1, 3, 0)]));
    }

    #[test]
    fn auto_keeps_small_or_uneven_work_on_the_caller() {
        // 12 blocks of 32×32: 32³·6 = 2·10⁵ units a lane, under the floor of 2²⁰.
        assert_eq!(choose(&[12], &[32f64.powi(3)], 2, true), None);
        // One large block and two of a quarter of its work together: lanes of 1 and 1/4.
        let costs = [1024f64.powi(3), 512f64.powi(3)];
        assert_eq!(choose(&[1, 2], &costs, 2, true), None);
        // Explicitly asked for, the same work is spread anyway.
        let forced = choose(&[1, 2], &costs, 2, false);
        assert_eq!(forced, Some(vec![cut(0, 1, 0), cut(1, 2, 1)]));
    }

    #[test]
    fn auto_keeps_blocks_off_the_cpu_on_the_caller() {
        let costs = [768f64.powi(3); 4];
        let counts = [12; 4];
        let (n, auto) = worker_count(Workers::Auto, 8, true);
        assert!(choose(&counts, &costs, n, auto).is_some());
        let (n, auto) = worker_count(Workers::Auto, 8, false);
        assert_eq!(choose(&counts, &costs, n, auto), None);
        // An explicit count is used on any device.
        let (n, auto) = worker_count(Workers::Count(2), 8, false);
        assert!(choose(&counts, &costs, n, auto).is_some());
    }

    #[test]
    fn auto_takes_the_most_workers_that_balance() {
        // GPT-2 small's Muon batches: 12 blocks each of 2304×768, 768×768, 3072×768, 768×3072.
        let cost = |m: f64, n: f64| m * n * m.min(n);
        let costs = [
            cost(2304.0, 768.0),
            cost(768.0, 768.0),
            cost(3072.0, 768.0),
            cost(768.0, 3072.0),
        ];
        let counts = [12; 4];
        // At two threads: each batch halved, every lane the same work.
        let two = choose(&counts, &costs, 2, true).expect("a layout at two threads");
        assert!(two.iter().all(|c| c.len == 6));
        // At 64 threads one part per lane (24 lanes) is uneven; fewer lanes balance.
        let many = choose(&counts, &costs, 64, true).expect("a layout at 64 threads");
        let lanes = many.iter().map(|c| c.lane + 1).max().unwrap_or(0);
        assert!((2..24).contains(&lanes), "{lanes} lanes");
        let mut load = vec![0.0; lanes];
        for c in &many {
            assert!(c.len >= 2);
            load[c.lane] += costs[c.batch] * c.len as f64;
        }
        let even = load.iter().sum::<f64>() / lanes as f64;
        assert!(
            load.iter().all(|&l| l <= AUTO_MAX_IMBALANCE * even),
            "{load:?}"
        );
        for (b, &n) in counts.iter().enumerate() {
            let cut: usize = many.iter().filter(|c| c.batch == b).map(|c| c.len).sum();
            assert_eq!(cut, n);
        }
    }
}
