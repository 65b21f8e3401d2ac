//! CUDA emission: a [`KernelPlan`] becomes one self-contained translation unit.
//!
//! Skeletons live in `templates/<kind>/<family>.cu.hbs` and read top to bottom like the
//! algorithm; the shared pieces are partials in `templates/common/` (argument struct and tile
//! constants, hooks and the tile walk, the accumulator-layout softmax and epilogue, the Hopper
//! wgmma/mbarrier/TMA wrappers). This module only computes what they are filled with: constants,
//! the argument struct's fields (from the plan's operands) and the hook bodies translated from
//! the plan's expression trees (`expr`). Output is a pure function of the plan, so equal
//! plans give byte-identical source (and share a compile-cache entry).

mod expr;
mod wgmma;

use handlebars::Handlebars;
use serde::Serialize;

use crate::deriv::score_gradient;
use crate::plan::{ArgField, KernelFamily, KernelKind, KernelPlan, Layout, Role};
use crate::spec::DType;
use expr::{
    classify_body, grad_field_name, hull_body, mask_bits_body, param_field, query_hull_body, ExprCx,
};

/// The shared partials, by the name skeletons include them with (`{{> name}}`).
pub const PARTIALS: [(&str, &str); 8] = [
    (
        "dropout",
        include_str!("../../templates/common/dropout.cu.hbs"),
    ),
    ("args", include_str!("../../templates/common/args.cu.hbs")),
    ("sm80", include_str!("../../templates/common/sm80.cu.hbs")),
    ("hooks", include_str!("../../templates/common/hooks.cu.hbs")),
    (
        "softmax",
        include_str!("../../templates/common/softmax.cu.hbs"),
    ),
    (
        "hopper",
        include_str!("../../templates/common/hopper.cu.hbs"),
    ),
    (
        "backward",
        include_str!("../../templates/common/backward.cu.hbs"),
    ),
    (
        "common",
        include_str!("../../templates/common/common.cu.hbs"),
    ),
];

/// The skeleton of a kernel kind in a family.
pub fn skeleton(kind: KernelKind, family: KernelFamily) -> &'static str {
    match (kind, family) {
        (KernelKind::Forward | KernelKind::ForwardVarlen, KernelFamily::Sm80) => {
            include_str!("../../templates/forward/sm80.cu.hbs")
        }
        (KernelKind::Forward | KernelKind::ForwardVarlen, KernelFamily::Sm90) => {
            include_str!("../../templates/forward/sm90.cu.hbs")
        }
        (KernelKind::Forward | KernelKind::ForwardVarlen, KernelFamily::Sm90Ws) => {
            include_str!("../../templates/forward/sm90ws.cu.hbs")
        }
        // The planner builds the backward main kernel for the sm80 and sm90 families
        // (`PlanError::BackwardFamily`); pre-processing and the dQ conversion are plain per-row
        // kernels for any family.
        (KernelKind::BackwardMain, KernelFamily::Sm90) => {
            include_str!("../../templates/backward/sm90.cu.hbs")
        }
        (KernelKind::BackwardMain, _) => include_str!("../../templates/backward/sm80.cu.hbs"),
        (KernelKind::BackwardPre, _) => {
            include_str!("../../templates/backward_pre/generic.cu.hbs")
        }
        (KernelKind::DqConvert, _) => include_str!("../../templates/dq_convert/generic.cu.hbs"),
        (KernelKind::BlockMap | KernelKind::BlockMapKeys, _) => {
            include_str!("../../templates/block_map/generic.cu.hbs")
        }
        // Plain mma.sync: any GPU from sm_80.
        (KernelKind::Quantize, _) => include_str!("../../templates/quantize/generic.cu.hbs"),
        (KernelKind::SplitKv | KernelKind::SplitKvPaged | KernelKind::SplitKvPagedVarlen, _) => {
            include_str!("../../templates/splitkv/generic.cu.hbs")
        }
    }
}

/// The device prelude, handed to NVRTC as the named header `flash_prelude.cuh`.
pub const PRELUDE: &str = include_str!("../../templates/prelude.cuh");
/// Include name of [`PRELUDE`].
pub const PRELUDE_NAME: &str = "flash_prelude.cuh";

/// Generated CUDA for one plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CudaSource {
    /// Entry point name.
    pub kernel_name: String,
    /// The translation unit (includes only the named headers below).
    pub source: String,
    /// `(include name, contents)` pairs handed to NVRTC.
    pub headers: Vec<(String, String)>,
    /// Dynamic shared memory per block, bytes.
    pub smem_bytes: u32,
    /// Threads per block.
    pub threads: u32,
}

