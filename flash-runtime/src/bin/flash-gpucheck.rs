//! `flash-gpucheck`: correctness and timing of the generated kernels on a real GPU.
//!
//! ```text
//! flash-gpucheck [--variants DIR] [--small] [--no-check] [--no-time] [--json OUT.json]
//! ```
//!
//! **Check.** Every declaration of every `DIR/*.flash` (default `examples/variants`), at head dims
//! 64, 96 and 128 (bf16 and f16 for `Dense` and `Causal`, the declared dtype otherwise), over
//! shapes covering seq 1/17/113/1023/4096, seq_q ≠ seq_k both ways, MHA/GQA/MQA, seq_k = 0,
//! fully masked rows and a strided (packed QKV, padded O) layout. Inputs are random normal,
//! params random; O and LSE are poisoned with NaN before the launch. The rule (FlashAttention's):
//! `max|O − ref| ≤ 2·max|O_plain − ref|` against the float64 reference, `O_plain` being the plain
//! same-precision implementation; LSE within 1e-3 (relative above 1) and `-inf` exactly where
//! the reference's is; fully masked rows exactly 0; no NaN; nothing written outside O's view.
//! `--small` keeps the small shapes (for compute-sanitizer). Exit status 1 on any failure.
//!
//! **Time.** Dense/causal workloads (bf16, f16; d 64, 128; seq 1024, 4096, 16384 with
//! batch·seq = 16384 and heads = 2048/d) and the variant workloads of `bench/peers.py`
//! (d 128, 16 heads, bf16), CUDA events, median; FLOPs counted as peers.py does. Also cold
//! NVRTC compile and warm disk-cache load latency. Rows go to `--json`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use flash_dsl::eval::{tensor_shape, ParamValue, ParamValues, Sizes};
use flash_dsl::plan::{default_config_for, KernelFamily};
use flash_dsl::reference::{self, Problem};
use flash_dsl::spec::{Dim, ParamKind, ScalarTy};
use flash_dsl::{DType, TileConfig, VariantSpec};
use flash_runtime::cudarc::driver::CudaSlice;
use flash_runtime::launch::contiguous_strides;
use flash_runtime::{FlashError, KernelCache, LseMut, ParamArg, Runtime, TensorMut, TensorRef};
use serde_json::{json, Value};

use flash_dsl::rng::SplitMix as Rng;

fn to_bits(x: f64, dt: DType) -> u16 {
    match dt {
        DType::Bf16 => half::bf16::from_f64(x).to_bits(),
        DType::F16 => half::f16::from_f64(x).to_bits(),
    }
}

fn from_bits(b: u16, dt: DType) -> f64 {
    match dt {
        DType::Bf16 => half::bf16::from_bits(b).to_f64(),
        DType::F16 => half::f16::from_bits(b).to_f64(),
    }
}

fn nan_bits(dt: DType) -> u16 {
    match dt {
        DType::Bf16 => 0x7FC0,
        DType::F16 => 0x7E00,
    }
}

/// `n` normal draws rounded to `dt`: device bits and the exact values they hold.
fn draw(rng: &mut Rng, n: usize, dt: DType) -> (Vec<u16>, Vec<f64>) {
    let bits: Vec<u16> = (0..n).map(|_| to_bits(rng.normal(), dt)).collect();
    let vals = bits.iter().map(|&b| from_bits(b, dt)).collect();
    (bits, vals)
}

/// Random values for every param of `spec` at `sizes`.
fn random_params(spec: &VariantSpec, sizes: Sizes, rng: &mut Rng) -> ParamValues {
    let vals = spec
        .params
        .iter()
        .map(|p| match &p.kind {
            ParamKind::Scalar(ScalarTy::I32) => {
                ParamValue::Int(rng.below(sizes.seq_k.max(sizes.seq_q) as u64 + 1) as i64)
            }
            ParamKind::Scalar(ScalarTy::F32) => ParamValue::Float(if p.name == "cap" {
                30.0
            } else {
                0.5 + rng.uniform()
            }),
            ParamKind::Tensor { elem, dims } => {
                let n: usize = tensor_shape(dims, sizes).iter().product();
                match elem {
                    ScalarTy::I32 => {
                        let mut v: Vec<i64> = (0..n).map(|_| rng.below(8) as i64).collect();
                        if dims.as_slice() == [Dim::Seq] {
                            v.sort(); // document ids
                        }
                        ParamValue::IntTensor(v)
                    }
                    ScalarTy::F32 => {
                        if dims.as_slice() == [Dim::Heads] {
                            // ALiBi slopes as in peers.py.
                            let h = sizes.heads as f64;
                            ParamValue::FloatTensor(
                                (0..n)
                                    .map(|i| (-8.0 * (i as f64 + 1.0) / h).exp2())
                                    .collect(),
                            )
                        } else {
                            ParamValue::FloatTensor((0..n).map(|_| 0.5 * rng.normal()).collect())
                        }
                    }
                }
            }
        })
        .collect();
    ParamValues::new(vals)
}

