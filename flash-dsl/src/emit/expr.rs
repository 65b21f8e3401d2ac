//! Translation of the plan's expression trees into C++: the bodies of the hooks (`mask_at`,
//! `score_at`, `tile_class`, `key_hull`) and the param fields of the argument struct.

use std::fmt::Write as _;

use crate::plan::{range_lookup, AffineAtom, CmpOp, MaskPlan, MaskTree};
use crate::spec::{BinOp, Dim, Expr, Func, ParamDecl, ParamKind, ScalarTy, Ty, UnOp, Var};
use crate::validate::arith::{int_range, needs_wide, wide_index};

fn field_name(p: &ParamDecl) -> String {
    format!("p_{}", p.name)
}

/// The argument-struct field of a parameter's gradient buffer.
pub(super) fn grad_field_name(p: &ParamDecl) -> String {
    format!("g_{}", p.name)
}

fn scalar_cpp(t: ScalarTy) -> &'static str {
    match t {
        ScalarTy::I32 => "int",
        ScalarTy::F32 => "float",
    }
}

pub(super) fn param_field(p: &ParamDecl) -> String {
    match &p.kind {
        ParamKind::Scalar(t) => format!("{} {};", scalar_cpp(*t), field_name(p)),
        ParamKind::Tensor { elem, .. } => {
            format!("const {}* {};", scalar_cpp(*elem), field_name(p))
        }
    }
}

/// Translation of expression trees to C++ expressions over the hook's locals
/// (`b h q k s seq_q seq_k`, `args`).
pub(super) struct ExprCx<'a> {
    pub(super) params: &'a [ParamDecl],
    /// Subtrees written as a local's name instead (hoisted lookups, see [`mask_bits_body`]).
    pub(super) subst: &'a [(Expr, String)],
}

