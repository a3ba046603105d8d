//! The optimizer API against the public reference: `Grouping::muon_adamw` over a small GPT's
//! parameters, stepped 5 times through seeded gradients under a learning-rate schedule, against
//! `torch.optim.Muon` on the hidden matrices plus `torch.optim.AdamW` on the rest
//! (`benches/reference/optimizer_torch.py`, run by the project's Python: `$KAPPA_PYTHON`, else
//! `$KAPPA_VENV/bin/python`, else the workspace's `.venv/bin/python`; without one the tests say
//! they are skipped and return).
//!
//! Both sides compute in f32: kappa with `MuonConfig::torch()` at `Precision::F32` and
//! `AdamWConfig::torch()`; torch with its own optimizers, only Muon's Newton–Schulz swapped for
//! the same iteration in f32 (torch's runs in bf16). The inputs are generated here and written to
//! the script as decimal doubles, so both sides start from the same f32 values.
//!
//! # Tolerance (derived, not tuned)
//!
//! Two f32 computations of one map differ by their rounding errors: relative size u = 2⁻²⁴ at
//! every operation, each carried to the output by the map's sensitivity. The script measures
//! that sensitivity on the reference itself: two f64 runs of torch's optimizers, one on the
//! inputs and one on every input (initial values and gradients) perturbed by u·max|x| per entry
//! (random signs); their largest difference d per parameter after step t is the effect of one
//! injection of size u at the inputs. Every later injection passes through fewer operations, so
//! it is amplified at most as much (floored at u·max|out|, the output's own rounding, so a lucky
//! small d cannot make the bound vacuous). With N injections per step (Muon 24: the momentum's 4
//! (two lerps), the normalization's 2, 3 products per Newton–Schulz step × 5, the update's 3
//! (decay, lr·O, subtraction); AdamW 12: decay 1, first moment 2, second moment 3, denominator 3
//! (√v, /√(1 − β₂ᵗ), + ε), step 3), t steps, the √k growth of a length-k inner product's
//! rounding (k = the matrix's longer side for Muon, 1 for AdamW's elementwise update) and two
//! sides:
//!
//! ```text
//! tol = 2 · N · t · √k · max(d, u · max|out|)
//! ```
//!
//! (as in tests/muon/tch_backend.rs and tests/muon/optimizer.rs). The bound is only worth having
//! if a real difference exceeds it: one test runs kappa with one setting changed from torch's
//! (a weight decay, β₂, Nesterov, the shape factor) and checks that each fails the comparison.
#![cfg(feature = "tch")]

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kappa_optim::optimizer::Grouping;
use kappa_optim::{AdamWConfig, Momentum, MomentumKind, Msign, MuonConfig, Precision};
use kappa_optim::{Layout, UpdateScale};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde_json::{json, Value};
use tch::{nn, Device, Kind, Tensor};

/// f32's unit roundoff.
const U32: f64 = f32::EPSILON as f64 / 2.0;

const STEPS: u64 = 5;
const MUON_LR: f64 = 0.02;
const ADAMW_LR: f64 = 3e-3;

/// The reference script's time limit.
const DEADLINE: Duration = Duration::from_secs(120);

/// Rounding injections per step (module docs).
const MUON_INJECTIONS: f64 = 24.0;
const ADAMW_INJECTIONS: f64 = 12.0;

/// A small GPT's parameters: name, shape, and the initial values' mean and standard deviation
/// (GPT-2's 0.02 for matrices; gains near 1; small biases). Two blocks, so that Muon steps
/// same-shape matrices batched as well as alone.
const PARAMS: &[(&str, &[i64], f64, f64)] = &[
    ("wte", &[64, 32], 0.0, 0.02),
    ("h.0.ln_1.weight", &[32], 1.0, 0.1),
    ("h.0.ln_1.bias", &[32], 0.0, 0.1),
    ("h.0.attn.c_attn.weight", &[96, 32], 0.0, 0.02),
    ("h.0.attn.c_attn.bias", &[96], 0.0, 0.1),
    ("h.0.attn.c_proj.weight", &[32, 32], 0.0, 0.02),
    ("h.0.mlp.c_fc.weight", &[128, 32], 0.0, 0.02),
    ("h.0.mlp.c_proj.weight", &[32, 128], 0.0, 0.02),
    ("h.1.attn.c_attn.weight", &[96, 32], 0.0, 0.02),
    ("h.1.attn.c_proj.weight", &[32, 32], 0.0, 0.02),
    ("h.1.mlp.c_fc.weight", &[128, 32], 0.0, 0.02),
    ("h.1.mlp.c_proj.weight", &[32, 128], 0.0, 0.02),
    ("ln_f.weight", &[32], 1.0, 0.1),
    ("lm_head.weight", &[64, 32], 0.0, 0.02),
];

