//! Decoded images before they are split and normalized: what the IDX and image-folder readers
//! produce and [`super::images`] splits.

use tch::Tensor;

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
