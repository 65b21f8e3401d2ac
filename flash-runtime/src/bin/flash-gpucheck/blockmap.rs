//! Block maps (`--maps`): the maps the GPU builds, compared word for word with the brute-force
//! host classification (`flash_dsl::plan::host_block_map`) on random document layouts —
//! documents shorter than a tile, empty documents (skipped ids), one document, unsorted ids — for
//! masks per batch, per head and shared, at the tile sizes of every family's forward and backward
//! kernels; then (with timing) the build time and memory at n = 4k, 16k and 128k, the rows
//! FlexAttention's `create_block_mask` is compared with.

use flash_dsl::eval::{tensor_shape, ParamValue, ParamValues, Sizes};
use flash_dsl::plan::{
    default_backward_config_for, default_config_for, host_block_map, BlockMapPlan, KernelFamily,
};
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::spec::ParamKind;
use flash_dsl::{DType, VariantSpec};
use flash_runtime::cudarc::driver::sys;
use flash_runtime::{FlashError, ProblemShape, Runtime};
use serde_json::{json, Value};

use crate::device::{param_args, upload_params};
use crate::timing::variant_workloads;
use crate::variants::with;

/// Masks over document ids kept per batch and per head (the shared one is the examples'
/// `Document`).
const MAP_VARIANTS: &str = r#"
/// Documents per batch row, no causality: a map per batch.
pub DocPerBatch {
    head_dim: 64,
    dtype: bf16,
    params: { doc: [i32; batch, seq] },
    mask: doc[b, q] == doc[b, k],
}
/// Causal documents per head, with a window: a map per head.
pub DocPerHead {
    head_dim: 64,
    dtype: bf16,
    params: { doc: [i32; heads, seq] },
    mask: causal && doc[h, q] == doc[h, k] && q - k < 700,
}
/// A block-sparse layout per batch row ANDed with a causal mask.
pub SparseCausal {
    head_dim: 64,
    dtype: bf16,
    params: { blocks: [i32; batch, seq / 256, 5] },
    mask: causal,
    sparsity: blocks,
}
"#;

/// Document ids of one row of `n` positions in the style `layout`.
fn doc_row(layout: &str, n: usize, rng: &mut Rng) -> Vec<i64> {
    match layout {
        // peers.py's: 8 ids drawn per position, sorted (some ids may not occur: empty documents)
        "random8" => {
            let mut v: Vec<i64> = (0..n).map(|_| rng.below(8) as i64).collect();
            v.sort();
            v
        }
        // documents of 1 to 40 positions (shorter than any tile), ids skipping by 1 or 2
        "tiny" => {
            let (mut v, mut id) = (Vec::with_capacity(n), 0i64);
            while v.len() < n {
                let len = 1 + rng.below(40) as usize;
                v.extend(std::iter::repeat_n(id, len.min(n - v.len())));
                id += 1 + rng.below(2) as i64;
            }
            v
        }
        "one" => vec![3; n],
        // ids not sorted: documents interleave, which interval bounds cannot decide
        _ => (0..n).map(|_| rng.below(3) as i64).collect(),
    }
}

/// The doc tensor of `spec` at `sizes`: one row per leading index (a sparsity layout for a
/// variant that declares one: BigBird-style, holes in the "tiny" and "unsorted" styles).
fn doc_params(spec: &VariantSpec, sizes: Sizes, layout: &str, rng: &mut Rng) -> ParamValues {
    if let Some(sp) = spec.sparsity {
        let mut v = flash_dsl::sparsity::bigbird_layout(&sp, sizes, (3, 2, 3), rng);
        if matches!(layout, "tiny" | "unsorted") {
            for x in v.iter_mut() {
                if rng.below(3) == 0 {
                    *x = -1;
                }
            }
        }
        return ParamValues::new(vec![ParamValue::IntTensor(v)]);
    }
    let ParamKind::Tensor { dims, .. } = &spec.params[0].kind else {
        unreachable!("the map variants take one tensor")
    };
    let shape = tensor_shape(dims, sizes);
    let (rows, n) = (
        shape[..shape.len() - 1].iter().product::<usize>(),
        shape[shape.len() - 1],
    );
    let v: Vec<i64> = (0..rows).flat_map(|_| doc_row(layout, n, rng)).collect();
    ParamValues::new(vec![ParamValue::IntTensor(v)])
}

