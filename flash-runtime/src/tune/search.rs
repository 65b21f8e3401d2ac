//! The search: compile the candidates that survive pruning in parallel, drop those that spill,
//! time the rest through a [`Timer`] (the default first) and check them fastest first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use flash_dsl::plan::{default_config_for, default_config_for_launch, KernelFamily};
use flash_dsl::{TileConfig, VariantSpec};

use crate::build::compile_plan;
use crate::cache::KernelCache;
use crate::compile::Resources;
use crate::error::FlashError;

use super::space::{config_label, prune, Candidate, Status};

fn invalid(msg: impl Into<String>) -> FlashError {
    FlashError::Invalid(msg.into())
}

/// Compiles a candidate and reports ptxas's figures. Called from several threads at once.
pub trait Compiler: Sync {
    /// Compiles `spec` with the tile configuration `cfg` and returns ptxas's figures (a
    /// candidate that spills is pruned); `Err` holds why it did not compile, shown in the
    /// candidate's [`Status::CompileFailed`].
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
    /// One more candidate finished compiling (successfully or not).
    Compiled {
        /// Candidates compiled so far.
        done: usize,
        /// Candidates that survived pruning and are being compiled.
        total: usize,
    },
    /// A candidate was dropped for a reason worth showing (shared memory, an exclusion,
    /// spills); candidates the MMA layout cannot take are not reported one by one.
    Pruned {
        /// The dropped configuration.
        config: TileConfig,
        /// Why, as in the candidate's [`Status::short`].
        why: String,
    },
    /// One more candidate was timed.
    Timed {
        /// Candidates timed so far.
        done: usize,
        /// Candidates to time.
        total: usize,
    },
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
    /// Queries of the launch being tuned, where known: the default the candidates are compared
    /// with is then that launch's ([`default_config_for_launch`]: long causal launches take
    /// 192-query tiles), not the length-blind [`default_config_for`], so a winner within the
    /// noise margin never replaces a faster launch default.
    pub seq_q: Option<usize>,
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
    /// Median milliseconds of the default, `None` when it was pruned or failed.
    pub default_ms: Option<f64>,
    /// The fastest candidate that passed the check (or the default, when the fastest beat it
    /// by no more than [`TuneOptions::min_gain`]).
    pub winner: TileConfig,
    /// Median milliseconds of one forward pass with `winner`.
    pub winner_ms: f64,
    /// Wall time of the whole search, in seconds.
    pub tune_s: f64,
}

impl TuneResult {
    /// How many candidates ended with a status for which `pred` holds (e.g. the number
    /// pruned, for the summary line).
    pub fn count(&self, pred: impl Fn(&Status) -> bool) -> usize {
        self.candidates.iter().filter(|c| pred(&c.status)).count()
    }
}

