//! Finding and loading `libnvrtc` and `libcuda` before cudarc touches them.
//!
//! cudarc (with `dynamic-loading`) opens its libraries by bare name on first use and panics when
//! none opens. Users expect the usual knobs to work instead, and a readable error when nothing
//! does. So before the first NVRTC or driver call the runtime searches, in this order:
//!
//! 1. an explicit setting: `FLASH_NVRTC_PATH` / `FLASH_CUDA_LIB` (a file; a folder is accepted
//!    too). When set, it is the only candidate: a typo must not be hidden by a silent fallback;
//! 2. `CUDA_PATH`, `CUDA_HOME` (each under `lib64`, `lib`, `targets/x86_64-linux/lib`);
//! 3. standard locations (`/usr/local/cuda/lib64`, `/usr/lib/x86_64-linux-gnu`, ...);
//! 4. the project's own wheel install (`scripts/setup-nvrtc.sh`): `$FLASH_NVRTC_DIR`, or
//!    `.nvrtc/` in the current folder, the executable's folders or the source checkout, each
//!    under `nvidia/cu13/lib`;
//! 5. the folders on `LD_LIBRARY_PATH`;
//! 6. whatever the dynamic loader finds by bare name (its cache and default folders).
//!
//! The first hit is `dlopen`ed by absolute path with `RTLD_GLOBAL` and never closed. cudarc's
//! later bare-name `dlopen("libnvrtc.so.13")` then resolves to the already loaded object (glibc
//! matches loaded objects by `DT_SONAME`), so cudarc uses exactly the library found here.
//!
//! The NVRTC wheel's `libnvrtc.so.13` has no RPATH and itself `dlopen`s
//! `libnvrtc-builtins.so.13.0` by bare name at compile time; unless that folder is on
//! `LD_LIBRARY_PATH` compilation fails with `NVRTC_ERROR_BUILTIN_OPERATION_FAILURE`. Loading the
//! builtins library from the same folder first, by absolute path, makes that inner `dlopen`
//! resolve to it as well.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::FlashError;
use crate::ffi::{self, dlopen_global};

/// Where a library was found and loaded from (see the module doc for the search order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedLib {
    /// Absolute path, or the bare name the dynamic loader resolved.
    pub path: PathBuf,
    /// For NVRTC: the companion `libnvrtc-builtins` loaded beside it, if any.
    pub builtins: Option<PathBuf>,
}

/// One library the runtime needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lib {
    Nvrtc,
    Driver,
}

impl Lib {
    fn short(self) -> &'static str {
        match self {
            Lib::Nvrtc => "nvrtc",
            Lib::Driver => "cuda",
        }
    }
    /// File names to look for in each folder, preferred first.
    fn file_names(self) -> &'static [&'static str] {
        match self {
            // cudarc is built against CUDA 13 (`cuda-13000`).
            Lib::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so"],
            Lib::Driver => &["libcuda.so.1", "libcuda.so"],
        }
    }
    fn env_var(self) -> &'static str {
        match self {
            Lib::Nvrtc => "FLASH_NVRTC_PATH",
            Lib::Driver => "FLASH_CUDA_LIB",
        }
    }
    fn hint(self) -> String {
        match self {
            Lib::Nvrtc => {
                "install NVRTC 13.0 with `scripts/setup-nvrtc.sh` (PyPI wheel, no GPU needed), \
                 or set FLASH_NVRTC_PATH to libnvrtc.so.13, or CUDA_PATH to a CUDA 13 toolkit"
                    .to_string()
            }
            Lib::Driver => "no NVIDIA driver library found (is there a GPU and its driver?); \
                 set FLASH_CUDA_LIB to libcuda.so.1 if it lives elsewhere"
                .to_string(),
        }
    }
}

/// The folders searched, in order, after the explicit setting (steps 2–5 of the module doc).
fn search_dirs(lib: Lib) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(root) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let root = PathBuf::from(root);
            for sub in ["lib64", "lib", "targets/x86_64-linux/lib"] {
                dirs.push(root.join(sub));
            }
        }
    }
    for d in [
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/targets/x86_64-linux/lib",
        "/opt/cuda/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/lib/wsl/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    if lib == Lib::Nvrtc {
        dirs.extend(wheel_dirs());
    }
    if let Some(ld) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&ld).filter(|p| !p.as_os_str().is_empty()));
    }
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// Candidate lib folders of the project's pip-installed NVRTC wheel.
fn wheel_dirs() -> Vec<PathBuf> {
    const SUB: &str = "nvidia/cu13/lib";
    let mut out = Vec::new();
    if let Some(d) = std::env::var_os("FLASH_NVRTC_DIR").filter(|v| !v.is_empty()) {
        let d = PathBuf::from(d);
        out.push(d.join(SUB));
        out.push(d);
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().map(Path::to_path_buf));
    }
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    // The source checkout this binary was built from (`flash-runtime/..`).
    roots.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    for r in roots {
        out.push(r.join(".nvrtc").join(SUB));
    }
    out
}

