//! Everything flash generates for one variant on one kernel family, as data: the plans and the
//! CUDA of the forward pass, the backward pass, the block-map builders a data-dependent mask
//! needs, the split-KV kernels of inference (contiguous KV, paged KV, paged KV with packed
//! queries) and the packed (variable-length) forward kernel — the kernels the runtime launches by
//! default, before any autotuning.
//!
//! This is what a user snapshots to see, in review, when a flash upgrade or a change to a
//! declaration alters a kernel. [`Generated::summary`] is a short text of the plans (kernel
//! names, launch shapes, operands, the score's derivative) and
//! [`GeneratedKernel::snapshot_text`] the whole translation unit NVRTC compiles (headers
//! included). Both are pure functions of the declaration and the flash version: no paths, no
//! timestamps, no machine state, so a snapshot taken on one machine holds on every other.
//!
//! ```
//! use flash_dsl::generated::generate;
//! use flash_dsl::plan::KernelFamily;
//!
//! let spec = flash_dsl::parse::parse_str(
//!     "Local { head_dim: 64, dtype: bf16, mask: causal && q - k < 256 }",
//! )
//! .unwrap()
//! .remove(0);
//! let g = generate(&spec, KernelFamily::Sm90Ws).unwrap();
//! // The forward kernel, the backward's pre-processing, main and dQ conversion kernels, the
//! // split-KV kernels (contiguous KV, paged KV, paged KV with packed queries), then the packed
//! // (variable-length) forward.
//! let names: Vec<&str> = g.kernels().map(|k| k.snapshot_name.as_str()).collect();
//! assert_eq!(
//!     names,
//!     [
//!         "local_sm90ws_fwd",
//!         "local_sm90ws_bwdpre",
//!         "local_sm90ws_bwd",
//!         "local_sm90ws_bwddq",
//!         "local_sm90ws_skv",
//!         "local_sm90ws_skvp",
//!         "local_sm90ws_skvpv",
//!         "local_sm90ws_fwdv",
//!     ]
//! );
//! assert!(g.summary().contains("d score / d s = 1.0"));
//! // Generation is deterministic.
//! assert_eq!(g, generate(&spec, KernelFamily::Sm90Ws).unwrap());
//! ```

use std::fmt::Write as _;

use crate::deriv::{display, score_gradient};
use crate::emit::{emit, CudaSource};
use crate::plan::splitkv::{
    default_splitkv_config, plan_splitkv, plan_splitkv_paged, plan_splitkv_paged_varlen,
};
use crate::plan::varlen::plan_varlen;
use crate::plan::{
    backward_pipeline, default_backward_config_for, default_config_for, plan, plan_block_map,
    KernelFamily, KernelPlan, PlanError,
};
use crate::spec::{Expr, VariantSpec};

/// The kernels of one variant for one family, in launch order within each pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// The declared name.
    pub variant: String,
    /// The family the forward kernels were planned for (the backward's main kernel is the
    /// wgmma one for both Hopper families, see [`default_backward_config_for`]).
    pub family: KernelFamily,
    /// The forward pass: the block-map builder first when the mask needs one, then the
    /// attention kernel.
    pub forward: Vec<GeneratedKernel>,
    /// The backward pass (block-map builder when needed, pre-processing, main, dQ conversion),
    /// or why this variant has none (e.g. an fp8 variant).
    pub backward: Result<Vec<GeneratedKernel>, PlanError>,
    /// The split-KV kernels (decode-sized launches: contiguous KV, paged KV, paged KV with packed
    /// queries; any GPU from sm_80, whatever the family), or why this variant has none (dropout,
    /// a sparsity layout).
    pub inference: Result<Vec<GeneratedKernel>, PlanError>,
    /// The packed (variable-length) forward kernel on this family, or why this variant has none
    /// (a sparsity layout, dropout).
    pub varlen: Result<GeneratedKernel, PlanError>,
}

/// One generated kernel: its plan and its CUDA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedKernel {
    /// A stable, file-system-safe name for snapshots: `<variant in snake case>_<family>_<kind
    /// tag>` (e.g. `gemma_local_sm90ws_fwd`). Unlike the entry-point name it does not spell out
    /// the tile configuration, so a snapshot keeps its file when the configuration changes and
    /// shows the change as a diff. (Two variants whose names differ only in case share it; a
    /// snapshot test of both then fails loudly rather than mixing them.)
    pub snapshot_name: String,
    /// The plan the source was emitted from.
    pub plan: KernelPlan,
    /// The translation unit and the headers NVRTC gets.
    pub source: CudaSource,
}

