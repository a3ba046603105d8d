//! Reading a folder of PNG images in torchvision's `ImageFolder` layout
//! (`train/<class>/*.png`, `test/<class>/*.png`) into pixels in [0, 1].

use std::fs;
use std::path::{Path, PathBuf};

use tch::{Kind, Tensor};

use super::pixels::Pixels;
use crate::error::{ModelsError, Result};

/// What an image folder must look like, for [`ModelsError::MissingData`].
const LAYOUT: &str = "an image folder holds train/<class>/*.png and test/<class>/*.png";

/// One decoded image: C×S×S values in [0, 1], channel-major.
struct Decoded {
    values: Vec<f32>,
    width: usize,
    height: usize,
    channels: usize,
}

/// The size and channels every image must have, and the file that set them.
struct Shape {
    side: usize,
    channels: usize,
    first: PathBuf,
}

/// Reads `dir/train` and `dir/test`: (training pixels, test pixels, class names). The pixels are
/// in path order (class, then file name).
pub(super) fn read_image_folder(dir: &Path) -> Result<(Pixels, Pixels, Vec<String>)> {
    let (train_dir, test_dir) = (dir.join("train"), dir.join("test"));
    for path in [dir, &train_dir, &test_dir] {
        if !path.is_dir() {
            return Err(ModelsError::MissingData {
                set: "image_folder".into(),
                path: path.to_path_buf(),
                hint: LAYOUT.into(),
            });
        }
    }
    let classes = class_folders(&train_dir)?;
    if classes.is_empty() {
        return Err(ModelsError::bad_data(
            &train_dir,
            format!("holds no class folders ({LAYOUT})"),
        ));
    }
    for class in class_folders(&test_dir)? {
        if !classes.contains(&class) {
            return Err(ModelsError::bad_data(
                test_dir.join(&class),
                format!(
                    "class `{class}` is not a class of the training split (train/ has {})",
                    classes.join(", ")
                ),
            ));
        }
    }
    let mut shape = None;
    let train = read_split(&train_dir, &classes, &mut shape)?;
    let test = read_split(&test_dir, &classes, &mut shape)?;
    Ok((train, test, classes))
}

/// Whether a directory entry's name starts with `.` (skipped, like `.DS_Store`).
fn hidden(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

/// The entries of `dir`, sorted by name, hidden ones left out.
fn entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| ModelsError::io(dir, e))? {
        let path = entry.map_err(|e| ModelsError::io(dir, e))?.path();
        if !hidden(&path) {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

/// The sorted names of the class folders in `dir`; a file there is an error.
fn class_folders(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for path in entries(dir)? {
        if !path.is_dir() {
            return Err(ModelsError::bad_data(
                &path,
                "is a file outside a class folder (images go in <split>/<class>/)",
            ));
        }
        let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            ModelsError::bad_data(&path, "the class folder's name is not valid UTF-8")
        })?;
        names.push(name.to_string());
    }
    Ok(names)
}

/// The images of one split (`train/` or `test/`): every class folder present, its PNG files
/// in name order.
fn read_split(dir: &Path, classes: &[String], shape: &mut Option<Shape>) -> Result<Pixels> {
    let (mut values, mut labels) = (Vec::new(), Vec::new());
    for (label, class) in classes.iter().enumerate() {
        let folder = dir.join(class);
        if !folder.is_dir() {
            continue; // a class may be absent from the test split
        }
        let files = entries(&folder)?;
        if files.is_empty() {
            return Err(ModelsError::bad_data(&folder, "holds no .png images"));
        }
        for file in files {
            let image = decode_png(&file)?;
            check_shape(&image, &file, shape)?;
            values.extend_from_slice(&image.values);
            labels.push(label as i64);
        }
    }
    let (side, channels) = shape.as_ref().map_or((0, 0), |s| (s.side, s.channels));
    let n = labels.len() as i64;
    Ok(Pixels {
        values: Tensor::from_slice(&values).view([n, channels as i64, side as i64, side as i64]),
        labels: Tensor::from_slice(&labels).to_kind(Kind::Int64),
    })
}

/// Checks that `image` is square and, once a first image has set them, has its size and
/// channels.
fn check_shape(image: &Decoded, path: &Path, shape: &mut Option<Shape>) -> Result<()> {
    let (w, h, c) = (image.width, image.height, image.channels);
    if w != h {
        return Err(ModelsError::bad_data(
            path,
            format!("is {w}×{h} (width × height); images must be square"),
        ));
    }
    match shape {
        None => {
            *shape = Some(Shape {
                side: w,
                channels: c,
                first: path.to_path_buf(),
            })
        }
        Some(s) if s.side != w || s.channels != c => {
            return Err(ModelsError::bad_data(
                path,
                format!(
                    "is {w}×{w} with {c} channel(s), but the first image {} is {1}×{1} with {2} \
                     channel(s); all images must have one size and channel count",
                    s.first.display(),
                    s.side,
                    s.channels
                ),
            ))
        }
        Some(_) => {}
    }
    Ok(())
}

/// Decodes a PNG file: gray or gray+alpha → 1 channel, RGB or RGBA → 3 (alpha dropped;
/// palettes and bit depths under 8 are expanded), values v/255 (8 bits) or v/65535 (16 bits).
fn decode_png(path: &Path) -> Result<Decoded> {
    if !path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"))
    {
        return Err(ModelsError::bad_data(
            path,
            "is not a .png file (a class folder holds only PNG images)",
        ));
    }
    let bad = |e: png::DecodingError| ModelsError::bad_data(path, format!("not a valid PNG: {e}"));
    let file = fs::File::open(path).map_err(|e| ModelsError::io(path, e))?;
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::EXPAND);
    let mut reader = decoder.read_info().map_err(bad)?;
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).map_err(bad)?;
    let (width, height) = (info.width as usize, info.height as usize);
    let (stored, channels) = match info.color_type {
        png::ColorType::Grayscale => (1, 1),
        png::ColorType::GrayscaleAlpha => (2, 1),
        png::ColorType::Rgb => (3, 3),
        png::ColorType::Rgba => (4, 3),
        png::ColorType::Indexed => {
            return Err(ModelsError::bad_data(path, "an unexpanded palette image"))
        }
    };
    let wide = info.bit_depth == png::BitDepth::Sixteen;
    let sample = |i: usize| -> f32 {
        if wide {
            f32::from(u16::from_be_bytes([buf[2 * i], buf[2 * i + 1]])) / 65535.0
        } else {
            f32::from(buf[i]) / 255.0
        }
    };
    // Interleaved rows (HWC, `stored` samples a pixel) → channel-major C×H×W.
    let pixels = width * height;
    let mut values = Vec::with_capacity(channels * pixels);
    for c in 0..channels {
        values.extend((0..pixels).map(|p| sample(p * stored + c)));
    }
    Ok(Decoded {
        values,
        width,
        height,
        channels,
    })
}
