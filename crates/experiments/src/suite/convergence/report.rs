//! The `convergence` section: parts 1 and 4 (curves and iteration counts, with T12), part 2
//! (excess against n) and part 3 (μ against conditioning), each with its verdict computed from
//! the records of the completed runs.

use anyhow::Result;

use super::{model_spec, Config, RatesConfig, Record, SweepCase, SweepConfig};
use crate::plot::{LinePlot, Mark};
use crate::report::cells::{self, fixed, or_missing, MISSING};
use crate::report::runs::{completed, seeded_records};
use crate::report::verdict::{claim, held};
use crate::report::{runs_table, Figures, Section};
use crate::run::RunRecord;
use crate::stats::{fit_line, mean, mean_std, min_max, upper_median, LineFit};

/// The algorithm and its ablations (every other method of part 1 is a baseline).
const METHODS_ALG: [&str; 4] = [
    "algorithm",
    "no-preconditioner",
    "no-regularizer",
    "random-init",
];

/// The section, from the run folders.
pub(super) fn write(claim: &str, runs: &[RunRecord], figures: &Figures<'_>) -> Result<Section> {
    let mut section = Section::new("convergence: preconditioned GD for softmax attention");
    section.paragraph(claim);
    section.paragraph(
        "Model and algorithm are the reconstruction in `docs/convergence.md` (the paper's text \
         was not available): x ~ N(0, Σ), y = Mx + ε, layer f(x) = A X softmax(XᵀBᵀx); the \
         algorithm is Σ̂-preconditioned GD with the balancing regularizer (λ = 0.5), \
         ‖U‖_F = ‖V‖_F renormalization and η = 0.2/σ_max(T̂), from the balanced spectral \
         initialization. E is the population excess ½‖(AΣBᵀ − M)Σ^{1/2}‖² of the limit predictor.",
    );
    runs_table(&mut section, runs);
    let done = completed(runs);
    let Some(first) = done.first() else {
        section.paragraph("No completed run: nothing to report.");
        return Ok(section);
    };
    let config: Config = first.config()?;
    let records: Vec<(u64, Record)> = seeded_records(&done)?;
    let mut seeds: Vec<u64> = done.iter().map(|r| r.info.run.seed).collect();
    seeds.sort_unstable();
    let curves = Curves::new(&records, seeds);
    curves_part(&mut section, &curves, &config, figures)?;
    iterations_part(&mut section, &curves, &config);
    sample_size_part(&mut section, &records, &config.sweep, figures)?;
    rates_part(&mut section, &records, &config.rates, figures);
    Ok(section)
}

/// A grid point of part 1: (d, k, κ(Σ), σ).
type GridPoint = (usize, usize, f64, f64);

/// One method on one grid point for one seed (a `curve` record).
struct CurveRow<'a> {
    seed: u64,
    grid: GridPoint,
    method: &'a str,
    budget: usize,
    reached: Option<usize>,
    mu: Option<f64>,
    r2: Option<f64>,
    status: &'a str,
    trace: &'a [(usize, f64)],
}

/// Parts 1 and 4's records, with the grid points, methods and seeds they cover.
struct Curves<'a> {
    rows: Vec<CurveRow<'a>>,
    /// Sorted.
    grid: Vec<GridPoint>,
    /// In order of first appearance.
    methods: Vec<&'a str>,
    /// The completed runs' seeds, sorted.
    seeds: Vec<u64>,
}

impl<'a> Curves<'a> {
    fn new(records: &'a [(u64, Record)], seeds: Vec<u64>) -> Self {
        let rows: Vec<CurveRow<'a>> = records
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
                    grid: (*d, *k, *kappa_sigma, *noise),
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
        let mut grid: Vec<GridPoint> = rows.iter().map(|c| c.grid).collect();
        grid.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        grid.dedup();
        let mut methods: Vec<&str> = Vec::new();
        for c in &rows {
            if !methods.contains(&c.method) {
                methods.push(c.method);
            }
        }
        Self {
            rows,
            grid,
            methods,
            seeds,
        }
    }

