//! ListOps (Nangia & Bowman 2018, as Long Range Arena generates it): nested prefix expressions
//! such as `[MAX 4 3 [MIN 2 3 ] 1 0 ]` whose value, a digit, is the label (10 classes).
//!
//! # Rules (those of LRA's `lra_benchmarks/data/listops.py`)
//!
//! - Operators: `[MIN`, `[MAX`, `[MED` and `[SM`, each closed by `]`:
//!   MIN and MAX of the arguments; MED = ⌊median⌋, the middle value for an odd count and
//!   ⌊(a + b)/2⌋ of the two middle values a ≤ b for an even count (LRA computes
//!   `int(np.median(args))`, numpy's mean of the two middle values truncated, and every value is
//!   non-negative); SM = (Σ args) mod 10.
//! - A tree grows from the root at depth 1. A node at depth d < `max_depth` is an operator with
//!   probability [`OPERATOR_PROBABILITY`] = 0.25 (LRA draws r ~ U[0, 1) and makes a leaf when
//!   r > 0.25) and a digit 0–9 otherwise; a node at depth `max_depth` is always a digit. An
//!   operator has 2..=`max_args` arguments (uniform), is uniform over the four operators, and
//!   its arguments are nodes at depth d + 1.
//! - The token length counts one token per operator, digit and `]` (LRA's parentheses are not
//!   tokens). Expressions are kept when `min_length` < length < `max_length` (strictly, as in
//!   LRA: 500 and 2000) and deduplicated; the first `train` distinct ones are the training
//!   split, the next `validation` the validation split, the next `test` the test split.
//!
//! # Tokens
//!
//! [`SYMBOLS`]: id 0 pads, digit d is id d + 1, then `[MIN` 11, `[MAX` 12, `[MED` 13, `[SM` 14,
//! `]` 15; 16 ids in all. Rows hold T = `max_length` tokens, the expression then padding.

use std::collections::HashSet;
use std::fmt;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::Device;

use super::{positive, SequenceSet, SequenceSplits};
use crate::error::{ModelsError, Result};

/// The probability that a node above the maximum depth is an operator (LRA's `VALUE_P`).
pub const OPERATOR_PROBABILITY: f64 = 0.25;

/// The padding id.
pub const PAD: i64 = 0;

