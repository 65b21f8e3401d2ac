//! Symbolic derivatives of the score expression, for the backward pass.
//!
//! The backward pass of attention needs, for every visible score element, `dS = dZ · ∂Z/∂s`
//! where `Z = score(s)` is the modified logit, and for every learnable `f32` parameter
//! `θ` read by the score, `dθ += dZ · ∂Z/∂θ`. The score modification is an [`Expr`], so its
//! derivatives are [`Expr`]s too: the emitter prints them exactly as it prints the forward hook,
//! the CPU evaluator ([`crate::eval::Env::eval`]) evaluates them, and `flash plan` shows them
//! with [`display`]. Nothing here introduces a node the rest of the pipeline does not know:
//! `sign` is a nested `if`, there is no `pow`.
//!
//! # What is a variable
//!
//! `s`, every `f32` scalar parameter, and every `f32` tensor *read* — an `Expr::Index(i, idx)`
//! with one particular tuple of index expressions. The same tensor read at two different index
//! tuples gives two independent variables and two [`ParamGrad`] terms; where both tuples land
//! on the same element at run time, the kernel's two atomic adds into that element sum the two
//! partial derivatives, which is exactly the derivative with respect to the element (sum rule).
//! Integer and boolean subexpressions (positions, masks, conditions, `i32` parameters) are
//! constants: their derivative is 0, and masks are never differentiated.
//!
//! # Conventions where the derivative does not exist
//!
//! - `abs(u)`: `sign(u)·u'` with `sign(0) = 0`, written `if u > 0.0 { u' } else if u < 0.0
//!   { -u' } else { 0.0 }`. At the kink this is the smallest subgradient.
//! - `min(a, b)` / `max(a, b)`: on a tie the derivative flows to the **first** argument
//!   (`if a <= b { a' } else { b' }`, `if a >= b { a' } else { b' }`).
//! - `if c { a } else { b }`: the derivative of the branch taken, `if c { a' } else { b' }`;
//!   at the boundary of `c` that is whichever branch the forward pass took there.
//! - `sqrt(u)`: `u' / (2.0 * sqrt(u))`, as the math says: at `u = 0` it is `±inf` (or NaN when
//!   `u'` is 0 too); nothing is clamped, so a kernel reports the singularity rather than hiding
//!   it. `log(u)` likewise gives `u' / u`.
//!
//! # Simplification
//!
//! Derivatives are built through folding constructors and finished by [`simplify`], so the
//! output has no `* 1.0`, `+ 0.0`, `0.0 * x`, `--x` or equal-branch `if`. Literals fold with the
//! evaluator's own arithmetic, except that a fold never creates an infinite or NaN literal (the
//! language cannot spell one), a literal division folds only when exact (`1.0 / 30.0` stays, so
//! `30.0 * (x / 30.0)` can still cancel), and `-(0.0)` folds to `0.0`. Two folds are not
//! exact in IEEE arithmetic and are made on purpose: `0.0 * x → 0.0` (and `0.0 / x → 0.0`),
//! false when `x` is infinite or NaN, and `a * (x / a) → x`, false when `a` is 0 or infinite.
//! Both are only wrong where the forward score itself is already non-finite or undefined, and
//! derivative terms multiply finite forward quantities. Subexpressions of the forward score are
//! repeated rather than shared (`1.0 - tanh(u) * tanh(u)`): the CUDA compiler eliminates the
//! common subexpressions, and the tree stays a plain [`Expr`].

use serde::{Deserialize, Serialize};

use crate::spec::{BinOp, Expr, Func, ParamDecl, ParamKind, ScalarTy, Ty, UnOp, Var, VariantSpec};

/// The derivative of the score with respect to one parameter read: the gradient kernel adds
/// `dZ · d` (with `dZ = ∂L/∂Z` of the element) into `grad[param][index]`, atomically.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ParamGrad {
    /// Index into `VariantSpec::params`; always an `f32` parameter.
    pub param: usize,
    /// The index expressions of the read (integer typed, clamped like the forward read); empty
    /// for a scalar parameter.
    pub index: Vec<Expr>,
    /// `∂Z/∂param[index]`, a float expression of the same variables as the score.
    pub d: Expr,
}

