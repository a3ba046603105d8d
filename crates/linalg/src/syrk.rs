//! Symmetric products in half the flops: A·Aᵀ by BLAS `syrk`, for
//! [`Matrix::gram`](crate::Matrix::gram) and [`Matrix::gram_add`](crate::Matrix::gram_add) on
//! both backends.
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
//! f32 and f64 matrices with dimensions within BLAS's 32-bit integers (a matrix contiguous in
//! neither row- nor column-major order is copied first), through the process's CBLAS `cblas_?syrk` (the system OpenBLAS by
//! default, the library of ndarray's other products). Everything else takes the general
//! product, with the same result to rounding but symmetric only to rounding.
//!
//! # Tensors
//!
//! libtorch's public API has no `syrk`, but `libtorch_cpu.so` exports the driver of its
//! bundled MKL's (`mkl_blas_ssyrk`, `mkl_blas_dsyrk`, the Fortran interface; [`crate::mkl`]
//! finds them, checks them on a 3×2 probe, and calls them with 64-bit integers). Where the
//! loaded libtorch has them (x86-64 Linux builds), a CPU f32/f64 tensor's `syrk` is MKL's, on
//! libtorch's own OpenMP pool, at any thread count. Elsewhere it is OpenBLAS's, beside libtorch's
//! products — and two thread pools contend: OpenBLAS's workers keep spinning after a call and take
//! the cores libtorch's next product needs (measured on a 2-core AMD EPYC Zen 3: a Muon step at
//! two threads took 5.5× torch.optim.Muon's time at 384² and 1.2–1.35× at larger shapes, against
//! 0.72–0.84× at one thread). So without MKL, tensors take `syrk` only while libtorch and
//! OpenBLAS each run one thread (`tch::get_num_threads()` and `openblas_get_num_threads()`, read
//! at every call), and the general product otherwise.
//!
//! bf16 tensors have no BLAS `syrk` (neither MKL nor oneDNN offers one), so a wide CPU bf16
//! matrix X ∈ ℝ^{r×s} takes its Gram matrix by **row blocks** instead:
//! with X split into row blocks X₁ … X_p of [`ROW_BLOCK`] rows, block row i of the upper
//! triangle is one general product X_i·[X_i; …; X_p]ᵀ, written where it lies in the result, and
//! the triangle is then mirrored: (p + 1)/(2p) of the full product's flops, 2/3 at r = 768,
//! exactly symmetric. Each entry is still one bf16 rounding of an f32 dot product over the s
//! columns (oneDNN's), as in the full product; only the order of its summation may differ. It
//! applies where the smaller products keep the kernels busy (r ≥ [`ROW_BLOCK_MIN_ROWS`],
//! s ≥ 2r): there the row blocks measured faster than libtorch's full product on one thread and
//! two (where libtorch ran the full 768-row product on one thread only); square matrices (the
//! polynomial part's A·A included) and r = 512 gained nothing and keep the general product.
//! kappa-benches' `optim` bench prints the ratio at three wide shapes.
//!
//! (A first try at MKL's routine, with 32-bit integers, crashed when called before libtorch had
//! run a product of its own. The routine reads 64-bit integers: a size of 2³² + 70 passed as one
//! does not compute a 70-row product, and 32-bit arguments leave the upper halves to whatever
//! lies beside them. kappa passes 64-bit integers — below 2³¹ they read the same at either width
//! on a little-endian CPU — and still runs one small libtorch product before the first call.)

// The BLAS call reads and writes raw memory; each use states its contract.
#![allow(unsafe_code)]

use cblas_sys::{CBLAS_LAYOUT, CBLAS_TRANSPOSE, CBLAS_UPLO};
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

/// How BLAS reads a contiguous `rows`×`cols` matrix: `None` where a dimension does not fit
/// BLAS's integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BlasLayout {
    /// Memory holds Aᵀ row-major (A is column-major).
    transposed: bool,
    n: i32,
    k: i32,
    lda: i32,
}

impl BlasLayout {
    fn of(rows: usize, cols: usize, column_major: bool) -> Option<Self> {
        if rows == 0 || cols == 0 {
            return None;
        }
        i32::try_from(rows.checked_mul(rows)?).ok()?;
        let (n, k) = (i32::try_from(rows).ok()?, i32::try_from(cols).ok()?);
        // Row-major: A itself, rows `cols` apart. Column-major: memory holds Aᵀ (cols × rows)
        // row-major, rows `rows` apart, and A·Aᵀ = (Aᵀ)ᵀ·Aᵀ.
        let lda = if column_major { n } else { k };
        Some(Self {
            transposed: column_major,
            n,
            k,
            lda,
        })
    }
}

