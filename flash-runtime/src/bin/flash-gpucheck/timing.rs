//! Timing: dense/causal and the `bench/peers.py` variant workloads, and compile latency.

use std::time::Instant;

use flash_dsl::eval::{ParamValue, ParamValues};
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::{DType, VariantSpec};
use flash_runtime::cudarc::driver::CudaSlice;
use flash_runtime::{FlashError, KernelCache, LseMut, ProblemShape, Runtime, TensorMut, TensorRef};
use serde_json::{json, Value};

use crate::device::{param_args, upload_params};
use crate::variants::{example, precompile, with};

/// Which forward timings to run (`--time-set`): dense/causal rows of the chosen dtypes and head
/// dims at the chosen sequence lengths, the variant workloads (with BigBird and the compile
/// latency), the decode workloads.
pub struct TimeSet {
    pub dtypes: Vec<DType>,
    pub dims: Vec<usize>,
    /// Sequence lengths of the dense/causal rows (batch · length = 16384 tokens).
    pub seqs: Vec<usize>,
    pub variants: bool,
    pub decode: bool,
}

/// The dense/causal rows' sequence lengths unless `--time-set` names others (peers.py's).
const DEFAULT_SEQS: [usize; 3] = [1024, 4096, 16384];

impl TimeSet {
    pub fn all() -> TimeSet {
        TimeSet {
            dtypes: vec![DType::Bf16, DType::F16],
            dims: vec![64, 128],
            seqs: DEFAULT_SEQS.to_vec(),
            variants: true,
            decode: true,
        }
    }

    /// `bf16,d128,n8192,variants`: a dtype, head dim or sequence length (`n` and a power of two
    /// from 1024 to 16384) named restricts the dense rows to those named (none named: the
    /// defaults); `variants` and `decode` switch those parts on (off unless named).
    pub fn parse(list: &str) -> Result<TimeSet, String> {
        let mut t = TimeSet {
            dtypes: vec![],
            dims: vec![],
            seqs: vec![],
            variants: false,
            decode: false,
        };
        for w in list.split(',').filter(|w| !w.is_empty()) {
            match w {
                "bf16" => t.dtypes.push(DType::Bf16),
                "f16" => t.dtypes.push(DType::F16),
                "d64" => t.dims.push(64),
                "d128" => t.dims.push(128),
                "variants" => t.variants = true,
                "decode" => t.decode = true,
                other => match other.strip_prefix('n').and_then(|x| x.parse::<usize>().ok()) {
                    Some(n) if n.is_power_of_two() && (1024..=16384).contains(&n) => t.seqs.push(n),
                    _ => {
                        return Err(format!(
                        "--time-set: unknown part `{other}` (bf16, f16, d64, d128, n1024 … n16384, variants, decode)"
                    ))
                    }
                },
            }
        }
        if t.dtypes.is_empty() {
            t.dtypes = vec![DType::Bf16, DType::F16];
        }
        if t.dims.is_empty() {
            t.dims = vec![64, 128];
        }
        if t.seqs.is_empty() {
            t.seqs = DEFAULT_SEQS.to_vec();
        }
        Ok(t)
    }
}

