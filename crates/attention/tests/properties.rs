//! Property tests of kappa-attention: the claims T1–T15 listed in `docs/attention.md` ("Theorems →
//! functions → tests"),
//! dense vs matrix-free agreement, input validation, and the Theorem 3.4 pass-rate statistic.
//!
//! One integration-test binary. Matrices are drawn from a seeded ChaCha stream chosen by
//! proptest (so a failure prints a reproducible seed), with small sizes and bounded case counts.

use kappa_attention::{
    attention_diagnostics, block_identity, full_rank_bound, identity_shift_flops, k_rank_bound,
    rect_identity, softmax_jacobian_apply, softmax_jacobian_dense, softmax_jacobian_frobenius,
    softmax_jacobian_singular_values, softmax_rows, theorem_3_4, AttentionError, AttentionOptions,
    Forward, HeadLayout, IdentityShift, InputError, LambdaPolicy, MultiHeadAttention, ScoreScale,
    SelfAttention, SvdCorrection, Theorem34Instance, TokenRegime,
};
use kappa_linalg::{condition_number, singular_values, svd_thin, SvdDriver};
use ndarray::{s, Array1, Array2, ArrayView2};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn gaussian(rng: &mut ChaCha8Rng, rows: usize, cols: usize, std: f64) -> Array2<f64> {
    Array2::from_shape_simple_fn((rows, cols), || {
        std * <StandardNormal as Distribution<f64>>::sample(&StandardNormal, rng)
    })
}

struct Instance {
    x: Array2<f64>,
    head: SelfAttention<f64>,
}

fn instance(
    n: usize,
    d: usize,
    k: usize,
    seed: u64,
    w_std: f64,
    opts: AttentionOptions,
) -> Instance {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x = gaussian(&mut rng, n, d, 1.0);
    let wq = gaussian(&mut rng, d, k, w_std);
    let wk = gaussian(&mut rng, d, k, w_std);
    let wv = gaussian(&mut rng, d, k, w_std);
    Instance {
        x,
        head: SelfAttention::new(wq, wk, wv, opts).unwrap(),
    }
}

fn options(scaled: bool, causal: bool) -> AttentionOptions {
    AttentionOptions {
        scale: if scaled {
            ScoreScale::InvSqrtK
        } else {
            ScoreScale::One
        },
        causal,
    }
}

fn max_abs_diff(a: &Array2<f64>, b: &Array2<f64>) -> f64 {
    assert_eq!(a.dim(), b.dim());
    a.iter().zip(b).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

fn colvec(m: &Array2<f64>) -> Array1<f64> {
    m.t().iter().copied().collect()
}

// ---------------------------------------------------------------------------------------------
// Rounding-error bounds. Every tolerance in this file is derived from these (or the assertion is
// an exact identity); see the comment at each assertion.
// ---------------------------------------------------------------------------------------------

/// Unit roundoff of f64.
const U: f64 = f64::EPSILON / 2.0;
/// Unit roundoff of f32.
const U32: f64 = f32::EPSILON as f64 / 2.0;

/// γ_m = m·u/(1 − m·u) (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1). An
/// algorithm built from +, −, × in which every output passes through at most m roundings
/// computes each output y with |ŷ − y| ≤ γ_m·ỹ, where ỹ is its *magnitude*: the same polynomial
/// with every coefficient and input replaced by its absolute value. This holds for every
/// summation order, with or without FMA, so it bounds any BLAS kernel on any machine.
fn gamma(m: usize, u: f64) -> f64 {
    let t = m as f64 * u;
    assert!(t < 0.5, "γ_{m} undefined");
    t / (1.0 - t)
}

/// Bound on |σ̂_i − σ_i| for the LAPACK SVD behind `kappa_linalg::singular_values`: the
/// backward-stability bound p(m, n)·ε·σ₁ documented in `crates/linalg/src/svd.rs`, with
/// p(m, n) = 50·max(m, n), the constant kappa-linalg's own SVD tests use
/// (`crates/linalg/tests/properties/svd.rs`). The computed singular vectors are orthonormal to
/// the same order, so `svd_err(m, n, 1.0)` also bounds their departure from orthonormality.
fn svd_err(m: usize, n: usize, sigma1: f64) -> f64 {
    50.0 * m.max(n) as f64 * f64::EPSILON * sigma1
}

/// Relative error bound of κ̂ = σ̂₁/σ̂_r when every σ̂_i is within e·σ₁ of σ_i:
/// κ̂/κ ∈ [(1 − e)/(1 + eκ), (1 + e)/(1 − eκ)], so |κ̂ − κ| ≤ κ·(e + eκ)/(1 − eκ). Evaluated at
/// the computed κ (first order); +∞ when eκ ≥ 1/2, where κ is not resolved by the SVD.
fn kappa_rel_err(kappa: f64, e: f64) -> f64 {
    if kappa.is_finite() && e * kappa < 0.5 {
        (e + e * kappa) / (1.0 - e * kappa)
    } else {
        f64::INFINITY
    }
}

fn absm(a: ArrayView2<'_, f64>) -> Array2<f64> {
    a.mapv(f64::abs)
}

fn frob(a: &Array2<f64>) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// max − min of the entries (0 for none).
fn range<'a>(it: impl IntoIterator<Item = &'a f64>) -> f64 {
    let (lo, hi) = it
        .into_iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| {
            (l.min(x), h.max(x))
        });
    if lo.is_finite() {
        hi - lo
    } else {
        0.0
    }
}

/// Entrywise error bounds of one computed forward pass against the exact forward pass at the
/// exact (effective) weights and tokens, and the magnitudes the Jacobian bounds are built from.
///
/// First order in u (the assertions apply a factor 2 for the O(u²) terms and for magnitudes
/// taken from computed rather than exact values). Model: each projection X W_• passes through
/// at most `proj_depth` roundings (D for X W; D + 1 with a materialized W + C or the cheap
/// X W + λX[:, block]; D + 2 when X and W were first rounded to f32); scores: k + 1 (the dot
/// product and the division by s); softmax: the argument S_ij − max rounds (relative error
/// u·|S_ij − max| after exp), exp is within 1 ulp (2u), the row sum has N terms and the
/// division one rounding; an error δ_i = max_j |ΔS_ij| in the scores moves P[i, j] by a factor
/// in [e^{−2δ_i}, e^{2δ_i}]; A = P V has N-term dot products. `x_rel` is a relative error of
/// the tokens themselves (u₃₂ when they were rounded to f32, else 0).
struct FwdBounds {
    p: Array2<f64>,
    ax: Array2<f64>,
    aq: Array2<f64>,
    ak: Array2<f64>,
    av: Array2<f64>,
    ex: Array2<f64>,
    eq: Array2<f64>,
    ek: Array2<f64>,
    ev: Array2<f64>,
    ep: Array2<f64>,
    ea: Array2<f64>,
    s: f64,
}

fn fwd_bounds(fwd: &Forward<f64>, proj_depth: usize, u: f64, x_rel: f64) -> FwdBounds {
    let (n, _, k) = fwd.dims();
    let ax = absm(fwd.tokens());
    let ex = &ax * x_rel;
    let (wq, wk, wv) = fwd.effective_weights();
    let g = gamma(proj_depth, u);
    let eq = ax.dot(&absm(wq)) * g;
    let ek = ax.dot(&absm(wk)) * g;
    let ev = ax.dot(&absm(wv)) * g;
    let (aq, ak, av) = (absm(fwd.queries()), absm(fwd.keys()), absm(fwd.values()));
    let s = fwd.score_divisor();
    let es =
        (aq.dot(&ak.t()) * gamma(k + 1, u) + eq.dot(&ak.t()) + aq.dot(&ek.t()) + eq.dot(&ek.t()))
            / s;
    let scores = fwd.scores();
    let p = fwd.attention_matrix().to_owned();
    let mut ep = Array2::<f64>::zeros((n, n));
    for i in 0..n {
        let len = if fwd.is_causal() { i + 1 } else { n };
        let m = (0..len)
            .map(|j| scores[[i, j]])
            .fold(f64::NEG_INFINITY, f64::max);
        let eta = |j: usize| u * (scores[[i, j]] - m).abs() + 2.0 * u;
        let eta_max = (0..len).map(eta).fold(0.0, f64::max);
        let delta = (0..len).map(|j| es[[i, j]]).fold(0.0, f64::max);
        let moved = (2.0 * delta).exp_m1();
        for j in 0..len {
            ep[[i, j]] = p[[i, j]] * (eta(j) + eta_max + gamma(n, u) + u + moved);
        }
    }
    let ea = p.dot(&av) * gamma(n, u) + ep.dot(&av) + p.dot(&ev) + ep.dot(&ev);
    FwdBounds {
        p,
        ax,
        aq,
        ak,
        av,
        ex,
        eq,
        ek,
        ev,
        ep,
        ea,
        s,
    }
}

/// Magnitudes of the weight Jacobian [J_Q, J_K, J_V] (module docs of `jacobian.rs`) for
/// nonnegative P, |X|, |Q|, |K|, |V|: each entry's monomials in absolute value,
/// |J_Q[i + cN, d + eD]| ≤ |X_id| (Σ_j P_ij |V_jc| |K_je| + (P|V|)_ic (P|K|)_ie)/s, likewise J_K
/// with |Q_ie| and |X|, and |J_V| = I_k ⊗ P|X|. The dense build, the Kronecker build and every
/// matrix-free product expand into these same monomials (before cancellation), so this is the
/// magnitude of all of them.
fn mj(
    p: &Array2<f64>,
    ax: &Array2<f64>,
    aq: &Array2<f64>,
    ak: &Array2<f64>,
    av: &Array2<f64>,
    s: f64,
) -> [Array2<f64>; 3] {
    let (n, d) = ax.dim();
    let k = aq.ncols();
    let (pk, px, pv) = (p.dot(ak), p.dot(ax), p.dot(av));
    let z = || Array2::<f64>::zeros((n * k, d * k));
    let (mut jq, mut jk, mut jv) = (z(), z(), z());
    for c in 0..k {
        let pvc = p * &av.column(c).insert_axis(ndarray::Axis(0));
        let pvcol = pv.column(c).to_owned().insert_axis(ndarray::Axis(1));
        let g = (pvc.dot(ak) + &pk * &pvcol) / s;
        let h = (pvc.dot(ax) + &px * &pvcol) / s;
        for i in 0..n {
            for e in 0..k {
                for dd in 0..d {
                    jq[[i + c * n, dd + e * d]] = ax[[i, dd]] * g[[i, e]];
                    jk[[i + c * n, dd + e * d]] = aq[[i, e]] * h[[i, dd]];
                }
            }
            for dd in 0..d {
                jv[[i + c * n, dd + c * d]] = px[[i, dd]];
            }
        }
    }
    [jq, jk, jv]
}

/// Roundings along any path of the dense weight-Jacobian build (`gh` and the entry loop):
/// P·V (1), the N-term products P diag(V_c) K and P K (N each) and the cached A (N), a·(PK)
/// (1), the subtraction (1), 1/s (1) and its product (1), the factor X or Q (1): ≤ 3N + 6, so
/// 3N + 8.
fn dense_jacobian_depth(n: usize) -> usize {
    3 * n + 8
}

/// Entrywise bound on |Ĵ − J| for the dense weight Jacobian built from the cached forward pass
/// against the exact Jacobian at the exact point: its own rounding γ_m·|J|
/// (m = `dense_jacobian_depth`) plus the effect of the cached quantities' errors, which for a
/// polynomial with magnitude mj is at most mj(|z| + Δz) − mj(|z|).
fn jac_err(b: &FwdBounds, u: f64) -> [Array2<f64>; 3] {
    let n = b.p.nrows();
    let [bq, bk, bv] = mj(&b.p, &b.ax, &b.aq, &b.ak, &b.av, b.s);
    let [pq, pk, pv] = mj(
        &(&b.p + &b.ep),
        &(&b.ax + &b.ex),
        &(&b.aq + &b.eq),
        &(&b.ak + &b.ek),
        &(&b.av + &b.ev),
        b.s,
    );
    let g = gamma(dense_jacobian_depth(n), u);
    [
        &bq * g + (&pq - &bq),
        &bk * g + (&pk - &bk),
        &bv * g + (&pv - &bv),
    ]
}

/// Magnitude of the input Jacobian J_X (formula in the module docs of `jacobian.rs`):
/// |J_X[i + cN, m + dN]| ≤ P_im|W_V[d, c]| + δ_im (|G_i| |W_Q|ᵀ)[c, d] +
/// P_im (|V_mc| + (P|V|)_ic) (|Q| |W_K|ᵀ)_id / s, with |G_i| as in `mj`. The dense build and
/// the matrix-free JVP/VJP expand into these monomials.
fn mjx(
    p: &Array2<f64>,
    aq: &Array2<f64>,
    ak: &Array2<f64>,
    av: &Array2<f64>,
    w: [&Array2<f64>; 3],
    s: f64,
) -> Array2<f64> {
    let n = p.nrows();
    let k = aq.ncols();
    let [awq, awk, awv] = w;
    let d = awq.nrows();
    let (pk, pv) = (p.dot(ak), p.dot(av));
    let qt = aq.dot(&awk.t()) / s;
    let mut jx = Array2::<f64>::zeros((n * k, n * d));
    for c in 0..k {
        let pvc = p * &av.column(c).insert_axis(ndarray::Axis(0));
        let pvcol = pv.column(c).to_owned().insert_axis(ndarray::Axis(1));
        let g = (pvc.dot(ak) + &pk * &pvcol) / s;
        let gw = g.dot(&awq.t());
        for i in 0..n {
            for dd in 0..d {
                for m in 0..n {
                    let mut e = p[[i, m]] * awv[[dd, c]]
                        + p[[i, m]] * (av[[m, c]] + pv[[i, c]]) * qt[[i, dd]];
                    if m == i {
                        e += gw[[i, dd]];
                    }
                    jx[[i + c * n, m + dd * n]] = e;
                }
            }
        }
    }
    jx
}