/// Loads `libnvrtc-builtins.so.13*` from `dir` if present, so that NVRTC's own bare-name open
/// of it succeeds without `LD_LIBRARY_PATH`.
fn preload_builtins(dir: &Path) -> Option<PathBuf> {
    let exact = dir.join("libnvrtc-builtins.so.13.0");
    let path = if exact.is_file() {
        exact
    } else {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libnvrtc-builtins.so.13"))
            })
            .collect();
        found.sort();
        found.into_iter().next()?
    };
    match dlopen_global(&path) {
        Ok(_) => Some(path),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "could not preload nvrtc builtins");
            None
        }
    }
}

/// Tries one candidate file; `Ok(None)` when it does not exist.
fn try_file(lib: Lib, path: &Path, failures: &mut Vec<String>) -> Option<LoadedLib> {
    if !path.is_file() {
        return None;
    }
    let builtins = match (lib, path.parent()) {
        (Lib::Nvrtc, Some(dir)) => preload_builtins(dir),
        _ => None,
    };
    match dlopen_global(path) {
        Ok(_) => Some(LoadedLib {
            path: path.to_path_buf(),
            builtins,
        }),
        Err(e) => {
            failures.push(format!("{}: {e}", path.display()));
            None
        }
    }
}

fn search_and_load(lib: Lib) -> Result<LoadedLib, FlashError> {
    let mut searched: Vec<PathBuf> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let not_found = |searched: Vec<PathBuf>, failures: Vec<String>, extra: String| {
        let mut hint = extra;
        for f in &failures {
            hint.push_str(&format!("\nfound but could not load {f}"));
        }
        if !hint.is_empty() {
            hint.push('\n');
        }
        hint.push_str(&lib.hint());
        FlashError::LibraryNotFound {
            lib: lib.short().to_string(),
            searched,
            hint,
        }
    };

    // 1. The explicit setting is the only candidate when present.
    if let Some(explicit) = std::env::var_os(lib.env_var()).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(explicit);
        let files: Vec<PathBuf> = if p.is_dir() {
            lib.file_names().iter().map(|n| p.join(n)).collect()
        } else {
            vec![p.clone()]
        };
        for f in files {
            if let Some(l) = try_file(lib, &f, &mut failures) {
                return Ok(l);
            }
            searched.push(f);
        }
        return Err(not_found(
            searched,
            failures,
            format!(
                "{} is set to {}, which does not hold a loadable library",
                lib.env_var(),
                p.display()
            ),
        ));
    }

    // 2–5. Folders.
    for dir in search_dirs(lib) {
        for name in lib.file_names() {
            let f = dir.join(name);
            if let Some(l) = try_file(lib, &f, &mut failures) {
                return Ok(l);
            }
            searched.push(f);
        }
    }

    // 6. The dynamic loader's own search (ld.so.cache, default folders).
    for name in lib.file_names() {
        let p = PathBuf::from(name);
        if dlopen_global(&p).is_ok() {
            return Ok(LoadedLib {
                path: p,
                builtins: None,
            });
        }
        searched.push(PathBuf::from(format!("{name} (dynamic loader search)")));
    }
    Err(not_found(searched, failures, String::new()))
}

static NVRTC: Mutex<Option<LoadedLib>> = Mutex::new(None);
static DRIVER: Mutex<Option<LoadedLib>> = Mutex::new(None);

fn ensure(lib: Lib, slot: &Mutex<Option<LoadedLib>>) -> Result<LoadedLib, FlashError> {
    let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = guard.as_ref() {
        return Ok(l.clone());
    }
    let loaded = search_and_load(lib)?;
    // Only now ask cudarc: its probe opens by bare name, which must resolve to what we loaded.
    let present = ffi::culib_present(match lib {
        Lib::Nvrtc => ffi::CudarcLib::Nvrtc,
        Lib::Driver => ffi::CudarcLib::Driver,
    });
    if !present {
        return Err(FlashError::LibraryNotFound {
            lib: lib.short().to_string(),
            searched: vec![loaded.path.clone()],
            hint: format!(
                "{} was loaded, but cudarc could not open it by name (its SONAME is not one \
                 cudarc asks for); put its folder on LD_LIBRARY_PATH",
                loaded.path.display()
            ),
        });
    }
    tracing::debug!(lib = lib.short(), path = %loaded.path.display(), "loaded");
    *guard = Some(loaded.clone());
    Ok(loaded)
}

/// Finds and loads `libnvrtc` (see the module doc for the search order). Idempotent and cheap
/// after the first success; must be called before any `cudarc::nvrtc` call, which would panic
/// instead of returning this error.
pub fn ensure_nvrtc() -> Result<LoadedLib, FlashError> {
    ensure(Lib::Nvrtc, &NVRTC)
}

