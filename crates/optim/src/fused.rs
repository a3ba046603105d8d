//! One-pass kernels over the raw f32 data of contiguous CPU tensors (the `tch` feature), for the
//! memory-bound parts of a training step that libtorch runs as chains of whole-tensor
//! operations:
//!
//! * Muon's momentum (`Momentum`'s recursion, run through
//!   [`Elementwise::momentum_in_one_pass`](crate::Elementwise::momentum_in_one_pass)): the
//!   operation-by-operation form copies g, scales it, copies it again and adds twice (Keller's
//!   EMA-Nesterov: 5 libtorch calls, 12 passes); this kernel reads g and B once and writes the new
//!   B and U once: 4 passes. It rounds as libtorch's AVX2 and AVX-512 kernels do — the factor to
//!   f32, w_g·g once, each a + β·b once (their `addcmul_` compiles to a fused multiply-add) — on
//!   every CPU: libtorch's own result depends on the kernel it dispatches to (its generic kernel,
//!   `ATEN_CPU_CAPABILITY=default`, rounds β·b and the sum separately).
//! * the AdamW update ([`AdamWKernel::Fused`](crate::AdamWKernel::Fused), run by
//!   [`AdamW::step_tensors`](crate::AdamW::step_tensors)). libtorch's op-by-op form (PyTorch's
//!   default on the CPU, its single-tensor loop) makes about 20 passes over parameter-sized
//!   memory per step (each of `mul_`, `lerp_`, `mul_`, `addcmul_`, `sqrt`, `div`, `add_`,
//!   `addcdiv_` reads one to three tensors and writes one, some of them temporaries); this kernel
//!   reads p, g, m, v once and writes p, m, v once: 7 passes.
//! * [`sum_of_squares`]: Σ g² over every gradient, for the clipping norm, in one read
//!   (libtorch's `to_kind(Double).square().sum()` reads and writes f64 copies: about 9 passes
//!   in units of the f32 tensor); [`all_finite`]: whether every gradient entry is finite, in one
//!   read (the optimizer's gradient check).
//!
//! Both compute each element in f64 from the f32 inputs and round once when they store, so the
//! result of every element is a pure function of that element's inputs: the work can be split
//! among threads in any way without changing a bit, and the result does not depend on the
//! thread count. The sum adds squares (exact in f64) in fixed chunks of `CHUNK` = 2¹⁴ elements
//! with 8 interleaved accumulators and adds the chunk sums in order; the chunking does not
//! depend on the thread count either.
//!
//! Eligibility is checked, never assumed: every tensor must be defined, `Float`, on the CPU and
//! contiguous, the tensors of one parameter must have equal element counts, and no tensor that
//! is written may share memory with any other tensor of the call. Callers fall back to
//! libtorch's operations when a check fails (`None`).
//!
//! The kernels write through `data_ptr`, which bypasses autograd's version counter: a graph
//! still holding a parameter from before the step would not notice that it changed. A training
//! loop frees the graph at every backward pass, as the tch-rs optimizers assume too.

use tch::{Device, Kind, Tensor};

use crate::adamw::AdamWScalars;

/// Elements per work unit (and per partial sum of [`sum_of_squares`]).
pub const CHUNK: usize = 1 << 14;
/// Interleaved accumulators of one partial sum (independent chains the compiler vectorizes).
pub const LANES: usize = 8;
/// Below this many elements in total a call runs on the calling thread only.
const PARALLEL_MIN: usize = 1 << 17;
/// The same for the momentum pass, called once per matrix (or bank) and step: starting threads
/// costs more than they save below this size (measured at 384², 1.5·10⁵ entries: 0.3 → 0.7–0.9 ms
/// of work outside msign per two-thread step with threads started; one 4-pass sweep there takes
/// about 0.1 ms).
const MOMENTUM_PARALLEL_MIN: usize = 1 << 21;

/// One element of AdamW, in f64 from f32 inputs, each stored value rounded once (the formulas of
/// [`AdamWScalars::moments`] and [`AdamWScalars::param`]); p is updated with the stored (rounded)
/// m and v, as libtorch's op-by-op form uses them.
#[inline(always)]
fn adamw_element(p: &mut f32, g: f32, m: &mut f32, v: &mut f32, c: &AdamWScalars) {
    let (m1, v1) = c.moments(f64::from(*m), f64::from(*v), f64::from(g));
    let (m1, v1) = (m1 as f32, v1 as f32);
    *p = c.param(f64::from(*p), f64::from(m1), f64::from(v1)) as f32;
    *m = m1;
    *v = v1;
}

