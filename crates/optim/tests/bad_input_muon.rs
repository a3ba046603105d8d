//! Bad input over every public entry point of kappa-optim's Muon side (msign, Muon, momentum,
//! manifold Muon on Stiefel, DGram and Oblique with every dual-ascent preset, the spectral-norm estimate,
//! the configs): seeded hostile matrices (`kappa_testkit::hostile`: NaN/±∞, empty, 1×1, zero,
//! rank one, 1e±300, subnormal and near-`f64::MAX` scales, mismatched shapes) in every memory
//! layout (including negative strides), and out-of-range parameters. Each call runs under
//! `Fuzz::check` (deadline, caught panics) and its answer is checked: the right typed error naming
//! the caller's argument, or a documented finite value. Fixed seeds: the same calls every run.
//! ≈ 10,000 calls; a few seconds in release.

use kappa_linalg::{singular_values, SvdDriver, MUON_QUINTIC};
use kappa_optim::manifold::*;
use kappa_optim::*;
use kappa_testkit::hostile::{matrices, Fuzz, Layout as MemLayout};
use ndarray::Array2;

type Check = std::result::Result<(), String>;

/// The argument an error names (every variant with an argument spells it `arg: "…"`).
fn arg_of(e: &OptimError) -> Option<String> {
    let d = format!("{e:?}");
    let i = d.find("arg: \"")? + 6;
    Some(d[i..].split('"').next()?.to_string())
}

fn expect_arg<T>(r: &kappa_optim::Result<T>, want: &str) -> Check {
    match r {
        Err(e) if arg_of(e).as_deref() == Some(want) => Ok(()),
        Err(e) => Err(format!(
            "error names {:?}, expected `{want}`: {e}",
            arg_of(e)
        )),
        Ok(_) => Err(format!("Ok, expected an error naming `{want}`")),
    }
}

/// Empty or with a non-finite entry: every entry point must refuse it.
fn bad(a: &Array2<f64>) -> bool {
    a.is_empty() || a.iter().any(|x| !x.is_finite())
}

/// x ≤ hi, false for NaN.
fn at_most(x: f64, hi: f64) -> bool {
    x <= hi
}

fn finite(a: &Array2<f64>) -> bool {
    a.iter().all(|x| x.is_finite())
}

/// σ₁ of a finite matrix at any scale: exact power-of-two scaling to max |a| ∈ [0.5, 1).
fn sigma1(a: &Array2<f64>) -> f64 {
    let m = a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    if m == 0.0 {
        return 0.0;
    }
    let k = -(m.log2().floor() as i32) - 1;
    let (h1, h2) = (2f64.powi(k / 2), 2f64.powi(k - k / 2));
    let y = Array2::from_shape_fn(a.dim(), |(i, j)| a[[i, j]] * h1 * h2);
    let s = singular_values(y.view(), SvdDriver::QrIteration).unwrap()[0];
    s / h1 / h2
}

/// Hostile matrices of three shapes (tall, wide, square), each in every memory layout.
fn inputs(seed: u64) -> Vec<(String, Array2<f64>)> {
    let mut out = Vec::new();
    for (i, (r, c)) in [(6, 4), (4, 6), (5, 5)].into_iter().enumerate() {
        for (name, a) in matrices(seed + i as u64, r, c) {
            for layout in MemLayout::ALL {
                let laid = layout.lay_out(&a);
                out.push((format!("{name} {r}×{c} {layout:?}"), laid.view().to_owned()));
            }
        }
    }
    out
}

fn methods() -> Vec<Msign> {
    vec![
        Msign::Exact,
        Msign::MuonQuintic,
        Msign::muon_reference(),
        Msign::MuonQuinticEps { eps: 0.0 },
        Msign::MuonQuinticEps { eps: 1e300 },
        Msign::torch_muon(),
        Msign::MuonQuinticClamp { eps: 0.0 },
        Msign::MuonQuinticClamp { eps: 1e300 },
        Msign::polar_express(),
        Msign::PolarExpress { steps: 1 },
        Msign::PolarExpress { steps: 0 },
        Msign::gram_polar_express(),
        Msign::GramPolarExpress {
            steps: 10,
            restart: 1,
        },
        Msign::GramPolarExpress {
            steps: 3,
            restart: usize::MAX,
        },
        Msign::GramPolarExpress {
            steps: 0,
            restart: 2,
        },
        Msign::GramPolarExpress {
            steps: 10,
            restart: 0,
        },
        Msign::MuonQuinticEps { eps: f64::NAN },
        Msign::MuonQuinticEps { eps: -1.0 },
        Msign::MuonQuinticClamp { eps: f64::NAN },
        Msign::MuonQuinticClamp { eps: -1.0 },
    ]
}

