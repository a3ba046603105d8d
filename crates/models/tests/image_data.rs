//! Image data sets as `ImageSplits`: a PNG image folder (shapes, labels, class names, the
//! training split's normalization, PNG variants, and a typed error naming the file for every
//! malformed folder), a gray IDX folder of any size, and Fashion-MNIST (unchanged tensors);
//! hostile files (IDX headers that overflow or lie about their length, PNG headers of huge
//! images and PNG bombs, also under an address-space limit, FIFOs and dangling links) are
//! errors naming the file, before any large allocation.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kappa_models::data::{fixtures, read_idx, read_idx_dims, write_idx, IDX_FILES};
use kappa_models::{
    seeded, FashionMnist, ImageSplits, ModelsError, Normalize, SplitOptions, Vit, VitConfig,
};
use tch::{Device, Kind, Tensor};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kappa-images-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

fn options(validation: usize, normalize: Normalize) -> SplitOptions {
    SplitOptions {
        validation,
        train_limit: None,
        normalize,
    }
}

/// 3 classes (written in unsorted order) × 5 training and 2 test RGB images of 8×8.
fn folder(name: &str) -> PathBuf {
    let dir = scratch(name);
    fixtures::write_image_folder(&dir, &["cat", "ant", "bee"], (5, 2), 8, 3).unwrap();
    dir
}

fn load(dir: &Path) -> kappa_models::Result<ImageSplits> {
    ImageSplits::from_image_folder(dir, &options(3, Normalize::TrainSplit), Device::Cpu)
}

fn values(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).unwrap()
}

/// Each channel's (mean, population std) over a split's normalized images, in f64.
fn channel_moments(images: &Tensor) -> Vec<(f64, f64)> {
    (0..images.size()[1])
        .map(|c| {
            let x = images.narrow(1, c, 1).to_kind(Kind::Double);
            (
                x.mean(Kind::Double).double_value(&[]),
                x.std(false).double_value(&[]),
            )
        })
        .collect()
}

