//! Batched Newton–Schulz on `tch` (feature `tch`): B same-shape matrices, a 3-D tensor
//! [B, m, n], orthogonalized together, each step two `bmm` and one `baddbmm` call for the whole
//! batch instead of three products per matrix.
//!
//! # Math
//!
//! Slice i gets exactly what [`newton_schulz`](crate::newton_schulz()) does to it alone: the
//! same validation, the same wide orientation (all slices share one shape, so one orientation:
//! Xᵢ is transposed when m > n), the same normalization Xᵢ/(c·‖Xᵢ‖_F) (per matrix, with the same
//! power-of-two guards; in one pass for the whole batch when every slice is finite with a
//! factor 1/(c·‖Xᵢ‖_F) in [1e-30, 1e30], slice by slice otherwise), then for every step (a, b, c)
//!
//!   A = X·Xᵀ (`bmm`), B = b·A + c·A·A (`baddbmm`), X ← (B + a·I)·X (`bmm`),
//!
//! on the batch. Where a slice is large enough to be bound by arithmetic, not by calls, on a
//! CPU (f32/f64 tensors whose Gram products take the symmetric kernel, or bf16; the measured
//! crossover, which depends on libtorch's thread count, is `slices_go_alone`'s),
//! each slice instead runs [`newton_schulz`](crate::newton_schulz()) alone (the same bits as
//! the per-matrix call, then one stacking copy). Only the products differ from the per-matrix
//! path (a batched kernel may sum in another order than `mm`; a + B_ii rounds the same way,
//! in the working type, on both), so each slice agrees with
//! [`newton_schulz`](crate::newton_schulz()) to the rounding of those products in the working
//! type, amplified as the iteration amplifies any rounding (the tests bound it by the measured
//! amplification of an input perturbation of one unit roundoff). A zero slice stays zero. The
//! Gram form ([`gram_newton_schulz`](crate::gram_newton_schulz())) is not batched here.

use tch::{Device, Kind, Tensor};

use crate::error::{LinalgError, Result};
use crate::input::InputError;
use crate::newton_schulz::{check_normalization, prepare, NsSchedule, PolyStep, Prepared};
use crate::tch_backend::{backend, takes_syrk};

/// (B, m, n) of a 3-D tensor of a supported kind, or the error [`newton_schulz_batched`]
/// reports for it (argument `x`): not 3-D, another kind, or an empty batch or matrix.
fn batch_dims(x: &Tensor) -> Result<(i64, usize, usize)> {
    let [b, m, n] = x.size()[..] else {
        let found = format!("{:?}", x.size());
        return Err(InputError::shape_mismatch("x", "a 3-D tensor [B, m, n]", found).into());
    };
    if !matches!(x.kind(), Kind::Float | Kind::BFloat16 | Kind::Double) {
        return Err(LinalgError::UnsupportedDtype {
            arg: "x",
            dtype: format!("{:?}", x.kind()),
            supported: "Float (f32), BFloat16 (bf16), Double (f64)",
        });
    }
    if b == 0 || m == 0 || n == 0 {
        let (rows, cols) = (m.max(0) as usize, n.max(0) as usize);
        return Err(InputError::Empty {
            arg: "x",
            rows,
            cols,
        }
        .into());
    }
    Ok((b, m as usize, n as usize))
}

