//! SVD entry points: `singular_values`, `svd_thin`, `svd_full`, `polar_factor`, `matrix_sign`,
//! `Svd::reconstruct`, both drivers, f32 and f64, every shape, scale and layout.

use super::support::*;
use kappa_linalg::*;
use kappa_testkit::hostile::{Fuzz, Layout};
use ndarray::{s, Array1, Array2};

const DRIVERS: [SvdDriver; 2] = [SvdDriver::QrIteration, SvdDriver::DivideAndConquer];

/// σ̂ (in `A`) against the reference, in A_s's units, or the Overflow error when σ₁ overflows.
fn check_sigma<A: Elem>(r: &Result<Array1<A>>, re: &Reference) -> Check {
    let tol = re.sigma_tol::<A>();
    match (r, re.overflows::<A>(tol / re.s1().max(f64::MIN_POSITIVE))) {
        (Err(_), Some(true) | None) => expect_err(r, "Overflow", "a"),
        (Ok(s), Some(false) | None) => sigma_close(s, re, tol),
        (Ok(_), Some(true)) => Err("Ok, but σ₁ overflows the element type".into()),
        (Err(e), Some(false)) => Err(format!("unexpected error {e}")),
    }
}

fn sigma_close<A: Elem>(s: &Array1<A>, re: &Reference, tol: f64) -> Check {
    ensure(s.len() == re.s.len(), || {
        format!("{} singular values", s.len())
    })?;
    for (i, (&got, &want)) in s.iter().zip(&re.s).enumerate() {
        let got = re.to_scaled(got.to_f64_lossy());
        ensure((got - want).abs() <= tol, || {
            format!("σ_{i}: {got:e} vs reference {want:e} (scaled), tolerance {tol:e}")
        })?;
    }
    Ok(())
}

/// U, Vᵀ orthonormal and A_s ≈ U Σ_s Vᵀ (the documented backward error, in A_s's units).
fn check_factors<A: Elem>(f: &Svd<A>, re: &Reference, full: bool) -> Check {
    let (m, n) = re.dim();
    let k = m.min(n);
    let want = if full {
        ((m, m), (n, n))
    } else {
        ((m, k), (k, n))
    };
    ensure((f.u.dim(), f.vt.dim()) == want, || {
        format!("factor shapes {:?} {:?}", f.u.dim(), f.vt.dim())
    })?;
    let orth_tol = re.p() * A::EPS;
    let (u, vt) = (to64(&f.u), to64(&f.vt));
    ensure(orthonormality(&u) <= orth_tol, || {
        format!("UᵀU − I = {:e}", orthonormality(&u))
    })?;
    ensure(orthonormality(&vt) <= orth_tol, || {
        format!("VᵀV − I = {:e}", orthonormality(&vt))
    })?;
    let s: Array1<f64> = f.s.mapv(|x| re.to_scaled(x.to_f64_lossy()));
    let us = &u.slice(s![.., ..k]) * &s.view().insert_axis(ndarray::Axis(0));
    let r = &re.a_s - &us.dot(&vt.slice(s![..k, ..]));
    let res = r.iter().map(|x| x * x).sum::<f64>().sqrt();
    let tol = re.p() * (A::EPS + f64::EPSILON) * re.fro() + k as f64 * re.sigma_tol::<A>();
    ensure(res <= tol, || format!("‖A_s − UΣVᵀ‖_F = {res:e} > {tol:e}"))
}

fn check_svd<A: Elem>(r: Result<Svd<A>>, input: &Input, full: bool) -> Check {
    if let Some(c) = input_error(&r, input, "a") {
        return c;
    }
    let Input::Finite(re) = input else {
        unreachable!()
    };
    let sig = r.as_ref().map(|f| f.s.clone()).map_err(Clone::clone);
    check_sigma(&sig, re)?;
    match r {
        Ok(f) => check_factors(&f, re, full),
        Err(_) => Ok(()),
    }
}

/// tr(QᵀA_s) = Σ_{i ≤ r} σ_i for the polar factor (r = k) and the matrix sign (r = its rank):
/// with Q̂ from the SVD of A + E, |tr(Q̂ᵀA) − Σσ̂| ≤ ‖Q̂‖_F‖E‖_F ≤ √r·p·ε·‖A‖_F, and
/// |Σσ̂ − Σσ| ≤ r·(p·ε·σ₁) for both computations.
fn check_trace(q: &Array2<f64>, re: &Reference, r: usize, eps: f64) -> Check {
    let tr: f64 = q.iter().zip(re.a_s.iter()).map(|(x, y)| x * y).sum();
    let want: f64 = re.s[..r].iter().sum();
    let tol = (r as f64).sqrt() * re.p() * eps * re.fro()
        + r as f64 * re.p() * (eps + f64::EPSILON) * re.s1();
    ensure((tr - want).abs() <= tol, || {
        format!("tr(QᵀA_s) = {tr:e}, Σσ = {want:e}, tolerance {tol:e}")
    })
}