/// Device copies of param values; `args` borrows them.
struct DeviceParams {
    i32s: Vec<CudaSlice<i32>>,
    f32s: Vec<CudaSlice<f32>>,
}

fn upload_params(rt: &Runtime, pv: &ParamValues) -> Result<DeviceParams, FlashError> {
    let s = rt.stream();
    let drv = |e| FlashError::Driver(format!("copying params: {e:?}"));
    let mut d = DeviceParams {
        i32s: Vec::new(),
        f32s: Vec::new(),
    };
    for v in &pv.0 {
        match v {
            ParamValue::IntTensor(x) => {
                let mut h: Vec<i32> = x.iter().map(|&i| i as i32).collect();
                h.resize(h.len().max(1), 0);
                d.i32s.push(s.clone_htod(&h).map_err(drv)?);
            }
            ParamValue::FloatTensor(x) => {
                let mut h: Vec<f32> = x.iter().map(|&f| f as f32).collect();
                h.resize(h.len().max(1), 0.0);
                d.f32s.push(s.clone_htod(&h).map_err(drv)?);
            }
            _ => {}
        }
    }
    Ok(d)
}

fn param_args<'a>(rt: &Runtime, pv: &ParamValues, d: &'a DeviceParams) -> Vec<ParamArg<'a>> {
    let (mut i, mut f) = (0, 0);
    pv.0.iter()
        .map(|v| match v {
            ParamValue::Int(x) => ParamArg::I32(*x as i32),
            ParamValue::Float(x) => ParamArg::F32(*x as f32),
            ParamValue::IntTensor(x) => {
                let mut a = ParamArg::tensor_i32(&d.i32s[i], rt.stream());
                if let ParamArg::Tensor { len, .. } = &mut a {
                    *len = x.len();
                }
                i += 1;
                a
            }
            ParamValue::FloatTensor(x) => {
                let mut a = ParamArg::tensor_f32(&d.f32s[f], rt.stream());
                if let ParamArg::Tensor { len, .. } = &mut a {
                    *len = x.len();
                }
                f += 1;
                a
            }
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hkv: usize,
    /// Q/K/V inside one packed `[b, s, 3, h, d]` buffer and O with padded rows.
    strided: bool,
}

const fn sh(b: usize, sq: usize, sk: usize, hq: usize, hkv: usize) -> Shape {
    Shape {
        b,
        sq,
        sk,
        hq,
        hkv,
        strided: false,
    }
}

fn shapes(small: bool) -> Vec<Shape> {
    let mut v = vec![
        sh(1, 1, 1, 1, 1),
        sh(2, 17, 17, 3, 3),
        sh(1, 113, 113, 6, 2), // GQA
        sh(1, 113, 300, 4, 1), // MQA, seq_q < seq_k
        sh(1, 300, 113, 2, 2), // seq_q > seq_k: early rows fully masked under causal
        sh(2, 17, 0, 2, 2),    // no keys at all
        Shape {
            strided: true,
            ..sh(2, 65, 65, 4, 4)
        },
    ];
    if !small {
        v.push(sh(1, 1023, 1023, 2, 1));
        v.push(sh(1, 4096, 4096, 1, 1));
    }
    v
}

/// One problem, run by every kernel family under test.
struct CaseResult {
    name: String,
    problem: Problem,
    spec: VariantSpec,
    /// Per family: its name and O, LSE, stray writes (elements of the O buffer outside the
    /// view that were overwritten), or the error.
    runs: Vec<(String, Result<GpuOut, String>)>,
}

/// Runs one case on the GPU; the CPU comparison happens later, in parallel.
fn run_case(
    rt: &Runtime,
    spec: &VariantSpec,
    s: Shape,
    seed: u64,
    families: &[KernelFamily],
) -> CaseResult {
    let dt = spec.dtype;
    let name = format!(
        "{:<13} {:<4} d{:<3} b{} {}x{} h{}/{}{}",
        spec.name,
        dt.name(),
        spec.head_dim_qk,
        s.b,
        s.sq,
        s.sk,
        s.hq,
        s.hkv,
        if s.strided { " strided" } else { "" }
    );
    let mut rng = Rng(seed);
    let d = spec.head_dim_qk as usize;
    let dv = spec.head_dim_v as usize;
    let sizes = Sizes {
        batch: s.b,
        heads: s.hq,
        seq_q: s.sq,
        seq_k: s.sk,
    };
    let params = random_params(spec, sizes, &mut rng);
    let (qb, qv) = draw(&mut rng, s.b * s.sq * s.hq * d, dt);
    let (kb, kv) = draw(&mut rng, s.b * s.sk * s.hkv * d, dt);
    let (vb, vv) = draw(&mut rng, s.b * s.sk * s.hkv * dv, dt);
    let problem = Problem {
        batch: s.b,
        heads_q: s.hq,
        heads_kv: s.hkv,
        seq_q: s.sq,
        seq_k: s.sk,
        q: qv,
        k: kv,
        v: vv,
        params: params.clone(),
    };
    let runs = families
        .iter()
        .map(|&fam| {
            let cfg = default_config_for(spec, fam);
            let r = gpu_case(rt, spec, cfg, s, &params, (&qb, &kb, &vb)).map_err(|e| e.to_string());
            (format!("{fam:?}").to_lowercase(), r)
        })
        .collect();
    CaseResult {
        name,
        problem,
        spec: spec.clone(),
        runs,
    }
}

type GpuOut = (Vec<f64>, Vec<f64>, usize);

fn gpu_case(
    rt: &Runtime,
    spec: &VariantSpec,
    cfg: TileConfig,
    s: Shape,
    params: &ParamValues,
    (qb, kb, vb): (&[u16], &[u16], &[u16]),
) -> Result<GpuOut, FlashError> {
    let st = rt.stream();
    let drv = |what: &'static str| move |e| FlashError::Driver(format!("{what}: {e:?}"));
    let dt = spec.dtype;
    let (d, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let kernel = rt.load(spec, Some(cfg))?;
    let q_shape = [s.b, s.sq, s.hq, d];
    let k_shape = [s.b, s.sk, s.hkv, d];
    let v_shape = [s.b, s.sk, s.hkv, dv];
    let o_shape = [s.b, s.sq, s.hq, dv];
    let pad = |mut v: Vec<u16>| {
        let n = v.len().max(8);
        v.resize(n, 0);
        v
    };
    // O: padded rows when strided, so stray writes land in checkable padding.
    let o_strides = if s.strided {
        let row = (s.hq * dv + 8) as i64;
        [row * s.sq as i64, row, dv as i64, 1]
    } else {
        contiguous_strides(o_shape)
    };
    let o_len = if s.strided {
        (s.b * s.sq * (s.hq * dv + 8)).max(8)
    } else {
        o_shape.iter().product::<usize>().max(8)
    };
    let mut o = st
        .clone_htod(&vec![nan_bits(dt); o_len])
        .map_err(drv("allocating O"))?;
    let n_lse = s.b * s.hq * s.sq;
    let mut lse = st
        .clone_htod(&vec![f32::NAN; n_lse.max(1)])
        .map_err(drv("allocating the LSE"))?;
    let dparams = upload_params(rt, params)?;
    let args = param_args(rt, params, &dparams);

    if s.strided {
        // One packed [b, s, 3, h, d] buffer (needs sq == sk, hq == hkv, d == dv).
        assert!(s.sq == s.sk && s.hq == s.hkv && d == dv);
        let row = 3 * s.hq * d;
        let mut packed = vec![0u16; s.b * s.sq * row];
        for b in 0..s.b {
            for i in 0..s.sq {
                for h in 0..s.hq {
                    let src = ((b * s.sq + i) * s.hq + h) * d;
                    let dst = (b * s.sq + i) * row + h * d;
                    packed[dst..dst + d].copy_from_slice(&qb[src..src + d]);
                    let dst = dst + s.hq * d;
                    packed[dst..dst + d].copy_from_slice(&kb[src..src + d]);
                    let dst = dst + s.hq * d;
                    packed[dst..dst + d].copy_from_slice(&vb[src..src + d]);
                }
            }
        }
        let buf = st.clone_htod(&packed).map_err(drv("copying QKV"))?;
        let strides = [(s.sq * row) as i64, row as i64, d as i64, 1];
        // Views at element offsets 0, h·d, 2·h·d of the same buffer.
        let tq = TensorRef::strided(&buf, q_shape, strides, st);
        let tk = TensorRef::strided_at(&buf, s.hq * d, k_shape, strides, st);
        let tv = TensorRef::strided_at(&buf, 2 * s.hq * d, v_shape, strides, st);
        let mut to = TensorMut::strided(&mut o, o_shape, o_strides, st);
        let mut tl = LseMut::new(&mut lse, st);
        rt.forward(&kernel, &tq, &tk, &tv, &mut to, &mut tl, &args)?;
    } else {
        let dq = st.clone_htod(&pad(qb.to_vec())).map_err(drv("copying Q"))?;
        let dk = st.clone_htod(&pad(kb.to_vec())).map_err(drv("copying K"))?;
        let dvv = st.clone_htod(&pad(vb.to_vec())).map_err(drv("copying V"))?;
        let tq = TensorRef::new(&dq, q_shape, st);
        let tk = TensorRef::new(&dk, k_shape, st);
        let tv = TensorRef::new(&dvv, v_shape, st);
        let mut to = TensorMut::strided(&mut o, o_shape, o_strides, st);
        let mut tl = LseMut::new(&mut lse, st);
        rt.forward(&kernel, &tq, &tk, &tv, &mut to, &mut tl, &args)?;
    }
    rt.synchronize()?;
    let oh: Vec<u16> = st.clone_dtoh(&o).map_err(drv("copying O back"))?;
    let lh: Vec<f32> = st.clone_dtoh(&lse).map_err(drv("copying the LSE back"))?;
    let mut out = vec![0.0; o_shape.iter().product()];
    let mut touched = vec![false; oh.len()];
    for b in 0..s.b {
        for i in 0..s.sq {
            for h in 0..s.hq {
                for c in 0..dv {
                    let at = b as i64 * o_strides[0]
                        + i as i64 * o_strides[1]
                        + h as i64 * o_strides[2]
                        + c as i64;
                    touched[at as usize] = true;
                    out[((b * s.sq + i) * s.hq + h) * dv + c] = from_bits(oh[at as usize], dt);
                }
            }
        }
    }
    let stray = oh
        .iter()
        .zip(&touched)
        .filter(|(x, t)| !**t && **x != nan_bits(dt))
        .count();
    Ok((out, lh[..n_lse].iter().map(|&x| x as f64).collect(), stray))
}

/// Compares each family's result with the references (computed once); `(passed, line)` each.
fn judge(r: &CaseResult) -> Vec<(bool, String)> {
    let ref64 = reference::forward(&r.spec, &r.problem);
    let plain = reference::forward_lowp(&r.spec, &r.problem, reference::rounding(r.spec.dtype));
    let err_plain = reference::max_abs_diff(&plain.o, &ref64.o);
    r.runs
        .iter()
        .map(|(fam, run)| match run {
            Err(e) => (false, format!("FAIL {} {fam}  error: {e}", r.name)),
            Ok(out) => judge_one(r, fam, out, &ref64, err_plain),
        })
        .collect()
}

fn judge_one(
    r: &CaseResult,
    fam: &str,
    (o, lse, stray): &GpuOut,
    ref64: &reference::Output,
    err_plain: f64,
) -> (bool, String) {
    let err = reference::max_abs_diff(o, &ref64.o);
    let nan_o = o.iter().filter(|x| x.is_nan()).count();
    let nan_lse = lse.iter().filter(|x| x.is_nan()).count();
    let dv = r.spec.head_dim_v as usize;
    let (sq, hq) = (r.problem.seq_q, r.problem.heads_q);
    let mut lse_err: f64 = 0.0;
    let mut inf_mismatch = 0usize;
    let mut masked_rows = 0usize;
    let mut masked_nonzero = 0usize;
    for (idx, (&got, &want)) in lse.iter().zip(&ref64.lse).enumerate() {
        if want == f64::NEG_INFINITY {
            masked_rows += 1;
            if got != f64::NEG_INFINITY {
                inf_mismatch += 1;
            }
            // idx = (b·hq + h)·sq + i  →  O row (b, i, h).
            let (bh, i) = (idx / sq.max(1), idx % sq.max(1));
            let (b, h) = (bh / hq, bh % hq);
            let row = ((b * sq + i) * hq + h) * dv;
            if o[row..row + dv].iter().any(|&x| x != 0.0) {
                masked_nonzero += 1;
            }
        } else if got == f64::NEG_INFINITY || got.is_nan() {
            inf_mismatch += 1;
        } else {
            lse_err = lse_err.max((got - want).abs() / want.abs().max(1.0));
        }
    }
    let ok = nan_o == 0
        && nan_lse == 0
        && err <= 2.0 * err_plain + 1e-6
        && lse_err <= 1e-3
        && inf_mismatch == 0
        && masked_nonzero == 0
        && *stray == 0;
    let mut line = format!(
        "{} {} {fam:<4} err {:.2e} plain {:.2e} ratio {:.2} lse {:.1e} masked_rows {}",
        if ok { "ok  " } else { "FAIL" },
        r.name,
        err,
        err_plain,
        if err_plain > 0.0 {
            err / err_plain
        } else {
            0.0
        },
        lse_err,
        masked_rows,
    );
    if nan_o + nan_lse > 0 {
        line += &format!(" NaN(o {nan_o}, lse {nan_lse})");
    }
    if inf_mismatch > 0 {
        line += &format!(" lse_inf_mismatch {inf_mismatch}");
    }
    if masked_nonzero > 0 {
        line += &format!(" masked_rows_nonzero {masked_nonzero}");
    }
    if *stray > 0 {
        line += &format!(" stray_writes {stray}");
    }
    (ok, line)
}

fn load_variants(dir: &Path) -> Result<Vec<VariantSpec>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "flash"))
        .collect();
    files.sort();
    let mut specs = Vec::new();
    for f in files {
        specs.extend(flash_dsl::parse::parse_file(&f)?);
    }
    Ok(specs)
}

