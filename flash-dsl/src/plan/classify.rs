//! Tile classification on the host, mirroring the kernels: which (query tile, key tile) pairs
//! are empty, partial or full. Used by the tiled emulation and by tests of soundness.

use serde::{Deserialize, Serialize};

use super::mask::{AffineAtom, CmpOp, MaskPlan, MaskTree, RangeAtom};
use super::KernelPlan;
use crate::eval::{ParamValue, ParamValues};
use crate::spec::{BinOp, Expr, UnOp, Var, VariantSpec};

/// What the tile classification can say about one (query tile, key tile) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TileClass {
    /// Every element masked: the tile is never loaded.
    Empty,
    /// Some elements may be masked: the mask is evaluated per element.
    Partial,
    /// No element masked: no mask code runs.
    Full,
}

// ---------------------------------------------------------------------------------------------
// Tile classification
// ---------------------------------------------------------------------------------------------

/// The tile-constant values an atom's offset may read: sizes, the block's batch and head, and
/// integer scalar params (by param index; other params read as 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TileEnv {
    /// Query positions of the launch (`seq_q` in expressions).
    pub seq_q: i64,
    /// Key positions of the launch (`seq_k` in expressions).
    pub seq_k: i64,
    /// The block's batch index.
    pub b: i64,
    /// The block's query head.
    pub h: i64,
    /// Integer scalar params by param index (0 for every other param).
    pub scalars: Vec<i64>,
    /// Integer tensor params by param index (empty for others), for [`RangeAtom`] bounds.
    pub int_tensors: Vec<Vec<i64>>,
}

impl TileEnv {
    /// The environment of the block `(b, h)` of a launch with `params`.
    pub fn new(b: usize, h: usize, seq_q: usize, seq_k: usize, params: &ParamValues) -> Self {
        TileEnv {
            seq_q: seq_q as i64,
            seq_k: seq_k as i64,
            b: b as i64,
            h: h as i64,
            scalars: params
                .0
                .iter()
                .map(|p| match p {
                    ParamValue::Int(v) => *v,
                    _ => 0,
                })
                .collect(),
            int_tensors: params
                .0
                .iter()
                .map(|p| match p {
                    ParamValue::IntTensor(v) => v.clone(),
                    _ => Vec::new(),
                })
                .collect(),
        }
    }

    /// Bounds `[lo, hi]` of the integer expression `e` over the tile `[q0,q1] × [k0,k1]`, as
    /// the kernel computes them (see [`RangeAtom`]).
    pub fn interval(&self, e: &Expr, q: (i64, i64), k: (i64, i64)) -> (i128, i128) {
        match e {
            Expr::Var(Var::Q) => (q.0 as i128, q.1 as i128),
            Expr::Var(Var::K) => (k.0 as i128, k.1 as i128),
            Expr::Unary(UnOp::Neg, a) => {
                let (lo, hi) = self.interval(a, q, k);
                (-hi, -lo)
            }
            Expr::Binary(op @ (BinOp::Add | BinOp::Sub | BinOp::Mul), a, b) => {
                let (a, b) = (self.interval(a, q, k), self.interval(b, q, k));
                match op {
                    BinOp::Add => (a.0 + b.0, a.1 + b.1),
                    BinOp::Sub => (a.0 - b.1, a.1 - b.0),
                    _ => {
                        let p = [a.0 * b.0, a.0 * b.1, a.1 * b.0, a.1 * b.1];
                        (*p.iter().min().unwrap(), *p.iter().max().unwrap())
                    }
                }
            }
            Expr::Index(i, idx) => {
                let t = &self.int_tensors[*i];
                let seq = self.seq_q.max(self.seq_k);
                let last = idx.last().expect("a lookup has an index");
                let (p0, p1) = if matches!(last, Expr::Var(Var::Q)) {
                    q
                } else {
                    k
                };
                let lead = match &idx[..idx.len() - 1] {
                    [] => 0,
                    [Expr::Var(Var::B)] => self.b,
                    [Expr::Var(Var::H)] => self.h,
                    [Expr::Int(c)] => *c,
                    other => panic!("not a range lookup: {other:?}"),
                };
                let n_lead = (t.len() as i64 / seq.max(1)).max(1);
                let base = (lead.clamp(0, n_lead - 1) * seq) as usize;
                let (p0, p1) = (p0.clamp(0, seq - 1) as usize, p1.clamp(0, seq - 1) as usize);
                let xs = &t[base + p0..=base + p1];
                (
                    *xs.iter().min().unwrap() as i128,
                    *xs.iter().max().unwrap() as i128,
                )
            }
            other => {
                let v = self.offset(other);
                (v, v)
            }
        }
    }

