//! A group's blocks as jobs for one step: the blocks of its parameters that have gradients,
//! batched by shape, kind and device ([`Jobs`], [`with_batch`]), and written back after the
//! step. The sharded and the unsharded step both run batches of jobs.

use tch::{Kind, Tensor};

use super::matrix::Resolved;
use super::stats::Accumulator;
use crate::error::{OptimError, Result};
use crate::{ManifoldMuon, ManifoldState, ManifoldStep, MuonConfig};

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

impl Jobs<'_, '_, ManifoldState<Tensor>> {
    /// Manifold Muon's blocks one by one on `threads` workers (round robin; results in block
    /// order). Each worker first applies the calling thread's libtorch thread count
    /// (`tch::set_num_threads`, which sets OpenMP's and MKL's count for the thread too): without
    /// it the workers' products ran OpenMP teams of every core, whose threads spin at each
    /// barrier (a manifold run at width 64 on a loaded 2-core machine took 7.7× as long per
    /// step, with the same results).
    pub(super) fn run_threads(
        self,
        opt: &ManifoldMuon,
        threads: usize,
        stats: &mut Accumulator,
    ) -> Result<()> {
        let workers = threads.min(self.jobs.len()).max(1);
        let mut lanes: Vec<Vec<(usize, Job<'_, ManifoldState<Tensor>>)>> =
            (0..workers).map(|_| Vec::new()).collect();
        for (i, job) in self.jobs.into_iter().enumerate() {
            lanes[i % workers].push((i, job));
        }
        type Done = (usize, usize, Result<ManifoldStep<Tensor>>);
        let intra_op = tch::get_num_threads();
        let mut out: Vec<Done> = std::thread::scope(|scope| {
            let handles: Vec<_> = lanes
                .into_iter()
                .map(|lane| {
                    scope.spawn(move || {
                        tch::set_num_threads(intra_op);
                        // Gradient mode is per thread: the blocks are views of leaves.
                        let _guard = tch::no_grad_guard();
                        lane.into_iter()
                            .map(|(i, mut j)| (i, j.param, opt.step(&mut j.w, &j.g, j.state)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| {
                    h.join().unwrap_or_else(|_| {
                        let e = OptimError::Groups {
                            reason: "a worker thread panicked".into(),
                        };
                        vec![(0, 0, Err(e))]
                    })
                })
                .collect()
        });
        out.sort_by_key(|(i, _, _)| *i);
        for (_, param, step) in out {
            stats.add_manifold(&step.map_err(|e| param_err(&self.names[param], e))?);
        }
        write_back(self.names, self.params, self.layouts, &self.copies)
    }
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
