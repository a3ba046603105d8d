//! Pathfinder (Linsley et al. 2018, the 32×32 task of Long Range Arena): gray images with two
//! dots and dashed curved paths; the label is 1 when one path joins the two dots, 0 otherwise.
//! The image is read as a sequence of T = S·S pixel tokens in raster order. The generator
//! follows the task's rules at pixel resolution; it is not Linsley et al.'s renderer (which
//! draws anti-aliased paddles), so its images are not LRA's images.
//!
//! # Rules
//!
//! Every image holds two *long* paths of `path_length` pixels and `distractors` short paths of
//! `distractor_length` pixels, drawn in that order. A path is a snake: it starts at a random
//! pixel heading in a uniform direction θ₀ and takes unit steps (x, y) += (cos θ, sin θ), each
//! after turning θ by a uniform angle in ±`max_turn_degrees`; its pixels are the rounded
//! positions, so consecutive pixels are 8-neighbours (|Δround| ≤ 1 for |Δ| ≤ 1). A step is
//! refused, and its turn redrawn, when its pixel lies on the 1-pixel border, on a drawn pixel,
//! next to a pixel of the same path more than three steps back (no loops), or within Chebyshev
//! distance `gap` + 1 of another path (its pixels and dots). When one end is stuck the path
//! grows on from its start along θ₀ + π; a path that still cannot reach its length is redrawn
//! from a new start, and an image whose paths do not fit is redrawn.
//!
//! The dots are "+"-shaped markers (5 pixels) on path ends: for label 1 at both ends of the
//! first long path, for label 0 at the start of each long path, so both classes have the same
//! paths and differ only in where the dots sit. A path is accepted only with its dots, which
//! obey the same distance rule.
//!
//! Along a path, `dash` pixels are lit and `gap` pixels left dark, repeating; the last pixel is
//! always lit. Each path has one gray level, uniform in 128..=224; markers are 255; the
//! background is 0. Tokens are the gray levels (a vocabulary of 256, no padding).
//!
//! The distance rule makes the label readable from the rendered image: lit pixels of one path
//! are at most `gap` + 1 apart (Chebyshev) from the next lit pixel along it, and pixels of
//! different paths are more than `gap` + 1 apart, so the components of the lit pixels under
//! "Chebyshev distance ≤ `gap` + 1" are exactly the paths (the tests check this).
//!
//! Example i of the splits (train, then validation, then test) is drawn from ChaCha8 seeded by
//! (seed, stream i) and has label i mod 2, so every split is balanced to within one example.

use std::f64::consts::PI;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::Device;

use super::{positive, SequenceSet, SequenceSplits};
use crate::error::{ModelsError, Result};

/// The gray level of the dots.
pub const DOT_LEVEL: u8 = 255;

/// Gray levels of paths (one per path, uniform).
pub const PATH_LEVELS: std::ops::RangeInclusive<u8> = 128..=224;

const PATH_ATTEMPTS: usize = 40;
const STEP_ATTEMPTS: usize = 8;
/// Images redrawn before the configuration is declared too crowded.
pub const IMAGE_ATTEMPTS: usize = 500;

/// The image size, the paths and the split sizes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathfinderConfig {
    /// Training images.
    pub train: usize,
    /// Validation images.
    pub validation: usize,
    /// Test images.
    pub test: usize,
    /// Image side S (T = S·S tokens).
    pub size: usize,
    /// Pixels of each of the two long paths.
    pub path_length: usize,
    /// Short paths without dots.
    pub distractors: usize,
    /// Pixels of each short path.
    pub distractor_length: usize,
    /// Lit pixels per dash.
    pub dash: usize,
    /// Dark pixels between dashes (0: solid paths).
    pub gap: usize,
    /// The largest turn per unit step, in degrees.
    pub max_turn_degrees: f64,
}

