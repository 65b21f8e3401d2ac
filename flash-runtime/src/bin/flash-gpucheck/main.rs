//! `flash-gpucheck`: correctness and timing of the generated kernels on a real GPU.
//!
//! ```text
//! flash-gpucheck [--variants DIR] [--small] [--no-check] [--no-time] [--backward | --backward-only] [--dropout | --dropout-only] [--maps | --maps-only] [--varlen | --varlen-only] [--fp8-only] [--decode-only | --decode-sweep] [--time-set LIST] [--bwd-head-dims LIST] [--json OUT.json]
//! ```
//!
//! **Decode** (with the forward's timings, or alone with `--decode-only`, or `--decode-sweep`
//! for a sweep of tiles too):
//! `bench/peers.py --decode`'s workloads through the split-KV pass, GB/s, contiguous and from a
//! paged cache (pages of 64 in shuffled order). With the forward's check, the paged KV check
//! (every variant, cached lengths 0…4097 in pages of 16, 24 and 64). See `decode.rs`.
//!
//! **Packed batches** (`--varlen`, or `--varlen-only` for nothing else): the packed
//! (variable-length) forward kernel of every variant that has one, on every family, over
//! batches with empty, one-token and odd-length sequences (query and key lengths equal and
//! different both ways, up to 4097), each sequence judged against its own float64 reference;
//! then chunked prefill (packed queries against a paged cache, the split-KV kernel); with
//! timing, the prefill of packed documents (16k tokens, lengths 128…4096) against the same
//! tokens as dense batches. See `varlen.rs`.
//!
//! **FP8** (`--fp8-only`): the quantisation kernels (e4m3, scales per block of 64 and 128 rows, per head and per tensor, with and
//! without the Hadamard rotation, bf16 and f16 inputs with outliers) against the host model of
//! `flash_dsl::fp8`, every code and scale bit for bit; with timing, its bandwidth. See
//! `fp8check.rs`.
//!
//! **Block maps** (`--maps`, or `--maps-only` for nothing else): the maps the GPU builds for
//! masks that read tensors, word for word against the host's brute-force classification, over
//! document layouts, shapes and every family's tile sizes; with timing, their build time and
//! memory at n = 4k, 16k, 128k. See `blockmap.rs`.
//!
//! **Backward** (`--backward`): every declaration at head dims 64, 96, 128 in bf16 and f16 over
//! a shape matrix (seq 1…300, seq_q ≠ seq_k both ways, MHA/GQA/MQA), gradients against the
//! float64 gradient reference (see `backward.rs` for the rule), for every backward kernel family
//! the device runs (the wgmma kernel on sm_90a, the sm80 kernel); then the deterministic mode.
//! `--backward-only` skips the forward's check and timings; `--no-check` and `--no-time` apply
//! to both passes.
//!
//! **Dropout** (`--dropout`, or `--dropout-only` for nothing else): the masks the forward and
//! backward kernels apply, read back out of them and compared with the host generator bit for
//! bit over every family and tile configuration; the kept fraction of 10⁷ GPU decisions; p = 0
//! against the variant without dropout; repeated runs; then (with timing) peers.py's
//! `--dropout` workloads in fwd, bwd and fwd_bwd. See `dropout.rs`.
//!
//! **Check.** Every declaration of every `DIR/*.flash` (default `examples/variants`), at head dims
//! 64, 96 and 128 (bf16 and f16 for `Dense` and `Causal`, the declared dtype otherwise), over
//! shapes covering seq 1/17/113/1023/4096, seq_q ≠ seq_k both ways, MHA/GQA/MQA, seq_k = 0,
//! fully masked rows and a strided (packed QKV, padded O) layout. Inputs are random normal,
//! params random; O and LSE are poisoned with NaN before the launch. The rule (FlashAttention's):
//! `max|O − ref| ≤ 2·max|O_plain − ref|` against the float64 reference, `O_plain` being the plain
//! same-precision implementation; LSE within 1e-3 (relative above 1) and `-inf` exactly where
//! the reference's is; fully masked rows exactly 0; no NaN; nothing written outside O's view.
//! `--small` keeps the small shapes (for compute-sanitizer). `--bwd-head-dims LIST` checks the
//! backward at those head dims only, each `D` or `DQK/DV` (default 64, 96, 128, 192, 128/64 and
//! 192/128 — above 128 the mma.sync kernel alone; with `--small` 64 and 128). Exit status 1 on
//! any failure.
//!
//! **Time.** Dense/causal workloads (bf16, f16; d 64, 128; seq 1024, 4096, 16384 with
//! batch·seq = 16384 and heads = 2048/d) and the variant workloads of `bench/peers.py`
//! (d 128, 16 heads, bf16), CUDA events, median; FLOPs counted as peers.py does. Also cold
//! NVRTC compile and warm disk-cache load latency. Rows go to `--json`. `--time-set LIST` (comma
//! separated: `bf16`, `f16`, `d64`, `d128`, `variants`, `decode`) times only those parts, so that
//! an A/B of two builds fits in one device call; dtypes and head dims select dense/causal rows.
//! The backward timings take `FLASH_BWD_ROWS` from the environment: comma-separated parts, a row
//! running when its key (`causal-d128/16384`, `det-dense/4096`, `document_causal/4096`) contains
//! one of them (a profile or an A/B then launches only the workloads it studies).

