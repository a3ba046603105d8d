//! The testable claims T1–T11 of docs/convergence.md (§Claims → code → tests), as property tests,
//! plus the error contract. Monte Carlo tolerances are derived from the estimators' standard
//! errors and a family-wise false-alarm rate (docs/convergence.md, §Monte Carlo tolerances).

use kappa_optim::convergence::*;
use kappa_optim::{InputError, OptimError};
use ndarray::{array, Array2};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn spec(d: usize, k: usize, kappa_sigma: f64, kappa_t: f64, noise: f64) -> ModelSpec {
    ModelSpec {
        d,
        k,
        noise_std: noise,
        covariance: CovarianceSpec {
            kappa: kappa_sigma,
            random_basis: true,
        },
        target: TargetSpec {
            nuclear_norm: 1.0,
            kappa: kappa_t,
        },
    }
}

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn frob(a: &Array2<f64>) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn max_abs(a: &Array2<f64>) -> f64 {
    a.iter().fold(0.0f64, |m, x| m.max(x.abs()))
}

/// Log-log least-squares slope of (n, v) pairs.
fn loglog_slope(points: &[(f64, f64)]) -> f64 {
    let fit =
        geometric_rate(&points.iter().map(|&(n, v)| (n.ln(), v)).collect::<Vec<_>>()).unwrap();
    fit.log_mu
}

/// Family-wise false-alarm rate of each Monte Carlo test: the probability, under a normal
/// approximation of the estimators, that a correct claim fails on some case of the test
/// (docs/convergence.md, §Monte Carlo tolerances).
const FALSE_ALARM: f64 = 1e-6;

/// Q(z) = P(N(0,1) > z) by Laplace's continued fraction Q(z) = φ(z)/(z + 1/(z + 2/(z + …))),
/// evaluated bottom-up with 400 levels (relative error < 1e-12 for z ≥ 2, the range used here).
fn normal_upper_tail(z: f64) -> f64 {
    let mut t = z;
    for k in (1..=400).rev() {
        t = z + k as f64 / t;
    }
    (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt() / t
}

/// The number of standard deviations z for `comparisons` two-sided comparisons per case over
/// the `cases` cases of a test's configuration (Bonferroni): 2·Q(z)·comparisons·cases =
/// [`FALSE_ALARM`]. The case count is read from `kappa_testkit::config`, so an exploring run
/// (16× cases) keeps the same family-wise rate. z ≈ 5.3 for 18 comparisons, 5.9 for 288.
fn z_for(cases: u32, comparisons: u32) -> f64 {
    z_two_sided(
        FALSE_ALARM / (f64::from(kappa_testkit::config(cases).cases) * f64::from(comparisons)),
    )
}

/// z with 2·Q(z) = p (two-sided), by bisection on [`normal_upper_tail`].
fn z_two_sided(p: f64) -> f64 {
    let (mut lo, mut hi) = (2.0, 40.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if 2.0 * normal_upper_tail(mid) > p {
            lo = mid
        } else {
            hi = mid
        }
    }
    hi
}

/// Mean and standard error (sample sd/√r) of r replicates.
fn mean_se(v: &[f64]) -> (f64, f64) {
    let r = v.len() as f64;
    let m = v.iter().sum::<f64>() / r;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (r - 1.0);
    (m, (var / r).sqrt())
}

/// Unit roundoff u = 2⁻⁵³.
const U: f64 = f64::EPSILON / 2.0;

/// Elementwise |M|.
fn abs(a: &Array2<f64>) -> Array2<f64> {
    a.mapv(f64::abs)
}

/// γ_n = nu/(1 − nu) (Higham, *Accuracy and Stability*, Lemma 3.1): a computed inner product
/// of length n, in any summation order and with or without FMA, is within γ_n·Σ|products| of
/// the exact one, so |fl(XY) − XY| ≤ γ_n|X||Y| elementwise, and a chain of products of inner
/// sizes n₁, n₂, … is within γ_{n₁+n₂+…} of the product of the |factors|. This is why these
/// bounds hold for every BLAS kernel.
fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

/// The constant of the normwise standard model: an operation of size n on matrices (a product,
/// a symmetric eigensolve or SVD, its backward error) is exact for data perturbed by at most
/// C·n·u relative to the data's norm. Used where a bound goes through LAPACK (eigensolvers,
/// SVD), whose backward error is p(n)·u with an unspecified modest p; each use states its size
/// and the condition number that amplifies it. The largest constants measured against these
/// bounds (an exploring run, 99 cases each): 0.3 for T8's trajectories, 0.8 for T5's balance gap
/// (0.2 of its bound), ≤ 0.35 for T4, T5's product and T6 — so 4 is the model's constant,
/// checked, not tuned. [`rounding_tolerance`] (T8) uses it too.
const C_SM: f64 = 4.0;

/// A rigorous bound on |fl(E) − E(A', B')| for [`PopulationProblem::excess`] at stored A, B,
/// where A', B' are exact matrices whose entries the stored ones equal up to a relative `rel`
/// (0 when A, B are the exact inputs). E = ½‖FΣ^{1/2}‖², F = AΣBᵀ − M, computed as
/// F̂ = fl(fl(AΣBᵀ) − M), Ĝ = fl(F̂Σ^{1/2}), Ê = ½Σ Ĝ²: with P = |A||Σ||Bᵀ|,
/// |F̂ − F| ≤ (γ_{2d} + 2rel + rel²)P + u|F̂|/(1 − u) =: δF, |Ĝ − G| ≤ δF|Σ^{1/2}| + γ_d|F̂||Σ^{1/2}|
/// =: Δ, and |Ê − E| ≤ Σ|Ĝ|Δ + ½ΣΔ² + γ_{kd+1}Ê. (The bound's own rounding, relative γ_{3d},
/// is covered by the factor 1 + 1e-6.)
fn excess_rounding(pop: &PopulationProblem, a: &Array2<f64>, b: &Array2<f64>, rel: f64) -> f64 {
    let (k, d) = a.dim();
    let p = abs(a).dot(&abs(pop.sigma())).dot(&abs(b).t());
    let f = a.dot(pop.sigma()).dot(&b.t()) - pop.m();
    let df = p * (gamma(2 * d) + 2.0 * rel + rel * rel) + abs(&f) * (U / (1.0 - U));
    let sh = abs(pop.sigma_half());
    let g = f.dot(pop.sigma_half());
    let dg = df.dot(&sh) + abs(&f).dot(&sh) * gamma(d);
    let e = 0.5 * g.iter().map(|x| x * x).sum::<f64>();
    let bound =
        (abs(&g) * &dg).sum() + 0.5 * dg.iter().map(|x| x * x).sum::<f64>() + gamma(k * d + 1) * e;
    bound * (1.0 + 1e-6)
}

/// ‖Σ̂^{-1/2}‖₂ = (κ(Σ̂)/λ_max(Σ̂))^{1/2}.
fn inv_half_norm(mo: &Moments) -> f64 {
    (mo.condition() / mo.sigma_hat_max_eigenvalue()).sqrt()
}

/// Standard-model bound on ‖A₀Σ̂B₀ᵀ − M̂‖_F at a spectral initialization (A₀, B₀) computed from
/// the moments (T5, T6). A₀Σ̂B₀ᵀ = U₀(Σ̂^{-1/2}Σ̂Σ̂^{-1/2})V₀Σ̂^{-1/2} and M̂ = T̂Σ̂^{-1/2} in exact
/// arithmetic; in floating point U₀V₀ = T̂ up to the SVD's backward error (size r ≤ min(k, d),
/// relative to ‖T̂‖), Σ̂^{-1/2}Σ̂Σ̂^{-1/2} = I and Σ̂^{1/2}Σ̂^{-1/2} = I up to the eigensolvers'
/// backward errors (size d) times κ(Σ̂) (Σ̂^{±1/2} come from separate eigensolves), and each
/// product errs by γ_d relative to the norms of its factors; every term is relative to
/// ‖U₀‖‖V₀‖‖Σ̂^{-1/2}‖ ≤ ‖T̂‖_F‖Σ̂^{-1/2}‖₂ (on Ŝ* ‖U₀‖₂² = ‖V₀‖₂² = σ₁(T̂)). Sum of sizes ≤ 2(d + k),
/// hence C_SM·2(d + k)·u·κ(Σ̂)·‖T̂‖_F·‖Σ̂^{-1/2}‖₂.
fn init_product_bound(mo: &Moments) -> f64 {
    let (d, k) = (mo.dim(), mo.outputs());
    C_SM * (2 * (d + k)) as f64 * U * mo.condition() * frob(mo.t_hat()) * inv_half_norm(mo)
}

/// Standard-model bound on the computed balance gap ‖UᵀU − VVᵀ‖_F (or D = Σ̂^{1/2}(AᵀA −
/// BᵀΣ̂B)Σ̂^{1/2}) at a spectral initialization, where it is 0 exactly. Going from (U₀, V₀) to
/// (A₀, B₀) and back multiplies by Σ̂^{-1/2} and Σ̂^{1/2} (from separate eigensolves: their
/// product is I up to size-d backward errors times κ(Σ̂)), and each product errs by γ_d relative
/// to its factors' norms, also amplified by at most κ(Σ̂); the gap is quadratic, so its error is
/// ≤ 2‖U₀‖·δU + 2‖V₀‖·δV. With ‖U₀‖_F² = ‖V₀‖_F² = tr D̂ (on Ŝ*) and sizes summing to ≤ 4d:
/// C_SM·4d·u·κ(Σ̂)·2·tr D̂.
fn init_gap_bound(mo: &Moments) -> f64 {
    C_SM * (4 * mo.dim()) as f64 * U * mo.condition() * 2.0 * mo.t_singular_values().sum()
}

/// The step of a central difference that balances truncation h²|f‴|/6 against roundoff ε/h
/// (ε the rounding bound of f): h = (3ε/|f‴|)^{1/3}, at most 1e-2 (and 1e-2 when f‴ = 0: a
/// quadratic has no truncation).
fn optimal_step(eps: f64, f3: f64) -> f64 {
    if f3 > 0.0 {
        (3.0 * eps / f3).cbrt().min(1e-2)
    } else {
        1e-2
    }
}

/// The central difference of f along one coordinate at x, and its error bound against f′(x)
/// (docs/convergence.md §Rounding tolerances, "Finite differences"). `f0 = (f(x), ε(x))` and
/// `eval(x')` = (computed f, its rounding bound ε) at the coordinate value x'; `f3` bounds |f‴|
/// on [x − h, x + h]. The divisor is the realized step fl(x + h) − fl(x − h), so the difference
/// is f′ at the realized centre: truncation h²f3/6 (the central difference is
/// f′ + h²(f‴(ξ₁) + f‴(ξ₂))/12), roundoff (ε₊ + ε₋)/realized, the centre's shift by the
/// rounding of x ± h (|f″|·u(|x| + h), f″ from the second difference plus its own roundoff),
/// and the rounding of the division and of the realized step (2u|fd|). The closed form's own
/// rounding is the caller's.
fn central_difference(
    x: f64,
    h: f64,
    (f0, e0): (f64, f64),
    f3: f64,
    eval: impl Fn(f64) -> (f64, f64),
) -> (f64, f64) {
    let (xp, xm) = (x + h, x - h);
    let ((fp, ep), (fm, em)) = (eval(xp), eval(xm));
    let realized = xp - xm;
    let fd = (fp - fm) / realized;
    let f2 = ((fp - 2.0 * f0 + fm) / (h * h)).abs() + (ep + em + 2.0 * e0) / (h * h);
    let tol = h * h * f3 / 6.0 + (ep + em) / realized + f2 * U * (x.abs() + h) + 2.0 * U * fd.abs();
    (fd, tol)
}

/// The columns of a prompt of n covariates that are queries in `mode` (as in the library's
/// episodes: all of them, or the last ⌊n/2⌋ for split keys).
fn query_columns(n: usize, mode: ContextMode) -> std::ops::Range<usize> {
    match mode {
        ContextMode::SplitKeys => n.div_ceil(2)..n,
        _ => 0..n,
    }
}

/// Per-coordinate maxima of a prompt: max_i |x_ti| and the spread max_i x_ti − min_i x_ti.
fn key_extent(x: ndarray::ArrayView2<f64>) -> (ndarray::Array1<f64>, ndarray::Array1<f64>) {
    let max_abs = x.map_axis(ndarray::Axis(1), |r| r.fold(0.0f64, |m, v| m.max(v.abs())));
    let spread = x.map_axis(ndarray::Axis(1), |r| {
        let (lo, hi) = r.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| {
            (l.min(v), h.max(v))
        });
        hi - lo
    });
    (max_abs, spread)
}