impl ExprCx<'_> {
    pub(super) fn expr(&self, e: &Expr) -> String {
        if let Some((_, name)) = self.subst.iter().find(|(x, _)| x == e) {
            return name.clone();
        }
        match e {
            Expr::Int(v) => format!("{v}"),
            Expr::Float(v) => float_lit(v.get()),
            Expr::Bool(v) => format!("{v}"),
            Expr::Var(v) => match v {
                Var::B => "b",
                Var::H => "h",
                Var::Q => "q",
                Var::K => "k",
                Var::S => "s",
                Var::SeqQ => "seq_q",
                Var::SeqK => "seq_k",
            }
            .to_string(),
            Expr::Scalar(i) => format!("args.{}", field_name(&self.params[*i])),
            Expr::Index(i, idx) => self.index(*i, idx),
            Expr::ToFloat(a) => match float_affine(a) {
                Some(f) => f,
                None => format!("((float)({}))", self.expr(a)),
            },
            // Integer nodes whose value may leave `int` are computed in 64 bits (see
            // `validate::arith`); the others stay 32-bit.
            Expr::Unary(UnOp::Neg, a) if needs_wide(e, self.params) => {
                format!("(-(i64)({}))", self.expr(a))
            }
            Expr::Unary(UnOp::Neg, a) => format!("(-{})", self.expr(a)),
            Expr::Unary(UnOp::Not, a) => format!("(!{})", self.expr(a)),
            Expr::Binary(op, a, b) => {
                let (x, y) = (self.expr(a), self.expr(b));
                let wide = needs_wide(e, self.params);
                match (op, &**b) {
                    // A literal divisor becomes a multiply; otherwise the SFU's 2-ulp division.
                    (BinOp::Div, Expr::Float(c)) if c.get() != 0.0 => {
                        format!("((float)({x}) * {})", float_lit(1.0 / c.get()))
                    }
                    (BinOp::Div, _) => format!("flash::fdivf((float)({x}), (float)({y}))"),
                    // `x % 0` is 0 (and so is `INT_MIN % -1`): a helper unless the divisor is
                    // a constant other than 0 and -1.
                    (BinOp::Rem, Expr::Int(d)) if *d != 0 && *d != -1 && wide => {
                        format!("((i64)({x}) % (i64)({y}))")
                    }
                    (BinOp::Rem, Expr::Int(d)) if *d != 0 && *d != -1 => format!("({x} % {y})"),
                    (BinOp::Rem, _) if wide => format!("flash::lrem({x}, {y})"),
                    (BinOp::Rem, _) => format!("flash::irem({x}, {y})"),
                    (BinOp::Add | BinOp::Sub | BinOp::Mul, _) if wide => {
                        format!("((i64)({x}) {} (i64)({y}))", binop_cpp(*op))
                    }
                    (_, _) => format!("({x} {} {y})", binop_cpp(*op)),
                }
            }
            Expr::Call(f, args) => {
                let int = args[0].ty(self.params) == Ty::Int;
                let xs: Vec<String> = args.iter().map(|a| self.expr(a)).collect();
                let name = match (f, int) {
                    (Func::Abs, true) if needs_wide(e, self.params) => "flash::labs",
                    (Func::Min, true) if needs_wide(e, self.params) => "flash::lmin",
                    (Func::Max, true) if needs_wide(e, self.params) => "flash::lmax",
                    (Func::Exp, _) => "flash::fexp",
                    (Func::Log, _) => "flash::flog",
                    (Func::Tanh, _) => "flash::ftanh",
                    (Func::Sigmoid, _) => "flash::fsigmoid",
                    (Func::Sqrt, _) => "sqrtf",
                    (Func::Abs, true) => "flash::iabs",
                    (Func::Abs, false) => "fabsf",
                    (Func::Min, true) => "flash::imin",
                    (Func::Min, false) => "fminf",
                    (Func::Max, true) => "flash::imax",
                    (Func::Max, false) => "fmaxf",
                };
                format!("{name}({})", xs.join(", "))
            }
            Expr::Select(c, a, b) => {
                format!("({} ? {} : {})", self.expr(c), self.expr(a), self.expr(b))
            }
        }
    }

    /// A tensor lookup with every index clamped into its dimension, so no value of the
    /// expression can read out of bounds. A `seq` dimension holds `max(seq_q, seq_k)` entries.
    fn index(&self, i: usize, idx: &[Expr]) -> String {
        format!(
            "__ldg(&args.{}[{}])",
            field_name(&self.params[i]),
            self.flat_index(i, idx)
        )
    }

    /// The flat element offset of `param[idx]`, every index clamped into its dimension ("0"
    /// for a scalar); in 64 bits when the tensor may hold more than `i32::MAX` elements.
    pub(super) fn flat_index(&self, i: usize, idx: &[Expr]) -> String {
        let p = &self.params[i];
        let ParamKind::Tensor { dims, .. } = &p.kind else {
            return "0".to_string();
        };
        let mut flat = String::new();
        for (d, ix) in dims.iter().zip(idx) {
            let size = match d {
                Dim::Batch => "args.batch".to_string(),
                Dim::Heads => "args.heads_q".to_string(),
                Dim::Seq => "flash::imax(args.seq_q, args.seq_k)".to_string(),
                Dim::Fixed(n) => n.to_string(),
                Dim::SeqBlocks(n) => {
                    format!("((flash::imax(args.seq_q, args.seq_k) + {}) / {n})", n - 1)
                }
            };
            let clamp = if int_range(ix).fits_i32() {
                "clampi"
            } else {
                "clampl"
            };
            let clamped = format!("flash::{clamp}({}, {size})", self.expr(ix));
            flat = if flat.is_empty() && wide_index(p) {
                format!("(i64){clamped}")
            } else if flat.is_empty() {
                clamped
            } else {
                format!("({flat}) * {size} + {clamped}")
            };
        }
        flat
    }
}

