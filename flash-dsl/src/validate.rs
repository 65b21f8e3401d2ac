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

use std::collections::HashMap;

use quote::ToTokens;

use crate::ast::{doc_text, Decl, DimAst, HeadDim, ParamAst, Value};
use crate::diag::{Diagnostic, Report};
use crate::spec::{
    BinOp, DType, Dim, Expr, F64Bits, Func, ParamDecl, ParamKind, ScalarTy, Ty, UnOp, Var,
    VariantSpec,
};

/// The keys of a declaration body.
pub const KEYS: &[&str] = &["head_dim", "dtype", "scale", "params", "mask", "score"];
/// Built-in variables of expressions.
pub const VARIABLES: &[&str] = &["b", "h", "q", "k", "s", "seq_q", "seq_k"];
/// Built-in functions and shorthands.
pub const FUNCTIONS: &[&str] = &[
    "exp", "log", "tanh", "sigmoid", "sqrt", "abs", "min", "max", "softcap", "clamp", "window",
    "alibi",
];

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
        if names.insert(name.clone(), ()).is_some() {
            errs.push(Report::at(
                decl.name.span(),
                format!("duplicate variant name `{name}`"),
            ));
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
    let mut head_dim_ok = true;
    let mut dtype_ok = true;
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
                dtype = check_dtype(id, &mut errs);
                dtype_ok = dtype.is_some();
            }
            ("params", Value::Params(ps)) => params_ast = Some(ps),
            ("scale", Value::Expr(e)) => scale = Some(e),
            ("mask", Value::Expr(e)) => mask_ast = Some(e),
            ("score", Value::Expr(e)) => score_ast = Some(e),
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
    })
}

fn check_head_dim(hd: &HeadDim, errs: &mut Vec<Report>) -> Option<(u32, u32)> {
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

fn check_dtype(id: &syn::Ident, errs: &mut Vec<Report>) -> Option<DType> {
    let name = id.to_string();
    match name.as_str() {
        "bf16" => Some(DType::Bf16),
        "f16" => Some(DType::F16),
        n if n.starts_with("fp8")
            || n.starts_with("f8")
            || n.starts_with("e4m3")
            || n.starts_with("e5m2") =>
        {
            errs.push(Report::at(
                id.span(),
                format!("fp8 is not supported yet; got `{name}`, use bf16 or f16"),
            ));
            None
        }
        _ => {
            errs.push(Report::at(
                id.span(),
                format!("unknown dtype `{name}`; expected bf16 or f16"),
            ));
            None
        }
    }
}

/// Checks the parameter list. Parameters with errors are still entered (with a best-guess type)
/// so that their uses do not add "unknown identifier" noise; the spec is rejected anyway.
fn check_params(ps: &[ParamAst], errs: &mut Vec<Report>) -> Vec<ParamDecl> {
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
        if VARIABLES.contains(&name.as_str()) || name == "causal" {
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
        out.push(ParamDecl { name, kind });
    }
    out
}

fn check_dim(d: &DimAst, errs: &mut Vec<Report>) -> Dim {
    match d {
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
            Ok(n) if lit.suffix().is_empty() => Dim::Fixed(n),
            _ => {
                errs.push(Report::spanned(
                    lit,
                    format!(
                        "fixed dimension must be a plain integer in 1..={}; got `{lit}`",
                        u32::MAX
                    ),
                ));
                Dim::Fixed(1)
            }
        },
    }
}

fn dim_name(d: Dim) -> String {
    match d {
        Dim::Batch => "batch".into(),
        Dim::Heads => "heads".into(),
        Dim::Seq => "seq".into(),
        Dim::Fixed(n) => n.to_string(),
    }
}

fn ty_name(t: Ty) -> &'static str {
    match t {
        Ty::Int => "int",
        Ty::Float => "float",
        Ty::Bool => "bool",
    }
}

/// `q + (seq_k - seq_q)`: the query position aligned to the end of the keys (bottom-right
/// causal alignment, as FlashAttention ≥ 2.1).
pub fn aligned_q() -> Expr {
    Expr::bin(
        BinOp::Add,
        Expr::Var(Var::Q),
        Expr::bin(BinOp::Sub, Expr::Var(Var::SeqK), Expr::Var(Var::SeqQ)),
    )
}

/// What `causal` lowers to: `k <= q + (seq_k - seq_q)`.
pub fn causal_expr() -> Expr {
    Expr::bin(BinOp::Le, Expr::Var(Var::K), aligned_q())
}

fn to_float((e, ty): (Expr, Ty)) -> Expr {
    match ty {
        Ty::Int => match e {
            Expr::Int(v) => Expr::float(v as f64),
            e => Expr::ToFloat(Box::new(e)),
        },
        _ => e,
    }
}

/// Bring two numbers to a common type: an int meeting a float becomes a float.
fn promote(a: (Expr, Ty), b: (Expr, Ty)) -> (Expr, Expr, Ty) {
    if a.1 == b.1 {
        (a.0, b.0, a.1)
    } else {
        (to_float(a), to_float(b), Ty::Float)
    }
}

