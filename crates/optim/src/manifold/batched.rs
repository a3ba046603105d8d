//! Manifold Muon on a batch of same-shape `tch` matrices (feature `tch`): the dual ascents of
//! all B matrices run in lock step on 3-D tensors [B, m, n], so that each of the K iterations is
//! a handful of libtorch calls for the whole batch — one `baddbmm` for Z = G + 2W·P(Λ), one
//! batched Newton–Schulz msign, one `bmm` for the violation, one reduction for the B objectives
//! and violations, one masked update of Λ — instead of that many calls per matrix. Small
//! matrices are bound by per-call overhead (a 64-wide GPT's matrices are a few microseconds of
//! work per product, about what a libtorch call costs), so one call per shape removes most of
//! it.
//!
//! # Math
//!
//! Slice i follows [`ManifoldMuon::step`]'s ascent (module `dual`): the same start per matrix
//! (Λ₀, the normalization, the Jacobi weights), the same stopping rule per slice — a slice that
//! converges (violation below `tol`) or whose violation is not finite is *frozen*: its Λ stops
//! moving and its last candidate is kept while the others go on, so it ends where its own
//! ascent would have stopped — and the same finish per matrix (projection, diagnostics, gap,
//! divergence test, retraction). Only the batched products and the batched msign round
//! differently from the per-matrix ones (kappa-linalg's `batched` module bounds the latter);
//! msign's working precision is decided for the whole batch (`Precision::Auto`'s size rule
//! counts the batch's flops), as in `Muon::step_batch`, and the retraction uses the same
//! choice. The ‖G‖_* diagnostic's msign and, on Stiefel, the retraction msign(W − η·A) run
//! batched too.
//!
//! Square matrices on Stiefel take the closed form A = W·msign(WᵀG − GᵀW) (no ascent; module
//! `dual`); a batch of them runs it batched: one `bmm` for S = WᵀG, one batched msign of S − Sᵀ,
//! one `bmm` for A, then the batched retraction — the report per matrix as the per-matrix step
//! writes it.
//!
//! Per matrix: the checks, the momentum, the ascent's start and finish, the DGram and Oblique
//! retractions and every retraction's check; and
//! everything when the batch is not the common case — the ADMM solver (except for the closed
//! form, which needs no solver), an msign without a batched schedule (`Exact`,
//! `MuonQuinticEps`, `MuonQuinticClamp`, the Gram forms, AOL) — where the result is [`ManifoldMuon::step`]'s on
//! each matrix.

use kappa_linalg::Matrix;
use tch::{Device, Kind, Tensor};

use super::dual::{
    finish_ascent, overflow, record, square_overflow, start_ascent, Ascent, AscentStart,
    TallProblem,
};
use super::{
    DualAscent, DualReport, DualSolver, Manifold, ManifoldMuon, ManifoldState, ManifoldStep, Moved,
    Prepared, Projector,
};
use crate::batched::{batched_schedule, check_batch_shape, msign_stacked, slice_norms};
use crate::error::{libtorch, Result};
use crate::msign::Msign;
use crate::precision::{batch_precision, Precision};

/// One ascent's answer: the direction A, its multiplier Λ and the report.
type Direction = (Tensor, Tensor, DualReport);

