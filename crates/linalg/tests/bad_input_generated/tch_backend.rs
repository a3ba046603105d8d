//! The `tch::Tensor` backend (feature `tch`): every trait method and the conversions on tensors
//! of every supported and one unsupported kind, of 1, 2 and 3 dimensions, empty, non-finite
//! and near each kind's `MAX`.

use super::newton_schulz::ns_error_bound;
use super::support::*;
use kappa_linalg::tch_backend::{array_from_tensor, tensor_from_array};
use kappa_linalg::*;
use kappa_testkit::hostile::Fuzz;
use ndarray::Array2;
use tch::{Device, Kind, Tensor};

const KINDS: [Kind; 3] = [Kind::Float, Kind::Double, Kind::BFloat16];

/// The kind's unit roundoff ε and largest finite value.
fn unit(kind: Kind) -> (f64, f64) {
    match kind {
        Kind::Double => (f64::EPSILON, f64::MAX),
        Kind::BFloat16 => (2f64.powi(-7), 3.389_531_389_251_535e38),
        _ => (f32::EPSILON as f64, f32::MAX as f64),
    }
}

/// Hostile 2-D values for a kind: Gaussian, zero, rank one, with NaN, and every entry at
/// ±0.9·MAX of the kind (so ‖X‖_F overflows the kind, and for f64 even f64).
fn values(kind: Kind) -> Vec<(&'static str, Array2<f64>)> {
    let g = Array2::from_shape_fn((4, 3), |(i, j)| ((i * 5 + j * 3) % 7) as f64 / 7.0 - 0.4);
    let max = unit(kind).1;
    // Rounded to the kind, so the reference sees the values the tensor holds.
    let near = g.mapv(|x| x.signum() * 0.9 * max);
    vec![
        ("gaussian", g.clone()),
        ("zero", Array2::zeros((4, 3))),
        (
            "rank one",
            Array2::from_shape_fn((4, 3), |(i, j)| (i as f64 + 1.0) * (j as f64 - 1.0)),
        ),
        ("with NaN", g.mapv(|x| if x < -0.35 { f64::NAN } else { x })),
        ("±0.9·MAX", near),
    ]
}

/// A 2-D tensor of `kind` holding `a` (NaN included), and the values it holds as f64.
fn tensor(a: &Array2<f64>, kind: Kind) -> (Tensor, Array2<f64>) {
    let (m, n) = a.dim();
    let data: Vec<f64> = a.iter().copied().collect();
    let t = Tensor::from_slice(&data)
        .view([m as i64, n as i64])
        .to_kind(kind);
    let held = array_from_tensor(&t).expect("a supported 2-D tensor");
    (t, held)
}

fn check_sigma(r: Result<Vec<f64>>, held: &Array2<f64>, eps: f64) -> Check {
    let input = analyse(held);
    if let Some(c) = input_error(&r, &input, "self") {
        return c;
    }
    let Input::Finite(re) = input else {
        unreachable!()
    };
    let l = re.s1().log2() + re.e as f64 - f64::MAX.log2();
    if l > -1e-9 {
        return expect_err(&r, "Overflow", "self");
    }
    let tol = re.p() * (eps + f64::EPSILON) * re.s1();
    ok(r, "singular_values")?
        .iter()
        .zip(&re.s)
        .try_for_each(|(&g, &w)| {
            let g = re.to_scaled(g);
            ensure((g - w).abs() <= tol, || {
                format!("σ {g:e} vs {w:e} (scaled)")
            })
        })
}

/// Q is an isometry to the SVD's accuracy (p·ε of the computing kind, p = 30·4) plus the
/// rounding of Q to the output kind (unit roundoff u: |Q̂ᵀQ̂ − QᵀQ| ≤ 2u + u², by Cauchy–Schwarz
/// on columns of norm 1).
fn check_polar(r: Result<Tensor>, held: &Array2<f64>, eps: f64, out_eps: f64) -> Check {
    let input = analyse(held);
    if let Some(c) = input_error(&r, &input, "self") {
        return c;
    }
    let q = ok(array_from_tensor(&ok(r, "polar_factor")?), "to array")?;
    let dev = orthonormality(&q);
    let u = out_eps / 2.0;
    let tol = 30.0 * 4.0 * eps + 2.0 * u + u * u;
    ensure(dev <= tol, || format!("not an isometry: {dev:e} > {tol:e}"))
}

