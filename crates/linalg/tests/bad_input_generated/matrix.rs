//! The `Matrix` trait on `ndarray`: `validate`, `frobenius_norm`, `singular_values`,
//! `polar_factor`, `polar_factor_and_singular_values` (scale-safe, every input and layout), and
//! the BLAS-level kernels' shape checks (`matmul`, `gemm`, `mul_add`, `axpy`, `inner`,
//! `set_diagonal`, `scale_columns`, `scale_entries`, `copy_from`) with their IEEE values.

use super::support::*;
use kappa_linalg::*;
use kappa_testkit::hostile::{Fuzz, Layout};
use ndarray::Array2;

/// ‖A‖_F = 2^e·‖A_s‖_F: within (mn + 2)·ε of the reference (a sum of mn squares and a root,
/// accumulated in f64), +∞ exactly when it exceeds `f64::MAX`.
fn check_norm(got: f64, re: &Reference) -> Check {
    let (m, n) = re.dim();
    let want = re.fro();
    let rel = (m * n + 2) as f64 * f64::EPSILON;
    let l = want.log2() + re.e as f64 - f64::MAX.log2();
    if got.is_infinite() {
        return ensure(l > (1.0 - rel).log2(), || {
            "‖A‖_F = ∞ for a representable norm".into()
        });
    }
    let g = re.to_scaled(got);
    ensure(
        (g - want).abs() <= rel * want + scale2(f64::MIN_POSITIVE * f64::EPSILON, -re.e),
        || format!("‖A‖_F {g:e} vs {want:e} (scaled)"),
    )
}

fn check_trait_sigma(r: &Result<Vec<f64>>, re: &Reference, eps: f64) -> Check {
    // The SVD bound, plus one subnormal ulp of f64 for a σ returned below the normal range.
    let tol =
        re.p() * (eps + f64::EPSILON) * re.s1() + scale2(f64::MIN_POSITIVE * f64::EPSILON, -re.e);
    let l = re.s1().log2() + re.e as f64 - f64::MAX.log2();
    match r {
        Err(_) if l > -(1e-9f64) => expect_err(r, "Overflow", "self"),
        Err(e) => Err(format!("unexpected error {e}")),
        Ok(s) => s.iter().zip(&re.s).try_for_each(|(&g, &w)| {
            let g = re.to_scaled(g);
            ensure((g - w).abs() <= tol, || {
                format!("σ {g:e} vs {w:e} (scaled)")
            })
        }),
    }
}

fn check_spectral<A: Elem>(x: Array2<A>, input: &Input, which: &str) -> Check {
    let result = match which {
        "validate" => x.validate("w").map(|_| ()),
        "frobenius_norm" => return frob(&x, input),
        "singular_values" => x.singular_values().map(|_| ()),
        "polar_factor" => x.polar_factor().map(|_| ()),
        _ => x.polar_factor_and_singular_values().map(|_| ()),
    };
    let arg = if which == "validate" { "w" } else { "self" };
    if let Some(c) = input_error(&result, input, arg) {
        return c;
    }
    let Input::Finite(re) = input else {
        unreachable!()
    };
    match which {
        "singular_values" => check_trait_sigma(&x.singular_values(), re, A::EPS),
        "polar_factor" => {
            let q = to64(&ok(x.polar_factor(), "polar_factor")?);
            ensure(orthonormality(&q) <= re.p() * A::EPS, || {
                "not an isometry".into()
            })
        }
        "polar_factor_and_singular_values" => {
            let r = x.polar_factor_and_singular_values();
            let r2 = r.as_ref().map(|(_, s)| s.clone()).map_err(Clone::clone);
            check_trait_sigma(&r2, re, A::EPS)?;
            match r {
                Ok((q, _)) => ensure(orthonormality(&to64(&q)) <= re.p() * A::EPS, || {
                    "not an isometry".into()
                }),
                Err(_) => Ok(()),
            }
        }
        _ => ok(result, which),
    }
}

/// `frobenius_norm` does not validate: NaN for a NaN entry, +∞ for ±∞, else the norm.
fn frob<A: Elem>(x: &Array2<A>, input: &Input) -> Check {
    let got = ok(x.frobenius_norm(), "frobenius_norm")?;
    match input {
        Input::Empty => ensure(got == 0.0, || format!("‖empty‖ = {got}")),
        Input::NonFinite => ensure(!got.is_finite(), || format!("‖non-finite‖ = {got}")),
        Input::Finite(re) => check_norm(got, re),
    }
}

