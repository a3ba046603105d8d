//! The training loop end to end on tiny models and fixture data: determinism, checkpoints,
//! exact resume, divergence detection, config validation, AdamW against libtorch's.

use std::path::PathBuf;

use kappa_models::data::fixtures;
use kappa_models::{
    CorrectionConfig, FashionMnist, Gpt, GptConfig, HeadLayout, ModelsError, TextCorpus,
    TokenizerKind, Vit, VitConfig,
};
use kappa_train::trainer::{adamw_groups, named_trainable};
use kappa_train::{
    seeded, ImageClassification, LanguageModeling, Outcome, Record, RunContext, Task, TrainConfig,
    Trainer,
};
use tch::{nn, Device, Kind, Tensor};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kappa-train-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn config(steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        batch_size: 4,
        lr: 3e-3,
        min_lr: 3e-4,
        warmup_steps: 2,
        eval_every: 3,
        eval_batches: 2,
        log_every: 1,
        diagnostics: kappa_models::DiagnosticsConfig {
            enabled: true,
            samples: 2,
            jacobian_max_tokens: 8,
        },
        ..TrainConfig::default()
    }
}

/// Seed 5, one libtorch thread, no progress bar.
fn context() -> RunContext {
    RunContext {
        seed: 5,
        threads: 1,
        ..RunContext::default()
    }
    .quiet()
}

fn lm_task(
    dir: &std::path::Path,
    correction: CorrectionConfig,
    init_seed: u64,
) -> (nn::VarStore, LanguageModeling) {
    let corpus = TextCorpus::load_sotu(dir, TokenizerKind::Char, None, Device::Cpu).unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = GptConfig::tiny(corpus.tokenizer.vocab_size()).with_correction(correction);
    let gpt = seeded(init_seed, || Gpt::new(&vs.root(), cfg)).unwrap();
    (vs, LanguageModeling::new(gpt, corpus, 5).unwrap())
}

fn collect(records: &mut Vec<Record>) -> impl FnMut(&Record) -> Result<(), ModelsError> + '_ {
    move |r| {
        records.push(r.clone());
        Ok(())
    }
}

/// The parts of a record that must reproduce (no timings).
fn reproducible(r: &Record) -> String {
    match r {
        Record::Train {
            step,
            loss,
            lr,
            grad_norm,
            ..
        } => format!("train {step} {loss:e} {lr:e} {grad_norm:e}"),
        other => serde_json::to_string(other).unwrap(),
    }
}