/// The maps the kernels of `spec` walk: each family's forward map and backward map.
fn map_plans(spec: &VariantSpec) -> Vec<BlockMapPlan> {
    let mut out: Vec<BlockMapPlan> = Vec::new();
    for f in [KernelFamily::Sm80, KernelFamily::Sm90, KernelFamily::Sm90Ws] {
        let c = default_config_for(spec, f);
        let mut add = |m: Option<BlockMapPlan>| {
            if let Some(m) = m.filter(|m| !out.contains(m)) {
                out.push(m);
            }
        };
        add(BlockMapPlan::for_spec(spec, c.block_m, c.block_n, false));
        if f != KernelFamily::Sm90Ws {
            let b = default_backward_config_for(spec, f);
            add(BlockMapPlan::for_spec(spec, b.block_m, b.block_n, true));
        }
    }
    out
}

fn shape(batch: usize, heads_q: usize, seq_q: usize, seq_k: usize) -> ProblemShape {
    ProblemShape {
        batch,
        seq_q,
        seq_k,
        heads_q,
        heads_kv: heads_q,
    }
}

/// GPU maps against the host's; returns (checks, failures).
pub fn check_maps(rt: &Runtime, document: &VariantSpec, bigbird: &VariantSpec) -> (usize, usize) {
    let mut specs = vec![
        with(document, 64, DType::Bf16),
        with(bigbird, 64, DType::Bf16),
    ];
    specs.extend(flash_dsl::parse::parse_str(MAP_VARIANTS).expect("the map variants parse"));
    let shapes = [
        shape(1, 1, 1, 1),
        shape(2, 3, 17, 17),
        shape(1, 2, 113, 300),
        shape(2, 1, 300, 113),
        shape(1, 1, 1023, 1025),
        shape(2, 2, 640, 640),
    ];
    let (mut n, mut fails) = (0, 0);
    let mut rng = Rng(4242);
    for spec in &specs {
        let plans = map_plans(spec);
        for layout in ["random8", "tiny", "one", "unsorted"] {
            let mut cases: Vec<ProblemShape> = shapes.to_vec();
            if spec.name == "Document" && layout == "random8" {
                cases.push(shape(1, 1, 4096, 4096));
            }
            for sh in cases {
                let sizes = Sizes {
                    batch: sh.batch,
                    heads: sh.heads_q,
                    seq_q: sh.seq_q,
                    seq_k: sh.seq_k,
                };
                let pv = doc_params(spec, sizes, layout, &mut rng);
                for m in &plans {
                    n += 1;
                    let line = format!(
                        "{} {layout} b={} h={} sq={} sk={} {} {}x{}",
                        spec.name,
                        sh.batch,
                        sh.heads_q,
                        sh.seq_q,
                        sh.seq_k,
                        if m.along_keys { "keys" } else { "queries" },
                        m.tile_q,
                        m.tile_k
                    );
                    let got = (|| -> Result<Vec<i32>, FlashError> {
                        let dp = upload_params(rt, &pv)?;
                        let args = param_args(rt, spec, &pv, &dp);
                        let map = rt.build_block_map(spec, *m, sh, &args)?;
                        rt.stream()
                            .clone_dtoh(map.words())
                            .map_err(|e| FlashError::Driver(format!("reading the map: {e:?}")))
                    })();
                    let want =
                        host_block_map(spec, m, &pv, sh.batch, sh.heads_q, sh.seq_q, sh.seq_k);
                    match got {
                        Ok(g) if g[..want.len()] == want[..] => {
                            let listed: usize = count_entries(&want, m, sh);
                            println!(
                                "ok   map {line}: {} words, {listed} tiles listed",
                                want.len()
                            );
                        }
                        Ok(g) => {
                            fails += 1;
                            let first = g.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                            println!(
                                "FAIL map {line}: word {first} is {} on the GPU, {} on the host",
                                g[first], want[first]
                            );
                        }
                        Err(e) => {
                            fails += 1;
                            println!("FAIL map {line}: {e}");
                        }
                    }
                }
            }
        }
    }
    // A layout entry out of range is an error naming its place and value, not a silent skip.
    let spec = with(bigbird, 64, DType::Bf16);
    let sp = spec.sparsity.expect("BigBird declares a layout");
    let sh = shape(1, 3, 1000, 700);
    let sizes = Sizes {
        batch: 1,
        heads: 3,
        seq_q: 1000,
        seq_k: 700,
    };
    for (at, bad) in [(8 * 5 + 2, 6i64), (8 * 8 * 2 + 1, -2)] {
        n += 1;
        let mut v = flash_dsl::sparsity::bigbird_layout(&sp, sizes, (3, 2, 3), &mut rng);
        v[at] = bad;
        let pv = ParamValues::new(vec![ParamValue::IntTensor(v)]);
        let res = (|| {
            let dp = upload_params(rt, &pv)?;
            let args = param_args(rt, &spec, &pv, &dp);
            let m = BlockMapPlan::for_spec(&spec, 128, 128, false).expect("a layout map");
            rt.build_block_map(&spec, m, sh, &args).map(|_| ())
        })();
        match res {
            Err(e) if e.to_string().contains(&format!("is {bad}")) => {
                println!("ok   layout check: {e}");
            }
            other => {
                fails += 1;
                println!("FAIL layout check: entry {at} = {bad} gave {other:?}");
            }
        }
    }
    (n, fails)
}

