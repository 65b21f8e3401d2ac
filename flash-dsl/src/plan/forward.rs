//! The forward kind: one kernel per query tile computes O and the LSE.
//!
//! This is the worked example of a kernel kind: its operands (Q, K, V in, O and LSE out), the
//! launch scalars it reads, its grid rule and its launch shape. Everything else — the argument
//! struct, the launch checks, the packing — follows from this list.

use super::block_map::{block_map_operand, BlockMapPlan};
use super::mask::analyse_mask;
use super::operand::{
    arg_layout, ArgField, Extent, GridRule, LaunchShape, Layout, Operand, OperandType, Role,
};
use super::tile::{config_is_valid, smem_bytes, KernelFamily, PlanError, TileConfig};
use super::{kernel_name, KernelKind, KernelPlan};
use crate::spec::VariantSpec;

use Extent::*;

/// The work counter of a persistent kernel (see [`plan_forward`]).
pub const SCHED_OPERAND: &str = "sched";

/// The persistent kernels' launch-wide work counter: one `i32`, zero between launches (each
/// launch's last fetch resets it).
pub fn sched_operand() -> Operand {
    Operand::new(
        SCHED_OPERAND,
        Role::Output,
        OperandType::I32,
        &[],
        Layout::Contiguous,
    )
}

/// The scalars every attention kernel reads.
pub const ATTENTION_SCALARS: [ArgField; 7] = [
    ArgField::Size(Batch),
    ArgField::Size(HeadsQ),
    ArgField::Size(HeadsKv),
    ArgField::Size(SeqQ),
    ArgField::Size(SeqK),
    ArgField::Scale,
    ArgField::ScaleLog2,
];

/// [`ATTENTION_SCALARS`], then the dropout generator's state for variants with dropout (the
/// kernels that decide which probabilities survive: the forward and the backward main kernel).
pub fn attention_scalars(spec: &VariantSpec) -> Vec<ArgField> {
    let mut s = ATTENTION_SCALARS.to_vec();
    if spec.dropout.is_some() {
        s.push(ArgField::DropoutRng);
    }
    s
}

/// Q, K, V (`[batch, seq, heads, head_dim]`, strided), O (strided) and the LSE (contiguous
/// `[batch, heads_q, seq_q]` f32, natural log). TMA families load Q, K and V through
/// descriptors with boxes of the tile's rows.
///
/// An fp8 variant (`dtype: e4m3`, see [`fp8_operands`]) reads codes and scales instead.
pub fn forward_operands(spec: &VariantSpec, cfg: &TileConfig) -> Vec<Operand> {
    if let Some(f) = spec.fp8 {
        return fp8_operands(spec, cfg, f);
    }
    let elem = OperandType::Storage(spec.dtype);
    let tma = cfg.family == KernelFamily::Sm90Ws;
    let mut q = Operand::new(
        "q",
        Role::Input,
        elem,
        &[Batch, SeqQ, HeadsQ, HeadDimQk],
        Layout::Strided,
    );
    let mut k = Operand::new(
        "k",
        Role::Input,
        elem,
        &[Batch, SeqK, HeadsKv, HeadDimQk],
        Layout::Strided,
    );
    let mut v = Operand::new(
        "v",
        Role::Input,
        elem,
        &[Batch, SeqK, HeadsKv, HeadDimV],
        Layout::Strided,
    );
    if tma {
        q.tma_rows = Some(cfg.block_m);
        k.tma_rows = Some(cfg.block_n);
        v.tma_rows = Some(cfg.block_n);
    }
    let o = Operand::new(
        "o",
        Role::Output,
        elem,
        &[Batch, SeqQ, HeadsQ, HeadDimV],
        Layout::Strided,
    );
    let lse = Operand::new(
        "lse",
        Role::Output,
        OperandType::F32,
        &[Batch, HeadsQ, SeqQ],
        Layout::Contiguous,
    );
    vec![q, k, v, o, lse]
}

