//! The launch-time checks, derived from a plan's operand list: element type, shape agreement
//! (every named extent bound once and agreed on by every operand), layout (strides, alignment,
//! extent inside the buffer), self-overlap of outputs, and the kernel's integer limits. Every
//! failure is a [`FlashError::Invalid`] naming the operand, the value and the limit.

use std::collections::BTreeMap;

use flash_dsl::plan::{Extent, KernelPlan, Layout, Operand, Role};

use super::tensor::OperandArg;
use crate::error::FlashError;

pub(crate) fn invalid(msg: impl Into<String>) -> FlashError {
    FlashError::Invalid(msg.into())
}

/// The extents of one launch, read off its operands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extents {
    values: BTreeMap<Extent, (usize, String)>,
}

impl Extents {
    /// The value of `e`; 0 when no operand has it.
    pub fn get(&self, e: Extent) -> usize {
        self.values.get(&e).map_or(0, |v| v.0)
    }

    /// Binds `e` to `n` (from `who`), or checks `n` against the earlier binding.
    fn bind(&mut self, e: Extent, n: usize, who: &str) -> Result<(), String> {
        match self.values.get(&e) {
            Some((v, from)) if *v != n => Err(format!(
                "{} is {v} (from {from}) but {who} has {n}",
                e.name()
            )),
            Some(_) => Ok(()),
            None => {
                self.values.insert(e, (n, who.to_string()));
                Ok(())
            }
        }
    }
}

/// Elements reached by a shape and strides: `1 + Σ (shape_i − 1)·stride_i`, or 0 for an empty
/// tensor; `None` on overflow or a negative stride.
pub fn extent(shape: &[usize], strides: &[i64]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    let mut last: i64 = 0;
    for (n, s) in shape.iter().zip(strides) {
        if *s < 0 {
            return None;
        }
        last = last.checked_add((*n as i64 - 1).checked_mul(*s)?)?;
    }
    usize::try_from(last.checked_add(1)?).ok()
}

/// Whether no two index tuples share an element (needed for outputs: two threads would write
/// the same element).
pub fn non_overlapping(shape: &[usize], strides: &[i64]) -> bool {
    let mut dims: Vec<(i64, usize)> = strides
        .iter()
        .zip(shape)
        .filter(|(_, n)| **n > 1)
        .map(|(s, n)| (*s, *n))
        .collect();
    dims.sort();
    let mut span: i64 = 1; // elements covered by the inner dimensions
    for (s, n) in dims {
        if s < span {
            return false;
        }
        span = s.saturating_mul(n as i64);
    }
    true
}

/// Checks the element types and shapes of `args` against the plan's operands and returns the
/// launch's extents. Head dims are fixed by the spec; every other extent is defined by the
/// first operand that has it.
pub fn resolve_extents(plan: &KernelPlan, args: &[OperandArg]) -> Result<Extents, FlashError> {
    resolve_extents_with(plan, args, &[])
}

/// [`resolve_extents`] with extents given by the caller (`preset`) before any operand binds
/// them: a kernel whose operands do not carry the launch sizes (the block-map build) takes them
/// from the problem it is built for. The block map's length is derived last, from the plan's
/// map and the bound sizes.
pub fn resolve_extents_with(
    plan: &KernelPlan,
    args: &[OperandArg],
    preset: &[(Extent, usize)],
) -> Result<Extents, FlashError> {
    let spec = &plan.spec;
    if args.len() != plan.operands.len() {
        return Err(invalid(format!(
            "the {} kernel takes {} operands ({}); got {}",
            plan.kind.name(),
            plan.operands.len(),
            names(&plan.operands),
            args.len()
        )));
    }
    let mut ext = Extents::default();
    for e in Extent::ALL {
        if let Some(n) = e.fixed(spec) {
            ext.bind(e, n, &format!("`{}`", spec.name))
                .expect("fixed extents are bound once");
        }
    }
    for (e, n) in preset {
        ext.bind(*e, *n, "the problem shape").map_err(invalid)?;
    }
    for (op, a) in plan.operands.iter().zip(args) {
        if !a.elem.matches_operand(op.ty) {
            return Err(invalid(format!(
                "{} holds {} elements; `{}` needs {} for it",
                op.name,
                a.elem.name(),
                spec.name,
                op.ty.name()
            )));
        }
        let Some(shape) = &a.shape else { continue };
        if shape.len() != op.dims.len() {
            return Err(invalid(format!(
                "{} has {} dimensions; it must be [{}]",
                op.name,
                shape.len(),
                dim_names(op)
            )));
        }
        for (d, n) in op.dims.iter().zip(shape) {
            ext.bind(*d, *n, &op.name).map_err(|m| {
                invalid(format!(
                    "{m} (shapes: {} is [{}] = {shape:?})",
                    op.name,
                    dim_names(op)
                ))
            })?;
        }
    }
    if let Some(m) = &plan.block_map {
        let len = m.len(
            ext.get(Extent::Batch),
            ext.get(Extent::HeadsQ),
            ext.get(Extent::SeqQ),
            ext.get(Extent::SeqK),
        );
        ext.bind(Extent::MapLen, len, "the block map's shape")
            .map_err(invalid)?;
    }
    // Flat operands: their shape comes from extents bound by the others.
    for (op, a) in plan.operands.iter().zip(args) {
        if a.shape.is_none() {
            let need: usize = op.dims.iter().map(|d| ext.get(*d)).product();
            if a.len < need {
                return Err(invalid(format!(
                    "{} has {} elements; [{}] = {:?} needs {need}",
                    op.name,
                    a.len,
                    dim_names(op),
                    op.dims.iter().map(|d| ext.get(*d)).collect::<Vec<_>>()
                )));
            }
        }
    }
    // GQA/MQA: only kernels that read K/V heads bind heads_kv.
    let (hq, hkv) = (ext.get(Extent::HeadsQ), ext.get(Extent::HeadsKv));
    if ext.values.contains_key(&Extent::HeadsKv) && (hkv == 0 || hq % hkv != 0) {
        return Err(invalid(format!(
            "heads_q {hq} must be a multiple of heads_kv {hkv}"
        )));
    }
    for (e, (n, from)) in &ext.values {
        let limit = extent_limit(*e);
        if *n > limit {
            return Err(invalid(format!(
                "{} is {n} (from {from}); the kernel's limit is {limit}",
                e.name(),
            )));
        }
    }
    Ok(ext)
}

