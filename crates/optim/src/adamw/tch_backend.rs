//! [`AdamW`] on a group of `tch::Tensor` parameters (the `tch` feature): the fused one-pass CPU
//! f32 kernel ([`crate::fused`]) or libtorch's whole-tensor operations ([`AdamWKernel`]).

use kappa_linalg::input::InputError;
use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::{check_lr, check_shape, AdamW, AdamWScalars, AdamWState};
use crate::error::{libtorch, Result};

/// How [`AdamW::step_tensors`] runs its update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdamWKernel {
    /// One pass in Rust over the raw data when every tensor of the group (parameter, gradient,
    /// both moments) is a contiguous CPU f32 tensor, each element computed in f64 and rounded
    /// once per stored value (7 passes over parameter-sized memory instead of about 25); the
    /// libtorch operations of [`AdamWKernel::Ops`] otherwise (other devices and kinds).
    #[default]
    Fused,
    /// libtorch operations on whole tensors (`mul_`, `lerp_`, …), each rounding to the tensor's
    /// kind: the same math, a few roundings per element more.
    Ops,
}

fn size_usize(t: &Tensor) -> Vec<usize> {
    t.size().iter().map(|&d| d as usize).collect()
}

/// Checks that `t` has the size, kind and device of the parameter `p`.
fn check_like(arg: &'static str, t: &Tensor, p: &Tensor, why: &str) -> Result<()> {
    check_shape(arg, &size_usize(t), &size_usize(p), why)?;
    if t.kind() != p.kind() || t.device() != p.device() {
        return Err(InputError::invalid(
            arg,
            format!(
                "{:?} on {:?}, expected {:?} on {:?} ({why})",
                t.kind(),
                t.device(),
                p.kind(),
                p.device()
            ),
        )
        .into());
    }
    Ok(())
}

impl AdamW {
    /// One step over a group of parameters in place: `params[i]` with gradient `grads[i]` and
    /// state `states[i]`, at learning rate `lr`, with `kernel` (on any device and kind; the
    /// fused kernel only where every tensor is a contiguous CPU f32 one). Parameters whose
    /// gradient is undefined (unused in the step's graph, gradients dropped) are skipped, their
    /// state untouched, as PyTorch does. Runs without gradient recording.
    ///
    /// Errors (nothing is modified): `lr` negative or not finite; `grads` or `states` of another
    /// length than `params`; an undefined parameter with a defined gradient; a gradient or moment
    /// of another size, kind or device than its parameter ([`InputError::ShapeMismatch`],
    /// [`InputError::InvalidArgument`]); libtorch failures ([`OptimError::Linalg`](crate::OptimError::Linalg)). The values
    /// are not checked for NaN (that would cost a pass over the memory): a NaN gradient gives NaN
    /// parameters.
    ///
    /// ```
    /// use kappa_optim::{AdamW, AdamWConfig, AdamWKernel, AdamWState};
    /// use tch::Tensor;
    /// let p = Tensor::from_slice(&[1.0f32, 1.0]);
    /// let g = Tensor::from_slice(&[2.0f32, -3.0]);
    /// let adamw = AdamW::new(AdamWConfig::adam())?;
    /// let mut states = [AdamWState::new()];
    /// adamw.step_tensors(&[p.shallow_clone()], &[g], &mut states, 0.1, AdamWKernel::Fused)?;
    /// // The first step is −lr·sign(g).
    /// assert!((p.double_value(&[0]) - 0.9).abs() < 1e-6 && (p.double_value(&[1]) - 1.1).abs() < 1e-6);
    /// # Ok::<(), kappa_optim::OptimError>(())
    /// ```
    pub fn step_tensors(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        states: &mut [AdamWState<Tensor>],
        lr: f64,
        kernel: AdamWKernel,
    ) -> Result<()> {
        check_lr(lr)?;
        let n = params.len();
        for (arg, len) in [("grads", grads.len()), ("states", states.len())] {
            if len != n {
                return Err(InputError::shape_mismatch(
                    arg,
                    format!("{n} entries (one per parameter)"),
                    format!("{len} entries"),
                )
                .into());
            }
        }
        let live: Vec<usize> = (0..n).filter(|&i| grads[i].defined()).collect();
        for &i in &live {
            if !params[i].defined() {
                return Err(InputError::invalid(
                    "params",
                    format!("parameter {i} is undefined but has a gradient"),
                )
                .into());
            }
            check_like("grads", &grads[i], &params[i], "its parameter's")?;
            if let Some((m, v)) = &states[i].moments {
                let why = "its parameter's; this state belongs to another parameter";
                check_like("states", m, &params[i], why)?;
                check_like("states", v, &params[i], why)?;
            }
        }
        let _guard = tch::no_grad_guard();
        for &i in &live {
            if states[i].moments.is_none() {
                let zeros = || params[i].f_zeros_like().map_err(libtorch("params"));
                states[i].moments = Some((zeros()?, zeros()?));
            }
        }
        let scalars: Vec<AdamWScalars> = live
            .iter()
            .map(|&i| AdamWScalars::new(&self.config, lr, states[i].steps + 1))
            .collect();
        self.step_live(params, grads, states, &live, &scalars, kernel)?;
        for &i in &live {
            states[i].steps += 1;
        }
        Ok(())
    }