impl ExprCx<'_> {
    /// Emits statements bounding the integer expression `e` over the tile (`q0..q1`,
    /// `k0..k1`, in scope in `tile_class`) and returns the names of its lower and upper bound.
    /// Lookups are bounded by a warp-wide min/max over the tensor slice the tile reads.
    fn interval(&self, e: &Expr, out: &mut String, n: &mut usize) -> (String, String) {
        let id = *n;
        *n += 1;
        let (lo, hi) = match e {
            Expr::Var(Var::Q) => ("q0".to_string(), "q1".to_string()),
            Expr::Var(Var::K) => ("k0".to_string(), "k1".to_string()),
            Expr::Unary(UnOp::Neg, a) => {
                let (lo, hi) = self.interval(a, out, n);
                (format!("-{hi}"), format!("-{lo}"))
            }
            Expr::Binary(op @ (BinOp::Add | BinOp::Sub | BinOp::Mul), a, b) => {
                let (alo, ahi) = self.interval(a, out, n);
                let (blo, bhi) = self.interval(b, out, n);
                match op {
                    BinOp::Add => (format!("{alo} + {blo}"), format!("{ahi} + {bhi}")),
                    BinOp::Sub => (format!("{alo} - {bhi}"), format!("{ahi} - {blo}")),
                    _ => {
                        let p =
                            format!("{alo} * {blo}, {alo} * {bhi}, {ahi} * {blo}, {ahi} * {bhi}");
                        let _ = writeln!(out, "  const i64 p{id}[4] = {{{p}}};");
                        (
                            format!("flash::lmin(flash::lmin(p{id}[0], p{id}[1]), flash::lmin(p{id}[2], p{id}[3]))"),
                            format!("flash::lmax(flash::lmax(p{id}[0], p{id}[1]), flash::lmax(p{id}[2], p{id}[3]))"),
                        )
                    }
                }
            }
            Expr::Index(i, idx) => {
                let p = &self.params[*i];
                let (pos, lead) = range_lookup_of(self, *i, idx);
                let (p0, p1) = if pos == Var::Q {
                    ("q0", "q1")
                } else {
                    ("k0", "k1")
                };
                // The tensor's `seq` extent: the launch's (in a paged or packed launch the hooks'
                // own `seq_q` / `seq_k` are one sequence's, shorter).
                let seq = "(i64)flash::imax(args.seq_q, args.seq_k)";
                let base = match lead {
                    None => "0".to_string(),
                    Some((ix, size)) => format!("(i64)flash::clampi({ix}, {size}) * {seq}"),
                };
                let _ = writeln!(
                    out,
                    "  i64 t{id}lo, t{id}hi;\n  flash::warp_range(args.{} + {base}, flash::lmax({p0}, 0), flash::lmin({p1}, {seq} - 1), t{id}lo, t{id}hi);",
                    field_name(p)
                );
                (format!("t{id}lo"), format!("t{id}hi"))
            }
            other => {
                let v = format!("(i64)({})", self.expr(other));
                (v.clone(), v)
            }
        };
        let _ = writeln!(out, "  const i64 v{id}lo = {lo}, v{id}hi = {hi};");
        (format!("v{id}lo"), format!("v{id}hi"))
    }
}

/// The position variable of a range lookup and, if any, its leading index with that
/// dimension's size, as C++.
fn range_lookup_of(cx: &ExprCx, param: usize, idx: &[Expr]) -> (Var, Option<(String, String)>) {
    let ParamKind::Tensor { dims, .. } = &cx.params[param].kind else {
        unreachable!("range atoms only hold tensor lookups")
    };
    let (pos, lead) = range_lookup(cx.params, param, idx).expect("the planner checked the lookup");
    let lead = lead.map(|e| {
        let size = match dims[0] {
            Dim::Batch => "args.batch".to_string(),
            Dim::Heads => "args.heads_q".to_string(),
            Dim::Seq | Dim::SeqBlocks(_) => {
                unreachable!("the leading dimension of a range lookup is not seq")
            }
            Dim::Fixed(n) => n.to_string(),
        };
        (cx.expr(e), size)
    });
    (pos, lead)
}

/// `ToFloat` of an integer expression built from `q`, `k`, literals, `+`, `-` and products with
/// a literal, rewritten over the float positions `qf` and `kf` that the kernel keeps per score
/// element: an integer-to-float conversion per element (a slow instruction) becomes additions of
/// constants. Exact while positions stay below 2^24.
fn float_affine(e: &Expr) -> Option<String> {
    Some(match e {
        Expr::Var(Var::Q) => "qf".into(),
        Expr::Var(Var::K) => "kf".into(),
        Expr::Int(c) if c.unsigned_abs() < 1 << 24 => float_lit(*c as f64),
        Expr::Unary(UnOp::Neg, a) => format!("(-{})", float_affine(a)?),
        Expr::Binary(op @ (BinOp::Add | BinOp::Sub), a, b) => {
            format!(
                "({} {} {})",
                float_affine(a)?,
                binop_cpp(*op),
                float_affine(b)?
            )
        }
        Expr::Binary(BinOp::Mul, a, b) => {
            let (c, x) = match (&**a, &**b) {
                (Expr::Int(c), x) | (x, Expr::Int(c)) => (*c, x),
                _ => return None,
            };
            if c.unsigned_abs() >= 1 << 24 {
                return None;
            }
            format!("({} * {})", float_lit(c as f64), float_affine(x)?)
        }
        _ => return None,
    })
}

