//! Exact Jacobians of single-head attention (Theorem 3.3), dense and matrix-free, with respect to
//! the weights and to the input.
//!
//! # Convention
//!
//! **Column-major vec** throughout: vec(M)[i + j·m] = M[i, j] for M ∈ ℝ^{m×n}, so
//! vec(A M B) = (Bᵀ ⊗ A) vec(M). A Jacobian ∂vec(A)/∂vec(W) has row i + c·N for output entry
//! A[i, c] and column d + e·D for W[d, e]. The full weight Jacobian is
//! J = [J_Q J_K J_V] ∈ ℝ^{Nk × 3Dk}, columns ordered [vec W_Q; vec W_K; vec W_V]. A row-major
//! convention permutes rows and columns only, so singular values and every κ are unchanged (T3).
//!
//! # Math (Theorem 3.3, with score scale s; see [`crate::attention`](mod@crate::attention))
//!
//! With Q = X W_Q, K = X W_K, V = X W_V, S = Q Kᵀ/s, P = softmax_row(S), Λ the softmax derivative
//! ([`crate::softmax`]) and K_{D,k} the commutation matrix (K_{D,k} vec M = vec Mᵀ):
//!
//! ```text
//! J_Q = ∂vec A/∂vec W_Q = (Vᵀ ⊗ I_N) · Λ · (X W_K ⊗ X) / s                 Nk × Dk
//! J_K = ∂vec A/∂vec W_K = (Vᵀ ⊗ I_N) · Λ · (X ⊗ X W_Q) · K_{D,k} / s       Nk × Dk
//! J_V = ∂vec A/∂vec W_V = I_k ⊗ (P X)                                       Nk × Dk
//! ```
//!
//! Derivation: dS = X dW_Q Kᵀ/s ⇒ vec dS = (K ⊗ X) vec dW_Q / s; dS = Q dW_Kᵀ Xᵀ/s ⇒
//! vec dS = (X ⊗ Q) K_{D,k} vec dW_K / s; vec dP = Λ vec dS; dA = dP V ⇒
//! vec dA = (Vᵀ ⊗ I_N) vec dP; and dA = P X dW_V.
//!
//! [`Forward::jacobian_weights_kronecker`] builds exactly these products (small sizes only).
//! [`Forward::jacobian_weights`] builds the same matrices entrywise without any N²×N² factor:
//! with J_i = diag(p_i) − p_i p_iᵀ and Vᵀ p_i = A[i, :],
//!
//! ```text
//! J_Q[i + cN, d + eD] = X[i, d] · G_i[c, e],   G_i = Vᵀ J_i K / s
//! J_K[i + cN, d + eD] = Q[i, e] · H_i[c, d],   H_i = Vᵀ J_i X / s
//! J_V[i + cN, d + eD] = δ_ce · (P X)[i, d]
//! ```
//!
//! where G_i\[c, e\] = (Σ_j P\[i,j\] V\[j,c\] K\[j,e\] − A\[i,c\] (PK)\[i,e\]) / s is computed for all
//! (i, c, e) at once by one product P·VK with VK\[j, c·k + e\] = V\[j,c\] K\[j,e\] (and H by P·VX):
//! O(N²k(k + D)) flops, after which each of the N·k·3D·k entries of J is one multiplication.
//! Writing those entries is the cost at model sizes, so they are written in parallel, into
//! reusable blocks ([`JacobianWorkspace`]); see "The dense weight Jacobian" below.
//!
//! The input Jacobian J_X = ∂vec A/∂vec X ∈ ℝ^{Nk × ND} (column m + d·N for X[m, d]) is
//!
//! ```text
//! J_X[i + cN, m + dN] = P[i, m] W_V[d, c] + δ_im (G_i W_Qᵀ)[c, d] + P[i, m] (V[m, c] − A[i, c]) (Q W_Kᵀ)[i, d] / s.
//! ```
//!
//! # Matrix-free products
//!
//! JVP (weights): dS = (X dW_Q Kᵀ + Q (X dW_K)ᵀ)/s, dP = P ⊙ (dS − rowsum(P ⊙ dS)),
//! dA = dP V + P X dW_V. VJP (weights), for G = ∂L/∂A: gP = G Vᵀ,
//! gS = P ⊙ (gP − rowsum(P ⊙ gP)), ∂L/∂W_Q = Xᵀ gS K / s, ∂L/∂W_K = Xᵀ gSᵀ Q / s,
//! ∂L/∂W_V = Xᵀ Pᵀ G. For the input the same chain ends in
//! ∂L/∂X = (gS K/s) W_Qᵀ + (gSᵀ Q/s) W_Kᵀ + Pᵀ G W_Vᵀ. Each costs a few N×N×(k or D) products.
//!
//! # The dense weight Jacobian: cost and threads
//!
//! The 3·N·k·D·k entries (3.7 GB of f64 at N = 197, D = 192, k = 64) are written by 3k
//! independent jobs, one per block and output column c, on rayon threads; each entry is the same
//! single product whichever thread writes it, so the result is bit-identical for every thread
//! count. A fresh result's pages are first touched by the threads that write them, and J_V's
//! off-diagonal blocks, zero in a fresh allocation, are never touched. [`JacobianWorkspace`]
//! keeps its blocks between calls (and knows their J_V zeros are intact), so repeated
//! evaluations pay neither the page faults nor the zeros.

use std::sync::Arc;

use kappa_linalg::input::{check_length, check_shape, shape_str, InputError};
use kappa_linalg::product::{mat_mul, mat_mul_into, sequential, PARALLEL_MIN_MULS};
use kappa_linalg::threads::Pinning;
use kappa_linalg::{commutation_matrix, kron, unvec, Real};
use ndarray::{concatenate, s, Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut2, Axis, Zip};
use rayon::prelude::*;

use crate::attention::Forward;
use crate::error::{check_computed, check_dense, Result};
use crate::scale::linear;
use crate::softmax::{softmax_jacobian_dense, softmax_jvp_unchecked};

/// The three blocks of the weight Jacobian J = [J_Q J_K J_V], each Nk × Dk, column-major vec
/// (row i + c·N ↔ A[i, c], column d + e·D ↔ W[d, e]).
#[derive(Debug, Clone, PartialEq)]
pub struct WeightJacobian<A> {
    /// J_Q = ∂vec A/∂vec W_Q.
    pub q: Array2<A>,
    /// J_K = ∂vec A/∂vec W_K.
    pub k: Array2<A>,
    /// J_V = ∂vec A/∂vec W_V.
    pub v: Array2<A>,
}