/// Muon NS on a tensor against the `ndarray` f64 backend on the same values, within the
/// first-order bound of both computations (see the Newton–Schulz module of this test).
fn check_ns(r: Result<Tensor>, held: &Array2<f64>, eps: f64) -> Check {
    let input = analyse(held);
    if let Some(c) = input_error(&r, &input, "x") {
        return c;
    }
    let Input::Finite(re) = input else {
        unreachable!()
    };
    let y = ok(array_from_tensor(&ok(r, "newton_schulz_muon")?), "to array")?;
    let want = ok(newton_schulz_muon(&re.a_s), "reference")?;
    let diff = (&y - &want).iter().map(|v| v * v).sum::<f64>().sqrt();
    if re.s1() == 0.0 {
        return ensure(diff == 0.0, || "NS(0) ≠ 0".into());
    }
    let x: Vec<f64> = re.s.iter().map(|v| v / re.fro()).collect();
    let sched = NsSchedule::muon();
    let tol = ns_error_bound(&sched, 3, 4, &x, eps, 0.0)
        + ns_error_bound(&sched, 3, 4, &x, f64::EPSILON, 0.0);
    ensure(diff <= tol.min(1.0), || {
        format!("‖NS − NS_ref‖_F = {diff:e} > {tol:e}")
    })
}

/// Tensors the trait must reject: wrong dimension, unsupported kind, empty.
fn rejected() -> Vec<(&'static str, Tensor, &'static str)> {
    vec![
        (
            "1-D",
            Tensor::ones([4], (Kind::Float, Device::Cpu)),
            "ShapeMismatch",
        ),
        (
            "3-D",
            Tensor::ones([2, 2, 2], (Kind::Double, Device::Cpu)),
            "ShapeMismatch",
        ),
        ("0-D", Tensor::from(1.5f64), "ShapeMismatch"),
        (
            "int64",
            Tensor::ones([2, 2], (Kind::Int64, Device::Cpu)),
            "UnsupportedDtype",
        ),
        (
            "empty",
            Tensor::zeros([0, 3], (Kind::Float, Device::Cpu)),
            "Empty",
        ),
    ]
}

/// Every trait method on a rejected tensor: the validating ones give the error on `self`
/// (`x` for Newton–Schulz); the kernels either work (IEEE, as on `ndarray`) or return an error;
/// none panics.
fn run_rejected(fuzz: &mut Fuzz) {
    for (what, t, variant) in rejected() {
        let t2 = t.shallow_clone();
        fuzz.check(format!("Tensor validating methods({what})"), move || {
            expect_err(&t2.validate("w"), variant, "w")?;
            expect_err(&t2.singular_values(), variant, "self")?;
            expect_err(&Matrix::polar_factor(&t2), variant, "self")?;
            expect_err(&t2.polar_factor_and_singular_values(), variant, "self")?;
            expect_err(&newton_schulz_muon(&t2), variant, "x")?;
            // Conversion copies any 2-D supported tensor, empty ones included.
            let conv = array_from_tensor(&t2);
            match variant {
                "Empty" => ensure(conv.is_ok_and(|a| a.dim() == (0, 3)), || {
                    "empty conversion".into()
                }),
                v => expect_err(&conv, v, "t"),
            }
        });
        let t2 = t.shallow_clone();
        fuzz.check(format!("Tensor kernels({what})"), move || {
            let u = Tensor::ones([2, 2], (Kind::Float, Device::Cpu));
            let mut s = t2.shallow_clone();
            let _ = (
                Matrix::matmul(&t2, &u),
                t2.gram(),
                Matrix::frobenius_norm(&t2),
                t2.duplicate(),
            );
            let _ = (
                s.gemm(1.0, &u, &u, 0.0),
                s.mul_add(1.0, &u, &u, 1.0),
                s.scale(2.0),
                s.axpy(1.0, &u),
            );
            let _ = (
                Matrix::inner(&t2, &u),
                Matrix::diagonal(&t2),
                s.set_diagonal(&[1.0, 2.0]),
            );
            let _ = (
                s.scale_columns(&[1.0]),
                s.scale_entries(&[1.0]),
                s.copy_from(&u),
            );
            let _ = t2.shallow_clone().into_transpose();
            let d = t2.dim();
            let shape_err = Matrix::matmul(&t2, &u);
            ensure(d == 2 || shape_err.is_err(), || {
                "matmul of a non-matrix succeeded".into()
            })
        });
    }
}