/// Step i runs at peak × this factor (both sides).
fn lr_factor(step: u64) -> f64 {
    1.0 - 0.15 * step as f64
}

/// `n` seeded Gaussian values of mean `mean` and deviation `std`, as f32.
fn gaussian(n: i64, mean: f64, std: f64, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let z: f64 = StandardNormal.sample(&mut rng);
            (mean + std * z) as f32
        })
        .collect()
}

fn numel(shape: &[i64]) -> i64 {
    shape.iter().product()
}

/// The parameters' initial values and each step's gradients (unit Gaussians), in PARAMS order.
struct Inputs {
    params: Vec<Vec<f32>>,
    grads: Vec<Vec<Vec<f32>>>,
}

fn inputs() -> Inputs {
    let params = PARAMS
        .iter()
        .zip(0..)
        .map(|(&(_, shape, mean, std), i)| gaussian(numel(shape), mean, std, i))
        .collect();
    let grads = (0..STEPS)
        .map(|step| {
            PARAMS
                .iter()
                .zip(0..)
                .map(|(&(_, shape, _, _), i)| {
                    gaussian(numel(shape), 0.0, 1.0, 1000 * (step + 1) + i)
                })
                .collect()
        })
        .collect();
    Inputs { params, grads }
}

/// The script's input (its module docs): every f32 written as the double it is.
fn request(inputs: &Inputs) -> Value {
    let doubles = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    let params: Vec<Value> = PARAMS
        .iter()
        .zip(&inputs.params)
        .map(|(&(name, shape, _, _), data)| {
            json!({"name": name, "shape": shape, "data": doubles(data)})
        })
        .collect();
    let grads: Vec<Vec<Vec<f64>>> = inputs
        .grads
        .iter()
        .map(|step| step.iter().map(|g| doubles(g)).collect())
        .collect();
    json!({
        "muon_lr": MUON_LR,
        "adamw_lr": ADAMW_LR,
        "lr_factors": (0..STEPS).map(lr_factor).collect::<Vec<f64>>(),
        "params": params,
        "grads": grads,
    })
}

/// Each parameter's values after each step.
type Trajectory = Vec<HashMap<String, Vec<f32>>>;

/// What the script answered (its module docs).
struct Reference {
    defaults: Value,
    groups: HashMap<String, Vec<String>>,
    steps: Trajectory,
    probe: Vec<HashMap<String, f64>>,
}

impl Reference {
    fn parse(v: &Value) -> Result<Self, String> {
        let object = |v: &Value, what: &str| -> Result<Vec<(String, Value)>, String> {
            let map = v.as_object().ok_or(format!("`{what}` is not an object"))?;
            Ok(map.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        };
        let list = |v: &Value, what: &str| -> Result<Vec<Value>, String> {
            v.as_array()
                .cloned()
                .ok_or(format!("`{what}` is not a list"))
        };
        let float = |v: &Value| v.as_f64().ok_or(format!("{v} is not a number"));
        let mut groups = HashMap::new();
        for (g, names) in object(&v["groups"], "groups")? {
            let names = list(&names, "groups")?;
            let names = names.iter().map(|n| n.as_str().map(String::from));
            groups.insert(
                g,
                names.collect::<Option<_>>().ok_or("a name is no string")?,
            );
        }
        let mut steps = Vec::new();
        for step in list(&v["steps"], "steps")? {
            let mut values = HashMap::new();
            for (name, data) in object(&step, "steps")? {
                let data: Result<Vec<f32>, String> = list(&data, &name)?
                    .iter()
                    .map(|x| float(x).map(|x| x as f32))
                    .collect();
                values.insert(name, data?);
            }
            steps.push(values);
        }
        let mut probe = Vec::new();
        for step in list(&v["probe"], "probe")? {
            let pairs = object(&step, "probe")?.into_iter();
            probe.push(
                pairs
                    .map(|(n, d)| Ok((n, float(&d)?)))
                    .collect::<Result<_, String>>()?,
            );
        }
        Ok(Self {
            defaults: v["defaults"].clone(),
            groups,
            steps,
            probe,
        })
    }
}

/// The Python that runs the reference scripts: `$KAPPA_PYTHON`, else `$KAPPA_VENV/bin/python`,
/// else `<workspace>/.venv/bin/python`.
fn python(workspace: &Path) -> PathBuf {
    std::env::var_os("KAPPA_PYTHON")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("KAPPA_VENV").map(|v| PathBuf::from(v).join("bin/python")))
        .unwrap_or_else(|| workspace.join(".venv/bin/python"))
}

