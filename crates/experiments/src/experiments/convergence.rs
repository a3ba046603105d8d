//! "convergence": the preconditioned GD of *Training Dynamics of Softmax Self-Attention* against
//! its baselines and ablations, its sample-size law, its rate against conditioning, and its
//! iteration count, all through `kappa_optim::convergence`.
//!
//! Four parts (issue 6):
//! 1. Curves: population excess E_t = ½‖(AΣBᵀ − M)Σ^{1/2}‖² against t for the algorithm and every
//!    baseline/ablation, over a grid of d, k ∈ {1, d}, κ(Σ), σ. The gradient oracle is the
//!    population loss (n = ∞); the data enter through the spectral initialization and the
//!    preconditioner, both estimated from `n_init` samples (that is where σ matters).
//! 2. Sample size: the algorithm on the finite-context empirical loss L̂_n, n up to 16,000
//!    (chunked queries), with both error definitions (the paper does not say which it bounds): E of the limit predictor and the
//!    finite-context excess of the layer on fresh test queries attending over the training set.
//!    Log-log slopes with 95% intervals, compared with 1/n and with n⁻² log⁶ n.
//! 3. μ against κ(T) and κ(Σ), with and without the preconditioner (population oracle).
//! 4. Iterations to E ≤ 1e-8 (from part 1's runs): the algorithm against the best baseline, whose
//!    budget is `baseline_factor` times the algorithm's.
//!
//! T12 (random-init GD "stalls") is recorded as an observation from part 1.

use std::path::Path;

use anyhow::Result;
use kappa_optim::convergence::{
    geometric_rate, random_init, spectral_init, ContextMode, CovarianceSpec, EmpiricalProblem,
    ModelSpec, Moments, Objective, Probe, Settings, StepRecord, TargetSpec, Trainer, Truth,
};
use kappa_optim::OptimError;
use ndarray::Array2;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::plot::{LinePlot, Mark};
use crate::report::{runs_table, Section};
use crate::run::{Run, RunRecord, RunStatus};
use crate::scale::Scale;
use crate::stats::mean_std;
use crate::Experiment;

/// A sweep draw: (case, n, E init, E final, finite init, finite final).
type SweepRow = (usize, usize, f64, f64, f64, f64);

/// A labelled accessor of a sweep draw.
type Quantity = (&'static str, fn(&SweepRow) -> f64);

/// A method to run: label, initial (A, B), settings, and whether it is a baseline.
type MethodSpec<'a> = (String, &'a Array2<f64>, &'a Array2<f64>, Settings, bool);

/// The experiment (registered as `convergence`).
pub struct Convergence;

/// Part 1 and 4: the grid of curves.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurvesConfig {
    /// Covariate dimensions d.
    pub dims: Vec<usize>,
    /// Output dimensions: `false` is k = 1, `true` is k = d.
    pub k_equals_d: Vec<bool>,
    /// κ(Σ) values.
    pub kappa_sigma: Vec<f64>,
    /// Label noise σ values.
    pub noise: Vec<f64>,
    /// κ(T) of the target.
    pub kappa_t: f64,
    /// Σ of T's singular values (the softmax scale).
    pub nuclear_norm: f64,
    /// Samples for the moments (initialization and preconditioner).
    pub n_init: usize,
    /// Steps of the algorithm and its ablations.
    pub algorithm_steps: usize,
    /// Baselines run up to `baseline_factor × algorithm_steps` steps.
    pub baseline_factor: usize,
    /// Adam learning rates tried (each is a baseline).
    pub adam_lrs: Vec<f64>,
    /// Entry scale of the small random initialization.
    pub random_init_scale: f64,
    /// The target excess for the iteration count (part 4).
    pub target_excess: f64,
}

/// One model of the sample-size sweep.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepCase {
    /// d.
    pub d: usize,
    /// k.
    pub k: usize,
    /// Σ of T's singular values.
    pub nuclear_norm: f64,
}

/// Part 2: the sample-size sweep.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepConfig {
    /// The models.
    pub cases: Vec<SweepCase>,
    /// Training-set sizes.
    pub n: Vec<usize>,
    /// Draws per (case, n) per seed.
    pub reps: usize,
    /// GD steps on L̂_n.
    pub steps: usize,
    /// Keys and queries of L̂_n.
    pub mode: ContextMode,
    /// Fresh test queries for the finite-context excess.
    pub test_queries: usize,
    /// κ(Σ).
    pub kappa_sigma: f64,
    /// κ(T).
    pub kappa_t: f64,
    /// σ.
    pub noise: f64,
}

/// Part 3: μ against conditioning.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatesConfig {
    /// d = k.
    pub d: usize,
    /// κ(T) values.
    pub kappa_t: Vec<f64>,
    /// κ(Σ) values.
    pub kappa_sigma: Vec<f64>,
    /// Samples for the moments.
    pub n_init: usize,
    /// Steps with the preconditioner.
    pub steps: usize,
    /// Steps without it (it is much slower).
    pub plain_steps: usize,
    /// Σ of T's singular values.
    pub nuclear_norm: f64,
}

/// Everything `convergence` reads from `config.toml`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Parts 1 and 4.
    pub curves: CurvesConfig,
    /// Part 2.
    pub sweep: SweepConfig,
    /// Part 3.
    pub rates: RatesConfig,
}

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// One method on one grid point (parts 1, 4).
    Curve {
        /// d.
        d: usize,
        /// k.
        k: usize,
        /// κ(Σ).
        kappa_sigma: f64,
        /// σ.
        noise: f64,
        /// The method's label.
        method: String,
        /// Steps allowed.
        budget: usize,
        /// First step with E ≤ target (None: not within the budget).
        reached: Option<usize>,
        /// E at the last step run.
        final_excess: f64,
        /// Fitted μ of E_t (tail window), with its R².
        mu: Option<f64>,
        /// R² of the μ fit.
        mu_r2: Option<f64>,
        /// `completed` or `diverged at step N`.
        status: String,
        /// (t, E_t), subsampled on a geometric grid.
        trace: Vec<(usize, f64)>,
    },
    /// One draw of the sample-size sweep (part 2).
    Sweep {
        /// Index into the config's cases.
        case: usize,
        /// n.
        n: usize,
        /// Which draw.
        rep: usize,
        /// E at the spectral initialization.
        init_excess: f64,
        /// E after the GD steps on L̂_n.
        final_excess: f64,
        /// Finite-context excess at the initialization.
        init_finite: f64,
        /// Finite-context excess after the steps.
        final_finite: f64,
        /// Largest softmax weight at the end.
        max_weight: f64,
        /// `completed` or the divergence.
        status: String,
    },
    /// A per-step record of the algorithm on L̂_n (part 2, first draw of each n).
    Step {
        /// Index into the config's cases.
        case: usize,
        /// n.
        n: usize,
        /// The library's record.
        record: StepRecord,
    },
    /// A fitted rate (part 3).
    Rate {
        /// κ(T).
        kappa_t: f64,
        /// κ(Σ).
        kappa_sigma: f64,
        /// With the Σ̂ preconditioner.
        preconditioner: bool,
        /// μ (None if the fit failed).
        mu: Option<f64>,
        /// R² of the fit.
        r2: Option<f64>,
    },
}

