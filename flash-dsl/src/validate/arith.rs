//! One integer arithmetic for the host and the device.
//!
//! The CPU evaluator ([`crate::eval`]) and the host tile classification compute integers in
//! 64 bits (or wider); the kernels compute them in CUDA's 32-bit `int` where that is exact. For
//! the two to agree, no integer may ever wrap on either side. The model:
//!
//! - **Inputs are bounded.** Every launch checks its extents against [`MAX_BATCH`],
//!   [`MAX_HEADS`] and [`MAX_SEQ`] (see `flash_runtime`'s launch checks), so `b`, `h`, `seq_q`,
//!   `seq_k` are bounded, and `q`, `k` too (the kernels also evaluate a tile's overhang past the
//!   last position, up to [`POSITION_SLACK`]). Integer parameters and elements of `i32`
//!   tensors are any `i32`; integer literals must be `i32` (validation).
//! - **Each integer node gets an interval** ([`int_range`]), by interval arithmetic over
//!   those bounds. A node whose interval and operands' intervals lie in `i32` is computed in
//!   `int` on the device; any other is computed in `long long` ([`needs_wide`]); an interval
//!   beyond ±2⁶² ([`MAX_WIDE`]) is a validation error with a span, so 64 bits never wrap either
//!   (and sums of two such values, as the tile classification forms, still fit).
//! - **Remainder by zero is 0** on both sides (`x % 0 == 0`, and `i32::MIN % -1 == 0`, which C
//!   leaves undefined): the kernels call `flash::irem`/`flash::lrem` unless the divisor is a
//!   constant other than 0 and -1. A constant zero divisor of `%` or `/` is a validation
//!   error. `/` is a float division (IEEE: `x / 0.0` is ±inf or NaN on both sides).
//! - **Tensor lookups** clamp every index into its dimension and compute the flat offset in 64
//!   bits when the tensor's largest possible element count ([`max_elements`]) exceeds
//!   `i32::MAX`.
//!
//! The hot paths stay 32-bit: `causal`, windows, `q - k`, document masks (`doc[q] == doc[k]`)
//! and relative biases all fit `i32` under these bounds.

use crate::spec::{BinOp, Dim, Expr, Func, ParamDecl, ParamKind, Ty, UnOp, Var};

/// Largest `batch` of a launch (the grid's third dimension).
pub const MAX_BATCH: i64 = 65535;
/// Largest number of query (and key/value) heads of a launch (the grid's second dimension).
pub const MAX_HEADS: i64 = 65535;
/// Largest `seq_q` and `seq_k` of a launch: 2²⁹, so that `q + (seq_k - seq_q)` (`causal`)
/// and other sums of two positions stay in `int`.
pub const MAX_SEQ: i64 = 1 << 29;
/// How far past the last position a kernel may evaluate an expression (a tile's overhang).
pub const POSITION_SLACK: i64 = 1024;
/// Largest magnitude an integer expression may reach (computed in 64 bits beyond `i32`).
pub const MAX_WIDE: i128 = 1 << 62;

/// The values an integer expression can take, inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntRange {
    /// Smallest possible value.
    pub lo: i128,
    /// Largest possible value.
    pub hi: i128,
}

/// Saturation bound of the interval arithmetic itself (far beyond [`MAX_WIDE`], so a
/// saturated bound is always reported).
const SAT: i128 = 1 << 100;

impl IntRange {
    fn new(lo: i128, hi: i128) -> Self {
        IntRange {
            lo: lo.clamp(-SAT, SAT),
            hi: hi.clamp(-SAT, SAT),
        }
    }
    fn point(v: i128) -> Self {
        IntRange::new(v, v)
    }
    fn i32() -> Self {
        IntRange::new(i32::MIN as i128, i32::MAX as i128)
    }
    /// Whether every value is an `i32`.
    pub fn fits_i32(self) -> bool {
        self.lo >= i32::MIN as i128 && self.hi <= i32::MAX as i128
    }
    /// Whether every value is within ±[`MAX_WIDE`].
    pub fn fits_wide(self) -> bool {
        self.lo >= -MAX_WIDE && self.hi <= MAX_WIDE
    }
    fn union(self, o: Self) -> Self {
        IntRange::new(self.lo.min(o.lo), self.hi.max(o.hi))
    }
    fn neg(self) -> Self {
        IntRange::new(-self.hi, -self.lo)
    }
    fn add(self, o: Self) -> Self {
        IntRange::new(self.lo + o.lo, self.hi + o.hi)
    }
    fn mul(self, o: Self) -> Self {
        // Operands are saturated at 2^100, so products fit i128 after clamping them to 2^63.
        let c = |v: i128| v.clamp(-(1 << 63), 1 << 63);
        let p = [
            c(self.lo) * c(o.lo),
            c(self.lo) * c(o.hi),
            c(self.hi) * c(o.lo),
            c(self.hi) * c(o.hi),
        ];
        IntRange::new(*p.iter().min().unwrap(), *p.iter().max().unwrap())
    }
    /// `x % y` with C's truncating remainder and `x % 0 == 0`: the sign of `x`, magnitude
    /// below the largest `|y|` and at most `|x|`.
    fn rem(self, y: Self) -> Self {
        let m = y.lo.abs().max(y.hi.abs()) - 1;
        let m = m.max(0);
        let lo = if self.lo < 0 { self.lo.max(-m) } else { 0 };
        let hi = if self.hi > 0 { self.hi.min(m) } else { 0 };
        IntRange::new(lo, hi)
    }
    fn abs(self) -> Self {
        if self.lo >= 0 {
            self
        } else if self.hi <= 0 {
            self.neg()
        } else {
            IntRange::new(0, (-self.lo).max(self.hi))
        }
    }
}