fn binop_cpp(op: BinOp) -> &'static str {
    match op {
        BinOp::Add => "+",
        BinOp::Sub => "-",
        BinOp::Mul => "*",
        BinOp::Div => "/",
        BinOp::Rem => "%",
        BinOp::Lt => "<",
        BinOp::Le => "<=",
        BinOp::Gt => ">",
        BinOp::Ge => ">=",
        BinOp::Eq => "==",
        BinOp::Ne => "!=",
        BinOp::And => "&&",
        BinOp::Or => "||",
    }
}

/// A C++ float literal that reads back as the same f32.
fn float_lit(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "FLASH_INF" } else { "(-FLASH_INF)" }.to_string();
    }
    if v.is_nan() {
        return "__int_as_float(0x7fc00000)".to_string();
    }
    let s = format!("{:?}", v as f32);
    if s.contains(['.', 'e', 'E']) {
        format!("{s}f")
    } else {
        format!("{s}.0f")
    }
}

/// Min and max of `cq·q + ck·k + offset` over the box `[q0,q1] × [k0,k1]`, as C++ expressions.
fn atom_extremes(a: &AffineAtom, cx: &ExprCx) -> (String, String) {
    let off = cx.expr(&a.offset);
    let term = |c: i64, lo: &str, hi: &str, want_max: bool| -> String {
        if c == 0 {
            return "0".into();
        }
        let at = if (c > 0) == want_max { hi } else { lo };
        format!("{c}LL * {at}")
    };
    let min = format!(
        "({} + {} + (i64)({off}))",
        term(a.cq, "q0", "q1", false),
        term(a.ck, "k0", "k1", false)
    );
    let max = format!(
        "({} + {} + (i64)({off}))",
        term(a.cq, "q0", "q1", true),
        term(a.ck, "k0", "k1", true)
    );
    (min, max)
}

/// Body of `tile_class`: one three-valued local per atom (0 never, 1 unknown, 2 always),
/// combined as the mask tree says (and = min, or = max, not = 2 - x). Range atoms cost warp
/// reductions over tensor slices, so the tree is first decided with them unknown; three-valued
/// logic is monotone, so a definite answer then stands and the reductions are skipped.
pub(super) fn classify_body(mask: &MaskPlan, cx: &ExprCx) -> String {
    let (tree, atoms) = (&mask.tree, &mask.atoms);
    let mut out = String::new();
    for (i, a) in atoms.iter().enumerate() {
        let (mn, mx) = atom_extremes(a, cx);
        let (always, never) = match a.op {
            CmpOp::Lt => ("mx < 0", "mn >= 0"),
            CmpOp::Le => ("mx <= 0", "mn > 0"),
            CmpOp::Gt => ("mn > 0", "mx <= 0"),
            CmpOp::Ge => ("mn >= 0", "mx < 0"),
            CmpOp::Eq => ("mn == 0 && mx == 0", "mn > 0 || mx < 0"),
            CmpOp::Ne => ("mn > 0 || mx < 0", "mn == 0 && mx == 0"),
        };
        let _ = writeln!(
            out,
            "  int a{i};\n  {{ const i64 mn = {mn}, mx = {mx}; a{i} = ({always}) ? 2 : (({never}) ? 0 : 1); }}"
        );
    }
    if mask.ranges.is_empty() {
        let _ = writeln!(out, "  return {};", tree3(tree));
        return out;
    }
    let unknown: Vec<String> = (0..mask.ranges.len())
        .map(|i| format!("r{i} = 1"))
        .collect();
    let _ = writeln!(out, "  int {};", unknown.join(", "));
    let _ = writeln!(out, "  const int first = {};", tree3(tree));
    let _ = writeln!(out, "  if (first != 1) return first;");
    let mut n = 0usize;
    for (i, r) in mask.ranges.iter().enumerate() {
        let (llo, lhi) = cx.interval(&r.lhs, &mut out, &mut n);
        let (rlo, rhi) = cx.interval(&r.rhs, &mut out, &mut n);
        let (always, never) = match r.op {
            CmpOp::Lt => (format!("{lhi} < {rlo}"), format!("{llo} >= {rhi}")),
            CmpOp::Le => (format!("{lhi} <= {rlo}"), format!("{llo} > {rhi}")),
            CmpOp::Gt => (format!("{llo} > {rhi}"), format!("{lhi} <= {rlo}")),
            CmpOp::Ge => (format!("{llo} >= {rhi}"), format!("{lhi} < {rlo}")),
            CmpOp::Eq => (
                format!("{llo} == {lhi} && {rlo} == {rhi} && {llo} == {rlo}"),
                format!("{lhi} < {rlo} || {rhi} < {llo}"),
            ),
            CmpOp::Ne => (
                format!("{lhi} < {rlo} || {rhi} < {llo}"),
                format!("{llo} == {lhi} && {rlo} == {rhi} && {llo} == {rlo}"),
            ),
        };
        let _ = writeln!(out, "  r{i} = ({always}) ? 2 : (({never}) ? 0 : 1);");
    }
    let _ = writeln!(out, "  return {};", tree3(tree));
    out
}

