//! Every collective of [`Single`] and of [`Threads`] at worlds 1, 2 and 3 against answers
//! computed by hand, the sum order and precision, and the failures: ranks that disagree, leave,
//! panic or stall.

use std::sync::Mutex;
use std::time::Duration;

use kappa_dist::{Communicator, DistError, Op, ReduceOp, Single, Threads};
use tch::{Kind, Tensor};

fn values(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.to_kind(Kind::Double)).unwrap()
}

fn f32s(v: &[f64]) -> Tensor {
    Tensor::from_slice(v).to_kind(Kind::Float)
}

/// `f` on every rank of [`Single`] and of [`Threads`] groups of 1, 2 and 3 ranks: per group,
/// its world and the ranks' results in rank order.
fn in_every_world<R: Send>(f: impl Fn(&dyn Communicator) -> R + Sync) -> Vec<(usize, Vec<R>)> {
    let mut out = vec![(1, vec![f(&Single)])];
    for world in 1..=3 {
        out.push((world, Threads::run(world, |comm| f(&comm)).unwrap()));
    }
    out
}

#[test]
fn all_reduce_sums_and_means_the_ranks_tensors_at_world_1_2_and_3() {
    // Rank r holds (r + 1)·[1, 10]: the sum is W(W+1)/2·[1, 10], the mean (W+1)/2·[1, 10].
    let runs = in_every_world(|comm| {
        let r = (comm.rank() + 1) as f64;
        let (mut sum, mut mean) = (f32s(&[r, 10.0 * r]), f32s(&[r, 10.0 * r]));
        comm.all_reduce_sum(&mut sum).unwrap();
        comm.all_reduce(&mut mean, ReduceOp::Mean).unwrap();
        (values(&sum), values(&mean))
    });
    for (world, ranks) in runs {
        let w = world as f64;
        for (sum, mean) in ranks {
            assert_eq!(sum, [w * (w + 1.0) / 2.0, 5.0 * w * (w + 1.0)], "W {world}");
            assert_eq!(mean, [(w + 1.0) / 2.0, 5.0 * (w + 1.0)], "W {world}");
        }
    }
}

#[test]
fn reduce_scatter_gives_each_rank_its_shard_of_the_sum() {
    // Rank r holds (r + 1)·[1, 2, 3, 4, 5]; the sum is S·[1..5] with S = W(W+1)/2. Shards of 5:
    // W = 2: [0, 3), [3, 5); W = 3: [0, 2), [2, 4), [4, 5).
    let runs = in_every_world(|comm| {
        let r = (comm.rank() + 1) as f64;
        let input = f32s(&[r, 2.0 * r, 3.0 * r, 4.0 * r, 5.0 * r]);
        let len = kappa_dist::shard_range(5, comm.world(), comm.rank()).len() as i64;
        let mut out = Tensor::zeros([len], (Kind::Float, tch::Device::Cpu));
        comm.reduce_scatter(&input, &mut out, ReduceOp::Sum)
            .unwrap();
        values(&out)
    });
    let expected: [&[&[f64]]; 4] = [
        &[&[1.0, 2.0, 3.0, 4.0, 5.0]],
        &[&[1.0, 2.0, 3.0, 4.0, 5.0]],
        &[&[3.0, 6.0, 9.0], &[12.0, 15.0]],
        &[&[6.0, 12.0], &[18.0, 24.0], &[30.0]],
    ];
    for ((world, ranks), expected) in runs.into_iter().zip(expected) {
        assert_eq!(ranks, expected, "W {world}");
    }
}

#[test]
fn all_gather_concatenates_the_shards_in_rank_order_even_uneven_or_empty_ones() {
    // Rank r's shard of [0, 1, …, N−1] is the values of its range; every rank gets them all.
    for numel in [5usize, 2] {
        let runs = in_every_world(|comm| {
            let range = kappa_dist::shard_range(numel, comm.world(), comm.rank());
            let shard = f32s(&range.map(|i| i as f64).collect::<Vec<_>>());
            let mut out = Tensor::full([numel as i64], -1.0, (Kind::Float, tch::Device::Cpu));
            comm.all_gather(&shard, &mut out).unwrap();
            values(&out)
        });
        let expected: Vec<f64> = (0..numel).map(|i| i as f64).collect();
        for (world, ranks) in runs {
            for out in ranks {
                assert_eq!(out, expected, "N {numel} W {world}");
            }
        }
    }
}

#[test]
fn all_gather_fills_a_strided_output_in_its_logical_order() {
    // The output is a transposed 2×3 view: the gathered [0..6] must land in its logical order.
    let runs = in_every_world(|comm| {
        let range = kappa_dist::shard_range(6, comm.world(), comm.rank());
        let shard = f32s(&range.map(|i| i as f64).collect::<Vec<_>>());
        let mut out = Tensor::zeros([3, 2], (Kind::Float, tch::Device::Cpu)).tr();
        assert!(!out.is_contiguous());
        comm.all_gather(&shard, &mut out).unwrap();
        values(&out.reshape([-1]))
    });
    for (world, ranks) in runs {
        for out in ranks {
            assert_eq!(out, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "W {world}");
        }
    }
}

