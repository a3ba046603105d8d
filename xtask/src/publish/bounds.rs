//! Physical limits: what the machine can do at most (measured by `--bench limits` in the same
//! run), the work model that says what one of kappa's calls asks of it, and kappa's fraction.
//!
//! A row's rate is its work over kappa's median time: flops / s against a GEMM bound, bytes / s
//! against memory. Its fraction is that rate over the limit of the row's bound measured at the
//! row's thread count: 1 would be a kappa call running at the machine's peak GEMM throughput
//! (or triad bandwidth) for all of its time.

use serde::Deserialize;

/// The limit a row's work is measured against (the names the bench records use).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub(crate) enum Bound {
    /// f32 GEMM throughput.
    #[serde(rename = "gemm_f32")]
    GemmF32,
    /// bf16 GEMM throughput.
    #[serde(rename = "gemm_bf16")]
    GemmBf16,
    /// f64 GEMM throughput.
    #[serde(rename = "gemm_f64")]
    GemmF64,
    /// Memory bandwidth (the triad's).
    #[serde(rename = "memory")]
    Memory,
}

impl Bound {
    /// The limit's name on the page.
    fn name(self) -> &'static str {
        match self {
            Bound::GemmF32 => "f32 GEMM",
            Bound::GemmBf16 => "bf16 GEMM",
            Bound::GemmF64 => "f64 GEMM",
            Bound::Memory => "triad",
        }
    }

    /// The rate's unit.
    fn unit(self) -> &'static str {
        match self {
            Bound::Memory => "GB/s",
            _ => "GFLOP/s",
        }
    }
}

/// The machine's limits at one thread count, as `benches/benches/limits.rs` records them.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub(crate) struct Limits {
    pub(crate) threads: u32,
    pub(crate) gemm_n: u64,
    pub(crate) gemm_f32_gflops: f64,
    pub(crate) gemm_f64_gflops: f64,
    pub(crate) gemm_bf16_gflops: Option<f64>,
    pub(crate) triad_len: u64,
    pub(crate) triad_gbs: f64,
}

impl Limits {
    /// The limit of `bound`, in GFLOP/s or GB/s (`None`: bf16 on a CPU without bf16 products).
    fn peak(&self, bound: Bound) -> Option<f64> {
        match bound {
            Bound::GemmF32 => Some(self.gemm_f32_gflops),
            Bound::GemmF64 => Some(self.gemm_f64_gflops),
            Bound::GemmBf16 => self.gemm_bf16_gflops,
            Bound::Memory => Some(self.triad_gbs),
        }
    }

    /// One row of the limits table.
    fn row(&self) -> String {
        let bf16 = self
            .gemm_bf16_gflops
            .map_or("— (no native bf16)".to_string(), |g| format!("{g:.1}"));
        format!(
            "| {} | {:.1} | {:.1} | {bf16} | {:.1} |",
            self.threads, self.gemm_f32_gflops, self.gemm_f64_gflops, self.triad_gbs
        )
    }
}

/// A comparison's work model: how much work one kappa call at a parameter does, against which
/// bound, and the formula as the page states it.
pub(crate) struct Model {
    /// The formula, in words and symbols.
    pub(crate) formula: &'static str,
    /// The bound and the flops or bytes at a parameter (`None`: a parameter it cannot read).
    pub(crate) of: fn(&str) -> Option<(Bound, f64)>,
}

/// The two cells of a row: kappa's rate and its fraction of the row's limit (— where the work,
/// the time or the limit is unknown).
pub(crate) fn rate_cells(
    work: Option<(Bound, f64)>,
    seconds: Option<f64>,
    limits: Option<&Limits>,
) -> (String, String) {
    let none = || "—".to_string();
    let (Some((bound, amount)), Some(s)) = (work, seconds) else {
        return (none(), none());
    };
    let rate = amount / s * 1e-9;
    let rate_cell = format!("{rate:.1} {}", bound.unit());
    let fraction = limits
        .and_then(|l| l.peak(bound))
        .map_or_else(none, |peak| {
            format!("{:.2} of {}", rate / peak, bound.name())
        });
    (rate_cell, fraction)
}