/// Runs the search: prune by layout and shared memory, compile the rest in parallel, prune
/// spills, time every survivor (the default first), check the candidates fastest first until
/// one passes. Errors only when no candidate survives (the message gives one example per kind
/// of failure), or when the timer reports the device lost ([`CONTEXT_LOST`]).
///
/// Compiling and timing are behind traits, so the search runs without a GPU:
///
/// ```
/// use flash_dsl::plan::KernelFamily;
/// use flash_dsl::{TileConfig, VariantSpec};
/// use flash_runtime::tune::{tune, Compiler, Progress, Status, Timer, TuneOptions};
/// use flash_runtime::Resources;
///
/// struct NoSpills;
/// impl Compiler for NoSpills {
///     fn compile(&self, _: &VariantSpec, _: &TileConfig) -> Result<Resources, String> {
///         Ok(Resources::default())
///     }
/// }
/// /// Pretends bigger tiles are faster; every output is correct.
/// struct BiggerIsFaster;
/// impl Timer for BiggerIsFaster {
///     fn time(&mut self, c: &TileConfig) -> Result<f64, String> {
///         Ok(1000.0 / f64::from(c.block_m * c.block_n) + f64::from(c.stages) * 1e-3)
///     }
///     fn check(&mut self, _: &TileConfig) -> Result<(), String> {
///         Ok(())
///     }
/// }
///
/// let decl = "pub Causal { head_dim: 64, dtype: bf16, mask: causal }";
/// let spec = flash_dsl::parse::parse_str(decl).unwrap().remove(0);
/// let opts = TuneOptions {
///     max_smem: 227 * 1024, // H100's opt-in shared memory per block
///     threads: 1,
///     family: Some(KernelFamily::Sm80),
///     seq_q: None,
///     flops: 0.0,
///     exclude: vec![],
///     min_gain: 0.0,
/// };
/// let mut compiled = 0;
/// let mut progress = |p: &Progress| {
///     if let Progress::Compiled { .. } = p {
///         compiled += 1
///     }
/// };
/// let r = tune(&spec, "sm_90a", &opts, &NoSpills, &mut BiggerIsFaster, &mut progress).unwrap();
/// assert!(compiled > 0);
/// assert_eq!(r.count(|s| *s == Status::Winner), 1);
/// assert!(r.candidates.iter().filter_map(|c| c.ms).all(|ms| ms >= r.winner_ms));
/// assert_eq!(r.winner.family, KernelFamily::Sm80);
/// ```
pub fn tune(
    spec: &VariantSpec,
    arch: &str,
    opts: &TuneOptions,
    compiler: &dyn Compiler,
    timer: &mut dyn Timer,
    progress: &mut dyn FnMut(&Progress),
) -> Result<TuneResult, FlashError> {
    let start = Instant::now();
    let family = opts.family.unwrap_or(KernelFamily::for_arch(arch));
    let default = match opts.seq_q {
        Some(n) => default_config_for_launch(spec, family, n),
        None => default_config_for(spec, family),
    };
    let mut cands = prune(spec, arch, opts.family, opts.max_smem, &opts.exclude);
    report_pruned(&cands, progress);
    compile_survivors(spec, &mut cands, opts.threads, compiler, progress);
    time_survivors(&mut cands, &default, opts.flops, timer, progress)?;
    let Some(w) = check_fastest_first(&mut cands, timer)? else {
        return Err(no_survivor(spec, &cands));
    };
    let default_ms = cands
        .iter()
        .find(|c| c.config == default)
        .and_then(|c| c.ms);
    let w = keep_default_within_noise(&mut cands, w, &default, default_ms, opts.min_gain, timer);
    Ok(TuneResult {
        default,
        default_ms,
        winner: cands[w].config,
        winner_ms: cands[w].ms.expect("timed"),
        candidates: cands,
        tune_s: start.elapsed().as_secs_f64(),
    })
}

/// Reports the candidates pruned before compiling. Configurations that are merely
/// layout-invalid are not worth a progress line each: they keep their table rows, but only
/// the other reasons (shared memory, exclusions) are reported.
fn report_pruned(cands: &[Candidate], progress: &mut dyn FnMut(&Progress)) {
    for c in cands {
        if let Status::Pruned(why) = &c.status {
            if !why.starts_with("layout") {
                progress(&Progress::Pruned {
                    config: c.config,
                    why: why.clone(),
                });
            }
        }
    }
}

/// Compiles the surviving candidates in parallel (compiles dominate the search's time),
/// recording ptxas's figures, then prunes those that spill: a spilling kernel is never the
/// fastest, and timing it would only cost device time.
fn compile_survivors(
    spec: &VariantSpec,
    cands: &mut [Candidate],
    threads: usize,
    compiler: &dyn Compiler,
    progress: &mut dyn FnMut(&Progress),
) {
    let todo: Vec<usize> = (0..cands.len())
        .filter(|&i| cands[i].status == Status::Ok)
        .collect();
    let threads = if threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        threads
    }
    .clamp(1, todo.len().max(1));
    let next = AtomicUsize::new(0);
    let total = todo.len();
    let mut results: Vec<(usize, Result<Resources, String>)> = Vec::with_capacity(total);
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..threads {
            let tx = tx.clone();
            let (next, todo, cands) = (&next, &todo, &*cands);
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
}

/// The abort error for a failure after which the device can no longer run anything.
fn context_lost(cfg: &TileConfig, e: &str, h: &str) -> FlashError {
    FlashError::Driver(format!("{CONTEXT_LOST}{}: {e} ({h})", config_label(cfg)))
}

