//! Bad input over every public entry point of kappa-attention: an error of the right kind naming
//! the right argument, or a documented value — never a panic, a hang or an abort.
//!
//! Inputs are `kappa_testkit::hostile::matrices` (NaN/±∞, empty, 1×1, zero, rank one, 1e±300,
//! near `f64::MAX`, subnormal, transposed shape) in every `Layout` for f64, and the same values
//! at f32's scales (1e±30, `f32::MAX/2`, 1e-40) in the standard and row-reversed layouts for f32,
//! plus parameter sweeps (λ, scale, offsets, k, sizes, heads, thresholds, policies). Seeds are
//! fixed. Each call runs under `Fuzz::check` (deadline, caught panic), and each check states what
//! it expects, so it can fail.

use std::fmt::Debug;

use kappa_attention::{
    attention, attention_diagnostics, block_identity, full_rank_bound, identity_shift_flops,
    jacobian_singular_values, k_rank_bound, kappa_from_singular_values, projection_stats,
    rect_identity, softmax_jacobian_apply, softmax_jacobian_conditioning, softmax_jacobian_dense,
    softmax_jacobian_frobenius, softmax_jacobian_singular_values, softmax_row_jacobian,
    softmax_rows, theorem_3_4, AttentionError, AttentionOptions, Forward, HeadLayout,
    IdentityShift, InputError, Kappa, LambdaPolicy, MultiHeadAttention, ScoreScale, SelfAttention,
    SvdCorrection, WeightJacobian,
};
use kappa_linalg::Real;
use kappa_testkit::hostile::{matrices, Fuzz, LaidOut, Layout};
use ndarray::{s, Array1, Array2, ArrayView2};

/// Sizes of the head under test: N tokens, D model dimension, k head dimension (all ≥ 2, so a
/// 1×1 input never has a matching shape).
const N: usize = 3;
const D: usize = 4;
const K: usize = 2;
const SEEDS: [u64; 2] = [17, 4242];

// ---------------------------------------------------------------------------------------------
// Expectations
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Empty,
    NonFinite,
    Shape,
    Invalid,
    TooLarge,
    Overflow,
    Unattainable,
    Other,
}

/// What a call must do.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// Return `Ok` with a value that passes the call's check.
    Ok,
    /// Fail with this kind of error naming this argument.
    Err(Kind, &'static str),
    /// Either of the two (inputs so large that the result may not be representable).
    OkOr(Kind, &'static str),
}

fn kind(e: &AttentionError) -> (Kind, String) {
    match e {
        AttentionError::Input(InputError::Empty { arg, .. }) => (Kind::Empty, arg.to_string()),
        AttentionError::Input(InputError::NonFinite { arg, .. }) => {
            (Kind::NonFinite, arg.to_string())
        }
        AttentionError::Input(InputError::ShapeMismatch { arg, .. }) => {
            (Kind::Shape, arg.to_string())
        }
        AttentionError::Input(InputError::InvalidArgument { arg, .. }) => {
            (Kind::Invalid, arg.to_string())
        }
        AttentionError::TooLarge { arg, .. } => (Kind::TooLarge, arg.to_string()),
        AttentionError::Overflow { arg, .. } => (Kind::Overflow, arg.to_string()),
        AttentionError::Unattainable { arg, .. } => (Kind::Unattainable, arg.to_string()),
        other => (Kind::Other, other.to_string()),
    }
}

/// Judges a result against what is wanted; `check` validates an `Ok` value.
fn judge<T>(
    r: kappa_attention::Result<T>,
    want: Want,
    check: impl FnOnce(&T) -> Result<(), String>,
) -> Result<(), String> {
    match (r, want) {
        (Ok(v), Want::Ok | Want::OkOr(..)) => check(&v),
        (Ok(_), Want::Err(k, a)) => Err(format!("Ok, expected {k:?} naming `{a}`")),
        (Err(e), Want::Err(k, a) | Want::OkOr(k, a)) => {
            let (got, arg) = kind(&e);
            if got == k && arg == a {
                Ok(())
            } else {
                Err(format!("expected {k:?} naming `{a}`, got {got:?}: {e}"))
            }
        }
        (Err(e), Want::Ok) => Err(format!("expected Ok, got {e}")),
    }
}

/// The error a matrix argument must cause by itself (checked in this order by the crate), or
/// `None` when it is valid.
fn matrix_want<A: Real>(arg: &'static str, a: &ArrayView2<'_, A>, shape_ok: bool) -> Option<Want> {
    if a.is_empty() {
        Some(Want::Err(Kind::Empty, arg))
    } else if a.iter().any(|x| !x.is_finite()) {
        Some(Want::Err(Kind::NonFinite, arg))
    } else if !shape_ok {
        Some(Want::Err(Kind::Shape, arg))
    } else {
        None
    }
}

/// Whether a valid input is large enough that a product of up to four such factors (the scores
/// X W_Q W_Kᵀ Xᵀ) may leave the type's range: max|a| > MAX^{1/4}. Below it nothing in this
/// crate's computations at these sizes can overflow, so `Overflow` is then a defect.
fn huge<A: Real>(a: &ArrayView2<'_, A>) -> bool {
    let limit = A::max_value().to_f64_lossy().powf(0.25);
    a.iter().any(|x| x.to_f64_lossy().abs() > limit)
}

fn all_finite<A: Real>(a: &ArrayView2<'_, A>, what: &str) -> Result<(), String> {
    match a.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: entry {i} is not finite")),
    }
}

fn dims_are<A>(a: &Array2<A>, dims: (usize, usize), what: &str) -> Result<(), String> {
    if a.dim() == dims {
        Ok(())
    } else {
        Err(format!("{what}: shape {:?}, expected {dims:?}", a.dim()))
    }
}