/// log-error bound ρ of the computed softmax weights of one query (module attention's
/// max-shifted softmax over n keys), p̂_i = p_i·e^{θ_i}, |θ_i| ≤ ρ: the logits s_i = qᵀBx_i
/// (v = Bᵀq, then v·x_i: a chain of inner size 2d) err by ≤ γ_{2d}·S with
/// S = Σ_{s,t}|q_s||B_st|max_i|x_ti| ≥ Σ|q||B||x_i|, the max-shift subtraction by u·|ŝ_i − m̂| ≤
/// 2u(1 + γ_{2d})S, together ≤ Δ = γ_{2d+3}·S; exp (1 ulp: ≤ 2u) adds ≤ 2u to the log; the
/// normalization divides by the sum, whose log-error is ≤ Δ + 2u (the weights') plus the
/// summation's and the reciprocal's and the product's ≤ 2γ_{n+2} (|ln(1 − γ)| ≤ 2γ). Hence
/// ρ = 2(Δ + 2u) + 2γ_{n+2}: the logits' error amplified through exp.
fn softmax_log_error(s_abs: f64, d: usize, n: usize) -> f64 {
    2.0 * (gamma(2 * d + 3) * s_abs + 2.0 * U) + 2.0 * gamma(n + 2)
}

/// The rounding of a straight-line computation of +, −, × in which the softmax weights appear
/// `p_degree` times per monomial: relative to its absolute version (every input and operation
/// replaced by its |·|), a chain of `n` roundings errs by ≤ γ_n, and each weight's log-error ρ
/// ([`softmax_log_error`]) multiplies a monomial by ≤ e^{ρ}: ((1 + γ_n)e^{p_degree·ρ} − 1).
fn chain_rounding(n: usize, rho: f64, p_degree: i32) -> f64 {
    (1.0 + gamma(n)) * (f64::from(p_degree) * rho).exp() - 1.0
}

/// Rigorous rounding bounds of [`EmpiricalProblem::loss_grad`] (module attention) over
/// `prompts` in `mode`, and a bound on |f‴| along each B coordinate (L̂ is quadratic in A, so
/// f‴ = 0 there). Every bound is a mean over the queries of per-query bounds, with the keys'
/// largest entries standing for the weighted averages (Σp = 1, so |z_t| ≤ max_i|x_ti|):
/// with R_o = |y_o| + (|A|·xmax)_o ≥ |r_o|, the loss term ½‖r‖² has absolute version ½‖R‖², p of
/// degree 2 (r is linear in z) and n_k + d + k + N + 4 roundings (z, r, ‖r‖², the sum over the
/// N queries and the scaling by 1/N); ∇_A = mean r zᵀ: R_o·xmax_t, degree 2, n_k + d + N + 4;
/// ∇_B = mean q uᵀ, u_t = Σ_i p_i(h_i − wᵀz)x_ti, w = AᵀR, h_i = wᵀx_i: |q_s|·2H·xmax_t with
/// H = (|A|ᵀR)·xmax, degree 3, 2n_k + 2d + k + N + 8.
///
/// f‴ along B_st: the logits move by t·c_i, c_i = q_s x_ti, so p is the exponential tilt of the
/// keys by c, and the derivatives of z = E_p[x] are the joint cumulants of (x, c, …, c):
/// |z′| ≤ δ·W, |z″| ≤ δ·W², |z‴| ≤ 4δ·W³ (δ_t the keys' spread in coordinate t, W = |q_s|·δ_t
/// the spread of c). With r = Az − y and f = ½‖r‖², f‴ = Σ_o(3r′_o r″_o + r_o r‴_o), so
/// |f‴| ≤ W³Σ_o(3α_o² + 4R_oα_o), α = |A|δ — for every B, so on the whole step's interval.
struct LayerRounding {
    loss: f64,
    grad_a: Array2<f64>,
    grad_b: Array2<f64>,
    f3_b: Array2<f64>,
}

fn layer_rounding(
    prompts: &[Sample],
    mode: ContextMode,
    a: &Array2<f64>,
    b: &Array2<f64>,
) -> LayerRounding {
    let (k, d) = a.dim();
    let n_total: usize = prompts
        .iter()
        .map(|p| query_columns(p.len(), mode).len())
        .sum();
    let mut out = LayerRounding {
        loss: 0.0,
        grad_a: Array2::zeros((k, d)),
        grad_b: Array2::zeros((d, d)),
        f3_b: Array2::zeros((d, d)),
    };
    let nf = n_total as f64;
    for p in prompts {
        let (x, y) = (p.x(), p.y());
        let n = p.len();
        let (xmax, spread) = key_extent(x);
        let bx = abs(b).dot(&xmax);
        let (axmax, alpha) = (abs(a).dot(&xmax), abs(a).dot(&spread));
        for j in query_columns(n, mode) {
            let q = x.column(j);
            let rho = softmax_log_error(q.mapv(f64::abs).dot(&bx), d, n);
            let big_r = y.column(j).mapv(f64::abs) + &axmax;
            let r2 = big_r.dot(&big_r);
            out.loss += chain_rounding(n + d + k + n_total + 4, rho, 2) * 0.5 * r2 / nf;
            let ea = chain_rounding(n + d + n_total + 4, rho, 2) / nf;
            let h = abs(a).t().dot(&big_r).dot(&xmax);
            let eb = chain_rounding(2 * n + 2 * d + k + n_total + 8, rho, 3) / nf;
            let f3 = 3.0 * alpha.dot(&alpha) + 4.0 * big_r.dot(&alpha);
            for t in 0..d {
                for o in 0..k {
                    out.grad_a[[o, t]] += ea * big_r[o] * xmax[t];
                }
                for s in 0..d {
                    out.grad_b[[s, t]] += eb * q[s].abs() * 2.0 * h * xmax[t];
                    out.f3_b[[s, t]] += (q[s].abs() * spread[t]).powi(3) * f3 / nf;
                }
            }
        }
    }
    out
}

#[test]
fn normal_tail_matches_known_values() {
    // Q(2) = 0.0227501319…, Q(5) = 2.86651572e-7, Q(8) = 6.22096057e-16.
    for (z, q) in [
        (2.0, 0.022750131948179),
        (5.0, 2.866515718791939e-7),
        (8.0, 6.220960574271785e-16),
    ] {
        assert!(
            (normal_upper_tail(z) / q - 1.0).abs() < 1e-9,
            "Q({z}) = {}",
            normal_upper_tail(z)
        );
    }
    // z_for reads the case count from the configuration (16× when exploring): check its
    // defining equation 2·Q(z)·cases·comparisons = FALSE_ALARM, and the tabulated value only
    // for the default count (one case: Q(4.891638) = 5e-7). (Found by exploring: the fixed
    // value failed there, 5.41 for 16 cases.)
    let cases = f64::from(kappa_testkit::config(1).cases);
    let z = z_for(1, 3);
    assert!(
        (2.0 * normal_upper_tail(z) * cases * 3.0 / FALSE_ALARM - 1.0).abs() < 1e-9,
        "z_for(1, 3) = {z}"
    );
    if !kappa_testkit::exploring() {
        assert!((z_for(1, 1) - 4.891638).abs() < 1e-3, "{}", z_for(1, 1));
    }
}

/// Cases of T1, T2, T3 and T9.
const MC_CASES: u32 = 6;
/// Context draws per n in T1.
const T1_REPS: usize = 400;
/// Initialization samples per n in T9.
const T9_REPS: usize = 192;
/// Cases and initialization samples of T7 (128: the chi-square bound on σ̂ is then ≤ 1.5·σ̂ at
/// the exploring run's rate; with 16 it was ≈ 3·σ̂, §T7).
const T7_CASES: u32 = 6;
const T7_REPS: usize = 128;
/// Samples of the T7 finding as it was found (16 per case).
const T7_FINDING_REPS: usize = 16;
/// T7's claim level: "two samples give 1 − μ within a factor 2" is asserted as
/// P(|ℓ₁ − ℓ₂| > log 2) ≤ T7_CLAIM, a property of the claim, fixed — not the test's false-alarm
/// rate, which grows with the case count (the old criterion used z_for and so tightened the
/// claim under exploring; found by exploring, §T7).
const T7_CLAIM: f64 = 1e-3;

/// The mean squared error of the attention average X softmax(XᵀBᵀq) around ΣBᵀq over contexts
/// of n keys, to second order: c₁/n + c₂/n² (docs/convergence.md, §T1), at v = Bᵀq.
struct MseExpansion {
    c1: f64,
    c2: f64,
    /// Rounding bounds of the computed c₁, c₂.
    e1: f64,
    e2: f64,
}

/// [`MseExpansion`] with its rounding: c₁ = e^s(tr Σ + ‖μ‖²), c₂ = −2(c₃ − c₁) + 3(c₁(e^s − 1) +
/// 2e^{2s}‖μ‖²), c₃ = e^{3s}(tr Σ + 4‖μ‖²), μ = ΣBᵀq, s = vᵀμ. The polynomial parts are chains of
/// depth ≤ 3d + 4 (v, μ, s or ‖μ‖², then the combinations): γ_{4d+10} relative to their absolute
/// versions (|Σ|, |B|, |q|). The exponentials are exact up to their argument's error
/// |δs| ≤ γ_{3d}·s_abs (s_abs = |v|ᵀ|Σ||v|, |v| = |B|ᵀ|q|) and 1 ulp (2u), a factor e^{±ρ_s}
/// per power of e^s, ρ_s = 3γ_{3d}·s_abs + 2u covering the tripled argument of c₃ — so the
/// [`chain_rounding`] with e^s of degree 3; e^s − 1 (expm1) errs absolutely by ≤ e^s·|δs|·e^{|δs|}
/// plus 2u of itself.
fn attention_mse_expansion(
    sigma: &Array2<f64>,
    b: &Array2<f64>,
    q: ndarray::ArrayView1<f64>,
) -> MseExpansion {
    let d = sigma.nrows();
    let v = b.t().dot(&q);
    let mu = sigma.dot(&v);
    let s = v.dot(&mu);
    let (tr, mu2) = (sigma.diag().sum(), mu.dot(&mu));
    let c1 = s.exp() * (tr + mu2);
    let third = (3.0 * s).exp() * (tr + 4.0 * mu2);
    let c2 = -2.0 * (third - c1) + 3.0 * (c1 * s.exp_m1() + 2.0 * (2.0 * s).exp() * mu2);
    let v_abs = abs(b).t().dot(&q.mapv(f64::abs));
    let mu_abs = abs(sigma).dot(&v_abs);
    let (s_abs, tr_abs, mu2_abs) = (
        v_abs.dot(&mu_abs),
        abs(sigma).diag().sum(),
        mu_abs.dot(&mu_abs),
    );
    let rho = 3.0 * gamma(3 * d) * s_abs + 2.0 * U;
    let chain = chain_rounding(4 * d + 10, rho, 3);
    let c1_abs = s.exp() * (tr_abs + mu2_abs);
    let third_abs = (3.0 * s).exp() * (tr_abs + 4.0 * mu2_abs);
    let c2_abs = 2.0 * (third_abs + c1_abs)
        + 3.0 * (c1_abs * s.exp_m1().abs() + 2.0 * (2.0 * s).exp() * mu2_abs);
    let ds = gamma(3 * d) * s_abs;
    let expm1_err = s.exp() * ds * ds.exp() + 2.0 * U * s.exp_m1().abs();
    MseExpansion {
        c1,
        c2,
        e1: chain * c1_abs,
        e2: chain * c2_abs + 3.0 * c1_abs * (1.0 + chain) * expm1_err,
    }
}

