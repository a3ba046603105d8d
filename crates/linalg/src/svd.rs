//! Singular value decomposition through LAPACK, with both drivers selectable, and the exact polar
//! factor built on it.
//!
//! Conventions: A ∈ ℝ^{m×n}, k = min(m, n). The singular values are returned in descending order,
//! σ₁ ≥ σ₂ ≥ … ≥ σ_k ≥ 0. The *thin* SVD is A = U Σ Vᵀ with U ∈ ℝ^{m×k}, Σ = diag(σ) ∈ ℝ^{k×k},
//! Vᵀ ∈ ℝ^{k×n}; the *full* SVD has U ∈ ℝ^{m×m} and Vᵀ ∈ ℝ^{n×n} (orthogonal), with the singular
//! values still the k diagonal entries of the m×n Σ.
//!
//! Accuracy (both drivers, backward stable): the computed σ̂ are the exact singular values of
//! A + E with ‖E‖₂ ≤ p(m, n)·ε·‖A‖₂, so |σ̂_i − σ_i| ≤ p(m, n)·ε·σ₁ (Weyl) — small singular
//! values are accurate *relative to σ₁*, not relative to themselves. In practice p(m, n) is a
//! small multiple of max(m, n). The computed U, V are orthonormal to O(k·ε) and
//! ‖A − U Σ Vᵀ‖_F ≤ O(max(m,n)·ε)·‖A‖_F.
//!
//! # Scale safety and layouts
//!
//! Every factorization runs on a row-major copy of A scaled by an exact power of two,
//! A_s = 2^k·A with max |a_ij|·2^k ∈ [0.5, 1) (see `scalar::Pow2`). Scaling by 2^k is exact, so
//! the factors of A_s are those of A and σ_i(A) = 2^−k·σ_i(A_s); the column norms LAPACK
//! forms are at most √m, so no intermediate over- or underflows for any finite input, from
//! subnormal entries to entries near `MAX` (unscaled, `?gesvd` after a QR of such a matrix sees an
//! ∞/NaN bidiagonal and `?bdsqr` does not return). The copy also gives LAPACK a layout it
//! accepts whatever the input view's strides: column-major stays column-major, anything else
//! (strided, negative strides) becomes row-major — except for singular values alone, where the
//! copy's layout follows the shape so that LAPACK always sees the tall orientation (σ(A) =
//! σ(Aᵀ); a wide matrix is several times slower in LAPACK's drivers), whatever the input's
//! layout.
//!
//! Only the σ that are *returned* are scaled back. When 2^−k·σ₁ exceeds the element type's
//! `MAX` (possible for entries near `MAX`: σ₁ ≤ √(mn)·max |a_ij|), the functions that return
//! singular values fail with [`LinalgError::Overflow`] naming `a`;
//! the scale-free results ([`polar_factor`], [`matrix_sign`], κ and rank in [`crate::cond`])
//! are computed from A_s and never overflow.
//!
//! # Sign convention
//!
//! The singular vectors are LAPACK's: each pair (u_i, v_i) is determined up to a common sign
//! (and, for repeated σ_i, up to a rotation of the pairs), and no sign normalization is applied.
//! Quantities built from pairs (U Σ Vᵀ, U Vᵀ) do not depend on the choice.

use ndarray::{s, Array1, Array2, ArrayView2, Axis};
use ndarray_linalg::{JobSvd, SVDDCInto, SVDInto, QR};

use crate::error::{lapack_err, LinalgError, Result};
use crate::input::{check_finite, check_matrix, shape_str, InputError};
use crate::scalar::{scaled_copy, scaled_copy_tall, Pow2, Real};

/// Which LAPACK SVD driver to use.
///
/// Both are backward stable in theory. Divide-and-conquer (`?gesdd`) is faster for large
/// matrices when singular vectors are wanted, but several LAPACK implementations have shipped
/// inputs on which it returns wrong results or fails to converge, so the default is the QR
/// iteration (`?gesvd`), the conservative choice. The test suite runs both and compares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SvdDriver {
    /// LAPACK `?gesdd`: bidiagonalization followed by divide and conquer.
    DivideAndConquer,
    /// LAPACK `?gesvd`: bidiagonalization followed by implicit-shift QR iteration (the default).
    #[default]
    QrIteration,
}