#[derive(Serialize)]
struct Context {
    generator_version: &'static str,
    variant: String,
    kind: &'static str,
    kernel_name: String,
    arg_fields: Vec<String>,
    args_size: u32,
    dtype: &'static str,
    mma_type: &'static str,
    pack_type: &'static str,
    block_m: u32,
    block_n: u32,
    warps: u32,
    stages: u32,
    dqk: u32,
    dv: u32,
    smem_bytes: u32,
    has_mask: bool,
    has_score: bool,
    mask_expr: String,
    score_expr: String,
    classify_body: String,
    hull_body: String,
    /// Body of the backward's `query_hull` (backward main kernels with a mask).
    qhull_body: String,
    is_bf16: bool,
    /// ∂score/∂s as C++ (backward kinds with a score hook).
    dscore_expr: String,
    /// Parameter-gradient code of the backward kernel (see [`GradCode`]).
    grad_uniform_count: usize,
    grad_element_body: String,
    grad_flush_body: String,
    grad_fix_body: String,
    deterministic: bool,
    /// The wgmma backward forms P early (see `plan::backward::early_p`).
    early_p: bool,
    /// The wgmma backward's warpgroups take their parts of a step by the classes its block map
    /// records (`part_class`): where P forms early and the map records parts.
    part_skip: bool,
    /// The wgmma backward adds dQ by TMA reductions from staged tiles (`plan::backward::dq_by_tma`).
    dq_tma: bool,
    /// The wgmma backward stores dK and dV by TMA from staged tiles (`plan::backward::dkdv_by_tma`).
    dkdv_tma: bool,
    /// The sm90ws forward writes O by TMA stores from staged tiles (`plan::forward::o_by_tma`).
    o_tma: bool,
    /// ... up to this many keys (`plan::forward::o_tma_max_keys`), by register stores beyond.
    o_tma_max_keys: u32,
    /// Planes of 64 columns its staging holds at once (`plan::forward::o_staging_planes`).
    o_staging_planes: u32,
    /// Q tiles of the sm90ws forward (`plan::forward::q_buffers`): 2 lets the producer load the
    /// next work item's Q while the consumers finish the current one.
    q_buffers: u32,
    /// The kernel decides dropout (forward and backward main kernels of a variant with dropout).
    has_dropout: bool,
    /// The dropout probability as a C++ `float` expression over `args`.
    dropout_p: String,
    /// Body of `mask_bits` (masks with lookups of one position; empty otherwise).
    mask_bits_body: String,
    /// The kernel walks (attention kernels) or writes (build kernels) a block map.
    has_block_map: bool,
    /// The map's rows are key tiles (the backward's map).
    map_along_keys: bool,
    /// The 64-key parts whose classes a map entry records (`BlockMapPlan::sub_tiles`).
    map_subs: u32,
    /// The map has one slot per batch / per query head.
    map_per_batch: bool,
    map_per_head: bool,
    /// The build kernel checks a sparsity layout and decides tiles by it.
    map_layout: bool,
    /// The kernel walks its key tiles without a block map and decides them by the sparsity
    /// layout itself (split-KV, paged and packed kernels of a block-sparse variant).
    walk_layout: bool,
    /// The hooks define the layout's look-ups (`map_layout` or `walk_layout`).
    has_layout: bool,
    /// The layout's argument-struct field, blocks, slots per block, leading dims.
    layout_field: String,
    layout_block: u32,
    layout_slots: u32,
    layout_per_batch: bool,
    layout_per_head: bool,
    /// The wgmma wrappers of a Hopper kernel ([`wgmma::hopper_wgmmas`]), as C++.
    wgmma_defs: String,
    /// K and V live in a paged cache (the split-KV kernel over pages).
    paged: bool,
    /// Q and O are packed sequences found through `cu_seqlens_q`.
    varlen: bool,
    /// K and V are packed sequences found through `cu_seqlens_k`.
    varlen_k: bool,
    /// Sequences differ in length (`paged` or `varlen`; `varlen_k` implies `varlen`): the hooks
    /// take a `Seq` with each sequence's lengths and first rows, read once per work item, instead
    /// of the batch index.
    per_seq: bool,
    /// The quantisation kernel: rotate first; write V transposed for P·V; the PTX fp8 type; its largest finite value; the
    /// rotation's f32 normalisation (as `{:e}` text of the exact f32).
    quant_hadamard: bool,
    quant_transpose: bool,
    /// The quantiser keeps its rows in registers (`QuantSpec::in_registers`).
    quant_regs: bool,
    /// The quantiser's scale group (`plan::quantize::ScaleGroup`: 0 block, 1 head, 2 tensor, 3
    /// channel), whether this is the first (amax) pass, whether it is the per-channel reduce
    /// pass, and whether it reads the amaxes of those.
    quant_group: u32,
    quant_amax_pass: bool,
    quant_reduce_pass: bool,
    quant_reads_amax: bool,
    /// ... and whether its scales are per channel (`ScaleGroup::Channel`).
    quant_channels: bool,
    /// The quantiser subtracts K's mean over positions first (`QuantSpec::smooth`), and whether
    /// this is its column-sum pass.
    quant_smooth: bool,
    quant_sum_pass: bool,
    /// ... and whether this is its means pass.
    quant_mean_pass: bool,
    quant_type: String,
    /// The quantiser writes int8 codes (not an fp8 conversion).
    quant_int8: bool,
    quant_max: String,
    quant_norm: String,
    /// Q, K and V are fp8 codes with block scales (`VariantSpec::fp8`); the PTX type.
    fp8: bool,
    /// fp8 with int8 Q and K codes (`qk: int8`): Q·Kᵀ on the integer tensor cores.
    fp8_qk_int8: bool,
    /// fp8 Q and K with bf16 V (`v: bf16`): P·V a bf16 product, no V scales.
    fp8_v_bf16: bool,
    /// `v_layout: rows`: V's codes arrive in rows and the producer warpgroup's spare warps
    /// transpose each tile in shared memory.
    fp8_v_rows: bool,
    fp8_type: String,
    /// How an fp8 variant's scales are grouped (`plan::quantize::ScaleGroup` as a number): 0 per
    /// block of 128 positions, 1 per (batch, head), 2 per tensor; and V's (`v_scales:`), which
    /// may also be 3, per channel.
    fp8_scale_unit: u32,
    fp8_v_scale_unit: u32,
    /// V's scales are grouped apart from Q's and K's (`v_scales:`), and whether per channel.
    fp8_v_own: bool,
    fp8_v_channels: bool,
    /// The fp8 consumers run their tiles as one stream across work items
    /// (`plan::forward::fp8_item_stream`).
    fp8_stream: bool,
}