/// Finds and loads `libcuda` (the driver). Same contract as [`ensure_nvrtc`].
pub fn ensure_driver() -> Result<LoadedLib, FlashError> {
    ensure(Lib::Driver, &DRIVER)
}

/// One visible GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// The CUDA device ordinal (`cuDeviceGet`'s index), as
    /// [`Runtime::new`](crate::Runtime::new) takes it.
    pub ordinal: i32,
    /// The driver's name for the device (`unknown` when it would not say).
    pub name: String,
    /// Compute capability `(major, minor)`.
    pub compute_capability: (i32, i32),
    /// Global memory of the device, in bytes.
    pub total_mem_bytes: usize,
}

impl GpuInfo {
    /// The NVRTC architecture to compile for: the `a` variant on Hopper (`sm_90a`, which enables
    /// wgmma/TMA), the plain one elsewhere.
    ///
    /// ```
    /// use flash_runtime::libs::GpuInfo;
    ///
    /// let gpu = |cc| GpuInfo {
    ///     ordinal: 0,
    ///     name: "gpu".into(),
    ///     compute_capability: cc,
    ///     total_mem_bytes: 0,
    /// };
    /// assert_eq!(gpu((9, 0)).arch(), "sm_90a");
    /// assert_eq!(gpu((8, 6)).arch(), "sm_86");
    /// ```
    pub fn arch(&self) -> String {
        let (maj, min) = self.compute_capability;
        if (maj, min) == (9, 0) {
            "sm_90a".to_string()
        } else {
            format!("sm_{maj}{min}")
        }
    }
}

/// What [`probe_gpus`] found.
#[derive(Debug, Clone)]
pub enum GpuProbe {
    /// No driver library: the message says what was searched.
    NoDriver(String),
    /// The driver loaded but reports no usable device (the message is the driver's reason).
    NoDevice(String),
    /// The visible devices, in ordinal order (never empty).
    Devices(Vec<GpuInfo>),
}

/// Looks for GPUs without ever panicking: a machine with no driver or no device gets a value
/// saying so (`flash info` prints it).
///
/// ```
/// use flash_runtime::libs::{probe_gpus, GpuProbe};
///
/// match probe_gpus() {
///     GpuProbe::Devices(gpus) => {
///         assert!(!gpus.is_empty());
///         assert!(gpus.iter().all(|g| g.arch().starts_with("sm_")));
///     }
///     // No driver, or a driver without a usable device: a message, not a panic.
///     GpuProbe::NoDriver(why) | GpuProbe::NoDevice(why) => assert!(!why.is_empty()),
/// }
/// ```
pub fn probe_gpus() -> GpuProbe {
    use cudarc::driver::result;
    if let Err(e) = ensure_driver() {
        return GpuProbe::NoDriver(e.to_string());
    }
    if let Err(e) = result::init() {
        return GpuProbe::NoDevice(format!("cuInit failed: {e:?}"));
    }
    let n = match result::device::get_count() {
        Ok(n) => n,
        Err(e) => return GpuProbe::NoDevice(format!("cuDeviceGetCount failed: {e:?}")),
    };
    if n == 0 {
        return GpuProbe::NoDevice("the driver reports 0 devices".to_string());
    }
    let mut out = Vec::new();
    for ordinal in 0..n {
        let Ok(dev) = result::device::get(ordinal) else {
            continue;
        };
        let name = result::device::get_name(dev).unwrap_or_else(|_| "unknown".to_string());
        // `dev` is a valid device handle from cuDeviceGet after a successful cuInit.
        let (maj, min, mem) = ffi::device_attributes(dev);
        out.push(GpuInfo {
            ordinal,
            name,
            compute_capability: (maj, min),
            total_mem_bytes: mem,
        });
    }
    GpuProbe::Devices(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_dirs_follow_cuda_path_and_ld_library_path_order() {
        let dirs = search_dirs(Lib::Nvrtc);
        let pos = |p: &str| dirs.iter().position(|d| d == Path::new(p));
        let std_pos = pos("/usr/local/cuda/lib64").expect("standard location searched");
        let wheel_pos = dirs
            .iter()
            .position(|d| d.ends_with(".nvrtc/nvidia/cu13/lib"))
            .expect("wheel dir searched");
        assert!(
            std_pos < wheel_pos,
            "standard locations come before the wheel"
        );
    }

    #[test]
    fn not_found_message_lists_paths() {
        let e = FlashError::LibraryNotFound {
            lib: "nvrtc".into(),
            searched: vec![
                PathBuf::from("/a/libnvrtc.so.13"),
                PathBuf::from("/b/libnvrtc.so"),
            ],
            hint: "install it".into(),
        };
        let s = e.to_string();
        assert!(s.contains("could not find the `nvrtc` library"));
        assert!(s.contains("/a/libnvrtc.so.13") && s.contains("/b/libnvrtc.so"));
        assert!(s.contains("install it"));
    }
}
