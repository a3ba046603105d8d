//! The row-wise softmax, its derivative Λ as an N²×N² matrix (dense and matrix-free), and Λ's
//! spectrum.
//!
//! # Math
//!
//! For scores S ∈ ℝ^{N×N}, P = softmax_row(S) with P[i, j] = exp(S[i, j]) / Σ_l exp(S[i, l])
//! (with a causal mask, the sum runs over l ≤ i and P[i, j] = 0 for j > i). Write p_i for the
//! i-th row of P as a column vector and J_i = diag(p_i) − p_i p_iᵀ (N×N, symmetric PSD,
//! J_i 1 = 0). Row by row, dP[i, :]ᵀ = J_i dS[i, :]ᵀ. With **column-major** vec
//! (vec(M)[i + j·N] = M[i, j]) this is
//!
//! vec(dP) = Λ vec(dS),  Λ = Σ_i J_i ⊗ e_i e_iᵀ = K_{N,N} · blockdiag(J_1, …, J_N) · K_{N,N},
//!
//! so Λ[a·N + i, c·N + i] = J_i[a, c] and every other entry is 0. Λ is symmetric PSD, its
//! eigenvalues are the union of the eigenvalues of the J_i, all in [0, 1/2], and each J_i has the
//! eigenvalue 0 at least once (eigenvector 1), so Λ has at least N zero eigenvalues (exactly N
//! when every p_i has two or more positive entries and all are positive). κ(Λ) = ∞ always;
//! the Theorem 3.4 bound uses the pseudo condition number κ⁺(Λ) over the nonzero ones.
//!
//! The matrix-free product needs no N⁴ storage: dP = P ⊙ (dS − (P ⊙ dS) 1 1ᵀ), O(N²).

use kappa_linalg::exp::exp_in_place;
use kappa_linalg::input::{check_matrix, check_shape, shape_str, InputError};
use kappa_linalg::scalar::fold_in_lanes;
use kappa_linalg::{conditioning_from_singular_values, singular_values, Real, SvdDriver};
use ndarray::{Array1, Array2, ArrayView2, ArrayViewMut2, Axis};

use crate::error::{check_dense, check_probabilities, AttentionError, Result};
use crate::scale::linear;

/// The row-wise softmax of `scores` (N×M), optionally with a causal mask (entry (i, j) masked
/// when j > i; requires N ≤ M so every row keeps at least one entry).
///
/// Numerically stable: each row is shifted by its largest unmasked entry before `exp`, so no
/// finite input overflows; masked entries are exactly 0.
///
/// Errors: `scores` empty or non-finite.
///
/// ```
/// use kappa_attention::softmax_rows;
/// let s = ndarray::array![[0.0, 0.0], [1000.0, 0.0]];
/// let p = softmax_rows(s.view(), false)?;
/// assert_eq!(p[[0, 0]], 0.5);
/// assert_eq!(p[[1, 0]], 1.0);
/// let causal = softmax_rows(s.view(), true)?;
/// assert_eq!(causal[[0, 1]], 0.0);
/// # Ok::<(), kappa_attention::AttentionError>(())
/// ```
pub fn softmax_rows<A: Real>(scores: ArrayView2<'_, A>, causal: bool) -> Result<Array2<A>> {
    check_matrix("scores", &scores)?;
    Ok(softmax_unchecked(scores, causal))
}

pub(crate) fn softmax_unchecked<A: Real>(scores: ArrayView2<'_, A>, causal: bool) -> Array2<A> {
    let mut p = Array2::<A>::zeros(scores.dim());
    p.assign(&scores);
    softmax_in_place(p.view_mut(), 0, causal);
    p
}

