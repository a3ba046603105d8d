//! The optimizer sharded over the ranks of a data-parallel run (feature `dist`), on kappa-dist's
//! `Threads` backend: every rank ends each step with the weights and state of a one-process
//! unsharded step, bit for bit, and a rank that fails makes the others fail instead of waiting.
//!
//! The batches (W = 2 and 3) give ranks parts of several blocks, parts of one block (which the
//! sharded step pairs with a copy of itself, so that libtorch's `bmm` takes its batch kernel),
//! and no block at all. Bits equal because batched Newton–Schulz, Muon's and manifold Muon's
//! batched steps give each matrix the same bits in any batch of two or more at a fixed libtorch
//! thread count (libtorch's CPU `bmm` calls MKL's `sgemm_batch`, which computes each matrix
//! alone), and the working precision is decided on the whole batch. Every thread that computes
//! sets one libtorch thread (the test's and each rank's: libtorch's OpenMP thread count is a
//! per-thread setting, and a rank thread left at the default sums in another order).
#![cfg(feature = "dist")]

use std::sync::Arc;
use std::time::Duration;

use kappa_dist::{Communicator, DistError, Threads};
use kappa_optim::optimizer::{Axis, Group, MatrixSpec, Optimizer, OptimizerStats};
use kappa_optim::{AdamWConfig, Manifold, ManifoldMuonConfig, MuonConfig, OptimError};
use tch::{Kind, Tensor};

/// Seeded values uniform in [−1, 1) (a local generator: the ranks are threads of one process).
fn f32s(size: &[i64], seed: u64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let n: i64 = size.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    Tensor::from_slice(&v).view(size)
}

/// (group, parameter name, size): Muon with NorMuon on heads of fused QKV weights (12 blocks
/// of 8×16), Muon with NorMuon on whole matrices (batches of 3 and 2 blocks), manifold Muon on
/// Stiefel (a batch of 3, one of 1) and AdamW.
const PARAMS: &[(&str, &str, &[i64])] = &[
    ("attn", "h.0.qkv", &[48, 16]),
    ("attn", "h.1.qkv", &[48, 16]),
    ("mlp", "h.0.fc", &[32, 16]),
    ("mlp", "h.1.fc", &[32, 16]),
    ("mlp", "h.2.fc", &[32, 16]),
    ("mlp", "h.0.proj", &[16, 32]),
    ("mlp", "h.1.proj", &[16, 32]),
    ("stiefel", "h.0.ortho", &[24, 8]),
    ("stiefel", "h.1.ortho", &[24, 8]),
    ("stiefel", "h.2.ortho", &[24, 8]),
    ("stiefel", "h.0.square", &[8, 8]),
    ("adamw", "h.0.bias", &[16]),
    ("adamw", "h.1.bias", &[32]),
];

/// A fresh copy of the parameters (the same on every rank) in their groups.
fn optimizer() -> Optimizer {
    let normuon = MuonConfig {
        weight_decay: 0.1,
        ..MuonConfig::keller().with_normuon()
    };
    let heads = MatrixSpec::matrix()
        .split(Axis::Rows, [16, 16, 16])
        .heads(Axis::Rows, 2);
    let params = |group: &'static str| {
        let of_group = PARAMS.iter().enumerate().filter(move |(_, p)| p.0 == group);
        of_group.map(|(seed, (_, name, size))| {
            let t = (f32s(size, seed as u64) * 0.3).set_requires_grad(true);
            (name.to_string(), t)
        })
    };
    let groups = vec![
        Group::muon("attn", normuon)
            .with_matrix(heads)
            .with_params(params("attn")),
        Group::muon("mlp", normuon).with_params(params("mlp")),
        Group::manifold("stiefel", ManifoldMuonConfig::paper(Manifold::Stiefel))
            .with_params(params("stiefel")),
        Group::adamw("adamw", AdamWConfig::torch(), 1e-2).with_params(params("adamw")),
    ];
    Optimizer::new(groups).unwrap()
}

/// Gradients of step `step` (seeded by step and parameter); with `nan`, the first one is NaN.
fn set_grads(opt: &mut Optimizer, step: u64, nan: bool) {
    opt.zero_grad().unwrap();
    let params: Vec<Tensor> = opt.params().map(|(_, p)| p.shallow_clone()).collect();
    for (k, p) in params.iter().enumerate() {
        let g = f32s(&p.size(), 1000 * step + 100 + k as u64);
        let g = if nan && k == 0 { g * f64::NAN } else { g };
        (p * g).sum(Kind::Float).backward();
    }
}

/// Every weight and state tensor after `steps` steps, copied, by name.
fn run(opt: &mut Optimizer, steps: u64) -> Result<Vec<(String, Tensor)>, OptimError> {
    for step in 0..steps {
        set_grads(opt, step, false);
        opt.step()?;
    }
    let mut out: Vec<(String, Tensor)> = opt
        .params()
        .map(|(n, p)| (n.to_string(), p.detach().copy()))
        .collect();
    out.extend(opt.state_dict()?.into_iter().map(|(n, t)| (n, t.copy())));
    Ok(out)
}

