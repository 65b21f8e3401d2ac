//! Shared helpers of the runtime's integration tests.
#![allow(dead_code)]

use flash_dsl::CudaSource;

/// Whether NVRTC-dependent tests must run: under CI (`CI=true`) or with `FLASH_REQUIRE_NVRTC=1`
/// a missing NVRTC is a failure, never a skip.
pub fn nvrtc_required() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    set("CI") || set("FLASH_REQUIRE_NVRTC")
}

/// `true` when NVRTC is available. Without it: panics when required (CI), else prints a loud
/// skip notice and returns `false`.
pub fn have_nvrtc(test: &str) -> bool {
    match flash_runtime::libs::ensure_nvrtc() {
        Ok(_) => true,
        Err(e) if nvrtc_required() => {
            panic!("{test}: NVRTC is required here (CI / FLASH_REQUIRE_NVRTC) but missing:\n{e}")
        }
        Err(e) => {
            eprintln!(
                "\n!!!!! SKIPPING {test}: NVRTC not found (run scripts/setup-nvrtc.sh) !!!!!\n{e}\n"
            );
            false
        }
    }
}

/// A small self-contained kernel (no toolkit include) using one named header; `tag` makes the
/// source (and so the cache key) unique per test.
pub fn tiny_kernel(tag: &str) -> CudaSource {
    let source = format!(
        r#"// test kernel: {tag}
#include "flash_test_prelude.cuh"
extern "C" __global__ void flash_test_axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {{
    __shared__ float stage[128];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    stage[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) y[i] = fma_twice(a, stage[threadIdx.x], y[i]);
}}
"#
    );
    CudaSource {
        kernel_name: "flash_test_axpy".into(),
        source,
        headers: vec![(
            "flash_test_prelude.cuh".into(),
            "#pragma once\n__device__ __forceinline__ float fma_twice(float a, float x, float y) { return 2.0f * (a * x) + y; }\n"
                .into(),
        )],
        smem_bytes: 0,
        threads: 128,
    }
}

/// A source NVRTC rejects.
pub fn broken_kernel() -> CudaSource {
    CudaSource {
        kernel_name: "flash_test_broken".into(),
        source:
            "extern \"C\" __global__ void flash_test_broken(float* y) { y[0] = undefined_name; }\n"
                .into(),
        headers: vec![],
        smem_bytes: 0,
        threads: 32,
    }
}

/// Every declaration of `examples/variants/*.flash`, in file order.
pub fn example_specs() -> Vec<flash_dsl::VariantSpec> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/variants");
    flash_dsl::files::load_flash_dir(&dir)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .flat_map(|(_, specs)| specs)
        .collect()
}

/// `f` over every job, one worker thread per core (NVRTC is thread-safe; two cores on CI), the
/// results in job order.
pub fn par_map<T: Sync, R: Send>(jobs: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out = std::sync::Mutex::new(Vec::with_capacity(jobs.len()));
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let r = f(job);
                out.lock().unwrap().push((i, r));
            });
        }
    });
    let mut out = out.into_inner().unwrap();
    out.sort_by_key(|r| r.0);
    out.into_iter().map(|(_, r)| r).collect()
}
