//! Validation end to end: lowering of shorthands, int-to-float promotion, and every
//! diagnostic.

use super::*;
use crate::parse::parse_str;
use crate::spec::Expr as E;
use crate::spec::{BinOp, Dim, Func, ParamKind, ScalarTy, Var};

fn spec(body: &str) -> VariantSpec {
    let src = format!("V {{ head_dim: 64, dtype: bf16, {body} }}");
    parse_str(&src)
        .unwrap_or_else(|d| {
            panic!(
                "{src}: {:?}",
                d.iter().map(|d| &d.message).collect::<Vec<_>>()
            )
        })
        .remove(0)
}

fn errors(body: &str) -> Vec<String> {
    let src = format!("V {{ head_dim: 64, dtype: bf16, {body} }}");
    match parse_str(&src) {
        Ok(_) => panic!("{src} validated"),
        Err(d) => d.into_iter().map(|d| d.message).collect(),
    }
}

fn var(v: Var) -> E {
    E::Var(v)
}
fn tf(e: E) -> E {
    E::ToFloat(Box::new(e))
}
fn bin(op: BinOp, a: E, b: E) -> E {
    E::bin(op, a, b)
}

#[test]
fn causal_is_bottom_right_aligned() {
    let want = bin(
        BinOp::Le,
        var(Var::K),
        bin(
            BinOp::Add,
            var(Var::Q),
            bin(BinOp::Sub, var(Var::SeqK), var(Var::SeqQ)),
        ),
    );
    assert_eq!(spec("mask: causal").mask, Some(want.clone()));
    assert_eq!(causal_expr(), want);
}

#[test]
fn softcap_lowers_to_cap_tanh() {
    let s = spec("params: { cap: f32 }, score: softcap(s, cap)");
    let want = bin(
        BinOp::Mul,
        E::Scalar(0),
        E::Call(Func::Tanh, vec![bin(BinOp::Div, var(Var::S), E::Scalar(0))]),
    );
    assert_eq!(s.score, Some(want));
    // An int cap is promoted on both sides.
    let s = spec("score: softcap(s, 30)");
    let want = bin(
        BinOp::Mul,
        E::float(30.0),
        E::Call(
            Func::Tanh,
            vec![bin(BinOp::Div, var(Var::S), E::float(30.0))],
        ),
    );
    assert_eq!(s.score, Some(want));
}

#[test]
fn window_lowers_to_causal_and_distance() {
    let dist = bin(BinOp::Sub, aligned_q(), var(Var::K));
    let want = bin(
        BinOp::And,
        causal_expr(),
        bin(BinOp::Lt, dist.clone(), E::Int(256)),
    );
    assert_eq!(spec("mask: window(256)").mask, Some(want));
    let want = bin(
        BinOp::And,
        causal_expr(),
        bin(BinOp::Lt, dist, E::Scalar(0)),
    );
    assert_eq!(spec("params: { w: i32 }, mask: window(w)").mask, Some(want));
}

#[test]
fn alibi_lowers_to_slope_times_distance() {
    let s = spec("params: { slopes: [f32; heads] }, mask: causal, score: s + alibi(slopes[h])");
    let dist = tf(bin(BinOp::Sub, var(Var::K), aligned_q()));
    let want = bin(
        BinOp::Add,
        var(Var::S),
        bin(BinOp::Mul, E::Index(0, vec![var(Var::H)]), dist),
    );
    assert_eq!(s.score, Some(want));
}

#[test]
fn clamp_lowers_to_min_max_in_one_type() {
    let s = spec("score: clamp(s, -5, 5.0)");
    let want = E::Call(
        Func::Min,
        vec![
            E::Call(Func::Max, vec![var(Var::S), E::float(-5.0)]),
            E::float(5.0),
        ],
    );
    assert_eq!(s.score, Some(want));
    let s = spec("params: { t: [f32; 8] }, score: s + t[clamp(q - k, 0, 7)]");
    let idx = E::Call(
        Func::Min,
        vec![
            E::Call(
                Func::Max,
                vec![bin(BinOp::Sub, var(Var::Q), var(Var::K)), E::Int(0)],
            ),
            E::Int(7),
        ],
    );
    assert_eq!(
        s.score,
        Some(bin(BinOp::Add, var(Var::S), E::Index(0, vec![idx])))
    );
}

