//! The variable-length forward kind: a packed batch of sequences of different lengths.
//!
//! Serving and training batches rarely have one length. Padding them to the longest wastes the
//! padded rows' work and memory; a document mask over one long sequence walks (and classifies)
//! key tiles across every document. A packed batch stores the sequences back to back instead —
//! Q as `[1, total_q, heads_q, d]`, K and V as `[1, total_k, heads_kv, d]`, O like Q, the LSE
//! `[1, heads_q, total_q]` — with the `batch + 1` cumulative offsets `cu_seqlens_q` and
//! `cu_seqlens_k` (i32, from 0, non-decreasing, ending at the totals): sequence `b` owns query
//! rows `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` and key rows likewise. Empty sequences are
//! allowed.
//!
//! The kernels are the forward skeletons of every family, with the sequence's offsets applied
//! where they address rows and its own lengths given to the tile walk and to the hooks: masks
//! and score expressions see positions and `seq_q` / `seq_k` of their own sequence (a causal
//! mask is aligned to each sequence's last key), and `b` is the sequence's index. The argument
//! struct's `seq_q` / `seq_k` are the longest sequence's lengths, which size the grid and tensor
//! params over `seq` positions (as for a dense batch padded to them). A query tile past its
//! sequence's end does nothing (the grid has the longest sequence's tiles for every sequence; the
//! persistent kernel skips such items when it fetches them).
//!
//! A mask that reads tensors (document ids, say) is walked without a block map, which is built
//! per batch element of one length: each key tile is classified from the range of the values the
//! mask reads over the tile's rows (warp-collective lookups), so a tile is skipped or run without
//! the mask exactly where the ranges decide it, and otherwise masked per element. A block-sparse
//! layout is read the same way: a key tile whose block the query tile's layout row does not list
//! is skipped (the layout's blocks are whole tiles, so the layout decides whole tiles), with the
//! layout's rows at per-sequence query blocks, its `seq / N` extent sized by the longest
//! sequence. Unlike the dense forward's block-map build, these kernels do not check the layout's
//! entries: one that is no key block of the sequence never matches, i.e. reads as unused (−1).
//!
//! A variant with dropout is served at p = 0: its probability must be a runtime param, which the
//! launch requires to be 0 (the packed kernel applies no dropout; there is no packed backward
//! pass to train with it).
//!
//! What stays outside: a constant dropout probability. [`varlen_unsupported`] says why, and the
//! plan fails with [`PlanError::VarlenVariant`].

use super::forward::{attention_scalars, forward_operands, plan_forward, sched_operand};
use super::operand::{arg_layout, ArgField, Extent, Layout, Operand, OperandType, Role};
use super::tile::{KernelFamily, PlanError, TileConfig};
use super::{kernel_name, KernelKind, KernelPlan};
use crate::spec::VariantSpec;

use Extent::*;

/// The cumulative query offsets of a packed batch (`[batch + 1]` i32).
pub const CU_SEQLENS_Q_OPERAND: &str = "cu_seqlens_q";
/// The cumulative key offsets of a packed batch (`[batch + 1]` i32).
pub const CU_SEQLENS_K_OPERAND: &str = "cu_seqlens_k";

/// Why a variant has no variable-length kernel, or `None`.
pub fn varlen_unsupported(spec: &VariantSpec) -> Option<&'static str> {
    if matches!(spec.dropout, Some(crate::spec::Dropout::Const(_))) {
        // A runtime probability is served at p = 0 (the launch checks it); a constant one
        // cannot be turned off.
        Some("a constant dropout probability cannot be turned off, and the packed kernel does not apply dropout (packed batches have no backward pass); declare the probability as a runtime param and pass p = 0")
    } else {
        None
    }
}

/// The packed forward kernel's operands: Q, K, V, O as `[1, total, heads, d]` (strided, like the
/// forward's), the LSE `[1, heads_q, total_q]` (contiguous), the two offset arrays, and the
/// persistent kernel's work counter on the warp-specialised family.
pub fn varlen_operands(spec: &VariantSpec, cfg: &TileConfig) -> Vec<Operand> {
    let mut ops = forward_operands(spec, cfg);
    ops[0].dims = vec![Packed, TotalQ, HeadsQ, HeadDimQk];
    ops[1].dims = vec![Packed, TotalK, HeadsKv, HeadDimQk];
    ops[2].dims = vec![Packed, TotalK, HeadsKv, HeadDimV];
    ops[3].dims = vec![Packed, TotalQ, HeadsQ, HeadDimV];
    ops[4].dims = vec![Packed, HeadsQ, TotalQ];
    for name in [CU_SEQLENS_Q_OPERAND, CU_SEQLENS_K_OPERAND] {
        ops.push(Operand::new(
            name,
            Role::Input,
            OperandType::I32,
            &[CuLen],
            Layout::Contiguous,
        ));
    }
    if cfg.family == KernelFamily::Sm90Ws {
        ops.push(sched_operand());
    }
    ops
}