impl<A: Real> WeightJacobian<A> {
    /// The full J = [J_Q J_K J_V] ∈ ℝ^{Nk × 3Dk}.
    ///
    /// Errors: [`crate::AttentionError::TooLarge`] (argument `self`) beyond
    /// [`kappa_linalg::MAX_DENSE_ENTRIES`]; [`InputError::ShapeMismatch`] (argument
    /// `self.k` or `self.v`) for hand-built blocks whose shapes differ from `self.q`'s.
    pub fn full(&self) -> Result<Array2<A>> {
        let (rows, cols) = self.q.dim();
        for (arg, b) in [("self.k", &self.k), ("self.v", &self.v)] {
            if b.dim() != (rows, cols) {
                return Err(InputError::shape_mismatch(
                    arg,
                    format!("{} (the shape of self.q)", shape_str(rows, cols)),
                    shape_str(b.nrows(), b.ncols()),
                )
                .into());
            }
        }
        check_dense("self", rows, cols.saturating_mul(3))?;
        concatenate(Axis(1), &[self.q.view(), self.k.view(), self.v.view()])
            .map_err(|e| InputError::invalid("self", e.to_string()).into())
    }

    /// The blocks in order Q, K, V.
    pub fn blocks(&self) -> [ArrayView2<'_, A>; 3] {
        [self.q.view(), self.k.view(), self.v.view()]
    }
}

/// A triple of D×k matrices, one per projection: a tangent (dW_Q, dW_K, dW_V) for a JVP, or the
/// gradients (∂L/∂W_Q, ∂L/∂W_K, ∂L/∂W_V) a VJP returns.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightSet<A> {
    /// For W_Q.
    pub q: Array2<A>,
    /// For W_K.
    pub k: Array2<A>,
    /// For W_V.
    pub v: Array2<A>,
}

impl<A: Real> WeightSet<A> {
    /// [vec q; vec k; vec v] (column-major), length 3Dk.
    pub fn to_vec(&self) -> Array1<A> {
        let mut out = Vec::with_capacity(3 * self.q.len());
        for m in [&self.q, &self.k, &self.v] {
            out.extend(m.t().iter().copied());
        }
        Array1::from(out)
    }
}

fn colmajor<A: Real>(m: &Array2<A>) -> Array1<A> {
    m.t().iter().copied().collect()
}

impl<A: Real> Forward<A> {
    /// The softmax VJP/JVP in one: P ⊙ (M − rowsum(P ⊙ M)).
    fn softmax_apply(&self, m: &Array2<A>) -> Array2<A> {
        softmax_jvp_unchecked(self.p.view(), m.view())
    }

    /// G_c (N×k) and H_c (N×D) for one output column c: G_c[i, :] = row c of G_i, etc.
    fn gh(&self, c: usize, pk: &Array2<A>, px: &Array2<A>) -> (Array2<A>, Array2<A>) {
        let vc = self.v.column(c);
        // P diag(V[:, c])
        let pv = &self.p * &vc.insert_axis(Axis(0));
        let mut g = mat_mul(&pv, &self.k);
        let mut h = mat_mul(&pv, &self.x);
        let ac = self.output.column(c);
        let inv_s = A::one() / self.s;
        Zip::from(g.rows_mut())
            .and(pk.rows())
            .and(&ac)
            .for_each(|mut gr, pkr, &a| {
                Zip::from(&mut gr)
                    .and(&pkr)
                    .for_each(|x, &y| *x = (*x - a * y) * inv_s)
            });
        Zip::from(h.rows_mut())
            .and(px.rows())
            .and(&ac)
            .for_each(|mut hr, pxr, &a| {
                Zip::from(&mut hr)
                    .and(&pxr)
                    .for_each(|x, &y| *x = (*x - a * y) * inv_s)
            });
        (g, h)
    }

    /// The dense weight Jacobian J = [J_Q J_K J_V] (Theorem 3.3), built entrywise from the
    /// closed forms in the module docs, column-major vec (row i + c·N ↔ A[i, c], column
    /// d + e·D ↔ W[d, e]), in freshly allocated blocks.
    ///
    /// This allocates 3·N·k·D·k entries each call (3.7 GB of f64 at N = 197, D = 192, k = 64),
    /// and at such sizes touching fresh pages costs more than computing the entries. To
    /// evaluate repeatedly, keep a [`JacobianWorkspace`] and call
    /// [`JacobianWorkspace::compute`]: it reuses the blocks and its scratch. The blocks are
    /// filled in parallel on rayon's current pool (all its threads; `rayon::ThreadPool::install`
    /// or `RAYON_NUM_THREADS` choose how many; [`JacobianWorkspace::with_threads`] sets a count
    /// explicitly), and every entry is the same product whatever the thread count, so the result
    /// is bit-identical across thread counts.
    ///
    /// Cost: O(N²k(k + D)) flops in two matrix products, plus 2·N·k·D·k written entries and
    /// N·k·D more for J_V's diagonal blocks (its other blocks are zero, and a fresh zeroed
    /// block never touches them). Errors: a block above [`kappa_linalg::MAX_DENSE_ENTRIES`]
    /// entries ([`crate::AttentionError::TooLarge`], argument `jacobian`);
    /// [`crate::AttentionError::Overflow`] (argument `self`) when an entry of J overflows
    /// (possible for a forward pass whose X, Q, K, V are all near the range's square root; see
    /// `docs/attention.md`, "Scale behaviour").
    ///
    /// ```
    /// use kappa_attention::{AttentionOptions, SelfAttention};
    /// use ndarray::Array2;
    /// let x = Array2::from_shape_fn((3, 4), |(i, j)| ((i + 2 * j) as f64).sin());
    /// let w = Array2::from_shape_fn((4, 2), |(i, j)| ((3 * i + j) as f64).cos());
    /// let head = SelfAttention::new(w.clone(), w.clone(), w, AttentionOptions::default())?;
    /// let fwd = head.forward(x.view())?;
    /// let j = fwd.jacobian_weights()?;
    /// assert_eq!(j.full()?.dim(), (3 * 2, 3 * 4 * 2));
    /// # Ok::<(), kappa_attention::AttentionError>(())
    /// ```
    pub fn jacobian_weights(&self) -> Result<WeightJacobian<A>> {
        let mut ws = JacobianWorkspace::new();
        ws.compute(self)?;
        ws.take().ok_or_else(|| {
            InputError::invalid("self", "the workspace returned no Jacobian (a kappa bug)").into()
        })
    }

