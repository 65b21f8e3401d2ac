//! The one CPU evaluator of [`Expr`] trees, in `f64` / `i64`.
//!
//! Both the float64 reference and the tiled emulation evaluate masks and score modifications
//! through this module, so a disagreement between them can only come from the tiling (tile
//! classification, online softmax), never from two readings of the expression language.
//!
//! Semantics, matching the generated kernel:
//! - `/` is a float division (validation has already promoted both sides with `ToFloat`);
//! - `%` is the truncating integer remainder (C's `%`); a remainder by zero yields 0, as the
//!   kernels' `flash::irem` does;
//! - integers are exact: validation bounds every integer node (see
//!   [`crate::validate::arith`]), the kernels compute in 64 bits where `int` could overflow,
//!   and the evaluator's wrapping operations only keep a hand-built tree from panicking;
//! - `&&`, `||` and `if` evaluate only the side they need;
//! - an index into a `Fixed(n)` dimension is clamped into `[0, n-1]`; an index into a `Batch`,
//!   `Heads` or `Seq` dimension must be in range, and the evaluator panics with the tensor's name
//!   when a test hands it a tensor that is too small.

use crate::spec::{BinOp, Dim, Expr, Func, ParamKind, UnOp, Var, VariantSpec};

/// Runtime value of one declared parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    /// Value of an `i32` scalar (held widened; the kernel sees it as `int`).
    Int(i64),
    /// Value of an `f32` scalar (held widened; the kernel sees it as `float`).
    Float(f64),
    /// Row-major contiguous elements of an `i32` tensor, shape from [`tensor_shape`].
    IntTensor(Vec<i64>),
    /// Row-major contiguous elements of an `f32` tensor, shape from [`tensor_shape`].
    FloatTensor(Vec<f64>),
}

/// Runtime values of all parameters of a variant, in declaration order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParamValues(pub Vec<ParamValue>);

impl ParamValues {
    /// Values in declaration order, one per entry of `VariantSpec::params`.
    pub fn new(values: Vec<ParamValue>) -> Self {
        ParamValues(values)
    }
    /// No parameters (a variant that declares none).
    pub fn none() -> Self {
        ParamValues(Vec::new())
    }
}

/// Sizes of one launch that tensor dimensions resolve against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Batch size: the extent of a `Batch` dimension.
    pub batch: usize,
    /// Query heads: a `Heads` dimension is indexed by the query head `h`.
    pub heads: usize,
    /// Query positions (`seq_q` in expressions).
    pub seq_q: usize,
    /// Key positions (`seq_k` in expressions).
    pub seq_k: usize,
}

/// Runtime shape of a tensor parameter: `Batch` → batch, `Heads` → query heads, `Seq` →
/// `max(seq_q, seq_k)` (the same tensor may be indexed by `q` and by `k`), `Fixed(n)` → n.
pub fn tensor_shape(dims: &[Dim], sizes: Sizes) -> Vec<usize> {
    dims.iter()
        .map(|d| match d {
            Dim::Batch => sizes.batch,
            Dim::Heads => sizes.heads,
            Dim::Seq => sizes.seq_q.max(sizes.seq_k),
            Dim::Fixed(n) => *n as usize,
            Dim::SeqBlocks(n) => sizes.seq_q.max(sizes.seq_k).div_ceil(*n as usize),
        })
        .collect()
}

/// Value of an expression node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// Result of an integer expression, computed here in `i64`.
    Int(i64),
    /// Result of a float expression (`float` in the kernel, evaluated here in `f64`).
    Float(f64),
    /// Result of a boolean expression (a mask, a comparison).
    Bool(bool),
}

