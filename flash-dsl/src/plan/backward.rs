//! The backward pass: three kernels, FlashAttention-2 style, planned from the same spec (same
//! mask analysis, same tile classes) as the forward.
//!
//! 1. [`KernelKind::BackwardPre`]: `delta = rowsum(dO ∘ O)` per query row, and zeroes the fp32
//!    dQ accumulator, one block per query tile.
//! 2. [`KernelKind::BackwardMain`]: one block per (key tile, KV head, batch) — or, in the wgmma
//!    kernel outside the deterministic mode, one persistent block per SM taking those items in
//!    turn (see [`persistent_backward`]) — holds K_j and V_j and walks the query tiles of every query head of its group, skipping the tiles the mask
//!    classification finds empty; it recomputes P from Q, K and the LSE, accumulates dV += Pᵀ·dO
//!    and dK += dSᵀ·Q in registers (so GQA's sum over the group is a register sum, and dK/dV are
//!    deterministic), and adds dQ += dS·K into the fp32 accumulator with atomics. Gradients of
//!    the score's `f32` parameters are added into one fp32 buffer per parameter.
//! 3. [`KernelKind::DqConvert`]: the fp32 accumulator into dQ in the storage type.

use super::block_map::{block_map_operand, BlockMapPlan};
use super::mask::analyse_mask;
use super::operand::{
    arg_layout_with, ArgField, Extent, GridRule, LaunchShape, Layout, Operand, OperandType, Role,
};
use super::tile::{KernelFamily, PlanError, TileConfig};
use super::{
    forward::attention_scalars, forward::sched_operand, forward::ATTENTION_SCALARS, kernel_name,
    KernelKind, KernelPlan, Pipeline,
};
use crate::deriv::{score_gradient, ParamGrad};
use crate::spec::{Expr, ScalarTy, Var, VariantSpec};

use Extent::*;

/// Query rows per block of the pre-processing and convert kernels.
pub const ROWS_PER_BLOCK: u32 = 64;

/// The default backward configuration of the Sm80 family: 128 keys per block (8 warps of 16
/// keys), 64 queries per step. Against 64 keys and 4 warps (the other valid configuration) it
/// halves the dQ atomics and the Q/dO traffic per key.
pub fn default_backward_config() -> TileConfig {
    TileConfig {
        block_m: 64,
        block_n: 128,
        warps: 8,
        stages: 1,
        family: KernelFamily::Sm80,
    }
}

/// The default backward configuration for a device whose fastest forward family is `family`:
/// on sm_90a the wgmma kernel (`Sm90`, two warpgroups of 64 keys; 64 queries per step, 128 at
/// head dims up to 64), where the head dims allow it; elsewhere [`default_backward_config`].
pub fn default_backward_config_for(spec: &VariantSpec, family: KernelFamily) -> TileConfig {
    let mut hopper = TileConfig {
        family: KernelFamily::Sm90,
        ..default_backward_config()
    };
    // 128 queries per step at head dims up to 64 (measured on an H200: 1.3-1.4x the 64-query
    // step on dense and causal); where that kernel spills, the runtime falls back to
    // [`backward_fallback_config`].
    let wide = TileConfig {
        block_m: 128,
        ..hopper
    };
    if backward_config_is_valid(spec, &wide).is_ok() {
        hopper = wide;
    }
    match family {
        KernelFamily::Sm90 | KernelFamily::Sm90Ws
            if backward_config_is_valid(spec, &hopper).is_ok() =>
        {
            hopper
        }
        // Head dims above 128: the mma.sync kernel (the wgmma kernel's K, V and three Q/dO
        // stages need more than 227 KB there), 128 keys per block where they fit, else 64.
        _ if spec.head_dim_qk > 128 || spec.head_dim_v > 128 => {
            let narrow = TileConfig {
                block_n: 64,
                warps: 4,
                ..default_backward_config()
            };
            if backward_config_is_valid(spec, &default_backward_config()).is_ok() {
                default_backward_config()
            } else {
                narrow
            }
        }
        _ => default_backward_config(),
    }
}

/// The configuration a launch that forced none uses instead of the default `cfg` when the
/// default's kernel spills registers (ptxas's report): the wgmma kernel's 64-query step instead
/// of its 128-query step. `None` where there is no narrower step.
pub fn backward_fallback_config(cfg: &TileConfig) -> Option<TileConfig> {
    (cfg.family == KernelFamily::Sm90 && cfg.block_m == 128).then_some(TileConfig {
        block_m: 64,
        ..*cfg
    })
}