/// Roundings along any path of the dense input-Jacobian build: G (3N + 5), G W_Qᵀ (k),
/// Q W_Kᵀ (k), 1/s (2), the entry's products and sums (5): ≤ 3N + 2k + 12.
fn dense_input_jacobian_depth(n: usize, k: usize) -> usize {
    3 * n + 2 * k + 12
}

/// (magnitude, error bound) of the dense input Jacobian, as `jac_err` (weights exact).
fn jacx_err(b: &FwdBounds, fwd: &Forward<f64>, u: f64) -> (Array2<f64>, Array2<f64>) {
    let (n, _, k) = fwd.dims();
    let (wq, wk, wv) = fwd.effective_weights();
    let w = [absm(wq), absm(wk), absm(wv)];
    let base = mjx(&b.p, &b.aq, &b.ak, &b.av, [&w[0], &w[1], &w[2]], b.s);
    let pert = mjx(
        &(&b.p + &b.ep),
        &(&b.aq + &b.eq),
        &(&b.ak + &b.ek),
        &(&b.av + &b.ev),
        [&w[0], &w[1], &w[2]],
        b.s,
    );
    let err = &base * gamma(dense_input_jacobian_depth(n, k), u) + (&pert - &base);
    (base, err)
}

/// Bounds on |∂³A[i, c]/∂t³| and |∂²A[i, c]/∂t²| (N×k each) along one coordinate t of W_Q, W_K,
/// W_V (which = 0, 1, 2) or X (which = 3), entry (r, cc), on [−h, h].
///
/// Row i of A is E_{p(t)}[v] with p(t) = softmax(S_i + θ(t)) over the row's support. For a
/// linear θ = t·b (W_Q: b_j = X_ir K_j,cc/s; W_K: b_j = Q_i,cc X_jr/s) the derivatives are the
/// joint cumulants d³/dt³ = κ(v, b, b, b) = E[v̄b̄³] − 3E[v̄b̄]E[b̄²] and d²/dt² = E[v̄b̄²] (bars:
/// centred under p), so the third is at most 4 R_v R_b³ and the second R_v R_b² with R the range
/// over the support — whatever p is, hence on the whole interval. A is linear in W_V (both 0).
/// For X[m, d], θ(t) = t a + t² c and v(t) = v + t w: for F = E[g],
/// F''' = κ(g, θ', θ', θ') + 3κ(g, θ', θ''), so with R₁ = R(a) + 2hR(c) ≥ R(θ'), R₂ = 2R(c),
/// f''' = F_v''' + 3F_w'' + tF_w''' and f'' = F_v'' + 2F_w' + tF_w'' are bounded term by term.
fn fd_derivative_bounds(
    fwd: &Forward<f64>,
    which: usize,
    r: usize,
    cc: usize,
    h: f64,
) -> (Array2<f64>, Array2<f64>) {
    let (n, _, k) = fwd.dims();
    let (x, q, kk, v) = (fwd.tokens(), fwd.queries(), fwd.keys(), fwd.values());
    let (wq, wk, wv) = fwd.effective_weights();
    let s = fwd.score_divisor();
    let mut m3 = Array2::<f64>::zeros((n, k));
    let mut m2 = Array2::<f64>::zeros((n, k));
    if which == 2 {
        return (m3, m2);
    }
    for i in 0..n {
        let len = if fwd.is_causal() { i + 1 } else { n };
        for c in 0..k {
            let rv = range(v.slice(s![..len, c]));
            if which < 2 {
                let rb = if which == 0 {
                    x[[i, r]].abs() * range(kk.slice(s![..len, cc])) / s
                } else {
                    q[[i, cc]].abs() * range(x.slice(s![..len, r])) / s
                };
                m3[[i, c]] = 4.0 * rv * rb.powi(3);
                m2[[i, c]] = rv * rb * rb;
            } else {
                let (m, dd) = (r, cc);
                let beta = (0..k).map(|e| q[[i, e]] * wk[[dd, e]]).sum::<f64>();
                let gam = (0..k).map(|e| wq[[dd, e]] * wk[[dd, e]]).sum::<f64>();
                let a: Vec<f64> = (0..len)
                    .map(|j| {
                        let alpha = (0..k).map(|e| wq[[dd, e]] * kk[[j, e]]).sum::<f64>();
                        let own = if i == m { alpha } else { 0.0 };
                        let other = if j == m { beta } else { 0.0 };
                        (own + other) / s
                    })
                    .collect();
                let cv: Vec<f64> = (0..len)
                    .map(|j| if i == m && j == m { gam / s } else { 0.0 })
                    .collect();
                let w: Vec<f64> = (0..len)
                    .map(|j| if j == m { wv[[dd, c]] } else { 0.0 })
                    .collect();
                let (ra, rc, rw) = (range(&a), range(&cv), range(&w));
                let r1 = ra + 2.0 * h * rc;
                let r2 = 2.0 * rc;
                m3[[i, c]] = 4.0 * rv * r1.powi(3)
                    + 3.0 * rv * r1 * r2
                    + 3.0 * (rw * r1 * r1 + rw * r2)
                    + h * (4.0 * rw * r1.powi(3) + 3.0 * rw * r1 * r2);
                m2[[i, c]] = rv * (r1 * r1 + r2) + 2.0 * rw * r1 + h * rw * (r1 * r1 + r2);
            }
        }
    }
    (m3, m2)
}

/// The FD step for a column: the power of two nearest to the minimizer (3δ/M₃)^{1/3} of the
/// error model h²M₃/6 + δ/h, within [2⁻³⁰, 2⁻⁴]; 2⁻⁴ when M₃ = 0 (a linear function).
fn fd_step(delta: f64, m3: f64) -> f64 {
    let h = if m3 > 0.0 {
        (3.0 * delta / m3).cbrt()
    } else {
        1.0
    };
    2f64.powi((h.log2().round() as i32).clamp(-30, -4))
}

/// The error model of one central difference (f(w₊) − f(w₋))/(w₊ − w₋) at the stored points
/// w± = fl(w ± h): |FD − f'(w)| ≤ M₃ h₊²/6 + M₂ |h₊ − h₋|/2 + (δ₊ + δ₋)/(w₊ − w₋) + 3u|FD|,
/// with h₊ ≤ h + u(|w| + h), |h₊ − h₋| ≤ 2u(|w| + h) (Taylor with unequal steps), δ the
/// evaluation's rounding bound (taken at w, first order) and 3u for the subtraction, the
/// divisor and the division.
#[allow(clippy::too_many_arguments)]
fn fd_error(w: f64, h: f64, wp: f64, wm: f64, m3: f64, m2: f64, delta: f64, fd: f64) -> f64 {
    let hmax = h + U * (w.abs() + h);
    let asym = 2.0 * U * (w.abs() + h);
    m3 * hmax * hmax / 6.0 + m2 * asym / 2.0 + 2.0 * delta / (wp - wm) + 3.0 * U * fd.abs()
}

/// Central finite differences of vec A with respect to vec W_• (which = 0, 1, 2) or vec X
/// (which = 3), column-major, with an entrywise bound on |FD − ∂A/∂w| (`fd_error`, step
/// `fd_step` per column, derivative bounds `fd_derivative_bounds`, δ = `FwdBounds::ea`).
fn fd_jacobian(inst: &Instance, which: usize) -> (Array2<f64>, Array2<f64>) {
    let (wq, wk, wv) = inst.head.weights();
    let mut ws = [wq.to_owned(), wk.to_owned(), wv.to_owned(), inst.x.clone()];
    let (rows, cols) = ws[which].dim();
    let base = inst.head.forward(inst.x.view()).unwrap();
    let (n, d, k) = base.dims();
    let delta = colvec(&fwd_bounds(&base, d, U, 0.0).ea);
    let delta_max = delta.iter().copied().fold(0.0, f64::max);
    let mut j = Array2::zeros((n * k, rows * cols));
    let mut tol = Array2::zeros((n * k, rows * cols));
    let eval = |ws: &[Array2<f64>; 4]| -> Array1<f64> {
        let h = SelfAttention::new(
            ws[0].clone(),
            ws[1].clone(),
            ws[2].clone(),
            inst.head.options(),
        )
        .unwrap();
        colvec(&h.forward(ws[3].view()).unwrap().output().to_owned())
    };
    for c in 0..cols {
        for r in 0..rows {
            let (m3_0, _) = fd_derivative_bounds(&base, which, r, c, 0.0);
            let h = fd_step(delta_max, m3_0.iter().copied().fold(0.0, f64::max));
            let (m3, m2) = fd_derivative_bounds(&base, which, r, c, h);
            let (m3, m2) = (colvec(&m3), colvec(&m2));
            let orig = ws[which][[r, c]];
            let (wp, wm) = (orig + h, orig - h);
            ws[which][[r, c]] = wp;
            let plus = eval(&ws);
            ws[which][[r, c]] = wm;
            let minus = eval(&ws);
            ws[which][[r, c]] = orig;
            let col = (plus - minus) / (wp - wm);
            for i in 0..n * k {
                tol[[i, r + c * rows]] = fd_error(orig, h, wp, wm, m3[i], m2[i], delta[i], col[i]);
            }
            j.column_mut(r + c * rows).assign(&col);
        }
    }
    (j, tol)
}

/// Entrywise |a − b| ≤ tol, reporting the worst ratio.
fn within(a: &Array2<f64>, b: &Array2<f64>, tol: &Array2<f64>) -> Result<(), String> {
    assert_eq!(a.dim(), b.dim());
    assert_eq!(a.dim(), tol.dim());
    let mut worst = (0.0, (0, 0), 0.0, 0.0);
    for ((idx, &x), (&y, &t)) in a.indexed_iter().zip(b.iter().zip(tol.iter())) {
        let diff = (x - y).abs();
        let ratio = if diff == 0.0 { 0.0 } else { diff / t };
        if ratio.is_nan() || ratio > worst.0 {
            worst = (ratio, idx, (x - y).abs(), t);
        }
    }
    if std::env::var_os("KAPPA_TOL_REPORT").is_some() {
        eprintln!("tolerance use: {:e}", worst.0);
    }
    if worst.0 <= 1.0 {
        Ok(())
    } else {
        Err(format!(
            "entry {:?}: |a − b| = {:e} > tol {:e} (ratio {:e})",
            worst.1, worst.2, worst.3, worst.0
        ))
    }
}

fn col2(v: &Array1<f64>) -> Array2<f64> {
    v.clone().insert_axis(ndarray::Axis(1))
}

fn sv(a: &Array2<f64>) -> Vec<f64> {
    singular_values(a.view(), SvdDriver::default())
        .unwrap()
        .to_vec()
}

fn kappa(a: &Array2<f64>) -> f64 {
    condition_number(a.view()).unwrap()
}

use kappa_testkit::config as cfg;

fn dims() -> impl Strategy<Value = (usize, usize, usize)> {
    (1usize..=7, 1usize..=7).prop_flat_map(|(n, d)| (Just(n), Just(d), 1usize..=d.min(3)))
}

