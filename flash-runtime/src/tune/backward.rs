//! Autotuning of the backward main kernel, with records of its own (`TuneKey::pass = "bwd"`).
//!
//! The backward kernel has two valid configurations on sm80-family hardware (64×64 with 4
//! warps, 64×128 with 8; see `flash_dsl::plan::backward`), so the search is exhaustive: each
//! candidate first passes a float64 spot check of its gradients (dQ, dK, dV on a 2 × 257 × 300
//! problem, FlashAttention's 2× rule against the plain same-precision backward, floor
//! `1e-4 · max(1, max|ref|)`), then both are timed alternately at the tuned shape on the same
//! inputs; the default is kept unless the other is faster by more than `min_gain`.
//! `Runtime::backward_spec` uses the remembered configuration of the problem's bucket.

use std::path::PathBuf;
use std::time::Instant;

use cudarc::driver::{sys, CudaSlice};
use flash_dsl::eval::{ParamValue, Sizes};
use flash_dsl::model::backward::{backward, backward_lowp};
use flash_dsl::model::reference::{max_abs_diff, rounding, Problem};
use flash_dsl::plan::backward::backward_config_is_valid;
use flash_dsl::plan::{default_backward_config, default_backward_config_for, KernelFamily};
use flash_dsl::{TileConfig, VariantSpec};

use super::gpu::{param_args, upload_params};
use super::inputs::default_params;
use super::record::{now_unix, record_shape, TuneKey, TuneRecord, TuneStore, RECORD_FORMAT};
use super::Rng;
use crate::error::FlashError;
use crate::launch::backward::{BackwardGrads, BackwardInputs, BackwardOptions, LseRef};
use crate::launch::{LseMut, ProblemShape, Runtime, TensorMut, TensorRef};
use crate::variant::ParamArg;

