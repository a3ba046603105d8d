//! One optimizer over a `tch` model's parameters (feature `tch`): parameter groups by rules,
//! `step()` / `zero_grad()`, a learning-rate schedule, and a state that saves and loads
//! exactly.
//!
//! ```
//! use kappa_optim::optimizer::Grouping;
//! use kappa_optim::{AdamWConfig, MuonConfig};
//! use tch::nn::{self, Module};
//! use tch::{Device, Kind, Tensor};
//!
//! let vs = nn::VarStore::new(Device::Cpu);
//! let model = nn::linear(vs.root() / "fc", 8, 4, Default::default());
//! let x = Tensor::randn([16, 8], (Kind::Float, Device::Cpu));
//! let mut opt = Grouping::muon_adamw(MuonConfig::keller(), AdamWConfig::torch(), 3e-4).build(&vs)?;
//! for _ in 0..5 {
//!     opt.zero_grad()?;
//!     model.forward(&x).square().mean(Kind::Float).backward();
//!     opt.step()?;
//! }
//! assert_eq!(opt.steps(), 5);
//! # Ok::<(), kappa_optim::OptimError>(())
//! ```
//!
//! # Groups
//!
//! A [`Group`] is named tensors stepped by one [`Update`] — Muon (and its variants through
//! [`MuonConfig`](crate::MuonConfig): NorMuon, cautious weight decay, every msign), manifold Muon, or AdamW — at one
//! peak learning rate. [`Grouping`] builds groups from rules on names and ranks ([`rules`]);
//! [`Optimizer::new`] takes groups built any way. Muon and manifold Muon see each parameter as
//! the matrices a [`MatrixSpec`] cuts it into: per head, per block of a fused QKV weight, per
//! expert of an N-D weight ([`matrix`]).
//!
//! # A step
//!
//! [`Optimizer::step`] first checks every gradient (defined ones only: parameters without a
//! gradient are skipped): its size, kind and device are its parameter's and its entries are
//! finite; and every group's scheduled rate. A failed check is an error naming the parameter or
//! group, and no parameter or state has changed. Then each group steps at
//! `schedule.lr(peak, i)` for step index i (0-based; the peak itself without a schedule). The
//! finiteness check is one pass over the gradients; it is skipped when
//! [`Optimizer::clip_grad_norm`] found the global norm finite since the last
//! [`Optimizer::zero_grad`]. The Muon groups do not check the gradients or their own momentum
//! buffers again (buffers are finite: each comes from a step on finite inputs, or from
//! [`Optimizer::load_state_dict`]'s check); they check each weight. A gradient made non-finite
//! between the clip and the step still stops its matrix's update (msign refuses the non-finite
//! momentum input, naming the parameter) before that matrix or its state changes, but the
//! matrices stepped before it keep their step.
//!
//! # State
//!
//! [`Optimizer::state_dict`] holds, under names a safetensors file can store:
//!
//! | key | what |
//! |---|---|
//! | `step` | steps taken (i64) |
//! | `lr/<group>` | each group's peak rate (f64) |
//! | `state/<param>/steps` | steps of each block (i64, one per block; AdamW: one) |
//! | `state/<param>/exp_avg`, `…/exp_avg_sq` | AdamW's moments |
//! | `state/<param>/momentum/<b>` | Muon's and manifold Muon's momentum of block b |
//! | `state/<param>/second/<b>` | NorMuon's second moment of block b (f64) |
//!
//! [`Optimizer::load_state_dict`] checks all of it against the groups before it changes
//! anything; a resumed run then steps bit for bit as the uninterrupted one.

pub mod group;
mod jobs;
pub mod matrix;
pub mod rules;
#[cfg(feature = "dist")]
pub mod shard;
mod state;
pub mod stats;
#[cfg(not(feature = "dist"))]
mod unsharded;

use std::collections::HashMap;
use std::path::Path;

use tch::{Kind, Tensor};

pub use group::{Group, Update};
pub use matrix::{Axis, Dims, Heads, MatrixSpec, Split};
pub use rules::{Grouping, Rule, AUXILIARY};
pub use stats::OptimizerStats;

#[cfg(feature = "dist")]
use shard::Sharding;
#[cfg(feature = "dist")]
pub use shard::Traffic;
#[cfg(not(feature = "dist"))]
use unsharded::Sharding;

use crate::error::{libtorch, OptimError, Result};
use crate::{InputError, WarmupCosine};
use jobs::param_err;

/// A learning-rate schedule: the rate of step index `step` (0-based) for a group whose peak
/// rate is `peak`. Implemented by [`WarmupCosine`] and by any closure `Fn(u64) -> f64`, read as
/// a factor of the peak.
pub trait LrSchedule: Send {
    /// The rate of step index `step`.
    fn lr(&self, peak: f64, step: u64) -> f64;
}

