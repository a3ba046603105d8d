//! Shared machinery of the generated bad-input run: element types, memory layouts for `f32` and
//! `f64`, the f64 reference of an input (its exactly rescaled spectrum), error matching and the
//! derived tolerances.

use kappa_linalg::{singular_values, InputError, LinalgError, Real, SvdDriver};
use kappa_testkit::hostile::{matrices, Layout};
use ndarray::{s, Array2, ArrayView2, ShapeBuilder};

/// The error an entry point must give: its variant and argument names.
pub type Want = Option<(&'static str, &'static str)>;

/// The outcome of one check: `Err` says what was wrong.
pub type Check = Result<(), String>;

/// The shapes every matrix entry point is run on: tall, wide, square.
pub const SHAPES: [(usize, usize); 3] = [(3, 2), (2, 4), (4, 4)];

/// The fixed seed of the hostile matrices.
pub const SEED: u64 = 17;

/// An element type under test.
pub trait Elem: Real + Send + Sync + std::fmt::Debug + 'static {
    /// The largest finite value, as f64.
    const MAX: f64;
    /// The smallest positive subnormal, as f64.
    const MIN_SUB: f64;
}

impl Elem for f32 {
    const MAX: f64 = f32::MAX as f64;
    const MIN_SUB: f64 = (f32::MIN_POSITIVE * f32::EPSILON) as f64;
}

impl Elem for f64 {
    const MAX: f64 = f64::MAX;
    const MIN_SUB: f64 = f64::MIN_POSITIVE * f64::EPSILON;
}

/// x·2^k in f64, exact (two power-of-two factors, each representable for |k| ≤ 2046).
pub fn scale2(x: f64, k: i32) -> f64 {
    let h = k / 2;
    x * 2f64.powi(h) * 2f64.powi(k - h)
}

/// The binary exponent e of x ≠ 0 finite: |x| = f·2^e, f ∈ [0.5, 1).
pub fn exponent(x: f64) -> i32 {
    let mut e = x.abs().log2().floor() as i32 + 1;
    // log2 may be off by one next to a power of two; fix it exactly.
    while scale2(x.abs(), -e) >= 1.0 {
        e += 1;
    }
    while scale2(x.abs(), -e) < 0.5 {
        e -= 1;
    }
    e
}

/// The hostile inputs for element type `A`: the testkit's matrices converted to `A` (so for
/// f32, 1e±300 and near-f64::MAX become ±∞ or 0), plus, for f32, the same Gaussian near
/// `f32::MAX` and at f32's subnormal scale; and for both, a matrix with every entry near ±MAX.
pub fn inputs<A: Elem>(rows: usize, cols: usize) -> Vec<(String, Array2<A>)> {
    let base = matrices(SEED, rows, cols);
    let mut out: Vec<(String, Array2<A>)> = base
        .iter()
        .map(|(n, a)| (n.clone(), a.mapv(A::from_f64_lossy)))
        .collect();
    // Every entry near ±MAX: even ‖A‖_F overflows (√(mn)·0.9·MAX).
    let g = &base[0].1;
    out.push((
        "±0.9·MAX everywhere".into(),
        g.mapv(|x| A::from_f64_lossy(x.signum() * 0.9 * A::MAX)),
    ));
    if A::EPS > 1e-10 {
        out.push((
            "gaussian×f32::MAX/2".into(),
            g.mapv(|x| A::from_f64_lossy(x * A::MAX / 2.0)),
        ));
        out.push((
            "gaussian×1e-42 (f32 subnormal)".into(),
            g.mapv(|x| A::from_f64_lossy(x * 1e-42)),
        ));
    }
    out
}

/// Values of `A` in a [`Layout`] (the testkit's layouts, for any element type).
pub struct Laid<A> {
    layout: Layout,
    storage: Array2<A>,
}