/// Everything the backward kernel needs from the score expression.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScoreGradient {
    /// `∂Z/∂s`.
    pub d_ds: Expr,
    /// One term per distinct `f32` parameter read whose derivative is not identically 0.
    pub params: Vec<ParamGrad>,
}

/// The score derivatives of `spec`; `None` when the variant has no score expression, where
/// `∂Z/∂s = 1` and no parameter has a gradient.
///
/// A learnable temperature on a soft-capped score:
///
/// ```
/// use flash_dsl::deriv::{display, score_gradient};
///
/// let spec = flash_dsl::parse::parse_str(
///     "Soft { head_dim: 64, dtype: bf16, params: { t: f32 }, score: 30.0 * tanh(s / 30.0) * t }",
/// )
/// .unwrap()
/// .remove(0);
/// let g = score_gradient(&spec).unwrap();
/// assert_eq!(
///     display(&g.d_ds, &spec.params),
///     "(1.0 - tanh(s / 30.0) * tanh(s / 30.0)) * t"
/// );
/// assert_eq!(g.params.len(), 1);
/// assert_eq!(spec.params[g.params[0].param].name, "t");
/// assert!(g.params[0].index.is_empty()); // a scalar
/// assert_eq!(display(&g.params[0].d, &spec.params), "30.0 * tanh(s / 30.0)");
/// ```
pub fn score_gradient(spec: &VariantSpec) -> Option<ScoreGradient> {
    let e = spec.score.as_ref()?;
    Some(ScoreGradient {
        d_ds: d_ds(e, &spec.params),
        params: d_dparams(e, &spec.params),
    })
}

/// `∂e/∂s`, simplified.
pub fn d_ds(e: &Expr, params: &[ParamDecl]) -> Expr {
    simplify(diff(e, Wrt::S, params))
}

/// The derivative of `e` with respect to every `f32` parameter read in it, one term per
/// distinct `(param, index tuple)`, in order of first appearance. Reads whose derivative
/// simplifies to 0 (a parameter only compared in a condition) give no term: the kernel would
/// only add zeros.
pub fn d_dparams(e: &Expr, params: &[ParamDecl]) -> Vec<ParamGrad> {
    let mut reads: Vec<(usize, Vec<Expr>)> = Vec::new();
    e.visit(&mut |n| {
        let read = match n {
            Expr::Scalar(i) if params[*i].kind == ParamKind::Scalar(ScalarTy::F32) => {
                (*i, Vec::new())
            }
            Expr::Index(i, idx) if is_f32_tensor(&params[*i]) => (*i, idx.clone()),
            _ => return,
        };
        if !reads.contains(&read) {
            reads.push(read);
        }
    });
    reads
        .into_iter()
        .filter_map(|(param, index)| {
            let wrt = match params[param].kind {
                ParamKind::Scalar(_) => Wrt::Scalar(param),
                ParamKind::Tensor { .. } => Wrt::Index(param, &index),
            };
            let d = simplify(diff(e, wrt, params));
            if is_zero(&d) {
                return None;
            }
            let index = index.into_iter().map(simplify).collect();
            Some(ParamGrad { param, index, d })
        })
        .collect()
}

fn is_f32_tensor(p: &ParamDecl) -> bool {
    matches!(
        p.kind,
        ParamKind::Tensor {
            elem: ScalarTy::F32,
            ..
        }
    )
}

/// The variable a derivative is taken with respect to.
#[derive(Clone, Copy)]
enum Wrt<'a> {
    S,
    Scalar(usize),
    Index(usize, &'a [Expr]),
}

impl Wrt<'_> {
    fn is(&self, e: &Expr) -> bool {
        match (self, e) {
            (Wrt::S, Expr::Var(Var::S)) => true,
            (Wrt::Scalar(i), Expr::Scalar(j)) => i == j,
            (Wrt::Index(i, idx), Expr::Index(j, jdx)) => i == j && *idx == jdx.as_slice(),
            _ => false,
        }
    }
}

