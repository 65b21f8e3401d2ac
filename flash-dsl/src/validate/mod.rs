//! Validation: `ast::Decl` → [`VariantSpec`], or every error of the declaration at once.
//!
//! This is where the language's rules live: which keys exist, which head dims and dtypes are
//! supported, how parameters may be indexed, and the expression type system. Shorthands are
//! lowered here (`causal`, `softcap`, `clamp`, `window`, `alibi`), and `Expr::ToFloat` is
//! inserted wherever an int meets a float, so later stages see a plain, well-typed tree.
//!
//! Errors never stop the walk: each check records a [`Report`] and carries on (an ill-typed
//! sub-expression yields `None` and its parents stay quiet about it, so one mistake gives one
//! message).
//!
//! The parts, each depending only on those listed before it: `names` (the vocabulary),
//! `consts` (constant folding), `lower` (what shorthands mean), `decl` (head dims, dtype,
//! params), `expr` (the expression type checker); this module puts a declaration together.

pub mod arith;
mod consts;
mod decl;
mod expr;
pub mod limits;
mod lower;
mod names;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use crate::ast::{doc_text, Decl, ParamAst, Value};
use crate::diag::{Diagnostic, Report};
use crate::spec::{Dropout, Expr, F64Bits, Ty, VariantSpec};

pub use consts::{const_eval, Const};
pub use lower::{aligned_q, causal_expr};
pub use names::{FUNCTIONS, KEYS, VARIABLES};

use consts::is_constant;
use decl::{check_dtype, check_head_dim, check_params, DeclDType};
use expr::{Checker, Ctx};
use names::ty_name;

/// Validate one declaration.
pub fn validate(decl: &Decl) -> Result<VariantSpec, Vec<Diagnostic>> {
    validate_reports(decl).map_err(|rs| rs.into_iter().map(|r| r.diagnostic).collect())
}

/// Validate several declarations, also rejecting duplicate names; all errors together.
pub fn validate_all(decls: &[Decl]) -> Result<Vec<VariantSpec>, Vec<Report>> {
    let mut errs = Vec::new();
    let mut specs = Vec::new();
    let mut names = HashMap::new();
    for decl in decls {
        let name = decl.name.to_string();
        // Kernel entry points and `flash gen --out` file names are lower case, so names that
        // differ only by case would share them.
        if let Some(first) = names.insert(name.to_lowercase(), name.clone()) {
            let msg = if first == name {
                format!("duplicate variant name `{name}`")
            } else {
                format!("variant names `{first}` and `{name}` differ only by case; kernel and file names are lower case, so they would collide")
            };
            errs.push(Report::at(decl.name.span(), msg));
        }
        match validate_reports(decl) {
            Ok(spec) => specs.push(spec),
            Err(rs) => errs.extend(rs),
        }
    }
    if errs.is_empty() {
        Ok(specs)
    } else {
        Err(errs)
    }
}

