//! A `torch.Tensor` as a [`tch::Tensor`] and back, without copying: both are handles on one
//! libtorch `at::Tensor` (same storage, same autograd metadata, same `.grad`), because the
//! extension runs on the libtorch that `import torch` loaded.
//!
//! The three C++ calls live in `bridge.cpp`; this is the only module with `unsafe` code.
#![allow(unsafe_code)]

use std::ffi::c_int;

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::ffi::PyObject;
use pyo3::prelude::*;
use pyo3::types::PyAny;
use tch::Tensor;

use crate::error::ToPy;

extern "C" {
    fn kappa_is_tensor(obj: *mut PyObject) -> c_int;
    fn kappa_unpack(obj: *mut PyObject) -> *mut torch_sys::C_tensor;
    fn kappa_wrap(t: *const torch_sys::C_tensor) -> *mut PyObject;
}

/// A `torch.Tensor` argument or result: a [`Tensor`] handle sharing the Python tensor's storage.
pub struct PyTensor(pub Tensor);

impl<'a, 'py> FromPyObject<'a, 'py> for PyTensor {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        // SAFETY: `obj` is a live object for the duration of the borrow; the C++ side only reads
        // its type (and, for a tensor, its `at::Tensor`), and catches every C++ exception.
        match unsafe { kappa_is_tensor(obj.as_ptr()) } {
            1 => {}
            0 => {
                return Err(PyTypeError::new_err(format!(
                    "expected a torch.Tensor, got {}",
                    obj.get_type().name()?
                )))
            }
            2 => {
                return Err(PyTypeError::new_err(
                    "expected a dense (strided) torch.Tensor, got a sparse or other non-strided \
                     layout",
                ))
            }
            3 => {
                return Err(PyTypeError::new_err(format!(
                    "expected a torch.Tensor with its own storage, got a {} (a subclass that \
                     runs in Python, such as DTensor, or a tensor without storage): pass its \
                     local tensor",
                    obj.get_type().name()?
                )))
            }
            _ => {
                return Err(PyRuntimeError::new_err(
                    "torch could not inspect the object",
                ))
            }
        }
        // SAFETY: `obj` is a torch.Tensor (checked above). The returned pointer is a new
        // `at::Tensor` handle that `Tensor::from_ptr` owns and frees.
        let ptr = unsafe { kappa_unpack(obj.as_ptr()) };
        if ptr.is_null() {
            return Err(PyRuntimeError::new_err("torch could not unpack the tensor"));
        }
        // SAFETY: `ptr` is a valid, uniquely owned `at::Tensor*` (see above).
        Ok(PyTensor(unsafe { Tensor::from_ptr(ptr) }))
    }
}

impl<'py> IntoPyObject<'py> for PyTensor {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: `self.0` is a valid handle; `kappa_wrap` returns a new reference (or null,
        // with every C++ exception caught). The GIL is held (`py`).
        let obj = unsafe { kappa_wrap(self.0.as_ptr()) };
        if obj.is_null() {
            return Err(PyRuntimeError::new_err("torch could not wrap the tensor"));
        }
        // SAFETY: `obj` is a new, non-null reference that we own.
        Ok(unsafe { Bound::from_owned_ptr(py, obj) })
    }
}

/// A mutable ndarray view of a 2-D, contiguous, f64 CPU tensor's memory, for kappa's `_into`
/// functions to write results straight into a tensor.
pub fn f64_matrix_mut(t: &mut Tensor) -> PyResult<ndarray::ArrayViewMut2<'_, f64>> {
    let size = t.size();
    let ok = t.kind() == tch::Kind::Double
        && t.device() == tch::Device::Cpu
        && size.len() == 2
        && t.is_contiguous();
    if !ok {
        return Err(PyRuntimeError::new_err(format!(
            "expected a contiguous 2-D f64 CPU tensor, got {:?} {:?} on {:?}",
            t.kind(),
            size,
            t.device()
        )));
    }
    let shape = (size[0] as usize, size[1] as usize);
    // SAFETY: the tensor is contiguous, row-major, of f64 and on the CPU (checked above), so its
    // data pointer addresses shape.0 · shape.1 initialized-or-writable f64 values, aligned by
    // libtorch's allocator. The view borrows `t` mutably, so the storage outlives the view and no
    // other handle made from `t` is used meanwhile; callers pass tensors they allocated.
    Ok(unsafe { ndarray::ArrayViewMut2::from_shape_ptr(shape, t.data_ptr() as *mut f64) })
}

/// A fresh, untouched CPU tensor of `kind` and `shape` whose pages the kernel is asked to back
/// with transparent huge pages (Linux's `madvise(MADV_HUGEPAGE)`, which is what "madvise" mode
/// of `/sys/kernel/mm/transparent_hugepage/enabled` waits for). Writing a gigabyte-sized
/// Jacobian into 4 KiB pages costs one page fault per 4 KiB; with 2 MiB pages the fill runs at
/// the memory's speed. The advice changes no contents and is ignored where it cannot apply.
pub fn empty_huge(shape: &[i64], kind: tch::Kind) -> PyResult<Tensor> {
    let t = Tensor::f_empty(shape, (kind, tch::Device::Cpu)).py()?;
    advise_huge_pages(&t);
    Ok(t)
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(t: &Tensor) {
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as usize,
        _ => return,
    };
    let bytes = t.numel() * t.kind().elt_size_in_bytes();
    let start = t.data_ptr() as usize;
    let first = start.div_ceil(page) * page;
    let last = (start + bytes) / page * page;
    if last > first {
        // SAFETY: [first, last) lies within the tensor's own allocation (whole pages of it), which
        // `t` keeps alive; MADV_HUGEPAGE is advice about how to back those pages and changes no
        // memory contents. Its result is ignored: where huge pages are unavailable nothing changes.
        unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                last - first,
                libc::MADV_HUGEPAGE,
            )
        };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_: &Tensor) {}
