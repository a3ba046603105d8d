//! `results/report.md`: one section per experiment, each built from run folders, each between
//! markers so that `--publish` can replace the sections of the experiments that ran and keep the
//! others ([`document`]).
//!
//! What every experiment's section is made of is written once here: the [`Section`] itself, the
//! runs it was made from ([`runs`]), its table cells ([`cells`]), its plots ([`figures`]), its
//! verdict lines ([`verdict`]) and, for the experiments that train several variants per run, the
//! records grouped by variant ([`variants`]).

pub mod cells;
pub mod document;
pub mod figures;
pub mod runs;
pub mod section;
pub mod variants;
pub mod verdict;

pub use document::{Part, Report, ReportError};
pub use figures::Figures;
pub use runs::{opened, runs_table};
pub use section::Section;
