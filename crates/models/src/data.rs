//! Data loaders for the sets `cargo xtask setup` installs — Fashion-MNIST (IDX files), the
//! State of the Union text and the Brown corpus (characters, GPT-2 BPE or bytes) — and for a user's own data: a plain-text
//! file ([`TextCorpus::from_file`]), a folder of gray IDX images of any size
//! ([`ImageSplits::from_idx_dir`]) or of PNG images in torchvision's `ImageFolder` layout
//! ([`ImageSplits::from_image_folder`]), with deterministic batching. Every image source
//! gives one split type, [`ImageSplits`]; how the splits are cut and the pixels normalized is
//! in [`images`]. Sequence-classification tasks for a Long-Range-Arena suite (ListOps,
//! Pathfinder, byte-level movie-review sentiment, Fashion-MNIST pixels) give one split type,
//! [`sequences::SequenceSplits`].
//!
//! # Determinism
//!
//! Batches are a pure function of (seed, step): images are drawn epoch by epoch from a
//! Fisher–Yates permutation seeded by (seed, epoch) (ChaCha8), text windows start at offsets drawn
//! from a ChaCha8 stream seeded by (seed, step). The data order therefore needs no saved state:
//! resuming at step s reproduces the batches of an uninterrupted run exactly.
//!
//! # Layout on disk (`cargo xtask setup --data NAME` writes it)
//!
//! | set | folder | files |
//! |---|---|---|
//! | `fashion-mnist` | `<data>/fashion-mnist` | `{train,t10k}-{images-idx3,labels-idx1}-ubyte`, uncompressed IDX |
//! | `sotu` | `<data>/sotu` | `train.txt` (addresses 1790–1999), `val.txt` (2000–2021) |
//! | `brown` | `<data>/brown` | `brown.txt`: one sentence a line, a blank line between its 500 files ([`TextCorpus::read_brown`]) |
//! | `movie-reviews` | `<data>/movie-reviews` | `sentences.tsv`: `label<TAB>score<TAB>sentence` ([`sequences::text`]) |
//!
//! A user's image folder: `DIR/train/<class>/*.png` and `DIR/test/<class>/*.png`.
//!
//! # Hostile files
//!
//! Every file is read through [`crate::files`]: only regular files (or symbolic links to one)
//! are read, and a directory, FIFO, socket, device or dangling link is an error naming it.
//! Sizes read from a file (an IDX header, a PNG header, a text's length) are computed with
//! checked arithmetic, the header is checked against the file's length, and the memory the
//! loader will take is checked with [`crate::memory::ensure_fits`] before it is allocated; how
//! each bound is derived is documented next to its check ([`read_idx`],
//! [`TEXT_BYTES_PER_FILE_BYTE`], [`ImageSplits::from_image_folder`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

use crate::error::{ModelsError, Result};
use crate::files;
use crate::memory::ensure_fits;

mod image_folder;
pub mod images;
mod pixels;
pub mod sequences;

pub use images::{
    FashionMnist, ImageSet, ImageSplits, Normalize, SplitOptions, FASHION_MNIST_CLASSES,
    FASHION_MNIST_MEAN_STD, IDX_FILES, IMAGE_FOLDER_SPLIT_SEED,
};

/// A decoded IDX file: dimensions and unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idx {
    /// Dimensions (count first).
    pub dims: Vec<usize>,
    /// Row-major data.
    pub data: Vec<u8>,
}

/// Reads an IDX file of unsigned bytes (type code 0x08): magic `0 0 8 n`, n big-endian u32
/// dimensions, then the data.
///
/// The header is not trusted before the file's length matches it: every dimension must be at
/// least 1, their product (in u64, checked) is the data's length in bytes, and the file must be
/// exactly the 4 + 4n header bytes plus that. Only then is the data read, into one buffer of
/// that length (checked with [`ensure_fits`]; the bytes are read straight into it, no other
/// copy).
///
/// Errors: [`ModelsError::NotRegularFile`] or [`ModelsError::Io`] for a path that is not a
/// readable regular file; [`ModelsError::BadData`] naming the file for a wrong magic, a
/// truncated header, a dimension of 0, dimensions whose product overflows, or a data length
/// other than the header's; [`ModelsError::TooLarge`] for data larger than this process may
/// allocate.
pub fn read_idx(path: &Path) -> Result<Idx> {
    let (file, dims, count) = open_idx(path)?;
    ensure_fits(
        Some(u128::from(count)),
        "the IDX file's data",
        &path.display().to_string(),
    )?;
    let data = files::read_exact_len(file, count, path)?;
    Ok(Idx { dims, data })
}

/// The dimensions of the IDX file at `path`, read from its header and checked against the
/// file's length as [`read_idx`] checks them, without reading the data.
pub fn read_idx_dims(path: &Path) -> Result<Vec<usize>> {
    open_idx(path).map(|(_, dims, _)| dims)
}