/// Checks that the backward skeleton supports `cfg` for `spec`'s head dims.
pub fn backward_config_is_valid(spec: &VariantSpec, cfg: &TileConfig) -> Result<(), PlanError> {
    for (which, value) in [
        ("head_dim_qk", spec.head_dim_qk),
        ("head_dim_v", spec.head_dim_v),
    ] {
        if value == 0 || value % 8 != 0 || value > 256 {
            return Err(PlanError::HeadDim { which, value });
        }
    }
    if !matches!(cfg.family, KernelFamily::Sm80 | KernelFamily::Sm90) {
        return Err(PlanError::BackwardFamily(cfg.family));
    }
    super::tile::sparse_tiles_fit(spec, cfg)?;
    // The wgmma kernel also takes 128 queries per step where dK and dV are narrow enough to
    // leave registers for the 128-wide Sᵀ and dPᵀ.
    let wide_m = cfg.family == KernelFamily::Sm90
        && (cfg.block_m, cfg.block_n, cfg.warps, cfg.stages) == (128, 128, 8, 1)
        && spec.head_dim_qk <= 64
        && spec.head_dim_v <= 64;
    // Above 128, only the mma.sync kernel: its dK and dV stay in registers (16 keys per warp)
    // and spill there, so it is correct but slow (about 70–420 bytes of spills at 160–192,
    // thousands at 256, measured by NVRTC for sm_90a); the wgmma kernel's tiles do not fit.
    let big = spec.head_dim_qk > 128 || spec.head_dim_v > 128;
    if !(wide_m
        || matches!(
            (cfg.block_m, cfg.block_n, cfg.warps, cfg.stages),
            (64, 64, 4, 1) | (64, 128, 8, 1)
        ))
        || (big && cfg.family != KernelFamily::Sm80)
    {
        return Err(PlanError::Backward {
            family: cfg.family,
            block_m: cfg.block_m,
            block_n: cfg.block_n,
            warps: cfg.warps,
            stages: cfg.stages,
            dqk: spec.head_dim_qk,
            dv: spec.head_dim_v,
        });
    }
    let bytes = backward_smem_bytes(spec, cfg);
    if bytes > super::tile::MAX_SMEM_BYTES {
        return Err(PlanError::SharedMemory {
            bytes,
            limit: super::tile::MAX_SMEM_BYTES,
        });
    }
    Ok(())
}

/// The `f32` parameters whose gradient the main kernel accumulates (those the score reads and
/// depends on, and that are not [`frozen`](crate::spec::ParamDecl::frozen)), by param index.
pub fn grad_params(spec: &VariantSpec) -> Vec<usize> {
    let mut out: Vec<usize> = score_gradient(spec)
        .map(|g| g.params.iter().map(|p| p.param).collect())
        .unwrap_or_default();
    out.sort_unstable();
    out.dedup();
    out.retain(|&i| !spec.params[i].frozen && spec.params[i].kind.elem() == ScalarTy::F32);
    out
}

/// The score-gradient terms the main kernel adds into parameter gradients, each with whether
/// the element it reads is the same for every (query, key) of a head (a per-head slope, a
/// scalar): such "uniform" terms are summed per thread and added once per head, and their sums
/// get the correction below.
///
/// The correction: delta is rowsum(dO ∘ O) with O rounded to the storage type (as in
/// FlashAttention), so Σ_k dZ over a row is not exactly 0; a uniform term's gradient
/// Σ dZ·w then carries an error Σ_q (Σ_k dZ)(Σ_k P·w) that grows with w (ALiBi's |q − k|). The
/// main kernel accumulates both row sums (`zsum`, `pw<u>`) and the dQ conversion subtracts
/// their product, which makes the term exact up to fp32 rounding.
pub fn grad_terms(spec: &VariantSpec) -> Vec<(ParamGrad, bool)> {
    let wanted = grad_params(spec);
    let Some(g) = score_gradient(spec) else {
        return Vec::new();
    };
    let reads_position = |e: &Expr| {
        let mut found = false;
        e.visit(&mut |x| found |= matches!(x, Expr::Var(Var::Q | Var::K)));
        found
    };
    g.params
        .into_iter()
        .filter(|t| wanted.contains(&t.param))
        .map(|t| {
            let uniform = !t.index.iter().any(reads_position);
            (t, uniform)
        })
        .collect()
}

/// Whether the wgmma backward kernel forms P as soon as Sᵀ lands (while dPᵀ's product runs) and
/// dS while dV's product runs: where dS does not read S (see [`gradient_reads_score`]; the
/// early P no longer holds S) and no parameter gradient is wanted (measured on an H200: ALiBi's
/// slope gradient ran 9 % slower with the early P than with P and dS formed together).
///
/// Frozen parameters (`ParamDecl::frozen`) do not count as not wanted here: a frozen build
/// keeps its unfrozen build's order of P and dS. (Measured on an H200: with the early P, a
/// frozen `RelativeBias` gave one dK error of 2.30e-2 against the 2× bound of 2.17e-2 — the
/// early P's dS from the rounded P, next to a score hook, sits closer to the bound than the late
/// P's — while the late P passes every case.)
pub fn early_p(spec: &VariantSpec) -> bool {
    let unfrozen = spec.unfrozen();
    !gradient_reads_score(&unfrozen) && grad_params(&unfrozen).is_empty()
}

