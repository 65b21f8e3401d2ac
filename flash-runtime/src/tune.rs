//! Autotuning of tile configurations, remembered per variant, GPU and shape bucket.
//!
//! **Search.** [`search_space`] lists every tile configuration of every kernel family the
//! architecture runs (block_m, block_n, warps, stages); [`tune`] prunes, before anything is
//! timed, what the MMA layout cannot take ([`flash_dsl::plan::config_is_valid`]), what asks for
//! more shared memory than the device's opt-in limit, and — after compiling the rest in parallel
//! on the CPU cores — every kernel ptxas had to spill registers for. The survivors are timed
//! through a [`Timer`] (CUDA events on the GPU, [`GpuTimer`]; a deterministic fake in tests),
//! and the fastest one that passes the timer's correctness check wins.
//!
//! **Records.** A [`TuneRecord`] is keyed by a [`TuneKey`]: the hash of the spec (not of the
//! configuration), the GPU's name and architecture, the NVRTC and generator versions, and a
//! [`ShapeBucket`] (sequence lengths and batch·heads rounded up to powers of two, the GQA group
//! size). Records live in `<cache dir>/tune/<sha256(key)[..32]>.json` beside the kernel cache's
//! entries, written to a temp file in the same folder and renamed over the old one, so a reader
//! sees a whole record or none. Every field but the key and the configuration has a serde
//! default, so older records load; a record that does not parse, is of a newer format, or holds
//! another key is ignored with a `tracing::warn!`.
//!
//! **Launch.** [`Runtime::load_tuned`] uses the remembered configuration for the problem's
//! bucket, else the heuristic default; [`Runtime::load`] with `Some(config)` still forces one.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaSlice;
use flash_dsl::eval::{tensor_shape, Env, ParamValue, ParamValues, Point, Sizes};
use flash_dsl::plan::{config_is_valid, default_config_for, KernelFamily};
/// The deterministic generator the tuner draws inputs and params from.
pub use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::spec::{DType, Dim, ParamKind, ScalarTy};
use flash_dsl::{TileConfig, VariantSpec};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cache::KernelCache;
use crate::compile::{CompileOptions, Resources};
use crate::error::FlashError;
use crate::launch::{LoadedKernel, LseMut, ProblemShape, Runtime, TensorMut, TensorRef};
use crate::variant::ParamArg;

/// Version of the record format; a record of a newer format is ignored.
pub const RECORD_FORMAT: u32 = 1;

fn invalid(msg: impl Into<String>) -> FlashError {
    FlashError::Invalid(msg.into())
}

// ---------------------------------------------------------------------------------------------
// Keys and records
// ---------------------------------------------------------------------------------------------

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
    pub spec_hash: String,
    /// The GPU's name as the driver reports it (`NVIDIA H200`).
    pub gpu: String,
    /// NVRTC target (`sm_90a`).
    pub arch: String,
    /// `major.minor` of NVRTC.
    pub nvrtc: String,
    /// [`flash_dsl::GENERATOR_VERSION`].
    pub generator: String,
    pub bucket: ShapeBucket,
}

impl TuneKey {
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
    #[serde(default = "record_format")]
    pub format: u32,
    pub key: TuneKey,
    /// The winning configuration.
    pub config: TileConfig,
    #[serde(default)]
    pub variant: String,
    /// Median milliseconds of the winner at the tuned shape.
    #[serde(default)]
    pub ms: f64,
    /// The heuristic default and its median milliseconds (0 when it was not timed).
    #[serde(default)]
    pub default_config: Option<TileConfig>,
    #[serde(default)]
    pub default_ms: f64,
    /// The exact shape tuned on.
    #[serde(default)]
    pub shape: Option<[usize; 5]>,
    #[serde(default)]
    pub candidates: usize,
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
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }
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

    /// Writes `rec` atomically (temp file in the same folder, fsync, rename). Returns its path.
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

// ---------------------------------------------------------------------------------------------
// Search
// ---------------------------------------------------------------------------------------------

/// Every tile configuration of every family `arch` runs, valid or not (pruning comes later).
/// `only` restricts the families.
pub fn search_space(arch: &str, only: Option<KernelFamily>) -> Vec<TileConfig> {
    let mut v = Vec::new();
    for family in [KernelFamily::Sm80, KernelFamily::Sm90, KernelFamily::Sm90Ws] {
        if !family.runs_on(arch) || only.is_some_and(|f| f != family) {
            continue;
        }
        for block_m in [64, 128, 192, 256] {
            for warps in [4, 8, 12, 16, 20] {
                for block_n in [32, 64, 128] {
                    for stages in 1..=3 {
                        v.push(TileConfig {
                            block_m,
                            block_n,
                            warps,
                            stages,
                            family,
                        });
                    }
                }
            }
        }
    }
    v
}

/// `BMxBNxWxS` plus the kernel family.
pub fn config_label(c: &TileConfig) -> String {
    format!(
        "{}x{}x{}x{}{}",
        c.block_m,
        c.block_n,
        c.warps,
        c.stages,
        match c.family {
            KernelFamily::Sm80 => "/sm80",
            KernelFamily::Sm90 => "/sm90",
            KernelFamily::Sm90Ws => "/sm90ws",
        }
    )
}

