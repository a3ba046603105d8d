//! Symmetric products in half the flops: A·Aᵀ by BLAS `syrk`, for [`Matrix::gram`] and
//! [`Matrix::gram_add`] on both backends.
//!
//! # Math
//!
//! For A ∈ ℝ^{n×k} and a symmetric C, α·A·Aᵀ + β·C is symmetric, and BLAS `?syrk` computes one
//! triangle of it in n²k flops, half of a general product's 2n²k. kappa computes the upper
//! triangle (row-major) and copies it into the lower one, so the result is *exactly* symmetric;
//! a general product is symmetric only to rounding, because entries (i, j) and (j, i) may be
//! summed in different orders. Each entry carries the dot-product bound
//! |fl(α·(AAᵀ)_ij) − α·(AAᵀ)_ij| ≤ γ_k·|α|·Σ_l |a_il||a_jl|, γ_k = kε/(1 − kε), as a general
//! product's does, so the two agree to 2γ_k·|α|·(|A||A|ᵀ)_ij (plus the rounding of β·c_ij).
//!
//! Newton–Schulz takes two of its three products per step from here: A = X·Xᵀ, and the
//! polynomial part b·A + c·A² = b·A + c·A·Aᵀ (A is symmetric), so a quintic step on X ∈ ℝ^{r×s},
//! r ≤ s, costs 3r²s + r³ flops instead of 4r²s + 2r³.
//!
//! # Which matrices
//!
//! f32 and f64 matrices with dimensions within BLAS's 32-bit integers (a layout without a unit
//! stride is copied first), through the process's CBLAS `cblas_?syrk` (the system OpenBLAS by
//! default, the library of ndarray's other products). Everything else takes the general
//! product, with the same result to rounding but symmetric only to rounding.
//!
//! # Tensors
//!
//! libtorch exports no `syrk` (its MKL's routines stay internal), so a `tch` CPU tensor's `syrk`
//! is OpenBLAS's, beside libtorch's own products on libtorch's OpenMP pool. Two thread pools
//! contend: OpenBLAS's workers keep spinning after a call and take the cores libtorch's next
//! product needs. Measured on a 2-core AMD EPYC (Zen 3), a Muon step at two threads took
//! 5.5× torch.optim.Muon's time at 384² (median of alternated pairs) and 1.2–1.35× at the larger
//! shapes, against 0.72–0.84× at one thread. Tensors therefore take `syrk` only while libtorch
//! and OpenBLAS each run one thread (`tch::get_num_threads()` and `openblas_get_num_threads()`,
//! read at every call), and the general product otherwise. (MKL's internal `mkl_blas_ssyrk`,
//! which libtorch does export, crashed when called before libtorch had run a product of its
//! own: not a usable interface.)

// The BLAS call reads and writes raw memory; each use states its contract.
#![allow(unsafe_code)]

use cblas_sys::{CBLAS_LAYOUT, CBLAS_TRANSPOSE, CBLAS_UPLO};
use ndarray::Array2;
#[cfg(feature = "tch")]
use tch::{Device, Kind, Tensor};

pub(crate) use element::SyrkElement;

mod element {
    use super::{CBLAS_LAYOUT, CBLAS_UPLO};
    use cblas_sys::CBLAS_TRANSPOSE;

    /// The element types BLAS `syrk` computes in (f32, f64); a bound of [`crate::Real`] that only
    /// this crate can name or implement.
    pub trait SyrkElement: Copy {
        /// `cblas_?syrk` in row-major order, upper triangle.
        ///
        /// # Safety
        /// `a` must be readable as the `lda`-strided row-major matrix BLAS expects for `trans`, `n`
        /// and `k`, and `c` writable as an `n`×`n` row-major matrix with leading dimension `n`, not
        /// overlapping `a`.
        #[allow(clippy::too_many_arguments)]
        unsafe fn syrk_upper(
            trans: CBLAS_TRANSPOSE,
            n: i32,
            k: i32,
            alpha: f64,
            a: *const Self,
            lda: i32,
            beta: f64,
            c: *mut Self,
        );
    }

    impl SyrkElement for f32 {
        unsafe fn syrk_upper(
            trans: CBLAS_TRANSPOSE,
            n: i32,
            k: i32,
            alpha: f64,
            a: *const f32,
            lda: i32,
            beta: f64,
            c: *mut f32,
        ) {
            // SAFETY: the caller's contract (see the trait).
            unsafe {
                cblas_sys::cblas_ssyrk(
                    CBLAS_LAYOUT::CblasRowMajor,
                    CBLAS_UPLO::CblasUpper,
                    trans,
                    n,
                    k,
                    alpha as f32,
                    a,
                    lda,
                    beta as f32,
                    c,
                    n,
                )
            }
        }
    }