/// Runs a Newton–Schulz schedule on every slice of the 3-D tensor `x` = [B, m, n] at once (module
/// docs); returns a new tensor of `x`'s shape, kind and device.
///
/// Cost: B times the per-matrix flops of [`newton_schulz`](crate::newton_schulz()) in
/// 3 batched products per step (2 when c = 0) and an add to the B diagonals, plus the
/// normalization (one pass for the B norms, one for the scalings).
///
/// Errors: `x` not 3-D, of an unsupported kind or empty (argument `x`); a non-finite slice
/// ([`InputError::NonFinite`], argument `x`, the row and column inside the first such slice);
/// an invalid schedule, or one whose normalization does not suit the kind (as
/// [`newton_schulz`](crate::newton_schulz())); [`LinalgError::Overflow`] (argument `schedule`)
/// when a user schedule drives an iterate beyond the kind's range; libtorch failures.
///
/// ```
/// use kappa_linalg::{newton_schulz, newton_schulz_batched, NsSchedule};
/// let x = tch::Tensor::randn([4, 8, 5], (tch::Kind::Double, tch::Device::Cpu));
/// let s = NsSchedule::polar_express(10).unwrap();
/// let q = newton_schulz_batched(&x, &s).unwrap();
/// let q1 = newton_schulz(&x.get(1), &s).unwrap();
/// assert!((q.get(1) - q1).abs().max().double_value(&[]) < 1e-12);
/// ```
pub fn newton_schulz_batched(x: &Tensor, schedule: &NsSchedule) -> Result<Tensor> {
    let (b, m, n) = batch_dims(x)?;
    let _g = tch::no_grad_guard();
    if slices_go_alone(x, m, n) {
        return each_slice_alone(x, b, schedule);
    }
    let fros = crate::tch_backend::slice_frobenius_norms(x, "x")?;
    iterate_batch(x, &fros, schedule, false)
}

/// [`newton_schulz_batched`] on a batch whose slice norms are already known: the same result,
/// bit for bit, without the pass that sums the squares.
///
/// ```
/// use kappa_linalg::{newton_schulz_batched, newton_schulz_batched_normed, NormedBatch, NsSchedule};
/// let x = tch::Tensor::randn([4, 8, 5], (tch::Kind::Float, tch::Device::Cpu));
/// let s = NsSchedule::muon();
/// let q = newton_schulz_batched_normed(NormedBatch::new(x.copy()).unwrap(), &s).unwrap();
/// assert!(q.equal(&newton_schulz_batched(&x, &s).unwrap()));
/// ```
pub fn newton_schulz_batched_normed(x: NormedBatch, schedule: &NsSchedule) -> Result<Tensor> {
    let (b, m, n) = batch_dims(&x.batch)?;
    let _g = tch::no_grad_guard();
    if slices_go_alone(&x.batch, m, n) {
        return each_slice_alone(&x.batch, b, schedule);
    }
    iterate_batch(&x.batch, &x.fros, schedule, x.owned)
}

/// A 3-D tensor [B, m, n] with the Frobenius norm of each slice, the values
/// [`slice_frobenius_norms`](crate::tch_backend::slice_frobenius_norms) returns for it: the
/// input of [`newton_schulz_batched_normed`]. Made by [`NormedBatch::new`], or by a conversion
/// that sums the squares in the pass that writes the batch
/// ([`to_bf16_batch_normed`]).
#[derive(Debug)]
pub struct NormedBatch {
    batch: Tensor,
    fros: Vec<f64>,
    /// Whether no other tensor shares the batch's storage (made by a conversion here), so the
    /// normalization may scale it in place.
    owned: bool,
}

impl NormedBatch {
    /// `batch` with its slice norms. Errors: as [`newton_schulz_batched`] for its input (not
    /// 3-D, an unsupported kind, empty; a non-finite entry, with its row and column inside the
    /// first such slice), argument `x`.
    pub fn new(batch: Tensor) -> Result<Self> {
        batch_dims(&batch)?;
        let fros = crate::tch_backend::slice_frobenius_norms(&batch, "x")?;
        for (i, fro) in fros.iter().enumerate() {
            if !fro.is_finite() {
                // An infinite norm from finite f64 entries passes (the iteration rescales it).
                crate::Matrix::validate(&batch.f_select(0, i as i64).map_err(backend("x"))?, "x")?;
            }
        }
        Ok(Self {
            batch,
            fros,
            owned: false,
        })
    }

    /// For conversions that compute the norms as
    /// [`slice_frobenius_norms`](crate::tch_backend::slice_frobenius_norms) does, in the pass
    /// that wrote `batch` (a 3-D tensor, new and not shared), and have checked that they are
    /// finite.
    pub(crate) fn from_parts(batch: Tensor, fros: Vec<f64>) -> Self {
        Self {
            batch,
            fros,
            owned: true,
        }
    }

    /// ‖Xᵢ‖_F of every slice.
    pub fn fros(&self) -> &[f64] {
        &self.fros
    }

    /// The batch.
    pub fn batch(&self) -> &Tensor {
        &self.batch
    }
}