impl ManifoldMuon {
    /// [`ManifoldMuon::step`] on every matrix of `ws` (same shape, kind and device), with
    /// `grads[i]` and `states[i]` for `ws[i]`, the dual ascents of all of them run in lock step
    /// on the batch (module docs). Returns one [`ManifoldStep`] per matrix, in order; an empty
    /// batch is a no-op.
    ///
    /// Errors (nothing is modified, every state is unchanged): `grads` or `states` of another
    /// length ([`kappa_linalg::input::InputError::ShapeMismatch`]); matrices of different
    /// shapes, kinds or devices (`InvalidArgument`, argument `ws`); and every error
    /// [`ManifoldMuon::step`] reports, for the first matrix in order that has one (an
    /// overflowing ascent: the first matrix whose Z overflows at the earliest iteration).
    ///
    /// ```
    /// use kappa_optim::manifold::{Manifold, ManifoldMuon, ManifoldMuonConfig, ManifoldState};
    /// use tch::{Device, Kind, Tensor};
    /// let opt = ManifoldMuon::new(ManifoldMuonConfig::paper(Manifold::Stiefel))?;
    /// let mut ws: Vec<Tensor> = (0..4)
    ///     .map(|_| Tensor::randn([48, 16], (Kind::Double, Device::Cpu)))
    ///     .collect();
    /// for w in &mut ws {
    ///     opt.retract_onto(w)?;
    /// }
    /// let grads: Vec<Tensor> = ws.iter().map(|w| w.randn_like()).collect();
    /// let mut states: Vec<ManifoldState<Tensor>> = (0..4).map(|_| ManifoldState::new()).collect();
    /// let steps = opt.step_batch(&mut ws, &grads, &mut states)?;
    /// assert_eq!(steps.len(), 4);
    /// assert!(steps.iter().all(|s| s.manifold_violation < 1e-3));
    /// # Ok::<(), kappa_optim::OptimError>(())
    /// ```
    pub fn step_batch(
        &self,
        ws: &mut [Tensor],
        grads: &[Tensor],
        states: &mut [ManifoldState<Tensor>],
    ) -> Result<Vec<ManifoldStep<Tensor>>> {
        check_batch_shape(ws, grads.len(), states.len())?;
        let Some(first) = ws.first() else {
            return Ok(Vec::new());
        };
        let _g = tch::no_grad_guard();
        let this = self.for_batch(first, ws.len());
        let mut prepared = Vec::with_capacity(ws.len());
        for ((w, g), s) in ws.iter().zip(grads).zip(states.iter()) {
            prepared.push(this.prepare(w, g, s)?);
        }
        let route = match ws.len() {
            1 => Route::PerMatrix,
            _ => this.route(prepared[0].w_tall.shape()),
        };
        let directions = this.directions(&prepared, route)?;
        let mut moved = Vec::with_capacity(ws.len());
        for ((p, s), d) in prepared.into_iter().zip(states.iter()).zip(directions) {
            moved.push(this.advance(p, s.steps, d)?);
        }
        let batched = route != Route::PerMatrix;
        let retractions = match batched && this.config.manifold == Manifold::Stiefel {
            true => this.stiefel_retractions(&moved)?,
            false => moved.iter().map(|_| None).collect(),
        };
        let mut settled = Vec::with_capacity(ws.len());
        for (m, r) in moved.into_iter().zip(retractions) {
            settled.push(this.land(m, r)?);
        }
        ws.iter_mut()
            .zip(states.iter_mut())
            .zip(settled)
            .map(|((w, s), done)| done.commit(w, s))
            .collect()
    }

    /// The Stiefel retraction msign(W − η·A) of every moved matrix, as one batched msign.
    fn stiefel_retractions(&self, moved: &[Moved<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let c = &self.config;
        let stacked = stack(moved.iter().map(|m| &m.moved))?;
        let norms = slice_norms(&stacked, "w")?;
        let r = msign_stacked(&stacked, &norms, c.msign, c.precision)?;
        let slices = r.f_unbind_copy(0).map_err(libtorch("w"))?;
        Ok(slices.into_iter().map(Some).collect())
    }

    /// How a batch of tall `rows`×`cols` matrices computes its directions (module docs).
    fn route(&self, (rows, cols): (usize, usize)) -> Route {
        let c = &self.config;
        if batched_schedule(c.msign).is_none() {
            Route::PerMatrix
        } else if self.takes_closed_form(rows, cols) {
            Route::ClosedForm
        } else if matches!(c.solver, DualSolver::Ascent) {
            Route::LockStep
        } else {
            Route::PerMatrix
        }
    }

    /// This optimizer with `Precision::Auto` decided on the batch's flops when the batch's
    /// directions run batched (every msign of the step then computes in that type).
    fn for_batch(&self, first: &Tensor, count: usize) -> Self {
        let mut config = self.config;
        let (m, n) = first.shape();
        let tall = if self.flip(m, n) { (n, m) } else { (m, n) };
        if count > 1 && self.route(tall) != Route::PerMatrix {
            config.precision = batch_precision(first, count, config.precision);
        }
        Self { config }
    }

    /// The direction of every prepared matrix by `route`: the lock-step ascent, the batched
    /// closed form, or one [`ManifoldMuon::direction_tall`] per matrix.
    fn directions(&self, prepared: &[Prepared<Tensor>], route: Route) -> Result<Vec<Direction>> {
        let per_matrix = |p: &Prepared<Tensor>| self.direction_tall(&p.w_tall, &p.wt, &p.u_tall);
        match route {
            Route::PerMatrix => return prepared.iter().map(per_matrix).collect(),
            Route::ClosedForm => return self.closed_forms(prepared),
            Route::LockStep => {}
        }
        let problems: Vec<TallProblem<'_, Tensor>> = prepared
            .iter()
            .map(|p| TallProblem {
                w: &p.w_tall,
                wt: &p.wt,
                g: &p.u_tall,
            })
            .collect();
        let c = &self.config;
        let run = LockStep {
            proj: c.manifold.projector(),
            cfg: &c.dual,
            method: c.msign,
            precision: c.precision,
        };
        run.ascend(&problems, c.diagnostics)
    }
}

/// How a batch's directions are computed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The dual ascents in lock step.
    LockStep,
    /// The square Stiefel closed form, batched.
    ClosedForm,
    /// One [`ManifoldMuon::direction_tall`] per matrix.
    PerMatrix,
}