/// Opens an IDX file and reads and checks its header ([`read_idx`]): the file, positioned at
/// the data, its dimensions and the data's length in bytes.
fn open_idx(path: &Path) -> Result<(fs::File, Vec<usize>, u64)> {
    let (mut file, len) = files::open_regular(path)?;
    let bad = |reason: String| ModelsError::bad_data(path, reason);
    let mut magic = [0u8; 4];
    if let Err(e) = file.read_exact(&mut magic) {
        return Err(match e.kind() {
            std::io::ErrorKind::UnexpectedEof => bad(format!(
                "not an IDX file: {len} bytes, shorter than the 4-byte magic"
            )),
            _ => ModelsError::io(path, e),
        });
    }
    if magic[..3] != [0, 0, 0x08] || magic[3] == 0 {
        return Err(bad(format!(
            "not an unsigned-byte IDX file (magic {magic:02x?}, expected 00 00 08 n with \
             n ≥ 1 dimensions)"
        )));
    }
    let n = usize::from(magic[3]);
    let header = 4 + 4 * n as u64;
    let mut raw = vec![0u8; 4 * n];
    if len < header || file.read_exact(&mut raw).is_err() {
        return Err(bad(format!(
            "truncated header: {n} dimensions need {header} bytes, the file has {len}"
        )));
    }
    let dims: Vec<usize> = raw
        .chunks_exact(4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .collect();
    if let Some(i) = dims.iter().position(|&d| d == 0) {
        return Err(bad(format!("dimension {i} of {dims:?} is 0")));
    }
    let count = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .filter(|&c| usize::try_from(c).is_ok())
        .ok_or_else(|| bad(format!("the product of dimensions {dims:?} overflows")))?;
    if len - header != count {
        return Err(bad(format!(
            "dimensions {dims:?} need {count} bytes of data, found {}",
            len - header
        )));
    }
    Ok((file, dims, count))
}

/// Writes an unsigned-byte IDX file (the inverse of [`read_idx`]); every dimension must be at
/// least 1.
pub fn write_idx(path: &Path, dims: &[usize], data: &[u8]) -> Result<()> {
    let count = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if count != Some(data.len()) || dims.is_empty() || dims.len() > 255 || dims.contains(&0) {
        return Err(ModelsError::Shape {
            arg: "data",
            reason: format!("{} bytes for dimensions {dims:?}", data.len()),
        });
    }
    let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
    for &d in dims {
        let d = u32::try_from(d).map_err(|_| ModelsError::Shape {
            arg: "dims",
            reason: format!("{d} does not fit in u32"),
        })?;
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.extend_from_slice(data);
    fs::write(path, bytes).map_err(|e| ModelsError::io(path, e))
}

/// The Fisher–Yates permutation of 0..n for (seed, epoch).
pub fn permutation(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(epoch);
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.gen_range(0..=i);
        p.swap(i, j);
    }
    p
}

/// How text becomes token ids.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenizerKind {
    /// One token per Unicode character; the vocabulary is the sorted set of characters of the
    /// training and validation text.
    #[default]
    Char,
    /// GPT-2's byte-pair encoding (`r50k_base`, 50 257 tokens) through `tiktoken-rs`.
    Gpt2Bpe,
    /// One token per UTF-8 byte (ids 0–255, whatever the text): the tokens of the masked-LM
    /// pretraining and of the byte-level movie-review task ([`crate::mlm`]).
    Bytes,
}

/// A tokenizer: characters or GPT-2 BPE.
pub enum Tokenizer {
    /// Character vocabulary.
    Char {
        /// id → character.
        chars: Vec<char>,
        /// character → id.
        index: BTreeMap<char, u32>,
    },
    /// GPT-2 BPE.
    Gpt2Bpe(Box<tiktoken_rs::CoreBPE>),
    /// UTF-8 bytes.
    Bytes,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tokenizer::Char { chars, .. } => write!(f, "Tokenizer::Char({} chars)", chars.len()),
            Tokenizer::Gpt2Bpe(_) => write!(f, "Tokenizer::Gpt2Bpe"),
            Tokenizer::Bytes => write!(f, "Tokenizer::Bytes"),
        }
    }
}

impl Tokenizer {
    /// A character tokenizer over the characters of `texts`: id i is the i-th of their distinct
    /// characters in code-point order. Memory: a table of the 128 ASCII characters and a set of
    /// the distinct others, whatever the length of the texts.
    pub fn chars_of(texts: &[&str]) -> Self {
        let mut ascii = [false; 128];
        let mut others = BTreeSet::new();
        for c in texts.iter().flat_map(|t| t.chars()) {
            match ascii.get_mut(c as usize) {
                Some(seen) => *seen = true,
                None => {
                    others.insert(c);
                }
            }
        }
        // Every ASCII character sorts before every other one.
        let chars: Vec<char> = (0u8..128)
            .filter(|&b| ascii[usize::from(b)])
            .map(char::from)
            .chain(others)
            .collect();
        let index = chars
            .iter()
            .enumerate()
            .map(|(i, &c)| (c, i as u32))
            .collect();
        Tokenizer::Char { chars, index }
    }

    /// GPT-2's BPE (`r50k_base`).
    pub fn gpt2() -> Result<Self> {
        Ok(Tokenizer::Gpt2Bpe(Box::new(
            tiktoken_rs::r50k_base().map_err(|e| ModelsError::Tokenizer(e.to_string()))?,
        )))
    }

