//! PSD roots: `psd_sqrt`, `psd_inv_sqrt` on hostile square matrices (mostly not symmetric),
//! their symmetric parts (mostly indefinite), and PSD matrices at every scale.

use super::support::*;
use kappa_linalg::*;
use kappa_testkit::hostile::{Fuzz, Layout};
use ndarray::Array2;

/// What the contract says about a finite square P (values as f64): not symmetric, not PSD,
/// PSD, or too close to a boundary to say (then either answer is accepted).
enum Verdict {
    NotSymmetric,
    NotPsd,
    Psd,
    Either,
}

/// The verdict from the f64 reference: asymmetry against √ε_A·max|P| (the module's tolerance),
/// the smallest eigenvalue of the symmetric part against −τ, τ = n·ε_A·λ_max (numpy's rule),
/// each with the backward error of the eigensolver, p·ε·λ_max (p = 30·n as for the SVD).
fn verdict<A: Elem>(p: &Array2<f64>) -> Verdict {
    let n = p.nrows();
    let amax = p.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let asym = p
        .indexed_iter()
        .fold(0.0f64, |m, ((i, j), x)| m.max((x - p[[j, i]]).abs()));
    let sym_tol = amax * A::EPS.sqrt();
    // The library forms x − y in A: rounding of one ε_A·amax either way.
    if asym > sym_tol + 2.0 * A::EPS * amax {
        return Verdict::NotSymmetric;
    }
    if asym >= sym_tol - 2.0 * A::EPS * amax {
        return Verdict::Either;
    }
    let sym = Array2::from_shape_fn((n, n), |(i, j)| 0.5 * (p[[i, j]] + p[[j, i]]));
    let l = eigenvalues(&sym);
    let lmax = l.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let (tau, d) = (
        n as f64 * A::EPS * lmax,
        30.0 * n as f64 * (A::EPS + f64::EPSILON) * lmax + asym,
    );
    let lmin = l.iter().fold(f64::INFINITY, |m, &x| m.min(x));
    if lmin < -tau - d {
        Verdict::NotPsd
    } else if lmin > -tau + d {
        Verdict::Psd
    } else {
        Verdict::Either
    }
}

/// Eigenvalues of a symmetric matrix as its signed singular values: σ(S) with the sign of
/// vᵢᵀSvᵢ (S = Q Λ Qᵀ has σ = |λ|).
fn eigenvalues(s: &Array2<f64>) -> Vec<f64> {
    let f = svd_thin(s.view(), SvdDriver::QrIteration).expect("unit-scale SVD");
    (0..f.s.len())
        .map(|i| {
            let v = f.vt.row(i);
            f.s[i] * v.dot(&s.dot(&v)).signum()
        })
        .collect()
}

fn check_sqrt<A: Elem>(x: Laid<A>, input: &Input, inverse: bool) -> Check {
    let v = x.view();
    let r = if inverse {
        psd_inv_sqrt(v, RankTolerance::Numpy)
    } else {
        psd_sqrt(v, RankTolerance::Numpy)
    };
    if let Some(c) = input_error(&r, input, "p") {
        return c;
    }
    let Input::Finite(re) = input else {
        unreachable!()
    };
    let (m, n) = re.dim();
    if m != n {
        return expect_err(&r, "NotSquare", "p");
    }
    if re.s1() == 0.0 {
        // Documented: √0 = 0; 0^{−1/2} is undefined under the default floor τ = 0.
        return match inverse {
            true => expect_err(&r, "InvalidArgument", "p"),
            false => ensure(matches!(&r, Ok(z) if z.iter().all(|v| v.is_zero())), || {
                "√0 ≠ 0".into()
            }),
        };
    }
    match (verdict::<A>(&re.a_s), &r) {
        (Verdict::NotSymmetric, _) => expect_err(&r, "NotSymmetric", "p"),
        (Verdict::NotPsd, _) => expect_err(&r, "NotPositiveSemidefinite", "p"),
        (Verdict::Either, Err(e)) => ensure(
            matches!(kind(e), ("NotSymmetric" | "NotPositiveSemidefinite", "p")),
            || format!("{e}"),
        ),
        (Verdict::Either | Verdict::Psd, Ok(_)) if inverse => Ok(()),
        (Verdict::Either | Verdict::Psd, Ok(root)) => check_root(root, re),
        (Verdict::Psd, Err(e)) => Err(format!("PSD input refused: {e}")),
    }
}