/// Where one candidate ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Status {
    /// Dropped before compiling or timing, with the reason.
    Pruned(String),
    /// NVRTC rejected it.
    CompileFailed(String),
    /// The launch or the timing failed.
    Failed(String),
    /// Its output disagreed with the reference.
    Wrong(String),
    /// Timed and correct.
    Ok,
    /// The fastest correct candidate.
    Winner,
}

impl Status {
    pub fn short(&self) -> String {
        match self {
            Status::Pruned(w) => format!("pruned: {w}"),
            Status::CompileFailed(w) => format!("compile failed: {}", first_line(w)),
            Status::Failed(w) => format!("failed: {}", first_line(w)),
            Status::Wrong(w) => format!("WRONG: {w}"),
            Status::Ok => "ok".into(),
            Status::Winner => "WINNER".into(),
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// One row of the tuning table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub config: TileConfig,
    pub resources: Option<Resources>,
    pub ms: Option<f64>,
    pub tflops: Option<f64>,
    pub status: Status,
}

/// Compiles a candidate and reports ptxas's figures. Called from several threads at once.
pub trait Compiler: Sync {
    fn compile(&self, spec: &VariantSpec, cfg: &TileConfig) -> Result<Resources, String>;
}

/// Times and checks candidates (one at a time, on one device).
pub trait Timer {
    /// Median milliseconds of one forward pass with `cfg`.
    fn time(&mut self, cfg: &TileConfig) -> Result<f64, String>;
    /// `Ok` when `cfg`'s output agrees with the reference; `Err` says how it does not.
    fn check(&mut self, cfg: &TileConfig) -> Result<(), String>;
    /// After a failure: whether the device can still run anything (a kernel fault poisons a
    /// CUDA context for good). `Err` aborts the search.
    fn healthy(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// Start of the error message of a search aborted because a candidate killed the CUDA
/// context; the candidate's label (see [`config_label`]) follows, then `: `.
pub const CONTEXT_LOST: &str = "the CUDA context died after candidate ";

/// Progress of a tuning run, for a progress bar.
#[derive(Debug, Clone)]
pub enum Progress {
    Compiled { done: usize, total: usize },
    Pruned { config: TileConfig, why: String },
    Timed { done: usize, total: usize },
}

/// Limits of the search.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// The device's opt-in shared memory per block.
    pub max_smem: u32,
    /// Compile threads (0: the available parallelism).
    pub threads: usize,
    /// Restrict the search to one kernel family.
    pub family: Option<KernelFamily>,
    /// Useful floating-point operations of one forward pass (for TFLOP/s), 0 if unknown.
    pub flops: f64,
    /// Labels ([`config_label`]) of configurations to leave out.
    pub exclude: Vec<String>,
    /// The default stays unless the fastest candidate beats it by more than this fraction
    /// (0.02: 2%), so that timing noise never replaces it with a configuration that is no
    /// faster (measured on an H200: winners within 0.5% of the default re-timed up to 1.4%
    /// slower).
    pub min_gain: f64,
}

/// The outcome of [`tune`].
#[derive(Debug, Clone)]
pub struct TuneResult {
    /// Every configuration considered, in search order.
    pub candidates: Vec<Candidate>,
    /// The heuristic default for this arch.
    pub default: TileConfig,
    pub default_ms: Option<f64>,
    pub winner: TileConfig,
    pub winner_ms: f64,
    pub tune_s: f64,
}

impl TuneResult {
    pub fn count(&self, pred: impl Fn(&Status) -> bool) -> usize {
        self.candidates.iter().filter(|c| pred(&c.status)).count()
    }
}

/// Runs the search: prune by layout and shared memory, compile the rest in parallel, prune
/// spills, time every survivor (the default first), check the candidates fastest first until
/// one passes. Errors only when no candidate survives.
pub fn tune(
    spec: &VariantSpec,
    arch: &str,
    opts: &TuneOptions,
    compiler: &dyn Compiler,
    timer: &mut dyn Timer,
    progress: &mut dyn FnMut(&Progress),
) -> Result<TuneResult, FlashError> {
    let start = Instant::now();
    let default = default_config_for(spec, opts.family.unwrap_or(KernelFamily::for_arch(arch)));
    let mut cands: Vec<Candidate> = search_space(arch, opts.family)
        .into_iter()
        .map(|config| {
            let status = match config_is_valid(spec, &config) {
                _ if opts.exclude.contains(&config_label(&config)) => {
                    Status::Pruned("excluded (it faulted in an earlier attempt)".into())
                }
                Err(e) => Status::Pruned(format!("layout: {e}")),
                Ok(()) => {
                    let smem = flash_dsl::plan::smem_bytes(spec, &config);
                    if smem > opts.max_smem {
                        Status::Pruned(format!(
                            "shared memory {smem} B > device opt-in limit {} B",
                            opts.max_smem
                        ))
                    } else {
                        Status::Ok
                    }
                }
            };
            Candidate {
                config,
                resources: None,
                ms: None,
                tflops: None,
                status,
            }
        })
        .collect();
    // Configurations that are merely layout-invalid are not worth a table row each: keep the
    // rows but report them through progress as one line per reason class only when few.
    for c in &cands {
        if let Status::Pruned(why) = &c.status {
            if !why.starts_with("layout") {
                progress(&Progress::Pruned {
                    config: c.config,
                    why: why.clone(),
                });
            }
        }
    }

    // Compile the survivors in parallel.
    let todo: Vec<usize> = (0..cands.len())
        .filter(|&i| cands[i].status == Status::Ok)
        .collect();
    let threads = if opts.threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        opts.threads
    }
    .clamp(1, todo.len().max(1));
    let next = AtomicUsize::new(0);
    let total = todo.len();
    let mut results: Vec<(usize, Result<Resources, String>)> = Vec::with_capacity(total);
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..threads {
            let tx = tx.clone();
            let (next, todo, cands) = (&next, &todo, &cands);
            s.spawn(move || loop {
                let j = next.fetch_add(1, Ordering::Relaxed);
                let Some(&i) = todo.get(j) else { break };
                let r = compiler.compile(spec, &cands[i].config);
                if tx.send((i, r)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for r in rx {
            results.push(r);
            progress(&Progress::Compiled {
                done: results.len(),
                total,
            });
        }
    });
    for (i, r) in results {
        let c = &mut cands[i];
        match r {
            Ok(res) => {
                c.resources = Some(res);
                if res.spills() {
                    c.status = Status::Pruned(format!(
                        "spills {} B stores / {} B loads ({} registers)",
                        res.spill_stores, res.spill_loads, res.registers
                    ));
                    progress(&Progress::Pruned {
                        config: c.config,
                        why: c.status.short(),
                    });
                }
            }
            Err(e) => c.status = Status::CompileFailed(e),
        }
    }

    // Time: the default first (it is the baseline, and the GPU timer's reference).
    let mut order: Vec<usize> = (0..cands.len())
        .filter(|&i| cands[i].status == Status::Ok)
        .collect();
    order.sort_by_key(|&i| cands[i].config != default);
    let total = order.len();
    for (n, &i) in order.iter().enumerate() {
        let c = &mut cands[i];
        match timer.time(&c.config) {
            Ok(ms) => {
                c.ms = Some(ms);
                if opts.flops > 0.0 && ms > 0.0 {
                    c.tflops = Some(opts.flops / (ms * 1e-3) / 1e12);
                }
            }
            Err(e) => {
                c.status = Status::Failed(e.clone());
                if let Err(h) = timer.healthy() {
                    return Err(FlashError::Driver(format!(
                        "{CONTEXT_LOST}{}: {e} ({h})",
                        config_label(&c.config)
                    )));
                }
            }
        }
        progress(&Progress::Timed { done: n + 1, total });
    }

    // Check fastest first; the first that passes wins.
    let mut timed: Vec<usize> = (0..cands.len())
        .filter(|&i| cands[i].status == Status::Ok && cands[i].ms.is_some())
        .collect();
    timed.sort_by(|&a, &b| cands[a].ms.partial_cmp(&cands[b].ms).expect("finite"));
    let mut winner = None;
    for &i in &timed {
        match timer.check(&cands[i].config) {
            Ok(()) => {
                cands[i].status = Status::Winner;
                winner = Some(i);
                break;
            }
            Err(e) => {
                if let Err(h) = timer.healthy() {
                    return Err(FlashError::Driver(format!(
                        "{CONTEXT_LOST}{}: {e} ({h})",
                        config_label(&cands[i].config)
                    )));
                }
                cands[i].status = Status::Wrong(e)
            }
        }
    }
    let Some(w) = winner else {
        // Say why, one example per kind of failure.
        let mut why: Vec<String> = Vec::new();
        for c in &cands {
            let kind = match &c.status {
                Status::Pruned(w) if w.starts_with("layout") => continue,
                Status::Pruned(_) => "pruned",
                Status::CompileFailed(_) => "compile failed",
                Status::Failed(_) => "failed",
                Status::Wrong(_) => "wrong",
                Status::Ok | Status::Winner => continue,
            };
            if !why.iter().any(|w| w.starts_with(kind)) {
                why.push(format!(
                    "{kind} (e.g. {}: {})",
                    config_label(&c.config),
                    c.status.short()
                ));
            }
        }
        return Err(invalid(format!(
            "no candidate of `{}` survived tuning ({} considered): {}",
            spec.name,
            cands.len(),
            why.join("; ")
        )));
    };
    let default_ms = cands
        .iter()
        .find(|c| c.config == default)
        .and_then(|c| c.ms);
    // Keep the default when the winner's gain is within the noise margin.
    let mut w = w;
    if let (Some(d), Some(di)) = (default_ms, cands.iter().position(|c| c.config == default)) {
        let wm = cands[w].ms.expect("timed");
        if di != w && cands[di].status == Status::Ok && d <= wm * (1.0 + opts.min_gain) {
            match timer.check(&default) {
                Ok(()) => {
                    cands[w].status = Status::Ok;
                    cands[di].status = Status::Winner;
                    w = di;
                }
                Err(e) => cands[di].status = Status::Wrong(e),
            }
        }
    }
    Ok(TuneResult {
        default,
        default_ms,
        winner: cands[w].config,
        winner_ms: cands[w].ms.expect("timed"),
        candidates: cands,
        tune_s: start.elapsed().as_secs_f64(),
    })
}

/// Compiles through a kernel cache (thread-safe, shared by processes).
pub struct CacheCompiler<'a> {
    pub cache: &'a KernelCache,
    pub arch: String,
}

impl Compiler for CacheCompiler<'_> {
    fn compile(&self, spec: &VariantSpec, cfg: &TileConfig) -> Result<Resources, String> {
        let plan = flash_dsl::plan(spec, Some(*cfg)).map_err(|e| e.to_string())?;
        let src = flash_dsl::emit(&plan);
        let (k, _) = self
            .cache
            .get_or_compile(&src, &CompileOptions::new(self.arch.clone()))
            .map_err(|e| e.to_string())?;
        Ok(k.resources)
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------------

/// Plausible values for every param the user did not give: document ids sorted in `[0, 8)` for
/// an i32 `[seq]` tensor, ALiBi slopes `2^(-8(h+1)/H)` for an f32 `[heads]` tensor, random
/// normals for other f32 tensors, random ints in `[0, 8)` for other i32 tensors, `seq_k / 4`
/// for an i32 scalar and 30 for an f32 scalar.
pub fn default_params(
    spec: &VariantSpec,
    sizes: Sizes,
    given: &[(String, ParamValue)],
    seed: u64,
) -> ParamValues {
    let mut rng = Rng(seed);
    let vals = spec
        .params
        .iter()
        .map(|decl| {
            if let Some((_, v)) = given.iter().find(|(n, _)| *n == decl.name) {
                return v.clone();
            }
            match &decl.kind {
                ParamKind::Scalar(ScalarTy::I32) => ParamValue::Int((sizes.seq_k / 4) as i64),
                ParamKind::Scalar(ScalarTy::F32) => ParamValue::Float(30.0),
                ParamKind::Tensor { elem, dims } => {
                    let n: usize = tensor_shape(dims, sizes).iter().product();
                    match (elem, dims.as_slice()) {
                        (ScalarTy::I32, [Dim::Seq]) => {
                            let mut ids: Vec<i64> =
                                (0..n).map(|_| (rng.next_u64() % 8) as i64).collect();
                            ids.sort_unstable();
                            ParamValue::IntTensor(ids)
                        }
                        (ScalarTy::I32, _) => ParamValue::IntTensor(
                            (0..n).map(|_| (rng.next_u64() % 8) as i64).collect(),
                        ),
                        (ScalarTy::F32, [Dim::Heads]) => ParamValue::FloatTensor(
                            (0..n)
                                .map(|h| (2f64).powf(-8.0 * (h + 1) as f64 / n as f64))
                                .collect(),
                        ),
                        (ScalarTy::F32, _) => {
                            ParamValue::FloatTensor((0..n).map(|_| rng.normal()).collect())
                        }
                    }
                }
            }
        })
        .collect();
    ParamValues(vals)
}

/// Fraction of (query, key) pairs the mask keeps, estimated on a grid of at most 256 × 256
/// points of batch 0, head 0 (1 for a dense variant).
pub fn mask_density(spec: &VariantSpec, params: &ParamValues, sizes: Sizes) -> f64 {
    if spec.mask.is_none() || sizes.seq_q == 0 || sizes.seq_k == 0 {
        return 1.0;
    }
    let env = Env::new(spec, params, sizes);
    let (nq, nk) = (sizes.seq_q.min(256), sizes.seq_k.min(256));
    let mut kept = 0usize;
    for i in 0..nq {
        for j in 0..nk {
            let p = Point {
                b: 0,
                h: 0,
                q: (i * sizes.seq_q / nq) as i64,
                k: (j * sizes.seq_k / nk) as i64,
                s: 0.0,
            };
            kept += usize::from(env.mask(&p));
        }
    }
    kept as f64 / (nq * nk) as f64
}

/// Useful FLOPs of one forward pass: `2·B·H·Nq·Nk·(d_qk + d_v)` times the mask density.
pub fn forward_flops(spec: &VariantSpec, shape: &ProblemShape, density: f64) -> f64 {
    2.0 * (shape.batch * shape.heads_q) as f64
        * shape.seq_q as f64
        * shape.seq_k as f64
        * (spec.head_dim_qk + spec.head_dim_v) as f64
        * density
}

// ---------------------------------------------------------------------------------------------
// The GPU timer
// ---------------------------------------------------------------------------------------------

enum ParamHold {
    I32(i32),
    F32(f32),
    TI(CudaSlice<i32>, usize),
    TF(CudaSlice<f32>, usize),
}

/// Times candidates with CUDA events on random inputs of one shape and checks each against the
/// default configuration's output on the same inputs and, when a [`SpotCheck`] is attached (as
/// `Runtime::tune` does), against the float64 reference on a small odd-sized problem.
pub struct GpuTimer<'r> {
    rt: &'r Runtime,
    spec: VariantSpec,
    shape: ProblemShape,
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    o: CudaSlice<u16>,
    lse: CudaSlice<f32>,
    params: Vec<ParamHold>,
    poison: Vec<u16>,
    reference: Option<Vec<f32>>,
    /// The float64 check every candidate passes on a small odd-sized problem.
    spot: Option<Box<SpotCheck<'r>>>,
    pub warmup: usize,
    pub iters: usize,
}

/// Every candidate also runs a small problem with odd sizes (257 queries, 300 keys, two
/// batches, GQA when the tuned shape has it), so tiles are partial and masks cut through them,
/// and its output is held to FlashAttention's rule against the float64 reference: max error at
/// most twice that of a plain same-precision implementation.
pub struct SpotCheck<'r> {
    timer: GpuTimer<'r>,
    /// Reference output and the error bound, computed on the CPU once.
    want: Option<(Vec<f64>, f64)>,
    params: ParamValues,
}

impl<'r> SpotCheck<'r> {
    /// The spot problem for `spec` tuned at `tuned`; params drawn like the tuning's own (scalar
    /// values the user gave are kept; tensors are redrawn at the small size).
    pub fn new(
        rt: &'r Runtime,
        spec: &VariantSpec,
        tuned: ProblemShape,
        given: &[(String, ParamValue)],
    ) -> Result<SpotCheck<'r>, FlashError> {
        let gqa = tuned.heads_q != tuned.heads_kv;
        let shape = ProblemShape {
            batch: 2,
            heads_q: 2,
            heads_kv: if gqa { 1 } else { 2 },
            seq_q: 257,
            seq_k: 300,
        };
        let sizes = Sizes {
            batch: shape.batch,
            heads: shape.heads_q,
            seq_q: shape.seq_q,
            seq_k: shape.seq_k,
        };
        let scalars: Vec<(String, ParamValue)> = given
            .iter()
            .filter(|(_, v)| matches!(v, ParamValue::Int(_) | ParamValue::Float(_)))
            .cloned()
            .collect();
        let params = default_params(spec, sizes, &scalars, 0x5907);
        Ok(SpotCheck {
            timer: GpuTimer::new(rt, spec, shape, &params, 0x5907)?,
            want: None,
            params,
        })
    }

    /// `Ok` when `cfg` meets the rule on the spot problem; `Err` gives both errors.
    fn check(&mut self, cfg: &TileConfig) -> Result<(), String> {
        if self.want.is_none() {
            let problem = self
                .timer
                .host_problem(&self.params)
                .map_err(|e| e.to_string())?;
            let spec = &self.timer.spec;
            let exact = flash_dsl::reference::forward(spec, &problem).o;
            let plain = flash_dsl::reference::forward_lowp(
                spec,
                &problem,
                flash_dsl::reference::rounding(spec.dtype),
            )
            .o;
            let bound = 2.0 * flash_dsl::reference::max_abs_diff(&plain, &exact) + 1e-6;
            self.want = Some((exact, bound));
        }
        let got = self.timer.output(cfg).map_err(|e| e.to_string())?;
        let (exact, bound) = self.want.as_ref().expect("set above");
        if let Some(i) = got.iter().position(|x| !x.is_finite()) {
            return Err(format!(
                "spot check: element {i} is {} (unwritten or NaN)",
                got[i]
            ));
        }
        let got: Vec<f64> = got.iter().map(|&x| x as f64).collect();
        let err = flash_dsl::reference::max_abs_diff(&got, exact);
        if err > *bound {
            return Err(format!(
                "spot check against the float64 reference (257x300): max error {err:.3e} > 2x the plain implementation's ({bound:.3e})"
            ));
        }
        Ok(())
    }
}

fn drv(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> FlashError {
    move |e| FlashError::Driver(format!("{what}: {e:?}"))
}

fn to_bits(dtype: DType, x: f32) -> u16 {
    match dtype {
        DType::Bf16 => half::bf16::from_f32(x).to_bits(),
        DType::F16 => half::f16::from_f32(x).to_bits(),
    }
}

fn from_bits(dtype: DType, b: u16) -> f32 {
    match dtype {
        DType::Bf16 => half::bf16::from_bits(b).to_f32(),
        DType::F16 => half::f16::from_bits(b).to_f32(),
    }
}

impl<'r> GpuTimer<'r> {
    /// Uploads random Q, K, V (uniform in `[-1, 1)`, never zeros) and `params`.
    pub fn new(
        rt: &'r Runtime,
        spec: &VariantSpec,
        shape: ProblemShape,
        params: &ParamValues,
        seed: u64,
    ) -> Result<GpuTimer<'r>, FlashError> {
        let stream = rt.stream().clone();
        let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
        let n_q = shape.batch * shape.seq_q * shape.heads_q * dqk;
        let n_k = shape.batch * shape.seq_k * shape.heads_kv * dqk;
        let n_v = shape.batch * shape.seq_k * shape.heads_kv * dv;
        let n_o = shape.batch * shape.seq_q * shape.heads_q * dv;
        let mut rng = Rng(seed);
        let mut draw = |n: usize| -> Vec<u16> {
            (0..n.max(8))
                .map(|_| {
                    let x = (rng.uniform() * 2.0 - 1.0) as f32;
                    to_bits(spec.dtype, if x == 0.0 { 0.5 } else { x })
                })
                .collect()
        };
        let q = stream.clone_htod(&draw(n_q)).map_err(drv("uploading Q"))?;
        let k = stream.clone_htod(&draw(n_k)).map_err(drv("uploading K"))?;
        let v = stream.clone_htod(&draw(n_v)).map_err(drv("uploading V"))?;
        let o = stream
            .alloc_zeros::<u16>(n_o.max(8))
            .map_err(drv("allocating O"))?;
        let lse = stream
            .alloc_zeros::<f32>((shape.batch * shape.heads_q * shape.seq_q).max(1))
            .map_err(drv("allocating the LSE"))?;
        let mut holds = Vec::new();
        for (decl, val) in spec.params.iter().zip(&params.0) {
            let pad = |n: usize| n.max(8);
            let h = match (&decl.kind, val) {
                (ParamKind::Scalar(ScalarTy::I32), ParamValue::Int(x)) => ParamHold::I32(*x as i32),
                (ParamKind::Scalar(ScalarTy::F32), ParamValue::Float(x)) => {
                    ParamHold::F32(*x as f32)
                }
                (ParamKind::Scalar(ScalarTy::F32), ParamValue::Int(x)) => ParamHold::F32(*x as f32),
                (ParamKind::Tensor { .. }, ParamValue::IntTensor(t)) => {
                    let mut d: Vec<i32> = t.iter().map(|&x| x as i32).collect();
                    d.resize(pad(t.len()), 0);
                    ParamHold::TI(
                        stream.clone_htod(&d).map_err(drv("uploading a param"))?,
                        t.len(),
                    )
                }
                (ParamKind::Tensor { .. }, ParamValue::FloatTensor(t)) => {
                    let mut d: Vec<f32> = t.iter().map(|&x| x as f32).collect();
                    d.resize(pad(t.len()), 0.0);
                    ParamHold::TF(
                        stream.clone_htod(&d).map_err(drv("uploading a param"))?,
                        t.len(),
                    )
                }
                (_, v) => {
                    return Err(invalid(format!(
                        "param `{}` is declared {:?}; got the value {v:?}",
                        decl.name, decl.kind
                    )))
                }
            };
            holds.push(h);
        }
        Ok(GpuTimer {
            rt,
            spec: spec.clone(),
            shape,
            q,
            k,
            v,
            o,
            lse,
            params: holds,
            poison: vec![0xffff; n_o.max(8)],
            reference: None,
            spot: None,
            warmup: 3,
            iters: 15,
        })
    }

    fn kernel(&self, cfg: &TileConfig) -> Result<Arc<LoadedKernel>, FlashError> {
        self.rt.load(&self.spec, Some(*cfg))
    }

    /// Median milliseconds of `warmup` + `iters` launches of `kernel`.
    pub fn time_kernel(
        &mut self,
        kernel: &LoadedKernel,
        warmup: usize,
        iters: usize,
    ) -> Result<f64, FlashError> {
        let stream = self.rt.stream().clone();
        let s = self.shape;
        let (dqk, dv) = (
            self.spec.head_dim_qk as usize,
            self.spec.head_dim_v as usize,
        );
        let args = param_args(&self.params, &stream);
        let tq = TensorRef::new(&self.q, [s.batch, s.seq_q, s.heads_q, dqk], &stream);
        let tk = TensorRef::new(&self.k, [s.batch, s.seq_k, s.heads_kv, dqk], &stream);
        let tv = TensorRef::new(&self.v, [s.batch, s.seq_k, s.heads_kv, dv], &stream);
        let mut to = TensorMut::new(&mut self.o, [s.batch, s.seq_q, s.heads_q, dv], &stream);
        let mut tl = LseMut::new(&mut self.lse, &stream);
        let ms = self.rt.time_forward(
            kernel, &tq, &tk, &tv, &mut to, &mut tl, &args, warmup, iters,
        )?;
        Ok(ms as f64)
    }

    /// Runs `cfg` once on poisoned O and returns O as f32.
    fn output(&mut self, cfg: &TileConfig) -> Result<Vec<f32>, FlashError> {
        let kernel = self.kernel(cfg)?;
        let stream = self.rt.stream().clone();
        stream
            .memcpy_htod(&self.poison, &mut self.o)
            .map_err(drv("poisoning O"))?;
        self.time_kernel(&kernel, 0, 1)?;
        self.rt.synchronize()?;
        let host: Vec<u16> = stream.clone_dtoh(&self.o).map_err(drv("copying O back"))?;
        let n = self.shape.batch
            * self.shape.seq_q
            * self.shape.heads_q
            * self.spec.head_dim_v as usize;
        Ok(host[..n]
            .iter()
            .map(|&b| from_bits(self.spec.dtype, b))
            .collect())
    }
}

impl<'r> GpuTimer<'r> {
    /// Attaches the float64 spot check that every candidate must also pass.
    pub fn set_spot_check(&mut self, spot: SpotCheck<'r>) {
        self.spot = Some(Box::new(spot));
    }

