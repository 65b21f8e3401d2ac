//! `flash compile`: NVRTC compile of each selected declaration, with ptxas's figures.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use flash_dsl::plan::KernelFamily;
use flash_dsl::{CudaSource, KernelPlan};

use crate::build::compile_plan_with;
use crate::cache::{CacheOutcome, KernelCache};
use crate::compile::{compile, CompileOptions, CompiledKernel};
use crate::error::FlashError;

use super::args::{CacheDirArg, VariantArgs};

/// Arguments of `flash compile`.
#[derive(Debug, Args)]
pub struct CompileArgs {
    /// Which declarations of which file, with overrides.
    #[command(flatten)]
    pub variant: VariantArgs,
    /// Target architectures, comma separated or repeated (`sm_80`, `sm_90`, `sm_90a`).
    #[arg(long, value_delimiter = ',', default_value = "sm_90a")]
    pub arch: Vec<String>,
    /// Extra NVRTC options (repeatable), e.g. `--nvrtc-opt=-lineinfo`; after `FLASH_NVRTC_EXTRA`'s.
    #[arg(long = "nvrtc-opt", allow_hyphen_values = true)]
    pub nvrtc_opt: Vec<String>,
    /// Compile even if cached, and do not store the result.
    #[arg(long)]
    pub no_cache: bool,
    /// The kernel cache folder.
    #[command(flatten)]
    pub cache: CacheDirArg,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One line of `flash compile` output.
#[derive(Debug, serde::Serialize)]
struct CompileReport<'a> {
    variant: &'a str,
    kernel: &'a str,
    arch: &'a str,
    registers: u32,
    smem_static: u32,
    smem_dynamic: u32,
    spill_stores: u32,
    spill_loads: u32,
    stack_frame: u32,
    wgmma_serialized: bool,
    compile_ms: f64,
    cache: &'a str,
}

pub(crate) fn cmd_compile(a: &CompileArgs) -> Result<ExitCode, FlashError> {
    let cache = (!a.no_cache).then(|| KernelCache::new(a.cache.cache_dir.clone()));
    let mut failed = 0usize;
    if !a.json {
        println!(
            "{:<28} {:<7} {:>5} {:>10} {:>12} {:>9}  cache",
            "variant", "arch", "regs", "smem B", "spill st/ld", "ms"
        );
    }
    let specs = a.variant.load()?;
    for arch in &a.arch {
        // Plan every declaration before compiling any, so a plan error stops the command
        // before it prints a row.
        let family = KernelFamily::for_arch(arch);
        let plans = specs
            .iter()
            .map(|s| a.variant.plan(s, family))
            .collect::<Result<Vec<_>, _>>()?;
        for (spec, plan) in specs.iter().zip(&plans) {
            if !plan.config.family.runs_on(arch) {
                failed += 1;
                eprintln!(
                    "error: {}: the {:?} kernel family cannot be compiled for {arch}",
                    spec.name, plan.config.family
                );
                continue;
            }
            // `FLASH_NVRTC_EXTRA`'s options (as every compile takes them), then `--nvrtc-opt`'s.
            let mut opts = CompileOptions::new(arch.clone());
            opts.extra.extend(a.nvrtc_opt.iter().cloned());
            match build(plan, &opts, cache.as_ref()) {
                Ok((src, k, outcome)) => report(a, &spec.name, arch, &src, &k, outcome),
                Err(e @ FlashError::LibraryNotFound { .. }) => return Err(e),
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {} for {arch}: {e}", spec.name);
                }
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Emits and compiles `plan`, returning the source, the kernel and how the cache answered
/// (`off` without one). With a cache this is [`compile_plan_with`], the path the runtime and
/// the tuner take; `--no-cache` compiles without one.
fn build(
    plan: &KernelPlan,
    opts: &CompileOptions,
    cache: Option<&KernelCache>,
) -> Result<(CudaSource, Arc<CompiledKernel>, &'static str), FlashError> {
    match cache {
        Some(c) => {
            compile_plan_with(plan, opts, c).map(|b| (b.source, b.compiled, b.outcome.as_str()))
        }
        None => {
            let src = flash_dsl::emit(plan);
            let k = compile(&src, opts)?;
            Ok((src, Arc::new(k), "off"))
        }
    }
}

/// Prints one kernel's row (or JSON line). The `ms` column shows only time actually spent
/// compiling now: a cache hit's `compile_ms` is that of the original compile.
fn report(
    a: &CompileArgs,
    variant: &str,
    arch: &str,
    src: &CudaSource,
    k: &CompiledKernel,
    outcome: &str,
) {
    let r = k.resources;
    let ms = if outcome == CacheOutcome::Miss.as_str() || outcome == "off" {
        k.compile_ms
    } else {
        0.0
    };
    if a.json {
        let rep = CompileReport {
            variant,
            kernel: &k.kernel_name,
            arch,
            registers: r.registers,
            smem_static: r.smem_static,
            smem_dynamic: src.smem_bytes,
            spill_stores: r.spill_stores,
            spill_loads: r.spill_loads,
            stack_frame: r.stack_frame,
            wgmma_serialized: r.wgmma_serialized,
            compile_ms: k.compile_ms,
            cache: outcome,
        };
        println!("{}", serde_json::to_string(&rep).unwrap_or_default());
    } else {
        println!(
            "{:<28} {:<7} {:>5} {:>10} {:>12} {:>9}  {}{}{}",
            variant,
            arch,
            r.registers,
            r.smem_static + src.smem_bytes,
            format!("{}/{}", r.spill_stores, r.spill_loads),
            if ms > 0.0 {
                format!("{ms:.1}")
            } else {
                "-".into()
            },
            outcome,
            if r.spills() { "  (spills!)" } else { "" },
            if r.wgmma_serialized {
                "  (wgmma serialised!)"
            } else {
                ""
            },
        );
    }
}
