//! The optimizer API on tch (feature `tch`): groups by rules, split and N-D blocks against
//! stepping the pieces one by one, exact resume from a saved state, the example's training, and
//! bad input (typed errors naming the parameter, nothing changed).
#![cfg(feature = "tch")]

#[path = "../examples/mlp_muon.rs"]
mod example;

use std::collections::HashMap;

use kappa_optim::optimizer::{Axis, Group, Grouping, MatrixSpec, Optimizer, Rule, Update};
use kappa_optim::{
    AdamWConfig, Manifold, ManifoldMuonConfig, Muon, MuonConfig, MuonState, OptimError, Precision,
    WarmupCosine,
};
use tch::{nn, Device, Kind, Tensor};

/// Seeded values uniform in [−1, 1) (from a local generator: the tests of this binary run in
/// parallel, and libtorch's global one would interleave their draws).
fn f32s(size: &[i64], seed: i64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed as u64);
    let n: i64 = size.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    Tensor::from_slice(&v).view(size)
}

/// A leaf that requires grad, with gradient `grad` (through the loss Σ p·grad).
fn leaf(size: &[i64], seed: i64) -> Tensor {
    f32s(size, seed).set_requires_grad(true)
}

fn set_grad(p: &Tensor, grad: &Tensor) {
    (p * grad).sum(Kind::Float).backward();
}

fn muon_f32() -> MuonConfig {
    MuonConfig {
        precision: Precision::F32,
        ..MuonConfig::keller()
    }
}

/// A variable of `vs` named `name` (dots separate path components).
fn var(vs: &nn::VarStore, name: &str, size: &[i64], std: f64) -> Tensor {
    let mut parts: Vec<&str> = name.split('.').collect();
    let last = parts.pop().unwrap_or_default();
    let path = parts.iter().fold(vs.root(), |p, c| p / *c);
    let seed = name
        .bytes()
        .fold(7i64, |h, b| h.wrapping_mul(31).wrapping_add(b as i64));
    path.var_copy(last, &(f32s(size, seed) * std))
}

#[test]
fn muon_adamw_places_each_kind_of_parameter() {
    let vs = nn::VarStore::new(Device::Cpu);
    for (name, size) in [
        ("wte", vec![50, 16]),
        ("h.0.attn.c_attn.weight", vec![48, 16]),
        ("h.0.attn.c_attn.bias", vec![48]),
        ("h.0.ln_1.weight", vec![16]),
        ("conv.weight", vec![8, 4, 3, 3]),
        ("head.weight", vec![10, 16]),
    ] {
        let _ = var(&vs, name, &size, 0.1);
    }
    let groups = Grouping::muon_adamw(MuonConfig::keller(), AdamWConfig::torch(), 1e-3)
        .assign(vs.variables())
        .unwrap();
    let placed: Vec<(&str, Vec<&str>)> = groups
        .iter()
        .map(|g| (g.name(), g.names().iter().map(String::as_str).collect()))
        .collect();
    assert_eq!(
        placed,
        [
            ("adamw", vec!["head.weight", "wte"]),
            ("muon", vec!["conv.weight", "h.0.attn.c_attn.weight"]),
            (
                "adamw_no_decay",
                vec!["h.0.attn.c_attn.bias", "h.0.ln_1.weight"]
            ),
        ]
    );
    // A rule added by the user comes first; a grouping without defaults names what it cannot
    // place.
    let qkv = Rule::muon("qkv", MuonConfig::keller()).names(["*.c_attn.weight"]);
    let groups = Grouping::muon_adamw(MuonConfig::keller(), AdamWConfig::torch(), 1e-3)
        .rule(qkv.clone())
        .assign(vs.variables())
        .unwrap();
    assert_eq!(groups[0].names(), ["h.0.attn.c_attn.weight"]);
    let err = Grouping::new()
        .rule(qkv)
        .assign(vs.variables())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no rule places 5 parameter(s)") && err.contains("`wte`"),
        "{err}"
    );
}

