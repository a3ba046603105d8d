//! The Long-Range-Arena data (`data::sequences`): the ListOps evaluator on hand-written
//! expressions and the generator's rules on what it draws; Pathfinder's labels against the
//! connected components of the rendered images; the movie-review and Fashion-MNIST sequences
//! against their files; installed files that are not regular files or whose headers lie are
//! errors naming them; determinism and batching.

use std::collections::HashSet;
use std::fs;
use std::path::PathBuf;

use kappa_models::data::fixtures::write_fashion_mnist;
use kappa_models::data::sequences::listops::{self, Op};
use kappa_models::data::sequences::pathfinder::PathfinderImage;
use kappa_models::data::sequences::{
    fixtures, load_fashion_mnist, ImageSequenceConfig, ListOps, ListOpsConfig, MovieReviews,
    Pathfinder, PathfinderConfig, SequenceSplits, TextConfig,
};
use kappa_models::{FashionMnist, ModelsError, Split};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kappa-lra-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

fn rows(t: &Tensor) -> Vec<Vec<i64>> {
    let n = t.size()[0];
    (0..n)
        .map(|i| Vec::<i64>::try_from(t.get(i)).unwrap())
        .collect()
}

fn labels(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t).unwrap()
}

fn value_of(text: &str) -> listops::Evaluation {
    listops::evaluate(&listops::encode(text).unwrap()).unwrap()
}

fn field_of(e: ModelsError) -> String {
    match e {
        ModelsError::InvalidConfig { field, .. } => field,
        other => panic!("expected a config error, got {other}"),
    }
}

fn same_splits(a: &SequenceSplits, b: &SequenceSplits) -> bool {
    [Split::Train, Split::Validation, Split::Test]
        .iter()
        .all(|&s| {
            a.split(s).tokens.equal(&b.split(s).tokens)
                && a.split(s).labels.equal(&b.split(s).labels)
        })
}

// ---------------------------------------------------------------------------------------------
// ListOps

#[test]
fn listops_evaluates_hand_written_expressions() {
    let cases = [
        ("7", 7, 1),
        ("[MIN 3 9 1 ]", 1, 2),
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9, 3),
        ("[MAX 4 3 [MIN 2 3 ] 1 0 ]", 4, 3),
        // MED: the middle value for an odd count, ⌊(a + b)/2⌋ for an even count.
        ("[MED 3 1 4 ]", 3, 2),
        ("[MED 1 4 ]", 2, 2),
        ("[MED 1 2 8 9 ]", 5, 2),
        ("[MED 9 1 7 2 ]", 4, 2),
        ("[MED [MED 0 3 ] 9 ]", 5, 3),
        ("[MED [MED 0 3 ] [MED 8 9 ] ]", 4, 3),
        // SM wraps modulo 10.
        ("[SM 9 8 7 ]", 4, 2),
        ("[SM 5 5 ]", 0, 2),
        ("[SM [MAX 9 9 ] [MED 9 8 ] ]", 7, 3),
        ("[MIN 5 [MAX 1 [SM 2 [MED 6 6 ] ] ] 8 ]", 5, 5),
    ];
    for (text, value, depth) in cases {
        let e = value_of(text);
        assert_eq!((e.value, e.depth), (value, depth), "{text}");
        assert_eq!(e.len, text.split_whitespace().count(), "{text}");
        let ids = listops::encode(text).unwrap();
        assert_eq!(listops::decode(&ids).unwrap(), text);
        // Padding after the expression is allowed and not counted.
        let mut padded = ids.clone();
        padded.extend([listops::PAD; 5]);
        assert_eq!(listops::evaluate(&padded).unwrap(), e);
    }
}

