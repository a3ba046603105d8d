//! Parameter groups from rules: each [`Rule`] selects parameters by name patterns and rank and
//! says how they are updated; the first rule that matches a parameter places it.
//!
//! [`Grouping::muon_adamw`] holds the split every Muon user makes (Keller Jordan's
//! `MuonWithAuxAdam`, modded-nanogpt): hidden weights of rank ≥ 2 to Muon; embeddings and the
//! output head ([`AUXILIARY`]) to AdamW with weight decay; gains and biases (rank < 2) to AdamW
//! without. Rules added with [`Grouping::rule`] come before these and so override them.
//!
//! # Patterns
//!
//! A pattern is matched against the whole parameter name; `*` matches any run of characters
//! (dots included), every other character itself: `*.attn.c_attn.weight`, `head.*`, `*bias`.

use tch::{nn, Tensor};

use super::group::{Group, Update};
use super::matrix::MatrixSpec;
use super::Optimizer;
use crate::error::{OptimError, Result};
use crate::{AdamWConfig, MuonConfig};

/// Name patterns of the parameters that are not hidden weights: token and position
/// embeddings and output heads, under the names GPT-2, nanoGPT, ViT and torchvision use.
pub const AUXILIARY: &[&str] = &[
    "*wte*",
    "*wpe*",
    "*embed*",
    "*cls_token*",
    "*lm_head*",
    "head.*",
    "*.head.*",
    "*classifier*",
];

/// Whether `name` matches the glob `pattern` (module docs).
pub fn matches(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    // Greedy matching with backtracking to the last `*`: linear in practice.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == n[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == b'*')
}

/// Which parameters a rule takes, and the group they go to.
#[derive(Clone, Debug)]
pub struct Rule {
    group: String,
    patterns: Vec<String>,
    except: Vec<String>,
    ranks: (usize, usize),
    update: Update,
    lr: f64,
    matrix: MatrixSpec,
    batch: bool,
    threads: Option<usize>,
}

impl Rule {
    /// Parameters of any name and rank into group `group`, stepped by `update` at peak rate `lr`.
    pub fn new(group: impl Into<String>, update: Update, lr: f64) -> Self {
        Self {
            group: group.into(),
            patterns: Vec::new(),
            except: Vec::new(),
            ranks: (0, usize::MAX),
            update,
            lr,
            matrix: MatrixSpec::matrix(),
            batch: true,
            threads: None,
        }
    }

    /// Muon at the config's `lr`.
    pub fn muon(group: impl Into<String>, config: MuonConfig) -> Self {
        Self::new(group, Update::Muon(config), config.lr)
    }

    /// AdamW at `lr`.
    pub fn adamw(group: impl Into<String>, config: AdamWConfig, lr: f64) -> Self {
        Self::new(group, Update::AdamW(config), lr)
    }

    /// Only parameters whose name matches one of `patterns` (module docs).
    pub fn names<S: Into<String>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.patterns = patterns.into_iter().map(Into::into).collect();
        self
    }

    /// No parameter whose name matches one of `patterns`.
    pub fn except<S: Into<String>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.except = patterns.into_iter().map(Into::into).collect();
        self
    }

    /// Only parameters of rank in `min..=max`.
    pub fn ranks(self, min: usize, max: usize) -> Self {
        Self {
            ranks: (min, max),
            ..self
        }
    }

    /// The matrix spec of the group ([`Group::with_matrix`]).
    pub fn matrix(self, matrix: MatrixSpec) -> Self {
        Self { matrix, ..self }
    }

    /// The peak rate multiplied by `factor`.
    pub fn lr_multiplier(self, factor: f64) -> Self {
        Self {
            lr: self.lr * factor,
            ..self
        }
    }

    /// Batching of same-shape blocks ([`Group::with_batch`]).
    pub fn batch(self, batch: bool) -> Self {
        Self { batch, ..self }
    }

    /// Worker threads of the group ([`Group::with_threads`]; libtorch's count by default).
    pub fn threads(self, threads: usize) -> Self {
        let threads = Some(threads.max(1));
        Self { threads, ..self }
    }

    /// Whether the rule takes parameter `name` of rank `rank`.
    pub fn takes(&self, name: &str, rank: usize) -> bool {
        (self.ranks.0..=self.ranks.1).contains(&rank)
            && (self.patterns.is_empty() || self.patterns.iter().any(|p| matches(p, name)))
            && !self.except.iter().any(|p| matches(p, name))
    }

    fn empty_group(&self) -> Group {
        let group = Group::new(self.group.clone(), self.update, self.lr)
            .with_matrix(self.matrix.clone())
            .with_batch(self.batch);
        match self.threads {
            Some(n) => group.with_threads(n),
            None => group,
        }
    }
}

