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
use crate::report::{runs_table, Section};
use crate::run::{Run, RunRecord, RunStatus};
use crate::stats::mean_std;
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
        let mut section =
            Section::new("random-spectra: κ of Gaussian matrices vs Marchenko–Pastur");
        section.paragraph(Experiment::claim(self));
        runs_table(&mut section, runs);

        let mut extremes = Vec::new();
        let mut spectra = Vec::new();
        for run in runs
            .iter()
            .filter(|r| r.info.status == RunStatus::Completed)
        {
            for record in run.metrics::<Record>()? {
                match record {
                    Record::Extremes { .. } => extremes.push(record),
                    Record::Spectrum { .. } => spectra.push(record),
                }
            }
        }
        let mut shapes: Vec<(usize, usize)> = extremes
            .iter()
            .filter_map(|r| match r {
                Record::Extremes { d, k, .. } => Some((*d, *k)),
                Record::Spectrum { .. } => None,
            })
            .collect();
        shapes.sort_unstable();
        shapes.dedup();

        let mut rows = Vec::new();
        let mut measured_by_d: Vec<(usize, Vec<(f64, f64)>)> = Vec::new();
        // Per D: the largest |mean κ / limit − 1| over the aspect ratios, and how many means lie
        // below their limit.
        let mut deviation_by_d: Vec<(usize, f64, usize, usize)> = Vec::new();
        for &(d, k) in &shapes {
            let pick = |f: fn(&Record) -> Option<f64>| -> Vec<f64> {
                extremes
                    .iter()
                    .filter(|r| matches!(r, Record::Extremes { d: rd, k: rk, .. } if *rd == d && *rk == k))
                    .filter_map(f)
                    .collect()
            };
            let kappas = pick(|r| match r {
                Record::Extremes { kappa, .. } => Some(*kappa),
                Record::Spectrum { .. } => None,
            });
            let smax = pick(|r| match r {
                Record::Extremes { d, sigma_max, .. } => Some(sigma_max / (*d as f64).sqrt()),
                Record::Spectrum { .. } => None,
            });
            let smin = pick(|r| match r {
                Record::Extremes { d, sigma_min, .. } => Some(sigma_min / (*d as f64).sqrt()),
                Record::Spectrum { .. } => None,
            });
            let c = k as f64 / d as f64;
            let limit = kappa_limit(c);
            let (km, ks) = mean_std(&kappas);
            let rel = km / limit - 1.0;
            match deviation_by_d.iter_mut().find(|e| e.0 == d) {
                Some(e) => {
                    e.1 = e.1.max(rel.abs());
                    e.2 += usize::from(rel < 0.0);
                    e.3 += 1;
                }
                None => deviation_by_d.push((d, rel.abs(), usize::from(rel < 0.0), 1)),
            }
            rows.push(vec![
                d.to_string(),
                k.to_string(),
                format!("{c:.4}"),
                kappas.len().to_string(),
                format!("{km:.4} ± {ks:.4}"),
                format!("{limit:.4}"),
                format!("{:+.2}%", 100.0 * rel),
                format!("{:.4} / {:.4}", mean_std(&smax).0, 1.0 + c.sqrt()),
                format!("{:.4} / {:.4}", mean_std(&smin).0, 1.0 - c.sqrt()),
            ]);
            match measured_by_d.iter_mut().find(|(dd, _)| *dd == d) {
                Some((_, pts)) => pts.push((c, km)),
                None => measured_by_d.push((d, vec![(c, km)])),
            }
        }
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
        let per_d: Vec<String> = deviation_by_d
            .iter()
            .map(|(d, worst, below, n)| {
                format!(
                    "D = {d}: within {:.2}% ({below} of {n} means below the limit)",
                    100.0 * worst
                )
            })
            .collect();
        let shrinking = deviation_by_d.windows(2).all(|w| w[1].1 <= w[0].1);
        section.paragraph(&format!(
            "Largest deviation of the mean κ from its limit, per D: {}. Gordon's inequality \
             (√D − √k ≤ E σ_min ≤ E σ_max ≤ √D + √k) says finite matrices sit inside the limiting \
             edges, so the mean κ approaches the limit from below. {}",
            per_d.join("; "),
            if shrinking {
                "Here the deviation shrinks as D grows, as the asymptotics predict."
            } else {
                "Here the deviation does not shrink monotonically with D: read the table before \
                 relying on the limit at these sizes."
            }
        ));

        // κ against k/D: theory curve and one point series per D.
        let max_c = shapes
            .iter()
            .map(|&(d, k)| k as f64 / d as f64)
            .fold(0.0, f64::max);
        if max_c > 0.0 {
            let theory: Vec<(f64, f64)> = (1..=200)
                .map(|i| {
                    let c = max_c * 1.02 * i as f64 / 200.0;
                    (c, kappa_limit(c))
                })
                .collect();
            let mut plot = LinePlot::new("Condition number of Gaussian D×k matrices", "k/D", "κ")
                .log_y()
                .series("limit (1+√c)/(1−√c)", theory, Mark::Line);
            for (d, pts) in &measured_by_d {
                plot = plot.series(&format!("measured, D = {d}"), pts.clone(), Mark::Points);
            }
            let file = out_dir.join("kappa_vs_ratio.png");
            plot.save(&file)?;
            section.image_file("κ against k/D", &file, report_dir);
        }

        // The spectrum of the density shape against Marchenko–Pastur, as a CDF (with a KS distance).
        if let Some(Record::Spectrum {
            d,
            k,
            singular_values,
        }) = spectra.first()
        {
            let c = *k as f64 / *d as f64;
            let mut eig: Vec<f64> = singular_values.iter().map(|s| s * s / *d as f64).collect();
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
            let file = out_dir.join("marchenko_pastur_cdf.png");
            LinePlot::new(
                &format!(
                    "Eigenvalues of WᵀW/D, D = {d}, k = {k} (seed {})",
                    runs[0].info.run.seed
                ),
                "λ",
                "CDF",
            )
            .series("Marchenko–Pastur", theory, Mark::Line)
            .series("measured", empirical, Mark::Reference)
            .save(&file)?;
            section.paragraph(&format!(
                "The eigenvalues of WᵀW/D for one {d}×{k} matrix follow the Marchenko–Pastur law \
                 with c = {c:.3}: the Kolmogorov–Smirnov distance between the empirical and the \
                 limiting CDF is {ks:.4} (for comparison, 1/√k = {:.4}).",
                1.0 / (*k as f64).sqrt()
            ));
            section.image_file("Marchenko–Pastur CDF", &file, report_dir);
        }
        Ok(section)
    }
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
