//! Constant folding of validated expressions (used to check `scale`, an always-false `mask`
//! and `window` sizes).

use crate::spec::{BinOp, Expr, Func, UnOp};

/// Whether `e` reads no variable or parameter.
pub(super) fn is_constant(e: &Expr) -> bool {
    let mut c = true;
    e.visit(&mut |n| c &= !matches!(n, Expr::Var(_) | Expr::Scalar(_) | Expr::Index(..)));
    c
}

/// The value of a constant expression.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Const {
    /// An integer constant (folded with checked arithmetic: an overflow does not fold).
    Int(i64),
    /// A float constant.
    Float(f64),
    /// A boolean constant.
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