/// Plans and emits every kernel the runtime would launch for `spec` on a GPU whose default
/// family is `family`, with the default tile configurations.
///
/// Errors when the forward kernel cannot be planned (the backward's absence is recorded in
/// [`Generated::backward`] instead, as the forward alone is still usable).
pub fn generate(spec: &VariantSpec, family: KernelFamily) -> Result<Generated, PlanError> {
    let fwd = plan(spec, Some(default_config_for(spec, family)))?;
    let forward = with_block_map(spec, family, fwd)?;
    let backward =
        backward_pipeline(spec, default_backward_config_for(spec, family)).and_then(|pipe| {
            let mut out = Vec::new();
            for p in pipe.kernels {
                out.extend(with_block_map(spec, family, p)?);
            }
            Ok(out)
        });
    let cfg = default_splitkv_config(spec);
    let inference = plan_splitkv(spec, cfg).and_then(|dense| {
        let paged = plan_splitkv_paged(spec, cfg)?;
        let chunked = plan_splitkv_paged_varlen(spec, cfg)?;
        Ok(vec![
            kernel(spec, family, dense),
            kernel(spec, family, paged),
            kernel(spec, family, chunked),
        ])
    });
    let varlen =
        plan_varlen(spec, default_config_for(spec, family)).map(|p| kernel(spec, family, p));
    Ok(Generated {
        variant: spec.name.clone(),
        family,
        forward,
        backward,
        inference,
        varlen,
    })
}

/// `p`, preceded by the builder of the block map it reads, if any.
fn with_block_map(
    spec: &VariantSpec,
    family: KernelFamily,
    p: KernelPlan,
) -> Result<Vec<GeneratedKernel>, PlanError> {
    let mut out = Vec::new();
    if let Some(map) = p.block_map {
        out.push(kernel(spec, family, plan_block_map(spec, map)?));
    }
    out.push(kernel(spec, family, p));
    Ok(out)
}

fn kernel(spec: &VariantSpec, family: KernelFamily, plan: KernelPlan) -> GeneratedKernel {
    let snapshot_name = format!(
        "{}_{}_{}",
        snake_case(&spec.name),
        family.tag(),
        plan.kind.tag()
    );
    let source = emit(&plan);
    GeneratedKernel {
        snapshot_name,
        plan,
        source,
    }
}

/// `GemmaLocal` → `gemma_local`: an underscore before each capital that follows a lower-case
/// letter or a digit, then lower case.
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    let mut prev: Option<char> = None;
    for c in name.chars() {
        if c.is_ascii_uppercase()
            && prev.is_some_and(|p| p.is_ascii_lowercase() || p.is_ascii_digit())
        {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
        prev = Some(c);
    }
    out
}

impl Generated {
    /// Every kernel: the forward's, then the backward's and the split-KV ones (those a variant
    /// has).
    pub fn kernels(&self) -> impl Iterator<Item = &GeneratedKernel> {
        let bwd: &[GeneratedKernel] = match &self.backward {
            Ok(k) => k,
            Err(_) => &[],
        };
        let inf: &[GeneratedKernel] = match &self.inference {
            Ok(k) => k,
            Err(_) => &[],
        };
        self.forward
            .iter()
            .chain(bwd)
            .chain(inf)
            .chain(self.varlen.as_ref().ok())
    }

    /// A short, stable text of what was planned: per kernel its entry point, tile
    /// configuration, launch shape and operands; the score's derivative; the reason when there
    /// is no backward. Meant for a snapshot next to the kernels' sources.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "variant {} for the {:?} family",
            self.variant, self.family
        );
        for k in &self.forward {
            summarise(&mut s, "forward", k);
        }
        match &self.backward {
            Ok(ks) => ks.iter().for_each(|k| summarise(&mut s, "backward", k)),
            Err(e) => {
                let _ = writeln!(s, "backward: not available: {e}");
            }
        }
        match &self.inference {
            Ok(ks) => ks.iter().for_each(|k| summarise(&mut s, "inference", k)),
            Err(e) => {
                let _ = writeln!(s, "inference: not available: {e}");
            }
        }
        match &self.varlen {
            Ok(k) => summarise(&mut s, "packed", k),
            Err(e) => {
                let _ = writeln!(s, "packed: not available: {e}");
            }
        }
        if let Some(k) = self.forward.last() {
            let spec = &k.plan.spec;
            match score_gradient(spec) {
                None => s.push_str("d score / d s = 1.0 (no score expression)\n"),
                Some(g) => {
                    let _ = writeln!(s, "d score / d s = {}", display(&g.d_ds, &spec.params));
                    for p in &g.params {
                        let read = if p.index.is_empty() {
                            Expr::Scalar(p.param)
                        } else {
                            Expr::Index(p.param, p.index.clone())
                        };
                        let _ = writeln!(
                            s,
                            "d score / d {} = {}",
                            display(&read, &spec.params),
                            display(&p.d, &spec.params)
                        );
                    }
                }
            }
        }
        s
    }
}

fn summarise(s: &mut String, pass: &str, k: &GeneratedKernel) {
    let p = &k.plan;
    let c = &p.config;
    let _ = writeln!(
        s,
        "{pass} {}: {} ({}x{}x{}x{} {:?}), {} threads, {} B dynamic shared memory, grid {:?}{}",
        p.kind.name(),
        p.kernel_name,
        c.block_m,
        c.block_n,
        c.warps,
        c.stages,
        c.family,
        p.launch.threads,
        p.launch.smem_bytes,
        p.launch.grid,
        if p.block_map.is_some()
            && !matches!(
                p.kind,
                crate::plan::KernelKind::BlockMap | crate::plan::KernelKind::BlockMapKeys
            )
        {
            ", reads a block map"
        } else {
            ""
        }
    );
    for o in &p.operands {
        let _ = writeln!(
            s,
            "  {:<10} {:?} {:?} {:?} {:?}",
            o.name, o.role, o.ty, o.dims, o.layout
        );
    }
}