#[test]
fn to_float_is_inserted_where_int_meets_float() {
    // Alibi example: slopes[h] * (k - q)
    let s = spec("params: { slopes: [f32; heads] }, score: s + slopes[h] * (k - q)");
    let want = bin(
        BinOp::Add,
        var(Var::S),
        bin(
            BinOp::Mul,
            E::Index(0, vec![var(Var::H)]),
            tf(bin(BinOp::Sub, var(Var::K), var(Var::Q))),
        ),
    );
    assert_eq!(s.score, Some(want));
    // `/` always promotes both sides; an int score is promoted as a whole.
    let s = spec("score: q / k");
    assert_eq!(
        s.score,
        Some(bin(BinOp::Div, tf(var(Var::Q)), tf(var(Var::K))))
    );
    let s = spec("score: q - k");
    assert_eq!(s.score, Some(tf(bin(BinOp::Sub, var(Var::Q), var(Var::K)))));
    // Comparisons, min/max and select branches.
    let s = spec("mask: s_ok < 0.5, params: { s_ok: i32 }");
    assert_eq!(
        s.mask,
        Some(bin(BinOp::Lt, tf(E::Scalar(0)), E::float(0.5)))
    );
    let s = spec("score: max(s, 0)");
    assert_eq!(
        s.score,
        Some(E::Call(Func::Max, vec![var(Var::S), E::float(0.0)]))
    );
    let s = spec("score: if q == k { s } else { 0 }");
    assert_eq!(
        s.score,
        Some(E::Select(
            Box::new(bin(BinOp::Eq, var(Var::Q), var(Var::K))),
            Box::new(var(Var::S)),
            Box::new(E::float(0.0)),
        ))
    );
    let s = spec("score: exp(q)");
    assert_eq!(s.score, Some(E::Call(Func::Exp, vec![tf(var(Var::Q))])));
}

#[test]
fn two_dimensional_index_in_both_spellings() {
    let a = spec("params: { bias: [f32; heads, 256] }, score: s + bias[h, q - k]");
    let b = spec("params: { bias: [f32; heads, 256] }, score: s + bias[h][q - k]");
    assert_eq!(a, b);
    let want = E::Index(
        0,
        vec![var(Var::H), bin(BinOp::Sub, var(Var::Q), var(Var::K))],
    );
    assert_eq!(a.score, Some(bin(BinOp::Add, var(Var::S), want)));
    let c = spec("params: { d: [i32; batch, seq] }, mask: d[b, q] == d[b, k]");
    assert_eq!(
        c.params[0].kind,
        ParamKind::Tensor {
            elem: ScalarTy::I32,
            dims: vec![Dim::Batch, Dim::Seq]
        }
    );
}

#[test]
fn params_and_scale() {
    let s = spec("scale: 1.0 / 8, params: { a: f32, b2: i32, t: [f32; batch, heads, seq, 4] }");
    assert_eq!(s.scale, Some(F64Bits::new(0.125)));
    assert_eq!(s.params.len(), 3);
    assert_eq!(s.params[1].kind, ParamKind::Scalar(ScalarTy::I32));
    assert_eq!(
        s.params[2].kind,
        ParamKind::Tensor {
            elem: ScalarTy::F32,
            dims: vec![Dim::Batch, Dim::Heads, Dim::Seq, Dim::Fixed(4)]
        }
    );
    assert_eq!(spec("scale: 2").scale, Some(F64Bits::new(2.0)));
}

fn has(errs: &[String], needle: &str) {
    assert!(
        errs.iter().any(|e| e.contains(needle)),
        "no `{needle}` in {errs:#?}"
    );
}

