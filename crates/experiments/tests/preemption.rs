//! Preemption, the way Slurm does it: SIGTERM to a unit mid-training makes it checkpoint at
//! the next step and exit with status 75 (requeue); started again, the unit resumes from the
//! checkpoint and ends with the metrics of a unit that was never stopped (timings aside).

#![cfg(unix)]

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const UNIT: &str = "gpt-sotu/smoke/seed-0";

fn binary(results: &Path, data: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kappa-experiments"));
    cmd.args([
        "reproduce",
        "--scale",
        "smoke",
        "--only",
        "gpt-sotu",
        "--seeds",
        "1",
    ])
    .args(["--threads", "1", "--unit", UNIT])
    // Long enough to be stopped mid-run: 400 steps, a record every step (no checkpoint
    // schedule is needed: the stop writes one).
    .args(["--set", "train.steps=400", "--set", "train.log_every=1"])
    .arg("--results")
    .arg(results)
    .arg("--data")
    .arg(data)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    cmd
}

/// metrics.jsonl without the fields that measure time, and without `resumed_at`, the one field
/// a resumed run adds (it says where the run continued).
fn metrics(results: &Path) -> Vec<serde_json::Value> {
    let text = fs::read_to_string(results.join(UNIT).join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            strip_timings(&mut v);
            v
        })
        .collect()
}

fn strip_timings(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            map.retain(|k, _| !k.contains("second") && k != "resumed_at");
            map.values_mut().for_each(strip_timings);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_timings),
        _ => {}
    }
}

#[test]
fn sigterm_checkpoints_exits_75_and_the_requeued_unit_ends_as_an_uninterrupted_one() {
    let root = std::env::temp_dir().join(format!("kappa-preempt-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let data = root.join("data");
    kappa_models::data::fixtures::write_sotu(&data.join("sotu")).unwrap();

    let whole = root.join("whole");
    let status = binary(&whole, &data).status().unwrap();
    assert!(status.success(), "the uninterrupted unit failed: {status}");

    let stopped = root.join("stopped");
    let mut child = binary(&stopped, &data).spawn().unwrap();
    // Wait for training records, then preempt.
    let log = stopped.join(UNIT).join("metrics.jsonl");
    let deadline = Instant::now() + Duration::from_secs(300);
    while fs::read_to_string(&log).map_or(0, |t| t.lines().count()) < 5 {
        assert!(
            Instant::now() < deadline,
            "the unit logged nothing in 300 s"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the unit ended before the signal"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(75), "{stderr}");
    assert!(
        stderr.contains("unfinished: gpt-sotu/smoke/seed-0"),
        "{stderr}"
    );
    let checkpoints: Vec<_> = fs::read_dir(stopped.join(UNIT))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("checkpoint.safetensors").is_file())
        .collect();
    assert!(!checkpoints.is_empty(), "no checkpoint was written");
    assert!(
        !stopped.join(UNIT).join("run.json").exists() || {
            let info = fs::read_to_string(stopped.join(UNIT).join("run.json")).unwrap();
            info.contains("interrupted")
        }
    );

    // Requeued: the same command again.
    let output = binary(&stopped, &data).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("resumed"), "{stderr}");
    let log = fs::read_to_string(stopped.join(UNIT).join("metrics.jsonl")).unwrap();
    assert!(
        log.contains("\"resumed_at\""),
        "the resumed variant does not say so"
    );
    let (resumed, uninterrupted) = (metrics(&stopped), metrics(&whole));
    assert_eq!(resumed.len(), uninterrupted.len());
    for (i, (r, u)) in resumed.iter().zip(&uninterrupted).enumerate() {
        assert_eq!(r, u, "line {} of metrics.jsonl differs", i + 1);
    }
    fs::remove_dir_all(&root).unwrap();
}
