//! "theory": the spectral-conditioning paper's theorems measured on random instances through
//! kappa-attention — (a) Theorem 3.4's bound against the exact κ(J), (b) κ of projections under
//! the SVD and λ·I_k corrections across weight scales, (c) attention entropy and saturation at
//! initialization as λ grows, (d) the exact κ(J) along λ sweeps.
//!
//! Every statement of the report section is computed from the run folders; where a claim of the
//! paper (or of our reading of it, docs/theory.md) fails, the section says so with the numbers.

use std::path::Path;

use anyhow::Result;
use indicatif::ProgressBar;
use kappa_attention::{
    theorem_3_4, AttentionOptions, IdentityShift, LambdaPolicy, ScoreScale, SelfAttention,
    SvdCorrection, Theorem34Instance, TokenRegime,
};
use kappa_linalg::{condition_number, singular_values, SvdDriver};
use ndarray::Array2;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::report::runs::{completed, records};
use crate::report::{opened, Figures, Section};
use crate::run::{Run, RunRecord, RunStatus};
use crate::scale::Scale;
use crate::Experiment;

mod report;

/// The experiment (registered as `theory`).
pub struct Theory;

/// What `theory` measures.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// (a) Random instances per regime (N ≤ D and N > D) per seed.
    pub bound_trials: usize,
    /// (a) Largest D drawn in the N ≤ D regime (the N > D regime uses D ≤ max_d / 2 + 1).
    pub bound_max_d: usize,
    /// (b, c) The projection shape [D, k] (ViT-B: 768 × 64).
    pub weight_shape: [usize; 2],
    /// (b) Standard deviations of the weight entries (ViT init: 0.02).
    pub weight_stds: Vec<f64>,
    /// (b, c) The λ of the tables.
    pub lambdas: Vec<f64>,
    /// (b) Log-spaced λ per decade for the curves, from 10⁻² to 10².
    pub curve_points_per_decade: usize,
    /// (b) Matrices per standard deviation per seed.
    pub weight_trials: usize,
    /// (c) Tokens N (ViT-B: 197).
    pub tokens: usize,
    /// (c) Standard deviation of the weights at initialization.
    pub init_std: f64,
    /// (d) Shapes [N, D, k] for the exact Jacobian.
    pub jacobian_shapes: Vec<[usize; 3]>,
    /// (d) Weight standard deviation.
    pub jacobian_std: f64,
    /// (d) Draws per (shape, λ, scaling) per seed.
    pub jacobian_trials: usize,
}

/// One line of `metrics.jsonl`. `None` in a κ field means +∞ (numerically rank-deficient).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// (a) One random instance of Theorem 3.4.
    Bound {
        /// `true` for N ≤ D.
        n_le_d: bool,
        /// Tokens.
        n: usize,
        /// Embedding dimension.
        d: usize,
        /// Head dimension.
        k: usize,
        /// Weight standard deviation.
        std: f64,
        /// Exact κ(J).
        kappa_j: Option<f64>,
        /// The bound's right-hand side.
        rhs: Option<f64>,
        /// Numerical rank of J.
        rank: usize,
        /// min(Nk, 3Dk − k²).
        rank_bound: usize,
        /// κ(J) ≤ rhs.
        holds: bool,
        /// The per-block steps [Q, K (κ⁺), V] of the argument.
        block_steps: [bool; 3],
        /// κ(J) ≤ κ(J_Q) + κ⁺(J_K) + κ(J_V).
        sum_step: bool,
        /// κ(P).
        kappa_p: Option<f64>,
        /// κ(J_V).
        kappa_jv: Option<f64>,
    },
    /// (b) κ of one projection under λ·I_k.
    Shift {
        /// Weight standard deviation.
        std: f64,
        /// Which draw.
        trial: usize,
        /// λ.
        lambda: f64,
        /// κ(W + λ I_k).
        kappa: Option<f64>,
    },
    /// (b) One projection: κ(W), the SVD correction and the two λ policies.
    Projection {
        /// Weight standard deviation.
        std: f64,
        /// Which draw.
        trial: usize,
        /// σ_max(W).
        sigma_max: f64,
        /// κ(W).
        kappa_w: Option<f64>,
        /// κ(W + C_svd).
        kappa_svd: Option<f64>,
        /// λ of `LambdaPolicy::SufficientDecrease { margin: 0.01 }`.
        lambda_decrease: Option<f64>,
        /// κ at that λ.
        kappa_decrease: Option<f64>,
        /// λ of `LambdaPolicy::TargetKappa(1.5)`.
        lambda_target: f64,
        /// κ at that λ.
        kappa_target: Option<f64>,
    },
    /// (c) Attention statistics at initialization.
    Entropy {
        /// Scores divided by √k.
        scaled: bool,
        /// λ.
        lambda: f64,
        /// Mean row entropy (nats).
        mean_entropy: f64,
        /// ln N.
        uniform_entropy: f64,
        /// Fraction of rows with max probability > 0.99.
        saturated_fraction: f64,
        /// Mean of P[i, i].
        mean_diagonal: f64,
        /// Largest score.
        max_logit: f64,
    },
    /// (d) The exact κ(J) of one corrected head.
    Jacobian {
        /// Tokens.
        n: usize,
        /// Embedding dimension.
        d: usize,
        /// Head dimension.
        k: usize,
        /// Scores divided by √k.
        scaled: bool,
        /// λ.
        lambda: f64,
        /// Which draw.
        trial: usize,
        /// κ(J) under the numpy rank rule.
        kappa_j: Option<f64>,
        /// σ₁/σ_min of J without a rank threshold.
        kappa_raw: Option<f64>,
        /// Numerical rank of J.
        rank: usize,
        /// Theorem 3.4's bound for the corrected weights.
        rhs: Option<f64>,
        /// Mean diagonal attention.
        mean_diagonal: f64,
        /// Mean κ of the three corrected projections.
        kappa_w: Option<f64>,
    },
}