    /// The update of the parameters `live` (whose moments exist), with their scalars.
    fn step_live(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        states: &[AdamWState<Tensor>],
        live: &[usize],
        scalars: &[AdamWScalars],
        kernel: AdamWKernel,
    ) -> Result<()> {
        let moments = |i: usize| {
            states[i].moments.as_ref().ok_or_else(|| {
                InputError::invalid(
                    "states",
                    format!("the moments of parameter {i} were not created"),
                )
            })
        };
        if kernel == AdamWKernel::Fused {
            let mut items = Vec::with_capacity(live.len());
            for (&i, c) in live.iter().zip(scalars) {
                let (m, v) = moments(i)?;
                items.push((&params[i], &grads[i], m, v, *c));
            }
            if crate::fused::adamw(&items).is_some() {
                return Ok(());
            }
        }
        for (&i, c) in live.iter().zip(scalars) {
            let (m, v) = moments(i)?;
            self.step_ops(&params[i], &grads[i], m, v, c)
                .map_err(libtorch("params"))?;
        }
        Ok(())
    }

    /// The op-by-op update of one tensor (p, its gradient g, the moments m and v): torch's
    /// single-tensor loop.
    fn step_ops(
        &self,
        p: &Tensor,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
        c: &AdamWScalars,
    ) -> std::result::Result<(), tch::TchError> {
        let (mut p, mut m, mut v) = (p.shallow_clone(), m.shallow_clone(), v.shallow_clone());
        if self.config.weight_decay != 0.0 {
            let _ = p.f_mul_scalar_(c.decay)?;
        }
        let _ = m.f_lerp_(g, 1.0 - c.beta1)?;
        let _ = v.f_mul_scalar_(c.beta2)?;
        let _ = v.f_add_(&g.f_square()?.f_mul_scalar(1.0 - c.beta2)?)?;
        let denom = v.f_sqrt()?.f_div_scalar(c.bc2_sqrt)?.f_add_scalar(c.eps)?;
        let _ = p.f_sub_(&m.f_div(&denom)?.f_mul_scalar(c.step_size)?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AdamWConfig, OptimError};
    use tch::{Device, Kind};

    /// AdamW with β = (0.9, 0.95), ε = 1e-8 and weight decay `wd`.
    fn adamw(wd: f64) -> AdamW {
        AdamW::new(AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: wd,
        })
        .unwrap()
    }

    /// States with step count `t` and moments m, v.
    fn states_at(t: u64, m: &[Tensor], v: &[Tensor]) -> Vec<AdamWState<Tensor>> {
        m.iter()
            .zip(v)
            .map(|(m, v)| AdamWState::from_parts(Some((m.copy(), v.copy())), t))
            .collect()
    }

    fn max64(t: &Tensor) -> f64 {
        t.max().double_value(&[])
    }

