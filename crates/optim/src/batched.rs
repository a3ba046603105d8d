//! Muon on a batch of same-shape `tch` parameters (feature `tch`), run as one **bank**: the B
//! gradients and momentum buffers stacked as one (B·m)×n matrix, the momentum ([`Momentum`]'s
//! one code) on it, one conversion to the working type (f32 to bf16 with every slice's norm, in
//! the momentum's own pass: the f32 input of a slice only ever lives in a one-slice scratch),
//! and **one** batched orthogonalization ([`kappa_linalg::newton_schulz_batched_normed`]) for
//! the whole batch; then NorMuon, decay and the update per matrix, from its slice of the result
//! (still in bf16 where the update fuses the conversion back, as [`Muon::step`]'s does). The
//! checks stack too (one finiteness sum for all weights, one for all gradients, one for all
//! buffers; per matrix only when one fails, to report the first error in order).
//!
//! Stacking copies nothing when the matrices are already consecutive blocks of one storage: the
//! row blocks of one weight and its gradient (a fused QKV split by heads), and the momentum
//! buffers, which a bank step leaves as views of the one buffer it computed.
//!
//! Small matrices are bound by per-call overhead (the three products of a Newton–Schulz step
//! on a 32×96 matrix are a few microseconds of work each, a libtorch call costs about as much);
//! one call per operation for all same-shape matrices of a model removes most of it.
//!
//! Each matrix's result equals [`Muon::step`]'s on it except for the rounding of the batched
//! products (kappa-linalg's `batched` module bounds it): the momentum is elementwise, so the
//! stacked buffers are the per-matrix ones bit for bit; the per-matrix normalization (with its
//! power-of-two guards) happens inside the batched iteration. A batch outside the common case
//! takes the per-matrix preparation (momentum, rescaling, conversion per matrix) before the same
//! batched call: some states with a buffer and some without, or a momentum input msign would
//! rescale (norm zero, not finite, or outside msign's safe range). The msign variants that are
//! a plain Newton–Schulz schedule — `MuonQuintic`, `PolarExpress`, `PolarExpressDesigned` — run
//! batched; the others (`Exact`, `MuonQuinticEps` and `MuonQuinticClamp`, whose normalization
//! depends on each norm, the Gram form and AOL) run one msign per matrix, with the same results as [`Muon::step`].
//!
//! [`Momentum`]: crate::Momentum

use kappa_linalg::input::InputError;
use kappa_linalg::{
    newton_schulz_batched_normed, newton_schulz_each, Matrix, NormedBatch, NsSchedule,
};
use tch::{Kind, Tensor};