/// The argument an invalid method is reported as, `None` when it is valid.
fn method_arg(m: Msign) -> Option<&'static str> {
    match m {
        Msign::PolarExpress { steps: 0 } | Msign::GramPolarExpress { steps: 0, .. } => {
            Some("msign")
        }
        Msign::GramPolarExpress { restart: 0, .. } => Some("msign.restart"),
        Msign::MuonQuinticEps { eps } | Msign::MuonQuinticClamp { eps }
            if !(eps.is_finite() && eps >= 0.0) =>
        {
            Some("msign.eps")
        }
        _ => None,
    }
}

/// The documented bound on msign's output singular values.
fn sigma_bound(m: Msign) -> f64 {
    match m {
        Msign::Exact => 1.0 + 1e-8,
        Msign::PolarExpress { .. } | Msign::GramPolarExpress { .. } => 1.0 + 1e-5,
        // The quintic p has max 1.2023 on [0, 1.25] (at x ≈ 0.5546) and maps [0, 1.2023] into
        // itself (p > 0 there), so every iterate of a normalized input stays below it; the band
        // [0.68, 1.1344] holds only above the threshold σ/‖X‖_F ≥ 0.0052.
        _ => quintic_max() + 1e-9,
    }
}

fn quintic_max() -> f64 {
    (0..=125_000)
        .map(|i| MUON_QUINTIC.eval(i as f64 * 1e-5))
        .fold(0.0, f64::max)
}

fn msign_calls(fuzz: &mut Fuzz) {
    let precisions = [
        Precision::Native,
        Precision::Auto,
        Precision::F32,
        Precision::Bf16,
    ];
    for (name, x) in inputs(1) {
        for method in methods() {
            for p in precisions {
                let (x, name) = (x.clone(), name.clone());
                fuzz.check(format!("msign({name}, {method:?}, {p:?})"), move || {
                    let r = msign(&x, method, p);
                    if let Some(a) = method_arg(method) {
                        return expect_arg(&r, a);
                    }
                    if bad(&x) {
                        return expect_arg(&r, "x");
                    }
                    if matches!(p, Precision::F32 | Precision::Bf16) {
                        return expect_arg(&r, "precision");
                    }
                    let q = r.map_err(|e| e.to_string())?;
                    if q.dim() != x.dim() || !finite(&q) {
                        return Err(format!("shape {:?} or non-finite output", q.dim()));
                    }
                    let s = sigma1(&q);
                    // (Polar Express's bound is documented for its full 10-step schedule.)
                    let partial = matches!(method, Msign::PolarExpress { steps } | Msign::GramPolarExpress { steps, .. } if steps < 10);
                    if s > sigma_bound(method) && !partial {
                        return Err(format!("σ₁ = {s}"));
                    }
                    if x.iter().all(|v| *v == 0.0) && q.iter().any(|v| *v != 0.0) {
                        return Err("msign(0) ≠ 0".into());
                    }
                    // Scale-safe: a full-rank unit-Frobenius input gives σ ≈ 1 at every scale.
                    let full_rank = name.starts_with("gaussian") && !name.contains("subnormal");
                    let full_pe = method == Msign::polar_express() || method == Msign::gram_polar_express();
                    if full_pe && full_rank && !at_most(0.99, s) {
                        return Err(format!("σ₁ = {s}: collapsed"));
                    }
                    Ok(())
                });
            }
        }
    }
}

