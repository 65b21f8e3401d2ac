//! The symbolic score derivatives of `deriv` checked against central differences of the CPU
//! evaluator: on every example variant with a score, on hand-written expressions covering each
//! rule and convention, and on random well-typed expressions (proptest). Also: the output is
//! simplified (no `* 1.0`, `+ 0.0`, …), well typed, parses back from its display, and
//! `simplify` preserves values. A snapshot records the displayed derivatives of the examples.

use std::path::Path;

use flash_dsl::deriv::{d_dparams, d_ds, display, score_gradient, simplify, ParamGrad};
use flash_dsl::eval::{tensor_shape, Env, ParamValue, ParamValues, Point, Sizes, Value};
use flash_dsl::model::backward::element_offset;
use flash_dsl::rng::SplitMix;
use flash_dsl::spec::{
    BinOp, Dim, Expr, Func, ParamDecl, ParamKind, ScalarTy, Ty, UnOp, Var, VariantSpec,
};
use proptest::prelude::*;

const SIZES: Sizes = Sizes {
    batch: 2,
    heads: 2,
    seq_q: 5,
    seq_k: 6,
};

/// Every declaration of `examples/variants/*.flash`, with its file stem.
fn examples() -> Vec<(String, VariantSpec)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/variants");
    let loaded = flash_dsl::files::load_flash_dir(&dir).unwrap();
    assert!(loaded.len() >= 9, "only {} example files", loaded.len());
    let mut out = Vec::new();
    for (path, specs) in loaded {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        out.extend(specs.into_iter().map(|s| (stem.clone(), s)));
    }
    out
}

/// The declaration the hand-written and generated expressions live in.
const PARAMS: &str = "a: f32, t: [f32; heads, 8], n: i32, u: [f32; seq]";

fn spec_with(score: &str) -> VariantSpec {
    let src =
        format!("pub T {{ head_dim: 64, dtype: bf16, params: {{ {PARAMS} }}, score: {score} }}");
    let mut specs = flash_dsl::parse::parse_str(&src)
        .unwrap_or_else(|d| panic!("`{score}` does not parse: {}", d[0]));
    specs.remove(0)
}

/// Parameter values: `f32` scalars in `[0.5, 2)`, `f32` tensors in `[-1, 1)`, `i32` scalars 3,
/// `i32` tensors small non-decreasing ids.
fn values(spec: &VariantSpec, rng: &mut SplitMix) -> ParamValues {
    ParamValues(
        spec.params
            .iter()
            .enumerate()
            .map(|(i, p)| match &p.kind {
                _ if flash_dsl::dropout::is_probability(spec, i) => ParamValue::Float(0.25),
                ParamKind::Scalar(ScalarTy::F32) => ParamValue::Float(0.5 + 1.5 * rng.uniform()),
                ParamKind::Scalar(ScalarTy::I32) => ParamValue::Int(3),
                ParamKind::Tensor { elem, dims } => {
                    let len = tensor_shape(dims, SIZES).iter().product();
                    match elem {
                        ScalarTy::F32 => ParamValue::FloatTensor(
                            (0..len).map(|_| rng.uniform() * 2.0 - 1.0).collect(),
                        ),
                        ScalarTy::I32 => {
                            ParamValue::IntTensor((0..len as i64).map(|i| i / 3).collect())
                        }
                    }
                }
            })
            .collect(),
    )
}

fn point(rng: &mut SplitMix) -> Point {
    Point {
        b: rng.below(SIZES.batch as u64) as i64,
        h: rng.below(SIZES.heads as u64) as i64,
        q: rng.below(SIZES.seq_q as u64) as i64,
        k: rng.below(SIZES.seq_k as u64) as i64,
        s: rng.uniform() * 4.0 - 2.0,
    }
}