/// Plans the packed (variable-length) forward kernel of `spec` with `config`: the forward's tile
/// rules and templates (see the module docs).
///
/// ```
/// use flash_dsl::plan::varlen::plan_varlen;
/// use flash_dsl::plan::{default_config_for, KernelFamily};
///
/// let spec = flash_dsl::parse::parse_str("Causal { head_dim: 128, dtype: bf16, mask: causal }")
///     .unwrap()
///     .remove(0);
/// let p = plan_varlen(&spec, default_config_for(&spec, KernelFamily::Sm90Ws)).unwrap();
/// assert!(p.kernel_name.starts_with("flash_fwdv_causal_bf16"));
/// assert!(p.operand("cu_seqlens_q").is_some() && p.operand("cu_seqlens_k").is_some());
///
/// // A document-id mask inside the packed sequences: classified by range lookups, no block map.
/// let doc = flash_dsl::parse::parse_str(
///     "Doc { head_dim: 64, dtype: bf16, params: { doc: [i32; seq] }, mask: doc[q] == doc[k] }",
/// )
/// .unwrap()
/// .remove(0);
/// let p = plan_varlen(&doc, default_config_for(&doc, KernelFamily::Sm80)).unwrap();
/// assert!(p.block_map.is_none() && p.operand("block_map").is_none());
///
/// // A constant dropout probability has no packed kernel (a runtime one is served at p = 0).
/// let drop = flash_dsl::parse::parse_str(
///     "Drop { head_dim: 64, dtype: bf16, dropout: 0.1 }",
/// )
/// .unwrap()
/// .remove(0);
/// assert!(plan_varlen(&drop, default_config_for(&drop, KernelFamily::Sm80)).is_err());
/// ```
pub fn plan_varlen(spec: &VariantSpec, config: TileConfig) -> Result<KernelPlan, PlanError> {
    super::tile::fp8_forward_only(spec, "the packed (variable-length) kernel")?;
    if let Some(why) = varlen_unsupported(spec) {
        return Err(PlanError::VarlenVariant(why));
    }
    // The forward kernel's plan (tile rules, launch shape, mask analysis; no block map, see
    // above), over the packed operands and with the totals among the scalars.
    let mut p = plan_forward(spec, config)?;
    // No block map (see the module docs): the tile walk classifies by the mask's range lookups.
    p.block_map = None;
    p.operands = varlen_operands(spec, &config);
    // O leaves by register stores (a TMA box could cross into the next sequence): no staging,
    // which may leave room for a second Q tile.
    p.launch.smem_bytes = super::tile::smem_bytes(spec, &config)
        + super::forward::second_q_bytes(spec, &config, false);
    let mut scalars = attention_scalars(spec);
    scalars.extend([ArgField::Size(TotalQ), ArgField::Size(TotalK)]);
    p.args = arg_layout(spec, &p.operands, &scalars);
    p.kind = KernelKind::ForwardVarlen;
    p.kernel_name = kernel_name(KernelKind::ForwardVarlen, spec, &config);
    Ok(p)
}

/// The checks of a packed batch's host offsets against its totals: `batch + 1` entries, the
/// first 0, non-decreasing, the last the total. Returns the longest sequence, or a message that
/// names the offending entry.
///
/// ```
/// use flash_dsl::plan::varlen::check_cu_seqlens;
///
/// assert_eq!(check_cu_seqlens("cu_seqlens_q", &[0, 3, 3, 10], 10), Ok(7));
/// assert!(check_cu_seqlens("cu_seqlens_q", &[0, 5, 4], 4).unwrap_err().contains("[2]"));
/// assert!(check_cu_seqlens("cu_seqlens_k", &[0, 5], 6).unwrap_err().contains("6"));
/// ```
pub fn check_cu_seqlens(name: &str, cu: &[i32], total: usize) -> Result<usize, String> {
    if cu.is_empty() {
        return Err(format!(
            "{name} is empty; a batch of n sequences has n + 1 offsets, starting at 0"
        ));
    }
    if cu[0] != 0 {
        return Err(format!("{name}[0] is {}; the offsets start at 0", cu[0]));
    }
    let mut longest = 0usize;
    for (i, w) in cu.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(format!(
                "{name}[{}] is {} but {name}[{i}] is {}; the offsets must not decrease",
                i + 1,
                w[1],
                w[0]
            ));
        }
        longest = longest.max((w[1] - w[0]) as usize);
    }
    let last = *cu.last().expect("not empty");
    if last as usize != total {
        return Err(format!(
            "{name}[{}] is {last}; it must equal the packed tensors' {total} tokens",
            cu.len() - 1
        ));
    }
    Ok(longest)
}
