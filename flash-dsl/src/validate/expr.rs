//! Type checking of `mask`, `score` and `scale` expressions: `syn::Expr` → typed [`Expr`],
//! with the shorthands lowered (see `lower`) and `ToFloat` inserted where an int meets a float.
//!
//! An ill-typed sub-expression records one [`Report`] and yields `None`; its parents stay quiet
//! about it, so one mistake gives one message.

use quote::ToTokens;

use crate::diag::Report;
use crate::spec::{BinOp, Dim, Expr, Func, ParamDecl, ParamKind, Ty, UnOp, Var};

use super::arith::{int_range, MAX_WIDE};
use super::consts::{const_eval, Const};
use super::lower::{self, causal_expr, promote, to_float, Typed};
use super::names::{dim_name, ty_name, FUNCTIONS, VARIABLES};

/// Which entry is being checked (`s` is not allowed in `mask`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Ctx {
    Mask,
    Score,
    Scale,
}

/// Walks one expression, recording errors into `errs`.
pub(super) struct Checker<'a> {
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
    pub(super) fn new(params: &'a [ParamDecl], ctx: Ctx, errs: &'a mut Vec<Report>) -> Self {
        Checker { params, ctx, errs }
    }

    fn err(&mut self, t: &dyn ToTokens, msg: impl Into<String>) {
        self.errs.push(Report::spanned(t, msg));
    }

    fn param(&self, name: &str) -> Option<usize> {
        self.params.iter().position(|p| p.name == name)
    }

    /// An integer result whose interval (see `arith`) leaves ±2⁶² is an error: no integer may
    /// wrap, on the host or on the device.
    fn bounded(&mut self, t: &dyn ToTokens, v: Typed) -> Option<Typed> {
        if v.1 == Ty::Int {
            let r = int_range(&v.0);
            if !r.fits_wide() {
                self.err(
                    t,
                    format!(
                        "integer expression may overflow: it can reach {} (at most ±{MAX_WIDE} = ±2^62 is computed exactly; ints are i32, positions below 2^29 + 1024)",
                        if r.hi > MAX_WIDE { r.hi } else { r.lo }
                    ),
                );
                return None;
            }
        }
        Some(v)
    }

    /// A divisor (of `/` or `%`) that is the constant zero is an error.
    fn nonzero_divisor(&mut self, t: &dyn ToTokens, what: &str, v: &Typed) -> bool {
        let zero = match const_eval(&v.0) {
            Some(Const::Int(0)) => true,
            Some(Const::Float(f)) => f == 0.0,
            _ => false,
        };
        if zero {
            self.err(t, format!("{what} is the constant zero"));
        }
        !zero
    }

    pub(super) fn numeric(&mut self, t: &dyn ToTokens, v: Typed) -> Option<Typed> {
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

    pub(super) fn expr(&mut self, e: &syn::Expr) -> Option<Typed> {
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
                    Ok(v) if v <= i32::MAX as i64 => Some((Expr::Int(v), Ty::Int)),
                    _ => {
                        self.err(
                            i,
                            format!(
                                "integer literal out of range: ints are i32, at most {}; got {i}",
                                i32::MAX
                            ),
                        );
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
                    // The kernels compute in f32: a literal must be finite there too.
                    Ok(v) if !(v as f32).is_finite() => {
                        self.err(
                            f,
                            format!(
                                "float literal out of range: the kernels compute in f32, whose largest value is {:e}; got {f}",
                                f32::MAX
                            ),
                        );
                        None
                    }
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
                            Dim::Fixed(_) | Dim::SeqBlocks(_) => "0",
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
                self.bounded(u, (e, t))
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
                self.bounded(b, (Expr::bin(op, x, y), t))
            }
            BinOp::Div => {
                let l = self.numeric(&b.left, l);
                let r = self.numeric(&b.right, r);
                let (l, r) = (l?, r?);
                if !self.nonzero_divisor(&b.right, "the divisor of `/`", &r) {
                    return None;
                }
                Some((Expr::bin(op, to_float(l), to_float(r)), Ty::Float))
            }
            BinOp::Rem => {
                let l = self.numeric(&b.left, l);
                let r = self.numeric(&b.right, r);
                let (l, r) = (l?, r?);
                if l.1 == Ty::Float || r.1 == Ty::Float {
                    self.err(b, "`%` takes integer operands; got a float operand");
                    return None;
                }
                if !self.nonzero_divisor(&b.right, "the divisor of `%`", &r) {
                    return None;
                }
                self.bounded(b, (Expr::bin(op, l.0, r.0), Ty::Int))
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
        let v = match name.as_str() {
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
                let cap = nums.remove(0);
                if !self.nonzero_divisor(raw[1], "the cap of `softcap` (a divisor)", &cap) {
                    return None;
                }
                lower::softcap(x, cap)
            }
            "clamp" => {
                let (lo, hi) = (nums.remove(0), nums.remove(0));
                lower::clamp(x, lo, hi)
            }
            "alibi" => lower::alibi(x),
            _ => unreachable!("arity table and lowering cover the same names"),
        };
        self.bounded(c, v)
    }

    /// `window(n)`: checks that `n` is a positive int constant or an i32 scalar parameter.
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
        Some((lower::window(n.0), Ty::Bool))
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
                Dim::Fixed(_) | Dim::SeqBlocks(_) => &[],
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
