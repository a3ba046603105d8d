//! Kronecker algebra: `vec`, `unvec`, `kron`, `kron_matvec`, `commutation_matrix`,
//! `Commutation::{new, apply, apply_transpose, apply_rows, to_dense, source, size, dims}`.

use super::support::*;
use kappa_linalg::*;
use kappa_testkit::hostile::{Fuzz, Layout};
use ndarray::{Array1, Array2};

/// The error `kron(a, b)` must give, in argument order, or `None` for a product (with its
/// expected overflow verdict: max|a|·max|b| against `A::MAX`).
fn kron_expect<A: Elem>(
    ia: &Input,
    ib: &Input,
    a: &Array2<A>,
    b: &Array2<A>,
) -> Option<(&'static str, &'static str)> {
    for (i, arg) in [(ia, "a"), (ib, "b")] {
        match i {
            Input::Empty => return Some(("Empty", arg)),
            Input::NonFinite => return Some(("NonFinite", arg)),
            Input::Finite(_) => {}
        }
    }
    let amax = |x: &Array2<A>| x.iter().fold(0.0f64, |m, v| m.max(v.to_f64_lossy().abs()));
    (!A::from_f64_lossy(amax(a) * amax(b)).is_finite()).then_some(("Overflow", "b"))
}

fn check_kron<A: Elem>(a: Laid<A>, b: Laid<A>, want: Option<(&str, &str)>) -> Check {
    let r = kron(a.view(), b.view());
    if let Some((v, arg)) = want {
        return expect_err(&r, v, arg);
    }
    let k = ok(r, "kron")?;
    let ((p, q), (rr, s)) = (a.view().dim(), b.view().dim());
    ensure(k.dim() == (p * rr, q * s), || {
        format!("shape {:?}", k.dim())
    })?;
    // The documented index rule, exactly (one multiplication per entry).
    let (av, bv) = (a.view(), b.view());
    ensure(
        k.indexed_iter()
            .all(|((i, j), &x)| x == av[[i / rr, j / s]] * bv[[i % rr, j % s]]),
        || "entries differ".into(),
    )
}

/// (A ⊗ B)x against the f64 sum Σ a·b·x on exactly rescaled factors, with the dot-product
/// bound γ_{q+s}·(|A| ⊗ |B|)|x| (two products of inner dimension s and q, Higham's γ_n = nε).
fn check_matvec<A: Elem>(
    a: &Array2<A>,
    b: &Array2<A>,
    x: &Array1<A>,
    got: Result<Array1<A>>,
) -> Check {
    let (p, q) = a.dim();
    let (r, s) = b.dim();
    let sc = |m: &Array2<A>| {
        let amax = m.iter().fold(0.0f64, |t, v| t.max(v.to_f64_lossy().abs()));
        let e = if amax == 0.0 { 0 } else { exponent(amax) };
        (m.mapv(|v| scale2(v.to_f64_lossy(), -e)), e)
    };
    let (as_, ea) = sc(a);
    let (bs, eb) = sc(b);
    let (xs, ex) = sc(&x.view().insert_axis(ndarray::Axis(1)).to_owned());
    let e = ea + eb + ex;
    let (mut want, mut mag) = (vec![0.0; p * r], vec![0.0; p * r]);
    for (row, (w, g)) in want.iter_mut().zip(mag.iter_mut()).enumerate() {
        let (i, k) = (row / r, row % r);
        for col in 0..q * s {
            let (j, l) = (col / s, col % s);
            let t = as_[[i, j]] * bs[[k, l]] * xs[[col, 0]];
            *w += t;
            *g += t.abs();
        }
    }
    let gamma = (q + s + 2) as f64 * (A::EPS + f64::EPSILON);
    // In log2 of A's units: the largest |result| (± its rounding bound) against log2 MAX.
    let top = want.iter().zip(&mag).fold(f64::NEG_INFINITY, |m, (w, g)| {
        m.max((w.abs() + gamma * g).log2())
    });
    let least = want
        .iter()
        .fold(f64::NEG_INFINITY, |m, w| m.max(w.abs().log2()))
        + (1.0 - gamma).log2();
    let lmax = A::MAX.log2() - e as f64;
    match got {
        Err(LinalgError::Overflow { arg: "x", .. }) => {
            ensure(top >= lmax, || "Overflow, but every entry fits".into())
        }
        Err(err) => Err(format!("unexpected error {err}")),
        Ok(_) if least > lmax => Err("Ok, but an entry overflows".into()),
        // Compared in A's units: the bound γ·Σ|terms| scaled back, plus one subnormal ulp of the
        // final rounding (the computation itself runs at unit scale).
        Ok(y) => y
            .iter()
            .zip(&want)
            .zip(&mag)
            .try_for_each(|((&v, &w), &g)| {
                let (v, w) = (v.to_f64_lossy(), big_scale(w, e));
                let tol = big_scale(gamma * g, e) + 2.0 * A::MIN_SUB;
                ensure((v - w).abs() <= tol, || {
                    format!("{v:e} vs {w:e}, tolerance {tol:e}")
                })
            }),
    }
}