    /// The problem on the host, exactly as uploaded (Q, K, V rounded to the dtype), for the
    /// float64 reference.
    fn host_problem(
        &self,
        params: &ParamValues,
    ) -> Result<flash_dsl::reference::Problem, FlashError> {
        let stream = self.rt.stream().clone();
        let s = self.shape;
        let (dqk, dv) = (
            self.spec.head_dim_qk as usize,
            self.spec.head_dim_v as usize,
        );
        let down = |buf: &CudaSlice<u16>, n: usize| -> Result<Vec<f64>, FlashError> {
            let host: Vec<u16> = stream.clone_dtoh(buf).map_err(drv("copying inputs back"))?;
            Ok(host[..n]
                .iter()
                .map(|&b| from_bits(self.spec.dtype, b) as f64)
                .collect())
        };
        Ok(flash_dsl::reference::Problem {
            batch: s.batch,
            heads_q: s.heads_q,
            heads_kv: s.heads_kv,
            seq_q: s.seq_q,
            seq_k: s.seq_k,
            q: down(&self.q, s.batch * s.seq_q * s.heads_q * dqk)?,
            k: down(&self.k, s.batch * s.seq_k * s.heads_kv * dqk)?,
            v: down(&self.v, s.batch * s.seq_k * s.heads_kv * dv)?,
            params: params.clone(),
        })
    }
}

fn param_args<'a>(
    holds: &'a [ParamHold],
    stream: &cudarc::driver::CudaStream,
) -> Vec<ParamArg<'a>> {
    holds
        .iter()
        .map(|h| match h {
            ParamHold::I32(x) => ParamArg::I32(*x),
            ParamHold::F32(x) => ParamArg::F32(*x),
            ParamHold::TI(s, n) => with_len(ParamArg::tensor_i32(s, stream), *n),
            ParamHold::TF(s, n) => with_len(ParamArg::tensor_f32(s, stream), *n),
        })
        .collect()
}