#[test]
fn same_seed_and_threads_give_identical_losses() {
    let dir = temp("det");
    fixtures::write_sotu(&dir).unwrap();
    let run = || {
        let (vs, mut task) = lm_task(&dir, CorrectionConfig::Svd { every: 2 }, 1);
        let mut trainer = Trainer::new(&vs, config(6), &context()).unwrap();
        let mut records = Vec::new();
        let s = trainer
            .run(&mut task, &mut collect(&mut records), None)
            .unwrap();
        assert_eq!(s.outcome, Outcome::Completed);
        records.iter().map(reproducible).collect::<Vec<_>>()
    };
    // Bitwise, within this process: the same seed, one thread, the same kernels (and the same
    // LAPACK SVD for the conditioning) run the same operations in the same order. Nothing here
    // is compared across processes or machines, where MKL and OpenBLAS round differently.
    let (a, b) = (run(), run());
    assert_eq!(a.len(), 6 + 2);
    assert_eq!(a, b);
    // The loss goes down on this tiny repetitive text: a learning claim, not a comparison of
    // two roundings (the drop over 5 steps is O(0.1) nats, rounding moves the loss by O(1e-6)).
    let losses: Vec<f64> = a
        .iter()
        .filter_map(|l| l.strip_prefix("train "))
        .map(|l| l.split(' ').nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(losses[5] < losses[0], "{losses:?}");
}

#[test]
fn checkpoints_round_trip_and_a_resumed_run_matches_the_uninterrupted_one() {
    let dir = temp("resume");
    fixtures::write_sotu(&dir).unwrap();
    let correction = CorrectionConfig::ScaleAware {
        target_kappa: 1.5,
        layout: HeadLayout::SameBlock,
        every: 2,
    };
    // The run's one thread in force before the models are built (`RunContext::apply_threads`):
    // the runs are compared bit for bit.
    context().apply_threads();
    // Uninterrupted: 7 steps.
    let (vs_a, mut task_a) = lm_task(&dir, correction, 1);
    let mut a = Trainer::new(&vs_a, config(7), &context()).unwrap();
    let mut rec_a = Vec::new();
    a.run(&mut task_a, &mut collect(&mut rec_a), None).unwrap();

    // Interrupted after 4 steps, then resumed into a fresh model with another init.
    let ckpt = dir.join("run/ckpt.safetensors");
    let (vs_b, mut task_b) = lm_task(&dir, correction, 1);
    let mut b = Trainer::new(&vs_b, config(7), &context()).unwrap();
    b.stop_after(4);
    let mut rec_b = Vec::new();
    let s = b
        .run(&mut task_b, &mut collect(&mut rec_b), Some(&ckpt))
        .unwrap();
    assert_eq!(s.outcome, Outcome::Interrupted { step: 4 });

    let (vs_c, mut task_c) = lm_task(&dir, correction, 99);
    let mut c = Trainer::new(&vs_c, config(7), &context()).unwrap();
    c.load_checkpoint(&ckpt).unwrap();
    assert_eq!(c.step(), 4);
    // Bit-for-bit: every variable (weights and the λ buffers) equals the saved run's.
    for (name, t) in vs_b.variables() {
        assert!(t.equal(&vs_c.variables()[&name]), "{name}");
    }
    // ... and writing the restored state again gives the same tensors.
    let again = dir.join("again.safetensors");
    c.save_checkpoint(&again).unwrap();
    let read = |p: &std::path::Path| {
        let mut v = Tensor::read_safetensors(p).unwrap();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    let (x, y) = (read(&ckpt), read(&again));
    assert_eq!(x.len(), y.len());
    assert!(x
        .iter()
        .any(|(n, _)| n.starts_with("optim/state/") && n.ends_with("/exp_avg_sq")));
    for ((nx, tx), (ny, ty)) in x.iter().zip(&y) {
        assert_eq!(nx, ny);
        assert!(tx.equal(ty), "{nx}");
    }
    let mut rec_c = Vec::new();
    let s = c.run(&mut task_c, &mut collect(&mut rec_c), None).unwrap();
    assert_eq!(s.outcome, Outcome::Completed);

    // Bitwise, within this process (one thread): the resumed run replays the uninterrupted
    // one's operations on the restored bits, the scale-aware λ's SVD included (the same LAPACK
    // here; across machines MKL and OpenBLAS would differ in the last bits, so no comparison
    // crosses a process).
    let resumed: Vec<String> = rec_b.iter().chain(&rec_c).map(reproducible).collect();
    let straight: Vec<String> = rec_a.iter().map(reproducible).collect();
    assert_eq!(resumed, straight);
    for (name, t) in vs_a.variables() {
        assert!(t.equal(&vs_c.variables()[&name]), "final {name}");
    }

    // A checkpoint from another seed or another model is refused.
    let other_seed = context().with_seed(6);
    let (vs_d, _t) = lm_task(&dir, correction, 1);
    let err = Trainer::new(&vs_d, config(7), &other_seed)
        .unwrap()
        .load_checkpoint(&ckpt)
        .unwrap_err();
    assert!(err.to_string().contains("seed"), "{err}");
    let (vs_e, _t) = lm_task(&dir, CorrectionConfig::None, 1);
    assert!(Trainer::new(&vs_e, config(7), &context())
        .unwrap()
        .load_checkpoint(&ckpt)
        .is_err());
}

#[test]
fn an_exploding_loss_is_detected_and_recorded() {
    let dir = temp("diverge");
    fixtures::write_sotu(&dir).unwrap();
    let (vs, mut task) = lm_task(&dir, CorrectionConfig::None, 2);
    let mut cfg = config(50);
    // The largest lr a config may set: AdamW moves every weight by about 10 a step.
    cfg.lr = kappa_train::trainer::MAX_LR;
    cfg.min_lr = 1.0;
    cfg.grad_clip = 0.0;
    cfg.weight_decay = 0.0;
    let mut trainer = Trainer::new(&vs, cfg, &context()).unwrap();
    let mut records = Vec::new();
    let s = trainer
        .run(&mut task, &mut collect(&mut records), None)
        .unwrap();
    let Outcome::Diverged { step, reason } = s.outcome else {
        panic!("not diverged: {:?}", s.outcome)
    };
    assert!(step < 50 && step > 0, "{step}");
    assert!(reason.contains("loss"), "{reason}");
    assert!(matches!(records.last(), Some(Record::Diverged { .. })));
}

/// A task whose loss becomes NaN at step 3.
struct Poisoned(LanguageModeling);

impl Task for Poisoned {
    fn unit(&self) -> &'static str {
        "tokens"
    }
    fn train_loss(
        &mut self,
        step: u64,
        b: usize,
        part: kappa_train::Part,
    ) -> kappa_models::Result<(Tensor, u64)> {
        let (l, n) = self.0.train_loss(step, b, part)?;
        Ok((if step == 3 { l * f64::NAN } else { l }, n))
    }
    fn evaluate(&mut self, n: usize, b: usize) -> kappa_models::Result<kappa_train::Eval> {
        self.0.evaluate(n, b)
    }
    fn diagnostics(
        &mut self,
        c: &kappa_models::DiagnosticsConfig,
    ) -> kappa_models::Result<Vec<kappa_models::HeadDiagnostics>> {
        self.0.diagnostics(c)
    }
}

#[test]
fn a_non_finite_loss_stops_the_run() {
    let dir = temp("nan");
    fixtures::write_sotu(&dir).unwrap();
    let (vs, task) = lm_task(&dir, CorrectionConfig::None, 3);
    let mut task = Poisoned(task);
    let mut trainer = Trainer::new(&vs, config(10), &context()).unwrap();
    let mut records = Vec::new();
    let s = trainer
        .run(&mut task, &mut collect(&mut records), None)
        .unwrap();
    assert_eq!(
        s.outcome,
        Outcome::Diverged {
            step: 3,
            reason: "loss is NaN".into()
        }
    );
    assert_eq!(trainer.step(), 3);
}

#[test]
fn invalid_configs_name_the_field() {
    type Mutation = Box<dyn Fn(&mut TrainConfig)>;
    let cases: Vec<(Mutation, &str)> = vec![
        (Box::new(|c| c.steps = 0), "train.steps"),
        (Box::new(|c| c.lr = f64::NAN), "train.lr"),
        (Box::new(|c| c.min_lr = 1.0), "train.min_lr"),
        (Box::new(|c| c.warmup_steps = 10), "train.warmup_steps"),
        (Box::new(|c| c.beta2 = 1.0), "train.beta2"),
        (
            Box::new(|c| c.divergence_factor = 1.0),
            "train.divergence_factor",
        ),
        (Box::new(|c| c.eval_every = 0), "train.eval_every"),
    ];
    for (mutate, field) in cases {
        let mut c = config(10);
        mutate(&mut c);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    let text = toml::to_string(&config(10)).unwrap();
    assert_eq!(TrainConfig::from_toml(&text).unwrap(), config(10));
    assert!(TrainConfig::from_toml("steps = 1\nunknown = 3").is_err());
}

#[test]
fn the_schedule_warms_up_then_follows_the_cosine() {
    let c = TrainConfig {
        steps: 110,
        warmup_steps: 10,
        lr: 1.0,
        min_lr: 0.1,
        ..TrainConfig::default()
    };
    // Warmup: lr·(i + 1)/(w + 1) with lr = 1 and small integers is one correctly rounded f64
    // division, the same operation as the literal's, so the bits agree on every machine.
    assert_eq!(c.lr_at(0), 1.0 / 11.0);
    assert_eq!(c.lr_at(9), 10.0 / 11.0);
    // At and past the end the schedule returns min_lr itself.
    assert_eq!(c.lr_at(110), 0.1);
    assert_eq!(c.lr_at(200), 0.1);
    // The cosine part, v = min + ½(1 + cos(π·r))·(lr − min), r = (i − w)/(steps − w): in f64
    // (u = 2⁻⁵³) r and fl(π)·r carry 3 roundings, so the argument is off by ≤ 3.01·π·u (r ≤ 1,
    // cos is 1-Lipschitz); the platform's cos adds ≤ 1 ulp ≤ 2u, 1 + cos one rounding of ≤ 2u
    // (×½ is exact): |Δcoeff| ≤ (1.51·π + 2)·u < 7u. lr − min, the product and the sum add u·d,
    // u·d and u·|v| (d = lr − min, coeff ≤ 1), and the expected value's own decimal literal u·|v|:
    // tol = (9·d + 2·|v|)·u (a proven bound given a 1-ulp cos; the old 1e-12 was 10³× looser).
    let u = f64::EPSILON / 2.0;
    let d = c.lr - c.min_lr;
    for (i, want) in [(10, 1.0), (60, 0.55)] {
        let tol = (9.0 * d + 2.0 * f64::abs(want)) * u;
        let got = c.lr_at(i);
        assert!(
            (got - want).abs() <= tol,
            "lr_at({i}) = {got:e}, want {want:e} ± {tol:e}"
        );
    }
}

#[test]
fn adamw_groups_and_updates_match_libtorch_adamw() {
    let vs = nn::VarStore::new(Device::Cpu);
    let gpt = seeded(4, || {
        Gpt::new(
            &vs.root(),
            GptConfig {
                bias: true,
                ..GptConfig::tiny(10)
            },
        )
    })
    .unwrap();
    let cfg = config(10);
    let groups = adamw_groups(&vs, &cfg).unwrap();
    let decay: Vec<&str> = groups[0].names().iter().map(String::as_str).collect();
    assert!(
        decay
            .iter()
            .all(|n| n.ends_with("weight") && !n.contains("ln_")),
        "{decay:?}"
    );
    assert!(
        groups[1].names().iter().any(|n| n == "wte")
            && groups[1].names().iter().any(|n| n.ends_with("ln_1.weight"))
    );
    assert_eq!(
        groups.iter().map(|g| g.names().len()).sum::<usize>(),
        named_trainable(&vs).len()
    );

    // A clone of the model trained by libtorch's own AdamW (two groups through set_group is
    // not exposed, so compare with weight decay on every tensor of a single group).
    let vs2 = nn::VarStore::new(Device::Cpu);
    let gpt2 = seeded(6, || {
        Gpt::new(
            &vs2.root(),
            GptConfig {
                bias: true,
                ..GptConfig::tiny(10)
            },
        )
    })
    .unwrap();
    let mut vs2m = vs2;
    vs2m.copy(&vs).unwrap();
    let wd = 0.1;
    let adamw = kappa_optim::AdamWConfig {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: wd,
    };
    let names = named_trainable(&vs);
    let all = kappa_optim::Group::adamw("all", adamw, 1e-2).with_params(named_trainable(&vs));
    let mut ours = kappa_optim::Optimizer::new(vec![all]).unwrap();
    let params: Vec<Tensor> = names.iter().map(|(_, t)| t.shallow_clone()).collect();
    use tch::nn::OptimizerConfig;
    let mut theirs = nn::AdamW {
        beta1: 0.9,
        beta2: 0.95,
        wd,
        eps: 1e-8,
        amsgrad: false,
    }
    .build(&vs2m, 1e-2)
    .unwrap();
    let idx = seeded(5, || {
        Tensor::randint(10, [2, 16], (Kind::Int64, Device::Cpu))
    });
    // Both optimizers get the same gradients (model 1's, copied into model 2), so the weights
    // differ only by the two implementations' rounding — recomputing model 2's gradients would
    // let last-bit weight differences feed back, and for tensors whose gradient is itself
    // rounding noise (the K bias: it adds a constant to each score row, which softmax removes)
    // Adam's m/√v amplifies that to O(lr).
    let v2 = vs2m.variables();
    let steps = 3;
    for _ in 0..steps {
        for p in &params {
            p.shallow_clone().zero_grad();
        }
        gpt.loss(&idx, &idx).unwrap().backward();
        theirs.zero_grad();
        // Model 2's loss only creates its gradient tensors; they are overwritten below.
        gpt2.loss(&idx, &idx).unwrap().backward();
        tch::no_grad(|| {
            for (name, t) in &names {
                v2[name].grad().copy_(&t.grad());
            }
        });
        ours.step().unwrap();
        theirs.step();
    }
    // Tolerance: each step computes w ← w(1 − lr·wd) − lr·m̂/(√v̂ + ε) in f32 with a different
    // operation order, so per step the two results differ by at most about 10 roundings of the
    // update (|lr·m̂/(√v̂+ε)| ≤ lr·A, with A the Adam ratio bound below) plus 2 of the weight;
    // over `steps` steps (errors add; the update's dependence on w is through weight decay only,
    // a factor 1 − lr·wd < 1): tol = steps·(10·lr·A + 2·max|w|)·u, u = 2⁻²⁴.
    // A bounds |m̂_t|/√v̂_t: with m̂ = Σ aᵢgᵢ, v̂ = Σ bᵢgᵢ² (bias-corrected EMA weights, each summing
    // to 1), Cauchy–Schwarz gives |m̂| ≤ √(Σ aᵢ²/bᵢ)·√v̂.
    let (b1, b2) = (0.9f64, 0.95f64);
    let adam_ratio = (1..=steps)
        .map(|t| {
            let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
            (0..t)
                .map(|i| {
                    let a = (1.0 - b1) * b1.powi(i) / c1;
                    let b = (1.0 - b2) * b2.powi(i) / c2;
                    a * a / b
                })
                .sum::<f64>()
                .sqrt()
        })
        .fold(0.0, f64::max);
    let u = f64::from(f32::EPSILON) / 2.0;
    for (name, t) in &names {
        let w_max = t.abs().max().double_value(&[]);
        let tol = steps as f64 * (10.0 * 1e-2 * adam_ratio + 2.0 * w_max) * u;
        let d = (t - &v2[name]).abs().max().double_value(&[]);
        assert!(d <= tol, "{name}: {d:e} > {tol:e}");
    }
}

#[test]
fn vit_trains_on_fixture_images_and_reports_accuracy() {
    let dir = temp("vit");
    fixtures::write_fashion_mnist(&dir, 60, 20, 1).unwrap();
    let data = FashionMnist::load(&dir, 20, None, Device::Cpu).unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    // λ = 0.3: at D = 16 with LayerNorm tokens, λ = 1 already saturates the class token's
    // attention onto itself and the model stays at chance on this fixture (docs/models.md, "Why a large λ collapses attention").
    let c = CorrectionConfig::identity(0.3, HeadLayout::Shifted);
    let vit = seeded(0, || {
        Vit::new(&vs.root(), VitConfig::tiny().with_correction(c))
    })
    .unwrap();
    let mut task = ImageClassification::new(vit, data, 0).unwrap();
    let mut cfg = config(30);
    cfg.batch_size = 10;
    cfg.lr = 1e-2;
    cfg.eval_every = 10;
    cfg.eval_batches = 0;
    cfg.diagnostics.jacobian_max_tokens = 17;
    let mut trainer = Trainer::new(&vs, cfg, &context()).unwrap();
    let mut records = Vec::new();
    let s = trainer
        .run(&mut task, &mut collect(&mut records), None)
        .unwrap();
    assert_eq!(s.outcome, Outcome::Completed);
    let acc = task
        .evaluate_split(kappa_models::Split::Test, None, 8)
        .unwrap()
        .accuracy
        .unwrap();
    // A learning claim, not a comparison of two roundings: chance is 0.1 (10 classes) and 0.4
    // is 8 of the 20 test images, 4× chance; the verdict turns on whole images classified, not
    // on last bits.
    assert!(acc > 0.4, "test accuracy {acc}");
    let evals: Vec<&Record> = records
        .iter()
        .filter(|r| matches!(r, Record::Eval { .. }))
        .collect();
    assert_eq!(evals.len(), 3);
    if let Record::Eval { heads, .. } = evals[2] {
        assert_eq!(heads.len(), 4);
        // λ is an f32 buffer filled with the f64 0.3 (one round-to-nearest, the same on every
        // machine) and read back widened exactly: it is f64::from(0.3f32) bit for bit.
        assert!(heads
            .iter()
            .all(|h| h.jacobian.is_some() && h.lambda.is_some_and(|l| l == f64::from(0.3f32))));
    }
    let wrong = VitConfig {
        num_classes: 3,
        ..VitConfig::tiny()
    };
    let vs3 = nn::VarStore::new(Device::Cpu);
    let data = FashionMnist::load(&dir, 20, None, Device::Cpu).unwrap();
    let err = ImageClassification::new(Vit::new(&vs3.root(), wrong).unwrap(), data, 0).unwrap_err();
    assert!(err.to_string().contains("model.num_classes"), "{err}");
}

/// The first training losses of a 4-step run of the tiny GPT at `precision` (`None` when the
/// trainer refuses it).
fn first_losses(dir: &std::path::Path, precision: kappa_train::TrainPrecision) -> Option<Vec<f64>> {
    let (vs, mut task) = lm_task(dir, CorrectionConfig::None, 1);
    let cfg = TrainConfig {
        precision,
        ..config(4)
    };
    let mut trainer = match Trainer::new(&vs, cfg, &context()) {
        Ok(t) => t,
        Err(e) => {
            assert!(e.to_string().contains("train.precision"), "{e}");
            return None;
        }
    };
    let mut records = Vec::new();
    let s = trainer
        .run(&mut task, &mut collect(&mut records), None)
        .unwrap();
    assert_eq!(s.outcome, Outcome::Completed);
    // The weights stay f32 whatever the forward pass computed in.
    assert!(named_trainable(&vs)
        .iter()
        .all(|(_, t)| t.kind() == Kind::Float));
    Some(
        records
            .iter()
            .filter_map(|r| match r {
                Record::Train { loss, .. } => Some(*loss),
                _ => None,
            })
            .collect(),
    )
}

#[test]
fn bf16_training_runs_under_autocast_where_native_and_is_refused_elsewhere() {
    use kappa_train::TrainPrecision;
    let dir = temp("bf16");
    fixtures::write_sotu(&dir).unwrap();
    let f32_losses = first_losses(&dir, TrainPrecision::F32).unwrap();
    let native = kappa_models::autocast::native_bf16(Device::Cpu);
    match first_losses(&dir, TrainPrecision::Bf16) {
        None => assert!(!native, "refused on a CPU with native bf16"),
        Some(bf16) => {
            assert!(native, "accepted on a CPU without native bf16");
            // The same initial weights and batch: the first loss differs only by bf16 rounding
            // of the matmul inputs (8 significant bits: relative 2⁻⁹ per input, a few 10⁻³ on
            // the logits of this width) — but it does differ, or autocast was not on.
            let (a, b) = (f32_losses[0], bf16[0]);
            assert!(a != b, "bf16 gave the f32 loss {a} bit for bit");
            assert!((a - b).abs() < 0.02 * a, "{a} vs {b}");
        }
    }
}

/// The long-range task end to end: a Nyström classifier (λ·I conditioning) trains on generated
/// ListOps, is evaluated with diagnostics, and a model that does not fit the data is refused with
/// the key named.
#[test]
fn a_nystrom_classifier_trains_on_listops() {
    use kappa_models::data::sequences::{ListOps, ListOpsConfig};
    use kappa_models::{
        AttentionKernel, NystromConfig, SequenceClassifier, SequenceClassifierConfig,
    };
    use kappa_train::SequenceClassification;
    let listops = ListOpsConfig {
        train: 64,
        validation: 16,
        test: 16,
        min_length: 10,
        max_length: 64,
        max_depth: 4,
        max_args: 4,
    };
    let data = ListOps::generate(&listops, 3, Device::Cpu).unwrap();
    let model = SequenceClassifierConfig {
        vocab_size: data.vocab_size,
        seq_len: data.seq_len,
        pad_id: data.pad_id,
        num_classes: data.num_classes,
        correction: CorrectionConfig::identity(0.3, HeadLayout::Shifted),
        ..SequenceClassifierConfig::tiny(AttentionKernel::Nystrom(NystromConfig::paper(8)))
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let net = seeded(0, || SequenceClassifier::new(&vs.root(), model)).unwrap();
    let mut task = SequenceClassification::new(net, data, 0).unwrap();
    let mut trainer = Trainer::new(&vs, config(6), &context()).unwrap();
    let mut records = Vec::new();
    let s = trainer
        .run(&mut task, &mut collect(&mut records), None)
        .unwrap();
    assert_eq!(s.outcome, Outcome::Completed);
    let evals: Vec<&Record> = records
        .iter()
        .filter(|r| matches!(r, Record::Eval { .. }))
        .collect();
    assert_eq!(evals.len(), 2);
    if let Record::Eval { heads, eval, .. } = evals[1] {
        assert_eq!(heads.len(), 4, "2 layers × 2 heads of diagnostics");
        assert!(eval.accuracy.is_some_and(|a| (0.0..=1.0).contains(&a)));
    }
    let data = ListOps::generate(&listops, 3, Device::Cpu).unwrap();
    let wrong = SequenceClassifierConfig {
        seq_len: 32,
        ..model
    };
    let vs2 = nn::VarStore::new(Device::Cpu);
    let net = SequenceClassifier::new(&vs2.root(), wrong).unwrap();
    let err = SequenceClassification::new(net, data, 0).unwrap_err();
    assert!(err.to_string().contains("model.seq_len"), "{err}");
}

/// The masked-LM task: batches are a pure function of (seed, step) with BERT's selection count,
/// a corpus of characters is refused, and a few steps of training on the SOTU fixture lower the
/// held-out masked-byte loss, which is evaluated with its accuracy.
#[test]
fn masked_language_modeling_batches_evaluates_and_learns() {
    use kappa_models::mlm::{MaskedLm, MaskingRule, BYTE_VOCAB, IGNORE};
    use kappa_models::{EncoderConfig, SequenceClassifierConfig, Split};
    use kappa_train::{MaskedLanguageModeling, Task, Trainer};
    let dir = temp("mlm");
    fixtures::write_sotu(&dir).unwrap();
    let encoder: EncoderConfig = SequenceClassifierConfig {
        vocab_size: BYTE_VOCAB,
        seq_len: 32,
        ..SequenceClassifierConfig::tiny(kappa_models::AttentionKernel::Softmax)
    }
    .encoder();
    let corpus = |kind| TextCorpus::load_sotu(&dir, kind, None, Device::Cpu).unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let model = seeded(1, || MaskedLm::new(&vs.root(), encoder)).unwrap();
    let chars = MaskedLanguageModeling::new(
        model,
        corpus(TokenizerKind::Char),
        MaskingRule::default(),
        5,
    );
    assert!(chars.unwrap_err().to_string().contains("tokenizer"));

    let vs = nn::VarStore::new(Device::Cpu);
    let model = seeded(1, || MaskedLm::new(&vs.root(), encoder)).unwrap();
    let mut task = MaskedLanguageModeling::new(
        model,
        corpus(TokenizerKind::Bytes),
        MaskingRule::default(),
        5,
    )
    .unwrap();
    let (x, y) = task.batch(Split::Train, 5, 3, 4).unwrap();
    let (x2, y2) = task.batch(Split::Train, 5, 3, 4).unwrap();
    assert!(x.equal(&x2) && y.equal(&y2));
    assert!(!task.batch(Split::Train, 5, 4, 4).unwrap().1.equal(&y));
    // round(0.15 · 32) = 5 predictions per window (no padding in running text).
    assert_eq!(y.ne(IGNORE).sum(Kind::Int64).int64_value(&[]), 4 * 5);

    let before = task.evaluate(4, 8).unwrap();
    let acc = before.accuracy.unwrap();
    assert!((0.0..=1.0).contains(&acc));
    // Untrained: about ln 258 nats per masked byte.
    assert!(
        (before.loss - (BYTE_VOCAB as f64).ln()).abs() < 0.5,
        "{before:?}"
    );
    let mut trainer = Trainer::new(&vs, config(60), &context()).unwrap();
    let mut records = Vec::new();
    let summary = trainer
        .run(&mut task, &mut collect(&mut records), None)
        .unwrap();
    assert_eq!(summary.outcome, kappa_train::Outcome::Completed);
    let after = task.evaluate(4, 8).unwrap();
    assert!(after.loss < before.loss - 1.0, "{before:?} → {after:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
