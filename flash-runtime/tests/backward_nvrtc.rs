//! Every backward kernel (pre-processing, main, dQ conversion) of every example variant, at
//! head dims 64, 96 and 128 and in bf16 and f16, compiled by NVRTC to CUBIN for sm_80 and
//! sm_90a, and the wgmma main kernel (`Sm90`, both block sizes, and its deterministic mode) for
//! sm_90a, with the registers, shared memory and spill bytes printed. Needs NVRTC, not a GPU.
//!
//! Spills: the pre-processing and conversion kernels must not spill. The main kernels keep dK
//! and dV of their keys in registers (the sm80 kernel 16 keys per warp, the wgmma kernel 64 per
//! warpgroup: d/2 floats each per thread); at head dim 128, or with a score hook reading a
//! tensor, ptxas spills a few dozen bytes at 255 registers, so the test bounds those spills (at
//! most 160 bytes of stores) instead of forbidding them, for the configurations launches pick by
//! default — where a wgmma default of 128 queries per step spills at all, launches take its
//! 64-query step instead, and the bound applies to that kernel; the others (marked `*`, what the tuner may try) are compiled and reported. No default
//! kernel may have its wgmma instructions serialised by ptxas (advisory C7520, marked `serial`):
//! that costs a quarter or more of a kernel's speed without failing anything else.

mod common;

use flash_dsl::plan::backward::{
    backward_fallback_config, backward_pipeline_with, plan_backward_main_with,
};
use flash_dsl::plan::{
    backward_pipeline, default_backward_config, default_backward_config_for, KernelFamily,
    KernelKind,
};
use flash_dsl::{emit, DType, VariantSpec};
use flash_runtime::compile::{compile, CompileOptions};
use flash_runtime::tune::backward_candidates;

fn examples() -> Vec<VariantSpec> {
    common::example_specs()
}