    impl SyrkElement for f64 {
        unsafe fn syrk_upper(
            trans: CBLAS_TRANSPOSE,
            n: i32,
            k: i32,
            alpha: f64,
            a: *const f64,
            lda: i32,
            beta: f64,
            c: *mut f64,
        ) {
            // SAFETY: the caller's contract (see the trait).
            unsafe {
                cblas_sys::cblas_dsyrk(
                    CBLAS_LAYOUT::CblasRowMajor,
                    CBLAS_UPLO::CblasUpper,
                    trans,
                    n,
                    k,
                    alpha,
                    a,
                    lda,
                    beta,
                    c,
                    n,
                )
            }
        }
    }
}

/// How BLAS reads an `rows`×`cols` matrix with strides `(row_stride, col_stride)` (in elements):
/// row-major as it is, or as the transpose of a row-major matrix; `None` when it has no unit
/// stride or does not fit BLAS's integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlasLayout {
    /// Memory holds Aᵀ row-major (A is column-major).
    transposed: bool,
    n: i32,
    k: i32,
    lda: i32,
}

impl BlasLayout {
    /// The layout of A (rows × cols, A·Aᵀ is rows × rows), if BLAS can read it in place.
    pub(crate) fn of(
        rows: usize,
        cols: usize,
        row_stride: isize,
        col_stride: isize,
    ) -> Option<Self> {
        let n = i32::try_from(rows).ok()?;
        let k = i32::try_from(cols).ok()?;
        if rows == 0 || cols == 0 || i32::try_from(rows.checked_mul(rows)?).is_err() {
            return None;
        }
        // Row-major: A itself, leading dimension = row stride (≥ cols; any value for one row).
        if col_stride == 1 || cols == 1 {
            let lda = if rows == 1 { cols as isize } else { row_stride };
            if lda >= cols as isize {
                return Some(Self {
                    transposed: false,
                    n,
                    k,
                    lda: i32::try_from(lda).ok()?,
                });
            }
        }
        // Column-major: memory holds Aᵀ (cols × rows) row-major, and A·Aᵀ = (Aᵀ)ᵀ·Aᵀ.
        if row_stride == 1 || rows == 1 {
            let lda = if cols == 1 { rows as isize } else { col_stride };
            if lda >= rows as isize {
                return Some(Self {
                    transposed: true,
                    n,
                    k,
                    lda: i32::try_from(lda).ok()?,
                });
            }
        }
        None
    }
}

/// `out` ← α·A·Aᵀ + β·`out`, both triangles (`out` is rows × rows, row-major, contiguous; with
/// β = 0 its contents are not read). Only the upper triangle of `out` is read when β ≠ 0, so a
/// symmetric `out` is required for the result to mean α·A·Aᵀ + β·C.
///
/// # Safety
/// `a` must point at the first element of a matrix readable with `layout` (which must come from
/// [`BlasLayout::of`] for that matrix's shape and strides), and must not overlap `out`.
pub(crate) unsafe fn syrk_into<T: SyrkElement>(
    a: *const T,
    layout: BlasLayout,
    alpha: f64,
    beta: f64,
    out: &mut [T],
) {
    let n = layout.n as usize;
    assert_eq!(out.len(), n * n, "syrk_into: out must be rows × rows");
    // SAFETY: the caller's contract for `a`; `out` is an exclusive n×n row-major buffer.
    let trans = if layout.transposed {
        CBLAS_TRANSPOSE::CblasTrans
    } else {
        CBLAS_TRANSPOSE::CblasNoTrans
    };
    unsafe {
        T::syrk_upper(
            trans,
            layout.n,
            layout.k,
            alpha,
            a,
            layout.lda,
            beta,
            out.as_mut_ptr(),
        )
    };
    mirror_upper(out, n);
}

/// Copies the strict upper triangle of the row-major n×n matrix `c` into its lower triangle, in
/// cache-sized tiles.
pub(crate) fn mirror_upper<T: Copy>(c: &mut [T], n: usize) {
    const TILE: usize = 64;
    for ib in (0..n).step_by(TILE) {
        for jb in (ib..n).step_by(TILE) {
            for i in ib..(ib + TILE).min(n) {
                for j in jb.max(i + 1)..(jb + TILE).min(n) {
                    c[j * n + i] = c[i * n + j];
                }
            }
        }
    }
}

/// α·A·Aᵀ (+ β·C) by BLAS `syrk` (see [`crate::syrk`]; a layout BLAS cannot read is copied to
/// standard layout first), as a new standard-layout matrix; `None` only for sizes beyond BLAS's
/// integers.
pub(crate) fn syrk_array<A: crate::Real>(
    a: &Array2<A>,
    alpha: f64,
    c: Option<(&Array2<A>, f64)>,
) -> Option<Array2<A>> {
    let (m, k) = a.dim();
    let strides = a.strides();
    if BlasLayout::of(m, k, strides[0], strides[1]).is_none() {
        // No unit stride (or a negative one): a standard-layout copy, O(mk) against the
        // product's O(m²k), so that every layout gets the same exactly symmetric result.
        let copy = a.as_standard_layout().into_owned();
        if BlasLayout::of(m, k, k as isize, 1).is_some() {
            return syrk_array(&copy, alpha, c);
        }
        return None;
    }
    let layout = BlasLayout::of(m, k, strides[0], strides[1])?;
    let beta = c.map_or(0.0, |(_, beta)| beta);
    let mut out = match c {
        Some((c, _)) if beta != 0.0 => c.as_standard_layout().into_owned(),
        _ => Array2::zeros((m, m)),
    };
    let buf = out.as_slice_mut()?;
    // SAFETY: `a` is a live array with the shape and strides `layout` was made from, and `out`
    // is a new array that shares no memory with it.
    unsafe { syrk_into(a.as_ptr(), layout, alpha, beta, buf) };
    Some(out)
}

