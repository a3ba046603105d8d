//! Image classification data: one split type ([`ImageSplits`]) for every source — Fashion-MNIST
//! ([`FashionMnist::load`]), any folder of gray IDX files ([`ImageSplits::from_idx_dir`]) and a
//! folder of PNG images in torchvision's `ImageFolder` layout
//! ([`ImageSplits::from_image_folder`]).
//!
//! # Splits
//!
//! The training file (or `train/` folder) holds N images; the last `validation` of them (in the
//! order below) are the validation split and the first `min(N − validation, train_limit)` the
//! training split; the test split is the test file (or `test/` folder). The order is the file's
//! for IDX, and for an image folder a fixed permutation ([`IMAGE_FOLDER_SPLIT_SEED`]) of the
//! images sorted by path (class folder, then file name), so validation images come from every
//! class and the split does not depend on the run's seed.
//!
//! # Normalization
//!
//! Pixels are scaled to [0, 1] (8 bits: v/255, 16 bits: v/65535) and normalized per channel as
//! (x − mean_c)/std_c, with the same constants for all three splits ([`Normalize`]): either
//! Fashion-MNIST's published constants ([`FASHION_MNIST_MEAN_STD`], what `FashionMnist::load`
//! uses, so its numbers are those of earlier versions bit for bit) or the mean and population
//! standard deviation (1/n) of each channel over the training split itself, after the validation
//! split and `train_limit` are taken out. The constants applied are kept in
//! [`ImageSplits::mean`] and [`ImageSplits::std`], to normalize new images the same way.
//!
//! # Memory
//!
//! The sizes are read from the files' headers (IDX headers, the first PNG's IHDR) and the
//! memory of all the images is checked with [`crate::memory::ensure_fits`] before any is
//! decoded, at 12 bytes a pixel value plus one image's decode buffers: the images become one
//! f32 tensor (4 bytes a value) that is normalized in place, and the loaders' transient copies
//! take at most 8 bytes a value more (an IDX file's bytes and a u8 tensor of them while it is
//! read; one channel of the training images in f64 for [`Normalize::TrainSplit`]'s statistics).
//! The splits are views of that tensor on the CPU (so with `train_limit`, the images it leaves
//! out stay in memory) and copies of their rows on another device.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::image_folder::read_image_folder;
use super::pixels::{ensure_images_fit, Pixels};
use super::{permutation, read_idx, read_idx_dims};
use crate::error::{ModelsError, Result};
use crate::files;
use crate::vit::VitConfig;

/// Fashion-MNIST's per-pixel mean and standard deviation over the training set (pixels in
/// [0, 1]); images are normalized as (x − mean)/std.
pub const FASHION_MNIST_MEAN_STD: (f64, f64) = (0.2860, 0.3530);

/// Fashion-MNIST's class names, label 0 first.
pub const FASHION_MNIST_CLASSES: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

pub use super::image_folder::IMAGE_FOLDER_SPLIT_SEED;

/// The IDX files of a folder in the MNIST layout: (images, labels) of the training and the test
/// split.
pub const IDX_FILES: [(&str, &str); 2] = [
    ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
];

/// Images (N×C×S×S, normalized f32) and labels (N, Int64).
#[derive(Debug)]
pub struct ImageSet {
    /// N×C×S×S.
    pub images: Tensor,
    /// N.
    pub labels: Tensor,
}

impl ImageSet {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.size()[0] as usize
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Examples `start..start+len` (clamped).
    pub fn slice(&self, start: usize, len: usize) -> (Tensor, Tensor) {
        let start = start.min(self.len());
        let len = len.min(self.len() - start) as i64;
        (
            self.images.narrow(0, start as i64, len),
            self.labels.narrow(0, start as i64, len),
        )
    }