impl Default for PathfinderConfig {
    /// The CPU size: 16×16 images (256 tokens), 2000/200/200 of them.
    fn default() -> Self {
        Self {
            train: 2000,
            validation: 200,
            test: 200,
            size: 16,
            path_length: 14,
            distractors: 2,
            distractor_length: 5,
            dash: 3,
            gap: 1,
            max_turn_degrees: 30.0,
        }
    }
}

impl PathfinderConfig {
    /// LRA's size: 32×32 images (1024 tokens); LRA's 160 000/20 000/20 000 split sizes.
    pub fn lra() -> Self {
        Self {
            train: 160_000,
            validation: 20_000,
            test: 20_000,
            size: 32,
            path_length: 40,
            distractors: 6,
            distractor_length: 10,
            ..Self::default()
        }
    }

    /// Errors name the field: split sizes of 0, `size` < 8, a path of fewer than 2 pixels,
    /// `dash` of 0, a turn outside [0, 180] degrees.
    pub fn validate(&self) -> Result<()> {
        positive("data.pathfinder.train", self.train)?;
        positive("data.pathfinder.validation", self.validation)?;
        positive("data.pathfinder.test", self.test)?;
        positive("data.pathfinder.dash", self.dash)?;
        let too_small = |field: &str, value: usize, least: usize| {
            if value < least {
                Err(ModelsError::config(
                    field,
                    format!("must be at least {least}, found {value}"),
                ))
            } else {
                Ok(())
            }
        };
        too_small("data.pathfinder.size", self.size, 8)?;
        too_small("data.pathfinder.path_length", self.path_length, 2)?;
        if self.distractors > 0 {
            too_small(
                "data.pathfinder.distractor_length",
                self.distractor_length,
                2,
            )?;
        }
        if !(0.0..=180.0).contains(&self.max_turn_degrees) {
            return Err(ModelsError::config(
                "data.pathfinder.max_turn_degrees",
                format!("must lie in [0, 180], found {}", self.max_turn_degrees),
            ));
        }
        Ok(())
    }
}

/// A pixel (row, column).
pub type Pixel = (usize, usize);

/// One drawn image with the record of how it was drawn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathfinderImage {
    /// S·S gray levels, row by row.
    pub pixels: Vec<u8>,
    /// 1 when one path joins the dots.
    pub label: i64,
    /// Every path's pixels in drawing order, lit or dark: the two long paths first.
    pub paths: Vec<Vec<Pixel>>,
    /// The centres of the two dots.
    pub dots: [Pixel; 2],
    /// The path each dot sits on (an index into `paths`).
    pub dot_paths: [usize; 2],
}

/// The Pathfinder generator.
#[derive(Clone, Copy, Debug)]
pub struct Pathfinder;

impl Pathfinder {
    /// The three splits of `config` for `seed`, onto `device`.
    ///
    /// Errors: [`PathfinderConfig::validate`]'s, and [`Pathfinder::draw`]'s.
    pub fn generate(
        config: &PathfinderConfig,
        seed: u64,
        device: Device,
    ) -> Result<SequenceSplits> {
        config.validate()?;
        let t = config.size * config.size;
        let set = |range: std::ops::Range<usize>| -> Result<SequenceSet> {
            let mut tokens = Vec::with_capacity(range.len() * t);
            let mut labels = Vec::with_capacity(range.len());
            for i in range {
                let image = Self::draw(config, seed, i as u64)?;
                tokens.extend(image.pixels.iter().map(|&p| i64::from(p)));
                labels.push(image.label);
            }
            Ok(SequenceSet::from_rows(&tokens, &labels, t, device))
        };
        let (a, b) = (config.train, config.train + config.validation);
        Ok(SequenceSplits {
            train: set(0..a)?,
            validation: set(a..b)?,
            test: set(b..b + config.test)?,
            vocab_size: 256,
            num_classes: 2,
            pad_id: None,
            seq_len: t,
        })
    }

