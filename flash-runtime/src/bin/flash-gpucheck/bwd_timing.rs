//! Backward timing (`--backward` with timing on): dense/causal at d 64 and 128 and the
//! peers.py variant workloads at d 128, bf16; the whole backward call (pre-processing, main
//! kernel, dQ conversion, scratch allocation and gradient zeroing) between two CUDA events,
//! median of several runs. FLOPs: 2.5× the forward's, as the FlashAttention papers count them
//! (useful FLOPs, × mask density, for the variants). The variants run with their score params
//! frozen, as the peers' workloads are (their params carry no gradient), and where they have
//! `f32` score params also with those params' gradients (`+dparams`, mode `bwd_dparams`).

use flash_dsl::eval::ParamValues;
use flash_dsl::plan::default_backward_config_for;
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::{DType, TileConfig, VariantSpec};
use flash_runtime::cudarc::driver::{sys, CudaSlice};
use flash_runtime::launch::backward::{BackwardGrads, BackwardInputs, LseRef};
use flash_runtime::tune::backward_candidates;
use flash_runtime::{FlashError, ProblemShape, Runtime, TensorMut, TensorRef};
use serde_json::{json, Value};

use crate::device::{param_args, upload_params};
use crate::timing::{density, variant_workloads};
use crate::variants::{example, with};

struct Bufs {
    x: [CudaSlice<u16>; 5],
    g: [CudaSlice<u16>; 3],
    lse: CudaSlice<f32>,
    /// Zeroed before each timed backward (see `time_one`).
    flush: CudaSlice<u8>,
}

/// Bytes zeroed before each timed backward: what `triton.testing.do_bench`, which times the
/// peers, zeroes between its runs (256 MB, five times the H200's L2).
const FLUSH_BYTES: usize = 256 << 20;

fn bufs(rt: &Runtime, elems: usize, rows: usize) -> Result<Bufs, FlashError> {
    let st = rt.stream();
    let drv = |e| FlashError::Driver(format!("timing buffers: {e:?}"));
    let mut rng = Rng(11);
    let mut gen = || -> Vec<u16> {
        (0..elems)
            .map(|_| DType::Bf16.to_bits(0.5 * rng.normal()))
            .collect()
    };
    Ok(Bufs {
        x: [
            st.clone_htod(&gen()).map_err(drv)?,
            st.clone_htod(&gen()).map_err(drv)?,
            st.clone_htod(&gen()).map_err(drv)?,
            st.clone_htod(&gen()).map_err(drv)?,
            st.clone_htod(&gen()).map_err(drv)?,
        ],
        g: [
            st.alloc_zeros::<u16>(elems).map_err(drv)?,
            st.alloc_zeros::<u16>(elems).map_err(drv)?,
            st.alloc_zeros::<u16>(elems).map_err(drv)?,
        ],
        // A plausible LSE: every row sees its keys with weights around 1.
        lse: st.clone_htod(&vec![8.0f32; rows]).map_err(drv)?,
        flush: st.alloc_zeros::<u8>(FLUSH_BYTES).map_err(drv)?,
    })
}

