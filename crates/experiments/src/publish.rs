//! `reproduce --publish`: the report sections of the experiments that ran, with their plots,
//! go into the tracked `docs/results/`; the sections (and plots) of the other experiments stay
//! as they are, so `--only X --publish` updates X alone.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

use crate::report::Report;

/// Splices the parts of `ran` from `<results>/report.md` into `<docs>/report.md` (`docs` is
/// `docs/results` by default; [`Report::splice`], in registry order) and replaces each such
/// experiment's plots under `<docs>/<name>/` with the ones its new part embeds. Nothing is
/// written when the splice is refused (two scales).
pub fn publish(results: &Path, docs: &Path, ran: &[&str]) -> Result<()> {
    let new_path = results.join("report.md");
    let new = read(&new_path)?.unwrap_or_default();
    let old_path = docs.join("report.md");
    let old = read(&old_path)?.unwrap_or_default();
    let merged = old
        .splice(&new, ran, kappa_cli::EXPERIMENTS)
        .with_context(|| format!("publishing into {}", old_path.display()))?;
    for name in ran {
        let plots = docs.join(name);
        if plots.exists() {
            fs::remove_dir_all(&plots).with_context(|| format!("removing {}", plots.display()))?;
        }
    }
    for rel in new.images(ran) {
        let target = docs.join(rel);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(results.join(rel), &target).with_context(|| format!("copying {rel}"))?;
    }
    fs::create_dir_all(docs)?;
    fs::write(&old_path, merged.render())
        .with_context(|| format!("writing {}", old_path.display()))?;
    Ok(())
}

/// The report at `path`, `None` when there is none.
fn read(path: &Path) -> Result<Option<Report>> {
    match fs::read_to_string(path) {
        Ok(text) => Report::parse(&text)
            .map(Some)
            .with_context(|| format!("reading {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}