    /// The batch of `step`: examples of epoch ⌊step / (N/B)⌋, in the order of a permutation
    /// seeded by (seed, epoch); the last partial batch of an epoch is dropped.
    pub fn batch(&self, seed: u64, step: u64, batch_size: usize) -> Result<(Tensor, Tensor)> {
        let n = self.len();
        if batch_size == 0 || batch_size > n {
            return Err(ModelsError::config(
                "train.batch_size",
                format!("must lie in 1..={n} (the training set size), found {batch_size}"),
            ));
        }
        let per_epoch = (n / batch_size) as u64;
        let (epoch, within) = (step / per_epoch, (step % per_epoch) as usize);
        let perm = permutation(n, seed, epoch);
        let idx: Vec<i64> = perm[within * batch_size..(within + 1) * batch_size]
            .iter()
            .map(|&i| i as i64)
            .collect();
        let idx = Tensor::from_slice(&idx).to_device(self.images.device());
        Ok((
            self.images.index_select(0, &idx),
            self.labels.index_select(0, &idx),
        ))
    }
}

/// Which constants normalize the pixels (see the [module docs](self#normalization)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Normalize {
    /// Fashion-MNIST's [`FASHION_MNIST_MEAN_STD`] for every channel.
    #[default]
    FashionMnist,
    /// Each channel's mean and population standard deviation over the training split.
    TrainSplit,
}

/// How a training file becomes the training and validation splits, and how pixels are
/// normalized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitOptions {
    /// Training images held out for validation (at least 1, fewer than the training images).
    pub validation: usize,
    /// At most this many training images (after the validation split).
    pub train_limit: Option<usize>,
    /// The normalization constants.
    pub normalize: Normalize,
}

/// Train, validation and test images of one classification data set, with what a model must
/// fit: square images of `image_size` pixels with `channels` channels, `classes.len()` classes.
#[derive(Debug)]
pub struct ImageSplits {
    /// Training split.
    pub train: ImageSet,
    /// Validation split (held out from the training images).
    pub validation: ImageSet,
    /// The test split.
    pub test: ImageSet,
    /// Class names; label i is `classes[i]`.
    pub classes: Vec<String>,
    /// Image side S (images are S×S).
    pub image_size: usize,
    /// Channels C (1 gray, 3 RGB).
    pub channels: usize,
    /// The mean subtracted from each channel (pixels in [0, 1]).
    pub mean: Vec<f64>,
    /// The standard deviation each channel is divided by.
    pub std: Vec<f64>,
}

impl ImageSplits {
    /// The number of classes.
    pub fn num_classes(&self) -> usize {
        self.classes.len()
    }

    /// The images of a split.
    pub fn split(&self, split: super::Split) -> &ImageSet {
        match split {
            super::Split::Train => &self.train,
            super::Split::Validation => &self.validation,
            super::Split::Test => &self.test,
        }
    }

    /// Checks that a ViT takes these images into these classes; the error names the model's
    /// key that does not fit (`model.image_size`, `model.channels`, `model.num_classes`).
    pub fn check_model(&self, config: &VitConfig) -> Result<()> {
        let fits = [
            ("model.image_size", config.image_size, self.image_size),
            ("model.channels", config.channels, self.channels),
            ("model.num_classes", config.num_classes, self.num_classes()),
        ];
        for (key, model, data) in fits {
            if model != data {
                return Err(ModelsError::config(
                    key,
                    format!("is {model}, but the data has {data} ({})", self.describe()),
                ));
            }
        }
        Ok(())
    }

    /// "S×S images, C channel(s), K classes: a, b, …" for error messages.
    fn describe(&self) -> String {
        let mut names = self.classes[..self.classes.len().min(8)].join(", ");
        if self.classes.len() > 8 {
            names.push_str(", …");
        }
        format!(
            "{0}×{0} images, {1} channel(s), {2} classes: {names}",
            self.image_size,
            self.channels,
            self.num_classes()
        )
    }

