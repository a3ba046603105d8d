//! General matrix products of ndarray matrices on faer's kernels: [`mat_mul`] and
//! [`mat_mul_into`], drop-in for ndarray's `dot` and `general_mat_mul`.
//!
//! # Why not the BLAS
//!
//! ndarray's products call the process's BLAS (the system OpenBLAS by default), whose speed
//! depends on which kernel that build knows for the CPU and on `OPENBLAS_CORETYPE`, which kappa
//! never overrides. faer's kernels are chosen at run time from the CPU's own features (AVX-512,
//! AVX2+FMA, or portable code), whatever the BLAS: measured on an AMD EPYC Zen 5 at one thread,
//! these products run at 0.90–1.02 of libtorch's MKL on its AVX-512 kernels at 256²–2048² (f32
//! and f64), where Debian's OpenBLAS 0.3.21 runs at 0.72–0.86 (f64) on its best kernel and
//! 0.47–0.51 on the AVX2 one an environment may force (docs/architecture.md has the tables).
//! LAPACK's factorizations (SVD, eigenproblems) and the symmetric `syrk` products stay on the
//! BLAS.
//!
//! Shapes that disagree panic, as ndarray's `dot` and `general_mat_mul` do (a caller's bug, not
//! bad data); callers taking matrices from users check shapes first (`Matrix::matmul` returns
//! a typed error). NaN and infinities propagate as in any BLAS product.
//!
//! # Contract
//!
//! C ← α·A·B + β·C, with β = 0 meaning "C is not read" (as in BLAS: NaN in C does not
//! propagate). Any strides, including negative ones and transposed views. Each entry of the
//! result carries the dot-product bound |fl(c_ij) − c_ij| ≤ γ_k·|α|·(|A||B|)_ij + rounding of
//! β·c_ij, γ_k = kε/(1 − kε), as any BLAS product's does; the summation order (and so the last
//! bits) depends on the CPU's vector width, as a BLAS's does.
//!
//! # Threads
//!
//! One thread where rayon's current pool has one (`RAYON_NUM_THREADS=1`, or a call from a
//! one-thread pool), or where the product is below [`PARALLEL_MIN_ENTRIES`] result entries or
//! [`PARALLEL_MIN_MULS`] multiply–adds; else that pool's threads. The thresholds are measured
//! (AMD EPYC Zen 5, 2 threads, f64): threads cost 4–14× at 64×16×64, 1.1–1.2× on 197×64 or
//! 64×64 results with any inner size, and save 25–35 % from 197×197 results with k = 64 up.
//! faer splits the result among threads, not the sums, so the bits do not depend on the thread
//! count (tested). A caller that splits its own work among rayon tasks runs each task's products
//! on the task's thread with [`sequential`].
//!
//! ```
//! use kappa_linalg::product::{mat_mul, mat_mul_into};
//! use ndarray::array;
//!
//! let a = array![[1.0, 2.0], [3.0, 4.0]];
//! let b = array![[5.0, 6.0], [7.0, 8.0]];
//! assert_eq!(mat_mul(&a, &b), a.dot(&b));
//!
//! let mut c = array![[1.0, 1.0], [1.0, 1.0]];
//! mat_mul_into(2.0, &a.t(), &b, 0.5, &mut c); // C ← 2·Aᵀ·B + C/2
//! assert_eq!(c, a.t().dot(&b) * 2.0 + 0.5);
//! ```

// Matrices are handed to faer as raw pointers with ndarray's strides; each use states why the
// view is valid.
#![allow(unsafe_code)]

use ndarray::{Array2, ArrayBase, ArrayView2, ArrayViewMut2, Data, DataMut, Ix2};

/// A·B as a new matrix (ndarray's `a.dot(b)` for 2-D arrays, on faer's kernels).
///
/// # Panics
/// When `a.ncols() != b.nrows()`, as `dot` does.
pub fn mat_mul<A, Sa, Sb>(a: &ArrayBase<Sa, Ix2>, b: &ArrayBase<Sb, Ix2>) -> Array2<A>
where
    A: crate::Real,
    Sa: Data<Elem = A>,
    Sb: Data<Elem = A>,
{
    let mut c = Array2::<A>::zeros((a.nrows(), b.ncols()));
    mat_mul_into(A::one(), a, b, A::zero(), &mut c);
    c
}

