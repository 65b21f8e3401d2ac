//! Every example variant, at head dims 64 and 128 and in bf16 and f16, compiled by NVRTC to
//! CUBIN for sm_80 and sm_90 (the mma.sync family) and sm_90a (the wgmma family), with the
//! registers, shared memory and spill bytes of each printed; the default configurations must not
//! spill, nor have their wgmmas serialised by ptxas (advisory C7520). Needs NVRTC (installed by
//! `scripts/setup-nvrtc.sh`), not a GPU.
//!
//! `scripts/test.sh` runs this test with `--nocapture`, so CI's log carries the table.

mod common;

use flash_dsl::plan::{default_config_for, default_config_for_launch, plan, KernelFamily};
use flash_dsl::{emit, DType, VariantSpec};
use flash_runtime::compile::{compile, CompileOptions};

fn examples() -> Vec<VariantSpec> {
    common::example_specs()
}

#[test]
fn every_example_variant_compiles_without_spills() {
    if !common::have_nvrtc("every_example_variant_compiles_without_spills") {
        return;
    }
    let mut jobs = vec![];
    for spec in examples() {
        for d in [64, 128] {
            for dtype in [DType::Bf16, DType::F16] {
                for arch in ["sm_80", "sm_90", "sm_90a"] {
                    let mut s = spec.clone();
                    (s.head_dim_qk, s.head_dim_v, s.dtype) = (d, d, dtype);
                    let family = KernelFamily::for_arch(arch);
                    // The default, and where a long launch takes another one, that one too.
                    let short = default_config_for(&s, family);
                    let long = default_config_for_launch(&s, family, 1 << 20);
                    jobs.push((s.clone(), arch, short));
                    if long != short {
                        jobs.push((s, arch, long));
                    }
                }
            }
        }
    }
    // Eleven example variants; the causal one at d64 and d128 and the prefix-LM one at d128 also
    // in their long-launch tiles (two dtypes each).
    assert_eq!(jobs.len(), 11 * 2 * 2 * 3 + 6, "eleven example variants");
    let rows = common::par_map(&jobs, |(spec, arch, cfg)| {
        let p = plan(spec, Some(*cfg)).unwrap();
        let k = compile(&emit(&p), &CompileOptions::new(*arch))
            .unwrap_or_else(|e| panic!("{} d{} {arch}: {e}", spec.name, spec.head_dim_qk));
        (spec.clone(), *arch, p, k)
    });
    println!(
        "{:<14} {:>3} {:<5} {:<7} {:<22} {:>5} {:>7} {:>11} {:>7}",
        "variant", "d", "dtype", "arch", "tile (m n warps st)", "regs", "smem", "spill st/ld", "ms"
    );
    let mut spilled = vec![];
    for (spec, arch, p, k) in &rows {
        let c = p.config;
        let r = k.resources;
        println!(
            "{:<14} {:>3} {:<5} {:<7} {:<22} {:>5} {:>7} {:>11} {:>7.0}{}",
            spec.name,
            spec.head_dim_qk,
            spec.dtype.name(),
            arch,
            format!(
                "{:?} {}x{}x{}x{}",
                c.family, c.block_m, c.block_n, c.warps, c.stages
            ),
            r.registers,
            p.smem_bytes() + r.smem_static,
            format!("{}/{}", r.spill_stores, r.spill_loads),
            k.compile_ms,
            if r.wgmma_serialized { " serial" } else { "" }
        );
        assert_eq!(&k.cubin[..4], b"\x7fELF");
        // No spills means something only where ptxas's resource line was read.
        assert!(
            r.registers > 0,
            "{}: no ptxas resource line in the log:\n{}",
            spec.name,
            k.log
        );
        // A kernel whose wgmmas ptxas serialised (advisory C7520) counts as spilling: both
        // are silent losses of speed.
        if r.spills() || r.wgmma_serialized {
            spilled.push(format!(
                "{} d{} {} {arch}{}",
                spec.name,
                spec.head_dim_qk,
                spec.dtype.name(),
                if r.wgmma_serialized {
                    " (wgmma serialised)"
                } else {
                    ""
                }
            ));
        }
    }
    assert!(
        spilled.is_empty(),
        "default configurations spill: {spilled:?}"
    );
}