/// Median time of the backward of `spec` with `pv`; `dparams`: with a gradient buffer for every
/// parameter whose gradient the backward can compute (without: those parameters are frozen, as
/// in the peers' workloads, whose score params carry no gradient).
#[allow(clippy::too_many_arguments)]
fn time_one(
    rt: &Runtime,
    bb: &mut Bufs,
    spec: &VariantSpec,
    pv: &ParamValues,
    (b, n, h): (usize, usize, usize),
    deterministic: bool,
    config: Option<TileConfig>,
    dparams: bool,
) -> Result<f32, FlashError> {
    let opts = flash_runtime::launch::backward::BackwardOptions {
        config,
        deterministic,
    };
    let st = rt.stream();
    let drv = |what: &'static str| move |e| FlashError::Driver(format!("{what}: {e:?}"));
    let shape = [b, n, h, spec.head_dim_qk as usize];
    let dp = upload_params(rt, pv)?;
    let args = param_args(rt, spec, pv, &dp);
    let input = BackwardInputs {
        q: TensorRef::new(&bb.x[0], shape, st),
        k: TensorRef::new(&bb.x[1], shape, st),
        v: TensorRef::new(&bb.x[2], shape, st),
        o: TensorRef::new(&bb.x[3], shape, st),
        d_o: TensorRef::new(&bb.x[4], shape, st),
        lse: LseRef::new(&bb.lse, st),
    };
    let wanted = if dparams {
        flash_dsl::plan::grad_params(spec)
    } else {
        Vec::new()
    };
    let mut gbufs: Vec<Option<CudaSlice<f32>>> = Vec::new();
    for (i, value) in pv.0.iter().enumerate() {
        gbufs.push(if wanted.contains(&i) {
            let len = match value {
                flash_dsl::eval::ParamValue::FloatTensor(v) => v.len().max(1),
                _ => 1,
            };
            Some(st.alloc_zeros::<f32>(len).map_err(drv("gradient buffer"))?)
        } else {
            None
        });
    }
    let [g0, g1, g2] = &mut bb.g;
    let mut grads = BackwardGrads {
        dq: TensorMut::new(g0, shape, st),
        dk: TensorMut::new(g1, shape, st),
        dv: TensorMut::new(g2, shape, st),
        dparams: gbufs.iter_mut().map(|g| g.as_mut()).collect(),
    };
    let ctx = rt.context();
    let ev = || ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT));
    let (start, end) = (ev().map_err(drv("event"))?, ev().map_err(drv("event"))?);
    // A data-dependent mask's block map is built once, outside the timed runs (its build is
    // timed apart, as FlexAttention's create_block_mask is).
    let map = rt.backward_block_map(spec, config, ProblemShape::of(&input.q, &input.k), &args)?;
    for _ in 0..2 {
        rt.backward_mapped(spec, &opts, &input, &args, &mut grads, map.as_ref())?;
    }
    // As the peers are timed (`do_bench`): before each run the L2 cache is evicted by zeroing a
    // buffer, outside the events, and the device works on that while the host enqueues the
    // backward — whose host side (checks, scratch, three launches: about 0.03 ms on the GPU
    // machine) is then not counted, as a training loop, which enqueues ahead, does not wait
    // on it. Timed from an idle device instead (each run after the last one's
    // synchronisation), the 0.55–0.6 ms document backward read 0.05–0.1 ms slower, and varied
    // from one process to the next by ±8 % where the peers' timings held to ±0.5 %
    // (H200, 2026-11-25).
    let mut times = Vec::new();
    for _ in 0..if n >= 16384 { 5 } else { 10 } {
        st.memset_zeros(&mut bb.flush)
            .map_err(drv("evicting the L2 cache"))?;
        start.record(st).map_err(drv("recording"))?;
        rt.backward_mapped(spec, &opts, &input, &args, &mut grads, map.as_ref())?;
        end.record(st).map_err(drv("recording"))?;
        end.synchronize().map_err(drv("waiting"))?;
        times.push(start.elapsed_ms(&end).map_err(drv("reading"))?);
    }
    times.sort_by(f32::total_cmp);
    Ok(times[times.len() / 2])
}

/// Whether the timing row `key` (`causal-d128/16384`, `det-dense/4096`, `document_causal/4096`)
/// is to run: every row unless `FLASH_BWD_ROWS` lists comma-separated parts, one of which the key
/// contains (so a profile or an A/B can launch only the workloads it studies).
fn wanted_row(key: &str) -> bool {
    match std::env::var("FLASH_BWD_ROWS") {
        Ok(list) if !list.is_empty() => list.split(',').any(|p| key.contains(p)),
        _ => true,
    }
}