/// Whether the score's derivative or a parameter-gradient term reads the score `s` itself (a
/// softcap's `1 − tanh²`): then the backward main kernel needs S until dS is formed.
pub fn gradient_reads_score(spec: &VariantSpec) -> bool {
    let Some(g) = score_gradient(spec) else {
        return false;
    };
    let reads_s = |e: &Expr| {
        let mut found = false;
        e.visit(&mut |x| found |= matches!(x, Expr::Var(Var::S)));
        found
    };
    reads_s(&g.d_ds) || grad_terms(spec).iter().any(|(t, _)| reads_s(&t.d))
}

/// Number of uniform gradient terms (see [`grad_terms`]).
pub fn uniform_terms(spec: &VariantSpec) -> usize {
    grad_terms(spec).iter().filter(|(_, u)| *u).count()
}

/// The parameters whose gradient buffer a planned main (or dQ conversion) kernel adds into,
/// read off its argument layout: no symbolic differentiation per launch.
pub fn planned_grad_params(plan: &KernelPlan) -> Vec<usize> {
    plan.args
        .slots
        .iter()
        .filter_map(|s| match s.field {
            ArgField::ParamGrad(i) => Some(i),
            _ => None,
        })
        .collect()
}

/// Whether an operand is one of the correction's row-sum scratch buffers (see [`grad_terms`]).
pub fn is_fix_operand(op: &Operand) -> bool {
    op.name == "zsum" || (op.name.starts_with("pw") && op.name[2..].parse::<u32>().is_ok())
}

/// The row-sum scratch operands of the uniform-term correction: `zsum` and one `pw<u>` per
/// uniform term, each `[batch, heads_q, seq_q]` f32.
fn fix_operands(spec: &VariantSpec, role: Role) -> Vec<Operand> {
    let u = uniform_terms(spec);
    if u == 0 {
        return Vec::new();
    }
    let mut v = vec![flat_f32("zsum", role, &[Batch, HeadsQ, SeqQ])];
    v.extend((0..u).map(|i| flat_f32(&format!("pw{i}"), role, &[Batch, HeadsQ, SeqQ])));
    v
}

fn strided(name: &str, role: Role, spec: &VariantSpec, dims: &[Extent]) -> Operand {
    Operand::new(
        name,
        role,
        OperandType::Storage(spec.dtype),
        dims,
        Layout::Strided,
    )
}

fn flat_f32(name: &str, role: Role, dims: &[Extent]) -> Operand {
    Operand::new(name, role, OperandType::F32, dims, Layout::Contiguous)
}

fn rows_plan(
    spec: &VariantSpec,
    kind: KernelKind,
    operands: Vec<Operand>,
    grads: bool,
    deterministic: bool,
) -> Result<KernelPlan, PlanError> {
    let config = TileConfig {
        block_m: ROWS_PER_BLOCK,
        block_n: 64,
        warps: 4,
        stages: 1,
        family: KernelFamily::Sm80,
    };
    // The dQ conversion applies the uniform-term correction: it reads the params (index
    // expressions) and adds into the gradients.
    let extra: Vec<ArgField> = if grads {
        grad_params(spec)
            .into_iter()
            .map(ArgField::ParamGrad)
            .collect()
    } else {
        Vec::new()
    };
    let args = arg_layout_with(spec, &operands, &ATTENTION_SCALARS, &extra, grads);
    Ok(KernelPlan {
        kind,
        spec: spec.clone(),
        config,
        args,
        operands,
        launch: LaunchShape {
            grid: GridRule::QueryTiles {
                rows: ROWS_PER_BLOCK,
            },
            threads: 128,
            smem_bytes: 0,
        },
        mask: None,
        kernel_name: det_name(kernel_name(kind, spec, &config), deterministic),
        deterministic,
        block_map: None,
        quant: None,
    })
}

fn det_name(name: String, deterministic: bool) -> String {
    if deterministic {
        name + "_det"
    } else {
        name
    }
}

/// The semaphores of the deterministic mode: one per (batch, head, query tile), sized by seq_q
/// (the first `ceil(seq_q / 64)` of each row are used).
fn det_operands(deterministic: bool, role: Role) -> Vec<Operand> {
    if deterministic {
        vec![Operand::new(
            "dq_sem",
            role,
            OperandType::I32,
            &[Batch, HeadsQ, SeqQ],
            Layout::Contiguous,
        )]
    } else {
        Vec::new()
    }
}

/// `delta = rowsum(dO ∘ O)` and a zeroed dQ accumulator.
pub fn plan_backward_pre(spec: &VariantSpec) -> Result<KernelPlan, PlanError> {
    plan_backward_pre_with(spec, false)
}

