//! Hostile files and configs for the `kappa-experiments` binary, the way a user's mistakes (or a
//! file system's surprises) reach it: a seeded generator writes about 250 cases — mutated
//! `train` configs of a GPT on text, a ViT on IDX files and a ViT on a PNG folder; broken text,
//! IDX and PNG data; run folders that `--resume` must refuse; `reproduce` configs, `--set`
//! values and data; `report` inputs — and each case runs the binary in its own folder with a
//! deadline and an address-space ceiling (kappa-testkit's `cli_cases`).
//!
//! What every case checks:
//! - a bad input ends with exit status 1, no panic and no signal, within the deadline and
//!   under the ceiling, with stderr naming the culprit: the file (its name) or the config's
//!   dotted key (`model.n_layer`, `train.lr`, `data.tokenizer`, `name`);
//! - a legitimate input (the positive controls, and the edge values that are legal) exits 0;
//! - nothing is lost: every entry under the case's folder — the config, the data, a sibling
//!   run's folder, a sentinel folder, the run folder being resumed — is byte-identical
//!   afterwards, except the folder a legitimate run writes (and even there, a user's file that
//!   must be kept).
//!
//! The test fails listing every failing case, grouped by what the binary did.

#![cfg(unix)]

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kappa_testkit::cli_cases::{
    fifo, png_bytes, symlink_loop, zlib, zlib_zeros, Case, Ended, Execution, Runner,
};
use rand::seq::{index, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::Tensor;

const BINARY: &str = env!("CARGO_BIN_EXE_kappa-experiments");

/// The generator's seed: every run draws the same cases.
const SEED: u64 = kappa_testkit::SEED;

/// The deadline of one case. An error comes within a second (libtorch's start-up included)
/// and an accepted case trains its tiny model in one or two; 30 s is far beyond either on a
/// loaded 2-core machine, and a hang costs no more than that.
const DEADLINE: Duration = Duration::from_secs(30);

/// The address-space ceiling is what the setup runs (a tiny valid `train`, one smoke unit of
/// `reproduce`) reach — their `VmPeak` — plus this headroom. The measured part is mostly
/// mappings, not memory: libtorch with its CUDA libraries maps about 4.1 GiB (`VmPeak`
/// 4 250 548 KiB on the machine this test was written on, 500 MiB of it resident), a CPU-only
/// libtorch far less. Three GiB more is far beyond what a tiny job or an error path allocates,
/// and far below what the hostile headers claim (60000×60000 RGBA16 is 27 GiB), so an
/// unbounded allocation fails under it instead of swapping the machine.
const HEADROOM_KIB: u64 = 3 << 20;

/// Set to a file's path, this environment variable makes the test write there what every case
/// did (its exit and the last line of its stderr).
const TRANSCRIPT_VAR: &str = "KAPPA_HOSTILE_TRANSCRIPT";

/// Cases run two at a time (CI has 2 cores).
const WORKERS: usize = 2;

#[test]
fn every_hostile_file_or_config_is_refused_naming_it_and_nothing_is_lost() {
    let scratch = Scratch::new();
    let fixtures = Fixtures::new(&scratch.0);
    let cases = Gen::all_cases(&scratch.0, &fixtures);
    let count = cases.len();
    let ceiling = fixtures.peak_vm_kib + HEADROOM_KIB;
    eprintln!(
        "hostile_files: {count} cases; address-space ceiling {} MiB (the setup runs peaked at \
         {} MiB), deadline {DEADLINE:?}",
        ceiling / 1024,
        fixtures.peak_vm_kib / 1024
    );
    assert!(
        (150..=280).contains(&count),
        "the generator drew {count} cases"
    );
    let verdicts = Runner::new(BINARY, scratch.0.join("logs"))
        .deadline(DEADLINE)
        .address_space_kib(ceiling)
        .workers(WORKERS)
        .env_remove("KAPPA_DEVICE")
        .env_remove("KAPPA_BACKTRACE")
        .run(cases);
    if let Some(path) = std::env::var_os(TRANSCRIPT_VAR) {
        fs::write(&path, verdicts.transcript()).unwrap();
    }
    assert_eq!(verdicts.finish(), count);
}

/// The test's temp folder, removed when the test ends (passing or failing).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("kappa-hostile-files-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------------
// Jobs: a config as dotted keys and TOML value texts, so that any value — a too-large integer,
// `nan`, a wrong type — can be written into it.

/// A `train` job file: (dotted key, value as TOML text), in order.
#[derive(Clone, Debug)]
struct Job(Vec<(String, String)>);

/// The tiny GPT on characters of `input.txt`: trains in about a second.
const GPT_JOB: &[(&str, &str)] = &[
    ("name", "\"tiny-gpt\""),
    ("data.kind", "\"text\""),
    ("data.path", "\"input.txt\""),
    ("data.tokenizer", "\"char\""),
    ("model.kind", "\"gpt\""),
    ("model.vocab_size", "0"),
    ("model.block_size", "8"),
    ("model.n_layer", "1"),
    ("model.n_head", "2"),
    ("model.n_embd", "8"),
    ("model.mlp_ratio", "2"),
    ("model.bias", "false"),
    ("model.scaling", "\"inv_sqrt_k\""),
    ("model.fused_kernel", "true"),
    ("model.correction.kind", "\"identity\""),
    ("model.correction.lambda", "1.0"),
    ("model.correction.layout", "\"shifted\""),
];

/// The ViT on the IDX folder `fmnist` (8×8 gray images, 3 classes).
const IDX_JOB: &[(&str, &str)] = &[
    ("name", "\"tiny-vit-idx\""),
    ("data.kind", "\"idx\""),
    ("data.dir", "\"fmnist\""),
    ("data.validation", "3"),
    ("data.normalize", "\"train_split\""),
    ("model.kind", "\"vit\""),
    ("model.image_size", "8"),
    ("model.channels", "1"),
    ("model.patch_size", "4"),
    ("model.num_classes", "3"),
    ("model.n_layer", "1"),
    ("model.n_head", "2"),
    ("model.n_embd", "8"),
    ("model.mlp_ratio", "2"),
    ("model.bias", "false"),
    ("model.scaling", "\"inv_sqrt_k\""),
    ("model.fused_kernel", "true"),
    ("model.correction.kind", "\"svd\""),
    ("model.correction.every", "1"),
];

/// The ViT on the PNG folder `images` (8×8 RGB images, classes `ant` and `bee`).
const PNG_JOB: &[(&str, &str)] = &[
    ("name", "\"tiny-vit-png\""),
    ("data.kind", "\"image_folder\""),
    ("data.dir", "\"images\""),
    ("data.validation", "2"),
    ("model.kind", "\"vit\""),
    ("model.image_size", "8"),
    ("model.channels", "3"),
    ("model.patch_size", "4"),
    ("model.num_classes", "2"),
    ("model.n_layer", "1"),
    ("model.n_head", "2"),
    ("model.n_embd", "8"),
    ("model.mlp_ratio", "2"),
    ("model.bias", "false"),
    ("model.scaling", "\"inv_sqrt_k\""),
    ("model.fused_kernel", "true"),
    ("model.correction.kind", "\"none\""),
];

/// The `[train]` table every job shares: 4 steps, evaluations and checkpoints at 2 and 4.
const TRAIN: &[(&str, &str)] = &[
    ("train.steps", "4"),
    ("train.batch_size", "4"),
    ("train.lr", "3e-3"),
    ("train.min_lr", "3e-4"),
    ("train.warmup_steps", "1"),
    ("train.weight_decay", "0.1"),
    ("train.beta1", "0.9"),
    ("train.beta2", "0.95"),
    ("train.eps", "1e-8"),
    ("train.grad_clip", "1.0"),
    ("train.eval_every", "2"),
    ("train.eval_batches", "1"),
    ("train.log_every", "1"),
    ("train.checkpoint_every", "2"),
    ("train.divergence_factor", "4.0"),
    ("train.diagnostics.enabled", "true"),
    ("train.diagnostics.samples", "1"),
    ("train.diagnostics.jacobian_max_tokens", "8"),
];

/// Keys and their values as TOML text.
type Keys = &'static [(&'static str, &'static str)];

/// Keys a module-wise optimizer adds.
const MODULEWISE: Keys = &[
    ("optimizer.kind", "\"modulewise\""),
    ("optimizer.preset", "\"HETERO\""),
    ("optimizer.muon_lr", "0.02"),
];

/// Keys QK-clip adds.
const QK_CLIP: Keys = &[
    ("train.qk_clip.tau", "100.0"),
    ("train.qk_clip.alpha", "0.5"),
];

/// The three jobs, each with its data (a file or folder next to the job file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Gpt,
    Idx,
    Png,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Gpt, Kind::Idx, Kind::Png];

    fn job(self) -> Job {
        let model = match self {
            Kind::Gpt => GPT_JOB,
            Kind::Idx => IDX_JOB,
            Kind::Png => PNG_JOB,
        };
        Job(model
            .iter()
            .chain(TRAIN)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    /// The run's name, its folder under `runs/`.
    fn name(self) -> &'static str {
        match self {
            Kind::Gpt => "tiny-gpt",
            Kind::Idx => "tiny-vit-idx",
            Kind::Png => "tiny-vit-png",
        }
    }

    fn data(self) -> &'static str {
        match self {
            Kind::Gpt => "input.txt",
            Kind::Idx => "fmnist",
            Kind::Png => "images",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Gpt => "GPT",
            Kind::Idx => "ViT/IDX",
            Kind::Png => "ViT/PNG",
        }
    }
}

