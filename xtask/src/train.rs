//! `cargo xtask train --config FILE`: check the command line and the file (it exists and is
//! TOML) before any install or build, set up, build the `kappa-experiments` binary and forward
//! the options to its `train` subcommand, which checks every key and trains. The options are
//! kappa-cli's [`TrainArgs`], the struct the binary parses.

use std::path::Path;

use anyhow::Result;
use kappa_cli::TrainArgs;

use crate::data::DataSelection;
use crate::reproduce::experiments_binary;
use crate::setup;
use crate::workspace::{run, Workspace};

/// `cargo xtask train`.
pub fn train(ws: &Workspace, args: &TrainArgs) -> Result<()> {
    let args = check(args)?;
    let tc = setup::setup(ws, &DataSelection::default())?;
    let mut cmd = experiments_binary(ws, &tc, args.threads);
    cmd.arg("train").args(args.to_args());
    crate::workspace::leave_ctrl_c_to_the_child()?;
    run(&mut cmd)
}

/// The file exists and is TOML; the paths are made absolute (the binary starts in the
/// workspace root, the user gave them relative to where they are).
fn check(args: &TrainArgs) -> Result<TrainArgs> {
    let path = &args.config;
    let text = crate::workspace::read_config_text(path)?;
    toml::from_str::<toml::Table>(&text)
        .map_err(|e| anyhow::anyhow!("{}: not valid TOML: {e}", path.display()))?;
    let absolute =
        |p: &Path| -> Result<std::path::PathBuf> { Ok(std::env::current_dir()?.join(p)) };
    Ok(TrainArgs {
        config: absolute(path)?,
        out: absolute(&args.out)?,
        ..args.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn a_missing_or_malformed_file_fails_before_setup() {
        let dir = std::env::temp_dir().join(format!("kappa-xtask-train-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let parse = |p: &Path| -> TrainArgs {
            kappa_cli::parse_args(["--config", p.to_str().unwrap()]).unwrap()
        };
        let missing = check(&parse(&dir.join("none.toml"))).unwrap_err();
        assert!(format!("{missing:#}").contains("none.toml"), "{missing:#}");
        let bad = dir.join("bad.toml");
        fs::write(&bad, "name = ").unwrap();
        let err = check(&parse(&bad)).unwrap_err();
        assert!(format!("{err:#}").contains("not valid TOML"), "{err:#}");
        let good = dir.join("good.toml");
        fs::write(&good, "name = \"x\"").unwrap();
        let args = check(&parse(&good)).unwrap();
        assert!(args.config.is_absolute() && args.out.is_absolute());
        // A folder (like a FIFO, which would block) is not read as a config.
        let err = check(&parse(&dir)).unwrap_err();
        assert!(format!("{err:#}").contains("not a regular file"), "{err:#}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
