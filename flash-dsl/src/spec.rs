//! The validated, span-free description of one attention variant.
//!
//! `VariantSpec` is what every later stage consumes: the planner, the CUDA emitter, the float64
//! reference and the tiled emulation. It carries no `proc_macro2::Span` so it can be hashed,
//! serialised and snapshot-tested; diagnostics are produced before it exists (see `validate`).
//!
//! Shorthands of the language (`causal`, `softcap(..)`, `alibi(..)`, …) are lowered into plain
//! [`Expr`] trees during validation, so no later stage has to know they exist.

use serde::{Deserialize, Serialize};

/// Element type of Q, K, V and O. fp8 with block scales is a later addition; the enum is the
/// place it goes, and every `match` on it will then say what still needs doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    /// IEEE 754 half precision (`__half`): 10 mantissa bits, range ±65504.
    F16,
    /// bfloat16 (`__nv_bfloat16`): 7 mantissa bits, the exponent range of `f32`.
    Bf16,
}

impl DType {
    /// Name used in the DSL and in generated kernel names.
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        2
    }
    /// `x` rounded to the nearest value of this type (ties to even), as the raw bits a device
    /// buffer holds.
    pub fn to_bits(self, x: f64) -> u16 {
        // `half`'s f64 conversions drop the low 32 mantissa bits before rounding, so a value
        // that is exact in f32 takes the f32 path, which rounds on all of its bits.
        let narrow = x as f32;
        match (self, narrow as f64 == x) {
            (DType::Bf16, true) => half::bf16::from_f32(narrow).to_bits(),
            (DType::Bf16, false) => half::bf16::from_f64(x).to_bits(),
            (DType::F16, true) => half::f16::from_f32(narrow).to_bits(),
            (DType::F16, false) => half::f16::from_f64(x).to_bits(),
        }
    }
    /// The value raw bits of this type hold (exact).
    pub fn from_bits(self, bits: u16) -> f64 {
        match self {
            DType::Bf16 => half::bf16::from_bits(bits).to_f64(),
            DType::F16 => half::f16::from_bits(bits).to_f64(),
        }
    }
}

/// Element type of a user parameter (scalar or tensor element).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScalarTy {
    /// 32-bit signed integer (`int` in the kernel); an [`Ty::Int`] in expressions.
    I32,
    /// 32-bit float (`float` in the kernel); a [`Ty::Float`] in expressions.
    F32,
}

impl ScalarTy {
    /// Name used in the DSL (`i32`, `f32`).
    pub fn name(self) -> &'static str {
        match self {
            ScalarTy::I32 => "i32",
            ScalarTy::F32 => "f32",
        }
    }
    /// The expression type a value of this element type has inside mask/score expressions.
    pub fn ty(self) -> Ty {
        match self {
            ScalarTy::I32 => Ty::Int,
            ScalarTy::F32 => Ty::Float,
        }
    }
}

/// One dimension of a tensor parameter. `Batch`, `Heads` and `Seq` are sized at launch and may
/// only be indexed by the matching index variable (`b`, `h`, `q`/`k`); `Fixed(n)` is sized in the
/// declaration and takes any integer expression, clamped into `[0, n-1]` so that no index can
/// read out of bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dim {
    /// `batch`: the launch's batch size, indexed only by `b`.
    Batch,
    /// `heads`: the launch's number of query heads, indexed only by `h`.
    Heads,
    /// `seq`: `max(seq_q, seq_k)` positions, indexed only by `q` or `k`.
    Seq,
    /// A size fixed in the declaration (`8`); any integer index, clamped into `[0, n-1]`.
    Fixed(u32),
    /// `seq / N`: ⌈max(seq_q, seq_k) / N⌉ blocks of N positions (a block-sparse layout's query
    /// blocks); indexed like a fixed dimension (any integer expression, clamped).
    SeqBlocks(u32),
}

