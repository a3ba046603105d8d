//! Decoded images before they are split and normalized: what the IDX and image-folder readers
//! produce and [`super::images`] splits, and the memory they may take.

use tch::Tensor;

use crate::error::Result;
use crate::memory::ensure_fits;

/// Bytes one decoded pixel may take in the decoder's output buffer: 4 samples (RGBA, or an
/// alpha added by a `tRNS` chunk) of 2 bytes (16 bits).
pub(super) const PNG_OUTPUT_BYTES_PER_PIXEL: u128 = 8;

/// Pixels in [0, 1] (N×C×S×S f32, on the CPU) and their labels (N, Int64), before splitting.
pub(super) struct Pixels {
    pub(super) values: Tensor,
    pub(super) labels: Tensor,
}

impl Pixels {
    pub(super) fn len(&self) -> usize {
        self.labels.size()[0] as usize
    }

    pub(super) fn narrow(&self, start: usize, len: usize) -> Pixels {
        Pixels {
            values: self.values.narrow(0, start as i64, len as i64),
            labels: self.labels.narrow(0, start as i64, len as i64),
        }
    }
}

/// Bytes a pixel value (one channel of one pixel) of a data set may take at the peak of
/// loading, over all its images: 4 for the f32 tensor every image becomes (normalized in place,
/// no second copy), plus at most 8 for the largest transient copy the loaders make:
///
/// | when | copy | bytes a value |
/// |---|---|---|
/// | an IDX file is read | its data as bytes and a u8 tensor of them; the bytes are freed before the f32 tensor is made, the u8 tensor after | 2 |
/// | `Normalize::TrainSplit` | one channel of the training images in f64, for its mean and standard deviation | 8/C (8 for gray images) |
///
/// The pixels of one PNG image pass through their own buffers, counted by
/// [`BYTES_PER_IMAGE_VALUE`].
pub(super) const BYTES_PER_VALUE: u128 = 12;

/// Bytes a value of one image may take while a PNG image is decoded: the decoder's output (at
/// most [`PNG_OUTPUT_BYTES_PER_PIXEL`] a pixel, so 8 a value for gray), the f32 values (4) and
/// the tensor they are copied into the image's row through (4).
pub(super) const BYTES_PER_IMAGE_VALUE: u128 = PNG_OUTPUT_BYTES_PER_PIXEL + 8;

/// Bytes a label takes: the final Int64 (8) and the vector or u8 tensor it is made from (8).
pub(super) const BYTES_PER_LABEL: u128 = 16;

/// Checks with [`ensure_fits`] that `images` images of `channels`×`side`×`side` values fit in
/// memory, before any is decoded: `images`·C·S²·[`BYTES_PER_VALUE`] +
/// C·S²·[`BYTES_PER_IMAGE_VALUE`] + `images`·[`BYTES_PER_LABEL`], in checked u128 arithmetic;
/// `culprit` is the file or folder that set the sizes.
pub(super) fn ensure_images_fit(
    images: usize,
    channels: usize,
    side: usize,
    culprit: &str,
) -> Result<()> {
    let per_image = (channels as u128)
        .checked_mul(side as u128)
        .and_then(|v| v.checked_mul(side as u128));
    let bytes = per_image.and_then(|v| {
        let all = v
            .checked_mul(images as u128)?
            .checked_mul(BYTES_PER_VALUE)?;
        let one = v.checked_mul(BYTES_PER_IMAGE_VALUE)?;
        let labels = (images as u128).checked_mul(BYTES_PER_LABEL)?;
        all.checked_add(one)?.checked_add(labels)
    });
    ensure_fits(
        bytes,
        "the decoded images (f32) and their copies while loading",
        culprit,
    )
}