/// Records the branch decisions of evaluating `e` at `pt` (signs of `abs` arguments, `min`/`max`
/// choices, `if` conditions), or `None` when the point is too near a kink or singularity for a
/// finite difference to mean anything, or a value is huge or not finite.
fn trace(env: &Env, e: &Expr, pt: &Point, out: &mut Vec<bool>) -> Option<()> {
    const NEAR: f64 = 1e-2;
    let val = env.eval(e, pt);
    if let Value::Float(v) = val {
        if !v.is_finite() || v.abs() > 1e4 {
            return None;
        }
    }
    let f = |x: &Expr| env.eval(x, pt).as_f64();
    let float = |x: &Expr| x.ty(&env.spec.params) == Ty::Float;
    match e {
        Expr::Select(c, a, b) => {
            if let Expr::Binary(_, x, y) = &**c {
                if float(x) && (f(x) - f(y)).abs() < NEAR {
                    return None;
                }
            }
            trace(env, c, pt, out)?;
            let taken = env.eval(c, pt).as_bool();
            out.push(taken);
            return trace(env, if taken { a } else { b }, pt, out);
        }
        Expr::Call(Func::Abs, xs) if float(&xs[0]) => {
            if f(&xs[0]).abs() < NEAR {
                return None;
            }
            out.push(f(&xs[0]) > 0.0);
        }
        Expr::Call(Func::Min | Func::Max, xs) if float(&xs[0]) => {
            if (f(&xs[0]) - f(&xs[1])).abs() < NEAR {
                return None;
            }
            out.push(f(&xs[0]) < f(&xs[1]));
        }
        Expr::Call(Func::Log | Func::Sqrt, xs) if f(&xs[0]) < NEAR => return None,
        Expr::Binary(BinOp::Div, _, y) if f(y).abs() < NEAR => return None,
        _ => {}
    }
    let mut children = Vec::new();
    match e {
        Expr::Index(_, xs) | Expr::Call(_, xs) => children.extend(xs),
        Expr::ToFloat(a) | Expr::Unary(_, a) => children.push(&**a),
        Expr::Binary(_, a, b) => children.extend([&**a, &**b]),
        _ => {}
    }
    // Stopping at the first unsafe child is fine: the whole point is then skipped.
    let ok = children
        .into_iter()
        .all(|c| trace(env, c, pt, out).is_some());
    ok.then_some(())
}

/// Five-point central difference of `f` at `x`, or `None` unless `f` is smooth on the stencil
/// (same branch decisions at every node, no singularity nearby). Returns `(f'(x), f(x))`.
fn fd(x: f64, f: impl Fn(f64) -> Option<(f64, Vec<bool>)>) -> Option<(f64, f64)> {
    let h = 1e-5 * x.abs().max(1.0);
    let h = (x + h) - x;
    let (f0, sig) = f(x)?;
    let at = |dx: f64| {
        let (v, s) = f(x + dx)?;
        (s == sig).then_some(v)
    };
    let (p1, m1, p2, m2) = (at(h)?, at(-h)?, at(2.0 * h)?, at(-2.0 * h)?);
    Some(((8.0 * (p1 - m1) - (p2 - m2)) / (12.0 * h), f0))
}

fn close(analytic: f64, numeric: f64, value: f64) -> bool {
    (analytic - numeric).abs() <= 1e-6 * (1.0 + analytic.abs() + value.abs())
}

fn eval_traced(env: &Env, e: &Expr, pt: &Point) -> Option<(f64, Vec<bool>)> {
    let mut sig = Vec::new();
    trace(env, e, pt, &mut sig)?;
    Some((env.eval(e, pt).as_f64(), sig))
}

/// Which `f32` parameter elements `e` reads at `pt`: `(param, flat offset)`, scalars at 0.
fn elements_read(env: &Env, e: &Expr, pt: &Point) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    e.visit(&mut |n| {
        let elem = match n {
            Expr::Scalar(i) if env.spec.params[*i].kind == ParamKind::Scalar(ScalarTy::F32) => {
                Some((*i, 0))
            }
            Expr::Index(i, idx) if n.ty(&env.spec.params) == Ty::Float => {
                element_offset(env, *i, idx, pt).map(|o| (*i, o))
            }
            _ => None,
        };
        if let Some(elem) = elem.filter(|e| !out.contains(e)) {
            out.push(elem);
        }
    });
    out
}

fn with_value(vals: &ParamValues, param: usize, offset: usize, x: f64) -> ParamValues {
    let mut vals = vals.clone();
    match &mut vals.0[param] {
        ParamValue::Float(v) => *v = x,
        ParamValue::FloatTensor(v) => v[offset] = x,
        other => panic!("not f32: {other:?}"),
    }
    vals
}

fn value_of(vals: &ParamValues, param: usize, offset: usize) -> f64 {
    match &vals.0[param] {
        ParamValue::Float(v) => *v,
        ParamValue::FloatTensor(v) => v[offset],
        other => panic!("not f32: {other:?}"),
    }
}

