//! Every `unsafe` block of the crate, behind small safe wrappers.
//!
//! The project's rule is "`unsafe` in one place": the crate root denies `unsafe_code` and only
//! this module is exempt, so the compiler keeps foreign calls from spreading. Each wrapper is a
//! *safe* function whose `SAFETY` comment says why the call is sound; where soundness rests on
//! something the types cannot carry (the kernel launch), the wrapper takes a value only the
//! checking code can build ([`PreparedLaunch`], produced by the checks of `launch/`) and the
//! numbered `# Safety` comment says what those checks established.
//!
//! What the wrappers guarantee, and what their callers must still do:
//!
//! - **NVRTC** ([`NvrtcProgram`], [`nvrtc_version`], [`nvrtc_error_string`]): a program handle
//!   exists only between a successful `nvrtcCreateProgram` and its one `nvrtcDestroyProgram`
//!   (on drop), and borrows every string it was created from for that long; buffers handed to
//!   NVRTC have exactly the size NVRTC reported. Results are NVRTC's own codes, so callers keep
//!   their error messages. Callers load NVRTC first (`libs::ensure_nvrtc`): cudarc would panic,
//!   not misbehave, without it.
//! - **dlopen** ([`dlopen_global`], [`culib_present`]): `RTLD_NOW | RTLD_GLOBAL`, never closed,
//!   so symbols handed out stay valid for the life of the process; failures carry `dlerror()`.
//! - **flock** ([`flock_exclusive`], [`flock_unlock`]): on a descriptor the `File` borrow keeps
//!   open for the call.
//! - **Driver** ([`device_attributes`], [`pointer_range`], [`launch_prepared`]): callers load
//!   the driver (`libs::ensure_driver`) and `cuInit` it first, and bind their context to the
//!   thread before a pointer query or a launch; the launch itself is sound only for a
//!   [`PreparedLaunch`], see its `# Safety` comment.
//! - **Scratch** ([`alloc_scratch_f32`]): uninitialised device memory for buffers a kernel writes
//!   in full before any kernel reads them; the host never reads them.
//! - **Signals** ([`exit_quietly_on_sigpipe`]): a write to a closed pipe ends the process with
//!   status 0 instead of failing the write.

use std::ffi::{c_char, c_void, CStr, CString};
use std::fs::File;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use cudarc::driver::sys::{self as cu, CUdevice_attribute, CUpointer_attribute};
use cudarc::driver::{result, DriverError};
use cudarc::nvrtc::sys as nv;

use crate::prepared::PreparedLaunch;

// ---------------------------------------------------------------------------------------------
// TMA descriptors
// ---------------------------------------------------------------------------------------------

/// The element types a TMA descriptor is encoded for: the storage types of Q, K, V, dO, and
/// fp32 (the backward's dQ accumulator, which the wgmma kernel adds into by TMA reductions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TmaElem {
    Storage(flash_dsl::DType),
    F32,
    /// One-byte codes (fp8 Q, K and Vᵀ), 128 to a 128-byte box row.
    U8,
}

