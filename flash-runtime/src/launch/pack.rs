//! Packing the argument struct from a plan's [`ArgLayout`]: each field written at its offset
//! from the checked operands, the extents, the params and the encoded TMA descriptors. Nothing
//! here is written per operand; a new kernel kind's struct packs with the same code.
//!
//! [`ArgLayout`]: flash_dsl::plan::ArgLayout

use flash_dsl::dropout::DropoutRng;
use flash_dsl::eval::{tensor_shape, Sizes};
use flash_dsl::plan::{ArgField, Extent, KernelKind, KernelPlan, TMA_DESC_BYTES};
use flash_dsl::spec::{Dropout, ParamKind, ScalarTy, VariantSpec};

use super::check::{invalid, Extents};
use super::tensor::OperandArg;
use crate::error::FlashError;
use crate::variant::ParamArg;

/// The argument struct of one launch, as bytes, and the device regions of its tensor params
/// (`(name, address, bytes)`) that the caller still has to check with the driver.
pub struct Packed {
    /// The kernel's argument struct, `plan.args.total_size` bytes, passed by value at launch.
    pub bytes: Vec<u8>,
    /// `(param name, device address, bytes)` of every tensor param, to be checked with the
    /// driver (one allocation, on the runtime's device) before the launch.
    pub param_regions: Vec<(String, u64, usize)>,
}

