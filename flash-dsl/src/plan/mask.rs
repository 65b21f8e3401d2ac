//! Mask analysis: a mask expression split into affine atoms (decided per tile from its corners),
//! range atoms (decided per tile from interval bounds of tensor lookups) and opaque parts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::spec::{BinOp, Dim, Expr, ParamDecl, ParamKind, ScalarTy, Ty, UnOp, Var, VariantSpec};

/// Comparison of an affine atom against zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CmpOp {
    /// `< 0` (or `lhs < rhs` in a [`RangeAtom`]).
    Lt,
    /// `<= 0`.
    Le,
    /// `> 0`.
    Gt,
    /// `>= 0`.
    Ge,
    /// `== 0`.
    Eq,
    /// `!= 0`.
    Ne,
}

/// `cq·q + ck·k + offset  OP  0`, where `offset` is an integer expression that is constant over
/// a tile (literals, `seq_q`, `seq_k`, `b`, `h`, integer scalar params). Because the left side is
/// affine in `(q, k)`, its extremes over a rectangular tile are at the corners, so the atom's
/// truth over the whole tile (always, never, or mixed) costs four evaluations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AffineAtom {
    /// Coefficient of the query position `q`.
    pub cq: i64,
    /// Coefficient of the key position `k`.
    pub ck: i64,
    /// The tile-constant integer part (an [`Expr::Int`] when it is a plain literal).
    pub offset: Expr,
    /// How the affine form compares with zero.
    pub op: CmpOp,
}

/// Boolean structure of a mask over its atoms, for three-valued tile classification.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MaskTree {
    /// A constant part of the mask (`true` / `false`).
    Const(bool),
    /// Index into [`MaskPlan::atoms`].
    Atom(usize),
    /// A sub-expression that is not affine in `(q, k)` (data-dependent, non-linear): unknown
    /// over a tile, decided per element.
    Opaque,
    /// Index into [`MaskPlan::ranges`]: decided per tile from interval bounds when it can be.
    Range(usize),
    /// All children hold (`&&`, flattened).
    And(Vec<MaskTree>),
    /// Some child holds (`||`, flattened).
    Or(Vec<MaskTree>),
    /// The child does not hold (`!`).
    Not(Box<MaskTree>),
}

/// The mask of a variant, prepared for the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MaskPlan {
    /// The whole mask, evaluated per element in partial tiles.
    pub expr: Expr,
    /// The affine atoms the tree refers to by index ([`MaskTree::Atom`]).
    pub atoms: Vec<AffineAtom>,
    /// The mask's boolean structure over its atoms, ranges and opaque parts.
    pub tree: MaskTree,
    /// Data-dependent comparisons decided per tile by interval bounds (see [`RangeAtom`]).
    #[serde(default)]
    pub ranges: Vec<RangeAtom>,
}

/// An integer comparison `lhs OP rhs` that is not affine in `(q, k)` because it reads tensors,
/// such as a document mask `doc[q] == doc[k]`. Over a tile both sides are bounded by interval
/// arithmetic, each lookup `T[q]` (or `T[b, k]`, …) by the minimum and maximum of `T` over the
/// tile's positions, which the kernel reduces across a warp. With sorted document ids most tiles
/// are decided: disjoint documents give an empty tile (never loaded), a single shared document
/// a full one (no mask code). Lookups qualify when the position index is `q` or `k` on the last
/// (`seq`) dimension and any leading dimension is indexed by `b`, `h` or a literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RangeAtom {
    /// The left side, an integer expression.
    pub lhs: Expr,
    /// The right side, an integer expression.
    pub rhs: Expr,
    /// How the left side compares with the right.
    pub op: CmpOp,
}

// ---------------------------------------------------------------------------------------------
// Mask analysis
// ---------------------------------------------------------------------------------------------

/// A factor of a tile-constant monomial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Base {
    SeqQ,
    SeqK,
    B,
    H,
    /// An integer scalar parameter.
    Param(usize),
}

