//! Gram Newton–Schulz: the iteration of [`newton_schulz`](crate::newton_schulz()) with every
//! step done on the small side, r×r matrices only, for any [`NsSchedule`].
//!
//! # Math
//!
//! In the wide orientation X ∈ ℝ^{r×s}, r ≤ s (X is transposed when it has more rows than
//! columns), a step with coefficients (a, b, c) is X ← M·X with M = a·I + b·R + c·R², R = XXᵀ.
//! Every iterate is therefore X_k = Q_k·X₀ with an r×r factor Q_k, and its Gram matrix is
//! R_k = Q_k·G·Q_kᵀ, G = X₀X₀ᵀ. M is a polynomial in R, so it is symmetric and commutes with R,
//! and one step is the recurrence
//!
//!   B = b·R + c·R²,  M = a·I + B,  Q ← M·Q = a·Q + B·Q,  R ← M·R·M = a·T + B·T, T = a·R + R·B,
//!
//! which needs r×r products only. After the last step X = Q·X₀ is formed once. Starting from
//! Q₀ = I, the first step sets Q₁ = M directly, and the last step of a block skips the R update.
//!
//! Rounding: Q carries the gain p(x)/x of each singular value x, up to Π a_j for the smallest
//! ones, so Q is ill-conditioned and the recurrence for R accumulates the rounding of every
//! product into G's small eigenvalues. A **restart** every `restart` steps re-forms X = Q·X₀,
//! takes it as the new X₀ and recomputes G = X₀X₀ᵀ, Q = I: the errors of a block are amplified by
//! that block's gain only. [`GRAM_NS_RESTART`] = 2 is the default (see there).
//!
//! Cost for N steps in blocks of k = `restart` steps (c ≠ 0): each block costs 2r²s (G) +
//! 2r²s (Q·X₀) + (8k − 6)·r³, so N steps cost ≈ 4⌈N/k⌉·r²s + 8N·r³, against N·(4r²s + 2r³)
//! for [`newton_schulz`](crate::newton_schulz()). It pays for tall or wide inputs, s ≳ 2r; on
//! square ones it is slower. Memory: one r×s and four r×r buffers.

use crate::error::Result;
use crate::input::InputError;
use crate::matrix::Matrix;
use crate::newton_schulz::{finish, poly_part, prepare, NsSchedule, PolyStep};

/// The default restart period of [`gram_newton_schulz`]: G is re-formed after every 2 steps.
///
/// Why 2: within a block the rounding of the Gram recurrence is amplified by the block's gain,
/// up to Π a_j (the growth of the smallest singular values, which Q carries): ≈ 11.9 for two Muon
/// quintic steps and ≈ 33 for the first two Polar Express steps, against ≈ 41 and ≈ 130 for
/// three. Measured on a 64×64 Gaussian (σ_min/‖X‖_F ≈ 7e-4, the hard case) in bf16, Polar
/// Express ×10 keeps its output σ in [0.995, 1.006] with restart 2 (plain Newton–Schulz in bf16:
/// [0.997, 1.005]), while restart 4 lets one reach 1.87 and no restart 1.22. Tall Gaussians are
/// benign at every period, but not tall inputs with graded spectra: Polar Express ×5 in bf16 at
/// period 3 reached max |Δ| 4.1 (16×48) and 93 (96×24) from the f64 map with κ = 10², against
/// ≤ 0.03 at period 2 (docs/linalg.md). Two steps per block also keep the r×s work at half of
/// plain Newton–Schulz's. (Dao et al.'s Gram Newton–Schulz restarts once, after the 2nd of 5
/// steps, in half precision.)
pub const GRAM_NS_RESTART: usize = 2;

/// Runs a Newton–Schulz schedule on `x` as Gram Newton–Schulz (module docs): the same map as
/// [`newton_schulz`](crate::newton_schulz()) in exact arithmetic, with the r×s products of each
/// step replaced by r×r ones and G = XXᵀ re-formed every `restart` steps.
///
/// Returns a new matrix of `x`'s shape, element type and (for `tch`) device. Normalization,
/// scale safety and the zero matrix are as in [`newton_schulz`](crate::newton_schulz()) (the two
/// share that code). `restart` ≥ 1; [`GRAM_NS_RESTART`] is the default, and any value ≥ the
/// number of steps means no restart.
///
/// Errors: as [`newton_schulz`](crate::newton_schulz()) (arguments `x`, `schedule`), and
/// [`InputError::InvalidArgument`] (argument `restart`) for `restart == 0`.
///
/// ```
/// use kappa_linalg::{gram_newton_schulz, newton_schulz, NsSchedule, GRAM_NS_RESTART};
/// let x = ndarray::array![[2.0_f64, 0.0], [0.0, 0.1], [0.3, 0.0], [0.0, 0.2]];
/// let sched = NsSchedule::polar_express(10).unwrap();
/// let g = gram_newton_schulz(&x, &sched, GRAM_NS_RESTART).unwrap();
/// let p = newton_schulz(&x, &sched).unwrap();
/// assert!((&g - &p).iter().all(|e| e.abs() < 1e-12));
/// ```
pub fn gram_newton_schulz<M: Matrix>(x: &M, schedule: &NsSchedule, restart: usize) -> Result<M> {
    // Arguments in signature order: `x` and `schedule` (checked by `prepare`), then `restart`.
    let (mut prepared, transposed) = prepare(x, schedule)?;
    if restart == 0 {
        return Err(InputError::invalid("restart", "must be ≥ 1 (steps between restarts)").into());
    }
    if let Some(x) = prepared.as_mut() {
        run_blocks(x, &schedule.steps, restart, None)?;
    }
    finish(prepared, transposed)
}

/// Runs `steps` on the wide, prepared `x` in blocks of `restart` (≥ 1) steps. `gram`, when
/// given, is x·xᵀ already formed (AOL has it), used by the first block in place of a product.
pub(crate) fn run_blocks<M: Matrix>(
    x: &mut M,
    steps: &[PolyStep],
    restart: usize,
    mut gram: Option<M>,
) -> Result<()> {
    for block in steps.chunks(restart) {
        *x = gram_block(x, block, gram.take())?;
    }
    Ok(())
}

/// One block of steps from X₀ = `x`: G = X₀X₀ᵀ (`gram`, or formed here), the (Q, R) recurrence
/// of the module docs, and Q·X₀. `steps` is non-empty.
fn gram_block<M: Matrix>(x: &M, steps: &[PolyStep], gram: Option<M>) -> Result<M> {
    let mut r = match gram {
        Some(g) => g,
        None => x.gram()?,
    };
    let mut q: Option<M> = None;
    for (j, p) in steps.iter().enumerate() {
        let b = poly_part(&r, p)?;
        if j + 1 < steps.len() {
            // R ← M·R·M = a·T + B·T, T = a·R + R·B.
            let t = r.mul_add(1.0, &r, &b, p.a)?;
            r = t.mul_add(1.0, &b, &t, p.a)?;
        }
        q = Some(match q {
            // Q₁ = M = B + a·I.
            None => {
                let mut m = b;
                m.add_to_diagonal(p.a)?;
                m
            }
            // Q ← M·Q = a·Q + B·Q.
            Some(q) => q.mul_add(1.0, &b, &q, p.a)?,
        });
    }
    match q {
        Some(q) => q.matmul(x),
        None => x.duplicate(),
    }
}