/// A folder removed with everything in it when dropped (also when a test panics).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Runs the script with `python` on `inputs` (killed after [`DEADLINE`]); `Err`: it did not
/// answer, and why.
fn run_reference(python: &Path, workspace: &Path, inputs: &Inputs) -> Result<Reference, String> {
    let dir = std::env::temp_dir().join(format!("kappa-torch-reference-{}", std::process::id()));
    let dir = TempDir(dir);
    fs::create_dir_all(&dir.0).map_err(|e| format!("{}: {e}", dir.0.display()))?;
    let path = |name: &str| dir.0.join(name);
    let io = |p: PathBuf| move |e: std::io::Error| format!("{}: {e}", p.display());
    fs::write(path("in.json"), request(inputs).to_string()).map_err(io(path("in.json")))?;
    let log = File::create(path("log")).map_err(io(path("log")))?;
    let mut child = Command::new(python)
        .arg(workspace.join("benches/reference/optimizer_torch.py"))
        .arg(path("in.json"))
        .arg(path("out.json"))
        .env_remove("LD_PRELOAD")
        .env("OMP_NUM_THREADS", "1")
        .stdout(log.try_clone().map_err(io(path("log")))?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", python.display()))?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("waiting: {e}"))? {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the reference ran past {DEADLINE:?} and was killed"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if !status.success() {
        let log = fs::read_to_string(path("log")).unwrap_or_default();
        return Err(format!("the reference failed ({status}):\n{log}"));
    }
    let out = fs::read_to_string(path("out.json")).map_err(io(path("out.json")))?;
    let value: Value = serde_json::from_str(&out).map_err(|e| format!("out.json: {e}"))?;
    Reference::parse(&value)
}

/// What became of the reference run.
enum Outcome {
    Ran(Reference),
    /// No Python: why the tests are skipped.
    Skipped(String),
    /// It ran and did not answer.
    Failed(String),
}

/// The reference, run once for all tests; `None` (after saying so) when there is no Python.
/// Panics when the run failed.
fn reference() -> Option<&'static Reference> {
    static CELL: OnceLock<Outcome> = OnceLock::new();
    let outcome = CELL.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let python = python(&workspace);
        if !python.exists() {
            return Outcome::Skipped(format!(
                "skipped: no Python interpreter at {} ($KAPPA_PYTHON, else $KAPPA_VENV/bin/python, \
                 else the workspace's .venv/bin/python)",
                python.display()
            ));
        }
        match run_reference(&python, &workspace, &inputs()) {
            Ok(r) => Outcome::Ran(r),
            Err(e) => Outcome::Failed(e),
        }
    });
    match outcome {
        Outcome::Ran(r) => Some(r),
        Outcome::Skipped(why) => {
            eprintln!("{why}");
            None
        }
        Outcome::Failed(e) => panic!("{e}"),
    }
}

/// kappa's side: groups (name, parameter names) and the trajectory.
struct Run {
    groups: Vec<(String, Vec<String>)>,
    steps: Trajectory,
}

fn flat(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.detach().reshape([-1])).unwrap()
}