impl ManifoldMuon {
    /// The square Stiefel closed form of every prepared matrix, batched: S = WᵀG (one `bmm`),
    /// Λ = −(S + Sᵀ)/4, one batched msign of S − Sᵀ, A = W·msign(S − Sᵀ) (one `bmm`); the
    /// report per matrix as [`ManifoldMuon::direction_tall`] writes it. The first matrix whose
    /// S − Sᵀ overflows fails the batch with the per-matrix step's error.
    fn closed_forms(&self, prepared: &[Prepared<Tensor>]) -> Result<Vec<Direction>> {
        let c = &self.config;
        let w = stack(prepared.iter().map(|p| &p.w_tall))?;
        let g = stack(prepared.iter().map(|p| &p.u_tall))?;
        let s = w
            .f_transpose(1, 2)
            .and_then(|wt| wt.f_bmm(&g))
            .map_err(libtorch("grads"))?;
        let st = s.f_transpose(1, 2).map_err(libtorch("grads"))?;
        let skew = s.f_sub(&st).map_err(libtorch("grads"))?;
        let lam = s
            .f_add(&st)
            .and_then(|t| t.f_mul_scalar(-0.25))
            .map_err(libtorch("grads"))?;
        let norms = slice_norms(&skew, "grads")?;
        for (i, _) in norms.iter().enumerate().filter(|(_, n)| !n.is_finite()) {
            // The stacked norm's squares overflow first; the per-matrix step's rescaled norm
            // decides (an infinite entry in the norm list sends msign_stacked per slice).
            let slice = skew.f_get(i as i64).map_err(libtorch("grads"))?;
            if !Matrix::frobenius_norm(&slice)?.is_finite() {
                return Err(square_overflow(&prepared[i].u_tall)?);
            }
        }
        let x = msign_stacked(&skew, &norms, c.msign, c.precision)?;
        let a = w.f_bmm(&x).map_err(libtorch("grads"))?;
        let slices = |t: &Tensor| t.f_unbind_copy(0).map_err(libtorch("ws"));
        let mut out = Vec::with_capacity(prepared.len());
        for ((p, a), lam) in prepared.iter().zip(slices(&a)?).zip(slices(&lam)?) {
            let report = self.closed_form_report(&p.wt, &p.u_tall, &a)?;
            out.push((a, lam, report));
        }
        Ok(out)
    }
}

/// The settings of one lock-step ascent.
struct LockStep<'a> {
    proj: Projector,
    cfg: &'a DualAscent,
    method: Msign,
    precision: Precision,
}

