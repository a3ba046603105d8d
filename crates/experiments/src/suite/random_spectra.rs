//! "random-spectra": singular values and condition numbers of Gaussian matrices against the
//! Marchenko–Pastur asymptotics, computed through kappa-linalg.
//!
//! For W ∈ ℝ^{D×k} with i.i.d. N(0, 1) entries and k/D → c ∈ (0, 1), the extreme singular values
//! satisfy σ_max/√D → 1 + √c and σ_min/√D → 1 − √c, so
//!
//! κ(W) → (1 + √c)/(1 − √c) = (√D + √k)/(√D − √k),
//!
//! and the eigenvalues of WᵀW/D follow the Marchenko–Pastur law with ratio c,
//! p(λ) = √((λ₊ − λ)(λ − λ₋)) / (2π c λ) on [λ₋, λ₊], λ± = (1 ± √c)².
//! This is the yardstick for every κ that kappa reports: attention projections at initialization
//! are such matrices (scaled), and the spectral-conditioning paper's corrections are judged
//! against κ ≈ 1.8 at ViT-B's 768×64.

use std::path::Path;

use anyhow::Result;
use kappa_linalg::{condition_number, singular_values, SvdDriver};
use ndarray::Array2;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::plot::{LinePlot, Mark};
use crate::report::cells;
use crate::report::runs::{completed, records};
use crate::report::{opened, Figures, Section};
use crate::run::{Run, RunRecord, RunStatus};
use crate::stats::{mean, mean_std};
use crate::Experiment;

/// The experiment (registered as `random-spectra`).
pub struct RandomSpectra;

/// What `random-spectra` measures.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Row counts D.
    pub rows: Vec<usize>,
    /// Aspect ratios c = k/D (k is rounded to the nearest integer ≥ 1).
    pub ratios: Vec<f64>,
    /// Matrices drawn per (D, k) per seed.
    pub trials: usize,
    /// The (D, k) whose singular values are compared with the Marchenko–Pastur density.
    pub density_shape: [usize; 2],
}

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// The extremes of one matrix.
    Extremes {
        /// Rows.
        d: usize,
        /// Columns.
        k: usize,
        /// Which draw.
        trial: usize,
        /// Largest singular value.
        sigma_max: f64,
        /// Smallest (k-th) singular value.
        sigma_min: f64,
        /// κ = σ_max/σ_min from kappa-linalg's `condition_number`.
        kappa: f64,
    },
    /// Every singular value of the density-shape matrix.
    Spectrum {
        /// Rows.
        d: usize,
        /// Columns.
        k: usize,
        /// Singular values, descending.
        singular_values: Vec<f64>,
    },
}

/// The limit κ for aspect ratio c = k/D.
pub fn kappa_limit(c: f64) -> f64 {
    (1.0 + c.sqrt()) / (1.0 - c.sqrt())
}

/// The Marchenko–Pastur density of the eigenvalues of WᵀW/D for ratio c = k/D ∈ (0, 1].
pub fn marchenko_pastur_density(lambda: f64, c: f64) -> f64 {
    let (lo, hi) = ((1.0 - c.sqrt()).powi(2), (1.0 + c.sqrt()).powi(2));
    if lambda <= lo || lambda >= hi {
        return 0.0;
    }
    ((hi - lambda) * (lambda - lo)).sqrt() / (2.0 * std::f64::consts::PI * c * lambda)
}

/// The Marchenko–Pastur CDF by the trapezoidal rule on `n` panels (accurate to ~1e-4 at n = 4000).
pub fn marchenko_pastur_cdf(lambda: f64, c: f64, n: usize) -> f64 {
    let lo = (1.0 - c.sqrt()).powi(2);
    let hi = (1.0 + c.sqrt()).powi(2);
    if lambda <= lo {
        return 0.0;
    }
    if lambda >= hi {
        return 1.0;
    }
    let h = (lambda - lo) / n as f64;
    let inner: f64 = (1..n)
        .map(|i| marchenko_pastur_density(lo + i as f64 * h, c))
        .sum();
    h * (inner + 0.5 * (marchenko_pastur_density(lo, c) + marchenko_pastur_density(lambda, c)))
}

fn columns(d: usize, ratio: f64) -> usize {
    ((d as f64 * ratio).round() as usize).clamp(1, d)
}

