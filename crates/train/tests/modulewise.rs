//! Module-wise optimizer assignment on a tiny GPT: labels, presets, initial retraction,
//! constraints kept through training, dual-ascent statistics in the records, the per-label
//! tangent-problem solver (ADMM or the ascent, told apart by their msign counts), exact resume with
//! Muon and manifold-Muon state, and divergence against the best smoothed loss.

use std::path::PathBuf;

use kappa_models::data::fixtures;
use kappa_models::{
    matrix_diagnostics, Gpt, GptConfig, HeadDiagnostics, ModelsError, TextCorpus, TokenizerKind,
};
use kappa_optim::{Admm, DualSolver, OnDivergence, Precision};
use kappa_train::modulewise::ModuleSolvers;
use kappa_train::trainer::named_trainable;
use kappa_train::{
    modulewise_groups, modulewise_groups_by, seeded, train_language_model, DivergenceReference,
    Eval, Geometry, LanguageModeling, MetricsLine, ModuleLabel, ModulewiseConfig, Outcome, Preset,
    Record, Run, RunContext, Task, TrainConfig, Trainer, VariantId,
};
use tch::{nn, Device, Kind, Tensor};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kappa-modulewise-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    fixtures::write_sotu(&dir).unwrap();
    dir
}

/// Seed 3, one libtorch thread, no progress bar.
fn context() -> RunContext {
    RunContext {
        seed: 3,
        threads: 1,
        ..RunContext::default()
    }
    .quiet()
}

fn train_config(steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        batch_size: 4,
        lr: 6e-4,
        min_lr: 6e-5,
        warmup_steps: 1,
        eval_every: 2,
        eval_batches: 1,
        log_every: 1,
        matrix_diagnostics: true,
        diagnostics: kappa_models::DiagnosticsConfig {
            enabled: true,
            samples: 1,
            jacobian_max_tokens: 0,
        },
        ..TrainConfig::default()
    }
}

/// f32 msign so the constraints can be checked tightly (bf16 holds them to ≈ 1e-2).
fn modulewise(preset: Preset) -> ModulewiseConfig {
    let mut c = ModulewiseConfig::paper(preset);
    c.muon.precision = Precision::F32;
    c.manifold.precision = Precision::F32;
    c
}

/// f32 unit roundoff.
const U32: f64 = f32::EPSILON as f64 / 2.0;

/// The f32 Polar Express band: msign's output singular values lie within 1e-4 of 1
/// (docs/optim.md, "Precision per device"; kappa-optim's
/// `tch_backend::bf16_update_band_against_f32`) for inputs with σ/‖X‖_F ≥ [`PE_DOMAIN`]
/// (crates/optim/src/msign.rs, module table).
const PE_F32_BAND: f64 = 1e-4;
/// The smallest σ/‖X‖_F the Polar Express band covers (msign.rs module table).
const PE_DOMAIN: f64 = 1e-3;

/// When every |σᵢ − 1| ≤ δ: ‖WᵀW − I‖_F/√n = rms(σᵢ² − 1) ≤ max|σᵢ² − 1| ≤ 2δ + δ².
fn stiefel_bound(delta: f64) -> f64 {
    2.0 * delta + delta * delta
}

/// `t` in the tall orientation the manifolds constrain (transposed when wide).
fn tall(t: &Tensor) -> Tensor {
    let s = t.size();
    if s[0] < s[1] {
        t.tr()
    } else {
        t.shallow_clone()
    }
}

/// σ_min/‖X‖_F of `x` (f64), the quantity the Polar Express band is stated for.
fn pe_ratio(x: &Tensor) -> f64 {
    let d = matrix_diagnostics("x", x, usize::MAX).unwrap();
    let fro = d.singular_values.iter().map(|s| s * s).sum::<f64>().sqrt();
    d.sigma_min / fro
}

/// Asserts the f32 Polar Express band on a matrix msign put on Stiefel: every σ within δ of 1
/// and the violation within [`stiefel_bound`].
fn assert_on_stiefel(what: &str, w: &Tensor) {
    let d = matrix_diagnostics(what, w, usize::MAX).unwrap();
    for s in &d.singular_values {
        assert!((s - 1.0).abs() <= PE_F32_BAND, "{what}: σ = {s} ({d:?})");
    }
    let tol = stiefel_bound(PE_F32_BAND);
    assert!(d.stiefel_violation <= tol, "{what}: {d:?} > {tol:e}");
}