use crate::error::{libtorch, Result};
use crate::msign::{msign, Msign, Working, SAFE_FRO};
use crate::muon::{
    apply_update, check_entries, update_from_direction, Entries, Muon, MuonConfig, MuonState,
    MuonStep,
};
use crate::precision::{batch_precision, Precision, WorkingPrecision};

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
        self.step_batch_entries(ws, grads, states, lr_multiplier, Entries::All)
    }

    /// [`Muon::step_batch_scaled`] checking the finiteness of `entries` only.
    pub(crate) fn step_batch_entries(
        &self,
        ws: &mut [Tensor],
        grads: &[Tensor],
        states: &mut [MuonState<Tensor>],
        lr_multiplier: f64,
        entries: Entries,
    ) -> Result<Vec<MuonStep>> {
        let mut c = self.scaled_config(lr_multiplier)?;
        check_batch_shape(ws, grads.len(), states.len())?;
        let Some(first) = ws.first() else {
            return Ok(Vec::new());
        };
        if batched_schedule(c.msign).is_some() {
            // One working type for the whole batch, whichever path prepares it.
            c.precision = batch_precision(first, ws.len(), c.precision);
        }
        if slices_alone(first, &c)? {
            return step_each(c, ws, grads, states, entries);
        }
        let stacked = check_batch(ws, grads, states, entries)?;
        let precision = first.working_name(c.precision)?;
        let bank = match stacked {
            Some(stacked) => step_bank(&c, ws, states, stacked)?,
            None => None,
        };
        if let Some(scales) = bank {
            return Ok(scales
                .into_iter()
                .map(|scale| MuonStep { scale, precision })
                .collect());
        }
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

/// Whether the batched Newton–Schulz call would orthogonalize the batch's matrices one by one
/// anyway ([`kappa_linalg::slices_go_alone`] for the working type `c.precision` gives `first`):
/// then stacking them buys nothing and costs copies.
fn slices_alone(first: &Tensor, c: &MuonConfig) -> Result<bool> {
    if batched_schedule(c.msign).is_none() {
        return Ok(false);
    }
    let kind = match first.working_name(c.precision)? {
        "bf16" => Kind::BFloat16,
        "f64" => Kind::Double,
        _ => Kind::Float,
    };
    let like = Tensor::f_empty([0], (kind, first.device())).map_err(libtorch("ws"))?;
    let (m, n) = first.shape();
    Ok(kappa_linalg::slices_go_alone(&like, m, n))
}

/// [`Muon::step`] on each matrix in turn at `c` (the batch's scaled config and working type),
/// after every matrix's inputs are checked, so an error changes nothing (and each matrix is
/// checked once).
fn step_each(
    c: MuonConfig,
    ws: &mut [Tensor],
    grads: &[Tensor],
    states: &mut [MuonState<Tensor>],
    entries: Entries,
) -> Result<Vec<MuonStep>> {
    for ((w, g), s) in ws.iter().zip(grads).zip(states.iter()) {
        check_entries(w, g, "grad", s.buffer(), entries)?;
    }
    let muon = Muon::new(c)?;
    let jobs = ws.iter_mut().zip(grads).zip(states.iter_mut());
    jobs.map(|((w, g), s)| muon.step_checked(&c, w, g, s))
        .collect()
}

/// The gradients and momentum buffers of a checked batch, each stacked as one (B·m)×n matrix
/// once, for the checks and the bank; `buffers` is `None` when no state has one yet.
struct Stacked {
    grads: Tensor,
    buffers: Option<Tensor>,
}

/// The batch as one bank (module docs): momentum on the stacked gradients and buffers, one
/// conversion to the working type, one batched Newton–Schulz call; then the per-matrix update.
/// Returns the shape factors, or `Ok(None)` (nothing computed that is kept) when the batch is
/// not the common case: an msign without a batched schedule, or a momentum input whose norm
/// asks msign for a power-of-two rescaling (or is zero or not finite) — the per-matrix path
/// handles those.
fn step_bank(
    c: &MuonConfig,
    ws: &mut [Tensor],
    states: &mut [MuonState<Tensor>],
    stacked: Stacked,
) -> Result<Option<Vec<f64>>> {
    let Some(schedule) = batched_schedule(c.msign) else {
        return Ok(None);
    };
    let _g = tch::no_grad_guard();
    let (m, n) = ws[0].shape();
    let dims = [ws.len() as i64, m as i64, n as i64];
    let Some((buffer, normed, converted)) = momentum_normed(c, &stacked, dims)? else {
        return Ok(None);
    };
    // In the working type: each slice goes back in its own update (in cache), not the batch.
    let out = newton_schulz_batched_normed(normed, &schedule)?;
    // Views of the new buffer: the states' buffers stay consecutive blocks of one storage, so
    // the next step stacks them without a copy (`stacked`).
    let buffers = buffer
        .f_view(dims)
        .and_then(|b| b.f_unbind(0))
        .map_err(libtorch("states"))?;
    let mut scales = Vec::with_capacity(ws.len());
    let jobs = ws.iter_mut().zip(states.iter_mut()).zip(buffers);
    for (i, ((w, s), b)) in jobs.enumerate() {
        let o = out.f_select(0, i as i64).map_err(libtorch("grads"))?;
        scales.push(update_from_direction(c, w, o, converted, s, b)?);
    }
    Ok(Some(scales))
}

/// The bank's momentum: the new (stacked) buffer and the Muon input of every slice in the
/// working type with its norms ([`normed_working`]), and whether it was converted — for a bf16
/// working type straight from the gradients and buffers ([`Momentum::advance_to_bf16`], the
/// f32 input never written). `None` where [`normed_working`] gives none.
fn momentum_normed(
    c: &MuonConfig,
    stacked: &Stacked,
    dims: [i64; 3],
) -> Result<Option<(Tensor, NormedBatch, bool)>> {
    let buffers = stacked.buffers.as_ref();
    let grads = &stacked.grads;
    if grads.kind() == Kind::Float && grads.working_name(c.precision)? == "bf16" {
        if let Some((buffer, normed, fros)) = c.momentum.advance_to_bf16(buffers, grads, dims) {
            return Ok(take_as_they_are(&fros).then_some((buffer, normed, true)));
        }
    }
    let (buffer, u) = c.momentum.advance_lean(buffers, grads)?;
    let u3 = u
        .as_ref()
        .unwrap_or(&buffer)
        .f_view(dims)
        .map_err(libtorch("grads"))?;
    Ok(normed_working(&u3, c.precision)?.map(|(normed, converted)| (buffer, normed, converted)))
}

/// The momentum inputs `u3` = [B, m, n] in the working type of `precision` with their slice
/// norms, and whether they were converted (the result is then in the working type too), as
/// [`Working::of`] prepares one matrix: f32 to bf16 with both norms in one read where the
/// backend has it. `None` when a slice's norm asks msign for a rescaling, or is zero or not
/// finite ([`take_as_they_are`]): the per-matrix path handles those, and reports their errors.
fn normed_working(u3: &Tensor, precision: Precision) -> Result<Option<(NormedBatch, bool)>> {
    if u3.kind() == Kind::Float && u3.working_name(precision)? == "bf16" {
        if let Some((normed, fros)) = kappa_linalg::batched::to_bf16_batch_normed(u3) {
            return Ok(take_as_they_are(&fros).then_some((normed, true)));
        }
    }
    let Some(working) = u3.to_working(precision)? else {
        let normed = NormedBatch::new(u3.shallow_clone()).ok();
        return Ok(normed
            .filter(|n| take_as_they_are(n.fros()))
            .map(|n| (n, false)));
    };
    if !take_as_they_are(&slice_norms(u3, "grads")?) {
        return Ok(None);
    }
    let normed = NormedBatch::new(working).map_err(crate::error::from_linalg)?;
    Ok(Some((normed, true)))
}

/// The schedule of an msign that runs batched (module docs), `None` for the others.
pub(crate) fn batched_schedule(msign: Msign) -> Option<NsSchedule> {
    match msign {
        Msign::MuonQuintic | Msign::PolarExpress { .. } | Msign::PolarExpressDesigned { .. } => {
            msign.schedule()
        }
        _ => None,
    }
}

/// The Frobenius norm of every slice of `u3` = [B, m, n], accumulated in f64 (errors name
/// `arg`).
pub(crate) fn slice_norms(u3: &Tensor, arg: &'static str) -> Result<Vec<f64>> {
    kappa_linalg::tch_backend::slice_frobenius_norms(u3, arg).map_err(crate::error::from_linalg)
}

/// Whether every slice norm is one msign takes as it is (neither zero nor outside its safe
/// range, with a factor-2 margin so that the batched reduction's rounding cannot flip the
/// decision [`Working::of`] makes from the per-matrix norm).
fn take_as_they_are(norms: &[f64]) -> bool {
    let (lo, hi) = SAFE_FRO;
    norms
        .iter()
        .all(|&f| f.is_finite() && (2.0 * lo..=hi / 2.0).contains(&f))
}

/// msign of every slice of `u3` = [B, m, n] (finite, with Frobenius norms `norms`): one
/// batched Newton–Schulz call when `method` has a batched schedule and every norm is one msign
/// takes as it is, one [`msign`] per slice otherwise; the result is stacked as `u3`.
pub(crate) fn msign_stacked(
    u3: &Tensor,
    norms: &[f64],
    method: Msign,
    precision: Precision,
) -> Result<Tensor> {
    if let Some(schedule) = batched_schedule(method).filter(|_| take_as_they_are(norms)) {
        if let Some((normed, converted)) = normed_working(u3, precision)? {
            let out = newton_schulz_batched_normed(normed, &schedule)?;
            return if converted {
                out.to_kind_of(u3)
            } else {
                Ok(out)
            };
        }
    }
    let slices = u3.f_unbind(0).map_err(libtorch("x"))?;
    let out = slices
        .iter()
        .map(|u| msign(u, method, precision))
        .collect::<Result<Vec<_>>>()?;
    Tensor::f_stack(&out, 0).map_err(libtorch("x"))
}

/// The checks every batched step makes first: one gradient and one state per matrix, and one
/// shape, kind and device for all matrices (argument `ws`).
pub(crate) fn check_batch_shape(ws: &[Tensor], grads: usize, states: usize) -> Result<()> {
    let count = |arg: &'static str, len: usize| -> Result<()> {
        if len == ws.len() {
            return Ok(());
        }
        let want = format!("{} entries (one per matrix of `ws`)", ws.len());
        Err(InputError::shape_mismatch(arg, want, format!("{len} entries")).into())
    };
    count("grads", grads)?;
    count("states", states)?;
    let Some(first) = ws.first() else {
        return Ok(());
    };
    let like = (first.size(), first.kind(), first.device());
    match ws
        .iter()
        .enumerate()
        .find(|(_, w)| (w.size(), w.kind(), w.device()) != like)
    {
        None => Ok(()),
        Some((i, w)) => {
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
            Err(InputError::invalid("ws", why).into())
        }
    }
}

