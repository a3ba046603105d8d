//! The small matrix trait that the algorithms are written against, and its `ndarray` backend.
//!
//! An algorithm such as Newton–Schulz is written once against [`Matrix`] and runs on
//! `ndarray::Array2<f32 | f64>` (this module) and, with the `tch` feature, on `tch::Tensor`
//! (f32/bf16/f64, CPU or CUDA; see `tch_backend`). The trait holds only what the algorithms of
//! this crate and of the optimizer crate need: shape, transpose, products in BLAS `gemm` form,
//! scaling, `axpy`, the Frobenius norm, singular values and the exact polar factor, and for manifold
//! Muon (kappa-optim) the Frobenius inner product, the diagonal, column scaling and an in-place copy,
//! and for AOL preconditioning absolute row sums.
//!
//! Scalars cross the trait as `f64` and are rounded to the matrix's element type where they are
//! used. Every operation that takes a second matrix checks shapes and returns
//! [`InputError::ShapeMismatch`] instead of panicking.
//!
//! The arithmetic operations (`matmul`, `gemm`, `mul_add`, `scale`, `axpy`, `inner`,
//! `set_diagonal`, `scale_columns`, `scale_entries`) are BLAS-level kernels: they check shapes,
//! not values, and follow IEEE arithmetic — finite operands whose result overflows give ±∞
//! entries, and NaN operands propagate. Callers validate once ([`Matrix::validate`]) and keep
//! their iterates in range (as Newton–Schulz does by normalizing). The SVD-based operations
//! validate their input and are scale-safe.

use ndarray::{Array2, ShapeBuilder};

use crate::error::{rename, LinalgError, Result};
use crate::input::{shape_str, InputError};
use crate::product::{mat_mul, mat_mul_into};
use crate::scalar::{array_norm, Pow2, Real};
use crate::svd::{polar_factor, scaled_singular_values, scaled_thin, SvdDriver};
use crate::syrk::syrk_slice;

/// A dense real matrix, as the algorithms of this crate see it.
///
/// Implemented for `ndarray::Array2<f32>`, `ndarray::Array2<f64>` and (feature `tch`)
/// `tch::Tensor`. The methods are the BLAS-level operations the algorithms need; the cost of
/// each is the obvious one (`gemm` is 2·m·k·n flops).
pub trait Matrix: Sized {
    /// `(rows, cols)`.
    fn shape(&self) -> (usize, usize);

