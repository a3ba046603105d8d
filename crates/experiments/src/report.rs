//! `results/report.md`: one section per experiment, each built from run folders, each between
//! markers (`<!-- kappa:section NAME … -->` … `<!-- kappa:end NAME -->`) so that `--publish`
//! can replace the sections of the experiments that ran and keep the others
//! ([`Report::splice`], [`crate::publish`]).

use std::fmt::Write as _;
use std::path::Path;

use crate::run::{RunRecord, RunStatus};
use crate::scale::Scale;

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

/// One line per run: seed, status and wall time, so a report says what it was made from.
pub fn runs_table(section: &mut Section, runs: &[RunRecord]) {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let status = match &r.info.status {
                RunStatus::Completed => "completed".to_string(),
                RunStatus::Diverged { step, reason } => {
                    format!("diverged at step {step} ({reason})")
                }
                RunStatus::Failed { error } => format!("failed: {}", error.replace('\n', " ")),
            };
            vec![
                r.info.run.seed.to_string(),
                status,
                format!("{:.1}", r.info.wall_seconds),
                r.info.run.threads.to_string(),
                r.info.run.device.clone(),
            ]
        })
        .collect();
    section.table(&["seed", "status", "wall s", "threads", "device"], &rows);
}

/// One experiment's part of `report.md`, between the markers
/// `<!-- kappa:section NAME scale=S seconds=T -->` and `<!-- kappa:end NAME -->`: what
/// `--publish` replaces when that experiment ran and keeps when it did not.
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    /// The experiment's registry name.
    pub name: String,
    /// The scale its runs ran at.
    pub scale: Scale,
    /// The wall time of its runs.
    pub seconds: f64,
    /// The section's Markdown ([`Section::to_markdown`]).
    pub markdown: String,
}

/// `report.md`: a header made from the parts (scale, total run time), then one [`Part`] per
/// experiment in registry order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// The parts, in registry order.
    pub parts: Vec<Part>,
}

/// Why a `report.md` could not be read back or spliced.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A marker is malformed, unclosed or closes another section.
    #[error("line {line}: {problem}")]
    Marker {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: String,
    },
    /// The report has text but no section markers (a report written before there were any).
    #[error(
        "the report has no `<!-- kappa:section … -->` markers, so its sections cannot be kept; \
         publish a run of every experiment to replace it"
    )]
    NoMarkers,
    /// Publishing would put sections of two scales into one report.
    #[error(
        "the published report holds `{kept}` sections ({names}), and this run is at `{new}`: \
         publish a `{kept}` run, or run every experiment at `{new}` to replace them all"
    )]
    MixedScales {
        /// The scale of the sections that would be kept.
        kept: Scale,
        /// Their experiments.
        names: String,
        /// The scale of the new sections.
        new: Scale,
    },
}

const OPEN: &str = "<!-- kappa:section ";
const CLOSE: &str = "<!-- kappa:end ";
const TAIL: &str = " -->";

impl Report {
    /// The scale of the report (of its first part; [`Report::splice`] never mixes scales).
    pub fn scale(&self) -> Option<Scale> {
        self.parts.first().map(|p| p.scale)
    }

    /// The Markdown: the header, then every part between its markers.
    pub fn render(&self) -> String {
        let mut text = String::new();
        let scale = self.scale().map_or("-".to_string(), |s| s.to_string());
        let total: f64 = self.parts.iter().map(|p| p.seconds).sum();
        let _ = writeln!(text, "# kappa: reproduction report (scale `{scale}`)\n");
        let _ = writeln!(
            text,
            "Generated by `cargo xtask reproduce --scale {scale}` from the run folders next to \
             this file; nothing here is typed by hand. Each section names the paper claim it \
             tests, the runs it was made from, and whether the claim held at this scale.\n"
        );
        let _ = writeln!(
            text,
            "Total wall time of the runs in this report: {total:.1} s ({:.1} min).\n",
            total / 60.0
        );
        for p in &self.parts {
            let _ = writeln!(
                text,
                "{OPEN}{} scale={} seconds={:.1}{TAIL}",
                p.name, p.scale, p.seconds
            );
            text.push_str(p.markdown.trim_end());
            let _ = write!(text, "\n{CLOSE}{}{TAIL}\n\n", p.name);
        }
        text
    }

