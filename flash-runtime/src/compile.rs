//! CUDA source → CUBIN with NVRTC, and what ptxas says about the result.
//!
//! Options are fixed except the architecture and extras (the caller's, or `FLASH_NVRTC_EXTRA`'s):
//! `-std=c++17`, `-default-device`, and `-Xptxas -v` so that the log carries register,
//! shared-memory, stack and spill figures, parsed into [`Resources`] (and, with NVRTC 12.9+,
//! `--no-cache`: a hit in NVRTC's own cache skips ptxas and those lines). Fast math is deliberately
//! *not* enabled: attention numerics are compared against an IEEE reference, and a kernel that
//! wants an approximate intrinsic (`ex2.approx`, `__expf`) spells it out in its source.

use std::ffi::CString;
use std::path::Path;
use std::time::Instant;

use cudarc::nvrtc::sys;
use flash_dsl::CudaSource;
use serde::{Deserialize, Serialize};

use crate::error::FlashError;
use crate::ffi;
use crate::libs;

/// NVRTC options that vary between compiles. Derives `Hash` so it can sit inside cache keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CompileOptions {
    /// `sm_80`, `sm_90`, `sm_90a`, … (CUBIN is generated for exactly this architecture).
    pub arch: String,
    /// Extra NVRTC options, appended after the fixed ones.
    pub extra: Vec<String>,
}

impl CompileOptions {
    /// Options for `arch`, with the whitespace-separated NVRTC flags of `FLASH_NVRTC_EXTRA` as
    /// extras when it is set (e.g. `-lineinfo` for a profiler's source view, or a ptxas option as
    /// `-Xptxas --register-usage-level=0`: `bench/ab_multi.sh` with `EXTRAS` times one build under
    /// several such sets). Extras are part of the cache key, so they never pick up another set's CUBIN. The
    /// architecture is checked when compiling (it must look like `sm_80` or `sm_90a`: CUBIN
    /// needs a real architecture, not `compute_XX`).
    ///
    /// ```
    /// use flash_runtime::CompileOptions;
    ///
    /// let mut opts = CompileOptions::new("sm_90a");
    /// opts.extra.push("-lineinfo".into());
    /// let args = opts.nvrtc_args();
    /// assert_eq!(args[0], "--gpu-architecture=sm_90a");
    /// assert!(args.contains(&"-std=c++17".to_string()));
    /// assert_eq!(args.last().unwrap(), "-lineinfo"); // extras come after the fixed options
    /// ```
    pub fn new(arch: impl Into<String>) -> Self {
        CompileOptions {
            arch: arch.into(),
            extra: std::env::var("FLASH_NVRTC_EXTRA")
                .map(|v| split_extra(&v))
                .unwrap_or_default(),
        }
    }

    /// The complete NVRTC option list for this compile, in order.
    pub fn nvrtc_args(&self) -> Vec<String> {
        let mut v: Vec<String> = vec![
            format!("--gpu-architecture={}", self.arch),
            "-std=c++17".into(),
            "-default-device".into(),
            // One `-Xptxas` per ptxas option.
            "-Xptxas".into(),
            "-v".into(),
        ];
        v.extend(self.extra.iter().cloned());
        v
    }

    fn validate(&self) -> Result<(), FlashError> {
        let ok = self.arch.strip_prefix("sm_").is_some_and(|r| {
            let digits = r.trim_end_matches(['a', 'f']);
            !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
        });
        if ok {
            Ok(())
        } else {
            Err(FlashError::Invalid(format!(
                "architecture must look like `sm_80` or `sm_90a`; got `{}`",
                self.arch
            )))
        }
    }
}

/// What ptxas reported for the kernel (the entry point; device functions are inlined).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources {
    /// Registers per thread; with the block size this bounds how many blocks fit on an SM.
    pub registers: u32,
    /// Bytes of per-thread spill stores to local memory (non-zero means register pressure).
    pub spill_stores: u32,
    /// Bytes of per-thread spill loads from local memory.
    pub spill_loads: u32,
    /// Bytes of per-thread stack frame.
    pub stack_frame: u32,
    /// Statically declared shared memory in bytes (dynamic shared memory is not included).
    pub smem_static: u32,
    /// ptxas serialised the kernel's wgmma instructions (its advisory C7520): every wgmma then
    /// waits for the previous one to finish, nothing overlaps the tensor cores, and the kernel
    /// runs below its speed (a dropout backward lost 7–13 % so).
    #[serde(default)]
    pub wgmma_serialized: bool,
}