#[test]
fn listops_median_is_numpys_median_truncated() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..2000 {
        let n = rng.gen_range(1..=10);
        let args: Vec<u8> = (0..n).map(|_| rng.gen_range(0..10)).collect();
        let mut s: Vec<f64> = args.iter().map(|&a| f64::from(a)).collect();
        s.sort_by(f64::total_cmp);
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        assert_eq!(f64::from(Op::Med.apply(&args)), median.trunc(), "{args:?}");
    }
}

#[test]
fn listops_malformed_expressions_are_errors() {
    for text in [
        "",
        "]",
        "[MIN ]",
        "[MIN 3",
        "3 4",
        "[MIN 3 ] 4",
        "[MAX [SM 1 2 ]",
    ] {
        let ids = listops::encode(text).unwrap();
        assert!(
            matches!(listops::evaluate(&ids), Err(ModelsError::Tokenizer(_))),
            "{text:?}"
        );
    }
    assert!(listops::evaluate(&[1, 99]).is_err());
    assert!(listops::evaluate(&[-3]).is_err());
    assert!(listops::encode("[MIN 3 [FIRST 2 ] ]").is_err());
    assert!(listops::decode(&[16]).is_err());
    // A deep input is evaluated without recursion.
    let deep = 100_000;
    let mut ids = vec![Op::Min.id(); deep];
    ids.push(2); // the digit 1
    ids.extend(vec![listops::CLOSE; deep]);
    let e = listops::evaluate(&ids).unwrap();
    assert_eq!((e.value, e.depth), (1, deep + 1));
}

fn small_listops() -> ListOpsConfig {
    ListOpsConfig {
        train: 300,
        validation: 40,
        test: 40,
        min_length: 30,
        max_length: 120,
        ..ListOpsConfig::default()
    }
}

#[test]
fn listops_generated_expressions_follow_the_rules() {
    for config in [small_listops(), ListOpsConfig::default()] {
        let data = ListOps::generate(&config, 11, Device::Cpu).unwrap();
        assert_eq!(
            (data.vocab_size, data.num_classes, data.pad_id, data.seq_len),
            (16, 10, Some(0), config.max_length)
        );
        let mut seen = HashSet::new();
        let mut values = [0usize; 10];
        for (split, n) in [
            (Split::Train, config.train),
            (Split::Validation, config.validation),
            (Split::Test, config.test),
        ] {
            let set = data.split(split);
            assert_eq!(set.tokens.size(), vec![n as i64, config.max_length as i64]);
            for (row, label) in rows(&set.tokens).into_iter().zip(labels(&set.labels)) {
                let e = listops::evaluate(&row).unwrap();
                assert_eq!(i64::from(e.value), label);
                assert!(e.depth <= config.max_depth, "depth {}", e.depth);
                assert!(
                    e.len > config.min_length && e.len < config.max_length,
                    "{}",
                    e.len
                );
                assert!(row[e.len..].iter().all(|&t| t == listops::PAD));
                assert!(seen.insert(row[..e.len].to_vec()), "a duplicate expression");
                values[e.value as usize] += 1;
            }
        }
        // Every class occurs.
        assert!(values.iter().all(|&v| v > 0), "{values:?}");
    }
}

#[test]
fn listops_is_seeded() {
    let config = small_listops();
    let a = ListOps::generate(&config, 5, Device::Cpu).unwrap();
    let b = ListOps::generate(&config, 5, Device::Cpu).unwrap();
    let c = ListOps::generate(&config, 6, Device::Cpu).unwrap();
    assert!(same_splits(&a, &b));
    assert!(!a.train.tokens.equal(&c.train.tokens));
}

