//! Kernels described by data: each plan lists its operands, and everything that depends on
//! them — the kernel's argument struct and its byte layout, the C++ mirror of that struct, the
//! launch-time checks and the packing — is derived from that list, never written per operand.
//!
//! A new kernel kind (backward, combine, block-map build, quantise) declares its operands in its
//! own planning function (see `plan::forward` for the worked example) and gets the argument
//! struct, the checks and the packing for free.

use serde::{Deserialize, Serialize};

use crate::spec::{DType, ParamKind, VariantSpec};

/// Element type of an operand. Sizes come from here, never from a literal: a future 1-byte
/// storage type passes through the same code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OperandType {
    /// The variant's storage type (bf16, f16).
    Storage(DType),
    /// 32-bit float (the LSE, fp32 accumulators, softmax statistics).
    F32,
    /// 32-bit signed integer (block maps, the persistent kernel's work counter).
    I32,
    /// 8-bit float codes (see `crate::fp8`), their scales in a separate f32 operand.
    Fp8(crate::fp8::Fp8Format),
}

impl OperandType {
    /// Bytes per element.
    pub fn size(self) -> u32 {
        match self {
            OperandType::Storage(d) => d.size() as u32,
            OperandType::F32 | OperandType::I32 => 4,
            OperandType::Fp8(_) => 1,
        }
    }
    /// Short name for messages and bindings: the dtype's name for storage, else `f32` / `i32`.
    pub fn name(self) -> &'static str {
        match self {
            OperandType::Storage(d) => d.name(),
            OperandType::F32 => "f32",
            OperandType::I32 => "i32",
            OperandType::Fp8(f) => f.name(),
        }
    }
    /// The C++ element type of the operand's pointer in the argument struct (storage types are
    /// raw bits: the kernels convert through the prelude's PTX wrappers).
    pub fn cpp(self) -> &'static str {
        match self {
            OperandType::Storage(d) => match d.size() {
                1 => "u8",
                _ => "u16",
            },
            OperandType::F32 => "float",
            OperandType::I32 => "int",
            OperandType::Fp8(_) => "unsigned char",
        }
    }
}

/// A named extent of a launch. Head dims are fixed by the spec; the others are read off the
/// bound tensors at launch (the first operand that has one defines it, every later one must
/// agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Extent {
    /// Batch size.
    Batch,
    /// Query positions.
    SeqQ,
    /// Key/value positions.
    SeqK,
    /// Query (and output) heads.
    HeadsQ,
    /// Key/value heads (a divisor of `HeadsQ`: GQA / MQA).
    HeadsKv,
    /// Head dim of Q and K, fixed by the spec.
    HeadDimQk,
    /// Head dim of V and O, fixed by the spec.
    HeadDimV,
    /// Words of the block map (see `plan::block_map`), derived from the others and the plan.
    MapLen,
    /// Key-range splits of a split-KV launch (see `plan::splitkv`), chosen by the runtime; 0
    /// for a launch of one split, whose partial workspaces are empty (the attention kernel
    /// writes O and the LSE itself).
    Splits,
    /// Pages of a paged KV cache.
    Pages,
    /// Key positions per page of a paged KV cache.
    PageSize,
    /// Entries per sequence of a paged cache's page table.
    MaxPages,
    /// The leading dimension of packed (variable-length) tensors, always 1: Q `[1, total_q,
    /// heads_q, d]` holds every sequence's tokens back to back (see `plan::varlen`).
    Packed,
    /// Query tokens of a packed batch, all sequences together.
    TotalQ,
    /// Key tokens of a packed batch, all sequences together.
    TotalK,
    /// Entries of a packed batch's cumulative offsets (`cu_seqlens_q`, `cu_seqlens_k`):
    /// `batch + 1`.
    CuLen,
    /// Blocks of rows with one scale each, per (batch, head), of a block-quantised tensor:
    /// `ceil(seq / block_rows)`.
    ScaleBlocks,
    /// Positions of a transposed fp8 V, `ceil(seq / block_rows) · block_rows` (whole blocks, the
    /// padding zeros).
    SeqPadded,
    /// Scale blocks of an fp8 attention's Q per (batch, head), `ceil(seq_q / 128)` (its K and
    /// V have [`Extent::ScaleBlocks`] over `seq_k`).
    ScaleBlocksQ,
}