/// `Grouping::muon_adamw(muon, adamw, ADAMW_LR)` over the parameters, stepped through the
/// gradients (each set by the loss Σ p·g) under `lr_factor`.
fn kappa_run(inputs: &Inputs, muon: MuonConfig, adamw: AdamWConfig) -> Run {
    let vs = nn::VarStore::new(Device::Cpu);
    let params: Vec<Tensor> = PARAMS
        .iter()
        .zip(&inputs.params)
        .map(|(&(name, shape, _, _), data)| {
            // A var-store name cannot hold '.': the dots are path components.
            let mut parts: Vec<&str> = name.split('.').collect();
            let last = parts.pop().unwrap_or_default();
            let path = parts.iter().fold(vs.root(), |p, c| p / *c);
            path.var_copy(last, &Tensor::from_slice(data).reshape(shape))
        })
        .collect();
    let mut opt = Grouping::muon_adamw(muon, adamw, ADAMW_LR)
        .build(&vs)
        .unwrap()
        .with_schedule(lr_factor);
    let mut steps = Vec::new();
    for grads in &inputs.grads {
        opt.zero_grad().unwrap();
        let loss = params
            .iter()
            .zip(grads)
            .map(|(p, g)| (p * Tensor::from_slice(g).reshape(p.size())).sum(Kind::Float))
            .fold(Tensor::zeros([], (Kind::Float, Device::Cpu)), |a, b| a + b);
        loss.backward();
        opt.step().unwrap();
        steps.push(
            opt.params()
                .map(|(n, p)| (n.to_string(), flat(p)))
                .collect(),
        );
    }
    let groups = opt
        .groups()
        .iter()
        .map(|g| (g.name().to_string(), g.names().to_vec()))
        .collect();
    Run { groups, steps }
}

fn muon_f32() -> MuonConfig {
    MuonConfig {
        lr: MUON_LR,
        precision: Precision::F32,
        ..MuonConfig::torch()
    }
}

/// One parameter after one step: the largest difference and its tolerance (module docs).
struct Gap {
    step: usize,
    name: String,
    diff: f64,
    tol: f64,
}

fn gaps(reference: &Reference, run: &Run) -> Vec<Gap> {
    let mut out = Vec::new();
    for (t, (theirs, mine)) in reference.steps.iter().zip(&run.steps).enumerate() {
        for &(name, shape, _, _) in PARAMS {
            let (a, b) = (&theirs[name], &mine[name]);
            assert_eq!(a.len(), b.len(), "{name}");
            let diff = a.iter().zip(b).fold(0.0f64, |m, (x, y)| {
                m.max((f64::from(*x) - f64::from(*y)).abs())
            });
            let out_max = a.iter().fold(0.0f64, |m, x| m.max(f64::from(x.abs())));
            let muon = reference.groups["muon"].iter().any(|n| n == name);
            let (injections, k) = if muon {
                (MUON_INJECTIONS, shape.iter().copied().max().unwrap_or(1))
            } else {
                (ADAMW_INJECTIONS, 1)
            };
            let d = reference.probe[t][name];
            let tol = 2.0 * injections * (t + 1) as f64 * (k as f64).sqrt() * d.max(U32 * out_max);
            out.push(Gap {
                step: t + 1,
                name: name.to_string(),
                diff,
                tol,
            });
        }
    }
    out
}

#[test]
fn kappa_muon_and_adamw_step_a_small_gpt_as_torch_optim_muon_and_adamw_do() {
    let Some(reference) = reference() else {
        return;
    };
    let inputs = inputs();
    let run = kappa_run(&inputs, muon_f32(), AdamWConfig::torch());
    // The groups: the same parameters went to Muon, to AdamW with decay and without.
    let sorted = |names: &[String]| {
        let mut names = names.to_vec();
        names.sort();
        names
    };
    let mine: BTreeMap<&str, Vec<String>> = run
        .groups
        .iter()
        .map(|(g, names)| (g.as_str(), sorted(names)))
        .collect();
    let theirs: BTreeMap<&str, Vec<String>> = reference
        .groups
        .iter()
        .map(|(g, names)| (g.as_str(), sorted(names)))
        .collect();
    assert_eq!(mine, theirs);
    assert_eq!(reference.steps.len(), STEPS as usize);
    let gaps = gaps(reference, &run);
    for g in gaps.iter().filter(|g| g.step == STEPS as usize) {
        eprintln!(
            "after step {}: {:<24} max |Δ| {:.3e}  tol {:.3e}  ({:.1e} of it)",
            g.step,
            g.name,
            g.diff,
            g.tol,
            g.diff / g.tol
        );
    }
    for g in &gaps {
        assert!(
            g.diff <= g.tol,
            "`{}` after step {}: max |Δ| {:e} > tol {:e}",
            g.name,
            g.step,
            g.diff,
            g.tol
        );
    }
}