/// [`to_bf16_normed`](crate::tch_backend::to_bf16_normed) for every slice of a contiguous CPU
/// f32 tensor [B, m, n] in one read: the bf16 batch with the norm of each of its slices (the
/// values of [`slice_frobenius_norms`](crate::tch_backend::slice_frobenius_norms)), and ‖Xᵢ‖_F
/// of each input slice. `None` as for [`to_bf16_normed`](crate::tch_backend::to_bf16_normed)
/// (any slice with an entry that is not finite, or whose rounding is not).
///
/// ```
/// use kappa_linalg::batched::to_bf16_batch_normed;
/// use kappa_linalg::tch_backend::slice_frobenius_norms;
/// let x = tch::Tensor::randn([3, 4, 6], (tch::Kind::Float, tch::Device::Cpu));
/// let (normed, fros) = to_bf16_batch_normed(&x).unwrap();
/// assert_eq!(fros, slice_frobenius_norms(&x, "x").unwrap());
/// assert_eq!(normed.fros(), &slice_frobenius_norms(normed.batch(), "x").unwrap()[..]);
/// assert!(normed.batch().equal(&x.to_kind(tch::Kind::BFloat16)));
/// ```
#[allow(unsafe_code)]
pub fn to_bf16_batch_normed(x: &Tensor) -> Option<(NormedBatch, Vec<f64>)> {
    let [b, m, n] = x.size()[..] else {
        return None;
    };
    let run = (m * n) as usize;
    let contiguous_f32 = x.defined() && x.kind() == Kind::Float && x.is_contiguous();
    if !contiguous_f32 || x.device() != Device::Cpu || b <= 0 || run == 0 {
        return None;
    }
    let out = Tensor::f_empty(x.size(), (Kind::BFloat16, Device::Cpu)).ok()?;
    let count = b as usize * run;
    // SAFETY: as in `to_bf16_normed`: `x` is a defined, contiguous CPU f32 tensor of `count`
    // elements (checked above), only read while borrowed; `out` was just allocated here as a
    // contiguous CPU bf16 tensor of as many 16-bit elements, disjoint from `x`.
    let sums = unsafe {
        let x = std::slice::from_raw_parts(x.data_ptr().cast::<f32>(), count);
        let o = std::slice::from_raw_parts_mut(out.data_ptr().cast::<u16>(), count);
        let slices = x.chunks(run).zip(o.chunks_mut(run));
        slices
            .map(|(x, o)| crate::tch_backend::bf16_with_sums_of_squares(x, o))
            .collect::<Option<Vec<_>>>()?
    };
    normed_from_sums(out, &sums)
}

/// The bf16 batch `out` with its slice norms from the sums of squares (input, rounded) of each
/// slice's conversion, and the input norms; `None` when a sum is not finite.
fn normed_from_sums(out: Tensor, sums: &[(f64, f64)]) -> Option<(NormedBatch, Vec<f64>)> {
    if !sums.iter().all(|(i, r)| i.is_finite() && r.is_finite()) {
        return None;
    }
    let fros = sums.iter().map(|(_, r)| r.sqrt()).collect();
    let inputs = sums.iter().map(|(i, _)| i.sqrt()).collect();
    Some((NormedBatch::from_parts(out, fros), inputs))
}

