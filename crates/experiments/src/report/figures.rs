//! Where a section's plots go: PNG files in the scale folder, embedded with links relative to
//! the report ([`Section::image_file`]).

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::section::Section;
use crate::plot::LinePlot;

/// The folder plots are saved in and the folder of the report that links them.
#[derive(Clone, Copy, Debug)]
pub struct Figures<'a> {
    out_dir: &'a Path,
    report_dir: &'a Path,
}

impl<'a> Figures<'a> {
    /// Plots go into `out_dir` (an experiment's scale folder) and are linked from a report in
    /// `report_dir`.
    pub fn new(out_dir: &'a Path, report_dir: &'a Path) -> Self {
        Self {
            out_dir,
            report_dir,
        }
    }

    /// Saves `plot` as `file` in the plot folder; returns its path.
    pub fn save(&self, plot: &LinePlot, file: &str) -> Result<PathBuf> {
        let path = self.out_dir.join(file);
        plot.save(&path)?;
        Ok(path)
    }

    /// Embeds a saved plot in `section`.
    pub fn embed(&self, section: &mut Section, alt: &str, path: &Path) {
        section.image_file(alt, path, self.report_dir);
    }

    /// Saves `plot` as `file` and embeds it in `section`.
    pub fn add(&self, section: &mut Section, alt: &str, plot: &LinePlot, file: &str) -> Result<()> {
        let path = self.save(plot, file)?;
        self.embed(section, alt, &path);
        Ok(())
    }

    /// Like [`Figures::add`], but a plot that cannot be drawn (no finite points) or written is
    /// left out of the section instead of failing it.
    pub fn add_if_drawn(&self, section: &mut Section, alt: &str, plot: &LinePlot, file: &str) {
        if let Ok(path) = self.save(plot, file) {
            self.embed(section, alt, &path);
        }
    }
}