    /// Reads a rendered report back: its parts (the header is made anew by
    /// [`Report::render`]). Empty text is an empty report; text without markers is
    /// [`ReportError::NoMarkers`].
    pub fn parse(text: &str) -> Result<Self, ReportError> {
        let mut parts = Vec::new();
        let mut open: Option<(usize, Part)> = None;
        for (i, line) in text.lines().enumerate() {
            let marker = |problem: String| ReportError::Marker {
                line: i + 1,
                problem,
            };
            if let Some(fields) = line.strip_prefix(OPEN) {
                if let Some((at, p)) = &open {
                    return Err(marker(format!(
                        "section {} (line {at}) is not closed",
                        p.name
                    )));
                }
                open = Some((i + 1, parse_open(fields).map_err(marker)?));
            } else if let Some(name) = line.strip_prefix(CLOSE) {
                let name = name.strip_suffix(TAIL).unwrap_or(name);
                match open.take() {
                    Some((_, p)) if p.name == name => parts.push(p),
                    Some((_, p)) => return Err(marker(format!("`end {name}` closes {}", p.name))),
                    None => return Err(marker(format!("`end {name}` without its section"))),
                }
            } else if let Some((_, p)) = &mut open {
                p.markdown.push_str(line);
                p.markdown.push('\n');
            }
        }
        if let Some((at, p)) = open {
            return Err(ReportError::Marker {
                line: at,
                problem: format!("section {} is not closed", p.name),
            });
        }
        if parts.is_empty() && !text.trim().is_empty() {
            return Err(ReportError::NoMarkers);
        }
        Ok(Self { parts })
    }

    /// This (published) report with the parts of the experiments in `ran` taken from `new`
    /// (dropped when `new` has none) and every other part kept, in the order of `order` (names
    /// not in it last). Kept parts must be at the scale of the new ones.
    pub fn splice(
        &self,
        new: &Report,
        ran: &[&str],
        order: &[&str],
    ) -> Result<Report, ReportError> {
        let kept: Vec<&Part> = self
            .parts
            .iter()
            .filter(|p| !ran.contains(&p.name.as_str()))
            .collect();
        let added = new.parts.iter().filter(|p| ran.contains(&p.name.as_str()));
        if let Some(first_new) = added.clone().next() {
            if let Some(other) = kept.iter().find(|p| p.scale != first_new.scale) {
                let names: Vec<&str> = kept.iter().map(|p| p.name.as_str()).collect();
                return Err(ReportError::MixedScales {
                    kept: other.scale,
                    names: names.join(", "),
                    new: first_new.scale,
                });
            }
        }
        let mut parts: Vec<Part> = kept.into_iter().chain(added).cloned().collect();
        let rank = |name: &str| order.iter().position(|n| *n == name).unwrap_or(order.len());
        parts.sort_by_key(|p| rank(&p.name));
        Ok(Report { parts })
    }

    /// The image paths (relative to the report) that the parts of `names` embed.
    pub fn images<'a>(&'a self, names: &'a [&str]) -> impl Iterator<Item = &'a str> {
        self.parts
            .iter()
            .filter(|p| names.contains(&p.name.as_str()))
            .flat_map(|p| p.markdown.lines())
            .filter_map(|l| l.strip_prefix("![").and_then(|r| r.split_once("](")))
            .map(|(_, rest)| rest.trim_end().trim_end_matches(')'))
    }
}