/// The fp8 forward's operands: Q and K codes `[batch, seq, heads, d]` (strided, one byte
/// each; int8 with `qk: int8`), V's e4m3 codes transposed for the second product — a `[batch,
/// d, heads_kv, seq_padded]` view (strided) of the quantiser's `[batch, heads_kv, d,
/// seq_padded]` output, keys in `crate::fp8::mma_key_order` within each group of 32,
/// `seq_padded` whole scale blocks — then O (the output dtype) and the LSE as usual, then the
/// f32 scales of Q, K and V, contiguous, as the variant's `scales:` groups them: `[batch,
/// heads, blocks]` (one per block of 128 positions of each (batch, head), the default),
/// `[batch, heads]` (`per_head`) or one value (`per_tensor`) — V's as `v_scales:` groups them
/// where it does, `[batch, heads_kv, dv]` for `per_channel` — and a code times its group's scale
/// is the value. All three are loaded by TMA: Q and K in 128-byte rows (one or two per position; at
/// d 64 the box's upper half zero-filled), V in boxes of 128 keys × d rows. With `v_layout:
/// rows` V's codes are `[batch, seq_k, heads_kv, d]` like K's (in key order), loaded as K is
/// and transposed by the kernel.
pub fn fp8_operands(
    spec: &VariantSpec,
    cfg: &TileConfig,
    fp8: crate::fp8::Fp8Spec,
) -> Vec<Operand> {
    let codes = OperandType::Fp8(fp8.format);
    let qk_codes = OperandType::Fp8(fp8.qk_format);
    let mut q = Operand::new(
        "q",
        Role::Input,
        qk_codes,
        &[Batch, SeqQ, HeadsQ, HeadDimQk],
        Layout::Strided,
    );
    let mut k = Operand::new(
        "k",
        Role::Input,
        qk_codes,
        &[Batch, SeqK, HeadsKv, HeadDimQk],
        Layout::Strided,
    );
    // `v: bf16`: V as the bf16 forward reads it, `[batch, seq_k, heads_kv, dv]`, no scales.
    let mut v = if fp8.v_bf16 || fp8.v_rows {
        let ty = if fp8.v_bf16 {
            OperandType::Storage(crate::spec::DType::Bf16)
        } else {
            codes
        };
        Operand::new(
            "v",
            Role::Input,
            ty,
            &[Batch, SeqK, HeadsKv, HeadDimV],
            Layout::Strided,
        )
    } else {
        Operand::new(
            "v",
            Role::Input,
            codes,
            &[Batch, HeadDimV, HeadsKv, SeqPadded],
            Layout::Strided,
        )
    };
    q.tma_rows = Some(cfg.block_m);
    k.tma_rows = Some(cfg.block_n);
    v.tma_rows = Some(if fp8.v_bf16 || fp8.v_rows {
        cfg.block_n
    } else {
        spec.head_dim_v
    });
    let scales = |name: &str, scaling: crate::fp8::Scaling, heads: Extent, blocks: Extent| {
        let dims: &[Extent] = match scaling {
            crate::fp8::Scaling::PerBlock { .. } => &[Batch, heads, blocks],
            crate::fp8::Scaling::PerHead => &[Batch, heads],
            crate::fp8::Scaling::PerTensor => &[],
            crate::fp8::Scaling::PerChannel => &[Batch, heads, HeadDimV],
        };
        Operand::new(
            name,
            Role::Input,
            OperandType::F32,
            dims,
            Layout::Contiguous,
        )
    };
    let mut ops = vec![
        q,
        k,
        v,
        Operand::new(
            "o",
            Role::Output,
            OperandType::Storage(spec.dtype),
            &[Batch, SeqQ, HeadsQ, HeadDimV],
            Layout::Strided,
        ),
        Operand::new(
            "lse",
            Role::Output,
            OperandType::F32,
            &[Batch, HeadsQ, SeqQ],
            Layout::Contiguous,
        ),
        scales("q_scale", fp8.scaling, HeadsQ, ScaleBlocksQ),
        scales("k_scale", fp8.scaling, HeadsKv, ScaleBlocks),
    ];
    if !fp8.v_bf16 {
        ops.push(scales("v_scale", fp8.v_scaling(), HeadsKv, ScaleBlocks));
    }
    ops
}

/// Planes of 64 columns of O the sm90ws forward's staging holds at once: all of O's, except
/// fp8 tiles of more than 128 keys, which stage one plane at a time (two planes left room for
/// one Q tile only and cost those kernels 6-12 %, [`o_by_tma`]). The template's `SO_PLANES`.
pub fn o_staging_planes(spec: &VariantSpec, cfg: &TileConfig) -> u32 {
    if spec.fp8.is_some() && cfg.block_n > 128 {
        1
    } else {
        spec.head_dim_v.div_ceil(64)
    }
}

/// Bytes of shared memory the sm90ws forward stages O in for its TMA stores: a box of 64 rows
/// per consumer warpgroup (`block_m` rows in all) in [`o_staging_planes`] planes of 64 columns
/// of 128-byte rows.
pub fn o_staging_bytes(spec: &VariantSpec, cfg: &TileConfig) -> u32 {
    cfg.block_m * o_staging_planes(spec, cfg) * 128
}