// ---------------------------------------------------------------------------------------------
// T1: derivative formulas, and dense vs matrix-free
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cfg(96))]

    /// T1: the Theorem 3.3 Jacobians (fast closed form) match central finite differences
    /// entrywise within the derived FD error model plus the Jacobian's own rounding bound, for
    /// the weights and for the input, with and without 1/√k and the causal mask; the literal
    /// Kronecker products of the theorem agree with the fast form within both builds' rounding
    /// bounds.
    #[test]
    fn t1_jacobians_match_finite_differences(
        (n, d, k) in dims(), seed in any::<u64>(), scaled in any::<bool>(), causal in any::<bool>()
    ) {
        let inst = instance(n, d, k, seed, 0.5, options(scaled, causal));
        let fwd = inst.head.forward(inst.x.view()).unwrap();
        let b = fwd_bounds(&fwd, d, U, 0.0);
        let j = fwd.jacobian_weights().unwrap();
        let ej = jac_err(&b, U);
        for (which, block) in [&j.q, &j.k, &j.v].into_iter().enumerate() {
            let (fd, fd_tol) = fd_jacobian(&inst, which);
            // |Ĵ − FD| ≤ |Ĵ − J| + |FD − J|: `jac_err` + `fd_error`, ×2 for the first-order
            // terms (see `FwdBounds`).
            let tol = (&ej[which] + &fd_tol) * 2.0;
            let r = within(block, &fd, &tol);
            prop_assert!(r.is_ok(), "block {which}: {}", r.unwrap_err());
        }
        let jx = fwd.jacobian_input().unwrap();
        let (_, ejx) = jacx_err(&b, &fwd, U);
        let (fd, fd_tol) = fd_jacobian(&inst, 3);
        let r = within(&jx, &fd, &((&ejx + &fd_tol) * 2.0));
        prop_assert!(r.is_ok(), "input: {}", r.unwrap_err());

        // Kronecker vs fast: the same polynomial of the cached (P, Q, K, V, X) with magnitude
        // `mj`. Fast build: ≤ dense_jacobian_depth(N) roundings. Kronecker build: Λ's entries (2),
        // (Vᵀ ⊗ I_N)Λ (N² terms, plus the Kronecker entry: N² + 1), the product with K ⊗ X or
        // (X ⊗ Q)·K_{D,k} (N² + 1, and Dk for the commutation, exact but counted), 1/s (2):
        // ≤ 2N² + Dk + 6.
        let kr = fwd.jacobian_weights_kronecker().unwrap();
        let m = mj(&b.p, &b.ax, &b.aq, &b.ak, &b.av, b.s);
        let g = gamma(dense_jacobian_depth(n), U) + gamma(2 * n * n + d * k + 6, U);
        for (which, (a, bb)) in [(&j.q, &kr.q), (&j.k, &kr.k), (&j.v, &kr.v)].into_iter().enumerate() {
            let r = within(a, bb, &(&m[which] * g));
            prop_assert!(r.is_ok(), "kronecker vs fast, block {which}: {}", r.unwrap_err());
        }
    }

    /// Matrix-free JVP/VJP (weights and input, matrix and vec forms) agree with the dense
    /// Jacobians — J t, Jᵀ u, J_X t, J_Xᵀ u — entrywise within the sum of both algorithms'
    /// rounding bounds.
    #[test]
    fn matrix_free_products_agree_with_the_dense_jacobians(
        (n, d, k) in dims(), seed in any::<u64>(), scaled in any::<bool>(), causal in any::<bool>()
    ) {
        let inst = instance(n, d, k, seed, 0.7, options(scaled, causal));
        let fwd = inst.head.forward(inst.x.view()).unwrap();
        let b = fwd_bounds(&fwd, d, U, 0.0);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
        let full = fwd.jacobian_weights().unwrap().full().unwrap();
        let t = gaussian(&mut rng, 3 * d * k, 1, 1.0).column(0).to_owned();
        let u = gaussian(&mut rng, n * k, 1, 1.0).column(0).to_owned();
        // Both sides are the same polynomial of the cached forward pass and t (or u), with
        // magnitude |J|·|t| (`mj`). Roundings along any path: dense — the entry
        // (dense_jacobian_depth) and the 3Dk-term product; matrix-free — X dW (D), ·Kᵀ (k), the
        // sum and 1/s (3), the softmax product P ⊙ (dS − rowsum(P ⊙ dS)) (N + 3), ·V (N), and
        // P (X dW_V) (D + N + 1): both ≤ m below. Tolerance 2γ_m·magnitude.
        let mag = {
            let [q, kk, v] = mj(&b.p, &b.ax, &b.aq, &b.ak, &b.av, b.s);
            ndarray::concatenate(ndarray::Axis(1), &[q.view(), kk.view(), v.view()]).unwrap()
        };
        let m = dense_jacobian_depth(n) + 3 * d * k + d + k + 2 * n + 8;
        let g2 = 2.0 * gamma(m, U);
        let dense_jvp = col2(&full.dot(&t));
        let mf_jvp = col2(&fwd.jvp_weights_vec(t.view()).unwrap());
        let tol = col2(&mag.dot(&t.mapv(f64::abs))) * g2;
        let r = within(&dense_jvp, &mf_jvp, &tol);
        prop_assert!(r.is_ok(), "J t: {}", r.unwrap_err());
        let dense_vjp = col2(&full.t().dot(&u));
        let mf_vjp = col2(&fwd.vjp_weights_vec(u.view()).unwrap());
        let tol = col2(&mag.t().dot(&u.mapv(f64::abs))) * g2;
        let r = within(&dense_vjp, &mf_vjp, &tol);
        prop_assert!(r.is_ok(), "Jᵀ u: {}", r.unwrap_err());

        // Input: magnitude `mjx`; dense — the entry (dense_input_jacobian_depth) and the
        // ND-term product; matrix-free — dX W (D), then as above, and the three-term
        // (gS K/s) W_Qᵀ + … (k + 2) on the VJP side: ≤ m below.
        let jx = fwd.jacobian_input().unwrap();
        let (magx, _) = jacx_err(&b, &fwd, U);
        let m = dense_input_jacobian_depth(n, k) + n * d + d + 2 * k + 2 * n + 10;
        let g2 = 2.0 * gamma(m, U);
        let tx = gaussian(&mut rng, n * d, 1, 1.0).column(0).to_owned();
        let a = col2(&jx.dot(&tx));
        let bb = col2(&fwd.jvp_input_vec(tx.view()).unwrap());
        let r = within(&a, &bb, &(col2(&magx.dot(&tx.mapv(f64::abs))) * g2));
        prop_assert!(r.is_ok(), "J_X t: {}", r.unwrap_err());
        let a = col2(&jx.t().dot(&u));
        let bb = col2(&fwd.vjp_input_vec(u.view()).unwrap());
        let r = within(&a, &bb, &(col2(&magx.t().dot(&u.mapv(f64::abs))) * g2));
        prop_assert!(r.is_ok(), "J_Xᵀ u: {}", r.unwrap_err());

        // Matrix forms equal the vec forms: the vec form calls the matrix form and only
        // reshapes (exact).
        let g = kappa_linalg::unvec(u.view(), n, k).unwrap();
        let grads = fwd.vjp_weights(g.view()).unwrap();
        prop_assert_eq!(grads.to_vec(), fwd.vjp_weights_vec(u.view()).unwrap());
    }
}

// ---------------------------------------------------------------------------------------------
// T2: structure of Λ
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cfg(96))]

    /// T2: Λ is symmetric PSD with eigenvalues in [0, 1/2], exactly N zero eigenvalues for a
    /// generic P, annihilates the row-shift directions vec(e_i 1ᵀ) = 1_N ⊗ e_i, and the blockwise
    /// spectrum and matrix-free product agree with the dense Λ — each within derived rounding
    /// bounds.
    #[test]
    fn t2_softmax_jacobian_structure(n in 1usize..=8, seed in any::<u64>()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let s = gaussian(&mut rng, n, n, 1.0);
        let p = softmax_rows(s.view(), false).unwrap();
        let lambda = softmax_jacobian_dense(p.view()).unwrap();
        // Exact: entry (a, c) and (c, a) are both fl(δ_ac p_a − fl(p_a p_c)), and IEEE
        // multiplication commutes.
        prop_assert!(max_abs_diff(&lambda, &lambda.t().to_owned()) == 0.0);
        // Λ̂ vs the exact Λ(p̃) of the probability vectors p̃_i = p̂_i/Σp̂_i, for which the
        // claims hold exactly. (1) Entries: |Λ̂ − Λ(p̂)| ≤ γ₂(p_a δ_ac + p_a p_c) =: E.
        // (2) p̂ = (1 + ε_i) p̃ gives J(p̂) − J(p̃) = ε diag(p̃) − (2ε + ε²) p̃p̃ᵀ, of 2-norm
        // ≤ 3|ε| + ε²; |ε_i| ≤ |fl(Σp̂_i) − 1| + γ_N (the sum's own rounding). Λ is block
        // diagonal, so ‖Λ(p̂) − Λ(p̃)‖₂ = max_i. Hence ‖Λ̂ − Λ(p̃)‖₂ ≤ ‖E‖_F + max_i(3|ε_i| + ε_i²).
        let labs = Array2::from_shape_fn((n * n, n * n), |(r, c)| {
            let (a, i, cc, i2) = (r / n, r % n, c / n, c % n);
            if i != i2 { 0.0 } else { p[[i, a]] * (if a == cc { 1.0 } else { 0.0 } + p[[i, cc]]) }
        });
        let eps: Vec<f64> = p.rows().into_iter().map(|r| (r.sum() - 1.0).abs() + gamma(n, U)).collect();
        let shift_norm = eps.iter().map(|e| 3.0 * e + e * e).fold(0.0, f64::max);
        let dist = frob(&labs) * gamma(2, U) + shift_norm;
        let eig = sv(&lambda); // = eigenvalues, if PSD; check PSD via xᵀΛx ≥ 0 below
        // Weyl: |σ̂_i − λ_i(Λ(p̃))| ≤ dist + the SVD's own error.
        let slack = dist + svd_err(n * n, n * n, eig[0]);
        prop_assert!(eig[0] <= 0.5 + slack, "largest eigenvalue {} > 1/2 + {slack:e}", eig[0]);
        // Exactly N zeros: Λ(p̃) has N zero eigenvalues, and by interlacing for the rank-one
        // update diag(p̃_i) − p̃_i p̃_iᵀ its other eigenvalues are ≥ min_j p̃_ij. So with
        // τ = slack, the σ̂ ≤ τ are exactly the N zeros once min p̃ > 2τ (checked first: P is the
        // softmax of N(0, 1) scores, min p ≳ e^{−12}/8 ≫ τ ≈ 1e-13).
        let tau = slack;
        let min_p = p.iter().copied().fold(f64::INFINITY, f64::min) / (1.0 + eps.iter().copied().fold(0.0, f64::max));
        prop_assert!(n == 1 || min_p > 2.0 * tau, "min p = {min_p:e} not resolved above τ = {tau:e}");
        let zeros = eig.iter().filter(|&&e| e <= tau).count();
        prop_assert_eq!(zeros, n, "zero eigenvalues");
        for _ in 0..4 {
            let v = gaussian(&mut rng, n * n, 1, 1.0).column(0).to_owned();
            // xᵀΛ(p̃)x ≥ 0 exactly; the computed form is within dist·‖x‖² + γ_{2N²}|x|ᵀ|Λ̂||x|
            // (a matrix–vector product and a dot product of N² terms each).
            let va = v.mapv(f64::abs);
            let tol = dist * v.dot(&v) + gamma(2 * n * n, U) * va.dot(&labs.dot(&va));
            let qf = v.dot(&lambda.dot(&v));
            prop_assert!(qf >= -tol, "xᵀΛx = {qf:e} < −{tol:e}");
        }
        for i in 0..n {
            let mut shift = Array2::<f64>::zeros((n, n));
            shift.row_mut(i).fill(1.0);
            let r = lambda.dot(&colvec(&shift));
            // Entry a·N + i is Σ_c Λ̂[(a,i),(c,i)] (other entries are exact zeros). Exactly
            // Σ_c J_i(p̂)[a, c] = −p̂_a ε_i; plus the entries' rounding Σ_c E and the sum's
            // γ_{N²}·Σ_c|Λ̂| (N² terms, most of them 0).
            for a in 0..n {
                let row = labs.row(a * n + i).sum();
                let tol = (gamma(n * n, U) + gamma(2, U)) * row + p[[i, a]] * eps[i];
                let got = r[a * n + i];
                prop_assert!(got.abs() <= tol, "Λ(1 ⊗ e_{i})[{a}] = {got:e} > {tol:e}");
            }
        }
        let blockwise = softmax_jacobian_singular_values(p.view()).unwrap().to_vec();
        // The blocks have bitwise the same entries as Λ̂ (same expression), so the two sorted
        // spectra are within the two SVDs' errors: N²×N² and N×N (σ₁ of a block ≤ σ₁(Λ̂)).
        let tol = svd_err(n * n, n * n, eig[0]) + svd_err(n, n, eig[0]);
        for (a, b) in blockwise.iter().zip(&eig) {
            prop_assert!((a - b).abs() <= tol, "blockwise {a} vs dense {b}");
        }
        let ds = gaussian(&mut rng, n, n, 1.0);
        let mf = softmax_jacobian_apply(p.view(), ds.view()).unwrap();
        let dense = lambda.dot(&colvec(&ds));
        // Same monomials p_a ds_a − p_a Σ_c p_c ds_c, magnitude |Λ̂|·|vec ds|. Roundings:
        // dense — entry (2) and N² terms; matrix-free — P ⊙ dS (1), the row sum (N), p·sum (1),
        // the subtraction (1).
        let tol = labs.dot(&colvec(&ds).mapv(f64::abs)) * (gamma(n * n + 2, U) + gamma(n + 3, U));
        let r = within(&col2(&colvec(&mf)), &col2(&dense), &col2(&tol));
        prop_assert!(r.is_ok(), "matrix-free Λ·ds: {}", r.unwrap_err());
    }
}

