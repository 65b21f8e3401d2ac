//! Block maps on the runtime (see `flash_dsl::plan::block_map`): built on the GPU by a generated
//! kernel, held in a [`BlockMap`], and bound to the attention kernels of a variant whose mask
//! reads tensors.
//!
//! A map depends on the launch shape (sequence lengths; batch and heads only where the mask reads
//! `b` or `h`), the kernel's tile sizes and the parameter values the mask reads. Build it once
//! with [`Runtime::forward_block_map`] / [`Runtime::backward_block_map`] and pass it to every
//! launch that shares them (all heads, all layers); a launch given none builds its own first, on
//! the same stream. The runtime checks that a given map fits the kernel and the shape; it cannot
//! check that the parameters it was built from are the launch's (a map built from other document
//! ids silently skips the wrong tiles), which is the caller's contract, as with any cached mask.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use flash_dsl::plan::{plan_block_map, BlockMapPlan, Extent, KernelKind, KernelPlan};
use flash_dsl::{TileConfig, VariantSpec};

use super::check::invalid;
use super::tensor::{ctx_id, ElemType, OperandArg};
use super::{driver, ProblemShape, Runtime};
use crate::build::LoadedKernel;
use crate::error::FlashError;
use crate::variant::ParamArg;

/// A block map on the device, with what it was built for.
pub struct BlockMap {
    words: CudaSlice<i32>,
    plan: BlockMapPlan,
    shape: ProblemShape,
}

impl std::fmt::Debug for BlockMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockMap")
            .field("plan", &self.plan)
            .field("shape", &self.shape)
            .field("words", &self.words.len())
            .finish()
    }
}

impl BlockMap {
    /// Tile sizes, direction and slots of the map.
    pub fn plan(&self) -> &BlockMapPlan {
        &self.plan
    }
    /// The problem it was built for.
    pub fn shape(&self) -> ProblemShape {
        self.shape
    }
    /// The map's words (layout in `flash_dsl::plan::block_map`), e.g. to copy to the host.
    pub fn words(&self) -> &CudaSlice<i32> {
        &self.words
    }
    /// Device memory the map holds.
    pub fn bytes(&self) -> usize {
        self.words.len() * 4
    }

    /// Checks that this map serves a kernel planned with `want` on `shape`.
    fn check_fits(&self, want: &BlockMapPlan, shape: &ProblemShape) -> Result<(), FlashError> {
        let p = &self.plan;
        if p != want {
            return Err(invalid(format!(
                "the block map was built for {} tiles of {}×{} (query × key); this kernel walks {} tiles of {}×{}: build it with the kernel's configuration",
                if p.along_keys { "key" } else { "query" },
                p.tile_q,
                p.tile_k,
                if want.along_keys { "key" } else { "query" },
                want.tile_q,
                want.tile_k
            )));
        }
        let s = &self.shape;
        let same = s.seq_q == shape.seq_q
            && s.seq_k == shape.seq_k
            && (!p.per_batch || s.batch == shape.batch)
            && (!p.per_head || s.heads_q == shape.heads_q);
        if !same {
            return Err(invalid(format!(
                "the block map was built for batch {}, heads_q {}, seq_q {}, seq_k {}; this launch has batch {}, heads_q {}, seq_q {}, seq_k {}",
                s.batch, s.heads_q, s.seq_q, s.seq_k, shape.batch, shape.heads_q, shape.seq_q, shape.seq_k
            )));
        }
        Ok(())
    }

    /// The map as the operand of a kernel that reads it (its length was sized by the plan).
    pub(crate) fn operand(&self, rt: &Runtime) -> OperandArg {
        let (ptr, _sync) = self.words.device_ptr(&rt.stream);
        OperandArg::flat(ptr, self.words.len(), ElemType::I32, ctx_id(&rt.ctx))
    }
}

/// Reads the build kernel's report on the sparsity layout (two words after the map: the first
/// out-of-range entry's flat index + 1 and its value) and turns a bad entry into an error that
/// names its position, its value and the range. Synchronises the stream: a map is built once and
/// reused, so the check costs one small copy per build.
fn check_layout_report(
    spec: &VariantSpec,
    map: &BlockMap,
    len: usize,
    shape: ProblemShape,
    rt: &Runtime,
) -> Result<(), FlashError> {
    let sp = spec
        .sparsity
        .expect("a layout map comes from a sparse variant");
    let tail = rt
        .stream
        .clone_dtoh(&map.words.slice(len - 2..len))
        .map_err(|e| driver("reading the layout check", e))?;
    if tail[0] == 0 {
        return Ok(());
    }
    let idx = (tail[0] - 1) as usize;
    let n = sp.block as usize;
    let blocks = shape.seq_q.max(shape.seq_k).div_ceil(n);
    let (slot, mut row) = (idx % sp.slots as usize, idx / sp.slots as usize);
    let qb = row % blocks;
    row /= blocks;
    let mut at = Vec::new();
    if sp.per_head {
        at.push(format!("head {}", row % shape.heads_q.max(1)));
        row /= shape.heads_q.max(1);
    }
    if sp.per_batch {
        at.insert(0, format!("batch {row}"));
    }
    at.push(format!("query block {qb}"));
    at.push(format!("slot {slot}"));
    Err(invalid(format!(
        "sparsity layout `{}` at [{}] is {}; an entry must be -1 (unused) or a key block in 0..{} (seq_k {} in blocks of {n})",
        spec.params[sp.param].name,
        at.join(", "),
        tail[1],
        shape.seq_k.div_ceil(n),
        shape.seq_k
    )))
}

