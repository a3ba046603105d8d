//! bf16 mixed precision in the style of `torch.autocast`: weights, gradients and optimizer state
//! stay f32, and inside [`autocast`] libtorch's own autocast runs its lower-precision ops
//! (linear, matmul, bmm, `scaled_dot_product_attention`, convolutions) on bf16 copies of their
//! inputs while reductions and losses (`log_softmax` with an f32 result, `nll_loss`,
//! `cross_entropy`) stay f32 — libtorch's autocast policy for the device, not one of kappa's.
//! The backward pass runs outside the region and follows the recorded casts.
//!
//! tch wraps autocast for CUDA only (`tch::autocast` returns early without CUDA) and exposes no
//! way to enable it on the CPU. libtorch's C++ API does:
//! `at::autocast::set_autocast_enabled(at::DeviceType, bool)`,
//! `at::autocast::set_autocast_dtype(at::DeviceType, at::ScalarType)` and
//! `at::autocast::is_autocast_enabled(at::DeviceType)` (`ATen/autocast_mode.h`, exported by
//! `libtorch_cpu`), with `DeviceType` and `ScalarType` `int8_t` enums (CPU = 0, CUDA = 1;
//! BFloat16 = 15). They are called here through their C++ symbol names; a libtorch whose
//! signatures changed would fail to link, not misbehave. The region also counts its nesting
//! and clears libtorch's cache of cast weights when the outermost region ends (tch's C API:
//! `at_autocast_increment_nesting`, `at_autocast_decrement_nesting`,
//! `at_autocast_clear_cache`), as `torch.autocast` does: the cache would otherwise keep bf16
//! copies of weights from before the optimizer step.
//!
//! [`native_bf16`] says whether a device computes bf16 natively: on the CPU, kappa-optim's
//! [`kappa_optim::cpu_has_native_bf16`] (the same answer that picks Muon's msign precision,
//! `KAPPA_CPU_BF16` override included); CUDA devices are taken as native (Ampere and later;
//! older GPUs emulate it).

use tch::Device;

/// libtorch's `c10::DeviceType::CPU`.
const DEVICE_CPU: i8 = 0;
/// libtorch's `c10::DeviceType::CUDA`.
const DEVICE_CUDA: i8 = 1;
/// libtorch's `c10::ScalarType::BFloat16`.
const SCALAR_BFLOAT16: i8 = 15;

#[allow(unsafe_code)]
mod ffi {
    extern "C" {
        /// `void at::autocast::set_autocast_enabled(at::DeviceType, bool)`.
        #[link_name = "_ZN2at8autocast20set_autocast_enabledEN3c1010DeviceTypeEb"]
        pub fn set_autocast_enabled(device: i8, enabled: bool);
        /// `bool at::autocast::is_autocast_enabled(at::DeviceType)`.
        #[link_name = "_ZN2at8autocast19is_autocast_enabledEN3c1010DeviceTypeE"]
        pub fn is_autocast_enabled(device: i8) -> bool;
        /// `void at::autocast::set_autocast_dtype(at::DeviceType, at::ScalarType)`.
        #[link_name = "_ZN2at8autocast18set_autocast_dtypeEN3c1010DeviceTypeENS1_10ScalarTypeE"]
        pub fn set_autocast_dtype(device: i8, dtype: i8);
        /// tch's C API (torch-sys): `int at_autocast_increment_nesting()`.
        pub fn at_autocast_increment_nesting() -> i32;
        /// tch's C API: `int at_autocast_decrement_nesting()`.
        pub fn at_autocast_decrement_nesting() -> i32;
        /// tch's C API: `void at_autocast_clear_cache()`.
        pub fn at_autocast_clear_cache();
    }
}

/// Restores the previous autocast state of a device when dropped (also on unwinding).
struct Region {
    device: i8,
    previous: bool,
}

impl Drop for Region {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: libtorch functions taking and returning plain integers and booleans, declared
        // with the signatures of `ATen/autocast_mode.h` and of tch's `torch_api.h`; they only
        // touch libtorch's thread-local autocast state and its cast cache.
        unsafe {
            if ffi::at_autocast_decrement_nesting() == 0 {
                ffi::at_autocast_clear_cache();
            }
            ffi::set_autocast_enabled(self.device, self.previous);
        }
    }
}

/// Runs `f` with libtorch's bf16 autocast enabled for `device` (the CPU or CUDA; other devices
/// run `f` unchanged). The state is per thread, as in libtorch.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// let a = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
/// let c = kappa_models::autocast::autocast(Device::Cpu, || a.matmul(&a));
/// assert_eq!(c.kind(), Kind::BFloat16);
/// assert_eq!(a.matmul(&a).kind(), Kind::Float);
/// ```
#[allow(unsafe_code)]
pub fn autocast<T>(device: Device, f: impl FnOnce() -> T) -> T {
    let device = match device {
        Device::Cpu => DEVICE_CPU,
        Device::Cuda(_) => DEVICE_CUDA,
        _ => return f(),
    };
    // SAFETY: as in `Region::drop`.
    let region = unsafe {
        let previous = ffi::is_autocast_enabled(device);
        ffi::set_autocast_dtype(device, SCALAR_BFLOAT16);
        ffi::set_autocast_enabled(device, true);
        ffi::at_autocast_increment_nesting();
        Region { device, previous }
    };
    let out = f();
    drop(region);
    out
}

/// Whether `device` computes bf16 natively (see the module docs).
pub fn native_bf16(device: Device) -> bool {
    match device {
        Device::Cpu => kappa_optim::cpu_has_native_bf16(),
        Device::Cuda(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    #[test]
    fn the_region_restores_the_state_and_clears_cached_weight_casts() {
        let w = Tensor::ones([4, 4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let x = Tensor::ones([2, 4], (Kind::Float, Device::Cpu));
        let before = autocast(Device::Cpu, || x.matmul(&w));
        assert_eq!(before.kind(), Kind::BFloat16);
        // Off again outside the region.
        assert_eq!(x.matmul(&w).kind(), Kind::Float);
        // A weight changed in place between two regions (an optimizer step): the second region
        // must see the new weight, not a cached bf16 copy of the old one.
        tch::no_grad(|| {
            let _ = w.shallow_clone().fill_(2.0);
        });
        let after = autocast(Device::Cpu, || x.matmul(&w));
        assert_eq!(after.double_value(&[0, 0]), 8.0);
        assert_eq!(before.double_value(&[0, 0]), 4.0);
        // Nested regions keep autocast on until the outermost one ends.
        autocast(Device::Cpu, || {
            autocast(Device::Cpu, || ());
            assert_eq!(x.matmul(&w).kind(), Kind::BFloat16);
        });
        assert_eq!(x.matmul(&w).kind(), Kind::Float);
    }
}