fn muon_configs() -> Vec<MuonConfig> {
    let mut out = Vec::new();
    for lr in [
        f64::NAN,
        -1.0,
        0.0,
        0.02,
        1e4,
        1e32,
        1e33,
        f64::MAX,
        f64::INFINITY,
    ] {
        for wd in [f64::NAN, -0.1, 0.0, 0.1, 1e3] {
            for beta in [f64::NAN, -0.1, 0.0, 0.95, 1.0] {
                for msign in [Msign::polar_express(), Msign::PolarExpress { steps: 0 }] {
                    let mut momentum = Momentum::keller();
                    momentum.beta = beta;
                    out.push(MuonConfig {
                        lr,
                        weight_decay: wd,
                        momentum,
                        msign,
                        ..MuonConfig::paper()
                    });
                }
            }
        }
    }
    out
}

/// The argument `MuonConfig::validate` must name, in its order of checks.
fn muon_config_arg(c: &MuonConfig) -> Option<&'static str> {
    let ok = |x: f64, lo: f64, hi: f64| x.is_finite() && x >= lo && x <= hi;
    if !ok(c.lr, 0.0, MuonConfig::MAX_LR) {
        Some("lr")
    } else if !ok(c.weight_decay, 0.0, f64::MAX) || c.lr * c.weight_decay > 1.0 {
        Some("weight_decay")
    } else if !ok(c.momentum.beta, 0.0, 1.0 - f64::EPSILON) {
        Some("momentum.beta")
    } else {
        method_arg(c.msign)
    }
}

fn config_calls(fuzz: &mut Fuzz) {
    for c in muon_configs() {
        fuzz.check(format!("Muon::new({c:?})"), move || {
            let r = Muon::new(c);
            match muon_config_arg(&c) {
                Some(a) => expect_arg(&r, a),
                None => r.map(|_| ()).map_err(|e| e.to_string()),
            }
        });
        fuzz.check(format!("Muon::set_lr({})", c.lr), move || {
            let mut m = Muon::new(MuonConfig::paper()).unwrap();
            let r = m.set_lr(c.lr);
            let want = muon_config_arg(&MuonConfig {
                lr: c.lr,
                ..MuonConfig::paper()
            });
            match want {
                Some(a) => expect_arg(&r, a).and_then(|_| {
                    (m.config().lr == 0.02)
                        .then_some(())
                        .ok_or("lr changed".into())
                }),
                None => r.map_err(|e| e.to_string()),
            }
        });
    }
    let mut duals = Vec::new();
    for alpha in [f64::NAN, 0.0, 0.1, f64::MAX] {
        for steps in [0usize, 1, 20] {
            for tol in [f64::NAN, -1.0, 1e-6] {
                for normalize in [None, Some(0.0), Some(0.3), Some(f64::INFINITY)] {
                    for divergence_factor in [0.5, 2.0, f64::NAN] {
                        duals.push(DualAscent {
                            alpha,
                            steps,
                            tol,
                            normalize,
                            divergence_factor,
                            ..DualAscent::paper()
                        });
                    }
                }
            }
        }
    }
    for dual in duals {
        for (lr, tol) in [(0.02, 0.05), (f64::NAN, 0.05), (1e33, 0.05), (0.02, -1.0)] {
            let cfg = ManifoldMuonConfig {
                lr,
                manifold_tol: tol,
                dual,
                ..ManifoldMuonConfig::paper(Manifold::Stiefel)
            };
            fuzz.check(format!("ManifoldMuon::new({cfg:?})"), move || {
                let r = ManifoldMuon::new(cfg);
                let d = &cfg.dual;
                let ok = |x: f64, lo: f64| x.is_finite() && x >= lo;
                let want = if !(ok(cfg.lr, 0.0) && cfg.lr <= MuonConfig::MAX_LR) {
                    Some("lr")
                } else if !ok(cfg.manifold_tol, 0.0) {
                    Some("manifold_tol")
                } else if !ok(d.alpha, f64::MIN_POSITIVE) {
                    Some("dual.alpha")
                } else if !ok(d.tol, 0.0) {
                    Some("dual.tol")
                } else if !ok(d.divergence_factor, 1.0) {
                    Some("dual.divergence_factor")
                } else if d.steps == 0 {
                    Some("dual.steps")
                } else if d.normalize.is_some_and(|t| !ok(t, f64::MIN_POSITIVE)) {
                    Some("dual.normalize")
                } else {
                    None
                };
                match want {
                    Some(a) => expect_arg(&r, a),
                    None => r.map(|_| ()).map_err(|e| e.to_string()),
                }
            });
        }
    }
}