#[test]
fn diagnostics() {
    let one = |body: &str, needle: &str| {
        let errs = errors(body);
        assert_eq!(errs.len(), 1, "{body}: {errs:#?}");
        has(&errs, needle);
    };
    one("mask: q < k, mask: causal", "duplicate key `mask`");
    one("window: 3", "unknown key `window`");
    one("scale: 0", "scale must be positive and finite; got 0");
    one("scale: -1.5", "scale must be positive and finite; got -1.5");
    one("scale: q", "scale must be a constant number");
    one("scale: 1 % 0", "the divisor of `%` is the constant zero");
    one("mask: s > 0.0", "`s` (the score) cannot be used in `mask`");
    one("mask: q - k", "mask must be a bool expression; got int");
    one("score: q < k", "score must be a number");
    one("mask: foo < 1", "unknown identifier `foo`");
    one("score: gelu(s)", "unknown function `gelu`");
    one(
        "score: tanh(s, 2.0)",
        "`tanh` takes 1 argument, as in `tanh(x)`; got 2",
    );
    one(
        "score: s + causal",
        "expected a number, found a bool expression",
    );
    one("mask: causal && q", "expected a bool, found int expression");
    one(
        "params: { d: [i32; seq] }, mask: d[q, k] == 0",
        "`d` has 1 dimension [seq] but is indexed with 2 indices",
    );
    one(
        "params: { d: [i32; seq] }, mask: d[q + 1] == 0",
        "dimension 1 of `d` is `seq` and must be indexed by exactly `q` or `k`",
    );
    one(
        "params: { d: [f32; heads] }, score: s + d[q]",
        "must be indexed by exactly `h`",
    );
    one(
        "params: { d: [f32; batch] }, score: s + d[h]",
        "must be indexed by exactly `b`",
    );
    one(
        "params: { c: f32 }, score: s + c[h]",
        "`c` is a scalar parameter and cannot be indexed",
    );
    one(
        "params: { d: [i32; seq] }, mask: d == 0",
        "`d` is a tensor parameter and must be indexed, like `d[q]`",
    );
    one(
        "params: { t: [f32; 16] }, score: s + t[s]",
        "index of `t` must be an integer; got a float expression",
    );
    one("mask: window(0)", "window size must be positive; got 0");
    one("mask: window(-4)", "window size must be positive; got -4");
    one("mask: false", "mask is always false");
    one("mask: !true", "mask is always false");
    one("mask: 1 > 2", "mask is always false");
    one("mask: causal && false", "mask is always false");
    one("params: { a: f32, a: i32 }", "duplicate parameter `a`");
    one(
        "params: { q: f32 }",
        "parameter `q` shadows the builtin variable `q`",
    );
    one(
        "params: { tanh: f32 }",
        "shadows the builtin function `tanh`",
    );
    one("score: s % 2", "`%` takes integer operands");
    one("params: { x: f64 }", "unknown parameter type `f64`");
    one("params: { x: [f32; rows] }", "unknown dimension `rows`");
    one(
        "params: { x: [f32; 0] }",
        "fixed dimension must be positive; got 0",
    );
    one(
        "score: if q < k { s } else { true }",
        "branches of `if` have different types",
    );
    let errs = parse_str("V { head_dim: 0, dtype: fp8 }").unwrap_err();
    assert_eq!(errs.len(), 2);
    has(
        &errs.iter().map(|d| d.message.clone()).collect::<Vec<_>>(),
        "got 0",
    );
    assert_eq!(
        errs[1].message,
        "unknown dtype `fp8`; fp8 inputs are declared `dtype: e4m3`"
    );
    let errs = parse_str("V { head_dim: 128, dtype: e5m2 }").unwrap_err();
    assert!(errs[0]
        .message
        .starts_with("e5m2 attention inputs are not supported"));
    let errs = parse_str("V { head_dim: 128, dtype: int8 }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "unknown dtype `int8`; expected bf16, f16 or e4m3"
    );
    // `e4m3`: fp8 inputs, a bf16 output.
    let v = parse_str("V { head_dim: 128, dtype: e4m3, mask: causal }").unwrap();
    use crate::fp8::{Fp8Format, Fp8Spec, Scaling};
    let fp8 = |scaling| {
        Some(Fp8Spec {
            format: Fp8Format::E4m3,
            scaling,
            qk_format: Fp8Format::E4m3,
            v_bf16: false,
            v_rows: false,
            v_scales: None,
        })
    };
    // Scales per block of 128 positions unless `scales:` says otherwise.
    assert_eq!(v[0].fp8, fp8(Scaling::PerBlock { rows: 128 }));
    for (text, want) in [
        ("per_block(128)", Scaling::PerBlock { rows: 128 }),
        ("per_block", Scaling::PerBlock { rows: 128 }),
        ("per_head", Scaling::PerHead),
        ("per_tensor", Scaling::PerTensor),
    ] {
        let v = parse_str(&format!(
            "V {{ head_dim: 128, dtype: e4m3, scales: {text} }}"
        ))
        .unwrap();
        assert_eq!(v[0].fp8, fp8(want), "{text}");
    }
    let errs = parse_str("V { head_dim: 128, dtype: e4m3, scales: per_block(64) }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "a scale block is one tile of the fp8 kernel, 128 positions; got 64"
    );
    let errs = parse_str("V { head_dim: 128, dtype: e4m3, scales: per_row }").unwrap_err();
    assert!(
        errs[0].message.starts_with("scales are `per_block(128)`"),
        "{}",
        errs[0].message
    );
    let errs = parse_str("V { head_dim: 128, dtype: bf16, scales: per_head }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "`scales` groups the scales of fp8 inputs; it needs `dtype: e4m3`"
    );
    assert_eq!(v[0].dtype, crate::spec::DType::Bf16);
    // `qk: int8`: int8 Q and K codes, V e4m3; only with `dtype: e4m3`, only int8 or e4m3.
    let v8 = parse_str("V { head_dim: 128, dtype: e4m3, qk: int8 }").unwrap();
    let f = v8[0].fp8.unwrap();
    assert_eq!((f.format, f.qk_format), (Fp8Format::E4m3, Fp8Format::Int8));
    assert_eq!(f.tag(), "e4m3_qkint8");
    let errs = parse_str("V { head_dim: 128, dtype: bf16, qk: int8 }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "`qk` picks the code format of fp8 Q and K; it needs `dtype: e4m3`"
    );
    // `v: bf16`: V in bf16 beside fp8 Q and K.
    let vb = parse_str("V { head_dim: 128, dtype: e4m3, qk: int8, v: bf16 }").unwrap();
    let f = vb[0].fp8.unwrap();
    assert!(f.v_bf16);
    assert_eq!(f.tag(), "e4m3_qkint8_vbf16");
    let errs = parse_str("V { head_dim: 128, dtype: f16, v: bf16 }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "`v` picks V's type beside fp8 Q and K; it needs `dtype: e4m3`"
    );
    let errs = parse_str("V { head_dim: 128, dtype: e4m3, v: f16 }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "unknown V type `f16`; expected bf16 or e4m3"
    );
    // `v_layout: rows`: V's e4m3 codes in rows, transposed by the kernel; not with `v: bf16`.
    let vr = parse_str("V { head_dim: 128, dtype: e4m3, v_layout: rows }").unwrap();
    let f = vr[0].fp8.unwrap();
    assert!(f.v_rows && !f.v_bf16);
    assert_eq!(f.tag(), "e4m3_vrows");
    let vt = parse_str("V { head_dim: 128, dtype: e4m3, v_layout: transposed }").unwrap();
    assert!(!vt[0].fp8.unwrap().v_rows);
    let errs = parse_str("V { head_dim: 128, dtype: e4m3, v_layout: columns }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "unknown V layout `columns`; expected rows or transposed"
    );
    let errs = parse_str("V { head_dim: 128, dtype: bf16, v_layout: rows }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "`v_layout` picks how fp8 V's codes are laid out; it needs `dtype: e4m3`"
    );
    let errs = parse_str("V { head_dim: 128, dtype: e4m3, v: bf16, v_layout: rows }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "`v_layout` lays out V's e4m3 codes; with `v: bf16` V is read in rows as it is"
    );
    // `v_scales`: V's scales grouped apart from Q's and K's, per channel included.
    let vc = parse_str("V { head_dim: 128, dtype: e4m3, v_scales: per_channel }").unwrap();
    let f = vc[0].fp8.unwrap();
    assert_eq!(f.v_scales, Some(crate::fp8::Scaling::PerChannel));
    assert_eq!(f.v_scaling(), crate::fp8::Scaling::PerChannel);
    assert_eq!(f.scaling, crate::fp8::Scaling::PerBlock { rows: 128 });
    assert!(f.v_fixed());
    assert_eq!(f.tag(), "e4m3_vchannel");
    let vh = parse_str("V { head_dim: 128, dtype: e4m3, v_scales: per_head }").unwrap();
    assert_eq!(vh[0].fp8.unwrap().tag(), "e4m3_vhead");
    // The same grouping as `scales` is none of its own: the variant is the plain one.
    let same = parse_str("V { head_dim: 128, dtype: e4m3, scales: per_head, v_scales: per_head }")
        .unwrap();
    let plain = parse_str("V { head_dim: 128, dtype: e4m3, scales: per_head }").unwrap();
    assert_eq!(same[0].fp8, plain[0].fp8);
    let vb =
        parse_str("V { head_dim: 128, dtype: e4m3, scales: per_head, v_scales: per_block(128) }")
            .unwrap();
    let f = vb[0].fp8.unwrap();
    assert!(!f.v_fixed() && f.tag() == "e4m3_vblock");
    let errs = parse_str("V { head_dim: 128, dtype: e4m3, scales: per_channel }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "per-channel scales are V's alone (`v_scales: per_channel`): Q·Kᵀ sums over the channels, so a channel's scale of Q or K cannot be taken out of the product"
    );
    let errs = parse_str("V { head_dim: 128, dtype: e4m3, v_scales: per_row }").unwrap_err();
    assert!(errs[0]
        .message
        .starts_with("V's scales are `per_block(128)`"));
    let errs = parse_str("V { head_dim: 128, dtype: bf16, v_scales: per_channel }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "`v_scales` groups the scales of fp8 V; it needs `dtype: e4m3`"
    );
    let errs =
        parse_str("V { head_dim: 128, dtype: e4m3, v: bf16, v_scales: per_channel }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "`v_scales` groups the scales of V's e4m3 codes; with `v: bf16` V has no scales"
    );
    let errs = parse_str("V { head_dim: 128, dtype: e4m3, qk: int4 }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "unknown Q/K code format `int4`; expected int8 or e4m3"
    );
    let errs = parse_str("V { head_dim: (192, 264), dtype: f16 }").unwrap_err();
    assert_eq!(
        errs[0].message,
        "v head dim must be a multiple of 8 in 8..=256; got 264"
    );
    let errs = parse_str("V { mask: causal }").unwrap_err();
    assert_eq!(errs.len(), 2);
    assert!(errs[0]
        .message
        .starts_with("missing required key `head_dim` in `V`"));
    assert!(errs[1]
        .message
        .starts_with("missing required key `dtype` in `V`"));
    // Errors in independent places are all reported.
    let errs = errors("params: { q: f32 }, mask: s > 0.0, score: gelu(s) + foo");
    assert_eq!(errs.len(), 4, "{errs:#?}");
}