fn check_polar<A: Elem>(r: Result<Array2<A>>, input: &Input) -> Check {
    if let Some(c) = input_error(&r, input, "a") {
        return c;
    }
    let Input::Finite(re) = input else {
        unreachable!()
    };
    let q = to64(&ok(r, "polar_factor")?);
    ensure(q.dim() == re.dim(), || format!("shape {:?}", q.dim()))?;
    // Documented: an isometry whatever the rank (zero σ ↦ 1).
    let orth = orthonormality(&q);
    ensure(orth <= re.p() * A::EPS, || {
        format!("not an isometry: {orth:e}")
    })?;
    check_trace(&q, re, re.s.len(), A::EPS)
}

/// The numerical rank interval under τ = σ₁·max(m,n)·ε_A: ranks any σ̂ within `delta` of σ
/// can give.
pub fn rank_interval(s: &[f64], tau: f64, delta: f64) -> (usize, usize) {
    let lo = s.iter().filter(|&&x| x > tau + delta).count();
    let hi = s.iter().filter(|&&x| x > tau - delta).count();
    (lo, hi)
}

fn check_sign<A: Elem>(r: Result<Array2<A>>, input: &Input) -> Check {
    if let Some(c) = input_error(&r, input, "a") {
        return c;
    }
    let Input::Finite(re) = input else {
        unreachable!()
    };
    let q = to64(&ok(r, "matrix_sign")?);
    let (m, n) = re.dim();
    let tau = re.s1() * m.max(n) as f64 * A::EPS;
    let (lo, hi) = rank_interval(&re.s, tau, re.sigma_tol::<A>());
    let rank = q.iter().map(|x| x * x).sum::<f64>().round() as usize;
    ensure((lo..=hi).contains(&rank), || {
        format!("rank {rank} outside [{lo}, {hi}]")
    })?;
    // A partial isometry: Q Qᵀ Q = Q.
    let d = &q.dot(&q.t()).dot(&q) - &q;
    let dev = d.iter().fold(0.0f64, |a, x| a.max(x.abs()));
    ensure(dev <= re.p() * A::EPS, || format!("QQᵀQ − Q = {dev:e}"))?;
    check_trace(&q, re, rank, A::EPS)
}

/// Every SVD entry point on every hostile input of one element type.
pub fn run<A: Elem>(fuzz: &mut Fuzz) {
    for (m, n) in SHAPES {
        for (name, x) in inputs::<A>(m, n) {
            let input = analyse(&x);
            for layout in Layout::ALL {
                for driver in DRIVERS {
                    let label = |f: &str| {
                        format!("{f}<{}>({name}, {layout:?}, {driver:?}, {m}×{n})", A::NAME)
                    };
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(label("singular_values"), move || match &i {
                        Input::Finite(re) => check_sigma(&singular_values(l.view(), driver), re),
                        _ => input_error(&singular_values(l.view(), driver), &i, "a").unwrap(),
                    });
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(label("svd_thin"), move || {
                        check_svd(svd_thin(l.view(), driver), &i, false)
                    });
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(label("svd_full"), move || {
                        check_svd(svd_full(l.view(), driver), &i, true)
                    });
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(label("polar_factor"), move || {
                        check_polar(polar_factor(l.view(), driver), &i)
                    });
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(label("matrix_sign"), move || {
                        check_sign(matrix_sign(l.view(), driver), &i)
                    });
                }
            }
        }
    }
    reconstruct::<A>(fuzz);
    for driver in DRIVERS {
        for (m, n) in [(1 << 15, 1), (1, 1 << 15)] {
            let x = Array2::<A>::ones((m, n));
            fuzz.check(
                format!("svd_full<{}>({m}×{n}, {driver:?})", A::NAME),
                move || {
                    // The full U (or Vᵀ) would have 2^30 entries.
                    expect_err(&svd_full(x.view(), driver), "TooLarge", "a")
                },
            );
        }
    }
}

