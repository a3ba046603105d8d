//! Nyström attention (docs/models.md, "Nyström attention"): exact softmax attention where it must
//! agree (landmarks = sequence length, exact pseudo-inverse), a materialized reference of its
//! formula with fewer landmarks, the layer's parameters, trace and errors.
//!
//! # Tolerances (f64; u = 2⁻⁵³, γ_n = n·u/(1 − n·u))
//!
//! With m = T and the exact pseudo-inverse the output is F·A⁺·(B·V) with F = A = B = S (the same
//! operations on the same inputs, so equal bit for bit). libtorch's SVD pseudo-inverse is
//! backward stable — the computed S̃⁺ is (S + E)⁺ with ‖E‖_F ≤ γ_{4T²}·‖S‖_F (Householder
//! bidiagonalization and QR iteration, Higham Thm 19.4 as the optimizer tests use it) — and to
//! first order S·(S + E)⁻¹·S = S − E, so the pseudo-inverse contributes ‖E‖_F·‖V‖₂ to the
//! output, whatever κ(S). The two products after it round relative to their factors: A⁺·(BV) by
//! γ_T·‖A⁺‖₂·‖BV‖_F and F·(…) by γ_T·‖F‖₂·‖A⁺BV‖_F, each carried to the output through ‖F‖₂ ≤
//! ‖S‖_F; ‖A⁺‖₂ = 1/σ_min(S) makes that term κ(S)-sized. The bound per head is therefore
//! `(γ_{4T²}·‖S‖_F + 3·γ_T·κ(S)·‖S‖_F)·‖V‖_F` (the factor 3 covering B·V's own rounding and
//! the second-order term), computed per head from the test's S.

use kappa_models::nystrom::{iterative_pinv, nystrom_attention};
use kappa_models::{
    AttentionConfig, AttentionKernel, ConditionedAttention, CorrectionConfig, NystromConfig, Pinv,
    ScoreScale,
};
use tch::{nn, Device, Kind, Tensor};

const U: f64 = f64::EPSILON / 2.0;

fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

/// The tests of this binary run on parallel threads and libtorch's generator is global: every
/// seeded draw (inputs, layer initializations) goes through [`seeded`], so each test's tensors
/// are the same in every run whatever the other tests do.
use kappa_models::seeded;

fn randn(shape: &[i64], seed: u64) -> Tensor {
    seeded(seed, || Tensor::randn(shape, (Kind::Double, Device::Cpu)))
}

fn fro(t: &Tensor) -> f64 {
    t.norm().double_value(&[])
}

fn max_abs(t: &Tensor) -> f64 {
    t.abs().max().double_value(&[])
}

/// κ₂ of a square matrix from its singular values.
fn kappa(s: &Tensor) -> f64 {
    // `svd(compute_uv = false)`: tch's `linalg_svdvals` passes a CUDA-only driver argument.
    let (_, sv, _) = s.svd(true, false);
    let (hi, lo) = (sv.max().double_value(&[]), sv.min().double_value(&[]));
    hi / lo
}

#[test]
fn all_landmarks_and_the_exact_pinv_give_softmax_attention() {
    let (b, h, t, k) = (2, 3, 12, 4);
    let (q, kk, v) = (
        randn(&[b, h, t, k], 1),
        randn(&[b, h, t, k], 2),
        randn(&[b, h, t, k], 3),
    );
    let c = 1.0 / (k as f64).sqrt();
    let cfg = NystromConfig {
        landmarks: t as usize,
        pinv: Pinv::Exact,
        conv_kernel: 0,
    };
    let got = nystrom_attention(&q, &kk, &v, c, &cfg);
    let s = (q.matmul(&kk.transpose(-2, -1)) * c).softmax(-1, Kind::Double);
    let exact = s.matmul(&v);
    for i in 0..b {
        for j in 0..h {
            let (s_ij, v_ij) = (s.get(i).get(j), v.get(i).get(j));
            let tol = (gamma(4 * (t * t) as usize) + 3.0 * gamma(t as usize) * kappa(&s_ij))
                * fro(&s_ij)
                * fro(&v_ij);
            let d = max_abs(&(got.get(i).get(j) - exact.get(i).get(j)));
            assert!(d <= tol, "batch {i} head {j}: {d:e} > {tol:e}");
        }
    }
}

