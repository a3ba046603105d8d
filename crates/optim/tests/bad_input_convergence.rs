//! Seeded bad-input run over every public entry point of `kappa_optim::convergence`: hostile
//! matrices (`kappa_testkit::hostile::matrices`: NaN/±∞, empty, 1×1, transposed shape, rank one,
//! zero, 1e±300, near `f64::MAX`, subnormal) in every memory layout, in each argument slot with
//! the other arguments valid, plus out-of-range scalars and huge dimensions. Every call must
//! return within the deadline without panicking, and its answer is checked:
//! - `Ok` values are finite (the documented contract: an error, never a NaN result);
//! - an input with a NaN or ±∞ entry is an error;
//! - an error names the argument that was bad (`ShapeMismatch`, `NonFinite`, `InvalidArgument`),
//!   or is `Overflow` (finite inputs whose products overflow) or `SingularCovariance`.

use kappa_optim::convergence::*;
use kappa_optim::{InputError, OptimError};
use kappa_testkit::hostile::{matrices, Fuzz, Layout};
use ndarray::{array, Array2};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const D: usize = 3;
const K: usize = 2;

/// The valid problem the hostile inputs are put into.
struct Base {
    model: DataModel,
    sample: Sample,
    moments: Moments,
    empirical: EmpiricalProblem,
    a: Array2<f64>,
    b: Array2<f64>,
}

fn base() -> Base {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let spec = ModelSpec {
        d: D,
        k: K,
        noise_std: 0.1,
        covariance: CovarianceSpec {
            kappa: 10.0,
            random_basis: true,
        },
        target: TargetSpec {
            nuclear_norm: 1.0,
            kappa: 2.0,
        },
    };
    let model = spec.build(&mut rng).unwrap();
    let sample = model.sample(40, &mut rng).unwrap();
    let moments = Moments::estimate(&sample).unwrap();
    let empirical = EmpiricalProblem::new(&sample, ContextMode::SelfExcluded).unwrap();
    let (a, b) = spectral_init(&moments).unwrap();
    Base {
        model,
        sample,
        moments,
        empirical,
        a: a * 1.1,
        b,
    }
}

/// Whether a value is a documented answer: every float finite.
trait Finite {
    fn finite(&self) -> bool;
}
impl Finite for f64 {
    fn finite(&self) -> bool {
        self.is_finite()
    }
}
impl Finite for Array2<f64> {
    fn finite(&self) -> bool {
        self.iter().all(|x| x.is_finite())
    }
}
impl<A: Finite, B: Finite> Finite for (A, B) {
    fn finite(&self) -> bool {
        self.0.finite() && self.1.finite()
    }
}
impl Finite for LossGrad {
    fn finite(&self) -> bool {
        self.loss.is_finite() && self.grad_a.finite() && self.grad_b.finite()
    }
}
impl Finite for PgdStep {
    fn finite(&self) -> bool {
        self.a.finite() && self.b.finite() && self.quantities.loss.is_finite()
    }
}
impl Finite for () {
    fn finite(&self) -> bool {
        true
    }
}
impl Finite for Sample {
    fn finite(&self) -> bool {
        self.x()
            .iter()
            .chain(self.y().iter())
            .all(|x| x.is_finite())
    }
}
impl Finite for Moments {
    fn finite(&self) -> bool {
        self.t_hat().finite() && self.sigma_hat_inv().finite()
    }
}
impl Finite for EmpiricalProblem {
    fn finite(&self) -> bool {
        true
    }
}
impl Finite for DataModel {
    fn finite(&self) -> bool {
        self.m().finite() && self.sigma_half().finite()
    }
}

/// Checks an answer: see the module docs. `arg` is the argument that was made hostile and
/// `non_finite` whether it holds a NaN or ±∞ entry.
fn verdict<T: Finite>(
    r: kappa_optim::Result<T>,
    arg: &str,
    non_finite: bool,
) -> Result<(), String> {
    match r {
        Ok(v) if non_finite => Err(format!(
            "Ok for a non-finite `{arg}` (finite answer: {})",
            v.finite()
        )),
        Ok(v) if !v.finite() => Err(format!("Ok with a non-finite value for `{arg}`")),
        Ok(_) => Ok(()),
        Err(
            OptimError::Input(InputError::ShapeMismatch { arg: a, .. })
            | OptimError::Input(InputError::NonFinite { arg: a, .. })
            | OptimError::Input(InputError::InvalidArgument { arg: a, .. }),
        ) if a == arg => Ok(()),
        Err(OptimError::Overflow { .. } | OptimError::SingularCovariance { .. }) if !non_finite => {
            Ok(())
        }
        // A hostile shape can change d, and then the partner argument is the one that no
        // longer fits: a shape error naming either is right.
        Err(OptimError::Input(InputError::ShapeMismatch { .. })) if !non_finite => Ok(()),
        Err(e) => Err(format!("wrong error for `{arg}`: {e}")),
    }
}