/// `out` ← α·A·Aᵀ + β·`out`, both triangles, for a contiguous `rows`×`cols` matrix A given by
/// its elements `a` in row-major (or, with `column_major`, column-major) order; `out` is
/// rows × rows, row-major (with β = 0 its contents are not read; otherwise only its upper
/// triangle is, so it must be symmetric for the result to mean α·A·Aᵀ + β·C). Returns `false`,
/// touching nothing, when the lengths do not match the shape or the shape does not fit BLAS.
pub(crate) fn syrk_slice<T: SyrkElement>(
    a: &[T],
    shape: (usize, usize),
    column_major: bool,
    (alpha, beta): (f64, f64),
    out: &mut [T],
) -> bool {
    syrk_slice_by(a, shape, column_major, out, |l, a, c| {
        let trans = if l.transposed {
            CBLAS_TRANSPOSE::CblasTrans
        } else {
            CBLAS_TRANSPOSE::CblasNoTrans
        };
        // SAFETY: `syrk_slice_by`'s promise: `a` and `c` are what BLAS reads and writes for
        // this layout (leading dimension of `a` = its stored row length, of `c` = l.n).
        unsafe { T::syrk_upper(trans, l.n, l.k, alpha, a, l.lda, beta, c) }
    })
}

/// The row-major upper triangle of α·A·Aᵀ + β·C by libtorch's MKL `?syrk` (`f`, from
/// [`crate::mkl`]): MKL's column-major lower one (a row-major matrix is the column-major
/// transpose).
///
/// # Safety
///
/// `a` and `c` must be what BLAS reads and writes for `l` (as [`syrk_slice_by`] passes them).
#[cfg(all(feature = "tch", target_os = "linux"))]
unsafe fn mkl_syrk_upper<T: crate::mkl::LibtorchSyrk>(
    f: crate::mkl::SyrkFn<T>,
    l: BlasLayout,
    (alpha, beta): (f64, f64),
    a: *const T,
    c: *mut T,
) {
    // Row-major A (memory Aᵀ column-major): A·Aᵀ = (Aᵀ)ᵀ·Aᵀ, trans 'T'; column-major A (memory
    // holds A column-major): trans 'N'.
    let trans = if l.transposed { c"N" } else { c"T" };
    let (n, k, lda) = (i64::from(l.n), i64::from(l.k), i64::from(l.lda));
    let (alpha, beta) = (T::of(alpha), T::of(beta));
    // SAFETY: the caller's contract; the Fortran arguments are locals that outlive the call.
    unsafe {
        f(
            c"L".as_ptr(),
            trans.as_ptr(),
            &n,
            &k,
            &alpha,
            a,
            &lda,
            &beta,
            c,
            &n,
        )
    }
}

/// Checks the lengths and the layout, runs `blas` (which must compute the row-major upper
/// triangle of α·A·Aᵀ + β·C into its second pointer, reading A through its first as `layout`
/// says), then mirrors the triangle. `blas` gets exactly rows·cols readable elements and rows²
/// writable ones, kept apart by the borrows.
fn syrk_slice_by<T: Copy>(
    a: &[T],
    (rows, cols): (usize, usize),
    column_major: bool,
    out: &mut [T],
    blas: impl FnOnce(BlasLayout, *const T, *mut T),
) -> bool {
    let Some(layout) = BlasLayout::of(rows, cols, column_major) else {
        return false;
    };
    if Some(a.len()) != rows.checked_mul(cols) || out.len() != rows * rows {
        return false;
    }
    blas(layout, a.as_ptr(), out.as_mut_ptr());
    mirror_upper(out, rows);
    true
}