fn fin(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

fn inf(x: Option<f64>) -> f64 {
    x.unwrap_or(f64::INFINITY)
}

fn gaussian(rng: &mut ChaCha8Rng, rows: usize, cols: usize, std: f64) -> Array2<f64> {
    Array2::from_shape_simple_fn((rows, cols), || {
        let z: f64 = StandardNormal.sample(rng);
        std * z
    })
}

/// Rows standardized to mean 0 and variance 1 (LayerNorm without affine parameters).
fn layer_norm(mut x: Array2<f64>) -> Array2<f64> {
    let d = x.ncols() as f64;
    for mut row in x.rows_mut() {
        let m = row.sum() / d;
        row.mapv_inplace(|v| v - m);
        let sd = (row.mapv(|v| v * v).sum() / d).sqrt().max(1e-12);
        row.mapv_inplace(|v| v / sd);
    }
    x
}

fn stream(seed: u64, part: u64, index: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream((part << 48) | index);
    rng
}

fn curve_lambdas(per_decade: usize) -> Vec<f64> {
    let n = 4 * per_decade.max(1);
    (0..=n)
        .map(|i| 10f64.powf(-2.0 + 4.0 * i as f64 / n as f64))
        .collect()
}

fn opts(scaled: bool) -> AttentionOptions {
    AttentionOptions {
        scale: if scaled {
            ScoreScale::InvSqrtK
        } else {
            ScoreScale::One
        },
        causal: false,
    }
}

impl Experiment for Theory {
    type Config = Config;

    fn name(&self) -> &'static str {
        "theory"
    }

    fn claim(&self) -> &'static str {
        "Spectral conditioning (Saratchandran & Lucey): κ of the attention weight-Jacobian is \
         bounded by κ(X)³κ(Λ)κ(W_V)(κ(W_Q)+κ(W_K)) + κ(X)κ(P) (Thm 3.4), the SVD correction gives \
         κ(W+C) < 2 (Thm 3.5), and adding λ·I_k (λ = 10) lowers κ(W) (Thm 3.8)."
    }

    fn default_seeds(&self, scale: Scale) -> u32 {
        match scale {
            Scale::Smoke => 1,
            Scale::Cpu => 2,
            Scale::Long | Scale::Gpu | Scale::Paper => 4,
        }
    }

    fn validate(&self, c: &Config) -> Result<()> {
        let [d, k] = c.weight_shape;
        anyhow::ensure!(
            1 <= k && k <= d,
            "weight_shape: need [D, k] with 1 ≤ k ≤ D, found [{d}, {k}]"
        );
        for (i, &[n, d, k]) in c.jacobian_shapes.iter().enumerate() {
            anyhow::ensure!(
                n >= 1 && 1 <= k && k <= d,
                "jacobian_shapes.{i}: need [N, D, k] with N ≥ 1 and 1 ≤ k ≤ D, found [{n}, {d}, {k}]"
            );
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        anyhow::ensure!(
            !c.weight_stds.is_empty() && c.weight_stds.iter().all(|&s| positive(s)),
            "weight_stds: need at least one, each finite and > 0, found {:?}",
            c.weight_stds
        );
        anyhow::ensure!(
            !c.lambdas.is_empty() && c.lambdas.iter().all(|&l| l.is_finite() && l >= 0.0),
            "lambdas: need at least one, each finite and ≥ 0, found {:?}",
            c.lambdas
        );
        for (key, std) in [("init_std", c.init_std), ("jacobian_std", c.jacobian_std)] {
            anyhow::ensure!(positive(std), "{key}: must be finite and > 0, found {std}");
        }
        anyhow::ensure!(c.tokens >= 1, "tokens: must be ≥ 1");
        Ok(())
    }

    fn run(&self, config: &Config, run: &mut Run) -> Result<RunStatus> {
        let jac_units =
            config.jacobian_shapes.len() * config.jacobian_trials * 2 * config.lambdas.len();
        let total = 2 * config.bound_trials
            + config.weight_stds.len() * config.weight_trials
            + 2 * config.lambdas.len()
            + jac_units;
        let bar = run.progress(total as u64, "instances");
        run_bounds(config, run, &bar)?;
        run_projections(config, run, &bar)?;
        run_entropy(config, run, &bar)?;
        run_jacobians(config, run, &bar)?;
        bar.finish_and_clear();
        Ok(RunStatus::Completed)
    }

    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        let mut section = opened(
            "theory: the spectral-conditioning theorems, measured",
            Experiment::claim(self),
            runs,
        );
        let done = completed(runs);
        let records: Vec<Record> = records(&done)?;
        let Some(config) = done.first().map(|r| r.config::<Config>()).transpose()? else {
            section.paragraph("No completed run: nothing to report.");
            return Ok(section);
        };
        let figures = Figures::new(out_dir, report_dir);
        report::write(&mut section, &records, &config, &figures)?;
        Ok(section)
    }
}