/// A rigorous bound on the rounding of one T1 replicate, the mean over the queries of
/// ‖fl(attend(I, B, X, q)) − fl(ΣBᵀq)‖²: each output entry errs by ≤ [`chain_rounding`](n + d,
/// ρ, 1)·max_i|x_ti| (z over n keys, then I·z; p of degree 1; ρ from [`softmax_log_error`]),
/// the limit by γ_{2d}(|Σ||B|ᵀ|q|)_t, their difference by u|ê_t| more: δe. The sum of squares
/// over the d·n_q entries then errs by Σ(2|ê|δe + δe²) + γ_{d·n_q+2}Σê² (with the scaling by
/// 1/n_q).
fn attention_replicate_rounding(
    sigma: &Array2<f64>,
    b: &Array2<f64>,
    context: &Array2<f64>,
    queries: &Array2<f64>,
    err: &Array2<f64>,
) -> f64 {
    let (d, n) = context.dim();
    let (xmax, _) = key_extent(context.view());
    let bx = abs(b).dot(&xmax);
    let lim_abs = abs(sigma).dot(&abs(b).t()).dot(&abs(queries));
    let mut total = 0.0;
    for (j, q) in queries.columns().into_iter().enumerate() {
        let rho = softmax_log_error(q.mapv(f64::abs).dot(&bx), d, n);
        let out_err = chain_rounding(n + d, rho, 1);
        for t in 0..d {
            let e = err[[t, j]].abs();
            let de = out_err * xmax[t] + gamma(2 * d) * lim_abs[[t, j]] + U * e;
            total += 2.0 * e * de + de * de;
        }
    }
    let sq: f64 = err.iter().map(|e| e * e).sum();
    (total + gamma(d * queries.ncols() + 2) * sq) / queries.ncols() as f64
}

/// ln Γ(x), x > 0: shifted to x ≥ 15, then Stirling's series to x⁻⁹ (next term
/// 691/(360360·x¹¹) < 2e-16).
fn ln_gamma(mut x: f64) -> f64 {
    let mut acc = 0.0;
    while x < 15.0 {
        acc -= x.ln();
        x += 1.0;
    }
    let (x2, x3) = (x * x, x * x * x);
    acc + (x - 0.5) * x.ln() - x + 0.5 * (2.0 * std::f64::consts::PI).ln() + 1.0 / (12.0 * x)
        - 1.0 / (360.0 * x3)
        + 1.0 / (1260.0 * x3 * x2)
        - 1.0 / (1680.0 * x3 * x2 * x2)
        + 1.0 / (1188.0 * x3 * x3 * x3)
}

/// P(χ²_df ≤ x), the regularized lower incomplete gamma P(df/2, x/2), by its power series
/// e^{−t}t^a/Γ(a)·Σ_k t^k/(a(a+1)…(a+k)) (converges for every t; fast for t below the mean).
fn chi2_cdf(df: f64, x: f64) -> f64 {
    let (a, t) = (df / 2.0, x / 2.0);
    if t <= 0.0 {
        return 0.0;
    }
    let (mut term, mut sum) = (1.0 / a, 1.0 / a);
    for k in 1..100_000 {
        term *= t / (a + k as f64);
        sum += term;
        if term < 1e-17 * sum {
            break;
        }
    }
    (a * t.ln() - t - ln_gamma(a) + sum.ln()).exp()
}

/// The factor f with σ ≤ f·σ̂ except with probability FALSE_ALARM/(cases·estimates) per
/// estimate (family-wise FALSE_ALARM over a test's `estimates` standard deviations per case,
/// Bonferroni): for r normal replicates (r − 1)σ̂²/σ² ~ χ²_{r−1}, so f = √((r − 1)/q) with q
/// the lower α-quantile of χ²_{r−1} (bisection on [`chi2_cdf`]). The case count is read from
/// the configuration like [`z_for`]'s. Together with z the test's false-alarm rate is
/// ≤ 2·FALSE_ALARM (docs/convergence.md, §Monte Carlo tolerances).
fn sd_upper_factor(replicates: usize, cases: u32, estimates: u32) -> f64 {
    let alpha =
        FALSE_ALARM / (f64::from(kappa_testkit::config(cases).cases) * f64::from(estimates));
    let df = (replicates - 1) as f64;
    let (mut lo, mut hi) = (0.0, df);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if chi2_cdf(df, mid) > alpha {
            hi = mid
        } else {
            lo = mid
        }
    }
    (df / lo).sqrt()
}

#[test]
fn chi_square_matches_known_values() {
    // Tabulated lower quantiles: χ²_15 at 0.001 is 3.483, χ²_10 at 0.05 is 3.940; P(χ²_2 ≤ x) = 1 − e^{−x/2}.
    assert!(
        (chi2_cdf(15.0, 3.483) - 0.001).abs() < 2e-6,
        "{}",
        chi2_cdf(15.0, 3.483)
    );
    assert!(
        (chi2_cdf(10.0, 3.940) - 0.05).abs() < 1e-4,
        "{}",
        chi2_cdf(10.0, 3.940)
    );
    assert!((chi2_cdf(2.0, 1.3) - (1.0 - (-0.65f64).exp())).abs() < 1e-13);
}

/// The terms of T3's tolerance (docs/convergence.md §T3) for one context mode.
#[derive(Debug)]
struct T3Terms {
    /// The derived O(1/n) bias E[L̂] − E[mean ½‖r_j‖²] (first order, delta method).
    bias: f64,
    /// sd of the mean of the limit losses ½‖r_j‖², r_j = y_j − AΣBᵀx_j, over the queries.
    sd_limit: f64,
    /// sd of the linear key term −mean_j r_jᵀA·δ_j: its projection on single keys and the
    /// degenerate rest.
    sd_keys: f64,
    /// sd of the quadratic terms (products of two key averages): their size over √n_k.
    sd_nonlinear: f64,
    /// The unmodelled second-order bias: first-order pieces × 40·e^{2s}/n_k.
    remainder: f64,
}

/// T3's terms (docs/convergence.md §T3): with v_j = Bᵀx_j, μ_j = Σv_j, s_j = v_jᵀμ_j, normalized
/// weights ŵ_ij = e^{x_iᵀv_j − s_j/2} (E ŵ = 1), the attention average's error is
/// e_j = δ_j/(1 + ε_j), δ_j = mean_i ŵ_ij(x_i − μ_j), ε_j = mean_i ŵ_ij − 1, and the query's loss
/// ½‖r_j − A·e_j‖² = ½‖r_j‖² − r_jᵀA·e_j + ½‖A·e_j‖². Given the query, E[e_j] = −e^{s_j}μ_j/n_k
/// and E‖A·e_j‖² = e^{s_j}(tr AΣAᵀ + ‖Aμ_j‖²)/n_k to first order, so the bias is
/// mean_j e^{s_j}(r_jᵀAμ_j + ½tr AΣAᵀ + ½‖Aμ_j‖²)/n_k, plus, in `SelfIncluded`, the own key's
/// −ŵ_jj·r_jᵀA(x_j − μ_j)/n. The linear term's kernel k_ij = −ŵ_ij·r_jᵀA(x_i − μ_j) has
/// E_i k_ij = 0 exactly, so its fluctuation is the projection h_i = mean_j k_ij (sd_h/√n_k)
/// plus a degenerate rest (≤ √(2·mean k²/(n_k·n_q))).
fn t3_terms(
    sigma: &Array2<f64>,
    a: &Array2<f64>,
    b: &Array2<f64>,
    x: ndarray::ArrayView2<f64>,
    y: ndarray::ArrayView2<f64>,
    mode: ContextMode,
) -> T3Terms {
    let n = x.ncols();
    let (keys, queries): (Vec<usize>, Vec<usize>) = match mode {
        ContextMode::SplitKeys => ((0..n.div_ceil(2)).collect(), (n.div_ceil(2)..n).collect()),
        _ => ((0..n).collect(), (0..n).collect()),
    };
    let self_pairs = mode != ContextMode::SplitKeys;
    let n_k = (if self_pairs { n - 1 } else { keys.len() }) as f64;
    let n_q = queries.len() as f64;
    let tr = (a.dot(sigma).dot(&a.t())).diag().sum();
    let mut limit = Vec::new();
    let (mut bias, mut pieces, mut rem) = (0.0, 0.0, 0.0);
    let mut h = vec![0.0; n];
    let mut k2 = 0.0;
    for &j in &queries {
        let q = x.column(j);
        let v = b.t().dot(&q);
        let mu = sigma.dot(&v);
        let s = v.dot(&mu);
        let amu = a.dot(&mu);
        let rj = &y.column(j) - &amu;
        let u = a.t().dot(&rj);
        limit.push(0.5 * rj.dot(&rj));
        let cross = rj.dot(&amu);
        let quad = 0.5 * (tr + amu.dot(&amu));
        let mut bj = s.exp() * (cross + quad) / n_k;
        let mut pj = s.exp() * (cross.abs() + quad) / n_k;
        let umu = u.dot(&mu);
        if mode == ContextMode::SelfIncluded {
            let own = (q.dot(&v) - s / 2.0).exp() * (u.dot(&q) - umu) / n as f64;
            bj -= own;
            pj += own.abs();
        }
        bias += bj / n_q;
        pieces += pj / n_q;
        rem += pj * 40.0 * (2.0 * s).exp() / n_k / n_q;
        for &i in &keys {
            if self_pairs && i == j {
                continue;
            }
            let xi = x.column(i);
            let k = -(xi.dot(&v) - s / 2.0).exp() * (u.dot(&xi) - umu);
            h[i] += k / n_q;
            k2 += k * k;
        }
    }
    let (_, se_limit) = mean_se(&limit);
    let hk: Vec<f64> = keys.iter().map(|&i| h[i]).collect();
    let (_, se_h) = mean_se(&hk);
    let pairs = n_q * n_k;
    T3Terms {
        bias,
        sd_limit: se_limit,
        sd_keys: se_h + (2.0 * k2 / pairs / pairs).sqrt(),
        sd_nonlinear: pieces / n_k.sqrt(),
        remainder: rem,
    }
}