#[test]
fn an_image_folder_loads_with_sorted_classes_and_train_split_normalization() {
    let dir = folder("load");
    let data = load(&dir).unwrap();
    assert_eq!(data.classes, ["ant", "bee", "cat"]);
    assert_eq!(
        (data.image_size, data.channels, data.num_classes()),
        (8, 3, 3)
    );
    assert_eq!(
        (data.train.len(), data.validation.len(), data.test.len()),
        (12, 3, 6)
    );
    assert_eq!(data.train.images.size(), vec![12, 3, 8, 8]);
    assert_eq!(data.test.images.size(), vec![6, 3, 8, 8]);
    // The test split is in path order; train + validation hold every training image once.
    assert_eq!(values(&data.test.labels), [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]);
    let mut all = values(&data.train.labels);
    all.extend(values(&data.validation.labels));
    all.sort_by(f64::total_cmp);
    assert_eq!(all, [[0.0; 5], [1.0; 5], [2.0; 5]].concat());

    // Labels follow the images: the fixture's class c (index in ["cat", "ant", "bee"]) is bright
    // in channel c mod 3, so "ant" (label 0) is bright in channel 1, "bee" in 2, "cat" in 0.
    for set in [&data.train, &data.validation, &data.test] {
        let raw = &set.images * Tensor::from_slice(&data.std).view([1, 3, 1, 1])
            + Tensor::from_slice(&data.mean).view([1, 3, 1, 1]);
        let bright = raw
            .mean_dim([2i64, 3].as_slice(), false, Kind::Double)
            .argmax(1, false);
        let expected = (&set.labels + 1).remainder(3);
        assert!(bright.equal(&expected), "{bright} vs {expected}");
    }

    // The first test image is `test/ant/000.png`, decoded channel-major and normalized with the
    // training split's constants.
    let png = decode(&dir.join("test/ant/000.png"));
    let first = data.test.images.get(0);
    for (i, &raw) in png.iter().enumerate() {
        let (y, x, c) = ((i / 3) / 8, (i / 3) % 8, i % 3);
        let expected = (f64::from(raw as f32 / 255.0) - data.mean[c]) / data.std[c];
        let found = first.double_value(&[c as i64, y as i64, x as i64]);
        assert!((found - expected).abs() < 1e-5, "{found} vs {expected}");
    }

    // Normalized by its own statistics, the training split has mean 0 and standard deviation 1
    // per channel, exactly up to f32 rounding: a value (x − m)/s is rounded twice (relative
    // error ≤ 2⁻²⁴ each, on |x − m|/s ≤ 1/s ≤ 10 here, as x ∈ [0, 1] and s > 0.1), and m and s are
    // rounded once to f32 when applied, which shifts every value by ≤ 2⁻²⁴·(|m| + |x − m|)/s.
    // So each value is within about 4·10·2⁻²⁴ ≈ 2.4·10⁻⁶ of its exact value, and so are the
    // f64 mean and standard deviation of the values; 1e-5 leaves a factor 4.
    for (c, (mean, std)) in channel_moments(&data.train.images).into_iter().enumerate() {
        assert!(
            data.std[c] > 0.1,
            "the bound assumes s > 0.1: {}",
            data.std[c]
        );
        assert!(mean.abs() < 1e-5, "channel {c}: mean {mean}");
        assert!((std - 1.0).abs() < 1e-5, "channel {c}: std {std}");
    }

    // The split is deterministic; train_limit keeps the first images and the statistics follow.
    let again = load(&dir).unwrap();
    assert!(again.train.images.equal(&data.train.images));
    assert!(again.validation.labels.equal(&data.validation.labels));
    let limited = ImageSplits::from_image_folder(
        &dir,
        &SplitOptions {
            train_limit: Some(4),
            ..options(3, Normalize::TrainSplit)
        },
        Device::Cpu,
    )
    .unwrap();
    assert!(limited
        .train
        .labels
        .equal(&data.train.labels.narrow(0, 0, 4)));
    assert!(limited.validation.labels.equal(&data.validation.labels));
    assert_ne!(
        limited.mean, data.mean,
        "the statistics are those of the 4 images"
    );
    for (mean, std) in channel_moments(&limited.train.images) {
        assert!(
            mean.abs() < 1e-5 && (std - 1.0).abs() < 1e-5,
            "{mean} {std}"
        );
    }
    let fixed =
        ImageSplits::from_image_folder(&dir, &options(3, Normalize::FashionMnist), Device::Cpu)
            .unwrap();
    assert_eq!(fixed.mean, vec![0.2860; 3]);
    assert_eq!(fixed.std, vec![0.3530; 3]);
    fs::remove_dir_all(&dir).unwrap();
}

/// The samples of an 8-bit PNG, row-major and interleaved.
fn decode(path: &Path) -> Vec<u8> {
    let mut reader = png::Decoder::new(fs::File::open(path).unwrap())
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    buf
}

/// Writes a 16-bit PNG.
fn write_png16(path: &Path, side: u32, color: png::ColorType, samples: &[u16]) {
    let mut encoder = png::Encoder::new(fs::File::create(path).unwrap(), side, side);
    encoder.set_color(color);
    encoder.set_depth(png::BitDepth::Sixteen);
    let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_be_bytes()).collect();
    let mut writer = encoder.write_header().unwrap();
    writer.write_image_data(&bytes).unwrap();
}

