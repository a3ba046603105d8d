// The three calls between a Python `torch.Tensor` and libtorch's `at::Tensor`, compiled against
// the headers of the torch that Python imports (torch-sys's `torch_python.cpp` does the same when
// tch's `python-extension` feature is on; compiling these few lines here keeps libtch's own C++
// build shared with the rest of the workspace).
//
// Every function catches C++ exceptions: an exception must not unwind into Rust.
#include <torch/csrc/autograd/python_variable.h>

extern "C" {

// 1 if `obj` is a torch.Tensor (or a subclass such as nn.Parameter), 0 if not, -1 on error.
int kappa_is_tensor(PyObject* obj) {
  try {
    return THPVariable_Check(obj) ? 1 : 0;
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
