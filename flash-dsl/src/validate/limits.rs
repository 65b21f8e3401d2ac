//! The size limits of the language, and the checks that enforce them before anything recurses.
//!
//! Every later stage (syn's expression parser, validation, the planner, the emitter, the CPU
//! evaluator, the derivative, serde) walks expressions recursively, so hostile input must be
//! stopped while it is still a flat token stream. The checks here run in two steps:
//!
//! 1. [`check_tokens`], on the raw tokens of a whole body, walks them with an explicit stack (no
//!    recursion) and bounds the number of declarations, the tokens per attribute and per
//!    expression, and the *nesting*: brackets of any kind plus runs of prefix operators
//!    (`- - - x`, `!!!x`), which is what makes syn's recursive-descent parser recurse.
//! 2. [`check_expr_depth`], on each parsed `syn::Expr`, bounds the depth of the tree (a long
//!    `a || b || ...` chain or an `else if` ladder is flat in tokens but deep as a tree), with a
//!    recursion that stops at the limit.
//!
//! After both, every expression tree has at most [`MAX_EXPR_DEPTH`] levels and
//! [`MAX_EXPR_TOKENS`] tokens, so the recursive passes are bounded (lowering at most doubles the
//! depth: `ToFloat` nodes and shorthands), and planning is linear in the size.
//!
//! Identifiers (the declaration's name and its parameters' names) end up in CUDA identifiers,
//! kernel entry points and file names, so they are ASCII `[A-Za-z_][A-Za-z0-9_]*` of at most
//! [`MAX_IDENT_LEN`] characters, which NVRTC, every file system and Rust accept.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};

use crate::diag::Report;

/// Declarations in one `.flash` file or `attention!` body.
pub const MAX_DECLS: usize = 256;
/// Levels of nesting: brackets of any kind, and prefix operators in a row, counted together.
pub const MAX_NESTING: usize = 64;
/// Depth of an expression tree (each operator, call, index, `if` and parenthesis is a level).
pub const MAX_EXPR_DEPTH: usize = 64;
/// Tokens of one expression value (`mask`, `score`, ...), brackets and their contents included.
pub const MAX_EXPR_TOKENS: usize = 2048;
/// Tokens of one attribute (a `///` line is one attribute of four tokens).
pub const MAX_ATTR_TOKENS: usize = 256;
/// Characters of a declaration or parameter name.
pub const MAX_IDENT_LEN: usize = 64;

/// The keys whose values are parsed as expressions (the parser's list).
const EXPR_KEYS: &[&str] = &["scale", "mask", "score", "dropout", "sparsity", "scales"];

/// Checks a whole body before syn parses any of it: the number of declarations (top-level
/// brace groups), the nesting, and the size of every attribute and expression value. Returns
/// the first violation; its span points at the offending token.
pub fn check_tokens(ts: &TokenStream) -> Result<(), Report> {
    let mut decls = 0usize;
    let mut prev_hash = false;
    for tt in ts.clone() {
        match &tt {
            TokenTree::Group(g) if g.delimiter() == Delimiter::Brace => {
                decls += 1;
                if decls > MAX_DECLS {
                    return Err(Report::at(
                        g.span_open(),
                        format!("too many declarations: at most {MAX_DECLS} in one file or `attention!` body; split it"),
                    ));
                }
                check_body(&g.stream())?;
            }
            TokenTree::Group(g) if g.delimiter() == Delimiter::Bracket && prev_hash => {
                let n = count_tokens(&g.stream());
                if n > MAX_ATTR_TOKENS {
                    return Err(Report::at(
                        g.span_open(),
                        format!("attribute too long: {n} tokens, at most {MAX_ATTR_TOKENS}; only doc comments are allowed here"),
                    ));
                }
            }
            _ => {}
        }
        prev_hash = matches!(&tt, TokenTree::Punct(p) if p.as_char() == '#');
    }
    check_nesting(ts)
}

/// The entries of one declaration body: each expression value within [`MAX_EXPR_TOKENS`].
fn check_body(body: &TokenStream) -> Result<(), Report> {
    let tts: Vec<TokenTree> = body.clone().into_iter().collect();
    let mut i = 0;
    while i < tts.len() {
        // `key : value ,`
        let key = match (&tts[i], tts.get(i + 1)) {
            (TokenTree::Ident(k), Some(TokenTree::Punct(p))) if p.as_char() == ':' => {
                Some(k.to_string())
            }
            _ => None,
        };
        let start = if key.is_some() { i + 2 } else { i };
        let mut end = start;
        while end < tts.len() && !matches!(&tts[end], TokenTree::Punct(p) if p.as_char() == ',') {
            end += 1;
        }
        if key.as_deref().is_some_and(|k| EXPR_KEYS.contains(&k)) {
            let n: usize = tts[start..end].iter().map(tree_tokens).sum();
            if n > MAX_EXPR_TOKENS {
                return Err(Report::at(
                    tts[i].span(),
                    format!(
                        "expression too long: {n} tokens, at most {MAX_EXPR_TOKENS}; use a tensor parameter for long tables"
                    ),
                ));
            }
        }
        i = end + 1;
    }
    Ok(())
}

