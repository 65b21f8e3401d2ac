//! Compile-fail diagnostics of `attention!` (one case per diagnostic) and one pass case using
//! the whole grammar. Regenerate expectations with `TRYBUILD=overwrite`, then read each
//! `.stderr`: the message must be right and the carets must sit under the offending tokens.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/err_*.rs");
    t.pass("ui/pass_*.rs");
}
