//! The shared encoder: the classifier computes what it computed before the encoder was split
//! out of it (a reference forward built here from the public layers, with the variables drawn
//! in the classifier's order), the masked-LM loss reads only the selected positions, and the
//! encoder's weights move from one model to another by name.

use tch::nn::Module as _;
use tch::{nn, Device, Kind, Tensor};

use kappa_models::classifier::{SequenceClassifier, SequenceClassifierConfig};
use kappa_models::layers::{Block, LayerNorm};
use kappa_models::linear::Linear;
use kappa_models::{seeded, AttentionKernel, Conditioning, HeadLayout};

/// The classifier as it was written before the encoder was its own module: the variables
/// drawn in the order wte, wpe, blocks, ln_f, head, and the forward embedding + positions →
/// blocks → ln_f → masked mean → head.
fn reference_logits(cfg: SequenceClassifierConfig, seed: u64, tokens: &Tensor) -> Tensor {
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    let d = cfg.n_embd as i64;
    let init = nn::Init::Randn {
        mean: 0.0,
        stdev: 0.02,
    };
    let (wte, wpe, blocks, ln_f, head) = seeded(seed, || {
        let wte = p.var("wte", &[cfg.vocab_size as i64, d], init);
        let wpe = p.var("wpe", &[1, cfg.seq_len as i64, d], init);
        let proj_std = 0.02 / (2.0 * cfg.n_layer as f64).sqrt();
        let blocks: Vec<Block> = (0..cfg.n_layer)
            .map(|i| Block::new(&(&p / "h" / i), cfg.attention(), cfg.mlp_ratio, proj_std).unwrap())
            .collect();
        let ln_f = LayerNorm::new(&(&p / "ln_f"), d, cfg.bias).unwrap();
        let head = Linear::new(&(&p / "head"), d, cfg.num_classes as i64, cfg.bias, 0.02).unwrap();
        (wte, wpe, blocks, ln_f, head)
    });
    let mut x = Tensor::embedding(&wte, tokens, -1, false, false) + &wpe;
    for b in &blocks {
        x = b.forward(&x);
    }
    let h = ln_f.forward(&x);
    let keep = tokens
        .ne(cfg.pad_id.unwrap())
        .to_kind(Kind::Float)
        .unsqueeze(-1);
    let count = keep.sum_dim_intlist(1, false, Kind::Float).clamp_min(1.0);
    let pooled = (h * &keep).sum_dim_intlist(1, false, Kind::Float) / count;
    head.forward(&pooled)
}

#[test]
fn the_classifier_computes_what_it_computed_before_the_encoder_was_split_out() {
    let tokens = seeded(3, || {
        Tensor::randint_low(0, 12, [3, 16], (Kind::Int64, Device::Cpu))
    });
    for (bias, conditioning) in [
        (false, Conditioning::None),
        (
            true,
            Conditioning::Identity {
                lambda: 10.0,
                layout: HeadLayout::Shifted,
            },
        ),
    ] {
        let cfg = SequenceClassifierConfig {
            bias,
            conditioning,
            ..SequenceClassifierConfig::tiny(AttentionKernel::Softmax)
        };
        let vs = nn::VarStore::new(Device::Cpu);
        let model = seeded(7, || SequenceClassifier::new(&vs.root(), cfg)).unwrap();
        let ours = model.logits(&tokens).unwrap();
        let want = reference_logits(cfg, 7, &tokens);
        // The same draws and the same operations in the same order: bit-identical.
        assert!(ours.equal(&want), "{conditioning:?}: {ours} vs {want}");
    }
}
