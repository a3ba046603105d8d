//! The three sizes every experiment has: `smoke` for tests, `cpu` for this machine, `paper` for a
//! GPU machine.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How large an experiment runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// Seconds; exercised by the test suite.
    Smoke,
    /// The default: the whole suite in about an hour on 2 cores.
    Cpu,
    /// The papers' sizes, for a GPU machine.
    Paper,
}

impl Scale {
    /// The lowercase name used on the command line and in folder names.
    pub fn name(self) -> &'static str {
        match self {
            Scale::Smoke => "smoke",
            Scale::Cpu => "cpu",
            Scale::Paper => "paper",
        }
    }
}

impl fmt::Display for Scale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scale {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "smoke" => Ok(Scale::Smoke),
            "cpu" => Ok(Scale::Cpu),
            "paper" => Ok(Scale::Paper),
            other => Err(format!("unknown scale `{other}`: use smoke, cpu or paper")),
        }
    }
}
