//! Parsing with syn, shared by the `attention!` macro and `.flash` files.
//!
//! The parser only checks the shape of the text; all semantic rules live in [`crate::validate`]
//! so that one pass can report every mistake of a declaration together.
//!
//! Expressions are parsed by `syn::Expr`, with one rewrite first: a comma inside index
//! brackets (`bias[h, q - k]`) is not Rust, so such bracket contents are wrapped in parentheses
//! (`bias[(h, q - k)]`) and the tuple is read back as a list of indices.

use std::path::Path;

use proc_macro2::{Delimiter, Group, TokenStream, TokenTree};
use syn::parse::{Parse, ParseStream, Parser};
use syn::{braced, bracketed, parenthesized, Attribute, Ident, LitInt, Token};

use crate::ast::{Decl, DimAst, Entry, ExprValue, HeadDim, ParamAst, ParamTyAst, Value};
use crate::diag::{render, Diagnostic};
use crate::spec::VariantSpec;
use crate::validate::limits::{check_expr_depth, check_tokens};
use crate::validate::validate_all;

/// Parse a body of one or more declarations. The size limits of
/// [`crate::validate::limits`] are checked on the flat tokens first, so that no hostile input
/// reaches a recursive parser.
pub fn parse_tokens(ts: TokenStream) -> syn::Result<Vec<Decl>> {
    check_tokens(&ts).map_err(|r| syn::Error::new(r.span(), r.message()))?;
    parse_decls.parse2(ts)
}

/// Parse and validate every declaration of `src` (the text of a `.flash` file or of an
/// `attention!` body). Syntax errors become diagnostics too.
///
/// Every problem of a declaration is reported at once, each at its tokens (line and column
/// are 1-based):
///
/// ```
/// let src = "Bad {
///     head_dim: 100,
///     dtype: bf16,
///     mask: q >= kk,
/// }";
/// let errors = flash_dsl::parse::parse_str(src).unwrap_err();
/// assert_eq!(errors.len(), 2);
/// assert!(errors[0].message.contains("head dim must be a multiple of 8"));
/// assert_eq!(errors[0].line_col(), (2, 15));
/// assert!(errors[1].message.contains("unknown identifier `kk`"));
/// assert_eq!(errors[1].line_col(), (4, 16));
///
/// // rustc-style rendering for a file.
/// let text = flash_dsl::diag::render("bad.flash", src, &errors);
/// assert!(text.contains(" --> bad.flash:2:15"));
///
/// let ok = flash_dsl::parse::parse_str("Dense { head_dim: 64, dtype: bf16 }").unwrap();
/// assert_eq!((ok[0].name.as_str(), ok[0].head_dim_qk), ("Dense", 64));
/// ```
pub fn parse_str(src: &str) -> Result<Vec<VariantSpec>, Vec<Diagnostic>> {
    let ts: TokenStream = src
        .parse()
        .map_err(|e: proc_macro2::LexError| vec![Diagnostic::new(e.span(), e.to_string())])?;
    // syn reports "unexpected end of input" at the call site, which has no place in the
    // file; point such errors at the last token instead.
    let end = ts.clone().into_iter().last().map(|tt| match tt {
        TokenTree::Group(g) => g.span_close(),
        other => other.span(),
    });
    let decls = parse_tokens(ts).map_err(|e| {
        let mut diags = syn_to_diags(e);
        for d in &mut diags {
            let site = proc_macro2::Span::call_site();
            if (d.span.start(), d.span.end()) == (site.start(), site.end()) {
                d.span = end.unwrap_or(d.span);
            }
        }
        diags
    })?;
    validate_all(&decls).map_err(|reports| reports.into_iter().map(|r| r.diagnostic).collect())
}