/// Rules, tried in order (module docs).
#[derive(Clone, Debug, Default)]
pub struct Grouping {
    rules: Vec<Rule>,
    defaults: usize,
}

impl Grouping {
    /// No rules: every parameter must be placed by a rule added with [`Grouping::rule`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Muon on the hidden weights, AdamW on the rest (module docs): groups `adamw` (names in
    /// [`AUXILIARY`], any rank; `adamw`'s weight decay), `muon` (rank ≥ 2) and
    /// `adamw_no_decay` (rank < 2; no weight decay), AdamW at peak rate `adamw_lr`.
    pub fn muon_adamw(muon: MuonConfig, adamw: AdamWConfig, adamw_lr: f64) -> Self {
        let no_decay = AdamWConfig {
            weight_decay: 0.0,
            ..adamw
        };
        Self {
            rules: vec![
                Rule::adamw("adamw", adamw, adamw_lr).names(AUXILIARY.iter().copied()),
                Rule::muon("muon", muon).ranks(2, usize::MAX),
                Rule::adamw("adamw_no_decay", no_decay, adamw_lr).ranks(0, 1),
            ],
            defaults: 3,
        }
    }

    /// AdamW on everything: `decay` (rank ≥ 2 outside [`AUXILIARY`]) with `adamw`'s weight decay
    /// and `no_decay` (gains, biases, embeddings) without, both at peak rate `lr`.
    pub fn adamw(adamw: AdamWConfig, lr: f64) -> Self {
        let no_decay = AdamWConfig {
            weight_decay: 0.0,
            ..adamw
        };
        Self {
            rules: vec![
                Rule::adamw("no_decay", no_decay, lr).names(AUXILIARY.iter().copied()),
                Rule::adamw("decay", adamw, lr).ranks(2, usize::MAX),
                Rule::adamw("no_decay", no_decay, lr),
            ],
            defaults: 3,
        }
    }

    /// These rules with `rule` tried after the ones added before it and before the defaults.
    pub fn rule(mut self, rule: Rule) -> Self {
        let at = self.rules.len() - self.defaults;
        self.rules.insert(at, rule);
        self
    }

    /// The groups of `params` (sorted by name; those that do not require a gradient are left
    /// out). Groups come in the order of their first rule; rules that place nothing make no
    /// group. Two rules of one group name must agree on everything but their patterns and
    /// ranks.
    ///
    /// Errors ([`OptimError::Groups`]): a parameter no rule takes, listing every such name;
    /// two rules of one group name that disagree.
    pub fn assign(&self, params: impl IntoIterator<Item = (String, Tensor)>) -> Result<Vec<Group>> {
        let mut params: Vec<(String, Tensor)> = params
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let mut groups: Vec<(usize, Group)> = Vec::new();
        let mut unplaced = Vec::new();
        for (name, t) in params {
            let Some(r) = self.rules.iter().position(|r| r.takes(&name, t.dim())) else {
                unplaced.push(name);
                continue;
            };
            let rule = &self.rules[r];
            match groups.iter_mut().find(|(_, g)| g.name == rule.group) {
                Some((first, g)) => {
                    let other = &self.rules[*first];
                    if (
                        other.update,
                        other.lr,
                        &other.matrix,
                        other.batch,
                        other.threads,
                    ) != (rule.update, rule.lr, &rule.matrix, rule.batch, rule.threads)
                    {
                        return Err(OptimError::Groups {
                            reason: format!(
                                "two rules of group `{}` differ in update, lr or matrix",
                                rule.group
                            ),
                        });
                    }
                    g.names.push(name);
                    g.params.push(t);
                }
                None => groups.push((r, rule.empty_group().with_param(name, t))),
            }
        }
        if !unplaced.is_empty() {
            return Err(OptimError::Groups {
                reason: format!(
                    "no rule places {} parameter(s): `{}`",
                    unplaced.len(),
                    unplaced.join("`, `")
                ),
            });
        }
        groups.sort_by_key(|(r, _)| *r);
        Ok(groups.into_iter().map(|(_, g)| g).collect())
    }

    /// The optimizer over the trainable variables of `vs` ([`Grouping::assign`], then
    /// [`Optimizer::new`]).
    pub fn build(&self, vs: &nn::VarStore) -> Result<Optimizer> {
        Optimizer::new(self.assign(vs.variables())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_names() {
        for (p, n, yes) in [
            ("*.attn.c_attn.weight", "h.0.attn.c_attn.weight", true),
            ("*.attn.c_attn.weight", "h.0.attn.c_attn.bias", false),
            ("head.*", "head.weight", true),
            ("head.*", "heads.weight", false),
            ("*.head.*", "vit.head.bias", true),
            ("*wte*", "wte", true),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("", "", true),
            ("*", "", true),
        ] {
            assert_eq!(matches(p, n), yes, "{p} on {n}");
        }
    }
}
