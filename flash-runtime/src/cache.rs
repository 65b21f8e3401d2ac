//! The compiled-kernel cache: in memory, and on disk across processes.
//!
//! **Key.** SHA-256 over the generated source and every header, all NVRTC options (fixed ones
//! included), the architecture string (`sm_90a` and `sm_90` differ), the NVRTC version,
//! [`flash_dsl::GENERATOR_VERSION`] and [`FORMAT_VERSION`]. Each field is tagged and
//! length-prefixed, so no two different inputs can concatenate to the same bytes.
//!
//! **Folder.** `$FLASH_CACHE_DIR`, else `$XDG_CACHE_HOME/flash`, else `~/.cache/flash`, with a
//! `v1/` subfolder per format version. Entries are `<key>.fkc`; lock files `<key>.lock`.
//!
//! **Entry file.** `MAGIC (8) | format version (u32 LE) | key (64 hex) | payload length (u64 LE)
//! | sha256(payload) (32) | payload`, where the payload is `json length (u32 LE) | json metadata
//! | cubin`. A file that is short, long, corrupt, of another format, or that echoes another key is
//! a miss: it is rebuilt and overwritten, never loaded.
//!
//! **Publishing.** Write to a temp file in the same folder, fsync, rename: readers see either no
//! entry or a whole one. Processes that miss the same key serialise on `flock(<key>.lock)`:
//! *look → lock → look again → build → publish → unlock*, so one compiles and the others load.
//!
//! **Degrading.** A folder that cannot be created or written turns the cache memory-only, with
//! one `tracing::warn!`; compiles still succeed.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use flash_dsl::CudaSource;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::compile::{compile_uncached, nvrtc_version, CompileOptions, CompiledKernel, Resources};
use crate::error::FlashError;
use crate::ffi;

/// Version of the entry file format and of the key derivation; also names the subfolder.
pub const FORMAT_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"FLASHKC\0";
const KEY_LEN: usize = 64;
const HEADER_LEN: usize = 8 + 4 + KEY_LEN + 8 + 32;
const ENTRY_EXT: &str = "fkc";

/// Where a kernel came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CacheOutcome {
    /// Already in this process's memory.
    MemoryHit,
    /// Loaded from a valid disk entry.
    DiskHit,
    /// Compiled by this call (and published to disk when the cache is persistent).
    Miss,
}

impl CacheOutcome {
    /// The name logs, `flash compile` and JSON reports use: `memory-hit`, `disk-hit`, `miss`.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheOutcome::MemoryHit => "memory-hit",
            CacheOutcome::DiskHit => "disk-hit",
            CacheOutcome::Miss => "miss",
        }
    }
}

impl std::fmt::Display for CacheOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One file of the cache folder, as `list` reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EntryInfo {
    /// The file's stem: the entry's 64-hex-digit cache key.
    pub key: String,
    /// The entry file (`<dir>/<key>.fkc`).
    pub path: PathBuf,
    /// Size of the file in bytes (CUBIN plus header and metadata).
    pub bytes: u64,
    /// Whether the file passes every check a load makes (magic, version, key, length, checksum).
    pub valid: bool,
    /// The kernel's entry point; `None` (like the fields below) for an invalid entry.
    pub kernel_name: Option<String>,
    /// The architecture the CUBIN is for.
    pub arch: Option<String>,
    /// What ptxas reported when the entry was compiled.
    pub resources: Option<Resources>,
    /// How long the original NVRTC compile took, in milliseconds.
    pub compile_ms: Option<f64>,
}

/// Counters of one cache instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CacheStats {
    /// Requests served from this instance's memory.
    pub memory_hits: u64,
    /// Requests served from a valid disk entry.
    pub disk_hits: u64,
    /// Requests that compiled with NVRTC.
    pub misses: u64,
    /// Time of the latest disk hit (read + verify + decode), in milliseconds.
    pub last_disk_load_ms: f64,
}