/// The chain rule, one node at a time. Children's derivatives are combined through the folding
/// constructors so that zeros vanish as they appear (most subtrees do not depend on `wrt`).
fn diff(e: &Expr, wrt: Wrt, params: &[ParamDecl]) -> Expr {
    if e.ty(params) != Ty::Float {
        return zero();
    }
    if wrt.is(e) {
        return one();
    }
    let d = |x: &Expr| diff(x, wrt, params);
    match e {
        Expr::Unary(UnOp::Neg, a) => neg(d(a)),
        Expr::Binary(op, a, b) => {
            let (a, b) = (&**a, &**b);
            match op {
                BinOp::Add => add(d(a), d(b)),
                BinOp::Sub => sub(d(a), d(b)),
                BinOp::Mul => add(mul(d(a), b.clone()), mul(a.clone(), d(b))),
                // (a/b)' = (a' - (a/b)·b') / b: reuses the forward's `a/b`, and is a'/b when b
                // does not depend on the variable.
                BinOp::Div => {
                    let ratio = Expr::bin(BinOp::Div, a.clone(), b.clone());
                    div(sub(d(a), mul(ratio, d(b))), b.clone())
                }
                _ => zero(),
            }
        }
        Expr::Call(f, args) => diff_call(*f, args, d),
        Expr::Select(c, a, b) => select((**c).clone(), d(a), d(b)),
        // Literals, `ToFloat` of an integer, and variables or parameters other than `wrt`.
        _ => zero(),
    }
}

fn diff_call(f: Func, args: &[Expr], d: impl Fn(&Expr) -> Expr) -> Expr {
    let call = |f: Func, u: &Expr| Expr::Call(f, vec![u.clone()]);
    let u = &args[0];
    if matches!(f, Func::Min | Func::Max) {
        let v = &args[1];
        let cmp = if f == Func::Min { BinOp::Le } else { BinOp::Ge };
        return select(Expr::bin(cmp, u.clone(), v.clone()), d(u), d(v));
    }
    let du = d(u);
    if is_zero(&du) {
        return zero();
    }
    match f {
        Func::Exp => mul(call(Func::Exp, u), du),
        Func::Log => div(du, u.clone()),
        Func::Tanh => {
            let t = call(Func::Tanh, u);
            mul(sub(one(), mul(t.clone(), t)), du)
        }
        Func::Sigmoid => {
            let g = call(Func::Sigmoid, u);
            mul(mul(g.clone(), sub(one(), g)), du)
        }
        Func::Sqrt => div(du, mul(Expr::float(2.0), call(Func::Sqrt, u))),
        Func::Abs => {
            let cmp = |op| Expr::bin(op, u.clone(), zero());
            let inner = select(cmp(BinOp::Lt), neg(du.clone()), zero());
            select(cmp(BinOp::Gt), du, inner)
        }
        Func::Min | Func::Max => unreachable!("handled above"),
    }
}

fn zero() -> Expr {
    Expr::float(0.0)
}
fn one() -> Expr {
    Expr::float(1.0)
}
fn is_lit(e: &Expr, v: f64) -> bool {
    match e {
        Expr::Float(x) => x.get() == v,
        Expr::Int(x) => *x as f64 == v,
        _ => false,
    }
}
fn is_zero(e: &Expr) -> bool {
    is_lit(e, 0.0)
}
fn is_one(e: &Expr) -> bool {
    is_lit(e, 1.0)
}

/// A float literal of `v`, or `None` when `v` is not finite: folding never creates an infinite
/// or NaN literal (the language has no spelling for one), the node is kept instead.
fn finite(v: f64) -> Option<Expr> {
    v.is_finite().then(|| Expr::float(v))
}

/// Folds constants and algebraic identities, bottom up. Values are preserved exactly (the folds
/// use the evaluator's own `f64`/wrapping `i64` operations; a literal division folds only when
/// its quotient is exact), except for the deliberate folds listed in the module documentation
/// and `a * (1.0 / b) → a / b`, which may differ in the last bit.
pub fn simplify(e: Expr) -> Expr {
    match e {
        Expr::ToFloat(a) => match simplify(*a) {
            Expr::Int(i) => Expr::float(i as f64),
            a => Expr::ToFloat(Box::new(a)),
        },
        Expr::Unary(UnOp::Neg, a) => neg(simplify(*a)),
        Expr::Unary(UnOp::Not, a) => match simplify(*a) {
            Expr::Bool(b) => Expr::Bool(!b),
            Expr::Unary(UnOp::Not, x) => *x,
            a => Expr::Unary(UnOp::Not, Box::new(a)),
        },
        Expr::Binary(op, a, b) => binary(op, simplify(*a), simplify(*b)),
        Expr::Call(f, args) => call(f, args.into_iter().map(simplify).collect()),
        Expr::Select(c, a, b) => select(simplify(*c), simplify(*a), simplify(*b)),
        Expr::Index(i, idx) => Expr::Index(i, idx.into_iter().map(simplify).collect()),
        leaf => leaf,
    }
}

