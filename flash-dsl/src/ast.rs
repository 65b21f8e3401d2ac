//! Syntax tree of a declaration, keeping spans for diagnostics. (Owned by the front-end work.)