#[test]
fn gray_16_bit_and_alpha_images_decode_to_one_or_three_channels() {
    // 16-bit gray with alpha: one channel, v/65535.
    let dir = scratch("gray16");
    for (split, class, i) in [
        ("train", "a", 0u16),
        ("train", "a", 1),
        ("train", "b", 2),
        ("test", "b", 3),
    ] {
        let folder = dir.join(split).join(class);
        fs::create_dir_all(&folder).unwrap();
        let samples: Vec<u16> = (0..16u16)
            .flat_map(|p| [1000 * (p + i), 65535 - p])
            .collect();
        write_png16(
            &folder.join(format!("{i}.png")),
            4,
            png::ColorType::GrayscaleAlpha,
            &samples,
        );
    }
    let data =
        ImageSplits::from_image_folder(&dir, &options(1, Normalize::FashionMnist), Device::Cpu)
            .unwrap();
    assert_eq!(
        (data.channels, data.image_size, data.classes.len()),
        (1, 4, 2)
    );
    let pixel = data.test.images.double_value(&[0, 0, 1, 2]); // pixel 6 of image 3
    let expected = (f64::from(9000.0f32 / 65535.0) - 0.2860) / 0.3530;
    assert!((pixel - expected).abs() < 1e-6, "{pixel} vs {expected}");
    fs::remove_dir_all(&dir).unwrap();

    // 8-bit RGBA: the alpha channel is dropped.
    let dir = scratch("rgba");
    for (split, class) in [("train", "x"), ("train", "y"), ("test", "x")] {
        let folder = dir.join(split).join(class);
        fs::create_dir_all(&folder).unwrap();
        let data: Vec<u8> = (0..4 * 4 * 4).map(|i| (i * 3 % 256) as u8).collect();
        fixtures::write_png(&folder.join("0.png"), 4, 4, 4, &data).unwrap();
    }
    let data =
        ImageSplits::from_image_folder(&dir, &options(1, Normalize::FashionMnist), Device::Cpu)
            .unwrap();
    assert_eq!(data.channels, 3);
    // Pixel 1's blue sample is byte 4·1 + 2 = 6 of the RGBA data, 18.
    let blue = data.test.images.double_value(&[0, 2, 0, 1]);
    assert!((blue - (f64::from(18.0f32 / 255.0) - 0.2860) / 0.3530).abs() < 1e-6);
    fs::remove_dir_all(&dir).unwrap();
}

/// The error of loading a fixture folder after `spoil` changed it; it must be `BadData` (or
/// `MissingData` when `missing`) and name `culprit`.
fn spoiled(name: &str, spoil: impl FnOnce(&Path) -> PathBuf, missing: bool) {
    let dir = folder(name);
    let culprit = spoil(&dir);
    let err = load(&dir).unwrap_err();
    let message = err.to_string();
    match (&err, missing) {
        (ModelsError::MissingData { path, .. }, true)
        | (ModelsError::BadData { path, .. }, false) => {
            assert_eq!(path, &culprit, "{name}: {message}")
        }
        _ => panic!("{name}: unexpected error {err:?}"),
    }
    assert!(
        message.contains(&culprit.display().to_string()),
        "{name}: {message}"
    );
    let _ = fs::remove_dir_all(&dir);
}

fn rgb(side: usize) -> Vec<u8> {
    vec![7; side * side * 3]
}