impl GeneratedKernel {
    /// The whole translation unit as NVRTC sees it: each header, then the kernel source. The
    /// one line that names the flash version is replaced by `Generated by flash.`, so a flash
    /// release that leaves a kernel unchanged leaves its snapshot unchanged too (the compile
    /// cache still keys on the version).
    pub fn snapshot_text(&self) -> String {
        let mut s = String::new();
        for (name, contents) in &self.source.headers {
            let _ = writeln!(s, "// ----- header \"{name}\" -----");
            s.push_str(contents);
            if !contents.ends_with('\n') {
                s.push('\n');
            }
        }
        let _ = writeln!(s, "// ----- {}.cu -----", self.source.kernel_name);
        for line in self.source.source.lines() {
            match line.find("// Generated by flash ") {
                Some(at) => {
                    let rest = &line[at + "// Generated by flash ".len()..];
                    let tail = rest.split_once(". ").map(|(_, t)| t).unwrap_or("");
                    let _ = writeln!(s, "{}// Generated by flash. {tail}", &line[..at]);
                }
                None => {
                    s.push_str(line);
                    s.push('\n');
                }
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_str;

    fn spec(src: &str) -> VariantSpec {
        parse_str(src).expect("parses").remove(0)
    }

    #[test]
    fn a_data_dependent_mask_brings_its_block_map_builders() {
        let s = spec(
            "Doc { head_dim: 64, dtype: bf16, params: { doc: [i32; batch, seq] }, \
             mask: doc[b, q] == doc[b, k] }",
        );
        let g = generate(&s, KernelFamily::Sm90Ws).unwrap();
        let names: Vec<&str> = g.kernels().map(|k| k.snapshot_name.as_str()).collect();
        assert_eq!(
            names,
            [
                "doc_sm90ws_bmap",
                "doc_sm90ws_fwd",
                "doc_sm90ws_bwdpre",
                "doc_sm90ws_bmapk",
                "doc_sm90ws_bwd",
                "doc_sm90ws_bwddq",
                "doc_sm90ws_skv",
                "doc_sm90ws_skvp",
                "doc_sm90ws_skvpv",
                "doc_sm90ws_fwdv"
            ]
        );
        assert!(g.summary().contains("reads a block map"));
        // Its packed kernel classifies tiles by range lookups instead of walking a map.
        let v = g.varlen.as_ref().unwrap();
        assert!(v.plan.block_map.is_none());
    }

    #[test]
    fn no_split_kv_is_recorded_not_fatal() {
        let s = spec("Drop { head_dim: 64, dtype: bf16, mask: causal, dropout: 0.1 }");
        let g = generate(&s, KernelFamily::Sm80).unwrap();
        assert!(g.inference.is_err());
        assert!(g
            .summary()
            .contains("inference: not available: no split-KV kernel: a constant dropout"));
        assert!(g.kernels().all(|k| !k.snapshot_name.ends_with("_skv")));
    }

    #[test]
    fn snapshot_names_are_snake_case() {
        assert_eq!(snake_case("GemmaLocal"), "gemma_local");
        assert_eq!(snake_case("ALiBi"), "ali_bi");
        assert_eq!(snake_case("Doc2Mask"), "doc2_mask");
        assert_eq!(snake_case("already_snake"), "already_snake");
    }

    #[test]
    fn no_backward_is_recorded_not_fatal() {
        // FP8 variants have a forward only.
        let s = spec("F { head_dim: 128, dtype: e4m3, mask: causal }");
        let g = generate(&s, KernelFamily::Sm90Ws).unwrap();
        assert!(!g.forward.is_empty());
        assert!(g.backward.is_err());
        assert!(g.summary().contains("backward: not available"));
    }

    #[test]
    fn the_snapshot_text_hides_only_the_version() {
        let s = spec("A { head_dim: 64, dtype: f16, score: s * 0.5 }");
        let g = generate(&s, KernelFamily::Sm80).unwrap();
        let k = &g.forward[0];
        let text = k.snapshot_text();
        assert!(!text.contains(crate::GENERATOR_VERSION));
        assert!(text.contains("// Generated by flash. Variant `A`"));
        // Everything else is there verbatim.
        for (_, h) in &k.source.headers {
            assert!(text.contains(h.as_str()));
        }
        let without_version: Vec<&str> = k
            .source
            .source
            .lines()
            .filter(|l| !l.contains("Generated by flash"))
            .collect();
        for l in without_version {
            assert!(text.contains(l));
        }
        // A change of the declaration changes the text.
        let t = spec("A { head_dim: 64, dtype: f16, score: s * 0.25 }");
        let other = generate(&t, KernelFamily::Sm80).unwrap();
        assert_ne!(other.forward[0].snapshot_text(), text);
    }
}