/// Runs `call` on every hostile matrix of shape rows×cols in every layout.
fn each_matrix<F>(
    fuzz: &mut Fuzz,
    what: &str,
    arg: &'static str,
    (rows, cols): (usize, usize),
    call: F,
) where
    F: Fn(ndarray::ArrayView2<'_, f64>) -> Result<(), String> + Send + Sync + Clone + 'static,
{
    for seed in 0..2 {
        for (name, m) in matrices(seed, rows, cols) {
            let non_finite = name.contains("NaN") || name.contains("inf");
            for layout in Layout::ALL {
                let laid = layout.lay_out(&m);
                let call = call.clone();
                fuzz.check(
                    format!("{what}: `{arg}` = {name} ({layout:?}, seed {seed})"),
                    move || {
                        let out = call(laid.view());
                        match out {
                            Err(e) if e == "__ok_nonfinite__" && non_finite => {
                                Err(format!("Ok for non-finite `{arg}`"))
                            }
                            other => other,
                        }
                    },
                );
            }
        }
    }
}

/// A call's verdict closure for slot `arg`: the hostile view is passed, non-finiteness read off
/// the view itself.
macro_rules! slot {
    ($fuzz:expr, $what:expr, $arg:expr, $shape:expr, |$v:ident| $body:expr) => {{
        let arg: &'static str = $arg;
        each_matrix(
            $fuzz,
            $what,
            arg,
            $shape,
            move |$v: ndarray::ArrayView2<'_, f64>| {
                let non_finite = $v.iter().any(|x| !x.is_finite());
                verdict($body, arg, non_finite)
            },
        );
    }};
}