mod backward;
mod blockmap;
mod bwd_timing;
mod cases;
mod decode;
mod device;
mod dropout;
mod fp8check;
mod judge;
mod timing;
mod variants;
mod varlen;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use flash_dsl::plan::{
    default_backward_config_for, default_config_for, default_config_for_launch, KernelFamily,
};
use flash_dsl::{DType, TileConfig, VariantSpec};
use flash_runtime::Runtime;

use cases::{run_case, shapes, CaseResult, Shape};
use judge::judge;
use timing::{timing, TimeSet};
use variants::{load_variants, precompile, with};

/// Runs every case of every variant on the GPU, then judges them on the CPU in parallel,
/// printing a line per (case, family); returns (lines, failures).
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
            for c in [
                default_config_for(s, f),
                default_config_for_launch(s, f, usize::MAX),
            ] {
                let k = (s.clone(), Some(c));
                if !uniq.contains(&k) {
                    uniq.push(k);
                }
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

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut dir = PathBuf::from("examples/variants");
    let (mut small, mut do_check, mut do_time, mut do_bwd) = (false, true, true, false);
    let mut do_fwd = true;
    let mut do_drop = false;
    let mut do_maps = false;
    let mut do_varlen = false;
    let mut do_fp8 = false;
    // Decode timing runs with the forward's timings; `--decode-only` runs it alone after the
    // paged KV check, `--decode-sweep` too with a sweep of split-KV tiles.
    let mut decode_only = false;
    let mut decode_sweep = false;
    let mut json_out: Option<PathBuf> = None;
    let mut set = TimeSet::all();
    // The backward check's head dims, (qk, v) (`--bwd-head-dims 192,192/128` checks those alone).
    let mut bwd_dims: Option<Vec<(u32, u32)>> = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--variants" => dir = args.next().map(PathBuf::from).unwrap_or(dir),
            "--small" => {
                small = true;
                do_time = false;
            }
            "--no-check" => do_check = false,
            "--no-time" => do_time = false,
            "--backward" => do_bwd = true,
            "--backward-only" => {
                do_bwd = true;
                do_fwd = false;
            }
            "--dropout" => do_drop = true,
            "--dropout-only" => {
                do_drop = true;
                do_fwd = false;
                do_bwd = false;
            }
            "--decode-only" | "--decode-sweep" => {
                decode_sweep = a == "--decode-sweep";
                decode_only = true;
                do_check = false;
                do_fwd = false;
                do_bwd = false;
            }
            "--fp8-only" => {
                do_fp8 = true;
                do_fwd = false;
                do_bwd = false;
            }
            "--varlen" => do_varlen = true,
            "--varlen-only" => {
                do_varlen = true;
                do_fwd = false;
                do_bwd = false;
            }
            "--maps" => do_maps = true,
            "--maps-only" => {
                do_maps = true;
                do_fwd = false;
                do_bwd = false;
            }
            "--json" => json_out = args.next().map(PathBuf::from),
            "--time-set" => match TimeSet::parse(&args.next().unwrap_or_default()) {
                Ok(t) => set = t,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
            },
            "--bwd-head-dims" => {
                let list = args.next().unwrap_or_default();
                // `D` (qk and v) or `DQK/DV`.
                let pair = |x: &str| -> Option<(u32, u32)> {
                    match x.split_once('/') {
                        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                        None => x.parse().ok().map(|d| (d, d)),
                    }
                };
                match list.split(',').map(pair).collect::<Option<Vec<_>>>() {
                    Some(v) if !v.is_empty() => bwd_dims = Some(v),
                    _ => {
                        eprintln!(
                            "--bwd-head-dims takes comma-separated head dims, `D` or `DQK/DV`; got `{list}`"
                        );
                        return ExitCode::from(2);
                    }
                }
            }
            "-h" | "--help" => {
                println!("flash-gpucheck [--variants DIR] [--small] [--no-check] [--no-time] [--backward | --backward-only] [--dropout | --dropout-only] [--maps | --maps-only] [--varlen | --varlen-only] [--fp8-only] [--decode-only | --decode-sweep] [--time-set LIST] [--bwd-head-dims LIST] [--json OUT.json]");
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
            // The loader's messages (rendered diagnostics included) start with `error:`.
            eprint!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    if decode_only {
        let (n, fails) = decode::check_paged(&rt, &specs);
        println!("# paged KV: {} passed, {fails} failed of {n}", n - fails);
        failed |= fails > 0;
    }
    if do_check && do_fwd {
        let families: Vec<KernelFamily> =
            [KernelFamily::Sm90Ws, KernelFamily::Sm90, KernelFamily::Sm80]
                .into_iter()
                .filter(|f| f.runs_on(&info.arch))
                .collect();
        let (n, fails) = check(&rt, &specs, small, &families);
        println!("# correctness: {} passed, {fails} failed of {n}", n - fails);
        failed |= fails > 0;
        let (n, fails) = decode::check_paged(&rt, &specs);
        println!("# paged KV: {} passed, {fails} failed of {n}", n - fails);
        failed |= fails > 0;
    }
    if do_bwd && do_check {
        // Every backward family the device runs: the wgmma kernel on sm_90a, the sm80 kernel.
        let bwd_families: Vec<KernelFamily> = [KernelFamily::Sm90, KernelFamily::Sm80]
            .into_iter()
            .filter(|f| f.runs_on(&info.arch))
            .collect();
        let (mut n, mut fails) = (0, 0);
        for &fam in &bwd_families {
            for spec in &specs {
                for dt in [DType::Bf16, DType::F16] {
                    // One head dim above 128 too (the mma.sync kernel's alone: the default
                    // there whichever the family, see `default_backward_config_for`), and qk ≠ v
                    // on both sides of 128. The whole list takes more than one 10-minute device
                    // call: split it with `--bwd-head-dims`.
                    let dims: &[(u32, u32)] = match &bwd_dims {
                        Some(v) => v,
                        None if small => &[(64, 64), (128, 128)],
                        None => &[
                            (64, 64),
                            (96, 96),
                            (128, 128),
                            (192, 192),
                            (128, 64),
                            (192, 128),
                        ],
                    };
                    for &(d, dv) in dims {
                        let mut s = with(spec, d, dt);
                        s.head_dim_v = dv;
                        let cfg = default_backward_config_for(&s, fam);
                        if cfg.family != fam {
                            continue; // this family builds no kernel at these head dims
                        }
                        for (ok, line) in backward::check_backward(&rt, &s, 7 + n as u64, cfg) {
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
        // Long sequences for the masked variants: key blocks far from the diagonal, windows
        // that bite (1024 keys), many query tiles skipped by the query hull.
        if !small {
            for &fam in &bwd_families {
                for spec in specs.iter().filter(|s| s.mask.is_some()) {
                    let s = with(spec, 64, DType::Bf16);
                    let cfg = default_backward_config_for(&s, fam);
                    let dims = (1, 1613, 1613, 2, 1);
                    let (ok, line) = backward::check_backward_at(&rt, &s, 7 + n as u64, cfg, dims);
                    n += 1;
                    if !ok {
                        fails += 1;
                    }
                    println!("{line}");
                }
            }
        }
        println!(
            "# backward correctness: {} passed, {fails} failed of {n}",
            n - fails
        );
        failed |= fails > 0;
        let (mut dn, mut dfails) = (0, 0);
        for &fam in &bwd_families {
            for spec in &specs {
                let s = with(spec, 128, DType::Bf16);
                dn += 1;
                match backward::check_deterministic(&rt, &s, default_backward_config_for(&s, fam)) {
                    Ok((ok, line)) => {
                        dfails += usize::from(!ok);
                        println!("{line}");
                    }
                    Err(e) => {
                        dfails += 1;
                        println!("FAIL det {}: {e}", s.name);
                    }
                }
            }
        }
        println!(
            "# deterministic mode: {} passed, {dfails} failed of {dn}",
            dn - dfails
        );
        failed |= dfails > 0;
    }
    if do_drop && do_check {
        let (n, fails) = dropout::check_dropout(&rt);
        println!(
            "# dropout masks: {} passed, {fails} failed of {n}",
            n - fails
        );
        failed |= fails > 0;
    }
    if do_fp8 && do_check {
        // `FLASH_FP8_ATTENTION_ONLY=1`: the attention kernels' check alone (no quantiser check,
        // no accuracy table); `FLASH_FP8_QUANT_ONLY=1`: the quantisation kernels alone.
        let attention_only = std::env::var_os("FLASH_FP8_ATTENTION_ONLY").is_some();
        if !attention_only {
            let (n, fails) = fp8check::check_quantize(&rt);
            println!(
                "# fp8 quantisation: {} passed, {fails} failed of {n}",
                n - fails
            );
            failed |= fails > 0;
        }
        if std::env::var_os("FLASH_FP8_QUANT_ONLY").is_none() {
            let (n, fails) = fp8check::check_attention(&rt);
            println!(
                "# fp8 attention: {} passed, {fails} failed of {n}",
                n - fails
            );
            failed |= fails > 0;
            let table = if attention_only {
                Ok(())
            } else {
                fp8check::accuracy_table(&rt)
            };
            if let Err(e) = table {
                println!("# fp8 accuracy table failed: {e}");
                failed = true;
            }
        }
    }
    if do_varlen && do_check {
        let families: Vec<KernelFamily> =
            [KernelFamily::Sm90Ws, KernelFamily::Sm90, KernelFamily::Sm80]
                .into_iter()
                .filter(|f| f.runs_on(&info.arch))
                .collect();
        let (n, fails) = varlen::check_varlen(&rt, &specs, &families, small);
        println!(
            "# packed batches: {} passed, {fails} failed of {n}",
            n - fails
        );
        failed |= fails > 0;
        let (n, fails) = varlen::check_chunked(&rt, &specs);
        println!(
            "# chunked prefill (packed queries, paged KV): {} passed, {fails} failed of {n}",
            n - fails
        );
        failed |= fails > 0;
    }
    let document = variants::example(&specs, "Document");
    if do_maps && do_check {
        let (n, fails) = match (&document, &variants::example(&specs, "BigBird")) {
            (Ok(doc), Ok(bb)) => blockmap::check_maps(&rt, doc, bb),
            (Err(e), _) | (_, Err(e)) => {
                println!("FAIL maps: {e}");
                (1, 1)
            }
        };
        println!("# block maps: {} passed, {fails} failed of {n}", n - fails);
        failed |= fails > 0;
    }
    if do_time {
        let mut rows = Vec::new();
        if do_maps {
            if let Err(e) = document.and_then(|doc| blockmap::timing_maps(&rt, &doc, &mut rows)) {
                println!("# block-map timing failed: {e}");
                failed = true;
            }
        }
        if do_fp8 {
            if let Err(e) = fp8check::timing_quantize(&rt, &mut rows) {
                println!("# quantisation timing failed: {e}");
                failed = true;
            }
            if std::env::var_os("FLASH_FP8_QUANT_ONLY").is_some() {
                // the quantisation kernels alone
            } else if let Err(e) = fp8check::timing_attention(&rt, &info.name, &mut rows) {
                println!("# fp8 attention timing failed: {e}");
                failed = true;
            }
        }
        if do_varlen {
            if let Err(e) = varlen::timing_varlen(&rt, &specs, &mut rows) {
                println!("# varlen timing failed: {e}");
                failed = true;
            }
        }
        if do_drop {
            if let Err(e) = dropout::timing_dropout(&rt, &mut rows) {
                println!("# dropout timing failed: {e}");
                failed = true;
            }
        }
        if (do_fwd && set.decode) || decode_only {
            if let Err(e) = decode::timing_decode(&rt, &specs, &mut rows, decode_sweep) {
                println!("# decode timing failed: {e}");
                failed = true;
            }
        }
        if do_fwd {
            if let Err(e) = timing(&rt, &specs, &mut rows, &set) {
                println!("# timing failed: {e}");
                failed = true;
            }
        }
        if do_bwd {
            if let Err(e) = bwd_timing::timing_backward(&rt, &specs, &mut rows) {
                println!("# backward timing failed: {e}");
                failed = true;
            }
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