/// The text of every token id; `SYMBOLS[id]`.
pub const SYMBOLS: [&str; 16] = [
    "<pad>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "[MIN", "[MAX", "[MED", "[SM", "]",
];

/// The id of `]`.
pub const CLOSE: i64 = 15;

/// The largest `max_depth` a configuration may ask for (the generator recurses once per level).
pub const MAX_DEPTH_LIMIT: usize = 64;

/// A ListOps operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// The smallest argument.
    Min,
    /// The largest argument.
    Max,
    /// ⌊median⌋ of the arguments.
    Med,
    /// The sum of the arguments modulo 10.
    SumMod,
}

impl Op {
    /// The four operators, in token order.
    pub const ALL: [Op; 4] = [Op::Min, Op::Max, Op::Med, Op::SumMod];

    /// The token id (11–14).
    pub fn id(self) -> i64 {
        11 + self as i64
    }

    /// The operator of a token id, if it is one.
    pub fn from_id(id: i64) -> Option<Op> {
        usize::try_from(id - 11)
            .ok()
            .and_then(|i| Op::ALL.get(i).copied())
    }

    /// The value of the operator on `args` (digits, at least one): see the
    /// [module docs](self#rules).
    pub fn apply(self, args: &[u8]) -> u8 {
        match self {
            Op::Min => args.iter().copied().min().unwrap_or(0),
            Op::Max => args.iter().copied().max().unwrap_or(0),
            Op::SumMod => (args.iter().map(|&a| u32::from(a)).sum::<u32>() % 10) as u8,
            Op::Med => {
                let mut sorted = args.to_vec();
                sorted.sort_unstable();
                let n = sorted.len();
                match n {
                    0 => 0,
                    _ if n % 2 == 1 => sorted[n / 2],
                    // ⌊(a + b)/2⌋ = int(np.median) for non-negative values.
                    _ => ((u16::from(sorted[n / 2 - 1]) + u16::from(sorted[n / 2])) / 2) as u8,
                }
            }
        }
    }
}

/// What [`evaluate`] finds in a token sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Evaluation {
    /// The expression's value, the label.
    pub value: u8,
    /// The depth of its tree: 1 for a digit, 1 + the deepest argument for an operator.
    pub depth: usize,
    /// Its token length (padding excluded).
    pub len: usize,
}

/// Token ids of a whitespace-separated expression, e.g. `"[SM 5 [MIN 2 3 ] ]"`.
///
/// Errors: [`ModelsError::Tokenizer`] for a word that is not a ListOps symbol.
pub fn encode(text: &str) -> Result<Vec<i64>> {
    text.split_whitespace()
        .map(|w| {
            SYMBOLS[1..]
                .iter()
                .position(|&s| s == w)
                .map(|i| i as i64 + 1)
                .ok_or_else(|| ModelsError::Tokenizer(format!("`{w}` is not a ListOps symbol")))
        })
        .collect()
}

/// The text of token ids, padding dropped.
///
/// Errors: [`ModelsError::Tokenizer`] for an id outside 0..16.
pub fn decode(ids: &[i64]) -> Result<String> {
    let words = ids
        .iter()
        .filter(|&&i| i != PAD)
        .map(|&i| {
            usize::try_from(i)
                .ok()
                .and_then(|u| SYMBOLS.get(u).copied())
                .ok_or_else(|| {
                    ModelsError::Tokenizer(format!("ListOps token id {i} is out of range"))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(words.join(" "))
}

/// Parses and evaluates one expression (token ids, optionally followed by padding only) with an
/// explicit stack, so a deeply nested input cannot overflow the call stack.
///
/// Errors: [`ModelsError::Tokenizer`] for an empty or malformed expression: an operator without
/// arguments, an unmatched `]`, an unclosed operator, tokens after the expression, an unknown id.
///
/// ```
/// use kappa_models::data::sequences::listops::{encode, evaluate};
/// let e = evaluate(&encode("[SM 9 [MED 1 4 ] 0 ]")?)?; // MED 1 4 = ⌊2.5⌋ = 2, (9 + 2) mod 10
/// assert_eq!((e.value, e.depth, e.len), (1, 3, 8));
/// # Ok::<(), kappa_models::ModelsError>(())
/// ```
pub fn evaluate(ids: &[i64]) -> Result<Evaluation> {
    let bad = |reason: String| ModelsError::Tokenizer(format!("ListOps: {reason}"));
    let len = ids.iter().rposition(|&i| i != PAD).map_or(0, |p| p + 1);
    // Open operators: (operator, argument values, deepest argument).
    let mut open: Vec<(Op, Vec<u8>, usize)> = Vec::new();
    let mut done: Option<(u8, usize)> = None;
    for (at, &id) in ids[..len].iter().enumerate() {
        if done.is_some() {
            return Err(bad(format!("token {at} follows a complete expression")));
        }
        let finished = match id {
            1..=10 => Some(((id - 1) as u8, 1)),
            CLOSE => match open.pop() {
                Some((_, args, _)) if args.is_empty() => {
                    return Err(bad(format!(
                        "the operator closed at token {at} has no arguments"
                    )))
                }
                Some((op, args, deepest)) => Some((op.apply(&args), deepest + 1)),
                None => return Err(bad(format!("unmatched `]` at token {at}"))),
            },
            _ => match Op::from_id(id) {
                Some(op) => {
                    open.push((op, Vec::new(), 0));
                    None
                }
                None => return Err(bad(format!("token {at} has id {id}, not a symbol"))),
            },
        };
        if let Some((value, depth)) = finished {
            match open.last_mut() {
                Some((_, args, deepest)) => {
                    args.push(value);
                    *deepest = (*deepest).max(depth);
                }
                None => done = Some((value, depth)),
            }
        }
    }
    match (done, open.len()) {
        (Some((value, depth)), _) => Ok(Evaluation { value, depth, len }),
        (None, 0) => Err(bad("the sequence is empty".into())),
        (None, n) => Err(bad(format!("{n} operator(s) are not closed"))),
    }
}

/// How many expressions of which lengths and depths make the splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListOpsConfig {
    /// Training expressions.
    pub train: usize,
    /// Validation expressions.
    pub validation: usize,
    /// Test expressions.
    pub test: usize,
    /// Kept expressions are longer than this (tokens).
    pub min_length: usize,
    /// Kept expressions are shorter than this; rows are padded to it (T = `max_length`).
    pub max_length: usize,
    /// The depth at which every node is a digit (root at depth 1).
    pub max_depth: usize,
    /// The most arguments of an operator (at least 2).
    pub max_args: usize,
}

impl Default for ListOpsConfig {
    /// The CPU size: 2000/200/200 expressions of 100 < length < 500 tokens.
    fn default() -> Self {
        Self {
            train: 2000,
            validation: 200,
            test: 200,
            min_length: 100,
            max_length: 500,
            max_depth: 10,
            max_args: 10,
        }
    }
}

impl ListOpsConfig {
    /// LRA's size: 96 000/2000/2000 expressions of 500 < length < 2000 tokens (the token
    /// tensors take 100 000 × 2000 × 8 bytes = 1.6 GB).
    pub fn lra() -> Self {
        Self {
            train: 96_000,
            validation: 2000,
            test: 2000,
            min_length: 500,
            max_length: 2000,
            ..Self::default()
        }
    }

    /// Errors name the field: split sizes of 0, no length strictly between the bounds at or
    /// above 4 (the shortest expression), `max_depth` outside 2..=[`MAX_DEPTH_LIMIT`],
    /// `max_args` < 2.
    pub fn validate(&self) -> Result<()> {
        positive("data.listops.train", self.train)?;
        positive("data.listops.validation", self.validation)?;
        positive("data.listops.test", self.test)?;
        if self.max_length <= self.min_length.max(3) + 1 {
            return Err(ModelsError::config(
                "data.listops.max_length",
                format!(
                    "must exceed max(min_length, 3) + 1 = {} so that some length lies strictly \
                     between the bounds, found {}",
                    self.min_length.max(3) + 1,
                    self.max_length
                ),
            ));
        }
        if !(2..=MAX_DEPTH_LIMIT).contains(&self.max_depth) {
            return Err(ModelsError::config(
                "data.listops.max_depth",
                format!(
                    "must lie in 2..={MAX_DEPTH_LIMIT}, found {}",
                    self.max_depth
                ),
            ));
        }
        if self.max_args < 2 {
            return Err(ModelsError::config(
                "data.listops.max_args",
                format!("must be at least 2, found {}", self.max_args),
            ));
        }
        Ok(())
    }
}

/// The ListOps generator.
#[derive(Clone, Copy, Debug)]
pub struct ListOps;

impl ListOps {
    /// Draws at most this many trees per kept expression before giving up.
    pub const ATTEMPTS_PER_EXPRESSION: usize = 10_000;

    /// The three splits of `config`, drawn from ChaCha8 seeded by `seed`, onto `device`.
    ///
    /// Errors: [`ListOpsConfig::validate`]'s; [`ModelsError::InvalidConfig`] naming
    /// `data.listops.min_length` when the length range is so narrow that
    /// [`ATTEMPTS_PER_EXPRESSION`](Self::ATTEMPTS_PER_EXPRESSION) draws per expression do not
    /// fill the splits.
    pub fn generate(config: &ListOpsConfig, seed: u64, device: Device) -> Result<SequenceSplits> {
        config.validate()?;
        let exprs = Self::expressions(config, seed)?;
        let t = config.max_length;
        let set = |range: std::ops::Range<usize>| {
            let mut tokens = vec![PAD; range.len() * t];
            let mut labels = Vec::with_capacity(range.len());
            for (row, e) in exprs[range].iter().enumerate() {
                for (slot, &s) in tokens[row * t..].iter_mut().zip(&e.tokens) {
                    *slot = i64::from(s);
                }
                labels.push(i64::from(e.value));
            }
            SequenceSet::from_rows(&tokens, &labels, t, device)
        };
        let (a, b) = (config.train, config.train + config.validation);
        Ok(SequenceSplits {
            train: set(0..a),
            validation: set(a..b),
            test: set(b..b + config.test),
            vocab_size: SYMBOLS.len(),
            num_classes: 10,
            pad_id: Some(PAD),
            seq_len: t,
        })
    }

    /// The distinct kept expressions, in the order they were drawn.
    fn expressions(config: &ListOpsConfig, seed: u64) -> Result<Vec<Drawn>> {
        let wanted = config.train + config.validation + config.test;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut seen: HashSet<Vec<u8>> = HashSet::with_capacity(wanted);
        let mut kept = Vec::with_capacity(wanted);
        let mut attempts = 0usize;
        while kept.len() < wanted {
            attempts += 1;
            if attempts > Self::ATTEMPTS_PER_EXPRESSION.saturating_mul(wanted) {
                return Err(ModelsError::config(
                    "data.listops.min_length",
                    format!(
                        "only {} distinct expressions of {} < length < {} in {attempts} draws; \
                         widen the length range",
                        kept.len(),
                        config.min_length,
                        config.max_length
                    ),
                ));
            }
            let mut tokens = Vec::new();
            let Some(value) = grow(&mut rng, 1, config, &mut tokens) else {
                continue;
            };
            if tokens.len() > config.min_length && seen.insert(tokens.clone()) {
                kept.push(Drawn { tokens, value });
            }
        }
        Ok(kept)
    }
}

/// A kept expression: its token ids (as bytes) and its value.
struct Drawn {
    tokens: Vec<u8>,
    value: u8,
}

/// Appends a random tree at `depth` to `out` (prefix order) and returns its value, or `None` as
/// soon as `out` reaches `max_length` tokens (the tree would be dropped anyway; stopping early
/// keeps successive draws independent, since where a draw stops depends on its own numbers only).
fn grow(
    rng: &mut ChaCha8Rng,
    depth: usize,
    config: &ListOpsConfig,
    out: &mut Vec<u8>,
) -> Option<u8> {
    if out.len() >= config.max_length {
        return None;
    }
    let operator = depth < config.max_depth && rng.gen::<f64>() <= OPERATOR_PROBABILITY;
    if !operator {
        let digit: u8 = rng.gen_range(0..10);
        out.push(digit + 1);
        return Some(digit);
    }
    let count = rng.gen_range(2..=config.max_args);
    let op = Op::ALL[rng.gen_range(0..Op::ALL.len())];
    out.push(op.id() as u8);
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        args.push(grow(rng, depth + 1, config, out)?);
    }
    out.push(CLOSE as u8);
    (out.len() < config.max_length).then(|| op.apply(&args))
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(SYMBOLS[self.id() as usize])
    }
}