    /// Value of an atom offset (an integer expression over tile constants).
    pub fn offset(&self, e: &Expr) -> i128 {
        match e {
            Expr::Int(i) => *i as i128,
            Expr::Var(Var::SeqQ) => self.seq_q as i128,
            Expr::Var(Var::SeqK) => self.seq_k as i128,
            Expr::Var(Var::B) => self.b as i128,
            Expr::Var(Var::H) => self.h as i128,
            Expr::Scalar(i) => self.scalars[*i] as i128,
            Expr::Unary(UnOp::Neg, a) => -self.offset(a),
            Expr::Binary(BinOp::Add, a, b) => self.offset(a) + self.offset(b),
            Expr::Binary(BinOp::Sub, a, b) => self.offset(a) - self.offset(b),
            Expr::Binary(BinOp::Mul, a, b) => self.offset(a) * self.offset(b),
            other => panic!("not a tile-constant offset: {other:?}"),
        }
    }
}

/// Three-valued truth of a mask over a tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Truth {
    Always,
    Never,
    Mixed,
}

impl Truth {
    fn not(self) -> Self {
        match self {
            Truth::Always => Truth::Never,
            Truth::Never => Truth::Always,
            Truth::Mixed => Truth::Mixed,
        }
    }
}

/// Truth of one atom over the box `[q0, q1] × [k0, k1]`: the affine form's extremes lie at the
/// corners, so its range over the box is `[lo, hi]`.
fn atom_truth(atom: &AffineAtom, env: &TileEnv, q0: i64, q1: i64, k0: i64, k1: i64) -> Truth {
    let off = env.offset(&atom.offset);
    let (cq, ck) = (atom.cq as i128, atom.ck as i128);
    let corners = [
        cq * q0 as i128 + ck * k0 as i128,
        cq * q0 as i128 + ck * k1 as i128,
        cq * q1 as i128 + ck * k0 as i128,
        cq * q1 as i128 + ck * k1 as i128,
    ];
    let lo = corners.iter().min().expect("four corners") + off;
    let hi = corners.iter().max().expect("four corners") + off;
    let (all, none) = match atom.op {
        CmpOp::Lt => (hi < 0, lo >= 0),
        CmpOp::Le => (hi <= 0, lo > 0),
        CmpOp::Gt => (lo > 0, hi <= 0),
        CmpOp::Ge => (lo >= 0, hi < 0),
        CmpOp::Eq => (lo == 0 && hi == 0, lo > 0 || hi < 0),
        CmpOp::Ne => (lo > 0 || hi < 0, lo == 0 && hi == 0),
    };
    match (all, none) {
        (true, _) => Truth::Always,
        (_, true) => Truth::Never,
        _ => Truth::Mixed,
    }
}

/// Truth of a range atom over a tile, from the interval bounds of its two sides.
fn range_truth(r: &RangeAtom, env: &TileEnv, b: (i64, i64, i64, i64)) -> Truth {
    let (l, h) = (
        env.interval(&r.lhs, (b.0, b.1), (b.2, b.3)),
        env.interval(&r.rhs, (b.0, b.1), (b.2, b.3)),
    );
    let (always, never) = match r.op {
        CmpOp::Lt => (l.1 < h.0, l.0 >= h.1),
        CmpOp::Le => (l.1 <= h.0, l.0 > h.1),
        CmpOp::Gt => (l.0 > h.1, l.1 <= h.0),
        CmpOp::Ge => (l.0 >= h.1, l.1 < h.0),
        CmpOp::Eq => (
            l.0 == l.1 && h.0 == h.1 && l.0 == h.0,
            l.1 < h.0 || h.1 < l.0,
        ),
        CmpOp::Ne => (
            l.1 < h.0 || h.1 < l.0,
            l.0 == l.1 && h.0 == h.1 && l.0 == h.0,
        ),
    };
    match (always, never) {
        (true, _) => Truth::Always,
        (_, true) => Truth::Never,
        _ => Truth::Mixed,
    }
}