/// A singular value decomposition A = U Σ Vᵀ (thin or full, see the module docs).
///
/// The fields are public, so a value can also be built by hand; [`Svd::reconstruct`] checks
/// that the factors fit together.
#[derive(Debug, Clone, PartialEq)]
pub struct Svd<A> {
    /// Left singular vectors, m×k (thin) or m×m (full), as columns.
    pub u: Array2<A>,
    /// Singular values, descending, length k = min(m, n).
    pub s: Array1<A>,
    /// Right singular vectors transposed, k×n (thin) or n×n (full), as rows.
    pub vt: Array2<A>,
}

impl<A: Real> Svd<A> {
    /// U Σ Vᵀ, using the first k = `s.len()` columns of U and rows of Vᵀ (so it works for thin
    /// and full factors, and for s truncated to the k largest values). With k = 0 it is the
    /// m×n zero matrix.
    ///
    /// The shapes must fit: U is m×p and Vᵀ is q×n with k ≤ p ≤ m and k ≤ q ≤ n — at least k
    /// singular vectors, and no more columns of U than rows (no more rows of Vᵀ than columns),
    /// since the columns of U (rows of Vᵀ) are orthonormal. A factor passed transposed
    /// (U of a tall m×n factorization as k×m, Vᵀ of a wide one as n×k) breaks the second rule.
    ///
    /// Errors: [`InputError::ShapeMismatch`] when U's shape breaks these rules (argument
    /// `self.u`, checked first) or Vᵀ's does (argument `self.vt`); [`InputError::NonFinite`] for
    /// a NaN or ±∞ entry in a field (arguments `self.u`, `self.s`, `self.vt`). Products of finite
    /// factors that overflow give ±∞ entries (IEEE arithmetic, no check).
    ///
    /// ```
    /// use kappa_linalg::{svd_thin, SvdDriver};
    /// let a = ndarray::array![[3.0_f64, 0.0], [4.0, 5.0], [0.0, 1.0]];
    /// let f = svd_thin(a.view(), SvdDriver::QrIteration).unwrap();
    /// let b = f.reconstruct().unwrap();
    /// assert!((&a - &b).iter().all(|e| e.abs() < 1e-13));
    /// ```
    pub fn reconstruct(&self) -> Result<Array2<A>> {
        let k = self.s.len();
        check_finite("self.u", &self.u.view())?;
        check_finite("self.vt", &self.vt.view())?;
        if let Some(i) = self.s.iter().position(|x| !x.is_finite()) {
            return Err(InputError::NonFinite {
                arg: "self.s",
                row: i,
                col: 0,
                value: self.s[i].to_f64_lossy(),
            }
            .into());
        }
        let (m, p) = self.u.dim();
        if !(k <= p && p <= m) {
            let want = format!("m×p with k = s.len() = {k} ≤ p ≤ m (orthonormal columns)");
            return Err(InputError::shape_mismatch("self.u", want, shape_str(m, p)).into());
        }
        let (q, n) = self.vt.dim();
        if !(k <= q && q <= n) {
            let want = format!("q×n with k = s.len() = {k} ≤ q ≤ n (orthonormal rows)");
            return Err(InputError::shape_mismatch("self.vt", want, shape_str(q, n)).into());
        }
        let us = &self.u.slice(s![.., ..k]) * &self.s.view().insert_axis(Axis(0));
        Ok(us.dot(&self.vt.slice(s![..k, ..])))
    }
}

fn sort_desc<A: Real>(s: &mut Array1<A>) {
    // LAPACK already returns descending order; this makes it a guarantee (and maps −0 to 0).
    let mut v: Vec<A> = s.iter().map(|&x| x.fabs()).collect();
    v.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
    *s = Array1::from(v);
}

/// σ·2^−k for the singular values of A_s = 2^k·A, or [`LinalgError::Overflow`] (argument `a`)
/// when σ₁ does not fit the element type.
pub(crate) fn unscale_sigma<A: Real>(s: &mut Array1<A>, p: Pow2) -> Result<()> {
    let back = p.inverse();
    if let Some(&s1) = s.first() {
        if !back.apply(s1).is_finite() {
            return Err(LinalgError::Overflow {
                arg: "a",
                reason: format!(
                    "σ₁ = {:e}·2^{} exceeds {}::MAX",
                    s1.to_f64_lossy(),
                    back.k,
                    A::NAME
                ),
            });
        }
    }
    s.mapv_inplace(|x| back.apply(x));
    Ok(())
}