/// (a) Theorem 3.4 on random instances, in both regimes.
fn run_bounds(config: &Config, run: &mut Run, bar: &ProgressBar) -> Result<()> {
    let seed = run.context().seed;
    for (part, regime) in [(1u64, TokenRegime::AtMostD), (2, TokenRegime::AboveD)] {
        let n_le_d = regime == TokenRegime::AtMostD;
        bar.set_message(if n_le_d { "(a) N ≤ D" } else { "(a) N > D" });
        for t in 0..config.bound_trials {
            let mut rng = stream(seed, part, t as u64);
            let inst = Theorem34Instance::sample(&mut rng, regime, config.bound_max_d)?;
            let b = theorem_3_4(&inst.forward()?)?;
            run.log(&Record::Bound {
                n_le_d,
                n: inst.n,
                d: inst.d,
                k: inst.k,
                std: inst.std,
                kappa_j: fin(b.jacobian.full.kappa),
                rhs: fin(b.rhs),
                rank: b.jacobian.full.rank,
                rank_bound: b.jacobian.full_rank_bound,
                holds: b.holds(),
                block_steps: b.block_steps_hold(),
                sum_step: b.sum_step_holds(),
                kappa_p: fin(b.kappa_p),
                kappa_jv: fin(b.jacobian.v.kappa),
            })?;
            bar.inc(1);
        }
    }
    Ok(())
}

/// (b) The λ of the shift records: the config's and the curve's, in order.
fn sweep_lambdas(config: &Config) -> Vec<f64> {
    let mut v = config.lambdas.clone();
    v.extend(curve_lambdas(config.curve_points_per_decade));
    v.sort_by(f64::total_cmp);
    v.dedup();
    v
}

/// (b) κ of random projections under the corrections, per weight std.
fn run_projections(config: &Config, run: &mut Run, bar: &ProgressBar) -> Result<()> {
    let seed = run.context().seed;
    let sweep = sweep_lambdas(config);
    let [d, k] = config.weight_shape;
    bar.set_message("(b) projections");
    for (si, &std) in config.weight_stds.iter().enumerate() {
        for trial in 0..config.weight_trials {
            let mut rng = stream(seed, 3, (si * 10_000 + trial) as u64);
            let w = gaussian(&mut rng, d, k, std);
            log_projection(&w, std, trial, &sweep, run)?;
            bar.inc(1);
        }
    }
    Ok(())
}

/// (b) One projection W: κ(W + λ·I_k) along `sweep`, then κ(W), the SVD correction and the two
/// λ policies.
fn log_projection(
    w: &Array2<f64>,
    std: f64,
    trial: usize,
    sweep: &[f64],
    run: &mut Run,
) -> Result<()> {
    let sigma_max = singular_values(w.view(), SvdDriver::default())?[0];
    let kappa_of = |l: f64| -> Result<Option<f64>> {
        let m = IdentityShift::new(l)?.apply(w.view())?;
        Ok(fin(condition_number(m.view())?))
    };
    for &lambda in sweep {
        run.log(&Record::Shift {
            std,
            trial,
            lambda,
            kappa: kappa_of(lambda)?,
        })?;
    }
    let svd = SvdCorrection::new(w.view())?;
    let kappa_svd = fin(condition_number(svd.apply(w.view())?.view())?);
    let lambda_decrease = LambdaPolicy::SufficientDecrease { margin: 0.01 }
        .choose(w.view())
        .ok();
    let kappa_decrease = match lambda_decrease {
        Some(l) => kappa_of(l)?,
        None => None,
    };
    let lambda_target = LambdaPolicy::TargetKappa(1.5).choose(w.view())?;
    run.log(&Record::Projection {
        std,
        trial,
        sigma_max,
        kappa_w: fin(condition_number(w.view())?),
        kappa_svd,
        lambda_decrease,
        kappa_decrease,
        lambda_target,
        kappa_target: kappa_of(lambda_target)?,
    })?;
    Ok(())
}