    /// Loads a folder of gray IDX files in the MNIST layout ([`IDX_FILES`]): N×S×S unsigned-byte
    /// images of any side S (the same in both files) and their labels. The class count is
    /// `num_classes` when stated (a label at or above it is an error), else the largest label of
    /// either file + 1; classes are named `"0"`, `"1"`, ….
    ///
    /// The four headers are checked (against each other and against their files' lengths,
    /// [`read_idx`]) and the memory of all images is checked (see the [module docs](self#memory))
    /// before any image data is read.
    ///
    /// Errors: [`ModelsError::MissingData`] for a missing file; [`ModelsError::NotRegularFile`]
    /// for a path that is not a regular file; [`ModelsError::BadData`] for a file that is not an
    /// N×S×S image file (or whose header does not match its length), a label file that does not
    /// match it, a label out of range, or a constant channel under [`Normalize::TrainSplit`];
    /// [`ModelsError::TooLarge`] for images that would not fit in memory;
    /// [`ModelsError::InvalidConfig`] for a `validation` size outside 1..N.
    pub fn from_idx_dir(
        dir: &Path,
        options: &SplitOptions,
        num_classes: Option<usize>,
        device: Device,
    ) -> Result<Self> {
        let hint = "an IDX folder holds train-images-idx3-ubyte, train-labels-idx1-ubyte, \
                    t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte";
        let missing = |path: PathBuf| ModelsError::MissingData {
            set: "idx".into(),
            path,
            hint: hint.into(),
        };
        Self::load_idx(dir, options, num_classes, &missing, device)
    }

    /// [`from_idx_dir`](Self::from_idx_dir) with the error of a missing file chosen by the
    /// caller.
    fn load_idx(
        dir: &Path,
        options: &SplitOptions,
        num_classes: Option<usize>,
        missing: &dyn Fn(PathBuf) -> ModelsError,
        device: Device,
    ) -> Result<Self> {
        let [(ti, tl), (si, sl)] = IDX_FILES;
        let train_pair = IdxPair::check(dir, ti, tl, None, missing)?;
        let test_pair = IdxPair::check(dir, si, sl, Some(train_pair.side), missing)?;
        let culprit = format!(
            "{} and {}",
            train_pair.images.display(),
            test_pair.images.display()
        );
        ensure_images_fit(
            train_pair.count + test_pair.count,
            1,
            train_pair.side,
            &culprit,
        )?;
        let full = train_pair.read()?;
        let test = test_pair.read()?;
        let max_label = [&full, &test]
            .iter()
            .filter(|p| p.len() > 0)
            .map(|p| p.labels.max().int64_value(&[]))
            .max()
            .unwrap_or(0) as usize;
        let count = num_classes.unwrap_or(max_label + 1);
        if max_label >= count {
            let path = dir.join(if label_in(&full, max_label) { tl } else { sl });
            return Err(ModelsError::bad_data(
                path,
                format!("label {max_label} outside 0..{count} (the stated number of classes)"),
            ));
        }
        let classes = (0..count).map(|c| c.to_string()).collect();
        let stats_path = dir.join(ti);
        assemble(full, test, options, classes, &stats_path, device)
    }

    /// Loads a folder of PNG images in torchvision's `ImageFolder` layout:
    /// `dir/train/<class>/*.png` and `dir/test/<class>/*.png`. The classes are the names of the
    /// folders in `train/`, sorted (label i is the i-th); a class may be absent from `test/`.
    /// Images are gray (1 channel) or RGB (3; an alpha channel is dropped, a palette expanded),
    /// 8 or 16 bits, all square and all of one size and channel count. Names starting with `.`
    /// are skipped; every other entry of a class folder must be a regular `.png` file (or a
    /// link to one). The split and normalization are described in the [module docs](self).
    ///
    /// Memory: the folder is listed, then the first training image's header sets the size S and
    /// channels C, and N images of C×S×S values are checked to fit (see the
    /// [module docs](self#memory)) before any image is decoded; each further image's header must
    /// match before its pixels are decoded.
    ///
    /// Errors: [`ModelsError::MissingData`] when `dir`, `dir/train` or `dir/test` is missing;
    /// [`ModelsError::NotRegularFile`] naming an image path that is a FIFO, socket, device,
    /// folder or dangling link; [`ModelsError::BadData`] naming the file or folder for: no class
    /// folders, a file outside a class folder, a test class that is not a training class, a
    /// class folder without PNG images, a file that is not a readable PNG, an image that is not
    /// square or differs in size or channels from the first one, a constant channel under
    /// [`Normalize::TrainSplit`]; [`ModelsError::TooLarge`] naming the first image for images
    /// that would not fit in memory; [`ModelsError::InvalidConfig`] for a `validation` size outside 1..N.
    pub fn from_image_folder(dir: &Path, options: &SplitOptions, device: Device) -> Result<Self> {
        let (full, test, classes) = read_image_folder(dir)?;
        assemble(full, test, options, classes, &dir.join("train"), device)
    }
}