    /// Every seed's row of method `m` at grid point `g`.
    fn at(&self, g: &GridPoint, m: &str) -> Vec<&CurveRow<'a>> {
        self.rows
            .iter()
            .filter(|c| c.grid == *g && c.method == m)
            .collect()
    }

    /// The row of method `m` at grid point `g` for `seed`.
    fn pick(&self, g: &GridPoint, m: &str, seed: u64) -> Option<&CurveRow<'a>> {
        self.rows
            .iter()
            .find(|c| c.grid == *g && c.method == m && c.seed == seed)
    }

    /// The first hitting times of method `m` over every grid point and seed.
    fn hits(&self, m: &str) -> Vec<f64> {
        self.rows
            .iter()
            .filter(|c| c.method == m)
            .filter_map(|c| c.reached.map(|t| t as f64))
            .collect()
    }
}

/// The mean first step with E ≤ target over seeds, or `> budget` where none got there.
fn reach_cell(rows: &[&CurveRow<'_>]) -> String {
    let hits: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.reached.map(|x| x as f64))
        .collect();
    if rows.is_empty() {
        return MISSING.into();
    }
    if hits.len() == rows.len() {
        format!("{:.0}", mean(&hits))
    } else if hits.is_empty() {
        format!("> {}", rows[0].budget)
    } else {
        format!("{:.0} ({}/{} reached)", mean(&hits), hits.len(), rows.len())
    }
}

/// The grid point's first four cells: d, k, κ(Σ), σ.
fn grid_cells(g: &GridPoint) -> Vec<String> {
    vec![
        g.0.to_string(),
        g.1.to_string(),
        format!("{}", g.2),
        format!("{}", g.3),
    ]
}

