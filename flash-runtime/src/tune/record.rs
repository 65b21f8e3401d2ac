//! Tuning records: what a record is valid for ([`TuneKey`], [`ShapeBucket`]), what it holds
//! ([`TuneRecord`]), and the folder they live in ([`TuneStore`]), written atomically.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use flash_dsl::{TileConfig, VariantSpec};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cache::KernelCache;
use crate::error::FlashError;
use crate::launch::ProblemShape;

/// Version of the record format; a record of a newer format is ignored.
pub const RECORD_FORMAT: u32 = 1;

fn invalid(msg: impl Into<String>) -> FlashError {
    FlashError::Invalid(msg.into())
}

/// `n` rounded up to a power of two (0 and 1 give 1).
pub fn pow2_bucket(n: usize) -> u64 {
    (n.max(1) as u64).next_power_of_two()
}

/// The shapes one record covers. Everything that changes the generated kernel (head dims,
/// dtype, mask, score) is in the spec and therefore in [`TuneKey::spec_hash`]; the bucket holds
/// what changes only which configuration is fastest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct ShapeBucket {
    /// `seq_q` rounded up to a power of two.
    pub seq_q: u64,
    /// `seq_k` rounded up to a power of two.
    pub seq_k: u64,
    /// `batch · heads_q` rounded up to a power of two (the number of independent rows of blocks).
    pub batch_heads: u64,
    /// `heads_q / heads_kv` rounded up to a power of two (1 for MHA).
    #[serde(default)]
    pub group: u64,
}

impl ShapeBucket {
    /// The bucket of a problem: each size rounded up with [`pow2_bucket`].
    pub fn of(shape: &ProblemShape) -> ShapeBucket {
        ShapeBucket {
            seq_q: pow2_bucket(shape.seq_q),
            seq_k: pow2_bucket(shape.seq_k),
            batch_heads: pow2_bucket(shape.batch * shape.heads_q),
            group: pow2_bucket(shape.heads_q / shape.heads_kv.max(1)),
        }
    }
}