/// Checks `d_ds` and `d_dparams` of `e` against finite differences at `pt`. Returns how many
/// derivatives were compared (0 when the point is not smooth).
fn check_point(spec: &VariantSpec, e: &Expr, vals: &ParamValues, pt: &Point) -> usize {
    let env = Env::new(spec, vals, SIZES);
    let mut checked = 0;
    let ds = d_ds(e, &spec.params);
    let terms = d_dparams(e, &spec.params);
    let show = |d: &Expr| display(d, &spec.params);
    let src = display(e, &spec.params);
    if let Some((num, f0)) = fd(pt.s, |s| eval_traced(&env, e, &Point { s, ..*pt })) {
        let an = env.eval(&ds, pt).as_f64();
        assert!(
            close(an, num, f0),
            "d/ds of `{src}` at {pt:?}: symbolic `{}` = {an}, numeric {num}",
            show(&ds)
        );
        checked += 1;
    }
    // Per element: the sum of the terms whose index lands on it, against perturbing it.
    let mut elems = elements_read(&env, e, pt);
    let mut sums: Vec<((usize, usize), f64)> = Vec::new();
    for ParamGrad { param, index, d } in &terms {
        let off = if index.is_empty() {
            0
        } else {
            element_offset(&env, *param, index, pt).expect("index in range")
        };
        let v = env.eval(d, pt).as_f64();
        match sums.iter_mut().find(|(k, _)| *k == (*param, off)) {
            Some((_, s)) => *s += v,
            None => sums.push(((*param, off), v)),
        }
        if !elems.contains(&(*param, off)) {
            elems.push((*param, off));
        }
    }
    for (param, off) in elems {
        let x = value_of(vals, param, off);
        let num = fd(x, |x| {
            let vals = with_value(vals, param, off, x);
            eval_traced(&Env::new(spec, &vals, SIZES), e, pt)
        });
        if let Some((num, f0)) = num {
            let an = sums
                .iter()
                .find(|(k, _)| *k == (param, off))
                .map_or(0.0, |s| s.1);
            assert!(
                close(an, num, f0),
                "d/d{}[{off}] of `{src}` at {pt:?}: symbolic {an}, numeric {num}; terms {:?}",
                spec.params[param].name,
                terms.iter().map(|t| show(&t.d)).collect::<Vec<_>>()
            );
            checked += 1;
        }
    }
    checked
}

/// Whether `e` is well typed by the validator's rules; its type.
fn typecheck(e: &Expr, params: &[ParamDecl]) -> Option<Ty> {
    let t = |x: &Expr| typecheck(x, params);
    let num = |x: Option<Ty>| x.filter(|t| *t != Ty::Bool);
    Some(match e {
        Expr::Int(_) => Ty::Int,
        Expr::Float(_) => Ty::Float,
        Expr::Bool(_) => Ty::Bool,
        Expr::Var(v) => v.ty(),
        Expr::Scalar(_) => e.ty(params),
        Expr::Index(_, idx) => {
            for i in idx {
                (t(i)? == Ty::Int).then_some(())?;
            }
            e.ty(params)
        }
        Expr::ToFloat(a) => (t(a)? == Ty::Int).then_some(Ty::Float)?,
        Expr::Unary(UnOp::Neg, a) => num(t(a))?,
        Expr::Unary(UnOp::Not, a) => (t(a)? == Ty::Bool).then_some(Ty::Bool)?,
        Expr::Binary(op, a, b) => {
            let (x, y) = (t(a)?, t(b)?);
            match op {
                BinOp::Div => (x == Ty::Float && y == Ty::Float).then_some(Ty::Float)?,
                BinOp::Rem => (x == Ty::Int && y == Ty::Int).then_some(Ty::Int)?,
                BinOp::Add | BinOp::Sub | BinOp::Mul => (x == y).then_some(num(Some(x))?)?,
                BinOp::And | BinOp::Or => (x == Ty::Bool && y == Ty::Bool).then_some(Ty::Bool)?,
                _ => (x == y).then_some(Ty::Bool)?,
            }
        }
        Expr::Call(f, args) => {
            let tys: Option<Vec<Ty>> = args.iter().map(t).collect();
            let tys = tys?;
            match f {
                Func::Min | Func::Max => (tys[0] == tys[1]).then_some(num(Some(tys[0]))?)?,
                Func::Abs => num(Some(tys[0]))?,
                _ => (tys[0] == Ty::Float).then_some(Ty::Float)?,
            }
        }
        Expr::Select(c, a, b) => {
            let (c, x, y) = (t(c)?, t(a)?, t(b)?);
            (c == Ty::Bool && x == y).then_some(x)?
        }
    })
}