#[test]
fn kappa_torch_presets_are_the_defaults_of_torch_optim_muon_and_adamw() {
    let Some(reference) = reference() else {
        return;
    };
    let (muon, adamw) = (&reference.defaults["muon"], &reference.defaults["adamw"]);
    let cfg = MuonConfig::torch();
    assert_eq!(muon["lr"].as_f64(), Some(cfg.lr));
    assert_eq!(muon["weight_decay"].as_f64(), Some(cfg.weight_decay));
    // torch's buffer.lerp_(g, 1 − β) and g.lerp(buffer, β) are the EMA form with Nesterov.
    assert_eq!(
        cfg.momentum,
        Momentum {
            beta: muon["momentum"].as_f64().unwrap(),
            kind: MomentumKind::Ema,
            nesterov: muon["nesterov"].as_bool().unwrap(),
        }
    );
    // X/max(‖X‖_F, eps), then ns_steps quintic steps of torch's coefficients.
    let eps = muon["eps"].as_f64().unwrap();
    assert_eq!(cfg.msign, Msign::MuonQuinticClamp { eps });
    let schedule = cfg.msign.schedule().unwrap();
    assert_eq!(schedule.normalization, 1.0);
    assert_eq!(Some(schedule.steps.len() as u64), muon["ns_steps"].as_u64());
    let abc: Vec<f64> = muon["ns_coefficients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_f64().unwrap())
        .collect();
    for step in &schedule.steps {
        assert_eq!(vec![step.a, step.b, step.c], abc);
    }
    // adjust_lr_fn None is "original": √max(1, rows/cols) with rows = fan-out.
    assert!(matches!(
        muon["adjust_lr_fn"].as_str(),
        None | Some("original")
    ));
    assert_eq!(
        (cfg.scale, cfg.layout),
        (UpdateScale::Original, Layout::OutIn)
    );
    let cfg = AdamWConfig::torch();
    let betas = adamw["betas"].as_array().unwrap();
    assert_eq!(betas[0].as_f64(), Some(cfg.beta1));
    assert_eq!(betas[1].as_f64(), Some(cfg.beta2));
    assert_eq!(adamw["eps"].as_f64(), Some(cfg.eps));
    assert_eq!(adamw["weight_decay"].as_f64(), Some(cfg.weight_decay));
    // What kappa's AdamW does not offer is off in torch's defaults.
    assert_eq!(adamw["amsgrad"].as_bool(), Some(false));
    assert_eq!(adamw["maximize"].as_bool(), Some(false));
}

#[test]
fn a_setting_that_differs_from_torch_in_one_number_fails_the_comparison() {
    let Some(reference) = reference() else {
        return;
    };
    let inputs = inputs();
    let torch_adamw = AdamWConfig::torch();
    let deviations = [
        (
            "AdamW weight decay 0.02",
            muon_f32(),
            AdamWConfig {
                weight_decay: 0.02,
                ..torch_adamw
            },
        ),
        (
            "AdamW β₂ 0.99",
            muon_f32(),
            AdamWConfig {
                beta2: 0.99,
                ..torch_adamw
            },
        ),
        (
            "Muon weight decay 0.05",
            MuonConfig {
                weight_decay: 0.05,
                ..muon_f32()
            },
            torch_adamw,
        ),
        (
            "Muon without Nesterov",
            MuonConfig {
                momentum: Momentum {
                    nesterov: false,
                    ..Momentum::keller()
                },
                ..muon_f32()
            },
            torch_adamw,
        ),
        (
            "Muon without the shape factor",
            MuonConfig {
                scale: UpdateScale::None,
                ..muon_f32()
            },
            torch_adamw,
        ),
    ];
    for (what, muon, adamw) in deviations {
        let gaps = gaps(reference, &kappa_run(&inputs, muon, adamw));
        let worst = gaps.iter().fold(0.0f64, |m, g| m.max(g.diff / g.tol));
        eprintln!("{what}: largest max |Δ| / tol {worst:.1}");
        assert!(
            worst > 1.0,
            "{what} passed the comparison: max |Δ|/tol {worst}"
        );
    }
}