impl Extent {
    /// Every extent, in declaration order (the order launch checks resolve them in).
    pub const ALL: [Extent; 19] = [
        Extent::Batch,
        Extent::SeqQ,
        Extent::SeqK,
        Extent::HeadsQ,
        Extent::HeadsKv,
        Extent::HeadDimQk,
        Extent::HeadDimV,
        Extent::MapLen,
        Extent::Splits,
        Extent::Pages,
        Extent::PageSize,
        Extent::MaxPages,
        Extent::Packed,
        Extent::TotalQ,
        Extent::TotalK,
        Extent::CuLen,
        Extent::ScaleBlocks,
        Extent::SeqPadded,
        Extent::ScaleBlocksQ,
    ];
    /// Name in the argument struct, error messages and bindings (`seq_q`, `heads_kv`, …).
    pub fn name(self) -> &'static str {
        match self {
            Extent::Batch => "batch",
            Extent::SeqQ => "seq_q",
            Extent::SeqK => "seq_k",
            Extent::HeadsQ => "heads_q",
            Extent::HeadsKv => "heads_kv",
            Extent::HeadDimQk => "head_dim_qk",
            Extent::HeadDimV => "head_dim_v",
            Extent::MapLen => "block_map_len",
            Extent::Splits => "splits",
            Extent::Pages => "pages",
            Extent::PageSize => "page_size",
            Extent::MaxPages => "max_pages",
            Extent::Packed => "packed",
            Extent::TotalQ => "total_q",
            Extent::TotalK => "total_k",
            Extent::CuLen => "cu_seqlens_len",
            Extent::ScaleBlocks => "scale_blocks",
            Extent::SeqPadded => "seq_padded",
            Extent::ScaleBlocksQ => "scale_blocks_q",
        }
    }
    /// The value the spec fixes, for head dims.
    pub fn fixed(self, spec: &VariantSpec) -> Option<usize> {
        match self {
            Extent::HeadDimQk => Some(spec.head_dim_qk as usize),
            Extent::HeadDimV => Some(spec.head_dim_v as usize),
            _ => None,
        }
    }
}

/// Whether the kernel reads or writes an operand. Outputs must not alias themselves (two
/// threads would write one element).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Read only (a `const` pointer in the argument struct).
    Input,
    /// Written by the kernel; its strides must not map two elements to one address (checked at
    /// launch).
    Output,
}

/// How an operand's elements are addressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Layout {
    /// Caller-given element strides for every dimension but the last, which is contiguous; rows
    /// are read with 16-byte vectors, so the address and the strides must keep 16-byte
    /// alignment. The strides travel in the argument struct.
    Strided,
    /// A dense row-major buffer; only its length is checked. No strides travel.
    Contiguous,
}

/// One tensor a kernel reads or writes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Operand {
    /// The name in the argument struct, in error messages and in the runtime's bindings.
    pub name: String,
    /// Read or written.
    pub role: Role,
    /// Element type.
    pub ty: OperandType,
    /// Logical shape, outermost first (q is `[Batch, SeqQ, HeadsQ, HeadDimQk]`); empty for a
    /// single element.
    pub dims: Vec<Extent>,
    /// Strided (strides travel in the argument struct) or contiguous.
    pub layout: Layout,
    /// The operand holding this one's block scales (fp8), by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<String>,
    /// Rows of the tile box when the kernel loads this operand through a TMA descriptor, which
    /// the runtime encodes per launch into the argument struct (64 columns × these rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tma_rows: Option<u32>,
}

impl Operand {
    /// An operand without block scales and not loaded through TMA.
    pub fn new(name: &str, role: Role, ty: OperandType, dims: &[Extent], layout: Layout) -> Self {
        Operand {
            name: name.to_string(),
            role,
            ty,
            dims: dims.to_vec(),
            layout,
            scale: None,
            tma_rows: None,
        }
    }
    /// Element alignment the kernel's loads need: 16 bytes for strided rows, the element size
    /// for a contiguous buffer.
    pub fn align_bytes(&self) -> u32 {
        match self.layout {
            Layout::Strided => 16,
            Layout::Contiguous => self.ty.size(),
        }
    }
}

