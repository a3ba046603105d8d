//! The part of NCCL's C API (`nccl.h`) and of the CUDA driver API (`cuda.h`) the backend calls,
//! resolved at run time, so that building kappa needs neither CUDA nor NCCL.
//!
//! NCCL comes from the first of `$KAPPA_NCCL_LIBRARY`, `libnccl.so.2` (the name PyPI's
//! `nvidia-nccl` package installs, already loaded in a process that links `libtorch_cuda`) and
//! `libnccl.so` that loads; the driver from `libcuda.so.1`. A library or symbol that cannot be
//! found is an error naming it, never a panic.

// FFI into NCCL and the CUDA driver: every unsafe block states what makes it sound.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use libloading::Library;

/// `ncclComm_t`.
pub(crate) type Comm = *mut c_void;
/// `cudaStream_t` / `CUstream`; null is the legacy default stream, the one libtorch launches
/// on unless a program sets another (tch cannot).
pub(crate) type Stream = *mut c_void;
/// `CUcontext`.
pub(crate) type Context = *mut c_void;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UniqueId {
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

/// `ncclSuccess`.
pub(crate) const NCCL_SUCCESS: c_int = 0;
/// `ncclInProgress` (a non-blocking communicator still working).
pub(crate) const NCCL_IN_PROGRESS: c_int = 7;
/// `ncclUint8`: every transfer moves bytes; reductions are done by libtorch after the transfer.
pub(crate) const NCCL_UINT8: c_int = 1;
/// `CUDA_SUCCESS`.
pub(crate) const CUDA_SUCCESS: c_int = 0;
/// `CUDA_ERROR_NOT_READY`: work is still pending on the stream.
pub(crate) const CUDA_ERROR_NOT_READY: c_int = 600;

type Status = c_int;

/// NCCL's functions, valid while `_lib` lives (as long as the process: loaded once).
pub(crate) struct Nccl {
    _lib: Library,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> Status,
    pub get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Status,
    pub comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> Status,
    pub comm_destroy: unsafe extern "C" fn(Comm) -> Status,
    pub comm_abort: unsafe extern "C" fn(Comm) -> Status,
    pub comm_get_async_error: unsafe extern "C" fn(Comm, *mut Status) -> Status,
    pub get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    pub group_start: unsafe extern "C" fn() -> Status,
    pub group_end: unsafe extern "C" fn() -> Status,
    pub send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> Status,
    pub recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> Status,
    pub broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> Status,
}

/// The CUDA driver's functions the backend needs: the device's primary context (the one
/// libtorch's runtime uses) and a non-blocking query of the default stream.
pub(crate) struct Driver {
    _lib: Library,
    pub init: unsafe extern "C" fn(c_uint) -> Status,
    pub device_get: unsafe extern "C" fn(*mut c_int, c_int) -> Status,
    pub primary_ctx_retain: unsafe extern "C" fn(*mut Context, c_int) -> Status,
    pub ctx_set_current: unsafe extern "C" fn(Context) -> Status,
    pub stream_query: unsafe extern "C" fn(Stream) -> Status,
}

// SAFETY: the tables hold function pointers and library handles, which any thread may use.
unsafe impl Send for Nccl {}
unsafe impl Sync for Nccl {}
unsafe impl Send for Driver {}
unsafe impl Sync for Driver {}

/// NCCL, loaded on first use; the error names the files tried.
pub(crate) fn nccl() -> Result<&'static Nccl, String> {
    static NCCL: OnceLock<Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(load_nccl).as_ref().map_err(Clone::clone)
}

/// The CUDA driver, loaded on first use.
pub(crate) fn driver() -> Result<&'static Driver, String> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(load_driver)
        .as_ref()
        .map_err(Clone::clone)
}

fn open(names: &[String]) -> Result<Library, String> {
    let mut tried = Vec::new();
    for name in names {
        // SAFETY: loading a shared library runs its initializers; NCCL's and the driver's are
        // meant to be loaded this way (PyTorch loads them the same way).
        match unsafe { Library::new(name) } {
            Ok(lib) => return Ok(lib),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(tried.join("; "))
}

fn nccl_names() -> Vec<String> {
    let mut names: Vec<String> = std::env::var("KAPPA_NCCL_LIBRARY").into_iter().collect();
    names.extend(["libnccl.so.2".to_string(), "libnccl.so".to_string()]);
    names
}

/// The symbol `name` of `lib` as a `T` (a function pointer of the type the C header declares).
fn symbol<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
    let c_name = format!("{name}\0");
    // SAFETY: every call site names T as the function type nccl.h / cuda.h declare for `name`.
    unsafe { lib.get::<T>(c_name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("symbol {name} not found: {e}"))
}

fn load_nccl() -> Result<Nccl, String> {
    load_nccl_from(&nccl_names())
}

/// NCCL from the first of `names` that loads.
pub(crate) fn load_nccl_from(names: &[String]) -> Result<Nccl, String> {
    let lib = open(names).map_err(|e| format!("cannot load NCCL ({e})"))?;
    Ok(Nccl {
        get_version: symbol(&lib, "ncclGetVersion")?,
        get_unique_id: symbol(&lib, "ncclGetUniqueId")?,
        comm_init_rank: symbol(&lib, "ncclCommInitRank")?,
        comm_destroy: symbol(&lib, "ncclCommDestroy")?,
        comm_abort: symbol(&lib, "ncclCommAbort")?,
        comm_get_async_error: symbol(&lib, "ncclCommGetAsyncError")?,
        get_error_string: symbol(&lib, "ncclGetErrorString")?,
        group_start: symbol(&lib, "ncclGroupStart")?,
        group_end: symbol(&lib, "ncclGroupEnd")?,
        send: symbol(&lib, "ncclSend")?,
        recv: symbol(&lib, "ncclRecv")?,
        broadcast: symbol(&lib, "ncclBroadcast")?,
        _lib: lib,
    })
}

fn load_driver() -> Result<Driver, String> {
    let lib = open(&["libcuda.so.1".into(), "libcuda.so".into()])
        .map_err(|e| format!("cannot load the CUDA driver ({e})"))?;
    Ok(Driver {
        init: symbol(&lib, "cuInit")?,
        device_get: symbol(&lib, "cuDeviceGet")?,
        primary_ctx_retain: symbol(&lib, "cuDevicePrimaryCtxRetain")?,
        ctx_set_current: symbol(&lib, "cuCtxSetCurrent")?,
        stream_query: symbol(&lib, "cuStreamQuery")?,
        _lib: lib,
    })
}

impl Nccl {
    /// NCCL's message for `status`.
    pub fn message(&self, status: Status) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let ptr = unsafe { (self.get_error_string)(status) };
        if ptr.is_null() {
            return format!("NCCL status {status}");
        }
        // SAFETY: non-null and NUL-terminated, per NCCL's API.
        let text = unsafe { CStr::from_ptr(ptr) }.to_string_lossy();
        format!("{text} (NCCL status {status})")
    }
}