/// Fails on any node `simplify` should have removed.
fn assert_clean(e: &Expr, params: &[ParamDecl]) {
    let lit = |x: &Expr, v: f64| match x {
        Expr::Float(f) => f.get() == v,
        Expr::Int(i) => *i as f64 == v,
        _ => false,
    };
    let is_lit = |x: &Expr| matches!(x, Expr::Float(_) | Expr::Int(_));
    e.visit(&mut |n| {
        let bad = match n {
            Expr::Binary(BinOp::Mul, a, b) => [a, b]
                .iter()
                .any(|x| [1.0, 0.0, -1.0].iter().any(|v| lit(x, *v))),
            Expr::Binary(BinOp::Add, a, b) => lit(a, 0.0) || lit(b, 0.0),
            Expr::Binary(BinOp::Sub, a, b) => lit(a, 0.0) || lit(b, 0.0),
            Expr::Binary(BinOp::Div, a, b) => lit(a, 0.0) || lit(b, 1.0),
            Expr::Unary(UnOp::Neg, a) => matches!(**a, Expr::Unary(UnOp::Neg, _)) || is_lit(a),
            Expr::Select(c, a, b) => a == b || matches!(**c, Expr::Bool(_)),
            Expr::ToFloat(a) => matches!(**a, Expr::Int(_)),
            _ => false,
        };
        let folded = match n {
            Expr::Binary(BinOp::Add | BinOp::Sub | BinOp::Mul, a, b) => is_lit(a) && is_lit(b),
            _ => false,
        };
        assert!(
            !bad && !folded,
            "unsimplified `{}` in `{}`",
            display(n, params),
            display(e, params)
        );
    });
}

/// Everything a derivative must be: simplified, float typed, displayable and re-parsable.
fn check_output(spec: &VariantSpec, d: &Expr) {
    assert_clean(d, &spec.params);
    assert_eq!(typecheck(d, &spec.params), Some(Ty::Float), "{d:?}");
    assert_eq!(d.ty(&spec.params), Ty::Float);
}

/// `display(e)` parses back (in a declaration with the same params) to a tree that evaluates
/// to the same value.
fn check_round_trip(spec: &VariantSpec, e: &Expr, vals: &ParamValues, pts: &[Point]) {
    let params: Vec<String> = spec
        .params
        .iter()
        .map(|p| match &p.kind {
            ParamKind::Scalar(t) => format!("{}: {}", p.name, t.name()),
            ParamKind::Tensor { elem, dims } => {
                let dims: Vec<String> = dims
                    .iter()
                    .map(|d| match d {
                        Dim::Fixed(n) => n.to_string(),
                        d => format!("{d:?}").to_lowercase(), // batch, heads, seq
                    })
                    .collect();
                format!("{}: [{}; {}]", p.name, elem.name(), dims.join(", "))
            }
        })
        .collect();
    let text = display(e, &spec.params);
    let src = format!(
        "pub R {{ head_dim: 64, dtype: bf16, params: {{ {} }}, score: {text} }}",
        params.join(", ")
    );
    let back = flash_dsl::parse::parse_str(&src)
        .unwrap_or_else(|d| panic!("`{text}` does not parse back: {}", d[0]))
        .remove(0);
    let env = Env::new(spec, vals, SIZES);
    for pt in pts {
        let x = env.eval(e, pt).as_f64();
        let y = Env::new(&back, vals, SIZES).score(pt);
        assert!(
            x == y || (x.is_nan() && y.is_nan()),
            "`{text}` reparsed evaluates to {y}, the tree to {x}"
        );
    }
}

#[test]
fn example_variants_match_finite_differences() {
    let mut with_score = 0;
    for (stem, spec) in examples() {
        let Some(score) = &spec.score else {
            assert!(score_gradient(&spec).is_none(), "{stem}");
            continue;
        };
        with_score += 1;
        let g = score_gradient(&spec).unwrap();
        assert_eq!(g.d_ds, d_ds(score, &spec.params));
        check_output(&spec, &g.d_ds);
        for t in &g.params {
            check_output(&spec, &t.d);
            let kind = &spec.params[t.param].kind;
            let f32_param = matches!(
                kind,
                ParamKind::Scalar(ScalarTy::F32)
                    | ParamKind::Tensor {
                        elem: ScalarTy::F32,
                        ..
                    }
            );
            assert!(f32_param, "{stem}: gradient term for {kind:?}");
        }
        let mut rng = SplitMix(0xD5 + with_score);
        let (mut checked, mut pts) = (0, Vec::new());
        for _ in 0..60 {
            let vals = values(&spec, &mut rng);
            let pt = point(&mut rng);
            checked += check_point(&spec, score, &vals, &pt);
            pts.push(pt);
        }
        // Every point of these smooth scores is checked, for s and every parameter read.
        let reads = 1 + g.params.len();
        assert!(checked >= 60 * reads, "{stem}: only {checked} checks");
        let vals = values(&spec, &mut rng);
        check_round_trip(&spec, &g.d_ds, &vals, &pts);
        for t in &g.params {
            check_round_trip(&spec, &t.d, &vals, &pts);
        }
    }
    assert_eq!(
        with_score, 4,
        "alibi, relative_bias, softcap, softcap_window"
    );
}