/// Copies the strict upper triangle of the row-major n×n matrix `c` into its lower triangle.
/// Full 16×16 tiles off the diagonal go through a buffer, so that both the rows read and the
/// rows written are contiguous (about 3× faster than entry by entry for a bf16 768² matrix);
/// the diagonal and edge tiles go entry by entry.
fn mirror_upper<T: Copy>(c: &mut [T], n: usize) {
    const TILE: usize = 16;
    let Some(&fill) = c.first() else {
        return;
    };
    let mut tile = [[fill; TILE]; TILE];
    for ib in (0..n).step_by(TILE) {
        for jb in (ib..n).step_by(TILE) {
            let (ie, je) = ((ib + TILE).min(n), (jb + TILE).min(n));
            if jb == ib || ie - ib < TILE || je - jb < TILE {
                for i in ib..ie {
                    for j in jb.max(i + 1)..je {
                        c[j * n + i] = c[i * n + j];
                    }
                }
                continue;
            }
            for (a, row) in tile.iter_mut().enumerate() {
                let at = (ib + a) * n + jb;
                row.copy_from_slice(&c[at..at + TILE]);
            }
            for b in 0..TILE {
                let at = (jb + b) * n + ib;
                for (d, row) in c[at..at + TILE].iter_mut().zip(&tile) {
                    *d = row[b];
                }
            }
        }
    }
}

/// α·X·Xᵀ (+ β·C) by `syrk` for a 2-D CPU f32/f64 tensor (a tensor contiguous in neither order
/// is copied first), as a new contiguous tensor; `Ok(None)` for every other tensor, which takes
/// the general product. Operands are checked, and the thread rule of "Tensors" (module docs)
/// applied, by the caller (`tch_backend`).
#[cfg(feature = "tch")]
pub(crate) fn syrk_tensor(
    x: &Tensor,
    alpha: f64,
    c: Option<(&Tensor, f64)>,
) -> Result<Option<Tensor>, tch::TchError> {
    let &[m, k] = x.size().as_slice() else {
        return Ok(None);
    };
    if x.device() != Device::Cpu || !matches!(x.kind(), Kind::Float | Kind::Double) {
        return Ok(None);
    }
    let (m, k, kind) = (m as usize, k as usize, x.kind());
    let column_major = !x.is_contiguous() && x.tr().is_contiguous();
    let x = if x.is_contiguous() || column_major {
        x.shallow_clone()
    } else {
        x.f_contiguous()?
    };
    let beta = c.map_or(0.0, |(_, beta)| beta);
    let mut out = Tensor::f_empty([m as i64, m as i64], (kind, Device::Cpu))?;
    if let Some((c, _)) = c.filter(|_| beta != 0.0) {
        out.f_copy_(c)?;
    }
    let (a, o) = (x.data_ptr(), out.data_ptr());
    // SAFETY: `x` is a live CPU tensor of kind `kind`, contiguous in row-major or (with
    // `column_major`) column-major order, so its data pointer addresses exactly m·k elements;
    // `out` is a new contiguous m×m tensor of the same kind that shares no storage with `x`.
    let done = unsafe {
        if kind == Kind::Float {
            let a = std::slice::from_raw_parts(a as *const f32, m * k);
            let o = std::slice::from_raw_parts_mut(o as *mut f32, m * m);
            syrk_slice_on_tensors(a, (m, k), column_major, (alpha, beta), o)
        } else {
            let a = std::slice::from_raw_parts(a as *const f64, m * k);
            let o = std::slice::from_raw_parts_mut(o as *mut f64, m * m);
            syrk_slice_on_tensors(a, (m, k), column_major, (alpha, beta), o)
        }
    };
    Ok(done.then_some(out))
}

/// [`syrk_slice`] for a tensor's data: by libtorch's own MKL where it has one ("Tensors" in
/// the module docs), by the CBLAS otherwise.
#[cfg(feature = "tch")]
fn syrk_slice_on_tensors<T: TensorSyrk>(
    a: &[T],
    shape: (usize, usize),
    column_major: bool,
    coefficients: (f64, f64),
    out: &mut [T],
) -> bool {
    #[cfg(target_os = "linux")]
    if let Some(f) = crate::mkl::libtorch_syrk::<T>() {
        return syrk_slice_by(a, shape, column_major, out, |l, a, c| {
            // SAFETY: `syrk_slice_by` passes what BLAS reads and writes for `l`.
            unsafe { mkl_syrk_upper(f, l, coefficients, a, c) }
        });
    }
    syrk_slice(a, shape, column_major, coefficients, out)
}