    /// Example `index` for `seed`: label `index` mod 2, drawn from ChaCha8 seeded by (seed,
    /// stream `index`).
    ///
    /// Errors: [`PathfinderConfig::validate`]'s; [`ModelsError::InvalidConfig`] naming
    /// `data.pathfinder.path_length` when [`IMAGE_ATTEMPTS`] images in a row do not fit.
    pub fn draw(config: &PathfinderConfig, seed: u64, index: u64) -> Result<PathfinderImage> {
        config.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(index);
        let label = (index % 2) as i64;
        for _ in 0..IMAGE_ATTEMPTS {
            if let Some(image) = Canvas::new(config).fill(&mut rng, label) {
                return Ok(image);
            }
        }
        Err(ModelsError::config(
            "data.pathfinder.path_length",
            format!(
                "{IMAGE_ATTEMPTS} attempts could not fit 2 paths of {} and {} of {} pixels into \
                 {}×{} (dark gaps of {}); use shorter or fewer paths",
                config.path_length,
                config.distractors,
                config.distractor_length,
                config.size,
                config.size,
                config.gap
            ),
        ))
    }
}

/// An image being drawn: which path owns each pixel.
struct Canvas<'a> {
    config: &'a PathfinderConfig,
    owner: Vec<Option<usize>>,
    paths: Vec<Vec<Pixel>>,
    markers: Vec<(Pixel, usize)>,
}

impl<'a> Canvas<'a> {
    fn new(config: &'a PathfinderConfig) -> Self {
        Self {
            config,
            owner: vec![None; config.size * config.size],
            paths: Vec::new(),
            markers: Vec::new(),
        }
    }

    /// Draws every path and the dots; `None` when something does not fit.
    fn fill(mut self, rng: &mut ChaCha8Rng, label: i64) -> Option<PathfinderImage> {
        let c = self.config;
        for k in 0..2 + c.distractors {
            let length = if k < 2 {
                c.path_length
            } else {
                c.distractor_length
            };
            let (path, dots) = (0..PATH_ATTEMPTS).find_map(|_| {
                let path = self.snake(rng, k, length)?;
                // Dots: both ends of path 0 for label 1, the start of each long path for 0.
                let dots = match (k, label) {
                    (0, 1) => vec![path[0], path[path.len() - 1]],
                    (0, _) | (1, 0) => vec![path[0]],
                    _ => Vec::new(),
                };
                let cells = dots
                    .iter()
                    .map(|&d| self.marker_cells(d, k))
                    .collect::<Option<Vec<_>>>()?;
                Some((path, (dots, cells)))
            })?;
            for &p in path.iter().chain(dots.1.iter().flatten()) {
                self.owner[p.0 * c.size + p.1] = Some(k);
            }
            self.markers.extend(dots.0.into_iter().map(|d| (d, k)));
            self.paths.push(path);
        }
        Some(self.render(rng, label))
    }

    /// A snake of `length` pixels for path `k`, or `None` when it gets stuck: grown from a
    /// random start along a random heading θ₀ and, when that end is stuck, on from the start
    /// along θ₀ + π.
    fn snake(&self, rng: &mut ChaCha8Rng, k: usize, length: usize) -> Option<Vec<Pixel>> {
        let s = self.config.size as f64;
        let (y, x) = (rng.gen_range(1.0..s - 2.0), rng.gen_range(1.0..s - 2.0));
        let start = (y.round() as usize, x.round() as usize);
        if !self.free(start, k, &[]) {
            return None;
        }
        let theta = rng.gen_range(0.0..2.0 * PI);
        let mut path = vec![start];
        if self.grow(rng, k, length, &mut path, (y, x, theta)) {
            return Some(path);
        }
        path.reverse();
        self.grow(rng, k, length, &mut path, (y, x, theta + PI))
            .then_some(path)
    }