/// Like [`validate`], keeping the end span of each error (the macro underlines whole ranges).
pub fn validate_reports(decl: &Decl) -> Result<VariantSpec, Vec<Report>> {
    let mut errs = Vec::new();
    if let Some(problem) = limits::ident_problem(&decl.name.to_string()) {
        errs.push(Report::at(decl.name.span(), problem));
    }
    for attr in &decl.attrs {
        if doc_text(attr).is_none() {
            errs.push(Report::spanned(
                attr,
                "only doc comments are allowed on a declaration",
            ));
        }
    }

    let mut seen: HashMap<String, ()> = HashMap::new();
    let mut head_dim = None;
    let mut dtype = None;
    let mut scale = None;
    let mut params_ast: Option<&[ParamAst]> = None;
    let mut mask_ast = None;
    let mut score_ast = None;
    let mut dropout_ast = None;
    let mut sparsity_ast = None;
    let mut scales_ast = None;
    let mut v_scales_ast = None;
    let mut head_dim_ok = true;
    let mut dtype_ok = true;
    let mut fp8 = None;
    let mut qk_ast: Option<&syn::Ident> = None;
    let mut v_ast: Option<&syn::Ident> = None;
    let mut v_layout_ast: Option<&syn::Ident> = None;
    for entry in &decl.entries {
        let key = entry.key.to_string();
        if !KEYS.contains(&key.as_str()) {
            errs.push(Report::at(
                entry.key.span(),
                format!("unknown key `{key}`; expected one of {}", KEYS.join(", ")),
            ));
            continue;
        }
        if seen.insert(key.clone(), ()).is_some() {
            errs.push(Report::at(
                entry.key.span(),
                format!("duplicate key `{key}`"),
            ));
            continue;
        }
        match (key.as_str(), &entry.value) {
            ("head_dim", Value::HeadDim(hd)) => {
                head_dim = check_head_dim(hd, &mut errs);
                head_dim_ok = head_dim.is_some();
            }
            ("dtype", Value::DType(id)) => {
                // `e4m3`: fp8 inputs (codes and scales), a bf16 output.
                (dtype, fp8) = match check_dtype(id, &mut errs) {
                    Some(DeclDType::Plain(d)) => (Some(d), None),
                    Some(DeclDType::Fp8(f)) => (Some(crate::spec::DType::Bf16), Some(f)),
                    None => (None, None),
                };
                dtype_ok = dtype.is_some();
            }
            ("params", Value::Params(ps)) => params_ast = Some(ps),
            ("scale", Value::Expr(e)) => scale = Some(e),
            ("mask", Value::Expr(e)) => mask_ast = Some(e),
            ("score", Value::Expr(e)) => score_ast = Some(e),
            ("dropout", Value::Expr(e)) => dropout_ast = Some(e),
            ("sparsity", Value::Expr(e)) => sparsity_ast = Some(e),
            ("scales", Value::Expr(e)) => scales_ast = Some(e),
            ("v_scales", Value::Expr(e)) => v_scales_ast = Some(e),
            ("qk", Value::DType(id)) => qk_ast = Some(id),
            ("v", Value::DType(id)) => v_ast = Some(id),
            ("v_layout", Value::DType(id)) => v_layout_ast = Some(id),
            _ => unreachable!("the parser picks the value form from the key"),
        }
    }
    let name = decl.name.to_string();
    if !seen.contains_key("head_dim") {
        errs.push(Report::at(
            decl.name.span(),
            format!("missing required key `head_dim` in `{name}`, e.g. `head_dim: 128`"),
        ));
    }
    if !seen.contains_key("dtype") {
        errs.push(Report::at(
            decl.name.span(),
            format!("missing required key `dtype` in `{name}`: `dtype: bf16` or `dtype: f16`"),
        ));
    }

    let params = check_params(params_ast.unwrap_or(&[]), &mut errs);

    let scale = scale.and_then(|sv| {
        let mut ck = Checker::new(&params, Ctx::Scale, &mut errs);
        let (e, ty) = ck.expr(&sv.expr)?;
        ck.numeric(&sv.tokens, (e.clone(), ty))?;
        if !is_constant(&e) {
            errs.push(Report::spanned(
                &sv.tokens,
                "scale must be a constant number, like `0.125`",
            ));
            return None;
        }
        let v = match const_eval(&e) {
            Some(Const::Int(v)) => v as f64,
            Some(Const::Float(v)) => v,
            _ => {
                // Division by zero or overflow in a constant: no value to check.
                errs.push(Report::spanned(
                    &sv.tokens,
                    "scale must be a constant number, like `0.125`; this one has no value",
                ));
                return None;
            }
        };
        if !(v > 0.0 && v.is_finite()) {
            errs.push(Report::spanned(
                &sv.tokens,
                format!("scale must be positive and finite; got {v}"),
            ));
            return None;
        }
        // The kernels receive it (and its product with log2(e)) as an f32.
        let narrow = (v * std::f64::consts::LOG2_E) as f32;
        if !(narrow > 0.0 && narrow.is_finite() && (v as f32) > 0.0) {
            errs.push(Report::spanned(
                &sv.tokens,
                format!(
                    "scale must be positive and finite as an f32 (the kernels compute in f32); {v} is not"
                ),
            ));
            return None;
        }
        Some(F64Bits::new(v))
    });

    let mask = mask_ast.and_then(|mv| {
        let mut ck = Checker::new(&params, Ctx::Mask, &mut errs);
        let (e, ty) = ck.expr(&mv.expr)?;
        if ty != Ty::Bool {
            errs.push(Report::spanned(
                &mv.tokens,
                format!("mask must be a bool expression; got {}", ty_name(ty)),
            ));
            return None;
        }
        if let Some(Const::Bool(false)) = const_eval(&e) {
            errs.push(Report::spanned(
                &mv.tokens,
                "mask is always false, so every key would be masked out",
            ));
            return None;
        }
        Some(e)
    });

    let score = score_ast.and_then(|sv| {
        let mut ck = Checker::new(&params, Ctx::Score, &mut errs);
        let (e, ty) = ck.expr(&sv.expr)?;
        match ty {
            Ty::Float => Some(e),
            Ty::Int => Some(Expr::ToFloat(Box::new(e))),
            Ty::Bool => {
                errs.push(Report::spanned(
                    &sv.tokens,
                    "score must be a number (float, or int promoted to float); got bool",
                ));
                None
            }
        }
    });

    let dropout = dropout_ast.and_then(|dv| check_dropout(dv, &params, &mut errs));
    if let (Some(Dropout::Param(i)), Some(dv)) = (dropout, dropout_ast) {
        // The probability steps the mask, so it has no gradient; a score or mask reading it
        // would ask for one.
        let reads = |e: &Option<Expr>| {
            let mut found = false;
            if let Some(e) = e {
                e.visit(&mut |x| found |= matches!(x, Expr::Scalar(j) if *j == i));
            }
            found
        };
        if reads(&mask) || reads(&score) {
            errs.push(Report::spanned(
                &dv.tokens,
                format!(
                    "the dropout probability `{}` cannot also be read by `mask` or `score`; declare a separate parameter for them",
                    params[i].name
                ),
            ));
        }
    }
    if dropout.is_some() {
        for p in params_ast.unwrap_or(&[]) {
            if p.name == "dropout_seed" || p.name == "dropout_offset" {
                errs.push(Report::at(
                    p.name.span(),
                    format!(
                        "`{}` is reserved with dropout: the generated params struct holds the generator's seed and offset under that name",
                        p.name
                    ),
                ));
            }
        }
    }

    let sparsity = sparsity_ast.and_then(|sv| check_sparsity(sv, &params, &mut errs));
    let scaling = match scales_ast {
        Some(sv) if fp8.is_none() && dtype_ok => {
            errs.push(Report::spanned(
                &sv.tokens,
                "`scales` groups the scales of fp8 inputs; it needs `dtype: e4m3`",
            ));
            None
        }
        Some(sv) => check_scales(sv, false, &mut errs),
        None => Some(crate::fp8::Scaling::PerBlock {
            rows: crate::spec::FP8_SCALE_BLOCK as usize,
        }),
    };
    // `v_scales`: V's grouping apart from Q's and K's (per channel too). `Some(None)`: absent.
    let v_scales = match v_scales_ast {
        Some(sv) if fp8.is_none() => {
            if dtype_ok {
                errs.push(Report::spanned(
                    &sv.tokens,
                    "`v_scales` groups the scales of fp8 V; it needs `dtype: e4m3`",
                ));
            }
            None
        }
        Some(sv) => check_scales(sv, true, &mut errs).map(Some),
        None => Some(None),
    };
    // `qk: int8`: Q and K as int8 codes (Q·Kᵀ on the integer tensor cores), V still e4m3.
    use crate::fp8::Fp8Format;
    let qk_format = fp8_choice(
        qk_ast,
        (fp8.is_some(), dtype_ok),
        (
            "`qk` picks the code format of fp8 Q and K",
            "Q/K code format",
        ),
        &[("int8", Fp8Format::Int8), ("e4m3", Fp8Format::E4m3)],
        &mut errs,
    );
    // `v: bf16`: V in bf16 (a bf16 P·V product), Q and K still codes.
    let v_bf16 = fp8_choice(
        v_ast,
        (fp8.is_some(), dtype_ok),
        ("`v` picks V's type beside fp8 Q and K", "V type"),
        &[("bf16", true), ("e4m3", false)],
        &mut errs,
    );
    // `v_layout: rows`: V's codes as K's, transposed by the kernel in shared memory.
    let v_rows = fp8_choice(
        v_layout_ast,
        (fp8.is_some(), dtype_ok),
        (
            "`v_layout` picks how fp8 V's codes are laid out",
            "V layout",
        ),
        &[("rows", true), ("transposed", false)],
        &mut errs,
    );
    if let (Some(true), Some(true), Some(id)) = (v_rows, v_bf16, v_layout_ast) {
        errs.push(Report::at(
            id.span(),
            "`v_layout` lays out V's e4m3 codes; with `v: bf16` V is read in rows as it is",
        ));
    }
    if let (Some(true), Some(sv)) = (v_bf16, v_scales_ast) {
        errs.push(Report::spanned(
            &sv.tokens,
            "`v_scales` groups the scales of V's e4m3 codes; with `v: bf16` V has no scales",
        ));
    }
    let fp8 = fp8
        .zip(scaling)
        .zip(qk_format)
        .zip(v_bf16)
        .zip(v_rows)
        .zip(v_scales)
        .map(
            |(((((format, scaling), qk_format), v_bf16), v_rows), v_scales)| crate::fp8::Fp8Spec {
                format,
                scaling,
                qk_format,
                v_bf16,
                v_rows: v_rows && !v_bf16,
                // The same grouping as Q's and K's is no grouping of its own (`v_own`).
                v_scales: v_scales.filter(|&v| v != scaling && !v_bf16),
            },
        );

    if !errs.is_empty() || !head_dim_ok || !dtype_ok {
        return Err(errs);
    }
    let (Some((head_dim_qk, head_dim_v)), Some(dtype)) = (head_dim, dtype) else {
        return Err(errs);
    };
    Ok(VariantSpec {
        name,
        doc: decl.doc(),
        head_dim_qk,
        head_dim_v,
        dtype,
        scale,
        params,
        mask,
        score,
        dropout,
        sparsity,
        fp8,
    })
}