// ---------------------------------------------------------------------------------------------
// T3, T4, T5: convention invariance, gauge null space, the V block
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cfg(96))]

    /// T3: the row-major Jacobian (rows i·k + c, columns d·k + e) has the same singular values as
    /// the column-major one, within the two SVDs' error bounds.
    #[test]
    fn t3_convention_invariance((n, d, k) in dims(), seed in any::<u64>()) {
        let inst = instance(n, d, k, seed, 0.5, AttentionOptions::default());
        let fwd = inst.head.forward(inst.x.view()).unwrap();
        let j = fwd.jacobian_weights().unwrap().full().unwrap();
        let dk = d * k;
        let row_major = Array2::from_shape_fn(j.dim(), |(r, col)| {
            let (i, c) = (r / k, r % k);
            let (block, rest) = (col / dk, col % dk);
            let (dd, e) = (rest / k, rest % k);
            j[[i + c * n, block * dk + dd + e * d]]
        });
        let (a, b) = (sv(&j), sv(&row_major));
        // The two matrices are exact permutations of each other (same singular values); each
        // SVD is within svd_err(Nk, 3Dk, σ₁) of them.
        let tol = 2.0 * svd_err(n * k, 3 * dk, a[0]);
        for (x, y) in a.iter().zip(&b) {
            prop_assert!((x - y).abs() <= tol, "{x} vs {y}, tol {tol:e}");
        }
    }

    /// T4: J annihilates the gauge directions (W_Q E, −W_K Eᵀ, 0) up to the derived rounding
    /// bound, so rank J ≤ min(Nk, 3Dk − k²); rank J_K ≤ k(N − 1) for N ≤ D (row shifts); and for
    /// N > 3D − k the smallest singular value of J is at rounding level (κ(J) = ∞).
    #[test]
    fn t4_gauge_null_space((n, d, k) in dims(), seed in any::<u64>(), causal in any::<bool>()) {
        let inst = instance(n, d, k, seed, 0.5, options(false, causal));
        let fwd = inst.head.forward(inst.x.view()).unwrap();
        let b = fwd_bounds(&fwd, d, U, 0.0);
        let j = fwd.jacobian_weights().unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_add(1));
        let e = gaussian(&mut rng, k, k, 1.0);
        let (wq, wk, _) = inst.head.weights();
        let (tq, tk) = (wq.dot(&e), wk.dot(&e.t()));
        let r = j.q.dot(&colvec(&tq)) - j.k.dot(&colvec(&tk));
        // The exact Jacobian J* at the exact point satisfies J*_Q t*_Q = J*_K t*_K. Computed:
        // |fl(Ĵ t̂) − J* t*| ≤ (γ_{Dk} + γ_k)·|J|·|W||E| (the product and t̂ = fl(W E)) +
        // |Ĵ − J*|·|W||E| (`jac_err`), per block; ×2 for the first-order terms, + u|r| for the
        // subtraction.
        let m = mj(&b.p, &b.ax, &b.aq, &b.ak, &b.av, b.s);
        let ej = jac_err(&b, U);
        let ta = [colvec(&absm(wq).dot(&absm(e.view()))), colvec(&absm(wk).dot(&absm(e.t())))];
        let g = gamma(d * k, U) + gamma(k, U);
        let tol = ((m[0].dot(&ta[0]) + m[1].dot(&ta[1])) * g + ej[0].dot(&ta[0]) + ej[1].dot(&ta[1])) * 2.0
            + r.mapv(|x| U * x.abs());
        let r = within(&col2(&r), &col2(&Array1::zeros(n * k)), &col2(&tol));
        prop_assert!(r.is_ok(), "gauge residual: {}", r.unwrap_err());
        let c = fwd.jacobian_conditioning().unwrap();
        prop_assert_eq!(c.full_rank_bound, full_rank_bound(n, d, k));
        // Ranks at the derived threshold τ = 2‖Ĵ − J*‖_F bound + svd_err: by Weyl the singular
        // values of Ĵ beyond rank J* are ≤ ‖Ĵ − J*‖₂ + the SVD's error ≤ τ, so
        // #{σ̂ > τ} ≤ rank J*.
        let full = j.full().unwrap();
        let efull = ndarray::concatenate(ndarray::Axis(1), &[ej[0].view(), ej[1].view(), ej[2].view()]).unwrap();
        let rank = |m: &Array2<f64>, err: &Array2<f64>| {
            let s = sv(m);
            let tau = 2.0 * frob(err) + svd_err(m.nrows(), m.ncols(), s[0]);
            (s.iter().filter(|&&x| x > tau).count(), s, tau)
        };
        let (rank_j, s, tau) = rank(&full, &efull);
        prop_assert!(rank_j <= full_rank_bound(n, d, k));
        let (rank_k, _, _) = rank(&j.k, &ej[1]);
        prop_assert!(rank_k <= k_rank_bound(n, d, k), "rank J_K = {} > {}", rank_k, k_rank_bound(n, d, k));
        if n > 3 * d - k {
            // Nk > rank J*: J* has a zero singular value, so σ̂_min ≤ τ. (The crate's κ = ∞ is
            // the numpy rule σ̂_min ≤ max(m, n)·ε·σ̂₁, a threshold below the proven τ; that it
            // reports ∞ here is observed, not derivable.)
            let smin = s[s.len() - 1];
            prop_assert!(smin <= tau, "σ_min = {smin:e} > τ = {tau:e}");
            prop_assert!(c.full.kappa >= s[0] / tau, "κ(J) = {}", c.full.kappa);
        }
    }

    /// T5: κ(∂A/∂W_V) = κ(P X) (within both SVDs' resolution of κ) ≤ κ(P) κ(X) (a hard
    /// inequality, checked up to the resolution of the three computed κ).
    #[test]
    fn t5_v_block((n, d, k) in dims(), seed in any::<u64>(), scaled in any::<bool>()) {
        let inst = instance(n, d, k, seed, 0.5, options(scaled, false));
        let fwd = inst.head.forward(inst.x.view()).unwrap();
        let jv = fwd.jacobian_weights().unwrap().v;
        let p = fwd.attention_matrix().to_owned();
        let px = p.dot(&inst.x);
        let (kv, kpx) = (kappa(&jv), kappa(&px));
        // J_V = I_k ⊗ fl(P̂X), the test's PX = fl(P̂X): both within E = γ_N P̂|X| of P̂X, whose
        // singular values J_V repeats k times. So every σ̂ is within ‖E‖_F + svd_err of σ(P̂X),
        // and each κ̂ within `kappa_rel_err` of κ(P̂X).
        let s1 = sv(&px)[0];
        let e_px = frob(&(p.dot(&absm(inst.x.view())) * gamma(n, U)));
        let rho_v = kappa_rel_err(kv, (e_px + svd_err(n * k, d * k, s1)) / s1);
        let rho_px = kappa_rel_err(kpx, (e_px + svd_err(n, d, s1)) / s1);
        if rho_v.is_finite() && rho_px.is_finite() {
            prop_assert!((kv - kpx).abs() <= kpx * (rho_v + rho_px), "κ(J_V) = {kv}, κ(PX) = {kpx}");
        }
        // κ(P̂X) ≤ κ(P̂)κ(X) exactly (σ₁(PX) ≤ σ₁(P)σ₁(X), σ_min(PX) ≥ σ_N(P)σ_min(X)); with
        // κ̂_PX ≤ κ(1 + ρ_PX) and κ ≤ κ̂/(1 − ρ) for P and X (exact inputs: svd_err only).
        let (kp, kx) = (kappa(&p), kappa(&inst.x));
        let rho_p = kappa_rel_err(kp, svd_err(n, n, 1.0));
        let rho_x = kappa_rel_err(kx, svd_err(n, d, 1.0));
        if rho_px.is_finite() && rho_p < 1.0 && rho_x < 1.0 {
            let bound = kp * kx * (1.0 + rho_px) / ((1.0 - rho_p) * (1.0 - rho_x));
            prop_assert!(kpx <= bound, "κ(PX) = {kpx} > κ(P)κ(X)·(1 + ρ) = {bound}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// T7–T12: the corrections
// ---------------------------------------------------------------------------------------------

fn weight_dims() -> impl Strategy<Value = (usize, usize)> {
    (1usize..=12).prop_flat_map(|d| (Just(d), 1usize..=d))
}

proptest! {
    #![proptest_config(cfg(128))]

    /// T7: C = σ₁ U Vᵀ gives κ(W + C) = 2σ₁/(σ₁ + σ_k) < 2, W + C has singular values σ_i + σ₁
    /// and W's singular vectors (up to sign) — each within the SVDs' error bounds.
    #[test]
    fn t7_svd_correction((d, k) in weight_dims(), seed in any::<u64>(), log_std in -3.0f64..3.0) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let w = gaussian(&mut rng, d, k, 10f64.powf(log_std));
        let c = SvdCorrection::new(w.view()).unwrap();
        let wc = c.apply(w.view()).unwrap();
        let closed = c.corrected_kappa();
        let measured = kappa(&wc);
        let s = sv(&w);
        // Backward stability: W + E = U_o Σ̂ V_oᵀ with U_o, V_o orthonormal, ‖E‖ ≤ e₁ :=
        // svd_err(D, k, σ₁), and the computed Û, V̂ within ν = svd_err(D, k, 1) of U_o, V_o.
        // So W + fl(σ̂₁ÛV̂ᵀ) = U_o(Σ̂ + σ̂₁)V_oᵀ + Δ, ‖Δ‖ ≤ δ_C := e₁ + 2νσ₁ (ÛV̂ᵀ vs U_oV_oᵀ)
        // + γ_k√k·σ₁ (the product Û·V̂ᵀ and the scaling) + u‖W + C‖_F (the addition).
        let e1 = svd_err(d, k, s[0]);
        let nu = svd_err(d, k, 1.0);
        let delta_c = e1 + 2.0 * nu * s[0] + gamma(k + 1, U) * (k as f64).sqrt() * s[0] + U * frob(&wc);
        // The measured κ's SVD adds svd_err(D, k, 2σ₁) to every σ; the closed form uses σ̂ from
        // its own SVD (within 2e₁ of the test's). Numerator ≈ 2σ₁, denominator ≥ σ₁: relative
        // error ≤ 1.5·δ/σ₁ to first order (×2 headroom), + 3u for the closed form's arithmetic.
        let delta = delta_c + svd_err(d, k, 2.0 * s[0]) + 2.0 * e1;
        let rel = 2.0 * 1.5 * delta / s[0] + 3.0 * U;
        prop_assert!((measured - closed).abs() <= rel * closed, "{measured} vs {closed}, rel {rel:e}");
        // κ < 2 is strict in exact arithmetic; decidable when 2 − closed exceeds the resolution.
        if closed * (1.0 + rel) < 2.0 {
            prop_assert!(measured < 2.0);
        }
        let sc = sv(&wc);
        // σ_i(W + C) = σ̂_i + σ̂₁ ± δ_C; the test's σ̂ of W (e₁, twice: σ_i and σ₁) and of W + C
        // (svd_err(D, k, 2σ₁)); u for the test's own addition.
        let tol = delta_c + 2.0 * e1 + svd_err(d, k, 2.0 * s[0]) + 2.0 * U * s[0];
        for (a, b) in s.iter().zip(&sc) {
            prop_assert!((a + s[0] - b).abs() <= tol, "σ + σ₁ = {} vs {b}, tol {tol:e}", a + s[0]);
        }
        // Singular vectors: W and W + C share U_o, V_o up to δ_C, and W + C has W's gaps.
        // Wedin: the computed i-th vector of each is within angle θ ≤ √2·η/gap_i of U_o's, with
        // η = e₁ (W) and δ_C + svd_err(D, k, 2σ₁) (W + C), gap_i = distance of σ_i to the other
        // σ_j (and to 0 for U when D > k), plus ν each for orthonormality. So
        // 1 − |⟨u, u'⟩| ≤ θ²/2 + 2ν + γ_D (the dot product), checked wherever θ < 1.
        let f = svd_thin(w.view(), SvdDriver::default()).unwrap();
        let g = svd_thin(wc.view(), SvdDriver::default()).unwrap();
        for i in 0..s.len() {
            let gap_v = s.iter().enumerate().filter(|&(j, _)| j != i)
                .map(|(_, x)| (x - s[i]).abs()).fold(f64::INFINITY, f64::min);
            let gap_u = if d > k { gap_v.min(s[i]) } else { gap_v };
            for (gap, which) in [(gap_u, "u"), (gap_v, "v")] {
                let theta = 2f64.sqrt() * (e1 + delta_c + svd_err(d, k, 2.0 * s[0])) / gap + 2.0 * nu;
                if theta < 1.0 {
                    let dot = if which == "u" {
                        f.u.column(i).dot(&g.u.column(i)).abs()
                    } else {
                        f.vt.row(i).dot(&g.vt.row(i)).abs()
                    };
                    let tol = theta * theta / 2.0 + 2.0 * nu + gamma(d, U);
                    prop_assert!((dot - 1.0).abs() <= tol, "{which}_{i}: |⟨·, ·'⟩| = {dot}, tol {tol:e}");
                }
            }
        }
    }

    /// T8: for λ > σ_max, κ(W + λE_k) ≤ (λ + σ_max)/(λ − σ_max) (Weyl), up to the resolution of
    /// the computed σ_max and κ.
    #[test]
    fn t8_weyl_bound((d, k) in weight_dims(), seed in any::<u64>(), log_std in -2.0f64..1.0, factor in 1.001f64..20.0) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let w = gaussian(&mut rng, d, k, 10f64.powf(log_std));
        let a = sv(&w)[0];
        let shift = IdentityShift::new(factor * a).unwrap();
        let bound = shift.weyl_bound(a).unwrap();
        let shifted = shift.apply(w.view()).unwrap();
        let got = kappa(&shifted);
        let tol = weyl_tolerance(&w, &shifted, shift.lambda(), a, bound, got);
        prop_assert!(got <= bound * (1.0 + tol), "κ = {got} > {bound}·(1 + {tol:e})");
        // Exact: weyl_bound returns None iff λ ≤ σ_max (here λ = σ_max/2).
        prop_assert!(IdentityShift::new(0.5 * a).unwrap().weyl_bound(a).is_none());
    }

    /// T9: λ > σ_max (κ+1)/(κ−1) ⇒ κ(W + λE_k) < κ(W); the SufficientDecrease policy picks such
    /// a λ and TargetKappa meets its target (up to the resolution of σ_max and κ).
    #[test]
    fn t9_sufficient_condition_decreases_kappa(
        (d, k) in weight_dims(), seed in any::<u64>(), log_std in -2.0f64..1.0,
        margin in 1e-6f64..2.0, target in 1.01f64..5.0
    ) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let w = gaussian(&mut rng, d, k, 10f64.powf(log_std));
        let kw = kappa(&w);
        // κ(W) > 1 must be resolved: κ̂ − 1 beyond κ̂'s own error (k = 1 gives κ = 1 exactly).
        prop_assume!(kw - 1.0 > 2.0 * kw * kappa_rel_err(kw, svd_err(d, k, 1.0)));
        let lambda = LambdaPolicy::SufficientDecrease { margin }.choose(w.view()).unwrap();
        let shift = IdentityShift::new(lambda).unwrap();
        // Exact logic on the same internal σ̂, κ̂: λ = (1 + margin)·threshold, margin ≥ 1e-6 ≫ u.
        prop_assert!(shift.guarantees_decrease(w.view()).unwrap());
        let shifted = shift.apply(w.view()).unwrap();
        let got = kappa(&shifted);
        let a = sv(&w)[0];
        let weyl = shift.weyl_bound(a).unwrap();
        let tol = weyl_tolerance(&w, &shifted, lambda, a, weyl, got);
        // The decrease goes through Weyl: κ̂(W + λE) ≤ weyl·(1 + tol) (derived), and the margin
        // puts weyl below κ(W); decidable when weyl·(1 + tol) < κ̂(W)·(1 − ρ) — the instances
        // where it is not (κ(W) − 1 ≲ 1e-6, where the gap is margin·(κ − 1)) are skipped.
        prop_assert!(got <= weyl * (1.0 + tol), "κ(W + λE) = {got} > Weyl {weyl}");
        let rho_w = kappa_rel_err(kw, svd_err(d, k, 1.0));
        if weyl * (1.0 + tol) < kw * (1.0 - rho_w) {
            prop_assert!(got < kw, "κ(W + λE) = {got} ≥ κ(W) = {kw} at λ = {lambda}");
        }
        let lt = LambdaPolicy::TargetKappa(target).choose(w.view()).unwrap();
        let st = IdentityShift::new(lt).unwrap();
        let shifted = st.apply(w.view()).unwrap();
        let got = kappa(&shifted);
        let weyl = st.weyl_bound(a).unwrap();
        let tol = weyl_tolerance(&w, &shifted, lt, a, weyl, got);
        // λ_t = σ̂ (t + 1)/(t − 1) from the policy's σ̂ (within 2svd_err of the test's a), so the
        // Weyl value at a is t up to the sensitivity 2λa/((λ − a)(λ + a)) of the bound to a,
        // times 2svd_err/a, plus 4u for the arithmetic.
        let sens = 2.0 * lt * a / ((lt - a) * (lt + a));
        let t_tol = sens * 2.0 * svd_err(d, k, 1.0) + 4.0 * U;
        prop_assert!(weyl <= target * (1.0 + t_tol), "Weyl at λ_t = {weyl} vs target {target}");
        prop_assert!(got <= weyl * (1.0 + tol), "κ = {got} > target {target}");
    }

    /// The relative reading of λ: `RelativeToSigmaMax(c)` chooses c·σ_max(W), and scaling W by
    /// a power of two 2^j scales the chosen λ by exactly 2^j (singular values are computed on
    /// an exactly rescaled copy, so the rounding is the same at every scale), hence κ(W + λE)
    /// is the same at every weight scale — what a fixed λ is not (T11 above, theory (b)).
    #[test]
    fn relative_lambda_follows_the_weight_scale(
        (d, k) in weight_dims(), seed in any::<u64>(), c in 0.0f64..20.0, j in -20i32..20
    ) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let w = gaussian(&mut rng, d, k, 0.02);
        let policy = LambdaPolicy::RelativeToSigmaMax(c);
        let lambda = policy.choose(w.view()).unwrap();
        let a = sv(&w)[0];
        // σ̂_max within svd_err of the test's own σ_max; the product adds one rounding.
        let tol = c * svd_err(d, k, a) + 2.0 * U * lambda;
        prop_assert!((lambda - c * a).abs() <= tol, "λ = {lambda}, c·σ_max = {}", c * a);
        let scale = 2f64.powi(j);
        let scaled = w.mapv(|x| x * scale);
        prop_assert_eq!(policy.choose(scaled.view()).unwrap(), lambda * scale);
    }

    /// T11: κ(W + λE_k) → 1: at λ = 10⁴·σ_max it is at most Weyl's (10⁴ + 1)/(10⁴ − 1) ≈ 1.0002
    /// (up to the resolution of σ_max and κ).
    #[test]
    fn t11_large_lambda_limit((d, k) in weight_dims(), seed in any::<u64>(), log_std in -3.0f64..3.0) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let w = gaussian(&mut rng, d, k, 10f64.powf(log_std));
        let a = sv(&w)[0];
        let shift = IdentityShift::new(1e4 * a).unwrap();
        let shifted = shift.apply(w.view()).unwrap();
        let got = kappa(&shifted);
        let weyl = shift.weyl_bound(a).unwrap();
        let tol = weyl_tolerance(&w, &shifted, shift.lambda(), a, weyl, got);
        prop_assert!(got <= weyl * (1.0 + tol), "κ = {got} > {weyl}·(1 + {tol:e})");
        prop_assert!(got < 1.001, "κ = {got}");
    }

    /// T12: for the block E_h at rows h·k.., Π(W + λE_h) = ΠW + λE_k exactly for the row
    /// permutation Π moving rows h·k.. to 0.., and κ(W + λE_h) = κ(ΠW + λE_k) within both SVDs'
    /// resolution of κ.
    #[test]
    fn t12_layout_equivalence(heads in 1usize..=4, k in 1usize..=3, extra in 0usize..=3,
                              h_pick in 0usize..4, seed in any::<u64>(), lambda in 0.0f64..10.0) {
        let d = heads * k + extra;
        let h = h_pick % heads;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let w = gaussian(&mut rng, d, k, 1.0);
        let shifted = IdentityShift::at_offset(lambda, h * k).unwrap().apply(w.view()).unwrap();
        // Π: rows h·k..h·k+k first, then the others in order.
        let order: Vec<usize> = (h * k..h * k + k).chain((0..d).filter(|r| *r < h * k || *r >= h * k + k)).collect();
        let permute = |m: &Array2<f64>| Array2::from_shape_fn(m.dim(), |(r, c)| m[[order[r], c]]);
        let lhs = permute(&shifted);
        let rhs = IdentityShift::new(lambda).unwrap().apply(permute(&w).view()).unwrap();
        // Exact: the same entries w + λ (one rounding each), permuted.
        prop_assert_eq!(&lhs, &rhs);
        // Same singular values exactly (row permutation); each κ̂ within kappa_rel_err.
        let (a, b) = (kappa(&shifted), kappa(&rhs));
        let e = svd_err(d, k, 1.0);
        let (ra, rb) = (kappa_rel_err(a, e), kappa_rel_err(b, e));
        if ra.is_finite() && rb.is_finite() {
            prop_assert!((a - b).abs() <= a * (ra + rb), "κ = {a} vs {b}");
        }
    }
}

