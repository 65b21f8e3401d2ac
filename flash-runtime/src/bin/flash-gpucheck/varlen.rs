//! Packed (variable-length) batches: correctness of the packed forward kernel on every family,
//! and the prefill timing of packed documents against the same tokens as a dense batch.

use std::sync::atomic::{AtomicUsize, Ordering};

use flash_dsl::eval::Sizes;
use flash_dsl::model::reference::Problem;
use flash_dsl::plan::varlen::varlen_unsupported;
use flash_dsl::plan::{default_config_for, KernelFamily};
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::{DType, VariantSpec};
use flash_runtime::{FlashError, LseMut, Runtime, TensorMut, TensorRef, VarlenBatch};
use serde_json::{json, Value};

use crate::cases::CaseResult;
use crate::device::{draw, nan_bits, param_args, seq_params, serving_params, upload_params};
use crate::variants::{example, with};

/// Prefix sums: `[0, l0, l0 + l1, …]`.
fn offsets(lens: &[usize]) -> Vec<i32> {
    let mut cu = vec![0i32];
    for &l in lens {
        cu.push(cu.last().copied().unwrap_or(0) + l as i32);
    }
    cu
}

/// One packed launch: (query lengths, key lengths, heads_q, heads_kv).
type PackedShape = (&'static [usize], &'static [usize], usize, usize);

/// The batches checked: equal query and key lengths with empty and one-token sequences and
/// lengths around the tiles (GQA 4); query and key lengths that differ both ways, a sequence
/// with keys and no queries and one with queries and no keys (MQA); and, for the dense and
/// causal variants, sequences of 4097 and 2048 tokens.
const SHAPES: [PackedShape; 2] = [
    (
        &[0, 1, 17, 128, 129, 255, 1000],
        &[0, 1, 17, 128, 129, 255, 1000],
        8,
        2,
    ),
    (&[1, 4, 300, 0, 77, 513], &[1000, 97, 300, 5, 0, 513], 4, 1),
];
const LONG: PackedShape = (&[4097, 3, 2048], &[4097, 3, 2048], 2, 2);

/// Every example variant with a packed kernel, head dims 64 and 128 in its declared dtype, every
/// family the device runs, over [`SHAPES`] (and [`LONG`] for `Dense` and `Causal`): each
/// sequence of each launch judged against the float64 reference of that sequence alone by
/// FlashAttention's rule (`judge`), O and the LSE poisoned with NaN before the launch and the
/// rows past the packed O's view checked untouched; `small` (for compute-sanitizer) leaves out
/// [`LONG`]. Returns (lines, failures).
pub fn check_varlen(
    rt: &Runtime,
    specs: &[VariantSpec],
    families: &[KernelFamily],
    small: bool,
) -> (usize, usize) {
    let mut cases: Vec<CaseResult> = Vec::new();
    let (mut n, mut fails) = (0usize, 0usize);
    let mut seed = 4242u64;
    for spec in specs.iter().filter(|s| varlen_unsupported(s).is_none()) {
        for d in [64u32, 128] {
            let spec = with(spec, d, spec.dtype);
            let mut shapes = SHAPES.to_vec();
            if !small && matches!(spec.name.as_str(), "Dense" | "Causal") {
                shapes.push(LONG);
            }
            for &fam in families {
                for &(lq, lk, hq, hkv) in &shapes {
                    seed += 1;
                    match run_packed(rt, &spec, fam, lq, lk, hq, hkv, seed) {
                        Ok((c, stray)) => {
                            if stray > 0 {
                                n += 1;
                                fails += 1;
                                println!(
                                    "FAIL {} {:?} packed lens {lq:?}: {stray} elements written past O's view",
                                    spec.name, fam
                                );
                            }
                            cases.extend(c);
                        }
                        Err(e) => {
                            n += 1;
                            fails += 1;
                            println!(
                                "FAIL {} d{d} {fam:?} packed lens {lq:?}/{lk:?} error: {e}",
                                spec.name
                            );
                        }
                    }
                }
            }
        }
    }
    // Judge in parallel, largest first.
    cases.sort_by_key(|c| {
        let p = &c.problem;
        std::cmp::Reverse(p.heads_q * p.seq_q * p.seq_k)
    });
    let next = AtomicUsize::new(0);
    let (total, failed) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let j = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = cases.get(j) else { break };
                for (ok, line) in crate::judge::judge(c) {
                    total.fetch_add(1, Ordering::Relaxed);
                    if !ok {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    println!("{line}");
                }
            });
        }
    });
    (n + total.into_inner(), fails + failed.into_inner())
}

