//! Image: Fashion-MNIST as sequences of 784 pixel tokens (28×28 in raster order, the gray levels
//! 0–255 themselves; a vocabulary of 256, no padding), as LRA's Image task reads gray CIFAR-10.
//! The files are the IDX files `cargo xtask setup --data fashion-mnist` installs, read by
//! [`read_idx`]; the splits are [`FashionMnist::load`](crate::FashionMnist::load)'s: the first
//! min(60 000 − `validation`, `train_limit`) training images, the last `validation` training
//! images, and the 10 000 t10k images as the test split.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::Device;

use super::{SequenceSet, SequenceSplits};
use crate::data::{read_idx, Idx, IDX_FILES};
use crate::error::{ModelsError, Result};
use crate::FashionMnist;

/// The side of a Fashion-MNIST image; T = 784.
pub const SIDE: usize = 28;

/// How the training file becomes the training and validation splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSequenceConfig {
    /// Training images held out for validation (the last ones of the file).
    pub validation: usize,
    /// At most this many training images (after the validation split).
    pub train_limit: Option<usize>,
}

impl Default for ImageSequenceConfig {
    /// 5000 validation images, every other training image.
    fn default() -> Self {
        Self {
            validation: 5000,
            train_limit: None,
        }
    }
}

/// Loads the Fashion-MNIST IDX files from `dir` (the `fashion-mnist` folder) as
/// [`SequenceSplits`] onto `device`.
///
/// Errors: [`ModelsError::MissingData`] naming the file and `cargo xtask setup --data
/// fashion-mnist`; [`ModelsError::BadData`] for images other than N×28×28, labels that do not
/// match them or lie outside 0..=9; [`ModelsError::InvalidConfig`] (`data.validation`) for a
/// validation size outside 1..N.
pub fn load_fashion_mnist(
    dir: &Path,
    config: &ImageSequenceConfig,
    device: Device,
) -> Result<SequenceSplits> {
    let [(ti, tl), (si, sl)] = IDX_FILES;
    let (images, labels) = read_pair(dir, ti, tl)?;
    let (test_images, test_labels) = read_pair(dir, si, sl)?;
    let n = labels.len();
    let v = config.validation;
    if v == 0 || v >= n {
        return Err(ModelsError::config(
            "data.validation",
            format!("must lie in 1..{n} (the training data has {n} images), found {v}"),
        ));
    }
    let keep = (n - v).min(config.train_limit.unwrap_or(usize::MAX)).max(1);
    let t = SIDE * SIDE;
    let set = |pixels: &[i64], labels: &[i64]| SequenceSet::from_rows(pixels, labels, t, device);
    Ok(SequenceSplits {
        train: set(&images[..keep * t], &labels[..keep]),
        validation: set(&images[(n - v) * t..], &labels[n - v..]),
        test: set(&test_images, &test_labels),
        vocab_size: 256,
        num_classes: 10,
        pad_id: None,
        seq_len: t,
    })
}

/// Reads one (images, labels) pair of IDX files as pixel tokens and labels.
fn read_pair(dir: &Path, images: &str, labels: &str) -> Result<(Vec<i64>, Vec<i64>)> {
    let read = |name: &str| -> Result<Idx> {
        let path = dir.join(name);
        if !path.is_file() {
            return Err(ModelsError::missing_set(FashionMnist::SET, path));
        }
        read_idx(&path)
    };
    let (img, lab) = (read(images)?, read(labels)?);
    if img.dims.len() != 3 || img.dims[1] != SIDE || img.dims[2] != SIDE {
        return Err(ModelsError::bad_data(
            dir.join(images),
            format!("expected N×28×28 images, found dimensions {:?}", img.dims),
        ));
    }
    if lab.dims != [img.dims[0]] {
        return Err(ModelsError::bad_data(
            dir.join(labels),
            format!(
                "expected {} labels, found dimensions {:?}",
                img.dims[0], lab.dims
            ),
        ));
    }
    if let Some(&l) = lab.data.iter().find(|&&l| l > 9) {
        return Err(ModelsError::bad_data(
            dir.join(labels),
            format!("label {l} outside 0..=9"),
        ));
    }
    let widen = |v: Vec<u8>| v.into_iter().map(i64::from).collect();
    Ok((widen(img.data), widen(lab.data)))
}