/// Read a `.flash` file and parse and validate it; on error, the rendered diagnostics.
pub fn parse_file(path: &Path) -> Result<Vec<VariantSpec>, String> {
    let src = std::fs::read_to_string(path)
        .map_err(|e| format!("error: cannot read {}: {e}\n", path.display()))?;
    parse_str(&src).map_err(|diags| render(&path.display().to_string(), &src, &diags))
}

/// Every message of a (possibly combined) syn error, as diagnostics.
pub fn syn_to_diags(err: syn::Error) -> Vec<Diagnostic> {
    err.into_iter()
        .map(|e| Diagnostic::new(e.span(), e.to_string()))
        .collect()
}

fn parse_decls(input: ParseStream) -> syn::Result<Vec<Decl>> {
    let mut decls = Vec::new();
    while !input.is_empty() {
        decls.push(input.parse()?);
    }
    if decls.is_empty() {
        return Err(syn::Error::new(proc_macro2::Span::call_site(), "expected at least one declaration, e.g. `pub Causal { head_dim: 128, dtype: bf16, mask: causal }`"));
    }
    Ok(decls)
}

impl Parse for Decl {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let begin = input.cursor();
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Option<Token![pub]> = input.parse()?;
        let name: Ident = input.parse()?;
        let content;
        let brace = braced!(content in input);
        let mut entries = Vec::new();
        while !content.is_empty() {
            entries.push(parse_entry(&content)?);
            if content.is_empty() {
                break;
            }
            content.parse::<Token![,]>()?;
        }
        let end = input.cursor();
        // The tokens between the two cursors, for `Variant::SOURCE`.
        let mut tokens = TokenStream::new();
        let mut cur = begin;
        while cur != end {
            let Some((tt, next)) = cur.token_tree() else {
                break;
            };
            tokens.extend([tt]);
            cur = next;
        }
        Ok(Decl {
            attrs,
            vis,
            name,
            body_span: brace.span.join(),
            entries,
            tokens,
        })
    }
}

fn parse_entry(input: ParseStream) -> syn::Result<Entry> {
    let key: Ident = input.parse()?;
    input.parse::<Token![:]>()?;
    let value = match key.to_string().as_str() {
        "head_dim" => Value::HeadDim(parse_head_dim(input)?),
        "dtype" | "qk" | "v" | "v_layout" => Value::DType(input.parse()?),
        "params" => Value::Params(parse_params(input)?),
        "scale" | "mask" | "score" | "dropout" | "sparsity" | "scales" | "v_scales" => {
            Value::Expr(Box::new(parse_expr_value(input, &key)?))
        }
        _ => Value::Other(tokens_until_comma(input)?),
    };
    Ok(Entry { key, value })
}

fn parse_head_dim(input: ParseStream) -> syn::Result<HeadDim> {
    if input.peek(syn::token::Paren) {
        let content;
        let paren = parenthesized!(content in input);
        let sizes = content.parse_terminated(LitInt::parse, Token![,])?;
        Ok(HeadDim {
            sizes: sizes.into_iter().collect(),
            paren: Some(paren.span.join()),
        })
    } else {
        let lit: LitInt = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected a head dim: an integer literal like `128`, or `(qk, v)` like `(192, 128)`",
            )
        })?;
        Ok(HeadDim {
            sizes: vec![lit],
            paren: None,
        })
    }
}

fn parse_params(input: ParseStream) -> syn::Result<Vec<ParamAst>> {
    let content;
    braced!(content in input);
    let mut params = Vec::new();
    while !content.is_empty() {
        let name: Ident = content.parse()?;
        content.parse::<Token![:]>()?;
        let ty = parse_param_ty(&content)?;
        params.push(ParamAst { name, ty });
        if content.is_empty() {
            break;
        }
        content.parse::<Token![,]>()?;
    }
    Ok(params)
}