/// The paper's DGram retraction W = fl(fl(Û·V̂ᵀ)·diag(ŝ)) of the tall f32 matrix `x`, from the
/// f32 SVD Û ŝ V̂ᵀ that kappa-linalg's `polar_factor_and_singular_values` computes (the same
/// libtorch call on the same bits, so in this process the same factors). Measured in f64 for
/// this input: ε_P = ‖PᵀP − I‖_F with P = Û·V̂ᵀ (exact in f64 up to 2⁻⁵³), η = ‖ÛᵀÛ − I‖_F +
/// ‖V̂ᵀV̂ − I‖_F and the backward error ‖X − Û ŝ V̂ᵀ‖_F. The two f32 steps after the SVD add F
/// with W = (P + F)·diag(ŝ): the product, |fl(ÛV̂ᵀ) − ÛV̂ᵀ| ≤ γ_n·|Û||V̂|ᵀ entrywise, and the
/// column scaling, one rounding per entry; ‖F‖_F ≤ φ = γ_n·‖|Û||V̂|ᵀ‖_F·(1 + u) + u·‖P‖_F.
/// Returns (ρ, ŝ₁, σ-error): ρ = ε_P + 2·√(1 + ε_P)·φ + φ² bounds ‖(P + F)ᵀ(P + F) − I‖_F, so
/// ‖Off(WᵀW)‖_F ≤ ŝ₁²·ρ and σᵢ(W) ∈ ŝᵢ·[√(1 − ρ), √(1 + ρ)] (σᵢ(AD) between σ_min(A)·dᵢ and
/// ‖A‖₂·dᵢ); with Weyl and |σᵢ(Û ŝ V̂ᵀ) − ŝᵢ| ≤ ŝᵢ·η, |σᵢ(W) − σᵢ(X)| ≤ ŝ₁·(ρ + η) + ‖X − Û ŝ V̂ᵀ‖_F.
/// (The f64 diagnostics' own rounding, ≈ max(m, n)·2⁻⁵³·ŝ₁², is below every such bound by 10⁶.)
fn dgram_paper_bounds(x: &Tensor) -> (f64, f64, f64) {
    let (u, s, v) = x.svd(true, true);
    let f64_ = |t: &Tensor| t.to_kind(Kind::Double);
    let (u, s, v, x) = (f64_(&u), f64_(&s), f64_(&v), f64_(x));
    let n = s.size()[0];
    let eye = Tensor::eye(n, (Kind::Double, Device::Cpu));
    let fro = |t: &Tensor| t.norm().double_value(&[]);
    let p = u.matmul(&v.tr());
    let eps_p = fro(&(p.tr().matmul(&p) - &eye));
    let eta = fro(&(u.tr().matmul(&u) - &eye)) + fro(&(v.tr().matmul(&v) - &eye));
    let backward = fro(&(&x - u.matmul(&(v.tr() * s.unsqueeze(1)))));
    let nu = n as f64 * U32;
    let gamma = nu / (1.0 - nu);
    let phi = gamma * fro(&u.abs().matmul(&v.abs().tr())) * (1.0 + U32) + U32 * fro(&p);
    let rho = eps_p + 2.0 * (1.0 + eps_p).sqrt() * phi + phi * phi;
    let s1 = s.double_value(&[0]);
    (rho, s1, s1 * (rho + eta) + backward)
}

/// The worst case of the DGram paper retraction in f32 when its SVD's inputs are not at hand
/// (inside training): a backward-stable SVD gives factors orthonormal to p(m, n)·u (LAPACK
/// Users' Guide §4.9, "Error bounds for the SVD", p a modestly growing function), taken here as
/// p = m·n (n Householder reflections of length ≤ m accumulated, each to ≈ m·u; Higham, ASNA,
/// Lemma 19.3 with constant 1). Then ε_P ≤ √n·(η_U·(1 + η_V) + η_V) with η = p·u (2-norms),
/// ‖|Û||V̂|ᵀ‖_F ≤ ‖Û‖_F·‖V̂‖_F ≤ n·(1 + η), and ρ follows as in [`dgram_paper_bounds`]; the
/// relative measure ‖Off(WᵀW)‖_F/‖diag(WᵀW)‖₂ is ≤ ρ/(1 − ρ). The init retractions measured by
/// [`dgram_paper_bounds`] reach ε_P ≈ 1e-6, 50× inside this band.
fn dgram_paper_band(m: usize, n: usize) -> f64 {
    let eta = (m * n) as f64 * U32;
    let nf = n as f64;
    let eps_p = nf.sqrt() * (eta * (1.0 + eta) + eta);
    let gamma = nf * U32 / (1.0 - nf * U32);
    let phi = gamma * nf * (1.0 + eta) * (1.0 + U32) + U32 * nf.sqrt() * (1.0 + eta);
    let rho = eps_p + 2.0 * (1.0 + eps_p).sqrt() * phi + phi * phi;
    rho / (1.0 - rho)
}

/// The tiny GPT on the State of the Union fixture. Every draw from libtorch's generator in this
/// binary goes through `seeded` (which holds its lock): the tests run in parallel threads, and
/// one model built unseeded beside `lm` took random numbers from under it (a loaded machine saw
/// the resumed run of `variants` start from another initialization than the uninterrupted one).
fn lm(dir: &std::path::Path) -> (nn::VarStore, LanguageModeling) {
    let corpus = TextCorpus::load_sotu(dir, TokenizerKind::Char, None, Device::Cpu).unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = GptConfig::tiny(corpus.tokenizer.vocab_size());
    let gpt = seeded(1, || Gpt::new(&vs.root(), cfg)).unwrap();
    (vs, LanguageModeling::new(gpt, corpus, 3).unwrap())
}

fn run(trainer: &mut Trainer<'_>, task: &mut impl Task) -> (kappa_train::Summary, Vec<Record>) {
    let mut records = Vec::new();
    let mut sink = |r: &Record| -> Result<(), ModelsError> {
        records.push(r.clone());
        Ok(())
    };
    let s = trainer.run(task, &mut sink, None).unwrap();
    (s, records)
}