/// `Svd::reconstruct` on factors from `svd_thin` and on inconsistent hand-built ones.
fn reconstruct<A: Elem>(fuzz: &mut Fuzz) {
    let x: Array2<A> =
        Array2::from_shape_fn((4, 3), |(i, j)| A::from_f64_lossy((i * 3 + j) as f64 - 4.5));
    let f = svd_thin(x.view(), SvdDriver::QrIteration).expect("unit-scale SVD");
    let nan = A::nan();
    let cases: Vec<(&str, Svd<A>, Want)> = vec![
        ("consistent", f.clone(), None),
        (
            "u with too few columns",
            Svd {
                u: f.u.slice(s![.., ..2]).to_owned(),
                ..f.clone()
            },
            Some(("ShapeMismatch", "self.u")),
        ),
        (
            "vt with too few rows",
            Svd {
                vt: f.vt.slice(s![..1, ..]).to_owned(),
                ..f.clone()
            },
            Some(("ShapeMismatch", "self.vt")),
        ),
        (
            "u with no columns",
            Svd {
                u: Array2::zeros((4, 0)),
                ..f.clone()
            },
            Some(("ShapeMismatch", "self.u")),
        ),
        (
            "NaN in s",
            Svd {
                s: f.s.mapv(|_| nan),
                ..f.clone()
            },
            Some(("NonFinite", "self.s")),
        ),
        (
            "inf in u",
            Svd {
                u: f.u.mapv(|_| A::infinity()),
                ..f.clone()
            },
            Some(("NonFinite", "self.u")),
        ),
        (
            "NaN in vt",
            Svd {
                vt: f.vt.mapv(|_| nan),
                ..f.clone()
            },
            Some(("NonFinite", "self.vt")),
        ),
        (
            "k = 0",
            Svd {
                u: Array2::zeros((4, 0)),
                s: Array1::zeros(0),
                vt: Array2::zeros((0, 3)),
            },
            None,
        ),
    ];
    for (what, svd, want) in cases.into_iter().chain(transposed_factors::<A>()) {
        let x = x.clone();
        fuzz.check(
            format!("Svd::reconstruct<{}>({what})", A::NAME),
            move || {
                let r = svd.reconstruct();
                match want {
                    Some((v, arg)) => expect_err(&r, v, arg),
                    None => {
                        let b = to64(&ok(r, "reconstruct")?);
                        let target = if svd.s.is_empty() {
                            Array2::zeros((4, 3))
                        } else {
                            to64(&x)
                        };
                        let fro = target.iter().map(|v| v * v).sum::<f64>().sqrt();
                        // The documented SVD backward error, 30·max(m,n)·ε·‖A‖_F.
                        let tol = 30.0 * 4.0 * A::EPS * fro;
                        let res = (&b - &target).iter().map(|v| v * v).sum::<f64>().sqrt();
                        ensure(res <= tol, || format!("‖A − UΣVᵀ‖ = {res:e}"))
                    }
                }
            },
        );
    }
}

/// Factors of a tall 6×5 and a wide 5×6 matrix passed transposed: U (6×5) as 5×6 and Vᵀ (5×6)
/// as 6×5 have at least k = 5 columns (rows), but more columns than rows (rows than columns),
/// which no factor with orthonormal columns (rows) has; and k = s.len() above both dimensions.
fn transposed_factors<A: Elem>() -> Vec<(&'static str, Svd<A>, Want)> {
    let matrix = |m: usize, n: usize| {
        Array2::from_shape_fn((m, n), |(i, j)| {
            A::from_f64_lossy(((i * 7 + j * 3) % 11) as f64 - 5.0)
        })
    };
    let tall = svd_thin(matrix(6, 5).view(), SvdDriver::QrIteration).expect("unit-scale SVD");
    let wide = svd_thin(matrix(5, 6).view(), SvdDriver::QrIteration).expect("unit-scale SVD");
    vec![
        (
            "u of a 6×5 factorization transposed",
            Svd {
                u: tall.u.t().to_owned(),
                ..tall.clone()
            },
            Some(("ShapeMismatch", "self.u")),
        ),
        (
            "vt of a 5×6 factorization transposed",
            Svd {
                vt: wide.vt.t().to_owned(),
                ..wide.clone()
            },
            Some(("ShapeMismatch", "self.vt")),
        ),
        (
            "both factors of a 6×5 factorization transposed",
            Svd {
                u: tall.u.t().to_owned(),
                vt: tall.vt.t().to_owned(),
                ..tall.clone()
            },
            Some(("ShapeMismatch", "self.u")),
        ),
        (
            "more singular values than rows of u",
            Svd {
                u: Array2::zeros((3, 5)),
                s: Array1::zeros(5),
                vt: Array2::zeros((5, 6)),
            },
            Some(("ShapeMismatch", "self.u")),
        ),
        (
            "more singular values than columns of vt",
            Svd {
                u: Array2::zeros((6, 5)),
                s: Array1::zeros(5),
                vt: Array2::zeros((5, 3)),
            },
            Some(("ShapeMismatch", "self.vt")),
        ),
    ]
}