/// A word that only fp8 variants take (`qk: int8`, `v: bf16`): the value of `id` among
/// `choices` (the last one when absent), or an error at its token — naming the key's use
/// (`what.0`) when the variant is not fp8 (and its dtype is otherwise fine), or the kind of
/// value (`what.1`) and the accepted words when the word is unknown.
fn fp8_choice<T: Copy>(
    id: Option<&syn::Ident>,
    (fp8, dtype_ok): (bool, bool),
    what: (&str, &str),
    choices: &[(&str, T)],
    errs: &mut Vec<Report>,
) -> Option<T> {
    let default = choices.last().map(|c| c.1);
    let Some(id) = id else {
        return default;
    };
    if !fp8 {
        if dtype_ok {
            errs.push(Report::at(
                id.span(),
                format!("{}; it needs `dtype: e4m3`", what.0),
            ));
        }
        return None;
    }
    let word = id.to_string();
    match choices.iter().find(|c| c.0 == word) {
        Some(c) => Some(c.1),
        None => {
            let names: Vec<&str> = choices.iter().map(|c| c.0).collect();
            errs.push(Report::at(
                id.span(),
                format!(
                    "unknown {} `{word}`; expected {}",
                    what.1,
                    names.join(" or ")
                ),
            ));
            None
        }
    }
}

