//! The accuracy effect of bf16 autocast training on gpt-sotu's model: the CPU-preset GPT
//! (character level, baseline attention) trained with f32 and with `precision = bf16` from the
//! same initialization and data order, for several seeds; prints each run's final validation
//! loss (evaluated in f32) and the per-seed difference bf16 − f32.
//!
//! `cargo run --release -p kappa-train --example bf16_accuracy -- SOTU_DIR [steps] [seeds] [threads]`
//!
//! `SOTU_DIR` holds `train.txt` and `val.txt` (what `cargo xtask setup --data sotu` writes).
//! The schedule is gpt-sotu's CPU one (lr 3·10⁻³ to 3·10⁻⁴, batch 32, weight decay 0.1) over
//! `steps` steps (default 400) with a warmup of steps/25; the validation loss is the mean over
//! 40 batches, as gpt-sotu's final one.

use std::path::PathBuf;

use kappa_models::{Gpt, GptConfig, TextCorpus, TokenizerKind};
use kappa_train::{
    seeded, LanguageModeling, RunContext, Task, TrainConfig, TrainPrecision, Trainer,
};
use tch::Device;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(
        args.get(1)
            .ok_or("usage: bf16_accuracy SOTU_DIR [steps] [seeds] [threads]")?,
    );
    let steps: u64 = args.get(2).map_or(Ok(400), |a| a.parse())?;
    let seeds: u64 = args.get(3).map_or(Ok(3), |a| a.parse())?;
    let threads: usize = args.get(4).map_or(Ok(2), |a| a.parse())?;
    if !kappa_models::autocast::native_bf16(Device::Cpu) {
        println!("this CPU has no native bf16: nothing to compare");
        return Ok(());
    }
    let vocab = TextCorpus::load_sotu(&dir, TokenizerKind::Char, None, Device::Cpu)?
        .tokenizer
        .vocab_size();
    println!("| seed | f32 val loss | bf16 val loss | bf16 − f32 | f32 s/step | bf16 s/step |");
    println!("|---|---|---|---|---|---|");
    let mut diffs = Vec::new();
    for seed in 0..seeds {
        let mut out = Vec::new();
        for precision in [TrainPrecision::F32, TrainPrecision::Bf16] {
            let vs = tch::nn::VarStore::new(Device::Cpu);
            let gpt = seeded(seed, || Gpt::new(&vs.root(), GptConfig::cpu(vocab)))?;
            let corpus = TextCorpus::load_sotu(&dir, TokenizerKind::Char, None, Device::Cpu)?;
            let mut task = LanguageModeling::new(gpt, corpus, seed)?;
            let cfg = TrainConfig {
                steps,
                batch_size: 32,
                lr: 3e-3,
                min_lr: 3e-4,
                warmup_steps: (steps / 25).max(1),
                weight_decay: 0.1,
                eval_every: steps,
                eval_batches: 1,
                log_every: steps,
                precision,
                diagnostics: kappa_models::DiagnosticsConfig {
                    enabled: false,
                    ..Default::default()
                },
                ..TrainConfig::default()
            };
            let context = RunContext {
                seed,
                threads,
                ..RunContext::default()
            }
            .quiet();
            let mut trainer = Trainer::new(&vs, cfg, &context)?;
            let summary = trainer.run(&mut task, &mut |_| Ok(()), None)?;
            let eval = tch::no_grad(|| task.evaluate(40, 32))?;
            out.push((eval.loss, summary.seconds_per_step));
        }
        let d = out[1].0 - out[0].0;
        diffs.push(d);
        println!(
            "| {seed} | {:.4} | {:.4} | {d:+.4} | {:.4} | {:.4} |",
            out[0].0, out[1].0, out[0].1, out[1].1
        );
    }
    let n = diffs.len() as f64;
    let mean = diffs.iter().sum::<f64>() / n;
    let sd = (diffs.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
    println!("mean bf16 − f32 over {seeds} seeds: {mean:+.4} (sd {sd:.4}), {steps} steps");
    Ok(())
}
