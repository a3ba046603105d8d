//! Data-parallel training on ranks that are threads (kappa-dist's `Threads`): 2 ranks equal 1 rank
//! with 2 micro-batches bit for bit, checkpoints resume across world sizes, a stop raised on one
//! rank stops all at one step, and a rank that fails ends the others' run with an error.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kappa_dist::{Communicator, Threads};
use kappa_models::data::fixtures;
use kappa_models::{CorrectionConfig, Gpt, GptConfig, ModelsError, TextCorpus, TokenizerKind};
use kappa_train::{
    modulewise_groups, seeded, Eval, LanguageModeling, ModulewiseConfig, Outcome, Part, Preset,
    Record, RunContext, StopFlag, Task, TrainConfig, Trainer,
};
use tch::{nn, Device, Tensor};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kappa-dp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    fixtures::write_sotu(&dir).unwrap();
    dir
}

/// 4 sequences a step in 2 micro-batches of 2: one rank runs both, two ranks one each.
fn config(steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        batch_size: 4,
        micro_batch_size: 2,
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

/// Seed 5, one libtorch thread (put in force on the calling thread), no progress bar.
fn context() -> RunContext {
    let context = RunContext {
        seed: 5,
        threads: 1,
        ..RunContext::default()
    }
    .quiet();
    context.apply_threads();
    context
}

/// A tiny GPT whose weights are drawn with `init_seed` (ranks other than 0 draw other weights:
/// the broadcast of rank 0's must make them equal).
fn lm_task(dir: &Path, init_seed: u64) -> (nn::VarStore, LanguageModeling) {
    let corpus = TextCorpus::load_sotu(dir, TokenizerKind::Char, None, Device::Cpu).unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = GptConfig::tiny(corpus.tokenizer.vocab_size())
        .with_correction(CorrectionConfig::Svd { every: 2 });
    let gpt = seeded(init_seed, || Gpt::new(&vs.root(), cfg)).unwrap();
    (vs, LanguageModeling::new(gpt, corpus, 5).unwrap())
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

/// What a segment of training leaves: its outcome, its reproducible records, the variables.
struct Trained {
    outcome: Outcome,
    records: Vec<String>,
    vars: Vec<(String, Tensor)>,
}

/// Trains steps `from..to` of a 7-step run (from a checkpoint at `ckpt` when `from` > 0,
/// writing one there at `to`) on one rank of `comm`'s group (`None`: no data parallelism).
fn segment(
    dir: &Path,
    comm: Option<Arc<dyn Communicator>>,
    (from, to): (u64, u64),
    ckpt: &Path,
) -> Trained {
    segment_with(dir, comm, (from, to), ckpt, None)
}

/// [`segment`] with the groups of a module-wise preset (`None`: the default AdamW groups).
fn segment_with(
    dir: &Path,
    comm: Option<Arc<dyn Communicator>>,
    (from, to): (u64, u64),
    ckpt: &Path,
    preset: Option<Preset>,
) -> Trained {
    let rank = comm.as_ref().map_or(0, |c| c.rank());
    let context = context();
    let (vs, mut task) = lm_task(dir, 1 + 98 * rank as u64);
    let mut trainer = match preset {
        None => Trainer::new(&vs, config(7), &context).unwrap(),
        Some(p) => {
            let groups = modulewise_groups(&vs, &ModulewiseConfig::paper(p), &config(7)).unwrap();
            Trainer::with_groups(&vs, config(7), groups, &context).unwrap()
        }
    };
    if from > 0 {
        trainer.load_checkpoint(ckpt).unwrap();
    }
    if let Some(comm) = comm {
        let world = comm.world();
        trainer.data_parallel(comm).unwrap();
        assert_eq!(trainer.optimizer().is_sharded(), world > 1);
    }
    trainer.stop_after(to);
    let mut records = Vec::new();
    let summary = trainer
        .run(
            &mut task,
            &mut |r| {
                records.push(reproducible(r));
                Ok(())
            },
            Some(ckpt),
        )
        .unwrap();
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    Trained {
        outcome: summary.outcome,
        records,
        vars,
    }
}

/// `segment` on each rank of a group of `world` threads.
fn on_ranks(world: usize, dir: &Path, steps: (u64, u64), ckpt: &Path) -> Vec<Trained> {
    Threads::run(world, |comm| {
        segment(dir, Some(Arc::new(comm)), steps, ckpt)
    })
    .unwrap()
}

fn assert_same_vars(a: &[(String, Tensor)], b: &[(String, Tensor)], what: &str) {
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        assert!(ta.equal(tb), "{what}: {na}");
    }
}

#[test]
fn two_ranks_train_bit_for_bit_as_one_rank_with_two_micro_batches() {
    let dir = temp("equal");
    let ckpt = dir.join("unused.safetensors");
    let one = segment(&dir, None, (0, 7), &ckpt);
    let two = on_ranks(2, &dir, (0, 7), &ckpt);
    assert_eq!(one.outcome, Outcome::Completed);
    assert_eq!(
        one.records.len(),
        7 + 3,
        "7 train records, evaluations at 3, 6 and 7"
    );
    // The sum order is the same (part 0 + part 1 in both): the records and weights are equal.
    assert_eq!(two[0].records, one.records);
    assert!(two[1].records.is_empty(), "rank 1 sends no records");
    assert_same_vars(&two[0].vars, &one.vars, "rank 0 against one rank");
    assert_same_vars(&two[1].vars, &one.vars, "rank 1 against one rank");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_ranks_sharding_muon_and_manifold_muon_train_bit_for_bit_as_one_rank() {
    // Muon (UNCONSTRAINED) and Stiefel/DGram manifold Muon (HETERO): each rank orthogonalizes
    // its share of every batch of blocks and the weights and state are gathered.
    let dir = temp("sharded");
    let ckpt = dir.join("unused.safetensors");
    for preset in [Preset::Unconstrained, Preset::Hetero] {
        let one = segment_with(&dir, None, (0, 7), &ckpt, Some(preset));
        let two = Threads::run(2, |comm| {
            segment_with(&dir, Some(Arc::new(comm)), (0, 7), &ckpt, Some(preset))
        })
        .unwrap();
        assert_eq!(two[0].records, one.records, "{preset:?}");
        assert_same_vars(&two[0].vars, &one.vars, "rank 0 against one rank");
        assert_same_vars(&two[1].vars, &one.vars, "rank 1 against one rank");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_run_checkpointed_on_two_ranks_resumes_on_one_and_back_on_two_exactly() {
    let dir = temp("resume");
    let ckpt = dir.join("run/checkpoint.safetensors");
    let straight = segment(&dir, None, (0, 7), &dir.join("straight.safetensors"));
    let a = on_ranks(2, &dir, (0, 3), &ckpt);
    assert_eq!(a[0].outcome, Outcome::Interrupted { step: 3 });
    assert_eq!(a[1].outcome, Outcome::Interrupted { step: 3 });
    let b = segment(&dir, None, (3, 5), &ckpt);
    assert_eq!(b.outcome, Outcome::Interrupted { step: 5 });
    let c = on_ranks(2, &dir, (5, 7), &ckpt);
    assert_eq!(c[0].outcome, Outcome::Completed);
    let resumed: Vec<String> = [&a[0].records, &b.records, &c[0].records]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    assert_eq!(resumed, straight.records);
    assert_same_vars(&c[0].vars, &straight.vars, "rank 0");
    assert_same_vars(&c[1].vars, &straight.vars, "rank 1");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A task that calls `hook(step)` before each training loss of the wrapped one.
struct Hooked<F> {
    task: LanguageModeling,
    hook: F,
}

impl<F: FnMut(u64) -> kappa_models::Result<()>> Task for Hooked<F> {
    fn unit(&self) -> &'static str {
        self.task.unit()
    }
    fn train_loss(
        &mut self,
        step: u64,
        b: usize,
        part: Part,
    ) -> kappa_models::Result<(Tensor, u64)> {
        (self.hook)(step)?;
        self.task.train_loss(step, b, part)
    }
    fn evaluate(&mut self, n: usize, b: usize) -> kappa_models::Result<Eval> {
        self.task.evaluate(n, b)
    }
    fn diagnostics(
        &mut self,
        c: &kappa_models::DiagnosticsConfig,
    ) -> kappa_models::Result<Vec<kappa_models::HeadDiagnostics>> {
        self.task.diagnostics(c)
    }
    fn after_step(&mut self, step: u64) -> kappa_models::Result<()> {
        self.task.after_step(step)
    }
}

/// Runs 7 steps on each rank of 2 with `hook(rank, stop)` called before each training loss;
/// each rank's result and the checkpoint's path.
fn hooked_run<F>(dir: &Path, hook: F) -> (Vec<Result<Outcome, ModelsError>>, PathBuf)
where
    F: Fn(usize, &StopFlag, u64) -> kappa_models::Result<()> + Sync,
{
    let ckpt = dir.join("hooked.safetensors");
    let out = Threads::run(2, |comm| {
        let rank = comm.rank();
        let context = context();
        let (vs, task) = lm_task(dir, 1);
        let mut trainer = Trainer::new(&vs, config(7), &context)?;
        trainer.data_parallel(Arc::new(comm))?;
        let stop = context.stop.clone();
        let mut task = Hooked {
            task,
            hook: |step| hook(rank, &stop, step),
        };
        let summary = trainer.run(&mut task, &mut |_| Ok(()), Some(&ckpt))?;
        Ok(summary.outcome)
    })
    .unwrap();
    (out, ckpt)
}

#[test]
fn a_stop_raised_on_one_rank_stops_every_rank_after_the_same_step_with_a_checkpoint() {
    let dir = temp("stop");
    // Rank 1's flag is raised during step index 2: both ranks finish it and stop.
    let (out, ckpt) = hooked_run(&dir, |rank, stop, step| {
        if rank == 1 && step == 2 {
            stop.raise();
        }
        Ok(())
    });
    for outcome in out {
        assert_eq!(outcome.unwrap(), Outcome::Interrupted { step: 3 });
    }
    let saved = Tensor::read_safetensors(&ckpt).unwrap();
    let step = saved.iter().find(|(n, _)| n == "trainer/step").unwrap();
    assert_eq!(step.1.int64_value(&[0]), 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_rank_that_fails_ends_the_others_run_with_an_error_naming_it_not_a_hang() {
    let dir = temp("fail");
    let (out, _) = hooked_run(&dir, |rank, _, step| match (rank, step) {
        (1, 2) => Err(ModelsError::Sink("rank 1 fails on purpose".into())),
        _ => Ok(()),
    });
    assert!(matches!(&out[1], Err(ModelsError::Sink(m)) if m.contains("on purpose")));
    let err = out[0].as_ref().unwrap_err().to_string();
    assert!(err.contains("rank 1 left the group"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_batch_that_does_not_split_over_the_ranks_or_micro_batches_is_an_error_naming_the_key() {
    let cfg = |batch_size, micro_batch_size| TrainConfig {
        batch_size,
        micro_batch_size,
        ..config(7)
    };
    let err = cfg(4, 3).validate().unwrap_err().to_string();
    assert!(
        err.contains("train.micro_batch_size") && err.contains("must divide"),
        "{err}"
    );
    // 4 = 2 parts of 2: not a multiple of 3 ranks (the parts), nor of 4 ranks.
    for world in [3, 4] {
        let err = cfg(4, 2).parts(world).unwrap_err().to_string();
        assert!(
            err.contains("train.batch_size") && err.contains(&format!("{world} ranks")),
            "{err}"
        );
    }
    assert_eq!(cfg(4, 0).parts(4).unwrap(), 4);
    assert_eq!(cfg(8, 2).parts(2).unwrap(), 4);
    let clipped = TrainConfig {
        qk_clip: Some(kappa_optim::QkClipConfig::default()),
        ..cfg(4, 0)
    };
    assert_eq!(clipped.parts(1).unwrap(), 1);
    let err = clipped.parts(2).unwrap_err().to_string();
    assert!(err.contains("train.qk_clip"), "{err}");
    let err = TrainConfig {
        micro_batch_size: 2,
        ..clipped
    }
    .validate()
    .unwrap_err();
    assert!(err.to_string().contains("train.qk_clip"), "{err}");

    // On ranks: every rank refuses the config before any collective.
    let dir = temp("split");
    let out = Threads::run(3, |comm| {
        let (vs, _task) = lm_task(&dir, 1);
        let mut trainer = Trainer::new(&vs, config(7), &context()).unwrap();
        trainer
            .data_parallel(Arc::new(comm))
            .map_err(|e| e.to_string())
    })
    .unwrap();
    for r in out {
        assert!(r.unwrap_err().contains("train.batch_size"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