/// [`plan_backward_pre`], also zeroing the semaphores of the deterministic mode.
pub fn plan_backward_pre_with(
    spec: &VariantSpec,
    deterministic: bool,
) -> Result<KernelPlan, PlanError> {
    let mut ops = vec![
        strided("o", Role::Input, spec, &[Batch, SeqQ, HeadsQ, HeadDimV]),
        strided("dout", Role::Input, spec, &[Batch, SeqQ, HeadsQ, HeadDimV]),
        flat_f32("delta", Role::Output, &[Batch, HeadsQ, SeqQ]),
        flat_f32("dq_accum", Role::Output, &[Batch, SeqQ, HeadsQ, HeadDimQk]),
    ];
    ops.extend(fix_operands(spec, Role::Output));
    ops.extend(det_operands(deterministic, Role::Output));
    rows_plan(spec, KernelKind::BackwardPre, ops, false, deterministic)
}

/// The fp32 dQ accumulator into dQ.
pub fn plan_dq_convert(spec: &VariantSpec) -> Result<KernelPlan, PlanError> {
    let mut ops = vec![
        flat_f32("dq_accum", Role::Input, &[Batch, SeqQ, HeadsQ, HeadDimQk]),
        strided("dq", Role::Output, spec, &[Batch, SeqQ, HeadsQ, HeadDimQk]),
    ];
    ops.extend(fix_operands(spec, Role::Input));
    let fix = uniform_terms(spec) > 0;
    rows_plan(spec, KernelKind::DqConvert, ops, fix, false)
}

/// Shared memory of the main kernel. Sm80: K and V of the block; Q and dO of this step and the
/// next (rows padded to 64 elements for the swizzle); dSᵀ (block_n × block_m); the LSE and delta
/// of both steps. Sm90: 1024 spare bytes to align the wgmma swizzle atoms; K and V; Q, dO, LSE
/// and delta in three stages; dSᵀ of two step parities; ten mbarriers and the persistent block's
/// fetched item (16 bytes).
pub fn backward_smem_bytes(spec: &VariantSpec, cfg: &TileConfig) -> u32 {
    let pad = |d: u32| d.div_ceil(64) * 64;
    let elem = spec.dtype.size() as u32;
    let (dqk, dv) = (pad(spec.head_dim_qk), pad(spec.head_dim_v));
    let (bm, bn) = (cfg.block_m, cfg.block_n);
    if cfg.family == KernelFamily::Sm90 {
        1024 + elem * ((bn + 3 * bm) * (dqk + dv) + 2 * bn * bm) + 3 * 2 * 4 * bm + 96
    } else {
        elem * ((bn + 2 * bm) * (dqk + dv) + bn * bm) + 2 * 2 * 4 * bm
    }
}

/// Bytes of the wgmma kernel's dQ staging tiles: each warpgroup's 64 × 64 fp32 units of one
/// step (see [`dq_by_tma`]).
pub fn dq_staging_bytes(spec: &VariantSpec, cfg: &TileConfig) -> u32 {
    let wg = (cfg.warps / 4).max(1);
    let units = (cfg.block_m / 64) * spec.head_dim_qk.div_ceil(64);
    let per_wg = if units.is_multiple_of(wg) {
        units / wg
    } else {
        units
    };
    wg * per_wg * 64 * 64 * 4
}

/// Whether the wgmma backward kernel adds its dQ tiles into the fp32 accumulator by TMA
/// reductions (`cp.reduce.async.bulk.tensor`) from tiles staged in shared memory, rather than
/// by a vector reduction per pair of elements from registers: where the staging tiles fit, and
/// not in the deterministic mode (which orders per-element reductions through its semaphores).
/// Measured on an H200 (Nsight Compute, d = 128): the per-element reductions held a tenth of
/// the main kernel's stall samples directly — each register they read could not be rewritten
/// until the load/store unit took it — and more at the next shared-memory proxy fence, which
/// waited for them to complete.
pub fn dq_by_tma(spec: &VariantSpec, cfg: &TileConfig, deterministic: bool) -> bool {
    cfg.family == KernelFamily::Sm90
        && !deterministic
        && backward_smem_bytes(spec, cfg) + dq_staging_bytes(spec, cfg)
            <= super::tile::MAX_SMEM_BYTES
}

/// Whether the wgmma backward kernel writes each finished key block's dK and dV by TMA stores
/// (`cp.async.bulk.tensor`) from tiles staged in the dSᵀ buffers and the dQ staging tiles, which
/// are free between two key blocks, rather than by 4-byte stores from registers: where dQ goes by
/// TMA (`dq_by_tma`: the persistent kernel, with its staging tiles) and the staged dK and dV fit
/// in those buffers. Measured on an H200 (Nsight Compute, document mask, d = 128, n = 16384):
/// the register stores — eight half-used sectors per warp instruction — held 5 % of the main
/// kernel's stall samples (10 % at n = 4096, where a key block walks 7 query tiles, not 17).
pub fn dkdv_by_tma(spec: &VariantSpec, cfg: &TileConfig, deterministic: bool) -> bool {
    let pad = |d: u32| d.div_ceil(64) * 64;
    let staged =
        cfg.block_n * (pad(spec.head_dim_qk) + pad(spec.head_dim_v)) * spec.dtype.size() as u32;
    let free =
        2 * cfg.block_n * cfg.block_m * spec.dtype.size() as u32 + dq_staging_bytes(spec, cfg);
    persistent_backward(cfg, deterministic) && dq_by_tma(spec, cfg, deterministic) && staged <= free
}