impl Value {
    /// As a float (ints are promoted, as `ToFloat` would).
    pub fn as_f64(self) -> f64 {
        match self {
            Value::Int(i) => i as f64,
            Value::Float(f) => f,
            Value::Bool(b) => panic!("expected a number, got the boolean {b}"),
        }
    }
    /// As an integer; panics on a float or a bool (validation rules that out for a valid spec).
    pub fn as_i64(self) -> i64 {
        match self {
            Value::Int(i) => i,
            other => panic!("expected an integer, got {other:?}"),
        }
    }
    /// As a boolean; panics on a number (validation rules that out for a valid spec).
    pub fn as_bool(self) -> bool {
        match self {
            Value::Bool(b) => b,
            other => panic!("expected a boolean, got {other:?}"),
        }
    }
}

/// Everything constant over one launch: the variant, its parameter values, the sizes.
///
/// Evaluating the mask and score of a sliding-window variant at single points:
///
/// ```
/// use flash_dsl::eval::{Env, ParamValue, ParamValues, Point, Sizes};
///
/// let spec = flash_dsl::parse::parse_str(
///     "Window { head_dim: 64, dtype: bf16, params: { w: i32 },
///               mask: causal && q - k < w, score: s * 2.0 }",
/// )
/// .unwrap()
/// .remove(0);
/// let params = ParamValues::new(vec![ParamValue::Int(4)]);
/// let sizes = Sizes { batch: 1, heads: 1, seq_q: 16, seq_k: 16 };
/// let env = Env::new(&spec, &params, sizes);
///
/// let at = |q, k| Point { b: 0, h: 0, q, k, s: 0.25 };
/// assert!(env.mask(&at(10, 7))); // inside the window
/// assert!(!env.mask(&at(10, 6))); // q - k == w: outside
/// assert!(!env.mask(&at(3, 5))); // a future key: causal
/// assert_eq!(env.score(&at(10, 7)), 0.5);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Env<'a> {
    /// The variant whose expressions are evaluated.
    pub spec: &'a VariantSpec,
    /// One value per parameter of `spec`, in declaration order.
    pub params: &'a ParamValues,
    /// Launch sizes: the extents of tensor dimensions and the values of `seq_q` / `seq_k`.
    pub sizes: Sizes,
}

/// The element being evaluated: batch, query head, query and key position, and the score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Batch index `b`, in `0..batch`.
    pub b: i64,
    /// Query head index `h`, in `0..heads`.
    pub h: i64,
    /// Query position `q`, in `0..seq_q`.
    pub q: i64,
    /// Key position `k`, in `0..seq_k`.
    pub k: i64,
    /// The scaled score `scale * q·k`; only read by score expressions.
    pub s: f64,
}

impl<'a> Env<'a> {
    /// Bundles a launch's constants; panics unless `params` holds exactly one value per
    /// declared parameter.
    pub fn new(spec: &'a VariantSpec, params: &'a ParamValues, sizes: Sizes) -> Self {
        assert_eq!(
            params.0.len(),
            spec.params.len(),
            "variant `{}` declares {} params but {} values were given",
            spec.name,
            spec.params.len(),
            params.0.len()
        );
        Env {
            spec,
            params,
            sizes,
        }
    }

    /// Evaluates the mask at `p`; `None` (no mask) is true. A declared sparsity layout is ANDed
    /// in: the key's block must be listed for the query's block.
    pub fn mask(&self, p: &Point) -> bool {
        let m = match &self.spec.mask {
            Some(m) => self.eval(m, p).as_bool(),
            None => true,
        };
        m && self.sparsity_allows(p)
    }

    /// Whether the sparsity layout (if any) lists the key block of `p` for its query block.
    pub fn sparsity_allows(&self, p: &Point) -> bool {
        let Some(sp) = &self.spec.sparsity else {
            return true;
        };
        let ParamValue::IntTensor(t) = &self.params.0[sp.param] else {
            panic!("the sparsity layout must be an integer tensor")
        };
        let n = sp.block as i64;
        let blocks = self
            .sizes
            .seq_q
            .max(self.sizes.seq_k)
            .div_ceil(sp.block as usize);
        let mut row = (p.q / n) as usize;
        if sp.per_batch {
            row += p.b as usize * self.sizes.heads.pow(sp.per_head as u32) * blocks;
        }
        if sp.per_head {
            row += p.h as usize * blocks;
        }
        let k = sp.slots as usize;
        t[row * k..(row + 1) * k].contains(&(p.k / n))
    }