impl LrSchedule for WarmupCosine {
    fn lr(&self, peak: f64, step: u64) -> f64 {
        WarmupCosine::lr(self, peak, step)
    }
}

impl<F: Fn(u64) -> f64 + Send> LrSchedule for F {
    fn lr(&self, peak: f64, step: u64) -> f64 {
        peak * self(step)
    }
}

/// Sets gradients undefined, as PyTorch's `zero_grad(set_to_none=True)`, through a libtorch
/// C++ optimizer over the parameters that is never stepped (tch has no other way to reset a
/// gradient).
struct GradientDropper(tch::COptimizer);

impl std::fmt::Debug for GradientDropper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GradientDropper")
    }
}

/// The optimizer (module docs).
pub struct Optimizer {
    groups: Vec<Group>,
    schedule: Option<Box<dyn LrSchedule>>,
    steps: u64,
    dropper: GradientDropper,
    checked: bool,
    shard: Option<Sharding>,
}

impl std::fmt::Debug for Optimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Optimizer")
            .field("groups", &self.groups)
            .field("steps", &self.steps)
            .field("schedule", &self.schedule.is_some())
            .finish()
    }
}

impl Optimizer {
    /// The optimizer over `groups`; prepares each (checks its update, rate and parameters'
    /// shapes; retracts manifold blocks onto their manifold).
    ///
    /// Errors ([`OptimError::Groups`], [`OptimError::Param`]): no groups; two groups of one
    /// name; a parameter name or tensor in two places; an empty group; an invalid config or
    /// rate; a shape the group's [`MatrixSpec`] cannot cut.
    pub fn new(mut groups: Vec<Group>) -> Result<Self> {
        let bad = |reason: String| OptimError::Groups { reason };
        if groups.is_empty() {
            return Err(bad("no groups".into()));
        }
        let mut names: HashMap<&str, &str> = HashMap::new();
        let mut storage: HashMap<(usize, Vec<i64>, Vec<i64>), &str> = HashMap::new();
        for (i, g) in groups.iter().enumerate() {
            if groups[..i].iter().any(|h| h.name == g.name) {
                return Err(bad(format!("two groups are named `{}`", g.name)));
            }
            for (n, t) in g.names.iter().zip(&g.params) {
                if let Some(other) = names.insert(n, &g.name) {
                    return Err(param_err(
                        n,
                        bad(format!("it is in groups `{other}` and `{}`", g.name)),
                    ));
                }
                dense("param", t).map_err(|e| param_err(n, e.into()))?;
                if t.defined() && t.numel() > 0 {
                    let key = (t.data_ptr() as usize, t.size(), t.stride());
                    if let Some(other) = storage.insert(key, n) {
                        return Err(param_err(n, bad(format!("it is the tensor `{other}` too"))));
                    }
                }
            }
        }
        for g in &mut groups {
            g.prepare()?;
        }
        let mut dropper =
            tch::COptimizer::sgd(0.0, 0.0, 0.0, 0.0, false).map_err(libtorch("params"))?;
        for g in &groups {
            for p in &g.params {
                dropper.add_parameters(p, 0).map_err(libtorch("params"))?;
            }
        }
        Ok(Self {
            groups,
            schedule: None,
            steps: 0,
            dropper: GradientDropper(dropper),
            checked: false,
            shard: None,
        })
    }

    /// This optimizer with a learning-rate schedule (replacing any earlier one).
    pub fn with_schedule(mut self, schedule: impl LrSchedule + 'static) -> Self {
        self.set_schedule(schedule);
        self
    }

    /// Sets the learning-rate schedule.
    pub fn set_schedule(&mut self, schedule: impl LrSchedule + 'static) {
        self.schedule = Some(Box::new(schedule));
    }

    /// The groups, in order.
    pub fn groups(&self) -> &[Group] {
        &self.groups
    }

