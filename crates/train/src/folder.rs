//! The rules of a run folder, in one place: what a run may be called, which files are a run's
//! own, how they are written, and what a fresh start may delete.
//!
//! - **Names.** A run's folder is `<out>/<name>`; [`check_name`] admits only a plain file-name
//!   component (no `.`, `..`, separators or NUL, at most [`MAX_NAME_BYTES`] bytes), so a run never
//!   writes outside `<out>`.
//! - **Own files.** A run writes [`OWN_FILES`] at its top level and `variant-<n>/checkpoint.safetensors`
//!   below it (each also as a `.tmp` while it is written). Nothing else in the folder is the run's.
//! - **Nothing it did not create is deleted.** A new run needs an absent or empty folder
//!   ([`ensure_empty`]); [`remove_own_files`] (a fresh start, `--fresh`) deletes only the run's
//!   own files, then the `variant-<n>` folders it emptied; anything else stays. It first checks
//!   that the folder's `config.toml` is a run's of that name ([`ensure_run_of`]), and a linked
//!   `variant-<n>` is never the run's.
//! - **Atomic writes.** [`write_atomic`] writes a sibling `.tmp`, flushes it to the disk
//!   (`fsync`), renames it over the target and flushes the folder, so a crash leaves either the
//!   old file or the new one, never a torn one.
//! - **Reading never changes.** Every check a resume makes ([`file_kind`], the readers of
//!   [`crate::run`]) reads only; a resume that fails leaves the folder byte-identical.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::{RunError, RunResult as Result};

/// The longest run name, in bytes: the longest file name of common Linux, macOS and Windows
/// file systems (ext4, APFS, NTFS).
pub const MAX_NAME_BYTES: usize = 255;

/// The files a run writes at the top of its folder: the resolved config, the metrics, how it
/// ended, and (`train --config`) its report and plots.
pub const OWN_FILES: [&str; 6] = [
    "config.toml",
    "metrics.jsonl",
    "run.json",
    "report.md",
    "loss.png",
    "spectra.png",
];

/// The file a variant's checkpoint is written to, in `variant-<n>/`.
pub const CHECKPOINT_FILE: &str = "checkpoint.safetensors";

/// `Ok` when `name` can be a run folder's name: a plain file-name component of 1 to
/// [`MAX_NAME_BYTES`] bytes, without `/`, `\`, NUL, and not `.` or `..`; otherwise what is wrong.
pub fn check_name(name: &str) -> std::result::Result<(), String> {
    let bad = if name.is_empty() {
        Some("is empty".to_string())
    } else if name.len() > MAX_NAME_BYTES {
        Some(format!(
            "is {} bytes long, more than {MAX_NAME_BYTES}",
            name.len()
        ))
    } else if name.contains(['/', '\\', '\0']) {
        Some("contains a path separator or NUL".to_string())
    } else if name == "." || name == ".." {
        Some("is `.` or `..`".to_string())
    } else {
        None
    };
    match bad {
        Some(why) => Err(format!(
            "{why}: a run name is a plain folder name of 1–{MAX_NAME_BYTES} bytes without `/`, \
             `\\` or NUL, and not `.` or `..`, found {:?}",
            shorten(name)
        )),
        None => Ok(()),
    }
}

/// `name`, cut to its first 60 characters for a message.
fn shorten(name: &str) -> String {
    match name.char_indices().nth(60) {
        Some((i, _)) => format!("{}… ({} bytes)", &name[..i], name.len()),
        None => name.to_string(),
    }
}

/// `Ok` when the last component of `dir` is a plain name ([`check_name`]): a run folder is never
/// `out/..` or `out/.`, whoever built the path.
pub fn check_dir(dir: &Path) -> Result<()> {
    // The text after the last separator: `Path::components` would read `out/.` as `out`.
    let text = dir.to_string_lossy();
    let last = text
        .rsplit(std::path::is_separator)
        .next()
        .unwrap_or_default();
    check_name(last).map_err(|reason| RunError::Folder {
        dir: dir.to_path_buf(),
        reason: format!("the run folder's name {reason}"),
    })
}

