//! The three sizes every experiment has: `smoke` for tests, `cpu` for this machine, `paper` for a
//! GPU machine.

use std::fmt;
use std::str::FromStr;

use crate::names::unknown;

/// How large an experiment runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum Scale {
    /// Seconds; exercised by the test suite.
    Smoke,
    /// The default: the whole suite in about an hour on 2 cores.
    Cpu,
    /// The papers' sizes, for a GPU machine.
    Paper,
}

impl Scale {
    /// Every scale, smallest first.
    pub const ALL: [Scale; 3] = [Scale::Smoke, Scale::Cpu, Scale::Paper];

    /// The lowercase name used on the command line, in folder names and in the config files
    /// (`experiments/<name>/<scale>.toml`).
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
        Scale::ALL
            .into_iter()
            .find(|scale| scale.name() == s)
            .ok_or_else(|| unknown(s, &Scale::ALL.map(Scale::name), "scale"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_typos_are_refused() {
        for scale in Scale::ALL {
            assert_eq!(scale.name().parse::<Scale>(), Ok(scale));
        }
        let err = "gpu".parse::<Scale>().unwrap_err();
        assert!(err.contains("smoke, cpu, paper"), "{err}");
        let err = "smok".parse::<Scale>().unwrap_err();
        assert!(err.contains("did you mean `smoke`"), "{err}");
    }
}