/// The spectral trait methods on every input and layout (the trait takes owned arrays: the
/// view is copied with its memory order where `to_owned` keeps it).
pub fn run<A: Elem>(fuzz: &mut Fuzz) {
    for (m, n) in SHAPES {
        for (name, x) in inputs::<A>(m, n) {
            let input = analyse(&x);
            for layout in Layout::ALL {
                for which in [
                    "validate",
                    "frobenius_norm",
                    "singular_values",
                    "polar_factor",
                    "polar_factor_and_singular_values",
                ] {
                    let (l, i) = (Laid::new(layout, &x), input.clone());
                    fuzz.check(
                        format!("Matrix::{which}<{}>({name}, {layout:?}, {m}×{n})", A::NAME),
                        move || check_spectral(l.view().to_owned(), &i, which),
                    );
                }
            }
        }
    }
    kernels::<A>(fuzz);
    let tall = Array2::<A>::ones((1 << 15, 1));
    fuzz.check(
        format!("Matrix::gram/matmul<{}>(2^15×1)", A::NAME),
        move || {
            expect_err(&tall.gram(), "TooLarge", "self")?;
            expect_err(&tall.matmul(&tall.t().to_owned()), "TooLarge", "rhs")
        },
    );
}

/// Shape checks of the kernels, each with the argument it must name, and one matching call
/// whose value is checked exactly (small integers: every product and sum is exact).
fn kernels<A: Elem>(fuzz: &mut Fuzz) {
    let f = |r: usize, c: usize| {
        Array2::<A>::from_shape_fn((r, c), |(i, j)| A::from_f64_lossy((i * c + j) as f64 - 2.0))
    };
    for (r, c) in [(2, 3), (3, 3), (1, 4)] {
        let (a, b) = (f(r, c), f(c, r));
        // `wrong` has c + 1 rows (no product with a) and r + 1 columns (not a's shape).
        let (wrong, bt) = (f(c + 1, r + 1), f(r, c).reversed_axes());
        let label = |k: &str| format!("Matrix::{k}<{}>({r}×{c})", A::NAME);
        let (a1, a2, w1) = (a.clone(), a.clone(), wrong.clone());
        fuzz.check(label("matmul"), move || {
            expect_err(&a1.matmul(&w1), "ShapeMismatch", "rhs")?;
            let p = ok(a1.matmul(&a2.t().to_owned()), "matmul")?;
            ensure(p == a1.dot(&a2.t()), || "a·aᵀ".into())
        });
        let (a1, b1, bt1) = (a.clone(), b.clone(), bt.clone());
        fuzz.check(label("gemm/mul_add"), move || {
            let mut out = Array2::<A>::zeros((r, r));
            expect_err(&out.gemm(1.0, &a1, &f(c + 1, r), 0.0), "ShapeMismatch", "b")?;
            let mut bad_out = Array2::<A>::zeros((r + 1, r));
            expect_err(&bad_out.gemm(1.0, &a1, &bt1, 0.0), "ShapeMismatch", "self")?;
            expect_err(
                &bad_out.mul_add(1.0, &a1, &bt1, 0.0),
                "ShapeMismatch",
                "self",
            )?;
            ok(out.gemm(2.0, &a1, &b1, 0.0), "gemm")?;
            let want = a1.dot(&b1).mapv(|v| v + v);
            ensure(
                out == want
                    && ok(out.mul_add(-2.0, &a1, &b1, 1.0), "mul_add")?
                        .iter()
                        .all(|v| v.is_zero()),
                || "gemm value".into(),
            )
        });
        let (mut a1, a2, w1) = (a.clone(), a.clone(), wrong.clone());
        fuzz.check(label("axpy/inner/copy_from"), move || {
            expect_err(&a1.axpy(1.0, &w1), "ShapeMismatch", "x")?;
            expect_err(&a1.inner(&w1), "ShapeMismatch", "other")?;
            expect_err(&a1.copy_from(&w1), "ShapeMismatch", "src")?;
            ok(a1.axpy(-1.0, &a2), "axpy")?;
            let zero = a1.iter().all(|v| v.is_zero());
            ok(a1.copy_from(&a2), "copy_from")?;
            let inner = ok(a1.inner(&a2), "inner")?;
            let want: f64 = a2.iter().map(|v| v.to_f64_lossy().powi(2)).sum();
            ensure(zero && a1 == a2 && inner == want, || {
                "axpy/copy/inner values".into()
            })
        });
        let mut a1 = a.clone();
        fuzz.check(label("diagonal kernels"), move || {
            let k = r.min(c);
            expect_err(&a1.set_diagonal(&vec![0.0; k + 1]), "ShapeMismatch", "d")?;
            expect_err(&a1.scale_columns(&vec![1.0; c + 1]), "ShapeMismatch", "s")?;
            expect_err(
                &a1.scale_entries(&vec![1.0; r * c + 1]),
                "ShapeMismatch",
                "s",
            )?;
            ok(a1.set_diagonal(&vec![7.0; k]), "set_diagonal")?;
            ok(a1.scale_columns(&vec![2.0; c]), "scale_columns")?;
            ok(a1.scale_entries(&vec![0.5; r * c]), "scale_entries")?;
            let d = ok(a1.diagonal(), "diagonal")?;
            ensure(d == vec![7.0; k], || format!("diagonal {d:?}"))
        });
    }
}
