//! Regression tests for issue 14: hostile or extreme declarations get a diagnostic with a
//! span (never a crash, a hang or CUDA with undefined behaviour), and the host and the kernels
//! share one integer arithmetic.

use std::time::{Duration, Instant};

use flash_dsl::eval::{Env, ParamValue, ParamValues, Point, Sizes, Value};
use flash_dsl::parse::parse_str;
use flash_dsl::plan::plan;
use flash_dsl::validate::limits::{MAX_DECLS, MAX_EXPR_TOKENS, MAX_IDENT_LEN, MAX_NESTING};
use flash_dsl::{emit, Diagnostic, VariantSpec};

fn decl(body: &str) -> String {
    format!("V {{ head_dim: 64, dtype: bf16, {body} }}")
}

fn accept(body: &str) -> VariantSpec {
    let src = decl(body);
    parse_str(&src)
        .unwrap_or_else(|d| {
            panic!(
                "{src}: {:?}",
                d.iter().map(|d| &d.message).collect::<Vec<_>>()
            )
        })
        .remove(0)
}

/// The diagnostics of a rejected body; each must point into the source (line ≥ 1).
fn reject_src(src: &str) -> Vec<Diagnostic> {
    let t = Instant::now();
    let diags = match parse_str(src) {
        Ok(_) => panic!("accepted: {}", &src[..src.len().min(200)]),
        Err(d) => d,
    };
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert!(!diags.is_empty());
    for d in &diags {
        assert!(d.line_col().0 >= 1, "no span: {}", d.message);
    }
    diags
}

fn reject(body: &str, needle: &str) -> Diagnostic {
    let diags = reject_src(&decl(body));
    diags
        .iter()
        .find(|d| d.message.contains(needle))
        .unwrap_or_else(|| {
            panic!(
                "no `{needle}` in {:#?}",
                diags.iter().map(|d| &d.message).collect::<Vec<_>>()
            )
        })
        .clone()
}

/// Runs `f` on a thread with a 2 MiB stack (the default of test threads and less than a
/// process's main thread), so that a recursion the limits fail to bound overflows here.
fn small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

#[test]
fn deep_nesting_is_a_diagnostic_not_a_stack_overflow() {
    small_stack(|| {
        // ~10 KB of parentheses: was a stack overflow in the parser.
        let n = 5000;
        let body = format!("mask: {}causal{}", "(".repeat(n), ")".repeat(n));
        reject(&body, "too long");
        // Within the token limit but too deep.
        let n = 200;
        let body = format!("mask: {}causal{}", "(".repeat(n), ")".repeat(n));
        let d = reject(&body, "nested too deeply");
        assert_eq!(d.line_col().0, 1);
        // Prefix operators nest like brackets.
        reject(
            &format!("mask: {}causal", "!".repeat(200)),
            "nested too deeply",
        );
        reject(
            &format!("score: {}s", "- ".repeat(200)),
            "nested too deeply",
        );
        // Nesting in an attribute or an unknown key's value is caught too.
        let src = format!(
            "#[doc = {}1{}] {}",
            "(".repeat(300),
            ")".repeat(300),
            decl("")
        );
        reject_src(&src);
        let src = decl(&format!("colour: {}1{}", "[".repeat(500), "]".repeat(500)));
        reject_src(&src);
        // Just within the limits: accepted.
        let n = MAX_NESTING / 2 - 2;
        accept(&format!("mask: {}causal{}", "(".repeat(n), ")".repeat(n)));
    });
}