fn label_in(p: &Pixels, label: usize) -> bool {
    p.len() > 0 && p.labels.max().int64_value(&[]) as usize == label
}

/// One (images, labels) pair of IDX files whose headers agree: N×S×S images and N labels.
struct IdxPair {
    images: PathBuf,
    labels: PathBuf,
    count: usize,
    side: usize,
}

impl IdxPair {
    /// Checks the headers of `dir/images` and `dir/labels` (S = `side` when given), without
    /// reading their data.
    fn check(
        dir: &Path,
        images: &str,
        labels: &str,
        side: Option<usize>,
        missing: &dyn Fn(PathBuf) -> ModelsError,
    ) -> Result<Self> {
        let file = |name: &str| {
            let path = dir.join(name);
            if files::is_present(&path) {
                Ok(path)
            } else {
                Err(missing(path))
            }
        };
        let (ip, lp) = (file(images)?, file(labels)?);
        let (d, label_dims) = (read_idx_dims(&ip)?, read_idx_dims(&lp)?);
        if d.len() != 3 || d[1] != d[2] || side.is_some_and(|s| s != d[1]) {
            let want = side.map_or("N×S×S".into(), |s| format!("N×{s}×{s}"));
            return Err(ModelsError::bad_data(
                ip,
                format!("expected {want} images (square, gray), found dimensions {d:?}"),
            ));
        }
        if label_dims != [d[0]] {
            return Err(ModelsError::bad_data(
                lp,
                format!("expected {} labels, found dimensions {label_dims:?}", d[0]),
            ));
        }
        Ok(Self {
            images: ip,
            labels: lp,
            count: d[0],
            side: d[1],
        })
    }

    /// Reads the pair: pixels scaled to [0, 1] (N×1×S×S f32) and labels. The file's bytes are
    /// freed once copied into a u8 tensor, and that tensor once widened to f32, which is
    /// scaled in place.
    fn read(&self) -> Result<Pixels> {
        let (n, s) = (self.count, self.side);
        let (img, lab) = (read_idx(&self.images)?, read_idx(&self.labels)?);
        if img.dims != [n, s, s] || lab.dims != [n] {
            return Err(ModelsError::bad_data(
                &self.images,
                format!(
                    "changed while it was read: dimensions {:?} and labels {:?}",
                    img.dims, lab.dims
                ),
            ));
        }
        let bytes = Tensor::f_from_slice(&img.data)?;
        drop(img);
        let (n, s) = (n as i64, s as i64);
        let mut values = bytes.f_view([n, 1, s, s])?.f_to_kind(Kind::Float)?;
        drop(bytes);
        let _ = values.f_div_scalar_(255.0)?; // in place; the handle returned is `values`
        let labels = Tensor::f_from_slice(&lab.data)?.f_to_kind(Kind::Int64)?;
        Ok(Pixels { values, labels })
    }
}

/// Cuts the validation and training splits off `full`, normalizes all three splits and moves
/// them to `device`. `stats_path` names the training data in errors.
fn assemble(
    full: Pixels,
    test: Pixels,
    options: &SplitOptions,
    classes: Vec<String>,
    stats_path: &Path,
    device: Device,
) -> Result<ImageSplits> {
    let n = full.len();
    let validation = options.validation;
    if validation == 0 || validation >= n {
        return Err(ModelsError::config(
            "data.validation",
            format!("must lie in 1..{n} (the training data has {n} images), found {validation}"),
        ));
    }
    let keep = (n - validation)
        .min(options.train_limit.unwrap_or(usize::MAX))
        .max(1);
    let size = full.values.size();
    let (channels, image_size) = (size[1] as usize, size[3] as usize);
    let (mean, std) = match options.normalize {
        Normalize::FashionMnist => {
            let (m, s) = FASHION_MNIST_MEAN_STD;
            (vec![m; channels], vec![s; channels])
        }
        Normalize::TrainSplit => channel_stats(&full.narrow(0, keep).values, stats_path)?,
    };
    normalize_in_place(&full.values, &mean, &std)?;
    normalize_in_place(&test.values, &mean, &std)?;
    let set = |p: Pixels| -> Result<ImageSet> {
        Ok(ImageSet {
            images: p.values.f_to_device(device)?,
            labels: p.labels.f_to_device(device)?,
        })
    };
    Ok(ImageSplits {
        train: set(full.narrow(0, keep))?,
        validation: set(full.narrow(n - validation, validation))?,
        test: set(test)?,
        classes,
        image_size,
        channels,
        mean,
        std,
    })
}