fn count_entries(words: &[i32], m: &BlockMapPlan, sh: ProblemShape) -> usize {
    let width = m.cols(sh.seq_q, sh.seq_k) + 1;
    words.chunks(width).map(|r| r[0] as usize).sum()
}

/// Build time (CUDA events around `build_block_map`: allocation, zeroing and the build kernel)
/// and memory of the Document maps on peers.py's document layout (8 sorted random ids).
pub fn timing_maps(
    rt: &Runtime,
    document: &VariantSpec,
    rows: &mut Vec<Value>,
) -> Result<(), FlashError> {
    let spec = with(document, 128, DType::Bf16);
    let gpu = rt.info().name.clone();
    let fwd = rt
        .load(&spec, None)?
        .plan
        .block_map
        .expect("Document reads a map");
    let b_cfg = default_backward_config_for(&spec, rt.info().default_family);
    let bwd = BlockMapPlan::for_spec(&spec, b_cfg.block_m, b_cfg.block_n, true)
        .expect("Document reads a map");
    let st = rt.stream();
    let drv = |e| FlashError::Driver(format!("timing the map build: {e:?}"));
    for n in [4096usize, 16384, 131072] {
        let docs = if n <= 16384 {
            variant_workloads(n, 16).0
        } else {
            doc_row("random8", n, &mut Rng(n as u64))
        };
        let pv = ParamValues::new(vec![ParamValue::IntTensor(docs)]);
        let dp = upload_params(rt, &pv)?;
        let args = param_args(rt, &spec, &pv, &dp);
        let sh = shape(1, 16, n, n);
        for (mode, m) in [("block_map_build", fwd), ("block_map_build_bwd", bwd)] {
            let ev = || {
                rt.context()
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(drv)
            };
            let (start, end) = (ev()?, ev()?);
            let mut times = Vec::new();
            let mut bytes = 0;
            for i in 0..23 {
                start.record(st).map_err(drv)?;
                let map = rt.build_block_map(&spec, m, sh, &args)?;
                end.record(st).map_err(drv)?;
                end.synchronize().map_err(drv)?;
                bytes = map.bytes();
                if i >= 3 {
                    times.push(start.elapsed_ms(&end).map_err(drv)?);
                }
            }
            times.sort_by(f32::total_cmp);
            let ms = times[times.len() / 2];
            println!(
                "build    n={n:6} document_causal {mode:20} tiles {}x{} flash {ms:9.3} ms {:8.2} MiB",
                m.tile_q,
                m.tile_k,
                bytes as f64 / (1 << 20) as f64
            );
            rows.push(json!({"gpu": gpu, "backend": "flash", "variant": "document_causal", "dtype": "bf16",
                "d": 0, "n": n, "nq": n, "b": 1, "h": 1, "hkv": 1, "causal": true, "mode": mode, "ms": ms,
                "tflops": null, "bytes": bytes, "tile_q": m.tile_q, "tile_k": m.tile_k}));
        }
    }
    Ok(())
}