/// The backend on every kind and hostile value set, plus the conversions.
pub fn run(fuzz: &mut Fuzz) {
    for kind in KINDS {
        let eps = if kind == Kind::BFloat16 {
            f32::EPSILON as f64
        } else {
            unit(kind).0
        };
        for (name, a) in values(kind) {
            let (t, held) = tensor(&a, kind);
            let label = |f: &str| format!("Tensor::{f}({kind:?}, {name})");
            let (t1, h1) = (t.shallow_clone(), held.clone());
            fuzz.check(label("singular_values"), move || {
                check_sigma(t1.singular_values(), &h1, eps)
            });
            let (t1, h1) = (t.shallow_clone(), held.clone());
            let out_eps = unit(kind).0;
            fuzz.check(label("polar_factor"), move || {
                check_polar(Matrix::polar_factor(&t1), &h1, eps, out_eps)
            });
            let (t1, h1) = (t.shallow_clone(), held.clone());
            fuzz.check(label("polar_factor_and_singular_values"), move || {
                let r = t1.polar_factor_and_singular_values();
                let s = r.as_ref().map(|(_, s)| s.clone()).map_err(Clone::clone);
                check_sigma(s, &h1, eps)?;
                match r {
                    Err(LinalgError::Overflow { .. }) => Ok(()),
                    r => check_polar(r.map(|(q, _)| q), &h1, eps, out_eps),
                }
            });
            let (t1, h1) = (t.shallow_clone(), held.clone());
            // NS runs in the tensor's own kind: bf16 rounds every product to 8 bits.
            let ns_eps = unit(kind).0;
            fuzz.check(label("newton_schulz_muon"), move || {
                check_ns(newton_schulz_muon(&t1), &h1, ns_eps)
            });
            let (t1, h1) = (t.shallow_clone(), held.clone());
            fuzz.check(label("tensor_from_array"), move || {
                let r = tensor_from_array(h1.view(), kind, Device::Cpu);
                if let Some(c) = input_error(&r, &analyse(&h1), "a") {
                    return c;
                }
                let back = ok(
                    array_from_tensor(&ok(r, "tensor_from_array")?),
                    "array_from_tensor",
                )?;
                ensure(back == h1 && t1.size() == vec![4, 3], || {
                    "round trip changed the values".into()
                })
            });
        }
        let a = Array2::<f64>::ones((2, 2));
        fuzz.check(
            format!("tensor_from_array<{kind:?}>(kind Int64)"),
            move || {
                expect_err(
                    &tensor_from_array(a.view(), Kind::Int64, Device::Cpu),
                    "UnsupportedDtype",
                    "kind",
                )
            },
        );
    }
    run_rejected(fuzz);
    fuzz.check("Tensor kernels(mixed kinds, Int64)", || {
        let f = Tensor::ones([2, 2], (Kind::Float, Device::Cpu));
        let d = Tensor::ones([2, 2], (Kind::Double, Device::Cpu));
        let mut i = Tensor::ones([2, 2], (Kind::Int64, Device::Cpu));
        let mut out = f.shallow_clone();
        expect_err(&out.gemm(1.0, &d, &f, 0.0), "UnsupportedDtype", "a")?;
        expect_err(&out.mul_add(1.0, &f, &d, 0.0), "UnsupportedDtype", "b")?;
        expect_err(&out.axpy(1.0, &d), "UnsupportedDtype", "x")?;
        expect_err(&i.scale(2.0), "UnsupportedDtype", "self")?;
        expect_err(&Matrix::frobenius_norm(&i), "UnsupportedDtype", "self")
    });
}