    /// The vocabulary size.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Char { chars, .. } => chars.len(),
            Tokenizer::Gpt2Bpe(_) => 50257,
            Tokenizer::Bytes => 256,
        }
    }

    /// Token ids of `text`; a character outside the vocabulary is an error.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        match self {
            Tokenizer::Char { index, .. } => {
                let lookup = CharLookup::new(index);
                text.chars().map(|c| lookup.id(c)).collect()
            }
            Tokenizer::Gpt2Bpe(bpe) => Ok(bpe
                .encode_ordinary(text)
                .into_iter()
                .map(i64::from)
                .collect()),
            Tokenizer::Bytes => Ok(text.bytes().map(i64::from).collect()),
        }
    }

    /// The token ids of `text` ([`Tokenizer::encode`]) as a 1-D Int64 tensor on the CPU, made
    /// without a full-length copy besides the tensor: 8 bytes a token, checked with
    /// [`ensure_fits`] (`culprit` names the text's file) before it is allocated. For
    /// `Gpt2Bpe` the ids come first as tiktoken's u32 vector (4 bytes a token), freed once the
    /// tensor is filled, and tiktoken's merge step takes up to 56 bytes per byte of the text's
    /// longest word, checked before it starts.
    pub fn token_tensor(&self, text: &str, culprit: &str) -> Result<Tensor> {
        match self {
            Tokenizer::Char { index, .. } => {
                let lookup = CharLookup::new(index);
                let ids = text.chars().map(|c| lookup.id(c));
                ids_tensor(text.chars().count(), ids, culprit)
            }
            Tokenizer::Gpt2Bpe(bpe) => {
                ensure_fits(
                    (longest_bpe_piece(text) as u128).checked_mul(BPE_BYTES_PER_PIECE_BYTE),
                    "GPT-2 BPE's merge state for the text's longest word",
                    culprit,
                )?;
                let ranks = bpe.encode_ordinary(text);
                ids_tensor(
                    ranks.len(),
                    ranks.into_iter().map(|r| Ok(i64::from(r))),
                    culprit,
                )
            }
            Tokenizer::Bytes => {
                ids_tensor(text.len(), text.bytes().map(|b| Ok(i64::from(b))), culprit)
            }
        }
    }

    /// The text of token ids.
    pub fn decode(&self, ids: &[i64]) -> Result<String> {
        let bad = |i: i64| ModelsError::Tokenizer(format!("token id {i} is out of range"));
        match self {
            Tokenizer::Char { chars, .. } => ids
                .iter()
                .map(|&i| {
                    usize::try_from(i)
                        .ok()
                        .and_then(|u| chars.get(u).copied())
                        .ok_or_else(|| bad(i))
                })
                .collect(),
            Tokenizer::Gpt2Bpe(bpe) => {
                let ranks = ids
                    .iter()
                    .map(|&i| u32::try_from(i).map_err(|_| bad(i)))
                    .collect::<Result<Vec<_>>>()?;
                bpe.decode(&ranks)
                    .map_err(|e| ModelsError::Tokenizer(e.to_string()))
            }
            Tokenizer::Bytes => {
                let bytes = ids
                    .iter()
                    .map(|&i| u8::try_from(i).map_err(|_| bad(i)))
                    .collect::<Result<Vec<_>>>()?;
                String::from_utf8(bytes).map_err(|e| ModelsError::Tokenizer(e.to_string()))
            }
        }
    }
}

/// Bytes tiktoken's merge step takes per byte of one piece (a word) of the text: its state
/// (32 bytes a byte: three `usize` and two `u32`) and its heap of candidate merges (16) and the
/// piece's ids (4), rounded up.
const BPE_BYTES_PER_PIECE_BYTE: u128 = 56;

/// An upper bound, in bytes, on the longest piece GPT-2's pattern cuts `text` into: its pieces
/// are contractions, runs of letters, of digits or of other symbols after at most one space, and
/// runs of whitespace, so none is longer than the longest run of non-whitespace characters plus
/// one byte, or the longest run of whitespace.
fn longest_bpe_piece(text: &str) -> usize {
    let (mut longest, mut run, mut in_space) = (0, 0, false);
    for c in text.chars() {
        if c.is_whitespace() != in_space {
            longest = longest.max(run);
            (run, in_space) = (0, c.is_whitespace());
        }
        run += c.len_utf8();
    }
    longest.max(run) + 1
}

/// The character vocabulary's character → id: a table for ASCII, the map for the rest.
struct CharLookup<'a> {
    ascii: [Option<u32>; 128],
    index: &'a BTreeMap<char, u32>,
}

impl<'a> CharLookup<'a> {
    fn new(index: &'a BTreeMap<char, u32>) -> Self {
        let mut ascii = [None; 128];
        for (b, slot) in (0u8..).zip(ascii.iter_mut()) {
            *slot = index.get(&char::from(b)).copied();
        }
        Self { ascii, index }
    }

    /// The id of `c`; a character outside the vocabulary is an error.
    fn id(&self, c: char) -> Result<i64> {
        let id = match self.ascii.get(c as usize) {
            Some(&id) => id,
            None => self.index.get(&c).copied(),
        };
        id.map(i64::from).ok_or_else(|| {
            ModelsError::Tokenizer(format!("character {c:?} is not in the vocabulary"))
        })
    }
}

/// A 1-D Int64 CPU tensor of the `n` ids that `ids` yields, filled a chunk of 2^20 ids at a
/// time: besides the tensor (8·n bytes, checked with [`ensure_fits`] against `culprit`), only a
/// chunk's 8 MiB exist at once. (Each chunk is one libtorch copy; much smaller chunks make the
/// copies' thread start-up dominate.)
fn ids_tensor(n: usize, ids: impl Iterator<Item = Result<i64>>, culprit: &str) -> Result<Tensor> {
    const CHUNK: usize = 1 << 20;
    ensure_fits((n as u128).checked_mul(8), "the token ids (Int64)", culprit)?;
    let out = Tensor::f_empty([n as i64], (tch::Kind::Int64, Device::Cpu))?;
    let mut ids = ids;
    let mut chunk = Vec::with_capacity(CHUNK.min(n));
    let mut filled = 0usize;
    loop {
        chunk.clear();
        for id in ids.by_ref().take(CHUNK) {
            chunk.push(id?);
        }
        if chunk.is_empty() || filled + chunk.len() > n {
            break;
        }
        let mut slot = out.f_narrow(0, filled as i64, chunk.len() as i64)?;
        slot.f_copy_(&Tensor::f_from_slice(&chunk)?)?;
        filled += chunk.len();
    }
    if filled != n || !chunk.is_empty() {
        return Err(ModelsError::Shape {
            arg: "ids",
            reason: format!("{n} token ids were counted but another number was produced"),
        });
    }
    Ok(out)
}