fn gaussian(d: usize, k: usize, rng: &mut ChaCha8Rng) -> Array2<f64> {
    Array2::from_shape_simple_fn((d, k), || StandardNormal.sample(rng))
}

impl Experiment for RandomSpectra {
    type Config = Config;

    fn name(&self) -> &'static str {
        "random-spectra"
    }

    fn claim(&self) -> &'static str {
        "Random Gaussian D×k matrices have κ → (√D+√k)/(√D−√k) (Marchenko–Pastur): the baseline \
         every κ in the spectral-conditioning paper is measured against."
    }

    fn validate(&self, c: &Config) -> Result<()> {
        anyhow::ensure!(
            !c.rows.is_empty() && c.rows.iter().all(|&d| d >= 1),
            "rows: need at least one row count D ≥ 1, found {:?}",
            c.rows
        );
        anyhow::ensure!(
            !c.ratios.is_empty() && c.ratios.iter().all(|&r| r > 0.0 && r < 1.0),
            "ratios: need at least one ratio k/D in (0, 1), found {:?}",
            c.ratios
        );
        anyhow::ensure!(c.trials >= 1, "trials: must be ≥ 1");
        let [d, k] = c.density_shape;
        anyhow::ensure!(
            1 <= k && k <= d,
            "density_shape: need [D, k] with 1 ≤ k ≤ D, found [{d}, {k}]"
        );
        Ok(())
    }

    fn run(&self, config: &Config, run: &mut Run) -> Result<RunStatus> {
        let seed = run.context().seed;
        let shapes: Vec<(usize, usize)> = config
            .rows
            .iter()
            .flat_map(|&d| config.ratios.iter().map(move |&c| (d, columns(d, c))))
            .collect();
        let bar = run.progress((shapes.len() * config.trials + 1) as u64, "matrices");
        for (shape_index, &(d, k)) in shapes.iter().enumerate() {
            for trial in 0..config.trials {
                let stream = (shape_index * config.trials + trial) as u64;
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(stream);
                let w = gaussian(d, k, &mut rng);
                let s = singular_values(w.view(), SvdDriver::default())?;
                let kappa = condition_number(w.view())?;
                run.log(&Record::Extremes {
                    d,
                    k,
                    trial,
                    sigma_max: s[0],
                    sigma_min: s[s.len() - 1],
                    kappa,
                })?;
                bar.set_message(format!("{d}×{k}"));
                bar.inc(1);
            }
        }
        let [d, k] = config.density_shape;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(u64::MAX);
        let s = singular_values(gaussian(d, k, &mut rng).view(), SvdDriver::default())?;
        run.log(&Record::Spectrum {
            d,
            k,
            singular_values: s.to_vec(),
        })?;
        bar.inc(1);
        bar.finish_and_clear();
        Ok(RunStatus::Completed)
    }

    fn report(&self, runs: &[RunRecord], out_dir: &Path, report_dir: &Path) -> Result<Section> {
        let mut section = opened(
            "random-spectra: κ of Gaussian matrices vs Marchenko–Pastur",
            Experiment::claim(self),
            runs,
        );
        let figures = Figures::new(out_dir, report_dir);
        let mut draws = Vec::new();
        let mut spectra = Vec::new();
        for record in records::<Record>(&completed(runs))? {
            match record {
                Record::Extremes {
                    d,
                    k,
                    sigma_max,
                    sigma_min,
                    kappa,
                    ..
                } => draws.push(Draw {
                    d,
                    k,
                    sigma_max,
                    sigma_min,
                    kappa,
                }),
                Record::Spectrum {
                    d,
                    k,
                    singular_values,
                } => spectra.push((d, k, singular_values)),
            }
        }
        let shapes = shape_stats(&draws);
        kappa_table(&mut section, &shapes);
        deviation(&mut section, &shapes);
        kappa_plot(&mut section, &shapes, &figures)?;
        if let Some((d, k, singular_values)) = spectra.first() {
            let seed = runs[0].info.run.seed;
            spectrum(&mut section, (*d, *k), singular_values, seed, &figures)?;
        }
        Ok(section)
    }
}

/// The extremes of one drawn matrix.
struct Draw {
    d: usize,
    k: usize,
    sigma_max: f64,
    sigma_min: f64,
    kappa: f64,
}