/// Tokens of one tree: 1 for a leaf, 1 plus the contents for a group.
fn tree_tokens(tt: &TokenTree) -> usize {
    match tt {
        TokenTree::Group(g) => 1 + count_tokens(&g.stream()),
        _ => 1,
    }
}

/// Tokens of a stream, groups counted with their contents, without recursion.
fn count_tokens(ts: &TokenStream) -> usize {
    let mut n = 0;
    let mut stack = vec![ts.clone().into_iter()];
    while let Some(top) = stack.last_mut() {
        match top.next() {
            Some(TokenTree::Group(g)) => {
                n += 1;
                stack.push(g.stream().into_iter());
            }
            Some(_) => n += 1,
            None => {
                stack.pop();
            }
        }
    }
    n
}

/// Nesting of brackets and prefix operators, without recursion: entering a group costs one
/// level plus the run of operator characters just before it (`-(-(x))` is four levels), and an
/// operator run inside a group counts on top of the group's level.
fn check_nesting(ts: &TokenStream) -> Result<(), Report> {
    // Per open group: its iterator, its level, the current run of punctuation.
    let mut stack = vec![(ts.clone().into_iter(), 0usize, 0usize)];
    while let Some((iter, level, run)) = stack.last_mut() {
        let Some(tt) = iter.next() else {
            stack.pop();
            continue;
        };
        let (level, run_before) = (*level, *run);
        match tt {
            TokenTree::Punct(p) => {
                *run += 1;
                if level + *run > MAX_NESTING {
                    return Err(too_deep(p.span()));
                }
            }
            TokenTree::Group(g) => {
                *run = 0;
                let inner = level + run_before + 1;
                if inner > MAX_NESTING {
                    return Err(too_deep(g.span_open()));
                }
                stack.push((g.stream().into_iter(), inner, 0));
            }
            _ => *run = 0,
        }
    }
    Ok(())
}

fn too_deep(span: Span) -> Report {
    Report::at(
        span,
        format!(
            "nested too deeply: more than {MAX_NESTING} levels of brackets and prefix operators"
        ),
    )
}

/// Depth of an expression tree as validation walks it, up to `MAX_EXPR_DEPTH + 1` (the
/// recursion stops there, so a deeper tree costs no more stack).
fn depth(e: &syn::Expr, budget: usize) -> usize {
    if budget == 0 {
        return 1;
    }
    let b = budget - 1;
    let sub = match e {
        syn::Expr::Paren(p) => depth(&p.expr, b),
        syn::Expr::Group(g) => depth(&g.expr, b),
        syn::Expr::Unary(u) => depth(&u.expr, b),
        syn::Expr::Binary(x) => depth(&x.left, b).max(depth(&x.right, b)),
        syn::Expr::Call(c) => c
            .args
            .iter()
            .map(|a| depth(a, b))
            .max()
            .unwrap_or(0)
            .max(depth(&c.func, b)),
        syn::Expr::Index(ix) => depth(&ix.expr, b).max(depth(&ix.index, b)),
        syn::Expr::Tuple(t) => t.elems.iter().map(|a| depth(a, b)).max().unwrap_or(0),
        syn::Expr::If(i) => {
            let then = block_depth(&i.then_branch, b);
            let els = i.else_branch.as_ref().map_or(0, |(_, e)| depth(e, b));
            depth(&i.cond, b).max(then).max(els)
        }
        syn::Expr::Block(bl) => block_depth(&bl.block, b),
        _ => 0,
    };
    1 + sub
}

fn block_depth(bl: &syn::Block, budget: usize) -> usize {
    bl.stmts
        .iter()
        .map(|s| match s {
            syn::Stmt::Expr(e, _) => depth(e, budget),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

/// Rejects an expression tree deeper than [`MAX_EXPR_DEPTH`], with the message to show at it.
pub fn check_expr_depth(e: &syn::Expr) -> Result<(), String> {
    if depth(e, MAX_EXPR_DEPTH) > MAX_EXPR_DEPTH {
        return Err(format!("expression nested too deeply: more than {MAX_EXPR_DEPTH} levels of operators, calls and `if`s; a long `||` chain or `else if` ladder is better a tensor parameter"));
    }
    Ok(())
}

/// Why `name` cannot name a declaration or a parameter, if it cannot: it must be ASCII
/// `[A-Za-z_][A-Za-z0-9_]*` (no raw `r#` identifiers) of at most [`MAX_IDENT_LEN`] characters.
pub fn ident_problem(name: &str) -> Option<String> {
    let mut chars = name.chars();
    let head_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !head_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        let shown: String = name.chars().take(MAX_IDENT_LEN).collect();
        return Some(format!(
            "`{shown}` is not a plain ASCII name: names become CUDA identifiers and file names, so use letters, digits and `_` (`[A-Za-z_][A-Za-z0-9_]*`)"
        ));
    }
    if name.len() > MAX_IDENT_LEN {
        return Some(format!(
            "name too long: {} characters, at most {MAX_IDENT_LEN}",
            name.len()
        ));
    }
    None
}