/// The row softmax of `p` in place, its first row being row `first_row` of the whole matrix
/// (for the causal mask, which keeps entries j ≤ i of row i). Row by row: the largest live
/// entry m, then e^(s − m) of the live entries on the CPU's vector units ([`exp_in_place`]:
/// below 1.13 ulp, the same bits on every CPU), their sum (in eight lanes, a fixed order), and
/// each multiplied by the sum's reciprocal (as PyTorch's CPU softmax does); masked entries are
/// set to 0.
pub(crate) fn softmax_in_place<A: Real>(
    mut p: ArrayViewMut2<'_, A>,
    first_row: usize,
    causal: bool,
) {
    for (i, mut row) in p.axis_iter_mut(Axis(0)).enumerate() {
        let len = if causal {
            (first_row + i + 1).min(row.len())
        } else {
            row.len()
        };
        match row.as_slice_mut() {
            Some(slice) => softmax_row(slice, len),
            None => {
                let mut copy = row.to_vec();
                softmax_row(&mut copy, len);
                row.assign(&ndarray::ArrayView1::from(&copy));
            }
        }
    }
}

/// The softmax of `row[..len]` in place, and 0 in `row[len..]`.
fn softmax_row<A: Real>(row: &mut [A], len: usize) {
    let (live, masked) = row.split_at_mut(len);
    let larger = |m: A, x: A| if x > m { x } else { m };
    let max = fold_in_lanes(live, A::neg_infinity(), larger, larger);
    live.iter_mut().for_each(|x| *x -= max);
    exp_in_place(live);
    // sum ≥ 1 (the largest entry maps to exp(0) = 1), so its reciprocal is finite.
    let sum = |acc: A, x: A| acc + x;
    let inv_sum = A::one() / fold_in_lanes(live, A::zero(), sum, sum);
    live.iter_mut().for_each(|x| *x *= inv_sum);
    masked.fill(A::zero());
}

/// The matrix-free softmax derivative: dP = Λ dS row by row, dP[i, :] = J_i dS[i, :],
/// i.e. dP = P ⊙ (dS − rowsum(P ⊙ dS)). Since Λ is symmetric this is also the vector–Jacobian
/// product. O(N·M) time.
///
/// The map is linear in `ds`, so it is evaluated at `ds` scaled by a power of two (exact; see
/// `docs/attention.md`, "Scale behaviour"): any finite `ds` whose image is representable works.
///
/// Errors: `p` or `ds` empty or non-finite; `p` with an entry outside [0, 1] (argument `p`);
/// `ds` not of `p`'s shape; [`AttentionError::Overflow`] (argument `ds`) when the result
/// overflows (|dP| ≤ 2·max|ds|·max row sum of p).
pub fn softmax_jacobian_apply<A: Real>(
    p: ArrayView2<'_, A>,
    ds: ArrayView2<'_, A>,
) -> Result<Array2<A>> {
    check_probabilities("p", &p)?;
    check_shape("ds", &ds, p.nrows(), p.ncols(), "the shape of p")?;
    let [out] = linear([ds], ("p", "ds"), "Λ·ds", |[t]| {
        [softmax_jvp_unchecked(p, t)]
    })?;
    Ok(out)
}

pub(crate) fn softmax_jvp_unchecked<A: Real>(
    p: ArrayView2<'_, A>,
    ds: ArrayView2<'_, A>,
) -> Array2<A> {
    let mut out = &p * &ds;
    let sums = out.sum_axis(Axis(1));
    for ((mut row, prow), s) in out
        .axis_iter_mut(Axis(0))
        .zip(p.axis_iter(Axis(0)))
        .zip(sums.iter())
    {
        row.zip_mut_with(&prow, |o, &pij| *o -= pij * *s);
    }
    out
}

/// J_i = diag(p_i) − p_i p_iᵀ for the i-th row p_i of `p` (N×N result for an N-column `p`).
///
/// Errors: `p` empty or non-finite or with an entry outside [0, 1] (argument `p`); `i` out of
/// range; [`AttentionError::TooLarge`] (argument `p`) when the M×M result exceeds
/// [`kappa_linalg::MAX_DENSE_ENTRIES`] for an M-column `p`.
pub fn softmax_row_jacobian<A: Real>(p: ArrayView2<'_, A>, i: usize) -> Result<Array2<A>> {
    check_probabilities("p", &p)?;
    check_dense("p", p.ncols(), p.ncols())?;
    if i >= p.nrows() {
        return Err(InputError::invalid(
            "i",
            format!("row {i} out of range for {} rows", p.nrows()),
        )
        .into());
    }
    Ok(row_jacobian_unchecked(p, i))
}

