//! A GPT-2-shaped parameter set for the optimizer benchmarks: GPT-2's parameter names and shapes
//! at any width and depth (matrices in `nn.Linear`'s (out, in) layout), held by a `tch` var
//! store whose every parameter carries a fixed seeded gradient.
//!
//! `benches/reference/optimizer_torch_peer.py` builds the same set (`gpt2_params` there) from the
//! same five numbers.

use tch::{nn, Device, Kind, Tensor};

/// The sizes of a GPT-2-shaped model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpt2Shape {
    /// Width d (n_embd).
    pub width: i64,
    /// Transformer blocks.
    pub layers: i64,
    /// Attention heads (they divide `width`).
    pub heads: i64,
    /// Vocabulary (rows of `wte`).
    pub vocab: i64,
    /// Context length (rows of `wpe`).
    pub context: i64,
}

impl Gpt2Shape {
    /// GPT-2 small: 12 blocks × 768, 12 heads, vocabulary 50257, context 1024 (124.4 M
    /// parameters).
    pub const SMALL: Self = Self {
        width: 768,
        layers: 12,
        heads: 12,
        vocab: 50257,
        context: 1024,
    };

    /// A small stand-in for smoke runs: 2 blocks × 192, 12 heads of 16, vocabulary 4096,
    /// context 256.
    pub const QUICK: Self = Self {
        width: 192,
        layers: 2,
        heads: 12,
        vocab: 4096,
        context: 256,
    };

    /// Every parameter's name and shape, in GPT-2's naming: `wte`, `wpe`, per block `h.<i>.`
    /// `ln_1`, `attn.c_attn` (3d, d), `attn.c_proj` (d, d), `ln_2`, `mlp.c_fc` (4d, d),
    /// `mlp.c_proj` (d, 4d) (each linear with its bias, each layer norm with weight and bias),
    /// then `ln_f`.
    pub fn params(&self) -> Vec<(String, Vec<i64>)> {
        let d = self.width;
        let mut out = vec![
            ("wte".to_string(), vec![self.vocab, d]),
            ("wpe".to_string(), vec![self.context, d]),
        ];
        for i in 0..self.layers {
            let block: [(&str, &[i64]); 12] = [
                ("ln_1.weight", &[d]),
                ("ln_1.bias", &[d]),
                ("attn.c_attn.weight", &[3 * d, d]),
                ("attn.c_attn.bias", &[3 * d]),
                ("attn.c_proj.weight", &[d, d]),
                ("attn.c_proj.bias", &[d]),
                ("ln_2.weight", &[d]),
                ("ln_2.bias", &[d]),
                ("mlp.c_fc.weight", &[4 * d, d]),
                ("mlp.c_fc.bias", &[4 * d]),
                ("mlp.c_proj.weight", &[d, 4 * d]),
                ("mlp.c_proj.bias", &[d]),
            ];
            out.extend(
                block
                    .iter()
                    .map(|(name, size)| (format!("h.{i}.{name}"), size.to_vec())),
            );
        }
        out.push(("ln_f.weight".to_string(), vec![d]));
        out.push(("ln_f.bias".to_string(), vec![d]));
        out
    }

    /// The number of scalar parameters.
    pub fn numel(&self) -> i64 {
        self.params()
            .iter()
            .map(|(_, s)| s.iter().product::<i64>())
            .sum()
    }

    /// A one-line description: blocks × width, heads, vocabulary, context, parameter count.
    pub fn describe(&self) -> String {
        format!(
            "{} blocks × {}, {} heads, vocabulary {}, context {} ({:.1} M parameters)",
            self.layers,
            self.width,
            self.heads,
            self.vocab,
            self.context,
            self.numel() as f64 / 1e6
        )
    }
}

/// Gives the leaf `p` the gradient `g` (a copy, through the backward pass of Σ p·g).
pub fn set_grad(p: &Tensor, g: &Tensor) {
    (p * g).sum(Kind::Float).backward();
}

/// A seeded value (Gaussian, standard deviation 0.02) and gradient (standard Gaussian) of
/// `size`, CPU f32; `seed` fixes both.
fn seeded(size: &[i64], seed: i64) -> (Tensor, Tensor) {
    tch::manual_seed(seed);
    let opts = (Kind::Float, Device::Cpu);
    let value = Tensor::randn(size, opts) * 0.02;
    (value, Tensor::randn(size, opts))
}

/// A leaf of `size` that requires a gradient, with value and gradient seeded by `seed`
/// (Gaussian, standard deviations 0.02 and 1).
pub fn leaf_with_grad(size: &[i64], seed: i64) -> Tensor {
    let (value, grad) = seeded(size, seed);
    let p = value.set_requires_grad(true);
    set_grad(&p, &grad);
    p
}

/// A CPU var store holding `shape`'s parameters ([`Gpt2Shape::params`]; values and gradients
/// as [`leaf_with_grad`] makes them, parameter i from seed `seed + i`). The gradients stay
/// defined until dropped: an optimizer step reads them and leaves them as they are.
pub fn var_store_with_grads(shape: &Gpt2Shape, seed: i64) -> nn::VarStore {
    let vs = nn::VarStore::new(Device::Cpu);
    for (i, (name, size)) in shape.params().iter().enumerate() {
        let mut parts: Vec<&str> = name.split('.').collect();
        let last = parts.pop().unwrap_or_default();
        let path = parts.iter().fold(vs.root(), |p, c| p / *c);
        let (value, grad) = seeded(size, seed + i as i64);
        set_grad(&path.var_copy(last, &value), &grad);
    }
    vs
}

#[cfg(test)]
mod tests {
    use super::Gpt2Shape;

    #[test]
    fn gpt2_small_has_gpt2_small_parameter_count() {
        // 124,439,808: the count Hugging Face's `gpt2` reports (its lm_head is tied to wte).
        assert_eq!(Gpt2Shape::SMALL.numel(), 124_439_808);
        assert_eq!(Gpt2Shape::SMALL.params().len(), 2 + 12 * 12 + 2);
    }
}
