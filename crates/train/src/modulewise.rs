//! Module-wise optimizer assignment, after *Different Layers, Different Manifolds*: every GPT
//! weight gets a [`ModuleLabel`], an [`Assignment`] maps the hidden-matrix labels to a
//! [`Geometry`] (AdamW, Muon, manifold Muon on Stiefel, DGram or Oblique), and
//! [`modulewise_groups`] turns that into the [`ParamGroup`]s the [`Trainer`](crate::Trainer)
//! runs. The five assignments of the paper are [`Preset`]s.
//!
//! # What the paper ran (docs/manifolds.md, "What the code does, and why")
//!
//! * Hidden matrices — `attn.c_attn` (fused QKV, 3d×d), `attn.c_proj`, `mlp.c_fc`,
//!   `mlp.c_proj` — go to Muon or manifold Muon; embeddings (AdamW with weight decay) and
//!   LayerNorm gains (AdamW without) never do. Biases (the paper has none) join the gains.
//! * The Muon learning rate follows the AdamW schedule: every group runs at its own peak times
//!   the schedule's factor f(t) ([`TrainConfig::schedule`]), so Muon and manifold groups run at
//!   lr_Muon(t) = `muon_lr`·f(t) = `muon_lr`·lr(t)/lr: a peak of 0.02 (whatever the AdamW peak)
//!   and an end at min_lr/lr of that (a tenth in the paper). The groups' `lr` is `muon_lr`.
//! * The fused QKV block is constrained as one matrix, so under Stiefel only
//!   W_qᵀW_q + W_kᵀW_k + W_vᵀW_v = I holds; [`Assignment::split_qkv`] constrains each d×d slice
//!   instead.
//! * Constrained matrices start on their manifold: the groups retract the usual init once
//!   (for DGram with the paper's retraction this keeps the init's singular values, sorted).
//! * Unconstrained Muon is the paper's (Polar Express, SGD-Nesterov momentum, no shape factor,
//!   decoupled weight decay 0.1); manifold matrices get no weight decay.
//! * A dual ascent that diverges is applied and counted, as the paper's code did
//!   ([`OnDivergence::Apply`]); the counts reach `metrics.jsonl` through
//!   [`OptimizerStats`].

use std::collections::HashMap;
use std::time::Instant;

use kappa_optim::{
    DGramRetraction, DualAscent, DualSolver, Manifold, ManifoldMuon, ManifoldMuonConfig,
    ManifoldState, MomentumState, Muon, MuonConfig, MuonState, OnDivergence,
};
use serde::{Deserialize, Serialize};
use tch::{nn, Tensor};

use crate::trainer::{
    named_trainable, optim_err, AdamWGroup, GroupOptimizer, OptimizerStats, ParamGroup, TrainConfig,
};
use kappa_models::error::{ModelsError, Result};

/// What a GPT variable is, from its var-store name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleLabel {
    /// `attn.c_attn.weight`: the fused (3d, d) QKV projection.
    AttentionQkv,
    /// `attn.c_proj.weight`: the (d, d) output projection.
    AttentionOut,
    /// `mlp.c_fc.weight`: the (r·d, d) expansion.
    MlpIn,
    /// `mlp.c_proj.weight`: the (d, r·d) contraction.
    MlpOut,
    /// `wte`, `wpe` (the token embedding is tied to the output head).
    Embedding,
    /// LayerNorm gains.
    NormGain,
    /// Biases of linear layers and LayerNorms.
    Bias,
}

impl ModuleLabel {
    /// The label of the variable `name`, or `None` for a name this GPT does not have.
    ///
    /// ```
    /// use kappa_train::ModuleLabel;
    /// assert_eq!(ModuleLabel::of("h.3.attn.c_attn.weight"), Some(ModuleLabel::AttentionQkv));
    /// assert_eq!(ModuleLabel::of("h.0.mlp.c_proj.weight"), Some(ModuleLabel::MlpOut));
    /// assert_eq!(ModuleLabel::of("ln_f.weight"), Some(ModuleLabel::NormGain));
    /// assert_eq!(ModuleLabel::of("h.0.attn.c_attn.bias"), Some(ModuleLabel::Bias));
    /// ```
    pub fn of(name: &str) -> Option<Self> {
        let parts: Vec<&str> = name.split('.').collect();
        let last = *parts.last()?;
        if last == "wte" || last == "wpe" {
            return Some(Self::Embedding);
        }
        if last == "bias" {
            return Some(Self::Bias);
        }
        if last != "weight" || parts.len() < 2 {
            return None;
        }
        let module = parts[parts.len() - 2];
        let parent = parts
            .len()
            .checked_sub(3)
            .and_then(|i| parts.get(i))
            .copied()
            .unwrap_or("");
        match (parent, module) {
            (_, m) if m.starts_with("ln") => Some(Self::NormGain),
            ("attn", "c_attn") => Some(Self::AttentionQkv),
            ("attn", "c_proj") => Some(Self::AttentionOut),
            ("mlp", "c_fc") => Some(Self::MlpIn),
            ("mlp", "c_proj") => Some(Self::MlpOut),
            _ => None,
        }
    }