/// A declared runtime parameter. Runtime values never force a recompile: they travel in the
/// kernel's argument struct.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ParamDecl {
    /// The parameter's name in the declaration; also its field name in the argument struct.
    pub name: String,
    /// Scalar or tensor, and its element type.
    pub kind: ParamKind,
    /// The backward pass computes no gradient for this parameter (PyTorch's
    /// `requires_grad=False`: a fixed ALiBi slope, a constant cap): its terms leave the backward
    /// kernels, which then run as if it were a constant. Not declared in the language — the
    /// runtime sets it per backward call for every `f32` parameter given no gradient buffer
    /// ([`VariantSpec::with_frozen`]), so one declaration serves both uses.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub frozen: bool,
}

/// What a declared parameter is: one value, or a tensor read element-wise by expressions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ParamKind {
    /// A single value of the given type, passed by value in the argument struct.
    Scalar(ScalarTy),
    /// Row-major contiguous tensor with the given dimensions.
    Tensor {
        /// Element type (`i32` or `f32`).
        elem: ScalarTy,
        /// Dimensions, outermost first; indexed with one expression per dimension.
        dims: Vec<Dim>,
    },
}

impl ParamKind {
    /// The element type: the scalar's, or the tensor's elements'.
    pub fn elem(&self) -> ScalarTy {
        match self {
            ParamKind::Scalar(t) => *t,
            ParamKind::Tensor { elem, .. } => *elem,
        }
    }
}

/// Type of an expression node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Ty {
    /// Integer: `i64` in the evaluator; `int` in the kernel (`long long` where validation finds
    /// the value may leave `i32`).
    Int,
    /// Float: `f64` in the evaluator, `float` in the kernel.
    Float,
    /// Boolean: the result of comparisons and `&&`/`||`/`!`; the type a mask must have.
    Bool,
}

/// Built-in variables of mask and score expressions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Var {
    /// Batch index.
    B,
    /// Query head index.
    H,
    /// Query position, `0..seq_q`.
    Q,
    /// Key position, `0..seq_k`.
    K,
    /// The (scaled) score `scale * q·k`; only in `score`.
    S,
    /// Number of query positions of this launch.
    SeqQ,
    /// Number of key positions of this launch.
    SeqK,
}

impl Var {
    /// Expression type of the variable: [`Ty::Float`] for `s`, [`Ty::Int`] for the rest.
    pub fn ty(self) -> Ty {
        match self {
            Var::S => Ty::Float,
            _ => Ty::Int,
        }
    }
}

/// Unary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnOp {
    /// `-x`, on an int or a float; keeps the operand's type.
    Neg,
    /// `!x`, on a bool.
    Not,
}

/// Binary operators. Arithmetic keeps the left operand's type (validation has already made
/// both sides agree); comparisons and `&&`/`||` give a [`Ty::Bool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// Always a float division (both sides promoted), as in Python's `/`.
    Div,
    /// Integer remainder; both sides must be integers.
    Rem,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
    /// `a && b`, short-circuiting: `b` is evaluated only when `a` holds.
    And,
    /// `a || b`, short-circuiting: `b` is evaluated only when `a` does not hold.
    Or,
}

/// Built-in functions. Shorthands (`softcap`, `alibi`, `clamp`) are lowered before this point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Func {
    /// `exp(x)`, float.
    Exp,
    /// `log(x)`, natural logarithm, float.
    Log,
    /// `tanh(x)`, float.
    Tanh,
    /// `sigmoid(x) = 1 / (1 + exp(-x))`, float.
    Sigmoid,
    /// `sqrt(x)`, float.
    Sqrt,
    /// `abs(x)`; keeps the argument's type (int or float).
    Abs,
    /// `min(a, b)`; keeps the arguments' type.
    Min,
    /// `max(a, b)`; keeps the arguments' type.
    Max,
}

impl Func {
    /// Number of arguments: 2 for `min`/`max`, 1 otherwise.
    pub fn arity(self) -> usize {
        match self {
            Func::Min | Func::Max => 2,
            _ => 1,
        }
    }
    /// Name used in the DSL (`exp`, `sigmoid`, …).
    pub fn name(self) -> &'static str {
        match self {
            Func::Exp => "exp",
            Func::Log => "log",
            Func::Tanh => "tanh",
            Func::Sigmoid => "sigmoid",
            Func::Sqrt => "sqrt",
            Func::Abs => "abs",
            Func::Min => "min",
            Func::Max => "max",
        }
    }
}

