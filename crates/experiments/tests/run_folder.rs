//! The rules of a run folder, through `train --config` (`run_train_command`) and the binary: a
//! run name never leads outside `--out`; a folder that holds a run is continued (`--resume`) or
//! started over (`--fresh`) only when asked, and a fresh start deletes only the run's own files;
//! a resume that cannot read its config, metrics, run.json or checkpoint, or whose checkpoint
//! does not fit the run, stops with an error naming the file and leaves the folder
//! byte-identical; Ctrl-C checkpoints, says how to resume and exits 75, a second Ctrl-C exits at
//! once.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use kappa_cli::Set;
use kappa_experiments::train::{run_train_command, train_job, Existing, TrainJob};
use kappa_train::{Run, RunContext, RunStatus};
use tch::Tensor;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kappa-folder-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// The repository's character-GPT example, made tiny, on a small text in `dir`.
fn job(dir: &Path, extra: &[&str]) -> (PathBuf, Vec<Set>) {
    let text: String = (0..60)
        .map(|i| format!("MetricsLine {i} of a small text. "))
        .collect();
    fs::write(dir.join("input.txt"), text).unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/train/gpt_chars.toml");
    let data = format!(
        "data.path={:?}",
        dir.join("input.txt").display().to_string()
    );
    let tiny = [
        data.as_str(),
        "model.block_size=16",
        "model.n_layer=1",
        "model.n_head=2",
        "model.n_embd=16",
        "model.correction={ kind = \"none\" }",
        "train.steps=6",
        "train.batch_size=4",
        "train.warmup_steps=1",
        "train.eval_every=3",
        "train.eval_batches=2",
        "train.log_every=1",
        "train.checkpoint_every=2",
        "train.diagnostics={ enabled = false, samples = 1, jacobian_max_tokens = 8 }",
    ];
    let sets = tiny
        .iter()
        .chain(extra)
        .map(|s| s.parse().unwrap())
        .collect();
    (config, sets)
}

fn context() -> RunContext {
    RunContext {
        seed: 1,
        threads: 1,
        ..RunContext::default()
    }
    .quiet()
}

/// Every file and folder under `root`, with its bytes (folders and links marked as such).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let bytes = if meta.file_type().is_symlink() {
                format!("link to {:?}", fs::read_link(&path).unwrap()).into_bytes()
            } else if meta.is_dir() {
                stack.push(path.clone());
                b"folder".to_vec()
            } else {
                fs::read(&path).unwrap()
            };
            out.insert(path, bytes);
        }
    }
    out
}

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            fs::copy(&path, &target).unwrap();
        }
    }
}

#[test]
fn a_run_name_that_leaves_its_folder_is_refused_and_nothing_is_touched() {
    let root = scratch("names");
    fs::write(root.join("precious.txt"), "a user's file").unwrap();
    fs::create_dir_all(root.join("out/other-run")).unwrap();
    fs::write(root.join("out/other-run/config.toml"), "x = 1").unwrap();
    let long = format!("name={}", "n".repeat(5000));
    for name in [
        "name=\"..\"",
        "name=\".\"",
        "name=\"a/b\"",
        "name=\"\"",
        &long,
    ] {
        let (config, sets) = job(&root, &[name]);
        let before = snapshot(&root);
        for existing in [Existing::Refuse, Existing::Resume, Existing::StartOver] {
            let out = root.join("out");
            let err = run_train_command(&config, &sets, context(), &out, existing).unwrap_err();
            let err = format!("{err:#}");
            assert!(
                err.contains("name:") && err.contains("plain folder name"),
                "{err}"
            );
            assert!(err.len() < 400, "the message quotes a cut name: {err}");
        }
        assert_eq!(snapshot(&root), before, "{name}");
    }
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_second_run_in_a_folder_needs_resume_or_fresh_and_fresh_keeps_a_users_files() {
    let root = scratch("again");
    let (config, sets) = job(&root, &[]);
    let out = root.join("out");
    let dir = run_train_command(&config, &sets, context(), &out, Existing::Refuse).unwrap();
    fs::write(dir.join("notes.txt"), "mine").unwrap();
    let before = snapshot(&root);
    let err = run_train_command(&config, &sets, context(), &out, Existing::Refuse).unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("notes.txt") || err.contains("--fresh"),
        "{err}"
    );
    assert_eq!(snapshot(&root), before);
    // A fresh start deletes the run's own files and keeps the user's.
    run_train_command(&config, &sets, context(), &out, Existing::StartOver).unwrap();
    assert_eq!(fs::read_to_string(dir.join("notes.txt")).unwrap(), "mine");
    assert!(dir.join("variant-0/checkpoint.safetensors").is_file());
    // A folder of someone else's files is not a place for a new run without --fresh.
    let (_, named) = job(&root, &["name=\"data\""]);
    fs::create_dir_all(out.join("data")).unwrap();
    fs::write(out.join("data/images.bin"), "x").unwrap();
    let err = run_train_command(&config, &named, context(), &out, Existing::Refuse).unwrap_err();
    assert!(format!("{err:#}").contains("images.bin"), "{err:#}");
    fs::remove_dir_all(&root).unwrap();
}

