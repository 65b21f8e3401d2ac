//! The variants under test: loaded from a folder, resized, compiled ahead in parallel.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use flash_dsl::{DType, TileConfig, VariantSpec};
use flash_runtime::{FlashError, Runtime};

/// Every declaration of every `dir/*.flash`, files in name order.
pub fn load_variants(dir: &Path) -> Result<Vec<VariantSpec>, String> {
    Ok(flash_dsl::files::load_flash_dir(dir)?
        .into_iter()
        .flat_map(|(_, specs)| specs)
        .collect())
}

/// The declaration named `name` among `specs` (the timing workloads use the examples').
pub fn example(specs: &[VariantSpec], name: &str) -> Result<VariantSpec, FlashError> {
    specs
        .iter()
        .find(|s| s.name == name)
        .cloned()
        .ok_or_else(|| FlashError::Invalid(format!("no variant `{name}` in the examples")))
}

pub fn with(spec: &VariantSpec, d: u32, dt: DType) -> VariantSpec {
    let mut s = spec.clone();
    if s.head_dim_v == s.head_dim_qk {
        s.head_dim_v = d;
    }
    s.head_dim_qk = d;
    s.dtype = dt;
    s
}

/// Compiles every spec in parallel through the runtime's cache (so the sequential loads after
/// are memory hits).
pub fn precompile(rt: &Runtime, specs: &[(VariantSpec, Option<TileConfig>)]) {
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    std::thread::scope(|sc| {
        for _ in 0..threads.min(specs.len()) {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((spec, cfg)) = specs.get(i) else {
                    break;
                };
                if let Ok(plan) = rt.plan(spec, *cfg) {
                    if let Err(e) = flash_runtime::compile_plan(&plan, &rt.info().arch, rt.cache())
                    {
                        eprintln!("compile {}: {e}", plan.kernel_name);
                    }
                }
            });
        }
    });
}