#[test]
fn long_chains_and_ladders_are_bounded() {
    small_stack(|| {
        // A flat `||` chain is a deep tree: rejected by depth (short) or size (long).
        let chain = |n: usize| {
            (0..n)
                .map(|i| format!("q - k == {i}"))
                .collect::<Vec<_>>()
                .join(" || ")
        };
        reject(&format!("mask: {}", chain(100)), "nested too deeply");
        reject(&format!("mask: {}", chain(3000)), "too long");
        let ladder: String = (0..100)
            .map(|i| format!("if q == {i} {{ k < {i} }} else "))
            .collect();
        reject(&format!("mask: {ladder}{{ causal }}"), "nested too deeply");
        // The largest accepted masks plan and emit quickly: a balanced tree of comparisons
        // filling the token limit.
        fn balanced(lo: usize, hi: usize) -> String {
            if hi - lo == 1 {
                return format!("q - k == {lo}");
            }
            let mid = (lo + hi) / 2;
            let op = if (hi - lo).is_multiple_of(3) {
                "&&"
            } else {
                "||"
            };
            format!("({} {op} {})", balanced(lo, mid), balanced(mid, hi))
        }
        let mut n = 16;
        while balanced(0, n * 2).len() / 2 < MAX_EXPR_TOKENS {
            n *= 2;
        }
        let spec = accept(&format!("mask: {}", balanced(0, n)));
        let t = Instant::now();
        let p = plan(&spec, None).unwrap();
        let src = emit(&p);
        assert!(!src.source.is_empty());
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    });
}

#[test]
fn too_many_declarations() {
    let one = |i: usize| format!("V{i} {{ head_dim: 64, dtype: bf16 }}\n");
    let ok: String = (0..MAX_DECLS).map(one).collect();
    assert_eq!(parse_str(&ok).unwrap().len(), MAX_DECLS);
    let too_many: String = (0..=MAX_DECLS).map(one).collect();
    let d = reject_src(&too_many);
    assert!(
        d[0].message.contains("too many declarations"),
        "{}",
        d[0].message
    );
    assert_eq!(d[0].line_col().0, MAX_DECLS + 1);
}

#[test]
fn identifiers_are_plain_ascii_and_short() {
    reject_src("Aé { head_dim: 64, dtype: f16 }");
    reject("params: { α: f32 }, score: s * α", "not a plain ASCII name");
    reject("params: { r#type: f32 }", "not a plain ASCII name");
    let long = "x".repeat(MAX_IDENT_LEN + 1);
    reject(&format!("params: {{ {long}: f32 }}"), "name too long");
    let d = reject_src(&format!(
        "{} {{ head_dim: 64, dtype: f16 }}",
        "A".repeat(100_000)
    ));
    assert!(d[0].message.contains("name too long"));
    accept(&format!("params: {{ {}: f32 }}", "x".repeat(MAX_IDENT_LEN)));
    // Names differing only by case would share a kernel name and a `gen --out` file.
    let d = reject_src("Foo { head_dim: 64, dtype: f16 } FOO { head_dim: 64, dtype: f16 }");
    assert!(
        d[0].message.contains("differ only by case"),
        "{}",
        d[0].message
    );
    assert_eq!(d[0].line_col(), (1, 34));
}

#[test]
fn constant_zero_divisors_are_errors() {
    reject(
        "mask: q % 0 == 1",
        "the divisor of `%` is the constant zero",
    );
    reject(
        "mask: q % (2 - 2) == 1",
        "the divisor of `%` is the constant zero",
    );
    reject("score: s / 0.0", "the divisor of `/` is the constant zero");
    reject(
        "score: s / (1 - 1)",
        "the divisor of `/` is the constant zero",
    );
    reject("score: softcap(s, 0.0)", "the cap of `softcap`");
}

#[test]
fn runtime_zero_remainder_is_zero_on_both_sides() {
    let spec = accept("params: { m: i32 }, mask: q % m == 0 || k % m == 1");
    let vals = ParamValues::new(vec![ParamValue::Int(0)]);
    let sizes = Sizes {
        batch: 1,
        heads: 1,
        seq_q: 4,
        seq_k: 4,
    };
    let env = Env::new(&spec, &vals, sizes);
    let pt = |q, k| Point {
        b: 0,
        h: 0,
        q,
        k,
        s: 0.0,
    };
    // x % 0 == 0: every element visible.
    assert!((0..4).all(|q| (0..4).all(|k| env.mask(&pt(q, k)))));
    let m = spec.mask.as_ref().unwrap();
    assert_eq!(env.eval(m, &pt(3, 1)), Value::Bool(true));
    // The kernel computes it with the helper that defines it so.
    let src = emit(&plan(&spec, None).unwrap()).source;
    assert!(src.contains("flash::irem(q, args.p_m)"), "{src}");
    // A constant divisor other than 0 and -1 is plain C.
    let spec = accept("mask: (q - k) % 7 != 3");
    let src = emit(&plan(&spec, None).unwrap()).source;
    assert!(src.contains("((q - k) % 7)"));
}

