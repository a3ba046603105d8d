//! Column-major vectorization, the Kronecker product and the commutation matrix, dense and
//! implicit.
//!
//! # Conventions
//!
//! * `vec` stacks columns: for M ∈ ℝ^{m×n}, vec(M)[i + j·m] = M[i, j]. With it,
//!   **vec(A M B) = (Bᵀ ⊗ A) vec(M)**, the identity every Jacobian in kappa is written with.
//! * Kronecker product: for A ∈ ℝ^{p×q}, B ∈ ℝ^{r×s}, (A ⊗ B)[i·r + k, j·s + l] = A[i, j]·B[k, l],
//!   a pr×qs matrix. It obeys (A⊗B)(C⊗D) = AC ⊗ BD.
//! * Commutation matrix K_{m,n} ∈ ℝ^{mn×mn}: the permutation with K_{m,n} vec(M) = vec(Mᵀ) for
//!   every M ∈ ℝ^{m×n}. Since vec(Mᵀ)[j + i·n] = Mᵀ[j, i] = M[i, j] = vec(M)[i + j·m], it has a
//!   single 1 per row: **K[j + i·n, i + j·m] = 1** for i < m, j < n. Kᵀ = K⁻¹ = K_{n,m}.
//!
//! The dense K has (mn)² entries, so [`Commutation`] applies it implicitly in O(mn) time and
//! memory, and [`kron_matvec`] applies A ⊗ B without forming it.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ShapeBuilder};

use crate::error::{LinalgError, Result};
use crate::input::{check_matrix, check_vector, shape_str, InputError};
use crate::scalar::{max_abs, scale_f64, scaled_copy, Pow2, Real};

fn dense_size(arg: &'static str, rows: usize, cols: usize) -> Result<()> {
    crate::error::check_dense(arg, rows, cols)
}

/// vec(M): the columns of `m` stacked into one vector of length rows·cols.
///
/// Errors: `m` empty or non-finite (argument `m`). Cost: one copy.
///
/// ```
/// let m = ndarray::array![[1.0, 2.0], [3.0, 4.0]];
/// assert_eq!(kappa_linalg::vec(m.view()).unwrap().to_vec(), vec![1.0, 3.0, 2.0, 4.0]);
/// ```
pub fn vec<A: Real>(m: ArrayView2<'_, A>) -> Result<Array1<A>> {
    check_matrix("m", &m)?;
    Ok(m.t().iter().copied().collect())
}

/// unvec: the inverse of [`vec()`], reshaping `v` (length rows·cols) into a rows×cols matrix
/// column by column. The result is column-major in memory.
///
/// Errors: `v` empty or non-finite; `v.len() != rows·cols` (argument `v`); `rows` or `cols` zero.
///
/// ```
/// let v = ndarray::array![1.0, 3.0, 2.0, 4.0];
/// assert_eq!(kappa_linalg::unvec(v.view(), 2, 2).unwrap(), ndarray::array![[1.0, 2.0], [3.0, 4.0]]);
/// ```
pub fn unvec<A: Real>(v: ArrayView1<'_, A>, rows: usize, cols: usize) -> Result<Array2<A>> {
    check_vector("v", &v)?;
    if rows == 0 || cols == 0 {
        return Err(InputError::invalid(
            if rows == 0 { "rows" } else { "cols" },
            "must be at least 1",
        )
        .into());
    }
    if rows.checked_mul(cols) != Some(v.len()) {
        return Err(InputError::shape_mismatch(
            "v",
            format!("length rows·cols = {rows}·{cols}"),
            format!("length {}", v.len()),
        )
        .into());
    }
    Array2::from_shape_vec((rows, cols).f(), v.to_vec())
        .map_err(|e| InputError::invalid("v", e.to_string()).into())
}

/// The Kronecker product A ⊗ B (see the module docs for the index convention).
///
/// Cost: pqrs multiplications and as many entries of memory.
///
/// Errors: `a` or `b` empty or non-finite; [`LinalgError::TooLarge`] (argument `a`) when the
/// result would exceed [`MAX_DENSE_ENTRIES`](crate::MAX_DENSE_ENTRIES);
/// [`LinalgError::Overflow`] (argument `b`) when an entry a_ij·b_kl would exceed the element
/// type's `MAX`.
///
/// ```
/// let a = ndarray::array![[1.0, 2.0]];
/// let b = ndarray::array![[1.0], [10.0]];
/// let k = kappa_linalg::kron(a.view(), b.view()).unwrap();
/// assert_eq!(k, ndarray::array![[1.0, 2.0], [10.0, 20.0]]);
/// ```
pub fn kron<A: Real>(a: ArrayView2<'_, A>, b: ArrayView2<'_, A>) -> Result<Array2<A>> {
    check_matrix("a", &a)?;
    check_matrix("b", &b)?;
    let (p, q) = a.dim();
    let (r, s) = b.dim();
    let rows = p.checked_mul(r);
    let cols = q.checked_mul(s);
    match (rows, cols) {
        (Some(rows), Some(cols)) => {
            dense_size("a", rows, cols)?;
            check_product_range::<A>(&a, &b)?;
            Ok(Array2::from_shape_fn((rows, cols), |(i, j)| {
                a[[i / r, j / s]] * b[[i % r, j % s]]
            }))
        }
        _ => Err(LinalgError::TooLarge {
            arg: "a",
            reason: "the Kronecker product's shape overflows usize".into(),
        }),
    }
}