/// A head with weights `ws` (Q, K, V) and the same λ·I_k on each.
fn corrected_head(ws: &[Array2<f64>], scaled: bool, lambda: f64) -> Result<SelfAttention<f64>> {
    Ok(
        SelfAttention::new(ws[0].clone(), ws[1].clone(), ws[2].clone(), opts(scaled))?
            .with_identity_shift(IdentityShift::new(lambda)?)?,
    )
}

/// (c) Entropy and saturation at initialization, LayerNorm-scaled tokens.
fn run_entropy(config: &Config, run: &mut Run, bar: &ProgressBar) -> Result<()> {
    let [d, k] = config.weight_shape;
    bar.set_message("(c) entropy");
    let mut rng = stream(run.context().seed, 4, 0);
    let x = layer_norm(gaussian(&mut rng, config.tokens, d, 1.0));
    let ws: Vec<Array2<f64>> = (0..3)
        .map(|_| gaussian(&mut rng, d, k, config.init_std))
        .collect();
    for scaled in [false, true] {
        for &lambda in &config.lambdas {
            let head = corrected_head(&ws, scaled, lambda)?;
            let diag = head.forward(x.view())?.diagnostics()?;
            run.log(&Record::Entropy {
                scaled,
                lambda,
                mean_entropy: diag.mean_entropy,
                uniform_entropy: diag.uniform_entropy,
                saturated_fraction: diag.saturated_fraction,
                mean_diagonal: diag.mean_diagonal,
                max_logit: diag.max_logit,
            })?;
            bar.inc(1);
        }
    }
    Ok(())
}

/// (d) The exact κ(J) along λ, per shape, draw and scaling.
fn run_jacobians(config: &Config, run: &mut Run, bar: &ProgressBar) -> Result<()> {
    let seed = run.context().seed;
    for (shi, &[n, d, k]) in config.jacobian_shapes.iter().enumerate() {
        bar.set_message(format!("(d) κ(J) N={n} D={d} k={k}"));
        for trial in 0..config.jacobian_trials {
            let mut rng = stream(seed, 5, (shi * 100_000 + trial) as u64);
            let x = gaussian(&mut rng, n, d, 1.0);
            let ws: Vec<Array2<f64>> = (0..3)
                .map(|_| gaussian(&mut rng, d, k, config.jacobian_std))
                .collect();
            for scaled in [false, true] {
                for &lambda in &config.lambdas {
                    let head = corrected_head(&ws, scaled, lambda)?;
                    let record = jacobian_record(&head, &x, [n, d, k], trial, (lambda, scaled))?;
                    run.log(&record)?;
                    bar.inc(1);
                }
            }
        }
    }
    Ok(())
}

/// (d) The exact κ(J) of one corrected head on tokens `x`, with Theorem 3.4's bound.
fn jacobian_record(
    head: &SelfAttention<f64>,
    x: &Array2<f64>,
    [n, d, k]: [usize; 3],
    trial: usize,
    (lambda, scaled): (f64, bool),
) -> Result<Record> {
    let fwd = head.forward(x.view())?;
    let b = theorem_3_4(&fwd)?;
    let j = &b.jacobian.full;
    let raw = j.sigma_max / j.sigma_min;
    Ok(Record::Jacobian {
        n,
        d,
        k,
        scaled,
        lambda,
        trial,
        kappa_j: fin(j.kappa),
        kappa_raw: fin(raw),
        rank: j.rank,
        rhs: fin(b.rhs),
        mean_diagonal: fwd.diagnostics()?.mean_diagonal,
        kappa_w: fin((b.kappa_wq + b.kappa_wk + b.kappa_wv) / 3.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curve_has_four_decades_of_lambdas() {
        assert_eq!(curve_lambdas(1).len(), 5);
    }

    #[test]
    fn layer_norm_standardizes_rows() {
        let x = layer_norm(Array2::from_shape_fn((3, 8), |(i, j)| {
            ((i + 1) * j * j) as f64 + 1.0
        }));
        for row in x.rows() {
            assert!(row.sum().abs() < 1e-12);
            assert!((row.mapv(|v| v * v).sum() / 8.0 - 1.0).abs() < 1e-12);
        }
    }
}