/// Runs one packed launch and returns one case per sequence (its output cut out of the packed
/// O and LSE, its reference problem alone) and the count of elements written past O's view.
#[allow(clippy::too_many_arguments)]
fn run_packed(
    rt: &Runtime,
    spec: &VariantSpec,
    fam: KernelFamily,
    lq: &[usize],
    lk: &[usize],
    hq: usize,
    hkv: usize,
    seed: u64,
) -> Result<(Vec<CaseResult>, usize), FlashError> {
    let mut rng = Rng(seed);
    let (dq, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let (tq, tk) = (lq.iter().sum::<usize>(), lk.iter().sum::<usize>());
    let (mq, mk) = (
        lq.iter().copied().max().unwrap_or(0),
        lk.iter().copied().max().unwrap_or(0),
    );
    let b = lq.len();
    let params = serving_params(
        spec,
        Sizes {
            batch: b,
            heads: hq,
            seq_q: mq,
            seq_k: mk,
        },
        &mut rng,
    );
    let (qb, qv) = draw(&mut rng, tq * hq * dq, spec.dtype);
    let (kb, kv) = draw(&mut rng, tk * hkv * dq, spec.dtype);
    let (vb, vv) = draw(&mut rng, tk * hkv * dv, spec.dtype);
    let (cq, ck) = (offsets(lq), offsets(lk));
    let st = rt.stream();
    let drv = |e| FlashError::Driver(format!("packed buffers: {e:?}"));
    let dq_ = st.clone_htod(&qb).map_err(drv)?;
    let dk = st.clone_htod(&kb).map_err(drv)?;
    let dvv = st.clone_htod(&vb).map_err(drv)?;
    let dcq = st.clone_htod(&cq).map_err(drv)?;
    let dck = st.clone_htod(&ck).map_err(drv)?;
    // O with 3 spare rows past the view, poisoned like the rest.
    let pad = 3 * hq * dv;
    let mut o = st
        .clone_htod(&vec![nan_bits(spec.dtype); tq * hq * dv + pad])
        .map_err(drv)?;
    let mut l = st
        .clone_htod(&vec![f32::NAN; (hq * tq).max(1)])
        .map_err(drv)?;
    let dp = upload_params(rt, &params)?;
    let args = param_args(rt, spec, &params, &dp);
    let kernel = rt.load_varlen(spec, Some(default_config_for(spec, fam)))?;
    let seqs = VarlenBatch {
        cu_seqlens_q: &dcq,
        cu_seqlens_k: &dck,
        host_q: &cq,
        host_k: &ck,
    };
    {
        let q = TensorRef::new(&dq_, [1, tq, hq, dq], st);
        let k = TensorRef::new(&dk, [1, tk, hkv, dq], st);
        let v = TensorRef::new(&dvv, [1, tk, hkv, dv], st);
        let mut to = TensorMut::new(&mut o, [1, tq, hq, dv], st);
        let mut tl = LseMut::new(&mut l, st);
        rt.forward_varlen(&kernel, &q, &k, &v, &mut to, &mut tl, &seqs, &args)?;
    }
    rt.synchronize()?;
    let o = st.clone_dtoh(&o).map_err(drv)?;
    let l = st.clone_dtoh(&l).map_err(drv)?;
    let nan = nan_bits(spec.dtype);
    let stray = o[tq * hq * dv..].iter().filter(|&&x| x != nan).count();
    let mut out = Vec::new();
    for bi in 0..b {
        let (q0, k0) = (cq[bi] as usize, ck[bi] as usize);
        let (sq, sk) = (lq[bi], lk[bi]);
        let name = format!(
            "{:<13} {:<4} d{:<3} packed seq {bi} of {b} ({sq}x{sk}) h{hq}/{hkv}",
            spec.name,
            spec.dtype.name(),
            spec.head_dim_qk
        );
        let keys = (
            kv[k0 * hkv * dq..][..sk * hkv * dq].to_vec(),
            vv[k0 * hkv * dv..][..sk * hkv * dv].to_vec(),
        );
        let rows = PackedRows {
            qv: &qv,
            o: &o,
            l: &l,
            total_q: tq,
            heads: (hq, hkv),
        };
        let launch = Sizes {
            batch: b,
            heads: hq,
            seq_q: mq,
            seq_k: mk,
        };
        out.push(sequence_case(
            name,
            format!("{fam:?}"),
            spec,
            &seq_params(spec, &params, sq.max(sk), bi, launch),
            &rows,
            (q0, sq),
            keys,
        ));
    }
    Ok((out, stray))
}

/// A packed launch's inputs and outputs, from which each sequence's case is cut.
struct PackedRows<'a> {
    /// Q's values, `[total_q, heads_q, d]`.
    qv: &'a [f64],
    /// O as the kernel wrote it, `[total_q, heads_q, dv]` (and any padding after).
    o: &'a [u16],
    /// The LSE, `[heads_q, total_q]`.
    l: &'a [f32],
    total_q: usize,
    heads: (usize, usize),
}