impl LockStep<'_> {
    /// The dual ascents of `ps` (tall, one shape) in lock step (module docs).
    fn ascend(&self, ps: &[TallProblem<'_, Tensor>], diagnostics: bool) -> Result<Vec<Direction>> {
        let starts = ps
            .iter()
            .map(|p| start_ascent(p, self.proj, self.cfg))
            .collect::<Result<Vec<_>>>()?;
        let w = stack(ps.iter().map(|p| p.w))?;
        let g = stack(
            starts
                .iter()
                .zip(ps)
                .map(|(s, p)| s.scaled_g.as_ref().unwrap_or(p.g)),
        )?;
        let lam = stack(starts.iter().map(|s| &s.lam))?;
        let weights = jacobi_stack(&starts, &lam)?;
        let reports = starts.iter().map(|s| s.report.clone()).collect();
        let (a, lam, reports) = self.iterate(&w, &g, lam, weights.as_ref(), reports, ps)?;
        // msign of the caller's G (the stacked G above when no slice was normalized).
        let signs = match diagnostics {
            true if starts.iter().all(|s| s.scaled_g.is_none()) => Some(self.msign_each(&g)?),
            true => Some(self.msign_each(&stack(ps.iter().map(|p| p.g))?)?),
            false => None,
        };
        let slices = |t: &Tensor| t.f_unbind_copy(0).map_err(libtorch("ws"));
        let (a, lam) = (slices(&a)?, slices(&lam)?);
        let mut out = Vec::with_capacity(ps.len());
        for (i, ((a, lam), report)) in a.into_iter().zip(lam).zip(reports).enumerate() {
            let ascent = Ascent {
                a,
                lam,
                report,
                g_sign: signs.as_ref().map(|s| s.get(i as i64)),
            };
            let weights = starts[i].weights.as_deref();
            let (method, precision) = (self.method, self.precision);
            out.push(finish_ascent(
                &ps[i],
                self.proj,
                self.cfg,
                weights,
                ascent,
                method,
                precision,
                diagnostics,
            )?);
        }
        Ok(out)
    }

    /// The K iterations on the stacked W, G and Λ: returns the stacked directions, multipliers
    /// and the per-slice reports.
    fn iterate(
        &self,
        w: &Tensor,
        g: &Tensor,
        mut lam: Tensor,
        weights: Option<&Tensor>,
        mut reports: Vec<DualReport>,
        ps: &[TallProblem<'_, Tensor>],
    ) -> Result<(Tensor, Tensor, Vec<DualReport>)> {
        let wt = w.f_transpose(1, 2).map_err(libtorch("ws"))?;
        let n = w.size()[2] as f64;
        let mut active = vec![true; ps.len()];
        let mut a: Option<Tensor> = None;
        for k in 0..self.cfg.steps {
            let z = g.f_baddbmm(w, &lam, 1.0, 2.0).map_err(libtorch("grads"))?;
            let norms = slice_norms(&z, "grads")?;
            let overflowed = (0..ps.len()).find(|&i| active[i] && !norms[i].is_finite());
            if let Some(i) = overflowed {
                return Err(overflow(&reports[i], ps[i].g)?);
            }
            let cand = msign_stacked(&z, &norms, self.method, self.precision)?;
            let h = self.violations(&wt, &cand)?;
            let (objectives, violations) = objectives_and_violations(&z, &cand, &h, n)?;
            // Slices frozen before this iteration keep their candidate (a copy only then).
            a = Some(match a {
                Some(prev) if active.contains(&false) => {
                    let computed = mask(&active, w.device())?;
                    cand.f_where_self(&computed, &prev)
                        .map_err(libtorch("ws"))?
                }
                _ => cand,
            });
            for (i, on) in active.iter_mut().enumerate().filter(|(_, on)| **on) {
                *on = !record(
                    &mut reports[i],
                    k,
                    objectives[i],
                    violations[i],
                    self.cfg.tol,
                );
            }
            if !active.contains(&true) || k + 1 == self.cfg.steps {
                break;
            }
            lam = self.dual_update(lam, h, weights, &active, k)?;
            for i in (0..ps.len()).filter(|&i| active[i]) {
                reports[i].dual_steps += 1;
            }
        }
        let a = a.ok_or_else(|| {
            kappa_linalg::input::InputError::invalid("dual.steps", "K must be at least 1")
        })?;
        Ok((a, lam, reports))
    }

    /// Λ − α(1 − k/K)·H (⊙ the Jacobi weights) on the slices still `active`; the frozen ones
    /// keep their Λ.
    fn dual_update(
        &self,
        lam: Tensor,
        h: Tensor,
        weights: Option<&Tensor>,
        active: &[bool],
        k: usize,
    ) -> Result<Tensor> {
        let step = match weights {
            Some(wts) => h.f_mul(wts).map_err(libtorch("grads"))?,
            None => h,
        };
        let moved = lam
            .f_sub(&(step * self.cfg.step_size(k)))
            .map_err(libtorch("grads"))?;
        if !active.contains(&false) {
            return Ok(moved);
        }
        let moving = mask(active, lam.device())?;
        moved.f_where_self(&moving, &lam).map_err(libtorch("grads"))
    }

    /// H = P(WᵀA + AᵀW) of every slice (`wt` = Wᵀ stacked).
    fn violations(&self, wt: &Tensor, cand: &Tensor) -> Result<Tensor> {
        let sym = wt
            .f_bmm(cand)
            .and_then(|x| x.f_add(&x.f_transpose(1, 2)?))
            .map_err(libtorch("grads"))?;
        match self.proj {
            Projector::Identity => Ok(sym),
            Projector::OffDiagonal => {
                let _ = sym
                    .f_diagonal(0, 1, 2)
                    .and_then(|mut d| d.f_zero_())
                    .map_err(libtorch("grads"))?;
                Ok(sym)
            }
            // 0·x off the diagonal, as `Projector::apply` (a non-finite entry becomes NaN).
            Projector::Diagonal => {
                let n = sym.size()[2];
                Tensor::f_eye(n, (sym.kind(), sym.device()))
                    .and_then(|eye| sym.f_mul(&eye))
                    .map_err(libtorch("grads"))
            }
        }
    }

    /// msign of every slice of `x3` (finite).
    fn msign_each(&self, x3: &Tensor) -> Result<Tensor> {
        let norms = slice_norms(x3, "grads")?;
        msign_stacked(x3, &norms, self.method, self.precision)
    }
}

/// The matrices stacked along a new first axis.
fn stack<'a>(xs: impl Iterator<Item = &'a Tensor>) -> Result<Tensor> {
    let xs: Vec<&Tensor> = xs.collect();
    Tensor::f_stack(&xs, 0).map_err(libtorch("ws"))
}