fn binary(op: BinOp, a: Expr, b: Expr) -> Expr {
    match op {
        BinOp::Add => add(a, b),
        BinOp::Sub => sub(a, b),
        BinOp::Mul => mul(a, b),
        BinOp::Div => div(a, b),
        BinOp::Rem => match (&a, &b) {
            (Expr::Int(x), Expr::Int(y)) => Expr::Int(x.checked_rem(*y).unwrap_or(0)),
            _ => Expr::bin(op, a, b),
        },
        BinOp::And | BinOp::Or => {
            // `true && x` → `x`, `false && x` → false, `x && true` → `x`; the same for `||`
            // with true and false swapped. `x && false` is left alone: nothing is gained.
            let absorbing = op == BinOp::Or;
            match (&a, &b) {
                (Expr::Bool(x), _) if *x == absorbing => Expr::Bool(absorbing),
                (Expr::Bool(_), _) => b,
                (_, Expr::Bool(y)) if *y != absorbing => a,
                _ => Expr::bin(op, a, b),
            }
        }
        _ => compare(op, a, b),
    }
}

/// Comparisons of two literals of one kind fold with the evaluator's semantics.
fn compare(op: BinOp, a: Expr, b: Expr) -> Expr {
    use std::cmp::Ordering::*;
    let ord = match (&a, &b) {
        (Expr::Int(x), Expr::Int(y)) => x.partial_cmp(y),
        (Expr::Float(x), Expr::Float(y)) => x.get().partial_cmp(&y.get()),
        (Expr::Bool(x), Expr::Bool(y)) => x.partial_cmp(y),
        _ => None,
    };
    let Some(o) = ord else {
        return Expr::bin(op, a, b);
    };
    Expr::Bool(match op {
        BinOp::Lt => o == Less,
        BinOp::Le => o != Greater,
        BinOp::Gt => o == Greater,
        BinOp::Ge => o != Less,
        BinOp::Eq => o == Equal,
        BinOp::Ne => o != Equal,
        _ => unreachable!("{op:?} is not a comparison"),
    })
}

fn neg(a: Expr) -> Expr {
    match a {
        // A zero stays `0.0`: `-0.0` only differs as a divisor, and a derivative term that is
        // zero should read as one (and compare equal to the other branch's zero).
        Expr::Float(x) if x.get() == 0.0 => zero(),
        Expr::Float(x) => Expr::float(-x.get()),
        Expr::Int(x) => Expr::Int(x.wrapping_neg()),
        Expr::Unary(UnOp::Neg, x) => *x,
        // -(x - y) = y - x, exactly.
        Expr::Binary(BinOp::Sub, x, y) => sub(*y, *x),
        a => Expr::Unary(UnOp::Neg, Box::new(a)),
    }
}

fn add(a: Expr, b: Expr) -> Expr {
    match (a, b) {
        (Expr::Float(x), Expr::Float(y)) => finite(x.get() + y.get())
            .unwrap_or_else(|| Expr::bin(BinOp::Add, Expr::Float(x), Expr::Float(y))),
        (Expr::Int(x), Expr::Int(y)) => Expr::Int(x.wrapping_add(y)),
        (a, b) if is_zero(&a) => b,
        (a, b) if is_zero(&b) => a,
        (a, Expr::Unary(UnOp::Neg, y)) => sub(a, *y),
        (Expr::Unary(UnOp::Neg, x), b) => sub(b, *x),
        (a, b) => Expr::bin(BinOp::Add, a, b),
    }
}

fn sub(a: Expr, b: Expr) -> Expr {
    match (a, b) {
        (Expr::Float(x), Expr::Float(y)) => finite(x.get() - y.get())
            .unwrap_or_else(|| Expr::bin(BinOp::Sub, Expr::Float(x), Expr::Float(y))),
        (Expr::Int(x), Expr::Int(y)) => Expr::Int(x.wrapping_sub(y)),
        (a, b) if is_zero(&b) => a,
        (a, b) if is_zero(&a) => neg(b),
        (a, Expr::Unary(UnOp::Neg, y)) => add(a, *y),
        (a, b) => Expr::bin(BinOp::Sub, a, b),
    }
}