/// The fields of an opening marker: `NAME scale=S seconds=T -->`.
fn parse_open(fields: &str) -> Result<Part, String> {
    let fields = fields
        .strip_suffix(TAIL)
        .ok_or_else(|| format!("a section marker ends with `{TAIL}`"))?;
    let mut words = fields.split_whitespace();
    let name = words
        .next()
        .ok_or("a section marker names its experiment")?;
    let (mut scale, mut seconds) = (None, None);
    for word in words {
        match word.split_once('=') {
            Some(("scale", s)) => scale = Some(s.parse::<Scale>()?),
            Some(("seconds", s)) => {
                seconds = Some(s.parse::<f64>().map_err(|e| format!("seconds={s}: {e}"))?)
            }
            _ => return Err(format!("unknown field `{word}` in the marker of {name}")),
        }
    }
    Ok(Part {
        name: name.to_string(),
        scale: scale.ok_or_else(|| format!("the marker of {name} has no scale="))?,
        seconds: seconds.ok_or_else(|| format!("the marker of {name} has no seconds="))?,
        markdown: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(name: &str, scale: Scale, body: &str) -> Part {
        Part {
            name: name.into(),
            scale,
            seconds: 10.0,
            markdown: format!("## {name}: a claim\n\n{body}\n"),
        }
    }

    const ORDER: &[&str] = &["a", "b", "c"];

    #[test]
    fn a_report_reads_back_as_it_was_written() {
        let report = Report {
            parts: vec![
                part(
                    "a",
                    Scale::Cpu,
                    "| x |\n|---|\n| 1 |\n\n![plot](a/cpu/p.png)",
                ),
                part("c", Scale::Cpu, "text"),
            ],
        };
        let text = report.render();
        assert!(
            text.contains("(scale `cpu`)") && text.contains("20.0 s"),
            "{text}"
        );
        assert!(text.contains("<!-- kappa:section a scale=cpu seconds=10.0 -->\n## a: a claim"));
        assert!(text.contains("<!-- kappa:end c -->"));
        assert_eq!(Report::parse(&text).unwrap(), report);
        assert_eq!(Report::parse(&text).unwrap().render(), text);
        assert_eq!(
            report.images(&["a", "c"]).collect::<Vec<_>>(),
            ["a/cpu/p.png"]
        );
    }

    #[test]
    fn publishing_replaces_only_the_sections_that_ran() {
        let published = Report {
            parts: vec![
                part("a", Scale::Cpu, "old a"),
                part("b", Scale::Cpu, "old b"),
                part("c", Scale::Cpu, "old c"),
            ],
        };
        // A run of `b` alone; its results folder also holds an older run of `a`.
        let new = Report {
            parts: vec![
                part("a", Scale::Cpu, "local a"),
                part("b", Scale::Cpu, "new b"),
            ],
        };
        let merged = published.splice(&new, &["b"], ORDER).unwrap();
        let bodies: Vec<&str> = merged.parts.iter().map(|p| p.markdown.as_str()).collect();
        assert_eq!(
            bodies,
            [
                "## a: a claim\n\nold a\n",
                "## b: a claim\n\nnew b\n",
                "## c: a claim\n\nold c\n"
            ]
        );
        // Through the text, as `--publish` does it.
        let merged_text = Report::parse(&published.render())
            .unwrap()
            .splice(&Report::parse(&new.render()).unwrap(), &["b"], ORDER)
            .unwrap()
            .render();
        assert_eq!(merged_text, merged.render());
        // Into an empty docs folder, or with a section that is new there.
        let first = Report::default().splice(&new, &["b"], ORDER).unwrap();
        assert_eq!(first.parts, [part("b", Scale::Cpu, "new b")]);
        let grown = Report {
            parts: vec![part("c", Scale::Cpu, "old c")],
        }
        .splice(&new, &["b", "a"], ORDER)
        .unwrap();
        let names: Vec<&str> = grown.parts.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn scales_are_never_mixed() {
        let published = Report {
            parts: vec![part("a", Scale::Cpu, ""), part("b", Scale::Cpu, "")],
        };
        let smoke = Report {
            parts: vec![part("b", Scale::Smoke, "")],
        };
        let err = published
            .splice(&smoke, &["b"], ORDER)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("holds `cpu` sections (a)") && err.contains("at `smoke`"),
            "{err}"
        );
        // Every experiment ran: nothing is kept, so the scale may change.
        let all = Report {
            parts: vec![part("a", Scale::Smoke, ""), part("b", Scale::Smoke, "")],
        };
        assert_eq!(published.splice(&all, &["a", "b"], ORDER).unwrap(), all);
    }

    #[test]
    fn broken_markers_are_errors_with_a_line() {
        assert_eq!(Report::parse("").unwrap(), Report::default());
        assert!(matches!(
            Report::parse("# old report\n\n## a\n"),
            Err(ReportError::NoMarkers)
        ));
        let unclosed = "<!-- kappa:section a scale=cpu seconds=1 -->\n## a\n";
        assert!(Report::parse(unclosed)
            .unwrap_err()
            .to_string()
            .contains("line 1: section a is not closed"));
        let crossed = "<!-- kappa:section a scale=cpu seconds=1 -->\n<!-- kappa:end b -->\n";
        assert!(Report::parse(crossed)
            .unwrap_err()
            .to_string()
            .contains("line 2: `end b` closes a"));
        let bad = "<!-- kappa:section a scale=gpu seconds=1 -->\n<!-- kappa:end a -->\n";
        assert!(Report::parse(bad)
            .unwrap_err()
            .to_string()
            .contains("unknown scale `gpu`"));
    }
}
