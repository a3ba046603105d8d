//! Reading a folder of PNG images in torchvision's `ImageFolder` layout
//! (`train/<class>/*.png`, `test/<class>/*.png`) into pixels in [0, 1].
//!
//! # Hostile folders
//!
//! The folder is walked before any image is decoded: every entry of `train/` and `test/` whose
//! name does not start with `.` must be a folder (or a link to one), every entry of a class
//! folder a regular `.png` file (or a link to one); anything else (a FIFO, a socket, a device,
//! a dangling link, a subfolder) is an error naming it, never skipped or opened.
//!
//! Then the first training image's header (IHDR, its first 33 bytes) sets the size S and the
//! channels C every image must have, and the memory of the whole folder, N images of C×S×S
//! values, is checked with [`ensure_images_fit`] before anything of that size is allocated.
//! Every other image's header must match, and is checked before its pixels are decoded. So a
//! header that claims 60000×60000 RGBA16, or a small file that inflates to 20000×20000, is an
//! error naming the file (or the folder) before the big allocation, also under an address-space
//! limit. The PNG decoder's own buffers (a few rows, ancillary chunks) are held to
//! [`PNG_DECODER_BYTES`] through `png::Limits`.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor};

use super::permutation;
use super::pixels::{ensure_images_fit, Pixels};
use crate::error::{ModelsError, Result};
use crate::files;

/// What an image folder must look like, for [`ModelsError::MissingData`].
const LAYOUT: &str = "an image folder holds train/<class>/*.png and test/<class>/*.png";

/// The most the PNG decoder may allocate for itself (`png::Limits::bytes`): its row buffers
/// and ancillary chunks, not the decoded image, which this module allocates after checking it.
/// 64 MiB holds two rows of the widest image whose decoded size can fit in memory at all (an
/// RGBA16 row of 2^22 pixels is 32 MiB) and is the png crate's default.
pub(super) const PNG_DECODER_BYTES: usize = 64 << 20;

/// The seed of the permutation that orders an image folder's training images before the
/// validation split is cut off (the same for every run).
pub const IMAGE_FOLDER_SPLIT_SEED: u64 = 0x1ba6_e5f0;

/// The size and channels every image must have, and the file that set them.
struct Shape {
    side: usize,
    channels: usize,
    first: PathBuf,
}

/// A PNG file whose header (IHDR) has been read, and nothing past it.
struct PngHeader {
    decoder: png::Decoder<BufReader<File>>,
    width: usize,
    height: usize,
    /// 1 (gray, gray + alpha) or 3 (RGB, RGBA, palette).
    channels: usize,
}