/// Whether the sm90ws forward can write O by TMA stores (`cp.async.bulk.tensor`) of tiles
/// staged in shared memory rather than by 4-byte stores from registers, where the staging tiles
/// fit beside the K/V stages: masked or block-sparse variants with tiles of up to 128 queries,
/// and plain dense variants at head dims up to 64 (which take it only on short walks, see
/// [`o_tma_max_keys`]); not a packed batch (whose sequences a box could cross) nor fp8 outside
/// its stream (below). The store is asynchronous, so a consumer starts its next item while O
/// drains, and it writes whole lines where the accumulator layout gives each thread two columns
/// of each 8-column tile. Measured on an H200
/// against register stores, same call (`bench/results/ab-o-tma/README.md`): causal d128
/// +9 / +3 / +1 % (n 1k / 4k / 16k), document +6-12 %, window +3-4 %, BigBird +7-8 %; masked
/// d64 then within ±1.5 %, and +2.6 % at causal n 1k once the overlapped consumers ran across
/// items (`bench/results/ab-item-stream/`). Plain dense (`bench/results/ab-shape-defaults/`):
/// d64 +3 / +2 / +5 % with TMA stores up to 2048 keys, d128 lost 5 % at n 4k with the staging
/// allocated even where it went unused, so d128 keeps register stores.
///
/// The fp8 stream ([`fp8_item_stream`]) with tiles of up to 128 keys stores O by TMA at every
/// length, dense or masked. A clock trace of its item boundary (H200,
/// `bench/results/fp8-o-tma-2026-11-28/`) had the register stores' epilogue at ~2800-3500
/// clocks against a ~2350-clock tile: both warpgroups' 4-byte stores queue on the SM's one
/// load/store path while no product is issued. Same call against register stores, d128: V per
/// channel with Q/K per block +9.8 / +9.2 % (n 4k / 16k), causal +4.4 / +1.1 %; per head causal
/// +2.7 % at n 4k, the rest within the run's noise (bf16 moved 3 %). Tiles of 192 keys (the
/// per-head default) lost 6-12 % with a two-plane staging, which left room for one Q tile only
/// ([`q_buffers`]); they stage one 64-column plane at a time ([`o_staging_bytes`]), and with
/// that the causal ones gained and the dense ones lost, same call
/// (`bench/results/fp8-o-tma-192-2026-11-28/`): causal +5.1 / +3.7 % (n 4k / 16k), dense
/// −3.9 / −6.2 % (the dense kernel's steady loop, which the epilogue does not touch, came out
/// of ptxas scheduled differently). So masked 192-key tiles store by TMA, unmasked ones from
/// registers.
pub fn o_by_tma(spec: &VariantSpec, cfg: &TileConfig) -> bool {
    let fits = smem_bytes(spec, cfg) + o_staging_bytes(spec, cfg) <= super::tile::MAX_SMEM_BYTES;
    if spec.fp8.is_some() {
        // 192-key tiles only where a mask (causal) makes items end unevenly: the unmasked
        // 192-key kernel ran 4-6 % slower with the staging (its steady loop scheduled apart).
        return fp8_item_stream(spec, cfg)
            && cfg.block_m <= 128
            && (cfg.block_n <= 128 || spec.mask.is_some())
            && fits;
    }
    let dense = spec.mask.is_none() && spec.sparsity.is_none();
    // 192-row tiles of masked variants above d64 (tuner candidates) keep register stores: with
    // the staging's epilogue the causal d128 one spills 12 bytes.
    let wanted = if dense {
        spec.head_dim_qk.max(spec.head_dim_v) <= 64
    } else {
        cfg.block_m <= 128
    };
    cfg.family == KernelFamily::Sm90Ws && wanted && fits
}

/// The longest key sequence (`seq_k`) at which a kernel that [`o_by_tma`] stores O by TMA:
/// every length for masked, block-sparse and fp8 variants, up to [`DENSE_O_TMA_MAX_KEYS`] for
/// plain dense bf16/f16 ones, whose long walks measured slower with it (see [`o_by_tma`]). The
/// kernel compares at run time, so one compiled kernel serves every length.
pub fn o_tma_max_keys(spec: &VariantSpec) -> u32 {
    if spec.fp8.is_none() && spec.mask.is_none() && spec.sparsity.is_none() {
        DENSE_O_TMA_MAX_KEYS
    } else {
        i32::MAX as u32
    }
}

/// Plain dense forwards store O by TMA up to this many keys (16 steps of 128): at d128 TMA stores
/// measured gains at 1024 keys and losses at 4096 and above; 2048 was not measured.
pub const DENSE_O_TMA_MAX_KEYS: u32 = 2048;

