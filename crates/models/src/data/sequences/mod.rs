//! Sequence-classification data for a Long-Range-Arena suite at CPU-sized lengths: every task
//! gives one split type, [`SequenceSplits`] — (token sequence, label) examples as an N×T Int64
//! tensor and N labels, fixed train/validation/test splits, the vocabulary size, the class count
//! and the padding token.
//!
//! | task | module | tokens | classes |
//! |---|---|---|---|
//! | ListOps (nested MIN/MAX/MED/SM expressions) | [`listops`] | 15 symbols + pad | 10 |
//! | Pathfinder (are the two dots joined by a dashed path?) | [`pathfinder`] | gray levels 0–255 | 2 |
//! | Text (byte-level movie-review sentiment) | [`text`] | bytes 0–255 + pad | 2 |
//! | Image (Fashion-MNIST pixels in raster order) | [`image`] | gray levels 0–255 | 10 |
//!
//! Generators are seeded: the same seed and configuration give the same tensors. Batches are a
//! pure function of (seed, step), epoch by epoch from the crate's [`permutation`], as for
//! [`ImageSet::batch`](super::ImageSet::batch).
//!
//! ```
//! use kappa_models::data::sequences::{ListOps, ListOpsConfig};
//! let config = ListOpsConfig { train: 40, validation: 8, test: 8, min_length: 20, max_length: 60,
//!                              ..ListOpsConfig::default() };
//! let data = ListOps::generate(&config, 0, tch::Device::Cpu)?;
//! let (tokens, labels) = data.train.batch(0, 3, 16)?; // the same for every run
//! assert_eq!(tokens.size(), vec![16, 60]);
//! assert_eq!((data.vocab_size, data.num_classes, labels.size()), (16, 10, vec![16]));
//! # Ok::<(), kappa_models::ModelsError>(())
//! ```

use tch::{Device, Tensor};

use super::{permutation, Split};
use crate::error::{ModelsError, Result};

pub mod image;
pub mod listops;
pub mod pathfinder;
pub mod text;

pub use image::{load_fashion_mnist, ImageSequenceConfig};
pub use listops::{ListOps, ListOpsConfig};
pub use pathfinder::{Pathfinder, PathfinderConfig};
pub use text::{MovieReviews, TextConfig};

/// Token sequences (N×T, Int64) and their labels (N, Int64).
#[derive(Debug)]
pub struct SequenceSet {
    /// N×T token ids; shorter sequences are padded at the end with the splits' `pad_id`.
    pub tokens: Tensor,
    /// N class labels.
    pub labels: Tensor,
}

impl SequenceSet {
    /// A set from row-major token ids (`labels.len()` rows of `seq_len`) and labels, on `device`.
    pub(crate) fn from_rows(
        tokens: &[i64],
        labels: &[i64],
        seq_len: usize,
        device: Device,
    ) -> Self {
        let n = labels.len() as i64;
        Self {
            tokens: Tensor::from_slice(tokens)
                .view([n, seq_len as i64])
                .to_device(device),
            labels: Tensor::from_slice(labels).to_device(device),
        }
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.size()[0] as usize
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Examples `start..start+len` (clamped): (tokens, labels).
    pub fn slice(&self, start: usize, len: usize) -> (Tensor, Tensor) {
        let start = start.min(self.len());
        let len = len.min(self.len() - start) as i64;
        (
            self.tokens.narrow(0, start as i64, len),
            self.labels.narrow(0, start as i64, len),
        )
    }

    /// The batch of `step`: examples of epoch ⌊step / ⌊N/B⌋⌋, in the order of the permutation
    /// seeded by (seed, epoch); the last partial batch of an epoch is dropped.
    ///
    /// Errors: [`ModelsError::InvalidConfig`] (`train.batch_size`) unless 1 ≤ B ≤ N.
    pub fn batch(&self, seed: u64, step: u64, batch_size: usize) -> Result<(Tensor, Tensor)> {
        let idx = epoch_batch(self.len(), seed, step, batch_size)?;
        let idx = Tensor::from_slice(&idx).to_device(self.tokens.device());
        Ok((
            self.tokens.index_select(0, &idx),
            self.labels.index_select(0, &idx),
        ))
    }
}

/// The indices of batch `step` of B among N examples, epoch by epoch: batch s is items
/// (s mod ⌊N/B⌋)·B .. +B of the permutation seeded by (seed, ⌊s / ⌊N/B⌋⌋).
pub(crate) fn epoch_batch(n: usize, seed: u64, step: u64, batch_size: usize) -> Result<Vec<i64>> {
    if batch_size == 0 || batch_size > n {
        return Err(ModelsError::config(
            "train.batch_size",
            format!("must lie in 1..={n} (the training set size), found {batch_size}"),
        ));
    }
    let per_epoch = (n / batch_size) as u64;
    let (epoch, within) = (step / per_epoch, (step % per_epoch) as usize);
    let perm = permutation(n, seed, epoch);
    Ok(perm[within * batch_size..(within + 1) * batch_size]
        .iter()
        .map(|&i| i as i64)
        .collect())
}

/// Train, validation and test sequences of one task, with what a model must fit.
#[derive(Debug)]
pub struct SequenceSplits {
    /// Training split.
    pub train: SequenceSet,
    /// Validation split.
    pub validation: SequenceSet,
    /// Test split.
    pub test: SequenceSet,
    /// Token ids lie in 0..vocab_size (the padding id included).
    pub vocab_size: usize,
    /// Labels lie in 0..num_classes.
    pub num_classes: usize,
    /// The id that pads sequences shorter than `seq_len`; `None` when every sequence has
    /// exactly `seq_len` tokens (the pixel tasks).
    pub pad_id: Option<i64>,
    /// T, the length of every row.
    pub seq_len: usize,
}

impl SequenceSplits {
    /// The examples of a split.
    pub fn split(&self, split: Split) -> &SequenceSet {
        match split {
            Split::Train => &self.train,
            Split::Validation => &self.validation,
            Split::Test => &self.test,
        }
    }
}

/// Checks that a configured split size is positive; the error names `field`.
pub(crate) fn positive(field: &str, value: usize) -> Result<()> {
    if value == 0 {
        return Err(ModelsError::config(field, "must be at least 1, found 0"));
    }
    Ok(())
}

/// Tiny fixture files for the sequence tasks that read installed data.
pub mod fixtures {
    pub use super::text::write_movie_reviews;
}