fn is_constant(e: &Expr) -> bool {
    let mut c = true;
    e.visit(&mut |n| c &= !matches!(n, Expr::Var(_) | Expr::Scalar(_) | Expr::Index(..)));
    c
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Mask,
    Score,
    Scale,
}

type Typed = (Expr, Ty);

struct Checker<'a> {
    params: &'a [ParamDecl],
    ctx: Ctx,
    errs: &'a mut Vec<Report>,
}

/// Strip parentheses and invisible groups.
fn unparen(e: &syn::Expr) -> &syn::Expr {
    match e {
        syn::Expr::Paren(p) => unparen(&p.expr),
        syn::Expr::Group(g) => unparen(&g.expr),
        e => e,
    }
}

/// The identifier of a plain one-segment path expression.
fn plain_ident(e: &syn::Expr) -> Option<String> {
    match unparen(e) {
        syn::Expr::Path(p) if p.qself.is_none() => p.path.get_ident().map(|i| i.to_string()),
        _ => None,
    }
}

impl<'a> Checker<'a> {
    fn new(params: &'a [ParamDecl], ctx: Ctx, errs: &'a mut Vec<Report>) -> Self {
        Checker { params, ctx, errs }
    }

    fn err(&mut self, t: &dyn ToTokens, msg: impl Into<String>) {
        self.errs.push(Report::spanned(t, msg));
    }

    fn param(&self, name: &str) -> Option<usize> {
        self.params.iter().position(|p| p.name == name)
    }

    fn numeric(&mut self, t: &dyn ToTokens, v: Typed) -> Option<Typed> {
        if v.1 == Ty::Bool {
            self.err(t, "expected a number, found a bool expression");
            None
        } else {
            Some(v)
        }
    }

    fn boolean(&mut self, t: &dyn ToTokens, v: Typed) -> Option<Typed> {
        if v.1 != Ty::Bool {
            self.err(
                t,
                format!("expected a bool, found {} expression", ty_name(v.1)),
            );
            None
        } else {
            Some(v)
        }
    }

    fn expr(&mut self, e: &syn::Expr) -> Option<Typed> {
        match e {
            syn::Expr::Lit(l) => self.lit(&l.lit),
            syn::Expr::Paren(p) => self.expr(&p.expr),
            syn::Expr::Group(g) => self.expr(&g.expr),
            syn::Expr::Path(p) => self.path(p),
            syn::Expr::Unary(u) => self.unary(u),
            syn::Expr::Binary(b) => self.binary(b),
            syn::Expr::Call(c) => self.call(c),
            syn::Expr::Index(_) => self.index(e),
            syn::Expr::If(i) => self.select(i),
            syn::Expr::Tuple(_) => {
                self.err(e, "tuples are not expressions here; commas belong only inside an index, like `bias[h, q - k]`, or a call");
                None
            }
            _ => {
                self.err(e, "unsupported expression; expected literals, variables, parameters, operators, calls, indexing or `if .. else ..`");
                None
            }
        }
    }

    fn lit(&mut self, lit: &syn::Lit) -> Option<Typed> {
        match lit {
            syn::Lit::Int(i) => {
                if !i.suffix().is_empty() {
                    self.err(
                        i,
                        format!(
                            "literal suffixes are not supported; write `{}`",
                            i.base10_digits()
                        ),
                    );
                    return None;
                }
                match i.base10_parse::<i64>() {
                    Ok(v) => Some((Expr::Int(v), Ty::Int)),
                    Err(_) => {
                        self.err(i, format!("integer literal out of range; got {i}"));
                        None
                    }
                }
            }
            syn::Lit::Float(f) => {
                if !f.suffix().is_empty() {
                    self.err(
                        f,
                        format!(
                            "literal suffixes are not supported; write `{}`",
                            f.base10_digits()
                        ),
                    );
                    return None;
                }
                match f.base10_parse::<f64>() {
                    Ok(v) => Some((Expr::float(v), Ty::Float)),
                    Err(_) => {
                        self.err(f, format!("invalid float literal `{f}`"));
                        None
                    }
                }
            }
            syn::Lit::Bool(b) => Some((Expr::Bool(b.value), Ty::Bool)),
            other => {
                self.err(
                    other,
                    "unsupported literal; expected an int, a float, `true` or `false`",
                );
                None
            }
        }
    }