/// Hex SHA-256 of the spec's canonical JSON: the spec decides the kernel (with the tile
/// configuration, which is what is being tuned and so is not hashed).
pub fn spec_hash(spec: &VariantSpec) -> String {
    let json = serde_json::to_vec(spec).expect("a spec serialises");
    hex(&Sha256::digest(&json))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What a record is valid for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TuneKey {
    /// [`spec_hash`] of the variant: a changed declaration never reuses an old record.
    pub spec_hash: String,
    /// The GPU's name as the driver reports it (`NVIDIA H200`).
    pub gpu: String,
    /// NVRTC target (`sm_90a`).
    pub arch: String,
    /// `major.minor` of NVRTC.
    pub nvrtc: String,
    /// [`flash_dsl::GENERATOR_VERSION`].
    pub generator: String,
    /// The shapes the record covers.
    pub bucket: ShapeBucket,
    /// Which pass the record tunes: empty for the forward kernel (so forward keys, and the
    /// file names derived from them, are what they were), `bwd` for the backward main kernel.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pass: String,
}

impl TuneKey {
    /// The forward-pass key of `spec` on a GPU named `gpu` compiling for `arch` with NVRTC
    /// `(major, minor)`, for `shape`'s bucket. Shapes in the same bucket share a key.
    ///
    /// ```
    /// use flash_runtime::tune::{ShapeBucket, TuneKey};
    /// use flash_runtime::ProblemShape;
    ///
    /// let decl = "pub Causal { head_dim: 64, dtype: bf16, mask: causal }";
    /// let spec = flash_dsl::parse::parse_str(decl).unwrap().remove(0);
    /// let shape = ProblemShape { batch: 2, seq_q: 1000, seq_k: 1000, heads_q: 16, heads_kv: 4 };
    /// let key = TuneKey::new(&spec, "NVIDIA H200", "sm_90a", (13, 0), &shape);
    /// assert_eq!(key.bucket, ShapeBucket { seq_q: 1024, seq_k: 1024, batch_heads: 32, group: 4 });
    /// assert_eq!(key.nvrtc, "13.0");
    /// assert_eq!(key.file_stem().len(), 32);
    ///
    /// let same_bucket = ProblemShape { seq_q: 600, ..shape };
    /// assert_eq!(TuneKey::new(&spec, "NVIDIA H200", "sm_90a", (13, 0), &same_bucket), key);
    /// let other_gpu = TuneKey::new(&spec, "NVIDIA H100 80GB HBM3", "sm_90a", (13, 0), &shape);
    /// assert_ne!(other_gpu.file_stem(), key.file_stem());
    /// ```
    pub fn new(
        spec: &VariantSpec,
        gpu: &str,
        arch: &str,
        nvrtc: (i32, i32),
        shape: &ProblemShape,
    ) -> TuneKey {
        TuneKey {
            spec_hash: spec_hash(spec),
            gpu: gpu.to_string(),
            arch: arch.to_string(),
            nvrtc: format!("{}.{}", nvrtc.0, nvrtc.1),
            generator: flash_dsl::GENERATOR_VERSION.to_string(),
            bucket: ShapeBucket::of(shape),
            pass: String::new(),
        }
    }

    /// The record's file name without extension: 32 hex digits of the key's hash.
    pub fn file_stem(&self) -> String {
        let json = serde_json::to_vec(self).expect("a key serialises");
        hex(&Sha256::digest(&json))[..32].to_string()
    }
}

fn record_format() -> u32 {
    RECORD_FORMAT
}

/// One remembered tuning result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneRecord {
    /// [`RECORD_FORMAT`] of the writer; a record of a newer format is ignored on load.
    #[serde(default = "record_format")]
    pub format: u32,
    /// What the record is valid for; a loaded record must echo the key it was looked up by.
    pub key: TuneKey,
    /// The winning configuration.
    pub config: TileConfig,
    /// The variant's declared name (informational: the key holds the spec's hash).
    #[serde(default)]
    pub variant: String,
    /// Median milliseconds of the winner at the tuned shape.
    #[serde(default)]
    pub ms: f64,
    /// The heuristic default and its median milliseconds (0 when it was not timed).
    #[serde(default)]
    pub default_config: Option<TileConfig>,
    /// Median milliseconds of `default_config` (0 when it was not timed).
    #[serde(default)]
    pub default_ms: f64,
    /// The exact shape tuned on.
    #[serde(default)]
    pub shape: Option<[usize; 5]>,
    /// Configurations considered, pruned ones included.
    #[serde(default)]
    pub candidates: usize,
    /// Configurations that were timed.
    #[serde(default)]
    pub timed: usize,
    /// Seconds the whole tuning took.
    #[serde(default)]
    pub tune_s: f64,
    /// Seconds since the Unix epoch when the record was written.
    #[serde(default)]
    pub created_unix: u64,
}

/// The folder of tuning records.
///
/// ```
/// use flash_dsl::plan::{default_config_for, KernelFamily};
/// use flash_runtime::tune::{TuneKey, TuneRecord, TuneStore, RECORD_FORMAT};
/// use flash_runtime::ProblemShape;
///
/// let decl = "pub Causal { head_dim: 64, dtype: bf16, mask: causal }";
/// let spec = flash_dsl::parse::parse_str(decl).unwrap().remove(0);
/// let shape = ProblemShape { batch: 1, seq_q: 4096, seq_k: 4096, heads_q: 8, heads_kv: 8 };
/// let key = TuneKey::new(&spec, "NVIDIA H200", "sm_90a", (13, 0), &shape);
///
/// // Only the key and the configuration are required: every other field has a default.
/// let config = default_config_for(&spec, KernelFamily::Sm90);
/// let json = serde_json::json!({ "key": key, "config": config });
/// let rec: TuneRecord = serde_json::from_value(json).unwrap();
/// assert_eq!(rec.format, RECORD_FORMAT);
///
/// let dir = tempfile::tempdir().unwrap();
/// let store = TuneStore::new(dir.path());
/// assert_eq!(store.load(&key), None);
/// let path = store.store(&rec).unwrap();
/// assert_eq!(Some(path), store.path(&key));
/// assert_eq!(store.load(&key), Some(rec));
/// ```
#[derive(Debug, Clone)]
pub struct TuneStore {
    dir: Option<PathBuf>,
}