#[test]
fn bad_input_convergence() {
    let start = std::time::Instant::now();
    let mut fuzz = Fuzz::new("kappa-optim convergence bad input");
    let bs = std::sync::Arc::new(base());
    let (kd, dd) = ((K, D), (D, D));

    let s = bs.clone();
    slot!(&mut fuzz, "Sample::new", "x", (D, 40), |v| Sample::new(
        v.to_owned(),
        s.sample.y().to_owned()
    ));
    let s = bs.clone();
    slot!(&mut fuzz, "Sample::new", "y", (K, 40), |v| Sample::new(
        s.sample.x().to_owned(),
        v.to_owned()
    ));
    slot!(&mut fuzz, "Moments::estimate", "x", (D, 40), |v| {
        let y = Array2::<f64>::ones((1, v.ncols()));
        Sample::new(v.to_owned(), y).and_then(|s| Moments::estimate(&s))
    });
    let s = bs.clone();
    slot!(&mut fuzz, "Moments::from_parts", "sigma_hat", dd, |v| {
        Moments::from_parts(v.to_owned(), s.model.m().clone(), 10)
    });
    let s = bs.clone();
    slot!(&mut fuzz, "Moments::from_parts", "m_hat", kd, |v| {
        Moments::from_parts(s.model.sigma().clone(), v.to_owned(), 10)
    });
    let s = bs.clone();
    slot!(
        &mut fuzz,
        "DataModel::new",
        "sigma",
        dd,
        |v| DataModel::new(v.to_owned(), s.model.m().clone(), 0.1)
    );
    let s = bs.clone();
    slot!(&mut fuzz, "DataModel::new", "m", kd, |v| DataModel::new(
        s.model.sigma().clone(),
        v.to_owned(),
        0.1
    ));
    let s = bs.clone();
    slot!(&mut fuzz, "Moments::whiten", "a", kd, |v| s
        .moments
        .whiten(v, s.b.view()));
    let s = bs.clone();
    slot!(&mut fuzz, "Moments::whiten", "b", dd, |v| s
        .moments
        .whiten(s.a.view(), v));
    let s = bs.clone();
    slot!(&mut fuzz, "Moments::unwhiten", "u", kd, |v| s
        .moments
        .unwhiten(v, s.b.view()));
    let s = bs.clone();
    slot!(&mut fuzz, "Moments::unwhiten", "v", dd, |v| s
        .moments
        .unwhiten(s.a.view(), v));
    let s = bs.clone();
    slot!(
        &mut fuzz,
        "Moments::limit_predict",
        "queries",
        (D, 5),
        |v| s.moments.limit_predict(s.a.view(), s.b.view(), v)
    );
    let s = bs.clone();
    slot!(&mut fuzz, "limit_predict_with", "sigma", dd, |v| {
        limit_predict_with(v, s.a.view(), s.b.view(), s.sample.x())
    });
    let s = bs.clone();
    slot!(&mut fuzz, "spectral_init_with", "w", (K, D), |v| {
        spectral_init_with(&s.moments, v)
    });
    for (what, f) in [
        ("PopulationProblem::excess", 0usize),
        ("PopulationProblem::loss", 1),
        ("PopulationProblem::loss_grad", 2),
        ("EmpiricalProblem::loss", 3),
        ("EmpiricalProblem::loss_grad", 4),
        ("pgd_step", 5),
        ("Descent::new + run(3)", 6),
    ] {
        for (arg, shape) in [("a", kd), ("b", dd)] {
            let s = bs.clone();
            slot!(&mut fuzz, what, arg, shape, |v| {
                let (a, b) = if arg == "a" {
                    (v.to_owned(), s.b.clone())
                } else {
                    (s.a.clone(), v.to_owned())
                };
                let pop = s.model.population();
                match f {
                    0 => pop.excess(a.view(), b.view()).map(|_| ()),
                    1 => pop.loss(a.view(), b.view()).map(|_| ()),
                    2 => pop.loss_grad(a.view(), b.view()).map(|_| ()),
                    3 => s.empirical.loss(a.view(), b.view()).map(|_| ()),
                    4 => s.empirical.loss_grad(a.view(), b.view()).map(|_| ()),
                    5 => pgd_step(
                        &Objective::Population(pop.clone()),
                        &s.moments,
                        a.view(),
                        b.view(),
                        &Settings::algorithm(),
                    )
                    .map(|_| ()),
                    _ => trainer_run(&s, a, b, arg),
                }
            });
        }
    }
    for (arg, shape) in [
        ("a", kd),
        ("b", dd),
        ("context", (D, 20)),
        ("queries", (D, 5)),
        ("m", kd),
    ] {
        let s = bs.clone();
        slot!(
            &mut fuzz,
            "attend / finite_context_excess",
            arg,
            shape,
            |v| {
                let mut args = [
                    s.a.clone(),
                    s.b.clone(),
                    s.sample.x().to_owned(),
                    s.sample.x().to_owned(),
                    s.model.m().clone(),
                ];
                let idx = ["a", "b", "context", "queries", "m"]
                    .iter()
                    .position(|n| *n == arg)
                    .unwrap();
                args[idx] = v.to_owned();
                let [a, b, c, q, m] = args.each_ref().map(|x| x.view());
                let layer = if arg != "m" {
                    attend(a, b, c, q).map(|_| ())
                } else {
                    Ok(())
                };
                layer.and_then(|_| finite_context_excess(a, b, c, q, m).map(|_| ()))
            }
        );
    }
    for (arg, shape) in [("keys", (D, 20)), ("queries", (D, 5)), ("labels", (K, 5))] {
        let s = bs.clone();
        slot!(
            &mut fuzz,
            "EmpiricalProblem::from_context",
            arg,
            shape,
            |v| {
                let mut parts = [
                    s.sample.x().to_owned(),
                    s.sample.x().slice(ndarray::s![.., ..5]).to_owned(),
                    s.sample.y().slice(ndarray::s![.., ..5]).to_owned(),
                ];
                parts[["keys", "queries", "labels"]
                    .iter()
                    .position(|n| *n == arg)
                    .unwrap()] = v.to_owned();
                let [k, q, l] = parts;
                EmpiricalProblem::from_context(k, q, l, KeyMask::None)
            }
        );
    }
    for rule in [
        Renormalization::Balance,
        Renormalization::ClipSoftmaxScale { max_scale: 0.5 },
    ] {
        for (arg, shape) in [("a", kd), ("b", dd)] {
            let s = bs.clone();
            each_matrix(
                &mut fuzz,
                &format!("renormalize {rule:?}"),
                arg,
                shape,
                move |v| {
                    let (mut a, mut b) = if arg == "a" {
                        (v.to_owned(), s.b.clone())
                    } else {
                        (s.a.clone(), v.to_owned())
                    };
                    let non_finite = v.iter().any(|x| !x.is_finite());
                    let result = renormalize(&mut a, &mut b, &s.moments, rule);
                    let changed = if arg == "a" { &a } else { &b };
                    match result {
                        // Documented: non-finite entries are left as they are (Ok, unchanged).
                        Ok(()) if non_finite => {
                            let same = changed
                                .iter()
                                .zip(v.iter())
                                .all(|(x, y)| x == y || (x.is_nan() && y.is_nan()));
                            if same {
                                Ok(())
                            } else {
                                Err("a non-finite input was changed".into())
                            }
                        }
                        other => verdict(other, arg, false),
                    }
                },
            );
        }
    }
    scalars_and_sizes(&mut fuzz, &bs);
    let calls = fuzz.finish();
    let secs = start.elapsed().as_secs_f64();
    eprintln!("{calls} calls in {secs:.1} s");
    assert!(calls >= 2500, "only {calls} calls");
}