#[test]
fn listops_bad_configs_name_the_field() {
    let base = small_listops();
    let cases = [
        (ListOpsConfig { train: 0, ..base }, "data.listops.train"),
        (ListOpsConfig { test: 0, ..base }, "data.listops.test"),
        (
            ListOpsConfig {
                min_length: 50,
                max_length: 51,
                ..base
            },
            "data.listops.max_length",
        ),
        (
            ListOpsConfig {
                max_depth: 1,
                ..base
            },
            "data.listops.max_depth",
        ),
        (
            ListOpsConfig {
                max_depth: 65,
                ..base
            },
            "data.listops.max_depth",
        ),
        (
            ListOpsConfig {
                max_args: 1,
                ..base
            },
            "data.listops.max_args",
        ),
        // Depth 2 makes at most 2 + max_args tokens: the range cannot be filled.
        (
            ListOpsConfig {
                max_depth: 2,
                ..base
            },
            "data.listops.min_length",
        ),
    ];
    for (config, field) in cases {
        let err = ListOps::generate(&config, 0, Device::Cpu).unwrap_err();
        assert_eq!(field_of(err), field);
    }
}

// ---------------------------------------------------------------------------------------------
// Pathfinder

/// Labels the lit pixels (> 0) by components under "Chebyshev distance ≤ reach".
fn components(image: &PathfinderImage, size: usize, reach: usize) -> Vec<Option<usize>> {
    let lit = |i: usize| image.pixels[i] > 0;
    let mut label = vec![None; size * size];
    let mut next = 0;
    for start in (0..size * size).filter(|&i| lit(i)) {
        if label[start].is_some() {
            continue;
        }
        let mut stack = vec![start];
        label[start] = Some(next);
        while let Some(p) = stack.pop() {
            let (r, c) = (p / size, p % size);
            for i in r.saturating_sub(reach)..=(r + reach).min(size - 1) {
                for j in c.saturating_sub(reach)..=(c + reach).min(size - 1) {
                    let q = i * size + j;
                    if lit(q) && label[q].is_none() {
                        label[q] = Some(next);
                        stack.push(q);
                    }
                }
            }
        }
        next += 1;
    }
    label
}

fn check_image(image: &PathfinderImage, config: &PathfinderConfig) {
    let s = config.size;
    // The record: path lengths, 8-connected steps, the dots on path ends.
    assert_eq!(image.paths.len(), 2 + config.distractors);
    for (k, path) in image.paths.iter().enumerate() {
        let want = if k < 2 {
            config.path_length
        } else {
            config.distractor_length
        };
        assert_eq!(path.len(), want);
        for w in path.windows(2) {
            assert!(w[0] != w[1] && w[0].0.abs_diff(w[1].0) <= 1 && w[0].1.abs_diff(w[1].1) <= 1);
        }
    }
    let joined = image.dot_paths[0] == image.dot_paths[1];
    assert_eq!(i64::from(joined), image.label);
    for (dot, &k) in image.dots.iter().zip(&image.dot_paths) {
        let path = &image.paths[k];
        assert!(k < 2 && (path[0] == *dot || path[path.len() - 1] == *dot));
    }
    // The rendering: lit pixels lie on paths or dots; with gaps, some path pixels are dark.
    let on_path: HashSet<(usize, usize)> = image.paths.iter().flatten().copied().collect();
    for (i, &v) in image.pixels.iter().enumerate() {
        let p = (i / s, i % s);
        let near_dot = image
            .dots
            .iter()
            .any(|d| d.0.abs_diff(p.0) + d.1.abs_diff(p.1) <= 1);
        assert!(
            v == 0 || on_path.contains(&p) || near_dot,
            "stray pixel {p:?}"
        );
        assert_eq!(near_dot, v == 255, "{p:?}");
    }
    let dark_on_path = on_path
        .iter()
        .filter(|p| image.pixels[p.0 * s + p.1] == 0)
        .count();
    assert_eq!(
        dark_on_path > 0,
        config.gap > 0 && config.path_length > config.dash
    );
    // The label from the image alone: bridging gaps of `gap` dark pixels, the components are
    // exactly the paths, and the dots share one iff the label is 1.
    let comp = components(image, s, config.gap + 1);
    let count = comp.iter().flatten().max().map_or(0, |m| m + 1);
    assert_eq!(count, image.paths.len());
    let [a, b] = image.dots.map(|d| comp[d.0 * s + d.1].unwrap());
    assert_eq!(i64::from(a == b), image.label);
}