#[test]
fn integer_literals_and_dimensions_are_i32() {
    reject("mask: q < 2147483648", "integer literal out of range");
    reject(
        "mask: q < 99999999999999999999",
        "integer literal out of range",
    );
    accept("mask: q < 2147483647");
    reject("params: { t: [f32; 2147483648] }", "fixed dimension");
    accept("params: { t: [f32; 2147483647] }");
    reject(
        "params: { t: [i32; seq / 1073741824] }",
        "a block size must be a positive plain integer",
    );
}

#[test]
fn integers_that_may_leave_i32_are_wide_and_those_that_may_leave_i64_are_errors() {
    // i32 × i32 × i32 can reach 2^93.
    let d = reject("params: { p: i32 }, mask: p * p * p > q", "may overflow");
    assert_eq!(d.line_col().0, 1);
    reject("mask: q * 2147483647 * 2147483647 > 0", "may overflow");
    // `p + 1` may leave i32: computed in 64 bits on the device, as on the host.
    let spec = accept("params: { p: i32 }, mask: k < p + 1");
    let src = emit(&plan(&spec, None).unwrap()).source;
    assert!(src.contains("((i64)(args.p_p) + (i64)(1))"), "{src}");
    let vals = ParamValues::new(vec![ParamValue::Int(i32::MAX as i64)]);
    let sizes = Sizes {
        batch: 1,
        heads: 1,
        seq_q: 2,
        seq_k: 2,
    };
    let env = Env::new(&spec, &vals, sizes);
    let pt = Point {
        b: 0,
        h: 0,
        q: 0,
        k: 1,
        s: 0.0,
    };
    assert!(env.mask(&pt), "i32::MAX + 1 does not wrap");
    // The hot paths stay 32-bit: causal, windows, document masks, relative biases.
    for body in [
        "mask: causal && q - k < 1024",
        "params: { doc: [i32; seq] }, mask: causal && doc[q] == doc[k]",
        "params: { bias: [f32; heads, 256] }, score: s + bias[h, q - k]",
        "params: { w: i32 }, mask: window(w)",
    ] {
        let spec = accept(body);
        let p = plan(&spec, None).unwrap();
        let src = emit(&p).source;
        let at = src.find("mask_at(const Args").unwrap_or(0);
        let hook = &src[at..at + 600.min(src.len() - at)];
        assert!(
            !hook.contains("(i64)(q") && !hook.contains("clampl"),
            "{body}: {hook}"
        );
    }
    // A tensor that may exceed 2^31 elements is indexed in 64 bits.
    let spec = accept("params: { d: [i32; batch, seq] }, mask: d[b, q] == d[b, k]");
    let src = emit(&plan(&spec, None).unwrap()).source;
    assert!(src.contains("(i64)flash::clampi(b, args.batch)"), "{src}");
    let spec = accept("params: { bias: [f32; heads, 256] }, score: s + bias[h, q - k]");
    let src = emit(&plan(&spec, None).unwrap()).source;
    assert!(!src.contains("(i64)flash::clampi(h"));
}

#[test]
fn floats_must_be_finite_in_f32() {
    reject("score: s * 1e39", "float literal out of range");
    reject("scale: 1e39", "float literal out of range");
    reject("scale: 1e30 * 1e30", "finite as an f32");
    reject("scale: 1e-50", "finite as an f32");
    accept("score: s * 3.0e38");
    accept("scale: 0.125");
}

#[test]
fn long_lines_do_not_hide_the_error() {
    // A diagnostic on a huge line names the place; rendering stays bounded.
    let src = decl(&format!("mask: {}", "q < k && ".repeat(5000) + "causal"));
    let diags = reject_src(&src);
    let text = flash_dsl::diag::render("x.flash", &src, &diags);
    assert!(
        text.contains("x.flash:1:"),
        "{}",
        &text[..200.min(text.len())]
    );
    assert!(text.len() < 4000, "rendered {} bytes", text.len());
}