impl TuneStore {
    /// Records in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> TuneStore {
        TuneStore {
            dir: Some(dir.into()),
        }
    }
    /// The `tune/` subfolder of a persistent cache's versioned folder; a memory-only cache
    /// gives a store that remembers nothing.
    pub fn for_cache(cache: &KernelCache) -> TuneStore {
        TuneStore {
            dir: cache.dir().map(|d| d.join("tune")),
        }
    }
    /// The records' folder; `None` for the store of a memory-only cache.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }
    /// Where the record for `key` lives (`<dir>/<key.file_stem()>.json`), whether or not it
    /// exists; `None` without a folder.
    pub fn path(&self, key: &TuneKey) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.join(format!("{}.json", key.file_stem())))
    }

    /// The record for `key`, if there is a valid one. Unreadable, corrupt, newer-format and
    /// mismatched records are ignored with a warning.
    pub fn load(&self, key: &TuneKey) -> Option<TuneRecord> {
        let path = self.path(key)?;
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "tuning record unreadable; ignoring it");
                return None;
            }
        };
        let rec: TuneRecord = match serde_json::from_slice(&bytes) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "corrupt tuning record; ignoring it");
                return None;
            }
        };
        if rec.format > RECORD_FORMAT {
            tracing::warn!(path = %path.display(), format = rec.format, "tuning record of a newer format; ignoring it");
            return None;
        }
        if rec.key != *key {
            tracing::warn!(path = %path.display(), "stale tuning record (its key differs); ignoring it");
            return None;
        }
        Some(rec)
    }

    /// Stores `rec` when the store has a folder (a memory-only cache keeps none); the path.
    pub fn store_if_on_disk(&self, rec: &TuneRecord) -> Result<Option<PathBuf>, FlashError> {
        match self.dir() {
            Some(_) => self.store(rec).map(Some),
            None => Ok(None),
        }
    }

    /// Writes `rec` atomically (temp file in the same folder, fsync, rename), replacing the
    /// record of the same key. Returns its path; an error for a store without a folder or when
    /// the folder cannot be written.
    pub fn store(&self, rec: &TuneRecord) -> Result<PathBuf, FlashError> {
        let dir = self
            .dir
            .as_ref()
            .ok_or_else(|| invalid("the kernel cache is memory-only; no tuning record written"))?;
        fs::create_dir_all(dir).map_err(|e| FlashError::io("creating", dir, e))?;
        let path = dir.join(format!("{}.json", rec.key.file_stem()));
        let bytes = serde_json::to_vec_pretty(rec)
            .map_err(|e| invalid(format!("serialising a tuning record: {e}")))?;
        let tmp = dir.join(format!(
            ".{}.{}.{}.tmp",
            rec.key.file_stem(),
            std::process::id(),
            unique()
        ));
        let res = (|| {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            drop(f);
            fs::rename(&tmp, &path)
        })();
        res.map_err(|e| {
            let _ = fs::remove_file(&tmp);
            FlashError::io("writing tuning record", &tmp, e)
        })?;
        Ok(path)
    }
}

fn unique() -> u64 {
    static N: AtomicUsize = AtomicUsize::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let tid = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::thread::current().id().hash(&mut h);
        h.finish()
    };
    t ^ tid ^ ((N.fetch_add(1, Ordering::Relaxed) as u64) << 40)
}

/// `[batch, heads_q, heads_kv, seq_q, seq_k]` of a shape, as records keep it.
pub fn record_shape(shape: &ProblemShape) -> [usize; 5] {
    [
        shape.batch,
        shape.heads_q,
        shape.heads_kv,
        shape.seq_q,
        shape.seq_k,
    ]
}

/// Seconds since the Unix epoch (0 when the clock is before it), for `created_unix`.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
