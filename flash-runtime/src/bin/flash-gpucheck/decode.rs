//! Decode timing: `bench/peers.py --decode`'s workloads (one query token per sequence, GQA 32
//! query heads on 8 KV heads, d 128, bf16, K and V stored `[batch, heads_kv, seq, d]` as the
//! peers store them), through the split-KV pass with the runtime's split count, the L2 cache
//! flushed before every timed run as the peers' `do_bench` does. GB/s counts the bytes of Q, K, V
//! read and O written, as peers.py does. Also a sweep of split-KV tiles at each shape, printed
//! (not rows), for choosing the default.

use flash_dsl::plan::splitkv::default_splitkv_config;
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::{DType, TileConfig, VariantSpec};
use flash_runtime::{FlashError, LseMut, Runtime, TensorMut, TensorRef};
use serde_json::{json, Value};

use crate::variants::{example, with};

/// peers.py's decode shapes: (batch, keys).
pub const DECODE_SHAPES: [(usize, usize); 5] =
    [(1, 8192), (1, 131072), (8, 32768), (64, 4096), (64, 16384)];

pub fn timing_decode(
    rt: &Runtime,
    specs: &[VariantSpec],
    rows: &mut Vec<Value>,
    sweep: bool,
) -> Result<(), FlashError> {
    let (d, hq, hkv) = (128usize, 32usize, 8usize);
    let spec = with(&example(specs, "Dense")?, d as u32, DType::Bf16);
    let gpu = rt.info().name.clone();
    let st = rt.stream();
    let drv = |e| FlashError::Driver(format!("decode buffers: {e:?}"));
    let max_kv = DECODE_SHAPES.iter().map(|(b, n)| b * n).max().unwrap_or(0) * hkv * d;
    let mut rng = Rng(11);
    let mut gen =
        |n: usize| -> Vec<u16> { (0..n).map(|_| DType::Bf16.to_bits(rng.normal())).collect() };
    let kbuf = st.clone_htod(&gen(max_kv)).map_err(drv)?;
    let vbuf = st.clone_htod(&gen(max_kv)).map_err(drv)?;
    let max_q = 64 * hq * d;
    let qbuf = st.clone_htod(&gen(max_q)).map_err(drv)?;
    let mut obuf = st.alloc_zeros::<u16>(max_q).map_err(drv)?;
    let mut lbuf = st.alloc_zeros::<f32>(64 * hq).map_err(drv)?;
    let mut configs = vec![default_splitkv_config(&spec)];
    if sweep {
        for (bm, bn, w, s) in [
            (16, 32, 4, 2),
            (16, 16, 4, 3),
            (16, 32, 2, 3),
            (16, 16, 8, 2),
            (16, 16, 4, 4),
            (16, 64, 2, 2),
            (16, 32, 8, 1),
        ] {
            configs.push(TileConfig {
                block_m: bm,
                block_n: bn,
                warps: w,
                stages: s,
                ..configs[0]
            });
        }
    }
    for (b, nk) in DECODE_SHAPES {
        // K, V as [b, hkv, nk, d] in memory, viewed as [b, nk, hkv, d].
        let kv_shape = [b, nk, hkv, d];
        let kv_strides = [(hkv * nk * d) as i64, d as i64, (nk * d) as i64, 1];
        let q_shape = [b, 1, hq, d];
        let nbytes = 2 * (2 * b * hq * d + 2 * b * hkv * nk * d);
        for (i, cfg) in configs.iter().enumerate() {
            let kernel = match rt.load_split_kv(&spec, Some(*cfg)) {
                Ok(k) => k,
                Err(e) => {
                    println!("# decode {cfg:?}: {e}");
                    continue;
                }
            };
            let tq = TensorRef::new(&qbuf, q_shape, st);
            let tk = TensorRef::strided(&kbuf, kv_shape, kv_strides, st);
            let tv = TensorRef::strided(&vbuf, kv_shape, kv_strides, st);
            let mut to = TensorMut::new(&mut obuf, q_shape, st);
            let mut tl = LseMut::new(&mut lbuf, st);
            let (ms, splits) = rt.time_split_kv(
                &kernel,
                &tq,
                &tk,
                &tv,
                &mut to,
                &mut tl,
                &[],
                None,
                (3, 20, true),
            )?;
            let gbps = nbytes as f64 / ms as f64 / 1e6;
            let tf = 4.0 * (b * hq * nk * d) as f64 / ms as f64 / 1e9;
            let c = cfg;
            println!(
                "decode d={d} nk={nk:6} b={b:3} hq={hq} hkv={hkv} flash {}x{}x{}x{} splits={splits:3} {ms:9.4} ms {gbps:7.0} GB/s",
                c.block_m, c.block_n, c.warps, c.stages
            );
            if i == 0 && sweep {
                for forced in [splits * 2, splits * 4] {
                    let (ms, _) = rt.time_split_kv(
                        &kernel,
                        &tq,
                        &tk,
                        &tv,
                        &mut to,
                        &mut tl,
                        &[],
                        Some(forced),
                        (3, 20, true),
                    )?;
                    println!(
                        "decode d={d} nk={nk:6} b={b:3} hq={hq} hkv={hkv} flash {}x{}x{}x{} splits={forced:3} {ms:9.4} ms {:7.0} GB/s (forced)",
                        c.block_m, c.block_n, c.warps, c.stages, nbytes as f64 / ms as f64 / 1e6
                    );
                }
            }
            if i == 0 {
                rows.push(json!({"gpu": gpu, "backend": "flash", "variant": "decode_gqa4", "dtype": "bf16",
                    "d": d, "n": nk, "nq": 1, "b": b, "h": hq, "hkv": hkv, "causal": false, "mode": "fwd",
                    "ms": ms, "tflops": tf, "gbps": gbps, "splits": splits}));
            }
        }
    }
    Ok(())
}