fn tree_truth(tree: &MaskTree, mask: &MaskPlan, env: &TileEnv, b: (i64, i64, i64, i64)) -> Truth {
    let atoms = &mask.atoms;
    match tree {
        MaskTree::Const(true) => Truth::Always,
        MaskTree::Const(false) => Truth::Never,
        MaskTree::Atom(i) => atom_truth(&atoms[*i], env, b.0, b.1, b.2, b.3),
        MaskTree::Opaque => Truth::Mixed,
        MaskTree::Range(i) => range_truth(&mask.ranges[*i], env, b),
        MaskTree::Not(t) => tree_truth(t, mask, env, b).not(),
        MaskTree::And(ts) => {
            let mut acc = Truth::Always;
            for t in ts {
                match tree_truth(t, mask, env, b) {
                    Truth::Never => return Truth::Never,
                    Truth::Mixed => acc = Truth::Mixed,
                    Truth::Always => {}
                }
            }
            acc
        }
        MaskTree::Or(ts) => {
            let mut acc = Truth::Never;
            for t in ts {
                match tree_truth(t, mask, env, b) {
                    Truth::Always => return Truth::Always,
                    Truth::Mixed => acc = Truth::Mixed,
                    Truth::Never => {}
                }
            }
            acc
        }
    }
}

/// Classifies the tile of query positions `q0..=q1` and key positions `k0..=k1` (inclusive,
/// already clipped to the sequence lengths) as the kernel does at run time. Sound by
/// construction: `Full` only if every element is visible, `Empty` only if every element is
/// masked; anything undecided (opaque parts, mixed atoms) is `Partial`.
pub fn classify(
    mask: &MaskPlan,
    spec: &VariantSpec,
    env: &TileEnv,
    q0: i64,
    q1: i64,
    k0: i64,
    k1: i64,
) -> TileClass {
    debug_assert!(
        env.scalars.len() >= spec.params.len(),
        "tile env has {} param values, `{}` declares {}",
        env.scalars.len(),
        spec.name,
        spec.params.len()
    );
    debug_assert!(q0 <= q1 && k0 <= k1, "empty tile box");
    match tree_truth(&mask.tree, mask, env, (q0, q1, k0, k1)) {
        Truth::Always => TileClass::Full,
        Truth::Never => TileClass::Empty,
        Truth::Mixed => TileClass::Partial,
    }
}

/// Classes of every key tile for query tile `query_tile` of a `seq_q × seq_k` problem (tiles
/// clipped at the sequence ends). A dense plan gives all `Full`.
///
/// A causal mask with 128 × 64 tiles over 256 positions: the first query tile (rows 0..=127)
/// straddles the diagonal in key tiles 0 and 1 and sees nothing of 2 and 3; the second sees all
/// of key tiles 0 and 1.
///
/// ```
/// use flash_dsl::eval::ParamValues;
/// use flash_dsl::plan::{key_tile_classes, plan, TileClass::*, TileEnv};
///
/// let spec = flash_dsl::parse::parse_str("Causal { head_dim: 64, dtype: bf16, mask: causal }")
///     .unwrap()
///     .remove(0);
/// let plan = plan(&spec, None).unwrap();
/// assert_eq!((plan.config.block_m, plan.config.block_n), (128, 64));
/// let env = TileEnv::new(0, 0, 256, 256, &ParamValues::none());
/// assert_eq!(key_tile_classes(&plan, &env, 0, 256, 256), [Partial, Partial, Empty, Empty]);
/// assert_eq!(key_tile_classes(&plan, &env, 1, 256, 256), [Full, Full, Partial, Partial]);
/// ```
pub fn key_tile_classes(
    plan: &KernelPlan,
    env: &TileEnv,
    query_tile: usize,
    seq_q: usize,
    seq_k: usize,
) -> Vec<TileClass> {
    let (bm, bn) = (plan.config.block_m as usize, plan.config.block_n as usize);
    let q0 = query_tile * bm;
    assert!(
        q0 < seq_q,
        "query tile {query_tile} starts at {q0}, past seq_q {seq_q}"
    );
    let q1 = (q0 + bm).min(seq_q) - 1;
    (0..plan.key_tiles(seq_k))
        .map(|j| {
            let k0 = j * bn;
            let k1 = (k0 + bn).min(seq_k) - 1;
            match &plan.mask {
                None => TileClass::Full,
                Some(m) => classify(
                    m, &plan.spec, env, q0 as i64, q1 as i64, k0 as i64, k1 as i64,
                ),
            }
        })
        .collect()
}