impl Job {
    /// Sets `key` to the TOML text `value` (added at the end when absent).
    fn set(mut self, key: &str, value: &str) -> Self {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value.to_string(),
            None => self.0.push((key.to_string(), value.to_string())),
        }
        self
    }

    /// Every key of `pairs` set.
    fn with(self, pairs: &[(&str, &str)]) -> Self {
        pairs.iter().fold(self, |job, (k, v)| job.set(k, v))
    }

    /// Removes `key`, or every key of the table `key`.
    fn remove(mut self, key: &str) -> Self {
        let table = format!("{key}.");
        self.0.retain(|(k, _)| k != key && !k.starts_with(&table));
        self
    }

    /// The TOML text: top-level keys, then each table in the order its first key came.
    fn text(&self) -> String {
        let split = |k: &str| match k.rsplit_once('.') {
            Some((table, leaf)) => (table.to_string(), leaf.to_string()),
            None => (String::new(), k.to_string()),
        };
        let mut tables: Vec<String> = Vec::new();
        for (k, _) in &self.0 {
            let (table, _) = split(k);
            if !tables.contains(&table) {
                tables.push(table);
            }
        }
        tables.sort_by_key(|t| !t.is_empty());
        let mut text = String::new();
        for table in tables {
            if !table.is_empty() {
                text.push_str(&format!("\n[{table}]\n"));
            }
            for (k, v) in &self.0 {
                let (t, leaf) = split(k);
                if t == table {
                    text.push_str(&format!("{leaf} = {v}\n"));
                }
            }
        }
        text
    }
}

// ---------------------------------------------------------------------------------------------
// Fixtures: data templates, a finished and an interrupted run folder, a results folder, and the
// inflate bomb, made once.

struct Fixtures {
    /// `input.txt`, `fmnist/`, `images/`.
    data: PathBuf,
    /// A case folder with a finished GPT run: `job.toml`, `input.txt`, `runs/tiny-gpt/`.
    finished: PathBuf,
    /// The same with the run interrupted after step 2: no `run.json`, no summary line, the
    /// checkpoint at step 2.
    interrupted: PathBuf,
    /// A case folder with `data/sotu/` and `results/` of one `gpt-sotu` smoke unit.
    sotu: PathBuf,
    /// A PNG of 20000×20000 gray pixels, all zero, in a few hundred KB.
    bomb: Vec<u8>,
    /// The larger `VmPeak` of the two setup runs, in KiB.
    peak_vm_kib: u64,
}

impl Fixtures {
    fn new(root: &Path) -> Self {
        let base = root.join("fixtures");
        let data = base.join("data");
        write_data(&data);
        let setup = Runner::new(BINARY, root.join("logs")).deadline(Duration::from_secs(300));
        let finished = base.join("finished");
        fs::create_dir_all(&finished).unwrap();
        fs::write(finished.join("job.toml"), Kind::Gpt.job().text()).unwrap();
        fs::copy(data.join("input.txt"), finished.join("input.txt")).unwrap();
        let train = succeed(&setup, "setup-train", &finished, train_args(&[]));
        let interrupted = base.join("interrupted");
        copy_tree(&finished, &interrupted);
        interrupt(&interrupted.join("runs/tiny-gpt"));
        let sotu = base.join("sotu");
        kappa_models::data::fixtures::write_sotu(&sotu.join("data/sotu")).unwrap();
        let reproduce = succeed(
            &setup,
            "setup-reproduce",
            &sotu,
            reproduce_args("results", &[]),
        );
        // Gray zeros: a careless decoder allocates 400 MB for the samples (and 1.6 GB of f32).
        let side = 20_000u32;
        let raw = u64::from(side) * (1 + u64::from(side));
        Self {
            data,
            finished,
            interrupted,
            sotu,
            bomb: png_bytes((side, side), 8, 0, &[], &zlib_zeros(raw)),
            peak_vm_kib: train.peak_vm_kib.max(reproduce.peak_vm_kib),
        }
    }
}

/// Runs a setup command that must succeed (the test cannot go on otherwise).
fn succeed(setup: &Runner, name: &str, dir: &Path, args: Vec<String>) -> Execution {
    let run = setup.execute(name, dir, &os(&args)).unwrap();
    assert_eq!(run.ended, Ended::Exited(0), "{name}: {}", run.stderr);
    run
}

/// The data templates: `input.txt`, the IDX folder `fmnist/` and the PNG folder `images/`.
fn write_data(data: &Path) {
    fs::create_dir_all(data).unwrap();
    write_text(&data.join("input.txt"));
    write_idx_folder(&data.join("fmnist"));
    let images = data.join("images");
    kappa_models::data::fixtures::write_image_folder(&images, &["ant", "bee"], (4, 2), 8, 3)
        .unwrap();
}

/// About 2800 characters of English.
fn write_text(path: &Path) {
    let text: String = (0..60)
        .map(|i| format!("The state of the union is strong in year {i}. "))
        .collect();
    fs::write(path, text).unwrap();
}

/// The four IDX files of 24 training and 9 test images, 8×8 gray, 3 classes (class c is a
/// bright band at rows 3c.., plus seeded noise).
fn write_idx_folder(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let [images, labels, test_images, test_labels] = IDX_FILES;
    for (n, images, labels) in [(24, images, labels), (9, test_images, test_labels)] {
        let labels_of: Vec<u8> = (0..n).map(|i| (i % 3) as u8).collect();
        let pixels: Vec<u8> = labels_of
            .iter()
            .flat_map(|&c| {
                (0..64).map(move |p| {
                    if p / 8 / 3 == usize::from(c) {
                        180u8
                    } else {
                        20
                    }
                })
            })
            .map(|v| v + rng.gen_range(0..60u8))
            .collect();
        let idx = |name: &str, dims: &[usize], data: &[u8]| {
            kappa_models::data::write_idx(&dir.join(name), dims, data).unwrap()
        };
        idx(images, &[n, 8, 8], &pixels);
        idx(labels, &[n], &labels_of);
    }
}

/// The files of an IDX folder: training images and labels, test images and labels.
const IDX_FILES: [&str; 4] = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
];

/// Turns a finished run folder into one interrupted after step 2: `run.json`, the report and
/// the summary line go, and the checkpoint says step 2 (`--resume` drops the records after it).
fn interrupt(run: &Path) {
    for f in ["run.json", "report.md", "loss.png", "spectra.png"] {
        let _ = fs::remove_file(run.join(f));
    }
    drop_summaries(&run.join("metrics.jsonl"));
    for key in ["trainer/step", "rng/counter", "optim/step"] {
        edit_checkpoint(run, &Edit::Set(key, 2));
    }
}

/// Removes the summary lines (a finished variant's) from a `metrics.jsonl`.
fn drop_summaries(metrics: &Path) {
    let kept: String = fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .filter(|l| !l.contains("\"summary\""))
        .map(|l| format!("{l}\n"))
        .collect();
    fs::write(metrics, kept).unwrap();
}

/// Marks the run of a `run.json` failed.
fn mark_failed(info: &Path) {
    let mut v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(info).unwrap()).unwrap();
    v["status"] = "failed".into();
    v["error"] = "stopped by the test".into();
    fs::write(info, v.to_string()).unwrap();
}

/// A change to one tensor of a checkpoint.
#[derive(Clone, Debug)]
enum Edit {
    /// A one-element i64 tensor set to the value.
    Set(&'static str, i64),
    /// Every model weight NaN.
    NanWeights,
    /// One entry of [`A_WEIGHT`] +∞.
    InfWeight,
    /// [`A_WEIGHT`] of another shape.
    Reshape,
    /// The tensor removed.
    Drop(&'static str),
}

/// A weight of the GPT's checkpoint (the first block's attention output projection).
const A_WEIGHT: &str = "model/h.0.attn.c_proj.weight";

impl Edit {
    fn apply(&self, name: &str, t: Tensor) -> Option<Tensor> {
        match self {
            Edit::Set(key, v) if name == *key => Some(Tensor::from_slice(&[*v])),
            Edit::NanWeights if name.starts_with("model/") => Some(t.full_like(f64::NAN)),
            Edit::InfWeight if name == A_WEIGHT => {
                let out = t.copy();
                let _ = out.view([-1]).get(0).fill_(f64::INFINITY);
                Some(out)
            }
            Edit::Reshape if name == A_WEIGHT => {
                Some(Tensor::zeros([3, 5], (t.kind(), t.device())))
            }
            Edit::Drop(key) if name == *key => None,
            _ => Some(t),
        }
    }
}

/// Rewrites the checkpoint of variant 0 of `run` with `edit`.
fn edit_checkpoint(run: &Path, edit: &Edit) {
    let path = checkpoint(run);
    let edited: Vec<(String, Tensor)> = Tensor::read_safetensors(&path)
        .unwrap()
        .into_iter()
        .filter_map(|(name, t)| edit.apply(&name, t).map(|t| (name, t)))
        .collect();
    Tensor::write_safetensors(&edited, &path).unwrap();
}

fn checkpoint(run: &Path) -> PathBuf {
    run.join("variant-0/checkpoint.safetensors")
}

/// Copies the tree at `from` to `to` (symbolic links as links; the fixtures have no FIFOs).
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            copy_tree(&src, &dst);
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&src).unwrap(), &dst).unwrap();
        } else {
            fs::copy(&src, &dst).unwrap();
        }
    }
}