/// `scales: per_block(128) | per_head | per_tensor`: how an fp8 variant's scales are grouped. A
/// block is one tile of the kernel (128 queries or keys), so 128 is the only block size. V's
/// own grouping (`v_scales`, `for_v`) may also be `per_channel`; Q's and K's may not.
fn check_scales(
    sv: &crate::ast::ExprValue,
    for_v: bool,
    errs: &mut Vec<Report>,
) -> Option<crate::fp8::Scaling> {
    use crate::fp8::Scaling;
    let usage = if for_v {
        "V's scales are `per_block(128)` (one per 128 keys of each batch and head), `per_head`, `per_tensor` or `per_channel` (one per column of the head dim of each batch and head); absent, they follow `scales`"
    } else {
        "scales are `per_block(128)` (one per 128 positions of each batch and head, the default), `per_head` or `per_tensor`"
    };
    let block = crate::spec::FP8_SCALE_BLOCK as usize;
    let scaling = match &sv.expr {
        syn::Expr::Path(p) => match p.path.get_ident().map(|i| i.to_string()).as_deref() {
            Some("per_head") => Some(Scaling::PerHead),
            Some("per_tensor") => Some(Scaling::PerTensor),
            Some("per_block") => Some(Scaling::PerBlock { rows: block }),
            Some("per_channel") if for_v => Some(Scaling::PerChannel),
            Some("per_channel") => {
                errs.push(Report::spanned(
                    &sv.tokens,
                    "per-channel scales are V's alone (`v_scales: per_channel`): Q·Kᵀ sums over the channels, so a channel's scale of Q or K cannot be taken out of the product",
                ));
                return None;
            }
            _ => None,
        },
        syn::Expr::Call(c) => {
            let is_block = matches!(&*c.func, syn::Expr::Path(p) if p.path.is_ident("per_block"));
            match (is_block, c.args.first(), c.args.len()) {
                (
                    true,
                    Some(syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Int(n),
                        ..
                    })),
                    1,
                ) => match n.base10_parse::<usize>() {
                    Ok(rows) if rows == block => Some(Scaling::PerBlock { rows }),
                    Ok(rows) => {
                        errs.push(Report::spanned(
                            &sv.tokens,
                            format!("a scale block is one tile of the fp8 kernel, {block} positions; got {rows}"),
                        ));
                        return None;
                    }
                    Err(_) => None,
                },
                _ => None,
            }
        }
        _ => None,
    };
    if scaling.is_none() {
        errs.push(Report::spanned(&sv.tokens, usage));
    }
    scaling
}