/// A conservative interval of the other index that can be visible with some index of `[a0, a1]`:
/// with `transposed == false`, the keys some query of `[a0, a1]` may see (the kernels'
/// `key_hull`); with `true`, the queries that may see some key of `[a0, a1]` (the backward's
/// `query_hull`). The Rust statement of what `emit` writes into those hooks, tested against
/// brute force: an atom with a nonzero coefficient on the bounded index bounds it at the loosest
/// end of the given range, `and` intersects, `or` takes the hull of the union, anything else is
/// unbounded (±2⁴⁰).
pub fn hull(mask: &MaskPlan, env: &TileEnv, a0: i64, a1: i64, transposed: bool) -> (i64, i64) {
    node_hull(&mask.tree, &mask.atoms, env, (a0, a1), transposed)
}

const HULL_NEG: i64 = -(1 << 40);
const HULL_POS: i64 = 1 << 40;

fn node_hull(
    t: &MaskTree,
    atoms: &[AffineAtom],
    env: &TileEnv,
    (a0, a1): (i64, i64),
    transposed: bool,
) -> (i64, i64) {
    match t {
        MaskTree::Const(false) => (HULL_POS, HULL_NEG),
        MaskTree::Atom(i) => {
            let a = &atoms[*i];
            // `cg`: the given index's coefficient; `cb`: the bounded index's.
            let (cg, cb) = if transposed {
                (a.ck, a.cq)
            } else {
                (a.cq, a.ck)
            };
            if cb == 0 {
                return (HULL_NEG, HULL_POS);
            }
            let g0 = env.offset(&a.offset) as i64;
            let (at_min, at_max) = if cg >= 0 { (a0, a1) } else { (a1, a0) };
            let (gmin, gmax) = (cg * at_min + g0, cg * at_max + g0);
            let c = cb.abs();
            let (upper, lower) = if cb > 0 {
                (fdiv(-gmin, c), cdiv(-gmax, c))
            } else {
                (fdiv(gmax, c), cdiv(gmin, c))
            };
            let bounds_upper = matches!(
                (a.op, cb > 0),
                (CmpOp::Lt | CmpOp::Le | CmpOp::Eq, true)
                    | (CmpOp::Gt | CmpOp::Ge | CmpOp::Eq, false)
            );
            let bounds_lower = matches!(
                (a.op, cb > 0),
                (CmpOp::Gt | CmpOp::Ge | CmpOp::Eq, true)
                    | (CmpOp::Lt | CmpOp::Le | CmpOp::Eq, false)
            );
            (
                if bounds_lower { lower } else { HULL_NEG },
                if bounds_upper { upper } else { HULL_POS },
            )
        }
        MaskTree::And(xs) | MaskTree::Or(xs) => {
            let and = matches!(t, MaskTree::And(_));
            let kids = xs
                .iter()
                .map(|x| node_hull(x, atoms, env, (a0, a1), transposed));
            if and {
                kids.fold((HULL_NEG, HULL_POS), |(l, h), (a, b)| (l.max(a), h.min(b)))
            } else {
                kids.fold((HULL_POS, HULL_NEG), |(l, h), (a, b)| (l.min(a), h.max(b)))
            }
        }
        _ => (HULL_NEG, HULL_POS),
    }
}

/// Floor and ceiling of `a / b` for `b > 0` (the prelude's `fdiv`, `cdiv`).
fn fdiv(a: i64, b: i64) -> i64 {
    a.div_euclid(b)
}
fn cdiv(a: i64, b: i64) -> i64 {
    -fdiv(-a, b)
}