const METHODS_ALG: [&str; 4] = [
    "algorithm",
    "no-preconditioner",
    "no-regularizer",
    "random-init",
];

fn model_spec(
    d: usize,
    k: usize,
    kappa_sigma: f64,
    kappa_t: f64,
    nuc: f64,
    noise: f64,
) -> ModelSpec {
    ModelSpec {
        d,
        k,
        covariance: CovarianceSpec {
            kappa: kappa_sigma,
            random_basis: true,
        },
        target: TargetSpec {
            nuclear_norm: nuc,
            kappa: kappa_t,
        },
        noise_std: noise,
    }
}

fn stream_rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// Geometric subsampling: every t ≤ 50, then t growing by ≥ 5%.
fn keep_step(t: usize, last_kept: usize) -> bool {
    t <= 50 || t as f64 >= last_kept as f64 * 1.05
}

/// μ from an E trace: the tail window floor < E < 1e-2·E₀ if it has ≥ 10 points, else the
/// second half of the trace.
fn fit_mu(trace: &[(usize, f64)]) -> Option<kappa_optim::convergence::RateFit> {
    let e0 = trace.first()?.1;
    let floor = (1e-13 * e0).max(1e-28);
    let tail: Vec<(f64, f64)> = trace
        .iter()
        .filter(|p| p.1 > floor && p.1 < 1e-2 * e0)
        .map(|&(t, e)| (t as f64, e))
        .collect();
    if tail.len() >= 10 {
        return geometric_rate(&tail);
    }
    let last = trace.last()?.0;
    let half: Vec<(f64, f64)> = trace
        .iter()
        .filter(|p| p.0 * 2 >= last && p.1 > floor)
        .map(|&(t, e)| (t as f64, e))
        .collect();
    geometric_rate(&half)
}

struct Outcome {
    reached: Option<usize>,
    final_excess: f64,
    trace: Vec<(usize, f64)>,
    full: Vec<(usize, f64)>,
    status: String,
}

/// Runs a trainer for up to `budget` steps; stops early at the target when `stop_at_target`.
fn drive(
    trainer: &mut Trainer,
    budget: usize,
    target: f64,
    stop_at_target: bool,
) -> Result<Outcome> {
    let mut trace = Vec::new();
    let mut full = Vec::new();
    let mut reached = None;
    let mut last_kept = 0;
    let mut status = "completed".to_string();
    let mut final_excess = f64::NAN;
    for t in 0..=budget {
        let rec = if t == budget {
            trainer.record()
        } else {
            trainer.step()
        };
        let rec = match rec {
            Ok(r) => r,
            Err(OptimError::Diverged { step, .. }) => {
                status = format!("diverged at step {step}");
                break;
            }
            Err(e) => return Err(e.into()),
        };
        let e = rec.excess.unwrap_or(f64::NAN);
        final_excess = e;
        if keep_step(t, last_kept) {
            trace.push((t, e));
            last_kept = t;
        }
        if t <= 5000 {
            full.push((t, e));
        }
        if reached.is_none() && e <= target {
            reached = Some(t);
            if stop_at_target {
                if trace.last().map(|p| p.0) != Some(t) {
                    trace.push((t, e));
                }
                break;
            }
        }
    }
    Ok(Outcome {
        reached,
        final_excess,
        trace,
        full,
        status,
    })
}