/// The block-map build kernels (forward map and the backward's transposed map) of every example
/// whose mask reads tensors, at the tile sizes of each family's default forward and backward
/// configurations, compiled for sm_80 (they run on any GPU from there).
#[test]
fn block_map_builders_compile() {
    use flash_dsl::plan::{default_backward_config_for, plan_block_map, BlockMapPlan};
    if !common::have_nvrtc("block_map_builders_compile") {
        return;
    }
    // Each distinct (variant, map) once: families often share tile sizes.
    let mut jobs: Vec<(flash_dsl::VariantSpec, BlockMapPlan)> = vec![];
    for spec in examples() {
        for family in [KernelFamily::Sm80, KernelFamily::Sm90, KernelFamily::Sm90Ws] {
            let f = default_config_for(&spec, family);
            let mut maps = vec![BlockMapPlan::for_spec(&spec, f.block_m, f.block_n, false)];
            if family != KernelFamily::Sm90Ws {
                let b = default_backward_config_for(&spec, family);
                maps.push(BlockMapPlan::for_spec(&spec, b.block_m, b.block_n, true));
            }
            for m in maps.into_iter().flatten() {
                if !jobs.iter().any(|(s, j)| s == &spec && *j == m) {
                    jobs.push((spec.clone(), m));
                }
            }
        }
    }
    assert!(
        jobs.len() >= 4,
        "the Document example needs maps: {}",
        jobs.len()
    );
    let rows = common::par_map(&jobs, |(spec, m)| {
        let p = plan_block_map(spec, *m).unwrap();
        let k = compile(&emit(&p), &CompileOptions::new("sm_80"))
            .unwrap_or_else(|e| panic!("{} {m:?}: {e}", spec.name));
        (p.kernel_name, k.resources)
    });
    for (name, r) in rows {
        println!(
            "{name}: {} registers, {} spill bytes",
            r.registers, r.spill_stores
        );
        assert!(
            r.registers > 0 && !r.spills(),
            "{name} spills (or its log has no resource line)"
        );
    }
}

/// The split-KV kernels (contiguous KV, paged KV, paged KV with packed queries) of every example
/// variant that has them, at head dims 64, 128 and 256 (bf16 and f16), compiled for sm_80 and
/// sm_90a, without spills up to head dim 128 (at 256 the fp32 output accumulator alone takes 128 of the 255 registers and a few
/// bytes may spill; printed); a variant without one (a constant dropout probability) would get
/// the planner's reason, and every example has one.
#[test]
fn split_kv_kernels_compile_without_spills() {
    use flash_dsl::plan::splitkv::{
        default_splitkv_config, plan_splitkv, plan_splitkv_paged, plan_splitkv_paged_varlen,
        splitkv_unsupported,
    };
    if !common::have_nvrtc("split_kv_kernels_compile_without_spills") {
        return;
    }
    let mut jobs = vec![];
    let mut without = 0;
    for spec in examples() {
        if let Some(why) = splitkv_unsupported(&spec) {
            let e = plan_splitkv(&spec, default_splitkv_config(&spec)).unwrap_err();
            assert!(e.to_string().contains(why), "{}: {e}", spec.name);
            without += 1;
            continue;
        }
        for d in [64, 128, 256] {
            for dtype in [DType::Bf16, DType::F16] {
                let mut s = spec.clone();
                (s.head_dim_qk, s.head_dim_v, s.dtype) = (d, d, dtype);
                let cfg = default_splitkv_config(&s);
                for p in [
                    plan_splitkv(&s, cfg).unwrap(),
                    plan_splitkv_paged(&s, cfg).unwrap(),
                    plan_splitkv_paged_varlen(&s, cfg).unwrap(),
                ] {
                    for arch in ["sm_80", "sm_90a"] {
                        jobs.push((p.clone(), arch));
                    }
                }
            }
        }
    }
    assert_eq!(
        without, 0,
        "every example has a split-KV kernel (BigBird's reads its layout; Dropout's serves p = 0)"
    );
    let rows = common::par_map(&jobs, |(p, arch)| {
        let k = compile(&emit(p), &CompileOptions::new(*arch))
            .unwrap_or_else(|e| panic!("{} {arch}: {e}", p.kernel_name));
        (p.kernel_name.clone(), *arch, p.smem_bytes(), k.resources)
    });
    let mut spilled = vec![];
    for (name, arch, smem, r) in rows {
        println!(
            "{name:<58} {arch:<7} {:>4} regs {smem:>7} smem {:>4}/{:<4} spill",
            r.registers, r.spill_stores, r.spill_loads
        );
        assert!(r.registers > 0, "{name}: no ptxas resource line");
        if r.spills() && !name.contains("_d256x256_") {
            spilled.push(format!("{name} {arch}"));
        }
    }
    assert!(spilled.is_empty(), "split-KV kernels spill: {spilled:?}");
}

