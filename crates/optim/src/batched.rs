//! Muon on a batch of same-shape `tch` parameters (feature `tch`): momentum, NorMuon, decay and
//! the update per matrix, as [`Muon::step`] does them, and **one** batched orthogonalization
//! ([`kappa_linalg::newton_schulz_batched`]) for the whole batch.
//!
//! Small matrices are bound by per-call overhead (the three products of a Newton–Schulz step
//! on a 256×256 matrix are a few microseconds of work each); one `bmm`/`baddbmm` per product
//! for all same-shape matrices of a model removes most of it.
//!
//! Each matrix's result equals [`Muon::step`]'s on it except for the rounding of the batched
//! products (kappa-linalg's `batched` module bounds it): the momentum, the working-precision
//! conversion, the per-matrix normalization (with its power-of-two guards), NorMuon and the
//! update are the per-matrix code itself. The msign variants that are a plain Newton–Schulz
//! schedule — `MuonQuintic`, `PolarExpress`, `PolarExpressDesigned` — run batched; the others
//! (`Exact`, `MuonQuinticEps`, whose normalization depends on each norm, the Gram form and
//! AOL) run one msign per matrix, with the same results as [`Muon::step`].

use kappa_linalg::input::InputError;
use kappa_linalg::newton_schulz_each;
use tch::Tensor;

use crate::error::Result;
use crate::msign::{msign, Msign, Working};
use crate::muon::{apply_update, check_step_inputs, Muon, MuonConfig, MuonState, MuonStep};
use crate::precision::WorkingPrecision;

impl Muon {
    /// [`Muon::step`] on every matrix of `ws` (same shape, kind and device), with `grads[i]` and
    /// `states[i]` for `ws[i]`, orthogonalizing all of them in one batched call (module docs).
    /// Returns one [`MuonStep`] per matrix; an empty batch is a no-op.
    ///
    /// Errors (nothing is modified): `grads` or `states` of another length
    /// ([`InputError::ShapeMismatch`]); matrices of different shapes, kinds or devices
    /// ([`InputError::InvalidArgument`], argument `ws`); and, for the first matrix in order that
    /// has one, every error [`Muon::step`] reports.
    pub fn step_batch(
        &self,
        ws: &mut [Tensor],
        grads: &[Tensor],
        states: &mut [MuonState<Tensor>],
    ) -> Result<Vec<MuonStep>> {
        self.step_batch_scaled(ws, grads, states, 1.0)
    }

    /// [`Muon::step_batch`] at `lr_multiplier`·lr (as [`Muon::step_scaled`]).
    pub fn step_batch_scaled(
        &self,
        ws: &mut [Tensor],
        grads: &[Tensor],
        states: &mut [MuonState<Tensor>],
        lr_multiplier: f64,
    ) -> Result<Vec<MuonStep>> {
        let c = self.scaled_config(lr_multiplier)?;
        check_batch(ws, grads, states)?;
        let Some(first) = ws.first() else {
            return Ok(Vec::new());
        };
        let precision = first.working_name(c.precision)?;
        let mut advanced = Vec::with_capacity(ws.len());
        for (g, s) in grads.iter().zip(states.iter()) {
            advanced.push(c.momentum.advance_lean(s.buffer(), g)?);
        }
        let us: Vec<&Tensor> = advanced
            .iter()
            .map(|(b, u)| u.as_ref().unwrap_or(b))
            .collect();
        let os = directions(&c, &us)?;
        let mut steps = Vec::with_capacity(ws.len());
        let jobs = ws.iter_mut().zip(states.iter_mut()).zip(os).zip(advanced);
        for (((w, s), o), (buffer, _)) in jobs {
            let scale = apply_update(&c, w, o, s, buffer)?;
            steps.push(MuonStep { scale, precision });
        }
        Ok(steps)
    }
}

/// The checks of [`Muon::step_batch`], in its documented order.
fn check_batch(ws: &[Tensor], grads: &[Tensor], states: &[MuonState<Tensor>]) -> Result<()> {
    let count = |arg: &'static str, len: usize| -> Result<()> {
        if len == ws.len() {
            return Ok(());
        }
        let want = format!("{} entries (one per matrix of `ws`)", ws.len());
        Err(InputError::shape_mismatch(arg, want, format!("{len} entries")).into())
    };
    count("grads", grads.len())?;
    count("states", states.len())?;
    if let Some(first) = ws.first() {
        let like = (first.size(), first.kind(), first.device());
        if let Some((i, w)) = ws
            .iter()
            .enumerate()
            .find(|(_, w)| (w.size(), w.kind(), w.device()) != like)
        {
            let why = format!(
                "matrix {i} is {:?} {:?} on {:?}, matrix 0 {:?} {:?} on {:?}; a batch needs one \
                 shape, kind and device",
                w.size(),
                w.kind(),
                w.device(),
                like.0,
                like.1,
                like.2
            );
            return Err(InputError::invalid("ws", why).into());
        }
    }
    for ((w, g), s) in ws.iter().zip(grads).zip(states) {
        check_step_inputs(w, g, s.buffer())?;
    }
    Ok(())
}

/// msign of every momentum input: one batched Newton–Schulz call for the schedule variants,
/// one msign per matrix otherwise (module docs). Each input is validated as msign validates it.
fn directions(c: &MuonConfig, us: &[&Tensor]) -> Result<Vec<Tensor>> {
    let schedule = match c.msign {
        Msign::MuonQuintic | Msign::PolarExpress { .. } | Msign::PolarExpressDesigned { .. } => {
            c.msign.schedule()
        }
        _ => None,
    };
    let Some(schedule) = schedule else {
        return us.iter().map(|u| msign(*u, c.msign, c.precision)).collect();
    };
    // `Working::of` reports a non-finite input as `msign`'s validation does; empty inputs
    // cannot reach here (`check_batch` validated the weights of the same shape).
    let mut works = Vec::with_capacity(us.len());
    for u in us {
        works.push(Working::of(*u, c.precision)?);
    }
    let inputs: Vec<Tensor> = works
        .iter()
        .zip(us)
        .map(|(w, u)| w.input(u).shallow_clone())
        .collect();
    // Linalg errors of the iteration as msign reports them (`?`, not `from_linalg`).
    let out = newton_schulz_each(&inputs, &schedule)?;
    out.into_iter()
        .zip(&works)
        .zip(us)
        .map(|((o, w), u)| w.back(o, u))
        .collect()
}