/// The peers.py variant workloads at sequence length `n` with `h` heads: (label, example
/// variant, param values), and the sorted document ids the document mask uses.
pub(crate) fn variant_workloads(
    n: usize,
    h: usize,
) -> (Vec<i64>, [(&'static str, &'static str, ParamValues); 5]) {
    let mut rng = Rng(n as u64);
    let mut docs: Vec<i64> = (0..n).map(|_| rng.below(8) as i64).collect();
    docs.sort();
    let slopes: Vec<f64> = (1..=h)
        .map(|i| (-8.0 * i as f64 / h as f64).exp2())
        .collect();
    let cases = [
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
    (docs, cases)
}

pub(crate) fn density(variant: &str, n: usize, docs: &[i64]) -> f64 {
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
    let mut gen = || -> Vec<u16> { (0..elems).map(|_| dt.to_bits(rng.normal())).collect() };
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
    let launch = ProblemShape {
        batch: b,
        seq_q: n,
        seq_k: n,
        heads_q: h,
        heads_kv: h,
    };
    let kernel = rt.load(spec, Some(rt.launch_config(spec, &launch)))?;
    let d = spec.head_dim_qk as usize;
    let shape = [b, n, h, d];
    let st = rt.stream();
    let dp = upload_params(rt, pv)?;
    let args = param_args(rt, spec, pv, &dp);
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

pub fn timing(
    rt: &Runtime,
    specs: &[VariantSpec],
    rows: &mut Vec<Value>,
    set: &TimeSet,
) -> Result<(), FlashError> {
    let get = |name: &str| example(specs, name);
    let gpu = rt.info().name.clone();
    let elems = 16384 * 2048;
    // Kernels first, in parallel.
    let mut all = Vec::new();
    for &dt in &set.dtypes {
        for &d in &set.dims {
            all.push(with(&get("Dense")?, d as u32, dt));
            all.push(with(&get("Causal")?, d as u32, dt));
        }
    }
    let variant_names: &[&str] = if set.variants {
        &[
            "Softcap",
            "Alibi",
            "SlidingWindow",
            "Document",
            "PrefixLm",
            "BigBird",
        ]
    } else {
        &[]
    };
    for v in variant_names {
        all.push(with(&get(v)?, 128, DType::Bf16));
    }
    let all: Vec<_> = all.into_iter().map(|s| (s, None)).collect();
    precompile(rt, &all);

    for &dt in &set.dtypes {
        let mut bufs = time_bufs(rt, elems, 16384 * 32, dt)?;
        for &d in &set.dims {
            let h = 2048 / d;
            for &n in &set.seqs {
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
    if !set.variants {
        return Ok(());
    }
    let mut bufs = time_bufs(rt, 16384 * 16 * 128, 16384 * 16, DType::Bf16)?;
    let (d, h) = (128usize, 16usize);
    for n in [4096usize, 16384] {
        let b = 16384 / n;
        let (docs, cases) = variant_workloads(n, h);
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
    // Block sparsity: the BigBird-style layout of the issue (blocks of 128; 3 local, 2 global,
    // 3 random key blocks per query block), useful TFLOP/s beside the dense kernel's at the same
    // shape (the layout's tiles are full, so that ratio is the efficiency per visited block).
    let bigbird = with(&get("BigBird")?, 128, DType::Bf16);
    let sp = bigbird.sparsity.expect("BigBird declares a layout");
    for n in [4096usize, 16384] {
        let b = 16384 / n;
        let sizes = flash_dsl::eval::Sizes {
            batch: b,
            heads: h,
            seq_q: n,
            seq_k: n,
        };
        let layout = flash_dsl::sparsity::bigbird_layout(&sp, sizes, (3, 2, 3), &mut Rng(n as u64));
        let dens = flash_dsl::sparsity::layout_density(&sp, sizes, &layout);
        let pv = ParamValues::new(vec![ParamValue::IntTensor(layout)]);
        let ms = time_one(rt, &mut bufs, &bigbird, &pv, b, n, h)?;
        let tf = 4.0 * (b * h * n * n * d) as f64 * dens / ms as f64 / 1e9;
        let dense_tf = rows
            .iter()
            .find(|r| {
                r["variant"] == "dense" && r["dtype"] == "bf16" && r["d"] == 128 && r["n"] == n
            })
            .and_then(|r| r["tflops"].as_f64())
            .unwrap_or(f64::NAN);
        println!(
            "fwd d={d:3} n={n:6} b={b:3} h={h:3} bigbird128_l3g2r3  density={dens:.3} flash {ms:9.3} ms {tf:7.1} TFLOP/s (useful; {:.2} of dense)",
            tf / dense_tf
        );
        rows.push(
            json!({"gpu": gpu, "backend": "flash", "variant": "bigbird128_l3g2r3", "dtype": "bf16",
            "d": d, "n": n, "b": b, "h": h, "causal": false, "mode": "fwd", "ms": ms, "tflops": tf,
            "density": dens, "of_dense": tf / dense_tf}),
        );
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