/// Muon on the blocks of `spec` equals Muon on each block copied out and stepped alone: bit for
/// bit one by one, and batched within the rounding of batched products.
fn check_blocks(size: &[i64], spec: MatrixSpec, pieces: impl Fn(&Tensor) -> Vec<Tensor>) {
    for batch in [false, true] {
        let p = leaf(size, 1);
        let w0 = p.detach().copy();
        let grads: Vec<Tensor> = (0..3).map(|s| f32s(size, 10 + s)).collect();
        let group = Group::muon("m", muon_f32())
            .with_matrix(spec.clone())
            .with_batch(batch)
            .with_param("p", p.shallow_clone());
        let mut opt = Optimizer::new(vec![group]).unwrap();
        let muon = Muon::new(muon_f32()).unwrap();
        let mut blocks = pieces(&w0)
            .into_iter()
            .map(|t| t.copy())
            .collect::<Vec<_>>();
        let mut states: Vec<MuonState<Tensor>> = blocks.iter().map(|_| MuonState::new()).collect();
        for g in &grads {
            opt.zero_grad().unwrap();
            set_grad(&p, g);
            opt.step().unwrap();
            for ((w, gb), s) in blocks.iter_mut().zip(pieces(g)).zip(&mut states) {
                muon.step(w, &gb.copy(), s).unwrap();
            }
        }
        for (mine, theirs) in pieces(&p.detach()).iter().zip(&blocks) {
            let diff = (mine - theirs).abs().max().double_value(&[]);
            // One by one: the same calls on the same values. Batched: products of a batch round
            // differently (kappa-linalg's `batched` bound, ~1e-6 relative after three steps of
            // an update of size lr = 0.02).
            let tol = if batch { 1e-6 } else { 0.0 };
            assert!(diff <= tol, "{size:?} {spec:?} batch {batch}: {diff:e}");
        }
    }
}

/// `take_stats` says which updates computed msign in bf16, batched or not, for Muon and
/// manifold Muon: all of them at `Precision::Bf16`, none at `Precision::F32`; AdamW groups
/// have no count.
#[test]
fn the_stats_count_the_updates_whose_msign_ran_in_bf16() {
    for precision in [Precision::F32, Precision::Bf16] {
        for batch in [false, true] {
            let muon: Vec<Tensor> = (0..3).map(|i| leaf(&[16, 32], i)).collect();
            let stiefel: Vec<Tensor> = (0..2).map(|i| leaf(&[32, 16], 10 + i)).collect();
            let bias = leaf(&[16], 20);
            let named = |prefix: &str, ts: &[Tensor]| -> Vec<(String, Tensor)> {
                let name = |i| format!("{prefix}.{i}");
                ts.iter()
                    .enumerate()
                    .map(|(i, t)| (name(i), t.shallow_clone()))
                    .collect()
            };
            let muon_config = MuonConfig {
                precision,
                ..MuonConfig::keller()
            };
            let manifold_config = ManifoldMuonConfig {
                precision,
                ..ManifoldMuonConfig::paper(Manifold::Stiefel)
            };
            let groups = vec![
                Group::muon("muon", muon_config)
                    .with_batch(batch)
                    .with_params(named("muon", &muon)),
                Group::manifold("stiefel", manifold_config)
                    .with_batch(batch)
                    .with_params(named("stiefel", &stiefel)),
                Group::adamw("adamw", AdamWConfig::torch(), 1e-3)
                    .with_param("b", bias.shallow_clone()),
            ];
            let mut opt = Optimizer::new(groups).unwrap();
            for (i, p) in muon.iter().chain(&stiefel).chain([&bias]).enumerate() {
                set_grad(p, &f32s(&p.size(), 100 + i as i64));
            }
            opt.step().unwrap();
            let bf16 = precision == Precision::Bf16;
            for (name, s) in opt.take_stats() {
                let what = format!("{name}, {precision:?}, batch {batch}");
                if name == "adamw" {
                    assert_eq!((s.updates, s.msign_bf16), (1, None), "{what}");
                    continue;
                }
                let n = if name == "muon" { 3 } else { 2 };
                let expected = Some(if bf16 { n } else { 0 });
                assert_eq!((s.updates, s.msign_bf16), (n, expected), "{what}");
                let json = serde_json::to_string(&s).unwrap();
                assert!(json.contains("\"msign_bf16\":"), "{what}: {json}");
            }
        }
    }
}

#[test]
fn qkv_split_into_heads_steps_each_head_alone() {
    let spec = MatrixSpec::matrix()
        .split(Axis::Rows, [32, 32, 32])
        .heads(Axis::Rows, 4);
    check_blocks(&[96, 32], spec, |t| {
        (0..12).map(|i| t.narrow(0, i * 8, 8)).collect()
    });
}

