//! A tch MLP trained with Muon on its hidden weights and AdamW on the rest, on a synthetic
//! ten-class problem (Gaussian clusters in 32 dimensions); with `--manifold`, its square hidden
//! weight is kept on the Stiefel manifold by manifold Muon instead.
//!
//! ```text
//! cargo run --release -p kappa-optim --features tch --example mlp_muon [-- --manifold]
//! ```

use kappa_optim::optimizer::{Grouping, Optimizer, Rule, Update};
use kappa_optim::{
    AdamWConfig, Manifold, ManifoldMuonConfig, MuonConfig, OptimError, WarmupCosine,
};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

const DIM: i64 = 32;
const CLASSES: i64 = 10;
const BATCH: i64 = 128;

/// The model: two hidden layers (`fc1`, `fc2`, 128 wide) and a `head`.
fn mlp(p: &nn::Path) -> impl Module {
    nn::seq()
        .add(nn::linear(p / "fc1", DIM, 128, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(p / "fc2", 128, 128, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(p / "head", 128, CLASSES, Default::default()))
}

/// Muon + AdamW, or the same with `fc2.weight` on the Stiefel manifold.
fn optimizer(vs: &nn::VarStore, manifold: bool, steps: u64) -> Result<Optimizer, OptimError> {
    let mut grouping = Grouping::muon_adamw(MuonConfig::keller(), AdamWConfig::torch(), 3e-3);
    if manifold {
        let stiefel = ManifoldMuonConfig::paper(Manifold::Stiefel);
        grouping = grouping
            .rule(Rule::new("stiefel", Update::Manifold(stiefel), 0.05).names(["fc2.weight"]));
    }
    Ok(grouping
        .build(vs)?
        .with_schedule(WarmupCosine::new(10, steps, 0.1)?))
}

/// Trains for `steps` steps from `seed`; returns the loss of every step.
pub fn train(manifold: bool, steps: u64, seed: i64) -> Result<Vec<f64>, OptimError> {
    tch::manual_seed(seed);
    let centers = Tensor::randn([CLASSES, DIM], (Kind::Float, Device::Cpu)) * 1.5;
    let vs = nn::VarStore::new(Device::Cpu);
    let model = mlp(&vs.root());
    let mut opt = optimizer(&vs, manifold, steps)?;
    let mut losses = Vec::new();
    for _ in 0..steps {
        let labels = Tensor::randint(CLASSES, [BATCH], (Kind::Int64, Device::Cpu));
        let x = centers.index_select(0, &labels)
            + Tensor::randn([BATCH, DIM], (Kind::Float, Device::Cpu));
        let loss = model.forward(&x).cross_entropy_for_logits(&labels);
        opt.zero_grad()?;
        loss.backward();
        opt.step()?;
        losses.push(loss.double_value(&[]));
    }
    Ok(losses)
}

#[allow(dead_code)]
fn main() -> Result<(), OptimError> {
    let manifold = std::env::args().any(|a| a == "--manifold");
    let losses = train(manifold, 200, 0)?;
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    println!(
        "loss: first 10 steps {:.3}, last 10 steps {:.3}",
        mean(&losses[..10]),
        mean(&losses[losses.len() - 10..])
    );
    Ok(())
}