/// [`to_bf16_batch_normed`] of a batch [B, m, n] whose f32 entries the caller writes slice by
/// slice: `fill(i, scratch)` writes slice i (m·n values, row-major) into `scratch`, which is
/// converted to bf16 with both sums of squares before the next slice is asked for, so the f32
/// batch never exists in memory (one slice of scratch, reused, stays in cache). Returns the
/// bf16 batch with its slice norms and ‖Xᵢ‖_F of the f32 slices; `None` for dimensions that are
/// not positive, or when a slice has an entry that is not finite or whose rounding is not.
///
/// ```
/// use kappa_linalg::batched::{to_bf16_batch_normed, to_bf16_batch_normed_from};
/// let x = tch::Tensor::randn([3, 4, 6], (tch::Kind::Float, tch::Device::Cpu));
/// let v = Vec::<f32>::try_from(x.flatten(0, -1)).unwrap();
/// let (normed, fros) = to_bf16_batch_normed_from([3, 4, 6], |i, s| {
///     s.copy_from_slice(&v[i * 24..(i + 1) * 24])
/// })
/// .unwrap();
/// let (direct, direct_fros) = to_bf16_batch_normed(&x).unwrap();
/// assert!(normed.batch().equal(direct.batch()));
/// assert_eq!((normed.fros(), &fros), (direct.fros(), &direct_fros));
/// ```
#[allow(unsafe_code)]
pub fn to_bf16_batch_normed_from(
    [b, m, n]: [i64; 3],
    mut fill: impl FnMut(usize, &mut [f32]),
) -> Option<(NormedBatch, Vec<f64>)> {
    if b <= 0 || m <= 0 || n <= 0 {
        return None;
    }
    let run = (m * n) as usize;
    let out = Tensor::f_empty([b, m, n], (Kind::BFloat16, Device::Cpu)).ok()?;
    let mut scratch = vec![0f32; run];
    // SAFETY: `out` was just allocated here as a contiguous CPU bf16 tensor of b·run 16-bit
    // elements; nothing else refers to it until it is returned.
    let o =
        unsafe { std::slice::from_raw_parts_mut(out.data_ptr().cast::<u16>(), b as usize * run) };
    let mut sums = Vec::with_capacity(b as usize);
    for (i, o) in o.chunks_mut(run).enumerate() {
        fill(i, &mut scratch);
        sums.push(crate::tch_backend::bf16_with_sums_of_squares(&scratch, o)?);
    }
    normed_from_sums(out, &sums)
}

/// The batched iteration on `x` (3-D, of a supported kind, not empty) with slice norms `fros`:
/// normalization (in place when `owned`: no other tensor shares `x`'s storage), the steps, the
/// overflow check, the orientation back.
fn iterate_batch(x: &Tensor, fros: &[f64], schedule: &NsSchedule, owned: bool) -> Result<Tensor> {
    let (mut xb, transposed) = match normalized_at_once(x, fros, schedule, owned)? {
        Some(prepared) => prepared,
        None => normalized_slice_by_slice(x, schedule)?,
    };
    // Two iterates alternate in two buffers (the normalized input, owned here, and one more),
    // so a call allocates one batch-sized buffer, not one per step.
    let mut spare: Option<Tensor> = None;
    for p in &schedule.steps {
        // X ← (B + a·I)·X, as `newton_schulz` folds a·X into the product.
        let poly = poly_part_batched(&xb, p)?;
        let _ = poly
            .f_diagonal(0, 1, 2)
            .and_then(|mut d| d.f_add_scalar_(p.a))
            .map_err(backend("x"))?;
        let next = match spare.take() {
            Some(t) => poly.f_bmm_out(&t, &xb),
            None => poly.f_bmm(&xb),
        }
        .map_err(backend("x"))?;
        spare = Some(std::mem::replace(&mut xb, next));
    }
    if !all_finite(&xb)? {
        return Err(LinalgError::Overflow {
            arg: "schedule",
            reason: "the polynomial steps drove the iterate beyond the element type's range".into(),
        });
    }
    Ok(if transposed {
        xb.f_transpose(1, 2).map_err(backend("x"))?
    } else {
        xb
    })
}

/// Whether every entry of `x` is finite: scanned in place where it can be (contiguous CPU
/// tensors), else one sum in the working kind (finite only if every entry is: finite entries
/// make it non-finite only by overflowing, which is the overflow the caller reports).
fn all_finite(x: &Tensor) -> Result<bool> {
    if let Some(finite) = crate::tch_backend::all_finite_in_place(x) {
        return Ok(finite);
    }
    let sum = x
        .f_sum(x.kind())
        .and_then(|f| f.f_double_value(&[]))
        .map_err(backend("x"))?;
    Ok(sum.is_finite())
}