    /// Applies the score modification to `p.s`; `None` is the identity.
    pub fn score(&self, p: &Point) -> f64 {
        match &self.spec.score {
            Some(e) => self.eval(e, p).as_f64(),
            None => p.s,
        }
    }

    /// Evaluates `e` at `p`.
    pub fn eval(&self, e: &Expr, p: &Point) -> Value {
        match e {
            Expr::Int(i) => Value::Int(*i),
            Expr::Float(f) => Value::Float(f.get()),
            Expr::Bool(b) => Value::Bool(*b),
            Expr::Var(v) => match v {
                Var::B => Value::Int(p.b),
                Var::H => Value::Int(p.h),
                Var::Q => Value::Int(p.q),
                Var::K => Value::Int(p.k),
                Var::S => Value::Float(p.s),
                Var::SeqQ => Value::Int(self.sizes.seq_q as i64),
                Var::SeqK => Value::Int(self.sizes.seq_k as i64),
            },
            Expr::Scalar(i) => match &self.params.0[*i] {
                ParamValue::Int(v) => Value::Int(*v),
                ParamValue::Float(v) => Value::Float(*v),
                other => panic!(
                    "param `{}` is a scalar but was given {other:?}",
                    self.spec.params[*i].name
                ),
            },
            Expr::Index(i, idx) => self.index(*i, idx, p),
            Expr::ToFloat(a) => Value::Float(self.eval(a, p).as_f64()),
            Expr::Unary(UnOp::Not, a) => Value::Bool(!self.eval(a, p).as_bool()),
            Expr::Unary(UnOp::Neg, a) => match self.eval(a, p) {
                Value::Int(i) => Value::Int(i.wrapping_neg()),
                v => Value::Float(-v.as_f64()),
            },
            Expr::Binary(op, a, b) => self.binary(*op, a, b, p),
            Expr::Call(f, args) => self.call(*f, args, p),
            Expr::Select(c, a, b) => {
                if self.eval(c, p).as_bool() {
                    self.eval(a, p)
                } else {
                    self.eval(b, p)
                }
            }
        }
    }

    fn binary(&self, op: BinOp, a: &Expr, b: &Expr, p: &Point) -> Value {
        match op {
            BinOp::And => {
                return Value::Bool(self.eval(a, p).as_bool() && self.eval(b, p).as_bool())
            }
            BinOp::Or => {
                return Value::Bool(self.eval(a, p).as_bool() || self.eval(b, p).as_bool())
            }
            _ => {}
        }
        let (x, y) = (self.eval(a, p), self.eval(b, p));
        match op {
            BinOp::Div => Value::Float(x.as_f64() / y.as_f64()),
            BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Rem => match (x, y) {
                (Value::Int(x), Value::Int(y)) => Value::Int(match op {
                    BinOp::Add => x.wrapping_add(y),
                    BinOp::Sub => x.wrapping_sub(y),
                    BinOp::Mul => x.wrapping_mul(y),
                    _ => x.checked_rem(y).unwrap_or(0),
                }),
                _ => {
                    let (x, y) = (x.as_f64(), y.as_f64());
                    Value::Float(match op {
                        BinOp::Add => x + y,
                        BinOp::Sub => x - y,
                        BinOp::Mul => x * y,
                        _ => x % y,
                    })
                }
            },
            _ => {
                let ord = match (x, y) {
                    (Value::Int(x), Value::Int(y)) => Some(x.cmp(&y)),
                    (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(&y)),
                    _ => x.as_f64().partial_cmp(&y.as_f64()),
                };
                use std::cmp::Ordering::*;
                Value::Bool(match (op, ord) {
                    // Any comparison with NaN is false except `!=`, as in C.
                    (BinOp::Ne, None) => true,
                    (_, None) => false,
                    (BinOp::Lt, Some(o)) => o == Less,
                    (BinOp::Le, Some(o)) => o != Greater,
                    (BinOp::Gt, Some(o)) => o == Greater,
                    (BinOp::Ge, Some(o)) => o != Less,
                    (BinOp::Eq, Some(o)) => o == Equal,
                    (BinOp::Ne, Some(o)) => o != Equal,
                    _ => unreachable!("{op:?} is not a comparison"),
                })
            }
        }
    }