/// Block sizes must be whole numbers of the kernels' tiles (128 positions), so that a tile never
/// straddles two blocks and the layout decides whole tiles.
pub const SPARSITY_BLOCK_MULTIPLE: u32 = 128;

/// `sparsity: blocks`, naming an `i32` tensor parameter `[(batch,) (heads,) seq / N, K]`.
fn check_sparsity(
    sv: &crate::ast::ExprValue,
    params: &[crate::spec::ParamDecl],
    errs: &mut Vec<Report>,
) -> Option<crate::spec::Sparsity> {
    use crate::spec::{Dim, ParamKind, ScalarTy, Sparsity};
    let usage = "sparsity names an `i32` tensor parameter holding the key blocks of each query block, like `sparsity: blocks` with `params: { blocks: [i32; heads, seq / 128, 8] }`";
    let name = match &sv.expr {
        syn::Expr::Path(p) => p.path.get_ident().map(|i| i.to_string()),
        _ => None,
    };
    let Some(name) = name else {
        errs.push(Report::spanned(&sv.tokens, usage));
        return None;
    };
    let Some(i) = params.iter().position(|d| d.name == name) else {
        errs.push(Report::spanned(
            &sv.tokens,
            format!("unknown parameter `{name}`; {usage}"),
        ));
        return None;
    };
    let ParamKind::Tensor {
        elem: ScalarTy::I32,
        dims,
    } = &params[i].kind
    else {
        errs.push(Report::spanned(
            &sv.tokens,
            format!("sparsity layout `{name}` must be an `i32` tensor; {usage}"),
        ));
        return None;
    };
    let (lead, rest) = dims.split_at(dims.len().saturating_sub(2));
    let shape_ok = matches!(
        lead,
        [] | [Dim::Batch] | [Dim::Heads] | [Dim::Batch, Dim::Heads]
    ) && matches!(rest, [Dim::SeqBlocks(_), Dim::Fixed(_)]);
    if !shape_ok {
        errs.push(Report::spanned(
            &sv.tokens,
            format!(
                "sparsity layout `{name}` must have the dimensions `[(batch,) (heads,) seq / N, K]` (K key blocks per query block of N positions); it is declared `[{}]`",
                dims.iter().map(|d| names::dim_name(*d)).collect::<Vec<_>>().join(", ")
            ),
        ));
        return None;
    }
    let (&[Dim::SeqBlocks(block), Dim::Fixed(slots)], per_batch, per_head) =
        (rest, lead.contains(&Dim::Batch), lead.contains(&Dim::Heads))
    else {
        unreachable!("checked above")
    };
    if block % SPARSITY_BLOCK_MULTIPLE != 0 {
        errs.push(Report::spanned(
            &sv.tokens,
            format!(
                "sparsity layout `{name}` has blocks of {block} positions; a block must be a multiple of {SPARSITY_BLOCK_MULTIPLE} (the kernels' tile), like `seq / 128`"
            ),
        ));
        return None;
    }
    Some(Sparsity {
        param: i,
        block,
        slots,
        per_batch,
        per_head,
    })
}