/// The formula written out with explicit segment loops, m = 3 landmarks of T = 12 tokens, exact
/// pseudo-inverse: the same operations in another order, so the bound of the module docs with
/// A's κ in place of S's, plus the segment means' rounding (γ_ℓ relative on Q̃, K̃, amplified by
/// the softmax's Lipschitz constant c·‖q‖ ≤ c·max|Q|·√k per logit).
#[test]
fn fewer_landmarks_match_the_materialized_formula() {
    let (t, k, m) = (12_i64, 4_i64, 3_i64);
    let (q, kk, v) = (randn(&[t, k], 4), randn(&[t, k], 5), randn(&[t, k], 6));
    let c = 0.5;
    let seg = t / m;
    let means = |x: &Tensor| {
        let rows: Vec<Tensor> = (0..m)
            .map(|i| {
                x.narrow(0, i * seg, seg)
                    .sum_dim_intlist(0, false, Kind::Double)
                    / seg as f64
            })
            .collect();
        Tensor::stack(&rows, 0)
    };
    let (ql, kl) = (means(&q), means(&kk));
    let sm = |a: &Tensor, b: &Tensor| (a.matmul(&b.tr()) * c).softmax(-1, Kind::Double);
    let (f, a, bm) = (sm(&q, &kl), sm(&ql, &kl), sm(&ql, &kk));
    let want = f
        .matmul(&a.linalg_pinv(1e-15, false))
        .matmul(&bm.matmul(&v));
    let cfg = NystromConfig {
        landmarks: m as usize,
        pinv: Pinv::Exact,
        conv_kernel: 0,
    };
    let got = nystrom_attention(
        &q.view([1, 1, t, k]),
        &kk.view([1, 1, t, k]),
        &v.view([1, 1, t, k]),
        c,
        &cfg,
    )
    .view([t, k]);
    let lipschitz = c * max_abs(&q).max(max_abs(&kk)) * (k as f64).sqrt();
    let means_err = 2.0 * gamma(seg as usize) * lipschitz * fro(&f) * fro(&v);
    let tol = (gamma(4 * (m * m) as usize) + 3.0 * gamma(t as usize) * kappa(&a))
        * fro(&f)
        * fro(&v)
        * fro(&a).max(1.0)
        + means_err * kappa(&a);
    let d = max_abs(&(&got - &want));
    assert!(d <= tol, "{d:e} > {tol:e}");
}

/// The Nyströmformer's iterations on landmark kernels of Gaussian Q, K: one step maps the
/// residual R = I − AZ to ¾R³ + ¼R⁴ (crate::nystrom's docs), so ‖R'‖₂ ≤ ‖R‖₂³·(3 + ‖R‖₂)/4,
/// checked for every matrix and step (R₀ = I − AAᵀ/(‖A‖₁‖A‖_∞) is symmetric with eigenvalues
/// in [0, 1), so ‖R₀‖₂ < 1 and every later R is a polynomial in R₀), plus the rounding of a
/// step's four m×m products: 4·γ_m·‖A‖_F·‖Z‖_F·(1 + ‖R‖_F)³ bounds it (each product's error
/// relative to its factors, the factors bounded by the step's polynomial in R).
#[test]
fn the_iteration_contracts_the_residual_cubically() {
    let (q, kk) = (randn(&[4, 8, 4], 7), randn(&[4, 8, 4], 8));
    let a = (q.matmul(&kk.transpose(-2, -1)) * 0.5).softmax(-1, Kind::Double);
    let eye = Tensor::eye(8, (Kind::Double, Device::Cpu));
    let per_matrix = |t: &Tensor| -> Vec<f64> {
        let n = t
            .square()
            .sum_dim_intlist([-2, -1].as_slice(), false, Kind::Double)
            .sqrt();
        Vec::<f64>::try_from(&n).unwrap()
    };
    let spectral = |t: &Tensor| -> Vec<f64> {
        let (_, s, _) = t.svd(true, false);
        Vec::<f64>::try_from(&s.amax(-1, false)).unwrap()
    };
    let mut z = iterative_pinv(&a, 0);
    let mut prev = spectral(&(&eye - a.matmul(&z)));
    assert!(
        prev.iter().all(|&r| r < 1.0),
        "Z₀ does not contract: {prev:?}"
    );
    for steps in 1..=6 {
        z = iterative_pinv(&a, steps);
        let r = spectral(&(&eye - a.matmul(&z)));
        let (za, zz) = (per_matrix(&a), per_matrix(&z));
        for i in 0..4 {
            let rounding = 4.0 * gamma(8) * za[i] * zz[i] * (1.0 + prev[i]).powi(3);
            let bound = prev[i].powi(3) * (3.0 + prev[i]) / 4.0 + rounding;
            assert!(
                r[i] <= bound,
                "matrix {i} step {steps}: {:e} > {bound:e}",
                r[i]
            );
        }
        prev = r;
    }
}

fn layer(kernel: AttentionKernel, seed: u64) -> (nn::VarStore, ConditionedAttention) {
    seeded(seed, || layer_unseeded(kernel))
}

fn layer_unseeded(kernel: AttentionKernel) -> (nn::VarStore, ConditionedAttention) {
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = AttentionConfig {
        n_embd: 12,
        n_head: 3,
        bias: true,
        causal: false,
        scaling: ScoreScale::InvSqrtK,
        correction: CorrectionConfig::identity(0.5, kappa_models::HeadLayout::Shifted),
        fused_kernel: true,
        kernel,
    };
    let attn = ConditionedAttention::new(vs.root() / "attn", cfg, 0.3).unwrap();
    (vs, attn)
}