    /// A short name (`attn_qkv`, `attn_out`, `mlp_in`, `mlp_out`, `embedding`, `norm_gain`,
    /// `bias`), also the group name of hidden matrices.
    pub fn name(&self) -> &'static str {
        match self {
            Self::AttentionQkv => "attn_qkv",
            Self::AttentionOut => "attn_out",
            Self::MlpIn => "mlp_in",
            Self::MlpOut => "mlp_out",
            Self::Embedding => "embedding",
            Self::NormGain => "norm_gain",
            Self::Bias => "bias",
        }
    }

    /// Whether the label belongs to attention (QKV or output projection).
    pub fn is_attention(&self) -> bool {
        matches!(self, Self::AttentionQkv | Self::AttentionOut)
    }
}

/// The optimizer (and constraint) of a hidden matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Geometry {
    /// AdamW with the train config's weight decay.
    #[serde(rename = "adamw")]
    AdamW,
    /// Unconstrained Muon ([`ModulewiseConfig::muon`]).
    Muon,
    /// Manifold Muon on the Stiefel manifold (WᵀW = I).
    Stiefel,
    /// Manifold Muon on DGram (Off(WᵀW) = 0).
    #[serde(rename = "dgram")]
    DGram,
    /// Manifold Muon on the Oblique manifold (diag(WᵀW) = 1: unit columns of the tall
    /// orientation, so a wide `mlp.c_proj` gets unit rows). Not in the paper's presets.
    Oblique,
}

impl Geometry {
    /// The manifold of a constrained geometry.
    pub fn manifold(&self, retraction: DGramRetraction) -> Option<Manifold> {
        match self {
            Self::Stiefel => Some(Manifold::Stiefel),
            Self::DGram => Some(Manifold::DGram(retraction)),
            Self::Oblique => Some(Manifold::Oblique),
            Self::AdamW | Self::Muon => None,
        }
    }
}

/// Which geometry each hidden-matrix label gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    /// `attn.c_attn`.
    pub attention_qkv: Geometry,
    /// `attn.c_proj`.
    pub attention_out: Geometry,
    /// `mlp.c_fc`.
    pub mlp_in: Geometry,
    /// `mlp.c_proj`.
    pub mlp_out: Geometry,
    /// Treat `c_attn` as three d×d matrices W_Q, W_K, W_V (each constrained and with its own
    /// momentum) instead of one fused 3d×d block (the paper).
    pub split_qkv: bool,
}

impl Assignment {
    /// `attention` for both attention matrices, `mlp` for both MLP matrices, QKV fused.
    pub const fn attention_mlp(attention: Geometry, mlp: Geometry) -> Self {
        Self {
            attention_qkv: attention,
            attention_out: attention,
            mlp_in: mlp,
            mlp_out: mlp,
            split_qkv: false,
        }
    }

    /// The geometry of a hidden-matrix label (`None` for embeddings, gains and biases, which
    /// always get AdamW).
    pub fn geometry(&self, label: ModuleLabel) -> Option<Geometry> {
        match label {
            ModuleLabel::AttentionQkv => Some(self.attention_qkv),
            ModuleLabel::AttentionOut => Some(self.attention_out),
            ModuleLabel::MlpIn => Some(self.mlp_in),
            ModuleLabel::MlpOut => Some(self.mlp_out),
            ModuleLabel::Embedding | ModuleLabel::NormGain | ModuleLabel::Bias => None,
        }
    }
}

/// The tangent-problem solver of each constrained hidden-matrix label (kappa-optim's
/// [`DualSolver`]: the dual ascent or ADMM); `None` (the serde default of every field) takes
/// [`ModulewiseConfig::manifold`]'s `solver`, itself the dual ascent by default — so configs
/// without this table train exactly as before. A label whose geometry is AdamW or Muon ignores
/// its entry.
///
/// ```
/// use kappa_optim::{Admm, DualSolver};
/// use kappa_train::modulewise::ModuleSolvers;
/// use kappa_train::{ModulewiseConfig, Preset};
/// // HETERO: Stiefel attention with ADMM, DGram MLP with the dual ascent.
/// let config = ModulewiseConfig {
///     solvers: ModuleSolvers::attention_mlp(Some(DualSolver::Admm(Admm::standard())), None),
///     ..ModulewiseConfig::paper(Preset::Hetero)
/// };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleSolvers {
    /// `attn.c_attn`.
    #[serde(default)]
    pub attention_qkv: Option<DualSolver>,
    /// `attn.c_proj`.
    #[serde(default)]
    pub attention_out: Option<DualSolver>,
    /// `mlp.c_fc`.
    #[serde(default)]
    pub mlp_in: Option<DualSolver>,
    /// `mlp.c_proj`.
    #[serde(default)]
    pub mlp_out: Option<DualSolver>,
}

impl ModuleSolvers {
    /// `attention` for both attention matrices, `mlp` for both MLP matrices.
    pub const fn attention_mlp(attention: Option<DualSolver>, mlp: Option<DualSolver>) -> Self {
        Self {
            attention_qkv: attention,
            attention_out: attention,
            mlp_in: mlp,
            mlp_out: mlp,
        }
    }