#[test]
fn example_derivatives_snapshot() {
    use std::fmt::Write;
    let mut text = String::new();
    for (stem, spec) in examples() {
        let (Some(score), Some(g)) = (&spec.score, score_gradient(&spec)) else {
            writeln!(text, "{stem} ({}): no score, dZ/ds = 1", spec.name).unwrap();
            continue;
        };
        let show = |e: &Expr| display(e, &spec.params);
        writeln!(text, "{stem} ({}): Z = {}", spec.name, show(score)).unwrap();
        writeln!(text, "  dZ/ds = {}", show(&g.d_ds)).unwrap();
        for t in &g.params {
            let idx: Vec<String> = t.index.iter().map(show).collect();
            let at = if idx.is_empty() {
                String::new()
            } else {
                format!("[{}]", idx.join(", "))
            };
            let name = &spec.params[t.param].name;
            writeln!(text, "  dZ/d{name}{at} = {}", show(&t.d)).unwrap();
        }
    }
    insta::assert_snapshot!("example_derivatives", text);
}

/// One expression per rule and shorthand, and combinations of them, `;`-separated.
const RULES: &str = "\
    s + a; s - t[h, 3]; a - s; s * a; a * s * s; s / a; a / s; -s; -(s * a); exp(s * a); \
    log(s + 3.0); log(a) * s; tanh(s * a); sigmoid(s - a); sqrt(s + 2.5); sqrt(a * s * s + 1.0); \
    abs(s); abs(s - a) * a; min(s, a); max(s, t[h, q - k]); min(s * s, 1.0) + max(a, s); \
    if s > 0.0 { s * s } else { a * s }; if q < k { exp(s) } else { t[h, q - k] * s }; \
    if a > 1.0 { s } else { -s }; s * (k - q); s * n; s + n * a; s + alibi(t[h, 0]); \
    softcap(s, a); clamp(s, -a, a); a * tanh(s / a) + t[h, q - k] * t[h, 0]; s + u[q] * u[k]; \
    exp(-abs(s - a)) / (1.0 + u[k] * u[k]); s / (1.0 + exp(-s)); \
    if s < a { s } else if s < 2.0 * a { a } else { s - a };";

#[test]
fn each_rule_matches_finite_differences() {
    let rules = RULES.split(';').map(str::trim).filter(|r| !r.is_empty());
    for (i, src) in rules.enumerate() {
        let spec = spec_with(src);
        let e = spec.score.clone().unwrap();
        let g = score_gradient(&spec).unwrap();
        check_output(&spec, &g.d_ds);
        g.params.iter().for_each(|t| check_output(&spec, &t.d));
        let mut rng = SplitMix(1000 + i as u64);
        let (mut checked, mut pts) = (0, Vec::new());
        for _ in 0..40 {
            let vals = values(&spec, &mut rng);
            let pt = point(&mut rng);
            checked += check_point(&spec, &e, &vals, &pt);
            pts.push(pt);
        }
        assert!(
            checked >= 40,
            "`{src}`: only {checked} derivatives compared"
        );
        let vals = values(&spec, &mut rng);
        check_round_trip(&spec, &g.d_ds, &vals, &pts);
        g.params
            .iter()
            .for_each(|t| check_round_trip(&spec, &t.d, &vals, &pts));
    }
}

fn derivative_text(src: &str) -> (String, Vec<String>) {
    let spec = spec_with(src);
    let g = score_gradient(&spec).unwrap();
    let terms = g
        .params
        .iter()
        .map(|t| {
            let idx: Vec<String> = t.index.iter().map(|x| display(x, &spec.params)).collect();
            format!(
                "{}[{}]: {}",
                spec.params[t.param].name,
                idx.join(", "),
                display(&t.d, &spec.params)
            )
        })
        .collect();
    (display(&g.d_ds, &spec.params), terms)
}