fn tree3(t: &MaskTree) -> String {
    match t {
        MaskTree::Const(true) => "2".into(),
        MaskTree::Const(false) => "0".into(),
        MaskTree::Atom(i) => format!("a{i}"),
        MaskTree::Opaque => "1".into(),
        MaskTree::Range(i) => format!("r{i}"),
        MaskTree::And(xs) => xs
            .iter()
            .map(tree3)
            .reduce(|a, b| format!("flash::imin({a}, {b})"))
            .unwrap_or_else(|| "2".into()),
        MaskTree::Or(xs) => xs
            .iter()
            .map(tree3)
            .reduce(|a, b| format!("flash::imax({a}, {b})"))
            .unwrap_or_else(|| "0".into()),
        MaskTree::Not(x) => format!("(2 - {})", tree3(x)),
    }
}

/// Body of `key_hull`: a conservative key interval per tree node. An atom with `ck != 0`
/// bounds `k` on one side (two for `==`) by solving `ck·k OP -(cq·q + offset)` at the loosest
/// end of the query range; `and` intersects, `or` takes the hull of the union, anything else is
/// unbounded. Non-strict bounds for strict comparisons only widen the interval, which is safe:
/// every tile inside it is still classified. [`crate::plan::hull`] states the same algorithm in
/// Rust (keep the two in step); the property test `hulls_are_sound` checks it against brute force.
pub(super) fn hull_body(tree: &MaskTree, atoms: &[AffineAtom], cx: &ExprCx) -> String {
    hull_body_of(tree, atoms, cx, false)
}

/// Body of `query_hull`: [`hull_body`] with the roles of `q` and `k` exchanged, a conservative
/// interval of the queries that can see any key of `[k0, k1]` (the backward pass walks the
/// query tiles of a key block).
pub(super) fn query_hull_body(tree: &MaskTree, atoms: &[AffineAtom], cx: &ExprCx) -> String {
    hull_body_of(tree, atoms, cx, true)
}

fn hull_body_of(tree: &MaskTree, atoms: &[AffineAtom], cx: &ExprCx, transposed: bool) -> String {
    let mut out =
        String::from("  const i64 NEG = -(1LL << 40), POS = 1LL << 40;\n  (void)NEG; (void)POS;\n");
    let mut n = 0usize;
    let atoms: Vec<AffineAtom> = if transposed {
        atoms
            .iter()
            .map(|a| AffineAtom {
                cq: a.ck,
                ck: a.cq,
                ..a.clone()
            })
            .collect()
    } else {
        atoms.to_vec()
    };
    let (lo_var, hi_var) = if transposed {
        ("k0", "k1")
    } else {
        ("q0", "q1")
    };
    let root = hull_node(tree, &atoms, cx, &mut out, &mut n, (lo_var, hi_var));
    let _ = writeln!(out, "  lo = {root}_lo;\n  hi = {root}_hi;");
    out
}

