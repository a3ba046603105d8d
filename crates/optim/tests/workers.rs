//! A group's blocks on worker threads (`Group::with_threads`): the same weights and statistics
//! as on the calling thread, and the caller's libtorch thread count left as it was. One test in
//! its own binary, because libtorch's thread count is a setting of the whole process.
#![cfg(feature = "tch")]

use kappa_optim::optimizer::{Group, Optimizer, OptimizerStats};
use kappa_optim::{Manifold, ManifoldMuonConfig, MuonConfig, Precision};
use tch::{Kind, Tensor};

/// Seeded values uniform in [−1, 1).
fn f32s(size: &[i64], seed: u64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let n: i64 = size.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    Tensor::from_slice(&v).view(size)
}

/// Shapes with batches of 5 (split 3 + 2 on two or three workers), 3 (whole: a part has two
/// blocks or more) and 1.
const MUON_SHAPES: [[i64; 2]; 9] = [
    [48, 32],
    [32, 64],
    [48, 32],
    [64, 48],
    [48, 32],
    [32, 64],
    [48, 32],
    [32, 64],
    [48, 32],
];

/// A Muon group (batched) and a manifold Muon group (Stiefel, block by block), both on
/// `threads` workers when given, trained three steps on seeded gradients: the weights after
/// and each group's statistics.
fn train(threads: Option<usize>) -> (Vec<Tensor>, Vec<(String, OptimizerStats)>) {
    let leaf = |size: &[i64], seed| (f32s(size, seed) * 0.3).set_requires_grad(true);
    let muon: Vec<Tensor> = MUON_SHAPES
        .iter()
        .zip(0..)
        .map(|(s, i)| leaf(s, i))
        .collect();
    let stiefel: Vec<Tensor> = (0..4).map(|i| leaf(&[32, 16], 100 + i)).collect();
    let muon_config = MuonConfig {
        precision: Precision::F32,
        ..MuonConfig::keller().with_normuon()
    };
    let manifold_config = ManifoldMuonConfig {
        precision: Precision::F32,
        ..ManifoldMuonConfig::paper(Manifold::Stiefel)
    };
    let named = |prefix: &str, ts: &[Tensor]| -> Vec<(String, Tensor)> {
        ts.iter()
            .enumerate()
            .map(|(i, t)| (format!("{prefix}.{i}"), t.shallow_clone()))
            .collect()
    };
    let mut groups = vec![
        Group::muon("muon", muon_config).with_params(named("muon", &muon)),
        Group::manifold("stiefel", manifold_config)
            .with_batch(false)
            .with_params(named("stiefel", &stiefel)),
    ];
    if let Some(n) = threads {
        groups = groups.into_iter().map(|g| g.with_threads(n)).collect();
    }
    let mut opt = Optimizer::new(groups).unwrap();
    let all: Vec<&Tensor> = muon.iter().chain(&stiefel).collect();
    for step in 0..3u64 {
        opt.zero_grad().unwrap();
        let loss = all.iter().zip(0..).fold(
            Tensor::zeros([], (Kind::Float, tch::Device::Cpu)),
            |acc, (p, i)| acc + (*p * f32s(&p.size(), 1000 * step + i)).sum(Kind::Float),
        );
        loss.backward();
        opt.step().unwrap();
    }
    let mut stats = opt.take_stats();
    stats.iter_mut().for_each(|(_, s)| s.seconds = 0.0);
    (all.iter().map(|t| t.detach().copy()).collect(), stats)
}

#[test]
fn workers_step_every_block_as_the_calling_thread_does() {
    // At one libtorch thread, every product runs the same single-threaded kernel on the same
    // values whichever thread calls it, and a part of a batch keeps the whole batch's
    // precision: the weights must agree bit for bit.
    tch::set_num_threads(1);
    let (alone, alone_stats) = train(Some(1));
    for threads in [Some(2), Some(3), None] {
        let (weights, stats) = train(threads);
        for (i, (a, b)) in alone.iter().zip(&weights).enumerate() {
            assert!(a.equal(b), "threads {threads:?}: parameter {i} differs");
        }
        for ((name, a), (_, b)) in alone_stats.iter().zip(&stats) {
            assert_eq!(
                (a.updates, a.msign_bf16, a.diverged),
                (b.updates, b.msign_bf16, b.diverged),
                "{name} {threads:?}"
            );
            // Means of per-block values summed lane by lane: equal up to the order of a sum of
            // a few terms, relative 1e-12 (a handful of roundings of 2⁻⁵³).
            let means = |s: &OptimizerStats| [s.dual_steps, s.msign_calls, s.violation];
            for (x, y) in means(a).into_iter().zip(means(b)) {
                let (x, y) = (x.unwrap_or(0.0), y.unwrap_or(0.0));
                assert!(
                    (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
                    "{name} {threads:?}"
                );
            }
        }
    }
    // Workers set their own libtorch thread count (1 each here), which libtorch also takes as
    // the default of new threads; the caller's count is set again after the step.
    tch::set_num_threads(2);
    let _ = train(Some(2));
    assert_eq!(tch::get_num_threads(), 2);
    let fresh = std::thread::spawn(tch::get_num_threads).join().unwrap();
    assert_eq!(fresh, 2, "a thread started after the step");
}