/// The checks of [`Muon::step_batch`], in its documented order. Returns the stacked gradients
/// and buffers when the stacked checks decided (every state with a buffer, or none), `None`
/// when the per-matrix checks ran.
fn check_batch(
    ws: &[Tensor],
    grads: &[Tensor],
    states: &[MuonState<Tensor>],
    entries: Entries,
) -> Result<Option<Stacked>> {
    check_batch_shape(ws, grads.len(), states.len())?;
    if let Some(stacked) = stacked_if_valid(ws, grads, states, entries) {
        return Ok(Some(stacked));
    }
    for ((w, g), s) in ws.iter().zip(grads).zip(states) {
        check_entries(w, g, "grad", s.buffer(), entries)?;
    }
    Ok(None)
}

/// The stacked gradients and buffers when every matrix of the batch passes
/// the checks of `entries` ([`check_entries`]), decided by validating the weights, and with
/// [`Entries::All`] the gradients and the buffers, each stacked as one matrix (one finiteness
/// pass each instead of one per matrix). `None` — the
/// per-matrix checks then run, and report the first error in order — when any of them fails,
/// when a gradient or buffer differs from the weights in shape, kind or device (stacking would
/// hide it), or when some states have a buffer and some not.
fn stacked_if_valid(
    ws: &[Tensor],
    grads: &[Tensor],
    states: &[MuonState<Tensor>],
    entries: Entries,
) -> Option<Stacked> {
    let first = ws.first()?;
    let like = (first.size(), first.kind(), first.device());
    let same = |t: &&Tensor| (t.size(), t.kind(), t.device()) == like;
    let buffers: Vec<&Tensor> = states.iter().filter_map(|s| s.buffer()).collect();
    let uniform = buffers.is_empty() || buffers.len() == states.len();
    if !uniform || !grads.iter().all(|g| same(&g)) || !buffers.iter().all(same) {
        return None;
    }
    let valid = |group: &[&Tensor], check: bool| {
        stacked(group)
            .ok()
            .filter(|stacked| !check || stacked.validate("batch").is_ok())
    };
    let all = entries == Entries::All;
    let _weights = valid(&ws.iter().collect::<Vec<_>>(), true)?;
    let grads = valid(&grads.iter().collect::<Vec<_>>(), all)?;
    let buffers = match buffers.is_empty() {
        true => None,
        false => Some(valid(&buffers, all)?),
    };
    Some(Stacked { grads, buffers })
}