#[test]
fn all_gather_in_place_reads_the_shard_from_this_ranks_part_of_the_output() {
    let runs = in_every_world(|comm| {
        let range = kappa_dist::shard_range(7, comm.world(), comm.rank());
        let mut out = Tensor::full([7], -1.0, (Kind::Float, tch::Device::Cpu));
        let values_of_mine: Vec<f64> = range.clone().map(|i| i as f64).collect();
        let shard = out.narrow(0, range.start as i64, range.len() as i64);
        shard.shallow_clone().copy_(&f32s(&values_of_mine));
        comm.all_gather(&shard, &mut out).unwrap();
        values(&out)
    });
    for (world, ranks) in runs {
        for out in ranks {
            assert_eq!(out, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "W {world}");
        }
    }
}

#[test]
fn a_rank_may_overwrite_its_shard_or_root_tensor_as_soon_as_the_call_returns() {
    // The ranks read each other's tensors (no intermediate copy): a rank that writes into its
    // shard right after its call must not change what a slower rank reads. Rank 0 sleeps
    // before each read-side step, so the others are first to return and overwrite.
    let runs = in_every_world(|comm| {
        let (rank, world) = (comm.rank(), comm.world());
        let mut seen = Vec::new();
        for round in 0..20 {
            let value = (100 * round + rank) as f64;
            let mut shard = f32s(&[value; 4]);
            let mut out = Tensor::zeros([4 * world as i64], (Kind::Float, tch::Device::Cpu));
            if rank == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            comm.all_gather(&shard, &mut out).unwrap();
            let _ = shard.fill_(-1.0);
            let mut t = f32s(&[value]);
            if rank == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            comm.broadcast(&mut t, world - 1).unwrap();
            seen.push([values(&out), values(&t)].concat());
            let _ = t.fill_(-1.0);
        }
        seen
    });
    for (world, ranks) in runs {
        for seen in ranks {
            for (round, out) in seen.iter().enumerate() {
                let mut expected: Vec<f64> = (0..world)
                    .flat_map(|r| [(100 * round + r) as f64; 4])
                    .collect();
                expected.push((100 * round + world - 1) as f64);
                assert_eq!(*out, expected, "W {world} round {round}");
            }
        }
    }
}

#[test]
fn broadcast_copies_the_roots_tensor_into_every_rank_even_a_parameter() {
    // Rank r holds [r, r, r] (requiring grad, as a parameter does); the root is the last rank.
    let runs = in_every_world(|comm| {
        let r = comm.rank() as f64;
        let mut t = f32s(&[r, r, r]).set_requires_grad(true);
        comm.broadcast(&mut t, comm.world() - 1).unwrap();
        comm.barrier().unwrap();
        values(&t)
    });
    for (world, ranks) in runs {
        let root = (world - 1) as f64;
        for t in ranks {
            assert_eq!(t, [root; 3], "W {world}");
        }
    }
}

#[test]
fn sums_run_in_ascending_rank_order() {
    // f32: (1e8 + 1) + (−1e8) = 0 (1e8 + 1 rounds to 1e8), while 1e8 + (−1e8) + 1 would be 1.
    let sums = Threads::run(3, |comm| {
        let mut t = f32s(&[[1e8, 1.0, -1e8][comm.rank()]]);
        comm.all_reduce_sum(&mut t).unwrap();
        values(&t)[0]
    })
    .unwrap();
    assert_eq!(sums, [0.0; 3]);
}

#[test]
fn bf16_sums_accumulate_in_f32_and_round_once() {
    // 1 + 2⁻⁸ + 2⁻⁸: in bf16 each addition rounds back to 1 (a tie, to even); in f32 the sum is
    // 1 + 2⁻⁷, which bf16 holds exactly.
    let tiny = 2f64.powi(-8);
    for reduce in [ReduceOp::Sum, ReduceOp::Mean] {
        let out = Threads::run(3, |comm| {
            let x = [1.0, tiny, tiny][comm.rank()];
            let mut t = Tensor::from_slice(&[x]).to_kind(Kind::BFloat16);
            comm.all_reduce(&mut t, reduce).unwrap();
            assert_eq!(t.kind(), Kind::BFloat16);
            values(&t)[0]
        })
        .unwrap();
        let sum = 1.0 + 2f64.powi(-7);
        let expected = match reduce {
            ReduceOp::Sum => sum,
            // (1 + 2⁻⁷)/3 in f32, then rounded to bf16 once.
            ReduceOp::Mean => values(&f32s(&[sum / 3.0]).to_kind(Kind::BFloat16))[0],
        };
        assert_eq!(out, [expected; 3], "{reduce}");
    }
}

#[test]
fn a_rank_that_returns_early_makes_the_others_fail_at_once_and_ever_after() {
    let out = Threads::run(3, |comm| {
        if comm.rank() == 2 {
            return Vec::new();
        }
        let mut t = f32s(&[1.0]);
        vec![comm.all_reduce_sum(&mut t), comm.barrier()]
    })
    .unwrap();
    let gone = DistError::RankGone {
        op: Op::AllReduce,
        rank: 2,
    };
    for errors in &out[..2] {
        assert_eq!(errors, &[Err(gone.clone()), Err(gone.clone())]);
    }
    assert!(gone.to_string().contains("rank 2 left the group"), "{gone}");
}