fn with(spec: &VariantSpec, d: u32, dt: DType) -> VariantSpec {
    let mut s = spec.clone();
    if s.head_dim_v == s.head_dim_qk {
        s.head_dim_v = d;
    }
    s.head_dim_qk = d;
    s.dtype = dt;
    s
}

/// Compiles every spec in parallel through the runtime's cache (so the sequential loads after
/// are memory hits).
fn precompile(rt: &Runtime, specs: &[(VariantSpec, Option<TileConfig>)]) {
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let opts = flash_runtime::CompileOptions::new(rt.info().arch.clone());
    std::thread::scope(|sc| {
        for _ in 0..threads.min(specs.len()) {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((spec, cfg)) = specs.get(i) else {
                    break;
                };
                if let Ok(plan) = rt.plan(spec, *cfg) {
                    if let Err(e) = rt.cache().get_or_compile(&flash_dsl::emit(&plan), &opts) {
                        eprintln!("compile {}: {e}", plan.kernel_name);
                    }
                }
            });
        }
    });
}

fn check(
    rt: &Runtime,
    specs: &[VariantSpec],
    small: bool,
    families: &[KernelFamily],
) -> (usize, usize) {
    let mut cases: Vec<(VariantSpec, Shape)> = Vec::new();
    for spec in specs {
        let dtypes: &[DType] = if matches!(spec.name.as_str(), "Dense" | "Causal") {
            &[DType::Bf16, DType::F16]
        } else {
            std::slice::from_ref(&spec.dtype)
        };
        for &dt in dtypes {
            let dims: &[u32] = if small { &[64, 128] } else { &[64, 96, 128] };
            for &d in dims {
                let s = with(spec, d, dt);
                for sh in shapes(small) {
                    cases.push((s.clone(), sh));
                }
            }
        }
    }
    let mut uniq: Vec<(VariantSpec, Option<TileConfig>)> = Vec::new();
    for (s, _) in &cases {
        for &f in families {
            let k = (s.clone(), Some(default_config_for(s, f)));
            if !uniq.contains(&k) {
                uniq.push(k);
            }
        }
    }
    let t0 = Instant::now();
    precompile(rt, &uniq);
    println!(
        "# compiled {} kernels in {:.1} s",
        uniq.len(),
        t0.elapsed().as_secs_f64()
    );
    let t0 = Instant::now();
    let results: Vec<CaseResult> = cases
        .iter()
        .enumerate()
        .map(|(i, (s, shp))| run_case(rt, s, *shp, 1000 + i as u64, families))
        .collect();
    println!(
        "# ran {} cases on the GPU in {:.1} s; comparing on the CPU",
        results.len(),
        t0.elapsed().as_secs_f64()
    );
    // Largest first, so the long references start early.
    let mut order: Vec<usize> = (0..results.len()).collect();
    order.sort_by_key(|&i| {
        let p = &results[i].problem;
        std::cmp::Reverse(p.batch * p.heads_q * p.seq_q * p.seq_k)
    });
    // Lines are printed as each comparison finishes (so a run cut short still reports).
    let next = AtomicUsize::new(0);
    let (total, fails) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let j = next.fetch_add(1, Ordering::Relaxed);
                let Some(&i) = order.get(j) else { break };
                for (ok, line) in judge(&results[i]) {
                    total.fetch_add(1, Ordering::Relaxed);
                    if !ok {
                        fails.fetch_add(1, Ordering::Relaxed);
                    }
                    println!("{line}");
                }
            });
        }
    });
    let (total, fails) = (total.into_inner(), fails.into_inner());
    (total, fails)
}

