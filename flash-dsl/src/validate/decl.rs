//! The declaration's own entries: head dims, dtype and the parameter list.

use crate::ast::{DimAst, HeadDim, ParamAst};
use crate::diag::Report;
use crate::spec::{DType, Dim, ParamDecl, ParamKind, ScalarTy};

use super::arith::MAX_SEQ;
use super::names::{FUNCTIONS, VARIABLES};

pub(super) fn check_head_dim(hd: &HeadDim, errs: &mut Vec<Report>) -> Option<(u32, u32)> {
    if let Some(paren) = hd.paren {
        if hd.sizes.len() != 2 {
            errs.push(Report::at(
                paren,
                format!(
                    "head_dim in parentheses takes two sizes, (qk, v); got {}",
                    hd.sizes.len()
                ),
            ));
            return None;
        }
    }
    let what: &[&str] = if hd.paren.is_some() {
        &["qk head dim", "v head dim"]
    } else {
        &["head dim"]
    };
    let mut dims = Vec::new();
    for (lit, what) in hd.sizes.iter().zip(what) {
        if !lit.suffix().is_empty() {
            errs.push(Report::spanned(
                lit,
                format!(
                    "{what} takes a plain integer; remove the suffix `{}`",
                    lit.suffix()
                ),
            ));
            continue;
        }
        match lit.base10_parse::<u64>() {
            Ok(v) if v % 8 == 0 && (8..=256).contains(&v) => dims.push(v as u32),
            Ok(v) => errs.push(Report::spanned(
                lit,
                format!("{what} must be a multiple of 8 in 8..=256; got {v}"),
            )),
            Err(_) => errs.push(Report::spanned(
                lit,
                format!(
                    "{what} must be a multiple of 8 in 8..=256; got {}",
                    lit.base10_digits()
                ),
            )),
        }
    }
    match dims[..] {
        [d] if hd.paren.is_none() => Some((d, d)),
        [qk, v] => Some((qk, v)),
        _ => None,
    }
}

/// What `dtype:` declares: one storage type for Q, K, V and O, or fp8 inputs.
pub(super) enum DeclDType {
    Plain(DType),
    Fp8(crate::fp8::Fp8Format),
}

pub(super) fn check_dtype(id: &syn::Ident, errs: &mut Vec<Report>) -> Option<DeclDType> {
    let name = id.to_string();
    match name.as_str() {
        "bf16" => Some(DeclDType::Plain(DType::Bf16)),
        "f16" => Some(DeclDType::Plain(DType::F16)),
        "e4m3" => Some(DeclDType::Fp8(crate::fp8::Fp8Format::E4m3)),
        "e5m2" => {
            errs.push(Report::at(
                id.span(),
                "e5m2 attention inputs are not supported: two mantissa bits lose too much of Q·Kᵀ (e5m2 is a gradient format); use e4m3",
            ));
            None
        }
        n if n.starts_with("fp8") || n.starts_with("f8") || n.starts_with("e4m3") => {
            errs.push(Report::at(
                id.span(),
                format!("unknown dtype `{name}`; fp8 inputs are declared `dtype: e4m3`"),
            ));
            None
        }
        _ => {
            errs.push(Report::at(
                id.span(),
                format!("unknown dtype `{name}`; expected bf16, f16 or e4m3"),
            ));
            None
        }
    }
}

/// Checks the parameter list. Parameters with errors are still entered (with a best-guess type)
/// so that their uses do not add "unknown identifier" noise; the spec is rejected anyway.
pub(super) fn check_params(ps: &[ParamAst], errs: &mut Vec<Report>) -> Vec<ParamDecl> {
    let mut out: Vec<ParamDecl> = Vec::new();
    for p in ps {
        let name = p.name.to_string();
        if out.iter().any(|q| q.name == name) {
            errs.push(Report::at(
                p.name.span(),
                format!("duplicate parameter `{name}`"),
            ));
            continue;
        }
        if let Some(problem) = super::limits::ident_problem(&name) {
            errs.push(Report::at(p.name.span(), problem));
        } else if VARIABLES.contains(&name.as_str()) || name == "causal" {
            errs.push(Report::at(
                p.name.span(),
                format!("parameter `{name}` shadows the builtin variable `{name}`; rename it"),
            ));
        } else if FUNCTIONS.contains(&name.as_str()) {
            errs.push(Report::at(
                p.name.span(),
                format!("parameter `{name}` shadows the builtin function `{name}`; rename it"),
            ));
        } else if name == "_marker" {
            errs.push(Report::at(
                p.name.span(),
                "parameter name `_marker` is reserved for the generated params struct",
            ));
        }
        let elem = match p.ty.elem.to_string().as_str() {
            "f32" => ScalarTy::F32,
            "i32" => ScalarTy::I32,
            other => {
                errs.push(Report::at(
                    p.ty.elem.span(),
                    format!("unknown parameter type `{other}`; expected f32 or i32"),
                ));
                ScalarTy::F32
            }
        };
        let kind = match &p.ty.dims {
            None => ParamKind::Scalar(elem),
            Some((span, dims)) => {
                if dims.is_empty() {
                    errs.push(Report::at(
                        *span,
                        format!("tensor parameter `{name}` needs at least one dimension, like `[{}; seq]`", elem.name()),
                    ));
                }
                let dims = dims.iter().map(|d| check_dim(d, errs)).collect();
                ParamKind::Tensor { elem, dims }
            }
        };
        out.push(ParamDecl {
            name,
            kind,
            frozen: false,
        });
    }
    out
}

fn check_dim(d: &DimAst, errs: &mut Vec<Report>) -> Dim {
    match d {
        DimAst::Blocks(id, lit) => {
            if id != "seq" {
                errs.push(Report::at(
                    id.span(),
                    format!("only `seq` can be divided into blocks, like `seq / 128`; got `{id} / {lit}`"),
                ));
            }
            // Bounded by the longest sequence, so `seq + N - 1` stays an `int` on the device.
            match lit.base10_parse::<u32>() {
                Ok(n) if n > 0 && n as i64 <= MAX_SEQ && lit.suffix().is_empty() => {
                    Dim::SeqBlocks(n)
                }
                _ => {
                    errs.push(Report::spanned(
                        lit,
                        format!("a block size must be a positive plain integer, at most {MAX_SEQ}; got `{lit}`"),
                    ));
                    Dim::SeqBlocks(1)
                }
            }
        }
        DimAst::Named(id) => match id.to_string().as_str() {
            "batch" => Dim::Batch,
            "heads" => Dim::Heads,
            "seq" => Dim::Seq,
            other => {
                errs.push(Report::at(
                    id.span(),
                    format!("unknown dimension `{other}`; expected batch, heads, seq or a positive integer"),
                ));
                Dim::Fixed(1)
            }
        },
        DimAst::Fixed(lit) => match lit.base10_parse::<u32>() {
            Ok(0) => {
                errs.push(Report::spanned(
                    lit,
                    "fixed dimension must be positive; got 0",
                ));
                Dim::Fixed(1)
            }
            // The kernels clamp indices into a fixed dimension as `int`s.
            Ok(n) if lit.suffix().is_empty() && n <= i32::MAX as u32 => Dim::Fixed(n),
            _ => {
                errs.push(Report::spanned(
                    lit,
                    format!(
                        "fixed dimension must be a plain integer in 1..={}; got `{lit}`",
                        i32::MAX
                    ),
                ));
                Dim::Fixed(1)
            }
        },
    }
}