/// The packed (variable-length) forward kernel of every example variant that has one, at head
/// dims 64 and 128 in bf16, on each family's default tile: sm_80 (mma.sync), sm_90a lockstep
/// (wgmma) and sm_90a warp-specialised (TMA); none may spill, but for a few words where a mask
/// reads tensors or a sparsity layout. A variant without one (a constant dropout probability)
/// would get the planner's reason, and every example has one.
#[test]
fn varlen_kernels_compile_without_spills() {
    use flash_dsl::plan::needs_block_map;
    use flash_dsl::plan::varlen::{plan_varlen, varlen_unsupported};
    if !common::have_nvrtc("varlen_kernels_compile_without_spills") {
        return;
    }
    let mut jobs = vec![];
    let mut without = vec![];
    for spec in examples() {
        if let Some(why) = varlen_unsupported(&spec) {
            let cfg = default_config_for(&spec, KernelFamily::Sm80);
            let e = plan_varlen(&spec, cfg).unwrap_err();
            assert!(e.to_string().contains(why), "{}: {e}", spec.name);
            without.push(spec.name.clone());
            continue;
        }
        for d in [64, 128] {
            let mut s = spec.clone();
            (s.head_dim_qk, s.head_dim_v, s.dtype) = (d, d, DType::Bf16);
            for (family, arch) in [
                (KernelFamily::Sm80, "sm_80"),
                (KernelFamily::Sm90, "sm_90a"),
                (KernelFamily::Sm90Ws, "sm_90a"),
            ] {
                jobs.push((
                    plan_varlen(&s, default_config_for(&s, family)).unwrap(),
                    arch,
                    needs_block_map(&s),
                ));
            }
        }
    }
    without.sort();
    assert!(
        without.is_empty(),
        "the variants without a packed kernel: {without:?}"
    );
    let rows = common::par_map(&jobs, |(p, arch, ranges)| {
        let k = compile(&emit(p), &CompileOptions::new(*arch))
            .unwrap_or_else(|e| panic!("{} {arch}: {e}", p.kernel_name));
        (
            p.kernel_name.clone(),
            *arch,
            p.smem_bytes(),
            k.resources,
            *ranges,
        )
    });
    let mut spilled = vec![];
    for (name, arch, smem, r, ranges) in rows {
        println!(
            "{name:<58} {arch:<7} {:>4} regs {smem:>7} smem {:>4}/{:<4} spill",
            r.registers, r.spill_stores, r.spill_loads
        );
        // A mask that reads tensors is classified per tile from warp-collective range lookups
        // (no block map in a packed batch); their bounds cost a few spilled words, allowed up to
        // 64 bytes. Every other packed kernel must not spill.
        let bound = if ranges { 64 } else { 0 };
        assert!(r.registers > 0, "{name} {arch}: no ptxas resource line");
        if r.spill_stores > bound || r.spill_loads > bound {
            spilled.push(format!("{name} {arch}"));
        }
    }
    assert!(spilled.is_empty(), "packed kernels spill: {spilled:?}");
}