/// Every slice through [`prepare`] (validation, orientation, normalization with its guards), then
/// stacked: the iteration's input in the wide orientation, and whether it was transposed.
fn normalized_slice_by_slice(x: &Tensor, schedule: &NsSchedule) -> Result<(Tensor, bool)> {
    let (b, _, _) = batch_dims(x)?;
    let mut slices = Vec::with_capacity(b as usize);
    let mut transposed = false;
    for i in 0..b {
        let (p, t) = prepare(&x.f_select(0, i).map_err(backend("x"))?, schedule)?;
        transposed = t;
        let (Prepared::Normalized(s) | Prepared::Zero(s)) = p;
        slices.push(s);
    }
    Ok((
        Tensor::f_stack(&slices, 0).map_err(backend("x"))?,
        transposed,
    ))
}

/// What [`normalized_slice_by_slice`] computes, from the slice norms `fros`, in one pass (one
/// libtorch product with the B factors for a tall or non-contiguous batch) when every slice
/// is the common case: every norm finite (so is every entry) and above 1e-140, and each factor
/// 1/(c·‖Xᵢ‖_F) in [1e-30, 1e30], which [`prepare`] applies as one factor too. `Ok(None)` sends
/// any other batch (a zero, tiny or huge slice, a non-finite entry: the per-slice path reports
/// which) slice by slice. The factor multiplies in the slice's arithmetic (f32 for f32 and
/// bf16, as `mul_scalar` keeps a Scalar), rounded once.
fn normalized_at_once(
    x: &Tensor,
    fros: &[f64],
    schedule: &NsSchedule,
    owned: bool,
) -> Result<Option<(Tensor, bool)>> {
    let (b, m, n) = batch_dims(x)?;
    if !fros.iter().all(|f| f.is_finite()) {
        return Ok(None);
    }
    // After the input's check, as `prepare` orders its errors.
    schedule.validate()?;
    check_normalization(x, schedule.normalization)?;
    let factors: Vec<f64> = fros
        .iter()
        .map(|&fro| (1.0 / fro) / schedule.normalization)
        .collect();
    // Each norm is the one `Matrix::frobenius_norm` returns for the slice above 1e-140 (below,
    // f64 squares lose bits and it rescales first); every non-zero f32/bf16 slice is above.
    let common =
        |(&fro, &f): (&f64, &f64)| fro > 1e-140 && f.is_finite() && (1e-30..=1e30).contains(&f);
    if fros.len() != b as usize || !fros.iter().zip(&factors).all(common) {
        return Ok(None);
    }
    if m <= n {
        if let Some(scaled) = crate::tch_backend::scaled_slices(x, &factors, owned) {
            return Ok(Some((scaled, false)));
        }
    }
    let transposed = m > n;
    let oriented = if transposed {
        x.f_transpose(1, 2)
    } else {
        Ok(x.shallow_clone())
    };
    let arithmetic = if x.kind() == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    };
    let normalized = Tensor::f_from_slice(&factors)
        .and_then(|f| f.f_reshape([b, 1, 1]))
        .and_then(|f| f.f_to_kind(arithmetic))
        .and_then(|f| f.f_to_device(x.device()))
        .and_then(|f| oriented?.f_mul(&f))
        .and_then(|y| y.f_to_kind(x.kind()))
        .and_then(|y| y.f_contiguous())
        .map_err(backend("x"))?;
    Ok(Some((normalized, transposed)))
}

