//! The float64 backward reference checked against finite differences of the float64 forward
//! (loss `L = Σ dO∘O`) on every example variant, with GQA, fully masked rows and
//! `seq_q ≠ seq_k`; the numeric score derivatives it uses checked against the symbolic ones of
//! `deriv` (the two routes are independent, so each checks the other); and the plain
//! same-precision backward checked for its structure and its error.

use std::path::Path;

use flash_dsl::deriv::{score_gradient, ScoreGradient};
use flash_dsl::eval::{tensor_shape, Env, ParamValue, ParamValues, Point};
use flash_dsl::model::backward::{
    backward, backward_lowp, backward_stored_o, backward_with, element_offset, Gradients,
    ScoreDerivative,
};
use flash_dsl::model::reference::{forward, max_abs_diff, round_bf16, round_f16, Problem};
use flash_dsl::rng::SplitMix;
use flash_dsl::spec::{ParamKind, ScalarTy, VariantSpec};

/// Every declaration of `examples/variants/*.flash`, with its file stem.
fn examples() -> Vec<(String, VariantSpec)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/variants");
    let mut out = Vec::new();
    for (path, specs) in flash_dsl::files::load_flash_dir(&dir).unwrap() {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        out.extend(specs.into_iter().map(|s| (stem.clone(), s)));
    }
    assert!(out.len() >= 9, "only {} example variants", out.len());
    out
}

fn shrink(spec: &VariantSpec, dqk: u32, dv: u32) -> VariantSpec {
    VariantSpec {
        head_dim_qk: dqk,
        head_dim_v: dv,
        ..spec.clone()
    }
}

fn parse(body: &str) -> VariantSpec {
    let src = format!("pub T {{ head_dim: 16, dtype: bf16, {body} }}");
    flash_dsl::parse::parse_str(&src)
        .unwrap_or_else(|d| panic!("`{body}`: {}", d[0]))
        .remove(0)
}

