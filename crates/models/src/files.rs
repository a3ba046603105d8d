//! Opening the files a user hands kappa-models: only regular files are read as data.
//!
//! A data path must name a regular file or a symbolic link to one. Anything else is refused
//! with [`ModelsError::NotRegularFile`] naming the path and what it is, before it is opened:
//! opening a FIFO for reading blocks until a writer comes, a character device such as
//! `/dev/zero` never ends, and a directory has no bytes to read. A dangling symbolic link is
//! refused the same way (it is an error, not a file that is silently skipped). The check is
//! made again on the opened file, so a path swapped for a directory or device between the two
//! still reads nothing.
//!
//! Every file is read whole only after [`crate::memory::ensure_fits`] has accepted its length
//! (the culprit is the path), and its buffer is reserved with `try_reserve_exact`, so a file
//! larger than what this process may allocate is an error, not an abort.

use std::fs::{self, File, FileType, Metadata};
use std::io::Read;
use std::path::Path;

use crate::error::{ModelsError, Result};
use crate::memory::ensure_fits;

/// What a file type is, in words (`a directory`, `a FIFO (named pipe)`, …).
fn describe_type(file_type: &FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if file_type.is_socket() {
            return "a socket";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
    }
    if file_type.is_file() {
        "a regular file"
    } else if file_type.is_dir() {
        "a directory"
    } else {
        "neither a regular file nor a directory"
    }
}

/// What is at `path`, following symbolic links: `Ok(metadata)`, or for a link that cannot be
/// followed, [`ModelsError::NotRegularFile`]; other failures (nothing there, no permission)
/// are [`ModelsError::Io`].
fn followed_metadata(path: &Path) -> Result<Metadata> {
    fs::metadata(path).map_err(|e| match fs::symlink_metadata(path) {
        Ok(link) if link.file_type().is_symlink() => ModelsError::NotRegularFile {
            path: path.to_path_buf(),
            kind: "a symbolic link whose target does not exist or cannot be reached",
        },
        _ => ModelsError::io(path, e),
    })
}

/// Whether anything is at `path`, a dangling symbolic link included: loaders of installable
/// data sets answer `false` with [`ModelsError::MissingData`] and its install hint, and read
/// anything else through [`open_regular`], which names what is wrong with it.
pub fn is_present(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}

/// Whether `path` is a directory or a symbolic link to one.
pub fn is_dir(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_dir())
}

/// What is at `path`, following symbolic links, in words: `a regular file`, `a directory`,
/// `a FIFO (named pipe)`, `a socket`, `a block device`, `a character device`, `a symbolic
/// link whose target …`, or `nothing that can be read (…)` with the system's reason.
pub fn describe(path: &Path) -> String {
    match followed_metadata(path) {
        Ok(meta) => describe_type(&meta.file_type()).to_string(),
        Err(ModelsError::NotRegularFile { kind, .. }) => kind.to_string(),
        Err(e) => format!("nothing that can be read ({e})"),
    }
}

/// The length in bytes of the regular file at `path` (or at the end of a symbolic link),
/// checked without opening it.
///
/// Errors: [`ModelsError::NotRegularFile`] naming the path and what it is (a directory, FIFO,
/// socket, device or dangling link); [`ModelsError::Io`] when nothing is there.
pub fn regular_len(path: &Path) -> Result<u64> {
    let meta = followed_metadata(path)?;
    if meta.is_file() {
        Ok(meta.len())
    } else {
        Err(ModelsError::NotRegularFile {
            path: path.to_path_buf(),
            kind: describe_type(&meta.file_type()),
        })
    }
}

/// Opens the regular file at `path` for reading, after [`regular_len`] has accepted it; returns
/// the file and its length (read again from the opened file).
///
/// Errors: those of [`regular_len`]; [`ModelsError::Io`] when it cannot be opened.
pub fn open_regular(path: &Path) -> Result<(File, u64)> {
    regular_len(path)?;
    let file = File::open(path).map_err(|e| ModelsError::io(path, e))?;
    let meta = file.metadata().map_err(|e| ModelsError::io(path, e))?;
    if !meta.is_file() {
        return Err(ModelsError::NotRegularFile {
            path: path.to_path_buf(),
            kind: describe_type(&meta.file_type()),
        });
    }
    Ok((file, meta.len()))
}

