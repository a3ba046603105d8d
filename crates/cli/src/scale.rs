//! How large an experiment runs: `smoke` for tests, `cpu` for a 2-core machine, `gpu` for one
//! GPU, `paper` for the papers' sizes, and `long` (only some experiments) for a CPU-sized model
//! trained over the long horizon a claim needs. What each unit is expected to take is in
//! `experiments/costs.toml`, which `cargo xtask reproduce --plan` prints.

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
    /// The smallest configs, which exercise every code path: what the test suite runs.
    Smoke,
    /// The default: sized for a 2-core CPU.
    Cpu,
    /// A CPU-sized model trained long: only the experiments whose claim needs a long horizon
    /// have it (manifolds: DGram attention's divergence after an accumulated spectral step
    /// Σηₜ ≈ 290).
    Long,
    /// Between cpu and paper: models sized for one current GPU.
    Gpu,
    /// The papers' sizes, for a GPU machine.
    Paper,
}

impl Scale {
    /// Every scale, cheapest first.
    pub const ALL: [Scale; 5] = [
        Scale::Smoke,
        Scale::Cpu,
        Scale::Long,
        Scale::Gpu,
        Scale::Paper,
    ];

    /// The lowercase name used on the command line, in folder names and in the config files
    /// (`experiments/<name>/<scale>.toml`).
    pub fn name(self) -> &'static str {
        match self {
            Scale::Smoke => "smoke",
            Scale::Cpu => "cpu",
            Scale::Long => "long",
            Scale::Gpu => "gpu",
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
        let err = "huge".parse::<Scale>().unwrap_err();
        assert!(err.contains("smoke, cpu, long, gpu, paper"), "{err}");
        let err = "smok".parse::<Scale>().unwrap_err();
        assert!(err.contains("did you mean `smoke`"), "{err}");
    }
}