/// The backward kernels' parameter-gradient code, from `plan::backward::grad_terms`: for each
/// term `∂Z/∂θ[idx]` of the score gradient, either an atomic add per visible element (the element
/// read depends on the query or the key), or a per-thread sum added once per head (it does not:
/// a per-head slope, a scalar), which avoids thousands of atomics on one address; uniform terms
/// also report `P·∂Z/∂θ` (`pw`) for the correction that the dQ conversion applies (`fix`).
#[derive(Default)]
struct GradCode {
    uniform: usize,
    element: String,
    flush: String,
    fix: String,
}

fn grad_code(plan: &KernelPlan, cx: &ExprCx) -> GradCode {
    let mut code = GradCode::default();
    if !matches!(plan.kind, KernelKind::BackwardMain | KernelKind::DqConvert) {
        return code;
    }
    for (term, uniform) in crate::plan::backward::grad_terms(&plan.spec) {
        let field = grad_field_name(&plan.spec.params[term.param]);
        let at = format!("&args.{field}[{}]", cx.flat_index(term.param, &term.index));
        let d = cx.expr(&term.d);
        if !uniform {
            code.element += &format!("  atomicAdd({at}, dz * (float)({d}));\n");
        } else {
            let u = code.uniform;
            code.element += &format!(
                "  {{ const float du = (float)({d}); acc.t[{u}] += dz * du; pw[{u}] = p * du; }}\n"
            );
            code.flush += &format!("  if (lane == 0) atomicAdd({at}, acc.t[{u}]);\n");
            code.fix += &format!("  if (lane == 0) atomicAdd({at}, -part[{u}]);\n");
            code.uniform += 1;
        }
    }
    code
}

/// The templates' handlebars helpers `range` and `add`, in a private module because
/// `handlebars_helper!` declares its structs `pub`.
mod helpers {
    use handlebars::handlebars_helper;