proptest! {
    #![proptest_config(kappa_testkit::config(MC_CASES))]

    /// T1: X softmax(XᵀBᵀq) → ΣBᵀq, and its mean squared error over contexts of n keys is
    /// c₁/n + c₂/n² + O(n⁻³) with c₁ = e^{vᵀΣv}(tr Σ + ‖Σv‖²) (v = Bᵀq; the delta method for a
    /// self-normalised importance-sampling average, docs/convergence.md §T1). Claims: at
    /// n = 250 and 4000 the MSE matches the expansion, and 16× more keys divide it by
    /// pred(250)/pred(4000) ≈ 16. Tolerance: z standard errors of the replicate mean (z from
    /// [`z_for`], 3 comparisons per case) plus |c₂|/n² for the unmodelled O(n⁻³) remainder,
    /// plus the rounding of both sides ([`attention_replicate_rounding`],
    /// [`attention_mse_expansion`]).
    #[test]
    fn t1_attention_average_tends_to_sigma_b_q(seed in any::<u64>(), d in 2usize..6, kappa in 1.0f64..20.0) {
        let z = z_for(MC_CASES, 3);
        let mut r = rng(seed);
        let model = spec(d, 1, kappa, 1.0, 0.0).build(&mut r).unwrap();
        let sigma = model.sigma().clone();
        // A small key-query matrix keeps the softmax scale s = vᵀΣv ≤ 0.1 for every query, so
        // the expansion's terms fall by O(e^{2s}/n) per order and |c₂|/n² bounds the remainder.
        // The premise is enforced, not hoped for: B is scaled down when a query exceeds it.
        // (Found by exploring: `seed = 635884408443360971, d = 2, κ = 19.07` drew a query with
        // s ≫ 0.1 from the unscaled 0.1/√d·N(0, 1) matrix, where c₂/n² < −c₁/n and the
        // "prediction" at n = 250 was negative.)
        let mut b = gaussian(d, d, &mut r).unwrap() * (0.1 / (d as f64).sqrt());
        let ident = Array2::<f64>::eye(d);
        let queries = model.sample_covariates(8, &mut r).unwrap();
        let s_max = queries
            .columns()
            .into_iter()
            .map(|q| {
                let v = b.t().dot(&q);
                v.dot(&sigma.dot(&v))
            })
            .fold(0.0, f64::max);
        if s_max > 0.1 {
            b *= (0.1 / s_max).sqrt();
        }
        let limit = sigma.dot(&b.t()).dot(&queries);
        let mut stats = Vec::new();
        for &n in &[250usize, 4000] {
            // The queries share a context, so the context draws are the independent replicates.
            let mut rounding = 0.0;
            let reps: Vec<f64> = (0..T1_REPS).map(|_| {
                let context = model.sample_covariates(n, &mut r).unwrap();
                // A = I: the layer's output is the attention average itself.
                let out = attend(ident.view(), b.view(), context.view(), queries.view()).unwrap();
                let err = &out - &limit;
                rounding += attention_replicate_rounding(&sigma, &b, &context, &queries, &err) / T1_REPS as f64;
                err.iter().map(|e| e * e).sum::<f64>() / queries.ncols() as f64
            }).collect();
            let (mse, se) = mean_se(&reps);
            // The mean of the replicates adds γ_{r+1} relative (sum and division).
            let rounding = rounding + gamma(T1_REPS + 1) * mse;
            // σ̂'s own sampling error: its chi-square upper bound (2 estimates per case).
            let se = se * sd_upper_factor(T1_REPS, MC_CASES, 2);
            let (mut pred, mut rem, mut pred_abs, mut pred_err) = (0.0, 0.0, 0.0, 0.0);
            for q in queries.columns() {
                let ex = attention_mse_expansion(&sigma, &b, q);
                let nf = n as f64;
                pred += (ex.c1 / nf + ex.c2 / (nf * nf)) / queries.ncols() as f64;
                rem += (ex.c2 / (nf * nf)).abs() / queries.ncols() as f64;
                pred_abs += (ex.c1 / nf + (ex.c2 / (nf * nf)).abs()) / queries.ncols() as f64;
                pred_err += (ex.e1 / nf + ex.e2 / (nf * nf)) / queries.ncols() as f64;
            }
            // Rounding of both sides: the replicates' (rigorous, above) and the prediction's
            // (c₁, c₂'s bounds, then the divisions by n, n² and the mean over the queries:
            // γ_{n_q+4} of the absolute sum). Seeded: 6e-12 (n = 250) to 5e-10 (n = 4000) of the
            // mse — the γ_n of the keys' sum dominates — far below one standard error
            // (se/mse ≈ 5%); the former fixed 1e-9·mse was only 2× above it.
            let rounding = rounding + pred_err + gamma(queries.ncols() + 4) * pred_abs;
            let tol = z * se + rem + rounding;
            prop_assert!((mse - pred).abs() <= tol, "n = {n}: mse {mse:e} vs {pred:e} ± {tol:e} (se {se:e}, z {z:.2})");
            // Relative to the smaller side: the log of each of the four quantities moves by
            // ≤ rounding/(value − rounding) ≤ 1.01·rounding/value.
            stats.push((mse, se, pred, rem, 1.01 * rounding / mse.min(pred)));
        }
        // The ratio: log(mse₀/mse₁) has standard error √(rse₀² + rse₁²) (delta method); the
        // rounding of the four quantities, and ≤ 4u of the divisions and the logarithm.
        let (m0, s0, p0, r0, e0) = stats[0];
        let (m1, s1, p1, r1, e1) = stats[1];
        let gap = ((m0 / m1) / (p0 / p1)).ln().abs();
        let tol = z * ((s0 / m0).powi(2) + (s1 / m1).powi(2)).sqrt() + r0 / p0 + r1 / p1
            + 2.0 * (e0 + e1) + 4.0 * U;
        prop_assert!(gap <= tol, "mse ratio {} vs predicted {}: |Δ log| {gap} > {tol}", m0 / m1, p0 / p1);
    }

    /// T2: the closed form L = ½‖(AΣBᵀ−M)Σ^{1/2}‖² + ½kσ² matches a Monte Carlo of
    /// E½‖y − AΣBᵀx‖² over 4·10⁵ samples, within z standard errors of the mean (the sd of the
    /// per-sample losses, estimated from the sample; z from [`z_for`], 1 comparison per case).
    #[test]
    fn t2_population_loss_matches_monte_carlo(seed in any::<u64>(), d in 1usize..6, k in 1usize..4, noise in 0.0f64..0.5) {
        let z = z_for(MC_CASES, 1);
        let mut r = rng(seed);
        let model = spec(d, k, 5.0, 2.0, noise).build(&mut r).unwrap();
        let a = gaussian(k, d, &mut r).unwrap() * 0.7;
        let b = gaussian(d, d, &mut r).unwrap() * 0.7;
        let pop = model.population();
        let closed = pop.loss(a.view(), b.view()).unwrap();
        let n = 400_000;
        let s = model.sample(n, &mut r).unwrap();
        let pred = pop.limit_predict(a.view(), b.view(), s.x()).unwrap();
        let per_sample: Vec<f64> = (&s.y() - &pred).columns().into_iter().map(|c| 0.5 * c.dot(&c)).collect();
        let mc = per_sample.iter().sum::<f64>() / n as f64;
        let sd = (per_sample.iter().map(|v| (v - mc).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
            * sd_upper_factor(n, MC_CASES, 1);
        // Rounding: the sum of n positive terms has relative error ≤ n·u, each term ≤ 4(d+k)u;
        // both are below 1e-9 of the mean, < 1e-6 of the MC margin.
        let tol = z * sd / (n as f64).sqrt() + (n as f64 + 4.0 * (d + k) as f64) * U * (mc + closed);
        prop_assert!((mc - closed).abs() <= tol, "MC {mc} vs closed form {closed}, tolerance {tol} (z {z:.2})");
        // L − E is the constant ½kσ², up to the rounding of one addition (u·L).
        let gap = pop.loss(a.view(), b.view()).unwrap() - pop.excess(a.view(), b.view()).unwrap() - 0.5 * k as f64 * noise * noise;
        prop_assert!(gap.abs() <= 4.0 * U * closed, "L − E − ½kσ² = {gap:e}");
    }

    /// T3: L̂_n → L for moderate ‖B‖ in every context mode: at n = 4000, L̂ − L minus the
    /// derived O(1/n) softmax bias is within z standard deviations (docs/convergence.md §T3).
    #[test]
    fn t3_empirical_loss_tends_to_population_loss(seed in any::<u64>(), d in 2usize..5) {
        let mut r = rng(seed);
        let model = spec(d, 2, 5.0, 2.0, 0.3).build(&mut r).unwrap();
        let a = gaussian(2, d, &mut r).unwrap() * 0.5;
        let b = gaussian(d, d, &mut r).unwrap() * (0.2 / (d as f64).sqrt());
        let pop = model.population().loss(a.view(), b.view()).unwrap();
        let n = 4000;
        let sample = model.sample(n, &mut r).unwrap();
        let z = z_for(MC_CASES, 3);
        for mode in [ContextMode::SelfIncluded, ContextMode::SelfExcluded, ContextMode::SplitKeys] {
            let emp = EmpiricalProblem::new(&sample, mode).unwrap().loss(a.view(), b.view()).unwrap();
            let t = t3_terms(model.sigma(), &a, &b, sample.x(), sample.y(), mode);
            // The σ̂ of each term is an estimate from ≥ 2000 values: its chi-square upper bound.
            let f = sd_upper_factor(n / 2, MC_CASES, 3 * 3);
            let tol = z * f * (t.sd_limit + t.sd_keys + t.sd_nonlinear) + t.remainder
                + (n as f64 + 8.0) * U * (emp + pop);
            prop_assert!((emp - pop - t.bias).abs() <= tol, "{mode:?}: L̂ = {emp}, L = {pop}, bias {:e}, tolerance {tol:e} ({t:?})", t.bias);
        }
    }

    /// T4: E = 0 on S, and E is invariant under A → cA, B → B/c and (U,V) → (UG, G⁻¹V). Each
    /// equality is asserted to its rounding bound, derived below ([`excess_rounding`] is
    /// rigorous; the others go through eigensolvers and use the standard model [`C_SM`]).
    #[test]
    fn t4_excess_zero_on_s_and_invariant(seed in any::<u64>(), d in 1usize..7, k in 1usize..5, c in 0.1f64..10.0) {
        let mut r = rng(seed);
        let model = spec(d, k, 30.0, 3.0, 0.1).build(&mut r).unwrap();
        let pop = model.population();
        // A = M, B = Σ^{-1} is on S. The stored Σ^{-1} (two eigensolve-based factors Σ^{-1/2})
        // satisfies ‖ΣΣ^{-1}ᵀ − I‖₂ ≤ C_SM·2d·u·κ(Σ) (backward error of size d, amplified by κ,
        // for each factor), so the exact E there is ≤ ½(C_SM·2d·u·κ·‖M‖_F)²·λ_max(Σ); the
        // computed E adds its rounding.
        let oracle = Moments::oracle(&model).unwrap();
        let sigma_inv = oracle.sigma_hat_inv().clone();
        let e_s = pop.excess(model.m().view(), sigma_inv.view()).unwrap();
        let resid = C_SM * (2 * d) as f64 * U * oracle.condition() * frob(model.m());
        let tol_s = 0.5 * resid * resid * oracle.sigma_hat_max_eigenvalue()
            + excess_rounding(pop, model.m(), &sigma_inv, 0.0);
        prop_assert!(e_s <= tol_s, "E on S = {e_s:e} > {tol_s:e}");
        let a = gaussian(k, d, &mut r).unwrap();
        let b = gaussian(d, d, &mut r).unwrap();
        let e = pop.excess(a.view(), b.view()).unwrap();
        // (cA, B/c): the stored fl(cA), fl(B/c) are cA, B/c up to a relative u, and E at the exact
        // (cA, B/c) equals E(A, B); both computed values are within [`excess_rounding`].
        let (ac, bc) = (&a * c, &b / c);
        let scaled = pop.excess(ac.view(), bc.view()).unwrap();
        let tol_c = excess_rounding(pop, &a, &b, 0.0) + excess_rounding(pop, &ac, &bc, U);
        prop_assert!((scaled - e).abs() <= tol_c, "E {e} vs scaled {scaled}: {:e} > {tol_c:e}", (scaled - e).abs());
        // (U, V) → (UG, G⁻¹V) with G = I + 0.3·N: A → AΣ^{1/2}GΣ^{-1/2}, Bᵀ → Σ^{-1/2}G⁻¹Σ^{1/2}Bᵀ.
        let (u, v) = oracle.whiten(a.view(), b.view()).unwrap();
        let g = Array2::<f64>::eye(d) + gaussian(d, d, &mut r).unwrap() * (0.3 / (d as f64).sqrt());
        let g_inv = Moments::from_parts(g.t().dot(&g), Array2::zeros((1, d)), 1).unwrap().sigma_hat_inv().dot(&g.t());
        let (a2, b2) = oracle.unwhiten(u.dot(&g).view(), g_inv.dot(&v).view()).unwrap();
        let moved = pop.excess(a2.view(), b2.view()).unwrap();
        // The stored product A₂ΣB₂ᵀ = UG·(Σ^{-1/2}ΣΣ^{-1/2})·G⁻¹V·(Σ^{1/2}Σ^{-1/2})… differs from AΣBᵀ
        // by the near-identities Σ^{∓1/2}Σ^{±1/2}… (backward errors of size d times κ(Σ)) and
        // G·G⁻¹ (G⁻¹ = (GᵀG)⁻¹Gᵀ: size d times κ(GᵀG) = κ(G)²), and by the products' γ_d errors,
        // all relative to the norms of the chain's factors ‖U‖_F‖G‖₂‖G⁻¹‖₂‖V‖_F‖Σ^{-1/2}‖₂:
        // ‖δF‖_F ≤ C_SM·4d·u·(κ(Σ) + κ(G)²)·that. Then |ΔE| ≤ √(2E)·‖δF‖_F·√λ_max + ½‖δF‖²λ_max
        // plus both evaluations' rounding.
        let sv = kappa_linalg::singular_values(g.view(), kappa_linalg::SvdDriver::default()).unwrap();
        let kappa_g = sv[0] / sv[d - 1];
        let chain = frob(&u) * sv[0] / sv[d - 1] * frob(&v) * inv_half_norm(&oracle);
        let df = C_SM * (4 * d) as f64 * U * (oracle.condition() + kappa_g * kappa_g) * chain;
        let lmax = oracle.sigma_hat_max_eigenvalue();
        let tol_g = (2.0 * e).sqrt() * df * lmax.sqrt() + 0.5 * df * df * lmax
            + excess_rounding(pop, &a, &b, 0.0) + excess_rounding(pop, &a2, &b2, 0.0);
        prop_assert!((moved - e).abs() <= tol_g, "E {e} vs {moved}: {:e} > {tol_g:e}", (moved - e).abs());
    }

    /// T5: the spectral initialization satisfies A₀Σ̂B₀ᵀ = M̂ and U₀ᵀU₀ = V₀V₀ᵀ up to rounding
    /// (Σ̂ geometry), for any W with orthonormal rows. Bounds: [`init_product_bound`] and
    /// [`init_gap_bound`] (standard model, sizes and κ(Σ̂) as derived there).
    #[test]
    fn t5_spectral_init_identities(seed in any::<u64>(), d in 1usize..9, k in 1usize..6, n_extra in 0usize..200) {
        let mut r = rng(seed);
        let model = spec(d, k, 50.0, 4.0, 0.2).build(&mut r).unwrap();
        let sample = model.sample(d + 2 + n_extra, &mut r).unwrap();
        let mo = Moments::estimate(&sample).unwrap();
        let rank = k.min(d);
        let w = haar_orthonormal(rank, d, &mut r).unwrap();
        // W's rows are orthonormal up to its own rounding (size d): the init with W is the exact
        // one for a W' within C_SM·d·u of it, which moves U₀V₀ by ≤ that relative — inside
        // init_product_bound's 2(d + k) sizes.
        for (a0, b0) in [spectral_init(&mo).unwrap(), spectral_init_with(&mo, w.view()).unwrap()] {
            let product = a0.dot(mo.sigma_hat()).dot(&b0.t());
            let tol = init_product_bound(&mo);
            prop_assert!(max_abs(&(&product - mo.m_hat())) <= tol, "‖A₀Σ̂B₀ᵀ − M̂‖ = {} > {tol:e}", max_abs(&(&product - mo.m_hat())));
            let (u, v) = mo.whiten(a0.view(), b0.view()).unwrap();
            let gap = u.t().dot(&u) - v.dot(&v.t());
            let tol = init_gap_bound(&mo);
            prop_assert!(frob(&gap) <= tol, "balance gap {} > {tol:e}", frob(&gap));
        }
    }

    /// T6: R = 0 and ∇Q = 0 at every point of S* (oracle moments, any Stiefel W), up to the
    /// rounding of the init: with δF = [`init_product_bound`] (the whitened residual
    /// ‖(A₀ΣB₀ᵀ − M)Σ^{1/2}‖ ≤ δF·√λ_max =: e_F) and the gap bound g = [`init_gap_bound`],
    /// E ≤ ½e_F²(1 + 2dγ_d), R = (λ/4)‖D‖² ≤ (λ/4)g², and ‖∇Q‖ (whitened: ∇_U = (UV − T)Vᵀ + λUD,
    /// ∇_V = Uᵀ(UV − T) − λDV) ≤ (e_F + λg)(‖U‖_F + ‖V‖_F); the gradient's own products err
    /// relative to it by ≤ C_SM·6d·u·κ(Σ)² (the Σ-factors of FΣBΣΣ^{-1/2}), a factor 1 + that.
    #[test]
    fn t6_balanced_minimisers_are_stationary(seed in any::<u64>(), d in 1usize..8, k in 1usize..6, lambda in 0.0f64..2.0) {
        let mut r = rng(seed);
        let model = spec(d, k, 20.0, 3.0, 0.1).build(&mut r).unwrap();
        let oracle = Moments::oracle(&model).unwrap();
        let w = haar_orthonormal(k.min(d), d, &mut r).unwrap();
        let (a, b) = spectral_init_with(&oracle, w.view()).unwrap();
        let settings = Settings { lambda, ..Settings::algorithm() };
        let (u, v) = oracle.whiten(a.view(), b.view()).unwrap();
        let mut descent = Descent::new(Objective::Population(model.population().clone()), &oracle, a, b, settings).unwrap()
            .with_truth(Truth { population: model.population().clone(), probe: None });
        let rec = descent.record().unwrap();
        let e_f = init_product_bound(&oracle) * oracle.sigma_hat_max_eigenvalue().sqrt();
        let g = init_gap_bound(&oracle);
        let tol_e = 0.5 * e_f * e_f * (1.0 + 2.0 * d as f64 * gamma(d));
        let tol_r = 0.25 * lambda * g * g;
        prop_assert!(rec.regularizer <= tol_r && rec.excess.unwrap() <= tol_e, "R {} (≤ {tol_r:e}), E {:?} (≤ {tol_e:e})", rec.regularizer, rec.excess);
        let kappa = oracle.condition();
        let tol_g = (e_f + lambda * g) * (frob(&u) + frob(&v)) * (1.0 + C_SM * (6 * d) as f64 * U * kappa * kappa);
        prop_assert!(rec.grad_norm <= tol_g, "‖∇Q‖ = {} > {tol_g:e}", rec.grad_norm);
    }

    /// T9: the spectral-initialization excess scales like 1/n: the log-log slope of its mean
    /// over n ∈ {250, …, 4000} lies in [−1.3, −0.7] (the claim's band, docs/convergence.md §T9).
    /// Tolerance: the Monte Carlo slope may leave the band by z standard errors, its standard
    /// error propagated from the per-n replicate means (192 draws each) by the delta method,
    /// plus the Jensen bias of log(mean).
    #[test]
    fn t9_initialization_excess_scales_like_one_over_n(seed in any::<u64>(), d in 2usize..6, k in 1usize..4) {
        let z = z_for(MC_CASES, 1);
        let mut r = rng(seed);
        let model = spec(d, k, 10.0, 2.0, 0.1).build(&mut r).unwrap();
        let ns = [250usize, 500, 1000, 2000, 4000];
        let mut points = Vec::new();
        let mut rse = Vec::new();
        for &n in &ns {
            let draws: Vec<f64> = (0..T9_REPS).map(|_| {
                let mo = Moments::estimate(&model.sample(n, &mut r).unwrap()).unwrap();
                let (a0, b0) = spectral_init(&mo).unwrap();
                model.population().excess(a0.view(), b0.view()).unwrap()
            }).collect();
            let (m, se) = mean_se(&draws);
            // σ̂'s chi-square upper bound (5 estimates per case).
            let se = se * sd_upper_factor(T9_REPS, MC_CASES, 5);
            points.push((n as f64, m));
            rse.push(se / m);
        }
        let slope = loglog_slope(&points);
        // slope = Σ cᵢ log mᵢ with cᵢ = (xᵢ − x̄)/Σ(xⱼ − x̄)², xᵢ = log nᵢ; var(log mᵢ) ≈ rseᵢ²
        // and E log mᵢ ≈ log E − rseᵢ²/2.
        let x: Vec<f64> = ns.iter().map(|&n| (n as f64).ln()).collect();
        let xm = x.iter().sum::<f64>() / x.len() as f64;
        let sxx: f64 = x.iter().map(|v| (v - xm).powi(2)).sum();
        let c: Vec<f64> = x.iter().map(|v| (v - xm) / sxx).collect();
        let se: f64 = c.iter().zip(&rse).map(|(c, s)| (c * s).powi(2)).sum::<f64>().sqrt();
        let jensen: f64 = c.iter().zip(&rse).map(|(c, s)| c.abs() * s * s / 2.0).sum();
        let margin = z * se + jensen;
        prop_assert!((-1.3 - margin..=-0.7 + margin).contains(&slope), "slope {slope} (se {se:.3}, margin {margin:.3}), points {points:?}");
    }
    /// T10 (population and regularizer): the closed-form (preconditioned) direction of the GD
    /// rule, with the preconditioner undone, matches central differences of Q = L + R entry by
    /// entry, within the standard finite-difference error model, every term computed here:
    /// truncation h²|f‴|/6 — exact, since along one coordinate L is quadratic and R quartic,
    /// so the central difference of the quartic is f′ + h²f‴/6 with f‴ = 3λ⟨D₁, D₂⟩
    /// (D(t) = D + tD₁ + t²D₂) — plus roundoff (ε₊ + ε₋)/(2h), ε the rounding bound of Q
    /// ([`excess_rounding`] and the same elementwise bound for R), plus the shift of the centre
    /// by the rounding of a ± h (|f″|·u(|a| + h), f″ from the second difference, plus its own
    /// roundoff), plus the closed form's rounding γ_n·|chain| (elementwise, n the chain's total
    /// inner size; the preconditioner's round trip Σ̂⁻¹·Σ̂ enters through |Σ̂||Σ̂⁻¹|). The
    /// realized step fl(a + h) − fl(a − h) is the divisor ([`central_difference`]). h minimizes
    /// h²|f‴|/6 + ε/h ([`optimal_step`]).
    #[test]
    fn t10_population_and_regularizer_gradients(seed in any::<u64>(), d in 1usize..6, k in 1usize..4, lambda in 0.0f64..2.0, pre in any::<bool>()) {
        let mut r = rng(seed);
        let model = spec(d, k, 10.0, 2.0, 0.1).build(&mut r).unwrap();
        let mo = Moments::estimate(&model.sample(10 * d + 20, &mut r).unwrap()).unwrap();
        let a = gaussian(k, d, &mut r).unwrap() * 0.6;
        let b = gaussian(d, d, &mut r).unwrap() * 0.6;
        let pop = model.population().clone();
        let (sh, hh) = (mo.sigma_hat(), mo.sigma_hat_half());
        let dmat = |a: &Array2<f64>, b: &Array2<f64>| -> Array2<f64> {
            let c = a.t().dot(a) - b.t().dot(sh).dot(b);
            hh.dot(&c).dot(hh)
        };
        let q = |a: &Array2<f64>, b: &Array2<f64>| -> f64 {
            pop.loss(a.view(), b.view()).unwrap() + 0.25 * lambda * frob(&dmat(a, b)).powi(2)
        };
        // C_abs = |A|ᵀ|A| + |B|ᵀ|Σ̂||B|, the absolute version of C = AᵀA − BᵀΣ̂B.
        let c_abs = |a: &Array2<f64>, b: &Array2<f64>| abs(a).t().dot(&abs(a)) + abs(b).t().dot(&abs(sh)).dot(&abs(b));
        // Rounding of Q: E's rigorous bound, the noise floor's addition (u·L), and R's: with
        // D̂ within δD = γ_{3d+1}|H|C_abs|H| (H = Σ̂^{1/2}; chain sizes d + 2d, one subtraction),
        // |R̂ − R| ≤ (λ/4)(2Σ|D̂|δD + ΣδD² + γ_{d²+2}‖D̂‖²).
        let q_err = |a: &Array2<f64>, b: &Array2<f64>| -> f64 {
            let dm = dmat(a, b);
            let dd = abs(hh).dot(&c_abs(a, b)).dot(&abs(hh)) * gamma(3 * d + 1);
            let r_err = 0.25 * lambda * (2.0 * (abs(&dm) * &dd).sum() + dd.iter().map(|x| x * x).sum::<f64>() + gamma(d * d + 2) * frob(&dm).powi(2));
            excess_rounding(&pop, a, b, 0.0) + U * q(a, b) + r_err
        };
        let settings = Settings { preconditioner: pre, lambda, renormalization: Renormalization::None, ..Settings::algorithm() };
        let step = pgd_step(&Objective::Population(pop.clone()), &mo, a.view(), b.view(), &settings).unwrap();
        let (mut da, mut db) = step.direction.clone();
        // Rounding of the closed form, elementwise: ∇_A L = FΣBΣ (F within |A||Σ||Bᵀ| + |M|),
        // ∇_A R = λAΣ̂CΣ̂, ∇_B L = ΣFᵀAΣ, ∇_B R = −λΣ̂BΣ̂CΣ̂; with the preconditioner the
        // direction is ∇_A L·Σ̂⁻¹ + λAΣ̂C and Σ̂⁻¹∇_B LΣ̂⁻¹ − λBΣ̂C, undone here by Σ̂ (·Σ̂, Σ̂·Σ̂).
        // Chain sizes ≤ 10d + 4, plus C_SM·2d for the eigensolve backward error of H² = Σ̂.
        let (sa, ss, sb) = (abs(pop.sigma()), abs(sh), abs(&b));
        let f_abs = abs(&a).dot(&sa).dot(&sb.t()) + abs(pop.m());
        let reg = c_abs(&a, &b);
        let n_chain = 10 * d + 4 + (C_SM * (2 * d) as f64).ceil() as usize;
        let (ea, eb) = if pre {
            let round = ss.dot(&abs(mo.sigma_hat_inv()));
            let ga = f_abs.dot(&sa).dot(&sb).dot(&sa).dot(&round.t()) + abs(&a).dot(&ss).dot(&reg).dot(&ss) * lambda;
            let gb = round.dot(&sa).dot(&f_abs.t()).dot(&abs(&a)).dot(&sa).dot(&round.t()) + ss.dot(&sb).dot(&ss).dot(&reg).dot(&ss) * lambda;
            da = da.dot(sh);
            db = sh.dot(&db).dot(sh);
            (ga * gamma(n_chain), gb * gamma(n_chain))
        } else {
            let ga = f_abs.dot(&sa).dot(&sb).dot(&sa) + abs(&a).dot(&ss).dot(&reg).dot(&ss) * lambda;
            let gb = sa.dot(&f_abs.t()).dot(&abs(&a)).dot(&sa) + ss.dot(&sb).dot(&ss).dot(&reg).dot(&ss) * lambda;
            (ga * gamma(n_chain), gb * gamma(n_chain))
        };
        let (q0, e0) = (q(&a, &b), q_err(&a, &b));
        // One coordinate: (A or B, i, j).
        let check = |is_a: bool, i: usize, j: usize| -> Result<(), String> {
            let mut e = Array2::<f64>::zeros(if is_a { (k, d) } else { (d, d) });
            e[[i, j]] = 1.0;
            // D₁, D₂ of D(t) along the coordinate, and f‴ = 3λ⟨D₁, D₂⟩.
            let (c1, c2) = if is_a {
                (a.t().dot(&e) + e.t().dot(&a), e.t().dot(&e))
            } else {
                let sbe = b.t().dot(sh).dot(&e);
                (-(&sbe + &sbe.t()), -e.t().dot(sh).dot(&e))
            };
            let f3 = 3.0 * lambda * (hh.dot(&c1).dot(hh) * hh.dot(&c2).dot(hh)).sum().abs();
            let h = optimal_step(e0, f3);
            let x = if is_a { a[[i, j]] } else { b[[i, j]] };
            let (fd, tol) = central_difference(x, h, (q0, e0), f3, |xv| {
                let (mut ap, mut bp) = (a.clone(), b.clone());
                if is_a { ap[[i, j]] = xv } else { bp[[i, j]] = xv }
                (q(&ap, &bp), q_err(&ap, &bp))
            });
            let tol = tol + if is_a { ea[[i, j]] } else { eb[[i, j]] };
            let g = if is_a { da[[i, j]] } else { db[[i, j]] };
            if (fd - g).abs() <= tol { Ok(()) } else {
                Err(format!("{} [{i},{j}]: fd {fd:e} vs {g:e}: {:e} > {tol:e} (h {h:e})", if is_a { "A" } else { "B" }, (fd - g).abs()))
            }
        };
        for i in 0..k { for j in 0..d { check(true, i, j).map_err(TestCaseError::fail)?; } }
        for i in 0..d { for j in 0..d { check(false, i, j).map_err(TestCaseError::fail)?; } }
    }

    /// T10 (finite-context layer): the vectorized, chunked gradients of L̂_n match central
    /// differences in every context mode, across chunk boundaries and for several prompts,
    /// entry by entry within the finite-difference error model of [`central_difference`]: f‴ = 0
    /// along A (L̂ is quadratic in A), the softmax-cumulant bound of [`layer_rounding`] along B;
    /// ε, the rigorous rounding bound of L̂, and the closed form's rounding from
    /// [`layer_rounding`]; h from [`optimal_step`]. Two chunkings sum the same per-query terms
    /// (each computed identically) in different orders: each is within γ_{N−1}·Σ|terms| of the
    /// exact sum, and the scaling by fl(1/N) adds 2u, so they differ by ≤ 2γ_{N+1}·L̂.
    #[test]
    fn t10_empirical_gradients(seed in any::<u64>(), d in 1usize..5, k in 1usize..4, n in 3usize..60, chunk in 1usize..9) {
        let mut r = rng(seed);
        let model = spec(d, k, 10.0, 2.0, 0.2).build(&mut r).unwrap();
        let prompts = [model.sample(n, &mut r).unwrap(), model.sample(n + 3, &mut r).unwrap()];
        let a = gaussian(k, d, &mut r).unwrap() * 0.6;
        let b = gaussian(d, d, &mut r).unwrap() * 0.6;
        for mode in [ContextMode::SelfIncluded, ContextMode::SelfExcluded, ContextMode::SplitKeys] {
            let problem = EmpiricalProblem::from_prompts(&prompts, mode).unwrap().with_query_chunk(chunk).unwrap();
            let lg = problem.loss_grad(a.view(), b.view()).unwrap();
            let round = layer_rounding(&prompts, mode, &a, &b);
            let f0 = (lg.loss, round.loss);
            let eval = |ap: &Array2<f64>, bp: &Array2<f64>| {
                (problem.loss(ap.view(), bp.view()).unwrap(), layer_rounding(&prompts, mode, ap, bp).loss)
            };
            for is_a in [true, false] {
                let rows = if is_a { k } else { d };
                for i in 0..rows { for j in 0..d {
                    let f3 = if is_a { 0.0 } else { round.f3_b[[i, j]] };
                    let h = optimal_step(round.loss, f3);
                    let x = if is_a { a[[i, j]] } else { b[[i, j]] };
                    let (fd, tol) = central_difference(x, h, f0, f3, |xv| {
                        let (mut ap, mut bp) = (a.clone(), b.clone());
                        if is_a { ap[[i, j]] = xv } else { bp[[i, j]] = xv }
                        eval(&ap, &bp)
                    });
                    let (g, eg) = if is_a { (lg.grad_a[[i, j]], round.grad_a[[i, j]]) } else { (lg.grad_b[[i, j]], round.grad_b[[i, j]]) };
                    let tol = tol + eg;
                    prop_assert!((fd - g).abs() <= tol, "{mode:?} {} [{i},{j}]: fd {fd:e} vs {g:e}: {:e} > {tol:e} (h {h:e})", if is_a { "A" } else { "B" }, (fd - g).abs());
                }}
            }
            let whole = EmpiricalProblem::from_prompts(&prompts, mode).unwrap().with_query_chunk(1000).unwrap().loss_grad(a.view(), b.view()).unwrap();
            let tol = 2.0 * gamma(problem.num_queries() + 1) * lg.loss.max(whole.loss);
            prop_assert!((whole.loss - lg.loss).abs() <= tol, "{mode:?}: chunked {:e} vs whole {:e}: {:e} > {tol:e}", lg.loss, whole.loss, (whole.loss - lg.loss).abs());
        }
    }
}

proptest! {
    #![proptest_config(kappa_testkit::config(3))]

    /// T8 (docs/convergence.md §"Exact invariances", §T8). With the Σ̂-preconditioner the
    /// population trajectory E_t does not depend on κ(Σ) beyond a rotation of the spectral
    /// initialization: (i) with oracle moments (Σ̂ = Σ) E_t is the same for κ(Σ) = 1 and 100;
    /// (ii) with a finite-sample Σ̂, the κ(Σ) = 100 run equals the κ(Σ) = 1 run (same draws) started
    /// from W = Q_R, the polar factor of Σ̂^{-1/2}Σ^{1/2}. Both up to the rounding bound of
    /// [`rounding_tolerance`]. Plain GD in (A, B) slows down as κ(Σ) grows.
    #[test]
    fn t8_preconditioner_removes_kappa_sigma(seed in any::<u64>(), d in 2usize..6) {
        let case = T8Case::new(seed, d);
        case.check_invariances().map_err(TestCaseError::fail)?;
        let mu_plain: Vec<f64> = case.runs.iter().map(|(model, mo)| {
            let (a0, b0) = spectral_init(mo).unwrap();
            fitted_mu(&excess_trace(model, mo, a0, b0, false, T8_STEPS))
        }).collect();
        // Without the preconditioner the smallest curvature falls like λ_min(Σ) while the step
        // η = c/(σ₁(T̂)·λ_max(Σ̂)²) falls like 1/λ_max², so the asymptotic 1 − μ shrinks like
        // κ(Σ)^{-1} or faster (100× here); the fitted window also holds the faster transient,
        // so the test asks for 10× (seeded runs over 96 cases: at least 19×). This 10× is the
        // claim's level (docs/convergence.md §Rounding tolerances), not a rounding tolerance:
        // rounding moves each fitted μ by < 1e-6 (the T8 bound), far below the margin.
        prop_assert!((1.0 - mu_plain[1]) < 0.1 * (1.0 - mu_plain[0]), "plain μ: {mu_plain:?}");
    }

    /// T11: with renormalization ‖B_t‖ stays bounded from an imbalanced init (large B, small A,
    /// same product); without it, ‖B_t‖ stays large and the finite-context excess is larger.
    #[test]
    fn t11_renormalization_bounds_the_softmax_scale(seed in any::<u64>()) {
        let d = 3;
        let mut r = rng(seed);
        let model = spec(d, d, 4.0, 2.0, 0.1).build(&mut r).unwrap();
        let sample = model.sample(1500, &mut r).unwrap();
        let test = model.sample_covariates(1000, &mut r).unwrap();
        let mo = Moments::estimate(&sample).unwrap();
        let (a0, b0) = spectral_init(&mo).unwrap();
        let balanced_b = frob(&b0);
        let c = 4.0;
        let (ai, bi) = (&a0 / c, &b0 * c);
        let problem = EmpiricalProblem::new(&sample, ContextMode::SelfExcluded).unwrap();
        let mut out = Vec::new();
        for renorm in [Renormalization::Balance, Renormalization::None] {
            let settings = Settings { renormalization: renorm, lambda: 0.0, ..Settings::algorithm() };
            let truth = Truth { population: model.population().clone(), probe: Some(Probe { context: sample.x().to_owned(), queries: test.clone(), every: 1000 }) };
            let mut descent = Descent::new(Objective::Empirical(problem.clone()), &mo, ai.clone(), bi.clone(), settings).unwrap().with_truth(truth);
            match descent.run(15) {
                Ok(recs) => {
                    let max_b = recs.iter().skip(1).map(|r| r.b_norm).fold(0.0, f64::max);
                    out.push((max_b, recs.last().unwrap().finite_excess.unwrap()));
                }
                Err(OptimError::Diverged { .. }) => out.push((f64::INFINITY, f64::INFINITY)),
                Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
            }
        }
        prop_assert!(out[0].0 < 2.0 * balanced_b, "with renormalization max ‖B‖ = {} vs balanced {balanced_b}", out[0].0);
        prop_assert!(out[1].0 > 2.0 * balanced_b, "without: max ‖B‖ = {}", out[1].0);
        prop_assert!(out[1].1 > out[0].1, "finite-context excess with {} vs without {}", out[0].1, out[1].1);
    }
}

/// The fitted μ of a population run's tail: the window 1e-13·E₀ < E_t < 1e-3·E₀ where the
/// slowest mode dominates. Also checks that the run is geometric (R² > 0.95, μ < 0.95) and
/// that E falls below 1e-12·E₀.
fn t7_tail_mu(
    model: &DataModel,
    mo: &Moments,
    a0: Array2<f64>,
    b0: Array2<f64>,
) -> Result<f64, TestCaseError> {
    let mut descent = Descent::new(
        Objective::Population(model.population().clone()),
        mo,
        a0,
        b0,
        Settings::algorithm(),
    )
    .unwrap()
    .with_truth(Truth {
        population: model.population().clone(),
        probe: None,
    });
    let recs = descent.run(120).unwrap();
    let e0 = recs[0].excess.unwrap();
    let pts: Vec<(f64, f64)> = recs
        .iter()
        .map(|r| (r.step as f64, r.excess.unwrap()))
        .filter(|p| p.1 > 1e-13 * e0 && p.1 < 1e-3 * e0 && p.1 > 1e-28)
        .collect();
    prop_assert!(
        pts.len() >= 8,
        "too few points above the floor: {}",
        pts.len()
    );
    let fit = geometric_rate(&pts).unwrap();
    prop_assert!(fit.mu < 0.95 && fit.r_squared > 0.95, "fit {fit:?}");
    prop_assert!(recs.last().unwrap().excess.unwrap() < 1e-12 * e0);
    Ok(fit.mu)
}

/// ℓ_r = log(1 − μ_r) for `reps` initialization samples of n = 800·d (every run checked
/// by [`t7_tail_mu`]).
fn t7_log_gaps(
    seed: u64,
    d: usize,
    kappa_sigma: f64,
    reps: usize,
) -> Result<Vec<f64>, TestCaseError> {
    let mut r = rng(seed);
    let model = spec(d, d, kappa_sigma, 2.0, 0.0).build(&mut r).unwrap();
    let mut logs = Vec::new();
    for rep in 0..reps as u64 {
        let mut r = rng(seed ^ (rep + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mo = Moments::estimate(&model.sample(800 * d, &mut r).unwrap()).unwrap();
        let (a0, b0) = spectral_init(&mo).unwrap();
        logs.push((1.0 - t7_tail_mu(&model, &mo, a0, b0)?).ln());
    }
    Ok(logs)
}

/// T7's finding (docs/convergence.md §T7), found by the derived tolerance on the default seed:
/// at d = 2 "two initialization samples give 1 − μ within a factor 2" does not hold at the
/// 1e-6 level. Every run converges geometrically, but ℓ = log(1 − μ) has sd 0.108 over the 16
/// samples (one sample at ℓ = −0.69 against a median of −0.99), so z·√2·σ̂ = 0.80 > log 2.
#[test]
fn t7_finding_seed_9606333741433739516_d2() {
    let logs = t7_log_gaps(9606333741433739516, 2, 96.7596884790537, T7_FINDING_REPS).unwrap();
    let (_, se) = mean_se(&logs);
    let sd = se * (T7_FINDING_REPS as f64).sqrt();
    assert!((sd - 0.1084).abs() < 1e-3, "sd {sd}");
    // At the old criterion's claim level (z_for at the default 6 cases: 2Q(z) = 1e-6/6).
    let z = z_two_sided(FALSE_ALARM / f64::from(T7_CASES));
    assert!(z * std::f64::consts::SQRT_2 * sd > std::f64::consts::LN_2);
}

/// T7's second finding, from an exploring run: at d = 3, κ(Σ) = 1 the spread of ℓ = log(1 − μ)
/// over initialization samples is too wide for the former claim level (≈ 1e-7 per pair, the
/// z of 16× the default cases), but within the stated claim level [`T7_CLAIM`].
#[test]
fn t7_finding_seed_3873230153869609371_d3() {
    let logs = t7_log_gaps(3873230153869609371, 3, 1.0, T7_REPS).unwrap();
    let (_, se) = mean_se(&logs);
    let sd = se * (T7_REPS as f64).sqrt();
    // The exploring run's criterion: z and the σ bound at 16× the default cases.
    let explored = 16 * T7_CASES;
    let old_z = z_two_sided(FALSE_ALARM / f64::from(explored));
    let old_sd_up = sd_upper_factor(T7_REPS, explored, 1) * sd;
    assert!(
        old_z * std::f64::consts::SQRT_2 * old_sd_up > std::f64::consts::LN_2,
        "sd {sd}"
    );
    let sd_up = sd_upper_factor(T7_REPS, T7_CASES, 1) * sd;
    assert!(z_two_sided(T7_CLAIM) * std::f64::consts::SQRT_2 * sd_up <= std::f64::consts::LN_2);
}

proptest! {
    #![proptest_config(kappa_testkit::config(T7_CASES))]

    /// T7: preconditioned GD on the population Q from the spectral init converges
    /// geometrically (every run: log E_t linear in t with R² > 0.95, μ < 0.95, E falls 1e12×),
    /// and 1 − μ is stable across initialization samples: two independent samples give 1 − μ
    /// within a factor 2. The second claim is about a random quantity, so it is tested on its
    /// distribution (docs/convergence.md §T7): with ℓ = log(1 − μ) of sd σ, two independent
    /// draws differ by N(0, 2σ²), so the claim "except with probability [`T7_CLAIM`]" holds iff
    /// z_c·√2·σ ≤ log 2, 2Q(z_c) = T7_CLAIM. σ is bounded above from 128 samples by the
    /// chi-square factor of [`sd_upper_factor`] at the family-wise false-alarm rate. Samples
    /// have n = 800·d. d = 2 is the finding of [`t7_finding_seed_9606333741433739516_d2`]; at
    /// the old claim level (≈ 1e-7 per pair) d = 3 fails too (exploring: σ̂ = 0.089 at
    /// `seed = 3873230153869609371, κ(Σ) = 1`), so the claim is asserted at 1e-3, d ∈ 3..=6.
    #[test]
    fn t7_geometric_convergence_on_population(seed in any::<u64>(), d in 3usize..7, kappa_sigma in 1.0f64..100.0) {
        let z = z_two_sided(T7_CLAIM);
        let logs = t7_log_gaps(seed, d, kappa_sigma, T7_REPS)?;
        let (_, se) = mean_se(&logs);
        let sd = se * (T7_REPS as f64).sqrt();
        // σ ≤ f·σ̂ at the family-wise false-alarm rate (chi-square, one estimate per case).
        let sd_up = sd_upper_factor(T7_REPS, T7_CASES, 1) * sd;
        // Rounding moves each fitted μ by < 1e-6 (the T8 bound over this window), far below σ̂.
        prop_assert!(z * std::f64::consts::SQRT_2 * sd_up + 1e-6 <= std::f64::consts::LN_2, "log(1 − μ) over samples: sd {sd:.4} (upper {sd_up:.4}), z {z:.2}: {logs:?}");
    }
}

/// Steps of every T8 run.
const T8_STEPS: usize = 300;

/// E_t of the algorithm (or plain GD) on the population objective, t = 0..=steps.
fn excess_trace(
    model: &DataModel,
    mo: &Moments,
    a0: Array2<f64>,
    b0: Array2<f64>,
    pre: bool,
    steps: usize,
) -> Vec<f64> {
    let settings = Settings {
        preconditioner: pre,
        ..Settings::algorithm()
    };
    let mut descent = Descent::new(
        Objective::Population(model.population().clone()),
        mo,
        a0,
        b0,
        settings,
    )
    .unwrap()
    .with_truth(Truth {
        population: model.population().clone(),
        probe: None,
    });
    descent
        .run(steps)
        .unwrap()
        .iter()
        .map(|r| r.excess.unwrap())
        .collect()
}

/// The points of the T8 fit: steps 3.. with E_t > 1e-13·E₀ (above the rounding floor).
fn fit_window(e: &[f64]) -> Vec<(f64, f64)> {
    e.iter()
        .enumerate()
        .skip(3)
        .map(|(t, &v)| (t as f64, v))
        .filter(|p| p.1 > 1e-13 * e[0] && p.1 > 1e-28)
        .collect()
}

fn fitted_mu(e: &[f64]) -> f64 {
    geometric_rate(&fit_window(e)).unwrap().mu
}

/// The rounding tolerance on |log E_t − log E'_t| for two runs that agree in exact arithmetic.
///
/// Every step forms products through Σ̂^{±1/2} (condition κ(Σ̂)^{1/2} each), so by the standard
/// model of floating-point matrix products one step perturbs the whitened iterate θ = (U, V) by
/// at most about d·κ(Σ̂)·u·‖θ‖ (u = 2⁻⁵³); the iteration does not amplify these errors along
/// the normal directions (it contracts) and E is flat along the minimiser orbit, so after t
/// steps ‖δθ‖ ≤ (t₀ + t)·d·κ·u·‖θ‖, where t₀ = 10 counts the operations that build the two
/// starting points (Σ̂ = XXᵀ/n, Σ̂^{±1/2}, T̂, its SVD, Q_R, the init products), each with the
/// same backward error. With dist_t ≈ √E_t the relative error of E_t is ≈ 2‖δθ‖/dist_t, and
/// ‖θ‖/dist_t ∝ √(E₀/E_t), hence ε_t = C·(t₀ + t)·d·κ·u·√(E₀/E_t). C = 4 is more than ten times
/// the largest constant measured (0.3 over 96 seeded cases, 0.25 at t = 3 in the exploring run's
/// counterexample to the first form, which had no t₀): the constant of the standard model,
/// checked, not tuned.
fn rounding_tolerance(t: usize, d: usize, kappa: f64, e0: f64, e_t: f64) -> f64 {
    C_SM * ((10 + t) * d) as f64 * kappa * U * (e0 / e_t).sqrt()
}

/// Checks that two traces agree within [`rounding_tolerance`] over the fit window, and returns
/// the bound this implies on their fitted μ: the least-squares slope moves by at most
/// Σ|t − t̄|ε_t / Σ(t − t̄)², and μ = e^{slope}.
fn same_trajectory(a: &[f64], b: &[f64], d: usize, kappa: f64) -> Result<f64, String> {
    let window = fit_window(b);
    let mut eps = Vec::new();
    for &(t, eb) in &window {
        let ea = a[t as usize];
        let tol = rounding_tolerance(t as usize, d, kappa, b[0], eb);
        let gap = (ea / eb).ln().abs();
        if gap.is_nan() || gap > tol {
            return Err(format!(
                "step {t}: E = {ea:e} vs {eb:e}, |Δ log E| = {gap:e} > {tol:e}"
            ));
        }
        eps.push((t, tol));
    }
    let tm = eps.iter().map(|p| p.0).sum::<f64>() / eps.len() as f64;
    let stt: f64 = eps.iter().map(|p| (p.0 - tm).powi(2)).sum();
    let num: f64 = eps.iter().map(|p| (p.0 - tm).abs() * p.1).sum();
    Ok(num / stt)
}

/// One T8 problem at κ(Σ) = 1 and 100 with the same draws: the same T and the same whitened
/// sample S = Σ^{-1/2}Σ̂Σ^{-1/2} (only Σ changes).
struct T8Case {
    d: usize,
    runs: Vec<(DataModel, Moments)>,
}

impl T8Case {
    const KAPPAS: [f64; 2] = [1.0, 100.0];

    fn new(seed: u64, d: usize) -> Self {
        let runs = Self::KAPPAS
            .iter()
            .map(|&kappa| {
                let mut r = rng(seed);
                let model = spec(d, d, kappa, 2.0, 0.0).build(&mut r).unwrap();
                let mo = Moments::estimate(&model.sample(2000, &mut r).unwrap()).unwrap();
                (model, mo)
            })
            .collect();
        Self { d, runs }
    }

    /// Q_R = polar(Σ̂^{-1/2}Σ^{1/2}) of run i: κ(Σ) acts on the spectral init as W ↦ WQ_R.
    fn rotation(&self, i: usize) -> Array2<f64> {
        let (model, mo) = &self.runs[i];
        let r = mo.sigma_hat_inv_half().dot(model.sigma_half());
        kappa_linalg::polar_factor(r.view(), kappa_linalg::SvdDriver::default()).unwrap()
    }

    /// The preconditioned trace of run i from the spectral init with W.
    fn trace(&self, i: usize, w: Option<&Array2<f64>>) -> Vec<f64> {
        let (model, mo) = &self.runs[i];
        let (a0, b0) = match w {
            Some(w) => spectral_init_with(mo, w.view()).unwrap(),
            None => spectral_init(mo).unwrap(),
        };
        excess_trace(model, mo, a0, b0, true, T8_STEPS)
    }

    /// The oracle (Σ̂ = Σ) trace of run i from the perturbed minimiser (1.1·A*, B*).
    fn oracle_trace(&self, i: usize) -> Vec<f64> {
        let model = &self.runs[i].0;
        let oracle = Moments::oracle(model).unwrap();
        let (a0, b0) = spectral_init(&oracle).unwrap();
        excess_trace(model, &oracle, a0 * 1.1, b0, true, T8_STEPS)
    }

    /// Claims (i) and (ii) of T8, with their fitted μ agreeing within the implied bound.
    fn check_invariances(&self) -> Result<(), String> {
        let kappa = Self::KAPPAS[1];
        let (o1, o100) = (self.oracle_trace(0), self.oracle_trace(1));
        let bound =
            same_trajectory(&o1, &o100, self.d, kappa).map_err(|e| format!("oracle: {e}"))?;
        let (m1, m100) = (fitted_mu(&o1), fitted_mu(&o100));
        if (m1 - m100).abs() > bound * m100 {
            return Err(format!("oracle μ {m1} vs {m100}, bound {:e}", bound * m100));
        }
        let rotated = self.trace(0, Some(&self.rotation(1)));
        let e100 = self.trace(1, None);
        let bound = same_trajectory(&rotated, &e100, self.d, kappa)
            .map_err(|e| format!("rotated init: {e}"))?;
        let (m1, m100) = (fitted_mu(&rotated), fitted_mu(&e100));
        if (m1 - m100).abs() > bound * m100 {
            return Err(format!(
                "rotated-init μ {m1} vs {m100}, bound {:e}",
                bound * m100
            ));
        }
        Ok(())
    }
}

/// The T8 counterexample found on another machine (`seed = 11516613895958080191, d = 2`):
/// "μ does not depend on κ(Σ)" fails for the *fitted* μ with a finite-sample Σ̂ — 0.5356 at
/// κ(Σ) = 1 and 0.4848 at κ(Σ) = 100. The cause (docs/convergence.md §T8): κ(Σ) rotates the
/// spectral init along the balanced orbit by Q_R (0.9° here), and at d = 2 the trace mixes a fast
/// mode (E ratio ≈ 0.48) with a slow one (≈ 0.63) whose weight depends on that position; the
/// fitted window straddles the crossover. The true claims hold on this case: the invariances of
/// T8, and both fitted μ lie in the range of fitted μ over the whole orbit of this (T, S).
#[test]
fn t8_counterexample_seed_11516613895958080191_d2() {
    let case = T8Case::new(11516613895958080191, 2);
    case.check_invariances().unwrap();
    let mus: Vec<f64> = (0..2).map(|i| fitted_mu(&case.trace(i, None))).collect();
    // The reported values, to the printed precision (rounding moves them by < 1e-10).
    assert!(
        (mus[0] - 0.5356).abs() < 1e-4 && (mus[1] - 0.4848).abs() < 1e-4,
        "{mus:?}"
    );
    // The orbit: spectral inits with W = rotations and reflections in 1° steps. μ(W) dips
    // sharply (to the fast rate 0.481 at −1.1°, where the slow mode is not excited), so a coarse
    // grid misses the dip; 1° resolves it.
    let mut orbit = Vec::new();
    for i in 0..360 {
        let th = (i as f64).to_radians();
        let (c, s) = (th.cos(), th.sin());
        for w in [array![[c, -s], [s, c]], array![[c, s], [s, -c]]] {
            orbit.push(fitted_mu(&case.trace(0, Some(&w))));
        }
    }
    let (lo, hi) = orbit
        .iter()
        .fold((1.0f64, 0.0f64), |(l, h), &m| (l.min(m), h.max(m)));
    assert!(
        mus.iter().all(|m| (lo..=hi).contains(m)),
        "{mus:?} outside [{lo}, {hi}]"
    );
    // The documented orbit range [0.481, 0.643] (docs/convergence.md §T8).
    assert!(
        (lo - 0.481).abs() < 1e-3 && (hi - 0.643).abs() < 1e-3,
        "[{lo}, {hi}]"
    );
}

#[test]
fn too_few_samples_is_a_singular_covariance_error() {
    let mut r = rng(1);
    let model = spec(5, 2, 10.0, 2.0, 0.1).build(&mut r).unwrap();
    let err = Moments::estimate(&model.sample(4, &mut r).unwrap()).unwrap_err();
    assert!(
        matches!(err, OptimError::SingularCovariance { n: 4, d: 5, .. }),
        "{err}"
    );
    // n ≥ d but rank deficient: duplicated columns.
    let s = model.sample(3, &mut r).unwrap();
    let x = ndarray::concatenate![ndarray::Axis(1), s.x(), s.x()];
    let y = ndarray::concatenate![ndarray::Axis(1), s.y(), s.y()];
    let err = Moments::estimate(&Sample::new(x, y).unwrap()).unwrap_err();
    assert!(
        matches!(err, OptimError::SingularCovariance { n: 6, d: 5, .. }),
        "{err}"
    );
}

#[test]
fn non_finite_and_mismatched_inputs_are_errors() {
    let x = array![[1.0, f64::NAN], [0.0, 1.0]];
    let y = array![[1.0, 2.0]];
    assert!(matches!(
        Sample::new(x, y),
        Err(OptimError::Input(InputError::NonFinite {
            arg: "x",
            row: 0,
            col: 1,
            ..
        }))
    ));
    let err = Sample::new(array![[1.0, 2.0]], array![[1.0, 2.0, 3.0]]).unwrap_err();
    assert!(
        matches!(
            err,
            OptimError::Input(InputError::ShapeMismatch { arg: "y", .. })
        ),
        "{err}"
    );

    let mut r = rng(2);
    let model = spec(3, 2, 10.0, 2.0, 0.1).build(&mut r).unwrap();
    let sample = model.sample(50, &mut r).unwrap();
    let problem = EmpiricalProblem::new(&sample, ContextMode::SplitKeys).unwrap();
    let (a, b) = (Array2::<f64>::zeros((2, 3)), Array2::<f64>::zeros((3, 3)));
    assert!(matches!(
        problem.loss(a.view(), Array2::<f64>::zeros((2, 2)).view()),
        Err(OptimError::Input(InputError::ShapeMismatch {
            arg: "b",
            ..
        }))
    ));
    let mut bad = b.clone();
    bad[[1, 1]] = f64::INFINITY;
    assert!(matches!(
        problem.loss_grad(a.view(), bad.view()),
        Err(OptimError::Input(InputError::NonFinite { arg: "b", .. }))
    ));
    assert!(matches!(
        model
            .population()
            .excess(Array2::<f64>::zeros((3, 3)).view(), b.view()),
        Err(OptimError::Input(InputError::ShapeMismatch {
            arg: "a",
            ..
        }))
    ));
    let mo = Moments::estimate(&sample).unwrap();
    let err = Descent::new(
        Objective::Empirical(problem.clone()),
        &mo,
        Array2::zeros((1, 3)),
        b.clone(),
        Settings::algorithm(),
    )
    .err()
    .unwrap();
    assert!(
        matches!(
            err,
            OptimError::Input(InputError::ShapeMismatch { arg: "a0", .. })
        ),
        "{err}"
    );
    let err = Descent::new(
        Objective::Empirical(problem),
        &mo,
        a,
        b,
        Settings {
            lambda: -1.0,
            ..Settings::algorithm()
        },
    )
    .err()
    .unwrap();
    assert!(
        matches!(
            err,
            OptimError::Input(InputError::InvalidArgument { arg: "lambda", .. })
        ),
        "{err}"
    );
    let err = DataModel::new(array![[1.0, 0.0], [0.0, 0.0]], array![[1.0, 1.0]], 0.1).unwrap_err();
    assert!(
        matches!(
            err,
            OptimError::Input(InputError::InvalidArgument { arg: "sigma", .. })
        ),
        "{err}"
    );
    assert!(spectral_init_with(&mo, array![[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]].view()).is_err());
}

#[test]
fn a_diverging_step_size_is_reported_with_its_step() {
    let mut r = rng(3);
    let model = spec(4, 4, 10.0, 2.0, 0.0).build(&mut r).unwrap();
    let mo = Moments::estimate(&model.sample(500, &mut r).unwrap()).unwrap();
    let (a0, b0) = spectral_init(&mo).unwrap();
    let a0 = a0 * 1.5; // off the manifold, so the first gradient is not zero
    let settings = Settings {
        step: StepSize::Relative { c: 20.0 },
        ..Settings::algorithm()
    };
    let mut descent = Descent::new(
        Objective::Population(model.population().clone()),
        &mo,
        a0,
        b0,
        settings,
    )
    .unwrap();
    let err = descent.run(500).unwrap_err();
    match err {
        OptimError::Diverged { step, .. } => {
            assert!(step > 0 && step < 500, "step {step}");
            assert_eq!(
                descent.steps_done(),
                step,
                "the trainer stops at the step it reports"
            );
            let (a, b) = descent.params();
            assert!(
                a.iter().chain(b.iter()).all(|x| x.is_finite()),
                "the last parameters are finite"
            );
        }
        other => panic!("expected Diverged, got {other}"),
    }
}

/// The clip and balance renormalizations, each asserted to its rounding bound.
#[test]
fn clip_renormalization_caps_the_softmax_scale_and_keeps_the_product() {
    let mut r = rng(4);
    let model = spec(3, 2, 10.0, 2.0, 0.0).build(&mut r).unwrap();
    let mo = Moments::estimate(&model.sample(300, &mut r).unwrap()).unwrap();
    let d = mo.dim();
    let (a0, b0) = spectral_init(&mo).unwrap();
    let (mut a, mut b) = (&a0 / 5.0, &b0 * 5.0);
    let before = a.dot(mo.sigma_hat()).dot(&b.t());
    let p_abs = abs(&a).dot(&abs(mo.sigma_hat())).dot(&abs(&b).t());
    let h = mo.sigma_hat_half();
    let sigma1 = |b: &Array2<f64>| {
        let v = h.dot(b).dot(h);
        kappa_linalg::singular_values(v.view(), kappa_linalg::SvdDriver::default()).unwrap()[0]
    };
    // The relative error of a computed σ₁(HBH) (the same stored H in the library and here, so
    // H's own error cancels): the product errs by ≤ γ_{2d}‖|H||B||H|‖_F (normwise, and σ₁ is
    // perfectly conditioned), the SVD by its backward error C_SM·d·u·σ₁ (standard model).
    let sigma1_rel = |b: &Array2<f64>| {
        gamma(2 * d) * frob(&abs(h).dot(&abs(b)).dot(&abs(h))) / sigma1(b) + C_SM * d as f64 * U
    };
    let rel_before = sigma1_rel(&b);
    renormalize(
        &mut a,
        &mut b,
        &mo,
        Renormalization::ClipSoftmaxScale { max_scale: 0.5 },
    )
    .unwrap();
    // B ← fl(f̂·B) with f̂ = fl(0.5/σ̂₁): σ₁ of the stored B is 0.5·σ₁/σ̂₁ up to 2u (f̂'s division,
    // B's scaling), σ̂₁ within rel_before of σ₁, and the check's own σ̂₁ within rel_after:
    // |σ̂₁ − 0.5| ≤ 0.5·(e^{1.01(rel_before + rel_after) + 2u} − 1) (ln(1/(1 − x)) ≤ 1.01x).
    let s = sigma1(&b);
    let tol = 0.5 * ((1.01 * (rel_before + sigma1_rel(&b)) + 2.0 * U).exp() - 1.0);
    assert!(
        (s - 0.5).abs() <= tol,
        "‖V‖₂ = {s}: {:e} > {tol:e}",
        (s - 0.5).abs()
    );
    // A/f̂ and f̂B in exact arithmetic give the same product; the stored ones differ from them
    // by u relative, each product by γ_{2d}|A||Σ̂||Bᵀ| (the same absolute product before and
    // after, up to (1 + u)²): elementwise ≤ (2γ_{2d}(1 + u)² + 2u + u²)·P ≤ γ_{4d+3}·P.
    let after = a.dot(mo.sigma_hat()).dot(&b.t());
    let tol = p_abs * gamma(4 * d + 3);
    let excess = (&after - &before).mapv(f64::abs) - &tol;
    assert!(
        excess.iter().all(|&x| x <= 0.0),
        "product moved beyond γ_{{4d+3}}|A||Σ̂||Bᵀ|: {excess:?}"
    );
    let (mut a2, mut b2) = (&a0 / 5.0, &b0 * 5.0);
    // The relative error of a computed ‖U‖_F = ‖AH‖_F: the product's γ_d‖|A||H|‖_F/‖AH‖_F, and the
    // norm's sum of squares and square root γ_{kd+2}; ‖V‖_F = ‖HBᵀH‖_F likewise with γ_{2d} and
    // d² entries. Balance sets c = fl(√(fl(‖V‖/‖U‖))) (2u), A ← cA, B ← B/c (u each), so in
    // exact arithmetic ‖U'‖/‖V'‖ = c²‖U‖/‖V‖ = 1 up to the library's two norms (once each in
    // c²), 2·2u for c², 2u for the scalings, and the check's two norms — 2(e_U + e_V) in the
    // log; 3(e_U + e_V) also covers the u-level change of e_U, e_V by the scaling:
    // |‖U'‖/‖V'‖ − 1| ≤ e^{1.01·3(e_U + e_V) + 6u} − 1 =: ε, and |‖U'‖ − ‖V'‖| ≤ ε(1 + ε)‖U'‖.
    let (u0, v0) = mo.whiten(a2.view(), b2.view()).unwrap();
    let e_u = gamma(d) * frob(&abs(&a2).dot(&abs(h))) / frob(&u0) + gamma(a2.len() + 2);
    let e_v = gamma(2 * d) * frob(&abs(h).dot(&abs(&b2).t()).dot(&abs(h))) / frob(&v0)
        + gamma(b2.len() + 2);
    renormalize(&mut a2, &mut b2, &mo, Renormalization::Balance).unwrap();
    let (u, v) = mo.whiten(a2.view(), b2.view()).unwrap();
    let rel = (1.01 * 3.0 * (e_u + e_v) + 6.0 * U).exp() - 1.0;
    let tol = rel * (1.0 + rel) * frob(&u);
    assert!(
        (frob(&u) - frob(&v)).abs() <= tol,
        "‖U‖ {} vs ‖V‖ {}: {:e} > {tol:e}",
        frob(&u),
        frob(&v),
        (frob(&u) - frob(&v)).abs()
    );
}
