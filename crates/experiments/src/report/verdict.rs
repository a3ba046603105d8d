//! Verdict lines: whether a paper claim held at this scale, with the numbers that decide it.

/// `held` or `did not hold`: a verdict cell, followed by its numbers.
pub fn held(ok: bool) -> &'static str {
    if ok {
        "held"
    } else {
        "did not hold"
    }
}

/// A verdict paragraph: `*Claim: CLAIM* **Held.** EVIDENCE`, or with `failed` (`Did not hold.`,
/// `Did not hold everywhere.`) in bold when the claim did not hold.
///
/// ```
/// use kappa_experiments::report::verdict::claim;
/// assert_eq!(
///     claim("κ = 1.", true, "Did not hold.", "Max |κ − 1| = 1e-9."),
///     "*Claim: κ = 1.* **Held.** Max |κ − 1| = 1e-9."
/// );
/// ```
pub fn claim(claim: &str, ok: bool, failed: &str, evidence: &str) -> String {
    let verdict = if ok { "Held." } else { failed };
    format!("*Claim: {claim}* **{verdict}** {evidence}")
}

/// A verdict cell: [`held`] with the two numbers compared, `held (ours vs theirs)`.
pub fn versus(ok: bool, ours: String, theirs: String) -> String {
    format!("{} ({ours} vs {theirs})", held(ok))
}