pub fn timing_backward(
    rt: &Runtime,
    specs: &[VariantSpec],
    rows: &mut Vec<Value>,
) -> Result<(), FlashError> {
    let get = |name: &str| example(specs, name);
    // The examples' `Dense` or `Causal` at head dim `d`, bf16, and its backward FLOPs (2.5x the
    // forward's).
    let dense = |causal: bool, d: usize| -> Result<VariantSpec, FlashError> {
        Ok(with(
            &get(if causal { "Causal" } else { "Dense" })?,
            d as u32,
            DType::Bf16,
        ))
    };
    let flops = |(b, n, h): (usize, usize, usize), d: usize, causal: bool| {
        2.5 * 4.0 * (b * h * n * n * d) as f64 / if causal { 2.0 } else { 1.0 }
    };
    let gpu = rt.info().name.clone();
    let mut bb = bufs(rt, 16384 * 2048, 16384 * 32)?;
    for d in [64usize, 128] {
        let h = 2048 / d;
        for n in [4096usize, 16384] {
            let b = 16384 / n;
            for causal in [false, true] {
                let label = if causal { "causal" } else { "dense" };
                if !wanted_row(&format!("{label}-d{d}/{n}")) {
                    continue;
                }
                let spec = dense(causal, d)?;
                let none = ParamValues::none();
                let ms = time_one(rt, &mut bb, &spec, &none, (b, n, h), false, None, false)?;
                let fl = flops((b, n, h), d, causal);
                let tf = fl / ms as f64 / 1e9;
                println!("bwd d={d:3} n={n:6} b={b:3} h={h:3} causal={} bf16 flash {ms:9.3} ms {tf:7.1} TFLOP/s", causal as u8);
                // The other backward configurations the tuner would try (not in the JSON rows).
                let family = rt.info().default_family;
                let default = default_backward_config_for(&spec, family);
                for cfg in backward_candidates(&spec, family) {
                    if cfg == default {
                        continue;
                    }
                    let ms = time_one(
                        rt,
                        &mut bb,
                        &spec,
                        &none,
                        (b, n, h),
                        false,
                        Some(cfg),
                        false,
                    )?;
                    let tf = fl / ms as f64 / 1e9;
                    println!(
                        "bwd d={d:3} n={n:6} b={b:3} h={h:3} causal={} bf16 flash {}x{}x{} {:?} {ms:9.3} ms {tf:7.1} TFLOP/s",
                        causal as u8, cfg.block_m, cfg.block_n, cfg.warps, cfg.family
                    );
                }
                rows.push(json!({"gpu": gpu, "backend": "flash", "variant": if causal {"causal"} else {"dense"},
                    "dtype": "bf16", "d": d, "n": n, "b": b, "h": h, "causal": causal, "mode": "bwd",
                    "ms": ms, "tflops": tf}));
            }
        }
    }
    // The deterministic mode's cost, dense and causal at d=128.
    for causal in [false, true] {
        let (d, n) = (128usize, 4096usize);
        let (b, h) = (16384 / n, 2048 / d);
        if !wanted_row(&format!(
            "det-{}/{n}",
            if causal { "causal" } else { "dense" }
        )) {
            continue;
        }
        let spec = dense(causal, d)?;
        let ms = time_one(
            rt,
            &mut bb,
            &spec,
            &ParamValues::none(),
            (b, n, h),
            true,
            None,
            false,
        )?;
        let fl = flops((b, n, h), d, causal);
        let tf = fl / ms as f64 / 1e9;
        println!("bwd d={d:3} n={n:6} b={b:3} h={h:3} causal={} bf16 flash deterministic {ms:9.3} ms {tf:7.1} TFLOP/s", causal as u8);
        rows.push(json!({"gpu": gpu, "backend": "flash", "variant": if causal {"causal"} else {"dense"},
            "dtype": "bf16", "d": d, "n": n, "b": b, "h": h, "causal": causal, "mode": "bwd_deterministic",
            "ms": ms, "tflops": tf}));
    }
    let (d, h) = (128usize, 16usize);
    for n in [4096usize, 16384] {
        let b = 16384 / n;
        let (docs, cases) = variant_workloads(n, h);
        for (label, name, pv) in cases {
            if !wanted_row(&format!("{label}/{n}")) {
                continue;
            }
            let spec = with(&get(name)?, 128, DType::Bf16);
            let dens = density(label, n, &docs);
            // As the peers run it (their score params carry no gradient: frozen here), then,
            // where the score has `f32` params, with their gradients too.
            let with_grads = !flash_dsl::plan::grad_params(&spec).is_empty();
            for dparams in [false, true] {
                if dparams && !with_grads {
                    continue;
                }
                let ms = time_one(rt, &mut bb, &spec, &pv, (b, n, h), false, None, dparams)?;
                let tf = 2.5 * 4.0 * (b * h * n * n * d) as f64 * dens / ms as f64 / 1e9;
                let tag = if dparams { "+dparams" } else { "" };
                println!("bwd d={d:3} n={n:6} b={b:3} h={h:3} {:18} density={dens:.3} flash {ms:9.3} ms {tf:7.1} TFLOP/s (useful)", format!("{label}{tag}"));
                let mode = if dparams { "bwd_dparams" } else { "bwd" };
                rows.push(json!({"gpu": gpu, "backend": "flash", "variant": label, "dtype": "bf16",
                    "d": d, "n": n, "b": b, "h": h, "causal": true, "mode": mode, "ms": ms, "tflops": tf,
                    "density": dens}));
            }
        }
    }
    Ok(())
}
