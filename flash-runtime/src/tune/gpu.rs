//! The GPU timer: candidates timed with CUDA events on random inputs, checked against the
//! default configuration's output and, through the [`SpotCheck`], against the float64
//! reference on a small odd-sized problem.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use flash_dsl::eval::{ParamValue, ParamValues, Sizes};
use flash_dsl::model::reference;
use flash_dsl::plan::default_config_for;
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::spec::{DType, ParamKind, ScalarTy};
use flash_dsl::{TileConfig, VariantSpec};

use crate::error::FlashError;
use crate::launch::{LseMut, ProblemShape, Runtime, TensorMut, TensorRef};
use crate::variant::ParamArg;
use crate::LoadedKernel;

use super::inputs::default_params;
use super::search::Timer;

fn invalid(msg: impl Into<String>) -> FlashError {
    FlashError::Invalid(msg.into())
}

pub(super) enum ParamHold {
    I32(i32),
    F32(f32),
    TI(CudaSlice<i32>, usize),
    TF(CudaSlice<f32>, usize),
    /// The dropout generator's state, after the declared params of a variant with dropout (the
    /// tuner's launches and its reference problems both use the default seed and offset).
    Rng(flash_dsl::dropout::DropoutRng),
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
    /// An fp8 variant's inputs: the same random values quantised on the host (bit for bit the
    /// quantisation kernels' model) as the variant declares them.
    fp8: Option<Fp8Hold>,
    o: CudaSlice<u16>,
    lse: CudaSlice<f32>,
    params: Vec<ParamHold>,
    poison: Vec<u16>,
    reference: Option<Vec<f32>>,
    /// The float64 check every candidate passes on a small odd-sized problem.
    spot: Option<Box<SpotCheck<'r>>>,
    /// Untimed launches before each timing (default 3): first-launch costs and clocks settle.
    pub warmup: usize,
    /// Timed launches whose median is a candidate's time (default 15).
    pub iters: usize,
}

/// Codes and scales of an fp8 variant's Q, K and V (V transposed, in rows or bf16 as declared),
/// and their dequantised values, which the float64 reference attends over.
struct Fp8Hold {
    q: (CudaSlice<u8>, CudaSlice<f32>),
    k: (CudaSlice<u8>, CudaSlice<f32>),
    /// V's codes (transposed, or in rows with `v_layout: rows`) and scales; `None` with `v: bf16`
    /// (the timer's bf16 V is read).
    v: Option<(CudaSlice<u8>, CudaSlice<f32>)>,
    /// The dequantised Q, K, V for the float64 reference: kept for problems of the spot check's
    /// size only (at a tuned shape they would take gigabytes of f64).
    dequant: Option<[Vec<f64>; 3]>,
}

/// Inputs (Q, K and V elements together) up to which an fp8 timer keeps the dequantised values.
const FP8_HOST_MAX: usize = 1 << 22;

impl Fp8Hold {
    /// Quantises the bf16 values the timer uploaded (`q`, `k`, `v` as bits).
    fn new(
        stream: &std::sync::Arc<cudarc::driver::CudaStream>,
        spec: &VariantSpec,
        shape: ProblemShape,
        [q, k, v]: [&[u16]; 3],
    ) -> Result<Option<Fp8Hold>, FlashError> {
        let Some(f) = spec.fp8 else { return Ok(None) };
        let d = spec.head_dim_qk as usize;
        let (sq, sk) = (
            [shape.batch, shape.seq_q, shape.heads_q, d],
            [shape.batch, shape.seq_k, shape.heads_kv, d],
        );
        let vals = |bits: &[u16], n: usize| -> Vec<f32> {
            bits[..n]
                .iter()
                .map(|&b| DType::Bf16.from_bits(b) as f32)
                .collect()
        };
        let n = |s: [usize; 4]| s.iter().product::<usize>();
        let x = flash_dsl::fp8::quantize_operands(
            &f,
            // (bf16 V is not quantised: no f32 copy of it.)
            [
                &vals(q, n(sq)),
                &vals(k, n(sk)),
                &if f.v_bf16 { Vec::new() } else { vals(v, n(sk)) },
            ],
            sq,
            sk,
        );
        let up8 = |c: &[u8]| stream.clone_htod(c).map_err(drv("uploading fp8 codes"));
        let up32 = |c: &[f32]| stream.clone_htod(c).map_err(drv("uploading fp8 scales"));
        let keep = n(sq) + 2 * n(sk) <= FP8_HOST_MAX;
        let v_dev = match (x.v_codes(f.v_rows), &x.v) {
            (Some(codes), Some(vq)) => Some((up8(&codes)?, up32(&vq.scales)?)),
            _ => None,
        };
        // (bf16 V: the values themselves.)
        let v_deq = match &x.v {
            _ if !keep => Vec::new(),
            Some(vq) => vq.dequantize(),
            None => v[..n(sk)]
                .iter()
                .map(|&b| DType::Bf16.from_bits(b))
                .collect(),
        };
        let (qq, kq) = (x.q, x.k);
        Ok(Some(Fp8Hold {
            q: (up8(&qq.codes)?, up32(&qq.scales)?),
            k: (up8(&kq.codes)?, up32(&kq.scales)?),
            v: v_dev,
            dequant: keep.then(|| [qq.dequantize(), kq.dequantize(), v_deq]),
        }))
    }
}