    /// Whether no entry is set (the default; left out when a config is written).
    pub fn is_unset(&self) -> bool {
        *self == Self::default()
    }

    /// The entry of `label` (`None` for the labels without one and for unset entries).
    pub fn solver(&self, label: ModuleLabel) -> Option<DualSolver> {
        match label {
            ModuleLabel::AttentionQkv => self.attention_qkv,
            ModuleLabel::AttentionOut => self.attention_out,
            ModuleLabel::MlpIn => self.mlp_in,
            ModuleLabel::MlpOut => self.mlp_out,
            ModuleLabel::Embedding | ModuleLabel::NormGain | ModuleLabel::Bias => None,
        }
    }

    /// The entries that are set, with their field names.
    fn entries(&self) -> impl Iterator<Item = (&'static str, DualSolver)> {
        [
            ("attention_qkv", self.attention_qkv),
            ("attention_out", self.attention_out),
            ("mlp_in", self.mlp_in),
            ("mlp_out", self.mlp_out),
        ]
        .into_iter()
        .filter_map(|(name, s)| s.map(|s| (name, s)))
    }
}

/// Multipliers on each hidden-matrix label's peak learning rate (modded-nanogpt's per-matrix
/// `lr_mul`): the label's group runs at multiplier × its optimizer's peak (`muon_lr` for Muon
/// and manifold Muon, the train config's lr for AdamW). Every multiplier defaults to 1.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrMultipliers {
    /// `attn.c_attn`.
    #[serde(default = "one_f64")]
    pub attention_qkv: f64,
    /// `attn.c_proj`.
    #[serde(default = "one_f64")]
    pub attention_out: f64,
    /// `mlp.c_fc`.
    #[serde(default = "one_f64")]
    pub mlp_in: f64,
    /// `mlp.c_proj`.
    #[serde(default = "one_f64")]
    pub mlp_out: f64,
}

fn one_f64() -> f64 {
    1.0
}

impl Default for LrMultipliers {
    fn default() -> Self {
        Self {
            attention_qkv: 1.0,
            attention_out: 1.0,
            mlp_in: 1.0,
            mlp_out: 1.0,
        }
    }
}

impl LrMultipliers {
    /// The multiplier of a hidden-matrix label (1 for embeddings, gains and biases).
    pub fn of(&self, label: ModuleLabel) -> f64 {
        match label {
            ModuleLabel::AttentionQkv => self.attention_qkv,
            ModuleLabel::AttentionOut => self.attention_out,
            ModuleLabel::MlpIn => self.mlp_in,
            ModuleLabel::MlpOut => self.mlp_out,
            ModuleLabel::Embedding | ModuleLabel::NormGain | ModuleLabel::Bias => 1.0,
        }
    }

    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks that every multiplier is finite and > 0.
    pub fn validate(&self) -> Result<()> {
        let all = [
            ("attention_qkv", self.attention_qkv),
            ("attention_out", self.attention_out),
            ("mlp_in", self.mlp_in),
            ("mlp_out", self.mlp_out),
        ];
        for (name, v) in all {
            if !(v.is_finite() && v > 0.0) {
                return Err(ModelsError::config(
                    format!("modulewise.lr_multipliers.{name}"),
                    format!("must be finite and > 0, found {v}"),
                ));
            }
        }
        Ok(())
    }
}

/// The paper's five assignments (its Table 1; validation loss of GPT-2 small on OpenWebText
/// after 50k steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING-KEBAB-CASE")]
pub enum Preset {
    /// Muon everywhere (the paper's `none`).
    Unconstrained,
    /// Stiefel attention and MLP.
    AllStiefel,
    /// DGram attention and MLP.
    #[serde(rename = "ALL-DGRAM")]
    AllDGram,
    /// Stiefel attention, DGram MLP (the paper's best).
    Hetero,
    /// DGram attention, Stiefel MLP.
    HeteroInv,
}

impl Preset {
    /// All five, in the paper's table order.
    pub const ALL: [Preset; 5] = [
        Preset::Unconstrained,
        Preset::AllStiefel,
        Preset::AllDGram,
        Preset::Hetero,
        Preset::HeteroInv,
    ];

    /// The assignment.
    pub const fn assignment(&self) -> Assignment {
        use Geometry::{DGram, Muon, Stiefel};
        match self {
            Preset::Unconstrained => Assignment::attention_mlp(Muon, Muon),
            Preset::AllStiefel => Assignment::attention_mlp(Stiefel, Stiefel),
            Preset::AllDGram => Assignment::attention_mlp(DGram, DGram),
            Preset::Hetero => Assignment::attention_mlp(Stiefel, DGram),
            Preset::HeteroInv => Assignment::attention_mlp(DGram, Stiefel),
        }
    }

    /// The paper's name (`UNCONSTRAINED`, `ALL-STIEFEL`, `ALL-DGRAM`, `HETERO`, `HETERO-INV`).
    pub const fn name(&self) -> &'static str {
        match self {
            Preset::Unconstrained => "UNCONSTRAINED",
            Preset::AllStiefel => "ALL-STIEFEL",
            Preset::AllDGram => "ALL-DGRAM",
            Preset::Hetero => "HETERO",
            Preset::HeteroInv => "HETERO-INV",
        }
    }

    /// The paper's final validation loss (`None`: "Unstable").
    pub const fn paper_val_loss(&self) -> Option<f64> {
        match self {
            Preset::Unconstrained => Some(3.3855),
            Preset::AllStiefel => Some(3.3679),
            Preset::Hetero => Some(3.3544),
            Preset::AllDGram | Preset::HeteroInv => None,
        }
    }
}