#[test]
fn derivatives_have_the_expected_form() {
    let cases = [
        ("a * tanh(s / a)", "1.0 - tanh(s / a) * tanh(s / a)"),
        ("softcap(s, 30.0)", "1.0 - tanh(s / 30.0) * tanh(s / 30.0)"),
        ("exp(s)", "exp(s)"),
        ("s * 2.0 + 1.0", "2.0"),
        (
            "abs(s)",
            "if s > 0.0 { 1.0 } else if s < 0.0 { -1.0 } else { 0.0 }",
        ),
        ("min(s, a)", "if s <= a { 1.0 } else { 0.0 }"),
        ("max(a, s)", "if a >= s { 0.0 } else { 1.0 }"),
        ("sqrt(s)", "1.0 / (2.0 * sqrt(s))"),
        ("log(s)", "1.0 / s"),
        ("sigmoid(s)", "sigmoid(s) * (1.0 - sigmoid(s))"),
        (
            "tanh(2.0 * s)",
            "(1.0 - tanh(2.0 * s) * tanh(2.0 * s)) * 2.0",
        ),
        ("s + (k - q)", "1.0"),
        ("-s", "-1.0"),
        ("s * (k - q)", "k - q"),
        ("s * n", "n"),
        (
            "if s > 0.0 { s } else { 0.5 * s }",
            "if s > 0.0 { 1.0 } else { 0.5 }",
        ),
        ("if q < k { s } else { s + a }", "1.0"),
        ("s / a", "1.0 / a"),
        ("a / s", "-(a / s / s)"),
        ("t[h, 0]", "0.0"),
    ];
    for (src, want) in cases {
        assert_eq!(derivative_text(src).0, want, "d/ds of `{src}`");
    }
    let params = [
        (
            "s + alibi(t[h, 0])",
            vec!["t[h, 0]: k - (q + (seq_k - seq_q))"],
        ),
        ("s + t[h, q - k]", vec!["t[h, q - k]: 1.0"]),
        ("s * a", vec!["a[]: s"]),
        ("s + a * a", vec!["a[]: a + a"]),
        (
            "t[h, q - k] * t[h, 0]",
            vec!["t[h, q - k]: t[h, 0]", "t[h, 0]: t[h, q - k]"],
        ),
        ("if a > 1.0 { s } else { -s }", vec![]),
        ("s + n * (k - q)", vec![]),
        ("s * u[q] - u[k]", vec!["u[q]: s", "u[k]: -1.0"]),
    ];
    for (src, want) in params {
        assert_eq!(derivative_text(src).1, want, "param terms of `{src}`");
    }
}

/// Values and the chosen derivatives at `pt` with parameter `a` set to `a`.
fn at_kink(src: &str, s: f64, a: f64) -> (f64, Vec<f64>) {
    let spec = spec_with(src);
    let mut vals = values(&spec, &mut SplitMix(5));
    vals.0[0] = ParamValue::Float(a);
    let env = Env::new(&spec, &vals, SIZES);
    let pt = Point {
        b: 0,
        h: 1,
        q: 2,
        k: 2,
        s,
    };
    let g = score_gradient(&spec).unwrap();
    let terms = g
        .params
        .iter()
        .map(|t| env.eval(&t.d, &pt).as_f64())
        .collect();
    (env.eval(&g.d_ds, &pt).as_f64(), terms)
}

#[test]
fn conventions_at_kinks() {
    // sign(0) = 0: abs'(0) = 0.
    assert_eq!(at_kink("abs(s)", 0.0, 1.0).0, 0.0);
    assert_eq!(at_kink("abs(s - a)", 1.25, 1.25), (0.0, vec![0.0]));
    // Ties of min/max: the first argument takes the derivative.
    assert_eq!(at_kink("min(s, a)", 1.5, 1.5), (1.0, vec![0.0]));
    assert_eq!(at_kink("min(a, s)", 1.5, 1.5), (0.0, vec![1.0]));
    assert_eq!(at_kink("max(s, a)", 1.5, 1.5), (1.0, vec![0.0]));
    assert_eq!(at_kink("max(a, s)", 1.5, 1.5), (0.0, vec![1.0]));
    // `if`: the branch the forward pass takes, also on its boundary.
    let src = "if s >= 0.5 { 2.0 * s } else { 3.0 * s }";
    assert_eq!(at_kink(src, 0.5, 1.0).0, 2.0);
    assert_eq!(at_kink(src, 0.5 - 1e-12, 1.0).0, 3.0);
    // sqrt at 0: infinite, like the math; not clamped.
    assert_eq!(at_kink("sqrt(s)", 0.0, 1.0).0, f64::INFINITY);
}

