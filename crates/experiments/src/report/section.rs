//! One experiment's section of the report, in Markdown: paragraphs, tables and images.

use std::fmt::Write as _;
use std::path::Path;

/// One experiment's part of the report, in Markdown.
#[derive(Default)]
pub struct Section {
    title: String,
    body: String,
}

impl Section {
    /// A section with a title (the experiment name).
    pub fn new(title: &str) -> Self {
        Self {
            title: title.to_string(),
            body: String::new(),
        }
    }

    /// A paragraph of text.
    pub fn paragraph(&mut self, text: &str) -> &mut Self {
        let _ = write!(self.body, "{}\n\n", text.trim());
        self
    }

    /// A Markdown table.
    pub fn table<S: AsRef<str>>(&mut self, headers: &[&str], rows: &[Vec<S>]) -> &mut Self {
        let _ = writeln!(self.body, "| {} |", headers.join(" | "));
        let _ = writeln!(self.body, "|{}", "---|".repeat(headers.len()));
        for row in rows {
            let cells: Vec<&str> = row.iter().map(AsRef::as_ref).collect();
            let _ = writeln!(self.body, "| {} |", cells.join(" | "));
        }
        self.body.push('\n');
        self
    }

    /// An embedded image; `path` is relative to the report.
    pub fn image(&mut self, alt: &str, path: &str) -> &mut Self {
        let _ = write!(self.body, "![{alt}]({path})\n\n");
        self
    }

    /// An embedded image file, linked relative to `report_dir` when it lies below it (so links
    /// stay valid when the results folder moves, e.g. when `--publish` copies it).
    pub fn image_file(&mut self, alt: &str, file: &Path, report_dir: &Path) -> &mut Self {
        let link = file.strip_prefix(report_dir).unwrap_or(file);
        self.image(alt, &link.to_string_lossy())
    }

    /// The rendered Markdown.
    pub fn to_markdown(&self) -> String {
        format!("## {}\n\n{}", self.title, self.body)
    }
}