/// The interval of the integer expression `e` (see the module docs for the input bounds; every
/// parameter and tensor element of integer type is an `i32`). Non-integer nodes have no
/// interval of their own; calling this on one gives the `i32` range.
pub fn int_range(e: &Expr) -> IntRange {
    let r = int_range;
    match e {
        Expr::Int(v) => IntRange::point(*v as i128),
        Expr::Var(Var::B) => IntRange::new(0, MAX_BATCH as i128 - 1),
        Expr::Var(Var::H) => IntRange::new(0, MAX_HEADS as i128 - 1),
        Expr::Var(Var::Q | Var::K) => IntRange::new(0, (MAX_SEQ + POSITION_SLACK) as i128 - 1),
        Expr::Var(Var::SeqQ | Var::SeqK) => IntRange::new(0, MAX_SEQ as i128),
        Expr::Unary(UnOp::Neg, a) => r(a).neg(),
        Expr::Binary(op, a, b) => match op {
            BinOp::Add => r(a).add(r(b)),
            BinOp::Sub => r(a).add(r(b).neg()),
            BinOp::Mul => r(a).mul(r(b)),
            BinOp::Rem => r(a).rem(r(b)),
            _ => IntRange::i32(),
        },
        Expr::Call(Func::Abs, xs) => r(&xs[0]).abs(),
        Expr::Call(f @ (Func::Min | Func::Max), xs) => {
            let (x, y) = (r(&xs[0]), r(&xs[1]));
            if *f == Func::Min {
                IntRange::new(x.lo.min(y.lo), x.hi.min(y.hi))
            } else {
                IntRange::new(x.lo.max(y.lo), x.hi.max(y.hi))
            }
        }
        Expr::Select(_, a, b) => r(a).union(r(b)),
        // Parameters, tensor elements and anything not an integer.
        _ => IntRange::i32(),
    }
}

/// Whether the integer node `e` must be computed in 64 bits: its value or one of its integer
/// operands may leave `i32`. (Leaves never need it: literals, variables and parameters are
/// `i32`.)
pub fn needs_wide(e: &Expr, params: &[ParamDecl]) -> bool {
    let wide = |x: &Expr| !int_range(x).fits_i32();
    let arith = matches!(
        e,
        Expr::Unary(UnOp::Neg, _)
            | Expr::Binary(BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Rem, ..)
            | Expr::Call(Func::Abs | Func::Min | Func::Max, _)
    );
    if !arith || e.ty(params) != Ty::Int {
        return false;
    }
    match e {
        Expr::Unary(_, a) => wide(e) || wide(a),
        Expr::Binary(_, a, b) => wide(e) || wide(a) || wide(b),
        Expr::Call(_, xs) => wide(e) || xs.iter().any(wide),
        _ => false,
    }
}

/// The largest element count a tensor parameter can have at a launch within the limits,
/// saturating at `u64::MAX`.
pub fn max_elements(dims: &[Dim]) -> u64 {
    dims.iter()
        .map(|d| match d {
            Dim::Batch => MAX_BATCH as u64,
            Dim::Heads => MAX_HEADS as u64,
            Dim::Seq => MAX_SEQ as u64,
            Dim::Fixed(n) => *n as u64,
            Dim::SeqBlocks(n) => (MAX_SEQ as u64).div_ceil(*n as u64),
        })
        .fold(1u64, u64::saturating_mul)
}

/// Whether lookups into parameter `p` compute their flat offset in 64 bits.
pub fn wide_index(p: &ParamDecl) -> bool {
    match &p.kind {
        ParamKind::Tensor { dims, .. } => max_elements(dims) > i32::MAX as u64,
        ParamKind::Scalar(_) => false,
    }
}