    /// Every parameter's name and tensor, group by group.
    pub fn params(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.groups
            .iter()
            .flat_map(|g| g.names.iter().map(String::as_str).zip(&g.params))
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The learning rate group `group` steps at next.
    pub fn lr(&self, group: &str) -> Option<f64> {
        let g = self.groups.iter().find(|g| g.name == group)?;
        Some(self.scheduled(g.lr))
    }

    /// Sets group `group`'s peak rate (finite, ≥ 0).
    pub fn set_lr(&mut self, group: &str, lr: f64) -> Result<()> {
        crate::error::check_range("lr", lr, 0.0, f64::MAX)?;
        let g = self
            .groups
            .iter_mut()
            .find(|g| g.name == group)
            .ok_or_else(|| OptimError::Groups {
                reason: format!("no group is named `{group}`"),
            })?;
        g.lr = lr;
        Ok(())
    }

    fn scheduled(&self, peak: f64) -> f64 {
        match &self.schedule {
            Some(s) => s.lr(peak, self.steps),
            None => peak,
        }
    }

    /// Sets every parameter's gradient undefined (the next backward pass stores each gradient
    /// instead of adding it to zeros, as PyTorch's `zero_grad()`).
    pub fn zero_grad(&mut self) -> Result<()> {
        self.checked = false;
        self.dropper.0.zero_grad().map_err(libtorch("params"))
    }

    /// The global gradient norm ‖g‖ = (Σ_p ‖g_p‖²)^{1/2} over the defined gradients, in f64;
    /// when `max_norm` > 0 and ‖g‖ > `max_norm` (and finite), every gradient is scaled by
    /// `max_norm`/(‖g‖ + 10⁻⁶) (PyTorch's `clip_grad_norm_`). Returns ‖g‖ before clipping.
    ///
    /// Contiguous CPU f32 gradients are summed in one pass over their data (each square exact in
    /// f64, fixed chunks added in order: the value does not depend on the thread count); others
    /// through libtorch in f64.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> Result<f64> {
        let _guard = tch::no_grad_guard();
        let mut grads = Vec::new();
        for (name, p) in self.params() {
            let g = p.grad();
            dense("grad", &g).map_err(|e| param_err(name, e.into()))?;
            grads.push(g);
        }
        let total = match crate::fused::sum_of_squares(&grads) {
            Some(sum) => sum,
            None => {
                let mut total = 0.0;
                for g in grads.iter().filter(|g| g.defined()) {
                    total += squares(g)?;
                }
                total
            }
        };
        let norm = total.sqrt();
        self.checked = norm.is_finite();
        if max_norm > 0.0 && norm.is_finite() && norm > max_norm {
            let scale = max_norm / (norm + 1e-6);
            for g in grads.iter().filter(|g| g.defined()) {
                let _ = g
                    .shallow_clone()
                    .f_mul_scalar_(scale)
                    .map_err(libtorch("grads"))?;
            }
        }
        Ok(norm)
    }

    /// One step of every group (module docs, "A step").
    pub fn step(&mut self) -> Result<()> {
        let _guard = tch::no_grad_guard();
        self.check_gradients()?;
        let rates: Vec<f64> = self.groups.iter().map(|g| self.scheduled(g.lr)).collect();
        for (g, &lr) in self.groups.iter().zip(&rates) {
            g.check_rate(lr)?;
        }
        if let Some(s) = &mut self.shard {
            s.begin_step();
        }
        for (g, lr) in self.groups.iter_mut().zip(rates) {
            g.step(lr, self.shard.as_mut())?;
        }
        if let Some(s) = &self.shard {
            let device = (self.groups.iter())
                .find_map(|g| g.params.first().map(Tensor::device))
                .unwrap_or(tch::Device::Cpu);
            let mut stats: Vec<_> = (self.groups.iter_mut())
                .map(|g| (&mut g.pending, &mut g.stats))
                .collect();
            s.merge_stats(&mut stats, device)?;
        }
        self.steps += 1;
        self.checked = false;
        Ok(())
    }

    /// Checks every defined gradient against its parameter, and its entries unless a finite
    /// global norm was computed since the gradients were dropped.
    fn check_gradients(&self) -> Result<()> {
        for (name, p) in self.params() {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let named = |e: InputError| param_err(name, e.into());
            dense("grad", &g).map_err(named)?;
            if g.size() != p.size() || g.kind() != p.kind() || g.device() != p.device() {
                return Err(named(InputError::shape_mismatch(
                    "grad",
                    format!(
                        "{:?} {:?} on {:?} (its parameter's)",
                        p.size(),
                        p.kind(),
                        p.device()
                    ),
                    format!("{:?} {:?} on {:?}", g.size(), g.kind(), g.device()),
                )));
            }
            if !self.checked && !finite(&g).map_err(|e| param_err(name, e))? {
                return Err(param_err(name, first_non_finite(&g)?));
            }
        }
        Ok(())
    }

    /// Forgets that a finite global norm was computed ([`Optimizer::clip_grad_norm`]), so the
    /// next step checks every gradient's entries again: for callers that change gradients by
    /// other means than this optimizer's calls in between.
    pub fn recheck_gradients(&mut self) {
        self.checked = false;
    }

    /// What each group's update did since the last call: (group name, statistics).
    pub fn take_stats(&mut self) -> Vec<(String, OptimizerStats)> {
        self.groups
            .iter_mut()
            .map(|g| (g.name.clone(), g.take_stats()))
            .collect()
    }