/// The relative tolerance of "κ̂(fl(W + λE)) ≤ weyl": Weyl's bound holds exactly for the exact
/// σ_max; fl(W + λE) = W + λE + Δ with ‖Δ‖ ≤ u‖W + λE‖_F, and the test's σ̂_max (`a`) is within
/// svd_err of σ_max, so the exact κ of the computed matrix is ≤ (λ + a + e)/(λ − a − e),
/// e = svd_err + ‖Δ‖. Relative to the computed `weyl` (4u of arithmetic), times the measured κ̂'s
/// resolution `kappa_rel_err`.
fn weyl_tolerance(
    w: &Array2<f64>,
    shifted: &Array2<f64>,
    lambda: f64,
    a: f64,
    weyl: f64,
    got: f64,
) -> f64 {
    let (d, k) = w.dim();
    let e = svd_err(d, k, a) + U * frob(shifted);
    let b_e = (lambda + a + e) / (lambda - a - e);
    let s1 = sv(shifted)[0];
    let rho = kappa_rel_err(got, svd_err(d, k, s1) / s1);
    (b_e / weyl) * (1.0 + 4.0 * U) * (1.0 + rho) - 1.0
}

/// T10 (regression): λ·I_k is not monotone. W with top block −I + 0.01·noise and bottom rows
/// scaled by 0.01 (D = 8, k = 4) has κ(W) ≈ 1.04, and κ(W + I_k) is several times larger, so
/// code must never assume that the shift improves κ.
#[test]
fn t10_identity_shift_can_make_kappa_worse() {
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let (d, k) = (8, 4);
    let mut w = gaussian(&mut rng, d, k, 0.01);
    for i in 0..k {
        w[[i, i]] -= 1.0;
    }
    let before = kappa(&w);
    let after = kappa(&IdentityShift::new(1.0).unwrap().apply(w.view()).unwrap());
    // Claim thresholds, not tolerances: measured κ(W) = 1.0517 and κ(W + I_k) = 4.0165, margins
    // of 4% and 27% against κ resolutions kappa_rel_err ≈ 1e-13.
    assert!(before < 1.1, "κ(W) = {before}");
    assert!(
        after > 3.0 * before,
        "κ(W + I_k) = {after}, κ(W) = {before}"
    );
    // λ = 1 ≈ σ_max: neither guarantee applies (exact logic: λ = 1 < σ̂_max ≈ 1.03 for Weyl; the
    // decrease threshold σ_max(κ + 1)/(κ − 1) ≈ 40 ≫ 1).
    let shift = IdentityShift::new(1.0).unwrap();
    assert!(!shift.guarantees_decrease(w.view()).unwrap());
    assert!(shift.weyl_bound(sv(&w)[0]).is_none());
}