    fn call(&self, f: Func, args: &[Expr], p: &Point) -> Value {
        let vals: Vec<Value> = args.iter().map(|a| self.eval(a, p)).collect();
        match f {
            Func::Min | Func::Max => match (vals[0], vals[1]) {
                (Value::Int(x), Value::Int(y)) => {
                    Value::Int(if f == Func::Min { x.min(y) } else { x.max(y) })
                }
                (x, y) => {
                    let (x, y) = (x.as_f64(), y.as_f64());
                    Value::Float(if f == Func::Min { x.min(y) } else { x.max(y) })
                }
            },
            Func::Abs => match vals[0] {
                Value::Int(x) => Value::Int(x.wrapping_abs()),
                x => Value::Float(x.as_f64().abs()),
            },
            _ => {
                let x = vals[0].as_f64();
                Value::Float(match f {
                    Func::Exp => x.exp(),
                    Func::Log => x.ln(),
                    Func::Tanh => x.tanh(),
                    Func::Sigmoid => 1.0 / (1.0 + (-x).exp()),
                    Func::Sqrt => x.sqrt(),
                    _ => unreachable!(),
                })
            }
        }
    }

    fn index(&self, param: usize, idx: &[Expr], p: &Point) -> Value {
        let decl = &self.spec.params[param];
        let ParamKind::Tensor { dims, .. } = &decl.kind else {
            panic!("param `{}` is indexed but is not a tensor", decl.name)
        };
        assert_eq!(
            dims.len(),
            idx.len(),
            "tensor `{}` has {} dims but is indexed with {}",
            decl.name,
            dims.len(),
            idx.len()
        );
        let shape = tensor_shape(dims, self.sizes);
        let mut flat = 0usize;
        for (axis, ((dim, &size), e)) in dims.iter().zip(&shape).zip(idx).enumerate() {
            let i = self.eval(e, p).as_i64();
            let i = match dim {
                Dim::Fixed(n) => i.clamp(0, *n as i64 - 1),
                _ => {
                    assert!(
                        i >= 0 && (i as usize) < size,
                        "index {i} out of bounds for dim {axis} ({dim:?}, size {size}) of tensor `{}`",
                        decl.name
                    );
                    i
                }
            };
            flat = flat * size + i as usize;
        }
        let len = match &self.params.0[param] {
            ParamValue::IntTensor(v) => v.len(),
            ParamValue::FloatTensor(v) => v.len(),
            other => panic!("param `{}` is a tensor but was given {other:?}", decl.name),
        };
        assert!(
            flat < len,
            "tensor `{}` of shape {shape:?} needs {} elements but was given {len}",
            decl.name,
            shape.iter().product::<usize>()
        );
        match &self.params.0[param] {
            ParamValue::IntTensor(v) => Value::Int(v[flat]),
            ParamValue::FloatTensor(v) => Value::Float(v[flat]),
            _ => unreachable!(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{DType, ParamDecl, ScalarTy};

    fn spec(params: Vec<ParamDecl>) -> VariantSpec {
        VariantSpec {
            name: "T".into(),
            doc: String::new(),
            head_dim_qk: 64,
            head_dim_v: 64,
            dtype: DType::Bf16,
            scale: None,
            params,
            mask: None,
            score: None,
            dropout: None,
            sparsity: None,
            fp8: None,
        }
    }

    fn pt(q: i64, k: i64) -> Point {
        Point {
            b: 0,
            h: 1,
            q,
            k,
            s: 0.5,
        }
    }

    const SIZES: Sizes = Sizes {
        batch: 1,
        heads: 2,
        seq_q: 4,
        seq_k: 6,
    };

    #[test]
    fn fixed_dims_clamp_and_rows_are_row_major() {
        let s = spec(vec![ParamDecl {
            name: "bias".into(),
            frozen: false,
            kind: ParamKind::Tensor {
                elem: ScalarTy::F32,
                dims: vec![Dim::Heads, Dim::Fixed(3)],
            },
        }]);
        let vals = ParamValues(vec![ParamValue::FloatTensor(
            (0..6).map(|x| x as f64).collect(),
        )]);
        let env = Env::new(&s, &vals, SIZES);
        let e = Expr::Index(
            0,
            vec![
                Expr::Var(Var::H),
                Expr::bin(BinOp::Sub, Expr::Var(Var::Q), Expr::Var(Var::K)),
            ],
        );
        assert_eq!(env.eval(&e, &pt(1, 0)), Value::Float(4.0));
        assert_eq!(env.eval(&e, &pt(0, 5)), Value::Float(3.0));
        assert_eq!(env.eval(&e, &pt(5, 0)), Value::Float(5.0));
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn seq_dims_are_bounds_checked() {
        let s = spec(vec![ParamDecl {
            name: "doc".into(),
            frozen: false,
            kind: ParamKind::Tensor {
                elem: ScalarTy::I32,
                dims: vec![Dim::Seq],
            },
        }]);
        let vals = ParamValues(vec![ParamValue::IntTensor(vec![0; 6])]);
        let env = Env::new(&s, &vals, SIZES);
        let e = Expr::Index(
            0,
            vec![Expr::bin(BinOp::Add, Expr::Var(Var::K), Expr::Int(1))],
        );
        env.eval(&e, &pt(0, 5));
    }

    #[test]
    #[should_panic(expected = "needs 6 elements")]
    fn short_tensors_are_reported() {
        let s = spec(vec![ParamDecl {
            name: "doc".into(),
            frozen: false,
            kind: ParamKind::Tensor {
                elem: ScalarTy::I32,
                dims: vec![Dim::Seq],
            },
        }]);
        let vals = ParamValues(vec![ParamValue::IntTensor(vec![0; 3])]);
        let env = Env::new(&s, &vals, SIZES);
        env.eval(&Expr::Index(0, vec![Expr::Var(Var::K)]), &pt(0, 5));
    }

    #[test]
    fn arithmetic_follows_the_language() {
        let s = spec(vec![]);
        let vals = ParamValues::none();
        let env = Env::new(&s, &vals, SIZES);
        let div = Expr::bin(BinOp::Div, Expr::Int(7), Expr::Int(2));
        assert_eq!(env.eval(&div, &pt(0, 0)), Value::Float(3.5));
        let rem = Expr::bin(BinOp::Rem, Expr::Int(-7), Expr::Int(2));
        assert_eq!(env.eval(&rem, &pt(0, 0)), Value::Int(-1));
        let causal = Expr::bin(
            BinOp::Le,
            Expr::Var(Var::K),
            Expr::bin(
                BinOp::Add,
                Expr::Var(Var::Q),
                Expr::bin(BinOp::Sub, Expr::Var(Var::SeqK), Expr::Var(Var::SeqQ)),
            ),
        );
        assert!(env.eval(&causal, &pt(0, 2)).as_bool());
        assert!(!env.eval(&causal, &pt(0, 3)).as_bool());
        let sig = Expr::Call(Func::Sigmoid, vec![Expr::Var(Var::S)]);
        let v = env.eval(&sig, &pt(0, 0)).as_f64();
        assert!((v - 1.0 / (1.0 + (-0.5f64).exp())).abs() < 1e-15);
    }
}