#[test]
fn every_malformed_folder_is_a_typed_error_naming_the_file() {
    spoiled(
        "no-dir",
        |d| {
            fs::remove_dir_all(d).unwrap();
            fs::create_dir_all(d.parent().unwrap()).unwrap();
            d.to_path_buf()
        },
        true,
    );
    spoiled(
        "no-test",
        |d| {
            fs::remove_dir_all(d.join("test")).unwrap();
            d.join("test")
        },
        true,
    );
    spoiled(
        "empty-test",
        |d| {
            fs::remove_dir_all(d.join("test")).unwrap();
            fs::create_dir_all(d.join("test")).unwrap();
            d.join("test")
        },
        false,
    );
    spoiled(
        "no-classes",
        |d| {
            fs::remove_dir_all(d.join("train")).unwrap();
            fs::create_dir_all(d.join("train")).unwrap();
            d.join("train")
        },
        false,
    );
    spoiled(
        "test-class",
        |d| {
            fs::create_dir_all(d.join("test/zebra")).unwrap();
            fixtures::write_png(&d.join("test/zebra/0.png"), 8, 8, 3, &rgb(8)).unwrap();
            d.join("test/zebra")
        },
        false,
    );
    spoiled(
        "not-png",
        |d| {
            fs::write(d.join("train/bee/notes.txt"), "hello").unwrap();
            d.join("train/bee/notes.txt")
        },
        false,
    );
    spoiled(
        "corrupt",
        |d| {
            fs::write(d.join("train/bee/zz.png"), b"not a png at all").unwrap();
            d.join("train/bee/zz.png")
        },
        false,
    );
    spoiled(
        "truncated",
        |d| {
            let bytes = fs::read(d.join("train/bee/000.png")).unwrap();
            fs::write(d.join("train/bee/001.png"), &bytes[..bytes.len() / 2]).unwrap();
            d.join("train/bee/001.png")
        },
        false,
    );
    spoiled(
        "size",
        |d| {
            fixtures::write_png(&d.join("test/cat/009.png"), 4, 4, 3, &rgb(4)).unwrap();
            d.join("test/cat/009.png")
        },
        false,
    );
    spoiled(
        "channels",
        |d| {
            fixtures::write_png(&d.join("train/cat/009.png"), 8, 8, 1, &[9; 64]).unwrap();
            d.join("train/cat/009.png")
        },
        false,
    );
    spoiled(
        "square",
        |d| {
            fixtures::write_png(&d.join("train/ant/002.png"), 8, 6, 3, &[1; 8 * 6 * 3]).unwrap();
            d.join("train/ant/002.png")
        },
        false,
    );
    spoiled(
        "empty-class",
        |d| {
            fs::create_dir_all(d.join("train/dog")).unwrap();
            d.join("train/dog")
        },
        false,
    );
    spoiled(
        "loose-file",
        |d| {
            fixtures::write_png(&d.join("train/x.png"), 8, 8, 3, &rgb(8)).unwrap();
            d.join("train/x.png")
        },
        false,
    );

    // The first image named in a size mismatch is the one that set the size.
    let dir = folder("size-message");
    fixtures::write_png(&dir.join("test/cat/009.png"), 4, 4, 3, &rgb(4)).unwrap();
    let message = load(&dir).unwrap_err().to_string();
    assert!(
        message.contains(&dir.join("train/ant/000.png").display().to_string()),
        "{message}"
    );
    fs::remove_dir_all(&dir).unwrap();

    // Hidden files are skipped; a bad validation size and a constant channel are errors.
    let dir = folder("hidden");
    fs::write(dir.join("train/ant/.DS_Store"), "x").unwrap();
    assert_eq!(load(&dir).unwrap().train.len(), 12);
    let err =
        ImageSplits::from_image_folder(&dir, &options(15, Normalize::TrainSplit), Device::Cpu)
            .unwrap_err();
    assert!(
        matches!(&err, ModelsError::InvalidConfig { field, .. } if field == "data.validation"),
        "{err}"
    );
    fs::remove_dir_all(&dir).unwrap();
    let dir = scratch("constant");
    for (split, class) in [("train", "a"), ("train", "a2"), ("test", "a")] {
        fs::create_dir_all(dir.join(split).join(class)).unwrap();
        for i in 0..2 {
            let path = dir.join(split).join(class).join(format!("{i}.png"));
            fixtures::write_png(&path, 2, 2, 1, &[5; 4]).unwrap();
        }
    }
    let err = ImageSplits::from_image_folder(&dir, &options(1, Normalize::TrainSplit), Device::Cpu)
        .unwrap_err();
    assert!(matches!(err, ModelsError::BadData { .. }), "{err}");
    assert!(err.to_string().contains("channel 0"), "{err}");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_vit_must_fit_the_data_and_the_error_names_the_key() {
    let dir = folder("fit");
    let data = load(&dir).unwrap();
    let fits = VitConfig {
        image_size: 8,
        channels: 3,
        patch_size: 4,
        num_classes: 3,
        ..VitConfig::tiny()
    };
    data.check_model(&fits).unwrap();
    for (config, key) in [
        (
            VitConfig {
                num_classes: 10,
                ..fits
            },
            "model.num_classes",
        ),
        (
            VitConfig {
                channels: 1,
                ..fits
            },
            "model.channels",
        ),
        (
            VitConfig {
                image_size: 16,
                ..fits
            },
            "model.image_size",
        ),
    ] {
        let err = data.check_model(&config).unwrap_err();
        assert!(
            matches!(&err, ModelsError::InvalidConfig { field, .. } if field == key),
            "{err}"
        );
        assert!(err.to_string().contains("ant, bee, cat"), "{err}");
    }
    // A model that fits runs on the images.
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let vit = seeded(0, || Vit::new(&vs.root(), fits)).unwrap();
    assert_eq!(vit.logits(&data.test.images).unwrap().size(), vec![6, 3]);
    fs::remove_dir_all(&dir).unwrap();
}

/// `n` gray `side`×`side` images with labels `i mod classes`.
fn write_idx_pair(dir: &Path, (images, labels): (&str, &str), n: usize, side: usize, classes: u8) {
    let pixels: Vec<u8> = (0..n * side * side).map(|i| (i * 37 % 251) as u8).collect();
    write_idx(&dir.join(images), &[n, side, side], &pixels).unwrap();
    let labels_data: Vec<u8> = (0..n).map(|i| i as u8 % classes).collect();
    write_idx(&dir.join(labels), &[n], &labels_data).unwrap();
}

#[test]
fn an_idx_folder_of_any_size_loads_with_its_label_count() {
    let dir = scratch("idx");
    fs::create_dir_all(&dir).unwrap();
    let err =
        ImageSplits::from_idx_dir(&dir, &options(2, Normalize::TrainSplit), None, Device::Cpu)
            .unwrap_err();
    assert!(matches!(err, ModelsError::MissingData { .. }), "{err}");
    assert!(err.to_string().contains("train-images-idx3-ubyte"), "{err}");
    write_idx_pair(&dir, IDX_FILES[0], 20, 12, 4);
    write_idx_pair(&dir, IDX_FILES[1], 8, 12, 4);
    let data =
        ImageSplits::from_idx_dir(&dir, &options(5, Normalize::TrainSplit), None, Device::Cpu)
            .unwrap();
    assert_eq!(data.classes, ["0", "1", "2", "3"]);
    assert_eq!((data.image_size, data.channels), (12, 1));
    assert_eq!(
        (data.train.len(), data.validation.len(), data.test.len()),
        (15, 5, 8)
    );
    // The validation split is the file's last images.
    assert_eq!(values(&data.validation.labels), [3.0, 0.0, 1.0, 2.0, 3.0]);
    for (mean, std) in channel_moments(&data.train.images) {
        assert!(
            mean.abs() < 1e-5 && (std - 1.0).abs() < 1e-5,
            "{mean} {std}"
        );
    }
    // A stated class count; a label at or above it is an error naming the label file.
    let six = ImageSplits::from_idx_dir(
        &dir,
        &options(5, Normalize::TrainSplit),
        Some(6),
        Device::Cpu,
    )
    .unwrap();
    assert_eq!(six.num_classes(), 6);
    let err = ImageSplits::from_idx_dir(
        &dir,
        &options(5, Normalize::TrainSplit),
        Some(3),
        Device::Cpu,
    )
    .unwrap_err();
    assert!(err.to_string().contains("train-labels-idx1-ubyte"), "{err}");
    // Test images of another side are an error naming the test file.
    write_idx_pair(&dir, IDX_FILES[1], 8, 10, 4);
    let err =
        ImageSplits::from_idx_dir(&dir, &options(5, Normalize::TrainSplit), None, Device::Cpu)
            .unwrap_err();
    assert!(matches!(err, ModelsError::BadData { .. }), "{err}");
    assert!(err.to_string().contains("t10k-images-idx3-ubyte"), "{err}");
    // Fashion-MNIST's loader still wants 28×28 images.
    write_idx_pair(&dir, IDX_FILES[1], 8, 12, 4);
    let err = FashionMnist::load(&dir, 5, None, Device::Cpu).unwrap_err();
    assert!(err.to_string().contains("28×28"), "{err}");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fashion_mnist_tensors_are_those_of_the_earlier_loader() {
    let dir = scratch("fmnist");
    fixtures::write_fashion_mnist(&dir, 40, 12, 5).unwrap();
    let data = FashionMnist::load(&dir, 10, Some(25), Device::Cpu).unwrap();
    assert_eq!(data.classes.len(), 10);
    assert_eq!(data.classes[9], "Ankle boot");
    assert_eq!((data.image_size, data.channels), (28, 1));
    // The expression of the loader before `ImageSplits`, on the whole file, then sliced.
    let old = |file: &str| {
        let idx = read_idx(&dir.join(file)).unwrap();
        let n = idx.dims[0] as i64;
        let (mean, std) = kappa_models::data::FASHION_MNIST_MEAN_STD;
        let pixels = Tensor::from_slice(&idx.data)
            .view([n, 1, 28, 28])
            .to_kind(Kind::Float);
        (pixels / 255.0 - mean) / std
    };
    let train = old(IDX_FILES[0].0);
    assert!(data.train.images.equal(&train.narrow(0, 0, 25)));
    assert!(data.validation.images.equal(&train.narrow(0, 30, 10)));
    assert!(data.test.images.equal(&old(IDX_FILES[1].0)));
    // And it is the IDX loader with Fashion-MNIST's constants.
    let idx = ImageSplits::from_idx_dir(
        &dir,
        &SplitOptions {
            train_limit: Some(25),
            ..options(10, Normalize::FashionMnist)
        },
        Some(10),
        Device::Cpu,
    )
    .unwrap();
    assert!(idx.train.images.equal(&data.train.images));
    assert!(idx.train.labels.equal(&data.train.labels));
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Hostile files

/// An IDX file of unsigned bytes with dimensions `dims` and `body` bytes of data, whatever the
/// dimensions say.
fn write_raw_idx(path: &Path, dims: &[u32], body: usize) {
    let mut bytes = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.resize(bytes.len() + body, 7);
    fs::write(path, bytes).unwrap();
}

/// Asserts that `err` is `BadData` naming `path` and saying `needle`.
fn assert_bad_data(err: ModelsError, path: &Path, needle: &str) {
    let message = err.to_string();
    assert!(
        matches!(&err, ModelsError::BadData { path: p, .. } if p == path),
        "{message}"
    );
    assert!(message.contains(needle), "{message}");
}

#[test]
fn an_idx_header_whose_dimensions_overflow_is_an_error_naming_the_file() {
    let dir = scratch("idx-overflow");
    fs::create_dir_all(&dir).unwrap();
    write_idx_pair(&dir, IDX_FILES[1], 4, 6, 2);
    let images = dir.join(IDX_FILES[0].0);
    write_idx_pair(&dir, IDX_FILES[0], 4, 6, 2);
    // 4 × 2^31 × 2^31 = 2^64 wraps to 0 in u64: an empty body must not pass for it.
    for dims in [[4, 1 << 31, 1 << 31], [u32::MAX; 3]] {
        write_raw_idx(&images, &dims, 0);
        assert_bad_data(read_idx(&images).unwrap_err(), &images, "overflows");
        assert_bad_data(read_idx_dims(&images).unwrap_err(), &images, "overflows");
        let err =
            ImageSplits::from_idx_dir(&dir, &options(1, Normalize::TrainSplit), None, Device::Cpu)
                .unwrap_err();
        assert_bad_data(err, &images, "overflows");
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_idx_body_shorter_or_longer_than_its_header_or_a_zero_dimension_is_an_error_naming_the_file() {
    let dir = scratch("idx-length");
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("x-idx3-ubyte");
    for (dims, body, needle) in [
        (vec![2, 3, 3], 17, "need 18 bytes of data, found 17"),
        (vec![2, 3, 3], 19, "need 18 bytes of data, found 19"),
        (vec![2, 0, 3], 0, "dimension 1 of [2, 0, 3] is 0"),
        (vec![], 0, "expected 00 00 08 n with n ≥ 1"),
    ] {
        write_raw_idx(&path, &dims, body);
        assert_bad_data(read_idx(&path).unwrap_err(), &path, needle);
    }
    write_raw_idx(&path, &[2, 3, 3], 18);
    assert_eq!(read_idx(&path).unwrap().data, vec![7; 18]);
    fs::write(&path, [0, 0, 8, 3, 0, 0]).unwrap();
    assert_bad_data(read_idx(&path).unwrap_err(), &path, "truncated header");
    fs::write(&path, [0, 0]).unwrap();
    assert_bad_data(
        read_idx(&path).unwrap_err(),
        &path,
        "shorter than the 4-byte magic",
    );
    assert!(write_idx(&path, &[2, 0], &[]).is_err());
    // A label file longer than its header, in a folder: the error names it.
    write_idx_pair(&dir, IDX_FILES[0], 6, 4, 2);
    write_idx_pair(&dir, IDX_FILES[1], 3, 4, 2);
    let labels = dir.join(IDX_FILES[1].1);
    write_raw_idx(&labels, &[3], 4);
    let err =
        ImageSplits::from_idx_dir(&dir, &options(1, Normalize::TrainSplit), None, Device::Cpu)
            .unwrap_err();
    assert_bad_data(err, &labels, "need 3 bytes of data, found 4");
    fs::remove_dir_all(&dir).unwrap();
}

/// Writes a PNG whose header (IHDR) claims `side`×`side` pixels of `color` at `depth`, followed
/// by one IDAT chunk holding the zlib stream of a single zero byte and IEND: a 70-byte file.
fn write_png_header_only(path: &Path, side: u32, color: png::ColorType, depth: png::BitDepth) {
    let mut encoder = png::Encoder::new(fs::File::create(path).unwrap(), side, side);
    encoder.set_color(color);
    encoder.set_depth(depth);
    let mut writer = encoder.write_header().unwrap();
    let zlib_of_one_zero = [0x78, 0x9c, 0x63, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01];
    writer
        .write_chunk(png::chunk::IDAT, &zlib_of_one_zero)
        .unwrap();
    writer.finish().unwrap();
}

/// Writes a `side`×`side` PNG of 1-bit gray zeros row by row: a file of a few hundred KB whose
/// pixels decode to side² bytes (and four times that as f32).
fn write_png_bomb(path: &Path, side: u32) {
    let file = std::io::BufWriter::new(fs::File::create(path).unwrap());
    let mut encoder = png::Encoder::new(file, side, side);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::One);
    encoder.set_compression(png::Compression::Fast);
    let mut writer = encoder
        .write_header()
        .unwrap()
        .into_stream_writer()
        .unwrap();
    let row = vec![0u8; (side as usize).div_ceil(8)];
    for _ in 0..side {
        writer.write_all(&row).unwrap();
    }
    writer.finish().unwrap();
}

/// An image folder whose first training image is `first` (written by `write`), plus ordinary
/// 8×8 RGB images after it and in the test split.
fn folder_with_first_image(name: &str, write: impl FnOnce(&Path)) -> (PathBuf, PathBuf) {
    let dir = folder(name);
    let first = dir.join("train/ant/000.png");
    write(&first);
    (dir, first)
}

/// Asserts that loading `dir` is `TooLarge` naming `first`.
fn assert_too_large(dir: &Path, first: &Path) {
    let err = load(dir).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, ModelsError::TooLarge { .. }), "{message}");
    assert!(message.contains(&first.display().to_string()), "{message}");
}

#[test]
fn a_png_header_claiming_60000_by_60000_rgba16_is_an_error_naming_it_before_decoding() {
    let claim =
        |p: &Path| write_png_header_only(p, 60_000, png::ColorType::Rgba, png::BitDepth::Sixteen);
    // As the first image it sets the size: the folder's memory is checked from its header.
    let (dir, first) = folder_with_first_image("png-claim", claim);
    assert!(fs::metadata(&first).unwrap().len() < 100);
    assert_too_large(&dir, &first);
    fs::remove_dir_all(&dir).unwrap();
    // As a later image its header differs from the first one's: refused before decoding.
    let dir = folder("png-claim-later");
    let later = dir.join("test/cat/zz.png");
    claim(&later);
    assert_bad_data(load(&dir).unwrap_err(), &later, "60000×60000");
    fs::remove_dir_all(&dir).unwrap();
}

/// Runs this binary's ignored test `name` in a child process under `ulimit -v` of `kib` KiB
/// with `KAPPA_HOSTILE_DIR` = `dir`; panics with its output unless it passes within 120 s.
fn run_under_address_space_limit(name: &str, kib: u64, dir: &Path) {
    let exe = std::env::current_exe().unwrap();
    let script = format!("ulimit -v {kib} && exec \"$0\" --ignored --exact {name}");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(&exe)
        .env("KAPPA_HOSTILE_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name} did not finish within 120 s under ulimit -v {kib}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && text.contains("1 passed"),
        "{name} under ulimit -v {kib}: {text}"
    );
}

#[cfg(unix)]
#[test]
fn hostile_pngs_are_errors_before_the_big_allocation_under_an_address_space_limit() {
    let dir = scratch("png-bombs");
    fs::create_dir_all(&dir).unwrap();
    let (claim, first) = folder_with_first_image("png-bombs-claim", |p| {
        write_png_header_only(p, 60_000, png::ColorType::Rgba, png::BitDepth::Sixteen)
    });
    fs::rename(&claim, dir.join("claim")).unwrap();
    let (bomb, first_bomb) =
        folder_with_first_image("png-bombs-bomb", |p| write_png_bomb(p, 20_000));
    assert!(fs::metadata(&first_bomb).unwrap().len() < 1 << 20);
    fs::rename(&bomb, dir.join("bomb")).unwrap();
    assert!(first.ends_with("train/ant/000.png") && first_bomb.ends_with("train/ant/000.png"));
    // 3 GiB of address space: libtorch and the test harness take under 1 GiB of it.
    run_under_address_space_limit("hostile_pngs_under_the_limit", 3 << 20, &dir);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "run under `ulimit -v` by \
            hostile_pngs_are_errors_before_the_big_allocation_under_an_address_space_limit"]
fn hostile_pngs_under_the_limit() {
    let budget = kappa_models::memory::budget();
    assert!(
        budget.bytes < 8 << 30,
        "run under an address-space limit of a few GiB, found a budget of {budget}"
    );
    let dir = PathBuf::from(std::env::var_os("KAPPA_HOSTILE_DIR").expect("KAPPA_HOSTILE_DIR"));
    for name in ["claim", "bomb"] {
        let folder = dir.join(name);
        assert_too_large(&folder, &folder.join("train/ant/000.png"));
    }
}

/// The error of loading `dir`, run on a thread; panics when it has not returned in 20 s.
fn load_error_within_20_s(dir: &Path) -> ModelsError {
    let (send, receive) = mpsc::channel();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let _ = send.send(load(&dir).map(|_| ()));
    });
    receive
        .recv_timeout(Duration::from_secs(20))
        .expect("loading the folder did not return within 20 s")
        .unwrap_err()
}