#[test]
fn every_backward_kernel_compiles_within_the_spill_bound() {
    if !common::have_nvrtc("every_backward_kernel_compiles_within_the_spill_bound") {
        return;
    }
    let mut jobs = vec![];
    for spec in examples() {
        for d in [64, 96, 128] {
            for dtype in [DType::Bf16, DType::F16] {
                let mut s = spec.clone();
                (s.head_dim_qk, s.head_dim_v, s.dtype) = (d, d, dtype);
                let pipe = backward_pipeline(&s, default_backward_config())
                    .unwrap_or_else(|e| panic!("{} d{d}: {e}", s.name));
                for p in pipe.kernels {
                    for arch in ["sm_80", "sm_90a"] {
                        jobs.push((p.clone(), arch));
                    }
                }
                // The deterministic mode's pre-processing and main kernels (sm_90a, bf16).
                if dtype == DType::Bf16 {
                    let det = backward_pipeline_with(&s, default_backward_config(), true)
                        .unwrap_or_else(|e| panic!("{} d{d}: {e}", s.name));
                    for p in det.kernels.into_iter().take(2) {
                        assert!(p.deterministic && p.kernel_name.ends_with("_det"));
                        jobs.push((p, "sm_90a"));
                    }
                }
                // The wgmma kernel: its default (with the deterministic mode in bf16), and the
                // other configurations the tuner tries (64 keys; 128 queries at d <= 64).
                let default = default_backward_config_for(&s, KernelFamily::Sm90Ws);
                assert_eq!(default.family, KernelFamily::Sm90);
                let cfgs = backward_candidates(&s, KernelFamily::Sm90Ws);
                assert_eq!(cfgs[0], default);
                for cfg in cfgs.into_iter().filter(|c| c.family == KernelFamily::Sm90) {
                    for det in [false, true] {
                        if det && (dtype != DType::Bf16 || cfg != default) {
                            continue;
                        }
                        let p = plan_backward_main_with(&s, cfg, det)
                            .unwrap_or_else(|e| panic!("{} d{d}: {e}", s.name));
                        jobs.push((p, "sm_90a"));
                    }
                }
            }
        }
    }
    // Per variant and head dim: 3 kernels × 2 archs per dtype, 2 deterministic (bf16), the wgmma
    // configurations per dtype (3 at d 64, 2 at d 96 and 128) and its deterministic default.
    let per = |cfgs: usize| 2 * 6 + 2 + 2 * cfgs + 1;
    assert_eq!(
        jobs.len(),
        11 * (per(3) + per(2) + per(2)),
        "eleven example variants"
    );
    // The frozen kernels (no score parameter's gradient wanted) of the variants that have
    // parameter gradients: the sm80 pipeline and the wgmma default main kernel, d 128 bf16.
    let mut frozen_variants = 0;
    for spec in examples() {
        let mut s = spec.clone();
        (s.head_dim_qk, s.head_dim_v, s.dtype) = (128, 128, DType::Bf16);
        let wanted = flash_dsl::plan::grad_params(&s);
        if wanted.is_empty() {
            continue;
        }
        frozen_variants += 1;
        let frozen = s.with_frozen(&wanted);
        assert!(flash_dsl::plan::grad_params(&frozen).is_empty());
        let pipe = backward_pipeline(&frozen, default_backward_config())
            .unwrap_or_else(|e| panic!("{} frozen: {e}", s.name));
        for p in pipe.kernels {
            assert!(p.kernel_name.contains("_frozen_"), "{}", p.kernel_name);
            jobs.push((p, "sm_80"));
        }
        let cfg = default_backward_config_for(&frozen, KernelFamily::Sm90Ws);
        let p = plan_backward_main_with(&frozen, cfg, false)
            .unwrap_or_else(|e| panic!("{} frozen: {e}", s.name));
        jobs.push((p, "sm_90a"));
    }
    assert!(
        frozen_variants >= 3,
        "Softcap, Alibi, RelativeBias have parameter gradients"
    );
    let rows = common::par_map(&jobs, |(p, arch)| {
        let k = compile(&emit(p), &CompileOptions::new(*arch))
            .unwrap_or_else(|e| panic!("{} {arch}: {e}", p.kernel_name));
        (p.clone(), *arch, k)
    });
    println!(
        "{:<14} {:>3} {:<5} {:<7} {:<12} {:<16} {:>5} {:>7} {:>11} {:>7}",
        "variant", "d", "dtype", "arch", "kernel", "config", "regs", "smem", "spill st/ld", "ms"
    );
    let mut spilled = vec![];
    let mut serialized = vec![];
    for (p, arch, k) in &rows {
        let r = k.resources;
        let c = p.config;
        // The spill bound holds for the configurations a launch picks by default; the others
        // (what the tuner may try) are compiled and reported.
        let is_default = p.kind != KernelKind::BackwardMain
            || c == default_backward_config()
            || c == default_backward_config_for(&p.spec, KernelFamily::Sm90Ws);
        println!(
            "{:<14} {:>3} {:<5} {:<7} {:<12} {:<16} {:>5} {:>7} {:>11} {:>7.0}{}",
            p.spec.name,
            p.spec.head_dim_qk,
            p.spec.dtype.name(),
            arch,
            p.kind.name(),
            format!(
                "{}x{}x{} {:?}{}",
                c.block_m,
                c.block_n,
                c.warps,
                c.family,
                if is_default { "" } else { "*" }
            ),
            r.registers,
            p.smem_bytes() + r.smem_static,
            format!("{}/{}", r.spill_stores, r.spill_loads),
            k.compile_ms,
            if r.wgmma_serialized { " serial" } else { "" }
        );
        assert_eq!(&k.cubin[..4], b"\x7fELF");
        // The spill bounds below mean something only where ptxas's resource line was read.
        assert!(
            r.registers > 0,
            "{}: no ptxas resource line: {}",
            p.kernel_name,
            k.log
        );
        if is_default && r.wgmma_serialized {
            serialized.push(format!("{} {arch}", p.kernel_name));
        }
        let limit = if p.kind == KernelKind::BackwardMain {
            160
        } else {
            0
        };
        if is_default && (r.spill_stores > limit || (limit == 0 && r.spills())) {
            // A default that spills at all gives way, in the launch, to its narrower step
            // (`backward_fallback_config`): then that kernel, compiled among the tuner's
            // configurations, is the one bound.
            let fallback = backward_fallback_config(&c).map(|fb| {
                plan_backward_main_with(&p.spec, fb, p.deterministic)
                    .expect("the fallback plans")
                    .kernel_name
            });
            let taken = fallback.as_ref().and_then(|name| {
                rows.iter()
                    .find(|(q, a, _)| &q.kernel_name == name && a == arch)
            });
            match (&fallback, taken) {
                (Some(name), Some((_, _, fk))) => {
                    let fr = fk.resources;
                    println!(
                        "  {} spills {}/{}: launches take {name} ({}/{})",
                        p.kernel_name,
                        r.spill_stores,
                        r.spill_loads,
                        fr.spill_stores,
                        fr.spill_loads
                    );
                    if fr.spill_stores > limit {
                        spilled.push(format!(
                            "{name} {arch} (the fallback of {}): {}/{} bytes",
                            p.kernel_name, fr.spill_stores, fr.spill_loads
                        ));
                    }
                }
                (Some(name), None) => spilled.push(format!(
                    "{} {arch} spills and its fallback {name} was not compiled",
                    p.kernel_name
                )),
                (None, _) => spilled.push(format!(
                    "{} {arch}: {}/{} bytes",
                    p.kernel_name, r.spill_stores, r.spill_loads
                )),
            }
        }
    }
    assert!(spilled.is_empty(), "backward kernels spill: {spilled:?}");
    assert!(
        serialized.is_empty(),
        "ptxas serialised the wgmmas of backward kernels: {serialized:?}"
    );
}