/// Reads `dir/train` and `dir/test`: (training pixels, test pixels, class names). The test
/// pixels are in path order (class, then file name); the training pixels in the order of the
/// fixed permutation [`IMAGE_FOLDER_SPLIT_SEED`] of the path order (row k holds the image of
/// path index `permutation[k]`).
pub(super) fn read_image_folder(dir: &Path) -> Result<(Pixels, Pixels, Vec<String>)> {
    let (train_dir, test_dir) = (dir.join("train"), dir.join("test"));
    for path in [dir, &train_dir, &test_dir] {
        ensure_folder(path)?;
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
    let train_files = list_split(&train_dir, &classes)?;
    let test_files = list_split(&test_dir, &classes)?;
    if test_files.is_empty() {
        // A test accuracy over no images would read as 0 %.
        return Err(ModelsError::bad_data(
            &test_dir,
            format!("holds no images: the test accuracy needs at least one ({LAYOUT})"),
        ));
    }
    let shape = first_shape(&train_files[0].0)?;
    let count = train_files.len() + test_files.len();
    let culprit = format!(
        "{} (its header sets the size of all {count} images)",
        shape.first.display()
    );
    ensure_images_fit(count, shape.channels, shape.side, &culprit)?;
    let order = permutation(train_files.len(), IMAGE_FOLDER_SPLIT_SEED, 0);
    let mut rows = vec![0; order.len()];
    for (row, &index) in order.iter().enumerate() {
        rows[index] = row;
    }
    let train = read_split(&train_files, &rows, &shape)?;
    let identity: Vec<usize> = (0..test_files.len()).collect();
    let test = read_split(&test_files, &identity, &shape)?;
    Ok((train, test, classes))
}

/// `Ok` when `path` is a folder (or a link to one); [`ModelsError::MissingData`] when nothing
/// is there, [`ModelsError::BadData`] saying what it is otherwise.
fn ensure_folder(path: &Path) -> Result<()> {
    if files::is_dir(path) {
        Ok(())
    } else if files::is_present(path) {
        Err(ModelsError::bad_data(
            path,
            format!("is {}, not a folder ({LAYOUT})", files::describe(path)),
        ))
    } else {
        Err(ModelsError::MissingData {
            set: "image_folder".into(),
            path: path.to_path_buf(),
            hint: LAYOUT.into(),
        })
    }
}

/// Whether a directory entry's name starts with `.` (skipped, like `.DS_Store`).
fn hidden(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

/// The entries of `dir`, sorted by name, hidden ones left out.
fn entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| ModelsError::io(dir, e))? {
        let path = entry.map_err(|e| ModelsError::io(dir, e))?.path();
        if !hidden(&path) {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

/// The sorted names of the class folders in `dir`; anything else there is an error naming it.
fn class_folders(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for path in entries(dir)? {
        if !files::is_dir(&path) {
            return Err(ModelsError::bad_data(
                &path,
                format!(
                    "is {} outside a class folder (images go in <split>/<class>/)",
                    files::describe(&path)
                ),
            ));
        }
        let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            ModelsError::bad_data(&path, "the class folder's name is not valid UTF-8")
        })?;
        names.push(name.to_string());
    }
    Ok(names)
}

/// The images of one split (`train/` or `test/`) and their labels: every class folder present,
/// its files in name order; each must be a regular `.png` file (or a link to one).
fn list_split(dir: &Path, classes: &[String]) -> Result<Vec<(PathBuf, i64)>> {
    let mut images = Vec::new();
    for (label, class) in classes.iter().enumerate() {
        let folder = dir.join(class);
        if !files::is_dir(&folder) {
            continue; // a class may be absent from the test split
        }
        let paths = entries(&folder)?;
        if paths.is_empty() {
            return Err(ModelsError::bad_data(&folder, "holds no .png images"));
        }
        for path in paths {
            if !path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("png"))
            {
                return Err(ModelsError::bad_data(
                    &path,
                    "is not a .png file (a class folder holds only PNG images)",
                ));
            }
            files::regular_len(&path)?;
            images.push((path, label as i64));
        }
    }
    Ok(images)
}

/// The size and channels set by the first image, `path`, read from its header alone.
fn first_shape(path: &Path) -> Result<Shape> {
    let header = read_png_header(path)?;
    if header.width != header.height {
        return Err(not_square(&header, path));
    }
    Ok(Shape {
        side: header.width,
        channels: header.channels,
        first: path.to_path_buf(),
    })
}

/// Decodes the images `files` (path, label) into one N×C×S×S f32 tensor: image j goes to row
/// `rows[j]`. The tensor is allocated once; each image passes through its own decode buffers
/// ([`decode_png`]) and is copied into its row.
fn read_split(files: &[(PathBuf, i64)], rows: &[usize], shape: &Shape) -> Result<Pixels> {
    let (c, s) = (shape.channels as i64, shape.side as i64);
    let values = Tensor::f_empty([files.len() as i64, c, s, s], (Kind::Float, Device::Cpu))?;
    let mut labels = vec![0i64; files.len()];
    for ((path, label), &row) in files.iter().zip(rows) {
        let image = decode_png(path, shape)?;
        let image = Tensor::f_from_slice(&image)?.f_view([c, s, s])?;
        values.f_get(row as i64)?.f_copy_(&image)?;
        labels[row] = *label;
    }
    Ok(Pixels {
        values,
        labels: Tensor::f_from_slice(&labels)?,
    })
}

/// The error of a PNG the decoder refuses.
fn not_png(path: &Path, e: png::DecodingError) -> ModelsError {
    ModelsError::bad_data(path, format!("not a valid PNG: {e}"))
}