#[cfg(unix)]
#[test]
fn a_fifo_or_a_dangling_link_in_an_image_folder_is_an_error_naming_it() {
    let mkfifo = |path: &Path| {
        let made = Command::new("mkfifo").arg(path).status().unwrap();
        assert!(made.success());
    };
    let not_regular = |err: ModelsError, path: &Path, kind: &str| {
        let message = err.to_string();
        assert!(
            matches!(&err, ModelsError::NotRegularFile { path: p, .. } if p == path),
            "{message}"
        );
        assert!(message.contains(kind), "{message}");
    };
    let dir = folder("fifo-image");
    let fifo = dir.join("train/bee/001.png");
    fs::remove_file(&fifo).unwrap();
    mkfifo(&fifo);
    not_regular(load_error_within_20_s(&dir), &fifo, "FIFO");
    fs::remove_dir_all(&dir).unwrap();

    let dir = folder("dangling-image");
    let link = dir.join("test/cat/zz.png");
    std::os::unix::fs::symlink(dir.join("gone.png"), &link).unwrap();
    not_regular(load_error_within_20_s(&dir), &link, "symbolic link");
    fs::remove_dir_all(&dir).unwrap();

    // A FIFO where a class folder belongs, and a link to a real image, which is read.
    let dir = folder("fifo-class");
    let fifo = dir.join("train/dog");
    mkfifo(&fifo);
    assert_bad_data(load_error_within_20_s(&dir), &fifo, "a FIFO (named pipe)");
    fs::remove_file(&fifo).unwrap();
    let link = dir.join("train/ant/zz.png");
    std::os::unix::fs::symlink(dir.join("train/ant/000.png"), &link).unwrap();
    assert_eq!(load(&dir).unwrap().train.len() + 3, 16);
    fs::remove_dir_all(&dir).unwrap();
}