/// [`LinalgError::Overflow`] (argument `b`) when max|a_ij|·max|b_kl|, the largest entry of
/// A ⊗ B, exceeds the element type's `MAX` (so every entry of a returned product is finite).
fn check_product_range<A: Real>(a: &ArrayView2<'_, A>, b: &ArrayView2<'_, A>) -> Result<()> {
    let (ma, mb) = (max_abs(a.iter()), max_abs(b.iter()));
    // Exact in f64 for f32 entries (24 + 24 bits); for f64 the same rounding as the entry itself.
    if A::from_f64_lossy(ma * mb).is_finite() {
        Ok(())
    } else {
        Err(LinalgError::Overflow {
            arg: "b",
            reason: format!("max|a|·max|b| = {ma:e}·{mb:e} exceeds {}::MAX", A::NAME),
        })
    }
}

/// (A ⊗ B)·x without forming A ⊗ B: with X = unvec(x, s, q), (A ⊗ B) vec(X) = vec(B X Aᵀ)
/// for A ∈ ℝ^{p×q}, B ∈ ℝ^{r×s}, x ∈ ℝ^{qs}.
///
/// Cost: 2·(rsq + rqp) flops instead of 2·pqrs. Errors: any argument empty or non-finite;
/// `x.len() != q·s` (argument `x`); [`LinalgError::Overflow`] (argument `x`) when an entry of
/// the result exceeds the element type's `MAX`. Scale-safe: A, B and x are rescaled exactly by
/// powers of two first, so no intermediate over- or underflows, whatever their magnitudes
/// (1e-320 ⊗ 1e300 included); an entry of the result below the normal range is rounded as a
/// subnormal (within one subnormal ulp).
///
/// ```
/// use kappa_linalg::{kron, kron_matvec};
/// let a = ndarray::array![[1.0, 2.0], [0.0, 1.0]];
/// let b = ndarray::array![[3.0, 1.0, 0.0]];
/// let x = ndarray::Array1::from_iter((0..6).map(|i| i as f64));
/// let dense = kron(a.view(), b.view()).unwrap().dot(&x);
/// assert_eq!(kron_matvec(a.view(), b.view(), x.view()).unwrap(), dense);
/// ```
pub fn kron_matvec<A: Real>(
    a: ArrayView2<'_, A>,
    b: ArrayView2<'_, A>,
    x: ArrayView1<'_, A>,
) -> Result<Array1<A>> {
    check_matrix("a", &a)?;
    check_matrix("b", &b)?;
    check_vector("x", &x)?;
    let (_, q) = a.dim();
    let (_, s) = b.dim();
    if q.checked_mul(s) != Some(x.len()) {
        return Err(InputError::shape_mismatch(
            "x",
            format!("length cols(a)·cols(b) = {q}·{s}"),
            format!("length {}", x.len()),
        )
        .into());
    }
    // Exactly rescaled factors (max |entry| ∈ [0.5, 1)): the intermediate B·X can then neither
    // overflow nor underflow, and the one scaling back rounds each entry once.
    let (a_s, pa) = scaled_copy(a);
    let (b_s, pb) = scaled_copy(b);
    let px = Pow2::normalizing(max_abs(x.iter()));
    let xm = unvec(x.mapv(|v| px.apply(v)).view(), s, q)?;
    let y = b_s.dot(&xm).dot(&a_s.t());
    let back = -(i64::from(pa.k) + i64::from(pb.k) + i64::from(px.k));
    let out: Array1<A> = y
        .t()
        .iter()
        .map(|&v| A::from_f64_lossy(scale_f64(v.to_f64_lossy(), back)))
        .collect();
    if !out.iter().all(|v| v.is_finite()) {
        return Err(LinalgError::Overflow {
            arg: "x",
            reason: format!("an entry of (A ⊗ B)·x exceeds {}::MAX", A::NAME),
        });
    }
    Ok(out)
}

/// The commutation matrix K_{m,n}, applied implicitly (see the module docs).
///
/// ```
/// use kappa_linalg::{vec, Commutation};
/// let m = ndarray::array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]];
/// let k = Commutation::new(2, 3).unwrap();
/// let lhs = k.apply(vec(m.view()).unwrap().view()).unwrap();
/// assert_eq!(lhs, vec(m.t()).unwrap());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Commutation {
    m: usize,
    n: usize,
}

