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
//! where G_i\[c, e\] = (Σ_j P\[i,j\] V\[j,c\] K\[j,e\] − A\[i,c\] (PK)\[i,e\]) / s is computed for all i at
//! once by k products (P diag(V[:, c])) K (and likewise H with X): O(N²k(k + D)) flops plus the
//! N·k·3D·k entries of the result.
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

use kappa_linalg::{commutation_matrix, kron, unvec, Real};
use ndarray::{concatenate, s, Array1, Array2, ArrayView1, ArrayView2, Axis, Zip};

use crate::attention::Forward;
use crate::error::{check_computed, check_dense, check_shape, check_vector, shape_str, Result};
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
    /// [`kappa_linalg::MAX_DENSE_ENTRIES`]; [`crate::AttentionError::ShapeMismatch`] (argument
    /// `self.k` or `self.v`) for hand-built blocks whose shapes differ from `self.q`'s.
    pub fn full(&self) -> Result<Array2<A>> {
        let (rows, cols) = self.q.dim();
        for (arg, b) in [("self.k", &self.k), ("self.v", &self.v)] {
            if b.dim() != (rows, cols) {
                return Err(crate::AttentionError::ShapeMismatch {
                    arg,
                    expected: format!("{} (the shape of self.q)", shape_str(rows, cols)),
                    found: shape_str(b.nrows(), b.ncols()),
                });
            }
        }
        check_dense("self", rows, cols.saturating_mul(3))?;
        concatenate(Axis(1), &[self.q.view(), self.k.view(), self.v.view()]).map_err(|e| {
            crate::AttentionError::InvalidArgument {
                arg: "self",
                reason: e.to_string(),
            }
        })
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
        let mut g = pv.dot(&self.k);
        let mut h = pv.dot(&self.x);
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
    /// d + e·D ↔ W[d, e]).
    ///
    /// Cost: O(N²k(k + D)) flops plus 3·N·k·D·k entries. Errors: a block above
    /// [`kappa_linalg::MAX_DENSE_ENTRIES`] entries ([`crate::AttentionError::TooLarge`],
    /// argument `jacobian`); [`crate::AttentionError::Overflow`] (argument `self`) when an entry
    /// of J overflows (possible for a forward pass whose X, Q, K, V are all near the range's
    /// square root; see `docs/attention.md`, "Scale behaviour").
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
        let (n, d, k) = self.dims();
        check_dense("jacobian", n * k, d * k)?;
        let zeros = || Array2::<A>::zeros((n * k, d * k));
        let mut out = WeightJacobian {
            q: zeros(),
            k: zeros(),
            v: zeros(),
        };
        self.jacobian_weights_into(&mut out)?;
        Ok(out)
    }

    /// [`Forward::jacobian_weights`] into existing blocks (each Nk × Dk, any layout), so repeated
    /// evaluations reuse their memory: every entry of `out` is overwritten. At model sizes a
    /// fresh multi-GB allocation costs more in page faults than filling it.
    ///
    /// Errors: a block of `out` not Nk × Dk (argument `out`); an entry of J overflows
    /// ([`crate::AttentionError::Overflow`], argument `self`; `out` then holds the partial
    /// values).
    pub fn jacobian_weights_into(&self, out: &mut WeightJacobian<A>) -> Result<()> {
        let (n, d, k) = self.dims();
        let (nk, dk) = (n * k, d * k);
        for b in [&out.q, &out.k, &out.v] {
            if b.dim() != (nk, dk) {
                return Err(crate::AttentionError::ShapeMismatch {
                    arg: "out",
                    expected: format!("three {nk}×{dk} blocks (N·k × D·k)"),
                    found: crate::error::shape_str(b.nrows(), b.ncols()),
                });
            }
        }
        let pk = self.p.dot(&self.k);
        let px = self.p.dot(&self.x);
        for c in 0..k {
            let (g, h) = self.gh(c, &pk, &px);
            for i in 0..n {
                let r = i + c * n;
                let xi = self.x.row(i);
                let hi = h.row(i);
                let mut rq = out.q.row_mut(r);
                for e in 0..k {
                    let gie = g[[i, e]];
                    Zip::from(rq.slice_mut(s![e * d..(e + 1) * d]))
                        .and(&xi)
                        .for_each(|o, &xv| *o = xv * gie);
                }
                let mut rk = out.k.row_mut(r);
                for e in 0..k {
                    let qie = self.q[[i, e]];
                    Zip::from(rk.slice_mut(s![e * d..(e + 1) * d]))
                        .and(&hi)
                        .for_each(|o, &hv| *o = qie * hv);
                }
                let mut rv = out.v.row_mut(r);
                rv.fill(A::zero());
                rv.slice_mut(s![c * d..(c + 1) * d]).assign(&px.row(i));
            }
        }
        for b in [&out.q, &out.k, &out.v] {
            check_computed("self", &b.view(), "the weight Jacobian")?;
        }
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
        let pk = self.p.dot(&self.k);
        let px = self.p.dot(&self.x);
        let qt = self.q.dot(&self.wk.t()); // Q W_Kᵀ, N×D
        let mut jx = Array2::<A>::zeros((n * k, n * d));
        for c in 0..k {
            let (g, _) = self.gh(c, &pk, &px);
            let gw = g.dot(&self.wq.t()); // row i: (G_i W_Qᵀ)[c, :]
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
        let mut ds = self.x.dot(&dwq).dot(&self.k.t());
        ds += &self.q.dot(&self.x.dot(&dwk).t());
        ds.mapv_inplace(|e| e * inv_s);
        let dp = self.softmax_apply(&ds);
        let mut da = dp.dot(&self.v);
        da += &self.p.dot(&self.x.dot(&dwv));
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
            let gs = self.score_cotangent(g);
            let inv_s = A::one() / self.s;
            let xt = self.x.t();
            [
                xt.dot(&gs.dot(&self.k)).mapv(|e| e * inv_s),
                xt.dot(&gs.t().dot(&self.q)).mapv(|e| e * inv_s),
                xt.dot(&self.p.t().dot(&g)),
            ]
        })?;
        Ok(WeightSet { q, k, v })
    }

    /// gS = P ⊙ (gP − rowsum(P ⊙ gP)), gP = G Vᵀ.
    fn score_cotangent(&self, g: ArrayView2<'_, A>) -> Array2<A> {
        let gp = g.dot(&self.v.t());
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
        let dq = dx.dot(&self.wq);
        let dk = dx.dot(&self.wk);
        let dv = dx.dot(&self.wv);
        let mut ds = dq.dot(&self.k.t());
        ds += &self.q.dot(&dk.t());
        ds.mapv_inplace(|e| e * inv_s);
        let dp = self.softmax_apply(&ds);
        let mut da = dp.dot(&self.v);
        da += &self.p.dot(&dv);
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
        let gq = gs.dot(&self.k).mapv(|e| e * inv_s);
        let gk = gs.t().dot(&self.q).mapv(|e| e * inv_s);
        let gv = self.p.t().dot(&g);
        let mut gx = gq.dot(&self.wq.t());
        gx += &gk.dot(&self.wk.t());
        gx += &gv.dot(&self.wv.t());
        gx
    }

    /// J · t for t = [vec dW_Q; vec dW_K; vec dW_V] (column-major, length 3Dk): vec dA (length
    /// Nk), without forming J.
    ///
    /// Errors: `t` empty, non-finite or not of length 3Dk.
    pub fn jvp_weights_vec(&self, t: ArrayView1<'_, A>) -> Result<Array1<A>> {
        let (_, d, k) = self.dims();
        check_vector("t", &t, 3 * d * k, "3·D·k: [vec dW_Q; vec dW_K; vec dW_V]")?;
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
        check_vector("u", &u, n * k, "N·k: vec of an N×k output cotangent")?;
        let g = unvec(u, n, k)?;
        Ok(self.vjp_weights(g.view())?.to_vec())
    }

    /// J_X · vec(dX) (length ND) → vec dA (length Nk), without forming J_X.
    ///
    /// Errors: `t` empty, non-finite or not of length ND.
    pub fn jvp_input_vec(&self, t: ArrayView1<'_, A>) -> Result<Array1<A>> {
        let (n, d, _) = self.dims();
        check_vector("t", &t, n * d, "N·D: vec of an N×D token tangent")?;
        let dx = unvec(t, n, d)?;
        Ok(colmajor(&self.jvp_input(dx.view())?))
    }

    /// J_Xᵀ · vec(G) (length Nk) → vec ∂L/∂X (length ND), without forming J_X.
    ///
    /// Errors: `u` empty, non-finite or not of length Nk.
    pub fn vjp_input_vec(&self, u: ArrayView1<'_, A>) -> Result<Array1<A>> {
        let (n, _, k) = self.dims();
        check_vector("u", &u, n * k, "N·k: vec of an N×k output cotangent")?;
        let g = unvec(u, n, k)?;
        Ok(colmajor(&self.vjp_input(g.view())?))
    }
}