    handlebars_helper!(range: |n: u64| (0..n).collect::<Vec<u64>>());
    handlebars_helper!(add: |a: u64, b: u64| a + b);
}
use helpers::{add, range};

/// The C++ declaration of each argument-struct field, in layout order.
fn arg_fields(plan: &KernelPlan) -> Vec<String> {
    plan.args
        .slots
        .iter()
        .map(|slot| match slot.field {
            ArgField::Pointer(i) => {
                let op = &plan.operands[i];
                let konst = if op.role == Role::Input { "const " } else { "" };
                format!("{konst}{}* {};", op.ty.cpp(), op.name)
            }
            ArgField::Strides(i) => {
                let op = &plan.operands[i];
                debug_assert_eq!(op.layout, Layout::Strided);
                let dims: Vec<&str> = op.dims[..op.dims.len() - 1]
                    .iter()
                    .map(|d| d.name())
                    .collect();
                format!(
                    "long long {}_stride[{}];  // elements, along {}",
                    op.name,
                    dims.len(),
                    dims.join(", ")
                )
            }
            ArgField::Size(e) => format!("int {};", e.name()),
            ArgField::Scale => "float scale;  // softmax scale".to_string(),
            ArgField::ScaleLog2 => "float scale_log2;  // scale · log2(e)".to_string(),
            ArgField::DropoutRng => {
                "unsigned long long drop_seed, drop_offset;  // dropout generator state".to_string()
            }
            ArgField::Param(i) => param_field(&plan.spec.params[i]),
            ArgField::ParamGrad(i) => format!(
                "float* {};  // gradient of `{}`, added into",
                grad_field_name(&plan.spec.params[i]),
                plan.spec.params[i].name
            ),
            ArgField::Tma(i) => format!(
                "FlashTmaDesc {}_tma;  // encoded by the runtime per launch",
                plan.operands[i].name
            ),
        })
        .collect()
}