/// The argument a step must name for (w, grad, buffer), in `check_step_inputs`' order.
fn step_arg(w: &Array2<f64>, g: &Array2<f64>, buf: Option<&Array2<f64>>) -> Option<&'static str> {
    if bad(w) {
        Some("w")
    } else if g.dim() != w.dim() || bad(g) {
        Some("grad")
    } else if buf.is_some_and(|b| b.dim() != w.dim() || bad(b)) {
        Some("state")
    } else {
        None
    }
}

fn muon_step_calls(fuzz: &mut Fuzz) {
    let ins = inputs(2);
    let cfgs = [
        MuonConfig::keller(),
        MuonConfig::paper(),
        MuonConfig {
            msign: Msign::Exact,
            lr: MuonConfig::MAX_LR,
            ..MuonConfig::keller()
        },
    ];
    for (i, (name, w)) in ins.iter().enumerate().step_by(2) {
        let (gname, g) = &ins[(i * 7 + 3) % ins.len()];
        let same = Array2::from_elem(w.dim(), 0.25);
        let nan_buf = Array2::from_elem(w.dim(), f64::NAN);
        let cases = [
            (gname.clone(), g.clone(), None),
            ("matching".to_string(), same.clone(), None),
            (
                "matching, NaN buffer".to_string(),
                same.clone(),
                Some(nan_buf),
            ),
            (
                "matching, 1×1 buffer".to_string(),
                same,
                Some(Array2::zeros((1, 1))),
            ),
        ];
        for (gname, g, buf) in cases {
            for cfg in cfgs {
                let (w, g, buf) = (w.clone(), g.clone(), buf.clone());
                fuzz.check(format!("Muon::step({name}, {gname})"), move || {
                    let muon = Muon::new(cfg).map_err(|e| e.to_string())?;
                    let mut w1 = w.clone();
                    let mut st = MuonState::from_parts(buf.clone(), 1);
                    let r = muon.step(&mut w1, &g, &mut st);
                    if let Some(a) = step_arg(&w, &g, buf.as_ref()) {
                        expect_arg(&r, a)?;
                        let same = w1.iter().zip(&w).all(|(a, b)| a == b || a.is_nan());
                        return same.then_some(()).ok_or("w modified on error".into());
                    }
                    r.map_err(|e| e.to_string())?;
                    finite(&w1).then_some(()).ok_or("non-finite w".into())
                });
            }
        }
        // Momentum::advance directly: β out of range, hostile grad and buffer.
        for beta in [f64::NAN, 0.0, 0.95, 1.0] {
            let (g, w) = (g.clone(), w.clone());
            fuzz.check(
                format!("Momentum::advance(β {beta}, {name}, {gname})"),
                move || {
                    let m = Momentum {
                        beta,
                        ..Momentum::paper()
                    };
                    let r = m.advance(Some(&w), &g);
                    if !(beta.is_finite() && (0.0..1.0).contains(&beta)) {
                        return expect_arg(&r, "momentum.beta");
                    }
                    if bad(&g) {
                        return expect_arg(&r, "grad");
                    }
                    if w.dim() != g.dim() || bad(&w) {
                        return expect_arg(&r, "buffer");
                    }
                    let (b, u) = r.map_err(|e| e.to_string())?;
                    (finite(&b) && finite(&u) || !finite(&(&w + &g)))
                        .then_some(())
                        .ok_or("non-finite momentum".into())
                },
            );
        }
    }
}

fn manifolds() -> [Manifold; 4] {
    [
        Manifold::Stiefel,
        Manifold::dgram(),
        Manifold::DGram(DGramRetraction::ColumnNorms),
        Manifold::Oblique,
    ]
}