fn mul(a: Expr, b: Expr) -> Expr {
    match (a, b) {
        (Expr::Float(x), Expr::Float(y)) => finite(x.get() * y.get())
            .unwrap_or_else(|| Expr::bin(BinOp::Mul, Expr::Float(x), Expr::Float(y))),
        (Expr::Int(x), Expr::Int(y)) => Expr::Int(x.wrapping_mul(y)),
        (a, _) if is_zero(&a) => a,
        (_, b) if is_zero(&b) => b,
        (a, b) if is_one(&a) => b,
        (a, b) if is_one(&b) => a,
        (a, b) if is_lit(&a, -1.0) => neg(b),
        (a, b) if is_lit(&b, -1.0) => neg(a),
        (Expr::Unary(UnOp::Neg, x), b) => neg(mul(*x, b)),
        (a, Expr::Unary(UnOp::Neg, y)) => neg(mul(a, *y)),
        (a, Expr::Binary(BinOp::Div, x, y)) if is_one(&x) => div(a, *y),
        (a, Expr::Binary(BinOp::Div, x, y)) if *y == a => *x,
        (Expr::Binary(BinOp::Div, x, y), b) if *y == b => *x,
        (a, b) => Expr::bin(BinOp::Mul, a, b),
    }
}

fn div(a: Expr, b: Expr) -> Expr {
    match (a, b) {
        // Only exact quotients fold: `1.0 / 30.0` stays as written, readable, and still the
        // divisor that `30.0 * (x / 30.0) → x` cancels.
        (Expr::Float(x), Expr::Float(y))
            if (x.get() / y.get()).is_finite()
                && (x.get() / y.get()).mul_add(y.get(), -x.get()) == 0.0 =>
        {
            Expr::float(x.get() / y.get())
        }
        // `/` is always a float division, so the zero it yields is a float.
        (a, _) if is_zero(&a) => zero(),
        (a, b) if is_one(&b) => a,
        (a, b) if is_lit(&b, -1.0) => neg(a),
        (Expr::Unary(UnOp::Neg, x), b) => neg(div(*x, b)),
        (a, Expr::Unary(UnOp::Neg, y)) => neg(div(a, *y)),
        (a, b) => Expr::bin(BinOp::Div, a, b),
    }
}

fn select(c: Expr, a: Expr, b: Expr) -> Expr {
    match c {
        Expr::Bool(true) => a,
        Expr::Bool(false) => b,
        _ if a == b => a,
        // `0.0` and `-0.0` are equal values with different bits.
        _ if matches!((&a, &b), (Expr::Float(_), Expr::Float(_))) && is_zero(&a) && is_zero(&b) => {
            zero()
        }
        Expr::Unary(UnOp::Not, c) => select(*c, b, a),
        c => Expr::Select(Box::new(c), Box::new(a), Box::new(b)),
    }
}

/// Calls of literal float arguments fold with the evaluator's formulas (integer `abs`, `min`,
/// `max` with wrapping `i64` semantics).
fn call(f: Func, args: Vec<Expr>) -> Expr {
    let folded = match (f, args.as_slice()) {
        (Func::Min | Func::Max, [Expr::Int(x), Expr::Int(y)]) => {
            Some(Expr::Int(if f == Func::Min {
                *x.min(y)
            } else {
                *x.max(y)
            }))
        }
        (Func::Abs, [Expr::Int(x)]) => Some(Expr::Int(x.wrapping_abs())),
        (Func::Min | Func::Max, [Expr::Float(x), Expr::Float(y)]) => {
            let (x, y) = (x.get(), y.get());
            finite(if f == Func::Min { x.min(y) } else { x.max(y) })
        }
        (_, [Expr::Float(x)]) => {
            let x = x.get();
            finite(match f {
                Func::Exp => x.exp(),
                Func::Log => x.ln(),
                Func::Tanh => x.tanh(),
                Func::Sigmoid => 1.0 / (1.0 + (-x).exp()),
                Func::Sqrt => x.sqrt(),
                Func::Abs => x.abs(),
                Func::Min | Func::Max => unreachable!("binary"),
            })
        }
        _ => None,
    };
    folded.unwrap_or(Expr::Call(f, args))
}