/// A run interrupted after 4 of 6 steps (checkpoint at 4), in `<root>/good/<name>`.
fn interrupted_run(root: &Path) -> (PathBuf, Vec<Set>, PathBuf) {
    let (config, sets) = job(root, &[]);
    let job = TrainJob::load(&config, &sets).unwrap();
    let dir = root.join("good").join(&job.name);
    let ctx = RunContext {
        name: job.name.clone(),
        scale: "train".into(),
        data_dir: config.parent().unwrap().to_path_buf(),
        ..context()
    };
    let mut run = Run::create(&dir, ctx, &job).unwrap();
    run.interrupt_variant_at(0, 4);
    let err = train_job(&job, &mut run).unwrap_err();
    run.finish(RunStatus::Failed {
        error: format!("{err:#}"),
    })
    .unwrap();
    (config, sets, dir)
}

/// Rewrites the checkpoint at `path` with `change` applied to its tensors.
fn edit_checkpoint(path: &Path, change: impl FnOnce(&mut BTreeMap<String, Tensor>)) {
    let mut tensors: BTreeMap<String, Tensor> = Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect();
    change(&mut tensors);
    let list: Vec<(String, Tensor)> = tensors.into_iter().collect();
    Tensor::write_safetensors(&list, path).unwrap();
}

type Damage = fn(&Path);

fn checkpoint_of(dir: &Path) -> PathBuf {
    dir.join("variant-0/checkpoint.safetensors")
}

fn set_ints(dir: &Path, pairs: &[(&str, i64)]) {
    edit_checkpoint(&checkpoint_of(dir), |t| {
        for (k, v) in pairs {
            t.insert(k.to_string(), Tensor::from_slice(&[*v]));
        }
    });
}

/// Ways a run folder can be damaged, and the file the error must name.
fn damages() -> Vec<(&'static str, Damage, &'static str)> {
    const CKPT: &str = "checkpoint.safetensors";
    let case = |what, damage: Damage, file| (what, damage, file);
    vec![
        case(
            "checkpoint is a folder",
            |d| {
                fs::remove_file(checkpoint_of(d)).unwrap();
                fs::create_dir(checkpoint_of(d)).unwrap();
            },
            CKPT,
        ),
        case(
            "config.toml loops",
            |d| {
                let c = d.join("config.toml");
                fs::remove_file(&c).unwrap();
                std::os::unix::fs::symlink(&c, &c).unwrap();
            },
            "config.toml",
        ),
        case(
            "config.toml missing",
            |d| fs::remove_file(d.join("config.toml")).unwrap(),
            "config.toml",
        ),
        case(
            "metrics.jsonl empty",
            |d| fs::write(d.join("metrics.jsonl"), "").unwrap(),
            "metrics.jsonl",
        ),
        case(
            "metrics.jsonl missing",
            |d| fs::remove_file(d.join("metrics.jsonl")).unwrap(),
            "metrics.jsonl",
        ),
        case(
            "metrics.jsonl garbage line",
            |d| {
                let m = d.join("metrics.jsonl");
                let text = fs::read_to_string(&m).unwrap();
                fs::write(&m, format!("{{not json\n{text}")).unwrap();
            },
            "metrics.jsonl",
        ),
        case(
            "run.json garbage",
            |d| fs::write(d.join("run.json"), "{").unwrap(),
            "run.json",
        ),
        case(
            "checkpoint truncated",
            |d| {
                let bytes = fs::read(checkpoint_of(d)).unwrap();
                fs::write(checkpoint_of(d), &bytes[..bytes.len() / 2]).unwrap();
            },
            CKPT,
        ),
        case(
            "checkpoint step 1000",
            |d| set_ints(d, &[("trainer/step", 1000), ("rng/counter", 1000)]),
            CKPT,
        ),
        case(
            "checkpoint step -1",
            |d| set_ints(d, &[("trainer/step", -1)]),
            CKPT,
        ),
        case(
            "checkpoint counter -1",
            |d| set_ints(d, &[("rng/counter", -1)]),
            CKPT,
        ),
        case(
            "checkpoint of NaN weights",
            |d| {
                edit_checkpoint(&checkpoint_of(d), |t| {
                    for (k, v) in t.iter_mut() {
                        if k.starts_with("model/") {
                            *v = v.full_like(f64::NAN);
                        }
                    }
                })
            },
            CKPT,
        ),
    ]
}