/// Reads the rest of `file` (`path` in errors), which must hold exactly `len` more bytes, into
/// a buffer reserved up front; a file that has grown or shrunk since its length was read is
/// [`ModelsError::BadData`].
pub fn read_exact_len(file: File, len: u64, path: &Path) -> Result<Vec<u8>> {
    let capacity = usize::try_from(len).ok().and_then(|n| n.checked_add(1));
    let mut data = reserved(capacity, "the file's contents", &path.display().to_string())?;
    file.take(len.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| ModelsError::io(path, e))?;
    if data.len() as u64 != len {
        let read = if data.len() as u64 > len {
            format!("more than {len}")
        } else {
            data.len().to_string()
        };
        return Err(ModelsError::bad_data(
            path,
            format!("changed while it was read: its length was {len} bytes, {read} were read"),
        ));
    }
    Ok(data)
}

/// An empty vector with room for `capacity` elements (`None`: the count overflowed), reserved
/// with `try_reserve_exact`: an allocator that refuses is [`ModelsError::TooLarge`] naming
/// `what` and `culprit`, where `Vec::with_capacity` would abort the process.
pub(crate) fn reserved<T>(capacity: Option<usize>, what: &str, culprit: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    let bytes = capacity.and_then(|n| n.checked_mul(std::mem::size_of::<T>()));
    match capacity.map(|n| v.try_reserve_exact(n)) {
        Some(Ok(())) => Ok(v),
        _ => Err(ModelsError::TooLarge {
            culprit: culprit.to_string(),
            what: what.to_string(),
            needed: bytes.map_or_else(
                || "more than 2^64 bytes".into(),
                |b| crate::memory::human_bytes(b as u128),
            ),
            budget: crate::memory::budget().to_string(),
        }),
    }
}

/// The bytes of the regular file at `path`, after [`ensure_fits`] has accepted its length.
///
/// Errors: those of [`open_regular`]; [`ModelsError::TooLarge`] for a file larger than this
/// process may allocate; [`ModelsError::BadData`] for a file that changed size while read.
pub fn read_regular(path: &Path) -> Result<Vec<u8>> {
    let (file, len) = open_regular(path)?;
    ensure_fits(
        Some(u128::from(len)),
        "the file's contents",
        &path.display().to_string(),
    )?;
    read_exact_len(file, len, path)
}

/// The text of the regular file at `path` ([`read_regular`]), which must be UTF-8.
///
/// Errors: those of [`read_regular`]; [`ModelsError::BadData`] naming the first byte that is
/// not UTF-8.
pub fn read_regular_text(path: &Path) -> Result<String> {
    String::from_utf8(read_regular(path)?).map_err(|e| {
        ModelsError::bad_data(
            path,
            format!(
                "is not UTF-8 text: invalid byte sequence at byte {}",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kappa-files-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_regular_file_and_a_link_to_one_are_read_and_a_directory_is_refused_by_name() {
        let dir = scratch("regular");
        let file = dir.join("a.txt");
        fs::write(&file, "héllo").unwrap();
        assert_eq!(read_regular_text(&file).unwrap(), "héllo");
        assert_eq!(regular_len(&file).unwrap(), 6);
        #[cfg(unix)]
        {
            let link = dir.join("link.txt");
            std::os::unix::fs::symlink(&file, &link).unwrap();
            assert_eq!(read_regular(&link).unwrap(), "héllo".as_bytes());
            let dangling = dir.join("dangling.txt");
            std::os::unix::fs::symlink(dir.join("gone"), &dangling).unwrap();
            let err = read_regular(&dangling).unwrap_err().to_string();
            assert!(
                err.contains("dangling.txt") && err.contains("symbolic link"),
                "{err}"
            );
            assert!(is_present(&dangling) && !is_dir(&dangling));
        }
        let err = read_regular(&dir).unwrap_err();
        assert!(matches!(err, ModelsError::NotRegularFile { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&*dir.to_string_lossy()) && text.contains("a directory"),
            "{text}"
        );
        assert_eq!(describe(&dir), "a directory");
        assert!(!is_present(&dir.join("missing")));
        assert!(matches!(
            read_regular(&dir.join("missing")),
            Err(ModelsError::Io { .. })
        ));
        fs::write(&file, [0x61, 0xff, 0x62]).unwrap();
        let err = read_regular_text(&file).unwrap_err().to_string();
        assert!(err.contains("a.txt") && err.contains("byte 1"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_character_device_is_refused_before_it_is_opened() {
        let err = read_regular(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/dev/zero") && err.contains("character device"),
            "{err}"
        );
    }
}