    /// [`Forward::jacobian_weights`] into existing blocks (each Nk × Dk, any layout): every
    /// entry of `out` is overwritten, J_V's zero blocks included, on rayon's current pool. The
    /// values are bit-identical to [`Forward::jacobian_weights`]'s.
    ///
    /// Prefer [`JacobianWorkspace`], which owns its blocks and so knows that J_V's off-diagonal
    /// blocks are still zero (it writes 2/3 + 1/(3k) of the entries this writes) and also keeps
    /// the O(N·k·(k + D)) scratch.
    ///
    /// Errors: a block of `out` not Nk × Dk (argument `out`); an entry of J overflows
    /// ([`crate::AttentionError::Overflow`], argument `self`). Both are detected before any entry
    /// is written, so `out` is unchanged on error.
    pub fn jacobian_weights_into(&self, out: &mut WeightJacobian<A>) -> Result<()> {
        let [q, k, v] = [&mut out.q, &mut out.k, &mut out.v].map(|b| b.view_mut());
        self.jacobian_weights_into_views([q, k, v])
    }

    /// [`Forward::jacobian_weights_into`] into views (J_Q, J_K, J_V), each Nk × Dk with any
    /// strides: for blocks in memory the caller owns (a torch tensor's, a memory map's), written
    /// in one pass with no allocation of Nk × Dk size.
    ///
    /// Errors: as [`Forward::jacobian_weights_into`]; `out` is unchanged on error.
    pub fn jacobian_weights_into_views(&self, out: [ArrayViewMut2<'_, A>; 3]) -> Result<()> {
        let (n, d, k) = self.dims();
        let (nk, dk) = (n * k, d * k);
        for b in &out {
            if b.dim() != (nk, dk) {
                return Err(InputError::shape_mismatch(
                    "out",
                    format!("three {nk}×{dk} blocks (N·k × D·k)"),
                    shape_str(b.nrows(), b.ncols()),
                )
                .into());
            }
        }
        let mut scratch = Factors::default();
        scratch.compute(self)?;
        fill(self, &scratch, out, false, &Threads::Current);
        Ok(())
    }

    /// The weight Jacobian built literally as Theorem 3.3's Kronecker products (the module docs),
    /// with the dense N²×N² Λ and the dense commutation matrix K_{D,k}. A reference for tests and
    /// for reading the theorem; use [`Forward::jacobian_weights`] otherwise.
    ///
    /// Cost: O(N⁴·(k + Dk)) flops and N⁴ memory. Errors: [`crate::AttentionError::TooLarge`]
    /// (through [`crate::AttentionError::Linalg`]) when a factor exceeds
    /// [`kappa_linalg::MAX_DENSE_ENTRIES`] (N > 128).
    pub fn jacobian_weights_kronecker(&self) -> Result<WeightJacobian<A>> {
        let (n, d, k) = self.dims();
        let inv_s = A::one() / self.s;
        // Λ first: it refuses N > 128 before any N-sized allocation.
        let lambda = softmax_jacobian_dense(self.p.view())?;
        let eye_n = Array2::<A>::eye(n);
        let eye_k = Array2::<A>::eye(k);
        let left = kron(self.v.t(), eye_n.view())?.dot(&lambda); // (Vᵀ ⊗ I_N) Λ
        let jq = left
            .dot(&kron(self.k.view(), self.x.view())?)
            .mapv(|e| e * inv_s);
        let kdk = commutation_matrix::<A>(d, k)?;
        let jk = left
            .dot(&kron(self.x.view(), self.q.view())?.dot(&kdk))
            .mapv(|e| e * inv_s);
        let jv = kron(eye_k.view(), self.p.dot(&self.x).view())?;
        for b in [&jq, &jk, &jv] {
            check_computed("self", &b.view(), "the weight Jacobian")?;
        }
        Ok(WeightJacobian {
            q: jq,
            k: jk,
            v: jv,
        })
    }

    /// The dense input Jacobian J_X = ∂vec A/∂vec X ∈ ℝ^{Nk × ND}, column-major vec (row i + c·N
    /// ↔ A[i, c], column m + d·N ↔ X[m, d]); formula in the module docs. (The paper's theorems
    /// bound the *weight* Jacobian; this one is a different quantity.)
    ///
    /// Cost: O(N²k(k + D) + N·k·N·D). Errors: [`crate::AttentionError::TooLarge`];
    /// [`crate::AttentionError::Overflow`] (argument `self`) when an entry overflows.
    pub fn jacobian_input(&self) -> Result<Array2<A>> {
        let (n, d, k) = self.dims();
        check_dense("jacobian", n * k, n * d)?;
        let inv_s = A::one() / self.s;
        let pk = mat_mul(&self.p, &self.k);
        let px = mat_mul(&self.p, &self.x);
        let qt = mat_mul(&self.q, &self.wk.t()); // Q W_Kᵀ, N×D
        let mut jx = Array2::<A>::zeros((n * k, n * d));
        for c in 0..k {
            let (g, _) = self.gh(c, &pk, &px);
            let gw = mat_mul(&g, &self.wq.t()); // row i: (G_i W_Qᵀ)[c, :]
            for i in 0..n {
                let r = i + c * n;
                let aic = self.output[[i, c]];
                let pi = self.p.row(i);
                let mut row = jx.row_mut(r);
                for dd in 0..d {
                    let wv = self.wv[[dd, c]];
                    let qtd = qt[[i, dd]] * inv_s;
                    let mut block = row.slice_mut(s![dd * n..(dd + 1) * n]);
                    Zip::from(&mut block)
                        .and(&pi)
                        .and(self.v.column(c))
                        .for_each(|o, &pim, &vmc| *o = pim * wv + pim * (vmc - aic) * qtd);
                    block[i] += gw[[i, dd]];
                }
            }
        }
        check_computed("self", &jx.view(), "the input Jacobian")?;
        Ok(jx)
    }

    /// Jacobian–vector product with respect to the weights: dA (N×k) for the tangent
    /// (dW_Q, dW_K, dW_V) (each D×k). Equals unvec(J · [vec dW_Q; vec dW_K; vec dW_V]).
    ///
    /// Linear in the tangent, so evaluated at the tangent scaled by a power of two (see
    /// `docs/attention.md`, "Scale behaviour"): tangents of any finite scale work.
    ///
    /// Errors: a tangent empty, non-finite or not D×k (argument `dwq`, `dwk` or `dwv`);
    /// [`crate::AttentionError::Overflow`]: argument `self` when the forward pass's own scale
    /// makes J·t overflow for a unit tangent, `dwq` when only the tangent's scale does.
    pub fn jvp_weights(
        &self,
        dwq: ArrayView2<'_, A>,
        dwk: ArrayView2<'_, A>,
        dwv: ArrayView2<'_, A>,
    ) -> Result<Array2<A>> {
        let (_, d, k) = self.dims();
        check_shape("dwq", &dwq, d, k, "D×k like the weights")?;
        check_shape("dwk", &dwk, d, k, "D×k like the weights")?;
        check_shape("dwv", &dwv, d, k, "D×k like the weights")?;
        let views = [dwq.reborrow(), dwk.reborrow(), dwv.reborrow()];
        let [da] = linear(views, ("self", "dwq"), "J·t", |[q, k, v]| {
            [self.jvp_weights_unchecked(q, k, v)]
        })?;
        Ok(da)
    }

    fn jvp_weights_unchecked(
        &self,
        dwq: ArrayView2<'_, A>,
        dwk: ArrayView2<'_, A>,
        dwv: ArrayView2<'_, A>,
    ) -> Array2<A> {
        let inv_s = A::one() / self.s;
        let mut ds = mat_mul(&mat_mul(&self.x, &dwq), &self.k.t());
        ds += &mat_mul(&self.q, &mat_mul(&self.x, &dwk).t());
        ds.mapv_inplace(|e| e * inv_s);
        let dp = self.softmax_apply(&ds);
        let mut da = mat_mul(&dp, &self.v);
        da += &mat_mul(&self.p, &mat_mul(&self.x, &dwv));
        da
    }

    /// Vector–Jacobian product with respect to the weights: for G = ∂L/∂A (N×k), the gradients
    /// (∂L/∂W_Q, ∂L/∂W_K, ∂L/∂W_V), i.e. unvec of Jᵀ vec(G).
    ///
    /// Linear in `g`, so evaluated at `g` scaled by a power of two (as [`Forward::jvp_weights`]).
    ///
    /// Errors: `g` empty, non-finite or not N×k; [`crate::AttentionError::Overflow`] (argument
    /// `self` or `g`, as [`Forward::jvp_weights`]).
    pub fn vjp_weights(&self, g: ArrayView2<'_, A>) -> Result<WeightSet<A>> {
        let (n, _, k) = self.dims();
        check_shape("g", &g, n, k, "N×k like the output")?;
        let [q, k, v] = linear([g], ("self", "g"), "Jᵀ·g", |[g]| {
            self.vjp_weights_unchecked(g)
        })?;
        Ok(WeightSet { q, k, v })
    }

    /// The weight VJP as five matrix products and one O(N²) pass, with no N²k temporary:
    ///
    /// ```text
    /// gS = G Vᵀ                                   N×N   (2N²k flops)
    /// gS ← P ⊙ (gS − rowsum(P ⊙ gS))              in place: the softmax backward, O(N²)
    /// Y  = [gS K/s | gSᵀ Q/s | Pᵀ G]              N×3k  (three N×N×k products, 6N²k)
    /// [∂L/∂W_Q ∂L/∂W_K ∂L/∂W_V] = Xᵀ Y            D×3k  (one product, 6NDk)
    /// ```
    ///
    /// The columns of Y are the cotangents of Q, K and V (∂L/∂Q = gS K/s, ∂L/∂K = gSᵀ Q/s,
    /// ∂L/∂V = Pᵀ G), and W_• enters only through X W_•, so ∂L/∂W_• = Xᵀ ∂L/∂•: one product
    /// for all three.
    ///
    /// **Threads.** Rows i of gS, of the softmax backward, of Y_Q and of Y_V need only rows i of
    /// G and of gS and columns i of P, and rows i of Y_K only columns i of gS: from
    /// [`PARALLEL_MIN_MULS`] multiply–adds per N×N×k product up, on a pool of two or more
    /// threads, the rows are done in two halves on two rayon tasks (gS, its softmax backward,
    /// Y_Q and Y_V; then, once gS is whole, Y_K), and Xᵀ Y in two halves of its columns. Each
    /// entry is the same sum in the same order either way (the product module splits results,
    /// not sums; tested for the VJP).
    fn vjp_weights_unchecked(&self, g: ArrayView2<'_, A>) -> [Array2<A>; 3] {
        let (n, d, k) = self.dims();
        let big = n.saturating_mul(n).saturating_mul(k) >= PARALLEL_MIN_MULS;
        let w = if big && rayon::current_num_threads() > 1 {
            // One entry into the pool for the whole VJP: from a thread outside it, each entry
            // is a hand-off of ≈ 10–20 µs (measured), the joins inside a worker are not.
            rayon::scope(|_| self.vjp_weights_split(g))
        } else {
            let mut gs = Array2::<A>::zeros((n, n));
            let mut y = Array2::<A>::zeros((n, 3 * k));
            self.vjp_rows_first(g, 0..n, gs.view_mut(), y.view_mut());
            self.vjp_rows_of_yk(gs.view(), 0..n, y.view_mut());
            mat_mul(&self.x.t(), &y)
        };
        let block = |b: usize| w.slice(s![.., b * k..(b + 1) * k]).to_owned();
        debug_assert_eq!(w.dim(), (d, 3 * k));
        [block(0), block(1), block(2)]
    }

    /// Xᵀ Y of [`Forward::vjp_weights_unchecked`] with the rows of gS and Y, then the columns
    /// of Xᵀ Y, in two halves on two rayon tasks (each task's products on its own thread).
    fn vjp_weights_split(&self, g: ArrayView2<'_, A>) -> Array2<A> {
        let (n, _, k) = self.dims();
        let half = n / 2;
        let mut gs = Array2::<A>::zeros((n, n));
        let mut y = Array2::<A>::zeros((n, 3 * k));
        let (gs_top, gs_bottom) = gs.view_mut().split_at(Axis(0), half);
        let (y_top, y_bottom) = y.view_mut().split_at(Axis(0), half);
        rayon::join(
            || sequential(|| self.vjp_rows_first(g, 0..half, gs_top, y_top)),
            || sequential(|| self.vjp_rows_first(g, half..n, gs_bottom, y_bottom)),
        );
        let (y_top, y_bottom) = y.view_mut().split_at(Axis(0), half);
        rayon::join(
            || sequential(|| self.vjp_rows_of_yk(gs.view(), 0..half, y_top)),
            || sequential(|| self.vjp_rows_of_yk(gs.view(), half..n, y_bottom)),
        );
        // W = Xᵀ Y by halves of its columns, one per task (faer's own split of this 192×192
        // result scaled 1.4× on two threads when measured).
        let mut w = Array2::<A>::zeros((self.x.ncols(), 3 * k));
        let cols = 3 * k / 2;
        let (mut w_left, mut w_right) = w.view_mut().split_at(Axis(1), cols);
        let xt = self.x.t();
        let (y_left, y_right) = (y.slice(s![.., ..cols]), y.slice(s![.., cols..]));
        rayon::join(
            || sequential(|| mat_mul_into(A::one(), &xt, &y_left, A::zero(), &mut w_left)),
            || sequential(|| mat_mul_into(A::one(), &xt, &y_right, A::zero(), &mut w_right)),
        );
        w
    }

    /// Rows `rows` of gS = G Vᵀ (then its softmax backward), of Y_Q = gS K/s and of Y_V = Pᵀ G,
    /// into `gs` (those rows of gS) and `y` (those rows of Y).
    fn vjp_rows_first(
        &self,
        g: ArrayView2<'_, A>,
        rows: std::ops::Range<usize>,
        mut gs: ArrayViewMut2<'_, A>,
        mut y: ArrayViewMut2<'_, A>,
    ) {
        let k = self.dims().2;
        let (one, zero) = (A::one(), A::zero());
        let g_rows = g.slice(s![rows.clone(), ..]);
        mat_mul_into(one, &g_rows, &self.v.t(), zero, &mut gs);
        softmax_backward_in_place(self.p.slice(s![rows.clone(), ..]), gs.view_mut());
        let mut y_q = y.slice_mut(s![.., 0..k]);
        mat_mul_into(one / self.s, &gs, &self.k, zero, &mut y_q);
        let mut y_v = y.slice_mut(s![.., 2 * k..3 * k]);
        mat_mul_into(one, &self.p.slice(s![.., rows]).t(), &g, zero, &mut y_v);
    }

    /// Rows `rows` of Y_K = gSᵀ Q/s (columns `rows` of the whole gS) into `y` (those rows of Y).
    fn vjp_rows_of_yk(
        &self,
        gs: ArrayView2<'_, A>,
        rows: std::ops::Range<usize>,
        mut y: ArrayViewMut2<'_, A>,
    ) {
        let k = self.dims().2;
        let mut y_k = y.slice_mut(s![.., k..2 * k]);
        let gs_cols = gs.slice(s![.., rows]);
        mat_mul_into(
            A::one() / self.s,
            &gs_cols.t(),
            &self.q,
            A::zero(),
            &mut y_k,
        );
    }

    /// gS = P ⊙ (gP − rowsum(P ⊙ gP)), gP = G Vᵀ.
    fn score_cotangent(&self, g: ArrayView2<'_, A>) -> Array2<A> {
        let gp = mat_mul(&g, &self.v.t());
        self.softmax_apply(&gp)
    }

    /// Jacobian–vector product with respect to the input: dA (N×k) for dX (N×D); equals
    /// unvec(J_X vec dX).
    ///
    /// Linear in `dx`, so evaluated at `dx` scaled by a power of two (as
    /// [`Forward::jvp_weights`]).
    ///
    /// Errors: `dx` empty, non-finite or not N×D; [`crate::AttentionError::Overflow`] (argument
    /// `self` or `dx`, as [`Forward::jvp_weights`]).
    pub fn jvp_input(&self, dx: ArrayView2<'_, A>) -> Result<Array2<A>> {
        let (n, d, _) = self.dims();
        check_shape("dx", &dx, n, d, "N×D like the tokens")?;
        let [da] = linear([dx], ("self", "dx"), "J_X·dx", |[dx]| {
            [self.jvp_input_unchecked(dx)]
        })?;
        Ok(da)
    }

    fn jvp_input_unchecked(&self, dx: ArrayView2<'_, A>) -> Array2<A> {
        let inv_s = A::one() / self.s;
        let dq = mat_mul(&dx, &self.wq);
        let dk = mat_mul(&dx, &self.wk);
        let dv = mat_mul(&dx, &self.wv);
        let mut ds = mat_mul(&dq, &self.k.t());
        ds += &mat_mul(&self.q, &dk.t());
        ds.mapv_inplace(|e| e * inv_s);
        let dp = self.softmax_apply(&ds);
        let mut da = mat_mul(&dp, &self.v);
        da += &mat_mul(&self.p, &dv);
        da
    }

    /// Vector–Jacobian product with respect to the input: ∂L/∂X (N×D) for G = ∂L/∂A (N×k).
    ///
    /// Linear in `g`, so evaluated at `g` scaled by a power of two (as
    /// [`Forward::jvp_weights`]).
    ///
    /// Errors: `g` empty, non-finite or not N×k; [`crate::AttentionError::Overflow`] (argument
    /// `self` or `g`, as [`Forward::jvp_weights`]).
    pub fn vjp_input(&self, g: ArrayView2<'_, A>) -> Result<Array2<A>> {
        let (n, _, k) = self.dims();
        check_shape("g", &g, n, k, "N×k like the output")?;
        let [gx] = linear([g], ("self", "g"), "J_Xᵀ·g", |[g]| {
            [self.vjp_input_unchecked(g)]
        })?;
        Ok(gx)
    }

    fn vjp_input_unchecked(&self, g: ArrayView2<'_, A>) -> Array2<A> {
        let gs = self.score_cotangent(g);
        let inv_s = A::one() / self.s;
        let gq = mat_mul(&gs, &self.k).mapv(|e| e * inv_s);
        let gk = mat_mul(&gs.t(), &self.q).mapv(|e| e * inv_s);
        let gv = mat_mul(&self.p.t(), &g);
        let mut gx = mat_mul(&gq, &self.wq.t());
        gx += &mat_mul(&gk, &self.wk.t());
        gx += &mat_mul(&gv, &self.wv.t());
        gx
    }

    /// J · t for t = [vec dW_Q; vec dW_K; vec dW_V] (column-major, length 3Dk): vec dA (length
    /// Nk), without forming J.
    ///
    /// Errors: `t` empty, non-finite or not of length 3Dk.
    pub fn jvp_weights_vec(&self, t: ArrayView1<'_, A>) -> Result<Array1<A>> {
        let (_, d, k) = self.dims();
        check_length("t", &t, 3 * d * k, "3·D·k: [vec dW_Q; vec dW_K; vec dW_V]")?;
        let dk = d * k;
        let dq = unvec(t.slice(s![..dk]), d, k)?;
        let dkk = unvec(t.slice(s![dk..2 * dk]), d, k)?;
        let dv = unvec(t.slice(s![2 * dk..]), d, k)?;
        Ok(colmajor(&self.jvp_weights(
            dq.view(),
            dkk.view(),
            dv.view(),
        )?))
    }

    /// Jᵀ · u for u = vec(G) (length Nk): [vec ∂L/∂W_Q; vec ∂L/∂W_K; vec ∂L/∂W_V] (length 3Dk),
    /// without forming J.
    ///
    /// Errors: `u` empty, non-finite or not of length Nk.
    pub fn vjp_weights_vec(&self, u: ArrayView1<'_, A>) -> Result<Array1<A>> {
        let (n, _, k) = self.dims();
        check_length("u", &u, n * k, "N·k: vec of an N×k output cotangent")?;
        let g = unvec(u, n, k)?;
        Ok(self.vjp_weights(g.view())?.to_vec())
    }

    /// J_X · vec(dX) (length ND) → vec dA (length Nk), without forming J_X.
    ///
    /// Errors: `t` empty, non-finite or not of length ND.
    pub fn jvp_input_vec(&self, t: ArrayView1<'_, A>) -> Result<Array1<A>> {
        let (n, d, _) = self.dims();
        check_length("t", &t, n * d, "N·D: vec of an N×D token tangent")?;
        let dx = unvec(t, n, d)?;
        Ok(colmajor(&self.jvp_input(dx.view())?))
    }

    /// J_Xᵀ · vec(G) (length Nk) → vec ∂L/∂X (length ND), without forming J_X.
    ///
    /// Errors: `u` empty, non-finite or not of length Nk.
    pub fn vjp_input_vec(&self, u: ArrayView1<'_, A>) -> Result<Array1<A>> {
        let (n, _, k) = self.dims();
        check_length("u", &u, n * k, "N·k: vec of an N×k output cotangent")?;
        let g = unvec(u, n, k)?;
        Ok(colmajor(&self.vjp_input(g.view())?))
    }
}

// ---------------------------------------------------------------------------------------------
// The dense weight Jacobian: its factors, the parallel fill, and the workspace
// ---------------------------------------------------------------------------------------------

/// Below this many entries of J the fill runs on the calling thread: splitting it costs more
/// than it saves. (The entries are the same products either way.)
const PARALLEL_MIN_ENTRIES: usize = 1 << 16;

/// The factors every entry of J is a single product of (module docs):
///
/// ```text
/// J_Q[i + cN, d + eD] = X[i, d] · g[i, c·k + e],   g[i, c·k + e] = G_i[c, e]
/// J_K[i + cN, d + eD] = Q[i, e] · h[i, c·D + d],   h[i, c·D + d] = H_i[c, d]
/// J_V[i + cN, d + cD] = (P X)[i, d]
/// ```
///
/// with G_i[c, e] = (Σ_j P[i,j] V[j,c] K[j,e] − A[i,c] (PK)[i,e]) / s: the sum is row i of
/// P·VK for the N × k² matrix VK[j, c·k + e] = V[j,c] K[j,e], one matrix product for all
/// (i, c, e) (2N²k² flops); likewise H_i[c, d] = (Σ_j P[i,j] V[j,c] X[j,d] − A[i,c] (PX)[i,d])/s
/// from P·VX, VX[j, c·D + d] = V[j,c] X[j,d] (2N²kD flops).
#[derive(Debug, Clone, Default)]
struct Factors<A> {
    /// N × k²: V[j, c] K[j, e] at column c·k + e.
    vk: Array2<A>,
    /// N × kD: V[j, c] X[j, d] at column c·D + d.
    vx: Array2<A>,
    /// N × k²: G_i[c, e] at (i, c·k + e).
    g: Array2<A>,
    /// N × kD: H_i[c, d] at (i, c·D + d).
    h: Array2<A>,
    /// P K, N × k.
    pk: Array2<A>,
    /// P X, N × D (also J_V's diagonal blocks).
    px: Array2<A>,
}

/// `a` as a `rows × cols` array, reusing its memory when the shape already matches (the
/// contents are then stale; every caller overwrites them).
fn reshape_scratch<A: Real>(a: &mut Array2<A>, rows: usize, cols: usize) {
    if a.dim() != (rows, cols) {
        *a = Array2::zeros((rows, cols));
    }
}

impl<A: Real> Factors<A> {
    /// Computes g, h, P K and P X for `f`, then checks that every entry of J is finite.
    ///
    /// Errors: [`crate::AttentionError::Overflow`] (argument `self`) when an entry of J
    /// overflows; nothing of J has been written then.
    fn compute(&mut self, f: &Forward<A>) -> Result<()> {
        let (n, d, k) = f.dims();
        let (one, zero) = (A::one(), A::zero());
        let inv_s = one / f.s;
        reshape_scratch(&mut self.vk, n, k * k);
        reshape_scratch(&mut self.vx, n, k * d);
        reshape_scratch(&mut self.g, n, k * k);
        reshape_scratch(&mut self.h, n, k * d);
        reshape_scratch(&mut self.pk, n, k);
        reshape_scratch(&mut self.px, n, d);
        // VK[j, c·k + e] = V[j, c] K[j, e] and VX[j, c·D + d] = V[j, c] X[j, d].
        for j in 0..n {
            let (vj, kj, xj) = (f.v.row(j), f.k.row(j), f.x.row(j));
            let mut vkr = self.vk.row_mut(j);
            let mut vxr = self.vx.row_mut(j);
            for (c, &vjc) in vj.iter().enumerate() {
                Zip::from(vkr.slice_mut(s![c * k..(c + 1) * k]))
                    .and(&kj)
                    .for_each(|o, &x| *o = vjc * x);
                Zip::from(vxr.slice_mut(s![c * d..(c + 1) * d]))
                    .and(&xj)
                    .for_each(|o, &x| *o = vjc * x);
            }
        }
        mat_mul_into(one, &f.p, &self.vk, zero, &mut self.g);
        mat_mul_into(one, &f.p, &self.vx, zero, &mut self.h);
        mat_mul_into(one, &f.p, &f.k, zero, &mut self.pk);
        mat_mul_into(one, &f.p, &f.x, zero, &mut self.px);
        // G_i[c, e] = (row i of P·VK − A[i, c] (PK)[i, e]) / s, and H likewise with P X.
        for i in 0..n {
            let (pki, pxi) = (self.pk.row(i), self.px.row(i));
            let mut gi = self.g.row_mut(i);
            let mut hi = self.h.row_mut(i);
            for c in 0..k {
                let a = f.output[[i, c]];
                Zip::from(gi.slice_mut(s![c * k..(c + 1) * k]))
                    .and(&pki)
                    .for_each(|x, &y| *x = (*x - a * y) * inv_s);
                Zip::from(hi.slice_mut(s![c * d..(c + 1) * d]))
                    .and(&pxi)
                    .for_each(|x, &y| *x = (*x - a * y) * inv_s);
            }
        }
        self.check_finite(f)
    }