impl<A: Elem> Laid<A> {
    /// `a` laid out as `layout` says.
    pub fn new(layout: Layout, a: &Array2<A>) -> Self {
        let (r, c) = a.dim();
        let standard = |v: ArrayView2<'_, A>| {
            Array2::from_shape_vec(v.dim(), v.iter().copied().collect()).expect("shape")
        };
        let storage = match layout {
            Layout::Standard => a.clone(),
            Layout::ColumnMajor => {
                let mut f = Array2::zeros((r, c).f());
                f.assign(a);
                f
            }
            Layout::Strided => {
                let mut big = Array2::from_elem((2 * r, 2 * c), A::nan());
                big.slice_mut(s![..;2, ..;2]).assign(a);
                big
            }
            Layout::RowReversed => standard(a.slice(s![..;-1, ..])),
        };
        Self { layout, storage }
    }

    /// The view a caller would pass.
    pub fn view(&self) -> ArrayView2<'_, A> {
        match self.layout {
            Layout::Standard | Layout::ColumnMajor => self.storage.view(),
            Layout::Strided => self.storage.slice(s![..;2, ..;2]),
            Layout::RowReversed => self.storage.slice(s![..;-1, ..]),
        }
    }
}

/// What an input is, as the crate's contract sees it.
#[derive(Clone, Debug)]
pub enum Input {
    /// No rows or no columns.
    Empty,
    /// A NaN or ±∞ entry.
    NonFinite,
    /// Finite, with its reference spectrum.
    Finite(Reference),
}

/// The f64 reference of a finite input A: A = 2^e·A_s exactly, max |A_s| ∈ [0.5, 1) (or A = 0,
/// e = 0), and the singular values of A_s computed at unit scale in standard layout.
#[derive(Clone, Debug)]
pub struct Reference {
    /// A_s.
    pub a_s: Array2<f64>,
    /// The exponent e.
    pub e: i32,
    /// σ(A_s), descending.
    pub s: Vec<f64>,
}

impl Reference {
    /// (m, n).
    pub fn dim(&self) -> (usize, usize) {
        self.a_s.dim()
    }

    /// σ₁(A_s).
    pub fn s1(&self) -> f64 {
        self.s[0]
    }

    /// ‖A_s‖_F.
    pub fn fro(&self) -> f64 {
        self.a_s.iter().map(|x| x * x).sum::<f64>().sqrt()
    }

    /// p(m, n) = 30·max(m, n): the SVD backward-error factor the crate documents and tests
    /// (docs/linalg.md, Accuracy: |σ̂_i − σ_i| ≤ 30·max(m,n)·ε·σ₁ and the same for ‖A − UΣVᵀ‖_F).
    pub fn p(&self) -> f64 {
        let (m, n) = self.dim();
        30.0 * m.max(n) as f64
    }

    /// Absolute tolerance on a σ in A_s's units for a result in precision `A`: the SVD bound
    /// for the result (ε_A) and for the reference (ε_64), plus the rounding of a returned σ that
    /// is subnormal in `A` (one subnormal ulp, 2^−e in A_s's units).
    pub fn sigma_tol<A: Elem>(&self) -> f64 {
        self.p() * (A::EPS + f64::EPSILON) * self.s1() + scale2(A::MIN_SUB, -self.e)
    }

    /// A value of A's units expressed in A_s's units.
    pub fn to_scaled(&self, x: f64) -> f64 {
        scale2(x, -self.e)
    }

    /// Whether σ₁(A) = 2^e·σ₁(A_s) overflows `A`: `Some(true)`/`Some(false)` when clear by more
    /// than the relative tolerance `rel`, `None` when within it of `A::MAX`.
    pub fn overflows<A: Elem>(&self, rel: f64) -> Option<bool> {
        let l = self.s1().log2() + self.e as f64 - A::MAX.log2();
        if l > (1.0 + rel).log2() {
            Some(true)
        } else if l < (1.0 - rel).log2() {
            Some(false)
        } else {
            None
        }
    }
}