/// The largest value of an extent at a launch. Batch, heads and sequence lengths are bounded
/// by the arithmetic model of `flash_dsl::validate::arith` (the kernels compute the declared
/// expressions in 32-bit ints where these bounds prove it exact); the rest by `int`.
pub fn extent_limit(e: Extent) -> usize {
    use flash_dsl::validate::arith::{MAX_BATCH, MAX_HEADS, MAX_SEQ};
    match e {
        Extent::Batch => MAX_BATCH as usize,
        Extent::HeadsQ | Extent::HeadsKv => MAX_HEADS as usize,
        Extent::SeqQ | Extent::SeqK => MAX_SEQ as usize,
        // Packed tensors are one sequence of all tokens: `[1, total, heads, d]`.
        Extent::Packed => 1,
        _ => i32::MAX as usize,
    }
}

/// Layout of one bound operand: strides and alignment the kernel's loads need, the extent
/// inside the buffer, no self-overlap for outputs. Returns the bytes the kernel may touch from
/// the operand's address (for the driver's allocation check).
pub fn check_operand(op: &Operand, a: &OperandArg, ext: &Extents) -> Result<usize, FlashError> {
    let size = a.elem.size();
    let name = &op.name;
    let Some(shape) = &a.shape else {
        // A flat contiguous buffer: its length was checked against the extents.
        let need: usize = op.dims.iter().map(|d| ext.get(*d)).product();
        if need > 0 && !a.ptr.is_multiple_of(op.align_bytes() as u64) {
            return Err(invalid(format!(
                "{name}'s address {:#x} is not {}-byte aligned",
                a.ptr,
                op.align_bytes()
            )));
        }
        return Ok(need * size);
    };
    let Some(reach) = extent(shape, &a.strides) else {
        return Err(invalid(format!(
            "{name}'s shape {shape:?} and strides {:?} overflow 64-bit offsets or step backwards",
            a.strides
        )));
    };
    if reach == 0 {
        return Ok(0); // nothing is read or written
    }
    match op.layout {
        Layout::Strided => {
            let last = a.strides.len() - 1;
            if a.strides[last] != 1 {
                return Err(invalid(format!(
                    "{name}'s last dimension must be contiguous (stride 1); got stride {}",
                    a.strides[last]
                )));
            }
            // Rows are read with 16-byte vectors.
            let row = 16 / size as i64;
            for (i, s) in a.strides[..last].iter().enumerate() {
                // A dimension of size 1 is never stepped along; its stride is irrelevant.
                if shape[i] > 1 && (*s < 0 || s % row != 0) {
                    return Err(invalid(format!(
                        "{name}'s stride {s} (dim {i}) must be a non-negative multiple of {row} elements (16-byte rows)"
                    )));
                }
            }
        }
        Layout::Contiguous => {
            if a.strides != contiguous(shape) {
                return Err(invalid(format!(
                    "{name} must be contiguous (strides {:?} for shape {shape:?}); got strides {:?}",
                    contiguous(shape),
                    a.strides
                )));
            }
        }
    }
    if !a.ptr.is_multiple_of(op.align_bytes() as u64) {
        return Err(invalid(format!(
            "{name}'s address {:#x} must be {}-byte aligned",
            a.ptr,
            op.align_bytes()
        )));
    }
    if reach > a.len {
        return Err(invalid(format!(
            "{name} needs {reach} elements for shape {shape:?} and strides {:?}; its buffer has {}",
            a.strides, a.len
        )));
    }
    if op.role == Role::Output && !non_overlapping(shape, &a.strides) {
        return Err(invalid(format!(
            "{name}'s strides {:?} make distinct elements share memory (shape {shape:?})",
            a.strides
        )));
    }
    Ok(reach * size)
}

/// Row-major strides of a contiguous `shape`.
pub fn contiguous(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1] as i64);
    }
    s
}

fn names(ops: &[Operand]) -> String {
    ops.iter()
        .map(|o| o.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn dim_names(op: &Operand) -> String {
    op.dims
        .iter()
        .map(|d| d.name())
        .collect::<Vec<_>>()
        .join(", ")
}