/// A float literal stored by its bits so that `Expr` can derive `Eq` and `Hash` (plans are
/// hashed into cache keys; two specs that plan alike must hash alike).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct F64Bits(pub u64);

impl F64Bits {
    /// Stores `v` by its bit pattern (so `0.0` and `-0.0` differ, and a NaN equals itself).
    pub fn new(v: f64) -> Self {
        F64Bits(v.to_bits())
    }
    /// The stored value.
    pub fn get(self) -> f64 {
        f64::from_bits(self.0)
    }
}

impl std::fmt::Debug for F64Bits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.get())
    }
}

/// A typed expression tree. Every node's type is known from its shape and children (see
/// [`Expr::ty`]); validation guarantees the tree is well typed, so later stages never check.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Expr {
    /// Integer literal.
    Int(i64),
    /// Float literal.
    Float(F64Bits),
    /// Boolean literal (`true` / `false`).
    Bool(bool),
    /// A built-in variable (`q`, `k`, `s`, …).
    Var(Var),
    /// A scalar parameter, by index into `VariantSpec::params`.
    Scalar(usize),
    /// An element of a tensor parameter, by index into `VariantSpec::params`; one index
    /// expression per dimension.
    Index(usize, Vec<Expr>),
    /// Integer to float conversion, inserted by validation wherever an int meets a float.
    ToFloat(Box<Expr>),
    /// A unary operator applied to its operand.
    Unary(UnOp, Box<Expr>),
    /// A binary operator applied to its left and right operands.
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// A built-in function call; `args.len() == f.arity()`.
    Call(Func, Vec<Expr>),
    /// `if c { a } else { b }`.
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
}

impl Expr {
    /// A float literal node.
    pub fn float(v: f64) -> Expr {
        Expr::Float(F64Bits::new(v))
    }
    /// A binary node `a op b` (boxes both operands).
    pub fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::Binary(op, Box::new(a), Box::new(b))
    }

    /// Type of this (already validated) expression.
    pub fn ty(&self, params: &[ParamDecl]) -> Ty {
        match self {
            Expr::Int(_) => Ty::Int,
            Expr::Float(_) | Expr::ToFloat(_) => Ty::Float,
            Expr::Bool(_) => Ty::Bool,
            Expr::Var(v) => v.ty(),
            Expr::Scalar(i) | Expr::Index(i, _) => match &params[*i].kind {
                ParamKind::Scalar(t) => t.ty(),
                ParamKind::Tensor { elem, .. } => elem.ty(),
            },
            Expr::Unary(UnOp::Not, _) => Ty::Bool,
            Expr::Unary(UnOp::Neg, a) => a.ty(params),
            Expr::Binary(op, a, _) => match op {
                BinOp::Div => Ty::Float,
                BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Rem => a.ty(params),
                _ => Ty::Bool,
            },
            Expr::Call(f, args) => match f {
                Func::Min | Func::Max | Func::Abs => args[0].ty(params),
                _ => Ty::Float,
            },
            Expr::Select(_, a, _) => a.ty(params),
        }
    }

    /// Whether the expression mentions `var` anywhere.
    pub fn uses_var(&self, var: Var) -> bool {
        let mut found = false;
        self.visit(&mut |e| found |= matches!(e, Expr::Var(v) if *v == var));
        found
    }

    /// Pre-order walk over every node.
    pub fn visit(&self, f: &mut dyn FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Index(_, xs) | Expr::Call(_, xs) => xs.iter().for_each(|x| x.visit(f)),
            Expr::ToFloat(a) | Expr::Unary(_, a) => a.visit(f),
            Expr::Binary(_, a, b) => {
                a.visit(f);
                b.visit(f);
            }
            Expr::Select(c, a, b) => {
                c.visit(f);
                a.visit(f);
                b.visit(f);
            }
            _ => {}
        }
    }
}