#[test]
fn pathfinder_labels_agree_with_the_rendered_components() {
    let solid = PathfinderConfig {
        gap: 0,
        ..PathfinderConfig::default()
    };
    let coarse = PathfinderConfig {
        dash: 2,
        gap: 2,
        path_length: 12,
        distractors: 1,
        ..PathfinderConfig::default()
    };
    let configs = [
        (PathfinderConfig::default(), 400),
        (solid, 200),
        (coarse, 200),
        (PathfinderConfig::lra(), 100),
    ];
    for (config, n) in configs {
        for i in 0..n {
            let image = Pathfinder::draw(&config, 21, i).unwrap();
            assert_eq!(image.label, (i % 2) as i64);
            check_image(&image, &config);
        }
    }
}

#[test]
fn pathfinder_splits_are_seeded_and_balanced() {
    let config = PathfinderConfig {
        train: 61,
        validation: 20,
        test: 20,
        ..PathfinderConfig::default()
    };
    let a = Pathfinder::generate(&config, 9, Device::Cpu).unwrap();
    let b = Pathfinder::generate(&config, 9, Device::Cpu).unwrap();
    let c = Pathfinder::generate(&config, 10, Device::Cpu).unwrap();
    assert!(same_splits(&a, &b));
    assert!(!a.train.tokens.equal(&c.train.tokens));
    assert_eq!(
        (a.vocab_size, a.num_classes, a.pad_id, a.seq_len),
        (256, 2, None, 256)
    );
    assert_eq!(a.train.tokens.size(), vec![61, 256]);
    for split in [Split::Train, Split::Validation, Split::Test] {
        let l = labels(&a.split(split).labels);
        let ones = l.iter().filter(|&&v| v == 1).count();
        assert!(
            ones.abs_diff(l.len() - ones) <= 1,
            "{split:?}: {ones} of {}",
            l.len()
        );
    }
    // Row i of the validation split is example train + i.
    let image = Pathfinder::draw(&config, 9, 61 + 3).unwrap();
    let row: Vec<i64> = image.pixels.iter().map(|&p| i64::from(p)).collect();
    assert_eq!(rows(&a.validation.tokens)[3], row);
}

#[test]
fn pathfinder_bad_configs_name_the_field() {
    let base = PathfinderConfig::default();
    let cases = [
        (
            PathfinderConfig {
                validation: 0,
                ..base
            },
            "data.pathfinder.validation",
        ),
        (PathfinderConfig { size: 6, ..base }, "data.pathfinder.size"),
        (
            PathfinderConfig {
                path_length: 1,
                ..base
            },
            "data.pathfinder.path_length",
        ),
        (PathfinderConfig { dash: 0, ..base }, "data.pathfinder.dash"),
        (
            PathfinderConfig {
                max_turn_degrees: -1.0,
                ..base
            },
            "data.pathfinder.max_turn_degrees",
        ),
        // Two paths of 200 pixels do not fit into 16×16.
        (
            PathfinderConfig {
                path_length: 200,
                ..base
            },
            "data.pathfinder.path_length",
        ),
    ];
    for (config, field) in cases {
        let err = Pathfinder::draw(&config, 0, 0).unwrap_err();
        assert_eq!(field_of(err), field);
    }
}

// ---------------------------------------------------------------------------------------------
// Text

fn small_text() -> TextConfig {
    TextConfig {
        seq_len: 32,
        validation: 10,
        test: 10,
    }
}

