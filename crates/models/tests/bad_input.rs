//! Bad input to the models is an error naming the argument, never a panic: token ids outside
//! the vocabulary (= V, or negative), targets and labels outside their range or of another
//! kind, and inputs of too few dimensions to the checked forward passes. Every draw from
//! libtorch's generator goes through `seeded`, whose lock keeps the parallel tests' draws apart.

use tch::{nn, Device, Kind, Tensor};

use kappa_models::encoder::EncoderConfig;
use kappa_models::mlm::{BYTE_VOCAB, IGNORE};
use kappa_models::{
    seeded, AttentionKernel, CorrectionConfig, Gpt, GptConfig, MaskedLm, ModelsError, ScoreScale,
    SequenceClassifier, SequenceClassifierConfig, Vit, VitConfig,
};

const CPU: Device = Device::Cpu;

/// Asserts that `result` is a [`ModelsError::Shape`] naming `arg` whose reason contains
/// `text`.
fn refused<T>(result: kappa_models::Result<T>, arg: &str, text: &str) {
    match result {
        Err(ModelsError::Shape { arg: named, reason }) => {
            assert_eq!(named, arg, "{reason}");
            assert!(reason.contains(text), "`{arg}`: {reason}");
        }
        Err(other) => panic!("expected a shape error naming `{arg}`, got {other}"),
        Ok(_) => panic!("`{arg}`: bad input was accepted"),
    }
}

/// B×T Int64 ids on the CPU.
fn ids(values: &[i64], t: i64) -> Tensor {
    Tensor::from_slice(values).view([-1, t])
}

#[test]
fn gpt_token_ids_and_targets_outside_the_vocabulary_are_errors() {
    let vs = nn::VarStore::new(CPU);
    let gpt = seeded(0, || Gpt::new(&vs.root(), GptConfig::tiny(11))).unwrap();
    let good = ids(&[1, 2, 3, 4], 4);
    // A token id equal to the vocabulary size, and a negative one.
    refused(gpt.logits(&ids(&[1, 2, 11, 4], 4)), "idx", "[0, 11)");
    refused(gpt.logits(&ids(&[1, -1, 3, 4], 4)), "idx", "found [-1, 4]");
    refused(gpt.loss(&ids(&[0, 11, 0, 0], 4), &good), "idx", "token ids");
    refused(
        gpt.try_forward_trace(&ids(&[-5, 2, 3, 4], 4), true),
        "idx",
        "token ids",
    );
    // One dimension, or another kind, is an error of the checked forward pass too.
    refused(
        gpt.try_forward_trace(&Tensor::from_slice(&[1i64, 2]), false),
        "idx",
        "B×T",
    );
    refused(
        gpt.logits(&Tensor::zeros([1, 4], (Kind::Float, CPU))),
        "idx",
        "Int64",
    );
    // Targets outside the vocabulary, of another kind or another shape.
    refused(
        gpt.loss(&good, &ids(&[1, 2, 3, 11], 4)),
        "targets",
        "[0, 11)",
    );
    refused(
        gpt.loss(&good, &ids(&[1, 2, -1, 4], 4)),
        "targets",
        "[0, 11)",
    );
    refused(
        gpt.loss(&good, &Tensor::zeros([1, 4], (Kind::Float, CPU))),
        "targets",
        "Int64",
    );
    refused(gpt.loss(&good, &ids(&[1, 2, 3], 3)), "targets", "[1, 4]");
    // PyTorch's ignore index leaves a position out of the mean.
    let loss = gpt.loss(&good, &ids(&[2, IGNORE, 4, 5], 4)).unwrap();
    assert!(loss.double_value(&[]).is_finite());
}

#[test]
fn vit_labels_outside_the_classes_are_errors() {
    let vs = nn::VarStore::new(CPU);
    let vit = seeded(1, || Vit::new(&vs.root(), VitConfig::tiny())).unwrap();
    let images = seeded(2, || Tensor::randn([2, 1, 28, 28], (Kind::Float, CPU)));
    refused(
        vit.loss(&images, &Tensor::from_slice(&[0i64, 10])),
        "labels",
        "[0, 10)",
    );
    refused(
        vit.loss(&images, &Tensor::from_slice(&[-1i64, 3])),
        "labels",
        "found [-1, 3]",
    );
    refused(
        vit.loss(&images, &Tensor::from_slice(&[0.0f32, 3.0])),
        "labels",
        "Int64",
    );
    refused(
        vit.try_forward_trace(&Tensor::zeros([28], (Kind::Float, CPU)), true),
        "images",
        "B×1×28×28",
    );
    let loss = vit.loss(&images, &Tensor::from_slice(&[0i64, 9])).unwrap();
    assert!(loss.double_value(&[]).is_finite());
}

