//! `Linear`: y = x Wᵀ + b with W initialized N(0, σ²), the projection every other layer builds
//! on (the attention's fused QKV and output projections, the MLP, ViT's head). Its own module
//! so that the attention and the blocks that contain it both use it without using each other.

use tch::{nn, Tensor};

use crate::error::Result;

/// y = x Wᵀ + b with W ∈ ℝ^{out×in} initialized N(0, std²) and b = 0.
#[derive(Debug)]
pub struct Linear {
    /// out × in.
    pub weight: Tensor,
    /// out, when the layer has a bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// Creates `weight` (and `bias`) under `p`.
    pub fn new(p: &nn::Path<'_>, input: i64, output: i64, bias: bool, std: f64) -> Result<Self> {
        let weight = p.f_var(
            "weight",
            &[output, input],
            nn::Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        )?;
        let bias = if bias {
            Some(p.f_zeros("bias", &[output])?)
        } else {
            None
        };
        Ok(Self { weight, bias })
    }
}

impl nn::Module for Linear {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs.linear(&self.weight, self.bias.as_ref())
    }
}