/// How the hidden matrices are optimized.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModulewiseConfig {
    /// Labels → geometries.
    pub assignment: Assignment,
    /// The peak Muon / manifold-Muon learning rate (the spectral norm of a step). It follows
    /// the AdamW schedule's factor f(t): lr_Muon(t) = `muon_lr`·f(t) = `muon_lr`·lr(t)/lr.
    pub muon_lr: f64,
    /// Settings of [`Geometry::Muon`] (its `lr` is replaced by the schedule).
    pub muon: MuonConfig,
    /// Settings of [`Geometry::Stiefel`], [`Geometry::DGram`] and [`Geometry::Oblique`] (`lr` is replaced by the
    /// schedule, `manifold` by the label's geometry, `solver` by the label's entry in
    /// `solvers` when it has one).
    pub manifold: ManifoldMuonConfig,
    /// Per-label solver of the tangent problem (default: none set, every label takes
    /// `manifold.solver`).
    #[serde(default, skip_serializing_if = "ModuleSolvers::is_unset")]
    pub solvers: ModuleSolvers,
    /// The DGram retraction.
    pub dgram_retraction: DGramRetraction,
    /// AdamW weight decay of the embeddings (the paper: 0.1, like nanoGPT).
    pub embedding_weight_decay: f64,
    /// Worker threads that step the matrices of one manifold group concurrently (each matrix's
    /// step is independent, so the result does not depend on this). Small matrices on the CPU
    /// are bound by per-operation overhead, not FLOPs, and one process thread per core is the
    /// only way to use the cores there; keep 1 on CUDA.
    #[serde(default = "one")]
    pub optimizer_threads: usize,
    /// Per-label multipliers on the peak learning rate (all 1 by default).
    #[serde(default, skip_serializing_if = "LrMultipliers::is_default")]
    pub lr_multipliers: LrMultipliers,
    /// Step the row blocks of one group that share a shape together: Muon groups with one
    /// batched orthogonalization ([`kappa_optim::Muon::step_batch`]), manifold groups with
    /// their dual ascents in lock step ([`kappa_optim::ManifoldMuon::step_batch`]), instead of
    /// one call per block; a shape that occurs once keeps the per-matrix call, and a batched
    /// manifold group ignores `optimizer_threads`. Off by default: the batched products round
    /// differently from one product per matrix, so the published runs (unbatched) stay
    /// reproducible bit for bit.
    #[serde(default, skip_serializing_if = "is_false")]
    pub batch: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn one() -> usize {
    1
}