/// In-memory + on-disk cache of compiled kernels. Thread-safe; share it by reference or `Arc`.
///
/// ```
/// use flash_runtime::KernelCache;
///
/// let root = tempfile::tempdir().unwrap();
/// let cache = KernelCache::new(Some(root.path().to_path_buf()));
/// assert!(cache.is_persistent());
/// assert_eq!(cache.dir(), Some(root.path().join("v1").as_path())); // one folder per format
/// assert!(cache.list().is_empty());
/// assert_eq!(cache.clear().unwrap(), 0);
/// assert_eq!(cache.stats().misses, 0);
///
/// let mem = KernelCache::memory_only();
/// assert!(!mem.is_persistent() && mem.dir().is_none());
/// ```
#[derive(Debug)]
pub struct KernelCache {
    /// The versioned folder (`<root>/v1`) entries are written to; `None` when memory-only.
    dir: Option<PathBuf>,
    /// The versioned folder entries are read from, listed and cleared: set whenever there is
    /// a root, so a read-only folder (a shared, pre-built cache) still serves its kernels.
    read_dir: Option<PathBuf>,
    root: Option<PathBuf>,
    /// Set once a disk write fails: from then on the cache is memory-only.
    disk_disabled: AtomicBool,
    mem: Mutex<HashMap<String, Arc<CompiledKernel>>>,
    stats: Mutex<CacheStats>,
}

/// The default cache root: `$FLASH_CACHE_DIR`, `$XDG_CACHE_HOME/flash` or `~/.cache/flash`.
pub fn default_cache_root() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("FLASH_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("flash")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("flash")))
}

/// Checks that `dir` exists (creating it) and accepts new files.
fn probe_writable(dir: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    let probe = dir.join(format!(".probe.{}.{}", std::process::id(), unique()));
    File::create(&probe)?;
    fs::remove_file(&probe)
}

fn unique() -> u128 {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    t ^ (N.fetch_add(1, Ordering::Relaxed) as u128)
}

/// An exclusive `flock` on a per-key lock file, released when dropped (or when the process dies).
struct KeyLock(File);

impl KeyLock {
    fn acquire(path: &Path) -> std::io::Result<KeyLock> {
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        ffi::flock_exclusive(&f)?;
        Ok(KeyLock(f))
    }
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        // Closing the descriptor would release the lock anyway.
        ffi::flock_unlock(&self.0);
    }
}

/// The cache key of compiling `src` with `opts` (64 lower-case hex digits). Loads NVRTC, whose
/// version is part of the key.
pub fn cache_key(src: &CudaSource, opts: &CompileOptions) -> Result<String, FlashError> {
    let (major, minor) = nvrtc_version()?;
    Ok(key_with_version(src, opts, (major, minor)))
}

fn key_with_version(src: &CudaSource, opts: &CompileOptions, nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    let mut field = |tag: &str, bytes: &[u8]| {
        h.update(tag.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field("format", &FORMAT_VERSION.to_le_bytes());
    field("generator", flash_dsl::GENERATOR_VERSION.as_bytes());
    field("nvrtc", format!("{}.{}", nvrtc.0, nvrtc.1).as_bytes());
    field("arch", opts.arch.as_bytes());
    for a in opts.nvrtc_args() {
        field("option", a.as_bytes());
    }
    field("kernel", src.kernel_name.as_bytes());
    field("source", src.source.as_bytes());
    for (name, contents) in &src.headers {
        field("header-name", name.as_bytes());
        field("header", contents.as_bytes());
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Serialises an entry file for `key`.
fn encode_entry(key: &str, k: &CompiledKernel) -> Result<Vec<u8>, FlashError> {
    let json = serde_json::to_vec(k)
        .map_err(|e| FlashError::Invalid(format!("serialising entry: {e}")))?;
    let mut payload = Vec::with_capacity(4 + json.len() + k.cubin.len());
    payload.extend_from_slice(&(json.len() as u32).to_le_bytes());
    payload.extend_from_slice(&json);
    payload.extend_from_slice(&k.cubin);
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&payload));
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Checks and decodes an entry file; `Err` says why it is not usable. `expect_key` is the key
/// the file must echo (`None` to accept whichever it names, for listing).
fn decode_entry(
    bytes: &[u8],
    expect_key: Option<&str>,
) -> Result<(String, CompiledKernel), String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!(
            "truncated: {} bytes, shorter than the header",
            bytes.len()
        ));
    }
    if &bytes[..8] != MAGIC {
        return Err("not a flash cache entry (bad magic)".into());
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, expected {FORMAT_VERSION}"
        ));
    }
    let key =
        std::str::from_utf8(&bytes[12..12 + KEY_LEN]).map_err(|_| "key is not text".to_string())?;
    if let Some(expect) = expect_key {
        if key != expect {
            return Err(format!("entry is for key {key}"));
        }
    }
    let mut at = 12 + KEY_LEN;
    let len = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes")) as usize;
    at += 8;
    let sum = &bytes[at..at + 32];
    at += 32;
    let payload = &bytes[at..];
    if payload.len() != len {
        return Err(format!(
            "payload is {} bytes, header says {len} (truncated or padded)",
            payload.len()
        ));
    }
    if Sha256::digest(payload).as_slice() != sum {
        return Err("checksum mismatch (corrupted)".into());
    }
    if payload.len() < 4 {
        return Err("payload too short".into());
    }
    let jlen = u32::from_le_bytes(payload[..4].try_into().expect("4 bytes")) as usize;
    let json = payload
        .get(4..4 + jlen)
        .ok_or("metadata length out of range")?;
    let mut k: CompiledKernel =
        serde_json::from_slice(json).map_err(|e| format!("bad metadata: {e}"))?;
    k.cubin = payload[4 + jlen..].to_vec();
    // An entry written before a flag of `Resources` existed carries the flag's default; the
    // log it stores says what ptxas reported, so that flag is read again from it.
    k.resources.wgmma_serialized = Resources::parse_log(&k.log, &k.kernel_name).wgmma_serialized;
    Ok((key.to_string(), k))
}