#[test]
fn reads_at_two_index_tuples_are_two_terms_that_sum_on_aliasing() {
    // At q == k both reads are the element t[h, 0]; the two terms must add up to its derivative.
    let spec = spec_with("t[h, q - k] * t[h, 0] + s");
    let e = spec.score.clone().unwrap();
    let terms = d_dparams(&e, &spec.params);
    assert_eq!(terms.len(), 2);
    let mut rng = SplitMix(77);
    for q in 0..3 {
        let vals = values(&spec, &mut rng);
        let pt = Point {
            b: 0,
            h: 1,
            q,
            k: 0,
            s: 0.3,
        };
        let env = Env::new(&spec, &vals, SIZES);
        let offs: Vec<usize> = terms
            .iter()
            .map(|t| element_offset(&env, 1, &t.index, &pt).unwrap())
            .collect();
        assert_eq!(offs[0] == offs[1], q == 0);
        assert_eq!(
            check_point(&spec, &e, &vals, &pt),
            if q == 0 { 2 } else { 3 }
        );
    }
}

#[test]
fn simplify_folds_identities_and_keeps_values() {
    let cases = [
        ("s * 1.0 + 0.0", "s"),
        ("1.0 * s - 0.0", "s"),
        ("0.0 - s", "-s"),
        ("-(-s)", "s"),
        ("-(s - a)", "a - s"),
        ("0.0 * exp(s) + a", "a"),
        ("2.0 * 3.0 + s", "6.0 + s"),
        ("(2 + 3) * s", "5.0 * s"),
        ("if q < k { s } else { s }", "s"),
        ("if 1 < 2 { s } else { a }", "s"),
        ("if !(q < k) { s } else { a }", "if q < k { a } else { s }"),
        (
            "if q < k && true { s } else { a }",
            "if q < k { s } else { a }",
        ),
        (
            "if false || q < k { s } else { a }",
            "if q < k { s } else { a }",
        ),
        ("s / 1.0", "s"),
        ("s * -1.0", "-s"),
        ("s - -a", "s + a"),
        ("-s + a", "a - s"),
        ("-s * a", "-(s * a)"),
        ("a * (s / a)", "s"),
        ("s * (1.0 / a)", "s / a"),
        ("exp(0.0) * s", "s"),
        ("t[h, 1 + 2] * s", "t[h, 3] * s"),
        ("abs(-2) + max(1, 4) % 3 + s", "3.0 + s"),
        ("s / 4.0 + 1.0 / 3.0", "s / 4.0 + 1.0 / 3.0"),
        ("s * (1.0 / 4.0)", "s * 0.25"),
        ("s + sigmoid(0.0)", "s + 0.5"),
    ];
    let mut rng = SplitMix(3);
    for (src, want) in cases {
        let spec = spec_with(src);
        let e = spec.score.clone().unwrap();
        let simple = simplify(e.clone());
        assert_eq!(display(&simple, &spec.params), want, "simplify `{src}`");
        assert_clean(&simple, &spec.params);
        assert_eq!(
            simplify(simple.clone()),
            simple,
            "not idempotent on `{src}`"
        );
        for _ in 0..20 {
            let vals = values(&spec, &mut rng);
            let pt = point(&mut rng);
            let env = Env::new(&spec, &vals, SIZES);
            let (x, y) = (env.eval(&e, &pt).as_f64(), env.eval(&simple, &pt).as_f64());
            assert!(
                (x - y).abs() <= 1e-12 * x.abs().max(1.0),
                "`{src}`: {x} vs {y}"
            );
        }
    }
    // Non-finite folds are refused: the language has no literal for them. (A constant zero
    // divisor is a validation error, so the tree is built by hand.)
    let spec = spec_with("s + 1.0 / 2.0");
    let score = Expr::bin(
        BinOp::Add,
        Expr::Var(Var::S),
        Expr::bin(BinOp::Div, Expr::float(1.0), Expr::float(0.0)),
    );
    assert_eq!(display(&simplify(score), &spec.params), "s + 1.0 / 0.0");
}

#[test]
fn no_score_and_integer_params_give_nothing_to_differentiate() {
    for (stem, spec) in examples() {
        if spec.score.is_none() {
            assert_eq!(score_gradient(&spec), None, "{stem}");
        }
    }
    let spec = spec_with("s + n * (k - q)");
    let g = score_gradient(&spec).unwrap();
    assert_eq!(g.d_ds, Expr::float(1.0));
    assert!(g.params.is_empty());
}