/// The singular values of the exactly rescaled, standard-layout copy A_s = 2^k·A (descending)
/// and the scaling, after checking `a` (argument `a`). The scale-free functions use these
/// directly.
pub(crate) fn scaled_singular_values<A: Real>(
    a: ArrayView2<'_, A>,
    driver: SvdDriver,
) -> Result<(Array1<A>, Pow2)> {
    check_matrix("a", &a)?;
    // σ(A) = σ(Aᵀ): hand LAPACK whichever orientation is tall for it (`scaled_copy_tall`).
    let (owned, p) = scaled_copy_tall(a);
    let mut s = match driver {
        SvdDriver::QrIteration => {
            owned
                .svd_into(false, false)
                .map_err(lapack_err("a", "?gesvd"))?
                .1
        }
        SvdDriver::DivideAndConquer => {
            owned
                .svddc_into(JobSvd::None)
                .map_err(lapack_err("a", "?gesdd"))?
                .1
        }
    };
    sort_desc(&mut s);
    Ok((s, p))
}

/// The singular values of `a`, descending: σ₁ ≥ … ≥ σ_k ≥ 0, k = min(m, n).
///
/// Math: σ_i = sqrt(λ_i(AᵀA)). Cost: about 4mn² − 4n³/3 flops for m ≥ n (no singular vectors
/// are formed; `?gesvd` first reduces a tall matrix by QR). Accuracy: |σ̂_i − σ_i| ≤ p(m,n)·ε·σ₁.
/// Any finite input (subnormal to near `MAX`) and any memory layout is accepted (module docs).
///
/// Errors: [`InputError::Empty`] and
/// [`InputError::NonFinite`] for argument `a`,
/// [`LinalgError::Overflow`] (argument `a`) when σ₁ exceeds the
/// element type's `MAX`, [`LinalgError::Lapack`] if LAPACK does not
/// converge.
///
/// ```
/// use kappa_linalg::{singular_values, SvdDriver};
/// let a = ndarray::array![[3.0, 0.0], [0.0, -4.0], [0.0, 0.0]];
/// let s = singular_values(a.view(), SvdDriver::default()).unwrap();
/// assert_eq!(s.to_vec(), vec![4.0, 3.0]);
/// ```
pub fn singular_values<A: Real>(a: ArrayView2<'_, A>, driver: SvdDriver) -> Result<Array1<A>> {
    let (mut s, p) = scaled_singular_values(a, driver)?;
    unscale_sigma(&mut s, p)?;
    Ok(s)
}

/// The thin SVD of a standard-layout, scaled A_s (σ not yet scaled back).
fn thin_scaled<A: Real>(a: Array2<A>, driver: SvdDriver) -> Result<Svd<A>> {
    let (m, n) = a.dim();
    match driver {
        SvdDriver::DivideAndConquer => {
            let (u, s, vt) = a
                .svddc_into(JobSvd::Some)
                .map_err(lapack_err("a", "?gesdd"))?;
            finish(u, s, vt)
        }
        SvdDriver::QrIteration if m >= n => {
            let (q, r) = a.qr().map_err(lapack_err("a", "?geqrf"))?;
            let (ur, s, vt) = r.svd_into(true, true).map_err(lapack_err("a", "?gesvd"))?;
            let ur = ur.ok_or_else(|| missing("U"))?;
            finish(Some(q.dot(&ur)), s, vt)
        }
        SvdDriver::QrIteration => {
            // The transpose, without a copy (a row-major matrix becomes column-major).
            let t = thin_scaled(a.reversed_axes(), driver)?;
            Ok(Svd {
                u: t.vt.reversed_axes(),
                s: t.s,
                vt: t.u.reversed_axes(),
            })
        }
    }
}