#[cfg(feature = "tch")]
/// α·X·Xᵀ (+ β·C) by CBLAS `syrk` for a CPU f32/f64 tensor while libtorch and the BLAS each run
/// one thread (see "Tensors" in the module docs; a layout BLAS cannot read is copied to a
/// contiguous tensor first), as a new contiguous tensor; `Ok(None)` for every other tensor and
/// setting, which takes the general product. Operands are checked by the caller.
pub(crate) fn syrk_tensor(
    x: &Tensor,
    alpha: f64,
    c: Option<(&Tensor, f64)>,
) -> crate::error::Result<Option<Tensor>> {
    let backend = crate::tch_backend::backend;
    let &[m, k] = x.size().as_slice() else {
        return Ok(None);
    };
    let (m, k, kind) = (m as usize, k as usize, x.kind());
    let single_threaded = tch::get_num_threads() == 1 && crate::blas::blas_threads() == Some(1);
    if x.device() != Device::Cpu || !matches!(kind, Kind::Float | Kind::Double) || !single_threaded
    {
        return Ok(None);
    }
    let strides = x.stride();
    let Some(layout) = BlasLayout::of(m, k, strides[0] as isize, strides[1] as isize) else {
        // No unit stride: a contiguous copy (as for arrays), unless the size is beyond BLAS.
        if !x.is_contiguous() {
            return syrk_tensor(&x.f_contiguous().map_err(backend("self"))?, alpha, c);
        }
        return Ok(None);
    };
    let beta = c.map_or(0.0, |(_, beta)| beta);
    let mut out =
        Tensor::f_empty([m as i64, m as i64], (kind, Device::Cpu)).map_err(backend("self"))?;
    if let Some((c, _)) = c.filter(|_| beta != 0.0) {
        out.f_copy_(c).map_err(backend("c"))?;
    }
    let (a, len) = (x.data_ptr(), m * m);
    // SAFETY: `x` is a live CPU tensor of kind `kind` whose data pointer addresses its first
    // element with the shape and strides `layout` was made from; `out` is a new contiguous
    // m×m tensor of the same kind, shared with nothing, so its storage is an exclusive slice of
    // `len` elements for the duration of the call.
    unsafe {
        if kind == Kind::Float {
            let buf = std::slice::from_raw_parts_mut(out.data_ptr() as *mut f32, len);
            syrk_into(a as *const f32, layout, alpha, beta, buf)
        } else {
            let buf = std::slice::from_raw_parts_mut(out.data_ptr() as *mut f64, len);
            syrk_into(a as *const f64, layout, alpha, beta, buf)
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_read_in_place_or_refused() {
        let row = BlasLayout::of(3, 5, 5, 1).unwrap();
        assert_eq!((row.transposed, row.lda), (false, 5));
        let padded = BlasLayout::of(3, 5, 8, 1).unwrap();
        assert_eq!(padded.lda, 8);
        let col = BlasLayout::of(3, 5, 1, 3).unwrap();
        assert_eq!((col.transposed, col.lda), (true, 3));
        assert_eq!(BlasLayout::of(3, 5, 10, 2), None, "no unit stride");
        assert_eq!(BlasLayout::of(3, 5, 4, 1), None, "rows overlap");
        assert_eq!(BlasLayout::of(3, 5, -5, 1), None, "negative stride");
        assert_eq!(BlasLayout::of(0, 5, 5, 1), None, "empty");
        assert!(
            BlasLayout::of(1, 5, 0, 1).is_some(),
            "one row: any row stride"
        );
        assert!(
            BlasLayout::of(4, 1, 1, 0).is_some(),
            "one column: any column stride"
        );
    }

    #[test]
    fn mirror_fills_the_lower_triangle_from_the_upper() {
        for n in [1, 2, 63, 64, 65, 130] {
            let mut c: Vec<f64> = (0..n * n)
                .map(|e| {
                    if e / n <= e % n {
                        (e / n * 1000 + e % n) as f64
                    } else {
                        f64::NAN
                    }
                })
                .collect();
            mirror_upper(&mut c, n);
            for i in 0..n {
                for j in 0..n {
                    let (lo, hi) = (i.min(j), i.max(j));
                    assert_eq!(
                        c[i * n + j],
                        (lo * 1000 + hi) as f64,
                        "n {n} entry ({i}, {j})"
                    );
                }
            }
        }
    }
}