/// Copies the file or folder `from` to `to`.
fn copy_entry(from: &Path, to: &Path) {
    if from.is_dir() {
        copy_tree(from, to);
    } else {
        fs::copy(from, to).unwrap();
    }
}

/// A sibling run folder (`runs/other-run/`) and a `sentinel/` folder, which no case may touch.
fn plant_sentinels(dir: &Path) {
    fs::create_dir_all(dir.join("runs/other-run/variant-0")).unwrap();
    fs::write(
        dir.join("runs/other-run/run.json"),
        "{\"another\": \"run\"}",
    )
    .unwrap();
    fs::write(
        dir.join("runs/other-run/variant-0/checkpoint.safetensors"),
        [7u8; 64],
    )
    .unwrap();
    fs::create_dir_all(dir.join("sentinel")).unwrap();
    fs::write(
        dir.join("sentinel/keep.txt"),
        "this file must survive every case",
    )
    .unwrap();
}

fn os(args: &[String]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// `train --config job.toml --out runs --threads 1` and `extra`, run in the case's folder, so
/// that every path in the run folder is relative and a copied folder resumes.
fn train_args(extra: &[&str]) -> Vec<String> {
    strings(
        &[
            &[
                "train",
                "--config",
                "job.toml",
                "--out",
                "runs",
                "--threads",
                "1",
            ],
            extra,
        ]
        .concat(),
    )
}

/// `reproduce` of one `gpt-sotu` smoke unit into `results`, reading `data/`.
fn reproduce_args(results: &str, extra: &[&str]) -> Vec<String> {
    let base = [
        "reproduce",
        "--scale",
        "smoke",
        "--only",
        "gpt-sotu",
        "--seeds",
        "1",
        "--threads",
        "1",
        "--results",
        results,
        "--data",
        "data",
    ];
    strings(&[&base[..], extra].concat())
}

/// `report` of the smoke scale of `gpt-sotu` into `out`, from the results folders `results`.
fn report_args(out: &str, results: &[&str]) -> Vec<String> {
    let base = [
        "report", "--scale", "smoke", "--only", "gpt-sotu", "--seeds", "1", "--out", out,
    ];
    let from = results.iter().flat_map(|r| ["--results", r]);
    strings(&base.into_iter().chain(from).collect::<Vec<_>>())
}

// ---------------------------------------------------------------------------------------------
// Hostile values and files.

/// What a value must do: be refused naming its culprit, be accepted, or either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    Refused,
    Accepted,
    Either,
}

use Rule::{Accepted, Either, Refused};

/// What a case must do, and the folder (relative to the case's) a run it accepts may write.
#[derive(Clone, Debug)]
struct Want {
    rule: Rule,
    culprits: Vec<String>,
    output: String,
}

/// `rule`, naming one of `culprits` when it is an error, writing `output` when it runs.
fn want(rule: Rule, culprits: &[&str], output: &str) -> Want {
    Want {
        rule,
        culprits: culprits.iter().map(|c| c.to_string()).collect(),
        output: output.to_string(),
    }
}

/// An error naming one of `culprits`.
fn refused(culprits: &[&str]) -> Want {
    want(Refused, culprits, "")
}

/// Success, writing `output`.
fn accepted(output: &str) -> Want {
    want(Accepted, &[], output)
}

/// An integer key: what 0 and 10⁹ must do (None: 10⁹ not tried, it is a legitimate run of
/// hours). -1, an integer past i64 and a wrong type are errors everywhere.
type IntKey = (&'static str, Rule, Option<Rule>);

/// The GPT's model keys (the ViT's share their checks).
const GPT_INTS: &[IntKey] = &[
    ("model.vocab_size", Accepted, Some(Refused)),
    ("model.block_size", Refused, Some(Refused)),
    ("model.n_layer", Refused, Some(Refused)),
    ("model.n_head", Refused, Some(Refused)),
    ("model.n_embd", Refused, Some(Refused)),
    ("model.mlp_ratio", Refused, Some(Refused)),
];

/// `[train]` keys: tried on a drawn job, 10⁹ on the GPT (whose evaluation draws batches).
const TRAIN_INTS: &[IntKey] = &[
    ("train.steps", Refused, None),
    ("train.batch_size", Refused, Some(Refused)),
    ("train.warmup_steps", Accepted, Some(Refused)),
    ("train.eval_every", Refused, Some(Either)),
    ("train.eval_batches", Accepted, Some(Refused)),
    ("train.log_every", Refused, Some(Either)),
    ("train.checkpoint_every", Refused, Some(Either)),
    ("train.diagnostics.samples", Refused, Some(Refused)),
    (
        "train.diagnostics.jacobian_max_tokens",
        Accepted,
        Some(Either),
    ),
];

/// The ViT's keys, on the IDX job.
const VIT_INTS: &[IntKey] = &[
    ("model.image_size", Refused, Some(Refused)),
    ("model.channels", Refused, Some(Refused)),
    ("model.patch_size", Refused, Some(Refused)),
    ("model.num_classes", Refused, Some(Refused)),
    ("model.correction.every", Refused, Some(Either)),
    ("data.validation", Refused, Some(Refused)),
    ("data.train_limit", Refused, Some(Accepted)),
    ("data.num_classes", Refused, Some(Refused)),
];

/// A float key: the job it needs (None: drawn), the keys it needs, and what 0, 10⁹ and 10³⁰⁰
/// must do; -1, NaN, ±∞ and strings are errors everywhere.
struct FloatKey {
    key: &'static str,
    kind: Option<Kind>,
    needs: Keys,
    rules: [Rule; 3],
}

const fn float(key: &'static str, rules: [Rule; 3]) -> FloatKey {
    FloatKey {
        key,
        kind: None,
        needs: &[],
        rules,
    }
}

const FLOATS: &[FloatKey] = &[
    float("train.lr", [Refused, Either, Refused]),
    float("train.min_lr", [Accepted, Refused, Refused]),
    float("train.weight_decay", [Accepted, Either, Either]),
    float("train.beta1", [Accepted, Refused, Refused]),
    float("train.beta2", [Accepted, Refused, Refused]),
    float("train.eps", [Refused, Either, Either]),
    float("train.grad_clip", [Accepted, Either, Either]),
    float("train.divergence_factor", [Refused, Either, Either]),
    FloatKey {
        kind: Some(Kind::Gpt),
        ..float("data.validation_fraction", [Refused, Refused, Refused])
    },
    FloatKey {
        kind: Some(Kind::Gpt),
        ..float("model.correction.lambda", [Accepted, Either, Either])
    },
    FloatKey {
        kind: Some(Kind::Gpt),
        needs: MODULEWISE,
        ..float("optimizer.muon_lr", [Refused, Either, Refused])
    },
    FloatKey {
        needs: QK_CLIP,
        ..float("train.qk_clip.tau", [Refused, Either, Either])
    },
    FloatKey {
        needs: QK_CLIP,
        ..float("train.qk_clip.alpha", [Accepted, Refused, Refused])
    },
];

/// Values of the wrong type for a number.
const WRONG_TYPES: &[&str] = &[
    "\"ten\"",
    "true",
    "[1, 2]",
    "{ a = 1 }",
    "\"NaN\"",
    "2024-01-01",
];

/// Past TOML's i64.
const TOO_LARGE: &str = "99999999999999999999999";

/// Names of kinds and booleans that do not exist: (job, key, value, keys it needs).
const BAD_NAMES: &[(Kind, &str, &str, Keys)] = &[
    (Kind::Gpt, "data.kind", "\"csv\"", &[]),
    (Kind::Gpt, "model.kind", "\"rnn\"", &[]),
    (Kind::Png, "model.scaling", "\"loud\"", &[]),
    (Kind::Gpt, "model.correction.kind", "\"magic\"", &[]),
    (Kind::Gpt, "model.correction.layout", "\"diagonal\"", &[]),
    (Kind::Idx, "train.precision", "\"f8\"", &[]),
    (Kind::Png, "train.divergence_reference", "\"worst\"", &[]),
    (Kind::Gpt, "optimizer.kind", "\"sgd\"", &[]),
    (Kind::Gpt, "optimizer.preset", "\"NOPE\"", MODULEWISE),
    (Kind::Idx, "data.normalize", "\"zscore\"", &[]),
    (Kind::Gpt, "model.bias", "\"yes\"", &[]),
    (Kind::Idx, "model.fused_kernel", "1", &[]),
    (Kind::Png, "train.eval_at_start", "\"no\"", &[]),
    (Kind::Gpt, "train.diagnostics.enabled", "0", &[]),
    (Kind::Gpt, "name", "42", &[]),
];

/// What a file can be instead of a readable one.
#[derive(Clone, Debug)]
enum Damage {
    /// A regular file of these bytes.
    Bytes(Vec<u8>),
    Folder,
    Fifo,
    /// A symbolic link to itself.
    LinkLoop,
    /// A symbolic link to a device (`/dev/zero`: endless).
    LinkTo(&'static str),
    Missing,
}

impl Damage {
    /// Replaces whatever is at `path` by the damage.
    fn apply(&self, path: &Path) {
        match fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(path).unwrap(),
            Ok(_) => fs::remove_file(path).unwrap(),
            Err(_) => {}
        }
        match self {
            Damage::Bytes(bytes) => fs::write(path, bytes).unwrap(),
            Damage::Folder => fs::create_dir(path).unwrap(),
            Damage::Fifo => fifo(path).unwrap(),
            Damage::LinkLoop => symlink_loop(path).unwrap(),
            Damage::LinkTo(target) => std::os::unix::fs::symlink(target, path).unwrap(),
            Damage::Missing => {}
        }
    }
}

/// The damage any file can take without its bytes: not a file, or not there.
fn not_a_file() -> Vec<(&'static str, Damage)> {
    vec![
        ("a folder", Damage::Folder),
        ("a FIFO", Damage::Fifo),
        ("a link to itself", Damage::LinkLoop),
        ("missing", Damage::Missing),
    ]
}

/// Culprits for `key`: the dotted key; for `name`, forms that a message about a file name
/// ("File name too long") does not contain.
fn culprits_of(key: &str) -> Vec<&str> {
    match key {
        "name" => vec!["name:", "`name`", "name ="],
        _ => vec![key],
    }
}

/// An IDX file of element type `type_code`, `dims` and `body`.
fn idx(type_code: u8, dims: &[u32], body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0, 0, type_code, dims.len() as u8];
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.extend_from_slice(body);
    bytes
}