/// The tall-orientation columns of `w` that the Oblique retraction may refuse: its floor is
/// ‖w_j‖ ≤ 2⁻⁵⁰·‖W‖_F up to the factor 2 of the scaling band (retraction.rs, "Oblique"), and
/// max|w_j| ≤ ‖w_j‖, ‖W‖_F ≤ √(mn)·max|W| ≤ 2⁵·max|W| for these ≤ 32×32 inputs, so a refused
/// column has max|w_j| ≤ 2⁻⁴⁴·max|W|; zero columns always qualify.
fn oblique_degenerate_columns(w: &Array2<f64>) -> Vec<usize> {
    let t = if w.nrows() < w.ncols() {
        w.t().to_owned()
    } else {
        w.clone()
    };
    let top = t.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    (0..t.ncols())
        .filter(|&j| {
            let c = t.column(j).iter().fold(0.0f64, |m, x| m.max(x.abs()));
            c == 0.0 || c <= top * 2f64.powi(-44)
        })
        .collect()
}

fn presets() -> [DualAscent; 5] {
    [
        DualAscent::paper(),
        DualAscent::paper().normalized(),
        DualAscent::feasible(),
        DualAscent::preconditioned_feasible(),
        DualAscent::modula(),
    ]
}

fn retract_calls(fuzz: &mut Fuzz) {
    for (name, w) in inputs(3) {
        for manifold in manifolds() {
            for msign in [Msign::Exact, Msign::polar_express()] {
                let (w, name) = (w.clone(), name.clone());
                fuzz.check(
                    format!("retract_onto({name}, {manifold:?}, {msign:?})"),
                    move || {
                        let cfg = ManifoldMuonConfig {
                            msign,
                            ..ManifoldMuonConfig::paper(manifold)
                        };
                        let opt = ManifoldMuon::new(cfg).unwrap();
                        let mut r = w.clone();
                        let res = opt.retract_onto(&mut r);
                        if bad(&w) {
                            return expect_arg(&res, "w");
                        }
                        let same = r.iter().zip(&w).all(|(a, b)| a == b);
                        let degenerate = oblique_degenerate_columns(&w);
                        match res {
                            Err(OptimError::NotRetractable { arg: "w", .. }) => {
                                same.then_some(()).ok_or("w modified on error".into())
                            }
                            // Documented: a (numerically) zero column has no Oblique direction.
                            Err(OptimError::ZeroColumn {
                                arg: "w", column, ..
                            }) if manifold == Manifold::Oblique => {
                                if !degenerate.contains(&column) {
                                    return Err(format!("ZeroColumn({column}) on a live column"));
                                }
                                same.then_some(()).ok_or("w modified on error".into())
                            }
                            Err(e) => Err(e.to_string()),
                            Ok(()) => {
                                let v = opt.violation(&r).map_err(|e| e.to_string())?;
                                if !finite(&r) || !at_most(v, cfg.manifold_tol) {
                                    return Err(format!("Ok off the manifold: violation {v}"));
                                }
                                // The documented refusals: rank-deficient W on Stiefel.
                                let rank_deficient = name.starts_with("zero")
                                    || name.starts_with("rank one") && !name.contains("1×1");
                                if manifold == Manifold::Stiefel && rank_deficient {
                                    return Err("rank-deficient W retracted onto Stiefel".into());
                                }
                                let zero_column = degenerate.iter().any(|&j| {
                                    let t = if w.nrows() < w.ncols() {
                                        w.t()
                                    } else {
                                        w.view()
                                    };
                                    t.column(j).iter().all(|x| *x == 0.0)
                                });
                                if manifold == Manifold::Oblique && zero_column {
                                    return Err("a zero column retracted onto Oblique".into());
                                }
                                Ok(())
                            }
                        }
                    },
                );
            }
        }
    }
}