/// `found` holds `expected`'s names and bits.
fn assert_same_bits(expected: &[(String, Tensor)], found: &[(String, Tensor)], what: &str) {
    let names = |v: &[(String, Tensor)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(expected), names(found), "{what}");
    for ((name, a), (_, b)) in expected.iter().zip(found) {
        assert!(
            a.equal(b),
            "{what}: `{name}` differs from the unsharded step's"
        );
    }
}

#[test]
fn a_sharded_step_on_2_and_3_ranks_is_the_unsharded_step_bit_for_bit_on_every_rank() {
    tch::set_num_threads(1);
    let steps = 3;
    let mut unsharded = optimizer();
    let expected = run(&mut unsharded, steps).unwrap();
    let expected_stats = unsharded.take_stats();
    assert!(expected.iter().any(|(n, _)| n == "state/h.1.qkv/second/5"));
    for world in [2, 3] {
        let ranks = Threads::run(world, |comm| {
            tch::set_num_threads(1);
            let mut opt = optimizer();
            opt.shard(Arc::new(comm));
            assert!(opt.is_sharded());
            let out = run(&mut opt, steps);
            (out, opt.traffic(), opt.take_stats())
        })
        .unwrap();
        let first: Vec<(String, Tensor)> = match &ranks[0].0 {
            Ok(v) => v.iter().map(|(n, t)| (n.clone(), t.copy())).collect(),
            Err(e) => panic!("rank 0 of {world}: {e}"),
        };
        for (rank, (found, traffic, stats)) in ranks.into_iter().enumerate() {
            let what = format!("rank {rank} of {world}");
            let found = found.unwrap();
            for ((name, a), (_, b)) in first.iter().zip(&found) {
                assert!(a.equal(b), "{what}: `{name}` differs from rank 0's");
            }
            assert_same_bits(&expected, &found, &what);
            assert_same_bits_dbg(&expected, &found, &what);
            assert!(
                traffic.minimum > 0 && traffic.received >= traffic.minimum,
                "{what}"
            );
            assert_same_stats(&expected_stats, &stats, &what);
        }
    }
}

/// The statistics of every rank of a sharded run count every rank's blocks: the unsharded
/// step's counts and maxima exactly, its sums to the rounding of adding the ranks' parts in
/// another order (relative 1e-12: a few dozen terms of one sign), `seconds` aside.
fn assert_same_stats(
    expected: &[(String, OptimizerStats)],
    found: &[(String, OptimizerStats)],
    what: &str,
) {
    assert_eq!(expected.len(), found.len(), "{what}");
    let close = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-12 * a.abs().max(b.abs()),
        (a, b) => a.is_none() && b.is_none(),
    };
    for ((name, e), (_, f)) in expected.iter().zip(found) {
        let what = format!("{what}, group `{name}`");
        assert!(e.updates > 0, "{what}: no updates counted");
        assert_eq!(
            (
                e.updates,
                e.msign_bf16,
                e.diverged,
                e.dual_steps,
                e.msign_calls
            ),
            (
                f.updates,
                f.msign_bf16,
                f.diverged,
                f.dual_steps,
                f.msign_calls
            ),
            "{what}"
        );
        assert_eq!(e.violation_max, f.violation_max, "{what}");
        assert_eq!(e.manifold_violation_max, f.manifold_violation_max, "{what}");
        assert!(
            close(e.violation, f.violation),
            "{what}: {e:?} against {f:?}"
        );
        assert!(
            close(e.descent_ratio, f.descent_ratio),
            "{what}: {e:?} against {f:?}"
        );
    }
}

#[test]
fn a_group_of_one_rank_does_not_shard() {
    let mut opt = optimizer();
    opt.shard(Arc::new(kappa_dist::Single));
    assert!(!opt.is_sharded());
    assert_eq!(opt.traffic(), Default::default());
}

#[test]
fn a_rank_that_fails_its_step_makes_the_others_fail_naming_the_group() {
    tch::set_num_threads(1);
    let results = Threads::run_with_timeout(2, Duration::from_secs(120), |comm| {
        let rank = comm.rank();
        let mut opt = optimizer();
        opt.shard(Arc::new(comm));
        set_grads(&mut opt, 0, rank == 1);
        opt.step()
    })
    .unwrap();
    match &results[1] {
        Err(OptimError::Param { name, source }) => {
            assert_eq!(name, "h.0.qkv");
            assert!(matches!(**source, OptimError::Input(_)), "{source}");
        }
        other => panic!("rank 1: {other:?}"),
    }
    match &results[0] {
        Err(OptimError::Param { name, source }) => {
            assert!(name.contains("h.0.qkv"), "{name}");
            match &**source {
                OptimError::Collective { group, source } => {
                    assert_eq!(group, "attn");
                    assert!(
                        matches!(source, DistError::RankGone { rank: 1, .. }),
                        "{source}"
                    );
                }
                other => panic!("rank 0: {other}"),
            }
        }
        other => panic!("rank 0: {other:?}"),
    }
}

fn assert_same_bits_dbg(expected: &[(String, Tensor)], found: &[(String, Tensor)], what: &str) {
    for ((name, a), (_, b)) in expected.iter().zip(found) {
        if !a.equal(b) {
            eprintln!("DBG {what}: `{name}` differs");
        }
    }
}