/// The thin SVD A = U Σ Vᵀ, U ∈ ℝ^{m×k}, Vᵀ ∈ ℝ^{k×n}, k = min(m, n).
///
/// With [`SvdDriver::DivideAndConquer`] this is `?gesdd` with `JOBZ = 'S'`. `?gesvd` through
/// `ndarray-linalg` only forms full factors, so [`SvdDriver::QrIteration`] computes a thin QR
/// of the tall orientation first (A = QR, Q ∈ ℝ^{m×k}), the SVD of the k×k factor R = U_R Σ Vᵀ
/// by `?gesvd`, and U = Q U_R — the same reduction `?gesvd` itself applies to tall matrices.
/// Cost: O(mnk) flops. Accuracy, scale safety and errors: as the module docs and
/// [`singular_values`].
///
/// ```
/// use kappa_linalg::{svd_thin, SvdDriver};
/// let a = ndarray::Array2::from_shape_fn((5, 3), |(i, j)| (i * 3 + j) as f64 + 0.5 * (i == j) as u8 as f64);
/// let f = svd_thin(a.view(), SvdDriver::DivideAndConquer).unwrap();
/// assert_eq!((f.u.dim(), f.s.len(), f.vt.dim()), ((5, 3), 3, (3, 3)));
/// ```
pub fn svd_thin<A: Real>(a: ArrayView2<'_, A>, driver: SvdDriver) -> Result<Svd<A>> {
    let (mut f, p) = scaled_thin(a, driver)?;
    unscale_sigma(&mut f.s, p)?;
    Ok(f)
}

/// The thin SVD of A_s = 2^k·A and the scaling (σ of A_s), after checking `a`.
pub(crate) fn scaled_thin<A: Real>(
    a: ArrayView2<'_, A>,
    driver: SvdDriver,
) -> Result<(Svd<A>, Pow2)> {
    check_matrix("a", &a)?;
    let (owned, p) = scaled_copy(a);
    Ok((thin_scaled(owned, driver)?, p))
}

/// The full SVD A = U Σ Vᵀ with square orthogonal U ∈ ℝ^{m×m} and Vᵀ ∈ ℝ^{n×n}.
///
/// Cost: O(m²n + mn² + n³) flops (forming the full U of a tall matrix is the expensive part).
/// Accuracy, scale safety and errors: as the module docs and [`singular_values`], and
/// [`LinalgError::TooLarge`] (argument `a`) when m² or n² exceeds
/// [`MAX_DENSE_ENTRIES`](crate::MAX_DENSE_ENTRIES) (a 2¹⁵×1 matrix has a 2³⁰-entry U).
///
/// ```
/// use kappa_linalg::{svd_full, SvdDriver};
/// let a = ndarray::array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]];
/// let f = svd_full(a.view(), SvdDriver::QrIteration).unwrap();
/// assert_eq!((f.u.dim(), f.s.len(), f.vt.dim()), ((2, 2), 2, (3, 3)));
/// ```
pub fn svd_full<A: Real>(a: ArrayView2<'_, A>, driver: SvdDriver) -> Result<Svd<A>> {
    check_matrix("a", &a)?;
    // The square factors of a very tall or wide matrix can be far larger than the matrix.
    let (m, n) = a.dim();
    crate::error::check_dense("a", m, m)?;
    crate::error::check_dense("a", n, n)?;
    let (owned, p) = scaled_copy(a);
    let mut f = match driver {
        SvdDriver::DivideAndConquer => {
            let (u, s, vt) = owned
                .svddc_into(JobSvd::All)
                .map_err(lapack_err("a", "?gesdd"))?;
            finish(u, s, vt)?
        }
        SvdDriver::QrIteration => {
            let (u, s, vt) = owned
                .svd_into(true, true)
                .map_err(lapack_err("a", "?gesvd"))?;
            finish(u, s, vt)?
        }
    };
    unscale_sigma(&mut f.s, p)?;
    Ok(f)
}

fn missing(what: &str) -> LinalgError {
    LinalgError::Lapack {
        arg: "a",
        routine: "svd",
        message: format!("LAPACK returned no {what} factor"),
    }
}

fn finish<A: Real>(u: Option<Array2<A>>, s: Array1<A>, vt: Option<Array2<A>>) -> Result<Svd<A>> {
    // LAPACK returns σ descending and non-negative; the factors match that order.
    Ok(Svd {
        u: u.ok_or_else(|| missing("U"))?,
        s,
        vt: vt.ok_or_else(|| missing("Vᵀ"))?,
    })
}

