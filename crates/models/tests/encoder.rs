//! The shared encoder: the classifier computes what it computed before the encoder was split
//! out of it (a reference forward built here from the public layers, with the variables drawn
//! in the classifier's order), the masked-LM loss reads only the selected positions, and the
//! encoder's weights move from one model to another by name. Every draw from libtorch's
//! generator goes through `seeded`, whose lock keeps the parallel tests' draws apart.

use tch::nn::Module as _;
use tch::{nn, Device, Kind, Tensor};

use kappa_models::classifier::{SequenceClassifier, SequenceClassifierConfig};
use kappa_models::layers::{Block, LayerNorm};
use kappa_models::linear::Linear;
use kappa_models::{seeded, AttentionKernel, CorrectionConfig, HeadLayout};

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
    for (bias, correction) in [
        (false, CorrectionConfig::None),
        (true, CorrectionConfig::identity(10.0, HeadLayout::Shifted)),
    ] {
        let cfg = SequenceClassifierConfig {
            bias,
            correction,
            ..SequenceClassifierConfig::tiny(AttentionKernel::Softmax)
        };
        let vs = nn::VarStore::new(Device::Cpu);
        let model = seeded(7, || SequenceClassifier::new(&vs.root(), cfg)).unwrap();
        let ours = model.logits(&tokens).unwrap();
        let want = reference_logits(cfg, 7, &tokens);
        // The same draws and the same operations in the same order: bit-identical.
        assert!(ours.equal(&want), "{correction:?}: {ours} vs {want}");
    }
}

fn encoder_config(correction: CorrectionConfig) -> kappa_models::EncoderConfig {
    SequenceClassifierConfig {
        vocab_size: kappa_models::mlm::BYTE_VOCAB,
        pad_id: Some(kappa_models::mlm::PAD),
        correction,
        ..SequenceClassifierConfig::tiny(AttentionKernel::Softmax)
    }
    .encoder()
}

fn byte_text(seed: u64) -> Tensor {
    seeded(seed, || {
        Tensor::randint_low(32, 127, [4, 16], (Kind::Int64, Device::Cpu))
    })
}

#[test]
fn the_masked_lm_loss_reads_only_the_selected_positions() {
    use kappa_models::mlm::{mask_tokens, MaskedLm, MaskingRule, IGNORE};
    let vs = nn::VarStore::new(Device::Cpu);
    let model = seeded(1, || {
        MaskedLm::new(&vs.root(), encoder_config(CorrectionConfig::None))
    })
    .unwrap();
    let (inputs, targets) = mask_tokens(&byte_text(2), &MaskingRule::default(), 5, 0).unwrap();
    let out = model.loss(&inputs, &targets).unwrap();
    // round(0.15 · 16) = 2 positions per sequence.
    assert_eq!(out.predicted, 8);
    // The loss is the mean cross-entropy of the head's logits at the selected positions.
    let (h, _) = model.forward_trace(&inputs, false);
    let logits = model.head(&h);
    let flat_t = targets.flatten(0, -1);
    let keep = flat_t.ne(IGNORE);
    let sel_logits = logits
        .reshape([-1, 258])
        .index(&[Some(keep.shallow_clone())]);
    let want = sel_logits.cross_entropy_for_logits(&flat_t.masked_select(&keep));
    // The same selected rows through the same head: equal up to the order of the reduction
    // over 8 terms (8 ulps of the f32 loss is a generous bound for that).
    let (a, b) = (out.loss.double_value(&[]), want.double_value(&[]));
    assert!(
        (a - b).abs() <= 8.0 * f64::from(f32::EPSILON) * b.abs(),
        "{a} vs {b}"
    );
    // A batch with no selected position is an error, not a silent 0 or NaN.
    let none = Tensor::full([4, 16], IGNORE, (Kind::Int64, Device::Cpu));
    assert!(model.loss(&inputs, &none).is_err());
}

#[test]
fn berts_masking_rule_selects_fifteen_percent_and_replaces_eighty_ten_ten() {
    use kappa_models::mlm::{mask_tokens, MaskingRule, IGNORE, MASK, PAD};
    // 2000 sequences of 40 bytes, the last 10 of each padding: 30 real positions, so
    // round(4.5) = 5 (rounding half away from zero) selected in each.
    let mut ids = vec![65i64; 2000 * 40];
    for row in ids.chunks_mut(40) {
        row[30..].fill(PAD);
    }
    let tokens = Tensor::from_slice(&ids).view([2000, 40]);
    let (inputs, targets) = mask_tokens(&tokens, &MaskingRule::default(), 9, 3).unwrap();
    let x = Vec::<i64>::try_from(inputs.flatten(0, -1)).unwrap();
    let y = Vec::<i64>::try_from(targets.flatten(0, -1)).unwrap();
    let (mut masked, mut random, mut kept) = (0usize, 0usize, 0usize);
    for (row_x, row_y) in x.chunks(40).zip(y.chunks(40)) {
        assert_eq!(row_y.iter().filter(|&&t| t != IGNORE).count(), 5);
        assert!(
            row_y[30..].iter().all(|&t| t == IGNORE),
            "padding is never selected"
        );
        assert!(row_x[30..].iter().all(|&t| t == PAD));
        for (&xi, &yi) in row_x.iter().zip(row_y) {
            match (yi != IGNORE, xi) {
                (false, xi) => assert!(xi == 65 || xi == PAD, "unselected inputs stay"),
                (true, MASK) => masked += 1,
                (true, 65) => kept += 1, // unchanged, or a random byte that drew 65 (1/256)
                (true, _) => random += 1,
            }
        }
    }
    let n = 10_000.0;
    // Binomial counts: each fraction within 4 standard deviations √(p(1−p)/n) of its p.
    for (count, p) in [
        (masked, 0.8),
        (random, 0.1 * 255.0 / 256.0),
        (kept, 0.1 + 0.1 / 256.0),
    ] {
        let f = count as f64 / n;
        assert!(
            (f - p).abs() < 4.0 * (p * (1.0 - p) / n).sqrt(),
            "{f} vs {p}"
        );
    }
    // A pure function of (seed, stream).
    let again = mask_tokens(&tokens, &MaskingRule::default(), 9, 3).unwrap();
    assert!(again.0.equal(&inputs) && again.1.equal(&targets));
    let other = mask_tokens(&tokens, &MaskingRule::default(), 9, 4).unwrap();
    assert!(!other.1.equal(&targets));
    let bad = MaskingRule {
        mask: 0.95,
        ..MaskingRule::default()
    };
    assert!(mask_tokens(&tokens, &bad, 0, 0)
        .unwrap_err()
        .to_string()
        .contains("masking.random"));
}