/// Whether the main kernel is persistent: a block per SM takes (key tile, KV head, batch) items
/// from a launch-wide counter (the forward's `sched` operand), and loads the next item's K, V and
/// first Q/dO tiles before it writes the current item's dK and dV, instead of a block per item
/// paying a launch, a cold prologue and an unhidden epilogue each time — a large share of a
/// short walk (windows, documents, the causal diagonal). The wgmma kernel outside the
/// deterministic mode, whose semaphores need every key tile of a query tile's column to start in
/// index order (a block per item guarantees that; a counter handed out in order does too, but a
/// block holding a later tile could then wait on one not yet fetched by any running block).
pub fn persistent_backward(cfg: &TileConfig, deterministic: bool) -> bool {
    cfg.family == KernelFamily::Sm90 && !deterministic
}

/// The main backward kernel.
pub fn plan_backward_main(spec: &VariantSpec, config: TileConfig) -> Result<KernelPlan, PlanError> {
    plan_backward_main_with(spec, config, false)
}

/// [`plan_backward_main`], in the deterministic mode when asked.
pub fn plan_backward_main_with(
    spec: &VariantSpec,
    config: TileConfig,
    deterministic: bool,
) -> Result<KernelPlan, PlanError> {
    super::tile::fp8_forward_only(spec, "the backward pass")?;
    backward_config_is_valid(spec, &config)?;
    let operands = vec![
        strided("q", Role::Input, spec, &[Batch, SeqQ, HeadsQ, HeadDimQk]),
        strided("k", Role::Input, spec, &[Batch, SeqK, HeadsKv, HeadDimQk]),
        strided("v", Role::Input, spec, &[Batch, SeqK, HeadsKv, HeadDimV]),
        strided("dout", Role::Input, spec, &[Batch, SeqQ, HeadsQ, HeadDimV]),
        flat_f32("lse", Role::Input, &[Batch, HeadsQ, SeqQ]),
        flat_f32("delta", Role::Input, &[Batch, HeadsQ, SeqQ]),
        flat_f32("dq_accum", Role::Output, &[Batch, SeqQ, HeadsQ, HeadDimQk]),
        strided("dk", Role::Output, spec, &[Batch, SeqK, HeadsKv, HeadDimQk]),
        strided("dv", Role::Output, spec, &[Batch, SeqK, HeadsKv, HeadDimV]),
    ];
    // The wgmma kernel loads each step's Q and dO tiles with the tensor memory accelerator, and
    // (see `dq_by_tma`) adds its dQ tiles of 64 rows with it.
    let mut operands = operands;
    if config.family == KernelFamily::Sm90 {
        for op in operands
            .iter_mut()
            .filter(|o| o.name == "q" || o.name == "dout")
        {
            op.tma_rows = Some(config.block_m);
        }
    }
    let dq_tma = dq_by_tma(spec, &config, deterministic);
    if dq_tma {
        let acc = operands
            .iter_mut()
            .find(|o| o.name == "dq_accum")
            .expect("the main kernel has the dQ accumulator");
        acc.tma_rows = Some(64);
    }
    // dK and dV stored by TMA in boxes of a warpgroup's 64 keys (see `dkdv_by_tma`).
    if dkdv_by_tma(spec, &config, deterministic) {
        for op in operands
            .iter_mut()
            .filter(|o| o.name == "dk" || o.name == "dv")
        {
            op.tma_rows = Some(64);
        }
    }
    // Row sums for the uniform-term correction, added into by atomics.
    operands.extend(fix_operands(spec, Role::Output));
    operands.extend(det_operands(deterministic, Role::Output));
    let persistent = persistent_backward(&config, deterministic);
    if persistent {
        operands.push(sched_operand());
    }
    // A data-dependent mask: the transposed block map (per key tile, its query tiles).
    let block_map = BlockMapPlan::for_spec(spec, config.block_m, config.block_n, true);
    if block_map.is_some() {
        operands.push(block_map_operand(Role::Input));
    }
    let grads: Vec<ArgField> = grad_params(spec)
        .into_iter()
        .map(ArgField::ParamGrad)
        .collect();
    let args = arg_layout_with(spec, &operands, &attention_scalars(spec), &grads, true);
    let smem_bytes = backward_smem_bytes(spec, &config)
        + if dq_tma {
            dq_staging_bytes(spec, &config)
        } else {
            0
        };
    Ok(KernelPlan {
        kind: KernelKind::BackwardMain,
        spec: spec.clone(),
        config,
        args,
        operands,
        launch: LaunchShape {
            grid: if persistent {
                GridRule::PersistentKeys {
                    rows: config.block_n,
                    per_sm: super::tile::blocks_per_sm(config.warps * 32, smem_bytes),
                }
            } else {
                GridRule::KeyTilesKvHeads {
                    rows: config.block_n,
                }
            },
            threads: config.warps * 32,
            smem_bytes,
        },
        mask: spec.mask.as_ref().map(|m| analyse_mask(spec, m)),
        kernel_name: det_name(
            kernel_name(KernelKind::BackwardMain, spec, &config),
            deterministic,
        ),
        deterministic,
        block_map,
        quant: None,
    })
}

