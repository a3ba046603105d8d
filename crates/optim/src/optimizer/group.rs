//! A parameter group: named tensors, the update that steps them ([`Update`]), its peak
//! learning rate and options, and (once the [`Optimizer`](super::Optimizer) holds it) the
//! per-parameter states.

use std::time::Instant;

use tch::Tensor;

use super::jobs::{param_err, second_moment_len, Jobs, Workers};
use super::matrix::{MatrixSpec, Resolved};
#[cfg(feature = "dist")]
use super::shard::Sharding;
use super::stats::{Accumulator, OptimizerStats};
#[cfg(not(feature = "dist"))]
use super::unsharded::Sharding;
use crate::error::{OptimError, Result};
use crate::muon::Entries;
use crate::precision::batch_precision;
use crate::{
    AdamW, AdamWConfig, AdamWKernel, AdamWState, ManifoldMuon, ManifoldMuonConfig, ManifoldState,
    Muon, MuonConfig, MuonState,
};

/// How a group's parameters are updated: every kappa optimizer on `tch` tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Update {
    /// [`Muon`] with its options (NorMuon, cautious weight decay, every msign) on each block of
    /// each parameter ([`MatrixSpec`]).
    Muon(MuonConfig),
    /// [`ManifoldMuon`] (Stiefel, DGram or Oblique, any dual solver) on each block; the blocks
    /// are retracted onto the manifold when the optimizer is built.
    Manifold(ManifoldMuonConfig),
    /// [`AdamW`] on each parameter whole.
    AdamW(AdamWConfig),
}

impl Update {
    /// A short name: `muon`, the manifold's name (`stiefel`, …), `adamw`.
    pub fn name(&self) -> &'static str {
        match self {
            Update::Muon(_) => "muon",
            Update::Manifold(c) => c.manifold.name(),
            Update::AdamW(_) => "adamw",
        }
    }

    /// The learning rate the config carries (Muon's and manifold Muon's `lr`); AdamW's config
    /// has none.
    pub fn lr(&self) -> Option<f64> {
        match self {
            Update::Muon(c) => Some(c.lr),
            Update::Manifold(c) => Some(c.lr),
            Update::AdamW(_) => None,
        }
    }

    fn validate(&self) -> Result<()> {
        match self {
            Update::Muon(c) => c.validate(),
            Update::Manifold(c) => c.validate(),
            Update::AdamW(c) => c.validate(),
        }
    }
}

/// Named tensors stepped by one [`Update`] at one peak learning rate (the rate the schedule
/// scales: step i runs at `schedule.lr(lr, i)`).
///
/// ```
/// use kappa_optim::optimizer::{Axis, Group, MatrixSpec};
/// use kappa_optim::MuonConfig;
/// let qkv = tch::Tensor::zeros([96, 32], (tch::Kind::Float, tch::Device::Cpu));
/// let group = Group::muon("attention", MuonConfig::keller())
///     .with_matrix(MatrixSpec::matrix().split(Axis::Rows, [32, 32, 32]).heads(Axis::Rows, 4))
///     .with_param("attn.qkv.weight", qkv);
/// assert_eq!(group.lr(), 0.02);
/// ```
#[derive(Debug)]
pub struct Group {
    pub(crate) name: String,
    pub(crate) lr: f64,
    pub(crate) update: Update,
    pub(crate) matrix: MatrixSpec,
    pub(crate) batch: bool,
    pub(crate) workers: Workers,
    pub(crate) kernel: AdamWKernel,
    pub(crate) names: Vec<String>,
    pub(crate) params: Vec<Tensor>,
    pub(crate) layouts: Vec<Resolved>,
    pub(crate) states: States,
    pub(crate) stats: Accumulator,
    /// This rank's part of the last sharded step, until the ranks merge it into `stats`
    /// ([`Optimizer::shard`](super::Optimizer::shard)).
    #[cfg_attr(not(feature = "dist"), allow(dead_code))]
    pub(crate) pending: Accumulator,
}