/// A tokenized corpus with a train and a validation split (1-D Int64 tensors).
#[derive(Debug)]
pub struct TextCorpus {
    /// Training tokens.
    pub train: Tensor,
    /// Validation tokens.
    pub validation: Tensor,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
}

/// Which split of a corpus.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Training data.
    Train,
    /// Validation data.
    Validation,
    /// Test data (Fashion-MNIST's t10k).
    Test,
}

impl TextCorpus {
    /// The `cargo xtask setup --data` name and the folder under the data root.
    pub const SOTU: &'static str = "sotu";

    /// The `cargo xtask setup --data` name and the folder of the Brown corpus.
    pub const BROWN: &'static str = "brown";

    /// Loads `train.txt` and `val.txt` from `dir` (the `sotu` folder), keeping at most
    /// `max_chars` characters of each (the first ones), and tokenizes them onto `device`.
    ///
    /// Errors: [`ModelsError::MissingData`] naming `cargo xtask setup --data sotu`; empty files.
    pub fn load_sotu(
        dir: &Path,
        tokenizer: TokenizerKind,
        max_chars: Option<usize>,
        device: Device,
    ) -> Result<Self> {
        let (train, val) = Self::read_sotu(dir, max_chars)?;
        Self::from_texts(&train, &val, tokenizer, device)
    }

    /// The training and validation texts of the SOTU folder `dir` (`train.txt`, `val.txt`),
    /// each cut to its first `max_chars` characters. Errors as [`TextCorpus::load_sotu`].
    pub fn read_sotu(dir: &Path, max_chars: Option<usize>) -> Result<(String, String)> {
        let read = |name: &str| read_text(Self::SOTU, &dir.join(name), max_chars);
        Ok((read("train.txt")?, read("val.txt")?))
    }

    /// The training and validation texts of the Brown corpus folder `dir` (`brown.txt`: one
    /// sentence a line, a blank line between its 500 files): file i (0-based, in the file's
    /// order) is validation text when i mod 10 = 9 (50 files, every genre), training text
    /// otherwise; each text is cut to its first `max_chars` characters.
    ///
    /// Errors: [`ModelsError::MissingData`] naming `cargo xtask setup --data brown`;
    /// [`ModelsError::BadData`] when either split is empty.
    pub fn read_brown(dir: &Path, max_chars: Option<usize>) -> Result<(String, String)> {
        let path = dir.join("brown.txt");
        let text = read_text(Self::BROWN, &path, None)?;
        let (mut train, mut val) = (String::new(), String::new());
        for (i, file) in text.split("\n\n").enumerate() {
            let out = if i % 10 == 9 { &mut val } else { &mut train };
            out.push_str(file.trim_end());
            out.push('\n');
        }
        let cut = |t: String| match max_chars {
            Some(m) => t.chars().take(m).collect(),
            None => t,
        };
        let (train, val) = (cut(train), cut(val));
        if train.chars().count() < 2 || val.chars().count() < 2 {
            return Err(ModelsError::bad_data(
                &path,
                "fewer than 10 files: the validation split (every 10th file) is empty",
            ));
        }
        Ok((train, val))
    }

    /// Loads one plain-text file (UTF-8) as nanoGPT does: the first 1 − `validation_fraction`
    /// of its characters are the training split, the rest the validation split; tokenized onto
    /// `device` (a character vocabulary is built from the whole file).
    ///
    /// Memory: before the file is read, its length times [`TEXT_BYTES_PER_FILE_BYTE`] must fit
    /// ([`ensure_fits`], culprit the path): the text is held once and its ids are written
    /// straight into the two Int64 tensors ([`Tokenizer::token_tensor`]), so the peak is about
    /// 9 bytes per character of a one-byte-per-character file.
    ///
    /// Errors: [`ModelsError::NotRegularFile`] for a path that is not a regular file (a FIFO, a
    /// directory, …: refused before it is opened); [`ModelsError::Io`] for a file that cannot
    /// be read; [`ModelsError::TooLarge`] for a file whose text and ids would not fit in memory;
    /// [`ModelsError::InvalidConfig`] for a fraction outside (0, 1); [`ModelsError::BadData`]
    /// for text that is not UTF-8 or when either split would hold fewer than 2 characters.
    ///
    /// ```
    /// use kappa_models::{Split, TextCorpus, TokenizerKind};
    /// let path = std::env::temp_dir().join(format!("kappa-corpus-{}.txt", std::process::id()));
    /// std::fs::write(&path, "abcdefghij")?;
    /// let corpus = TextCorpus::from_file(&path, TokenizerKind::Char, 0.2, tch::Device::Cpu)?;
    /// assert_eq!(corpus.tokens(Split::Train).size(), vec![8]);
    /// assert_eq!(corpus.tokens(Split::Validation).size(), vec![2]);
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_file(
        path: &Path,
        tokenizer: TokenizerKind,
        validation_fraction: f64,
        device: Device,
    ) -> Result<Self> {
        if !(validation_fraction > 0.0 && validation_fraction < 1.0) {
            return Err(ModelsError::config(
                "data.validation_fraction",
                format!("must lie in (0, 1), found {validation_fraction}"),
            ));
        }
        let culprit = path.display().to_string();
        let len = files::regular_len(path)?;
        ensure_fits(
            u128::from(len).checked_mul(TEXT_BYTES_PER_FILE_BYTE),
            "the text and its token ids",
            &culprit,
        )?;
        let text = files::read_regular_text(path)?;
        let chars = text.chars().count();
        let cut = ((1.0 - validation_fraction) * chars as f64).round() as usize;
        if cut < 2 || chars - cut < 2 {
            return Err(ModelsError::BadData {
                path: path.to_path_buf(),
                reason: format!(
                    "{chars} characters leave fewer than 2 in a split at validation fraction \
                     {validation_fraction}"
                ),
            });
        }
        let at = text.char_indices().nth(cut).map_or(text.len(), |(i, _)| i);
        let (train, val) = text.split_at(at);
        Self::tokenize(train, val, tokenizer, &culprit, device)
    }