/// Hostile IDX headers and bodies: (what, file, bytes, culprits); the first is the one a defect
/// was seen with.
fn idx_headers() -> Vec<(&'static str, &'static str, Vec<u8>, Vec<&'static str>)> {
    let [img, lab, test, _] = IDX_FILES;
    let px = |n: usize| vec![100u8; n];
    // One row a line: the table reads as a list.
    #[rustfmt::skip]
    let rows = vec![
        ("dimensions whose product passes 2^64", img, idx(8, &[u32::MAX; 3], &px(64)), ""),
        ("10^15 bytes claimed", img, idx(8, &[100_000; 3], &px(64)), ""),
        ("u32::MAX images claimed", test, idx(8, &[u32::MAX, 8, 8], &px(64)), ""),
        ("zero images", img, idx(8, &[0, 8, 8], &[]), "data.validation"),
        ("no dimensions", lab, idx(8, &[], &[]), ""),
        ("255 dimensions, the header cut", img, vec![0, 0, 8, 255, 0, 0, 0, 1], ""),
        ("8×9 images", img, idx(8, &[24, 8, 9], &px(24 * 72)), ""),
        ("images of one dimension", img, idx(8, &[24 * 64], &px(24 * 64)), ""),
        ("10×10 test images", test, idx(8, &[9, 10, 10], &px(900)), ""),
        ("23 labels for 24 images", lab, idx(8, &[23], &[0; 23]), ""),
        ("a label of 200", lab, idx(8, &[24], &[200; 24]), "model.num_classes"),
        ("float elements (0x0D)", img, idx(13, &[24, 8, 8], &px(24 * 256)), ""),
    ];
    let culprits =
        |file, key: &'static str| [file, key].into_iter().filter(|c: &&str| !c.is_empty());
    rows.into_iter()
        .map(|(what, file, bytes, key)| (what, file, bytes, culprits(file, key).collect()))
        .collect()
}

/// `height` PNG scanlines of `width` pixels of `bytes` bytes each: a filter byte (0, none) and
/// varied samples.
fn scanlines(width: u32, height: u32, bytes: u32) -> Vec<u8> {
    (0..height)
        .flat_map(|r| {
            std::iter::once(0)
                .chain((0..width * bytes).map(move |i| ((r * 31 + i * 37) % 251) as u8))
        })
        .collect()
}

/// A PNG of `side`×`side` pixels of colour type `colour` and `bytes` bytes a pixel.
fn png(side: u32, depth: u8, colour: u8, bytes: u32) -> Vec<u8> {
    png_bytes(
        (side, side),
        depth,
        colour,
        &[],
        &zlib(&scanlines(side, side, bytes)),
    )
}

/// Hostile PNG files besides the two tried always: (what, file name in `train/ant/`, bytes).
fn hostile_pngs(valid: &[u8], garbage: Vec<u8>) -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut bad_crc = valid.to_vec();
    let at = bad_crc.len() - 20;
    bad_crc[at] ^= 0x55;
    let not_square = png_bytes((8, 9), 8, 2, &[], &zlib(&scanlines(8, 9, 3)));
    vec![
        ("cut in half", "001.png", valid[..valid.len() / 2].to_vec()),
        ("cut after its header", "001.png", valid[..33].to_vec()),
        ("colour type 5", "002.png", png(8, 8, 5, 3)),
        ("RGB of 4 bits", "002.png", png(8, 4, 2, 3)),
        ("0×0", "002.png", png_bytes((0, 0), 8, 2, &[], &zlib(&[]))),
        ("a bad CRC", "003.png", bad_crc),
        ("random bytes", "003.png", garbage),
        ("empty", "003.png", Vec::new()),
        ("16×16 among 8×8", "003.png", png(16, 8, 2, 3)),
        ("8×9", "003.png", not_square),
        ("gray among RGB", "003.png", png(8, 8, 0, 1)),
        (
            "text named .png",
            "004.png",
            b"a picture of an ant".to_vec(),
        ),
        ("not a .png", "notes.txt", b"ants are small".to_vec()),
    ]
}

/// `--set` values for `reproduce` and the key each must name.
const REPRODUCE_SETS: &[(&str, &str)] = &[
    ("train.lr=1e300", "train.lr"),
    ("train.lr=nan", "train.lr"),
    ("model.n_layer=1000000000", "model.n_layer"),
    ("model.n_layer=-1", "model.n_layer"),
    ("model.block_size=1000000000", "model.block_size"),
    ("model.n_embd=1000000000", "model.n_embd"),
    ("model.vocab_size=1000000000", "model.vocab_size"),
    ("train.batch_size=1000000000", "train.batch_size"),
    ("train.eval_batches=1000000000", "train.eval_batches"),
    (
        "train.diagnostics.samples=1000000000",
        "train.diagnostics.samples",
    ),
    ("train.steps=0", "train.steps"),
    ("train.checkpoint_every=0", "train.checkpoint_every"),
    ("final_eval_batches=1000000000", "final_eval_batches"),
    ("tokenizer=klingon", "tokenizer"),
    ("max_chars=0", "max_chars"),
    (
        "variants.1.correction.lambda=nan",
        "variants.1.correction.lambda",
    ),
    ("variants.0.correction.kind=magic", "variants.0.correction"),
    ("train.steps=99999999999999999999", "train.steps"),
];

// ---------------------------------------------------------------------------------------------
// The generator.

struct Gen<'a> {
    rng: ChaCha8Rng,
    root: PathBuf,
    fixtures: &'a Fixtures,
    group: &'static str,
    cases: Vec<Case>,
}

impl<'a> Gen<'a> {
    /// Every case, in a fixed order drawn from [`SEED`].
    fn all_cases(root: &Path, fixtures: &'a Fixtures) -> Vec<Case> {
        let mut gen = Self {
            rng: ChaCha8Rng::seed_from_u64(SEED),
            root: root.join("cases"),
            fixtures,
            group: "",
            cases: Vec::new(),
        };
        gen.int_keys();
        gen.float_keys();
        gen.seen_values();
        gen.names_of_kinds();
        gen.unknown_and_missing_keys();
        gen.syntax();
        gen.config_files();
        gen.bad_run_names();
        gen.legal_run_names();
        gen.out_folders();
        gen.existing_run_folders();
        gen.text_data();
        gen.legal_texts();
        gen.idx_headers();
        gen.idx_files();
        gen.png_files();
        gen.png_entries();
        gen.png_folders();
        gen.resume_legitimate();
        gen.resume_checkpoints();
        gen.resume_checkpoint_values();
        gen.resume_files();
        gen.resume_changes();
        gen.reproduce_values();
        gen.reproduce_configs();
        gen.reproduce_data();
        gen.reproduce_results();
        gen.reproduce_resume();
        gen.report_inputs();
        gen.report_merges();
        gen.cases
    }