/// x·2^k in f64 for any k (exact until the result leaves the normal range).
fn big_scale(x: f64, k: i32) -> f64 {
    let (mut x, mut k) = (x, k);
    while k != 0 && x != 0.0 && x.is_finite() {
        let step = k.clamp(-1000, 1000);
        x = scale2(x, step);
        k -= step;
    }
    x
}

/// kron and kron_matvec on every pair from a few hostile inputs, vec on every input.
pub fn run<A: Elem>(fuzz: &mut Fuzz) {
    let left = inputs::<A>(2, 2);
    let right = inputs::<A>(1, 3);
    for (na, a) in &left {
        let ia = analyse(a);
        for layout in Layout::ALL {
            let (l, i, a2) = (Laid::new(layout, a), ia.clone(), a.clone());
            fuzz.check(format!("vec<{}>({na}, {layout:?})", A::NAME), move || {
                let r = vec(l.view());
                if let Some(c) = input_error(&r, &i, "m") {
                    return c;
                }
                let v = ok(r, "vec")?;
                ensure(
                    v.to_vec() == a2.t().iter().copied().collect::<Vec<A>>(),
                    || "not column-major".into(),
                )
            });
        }
        for (nb, b) in &right {
            let ib = analyse(b);
            let want = kron_expect(&ia, &ib, a, b);
            for layout in [Layout::Standard, Layout::RowReversed] {
                let (la, lb) = (Laid::new(layout, a), Laid::new(Layout::ColumnMajor, b));
                fuzz.check(
                    format!("kron<{}>({na}, {nb}, {layout:?})", A::NAME),
                    move || check_kron(la, lb, want),
                );
                let (la, lb) = (Laid::new(layout, b), Laid::new(Layout::Strided, a));
                let want_t = kron_expect(&ib, &ia, b, a);
                fuzz.check(
                    format!("kron<{}>({nb}, {na}, {layout:?})", A::NAME),
                    move || check_kron(la, lb, want_t),
                );
            }
            matvec_calls::<A>(fuzz, (na, a, &ia), (nb, b, &ib));
        }
    }
    sizes::<A>(fuzz);
}

fn matvec_calls<A: Elem>(
    fuzz: &mut Fuzz,
    (na, a, ia): (&str, &Array2<A>, &Input),
    (nb, b, ib): (&str, &Array2<A>, &Input),
) {
    let n = a.ncols() * b.ncols();
    let f = A::from_f64_lossy;
    let xs: Vec<(&str, Array1<A>)> = vec![
        ("x unit", Array1::from_shape_fn(n, |i| f(i as f64 - 1.5))),
        ("x near MAX", Array1::from_elem(n, f(A::MAX / 2.0))),
        (
            "x with NaN",
            Array1::from_shape_fn(n, |i| if i == 0 { A::nan() } else { A::one() }),
        ),
        (
            "x too short",
            Array1::from_elem(n.saturating_sub(1), A::one()),
        ),
    ];
    for (nx, x) in xs {
        let (a, b, ia, ib) = (a.clone(), b.clone(), ia.clone(), ib.clone());
        fuzz.check(
            format!("kron_matvec<{}>({na}, {nb}, {nx})", A::NAME),
            move || {
                let r = kron_matvec(a.view(), b.view(), x.view());
                for (i, arg) in [(&ia, "a"), (&ib, "b")] {
                    if let Some(c) = input_error(&r, i, arg) {
                        return c;
                    }
                }
                if x.is_empty() {
                    return expect_err(&r, "Empty", "x");
                }
                if !x.iter().all(|v| v.is_finite()) {
                    return expect_err(&r, "NonFinite", "x");
                }
                if x.len() != a.ncols() * b.ncols() {
                    return expect_err(&r, "ShapeMismatch", "x");
                }
                check_matvec(&a, &b, &x, r)
            },
        );
    }
}