/// The case of one sequence of a packed launch: its `sq` queries from packed row `q0`, its keys
/// and values (`[sk, heads_kv, d]`), its params (already cut to its own `seq` extent by
/// `seq_params`), and its rows of the packed O and LSE as the run of `run`.
fn sequence_case(
    name: String,
    run: String,
    spec: &VariantSpec,
    params: &flash_dsl::eval::ParamValues,
    rows: &PackedRows<'_>,
    (q0, sq): (usize, usize),
    (k, v): (Vec<f64>, Vec<f64>),
) -> CaseResult {
    let (hq, hkv) = rows.heads;
    let (dq, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let sk = k.len() / (hkv * dq).max(1);
    let problem = Problem {
        batch: 1,
        heads_q: hq,
        heads_kv: hkv,
        seq_q: sq,
        seq_k: sk,
        q: rows.qv[q0 * hq * dq..][..sq * hq * dq].to_vec(),
        k,
        v,
        params: params.clone(),
        rng: crate::device::CHECK_RNG,
    };
    let ob: Vec<f64> = rows.o[q0 * hq * dv..][..sq * hq * dv]
        .iter()
        .map(|&x| spec.dtype.from_bits(x))
        .collect();
    // The packed LSE is [heads_q, total_q]; the reference's [1, heads_q, seq_q].
    let lb: Vec<f64> = (0..hq)
        .flat_map(|h| {
            rows.l[h * rows.total_q + q0..][..sq]
                .iter()
                .map(|&x| x as f64)
        })
        .collect();
    CaseResult {
        name,
        problem,
        spec: spec.clone(),
        runs: vec![(run, Ok((ob, lb, 0)))],
    }
}

/// Document lengths drawn uniformly from 128…4096 until 16k tokens (the last one cut to fit,
/// at least 128), from a fixed seed.
pub fn document_lengths() -> Vec<usize> {
    let mut rng = Rng(16384);
    let mut lens = Vec::new();
    let mut left = 16384usize;
    while left > 0 {
        let l = (128 + rng.below(4096 - 128 + 1) as usize).min(left);
        let l = if left - l < 128 { left } else { l };
        lens.push(l);
        left -= l;
    }
    lens
}

/// Prefill of packed documents ([`document_lengths`], 16k tokens, bf16, d 128, 16 heads, causal
/// and not) through the packed kernel, next to the same 16k tokens as dense batches of equal
/// lengths (16 × 1024, as many sequences as documents, 4 × 4096), the same tokens packed as
/// sequences of equal length, and the documents each padded to the longest. TFLOP/s counts
/// the FLOPs of the visible (q, k) pairs, as peers.py does (half for causal).
pub fn timing_varlen(
    rt: &Runtime,
    specs: &[VariantSpec],
    rows: &mut Vec<Value>,
) -> Result<(), FlashError> {
    let (d, h) = (128usize, 16usize);
    let lens = document_lengths();
    let total: usize = lens.iter().sum();
    let longest = lens.iter().copied().max().unwrap_or(0);
    println!(
        "# varlen documents ({} of them, {total} tokens): {lens:?}",
        lens.len()
    );
    let gpu = rt.info().name.clone();
    let st = rt.stream();
    let drv = |e| FlashError::Driver(format!("varlen buffers: {e:?}"));
    let n_max = (lens.len() * longest).max(total) * h * d;
    let mut rng = Rng(5);
    let gen: Vec<u16> = (0..n_max)
        .map(|_| DType::Bf16.to_bits(rng.normal()))
        .collect();
    let qb = st.clone_htod(&gen).map_err(drv)?;
    let kb = st.clone_htod(&gen).map_err(drv)?;
    let vb = st.clone_htod(&gen).map_err(drv)?;
    let mut ob = st.alloc_zeros::<u16>(n_max).map_err(drv)?;
    let mut lb = st.alloc_zeros::<f32>(n_max / d).map_err(drv)?;
    for causal in [false, true] {
        let spec = with(
            &example(specs, if causal { "Causal" } else { "Dense" })?,
            d as u32,
            DType::Bf16,
        );
        let pairs = |l: usize| {
            if causal {
                (l * (l + 1) / 2) as f64
            } else {
                (l * l) as f64
            }
        };
        let flops = |ls: &[usize]| {
            ls.iter()
                .map(|&l| 4.0 * pairs(l) * (h * d) as f64)
                .sum::<f64>()
        };
        let variant = if causal { "causal" } else { "dense" };
        // Packed: the documents, then as many sequences of equal length (the packing's own
        // cost, apart from the mix of lengths).
        let kernel = rt.load_varlen(&spec, None)?;
        let uniform = vec![total / lens.len(); lens.len()];
        for (label, ls) in [("docs", &lens), ("uniform", &uniform)] {
            let cu_ls = offsets(ls);
            let dcu_ls = st.clone_htod(&cu_ls).map_err(drv)?;
            let seqs = VarlenBatch {
                cu_seqlens_q: &dcu_ls,
                cu_seqlens_k: &dcu_ls,
                host_q: &cu_ls,
                host_k: &cu_ls,
            };
            let n_tok: usize = ls.iter().sum();
            let ms = {
                let q = TensorRef::new(&qb, [1, n_tok, h, d], st);
                let k = TensorRef::new(&kb, [1, n_tok, h, d], st);
                let v = TensorRef::new(&vb, [1, n_tok, h, d], st);
                let mut o = TensorMut::new(&mut ob, [1, n_tok, h, d], st);
                let mut l = LseMut::new(&mut lb, st);
                rt.time_varlen(&kernel, &q, &k, &v, &mut o, &mut l, &seqs, &[], (5, 30))?
            };
            let tf = flops(ls) / ms as f64 / 1e9;
            println!("varlen {variant:<6} d={d} h={h} {n_tok} tokens in {} {label:<9} flash packed {ms:8.4} ms {tf:7.1} TFLOP/s", ls.len());
            rows.push(json!({"gpu": gpu, "backend": "flash", "variant": format!("varlen_{label}_{variant}"), "dtype": "bf16",
                "d": d, "n": n_tok, "b": ls.len(), "h": h, "causal": causal, "mode": "fwd", "ms": ms, "tflops": tf,
                "lens": ls.clone()}));
        }
        // The same tokens as dense batches of equal lengths, and padded to the longest document.
        let dense_kernel = rt.load(&spec, None)?;
        for (label, b, n) in [
            ("dense_batch", 16usize, 1024usize),
            ("dense_batch", lens.len(), total / lens.len()),
            ("dense_batch", 4, 4096),
            ("padded", lens.len(), longest),
        ] {
            let q = TensorRef::new(&qb, [b, n, h, d], st);
            let k = TensorRef::new(&kb, [b, n, h, d], st);
            let v = TensorRef::new(&vb, [b, n, h, d], st);
            let mut o = TensorMut::new(&mut ob, [b, n, h, d], st);
            let mut l = LseMut::new(&mut lb, st);
            let ms = rt.time_forward(&dense_kernel, &q, &k, &v, &mut o, &mut l, &[], 5, 30)?;
            // Padded: only the documents' own FLOPs count.
            let useful = if label == "padded" {
                flops(&lens)
            } else {
                flops(&vec![n; b])
            };
            let tf = useful / ms as f64 / 1e9;
            println!("varlen {variant:<6} d={d} h={h} {label:<11} {b:3} x {n:5}  flash {ms:8.4} ms {tf:7.1} TFLOP/s");
            rows.push(json!({"gpu": gpu, "backend": "flash", "variant": format!("varlen_{label}_{variant}"), "dtype": "bf16",
                "d": d, "n": n, "b": b, "h": h, "causal": causal, "mode": "fwd", "ms": ms, "tflops": tf}));
        }
    }
    Ok(())
}

/// Chunked prefill: every example variant with a split-KV kernel, head dims 64 and 128, packed
/// queries (new tokens per sequence: none, one, a few, a tile's worth) against a paged cache of
/// cached lengths 0…4097 (which count the new tokens) in shuffled pages of 16 and 64 keys (and
/// 24: the row-by-row page lookup), with the runtime's split count and with 3 forced splits; each
/// sequence judged against the float64 reference of its own queries and keys. Returns (lines,
/// failures).
pub fn check_chunked(rt: &Runtime, specs: &[VariantSpec]) -> (usize, usize) {
    use flash_dsl::plan::splitkv::splitkv_unsupported;
    let (mut n, mut fails) = (0, 0);
    let lens_q = [0usize, 1, 17, 33, 64];
    let lens_k = [0usize, 1, 77, 1000, 4097];
    let (hq, hkv) = (8usize, 2usize);
    let mut seed = 99u64;
    let mut cases = Vec::new();
    for spec in specs.iter().filter(|s| splitkv_unsupported(s).is_none()) {
        for d in [64u32, 128] {
            let spec = with(spec, d, spec.dtype);
            let dq = spec.head_dim_qk as usize;
            for (ps, splits) in [(16usize, None), (64, Some(3)), (24, None)] {
                seed += 1;
                let mut rng = Rng(seed);
                let b = lens_q.len();
                let cap = crate::decode::PagedCache::max_pages(&lens_k, ps) * ps;
                let mq = *lens_q.iter().max().unwrap();
                let params = serving_params(
                    &spec,
                    Sizes {
                        batch: b,
                        heads: hq,
                        seq_q: mq,
                        seq_k: cap,
                    },
                    &mut rng,
                );
                let tq: usize = lens_q.iter().sum();
                let (qb, qv) = draw(&mut rng, tq * hq * dq, spec.dtype);
                let cache = crate::decode::PagedCache::random(&mut rng, &spec, &lens_k, hkv, ps);
                let cq = offsets(&lens_q);
                let label = format!(
                    "{:<13} {:<4} d{d:<3} chunked paged{ps:<2} h{hq}/{hkv}",
                    spec.name,
                    spec.dtype.name()
                );
                let run = || cache.run(rt, &spec, &qb, [1, tq, hq, dq], Some(&cq), &params, splits);
                match run() {
                    Err(e) => {
                        n += 1;
                        fails += 1;
                        println!("FAIL {label} error: {e}");
                    }
                    Ok((o, l, used)) => {
                        let rows = PackedRows {
                            qv: &qv,
                            o: &o,
                            l: &l,
                            total_q: tq,
                            heads: (hq, hkv),
                        };
                        for bi in 0..b {
                            let (sq, sk, q0) = (lens_q[bi], lens_k[bi], cq[bi] as usize);
                            let name = format!("{label} seq {bi} ({sq} new of {sk}) splits {used}");
                            let keys = (cache.k_rows[bi].1.clone(), cache.v_rows[bi].1.clone());
                            let launch = Sizes {
                                batch: b,
                                heads: hq,
                                seq_q: mq,
                                seq_k: cap,
                            };
                            cases.push(sequence_case(
                                name,
                                "chunked".into(),
                                &spec,
                                &seq_params(&spec, &params, sq.max(sk), bi, launch),
                                &rows,
                                (q0, sq),
                                keys,
                            ));
                        }
                    }
                }
            }
        }
    }
    for c in &cases {
        for (ok, line) in crate::judge::judge(c) {
            n += 1;
            if !ok {
                fails += 1;
            }
            println!("{line}");
        }
    }
    (n, fails)
}
