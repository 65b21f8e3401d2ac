//! The vocabulary of the language (keys, builtin variables and functions) and how types and
//! dimensions are named in messages.

use crate::spec::{Dim, Ty};

/// The keys of a declaration body.
pub const KEYS: &[&str] = &[
    "head_dim", "dtype", "scale", "params", "mask", "score", "dropout", "sparsity", "scales", "qk",
    "v", "v_layout", "v_scales",
];
/// Built-in variables of expressions.
pub const VARIABLES: &[&str] = &["b", "h", "q", "k", "s", "seq_q", "seq_k"];
/// Built-in functions and shorthands.
pub const FUNCTIONS: &[&str] = &[
    "exp", "log", "tanh", "sigmoid", "sqrt", "abs", "min", "max", "softcap", "clamp", "window",
    "alibi",
];

pub(super) fn dim_name(d: Dim) -> String {
    match d {
        Dim::Batch => "batch".into(),
        Dim::Heads => "heads".into(),
        Dim::Seq => "seq".into(),
        Dim::Fixed(n) => n.to_string(),
        Dim::SeqBlocks(n) => format!("seq / {n}"),
    }
}

pub(super) fn ty_name(t: Ty) -> &'static str {
    match t {
        Ty::Int => "int",
        Ty::Float => "float",
        Ty::Bool => "bool",
    }
}