/// Points on each manifold at hostile scales (DGram is a cone; Stiefel and Oblique have one
/// scale).
fn on_manifold_points(manifold: Manifold) -> Vec<(String, Array2<f64>)> {
    let mut out = Vec::new();
    for (r, c) in [(6, 4), (4, 6), (5, 5)] {
        let (_, g) = matrices(9, r, c).remove(0);
        let opt = ManifoldMuon::new(ManifoldMuonConfig {
            msign: Msign::Exact,
            ..ManifoldMuonConfig::paper(manifold)
        })
        .unwrap();
        let mut w = g;
        opt.retract_onto(&mut w).unwrap();
        out.push((format!("on-manifold {r}×{c}"), w.clone()));
        if matches!(manifold, Manifold::DGram(_)) {
            for s in [1e-300, 1e300] {
                out.push((format!("on-manifold {r}×{c} ×{s:e}"), &w * s));
            }
        }
    }
    out
}

fn manifold_step_calls(fuzz: &mut Fuzz) {
    let grads = inputs(4);
    for manifold in manifolds() {
        let points = on_manifold_points(manifold);
        for dual in presets() {
            for msign in [Msign::Exact, Msign::polar_express()] {
                let cfg = ManifoldMuonConfig {
                    msign,
                    dual,
                    keep_multiplier: true,
                    ..ManifoldMuonConfig::paper(manifold)
                };
                for (pname, w) in &points {
                    for (gname, g) in grads.iter().step_by(5) {
                        let (w, g) = (w.clone(), g.clone());
                        let label = format!("step({pname}, {gname}, {manifold:?}, {dual:?})");
                        fuzz.check(label, move || manifold_step_check(cfg, &w, &g));
                    }
                }
            }
        }
    }
}

/// One manifold step and the other per-point entry points on (w, g).
fn manifold_step_check(cfg: ManifoldMuonConfig, w: &Array2<f64>, g: &Array2<f64>) -> Check {
    let opt = ManifoldMuon::new(cfg).map_err(|e| e.to_string())?;
    let mut w1 = w.clone();
    let r = opt.step(&mut w1, g, &mut ManifoldState::new());
    let unchanged = || w1.iter().zip(w).all(|(a, b)| a == b);
    if let Some(a) = step_arg(w, g, None) {
        expect_arg(&r, a)?;
        return unchanged()
            .then_some(())
            .ok_or("w modified on error".into());
    }
    match r {
        // Documented refusals at hostile gradient scales (overflowing ascent or step).
        Err(OptimError::DualAscentDiverged { .. }) | Err(OptimError::Diverged { .. }) => {
            unchanged().then_some(()).ok_or("w modified on error")?
        }
        Err(OptimError::NotRetractable { arg: "w", .. })
        | Err(OptimError::ZeroColumn { arg: "w", .. }) => {
            unchanged().then_some(()).ok_or("w modified on error")?
        }
        Err(e) => return Err(e.to_string()),
        Ok(step) => {
            if !finite(&w1) || !at_most(step.manifold_violation, cfg.manifold_tol) {
                return Err(format!("Ok with violation {}", step.manifold_violation));
            }
            if step.direction.dim() != w.dim() || !finite(&step.direction) {
                return Err("direction of the wrong shape or non-finite".into());
            }
            let lam = step.multiplier.ok_or("no multiplier")?;
            let n = w.nrows().min(w.ncols());
            if lam.dim() != (n, n) {
                return Err(format!("multiplier {:?}", lam.dim()));
            }
            if step.dual.violations.len() != step.dual.msign_calls {
                return Err("violation history length".into());
            }
        }
    }
    // The same point through solve/direction (argument `g`) and the violation measure.
    let s = opt.solve(w, g);
    if s.is_err() && !matches!(s, Err(OptimError::DualAscentDiverged { .. })) {
        let e = s.err().unwrap();
        return Err(format!("solve: {e}"));
    }
    let v = opt.violation(w).map_err(|e| e.to_string())?;
    (v <= 1e-8)
        .then_some(())
        .ok_or(format!("on-manifold point has violation {v}"))
}