/// Part 1: the fitted μ and the iterations of every method per grid point, the curves, and
/// the geometric-convergence verdict.
fn curves_part(
    section: &mut Section,
    curves: &Curves<'_>,
    config: &Config,
    figures: &Figures<'_>,
) -> Result<()> {
    let c = &config.curves;
    let table: Vec<Vec<String>> = curves
        .grid
        .iter()
        .map(|g| {
            let mu: Vec<f64> = curves
                .at(g, "algorithm")
                .iter()
                .filter_map(|r| r.mu)
                .collect();
            let mut row = grid_cells(g);
            row.push(cells::mean_std(mean_std(&mu), 3));
            row.extend(curves.methods.iter().map(|m| reach_cell(&curves.at(g, m))));
            row
        })
        .collect();
    section.paragraph(&format!(
        "**Part 1 — convergence curves.** Population gradient oracle; initialization and \
         preconditioner from n_init = {} samples; algorithm and ablations run {} steps, baselines \
         up to {}× as many. The table gives the fitted μ of the algorithm (mean ± sd over seeds) \
         and, per method, the mean first step with E ≤ {:e} (\"> budget\": never within its budget).",
        c.n_init, c.algorithm_steps, c.baseline_factor, c.target_excess
    ));
    let mut headers: Vec<String> = ["d", "k", "κ(Σ)", "σ", "μ (algorithm)"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    headers.extend(curves.methods.iter().map(|m| format!("steps: {m}")));
    let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    section.table(&header_refs, &table);
    curve_plots(section, curves, config, figures)?;
    section.paragraph(&geometric_verdict(curves, config));
    Ok(())
}

/// Part 1's plots: E_t of every method at the middle d, k = d, the last noise level and the
/// first seed, one plot per κ(Σ).
fn curve_plots(
    section: &mut Section,
    curves: &Curves<'_>,
    config: &Config,
    figures: &Figures<'_>,
) -> Result<()> {
    let c = &config.curves;
    let (Some(&d_mid), Some(&noise)) = (c.dims.get(c.dims.len() / 2), c.noise.last()) else {
        return Ok(());
    };
    let k_plot = if c.k_equals_d.contains(&true) {
        d_mid
    } else {
        1
    };
    let seed = curves.seeds[0];
    for &ks in &c.kappa_sigma {
        let mut plot = LinePlot::new(
            &format!("E_t, d = {d_mid}, k = {k_plot}, κ(Σ) = {ks}, σ = {noise} (seed {seed})"),
            "step t + 1",
            "population excess E",
        )
        .log_x()
        .log_y();
        let mut any = false;
        for m in &curves.methods {
            if let Some(row) = curves.pick(&(d_mid, k_plot, ks, noise), m, seed) {
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
            let alt = format!("E_t at κ(Σ) = {ks}");
            figures.add(
                section,
                &alt,
                &plot,
                &format!("curves_kappa_sigma_{ks}.png"),
            )?;
        }
    }
    Ok(())
}

/// T7: the algorithm reached the target with a log-linear tail in every run.
fn geometric_verdict(curves: &Curves<'_>, config: &Config) -> String {
    let (mut geo_ok, mut geo_total) = (0, 0);
    let mut mus = Vec::new();
    for g in &curves.grid {
        let alg = curves.at(g, "algorithm");
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
        mus.extend(alg.iter().filter_map(|r| r.mu));
    }
    let (mu_lo, mu_hi) = min_max(&mus);
    claim(
        "geometric convergence (T7 on the grid).",
        geo_total > 0 && geo_ok == geo_total,
        "Did not hold everywhere.",
        &format!(
            "The algorithm reached E ≤ {:e} with a log-linear tail (μ < 1, R² > 0.9) in {geo_ok} \
             of {geo_total} runs; fitted μ ranged over [{mu_lo:.3}, {mu_hi:.3}].",
            config.curves.target_excess
        ),
    )
}

/// Part 4's count: the table rows, the pairs that met the goal, all pairs, and the ratios
/// algorithm/best baseline where a baseline reached the target.
#[derive(Default)]
struct Iterations {
    rows: Vec<Vec<String>>,
    held: usize,
    total: usize,
    ratios: Vec<f64>,
}

impl Iterations {
    fn new(curves: &Curves<'_>) -> Self {
        let baselines: Vec<&str> = curves
            .methods
            .iter()
            .copied()
            .filter(|m| !METHODS_ALG.contains(m))
            .collect();
        let mut it = Self::default();
        for g in &curves.grid {
            for &seed in &curves.seeds {
                it.add(curves, &baselines, g, seed);
            }
        }
        it
    }

    /// The algorithm against the best baseline at one grid point for one seed.
    fn add(&mut self, curves: &Curves<'_>, baselines: &[&str], g: &GridPoint, seed: u64) {
        let Some(alg) = curves.pick(g, "algorithm", seed) else {
            return;
        };
        let mut best: Option<(&str, usize)> = None;
        let mut budget = 0;
        for b in baselines {
            if let Some(row) = curves.pick(g, b, seed) {
                budget = budget.max(row.budget);
                if let Some(t) = row.reached {
                    if best.is_none_or(|(_, bt)| t < bt) {
                        best = Some((b, t));
                    }
                }
            }
        }
        self.total += 1;
        let (verdict, ratio_s) = match (alg.reached, best) {
            (Some(a), Some((_, b))) => {
                let ratio = a.max(1) as f64 / b.max(1) as f64;
                self.ratios.push(ratio);
                let ok = ratio <= 0.01;
                self.held += usize::from(ok);
                (held(ok), format!("{ratio:.3}"))
            }
            (Some(_), None) => {
                self.held += 1;
                ("held (no baseline within budget)", "< 0.01".into())
            }
            (None, _) => ("did not hold (algorithm did not reach)", MISSING.into()),
        };
        let mut row = grid_cells(g);
        row.extend([
            seed.to_string(),
            alg.reached
                .map_or(format!("> {}", alg.budget), |t| t.to_string()),
            best.map_or(format!("none within {budget}"), |(m, t)| {
                format!("{t} ({m})")
            }),
            ratio_s,
            verdict.to_string(),
        ]);
        self.rows.push(row);
    }
}

/// Part 4: iterations to the target, the algorithm against the best baseline, and T12.
fn iterations_part(section: &mut Section, curves: &Curves<'_>, config: &Config) {
    let c = &config.curves;
    let it = Iterations::new(curves);
    section.paragraph(&format!(
        "**Part 4 — iterations to E ≤ {:e}.** First hitting times (Adam is not monotone: a first \
         hit is the most favourable reading for it). Goal: the algorithm needs ≤ 1/100 of the best \
         baseline's iterations, or no baseline gets there within {}× the algorithm's budget.",
        c.target_excess, c.baseline_factor
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
        &it.rows,
    );
    let (rmin, rmax) = min_max(&it.ratios);
    let median = upper_median(&it.ratios).unwrap_or(f64::NAN);
    let (held, total) = (it.held, it.total);
    section.paragraph(&claim(
        "≤ 1/100 of the best baseline's iterations.",
        held == total && total > 0,
        "Did not hold.",
        &format!(
            "The goal was met in {held} of {total} (grid point, seed) pairs; where a baseline \
             reached the target, the ratio algorithm/best baseline ranged over [{rmin:.3}, \
             {rmax:.3}] (median {median:.3})."
        ),
    ));
    section.paragraph(&t12(curves, config));
}

/// T12: does plain GD from a random initialization stall?
fn t12(curves: &Curves<'_>, config: &Config) -> String {
    let runs = curves
        .rows
        .iter()
        .filter(|c| c.method == "gd-random")
        .count();
    let reached = curves.hits("gd-random");
    format!(
        "*Observation T12 (random-init plain GD stalls?).* Plain GD from a {}-scale random \
         initialization reached E ≤ {:e} within its budget in {} of {} runs (mean {:.0} steps when \
         it did, against {:.0} for the algorithm); in the others it was still descending when the \
         budget ran out. At the population level this is slow progress (ill-conditioning in κ(Σ)² \
         and an escape from the saddle at 0), not a stall at a spurious point.",
        config.curves.random_init_scale,
        config.curves.target_excess,
        reached.len(),
        runs,
        mean(&reached),
        mean(&curves.hits("algorithm")),
    )
}

/// A completed sweep draw: (case, n, E init, E final, finite init, finite final).
type SweepRow = (usize, usize, f64, f64, f64, f64);

/// A labelled accessor of a sweep draw.
type Quantity = (&'static str, fn(&SweepRow) -> f64);

/// The four errors of part 2; the odd ones (after GD) are the ones the claim is about.
const QUANTITIES: [Quantity; 4] = [
    ("E at spectral init", |s| s.2),
    ("E after GD on L̂_n", |s| s.3),
    ("finite-context excess at init", |s| s.4),
    ("finite-context excess after GD", |s| s.5),
];

/// The completed draws of the sample-size sweep.
fn sweep_rows(records: &[(u64, Record)]) -> Vec<SweepRow> {
    records
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
        .collect()
}

/// The log-log slope of n⁻² log⁶ n between the smallest and the largest n (its secant).
fn secant_slope(ns: &[usize]) -> f64 {
    let (lo, hi) = (
        ns.iter().min().copied().unwrap_or(1) as f64,
        ns.iter().max().copied().unwrap_or(2) as f64,
    );
    let f = |n: f64| (n.powi(-2) * n.ln().powi(6)).ln();
    (f(hi) - f(lo)) / (hi.ln() - lo.ln())
}

/// Residual sum of squares of log v = c + log f(n) with the best constant c.
fn sse_fixed_shape(points: &[(f64, f64)], shape: impl Fn(f64) -> f64) -> f64 {
    let r: Vec<f64> = points.iter().map(|&(n, lv)| lv - shape(n).ln()).collect();
    let mean = r.iter().sum::<f64>() / r.len().max(1) as f64;
    r.iter().map(|x| (x - mean).powi(2)).sum()
}

/// One error's fit against n for one case.
struct Fit {
    /// (n, error) of every draw with a positive finite error.
    points: Vec<(f64, f64)>,
    /// log error against log n.
    line: Option<LineFit>,
    /// Residuals of the fixed-shape fits 1/n and n⁻² log⁶ n.
    sse_1n: f64,
    sse_2: f64,
}

impl Fit {
    /// `None` when no draw of the case has a positive finite error.
    fn new(sweeps: &[SweepRow], case: usize, get: fn(&SweepRow) -> f64) -> Option<Self> {
        let points: Vec<(f64, f64)> = sweeps
            .iter()
            .filter(|s| s.0 == case)
            .map(|s| (s.1 as f64, get(s)))
            .filter(|p| p.1 > 0.0 && p.1.is_finite())
            .collect();
        if points.is_empty() {
            return None;
        }
        let logpts: Vec<(f64, f64)> = points.iter().map(|&(n, v)| (n.ln(), v.ln())).collect();
        let log_v: Vec<(f64, f64)> = points.iter().map(|&(n, v)| (n, v.ln())).collect();
        Some(Self {
            line: fit_line(&logpts),
            sse_1n: sse_fixed_shape(&log_v, |n| 1.0 / n),
            sse_2: sse_fixed_shape(&log_v, |n| n.powi(-2) * n.ln().powi(6)),
            points,
        })
    }

    /// The slope cell and the reading of the fit.
    fn cells(&self) -> (String, String) {
        let Some(l) = &self.line else {
            return (MISSING.into(), "too few points".into());
        };
        let (lo, hi) = (l.slope - l.half_width, l.slope + l.half_width);
        let one_over_n = (lo..=hi).contains(&-1.0);
        let (sse_1n, sse_2) = (self.sse_1n, self.sse_2);
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
}

/// What the claim of part 2 reads from one error after GD of one case.
struct SlopeVerdict {
    case: SweepCase,
    /// σ_max(T).
    t1: f64,
    label: &'static str,
    /// (slope, half-width).
    line: Option<(f64, f64)>,
    favours_1n: bool,
}

/// Part 2: the errors against n, their slopes, the means per n, and the 1/n verdict.
fn sample_size_part(
    section: &mut Section,
    records: &[(u64, Record)],
    sw: &SweepConfig,
    figures: &Figures<'_>,
) -> Result<()> {
    let sweeps = sweep_rows(records);
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
        secant_slope(&sw.n)
    ));
    let mut rows = Vec::new();
    let mut verdicts = Vec::new();
    for (ci, case) in sw.cases.iter().enumerate() {
        sweep_case(
            section,
            (ci, case),
            sw,
            &sweeps,
            figures,
            (&mut rows, &mut verdicts),
        )?;
    }
    section.table(
        &["case", "error", "points", "log-log slope [95%]", "reading"],
        &rows,
    );
    sweep_means_table(section, sw, &sweeps);
    section.paragraph(&sample_size_verdict(sw, &verdicts));
    Ok(())
}

/// Part 2 for one case: its plot (means per n and fitted lines), its table rows and the
/// verdicts of its errors after GD.
fn sweep_case(
    section: &mut Section,
    (ci, case): (usize, &SweepCase),
    sw: &SweepConfig,
    sweeps: &[SweepRow],
    figures: &Figures<'_>,
    (rows, verdicts): (&mut Vec<Vec<String>>, &mut Vec<SlopeVerdict>),
) -> Result<()> {
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
    let mut ns: Vec<usize> = sweeps.iter().filter(|s| s.0 == ci).map(|s| s.1).collect();
    ns.sort_unstable();
    ns.dedup();
    for (qi, (label, get)) in QUANTITIES.iter().enumerate() {
        let Some(fit) = Fit::new(sweeps, ci, *get) else {
            continue;
        };
        let after_gd = qi == 1 || qi == 3;
        plot = fit_series(plot, &fit, &ns, label, after_gd);
        let (slope, reading) = fit.cells();
        rows.push(vec![
            format!("d = {}, k = {}, σ_max(T) = {t1:.2}", case.d, case.k),
            label.to_string(),
            fit.points.len().to_string(),
            slope,
            reading,
        ]);
        if after_gd {
            verdicts.push(SlopeVerdict {
                case: case.clone(),
                t1,
                label,
                line: fit.line.as_ref().map(|l| (l.slope, l.half_width)),
                favours_1n: fit.sse_1n <= fit.sse_2,
            });
        }
    }
    let alt = format!("excess vs n, case {ci}");
    figures.add_if_drawn(section, &alt, &plot, &format!("excess_vs_n_case{ci}.png"));
    Ok(())
}

/// One error's series on a case's plot: its mean per n (points before GD, a line after), and
/// after GD its fitted line.
fn fit_series(plot: LinePlot, fit: &Fit, ns: &[usize], label: &str, after_gd: bool) -> LinePlot {
    let means: Vec<(f64, f64)> = ns
        .iter()
        .map(|&n| {
            let v: Vec<f64> = fit
                .points
                .iter()
                .filter(|p| p.0 as usize == n)
                .map(|p| p.1)
                .collect();
            (n as f64, mean(&v))
        })
        .collect();
    let mark = if after_gd { Mark::Line } else { Mark::Points };
    let plot = plot.series(label, means, mark);
    match &fit.line {
        Some(l) if after_gd => {
            let fitted: Vec<(f64, f64)> = ns
                .iter()
                .map(|&n| (n as f64, (l.intercept + l.slope * (n as f64).ln()).exp()))
                .collect();
            plot.series(
                &format!("fit: slope {:.2}", l.slope),
                fitted,
                Mark::Reference,
            )
        }
        _ => plot,
    }
}

/// Part 2's means over draws and seeds per case and n.
fn sweep_means_table(section: &mut Section, sw: &SweepConfig, sweeps: &[SweepRow]) {
    let mut rows = Vec::new();
    for (ci, case) in sw.cases.iter().enumerate() {
        for &n in &sw.n {
            let sel: Vec<_> = sweeps.iter().filter(|s| s.0 == ci && s.1 == n).collect();
            if sel.is_empty() {
                continue;
            }
            let m = |f: fn(&SweepRow) -> f64| {
                format!(
                    "{:.2e}",
                    mean(&sel.iter().map(|s| f(s)).collect::<Vec<_>>())
                )
            };
            rows.push(vec![
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
        &rows,
    );
}

/// T9: the final excess falls like 1/n, read per case from the errors after GD.
fn sample_size_verdict(sw: &SweepConfig, verdicts: &[SlopeVerdict]) -> String {
    let secant = secant_slope(&sw.n);
    let text: Vec<String> = verdicts.iter().map(|v| slope_text(v, secant)).collect();
    let all_1n = verdicts.iter().all(|v| {
        v.line
            .is_some_and(|(s, hw)| (s - hw..=s + hw).contains(&-1.0))
    });
    claim(
        "the final excess falls like 1/n (T9).",
        all_1n && !verdicts.is_empty(),
        "Did not hold in every case.",
        &format!("{}.", text.join("; ")),
    )
}

/// One error's reading: its slope against −1 and against n⁻² log⁶ n's secant slope, and whether
/// the softmax average has a finite variance at the optimum.
fn slope_text(v: &SlopeVerdict, secant: f64) -> String {
    let (case, label) = (&v.case, v.label);
    let s = match v.line {
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
                if v.favours_1n {
                    ", and 1/n fits better than n⁻² log⁶ n"
                } else {
                    ", and n⁻² log⁶ n fits better than 1/n"
                }
            )
        }
        None => format!("d = {}, k = {}, {label}: no fit", case.d, case.k),
    };
    let both = v.line.is_some_and(|(s, hw)| {
        (s - hw..=s + hw).contains(&-1.0) && (s - hw..=s + hw).contains(&secant)
    });
    let s = if both {
        format!("{s} — the interval also contains n⁻² log⁶ n's secant slope {secant:.2}, so the slope alone cannot tell the two laws apart")
    } else {
        s
    };
    format!(
        "{s} (2σ_max(T) = {:.2}: the softmax average's variance E exp(‖Σ^{{1/2}}B*ᵀx‖²) is {} at the balanced optimum)",
        2.0 * v.t1,
        if 2.0 * v.t1 < 1.0 { "finite" } else { "infinite" }
    )
}

/// Part 3's fitted rates: (κ(T), κ(Σ), with the preconditioner, μ).
struct Rates(Vec<(f64, f64, bool, Option<f64>)>);

impl Rates {
    fn new(records: &[(u64, Record)]) -> Self {
        Self(
            records
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
                .collect(),
        )
    }

    /// The mean over seeds of 1 − μ at (κ(T), κ(Σ)), with or without the preconditioner.
    fn mean_gap(&self, kt: f64, ks: f64, pre: bool) -> Option<f64> {
        let v: Vec<f64> = self
            .0
            .iter()
            .filter(|r| r.0 == kt && r.1 == ks && r.2 == pre)
            .filter_map(|r| r.3.map(|m| 1.0 - m))
            .collect();
        (!v.is_empty()).then(|| mean(&v))
    }

    /// The largest ratio over κ(T) of the largest to the smallest 1 − μ across κ(Σ) (1 when no
    /// κ(T) has two).
    fn spread(&self, rc: &RatesConfig, pre: bool) -> f64 {
        rc.kappa_t
            .iter()
            .filter_map(|&kt| {
                let g: Vec<f64> = rc
                    .kappa_sigma
                    .iter()
                    .filter_map(|&ks| self.mean_gap(kt, ks, pre))
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
    }

    /// The log-log slope of 1 − μ against κ(T) at κ(Σ) = `ks`.
    fn slope_in_kappa_t(&self, rc: &RatesConfig, pre: bool, ks: f64) -> Option<f64> {
        let pts: Vec<(f64, f64)> = rc
            .kappa_t
            .iter()
            .filter_map(|&kt| self.mean_gap(kt, ks, pre).map(|g| (kt.ln(), g.ln())))
            .collect();
        fit_line(&pts).map(|l| l.slope)
    }
}

/// Part 3: μ against κ(T) and κ(Σ), with and without the preconditioner, and the T8 verdict.
fn rates_part(
    section: &mut Section,
    records: &[(u64, Record)],
    rc: &RatesConfig,
    figures: &Figures<'_>,
) {
    let rates = Rates::new(records);
    let mut rows = Vec::new();
    for &kt in &rc.kappa_t {
        let mut row = vec![format!("{kt}")];
        for &ks in &rc.kappa_sigma {
            for pre in [true, false] {
                let mu = rates.mean_gap(kt, ks, pre).map(|g| 1.0 - g);
                row.push(or_missing(mu, |x| fixed(x, 4)));
            }
        }
        rows.push(row);
    }
    let mut headers: Vec<String> = vec!["κ(T)".into()];
    for &ks in &rc.kappa_sigma {
        headers.push(format!("μ κ(Σ)={ks} precond."));
        headers.push(format!("μ κ(Σ)={ks} plain"));
    }
    section.paragraph(&format!(
        "**Part 3 — μ against κ(T) and κ(Σ).** d = k = {}, population oracle, {} steps with the \
         preconditioner and {} without (ablation `no-preconditioner`: same regularizer and \
         renormalization, Euclidean gradients and η = 0.2/(σ_max(T̂)·max(λ_max, λ_max²))). μ is \
         fitted on the tail of E_t; mean over seeds.",
        rc.d, rc.steps, rc.plain_steps
    ));
    let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    section.table(&header_refs, &rows);
    rate_plots(section, rc, &rates, figures);
    section.paragraph(&rates_verdict(rc, &rates));
}

/// Part 3's plots: 1 − μ against κ(T) (a line per κ(Σ)) and against κ(Σ) (a line per κ(T)).
fn rate_plots(section: &mut Section, rc: &RatesConfig, rates: &Rates, figures: &Figures<'_>) {
    let against_t = rate_plot(
        ("κ(T)", &rc.kappa_t),
        ("κ(Σ)", &rc.kappa_sigma),
        ["preconditioned", "plain"],
        |kt, ks, pre| rates.mean_gap(kt, ks, pre),
    );
    figures.add_if_drawn(
        section,
        "1 − μ against κ(T)",
        &against_t,
        "rate_vs_kappa_t.png",
    );
    let against_sigma = rate_plot(
        ("κ(Σ)", &rc.kappa_sigma),
        ("κ(T)", &rc.kappa_t),
        ["precond.", "plain"],
        |ks, kt, pre| rates.mean_gap(kt, ks, pre),
    );
    let file = "rate_vs_kappa_sigma.png";
    figures.add_if_drawn(section, "1 − μ against κ(Σ)", &against_sigma, file);
}

/// 1 − μ (`gap(x, line, preconditioned)`) against the values `x` of one conditioning, a line
/// per value of the other and per preconditioner setting (`kinds`: the names of with and
/// without), log-log.
fn rate_plot(
    (x_name, xs): (&str, &[f64]),
    (line_name, lines): (&str, &[f64]),
    kinds: [&str; 2],
    gap: impl Fn(f64, f64, bool) -> Option<f64>,
) -> LinePlot {
    let mut plot = LinePlot::new(&format!("1 − μ against {x_name}"), x_name, "1 − μ")
        .log_x()
        .log_y();
    for &line in lines {
        for (pre, kind) in [(true, kinds[0]), (false, kinds[1])] {
            let pts: Vec<(f64, f64)> = xs
                .iter()
                .filter_map(|&x| gap(x, line, pre).map(|g| (x, g)))
                .collect();
            let mark = if pre { Mark::Line } else { Mark::Points };
            plot = plot.series(&format!("{line_name} = {line}, {kind}"), pts, mark);
        }
    }
    plot
}

/// T8: with the preconditioner, 1 − μ barely moves across κ(Σ); without it, it moves a lot.
fn rates_verdict(rc: &RatesConfig, rates: &Rates) -> String {
    let (sp_pre, sp_plain) = (rates.spread(rc, true), rates.spread(rc, false));
    let ks0 = rc.kappa_sigma.first().copied().unwrap_or(1.0);
    let slope = rates.slope_in_kappa_t(rc, true, ks0);
    claim(
        "the preconditioned rate does not depend on κ(Σ) (T8).",
        sp_pre < 1.5 && sp_plain > 10.0 * sp_pre,
        "Did not hold.",
        &format!(
            "Across κ(Σ) ∈ {:?}, 1 − μ varied by at most a factor {sp_pre:.2} with the \
             preconditioner and by up to a factor {sp_plain:.1} without it. The κ(T) dependence \
             remains: log(1 − μ) against log κ(T) has slope {} with the preconditioner at κ(Σ) = \
             {ks0} (−1 would be 1 − μ ∝ 1/κ(T), the usual first-order rate; a ScaledGD factor, \
             not implemented, would remove it).",
            rc.kappa_sigma,
            or_missing(slope, |x| fixed(x, 2)),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secant_slope_of_n_minus_two_log_six_is_near_minus_one_point_one() {
        let s = secant_slope(&[250, 1000, 16000]);
        assert!(s > -1.3 && s < -1.0, "{s}");
    }
}