/// Encodes a TMA descriptor for a 4-D tensor of `elem` elements: `dims` innermost first
/// (head dim, seq, heads, batch), `strides` in bytes of dims 1..3, a box of 128 bytes of columns
/// (64 16-bit, 32 fp32 or 128 one-byte elements) × `rows` × 1 × 1, 128-byte swizzle, zero fill out of range.
/// Returns the 128 opaque bytes the kernel reads from its argument struct, or the driver's
/// error. The driver only reads the arrays and writes the descriptor; no device memory is
/// touched until a kernel uses it.
pub(crate) fn encode_tma_4d(
    ptr: u64,
    elem: TmaElem,
    dims: [u64; 4],
    strides: [u64; 3],
    rows: u32,
) -> Result<[u8; 128], cu::CUresult> {
    let mut map = std::mem::MaybeUninit::<cu::CUtensorMap>::zeroed();
    let cols = match elem {
        TmaElem::F32 => 32,
        TmaElem::Storage(_) => 64,
        TmaElem::U8 => 128,
    };
    let box_dim: [u32; 4] = [cols, rows, 1, 1];
    let elem_strides: [u32; 4] = [1, 1, 1, 1];
    let dtype = match elem {
        TmaElem::Storage(flash_dsl::DType::Bf16) => {
            cu::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
        }
        TmaElem::Storage(flash_dsl::DType::F16) => {
            cu::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16
        }
        TmaElem::F32 => cu::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        TmaElem::U8 => cu::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
    };
    // SAFETY: `map` is writable storage of the descriptor's type; the four arrays have the
    // lengths a rank-4 encode reads (dims 4, strides 3, box 4, element strides 4) and outlive
    // the call; the driver is loaded (callers hold a `Runtime`).
    let r = unsafe {
        cu::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dtype,
            4,
            ptr as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            box_dim.as_ptr(),
            elem_strides.as_ptr(),
            cu::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            cu::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            cu::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            cu::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != cu::CUresult::CUDA_SUCCESS {
        return Err(r);
    }
    // SAFETY: the encode succeeded, so every byte of the descriptor is initialised.
    let map = unsafe { map.assume_init() };
    let mut out = [0u8; 128];
    for (chunk, word) in out.chunks_mut(8).zip(map.opaque.iter()) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// NVRTC
// ---------------------------------------------------------------------------------------------

/// NVRTC's version `(major, minor)`. NVRTC must be loaded (`libs::ensure_nvrtc`).
pub(crate) fn nvrtc_version() -> Result<(i32, i32), nv::nvrtcResult> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for writes for the duration of the call.
    let r = unsafe { nv::nvrtcVersion(&mut major, &mut minor) };
    if r == nv::nvrtcResult::NVRTC_SUCCESS {
        Ok((major, minor))
    } else {
        Err(r)
    }
}

/// NVRTC's description of `r` (`{r:?}` when it has none). NVRTC must be loaded.
pub(crate) fn nvrtc_error_string(r: nv::nvrtcResult) -> String {
    // SAFETY: nvrtcGetErrorString returns a static C string (or null) for any result code.
    let p = unsafe { nv::nvrtcGetErrorString(r) };
    if p.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// An NVRTC program, destroyed on drop. It borrows the source, its name and the headers it was
/// created from (`'a`), so they outlive the handle whatever NVRTC does with them.
pub(crate) struct NvrtcProgram<'a> {
    raw: nv::nvrtcProgram,
    _inputs: PhantomData<&'a CStr>,
}

impl Drop for NvrtcProgram<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` came from a successful nvrtcCreateProgram and is destroyed only here.
        unsafe {
            let _ = nv::nvrtcDestroyProgram(&mut self.raw);
        }
    }
}

impl<'a> NvrtcProgram<'a> {
    /// `nvrtcCreateProgram` with `headers` as `(name, contents)` pairs. NVRTC must be loaded.
    pub(crate) fn create(
        source: &'a CStr,
        name: &'a CStr,
        headers: &'a [(CString, CString)],
    ) -> Result<Self, nv::nvrtcResult> {
        let n =
            i32::try_from(headers.len()).map_err(|_| nv::nvrtcResult::NVRTC_ERROR_INVALID_INPUT)?;
        let srcs: Vec<*const c_char> = headers.iter().map(|(_, c)| c.as_ptr()).collect();
        let names: Vec<*const c_char> = headers.iter().map(|(n, _)| n.as_ptr()).collect();
        let (srcs_p, names_p) = if headers.is_empty() {
            (std::ptr::null(), std::ptr::null())
        } else {
            (srcs.as_ptr(), names.as_ptr())
        };
        let mut raw: nv::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: every pointer refers to a NUL-terminated string borrowed for `'a`, which the
        // returned program carries, so they outlive the handle; both header arrays have `n`
        // entries and live for the call; `raw` is valid for writes.
        let r = unsafe {
            nv::nvrtcCreateProgram(&mut raw, source.as_ptr(), name.as_ptr(), n, srcs_p, names_p)
        };
        if r == nv::nvrtcResult::NVRTC_SUCCESS {
            Ok(NvrtcProgram {
                raw,
                _inputs: PhantomData,
            })
        } else {
            Err(r)
        }
    }

    /// `nvrtcCompileProgram` with `options`; NVRTC's result code as is.
    pub(crate) fn compile(&mut self, options: &[CString]) -> nv::nvrtcResult {
        let Ok(n) = i32::try_from(options.len()) else {
            return nv::nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        };
        let ptrs: Vec<*const c_char> = options.iter().map(|c| c.as_ptr()).collect();
        // SAFETY: valid program handle; `ptrs` holds `n` valid C strings alive for the call.
        unsafe { nv::nvrtcCompileProgram(self.raw, n, ptrs.as_ptr()) }
    }

    /// The program's log (empty when NVRTC cannot give one).
    pub(crate) fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: valid program handle; `size` is writable.
        if unsafe { nv::nvrtcGetProgramLogSize(self.raw, &mut size) }
            != nv::nvrtcResult::NVRTC_SUCCESS
        {
            return String::new();
        }
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` holds (at least) the `size` bytes NVRTC reported.
        if unsafe { nv::nvrtcGetProgramLog(self.raw, buf.as_mut_ptr() as *mut c_char) }
            != nv::nvrtcResult::NVRTC_SUCCESS
        {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }

    /// The CUBIN of a compiled program; empty when NVRTC reports size 0 (a virtual
    /// architecture), in which case `nvrtcGetCUBIN` is not called. Errors name the failing call.
    pub(crate) fn cubin(&self) -> Result<Vec<u8>, (&'static str, nv::nvrtcResult)> {
        let mut size = 0usize;
        // SAFETY: valid program handle; `size` is writable.
        let r = unsafe { nv::nvrtcGetCUBINSize(self.raw, &mut size) };
        if r != nv::nvrtcResult::NVRTC_SUCCESS {
            return Err(("nvrtcGetCUBINSize", r));
        }
        if size == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds exactly the reported CUBIN size.
        let r = unsafe { nv::nvrtcGetCUBIN(self.raw, buf.as_mut_ptr() as *mut c_char) };
        if r != nv::nvrtcResult::NVRTC_SUCCESS {
            return Err(("nvrtcGetCUBIN", r));
        }
        Ok(buf)
    }
}

// ---------------------------------------------------------------------------------------------
// Dynamic loading
// ---------------------------------------------------------------------------------------------

fn dlerror_string() -> String {
    // SAFETY: dlerror returns null or a valid C string owned by libc, copied out at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".to_string()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// `dlopen(name, RTLD_NOW | RTLD_GLOBAL)` — an absolute path, or a bare name for the dynamic
/// loader's own search; the handle is deliberately never closed, so symbols later resolved
/// from the library (by cudarc) stay valid for the life of the process. Errors carry
/// `dlerror()`. Meant for the CUDA libraries, whose initialisers are safe to run at any time.
pub(crate) fn dlopen_global(name: &Path) -> Result<(), String> {
    let c = CString::new(name.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: `c` is a valid NUL-terminated string. Loading runs the library's initialisers;
    // the CUDA libraries' are safe to run at any time, and the handle is leaked on purpose.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        Err(dlerror_string())
    } else {
        Ok(())
    }
}

/// Which cudarc library [`culib_present`] asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CudarcLib {
    Nvrtc,
    Driver,
}

/// Whether cudarc can open `lib` by the names it asks for.
pub(crate) fn culib_present(lib: CudarcLib) -> bool {
    // SAFETY: the probe only dlopens (and drops) the library by name.
    unsafe {
        match lib {
            CudarcLib::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
            CudarcLib::Driver => cudarc::driver::sys::is_culib_present(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// File locks
// ---------------------------------------------------------------------------------------------

/// Blocks until `f` holds an exclusive `flock`, retrying on `EINTR`.
pub(crate) fn flock_exclusive(f: &File) -> std::io::Result<()> {
    loop {
        // SAFETY: the borrow keeps `f`'s descriptor open for the duration of the call.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Releases `f`'s `flock` (best effort: closing the descriptor releases it anyway).
pub(crate) fn flock_unlock(f: &File) {
    // SAFETY: the borrow keeps `f`'s descriptor open for the duration of the call.
    unsafe {
        libc::flock(f.as_raw_fd(), libc::LOCK_UN);
    }
}

// ---------------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------------

/// Compute capability `(major, minor)` and total memory of `dev` (0 for a failed query).
/// `dev` comes from `cuDeviceGet` after a successful `cuInit`; any other value only makes the
/// driver return an error, which reads as 0.
pub(crate) fn device_attributes(dev: cu::CUdevice) -> (i32, i32, usize) {
    // SAFETY: the queries only write locals owned by cudarc's wrappers; an invalid handle is
    // reported by the driver as an error code.
    unsafe {
        (
            result::device::get_attribute(
                dev,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            )
            .unwrap_or(0),
            result::device::get_attribute(
                dev,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            )
            .unwrap_or(0),
            result::device::total_mem(dev).unwrap_or(0),
        )
    }
}

/// The allocation holding device address `ptr`: `(start, size, device ordinal)`, or the three
/// `cuPointerGetAttribute` results when any failed. The caller binds a context to the thread
/// first; the driver only reads `ptr` as a number, so any value is sound to ask about.
pub(crate) fn pointer_range(ptr: u64) -> Result<(u64, usize, i32), [cu::CUresult; 3]> {
    let mut start: u64 = 0;
    let mut size: usize = 0;
    let mut ordinal: i32 = -1;
    // SAFETY: each `data` pointer refers to a live local of the type the attribute writes
    // (CUdeviceptr, size_t, int); the driver only reads `ptr` as a number.
    let r = unsafe {
        [
            cu::cuPointerGetAttribute(
                &mut start as *mut u64 as *mut c_void,
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                ptr,
            ),
            cu::cuPointerGetAttribute(
                &mut size as *mut usize as *mut c_void,
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                ptr,
            ),
            cu::cuPointerGetAttribute(
                &mut ordinal as *mut i32 as *mut c_void,
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            ),
        ]
    };
    if r.iter().any(|r| *r != cu::CUresult::CUDA_SUCCESS) {
        Err(r)
    } else {
        Ok((start, size, ordinal))
    }
}

/// Launches the kernel `launch` describes on the stream it was prepared for.
///
/// A [`PreparedLaunch`] is only built by `launch::prepare` (launch/mod.rs), after every check
/// below passed; it borrows the function and the stream it was checked against. The caller
/// (`Runtime::launch_checked`) binds the runtime's context to the thread first and skips empty
/// launches (a zero grid, which the driver would reject).
///
/// # Safety
///
/// What `prepare` (the only producer of a `PreparedLaunch`) established:
/// 1. The function comes from a module loaded into the runtime's context and kept alive by
///    the `LoadedKernel` (which holds the module, and which the launch borrows), so the handle
///    is valid; its dynamic shared memory limit was raised to the plan's `smem_bytes` at load,
///    and that is at most the device's opt-in limit.
/// 2. The single kernel parameter points at a copy of the launch's `args`, an 8-byte aligned
///    buffer of exactly the plan's `args.total_size` bytes — the size the generated source
///    `static_assert`s for its `Args` struct, whose fields are emitted from the same
///    `ArgLayout` — holding every field at the layout's offset. The driver copies it at
///    launch, so it need only live until `launch_kernel` returns.
/// 3. Every operand of the plan is bound: its element type is the operand's, every named
///    extent (batch, seq, heads, head dims) agrees across operands and with the spec, and
///    `heads_q % heads_kv == 0`; strided operands have a contiguous last dimension, every other
///    stride a non-negative multiple of 16 bytes and a 16-byte aligned base address (rows move
///    as 16-byte vectors); contiguous operands are aligned to their element and long enough;
///    the furthest element any index tuple reaches lies inside the caller's slice *and*, per
///    the driver, inside one allocation on this device; each view was taken from a slice of
///    this runtime's context. Outputs' strides make distinct elements distinct memory.
/// 4. TMA descriptors are encoded by the driver from those same checked views (never for an
///    operand with an empty dimension, which the kernel then never loads).
/// 5. Each tensor param has the declared element type, is 4-byte aligned and holds at least the
///    element count its dims resolve to (`Fixed(n)` indices are clamped by the kernel,
///    `Batch`/`Heads`/`Seq` indices range over the launch's sizes), inside one allocation;
///    scalars have the declared type.
/// 6. Sizes fit the kernel's `int`s (seq ≤ i32::MAX, all offsets checked for i64 overflow) and
///    the grid fits the launch limits.
/// 7. The borrows of the `TensorRef`/`TensorMut`/`LseMut` the caller passed were taken from
///    `CudaSlice`s, which live at least as long as the views; all work goes to the runtime's
///    stream (the one `launch` borrows), the stream the views were taken on by the runtime's
///    callers, so a later free or copy on that stream is ordered after the kernel.
pub(crate) fn launch_prepared(launch: &PreparedLaunch<'_>) -> Result<(), DriverError> {
    let mut args = launch.args().to_vec();
    let mut params: [*mut c_void; 1] = [args.as_mut_ptr() as *mut c_void];
    // SAFETY: see `# Safety` above: points 1–7 hold for every `PreparedLaunch`.
    unsafe {
        result::launch_kernel(
            launch.function().cu_function(),
            launch.grid(),
            (launch.threads(), 1, 1),
            launch.smem_bytes(),
            launch.stream().cu_stream(),
            &mut params,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Device scratch
// ---------------------------------------------------------------------------------------------

/// `len` f32 of device memory on `stream`, not initialised: scratch that a kernel of the same
/// stream writes in full before any kernel reads it (the backward's dQ accumulator and delta,
/// which its pre-processing kernel zeroes and computes). Spares a memset of the size of the
/// accumulator — as much traffic again as zeroing it.
pub(crate) fn alloc_scratch_f32(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    len: usize,
) -> Result<cudarc::driver::CudaSlice<f32>, DriverError> {
    // SAFETY: the memory is only ever touched by kernels of `stream`, ordered after the kernel
    // that writes every element (the caller's contract above); the host never reads it, so no
    // uninitialised value reaches Rust code.
    unsafe { stream.alloc::<f32>(len) }
}

/// Keeps the memory freed into device `dev`'s default pool — which stream-ordered allocations
/// (the backward's scratch) come from — in the pool instead of returning it to the driver at
/// each synchronisation (the default release threshold is 0). Otherwise a backward pass after a
/// synchronisation maps its scratch (an fp32 dQ accumulator of 0.1–0.5 GB) anew each time.
/// Process-wide for the device's default pool, as a caching allocator (PyTorch's) keeps its
/// memory too.
pub(crate) fn keep_pool_memory(dev: cu::CUdevice) -> Result<(), DriverError> {
    let mut pool: cu::CUmemoryPool = std::ptr::null_mut();
    let mut threshold: u64 = u64::MAX;
    // SAFETY: `pool` is a valid out-pointer; the attribute takes a pointer to a u64, which
    // `threshold` is and outlives the call.
    unsafe {
        cu::cuDeviceGetDefaultMemPool(&mut pool, dev).result()?;
        cu::cuMemPoolSetAttribute(
            pool,
            cu::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut threshold as *mut u64 as *mut c_void,
        )
        .result()
    }
}

// ---------------------------------------------------------------------------------------------
// Signals
// ---------------------------------------------------------------------------------------------

extern "C" fn exit_on_sigpipe(_: libc::c_int) {
    // SAFETY: `_exit` is async-signal-safe and takes no pointers.
    unsafe { libc::_exit(0) }
}

/// Makes a write to a closed pipe (`flash plan … | head`) end the process at once, quietly and
/// with status 0, instead of Rust's default (SIGPIPE ignored, so `println!` panics on EPIPE).
/// For the `flash` command (`cli::main`); process-wide. Child processes get the default
/// disposition back at `exec`.
pub(crate) fn exit_quietly_on_sigpipe() {
    // SAFETY: the handler only calls the async-signal-safe `_exit`; `signal` has no other
    // preconditions.
    unsafe {
        libc::signal(
            libc::SIGPIPE,
            exit_on_sigpipe as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
}