impl Base {
    fn expr(self) -> Expr {
        match self {
            Base::SeqQ => Expr::Var(Var::SeqQ),
            Base::SeqK => Expr::Var(Var::SeqK),
            Base::B => Expr::Var(Var::B),
            Base::H => Expr::Var(Var::H),
            Base::Param(i) => Expr::Scalar(i),
        }
    }
}

/// A polynomial in tile constants with integer coefficients: sorted monomial → coefficient,
/// zero coefficients removed, the empty monomial being the constant term. Its canonical form
/// makes equal offsets compare equal, so atoms deduplicate.
type Poly = BTreeMap<Vec<Base>, i64>;

/// `cq·q + ck·k + off`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Linear {
    cq: i64,
    ck: i64,
    off: Poly,
}

impl Linear {
    fn constant(c: i64) -> Self {
        let mut off = Poly::new();
        if c != 0 {
            off.insert(Vec::new(), c);
        }
        Linear { cq: 0, ck: 0, off }
    }
    fn base(b: Base) -> Self {
        Linear {
            cq: 0,
            ck: 0,
            off: Poly::from([(vec![b], 1)]),
        }
    }
    fn is_tile_constant(&self) -> bool {
        self.cq == 0 && self.ck == 0
    }
    /// The value if this is a plain integer.
    fn as_literal(&self) -> Option<i64> {
        if !self.is_tile_constant() {
            return None;
        }
        match self.off.len() {
            0 => Some(0),
            1 => self.off.get(&Vec::new()).copied(),
            _ => None,
        }
    }
    fn scale(&self, c: i64) -> Option<Self> {
        let mut off = Poly::new();
        for (m, v) in &self.off {
            let v = v.checked_mul(c)?;
            if v != 0 {
                off.insert(m.clone(), v);
            }
        }
        Some(Linear {
            cq: self.cq.checked_mul(c)?,
            ck: self.ck.checked_mul(c)?,
            off,
        })
    }
    fn add(&self, other: &Self) -> Option<Self> {
        let mut off = self.off.clone();
        for (m, v) in &other.off {
            let e = off.entry(m.clone()).or_insert(0);
            *e = e.checked_add(*v)?;
            if *e == 0 {
                off.remove(m);
            }
        }
        Some(Linear {
            cq: self.cq.checked_add(other.cq)?,
            ck: self.ck.checked_add(other.ck)?,
            off,
        })
    }
    /// Product of two tile-constant polynomials.
    fn mul_constants(&self, other: &Self) -> Option<Self> {
        let mut off = Poly::new();
        for (ma, va) in &self.off {
            for (mb, vb) in &other.off {
                let mut m: Vec<Base> = ma.iter().chain(mb).copied().collect();
                m.sort();
                let e = off.entry(m.clone()).or_insert(0);
                *e = e.checked_add(va.checked_mul(*vb)?)?;
                if *e == 0 {
                    off.remove(&m);
                }
            }
        }
        Some(Linear { cq: 0, ck: 0, off })
    }
    /// The first nonzero of `(cq, ck, offset coefficients…)`, for sign normalisation.
    fn leading_sign(&self) -> i64 {
        let non_constant = self.off.iter().filter(|(m, _)| !m.is_empty());
        let constant = self.off.get(&Vec::new());
        [self.cq, self.ck]
            .into_iter()
            .chain(non_constant.map(|(_, v)| *v))
            .chain(constant.copied())
            .find(|v| *v != 0)
            .map_or(0, i64::signum)
    }
    /// The offset as an expression: non-constant monomials in canonical order, then the
    /// constant term, the first positive term moved to the front (`1 - prefix`, not
    /// `-prefix + 1`), negative coefficients spelled as subtraction.
    fn offset_expr(&self) -> Expr {
        let mut ordered: Vec<(&Vec<Base>, &i64)> = self
            .off
            .iter()
            .filter(|(m, _)| !m.is_empty())
            .chain(self.off.get_key_value(&Vec::new()))
            .collect();
        if let Some(first_positive) = ordered.iter().position(|(_, c)| **c > 0) {
            let t = ordered.remove(first_positive);
            ordered.insert(0, t);
        }
        let mut terms = ordered.into_iter();
        let term = |m: &[Base], c: i64| -> Expr {
            let product = m
                .iter()
                .map(|b| b.expr())
                .reduce(|a, b| Expr::bin(BinOp::Mul, a, b));
            match (product, c.unsigned_abs()) {
                (None, c) => Expr::Int(c as i64),
                (Some(p), 1) => p,
                (Some(p), c) => Expr::bin(BinOp::Mul, Expr::Int(c as i64), p),
            }
        };
        let Some((m0, &c0)) = terms.next() else {
            return Expr::Int(0);
        };
        let mut e = if m0.is_empty() {
            Expr::Int(c0)
        } else if c0 < 0 {
            Expr::Unary(UnOp::Neg, Box::new(term(m0, c0)))
        } else {
            term(m0, c0)
        };
        for (m, &c) in terms {
            let op = if c < 0 { BinOp::Sub } else { BinOp::Add };
            e = Expr::bin(op, e, term(m, c));
        }
        e
    }
}

