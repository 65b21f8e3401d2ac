//! Decode timing: `bench/peers.py --decode`'s workloads (one query token per sequence, GQA 32
//! query heads on 8 KV heads, d 128, bf16, K and V stored `[batch, heads_kv, seq, d]` as the
//! peers store them), through the split-KV pass with the runtime's split count, the L2 cache
//! flushed before every timed run as the peers' `do_bench` does. GB/s counts the bytes of Q, K, V
//! read and O written, as peers.py does. Also a sweep of split-KV tiles at each shape, printed
//! (not rows), for choosing the default.

use flash_dsl::plan::splitkv::default_splitkv_config;
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::{DType, TileConfig, VariantSpec};
use flash_runtime::{FlashError, LseMut, PagedKv, Runtime, TensorMut, TensorRef};
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
        // The same shape from a paged cache: pages of 64 keys in a shuffled order (the K/V
        // buffers reinterpreted as pages; their contents do not matter here).
        let ps = 64usize;
        let pages = b * nk / ps;
        let mut order: Vec<i32> = (0..pages as i32).collect();
        let mut prng = Rng(nk as u64);
        for i in (1..pages).rev() {
            order.swap(i, prng.below(i as u64 + 1) as usize);
        }
        let max_pages = nk / ps;
        let lens = vec![nk as i32; b];
        let dt = st.clone_htod(&order).map_err(drv)?;
        let dl = st.clone_htod(&lens).map_err(drv)?;
        let kernel = rt.load_paged(&spec, None)?;
        // Two page layouts: head-major inside a page ([pages, hkv, 64, d], as the contiguous rows
        // above store K and V) and token-major ([pages, 64, hkv, d], vLLM's), through strides.
        let hnd = [(hkv * ps * d) as i64, d as i64, (ps * d) as i64, 1];
        let nhd = [(ps * hkv * d) as i64, (hkv * d) as i64, d as i64, 1];
        for (label, strides) in [("paged64", hnd), ("paged64_nhd", nhd)] {
            let kv = PagedKv {
                k: TensorRef::strided(&kbuf, [pages, ps, hkv, d], strides, st),
                v: TensorRef::strided(&vbuf, [pages, ps, hkv, d], strides, st),
                page_table: &dt,
                max_pages,
                seqlens_k: &dl,
                host: Some((&order, &lens)),
            };
            let tq = TensorRef::new(&qbuf, q_shape, st);
            let mut to = TensorMut::new(&mut obuf, q_shape, st);
            let mut tl = LseMut::new(&mut lbuf, st);
            let (ms, splits) = rt.time_paged(
                &kernel,
                &tq,
                &kv,
                &mut to,
                &mut tl,
                &[],
                None,
                (3, 20, true),
            )?;
            let gbps = nbytes as f64 / ms as f64 / 1e6;
            let tf = 4.0 * (b * hq * nk * d) as f64 / ms as f64 / 1e9;
            println!(
                "decode d={d} nk={nk:6} b={b:3} hq={hq} hkv={hkv} flash {label:<11} splits={splits:3} {ms:9.4} ms {gbps:7.0} GB/s"
            );
            rows.push(json!({"gpu": gpu, "backend": "flash", "variant": format!("decode_gqa4_{label}"), "dtype": "bf16",
                "d": d, "n": nk, "nq": 1, "b": b, "h": hq, "hkv": hkv, "causal": false, "mode": "fwd",
                "ms": ms, "tflops": tf, "gbps": gbps, "splits": splits, "page_size": ps}));
        }
    }
    Ok(())
}

/// A paged copy of per-sequence K/V rows (`[len_b, heads_kv, d]` each): pages of `ps` keys in a
/// shuffled pool with spare pages, partial last pages; returns the caches, the page table
/// (`max_pages` entries per sequence, unused ones −1) and the pool size.
pub(crate) fn page_out(
    rows: &[Vec<u16>],
    row_elems: usize,
    ps: usize,
    max_pages: usize,
    rng: &mut Rng,
) -> (Vec<u16>, Vec<i32>, usize) {
    let need: usize = rows
        .iter()
        .map(|r| (r.len() / row_elems).div_ceil(ps))
        .sum();
    let pages = need + 3;
    let mut order: Vec<usize> = (0..pages).collect();
    for i in (1..pages).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut cache = vec![0u16; pages * ps * row_elems];
    let mut table = vec![-1i32; rows.len() * max_pages];
    let mut next = 0;
    for (b, r) in rows.iter().enumerate() {
        let len = r.len() / row_elems;
        for j in 0..len.div_ceil(ps) {
            let page = order[next];
            next += 1;
            table[b * max_pages + j] = page as i32;
            let n = ps.min(len - j * ps);
            let src = &r[j * ps * row_elems..][..n * row_elems];
            cache[page * ps * row_elems..][..n * row_elems].copy_from_slice(src);
        }
    }
    (cache, table, pages)
}