/// Classifies `x` (values as f64) and computes its reference.
pub fn analyse<A: Elem>(x: &Array2<A>) -> Input {
    let (m, n) = x.dim();
    if m == 0 || n == 0 {
        return Input::Empty;
    }
    if !x.iter().all(|v| v.is_finite()) {
        return Input::NonFinite;
    }
    let amax = x.iter().fold(0.0f64, |a, v| a.max(v.to_f64_lossy().abs()));
    let e = if amax == 0.0 { 0 } else { exponent(amax) };
    let a_s = x.mapv(|v| scale2(v.to_f64_lossy(), -e));
    let s = singular_values(a_s.view(), SvdDriver::QrIteration)
        .expect("the reference SVD of a unit-scale standard matrix")
        .to_vec();
    Input::Finite(Reference { a_s, e, s })
}

/// The variant name and argument of an error.
pub fn kind(e: &LinalgError) -> (&'static str, &'static str) {
    use LinalgError as E;
    match e {
        E::Input(InputError::Empty { arg, .. }) => ("Empty", arg),
        E::Input(InputError::NonFinite { arg, .. }) => ("NonFinite", arg),
        E::Input(InputError::ShapeMismatch { arg, .. }) => ("ShapeMismatch", arg),
        E::Input(InputError::InvalidArgument { arg, .. }) => ("InvalidArgument", arg),
        E::NotSquare { arg, .. } => ("NotSquare", arg),
        E::NotSymmetric { arg, .. } => ("NotSymmetric", arg),
        E::NotPositiveSemidefinite { arg, .. } => ("NotPositiveSemidefinite", arg),
        E::TooLarge { arg, .. } => ("TooLarge", arg),
        E::Overflow { arg, .. } => ("Overflow", arg),
        E::UnsupportedDtype { arg, .. } => ("UnsupportedDtype", arg),
        E::Lapack { arg, .. } => ("Lapack", arg),
        E::Backend { arg, .. } => ("Backend", arg),
        _ => ("unknown", ""),
    }
}

/// Checks that `r` is the error `variant` naming `arg`.
pub fn expect_err<T>(r: &kappa_linalg::Result<T>, variant: &str, arg: &str) -> Check {
    match r {
        Err(e) if kind(e) == (variant, arg) => Ok(()),
        Err(e) => Err(format!("expected {variant} on `{arg}`, got {e}")),
        Ok(_) => Err(format!("expected {variant} on `{arg}`, got Ok")),
    }
}

/// For an empty or non-finite input, the check that `r` is the matching error on `arg`;
/// `None` for a finite input.
pub fn input_error<T>(r: &kappa_linalg::Result<T>, input: &Input, arg: &str) -> Option<Check> {
    match input {
        Input::Empty => Some(expect_err(r, "Empty", arg)),
        Input::NonFinite => Some(expect_err(r, "NonFinite", arg)),
        Input::Finite(_) => None,
    }
}

/// Unwraps an `Ok`, or says which error came instead.
pub fn ok<T>(r: kappa_linalg::Result<T>, what: &str) -> Result<T, String> {
    r.map_err(|e| format!("{what}: unexpected error {e}"))
}

/// `a` as f64.
pub fn to64<A: Elem>(a: &Array2<A>) -> Array2<f64> {
    a.mapv(|x| x.to_f64_lossy())
}

/// max |QᵀQ − I| (columns) or max |QQᵀ − I| (rows) over the smaller side.
pub fn orthonormality(q: &Array2<f64>) -> f64 {
    let g = if q.nrows() >= q.ncols() {
        q.t().dot(q)
    } else {
        q.dot(&q.t())
    };
    let eye = Array2::<f64>::eye(g.nrows());
    (&g - &eye).iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// Fails with `what` unless `ok`.
pub fn ensure(ok: bool, what: impl FnOnce() -> String) -> Check {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}