    /// One step of the fused kernel against one step of the op-by-op kernel from the same
    /// state, element by element, within a bound derived from the roundings of each path
    /// (u = 2⁻²⁴, first order; the second-order terms, at most ~50u² relative, are covered by
    /// the factor 1 + 10⁻⁶, and f64 rounding inside the fused kernel by 2⁻⁴⁸ of the inputs):
    ///
    /// * m = β₁m + (1−β₁)g: the op path (`lerp_`: the weight cast to f32, g − m, the product
    ///   and the sum, or one fma) is off by ≤ 3u·w|g − m| + u|m'| (w = 1 − β₁), the fused one
    ///   by ≤ u|m'| (one rounding): tol_m = u(3w|g − m| + 2|m'|).
    /// * v = β₂v + (1−β₂)g² (non-negative terms): the op path rounds the first term 3 times
    ///   (cast, product, sum) and the second 4 (square, cast, product, sum): ≤ 4u·v'; fused
    ///   ≤ u·v': tol_v = 5u·v'.
    /// * p' = p·decay − Δ, Δ = step·m'/d, d = √v'/√c₂ + ε. The op path rounds p·decay twice
    ///   (cast, product), d 4 times relative (sqrt, cast and division by √c₂, the sum with ε and
    ///   ε's cast), Δ 3 more (the division, the cast of step and the product), p' once: ≤
    ///   2u|p·decay| + 7u|Δ| + u|p'|; fused ≤ u|p'|. The two paths also start from different m'
    ///   and v': |δΔ| ≤ (step/d)·tol_m + |Δ|·tol_v/(2v') (√ halves a relative error, and
    ///   √v'/√c₂ ≤ d): tol_p = 2u|p·decay| + 9.5u|Δ| + 2u|p'| + (step/d)·tol_m.
    #[test]
    fn the_fused_adamw_matches_the_op_by_op_kernel_within_the_derived_rounding_bound() {
        let cpu = (Kind::Float, Device::Cpu);
        // Large enough for the fused kernel's parallel path, with odd sizes for the tails.
        let shapes: [&[i64]; 3] = [&[300, 701], &[37], &[5, 3]];
        let u = f64::from(f32::EPSILON) / 2.0;
        for (t, wd, lr, scale) in [
            (0, 0.1, 1e-2, 1.0),
            (4, 0.0, 3e-3, 1e-3),
            (9, 0.1, 1.0, 30.0),
        ] {
            tch::manual_seed(7 + t as i64);
            let (mut p0, mut g, mut m0, mut v0) = (vec![], vec![], vec![], vec![]);
            for s in shapes {
                p0.push(Tensor::randn(s, cpu));
                g.push(Tensor::randn(s, cpu) * scale);
                let (m, v) = if t == 0 {
                    (Tensor::zeros(s, cpu), Tensor::zeros(s, cpu))
                } else {
                    let m = Tensor::randn(s, cpu) * (0.3 * scale);
                    (m, (Tensor::randn(s, cpu) * scale).square())
                };
                m0.push(m);
                v0.push(v);
            }
            let run = |kernel| {
                let params: Vec<Tensor> = p0.iter().map(Tensor::copy).collect();
                let mut states = states_at(t, &m0, &v0);
                adamw(wd)
                    .step_tensors(&params, &g, &mut states, lr, kernel)
                    .unwrap();
                assert!(states.iter().all(|s| s.steps() == t + 1));
                (params, states)
            };
            let (pf, sf) = run(AdamWKernel::Fused);
            let (po, so) = run(AdamWKernel::Ops);
            let (b1, b2, eps) = (0.9f64, 0.95f64, 1e-8f64);
            let (c1, c2) = (1.0 - b1.powi(t as i32 + 1), 1.0 - b2.powi(t as i32 + 1));
            let step = lr / c1;
            for i in 0..shapes.len() {
                let d = |x: &Tensor| x.to_kind(Kind::Double);
                let (p, g, m, v) = (d(&p0[i]), d(&g[i]), d(&m0[i]), d(&v0[i]));
                let (mf, vf) = (d(sf[i].exp_avg().unwrap()), d(sf[i].exp_avg_sq().unwrap()));
                let (mo, vo) = (d(so[i].exp_avg().unwrap()), d(so[i].exp_avg_sq().unwrap()));
                let slack = f64::powi(2.0, -48);
                let w = 1.0 - b1;
                let tol_m = ((&g - &m).abs() * (3.0 * w) + mf.abs() * 2.0) * u
                    + (m.abs() + g.abs()) * slack;
                let tol_v = &vf * (5.0 * u) + (&v + g.square()) * slack;
                let denom = vf.sqrt() / c2.sqrt() + eps;
                let delta = (&mf * step / &denom).abs();
                let p_new = d(&pf[i]);
                let tol_p = (&p * (1.0 - lr * wd)).abs() * (2.0 * u)
                    + &delta * (9.5 * u)
                    + p_new.abs() * (2.0 * u)
                    + &tol_m * step / &denom
                    + (p.abs() + &delta) * slack;
                for (name, a, b, tol) in [
                    ("m", &mf, &mo, &tol_m),
                    ("v", &vf, &vo, &tol_v),
                    ("p", &p_new, &d(&po[i]), &tol_p),
                ] {
                    let excess = max64(&((a - b).abs() - tol * (1.0 + 1e-6)));
                    assert!(
                        excess <= 0.0,
                        "t={t} tensor {i} {name}: exceeds the bound by {excess:e}"
                    );
                }
                // The step did something: the bound is far below the update itself.
                assert!(max64(&(&p_new - &p).abs()) > 1e3 * max64(&tol_p));
            }
        }
    }

