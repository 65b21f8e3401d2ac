//! [`Runtime`] integration: tune on this runtime's GPU and write the record, load with the
//! remembered configuration, re-time two configurations against each other.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use flash_dsl::eval::{ParamValue, Sizes};
use flash_dsl::plan::KernelFamily;
use flash_dsl::{TileConfig, VariantSpec};

use crate::error::FlashError;
use crate::launch::{ProblemShape, Runtime};
use crate::LoadedKernel;

use super::gpu::{GpuTimer, SpotCheck};
use super::inputs::{default_params, forward_flops, mask_density};
use super::record::{now_unix, record_shape, TuneKey, TuneRecord, TuneStore, RECORD_FORMAT};
use super::search::{tune, CacheCompiler, Progress, TuneOptions, TuneResult};

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
    /// The search itself: every candidate, the default and the winner.
    pub result: TuneResult,
    /// The record remembered for the problem's bucket (written when the cache is on disk).
    pub record: TuneRecord,
    /// Where the record was written (`None` for a memory-only cache).
    pub record_path: Option<PathBuf>,
    /// Useful floating-point operations of one forward pass at the tuned shape (masked-out
    /// blocks not counted), the numerator of the candidates' TFLOP/s.
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
    /// for that shape ([`Runtime::launch_config`]; pass a configuration to [`Runtime::load`] to
    /// force one).
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
        self.load(spec, Some(self.launch_config(spec, shape)))
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
            seq_q: Some(shape.seq_q),
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
            shape: Some(record_shape(&shape)),
            candidates: result.candidates.len(),
            timed: result.candidates.iter().filter(|c| c.ms.is_some()).count(),
            tune_s: result.tune_s,
            created_unix: now_unix(),
        };
        let record_path = TuneStore::for_cache(self.cache()).store_if_on_disk(&record)?;
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