#[test]
fn const_eval_folds_what_it_can() {
    assert_eq!(
        const_eval(&spec("mask: causal || true").mask.unwrap()),
        Some(Const::Bool(true))
    );
    assert_eq!(const_eval(&spec("mask: causal").mask.unwrap()), None);
    assert_eq!(
        const_eval(&spec("score: if 1 < 2 { 3 } else { q }").score.unwrap()),
        Some(Const::Float(3.0))
    );
}

#[test]
fn dropout_takes_a_constant_or_a_scalar_f32_param() {
    use crate::spec::{Dropout, F64Bits};
    assert_eq!(
        spec("dropout: 0.1").dropout,
        Some(Dropout::Const(F64Bits::new(0.1)))
    );
    assert_eq!(
        spec("dropout: 0").dropout,
        Some(Dropout::Const(F64Bits::new(0.0)))
    );
    assert_eq!(
        spec("dropout: 1.0 / 8.0").dropout,
        Some(Dropout::Const(F64Bits::new(0.125)))
    );
    assert_eq!(
        spec("params: { cap: f32, p: f32 }, score: softcap(s, cap), dropout: p").dropout,
        Some(Dropout::Param(1))
    );
    assert_eq!(spec("mask: causal").dropout, None);
}

#[test]
fn dropout_diagnostics_name_the_value_and_the_rule() {
    let one = |body: &str| {
        let e = errors(body);
        assert_eq!(e.len(), 1, "{body}: {e:?}");
        e[0].clone()
    };
    assert!(one("dropout: 1.0").contains("must lie in [0, 1); got 1"));
    assert!(one("dropout: -0.5").contains("must lie in [0, 1); got -0.5"));
    assert!(one("params: { p: i32 }, dropout: p")
        .contains("`p` must be a scalar `f32` probability; it is declared `i32`"));
    assert!(one("params: { p: [f32; heads] }, dropout: p").contains("not a tensor"));
    assert!(one("dropout: q").contains("constant probability like `0.1`"));
    assert!(one("dropout: rate").contains("unknown identifier `rate`"));
    assert!(
        one("dropout: true").contains("number"),
        "{}",
        one("dropout: true")
    );
    assert!(one("dropout: 0.1, dropout: 0.2").contains("duplicate key `dropout`"));
    assert!(one("dropout: 0.99999999").contains("as an f32; 0.99999999 rounds to 1"));
    assert!(one("params: { p: f32 }, score: s * p, dropout: p")
        .contains("`p` cannot also be read by `mask` or `score`"));
    assert!(one("params: { p: f32, dropout_seed: i32 }, dropout: p")
        .contains("`dropout_seed` is reserved with dropout"));
    // Without dropout the name is free.
    assert_eq!(spec("params: { dropout_seed: i32 }").dropout, None);
}

