//! Every public entry point, fed NaN, ±Inf, empty and mismatched inputs, returns the right
//! error naming the right argument — and never panics.

use kappa_linalg::*;
use ndarray::{array, Array1, Array2};

/// Asserts that `$e` is `Err(LinalgError::$variant { arg: $arg, .. })`, or for the four
/// input errors `Err(LinalgError::Input(InputError::$variant { arg: $arg, .. }))`.
macro_rules! assert_err {
    ($e:expr, Empty, $arg:expr) => {
        assert_err!(@input $e, Empty, $arg)
    };
    ($e:expr, NonFinite, $arg:expr) => {
        assert_err!(@input $e, NonFinite, $arg)
    };
    ($e:expr, ShapeMismatch, $arg:expr) => {
        assert_err!(@input $e, ShapeMismatch, $arg)
    };
    ($e:expr, InvalidArgument, $arg:expr) => {
        assert_err!(@input $e, InvalidArgument, $arg)
    };
    (@input $e:expr, $variant:ident, $arg:expr) => {{
        match $e {
            Err(LinalgError::Input(InputError::$variant { arg, .. })) => {
                assert_eq!(arg, $arg, "wrong argument named")
            }
            other => panic!(
                "expected {} on `{}`, got {:?}",
                stringify!($variant),
                $arg,
                other.map(|_| "Ok(..)")
            ),
        }
    }};
    ($e:expr, $variant:ident, $arg:expr) => {{
        match $e {
            Err(LinalgError::$variant { arg, .. }) => assert_eq!(arg, $arg, "wrong argument named"),
            other => panic!(
                "expected {} on `{}`, got {:?}",
                stringify!($variant),
                $arg,
                other.map(|_| "Ok(..)")
            ),
        }
    }};
}

fn nan() -> Array2<f64> {
    array![[1.0, f64::NAN], [0.0, 1.0]]
}
fn pinf() -> Array2<f64> {
    array![[1.0, 0.0], [f64::INFINITY, 1.0]]
}
fn ninf() -> Array2<f64> {
    array![[f64::NEG_INFINITY, 0.0], [0.0, 1.0]]
}
fn empty() -> Array2<f64> {
    Array2::zeros((0, 3))
}
fn bads() -> [Array2<f64>; 3] {
    [nan(), pinf(), ninf()]
}

#[test]
fn svd_entry_points() {
    for d in [SvdDriver::QrIteration, SvdDriver::DivideAndConquer] {
        for b in bads() {
            assert_err!(singular_values(b.view(), d), NonFinite, "a");
            assert_err!(svd_thin(b.view(), d), NonFinite, "a");
            assert_err!(svd_full(b.view(), d), NonFinite, "a");
            assert_err!(polar_factor(b.view(), d), NonFinite, "a");
        }
        assert_err!(singular_values(empty().view(), d), Empty, "a");
        assert_err!(svd_thin(empty().view(), d), Empty, "a");
        assert_err!(svd_full(empty().view(), d), Empty, "a");
        assert_err!(polar_factor(empty().view(), d), Empty, "a");
    }
    // The error reports where the bad entry is.
    match singular_values(nan().view(), SvdDriver::QrIteration) {
        Err(LinalgError::Input(InputError::NonFinite {
            row, col, value, ..
        })) => {
            assert_eq!((row, col), (0, 1));
            assert!(value.is_nan());
        }
        other => panic!("{other:?}"),
    }
    let msg = singular_values(pinf().view(), SvdDriver::QrIteration)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("`a`") && msg.contains("inf") && msg.contains("(1, 0)"),
        "{msg}"
    );
}