fn with_len(mut p: ParamArg<'_>, n: usize) -> ParamArg<'_> {
    if let ParamArg::Tensor { len, .. } = &mut p {
        *len = n;
    }
    p
}

/// Largest elementwise difference allowed between two configurations' outputs: a few units in
/// the last place of the output type at magnitude 1 (tiles change the accumulation order).
pub fn output_tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::Bf16 => 1.0 / 32.0,
        DType::F16 => 1.0 / 256.0,
    }
}

/// Compares `got` with `want`: `Err` names the worst element, or the count never written (NaN).
pub fn compare_outputs(got: &[f32], want: &[f32], tol: f32) -> Result<(), String> {
    let mut worst = (0.0f32, 0usize);
    let mut nan = 0usize;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g.is_nan() != w.is_nan() {
            nan += 1;
            continue;
        }
        let d = (g - w).abs();
        if d > worst.0 {
            worst = (d, i);
        }
    }
    if nan > 0 {
        return Err(format!("{nan} elements NaN or unwritten"));
    }
    if worst.0 > tol {
        return Err(format!(
            "max |diff| {:.3e} at element {} (> {tol:.1e})",
            worst.0, worst.1
        ));
    }
    Ok(())
}

impl Timer for GpuTimer<'_> {
    fn time(&mut self, cfg: &TileConfig) -> Result<f64, String> {
        let k = self.kernel(cfg).map_err(|e| e.to_string())?;
        let (w, n) = (self.warmup, self.iters);
        self.time_kernel(&k, w, n).map_err(|e| e.to_string())
    }

    fn check(&mut self, cfg: &TileConfig) -> Result<(), String> {
        if self.reference.is_none() {
            let family = self.rt.info().default_family;
            let d = default_config_for(&self.spec, family);
            let r = self
                .output(&d)
                .map_err(|e| format!("default config: {e}"))?;
            if let Some(nan) = r.iter().position(|x| x.is_nan()) {
                return Err(format!("the default config left element {nan} unwritten"));
            }
            self.reference = Some(r);
        }
        let got = self.output(cfg).map_err(|e| e.to_string())?;
        compare_outputs(
            &got,
            self.reference.as_deref().expect("set above"),
            output_tolerance(self.spec.dtype),
        )?;
        match self.spot.as_mut() {
            Some(spot) => spot.check(cfg),
            None => Ok(()),
        }
    }

    fn healthy(&mut self) -> Result<(), String> {
        self.rt.synchronize().map_err(|e| e.to_string())?;
        self.rt
            .stream()
            .alloc_zeros::<u8>(16)
            .map(drop)
            .map_err(|e| format!("allocating after the failure: {e:?}"))
    }
}