/// The FP8 quantisation kernels (e4m3, bf16 and f16 inputs, head dims 64, 128, 256, scales per
/// block of 64 and 128 rows, and per head and per tensor with their first (amax) passes; plain,
/// rotated, and transposed for P·V; per channel with its amax and reduce passes, plain and
/// transposed; and int8 codes for Q and K from bf16) compile for sm_90a without spills.
#[test]
fn quantisation_kernels_compile_without_spills() {
    use flash_dsl::fp8::Fp8Format;
    use flash_dsl::plan::quantize::{plan_quantize, QuantSpec, ScaleGroup};
    if !common::have_nvrtc("quantisation_kernels_compile_without_spills") {
        return;
    }
    let mut jobs = vec![];
    for input in [DType::Bf16, DType::F16] {
        for head_dim in [64, 128, 256] {
            for (block_rows, group) in [
                (64, ScaleGroup::Block),
                (128, ScaleGroup::Block),
                (128, ScaleGroup::Head),
                (128, ScaleGroup::Tensor),
                (128, ScaleGroup::Channel),
                (64, ScaleGroup::Channel),
            ] {
                for (hadamard, transpose) in
                    [(false, false), (true, false), (false, true), (true, true)]
                {
                    // Per channel is V's (e4m3, never rotated or smoothed): the codes, the
                    // column-amax pass and the reduce pass, plain and transposed.
                    let channels = group == ScaleGroup::Channel;
                    if channels && hadamard {
                        continue;
                    }
                    let q = QuantSpec {
                        input,
                        head_dim,
                        format: Fp8Format::E4m3,
                        block_rows,
                        hadamard,
                        transpose,
                        group,
                        amax_pass: false,
                        smooth: false,
                        sum_pass: false,
                        mean_pass: false,
                        reduce_pass: false,
                    };
                    jobs.push(plan_quantize(&q).unwrap());
                    if let Some(first) = q.amax_pass().filter(|_| !transpose) {
                        jobs.push(plan_quantize(&first).unwrap());
                    }
                    if let Some(reduce) = q.reduce_pass().filter(|_| !transpose) {
                        jobs.push(plan_quantize(&reduce).unwrap());
                    }
                    if channels {
                        continue;
                    }
                    // K smoothed (not V): its column-sum and means passes, and the amax pass of
                    // a per-head or per-tensor one reading the means.
                    if !transpose {
                        let sm = QuantSpec { smooth: true, ..q };
                        jobs.push(plan_quantize(&sm).unwrap());
                        jobs.push(plan_quantize(&sm.sum_pass().unwrap()).unwrap());
                        jobs.push(plan_quantize(&sm.mean_pass().unwrap()).unwrap());
                        if let Some(first) = sm.amax_pass() {
                            jobs.push(plan_quantize(&first).unwrap());
                        }
                    }
                    // int8 codes for Q and K (`qk: int8`), from bf16.
                    if input == DType::Bf16 && !transpose {
                        let i8 = QuantSpec {
                            format: Fp8Format::Int8,
                            ..q
                        };
                        jobs.push(plan_quantize(&i8).unwrap());
                    }
                }
            }
        }
    }
    let rows = common::par_map(&jobs, |p| {
        let k = compile(&emit(p), &CompileOptions::new("sm_90a"))
            .unwrap_or_else(|e| panic!("{}: {e}", p.kernel_name));
        (p.kernel_name.clone(), k.resources)
    });
    for (name, r) in &rows {
        println!(
            "{name:<44} {:>4} regs {:>4}/{:<4} spill",
            r.registers, r.spill_stores, r.spill_loads
        );
        assert!(
            r.registers > 0 && !r.spills(),
            "{name} spills (or its log has no resource line)"
        );
    }
}