impl KernelCache {
    /// A cache persisting under `root` (or the default root when `None`), in its `v1/`
    /// subfolder. Never fails: an unusable folder gives a memory-only cache and one warning.
    pub fn new(root: Option<PathBuf>) -> KernelCache {
        let root = root.or_else(default_cache_root);
        let read_dir = root.as_ref().map(|r| r.join(format!("v{FORMAT_VERSION}")));
        let dir = match read_dir.clone() {
            Some(d) => match probe_writable(&d) {
                Ok(()) => Some(d),
                Err(e) => {
                    tracing::warn!(dir = %d.display(), error = %e,
                        "kernel cache folder is not writable; reading its entries, caching new kernels in memory only");
                    None
                }
            },
            None => {
                tracing::warn!("no cache folder (FLASH_CACHE_DIR, XDG_CACHE_HOME and HOME unset); caching in memory only");
                None
            }
        };
        KernelCache {
            dir,
            read_dir,
            root,
            disk_disabled: AtomicBool::new(false),
            mem: Mutex::new(HashMap::new()),
            stats: Mutex::new(CacheStats::default()),
        }
    }

    /// A cache that never touches the disk.
    pub fn memory_only() -> KernelCache {
        KernelCache {
            dir: None,
            read_dir: None,
            root: None,
            disk_disabled: AtomicBool::new(true),
            mem: Mutex::new(HashMap::new()),
            stats: Mutex::new(CacheStats::default()),
        }
    }