fn per_point_calls(fuzz: &mut Fuzz) {
    let ins = inputs(5);
    for (i, (name, x)) in ins.iter().enumerate() {
        let (gname, g) = &ins[(i * 11 + 5) % ins.len()];
        for squarings in [0usize, 1, 5, 100] {
            let x = x.clone();
            fuzz.check(
                format!("spectral_norm_estimate({name}, {squarings})"),
                move || {
                    let r = spectral_norm_estimate(&x, squarings);
                    if bad(&x) {
                        return expect_arg(&r, "g");
                    }
                    let est = r.map_err(|e| e.to_string())?;
                    let s = sigma1(&x);
                    let fro_bound = s * (x.nrows().min(x.ncols()) as f64).sqrt();
                    // Never below ‖G‖₂ (to rounding: 1e-12 relative), never above √rank·‖G‖₂.
                    if est >= s * (1.0 - 1e-12) && est <= fro_bound * (1.0 + 1e-12) {
                        Ok(())
                    } else {
                        Err(format!("estimate {est} vs σ₁ {s}"))
                    }
                },
            );
        }
        for manifold in manifolds() {
            let (x, g) = (x.clone(), g.clone());
            fuzz.check(
                format!("violation/solve({name}, {gname}, {manifold:?})"),
                move || {
                    let opt = ManifoldMuon::new(ManifoldMuonConfig {
                        dual: DualAscent::feasible(),
                        ..ManifoldMuonConfig::paper(manifold)
                    })
                    .unwrap();
                    let v = opt.violation(&x);
                    if bad(&x) {
                        expect_arg(&v, "w")?;
                    } else if !at_most(0.0, v.map_err(|e| e.to_string())?) {
                        return Err("violation NaN or negative".into());
                    }
                    let r = opt.solve(&x, &g);
                    if bad(&x) {
                        return expect_arg(&r, "w");
                    }
                    if g.dim() != x.dim() || bad(&g) {
                        return expect_arg(&r, "g");
                    }
                    match r {
                        Ok(s) if s.direction.dim() == x.dim() => Ok(()),
                        Ok(_) => Err("direction shape".into()),
                        Err(OptimError::DualAscentDiverged { .. }) => Ok(()),
                        Err(e) => Err(e.to_string()),
                    }
                },
            );
        }
        let (x2, g2) = (x.clone(), g.clone());
        fuzz.check(
            format!("tangent_direction({name}, {gname}, Diagonal)"),
            move || {
                let r = tangent_direction(
                    &x2,
                    &g2,
                    Projector::Diagonal,
                    &DualAscent::feasible(),
                    Msign::Exact,
                    Precision::Native,
                    true,
                );
                let want = step_arg(&x2, &g2, None).map(|a| if a == "grad" { "g" } else { a });
                match (want.or((x2.nrows() < x2.ncols()).then_some("w")), &r) {
                    (Some(a), _) => expect_arg(&r, a),
                    (None, Ok((a, _))) if a.dim() == x2.dim() => Ok(()),
                    (None, Ok(_)) => Err("direction shape".into()),
                    (None, Err(OptimError::DualAscentDiverged { .. })) => Ok(()),
                    (None, Err(e)) => Err(e.to_string()),
                }
            },
        );
        let (x, g) = (x.clone(), g.clone());
        fuzz.check(
            format!("tangent_direction/stiefel_square({name}, {gname})"),
            move || {
                let r = tangent_direction(
                    &x,
                    &g,
                    Projector::OffDiagonal,
                    &DualAscent::feasible(),
                    Msign::Exact,
                    Precision::Native,
                    true,
                );
                let want = step_arg(&x, &g, None).map(|a| if a == "grad" { "g" } else { a });
                let want = want.or((x.nrows() < x.ncols()).then_some("w"));
                match (want, &r) {
                    (Some(a), _) => expect_arg(&r, a)?,
                    (None, Ok(_)) | (None, Err(OptimError::DualAscentDiverged { .. })) => {}
                    (None, Err(e)) => return Err(e.to_string()),
                }
                let r = stiefel_square_direction(&x, &g, Msign::polar_express(), Precision::Native);
                let want = step_arg(&x, &g, None).map(|a| if a == "grad" { "g" } else { a });
                let want = want.or((x.nrows() != x.ncols()).then_some("w"));
                match (want, r) {
                    (Some(a), r) => expect_arg(&r, a),
                    // Documented: WᵀG overflows (entries near f64::MAX).
                    (None, Err(OptimError::DualAscentDiverged { .. })) => Ok(()),
                    (None, r) => r.map(|_| ()).map_err(|e| e.to_string()),
                }
            },
        );
    }
    for (m, n) in [(0usize, 0usize), (0, 5), (usize::MAX, 1), (1, usize::MAX)] {
        fuzz.check(format!("UpdateScale::factor/flops({m}, {n})"), move || {
            for s in [
                UpdateScale::None,
                UpdateScale::Original,
                UpdateScale::MatchRmsAdamw,
            ] {
                for l in [Layout::OutIn, Layout::InOut] {
                    let f = s.factor(m, n, l);
                    if !(f.is_finite() && f >= 0.0) {
                        return Err(format!("{s:?} {l:?}: {f}"));
                    }
                }
            }
            let f = Msign::polar_express().flops(m, n);
            (f >= 0.0).then_some(()).ok_or(format!("flops {f}"))
        });
    }
}