#[test]
fn column_heads_and_unequal_splits_step_each_block_alone() {
    check_blocks(&[24, 32], MatrixSpec::matrix().heads(Axis::Cols, 4), |t| {
        (0..4).map(|i| t.narrow(1, i * 8, 8)).collect()
    });
    check_blocks(
        &[40, 16],
        MatrixSpec::matrix().split(Axis::Rows, [16, 8, 16]),
        |t| vec![t.narrow(0, 0, 16), t.narrow(0, 16, 8), t.narrow(0, 24, 16)],
    );
}

#[test]
fn n_d_weights_step_each_batch_matrix_alone() {
    // A stack of experts (E, m, n), batch axis first: views.
    check_blocks(&[3, 12, 8], MatrixSpec::batched(&[0], &[1], &[2]), |t| {
        (0..3).map(|e| t.select(0, e)).collect()
    });
    // The batch axis last: strided views.
    check_blocks(&[12, 8, 3], MatrixSpec::batched(&[2], &[0], &[1]), |t| {
        (0..3).map(|e| t.select(2, e)).collect()
    });
    // Rows from two axes storage does not keep together: a permuted copy, written back.
    check_blocks(&[4, 3, 6], MatrixSpec::batched(&[], &[0, 2], &[1]), |t| {
        vec![t.permute([0, 2, 1]).reshape([24, 3])]
    });
    // A conv kernel flattened to (out, in·kh·kw).
    check_blocks(&[8, 2, 3, 3], MatrixSpec::matrix(), |t| {
        vec![t.reshape([8, 18])]
    });
}

/// A model of every update kind: Muon with NorMuon, manifold Muon (Stiefel), AdamW.
fn model_and_optimizer(steps: u64) -> (nn::VarStore, Optimizer) {
    let vs = nn::VarStore::new(Device::Cpu);
    let _ = var(&vs, "wte", &[20, 8], 1.0);
    let _ = var(&vs, "h.0.qkv.weight", &[24, 8], 0.3);
    let _ = var(&vs, "h.0.mlp.weight", &[8, 8], 0.3);
    let _ = var(&vs, "h.0.out.weight", &[16, 8], 0.3);
    let _ = var(&vs, "h.0.out.bias", &[16], 0.1);
    let normuon = MuonConfig {
        weight_decay: 0.1,
        ..muon_f32().with_normuon()
    };
    let stiefel = ManifoldMuonConfig {
        precision: Precision::F32,
        ..ManifoldMuonConfig::paper(Manifold::Stiefel)
    };
    let opt = Grouping::muon_adamw(normuon, AdamWConfig::torch(), 1e-2)
        .rule(Rule::new("stiefel", Update::Manifold(stiefel), 0.02).names(["*.mlp.weight"]))
        .rule(
            Rule::muon("qkv", normuon)
                .names(["*.qkv.weight"])
                .matrix(MatrixSpec::matrix().split(Axis::Rows, [8, 8, 8])),
        )
        .build(&vs)
        .unwrap()
        .with_schedule(WarmupCosine::new(2, steps, 0.1).unwrap());
    (vs, opt)
}

/// The gradient of step `i` for every variable (seeded by name and step).
fn train_steps(vs: &nn::VarStore, opt: &mut Optimizer, range: std::ops::Range<i64>) {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    for i in range {
        opt.zero_grad().unwrap();
        let loss = vars.iter().enumerate().fold(
            Tensor::zeros([], (Kind::Float, Device::Cpu)),
            |acc, (k, (_, v))| {
                let g = f32s(&v.size(), 1000 * i + k as i64);
                acc + (v * g).sum(Kind::Float) + v.square().sum(Kind::Float) * 0.01
            },
        );
        loss.backward();
        opt.step().unwrap();
    }
}