impl ModulewiseConfig {
    /// The paper's settings for `preset`: Muon lr 0.02, [`MuonConfig::paper`],
    /// [`ManifoldMuonConfig::paper`] with divergent dual ascents applied and counted, the
    /// paper's DGram retraction, embedding weight decay 0.1.
    pub fn paper(preset: Preset) -> Self {
        let mut manifold = ManifoldMuonConfig::paper(Manifold::Stiefel);
        manifold.dual = DualAscent {
            on_divergence: OnDivergence::Apply,
            ..DualAscent::paper()
        };
        Self {
            assignment: preset.assignment(),
            muon_lr: 0.02,
            muon: MuonConfig::paper(),
            manifold,
            solvers: ModuleSolvers::default(),
            dgram_retraction: DGramRetraction::Paper,
            embedding_weight_decay: 0.1,
            optimizer_threads: 1,
            lr_multipliers: LrMultipliers::default(),
            batch: false,
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        if !(self.muon_lr.is_finite() && self.muon_lr > 0.0) {
            return Err(ModelsError::config(
                "modulewise.muon_lr",
                format!("must be finite and > 0, found {}", self.muon_lr),
            ));
        }
        if !(self.embedding_weight_decay.is_finite() && self.embedding_weight_decay >= 0.0) {
            return Err(ModelsError::config(
                "modulewise.embedding_weight_decay",
                format!(
                    "must be finite and ≥ 0, found {}",
                    self.embedding_weight_decay
                ),
            ));
        }
        if self.optimizer_threads == 0 {
            return Err(ModelsError::config(
                "modulewise.optimizer_threads",
                "must be ≥ 1",
            ));
        }
        self.lr_multipliers.validate()?;
        let optim = |field: &str, e: kappa_optim::OptimError| {
            ModelsError::config(format!("modulewise.{field}"), e.to_string())
        };
        self.muon.validate().map_err(|e| optim("muon", e))?;
        for (name, solver) in self.solvers.entries() {
            solver
                .validate()
                .map_err(|e| optim(&format!("solvers.{name}"), e))?;
        }
        self.manifold.validate().map_err(|e| optim("manifold", e))
    }
}

/// The parameter groups of a GPT under `config`: one group per hidden-matrix label (named by
/// [`ModuleLabel::name`], optimizer by the label's [`Geometry`]), `embedding` (AdamW, weight
/// decay `embedding_weight_decay`) and `gain_bias` (AdamW, no decay). Constrained matrices are
/// retracted onto their manifold here, in place.
///
/// Errors: an invalid config or train config (the schedule's floor divides by its lr); a
/// trainable variable without a label (not a GPT of this crate);
/// a hidden matrix that is not 2-D, or a QKV matrix whose rows do not split into 3 when
/// `split_qkv` is on.
pub fn modulewise_groups(
    vs: &nn::VarStore,
    config: &ModulewiseConfig,
    train: &TrainConfig,
) -> Result<Vec<ParamGroup>> {
    config.validate()?;
    train.validate()?;
    let mut by_label: Vec<(ModuleLabel, Vec<(String, Tensor)>)> = Vec::new();
    for (name, t) in named_trainable(vs) {
        let label = ModuleLabel::of(&name).ok_or_else(|| {
            ModelsError::config(
                "modulewise",
                format!("variable `{name}` has no module label (is this a kappa GPT?)"),
            )
        })?;
        match by_label.iter_mut().find(|(l, _)| *l == label) {
            Some((_, v)) => v.push((name, t)),
            None => by_label.push((label, vec![(name, t)])),
        }
    }
    by_label.sort_by_key(|(l, _)| *l);
    let adamw = |wd: f64| Box::new(AdamWGroup::new(train.adamw(wd)));
    let mut groups = Vec::new();
    let mut gain_bias = (Vec::new(), Vec::new());
    for (label, items) in by_label {
        let (names, params): (Vec<String>, Vec<Tensor>) = items.into_iter().unzip();
        let geometry = match config.assignment.geometry(label) {
            Some(g) => g,
            None if label == ModuleLabel::Embedding => {
                groups.push(ParamGroup {
                    name: label.name().into(),
                    names,
                    params,
                    lr: train.lr,
                    optimizer: adamw(config.embedding_weight_decay),
                });
                continue;
            }
            None => {
                gain_bias.0.extend(names);
                gain_bias.1.extend(params);
                continue;
            }
        };
        let parts = if label == ModuleLabel::AttentionQkv && config.assignment.split_qkv {
            3
        } else {
            1
        };
        let blocks = blocks_of(&names, &params, parts)?;
        let (optimizer, lr): (Box<dyn GroupOptimizer>, f64) = match geometry {
            Geometry::AdamW => (adamw(train.weight_decay), train.lr),
            Geometry::Muon => (
                Box::new(MuonGroup::new(config.muon, blocks)?.with_batch(config.batch)),
                config.muon_lr,
            ),
            Geometry::Stiefel | Geometry::DGram | Geometry::Oblique => {
                let manifold = geometry
                    .manifold(config.dgram_retraction)
                    .ok_or_else(|| ModelsError::config("modulewise", "unreachable geometry"))?;
                let cfg = ManifoldMuonConfig {
                    manifold,
                    solver: config
                        .solvers
                        .solver(label)
                        .unwrap_or(config.manifold.solver),
                    ..config.manifold
                };
                let group = ManifoldGroup::new(cfg, blocks, &params)?
                    .with_threads(config.optimizer_threads)
                    .with_batch(config.batch);
                (Box::new(group), config.muon_lr)
            }
        };
        groups.push(ParamGroup {
            name: label.name().into(),
            names,
            params,
            lr: lr * config.lr_multipliers.of(label),
            optimizer,
        });
    }
    groups.push(ParamGroup {
        name: "gain_bias".into(),
        names: gain_bias.0,
        params: gain_bias.1,
        lr: train.lr,
        optimizer: adamw(0.0),
    });
    Ok(groups)
}

/// Row blocks of each parameter: `parts` equal slices along dim 0.
fn blocks_of(names: &[String], params: &[Tensor], parts: usize) -> Result<Vec<usize>> {
    for (n, p) in names.iter().zip(params) {
        let size = p.size();
        if size.len() != 2 {
            return Err(ModelsError::Shape {
                arg: "param",
                reason: format!("`{n}` is {size:?}; Muon needs a matrix"),
            });
        }
        if size[0] % parts as i64 != 0 {
            return Err(ModelsError::Shape {
                arg: "param",
                reason: format!(
                    "`{n}` has {} rows, not divisible into {parts} blocks",
                    size[0]
                ),
            });
        }
    }
    Ok(vec![parts; params.len()])
}

/// The row-block views of `p` (and of its gradient).
fn views(p: &Tensor, parts: usize) -> Vec<Tensor> {
    let rows = p.size()[0] / parts as i64;
    (0..parts as i64)
        .map(|i| p.narrow(0, i * rows, rows))
        .collect()
}

/// Every row block of `params` (a view of the parameter and of its gradient) with its state,
/// in order. Errors when the states do not match the blocks (a group built for other params).
fn block_jobs<'s, S>(
    params: &[Tensor],
    parts: &[usize],
    states: &'s mut [S],
) -> Result<Vec<(Tensor, Tensor, &'s mut S)>> {
    let blocks: usize = parts.iter().sum();
    if params.len() != parts.len() || states.len() != blocks {
        return Err(ModelsError::Shape {
            arg: "params",
            reason: format!(
                "{} tensors in {blocks} blocks for an optimizer built for {} tensors and {} states",
                params.len(),
                parts.len(),
                states.len()
            ),
        });
    }
    let mut states = states.iter_mut();
    let mut jobs = Vec::with_capacity(blocks);
    for (p, &n) in params.iter().zip(parts) {
        let grad = p.grad();
        if !grad.defined() {
            // No gradient reached this parameter: skip its blocks (and their states).
            states.by_ref().take(n).for_each(drop);
            continue;
        }
        for ((w, g), s) in views(p, n)
            .into_iter()
            .zip(views(&grad, n))
            .zip(&mut states)
        {
            jobs.push((w, g, s));
        }
    }
    Ok(jobs)
}