/// Descent::new and three steps from a hostile start: a construction error naming `a0`/`b0`, or
/// finite records (a divergence is reported as `Diverged`, also fine).
fn trainer_run(s: &Base, a: Array2<f64>, b: Array2<f64>, arg: &str) -> kappa_optim::Result<()> {
    let obj = Objective::Population(s.model.population().clone());
    let mut t =
        Descent::new(obj, &s.moments, a, b, Settings::algorithm()).map_err(|e| match e {
            OptimError::Input(InputError::ShapeMismatch {
                expected,
                found,
                arg: a0,
            }) if a0 == if arg == "a" { "a0" } else { "b0" } => {
                InputError::shape_mismatch(if arg == "a" { "a" } else { "b" }, expected, found)
                    .into()
            }
            OptimError::Input(InputError::NonFinite {
                row,
                col,
                value,
                arg: a0,
            }) if a0 == if arg == "a" { "a0" } else { "b0" } => InputError::NonFinite {
                arg: if arg == "a" { "a" } else { "b" },
                row,
                col,
                value,
            }
            .into(),
            other => other,
        })?;
    match t.run(3) {
        Ok(recs)
            if recs
                .iter()
                .all(|r| r.loss.is_finite() && r.grad_norm.is_finite()) =>
        {
            Ok(())
        }
        Ok(_) => Err(InputError::invalid("records", "non-finite record").into()),
        Err(OptimError::Diverged { .. } | OptimError::Overflow { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Out-of-range scalars and huge dimensions, each with the argument its error must name.
fn scalars_and_sizes(fuzz: &mut Fuzz, bs: &std::sync::Arc<Base>) {
    let huge = [usize::MAX, usize::MAX / 2, 1 << 40, (1 << 30) + 1];
    for &n in &huge {
        fuzz.check(format!("default_stiefel({n}, {n})"), move || {
            verdict(default_stiefel(n, n), "shape", false)
        });
        fuzz.check(format!("default_stiefel(2, {n})"), move || {
            verdict(default_stiefel(2, n), "shape", false)
        });
        fuzz.check(format!("gaussian({n}, 3)"), move || {
            verdict(
                gaussian(n, 3, &mut ChaCha8Rng::seed_from_u64(0)),
                "shape",
                false,
            )
        });
        fuzz.check(format!("random_init(2, {n})"), move || {
            verdict(
                random_init(2, n, 0.1, &mut ChaCha8Rng::seed_from_u64(0)),
                "d",
                false,
            )
        });
        let s = bs.clone();
        fuzz.check(format!("sample({n})"), move || {
            verdict(
                s.model.sample(n, &mut ChaCha8Rng::seed_from_u64(0)),
                "n",
                false,
            )
        });
        let s = bs.clone();
        fuzz.check(format!("sample_covariates({n})"), move || {
            verdict(
                s.model
                    .sample_covariates(n, &mut ChaCha8Rng::seed_from_u64(0)),
                "n",
                false,
            )
        });
        fuzz.check(format!("ModelSpec {{ d: {n} }}.build"), move || {
            let spec = ModelSpec {
                d: n,
                k: 1,
                noise_std: 0.0,
                covariance: CovarianceSpec {
                    kappa: 2.0,
                    random_basis: false,
                },
                target: TargetSpec {
                    nuclear_norm: 1.0,
                    kappa: 1.0,
                },
            };
            verdict(spec.build(&mut ChaCha8Rng::seed_from_u64(0)), "spec", false)?;
            verdict(spec.covariance_eigenvalues().map(|_| ()), "spec", false)
        });
    }
    let s = bs.clone();
    fuzz.check("sample(0)", move || {
        verdict(
            s.model.sample(0, &mut ChaCha8Rng::seed_from_u64(0)),
            "n",
            false,
        )
    });
    for x in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0] {
        let s = bs.clone();
        fuzz.check(format!("renormalize max_scale = {x}"), move || {
            let (mut a, mut b) = (s.a.clone(), s.b.clone());
            verdict(
                renormalize(
                    &mut a,
                    &mut b,
                    &s.moments,
                    Renormalization::ClipSoftmaxScale { max_scale: x },
                ),
                "max_scale",
                false,
            )
        });
        for (field, settings) in settings_with(x) {
            let s = bs.clone();
            fuzz.check(format!("Settings {{ {field} = {x} }}"), move || {
                let obj = Objective::Population(s.model.population().clone());
                verdict(
                    pgd_step(&obj, &s.moments, s.a.view(), s.b.view(), &settings),
                    field,
                    false,
                )?;
                verdict(
                    Descent::new(obj, &s.moments, s.a.clone(), s.b.clone(), settings).map(|_| ()),
                    field,
                    false,
                )
            });
        }
        fuzz.check(format!("random_init scale = {x}"), move || {
            verdict(
                random_init(2, 3, x, &mut ChaCha8Rng::seed_from_u64(0)),
                "scale",
                false,
            )
        });
        fuzz.check(format!("DataModel::new noise_std = {x}"), move || {
            let r = DataModel::new(Array2::eye(2), array![[1.0, 0.0]], x);
            if x >= 0.0 {
                verdict(r, "noise_std", false)
            } else {
                verdict(r, "noise_std", true)
            }
        });
    }
    // Non-PSD and non-symmetric covariances name the caller's argument.
    for sigma in [
        array![[1.0, 0.0], [0.0, -1.0]],
        array![[1.0, 0.5], [0.0, 1.0]],
        array![[1.0, 2.0], [2.0, 1.0]],
    ] {
        let sg = sigma.clone();
        fuzz.check(format!("DataModel::new sigma = {sigma:?}"), move || {
            verdict(DataModel::new(sg, array![[1.0, 0.0]], 0.1), "sigma", true)
        });
        let sg = sigma.clone();
        fuzz.check(
            format!("Moments::from_parts sigma_hat = {sigma:?}"),
            move || {
                verdict(
                    Moments::from_parts(sg, array![[1.0, 0.0]], 1),
                    "sigma_hat",
                    true,
                )
            },
        );
    }
    // geometric_rate: any points, never a non-finite fit.
    for pts in [
        vec![(0.0, 1.0), (1.0, f64::NAN)],
        vec![(1e300, 1.0), (-1e300, 2.0), (0.0, 3.0)],
        vec![(0.0, f64::MAX), (1.0, f64::MIN_POSITIVE), (2.0, 1.0)],
        vec![],
        vec![(f64::INFINITY, 1.0), (1.0, 1.0)],
    ] {
        fuzz.check(
            format!("geometric_rate({pts:?})"),
            move || match geometric_rate(&pts) {
                Some(f) if !(f.mu.is_finite() && f.std_err.is_finite()) => Err(format!("{f:?}")),
                _ => Ok(()),
            },
        );
    }
    // Custom masks.
    for (what, mask) in [
        (
            "all masked",
            KeyMask::Custom(Array2::from_elem((20, 5), true)),
        ),
        (
            "wrong shape",
            KeyMask::Custom(Array2::from_elem((5, 20), false)),
        ),
        ("self, n_q > n_k", KeyMask::SelfExcluded),
    ] {
        let s = bs.clone();
        fuzz.check(format!("from_context mask {what}"), move || {
            let keys = s.sample.x().slice(ndarray::s![.., ..20]).to_owned();
            let (q, l) = if what.starts_with("self") {
                (s.sample.x().to_owned(), s.sample.y().to_owned())
            } else {
                (
                    keys.slice(ndarray::s![.., ..5]).to_owned(),
                    s.sample.y().slice(ndarray::s![.., ..5]).to_owned(),
                )
            };
            verdict(
                EmpiricalProblem::from_context(keys, q, l, mask),
                "mask",
                true,
            )
        });
    }
}

/// Settings with one field set to `x`, and that field's name.
fn settings_with(x: f64) -> Vec<(&'static str, Settings)> {
    let base = Settings::algorithm();
    vec![
        (
            "lambda",
            Settings {
                lambda: if x == 0.0 || x == -0.0 { -1.0 } else { x },
                ..base
            },
        ),
        (
            "step.c",
            Settings {
                step: StepSize::Relative { c: x },
                ..base
            },
        ),
        (
            "step.eta",
            Settings {
                step: StepSize::Absolute { eta: x },
                ..base
            },
        ),
        (
            "divergence_factor",
            Settings {
                divergence_factor: x,
                ..base
            },
        ),
        (
            "renormalization.max_scale",
            Settings {
                renormalization: Renormalization::ClipSoftmaxScale { max_scale: x },
                ..base
            },
        ),
    ]
}
