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

use ndarray::{s, Array1, Array2, ArrayView2, Axis};
use ndarray_linalg::{JobSvd, SVDDCInto, SVDInto, QR};

use crate::error::{check_matrix, lapack_err, Result};
use crate::scalar::Real;

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
    /// U Σ Vᵀ, using the first k columns of U and rows of Vᵀ (so it works for thin and full).
    ///
    /// ```
    /// use kappa_linalg::{svd_thin, SvdDriver};
    /// let a = ndarray::array![[3.0_f64, 0.0], [4.0, 5.0], [0.0, 1.0]];
    /// let f = svd_thin(a.view(), SvdDriver::QrIteration).unwrap();
    /// let b = f.reconstruct();
    /// assert!((&a - &b).iter().all(|e| e.abs() < 1e-13));
    /// ```
    pub fn reconstruct(&self) -> Array2<A> {
        let k = self.s.len();
        let us = &self.u.slice(s![.., ..k]) * &self.s.view().insert_axis(Axis(0));
        us.dot(&self.vt.slice(s![..k, ..]))
    }
}

fn sort_desc<A: Real>(s: &mut Array1<A>) {
    // LAPACK already returns descending order; this makes it a guarantee (and maps −0 to 0).
    let mut v: Vec<A> = s.iter().map(|&x| x.fabs()).collect();
    v.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
    *s = Array1::from(v);
}

/// The singular values of `a`, descending: σ₁ ≥ … ≥ σ_k ≥ 0, k = min(m, n).
///
/// Math: σ_i = sqrt(λ_i(AᵀA)). Cost: about 4mn² − 4n³/3 flops for m ≥ n (no singular vectors
/// are formed; `?gesvd` first reduces a tall matrix by QR). Accuracy: |σ̂_i − σ_i| ≤ p(m,n)·ε·σ₁.
///
/// Errors: [`LinalgError::Empty`](crate::LinalgError::Empty) and
/// [`LinalgError::NonFinite`](crate::LinalgError::NonFinite) for argument `a`,
/// [`LinalgError::Lapack`](crate::LinalgError::Lapack) if LAPACK does not converge.
///
/// ```
/// use kappa_linalg::{singular_values, SvdDriver};
/// let a = ndarray::array![[3.0, 0.0], [0.0, -4.0], [0.0, 0.0]];
/// let s = singular_values(a.view(), SvdDriver::default()).unwrap();
/// assert_eq!(s.to_vec(), vec![4.0, 3.0]);
/// ```
pub fn singular_values<A: Real>(a: ArrayView2<'_, A>, driver: SvdDriver) -> Result<Array1<A>> {
    check_matrix("a", &a)?;
    let owned = a.to_owned();
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
    Ok(s)
}

/// The thin SVD A = U Σ Vᵀ, U ∈ ℝ^{m×k}, Vᵀ ∈ ℝ^{k×n}, k = min(m, n).
///
/// With [`SvdDriver::DivideAndConquer`] this is `?gesdd` with `JOBZ = 'S'`. `?gesvd` through
/// `ndarray-linalg` only forms full factors, so [`SvdDriver::QrIteration`] computes a thin QR
/// of the tall orientation first (A = QR, Q ∈ ℝ^{m×k}), the SVD of the k×k factor R = U_R Σ Vᵀ
/// by `?gesvd`, and U = Q U_R — the same reduction `?gesvd` itself applies to tall matrices.
/// Cost: O(mnk) flops. Accuracy: as the module docs.
///
/// ```
/// use kappa_linalg::{svd_thin, SvdDriver};
/// let a = ndarray::Array2::from_shape_fn((5, 3), |(i, j)| (i * 3 + j) as f64 + 0.5 * (i == j) as u8 as f64);
/// let f = svd_thin(a.view(), SvdDriver::DivideAndConquer).unwrap();
/// assert_eq!((f.u.dim(), f.s.len(), f.vt.dim()), ((5, 3), 3, (3, 3)));
/// ```
pub fn svd_thin<A: Real>(a: ArrayView2<'_, A>, driver: SvdDriver) -> Result<Svd<A>> {
    check_matrix("a", &a)?;
    let (m, n) = a.dim();
    match driver {
        SvdDriver::DivideAndConquer => {
            let (u, s, vt) = a
                .to_owned()
                .svddc_into(JobSvd::Some)
                .map_err(lapack_err("a", "?gesdd"))?;
            finish(u, s, vt, "?gesdd")
        }
        SvdDriver::QrIteration => {
            if m >= n {
                let (q, r) = a.qr().map_err(lapack_err("a", "?geqrf"))?;
                let (ur, s, vt) = r.svd_into(true, true).map_err(lapack_err("a", "?gesvd"))?;
                let ur = ur.ok_or_else(|| missing("U"))?;
                finish(Some(q.dot(&ur)), s, vt, "?gesvd")
            } else {
                let t = svd_thin(a.t(), driver)?;
                Ok(Svd {
                    u: t.vt.reversed_axes(),
                    s: t.s,
                    vt: t.u.reversed_axes(),
                })
            }
        }
    }
}