/// Whether the sm90ws fp8 forward's consumers run their tiles as one stream across work items:
/// at an item's end the next item's first Q·Kᵀ goes with this item's last P·V and its softmax
/// runs under it, then this item's epilogue (the bf16 kernel's overlapped schedule does the
/// same). Taken with three stages (the overlapped schedule), head dim ≤ 128 and one V scale an
/// item — V scaled per head, per tensor or per channel (`scales:` or `v_scales:`), or bf16 V
/// ([`crate::fp8::Fp8Spec::v_fixed`]); Q's and K's scales may be per block. H200, same call, against items one
/// after another (`bench/results/ab-fp8-item-stream/`): per head with 192-key tiles +4.6 to
/// +6.0 % dense (n 4k / 16k), +6.9 to +8.4 % causal; int8 Q·K with bf16 V +1 to +4 %. With V
/// scales per block (a rescale of O every tile) the stream measured 2-7 % slower, and at head
/// dim 256 it spilled (136 bytes): those keep items one after another.
pub fn fp8_item_stream(spec: &VariantSpec, cfg: &TileConfig) -> bool {
    spec.fp8.is_some_and(|f| f.v_fixed())
        && cfg.family == KernelFamily::Sm90Ws
        && cfg.stages == 3
        && spec.head_dim_v <= 128
}

/// Bytes of one Q tile in the forward's shared memory (rows padded to 64 elements for the
/// 128-byte swizzle; one byte per element for fp8).
pub fn q_tile_bytes(spec: &VariantSpec, cfg: &TileConfig) -> u32 {
    let elem = if spec.fp8.is_some() {
        1
    } else {
        spec.dtype.size() as u32
    };
    // fp8: whole 128-byte planes (see `tile::smem_bytes`).
    let row = if spec.fp8.is_some() { 128 } else { 64 };
    cfg.block_m * spec.head_dim_qk.div_ceil(row) * row * elem
}

/// How many Q tiles the sm90ws forward holds: two where a second one fits beside the K/V
/// stages (and the O staging, when `o_tma`: [`o_by_tma`]), else one. With two, the producer
/// loads the next work item's Q — and then its first K/V tiles — while the consumers are still
/// in the current item, instead of after their last Q·Kᵀ of it: on short walks (n 1k, windows,
/// documents) the consumers otherwise wait for that copy at every item.
pub fn q_buffers(spec: &VariantSpec, cfg: &TileConfig, o_tma: bool) -> u32 {
    // Three consumer warpgroups (16 warps) run at 160 registers a thread, and the second slot's
    // bookkeeping made the dense d128 192 × 128 consumer spill 8 bytes: they keep one.
    if cfg.family != KernelFamily::Sm90Ws || cfg.warps > 12 {
        return 1;
    }
    let staging = if o_tma { o_staging_bytes(spec, cfg) } else { 0 };
    if smem_bytes(spec, cfg) + staging + q_tile_bytes(spec, cfg) <= super::tile::MAX_SMEM_BYTES {
        2
    } else {
        1
    }
}

/// Shared memory of the second Q tile, where [`q_buffers`] gives one (0 otherwise).
pub fn second_q_bytes(spec: &VariantSpec, cfg: &TileConfig, o_tma: bool) -> u32 {
    (q_buffers(spec, cfg, o_tma) - 1) * q_tile_bytes(spec, cfg)
}

/// Plans the forward kernel of `spec` with `config`.
pub fn plan_forward(spec: &VariantSpec, config: TileConfig) -> Result<KernelPlan, PlanError> {
    config_is_valid(spec, &config)?;
    let mut operands = forward_operands(spec, &config);
    let o_tma = o_by_tma(spec, &config);
    if o_tma {
        let o = operands
            .iter_mut()
            .find(|o| o.name == "o")
            .expect("the forward has an O");
        o.tma_rows = Some(64);
    }
    // The persistent warp-specialised kernel takes its work items from a launch-wide counter
    // (one `i32`, zero between launches: the kernel's last fetch resets it).
    if config.family == KernelFamily::Sm90Ws {
        operands.push(sched_operand());
    }
    // A data-dependent mask: the kernel walks a block map instead of classifying tiles.
    let block_map = BlockMapPlan::for_spec(spec, config.block_m, config.block_n, false);
    if block_map.is_some() {
        operands.push(block_map_operand(Role::Input));
    }
    let args = arg_layout(spec, &operands, &attention_scalars(spec));
    Ok(KernelPlan {
        kind: KernelKind::Forward,
        spec: spec.clone(),
        config,
        args,
        operands,
        launch: LaunchShape {
            // The warp-specialised kernel is persistent (see its template).
            grid: if config.family == KernelFamily::Sm90Ws {
                GridRule::Persistent {
                    rows: config.block_m,
                }
            } else {
                GridRule::QueryTiles {
                    rows: config.block_m,
                }
            },
            threads: config.warps * 32,
            smem_bytes: smem_bytes(spec, &config)
                + if o_tma {
                    o_staging_bytes(spec, &config)
                } else {
                    0
                }
                + second_q_bytes(spec, &config, o_tma),
        },
        mask: spec.mask.as_ref().map(|m| analyse_mask(spec, m)),
        kernel_name: kernel_name(KernelKind::Forward, spec, &config),
        deterministic: false,
        block_map,
        quant: None,
    })
}