/// Binding strength of a node in the surface syntax, for parenthesisation.
const P_IF: u8 = 0;
const P_OR: u8 = 1;
const P_AND: u8 = 2;
const P_CMP: u8 = 3;
const P_ADD: u8 = 4;
const P_MUL: u8 = 5;
const P_UNARY: u8 = 6;
const P_ATOM: u8 = 7;

/// `e` in the language's own surface syntax: parameters by name, variables as `s`, `q`, …,
/// `if c { a } else { b }`, float literals with a point, only the parentheses the tree needs.
/// `ToFloat` is invisible, since the validator reinserts it where an int meets a float, so the
/// text parses back to an equal tree (up to literals such as `ToFloat(2)` becoming `2.0`).
pub fn display(e: &Expr, params: &[ParamDecl]) -> String {
    show(e, params).0
}

fn show(e: &Expr, params: &[ParamDecl]) -> (String, u8) {
    let at = |e: &Expr, min: u8| {
        let (s, p) = show(e, params);
        if p < min {
            format!("({s})")
        } else {
            s
        }
    };
    match e {
        Expr::Int(v) => (v.to_string(), if *v < 0 { P_UNARY } else { P_ATOM }),
        Expr::Float(v) => {
            let v = v.get();
            (
                format!("{v:?}"),
                if v.is_sign_negative() {
                    P_UNARY
                } else {
                    P_ATOM
                },
            )
        }
        Expr::Bool(b) => (b.to_string(), P_ATOM),
        Expr::Var(v) => (var_name(*v).to_string(), P_ATOM),
        Expr::Scalar(i) => (params[*i].name.clone(), P_ATOM),
        Expr::Index(i, idx) => {
            let xs: Vec<String> = idx.iter().map(|x| show(x, params).0).collect();
            (format!("{}[{}]", params[*i].name, xs.join(", ")), P_ATOM)
        }
        Expr::ToFloat(a) => show(a, params),
        Expr::Unary(op, a) => {
            let sym = if *op == UnOp::Neg { "-" } else { "!" };
            let (s, p) = show(a, params);
            // `--x` would read as a typo; `-(-x)` says what it is.
            let s = if p < P_UNARY || s.starts_with('-') || s.starts_with('!') {
                format!("({s})")
            } else {
                s
            };
            (format!("{sym}{s}"), P_UNARY)
        }
        Expr::Binary(op, a, b) => {
            let (sym, p) = binop(*op);
            // Left-associative operators take an equal-precedence left operand bare;
            // comparisons do not chain, so both of their operands must bind tighter.
            let left_min = if p == P_CMP { p + 1 } else { p };
            (format!("{} {sym} {}", at(a, left_min), at(b, p + 1)), p)
        }
        Expr::Call(f, args) => {
            let xs: Vec<String> = args.iter().map(|x| show(x, params).0).collect();
            (format!("{}({})", f.name(), xs.join(", ")), P_ATOM)
        }
        Expr::Select(c, a, b) => {
            let els = match &**b {
                Expr::Select(..) => show(b, params).0,
                b => format!("{{ {} }}", show(b, params).0),
            };
            let s = format!("if {} {{ {} }} else {els}", at(c, P_OR), show(a, params).0);
            (s, P_IF)
        }
    }
}

fn var_name(v: Var) -> &'static str {
    match v {
        Var::B => "b",
        Var::H => "h",
        Var::Q => "q",
        Var::K => "k",
        Var::S => "s",
        Var::SeqQ => "seq_q",
        Var::SeqK => "seq_k",
    }
}

fn binop(op: BinOp) -> (&'static str, u8) {
    match op {
        BinOp::Add => ("+", P_ADD),
        BinOp::Sub => ("-", P_ADD),
        BinOp::Mul => ("*", P_MUL),
        BinOp::Div => ("/", P_MUL),
        BinOp::Rem => ("%", P_MUL),
        BinOp::Lt => ("<", P_CMP),
        BinOp::Le => ("<=", P_CMP),
        BinOp::Gt => (">", P_CMP),
        BinOp::Ge => (">=", P_CMP),
        BinOp::Eq => ("==", P_CMP),
        BinOp::Ne => ("!=", P_CMP),
        BinOp::And => ("&&", P_AND),
        BinOp::Or => ("||", P_OR),
    }
}