/// Paged KV correctness: every example variant with a split-KV kernel, head dims 64 and 128,
/// one and four query tokens at GQA 4, sequences of different cached lengths (empty, one key,
/// partial last pages, 4097 keys) in shuffled pages of 16, 24 and 64 keys (24: the row-by-row page lookup), with the runtime's
/// split count and with 3 forced splits; each sequence judged against the float64 reference of
/// its own keys by FlashAttention's rule (`judge`). Returns (lines, failures).
pub fn check_paged(rt: &Runtime, specs: &[VariantSpec]) -> (usize, usize) {
    use crate::cases::CaseResult;
    use crate::device::{draw, serving_params};
    use flash_dsl::eval::Sizes;
    use flash_dsl::model::reference::Problem;
    use flash_dsl::plan::splitkv::splitkv_unsupported;
    let (mut n, mut fails) = (0, 0);
    let lens = [0usize, 1, 77, 1000, 4097];
    let (hq, hkv) = (8usize, 2usize);
    let mut seed = 77u64;
    for spec in specs.iter().filter(|s| splitkv_unsupported(s).is_none()) {
        for d in [64u32, 128] {
            let spec = with(spec, d, spec.dtype);
            let (dq, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
            for (sq, ps, splits) in [
                (1usize, 16usize, None),
                (4, 64, Some(3)),
                (1, 24, Some(3)),
                (4, 16, None),
            ] {
                seed += 1;
                let mut rng = Rng(seed);
                let b = lens.len();
                let cap = PagedCache::max_pages(&lens, ps) * ps;
                // Params for the launch: `seq` positions sized by the capacity.
                let params = serving_params(
                    &spec,
                    Sizes {
                        batch: b,
                        heads: hq,
                        seq_q: sq,
                        seq_k: cap,
                    },
                    &mut rng,
                );
                let (qb, qv) = draw(&mut rng, b * sq * hq * dq, spec.dtype);
                let cache = PagedCache::random(&mut rng, &spec, &lens, hkv, ps);
                let label = format!(
                    "{:<13} {:<4} d{d:<3} paged{ps:<2} q{sq} h{hq}/{hkv} lens {lens:?}",
                    spec.name,
                    spec.dtype.name()
                );
                let run = || cache.run(rt, &spec, &qb, [b, sq, hq, dq], None, &params, splits);
                match run() {
                    Err(e) => {
                        n += 1;
                        fails += 1;
                        println!("FAIL {label} error: {e}");
                    }
                    Ok((o, l, used)) => {
                        for (bi, &len) in lens.iter().enumerate() {
                            // The reference of sequence bi alone: its queries, its keys, and the
                            // params sliced to its own `seq` extent.
                            let launch = Sizes {
                                batch: b,
                                heads: hq,
                                seq_q: sq,
                                seq_k: cap,
                            };
                            let pv =
                                crate::device::seq_params(&spec, &params, sq.max(len), bi, launch);
                            let problem = Problem {
                                batch: 1,
                                heads_q: hq,
                                heads_kv: hkv,
                                seq_q: sq,
                                seq_k: len,
                                q: qv[bi * sq * hq * dq..][..sq * hq * dq].to_vec(),
                                k: cache.k_rows[bi].1.clone(),
                                v: cache.v_rows[bi].1.clone(),
                                params: pv,
                                rng: crate::device::CHECK_RNG,
                            };
                            let ob: Vec<f64> = o[bi * sq * hq * dv..][..sq * hq * dv]
                                .iter()
                                .map(|&x| spec.dtype.from_bits(x))
                                .collect();
                            let lb: Vec<f64> = l[bi * hq * sq..][..hq * sq]
                                .iter()
                                .map(|&x| x as f64)
                                .collect();
                            let case = CaseResult {
                                name: format!("{label} seq {bi} ({len} keys) splits {used}"),
                                problem,
                                spec: spec.clone(),
                                runs: vec![("paged".into(), Ok((ob, lb, 0)))],
                            };
                            for (ok, line) in crate::judge::judge(&case) {
                                n += 1;
                                if !ok {
                                    fails += 1;
                                }
                                println!("{line}");
                            }
                        }
                    }
                }
            }
        }
    }
    (n, fails)
}

/// A paged KV cache of the checks, on the host: each sequence's K and V rows (`[len, heads_kv,
/// d]`, device bits and values), paged out into shuffled pages (shared by K and V) with spare
/// pages and partial last pages.
pub(crate) struct PagedCache {
    /// Each sequence's K rows: bits and values.
    pub k_rows: Vec<(Vec<u16>, Vec<f64>)>,
    /// Each sequence's V rows.
    pub v_rows: Vec<(Vec<u16>, Vec<f64>)>,
    kc: Vec<u16>,
    vc: Vec<u16>,
    table: Vec<i32>,
    pages: usize,
    page_size: usize,
    max_pages: usize,
    lens: Vec<i32>,
    heads_kv: usize,
}

impl PagedCache {
    /// Entries per sequence of the page table for cached lengths `lens`: one spare.
    pub fn max_pages(lens: &[usize], ps: usize) -> usize {
        lens.iter().copied().max().unwrap_or(0).div_ceil(ps) + 1
    }

    /// Random K and V of `lens` keys per sequence, paged in pages of `ps` keys.
    pub fn random(
        rng: &mut Rng,
        spec: &VariantSpec,
        lens: &[usize],
        heads_kv: usize,
        ps: usize,
    ) -> PagedCache {
        use crate::device::draw;
        let (dq, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
        let max_pages = Self::max_pages(lens, ps);
        let mut k_rows = Vec::new();
        let mut v_rows = Vec::new();
        for &len in lens {
            k_rows.push(draw(rng, len * heads_kv * dq, spec.dtype));
            v_rows.push(draw(rng, len * heads_kv * dv, spec.dtype));
        }
        let kbits: Vec<Vec<u16>> = k_rows.iter().map(|x| x.0.clone()).collect();
        let vbits: Vec<Vec<u16>> = v_rows.iter().map(|x| x.0.clone()).collect();
        // K and V share the page table: the same shuffle for both.
        let shuffle = rng.below(1 << 40);
        let (kc, table, pages) = page_out(&kbits, heads_kv * dq, ps, max_pages, &mut Rng(shuffle));
        let (vc, table_v, _) = page_out(&vbits, heads_kv * dv, ps, max_pages, &mut Rng(shuffle));
        assert_eq!(table, table_v);
        PagedCache {
            k_rows,
            v_rows,
            kc,
            vc,
            table,
            pages,
            page_size: ps,
            max_pages,
            lens: lens.iter().map(|&l| l as i32).collect(),
            heads_kv,
        }
    }

    /// Runs the paged split-KV kernel on this cache with Q `q_shape` (`[batch, seq_q, heads_q,
    /// d]`, or with `cu_q` packed `[1, total_q, heads_q, d]`), O and the LSE poisoned with NaN
    /// first; returns them as written and the split count used.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        rt: &Runtime,
        spec: &VariantSpec,
        q_bits: &[u16],
        q_shape: [usize; 4],
        cu_q: Option<&[i32]>,
        params: &flash_dsl::eval::ParamValues,
        splits: Option<usize>,
    ) -> Result<(Vec<u16>, Vec<f32>, usize), FlashError> {
        use crate::device::{nan_bits, param_args, upload_params};
        let (dq, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
        let (ps, hkv) = (self.page_size, self.heads_kv);
        let [b, sq, hq, _] = q_shape;
        let st = rt.stream();
        let drv = |e| FlashError::Driver(format!("paged buffers: {e:?}"));
        let dq_ = st.clone_htod(q_bits).map_err(drv)?;
        let dk = st.clone_htod(&self.kc).map_err(drv)?;
        let dvv = st.clone_htod(&self.vc).map_err(drv)?;
        let dt = st.clone_htod(&self.table).map_err(drv)?;
        let dl = st.clone_htod(&self.lens).map_err(drv)?;
        let mut o = st
            .clone_htod(&vec![nan_bits(spec.dtype); (b * sq * hq * dv).max(1)])
            .map_err(drv)?;
        let mut l = st
            .clone_htod(&vec![f32::NAN; (b * hq * sq).max(1)])
            .map_err(drv)?;
        let dp = upload_params(rt, params)?;
        let args = param_args(rt, spec, params, &dp);
        let kv = PagedKv {
            k: TensorRef::new(&dk, [self.pages, ps, hkv, dq], st),
            v: TensorRef::new(&dvv, [self.pages, ps, hkv, dv], st),
            page_table: &dt,
            max_pages: self.max_pages,
            seqlens_k: &dl,
            host: Some((&self.table, &self.lens)),
        };
        let q = TensorRef::new(&dq_, q_shape, st);
        let used = {
            let mut to = TensorMut::new(&mut o, [b, sq, hq, dv], st);
            let mut tl = LseMut::new(&mut l, st);
            match cu_q {
                None => {
                    let kernel = rt.load_paged(spec, None)?;
                    rt.forward_paged(&kernel, &q, &kv, &mut to, &mut tl, &args, splits)?
                }
                Some(cu) => {
                    let kernel = rt.load_paged_varlen(spec, None)?;
                    let dcu = st.clone_htod(cu).map_err(drv)?;
                    let queries = flash_runtime::PackedQueries {
                        cu_seqlens_q: &dcu,
                        host: cu,
                    };
                    rt.forward_paged_varlen(
                        &kernel, &q, &queries, &kv, &mut to, &mut tl, &args, splits,
                    )?
                }
            }
        };
        rt.synchronize()?;
        Ok((
            st.clone_dtoh(&o).map_err(drv)?,
            st.clone_dtoh(&l).map_err(drv)?,
            used,
        ))
    }
}