/// Whether [`newton_schulz_batched`] runs the slices of a [B, m, n] batch of `x`'s kind and
/// device one by one (a caller that would stack them only for this call can skip the
/// stacking). r ≤ s are a slice's sides; the rule is a measured crossover.
///
/// **Symmetric product** (`takes_syrk`: CPU f32/f64, see [`crate::syrk`]): slices go alone when
/// r²s ≥ 2²², and on one libtorch thread also when r ≥ 48 and s ≥ 384. A slice alone computes
/// its Gram products in half the flops and keeps its iterate in the core's cache through all
/// the steps; the batch streams every slice through each product, in one call per product.
/// - Measured on one CPU thread, a 4-layer GPT's 16 matrices: batched `bmm` 0.69× the speed of
///   one symmetric-product call per matrix at 256 wide (r²s ≈ 5–7·10⁷); with the Gram products
///   alone taken slice by slice and the rest batched, the batched step was still 0.82–0.86× the
///   per-matrix one (AMD Zen 4), so the whole iteration goes slice by slice (then 0.92–0.97× at
///   one thread, 0.94–0.99× at two: the stacking copies).
/// - Below 2²², one thread (an AMD Zen 5; five quintic steps on batches of 12–36, medians of
///   seven alternated rounds), time alone / batched at r ≥ 48, s ≥ 384: 0.74–0.82 through
///   MKL's generic (AVX2) path, 0.65–0.93 through its AVX-512 path (48×768, 64×384, 64×768;
///   64×512 on the first). Narrower slices disagree between the two paths (at 16–32 rows
///   0.85–0.91 on the first, 0.75–1.12 on the second) and stay batched, as do slices with
///   s ≤ 256 (0.99–1.15, 2.4 at 16×256) and all slices on more threads, where the batch spreads
///   its slices over the threads and the two paths disagree too (64×768 on two threads: 1.6
///   and 0.69).
///
/// **CPU bf16** (no symmetric product): slices go alone when r²s ≥ 2²². Measured (AMD EPYC with
/// avx512_bf16, one thread), Muon's batched steps over a GPT-2-small's 48 hidden matrices (12
/// per shape, r²s ≥ 4.5·10⁸) took 1.29× the time of `torch.optim.Muon`'s per-matrix bf16
/// steps, one call per matrix 1.00×; batches of 64×768 head blocks (r²s ≈ 3·10⁶, below the
/// bound) stay 1.4× faster batched.
///
/// Every other batch (CUDA, or no symmetric product) is batched.
pub fn slices_go_alone(x: &Tensor, m: usize, n: usize) -> bool {
    let (r, s) = (m.min(n), m.max(n));
    if x.device() == tch::Device::Cpu && x.kind() == Kind::BFloat16 {
        return r * r * s >= 1 << 22;
    }
    takes_syrk(x) && (r * r * s >= 1 << 22 || (tch::get_num_threads() == 1 && r >= 48 && s >= 384))
}

/// Every slice through [`newton_schulz`](crate::newton_schulz()) on its own, stacked: bit for
/// bit the per-matrix results, with the per-matrix errors (a non-finite entry's row and column
/// are inside its slice).
fn each_slice_alone(x: &Tensor, b: i64, schedule: &NsSchedule) -> Result<Tensor> {
    let mut out = Vec::with_capacity(b as usize);
    for i in 0..b {
        out.push(crate::newton_schulz(
            &x.f_select(0, i).map_err(backend("x"))?,
            schedule,
        )?);
    }
    Tensor::f_stack(&out, 0).map_err(backend("x"))
}

/// The polynomial part B = b·A + c·A², A = X·Xᵀ, of one step for every slice of `xb`: one `bmm`
/// and one `baddbmm` for the batch.
fn poly_part_batched(xb: &Tensor, p: &PolyStep) -> Result<Tensor> {
    let a = xb
        .f_bmm(&xb.f_transpose(1, 2).map_err(backend("x"))?)
        .map_err(backend("x"))?;
    if p.c != 0.0 {
        a.f_baddbmm(&a, &a, p.b, p.c)
    } else {
        a.f_mul_scalar(p.b)
    }
    .map_err(backend("x"))
}