/// One field of the argument struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ArgField {
    /// The device address of operand `i`.
    Pointer(usize),
    /// The element strides of every dimension but the last of operand `i` (`i64` each).
    Strides(usize),
    /// A launch extent as `i32`.
    Size(Extent),
    /// The softmax scale (`f32`).
    Scale,
    /// The softmax scale times log2(e) (`f32`), for the exp2-domain softmax.
    ScaleLog2,
    /// The dropout generator's seed and offset (two `u64`), for variants with dropout.
    DropoutRng,
    /// User parameter `i` (`VariantSpec::params`): a device pointer or a 4-byte scalar.
    Param(usize),
    /// The 128-byte TMA descriptor of operand `i`.
    Tma(usize),
    /// The fp32 gradient buffer of user parameter `i` (same shape as the parameter; one element
    /// for a scalar), which a backward kernel adds into.
    ParamGrad(usize),
}

/// A field and its place.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArgSlot {
    /// What the field holds.
    pub field: ArgField,
    /// Byte offset from the start of the struct.
    pub offset: u32,
    /// Size of the field in bytes.
    pub size: u32,
}

/// Byte layout of a kernel's single `__grid_constant__` argument, by the C layout rules (each
/// field aligned to its own alignment, the total rounded up to the largest). The generated
/// source `static_assert`s the total, so a disagreement fails at NVRTC time, not at launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArgLayout {
    /// The fields in struct order, with increasing offsets.
    pub slots: Vec<ArgSlot>,
    /// `sizeof` the struct in bytes: past the last field, rounded up to the largest alignment.
    pub total_size: u32,
}

/// Size of one TMA descriptor (`CUtensorMap`), which must be 128-byte aligned.
pub const TMA_DESC_BYTES: u32 = 128;

impl ArgField {
    /// `(size, alignment)` in bytes.
    fn size_align(self, operands: &[Operand], spec: &VariantSpec) -> (u32, u32) {
        match self {
            ArgField::Pointer(_) => (8, 8),
            ArgField::Strides(i) => (8 * (operands[i].dims.len() as u32 - 1), 8),
            ArgField::Size(_) | ArgField::Scale | ArgField::ScaleLog2 => (4, 4),
            ArgField::Param(i) => match spec.params[i].kind {
                ParamKind::Tensor { .. } => (8, 8),
                ParamKind::Scalar(_) => (4, 4),
            },
            ArgField::Tma(_) => (TMA_DESC_BYTES, TMA_DESC_BYTES),
            ArgField::DropoutRng => (16, 8),
            ArgField::ParamGrad(_) => (8, 8),
        }
    }
}

/// The fields of a kernel that takes `operands`, the launch scalars `scalars` and the spec's
/// params, in that order: per operand its pointer then (strided ones) its strides; then the
/// scalars; then the params in declaration order; then a TMA descriptor per operand loaded
/// through one.
pub fn arg_layout(spec: &VariantSpec, operands: &[Operand], scalars: &[ArgField]) -> ArgLayout {
    arg_layout_with(spec, operands, scalars, &[], true)
}

/// [`arg_layout`] with `extra` fields (gradient buffers) after the params, and the params left
/// out for kernels that never read them.
pub fn arg_layout_with(
    spec: &VariantSpec,
    operands: &[Operand],
    scalars: &[ArgField],
    extra: &[ArgField],
    with_params: bool,
) -> ArgLayout {
    let mut fields = Vec::new();
    for (i, op) in operands.iter().enumerate() {
        fields.push(ArgField::Pointer(i));
        if op.layout == Layout::Strided {
            fields.push(ArgField::Strides(i));
        }
    }
    fields.extend_from_slice(scalars);
    if with_params {
        fields.extend((0..spec.params.len()).map(ArgField::Param));
    }
    fields.extend_from_slice(extra);
    fields.extend(
        operands
            .iter()
            .enumerate()
            .filter(|(_, o)| o.tma_rows.is_some())
            .map(|(i, _)| ArgField::Tma(i)),
    );
    let (mut offset, mut max_align) = (0u32, 1u32);
    let slots = fields
        .into_iter()
        .map(|field| {
            let (size, align) = field.size_align(operands, spec);
            offset = offset.next_multiple_of(align);
            max_align = max_align.max(align);
            let slot = ArgSlot {
                field,
                offset,
                size,
            };
            offset += size;
            slot
        })
        .collect();
    ArgLayout {
        slots,
        total_size: offset.next_multiple_of(max_align),
    }
}