/// The full SVD A = U Σ Vᵀ with square orthogonal U ∈ ℝ^{m×m} and Vᵀ ∈ ℝ^{n×n}.
///
/// Cost: O(m²n + mn² + n³) flops (forming the full U of a tall matrix is the expensive part).
/// Accuracy: as the module docs.
///
/// ```
/// use kappa_linalg::{svd_full, SvdDriver};
/// let a = ndarray::array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]];
/// let f = svd_full(a.view(), SvdDriver::QrIteration).unwrap();
/// assert_eq!((f.u.dim(), f.s.len(), f.vt.dim()), ((2, 2), 2, (3, 3)));
/// ```
pub fn svd_full<A: Real>(a: ArrayView2<'_, A>, driver: SvdDriver) -> Result<Svd<A>> {
    check_matrix("a", &a)?;
    match driver {
        SvdDriver::DivideAndConquer => {
            let (u, s, vt) = a
                .to_owned()
                .svddc_into(JobSvd::All)
                .map_err(lapack_err("a", "?gesdd"))?;
            finish(u, s, vt, "?gesdd")
        }
        SvdDriver::QrIteration => {
            let (u, s, vt) = a
                .to_owned()
                .svd_into(true, true)
                .map_err(lapack_err("a", "?gesvd"))?;
            finish(u, s, vt, "?gesvd")
        }
    }
}

fn missing(what: &str) -> crate::LinalgError {
    crate::LinalgError::Lapack {
        arg: "a",
        routine: "svd",
        message: format!("LAPACK returned no {what} factor"),
    }
}

fn finish<A: Real>(
    u: Option<Array2<A>>,
    s: Array1<A>,
    vt: Option<Array2<A>>,
    _routine: &'static str,
) -> Result<Svd<A>> {
    // LAPACK returns σ descending and non-negative; the factors match that order.
    Ok(Svd {
        u: u.ok_or_else(|| missing("U"))?,
        s,
        vt: vt.ok_or_else(|| missing("Vᵀ"))?,
    })
}

/// The exact polar factor of `a`: Q = U Vᵀ from the thin SVD A = U Σ Vᵀ.
///
/// Q is the orthogonal (m ≥ n: orthonormal columns; m < n: orthonormal rows) matrix nearest to A
/// in every unitarily invariant norm, and A = Q·(V Σ Vᵀ) is the polar decomposition. It is what
/// Newton–Schulz iterations approximate (Muon's `msign`). For rank-deficient A the factor is not
/// unique; this returns U Vᵀ over all k singular vectors LAPACK produced, so zero singular values
/// map to 1, not 0 (use an SVD and a rank rule if zero directions must stay zero).
///
/// Cost: a thin SVD plus one m×k×n product. Accuracy: ‖Q̂ − Q‖ ≈ ε / (σ_k + σ_{k−1}) relative
/// to the gap at the bottom of the spectrum; ‖Q̂ᵀQ̂ − I‖ = O(k·ε).
///
/// ```
/// use kappa_linalg::{polar_factor, SvdDriver};
/// let a = ndarray::array![[2.0_f64, 0.0], [0.0, -3.0]];
/// let q = polar_factor(a.view(), SvdDriver::QrIteration).unwrap();
/// assert!((q[[0, 0]] - 1.0).abs() < 1e-15 && (q[[1, 1]] + 1.0).abs() < 1e-15);
/// ```
pub fn polar_factor<A: Real>(a: ArrayView2<'_, A>, driver: SvdDriver) -> Result<Array2<A>> {
    let f = svd_thin(a, driver)?;
    Ok(f.u.dot(&f.vt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_thin_qr_path_transposes_back() {
        let a = ndarray::array![[1.0_f64, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]];
        let f = svd_thin(a.view(), SvdDriver::QrIteration).unwrap();
        assert_eq!((f.u.dim(), f.vt.dim()), ((2, 2), (2, 4)));
        assert!((&a - &f.reconstruct()).iter().all(|e| e.abs() < 1e-14));
        let g = svd_thin(a.view(), SvdDriver::DivideAndConquer).unwrap();
        assert!((&f.s - &g.s).iter().all(|e| e.abs() < 1e-14));
    }
}