#[test]
fn encoder_weights_move_from_the_masked_lm_into_the_classifier_by_name() {
    use kappa_models::encoder::is_encoder_variable;
    use kappa_models::mlm::{MaskedLm, PAD};
    use kappa_models::{copy_encoder, load_encoder};
    let cond = CorrectionConfig::identity(10.0, HeadLayout::Shifted);
    let enc = encoder_config(cond);
    let (src, dst) = (
        nn::VarStore::new(Device::Cpu),
        nn::VarStore::new(Device::Cpu),
    );
    let _mlm = seeded(1, || MaskedLm::new(&src.root(), enc)).unwrap();
    let cls_cfg = SequenceClassifierConfig::from_encoder(enc, Some(PAD), 2);
    let cls = seeded(2, || SequenceClassifier::new(&dst.root(), cls_cfg)).unwrap();
    let before = dst.variables();
    let copied = copy_encoder(&src, &dst).unwrap();
    let (s, d) = (src.variables(), dst.variables());
    // Exactly the encoder: every encoder variable equals the source's, the head is untouched.
    let want: Vec<String> = {
        let mut v: Vec<String> = d
            .keys()
            .filter(|n| is_encoder_variable(n))
            .cloned()
            .collect();
        v.sort();
        v
    };
    assert_eq!(copied, want);
    assert!(copied.iter().any(|n| n.ends_with("attn.lambda")));
    for (name, t) in &d {
        if is_encoder_variable(name) {
            assert!(t.equal(&s[name]), "{name} was not copied");
        } else {
            assert!(t.equal(&before[name]), "{name} outside the encoder changed");
        }
    }
    assert!(d.contains_key("head.weight") && !d.keys().any(|n| n.starts_with("mlm.")));
    let tokens = byte_text(4);
    assert_eq!(cls.logits(&tokens).unwrap().size(), vec![4, 2]);

    // Through a file with a prefix, as kappa-train's checkpoints store the variables.
    let file =
        std::env::temp_dir().join(format!("kappa-encoder-{}.safetensors", std::process::id()));
    let named: Vec<(String, Tensor)> = s
        .iter()
        .map(|(n, t)| (format!("model/{n}"), t.copy()))
        .collect();
    Tensor::write_safetensors(&named, &file).unwrap();
    let third = nn::VarStore::new(Device::Cpu);
    let _c = seeded(3, || SequenceClassifier::new(&third.root(), cls_cfg)).unwrap();
    assert_eq!(load_encoder(&file, "model/", &third).unwrap(), want);
    assert!(third.variables()["encoder.wte"].equal(&s["encoder.wte"]));

    // A wider model: every mismatching variable is named, and nothing is written.
    let wide = nn::VarStore::new(Device::Cpu);
    let wide_cfg = SequenceClassifierConfig {
        n_embd: 32,
        ..cls_cfg
    };
    let _w = seeded(4, || SequenceClassifier::new(&wide.root(), wide_cfg)).unwrap();
    let wte = wide.variables()["encoder.wte"].copy();
    let err = copy_encoder(&src, &wide).unwrap_err().to_string();
    assert!(
        err.contains("`encoder.wte` is [258, 16]") && err.contains("[258, 32]"),
        "{err}"
    );
    assert!(err.contains("encoder.h.1.attn.c_attn.weight"), "{err}");
    assert!(wide.variables()["encoder.wte"].equal(&wte));
    // A deeper model lacks nothing the source has, but the source lacks its third block.
    let deep = nn::VarStore::new(Device::Cpu);
    let deep_cfg = SequenceClassifierConfig {
        n_layer: 3,
        ..cls_cfg
    };
    let _d = seeded(5, || SequenceClassifier::new(&deep.root(), deep_cfg)).unwrap();
    let err = copy_encoder(&src, &deep).unwrap_err().to_string();
    assert!(
        err.contains("`encoder.h.2.ln_1.weight` is missing"),
        "{err}"
    );
    // Another correction: the λ buffers exist on one side only.
    let plain = nn::VarStore::new(Device::Cpu);
    let plain_cfg = SequenceClassifierConfig {
        correction: CorrectionConfig::None,
        ..cls_cfg
    };
    let _p = seeded(6, || SequenceClassifier::new(&plain.root(), plain_cfg)).unwrap();
    let err = copy_encoder(&src, &plain).unwrap_err().to_string();
    assert!(
        err.contains("lacks") && err.contains("attn.lambda"),
        "{err}"
    );
    std::fs::remove_file(&file).ok();
}