// ---------------------------------------------------------------------------------------------
// T13–T15: the cheap implementation, gradients, FLOPs
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cfg(96))]

    /// T13: X (W + λE) == X W + λ X[:, block] (within both evaluations' rounding bounds), for
    /// the single-head projection,
    /// the SelfAttention forward, and the fused multi-head form X(W + λI_D) == X W + λX; and both
    /// multi-head layouts equal per-head attention at the materialized W^h + λE_h.
    #[test]
    fn t13_cheap_correction_equals_materialized(
        n in 1usize..=6, heads in 1usize..=3, k in 1usize..=3, extra in 0usize..=2,
        seed in any::<u64>(), lambda in 0.0f64..10.0, scaled in any::<bool>()
    ) {
        let d = heads * k + extra;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let x = gaussian(&mut rng, n, d, 1.0);
        let w = gaussian(&mut rng, d, k, 0.3);
        let shift = IdentityShift::new(lambda).unwrap();
        let cheap = shift.project(x.view(), w.view()).unwrap();
        let dense = x.dot(&shift.apply(w.view()).unwrap());
        // Same monomials Σ_d X_id W_dc + λX_i,off+c, magnitude |X||W| + λ|X|E. Roundings:
        // cheap — the D-term product, λ·X and the addition (D + 2); materialized — W + λE (1)
        // and the product (D + 1).
        let proj_tol = |w: &Array2<f64>, e: &Array2<f64>| {
            (absm(x.view()).dot(&absm(w.view())) + absm(x.view()).dot(e) * lambda)
                * (gamma(d + 2, U) + gamma(d + 1, U))
        };
        let r = within(&cheap, &dense, &proj_tol(&w, &block_identity::<f64>(d, k, 0).unwrap()));
        prop_assert!(r.is_ok(), "project: {}", r.unwrap_err());

        let hk = heads * k;
        let fused = [gaussian(&mut rng, d, hk, 0.3), gaussian(&mut rng, d, hk, 0.3), gaussian(&mut rng, d, hk, 0.3)];
        let opts = options(scaled, false);
        for layout in [HeadLayout::SameBlock, HeadLayout::Shifted] {
            let mha = MultiHeadAttention::new(fused[0].clone(), fused[1].clone(), fused[2].clone(), heads, opts)
                .unwrap().with_identity_shift(lambda, layout).unwrap();
            prop_assert_eq!(mha.parameter_count(), 3 * d * hk);
            let proj = mha.project_qkv(x.view()).unwrap();
            let mut e = Array2::<f64>::zeros((d, hk));
            for h in 0..heads {
                e.slice_mut(s![.., h * k..(h + 1) * k]).assign(&block_identity::<f64>(d, k, layout.offset(h, k)).unwrap());
            }
            for (p, w) in proj.iter().zip(&fused) {
                let materialized = x.dot(&(w + &(&e * lambda)));
                let r = within(p, &materialized, &proj_tol(w, &e));
                prop_assert!(r.is_ok(), "project_qkv: {}", r.unwrap_err());
            }
            if layout == HeadLayout::Shifted && extra == 0 {
                // Fused D×D: X(W + λ I_D) == X W + λ X (the same bound, E = I_D).
                let eye = Array2::<f64>::eye(d);
                let lhs = x.dot(&(&fused[0] + &(&eye * lambda)));
                let r = within(&lhs, &(x.dot(&fused[0]) + &x * lambda), &proj_tol(&fused[0], &eye));
                prop_assert!(r.is_ok(), "fused: {}", r.unwrap_err());
            }
            let out = mha.forward(x.view()).unwrap();
            for h in 0..heads {
                let eh = block_identity::<f64>(d, k, layout.offset(h, k)).unwrap() * lambda;
                let cols = s![.., h * k..(h + 1) * k];
                let plain = SelfAttention::new(
                    &fused[0].slice(cols) + &eh, &fused[1].slice(cols) + &eh, &fused[2].slice(cols) + &eh, opts,
                ).unwrap();
                let pf = plain.forward(x.view()).unwrap();
                let expect = pf.output().to_owned();
                // Both are forward passes of the exact attention at W^h + λE_h, with projection
                // depth D + 2 (cheap: product, λ·X, addition; materialized: W + λE, product):
                // each within `ea`, so the difference within 2·ea (×2 first order).
                let tol = fwd_bounds(&pf, d + 2, U, 0.0).ea * 4.0;
                let r = within(&out.slice(cols).to_owned(), &expect, &tol);
                prop_assert!(r.is_ok(), "head {h}: {}", r.unwrap_err());
            }
        }
    }

    /// T14: the correction adds no parameter, and ∂L/∂W of the corrected head (computed by finite
    /// differences of the cheap forward X W + λX[:, 0..k], which never forms W + λE) equals the
    /// plain-attention gradient evaluated at W + λE (exact VJP), for the λI_k and the SVD
    /// correction.
    #[test]
    fn t14_gradients_are_plain_gradients_at_shifted_weights(
        (n, d, k) in dims(), seed in any::<u64>(), lambda in 0.0f64..3.0, svd in any::<bool>()
    ) {
        let inst = instance(n, d, k, seed, 0.4, AttentionOptions::default());
        let corrected = if svd {
            inst.head.clone().with_svd_correction().unwrap()
        } else {
            inst.head.clone().with_identity_shift(IdentityShift::new(lambda).unwrap()).unwrap()
        };
        prop_assert_eq!(corrected.parameter_count(), inst.head.parameter_count());
        let [eq, ek, ev] = corrected.effective_weights();
        let plain = SelfAttention::new(eq, ek, ev, AttentionOptions::default()).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 14);
        let g = gaussian(&mut rng, n, k, 1.0);
        let grads = plain.forward(inst.x.view()).unwrap().vjp_weights(g.view()).unwrap();
        // L = ⟨G, A⟩. Finite differences: for λI_k through the corrected head itself (cheap
        // forward, plain weights perturbed); for the SVD correction, C is a constant, so
        // ∂L/∂W = ∂L/∂(W + C) and the materialized W + C is perturbed (C stays put).
        let loss = |h: &SelfAttention<f64>| (&h.forward(inst.x.view()).unwrap().output() * &g).sum();
        let (wq, wk, wv) = inst.head.weights();
        let ws = [wq.to_owned(), wk.to_owned(), wv.to_owned()];
        let center = if svd { corrected.effective_weights() } else { ws.clone() };
        let expect = [&grads.q, &grads.k, &grads.v];
        // Error model (as T1, `fd_error`), with f = L: derivative bounds Σ|G_ic|·M[i, c] from
        // `fd_derivative_bounds` at the effective weights, evaluation rounding
        // δ = Σ|G| ⊙ ea (forward depth D + 1: the cheap X W + λX or the materialized W + C)
        // + γ_{Nk}·Σ|G||A| (the loss sum). The VJP: the same polynomial as Jᵀ vec G, with
        // roundings gP = G Vᵀ (k), the softmax product (N + 3), gS K and Xᵀ· (2N), 1/s (2) —
        // ≤ 3N + k + 8 — so its error is γ·|J|ᵀ|G| + |Ĵ − J|ᵀ|G| (`jac_err`). ×2 for the
        // first-order terms.
        let pf = plain.forward(inst.x.view()).unwrap();
        let b = fwd_bounds(&pf, d + 1, U, 0.0);
        let ga = colvec(&absm(g.view()));
        let delta = (&g.mapv(f64::abs) * &b.ea).sum()
            + gamma(n * k, U) * (&g.mapv(f64::abs) * &absm(pf.output())).sum();
        let mags = mj(&b.p, &b.ax, &b.aq, &b.ak, &b.av, b.s);
        let ej = jac_err(&b, U);
        let gv = gamma(3 * n + k + 8, U);
        for which in 0..3 {
            let mut fd = Array2::<f64>::zeros((d, k));
            let mut tol = Array2::<f64>::zeros((d, k));
            let vjp_err = (mags[which].t().dot(&ga) * gv + ej[which].t().dot(&ga)).to_owned();
            for r in 0..d {
                for c in 0..k {
                    let eval = |x: f64| {
                        let mut m = center.clone();
                        m[which][[r, c]] = x;
                        let [a, bb, cc] = m;
                        let h = SelfAttention::new(a, bb, cc, AttentionOptions::default()).unwrap();
                        if svd {
                            loss(&h)
                        } else {
                            loss(&h.with_identity_shift(IdentityShift::new(lambda).unwrap()).unwrap())
                        }
                    };
                    let l3 = |hh: f64| {
                        let (m3, m2) = fd_derivative_bounds(&pf, which, r, c, hh);
                        ((&m3 * &g.mapv(f64::abs)).sum(), (&m2 * &g.mapv(f64::abs)).sum())
                    };
                    let h = fd_step(delta, l3(0.0).0);
                    let (m3, m2) = l3(h);
                    let w0 = center[which][[r, c]];
                    let (wp, wm) = (w0 + h, w0 - h);
                    fd[[r, c]] = (eval(wp) - eval(wm)) / (wp - wm);
                    tol[[r, c]] = 2.0
                        * (fd_error(w0, h, wp, wm, m3, m2, delta, fd[[r, c]])
                            + vjp_err[r + c * d]);
                }
            }
            let res = within(&fd, expect[which], &tol);
            prop_assert!(res.is_ok(), "projection {which}: {}", res.unwrap_err());
        }
    }
}

/// T15: the cheap λI_k projection costs N·k extra multiplications against 2·N·D·k, a ratio of
/// exactly 1/(2D), for single heads and the fused form (k = D).
#[test]
fn t15_flop_overhead_is_one_over_2d() {
    for (n, d, k) in [(197, 768, 64), (65, 64, 16), (1, 1, 1), (10, 768, 768)] {
        let f = identity_shift_flops(n, d, k);
        assert_eq!(f.extra_multiplies, (n * k) as u64);
        assert_eq!(f.projection_flops, (2 * n * d * k) as u64);
        // Exact: ratio = nk/(2·nk·d) with both operands exact integers in f64, so the one
        // correctly rounded division gives fl(1/(2d)), as does the right-hand side.
        assert_eq!(f.ratio, 1.0 / (2.0 * d as f64));
    }
}

// ---------------------------------------------------------------------------------------------
// f32, diagnostics, errors
// ---------------------------------------------------------------------------------------------

/// The f32 path computes the same attention and Jacobian as f64, within the two passes'
/// derived rounding bounds (u₃₂ and u).
#[test]
fn f32_agrees_with_f64() {
    let inst = instance(6, 8, 3, 7, 0.5, options(true, true));
    let (wq, wk, wv) = inst.head.weights();
    let to32 = |a: ndarray::ArrayView2<'_, f64>| a.mapv(|x| x as f32);
    let h32 = SelfAttention::new(to32(wq), to32(wk), to32(wv), inst.head.options()).unwrap();
    let f32fwd = h32.forward(to32(inst.x.view()).view()).unwrap();
    let f64fwd = inst.head.forward(inst.x.view()).unwrap();
    let d = 8;
    // The f32 pass: X and W rounded to f32 (relative u₃₂ each: two more roundings in the
    // projections, and x_rel = u₃₂ for the tokens), then the same algorithm with u₃₂; the f64
    // pass with u. Both against the exact pass at the f64 inputs; ×2 first order (magnitudes
    // from the f64 pass).
    let b32 = fwd_bounds(&f64fwd, d + 2, U32, U32);
    let b64 = fwd_bounds(&f64fwd, d, U, 0.0);
    let a = f32fwd.output().mapv(f64::from);
    let r = within(
        &a,
        &f64fwd.output().to_owned(),
        &((&b32.ea + &b64.ea) * 2.0),
    );
    assert!(r.is_ok(), "output: {}", r.unwrap_err());
    let j32 = f32fwd
        .jacobian_weights()
        .unwrap()
        .full()
        .unwrap()
        .mapv(f64::from);
    let j64 = f64fwd.jacobian_weights().unwrap().full().unwrap();
    let full = |e: [Array2<f64>; 3]| {
        ndarray::concatenate(ndarray::Axis(1), &[e[0].view(), e[1].view(), e[2].view()]).unwrap()
    };
    let tol = (full(jac_err(&b32, U32)) + full(jac_err(&b64, U))) * 2.0;
    let r = within(&j32, &j64, &tol);
    assert!(r.is_ok(), "Jacobian: {}", r.unwrap_err());
}

/// The collapse derived in `docs/attention.md` ("Diagnostics"), as a property of the diagnostics: with LayerNorm-scaled tokens,
/// W ~ N(0, 0.02²) and λ = 10, attention collapses to the identity (every row saturated on its
/// own token), while λ = 0 gives near-uniform attention.
#[test]
fn large_lambda_collapses_attention_to_the_identity() {
    let (n, d, k) = (197, 768, 64);
    let mut rng = ChaCha8Rng::seed_from_u64(93);
    let mut x = gaussian(&mut rng, n, d, 1.0);
    for mut row in x.rows_mut() {
        let m = row.mean().unwrap();
        row.mapv_inplace(|v| v - m);
        let sd = (row.mapv(|v| v * v).sum() / d as f64).sqrt();
        row.mapv_inplace(|v| v / sd);
    }
    let w = || gaussian(&mut ChaCha8Rng::seed_from_u64(5), d, k, 0.02);
    let head = SelfAttention::new(w(), w(), w(), options(true, false)).unwrap();
    // The thresholds below are claim constants, not tolerances. Measured: plain mean entropy
    // 5.143 against 0.95·ln 197 = 5.019, largest p ≈ 0.02 (no row near the 0.99 saturation
    // threshold, so the count 0 is exact); collapsed: every row saturated, mean diagonal 1.0,
    // mean entropy 8e-118, mean ‖J_i‖_F exactly 0. Every margin is ≥ 2% against rounding errors
    // of order N·u ≈ 1e-13 in these quantities.
    let plain = head.forward(x.view()).unwrap().diagnostics().unwrap();
    assert!(plain.mean_entropy > 0.95 * plain.uniform_entropy);
    assert_eq!(plain.saturated_fraction, 0.0);
    let collapsed = head
        .with_identity_shift(IdentityShift::new(10.0).unwrap())
        .unwrap()
        .forward(x.view())
        .unwrap()
        .diagnostics()
        .unwrap();
    assert!(
        collapsed.saturated_fraction > 0.99
            && collapsed.mean_diagonal > 0.99
            && collapsed.mean_entropy < 0.05,
        "{collapsed:?}"
    );
    // Saturated rows pass (almost) no gradient through the softmax.
    assert!(
        collapsed.mean_softmax_jacobian_frobenius < 0.05 * plain.mean_softmax_jacobian_frobenius,
        "{} vs {}",
        collapsed.mean_softmax_jacobian_frobenius,
        plain.mean_softmax_jacobian_frobenius
    );
    // The diagnostics themselves: one-hot rows have entropy 0.
    let p = Array2::<f64>::eye(3);
    let d = attention_diagnostics(p.view(), p.view(), false, 0.99).unwrap();
    assert_eq!(
        (d.mean_entropy, d.saturated_fraction, d.mean_diagonal),
        (0.0, 1.0, 1.0)
    );
}

fn assert_names<T: std::fmt::Debug>(r: Result<T, AttentionError>, arg: &str) {
    let e = r.unwrap_err();
    let text = e.to_string();
    assert!(text.contains(&format!("`{arg}`")), "{text}");
}

