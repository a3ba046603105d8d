//! Times training steps (gradients dropped, forward, backward, AdamW) of the CPU-sized GPT and ViT on random data.
//!
//! `cargo run --release -p kappa-train --example step_time -- [threads] [steps]`

use std::time::Instant;

use kappa_models::{CorrectionConfig, Gpt, GptConfig, HeadLayout, Vit, VitConfig};
use kappa_train::{seeded, TrainConfig};
use tch::{nn, Device, Kind, Tensor};

fn time_steps(vs: &nn::VarStore, steps: usize, mut loss: impl FnMut() -> Tensor) -> f64 {
    let cfg = TrainConfig {
        ..TrainConfig::default()
    };
    let groups = kappa_train::adamw_groups(vs, &cfg).unwrap();
    let mut opt = kappa_optim::Optimizer::new(groups).unwrap();
    let mut run = || {
        opt.zero_grad().unwrap();
        loss().backward();
        opt.step().unwrap();
    };
    run();
    let t = Instant::now();
    for _ in 0..steps {
        run();
    }
    t.elapsed().as_secs_f64() / steps as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: i32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let steps: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(10);
    tch::set_num_threads(threads);
    let conds = [
        CorrectionConfig::None,
        CorrectionConfig::identity(10.0, HeadLayout::Shifted),
        CorrectionConfig::Svd { every: 1 },
    ];
    for c in conds {
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = VitConfig::cpu().with_correction(c);
        let vit = seeded(0, || Vit::new(&vs.root(), cfg)).unwrap();
        let (x, y) = seeded(1, || {
            (
                Tensor::randn([128, 1, 28, 28], (Kind::Float, Device::Cpu)),
                Tensor::randint(10, [128], (Kind::Int64, Device::Cpu)),
            )
        });
        let s = time_steps(&vs, steps, || {
            let l = vit.loss(&x, &y).unwrap();
            if matches!(c, CorrectionConfig::Svd { .. }) {
                use kappa_models::Transformer;
                vit.refresh_correction(1).unwrap();
            }
            l
        });
        println!(
            "vit cpu {:<24} B=128: {:.1} ms/step, {:.0} images/s",
            c.label(),
            s * 1e3,
            128.0 / s
        );
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = GptConfig::cpu(98).with_correction(c);
        let gpt = seeded(0, || Gpt::new(&vs.root(), cfg)).unwrap();
        let idx = seeded(1, || {
            Tensor::randint(98, [32, 64], (Kind::Int64, Device::Cpu))
        });
        let s = time_steps(&vs, steps, || gpt.loss(&idx, &idx).unwrap());
        println!(
            "gpt cpu {:<24} B=32 T=64: {:.1} ms/step, {:.0} tokens/s",
            c.label(),
            s * 1e3,
            2048.0 / s
        );
    }
}