/// The Jacobi weights of every slice as one [B, n, n] tensor in `like`'s kind and device, when
/// the ascent is preconditioned.
fn jacobi_stack(starts: &[AscentStart<Tensor>], like: &Tensor) -> Result<Option<Tensor>> {
    if starts.iter().any(|s| s.weights.is_none()) {
        return Ok(None);
    }
    let all: Vec<f64> = starts
        .iter()
        .flat_map(|s| s.weights.iter().flatten().copied())
        .collect();
    Tensor::from_slice(&all)
        .f_to_kind(like.kind())
        .and_then(|t| t.f_to_device(like.device()))
        .and_then(|t| t.f_view_as(like))
        .map(Some)
        .map_err(libtorch("ws"))
}

/// The dual objectives −⟨Z_i, A_i⟩ and the violations ‖H_i‖_F/n of every slice (one transfer).
fn objectives_and_violations(
    z: &Tensor,
    cand: &Tensor,
    h: &Tensor,
    n: f64,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let both = z
        .f_mul(cand)
        .and_then(|p| p.f_sum_dim_intlist(&[1i64, 2][..], false, Kind::Double))
        .and_then(|inner| {
            let norms = h.f_norm_scalaropt_dim_dtype(2.0, [1i64, 2], false, Kind::Double)?;
            Tensor::f_cat(&[inner.f_neg()?, norms.f_div_scalar(n)?], 0)
        })
        .and_then(|t| Vec::<f64>::try_from(&t))
        .map_err(libtorch("grads"))?;
    let (objectives, violations) = both.split_at(both.len() / 2);
    Ok((objectives.to_vec(), violations.to_vec()))
}

/// A [B, 1, 1] boolean mask of `on` (broadcasts over each slice).
fn mask(on: &[bool], device: Device) -> Result<Tensor> {
    Tensor::from_slice(on)
        .f_view([on.len() as i64, 1, 1])
        .and_then(|t| t.f_to_device(device))
        .map_err(libtorch("ws"))
}