/// AdamW on slices of equal length, in the widest vector instructions this CPU has.
///
/// f64 sqrt and division dominate the element's cost, so the loop is compiled again with
/// AVX-512F and with AVX2 enabled (the compiler vectorizes it 8 or 4 lanes wide instead of
/// SSE2's 2) and the widest one the CPU supports runs. Every version computes the same IEEE
/// f64 operations, each correctly rounded whatever the vector width, and Rust never contracts
/// a product and a sum into an fma: the results are identical bit for bit.
#[allow(unsafe_code)]
fn adamw_slices(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: &AdamWScalars) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked just above), the only requirement of
            // a `target_feature(enable = "avx512f")` function.
            return unsafe { adamw_slices_avx512(p, g, m, v, c) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { adamw_slices_avx2(p, g, m, v, c) };
        }
    }
    adamw_slices_portable(p, g, m, v, c);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn adamw_slices_avx512(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: &AdamWScalars) {
    adamw_slices_portable(p, g, m, v, c);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn adamw_slices_avx2(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: &AdamWScalars) {
    adamw_slices_portable(p, g, m, v, c);
}

/// The loop itself, inlined into each instruction-set version.
#[inline(always)]
fn adamw_slices_portable(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: &AdamWScalars) {
    for (((p, g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        adamw_element(p, *g, m, v, c);
    }
}

/// Σ x² of one chunk in f64 ([`kappa_linalg::scalar::sum_of_squares`]: eight accumulators over
/// the interleaved elements, then the lanes and the tail added in order).
fn chunk_sum_of_squares(x: &[f32]) -> f64 {
    kappa_linalg::scalar::sum_of_squares(x, f64::from)
}

/// Whether `t` is a defined, dense, contiguous CPU f32 tensor (the layout checks come first:
/// libtorch's contiguity query throws on a sparse tensor).
fn eligible(t: &Tensor) -> bool {
    t.defined()
        && !t.is_sparse()
        && !t.is_mkldnn()
        && t.f_kind().ok() == Some(Kind::Float)
        && t.device() == Device::Cpu
        && t.is_contiguous()
}

/// The byte range of a contiguous f32 tensor's elements.
fn byte_range(t: &Tensor) -> (usize, usize) {
    let start = t.data_ptr() as usize;
    (start, start + t.numel() * std::mem::size_of::<f32>())
}

/// Whether any of the `written` ranges overlaps another range of `written` or of `read`.
fn overlapping(written: &[(usize, usize)], read: &[(usize, usize)]) -> bool {
    let mut all: Vec<(usize, usize, bool)> = written
        .iter()
        .map(|&(a, b)| (a, b, true))
        .chain(read.iter().map(|&(a, b)| (a, b, false)))
        .filter(|&(a, b, _)| b > a)
        .collect();
    all.sort_unstable();
    // After sorting by start, a range overlaps some earlier one iff it starts before the
    // largest end so far; track that end and whether a written range reaches it.
    let mut reach: Option<(usize, bool)> = None;
    for (a, b, w) in all {
        if let Some((end, end_written)) = reach {
            if a < end && (w || end_written) {
                return true;
            }
            // Two read ranges may overlap (a gradient read twice is harmless); keep the
            // furthest end, marked written if any range reaching that far is.
            if b > end {
                reach = Some((b, w));
            } else if b == end {
                reach = Some((end, end_written || w));
            }
        } else {
            reach = Some((b, w));
        }
    }
    false
}

/// Contiguous runs of at most [`CHUNK`] elements, split among `workers` lists of about equal
/// total length, in order.
fn split_work<T>(items: Vec<(usize, T)>, workers: usize) -> Vec<Vec<T>> {
    let total: usize = items.iter().map(|(n, _)| n).sum();
    let share = total.div_ceil(workers.max(1)).max(1);
    let mut out: Vec<Vec<T>> = vec![Vec::new()];
    let mut filled = 0usize;
    for (n, item) in items {
        if filled >= share && out.len() < workers {
            out.push(Vec::new());
            filled = 0;
        }
        filled += n;
        if let Some(last) = out.last_mut() {
            last.push(item);
        }
    }
    out
}

/// Runs `work` on every list, the first on the calling thread and the others on scoped
/// threads.
fn run_parallel<T: Send>(mut lists: Vec<Vec<T>>, work: impl Fn(Vec<T>) + Sync) {
    if lists.len() <= 1 {
        if let Some(list) = lists.pop() {
            work(list);
        }
        return;
    }
    let first = lists.remove(0);
    std::thread::scope(|scope| {
        let work = &work;
        for list in lists {
            scope.spawn(move || work(list));
        }
        work(first);
    });
}

/// Workers for `total` elements: libtorch's intra-op thread count, 1 for calls below `min`.
fn workers_from(total: usize, min: usize) -> usize {
    if total < min {
        1
    } else {
        usize::try_from(tch::get_num_threads()).unwrap_or(1).max(1)
    }
}

/// One AdamW step over `(param, grad, exp_avg, exp_avg_sq, scalars)` items, in place, in one
/// pass; `None` (nothing written) when some tensor is not eligible (see the module docs).
pub(crate) fn adamw(items: &[AdamWItem<'_>]) -> Option<()> {
    adamw_on(items, None)
}

/// One parameter of an AdamW step: p, g, m, v and the step's scalars.
pub(crate) type AdamWItem<'a> = (&'a Tensor, &'a Tensor, &'a Tensor, &'a Tensor, AdamWScalars);

/// [`adamw`] on `threads` workers (libtorch's thread count when `None`).
#[allow(unsafe_code)]
pub(crate) fn adamw_on(items: &[AdamWItem<'_>], threads: Option<usize>) -> Option<()> {
    let mut written = Vec::with_capacity(3 * items.len());
    let mut read = Vec::with_capacity(items.len());
    for (p, g, m, v, _) in items {
        if ![p, g, m, v].iter().all(|t| eligible(t)) {
            return None;
        }
        let n = p.numel();
        if g.numel() != n || m.numel() != n || v.numel() != n {
            return None;
        }
        written.extend([byte_range(p), byte_range(m), byte_range(v)]);
        read.push(byte_range(g));
    }
    if overlapping(&written, &read) {
        return None;
    }
    let mut runs = Vec::new();
    for (p, g, m, v, c) in items {
        let n = p.numel();
        if n == 0 {
            continue;
        }
        // SAFETY: each tensor is a defined, contiguous CPU f32 tensor of n elements (checked
        // above), so its data pointer addresses n initialized, aligned f32 values that stay
        // alive while the caller borrows the tensors (for this whole call). No written range
        // overlaps any other range of the call (checked above), so the mutable slices are
        // exclusive and the shared ones are not written while they live. libtorch does not
        // touch these tensors meanwhile: the caller holds them and runs no libtorch operation
        // on them until this function returns.
        let (p, g, m, v) = unsafe {
            (
                std::slice::from_raw_parts_mut(p.data_ptr().cast::<f32>(), n),
                std::slice::from_raw_parts(g.data_ptr().cast::<f32>(), n),
                std::slice::from_raw_parts_mut(m.data_ptr().cast::<f32>(), n),
                std::slice::from_raw_parts_mut(v.data_ptr().cast::<f32>(), n),
            )
        };
        let pieces = p
            .chunks_mut(CHUNK)
            .zip(g.chunks(CHUNK))
            .zip(m.chunks_mut(CHUNK))
            .zip(v.chunks_mut(CHUNK));
        for (((p, g), m), v) in pieces {
            runs.push((p.len(), (p, g, m, v, *c)));
        }
    }
    let total = runs.iter().map(|(n, _)| n).sum();
    let lists = split_work(
        runs,
        threads.unwrap_or_else(|| workers_from(total, PARALLEL_MIN)),
    );
    run_parallel(lists, |list| {
        for (p, g, m, v, c) in list {
            adamw_slices(p, g, m, v, &c);
        }
    });
    Some(())
}

/// Momentum's factors, as libtorch applies them to f32 tensors on its AVX2 and AVX-512 kernels:
/// `mul_` by a scalar rounds the factor to f32 and the product once; `Matrix::axpy`'s `addcmul_`
/// with a 0-d f32 factor compiles to a fused multiply-add (one rounding of a + β·b).
#[derive(Clone, Copy)]
struct MomentumScalars {
    /// w_g rounded to f32; `None` for w_g = 1 (the SGD form skips the scaling).
    grad_weight: Option<f32>,
    beta: f32,
}

impl MomentumScalars {
    /// t = fl(w_g·g), the buffer's first term and Nesterov's.
    #[inline(always)]
    fn weighted(&self, g: f32) -> f32 {
        self.grad_weight.map_or(g, |w| g * w)
    }

    /// fl(a + β·b), one rounding (`f32::mul_add`: the same value on every CPU).
    #[inline(always)]
    fn plus_beta_times(&self, a: f32, b: f32) -> f32 {
        b.mul_add(self.beta, a)
    }
}

/// One work unit of [`momentum`]: the gradient and old buffer read, the new buffer and
/// Nesterov's input written.
type MomentumUnit<'a> = (
    &'a [f32],
    Option<&'a [f32]>,
    &'a mut [f32],
    Option<&'a mut [f32]>,
);

/// One unit on the widest fused multiply-add this CPU has: `mul_add` inlines to one instruction
/// with the FMA extension and is a library call without it (the same value either way).
#[allow(unsafe_code)]
fn momentum_unit(c: &MomentumScalars, unit: MomentumUnit<'_>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above), the only requirement of a
        // `target_feature(enable = "avx2,fma")` function.
        return unsafe { momentum_unit_fma(c, unit) };
    }
    momentum_unit_portable(c, unit);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn momentum_unit_fma(c: &MomentumScalars, unit: MomentumUnit<'_>) {
    momentum_unit_portable(c, unit);
}

/// B_new = t + β·B (t alone before the first step), U = t + β·B_new.
#[inline(always)]
fn momentum_unit_portable(c: &MomentumScalars, (g, old, buf, u): MomentumUnit<'_>) {
    match old {
        Some(old) => {
            for ((b, &g), &o) in buf.iter_mut().zip(g).zip(old) {
                *b = c.plus_beta_times(c.weighted(g), o);
            }
        }
        None => {
            for (b, &g) in buf.iter_mut().zip(g) {
                *b = c.weighted(g);
            }
        }
    }
    if let Some(u) = u {
        for ((u, &g), &b) in u.iter_mut().zip(g).zip(buf.iter()) {
            *u = c.plus_beta_times(c.weighted(g), b);
        }
    }
}

/// Momentum's recursion on a CPU f32 gradient (and buffer) in one pass per chunk (module
/// docs): `Some((new buffer, Nesterov input))` in new contiguous tensors, or `None` when an
/// operand is not eligible or the buffer's shape is not the gradient's (then the caller runs
/// the operations, which report the mismatch). t = fl(w_g·g) is computed
/// again for U instead of stored: the same rounding, no third buffer.
#[allow(unsafe_code)]
pub(crate) fn momentum(
    grad: &Tensor,
    buffer: Option<&Tensor>,
    grad_weight: f64,
    beta: f64,
    nesterov: bool,
) -> Option<(Tensor, Option<Tensor>)> {
    let n = grad.numel();
    if !eligible(grad) || buffer.is_some_and(|b| !eligible(b) || b.size() != grad.size()) {
        return None;
    }
    let c = MomentumScalars {
        grad_weight: (grad_weight != 1.0).then_some(grad_weight as f32),
        beta: beta as f32,
    };
    let fresh = || Tensor::f_empty(grad.size(), (Kind::Float, Device::Cpu)).ok();
    let buf = fresh()?;
    let u = if nesterov { Some(fresh()?) } else { None };
    if n > 0 {
        // SAFETY: `grad` and `buffer` are defined, contiguous CPU f32 tensors of n elements
        // (checked above), alive and not written while the caller borrows them; `buf` and `u`
        // were just allocated here as contiguous CPU f32 tensors of n elements, so their data is
        // aligned, disjoint from every other range of this call and from each other, and
        // nothing else refers to it until this function returns them.
        let (g, old, b, u) = unsafe {
            (
                std::slice::from_raw_parts(grad.data_ptr().cast::<f32>(), n),
                buffer.map(|b| std::slice::from_raw_parts(b.data_ptr().cast::<f32>(), n)),
                std::slice::from_raw_parts_mut(buf.data_ptr().cast::<f32>(), n),
                u.as_ref()
                    .map(|u| std::slice::from_raw_parts_mut(u.data_ptr().cast::<f32>(), n)),
            )
        };
        let mut olds = old.map(|o| o.chunks(CHUNK));
        let mut us = u.map(|u| u.chunks_mut(CHUNK));
        let units: Vec<(usize, MomentumUnit<'_>)> = g
            .chunks(CHUNK)
            .zip(b.chunks_mut(CHUNK))
            .map(|(g, b)| {
                let unit = (
                    g,
                    olds.as_mut().and_then(Iterator::next),
                    b,
                    us.as_mut().and_then(Iterator::next),
                );
                (g.len(), unit)
            })
            .collect();
        run_parallel(
            split_work(units, workers_from(n, MOMENTUM_PARALLEL_MIN)),
            |list| {
                for unit in list {
                    momentum_unit(&c, unit);
                }
            },
        );
    }
    Some((buf, u))
}

/// [`momentum`] on a batch of `dims` = [B, m, n] slices whose Muon input goes to bf16: the new
/// buffer, as [`momentum`] writes it, and the input U (Nesterov's, or the new buffer) converted
/// slice by slice as `to_kind` converts it, with its norms
/// ([`kappa_linalg::batched::to_bf16_batch_normed_from`]): U exists only in a scratch of one
/// slice, so it costs no write and no read of memory. Returns the buffer, the bf16 batch with
/// its norms, and ‖Uᵢ‖_F of each f32 slice; `None` when an operand is not eligible, shapes
/// differ from `dims`, or a slice of U (or its rounding) is not finite (the caller then runs
/// the two steps apart, which report it).
#[allow(unsafe_code)]
pub(crate) fn momentum_to_bf16(
    grad: &Tensor,
    buffer: Option<&Tensor>,
    grad_weight: f64,
    beta: f64,
    nesterov: bool,
    dims: [i64; 3],
) -> Option<(Tensor, kappa_linalg::NormedBatch, Vec<f64>)> {
    let n = grad.numel();
    let fits = |t: &Tensor| eligible(t) && t.numel() == n;
    if !fits(grad) || buffer.is_some_and(|b| !fits(b)) || dims.iter().product::<i64>() != n as i64 {
        return None;
    }
    let c = MomentumScalars {
        grad_weight: (grad_weight != 1.0).then_some(grad_weight as f32),
        beta: beta as f32,
    };
    let buf = Tensor::f_empty(grad.size(), (Kind::Float, Device::Cpu)).ok()?;
    let run = (dims[1] * dims[2]).max(1) as usize;
    // SAFETY: `grad` and `buffer` are defined, contiguous CPU f32 tensors of n elements (checked
    // above), alive and not written while the caller borrows them; `buf` was just allocated here
    // as a contiguous CPU f32 tensor of n elements, disjoint from them, and nothing else refers
    // to it until this function returns it.
    let (g, old, b) = unsafe {
        (
            std::slice::from_raw_parts(grad.data_ptr().cast::<f32>(), n),
            buffer.map(|b| std::slice::from_raw_parts(b.data_ptr().cast::<f32>(), n)),
            std::slice::from_raw_parts_mut(buf.data_ptr().cast::<f32>(), n),
        )
    };
    let fill = |i: usize, u: &mut [f32]| {
        let r = i * run..(i + 1) * run;
        let old = old.map(|o| &o[r.clone()]);
        if nesterov {
            momentum_unit(&c, (&g[r.clone()], old, &mut b[r], Some(u)));
        } else {
            momentum_unit(&c, (&g[r.clone()], old, &mut b[r.clone()], None));
            u.copy_from_slice(&b[r]);
        }
    };
    let (normed, fros) = kappa_linalg::batched::to_bf16_batch_normed_from(dims, fill)?;
    Some((buf, normed, fros))
}

/// Σ g² over every element of `tensors`, in f64; `None` when some tensor is not eligible (not a
/// contiguous CPU f32 tensor). Undefined tensors (parameters without a gradient) count as
/// empty. Each square is exact in f64 and fixed chunks are added in order, so the value does not
/// depend on the thread count.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// let g = Tensor::from_slice(&[3.0f32, 4.0]);
/// assert_eq!(kappa_optim::fused::sum_of_squares(&[g, Tensor::new()]), Some(25.0));
/// let strided = Tensor::arange(4, (Kind::Float, Device::Cpu)).slice(0, 0, None, 2);
/// assert_eq!(kappa_optim::fused::sum_of_squares(&[strided]), None);
/// ```
pub fn sum_of_squares(tensors: &[Tensor]) -> Option<f64> {
    let partial = per_chunk(tensors, None, 0f64, chunk_sum_of_squares)?;
    Some(partial.iter().sum())
}

/// Whether every entry of every defined tensor in `tensors` is finite, in one read of each;
/// `None` when some defined tensor is not a contiguous CPU f32 tensor. Each chunk is
/// `kappa_linalg::input::all_finite`'s fold of acc + v·0 in eight f32 lanes: v·0 is 0 for a
/// finite v and NaN for ±∞ and NaN, so the fold is 0 exactly when every entry is finite.
/// Single-precision lanes read memory at about twice the rate of [`sum_of_squares`]'s f64 ones,
/// which is why a finiteness check uses this pass.
///
/// ```
/// use tch::Tensor;
/// let g = Tensor::from_slice(&[3.0f32, -4.0]);
/// assert_eq!(kappa_optim::fused::all_finite(&[g, Tensor::new()]), Some(true));
/// let h = Tensor::from_slice(&[1.0f32, f32::NEG_INFINITY]);
/// assert_eq!(kappa_optim::fused::all_finite(&[h]), Some(false));
/// ```
pub fn all_finite(tensors: &[Tensor]) -> Option<bool> {
    all_finite_on(tensors, None)
}

/// [`all_finite`] on `threads` workers (`None`: libtorch's intra-op thread count).
fn all_finite_on(tensors: &[Tensor], threads: Option<usize>) -> Option<bool> {
    let finite = |c: &[f32]| {
        let row = ndarray::ArrayView1::from(c).insert_axis(ndarray::Axis(0));
        kappa_linalg::input::all_finite(&row)
    };
    let chunks = per_chunk(tensors, threads, true, finite)?;
    Some(chunks.iter().all(|&f| f))
}

/// `f` of every chunk of at most [`CHUNK`] elements of the defined tensors of `tensors`, in
/// order, split among `threads` workers (`None`: libtorch's intra-op thread count above
/// [`PARALLEL_MIN`] elements, else one); `None` when some defined tensor is not eligible.
#[allow(unsafe_code)]
fn per_chunk<T: Copy + Send>(
    tensors: &[Tensor],
    threads: Option<usize>,
    init: T,
    f: impl Fn(&[f32]) -> T + Sync,
) -> Option<Vec<T>> {
    let defined: Vec<&Tensor> = tensors.iter().filter(|t| t.defined()).collect();
    if !defined.iter().all(|t| eligible(t)) {
        return None;
    }
    let mut chunks: Vec<&[f32]> = Vec::new();
    for t in defined {
        let n = t.numel();
        if n == 0 {
            continue;
        }
        // SAFETY: a defined, contiguous CPU f32 tensor of n elements (checked above): its data
        // pointer addresses n initialized, aligned f32 values, alive while the caller borrows
        // `tensors`, and only read here (no libtorch operation runs on them meanwhile).
        let x = unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<f32>(), n) };
        chunks.extend(x.chunks(CHUNK));
    }
    let mut out = vec![init; chunks.len()];
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    let units: Vec<(usize, (&[f32], &mut T))> = chunks
        .iter()
        .zip(out.iter_mut())
        .map(|(c, s)| (c.len(), (*c, s)))
        .collect();
    run_parallel(
        split_work(
            units,
            threads.unwrap_or_else(|| workers_from(total, PARALLEL_MIN)),
        ),
        |list| {
            for (c, s) in list {
                *s = f(c);
            }
        },
    );
    Some(out)
}

/// Muon's update of an f32 weight by a bf16 direction, W ← fl(W·d) (with `decay` = d) then
/// W ← fl(W + α·O) as one fused multiply-add, in one pass (reading W and O, writing W): the
/// values of `Matrix::scale` and `Matrix::axpy` on O converted to f32 (exactly) where libtorch's
/// kernels are its AVX2 or AVX-512 ones (factors rounded to f32, `addcmul_` fused, as
/// [`MomentumScalars`] describes). `None`, with `w` untouched, when `w` is not an eligible f32
/// tensor, `o` not a contiguous CPU bf16 tensor of `w`'s size, or α or d not finite in f32.
#[allow(unsafe_code)]
pub(crate) fn update_from_bf16(
    w: &Tensor,
    decay: Option<f64>,
    alpha: f64,
    o: &Tensor,
) -> Option<()> {
    let o_ok = o.defined()
        && o.kind() == Kind::BFloat16
        && o.device() == Device::Cpu
        && o.is_contiguous()
        && o.size() == w.size();
    let (a, d) = (alpha as f32, decay.map(|d| d as f32));
    if !eligible(w) || !o_ok || !a.is_finite() || d.is_some_and(|d| !d.is_finite()) {
        return None;
    }
    let n = w.numel();
    if n == 0 {
        return Some(());
    }
    let (start, end) = byte_range(w);
    let o_start = o.data_ptr() as usize;
    if o_start < end && start < o_start + 2 * n {
        return None;
    }
    // SAFETY: `w` is a defined, contiguous CPU f32 tensor and `o` a defined, contiguous CPU bf16
    // tensor, both of n elements (checked above), whose memory does not overlap (checked just
    // above); both are alive while the caller borrows them, and nothing else reads or writes
    // them meanwhile.
    let (w, o) = unsafe {
        (
            std::slice::from_raw_parts_mut(w.data_ptr().cast::<f32>(), n),
            std::slice::from_raw_parts(o.data_ptr().cast::<u16>(), n),
        )
    };
    let units: Vec<(usize, UpdateUnit<'_>)> = w
        .chunks_mut(CHUNK)
        .zip(o.chunks(CHUNK))
        .map(|(w, o)| (w.len(), (w, o)))
        .collect();
    run_parallel(
        split_work(units, workers_from(n, MOMENTUM_PARALLEL_MIN)),
        |list| {
            for (w, o) in list {
                update_unit(w, o, d, a);
            }
        },
    );
    Some(())
}

/// One work unit of [`update_from_bf16`]: the weight's entries and the direction's (bf16 bits).
type UpdateUnit<'a> = (&'a mut [f32], &'a [u16]);

/// One unit of [`update_from_bf16`] on the widest fused multiply-add this CPU has (as
/// [`momentum_unit`]).
#[allow(unsafe_code)]
fn update_unit(w: &mut [f32], o: &[u16], decay: Option<f32>, alpha: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above), the only requirement of a
        // `target_feature(enable = "avx2,fma")` function.
        return unsafe { update_unit_fma(w, o, decay, alpha) };
    }
    update_unit_portable(w, o, decay, alpha);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn update_unit_fma(w: &mut [f32], o: &[u16], decay: Option<f32>, alpha: f32) {
    update_unit_portable(w, o, decay, alpha);
}

#[inline(always)]
fn update_unit_portable(w: &mut [f32], o: &[u16], decay: Option<f32>, alpha: f32) {
    let widen = |b: u16| f32::from_bits(u32::from(b) << 16);
    match decay {
        Some(d) => {
            for (w, &o) in w.iter_mut().zip(o) {
                *w = widen(o).mul_add(alpha, *w * d);
            }
        }
        None => {
            for (w, &o) in w.iter_mut().zip(o) {
                *w = widen(o).mul_add(alpha, *w);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_detection() {
        // Disjoint written ranges, a read range shared twice: fine.
        assert!(!overlapping(&[(0, 8), (8, 16)], &[(16, 24), (16, 24)]));
        // A written range inside another written one, or inside a read one.
        assert!(overlapping(&[(0, 16), (4, 8)], &[]));
        assert!(overlapping(&[(20, 24)], &[(16, 32)]));
        assert!(overlapping(&[(0, 16)], &[(8, 24)]));
        // The same written range twice (a parameter listed twice).
        assert!(overlapping(&[(0, 8), (0, 8)], &[]));
        // Empty ranges never overlap.
        assert!(!overlapping(&[(4, 4)], &[(0, 8)]));
    }

    /// The momentum written straight to bf16 is the momentum, then the conversion, bit for bit:
    /// the same new buffer as [`momentum`], and the bf16 batch, slice norms and input norms
    /// [`kappa_linalg::batched::to_bf16_batch_normed`] gives for its input (Nesterov's U,
    /// or the buffer), for EMA and SGD weights, with and without an old buffer.
    #[test]
    fn momentum_to_bf16_is_momentum_then_the_conversion() {
        let cpu = (Kind::Float, Device::Cpu);
        tch::manual_seed(4);
        let dims = [5i64, 16, 48];
        let (g, old) = (Tensor::randn(dims, cpu), Tensor::randn(dims, cpu) * 0.3);
        for (w_g, nesterov, with_old) in [
            (0.05, true, true),
            (0.05, true, false),
            (1.0, false, true),
            (1.0, true, true),
        ] {
            let old = with_old.then_some(&old);
            let (buf, normed, fros) = momentum_to_bf16(&g, old, w_g, 0.95, nesterov, dims).unwrap();
            let (want_buf, u) = momentum(&g, old, w_g, 0.95, nesterov).unwrap();
            let u = u.unwrap_or_else(|| want_buf.shallow_clone());
            let (want, want_fros) = kappa_linalg::batched::to_bf16_batch_normed(&u).unwrap();
            let case = format!("w_g {w_g}, nesterov {nesterov}, old {with_old}");
            assert!(buf.equal(&want_buf), "{case}: buffer");
            assert!(normed.batch().equal(want.batch()), "{case}: bf16 input");
            assert_eq!(
                (normed.fros(), &fros),
                (want.fros(), &want_fros),
                "{case}: norms"
            );
        }
        // Dimensions that do not cover the gradient: not taken.
        assert!(momentum_to_bf16(&g, None, 1.0, 0.9, true, [4, 16, 48]).is_none());
    }

    #[test]
    fn work_splits_keep_order_and_cover_everything() {
        let items: Vec<(usize, usize)> = (0..10).map(|i| (i + 1, i)).collect();
        for w in 1..5 {
            let lists = split_work(items.clone(), w);
            assert!(lists.len() <= w);
            let flat: Vec<usize> = lists.into_iter().flatten().collect();
            assert_eq!(flat, (0..10).collect::<Vec<_>>());
        }
    }

    #[test]
    fn the_fused_adamw_does_not_depend_on_the_thread_count() {
        let cpu = (Kind::Float, Device::Cpu);
        let (p, g, m, v) = {
            tch::manual_seed(3);
            let s = [3 * CHUNK as i64 + 11];
            (
                Tensor::randn(s, cpu),
                Tensor::randn(s, cpu),
                Tensor::randn(s, cpu) * 0.1,
                Tensor::randn(s, cpu).square(),
            )
        };
        let c = AdamWScalars {
            decay: 1.0 - 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            step_size: 1e-2,
            bc2_sqrt: 0.3,
            eps: 1e-8,
        };
        let run = |threads| {
            let (p, m, v) = (p.copy(), m.copy(), v.copy());
            adamw_on(&[(&p, &g, &m, &v, c)], Some(threads)).unwrap();
            (p, m, v)
        };
        let one = run(1);
        for threads in [2, 3, 5] {
            let other = run(threads);
            assert!(one.0.equal(&other.0) && one.1.equal(&other.1) && one.2.equal(&other.2));
        }
    }

    #[test]
    fn the_sum_of_squares_is_exact_on_integers_and_independent_of_threads() {
        // Integers below 2^13 square exactly and their sums below 2^53 are exact in f64, so
        // any order gives the same value: the closed form.
        let n = 3 * CHUNK + 5;
        let x = Tensor::arange(n as i64, (Kind::Float, Device::Cpu)).remainder(8191);
        let want: f64 = (0..n).map(|i| ((i % 8191) as f64).powi(2)).sum();
        let parts = [
            x.narrow(0, 0, 7).copy(),
            x.narrow(0, 7, n as i64 - 7).copy(),
        ];
        assert_eq!(sum_of_squares(&parts), Some(want));
        // A strided view is refused, not misread.
        assert_eq!(sum_of_squares(&[x.slice(0, 0, None, 2)]), None);
        assert_eq!(sum_of_squares(&[x.to_kind(Kind::Double)]), None);
    }

    #[test]
    fn the_finiteness_pass_finds_every_non_finite_entry_wherever_it_lies() {
        // Every position class of the fold: a lane of the first chunk, the tail of a chunk
        // (CHUNK + 5 is not a multiple of the lanes), a later chunk, the last element; in the
        // first and in the second tensor of the call. Finite extremes (±f32::MAX, the smallest
        // subnormal, −0) must pass: v·0 is ±0 for them, never NaN.
        let n = 2 * CHUNK + 5;
        let base = Tensor::linspace(-3.0, 3.0, n as i64, (Kind::Float, Device::Cpu));
        let _ = base.narrow(0, 1, 1).fill_(f64::from(f32::MAX));
        let _ = base.narrow(0, 2, 1).fill_(-f64::from(f32::MAX));
        let _ = base.narrow(0, 3, 1).fill_(f64::from(f32::from_bits(1)));
        let _ = base.narrow(0, 4, 1).fill_(-0.0);
        let other = base.copy();
        assert_eq!(
            all_finite(&[base.copy(), Tensor::new(), other.copy()]),
            Some(true)
        );
        for threads in [1, 2, 3] {
            for at in [0, 6, CHUNK - 1, CHUNK, 2 * CHUNK + 1, n - 1] {
                for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
                    for which in 0..2 {
                        let ts = [base.copy(), other.copy()];
                        let _ = ts[which].narrow(0, at as i64, 1).fill_(bad);
                        let found = all_finite_on(&ts, Some(threads));
                        assert_eq!(found, Some(false), "{bad} at {at} of {which}");
                    }
                }
            }
        }
        // Not eligible: refused, not misread.
        assert_eq!(all_finite(&[base.slice(0, 0, None, 2)]), None);
        assert_eq!(all_finite(&[base.to_kind(Kind::Double)]), None);
        assert_eq!(all_finite(&[Tensor::new()]), Some(true));
    }
}