    /// Every entry of J finite, checked in O(N·k·(k + D)) instead of reading J's 3N·k·D·k
    /// entries: row block (i, c) of J_Q is the outer product of X[i, :] and g[i, c·k..], whose
    /// largest magnitude is max|X[i, :]|·max|g[i, c·k..]|, and rounding is monotone, so
    /// fl(|x|·|y|) ≤ fl(max|x|·max|y|) with equality at the maximizing pair: some entry of the
    /// block overflows exactly when that one product does. Likewise J_K with Q[i, :] and
    /// h[i, c·D..]; J_V's entries are those of P X. A non-finite factor gives ±∞ or NaN
    /// entries (0·∞ = NaN), so the factors themselves must be finite.
    fn check_finite(&self, f: &Forward<A>) -> Result<()> {
        let (n, d, k) = f.dims();
        let overflow = || crate::AttentionError::Overflow {
            arg: "self",
            reason: format!(
                "the weight Jacobian has entries beyond the largest finite {} ({:e}); scale the \
                 input down",
                A::NAME,
                A::max_value().to_f64_lossy()
            ),
        };
        let finite = |a: &Array2<A>| a.iter().all(|x| x.is_finite());
        if !(finite(&self.g) && finite(&self.h) && finite(&self.px)) {
            return Err(overflow());
        }
        let amax = |v: ArrayView1<'_, A>| v.iter().fold(A::zero(), |m, x| m.max(x.fabs()));
        for i in 0..n {
            let (xm, qm) = (amax(f.x.row(i)), amax(f.q.row(i)));
            let (gi, hi) = (self.g.row(i), self.h.row(i));
            for c in 0..k {
                let gm = amax(gi.slice(s![c * k..(c + 1) * k]));
                let hm = amax(hi.slice(s![c * d..(c + 1) * d]));
                if !(xm * gm).is_finite() || !(qm * hm).is_finite() {
                    return Err(overflow());
                }
            }
        }
        Ok(())
    }
}

/// M ← P ⊙ (M − rowsum(P ⊙ M)) row by row: the softmax backward (= forward, Λ is symmetric;
/// [`crate::softmax`]) in place, r_i = Σ_j P[i,j] M[i,j] then M[i,j] ← P[i,j]·(M[i,j] − r_i).
fn softmax_backward_in_place<A: Real>(p: ArrayView2<'_, A>, mut m: ArrayViewMut2<'_, A>) {
    Zip::from(m.rows_mut())
        .and(p.rows())
        .for_each(|mut mr, pr| {
            let r = pr.dot(&mr);
            Zip::from(&mut mr)
                .and(&pr)
                .for_each(|x, &pij| *x = pij * (*x - r));
        });
}

/// Which of the three blocks a row range belongs to.
#[derive(Debug, Clone, Copy)]
enum Block {
    Q,
    K,
    V,
}

/// Rows c·N .. (c + 1)·N of one block: the entries for output column c.
fn fill_rows<A: Real>(
    f: &Forward<A>,
    fac: &Factors<A>,
    block: Block,
    c: usize,
    mut rows: ArrayViewMut2<'_, A>,
    v_zero: bool,
) {
    let (_, d, k) = f.dims();
    for (i, mut row) in rows.rows_mut().into_iter().enumerate() {
        match block {
            Block::Q => {
                let xi = f.x.row(i);
                let gi = fac.g.slice(s![i, c * k..(c + 1) * k]);
                for (e, &gie) in gi.iter().enumerate() {
                    Zip::from(row.slice_mut(s![e * d..(e + 1) * d]))
                        .and(&xi)
                        .for_each(|o, &x| *o = x * gie);
                }
            }
            Block::K => {
                let hi = fac.h.slice(s![i, c * d..(c + 1) * d]);
                for (e, &qie) in f.q.row(i).iter().enumerate() {
                    Zip::from(row.slice_mut(s![e * d..(e + 1) * d]))
                        .and(&hi)
                        .for_each(|o, &h| *o = qie * h);
                }
            }
            Block::V => {
                if !v_zero {
                    row.slice_mut(s![..c * d]).fill(A::zero());
                    row.slice_mut(s![(c + 1) * d..]).fill(A::zero());
                }
                row.slice_mut(s![c * d..(c + 1) * d]).assign(&fac.px.row(i));
            }
        }
    }
}

/// Where the fill runs.
#[derive(Debug, Clone, Default)]
enum Threads {
    /// rayon's current pool (the global one, or the one a caller `install`ed).
    #[default]
    Current,
    /// The calling thread only.
    Serial,
    /// A pool of its own.
    Pool(Arc<rayon::ThreadPool>),
}

impl Threads {
    fn count(&self) -> usize {
        match self {
            Threads::Current => rayon::current_num_threads(),
            Threads::Serial => 1,
            Threads::Pool(p) => p.current_num_threads(),
        }
    }
}

/// Writes every entry of J into `out` (each block Nk × Dk; the caller checked), skipping
/// J_V's off-diagonal blocks when `v_zero` says they already hold zeros.
///
/// The work is split into 3k independent jobs, one per block and output column c (rows
/// c·N .. (c + 1)·N), and each entry is the one product of [`Factors`]' doc whichever thread
/// writes it, so the result is bit-identical for every thread count. A fresh block's pages are
/// first touched here, by the threads that write them.
fn fill<A: Real>(
    f: &Forward<A>,
    fac: &Factors<A>,
    out: [ArrayViewMut2<'_, A>; 3],
    v_zero: bool,
    threads: &Threads,
) {
    let (n, d, k) = f.dims();
    let mut jobs = Vec::with_capacity(3 * k);
    for (block, mut rest) in [Block::Q, Block::K, Block::V].into_iter().zip(out) {
        // The k row blocks of N rows (block c holds output column c).
        for c in 0..k {
            let at = if c + 1 < k { n } else { rest.nrows() };
            let (rows, tail) = rest.split_at(Axis(0), at);
            jobs.push((block, c, rows));
            rest = tail;
        }
    }
    let run = |(block, c, rows): (Block, usize, ArrayViewMut2<'_, A>)| {
        fill_rows(f, fac, block, c, rows, v_zero)
    };
    let serial = 3 * n * k * d * k < PARALLEL_MIN_ENTRIES;
    match threads {
        _ if serial => jobs.into_iter().for_each(run),
        Threads::Serial => jobs.into_iter().for_each(run),
        Threads::Current => jobs.into_par_iter().for_each(run),
        Threads::Pool(pool) => pool.install(|| jobs.into_par_iter().for_each(run)),
    }
}

/// The output blocks and scratch of the dense weight Jacobian, kept between evaluations: the
/// easy way to evaluate J repeatedly.
///
/// [`JacobianWorkspace::compute`] writes J for a forward pass into blocks the workspace owns,
/// allocating them only when the shape changes, and returns them. Because only the workspace
/// writes its blocks, it knows that J_V's off-diagonal blocks (all but N·k·D of its N·k·D·k
/// entries) are still zero and skips them. At N = 197, D = 192, k = 64 (3.7 GB of f64) a fresh
/// allocation's first touch costs more than computing the entries; reuse skips both that and
/// the zeros.
///
/// The fill runs on rayon threads ([`JacobianWorkspace::with_threads`]; by default rayon's
/// current pool) and gives bit-identical results for every thread count.
///
/// ```
/// use kappa_attention::{AttentionOptions, JacobianWorkspace, SelfAttention};
/// use ndarray::Array2;
/// let x = Array2::from_shape_fn((5, 4), |(i, j)| ((i + 2 * j) as f64).sin());
/// let w = |o: usize| Array2::from_shape_fn((4, 3), |(i, j)| ((3 * i + j + o) as f64).cos());
/// let head = SelfAttention::new(w(0), w(1), w(2), AttentionOptions::default())?;
/// let mut ws = JacobianWorkspace::with_threads(2)?;
/// for step in 0..3 {
///     let xs = x.mapv(|v| v * (1.0 + step as f64 / 10.0));
///     let fwd = head.forward(xs.view())?;
///     let j = ws.compute(&fwd)?; // the same memory every step
///     assert_eq!(j.q.dim(), (5 * 3, 4 * 3));
///     assert_eq!(j, &fwd.jacobian_weights()?); // equal to a fresh one, bit for bit
/// }
/// let owned = ws.take(); // hand the blocks out (the next compute allocates anew)
/// assert!(owned.is_some() && ws.jacobian().is_none());
/// # Ok::<(), kappa_attention::AttentionError>(())
/// ```
#[derive(Debug, Default)]
pub struct JacobianWorkspace<A> {
    out: Option<WeightJacobian<A>>,
    /// (N, D, k) of `out`.
    dims: (usize, usize, usize),
    factors: Factors<A>,
    threads: Threads,
}

impl<A: Real> JacobianWorkspace<A> {
    /// An empty workspace that fills on rayon's current pool; it allocates at the first
    /// [`JacobianWorkspace::compute`].
    pub fn new() -> Self {
        Self {
            out: None,
            dims: (0, 0, 0),
            factors: Factors::default(),
            threads: Threads::Current,
        }
    }

    /// An empty workspace that fills with `threads` threads: 0 for rayon's current pool (as
    /// [`JacobianWorkspace::new`]), 1 for the calling thread only, n ≥ 2 for a pool of n
    /// threads owned by the workspace (pinned to their own CPUs when n is the number of CPUs the
    /// process may use: `kappa_linalg::threads::Pinning::Auto`). The thread count changes only
    /// the time, never a bit of the result.
    ///
    /// Errors: [`InputError::InvalidArgument`] (argument `threads`) when the
    /// operating system refuses to start the pool's threads.
    pub fn with_threads(threads: usize) -> Result<Self> {
        let threads = match threads {
            0 => Threads::Current,
            1 => Threads::Serial,
            t => Threads::Pool(Arc::new(
                kappa_linalg::threads::pool_builder(t, Pinning::Auto)
                    .0
                    .build()
                    .map_err(|e| {
                        InputError::invalid("threads", format!("could not start {t} threads: {e}"))
                    })?,
            )),
        };
        Ok(Self {
            threads,
            ..Self::new()
        })
    }

    /// The number of threads a fill uses.
    pub fn threads(&self) -> usize {
        self.threads.count()
    }

    /// The weight Jacobian of `fwd` (exactly [`Forward::jacobian_weights`]' value), written into
    /// the workspace's blocks. The blocks are allocated (zeroed) only when their shape changes.
    ///
    /// Errors: as [`Forward::jacobian_weights`]; both are detected before any entry is written,
    /// and the workspace then keeps its previous result.
    pub fn compute(&mut self, fwd: &Forward<A>) -> Result<&WeightJacobian<A>> {
        let (n, d, k) = fwd.dims();
        let (nk, dk) = (n * k, d * k);
        check_dense("jacobian", nk, dk)?;
        self.factors.compute(fwd)?;
        // Reuse needs the same (N, D, k), not only the same block shape: J_V's diagonal blocks
        // sit at columns c·D.., so (N, D, k) = (4, 6, 2) and (2, 3, 4), both 8 × 12, differ in
        // where J_V's zeros are.
        let out = match self.out.take() {
            Some(j) if self.dims == (n, d, k) => j,
            other => {
                // Release the old blocks before allocating the new ones.
                drop(other);
                let zeros = || Array2::<A>::zeros((nk, dk));
                WeightJacobian {
                    q: zeros(),
                    k: zeros(),
                    v: zeros(),
                }
            }
        };
        // Invariant: J_V's off-diagonal blocks are zero — set by the zeroed allocation and
        // never written since (the fill skips them and the blocks are lent out only as `&`).
        self.dims = (n, d, k);
        let out = self.out.insert(out);
        let views = [out.q.view_mut(), out.k.view_mut(), out.v.view_mut()];
        fill(fwd, &self.factors, views, true, &self.threads);
        Ok(out)
    }

    /// The last result of [`JacobianWorkspace::compute`], if any (and not taken).
    pub fn jacobian(&self) -> Option<&WeightJacobian<A>> {
        self.out.as_ref()
    }

    /// Moves the last result out; the next [`JacobianWorkspace::compute`] allocates new blocks.
    pub fn take(&mut self) -> Option<WeightJacobian<A>> {
        self.out.take()
    }
}