/// One node of a hull body; `given` names the two ends of the range the bounds are taken over
/// (`q0`, `q1` for `key_hull`; `k0`, `k1` for `query_hull`, whose atoms come in with `cq` and
/// `ck` exchanged).
fn hull_node(
    t: &MaskTree,
    atoms: &[AffineAtom],
    cx: &ExprCx,
    out: &mut String,
    n: &mut usize,
    given: (&str, &str),
) -> String {
    let id = format!("r{n}");
    *n += 1;
    match t {
        MaskTree::Const(false) => {
            let _ = writeln!(out, "  const i64 {id}_lo = POS, {id}_hi = NEG;");
        }
        MaskTree::Atom(i) if atoms[*i].ck != 0 => {
            let a = &atoms[*i];
            let off = cx.expr(&a.offset);
            // g(q) = cq·q + offset over [q0, q1]
            let (q_at_min, q_at_max) = if a.cq >= 0 {
                (given.0, given.1)
            } else {
                (given.1, given.0)
            };
            let gmin = format!("{}LL * {q_at_min} + {id}_g0", a.cq);
            let gmax = format!("{}LL * {q_at_max} + {id}_g0", a.cq);
            let c = a.ck.abs();
            // Bounds on k implied by the atom, loosest over the query range.
            let (upper, lower) = if a.ck > 0 {
                // ck·k OP -g  →  k ≤ -g/ck (Lt, Le, Eq);  k ≥ -g/ck (Gt, Ge, Eq)
                (
                    format!("flash::fdiv(-({gmin}), {c})"),
                    format!("flash::cdiv(-({gmax}), {c})"),
                )
            } else {
                // -|ck|·k OP -g  ⇔  |ck|·k (flipped OP) g
                (
                    format!("flash::fdiv({gmax}, {c})"),
                    format!("flash::cdiv({gmin}, {c})"),
                )
            };
            let bounds_upper = matches!(
                (a.op, a.ck > 0),
                (CmpOp::Lt | CmpOp::Le | CmpOp::Eq, true)
                    | (CmpOp::Gt | CmpOp::Ge | CmpOp::Eq, false)
            );
            let bounds_lower = matches!(
                (a.op, a.ck > 0),
                (CmpOp::Gt | CmpOp::Ge | CmpOp::Eq, true)
                    | (CmpOp::Lt | CmpOp::Le | CmpOp::Eq, false)
            );
            let lo = if bounds_lower { lower } else { "NEG".into() };
            let hi = if bounds_upper { upper } else { "POS".into() };
            let _ = writeln!(
                out,
                "  const i64 {id}_g0 = (i64)({off});\n  const i64 {id}_lo = {lo}, {id}_hi = {hi};"
            );
        }
        MaskTree::And(xs) | MaskTree::Or(xs) => {
            let kids: Vec<String> = xs
                .iter()
                .map(|x| hull_node(x, atoms, cx, out, n, given))
                .collect();
            let and = matches!(t, MaskTree::And(_));
            let (flo, fhi) = if and {
                ("flash::lmax", "flash::lmin")
            } else {
                ("flash::lmin", "flash::lmax")
            };
            let lo = kids
                .iter()
                .map(|k| format!("{k}_lo"))
                .reduce(|a, b| format!("{flo}({a}, {b})"))
                .unwrap_or_else(|| if and { "NEG".into() } else { "POS".into() });
            let hi = kids
                .iter()
                .map(|k| format!("{k}_hi"))
                .reduce(|a, b| format!("{fhi}({a}, {b})"))
                .unwrap_or_else(|| if and { "POS".into() } else { "NEG".into() });
            let _ = writeln!(out, "  const i64 {id}_lo = {lo}, {id}_hi = {hi};");
        }
        _ => {
            let _ = writeln!(out, "  const i64 {id}_lo = NEG, {id}_hi = POS;");
        }
    }
    id
}