impl Convergence {
    fn run_curves(
        &self,
        c: &CurvesConfig,
        run: &mut Run,
        bar: &indicatif::ProgressBar,
    ) -> Result<()> {
        let seed = run.context().seed;
        let mut stream = 0u64;
        for &d in &c.dims {
            for &kd in &c.k_equals_d {
                let k = if kd { d } else { 1 };
                for &ks in &c.kappa_sigma {
                    for &noise in &c.noise {
                        stream += 1;
                        bar.set_message(format!("curves d={d} k={k} κΣ={ks} σ={noise}"));
                        let mut rng = stream_rng(seed, stream);
                        let model = model_spec(d, k, ks, c.kappa_t, c.nuclear_norm, noise)
                            .build(&mut rng)?;
                        let moments = Moments::estimate(&model.sample(c.n_init, &mut rng)?)?;
                        let (a0, b0) = spectral_init(&moments)?;
                        let (ar, br) = random_init(k, d, c.random_init_scale, &mut rng)?;
                        let truth = Truth {
                            population: model.population().clone(),
                            probe: None,
                        };
                        let objective = Objective::Population(model.population().clone());
                        let mut methods: Vec<MethodSpec<'_>> = vec![
                            ("algorithm".into(), &a0, &b0, Settings::algorithm(), false),
                            (
                                "no-preconditioner".into(),
                                &a0,
                                &b0,
                                Settings {
                                    preconditioner: false,
                                    ..Settings::algorithm()
                                },
                                false,
                            ),
                            (
                                "no-regularizer".into(),
                                &a0,
                                &b0,
                                Settings {
                                    lambda: 0.0,
                                    ..Settings::algorithm()
                                },
                                false,
                            ),
                            ("random-init".into(), &ar, &br, Settings::algorithm(), false),
                            ("gd-spectral".into(), &a0, &b0, Settings::plain_gd(), true),
                            ("gd-random".into(), &ar, &br, Settings::plain_gd(), true),
                        ];
                        for &lr in &c.adam_lrs {
                            methods.push((
                                format!("adam-random lr={lr}"),
                                &ar,
                                &br,
                                Settings::adam(lr),
                                true,
                            ));
                        }
                        for (method, a, b, settings, baseline) in methods {
                            let budget = if baseline {
                                c.algorithm_steps * c.baseline_factor
                            } else {
                                c.algorithm_steps
                            };
                            let mut trainer = Trainer::new(
                                objective.clone(),
                                &moments,
                                a.clone(),
                                b.clone(),
                                settings,
                            )?
                            .with_truth(truth.clone());
                            let out = drive(&mut trainer, budget, c.target_excess, baseline)?;
                            let fit = if baseline { None } else { fit_mu(&out.full) };
                            run.log(&Record::Curve {
                                d,
                                k,
                                kappa_sigma: ks,
                                noise,
                                method,
                                budget,
                                reached: out.reached,
                                final_excess: out.final_excess,
                                mu: fit.map(|f| f.mu),
                                mu_r2: fit.map(|f| f.r_squared),
                                status: out.status,
                                trace: out.trace,
                            })?;
                        }
                        bar.inc(1);
                    }
                }
            }
        }
        Ok(())
    }

    fn run_sweep(
        &self,
        c: &SweepConfig,
        run: &mut Run,
        bar: &indicatif::ProgressBar,
    ) -> Result<()> {
        let seed = run.context().seed;
        for (ci, case) in c.cases.iter().enumerate() {
            for (ni, &n) in c.n.iter().enumerate() {
                for rep in 0..c.reps {
                    bar.set_message(format!("sweep d={} k={} n={n}", case.d, case.k));
                    let mut rng =
                        stream_rng(seed, 1_000_000 + (ci * 10_000 + ni * 100 + rep) as u64);
                    // The same model for every n and rep of a case (per seed).
                    let mut model_rng = stream_rng(seed, 2_000_000 + ci as u64);
                    let model = model_spec(
                        case.d,
                        case.k,
                        c.kappa_sigma,
                        c.kappa_t,
                        case.nuclear_norm,
                        c.noise,
                    )
                    .build(&mut model_rng)?;
                    let sample = model.sample(n, &mut rng)?;
                    let test = model.sample_covariates(c.test_queries, &mut rng)?;
                    let moments = Moments::estimate(&sample)?;
                    let (a0, b0) = spectral_init(&moments)?;
                    let truth = Truth {
                        population: model.population().clone(),
                        probe: Some(Probe {
                            context: sample.x().to_owned(),
                            queries: test,
                            every: c.steps.max(1),
                        }),
                    };
                    let objective = Objective::Empirical(EmpiricalProblem::new(&sample, c.mode)?);
                    let mut trainer =
                        Trainer::new(objective, &moments, a0, b0, Settings::algorithm())?
                            .with_truth(truth);
                    let mut records = Vec::new();
                    let mut status = "completed".to_string();
                    for t in 0..=c.steps {
                        let r = if t == c.steps {
                            trainer.record()
                        } else {
                            trainer.step()
                        };
                        match r {
                            Ok(r) => records.push(r),
                            Err(OptimError::Diverged { step, .. }) => {
                                status = format!("diverged at step {step}");
                                break;
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                    if records.is_empty() {
                        continue;
                    }
                    let (first, last) = (&records[0], &records[records.len() - 1]);
                    let last_finite = records
                        .iter()
                        .rev()
                        .find_map(|r| r.finite_excess)
                        .unwrap_or(f64::NAN);
                    run.log(&Record::Sweep {
                        case: ci,
                        n,
                        rep,
                        init_excess: first.excess.unwrap_or(f64::NAN),
                        final_excess: last.excess.unwrap_or(f64::NAN),
                        init_finite: first.finite_excess.unwrap_or(f64::NAN),
                        final_finite: last_finite,
                        max_weight: last.max_weight.unwrap_or(f64::NAN),
                        status,
                    })?;
                    if rep == 0 {
                        for r in records {
                            run.log(&Record::Step {
                                case: ci,
                                n,
                                record: r,
                            })?;
                        }
                    }
                    bar.inc(1);
                }
            }
        }
        Ok(())
    }

    fn run_rates(
        &self,
        c: &RatesConfig,
        run: &mut Run,
        bar: &indicatif::ProgressBar,
    ) -> Result<()> {
        let seed = run.context().seed;
        for (ti, &kt) in c.kappa_t.iter().enumerate() {
            for &ks in &c.kappa_sigma {
                bar.set_message(format!("rates κT={kt} κΣ={ks}"));
                // The same whitened draws for every κ(Σ) (the stream depends on κ(T) only).
                let mut rng = stream_rng(seed, 3_000_000 + ti as u64);
                let model = model_spec(c.d, c.d, ks, kt, c.nuclear_norm, 0.0).build(&mut rng)?;
                let moments = Moments::estimate(&model.sample(c.n_init, &mut rng)?)?;
                let (a0, b0) = spectral_init(&moments)?;
                for pre in [true, false] {
                    let settings = Settings {
                        preconditioner: pre,
                        ..Settings::algorithm()
                    };
                    let steps = if pre { c.steps } else { c.plain_steps };
                    let mut trainer = Trainer::new(
                        Objective::Population(model.population().clone()),
                        &moments,
                        a0.clone(),
                        b0.clone(),
                        settings,
                    )?
                    .with_truth(Truth {
                        population: model.population().clone(),
                        probe: None,
                    });
                    let out = drive(&mut trainer, steps, 0.0, false)?;
                    let fit = fit_mu(&out.full);
                    run.log(&Record::Rate {
                        kappa_t: kt,
                        kappa_sigma: ks,
                        preconditioner: pre,
                        mu: fit.map(|f| f.mu),
                        r2: fit.map(|f| f.r_squared),
                    })?;
                }
                bar.inc(1);
            }
        }
        Ok(())
    }
}

impl Experiment for Convergence {
    type Config = Config;

    fn name(&self) -> &'static str {
        "convergence"
    }

    fn claim(&self) -> &'static str {
        "Σ̂-preconditioned GD from the balanced spectral initialization converges geometrically, \
         at a rate independent of κ(Σ), to an excess risk that falls like 1/n (workshop abstract; \
         the seed summary says n⁻² log⁶ n), in far fewer iterations than plain GD or Adam."
    }

    fn default_seeds(&self, scale: Scale) -> u32 {
        match scale {
            Scale::Smoke | Scale::Cpu => 2,
            Scale::Paper => 4,
        }
    }

    fn validate(&self, c: &Config) -> Result<()> {
        let (curves, sweep, rates) = (&c.curves, &c.sweep, &c.rates);
        let kappas = |v: &[f64]| !v.is_empty() && v.iter().all(|&k| k.is_finite() && k >= 1.0);
        anyhow::ensure!(
            !curves.dims.is_empty() && curves.dims.iter().all(|&d| d >= 1),
            "curves.dims: need at least one d ≥ 1, found {:?}",
            curves.dims
        );
        anyhow::ensure!(
            !curves.k_equals_d.is_empty(),
            "curves.k_equals_d: need at least one"
        );
        anyhow::ensure!(
            kappas(&curves.kappa_sigma),
            "curves.kappa_sigma: need at least one κ ≥ 1, found {:?}",
            curves.kappa_sigma
        );
        anyhow::ensure!(
            !curves.noise.is_empty() && curves.noise.iter().all(|&s| s.is_finite() && s >= 0.0),
            "curves.noise: need at least one σ ≥ 0, found {:?}",
            curves.noise
        );
        anyhow::ensure!(
            curves.algorithm_steps >= 1 && curves.baseline_factor >= 1,
            "curves.algorithm_steps and curves.baseline_factor: must be ≥ 1"
        );
        for (i, case) in sweep.cases.iter().enumerate() {
            anyhow::ensure!(
                case.d >= 1 && case.k >= 1,
                "sweep.cases.{i}: need d ≥ 1 and k ≥ 1"
            );
        }
        anyhow::ensure!(
            !sweep.n.is_empty() && sweep.reps >= 1 && sweep.steps >= 1,
            "sweep: need at least one n, reps ≥ 1 and steps ≥ 1"
        );
        anyhow::ensure!(
            rates.d >= 1 && kappas(&rates.kappa_t) && kappas(&rates.kappa_sigma),
            "rates: need d ≥ 1 and at least one κ ≥ 1 in kappa_t and in kappa_sigma"
        );
        Ok(())
    }

    fn run(&self, config: &Config, run: &mut Run) -> Result<RunStatus> {
        let c = &config.curves;
        let curves = c.dims.len() * c.k_equals_d.len() * c.kappa_sigma.len() * c.noise.len();
        let sweeps = config.sweep.cases.len() * config.sweep.n.len() * config.sweep.reps;
        let rates = config.rates.kappa_t.len() * config.rates.kappa_sigma.len();
        let bar = run.progress((curves + sweeps + rates) as u64, "cases");
        self.run_curves(c, run, &bar)?;
        self.run_rates(&config.rates, run, &bar)?;
        self.run_sweep(&config.sweep, run, &bar)?;
        bar.finish_and_clear();
        Ok(RunStatus::Completed)
    }

    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        report(self, runs, out_dir, report_dir)
    }
}

