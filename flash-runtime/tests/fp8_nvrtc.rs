//! The fp8 forward (`dtype: e4m3`, head dims 128 and 256) of dense, masked (a block-map document mask included),
//! score-hook and parameterised variants, with scales per block, per head and per tensor, in both
//! schedules (two and three stages), compiled by NVRTC for sm_90a: no spills, and no wgmma
//! serialised by ptxas (advisory C7520). Needs NVRTC, not a GPU; the GPU check (`flash-gpucheck --fp8-only`) runs them.

mod common;

use flash_dsl::plan::{default_config_for, forward::plan_forward, KernelFamily};
use flash_runtime::compile::{compile, CompileOptions};

/// The fp8 variants, shared with the GPU check (`flash-gpucheck --fp8-only`).
const SOURCE: &str = include_str!("../fp8_check.flash");

#[test]
fn fp8_forward_kernels_compile_without_spills() {
    if !common::have_nvrtc("fp8_forward_kernels_compile_without_spills") {
        return;
    }
    let specs = flash_dsl::parse::parse_str(SOURCE).unwrap();
    assert_eq!(specs.len(), 32);
    for spec in specs {
        // Both schedules: in series (two stages) and overlapped (three); at head dim 256 the
        // default's alone — three spill there with a mask (the causal kernel 40 bytes), which
        // the plan allows (correct) but chooses only for plain dense attention.
        let d = default_config_for(&spec, KernelFamily::Sm90Ws);
        let stages: &[u32] = if spec.head_dim_qk > 128 {
            &[d.stages]
        } else {
            &[2, 3]
        };
        for &stages in stages {
            let plan = plan_forward(&spec, flash_dsl::TileConfig { stages, ..d }).unwrap();
            let k = compile(&flash_dsl::emit(&plan), &CompileOptions::new("sm_90a"))
                .unwrap_or_else(|e| panic!("{}: {e}", plan.kernel_name));
            let r = &k.resources;
            println!(
                "{:<56} regs {:3} spills {}/{}{}",
                plan.kernel_name,
                r.registers,
                r.spill_stores,
                r.spill_loads,
                if r.wgmma_serialized { " serial" } else { "" }
            );
            // (No spills means something only where ptxas's resource line was read.)
            assert!(
                r.registers > 0,
                "{}: no ptxas resource line: {}",
                plan.kernel_name,
                k.log
            );
            assert_eq!(
                (r.spill_stores, r.spill_loads),
                (0, 0),
                "{}",
                plan.kernel_name
            );
            assert!(!r.wgmma_serialized, "{}: {}", plan.kernel_name, k.log);
        }
    }
}