#[test]
fn cond_entry_points() {
    for b in bads() {
        assert_err!(condition_number(b.view()), NonFinite, "a");
        assert_err!(
            condition_number_with(b.view(), RankTolerance::Numpy),
            NonFinite,
            "a"
        );
        assert_err!(
            pseudo_condition_number(b.view(), RankTolerance::Numpy),
            NonFinite,
            "a"
        );
        assert_err!(
            numerical_rank(b.view(), RankTolerance::Numpy),
            NonFinite,
            "a"
        );
        assert_err!(conditioning(b.view(), RankTolerance::Numpy), NonFinite, "a");
    }
    assert_err!(condition_number(empty().view()), Empty, "a");
    assert_err!(
        pseudo_condition_number(empty().view(), RankTolerance::Numpy),
        Empty,
        "a"
    );
    assert_err!(
        numerical_rank(empty().view(), RankTolerance::Numpy),
        Empty,
        "a"
    );
    let a = array![[1.0, 0.0], [0.0, 2.0]];
    for tol in [
        RankTolerance::Relative(-1.0),
        RankTolerance::Relative(f64::NAN),
        RankTolerance::Absolute(f64::INFINITY),
    ] {
        assert_err!(condition_number_with(a.view(), tol), InvalidArgument, "tol");
        assert_err!(numerical_rank(a.view(), tol), InvalidArgument, "tol");
    }
    let s = array![2.0, 1.0];
    assert_err!(
        conditioning_from_singular_values(s.view(), 3, 3, RankTolerance::Numpy),
        ShapeMismatch,
        "s"
    );
    assert_err!(
        conditioning_from_singular_values(array![2.0, -1.0].view(), 2, 2, RankTolerance::Numpy),
        InvalidArgument,
        "s"
    );
    assert_err!(
        conditioning_from_singular_values(array![f64::NAN, 1.0].view(), 2, 2, RankTolerance::Numpy),
        NonFinite,
        "s"
    );
    assert_err!(
        conditioning_from_singular_values(
            Array1::<f64>::zeros(0).view(),
            0,
            2,
            RankTolerance::Numpy
        ),
        Empty,
        "s"
    );
}

#[test]
fn iterative_entry_points() {
    let o = IterativeOptions::default();
    for b in bads() {
        assert_err!(sigma_max_power(b.view(), o), NonFinite, "a");
        assert_err!(sigma_min_inverse(b.view(), o), NonFinite, "a");
        assert_err!(condition_number_estimate(b.view(), o), NonFinite, "a");
    }
    assert_err!(sigma_max_power(empty().view(), o), Empty, "a");
    assert_err!(sigma_min_inverse(empty().view(), o), Empty, "a");
    assert_err!(condition_number_estimate(empty().view(), o), Empty, "a");
    let a = array![[1.0, 0.0], [0.0, 2.0]];
    for tol in [0.0, -1.0, 1.0, f64::NAN] {
        let bad = IterativeOptions { tol, ..o };
        assert_err!(sigma_max_power(a.view(), bad), InvalidArgument, "opts.tol");
        assert_err!(
            sigma_min_inverse(a.view(), bad),
            InvalidArgument,
            "opts.tol"
        );
        assert_err!(
            condition_number_estimate(a.view(), bad),
            InvalidArgument,
            "opts.tol"
        );
    }
    let bad = IterativeOptions { max_iter: 0, ..o };
    assert_err!(
        condition_number_estimate(a.view(), bad),
        InvalidArgument,
        "opts.max_iter"
    );
}

#[test]
fn newton_schulz_entry_points() {
    for b in bads() {
        assert_err!(newton_schulz_muon(&b), NonFinite, "x");
        assert_err!(newton_schulz_cubic(&b, 3), NonFinite, "x");
        assert_err!(
            newton_schulz(&b, &NsSchedule::polar_express(10).unwrap()),
            NonFinite,
            "x"
        );
        assert_err!(Matrix::polar_factor(&b), NonFinite, "self");
    }
    assert_err!(newton_schulz_muon(&empty()), Empty, "x");
    assert_err!(newton_schulz_cubic(&empty(), 3), Empty, "x");
    let a = array![[1.0, 0.0], [0.0, 2.0]];
    let s = NsSchedule {
        steps: vec![PolyStep::new(1.0, f64::INFINITY, 0.0)],
        normalization: 1.0,
    };
    assert_err!(newton_schulz(&a, &s), InvalidArgument, "schedule.steps");
    let s = NsSchedule {
        steps: vec![],
        normalization: f64::NAN,
    };
    assert_err!(
        newton_schulz(&a, &s),
        InvalidArgument,
        "schedule.normalization"
    );
    // f32 too.
    let b32 = array![[1.0f32, f32::NAN]];
    assert_err!(newton_schulz_muon(&b32), NonFinite, "x");
}

#[test]
fn matrix_trait_shape_checks() {
    let a: Array2<f64> = Array2::ones((2, 3));
    let b: Array2<f64> = Array2::ones((2, 3));
    assert_err!(a.matmul(&b), ShapeMismatch, "rhs");
    let mut c: Array2<f64> = Array2::zeros((2, 2));
    assert_err!(c.gemm(1.0, &a, &b, 0.0), ShapeMismatch, "b");
    let bt = b.t().to_owned();
    let mut wrong: Array2<f64> = Array2::zeros((3, 3));
    assert_err!(wrong.gemm(1.0, &a, &bt, 0.0), ShapeMismatch, "self");
    assert_err!(wrong.mul_add(1.0, &a, &bt, 0.0), ShapeMismatch, "self");
    assert_err!(c.axpy(1.0, &a), ShapeMismatch, "x");
    assert_err!(Matrix::validate(&nan(), "w"), NonFinite, "w");
    assert_err!(Matrix::validate(&empty(), "w"), Empty, "w");
}