    /// Tokenizes a training and a validation text onto `device` (a character vocabulary is
    /// built from both).
    pub fn from_texts(
        train: &str,
        val: &str,
        tokenizer: TokenizerKind,
        device: Device,
    ) -> Result<Self> {
        Self::tokenize(
            train,
            val,
            tokenizer,
            "the training and validation texts",
            device,
        )
    }

    /// [`TextCorpus::from_texts`], naming `culprit` (the texts' file) when the ids would not fit.
    fn tokenize(
        train: &str,
        val: &str,
        tokenizer: TokenizerKind,
        culprit: &str,
        device: Device,
    ) -> Result<Self> {
        let tok = match tokenizer {
            TokenizerKind::Char => Tokenizer::chars_of(&[train, val]),
            TokenizerKind::Gpt2Bpe => Tokenizer::gpt2()?,
            TokenizerKind::Bytes => Tokenizer::Bytes,
        };
        let ids =
            |t: &str| -> Result<Tensor> { Ok(tok.token_tensor(t, culprit)?.f_to_device(device)?) };
        Ok(Self {
            train: ids(train)?,
            validation: ids(val)?,
            tokenizer: tok,
        })
    }

    /// The tokens of a split.
    pub fn tokens(&self, split: Split) -> &Tensor {
        match split {
            Split::Train => &self.train,
            Split::Validation | Split::Test => &self.validation,
        }
    }

    /// A batch (x, y) of `batch_size` windows of `block` tokens, y = x shifted by one; the
    /// window starts are uniform on 0..=len−block−1, drawn from ChaCha8 seeded by (seed, step).
    pub fn batch(
        &self,
        split: Split,
        seed: u64,
        step: u64,
        batch_size: usize,
        block: usize,
    ) -> Result<(Tensor, Tensor)> {
        let data = self.tokens(split);
        let len = data.size()[0] as usize;
        if block == 0 || len < block + 1 {
            return Err(ModelsError::config(
                "model.block_size",
                format!(
                    "the {split:?} split has {len} tokens, fewer than block_size + 1 = {}",
                    block + 1
                ),
            ));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(step);
        let b = block as i64;
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for _ in 0..batch_size {
            let start = rng.gen_range(0..=(len - block - 1)) as i64;
            xs.push(data.narrow(0, start, b));
            ys.push(data.narrow(0, start + 1, b));
        }
        Ok((Tensor::stack(&xs, 0), Tensor::stack(&ys, 0)))
    }
}

/// Bytes [`TextCorpus::from_file`] needs per byte of its file at the peak, checked before the
/// file is read: 1 for the text itself, and 8 for its token ids as Int64, since every token
/// (a character, a byte or a GPT-2 BPE token) spans at least one byte of the file. While
/// tiktoken encodes, its u32 ids (4 bytes a token, up to twice that while the vector grows)
/// stay within the same 8; their Int64 tensor is checked again once their number is known.
pub const TEXT_BYTES_PER_FILE_BYTE: u128 = 9;

/// The text of `path` (a file of set `set`), cut to its first `max_chars` characters.
/// Errors: [`ModelsError::MissingData`] naming the set when nothing is at `path`; those of
/// [`files::read_regular_text`]; a text of fewer than 2 characters.
fn read_text(set: &str, path: &Path, max_chars: Option<usize>) -> Result<String> {
    if !files::is_present(path) {
        return Err(ModelsError::missing_set(set, path));
    }
    let text = files::read_regular_text(path)?;
    let text = match max_chars {
        Some(m) => text.chars().take(m).collect(),
        None => text,
    };
    if text.chars().count() < 2 {
        return Err(ModelsError::bad_data(path, "the text is empty"));
    }
    Ok(text)
}

/// Tiny fixture data sets in the real on-disk formats, for tests that must not depend on the
/// installed data.
pub mod fixtures {
    use super::*;