/// The mask's tensor lookups that read the query position but not the key (first list) or the
/// key but not the query (second): maximal subtrees, in first-seen order, without duplicates.
pub(super) fn mask_lookups(mask: &Expr) -> (Vec<Expr>, Vec<Expr>) {
    fn walk(e: &Expr, qs: &mut Vec<Expr>, ks: &mut Vec<Expr>) {
        if let Expr::Index(..) = e {
            let (q, k) = (e.uses_var(Var::Q), e.uses_var(Var::K));
            let side = match (q, k, e.uses_var(Var::S)) {
                (true, false, false) => Some(&mut *qs),
                (false, true, false) => Some(&mut *ks),
                _ => None,
            };
            if let Some(list) = side {
                if !list.contains(e) {
                    list.push(e.clone());
                }
                return;
            }
        }
        match e {
            Expr::Index(_, xs) | Expr::Call(_, xs) => xs.iter().for_each(|x| walk(x, qs, ks)),
            Expr::ToFloat(a) | Expr::Unary(_, a) => walk(a, qs, ks),
            Expr::Binary(_, a, b) => {
                walk(a, qs, ks);
                walk(b, qs, ks);
            }
            Expr::Select(c, a, b) => {
                walk(c, qs, ks);
                walk(a, qs, ks);
                walk(b, qs, ks);
            }
            _ => {}
        }
    }
    let (mut qs, mut ks) = (Vec::new(), Vec::new());
    walk(mask, &mut qs, &mut ks);
    (qs, ks)
}

/// Body of `mask_bits<NT, TRANS>` (see `hooks.cu.hbs`), or `None` when the mask has no lookup
/// that reads only one position (then the per-element `mask_at` costs no more). A slab's rows
/// are two positions `r0 + 8·r`, its columns `2·NT` positions `c0 + 8·nt + j`; rows are queries
/// (TRANS: keys). A lookup of the rows' side is read once per row, one of the columns' side
/// once per column, instead of once per element.
pub(super) fn mask_bits_body(mask: &Expr, cx: &ExprCx) -> Option<String> {
    let (qs, ks) = mask_lookups(mask);
    if qs.is_empty() && ks.is_empty() {
        return None;
    }
    let ty = |e: &Expr| match e.ty(cx.params) {
        Ty::Int => "int",
        _ => "float",
    };
    let mut out = String::new();
    for trans in [false, true] {
        // (row side, column side) lookups with their local names.
        let (rows, cols, rname, cname, rpos, cpos) = if trans {
            (&ks, &qs, "hk", "hq", "k", "q")
        } else {
            (&qs, &ks, "hq", "hk", "q", "k")
        };
        let mut subst: Vec<(Expr, String)> = Vec::new();
        let _ = writeln!(
            out,
            "  if constexpr ({}TRANS) {{",
            if trans { "" } else { "!" }
        );
        for (j, e) in rows.iter().enumerate() {
            let _ = writeln!(out, "    {} {rname}{j}[2];", ty(e));
        }
        if !rows.is_empty() {
            let _ = writeln!(out, "#pragma unroll\n    for (int r = 0; r < 2; ++r) {{\n      const int {rpos} = r0 + 8 * r;");
            for (j, e) in rows.iter().enumerate() {
                let _ = writeln!(out, "      {rname}{j}[r] = {};", cx.expr(e));
                subst.push((e.clone(), format!("{rname}{j}[r]")));
            }
            let _ = writeln!(out, "    }}");
        }
        let _ = writeln!(
            out,
            "#pragma unroll\n    for (int nt = 0; nt < NT; ++nt)\n#pragma unroll\n      for (int j = 0; j < 2; ++j) {{\n        const int {cpos} = c0 + 8 * nt + j;"
        );
        for (j, e) in cols.iter().enumerate() {
            let _ = writeln!(out, "        const {} {cname}{j} = {};", ty(e), cx.expr(e));
            subst.push((e.clone(), format!("{cname}{j}")));
        }
        let hoisted = ExprCx {
            params: cx.params,
            subst: &subst,
        };
        let bounds = if trans {
            "q < seq_q && k < seq_k"
        } else {
            "k < seq_k"
        };
        let _ = writeln!(
            out,
            "#pragma unroll\n        for (int r = 0; r < 2; ++r) {{\n          const int {rpos} = r0 + 8 * r;\n          const int e = nt * 4 + 2 * r + j;\n          if ({bounds} && {}) bits[e >> 5] |= 1u << (e & 31);\n        }}\n      }}\n  }}",
            hoisted.expr(mask)
        );
    }
    Some(out)
}