#[test]
fn psd_entry_points() {
    for b in bads() {
        assert_err!(psd_sqrt(b.view(), RankTolerance::Numpy), NonFinite, "p");
        assert_err!(psd_inv_sqrt(b.view(), RankTolerance::Numpy), NonFinite, "p");
    }
    assert_err!(psd_sqrt(empty().view(), RankTolerance::Numpy), Empty, "p");
    assert_err!(
        psd_inv_sqrt(empty().view(), RankTolerance::Numpy),
        Empty,
        "p"
    );
    let rect: Array2<f64> = Array2::ones((2, 3));
    assert_err!(psd_sqrt(rect.view(), RankTolerance::Numpy), NotSquare, "p");
    assert_err!(
        psd_inv_sqrt(rect.view(), RankTolerance::Numpy),
        NotSquare,
        "p"
    );
    let asym = array![[1.0, 0.5], [0.0, 1.0]];
    assert_err!(
        psd_sqrt(asym.view(), RankTolerance::Numpy),
        NotSymmetric,
        "p"
    );
    let indef = array![[1.0, 0.0], [0.0, -1.0]];
    assert_err!(
        psd_sqrt(indef.view(), RankTolerance::Numpy),
        NotPositiveSemidefinite,
        "p"
    );
    assert_err!(
        psd_inv_sqrt(indef.view(), RankTolerance::Numpy),
        NotPositiveSemidefinite,
        "p"
    );
    let id = Array2::<f64>::eye(2);
    assert_err!(
        psd_sqrt(id.view(), RankTolerance::Relative(-0.5)),
        InvalidArgument,
        "tol"
    );
}

#[test]
fn kron_entry_points() {
    let ok = array![[1.0, 2.0], [3.0, 4.0]];
    for b in bads() {
        assert_err!(vec(b.view()), NonFinite, "m");
        assert_err!(kron(b.view(), ok.view()), NonFinite, "a");
        assert_err!(kron(ok.view(), b.view()), NonFinite, "b");
        assert_err!(
            kron_matvec(b.view(), ok.view(), array![1.0, 2.0, 3.0, 4.0].view()),
            NonFinite,
            "a"
        );
    }
    assert_err!(vec(empty().view()), Empty, "m");
    assert_err!(kron(empty().view(), ok.view()), Empty, "a");
    assert_err!(kron(ok.view(), empty().view()), Empty, "b");
    let v = array![1.0, 2.0, 3.0];
    assert_err!(unvec(v.view(), 2, 2), ShapeMismatch, "v");
    assert_err!(unvec(v.view(), 0, 3), InvalidArgument, "rows");
    assert_err!(unvec(array![f64::NAN].view(), 1, 1), NonFinite, "v");
    assert_err!(unvec(Array1::<f64>::zeros(0).view(), 1, 1), Empty, "v");
    assert_err!(
        kron_matvec(ok.view(), ok.view(), v.view()),
        ShapeMismatch,
        "x"
    );
    assert_err!(
        kron_matvec(
            ok.view(),
            ok.view(),
            array![1.0, 2.0, f64::INFINITY, 0.0].view()
        ),
        NonFinite,
        "x"
    );
    assert_err!(commutation_matrix::<f64>(0, 3), InvalidArgument, "m");
    assert_err!(commutation_matrix::<f64>(3, 0), InvalidArgument, "n");
    assert_err!(commutation_matrix::<f64>(100_000, 100_000), TooLarge, "m");
    assert_err!(Commutation::new(usize::MAX, 2), TooLarge, "m");
    let big = Array2::<f64>::ones((1 << 15, 1));
    assert_err!(kron(big.view(), big.view().t()), TooLarge, "a");
    let c = Commutation::new(2, 3).unwrap();
    assert_err!(c.apply(v.view()), ShapeMismatch, "v");
    assert_err!(
        c.apply(array![1.0, 2.0, 3.0, 4.0, 5.0, f64::NAN].view()),
        NonFinite,
        "v"
    );
    assert_err!(c.apply_rows(ok.view()), ShapeMismatch, "x");
    assert_err!(c.apply_rows(empty().view()), Empty, "x");
}