#[test]
fn every_gpt_variable_has_a_label() {
    let vs = nn::VarStore::new(Device::Cpu);
    let bias = GptConfig {
        bias: true,
        ..GptConfig::tiny(11)
    };
    let _gpt = seeded(0, || Gpt::new(&vs.root(), bias)).unwrap();
    let mut hidden = 0;
    for (name, t) in named_trainable(&vs) {
        let label = ModuleLabel::of(&name).unwrap_or_else(|| panic!("`{name}` has no label"));
        if Preset::Hetero.assignment().geometry(label).is_some() {
            hidden += 1;
            assert_eq!(t.dim(), 2, "{name}");
        }
    }
    assert_eq!(hidden, 4 * 2, "four hidden matrices per layer");
    assert_eq!(ModuleLabel::of("h.0.attn.lambda"), None);
    assert_eq!(
        Preset::HeteroInv
            .assignment()
            .geometry(ModuleLabel::AttentionQkv),
        Some(Geometry::DGram)
    );
}

#[test]
fn invalid_configs_name_the_field() {
    let vs = nn::VarStore::new(Device::Cpu);
    let _gpt = seeded(0, || Gpt::new(&vs.root(), GptConfig::tiny(11))).unwrap();
    let mut cfg = modulewise(Preset::Hetero);
    cfg.muon_lr = f64::NAN;
    let err = modulewise_groups(&vs, &cfg, &train_config(4)).unwrap_err();
    assert!(err.to_string().contains("modulewise.muon_lr"), "{err}");
    let bad_train = TrainConfig {
        lr: 0.0,
        ..train_config(4)
    };
    let err = modulewise_groups(&vs, &modulewise(Preset::Hetero), &bad_train).unwrap_err();
    assert!(err.to_string().contains("train.lr"), "{err}");
    cfg = modulewise(Preset::Hetero);
    cfg.optimizer_threads = 0;
    let err = modulewise_groups(&vs, &cfg, &train_config(4)).unwrap_err();
    assert!(err.to_string().contains("optimizer_threads"), "{err}");
    cfg = modulewise(Preset::Hetero);
    cfg.lr_multipliers.mlp_out = -1.0;
    let err = modulewise_groups(&vs, &cfg, &train_config(4)).unwrap_err();
    assert!(err.to_string().contains("lr_multipliers.mlp_out"), "{err}");
}

#[test]
fn lr_multipliers_scale_each_labels_peak() {
    let vs = nn::VarStore::new(Device::Cpu);
    let _gpt = seeded(0, || Gpt::new(&vs.root(), GptConfig::tiny(11))).unwrap();
    let mut cfg = modulewise(Preset::Hetero);
    cfg.lr_multipliers.attention_qkv = 0.25;
    cfg.lr_multipliers.mlp_in = 3.0;
    let train = train_config(4);
    for g in modulewise_groups(&vs, &cfg, &train).unwrap() {
        let expected = match g.name() {
            "attn_qkv" => 0.25 * cfg.muon_lr,
            "mlp_in" => 3.0 * cfg.muon_lr,
            "attn_out" | "mlp_out" => cfg.muon_lr,
            _ => train.lr,
        };
        assert_eq!(g.lr(), expected, "{}", g.name());
    }
}

#[test]
fn groups_put_constrained_matrices_on_their_manifolds() {
    for preset in Preset::ALL {
        let vs = nn::VarStore::new(Device::Cpu);
        let _gpt = seeded(0, || Gpt::new(&vs.root(), GptConfig::tiny(11))).unwrap();
        // The init, before the groups retract it in place (tall orientation).
        let init: std::collections::HashMap<String, Tensor> = named_trainable(&vs)
            .into_iter()
            .filter(|(_, t)| t.dim() == 2)
            .map(|(n, t)| (n, tall(&t).copy()))
            .collect();
        let groups = modulewise_groups(&vs, &modulewise(preset), &train_config(4)).unwrap();
        // The optimizer retracts the constrained matrices when it is built.
        let opt = kappa_optim::Optimizer::new(groups).unwrap();
        let groups = opt.groups();
        let a = preset.assignment();
        for g in groups {
            let label = ModuleLabel::of(&g.names()[0]).unwrap();
            let geometry = a.geometry(label);
            match geometry {
                // Each group carries its own peak lr: muon_lr for Muon and manifold groups, the
                // train config's lr for AdamW groups (the schedule's factor multiplies both).
                Some(Geometry::Muon | Geometry::Stiefel | Geometry::DGram) => {
                    assert_eq!(g.lr(), 0.02, "{}", g.name())
                }
                _ => assert_eq!(g.lr(), 6e-4, "{}", g.name()),
            }
            for (name, p) in g.names().iter().zip(g.params()) {
                let x = || &init[name];
                match geometry {
                    Some(Geometry::Stiefel) => {
                        // Stiefel retraction = f32 Polar Express msign of the init; its band
                        // needs σ_min/‖X‖_F inside the band's domain, checked for this init.
                        let r = pe_ratio(x());
                        assert!(r >= PE_DOMAIN, "{preset:?} {name}: σ_min/‖X‖_F = {r:e}");
                        assert_on_stiefel(&format!("{preset:?} {name}"), p);
                    }
                    Some(Geometry::DGram) => {
                        let d = matrix_diagnostics(name, p, usize::MAX).unwrap();
                        let s0 = matrix_diagnostics(name, x(), usize::MAX)
                            .unwrap()
                            .singular_values;
                        let (rho, s1, sigma_tol) = dgram_paper_bounds(x());
                        let off_tol = s1 * s1 * rho;
                        assert!(
                            d.off_gram <= off_tol,
                            "{preset:?} {name}: off-Gram {:e} > {off_tol:e}",
                            d.off_gram
                        );
                        // The paper's retraction keeps the init's singular values (sorted).
                        for (i, (s, s0)) in d.singular_values.iter().zip(&s0).enumerate() {
                            assert!(
                                (s - s0).abs() <= sigma_tol,
                                "{preset:?} {name}: σ_{i} = {s} vs init {s0} (± {sigma_tol:e})"
                            );
                        }
                    }
                    _ => {}
                }
            }
        }
        let names: Vec<&str> = groups.iter().map(|g| g.name()).collect();
        assert_eq!(
            names,
            [
                "attn_qkv",
                "attn_out",
                "mlp_in",
                "mlp_out",
                "embedding",
                "gain_bias"
            ]
        );
    }
}