#[test]
fn every_muon_side_entry_point_survives_bad_input() {
    let mut fuzz = Fuzz::new("kappa-optim Muon side");
    msign_calls(&mut fuzz);
    config_calls(&mut fuzz);
    muon_step_calls(&mut fuzz);
    retract_calls(&mut fuzz);
    manifold_step_calls(&mut fuzz);
    per_point_calls(&mut fuzz);
    for d in fuzz.defects() {
        eprintln!("DEFECT {d}");
    }
    let calls = fuzz.finish();
    assert!(calls >= 3000, "only {calls} calls");
}

#[cfg(feature = "tch")]
#[test]
fn the_tensor_backend_survives_bad_input() {
    use kappa_linalg::tch_backend::array_from_tensor;
    use tch::{Kind, Tensor};
    // tensor_from_array refuses non-finite entries; the hostile ones are the point here.
    let tensor = |x: &Array2<f64>, kind: Kind| {
        let data: Vec<f64> = x.iter().copied().collect();
        Tensor::from_slice(&data)
            .reshape([x.nrows() as i64, x.ncols() as i64])
            .to_kind(kind)
    };
    let mut fuzz = Fuzz::new("kappa-optim Muon side, tch");
    for (name, x) in inputs(6).into_iter().step_by(4) {
        for method in [
            Msign::Exact,
            Msign::muon_reference(),
            Msign::torch_muon(),
            Msign::polar_express(),
        ] {
            for p in [Precision::Native, Precision::F32, Precision::Bf16] {
                let x = x.clone();
                fuzz.check(
                    format!("msign(f64 tensor {name}, {method:?}, {p:?})"),
                    move || {
                        if x.is_empty() {
                            return Ok(()); // tensor_from_array of an empty view: not this API's input
                        }
                        let t = tensor(&x, Kind::Double);
                        let r = msign(&t, method, p);
                        if bad(&x) {
                            return expect_arg(&r, "x");
                        }
                        let q = array_from_tensor(&r.map_err(|e| e.to_string())?)
                            .map_err(|e| e.to_string())?;
                        // bf16 carries 8 bits: its σ may exceed the f64 bound by ≈ 2⁻⁸·10.
                        let slack = if p == Precision::Bf16 { 5e-2 } else { 1e-3 };
                        let s = sigma1(&q);
                        (finite(&q) && s <= sigma_bound(method) + slack)
                            .then_some(())
                            .ok_or(format!("σ₁ = {s}"))
                    },
                );
            }
        }
        fuzz.check(format!("Muon::step(f32 tensor {name})"), move || {
            if x.is_empty() {
                return Ok(());
            }
            let mut w = tensor(&x, Kind::Float);
            let g = w.ones_like();
            let muon = Muon::new(MuonConfig {
                precision: Precision::F32,
                ..MuonConfig::paper()
            })
            .unwrap();
            let x32 = array_from_tensor(&w).unwrap();
            let r = muon.step(&mut w, &g, &mut MuonState::new());
            if bad(&x32) {
                return expect_arg(&r, "w");
            }
            r.map_err(|e| e.to_string())?;
            finite(&array_from_tensor(&w).unwrap())
                .then_some(())
                .ok_or("non-finite w".into())
        });
    }
    let calls = fuzz.finish();
    assert!(calls >= 100, "only {calls} calls");
}
