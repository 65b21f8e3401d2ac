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
//!
//! **Layout.** `record` (keys, records, the store), `space` (configurations, candidates,
//! pruning), `search` (the search over a [`Compiler`] and a [`Timer`]), `inputs` (params,
//! density, FLOPs), `gpu` ([`GpuTimer`], [`SpotCheck`]) and `runtime` (the [`Runtime`] methods);
//! each uses only those before it. Everything public is re-exported here.
//!
//! [`Runtime`]: crate::Runtime
//! [`Runtime::load_tuned`]: crate::Runtime::load_tuned
//! [`Runtime::load`]: crate::Runtime::load

mod backward;
mod gpu;
mod inputs;
mod record;
mod runtime;
mod search;
mod space;

/// The deterministic generator the tuner draws inputs and params from.
pub use flash_dsl::rng::SplitMix as Rng;

pub use backward::{backward_candidates, BackwardTuneReport};
pub use gpu::{
    compare_outputs, compare_outputs_rms, output_tolerance, GpuTimer, SpotCheck, FP8_OUTPUT_REL_RMS,
};
pub use inputs::{default_params, forward_flops, mask_density};
pub use record::{
    pow2_bucket, spec_hash, ShapeBucket, TuneKey, TuneRecord, TuneStore, RECORD_FORMAT,
};
pub use runtime::{TuneKnobs, TuneReport};
pub use search::{
    tune, CacheCompiler, Compiler, Progress, Timer, TuneOptions, TuneResult, CONTEXT_LOST,
};
pub use space::{config_label, search_space, Candidate, Status};