/// Bad input is an error naming the argument, never a panic.
#[test]
fn bad_input_is_an_error_naming_the_argument() {
    let w = Array2::<f64>::ones((4, 2));
    let opts = AttentionOptions::default();
    let head = SelfAttention::new(w.clone(), w.clone(), w.clone(), opts).unwrap();
    let mut x = Array2::<f64>::ones((3, 4));
    x[[1, 2]] = f64::NAN;
    let e = head.forward(x.view()).unwrap_err();
    assert!(
        matches!(
            e,
            AttentionError::Input(InputError::NonFinite {
                arg: "x",
                row: 1,
                col: 2,
                ..
            })
        ),
        "{e}"
    );
    assert_names(head.forward(Array2::<f64>::ones((3, 5)).view()), "x");
    assert_names(head.forward(Array2::<f64>::ones((0, 4)).view()), "x");
    assert_names(
        SelfAttention::new(w.clone(), Array2::ones((4, 3)), w.clone(), opts),
        "wk",
    );
    assert_names(
        SelfAttention::new(
            w.clone(),
            w.clone(),
            Array2::from_elem((4, 2), f64::INFINITY),
            opts,
        ),
        "wv",
    );
    assert_names(
        SelfAttention::new(Array2::<f64>::zeros((0, 2)), w.clone(), w.clone(), opts),
        "wq",
    );
    let bad_scale = AttentionOptions {
        scale: ScoreScale::Custom(-1.0),
        causal: false,
    };
    assert_names(
        SelfAttention::new(w.clone(), w.clone(), w.clone(), bad_scale),
        "scale",
    );
    assert_names(IdentityShift::new(f64::NAN), "lambda");
    assert_names(IdentityShift::new(-1.0), "lambda");
    assert_names(
        head.clone()
            .with_identity_shift(IdentityShift::at_offset(1.0, 3).unwrap()),
        "shift",
    );
    assert_names(block_identity::<f64>(4, 2, 3), "offset");
    assert_names(rect_identity::<f64>(0, 2), "d");
    assert_names(LambdaPolicy::TargetKappa(1.0).choose(w.view()), "policy");
    assert_names(
        LambdaPolicy::SufficientDecrease { margin: 0.0 }.choose(w.view()),
        "policy",
    );
    let q = rect_identity::<f64>(4, 2).unwrap();
    let e = LambdaPolicy::SufficientDecrease { margin: 0.1 }
        .choose(q.view())
        .unwrap_err();
    assert!(
        matches!(e, AttentionError::Unattainable { arg: "w", .. }),
        "{e}"
    );
    let fwd = head.forward(Array2::<f64>::ones((3, 4)).view()).unwrap();
    assert_names(
        fwd.jvp_weights(w.view(), w.view(), Array2::<f64>::ones((4, 3)).view()),
        "dwv",
    );
    assert_names(fwd.vjp_weights(Array2::<f64>::ones((2, 2)).view()), "g");
    assert_names(fwd.jvp_weights_vec(Array1::<f64>::ones(5).view()), "t");
    assert_names(
        fwd.vjp_input_vec(Array1::from(vec![f64::NAN; 6]).view()),
        "u",
    );
    assert_names(fwd.jvp_input(Array2::<f64>::ones((3, 3)).view()), "dx");
    assert_names(
        softmax_rows(Array2::<f64>::zeros((0, 0)).view(), false),
        "scores",
    );
    assert_names(
        softmax_jacobian_dense(Array2::<f64>::ones((2, 3)).view()),
        "p",
    );
    assert_names(
        softmax_jacobian_apply(
            Array2::<f64>::ones((2, 3)).view(),
            Array2::<f64>::ones((3, 2)).view(),
        ),
        "ds",
    );
    assert_names(
        attention_diagnostics(
            Array2::<f64>::eye(2).view(),
            Array2::<f64>::eye(2).view(),
            false,
            1.5,
        ),
        "threshold",
    );
    assert_names(
        MultiHeadAttention::new(w.clone(), w.clone(), w.clone(), 3, opts),
        "heads",
    );
    let wide = Array2::<f64>::ones((2, 4));
    let mha = MultiHeadAttention::new(wide.clone(), wide.clone(), wide, 2, opts).unwrap();
    assert_names(
        mha.clone().with_identity_shift(1.0, HeadLayout::Shifted),
        "layout",
    );
    assert_names(mha.head(2), "h");
    // The dense Jacobian refuses sizes beyond the dense limit instead of aborting on allocation.
    let big = SelfAttention::new(
        Array2::<f64>::zeros((2048, 64)),
        Array2::zeros((2048, 64)),
        Array2::zeros((2048, 64)),
        opts,
    )
    .unwrap();
    let fwd = big
        .forward(Array2::<f64>::zeros((200, 2048)).view())
        .unwrap();
    assert!(matches!(
        fwd.jacobian_weights().unwrap_err(),
        AttentionError::TooLarge { .. }
    ));
}

// ---------------------------------------------------------------------------------------------
// T6: the Theorem 3.4 bound as a measured statistic
// ---------------------------------------------------------------------------------------------

/// What the T6 runs measured in one regime.
#[derive(Debug, Default)]
struct T6Stats {
    trials: usize,
    passes: usize,
    vacuous: usize,
    /// Failures with N > 3D − k, where κ(J) = ∞ structurally (gauge null space).
    structural_failures: usize,
    /// Structural instances (N > 3D − k).
    structural: usize,
    /// Structural instances with κ(J) = ∞ (all of them, by the gauge rank bound).
    structural_infinite: usize,
    /// The largest κ(J)/bound among failures with a finite κ(J).
    worst_finite_ratio: f64,
    /// Trials whose verdict κ(J) ≤ bound is within the derived resolution of κ(J) and of the
    /// bound, so that it could differ between machines.
    undecided: usize,
    /// Structural instances whose σ̂_min(J) is within the derived rounding level τ of J.
    structural_singular: usize,
}

/// Draws the T6 instances from one seeded stream with [`Theorem34Instance::sample`] (the
/// `theory` experiment's sampler): X ~ N(0, 1), W_• ~ N(0, σ²) with σ log-uniform in [0.1, 1],
/// s = 1, no mask. Regime "N ≤ D": D ∈ 3..=10, N ∈ 2..=D; regime "N > D": D ∈ 2..=6,
/// N ∈ D+1..=2D+2; k ∈ 1..=min(D, 4) in both (`max_d` = 10).
fn t6_pass_rate(n_le_d: bool, trials: usize, seed: u64) -> T6Stats {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut st = T6Stats {
        trials,
        ..T6Stats::default()
    };
    let regime = if n_le_d {
        TokenRegime::AtMostD
    } else {
        TokenRegime::AboveD
    };
    for _ in 0..trials {
        let inst = Theorem34Instance::sample(&mut rng, regime, 10).unwrap();
        let (n, d, k) = (inst.n, inst.d, inst.k);
        let fwd: Forward<f64> = inst.forward().unwrap();
        let t = theorem_3_4(&fwd).unwrap();
        let structural = n * k > full_rank_bound(n, d, k);
        // Resolution of κ(J): σ̂ within τ = 2‖Ĵ − J*‖_F bound (`jac_err`) + svd_err of J*'s.
        let b = fwd_bounds(&fwd, d, U, 0.0);
        let ej = jac_err(&b, U);
        let full = fwd.jacobian_weights().unwrap().full().unwrap();
        let sj = sv(&full);
        let tau = 2.0 * (frob(&ej[0]).powi(2) + frob(&ej[1]).powi(2) + frob(&ej[2]).powi(2)).sqrt()
            + svd_err(n * k, 3 * d * k, sj[0]);
        st.structural_singular += usize::from(structural && sj[sj.len() - 1] <= tau);
        // Intervals for the exact κ's: from σ̂ within e·σ₁, κ ∈ [κ̂(1 − e)/(1 + eκ̂),
        // κ̂(1 + e)/(1 − eκ̂)] (upper end ∞ when eκ̂ ≥ 1; a reported κ̂ = ∞ only tells κ ≥ 1).
        let interval = |kappa: f64, e: f64| {
            if kappa.is_infinite() {
                (1.0, f64::INFINITY)
            } else {
                let hi = if e * kappa < 1.0 {
                    kappa * (1.0 + e) / (1.0 - e * kappa)
                } else {
                    f64::INFINITY
                };
                ((kappa * (1.0 - e) / (1.0 + e * kappa)).max(1.0), hi)
            }
        };
        let (s1, smin) = (sj[0], sj[sj.len() - 1]);
        let e = tau / s1;
        let kj = (
            ((1.0 - e) * s1 / (smin + e * s1)).max(1.0),
            if smin > e * s1 {
                (1.0 + e) * s1 / (smin - e * s1)
            } else {
                f64::INFINITY
            },
        );
        // The bound κ(X)³κ⁺(Λ)κ(W_V)(κ(W_Q) + κ(W_K)) + κ(X)κ(P) is increasing in every κ; each
        // κ of an exact input has e = svd_err(·, ·, 1), Λ's entries add 3γ₂ (as in T2); 8u for
        // the arithmetic.
        let ie = |kappa: f64, m: usize, nn: usize| interval(kappa, svd_err(m, nn, 1.0));
        let kx = ie(t.kappa_x, n, d);
        let kl = interval(
            t.pseudo_kappa_lambda,
            svd_err(n * n, n * n, 1.0) + 3.0 * gamma(2, U),
        );
        let (kq, kk, kv, kp) = (
            ie(t.kappa_wq, d, k),
            ie(t.kappa_wk, d, k),
            ie(t.kappa_wv, d, k),
            ie(t.kappa_p, n, n),
        );
        let rhs =
            |x: f64, l: f64, q: f64, kk: f64, v: f64, p: f64| x.powi(3) * l * v * (q + kk) + x * p;
        let rhs_lo = rhs(kx.0, kl.0, kq.0, kk.0, kv.0, kp.0) * (1.0 - 8.0 * U);
        let rhs_hi = rhs(kx.1, kl.1, kq.1, kk.1, kv.1, kp.1) * (1.0 + 8.0 * U);
        let decided = t.rhs.is_infinite() || kj.1 < rhs_lo || kj.0 > rhs_hi;
        st.undecided += usize::from(!decided);
        st.structural += usize::from(structural);
        st.structural_infinite += usize::from(structural && t.jacobian.full.kappa.is_infinite());
        st.passes += usize::from(t.holds());
        st.vacuous += usize::from(t.is_vacuous());
        if !t.holds() {
            if structural {
                st.structural_failures += 1;
            } else if t.ratio().is_finite() {
                st.worst_finite_ratio = st.worst_finite_ratio.max(t.ratio());
            }
        }
    }
    st
}

/// T6 (a statistic, not a hard property): the Theorem 3.4 bound holds in nearly every random
/// instance with N ≤ D (the paper's regime) and fails in a sizeable fraction with N > D, where
/// every instance with N > 3D − k fails structurally (κ(J) = ∞). The asserted bands are the
/// measured rates (see docs/attention.md) with a margin.
#[test]
fn t6_theorem_3_4_pass_rates() {
    let trials = 400;
    let a = t6_pass_rate(true, trials, 6);
    let b = t6_pass_rate(false, trials, 60);
    eprintln!("T6 N ≤ D: {a:?}\nT6 N > D: {b:?}");
    // Measured (x86-64, OpenBLAS): N ≤ D 399/400 (worst finite ratio 1.19), N > D 325/400
    // (68 of the 75 failures structural — the 69th structural instance has a vacuous, infinite
    // bound — worst finite ratio 71.9).
    // Each count is asserted for every resolution of its undecided trials (verdicts within the
    // derived rounding resolution, which could differ between machines).
    let lo1 = (a.passes - a.undecided) as f64 / a.trials as f64;
    assert!(
        lo1 >= 0.99,
        "N ≤ D: the bound held in only {}/{} instances ({} undecided)",
        a.passes,
        a.trials,
        a.undecided
    );
    assert_eq!(a.structural, 0);
    let (lo2, hi2) = (
        (b.passes - b.undecided) as f64 / b.trials as f64,
        (b.passes + b.undecided) as f64 / b.trials as f64,
    );
    assert!(
        0.70 <= lo2 && hi2 <= 0.90,
        "N > D: the bound held in {}/{} instances ({} undecided), outside the measured band [0.70, 0.90]",
        b.passes,
        b.trials,
        b.undecided
    );
    // Every N > 3D − k instance has a structurally zero singular value: σ̂_min(J) ≤ τ (derived,
    // as T4). The crate's κ = ∞ for them (`structural_infinite`) comes from the numpy threshold
    // max(m, n)·ε·σ̂₁, which is below τ, so it is reported, not asserted.
    assert_eq!(
        b.structural_singular, b.structural,
        "every N > 3D − k instance has σ_min(J) at rounding level"
    );
}

proptest! {
    #![proptest_config(cfg(64))]

    /// The O(n) softmax-Jacobian Frobenius norm equals the dense one: Λ is block diagonal with
    /// blocks J_i = diag(p_i) − p_i p_iᵀ, so Σ_i ‖J_i‖_F² = ‖Λ‖_F².
    #[test]
    fn softmax_jacobian_frobenius_matches_dense(n in 1usize..12, seed in any::<u64>(), scale in 0.1f64..30.0) {
        let s = gaussian(&mut ChaCha8Rng::seed_from_u64(seed), n, n, scale);
        let p = softmax_rows(s.view(), false).unwrap();
        let dense = softmax_jacobian_dense(p.view()).unwrap();
        let want: f64 = dense.iter().map(|x| x * x).sum();
        let got: f64 = p
            .rows()
            .into_iter()
            .map(|r| softmax_jacobian_frobenius(&r.to_vec()).powi(2))
            .sum();
        // Both are the same polynomial of p̂ (Σ_ac (δ_ac p_a − p_a p_c)² = s₂ − 2s₃ + s₂²
        // identically, without Σp = 1). Closed form per row: s₂, s₃ (N + 2 roundings), the
        // combination (3), sqrt and square (2), magnitude s₂ + 2s₃ + s₂²; dense: each entry (2)
        // squared (1), summed over the N³ nonzero entries (adding an exact 0 does not round),
        // magnitude Σ(p_a δ_ac + p_a p_c)². Both sums over rows add N roundings.
        let mag_closed: f64 = p.rows().into_iter().map(|r| {
            let s2: f64 = r.iter().map(|x| x * x).sum();
            let s3: f64 = r.iter().map(|x| x * x * x).sum();
            s2 + 2.0 * s3 + s2 * s2
        }).sum();
        let mag_dense: f64 = p.rows().into_iter().map(|r| {
            let mut t = 0.0;
            for a in 0..n { for c in 0..n {
                let e = r[a] * (if a == c { 1.0 } else { 0.0 } + r[c]);
                t += e * e;
            } }
            t
        }).sum();
        let tol = gamma(2 * n + 7, U) * mag_closed + gamma(n * n * n + n + 3, U) * mag_dense;
        prop_assert!((got - want).abs() <= tol, "{got} vs {want}, tol {tol:e}");
    }
}