    /// Extends `path` from its last pixel, at position (y, x) heading θ, to `length` pixels;
    /// false when a step finds no free pixel in [`STEP_ATTEMPTS`] turns, or after 4·`length`
    /// steps.
    fn grow(
        &self,
        rng: &mut ChaCha8Rng,
        k: usize,
        length: usize,
        path: &mut Vec<Pixel>,
        (mut y, mut x, mut theta): (f64, f64, f64),
    ) -> bool {
        let turn = self.config.max_turn_degrees.to_radians();
        for _ in 0..4 * length {
            if path.len() >= length {
                return true;
            }
            let last = path[path.len() - 1];
            let next = (0..STEP_ATTEMPTS).find_map(|_| {
                let t = theta
                    + if turn > 0.0 {
                        rng.gen_range(-turn..=turn)
                    } else {
                        0.0
                    };
                let (ny, nx) = (y + t.sin(), x + t.cos());
                let p = (ny.round().max(0.0) as usize, nx.round().max(0.0) as usize);
                (p == last || self.free(p, k, path)).then_some((t, ny, nx, p))
            });
            let Some((t, ny, nx, p)) = next else {
                return false;
            };
            (theta, y, x) = (t, ny, nx);
            if p != last {
                path.push(p);
            }
        }
        path.len() >= length
    }

    /// Whether path `k` (pixels so far: `own`) may take pixel `p`: inside the border, not
    /// drawn, not touching its own pixels more than three steps back, and farther than `gap`+1
    /// from every other path.
    fn free(&self, p: Pixel, k: usize, own: &[Pixel]) -> bool {
        let s = self.config.size;
        if p.0 < 1 || p.1 < 1 || p.0 > s - 2 || p.1 > s - 2 {
            return false;
        }
        let near = |q: &Pixel, r: usize| p.0.abs_diff(q.0) <= r && p.1.abs_diff(q.1) <= r;
        let old = own.len().saturating_sub(3);
        if own.contains(&p) || own[..old].iter().any(|q| near(q, 1)) {
            return false;
        }
        self.clear_of_others(p, k)
    }

    /// Whether no pixel of a path other than `k` lies within Chebyshev distance `gap` + 1.
    fn clear_of_others(&self, p: Pixel, k: usize) -> bool {
        let (s, r) = (self.config.size, self.config.gap + 1);
        let rows = p.0.saturating_sub(r)..=(p.0 + r).min(s - 1);
        rows.into_iter().all(|i| {
            (p.1.saturating_sub(r)..=(p.1 + r).min(s - 1))
                .all(|j| self.owner[i * s + j].is_none_or(|o| o == k))
        })
    }

    /// The "+" of 5 pixels around `centre`, or `None` when it leaves the image or comes within
    /// `gap` + 1 of a path other than `k`.
    fn marker_cells(&self, centre: Pixel, k: usize) -> Option<Vec<Pixel>> {
        let s = self.config.size;
        let plus: [(isize, isize); 5] = [(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)];
        plus.iter()
            .map(|&(dy, dx)| {
                let r = centre.0.checked_add_signed(dy).filter(|&v| v < s)?;
                let c = centre.1.checked_add_signed(dx).filter(|&v| v < s)?;
                self.clear_of_others((r, c), k).then_some((r, c))
            })
            .collect()
    }

    /// The gray image: each path's lit pixels at its level, then the dots.
    fn render(self, rng: &mut ChaCha8Rng, label: i64) -> PathfinderImage {
        let c = self.config;
        let mut pixels = vec![0u8; c.size * c.size];
        for path in &self.paths {
            let level = rng.gen_range(PATH_LEVELS);
            for (i, &(r, col)) in path.iter().enumerate() {
                if i % (c.dash + c.gap) < c.dash || i + 1 == path.len() {
                    pixels[r * c.size + col] = level;
                }
            }
        }
        for &((r, col), _) in &self.markers {
            pixels[r * c.size + col] = DOT_LEVEL;
            for (dr, dc) in [(0, 1), (2, 1), (1, 0), (1, 2)] {
                pixels[(r + dr - 1) * c.size + col + dc - 1] = DOT_LEVEL;
            }
        }
        PathfinderImage {
            pixels,
            label,
            dots: [self.markers[0].0, self.markers[1].0],
            dot_paths: [self.markers[0].1, self.markers[1].1],
            paths: self.paths,
        }
    }
}