/// R² = P in A_s's units (R scaled by 2^{−e/2}): the library returns R = 2^{e/2}·R_s only for
/// even e, so compare R² ≈ P scaled by 2^{−e}. By the eigensolver's backward error,
/// ‖R² − P‖ ≤ p·(ε_A + ε)·‖P‖ plus the two products' rounding, n·ε_A·‖R‖² = n·ε_A·‖P‖.
fn check_root<A: Elem>(root: &Array2<A>, re: &Reference) -> Check {
    let r = to64(root);
    let rr = r.dot(&r).mapv(|v| re.to_scaled(v));
    let n = re.dim().0;
    let diff = (&rr - &re.a_s).iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let norm = re.s1();
    let tol = (30.0 * n as f64 * (A::EPS + f64::EPSILON) + n as f64 * A::EPS) * norm * n as f64
        + scale2(A::MIN_SUB, -re.e) * 4.0 * n as f64 * norm.sqrt().max(1.0);
    ensure(diff <= tol, || {
        format!("max|R² − P| = {diff:e} > {tol:e} (scaled)")
    })
}

/// PSD matrices G·Gᵀ/max at every scale of the hostile set: exactly 2^k times a unit one.
fn psd_inputs<A: Elem>(n: usize) -> Vec<(String, Array2<A>)> {
    let g: Array2<f64> = Array2::from_shape_fn((n, n + 2), |(i, j)| {
        ((i * 7 + j * 3) % 5) as f64 - 1.7 + (i == j) as u8 as f64
    });
    let p = g.dot(&g.t());
    let amax = p.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let unit = p.mapv(|v| scale2(v, -exponent(amax)));
    let top = exponent(A::MAX) - 1;
    let bottom = exponent(A::MIN_SUB) + 60;
    [0, 600, -600, top, bottom]
        .into_iter()
        .filter(|k| (bottom..=top).contains(k))
        .map(|k| {
            (
                format!("PSD×2^{k}"),
                unit.mapv(|v| A::from_f64_lossy(scale2(v, k))),
            )
        })
        .collect()
}

/// Both roots on square hostile inputs, their symmetric parts and PSD inputs; a few invalid
/// tolerances.
pub fn run<A: Elem>(fuzz: &mut Fuzz) {
    for n in [1, 3] {
        let mut all = inputs::<A>(n, n);
        let sym: Vec<(String, Array2<A>)> = all
            .iter()
            .filter(|(_, a)| a.is_square())
            .map(|(name, a)| {
                (
                    format!("sym({name})"),
                    Array2::from_shape_fn(a.dim(), |(i, j)| {
                        a[[i, j]] * A::from_f64_lossy(0.5) + a[[j, i]] * A::from_f64_lossy(0.5)
                    }),
                )
            })
            .collect();
        all.extend(sym);
        all.extend(psd_inputs::<A>(n.max(2)));
        for (name, x) in all {
            let input = analyse(&x);
            for layout in Layout::ALL {
                for inverse in [false, true] {
                    let f = if inverse { "psd_inv_sqrt" } else { "psd_sqrt" };
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(format!("{f}<{}>({name}, {layout:?})", A::NAME), move || {
                        check_sqrt(l, &i, inverse)
                    });
                }
            }
        }
    }
    for tol in [
        RankTolerance::Relative(-1.0),
        RankTolerance::Absolute(f64::NAN),
    ] {
        let x = Array2::<A>::eye(3);
        fuzz.check(
            format!("psd_sqrt<{}>(identity, {tol:?})", A::NAME),
            move || expect_err(&psd_sqrt(x.view(), tol), "InvalidArgument", "tol"),
        );
        let x = Array2::<A>::from_elem((2, 3), A::one());
        fuzz.check(
            format!("psd_inv_sqrt<{}>(2×3, {tol:?})", A::NAME),
            move || expect_err(&psd_inv_sqrt(x.view(), tol), "NotSquare", "p"),
        );
    }
}