/// What is at a path, read without following a dangling link and without opening it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// Nothing.
    Absent,
    /// A regular file (or a link to one).
    Regular,
    /// A folder (or a link to one).
    Directory,
    /// Something else: a FIFO, socket, device, or a link that leads nowhere or in a loop.
    Other,
}

/// The [`FileKind`] at `path`; an error other than "not found" (permission, a link loop) is an
/// error naming the path.
pub fn file_kind(path: &Path) -> Result<FileKind> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(FileKind::Regular),
        Ok(m) if m.is_dir() => Ok(FileKind::Directory),
        Ok(_) => Ok(FileKind::Other),
        Err(e) if e.kind() == io::ErrorKind::NotFound => match fs::symlink_metadata(path) {
            // A link whose target is missing: something is there, and it is not a file.
            Ok(_) => Ok(FileKind::Other),
            Err(_) => Ok(FileKind::Absent),
        },
        Err(e) => Err(RunError::io(path, e)),
    }
}

/// `Ok(true)` when `path` is a regular file, `Ok(false)` when nothing is there, and an error
/// naming the path when something else is (a folder, a FIFO, a broken or looping link).
pub fn regular_or_absent(path: &Path) -> Result<bool> {
    match file_kind(path)? {
        FileKind::Regular => Ok(true),
        FileKind::Absent => Ok(false),
        kind => Err(RunError::Folder {
            dir: path.to_path_buf(),
            reason: format!("is not a regular file ({kind:?}); a run folder's files are files"),
        }),
    }
}

/// Writes `bytes` to `path` atomically: a sibling `<name>.tmp`, `fsync`, rename, then `fsync` of
/// the folder (see the module docs).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = tmp_path(path);
    let mut file = File::create(&tmp).map_err(|e| RunError::io(&tmp, e))?;
    file.write_all(bytes).map_err(|e| RunError::io(&tmp, e))?;
    file.sync_all().map_err(|e| RunError::io(&tmp, e))?;
    commit(&tmp, path)
}

/// Renames a fully written and synced `tmp` over `path` and flushes the folder's entry.
pub fn commit(tmp: &Path, path: &Path) -> Result<()> {
    fs::rename(tmp, path).map_err(|e| RunError::io(path, e))?;
    sync_parent(path)
}

/// `path` with `.tmp` appended to its file name (`run.json` → `run.json.tmp`).
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Flushes the folder holding `path`, so that a rename into it survives a crash (a no-op where
/// folders cannot be opened, as on Windows).
pub fn sync_parent(path: &Path) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    #[cfg(unix)]
    File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(|e| RunError::io(parent, e))?;
    #[cfg(not(unix))]
    let _ = parent;
    Ok(())
}

/// The run's own files present in `dir` (see [`OWN_FILES`]), paths relative to `dir`, in name
/// order; `variant-<n>` folders are listed after their files.
pub fn own_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for name in OWN_FILES {
        for candidate in [PathBuf::from(name), tmp_path(Path::new(name))] {
            if file_kind(&dir.join(&candidate))? == FileKind::Regular {
                found.push(candidate);
            }
        }
    }
    for variant in variant_dirs(dir)? {
        let ckpt = variant.join(CHECKPOINT_FILE);
        for candidate in [ckpt.clone(), tmp_path(&ckpt)] {
            if file_kind(&dir.join(&candidate))? == FileKind::Regular {
                found.push(candidate);
            }
        }
        found.push(variant);
    }
    Ok(found)
}