#[test]
fn the_layer_adds_only_the_convolution_and_traces_exact_probabilities() {
    let (vs_soft, _) = layer(AttentionKernel::Softmax, 9);
    let (vs_nys, nys) = layer(AttentionKernel::Nystrom(NystromConfig::paper(4)), 9);
    let count = |vs: &nn::VarStore| {
        vs.trainable_variables()
            .iter()
            .map(|t| t.numel())
            .sum::<usize>()
    };
    // The conditioning adds no trainable parameter; Nyström adds its H×r convolution.
    assert_eq!(count(&vs_nys), count(&vs_soft) + 3 * 33);
    let x = randn(&[2, 16, 12], 12).to_kind(Kind::Float);
    let y = nys.try_forward(&x).unwrap();
    assert_eq!(y.size(), [2, 16, 12]);
    y.sum(Kind::Float).backward();
    for v in vs_nys.trainable_variables() {
        assert!(v.grad().defined(), "a parameter got no gradient");
    }
    let (y_trace, trace) = nys.forward_trace(&x, true);
    assert!(
        y_trace.allclose(&y, 0.0, 0.0, false),
        "tracing changed the output"
    );
    let rows = trace
        .unwrap()
        .probs
        .sum_dim_intlist(-1, false, Kind::Double);
    assert!(
        max_abs(&(rows - 1.0)) < 1e-5,
        "trace probabilities are not softmax rows"
    );
}

/// The layer (λ·I conditioning, biases) with all landmarks and the exact pseudo-inverse against
/// the same layer on the softmax kernel: per head the bound of the first test, from the heads'
/// own S and V (recomputed here from the effective weight W + λE and the bias), summed in
/// squares over heads and carried through c_proj by ‖W_proj‖_F ≥ ‖W_proj‖₂.
#[test]
fn all_landmarks_make_the_layer_softmax_attention() {
    let exact = NystromConfig {
        landmarks: 8,
        pinv: Pinv::Exact,
        conv_kernel: 0,
    };
    let (mut vs_soft, soft) = layer(AttentionKernel::Softmax, 10);
    let (mut vs_nys, nys) = layer(AttentionKernel::Nystrom(exact), 10);
    // The same weights in both (the comparison's premise), whatever the generator did.
    vs_nys.copy(&vs_soft).unwrap();
    vs_soft.double();
    vs_nys.double();
    let x = randn(&[1, 8, 12], 11);
    let (a, b) = tch::no_grad(|| (soft.try_forward(&x).unwrap(), nys.try_forward(&x).unwrap()));
    let qkv = tch::no_grad(|| x.linear(&soft.effective_qkv_weight(), soft.qkv_bias()));
    let heads = |i: i64| qkv.narrow(-1, i * 12, 12).view([8, 3, 4]).transpose(0, 1);
    let (q, kk, v) = (heads(0), heads(1), heads(2));
    let s = (q.matmul(&kk.transpose(-2, -1)) * 0.5).softmax(-1, Kind::Double);
    let mut sq = 0.0;
    for j in 0..3 {
        let (s_j, v_j) = (s.get(j), v.get(j));
        let t = (gamma(4 * 64) + 3.0 * gamma(8) * kappa(&s_j)) * fro(&s_j) * fro(&v_j);
        sq += t * t;
    }
    let w_proj = vs_soft.variables()["attn.c_proj.weight"].shallow_clone();
    let tol = sq.sqrt() * fro(&w_proj);
    let d = max_abs(&(a - b));
    assert!(d <= tol, "{d:e} > {tol:e}");
}

#[test]
fn bad_nystrom_settings_are_named_errors() {
    let mut cfg = AttentionConfig {
        n_embd: 8,
        n_head: 2,
        bias: false,
        causal: true,
        scaling: ScoreScale::InvSqrtK,
        correction: CorrectionConfig::None,
        fused_kernel: true,
        kernel: AttentionKernel::Nystrom(NystromConfig::paper(4)),
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let e = ConditionedAttention::new(vs.root(), cfg, 0.02)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("attention.kernel") && e.contains("causal"),
        "{e}"
    );
    cfg.causal = false;
    for (bad, field) in [
        (
            NystromConfig {
                landmarks: 0,
                ..NystromConfig::paper(4)
            },
            "landmarks",
        ),
        (
            NystromConfig {
                conv_kernel: 4,
                ..NystromConfig::paper(4)
            },
            "conv_kernel",
        ),
        (
            NystromConfig {
                pinv: Pinv::Iterative { steps: 0 },
                ..NystromConfig::paper(4)
            },
            "steps",
        ),
    ] {
        let c = AttentionConfig {
            kernel: AttentionKernel::Nystrom(bad),
            ..cfg
        };
        let e = ConditionedAttention::new(vs.root() / field, c, 0.02)
            .unwrap_err()
            .to_string();
        assert!(e.contains(field), "{e}");
    }
    let attn = ConditionedAttention::new(vs.root() / "ok", cfg, 0.02).unwrap();
    let e = attn.try_forward(&Tensor::zeros([1, 6, 8], (Kind::Float, Device::Cpu)));
    assert!(e.unwrap_err().to_string().contains("divisible"));
}