/// A validated attention variant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VariantSpec {
    /// The declared name, a Rust identifier (`GemmaLocal`).
    pub name: String,
    /// The doc comment of the declaration, if any.
    pub doc: String,
    /// Head dimension of Q and K.
    pub head_dim_qk: u32,
    /// Head dimension of V and O (defaults to `head_dim_qk`).
    pub head_dim_v: u32,
    /// Element type of Q, K, V and O (accumulation is always `f32`).
    pub dtype: DType,
    /// Softmax scale; `None` means `1/sqrt(head_dim_qk)`.
    pub scale: Option<F64Bits>,
    /// Declared runtime parameters, in declaration order; [`Expr::Scalar`] and
    /// [`Expr::Index`] refer to them by position.
    pub params: Vec<ParamDecl>,
    /// Boolean mask expression; `None` means every key is visible.
    pub mask: Option<Expr>,
    /// Score modification of `s`; `None` means the identity.
    pub score: Option<Expr>,
    /// Dropout on the normalised probabilities; `None` means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropout: Option<Dropout>,
    /// A declared block-sparse layout, ANDed with the mask; `None` means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sparsity: Option<Sparsity>,
    /// `dtype: e4m3`: Q, K and V arrive as fp8 codes with f32 scales grouped as `scales:`
    /// declares (default: one per block of [`FP8_SCALE_BLOCK`] positions of each (batch, head);
    /// see `crate::fp8`), V transposed for the second product; `dtype` is then the output's type
    /// (bf16). `None`: Q, K, V, O all in `dtype`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8: Option<crate::fp8::Fp8Spec>,
}

/// Positions per scale block of an fp8 variant's Q, K and V: one block is one tile of the
/// kernel (128 queries, 128 keys), so a tile's scales are two numbers and fold into its softmax
/// scale.
pub const FP8_SCALE_BLOCK: u32 = 128;

/// `sparsity: blocks` with `params: { blocks: [i32; (batch,) (heads,) seq / N, K] }`: for each
/// (batch and head where the layout has those dimensions) query block of N positions, up to K
/// key blocks it may visit, in any order, repeats allowed, −1 for an unused slot. An element is
/// visible when the mask allows it and its key block is listed for its query block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Sparsity {
    /// The layout parameter (an `i32` tensor), by index into `VariantSpec::params`.
    pub param: usize,
    /// Positions per block (the `N` of its `seq / N` dimension).
    pub block: u32,
    /// Key blocks listed per query block (its last dimension).
    pub slots: u32,
    /// The layout has a leading `batch` dimension (one layout per batch element).
    pub per_batch: bool,
    /// The layout has a `heads` dimension (one layout per query head).
    pub per_head: bool,
}

/// The probability of dropout (`dropout: 0.1` or `dropout: p`): O = (dropout(P) / (1 − p))·V
/// with P the normalised probabilities, as FlashAttention defines it; the LSE is unaffected.
/// The keep decisions come from [`crate::dropout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dropout {
    /// A constant probability in `[0, 1)`.
    Const(F64Bits),
    /// A scalar `f32` parameter (by index into `VariantSpec::params`), checked to lie in
    /// `[0, 1)` at every launch; training and evaluation share one compiled kernel, and p = 0
    /// skips the generator.
    Param(usize),
}

impl VariantSpec {
    /// This spec with the parameters `frozen` (indices) marked [`ParamDecl::frozen`]: the spec
    /// a backward pass that wants none of their gradients is planned from.
    pub fn with_frozen(&self, frozen: &[usize]) -> VariantSpec {
        let mut s = self.clone();
        for &i in frozen {
            if let Some(p) = s.params.get_mut(i) {
                p.frozen = true;
            }
        }
        s
    }

    /// This spec with no parameter [`frozen`](ParamDecl::frozen): the declared variant of a
    /// frozen build.
    pub fn unfrozen(&self) -> VariantSpec {
        let mut s = self.clone();
        for p in &mut s.params {
            p.frozen = false;
        }
        s
    }

    /// The softmax scale this variant uses.
    pub fn softmax_scale(&self) -> f64 {
        match self.scale {
            Some(s) => s.get(),
            None => 1.0 / (self.head_dim_qk as f64).sqrt(),
        }
    }

    /// Index of the parameter called `name`.
    pub fn param_index(&self, name: &str) -> Option<usize> {
        self.params.iter().position(|p| p.name == name)
    }
}