/// `e` as an affine form in `(q, k)` with integer coefficients and a tile-constant offset, or
/// `None` when it is not one (tensor lookups, products of positions, remainders, floats…).
fn linearize(spec: &VariantSpec, e: &Expr) -> Option<Linear> {
    match e {
        Expr::Int(i) => Some(Linear::constant(*i)),
        Expr::Var(v) => match v {
            Var::Q => Some(Linear {
                cq: 1,
                ck: 0,
                off: Poly::new(),
            }),
            Var::K => Some(Linear {
                cq: 0,
                ck: 1,
                off: Poly::new(),
            }),
            Var::SeqQ => Some(Linear::base(Base::SeqQ)),
            Var::SeqK => Some(Linear::base(Base::SeqK)),
            Var::B => Some(Linear::base(Base::B)),
            Var::H => Some(Linear::base(Base::H)),
            Var::S => None,
        },
        Expr::Scalar(i) => match spec.params.get(*i)?.kind {
            ParamKind::Scalar(ScalarTy::I32) => Some(Linear::base(Base::Param(*i))),
            _ => None,
        },
        Expr::Unary(UnOp::Neg, a) => linearize(spec, a)?.scale(-1),
        Expr::Binary(BinOp::Add, a, b) => linearize(spec, a)?.add(&linearize(spec, b)?),
        Expr::Binary(BinOp::Sub, a, b) => linearize(spec, a)?.add(&linearize(spec, b)?.scale(-1)?),
        Expr::Binary(BinOp::Mul, a, b) => {
            let (a, b) = (linearize(spec, a)?, linearize(spec, b)?);
            if let Some(c) = a.as_literal() {
                b.scale(c)
            } else if let Some(c) = b.as_literal() {
                a.scale(c)
            } else if a.is_tile_constant() && b.is_tile_constant() {
                a.mul_constants(&b)
            } else {
                None
            }
        }
        _ => None,
    }
}

fn cmp_op(op: BinOp) -> Option<CmpOp> {
    Some(match op {
        BinOp::Lt => CmpOp::Lt,
        BinOp::Le => CmpOp::Le,
        BinOp::Gt => CmpOp::Gt,
        BinOp::Ge => CmpOp::Ge,
        BinOp::Eq => CmpOp::Eq,
        BinOp::Ne => CmpOp::Ne,
        _ => return None,
    })
}

impl CmpOp {
    /// Whether `v OP 0`.
    pub fn holds(self, v: i128) -> bool {
        match self {
            CmpOp::Lt => v < 0,
            CmpOp::Le => v <= 0,
            CmpOp::Gt => v > 0,
            CmpOp::Ge => v >= 0,
            CmpOp::Eq => v == 0,
            CmpOp::Ne => v != 0,
        }
    }
}