/// The element types of [`syrk_slice_on_tensors`]: CBLAS's, and on Linux libtorch's MKL's.
#[cfg(all(feature = "tch", target_os = "linux"))]
trait TensorSyrk: SyrkElement + crate::mkl::LibtorchSyrk {}
#[cfg(all(feature = "tch", not(target_os = "linux")))]
trait TensorSyrk: SyrkElement {}
#[cfg(feature = "tch")]
impl TensorSyrk for f32 {}
#[cfg(feature = "tch")]
impl TensorSyrk for f64 {}

/// Rows per block of the row-block Gram matrix of bf16 tensors (module docs).
pub const ROW_BLOCK: usize = 256;
/// The fewest rows a bf16 tensor needs for the row-block Gram matrix (module docs).
pub const ROW_BLOCK_MIN_ROWS: usize = 768;

/// Whether `row_block_gram` takes a matrix of this kind, device and shape (module docs).
#[cfg(feature = "tch")]
pub(crate) fn takes_row_blocks(x: &Tensor) -> bool {
    match x.size()[..] {
        [r, s] => {
            x.device() == Device::Cpu
                && x.kind() == Kind::BFloat16
                && r >= ROW_BLOCK_MIN_ROWS as i64
                && s >= 2 * r
        }
        _ => false,
    }
}

/// X·Xᵀ for a 2-D tensor that [`takes_row_blocks`], by row blocks (module docs), as a new
/// contiguous tensor; `Ok(None)` for every other tensor (operands are checked by the caller).
#[cfg(feature = "tch")]
pub(crate) fn row_block_gram(x: &Tensor) -> Result<Option<Tensor>, tch::TchError> {
    if !takes_row_blocks(x) {
        return Ok(None);
    }
    let r = x.size()[0];
    let x = x.f_contiguous()?;
    let out = Tensor::f_empty([r, r], (Kind::BFloat16, Device::Cpu))?;
    for top in (0..r).step_by(ROW_BLOCK) {
        let rows = (ROW_BLOCK as i64).min(r - top);
        let below = x.f_narrow(0, top, r - top)?;
        let block_row = out.f_narrow(0, top, rows)?.f_narrow(1, top, r - top)?;
        let _ = x
            .f_narrow(0, top, rows)?
            .f_mm_out(&block_row, &below.f_tr()?)?;
    }
    let r = r as usize;
    // SAFETY: `out` was allocated above as a contiguous CPU bf16 r×r tensor (16-bit entries,
    // read and written as their bits); the products above have finished writing it, and
    // nothing else refers to it until it is returned.
    let entries = unsafe { std::slice::from_raw_parts_mut(out.data_ptr().cast::<u16>(), r * r) };
    mirror_upper(entries, r);
    Ok(Some(out))
}

/// Whether CPU tensors of `kind` take libtorch's own MKL `syrk`, which runs on libtorch's
/// thread pool and so at any thread count ("Tensors" in the module docs).
#[cfg(feature = "tch")]
pub(crate) fn libtorch_syrk_for(kind: Kind) -> bool {
    #[cfg(target_os = "linux")]
    {
        match kind {
            Kind::Float => crate::mkl::libtorch_syrk::<f32>().is_some(),
            Kind::Double => crate::mkl::libtorch_syrk::<f64>().is_some(),
            _ => false,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = kind;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_fit_blas_or_are_refused() {
        let row = BlasLayout::of(3, 5, false).unwrap();
        assert_eq!((row.transposed, row.lda), (false, 5));
        let col = BlasLayout::of(3, 5, true).unwrap();
        assert_eq!((col.transposed, col.lda), (true, 3));
        assert_eq!(BlasLayout::of(0, 5, false), None, "empty");
        assert_eq!(BlasLayout::of(1 << 16, 1, false), None, "rows² beyond i32");
        assert_eq!(BlasLayout::of(2, 1 << 31, false), None, "cols beyond i32");
    }

    #[test]
    fn slices_of_the_wrong_length_are_refused() {
        let a = [1.0f64; 6];
        let mut out = [0.0f64; 9];
        assert!(!syrk_slice(&a[..5], (3, 2), false, (1.0, 0.0), &mut out));
        assert!(!syrk_slice(&a, (3, 2), false, (1.0, 0.0), &mut out[..8]));
        assert_eq!(out, [0.0; 9]);
        assert!(syrk_slice(&a, (3, 2), false, (1.0, 0.0), &mut out));
        assert_eq!(out, [2.0; 9]);
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