// ---------------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------------

/// Fraction of visible (q, k) pairs of a peers.py variant workload at `n × n`.
fn density(variant: &str, n: usize, docs: &[i64]) -> f64 {
    let total = (n * n) as f64;
    let causal = (n * (n + 1) / 2) as f64;
    match variant {
        "window1024_causal" => (0..n).map(|q| (q + 1).min(1024)).sum::<usize>() as f64 / total,
        "document_causal" => {
            let mut c = 0usize;
            let mut i = 0;
            while i < n {
                let j = (i..n).find(|&j| docs[j] != docs[i]).unwrap_or(n);
                let len = j - i;
                c += len * (len + 1) / 2;
                i = j;
            }
            c as f64 / total
        }
        "prefixlm1024" => (0..n).map(|q| (q + 1).max(1024.min(n))).sum::<usize>() as f64 / total,
        _ => causal / total,
    }
}

struct TimeBufs {
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    o: CudaSlice<u16>,
    lse: CudaSlice<f32>,
}

fn time_bufs(rt: &Runtime, elems: usize, lse: usize, dt: DType) -> Result<TimeBufs, FlashError> {
    let st = rt.stream();
    let drv = |e| FlashError::Driver(format!("timing buffers: {e:?}"));
    let mut rng = Rng(7 + dt as u64);
    let mut gen = || -> Vec<u16> { (0..elems).map(|_| to_bits(rng.normal(), dt)).collect() };
    Ok(TimeBufs {
        q: st.clone_htod(&gen()).map_err(drv)?,
        k: st.clone_htod(&gen()).map_err(drv)?,
        v: st.clone_htod(&gen()).map_err(drv)?,
        o: st.alloc_zeros::<u16>(elems).map_err(drv)?,
        lse: st.alloc_zeros::<f32>(lse).map_err(drv)?,
    })
}