#[test]
fn a_rank_that_panics_makes_the_others_fail_and_run_names_it() {
    let seen = Mutex::new(Vec::new());
    let err = Threads::run(2, |comm| {
        if comm.rank() == 1 {
            panic!("rank 1 fails on purpose");
        }
        let mut t = f32s(&[1.0]);
        seen.lock().unwrap().push(comm.broadcast(&mut t, 0));
    })
    .unwrap_err();
    assert_eq!(
        err,
        DistError::Panicked {
            rank: 1,
            message: "rank 1 fails on purpose".into()
        }
    );
    let gone = DistError::RankGone {
        op: Op::Broadcast,
        rank: 1,
    };
    assert_eq!(*seen.lock().unwrap(), [Err(gone)]);
}

#[test]
fn a_rank_that_stalls_past_the_timeout_makes_the_others_fail_naming_it() {
    // Rank 1 waits (outside any collective) until rank 0 has timed out, then finds the group
    // failed: no clock decides the outcome, only the order the barrier imposes.
    let rank0_done = std::sync::Barrier::new(2);
    let timeout = Duration::from_millis(50);
    let out = Threads::run_with_timeout(2, timeout, |comm| {
        let mut t = f32s(&[1.0]);
        if comm.rank() == 1 {
            rank0_done.wait();
        }
        let result = comm.all_reduce_sum(&mut t);
        if comm.rank() == 0 {
            rank0_done.wait();
        }
        result
    })
    .unwrap();
    let timed_out = DistError::Timeout {
        op: Op::AllReduce,
        missing: vec![1],
        waited: timeout,
    };
    assert_eq!(out, [Err(timed_out.clone()), Err(timed_out)]);
}

#[test]
fn calls_that_disagree_fail_on_every_rank_naming_the_rank_and_both_calls() {
    let out = Threads::run(2, |comm| {
        let mut t = f32s(&vec![1.0; 3 + comm.rank()]);
        comm.all_reduce_sum(&mut t)
    })
    .unwrap();
    let Err(DistError::Mismatch {
        rank,
        expected,
        found,
    }) = &out[0]
    else {
        panic!("{:?}", out[0])
    };
    assert_eq!(out[0], out[1]);
    assert_eq!(*rank, 1);
    assert_eq!(expected, "all_reduce(sum) of 3 Float elements");
    assert_eq!(found, "all_reduce(sum) of 4 Float elements");

    let out = Threads::run(2, |comm| {
        let mut t = f32s(&[1.0]);
        match comm.rank() {
            0 => comm.all_reduce_sum(&mut t),
            _ => comm.broadcast(&mut t, 0),
        }
    })
    .unwrap();
    assert!(
        matches!(&out[1], Err(DistError::Mismatch { rank: 1, found, .. }) if found.starts_with("broadcast from rank 0")),
        "{out:?}"
    );
}

#[test]
fn arguments_that_do_not_fit_are_errors_naming_the_rank_and_the_sizes() {
    let input = f32s(&[1.0; 5]);
    let mut out = f32s(&[0.0; 3]);
    assert_eq!(
        Single.reduce_scatter(&input, &mut out, ReduceOp::Sum),
        Err(DistError::Size {
            op: Op::ReduceScatter,
            rank: 0,
            what: "out",
            expected: 5,
            found: 3
        })
    );
    let mut ints = Tensor::from_slice(&[1i64, 2]);
    let err = Single.all_reduce_mean(&mut ints).unwrap_err();
    assert!(err.to_string().contains("bf16, f16, f32 or f64"), "{err}");
    let mut bools = Tensor::from_slice(&[true]);
    assert!(Single.all_reduce_sum(&mut bools).is_err());
    let mut halves = f32s(&[0.0; 5]).to_kind(Kind::Half);
    assert!(
        Single.all_gather(&input, &mut halves).is_err(),
        "kinds differ"
    );
    let err = Single.broadcast(&mut out, 1).unwrap_err();
    assert!(
        err.to_string().contains("must lie in 0..1, found 1"),
        "{err}"
    );
    assert!(matches!(
        Threads::group(0, Duration::from_secs(1)),
        Err(DistError::World { world: 0, .. })
    ));

    // Rank 1's shard of 5 over 2 ranks holds 2 elements, not 3: its call fails on it, and rank 0,
    // left waiting, fails once rank 1 drops its communicator.
    let out = Threads::run(2, |comm| {
        let shard = f32s(&[1.0; 3]);
        let mut whole = f32s(&[0.0; 5]);
        comm.all_gather(&shard, &mut whole)
    })
    .unwrap();
    let size = DistError::Size {
        op: Op::AllGather,
        rank: 1,
        what: "shard",
        expected: 2,
        found: 3,
    };
    let gone = DistError::RankGone {
        op: Op::AllGather,
        rank: 1,
    };
    assert_eq!(out, [Err(gone), Err(size)]);
}