/// A random problem with parameter values: `f32` scalars in `[0.5, 2)` (a soft cap that bends
/// scores of this size), `i32` scalars 2, `f32` tensors in `[-1, 1)`, `i32` tensors
/// non-decreasing document ids (a new one every 3 positions).
#[allow(clippy::too_many_arguments)]
fn problem(
    spec: &VariantSpec,
    batch: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    seed: u64,
) -> Problem {
    let mut rng = SplitMix(seed ^ 0xABCD);
    let sizes = flash_dsl::eval::Sizes {
        batch,
        heads: hq,
        seq_q: sq,
        seq_k: sk,
    };
    let vals = spec
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| match &p.kind {
            _ if flash_dsl::dropout::is_probability(spec, i) => ParamValue::Float(0.3),
            ParamKind::Scalar(ScalarTy::F32) => ParamValue::Float(0.5 + 1.5 * rng.uniform()),
            ParamKind::Scalar(ScalarTy::I32) => ParamValue::Int(2),
            ParamKind::Tensor { elem, dims } => {
                let len: usize = tensor_shape(dims, sizes).iter().product();
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
        .collect();
    Problem::random(spec, batch, hq, hkv, sq, sk, ParamValues(vals), seed)
}

fn dout_for(spec: &VariantSpec, p: &Problem, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix(seed ^ 0x5EED);
    let n = p.batch * p.seq_q * p.heads_q * spec.head_dim_v as usize;
    (0..n).map(|_| rng.uniform() * 2.0 - 1.0).collect()
}

fn loss(spec: &VariantSpec, p: &Problem, dout: &[f64]) -> f64 {
    forward(spec, p)
        .o
        .iter()
        .zip(dout)
        .map(|(o, d)| o * d)
        .sum()
}

fn assert_no_nan(g: &Gradients, what: &str) {
    let params = g.dparams.iter().flatten().flat_map(|v| match v {
        ParamValue::Float(x) => vec![*x],
        ParamValue::FloatTensor(xs) => xs.clone(),
        _ => vec![],
    });
    let all = g.dq.iter().chain(&g.dk).chain(&g.dv).copied().chain(params);
    for x in all {
        assert!(x.is_finite(), "{what}: non-finite gradient {x}");
    }
}

/// Central differences of the loss for every input element (q, k, v, every `f32` parameter
/// element), compared with `g`.
fn check_against_fd(spec: &VariantSpec, p: &Problem, dout: &[f64], g: &Gradients, what: &str) {
    const H: f64 = 1e-5;
    let close = |an: f64, num: f64| (an - num).abs() <= 1e-7 * (1.0 + an.abs());
    let fd = |perturb: &dyn Fn(&mut Problem, f64)| {
        let (mut a, mut b) = (p.clone(), p.clone());
        perturb(&mut a, H);
        perturb(&mut b, -H);
        (loss(spec, &a, dout) - loss(spec, &b, dout)) / (2.0 * H)
    };
    type Field = fn(&mut Problem) -> &mut Vec<f64>;
    let tensors: [(&str, &[f64], Field); 3] = [
        ("dq", &g.dq, |p| &mut p.q),
        ("dk", &g.dk, |p| &mut p.k),
        ("dv", &g.dv, |p| &mut p.v),
    ];
    for (name, grad, field) in tensors {
        assert_eq!(
            grad.len(),
            field(&mut p.clone()).len(),
            "{what}: {name} shape"
        );
        for (i, &an) in grad.iter().enumerate() {
            let num = fd(&|p, h| field(p)[i] += h);
            assert!(close(an, num), "{what}: {name}[{i}] = {an}, numeric {num}");
        }
    }
    for (param, (decl, grad)) in spec.params.iter().zip(&g.dparams).enumerate() {
        match (&decl.kind, grad) {
            (ParamKind::Scalar(ScalarTy::F32), Some(ParamValue::Float(an))) => {
                let num = fd(&|p, h| match &mut p.params.0[param] {
                    ParamValue::Float(x) => *x += h,
                    _ => unreachable!(),
                });
                assert!(
                    close(*an, num),
                    "{what}: d{} = {an}, numeric {num}",
                    decl.name
                );
            }
            (
                ParamKind::Tensor {
                    elem: ScalarTy::F32,
                    ..
                },
                Some(ParamValue::FloatTensor(an)),
            ) => {
                let ParamValue::FloatTensor(vals) = &p.params.0[param] else {
                    unreachable!()
                };
                assert_eq!(an.len(), vals.len(), "{what}: d{} shape", decl.name);
                for (i, &an) in an.iter().enumerate() {
                    let num = fd(&|p, h| match &mut p.params.0[param] {
                        ParamValue::FloatTensor(x) => x[i] += h,
                        _ => unreachable!(),
                    });
                    assert!(
                        close(an, num),
                        "{what}: d{}[{i}] = {an}, numeric {num}",
                        decl.name
                    );
                }
            }
            (ParamKind::Scalar(ScalarTy::I32) | ParamKind::Tensor { .. }, None) => {}
            // The dropout probability: not differentiable (the mask steps with it).
            (ParamKind::Scalar(ScalarTy::F32), None)
                if flash_dsl::dropout::is_probability(spec, param) => {}
            (kind, grad) => panic!(
                "{what}: param {} of {kind:?} has gradient {grad:?}",
                decl.name
            ),
        }
    }
}

/// (batch, heads_q, heads_kv, seq_q, seq_k): square, both rectangular ways, GQA and MQA.
const SHAPES: &[(usize, usize, usize, usize, usize)] = &[
    (1, 2, 2, 5, 5),
    (1, 2, 1, 3, 7),
    (2, 2, 1, 7, 3),
    (1, 4, 2, 4, 6),
    (1, 1, 1, 1, 1),
    (1, 2, 2, 6, 2),
];

#[test]
fn float64_backward_matches_finite_differences_on_every_example() {
    for (stem, spec) in examples() {
        for (n, &(b, hq, hkv, sq, sk)) in SHAPES.iter().enumerate() {
            let (dqk, dv) = if n % 2 == 0 { (16, 8) } else { (8, 16) };
            let spec = shrink(&spec, dqk, dv);
            let p = problem(&spec, b, hq, hkv, sq, sk, 31 + n as u64);
            let dout = dout_for(&spec, &p, n as u64);
            let g = backward(&spec, &p, &dout);
            let what = format!("{stem} shape {:?}", SHAPES[n]);
            assert_no_nan(&g, &what);
            check_against_fd(&spec, &p, &dout, &g, &what);
        }
    }
}

#[test]
fn nonlinear_parameter_use_matches_finite_differences() {
    let specs = [
        "params: { a: f32, t: [f32; heads, 8] }, mask: causal, \
         score: a * tanh(s / a) + t[h, q - k] * t[h, 0]",
        "params: { a: f32, u: [f32; seq] }, score: s * sigmoid(a * s) + u[q] * u[k] - exp(-a)",
        "params: { w: [f32; batch, heads] }, mask: q - k < 3, score: w[b, h] * s",
    ];
    for (n, body) in specs.iter().enumerate() {
        let spec = parse(body);
        for &(b, hq, hkv, sq, sk) in &SHAPES[..4] {
            let p = problem(&spec, b, hq, hkv, sq, sk, 7 + n as u64);
            let dout = dout_for(&spec, &p, 3);
            let g = backward(&spec, &p, &dout);
            assert_no_nan(&g, body);
            check_against_fd(&spec, &p, &dout, &g, body);
        }
    }
}

#[test]
fn gqa_sums_the_query_heads_of_each_group() {
    // The same problem with K/V repeated for every query head: its per-head dK/dV, summed over
    // each group, must be the GQA gradients.
    let spec = shrink(
        &examples().into_iter().find(|e| e.0 == "alibi").unwrap().1,
        8,
        8,
    );
    for hkv in [1, 2] {
        let p = problem(&spec, 2, 4, hkv, 5, 6, 3);
        let dout = dout_for(&spec, &p, 4);
        let g = backward(&spec, &p, &dout);
        let d = 8;
        let mut wide = p.clone();
        wide.heads_kv = p.heads_q;
        let expand = |x: &[f64]| {
            let mut out = Vec::new();
            for b in 0..p.batch {
                for j in 0..p.seq_k {
                    for h in 0..p.heads_q {
                        let src = ((b * p.seq_k + j) * p.heads_kv + p.kv_head(h)) * d;
                        out.extend_from_slice(&x[src..src + d]);
                    }
                }
            }
            out
        };
        wide.k = expand(&p.k);
        wide.v = expand(&p.v);
        let gw = backward(&spec, &wide, &dout);
        assert!(max_abs_diff(&g.dq, &gw.dq) < 1e-12);
        assert_eq!(g.dparams, gw.dparams);
        for (grad, wide_grad) in [(&g.dk, &gw.dk), (&g.dv, &gw.dv)] {
            let mut summed = vec![0.0; grad.len()];
            for b in 0..p.batch {
                for j in 0..p.seq_k {
                    for h in 0..p.heads_q {
                        let src = ((b * p.seq_k + j) * p.heads_q + h) * d;
                        let dst = ((b * p.seq_k + j) * p.heads_kv + p.kv_head(h)) * d;
                        for t in 0..d {
                            summed[dst + t] += wide_grad[src + t];
                        }
                    }
                }
            }
            assert!(max_abs_diff(grad, &summed) < 1e-12, "hkv {hkv}");
        }
    }
}

#[test]
fn fully_masked_rows_have_zero_gradients() {
    // Bottom-right causal with seq_q > seq_k: the first seq_q - seq_k queries see no key.
    let softcap = examples().into_iter().find(|e| e.0 == "softcap").unwrap().1;
    let spec = shrink(&softcap, 8, 8);
    let p = problem(&spec, 1, 2, 1, 6, 2, 9);
    let dout = dout_for(&spec, &p, 1);
    let g = backward(&spec, &p, &dout);
    assert_no_nan(&g, "causal 6x2");
    // Rows 0..4 see no key; row 4 sees one key, whose softmax is constant 1 (zero gradient
    // too, legitimately); row 5 sees two.
    for h in 0..2 {
        let row = |i: usize| &g.dq[((i * 2) + h) * 8..][..8];
        for i in 0..5 {
            assert!(
                row(i).iter().all(|x| *x == 0.0),
                "row {i} head {h}: {:?}",
                row(i)
            );
        }
        assert!(row(5).iter().any(|x| *x != 0.0), "row 5 head {h}");
    }
    check_against_fd(&spec, &p, &dout, &g, "causal 6x2");
    let low = backward_lowp(&spec, &p, &dout, round_bf16);
    assert_no_nan(&low, "lowp causal 6x2");
    assert!(low.dq[..4 * 2 * 8].iter().all(|x| *x == 0.0));
    // A mask nothing passes, and no keys at all.
    let never = parse("mask: q < 0");
    for (spec, sk) in [(&never, 4), (&shrink(&softcap, 16, 16), 0)] {
        let p = problem(spec, 1, 2, 2, 3, sk, 2);
        let dout = dout_for(spec, &p, 2);
        for g in [
            backward(spec, &p, &dout),
            backward_lowp(spec, &p, &dout, round_f16),
        ] {
            assert_no_nan(&g, "all masked");
            let params = g.dparams.iter().flatten().all(|v| match v {
                ParamValue::Float(x) => *x == 0.0,
                ParamValue::FloatTensor(xs) => xs.iter().all(|x| *x == 0.0),
                _ => false,
            });
            assert!(g.dq.iter().chain(&g.dk).chain(&g.dv).all(|x| *x == 0.0) && params);
        }
    }
}

/// The symbolic route: `∂Z/∂s` and `∂Z/∂θ` from `deriv`, evaluated by the CPU evaluator.
struct Symbolic(Option<ScoreGradient>);

impl ScoreDerivative for Symbolic {
    fn d_ds(&mut self, env: &Env, pt: &Point) -> f64 {
        self.0
            .as_ref()
            .map_or(1.0, |g| env.eval(&g.d_ds, pt).as_f64())
    }
    fn d_dparams(&mut self, env: &Env, pt: &Point, out: &mut Vec<(usize, usize, f64)>) {
        for t in self.0.iter().flat_map(|g| &g.params) {
            let offset = if t.index.is_empty() {
                0
            } else {
                element_offset(env, t.param, &t.index, pt).expect("read in range")
            };
            out.push((t.param, offset, env.eval(&t.d, pt).as_f64()));
        }
    }
}

fn assert_grads_close(a: &Gradients, b: &Gradients, tol: f64, what: &str) {
    let scale = |x: &[f64]| x.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (name, x, y) in [
        ("dq", &a.dq, &b.dq),
        ("dk", &a.dk, &b.dk),
        ("dv", &a.dv, &b.dv),
    ] {
        let err = max_abs_diff(x, y);
        assert!(err <= tol * scale(y), "{what}: {name} differs by {err}");
    }
    assert_eq!(a.dparams.len(), b.dparams.len());
    for (i, (x, y)) in a.dparams.iter().zip(&b.dparams).enumerate() {
        let (x, y) = match (x, y) {
            (Some(ParamValue::Float(x)), Some(ParamValue::Float(y))) => (vec![*x], vec![*y]),
            (Some(ParamValue::FloatTensor(x)), Some(ParamValue::FloatTensor(y))) => {
                (x.clone(), y.clone())
            }
            (None, None) => continue,
            other => panic!("{what}: param {i} gradients of different kinds {other:?}"),
        };
        let err = max_abs_diff(&x, &y);
        assert!(err <= tol * scale(&y), "{what}: param {i} differs by {err}");
    }
}

#[test]
fn symbolic_and_numeric_score_derivatives_agree() {
    let mut specs: Vec<(String, VariantSpec)> = examples()
        .into_iter()
        .map(|(stem, s)| (stem, shrink(&s, 16, 16)))
        .collect();
    for body in [
        "params: { a: f32, t: [f32; heads, 8] }, mask: causal, \
         score: a * tanh(s / a) + t[h, q - k] * t[h, 0]",
        "params: { a: f32, u: [f32; seq] }, score: s * sigmoid(a * s) + u[q] * u[k] / (2.0 + a)",
        "params: { a: f32 }, score: log(1.0 + exp(s * a)) + sqrt(a + s * s)",
    ] {
        specs.push((body.to_string(), parse(body)));
    }
    for (what, spec) in specs {
        for (n, &(b, hq, hkv, sq, sk)) in SHAPES.iter().enumerate() {
            let p = problem(&spec, b, hq, hkv, sq, sk, 100 + n as u64);
            let dout = dout_for(&spec, &p, 5);
            let numeric = backward(&spec, &p, &dout);
            let symbolic = backward_with(&spec, &p, &dout, &mut Symbolic(score_gradient(&spec)));
            assert_grads_close(&symbolic, &numeric, 1e-9, &what);
        }
    }
}

#[test]
fn lowp_backward_without_rounding_is_the_float64_backward() {
    // With the identity as rounding, only f32 arithmetic separates the two: this checks the
    // structure of the plain backward (GQA sums, scale, softmax backward) apart from its error.
    for (stem, spec) in examples() {
        let spec = shrink(&spec, 16, 16);
        for (n, &(b, hq, hkv, sq, sk)) in SHAPES.iter().enumerate() {
            let p = problem(&spec, b, hq, hkv, sq, sk, 50 + n as u64);
            let dout = dout_for(&spec, &p, 6);
            let exact = backward(&spec, &p, &dout);
            let f32_only = backward_lowp(&spec, &p, &dout, |x| x);
            assert_grads_close(&f32_only, &exact, 1e-5, &stem);
        }
    }
}

#[test]
fn stored_o_moves_d_only() {
    // With the exact O stored, the gradients are the float64 backward's; with O rounded to
    // bf16, dV (which does not read D) is unchanged and dQ, dK move — by exactly the D-term:
    // on a row whose only visible keys are two, the exact D and the rounded one differ.
    for (stem, spec) in examples() {
        let spec = shrink(&spec, 16, 16);
        let p = problem(&spec, 1, 4, 2, 17, 33, 11);
        let dout = dout_for(&spec, &p, 12);
        let exact = backward(&spec, &p, &dout);
        let o = forward(&spec, &p).o;
        let same = backward_stored_o(&spec, &p, &dout, &o);
        assert_grads_close(&same, &exact, 1e-12, &stem);
        let rounded: Vec<f64> = o.iter().map(|&x| round_bf16(x as f32) as f64).collect();
        let moved = backward_stored_o(&spec, &p, &dout, &rounded);
        assert_eq!(moved.dv, exact.dv, "{stem}: dV reads no D");
        assert!(
            max_abs_diff(&moved.dq, &exact.dq) > 0.0 && max_abs_diff(&moved.dq, &exact.dq) < 0.05,
            "{stem}: dQ moves a little"
        );
    }
}

#[test]
fn lowp_backward_error_is_small_and_ordered_by_precision() {
    for (stem, spec) in examples() {
        let spec = shrink(&spec, 64, 64);
        let p = problem(&spec, 1, 4, 2, 17, 33, 3);
        let dout = dout_for(&spec, &p, 8);
        let exact = backward(&spec, &p, &dout);
        let scale = |x: &[f64]| x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let err = |g: &Gradients| {
            [(&g.dq, &exact.dq), (&g.dk, &exact.dk), (&g.dv, &exact.dv)]
                .map(|(x, y)| max_abs_diff(x, y) / scale(y))
        };
        let (bf, half) = (
            err(&backward_lowp(&spec, &p, &dout, round_bf16)),
            err(&backward_lowp(&spec, &p, &dout, round_f16)),
        );
        for t in 0..3 {
            assert!(bf[t] > 0.0 && bf[t] < 0.05, "{stem}: bf16 error {bf:?}");
            assert!(
                half[t] > 0.0 && half[t] < bf[t],
                "{stem}: f16 {half:?} vs bf16 {bf:?}"
            );
        }
    }
}

#[test]
fn element_offsets_point_at_the_values_the_evaluator_reads() {
    let spec = parse(
        "params: { t: [f32; heads, 8], u: [f32; seq], w: [f32; batch, heads] }, \
         score: s + t[h, q - k] + u[k] + w[b, h]",
    );
    let p = problem(&spec, 2, 3, 3, 4, 6, 1);
    let env = Env::new(&spec, &p.params, p.sizes());
    let score = spec.score.as_ref().unwrap();
    let mut reads = Vec::new();
    score.visit(&mut |e| {
        if let flash_dsl::spec::Expr::Index(i, idx) = e {
            reads.push((*i, idx.clone(), e.clone()));
        }
    });
    assert_eq!(reads.len(), 3);
    for b in 0..2 {
        for h in 0..3 {
            for q in 0..4 {
                for k in 0..6 {
                    let pt = Point { b, h, q, k, s: 0.0 };
                    for (i, idx, e) in &reads {
                        let off = element_offset(&env, *i, idx, &pt).unwrap();
                        let ParamValue::FloatTensor(v) = &p.params.0[*i] else {
                            unreachable!()
                        };
                        assert_eq!(env.eval(e, &pt).as_f64(), v[off]);
                    }
                }
            }
        }
    }
    // Out of range on a `seq` dimension: no element (the forward could not have read it).
    let pt = Point {
        b: 0,
        h: 0,
        q: 0,
        k: 9,
        s: 0.0,
    };
    assert_eq!(element_offset(&env, reads[1].0, &reads[1].1, &pt), None);
}
