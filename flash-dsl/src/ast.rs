//! Syntax tree of a declaration, as written: every node keeps its tokens (and so its spans) so
//! that validation can point each diagnostic at the offending text.
//!
//! The tree is deliberately loose: it accepts anything that is syntactically a declaration
//! (unknown keys, duplicate keys, unknown dtypes, ill-typed expressions) and leaves every
//! semantic rule to [`crate::validate`], which reports all problems of a declaration at once.

use proc_macro2::{Span, TokenStream};
use syn::{Attribute, Ident, LitInt, Token};

/// One declaration: `/// doc` `pub? Name { key: value, ... }`.
#[derive(Debug, Clone)]
pub struct Decl {
    /// Outer attributes; doc comments arrive here as `#[doc = ".."]`. Anything else is rejected
    /// by validation.
    pub attrs: Vec<Attribute>,
    /// `pub`, if written.
    pub vis: Option<Token![pub]>,
    /// The variant's name (`GemmaLocal`), which becomes the type the macro declares.
    pub name: Ident,
    /// Span of the `{ ... }` body.
    pub body_span: Span,
    /// The `key: value` entries of the body, in source order (duplicates and unknown keys
    /// included, for validation to report).
    pub entries: Vec<Entry>,
    /// The declaration's original tokens, attributes included. Their `to_string()` re-parses to
    /// the same declaration (the macro stores it as `Variant::SOURCE`).
    pub tokens: TokenStream,
}

impl Decl {
    /// The doc comment, one line per `///` line, with the single leading space rustdoc strips.
    pub fn doc(&self) -> String {
        let mut lines = Vec::new();
        for attr in &self.attrs {
            if let Some(text) = doc_text(attr) {
                lines.push(text.strip_prefix(' ').unwrap_or(&text).to_string());
            }
        }
        lines.join("\n").trim().to_string()
    }

    /// Whether the declaration is `pub`.
    pub fn is_pub(&self) -> bool {
        self.vis.is_some()
    }
}

/// The string of a `#[doc = "..."]` attribute, `None` for any other attribute.
pub fn doc_text(attr: &Attribute) -> Option<String> {
    if !attr.path().is_ident("doc") {
        return None;
    }
    match &attr.meta {
        syn::Meta::NameValue(nv) => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    }
}

/// One `key: value` entry of a declaration body.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The key as written (`head_dim`, `mask`, …), known or not.
    pub key: Ident,
    /// The value, parsed according to the key.
    pub value: Value,
}

/// The value of an entry, parsed according to its key. Keys the parser does not know keep their
/// raw tokens so that validation can report them (together with every other problem).
#[derive(Debug, Clone)]
pub enum Value {
    /// `head_dim: 128` or `head_dim: (192, 128)`.
    HeadDim(HeadDim),
    /// `dtype: bf16`.
    DType(Ident),
    /// `scale`, `mask` and `score`: an expression.
    Expr(Box<ExprValue>),
    /// `params: { name: type, ... }`.
    Params(Vec<ParamAst>),
    /// The value of an unknown key, as written.
    Other(TokenStream),
}

/// The sizes written for `head_dim`: one literal, or a parenthesised list (validation wants
/// exactly two there: the qk and the v dimension).
#[derive(Debug, Clone)]
pub struct HeadDim {
    /// The integer literals as written, in order (not yet range-checked).
    pub sizes: Vec<LitInt>,
    /// `Some` when the value was written in parentheses; the span of the parentheses.
    pub paren: Option<Span>,
}

/// An expression value. `expr` is what syn parsed after the front-end's one rewrite
/// (`x[a, b]` becomes `x[(a, b)]`, since Rust has no comma inside an index); `tokens` are the
/// tokens as written.
#[derive(Debug, Clone)]
pub struct ExprValue {
    /// The parsed (rewritten) expression that validation lowers to a [`crate::spec::Expr`].
    pub expr: syn::Expr,
    /// The tokens as written, for spans and messages.
    pub tokens: TokenStream,
}

/// One parameter declaration, `name: f32` or `name: [f32; heads, 256]`.
#[derive(Debug, Clone)]
pub struct ParamAst {
    /// The parameter's name, as expressions refer to it.
    pub name: Ident,
    /// Its written type, scalar or tensor.
    pub ty: ParamTyAst,
}

/// The written type of a parameter.
#[derive(Debug, Clone)]
pub struct ParamTyAst {
    /// The element (or scalar) type name: `f32`, `i32`, or something validation rejects.
    pub elem: Ident,
    /// For a tensor, the dimensions written after `;` and the span of the brackets.
    pub dims: Option<(Span, Vec<DimAst>)>,
    /// All tokens of the type.
    pub tokens: TokenStream,
}

/// One written dimension of a tensor parameter.
#[derive(Debug, Clone)]
pub enum DimAst {
    /// `batch`, `heads`, `seq`, or an unknown name.
    Named(Ident),
    /// A fixed size.
    Fixed(LitInt),
    /// `seq / N`: the sequence in blocks of N positions (a block-sparse layout's query blocks);
    /// the name (which validation requires to be `seq`) and the block size.
    Blocks(Ident, LitInt),
}