/// Writes every field of `plan.args`. `operands` were checked against the plan (same order);
/// `grads` holds, by param index, the gradient buffer of each parameter the plan adds into
/// (backward kernels; empty otherwise).
pub fn pack_args(
    plan: &KernelPlan,
    operands: &[OperandArg],
    ext: &Extents,
    params: &[ParamArg<'_>],
    grads: &[Option<ParamArg<'_>>],
) -> Result<Packed, FlashError> {
    let spec = &plan.spec;
    let mut bytes = vec![0u8; plan.args.total_size as usize];
    let sizes = Sizes {
        batch: ext.get(Extent::Batch),
        heads: ext.get(Extent::HeadsQ),
        seq_q: ext.get(Extent::SeqQ),
        seq_k: ext.get(Extent::SeqK),
    };
    // A params list, where one is given, must carry a dropout state exactly when the spec has
    // dropout, even for a kernel that reads no params (the backward's pre-processing is given
    // none at all).
    let dropout = if params.is_empty() {
        None
    } else {
        Some(split_dropout(spec, params)?)
    };
    // The probability is checked for every kernel of a dropout variant, whether or not its
    // argument struct carries the generator (the split-KV kernels do not).
    if let Some((declared, _)) = &dropout {
        check_probability(plan, declared)?;
    }
    // Kernels that never read the params (backward pre-processing, dQ conversion) take none.
    let reads_params = plan
        .args
        .slots
        .iter()
        .any(|s| matches!(s.field, ArgField::Param(_)));
    let mut param_regions = if reads_params {
        check_params(plan, sizes, params)?
    } else {
        Vec::new()
    };
    param_regions.extend(check_grads(plan, sizes, grads)?);
    for slot in &plan.args.slots {
        let at = slot.offset as usize;
        let out = &mut bytes[at..at + slot.size as usize];
        match slot.field {
            ArgField::Pointer(i) => out.copy_from_slice(&operands[i].ptr.to_le_bytes()),
            ArgField::Strides(i) => {
                let strides = &operands[i].strides;
                for (chunk, s) in out.chunks_mut(8).zip(strides) {
                    chunk.copy_from_slice(&s.to_le_bytes());
                }
            }
            ArgField::Size(e) => out.copy_from_slice(&(ext.get(e) as i32).to_le_bytes()),
            ArgField::Scale => out.copy_from_slice(&(spec.softmax_scale() as f32).to_le_bytes()),
            ArgField::ScaleLog2 => out.copy_from_slice(
                &((spec.softmax_scale() * std::f64::consts::LOG2_E) as f32).to_le_bytes(),
            ),
            ArgField::Param(i) => match params[i] {
                ParamArg::I32(x) => out.copy_from_slice(&x.to_le_bytes()),
                ParamArg::F32(x) => out.copy_from_slice(&x.to_le_bytes()),
                ParamArg::Tensor { ptr, .. } => out.copy_from_slice(&ptr.to_le_bytes()),
                ParamArg::Rng(_) => unreachable!("check_params matched the declared kinds"),
            },
            ArgField::DropoutRng => {
                // A dropout kernel given no params at all gets `split_dropout`'s message.
                let (_, rng) = match dropout {
                    Some(d) => d,
                    None => split_dropout(spec, params)?,
                };
                let rng = rng.expect("a plan with a dropout field belongs to a dropout variant");
                out[..8].copy_from_slice(&rng.seed.to_le_bytes());
                out[8..].copy_from_slice(&rng.offset.to_le_bytes());
            }
            ArgField::ParamGrad(i) => match grads.get(i) {
                Some(Some(ParamArg::Tensor { ptr, .. })) => out.copy_from_slice(&ptr.to_le_bytes()),
                _ => unreachable!("check_grads found a buffer for every gradient field"),
            },
            ArgField::Tma(i) => {
                let op = &plan.operands[i];
                let a = &operands[i];
                let rows = op.tma_rows.expect("a TMA field belongs to a TMA operand");
                // A flat buffer (the fp32 dQ accumulator) takes its extents from the plan's
                // dims and is contiguous.
                let (shape, strides): (Vec<usize>, Vec<i64>) = match &a.shape {
                    Some(s) => (s.clone(), a.strides.clone()),
                    None => {
                        let s: Vec<usize> = op.dims.iter().map(|d| ext.get(*d)).collect();
                        let mut st = vec![1i64; s.len()];
                        for j in (0..s.len().saturating_sub(1)).rev() {
                            st[j] = st[j + 1] * s[j + 1] as i64;
                        }
                        (s, st)
                    }
                };
                // The driver rejects a zero-sized dimension; the kernel then has no tile to
                // load and never reads the descriptor.
                if shape.len() != 4 || shape.contains(&0) {
                    continue;
                }
                let elem_ty = match op.ty {
                    flash_dsl::plan::OperandType::Storage(dtype) => {
                        crate::ffi::TmaElem::Storage(dtype)
                    }
                    flash_dsl::plan::OperandType::F32 => crate::ffi::TmaElem::F32,
                    flash_dsl::plan::OperandType::Fp8(_) => crate::ffi::TmaElem::U8,
                    _ => {
                        return Err(invalid(format!(
                            "operand {} is loaded through TMA but is of type {}",
                            op.name,
                            op.ty.name()
                        )))
                    }
                };
                let elem = op.ty.size() as u64;
                let [b_, s_, h_, d_] = [shape[0], shape[1], shape[2], shape[3]].map(|x| x as u64);
                let mut st: Vec<u64> = strides.iter().map(|x| *x as u64 * elem).collect();
                // A batch of one (a packed batch) never steps along its batch stride, which may
                // then be anything; the driver wants a valid one.
                if b_ == 1 {
                    st[0] = st[1] * s_;
                }
                let map = crate::ffi::encode_tma_4d(
                    a.ptr,
                    elem_ty,
                    [d_, s_, h_, b_],
                    [st[1], st[2], st[0]],
                    rows,
                )
                .map_err(|r| {
                    invalid(format!(
                        "encoding the TMA descriptor of {} (shape {shape:?}, strides {strides:?}) failed: {r:?}",
                        op.name
                    ))
                })?;
                debug_assert_eq!(map.len(), TMA_DESC_BYTES as usize);
                out.copy_from_slice(&map);
            }
        }
    }
    Ok(Packed {
        bytes,
        param_regions,
    })
}

/// The declared params, and the dropout generator's state that a variant with dropout takes
/// after them (exactly one [`ParamArg::Rng`], last; none for other variants).
pub fn split_dropout<'p, 'a>(
    spec: &VariantSpec,
    params: &'p [ParamArg<'a>],
) -> Result<(&'p [ParamArg<'a>], Option<DropoutRng>), FlashError> {
    let rngs = params
        .iter()
        .filter(|p| matches!(p, ParamArg::Rng(_)))
        .count();
    match (spec.dropout.is_some(), params.last(), rngs) {
        (true, Some(ParamArg::Rng(r)), 1) => Ok((&params[..params.len() - 1], Some(*r))),
        (true, ..) => Err(invalid(format!(
            "`{}` declares dropout: pass the generator's seed and offset as one last param after the declared ones, `ParamArg::dropout(seed, offset)` (got {rngs} dropout states{})",
            spec.name,
            if rngs == 1 { ", not last" } else { "" }
        ))),
        (false, _, 0) => Ok((params, None)),
        (false, ..) => Err(invalid(format!(
            "`{}` declares no dropout, so it takes no seed and offset (got {rngs} dropout states)",
            spec.name
        ))),
    }
}