#[test]
fn sparsity_names_a_block_layout() {
    let s = spec(
        "params: { blocks: [i32; batch, heads, seq / 256, 6] }, mask: causal, sparsity: blocks,",
    );
    assert_eq!(
        s.params[0].kind,
        ParamKind::Tensor {
            elem: ScalarTy::I32,
            dims: vec![Dim::Batch, Dim::Heads, Dim::SeqBlocks(256), Dim::Fixed(6)]
        }
    );
    let sp = s.sparsity.expect("a layout");
    assert_eq!(
        (sp.param, sp.block, sp.slots, sp.per_batch, sp.per_head),
        (0, 256, 6, true, true)
    );
    let shared = spec("params: { blocks: [i32; seq / 128, 3] }, sparsity: blocks,");
    let sp = shared.sparsity.unwrap();
    assert_eq!(
        (sp.block, sp.slots, sp.per_batch, sp.per_head),
        (128, 3, false, false)
    );
}

#[test]
fn sparsity_diagnostics_name_the_value_and_the_rule() {
    let has = |body: &str, want: &str| {
        let e = errors(body);
        assert!(e.iter().any(|m| m.contains(want)), "{body}: {e:?}");
    };
    has("sparsity: blocks,", "unknown parameter `blocks`");
    has(
        "params: { blocks: [f32; seq / 128, 4] }, sparsity: blocks,",
        "must be an `i32` tensor",
    );
    has(
        "params: { n: i32 }, sparsity: n,",
        "must be an `i32` tensor",
    );
    has(
        "params: { blocks: [i32; seq, 4] }, sparsity: blocks,",
        "must have the dimensions `[(batch,) (heads,) seq / N, K]`",
    );
    has(
        "params: { blocks: [i32; heads, batch, seq / 128, 4] }, sparsity: blocks,",
        "it is declared `[heads, batch, seq / 128, 4]`",
    );
    has(
        "params: { blocks: [i32; seq / 64, 4] }, sparsity: blocks,",
        "blocks of 64 positions; a block must be a multiple of 128",
    );
    has(
        "params: { blocks: [i32; seq / 128, 4] }, sparsity: blocks + 1,",
        "sparsity names an `i32` tensor",
    );
    has(
        "params: { blocks: [i32; heads / 128, 4] }, sparsity: blocks,",
        "only `seq` can be divided into blocks",
    );
    has(
        "params: { blocks: [i32; seq / 0, 4] }, sparsity: blocks,",
        "a block size must be a positive plain integer",
    );
    has(
        "params: { blocks: [i32; seq / 128, 4] }, sparsity: blocks, sparsity: blocks,",
        "duplicate key `sparsity`",
    );
}
