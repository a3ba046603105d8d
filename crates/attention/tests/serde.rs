//! The `serde` feature: the config-like types round-trip through TOML and JSON under their
//! snake_case names (the names kappa-models' configs write).
#![cfg(feature = "serde")]

use kappa_attention::{AttentionOptions, HeadLayout, LambdaPolicy, ScoreScale};
use serde::{Deserialize, Serialize};

/// A config as a model would carry these types.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Config {
    layout: HeadLayout,
    scaling: ScoreScale,
    options: AttentionOptions,
    policy: LambdaPolicy,
}

fn round_trip_toml(c: &Config) -> String {
    let text = toml::to_string(c).unwrap();
    let back: Config = toml::from_str(&text).unwrap();
    assert_eq!(&back, c, "{text}");
    let json = serde_json::to_string(c).unwrap();
    assert_eq!(&serde_json::from_str::<Config>(&json).unwrap(), c, "{json}");
    text
}

#[test]
fn every_variant_round_trips_under_its_snake_case_name() {
    let policies = [
        (LambdaPolicy::Fixed(10.0), "[policy]\nfixed = 10.0"),
        (
            LambdaPolicy::TargetKappa(1.5),
            "[policy]\ntarget_kappa = 1.5",
        ),
        (
            LambdaPolicy::SufficientDecrease { margin: 0.25 },
            "[policy.sufficient_decrease]\nmargin = 0.25",
        ),
        (
            LambdaPolicy::RelativeToSigmaMax(10.0),
            "[policy]\nrelative_to_sigma_max = 10.0",
        ),
    ];
    let cases = [
        (
            HeadLayout::Shifted,
            ScoreScale::InvSqrtK,
            "layout = \"shifted\"",
            "scaling = \"inv_sqrt_k\"",
        ),
        (
            HeadLayout::SameBlock,
            ScoreScale::One,
            "layout = \"same_block\"",
            "scaling = \"one\"",
        ),
        (
            HeadLayout::SameBlock,
            ScoreScale::Custom(2.5),
            "layout = \"same_block\"",
            "[scaling]\ncustom = 2.5",
        ),
    ];
    for (layout, scaling, layout_text, scaling_text) in cases {
        for (policy, policy_text) in policies {
            let c = Config {
                layout,
                scaling,
                options: AttentionOptions {
                    scale: scaling,
                    causal: true,
                },
                policy,
            };
            let text = round_trip_toml(&c);
            for want in [layout_text, scaling_text, policy_text, "causal = true"] {
                assert!(text.contains(want), "{want:?} not in\n{text}");
            }
        }
    }
}

#[test]
fn the_toml_kappa_models_writes_reads_back() {
    #[derive(Debug, PartialEq, Deserialize)]
    struct Written {
        layout: HeadLayout,
        scaling: ScoreScale,
        custom: ScoreScale,
    }
    let w: Written =
        toml::from_str("layout = \"shifted\"\nscaling = \"inv_sqrt_k\"\ncustom = { custom = 8.0 }")
            .unwrap();
    assert_eq!(
        w,
        Written {
            layout: HeadLayout::Shifted,
            scaling: ScoreScale::InvSqrtK,
            custom: ScoreScale::Custom(8.0),
        }
    );
    assert!(
        toml::from_str::<Written>("layout = \"Shifted\"\nscaling = \"one\"\ncustom = \"one\"")
            .is_err()
    );
}