fn weights(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.detach().copy()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn a_resumed_run_is_bit_for_bit_the_uninterrupted_one() {
    let dir = std::env::temp_dir().join(format!("kappa-optim-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (vs, mut opt) = model_and_optimizer(8);
    train_steps(&vs, &mut opt, 0..8);
    let straight = weights(&vs);

    let (vs, mut opt) = model_and_optimizer(8);
    train_steps(&vs, &mut opt, 0..3);
    let (model_file, opt_file) = (dir.join("model.safetensors"), dir.join("optim.safetensors"));
    vs.save(&model_file).unwrap();
    opt.save(&opt_file).unwrap();
    drop((vs, opt));

    let (mut vs, mut opt) = model_and_optimizer(8);
    vs.load(&model_file).unwrap();
    opt.load(&opt_file).unwrap();
    assert_eq!(opt.steps(), 3);
    train_steps(&vs, &mut opt, 3..8);
    for ((name, a), (_, b)) in straight.iter().zip(weights(&vs)) {
        assert!(a.equal(&b), "{name} differs after resuming");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_state_that_does_not_fit_is_refused_and_changes_nothing() {
    let (vs, mut opt) = model_and_optimizer(4);
    train_steps(&vs, &mut opt, 0..2);
    let good: HashMap<String, Tensor> = opt.state_dict().unwrap().into_iter().collect();
    let before: Vec<(String, Tensor)> = opt
        .state_dict()
        .unwrap()
        .into_iter()
        .map(|(k, t)| (k, t.copy()))
        .collect();
    let key = "state/h.0.qkv.weight/momentum/1";
    type Damage = Box<dyn Fn(&mut HashMap<String, Tensor>)>;
    let cases: Vec<(&str, Damage)> = vec![
        (
            key,
            Box::new(|s| {
                s.insert(
                    key.into(),
                    Tensor::zeros([8, 9], (Kind::Float, Device::Cpu)),
                );
            }),
        ),
        (
            key,
            Box::new(|s| {
                s.insert(
                    key.into(),
                    Tensor::full([8, 8], f64::NAN, (Kind::Float, Device::Cpu)),
                );
            }),
        ),
        (
            key,
            Box::new(|s| {
                s.remove(key);
            }),
        ),
        (
            "state/wte/exp_avg",
            Box::new(|s| {
                s.remove("state/wte/exp_avg");
            }),
        ),
        (
            "state/nothing/steps",
            Box::new(|s| {
                s.insert("state/nothing/steps".into(), Tensor::from_slice(&[1i64]));
            }),
        ),
        (
            "state/h.0.out.weight/steps",
            Box::new(|s| {
                s.insert(
                    "state/h.0.out.weight/steps".into(),
                    Tensor::from_slice(&[1i64, 2]),
                );
            }),
        ),
        (
            "lr/muon",
            Box::new(|s| {
                s.insert("lr/muon".into(), Tensor::from_slice(&[-1.0f64]));
            }),
        ),
        (
            "lr/muon",
            Box::new(|s| {
                // A rate as a 0-dimensional tensor (as Python's torch.tensor(0.02) makes).
                s.insert("lr/muon".into(), Tensor::from(0.02f64));
            }),
        ),
        (
            "lr/muon",
            Box::new(|s| {
                s.insert("lr/muon".into(), Tensor::from_slice(&[0.02f32]));
            }),
        ),
    ];
    for (culprit, damage) in cases {
        let mut state: HashMap<String, Tensor> =
            good.iter().map(|(k, t)| (k.clone(), t.copy())).collect();
        damage(&mut state);
        let err = opt.load_state_dict(&state).unwrap_err();
        assert!(
            matches!(&err, OptimError::State { key, .. } if key == culprit),
            "{culprit}: {err}"
        );
        let after = opt.state_dict().unwrap();
        for ((k, a), (_, b)) in before.iter().zip(&after) {
            assert!(a.equal(b), "{culprit} changed {k}");
        }
    }
}

#[test]
fn bad_groups_and_gradients_are_errors_naming_the_parameter() {
    let p = leaf(&[6, 4], 1);
    let err = |groups: Vec<Group>| Optimizer::new(groups).unwrap_err().to_string();
    let e = err(vec![Group::muon("m", muon_f32())]);
    assert!(
        e.contains("group `m`") && e.contains("no parameters"),
        "{e}"
    );
    let e = err(vec![
        Group::muon("m", muon_f32()).with_param("a", p.shallow_clone()),
        Group::adamw("b", AdamWConfig::torch(), 1e-3).with_param("a2", p.shallow_clone()),
    ]);
    assert!(
        e.contains("`a2`") && e.contains("the tensor `a` too"),
        "{e}"
    );
    let e = err(vec![
        Group::muon("m", muon_f32()).with_param("bias", leaf(&[4], 2))
    ]);
    assert!(e.contains("`bias`") && e.contains("rank ≥ 2"), "{e}");
    let e = err(vec![Group::muon("m", muon_f32())
        .with_matrix(MatrixSpec::matrix().heads(Axis::Rows, 4))
        .with_param("w", leaf(&[6, 4], 3))]);
    assert!(
        e.contains("`w`") && e.contains("4 heads do not divide"),
        "{e}"
    );

    // A NaN gradient: an error naming the parameter, and no parameter changes.
    let (a, b) = (leaf(&[6, 4], 4), leaf(&[5], 5));
    let mut opt = Optimizer::new(vec![
        Group::adamw("adamw", AdamWConfig::torch(), 1e-2).with_param("b", b.shallow_clone()),
        Group::muon("muon", muon_f32()).with_param("a", a.shallow_clone()),
    ])
    .unwrap();
    let (a0, b0) = (a.detach().copy(), b.detach().copy());
    set_grad(&a, &f32s(&[6, 4], 6));
    let bad = f32s(&[5], 7);
    let _ = bad.narrow(0, 3, 1).fill_(f64::NAN);
    set_grad(&b, &bad);
    let e = opt.step().unwrap_err().to_string();
    assert!(e.contains("parameter `b`") && e.contains("(3, 0)"), "{e}");
    assert!(a.detach().equal(&a0) && b.detach().equal(&b0));
    assert_eq!(opt.steps(), 0);

    // A schedule whose rate AdamW accepts and Muon refuses (above `MuonConfig::MAX_LR`): an
    // error naming the Muon group, and the AdamW group, stepped first, has not changed either.
    opt.zero_grad().unwrap();
    set_grad(&a, &f32s(&[6, 4], 6));
    set_grad(&b, &f32s(&[5], 8));
    let mut opt = opt.with_schedule(|_| 1e40);
    let e = opt.step().unwrap_err().to_string();
    assert!(e.contains("group `muon`") && e.contains("lr"), "{e}");
    assert!(a.detach().equal(&a0) && b.detach().equal(&b0));
}

#[test]
fn the_examples_mlp_learns_with_muon_and_with_manifold_muon() {
    for manifold in [false, true] {
        let losses = example::train(manifold, 120, 0).unwrap();
        let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
        let (first, last) = (mean(&losses[..10]), mean(&losses[110..]));
        // Ten classes start at ln 10 ≈ 2.3; clusters 1.5σ apart are separable to a loss well
        // under a third of that.
        assert!(
            first > 2.0 && last < 0.7,
            "manifold {manifold}: {first} → {last}"
        );
    }
}

#[test]
fn zero_grad_drops_gradients_and_the_clip_norm_matches_libtorch() {
    let (a, b) = (leaf(&[300, 70], 2), leaf(&[9], 3));
    let mut opt = Optimizer::new(vec![
        Group::adamw("w", AdamWConfig::torch(), 1e-3).with_param("a", a.shallow_clone()),
        Group::adamw("b", AdamWConfig::torch(), 1e-3).with_param("b", b.shallow_clone()),
    ])
    .unwrap();
    set_grad(&a, &(a.detach() * 3.0));
    set_grad(&b, &b.detach());
    let want = [&a, &b]
        .iter()
        .map(|p| {
            p.grad()
                .to_kind(Kind::Double)
                .square()
                .sum(Kind::Double)
                .double_value(&[])
        })
        .sum::<f64>()
        .sqrt();
    let before: Vec<Tensor> = [&a, &b].iter().map(|p| p.grad().copy()).collect();
    let norm = opt.clip_grad_norm(1.0).unwrap();
    // Two f64 sums of the same exact squares in different orders: ≤ n·2⁻⁵³ relative each.
    let n = (300 * 70 + 9) as f64;
    assert!(
        (norm - want).abs() <= 2.0 * n * f64::powi(2.0, -53) * want,
        "{norm} {want}"
    );
    let scale = 1.0 / (norm + 1e-6);
    for (p, g) in [&a, &b].iter().zip(&before) {
        assert!(p.grad().equal(&(g * scale)));
    }
    opt.zero_grad().unwrap();
    assert!(!a.grad().defined() && !b.grad().defined());
    // The next backward pass stores a fresh gradient (not added to an old one).
    (&b * 2.0).sum(Kind::Float).backward();
    assert!(b
        .grad()
        .equal(&Tensor::full([9], 2.0, (Kind::Float, Device::Cpu))));
}

/// A step checks every gradient once, not again per matrix, and skips even that pass after
/// `clip_grad_norm` found the norm finite. A gradient made non-finite after the clip still
/// stops its matrix's step before that matrix or its state changes: its non-finite momentum
/// input is msign's error, naming the parameter. Both Muon paths: a batch of two same-shape
/// matrices (the second spoiled) and a matrix alone. (Matrices of other jobs stepped before the
/// spoiled one keep their step: the check that would refuse the whole step up front is the pass
/// the clip's finite norm skips.)
/// A sparse gradient (an embedding looked up with `sparse = true`): step and clip refuse it by
/// the parameter's name, nothing changes, and the optimizer works on once it is dense; a sparse
/// parameter is refused when the optimizer is built.
#[test]
fn sparse_tensors_are_errors_naming_the_parameter() {
    let table = leaf(&[10, 4], 40);
    let mut opt = Optimizer::new(vec![Group::adamw("adamw", AdamWConfig::torch(), 1e-2)
        .with_param("table", table.shallow_clone())])
    .unwrap();
    let rows = Tensor::from_slice(&[1i64, 2, 2]);
    Tensor::embedding(&table, &rows, -1, false, true)
        .sum(Kind::Float)
        .backward();
    assert!(table.grad().is_sparse());
    let before = table.detach().copy();
    for e in [
        opt.step().unwrap_err(),
        opt.clip_grad_norm(1.0).unwrap_err(),
    ] {
        let e = e.to_string();
        assert!(e.contains("`table`") && e.contains("sparse"), "{e}");
    }
    assert!(table.detach().equal(&before));
    assert_eq!(opt.steps(), 0);
    opt.zero_grad().unwrap();
    set_grad(&table, &f32s(&[10, 4], 41));
    opt.step().unwrap();
    assert_eq!(opt.steps(), 1);

    let sparse = (f32s(&[4, 4], 42).to_sparse(None, None::<&[i64]>, None)).set_requires_grad(true);
    let e = Optimizer::new(vec![
        Group::adamw("adamw", AdamWConfig::torch(), 1e-2).with_param("s", sparse)
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("`s`") && e.contains("sparse"), "{e}");
}

#[test]
fn a_gradient_spoiled_after_the_clip_still_stops_its_step() {
    for (shapes, spoiled) in [(vec![[6, 4], [6, 4]], 1), (vec![[5, 3]], 0)] {
        let params: Vec<Tensor> = (shapes.iter().enumerate())
            .map(|(i, s)| leaf(s, 11 + i as i64))
            .collect();
        let fresh = || {
            let group = params
                .iter()
                .enumerate()
                .fold(Group::muon("muon", muon_f32()), |g, (i, p)| {
                    g.with_param(format!("p{i}"), p.shallow_clone())
                });
            Optimizer::new(vec![group]).unwrap()
        };
        let grads = |opt: &mut Optimizer| {
            opt.zero_grad().unwrap();
            for (i, p) in params.iter().enumerate() {
                set_grad(p, &f32s(&p.size(), 20 + i as i64));
            }
        };
        let start: Vec<Tensor> = params.iter().map(|p| p.detach().copy()).collect();
        let mut opt = fresh();
        grads(&mut opt);
        opt.step().unwrap();
        let want: Vec<Tensor> = params.iter().map(|p| p.detach().copy()).collect();
        for (p, s) in params.iter().zip(&start) {
            tch::no_grad(|| p.shallow_clone().copy_(s));
        }

        let mut opt = fresh();
        grads(&mut opt);
        assert!(opt.clip_grad_norm(1e9).unwrap().is_finite());
        let _ = params[spoiled].grad().get(1).get(2).fill_(f64::INFINITY);
        let e = opt.step().unwrap_err().to_string();
        let named = format!("`p{spoiled}`");
        assert!(e.contains(&named) && e.contains("non-finite"), "{e}");
        for (p, s) in params.iter().zip(&start) {
            assert!(p.detach().equal(s), "{shapes:?}: a weight changed");
        }
        assert_eq!(opt.steps(), 0);
        // The state is as it was: the repaired step is the first step of a fresh optimizer.
        grads(&mut opt);
        opt.step().unwrap();
        for (p, w) in params.iter().zip(&want) {
            assert!(p.detach().equal(w), "{shapes:?}: the state changed");
        }
    }
}