/// The `variant-<digits>` folders of `dir`, relative to it, sorted.
fn variant_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = entries(dir)?
        .into_iter()
        .filter(|name| {
            name.strip_prefix("variant-")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        // A link is not the run's folder, whatever it leads to: it is neither read nor emptied.
        .filter(|name| fs::symlink_metadata(dir.join(name)).is_ok_and(|m| m.is_dir()))
        .map(PathBuf::from)
        .collect();
    found.sort();
    Ok(found)
}

/// The names in `dir` (none when it does not exist).
pub fn entries(dir: &Path) -> Result<Vec<String>> {
    let read = match fs::read_dir(dir) {
        Ok(read) => read,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(RunError::io(dir, e)),
    };
    let mut names = Vec::new();
    for entry in read {
        let entry = entry.map_err(|e| RunError::io(dir, e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// Deletes the run's own files in `dir` ([`own_files`]) and the `variant-<n>` folders that are
/// empty afterwards; anything else stays. Returns how many files were deleted. A folder whose
/// files are named like a run's but that is not a run of `name` ([`ensure_run_of`]) is an
/// error, and nothing is deleted.
pub fn remove_own_files(dir: &Path, name: &str) -> Result<usize> {
    ensure_run_of(dir, name)?;
    let mut deleted = 0;
    for rel in own_files(dir)? {
        let path = dir.join(&rel);
        if file_kind(&path)? == FileKind::Directory {
            // Only an empty folder goes: `remove_dir` refuses one with anything left in it.
            if entries(&path)?.is_empty() {
                fs::remove_dir(&path).map_err(|e| RunError::io(&path, e))?;
            }
        } else {
            fs::remove_file(&path).map_err(|e| RunError::io(&path, e))?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// `Ok` when `dir` holds none of a run's own files ([`own_files`]), or when its `config.toml`
/// is a run's of `name`: a `[run]` table whose `name` (`experiment` in older folders) is
/// `name`. Otherwise [`RunError::Folder`]: a file name alone does not make a file the run's.
pub fn ensure_run_of(dir: &Path, name: &str) -> Result<()> {
    if own_files(dir)?.is_empty() || recorded_name(dir).as_deref() == Some(name) {
        return Ok(());
    }
    Err(RunError::Folder {
        dir: dir.to_path_buf(),
        reason: format!(
            "holds files named like a run's, but its config.toml is not the config of a kappa \
             run named `{name}` (a `[run]` table with name = \"{name}\"); nothing was deleted. \
             Move the files away or choose another folder"
        ),
    })
}

/// The run name recorded in `dir/config.toml`'s `[run]` table, if it is a regular file that
/// parses as TOML and has one.
fn recorded_name(dir: &Path) -> Option<String> {
    let path = dir.join("config.toml");
    if file_kind(&path).ok()? != FileKind::Regular {
        return None;
    }
    let file: toml::Table = toml::from_str(&fs::read_to_string(path).ok()?).ok()?;
    let run = file.get("run")?.as_table()?;
    let name = run.get("name").or_else(|| run.get("experiment"))?;
    name.as_str().map(str::to_string)
}

/// `Ok` when `dir` is absent or empty; otherwise [`RunError::FolderInUse`], naming what is in
/// it and whether it holds a run (which `--resume` continues and `--fresh` starts over).
pub fn ensure_empty(dir: &Path) -> Result<()> {
    if file_kind(dir)? == FileKind::Absent {
        return Ok(());
    }
    let names = entries(dir)?;
    if names.is_empty() {
        return Ok(());
    }
    let own = own_files(dir)?;
    Err(RunError::FolderInUse {
        dir: dir.to_path_buf(),
        holds_a_run: !own.is_empty(),
        foreign: names
            .into_iter()
            .filter(|n| !own.iter().any(|o| o.starts_with(n)))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kappa-folder-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_run_name_is_a_plain_component_of_bounded_length() {
        for good in ["demo", "a.b", "..x", "x..", "ünïcode-run", &"n".repeat(255)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a\\b", "a\0b", "/", &"n".repeat(256)] {
            let err = check_name(bad).unwrap_err();
            assert!(err.contains("plain folder name"), "{bad:?}: {err}");
        }
        assert!(check_dir(Path::new("out/..")).is_err());
        assert!(check_dir(Path::new("out/.")).is_err());
        assert!(check_dir(Path::new("out/run")).is_ok());
        assert!(check_dir(Path::new("out/")).is_err());
        assert!(check_dir(&Path::new("out").join("..")).is_err());
    }

    #[test]
    fn a_fresh_start_deletes_only_the_runs_own_files() {
        let dir = scratch("own");
        for f in ["metrics.jsonl", "run.json", "notes.txt"] {
            fs::write(dir.join(f), f).unwrap();
        }
        fs::write(dir.join("config.toml"), "[run]\nname = \"demo\"\n").unwrap();
        fs::create_dir_all(dir.join("variant-0")).unwrap();
        fs::write(dir.join("variant-0").join(CHECKPOINT_FILE), "w").unwrap();
        fs::create_dir_all(dir.join("variant-1")).unwrap();
        fs::write(dir.join("variant-1").join("mine.bin"), "keep").unwrap();
        fs::create_dir_all(dir.join("variant-x")).unwrap();
        assert!(
            remove_own_files(&dir, "other").is_err(),
            "a run of another name"
        );
        assert_eq!(remove_own_files(&dir, "demo").unwrap(), 4);
        assert_eq!(
            entries(&dir).unwrap(),
            ["notes.txt", "variant-1", "variant-x"]
        );
        assert_eq!(entries(&dir.join("variant-1")).unwrap(), ["mine.bin"]);
        let err = ensure_empty(&dir).unwrap_err().to_string();
        assert!(err.contains("notes.txt"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fresh_start_refuses_a_folder_that_is_not_a_run_and_deletes_nothing() {
        let dir = scratch("foreign");
        fs::write(dir.join("config.toml"), "[server]\nport = 80\n").unwrap();
        fs::write(dir.join("report.md"), "# my notes").unwrap();
        let err = remove_own_files(&dir, "demo").unwrap_err().to_string();
        assert!(err.contains("nothing was deleted"), "{err}");
        assert_eq!(entries(&dir).unwrap(), ["config.toml", "report.md"]);
        fs::write(dir.join("config.toml"), "not toml [").unwrap();
        assert!(remove_own_files(&dir, "demo").is_err());
        assert_eq!(entries(&dir).unwrap(), ["config.toml", "report.md"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_linked_variant_folder_is_not_the_runs() {
        let dir = scratch("linked-variant");
        let elsewhere = scratch("linked-target");
        fs::write(elsewhere.join(CHECKPOINT_FILE), "keep").unwrap();
        fs::write(dir.join("config.toml"), "[run]\nname = \"demo\"\n").unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join("variant-0")).unwrap();
        assert_eq!(own_files(&dir).unwrap(), [PathBuf::from("config.toml")]);
        assert_eq!(remove_own_files(&dir, "demo").unwrap(), 1);
        assert!(elsewhere.join(CHECKPOINT_FILE).exists());
        fs::remove_dir_all(&dir).unwrap();
        fs::remove_dir_all(&elsewhere).unwrap();
    }

    #[test]
    fn an_atomic_write_replaces_the_file_and_leaves_no_tmp() {
        let dir = scratch("atomic");
        let path = dir.join("run.json");
        fs::write(&path, "old").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(entries(&dir).unwrap(), ["run.json"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_looping_or_dangling_link_is_neither_absent_nor_a_file() {
        let dir = scratch("links");
        let looped = dir.join("config.toml");
        std::os::unix::fs::symlink(&looped, &looped).unwrap();
        assert!(regular_or_absent(&looped).is_err());
        let dangling = dir.join("run.json");
        std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
        assert_eq!(file_kind(&dangling).unwrap(), FileKind::Other);
        assert!(!regular_or_absent(&dir.join("metrics.jsonl")).unwrap());
        fs::remove_dir_all(&dir).unwrap();
    }
}