    /// A new, empty case folder.
    fn folder(&mut self) -> PathBuf {
        let dir = self.root.join(format!("{:03}", self.cases.len()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// `n` of `items`, drawn, in their order.
    fn drawn<T>(&mut self, items: Vec<T>, n: usize) -> Vec<T> {
        let mut chosen = index::sample(&mut self.rng, items.len(), n.min(items.len())).into_vec();
        chosen.sort_unstable();
        let mut items: Vec<Option<T>> = items.into_iter().map(Some).collect();
        chosen.into_iter().filter_map(|i| items[i].take()).collect()
    }

    /// The first `pinned` of `items` (the inputs a defect was seen with), and `n` of the others
    /// drawn.
    fn pinned_and_drawn<T>(&mut self, mut items: Vec<T>, pinned: usize, n: usize) -> Vec<T> {
        let others = items.split_off(pinned);
        items.extend(self.drawn(others, n));
        items
    }

    fn garbage(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.rng.gen()).collect()
    }

    fn any_kind(&mut self) -> Kind {
        *Kind::ALL.choose(&mut self.rng).unwrap()
    }

    /// Adds the case running `args` in `dir`.
    fn add(&mut self, label: impl Into<String>, dir: &Path, args: Vec<String>, want: Want) {
        let case = Case::new(self.group, label, dir).args(args);
        let output = dir.join(&want.output);
        let case = match want.rule {
            Refused => case.error(want.culprits),
            Accepted => case.accepted().output(output),
            Either => case.either(want.culprits).output(output),
        };
        self.cases.push(case);
    }

    /// A case folder for a `train` of `kind`: the data, `job.toml` from `job`, and sentinels.
    fn train_folder(&mut self, kind: Kind, job: &Job) -> PathBuf {
        let dir = self.folder();
        copy_entry(
            &self.fixtures.data.join(kind.data()),
            &dir.join(kind.data()),
        );
        fs::write(dir.join("job.toml"), job.text()).unwrap();
        plant_sentinels(&dir);
        dir
    }

    /// A `train` case of `kind` with `job` and `extra` arguments.
    fn train(
        &mut self,
        label: impl Into<String>,
        kind: Kind,
        job: &Job,
        extra: &[&str],
        want: Want,
    ) {
        let dir = self.train_folder(kind, job);
        self.add(label, &dir, train_args(extra), want);
    }

    /// A `train` of `kind`'s own job whose entry `rel` (in the case folder) takes `damage`: an
    /// error naming one of `culprits`.
    fn damaged(
        &mut self,
        label: String,
        kind: Kind,
        rel: &str,
        damage: &Damage,
        culprits: &[&str],
    ) {
        let dir = self.train_folder(kind, &kind.job());
        damage.apply(&dir.join(rel));
        self.add(label, &dir, train_args(&[]), refused(culprits));
    }

    /// `value` for `key` in the job of `kind` (with `needs`), written into the file or given
    /// as `--set` (drawn).
    fn value(&mut self, kind: Kind, key: &str, value: &str, rule: Rule, needs: &[(&str, &str)]) {
        let job = kind.job().with(needs);
        let want = want(rule, &culprits_of(key), &run_of(kind));
        if self.rng.gen_bool(0.5) {
            let set = format!("{key}={value}");
            let label = format!("{} --set {set}", kind.label());
            self.train(label, kind, &job, &["--set", &set], want);
        } else {
            let label = format!("{} {key} = {value}", kind.label());
            self.train(label, kind, &job.set(key, value), &[], want);
        }
    }

    /// Integer keys: 0 and 10⁹ each, and for a drawn half -1, a too-large integer or a wrong
    /// type (drawn).
    fn int_keys(&mut self) {
        self.group = "config: integers";
        let keys = GPT_INTS.iter().map(|k| (k, Some(Kind::Gpt)));
        let keys = keys.chain(TRAIN_INTS.iter().map(|k| (k, None)));
        let keys: Vec<_> = keys
            .chain(VIT_INTS.iter().map(|k| (k, Some(Kind::Idx))))
            .collect();
        for ((key, zero, huge), kind) in keys {
            let small = kind.unwrap_or_else(|| self.any_kind());
            self.value(small, key, "0", *zero, &[]);
            if let Some(huge) = huge {
                self.value(kind.unwrap_or(Kind::Gpt), key, "1000000000", *huge, &[]);
            }
            if self.rng.gen_bool(0.5) {
                let bad = match self.rng.gen_range(0..3) {
                    0 => "-1",
                    1 => TOO_LARGE,
                    _ => *WRONG_TYPES.choose(&mut self.rng).unwrap(),
                };
                self.value(small, key, bad, Refused, &[]);
            }
        }
    }

    /// Float keys: one of -1, NaN, ±∞ or a string, and one of 0, 10⁹ or 10³⁰⁰ (drawn).
    fn float_keys(&mut self) {
        self.group = "config: floats";
        for k in FLOATS {
            let kind = k.kind.unwrap_or_else(|| self.any_kind());
            let bad = ["-1.0", "nan", "inf", "-inf", "\"NaN\"", "\"fast\""];
            let bad = *bad.choose(&mut self.rng).unwrap();
            self.value(kind, k.key, bad, Refused, k.needs);
            let i = self.rng.gen_range(0..3);
            self.value(kind, k.key, ["0.0", "1e9", "1e300"][i], k.rules[i], k.needs);
        }
    }

    /// The values the defects were first seen with, whatever the draws.
    fn seen_values(&mut self) {
        self.group = "config: seen before";
        let gpt = Kind::Gpt.job();
        let set = ["--set", "model.n_layer=-1"];
        let n_layer = refused(&["model.n_layer"]);
        self.train("GPT --set model.n_layer=-1", Kind::Gpt, &gpt, &set, n_layer);
        for (key, value) in [
            ("train.lr", "1e300"),
            ("train.steps", TOO_LARGE),
            ("data.tokenizer", "\"klingon\""),
        ] {
            let job = gpt.clone().set(key, value);
            self.train(
                format!("GPT {key} = {value}"),
                Kind::Gpt,
                &job,
                &[],
                refused(&[key]),
            );
        }
    }

    /// Kinds and booleans that do not exist, and models on the wrong data.
    fn names_of_kinds(&mut self) {
        self.group = "config: names of kinds";
        for (kind, key, value, needs) in self.drawn(BAD_NAMES.to_vec(), 8) {
            self.value(kind, key, value, Refused, needs);
        }
        let data_kind = refused(&["data.kind"]);
        let gpt_on_idx = Kind::Gpt.job().remove("data").with(&IDX_JOB[1..5]);
        self.train(
            "GPT on IDX images",
            Kind::Gpt,
            &gpt_on_idx,
            &[],
            data_kind.clone(),
        );
        let vit_on_text = Kind::Png.job().remove("data").with(&GPT_JOB[1..4]);
        self.train("ViT on text", Kind::Png, &vit_on_text, &[], data_kind);
        let modulewise = Kind::Idx.job().with(MODULEWISE);
        let optimizer = refused(&["optimizer.kind"]);
        self.train(
            "ViT with a module-wise optimizer",
            Kind::Idx,
            &modulewise,
            &[],
            optimizer,
        );
    }

    /// Keys the config does not have, and keys it lacks (drawn).
    fn unknown_and_missing_keys(&mut self) {
        self.group = "config: keys and syntax";
        let unknown = vec![
            (Kind::Gpt, "train.lrr"),
            (Kind::Gpt, "model.n_layers"),
            (Kind::Idx, "data.dirr"),
            (Kind::Png, "nmae"),
            (Kind::Gpt, "train.diagnostics.sample"),
            (Kind::Gpt, "model.correction.lamda"),
        ];
        for (kind, key) in self.drawn(unknown, 4) {
            self.value(kind, key, "1", Refused, &[]);
        }
        let missing = vec![
            (Kind::Gpt, "name"),
            (Kind::Gpt, "train.lr"),
            (Kind::Idx, "model.n_head"),
            (Kind::Gpt, "data.path"),
            (Kind::Png, "data.validation"),
            (Kind::Gpt, "model.correction.lambda"),
            (Kind::Png, "train"),
        ];
        for (kind, key) in self.drawn(missing, 5) {
            let tick = format!("`{}`", key.rsplit('.').next().unwrap());
            let label = format!("{} without {key}", kind.label());
            self.train(
                label,
                kind,
                &kind.job().remove(key),
                &[],
                refused(&[key, &tick]),
            );
        }
    }

    /// Job files that are not TOML.
    fn syntax(&mut self) {
        self.group = "config: keys and syntax";
        let text = Kind::Gpt.job().text();
        let twice = text.replace("lr = 3e-3\n", "lr = 3e-3\nlr = 1e-3\n");
        let unterminated = text.replace("\"char\"", "\"char");
        let not_toml = text.replace("[model]\n", "[model]\nnot toml\n");
        for (label, text, culprits) in [
            ("a key given twice", twice, vec!["train.lr", "`lr`"]),
            ("an unterminated string", unterminated, vec!["job.toml"]),
            ("a line that is not TOML", not_toml, vec!["job.toml"]),
        ] {
            let label = format!("GPT job with {label}");
            self.damaged(
                label,
                Kind::Gpt,
                "job.toml",
                &Damage::Bytes(text.into()),
                &culprits,
            );
        }
    }

    /// The job file itself.
    fn config_files(&mut self) {
        self.group = "config: the file";
        let mut not_utf8 = Kind::Gpt.job().text().into_bytes();
        not_utf8.splice(10..10, [0xff, 0xfe, 0xc0]);
        let mut damages = vec![
            ("empty", Damage::Bytes(Vec::new())),
            ("random bytes", Damage::Bytes(self.garbage(4096))),
            ("not UTF-8", Damage::Bytes(not_utf8)),
            ("a link to /dev/zero", Damage::LinkTo("/dev/zero")),
        ];
        damages.extend(not_a_file());
        for (label, damage) in damages {
            let label = format!("job.toml is {label}");
            self.damaged(label, Kind::Gpt, "job.toml", &damage, &["job.toml"]);
        }
    }

    /// Run names that are not a plain file-name component.
    fn bad_run_names(&mut self) {
        self.group = "run names";
        let names = [
            ("..", "\"..\"".to_string()),
            (".", "\".\"".to_string()),
            ("empty", "\"\"".to_string()),
            ("a/b", "\"a/b\"".to_string()),
            ("a\\b", "\"a\\\\b\"".to_string()),
            ("with a NUL", "\"a\\u0000b\"".to_string()),
            ("of 256 bytes", format!("\"{}\"", "x".repeat(256))),
            ("of 5 MB", format!("\"{}\"", "n".repeat(5 << 20))),
        ];
        for (label, name) in names {
            let job = Kind::Gpt.job().set("name", &name);
            self.train(
                format!("name {label}"),
                Kind::Gpt,
                &job,
                &[],
                refused(&culprits_of("name")),
            );
        }
        // An absolute name: a run folder outside --out (inside the case's folder).
        let dir = self.train_folder(Kind::Gpt, &Kind::Gpt.job());
        let name = format!("{:?}", dir.join("elsewhere").display().to_string());
        let job = Damage::Bytes(Kind::Gpt.job().set("name", &name).text().into_bytes());
        job.apply(&dir.join("job.toml"));
        let label = "name an absolute path";
        self.add(label, &dir, train_args(&[]), refused(&culprits_of("name")));
    }

    /// Run names that are plain file-name components, however odd.
    fn legal_run_names(&mut self) {
        self.group = "run names";
        for (label, name, rule) in [
            ("of 255 bytes", "y".repeat(255), Accepted),
            ("κ-run ✓", "κ-run ✓".to_string(), Accepted),
            ("...", "...".to_string(), Either),
        ] {
            let job = Kind::Gpt.job().set("name", &format!("{name:?}"));
            let want = want(rule, &culprits_of("name"), &format!("runs/{name}"));
            self.train(format!("name {label}"), Kind::Gpt, &job, &[], want);
        }
    }

    /// `--out` that is no folder, and a run folder that would be the data.
    fn out_folders(&mut self) {
        self.group = "run folders";
        let not_a_folder = Damage::Bytes(b"not a folder".to_vec());
        for (label, damage) in [
            ("a file", not_a_folder),
            ("a link to itself", Damage::LinkLoop),
        ] {
            let dir = self.train_folder(Kind::Gpt, &Kind::Gpt.job());
            damage.apply(&dir.join("out-here"));
            let args = strings(&["train", "--config", "job.toml", "--out", "out-here"]);
            self.add(
                format!("--out is {label}"),
                &dir,
                args,
                refused(&["out-here"]),
            );
        }
        for kind in [Kind::Gpt, Kind::Png] {
            let job = kind.job().set("name", &format!("{:?}", kind.data()));
            let dir = self.train_folder(kind, &job);
            let args = strings(&[
                "train",
                "--config",
                "job.toml",
                "--out",
                ".",
                "--threads",
                "1",
            ]);
            let label = format!("{} run named like its data, --out .", kind.label());
            self.add(label, &dir, args, refused(&[kind.data()]));
        }
    }

    /// A run folder there already: an error without `--resume` or `--fresh`; `--fresh` starts
    /// over deleting only what a run writes.
    fn existing_run_folders(&mut self) {
        self.group = "run folders";
        let run = refused(&["runs/tiny-gpt"]);
        let dir = self.copy_fixture(&self.fixtures.finished.clone());
        self.add(
            "train over a finished run folder",
            &dir,
            train_args(&[]),
            run.clone(),
        );
        let dir = self.train_folder(Kind::Gpt, &Kind::Gpt.job());
        fs::create_dir_all(dir.join("runs/tiny-gpt")).unwrap();
        fs::write(dir.join("runs/tiny-gpt/notes.txt"), "mine").unwrap();
        self.add(
            "train over a folder holding a user's file",
            &dir,
            train_args(&[]),
            run,
        );
        let dir = self.copy_fixture(&self.fixtures.finished.clone());
        fs::write(dir.join("runs/tiny-gpt/notes.txt"), "mine").unwrap();
        let label = "--fresh over a finished run folder with a user's file";
        self.add(
            label,
            &dir,
            train_args(&["--fresh"]),
            accepted("runs/tiny-gpt"),
        );
        self.keep_last("runs/tiny-gpt/notes.txt");
        let dir = self.train_folder(Kind::Gpt, &Kind::Gpt.job());
        let label = "--fresh with no run folder yet";
        self.add(
            label,
            &dir,
            train_args(&["--fresh"]),
            accepted("runs/tiny-gpt"),
        );
    }

    /// Requires `rel`, in the last case's folder, to survive that case unchanged.
    fn keep_last(&mut self, rel: &str) {
        let case = self.cases.pop().unwrap();
        let path = case.dir.join(rel);
        self.cases.push(case.keep(path));
    }

    /// A copy of a fixture's case folder, with sentinels, in a new case folder.
    fn copy_fixture(&mut self, fixture: &Path) -> PathBuf {
        let dir = self.folder();
        copy_tree(fixture, &dir);
        plant_sentinels(&dir);
        dir
    }

    /// The GPT's text file, unreadable or too short.
    fn text_data(&mut self) {
        self.group = "data: text";
        let mut ff = fs::read(self.fixtures.data.join("input.txt")).unwrap();
        ff.insert(1000, 0xff);
        let mut bad = vec![
            ("empty", Damage::Bytes(Vec::new())),
            ("one character", Damage::Bytes(b"a".to_vec())),
            ("random bytes", Damage::Bytes(self.garbage(3000))),
            ("text with a 0xFF byte", Damage::Bytes(ff)),
            ("a link to /dev/zero", Damage::LinkTo("/dev/zero")),
        ];
        bad.extend(not_a_file());
        for (label, damage) in bad {
            let label = format!("input.txt is {label}");
            self.damaged(label, Kind::Gpt, "input.txt", &damage, &["input.txt"]);
        }
        let short = Damage::Bytes(b"twenty characters!!!".to_vec());
        let culprits = ["input.txt", "model.block_size"];
        let label = "input.txt shorter than a block".into();
        self.damaged(label, Kind::Gpt, "input.txt", &short, &culprits);
    }

    /// Texts that are odd but legitimate.
    fn legal_texts(&mut self) {
        self.group = "data: text";
        let controls: String = (0..3000)
            .map(|_| char::from(self.rng.gen_range(1..32u8)))
            .collect();
        let cjk = (0..6000).map(|_| self.rng.gen_range(0x4e00..0x4e00 + 3000u32));
        let cjk: String = cjk.map(|c| char::from_u32(c).unwrap()).collect();
        for (label, text) in [
            ("control characters", controls),
            ("3000 CJK characters", cjk),
        ] {
            let dir = self.train_folder(Kind::Gpt, &Kind::Gpt.job());
            fs::write(dir.join("input.txt"), text).unwrap();
            let label = format!("input.txt of {label}");
            self.add(label, &dir, train_args(&[]), accepted("runs/tiny-gpt"));
        }
        let bpe = Kind::Gpt.job().set("data.tokenizer", "\"gpt2_bpe\"");
        self.train(
            "GPT-2 BPE tokens",
            Kind::Gpt,
            &bpe,
            &[],
            accepted("runs/tiny-gpt"),
        );
    }

    /// Hostile IDX headers and bodies: the one seen overflowing always, others drawn.
    fn idx_headers(&mut self) {
        self.group = "data: IDX";
        for (label, file, bytes, culprits) in self.pinned_and_drawn(idx_headers(), 1, 9) {
            let (rel, damage) = (format!("fmnist/{file}"), Damage::Bytes(bytes));
            self.damaged(
                format!("{file}: {label}"),
                Kind::Idx,
                &rel,
                &damage,
                &culprits,
            );
        }
    }

    /// Damage to a drawn IDX file of the four (drawn), and a folder that is a file.
    fn idx_files(&mut self) {
        self.group = "data: IDX";
        let mut damages = vec!["short body", "long body", "empty", "text"];
        damages.extend(not_a_file().into_iter().map(|(label, _)| label));
        for label in self.drawn(damages, 6) {
            let file = *IDX_FILES.choose(&mut self.rng).unwrap();
            let original = fs::read(self.fixtures.data.join("fmnist").join(file)).unwrap();
            let damage = match label {
                "short body" => Damage::Bytes(original[..original.len() - 7].to_vec()),
                "long body" => Damage::Bytes([original, vec![1; 5]].concat()),
                "empty" => Damage::Bytes(Vec::new()),
                "text" => Damage::Bytes(b"images, honestly\n".to_vec()),
                other => {
                    not_a_file()
                        .into_iter()
                        .find(|(l, _)| *l == other)
                        .unwrap()
                        .1
                }
            };
            let rel = format!("fmnist/{file}");
            self.damaged(
                format!("{file}: {label}"),
                Kind::Idx,
                &rel,
                &damage,
                &[file],
            );
        }
        let file = Damage::Bytes(b"a file".to_vec());
        self.damaged(
            "data.dir is a file".into(),
            Kind::Idx,
            "fmnist",
            &file,
            &["fmnist"],
        );
    }

    /// Hostile PNG files in `train/ant/`: the huge header and the inflate bomb always, others
    /// drawn.
    fn png_files(&mut self) {
        self.group = "data: PNG folder";
        let valid = fs::read(self.fixtures.data.join("images/train/ant/000.png")).unwrap();
        let garbage = self.garbage(2000);
        let huge_header = png_bytes((60_000, 60_000), 16, 6, &[], &zlib(&[0; 64]));
        let mut files = vec![
            ("a 60000×60000 RGBA16 header", "002.png", huge_header),
            (
                "an inflate bomb of 20000×20000",
                "000.png",
                self.fixtures.bomb.clone(),
            ),
        ];
        files.extend(self.drawn(hostile_pngs(&valid, garbage), 8));
        for (label, name, bytes) in files {
            let rel = format!("images/train/ant/{name}");
            let label = format!("train/ant/{name}: {label}");
            self.damaged(label, Kind::Png, &rel, &Damage::Bytes(bytes), &[name]);
        }
    }

    /// Image entries that are no file, and two legitimate oddities: a palette image (expanded
    /// to RGB) and a 16-bit image among 8-bit ones.
    fn png_entries(&mut self) {
        self.group = "data: PNG folder";
        let rel = "images/train/bee/009.png";
        for (label, damage) in not_a_file().into_iter().take(3) {
            self.damaged(
                format!("{rel} is {label}"),
                Kind::Png,
                rel,
                &damage,
                &["009.png"],
            );
        }
        let palette: Vec<u8> = (0..4u8).flat_map(|i| [i * 60, 255 - i * 60, 90]).collect();
        let rows =
            (0..8u8).flat_map(|r| std::iter::once(0).chain((0..8).map(move |c| (r + c) % 4)));
        let indexed = png_bytes(
            (8, 8),
            8,
            3,
            &[(*b"PLTE", palette)],
            &zlib(&rows.collect::<Vec<_>>()),
        );
        for (label, bytes) in [
            ("a palette image", indexed),
            ("a 16-bit RGB image", png(8, 16, 2, 6)),
        ] {
            let dir = self.train_folder(Kind::Png, &Kind::Png.job());
            fs::write(dir.join(rel), bytes).unwrap();
            self.add(
                format!("{rel}: {label}"),
                &dir,
                train_args(&[]),
                accepted("runs/tiny-vit-png"),
            );
        }
    }

    /// Folders of a PNG image folder that are wrong.
    fn png_folders(&mut self) {
        self.group = "data: PNG folder";
        let cases: [(&str, &str, Change); 5] = [
            ("an empty class folder", "cow", |d| {
                fs::create_dir(d.join("train/cow")).unwrap()
            }),
            ("no class folders", "images/train", |d| {
                fs::remove_dir_all(d.join("train")).unwrap();
                fs::create_dir(d.join("train")).unwrap();
            }),
            ("no test folder", "images/test", |d| {
                fs::remove_dir_all(d.join("test")).unwrap()
            }),
            ("a test class that train lacks", "zebra", |d| {
                fs::create_dir(d.join("test/zebra")).unwrap();
                fs::copy(d.join("test/ant/000.png"), d.join("test/zebra/000.png")).unwrap();
            }),
            ("a file beside the class folders", "README", |d| {
                fs::write(d.join("train/README"), "ants").unwrap()
            }),
        ];
        for (label, culprit, make) in cases {
            let dir = self.train_folder(Kind::Png, &Kind::Png.job());
            make(&dir.join("images"));
            self.add(
                format!("images/ with {label}"),
                &dir,
                train_args(&[]),
                refused(&[culprit]),
            );
        }
    }

    /// A copy of the interrupted (or `finished`) GPT run, changed by `change`, resumed with
    /// `extra` arguments.
    fn resume(
        &mut self,
        label: &str,
        finished: bool,
        extra: &[&str],
        want: Want,
        change: impl FnOnce(&Path),
    ) {
        let fixture = if finished {
            &self.fixtures.finished
        } else {
            &self.fixtures.interrupted
        };
        let dir = self.copy_fixture(&fixture.clone());
        change(&dir.join("runs/tiny-gpt"));
        self.add(
            label,
            &dir,
            train_args(&[&["--resume"], extra].concat()),
            want,
        );
    }

    /// Run folders `--resume` continues (or keeps).
    fn resume_legitimate(&mut self) {
        self.group = "train --resume";
        let ok = || accepted("runs/tiny-gpt");
        self.resume("an interrupted run continues", false, &[], ok(), |_| {});
        self.resume("a finished run is kept", true, &[], ok(), |_| {});
        self.resume(
            "a torn last line of metrics.jsonl is dropped",
            false,
            &[],
            ok(),
            |run| {
                let path = run.join("metrics.jsonl");
                let text = fs::read_to_string(&path).unwrap();
                fs::write(&path, format!("{text}{{\"variant\":\"tiny-gpt\",\"rec")).unwrap();
            },
        );
        self.resume("a failed run continues", true, &[], ok(), |run| {
            mark_failed(&run.join("run.json"));
            drop_summaries(&run.join("metrics.jsonl"));
        });
    }

    /// Checkpoints that are no safetensors file: refused naming the file, the folder as it was.
    fn resume_checkpoints(&mut self) {
        self.group = "train --resume";
        let ck = refused(&["checkpoint.safetensors"]);
        let mut damages = vec![("random bytes", Damage::Bytes(self.garbage(3000)))];
        damages.push(("empty", Damage::Bytes(Vec::new())));
        damages.extend(not_a_file().into_iter().take(3));
        for (label, damage) in damages {
            let label = format!("checkpoint is {label}");
            self.resume(&label, false, &[], ck.clone(), |run| {
                damage.apply(&checkpoint(run))
            });
        }
        self.resume("checkpoint cut in half", false, &[], ck, |run| {
            let bytes = fs::read(checkpoint(run)).unwrap();
            fs::write(checkpoint(run), &bytes[..bytes.len() / 2]).unwrap();
        });
        // Without a checkpoint the variant may start over, but never lose the folder.
        let either = want(Either, &["checkpoint.safetensors"], "runs/tiny-gpt");
        self.resume(
            "no checkpoint beside the records",
            false,
            &[],
            either,
            |run| fs::remove_file(checkpoint(run)).unwrap(),
        );
    }

    /// Checkpoints whose values are wrong: refused naming the file, the folder as it was.
    fn resume_checkpoint_values(&mut self) {
        self.group = "train --resume";
        for (label, edit) in [
            ("at step 1000 of 4", Edit::Set("trainer/step", 1000)),
            ("at step -1", Edit::Set("trainer/step", -1)),
            ("with rng/counter -1", Edit::Set("rng/counter", -1)),
            ("of another seed", Edit::Set("rng/seed", 7)),
            ("of NaN weights", Edit::NanWeights),
            ("with a weight +inf", Edit::InfWeight),
            ("with a weight of another shape", Edit::Reshape),
            ("without trainer/step", Edit::Drop("trainer/step")),
            (
                "whose optimizer is at another step",
                Edit::Set("optim/step", 3),
            ),
            ("without the optimizer's step", Edit::Drop("optim/step")),
        ] {
            let ck = refused(&["checkpoint.safetensors"]);
            let label = format!("checkpoint {label}");
            self.resume(&label, false, &[], ck, |run| edit_checkpoint(run, &edit));
        }
    }

    /// `config.toml`, `metrics.jsonl` and `run.json` that `--resume` must refuse: the ones seen
    /// wiping a folder or dropping records always, others drawn.
    fn resume_files(&mut self) {
        self.group = "train --resume";
        let metrics = self
            .fixtures
            .interrupted
            .join("runs/tiny-gpt/metrics.jsonl");
        let mut not_utf8 = fs::read(metrics).unwrap();
        not_utf8.splice(40..40, [0xff, 0xc0]);
        let damages = vec![
            ("config.toml", "a link to itself", Damage::LinkLoop),
            ("metrics.jsonl", "empty", Damage::Bytes(Vec::new())),
            ("metrics.jsonl", "missing", Damage::Missing),
            ("config.toml", "a folder", Damage::Folder),
            (
                "config.toml",
                "random bytes",
                Damage::Bytes(self.garbage(2000)),
            ),
            ("config.toml", "empty", Damage::Bytes(Vec::new())),
            ("config.toml", "a FIFO", Damage::Fifo),
            ("metrics.jsonl", "a folder", Damage::Folder),
            ("metrics.jsonl", "not UTF-8", Damage::Bytes(not_utf8)),
            ("metrics.jsonl", "a FIFO", Damage::Fifo),
            (
                "run.json",
                "cut short",
                Damage::Bytes(b"{\"status\": ".to_vec()),
            ),
        ];
        for (file, label, damage) in self.pinned_and_drawn(damages, 3, 5) {
            let label = format!("{file} is {label}");
            self.resume(&label, false, &[], refused(&[file]), |run| {
                damage.apply(&run.join(file))
            });
        }
        let label = "metrics.jsonl with a line of garbage";
        self.resume(label, false, &[], refused(&["metrics.jsonl"]), |run| {
            let path = run.join("metrics.jsonl");
            let text = fs::read_to_string(&path).unwrap();
            let (a, b) = text.split_at(text.find('\n').unwrap() + 1);
            fs::write(&path, format!("{a}{{not json at all}}\n{b}")).unwrap();
        });
    }

    /// `--resume` with a changed config or seed, and into a folder that holds no run.
    fn resume_changes(&mut self) {
        self.group = "train --resume";
        let set = ["--set", "train.lr=1e-3"];
        let label = "with a changed config (--set train.lr=1e-3)";
        self.resume(label, false, &set, refused(&["train.lr"]), |_| {});
        let label = "with another seed (--seed 7)";
        self.resume(label, false, &["--seed", "7"], refused(&["seed"]), |_| {});
        let dir = self.train_folder(Kind::Gpt, &Kind::Gpt.job());
        fs::create_dir_all(dir.join("runs/tiny-gpt")).unwrap();
        fs::write(dir.join("runs/tiny-gpt/notes.txt"), "mine").unwrap();
        let label = "into a folder without config.toml holding a user's file";
        let either = want(Either, &["runs/tiny-gpt"], "runs/tiny-gpt");
        self.add(label, &dir, train_args(&["--resume"]), either);
        self.keep_last("runs/tiny-gpt/notes.txt");
    }

    /// A case folder with `data/sotu/`, sentinels, and (`with_results`) the results of one
    /// finished unit.
    fn sotu_folder(&mut self, with_results: bool) -> PathBuf {
        let dir = self.folder();
        copy_tree(&self.fixtures.sotu.join("data"), &dir.join("data"));
        if with_results {
            copy_tree(&self.fixtures.sotu.join("results"), &dir.join("results"));
        }
        plant_sentinels(&dir);
        dir
    }

    /// `reproduce` of a smoke unit with drawn hostile `--set` values; and one that runs.
    fn reproduce_values(&mut self) {
        self.group = "reproduce";
        for (set, key) in self.drawn(REPRODUCE_SETS.to_vec(), 8) {
            let dir = self.sotu_folder(false);
            let args = reproduce_args("results", &["--set", set]);
            self.add(format!("--set {set}"), &dir, args, refused(&[key]));
        }
        let dir = self.sotu_folder(false);
        self.add(
            "a smoke unit runs",
            &dir,
            reproduce_args("results", &[]),
            accepted("results"),
        );
    }

    /// `reproduce --config` files (drawn).
    fn reproduce_configs(&mut self) {
        self.group = "reproduce";
        let smoke = kappa_testkit::crate_dir().join("../../experiments/gpt-sotu/smoke.toml");
        let builtin = fs::read_to_string(smoke).unwrap();
        let edited = |from: &str, to: &str| Damage::Bytes(builtin.replace(from, to).into_bytes());
        let mut configs = vec![
            ("empty", "my.toml", Damage::Bytes(Vec::new())),
            ("random bytes", "my.toml", Damage::Bytes(self.garbage(2000))),
            (
                "another experiment's",
                "theory",
                edited("\"gpt-sotu\"", "\"theory\""),
            ),
            (
                "n_layer = -1",
                "model.n_layer",
                edited("n_layer = 2", "n_layer = -1"),
            ),
            (
                "steps past i64",
                "train.steps",
                edited("steps = 4", &format!("steps = {TOO_LARGE}")),
            ),
            ("lr = inf", "train.lr", edited("lr = 0.003", "lr = inf")),
        ];
        configs.extend(
            not_a_file()
                .into_iter()
                .map(|(label, d)| (label, "my.toml", d)),
        );
        for (label, culprit, damage) in self.drawn(configs, 6) {
            let dir = self.sotu_folder(false);
            damage.apply(&dir.join("my.toml"));
            let args = reproduce_args("results", &["--config", "my.toml"]);
            self.add(
                format!("--config that is {label}"),
                &dir,
                args,
                refused(&[culprit]),
            );
        }
    }

    /// The data set of `gpt-sotu` (drawn).
    fn reproduce_data(&mut self) {
        self.group = "reproduce";
        let data = vec![
            ("data/sotu/ missing", "sotu", "", Damage::Missing),
            ("train.txt a FIFO", "train.txt", "train.txt", Damage::Fifo),
            (
                "train.txt empty",
                "train.txt",
                "train.txt",
                Damage::Bytes(Vec::new()),
            ),
            (
                "val.txt a link to itself",
                "val.txt",
                "val.txt",
                Damage::LinkLoop,
            ),
            (
                "train.txt not UTF-8",
                "train.txt",
                "train.txt",
                Damage::Bytes(vec![0xff, 0x41]),
            ),
        ];
        for (label, culprit, file, damage) in self.drawn(data, 4) {
            let dir = self.sotu_folder(false);
            damage.apply(&dir.join("data/sotu").join(file));
            let args = reproduce_args("results", &[]);
            self.add(format!("data: {label}"), &dir, args, refused(&[culprit]));
        }
    }

    /// `reproduce` over results that exist, units that are not in the plan, `--results` that
    /// is a file.
    fn reproduce_results(&mut self) {
        self.group = "reproduce";
        let dir = self.sotu_folder(true);
        let label = "over existing results without --resume or --fresh";
        self.add(
            label,
            &dir,
            reproduce_args("results", &[]),
            refused(&["gpt-sotu/smoke"]),
        );
        let dir = self.sotu_folder(true);
        fs::write(dir.join("results/gpt-sotu/smoke/notes.txt"), "mine").unwrap();
        let label = "--fresh over existing results with a user's file";
        self.add(
            label,
            &dir,
            reproduce_args("results", &["--fresh"]),
            accepted("results"),
        );
        self.keep_last("results/gpt-sotu/smoke/notes.txt");
        for (label, unit, culprit) in [
            ("--unit of no plan", "gpt-sotu/smoke/seed-7", "seed-7"),
            ("--unit ../../escape", "../../escape", "../../escape"),
        ] {
            let dir = self.sotu_folder(false);
            let args = reproduce_args("results", &["--unit", unit]);
            self.add(label, &dir, args, refused(&[culprit]));
        }
        let dir = self.sotu_folder(false);
        fs::write(dir.join("results-file"), "a file").unwrap();
        let args = reproduce_args("results-file", &[]);
        self.add(
            "--results is a file",
            &dir,
            args,
            refused(&["results-file"]),
        );
    }

    /// `reproduce --resume` over an interrupted unit (no `run.json`, no variant's summary, so
    /// each variant resumes from its checkpoint) with a damaged file.
    fn reproduce_resume(&mut self) {
        self.group = "reproduce";
        let unit = "results/gpt-sotu/smoke/seed-0";
        for (file, what, damage) in [
            ("config.toml", "a link to itself", Damage::LinkLoop),
            (
                "variant-0/checkpoint.safetensors",
                "a folder",
                Damage::Folder,
            ),
            (
                "metrics.jsonl",
                "garbage",
                Damage::Bytes(b"{{{{\n".to_vec()),
            ),
        ] {
            let dir = self.sotu_folder(true);
            fs::remove_file(dir.join(unit).join("run.json")).unwrap();
            drop_summaries(&dir.join(unit).join("metrics.jsonl"));
            damage.apply(&dir.join(unit).join(file));
            let name = file.rsplit('/').next().unwrap();
            let label = format!("--resume over an interrupted unit whose {name} is {what}");
            self.add(
                label,
                &dir,
                reproduce_args("results", &["--resume"]),
                refused(&[name]),
            );
        }
    }

    /// `report` of a results folder with a broken unit (a garbled `run.json` always, others
    /// drawn), a valid one, and one with a failed unit.
    fn report_inputs(&mut self) {
        self.group = "report";
        let unit = "results/gpt-sotu/smoke/seed-0";
        let mut damages = vec![
            (
                "run.json",
                "cut short",
                Damage::Bytes(b"{\"run\": [".to_vec()),
            ),
            ("run.json", "empty", Damage::Bytes(Vec::new())),
            ("config.toml", "missing", Damage::Missing),
            ("metrics.jsonl", "garbage", Damage::Bytes(b"}}}\n".to_vec())),
            ("metrics.jsonl", "missing", Damage::Missing),
        ];
        let run_json = not_a_file()
            .into_iter()
            .take(3)
            .map(|(label, d)| ("run.json", label, d));
        damages.extend(run_json);
        for (file, label, damage) in self.pinned_and_drawn(damages, 1, 5) {
            let dir = self.sotu_folder(true);
            damage.apply(&dir.join(unit).join(file));
            let args = report_args("report", &["results"]);
            self.add(
                format!("a unit whose {file} is {label}"),
                &dir,
                args,
                refused(&[file]),
            );
        }
        let dir = self.sotu_folder(true);
        let args = report_args("report", &["results"]);
        self.add(
            "a valid results folder",
            &dir,
            args.clone(),
            accepted("report"),
        );
        let dir = self.sotu_folder(true);
        mark_failed(&dir.join(unit).join("run.json"));
        self.add(
            "a failed unit is named, not an error",
            &dir,
            args,
            accepted("report"),
        );
    }

    /// `report` merging results folders, or reading ones that are not there.
    fn report_merges(&mut self) {
        self.group = "report";
        let dir = self.sotu_folder(true);
        copy_tree(&dir.join("results"), &dir.join("results-b"));
        let args = report_args("report", &["results", "results-b"]);
        let label = "two results folders holding the same unit";
        self.add(label, &dir, args, refused(&["gpt-sotu/smoke/seed-0"]));
        let dir = self.sotu_folder(true);
        Damage::LinkLoop.apply(&dir.join("results-b"));
        let args = report_args("report", &["results", "results-b"]);
        let label = "a second results folder linking to itself";
        self.add(label, &dir, args, refused(&["results-b"]));
        let dir = self.sotu_folder(false);
        let args = report_args("report", &["nowhere"]);
        self.add(
            "a results folder that is not there",
            &dir,
            args,
            refused(&["nowhere"]),
        );
        let dir = self.sotu_folder(true);
        fs::write(dir.join("out-file"), "a file").unwrap();
        let args = report_args("out-file", &["results"]);
        self.add("--out is a file", &dir, args, refused(&["out-file"]));
    }
}

/// A change to a folder.
type Change = fn(&Path);

/// The run folder of `kind`'s job, relative to the case's folder.
fn run_of(kind: Kind) -> String {
    format!("runs/{}", kind.name())
}