/// How many thread blocks a launch has, from its extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GridRule {
    /// `(ceil(seq_q / rows), heads_q, batch)`: one block per query tile of each head.
    QueryTiles {
        /// Query positions per tile (`block_m`).
        rows: u32,
    },
    /// `(ceil(seq_k / rows), heads_kv, batch)`: one block per key tile of each KV head.
    KeyTilesKvHeads {
        /// Key positions per tile (`block_n`).
        rows: u32,
    },
    /// `(min(ceil(seq_q / rows) · heads_q · batch, SMs), 1, 1)`: a persistent kernel whose blocks
    /// loop over the (query tile, head, batch) items, at most one block per SM.
    Persistent {
        /// Query positions per work item (`block_m`).
        rows: u32,
    },
    /// `(min(ceil(seq_k / rows) · heads_kv · batch, per_sm · SMs), 1, 1)`: a persistent kernel
    /// whose blocks loop over the (key tile, KV head, batch) items, as many blocks per SM as fit.
    PersistentKeys {
        /// Key positions per work item (`block_n`).
        rows: u32,
        /// Blocks one SM holds at once ([`super::tile::blocks_per_sm`]).
        per_sm: u32,
    },
    /// `(max(splits, 1), heads_kv · ceil(heads_q / heads_kv · seq_q / rows), batch)`: the split-KV
    /// kernel's blocks, each a tile of packed (query, head) rows of one KV head and one split of
    /// its keys.
    SplitKv {
        /// Packed rows per tile (`block_m`).
        rows: u32,
    },
    /// `(1, heads_q, batch)`: one block per (batch, head) — a quantisation's reduce and mean
    /// passes, whose work is one thread per column of each (batch, head) over its blocks.
    Heads,
    /// `(row tiles, heads_q or 1, batch or 1)`: one block per row of a block map (row tiles of
    /// `tile` query positions, or key positions when `along_keys`).
    MapRows {
        /// Positions per row tile.
        tile: u32,
        /// Rows are key tiles (the backward's map) rather than query tiles.
        along_keys: bool,
        /// One map per batch element (the grid's z is `batch`, else 1).
        per_batch: bool,
        /// One map per query head (the grid's y is `heads_q`, else 1).
        per_head: bool,
    },
}

impl GridRule {
    /// The grid for the given extents (`get` returns a launch extent's value) on a device with
    /// `sms` streaming multiprocessors.
    pub fn grid(self, get: impl Fn(Extent) -> usize, sms: usize) -> [usize; 3] {
        match self {
            GridRule::Persistent { rows } => {
                let items = get(Extent::SeqQ).div_ceil(rows as usize)
                    * get(Extent::HeadsQ)
                    * get(Extent::Batch);
                [items.min(sms.max(1)), 1, 1]
            }
            GridRule::PersistentKeys { rows, per_sm } => {
                let items = get(Extent::SeqK).div_ceil(rows as usize)
                    * get(Extent::HeadsKv)
                    * get(Extent::Batch);
                [items.min(sms.max(1) * per_sm.max(1) as usize), 1, 1]
            }
            GridRule::QueryTiles { rows } => [
                get(Extent::SeqQ).div_ceil(rows as usize),
                get(Extent::HeadsQ),
                get(Extent::Batch),
            ],
            GridRule::Heads => [1, get(Extent::HeadsQ), get(Extent::Batch)],
            GridRule::SplitKv { rows } => {
                let hkv = get(Extent::HeadsKv).max(1);
                let group = get(Extent::HeadsQ) / hkv;
                [
                    get(Extent::Splits).max(1),
                    hkv * (group * get(Extent::SeqQ)).div_ceil(rows as usize),
                    get(Extent::Batch),
                ]
            }
            GridRule::KeyTilesKvHeads { rows } => [
                get(Extent::SeqK).div_ceil(rows as usize),
                get(Extent::HeadsKv),
                get(Extent::Batch),
            ],
            GridRule::MapRows {
                tile,
                along_keys,
                per_batch,
                per_head,
            } => [
                get(if along_keys {
                    Extent::SeqK
                } else {
                    Extent::SeqQ
                })
                .div_ceil(tile as usize),
                if per_head { get(Extent::HeadsQ) } else { 1 },
                if per_batch { get(Extent::Batch) } else { 1 },
            ],
        }
    }
}