/// The backward pass: pre-processing, main, dQ convert, in launch order.
pub fn backward_pipeline(spec: &VariantSpec, config: TileConfig) -> Result<Pipeline, PlanError> {
    backward_pipeline_with(spec, config, false)
}

/// [`backward_pipeline`], in the deterministic mode when asked.
pub fn backward_pipeline_with(
    spec: &VariantSpec,
    config: TileConfig,
    deterministic: bool,
) -> Result<Pipeline, PlanError> {
    super::tile::fp8_forward_only(spec, "the backward pass")?;
    Ok(Pipeline {
        kernels: vec![
            plan_backward_pre_with(spec, deterministic)?,
            plan_backward_main_with(spec, config, deterministic)?,
            plan_dq_convert(spec)?,
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_str;

    fn spec(src: &str) -> VariantSpec {
        parse_str(src).expect("parses").remove(0)
    }

    #[test]
    fn head_dims_above_128_take_the_mma_sync_kernel_where_it_fits() {
        let at = |d: u32| {
            let mut s = spec("A { head_dim: 64, dtype: bf16, mask: causal }");
            s.head_dim_qk = d;
            s.head_dim_v = d;
            s
        };
        for d in [160, 192, 256] {
            let s = at(d);
            for fam in [KernelFamily::Sm90, KernelFamily::Sm80] {
                let cfg = default_backward_config_for(&s, fam);
                assert_eq!(cfg.family, KernelFamily::Sm80, "d {d}");
                assert!(backward_config_is_valid(&s, &cfg).is_ok(), "d {d}: {cfg:?}");
                assert!(backward_smem_bytes(&s, &cfg) <= super::super::tile::MAX_SMEM_BYTES);
            }
            // The wgmma kernel is not built above 128, with a message naming the head dims.
            let hopper = TileConfig {
                family: KernelFamily::Sm90,
                ..default_backward_config()
            };
            let e = backward_config_is_valid(&s, &hopper)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("head dims {d}/{d}")), "{e}");
        }
        // At 256 the 128-key block needs more than 227 KB: 64 keys, and the error says so.
        let s = at(256);
        assert_eq!(
            default_backward_config_for(&s, KernelFamily::Sm90).block_n,
            64
        );
        let e = backward_config_is_valid(&s, &default_backward_config())
            .unwrap_err()
            .to_string();
        assert!(e.contains("shared memory") && e.contains("232448"), "{e}");
        assert_eq!(
            default_backward_config_for(&at(192), KernelFamily::Sm90).block_n,
            128
        );
        // At 128 and below nothing changes.
        assert_eq!(
            default_backward_config_for(&at(128), KernelFamily::Sm90).family,
            KernelFamily::Sm90
        );
    }

    #[test]
    fn the_pipeline_is_pre_main_convert_with_their_operands() {
        let s = spec(
            "A { head_dim: 64, dtype: bf16, params: { slopes: [f32; heads], n: i32 }, \
             mask: causal && k < n, score: s + slopes[h] * (k - q) }",
        );
        let p = backward_pipeline(&s, default_backward_config()).unwrap();
        let kinds: Vec<KernelKind> = p.kernels.iter().map(|k| k.kind).collect();
        assert_eq!(
            kinds,
            [
                KernelKind::BackwardPre,
                KernelKind::BackwardMain,
                KernelKind::DqConvert
            ]
        );
        let names =
            |k: &KernelPlan| -> Vec<String> { k.operands.iter().map(|o| o.name.clone()).collect() };
        // The per-head slope is a uniform term: its correction sums travel through all three.
        assert_eq!(uniform_terms(&s), 1);
        assert_eq!(
            names(&p.kernels[0]),
            ["o", "dout", "delta", "dq_accum", "zsum", "pw0"]
        );
        assert_eq!(
            names(&p.kernels[1]),
            ["q", "k", "v", "dout", "lse", "delta", "dq_accum", "dk", "dv", "zsum", "pw0"]
        );
        assert_eq!(names(&p.kernels[2]), ["dq_accum", "dq", "zsum", "pw0"]);
        // What the runtime reads off the plans at launch agrees with the symbolic analysis.
        assert_eq!(planned_grad_params(&p.kernels[1]), grad_params(&s));
        let fix = p.kernels[1].operands.iter().filter(|o| is_fix_operand(o));
        assert_eq!(fix.count(), 1 + uniform_terms(&s));
        // The conversion applies the correction: it reads the params and adds into the gradient.
        assert!(p.kernels[2]
            .args
            .slots
            .iter()
            .any(|s| s.field == ArgField::ParamGrad(0)));
        // The f32 slopes get a gradient buffer; the i32 `n` does not.
        assert_eq!(grad_params(&s), [0]);
        let grads: Vec<&ArgField> = p.kernels[1]
            .args
            .slots
            .iter()
            .map(|s| &s.field)
            .filter(|f| matches!(f, ArgField::ParamGrad(_)))
            .collect();
        assert_eq!(grads, [&ArgField::ParamGrad(0)]);
        // Pre-processing and conversion read no params.
        assert!(!p.kernels[0]
            .args
            .slots
            .iter()
            .any(|s| matches!(s.field, ArgField::Param(_))));
        assert_eq!(
            p.kernels[1].launch.grid,
            GridRule::KeyTilesKvHeads { rows: 128 }
        );
        assert_eq!(
            p.kernels[1].launch.grid.grid(
                |e| match e {
                    SeqK => 300,
                    HeadsKv => 2,
                    Batch => 3,
                    _ => 0,
                },
                132
            ),
            [3, 2, 3]
        );
        assert!(p.kernels[1]
            .kernel_name
            .starts_with("flash_bwd_a_bf16_d64x64"));
        assert!(p.kernels[1].mask.is_some());
    }

    #[test]
    fn the_wgmma_main_kernel_is_persistent_outside_the_deterministic_mode() {
        let s = spec("C { head_dim: 128, dtype: bf16, mask: causal }");
        let cfg = default_backward_config_for(&s, KernelFamily::Sm90Ws);
        assert_eq!(
            (cfg.family, cfg.block_m, cfg.block_n),
            (KernelFamily::Sm90, 64, 128)
        );
        let p = plan_backward_main_with(&s, cfg, false).unwrap();
        // One block per SM at d = 128 (232 KB of shared memory), taking items from the counter.
        let per_sm = super::super::tile::blocks_per_sm(256, p.smem_bytes());
        assert_eq!(per_sm, 1);
        assert_eq!(
            p.launch.grid,
            GridRule::PersistentKeys { rows: 128, per_sm }
        );
        assert!(p.operand(super::super::forward::SCHED_OPERAND).is_some());
        let ext = |seq_k: usize| {
            move |e: Extent| match e {
                SeqK => seq_k,
                HeadsKv => 2,
                Batch => 3,
                _ => 0,
            }
        };
        // 3 key tiles × 2 KV heads × 3 batch elements = 18 items: fewer blocks than SMs.
        assert_eq!(p.launch.grid.grid(ext(300), 132), [18, 1, 1]);
        assert_eq!(p.launch.grid.grid(ext(16384), 132), [132, 1, 1]);
        // The deterministic mode keeps a block per item, in launch order, and no counter.
        let d = plan_backward_main_with(&s, cfg, true).unwrap();
        assert_eq!(d.launch.grid, GridRule::KeyTilesKvHeads { rows: 128 });
        assert!(d.operand(super::super::forward::SCHED_OPERAND).is_none());
        // The mma.sync kernel is not persistent.
        let m = plan_backward_main_with(&s, default_backward_config(), false).unwrap();
        assert_eq!(m.launch.grid, GridRule::KeyTilesKvHeads { rows: 128 });
        // Two 128-thread blocks of 64 keys fit one SM where their shared memory allows.
        assert_eq!(super::super::tile::blocks_per_sm(128, 100_000), 2);
        assert_eq!(super::super::tile::blocks_per_sm(128, 183_000), 1);
        assert_eq!(super::super::tile::blocks_per_sm(256, 100_000), 1);
    }

    #[test]
    fn backward_configs_name_the_value_and_the_limit() {
        // Above 128 the wgmma kernel is not built; the mma.sync kernel's 128 keys at 256 need
        // more shared memory than a block may have.
        let s = spec("C { head_dim: 256, dtype: f16, mask: causal }");
        let hopper = TileConfig {
            family: KernelFamily::Sm90,
            ..default_backward_config()
        };
        let e = backward_pipeline(&s, hopper).unwrap_err().to_string();
        assert!(e.contains("up to 128") && e.contains("256"), "{e}");
        let e = backward_pipeline(&s, default_backward_config())
            .unwrap_err()
            .to_string();
        assert!(e.contains("279552") && e.contains("232448"), "{e}");
        let s = spec("C { head_dim: 64, dtype: f16, mask: causal }");
        let mut cfg = default_backward_config();
        cfg.block_n = 32;
        let e = backward_pipeline(&s, cfg).unwrap_err().to_string();
        assert!(e.contains("64x32x8x1"), "{e}");
        cfg = default_backward_config();
        cfg.family = KernelFamily::Sm90Ws;
        let e = backward_pipeline(&s, cfg).unwrap_err().to_string();
        assert!(
            e.contains("Sm90Ws") && e.contains("Sm80") && e.contains("Sm90 "),
            "{e}"
        );
        // On sm_90a the default is the wgmma kernel, unless the head dims rule it out.
        assert_eq!(
            default_backward_config_for(&s, KernelFamily::Sm90Ws).family,
            KernelFamily::Sm90
        );
        assert_eq!(
            default_backward_config_for(&s, KernelFamily::Sm80),
            default_backward_config()
        );
        let wide = spec("W { head_dim: 192, dtype: f16 }");
        assert_eq!(
            default_backward_config_for(&wide, KernelFamily::Sm90Ws).family,
            KernelFamily::Sm80
        );
        // The supported configurations of both families plan, with their shared memory.
        for family in [KernelFamily::Sm80, KernelFamily::Sm90] {
            for cfg in [
                TileConfig {
                    family,
                    ..default_backward_config()
                },
                TileConfig {
                    block_n: 64,
                    warps: 4,
                    family,
                    ..default_backward_config()
                },
            ] {
                let p = plan_backward_main(&s, cfg).unwrap();
                assert_eq!(p.threads(), cfg.warps * 32);
                let staging = if dq_by_tma(&s, &cfg, false) {
                    dq_staging_bytes(&s, &cfg)
                } else {
                    0
                };
                assert_eq!(p.smem_bytes(), backward_smem_bytes(&s, &cfg) + staging);
                assert!(p.smem_bytes() <= super::super::tile::MAX_SMEM_BYTES);
            }
        }
    }

    #[test]
    fn position_dependent_reads_are_not_uniform() {
        let s = spec(
            "R { head_dim: 64, dtype: bf16, params: { bias: [f32; heads, 256] }, \
             mask: causal, score: s + bias[h, q - k] }",
        );
        assert_eq!(grad_terms(&s).len(), 1);
        assert_eq!(uniform_terms(&s), 0);
        let p = backward_pipeline(&s, default_backward_config()).unwrap();
        assert_eq!(p.kernels[2].operands.len(), 2, "no correction sums");
    }

    #[test]
    fn which_gradients_read_the_score() {
        let read = |src: &str| gradient_reads_score(&spec(src));
        assert!(!read("D { head_dim: 64, dtype: bf16, mask: causal }"));
        assert!(early_p(&spec(
            "D { head_dim: 64, dtype: bf16, mask: causal }"
        )));
        let alibi =
            "A { head_dim: 64, dtype: bf16, params: { m: [f32; heads] }, score: s + m[h] * (k - q) }";
        assert!(!read(alibi));
        assert!(!early_p(&spec(alibi)), "a parameter gradient");
        assert!(
            !early_p(&spec(alibi).with_frozen(&[0])),
            "a frozen build keeps its unfrozen build's order of P and dS"
        );
        assert!(read(
            "S { head_dim: 64, dtype: bf16, params: { cap: f32 }, score: softcap(s, cap) }"
        ));
        // The derivative w.r.t. a multiplier of s reads s.
        assert!(read(
            "M { head_dim: 64, dtype: bf16, params: { w: [f32; heads] }, score: s * w[h] }"
        ));
    }

    #[test]
    fn no_score_or_no_f32_param_means_no_gradient_buffers() {
        let s = spec(
            "P { head_dim: 64, dtype: bf16, params: { prefix: i32 }, mask: k < prefix || causal }",
        );
        assert!(grad_params(&s).is_empty());
        let s =
            spec("S { head_dim: 64, dtype: bf16, params: { cap: f32 }, score: softcap(s, cap) }");
        assert_eq!(grad_params(&s), [0]);
    }

    #[test]
    fn frozen_params_leave_the_backward_kernels() {
        let s = spec(
            "A { head_dim: 64, dtype: bf16, params: { m: [f32; heads] }, mask: causal, score: s + m[h] * (k - q) }",
        );
        let frozen = s.with_frozen(&[0]);
        assert!(grad_params(&frozen).is_empty() && grad_terms(&frozen).is_empty());
        let full = backward_pipeline(&s, default_backward_config()).unwrap();
        let p = backward_pipeline(&frozen, default_backward_config()).unwrap();
        // No gradient buffer, no correction sums (zsum, pw0) in any kernel.
        assert!(planned_grad_params(&p.kernels[1]).is_empty());
        assert!(full.kernels[1].operands.len() > p.kernels[1].operands.len());
        assert_eq!(
            p.kernels[2].operands.len(),
            2,
            "the dQ conversion has no correction"
        );
        for k in &p.kernels {
            assert!(k.kernel_name.ends_with("_frozen_m"), "{}", k.kernel_name);
        }
        // The forward's name does not change.
        let cfg = crate::plan::default_config_for(&frozen, KernelFamily::Sm80);
        assert_eq!(
            kernel_name(KernelKind::Forward, &frozen, &cfg),
            kernel_name(KernelKind::Forward, &s, &cfg)
        );
    }
}