/// An integer comparison `lhs - rhs OP 0` in canonical form: `>`/`>=` become `<`/`<=` by
/// negation, `x < 0` becomes `x + 1 <= 0`, and `==`/`!=` get a positive leading coefficient. The
/// result is a constant when the difference is a plain integer.
fn comparison(op: CmpOp, diff: Linear, atoms: &mut Vec<AffineAtom>) -> MaskTree {
    if let Some(c) = diff.as_literal() {
        return MaskTree::Const(op.holds(c as i128));
    }
    let canon = match op {
        CmpOp::Le => Some((diff, CmpOp::Le)),
        CmpOp::Lt => diff.add(&Linear::constant(1)).map(|d| (d, CmpOp::Le)),
        CmpOp::Ge => diff.scale(-1).map(|d| (d, CmpOp::Le)),
        CmpOp::Gt => diff
            .scale(-1)
            .and_then(|d| d.add(&Linear::constant(1)))
            .map(|d| (d, CmpOp::Le)),
        CmpOp::Eq | CmpOp::Ne => {
            if diff.leading_sign() < 0 {
                diff.scale(-1).map(|d| (d, op))
            } else {
                Some((diff, op))
            }
        }
    };
    let Some((diff, op)) = canon else {
        return MaskTree::Opaque;
    };
    let atom = AffineAtom {
        cq: diff.cq,
        ck: diff.ck,
        offset: diff.offset_expr(),
        op,
    };
    if !atom_is_exact(&atom) {
        return MaskTree::Opaque;
    }
    let index = match atoms.iter().position(|a| *a == atom) {
        Some(i) => i,
        None => {
            atoms.push(atom);
            atoms.len() - 1
        }
    };
    MaskTree::Atom(index)
}

/// Whether the kernels' 64-bit evaluation of the atom (its corners `cq·q + ck·k + offset`, and
/// the key hull's bounds derived from them) is exact for every launch within the limits of
/// [`crate::validate::arith`]: every node of the offset and the extremes within ±2⁶². The
/// planner re-associates the expression, so this is not implied by validation; an atom that
/// fails is left opaque (decided per element, exactly).
fn atom_is_exact(atom: &AffineAtom) -> bool {
    use crate::validate::arith::{int_range, MAX_SEQ, MAX_WIDE, POSITION_SLACK};
    let mut nodes_fit = true;
    atom.offset
        .visit(&mut |x| nodes_fit &= int_range(x).fits_wide());
    let off = int_range(&atom.offset);
    let pos = (MAX_SEQ + POSITION_SLACK) as i128;
    let extreme = (atom.cq as i128).abs() * pos
        + (atom.ck as i128).abs() * pos
        + off.lo.abs().max(off.hi.abs());
    nodes_fit && extreme <= MAX_WIDE
}

fn mask_tree(
    spec: &VariantSpec,
    e: &Expr,
    atoms: &mut Vec<AffineAtom>,
    ranges: &mut Vec<RangeAtom>,
) -> MaskTree {
    match e {
        Expr::Bool(b) => MaskTree::Const(*b),
        Expr::Unary(UnOp::Not, a) => match mask_tree(spec, a, atoms, ranges) {
            MaskTree::Const(b) => MaskTree::Const(!b),
            MaskTree::Not(inner) => *inner,
            t => MaskTree::Not(Box::new(t)),
        },
        Expr::Binary(op @ (BinOp::And | BinOp::Or), a, b) => {
            let is_and = *op == BinOp::And;
            let mut children = Vec::new();
            for side in [a, b] {
                match mask_tree(spec, side, atoms, ranges) {
                    MaskTree::And(xs) if is_and => children.extend(xs),
                    MaskTree::Or(xs) if !is_and => children.extend(xs),
                    // `true && x` is x; `false || x` is x.
                    MaskTree::Const(c) if c == is_and => {}
                    // `false && x` is false; `true || x` is true.
                    MaskTree::Const(c) => return MaskTree::Const(c),
                    t => {
                        if !children.contains(&t) || t == MaskTree::Opaque {
                            children.push(t)
                        }
                    }
                }
            }
            match children.len() {
                0 => MaskTree::Const(is_and),
                1 => children.pop().expect("one child"),
                _ if is_and => MaskTree::And(children),
                _ => MaskTree::Or(children),
            }
        }
        Expr::Binary(op, a, b)
            if cmp_op(*op).is_some()
                && a.ty(&spec.params) == Ty::Int
                && b.ty(&spec.params) == Ty::Int =>
        {
            let diff = linearize(spec, a)
                .zip(linearize(spec, b))
                .and_then(|(a, b)| a.add(&b.scale(-1)?));
            match diff {
                Some(d) => comparison(cmp_op(*op).expect("comparison"), d, atoms),
                None => range_atom(spec, cmp_op(*op).expect("comparison"), a, b, ranges),
            }
        }
        _ => MaskTree::Opaque,
    }
}

