//! Text: byte-level sentiment classification of the movie-review sentences that `cargo xtask
//! setup --data movie-reviews` installs (`<data>/movie-reviews/sentences.tsv`, lines
//! `label<TAB>score<TAB>sentence` after a header, label 1 positive and 0 negative; 10 568
//! sentences, 5242 positive), an SST-2-like binary sentence task read byte by byte as LRA's
//! Text task reads its reviews.
//!
//! # Tokens
//!
//! The UTF-8 bytes of a sentence are its tokens (ids 0–255), truncated to the first `seq_len`
//! bytes and padded with id 256 ([`PAD`]); a vocabulary of 257.
//!
//! # Splits
//!
//! The N sentences, in file order, are reordered by the crate's Fisher–Yates
//! [`permutation`]`(N, TEXT_SPLIT_SEED, 0)` ([`TEXT_SPLIT_SEED`]): the first `test` are the
//! test split, the next `validation` the validation split, the rest the training split. The split is the same for every run (the default sizes give 8568/1000/1000).

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::Device;

use super::{positive, SequenceSet, SequenceSplits};
use crate::data::permutation;
use crate::error::{ModelsError, Result};
use crate::files;
use crate::memory::ensure_fits;

/// The padding id (one past the bytes).
pub const PAD: i64 = 256;

/// The seed of the permutation that cuts the splits (the same for every run).
pub const TEXT_SPLIT_SEED: u64 = 0x5e47_1a2b;

/// Sequence length and held-out split sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    /// T: bytes kept per sentence (the rest is cut), shorter sentences padded.
    pub seq_len: usize,
    /// Validation sentences.
    pub validation: usize,
    /// Test sentences.
    pub test: usize,
}

impl Default for TextConfig {
    /// 256 bytes (longer than all but a few sentences), 1000 validation and 1000 test sentences.
    fn default() -> Self {
        Self {
            seq_len: 256,
            validation: 1000,
            test: 1000,
        }
    }
}

/// The movie-review sentences.
#[derive(Clone, Copy, Debug)]
pub struct MovieReviews;

impl MovieReviews {
    /// The `cargo xtask setup --data` name and the folder under the data root.
    pub const SET: &'static str = "movie-reviews";
    /// The file in that folder.
    pub const FILE: &'static str = "sentences.tsv";

    /// Loads `dir/sentences.tsv` (`dir` is the `movie-reviews` folder) as [`SequenceSplits`]
    /// onto `device`.
    ///
    /// Errors: [`ModelsError::MissingData`] naming the file and `cargo xtask setup --data
    /// movie-reviews`; those of [`files::read_regular_text`] (a path that is not a regular file,
    /// text that is not UTF-8); [`ModelsError::BadData`] naming the line of a malformed one (not three
    /// tab-separated fields, a label other than 0 or 1); [`ModelsError::InvalidConfig`] for
    /// `seq_len`, `validation` or `test` of 0 or held-out splits that leave no training sentence.
    pub fn load(dir: &Path, config: &TextConfig, device: Device) -> Result<SequenceSplits> {
        positive("data.text.seq_len", config.seq_len)?;
        positive("data.text.validation", config.validation)?;
        positive("data.text.test", config.test)?;
        let path = dir.join(Self::FILE);
        if !files::is_present(&path) {
            return Err(ModelsError::missing_set(Self::SET, path));
        }
        let text = files::read_regular_text(&path)?;
        let sentences = parse(&text, &path)?;
        let n = sentences.len();
        let held_out = config.validation + config.test;
        if held_out >= n {
            return Err(ModelsError::config(
                "data.text.validation",
                format!(
                    "validation + test = {held_out} leave no training sentence of the {n} in {}",
                    path.display()
                ),
            ));
        }
        let t = config.seq_len;
        // Each split's rows are built as i64 ids, then copied into its tensor: 16 bytes a
        // token of every sentence at the peak.
        ensure_fits(
            (n as u128).checked_mul(t as u128 * 16),
            "the sentences' token rows",
            &format!("data.text.seq_len ({})", path.display()),
        )?;
        let order = permutation(n, TEXT_SPLIT_SEED, 0);
        let set = |range: std::ops::Range<usize>| {
            let mut tokens = vec![PAD; range.len() * t];
            let mut labels = Vec::with_capacity(range.len());
            for (row, &i) in order[range].iter().enumerate() {
                let (label, sentence) = &sentences[i];
                for (slot, &b) in tokens[row * t..(row + 1) * t]
                    .iter_mut()
                    .zip(sentence.as_bytes())
                {
                    *slot = i64::from(b);
                }
                labels.push(*label);
            }
            SequenceSet::from_rows(&tokens, &labels, t, device)
        };
        let (a, b) = (config.test, held_out);
        Ok(SequenceSplits {
            test: set(0..a),
            validation: set(a..b),
            train: set(b..n),
            vocab_size: 257,
            num_classes: 2,
            pad_id: Some(PAD),
            seq_len: t,
        })
    }
}

/// (label, sentence) of every line after the header; blank lines are skipped.
fn parse<'t>(text: &'t str, path: &Path) -> Result<Vec<(i64, &'t str)>> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() || (number == 0 && line.starts_with("label\t")) {
            continue;
        }
        let bad = |reason: &str| {
            ModelsError::bad_data(path, format!("line {}: {reason}: {line:?}", number + 1))
        };
        let mut fields = line.splitn(3, '\t');
        let (Some(label), Some(_score), Some(sentence)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err(bad("expected label<TAB>score<TAB>sentence"));
        };
        let label = match label {
            "0" => 0,
            "1" => 1,
            _ => return Err(bad("the label is not 0 or 1")),
        };
        out.push((label, sentence));
    }
    Ok(out)
}

/// Writes `dir/sentences.tsv` (creating `dir`) with `count` sentences in the installed format:
/// sentence i has label i mod 2 and is built from seeded positive or negative words, so a small
/// model can learn them.
pub fn write_movie_reviews(dir: &Path, count: usize, seed: u64) -> Result<()> {
    const GOOD: [&str; 5] = ["wonderful", "moving", "brilliant", "funny", "charming"];
    const BAD: [&str; 5] = ["dull", "tedious", "awful", "clumsy", "lifeless"];
    const FILLER: [&str; 6] = ["the", "film", "is", "a", "story", "and"];
    fs::create_dir_all(dir).map_err(|e| ModelsError::io(dir, e))?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = String::from("label\tscore\tsentence\n");
    for i in 0..count {
        let label = i % 2;
        let words = if label == 1 { &GOOD } else { &BAD };
        let mut sentence = Vec::new();
        for _ in 0..rng.gen_range(4..12) {
            sentence.push(if rng.gen_bool(0.4) {
                words[rng.gen_range(0..words.len())]
            } else {
                FILLER[rng.gen_range(0..FILLER.len())]
            });
        }
        sentence.push(words[rng.gen_range(0..words.len())]);
        let score = if label == 1 { 1.5 } else { -1.5 };
        let _ = writeln!(out, "{label}\t{score}\t{}", sentence.join(" "));
    }
    let path = dir.join(MovieReviews::FILE);
    fs::write(&path, out).map_err(|e| ModelsError::io(&path, e))
}