// ---------------------------------------------------------------------------------------------
// Runtime integration
// ---------------------------------------------------------------------------------------------

/// What a caller of [`Runtime::tune`] may restrict.
#[derive(Debug, Clone)]
pub struct TuneKnobs {
    /// Only this kernel family (default: every family the GPU runs).
    pub family: Option<KernelFamily>,
    /// Labels of configurations to leave out.
    pub exclude: Vec<String>,
    /// See [`TuneOptions::min_gain`].
    pub min_gain: f64,
}

impl Default for TuneKnobs {
    fn default() -> Self {
        TuneKnobs {
            family: None,
            exclude: Vec::new(),
            min_gain: 0.02,
        }
    }
}

/// Everything one GPU tuning produced.
#[derive(Debug, Clone)]
pub struct TuneReport {
    pub result: TuneResult,
    pub record: TuneRecord,
    /// Where the record was written (`None` for a memory-only cache).
    pub record_path: Option<PathBuf>,
    pub flops: f64,
}

impl Runtime {
    /// The key of `spec` at `shape` on this runtime's GPU.
    pub fn tune_key(
        &self,
        spec: &VariantSpec,
        shape: &ProblemShape,
    ) -> Result<TuneKey, FlashError> {
        let nvrtc = crate::compile::nvrtc_version()?;
        Ok(TuneKey::new(
            spec,
            &self.info().name,
            &self.info().arch,
            nvrtc,
            shape,
        ))
    }