/// Saves one momentum state per block: `buffer.<i>` (when a step was taken) and `steps`.
fn momentum_state<'a>(
    states: impl Iterator<Item = &'a MomentumState<Tensor>>,
) -> Vec<(String, Tensor)> {
    let states: Vec<_> = states.collect();
    let steps: Vec<i64> = states.iter().map(|s| s.steps() as i64).collect();
    let mut out = vec![("steps".to_string(), Tensor::from_slice(&steps))];
    for (i, s) in states.iter().enumerate() {
        if let Some(b) = s.buffer() {
            out.push((format!("buffer.{i}"), b.shallow_clone()));
        }
    }
    out
}

fn checkpoint_error(reason: String) -> ModelsError {
    ModelsError::Checkpoint {
        path: std::path::PathBuf::new(),
        reason,
    }
}

/// The `n` momentum states [`momentum_state`] saved.
fn load_momentum_state(
    n: usize,
    saved: &HashMap<String, Tensor>,
) -> Result<Vec<MomentumState<Tensor>>> {
    let bad = checkpoint_error;
    let steps = saved
        .get("steps")
        .ok_or_else(|| bad("momentum state `steps` is missing".into()))?;
    if steps.size() != [n as i64] {
        return Err(bad(format!(
            "momentum state for {:?} blocks, the group has {n}",
            steps.size(),
        )));
    }
    (0..n)
        .map(|i| {
            let k = steps.int64_value(&[i as i64]) as u64;
            let buffer = saved.get(&format!("buffer.{i}")).map(Tensor::copy);
            if k > 0 && buffer.is_none() {
                return Err(bad(format!("momentum buffer {i} is missing")));
            }
            Ok(MomentumState::from_parts(buffer, k))
        })
        .collect()
}

/// NorMuon's second moments, `second.<i>` (f64, one value per neuron), for the blocks that have
/// one.
fn second_moment_state(states: &[MuonState<Tensor>]) -> Vec<(String, Tensor)> {
    let with = states.iter().enumerate();
    with.filter_map(|(i, s)| {
        Some((
            format!("second.{i}"),
            Tensor::from_slice(s.second_moment()?),
        ))
    })
    .collect()
}

/// The second moment `second.<i>` of block `i`, if it was saved.
fn load_second_moment(saved: &HashMap<String, Tensor>, i: usize) -> Result<Option<Vec<f64>>> {
    let Some(t) = saved.get(&format!("second.{i}")) else {
        return Ok(None);
    };
    let t = t.to_kind(tch::Kind::Double).to_device(tch::Device::Cpu);
    Vec::<f64>::try_from(&t)
        .map(Some)
        .map_err(|e| checkpoint_error(format!("NorMuon second moment {i}: {e}")))
}

/// [`Muon`] over a group of (out, in) matrices (each split into row blocks), on tch tensors.
/// With [`MuonGroup::with_batch`], blocks of one shape are stepped with one batched call.
#[derive(Debug)]
pub struct MuonGroup {
    muon: Muon,
    parts: Vec<usize>,
    states: Vec<MuonState<Tensor>>,
    stats: Accumulator,
    batch: bool,
}

impl MuonGroup {
    /// Muon with `config` for parameters split into `parts[i]` row blocks each.
    pub fn new(config: MuonConfig, parts: Vec<usize>) -> Result<Self> {
        let n = parts.iter().sum();
        Ok(Self {
            muon: Muon::new(config).map_err(optim_err)?,
            parts,
            states: (0..n).map(|_| MuonState::new()).collect(),
            stats: Accumulator::default(),
            batch: false,
        })
    }

    /// This group with batching on or off ([`ModulewiseConfig::batch`]).
    pub fn with_batch(self, batch: bool) -> Self {
        Self { batch, ..self }
    }
}

/// One row block to step: the parameter's view, the gradient's, the block's state.
type Job<S> = (Tensor, Tensor, S);

