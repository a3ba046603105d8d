//! Serde for `f64` fields that may be non-finite (κ = ∞ for a rank-deficient matrix, a NaN
//! loss): JSON has no such numbers, so they are written as the strings `"inf"`, `"-inf"` and
//! `"NaN"` and read back exactly. Use with `#[serde(with = "kappa_models::float")]`.

use serde::{Deserialize, Deserializer, Serializer};

/// Writes a finite value as a number, a non-finite one as `"inf"`, `"-inf"` or `"NaN"`.
pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() {
        s.serialize_f64(*x)
    } else if x.is_nan() {
        s.serialize_str("NaN")
    } else if *x > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_str("-inf")
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Repr {
    Number(f64),
    Text(String),
}

/// Reads what [`serialize`] wrote (and `null` as NaN).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match Option::<Repr>::deserialize(d)? {
        None => Ok(f64::NAN),
        Some(Repr::Number(x)) => Ok(x),
        Some(Repr::Text(t)) => match t.as_str() {
            "NaN" | "nan" => Ok(f64::NAN),
            "inf" | "Infinity" => Ok(f64::INFINITY),
            "-inf" | "-Infinity" => Ok(f64::NEG_INFINITY),
            other => Err(serde::de::Error::custom(format!(
                "expected a number, \"inf\", \"-inf\" or \"NaN\", found {other:?}"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, Debug)]
    struct R {
        #[serde(with = "crate::float")]
        x: f64,
    }

    #[test]
    fn non_finite_values_round_trip_through_json() {
        for x in [1.5, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 0.0] {
            let text = serde_json::to_string(&R { x }).unwrap();
            let back: R = serde_json::from_str(&text).unwrap();
            assert!(back.x == x || (x.is_nan() && back.x.is_nan()), "{text}");
        }
        assert!(serde_json::from_str::<R>(r#"{"x":"big"}"#).is_err());
    }
}