/// C ← α·A·B + β·C (ndarray's `general_mat_mul`, on faer's kernels); β = 0 does not read C.
///
/// # Panics
/// When the shapes disagree (A m×k, B k×n, C m×n), as `general_mat_mul` does.
pub fn mat_mul_into<A, Sa, Sb, Sc>(
    alpha: A,
    a: &ArrayBase<Sa, Ix2>,
    b: &ArrayBase<Sb, Ix2>,
    beta: A,
    c: &mut ArrayBase<Sc, Ix2>,
) where
    A: crate::Real,
    Sa: Data<Elem = A>,
    Sb: Data<Elem = A>,
    Sc: DataMut<Elem = A>,
{
    let (m, k) = a.dim();
    let (k2, n) = b.dim();
    assert!(
        k == k2 && c.dim() == (m, n),
        "mat_mul_into: A is {m}×{k}, B {k2}×{n}, C {}×{}",
        c.nrows(),
        c.ncols()
    );
    let accum = if beta == A::zero() {
        faer::Accum::Replace
    } else {
        if beta != A::one() {
            c.mapv_inplace(|x| x * beta);
        }
        faer::Accum::Add
    };
    // SAFETY: each view's pointer, shape and strides come from one live ndarray view, which
    // ndarray guarantees addresses valid elements for every in-range index; `c` is borrowed
    // mutably, so it overlaps neither `a` nor `b`, and the faer views live only for this call.
    let (a, b, mut c) = (a.view(), b.view(), c.view_mut());
    let (a, b, c) = unsafe { (faer_ref(&a), faer_ref(&b), faer_mut(&mut c)) };
    faer::linalg::matmul::matmul(c, accum, a, b, alpha, parallelism(m, n, k));
}

/// Threads pay only on products with at least this many result entries (faer splits the
/// result among them)...
pub const PARALLEL_MIN_ENTRIES: usize = 1 << 14;
/// ... and at least this many multiply–adds.
pub const PARALLEL_MIN_MULS: usize = 1 << 20;

/// faer's thread setting for an m×k by k×n product: sequential in a one-thread rayon pool,
/// below the size thresholds or inside [`sequential`], else the current pool's threads.
fn parallelism(m: usize, n: usize, k: usize) -> faer::Par {
    let entries = m.saturating_mul(n);
    let small = entries < PARALLEL_MIN_ENTRIES || entries.saturating_mul(k) < PARALLEL_MIN_MULS;
    match rayon::current_num_threads() {
        0 | 1 => faer::Par::Seq,
        _ if small || SEQUENTIAL.get() => faer::Par::Seq,
        threads => faer::Par::rayon(threads),
    }
}

thread_local! {
    /// Set inside [`sequential`] on this thread.
    static SEQUENTIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every product of this module that `f` calls on this thread computed on this
/// thread alone: for callers that already split their work among rayon tasks (a task's products
/// would otherwise split again among the same threads). The results are the same bits either
/// way (the module docs, "Threads"); restored on return and on unwind.
///
/// ```
/// use kappa_linalg::product::{mat_mul, sequential};
/// let a = ndarray::Array2::<f64>::eye(3);
/// assert_eq!(sequential(|| mat_mul(&a, &a)), a);
/// ```
pub fn sequential<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SEQUENTIAL.set(self.0);
        }
    }
    let _restore = Restore(SEQUENTIAL.replace(true));
    f()
}

/// Whether this thread is inside [`sequential`].
pub fn is_sequential() -> bool {
    SEQUENTIAL.get()
}

/// # Safety
/// The returned view must not outlive `a`'s data (it borrows it only by lifetime inference).
unsafe fn faer_ref<'a, A: crate::Real>(a: &ArrayView2<'a, A>) -> faer::MatRef<'a, A> {
    let [rs, cs] = [a.strides()[0], a.strides()[1]];
    // SAFETY: the caller's contract; ndarray's view is valid at (i·rs + j·cs) for every
    // in-range (i, j), which is what faer reads.
    unsafe { faer::MatRef::from_raw_parts(a.as_ptr(), a.nrows(), a.ncols(), rs, cs) }
}

/// # Safety
/// As [`faer_ref`], and no other view of `c`'s data may be used while the result lives.
unsafe fn faer_mut<'a, A: crate::Real>(c: &'a mut ArrayViewMut2<'_, A>) -> faer::MatMut<'a, A> {
    let [rs, cs] = [c.strides()[0], c.strides()[1]];
    let (m, n) = c.dim();
    // SAFETY: as in `faer_ref`, with `c` borrowed mutably for the returned lifetime.
    unsafe { faer::MatMut::from_raw_parts_mut(c.as_mut_ptr(), m, n, rs, cs) }
}