/// [`newton_schulz_batched`] on a slice of same-shape 2-D matrices (stacked first): the
/// results, one per input, as slices of one batch tensor.
///
/// Errors: an empty list or matrices of different shapes, kinds or devices (argument `xs`), and
/// everything [`newton_schulz_batched`] reports.
pub fn newton_schulz_each(xs: &[Tensor], schedule: &NsSchedule) -> Result<Vec<Tensor>> {
    let first = xs
        .first()
        .ok_or_else(|| LinalgError::from(InputError::invalid("xs", "an empty list")))?;
    let like = (first.size(), first.kind(), first.device());
    if let Some(x) = xs.iter().find(|x| (x.size(), x.kind(), x.device()) != like) {
        let found = format!("{:?} {:?} on {:?}", x.size(), x.kind(), x.device());
        let want = format!(
            "{:?} {:?} on {:?} (the first matrix)",
            like.0, like.1, like.2
        );
        return Err(InputError::shape_mismatch("xs", want, found).into());
    }
    if first.dim() != 2 {
        let found = format!("{:?}", first.size());
        return Err(InputError::shape_mismatch("xs", "2-D matrices", found).into());
    }
    let _g = tch::no_grad_guard();
    let batch = Tensor::f_stack(xs, 0).map_err(backend("xs"))?;
    let out = newton_schulz_batched(&batch, schedule)?;
    (0..xs.len() as i64)
        .map(|i| out.f_select(0, i).map_err(backend("xs")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::newton_schulz;

    /// Unit roundoff of the kind.
    fn unit(kind: Kind) -> f64 {
        match kind {
            Kind::Double => f64::EPSILON / 2.0,
            _ => f32::EPSILON as f64 / 2.0,
        }
    }

    fn max_abs(t: &Tensor) -> f64 {
        t.abs().max().to_kind(Kind::Double).double_value(&[])
    }

    /// The batched result agrees with the per-matrix one slice by slice within the derived
    /// bound: the per-matrix path's response d_in to a relative perturbation of one unit
    /// roundoff of its input (measured, floored at u·max|out|) bounds the effect of one
    /// rounding injection; the batched path differs from it by the rounding of 3 products per
    /// step, each of length ≤ k (the longer side), so tol = 3·steps·√k·max(d_in, u·max|out|)
    /// (the probabilistic √k growth of Higham & Mary, as kappa-optim's backend tests use).
    #[test]
    fn batched_slices_agree_with_per_matrix_newton_schulz() {
        tch::manual_seed(7);
        let schedules = [NsSchedule::muon(), NsSchedule::polar_express(10).unwrap()];
        for kind in [Kind::Double, Kind::Float] {
            // With a zero slice, or one whose f64 norm is below 1e-140 (squares in the subnormal range), the batch is normalized
            // slice by slice; with neither, all at once.
            for ((b, m, n), (with_zero, tiny)) in [(3, 24, 24), (4, 40, 16), (2, 16, 40)]
                .into_iter()
                .flat_map(|shape| {
                    [
                        (shape, (true, false)),
                        (shape, (false, false)),
                        (shape, (false, true)),
                    ]
                })
            {
                let x = Tensor::randn([b, m, n], (kind, Device::Cpu));
                if with_zero {
                    let _ = x.get(b - 1).zero_();
                }
                if tiny && kind == Kind::Double {
                    let _ = x.get(0).g_mul_scalar_(1e-160);
                }
                for s in &schedules {
                    let q = newton_schulz_batched(&x, s).unwrap();
                    assert_eq!(q.size(), x.size());
                    let u = unit(kind);
                    let k = m.max(n) as f64;
                    for i in 0..b {
                        let xi = x.get(i);
                        let one = newton_schulz(&xi, s).unwrap();
                        let noise = Tensor::randn([m, n], (kind, Device::Cpu)).sign() * u;
                        let perturbed = &xi * (noise + 1.0);
                        let d_in = max_abs(&(newton_schulz(&perturbed, s).unwrap() - &one));
                        let floor = u * max_abs(&one);
                        let tol = 3.0 * s.steps.len() as f64 * k.sqrt() * d_in.max(floor);
                        let d = max_abs(&(q.get(i) - &one));
                        assert!(d <= tol, "{kind:?} {b}×{m}×{n} slice {i}: {d:e} > {tol:e}");
                    }
                    if with_zero {
                        assert_eq!(max_abs(&q.get(b - 1)), 0.0, "a zero slice stays zero");
                    }
                }
            }
        }
    }

    /// The one-pass normalization writes what libtorch's product with the factors as a
    /// [B, 1, 1] tensor of the arithmetic type writes (then rounded to the kind), bit for bit:
    /// f32, f64, and bf16 (its products in f32, each rounded once to bf16, ties and subnormal
    /// results included).
    #[test]
    fn the_one_pass_scaling_is_libtorchs_product_bit_for_bit() {
        tch::manual_seed(11);
        for kind in [Kind::Float, Kind::Double, Kind::BFloat16] {
            let x = Tensor::randn([5, 7, 19], (kind, Device::Cpu));
            // A tiny factor sends bf16 and f32 products into the subnormal range.
            let factors = [0.37, 1.0 / 3.0, 1e-39, 2.5e7, 0.125];
            let fast = crate::tch_backend::scaled_slices(&x, &factors, false).unwrap();
            let owned = x.copy();
            let in_place = crate::tch_backend::scaled_slices(&owned, &factors, true).unwrap();
            assert_eq!(
                in_place.data_ptr(),
                owned.data_ptr(),
                "scaled where it lies"
            );
            let arithmetic = if kind == Kind::Double {
                kind
            } else {
                Kind::Float
            };
            let f = Tensor::from_slice(&factors)
                .reshape([5, 1, 1])
                .to_kind(arithmetic);
            let reference = (x.to_kind(arithmetic) * f).to_kind(kind);
            assert_eq!(fast.kind(), kind);
            assert!(fast.equal(&reference), "{kind:?}");
            assert!(in_place.equal(&reference), "{kind:?} in place");
        }
        // Not contiguous, or a factor count that is not B: not taken.
        let x = Tensor::randn([2, 4, 3], (Kind::Float, Device::Cpu));
        let scaled = |x: &Tensor, f: &[f64]| crate::tch_backend::scaled_slices(x, f, false);
        assert!(scaled(&x.transpose(1, 2), &[1.0, 1.0]).is_none());
        assert!(scaled(&x, &[1.0]).is_none());
    }

    /// Known norms change nothing: the normed call returns the plain call's bits, for a bf16
    /// batch made in one pass and for an f32 batch; a batch with a NaN is refused with its
    /// place.
    #[test]
    fn the_normed_batch_gives_the_plain_result() {
        tch::manual_seed(12);
        let s = NsSchedule::muon();
        let x = Tensor::randn([6, 16, 48], (Kind::Float, Device::Cpu));
        let (bf16, _) = to_bf16_batch_normed(&x).unwrap();
        let plain = newton_schulz_batched(&x.to_kind(Kind::BFloat16), &s).unwrap();
        assert!(newton_schulz_batched_normed(bf16, &s)
            .unwrap()
            .equal(&plain));
        let normed = NormedBatch::new(x.copy()).unwrap();
        let plain = newton_schulz_batched(&x, &s).unwrap();
        assert!(newton_schulz_batched_normed(normed, &s)
            .unwrap()
            .equal(&plain));
        let _ = x.get(3).get(2).get(5).fill_(f64::NAN);
        assert!(to_bf16_batch_normed(&x).is_none());
        assert!(matches!(
            NormedBatch::new(x),
            Err(LinalgError::Input(InputError::NonFinite {
                arg: "x",
                row: 2,
                col: 5,
                ..
            }))
        ));
    }

    #[test]
    fn bad_batches_are_typed_errors() {
        let s = NsSchedule::muon();
        let two_d = Tensor::zeros([3, 3], (Kind::Float, Device::Cpu));
        assert!(matches!(
            newton_schulz_batched(&two_d, &s),
            Err(LinalgError::Input(InputError::ShapeMismatch {
                arg: "x",
                ..
            }))
        ));
        let empty = Tensor::zeros([0, 3, 3], (Kind::Float, Device::Cpu));
        assert!(matches!(
            newton_schulz_batched(&empty, &s),
            Err(LinalgError::Input(InputError::Empty { arg: "x", .. }))
        ));
        let ints = Tensor::zeros([2, 3, 3], (Kind::Int64, Device::Cpu));
        assert!(matches!(
            newton_schulz_batched(&ints, &s),
            Err(LinalgError::UnsupportedDtype { arg: "x", .. })
        ));
        let nan = Tensor::ones([2, 3, 3], (Kind::Float, Device::Cpu));
        let _ = nan.get(1).get(2).get(0).fill_(f64::NAN);
        assert!(matches!(
            newton_schulz_batched(&nan, &s),
            Err(LinalgError::Input(InputError::NonFinite {
                arg: "x",
                row: 2,
                col: 0,
                ..
            }))
        ));
        let a = Tensor::ones([3, 3], (Kind::Float, Device::Cpu));
        let b = Tensor::ones([3, 2], (Kind::Float, Device::Cpu));
        assert!(matches!(
            newton_schulz_each(&[a, b], &s),
            Err(LinalgError::Input(InputError::ShapeMismatch {
                arg: "xs",
                ..
            }))
        ));
        assert!(newton_schulz_each(&[], &s).is_err());
    }
}
