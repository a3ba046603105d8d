//! Module-wise optimizer assignment on a tiny GPT: labels, presets, initial retraction,
//! constraints kept through training, dual-ascent statistics in the records, exact resume with
//! Muon and manifold-Muon state, and divergence against the best smoothed loss.

use std::path::PathBuf;

use kappa_models::data::fixtures;
use kappa_models::train::named_trainable;
use kappa_models::{
    matrix_diagnostics, modulewise_groups, seeded, DivergenceReference, Eval, Geometry, Gpt,
    GptConfig, HeadDiagnostics, LanguageModeling, ModelsError, ModuleLabel, ModulewiseConfig,
    Outcome, Preset, Record, Task, TextCorpus, TokenizerKind, TrainConfig, Trainer,
};
use kappa_optim::Precision;
use tch::{nn, Device, Tensor};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kappa-modulewise-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    fixtures::write_sotu(&dir).unwrap();
    dir
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
        threads: 1,
        progress: false,
        seed: 3,
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

fn lm(dir: &std::path::Path) -> (nn::VarStore, LanguageModeling) {
    let corpus = TextCorpus::load_sotu(dir, TokenizerKind::Char, None, Device::Cpu).unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = GptConfig::tiny(corpus.tokenizer.vocab_size());
    let gpt = seeded(1, || Gpt::new(&vs.root(), cfg)).unwrap();
    (vs, LanguageModeling::new(gpt, corpus, 3).unwrap())
}

fn run(trainer: &mut Trainer<'_>, task: &mut impl Task) -> (kappa_models::Summary, Vec<Record>) {
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
    let _gpt = Gpt::new(
        &vs.root(),
        GptConfig {
            bias: true,
            ..GptConfig::tiny(11)
        },
    )
    .unwrap();
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
    let _gpt = Gpt::new(&vs.root(), GptConfig::tiny(11)).unwrap();
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
}

#[test]
fn groups_put_constrained_matrices_on_their_manifolds() {
    for preset in Preset::ALL {
        let vs = nn::VarStore::new(Device::Cpu);
        let _gpt = seeded(0, || Gpt::new(&vs.root(), GptConfig::tiny(11))).unwrap();
        let groups = modulewise_groups(&vs, &modulewise(preset), &train_config(4)).unwrap();
        let a = preset.assignment();
        for g in &groups {
            let label = ModuleLabel::of(&g.names[0]).unwrap();
            let geometry = a.geometry(label);
            match geometry {
                Some(Geometry::Muon | Geometry::Stiefel | Geometry::DGram) => {
                    assert!((g.lr_scale - 0.02 / 6e-4).abs() < 1e-9, "{}", g.name)
                }
                _ => assert_eq!(g.lr_scale, 1.0, "{}", g.name),
            }
            for (name, p) in g.names.iter().zip(&g.params) {
                let d = matrix_diagnostics(name, p, 64);
                match geometry {
                    Some(Geometry::Stiefel) => {
                        let d = d.unwrap();
                        assert!(d.stiefel_violation < 1e-4, "{preset:?} {name}: {d:?}");
                    }
                    Some(Geometry::DGram) => {
                        let d = d.unwrap();
                        assert!(
                            d.off_gram < 1e-4 * d.sigma_max.powi(2),
                            "{preset:?} {name}: {d:?}"
                        );
                        // The paper's retraction keeps the init's singular values.
                        assert!(d.sigma_max > 0.02 && d.sigma_max < 0.5, "{name}: {d:?}");
                    }
                    _ => {}
                }
            }
        }
        let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
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
    let mut trainer = Trainer::with_groups(&vs, train_config(4), groups).unwrap();
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
            // Square Stiefel (attn.c_proj) uses the closed form: one msign, tangent exactly.
            let out = &optimizers["attn_out"];
            assert_eq!(out.dual_steps, Some(0.0));
            assert!(out.violation.unwrap() < 1e-4, "{out:?}");
            assert!(optimizers["mlp_in"].manifold_violation_max.unwrap() < 1e-3);
            assert!(!optimizers.contains_key("embedding") || optimizers["embedding"].updates == 0);
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
            assert!(m.stiefel_violation < 1e-3, "{m:?}");
            assert!((m.sigma_max - 1.0).abs() < 1e-3);
        } else {
            assert!(m.off_gram < 1e-3 * m.sigma_max.powi(2), "{m:?}");
        }
    }
}

#[test]
fn split_qkv_constrains_each_projection() {
    let vs = nn::VarStore::new(Device::Cpu);
    let _gpt = seeded(0, || Gpt::new(&vs.root(), GptConfig::tiny(11))).unwrap();
    let mut cfg = modulewise(Preset::AllStiefel);
    cfg.assignment.split_qkv = true;
    let groups = modulewise_groups(&vs, &cfg, &train_config(4)).unwrap();
    let qkv = &groups[0];
    assert_eq!(qkv.name, "attn_qkv");
    let d = 16;
    for p in &qkv.params {
        for i in 0..3 {
            let block = p.narrow(0, i * d, d);
            let m = matrix_diagnostics("block", &block, 64).unwrap();
            assert!(m.stiefel_violation < 1e-4, "block {i}: {m:?}");
        }
    }
    // The fused block is then not on Stiefel: WᵀW = 3I.
    let fused = matrix_diagnostics("fused", &qkv.params[0], 64).unwrap();
    assert!((fused.sigma_max - 3f64.sqrt()).abs() < 1e-4, "{fused:?}");
}

#[test]
fn a_resumed_modulewise_run_matches_the_uninterrupted_one() {
    let dir = temp("resume");
    let ckpt = dir.join("ckpt.safetensors");
    let cfg = modulewise(Preset::HeteroInv);
    let losses = |records: &[Record]| -> Vec<String> {
        records
            .iter()
            .filter_map(|r| match r {
                Record::Train { step, loss, .. } => Some(format!("{step} {loss:e}")),
                _ => None,
            })
            .collect()
    };
    // One thread, f32 msign: the same operations in the same order give the same bits.
    let full = {
        let (vs, mut task) = lm(&dir);
        let groups = modulewise_groups(&vs, &cfg, &train_config(5)).unwrap();
        let mut t = Trainer::with_groups(&vs, train_config(5), groups).unwrap();
        losses(&run(&mut t, &mut task).1)
    };
    let first = {
        let (vs, mut task) = lm(&dir);
        let groups = modulewise_groups(&vs, &cfg, &train_config(5)).unwrap();
        let mut t = Trainer::with_groups(&vs, train_config(5), groups).unwrap();
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
        let groups = modulewise_groups(&vs, &cfg, &train_config(5)).unwrap();
        let mut t = Trainer::with_groups(&vs, train_config(5), groups).unwrap();
        t.load_checkpoint(&ckpt).unwrap();
        assert_eq!(t.step(), 2);
        losses(&run(&mut t, &mut task).1)
    };
    let resumed: Vec<String> = first.into_iter().chain(second).collect();
    assert_eq!(resumed, full);
}

/// A task whose loss is scripted: it falls, then climbs back to 1.6× its lowest value.
struct Scripted {
    w: Tensor,
}

impl Task for Scripted {
    fn unit(&self) -> &'static str {
        "items"
    }
    fn train_loss(&mut self, step: u64, _b: usize) -> kappa_models::Result<(Tensor, u64)> {
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
            progress: false,
            divergence_factor: 1.5,
            divergence_reference: reference,
            diagnostics: kappa_models::DiagnosticsConfig {
                enabled: false,
                ..Default::default()
            },
            ..TrainConfig::default()
        };
        let mut trainer = Trainer::new(&vs, cfg).unwrap();
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