#[cfg(unix)]
#[test]
fn a_resume_that_cannot_use_its_folder_names_the_file_and_changes_nothing() {
    let root = scratch("damaged");
    let (config, sets, good) = interrupted_run(&root);
    let mut failures = Vec::new();
    for (i, (what, damage, file)) in damages().into_iter().enumerate() {
        let out = root.join(format!("case-{i}"));
        let dir = out.join(good.file_name().unwrap());
        copy_tree(&good, &dir);
        damage(&dir);
        let before = snapshot(&out);
        match run_train_command(&config, &sets, context(), &out, Existing::Resume) {
            Ok(_) => failures.push(format!("{what}: resumed")),
            Err(e) if !format!("{e:#}").contains(file) => {
                failures.push(format!("{what}: the error does not name {file}: {e:#}"))
            }
            Err(_) if snapshot(&out) != before => failures.push(format!("{what}: folder changed")),
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // The undamaged folder resumes.
    run_train_command(
        &config,
        &sets,
        context(),
        &root.join("good"),
        Existing::Resume,
    )
    .unwrap();
    fs::remove_dir_all(&root).unwrap();
}

/// Polls `done` every 50 ms for up to `seconds`.
fn wait_for(seconds: u64, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

#[cfg(unix)]
#[test]
fn ctrl_c_checkpoints_after_the_current_step_and_says_how_to_resume() {
    use std::process::{Command, Stdio};
    let root = scratch("ctrl-c");
    let (config, sets) = job(
        &root,
        &["train.steps=100000", "train.checkpoint_every=100000"],
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kappa-experiments"));
    cmd.args(["train", "--threads", "1", "--config"])
        .arg(&config);
    for set in &sets {
        cmd.args(["--set", &set.to_string()]);
    }
    let out = root.join("out");
    let mut child = cmd
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let metrics = out.join("gpt-chars/metrics.jsonl");
    let started = wait_for(60, || {
        fs::read_to_string(&metrics).is_ok_and(|t| t.lines().count() >= 3)
    });
    let pid = child.id().to_string();
    Command::new("kill").args(["-INT", &pid]).status().unwrap();
    let ended = wait_for(60, || child.try_wait().unwrap().is_some());
    if !ended {
        child.kill().unwrap();
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        started && ended,
        "started {started}, ended {ended}: {stderr}"
    );
    // 75 (EX_TEMPFAIL): stopped, to be resumed; what a Slurm script requeues on.
    let requeue = i32::from(kappa_cli::REQUEUE_EXIT_CODE);
    assert_eq!(output.status.code(), Some(requeue), "{stderr}");
    assert!(stderr.contains("--resume continues it"), "{stderr}");
    let ckpt = out.join("gpt-chars/variant-0/checkpoint.safetensors");
    let step = Tensor::read_safetensors(&ckpt)
        .unwrap()
        .into_iter()
        .find(|(k, _)| k == "trainer/step")
        .map(|(_, t)| t.int64_value(&[0]))
        .unwrap();
    let last_logged = fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .filter_map(|l| {
            match serde_json::from_str::<kappa_train::MetricsLine>(l)
                .ok()?
                .record
            {
                Some(kappa_train::Record::Train { step, .. }) => Some(step as i64),
                _ => None,
            }
        })
        .max()
        .unwrap();
    // Every step is logged (`log_every = 1`): the checkpoint is at the last step that ran.
    assert_eq!(step, last_logged);
    fs::remove_dir_all(&root).unwrap();
}