impl Resources {
    /// Parses the `ptxas info` lines of an NVRTC log. Where the log holds several functions, the
    /// figures of `kernel` are taken when its name appears, else the maxima over all functions.
    /// Lines it does not recognise are ignored, so a log without `ptxas` output gives zeros.
    ///
    /// ```
    /// use flash_runtime::Resources;
    ///
    /// let log = "\
    /// ptxas info    : Compiling entry function 'flash_fwd' for 'sm_90a'
    /// ptxas info    : Function properties for flash_fwd
    ///     0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
    /// ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
    /// ";
    /// let r = Resources::parse_log(log, "flash_fwd");
    /// assert_eq!(r.registers, 168);
    /// assert_eq!(r.smem_static, 1024);
    /// assert!(r.spills());
    /// assert!(!r.wgmma_serialized);
    /// assert_eq!(Resources::parse_log("", "flash_fwd"), Resources::default());
    ///
    /// let serialized = "ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async \
    /// instructions are serialized due to program dependence on compiler-inserted WG.AR in \
    /// divergent path in the function 'flash_bwd'\n";
    /// assert!(Resources::parse_log(serialized, "flash_bwd").wgmma_serialized);
    /// assert!(!Resources::parse_log(serialized, "flash_fwd").wgmma_serialized);
    /// ```
    pub fn parse_log(log: &str, kernel: &str) -> Resources {
        // ptxas prints, per function:
        //   ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90a'
        //   ptxas info    : Function properties for _Z3fooPf
        //       0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        //   ptxas info    : Used 128 registers, used 1 barriers, 8192 bytes smem, 304 bytes cmem[0]
        let mut per_fn: Vec<(String, Resources)> = Vec::new();
        // ptxas names the function of a performance advisory inside its line, before the
        // function's own properties.
        let mut serialized: Vec<String> = Vec::new();
        let mut current = String::new();
        for line in log.lines() {
            let l = line.trim();
            if l.contains("(C7520)") || l.contains("wgmma.mma_async instructions are serialized") {
                let name = l.rsplit("function '").next().unwrap_or("");
                serialized.push(name.split('\'').next().unwrap_or("").to_string());
                continue;
            }
            if let Some(rest) = l.split("Compiling entry function '").nth(1) {
                current = rest.split('\'').next().unwrap_or("").to_string();
                per_fn.push((current.clone(), Resources::default()));
                continue;
            }
            if let Some(rest) = l.split("Function properties for ").nth(1) {
                current = rest.trim().to_string();
                if !per_fn.iter().any(|(n, _)| *n == current) {
                    per_fn.push((current.clone(), Resources::default()));
                }
                continue;
            }
            let is_props = l.contains("bytes stack frame") || l.contains("Used ");
            if !is_props {
                continue;
            }
            if per_fn.is_empty() {
                per_fn.push((current.clone(), Resources::default()));
            }
            let idx = per_fn
                .iter()
                .rposition(|(n, _)| *n == current)
                .unwrap_or(per_fn.len() - 1);
            let r = &mut per_fn[idx].1;
            // Each comma-separated part ends in `<n> <what...>`; NVRTC prefixes the stack line
            // with `ptxas         .`, so match on the end of the part only.
            for part in l.split(',') {
                let words: Vec<&str> = part.split_whitespace().collect();
                let num = |w: &&str| w.parse::<u32>().unwrap_or(0);
                match words.as_slice() {
                    [.., "Used", n, "registers"] => r.registers = num(n),
                    [.., n, "bytes", "stack", "frame"] => r.stack_frame = num(n),
                    [.., n, "bytes", "spill", "stores"] => r.spill_stores = num(n),
                    [.., n, "bytes", "spill", "loads"] => r.spill_loads = num(n),
                    [.., n, "bytes", "smem"] => r.smem_static = num(n),
                    _ => {}
                }
            }
        }
        let named = |n: &str| n == kernel || n.contains(kernel);
        let wgmma_serialized = serialized.iter().any(|n| named(n));
        if let Some((_, r)) = per_fn.iter().find(|(n, _)| named(n)) {
            return Resources {
                wgmma_serialized,
                ..*r
            };
        }
        let max = per_fn
            .iter()
            .fold(Resources::default(), |a, (_, r)| Resources {
                registers: a.registers.max(r.registers),
                spill_stores: a.spill_stores.max(r.spill_stores),
                spill_loads: a.spill_loads.max(r.spill_loads),
                stack_frame: a.stack_frame.max(r.stack_frame),
                smem_static: a.smem_static.max(r.smem_static),
                wgmma_serialized: false,
            });
        Resources {
            wgmma_serialized,
            ..max
        }
    }