/// One shape D×k over every draw and seed.
struct ShapeStats {
    d: usize,
    k: usize,
    /// k/D.
    c: f64,
    matrices: usize,
    /// Mean and std of κ.
    kappa: (f64, f64),
    /// Mean σ_max/√D.
    sigma_max: f64,
    /// Mean σ_min/√D.
    sigma_min: f64,
}

impl ShapeStats {
    /// The relative deviation of the mean κ from its limit.
    fn deviation(&self) -> f64 {
        self.kappa.0 / kappa_limit(self.c) - 1.0
    }
}

/// Every shape drawn, in (D, k) order.
fn shape_stats(draws: &[Draw]) -> Vec<ShapeStats> {
    let mut shapes: Vec<(usize, usize)> = draws.iter().map(|r| (r.d, r.k)).collect();
    shapes.sort_unstable();
    shapes.dedup();
    shapes
        .into_iter()
        .map(|(d, k)| {
            let mine: Vec<&Draw> = draws.iter().filter(|r| (r.d, r.k) == (d, k)).collect();
            let scaled = |s: f64| s / (d as f64).sqrt();
            let kappas: Vec<f64> = mine.iter().map(|r| r.kappa).collect();
            let smax: Vec<f64> = mine.iter().map(|r| scaled(r.sigma_max)).collect();
            let smin: Vec<f64> = mine.iter().map(|r| scaled(r.sigma_min)).collect();
            ShapeStats {
                d,
                k,
                c: k as f64 / d as f64,
                matrices: kappas.len(),
                kappa: mean_std(&kappas),
                sigma_max: mean(&smax),
                sigma_min: mean(&smin),
            }
        })
        .collect()
}

/// The shapes grouped by D, in order.
fn by_rows(shapes: &[ShapeStats]) -> Vec<(usize, Vec<&ShapeStats>)> {
    let mut groups: Vec<(usize, Vec<&ShapeStats>)> = Vec::new();
    for s in shapes {
        match groups.iter_mut().find(|(d, _)| *d == s.d) {
            Some((_, group)) => group.push(s),
            None => groups.push((s.d, vec![s])),
        }
    }
    groups
}

/// Measured κ, σ_max and σ_min per shape beside their limits.
fn kappa_table(section: &mut Section, shapes: &[ShapeStats]) {
    let rows: Vec<Vec<String>> = shapes
        .iter()
        .map(|s| {
            let c = s.c;
            vec![
                s.d.to_string(),
                s.k.to_string(),
                format!("{c:.4}"),
                s.matrices.to_string(),
                cells::mean_std(s.kappa, 4),
                format!("{:.4}", kappa_limit(c)),
                format!("{:+.2}%", 100.0 * s.deviation()),
                format!("{:.4} / {:.4}", s.sigma_max, 1.0 + c.sqrt()),
                format!("{:.4} / {:.4}", s.sigma_min, 1.0 - c.sqrt()),
            ]
        })
        .collect();
    section.table(
        &[
            "D",
            "k",
            "k/D",
            "matrices",
            "κ measured (mean ± std)",
            "κ limit",
            "mean vs limit",
            "σmax/√D (measured / limit)",
            "σmin/√D (measured / limit)",
        ],
        &rows,
    );
}

/// Per D, the largest |mean κ / limit − 1| over the aspect ratios and how many means lie below
/// their limit; whether that deviation shrinks as D grows.
fn deviation(section: &mut Section, shapes: &[ShapeStats]) {
    let per_d: Vec<(usize, f64, usize, usize)> = by_rows(shapes)
        .into_iter()
        .map(|(d, group)| {
            let worst = group
                .iter()
                .map(|s| s.deviation().abs())
                .reduce(f64::max)
                .unwrap_or(f64::NAN);
            let below = group.iter().filter(|s| s.deviation() < 0.0).count();
            (d, worst, below, group.len())
        })
        .collect();
    let text: Vec<String> = per_d
        .iter()
        .map(|(d, worst, below, n)| {
            format!(
                "D = {d}: within {:.2}% ({below} of {n} means below the limit)",
                100.0 * worst
            )
        })
        .collect();
    let shrinking = per_d.windows(2).all(|w| w[1].1 <= w[0].1);
    section.paragraph(&format!(
        "Largest deviation of the mean κ from its limit, per D: {}. Gordon's inequality \
         (√D − √k ≤ E σ_min ≤ E σ_max ≤ √D + √k) says finite matrices sit inside the limiting \
         edges, so the mean κ approaches the limit from below. {}",
        text.join("; "),
        if shrinking {
            "Here the deviation shrinks as D grows, as the asymptotics predict."
        } else {
            "Here the deviation does not shrink monotonically with D: read the table before \
             relying on the limit at these sizes."
        }
    ));
}