/// The exact polar factor of `a`: Q = U Vᵀ from the thin SVD A = U Σ Vᵀ, **zero singular values
/// mapped to 1**.
///
/// Q is the orthogonal (m ≥ n: orthonormal columns; m < n: orthonormal rows) matrix nearest to A
/// in every unitarily invariant norm, and A = Q·(V Σ Vᵀ) is the polar decomposition. It is what
/// Newton–Schulz iterations approximate. The rule for rank-deficient A: Q = Σ_{i ≤ k} u_i v_iᵀ
/// over **all** k = min(m, n) singular pairs LAPACK produced, so Q always has k singular values
/// equal to 1 (it is an isometry), and on the null directions it is one of the (non-unique)
/// orthogonal completions — for A = 0 an arbitrary isometry. For the matrix sign that keeps null
/// directions at 0 (σ_i ≤ τ ↦ 0, Muon's exact `msign`), use [`matrix_sign`].
///
/// Cost: a thin SVD plus one m×k×n product. Accuracy: ‖Q̂ − Q‖ ≈ ε / (σ_k + σ_{k−1}) relative
/// to the gap at the bottom of the spectrum; ‖Q̂ᵀQ̂ − I‖ = O(k·ε). Any finite input, from
/// subnormal to near `MAX`, is accepted (Q does not depend on the scale).
///
/// Errors: `a` empty or non-finite (argument `a`); LAPACK failure.
///
/// ```
/// use kappa_linalg::{polar_factor, SvdDriver};
/// let a = ndarray::array![[2.0_f64, 0.0], [0.0, -3.0]];
/// let q = polar_factor(a.view(), SvdDriver::QrIteration).unwrap();
/// assert!((q[[0, 0]] - 1.0).abs() < 1e-15 && (q[[1, 1]] + 1.0).abs() < 1e-15);
/// ```
pub fn polar_factor<A: Real>(a: ArrayView2<'_, A>, driver: SvdDriver) -> Result<Array2<A>> {
    let (f, _) = scaled_thin(a, driver)?;
    Ok(f.u.dot(&f.vt))
}

/// The matrix sign of `a` with **zero singular values mapped to 0**: S = Σ_{σ_i > τ} u_i v_iᵀ
/// over the singular values above τ = σ₁·max(m, n)·ε (numpy's `matrix_rank` rule, ε of the
/// element type; the same rule as [`crate::cond`]).
///
/// For full numerical rank S equals [`polar_factor`]; for rank r < k, S has r singular values 1
/// and k − r zeros, is unique (it does not depend on the basis LAPACK picks for the null space),
/// and SᵀA = V_r Σ_r V_rᵀ ⪰ 0, A Sᵀ = U_r Σ_r U_rᵀ ⪰ 0. The zero matrix maps to the zero
/// matrix. This is the `msign` of Muon's exact variant.
///
/// Cost and accuracy: as [`polar_factor`]; singular values within ≈ p(m,n)·ε·σ₁ of τ may fall
/// on either side of the threshold. Errors: as [`polar_factor`].
///
/// ```
/// use kappa_linalg::{matrix_sign, SvdDriver};
/// let a = ndarray::array![[3.0_f64, 0.0], [0.0, 0.0], [0.0, 0.0]];
/// let s = matrix_sign(a.view(), SvdDriver::QrIteration).unwrap();
/// assert_eq!(s, ndarray::array![[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]);
/// ```
pub fn matrix_sign<A: Real>(a: ArrayView2<'_, A>, driver: SvdDriver) -> Result<Array2<A>> {
    let (m, n) = a.dim();
    let (f, _) = scaled_thin(a, driver)?;
    let s1 = f.s.first().copied().unwrap_or_else(A::zero);
    let tau = s1 * A::from_f64_lossy(m.max(n) as f64 * A::EPS);
    let r = f.s.iter().filter(|&&x| x > tau).count();
    Ok(f.u.slice(s![.., ..r]).dot(&f.vt.slice(s![..r, ..])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_thin_qr_path_transposes_back() {
        let a = ndarray::array![[1.0_f64, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]];
        let f = svd_thin(a.view(), SvdDriver::QrIteration).unwrap();
        assert_eq!((f.u.dim(), f.vt.dim()), ((2, 2), (2, 4)));
        assert!((&a - &f.reconstruct().unwrap())
            .iter()
            .all(|e| e.abs() < 1e-14));
        let g = svd_thin(a.view(), SvdDriver::DivideAndConquer).unwrap();
        assert!((&f.s - &g.s).iter().all(|e| e.abs() < 1e-14));
    }
}