fn drv(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> FlashError {
    move |e| FlashError::Driver(format!("{what}: {e:?}"))
}

/// The backward configurations worth timing for `spec` on a device whose default kernel family
/// is `family`, the default first: 128 and 64 keys per block (and, for the wgmma kernel at head
/// dims up to 64, 128 queries per step), of the wgmma kernel (on sm_90a) and of the sm80 kernel.
pub fn backward_candidates(spec: &VariantSpec, family: KernelFamily) -> Vec<TileConfig> {
    let default = default_backward_config_for(spec, family);
    let families: &[KernelFamily] = match family {
        KernelFamily::Sm80 => &[KernelFamily::Sm80],
        KernelFamily::Sm90 | KernelFamily::Sm90Ws => &[KernelFamily::Sm90, KernelFamily::Sm80],
    };
    let mut out = vec![default];
    for &f in families {
        for (block_m, block_n, warps) in [(64, 128, 8), (64, 64, 4), (128, 128, 8)] {
            let c = TileConfig {
                block_m,
                block_n,
                warps,
                family: f,
                ..default_backward_config()
            };
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out.retain(|c| backward_config_is_valid(spec, c).is_ok());
    out
}

/// What a backward tuning measured.
#[derive(Debug, Clone)]
pub struct BackwardTuneReport {
    /// The record remembered for the backward main kernel (its key's `pass` is `bwd`).
    pub record: TuneRecord,
    /// Where the record was written (`None` for a memory-only cache).
    pub record_path: Option<PathBuf>,
    /// Each candidate: median milliseconds, or why it was dropped.
    pub candidates: Vec<(TileConfig, Result<f64, String>)>,
}

/// One backward problem on the device: Q, K, V, dO (random normal, rounded to the dtype), O
/// and the LSE from the forward pass, and the gradient buffers.
struct BwdProblem {
    shape: ProblemShape,
    x: [CudaSlice<u16>; 5],
    grads: [CudaSlice<u16>; 3],
    lse: CudaSlice<f32>,
    /// Q, K, V, dO as the exact values uploaded.
    host: Vec<Vec<f64>>,
}

impl BwdProblem {
    fn new(
        rt: &Runtime,
        spec: &VariantSpec,
        s: ProblemShape,
        args: &[ParamArg<'_>],
        seed: u64,
    ) -> Result<BwdProblem, FlashError> {
        let st = rt.stream();
        let (d, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
        let n = [
            s.batch * s.seq_q * s.heads_q * d,
            s.batch * s.seq_k * s.heads_kv * d,
            s.batch * s.seq_k * s.heads_kv * dv,
            s.batch * s.seq_q * s.heads_q * dv,
        ];
        let mut rng = Rng(seed);
        let mut host = Vec::new();
        let mut up = |len: usize| {
            let bits: Vec<u16> = (0..len.max(8))
                .map(|_| spec.dtype.to_bits(rng.normal()))
                .collect();
            host.push(
                bits[..len]
                    .iter()
                    .map(|&b| spec.dtype.from_bits(b))
                    .collect(),
            );
            st.clone_htod(&bits)
        };
        let x = [
            up(n[0]).map_err(drv("uploading Q"))?,
            up(n[1]).map_err(drv("uploading K"))?,
            up(n[2]).map_err(drv("uploading V"))?,
            st.alloc_zeros::<u16>(n[3].max(8))
                .map_err(drv("allocating O"))?,
            up(n[3]).map_err(drv("uploading dO"))?,
        ];
        let zeros = |len: usize| {
            st.alloc_zeros::<u16>(len.max(8))
                .map_err(drv("allocating a gradient"))
        };
        let mut p = BwdProblem {
            shape: s,
            x,
            grads: [zeros(n[0])?, zeros(n[1])?, zeros(n[2])?],
            lse: st
                .alloc_zeros::<f32>((s.batch * s.heads_q * s.seq_q).max(1))
                .map_err(drv("allocating the LSE"))?,
            host,
        };
        let kernel = rt.load(spec, None)?;
        let [qs, ks, vs, os] = p.dims(spec);
        let [q, k, v, o, _] = &mut p.x;
        rt.forward(
            &kernel,
            &TensorRef::new(q, qs, st),
            &TensorRef::new(k, ks, st),
            &TensorRef::new(v, vs, st),
            &mut TensorMut::new(o, os, st),
            &mut LseMut::new(&mut p.lse, st),
            args,
        )?;
        Ok(p)
    }

    /// Shapes of Q, K, V and O.
    fn dims(&self, spec: &VariantSpec) -> [[usize; 4]; 4] {
        let s = self.shape;
        let (d, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
        [
            [s.batch, s.seq_q, s.heads_q, d],
            [s.batch, s.seq_k, s.heads_kv, d],
            [s.batch, s.seq_k, s.heads_kv, dv],
            [s.batch, s.seq_q, s.heads_q, dv],
        ]
    }

    /// One backward pass with `cfg` into the gradient buffers.
    fn run(
        &mut self,
        rt: &Runtime,
        spec: &VariantSpec,
        args: &[ParamArg<'_>],
        cfg: TileConfig,
    ) -> Result<(), FlashError> {
        let st = rt.stream();
        let [qs, ks, vs, os] = self.dims(spec);
        let input = BackwardInputs {
            q: TensorRef::new(&self.x[0], qs, st),
            k: TensorRef::new(&self.x[1], ks, st),
            v: TensorRef::new(&self.x[2], vs, st),
            o: TensorRef::new(&self.x[3], os, st),
            d_o: TensorRef::new(&self.x[4], os, st),
            lse: LseRef::new(&self.lse, st),
        };
        let [g0, g1, g2] = &mut self.grads;
        let mut grads = BackwardGrads {
            dq: TensorMut::new(g0, qs, st),
            dk: TensorMut::new(g1, ks, st),
            dv: TensorMut::new(g2, vs, st),
            dparams: Vec::new(),
        };
        let opts = BackwardOptions {
            config: Some(cfg),
            deterministic: false,
        };
        rt.backward_spec_with(spec, &opts, &input, args, &mut grads)
    }
}

impl Runtime {
    /// The key of `spec`'s backward records at `shape` on this GPU.
    pub fn backward_tune_key(
        &self,
        spec: &VariantSpec,
        shape: &ProblemShape,
    ) -> Result<TuneKey, FlashError> {
        let mut key = self.tune_key(spec, shape)?;
        key.pass = "bwd".to_string();
        Ok(key)
    }

    /// The remembered backward configuration of `spec` for `shape`'s bucket, if any.
    pub fn tuned_backward_config(
        &self,
        spec: &VariantSpec,
        shape: &ProblemShape,
    ) -> Option<TileConfig> {
        let key = self.backward_tune_key(spec, shape).ok()?;
        let rec = TuneStore::for_cache(self.cache()).load(&key)?;
        backward_config_is_valid(spec, &rec.config).ok()?;
        Some(rec.config)
    }

    /// [`Runtime::backward_spec_with`] with the remembered backward configuration of the
    /// problem's bucket when `opts` forces none (the backward counterpart of `load_tuned`).
    pub fn backward_tuned(
        &self,
        spec: &VariantSpec,
        opts: &BackwardOptions,
        input: &BackwardInputs<'_>,
        params: &[ParamArg<'_>],
        grads: &mut BackwardGrads<'_>,
    ) -> Result<(), FlashError> {
        let mut opts = *opts;
        if opts.config.is_none() {
            let [b, sq, hq, _] = input.q.desc.shape;
            let [_, sk, hkv, _] = input.k.desc.shape;
            let shape = ProblemShape {
                batch: b,
                seq_q: sq,
                seq_k: sk,
                heads_q: hq,
                heads_kv: hkv,
            };
            opts.config = self.tuned_backward_config(spec, &shape);
        }
        self.backward_spec_with(spec, &opts, input, params, grads)
    }

    /// Spot check of `cfg`'s gradients against the float64 reference (see the module doc).
    fn backward_spot_check(
        &self,
        spec: &VariantSpec,
        given: &[(String, ParamValue)],
        cfg: TileConfig,
    ) -> Result<(), String> {
        let shape = ProblemShape {
            batch: 2,
            seq_q: 257,
            seq_k: 300,
            heads_q: 2,
            heads_kv: 1,
        };
        let sizes = Sizes {
            batch: 2,
            heads: 2,
            seq_q: 257,
            seq_k: 300,
        };
        let params = default_params(spec, sizes, given, 0x5907);
        let holds = upload_params(self.stream(), spec, &params).map_err(|e| e.to_string())?;
        let args = param_args(&holds, self.stream());
        let mut p = BwdProblem::new(self, spec, shape, &args, 0x5907).map_err(|e| e.to_string())?;
        p.run(self, spec, &args, cfg).map_err(|e| e.to_string())?;
        self.synchronize().map_err(|e| e.to_string())?;
        let back = |x: &CudaSlice<u16>, n: usize| -> Result<Vec<f64>, String> {
            let h: Vec<u16> = self.stream().clone_dtoh(x).map_err(|e| format!("{e:?}"))?;
            Ok(h[..n].iter().map(|&b| spec.dtype.from_bits(b)).collect())
        };
        let problem = Problem {
            batch: 2,
            heads_q: 2,
            heads_kv: 1,
            seq_q: 257,
            seq_k: 300,
            q: p.host[0].clone(),
            k: p.host[1].clone(),
            v: p.host[2].clone(),
            params: params.clone(),
            rng: Default::default(),
        };
        let dout = &p.host[3];
        let exact = backward(spec, &problem, dout);
        let plain = backward_lowp(spec, &problem, dout, rounding(spec.dtype));
        for (name, i, want, low) in [
            ("dq", 0, &exact.dq, &plain.dq),
            ("dk", 1, &exact.dk, &plain.dk),
            ("dv", 2, &exact.dv, &plain.dv),
        ] {
            let got = back(&p.grads[i], want.len())?;
            let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            let bound = 2.0 * max_abs_diff(low, want) + 1e-4 * scale;
            let err = max_abs_diff(&got, want);
            if err.is_nan() || err > bound {
                return Err(format!(
                    "spot check of {name} against float64 (2x257x300): max error {err:.3e} > bound {bound:.3e}"
                ));
            }
        }
        Ok(())
    }

    /// Tunes the backward main kernel of `spec` at `shape` (params: the given values, plausible
    /// ones for the rest): spot-checks and times every candidate, keeps the default unless
    /// another is faster by more than `min_gain` (a fraction), writes the record.
    pub fn tune_backward(
        &self,
        spec: &VariantSpec,
        shape: ProblemShape,
        given: &[(String, ParamValue)],
        min_gain: f64,
    ) -> Result<BackwardTuneReport, FlashError> {
        let start = Instant::now();
        let family = self.info().default_family;
        let sizes = Sizes {
            batch: shape.batch,
            heads: shape.heads_q,
            seq_q: shape.seq_q,
            seq_k: shape.seq_k,
        };
        let params = default_params(spec, sizes, given, 0x5eed);
        let holds = upload_params(self.stream(), spec, &params)?;
        let args = param_args(&holds, self.stream());
        let mut p = BwdProblem::new(self, spec, shape, &args, 0x1234)?;
        let mut candidates: Vec<(TileConfig, Result<f64, String>)> = Vec::new();
        let mut alive = Vec::new();
        for cfg in backward_candidates(spec, family) {
            match self.backward_spot_check(spec, given, cfg) {
                Ok(()) => alive.push(cfg),
                Err(e) => candidates.push((cfg, Err(e))),
            }
        }
        // Alternating rounds on the same inputs; each round's time is the median of `iters`.
        let ev = || {
            self.context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(drv("creating an event"))
        };
        let (t0, t1) = (ev()?, ev()?);
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); alive.len()];
        for cfg in &alive {
            p.run(self, spec, &args, *cfg)?; // warm-up (and first load)
        }
        for _round in 0..3 {
            for (i, cfg) in alive.iter().enumerate() {
                t0.record(self.stream()).map_err(drv("recording"))?;
                for _ in 0..3 {
                    p.run(self, spec, &args, *cfg)?;
                }
                t1.record(self.stream()).map_err(drv("recording"))?;
                t1.synchronize().map_err(drv("waiting"))?;
                times[i].push(t0.elapsed_ms(&t1).map_err(drv("reading an event"))? as f64 / 3.0);
            }
        }
        let med = |v: &Vec<f64>| {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let default = default_backward_config_for(spec, family);
        let mut winner = (default, f64::INFINITY);
        let mut default_ms = 0.0;
        for (cfg, t) in alive.iter().zip(&times) {
            let ms = med(t);
            candidates.push((*cfg, Ok(ms)));
            if *cfg == default {
                default_ms = ms;
            }
            if ms < winner.1 {
                winner = (*cfg, ms);
            }
        }
        if alive.is_empty() {
            return Err(FlashError::Invalid(format!(
                "no backward configuration of `{}` passed the spot check: {:?}",
                spec.name, candidates
            )));
        }
        // Keep the default unless the winner beats it by more than the noise margin.
        if default_ms > 0.0 && winner.0 != default && winner.1 * (1.0 + min_gain) > default_ms {
            winner = (default, default_ms);
        }
        let record = TuneRecord {
            format: RECORD_FORMAT,
            key: self.backward_tune_key(spec, &shape)?,
            config: winner.0,
            variant: spec.name.clone(),
            ms: winner.1,
            default_config: Some(default),
            default_ms,
            shape: Some(record_shape(&shape)),
            candidates: candidates.len(),
            timed: alive.len(),
            tune_s: start.elapsed().as_secs_f64(),
            created_unix: now_unix(),
        };
        let record_path = TuneStore::for_cache(self.cache()).store_if_on_disk(&record)?;
        Ok(BackwardTuneReport {
            record,
            record_path,
            candidates,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(d: u32) -> VariantSpec {
        let mut s = flash_dsl::parse::parse_str("C { head_dim: 64, dtype: bf16, mask: causal }")
            .expect("parses")
            .remove(0);
        (s.head_dim_qk, s.head_dim_v) = (d, d);
        s
    }

    #[test]
    fn backward_records_have_their_own_key_and_forward_keys_are_unchanged() {
        let shape = ProblemShape {
            batch: 2,
            seq_q: 4096,
            seq_k: 4096,
            heads_q: 16,
            heads_kv: 16,
        };
        let fwd = TuneKey::new(&spec(64), "NVIDIA H200", "sm_90a", (13, 0), &shape);
        let json = serde_json::to_string(&fwd).unwrap();
        assert!(
            !json.contains("pass"),
            "forward keys serialise as before: {json}"
        );
        let mut bwd = fwd.clone();
        bwd.pass = "bwd".into();
        assert_ne!(fwd.file_stem(), bwd.file_stem());
        let back: TuneKey = serde_json::from_str(&json).unwrap();
        assert_eq!(back, fwd, "an old record's key still loads");
    }

    #[test]
    fn candidates_are_the_valid_backward_configurations() {
        let c = backward_candidates(&spec(128), KernelFamily::Sm80);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0], default_backward_config());
        let h = backward_candidates(&spec(128), KernelFamily::Sm90Ws);
        assert_eq!(h.len(), 4);
        assert_eq!(h[0].family, KernelFamily::Sm90);
        assert!(h.iter().any(|c| c.family == KernelFamily::Sm80));
        // Above 128 only the mma.sync kernel, and at 256 only its 64-key block fits.
        assert_eq!(
            backward_candidates(&spec(256), KernelFamily::Sm90Ws),
            [TileConfig {
                block_n: 64,
                warps: 4,
                ..default_backward_config()
            }]
        );
        let c = backward_candidates(&spec(192), KernelFamily::Sm90Ws);
        assert_eq!(c.len(), 2);
        assert!(c.iter().all(|c| c.family == KernelFamily::Sm80));
    }
}