    #[test]
    fn the_fused_kernel_falls_back_to_libtorch_outside_contiguous_cpu_f32() {
        // f64 parameters: the fused kernel declines and the op-by-op path runs, bit for bit.
        let cpu = (Kind::Double, Device::Cpu);
        tch::manual_seed(5);
        let (p0, g) = (Tensor::randn([4, 6], cpu), Tensor::randn([4, 6], cpu));
        let run = |kernel| {
            let p = p0.copy();
            let mut states = [AdamWState::new()];
            adamw(0.1)
                .step_tensors(&[p.shallow_clone()], &[g.copy()], &mut states, 1e-2, kernel)
                .unwrap();
            p
        };
        let (fused, ops) = (run(AdamWKernel::Fused), run(AdamWKernel::Ops));
        assert!(fused.equal(&ops));
        assert!(!fused.equal(&p0));
    }

    #[test]
    fn the_tensor_step_is_the_ndarray_step_and_skips_parameters_without_gradient() {
        // f64 tensors through libtorch's operations against the f64 ndarray backend: the same
        // math in two orders of evaluation (module docs of `adamw`), a few roundings apart.
        let cpu = (Kind::Double, Device::Cpu);
        tch::manual_seed(11);
        let (p0, g) = (Tensor::randn([3, 4], cpu), Tensor::randn([3, 4], cpu));
        let to_nd = |t: &Tensor| {
            let v = Vec::<f64>::try_from(&t.flatten(0, -1)).unwrap();
            ndarray::Array2::from_shape_vec((3, 4), v).unwrap()
        };
        let opt = adamw(0.1);
        let (p, skipped) = (p0.copy(), p0.copy());
        let mut states = [AdamWState::new(), AdamWState::new()];
        let (mut q, gq) = (to_nd(&p0), to_nd(&g));
        let mut sq = AdamWState::new();
        for _ in 0..3 {
            let params = [p.shallow_clone(), skipped.shallow_clone()];
            opt.step_tensors(
                &params,
                &[g.copy(), Tensor::new()],
                &mut states,
                1e-2,
                AdamWKernel::Ops,
            )
            .unwrap();
            opt.step(&mut q, &gq, 1e-2, &mut sq).unwrap();
        }
        let err = (&to_nd(&p) - &q).iter().fold(0.0f64, |a, x| a.max(x.abs()));
        assert!(err < 1e-14, "{err:e}");
        assert!(skipped.equal(&p0));
        assert_eq!((states[0].steps(), states[1].steps()), (3, 0));
        assert!(states[1].exp_avg().is_none());
        // A state of another parameter's size is refused before anything moves.
        let mut wrong = [AdamWState::from_parts(
            Some((Tensor::zeros([2], cpu), Tensor::zeros([2], cpu))),
            1,
        )];
        let e = opt
            .step_tensors(
                &[p.shallow_clone()],
                &[g.copy()],
                &mut wrong,
                1e-2,
                AdamWKernel::Fused,
            )
            .unwrap_err();
        assert!(
            matches!(
                e,
                OptimError::Input(InputError::ShapeMismatch { arg: "states", .. })
            ),
            "{e}"
        );
        let e = opt
            .step_tensors(&[p.shallow_clone()], &[], &mut [], 1e-2, AdamWKernel::Fused)
            .unwrap_err();
        assert!(
            matches!(
                e,
                OptimError::Input(InputError::ShapeMismatch { arg: "grads", .. })
            ),
            "{e}"
        );
    }
}