/// A runtime dropout probability must lie in [0, 1) (a constant one was checked when the
/// declaration was validated), and be 0 for the kernels that serve a dropout variant without
/// applying it: split-KV (decode, paged, chunked prefill) and packed batches.
pub(crate) fn check_probability(
    plan: &KernelPlan,
    params: &[ParamArg<'_>],
) -> Result<(), FlashError> {
    let spec = &plan.spec;
    if let Some(Dropout::Param(i)) = spec.dropout {
        if let Some(ParamArg::F32(p)) = params.get(i) {
            if !(0.0..1.0).contains(p) {
                return Err(invalid(format!(
                    "dropout probability `{}` = {p} of `{}` must lie in [0, 1)",
                    spec.params[i].name, spec.name
                )));
            }
            let serving = matches!(
                plan.kind,
                KernelKind::SplitKv
                    | KernelKind::SplitKvPaged
                    | KernelKind::SplitKvPagedVarlen
                    | KernelKind::ForwardVarlen
            );
            if serving && *p != 0.0 {
                return Err(invalid(format!(
                    "dropout probability `{}` = {p} of `{}`: the {} kernel `{}` does not apply dropout (it serves the variant for inference); pass {} = 0",
                    spec.params[i].name,
                    spec.name,
                    if plan.kind == KernelKind::ForwardVarlen { "packed" } else { "split-KV" },
                    plan.kernel_name,
                    spec.params[i].name
                )));
            }
        }
    }
    Ok(())
}

/// Checks params against the spec: count, kinds, element types, tensor lengths (the element
/// count their dims resolve to for this launch) and alignment. Returns `(name, address, bytes)`
/// of each non-empty tensor param, whose allocation the caller still has to check.
pub fn check_params(
    plan: &KernelPlan,
    sizes: Sizes,
    params: &[ParamArg<'_>],
) -> Result<Vec<(String, u64, usize)>, FlashError> {
    let spec = &plan.spec;
    let (params, _) = split_dropout(spec, params)?;
    if params.len() != spec.params.len() {
        return Err(invalid(format!(
            "`{}` declares {} param(s) ({}); got {}",
            spec.name,
            spec.params.len(),
            spec.params
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            params.len()
        )));
    }
    let mut regions = Vec::new();
    for (decl, arg) in spec.params.iter().zip(params) {
        match (&decl.kind, arg) {
            (ParamKind::Scalar(ScalarTy::I32), ParamArg::I32(_))
            | (ParamKind::Scalar(ScalarTy::F32), ParamArg::F32(_)) => {}
            (
                ParamKind::Tensor { elem, dims },
                ParamArg::Tensor {
                    ptr, len, elem: e, ..
                },
            ) if elem == e => {
                let dims_n = tensor_shape(dims, sizes);
                let need = elements(&dims_n).ok_or_else(|| {
                    invalid(format!(
                        "param `{}`'s shape {dims_n:?} has more elements than memory can hold",
                        decl.name
                    ))
                })?;
                if *len < need {
                    return Err(invalid(format!(
                        "param `{}` has {len} elements; its shape {dims_n:?} needs {need}",
                        decl.name
                    )));
                }
                if need > 0 {
                    if !ptr.is_multiple_of(4) {
                        return Err(invalid(format!(
                            "param `{}`'s address {ptr:#x} is not 4-byte aligned",
                            decl.name
                        )));
                    }
                    regions.push((format!("param `{}`", decl.name), *ptr, need * 4));
                }
            }
            (kind, a) => {
                let want = match kind {
                    ParamKind::Scalar(t) => format!("an {} scalar", t.name()),
                    ParamKind::Tensor { elem, .. } => format!("an {} tensor", elem.name()),
                };
                let got = match a {
                    ParamArg::I32(_) => "an i32 scalar".to_string(),
                    ParamArg::F32(_) => "an f32 scalar".to_string(),
                    ParamArg::Tensor { elem, .. } => format!("an {} tensor", elem.name()),
                    ParamArg::Rng(_) => "the dropout generator's state".to_string(),
                };
                return Err(invalid(format!(
                    "param `{}` must be {want}; got {got}",
                    decl.name
                )));
            }
        }
    }
    Ok(regions)
}

/// Checks the gradient buffers the plan adds into: an f32 tensor per gradient field, as long as
/// the parameter (one element for a scalar), 4-byte aligned. Returns their regions.
pub fn check_grads(
    plan: &KernelPlan,
    sizes: Sizes,
    grads: &[Option<ParamArg<'_>>],
) -> Result<Vec<(String, u64, usize)>, FlashError> {
    let mut regions = Vec::new();
    for slot in &plan.args.slots {
        let ArgField::ParamGrad(i) = slot.field else {
            continue;
        };
        let decl = &plan.spec.params[i];
        let need: usize = match &decl.kind {
            ParamKind::Scalar(_) => 1,
            ParamKind::Tensor { dims, .. } => elements(&tensor_shape(dims, sizes))
                .ok_or_else(|| invalid(format!("the gradient of `{}` is too large", decl.name)))?,
        };
        match grads.get(i) {
            Some(Some(ParamArg::Tensor {
                ptr,
                len,
                elem: ScalarTy::F32,
                ..
            })) => {
                if *len < need {
                    return Err(invalid(format!(
                        "the gradient of `{}` has {len} elements; the parameter has {need}",
                        decl.name
                    )));
                }
                if !ptr.is_multiple_of(4) {
                    return Err(invalid(format!(
                        "the gradient of `{}` at {ptr:#x} is not 4-byte aligned",
                        decl.name
                    )));
                }
                regions.push((format!("the gradient of `{}`", decl.name), *ptr, need * 4));
            }
            _ => {
                return Err(invalid(format!(
                    "`{}` is an f32 parameter the score depends on: its gradient needs an f32 buffer of {need} elements",
                    decl.name
                )))
            }
        }
    }
    Ok(regions)
}

/// Elements of a shape, `None` when they (or their bytes, 4 per element) overflow.
fn elements(shape: &[usize]) -> Option<usize> {
    let n = shape
        .iter()
        .try_fold(1usize, |acc, d| acc.checked_mul(*d))?;
    n.checked_mul(4).map(|_| n)
}

/// The argument bytes as 8-byte words (the struct holds 8-byte pointers and strides, so its
/// storage must be 8-byte aligned).
pub fn to_words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks(8)
        .map(|c| {
            let mut b8 = [0u8; 8];
            b8[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(b8)
        })
        .collect()
}
