//! Which axis of a stored weight matrix is fan-in: `nn.Linear`'s (out, in) or x·W's (in, out).
//! Muon's shape factor and NorMuon's output neurons read it.

use serde::{Deserialize, Serialize};

/// How the weight matrix is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// Rows are outputs, columns inputs: `nn.Linear`'s (out, in), y = W·x.
    #[default]
    OutIn,
    /// Rows are inputs, columns outputs: (in, out), y = x·W.
    InOut,
}

impl Layout {
    /// (fan_out, fan_in) of an m×n matrix stored in this layout.
    pub fn fans(&self, rows: usize, cols: usize) -> (usize, usize) {
        match self {
            Layout::OutIn => (rows, cols),
            Layout::InOut => (cols, rows),
        }
    }
}