/// Times every compiled candidate, the default first: it is the baseline, and the GPU timer's
/// reference. A failed timing marks the candidate; one that kills the context aborts the search,
/// since every later timing would fail too.
fn time_survivors(
    cands: &mut [Candidate],
    default: &TileConfig,
    flops: f64,
    timer: &mut dyn Timer,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(), FlashError> {
    let mut order: Vec<usize> = (0..cands.len())
        .filter(|&i| cands[i].status == Status::Ok)
        .collect();
    order.sort_by_key(|&i| cands[i].config != *default);
    let total = order.len();
    for (n, &i) in order.iter().enumerate() {
        let c = &mut cands[i];
        match timer.time(&c.config) {
            Ok(ms) => {
                c.ms = Some(ms);
                if flops > 0.0 && ms > 0.0 {
                    c.tflops = Some(flops / (ms * 1e-3) / 1e12);
                }
            }
            Err(e) => {
                c.status = Status::Failed(e.clone());
                if let Err(h) = timer.healthy() {
                    return Err(context_lost(&c.config, &e, &h));
                }
            }
        }
        progress(&Progress::Timed { done: n + 1, total });
    }
    Ok(())
}

/// Checks the timed candidates fastest first; the first that passes wins (checking is slower
/// than timing, so only as many as needed are checked). `None` when none passes.
fn check_fastest_first(
    cands: &mut [Candidate],
    timer: &mut dyn Timer,
) -> Result<Option<usize>, FlashError> {
    let mut timed: Vec<usize> = (0..cands.len())
        .filter(|&i| cands[i].status == Status::Ok && cands[i].ms.is_some())
        .collect();
    timed.sort_by(|&a, &b| cands[a].ms.partial_cmp(&cands[b].ms).expect("finite"));
    for &i in &timed {
        match timer.check(&cands[i].config) {
            Ok(()) => {
                cands[i].status = Status::Winner;
                return Ok(Some(i));
            }
            Err(e) => {
                if let Err(h) = timer.healthy() {
                    return Err(context_lost(&cands[i].config, &e, &h));
                }
                cands[i].status = Status::Wrong(e)
            }
        }
    }
    Ok(None)
}

/// The error when no candidate survived: one example per kind of failure, so that the user
/// sees why without a table of every candidate.
fn no_survivor(spec: &VariantSpec, cands: &[Candidate]) -> FlashError {
    let mut why: Vec<String> = Vec::new();
    for c in cands {
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
    invalid(format!(
        "no candidate of `{}` survived tuning ({} considered): {}",
        spec.name,
        cands.len(),
        why.join("; ")
    ))
}

/// Keeps the default when the winner `w`'s gain is within the noise margin `min_gain` (see
/// [`TuneOptions::min_gain`]) and the default passes its check; returns the final winner.
fn keep_default_within_noise(
    cands: &mut [Candidate],
    w: usize,
    default: &TileConfig,
    default_ms: Option<f64>,
    min_gain: f64,
    timer: &mut dyn Timer,
) -> usize {
    let (Some(d), Some(di)) = (default_ms, cands.iter().position(|c| c.config == *default)) else {
        return w;
    };
    let wm = cands[w].ms.expect("timed");
    if di != w && cands[di].status == Status::Ok && d <= wm * (1.0 + min_gain) {
        match timer.check(default) {
            Ok(()) => {
                cands[w].status = Status::Ok;
                cands[di].status = Status::Winner;
                return di;
            }
            Err(e) => cands[di].status = Status::Wrong(e),
        }
    }
    w
}

/// Compiles through a kernel cache (thread-safe, shared by processes).
pub struct CacheCompiler<'a> {
    /// The cache every candidate is compiled through, so that the winner's later load is a
    /// hit.
    pub cache: &'a KernelCache,
    /// The NVRTC architecture to compile for (`sm_90a`, ...).
    pub arch: String,
}

impl Compiler for CacheCompiler<'_> {
    fn compile(&self, spec: &VariantSpec, cfg: &TileConfig) -> Result<Resources, String> {
        let plan = flash_dsl::plan(spec, Some(*cfg)).map_err(|e| e.to_string())?;
        let built = compile_plan(&plan, &self.arch, self.cache).map_err(|e| e.to_string())?;
        Ok(built.compiled.resources)
    }
}