    /// Checks that the matrix is non-empty and that every entry is finite; `arg` names it in the
    /// error.
    fn validate(&self, arg: &'static str) -> Result<()>;

    /// The element type's smallest positive normal number and largest finite number, as `f64`:
    /// 2⁻¹²⁶ and ≈ 3.40e38 for f32 (≈ 3.39e38 for bf16), 2⁻¹⁰²² and ≈ 1.80e308 for f64.
    fn normal_range(&self) -> (f64, f64);

    /// The transpose, by value. O(1) on both backends: `ndarray` swaps strides (the result is
    /// column-major), `tch` returns a strided view.
    fn into_transpose(self) -> Self;

    /// The matrix product `self · rhs`. Errors: shapes that do not chain (argument `rhs`); a
    /// result beyond [`MAX_DENSE_ENTRIES`](crate::MAX_DENSE_ENTRIES) entries
    /// ([`LinalgError::TooLarge`], argument `rhs`).
    fn matmul(&self, rhs: &Self) -> Result<Self>;

    /// The Gram matrix `self · selfᵀ` (rows × rows): f32/f64 matrices on the CPU compute one
    /// triangle by BLAS `syrk` in half a general product's flops and mirror it, so the result is
    /// exactly symmetric (see [`crate::syrk`]); wide CPU bf16 tensors of ≥ 768 rows compute
    /// the upper triangle by row blocks in general products and mirror it (exactly symmetric
    /// too); other bf16 and CUDA tensors take a general product, symmetric to rounding.
    /// Errors: rows² beyond
    /// [`MAX_DENSE_ENTRIES`](crate::MAX_DENSE_ENTRIES) ([`LinalgError::TooLarge`], argument `self`).
    fn gram(&self) -> Result<Self>;

    /// `alpha·(self · selfᵀ) + beta·c` for a **symmetric** `c` (rows × rows) as a new matrix, by
    /// `syrk` where [`Matrix::gram`] uses it (exactly symmetric; only `c`'s upper triangle is
    /// read), elsewhere by a general product (`c` read whole). With `c` = `self`
    /// symmetric this is `beta·A + alpha·A²` (A·A = A·Aᵀ), the polynomial part of a
    /// Newton–Schulz step. Errors: `c` not rows × rows (argument `c`).
    ///
    /// The default (for backends of other crates) is the general product
    /// `c.mul_add(alpha, self, selfᵀ, beta)`; both of this crate's backends override it.
    fn gram_add(&self, alpha: f64, c: &Self, beta: f64) -> Result<Self> {
        let (m, _) = self.shape();
        if c.shape() != (m, m) {
            let found = shape_str(c.shape().0, c.shape().1);
            return Err(InputError::shape_mismatch("c", shape_str(m, m), found).into());
        }
        c.mul_add(alpha, self, &self.duplicate()?.into_transpose(), beta)
    }

    /// `alpha·S² + beta·S` for a **symmetric** square `self` = S as a new matrix: the polynomial
    /// part b·A + c·A² of a Newton–Schulz step on its Gram matrix A. The default is
    /// [`Matrix::gram_add`] (S·Sᵀ = S², by `syrk` where the backend has it); tensors without
    /// `syrk` (bf16, CUDA, more than one thread) multiply S·S instead, the form libtorch's fused
    /// bf16 product is fast at. Errors: `self` not square (argument `self`).
    fn symmetric_square_add(&self, alpha: f64, beta: f64) -> Result<Self> {
        let (m, n) = self.shape();
        if m != n {
            return Err(
                InputError::shape_mismatch("self", shape_str(m, m), shape_str(m, n)).into(),
            );
        }
        self.gram_add(alpha, self, beta)
    }

    /// BLAS `gemm` in place: `self ← alpha·(a·b) + beta·self`. `self` must not be `a` or `b`.
    fn gemm(&mut self, alpha: f64, a: &Self, b: &Self, beta: f64) -> Result<()>;

    /// `alpha·(a·b) + beta·self` as a new matrix (`self` is not modified and may be `a` or `b`).
    ///
    /// This is the form the Newton–Schulz steps use: on `tch` it is one `baddbmm` call, on
    /// `ndarray` a copy of `self` followed by an in-place BLAS `gemm`.
    fn mul_add(&self, alpha: f64, a: &Self, b: &Self, beta: f64) -> Result<Self>;

    /// `self ← alpha·self`, in place.
    fn scale(&mut self, alpha: f64) -> Result<()>;

    /// `self ← self + alpha·x`, in place.
    fn axpy(&mut self, alpha: f64, x: &Self) -> Result<()>;

    /// The Frobenius norm sqrt(Σ x_ij²), computed without overflow or underflow and returned in
    /// `f64` (on `tch`: contiguous CPU f32 and bf16 tensors read in place and summed in f64
    /// lanes, [`crate::scalar::sum_of_squares`]; others by a libtorch reduction in `f64` on the
    /// tensor's device); +∞ only when the
    /// norm itself exceeds `f64::MAX` (f64 entries near `f64::MAX`), NaN when an entry is NaN.
    fn frobenius_norm(&self) -> Result<f64>;

    /// A copy of the matrix (a deep copy: the result shares no storage with `self`).
    fn duplicate(&self) -> Result<Self>;

    /// A deep copy of the transpose, laid out for the backend's products: `ndarray` keeps the
    /// swapped strides (column-major, which BLAS takes as it is), `tch` writes it row-major, as
    /// libtorch's products on a transposed view are slower (bf16 most: a 768×3072 Gram product
    /// took 1.5× the time of the same product on a row-major copy, one thread of an Intel Xeon
    /// with AMX).
    fn transposed_copy(&self) -> Result<Self> {
        Ok(self.duplicate()?.into_transpose())
    }

    /// The singular values σ₁ ≥ … ≥ σ_k ≥ 0, k = min(rows, cols), as `f64`, computed on an exact
    /// power-of-two rescaling of the matrix (see [`crate::svd`]) and scaled back in `f64`.
    ///
    /// Errors: empty or non-finite (argument `self`); [`LinalgError::Overflow`] (argument
    /// `self`) when σ₁ exceeds `f64::MAX`.
    fn singular_values(&self) -> Result<Vec<f64>>;

    /// The exact polar factor U·Vᵀ of the thin SVD A = U Σ Vᵀ (see [`polar_factor`]: zero
    /// singular values map to 1). Errors: empty or non-finite (argument `self`).
    fn polar_factor(&self) -> Result<Self>;

    /// The polar factor U·Vᵀ and the singular values (descending) from **one** thin SVD — what
    /// manifold Muon's DGram retraction (U·Vᵀ)·diag(S) needs. The default calls
    /// [`Matrix::polar_factor`] and [`Matrix::singular_values`] (two SVDs); both backends
    /// override it with one.
    fn polar_factor_and_singular_values(&self) -> Result<(Self, Vec<f64>)> {
        Ok((self.polar_factor()?, self.singular_values()?))
    }

    /// The Frobenius inner product ⟨self, other⟩ = Σ a_ij·b_ij = tr(selfᵀ·other), accumulated in
    /// `f64` (shapes must match).
    fn inner(&self, other: &Self) -> Result<f64>;

    /// The diagonal (A₁₁, …, A_kk), k = min(rows, cols), as `f64`.
    fn diagonal(&self) -> Result<Vec<f64>>;

    /// The absolute row sums Σ_j |a_ij|, one per row, accumulated in `f64` (AOL
    /// preconditioning, [`aol_newton_schulz`](crate::aol_newton_schulz), takes them of a Gram
    /// matrix).
    fn abs_row_sums(&self) -> Result<Vec<f64>>;

    /// Overwrites the diagonal in place: A_ii ← d_i for i < k = min(rows, cols); `d` must have
    /// length k. With `d` all zeros this is the Off projector of manifold Muon's DGram constraint.
    fn set_diagonal(&mut self, d: &[f64]) -> Result<()>;

    /// Adds `a` to the diagonal in place: A ← A + a·I on the k = min(rows, cols) diagonal
    /// entries, each sum rounded once to the element type (`tch`: in the type's arithmetic, f32
    /// for bf16 and f32, with `a` rounded to it first). One call and no read-back where the
    /// backend has it (`tch`); by default [`diagonal`](Self::diagonal) and
    /// [`set_diagonal`](Self::set_diagonal).
    fn add_to_diagonal(&mut self, a: f64) -> Result<()> {
        let d: Vec<f64> = self.diagonal()?.into_iter().map(|d| d + a).collect();
        self.set_diagonal(&d)
    }

    /// Scales column j by `s[j]` in place (A ← A·diag(s)); `s` must have length `cols`.
    fn scale_columns(&mut self, s: &[f64]) -> Result<()>;

    /// Multiplies entry (i, j) by `s[i·cols + j]` in place (Hadamard product with S given
    /// row-major); `s` must have length rows·cols. Manifold Muon's preconditioned DGram ascent
    /// divides its multiplier entrywise by (d_i² + d_j²)/2 with this.
    fn scale_entries(&mut self, s: &[f64]) -> Result<()>;

    /// Copies `src` into `self`'s storage in place (shapes must match). On `tch` this writes into
    /// the existing tensor (`copy_`), so parameters shared with a var store are updated.
    fn copy_from(&mut self, src: &Self) -> Result<()>;
}

/// Checks that a slice argument has the expected length.
pub(crate) fn check_len(arg: &'static str, len: usize, expected: usize, what: &str) -> Result<()> {
    if len == expected {
        Ok(())
    } else {
        Err(InputError::shape_mismatch(
            arg,
            format!("length {expected} ({what})"),
            format!("length {len}"),
        )
        .into())
    }
}

/// α·A·Aᵀ (+ β·C) by BLAS `syrk` (see [`crate::syrk`]; a matrix contiguous in neither order is
/// copied to standard layout first), as a new standard-layout matrix; `None` only for sizes
/// beyond BLAS's integers.
fn syrk_array<A: Real>(
    a: &Array2<A>,
    alpha: f64,
    c: Option<(&Array2<A>, f64)>,
) -> Option<Array2<A>> {
    let (m, k) = a.dim();
    let copy;
    let (data, column_major) = match (a.as_slice(), a.t().to_slice()) {
        (Some(data), _) => (data, false),
        (None, Some(data)) => (data, true),
        (None, None) => {
            copy = a.as_standard_layout().into_owned();
            (copy.as_slice()?, false)
        }
    };
    let beta = c.map_or(0.0, |(_, beta)| beta);
    let mut out = match c {
        Some((c, _)) if beta != 0.0 => c.as_standard_layout().into_owned(),
        _ => Array2::zeros((m, m)),
    };
    syrk_slice(
        data,
        (m, k),
        column_major,
        (alpha, beta),
        out.as_slice_mut()?,
    )
    .then_some(out)
}

fn check_product(
    arg: &'static str,
    lhs: (usize, usize),
    rhs: (usize, usize),
    out: Option<(usize, usize)>,
) -> Result<()> {
    if lhs.1 != rhs.0 {
        return Err(InputError::shape_mismatch(
            arg,
            format!(
                "{} rows, to match the left factor's {} columns",
                lhs.1, lhs.1
            ),
            shape_str(rhs.0, rhs.1),
        )
        .into());
    }
    if let Some(o) = out {
        if o != (lhs.0, rhs.1) {
            return Err(InputError::shape_mismatch(
                "self",
                format!("{} (the product's shape)", shape_str(lhs.0, rhs.1)),
                shape_str(o.0, o.1),
            )
            .into());
        }
    }
    Ok(())
}

/// The σ of the rescaled 2^k·A, scaled back in `f64` (so f32 σ beyond `f32::MAX` are still
/// returned); [`LinalgError::Overflow`] (argument `self`) beyond `f64::MAX`.
pub(crate) fn sigma_f64<A: Real>(s: impl Iterator<Item = A>, p: Pow2) -> Result<Vec<f64>> {
    let back = p.inverse();
    let v: Vec<f64> = s.map(|x| back.apply_f64(x.to_f64_lossy())).collect();
    match v.first() {
        Some(s1) if !s1.is_finite() => Err(LinalgError::Overflow {
            arg: "self",
            reason: format!("σ₁ exceeds f64::MAX (2^{} times the scaled σ₁)", back.k),
        }),
        _ => Ok(v),
    }
}

impl<A: Real> Matrix for Array2<A> {
    fn shape(&self) -> (usize, usize) {
        self.dim()
    }