/// `group` (matrices of one shape, kind and device) as one (B·m)×n matrix: a view when they are
/// consecutive contiguous blocks of one storage — the row blocks of one weight or its gradient
/// (a fused QKV split by heads), or the buffers an earlier bank step left — else a copy.
fn stacked(group: &[&Tensor]) -> std::result::Result<Tensor, tch::TchError> {
    match consecutive(group) {
        Some(view) => Ok(view),
        None => Tensor::f_cat(group, 0),
    }
}

/// The view of [`stacked`], `None` when the matrices are not consecutive blocks. Addresses
/// alone cannot tell two storages that happen to be adjacent from one: `as_strided` checks that
/// the view lies inside the first matrix's storage, and that storage then holds the others.
fn consecutive(group: &[&Tensor]) -> Option<Tensor> {
    let first = group.first()?;
    let [m, n] = first.size()[..] else {
        return None;
    };
    let bytes = (m * n) as usize * first.kind().elt_size_in_bytes();
    let base = first.data_ptr() as usize;
    let placed = group.iter().enumerate().all(|(i, t)| {
        t.is_contiguous() && t.size() == [m, n] && t.data_ptr() as usize == base + i * bytes
    });
    if !placed || bytes == 0 {
        return None;
    }
    let rows = group.len() as i64 * m;
    first.f_as_strided([rows, n], [n, 1], None::<i64>).ok()
}

/// msign of every momentum input: one batched Newton–Schulz call for the schedule variants,
/// one msign per matrix otherwise (module docs). Each input is validated as msign validates it.
fn directions(c: &MuonConfig, us: &[&Tensor]) -> Result<Vec<Tensor>> {
    let Some(schedule) = batched_schedule(c.msign) else {
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