    /// Whether ptxas had to spill registers to local memory.
    pub fn spills(&self) -> bool {
        self.spill_stores > 0 || self.spill_loads > 0
    }
}

/// A compiled kernel: CUBIN for one architecture plus what the compile said about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledKernel {
    /// The entry point (an `extern "C"` name).
    pub kernel_name: String,
    /// The CUBIN image (kept out of the JSON metadata of cache entries).
    #[serde(skip)]
    pub cubin: Vec<u8>,
    /// NVRTC's log of the compile (ptxas `-v` lines included).
    pub log: String,
    /// Registers, spills, stack and static shared memory of the entry point, parsed from `log`.
    pub resources: Resources,
    /// Wall time of the NVRTC compile, in milliseconds.
    pub compile_ms: f64,
    /// The architecture the CUBIN is for (`CompileOptions::arch`); a module only loads on a
    /// device of that architecture.
    pub arch: String,
}

/// NVRTC's version `(major, minor)`; loads NVRTC first if needed.
pub fn nvrtc_version() -> Result<(i32, i32), FlashError> {
    libs::ensure_nvrtc()?;
    ffi::nvrtc_version().map_err(|r| nvrtc_error(r, "nvrtcVersion"))
}

fn nvrtc_error(r: sys::nvrtcResult, what: &str) -> FlashError {
    FlashError::Nvrtc(format!("{what} failed: {}", ffi::nvrtc_error_string(r)))
}

fn cstring(s: &str, what: &str) -> Result<CString, FlashError> {
    CString::new(s).map_err(|_| FlashError::Invalid(format!("{what} contains a NUL byte")))
}

/// Compiles `src` for `opts.arch` without any cache, logging one `tracing` line with
/// `cache = "off"`. Errors: [`FlashError::LibraryNotFound`] without NVRTC,
/// [`FlashError::Compile`] (with NVRTC's whole log) when the source does not compile,
/// [`FlashError::Invalid`] for an architecture that is not `sm_XY[a|f]`. Needs NVRTC, no GPU.
///
/// ```
/// use flash_dsl::CudaSource;
/// use flash_runtime::{compile, CompileOptions, FlashError};
///
/// let src = CudaSource {
///     kernel_name: "add_one".into(),
///     source: r#"extern "C" __global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }"#
///         .into(),
///     headers: vec![],
///     smem_bytes: 0,
///     threads: 32,
/// };
/// match compile(&src, &CompileOptions::new("sm_80")) {
///     Ok(k) => {
///         assert_eq!(&k.cubin[..4], b"\x7fELF"); // a CUBIN is an ELF image
///         assert_eq!(k.arch, "sm_80");
///         assert!(k.resources.registers > 0);
///     }
///     // Machines without NVRTC (set FLASH_NVRTC_PATH to point at it) get a typed error.
///     Err(FlashError::LibraryNotFound { lib, .. }) => assert_eq!(lib, "nvrtc"),
///     Err(e) => panic!("{e}"),
/// }
/// // A virtual architecture is refused before NVRTC is even looked for.
/// let err = compile(&src, &CompileOptions::new("compute_90")).unwrap_err();
/// assert!(matches!(err, FlashError::Invalid(_)));
/// ```
pub fn compile(src: &CudaSource, opts: &CompileOptions) -> Result<CompiledKernel, FlashError> {
    let k = compile_uncached(src, opts)?;
    tracing::info!(variant = %k.kernel_name, arch = %k.arch, ms = k.compile_ms, cache = "off", "compiled");
    Ok(k)
}