fn parse_param_ty(input: ParseStream) -> syn::Result<ParamTyAst> {
    if input.peek(syn::token::Bracket) {
        let tokens = TokenStream::from(input.fork().parse::<TokenTree>()?);
        let content;
        let bracket = bracketed!(content in input);
        let elem: Ident = content.parse()?;
        content.parse::<Token![;]>()?;
        let mut dims = Vec::new();
        while !content.is_empty() {
            if content.peek(LitInt) {
                dims.push(DimAst::Fixed(content.parse()?));
            } else {
                let name: Ident = content.parse().map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "expected a dimension: `batch`, `heads`, `seq`, `seq / N` or an integer literal",
                    )
                })?;
                if content.peek(Token![/]) {
                    content.parse::<Token![/]>()?;
                    dims.push(DimAst::Blocks(name, content.parse()?));
                } else {
                    dims.push(DimAst::Named(name));
                }
            }
            if content.is_empty() {
                break;
            }
            content.parse::<Token![,]>()?;
        }
        Ok(ParamTyAst {
            elem,
            dims: Some((bracket.span.join(), dims)),
            tokens,
        })
    } else {
        let elem: Ident = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected a parameter type: `f32`, `i32`, or a tensor like `[f32; heads]`",
            )
        })?;
        let tokens = quote::ToTokens::to_token_stream(&elem);
        Ok(ParamTyAst {
            elem,
            dims: None,
            tokens,
        })
    }
}

/// Token trees up to (not including) the next top-level comma or the end of the body.
fn tokens_until_comma(input: ParseStream) -> syn::Result<TokenStream> {
    let mut ts = TokenStream::new();
    while !input.is_empty() && !input.peek(Token![,]) {
        ts.extend([input.parse::<TokenTree>()?]);
    }
    Ok(ts)
}

fn parse_expr_value(input: ParseStream, key: &Ident) -> syn::Result<ExprValue> {
    let tokens = tokens_until_comma(input)?;
    if tokens.is_empty() {
        return Err(syn::Error::new(
            key.span(),
            format!("expected an expression after `{key}:`"),
        ));
    }
    // Wrap the value in a group spanning its last token, so that "unexpected end of input"
    // points at the value and not at the whole call site.
    let last = tokens
        .clone()
        .into_iter()
        .last()
        .map_or(key.span(), |t| t.span());
    let mut group = Group::new(Delimiter::Parenthesis, split_index_commas(tokens.clone()));
    group.set_span(last);
    let expr = (|input: ParseStream| {
        let content;
        parenthesized!(content in input);
        let e: syn::Expr = content.parse()?;
        if !content.is_empty() {
            return Err(content.error("unexpected tokens after the expression"));
        }
        Ok(e)
    })
    .parse2(TokenStream::from(TokenTree::Group(group)))?;
    check_expr_depth(&expr).map_err(|m| syn::Error::new_spanned(&tokens, m))?;
    Ok(ExprValue { expr, tokens })
}