    fn path(&mut self, p: &syn::ExprPath) -> Option<Typed> {
        let Some(id) = p.path.get_ident().filter(|_| p.qself.is_none()) else {
            self.err(p, "unsupported path; expected a variable or parameter name");
            return None;
        };
        let name = id.to_string();
        let var = match name.as_str() {
            "b" => Some(Var::B),
            "h" => Some(Var::H),
            "q" => Some(Var::Q),
            "k" => Some(Var::K),
            "s" => Some(Var::S),
            "seq_q" => Some(Var::SeqQ),
            "seq_k" => Some(Var::SeqK),
            _ => None,
        };
        if let Some(v) = var {
            if v == Var::S && self.ctx == Ctx::Mask {
                self.err(p, "`s` (the score) cannot be used in `mask`; the mask decides visibility without the score, use `score` to change it");
                return None;
            }
            return Some((Expr::Var(v), v.ty()));
        }
        if name == "causal" {
            return Some((causal_expr(), Ty::Bool));
        }
        if let Some(i) = self.param(&name) {
            return match &self.params[i].kind {
                ParamKind::Scalar(t) => Some((Expr::Scalar(i), t.ty())),
                ParamKind::Tensor { dims, .. } => {
                    let example: Vec<&str> = dims
                        .iter()
                        .map(|d| match d {
                            Dim::Batch => "b",
                            Dim::Heads => "h",
                            Dim::Seq => "q",
                            Dim::Fixed(_) => "0",
                        })
                        .collect();
                    self.err(
                        p,
                        format!(
                            "`{name}` is a tensor parameter and must be indexed, like `{name}[{}]`",
                            example.join(", ")
                        ),
                    );
                    None
                }
            };
        }
        if FUNCTIONS.contains(&name.as_str()) {
            self.err(
                p,
                format!("`{name}` is a function; call it, like `{name}(..)`"),
            );
        } else {
            self.err(p, format!("unknown identifier `{name}`; expected one of b, h, q, k, s, seq_q, seq_k, causal or a declared parameter"));
        }
        None
    }

    fn unary(&mut self, u: &syn::ExprUnary) -> Option<Typed> {
        let v = self.expr(&u.expr)?;
        match u.op {
            syn::UnOp::Neg(_) => {
                let (e, t) = self.numeric(&u.expr, v)?;
                let e = match e {
                    Expr::Int(x) => Expr::Int(x.checked_neg()?),
                    Expr::Float(x) => Expr::float(-x.get()),
                    e => Expr::Unary(UnOp::Neg, Box::new(e)),
                };
                Some((e, t))
            }
            syn::UnOp::Not(_) => {
                let (e, t) = self.boolean(&u.expr, v)?;
                Some((Expr::Unary(UnOp::Not, Box::new(e)), t))
            }
            _ => {
                self.err(u, "unsupported unary operator; expected `-` or `!`");
                None
            }
        }
    }