fn row_jacobian_unchecked<A: Real>(p: ArrayView2<'_, A>, i: usize) -> Array2<A> {
    let row = p.row(i);
    let n = row.len();
    Array2::from_shape_fn((n, n), |(a, c)| {
        let d = if a == c { row[a] } else { A::zero() };
        d - row[a] * row[c]
    })
}

/// The dense softmax-derivative matrix Λ ∈ ℝ^{N²×N²} of a square N×N attention matrix `p`,
/// column-major: vec(dP) = Λ vec(dS), Λ[a·N + i, c·N + i] = J_i[a, c] (see the module docs).
///
/// Errors: `p` empty, non-finite, not square or with an entry outside [0, 1];
/// [`AttentionError::TooLarge`] beyond [`kappa_linalg::MAX_DENSE_ENTRIES`] entries (N > 128).
///
/// ```
/// use kappa_attention::{softmax_jacobian_dense, softmax_rows};
/// let p = softmax_rows(ndarray::array![[1.0_f64, 2.0], [0.5, -1.0]].view(), false)?;
/// let lambda = softmax_jacobian_dense(p.view())?;
/// assert_eq!(lambda.dim(), (4, 4));
/// assert!((&lambda - &lambda.t()).iter().all(|e| e.abs() < 1e-15));
/// # Ok::<(), kappa_attention::AttentionError>(())
/// ```
pub fn softmax_jacobian_dense<A: Real>(p: ArrayView2<'_, A>) -> Result<Array2<A>> {
    check_probabilities("p", &p)?;
    let n = p.nrows();
    if p.ncols() != n {
        return Err(InputError::shape_mismatch(
            "p",
            "a square N×N attention matrix",
            shape_str(p.nrows(), p.ncols()),
        )
        .into());
    }
    let nn = n.checked_mul(n).ok_or_else(|| AttentionError::TooLarge {
        arg: "p",
        reason: "N² overflows usize".into(),
    })?;
    check_dense("p", nn, nn)?;
    let mut lambda = Array2::zeros((nn, nn));
    for i in 0..n {
        let row = p.row(i);
        for a in 0..n {
            for c in 0..n {
                let d = if a == c { row[a] } else { A::zero() };
                lambda[[a * n + i, c * n + i]] = d - row[a] * row[c];
            }
        }
    }
    Ok(lambda)
}

/// The N² singular values (= eigenvalues, Λ being symmetric PSD) of Λ for an N×N attention
/// matrix `p`, descending, computed blockwise from the N matrices J_i (N SVDs of N×N instead of
/// one of N²×N²: O(N⁴) instead of O(N⁶)).
///
/// Entries of p in [0, 1] bound every entry of J_i by 1 in magnitude, so the SVDs need no
/// scaling.
///
/// Errors: `p` empty, non-finite, not square or with an entry outside [0, 1]; LAPACK failures.
pub fn softmax_jacobian_singular_values<A: Real>(p: ArrayView2<'_, A>) -> Result<Array1<A>> {
    check_probabilities("p", &p)?;
    let n = p.nrows();
    if p.ncols() != n {
        return Err(InputError::shape_mismatch(
            "p",
            "a square N×N attention matrix",
            shape_str(p.nrows(), p.ncols()),
        )
        .into());
    }
    let mut all = Vec::with_capacity(n * n);
    for i in 0..n {
        let j = row_jacobian_unchecked(p, i);
        all.extend(
            singular_values(j.view(), SvdDriver::default())?
                .iter()
                .copied(),
        );
    }
    all.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
    Ok(Array1::from(all))
}

/// κ, κ⁺ and numerical rank of Λ (see [`kappa_linalg::cond`] for the rule; κ is always +∞ up
/// to rounding, κ⁺ is the quantity Theorem 3.4 can use).
///
/// Errors: as [`softmax_jacobian_singular_values`].
pub fn softmax_jacobian_conditioning<A: Real>(
    p: ArrayView2<'_, A>,
) -> Result<kappa_linalg::Conditioning<A>> {
    let s = softmax_jacobian_singular_values(p)?;
    let nn = s.len();
    Ok(conditioning_from_singular_values(
        s.view(),
        nn,
        nn,
        kappa_linalg::RankTolerance::Numpy,
    )?)
}