// Random well-typed float expressions of `s`, `a`, `t[..]`, `u[..]`, `n` and positions, in the
// parameter layout of `PARAMS` (a = 0, t = 1, n = 2, u = 3).
fn leaf() -> impl Strategy<Value = Expr> {
    let (h, q, k) = (Expr::Var(Var::H), Expr::Var(Var::Q), Expr::Var(Var::K));
    let dist = Expr::bin(BinOp::Sub, q.clone(), k.clone());
    prop_oneof![
        3 => Just(Expr::Var(Var::S)),
        2 => Just(Expr::Scalar(0)),
        1 => (0i64..8).prop_map(move |j| Expr::Index(1, vec![Expr::Var(Var::H), Expr::Int(j)])),
        1 => Just(Expr::Index(1, vec![h, dist.clone()])),
        1 => Just(Expr::Index(3, vec![q])),
        1 => Just(Expr::Index(3, vec![k])),
        2 => (-8i32..8).prop_map(|v| Expr::float(v as f64 / 4.0)),
        1 => Just(Expr::ToFloat(Box::new(dist))),
        1 => Just(Expr::ToFloat(Box::new(Expr::Scalar(2)))),
    ]
}

fn expr() -> impl Strategy<Value = Expr> {
    use BinOp::*;
    leaf().prop_recursive(4, 24, 3, |inner| {
        let funcs = [
            Func::Exp,
            Func::Log,
            Func::Tanh,
            Func::Sigmoid,
            Func::Sqrt,
            Func::Abs,
        ];
        prop_oneof![
            (inner.clone(), inner.clone(), 0..4usize).prop_map(|(a, b, op)| Expr::bin(
                [Add, Sub, Mul, Div][op],
                a,
                b
            )),
            inner
                .clone()
                .prop_map(|a| Expr::Unary(UnOp::Neg, Box::new(a))),
            (inner.clone(), 0..funcs.len()).prop_map(move |(a, f)| Expr::Call(funcs[f], vec![a])),
            (inner.clone(), inner.clone(), any::<bool>()).prop_map(|(a, b, m)| Expr::Call(
                if m { Func::Min } else { Func::Max },
                vec![a, b]
            )),
            (
                inner.clone(),
                inner.clone(),
                inner.clone(),
                inner,
                any::<bool>()
            )
                .prop_map(|(x, y, a, b, lt)| Expr::Select(
                    Box::new(Expr::bin(if lt { Lt } else { Gt }, x, y)),
                    Box::new(a),
                    Box::new(b)
                )),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_expressions_match_finite_differences(e in expr(), seed in any::<u64>()) {
        let spec = spec_with("s");
        prop_assert_eq!(typecheck(&e, &spec.params), Some(Ty::Float));
        let ds = d_ds(&e, &spec.params);
        check_output(&spec, &ds);
        for t in d_dparams(&e, &spec.params) {
            check_output(&spec, &t.d);
        }
        let simple = simplify(e.clone());
        assert_clean(&simple, &spec.params);
        let mut rng = SplitMix(seed);
        for _ in 0..4 {
            let vals = values(&spec, &mut rng);
            let pt = point(&mut rng);
            check_point(&spec, &e, &vals, &pt);
            let env = Env::new(&spec, &vals, SIZES);
            let (x, y) = (env.eval(&e, &pt).as_f64(), env.eval(&simple, &pt).as_f64());
            if x.is_finite() && x.abs() < 1e6 {
                prop_assert!((x - y).abs() <= 1e-9 * x.abs().max(1.0), "{} vs {}", x, y);
            }
        }
    }
}

/// The property above skips points near kinks and singularities; make sure that leaves most
/// of the work done, so the property cannot pass by skipping everything.
#[test]
fn random_expressions_are_mostly_checked() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let spec = spec_with("s");
    let mut runner = TestRunner::deterministic();
    let mut rng = SplitMix(11);
    let (mut checked, mut possible) = (0, 0);
    for _ in 0..300 {
        let e = expr().new_tree(&mut runner).unwrap().current();
        let vals = values(&spec, &mut rng);
        let pt = point(&mut rng);
        let env = Env::new(&spec, &vals, SIZES);
        possible += 1 + elements_read(&env, &e, &pt).len();
        checked += check_point(&spec, &e, &vals, &pt);
    }
    assert!(
        checked * 10 >= possible * 6,
        "only {checked} of {possible} derivatives were compared"
    );
}
