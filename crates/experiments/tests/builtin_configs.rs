//! Each file `experiments/<name>/<scale>.toml` holds exactly the config that the experiment's
//! Rust literal built (the files were generated from the literals): parsed, then serialized
//! again, it equals the literal serialized — except the four `[train]` keys that come from the
//! run context (seed, threads, device, progress), which the files omit.

use std::fs;

use kappa_experiments::experiments::*;
use kappa_experiments::{Experiment, Scale};

/// Removes the run-context keys from every training table (found by two keys only it has).
fn strip_run_keys(value: &mut toml::Value) {
    match value {
        toml::Value::Table(t) => {
            if t.contains_key("warmup_steps") && t.contains_key("divergence_factor") {
                for key in ["seed", "threads", "device", "progress"] {
                    t.remove(key);
                }
            }
            t.iter_mut().for_each(|(_, v)| strip_run_keys(v));
        }
        toml::Value::Array(a) => a.iter_mut().for_each(strip_run_keys),
        _ => {}
    }
}

fn file_equals_literal<E: Experiment>(experiment: &E) {
    let name = experiment.name();
    for scale in [Scale::Smoke, Scale::Cpu, Scale::Paper] {
        let path = format!(
            "{}/../../experiments/{name}/{}.toml",
            env!("CARGO_MANIFEST_DIR"),
            scale.name()
        );
        let text = fs::read_to_string(&path).unwrap();
        let mut table: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(
            table.remove("experiment"),
            Some(toml::Value::String(name.into()))
        );
        let parsed: E::Config = toml::Value::Table(table)
            .try_into()
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut from_file = toml::Value::try_from(&parsed).unwrap();
        let mut from_literal = toml::Value::try_from(experiment.config(scale)).unwrap();
        strip_run_keys(&mut from_file);
        strip_run_keys(&mut from_literal);
        assert_eq!(from_file, from_literal, "{path}");
        eprintln!("{path}: equal to the literal");
    }
}

#[test]
fn every_file_equals_its_rust_literal() {
    file_equals_literal(&random_spectra::RandomSpectra);
    file_equals_literal(&theory::Theory);
    file_equals_literal(&convergence::Convergence);
    file_equals_literal(&optim_geometry::OptimGeometry);
    file_equals_literal(&vit_fmnist::VitFmnist);
    file_equals_literal(&gpt_sotu::GptSotu);
    file_equals_literal(&manifolds::Manifolds);
}