/// The per-parameter states of a group (per block for the matrix updates).
#[derive(Debug)]
pub(crate) enum States {
    /// Before the optimizer prepared the group.
    None,
    Muon(Muon, Vec<Vec<MuonState<Tensor>>>),
    Manifold(ManifoldMuon, Vec<Vec<ManifoldState<Tensor>>>),
    AdamW(AdamW, Vec<AdamWState<Tensor>>),
}

impl Group {
    /// An empty group named `name` stepped by `update` at peak rate `lr`.
    pub fn new(name: impl Into<String>, update: Update, lr: f64) -> Self {
        Self {
            name: name.into(),
            lr,
            update,
            matrix: MatrixSpec::matrix(),
            batch: true,
            workers: Workers::Auto,
            kernel: AdamWKernel::default(),
            names: Vec::new(),
            params: Vec::new(),
            layouts: Vec::new(),
            states: States::None,
            stats: Accumulator::default(),
            pending: Accumulator::default(),
        }
    }

    /// Muon at the config's `lr`.
    pub fn muon(name: impl Into<String>, config: MuonConfig) -> Self {
        Self::new(name, Update::Muon(config), config.lr)
    }

    /// Manifold Muon at the config's `lr`.
    pub fn manifold(name: impl Into<String>, config: ManifoldMuonConfig) -> Self {
        Self::new(name, Update::Manifold(config), config.lr)
    }

    /// AdamW at peak rate `lr`.
    pub fn adamw(name: impl Into<String>, config: AdamWConfig, lr: f64) -> Self {
        Self::new(name, Update::AdamW(config), lr)
    }

    /// This group at peak rate `lr`.
    pub fn with_lr(self, lr: f64) -> Self {
        Self { lr, ..self }
    }

    /// This group with its parameters seen as matrices by `matrix` (Muon and manifold Muon;
    /// the default is [`MatrixSpec::matrix`]).
    pub fn with_matrix(self, matrix: MatrixSpec) -> Self {
        Self { matrix, ..self }
    }

    /// Whether same-shape blocks are stepped with one batched call (on by default; Muon and
    /// manifold Muon).
    pub fn with_batch(self, batch: bool) -> Self {
        Self { batch, ..self }
    }