impl Runtime {
    /// Builds the block map `map` of `spec` for `shape` and `params` (the values its mask reads)
    /// on the runtime's stream: one launch of the generated build kernel.
    pub fn build_block_map(
        &self,
        spec: &VariantSpec,
        map: BlockMapPlan,
        shape: ProblemShape,
        params: &[ParamArg<'_>],
    ) -> Result<BlockMap, FlashError> {
        let kind = if map.along_keys {
            KernelKind::BlockMapKeys
        } else {
            KernelKind::BlockMap
        };
        let kernel = self.load_kind((kind, false), spec, Some(map.build_config()), || {
            plan_block_map(spec, map).map_err(|e| FlashError::plan(&spec.name, e))
        })?;
        let len = map
            .len(shape.batch, shape.heads_q, shape.seq_q, shape.seq_k)
            .max(1);
        if len > i32::MAX as usize {
            return Err(invalid(format!(
                "the block map of batch {}, heads_q {}, seq_q {}, seq_k {} needs {len} words; the kernels address at most {} (32-bit offsets)",
                shape.batch, shape.heads_q, shape.seq_q, shape.seq_k, i32::MAX
            )));
        }
        let words = self
            .stream
            .alloc_zeros::<i32>(len)
            .map_err(|e| driver("allocating the block map", e))?;
        let mut out = BlockMap {
            words,
            plan: map,
            shape,
        };
        let op = {
            let (ptr, _sync) = out.words.device_ptr_mut(&self.stream);
            OperandArg::flat(ptr, len, ElemType::I32, ctx_id(&self.ctx))
        };
        let preset = [
            (Extent::Batch, shape.batch),
            (Extent::HeadsQ, shape.heads_q),
            (Extent::SeqQ, shape.seq_q),
            (Extent::SeqK, shape.seq_k),
        ];
        let launch = self.prepare_with(&kernel, &[op], params, &[], &preset)?;
        self.launch_checked(&launch)?;
        if map.layout {
            check_layout_report(spec, &out, len, shape, self)?;
        }
        Ok(out)
    }

    /// The block map the forward kernel `kernel` walks for `shape`, or `None` when its variant
    /// needs none.
    pub fn forward_block_map(
        &self,
        kernel: &LoadedKernel,
        shape: ProblemShape,
        params: &[ParamArg<'_>],
    ) -> Result<Option<BlockMap>, FlashError> {
        match kernel.plan.block_map {
            Some(m) => Ok(Some(self.build_block_map(
                &kernel.plan.spec,
                m,
                shape,
                params,
            )?)),
            None => Ok(None),
        }
    }

    /// The block map the backward pass of `spec` with the main-kernel configuration `config`
    /// (`None`: the one the backward pass would pick, its fallback for a spilling default
    /// included) walks for `shape`, or `None` when the variant needs none.
    pub fn backward_block_map(
        &self,
        spec: &VariantSpec,
        config: Option<TileConfig>,
        shape: ProblemShape,
        params: &[ParamArg<'_>],
    ) -> Result<Option<BlockMap>, FlashError> {
        if !flash_dsl::plan::needs_block_map(spec) {
            return Ok(None);
        }
        let opts = super::backward::BackwardOptions {
            config,
            deterministic: false,
        };
        let main = self.backward_main(spec, &opts)?;
        match main.plan.block_map {
            Some(m) => Ok(Some(self.build_block_map(spec, m, shape, params)?)),
            None => Ok(None),
        }
    }

    /// The map operand of a launch of `plan` on `shape`: `given` (checked to fit), or one built
    /// now into `owned`. `None` when the plan reads no map.
    pub(crate) fn map_operand(
        &self,
        plan: &KernelPlan,
        shape: ProblemShape,
        params: &[ParamArg<'_>],
        given: Option<&BlockMap>,
        owned: &mut Option<BlockMap>,
    ) -> Result<Option<OperandArg>, FlashError> {
        let Some(want) = plan.block_map else {
            return Ok(None);
        };
        let map = match given {
            Some(m) => {
                m.check_fits(&want, &shape)?;
                m
            }
            None => owned.insert(self.build_block_map(&plan.spec, want, shape, params)?),
        };
        Ok(Some(map.operand(self)))
    }
}