    /// Writes [`Optimizer::state_dict`] to a safetensors file (through a temporary file and a
    /// rename: a crash leaves the earlier file or this one).
    pub fn save(&self, path: &Path) -> Result<()> {
        let tensors = self.state_dict()?;
        let tmp = path.with_extension("safetensors.tmp");
        let io = |e: std::io::Error| OptimError::Io {
            path: path.display().to_string(),
            error: e.to_string(),
        };
        Tensor::write_safetensors(&tensors, &tmp).map_err(|e| OptimError::Io {
            path: tmp.display().to_string(),
            error: e.to_string(),
        })?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Reads a file [`Optimizer::save`] wrote and loads it ([`Optimizer::load_state_dict`]).
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let tensors = Tensor::read_safetensors(path).map_err(|e| OptimError::Io {
            path: path.display().to_string(),
            error: e.to_string(),
        })?;
        self.load_state_dict(&tensors.into_iter().collect())
    }
}

/// Refuses a parameter or gradient the optimizers cannot read as an array of values: a sparse
/// or oneDNN tensor (`nn.Embedding(sparse=True)` makes sparse gradients), or one of an element
/// type libtorch's C API does not name. An undefined tensor passes (a parameter without a
/// gradient is skipped).
fn dense(arg: &'static str, g: &Tensor) -> std::result::Result<(), InputError> {
    if !g.defined() {
        return Ok(());
    }
    let layout = if g.is_sparse() {
        "sparse"
    } else if g.is_mkldnn() {
        "oneDNN"
    } else {
        return g.f_kind().map(|_| ()).map_err(|e| {
            InputError::invalid(arg, format!("an element type kappa cannot read ({e})"))
        });
    };
    Err(InputError::invalid(
        arg,
        format!("a {layout} tensor; kappa's optimizers take dense (strided) tensors"),
    ))
}

/// Σ g² of one tensor in f64 through libtorch.
fn squares(g: &Tensor) -> Result<f64> {
    g.f_to_kind(Kind::Double)
        .and_then(|d| d.f_square())
        .and_then(|s| s.f_sum(Kind::Double))
        .and_then(|s| s.f_double_value(&[]))
        .map_err(libtorch("grads"))
}

/// The [`InputError::NonFinite`] of the first non-finite entry of `g` (in storage order, its
/// position in the (d₀, d₁·…·d_k) matrix).
fn first_non_finite(g: &Tensor) -> Result<OptimError> {
    let find = || -> std::result::Result<(i64, f64), tch::TchError> {
        let flat = g.f_reshape([-1])?.f_to_kind(Kind::Double)?;
        let at = flat.f_isfinite()?.f_logical_not()?.f_nonzero()?;
        let i = at.f_int64_value(&[0, 0])?;
        Ok((i, flat.f_double_value(&[i])?))
    };
    let (i, value) = find().map_err(libtorch("grad"))?;
    let cols = g.size().iter().skip(1).product::<i64>().max(1);
    Ok(InputError::NonFinite {
        arg: "grad",
        row: (i / cols) as usize,
        col: (i % cols) as usize,
        value,
    }
    .into())
}

/// Whether every entry of `g` is finite (one pass, [`crate::fused::all_finite`], for a
/// contiguous CPU f32 tensor; libtorch's `isfinite().all()` for any other).
fn finite(g: &Tensor) -> Result<bool> {
    match crate::fused::all_finite(std::slice::from_ref(g)) {
        Some(f) => Ok(f),
        None => g
            .f_isfinite()
            .and_then(|f| f.f_all())
            .and_then(|a| a.f_int64_value(&[]))
            .map(|v| v == 1)
            .map_err(libtorch("grad")),
    }
}

#[cfg(feature = "dist")]
impl Optimizer {
    /// Shards Muon's and manifold Muon's blocks over `comm`'s ranks from the next step on
    /// (module docs of [`shard`]): each rank steps about 1/W of every batch of same-shape
    /// blocks, then every block's new weight and state is gathered from its rank, so weights
    /// and state stay the same on every rank. On a group of one rank it does nothing.
    ///
    /// Every rank must then call [`Optimizer::step`] with the same gradients, for each step's
    /// exchanges are collectives over `comm`.
    pub fn shard(&mut self, comm: std::sync::Arc<dyn kappa_dist::Communicator>) {
        self.shard = (comm.world() > 1).then(|| Sharding::new(comm));
    }

    /// Whether the matrix groups are sharded ([`Optimizer::shard`] over more than one rank).
    pub fn is_sharded(&self) -> bool {
        self.shard.is_some()
    }

    /// What this rank received in the last step's exchanges (zero when not sharded).
    pub fn traffic(&self) -> Traffic {
        self.shard
            .as_ref()
            .map(Sharding::traffic)
            .unwrap_or_default()
    }
}
