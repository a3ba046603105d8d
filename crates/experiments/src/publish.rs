//! `reproduce --publish`: the report sections of the experiments that ran, with their plots,
//! go into the tracked `docs/results/`; the sections (and plots) of the other experiments stay
//! as they are, so `--only X --publish` updates X alone.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Component, Path};

use anyhow::{Context, Result};

use crate::report::Report;

/// Splices the parts of `ran` from `<results>/report.md` into `<docs>/report.md` (`docs` is
/// `docs/results` by default; [`Report::splice`], in registry order), copies the plots their
/// new parts embed, and then removes the plots their old parts embedded that the new ones do
/// not: other files under `<docs>/<name>/` are left alone, and so is the folder unless that
/// empties it. Nothing is written when the splice is refused (two scales).
pub fn publish(results: &Path, docs: &Path, ran: &[&str]) -> Result<()> {
    let new_path = results.join("report.md");
    let new = read(&new_path)?.unwrap_or_default();
    let old_path = docs.join("report.md");
    let old = read(&old_path)?.unwrap_or_default();
    let merged = old
        .splice(&new, ran, kappa_cli::EXPERIMENTS)
        .with_context(|| format!("publishing into {}", old_path.display()))?;
    let wanted: BTreeSet<&str> = new.images(ran).collect();
    for rel in &wanted {
        let target = docs.join(rel);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(results.join(rel), &target).with_context(|| format!("copying {rel}"))?;
    }
    for rel in old.images(ran).filter(|rel| !wanted.contains(rel)) {
        remove_plot(docs, rel)?;
    }
    fs::create_dir_all(docs)?;
    fs::write(&old_path, merged.render())
        .with_context(|| format!("writing {}", old_path.display()))?;
    Ok(())
}

/// Removes the plot `rel` (a path the old report embedded) under `docs`, and its folder when
/// that leaves it empty. A path that leaves `docs` (absolute, or with `..`) is not touched.
fn remove_plot(docs: &Path, rel: &str) -> Result<()> {
    let rel = Path::new(rel);
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Ok(());
    }
    let path = docs.join(rel);
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
    }
    if let Some(parent) = path.parent().filter(|p| *p != docs) {
        // Fails, changing nothing, while the folder holds anything else.
        let _ = fs::remove_dir(parent);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Part;
    use crate::scale::Scale;

    fn report_with(name: &str, plots: &[&str]) -> String {
        let markdown = (plots.iter())
            .map(|p| format!("![plot]({p})\n"))
            .collect::<String>();
        let part = Part {
            name: name.to_string(),
            scale: Scale::Smoke,
            seconds: 1.0,
            markdown,
        };
        Report { parts: vec![part] }.render()
    }

    #[test]
    fn publishing_replaces_old_plots_and_keeps_other_files() {
        let root = std::env::temp_dir().join(format!("kappa-publish-{}", std::process::id()));
        let (results, docs) = (root.join("results"), root.join("docs"));
        let name = kappa_cli::EXPERIMENTS[0];
        fs::create_dir_all(results.join(name)).unwrap();
        fs::create_dir_all(docs.join(name)).unwrap();
        let (old_plot, new_plot) = (format!("{name}/old.svg"), format!("{name}/new.svg"));
        fs::write(docs.join("report.md"), report_with(name, &[&old_plot])).unwrap();
        fs::write(docs.join(&old_plot), "old").unwrap();
        fs::write(docs.join(name).join("notes.md"), "mine").unwrap();
        fs::write(results.join("report.md"), report_with(name, &[&new_plot])).unwrap();
        fs::write(results.join(&new_plot), "new").unwrap();

        publish(&results, &docs, &[name]).unwrap();

        assert_eq!(fs::read_to_string(docs.join(&new_plot)).unwrap(), "new");
        assert!(!docs.join(&old_plot).exists(), "the old report's plot goes");
        assert_eq!(
            fs::read_to_string(docs.join(name).join("notes.md")).unwrap(),
            "mine"
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_plot_path_outside_the_docs_folder_is_not_removed() {
        let root = std::env::temp_dir().join(format!("kappa-plot-{}", std::process::id()));
        let docs = root.join("docs");
        fs::create_dir_all(&docs).unwrap();
        fs::write(root.join("keep.svg"), "mine").unwrap();
        remove_plot(&docs, "../keep.svg").unwrap();
        assert!(root.join("keep.svg").exists());
        fs::remove_dir_all(&root).unwrap();
    }
}