/// How the limits are measured and what the rate columns mean: said once, in the page's
/// introduction (each part gives its run's n and triad length with its table).
pub(crate) const LIMITS_METHOD: &str = "Each part gives the machine's limits measured in its run \
     (`--bench limits`, run with every `--publish`). GEMM: the best of five n×n products through \
     libtorch, 2n³ flops each; bf16 only where the CPU has native bf16 products. Triad: a[i] = \
     b[i] + s·c[i] over three f64 arrays on the run's threads, 24 bytes an element (two reads, \
     one write, as STREAM counts it), the best of ten. In every table, kappa's rate is the \
     table's work model over kappa's median time, and the fraction is that rate over the limit \
     of the row's bound at the row's thread count, in the same part.";

/// A part's limits: one row per thread count measured in its run, or a line saying that none
/// was (then no row of the part shows a fraction of a limit).
pub(crate) fn render_limits(limits: &[&Limits]) -> String {
    let Some(first) = limits.first() else {
        return "\nThe machine's limits were not measured in this run, so no row shows a fraction \
                of a limit (`cargo xtask bench --publish` runs the `limits` bench with the \
                others).\n"
            .to_string();
    };
    let mut out = format!(
        "\nThe machine's limits in this run (GEMM n = {}, triad of {} elements):\n\n\
         | threads | f32 GEMM GFLOP/s | f64 GEMM GFLOP/s | bf16 GEMM GFLOP/s | triad GB/s |\n\
         |---|---|---|---|---|\n",
        first.gemm_n, first.triad_len
    );
    for l in limits {
        out.push_str(&l.row());
        out.push('\n');
    }
    out
}

/// `"384x1536"` as (rows, cols).
pub(crate) fn dims(parameter: &str) -> Option<(f64, f64)> {
    let (m, n) = parameter.split_once('x')?;
    Some((m.parse().ok()?, n.parse().ok()?))
}

/// Flops of the quintic's five Newton–Schulz steps on an m×n matrix: 5·(4r²s + 2r³) with
/// r = min(m, n), s = max(m, n) (Gram 2r²s, its square 2r³, the product with X 2r²s).
pub(crate) fn ns5_flops(parameter: &str) -> Option<(Bound, f64)> {
    let (m, n) = dims(parameter)?;
    let (r, s) = (m.min(n), m.max(n));
    Some((Bound::GemmF32, 5.0 * (4.0 * r * r * s + 2.0 * r * r * r)))
}

/// The f64 shapes of the linalg bench's SVD groups (`kappa_benches::F64_SHAPES`); every other
/// shape there is f32.
const F64_SHAPES: [&str; 3] = ["256x256", "1024x1024", "4096x256"];

/// Flops of the Householder bidiagonalization that starts a values-only SVD, 4r²s − 4r³/3
/// (Golub & Van Loan), against the GEMM bound of the shape's element type.
pub(crate) fn bidiagonal_flops(parameter: &str) -> Option<(Bound, f64)> {
    let (m, n) = dims(parameter)?;
    let (r, s) = (m.min(n), m.max(n));
    let bound = if F64_SHAPES.contains(&parameter) {
        Bound::GemmF64
    } else {
        Bound::GemmF32
    };
    Some((bound, 4.0 * r * r * s - 4.0 * r * r * r / 3.0))
}

/// `"N64_D64_k16"` as (N, D, k).
fn attention_dims(parameter: &str) -> Option<(f64, f64, f64)> {
    let mut parts = parameter.split('_');
    let mut next = |prefix: &str| parts.next()?.strip_prefix(prefix)?.parse::<f64>().ok();
    Some((next("N")?, next("D")?, next("k")?))
}

