//! What the shorthands lower to (`causal`, `window`, `softcap`, `clamp`, `alibi`), and the
//! int-to-float promotion every typed operation goes through. The arguments here are already
//! type-checked; the checks and their messages live in `expr`.

use crate::spec::{BinOp, Expr, Func, Ty, Var};

/// A lowered expression and its type.
pub(super) type Typed = (Expr, Ty);

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

/// `window(n)` → `causal && (q + seq_k - seq_q) - k < n`.
pub(super) fn window(n: Expr) -> Expr {
    let dist = Expr::bin(BinOp::Sub, aligned_q(), Expr::Var(Var::K));
    Expr::bin(BinOp::And, causal_expr(), Expr::bin(BinOp::Lt, dist, n))
}

/// `softcap(x, cap)` → `cap * tanh(x / cap)`, in float.
pub(super) fn softcap(x: Typed, cap: Typed) -> Typed {
    let inner = Expr::bin(BinOp::Div, to_float(x), to_float(cap.clone()));
    let e = Expr::bin(
        BinOp::Mul,
        to_float(cap),
        Expr::Call(Func::Tanh, vec![inner]),
    );
    (e, Ty::Float)
}

/// `clamp(x, lo, hi)` → `min(max(x, lo), hi)`, all three in one type.
pub(super) fn clamp(x: Typed, lo: Typed, hi: Typed) -> Typed {
    let t = if [x.1, lo.1, hi.1].contains(&Ty::Float) {
        Ty::Float
    } else {
        Ty::Int
    };
    let conv = |v: Typed| if t == Ty::Float { to_float(v) } else { v.0 };
    let max = Expr::Call(Func::Max, vec![conv(x), conv(lo)]);
    (Expr::Call(Func::Min, vec![max, conv(hi)]), t)
}

/// `alibi(slope)` → `slope * float(k - (q + seq_k - seq_q))`.
pub(super) fn alibi(slope: Typed) -> Typed {
    let dist = Expr::bin(BinOp::Sub, Expr::Var(Var::K), aligned_q());
    let e = Expr::bin(BinOp::Mul, to_float(slope), Expr::ToFloat(Box::new(dist)));
    (e, Ty::Float)
}

/// A number as a float: int literals become float literals, other ints get `ToFloat`.
pub(super) fn to_float((e, ty): Typed) -> Expr {
    match ty {
        Ty::Int => match e {
            Expr::Int(v) => Expr::float(v as f64),
            e => Expr::ToFloat(Box::new(e)),
        },
        _ => e,
    }
}

/// Bring two numbers to a common type: an int meeting a float becomes a float.
pub(super) fn promote(a: Typed, b: Typed) -> (Expr, Expr, Ty) {
    if a.1 == b.1 {
        (a.0, b.0, a.1)
    } else {
        (to_float(a), to_float(b), Ty::Float)
    }
}