/// Two-sided 97.5% quantile of Student's t with `df` degrees of freedom.
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df - 1],
        _ => 1.96 + 2.4 / df as f64,
    }
}

/// Least-squares line y = a + s·x with the slope's 95% interval half-width.
struct Line {
    intercept: f64,
    slope: f64,
    half_width: f64,
}

fn fit_line(points: &[(f64, f64)]) -> Option<Line> {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    let m = pts.len();
    if m < 3 {
        return None;
    }
    let xm = pts.iter().map(|p| p.0).sum::<f64>() / m as f64;
    let ym = pts.iter().map(|p| p.1).sum::<f64>() / m as f64;
    let sxx: f64 = pts.iter().map(|p| (p.0 - xm).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = pts.iter().map(|p| (p.0 - xm) * (p.1 - ym)).sum::<f64>() / sxx;
    let intercept = ym - slope * xm;
    let sse: f64 = pts
        .iter()
        .map(|p| (p.1 - intercept - slope * p.0).powi(2))
        .sum();
    let se = (sse / (m - 2) as f64 / sxx).sqrt();
    Some(Line {
        intercept,
        slope,
        half_width: t975(m - 2) * se,
    })
}

/// Residual sum of squares of log v = c + log f(n) with the best constant c.
fn sse_fixed_shape(points: &[(f64, f64)], shape: impl Fn(f64) -> f64) -> f64 {
    let r: Vec<f64> = points.iter().map(|&(n, lv)| lv - shape(n).ln()).collect();
    let mean = r.iter().sum::<f64>() / r.len().max(1) as f64;
    r.iter().map(|x| (x - mean).powi(2)).sum()
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("—".into(), |x| format!("{x:.digits$}"))
}

#[allow(clippy::too_many_lines)]
fn report(
    e: &Convergence,
    runs: &[RunRecord],
    out_dir: &Path,
    report_dir: &Path,
) -> Result<Section> {
    let mut section = Section::new("convergence: preconditioned GD for softmax attention");
    section.paragraph(Experiment::claim(e));
    section.paragraph(
        "Model and algorithm are the reconstruction in `docs/convergence.md` (the paper's text \
         was not available): x ~ N(0, Σ), y = Mx + ε, layer f(x) = A X softmax(XᵀBᵀx); the \
         algorithm is Σ̂-preconditioned GD with the balancing regularizer (λ = 0.5), \
         ‖U‖_F = ‖V‖_F renormalization and η = 0.2/σ_max(T̂), from the balanced spectral \
         initialization. E is the population excess ½‖(AΣBᵀ − M)Σ^{1/2}‖² of the limit predictor.",
    );
    runs_table(&mut section, runs);
    let done: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| r.info.status == RunStatus::Completed)
        .collect();
    let Some(first) = done.first() else {
        section.paragraph("No completed run: nothing to report.");
        return Ok(section);
    };
    let config: Config = first.config()?;
    let mut records = Vec::new();
    for r in &done {
        for rec in r.metrics::<Record>()? {
            records.push((r.info.run.seed, rec));
        }
    }

    // ---------- Part 1: curves ----------
    struct CurveRow<'a> {
        seed: u64,
        d: usize,
        k: usize,
        ks: f64,
        noise: f64,
        method: &'a str,
        budget: usize,
        reached: Option<usize>,
        mu: Option<f64>,
        r2: Option<f64>,
        status: &'a str,
        trace: &'a [(usize, f64)],
    }
    let curves: Vec<CurveRow<'_>> = records
        .iter()
        .filter_map(|(seed, r)| match r {
            Record::Curve {
                d,
                k,
                kappa_sigma,
                noise,
                method,
                budget,
                reached,
                mu,
                mu_r2,
                status,
                trace,
                ..
            } => Some(CurveRow {
                seed: *seed,
                d: *d,
                k: *k,
                ks: *kappa_sigma,
                noise: *noise,
                method,
                budget: *budget,
                reached: *reached,
                mu: *mu,
                r2: *mu_r2,
                status,
                trace,
            }),
            _ => None,
        })
        .collect();
    let mut grid: Vec<(usize, usize, f64, f64)> =
        curves.iter().map(|c| (c.d, c.k, c.ks, c.noise)).collect();
    grid.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    grid.dedup();
    let mut methods: Vec<&str> = Vec::new();
    for c in &curves {
        if !methods.contains(&c.method) {
            methods.push(c.method);
        }
    }
    let seeds: Vec<u64> = {
        let mut s: Vec<u64> = done.iter().map(|r| r.info.run.seed).collect();
        s.sort_unstable();
        s
    };
    let at = |g: &(usize, usize, f64, f64), m: &str| -> Vec<&CurveRow<'_>> {
        curves
            .iter()
            .filter(|c| (c.d, c.k, c.ks, c.noise) == *g && c.method == m)
            .collect()
    };
    let reach_str = |rows: &[&CurveRow<'_>]| -> String {
        let hits: Vec<f64> = rows
            .iter()
            .filter_map(|r| r.reached.map(|x| x as f64))
            .collect();
        if rows.is_empty() {
            return "—".into();
        }
        if hits.len() == rows.len() {
            format!("{:.0}", mean_std(&hits).0)
        } else if hits.is_empty() {
            format!("> {}", rows[0].budget)
        } else {
            format!(
                "{:.0} ({}/{} reached)",
                mean_std(&hits).0,
                hits.len(),
                rows.len()
            )
        }
    };
    let mut table = Vec::new();
    let mut geo_ok = 0;
    let mut geo_total = 0;
    let mut mus_alg = Vec::new();
    for g in &grid {
        let alg = at(g, "algorithm");
        let mu: Vec<f64> = alg.iter().filter_map(|r| r.mu).collect();
        for r in &alg {
            geo_total += 1;
            if r.reached.is_some()
                && r.mu.is_some_and(|m| m < 1.0)
                && r.r2.is_some_and(|x| x > 0.9)
                && r.status == "completed"
            {
                geo_ok += 1;
            }
        }
        mus_alg.extend(mu.iter().copied());
        let (mm, ms) = mean_std(&mu);
        let mut row = vec![
            g.0.to_string(),
            g.1.to_string(),
            format!("{}", g.2),
            format!("{}", g.3),
            format!("{mm:.3} ± {ms:.3}"),
        ];
        for m in &methods {
            row.push(reach_str(&at(g, m)));
        }
        table.push(row);
    }
    section.paragraph(&format!(
        "**Part 1 — convergence curves.** Population gradient oracle; initialization and \
         preconditioner from n_init = {} samples; algorithm and ablations run {} steps, baselines \
         up to {}× as many. The table gives the fitted μ of the algorithm (mean ± sd over seeds) \
         and, per method, the mean first step with E ≤ {:e} (\"> budget\": never within its budget).",
        config.curves.n_init, config.curves.algorithm_steps, config.curves.baseline_factor, config.curves.target_excess
    ));
    let mut headers: Vec<String> = ["d", "k", "κ(Σ)", "σ", "μ (algorithm)"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    headers.extend(methods.iter().map(|m| format!("steps: {m}")));
    let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    section.table(&header_refs, &table);
    // Plots: the middle d, k = d, the last noise level, one plot per κ(Σ), first seed.
    if let (Some(&d_mid), Some(&noise)) = (
        config.curves.dims.get(config.curves.dims.len() / 2),
        config.curves.noise.last(),
    ) {
        let k_plot = if config.curves.k_equals_d.contains(&true) {
            d_mid
        } else {
            1
        };
        for &ks in &config.curves.kappa_sigma {
            let mut plot = LinePlot::new(
                &format!(
                    "E_t, d = {d_mid}, k = {k_plot}, κ(Σ) = {ks}, σ = {noise} (seed {})",
                    seeds[0]
                ),
                "step t + 1",
                "population excess E",
            )
            .log_x()
            .log_y();
            let mut any = false;
            for m in &methods {
                if let Some(row) = curves.iter().find(|c| {
                    (c.d, c.k, c.ks, c.noise) == (d_mid, k_plot, ks, noise)
                        && c.method == *m
                        && c.seed == seeds[0]
                }) {
                    let pts: Vec<(f64, f64)> = row
                        .trace
                        .iter()
                        .map(|&(t, e)| ((t + 1) as f64, e.max(1e-32)))
                        .collect();
                    any = true;
                    plot = plot.series(m, pts, Mark::Line);
                }
            }
            if any {
                let file = out_dir.join(format!("curves_kappa_sigma_{ks}.png"));
                plot.save(&file)?;
                section.image_file(&format!("E_t at κ(Σ) = {ks}"), &file, report_dir);
            }
        }
    }
    let (mu_lo, mu_hi) = mus_alg
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &m| {
            (lo.min(m), hi.max(m))
        });
    section.paragraph(&format!(
        "*Claim: geometric convergence (T7 on the grid).* {} The algorithm reached E ≤ {:e} with a \
         log-linear tail (μ < 1, R² > 0.9) in {geo_ok} of {geo_total} runs; fitted μ ranged over \
         [{mu_lo:.3}, {mu_hi:.3}].",
        if geo_total > 0 && geo_ok == geo_total { "**Held.**" } else { "**Did not hold everywhere.**" },
        config.curves.target_excess
    ));

    // ---------- Part 4: iterations table ----------
    let baselines: Vec<&str> = methods
        .iter()
        .copied()
        .filter(|m| !METHODS_ALG.contains(m))
        .collect();
    let mut rows4 = Vec::new();
    let mut held = 0;
    let mut total4 = 0;
    let mut ratios = Vec::new();
    for g in &grid {
        for &seed in &seeds {
            let pick = |m: &str| {
                curves
                    .iter()
                    .find(|c| (c.d, c.k, c.ks, c.noise) == *g && c.method == m && c.seed == seed)
            };
            let Some(alg) = pick("algorithm") else {
                continue;
            };
            let mut best: Option<(&str, usize)> = None;
            let mut budget = 0;
            for b in &baselines {
                if let Some(row) = pick(b) {
                    budget = budget.max(row.budget);
                    if let Some(t) = row.reached {
                        if best.is_none_or(|(_, bt)| t < bt) {
                            best = Some((b, t));
                        }
                    }
                }
            }
            total4 += 1;
            let (verdict, ratio_s) = match (alg.reached, best) {
                (Some(a), Some((_, b))) => {
                    let ratio = a.max(1) as f64 / b.max(1) as f64;
                    ratios.push(ratio);
                    let ok = ratio <= 0.01;
                    held += usize::from(ok);
                    (
                        if ok { "held" } else { "did not hold" },
                        format!("{ratio:.3}"),
                    )
                }
                (Some(_), None) => {
                    held += 1;
                    ("held (no baseline within budget)", "< 0.01".into())
                }
                (None, _) => ("did not hold (algorithm did not reach)", "—".into()),
            };
            rows4.push(vec![
                g.0.to_string(),
                g.1.to_string(),
                format!("{}", g.2),
                format!("{}", g.3),
                seed.to_string(),
                alg.reached
                    .map_or(format!("> {}", alg.budget), |t| t.to_string()),
                best.map_or(format!("none within {budget}"), |(m, t)| {
                    format!("{t} ({m})")
                }),
                ratio_s,
                verdict.to_string(),
            ]);
        }
    }
    section.paragraph(&format!(
        "**Part 4 — iterations to E ≤ {:e}.** First hitting times (Adam is not monotone: a first \
         hit is the most favourable reading for it). Goal: the algorithm needs ≤ 1/100 of the best \
         baseline's iterations, or no baseline gets there within {}× the algorithm's budget.",
        config.curves.target_excess, config.curves.baseline_factor
    ));
    section.table(
        &[
            "d",
            "k",
            "κ(Σ)",
            "σ",
            "seed",
            "algorithm",
            "best baseline",
            "ratio",
            "goal",
        ],
        &rows4,
    );
    let (rmin, rmax) = ratios
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &r| {
            (lo.min(r), hi.max(r))
        });
    let median = {
        let mut r = ratios.clone();
        r.sort_by(f64::total_cmp);
        r.get(r.len() / 2).copied().unwrap_or(f64::NAN)
    };
    section.paragraph(&format!(
        "*Claim: ≤ 1/100 of the best baseline's iterations.* **{}** The goal was met in {held} of \
         {total4} (grid point, seed) pairs; where a baseline reached the target, the ratio \
         algorithm/best baseline ranged over [{rmin:.3}, {rmax:.3}] (median {median:.3}).",
        if held == total4 && total4 > 0 {
            "Held."
        } else {
            "Did not hold."
        }
    ));
    // T12.
    let gd_random: Vec<&CurveRow<'_>> = curves.iter().filter(|c| c.method == "gd-random").collect();
    let reached: Vec<f64> = gd_random
        .iter()
        .filter_map(|c| c.reached.map(|t| t as f64))
        .collect();
    let alg_reached: Vec<f64> = curves
        .iter()
        .filter(|c| c.method == "algorithm")
        .filter_map(|c| c.reached.map(|t| t as f64))
        .collect();
    section.paragraph(&format!(
        "*Observation T12 (random-init plain GD stalls?).* Plain GD from a {}-scale random \
         initialization reached E ≤ {:e} within its budget in {} of {} runs (mean {:.0} steps when \
         it did, against {:.0} for the algorithm); in the others it was still descending when the \
         budget ran out. At the population level this is slow progress (ill-conditioning in κ(Σ)² \
         and an escape from the saddle at 0), not a stall at a spurious point.",
        config.curves.random_init_scale,
        config.curves.target_excess,
        reached.len(),
        gd_random.len(),
        mean_std(&reached).0,
        mean_std(&alg_reached).0,
    ));

    // ---------- Part 2: sample size ----------
    let sweeps: Vec<SweepRow> = records
        .iter()
        .filter_map(|(_, r)| match r {
            Record::Sweep {
                case,
                n,
                init_excess,
                final_excess,
                init_finite,
                final_finite,
                status,
                ..
            } if status == "completed" => Some((
                *case,
                *n,
                *init_excess,
                *final_excess,
                *init_finite,
                *final_finite,
            )),
            _ => None,
        })
        .collect();
    let sw = &config.sweep;
    section.paragraph(&format!(
        "**Part 2 — excess risk against n.** The algorithm on the empirical loss L̂_n \
         ({:?} context, {} steps, queries chunked so n = {} runs in bounded memory), κ(Σ) = {}, \
         κ(T) = {}, σ = {}. Two error definitions (the paper does not say which it bounds): E of the limit predictor, and the \
         finite-context excess of the layer on {} fresh queries attending over the n training \
         covariates. Slopes are least-squares fits of log error on log n over every draw, with 95% \
         intervals. Over this n range, n⁻² log⁶ n has a log-log slope of {:.2} (its secant), so the \
         two laws are told apart by the slope and by the residuals of fixed-shape fits.",
        sw.mode,
        sw.steps,
        sw.n.iter().max().copied().unwrap_or(0),
        sw.kappa_sigma,
        sw.kappa_t,
        sw.noise,
        sw.test_queries,
        {
            let (lo, hi) = (sw.n.iter().min().copied().unwrap_or(1) as f64, sw.n.iter().max().copied().unwrap_or(2) as f64);
            let f = |n: f64| (n.powi(-2) * n.ln().powi(6)).ln();
            (f(hi) - f(lo)) / (hi.ln() - lo.ln())
        }
    ));
    let mut rows2 = Vec::new();
    let mut verdicts = Vec::new();
    for (ci, case) in sw.cases.iter().enumerate() {
        let sv = model_spec(
            case.d,
            case.k,
            sw.kappa_sigma,
            sw.kappa_t,
            case.nuclear_norm,
            sw.noise,
        )
        .target_singular_values()?;
        let t1 = sv[0];
        let mut plot = LinePlot::new(
            &format!(
                "Excess risk vs n, d = {}, k = {}, Σt_i = {}",
                case.d, case.k, case.nuclear_norm
            ),
            "n",
            "excess risk",
        )
        .log_x()
        .log_y();
        let quantities: [Quantity; 4] = [
            ("E at spectral init", |s| s.2),
            ("E after GD on L̂_n", |s| s.3),
            ("finite-context excess at init", |s| s.4),
            ("finite-context excess after GD", |s| s.5),
        ];
        for (qi, (label, get)) in quantities.iter().enumerate() {
            let pts: Vec<(f64, f64)> = sweeps
                .iter()
                .filter(|s| s.0 == ci)
                .map(|s| (s.1 as f64, get(s)))
                .filter(|p| p.1 > 0.0 && p.1.is_finite())
                .collect();
            if pts.is_empty() {
                continue;
            }
            let logpts: Vec<(f64, f64)> = pts.iter().map(|&(n, v)| (n.ln(), v.ln())).collect();
            let line = fit_line(&logpts);
            let sse_1n = sse_fixed_shape(
                &pts.iter().map(|&(n, v)| (n, v.ln())).collect::<Vec<_>>(),
                |n| 1.0 / n,
            );
            let sse_2 = sse_fixed_shape(
                &pts.iter().map(|&(n, v)| (n, v.ln())).collect::<Vec<_>>(),
                |n| n.powi(-2) * n.ln().powi(6),
            );
            // Means per n for the plot.
            let mut ns: Vec<usize> = sweeps.iter().filter(|s| s.0 == ci).map(|s| s.1).collect();
            ns.sort_unstable();
            ns.dedup();
            let means: Vec<(f64, f64)> = ns
                .iter()
                .map(|&n| {
                    let v: Vec<f64> = pts
                        .iter()
                        .filter(|p| p.0 as usize == n)
                        .map(|p| p.1)
                        .collect();
                    (n as f64, mean_std(&v).0)
                })
                .collect();
            plot = plot.series(
                label,
                means,
                if qi % 2 == 0 {
                    Mark::Points
                } else {
                    Mark::Line
                },
            );
            if let Some(l) = &line {
                if qi == 1 || qi == 3 {
                    let fitted: Vec<(f64, f64)> = ns
                        .iter()
                        .map(|&n| (n as f64, (l.intercept + l.slope * (n as f64).ln()).exp()))
                        .collect();
                    plot = plot.series(
                        &format!("fit: slope {:.2}", l.slope),
                        fitted,
                        Mark::Reference,
                    );
                }
            }
            let (slope_s, verdict) = match &line {
                Some(l) => {
                    let (lo, hi) = (l.slope - l.half_width, l.slope + l.half_width);
                    let one_over_n = (lo..=hi).contains(&-1.0);
                    let better = if sse_1n <= sse_2 {
                        "1/n"
                    } else {
                        "n⁻² log⁶ n"
                    };
                    (
                        format!("{:.2} [{:.2}, {:.2}]", l.slope, lo, hi),
                        format!(
                            "{}; fixed-shape residuals favour {better} ({sse_1n:.2} vs {sse_2:.2})",
                            if one_over_n {
                                "slope −1 inside the interval"
                            } else {
                                "slope −1 outside the interval"
                            }
                        ),
                    )
                }
                None => ("—".into(), "too few points".into()),
            };
            rows2.push(vec![
                format!("d = {}, k = {}, σ_max(T) = {t1:.2}", case.d, case.k),
                label.to_string(),
                pts.len().to_string(),
                slope_s,
                verdict.clone(),
            ]);
            if qi == 1 || qi == 3 {
                verdicts.push((
                    ci,
                    case.clone(),
                    t1,
                    label.to_string(),
                    line.as_ref().map(|l| (l.slope, l.half_width)),
                    sse_1n <= sse_2,
                ));
            }
        }
        let file = out_dir.join(format!("excess_vs_n_case{ci}.png"));
        if plot.save(&file).is_ok() {
            section.image_file(&format!("excess vs n, case {ci}"), &file, report_dir);
        }
    }
    section.table(
        &["case", "error", "points", "log-log slope [95%]", "reading"],
        &rows2,
    );
    // Means table.
    let mut rows2b = Vec::new();
    for (ci, case) in sw.cases.iter().enumerate() {
        for &n in &sw.n {
            let sel: Vec<_> = sweeps.iter().filter(|s| s.0 == ci && s.1 == n).collect();
            if sel.is_empty() {
                continue;
            }
            let m = |f: fn(&SweepRow) -> f64| {
                format!(
                    "{:.2e}",
                    mean_std(&sel.iter().map(|s| f(s)).collect::<Vec<_>>()).0
                )
            };
            rows2b.push(vec![
                format!("d = {}, k = {}", case.d, case.k),
                n.to_string(),
                m(|s| s.2),
                m(|s| s.3),
                m(|s| s.4),
                m(|s| s.5),
            ]);
        }
    }
    section.table(
        &[
            "case",
            "n",
            "E init",
            "E final",
            "finite init",
            "finite final",
        ],
        &rows2b,
    );
    let mut text = Vec::new();
    for (_, case, t1, label, line, favours_1n) in &verdicts {
        let finite_var = 2.0 * t1 < 1.0;
        let s = match line {
            Some((s, hw)) => {
                let within = (s - hw..=s + hw).contains(&-1.0);
                format!(
                    "d = {}, k = {}, {label}: slope {s:.2} ± {hw:.2} — {} with 1/n{}",
                    case.d,
                    case.k,
                    if within {
                        "consistent"
                    } else {
                        "not consistent"
                    },
                    if *favours_1n {
                        ", and 1/n fits better than n⁻² log⁶ n"
                    } else {
                        ", and n⁻² log⁶ n fits better than 1/n"
                    }
                )
            }
            None => format!("d = {}, k = {}, {label}: no fit", case.d, case.k),
        };
        let secant = {
            let (lo, hi) = (
                sw.n.iter().min().copied().unwrap_or(1) as f64,
                sw.n.iter().max().copied().unwrap_or(2) as f64,
            );
            let f = |n: f64| (n.powi(-2) * n.ln().powi(6)).ln();
            (f(hi) - f(lo)) / (hi.ln() - lo.ln())
        };
        let both = line.is_some_and(|(s, hw)| {
            (s - hw..=s + hw).contains(&-1.0) && (s - hw..=s + hw).contains(&secant)
        });
        let s = if both {
            format!("{s} — the interval also contains n⁻² log⁶ n's secant slope {secant:.2}, so the slope alone cannot tell the two laws apart")
        } else {
            s
        };
        text.push(format!(
            "{s} (2σ_max(T) = {:.2}: the softmax average's variance E exp(‖Σ^{{1/2}}B*ᵀx‖²) is {} at the balanced optimum)",
            2.0 * t1,
            if finite_var { "finite" } else { "infinite" }
        ));
    }
    let all_1n = verdicts
        .iter()
        .all(|v| v.4.is_some_and(|(s, hw)| (s - hw..=s + hw).contains(&-1.0)));
    section.paragraph(&format!(
        "*Claim: the final excess falls like 1/n (T9).* **{}** {}.",
        if all_1n && !verdicts.is_empty() {
            "Held."
        } else {
            "Did not hold in every case."
        },
        text.join("; ")
    ));

    // ---------- Part 3: rates ----------
    let rates: Vec<(f64, f64, bool, Option<f64>)> = records
        .iter()
        .filter_map(|(_, r)| match r {
            Record::Rate {
                kappa_t,
                kappa_sigma,
                preconditioner,
                mu,
                ..
            } => Some((*kappa_t, *kappa_sigma, *preconditioner, *mu)),
            _ => None,
        })
        .collect();
    let rc = &config.rates;
    let mean_gap = |kt: f64, ks: f64, pre: bool| -> Option<f64> {
        let v: Vec<f64> = rates
            .iter()
            .filter(|r| r.0 == kt && r.1 == ks && r.2 == pre)
            .filter_map(|r| r.3.map(|m| 1.0 - m))
            .collect();
        (!v.is_empty()).then(|| mean_std(&v).0)
    };
    let mut rows3 = Vec::new();
    for &kt in &rc.kappa_t {
        let mut row = vec![format!("{kt}")];
        for &ks in &rc.kappa_sigma {
            for pre in [true, false] {
                row.push(fmt_opt(mean_gap(kt, ks, pre).map(|g| 1.0 - g), 4));
            }
        }
        rows3.push(row);
    }
    let mut h3: Vec<String> = vec!["κ(T)".into()];
    for &ks in &rc.kappa_sigma {
        h3.push(format!("μ κ(Σ)={ks} precond."));
        h3.push(format!("μ κ(Σ)={ks} plain"));
    }
    section.paragraph(&format!(
        "**Part 3 — μ against κ(T) and κ(Σ).** d = k = {}, population oracle, {} steps with the \
         preconditioner and {} without (ablation `no-preconditioner`: same regularizer and \
         renormalization, Euclidean gradients and η = 0.2/(σ_max(T̂)·max(λ_max, λ_max²))). μ is \
         fitted on the tail of E_t; mean over seeds.",
        rc.d, rc.steps, rc.plain_steps
    ));
    let h3r: Vec<&str> = h3.iter().map(String::as_str).collect();
    section.table(&h3r, &rows3);
    let mut p_t = LinePlot::new("1 − μ against κ(T)", "κ(T)", "1 − μ")
        .log_x()
        .log_y();
    for &ks in &rc.kappa_sigma {
        for pre in [true, false] {
            let pts: Vec<(f64, f64)> = rc
                .kappa_t
                .iter()
                .filter_map(|&kt| mean_gap(kt, ks, pre).map(|g| (kt, g)))
                .collect();
            p_t = p_t.series(
                &format!(
                    "κ(Σ) = {ks}, {}",
                    if pre { "preconditioned" } else { "plain" }
                ),
                pts,
                if pre { Mark::Line } else { Mark::Points },
            );
        }
    }
    let file = out_dir.join("rate_vs_kappa_t.png");
    if p_t.save(&file).is_ok() {
        section.image_file("1 − μ against κ(T)", &file, report_dir);
    }
    let mut p_s = LinePlot::new("1 − μ against κ(Σ)", "κ(Σ)", "1 − μ")
        .log_x()
        .log_y();
    for &kt in &rc.kappa_t {
        for pre in [true, false] {
            let pts: Vec<(f64, f64)> = rc
                .kappa_sigma
                .iter()
                .filter_map(|&ks| mean_gap(kt, ks, pre).map(|g| (ks, g)))
                .collect();
            p_s = p_s.series(
                &format!("κ(T) = {kt}, {}", if pre { "precond." } else { "plain" }),
                pts,
                if pre { Mark::Line } else { Mark::Points },
            );
        }
    }
    let file = out_dir.join("rate_vs_kappa_sigma.png");
    if p_s.save(&file).is_ok() {
        section.image_file("1 − μ against κ(Σ)", &file, report_dir);
    }
    // Verdicts: spread of 1 − μ across κ(Σ), per κ(T).
    let spread = |pre: bool| -> f64 {
        rc.kappa_t
            .iter()
            .filter_map(|&kt| {
                let g: Vec<f64> = rc
                    .kappa_sigma
                    .iter()
                    .filter_map(|&ks| mean_gap(kt, ks, pre))
                    .collect();
                if g.len() < 2 {
                    return None;
                }
                let (lo, hi) = g.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| {
                    (lo.min(x), hi.max(x))
                });
                Some(hi / lo)
            })
            .fold(1.0f64, f64::max)
    };
    let (sp_pre, sp_plain) = (spread(true), spread(false));
    let slope_t = |pre: bool, ks: f64| -> Option<f64> {
        let pts: Vec<(f64, f64)> = rc
            .kappa_t
            .iter()
            .filter_map(|&kt| mean_gap(kt, ks, pre).map(|g| (kt.ln(), g.ln())))
            .collect();
        fit_line(&pts).map(|l| l.slope)
    };
    let ks0 = rc.kappa_sigma.first().copied().unwrap_or(1.0);
    section.paragraph(&format!(
        "*Claim: the preconditioned rate does not depend on κ(Σ) (T8).* **{}** Across κ(Σ) ∈ {:?}, \
         1 − μ varied by at most a factor {sp_pre:.2} with the preconditioner and by up to a \
         factor {sp_plain:.1} without it. The κ(T) dependence remains: log(1 − μ) against log κ(T) \
         has slope {} with the preconditioner at κ(Σ) = {ks0} (−1 would be 1 − μ ∝ 1/κ(T), the \
         usual first-order rate; a ScaledGD factor, not implemented, would remove it).",
        if sp_pre < 1.5 && sp_plain > 10.0 * sp_pre { "Held." } else { "Did not hold." },
        rc.kappa_sigma,
        fmt_opt(slope_t(true, ks0), 2),
    ));
    Ok(section)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_fit_recovers_a_slope_and_covers_it() {
        let pts: Vec<(f64, f64)> = (0..20)
            .map(|i| {
                (
                    i as f64,
                    2.0 - 0.5 * i as f64 + 0.01 * ((i * 7 % 5) as f64 - 2.0),
                )
            })
            .collect();
        let l = fit_line(&pts).unwrap();
        assert!((l.slope + 0.5).abs() < 0.01 && l.half_width < 0.01);
        assert!((l.slope - l.half_width..=l.slope + l.half_width).contains(&-0.5));
    }

    #[test]
    fn the_secant_slope_of_n_minus_two_log_six_is_near_minus_one_point_one() {
        let f = |n: f64| (n.powi(-2) * n.ln().powi(6)).ln();
        let s = (f(16000.0) - f(250.0)) / (16000f64.ln() - 250f64.ln());
        assert!(s > -1.3 && s < -1.0, "{s}");
    }
}