/// Emits the CUDA source of `plan`.
///
/// The source defines the plan's entry point and static-asserts the argument struct's size;
/// NVRTC compiles it with [`CudaSource::headers`] (no GPU is needed to generate it):
///
/// ```
/// let spec = flash_dsl::parse::parse_str("Causal { head_dim: 64, dtype: bf16, mask: causal }")
///     .unwrap()
///     .remove(0);
/// let plan = flash_dsl::plan(&spec, None).unwrap();
/// let cuda = flash_dsl::emit(&plan);
/// assert_eq!(cuda.kernel_name, plan.kernel_name);
/// assert!(cuda.source.contains(&format!("{}(", cuda.kernel_name)));
/// assert_eq!((cuda.smem_bytes, cuda.threads), (plan.smem_bytes(), plan.threads()));
/// assert!(cuda.headers.iter().any(|(name, _)| name == flash_dsl::emit::PRELUDE_NAME));
/// // Deterministic: equal plans give byte-identical source.
/// assert_eq!(flash_dsl::emit(&plan).source, cuda.source);
/// ```
pub fn emit(plan: &KernelPlan) -> CudaSource {
    let spec = &plan.spec;
    let cfg = plan.config;
    // The forward stores O by TMA (its plan gave O's operand TMA boxes).
    let o_tma = plan.operand("o").is_some_and(|(_, o)| o.tma_rows.is_some());
    let (mma_type, pack_type) = match spec.dtype {
        DType::F16 => ("f16", "f16x2"),
        DType::Bf16 => ("bf16", "bf16x2"),
    };
    let cx = ExprCx {
        params: &spec.params,
        subst: &[],
    };
    let (classify_body, hull_body, mask_expr) = match &plan.mask {
        Some(m) => (
            classify_body(m, &cx),
            hull_body(&m.tree, &m.atoms, &cx),
            cx.expr(&m.expr),
        ),
        None => (String::new(), String::new(), String::new()),
    };
    let qhull_body = match (&plan.mask, plan.kind) {
        (Some(m), KernelKind::BackwardMain | KernelKind::BlockMapKeys) => {
            query_hull_body(&m.tree, &m.atoms, &cx)
        }
        _ => String::new(),
    };
    let grads = grad_code(plan, &cx);
    let dscore_expr = match (plan.kind, score_gradient(spec)) {
        (KernelKind::BackwardMain, Some(g)) => cx.expr(&g.d_ds),
        _ => String::new(),
    };
    let has_dropout = spec.dropout.is_some()
        && matches!(plan.kind, KernelKind::Forward | KernelKind::BackwardMain);
    let dropout_p = match spec.dropout {
        Some(crate::spec::Dropout::Const(v)) => format!("{:?}f", v.get() as f32),
        Some(crate::spec::Dropout::Param(i)) => cx.expr(&crate::spec::Expr::Scalar(i)),
        None => String::new(),
    };
    let paged = matches!(
        plan.kind,
        KernelKind::SplitKvPaged | KernelKind::SplitKvPagedVarlen
    );
    let varlen = matches!(
        plan.kind,
        KernelKind::ForwardVarlen | KernelKind::SplitKvPagedVarlen
    );
    let map_layout = matches!(plan.kind, KernelKind::BlockMap | KernelKind::BlockMapKeys)
        && spec.sparsity.is_some();
    let walk_layout = spec.sparsity.is_some()
        && plan.block_map.is_none()
        && matches!(
            plan.kind,
            KernelKind::SplitKv
                | KernelKind::SplitKvPaged
                | KernelKind::SplitKvPagedVarlen
                | KernelKind::ForwardVarlen
        );
    let ctx = Context {
        generator_version: crate::GENERATOR_VERSION,
        variant: spec.name.clone(),
        kind: plan.kind.name(),
        kernel_name: plan.kernel_name.clone(),
        arg_fields: arg_fields(plan),
        args_size: plan.args.total_size,
        dtype: spec.dtype.name(),
        mma_type,
        pack_type,
        block_m: cfg.block_m,
        block_n: cfg.block_n,
        warps: cfg.warps,
        stages: cfg.stages,
        dqk: spec.head_dim_qk,
        dv: spec.head_dim_v,
        smem_bytes: plan.smem_bytes(),
        has_mask: plan.mask.is_some(),
        has_score: spec.score.is_some(),
        mask_expr,
        score_expr: spec.score.as_ref().map(|e| cx.expr(e)).unwrap_or_default(),
        classify_body,
        hull_body,
        qhull_body,
        is_bf16: spec.dtype == DType::Bf16,
        dscore_expr,
        grad_uniform_count: grads.uniform,
        grad_element_body: grads.element,
        grad_flush_body: grads.flush,
        grad_fix_body: grads.fix,
        deterministic: plan.deterministic,
        early_p: plan.kind == KernelKind::BackwardMain && crate::plan::backward::early_p(spec),
        part_skip: plan.kind == KernelKind::BackwardMain
            && crate::plan::backward::early_p(spec)
            && plan.block_map.is_some_and(|m| m.sub_tiles() >= 2),
        dq_tma: plan.kind == KernelKind::BackwardMain
            && plan
                .operand("dq_accum")
                .is_some_and(|(_, o)| o.tma_rows.is_some()),
        dkdv_tma: plan.kind == KernelKind::BackwardMain
            && plan
                .operand("dk")
                .is_some_and(|(_, o)| o.tma_rows.is_some()),
        o_tma: plan.kind == KernelKind::Forward && o_tma,
        o_tma_max_keys: crate::plan::forward::o_tma_max_keys(spec),
        o_staging_planes: crate::plan::forward::o_staging_planes(spec, &cfg),
        q_buffers: if matches!(plan.kind, KernelKind::Forward | KernelKind::ForwardVarlen) {
            crate::plan::forward::q_buffers(spec, &cfg, o_tma)
        } else {
            1
        },
        has_dropout,
        dropout_p,
        mask_bits_body: plan
            .mask
            .as_ref()
            .and_then(|m| mask_bits_body(&m.expr, &cx))
            .unwrap_or_default(),
        map_layout,
        walk_layout,
        has_layout: map_layout || walk_layout,
        layout_field: spec
            .sparsity
            .map(|sp| format!("p_{}", spec.params[sp.param].name))
            .unwrap_or_default(),
        layout_block: spec.sparsity.map_or(0, |sp| sp.block),
        layout_slots: spec.sparsity.map_or(0, |sp| sp.slots),
        layout_per_batch: spec.sparsity.is_some_and(|sp| sp.per_batch),
        layout_per_head: spec.sparsity.is_some_and(|sp| sp.per_head),
        has_block_map: plan.block_map.is_some(),
        map_along_keys: plan.block_map.is_some_and(|m| m.along_keys),
        map_subs: plan.block_map.map_or(0, |m| m.sub_tiles()),
        map_per_batch: plan.block_map.is_some_and(|m| m.per_batch),
        map_per_head: plan.block_map.is_some_and(|m| m.per_head),
        paged,
        varlen,
        varlen_k: plan.kind == KernelKind::ForwardVarlen,
        per_seq: paged || varlen,
        quant_hadamard: plan.quant.is_some_and(|q| q.hadamard),
        quant_transpose: plan.quant.is_some_and(|q| q.transpose),
        quant_regs: plan.quant.is_some_and(|q| q.in_registers()),
        quant_group: plan.quant.map_or(0, |q| q.group as u32),
        quant_amax_pass: plan.quant.is_some_and(|q| q.amax_pass),
        quant_reduce_pass: plan.quant.is_some_and(|q| q.reduce_pass),
        quant_channels: plan
            .quant
            .is_some_and(|q| q.group == crate::plan::quantize::ScaleGroup::Channel),
        quant_reads_amax: plan
            .quant
            .is_some_and(|q| !q.is_pass() && q.group != crate::plan::quantize::ScaleGroup::Block),
        quant_smooth: plan.quant.is_some_and(|q| q.smooth),
        quant_sum_pass: plan.quant.is_some_and(|q| q.sum_pass),
        quant_mean_pass: plan.quant.is_some_and(|q| q.mean_pass),
        quant_int8: plan
            .quant
            .is_some_and(|q| q.format == crate::fp8::Fp8Format::Int8),
        quant_type: plan
            .quant
            .map(|q| q.format.name().to_string())
            .unwrap_or_default(),
        quant_max: plan
            .quant
            .map(|q| format!("{:?}", q.format.max()))
            .unwrap_or_default(),
        quant_norm: plan
            .quant
            .map(|q| format!("{:e}", q.hadamard_norm()))
            .unwrap_or_default(),
        fp8: spec.fp8.is_some(),
        fp8_qk_int8: spec
            .fp8
            .is_some_and(|f| f.qk_format == crate::fp8::Fp8Format::Int8),
        fp8_v_bf16: spec.fp8.is_some_and(|f| f.v_bf16),
        fp8_v_rows: spec.fp8.is_some_and(|f| f.v_rows),
        fp8_type: spec
            .fp8
            .map(|f| f.format.name().to_string())
            .unwrap_or_default(),
        fp8_scale_unit: spec.fp8.map_or(0, |f| {
            crate::plan::quantize::ScaleGroup::of(f.scaling) as u32
        }),
        fp8_v_scale_unit: spec.fp8.map_or(0, |f| {
            crate::plan::quantize::ScaleGroup::of(f.v_scaling()) as u32
        }),
        fp8_v_own: spec.fp8.is_some_and(|f| f.v_own().is_some()),
        fp8_v_channels: spec
            .fp8
            .is_some_and(|f| f.v_own() == Some(crate::fp8::Scaling::PerChannel)),
        fp8_stream: plan.kind == KernelKind::Forward
            && crate::plan::forward::fp8_item_stream(spec, &cfg),
        wgmma_defs: wgmma::hopper_wgmmas(plan)
            .iter()
            .map(|w| {
                // fp8: Q·Kᵀ over Q's and K's codes (int8 with `qk: int8`), P·V over e4m3 (bf16
                // with `v: bf16`).
                let ty = spec.fp8.map_or(mma_type, |f| {
                    if w.name == "wgmma_s" {
                        f.qk_format.mma_type()
                    } else if f.v_bf16 {
                        "bf16"
                    } else {
                        f.format.mma_type()
                    }
                });
                wgmma::wgmma_def(w, ty)
            })
            .collect::<Vec<_>>()
            .join("\n"),
    };
    let mut hb = Handlebars::new();
    hb.set_strict_mode(true);
    hb.register_escape_fn(handlebars::no_escape);
    hb.register_helper("range", Box::new(range));
    hb.register_helper("add", Box::new(add));
    for (name, text) in PARTIALS {
        hb.register_partial(name, text)
            .unwrap_or_else(|e| panic!("the `{name}` partial parses: {e}"));
    }
    let source = hb
        .render_template(skeleton(plan.kind, cfg.family), &ctx)
        .expect("the skeleton renders for every plan (a failure here is a generator bug)");
    CudaSource {
        kernel_name: plan.kernel_name.clone(),
        source,
        headers: vec![(PRELUDE_NAME.to_string(), PRELUDE.to_string())],
        smem_bytes: plan.smem_bytes(),
        threads: plan.threads(),
    }
}