/// The compile itself; the cache logs its own line with the hit/miss outcome.
pub(crate) fn compile_uncached(
    src: &CudaSource,
    opts: &CompileOptions,
) -> Result<CompiledKernel, FlashError> {
    opts.validate()?;
    libs::ensure_nvrtc()?;
    let dump = std::env::var_os("FLASH_DUMP_DIR").filter(|v| !v.is_empty());
    if let Some(dir) = &dump {
        dump_sources(Path::new(dir), src);
    }

    let start = Instant::now();
    let source = cstring(&src.source, "the kernel source")?;
    let prog_name = cstring(&format!("{}.cu", src.kernel_name), "the kernel name")?;
    let mut headers = Vec::with_capacity(src.headers.len());
    for (name, contents) in &src.headers {
        let name = cstring(name, "a header name")?;
        headers.push((name, cstring(contents, "a header")?));
    }

    // The program borrows `source`, `prog_name` and `headers`, so they outlive it.
    let mut prog = ffi::NvrtcProgram::create(&source, &prog_name, &headers)
        .map_err(|r| nvrtc_error(r, "nvrtcCreateProgram"))?;

    let mut args = opts.nvrtc_args();
    // NVRTC 12.9+ keeps a cache of its own: a hit there skips ptxas, and with it the `-v` lines
    // that [`Resources`] are read from — registers and spills then read 0 (seen on an H200: the
    // tuner's table showed 0 registers for kernels compiled earlier in the same machine
    // session). flash caches compiled kernels itself, so NVRTC's is turned off.
    if nvrtc_version()? >= (12, 9) {
        args.push("--no-cache".into());
    }
    let cargs: Vec<CString> = args
        .iter()
        .map(|a| cstring(a, "a compile option"))
        .collect::<Result<_, _>>()?;
    let r = prog.compile(&cargs);
    let log = prog.log();
    if let Some(dir) = &dump {
        let _ = std::fs::write(
            Path::new(dir).join(format!("{}.{}.log", src.kernel_name, opts.arch)),
            &log,
        );
    }
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        let log = if log.trim().is_empty() {
            ffi::nvrtc_error_string(r)
        } else {
            format!("{}\n{log}", ffi::nvrtc_error_string(r))
        };
        return Err(FlashError::Compile {
            kernel: src.kernel_name.clone(),
            log,
        });
    }
    let cubin = prog.cubin().map_err(|(what, r)| nvrtc_error(r, what))?;
    if cubin.is_empty() {
        return Err(FlashError::Nvrtc(
            "nvrtc produced no CUBIN (was a virtual `compute_XX` architecture given?)".into(),
        ));
    }
    drop(prog);
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    let resources = Resources::parse_log(&log, &src.kernel_name);
    Ok(CompiledKernel {
        kernel_name: src.kernel_name.clone(),
        cubin,
        log,
        resources,
        compile_ms,
        arch: opts.arch.clone(),
    })
}

/// Writes the translation unit and its headers under `dir` (best effort: a failure to dump
/// is warned about, never fatal).
fn dump_sources(dir: &Path, src: &CudaSource) {
    let write = |name: &str, contents: &str| {
        let safe: String = name
            .chars()
            .map(|c| if c == '/' || c == '\\' { '_' } else { c })
            .collect();
        let path = dir.join(safe);
        if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, contents)) {
            tracing::warn!(path = %path.display(), error = %e, "FLASH_DUMP_DIR: could not write");
        }
    };
    write(&format!("{}.cu", src.kernel_name), &src.source);
    for (name, contents) in &src.headers {
        write(name, contents);
    }
}

/// The options of a `FLASH_NVRTC_EXTRA` value: whitespace-separated, in order (an option and its
/// value as two words where NVRTC takes them so, e.g. `-Xptxas --register-usage-level=0`).
fn split_extra(v: &str) -> Vec<String> {
    v.split_whitespace().map(String::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_lines() {
        let log = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'helper' for 'sm_90a'
ptxas info    : Function properties for helper
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compiling entry function 'flash_fwd' for 'sm_90a'
ptxas info    : Function properties for flash_fwd
ptxas         .     16 bytes stack frame, 24 bytes spill stores, 20 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8192 bytes smem, 304 bytes cmem[0]
";
        let r = Resources::parse_log(log, "flash_fwd");
        assert_eq!(
            r,
            Resources {
                registers: 255,
                spill_stores: 24,
                spill_loads: 20,
                stack_frame: 16,
                smem_static: 8192,
                wgmma_serialized: false,
            }
        );
        assert!(r.spills());
        let h = Resources::parse_log(log, "helper");
        assert_eq!(h.registers, 40);
        assert_eq!(h.stack_frame, 8);
        let unknown = Resources::parse_log(log, "nope");
        assert_eq!(unknown.registers, 255);
    }

    #[test]
    fn extra_options_split_on_whitespace() {
        assert_eq!(
            split_extra("  -Xptxas --register-usage-level=0\t-lineinfo "),
            ["-Xptxas", "--register-usage-level=0", "-lineinfo"]
        );
        assert!(split_extra("   ").is_empty());
    }

    #[test]
    fn rejects_bad_arch() {
        assert!(CompileOptions::new("sm_90a").validate().is_ok());
        assert!(CompileOptions::new("sm_80").validate().is_ok());
        assert!(CompileOptions::new("sm_100f").validate().is_ok());
        assert!(CompileOptions::new("compute_90").validate().is_err());
        assert!(CompileOptions::new("sm_").validate().is_err());
    }
}
