//! Diagnostics with spans. (Owned by the front-end work.)

/// One error in a declaration, at the offending tokens.
#[derive(Debug, Clone)]
pub struct Diagnostic {
    pub span: proc_macro2::Span,
    pub message: String,
}