    fn validate(&self, arg: &'static str) -> Result<()> {
        Ok(crate::input::check_matrix(arg, &self.view())?)
    }

    fn normal_range(&self) -> (f64, f64) {
        (A::NORMAL_MIN, A::FINITE_MAX)
    }

    fn into_transpose(self) -> Self {
        self.reversed_axes()
    }

    fn matmul(&self, rhs: &Self) -> Result<Self> {
        check_product("rhs", self.dim(), rhs.dim(), None)?;
        crate::error::check_dense("rhs", self.nrows(), rhs.ncols())?;
        Ok(mat_mul(self, rhs))
    }

    fn gram(&self) -> Result<Self> {
        crate::error::check_dense("self", self.nrows(), self.nrows())?;
        let m = self.nrows();
        Ok(syrk_array(self, 1.0, None).unwrap_or_else(|| {
            let mut out = Array2::zeros((m, m));
            mat_mul_into(A::one(), self, &self.t(), A::zero(), &mut out);
            out
        }))
    }

    fn gram_add(&self, alpha: f64, c: &Self, beta: f64) -> Result<Self> {
        let m = self.nrows();
        check_product("c", (m, self.ncols()), (self.ncols(), m), Some(c.dim()))?;
        if let Some(out) = syrk_array(self, alpha, Some((c, beta))) {
            return Ok(out);
        }
        let mut out = c.to_owned();
        mat_mul_into(
            A::from_f64_lossy(alpha),
            self,
            &self.t(),
            A::from_f64_lossy(beta),
            &mut out,
        );
        Ok(out)
    }