/// Each channel's mean and population standard deviation (1/n), computed in f64.
fn channel_stats(values: &Tensor, path: &Path) -> Result<(Vec<f64>, Vec<f64>)> {
    let channels = values.size()[1];
    let mut mean = Vec::new();
    let mut std = Vec::new();
    for c in 0..channels {
        let x = values.narrow(1, c, 1).to_kind(Kind::Double);
        let s = x.std(false).double_value(&[]);
        if s.is_nan() || s <= 0.0 {
            return Err(ModelsError::bad_data(
                path,
                format!(
                    "channel {c} has the same value in every training image; it cannot be \
                     normalized by its standard deviation"
                ),
            ));
        }
        mean.push(x.mean(Kind::Double).double_value(&[]));
        std.push(s);
    }
    Ok((mean, std))
}

/// x ← (x − mean_c)/std_c per channel, in place. Each value gets the operations of the
/// expression `(x − m)/s` with scalar operands (a subtraction, then a division, in f32), so
/// Fashion-MNIST's tensors are those of earlier versions bit for bit.
fn normalize_in_place(values: &Tensor, mean: &[f64], std: &[f64]) -> Result<()> {
    for (c, (&m, &s)) in mean.iter().zip(std).enumerate() {
        // In place on a view of the channel; the handles returned are that view.
        let _ = values
            .f_narrow(1, c as i64, 1)?
            .f_sub_scalar_(m)?
            .f_div_scalar_(s)?;
    }
    Ok(())
}

/// Fashion-MNIST, loaded as [`ImageSplits`]: train (the first 60 000 − `validation` training
/// images, at most `train_limit`), validation (the last `validation` training images) and test
/// (the 10 000 t10k images), normalized by [`FASHION_MNIST_MEAN_STD`], classes
/// [`FASHION_MNIST_CLASSES`].
#[derive(Clone, Copy, Debug)]
pub struct FashionMnist;

impl FashionMnist {
    /// The `cargo xtask setup --data` name and the folder under the data root.
    pub const SET: &'static str = "fashion-mnist";

    /// Loads the four IDX files from `dir` (the `fashion-mnist` folder) onto `device`,
    /// keeping at most `train_limit` training images (after the validation split).
    ///
    /// Errors: [`ModelsError::MissingData`] naming `cargo xtask setup --data fashion-mnist`
    /// when a file is missing; [`ModelsError::BadData`] for malformed or inconsistent files
    /// (images other than 28×28, a label outside 0..=9); an invalid `validation` size.
    pub fn load(
        dir: &Path,
        validation: usize,
        train_limit: Option<usize>,
        device: Device,
    ) -> Result<ImageSplits> {
        let options = SplitOptions {
            validation,
            train_limit,
            normalize: Normalize::FashionMnist,
        };
        let missing = |path: PathBuf| ModelsError::missing_set(Self::SET, path);
        let mut data = ImageSplits::load_idx(dir, &options, Some(10), &missing, device)?;
        if data.image_size != 28 {
            return Err(ModelsError::bad_data(
                dir.join(IDX_FILES[0].0),
                format!("expected N×28×28 images, found N×{0}×{0}", data.image_size),
            ));
        }
        data.classes = FASHION_MNIST_CLASSES.map(String::from).to_vec();
        Ok(data)
    }
}
