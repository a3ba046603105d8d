// The three calls between a Python `torch.Tensor` and libtorch's `at::Tensor`, compiled against
// the headers of the torch that Python imports (torch-sys's `torch_python.cpp` does the same when
// tch's `python-extension` feature is on; compiling these few lines here keeps libtch's own C++
// build shared with the rest of the workspace).
//
// Every function catches C++ exceptions: an exception must not unwind into Rust.
#include <torch/csrc/autograd/python_variable.h>

extern "C" {

// 1 if `obj` is a dense torch.Tensor with its own storage (or a subclass such as nn.Parameter),
// 0 if it is no torch.Tensor, 2 if it is a sparse or other non-strided tensor, 3 if it is a
// subclass whose operations run in Python (DTensor, FakeTensor, ...) or a tensor without storage:
// kappa reads and writes tensors' memory, which those do not have. -1 on error.
int kappa_is_tensor(PyObject* obj) {
  try {
    if (!THPVariable_Check(obj)) {
      return 0;
    }
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (t.defined() && t.layout() != at::kStrided) {
      return 2;
    }
    if (t.defined() && (t.key_set().has(c10::DispatchKey::Python) || !t.has_storage())) {
      return 3;
    }
    return 1;
  } catch (...) {
    return -1;
  }
}

// A new handle on the same tensor (storage, autograd metadata and gradient shared); the caller
// owns the handle (tch's `Tensor::from_ptr` frees it). Null on error.
at::Tensor* kappa_unpack(PyObject* obj) {
  try {
    return new at::Tensor(THPVariable_Unpack(obj));
  } catch (...) {
    return nullptr;
  }
}

// A new reference to the Python object of `t` (the existing one if `t` already has one). Null on
// error.
PyObject* kappa_wrap(const at::Tensor* t) {
  try {
    return THPVariable_Wrap(*t);
  } catch (...) {
    return nullptr;
  }
}

}  // extern "C"
