//! Snapshot tests of the kernels flash generates for a variant declared in this crate — the
//! recipe to copy into your own crate (README, "Snapshot tests of your kernels").
//!
//! Add `insta` as a dev-dependency. The first run writes `tests/snapshots/*.snap.new`; accept
//! them with `cargo insta review` (or `INSTA_UPDATE=always cargo test`) and commit them. From
//! then on, a change to the declaration or a flash upgrade that alters a kernel fails this test
//! with a diff of the plan summary and of the CUDA, to review like any other code change. The
//! generation needs no GPU and no NVRTC, and gives the same text on every machine.

use flash_runtime::flash_dsl::plan::KernelFamily;
use flash_runtime::Variant;

flash_macros::attention! {
    /// Gemma-2-style local attention: a causal sliding window with soft-capped logits.
    pub LocalSoftcap {
        head_dim: 128,
        dtype: bf16,
        params: { cap: f32 },
        mask: causal && q - k < 1024,
        score: softcap(s, cap),
    }
}

/// The plan summary and every kernel's CUDA, for the family an H100/H200 runs.
#[test]
fn local_softcap_kernels() {
    let generated = LocalSoftcap::generate(KernelFamily::Sm90Ws).expect("plans and emits");
    insta::assert_snapshot!("local_softcap_sm90ws_summary", generated.summary());
    for kernel in generated.kernels() {
        insta::assert_snapshot!(kernel.snapshot_name.clone(), kernel.snapshot_text());
    }
}

/// The same kernels compile with NVRTC (no GPU needed), without spilling on the forward path.
/// Skipped with a notice when NVRTC is not installed, except under CI or with
/// `FLASH_REQUIRE_NVRTC=1`, where that is a failure.
#[test]
fn local_softcap_kernels_compile() {
    if let Err(e) = flash_runtime::libs::ensure_nvrtc() {
        let required = ["CI", "FLASH_REQUIRE_NVRTC"]
            .iter()
            .any(|k| std::env::var(k).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false"));
        assert!(!required, "NVRTC is required here but missing: {e}");
        eprintln!("skipping: NVRTC not found ({e})");
        return;
    }
    let generated = LocalSoftcap::generate(KernelFamily::Sm90Ws).expect("plans and emits");
    let cache = flash_runtime::KernelCache::memory_only();
    let built = flash_runtime::build::compile_generated(&generated, "sm_90a", &cache)
        .expect("every kernel compiles for sm_90a");
    assert_eq!(built.len(), generated.kernels().count());
    let forward = &built[0];
    assert_eq!(
        forward.compiled.resources.spill_stores, 0,
        "{}",
        forward.compiled.log
    );
}