#[test]
fn movie_reviews_are_bytes_in_a_fixed_split() {
    let dir = scratch("text");
    let missing = MovieReviews::load(&dir, &small_text(), Device::Cpu).unwrap_err();
    let message = missing.to_string();
    assert!(matches!(missing, ModelsError::MissingData { .. }));
    assert!(
        message.contains("cargo xtask setup --data movie-reviews"),
        "{message}"
    );
    assert!(message.contains("sentences.tsv"), "{message}");

    fixtures::write_movie_reviews(&dir, 60, 1).unwrap();
    let data = MovieReviews::load(&dir, &small_text(), Device::Cpu).unwrap();
    assert_eq!(
        (data.vocab_size, data.num_classes, data.pad_id),
        (257, 2, Some(256))
    );
    assert_eq!(
        (data.train.len(), data.validation.len(), data.test.len()),
        (40, 10, 10)
    );
    // Every sentence appears once, truncated and padded, with its label.
    let text = fs::read_to_string(dir.join("sentences.tsv")).unwrap();
    let mut expected: Vec<(Vec<i64>, i64)> = text
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.splitn(3, '\t').collect();
            let mut bytes: Vec<i64> = f[2].bytes().take(32).map(i64::from).collect();
            bytes.resize(32, 256);
            (bytes, f[0].parse().unwrap())
        })
        .collect();
    let mut found = Vec::new();
    for split in [Split::Train, Split::Validation, Split::Test] {
        let set = data.split(split);
        found.extend(rows(&set.tokens).into_iter().zip(labels(&set.labels)));
    }
    expected.sort();
    found.sort();
    assert_eq!(found, expected);
    assert!(
        expected.iter().any(|(b, _)| b[31] != 256),
        "no sentence was truncated"
    );
    // The split does not depend on anything but the file.
    let again = MovieReviews::load(&dir, &small_text(), Device::Cpu).unwrap();
    assert!(same_splits(&data, &again));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn malformed_movie_reviews_name_the_line() {
    let dir = scratch("text-bad");
    fs::create_dir_all(&dir).unwrap();
    let file = dir.join("sentences.tsv");
    for (content, needle) in [
        (
            "label\tscore\tsentence\n1\t0.5\tgood\n2\t0.1\tbad label\n",
            "line 3",
        ),
        ("label\tscore\tsentence\n1\t0.5\n", "line 2"),
    ] {
        fs::write(&file, content).unwrap();
        let err = MovieReviews::load(&dir, &small_text(), Device::Cpu).unwrap_err();
        assert!(matches!(err, ModelsError::BadData { .. }), "{err}");
        assert!(err.to_string().contains(needle), "{err}");
    }
    fixtures::write_movie_reviews(&dir, 15, 0).unwrap();
    let err = MovieReviews::load(&dir, &small_text(), Device::Cpu).unwrap_err();
    assert_eq!(field_of(err), "data.text.validation");
    let zero = TextConfig {
        seq_len: 0,
        ..small_text()
    };
    let err = MovieReviews::load(&dir, &zero, Device::Cpu).unwrap_err();
    assert_eq!(field_of(err), "data.text.seq_len");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_movie_review_file_that_is_a_folder_or_a_fifo_is_an_error_naming_it() {
    let dir = scratch("text-not-a-file");
    let path = dir.join(MovieReviews::FILE);
    fs::create_dir_all(&path).unwrap();
    let load_within_20_s = || {
        let (send, receive) = std::sync::mpsc::channel();
        let dir = dir.clone();
        std::thread::spawn(move || {
            let result = MovieReviews::load(&dir, &small_text(), Device::Cpu);
            let _ = send.send(result.map(|_| ()));
        });
        receive
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("loading did not return within 20 s")
            .unwrap_err()
    };
    let mut kinds = vec!["a directory"];
    if cfg!(unix) {
        kinds.push("a FIFO");
    }
    for kind in kinds {
        if kind == "a FIFO" {
            fs::remove_dir(&path).unwrap();
            let made = std::process::Command::new("mkfifo")
                .arg(&path)
                .status()
                .unwrap();
            assert!(made.success());
        }
        let err = load_within_20_s();
        let message = err.to_string();
        assert!(
            matches!(&err, ModelsError::NotRegularFile { path: p, .. } if p == &path),
            "{message}"
        );
        assert!(message.contains(kind), "{message}");
    }
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Image

#[test]
fn fashion_mnist_sequences_are_the_loaders_pixels() {
    let dir = scratch("image");
    let config = ImageSequenceConfig {
        validation: 10,
        train_limit: None,
    };
    let missing = load_fashion_mnist(&dir, &config, Device::Cpu).unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("cargo xtask setup --data fashion-mnist"),
        "{missing}"
    );
    write_fashion_mnist(&dir, 40, 12, 0).unwrap();
    let data = load_fashion_mnist(&dir, &config, Device::Cpu).unwrap();
    assert_eq!(
        (data.vocab_size, data.num_classes, data.pad_id, data.seq_len),
        (256, 10, None, 784)
    );
    let images = FashionMnist::load(&dir, 10, None, Device::Cpu).unwrap();
    for split in [Split::Train, Split::Validation, Split::Test] {
        let (seq, img) = (data.split(split), images.split(split));
        assert_eq!(seq.tokens.size(), vec![img.len() as i64, 784]);
        assert!(seq.labels.equal(&img.labels));
        let (mean, std) = kappa_models::data::FASHION_MNIST_MEAN_STD;
        let normalized = (seq.tokens.to_kind(Kind::Float) / 255.0 - mean) / std;
        let diff = (normalized - img.images.flatten(1, -1)).abs().max();
        assert!(diff.double_value(&[]) < 1e-5);
    }
    let limited = ImageSequenceConfig {
        validation: 10,
        train_limit: Some(7),
    };
    assert_eq!(
        load_fashion_mnist(&dir, &limited, Device::Cpu)
            .unwrap()
            .train
            .len(),
        7
    );
    let too_many = ImageSequenceConfig {
        validation: 40,
        train_limit: None,
    };
    let err = load_fashion_mnist(&dir, &too_many, Device::Cpu).unwrap_err();
    assert_eq!(field_of(err), "data.validation");
    // A header whose dimensions overflow (4 × 2^31 × 2^31 wraps to 0) names its file.
    let images = dir.join("train-images-idx3-ubyte");
    let mut header = vec![0u8, 0, 8, 3];
    for d in [4u32, 1 << 31, 1 << 31] {
        header.extend_from_slice(&d.to_be_bytes());
    }
    fs::write(&images, header).unwrap();
    let err = load_fashion_mnist(&dir, &config, Device::Cpu).unwrap_err();
    assert!(
        matches!(&err, ModelsError::BadData { path, .. } if path == &images),
        "{err}"
    );
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Batching

#[test]
fn batches_are_a_function_of_seed_and_step_and_cover_an_epoch() {
    let data = ListOps::generate(&small_listops(), 2, Device::Cpu).unwrap();
    let set = &data.train; // 300 examples: 10 batches of 30 per epoch
    let (x1, y1) = set.batch(4, 13, 30).unwrap();
    let (x2, y2) = set.batch(4, 13, 30).unwrap();
    assert!(x1.equal(&x2) && y1.equal(&y2));
    assert_eq!(x1.size(), vec![30, 120]);
    let mut seen = HashSet::new();
    for step in 10..20 {
        let (x, _) = set.batch(4, step, 30).unwrap();
        seen.extend(rows(&x));
    }
    assert_eq!(seen.len(), 300);
    assert!(!set
        .batch(4, 0, 30)
        .unwrap()
        .0
        .equal(&set.batch(4, 10, 30).unwrap().0));
    let (x, y) = set.slice(295, 10);
    assert_eq!((x.size()[0], y.size()[0]), (5, 5));
    for bad in [0, 301] {
        assert_eq!(
            field_of(set.batch(0, 0, bad).unwrap_err()),
            "train.batch_size"
        );
    }
}
