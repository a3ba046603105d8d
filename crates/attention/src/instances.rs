//! Random instances of Theorem 3.4, drawn one way for every caller: the property test of the
//! bound's pass rate (`tests/properties.rs`, T6) and the `theory` experiment draw theirs here,
//! so the same random stream gives the same instances in both.
//!
//! # The distribution
//!
//! X ∈ ℝ^{N×D} with i.i.d. N(0, 1) entries; W_Q, W_K, W_V ∈ ℝ^{D×k} with i.i.d. N(0, σ²) entries,
//! σ = 10^u for u ~ U[−1, 0) (log-uniform in [0.1, 1)); the paper's scores (s = 1), no mask.
//! The sizes, for an upper size `max_d` (raised to 3 if smaller):
//!
//! | regime | D | N | k |
//! |---|---|---|---|
//! | [`TokenRegime::AtMostD`] (the paper's) | U{3, …, max_d} | U{2, …, D} | U{1, …, min(D, 4)} |
//! | [`TokenRegime::AboveD`] | U{2, …, max(⌊max_d/2⌋ + 1, 2)} | U{D + 1, …, 2D + 2} | U{1, …, min(D, 4)} |
//!
//! The draws are taken from the stream in this order: D, N, k, u, then X, W_Q, W_K, W_V, each
//! row by row. Changing the order or the distributions changes every recorded instance.

use ndarray::Array2;
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::attention::{AttentionOptions, Forward, SelfAttention};
use crate::error::Result;

/// Which side of N = D a Theorem 3.4 instance is drawn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenRegime {
    /// N ≤ D, where the paper states the bound.
    AtMostD,
    /// N > D, where κ(J) = ∞ structurally once N > 3D − k.
    AboveD,
}

/// One random instance of Theorem 3.4: tokens X and a head with weights W_Q, W_K, W_V (module
/// docs, "The distribution").
///
/// ```
/// use kappa_attention::{theorem_3_4, Theorem34Instance, TokenRegime};
/// use rand::SeedableRng;
/// let mut rng = rand::rngs::StdRng::seed_from_u64(6);
/// let inst = Theorem34Instance::sample(&mut rng, TokenRegime::AtMostD, 10)?;
/// assert!(inst.n <= inst.d && inst.k <= inst.d.min(4));
/// let bound = theorem_3_4(&inst.forward()?)?;
/// assert!(bound.rhs >= 1.0);
/// # Ok::<(), kappa_attention::AttentionError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Theorem34Instance {
    /// Tokens N.
    pub n: usize,
    /// Embedding dimension D.
    pub d: usize,
    /// Head dimension k.
    pub k: usize,
    /// The weights' standard deviation σ.
    pub std: f64,
    /// X, N×D.
    pub x: Array2<f64>,
    /// The head (W_Q, W_K, W_V, each D×k; s = 1, no mask).
    pub head: SelfAttention<f64>,
}

impl Theorem34Instance {
    /// Draws an instance of `regime` with D at most `max_d` (raised to 3), from `rng`.
    ///
    /// Errors: none for finite draws (a Gaussian draw is always finite); the head's own checks
    /// are kept rather than unwrapped.
    pub fn sample<R: Rng + ?Sized>(rng: &mut R, regime: TokenRegime, max_d: usize) -> Result<Self> {
        let max_d = max_d.max(3);
        let (n, d) = match regime {
            TokenRegime::AtMostD => {
                let d = rng.gen_range(3..=max_d);
                (rng.gen_range(2..=d), d)
            }
            TokenRegime::AboveD => {
                let d = rng.gen_range(2..=(max_d / 2 + 1).max(2));
                (rng.gen_range(d + 1..=2 * d + 2), d)
            }
        };
        let k = rng.gen_range(1..=d.min(4));
        let std = 10f64.powf(rng.gen_range(-1.0..0.0));
        let x = gaussian(rng, n, d, 1.0);
        let wq = gaussian(rng, d, k, std);
        let wk = gaussian(rng, d, k, std);
        let wv = gaussian(rng, d, k, std);
        let head = SelfAttention::new(wq, wk, wv, AttentionOptions::default())?;
        Ok(Self {
            n,
            d,
            k,
            std,
            x,
            head,
        })
    }

    /// The head's forward pass on X (what [`theorem_3_4`](crate::theorem_3_4) takes).
    ///
    /// Errors: as [`SelfAttention::forward`].
    pub fn forward(&self) -> Result<Forward<f64>> {
        self.head.forward(self.x.view())
    }
}

/// A rows×cols matrix of i.i.d. N(0, std²) entries, filled row by row.
fn gaussian<R: Rng + ?Sized>(rng: &mut R, rows: usize, cols: usize, std: f64) -> Array2<f64> {
    Array2::from_shape_simple_fn((rows, cols), || {
        let z: f64 = StandardNormal.sample(rng);
        std * z
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn sizes_stay_in_their_regime() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for max_d in [0, 3, 6, 10] {
            for _ in 0..50 {
                let a = Theorem34Instance::sample(&mut rng, TokenRegime::AtMostD, max_d).unwrap();
                assert!((3..=max_d.max(3)).contains(&a.d) && (2..=a.d).contains(&a.n));
                let b = Theorem34Instance::sample(&mut rng, TokenRegime::AboveD, max_d).unwrap();
                assert!(b.d >= 2 && b.d <= (max_d.max(3) / 2 + 1).max(2));
                assert!(b.n > b.d && b.n <= 2 * b.d + 2);
                for i in [&a, &b] {
                    assert!(i.k >= 1 && i.k <= i.d.min(4));
                    assert!(i.std > 0.0999 && i.std <= 1.0, "{}", i.std);
                    assert_eq!(i.x.dim(), (i.n, i.d));
                }
            }
        }
    }
}