/// κ against k/D: the limit curve and one point series per D.
fn kappa_plot(section: &mut Section, shapes: &[ShapeStats], figures: &Figures<'_>) -> Result<()> {
    let max_c = shapes.iter().map(|s| s.c).fold(0.0, f64::max);
    if max_c <= 0.0 {
        return Ok(());
    }
    let theory: Vec<(f64, f64)> = (1..=200)
        .map(|i| {
            let c = max_c * 1.02 * i as f64 / 200.0;
            (c, kappa_limit(c))
        })
        .collect();
    let mut plot = LinePlot::new("Condition number of Gaussian D×k matrices", "k/D", "κ")
        .log_y()
        .series("limit (1+√c)/(1−√c)", theory, Mark::Line);
    for (d, group) in by_rows(shapes) {
        let pts = group.iter().map(|s| (s.c, s.kappa.0)).collect();
        plot = plot.series(&format!("measured, D = {d}"), pts, Mark::Points);
    }
    figures.add(section, "κ against k/D", &plot, "kappa_vs_ratio.png")
}

/// The eigenvalues of WᵀW/D of one matrix against the Marchenko–Pastur CDF, with the
/// Kolmogorov–Smirnov distance between the two.
fn spectrum(
    section: &mut Section,
    (d, k): (usize, usize),
    singular_values: &[f64],
    seed: u64,
    figures: &Figures<'_>,
) -> Result<()> {
    let c = k as f64 / d as f64;
    let mut eig: Vec<f64> = singular_values.iter().map(|s| s * s / d as f64).collect();
    eig.sort_by(f64::total_cmp);
    let n = eig.len() as f64;
    let mut ks = 0.0f64;
    let empirical: Vec<(f64, f64)> = eig
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            let f = marchenko_pastur_cdf(l, c, 4000);
            ks = ks
                .max((f - i as f64 / n).abs())
                .max((f - (i + 1) as f64 / n).abs());
            (l, (i + 1) as f64 / n)
        })
        .collect();
    let (lo, hi) = ((1.0 - c.sqrt()).powi(2), (1.0 + c.sqrt()).powi(2));
    let theory: Vec<(f64, f64)> = (0..=200)
        .map(|i| {
            let l = lo + (hi - lo) * i as f64 / 200.0;
            (l, marchenko_pastur_cdf(l, c, 4000))
        })
        .collect();
    let plot = LinePlot::new(
        &format!("Eigenvalues of WᵀW/D, D = {d}, k = {k} (seed {seed})"),
        "λ",
        "CDF",
    )
    .series("Marchenko–Pastur", theory, Mark::Line)
    .series("measured", empirical, Mark::Reference);
    let file = figures.save(&plot, "marchenko_pastur_cdf.png")?;
    section.paragraph(&format!(
        "The eigenvalues of WᵀW/D for one {d}×{k} matrix follow the Marchenko–Pastur law \
         with c = {c:.3}: the Kolmogorov–Smirnov distance between the empirical and the \
         limiting CDF is {ks:.4} (for comparison, 1/√k = {:.4}).",
        1.0 / (k as f64).sqrt()
    ));
    figures.embed(section, "Marchenko–Pastur CDF", &file);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marchenko_pastur_density_integrates_to_one() {
        for c in [0.05f64, 0.25, 0.5, 0.9] {
            let total = marchenko_pastur_cdf((1.0 + c.sqrt()).powi(2) - 1e-12, c, 20_000);
            assert!((total - 1.0).abs() < 2e-3, "c = {c}: ∫p = {total}");
        }
    }

    #[test]
    fn the_kappa_limit_matches_the_square_root_form() {
        let (d, k) = (768.0f64, 64.0f64);
        let direct = (d.sqrt() + k.sqrt()) / (d.sqrt() - k.sqrt());
        assert!((kappa_limit(k / d) - direct).abs() < 1e-12);
        assert!((kappa_limit(k / d) - 1.81).abs() < 0.01);
    }
}