/// Rewrite `x[a, b]` into `x[(a, b)]` (recursively) so that syn can parse it.
fn split_index_commas(ts: TokenStream) -> TokenStream {
    ts.into_iter()
        .map(|tt| match tt {
            TokenTree::Group(g) => {
                let inner = split_index_commas(g.stream());
                let has_comma = g.delimiter() == Delimiter::Bracket
                    && inner
                        .clone()
                        .into_iter()
                        .any(|t| matches!(&t, TokenTree::Punct(p) if p.as_char() == ','));
                let inner = if has_comma {
                    let mut paren = Group::new(Delimiter::Parenthesis, inner);
                    paren.set_span(g.span());
                    TokenStream::from(TokenTree::Group(paren))
                } else {
                    inner
                };
                let mut out = Group::new(g.delimiter(), inner);
                out.set_span(g.span());
                TokenTree::Group(out)
            }
            other => other,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/variants")
    }

    #[test]
    fn every_example_variant_parses_and_validates() {
        let mut n = 0;
        for entry in std::fs::read_dir(examples_dir()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "flash") {
                let specs =
                    parse_file(&path).unwrap_or_else(|e| panic!("{}:\n{e}", path.display()));
                assert!(!specs.is_empty(), "{}", path.display());
                n += 1;
            }
        }
        assert!(n >= 9, "found only {n} example files");
    }

    #[test]
    fn source_round_trips_through_tokens() {
        let src = std::fs::read_to_string(examples_dir().join("document.flash")).unwrap();
        let ts: TokenStream = src.parse().unwrap();
        let decls = parse_tokens(ts).unwrap();
        let again = parse_str(&decls[0].tokens.to_string()).unwrap();
        assert_eq!(again, parse_str(&src).unwrap());
        assert_eq!(
            again[0].doc,
            "Packed documents: causal attention that never crosses a document boundary."
        );
    }

    #[test]
    fn several_declarations_in_one_body() {
        let specs = parse_str(
            "pub A { head_dim: 64, dtype: f16 } B { head_dim: (192, 128), dtype: bf16, scale: 0.5, }",
        )
        .unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!((specs[1].head_dim_qk, specs[1].head_dim_v), (192, 128));
        assert_eq!(specs[1].scale.map(|s| s.get()), Some(0.5));
    }

    #[test]
    fn render_points_at_line_and_column() {
        let src = "/// doc\npub Bad {\n    head_dim: 100,\n    dtype: bf16,\n}\n";
        let diags = parse_str(src).unwrap_err();
        assert_eq!(diags.len(), 1);
        assert_eq!(diags[0].line_col(), (3, 15));
        let text = render("bad.flash", src, &diags);
        let want = "error: head dim must be a multiple of 8 in 8..=256; got 100\n \
                    --> bad.flash:3:15\n  |\n3 |     head_dim: 100,\n  |               ^^^\n";
        assert_eq!(text, want);
    }

    #[test]
    fn render_underlines_a_whole_expression() {
        let src = "A {\n  head_dim: 64,\n  dtype: f16,\n  mask: q + k,\n}";
        let diags = parse_str(src).unwrap_err();
        let text = render("a.flash", src, &diags);
        assert!(text.contains("--> a.flash:4:9"), "{text}");
        assert!(
            text.contains("4 |   mask: q + k,\n  |         ^^^^^\n"),
            "{text}"
        );
    }

    #[test]
    fn syntax_errors_become_diagnostics() {
        let src = "A {\n  head_dim: 64\n  dtype: f16,\n}";
        let diags = parse_str(src).unwrap_err();
        assert_eq!(diags.len(), 1);
        assert_eq!(diags[0].line_col(), (3, 3), "{}", diags[0].message);
        let diags = parse_str("A { mask: q < , }").unwrap_err();
        assert_eq!(diags.len(), 1);
        assert_eq!(diags[0].line_col().0, 1);
        // An error at the end of input points at the last token.
        let diags = parse_str("/// doc\npub A").unwrap_err();
        assert_eq!(diags[0].line_col(), (2, 5), "{}", diags[0].message);
        let diags = parse_str("").unwrap_err();
        assert!(
            diags[0]
                .message
                .starts_with("expected at least one declaration"),
            "{}",
            diags[0].message
        );
    }

    #[test]
    fn multiple_errors_are_reported_together() {
        let src = "A {\n  head_dim: 12,\n  dtype: f32,\n  colour: red,\n  mask: foo,\n}";
        let diags = parse_str(src).unwrap_err();
        let msgs: Vec<&str> = diags.iter().map(|d| d.message.as_str()).collect();
        assert_eq!(msgs.len(), 4, "{msgs:#?}");
        assert!(msgs[0].starts_with("head dim must be a multiple of 8"));
        assert!(msgs[1].starts_with("unknown dtype `f32`"));
        assert!(msgs[2].starts_with("unknown key `colour`"));
        assert!(msgs[3].starts_with("unknown identifier `foo`"));
        let text = render("a.flash", src, &diags);
        assert_eq!(text.matches("error: ").count(), 4);
    }
}