    fn gemm(&mut self, alpha: f64, a: &Self, b: &Self, beta: f64) -> Result<()> {
        check_product("b", a.dim(), b.dim(), Some(self.dim()))?;
        mat_mul_into(
            A::from_f64_lossy(alpha),
            a,
            b,
            A::from_f64_lossy(beta),
            self,
        );
        Ok(())
    }

    fn mul_add(&self, alpha: f64, a: &Self, b: &Self, beta: f64) -> Result<Self> {
        check_product("b", a.dim(), b.dim(), Some(self.dim()))?;
        let mut out = self.duplicate()?;
        mat_mul_into(
            A::from_f64_lossy(alpha),
            a,
            b,
            A::from_f64_lossy(beta),
            &mut out,
        );
        Ok(out)
    }

    fn scale(&mut self, alpha: f64) -> Result<()> {
        let s = A::from_f64_lossy(alpha);
        self.mapv_inplace(|x| x * s);
        Ok(())
    }

    fn axpy(&mut self, alpha: f64, x: &Self) -> Result<()> {
        if self.dim() != x.dim() {
            return Err(InputError::shape_mismatch(
                "x",
                shape_str(self.nrows(), self.ncols()),
                shape_str(x.nrows(), x.ncols()),
            )
            .into());
        }
        self.scaled_add(A::from_f64_lossy(alpha), x);
        Ok(())
    }