    /// The remembered configuration of `spec` for `shape`'s bucket on this GPU, if any.
    pub fn tuned_config(&self, spec: &VariantSpec, shape: &ProblemShape) -> Option<TileConfig> {
        let key = self.tune_key(spec, shape).ok()?;
        let rec = TuneStore::for_cache(self.cache()).load(&key)?;
        if !rec.config.family.runs_on(&self.info().arch) {
            tracing::warn!(config = ?rec.config, "tuning record names a family this GPU cannot run; ignoring it");
            return None;
        }
        Some(rec.config)
    }

    /// Loads `spec` with the remembered configuration for `shape`, else the heuristic default
    /// (see [`Runtime::load`]; pass a configuration there to force one).
    pub fn load_tuned(
        &self,
        spec: &VariantSpec,
        shape: &ProblemShape,
    ) -> Result<Arc<LoadedKernel>, FlashError> {
        if let Some(cfg) = self.tuned_config(spec, shape) {
            match self.load(spec, Some(cfg)) {
                Ok(k) => return Ok(k),
                Err(e) => {
                    tracing::warn!(error = %e, "remembered configuration failed to load; using the default")
                }
            }
        }
        self.load(spec, None)
    }

    /// Tunes `spec` at `shape` on this GPU (params: the given values, plausible random ones for
    /// the rest), writes the record beside the kernel cache and returns the table.
    pub fn tune(
        &self,
        spec: &VariantSpec,
        shape: ProblemShape,
        given: &[(String, ParamValue)],
        knobs: &TuneKnobs,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<TuneReport, FlashError> {
        let start = Instant::now();
        let sizes = Sizes {
            batch: shape.batch,
            heads: shape.heads_q,
            seq_q: shape.seq_q,
            seq_k: shape.seq_k,
        };
        let params = default_params(spec, sizes, given, 0x5eed);
        let flops = forward_flops(spec, &shape, mask_density(spec, &params, sizes));
        let opts = TuneOptions {
            max_smem: self.info().max_smem_optin,
            threads: 0,
            family: knobs.family,
            flops,
            exclude: knobs.exclude.clone(),
            min_gain: knobs.min_gain,
        };
        let compiler = CacheCompiler {
            cache: self.cache(),
            arch: self.info().arch.clone(),
        };
        let mut timer = GpuTimer::new(self, spec, shape, &params, 0x1234)?;
        timer.set_spot_check(SpotCheck::new(self, spec, shape, given)?);
        let mut result = tune(
            spec,
            &self.info().arch,
            &opts,
            &compiler,
            &mut timer,
            progress,
        )?;
        result.tune_s = start.elapsed().as_secs_f64();
        let record = TuneRecord {
            format: RECORD_FORMAT,
            key: self.tune_key(spec, &shape)?,
            config: result.winner,
            variant: spec.name.clone(),
            ms: result.winner_ms,
            default_config: Some(result.default),
            default_ms: result.default_ms.unwrap_or(0.0),
            shape: Some([
                shape.batch,
                shape.heads_q,
                shape.heads_kv,
                shape.seq_q,
                shape.seq_k,
            ]),
            candidates: result.candidates.len(),
            timed: result.candidates.iter().filter(|c| c.ms.is_some()).count(),
            tune_s: result.tune_s,
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        let store = TuneStore::for_cache(self.cache());
        let record_path = match store.dir() {
            Some(_) => Some(store.store(&record)?),
            None => None,
        };
        Ok(TuneReport {
            result,
            record,
            record_path,
            flops,
        })
    }

    /// Re-times `a` and `b` alternately (`rounds` rounds of `iters` launches after warm-up) on
    /// the same inputs and returns the median of each one's per-round medians.
    #[allow(clippy::too_many_arguments)]
    pub fn compare_configs(
        &self,
        spec: &VariantSpec,
        shape: ProblemShape,
        given: &[(String, ParamValue)],
        a: TileConfig,
        b: TileConfig,
        rounds: usize,
        iters: usize,
    ) -> Result<(f64, f64), FlashError> {
        let sizes = Sizes {
            batch: shape.batch,
            heads: shape.heads_q,
            seq_q: shape.seq_q,
            seq_k: shape.seq_k,
        };
        let params = default_params(spec, sizes, given, 0x5eed);
        let mut timer = GpuTimer::new(self, spec, shape, &params, 0x4321)?;
        let (ka, kb) = (self.load(spec, Some(a))?, self.load(spec, Some(b))?);
        let (mut ta, mut tb) = (Vec::new(), Vec::new());
        for _ in 0..rounds.max(1) {
            ta.push(timer.time_kernel(&ka, 5, iters)?);
            tb.push(timer.time_kernel(&kb, 5, iters)?);
        }
        let med = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        Ok((med(ta), med(tb)))
    }
}