// ---------------------------------------------------------------------------------------------
// The dense Jacobian's workspace, `_into` and thread counts; the VJP against the direct formula
// ---------------------------------------------------------------------------------------------

/// Shapes with at least 3·N·k·D·k = 73 728 entries, above the size below which the fill runs
/// on the calling thread (2^16), so a thread count above one really splits the work.
fn parallel_dims() -> impl Strategy<Value = (usize, usize, usize)> {
    (24usize..=36, 16usize..=22, 8usize..=11)
}

proptest! {
    #![proptest_config(cfg(12))]

    /// The workspace and `jacobian_weights_into` give exactly the fresh Jacobian: through
    /// reuse, through a change of (N, D, k) that keeps the block shape (8 × 12 for both
    /// (4, 6, 2) and (2, 3, 4), where J_V's zero blocks move), and into blocks that held
    /// other values (every entry overwritten).
    #[test]
    fn workspace_and_into_equal_the_fresh_jacobian(
        (n, d, k) in dims(), seed in any::<u64>(), scaled in any::<bool>(), causal in any::<bool>()
    ) {
        let mut ws = kappa_attention::JacobianWorkspace::new();
        let shapes = [(n, d, k), (4, 6, 2), (2, 3, 4), (n, d, k), (n, d, k)];
        for (round, &(n, d, k)) in shapes.iter().enumerate() {
            let inst = instance(n, d, k, seed.wrapping_add(round as u64), 0.7, options(scaled, causal));
            let fwd = inst.head.forward(inst.x.view()).unwrap();
            let fresh = fwd.jacobian_weights().unwrap();
            prop_assert_eq!(ws.compute(&fwd).unwrap(), &fresh, "workspace, round {}", round);
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ round as u64);
            let mut junk = kappa_attention::WeightJacobian {
                q: gaussian(&mut rng, n * k, d * k, 1.0),
                k: gaussian(&mut rng, n * k, d * k, 1.0),
                v: gaussian(&mut rng, n * k, d * k, 1.0),
            };
            fwd.jacobian_weights_into(&mut junk).unwrap();
            prop_assert_eq!(&junk, &fresh, "into, round {}", round);
            // Into strided views: the three blocks side by side in one junk matrix.
            let mut side = gaussian(&mut rng, n * k, 3 * d * k, 1.0);
            let (q, rest) = side.view_mut().split_at(ndarray::Axis(1), d * k);
            let (kv, v) = rest.split_at(ndarray::Axis(1), d * k);
            fwd.jacobian_weights_into_views([q, kv, v]).unwrap();
            prop_assert_eq!(&side, &fresh.full().unwrap(), "views, round {}", round);
        }
        prop_assert!(ws.take().is_some() && ws.jacobian().is_none());
    }

    /// Bit-identical results for 1, 2, 3 fill threads and rayon's current pool: each entry is
    /// the same product whoever writes it. Checked at shapes large enough to be split.
    #[test]
    fn thread_counts_give_bit_identical_jacobians(
        (n, d, k) in parallel_dims(), seed in any::<u64>(), causal in any::<bool>()
    ) {
        let inst = instance(n, d, k, seed, 0.5, options(true, causal));
        let fwd = inst.head.forward(inst.x.view()).unwrap();
        let mut one = kappa_attention::JacobianWorkspace::with_threads(1).unwrap();
        prop_assert_eq!(one.threads(), 1);
        let want = one.compute(&fwd).unwrap().clone();
        for t in [2usize, 3, 0] {
            let mut ws = kappa_attention::JacobianWorkspace::with_threads(t).unwrap();
            if t > 0 {
                prop_assert_eq!(ws.threads(), t);
            }
            // Twice: the fresh blocks, then the reused ones.
            for pass in 0..2 {
                let got = ws.compute(&fwd).unwrap();
                for (b, (x, y)) in got.blocks().iter().zip(want.blocks()).enumerate() {
                    let same = x.iter().zip(y.iter()).all(|(a, b)| a.to_bits() == b.to_bits());
                    prop_assert!(same, "{} threads, pass {}, block {}", t, pass, b);
                }
            }
        }
        prop_assert_eq!(&fwd.jacobian_weights().unwrap(), &want);
    }
}

proptest! {
    #![proptest_config(cfg(96))]

    /// The weight VJP (five matrix products, softmax backward in place) against the direct
    /// formula written out with the public softmax product: gS = Λ·(G Vᵀ),
    /// ∂W_Q = Xᵀ(gS K)/s, ∂W_K = Xᵀ(gSᵀ Q)/s, ∂W_V = Xᵀ(Pᵀ G).
    #[test]
    fn vjp_matches_the_direct_formula(
        (n, d, k) in dims(), seed in any::<u64>(), scaled in any::<bool>(), causal in any::<bool>()
    ) {
        let inst = instance(n, d, k, seed, 0.7, options(scaled, causal));
        let fwd = inst.head.forward(inst.x.view()).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7a);
        let g = gaussian(&mut rng, n, k, 1.0);
        let got = fwd.vjp_weights(g.view()).unwrap();
        let r = vjp_within_the_direct_formula(&fwd, &g, &got);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

/// The weight VJP's blocks `got` (for cotangent `g`) against the direct formula written out
/// with the public softmax product, within the derived bound below.
fn vjp_within_the_direct_formula(
    fwd: &kappa_attention::Forward<f64>,
    g: &Array2<f64>,
    got: &kappa_attention::WeightSet<f64>,
) -> Result<(), String> {
    let (n, k) = g.dim();
    let (x, p, q, kk, v) = (
        fwd.tokens().to_owned(),
        fwd.attention_matrix().to_owned(),
        fwd.queries().to_owned(),
        fwd.keys().to_owned(),
        fwd.values().to_owned(),
    );
    let inv_s = 1.0 / fwd.score_divisor();
    let gs = softmax_jacobian_apply(p.view(), g.dot(&v.t()).view()).unwrap();
    let want = [
        x.t().dot(&gs.dot(&kk)) * inv_s,
        x.t().dot(&gs.t().dot(&q)) * inv_s,
        x.t().dot(&p.t().dot(g)),
    ];
    // Both evaluate the same polynomial of the cached (X, P, Q, K, V), G and fl(1/s) (the
    // same number on both sides). Roundings along any path: G Vᵀ (k), the softmax product
    // P ⊙ (gP − Σ_j P ⊙ gP) (the product, N − 1 additions, the subtraction and the outer
    // product: N + 2), the N-term product with K, Q or G (N), the scaling by 1/s (1) and the
    // N-term product with Xᵀ (N): m = 3N + k + 3 for both, so |Δ| ≤ 2γ_m·magnitude, the
    // magnitude being the same expression in absolute values:
    // |gS|~ = P ⊙ (|G||V|ᵀ + rowsum(P ⊙ |G||V|ᵀ)), then |X|ᵀ(|gS|~ |K|)/s and so on.
    let m = 3 * n + k + 3;
    let g2 = 2.0 * gamma(m, U);
    let gp = absm(g.view()).dot(&absm(v.view()).t());
    let r = (&p * &gp)
        .sum_axis(ndarray::Axis(1))
        .insert_axis(ndarray::Axis(1));
    let gsm = &p * &(&gp + &r);
    let ax = absm(x.view());
    let mag = [
        ax.t().dot(&gsm.dot(&absm(kk.view()))) * inv_s,
        ax.t().dot(&gsm.t().dot(&absm(q.view()))) * inv_s,
        ax.t().dot(&p.t().dot(&absm(g.view()))),
    ];
    for (b, (got, (want, mag))) in [&got.q, &got.k, &got.v]
        .into_iter()
        .zip(want.iter().zip(mag.iter()))
        .enumerate()
    {
        within(got, want, &(mag * g2)).map_err(|e| format!("block {b}: {e}"))?;
    }
    Ok(())
}

/// Every array of two forward passes, bit for bit.
fn assert_same_forward(a: &kappa_attention::Forward<f64>, b: &kappa_attention::Forward<f64>) {
    let arrays = |f: &kappa_attention::Forward<f64>| {
        [
            f.queries(),
            f.keys(),
            f.values(),
            f.scores(),
            f.attention_matrix(),
            f.output(),
        ]
        .map(|a| a.to_owned())
    };
    assert_eq!(arrays(a), arrays(b));
}

/// From N²k ≥ 2²⁰, in a pool of two or more threads, the forward pass and the weight VJP split
/// their rows between two rayon tasks (and the VJP's last product's columns): every entry is
/// still the same sum in the same order, so the results equal the one-thread pool's bit for
/// bit, and the VJP is within the direct formula's bound. Uneven halves (odd N), causal and
/// scaled scores included; the forward pass also with both corrections.
#[test]
fn the_split_weight_vjp_equals_the_one_thread_vjp() {
    let pool = |t| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .unwrap()
    };
    let (one, two) = (pool(1), pool(2));
    for (n, d, k, causal) in [
        (136, 24, 64, false),
        (137, 20, 64, true),
        (200, 9, 32, false),
        (129, 70, 64, true),
    ] {
        assert!(n * n * k >= 1 << 20, "the split path");
        let inst = instance(n, d, k, 41, 0.7, options(true, causal));
        let fwd = two.install(|| inst.head.forward(inst.x.view()).unwrap());
        let fwd_whole = one.install(|| inst.head.forward(inst.x.view()).unwrap());
        assert_same_forward(&fwd, &fwd_whole);
        let g = gaussian(&mut ChaCha8Rng::seed_from_u64(42), n, k, 1.0);
        let split = two.install(|| fwd.vjp_weights(g.view()).unwrap());
        let whole = one.install(|| fwd.vjp_weights(g.view()).unwrap());
        assert_eq!(split.to_vec(), whole.to_vec(), "{n}×{d}×{k}");
        vjp_within_the_direct_formula(&fwd, &g, &split).unwrap();
        if d < k {
            continue; // the corrections need D ≥ k
        }
        let shifted = inst
            .head
            .clone()
            .with_identity_shift(IdentityShift::new(0.5).unwrap())
            .unwrap();
        for head in [shifted, inst.head.clone().with_svd_correction().unwrap()] {
            let split = two.install(|| head.forward(inst.x.view()).unwrap());
            let whole = one.install(|| head.forward(inst.x.view()).unwrap());
            assert_same_forward(&split, &whole);
        }
    }
}

/// Overflow of J is detected before anything is written: `jacobian_weights_into` leaves its
/// blocks as they were and the workspace keeps its previous result. With W_Q = 0 the scores
/// vanish, P is uniform and J_Q[i + cN, d + eD] = X[i, d]·cov_j(V[j, c], K[j, e])/s, which grows
/// like |X|³: finite for |X| ~ 1e90 (≈ 1e270), beyond f64 for |X| ~ 1e110 (≈ 1e330) although
/// the forward pass (|V| ~ |X|, scores 0) is finite.
#[test]
fn jacobian_overflow_is_refused_before_writing() {
    let (n, d, k) = (5, 4, 3);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let x = gaussian(&mut rng, n, d, 1.0);
    let (wk, wv) = (gaussian(&mut rng, d, k, 1.0), gaussian(&mut rng, d, k, 1.0));
    let head =
        SelfAttention::new(Array2::zeros((d, k)), wk, wv, AttentionOptions::default()).unwrap();
    let ok = head.forward((&x * 1e90).view()).unwrap();
    let j = ok.jacobian_weights().unwrap();
    assert!(j.q.iter().all(|e| e.is_finite()));
    assert!(
        j.q.iter().any(|e| e.abs() > 1e250),
        "the test's scale is off"
    );
    let mut ws = kappa_attention::JacobianWorkspace::new();
    ws.compute(&ok).unwrap();

    let bad = head.forward((&x * 1e110).view()).unwrap();
    let mut out = j.clone();
    match bad.jacobian_weights_into(&mut out) {
        Err(AttentionError::Overflow { arg: "self", .. }) => {}
        other => panic!("expected Overflow naming self, got {other:?}"),
    }
    assert_eq!(out, j, "the blocks changed although the call failed");
    assert!(matches!(
        ws.compute(&bad),
        Err(AttentionError::Overflow { arg: "self", .. })
    ));
    assert_eq!(ws.jacobian(), Some(&j));
    assert!(matches!(
        bad.jacobian_weights(),
        Err(AttentionError::Overflow { arg: "self", .. })
    ));
}