#[allow(clippy::too_many_arguments)]
fn time_one(
    rt: &Runtime,
    bufs: &mut TimeBufs,
    spec: &VariantSpec,
    pv: &ParamValues,
    b: usize,
    n: usize,
    h: usize,
) -> Result<f32, FlashError> {
    let kernel = rt.load(spec, None)?;
    let d = spec.head_dim_qk as usize;
    let shape = [b, n, h, d];
    let st = rt.stream();
    let dp = upload_params(rt, pv)?;
    let args = param_args(rt, pv, &dp);
    let (q, k, v) = (
        TensorRef::new(&bufs.q, shape, st),
        TensorRef::new(&bufs.k, shape, st),
        TensorRef::new(&bufs.v, shape, st),
    );
    let mut o = TensorMut::new(&mut bufs.o, shape, st);
    let mut l = LseMut::new(&mut bufs.lse, st);
    let iters = if n >= 16384 { 10 } else { 20 };
    rt.time_forward(&kernel, &q, &k, &v, &mut o, &mut l, &args, 3, iters)
}

fn timing(rt: &Runtime, specs: &[VariantSpec], rows: &mut Vec<Value>) -> Result<(), FlashError> {
    let get = |name: &str| {
        specs
            .iter()
            .find(|s| s.name == name)
            .cloned()
            .ok_or_else(|| FlashError::Invalid(format!("no variant `{name}` in the examples")))
    };
    let gpu = rt.info().name.clone();
    let elems = 16384 * 2048;
    // Kernels first, in parallel.
    let mut all = Vec::new();
    for dt in [DType::Bf16, DType::F16] {
        for d in [64u32, 128] {
            all.push(with(&get("Dense")?, d, dt));
            all.push(with(&get("Causal")?, d, dt));
        }
    }
    for v in ["Softcap", "Alibi", "SlidingWindow", "Document", "PrefixLm"] {
        all.push(with(&get(v)?, 128, DType::Bf16));
    }
    let all: Vec<_> = all.into_iter().map(|s| (s, None)).collect();
    precompile(rt, &all);

    for dt in [DType::Bf16, DType::F16] {
        let mut bufs = time_bufs(rt, elems, 16384 * 32, dt)?;
        for d in [64usize, 128] {
            let h = 2048 / d;
            for n in [1024usize, 4096, 16384] {
                let b = 16384 / n;
                for causal in [false, true] {
                    let spec = with(&get(if causal { "Causal" } else { "Dense" })?, d as u32, dt);
                    let ms = time_one(rt, &mut bufs, &spec, &ParamValues::none(), b, n, h)?;
                    let mut fl = 4.0 * (b * h * n * n * d) as f64;
                    if causal {
                        fl /= 2.0;
                    }
                    let tf = fl / ms as f64 / 1e9;
                    println!(
                        "fwd d={d:3} n={n:6} b={b:3} h={h:3} causal={} {:<4} flash {ms:9.3} ms {tf:7.1} TFLOP/s",
                        causal as u8,
                        dt.name()
                    );
                    rows.push(json!({"gpu": gpu, "backend": "flash", "variant": if causal {"causal"} else {"dense"},
                        "dtype": dt.name(), "d": d, "n": n, "b": b, "h": h, "causal": causal, "mode": "fwd",
                        "ms": ms, "tflops": tf}));
                }
            }
        }
    }
    let mut bufs = time_bufs(rt, 16384 * 16 * 128, 16384 * 16, DType::Bf16)?;
    let (d, h) = (128usize, 16usize);
    for n in [4096usize, 16384] {
        let b = 16384 / n;
        let mut rng = Rng(n as u64);
        let mut docs: Vec<i64> = (0..n).map(|_| rng.below(8) as i64).collect();
        docs.sort();
        let slopes: Vec<f64> = (1..=h)
            .map(|i| (-8.0 * i as f64 / h as f64).exp2())
            .collect();
        let cases: [(&str, &str, ParamValues); 5] = [
            (
                "softcap30_causal",
                "Softcap",
                ParamValues::new(vec![ParamValue::Float(30.0)]),
            ),
            (
                "alibi_causal",
                "Alibi",
                ParamValues::new(vec![ParamValue::FloatTensor(slopes)]),
            ),
            ("window1024_causal", "SlidingWindow", ParamValues::none()),
            (
                "document_causal",
                "Document",
                ParamValues::new(vec![ParamValue::IntTensor(docs.clone())]),
            ),
            (
                "prefixlm1024",
                "PrefixLm",
                ParamValues::new(vec![ParamValue::Int(1024)]),
            ),
        ];
        for (label, name, pv) in cases {
            let spec = with(&get(name)?, 128, DType::Bf16);
            let ms = time_one(rt, &mut bufs, &spec, &pv, b, n, h)?;
            let dens = density(label, n, &docs);
            let tf = 4.0 * (b * h * n * n * d) as f64 * dens / ms as f64 / 1e9;
            println!(
                "fwd d={d:3} n={n:6} b={b:3} h={h:3} {label:18} density={dens:.3} flash {ms:9.3} ms {tf:7.1} TFLOP/s (useful)"
            );
            rows.push(json!({"gpu": gpu, "backend": "flash", "variant": label, "dtype": "bf16",
                "d": d, "n": n, "b": b, "h": h, "causal": true, "mode": "fwd", "ms": ms, "tflops": tf,
                "density": dens}));
        }
    }
    // Compile latency: a fresh cache folder (cold NVRTC), then a second cache instance on the
    // same folder (disk hit), each through Runtime::load (plan + emit + cache + module load).
    let dir = std::env::temp_dir().join(format!("flash-gpucheck-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let spec = with(&get("Softcap")?, 128, DType::Bf16);
    let cold = Runtime::with_cache(rt.info().ordinal, KernelCache::new(Some(dir.clone())))?;
    let k1 = cold.load(&spec, None)?;
    let warm = Runtime::with_cache(rt.info().ordinal, KernelCache::new(Some(dir.clone())))?;
    let k2 = warm.load(&spec, None)?;
    let t = Instant::now();
    let _ = warm.load(&spec, None)?;
    let mem_ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "compile {}: cold {:.1} ms ({}; nvrtc {:.1} ms), disk-cache load {:.2} ms ({}), in-memory {:.4} ms",
        k1.plan.kernel_name,
        k1.load_ms,
        k1.outcome.as_str(),
        k1.compiled.compile_ms,
        k2.load_ms,
        k2.outcome.as_str(),
        mem_ms
    );
    for (mode, ms) in [
        ("compile_cold", k1.load_ms),
        ("compile_disk", k2.load_ms),
        ("compile_memory", mem_ms),
    ] {
        rows.push(json!({"gpu": gpu, "backend": "flash", "variant": "softcap30_causal", "dtype": "bf16",
            "d": 128, "n": 0, "b": 0, "h": 0, "causal": true, "mode": mode, "ms": ms, "tflops": null}));
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut dir = PathBuf::from("examples/variants");
    let (mut small, mut do_check, mut do_time) = (false, true, true);
    let mut json_out: Option<PathBuf> = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--variants" => dir = args.next().map(PathBuf::from).unwrap_or(dir),
            "--small" => {
                small = true;
                do_time = false;
            }
            "--no-check" => do_check = false,
            "--no-time" => do_time = false,
            "--json" => json_out = args.next().map(PathBuf::from),
            "-h" | "--help" => {
                println!("flash-gpucheck [--variants DIR] [--small] [--no-check] [--no-time] [--json OUT.json]");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("unknown argument `{other}`");
                return ExitCode::from(2);
            }
        }
    }
    let rt = match Runtime::new(0) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let info = rt.info();
    println!(
        "# device {} sm_count={} cc={}.{} arch={} smem_optin={}",
        info.name,
        info.sm_count,
        info.compute_capability.0,
        info.compute_capability.1,
        info.arch,
        info.max_smem_optin
    );
    let specs = match load_variants(&dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    if do_check {
        let families: Vec<KernelFamily> =
            [KernelFamily::Sm90Ws, KernelFamily::Sm90, KernelFamily::Sm80]
                .into_iter()
                .filter(|f| f.runs_on(&info.arch))
                .collect();
        let (n, fails) = check(&rt, &specs, small, &families);
        println!("# correctness: {} passed, {fails} failed of {n}", n - fails);
        failed |= fails > 0;
    }
    if do_time {
        let mut rows = Vec::new();
        if let Err(e) = timing(&rt, &specs, &mut rows) {
            println!("# timing failed: {e}");
            failed = true;
        }
        if let Some(p) = &json_out {
            let text = serde_json::to_string_pretty(&rows).expect("rows serialise");
            if let Err(e) = std::fs::write(p, text) {
                eprintln!("error: writing {}: {e}", p.display());
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