    fn binary(&mut self, b: &syn::ExprBinary) -> Option<Typed> {
        use syn::BinOp as S;
        let op = match b.op {
            S::Add(_) => BinOp::Add,
            S::Sub(_) => BinOp::Sub,
            S::Mul(_) => BinOp::Mul,
            S::Div(_) => BinOp::Div,
            S::Rem(_) => BinOp::Rem,
            S::Lt(_) => BinOp::Lt,
            S::Le(_) => BinOp::Le,
            S::Gt(_) => BinOp::Gt,
            S::Ge(_) => BinOp::Ge,
            S::Eq(_) => BinOp::Eq,
            S::Ne(_) => BinOp::Ne,
            S::And(_) => BinOp::And,
            S::Or(_) => BinOp::Or,
            other => {
                self.err(
                    &other,
                    format!(
                        "operator `{}` is not supported; expected + - * / % < <= > >= == != && ||",
                        other.to_token_stream()
                    ),
                );
                return None;
            }
        };
        // Check both sides before giving up, so errors in both are reported.
        let l = self.expr(&b.left);
        let r = self.expr(&b.right);
        let (l, r) = (l?, r?);
        match op {
            BinOp::Add | BinOp::Sub | BinOp::Mul => {
                let l = self.numeric(&b.left, l);
                let r = self.numeric(&b.right, r);
                let (x, y, t) = promote(l?, r?);
                Some((Expr::bin(op, x, y), t))
            }
            BinOp::Div => {
                let l = self.numeric(&b.left, l);
                let r = self.numeric(&b.right, r);
                Some((Expr::bin(op, to_float(l?), to_float(r?)), Ty::Float))
            }
            BinOp::Rem => {
                let l = self.numeric(&b.left, l);
                let r = self.numeric(&b.right, r);
                let (l, r) = (l?, r?);
                if l.1 == Ty::Float || r.1 == Ty::Float {
                    self.err(b, "`%` takes integer operands; got a float operand");
                    return None;
                }
                Some((Expr::bin(op, l.0, r.0), Ty::Int))
            }
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                let l = self.numeric(&b.left, l);
                let r = self.numeric(&b.right, r);
                let (x, y, _) = promote(l?, r?);
                Some((Expr::bin(op, x, y), Ty::Bool))
            }
            BinOp::Eq | BinOp::Ne => {
                if (l.1 == Ty::Bool) != (r.1 == Ty::Bool) {
                    self.err(
                        b,
                        format!("cannot compare {} with {}", ty_name(l.1), ty_name(r.1)),
                    );
                    return None;
                }
                let (x, y, _) = promote(l, r);
                Some((Expr::bin(op, x, y), Ty::Bool))
            }
            BinOp::And | BinOp::Or => {
                let l = self.boolean(&b.left, l);
                let r = self.boolean(&b.right, r);
                Some((Expr::bin(op, l?.0, r?.0), Ty::Bool))
            }
        }
    }

    fn call(&mut self, c: &syn::ExprCall) -> Option<Typed> {
        let Some(name) = plain_ident(&c.func) else {
            self.err(
                &c.func,
                "only builtin functions can be called, like `tanh(x)`",
            );
            return None;
        };
        let (arity, sig) = match name.as_str() {
            "exp" | "log" | "tanh" | "sigmoid" | "sqrt" | "abs" => (1, "(x)"),
            "min" | "max" => (2, "(a, b)"),
            "softcap" => (2, "(x, cap)"),
            "clamp" => (3, "(x, lo, hi)"),
            "window" => (1, "(n)"),
            "alibi" => (1, "(slope)"),
            _ => {
                self.err(
                    &c.func,
                    format!(
                        "unknown function `{name}`; expected one of {}",
                        FUNCTIONS.join(", ")
                    ),
                );
                return None;
            }
        };
        if c.args.len() != arity {
            self.err(
                c,
                format!(
                    "`{name}` takes {arity} argument{}, as in `{name}{sig}`; got {}",
                    if arity == 1 { "" } else { "s" },
                    c.args.len()
                ),
            );
            return None;
        }
        let raw: Vec<&syn::Expr> = c.args.iter().collect();
        let typed: Vec<Option<Typed>> = raw.iter().map(|a| self.expr(a)).collect();
        let typed: Vec<Typed> = typed.into_iter().collect::<Option<_>>()?;
        if name == "window" {
            return self.window(raw[0], typed.into_iter().next()?);
        }
        let nums: Vec<Option<Typed>> = raw
            .iter()
            .zip(typed)
            .map(|(a, t)| self.numeric(a, t))
            .collect();
        let mut nums: Vec<Typed> = nums.into_iter().collect::<Option<_>>()?;
        let func = |f: Func, args: Vec<Expr>| Expr::Call(f, args);
        let float1 = |f: Func, x: Typed| (func(f, vec![to_float(x)]), Ty::Float);
        let x = nums.remove(0);
        Some(match name.as_str() {
            "exp" => float1(Func::Exp, x),
            "log" => float1(Func::Log, x),
            "tanh" => float1(Func::Tanh, x),
            "sigmoid" => float1(Func::Sigmoid, x),
            "sqrt" => float1(Func::Sqrt, x),
            "abs" => (func(Func::Abs, vec![x.0]), x.1),
            "min" | "max" => {
                let f = if name == "min" { Func::Min } else { Func::Max };
                let (a, b, t) = promote(x, nums.remove(0));
                (func(f, vec![a, b]), t)
            }
            "softcap" => {
                // cap * tanh(x / cap)
                let cap = nums.remove(0);
                let inner = Expr::bin(BinOp::Div, to_float(x), to_float(cap.clone()));
                let e = Expr::bin(BinOp::Mul, to_float(cap), func(Func::Tanh, vec![inner]));
                (e, Ty::Float)
            }
            "clamp" => {
                // min(max(x, lo), hi), all three in one type
                let (lo, hi) = (nums.remove(0), nums.remove(0));
                let t = if [x.1, lo.1, hi.1].contains(&Ty::Float) {
                    Ty::Float
                } else {
                    Ty::Int
                };
                let conv = |v: Typed| if t == Ty::Float { to_float(v) } else { v.0 };
                let max = func(Func::Max, vec![conv(x), conv(lo)]);
                (func(Func::Min, vec![max, conv(hi)]), t)
            }
            "alibi" => {
                // slope * float(k - (q + seq_k - seq_q))
                let dist = Expr::bin(BinOp::Sub, Expr::Var(Var::K), aligned_q());
                let e = Expr::bin(BinOp::Mul, to_float(x), Expr::ToFloat(Box::new(dist)));
                (e, Ty::Float)
            }
            _ => unreachable!("arity table and lowering cover the same names"),
        })
    }

    /// `window(n)` → `causal && (q + seq_k - seq_q) - k < n`.
    fn window(&mut self, raw: &syn::Expr, n: Typed) -> Option<Typed> {
        let ok = match (&n, const_eval(&n.0)) {
            (_, Some(Const::Int(v))) if v <= 0 => {
                self.err(raw, format!("window size must be positive; got {v}"));
                false
            }
            (_, Some(Const::Int(_))) => true,
            ((Expr::Scalar(_), Ty::Int), None) => true,
            ((_, Ty::Float), _) => {
                self.err(raw, "window size must be an integer; got float");
                false
            }
            _ => {
                self.err(
                    raw,
                    "window size must be a positive integer literal or an i32 scalar parameter",
                );
                false
            }
        };
        if !ok {
            return None;
        }
        let dist = Expr::bin(BinOp::Sub, aligned_q(), Expr::Var(Var::K));
        let e = Expr::bin(BinOp::And, causal_expr(), Expr::bin(BinOp::Lt, dist, n.0));
        Some((e, Ty::Bool))
    }

    fn index(&mut self, e: &syn::Expr) -> Option<Typed> {
        // `x[a][b]` and `x[a, b]` (rewritten by the parser to `x[(a, b)]`) both mean two indices.
        fn flatten<'e>(e: &'e syn::Expr, out: &mut Vec<&'e syn::Expr>) -> &'e syn::Expr {
            match e {
                syn::Expr::Index(ix) => {
                    let base = flatten(&ix.expr, out);
                    match &*ix.index {
                        syn::Expr::Tuple(t) => out.extend(t.elems.iter()),
                        other => out.push(other),
                    }
                    base
                }
                other => other,
            }
        }
        let mut idx = Vec::new();
        let base = flatten(e, &mut idx);
        let Some(name) = plain_ident(base) else {
            self.err(base, "only tensor parameters can be indexed");
            return None;
        };
        let Some(pi) = self.param(&name) else {
            if VARIABLES.contains(&name.as_str()) || name == "causal" {
                self.err(
                    base,
                    format!("only tensor parameters can be indexed; `{name}` is a builtin"),
                );
            } else {
                self.err(
                    base,
                    format!("unknown identifier `{name}`; expected a declared tensor parameter"),
                );
            }
            return None;
        };
        let (elem, dims) = match &self.params[pi].kind {
            ParamKind::Scalar(_) => {
                self.err(
                    e,
                    format!("`{name}` is a scalar parameter and cannot be indexed"),
                );
                return None;
            }
            ParamKind::Tensor { elem, dims } => (*elem, dims.clone()),
        };
        let shape: Vec<String> = dims.iter().map(|d| dim_name(*d)).collect();
        if idx.len() != dims.len() {
            self.err(
                e,
                format!(
                    "`{name}` has {} dimension{} [{}] but is indexed with {} ind{}",
                    dims.len(),
                    if dims.len() == 1 { "" } else { "s" },
                    shape.join(", "),
                    idx.len(),
                    if idx.len() == 1 { "ex" } else { "ices" }
                ),
            );
            return None;
        }
        let mut out = Vec::new();
        let mut ok = true;
        for (n, (ix, dim)) in idx.iter().zip(&dims).enumerate() {
            let Some((ie, it)) = self.expr(ix) else {
                ok = false;
                continue;
            };
            if it != Ty::Int {
                self.err(
                    ix,
                    format!(
                        "index of `{name}` must be an integer; got a {} expression",
                        ty_name(it)
                    ),
                );
                ok = false;
                continue;
            }
            let want: &[&str] = match dim {
                Dim::Batch => &["b"],
                Dim::Heads => &["h"],
                Dim::Seq => &["q", "k"],
                Dim::Fixed(_) => &[],
            };
            if !want.is_empty() {
                let got = plain_ident(ix);
                if !got.as_deref().is_some_and(|g| want.contains(&g)) {
                    let exp = want
                        .iter()
                        .map(|w| format!("`{w}`"))
                        .collect::<Vec<_>>()
                        .join(" or ");
                    self.err(
                        ix,
                        format!(
                            "dimension {} of `{name}` is `{}` and must be indexed by exactly {exp}",
                            n + 1,
                            dim_name(*dim)
                        ),
                    );
                    ok = false;
                    continue;
                }
            }
            out.push(ie);
        }
        if !ok {
            return None;
        }
        Some((Expr::Index(pi, out), elem.ty()))
    }

    fn select(&mut self, i: &syn::ExprIf) -> Option<Typed> {
        let cond = self.expr(&i.cond).and_then(|c| self.boolean(&i.cond, c));
        let then = self
            .block_expr(&i.then_branch)
            .and_then(|e| self.expr(e).map(|t| (e, t)));
        let Some((_, else_expr)) = &i.else_branch else {
            self.err(i, "`if` needs an `else` branch: `if c { a } else { b }`");
            return None;
        };
        let els = match &**else_expr {
            syn::Expr::Block(b) => self
                .block_expr(&b.block)
                .and_then(|e| self.expr(e).map(|t| (e, t))),
            other => self.expr(other).map(|t| (other, t)),
        };
        let (cond, (_, a), (_, b)) = (cond?, then?, els?);
        if (a.1 == Ty::Bool) != (b.1 == Ty::Bool) {
            self.err(
                i,
                format!(
                    "branches of `if` have different types: {} and {}",
                    ty_name(a.1),
                    ty_name(b.1)
                ),
            );
            return None;
        }
        let (x, y, t) = promote(a, b);
        Some((Expr::Select(Box::new(cond.0), Box::new(x), Box::new(y)), t))
    }

    fn block_expr<'b>(&mut self, b: &'b syn::Block) -> Option<&'b syn::Expr> {
        match &b.stmts[..] {
            [syn::Stmt::Expr(e, None)] => Some(e),
            _ => {
                self.err(
                    b,
                    "a branch of `if` must be a single expression, like `{ s }`",
                );
                None
            }
        }
    }
}