/// The row blocks of `jobs` grouped by shape, in order of first appearance (block order kept
/// inside a shape).
fn by_shape<S>(jobs: Vec<Job<S>>) -> Vec<Vec<Job<S>>> {
    let mut groups: Vec<(Vec<i64>, Vec<Job<S>>)> = Vec::new();
    for job in jobs {
        let size = job.0.size();
        match groups.iter_mut().find(|(s, _)| *s == size) {
            Some((_, g)) => g.push(job),
            None => groups.push((size, vec![job])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// Runs a batched step `f` on same-shape blocks: their views collected into slices, their
/// states moved into a slice for `f` and back (also on error, when the step has changed
/// nothing).
fn on_batch<S: Default, R>(
    jobs: Vec<(Tensor, Tensor, &mut S)>,
    f: impl FnOnce(&mut [Tensor], &[Tensor], &mut [S]) -> R,
) -> R {
    let mut ws = Vec::with_capacity(jobs.len());
    let mut grads = Vec::with_capacity(jobs.len());
    let mut slots = Vec::with_capacity(jobs.len());
    for (w, g, s) in jobs {
        ws.push(w);
        grads.push(g);
        slots.push(s);
    }
    let mut states: Vec<S> = slots.iter_mut().map(|s| std::mem::take(*s)).collect();
    let result = f(&mut ws, &grads, &mut states);
    for (slot, s) in slots.into_iter().zip(states) {
        *slot = s;
    }
    result
}

impl GroupOptimizer for MuonGroup {
    fn name(&self) -> &str {
        "muon"
    }

    fn step(&mut self, params: &[Tensor], lr: f64) -> Result<()> {
        let started = Instant::now();
        self.muon.set_lr(lr).map_err(optim_err)?;
        let jobs = block_jobs(params, &self.parts, &mut self.states)?;
        let groups = if self.batch {
            by_shape(jobs)
        } else {
            jobs.into_iter().map(|j| vec![j]).collect()
        };
        for mut group in groups {
            if group.len() > 1 {
                let steps = on_batch(group, |w, g, s| self.muon.step_batch(w, g, s));
                self.stats.updates += steps.map_err(optim_err)?.len() as u64;
            } else if let Some((mut w, g, s)) = group.pop() {
                self.muon.step(&mut w, &g, s).map_err(optim_err)?;
                self.stats.updates += 1;
            }
        }
        self.stats.seconds += started.elapsed().as_secs_f64();
        Ok(())
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = momentum_state(self.states.iter().map(MuonState::momentum));
        out.extend(second_moment_state(&self.states));
        out
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        let momenta = load_momentum_state(self.states.len(), state)?;
        let states = momenta
            .into_iter()
            .enumerate()
            .map(|(i, m)| Ok(MuonState::from_momentum(m, load_second_moment(state, i)?)))
            .collect::<Result<Vec<_>>>()?;
        self.states = states;
        Ok(())
    }

    fn take_stats(&mut self) -> Option<OptimizerStats> {
        Some(std::mem::take(&mut self.stats).finish())
    }
}

/// [`ManifoldMuon`] over a group of (out, in) matrices (each split into row blocks), on tch
/// tensors. [`ManifoldGroup::new`] retracts every block onto the manifold.
#[derive(Debug)]
pub struct ManifoldGroup {
    opt: ManifoldMuon,
    parts: Vec<usize>,
    states: Vec<ManifoldState<Tensor>>,
    stats: Accumulator,
    threads: usize,
    batch: bool,
}

impl ManifoldGroup {
    /// Manifold Muon with `config` for `params` split into `parts[i]` row blocks each; puts
    /// every block on the manifold (in place, without gradient).
    pub fn new(config: ManifoldMuonConfig, parts: Vec<usize>, params: &[Tensor]) -> Result<Self> {
        let opt = ManifoldMuon::new(config).map_err(optim_err)?;
        tch::no_grad(|| -> Result<()> {
            for (p, &n) in params.iter().zip(&parts) {
                for mut w in views(p, n) {
                    opt.retract_onto(&mut w).map_err(optim_err)?;
                }
            }
            Ok(())
        })?;
        let n = parts.iter().sum();
        Ok(Self {
            opt,
            parts,
            states: (0..n).map(|_| ManifoldState::new()).collect(),
            stats: Accumulator::default(),
            threads: 1,
            batch: false,
        })
    }

    /// This group with batching on or off ([`ModulewiseConfig::batch`]).
    pub fn with_batch(self, batch: bool) -> Self {
        Self { batch, ..self }
    }

    /// Steps the blocks on `threads` worker threads (see
    /// [`ModulewiseConfig::optimizer_threads`]).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }
}

/// One block's manifold step on the calling thread (gradient mode off: the block is a view of
/// a leaf that requires grad, and grad mode is per thread).
fn manifold_block_step(
    opt: &ManifoldMuon,
    mut w: Tensor,
    g: Tensor,
    state: &mut ManifoldState<Tensor>,
) -> Result<kappa_optim::ManifoldStep<Tensor>> {
    let _guard = tch::no_grad_guard();
    opt.step(&mut w, &g, state).map_err(optim_err)
}

impl GroupOptimizer for ManifoldGroup {
    fn name(&self) -> &str {
        self.opt.config().manifold.name()
    }

    fn step(&mut self, params: &[Tensor], lr: f64) -> Result<()> {
        let started = Instant::now();
        self.opt.set_lr(lr).map_err(optim_err)?;
        let jobs = block_jobs(params, &self.parts, &mut self.states)?;
        let opt = &self.opt;
        if self.batch {
            for group in by_shape(jobs) {
                let step = |w: &mut [Tensor], g: &[Tensor], s: &mut [ManifoldState<Tensor>]| {
                    tch::no_grad(|| opt.step_batch(w, g, s))
                };
                for done in on_batch(group, step).map_err(optim_err)? {
                    self.stats.add_manifold(&done);
                }
            }
            self.stats.seconds += started.elapsed().as_secs_f64();
            return Ok(());
        }
        let steps: Vec<Result<kappa_optim::ManifoldStep<Tensor>>> = if self.threads <= 1
            || jobs.len() < 2
        {
            jobs.into_iter()
                .map(|(w, g, s)| manifold_block_step(opt, w, g, s))
                .collect()
        } else {
            // Round-robin the blocks over the workers; results come back in block order.
            let workers = self.threads.min(jobs.len());
            let mut lanes: Vec<Vec<(usize, _)>> = (0..workers).map(|_| Vec::new()).collect();
            for (i, job) in jobs.into_iter().enumerate() {
                lanes[i % workers].push((i, job));
            }
            let mut out: Vec<(usize, Result<kappa_optim::ManifoldStep<Tensor>>)> =
                std::thread::scope(|scope| {
                    let handles: Vec<_> = lanes
                        .into_iter()
                        .map(|lane| {
                            scope.spawn(move || {
                                lane.into_iter()
                                    .map(|(i, (w, g, s))| (i, manifold_block_step(opt, w, g, s)))
                                    .collect::<Vec<_>>()
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .flat_map(|h| {
                            h.join().unwrap_or_else(|_| {
                                vec![(
                                    0,
                                    Err(ModelsError::Optimizer("a worker thread panicked".into())),
                                )]
                            })
                        })
                        .collect()
                });
            out.sort_by_key(|(i, _)| *i);
            out.into_iter().map(|(_, r)| r).collect()
        };
        for step in steps {
            self.stats.add_manifold(&step?);
        }
        self.stats.seconds += started.elapsed().as_secs_f64();
        Ok(())
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        momentum_state(self.states.iter())
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        self.states = load_momentum_state(self.states.len(), state)?;
        Ok(())
    }

    fn take_stats(&mut self) -> Option<OptimizerStats> {
        Some(std::mem::take(&mut self.stats).finish())
    }
}

/// Sums over matrix updates since the last report.
#[derive(Debug, Default)]
struct Accumulator {
    updates: u64,
    seconds: f64,
    dual: u64,
    dual_steps: f64,
    msign_calls: f64,
    violation: f64,
    violation_max: f64,
    descent_ratio: f64,
    descent_ratios: u64,
    diverged: u64,
    manifold_violation_max: f64,
}

impl Accumulator {
    fn add_manifold(&mut self, step: &kappa_optim::ManifoldStep<Tensor>) {
        let d = &step.dual;
        self.updates += 1;
        self.dual += 1;
        self.dual_steps += d.dual_steps as f64;
        self.msign_calls += d.msign_calls as f64;
        self.violation += d.violation;
        self.violation_max = self.violation_max.max(d.violation);
        if let Some(r) = d.descent_ratio {
            self.descent_ratio += r;
            self.descent_ratios += 1;
        }
        self.diverged += u64::from(d.diverged);
        self.manifold_violation_max = self.manifold_violation_max.max(step.manifold_violation);
    }

    fn finish(self) -> OptimizerStats {
        let per = |x: f64, n: u64| (n > 0).then(|| x / n as f64);
        OptimizerStats {
            updates: self.updates,
            seconds: self.seconds,
            dual_steps: per(self.dual_steps, self.dual),
            msign_calls: per(self.msign_calls, self.dual),
            violation: per(self.violation, self.dual),
            violation_max: (self.dual > 0).then_some(self.violation_max),
            descent_ratio: per(self.descent_ratio, self.descent_ratios),
            diverged: self.diverged,
            manifold_violation_max: (self.dual > 0).then_some(self.manifold_violation_max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kappa_optim::Admm;

    #[test]
    fn configs_without_solvers_read_as_before_and_entries_pick_the_solver() {
        let paper = ModulewiseConfig::paper(Preset::Hetero);
        let mut value = serde_json::to_value(paper).unwrap();
        let table = value.as_object_mut().unwrap();
        table.remove("solvers");
        table
            .get_mut("manifold")
            .and_then(|m| m.as_object_mut())
            .unwrap()
            .remove("solver");
        let back: ModulewiseConfig = serde_json::from_value(value).unwrap();
        assert_eq!(back, paper);
        let admm = DualSolver::Admm(Admm::standard());
        let solvers = ModuleSolvers::attention_mlp(Some(admm), None);
        assert_eq!(solvers.solver(ModuleLabel::AttentionQkv), Some(admm));
        assert_eq!(solvers.solver(ModuleLabel::MlpOut), None);
        assert_eq!(solvers.solver(ModuleLabel::Embedding), None);
        let bad = ModulewiseConfig {
            solvers: ModuleSolvers::attention_mlp(
                Some(DualSolver::Admm(Admm {
                    steps: 0,
                    ..Admm::standard()
                })),
                None,
            ),
            ..paper
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("solvers.attention_qkv"), "{err}");
    }
}
