//! Diagnostics with spans, and their rustc-like rendering for `.flash` files.
//!
//! A [`Diagnostic`] carries one span. Outside a proc macro (the CLI, the runtime, tests) that
//! span covers the whole offending range. Inside a proc macro, stable Rust cannot join spans, so
//! the span is the first offending token; [`Report`] additionally keeps the last token so the
//! macro can still underline the whole range (the way `syn::Error::new_spanned` does).

use std::fmt::Write as _;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;

/// One error in a declaration, at the offending tokens.
#[derive(Debug, Clone)]
pub struct Diagnostic {
    /// Where the error is: the offending tokens (see the module docs for what a proc macro
    /// can and cannot span).
    pub span: Span,
    /// What is wrong, one line; usually says what was expected and what was found.
    pub message: String,
}

impl Diagnostic {
    /// An error at `span`.
    pub fn new(span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            span,
            message: message.into(),
        }
    }

    /// 1-based line and 1-based column (in characters) of the start of the span.
    pub fn line_col(&self) -> (usize, usize) {
        let start = self.span.start();
        (start.line, start.column + 1)
    }
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A diagnostic plus the span of the last offending token, for the macro.
#[derive(Debug, Clone)]
pub struct Report {
    /// The error and its first (or joined) span.
    pub diagnostic: Diagnostic,
    /// Span of the last offending token (equal to the first for a single token).
    pub end: Span,
}

impl Report {
    /// An error at a single span.
    pub fn at(span: Span, message: impl Into<String>) -> Self {
        Report {
            diagnostic: Diagnostic::new(span, message),
            end: span,
        }
    }

    /// An error covering all of `tokens`.
    pub fn spanned(tokens: &dyn ToTokens, message: impl Into<String>) -> Self {
        let (first, last) = span_range(tokens.to_token_stream());
        // `join` works outside proc macros (and on nightly); elsewhere keep the first token.
        let joined = first.join(last).unwrap_or(first);
        Report {
            diagnostic: Diagnostic::new(joined, message),
            end: last,
        }
    }

    /// The start span (first offending token, or the joined range where available).
    pub fn span(&self) -> Span {
        self.diagnostic.span
    }

    /// The error message.
    pub fn message(&self) -> &str {
        &self.diagnostic.message
    }
}

/// Spans of the first and the last token tree of `ts` (`call_site` for an empty stream).
pub fn span_range(ts: TokenStream) -> (Span, Span) {
    let mut iter = ts.into_iter();
    let Some(first) = iter.next() else {
        return (Span::call_site(), Span::call_site());
    };
    let last = iter.last().unwrap_or_else(|| first.clone());
    (first.span(), last.span())
}

/// Characters of a source line shown in a rendered diagnostic.
const MAX_LINE: usize = 160;

/// Render diagnostics the way rustc does, for a source file:
///
/// ```text
/// error: head dim must be a multiple of 8 in 8..=256; got 100
///  --> dense.flash:3:15
///   |
/// 3 |     head_dim: 100,
///   |               ^^^
/// ```
pub fn render(file_name: &str, src: &str, diags: &[Diagnostic]) -> String {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = String::new();
    for (i, d) in diags.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let start = d.span.start();
        let end = d.span.end();
        let (line, col) = (start.line, start.column + 1);
        let _ = writeln!(out, "error: {}", d.message);
        let Some(text) = line.checked_sub(1).and_then(|l| lines.get(l)) else {
            // No usable location (an error at the end of input, say): name the file only.
            let _ = writeln!(out, " --> {file_name}");
            continue;
        };
        let gutter = line.to_string().len();
        let pad = " ".repeat(gutter);
        let _ = writeln!(out, "{pad}--> {file_name}:{line}:{col}");
        let _ = writeln!(out, "{pad} |");
        let width = text.chars().count();
        let stop = if end.line == start.line {
            end.column.min(width)
        } else {
            width
        };
        // A very long line (generated input) is shown as a window around the error, so a
        // diagnostic stays readable and its size bounded.
        let (from, to) = if width > MAX_LINE {
            let from = start.column.saturating_sub(MAX_LINE / 4).min(width);
            (from, (from + MAX_LINE).min(width))
        } else {
            (0, width)
        };
        let shown: String = text.chars().skip(from).take(to - from).collect();
        let (pre, post) = (
            if from > 0 { "..." } else { "" },
            if to < width { "..." } else { "" },
        );
        let _ = writeln!(out, "{line} | {pre}{shown}{post}");
        let col = start.column.saturating_sub(from) + pre.len();
        let carets = stop.min(to).saturating_sub(start.column.max(from)).max(1);
        let _ = writeln!(out, "{pad} | {}{}", " ".repeat(col), "^".repeat(carets));
    }
    out
}