/// The value of a constant expression.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Const {
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// Constant-fold a validated expression: `Some` when its value does not depend on any variable
/// or parameter. `x && false` folds to `false` and `x || true` to `true` whatever `x` is.
pub fn const_eval(e: &Expr) -> Option<Const> {
    use Const::{Bool as B, Float as F, Int as I};
    Some(match e {
        Expr::Int(v) => I(*v),
        Expr::Float(v) => F(v.get()),
        Expr::Bool(v) => B(*v),
        Expr::Var(_) | Expr::Scalar(_) | Expr::Index(..) => return None,
        Expr::ToFloat(a) => match const_eval(a)? {
            I(v) => F(v as f64),
            c => c,
        },
        Expr::Unary(UnOp::Neg, a) => match const_eval(a)? {
            I(v) => I(v.checked_neg()?),
            F(v) => F(-v),
            B(_) => return None,
        },
        Expr::Unary(UnOp::Not, a) => match const_eval(a)? {
            B(v) => B(!v),
            _ => return None,
        },
        Expr::Binary(op @ (BinOp::And | BinOp::Or), a, b) => {
            let (x, y) = (const_eval(a), const_eval(b));
            let absorbing = *op == BinOp::Or;
            if x == Some(B(absorbing)) || y == Some(B(absorbing)) {
                B(absorbing)
            } else if let (Some(B(_)), Some(B(_))) = (x, y) {
                B(!absorbing)
            } else {
                return None;
            }
        }
        Expr::Binary(op, a, b) => match (const_eval(a)?, const_eval(b)?) {
            (I(x), I(y)) => match op {
                BinOp::Add => I(x.checked_add(y)?),
                BinOp::Sub => I(x.checked_sub(y)?),
                BinOp::Mul => I(x.checked_mul(y)?),
                BinOp::Div => F(x as f64 / y as f64),
                BinOp::Rem => I(x.checked_rem(y)?),
                BinOp::Lt => B(x < y),
                BinOp::Le => B(x <= y),
                BinOp::Gt => B(x > y),
                BinOp::Ge => B(x >= y),
                BinOp::Eq => B(x == y),
                BinOp::Ne => B(x != y),
                BinOp::And | BinOp::Or => return None,
            },
            (F(x), F(y)) => match op {
                BinOp::Add => F(x + y),
                BinOp::Sub => F(x - y),
                BinOp::Mul => F(x * y),
                BinOp::Div => F(x / y),
                BinOp::Lt => B(x < y),
                BinOp::Le => B(x <= y),
                BinOp::Gt => B(x > y),
                BinOp::Ge => B(x >= y),
                BinOp::Eq => B(x == y),
                BinOp::Ne => B(x != y),
                _ => return None,
            },
            (B(x), B(y)) => match op {
                BinOp::Eq => B(x == y),
                BinOp::Ne => B(x != y),
                _ => return None,
            },
            _ => return None,
        },
        Expr::Call(f, args) => {
            let vals: Vec<Const> = args.iter().map(const_eval).collect::<Option<_>>()?;
            match (f, &vals[..]) {
                (Func::Abs, [I(x)]) => I(x.checked_abs()?),
                (Func::Min, [I(x), I(y)]) => I(*x.min(y)),
                (Func::Max, [I(x), I(y)]) => I(*x.max(y)),
                (Func::Min, [F(x), F(y)]) => F(x.min(*y)),
                (Func::Max, [F(x), F(y)]) => F(x.max(*y)),
                (f, [F(x)]) => F(match f {
                    Func::Exp => x.exp(),
                    Func::Log => x.ln(),
                    Func::Tanh => x.tanh(),
                    Func::Sigmoid => 1.0 / (1.0 + (-x).exp()),
                    Func::Sqrt => x.sqrt(),
                    Func::Abs => x.abs(),
                    Func::Min | Func::Max => return None,
                }),
                _ => return None,
            }
        }
        Expr::Select(c, a, b) => match const_eval(c)? {
            B(true) => const_eval(a)?,
            B(false) => const_eval(b)?,
            _ => return None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_str;
    use crate::spec::Expr as E;

    fn spec(body: &str) -> VariantSpec {
        let src = format!("V {{ head_dim: 64, dtype: bf16, {body} }}");
        parse_str(&src)
            .unwrap_or_else(|d| {
                panic!(
                    "{src}: {:?}",
                    d.iter().map(|d| &d.message).collect::<Vec<_>>()
                )
            })
            .remove(0)
    }

    fn errors(body: &str) -> Vec<String> {
        let src = format!("V {{ head_dim: 64, dtype: bf16, {body} }}");
        match parse_str(&src) {
            Ok(_) => panic!("{src} validated"),
            Err(d) => d.into_iter().map(|d| d.message).collect(),
        }
    }

    fn var(v: Var) -> E {
        E::Var(v)
    }
    fn tf(e: E) -> E {
        E::ToFloat(Box::new(e))
    }
    fn bin(op: BinOp, a: E, b: E) -> E {
        E::bin(op, a, b)
    }

    #[test]
    fn causal_is_bottom_right_aligned() {
        let want = bin(
            BinOp::Le,
            var(Var::K),
            bin(
                BinOp::Add,
                var(Var::Q),
                bin(BinOp::Sub, var(Var::SeqK), var(Var::SeqQ)),
            ),
        );
        assert_eq!(spec("mask: causal").mask, Some(want.clone()));
        assert_eq!(causal_expr(), want);
    }

    #[test]
    fn softcap_lowers_to_cap_tanh() {
        let s = spec("params: { cap: f32 }, score: softcap(s, cap)");
        let want = bin(
            BinOp::Mul,
            E::Scalar(0),
            E::Call(Func::Tanh, vec![bin(BinOp::Div, var(Var::S), E::Scalar(0))]),
        );
        assert_eq!(s.score, Some(want));
        // An int cap is promoted on both sides.
        let s = spec("score: softcap(s, 30)");
        let want = bin(
            BinOp::Mul,
            E::float(30.0),
            E::Call(
                Func::Tanh,
                vec![bin(BinOp::Div, var(Var::S), E::float(30.0))],
            ),
        );
        assert_eq!(s.score, Some(want));
    }

    #[test]
    fn window_lowers_to_causal_and_distance() {
        let dist = bin(BinOp::Sub, aligned_q(), var(Var::K));
        let want = bin(
            BinOp::And,
            causal_expr(),
            bin(BinOp::Lt, dist.clone(), E::Int(256)),
        );
        assert_eq!(spec("mask: window(256)").mask, Some(want));
        let want = bin(
            BinOp::And,
            causal_expr(),
            bin(BinOp::Lt, dist, E::Scalar(0)),
        );
        assert_eq!(spec("params: { w: i32 }, mask: window(w)").mask, Some(want));
    }

    #[test]
    fn alibi_lowers_to_slope_times_distance() {
        let s = spec("params: { slopes: [f32; heads] }, mask: causal, score: s + alibi(slopes[h])");
        let dist = tf(bin(BinOp::Sub, var(Var::K), aligned_q()));
        let want = bin(
            BinOp::Add,
            var(Var::S),
            bin(BinOp::Mul, E::Index(0, vec![var(Var::H)]), dist),
        );
        assert_eq!(s.score, Some(want));
    }

    #[test]
    fn clamp_lowers_to_min_max_in_one_type() {
        let s = spec("score: clamp(s, -5, 5.0)");
        let want = E::Call(
            Func::Min,
            vec![
                E::Call(Func::Max, vec![var(Var::S), E::float(-5.0)]),
                E::float(5.0),
            ],
        );
        assert_eq!(s.score, Some(want));
        let s = spec("params: { t: [f32; 8] }, score: s + t[clamp(q - k, 0, 7)]");
        let idx = E::Call(
            Func::Min,
            vec![
                E::Call(
                    Func::Max,
                    vec![bin(BinOp::Sub, var(Var::Q), var(Var::K)), E::Int(0)],
                ),
                E::Int(7),
            ],
        );
        assert_eq!(
            s.score,
            Some(bin(BinOp::Add, var(Var::S), E::Index(0, vec![idx])))
        );
    }

    #[test]
    fn to_float_is_inserted_where_int_meets_float() {
        // Alibi example: slopes[h] * (k - q)
        let s = spec("params: { slopes: [f32; heads] }, score: s + slopes[h] * (k - q)");
        let want = bin(
            BinOp::Add,
            var(Var::S),
            bin(
                BinOp::Mul,
                E::Index(0, vec![var(Var::H)]),
                tf(bin(BinOp::Sub, var(Var::K), var(Var::Q))),
            ),
        );
        assert_eq!(s.score, Some(want));
        // `/` always promotes both sides; an int score is promoted as a whole.
        let s = spec("score: q / k");
        assert_eq!(
            s.score,
            Some(bin(BinOp::Div, tf(var(Var::Q)), tf(var(Var::K))))
        );
        let s = spec("score: q - k");
        assert_eq!(s.score, Some(tf(bin(BinOp::Sub, var(Var::Q), var(Var::K)))));
        // Comparisons, min/max and select branches.
        let s = spec("mask: s_ok < 0.5, params: { s_ok: i32 }");
        assert_eq!(
            s.mask,
            Some(bin(BinOp::Lt, tf(E::Scalar(0)), E::float(0.5)))
        );
        let s = spec("score: max(s, 0)");
        assert_eq!(
            s.score,
            Some(E::Call(Func::Max, vec![var(Var::S), E::float(0.0)]))
        );
        let s = spec("score: if q == k { s } else { 0 }");
        assert_eq!(
            s.score,
            Some(E::Select(
                Box::new(bin(BinOp::Eq, var(Var::Q), var(Var::K))),
                Box::new(var(Var::S)),
                Box::new(E::float(0.0)),
            ))
        );
        let s = spec("score: exp(q)");
        assert_eq!(s.score, Some(E::Call(Func::Exp, vec![tf(var(Var::Q))])));
    }

    #[test]
    fn two_dimensional_index_in_both_spellings() {
        let a = spec("params: { bias: [f32; heads, 256] }, score: s + bias[h, q - k]");
        let b = spec("params: { bias: [f32; heads, 256] }, score: s + bias[h][q - k]");
        assert_eq!(a, b);
        let want = E::Index(
            0,
            vec![var(Var::H), bin(BinOp::Sub, var(Var::Q), var(Var::K))],
        );
        assert_eq!(a.score, Some(bin(BinOp::Add, var(Var::S), want)));
        let c = spec("params: { d: [i32; batch, seq] }, mask: d[b, q] == d[b, k]");
        assert_eq!(
            c.params[0].kind,
            ParamKind::Tensor {
                elem: ScalarTy::I32,
                dims: vec![Dim::Batch, Dim::Seq]
            }
        );
    }

    #[test]
    fn params_and_scale() {
        let s = spec("scale: 1.0 / 8, params: { a: f32, b2: i32, t: [f32; batch, heads, seq, 4] }");
        assert_eq!(s.scale, Some(F64Bits::new(0.125)));
        assert_eq!(s.params.len(), 3);
        assert_eq!(s.params[1].kind, ParamKind::Scalar(ScalarTy::I32));
        assert_eq!(
            s.params[2].kind,
            ParamKind::Tensor {
                elem: ScalarTy::F32,
                dims: vec![Dim::Batch, Dim::Heads, Dim::Seq, Dim::Fixed(4)]
            }
        );
        assert_eq!(spec("scale: 2").scale, Some(F64Bits::new(2.0)));
    }

    fn has(errs: &[String], needle: &str) {
        assert!(
            errs.iter().any(|e| e.contains(needle)),
            "no `{needle}` in {errs:#?}"
        );
    }

    #[test]
    fn diagnostics() {
        let one = |body: &str, needle: &str| {
            let errs = errors(body);
            assert_eq!(errs.len(), 1, "{body}: {errs:#?}");
            has(&errs, needle);
        };
        one("mask: q < k, mask: causal", "duplicate key `mask`");
        one("window: 3", "unknown key `window`");
        one("scale: 0", "scale must be positive and finite; got 0");
        one("scale: -1.5", "scale must be positive and finite; got -1.5");
        one("scale: q", "scale must be a constant number");
        one("scale: 1 % 0", "this one has no value");
        one("mask: s > 0.0", "`s` (the score) cannot be used in `mask`");
        one("mask: q - k", "mask must be a bool expression; got int");
        one("score: q < k", "score must be a number");
        one("mask: foo < 1", "unknown identifier `foo`");
        one("score: gelu(s)", "unknown function `gelu`");
        one(
            "score: tanh(s, 2.0)",
            "`tanh` takes 1 argument, as in `tanh(x)`; got 2",
        );
        one(
            "score: s + causal",
            "expected a number, found a bool expression",
        );
        one("mask: causal && q", "expected a bool, found int expression");
        one(
            "params: { d: [i32; seq] }, mask: d[q, k] == 0",
            "`d` has 1 dimension [seq] but is indexed with 2 indices",
        );
        one(
            "params: { d: [i32; seq] }, mask: d[q + 1] == 0",
            "dimension 1 of `d` is `seq` and must be indexed by exactly `q` or `k`",
        );
        one(
            "params: { d: [f32; heads] }, score: s + d[q]",
            "must be indexed by exactly `h`",
        );
        one(
            "params: { d: [f32; batch] }, score: s + d[h]",
            "must be indexed by exactly `b`",
        );
        one(
            "params: { c: f32 }, score: s + c[h]",
            "`c` is a scalar parameter and cannot be indexed",
        );
        one(
            "params: { d: [i32; seq] }, mask: d == 0",
            "`d` is a tensor parameter and must be indexed, like `d[q]`",
        );
        one(
            "params: { t: [f32; 16] }, score: s + t[s]",
            "index of `t` must be an integer; got a float expression",
        );
        one("mask: window(0)", "window size must be positive; got 0");
        one("mask: window(-4)", "window size must be positive; got -4");
        one("mask: false", "mask is always false");
        one("mask: !true", "mask is always false");
        one("mask: 1 > 2", "mask is always false");
        one("mask: causal && false", "mask is always false");
        one("params: { a: f32, a: i32 }", "duplicate parameter `a`");
        one(
            "params: { q: f32 }",
            "parameter `q` shadows the builtin variable `q`",
        );
        one(
            "params: { tanh: f32 }",
            "shadows the builtin function `tanh`",
        );
        one("score: s % 2", "`%` takes integer operands");
        one("params: { x: f64 }", "unknown parameter type `f64`");
        one("params: { x: [f32; rows] }", "unknown dimension `rows`");
        one(
            "params: { x: [f32; 0] }",
            "fixed dimension must be positive; got 0",
        );
        one(
            "score: if q < k { s } else { true }",
            "branches of `if` have different types",
        );
        let errs = parse_str("V { head_dim: 0, dtype: fp8 }").unwrap_err();
        assert_eq!(errs.len(), 2);
        has(
            &errs.iter().map(|d| d.message.clone()).collect::<Vec<_>>(),
            "got 0",
        );
        assert_eq!(
            errs[1].message,
            "fp8 is not supported yet; got `fp8`, use bf16 or f16"
        );
        let errs = parse_str("V { head_dim: (192, 264), dtype: f16 }").unwrap_err();
        assert_eq!(
            errs[0].message,
            "v head dim must be a multiple of 8 in 8..=256; got 264"
        );
        let errs = parse_str("V { mask: causal }").unwrap_err();
        assert_eq!(errs.len(), 2);
        assert!(errs[0]
            .message
            .starts_with("missing required key `head_dim` in `V`"));
        assert!(errs[1]
            .message
            .starts_with("missing required key `dtype` in `V`"));
        // Errors in independent places are all reported.
        let errs = errors("params: { q: f32 }, mask: s > 0.0, score: gelu(s) + foo");
        assert_eq!(errs.len(), 4, "{errs:#?}");
    }

    #[test]
    fn const_eval_folds_what_it_can() {
        assert_eq!(
            const_eval(&spec("mask: causal || true").mask.unwrap()),
            Some(Const::Bool(true))
        );
        assert_eq!(const_eval(&spec("mask: causal").mask.unwrap()), None);
        assert_eq!(
            const_eval(&spec("score: if 1 < 2 { 3 } else { q }").score.unwrap()),
            Some(Const::Float(3.0))
        );
    }
}
