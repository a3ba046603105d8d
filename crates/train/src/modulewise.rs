//! Module-wise optimizer assignment, after *Different Layers, Different Manifolds*: every GPT
//! weight gets a [`ModuleLabel`], an [`Assignment`] maps the hidden-matrix labels to a
//! [`Geometry`] (AdamW, Muon, manifold Muon on Stiefel, DGram or Oblique), and
//! [`modulewise_groups`] turns that into the kappa-optim groups the
//! [`Trainer`](crate::Trainer) runs. The five assignments of the paper are [`Preset`]s.
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
//!   [`OptimizerStats`](crate::OptimizerStats).

use std::collections::BTreeMap;

use kappa_optim::optimizer::{Axis, Group, MatrixSpec};
use kappa_optim::{
    DGramRetraction, DualAscent, DualSolver, Manifold, ManifoldMuonConfig, MuonConfig, OnDivergence,
};
use serde::{Deserialize, Serialize};
use tch::{nn, Tensor};

use crate::trainer::{named_trainable, TrainConfig};
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
    /// Worker threads that step the matrices of one Muon or manifold group concurrently
    /// ([`Group::with_threads`]; each matrix's step is independent, so at one libtorch thread
    /// the result does not depend on this). Small matrices on the CPU are bound by
    /// per-operation overhead, not FLOPs, and one process thread per core is the only way to
    /// use the cores there; keep 1 on CUDA.
    #[serde(default = "one")]
    pub optimizer_threads: usize,
    /// Per-label multipliers on the peak learning rate (all 1 by default).
    #[serde(default, skip_serializing_if = "LrMultipliers::is_default")]
    pub lr_multipliers: LrMultipliers,
    /// Step the row blocks of one group that share a shape together: Muon groups with one
    /// batched orthogonalization ([`kappa_optim::Muon::step_batch`]), manifold groups with
    /// their dual ascents in lock step ([`kappa_optim::ManifoldMuon::step_batch`]), instead of
    /// one call per block; a shape that occurs once keeps the per-matrix call, a Muon group's
    /// batches are split over `optimizer_threads`, and a batched manifold group ignores it.
    /// Off by default: the batched products round differently from one product per matrix, so
    /// the published runs (unbatched) stay reproducible bit for bit.
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

/// The parameter groups of a GPT under `config`: [`modulewise_groups_by`] with the GPT's
/// labels ([`ModuleLabel::of`]).
pub fn modulewise_groups(
    vs: &nn::VarStore,
    config: &ModulewiseConfig,
    train: &TrainConfig,
) -> Result<Vec<Group>> {
    modulewise_groups_by(vs, config, train, |name, _| ModuleLabel::of(name))
}

/// The parameter groups of any model whose variables `label_of` labels: [`modulewise_groups_of`]
/// over the var store's trainable variables, in name order.
pub fn modulewise_groups_by(
    vs: &nn::VarStore,
    config: &ModulewiseConfig,
    train: &TrainConfig,
    label_of: impl Fn(&str, &Tensor) -> Option<ModuleLabel>,
) -> Result<Vec<Group>> {
    modulewise_groups_of(named_trainable(vs), config, train, label_of)
}

/// The parameter groups of the named tensors `named` (a var store's, or a PyTorch module's
/// parameters) whose names `label_of` labels: one group per
/// hidden-matrix label (named by [`ModuleLabel::name`], updated by the label's [`Geometry`] at
/// `muon_lr` — or the train config's lr for AdamW — times the label's multiplier),
/// `embedding` (AdamW, weight decay `embedding_weight_decay`) and `gain_bias` (AdamW, no
/// decay). Manifold groups retract their blocks onto the manifold when the optimizer is built
/// ([`Optimizer::new`](kappa_optim::Optimizer::new)). With `split_qkv`, each QKV matrix is
/// three row blocks (three equal "heads" along the rows). Groups list their tensors in the
/// order of `named`.
///
/// Errors: an invalid config or train config (the schedule's floor divides by its lr); tensors
/// `label_of` cannot place, every one named.
pub fn modulewise_groups_of(
    named: Vec<(String, Tensor)>,
    config: &ModulewiseConfig,
    train: &TrainConfig,
    label_of: impl Fn(&str, &Tensor) -> Option<ModuleLabel>,
) -> Result<Vec<Group>> {
    config.validate()?;
    train.validate()?;
    let mut by_label: BTreeMap<ModuleLabel, Vec<(String, Tensor)>> = BTreeMap::new();
    let mut unplaced = Vec::new();
    for (name, t) in named {
        match label_of(&name, &t) {
            Some(label) => by_label.entry(label).or_default().push((name, t)),
            None => unplaced.push(name),
        }
    }
    if !unplaced.is_empty() {
        return Err(ModelsError::config(
            "modulewise",
            format!(
                "{} trainable variable(s) have no module label: `{}`",
                unplaced.len(),
                unplaced.join("`, `")
            ),
        ));
    }
    let mut groups = Vec::new();
    let mut gain_bias = Vec::new();
    for (label, items) in by_label {
        match config.assignment.geometry(label) {
            Some(geometry) => {
                groups.push(label_group(config, train, label, geometry).with_params(items))
            }
            None if label == ModuleLabel::Embedding => {
                let adamw = train.adamw(config.embedding_weight_decay);
                groups.push(Group::adamw(label.name(), adamw, train.lr).with_params(items));
            }
            None => gain_bias.extend(items),
        }
    }
    if !gain_bias.is_empty() {
        let adamw = train.adamw(0.0);
        groups.push(Group::adamw("gain_bias", adamw, train.lr).with_params(gain_bias));
    }
    Ok(groups)
}

/// The empty group of a hidden-matrix label under `geometry`.
fn label_group(
    config: &ModulewiseConfig,
    train: &TrainConfig,
    label: ModuleLabel,
    geometry: Geometry,
) -> Group {
    let factor = config.lr_multipliers.of(label);
    let name = label.name();
    if geometry == Geometry::AdamW {
        return Group::adamw(name, train.adamw(train.weight_decay), train.lr * factor);
    }
    let group = match geometry.manifold(config.dgram_retraction) {
        None => Group::muon(name, config.muon),
        Some(manifold) => {
            let solver = config
                .solvers
                .solver(label)
                .unwrap_or(config.manifold.solver);
            let cfg = ManifoldMuonConfig {
                manifold,
                solver,
                ..config.manifold
            };
            Group::manifold(name, cfg)
        }
    };
    let matrix = if label == ModuleLabel::AttentionQkv && config.assignment.split_qkv {
        MatrixSpec::matrix().heads(Axis::Rows, 3)
    } else {
        MatrixSpec::matrix()
    };
    group
        .with_lr(config.muon_lr * factor)
        .with_batch(config.batch)
        .with_threads(config.optimizer_threads)
        .with_matrix(matrix)
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