    fn frobenius_norm(&self) -> Result<f64> {
        Ok(array_norm(self))
    }

    fn duplicate(&self) -> Result<Self> {
        // Keep the memory order, so a transposed (column-major) matrix stays cheap for BLAS.
        if self.is_standard_layout() {
            Ok(self.to_owned())
        } else {
            let mut out = Array2::zeros(self.dim().f());
            out.assign(self);
            Ok(out)
        }
    }

    fn singular_values(&self) -> Result<Vec<f64>> {
        let (s, p) = scaled_singular_values(self.view(), SvdDriver::default())
            .map_err(|e| rename(e, "a", "self"))?;
        sigma_f64(s.iter().copied(), p)
    }

    fn polar_factor(&self) -> Result<Self> {
        polar_factor(self.view(), SvdDriver::default()).map_err(|e| rename(e, "a", "self"))
    }

    fn polar_factor_and_singular_values(&self) -> Result<(Self, Vec<f64>)> {
        let (f, p) =
            scaled_thin(self.view(), SvdDriver::default()).map_err(|e| rename(e, "a", "self"))?;
        Ok((f.u.dot(&f.vt), sigma_f64(f.s.iter().copied(), p)?))
    }

    fn inner(&self, other: &Self) -> Result<f64> {
        if self.dim() != other.dim() {
            return Err(InputError::shape_mismatch(
                "other",
                shape_str(self.nrows(), self.ncols()),
                shape_str(other.nrows(), other.ncols()),
            )
            .into());
        }
        Ok(self
            .iter()
            .zip(other.iter())
            .map(|(a, b)| a.to_f64_lossy() * b.to_f64_lossy())
            .sum())
    }

    fn diagonal(&self) -> Result<Vec<f64>> {
        Ok(self.diag().iter().map(|x| x.to_f64_lossy()).collect())
    }

    fn abs_row_sums(&self) -> Result<Vec<f64>> {
        Ok(self
            .rows()
            .into_iter()
            .map(|r| r.iter().map(|x| x.to_f64_lossy().abs()).sum())
            .collect())
    }

    fn set_diagonal(&mut self, d: &[f64]) -> Result<()> {
        let k = self.nrows().min(self.ncols());
        check_len("d", d.len(), k, "one entry per diagonal element")?;
        for (x, &v) in self.diag_mut().iter_mut().zip(d) {
            *x = A::from_f64_lossy(v);
        }
        Ok(())
    }

    fn scale_columns(&mut self, s: &[f64]) -> Result<()> {
        check_len("s", s.len(), self.ncols(), "one factor per column")?;
        for (mut col, &v) in self.columns_mut().into_iter().zip(s) {
            let v = A::from_f64_lossy(v);
            col.mapv_inplace(|x| x * v);
        }
        Ok(())
    }

    fn scale_entries(&mut self, s: &[f64]) -> Result<()> {
        let (rows, cols) = self.dim();
        check_len(
            "s",
            s.len(),
            rows * cols,
            "one factor per entry (row-major)",
        )?;
        for ((i, j), x) in self.indexed_iter_mut() {
            *x *= A::from_f64_lossy(s[i * cols + j]);
        }
        Ok(())
    }

    fn copy_from(&mut self, src: &Self) -> Result<()> {
        if self.dim() != src.dim() {
            return Err(InputError::shape_mismatch(
                "src",
                shape_str(self.nrows(), self.ncols()),
                shape_str(src.nrows(), src.ncols()),
            )
            .into());
        }
        self.assign(src);
        Ok(())
    }
}
