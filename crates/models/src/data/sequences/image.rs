//! Image: Fashion-MNIST as sequences of 784 pixel tokens (28×28 in raster order, the gray levels
//! 0–255 themselves; a vocabulary of 256, no padding), as LRA's Image task reads gray CIFAR-10.
//! The files are the IDX files `cargo xtask setup --data fashion-mnist` installs, read by
//! [`read_idx`]; the splits are [`FashionMnist::load`](crate::FashionMnist::load)'s: the first
//! min(60 000 − `validation`, `train_limit`) training images, the last `validation` training
//! images, and the 10 000 t10k images as the test split.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::{SequenceSet, SequenceSplits};
use crate::data::{read_idx, read_idx_dims, IDX_FILES};
use crate::error::{ModelsError, Result};
use crate::files;
use crate::memory::ensure_fits;
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
/// Memory: the headers are checked first ([`read_idx_dims`]); then each file's N×784 pixels
/// are read as bytes (1 byte a pixel), copied into a u8 tensor (1) and widened to the Int64
/// tokens (8): at most 10 bytes a pixel of a file while it is read, checked with
/// [`ensure_fits`] for both files together before either is read. The splits are views of the
/// two token tensors.
///
/// Errors: [`ModelsError::MissingData`] naming the file and `cargo xtask setup --data
/// fashion-mnist`; [`ModelsError::BadData`] for images other than N×28×28, labels that do not
/// match them or lie outside 0..=9 (and the errors of [`read_idx`]);
/// [`ModelsError::InvalidConfig`] (`data.validation`) for a validation size outside 1..N.
pub fn load_fashion_mnist(
    dir: &Path,
    config: &ImageSequenceConfig,
    device: Device,
) -> Result<SequenceSplits> {
    let [(ti, tl), (si, sl)] = IDX_FILES;
    let n = check_pair(dir, ti, tl)?;
    let n_test = check_pair(dir, si, sl)?;
    let t = SIDE * SIDE;
    ensure_fits(
        ((n + n_test) as u128).checked_mul(t as u128 * 10 + 10),
        "the Fashion-MNIST pixel tokens (Int64)",
        &dir.display().to_string(),
    )?;
    let v = config.validation;
    if v == 0 || v >= n {
        return Err(ModelsError::config(
            "data.validation",
            format!("must lie in 1..{n} (the training data has {n} images), found {v}"),
        ));
    }
    let (images, labels) = read_pair(dir, ti, tl)?;
    let (test_images, test_labels) = read_pair(dir, si, sl)?;
    let keep = (n - v).min(config.train_limit.unwrap_or(usize::MAX)).max(1);
    let set = |tokens: &Tensor, labels: &Tensor, start: usize, len: usize| -> Result<SequenceSet> {
        let (start, len) = (start as i64, len as i64);
        Ok(SequenceSet {
            tokens: tokens.f_narrow(0, start, len)?.f_to_device(device)?,
            labels: labels.f_narrow(0, start, len)?.f_to_device(device)?,
        })
    };
    Ok(SequenceSplits {
        train: set(&images, &labels, 0, keep)?,
        validation: set(&images, &labels, n - v, v)?,
        test: set(&test_images, &test_labels, 0, n_test)?,
        vocab_size: 256,
        num_classes: 10,
        pad_id: None,
        seq_len: t,
    })
}

/// The path of IDX file `name` in `dir`, or [`ModelsError::MissingData`] when nothing is there.
fn idx_path(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    if files::is_present(&path) {
        Ok(path)
    } else {
        Err(ModelsError::missing_set(FashionMnist::SET, path))
    }
}

/// Checks the headers of one (images, labels) pair of IDX files: N×28×28 images and N labels;
/// returns N.
fn check_pair(dir: &Path, images: &str, labels: &str) -> Result<usize> {
    let image_dims = read_idx_dims(&idx_path(dir, images)?)?;
    let label_dims = read_idx_dims(&idx_path(dir, labels)?)?;
    if image_dims.len() != 3 || image_dims[1] != SIDE || image_dims[2] != SIDE {
        return Err(ModelsError::bad_data(
            dir.join(images),
            format!("expected N×28×28 images, found dimensions {image_dims:?}"),
        ));
    }
    if label_dims != [image_dims[0]] {
        return Err(ModelsError::bad_data(
            dir.join(labels),
            format!(
                "expected {} labels, found dimensions {label_dims:?}",
                image_dims[0]
            ),
        ));
    }
    Ok(image_dims[0])
}

/// Reads one (images, labels) pair of IDX files, checked by [`check_pair`], as N×784 pixel
/// tokens and N labels (Int64 tensors on the CPU).
fn read_pair(dir: &Path, images: &str, labels: &str) -> Result<(Tensor, Tensor)> {
    let (img, lab) = (read_idx(&dir.join(images))?, read_idx(&dir.join(labels))?);
    let n = img.dims[0] as i64;
    if img.dims != [n as usize, SIDE, SIDE] || lab.dims != [n as usize] {
        // The files changed since their headers were checked.
        return Err(ModelsError::bad_data(
            dir.join(images),
            format!(
                "changed while it was read: dimensions {:?}, labels {:?}",
                img.dims, lab.dims
            ),
        ));
    }
    if let Some(&l) = lab.data.iter().find(|&&l| l > 9) {
        return Err(ModelsError::bad_data(
            dir.join(labels),
            format!("label {l} outside 0..=9"),
        ));
    }
    let widen = |data: Vec<u8>| -> Result<Tensor> {
        let bytes = Tensor::f_from_slice(&data)?;
        drop(data);
        Ok(bytes.f_to_kind(Kind::Int64)?)
    };
    let tokens = widen(img.data)?.f_view([n, (SIDE * SIDE) as i64])?;
    Ok((tokens, widen(lab.data)?))
}