#[test]
fn training_keeps_every_constraint_and_logs_the_dual_ascent() {
    let dir = temp("train");
    let (vs, mut task) = lm(&dir);
    let groups = modulewise_groups(&vs, &modulewise(Preset::Hetero), &train_config(4)).unwrap();
    let mut trainer = Trainer::with_groups(&vs, train_config(4), groups, &context()).unwrap();
    let (s, records) = run(&mut trainer, &mut task);
    assert_eq!(s.outcome, Outcome::Completed);
    let mut saw_stats = false;
    for r in &records {
        if let Record::Train {
            optimizers, loss, ..
        } = r
        {
            assert!(loss.is_finite());
            let qkv = &optimizers["attn_qkv"];
            assert_eq!(qkv.updates, 2, "one fused QKV matrix per layer");
            // Tall Stiefel matrices run the whole ascent; violations are reported.
            assert!(qkv.dual_steps.unwrap() >= 1.0 && qkv.violation.unwrap().is_finite());
            // Square Stiefel (attn.c_proj) uses the closed form A = W·S, S = msign(WᵀG − GᵀW):
            // one msign, tangent in exact arithmetic. Its reported violation ‖WᵀA + AᵀW‖_F/n
            // is (WᵀW − I)S + Sᵀ(WᵀW − I) + (S + Sᵀ) plus the f32 products W·S and Wᵀ·A: with W
            // and S in the f32 Polar Express band (σ within δ of 1, so ‖WᵀW − I‖_F ≤ √n(2δ + δ²)
            // and — S being within δ of the exact, skew msign in the 2-norm — ‖S + Sᵀ‖_F ≤ 2√n·δ)
            // and each product's rounding ≤ γ_n·‖|W|‖_F·‖|S|‖_F ≤ γ_n·n(1 + δ)²:
            // violation ≤ (2√n(2δ + δ²)(1 + δ) + 2√n·δ)/n + 2γ_n(1 + δ)² (1.6e-4 at n = 16).
            // (That S is within δ of the exact msign, not only σ-wise, is the band's reading
            // here; docs/optim.md states the band for σ.)
            let out = &optimizers["attn_out"];
            assert_eq!(out.dual_steps, Some(0.0));
            let (n, dl) = (16.0f64, PE_F32_BAND);
            let gamma = n * U32 / (1.0 - n * U32);
            let tangent_tol =
                (2.0 * n.sqrt() * stiefel_bound(dl) * (1.0 + dl) + 2.0 * n.sqrt() * dl) / n
                    + 2.0 * gamma * (1.0 + dl).powi(2);
            assert!(
                out.violation.unwrap() <= tangent_tol,
                "{out:?} > {tangent_tol:e}"
            );
            // mlp.c_fc (64×16) on DGram through the paper's f32 SVD retraction each step.
            let band = dgram_paper_band(64, 16);
            let v = optimizers["mlp_in"].manifold_violation_max.unwrap();
            assert!(v <= band, "mlp_in violation {v:e} > {band:e}");
            assert!(!optimizers.contains_key("embedding") || optimizers["embedding"].updates == 0);
            // Auto computes these 16-wide matrices' msign in f32 on every CPU (far below its
            // bf16 size rule), and the record says so; AdamW groups carry no count.
            for name in ["attn_qkv", "attn_out", "mlp_in", "mlp_out"] {
                assert_eq!(optimizers[name].msign_bf16, Some(0), "{name}");
            }
            if let Some(g) = optimizers.get("gain_bias") {
                assert_eq!(g.msign_bf16, None);
            }
            saw_stats = true;
        }
    }
    assert!(saw_stats);
    let last_eval = records
        .iter()
        .rev()
        .find_map(|r| match r {
            Record::Eval { matrices, .. } => Some(matrices.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(last_eval.len(), 8);
    for m in &last_eval {
        let label = ModuleLabel::of(&m.name).unwrap();
        if label.is_attention() {
            // Stiefel: each step ends with the f32 Polar Express msign of W − η·A; with W on
            // Stiefel and ‖A‖₂ ≤ 1 + δ its σ lie in 1 ± η(1 + δ), η ≤ muon_lr = 0.02, so
            // σ_min/‖X‖_F ≥ (1 − 0.03)/((1 + 0.03)√16) ≫ 1e-3: inside the band's domain.
            for s in [m.sigma_max, m.sigma_min] {
                assert!((s - 1.0).abs() <= PE_F32_BAND, "σ = {s}: {m:?}");
            }
            assert!(m.stiefel_violation <= stiefel_bound(PE_F32_BAND), "{m:?}");
        } else {
            // DGram through the paper's f32 SVD retraction: ‖Off(WᵀW)‖_F ≤ ŝ₁²·ρ with
            // ŝ₁² ≤ σ_max²/(1 − ρ) (see dgram_paper_band; tall orientation 64×16).
            let (rows, cols) = (m.shape.0.max(m.shape.1), m.shape.0.min(m.shape.1));
            let tol = dgram_paper_band(rows, cols) * m.sigma_max.powi(2);
            assert!(m.off_gram <= tol, "{m:?} > {tol:e}");
        }
    }
}

/// The msign-count signatures of the two solvers in one update's `DualReport` (kappa-optim
/// docs of `msign_calls`), which the groups' `OptimizerStats` average over updates (a linear
/// relation survives the mean): the dual ascent calls msign once per candidate and steps the
/// dual between candidates (msign = steps + 1); ADMM calls it twice per iteration, each
/// iteration one dual step, plus once for the certificate (msign = 2·steps + 1). With at least
/// one dual step the two cannot coincide.
#[derive(Debug, PartialEq)]
enum SolverSeen {
    Ascent,
    Admm,
}

fn solver_seen(stats: &kappa_train::OptimizerStats) -> SolverSeen {
    let (steps, calls) = (stats.dual_steps.unwrap(), stats.msign_calls.unwrap());
    assert!(
        steps >= 1.0,
        "{stats:?}: no dual step, the solvers look alike"
    );
    if calls == steps + 1.0 {
        SolverSeen::Ascent
    } else if calls == 2.0 * steps + 1.0 {
        SolverSeen::Admm
    } else {
        panic!("{stats:?}: neither solver's msign count")
    }
}

#[test]
fn modulewise_groups_hand_each_label_its_solver() {
    // HETERO (Stiefel attention, DGram MLP) with ADMM for attention and the preset's dual ascent
    // for the MLP. ADMM with `OnDivergence::Apply`: the preset's policy for the ascent (apply a
    // diverged step and count it in `diverged`), which `Admm::standard()` (an error) does not
    // share (docs/optim.md, "ADMM: the same problem split in two").
    let admm = DualSolver::Admm(Admm {
        on_divergence: OnDivergence::Apply,
        ..Admm::standard()
    });
    let mut cfg = modulewise(Preset::Hetero);
    cfg.solvers = ModuleSolvers::attention_mlp(Some(admm), None);
    let dir = temp("solvers");
    let (vs, mut task) = lm(&dir);
    let groups = modulewise_groups(&vs, &cfg, &train_config(2)).unwrap();
    let mut trainer = Trainer::with_groups(&vs, train_config(2), groups, &context()).unwrap();
    let (s, records) = run(&mut trainer, &mut task);
    assert_eq!(s.outcome, Outcome::Completed);
    let mut windows = 0;
    for r in &records {
        let Record::Train { optimizers, .. } = r else {
            continue;
        };
        windows += 1;
        let qkv = &optimizers["attn_qkv"];
        assert_eq!(solver_seen(qkv), SolverSeen::Admm, "attn_qkv");
        // ≤ 10 iterations (`standard()`): ≤ 21 msign calls per update.
        assert!(qkv.msign_calls.unwrap() <= 21.0, "{qkv:?}");
        for label in ["mlp_in", "mlp_out"] {
            assert_eq!(
                solver_seen(&optimizers[label]),
                SolverSeen::Ascent,
                "{label}"
            );
        }
        // The square attn.c_proj takes the Stiefel closed form whatever the solver (one msign,
        // no dual step; kappa-optim's `ManifoldMuonConfig::solver`).
        let out = &optimizers["attn_out"];
        assert_eq!((out.dual_steps, out.msign_calls), (Some(0.0), Some(1.0)));
        for g in ["attn_qkv", "mlp_in", "mlp_out"] {
            let v = optimizers[g].manifold_violation_max.unwrap();
            assert!(v.is_finite(), "{g}: {v}");
        }
    }
    assert_eq!(windows, 2, "log_every 1, two steps");
    // Without the table every label runs the ascent (the preset: configs read as before).
    let dir = temp("solvers-default");
    let (vs, mut task) = lm(&dir);
    let groups = modulewise_groups(&vs, &modulewise(Preset::Hetero), &train_config(2)).unwrap();
    let mut trainer = Trainer::with_groups(&vs, train_config(2), groups, &context()).unwrap();
    let (_, records) = run(&mut trainer, &mut task);
    let stats = records.iter().find_map(|r| match r {
        Record::Train { optimizers, .. } => Some(optimizers["attn_qkv"].clone()),
        _ => None,
    });
    assert_eq!(solver_seen(&stats.unwrap()), SolverSeen::Ascent);
}

#[test]
fn split_qkv_constrains_each_projection() {
    let vs = nn::VarStore::new(Device::Cpu);
    let _gpt = seeded(0, || Gpt::new(&vs.root(), GptConfig::tiny(11))).unwrap();
    let mut cfg = modulewise(Preset::AllStiefel);
    cfg.assignment.split_qkv = true;
    let init: Vec<Tensor> = named_trainable(&vs)
        .into_iter()
        .filter(|(n, _)| n.ends_with("attn.c_attn.weight"))
        .map(|(_, t)| t.copy())
        .collect();
    let groups = modulewise_groups(&vs, &cfg, &train_config(4)).unwrap();
    let opt = kappa_optim::Optimizer::new(groups).unwrap();
    let qkv = &opt.groups()[0];
    assert_eq!(qkv.name(), "attn_qkv");
    let d = 16;
    for (p, x) in qkv.params().iter().zip(&init) {
        for i in 0..3 {
            // Each d×d slice was retracted on its own: the Polar Express band, its domain
            // checked on the slice of the init.
            let r = pe_ratio(&x.narrow(0, i * d, d));
            assert!(r >= PE_DOMAIN, "block {i}: σ_min/‖X‖_F = {r:e}");
            assert_on_stiefel(&format!("block {i}"), &p.narrow(0, i * d, d));
        }
    }
    // The fused block is then not on Stiefel: WᵀW = Σᵢ BᵢᵀBᵢ with every σ(Bᵢ) ∈ [1 − δ, 1 + δ],
    // so 3(1 − δ)² ≤ λ_max(WᵀW) ≤ 3(1 + δ)² and |σ_max − √3| ≤ √3·δ (δ the f32 band).
    let fused = matrix_diagnostics("fused", &qkv.params()[0], 64).unwrap();
    let tol = 3f64.sqrt() * PE_F32_BAND;
    assert!(
        (fused.sigma_max - 3f64.sqrt()).abs() <= tol,
        "{fused:?} (± {tol:e})"
    );
}

#[test]
fn a_resumed_modulewise_run_matches_the_uninterrupted_one() {
    // The paper's HETERO-INV, and unconstrained Muon with every Muon variant on (NorMuon's
    // second moments are checkpointed beside the momentum).
    let mut variants = modulewise(Preset::Unconstrained);
    variants.muon.normuon = Some(kappa_optim::NorMuon::default());
    variants.muon.cautious_weight_decay = true;
    variants.lr_multipliers.attention_qkv = 0.5;
    // Batched Muon: same-shape row blocks stepped together, a run compared with itself.
    let batched = ModulewiseConfig {
        batch: true,
        ..variants
    };
    // Batched manifold groups: the same-shape blocks' dual ascents in lock step.
    let hetero_batched = ModulewiseConfig {
        batch: true,
        ..modulewise(Preset::Hetero)
    };
    for (name, cfg) in [
        ("hetero-inv", modulewise(Preset::HeteroInv)),
        ("variants", variants),
        ("batched", batched),
        ("hetero-batched", hetero_batched),
    ] {
        resumed_run_matches(name, &cfg);
    }
}

fn resumed_run_matches(name: &str, cfg: &ModulewiseConfig) {
    let dir = temp(&format!("resume-{name}"));
    let ckpt = dir.join("ckpt.safetensors");
    let losses = |records: &[Record]| -> Vec<String> {
        records
            .iter()
            .filter_map(|r| match r {
                Record::Train { step, loss, .. } => Some(format!("{step} {loss:e}")),
                _ => None,
            })
            .collect()
    };
    // One thread, f32 msign, in this process: the same operations in the same order (and the
    // same LAPACK SVD in the DGram retraction) give the same bits, so the losses are compared
    // exactly. Not across processes or machines: MKL and OpenBLAS SVDs and GEMMs differ in the
    // last bits. The thread count is put in force before the groups retract the initial weights
    // (see `a_variant_trains_alike_whatever_thread_count_its_thread_had`).
    context().apply_threads();
    let full = {
        let (vs, mut task) = lm(&dir);
        let groups = modulewise_groups(&vs, cfg, &train_config(5)).unwrap();
        let mut t = Trainer::with_groups(&vs, train_config(5), groups, &context()).unwrap();
        losses(&run(&mut t, &mut task).1)
    };
    let first = {
        let (vs, mut task) = lm(&dir);
        let groups = modulewise_groups(&vs, cfg, &train_config(5)).unwrap();
        let mut t = Trainer::with_groups(&vs, train_config(5), groups, &context()).unwrap();
        t.stop_after(2);
        let mut records = Vec::new();
        let mut sink = |r: &Record| -> Result<(), ModelsError> {
            records.push(r.clone());
            Ok(())
        };
        let s = t.run(&mut task, &mut sink, Some(&ckpt)).unwrap();
        assert_eq!(s.outcome, Outcome::Interrupted { step: 2 });
        losses(&records)
    };
    let second = {
        let (vs, mut task) = lm(&dir);
        let groups = modulewise_groups(&vs, cfg, &train_config(5)).unwrap();
        let mut t = Trainer::with_groups(&vs, train_config(5), groups, &context()).unwrap();
        t.load_checkpoint(&ckpt).unwrap();
        assert_eq!(t.step(), 2);
        losses(&run(&mut t, &mut task).1)
    };
    let resumed: Vec<String> = first.into_iter().chain(second).collect();
    assert_eq!(resumed, full, "{name}");
}

/// Regression: CI once saw `hetero-inv` resume 1 ulp away from its uninterrupted run at step 2.
/// Its groups had been built (the initial weights retracted onto their manifolds, through MKL's
/// `syrk`, whose 32×96 Gram product rounds differently on one thread and on two) before the
/// trainer set the run's one thread, so at whatever count the test's thread had: two where it
/// ran libtorch before any other test had set one. `train_variant` now applies the run's count
/// before it builds anything; here two threads that start at different counts train alike.
#[test]
fn a_variant_trains_alike_whatever_thread_count_its_thread_had() {
    let losses_from = |threads_before: i32| {
        std::thread::spawn(move || {
            tch::set_num_threads(threads_before);
            let dir = temp(&format!("threads-before-{threads_before}"));
            let corpus =
                TextCorpus::load_sotu(&dir, TokenizerKind::Char, None, Device::Cpu).unwrap();
            let cfg = modulewise(Preset::HeteroInv);
            let train = train_config(3);
            let mut run = Run::create(&dir.join("run"), context(), &train).unwrap();
            let model = GptConfig::tiny(0);
            let variant = VariantId {
                index: 0,
                name: "hetero-inv",
            };
            let groups = |vs: &nn::VarStore| Ok(modulewise_groups(vs, &cfg, &train)?);
            train_language_model::<Box<dyn std::error::Error>>(
                &mut run, variant, &train, model, corpus, groups, 1,
            )
            .unwrap();
            run.metrics::<MetricsLine>()
                .unwrap()
                .into_iter()
                .filter_map(|l| match l.record {
                    Some(Record::Train { step, loss, .. }) => Some(format!("{step} {loss:e}")),
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap()
    };
    let (two, one) = (losses_from(2), losses_from(1));
    assert_eq!(two.len(), 3);
    assert_eq!(two, one);
}

/// A task whose loss is scripted: it falls, then climbs back to 1.6× its lowest value.
struct Scripted {
    w: Tensor,
}

impl Task for Scripted {
    fn unit(&self) -> &'static str {
        "items"
    }
    fn train_loss(
        &mut self,
        step: u64,
        _b: usize,
        _part: kappa_train::Part,
    ) -> kappa_models::Result<(Tensor, u64)> {
        let value = if step < 20 {
            2.0 - 0.05 * step as f64
        } else {
            1.0 + 0.1 * (step - 20) as f64
        };
        Ok((self.w.sum(tch::Kind::Float) * 0.0 + value, 1))
    }
    fn evaluate(&mut self, _n: usize, _b: usize) -> kappa_models::Result<Eval> {
        Ok(Eval {
            loss: 0.0,
            accuracy: None,
        })
    }
    fn diagnostics(
        &mut self,
        _c: &kappa_models::DiagnosticsConfig,
    ) -> kappa_models::Result<Vec<HeadDiagnostics>> {
        Ok(Vec::new())
    }
}

#[test]
fn a_loss_that_climbs_back_from_its_best_is_divergence_against_the_best() {
    let make = |reference| {
        let vs = nn::VarStore::new(Device::Cpu);
        let w = vs.root().var("w", &[2], nn::Init::Const(1.0));
        let cfg = TrainConfig {
            steps: 60,
            warmup_steps: 0,
            eval_every: 100,
            log_every: 100,
            divergence_factor: 1.5,
            divergence_reference: reference,
            diagnostics: kappa_models::DiagnosticsConfig {
                enabled: false,
                ..Default::default()
            },
            ..TrainConfig::default()
        };
        let mut trainer = Trainer::new(&vs, cfg, &context()).unwrap();
        run(&mut trainer, &mut Scripted { w }).0.outcome
    };
    // Against the first loss (2.0) the climb to 3.9 only exceeds 1.5 × 2.0 = 3.0 at step 40.
    let Outcome::Diverged { step: first, .. } = make(DivergenceReference::First) else {
        panic!("no divergence against the first loss")
    };
    assert_eq!(first, 41);
    // Against the best smoothed loss it is caught earlier, and the reason says so.
    let Outcome::Diverged { step, reason } = make(DivergenceReference::Best) else {
        panic!("no divergence against the best loss")
    };
    assert!(step > 20 && step < first, "{step}");
    assert!(reason.contains("best"), "{reason}");
}

/// The bound on |‖w_j‖² − 1| of an f32 Oblique retraction with m-row columns, measured in f64
/// (kappa-optim's `tests/muon/oblique.rs`, `oblique_bound`: ≤ m + 8 rounded factors in f32 —
/// the squared norm's m, then √, 1/d, the cast of 1/d to f32 and the product, each squared —
/// plus the f64 measure's γ_m(2⁻⁵³)).
fn oblique_f32_bound(m: usize) -> f64 {
    let g = |k: usize, u: f64| k as f64 * u / (1.0 - k as f64 * u);
    g(m + 8, U32) + g(m, f64::EPSILON / 2.0) * (1.0 + g(m + 8, U32))
}

/// max_j |‖w_j‖² − 1| of `t` in its tall orientation (f64), and the column length m.
fn unit_column_error(t: &Tensor) -> (f64, usize) {
    let w = tall(t).to_kind(Kind::Double);
    let norms = (&w * &w).sum_dim_intlist(0, false, Kind::Double);
    let err = (norms - 1.0).abs().max().double_value(&[]);
    (err, w.size()[0] as usize)
}

#[test]
fn an_oblique_assignment_trains_and_keeps_unit_columns() {
    // The serde name a module-wise config writes for it.
    assert_eq!(
        serde_json::to_string(&Geometry::Oblique).unwrap(),
        r#""oblique""#
    );
    let mut cfg = modulewise(Preset::Unconstrained);
    cfg.assignment.attention_qkv = serde_json::from_str(r#""oblique""#).unwrap();
    cfg.assignment.mlp_out = Geometry::Oblique;
    let back: ModulewiseConfig =
        serde_json::from_str(&serde_json::to_string(&cfg).unwrap()).unwrap();
    assert_eq!(back, cfg);
    let dir = temp("oblique");
    let (vs, mut task) = lm(&dir);
    let groups = modulewise_groups(&vs, &cfg, &train_config(2)).unwrap();
    let opt = kappa_optim::Optimizer::new(groups).unwrap();
    let oblique: Vec<&str> = ["attn_qkv", "mlp_out"].into();
    for g in opt.groups().iter().filter(|g| oblique.contains(&g.name())) {
        assert_eq!(g.lr(), 0.02, "{}", g.name());
        for (name, p) in g.names().iter().zip(g.params()) {
            // Retracted at construction: unit columns (mlp.c_proj is wide: unit rows).
            let (e, m) = unit_column_error(p);
            assert!(e <= oblique_f32_bound(m), "{name} init: {e:e}");
        }
    }
    let mut trainer = Trainer::with_optimizer(&vs, train_config(2), opt, &context()).unwrap();
    let (s, records) = run(&mut trainer, &mut task);
    assert_eq!(s.outcome, Outcome::Completed);
    let mut steps = 0;
    for r in &records {
        if let Record::Train {
            optimizers, loss, ..
        } = r
        {
            assert!(loss.is_finite());
            for label in &oblique {
                let o = &optimizers[*label];
                assert_eq!(o.updates, 2, "{label}: one matrix per layer");
                // The library's f32 measure of the retracted W: the retraction's γ_{m+8} plus
                // its own f32 squared norms (γ_m); m ≤ 64 rows (the tall side).
                let m = 64;
                let g = |k: usize| k as f64 * U32 / (1.0 - k as f64 * U32);
                let v = o.manifold_violation_max.unwrap();
                assert!(v <= g(m + 8) + g(m), "{label}: {v:e}");
                assert!(o.violation.unwrap().is_finite() && o.msign_calls.unwrap() >= 1.0);
            }
            steps += 1;
        }
    }
    assert_eq!(steps, 2);
    for (name, p) in named_trainable(&vs) {
        let label = ModuleLabel::of(&name).unwrap();
        if matches!(label, ModuleLabel::AttentionQkv | ModuleLabel::MlpOut) {
            let (e, m) = unit_column_error(&p);
            assert!(e <= oblique_f32_bound(m), "{name} after training: {e:e}");
        }
    }
}

#[test]
fn modulewise_groups_place_any_model_a_labelling_places_and_name_what_they_cannot() {
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let blocks = &root / "blocks" / "0";
    let _ = seeded(0, || {
        (
            (&blocks / "attn").randn("qkv", &[48, 16], 0.0, 0.02),
            (&blocks / "mlp").randn("up", &[64, 16], 0.0, 0.02),
            (&blocks / "mlp").zeros("up_bias", &[64]),
            root.randn("tok_embeddings", &[20, 16], 0.0, 0.02),
        )
    });
    // kappa's GPT names are not these: every variable is named in the error.
    let err = modulewise_groups(&vs, &modulewise(Preset::Hetero), &train_config(4))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("4 trainable variable(s) have no module label"),
        "{err}"
    );
    assert!(
        err.contains("`blocks.0.attn.qkv`") && err.contains("`tok_embeddings`"),
        "{err}"
    );
    let label = |name: &str, t: &Tensor| match name {
        n if n.ends_with("attn.qkv") => Some(ModuleLabel::AttentionQkv),
        n if n.ends_with("mlp.up") => Some(ModuleLabel::MlpIn),
        n if n.contains("embeddings") => Some(ModuleLabel::Embedding),
        _ if t.dim() == 1 => Some(ModuleLabel::Bias),
        _ => None,
    };
    let cfg = modulewise(Preset::Hetero);
    let groups = modulewise_groups_by(&vs, &cfg, &train_config(4), label).unwrap();
    let names: Vec<(&str, usize)> = groups.iter().map(|g| (g.name(), g.names().len())).collect();
    assert_eq!(
        names,
        [
            ("attn_qkv", 1),
            ("mlp_in", 1),
            ("embedding", 1),
            ("gain_bias", 1)
        ]
    );
    let opt = kappa_optim::Optimizer::new(groups).unwrap();
    // HETERO: Stiefel attention (retracted when the optimizer was built).
    assert_on_stiefel("blocks.0.attn.qkv", &opt.groups()[0].params()[0]);
}