/// Rows of an attention matrix sum to 1: each entry is exp(s − max)/Σ with exp within 1 ulp (ε
/// relative), the subtraction's rounding costing at most u·t·e^{-t} ≤ u/e absolute per entry,
/// n − 1 roundings in the row sum and one division, and n − 1 more in the test's own sum:
/// |Σ_j p̂_j − 1| ≤ (ε + n·u/e + (n − 1)u + u + (n − 1)u) ≤ (3n + 4)·u < (3n + 4)·ε.
/// Entries lie in [0, 1] and masked ones are exactly 0.
fn probability_rows<A: Real>(p: &ArrayView2<'_, A>, causal: bool) -> Result<(), String> {
    let tol = (3 * p.ncols() + 4) as f64 * A::EPS;
    for (i, row) in p.rows().into_iter().enumerate() {
        let sum: f64 = row.iter().map(|x| x.to_f64_lossy()).sum();
        if (sum - 1.0).abs() > tol {
            return Err(format!("row {i} sums to {sum} (tolerance {tol:e})"));
        }
        for (j, &x) in row.iter().enumerate() {
            if !(x >= A::zero() && x <= A::one()) || (causal && j > i && x != A::zero()) {
                return Err(format!("P[{i}, {j}] = {x:?}"));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Inputs in both precisions
// ---------------------------------------------------------------------------------------------

/// A matrix argument in some memory layout, for the element type `A`.
trait Source<A>: Clone + Send + 'static {
    fn view(&self) -> ArrayView2<'_, A>;
}

impl Source<f64> for LaidOut {
    fn view(&self) -> ArrayView2<'_, f64> {
        LaidOut::view(self)
    }
}

/// An f32 matrix, standard or row-reversed (rows stored in reverse, viewed with a negative
/// stride).
#[derive(Clone)]
struct F32 {
    storage: Array2<f32>,
    reversed: bool,
}

impl Source<f32> for F32 {
    fn view(&self) -> ArrayView2<'_, f32> {
        if self.reversed {
            self.storage.slice(s![..;-1, ..])
        } else {
            self.storage.view()
        }
    }
}

/// The hostile f64 matrices of about r×c in every layout.
fn hostile64(seed: u64, r: usize, c: usize) -> Vec<(String, LaidOut)> {
    let mut out = Vec::new();
    for (name, a) in matrices(seed, r, c) {
        for layout in Layout::ALL {
            out.push((format!("{name} {layout:?}"), layout.lay_out(&a)));
        }
    }
    out
}

/// The same hostile matrices at f32's scales (1e±300 → 1e±30, f64::MAX/2 → f32::MAX/2,
/// subnormal 1e-320 → 1e-40), standard and row-reversed.
fn hostile32(seed: u64, r: usize, c: usize) -> Vec<(String, F32)> {
    let set = matrices(seed, r, c);
    let base = set[0].1.clone();
    let mut out = Vec::new();
    for (name, a) in set {
        let a32: Array2<f32> = match name.as_str() {
            "gaussian×1e300" => base.mapv(|x| x as f32 * 1e30),
            "gaussian×1e-300" => base.mapv(|x| x as f32 * 1e-30),
            "gaussian×f64::MAX/2" => base.mapv(|x| x as f32 * (f32::MAX / 2.0)),
            "gaussian×1e-320 (subnormal)" => base.mapv(|x| x as f32 * 1e-40),
            _ => a.mapv(|x| x as f32),
        };
        let rev = a32.slice(s![..;-1, ..]).to_owned();
        out.push((
            format!("{name} f32"),
            F32 {
                storage: a32,
                reversed: false,
            },
        ));
        out.push((
            format!("{name} f32 row-reversed"),
            F32 {
                storage: rev,
                reversed: true,
            },
        ));
    }
    out
}

fn gaussian<A: Real>(seed: u64, r: usize, c: usize, scale: f64) -> Array2<A> {
    matrices(seed, r, c)[0]
        .1
        .mapv(|x| A::from_f64_lossy(x * scale))
}

fn head<A: Real>(seed: u64, causal: bool) -> SelfAttention<A> {
    let w = |o| gaussian::<A>(seed + o, D, K, 0.5);
    let opts = AttentionOptions {
        scale: ScoreScale::One,
        causal,
    };
    SelfAttention::new(w(1), w(2), w(3), opts).expect("a valid head")
}

fn forward<A: Real>(seed: u64, causal: bool) -> Forward<A> {
    head::<A>(seed, causal)
        .forward(gaussian::<A>(seed, N, D, 1.0).view())
        .expect("a valid forward pass")
}

// ---------------------------------------------------------------------------------------------
// The runs
// ---------------------------------------------------------------------------------------------

/// Everything that takes matrices, for one element type and one seed.
fn matrix_entry_points<A: Real, S: Source<A>>(
    fuzz: &mut Fuzz,
    seed: u64,
    make: impl Fn(u64, usize, usize) -> Vec<(String, S)>,
) {
    forward_and_heads::<A, S>(fuzz, seed, &make);
    jacobian_products::<A, S>(fuzz, seed, &make);
    softmax_functions::<A, S>(fuzz, seed, &make);
    corrections_and_stats::<A, S>(fuzz, seed, &make);
}

fn forward_and_heads<A: Real, S: Source<A>>(
    fuzz: &mut Fuzz,
    seed: u64,
    make: &impl Fn(u64, usize, usize) -> Vec<(String, S)>,
) {
    let ty = A::NAME;
    for causal in [false, true] {
        let h = head::<A>(seed, causal);
        // forward / attention / the corrected heads / multi-head, on hostile tokens.
        for (name, x) in make(seed, N, D) {
            let (h1, x1) = (h.clone(), x.clone());
            fuzz.check(
                format!("{ty} forward(x = {name}, causal {causal})"),
                move || {
                    let x = x1.view();
                    let want = matrix_want("x", &x, x.ncols() == D).unwrap_or(if huge(&x) {
                        Want::OkOr(Kind::Overflow, "x")
                    } else {
                        Want::Ok
                    });
                    judge(h1.forward(x), want, |f| {
                        all_finite(&f.output(), "output")?;
                        probability_rows(&f.attention_matrix(), causal)?;
                        let d = f.diagnostics().map_err(|e| format!("diagnostics: {e}"))?;
                        let ok = d.mean_entropy.is_finite()
                            && (0.0..=1.0).contains(&d.saturated_fraction)
                            && (0.0..=1.0).contains(&d.mean_diagonal);
                        ok.then_some(()).ok_or_else(|| format!("diagnostics {d:?}"))
                    })
                },
            );
            let (h2, x2) = (h.clone(), x.clone());
            fuzz.check(
                format!("{ty} attention()/λ-shift/SVD forward(x = {name})"),
                move || {
                    let x = x2.view();
                    let want = matrix_want("x", &x, x.ncols() == D).unwrap_or(if huge(&x) {
                        Want::OkOr(Kind::Overflow, "x")
                    } else {
                        Want::Ok
                    });
                    let (wq, wk, wv) = h2.weights();
                    let opts = h2.options();
                    judge(attention(x, wq, wk, wv, opts), want, |a| {
                        all_finite(&a.view(), "A")
                    })?;
                    let shifted = h2
                        .clone()
                        .with_identity_shift(IdentityShift::new(10.0).unwrap());
                    let shifted = shifted.map_err(|e| format!("shift: {e}"))?;
                    judge(shifted.forward(x), want, |f| {
                        probability_rows(&f.attention_matrix(), causal)
                    })?;
                    let svd = h2.with_svd_correction().map_err(|e| format!("svd: {e}"))?;
                    judge(svd.forward(x), want, |f| {
                        probability_rows(&f.attention_matrix(), causal)
                    })
                },
            );
        }
        // Hostile weights: each of wq, wk, wv in turn, the others valid.
        for (name, w) in make(seed + 1, D, K) {
            for which in 0..3 {
                let (hh, w1) = (h.clone(), w.clone());
                fuzz.check(
                    format!("{ty} SelfAttention::new(w{which} = {name})"),
                    move || weights_case::<A>(&hh, w1.view(), which, causal),
                );
            }
            let w2 = w.clone();
            fuzz.check(
                format!("{ty} MultiHeadAttention (wq = {name})"),
                move || multihead_case::<A>(w2.view(), seed),
            );
        }
    }
}

/// A head whose weight `which` is hostile: the error names it (or `wk` when a valid `wq` sets
/// other dimensions), or the head works end to end.
fn weights_case<A: Real>(
    h: &SelfAttention<A>,
    w: ArrayView2<'_, A>,
    which: usize,
    causal: bool,
) -> Result<(), String> {
    let names = ["wq", "wk", "wv"];
    let (q, k, v) = h.weights();
    let mut ws = [q.to_owned(), k.to_owned(), v.to_owned()];
    ws[which] = w.to_owned();
    let shape_ok = which == 0 || w.dim() == (D, K);
    let want = match matrix_want(names[which], &w, shape_ok) {
        Some(e) => e,
        None if w.dim() != (D, K) => Want::Err(Kind::Shape, "wk"),
        None => Want::Ok,
    };
    let [a, b, c] = ws;
    let r = SelfAttention::new(a, b, c, h.options());
    judge(r, want, |head| {
        if head.parameter_count() != 3 * D * K || head.dims() != (D, K) {
            return Err("dims".into());
        }
        let x = gaussian::<A>(7, N, D, 1.0);
        let big = huge(&w);
        let fwd = match head.forward(x.view()) {
            Ok(f) => f,
            Err(AttentionError::Overflow { arg: "x", .. }) if big => return Ok(()),
            Err(e) => return Err(format!("forward: {e}")),
        };
        probability_rows(&fwd.attention_matrix(), causal)?;
        match head.clone().with_svd_correction() {
            Ok(hs) => {
                for e in hs.effective_weights() {
                    all_finite(&e.view(), "W + C")?;
                }
            }
            Err(AttentionError::Overflow { arg: "self", .. }) if big => {}
            Err(e) => return Err(format!("svd correction: {e}")),
        }
        let t = theorem_3_4(&fwd);
        match t {
            Ok(t) if !t.ratio().is_nan() && t.rhs >= 1.0 => Ok(()),
            Ok(t) => Err(format!("theorem 3.4: ratio {} rhs {}", t.ratio(), t.rhs)),
            Err(AttentionError::Overflow { arg: "self", .. }) if big => Ok(()),
            Err(e) => Err(format!("theorem 3.4: {e}")),
        }
    })
}

/// Multi-head attention over hostile fused weights (wk, wv valid of wq's shape when it has one).
fn multihead_case<A: Real>(w: ArrayView2<'_, A>, seed: u64) -> Result<(), String> {
    let shape = if w.is_empty() { (D, K) } else { w.dim() };
    let other = gaussian::<A>(seed, shape.0, shape.1, 0.5);
    let want = matrix_want("wq", &w, true).unwrap_or(Want::Ok);
    let opts = AttentionOptions::default();
    let heads = if shape.1 % 2 == 0 { 2 } else { 1 };
    let r = MultiHeadAttention::new(w.to_owned(), other.clone(), other, heads, opts);
    judge(r, want, |m| {
        if m.heads() * m.head_dim() != shape.1 || m.parameter_count() != 3 * shape.0 * shape.1 {
            return Err("dims".into());
        }
        let big = huge(&w);
        for layout in [HeadLayout::SameBlock, HeadLayout::Shifted] {
            let fits = match layout {
                HeadLayout::SameBlock => m.head_dim() <= shape.0,
                HeadLayout::Shifted => shape.1 <= shape.0,
            };
            let want = if fits {
                Want::OkOr(Kind::Overflow, "lambda")
            } else {
                Want::Err(Kind::Invalid, "layout")
            };
            let want = if fits && !big { Want::Ok } else { want };
            judge(m.clone().with_identity_shift(2.0, layout), want, |ms| {
                let x = gaussian::<A>(seed, N, shape.0, 1.0);
                let want = if big {
                    Want::OkOr(Kind::Overflow, "x")
                } else {
                    Want::Ok
                };
                judge(ms.forward(x.view()), want, |a| {
                    all_finite(&a.view(), "MHA output")
                })?;
                judge(ms.project_qkv(x.view()), want, |_| Ok(()))?;
                let want_h = Want::Err(Kind::Invalid, "h");
                judge(ms.head(ms.heads()), want_h, |_| Ok(()))
            })?;
        }
        Ok(())
    })
}

fn jacobian_products<A: Real, S: Source<A>>(
    fuzz: &mut Fuzz,
    seed: u64,
    make: &impl Fn(u64, usize, usize) -> Vec<(String, S)>,
) {
    let ty = A::NAME;
    let fwd = forward::<A>(seed, false);
    for (name, t) in make(seed + 2, D, K) {
        for which in 0..3 {
            let (f, t1) = (fwd.clone(), t.clone());
            fuzz.check(format!("{ty} jvp_weights(t{which} = {name})"), move || {
                let t = t1.view();
                let names = ["dwq", "dwk", "dwv"];
                let unit = gaussian::<A>(3, D, K, 1.0);
                let mut args = [unit.view(), unit.view(), unit.view()];
                args[which] = t.reborrow();
                let want = matrix_want(names[which], &t, t.dim() == (D, K))
                    .unwrap_or(Want::OkOr(Kind::Overflow, "dwq"));
                judge(f.jvp_weights(args[0], args[1], args[2]), want, |da| {
                    dims_are(da, (N, K), "dA")?;
                    all_finite(&da.view(), "dA")
                })
            });
        }
    }
    for (name, g) in make(seed + 3, N, K) {
        let (f, g1) = (fwd.clone(), g.clone());
        fuzz.check(
            format!("{ty} vjp_weights/vjp_input(g = {name})"),
            move || {
                let g = g1.view();
                let want = matrix_want("g", &g, g.dim() == (N, K))
                    .unwrap_or(Want::OkOr(Kind::Overflow, "g"));
                judge(f.vjp_weights(g), want, |w| {
                    for b in [&w.q, &w.k, &w.v] {
                        dims_are(b, (D, K), "gradient")?;
                        all_finite(&b.view(), "gradient")?;
                    }
                    (w.to_vec().len() == 3 * D * K)
                        .then_some(())
                        .ok_or("to_vec".into())
                })?;
                judge(f.vjp_input(g), want, |gx| dims_are(gx, (N, D), "∂L/∂X"))?;
                let u = Array1::from_iter(g.t().iter().copied());
                let want_u = vector_want("u", &g, N * K, want);
                judge(f.vjp_weights_vec(u.view()), want_u, |v| {
                    len_is(v, 3 * D * K)
                })?;
                judge(f.vjp_input_vec(u.view()), want_u, |v| len_is(v, N * D))
            },
        );
    }
    for (name, dx) in make(seed + 4, N, D) {
        let (f, dx1) = (fwd.clone(), dx.clone());
        fuzz.check(format!("{ty} jvp_input(dx = {name})"), move || {
            let dx = dx1.view();
            let want = matrix_want("dx", &dx, dx.dim() == (N, D))
                .unwrap_or(Want::OkOr(Kind::Overflow, "dx"));
            judge(f.jvp_input(dx), want, |da| dims_are(da, (N, K), "dA"))?;
            let t = Array1::from_iter(dx.t().iter().copied());
            let want_t = vector_want("t", &dx, N * D, want);
            judge(f.jvp_input_vec(t.view()), want_t, |v| len_is(v, N * K))?;
            // The same entries as a weight tangent of length 3Dk (12 = N·D here, so it fits).
            let want_w = vector_want("t", &dx, 3 * D * K, want);
            let want_w = match want_w {
                Want::OkOr(..) => Want::OkOr(Kind::Overflow, "dwq"),
                w => w,
            };
            judge(f.jvp_weights_vec(t.view()), want_w, |v| len_is(v, N * K))
        });
    }
}

/// The expectation for the column-major vec of matrix `m` passed where a vector of length
/// `len` is due: as the matrix's own, with the vector's name and a length check.
fn vector_want<A: Real>(
    arg: &'static str,
    m: &ArrayView2<'_, A>,
    len: usize,
    matrix: Want,
) -> Want {
    if m.is_empty() {
        Want::Err(Kind::Empty, arg)
    } else if m.iter().any(|x| !x.is_finite()) {
        Want::Err(Kind::NonFinite, arg)
    } else if m.len() != len {
        Want::Err(Kind::Shape, arg)
    } else {
        match matrix {
            Want::OkOr(k, _) => Want::OkOr(k, arg),
            w => w,
        }
    }
}

fn len_is<A>(v: &Array1<A>, len: usize) -> Result<(), String> {
    (v.len() == len)
        .then_some(())
        .ok_or(format!("length {} ≠ {len}", v.len()))
}

fn softmax_functions<A: Real, S: Source<A>>(
    fuzz: &mut Fuzz,
    seed: u64,
    make: &impl Fn(u64, usize, usize) -> Vec<(String, S)>,
) {
    let ty = A::NAME;
    for (name, sc) in make(seed + 5, N, N) {
        let sc1 = sc.clone();
        fuzz.check(
            format!("{ty} softmax_rows and Λ (scores = {name})"),
            move || {
                let s = sc1.view();
                let want = matrix_want("scores", &s, true).unwrap_or(Want::Ok);
                for causal in [false, true] {
                    judge(softmax_rows(s, causal), want, |p| {
                        probability_rows(&p.view(), causal)?;
                        lambda_case(p.view(), s)
                    })?;
                }
                Ok(())
            },
        );
        // The same hostile matrix passed as an attention matrix p: refused unless in [0, 1].
        let sc2 = sc.clone();
        fuzz.check(format!("{ty} Λ functions (p = {name})"), move || {
            let p = sc2.view();
            let square = p.nrows() == p.ncols();
            let in01 = p.iter().all(|&x| x >= A::zero() && x <= A::one());
            let base = matrix_want("p", &p, true);
            let want = base.unwrap_or(if in01 {
                Want::Ok
            } else {
                Want::Err(Kind::Invalid, "p")
            });
            let want_sq = base.unwrap_or(if !in01 {
                Want::Err(Kind::Invalid, "p")
            } else if square {
                Want::Ok
            } else {
                Want::Err(Kind::Shape, "p")
            });
            judge(softmax_jacobian_dense(p), want_sq, |l| {
                all_finite(&l.view(), "Λ")
            })?;
            judge(softmax_jacobian_singular_values(p), want_sq, |s| sv_ok(s))?;
            judge(softmax_jacobian_conditioning(p), want_sq, |c| {
                (c.kappa >= A::one()).then_some(()).ok_or("κ(Λ) < 1".into())
            })?;
            judge(softmax_row_jacobian(p, 0), want, |j| {
                all_finite(&j.view(), "J_0")
            })?;
            let ds = Array2::<A>::ones(p.raw_dim());
            judge(softmax_jacobian_apply(p, ds.view()), want, |o| {
                all_finite(&o.view(), "Λ ds")
            })?;
            let scores = Array2::<A>::zeros(p.raw_dim());
            judge(
                attention_diagnostics(p, scores.view(), false, 0.99),
                want,
                |d| {
                    let ok = d.mean_entropy.is_finite() && d.mean_entropy >= 0.0;
                    ok.then_some(()).ok_or(format!("{d:?}"))
                },
            )
        });
        // Hostile ds against a valid P: linear, so any finite scale works or overflows cleanly.
        let sc3 = sc.clone();
        fuzz.check(
            format!("{ty} softmax_jacobian_apply(ds = {name})"),
            move || {
                let ds = sc3.view();
                let p = softmax_rows(gaussian::<A>(seed, N, N, 1.0).view(), false).unwrap();
                let want = matrix_want("ds", &ds, ds.dim() == (N, N))
                    .unwrap_or(Want::OkOr(Kind::Overflow, "ds"));
                judge(softmax_jacobian_apply(p.view(), ds), want, |o| {
                    all_finite(&o.view(), "Λ ds")?;
                    // Rows of Λ ds sum to 0: Σ_j p_j (ds_j − Σ_l p_l ds_l) = 0. Rounded, each row
                    // sum is at most (2n + 2)·u·2·max|ds| (two sums of n terms and a product, each
                    // term ≤ 2 max|ds|), compared here at (2n + 2)·ε·2·max|ds|, plus one
                    // underflow unit η (the smallest subnormal) per rounded operation, as the
                    // model fl(x ∘ y) = (x ∘ y)(1 + δ) + η has it for subnormal results.
                    let m = ds.iter().fold(0.0f64, |a, x| a.max(x.to_f64_lossy().abs()));
                    let eta = (A::min_positive_value() * A::epsilon()).to_f64_lossy();
                    let tol = (2 * N + 2) as f64 * (A::EPS * 2.0 * m + eta);
                    for row in o.rows() {
                        let s: f64 = row.iter().map(|x| x.to_f64_lossy()).sum();
                        if s.abs() > tol {
                            return Err(format!("row sum {s:e} > {tol:e}"));
                        }
                    }
                    Ok(())
                })
            },
        );
    }
}

/// Λ of a valid P and the diagnostics with hostile (but finite) scores.
fn lambda_case<A: Real>(p: ArrayView2<'_, A>, scores: ArrayView2<'_, A>) -> Result<(), String> {
    let want_sq = if p.nrows() == p.ncols() {
        Want::Ok
    } else {
        Want::Err(Kind::Shape, "p")
    };
    judge(softmax_jacobian_singular_values(p), want_sq, |s| {
        sv_ok(s)?;
        // Λ's eigenvalues lie in [0, 1/2]; computed ones within the SVD's error p(m,n)·ε·σ₁.
        let top = s[0].to_f64_lossy();
        (top <= 0.5 + 10.0 * (p.ncols() as f64) * A::EPS)
            .then_some(())
            .ok_or(format!("σ₁(Λ) = {top}"))
    })?;
    judge(
        attention_diagnostics(p, scores, false, 0.99),
        Want::Ok,
        |d| {
            // For p̂ ≥ 0 with row sum σ (1 up to rounding), −Σ p̂ ln p̂ ≤ σ ln(M/σ) (Jensen),
            // plus the f64 evaluation's own rounding: M terms of size ≤ 1/e + |ln p|, each
            // within 4ε₆₄ (product, log, sum), bounded by 4·M·ε₆₄·(1 + ln M).
            let m = p.ncols() as f64;
            let ok_row = |(i, &h): (usize, &f64)| {
                let sigma: f64 = p.row(i).iter().map(|x| x.to_f64_lossy()).sum();
                let h_max = sigma * (m / sigma).ln() + 4.0 * m * f64::EPSILON * (1.0 + m.ln());
                (0.0..=h_max).contains(&h)
            };
            let ok = d.entropy_per_row.iter().enumerate().all(ok_row)
                && d.max_logit.is_finite()
                && d.mean_softmax_jacobian_frobenius.is_finite();
            ok.then_some(()).ok_or(format!("{d:?}"))
        },
    )?;
    let probs: Vec<f64> = p.row(0).iter().map(|x| x.to_f64_lossy()).collect();
    let f = softmax_jacobian_frobenius(&probs);
    (0.0..1.0)
        .contains(&f)
        .then_some(())
        .ok_or(format!("‖J‖_F = {f}"))
}

fn sv_ok<A: Real>(s: &Array1<A>) -> Result<(), String> {
    let ok = s.iter().all(|x| x.is_finite() && *x >= A::zero())
        && s.windows(2).into_iter().all(|w| w[0] >= w[1]);
    ok.then_some(()).ok_or(format!("singular values {s:?}"))
}

fn corrections_and_stats<A: Real, S: Source<A>>(
    fuzz: &mut Fuzz,
    seed: u64,
    make: &impl Fn(u64, usize, usize) -> Vec<(String, S)>,
) {
    let ty = A::NAME;
    let unit = matrices(seed + 6, D, K)[0].1.mapv(A::from_f64_lossy);
    for (name, w) in make(seed + 6, D, K) {
        let (w1, u1) = (w.clone(), unit.clone());
        let scaled = name_is_scaled(&name);
        fuzz.check(
            format!("{ty} Kappa/projection_stats/SvdCorrection(w = {name})"),
            move || {
                let w = w1.view();
                let want = matrix_want("a", &w, true).unwrap_or(Want::Ok);
                let reference = scaled.then(|| Kappa::of(u1.view()).unwrap());
                judge(Kappa::of(w), want, |k| {
                    kappa_ok(k, reference.as_ref(), w.dim(), A::EPS)
                })?;
                let want_w = rename(want, "w");
                judge(projection_stats(w), want_w, |p| {
                    let k = Kappa::of(w).unwrap();
                    (p.kappa == k.kappa && p.sigma_max == k.sigma_max)
                        .then_some(())
                        .ok_or("stats ≠ Kappa".into())
                })?;
                let want_c = match want_w {
                    Want::Ok if huge(&w) => Want::OkOr(Kind::Overflow, "w"),
                    other => other,
                };
                judge(SvdCorrection::new(w), want_c, |c| {
                    let kc = c.corrected_kappa().to_f64_lossy();
                    if !(1.0..=2.0).contains(&kc) || c.sigma_min() > c.sigma_max() {
                        return Err(format!("corrected κ {kc}"));
                    }
                    all_finite(&c.matrix(), "C")?;
                    judge(c.apply(w), Want::OkOr(Kind::Overflow, "w"), |s| {
                        all_finite(&s.view(), "W + C")
                    })
                })
            },
        );
        let w2 = w.clone();
        fuzz.check(
            format!("{ty} IdentityShift/LambdaPolicy(w = {name})"),
            move || shift_and_policy_case::<A>(w2.view()),
        );
    }
    // x for IdentityShift::project.
    let wv = unit.clone();
    for (name, x) in make(seed + 7, N, D) {
        let (x1, w1) = (x.clone(), wv.clone());
        fuzz.check(
            format!("{ty} IdentityShift::project(x = {name})"),
            move || {
                let x = x1.view();
                let want = matrix_want("x", &x, x.ncols() == D).unwrap_or(if huge(&x) {
                    Want::OkOr(Kind::Overflow, "x")
                } else {
                    Want::Ok
                });
                let shift = IdentityShift::at_offset(3.0, D - K).unwrap();
                judge(shift.project(x, w1.view()), want, |p| {
                    dims_are(p, (x.nrows(), K), "X(W + λE)")
                })
            },
        );
    }
}

/// Whether a hostile matrix is the base Gaussian scaled to a normal number (so κ must match
/// the unit-scale one).
fn name_is_scaled(name: &str) -> bool {
    name.starts_with("gaussian×") && !name.contains("subnormal")
}

fn rename(w: Want, arg: &'static str) -> Want {
    match w {
        Want::Err(k, _) => Want::Err(k, arg),
        Want::OkOr(k, _) => Want::OkOr(k, arg),
        Want::Ok => Want::Ok,
    }
}

/// κ ≥ 1 (or ∞), rank ≤ min(m, n), σ_max ≥ σ_min ≥ 0; for a scaled copy of a reference matrix,
/// the same κ within the perturbation bound: the entries differ by a relative rounding ε (an
/// absolute ‖ΔA‖₂ ≤ √(mn)·ε·σ₁), each SVD adds p(m, n)·ε·σ₁ with p ≤ 10·max(m, n), and a
/// relative change δ of σ_min and σ₁ changes κ by at most 2δκ; so
/// |κ − κ_ref| ≤ 2·(2·10·max(m, n) + √(mn))·ε·κ² (to first order).
fn kappa_ok(
    k: &Kappa,
    reference: Option<&Kappa>,
    (m, n): (usize, usize),
    eps: f64,
) -> Result<(), String> {
    let valid = k.kappa >= 1.0
        && k.pseudo_kappa >= 1.0
        && k.rank <= k.full_rank
        && k.full_rank == m.min(n)
        && k.sigma_max >= k.sigma_min
        && k.sigma_min >= 0.0;
    if !valid {
        return Err(format!("{k:?}"));
    }
    if let Some(r) = reference {
        let c = 2.0 * (20.0 * m.max(n) as f64 + ((m * n) as f64).sqrt());
        let tol = c * eps * r.kappa * r.kappa;
        if (k.kappa - r.kappa).abs() > tol || k.rank != r.rank {
            return Err(format!(
                "κ = {} (rank {}) vs unit-scale {} (rank {}), tol {tol:e}",
                k.kappa, k.rank, r.kappa, r.rank
            ));
        }
    }
    Ok(())
}

/// The identity shift and the λ policies on a hostile weight.
fn shift_and_policy_case<A: Real>(w: ArrayView2<'_, A>) -> Result<(), String> {
    let bad = matrix_want("w", &w, true);
    let big = huge(&w);
    let fits = w.nrows() >= w.ncols();
    let want = bad.unwrap_or(if !fits {
        Want::Err(Kind::Invalid, "shift")
    } else if big {
        Want::OkOr(Kind::Overflow, "w")
    } else {
        Want::Ok
    });
    let shift = IdentityShift::new(1.5).unwrap();
    judge(shift.apply(w), want, |s| all_finite(&s.view(), "W + λE"))?;
    let want_g = bad.unwrap_or(Want::Ok);
    judge(shift.guarantees_decrease(w), want_g, |_| Ok(()))?;
    for policy in [
        LambdaPolicy::Fixed(10.0),
        LambdaPolicy::TargetKappa(1.5),
        LambdaPolicy::SufficientDecrease { margin: 0.1 },
        LambdaPolicy::RelativeToSigmaMax(10.0),
    ] {
        let zero_or_q = w.iter().all(|x| *x == A::zero()) || w.len() == 1;
        let want_p = match (bad, policy) {
            (Some(e), _) => e,
            (None, LambdaPolicy::SufficientDecrease { .. }) if zero_or_q => {
                Want::Err(Kind::Unattainable, "w")
            }
            (None, _) if big => Want::OkOr(Kind::Overflow, "w"),
            (None, _) => Want::Ok,
        };
        judge(policy.choose(w), want_p, |&l| {
            (l.is_finite() && l >= 0.0)
                .then_some(())
                .ok_or(format!("λ = {l}"))
        })?;
        judge(policy.choose_shared(&[w, w]), want_p, |&l| {
            (l.is_finite() && l >= 0.0)
                .then_some(())
                .ok_or(format!("shared λ = {l}"))
        })?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------------------------

const LAMBDAS: [f64; 9] = [
    0.0,
    1e-300,
    1.0,
    10.0,
    1e30,
    1e300,
    f64::MAX,
    -1.0,
    f64::NAN,
];
const OFFSETS: [usize; 6] = [0, 1, D - K, D - K + 1, usize::MAX - 1, usize::MAX];

/// λ, offsets and scales, in the precision they are used in.
fn parameter_entry_points<A: Real>(fuzz: &mut Fuzz, seed: u64) {
    let ty = A::NAME;
    for lambda in LAMBDAS
        .into_iter()
        .chain([f64::INFINITY, -0.0, 3.4e38, 3.5e38])
    {
        for offset in OFFSETS {
            fuzz.check(
                format!("{ty} IdentityShift::at_offset({lambda:e}, {offset})"),
                move || identity_shift_case::<A>(lambda, offset, seed),
            );
        }
        for layout in [HeadLayout::SameBlock, HeadLayout::Shifted] {
            fuzz.check(
                format!("{ty} MHA::with_identity_shift({lambda:e}, {layout:?})"),
                move || {
                    let w = gaussian::<A>(seed, D, 2 * K, 0.5);
                    let m = MultiHeadAttention::new(
                        w.clone(),
                        w.clone(),
                        w,
                        2,
                        AttentionOptions::default(),
                    )
                    .unwrap();
                    let want = lambda_want::<A>(lambda, "lambda");
                    judge(m.with_identity_shift(lambda, layout), want, |m| {
                        let x = gaussian::<A>(seed, N, D, 1.0);
                        let want = if A::from_f64_lossy(lambda).to_f64_lossy() > 1e10 {
                            Want::OkOr(Kind::Overflow, "x")
                        } else {
                            Want::Ok
                        };
                        judge(m.forward(x.view()), want, |a| all_finite(&a.view(), "MHA"))
                    })
                },
            );
        }
    }
    for s in [
        1.0,
        1e-300,
        1e-40,
        1e-38,
        1e300,
        1e39,
        f64::MAX,
        0.0,
        -2.0,
        f64::NAN,
        f64::INFINITY,
    ] {
        for causal in [false, true] {
            fuzz.check(
                format!("{ty} ScoreScale::Custom({s:e}), causal {causal}"),
                move || scale_case::<A>(ScoreScale::Custom(s), K, causal, seed),
            );
        }
    }
    for k in [0usize, 1, 4, usize::MAX] {
        fuzz.check(
            format!("{ty} ScoreScale::InvSqrtK.divisor({k})"),
            move || {
                let want = if k == 0 {
                    Want::Err(Kind::Invalid, "k")
                } else {
                    Want::Ok
                };
                judge(ScoreScale::InvSqrtK.divisor(k), want, |&s| {
                    (s >= 1.0).then_some(()).ok_or("s".into())
                })?;
                judge(ScoreScale::InvSqrtK.divisor_in::<A>(k), want, |s| {
                    s.is_normal().then_some(()).ok_or("s".into())
                })?;
                judge(ScoreScale::One.divisor_in::<A>(k), Want::Ok, |&s| {
                    (s == A::one()).then_some(()).ok_or("s".into())
                })
            },
        );
    }
}

/// The error a λ must cause where it is used in `A`, naming `arg` (`lambda` at construction).
fn lambda_want<A: Real>(lambda: f64, arg: &'static str) -> Want {
    if !(lambda.is_finite() && lambda >= 0.0) {
        Want::Err(Kind::Invalid, "lambda")
    } else if !A::from_f64_lossy(lambda).is_finite() {
        Want::Err(Kind::Invalid, arg)
    } else {
        Want::Ok
    }
}

fn identity_shift_case<A: Real>(lambda: f64, offset: usize, seed: u64) -> Result<(), String> {
    let r = IdentityShift::at_offset(lambda, offset);
    let valid = lambda.is_finite() && lambda >= 0.0;
    let want = if valid {
        Want::Ok
    } else {
        Want::Err(Kind::Invalid, "lambda")
    };
    judge(r, want, |shift| {
        if shift.offset() != offset || shift.lambda() != lambda {
            return Err("accessors".into());
        }
        let fits = offset.checked_add(K).is_some_and(|e| e <= D);
        let la = A::from_f64_lossy(lambda);
        let big = la.to_f64_lossy() > 1e10;
        let w = gaussian::<A>(seed, D, K, 0.5);
        let x = gaussian::<A>(seed, N, D, 1.0);
        let want_fit = |over: &'static str| {
            if !fits || !la.is_finite() {
                Want::Err(Kind::Invalid, "shift")
            } else if big {
                Want::OkOr(Kind::Overflow, over)
            } else {
                Want::Ok
            }
        };
        judge(shift.apply(w.view()), want_fit("w"), |s| {
            all_finite(&s.view(), "W + λE")
        })?;
        judge(shift.project(x.view(), w.view()), want_fit("x"), |p| {
            all_finite(&p.view(), "XW")
        })?;
        let want_m = if !fits {
            Want::Err(Kind::Invalid, "offset")
        } else {
            lambda_want::<A>(lambda, "lambda")
        };
        judge(shift.matrix::<A>(D, K), want_m, |m| {
            dims_are(m, (D, K), "λE")
        })?;
        let want_h = match want_fit("shift") {
            Want::OkOr(..) => Want::OkOr(Kind::Overflow, "x"),
            w => w,
        };
        judge(
            head::<A>(seed, false).with_identity_shift(*shift),
            want_h,
            |h| {
                let want = if big {
                    Want::OkOr(Kind::Overflow, "x")
                } else {
                    Want::Ok
                };
                judge(h.forward(x.view()), want, |f| {
                    probability_rows(&f.attention_matrix(), false)
                })
            },
        )?;
        for sigma in [0.0, 1.0, lambda, f64::MAX, -1.0, f64::NAN, f64::INFINITY] {
            if let Some(b) = shift.weyl_bound(sigma) {
                let valid = sigma.is_finite() && (0.0..lambda).contains(&sigma);
                if !(valid && b >= 1.0) {
                    return Err(format!("weyl_bound({sigma}) = {b}"));
                }
            }
        }
        Ok(())
    })
}

fn scale_case<A: Real>(scale: ScoreScale, k: usize, causal: bool, seed: u64) -> Result<(), String> {
    let ScoreScale::Custom(s) = scale else {
        unreachable!()
    };
    let valid64 = s.is_finite() && s > 0.0;
    let sa = A::from_f64_lossy(s);
    let valid = valid64 && sa.is_normal() && (A::one() / sa).is_finite();
    let want = if valid {
        Want::Ok
    } else {
        Want::Err(Kind::Invalid, "scale")
    };
    judge(
        scale.divisor(k),
        if valid64 { Want::Ok } else { want },
        |&d| (d == s).then_some(()).ok_or("divisor".into()),
    )?;
    judge(scale.divisor_in::<A>(k), want, |d| {
        d.is_normal().then_some(()).ok_or("divisor_in".into())
    })?;
    let w = gaussian::<A>(seed, D, K, 0.5);
    let opts = AttentionOptions { scale, causal };
    judge(
        SelfAttention::new(w.clone(), w.clone(), w, opts),
        want,
        |h| {
            let x = gaussian::<A>(seed, N, D, 1.0);
            let small = sa.to_f64_lossy() < 1e-10;
            let want = if small {
                Want::OkOr(Kind::Overflow, "x")
            } else {
                Want::Ok
            };
            judge(h.forward(x.view()), want, |f| {
                probability_rows(&f.attention_matrix(), causal)?;
                let j = f.jacobian_weights().map_err(|e| format!("J: {e}"))?;
                all_finite(&j.full().unwrap().view(), "J")
            })
        },
    )
}

/// Sizes: dense results refused before allocation, bounds defined for every size.
fn size_entry_points<A: Real>(fuzz: &mut Fuzz) {
    let ty = A::NAME;
    let sizes = [
        0usize,
        1,
        2,
        3,
        1 << 15,
        1 << 20,
        usize::MAX / 2,
        usize::MAX,
    ];
    for d in sizes {
        for k in sizes {
            fuzz.check(
                format!("{ty} rect_identity/block_identity({d}, {k})"),
                move || {
                    let want = if d == 0 {
                        Want::Err(Kind::Invalid, "d")
                    } else if k == 0 {
                        Want::Err(Kind::Invalid, "k")
                    } else if k > d {
                        Want::Err(Kind::Invalid, "offset")
                    } else if d
                        .checked_mul(k)
                        .is_none_or(|e| e > kappa_linalg::MAX_DENSE_ENTRIES)
                    {
                        Want::Err(Kind::TooLarge, if d >= k { "d" } else { "k" })
                    } else {
                        Want::Ok
                    };
                    let check = |e: &Array2<A>| {
                        let ones = e.iter().filter(|&&x| x == A::one()).count();
                        (ones == k && e.dim() == (d, k))
                            .then_some(())
                            .ok_or("not I_k".to_string())
                    };
                    judge(rect_identity::<A>(d, k), want, check)?;
                    judge(block_identity::<A>(d, k, 0), want, check)?;
                    let want_off = if d == 0 || k == 0 {
                        want
                    } else {
                        Want::Err(Kind::Invalid, "offset")
                    };
                    judge(block_identity::<A>(d, k, usize::MAX), want_off, |_| Ok(()))
                },
            );
            for n in [0usize, 1, 5, usize::MAX] {
                fuzz.check(
                    format!("{ty} rank bounds and flops (n {n}, d {d}, k {k})"),
                    move || bounds_case(n, d, k),
                );
            }
        }
    }
}

fn bounds_case(n: usize, d: usize, k: usize) -> Result<(), String> {
    let f = full_rank_bound(n, d, k);
    let kb = k_rank_bound(n, d, k);
    // rank J ≤ N·k (its rows) and rank J_K ≤ N·k, with saturating products.
    let nk = n.saturating_mul(k);
    if f > nk || kb > nk || (n == 0 && (f != 0 || kb != 0)) {
        return Err(format!("bounds {f}, {kb} exceed N·k = {nk}"));
    }
    let fl = identity_shift_flops(n, d, k);
    let expect = if n == 0 || d == 0 || k == 0 {
        0.0
    } else {
        1.0 / (2.0 * d as f64)
    };
    // ratio = nk/(2·nk·d) in f64: two roundings of the products and one of the quotient, so
    // within 4u of 1/(2d) (2ε as written).
    if (fl.ratio - expect).abs() > 2.0 * f64::EPSILON * expect
        || fl.extra_multiplies > fl.projection_flops && fl.projection_flops != u64::MAX
    {
        return Err(format!("{fl:?}"));
    }
    Ok(())
}

/// Whole-struct entry points: Theorem 3.4, the Jacobians' dense forms, kappa_from_singular_values.
fn struct_entry_points<A: Real>(fuzz: &mut Fuzz, seed: u64) {
    let ty = A::NAME;
    for causal in [false, true] {
        let fwd = forward::<A>(seed, causal);
        let f = fwd.clone();
        fuzz.check(
            format!("{ty} Jacobians and Theorem 3.4 (causal {causal})"),
            move || {
                let j = f.jacobian_weights().map_err(|e| e.to_string())?;
                let jk = f.jacobian_weights_kronecker().map_err(|e| e.to_string())?;
                // Two evaluations of the same closed forms: entrywise they differ by rounding of
                // O(N) terms of size max|J|, i.e. ≤ c·N·D·ε·max|J| with c a small constant; 64
                // covers the Kronecker path's extra products (N² + Dk terms, here ≤ 16).
                let m = j
                    .full()
                    .unwrap()
                    .iter()
                    .fold(0.0f64, |a, x| a.max(x.to_f64_lossy().abs()));
                let tol = 64.0 * (N * N + D * K) as f64 * A::EPS * m;
                for (a, b) in j.blocks().iter().zip(jk.blocks()) {
                    let diff = (a - &b)
                        .iter()
                        .fold(0.0f64, |acc, x| acc.max(x.to_f64_lossy().abs()));
                    if diff > tol {
                        return Err(format!("kronecker vs entrywise: {diff:e} > {tol:e}"));
                    }
                }
                let mut reuse = WeightJacobian {
                    q: j.q.clone(),
                    k: j.k.clone(),
                    v: j.v.clone(),
                };
                f.jacobian_weights_into(&mut reuse)
                    .map_err(|e| e.to_string())?;
                (reuse == j).then_some(()).ok_or("into ≠ fresh")?;
                let mut wrong = WeightJacobian {
                    q: j.q.clone(),
                    k: Array2::zeros((1, 1)),
                    v: j.v.clone(),
                };
                judge(
                    f.jacobian_weights_into(&mut wrong),
                    Want::Err(Kind::Shape, "out"),
                    |_| Ok(()),
                )?;
                judge(wrong.full(), Want::Err(Kind::Shape, "self.k"), |_| Ok(()))?;
                judge(f.jacobian_input(), Want::Ok, |jx| {
                    dims_are(jx, (N * K, N * D), "J_X")
                })?;
                let sv = jacobian_singular_values(&f).map_err(|e| e.to_string())?;
                (sv.len() == N * K && sv.iter().all(|s| s.is_finite() && *s >= 0.0))
                    .then_some(())
                    .ok_or("σ(J)")?;
                let t = theorem_3_4(&f).map_err(|e| e.to_string())?;
                let r = t.ratio();
                let consistent = !r.is_nan()
                    && (t.jacobian.full.kappa.is_infinite() == r.is_infinite())
                    && t.holds() == (t.jacobian.full.kappa <= t.rhs)
                    && t.is_vacuous() == t.rhs.is_infinite();
                let _ = (t.block_steps_hold(), t.sum_step_holds());
                let c = f.jacobian_conditioning().map_err(|e| e.to_string())?;
                let bounds = c.full_rank_bound == full_rank_bound(N, D, K)
                    && c.k_rank_bound == k_rank_bound(N, D, K);
                let accessors = f.dims() == (N, D, K)
                    && f.is_causal() == causal
                    && f.score_divisor() == A::one()
                    && f.tokens().dim() == (N, D)
                    && f.queries().dim() == (N, K)
                    && f.keys().dim() == (N, K)
                    && f.values().dim() == (N, K)
                    && f.scores().dim() == (N, N)
                    && f.effective_weights().0.dim() == (D, K);
                (consistent && bounds && accessors)
                    .then_some(())
                    .ok_or(format!("theorem/accessors: {t:?}"))
            },
        );
    }
    // Theorem 3.4 where κ(J) = ∞ and the rhs is ∞ (rank-one tokens, zero weights): ratio +∞.
    fuzz.check(
        format!("{ty} Theorem34::ratio with κ(J) = ∞ = rhs"),
        move || {
            let w = Array2::<A>::zeros((D, K));
            let h =
                SelfAttention::new(w.clone(), w.clone(), w, AttentionOptions::default()).unwrap();
            let f = h.forward(Array2::<A>::ones((N, D)).view()).unwrap();
            let t = theorem_3_4(&f).map_err(|e| e.to_string())?;
            (t.ratio() == f64::INFINITY
                && t.is_vacuous()
                && t.holds() != (t.jacobian.full.kappa > t.rhs))
                .then_some(())
                .ok_or(format!(
                    "ratio {} rhs {} κ {}",
                    t.ratio(),
                    t.rhs,
                    t.jacobian.full.kappa
                ))
        },
    );
    // Weight-set / head accessors and the head-offset helper at extreme arguments.
    fuzz.check(
        format!("{ty} accessors and HeadLayout::offset"),
        move || {
            let h = head::<A>(seed, false);
            let ok = h.correction() == &kappa_attention::Correction::None
                && h.clone().without_correction() == h
                && h.effective_weights()[0] == h.weights().0
                && HeadLayout::Shifted.offset(usize::MAX, 2) == usize::MAX
                && HeadLayout::SameBlock.offset(usize::MAX, usize::MAX) == 0
                && HeadLayout::Shifted.offset(3, 2) == 6;
            ok.then_some(()).ok_or("accessors".into())
        },
    );
}

fn singular_value_inputs(fuzz: &mut Fuzz) {
    let lists: [&[f64]; 8] = [
        &[],
        &[2.0, 1.0],
        &[f64::NAN, 1.0],
        &[1.0, -1.0],
        &[f64::MAX, f64::MIN_POSITIVE],
        &[0.0, 0.0],
        &[1.0, 2.0, 3.0],
        &[5e-324, 5e-324],
    ];
    for s in lists {
        for (rows, cols) in [(2usize, 2usize), (2, 5), (0, 3), (usize::MAX, 2)] {
            let v = s.to_vec();
            fuzz.check(
                format!("kappa_from_singular_values({v:?}, {rows}, {cols})"),
                move || {
                    let k = rows.min(cols);
                    let bad = v.is_empty()
                        || v.iter().any(|x| !x.is_finite() || *x < 0.0)
                        || v.len() != k;
                    match (kappa_from_singular_values(&v, rows, cols), bad) {
                        (Err(AttentionError::Linalg(e)), true) => e
                            .to_string()
                            .contains("`s`")
                            .then_some(())
                            .ok_or(format!("{e}")),
                        (Ok(k), false) => kappa_ok(&k, None, (rows, cols), f64::EPSILON),
                        (r, _) => Err(format!("{r:?}, bad input {bad}")),
                    }
                },
            );
        }
    }
}

fn frobenius_inputs(fuzz: &mut Fuzz) {
    let rows: [Vec<f64>; 7] = [
        vec![],
        vec![1.0],
        vec![0.5, 0.5],
        vec![f64::NAN, 0.5],
        vec![1e300, 1.0],
        vec![f64::MAX; 3],
        vec![5e-324, 1.0],
    ];
    for p in rows {
        fuzz.check(format!("softmax_jacobian_frobenius({p:?})"), move || {
            let f = softmax_jacobian_frobenius(&p);
            let prob = p.iter().all(|x| (0.0..=1.0).contains(x));
            // Documented: [0, 1) for probability vectors, 0 for empty, NaN for a NaN entry;
            // anything (but a return) otherwise.
            let ok = if p.iter().any(|x| x.is_nan()) {
                f.is_nan()
            } else if prob {
                (0.0..1.0).contains(&f)
            } else {
                true
            };
            ok.then_some(()).ok_or(format!("{f}"))
        });
    }
}

fn finish_counts(fuzz: Fuzz, min: usize) {
    let calls = fuzz.finish();
    assert!(calls >= min, "only {calls} calls");
}

#[test]
fn f64_matrix_inputs_in_every_layout() {
    let mut fuzz = Fuzz::new("kappa-attention f64 matrices");
    for seed in SEEDS {
        matrix_entry_points::<f64, LaidOut>(&mut fuzz, seed, hostile64);
    }
    finish_counts(fuzz, 1500);
}

#[test]
fn f32_matrix_inputs() {
    let mut fuzz = Fuzz::new("kappa-attention f32 matrices");
    for seed in SEEDS {
        matrix_entry_points::<f32, F32>(&mut fuzz, seed, hostile32);
    }
    finish_counts(fuzz, 700);
}

#[test]
fn parameters_sizes_and_structs() {
    let mut fuzz = Fuzz::new("kappa-attention parameters");
    for seed in SEEDS {
        parameter_entry_points::<f64>(&mut fuzz, seed);
        parameter_entry_points::<f32>(&mut fuzz, seed);
        struct_entry_points::<f64>(&mut fuzz, seed);
        struct_entry_points::<f32>(&mut fuzz, seed);
    }
    size_entry_points::<f64>(&mut fuzz);
    size_entry_points::<f32>(&mut fuzz);
    singular_value_inputs(&mut fuzz);
    frobenius_inputs(&mut fuzz);
    finish_counts(fuzz, 800);
}