/// Every candidate also runs a small problem with odd sizes (257 queries, 300 keys, two
/// batches, GQA when the tuned shape has it), so tiles are partial and masks cut through them,
/// and its output is held to FlashAttention's rule against the float64 reference: max error at
/// most twice that of a plain same-precision implementation.
pub struct SpotCheck<'r> {
    timer: GpuTimer<'r>,
    /// Reference output and the error bound, computed on the CPU once (fp8: once per key-tile
    /// width, whose P rounding the plain baseline models: `reference::forward_fp8_tiled`).
    want: Option<(Vec<f64>, f64, u32)>,
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
        let fp8 = self.timer.spec.fp8.is_some();
        if self.want.as_ref().is_none_or(|w| fp8 && w.2 != cfg.block_n) {
            let problem = self
                .timer
                .host_problem(&self.params)
                .map_err(|e| e.to_string())?;
            let spec = &self.timer.spec;
            let exact = reference::forward(spec, &problem).o;
            // fp8: the plain implementation of the dequantised inputs with P rounded to e4m3 where
            // the kernel rounds it (its own tiles); bf16/f16: every input and P in the dtype.
            let plain = if fp8 {
                reference::forward_fp8_tiled(spec, &problem, cfg.block_n as usize).o
            } else {
                reference::forward_lowp(spec, &problem, reference::rounding(spec.dtype)).o
            };
            let bound = 2.0 * reference::max_abs_diff(&plain, &exact) + 1e-6;
            self.want = Some((exact, bound, cfg.block_n));
        }
        let got = self.timer.output(cfg).map_err(|e| e.to_string())?;
        let (exact, bound, _) = self.want.as_ref().expect("set above");
        if let Some(i) = got.iter().position(|x| !x.is_finite()) {
            return Err(format!(
                "spot check: element {i} is {} (unwritten or NaN)",
                got[i]
            ));
        }
        let got: Vec<f64> = got.iter().map(|&x| x as f64).collect();
        let err = reference::max_abs_diff(&got, exact);
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
                    spec.dtype
                        .to_bits(f64::from(if x == 0.0 { 0.5 } else { x }))
                })
                .collect()
        };
        let (hq, hk, hv) = (draw(n_q), draw(n_k), draw(n_v));
        let q = stream.clone_htod(&hq).map_err(drv("uploading Q"))?;
        let k = stream.clone_htod(&hk).map_err(drv("uploading K"))?;
        let v = stream.clone_htod(&hv).map_err(drv("uploading V"))?;
        let o = stream
            .alloc_zeros::<u16>(n_o.max(8))
            .map_err(drv("allocating O"))?;
        let lse = stream
            .alloc_zeros::<f32>((shape.batch * shape.heads_q * shape.seq_q).max(1))
            .map_err(drv("allocating the LSE"))?;
        let holds = upload_params(&stream, spec, params)?;
        // fp8: the values drawn above (bf16, as `dtype` is for an fp8 variant), quantised.
        let fp8 = Fp8Hold::new(&stream, spec, shape, [&hq, &hk, &hv])?;
        Ok(GpuTimer {
            rt,
            spec: spec.clone(),
            shape,
            q,
            k,
            v,
            fp8,
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
        let ms = match &self.fp8 {
            Some(f) => {
                use crate::launch::{Fp8Inputs, Fp8V};
                let v = match &f.v {
                    None => Fp8V::Bf16(tv),
                    Some((codes, scale)) if self.spec.fp8.is_some_and(|x| x.v_rows) => Fp8V::Rows {
                        v: TensorRef::new(codes, [s.batch, s.seq_k, s.heads_kv, dv], &stream),
                        v_scale: scale,
                    },
                    Some((codes, scale)) => Fp8V::Codes {
                        v_t: codes,
                        v_scale: scale,
                    },
                };
                let x = Fp8Inputs {
                    q: TensorRef::new(&f.q.0, [s.batch, s.seq_q, s.heads_q, dqk], &stream),
                    q_scale: &f.q.1,
                    k: TensorRef::new(&f.k.0, [s.batch, s.seq_k, s.heads_kv, dqk], &stream),
                    k_scale: &f.k.1,
                    v,
                };
                self.rt
                    .time_forward_fp8(kernel, &x, &mut to, &mut tl, &args, warmup, iters)?
            }
            None => self.rt.time_forward(
                kernel, &tq, &tk, &tv, &mut to, &mut tl, &args, warmup, iters,
            )?,
        };
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
            .map(|&b| self.spec.dtype.from_bits(b) as f32)
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
    fn host_problem(&self, params: &ParamValues) -> Result<reference::Problem, FlashError> {
        let stream = self.rt.stream().clone();
        let s = self.shape;
        let (dqk, dv) = (
            self.spec.head_dim_qk as usize,
            self.spec.head_dim_v as usize,
        );
        if let Some(f) = &self.fp8 {
            let Some([q, k, v]) = f.dequant.clone() else {
                return Err(invalid(format!(
                    "the float64 reference of an fp8 problem is kept up to {FP8_HOST_MAX} input elements; this one has more"
                )));
            };
            return Ok(reference::Problem {
                batch: s.batch,
                heads_q: s.heads_q,
                heads_kv: s.heads_kv,
                seq_q: s.seq_q,
                seq_k: s.seq_k,
                q,
                k,
                v,
                params: params.clone(),
                rng: Default::default(),
            });
        }
        let down = |buf: &CudaSlice<u16>, n: usize| -> Result<Vec<f64>, FlashError> {
            let host: Vec<u16> = stream.clone_dtoh(buf).map_err(drv("copying inputs back"))?;
            Ok(host[..n]
                .iter()
                .map(|&b| self.spec.dtype.from_bits(b))
                .collect())
        };
        Ok(reference::Problem {
            batch: s.batch,
            heads_q: s.heads_q,
            heads_kv: s.heads_kv,
            seq_q: s.seq_q,
            seq_k: s.seq_k,
            q: down(&self.q, s.batch * s.seq_q * s.heads_q * dqk)?,
            k: down(&self.k, s.batch * s.seq_k * s.heads_kv * dqk)?,
            v: down(&self.v, s.batch * s.seq_k * s.heads_kv * dv)?,
            params: params.clone(),
            rng: Default::default(),
        })
    }
}

/// Uploads the tensor params of `params` (declared by `spec`) and keeps the scalars: what
/// [`param_args`] turns into launch arguments. Shared by the forward and the backward tuner.
pub(super) fn upload_params(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    spec: &VariantSpec,
    params: &ParamValues,
) -> Result<Vec<ParamHold>, FlashError> {
    let mut holds = Vec::new();
    for (decl, val) in spec.params.iter().zip(&params.0) {
        let pad = |n: usize| n.max(8);
        let h = match (&decl.kind, val) {
            (ParamKind::Scalar(ScalarTy::I32), ParamValue::Int(x)) => ParamHold::I32(*x as i32),
            (ParamKind::Scalar(ScalarTy::F32), ParamValue::Float(x)) => ParamHold::F32(*x as f32),
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
    if spec.dropout.is_some() {
        holds.push(ParamHold::Rng(Default::default()));
    }
    Ok(holds)
}

pub(super) fn param_args<'a>(
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
            ParamHold::Rng(r) => ParamArg::Rng(*r),
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

/// Largest RMS of the difference between two fp8 configurations' outputs, relative to the RMS
/// of the default's (see `GpuTimer::check`): e4m3 rounds P to 3 bits (about 3.6 % RMS a
/// probability), and two tilings round different values.
pub const FP8_OUTPUT_REL_RMS: f64 = 0.25;

/// Compares `got` with `want` by the RMS of their difference relative to `want`'s: `Err` names
/// both, or the count never written (NaN).
pub fn compare_outputs_rms(got: &[f32], want: &[f32], max_rel: f64) -> Result<(), String> {
    let nan = got
        .iter()
        .zip(want)
        .filter(|(g, w)| g.is_nan() != w.is_nan())
        .count();
    if nan > 0 {
        return Err(format!("{nan} elements NaN or unwritten"));
    }
    let (mut d2, mut w2) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        if !w.is_nan() {
            d2 += f64::from(g - w).powi(2);
            w2 += f64::from(w).powi(2);
        }
    }
    let rel = (d2 / w2.max(f64::MIN_POSITIVE)).sqrt();
    if rel > max_rel {
        return Err(format!(
            "RMS of the difference {rel:.3} of the output's RMS (> {max_rel})"
        ));
    }
    Ok(())
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
        // fp8: another key-tile width rounds P at other points (e4m3 keeps 3 bits), so two
        // configurations' outputs differ by more than a few units of bf16: they are compared by
        // the RMS of the difference relative to the RMS of the output (a broken configuration
        // is off by its whole size), and the spot check holds each to the 2× rule at its own
        // tiles.
        let want = self.reference.as_deref().expect("set above");
        if self.spec.fp8.is_some() {
            compare_outputs_rms(&got, want, FP8_OUTPUT_REL_RMS)?;
        } else {
            compare_outputs(&got, want, output_tolerance(self.spec.dtype))?;
        }
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
