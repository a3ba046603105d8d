//! The built-in config files `experiments/<name>/<scale>.toml` say everything their runs use:
//! each parses into its experiment's config and passes its checks, and serialized again that
//! config is the file's data exactly — no key of the file is ignored, no field is left to a
//! default — except the four `[train]` keys that come from the run context (seed, threads,
//! device, progress), which the files omit.
//!
//! (When the files were generated from the Rust literals they replaced, this test compared
//! each file with its literal, and all 21 were equal.)

use kappa_experiments::config::{builtins, ConfigSource, EXPERIMENT_KEY};
use kappa_experiments::registry;

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

#[test]
fn every_file_is_exactly_the_config_its_runs_use() {
    let mut files = 0;
    for b in builtins() {
        let e = registry()
            .into_iter()
            .find(|e| e.name() == b.experiment)
            .unwrap();
        let source = ConfigSource::builtin(b.experiment, b.scale).unwrap();
        let resolved = e
            .resolve(&source, &[])
            .unwrap_or_else(|err| panic!("{err}"));
        let mut written: toml::Table = toml::from_str(source.text()).unwrap();
        written.remove(EXPERIMENT_KEY);
        let mut used = toml::Value::Table(resolved.table().clone());
        strip_run_keys(&mut used);
        assert_eq!(used, toml::Value::Table(written), "{}", source.origin());
        files += 1;
    }
    // Eleven experiments at smoke, cpu, gpu and paper; manifolds at long; the scaling series at
    // smoke, long and gpu.
    assert_eq!(files, 48);
}