    /// Writes the four Fashion-MNIST IDX files into `dir` (created): `train` training and
    /// `test` test images whose class c is a bright horizontal band at rows 2c..2c+6 plus
    /// seeded noise, so a small model can learn them.
    pub fn write_fashion_mnist(dir: &Path, train: usize, test: usize, seed: u64) -> Result<()> {
        fs::create_dir_all(dir).map_err(|e| ModelsError::io(dir, e))?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut make = |n: usize, images: &str, labels: &str| -> Result<()> {
            let mut pix = Vec::with_capacity(n * 784);
            let mut lab = Vec::with_capacity(n);
            for i in 0..n {
                let c = (i % 10) as u8;
                lab.push(c);
                for r in 0..28usize {
                    for _ in 0..28 {
                        let band = r >= 2 * c as usize && r < 2 * c as usize + 6;
                        let base: u8 = if band { 180 } else { 20 };
                        pix.push(base.saturating_add(rng.gen_range(0..60)));
                    }
                }
            }
            write_idx(&dir.join(images), &[n, 28, 28], &pix)?;
            write_idx(&dir.join(labels), &[n], &lab)
        };
        make(train, "train-images-idx3-ubyte", "train-labels-idx1-ubyte")?;
        make(test, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
    }

    /// Writes an 8-bit PNG image of `width`×`height` pixels to `path`: `data` holds the samples
    /// row by row, `channels` per pixel (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA).
    pub fn write_png(
        path: &Path,
        width: usize,
        height: usize,
        channels: usize,
        data: &[u8],
    ) -> Result<()> {
        let color = match channels {
            1 => png::ColorType::Grayscale,
            2 => png::ColorType::GrayscaleAlpha,
            3 => png::ColorType::Rgb,
            4 => png::ColorType::Rgba,
            _ => {
                return Err(ModelsError::Shape {
                    arg: "channels",
                    reason: format!("must be 1, 2, 3 or 4, found {channels}"),
                })
            }
        };
        if data.len() != width * height * channels {
            return Err(ModelsError::Shape {
                arg: "data",
                reason: format!("{} bytes for {width}×{height}×{channels}", data.len()),
            });
        }
        let encode_error = |e: png::EncodingError| ModelsError::bad_data(path, e.to_string());
        let file = fs::File::create(path).map_err(|e| ModelsError::io(path, e))?;
        let mut encoder =
            png::Encoder::new(std::io::BufWriter::new(file), width as u32, height as u32);
        encoder.set_color(color);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(encode_error)?;
        writer.write_image_data(data).map_err(encode_error)?;
        writer.finish().map_err(encode_error)
    }

    /// Writes an image folder into `dir` (created): `train_per_class` and `test_per_class`
    /// RGB images of `side`×`side` pixels for each class in `classes`, in
    /// `dir/{train,test}/<class>/NNN.png`. Class c (its index in `classes`) is bright in
    /// channel c mod 3 and in a horizontal band at rows c·side/k.., plus seeded noise, so a
    /// small model can learn it.
    pub fn write_image_folder(
        dir: &Path,
        classes: &[&str],
        (train_per_class, test_per_class): (usize, usize),
        side: usize,
        seed: u64,
    ) -> Result<()> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let k = classes.len().max(1);
        for (split, count) in [("train", train_per_class), ("test", test_per_class)] {
            for (c, class) in classes.iter().enumerate() {
                let folder = dir.join(split).join(class);
                fs::create_dir_all(&folder).map_err(|e| ModelsError::io(&folder, e))?;
                let band = (c * side / k)..((c + 1) * side / k).max(c * side / k + 1);
                for i in 0..count {
                    let mut data = Vec::with_capacity(side * side * 3);
                    for r in 0..side {
                        for _ in 0..side {
                            for ch in 0..3 {
                                let mut v: u8 = 30 + rng.gen_range(0..50);
                                if ch == c % 3 {
                                    v += 100;
                                }
                                if band.contains(&r) {
                                    v += 60;
                                }
                                data.push(v);
                            }
                        }
                    }
                    write_png(&folder.join(format!("{i:03}.png")), side, side, 3, &data)?;
                }
            }
        }
        Ok(())
    }

    /// Writes `brown.txt` into `dir` (created) in the installed layout: `files` files of a few
    /// sentences each, one sentence a line, a blank line between files.
    pub fn write_brown(dir: &Path, files: usize) -> Result<()> {
        const WORDS: [&str; 12] = [
            "the",
            "jury",
            "said",
            "an",
            "investigation",
            "of",
            "recent",
            "election",
            "produced",
            "no",
            "evidence",
            "city",
        ];
        fs::create_dir_all(dir).map_err(|e| ModelsError::io(dir, e))?;
        let mut rng = ChaCha8Rng::seed_from_u64(files as u64);
        let mut text = String::new();
        for f in 0..files {
            if f > 0 {
                text.push('\n');
            }
            for _ in 0..3 {
                let n = rng.gen_range(5..12);
                let words: Vec<&str> = (0..n)
                    .map(|_| WORDS[rng.gen_range(0..WORDS.len())])
                    .collect();
                text.push_str(&format!("{} .\n", words.join(" ")));
            }
        }
        let path = dir.join("brown.txt");
        fs::write(&path, text).map_err(|e| ModelsError::io(&path, e))
    }