/// A [`RangeAtom`] for an integer comparison that reads tensors and whose sides interval
/// arithmetic can bound; otherwise an opaque node.
fn range_atom(
    spec: &VariantSpec,
    op: CmpOp,
    a: &Expr,
    b: &Expr,
    ranges: &mut Vec<RangeAtom>,
) -> MaskTree {
    let mut reads_tensor = false;
    for side in [a, b] {
        side.visit(&mut |e| reads_tensor |= matches!(e, Expr::Index(..)));
    }
    if !reads_tensor || !bounded(spec, a) || !bounded(spec, b) {
        return MaskTree::Opaque;
    }
    let atom = RangeAtom {
        lhs: a.clone(),
        rhs: b.clone(),
        op,
    };
    let index = ranges.iter().position(|r| *r == atom).unwrap_or_else(|| {
        ranges.push(atom);
        ranges.len() - 1
    });
    MaskTree::Range(index)
}

/// Whether interval arithmetic bounds the integer expression `e` over a tile.
fn bounded(spec: &VariantSpec, e: &Expr) -> bool {
    match e {
        Expr::Int(_) | Expr::Var(_) | Expr::Scalar(_) => true,
        Expr::Unary(UnOp::Neg, a) => bounded(spec, a),
        Expr::Binary(BinOp::Add | BinOp::Sub | BinOp::Mul, a, b) => {
            bounded(spec, a) && bounded(spec, b)
        }
        Expr::Index(i, idx) => range_lookup(&spec.params, *i, idx).is_some(),
        _ => false,
    }
}

/// How a lookup qualifies for range bounds: the position variable (`q` or `k`) indexing the
/// last, `seq`, dimension, and the index of the leading dimension if there is one.
pub fn range_lookup<'e>(
    params: &[ParamDecl],
    param: usize,
    idx: &'e [Expr],
) -> Option<(Var, Option<&'e Expr>)> {
    let ParamKind::Tensor {
        elem: ScalarTy::I32,
        dims,
    } = &params[param].kind
    else {
        return None;
    };
    let pos = match idx.last()? {
        Expr::Var(v @ (Var::Q | Var::K)) => *v,
        _ => return None,
    };
    match (dims.as_slice(), idx) {
        ([Dim::Seq], [_]) => Some((pos, None)),
        ([Dim::Batch, Dim::Seq], [lead @ Expr::Var(Var::B), _])
        | ([Dim::Heads, Dim::Seq], [lead @ Expr::Var(Var::H), _])
        | ([Dim::Fixed(_), Dim::Seq], [lead @ Expr::Int(_), _]) => Some((pos, Some(lead))),
        _ => None,
    }
}

/// Splits a mask into affine atoms and opaque parts (see [`MaskPlan`]).
pub fn analyse_mask(spec: &VariantSpec, mask: &Expr) -> MaskPlan {
    let mut atoms = Vec::new();
    let mut ranges = Vec::new();
    let tree = mask_tree(spec, mask, &mut atoms, &mut ranges);
    MaskPlan {
        expr: mask.clone(),
        atoms,
        tree,
        ranges,
    }
}