    /// The group's blocks stepped on `threads` worker threads, each with an even share of the
    /// calling thread's libtorch threads (at least one): Muon's batches split into contiguous
    /// parts, manifold Muon's blocks when not batched (a manifold batch is stepped whole). 1 is the
    /// calling thread alone. By default, up to libtorch's thread count at each step: the most
    /// workers (two or more) that each get enough work and among which the work balances, else the
    /// calling thread, which also steps blocks off the CPU (a GPU's kernels queue on one stream
    /// whatever thread launches them); an explicit count is always used (up to the number of
    /// parts). Results do not depend on the count when a product's result does not depend on its
    /// thread count, which holds where libtorch runs at one thread. Not used when sharded
    #[cfg_attr(
        feature = "dist",
        doc = "([`Optimizer::shard`](super::Optimizer::shard))."
    )]
    #[cfg_attr(not(feature = "dist"), doc = "(`Optimizer::shard`, feature `dist`).")]
    pub fn with_threads(self, threads: usize) -> Self {
        let workers = Workers::Count(threads.max(1));
        Self { workers, ..self }
    }

    /// AdamW's kernel ([`AdamWKernel::Fused`] by default).
    pub fn with_kernel(self, kernel: AdamWKernel) -> Self {
        Self { kernel, ..self }
    }

    /// This group with one more parameter.
    pub fn with_param(mut self, name: impl Into<String>, tensor: Tensor) -> Self {
        self.names.push(name.into());
        self.params.push(tensor);
        self
    }

    /// This group with more parameters.
    pub fn with_params(mut self, params: impl IntoIterator<Item = (String, Tensor)>) -> Self {
        for (n, t) in params {
            self.names.push(n);
            self.params.push(t);
        }
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The peak learning rate.
    pub fn lr(&self) -> f64 {
        self.lr
    }

    /// The update.
    pub fn update(&self) -> &Update {
        &self.update
    }

    /// The matrix spec.
    pub fn matrix(&self) -> &MatrixSpec {
        &self.matrix
    }

    /// The parameters' names, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The parameters (shallow clones of the caller's tensors), in order.
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// What the group did since the last call.
    pub(crate) fn take_stats(&mut self) -> OptimizerStats {
        std::mem::take(&mut self.stats).finish()
    }

    /// Checks the group and creates its states: a valid update and rate, at least one
    /// parameter, every parameter's matrix layout; retracts manifold blocks onto the manifold.
    pub(crate) fn prepare(&mut self) -> Result<()> {
        let group = |reason: String| OptimError::Groups {
            reason: format!("group `{}`: {reason}", self.name),
        };
        self.update.validate().map_err(|e| group(e.to_string()))?;
        if self.params.is_empty() {
            return Err(group("it has no parameters".into()));
        }
        if self.names.len() != self.params.len() {
            return Err(group("names and tensors differ in number".into()));
        }
        if let Some(i) = self.params.iter().position(|t| !t.defined()) {
            return Err(param_err(
                &self.names[i],
                group("an undefined tensor".into()),
            ));
        }
        self.states = match self.update {
            Update::AdamW(c) => {
                crate::adamw::check_lr(self.lr).map_err(|e| group(e.to_string()))?;
                States::AdamW(
                    AdamW::new(c)?,
                    self.params.iter().map(|_| AdamWState::new()).collect(),
                )
            }
            Update::Muon(c) => {
                let muon =
                    Muon::new(MuonConfig { lr: self.lr, ..c }).map_err(|e| group(e.to_string()))?;
                self.resolve_layouts()?;
                let states = self
                    .layouts
                    .iter()
                    .map(|l| (0..l.count()).map(|_| MuonState::new()).collect())
                    .collect();
                States::Muon(muon, states)
            }
            Update::Manifold(c) => {
                let opt = ManifoldMuon::new(ManifoldMuonConfig { lr: self.lr, ..c })
                    .map_err(|e| group(e.to_string()))?;
                self.resolve_layouts()?;
                self.retract(&opt)?;
                let states = self
                    .layouts
                    .iter()
                    .map(|l| (0..l.count()).map(|_| ManifoldState::new()).collect())
                    .collect();
                States::Manifold(opt, states)
            }
        };
        Ok(())
    }

    fn resolve_layouts(&mut self) -> Result<()> {
        self.layouts = self
            .names
            .iter()
            .zip(&self.params)
            .map(|(n, p)| self.matrix.resolve(&p.size()).map_err(|e| param_err(n, e)))
            .collect::<Result<_>>()?;
        Ok(())
    }

    /// Puts every block of every parameter on `opt`'s manifold, in place.
    fn retract(&self, opt: &ManifoldMuon) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for ((name, p), layout) in self.names.iter().zip(&self.params).zip(&self.layouts) {
            let named = |e| param_err(name, e);
            let (stack, view) = layout.stack(p, "w").map_err(named)?;
            for mut w in layout.views(&stack, "w").map_err(named)? {
                opt.retract_onto(&mut w).map_err(named)?;
            }
            if !view {
                layout.write_back(p, &stack).map_err(named)?;
            }
        }
        Ok(())
    }

    /// Checks that the group can step at rate `lr` (the checks its update's step makes first),
    /// so that a schedule's bad rate is an error before any group has changed.
    pub(crate) fn check_rate(&self, lr: f64) -> Result<()> {
        let checked = match &self.states {
            States::None | States::AdamW(..) => crate::adamw::check_lr(lr),
            States::Muon(muon, _) => MuonConfig {
                lr,
                ..*muon.config()
            }
            .validate(),
            States::Manifold(opt, _) => ManifoldMuonConfig {
                lr,
                ..*opt.config()
            }
            .validate(),
        };
        checked.map_err(|e| group_err(&self.name, e))
    }

    /// One update of every parameter with a gradient, at learning rate `lr` (the scheduled
    /// rate of this step); Muon's and manifold Muon's blocks split over the ranks of `shard`
    /// when given (AdamW's are not). Called without gradient recording.
    pub(super) fn step(&mut self, lr: f64, shard: Option<&mut Sharding>) -> Result<()> {
        let started = Instant::now();
        let result = match &mut self.states {
            States::None => Err(OptimError::Groups {
                reason: format!("group `{}` was not prepared", self.name),
            }),
            States::AdamW(adamw, states) => {
                let grads: Vec<Tensor> = self.params.iter().map(Tensor::grad).collect();
                self.stats.updates += grads.iter().filter(|g| g.defined()).count() as u64;
                adamw
                    .step_tensors(&self.params, &grads, states, lr, self.kernel)
                    .map_err(|e| group_err(&self.name, e))
            }
            States::Muon(muon, states) => {
                muon.set_lr(lr).map_err(|e| group_err(&self.name, e))?;
                let jobs = Jobs::collect(&self.names, &self.params, &self.layouts, states)?;
                let muon = &*muon;
                let step = |stats: &mut Accumulator,
                            ws: &mut [Tensor],
                            gs: &[Tensor],
                            ss: &mut [MuonState<Tensor>],
                            count: usize| {
                    if count > 1 {
                        let precision = batch_precision(&ws[0], count, muon.config().precision);
                        let c = MuonConfig {
                            precision,
                            ..*muon.config()
                        };
                        Muon::new(c)?
                            .step_batch_entries(ws, gs, ss, 1.0, Entries::WeightOnly)?
                            .iter()
                            .for_each(|s| stats.add_update(s.precision));
                    } else {
                        let (w, g, s) = (&mut ws[0], &gs[0], &mut ss[0]);
                        let step = muon.step_entries(w, g, s, 1.0, Entries::WeightOnly)?;
                        stats.add_update(step.precision);
                    }
                    Ok(())
                };
                match shard {
                    None => jobs.run_workers(self.batch, self.workers, &mut self.stats, &step),
                    Some(s) => {
                        let c = *muon.config();
                        let second = |w: &Tensor| second_moment_len(&c, w);
                        s.run(
                            jobs,
                            &self.name,
                            self.batch,
                            &mut self.pending,
                            second,
                            step,
                        )
                    }
                }
            }
            States::Manifold(opt, states) => {
                opt.set_lr(lr).map_err(|e| group_err(&self.name, e))?;
                let jobs = Jobs::collect(&self.names, &self.params, &self.layouts, states)?;
                let opt = &*opt;
                let step = |stats: &mut Accumulator,
                            ws: &mut [Tensor],
                            gs: &[Tensor],
                            ss: &mut [ManifoldState<Tensor>],
                            count: usize| {
                    let steps = if count > 1 {
                        let precision = batch_precision(&ws[0], count, opt.config().precision);
                        let c = ManifoldMuonConfig {
                            precision,
                            ..*opt.config()
                        };
                        ManifoldMuon::new(c)?.step_batch(ws, gs, ss)?
                    } else {
                        vec![opt.step(&mut ws[0], &gs[0], &mut ss[0])?]
                    };
                    steps.iter().for_each(|s| stats.add_manifold(s));
                    Ok(())
                };
                // A manifold batch is stepped whole, on the calling thread: its dual ascents
                // run in lock step, so a part of it would not step as it does in the batch.
                let workers = match self.batch {
                    true => Workers::Count(1),
                    false => self.workers,
                };
                match shard {
                    None => jobs.run_workers(self.batch, workers, &mut self.stats, &step),
                    Some(s) => s.run(
                        jobs,
                        &self.name,
                        self.batch,
                        &mut self.pending,
                        |_| None,
                        step,
                    ),
                }
            }
        };
        self.stats.seconds += started.elapsed().as_secs_f64();
        result
    }
}

fn group_err(group: &str, e: OptimError) -> OptimError {
    param_err(&format!("(group `{group}`)"), e)
}