/// Flops of an attention head's weight VJP: 6NDk + 8N²k, f64.
pub(crate) fn attention_vjp_flops(parameter: &str) -> Option<(Bound, f64)> {
    let (n, d, k) = attention_dims(parameter)?;
    Some((Bound::GemmF64, 6.0 * n * d * k + 8.0 * n * n * k))
}

/// Flops of an attention head's forward pass and weight VJP: (6NDk + 4N²k) + (6NDk + 8N²k).
pub(crate) fn attention_forward_vjp_flops(parameter: &str) -> Option<(Bound, f64)> {
    let (n, d, k) = attention_dims(parameter)?;
    Some((Bound::GemmF64, 12.0 * n * d * k + 12.0 * n * n * k))
}

/// Bytes an f32 AdamW step moves on an m×n parameter: 28·m·n (it reads the parameter, the
/// gradient and both moments and writes the parameter and both moments, 4 bytes each).
pub(crate) fn adamw_bytes(parameter: &str) -> Option<(Bound, f64)> {
    let (m, n) = dims(parameter)?;
    Some((Bound::Memory, 28.0 * m * n))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn limits(threads: u32) -> Limits {
        Limits {
            threads,
            gemm_n: 2048,
            gemm_f32_gflops: 100.0,
            gemm_f64_gflops: 50.0,
            gemm_bf16_gflops: None,
            triad_len: 1 << 24,
            triad_gbs: 20.0,
        }
    }

    #[test]
    fn work_models_read_their_parameters() {
        // 384²: r = s = 384, 5·6·384³.
        let (b, f) = ns5_flops("384x384").unwrap();
        assert_eq!(b, Bound::GemmF32);
        assert!((f - 30.0 * 384f64.powi(3)).abs() < 1.0);
        assert_eq!(bidiagonal_flops("4096x256").unwrap().0, Bound::GemmF64);
        let (_, f) = attention_vjp_flops("N64_D64_k16").unwrap();
        assert_eq!(f, 6.0 * 64.0 * 64.0 * 16.0 + 8.0 * 64.0 * 64.0 * 16.0);
        assert_eq!(adamw_bytes("2x3").unwrap(), (Bound::Memory, 168.0));
        assert!(ns5_flops("N64_D64_k16").is_none());
        assert!(attention_vjp_flops("384x384").is_none());
    }

    #[test]
    fn a_rate_is_work_over_time_and_its_fraction_is_over_the_limit() {
        let l = limits(1);
        // 2e9 flops in 0.04 s: 50 GFLOP/s, half the f32 peak.
        let cells = rate_cells(Some((Bound::GemmF32, 2e9)), Some(0.04), Some(&l));
        assert_eq!(cells, ("50.0 GFLOP/s".into(), "0.50 of f32 GEMM".into()));
        // 1e9 bytes in 0.1 s against 20 GB/s.
        let cells = rate_cells(Some((Bound::Memory, 1e9)), Some(0.1), Some(&l));
        assert_eq!(cells, ("10.0 GB/s".into(), "0.50 of triad".into()));
        // No bf16 limit on this machine; no limits at all; no time.
        let cells = rate_cells(Some((Bound::GemmBf16, 1e9)), Some(0.1), Some(&l));
        assert_eq!(cells.1, "—");
        assert_eq!(
            rate_cells(Some((Bound::GemmF32, 1e9)), Some(0.1), None).1,
            "—"
        );
        assert_eq!(
            rate_cells(Some((Bound::GemmF32, 1e9)), None, Some(&l)).0,
            "—"
        );
    }

    #[test]
    fn the_limits_section_lists_each_thread_count_or_says_it_is_absent() {
        let (one, two) = (limits(1), limits(2));
        let page = render_limits(&[&one, &two]);
        assert!(page.contains("| 1 | 100.0 | 50.0 | — (no native bf16) | 20.0 |"));
        assert!(page.contains("| 2 | 100.0"));
        assert!(page.contains("n = 2048"));
        assert!(render_limits(&[]).contains("not measured in this run"));
    }
}