/// Size guards and the commutation matrix.
fn sizes<A: Elem>(fuzz: &mut Fuzz) {
    for (m, n) in [
        (0, 3),
        (3, 0),
        (usize::MAX, 2),
        (1 << 20, 1 << 20),
        (2, 3),
        (1, 1),
        (usize::MAX, 1),
    ] {
        fuzz.check(
            format!("commutation_matrix<{}>({m}, {n})", A::NAME),
            move || {
                let r = commutation_matrix::<A>(m, n);
                match (m, n) {
                    (0, _) => expect_err(&r, "InvalidArgument", "m"),
                    (_, 0) => expect_err(&r, "InvalidArgument", "n"),
                    _ if m.checked_mul(n).is_none() => expect_err(&r, "TooLarge", "m"),
                    _ if (m * n)
                        .checked_mul(m * n)
                        .is_none_or(|e| e > MAX_DENSE_ENTRIES) =>
                    {
                        expect_err(&r, "TooLarge", "m")
                    }
                    _ => {
                        let k = ok(r, "commutation_matrix")?;
                        let c = Commutation::new(m, n).map_err(|e| e.to_string())?;
                        let v: Array1<A> =
                            (0..m * n).map(|i| A::from_f64_lossy(i as f64)).collect();
                        let (dense, implicit) =
                            (k.dot(&v), c.apply(v.view()).map_err(|e| e.to_string())?);
                        let back = c
                            .apply_transpose(implicit.view())
                            .map_err(|e| e.to_string())?;
                        let rows = c
                            .apply_rows(v.view().insert_axis(ndarray::Axis(1)))
                            .map_err(|e| e.to_string())?;
                        ensure(
                            dense == implicit
                                && back == v
                                && rows.column(0) == implicit
                                && c.dims() == (m, n)
                                && c.size() == m * n
                                && c.source(m * n).is_none(),
                            || "K inconsistent".into(),
                        )
                    }
                }
            },
        );
    }
    let c = Commutation::new(2, 3).expect("2×3");
    for (what, v, want) in [
        ("short", Array1::<A>::zeros(5), ("ShapeMismatch", "v")),
        ("empty", Array1::<A>::zeros(0), ("Empty", "v")),
        ("NaN", Array1::from_elem(6, A::nan()), ("NonFinite", "v")),
    ] {
        fuzz.check(
            format!("Commutation::apply<{}>({what})", A::NAME),
            move || {
                expect_err(&c.apply(v.view()), want.0, want.1)?.then_ok(expect_err(
                    &c.apply_transpose(v.view()),
                    want.0,
                    want.1,
                ))
            },
        );
    }
    for (what, x, want) in [
        (
            "wrong rows",
            Array2::<A>::zeros((5, 2)),
            ("ShapeMismatch", "x"),
        ),
        ("no columns", Array2::<A>::zeros((6, 0)), ("Empty", "x")),
        (
            "inf",
            Array2::from_elem((6, 1), A::infinity()),
            ("NonFinite", "x"),
        ),
    ] {
        fuzz.check(
            format!("Commutation::apply_rows<{}>({what})", A::NAME),
            move || expect_err(&c.apply_rows(x.view()), want.0, want.1),
        );
    }
    for (what, v, rows, cols, want) in [
        (
            "rows 0",
            Array1::<A>::ones(4),
            0,
            4,
            Some(("InvalidArgument", "rows")),
        ),
        (
            "cols 0",
            Array1::<A>::ones(4),
            4,
            0,
            Some(("InvalidArgument", "cols")),
        ),
        (
            "overflowing shape",
            Array1::<A>::ones(4),
            usize::MAX,
            2,
            Some(("ShapeMismatch", "v")),
        ),
        (
            "mismatch",
            Array1::<A>::ones(4),
            3,
            2,
            Some(("ShapeMismatch", "v")),
        ),
        ("empty", Array1::<A>::ones(0), 1, 1, Some(("Empty", "v"))),
        (
            "fine",
            Array1::from_shape_fn(6, |i| A::from_f64_lossy(i as f64)),
            2,
            3,
            None,
        ),
    ] {
        fuzz.check(format!("unvec<{}>({what})", A::NAME), move || {
            let r = unvec(v.view(), rows, cols);
            match want {
                Some((k, arg)) => expect_err(&r, k, arg),
                None => {
                    let m = ok(r, "unvec")?;
                    ensure(vec(m.view()).map_err(|e| e.to_string())? == v, || {
                        "vec(unvec(v)) ≠ v".into()
                    })
                }
            }
        });
    }
    let big = Array2::<A>::ones((1 << 15, 1));
    fuzz.check(format!("kron<{}>(2^15×1, 1×2^15)", A::NAME), move || {
        expect_err(&kron(big.view(), big.t()), "TooLarge", "a")
    });
}

trait ThenOk {
    fn then_ok(self, next: Check) -> Check;
}

impl ThenOk for () {
    fn then_ok(self, next: Check) -> Check {
        next
    }
}