    /// The process-wide cache at the default folder.
    pub fn global() -> &'static KernelCache {
        static G: OnceLock<KernelCache> = OnceLock::new();
        G.get_or_init(|| KernelCache::new(None))
    }

    /// The versioned folder entries live in, when the cache persists.
    pub fn dir(&self) -> Option<&Path> {
        if self.disk_disabled.load(Ordering::Relaxed) {
            None
        } else {
            self.dir.as_deref()
        }
    }

    /// The root the cache was asked to use (whether or not it turned out writable).
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// Whether entries are written to disk.
    pub fn is_persistent(&self) -> bool {
        self.dir().is_some()
    }

    /// Hit and miss counters of this instance since it was created.
    pub fn stats(&self) -> CacheStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry_path(dir: &Path, key: &str) -> PathBuf {
        dir.join(format!("{key}.{ENTRY_EXT}"))
    }

    /// Tries the disk entry for `key`; any defect is a miss (logged at debug level).
    fn load(
        &self,
        dir: &Path,
        key: &str,
        src: &CudaSource,
        opts: &CompileOptions,
    ) -> Option<CompiledKernel> {
        let path = Self::entry_path(dir, key);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "cache entry unreadable; rebuilding");
                return None;
            }
        };
        match decode_entry(&bytes, Some(key)) {
            // (An entry whose log lacks ptxas's resource line was compiled from NVRTC's own
            // cache, which skips ptxas (see `compile`): rebuilt, so its figures are read.)
            Ok((_, k)) if !k.log.contains(" registers") => {
                tracing::debug!(path = %path.display(), "cache entry without ptxas resources; rebuilding");
                None
            }
            Ok((_, k))
                if k.kernel_name == src.kernel_name
                    && k.arch == opts.arch
                    && !k.cubin.is_empty() =>
            {
                Some(k)
            }
            Ok(_) => {
                tracing::warn!(path = %path.display(), "cache entry names another kernel; rebuilding");
                None
            }
            Err(why) => {
                tracing::warn!(path = %path.display(), reason = %why, "ignoring invalid cache entry; rebuilding");
                None
            }
        }
    }

    /// Atomically publishes an entry: temp file in the same folder, fsync, rename.
    fn store(dir: &Path, key: &str, k: &CompiledKernel) -> Result<(), FlashError> {
        let bytes = encode_entry(key, k)?;
        let tmp = dir.join(format!(".{key}.{}.{}.tmp", std::process::id(), unique()));
        let res = (|| {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            drop(f);
            fs::rename(&tmp, Self::entry_path(dir, key))?;
            // Make the rename itself durable (best effort).
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(())
        })();
        res.map_err(|e| {
            let _ = fs::remove_file(&tmp);
            FlashError::io("writing cache entry", &tmp, e)
        })
    }

    fn disable_disk(&self, why: &FlashError) {
        if !self.disk_disabled.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %why, "kernel cache folder is not usable; caching in memory only");
        }
    }

    fn finish(
        &self,
        key: String,
        k: Arc<CompiledKernel>,
        outcome: CacheOutcome,
        ms: f64,
    ) -> (Arc<CompiledKernel>, CacheOutcome) {
        {
            let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            match outcome {
                CacheOutcome::MemoryHit => s.memory_hits += 1,
                CacheOutcome::DiskHit => {
                    s.disk_hits += 1;
                    s.last_disk_load_ms = ms;
                }
                CacheOutcome::Miss => s.misses += 1,
            }
        }
        if outcome != CacheOutcome::MemoryHit {
            self.mem
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, k.clone());
        }
        let cache = match outcome {
            CacheOutcome::MemoryHit | CacheOutcome::DiskHit => "hit",
            CacheOutcome::Miss => "miss",
        };
        tracing::info!(variant = %k.kernel_name, arch = %k.arch, ms, cache, outcome = outcome.as_str(), "kernel");
        (k, outcome)
    }

    /// Returns the kernel for `(src, opts)`, compiling it at most once across threads and
    /// processes sharing the folder. Errors are those of [`crate::compile::compile`]; cache
    /// folder problems are never errors (they degrade to memory-only).
    pub fn get_or_compile(
        &self,
        src: &CudaSource,
        opts: &CompileOptions,
    ) -> Result<(Arc<CompiledKernel>, CacheOutcome), FlashError> {
        // The key needs the NVRTC version, so the first call also loads NVRTC (~20 ms for the
        // 110 MB library); the timer starts after that, measuring the cache itself.
        let key = cache_key(src, opts)?;
        let start = Instant::now();
        let ms = |s: Instant| s.elapsed().as_secs_f64() * 1e3;
        if let Some(k) = self
            .mem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
        {
            return Ok(self.finish(key, k, CacheOutcome::MemoryHit, ms(start)));
        }
        let Some(dir) = self.dir().map(Path::to_path_buf) else {
            // Not writable: a read-only folder may still hold the kernel.
            if let Some(rd) = &self.read_dir {
                if let Some(k) = self.load(rd, &key, src, opts) {
                    return Ok(self.finish(key, Arc::new(k), CacheOutcome::DiskHit, ms(start)));
                }
            }
            let k = Arc::new(compile_uncached(src, opts)?);
            let t = k.compile_ms;
            return Ok(self.finish(key, k, CacheOutcome::Miss, t));
        };
        // Look.
        if let Some(k) = self.load(&dir, &key, src, opts) {
            return Ok(self.finish(key, Arc::new(k), CacheOutcome::DiskHit, ms(start)));
        }
        // Lock, look again (another process may have published while we waited).
        let lock = match KeyLock::acquire(&dir.join(format!("{key}.lock"))) {
            Ok(l) => Some(l),
            Err(e) => {
                self.disable_disk(&FlashError::io(
                    "locking",
                    dir.join(format!("{key}.lock")),
                    e,
                ));
                None
            }
        };
        if lock.is_some() {
            let again = Instant::now();
            if let Some(k) = self.load(&dir, &key, src, opts) {
                return Ok(self.finish(key, Arc::new(k), CacheOutcome::DiskHit, ms(again)));
            }
        }
        // Build, publish, unlock.
        let k = Arc::new(compile_uncached(src, opts)?);
        if lock.is_some() {
            if let Err(e) = Self::store(&dir, &key, &k) {
                self.disable_disk(&e);
            }
        }
        drop(lock);
        let t = k.compile_ms;
        Ok(self.finish(key, k, CacheOutcome::Miss, t))
    }

    /// Every entry file of the folder, checked as a load would check it (newest first); empty
    /// when the folder cannot be read (see [`KernelCache::try_list`] to tell the two apart).
    pub fn list(&self) -> Vec<EntryInfo> {
        self.try_list().unwrap_or_default()
    }

    /// [`KernelCache::list`], with an error naming the folder and the OS error when the folder
    /// exists but cannot be read (or is not a folder). A folder not created yet has no entries.
    pub fn try_list(&self) -> Result<Vec<EntryInfo>, FlashError> {
        let Some(dir) = self.read_dir.as_deref() else {
            return Ok(Vec::new());
        };
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(FlashError::io("reading the cache folder", dir, e)),
        };
        let mut out: Vec<(std::time::SystemTime, EntryInfo)> = Vec::new();
        for e in rd.flatten() {
            let path = e.path();
            if path.extension().and_then(|x| x.to_str()) != Some(ENTRY_EXT) {
                continue;
            }
            let key = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("")
                .to_string();
            let meta = e.metadata().ok();
            let bytes = fs::read(&path).unwrap_or_default();
            let decoded = decode_entry(&bytes, Some(&key)).ok();
            let info = EntryInfo {
                valid: decoded.is_some(),
                kernel_name: decoded.as_ref().map(|(_, k)| k.kernel_name.clone()),
                arch: decoded.as_ref().map(|(_, k)| k.arch.clone()),
                resources: decoded.as_ref().map(|(_, k)| k.resources),
                compile_ms: decoded.as_ref().map(|(_, k)| k.compile_ms),
                key,
                path,
                bytes: meta.as_ref().map(|m| m.len()).unwrap_or(0),
            };
            let mtime = meta
                .and_then(|m| m.modified().ok())
                .unwrap_or(std::time::UNIX_EPOCH);
            out.push((mtime, info));
        }
        out.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.key.cmp(&b.1.key)));
        Ok(out.into_iter().map(|(_, i)| i).collect())
    }

    /// Removes every entry (and stray temp file) of the folder and empties the memory level.
    /// Lock files stay: removing one another process holds would let two builders race.
    /// Returns the number of entries removed; a folder that cannot be read, or an entry that
    /// cannot be removed (a read-only folder), is an error naming the path.
    pub fn clear(&self) -> Result<usize, FlashError> {
        self.mem.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let Some(dir) = self.read_dir.as_deref() else {
            return Ok(0);
        };
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(FlashError::io("reading the cache folder", dir, e)),
        };
        let mut n = 0;
        for e in rd.flatten() {
            let p = e.path();
            let name = p.file_name().and_then(|s| s.to_str()).unwrap_or("");
            let is_entry = name.ends_with(&format!(".{ENTRY_EXT}"));
            if is_entry || name.ends_with(".tmp") {
                fs::remove_file(&p).map_err(|e| FlashError::io("removing", &p, e))?;
                n += usize::from(is_entry);
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(text: &str) -> CudaSource {
        CudaSource {
            kernel_name: "k".into(),
            source: text.into(),
            headers: vec![("h.cuh".into(), "// h".into())],
            smem_bytes: 0,
            threads: 128,
        }
    }

    #[test]
    fn key_depends_on_every_input() {
        let base = key_with_version(&src("a"), &CompileOptions::new("sm_90a"), (13, 0));
        assert_eq!(base.len(), 64);
        assert_eq!(
            base,
            key_with_version(&src("a"), &CompileOptions::new("sm_90a"), (13, 0))
        );
        assert_ne!(
            base,
            key_with_version(&src("b"), &CompileOptions::new("sm_90a"), (13, 0))
        );
        assert_ne!(
            base,
            key_with_version(&src("a"), &CompileOptions::new("sm_90"), (13, 0))
        );
        assert_ne!(
            base,
            key_with_version(&src("a"), &CompileOptions::new("sm_90a"), (13, 1))
        );
        let mut extra = CompileOptions::new("sm_90a");
        extra.extra.push("-lineinfo".into());
        assert_ne!(base, key_with_version(&src("a"), &extra, (13, 0)));
        let mut s = src("a");
        s.headers[0].1 = "// h2".into();
        assert_ne!(
            base,
            key_with_version(&s, &CompileOptions::new("sm_90a"), (13, 0))
        );
    }

    /// An entry whose log has no ptxas resource line (an NVRTC-cache hit skipped ptxas) is not
    /// loaded: its registers and spills would read 0. With the line it loads.
    #[test]
    fn an_entry_without_ptxas_resources_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::new(Some(dir.path().to_path_buf()));
        let opts = CompileOptions::new("sm_90a");
        let entry = |key: &str, log: &str| {
            let k = CompiledKernel {
                kernel_name: "k".into(),
                cubin: vec![0x7f, b'E', b'L', b'F'],
                log: log.into(),
                resources: Resources::parse_log(log, "k"),
                compile_ms: 1.0,
                arch: "sm_90a".into(),
            };
            KernelCache::store(dir.path(), key, &k).unwrap();
        };
        let (bare, full) = ("12".repeat(32), "34".repeat(32));
        entry(&bare, "");
        entry(
            &full,
            "ptxas info    : Compiling entry function 'k' for 'sm_90a'\nptxas info    : Function properties for k\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\nptxas info    : Used 40 registers, used 1 barriers",
        );
        assert!(cache.load(dir.path(), &bare, &src("a"), &opts).is_none());
        let k = cache
            .load(dir.path(), &full, &src("a"), &opts)
            .expect("loads");
        assert_eq!(k.resources.registers, 40);
    }

    #[test]
    fn an_older_entry_gets_the_serialisation_flag_from_its_log() {
        let key = "ef".repeat(32);
        let k = CompiledKernel {
            kernel_name: "flash_bwd_x".into(),
            cubin: vec![1, 2, 3],
            log:
                "ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions \
                  are serialized due to program dependence on compiler-inserted WG.AR in divergent \
                  path in the function 'flash_bwd_x'"
                    .into(),
            // As an entry written before the flag existed reads back.
            resources: Resources::default(),
            compile_ms: 1.0,
            arch: "sm_90a".into(),
        };
        let (_, back) = decode_entry(&encode_entry(&key, &k).unwrap(), Some(&key)).unwrap();
        assert!(back.resources.wgmma_serialized);
    }

    #[test]
    fn entry_roundtrip_and_rejections() {
        let key = "ab".repeat(32);
        let k = CompiledKernel {
            kernel_name: "k".into(),
            cubin: vec![1, 2, 3, 4, 5],
            log: "ptxas info".into(),
            resources: Resources {
                registers: 32,
                ..Default::default()
            },
            compile_ms: 12.5,
            arch: "sm_80".into(),
        };
        let bytes = encode_entry(&key, &k).unwrap();
        let (kk, back) = decode_entry(&bytes, Some(&key)).unwrap();
        assert_eq!(kk, key);
        assert_eq!(back, k);
        assert!(
            decode_entry(&bytes, Some(&"cd".repeat(32))).is_err(),
            "other key"
        );
        assert!(
            decode_entry(&bytes[..bytes.len() - 1], Some(&key)).is_err(),
            "truncated"
        );
        assert!(
            decode_entry(&bytes[..10], Some(&key)).is_err(),
            "truncated header"
        );
        let mut flipped = bytes.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0xff;
        assert!(decode_entry(&flipped, Some(&key)).is_err(), "corrupted");
        let mut magic = bytes.clone();
        magic[0] = b'X';
        assert!(decode_entry(&magic, Some(&key)).is_err(), "magic");
        let mut ver = bytes;
        ver[8] = 99;
        assert!(decode_entry(&ver, Some(&key)).is_err(), "version");
    }
}