impl Commutation {
    /// K_{m,n}, for M ∈ ℝ^{m×n}. Errors: `m` or `n` zero, or m·n overflowing `usize`.
    pub fn new(m: usize, n: usize) -> Result<Self> {
        if m == 0 || n == 0 {
            return Err(
                InputError::invalid(if m == 0 { "m" } else { "n" }, "must be at least 1").into(),
            );
        }
        if m.checked_mul(n).is_none() {
            return Err(LinalgError::TooLarge {
                arg: "m",
                reason: "m·n overflows usize".into(),
            });
        }
        Ok(Self { m, n })
    }

    /// (m, n).
    pub fn dims(&self) -> (usize, usize) {
        (self.m, self.n)
    }

    /// The size mn of the (square) matrix.
    pub fn size(&self) -> usize {
        self.m * self.n
    }

    /// The column holding the 1 of row `row`: (K v)\[row\] = v\[source(row)\]. For
    /// row = j + i·n it is i + j·m. Returns `None` for row ≥ mn.
    pub fn source(&self, row: usize) -> Option<usize> {
        (row < self.size()).then(|| {
            let (i, j) = (row / self.n, row % self.n);
            i + j * self.m
        })
    }

    /// K_{m,n}·v = vec(Mᵀ) for v = vec(M). O(mn). Errors: `v` empty, non-finite, or of length
    /// ≠ mn (argument `v`).
    pub fn apply<A: Real>(&self, v: ArrayView1<'_, A>) -> Result<Array1<A>> {
        self.check_len(&v)?;
        Ok((0..self.size())
            .map(|r| v[(r / self.n) + (r % self.n) * self.m])
            .collect())
    }

    /// K_{m,n}ᵀ·v = K_{n,m}·v (the inverse permutation). O(mn). Errors: as [`Commutation::apply`].
    pub fn apply_transpose<A: Real>(&self, v: ArrayView1<'_, A>) -> Result<Array1<A>> {
        Commutation {
            m: self.n,
            n: self.m,
        }
        .apply(v)
    }

    /// K_{m,n}·X for a matrix X with mn rows (a row permutation). O(mn·cols).
    /// Errors: `x` empty, non-finite, or with ≠ mn rows (argument `x`).
    pub fn apply_rows<A: Real>(&self, x: ArrayView2<'_, A>) -> Result<Array2<A>> {
        check_matrix("x", &x)?;
        if x.nrows() != self.size() {
            return Err(InputError::shape_mismatch(
                "x",
                format!("{} rows", self.size()),
                shape_str(x.nrows(), x.ncols()),
            )
            .into());
        }
        Ok(Array2::from_shape_fn(x.dim(), |(r, c)| {
            x[[(r / self.n) + (r % self.n) * self.m, c]]
        }))
    }

    /// The dense mn×mn matrix. Errors: [`LinalgError::TooLarge`] beyond
    /// [`MAX_DENSE_ENTRIES`](crate::MAX_DENSE_ENTRIES).
    pub fn to_dense<A: Real>(&self) -> Result<Array2<A>> {
        let s = self.size();
        dense_size("m", s, s)?;
        let mut k = Array2::zeros((s, s));
        for r in 0..s {
            k[[r, (r / self.n) + (r % self.n) * self.m]] = A::one();
        }
        Ok(k)
    }

    fn check_len<A: Real>(&self, v: &ArrayView1<'_, A>) -> Result<()> {
        check_vector("v", v)?;
        if v.len() != self.size() {
            return Err(InputError::shape_mismatch(
                "v",
                format!("length m·n = {}·{}", self.m, self.n),
                format!("length {}", v.len()),
            )
            .into());
        }
        Ok(())
    }
}

/// The dense commutation matrix K_{m,n} ∈ ℝ^{mn×mn}, K vec(M) = vec(Mᵀ) (see the module docs).
///
/// Errors: `m` or `n` zero; [`LinalgError::TooLarge`] beyond
/// [`MAX_DENSE_ENTRIES`](crate::MAX_DENSE_ENTRIES) entries.
///
/// ```
/// let k = kappa_linalg::commutation_matrix::<f64>(2, 2).unwrap();
/// assert_eq!(k, ndarray::array![[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0],
///                               [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]);
/// ```
pub fn commutation_matrix<A: Real>(m: usize, n: usize) -> Result<Array2<A>> {
    Commutation::new(m, n)?.to_dense()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_index_matches_dense_matrix() {
        let c = Commutation::new(3, 4).unwrap();
        let k = c.to_dense::<f64>().unwrap();
        for r in 0..12 {
            let col = c.source(r).unwrap();
            assert_eq!(k[[r, col]], 1.0);
            assert_eq!(k.row(r).sum(), 1.0);
        }
        assert_eq!((c.dims(), c.size()), ((3, 4), 12));
    }

    #[test]
    fn vec_is_column_major_for_any_memory_order() {
        let m = ndarray::array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]];
        let f = m.t().as_standard_layout().to_owned().reversed_axes(); // same values, F order
        assert_eq!(vec(m.view()).unwrap(), vec(f.view()).unwrap());
        assert_eq!(
            vec(m.view()).unwrap().to_vec(),
            vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
    }
}