/// Block shape and shared memory of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LaunchShape {
    /// How the grid follows from the launch's extents.
    pub grid: GridRule,
    /// Threads per block (a whole number of warps).
    pub threads: u32,
    /// Dynamic shared memory per block, bytes.
    pub smem_bytes: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ParamDecl, ScalarTy};

    fn spec_with(params: Vec<ParamDecl>) -> VariantSpec {
        VariantSpec {
            name: "T".into(),
            doc: String::new(),
            head_dim_qk: 64,
            head_dim_v: 64,
            dtype: DType::Bf16,
            scale: None,
            params,
            mask: None,
            score: None,
            dropout: None,
            sparsity: None,
            fp8: None,
        }
    }

    #[test]
    fn layout_follows_c_rules() {
        let ops = vec![
            Operand::new(
                "q",
                Role::Input,
                OperandType::Storage(DType::Bf16),
                &[
                    Extent::Batch,
                    Extent::SeqQ,
                    Extent::HeadsQ,
                    Extent::HeadDimQk,
                ],
                Layout::Strided,
            ),
            Operand::new(
                "lse",
                Role::Output,
                OperandType::F32,
                &[Extent::Batch, Extent::HeadsQ, Extent::SeqQ],
                Layout::Contiguous,
            ),
        ];
        let spec = spec_with(vec![
            ParamDecl {
                name: "c".into(),
                frozen: false,
                kind: ParamKind::Scalar(ScalarTy::F32),
            },
            ParamDecl {
                name: "t".into(),
                frozen: false,
                kind: ParamKind::Tensor {
                    elem: ScalarTy::F32,
                    dims: vec![],
                },
            },
        ]);
        let l = arg_layout(&spec, &ops, &[ArgField::Size(Extent::Batch)]);
        let at: Vec<(ArgField, u32)> = l.slots.iter().map(|s| (s.field, s.offset)).collect();
        assert_eq!(
            at,
            vec![
                (ArgField::Pointer(0), 0),
                (ArgField::Strides(0), 8),
                (ArgField::Pointer(1), 32),
                (ArgField::Size(Extent::Batch), 40),
                (ArgField::Param(0), 44),
                (ArgField::Param(1), 48),
            ]
        );
        assert_eq!(l.total_size, 56);
    }

    #[test]
    fn tma_descriptors_go_last_at_128_bytes() {
        let mut q = Operand::new(
            "q",
            Role::Input,
            OperandType::Storage(DType::F16),
            &[
                Extent::Batch,
                Extent::SeqQ,
                Extent::HeadsQ,
                Extent::HeadDimQk,
            ],
            Layout::Strided,
        );
        q.tma_rows = Some(128);
        let l = arg_layout(&spec_with(vec![]), &[q], &[ArgField::Scale]);
        let last = l.slots.last().unwrap();
        assert_eq!((last.field, last.offset), (ArgField::Tma(0), 128));
        assert_eq!(l.total_size, 256);
    }

    #[test]
    fn element_sizes_come_from_the_type() {
        assert_eq!(OperandType::Storage(DType::Bf16).size(), 2);
        assert_eq!(OperandType::F32.size(), 4);
        assert_eq!(OperandType::Storage(DType::F16).cpp(), "u16");
    }
}