    /// Writes `train.txt` and `val.txt` (a few KB of English-like text) into `dir` (created).
    pub fn write_sotu(dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).map_err(|e| ModelsError::io(dir, e))?;
        let sentence = "The state of the union is strong, and the people of these United \
                        States have made it so by their labor and their faith. ";
        let other = "We shall meet the challenges of a new century together, and we will not \
                     fail the generations that follow. ";
        let train: String = (0..40)
            .map(|i| if i % 3 == 0 { other } else { sentence })
            .collect();
        let val: String = (0..8)
            .map(|i| if i % 2 == 0 { sentence } else { other })
            .collect();
        for (name, text) in [("train.txt", train), ("val.txt", val)] {
            let path = dir.join(name);
            fs::write(&path, text.trim_end()).map_err(|e| ModelsError::io(&path, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use tch::Kind;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kappa-models-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn idx_round_trips_and_bad_files_are_errors() {
        let dir = temp("idx");
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a");
        write_idx(&p, &[2, 3], &[1, 2, 3, 4, 5, 6]).unwrap();
        let idx = read_idx(&p).unwrap();
        assert_eq!(idx.dims, vec![2, 3]);
        assert_eq!(idx.data, vec![1, 2, 3, 4, 5, 6]);
        fs::write(&p, [0u8, 0, 8, 1, 0, 0, 0, 5, 1]).unwrap();
        assert!(matches!(read_idx(&p), Err(ModelsError::BadData { .. })));
        fs::write(&p, [1u8, 2, 3, 4]).unwrap();
        assert!(matches!(read_idx(&p), Err(ModelsError::BadData { .. })));
        assert!(write_idx(&p, &[2, 2], &[0; 3]).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fashion_mnist_loads_splits_and_batches_deterministically() {
        let dir = temp("fmnist");
        let missing = FashionMnist::load(&dir, 5, None, Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("cargo xtask setup --data fashion-mnist"),
            "{missing}"
        );
        fixtures::write_fashion_mnist(&dir, 40, 12, 0).unwrap();
        let data = FashionMnist::load(&dir, 10, None, Device::Cpu).unwrap();
        assert_eq!(
            (data.train.len(), data.validation.len(), data.test.len()),
            (30, 10, 12)
        );
        assert_eq!(data.train.images.size(), vec![30, 1, 28, 28]);
        assert_eq!(data.validation.labels.int64_value(&[0]), 0); // image 30 has class 0
        let limited = FashionMnist::load(&dir, 10, Some(8), Device::Cpu).unwrap();
        assert_eq!(limited.train.len(), 8);
        assert!(FashionMnist::load(&dir, 40, None, Device::Cpu).is_err());
        // Same (seed, step) → same batch; an epoch (3 batches of 10) visits every image once.
        let (_, y1) = data.train.batch(7, 4, 10).unwrap();
        let (_, y2) = data.train.batch(7, 4, 10).unwrap();
        assert!(y1.equal(&y2));
        let mut seen: Vec<i64> = Vec::new();
        for step in 3..6 {
            let (x, _) = data.train.batch(7, step, 10).unwrap();
            // Identify images by their pixel sum.
            let sums = x.sum_dim_intlist([1i64, 2, 3].as_slice(), false, Kind::Double);
            seen.extend(
                Vec::<f64>::try_from(&sums)
                    .unwrap()
                    .iter()
                    .map(|s| (s * 1e3) as i64),
            );
        }
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 30);
        let (_, other) = data.train.batch(8, 4, 10).unwrap();
        assert!(!other.equal(&y1) || !data.train.batch(8, 5, 10).unwrap().1.equal(&y1));
        assert!(data.train.batch(0, 0, 31).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn text_corpus_char_and_bpe() {
        let dir = temp("sotu");
        let missing = TextCorpus::load_sotu(&dir, TokenizerKind::Char, None, Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("cargo xtask setup --data sotu"),
            "{missing}"
        );
        fixtures::write_sotu(&dir).unwrap();
        let c = TextCorpus::load_sotu(&dir, TokenizerKind::Char, None, Device::Cpu).unwrap();
        let v = c.tokenizer.vocab_size();
        assert!(v > 20 && v < 40, "{v}");
        let ids = c.tokenizer.encode("the union").unwrap();
        assert_eq!(c.tokenizer.decode(&ids).unwrap(), "the union");
        assert!(c.tokenizer.encode("~").is_err());
        let (x, y) = c.batch(Split::Train, 1, 3, 4, 8).unwrap();
        assert_eq!(x.size(), vec![4, 8]);
        assert!(x.narrow(1, 1, 7).equal(&y.narrow(1, 0, 7)));
        assert!(x.equal(&c.batch(Split::Train, 1, 3, 4, 8).unwrap().0));
        assert!(!x.equal(&c.batch(Split::Train, 1, 4, 4, 8).unwrap().0));
        assert!(c.batch(Split::Validation, 1, 0, 2, 100_000).is_err());
        let limited =
            TextCorpus::load_sotu(&dir, TokenizerKind::Char, Some(50), Device::Cpu).unwrap();
        assert_eq!(limited.train.size(), vec![50]);

        let b = TextCorpus::load_sotu(&dir, TokenizerKind::Gpt2Bpe, None, Device::Cpu).unwrap();
        assert_eq!(b.tokenizer.vocab_size(), 50257);
        let ids = b.tokenizer.encode("The state of the union").unwrap();
        assert_eq!(ids[0], 464); // "The" in GPT-2's vocabulary
        assert_eq!(b.tokenizer.decode(&ids).unwrap(), "The state of the union");
        assert!(b.train.size()[0] < c.train.size()[0] / 2);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn byte_tokens_and_the_brown_split() {
        let dir = temp("brown");
        let missing = TextCorpus::read_brown(&dir, None).unwrap_err().to_string();
        assert!(
            missing.contains("cargo xtask setup --data brown"),
            "{missing}"
        );
        fixtures::write_brown(&dir, 20).unwrap();
        let (train, val) = TextCorpus::read_brown(&dir, None).unwrap();
        // 20 files of 3 sentences: files 9 and 19 are validation text.
        assert_eq!((train.lines().count(), val.lines().count()), (54, 6));
        let c = TextCorpus::from_texts(&train, "héllo", TokenizerKind::Bytes, Device::Cpu).unwrap();
        assert_eq!(c.tokenizer.vocab_size(), 256);
        assert_eq!(c.validation.size(), vec![6]); // é is two bytes
        let ids = c.tokenizer.encode("héllo").unwrap();
        assert_eq!(c.tokenizer.decode(&ids).unwrap(), "héllo");
        assert!(c.tokenizer.decode(&[256]).is_err());
        assert!(c.tokenizer.decode(&[0xc3]).is_err()); // half a character
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn token_ids_of_a_fixed_text_are_those_of_both_tokenizers_unchanged() {
        let train = "The state of the union is strong.\n\n  Ünïcödé  text, 1234!";
        let val = "héllo wörld";
        let ids = |t: &Tensor| Vec::<i64>::try_from(t).unwrap();
        let c = TextCorpus::from_texts(train, val, TokenizerKind::Char, Device::Cpu).unwrap();
        assert_eq!(
            ids(&c.train),
            [
                9, 16, 13, 1, 22, 23, 10, 23, 13, 1, 20, 14, 1, 23, 16, 13, 1, 24, 19, 17, 20, 19,
                1, 17, 22, 1, 22, 23, 21, 20, 19, 15, 4, 0, 0, 1, 1, 27, 19, 29, 11, 30, 12, 28, 1,
                1, 23, 13, 26, 23, 3, 1, 5, 6, 7, 8, 2
            ]
        );
        assert_eq!(
            ids(&c.validation),
            [16, 28, 18, 18, 20, 1, 25, 30, 21, 18, 12]
        );
        assert_eq!(c.tokenizer.encode(val).unwrap(), ids(&c.validation));
        let b = TextCorpus::from_texts(train, val, TokenizerKind::Gpt2Bpe, Device::Cpu).unwrap();
        assert_eq!(
            ids(&b.train),
            [
                464, 1181, 286, 262, 6441, 318, 1913, 13, 628, 220, 49363, 77, 26884, 66, 9101, 67,
                2634, 220, 2420, 11, 1105, 2682, 0
            ]
        );
        assert_eq!(ids(&b.validation), [71, 2634, 18798, 266, 30570, 335]);
        assert_eq!(b.train.kind(), Kind::Int64);
        // More than one chunk of ids, and a file split at a character boundary.
        let dir = temp("fixed-ids");
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("long.txt");
        let long: String = (0..(1 << 20) + 3)
            .map(|i| ['é', 'a', 'b'][usize::from(i % 7 != 0) + usize::from(i % 2 == 1)])
            .collect();
        fs::write(&path, &long).unwrap();
        let f = TextCorpus::from_file(&path, TokenizerKind::Char, 0.25, Device::Cpu).unwrap();
        let all: Vec<i64> = [&f.train, &f.validation]
            .iter()
            .flat_map(|t| Vec::<i64>::try_from(*t).unwrap())
            .collect();
        assert_eq!(all, f.tokenizer.encode(&long).unwrap());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_longest_bpe_piece_bounds_every_run_of_one_kind() {
        assert_eq!(longest_bpe_piece("ab  cde"), 4);
        assert_eq!(longest_bpe_piece("a\n\n\n\n b"), 6);
        assert_eq!(longest_bpe_piece(""), 1);
        assert_eq!(longest_bpe_piece("ééé"), 7);
    }

    /// The error of `TextCorpus::from_file(path)`, run on a thread; `None` when it has not
    /// returned in 20 s.
    fn text_error_within_20_s(path: &Path) -> Option<String> {
        let (send, receive) = std::sync::mpsc::channel();
        let path = path.to_path_buf();
        std::thread::spawn(move || {
            let result = TextCorpus::from_file(&path, TokenizerKind::Char, 0.1, Device::Cpu);
            let _ = send.send(result.map(|_| ()));
        });
        let result = receive
            .recv_timeout(std::time::Duration::from_secs(20))
            .ok()?;
        Some(result.unwrap_err().to_string())
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_as_a_text_path_is_an_error_naming_it_not_a_hang() {
        let dir = temp("fifo");
        fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("corpus.txt");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let err = text_error_within_20_s(&fifo);
        fs::remove_dir_all(&dir).unwrap();
        let err = err.expect("loading a FIFO did not return within 20 s");
        assert!(
            err.contains("corpus.txt")
                && err.contains("FIFO")
                && err.contains("not a regular file"),
            "{err}"
        );
    }

    #[test]
    fn a_directory_or_a_non_utf8_file_as_a_text_path_is_an_error_naming_it() {
        let dir = temp("text-dir");
        let folder = dir.join("corpus");
        fs::create_dir_all(&folder).unwrap();
        let err = text_error_within_20_s(&folder).unwrap();
        assert!(
            err.contains("corpus") && err.contains("a directory"),
            "{err}"
        );
        let file = dir.join("latin1.txt");
        fs::write(&file, b"caf\xe9 au lait").unwrap();
        let err = text_error_within_20_s(&file).unwrap();
        assert!(err.contains("latin1.txt") && err.contains("UTF-8"), "{err}");
        let missing = dir.join("missing.txt");
        let err = text_error_within_20_s(&missing).unwrap();
        assert!(err.contains("missing.txt"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