#[test]
fn classifier_tokens_and_labels_outside_their_range_are_errors() {
    let vs = nn::VarStore::new(CPU);
    let cfg = SequenceClassifierConfig::tiny(AttentionKernel::Softmax);
    let model = seeded(3, || SequenceClassifier::new(&vs.root(), cfg)).unwrap();
    let tokens = Tensor::ones([2, 16], (Kind::Int64, CPU));
    let mut negative = vec![1i64; 16];
    negative[7] = -3;
    refused(model.logits(&ids(&negative, 16)), "tokens", "token ids");
    refused(
        model.try_forward_trace(&Tensor::full([1, 16], 12, (Kind::Int64, CPU)), true),
        "tokens",
        "[0, 12)",
    );
    refused(
        model.try_forward_trace(&Tensor::ones([16], (Kind::Int64, CPU)), false),
        "tokens",
        "B×16",
    );
    // Three classes: the label 3 is one too many.
    refused(
        model.loss(&tokens, &Tensor::from_slice(&[0i64, 3])),
        "labels",
        "[0, 3)",
    );
    refused(
        model.loss(&tokens, &Tensor::from_slice(&[-1i64, 0])),
        "labels",
        "[0, 3)",
    );
    assert!(model.loss(&tokens, &Tensor::from_slice(&[0i64, 2])).is_ok());
}

#[test]
fn masked_lm_targets_outside_the_vocabulary_are_errors_and_ignore_is_respected() {
    let cfg = EncoderConfig {
        vocab_size: BYTE_VOCAB,
        seq_len: 4,
        n_layer: 1,
        n_head: 2,
        n_embd: 8,
        mlp_ratio: 2,
        bias: false,
        scaling: ScoreScale::InvSqrtK,
        correction: CorrectionConfig::None,
        fused_kernel: true,
        kernel: AttentionKernel::Softmax,
    };
    let vs = nn::VarStore::new(CPU);
    let model = seeded(4, || MaskedLm::new(&vs.root(), cfg)).unwrap();
    let inputs = ids(&[10, 20, 30, 40], 4);
    let v = BYTE_VOCAB as i64;
    refused(
        model.loss(
            &ids(&[10, v, 30, 40], 4),
            &ids(&[IGNORE, 1, IGNORE, IGNORE], 4),
        ),
        "tokens",
        "token ids",
    );
    refused(
        model.loss(&inputs, &ids(&[IGNORE, v, IGNORE, IGNORE], 4)),
        "targets",
        "[0, 258)",
    );
    // -1 is neither a byte nor the ignore index.
    refused(
        model.loss(&inputs, &ids(&[IGNORE, -1, IGNORE, IGNORE], 4)),
        "targets",
        "or be -100",
    );
    refused(
        model.loss(&inputs, &ids(&[IGNORE; 4], 4)),
        "targets",
        "selected position",
    );
    refused(
        model.try_forward_trace(&Tensor::from_slice(&[1i64, 2, 3, 4]), false),
        "tokens",
        "B×4",
    );
    let out = model
        .loss(&inputs, &ids(&[IGNORE, 20, IGNORE, 3], 4))
        .unwrap();
    assert_eq!(out.predicted, 2);
}

/// With a CUDA device, ids on another device than the model's are an error, not libtorch's
/// panic (skipped without one).
#[test]
fn ids_on_another_device_are_errors() {
    if !tch::Cuda::is_available() {
        return;
    }
    let vs = nn::VarStore::new(CPU);
    let gpt = seeded(5, || Gpt::new(&vs.root(), GptConfig::tiny(11))).unwrap();
    let good = ids(&[1, 2, 3, 4], 4);
    refused(
        gpt.logits(&good.to_device(Device::Cuda(0))),
        "idx",
        "device",
    );
    refused(
        gpt.loss(&good, &good.to_device(Device::Cuda(0))),
        "targets",
        "device",
    );
}