/// `dropout: 0.1` (a constant in `[0, 1)`) or `dropout: p` (a scalar `f32` parameter).
fn check_dropout(
    dv: &crate::ast::ExprValue,
    params: &[crate::spec::ParamDecl],
    errs: &mut Vec<Report>,
) -> Option<Dropout> {
    use crate::spec::{ParamKind, ScalarTy};
    if let syn::Expr::Path(p) = &dv.expr {
        if let Some(id) = p.path.get_ident() {
            let name = id.to_string();
            if let Some(i) = params.iter().position(|d| d.name == name) {
                return match &params[i].kind {
                    ParamKind::Scalar(ScalarTy::F32) => Some(Dropout::Param(i)),
                    ParamKind::Scalar(t) => {
                        errs.push(Report::spanned(
                            &dv.tokens,
                            format!("dropout parameter `{name}` must be a scalar `f32` probability; it is declared `{}`", t.name()),
                        ));
                        None
                    }
                    ParamKind::Tensor { .. } => {
                        errs.push(Report::spanned(
                            &dv.tokens,
                            format!("dropout parameter `{name}` must be a scalar `f32` probability, not a tensor: one probability per launch"),
                        ));
                        None
                    }
                };
            }
        }
    }
    let mut ck = Checker::new(params, Ctx::Scale, errs);
    let (e, ty) = ck.expr(&dv.expr)?;
    ck.numeric(&dv.tokens, (e.clone(), ty))?;
    let usage = "dropout must be a constant probability like `0.1` or the name of a scalar `f32` parameter, like `dropout: p` with `params: { p: f32 }`";
    if !is_constant(&e) {
        errs.push(Report::spanned(&dv.tokens, usage));
        return None;
    }
    let v = match const_eval(&e) {
        Some(Const::Int(v)) => v as f64,
        Some(Const::Float(v)) => v,
        _ => {
            errs.push(Report::spanned(&dv.tokens, usage));
            return None;
        }
    };
    if !(0.0..1.0).contains(&v) {
        errs.push(Report::spanned(
            &dv.tokens,
            format!("dropout probability must lie in [0, 1); got {v}"),
        ));
        return None;
    }
    // The kernels receive it as an f32.
    if v as f32 >= 1.0 {
        errs.push(Report::spanned(
            &dv.tokens,
            format!(
                "dropout probability must lie in [0, 1) as an f32; {v} rounds to {}",
                v as f32
            ),
        ));
        return None;
    }
    Some(Dropout::Const(F64Bits::new(v)))
}