fn not_square(header: &PngHeader, path: &Path) -> ModelsError {
    let (w, h) = (header.width, header.height);
    ModelsError::bad_data(
        path,
        format!("is {w}×{h} (width × height); images must be square"),
    )
}

/// Opens a PNG file and reads its signature and header (IHDR), nothing past it, with the
/// decoder's own allocations held to [`PNG_DECODER_BYTES`].
fn read_png_header(path: &Path) -> Result<PngHeader> {
    let (file, _) = files::open_regular(path)?;
    let limits = png::Limits {
        bytes: PNG_DECODER_BYTES,
    };
    let mut decoder = png::Decoder::new_with_limits(BufReader::new(file), limits);
    decoder.set_transformations(png::Transformations::EXPAND);
    let info = decoder.read_header_info().map_err(|e| not_png(path, e))?;
    let channels = match info.color_type {
        png::ColorType::Grayscale | png::ColorType::GrayscaleAlpha => 1,
        png::ColorType::Rgb | png::ColorType::Rgba | png::ColorType::Indexed => 3,
    };
    let (width, height) = (info.width as usize, info.height as usize);
    Ok(PngHeader {
        decoder,
        width,
        height,
        channels,
    })
}

/// Decodes a PNG file of the folder's `shape` into C×S×S values in [0, 1], channel-major: gray
/// or gray+alpha → 1 channel, RGB or RGBA → 3 (alpha dropped; palettes and bit depths under 8
/// are expanded), values v/255 (8 bits) or v/65535 (16 bits).
///
/// The header is checked against `shape` before anything past it is read. The decode buffers,
/// at most [`PNG_OUTPUT_BYTES_PER_PIXEL`](super::pixels::PNG_OUTPUT_BYTES_PER_PIXEL) bytes a pixel for the decoder's output and 4 bytes a
/// value for the returned f32 values, are counted in [`ensure_images_fit`]'s per-image term and
/// reserved with `try_reserve_exact`.
fn decode_png(path: &Path, shape: &Shape) -> Result<Vec<f32>> {
    let header = read_png_header(path)?;
    check_against_shape(&header, path, shape)?;
    let (w, h) = (header.width, header.height);
    let mut reader = header.decoder.read_info().map_err(|e| not_png(path, e))?;
    let culprit = path.display().to_string();
    let size = reader.output_buffer_size();
    let mut buf = files::reserved(Some(size), "the image's decoded samples", &culprit)?;
    buf.resize(size, 0u8);
    let info = reader.next_frame(&mut buf).map_err(|e| not_png(path, e))?;
    if (info.width as usize, info.height as usize) != (w, h) {
        return Err(ModelsError::bad_data(
            path,
            format!(
                "its first frame is {}×{}, not the header's {w}×{h}",
                info.width, info.height
            ),
        ));
    }
    channel_major(&buf, &info, shape.channels, path)
}

/// Checks a header against the folder's shape: square, of the first image's side and channels.
fn check_against_shape(header: &PngHeader, path: &Path, shape: &Shape) -> Result<()> {
    let (w, c) = (header.width, header.channels);
    if w != header.height {
        return Err(not_square(header, path));
    }
    if shape.side != w || shape.channels != c {
        return Err(ModelsError::bad_data(
            path,
            format!(
                "is {w}×{w} with {c} channel(s), but the first image {} is {1}×{1} with {2} \
                 channel(s); all images must have one size and channel count",
                shape.first.display(),
                shape.side,
                shape.channels
            ),
        ));
    }
    Ok(())
}

/// The decoder's interleaved rows (H×W, `stored` samples a pixel, 8 or 16 bits) as `c`
/// channel-major planes of f32 values in [0, 1] (alpha dropped).
fn channel_major(buf: &[u8], info: &png::OutputInfo, c: usize, path: &Path) -> Result<Vec<f32>> {
    let stored = match info.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
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
    // The decoded buffer holds at least `pixels` bytes, so the product fits.
    let pixels = info.width as usize * info.height as usize;
    let culprit = path.display().to_string();
    let mut values = files::reserved(c.checked_mul(pixels), "the image's f32 values", &culprit)?;
    for ch in 0..c {
        values.extend((0..pixels).map(|p| sample(p * stored + ch)));
    }
    Ok(values)
}
