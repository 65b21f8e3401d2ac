//! Naive CPU references of a variant's backward pass.
//!
//! - [`backward`] computes the gradients of `L = Σ dO∘O` in float64: the ground truth a
//!   gradient kernel is compared with.
//! - [`backward_lowp`] is the plain same-precision implementation of the FlashAttention
//!   correctness rule for gradients: a kernel's gradient error against [`backward`] is bounded by
//!   a multiple of the error this one has.
//!
//! The float64 reference is deliberately built **without** the symbolic derivatives of
//! [`crate::deriv`], so that the two can check each other: the softmax backward is the textbook
//! one, and the derivatives of the score expression `Z(s, θ)` are taken *numerically*, by
//! central differences of the one CPU evaluator ([`Env::eval`]). Per row of queries:
//!
//! ```text
//! P = softmax(Z) over the visible keys    dV += Pᵀ·dO      dP = dO·Vᵀ      D = rowsum(dO∘O)
//! dZ = P∘(dP − D)    dS = dZ·∂Z/∂s    dQ = scale·dS·K    dK += scale·dSᵀ·Q    dθ += dZ·∂Z/∂θ
//! ```
//!
//! [`backward_with`] takes the score derivatives from any [`ScoreDerivative`], which is how a
//! test swaps the symbolic route in. Layouts are those of [`crate::model::reference`]; with GQA,
//! `dK` and `dV` of a key/value head sum the contributions of every query head of its group.
//! A row with no visible key contributes nothing (no NaN), and neither does a key whose
//! probability is exactly 0 (for instance a score of `-inf`).

use crate::dropout::DropoutFactor;
use crate::eval::{Env, ParamValue, ParamValues, Point};
use crate::model::reference::{dot, visible_keys, Problem};
use crate::spec::{Dim, Expr, ParamKind, ScalarTy, VariantSpec};

/// Gradients of `L = Σ dO∘O`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gradients {
    /// Shape of `q`: `[batch, seq_q, heads_q, head_dim_qk]`.
    pub dq: Vec<f64>,
    /// Shape of `k`: `[batch, seq_k, heads_kv, head_dim_qk]`.
    pub dk: Vec<f64>,
    /// Shape of `v`: `[batch, seq_k, heads_kv, head_dim_v]`.
    pub dv: Vec<f64>,
    /// One entry per declared parameter: `Some(ParamValue::Float)` for an `f32` scalar,
    /// `Some(ParamValue::FloatTensor)` (as long as the given values) for an `f32` tensor, `None`
    /// for an `i32` parameter, which has no gradient, and for the dropout probability (the mask
    /// is a step function of it).
    pub dparams: Vec<Option<ParamValue>>,
}

impl Gradients {
    fn zeros(spec: &VariantSpec, p: &Problem) -> Gradients {
        let dparams = spec
            .params
            .iter()
            .zip(&p.params.0)
            .enumerate()
            .map(|(i, (decl, value))| match (&decl.kind, value) {
                _ if crate::dropout::is_probability(spec, i) => None,
                (ParamKind::Scalar(ScalarTy::F32), _) => Some(ParamValue::Float(0.0)),
                (
                    ParamKind::Tensor {
                        elem: ScalarTy::F32,
                        ..
                    },
                    ParamValue::FloatTensor(v),
                ) => Some(ParamValue::FloatTensor(vec![0.0; v.len()])),
                _ => None,
            })
            .collect();
        Gradients {
            dq: vec![0.0; p.q.len()],
            dk: vec![0.0; p.k.len()],
            dv: vec![0.0; p.v.len()],
            dparams,
        }
    }

    fn add_param(&mut self, param: usize, offset: usize, g: f64) {
        match &mut self.dparams[param] {
            Some(ParamValue::Float(x)) => *x += g,
            Some(ParamValue::FloatTensor(v)) => v[offset] += g,
            _ => panic!("parameter {param} has no gradient (not f32)"),
        }
    }
}

/// The derivatives of the score expression at one element, as a backward pass needs them.
pub trait ScoreDerivative {
    /// `∂Z/∂s` at `pt` (`pt.s` is the scaled score).
    fn d_ds(&mut self, env: &Env, pt: &Point) -> f64;
    /// Appends `(param, flat element, ∂Z/∂element)` for the `f32` parameter elements the score
    /// reads at `pt` (flat element 0 for a scalar). Entries for the same element are summed.
    fn d_dparams(&mut self, env: &Env, pt: &Point, out: &mut Vec<(usize, usize, f64)>);
}

/// One `f32` parameter read of the score expression: a scalar, or a tensor at index
/// expressions.
#[derive(Debug, Clone, PartialEq)]
struct Read {
    param: usize,
    index: Option<Vec<Expr>>,
}

/// [`ScoreDerivative`] by five-point central differences of the evaluator. Parameter
/// derivatives perturb one element at a time in a private copy of the parameter values, and
/// only the elements the score reads at the point (found by evaluating the index expressions
/// of each read); an element read at several index tuples is perturbed once, which gives the
/// derivative with respect to the element.
///
/// Within about `2·10⁻⁴·max(1, |x|)` of a kink of the score (`abs`, `min`, `if`) the estimate
/// blends the two sides; the symbolic route of [`crate::deriv`] gives the branch convention
/// there instead.
#[derive(Debug, Clone)]
pub struct NumericDerivative {
    reads: Vec<Read>,
    scratch: ParamValues,
    elems: Vec<(usize, usize)>,
}

impl NumericDerivative {
    /// For `spec` with parameter values `params` (those the `Env` passed later holds).
    pub fn new(spec: &VariantSpec, params: &ParamValues) -> Self {
        let mut reads: Vec<Read> = Vec::new();
        if let Some(score) = &spec.score {
            score.visit(&mut |e| {
                let read = match e {
                    Expr::Scalar(i) if spec.params[*i].kind == ParamKind::Scalar(ScalarTy::F32) => {
                        Read {
                            param: *i,
                            index: None,
                        }
                    }
                    Expr::Index(i, idx)
                        if matches!(
                            spec.params[*i].kind,
                            ParamKind::Tensor {
                                elem: ScalarTy::F32,
                                ..
                            }
                        ) =>
                    {
                        Read {
                            param: *i,
                            index: Some(idx.clone()),
                        }
                    }
                    _ => return,
                };
                if !reads.contains(&read) {
                    reads.push(read);
                }
            });
        }
        NumericDerivative {
            reads,
            scratch: params.clone(),
            elems: Vec::new(),
        }
    }
}

/// `f'(x)` by the five-point stencil, `O(h⁴)` truncation error. The step is rounded so that
/// `x ± h` and `x ± 2h` are exact, which keeps the rounding error at `~eps·|f|/h`.
fn stencil(x: f64, mut f: impl FnMut(f64) -> f64) -> f64 {
    let h = 1e-4 * x.abs().max(1.0);
    let h = (x + h) - x;
    let near = f(x + h) - f(x - h);
    let far = f(x + 2.0 * h) - f(x - 2.0 * h);
    (8.0 * near - far) / (12.0 * h)
}

impl ScoreDerivative for NumericDerivative {
    fn d_ds(&mut self, env: &Env, pt: &Point) -> f64 {
        if env.spec.score.is_none() {
            return 1.0;
        }
        stencil(pt.s, |s| env.score(&Point { s, ..*pt }))
    }

    fn d_dparams(&mut self, env: &Env, pt: &Point, out: &mut Vec<(usize, usize, f64)>) {
        self.elems.clear();
        for r in &self.reads {
            let elem = match &r.index {
                None => Some((r.param, 0)),
                Some(idx) => element_offset(env, r.param, idx, pt).map(|o| (r.param, o)),
            };
            if let Some(elem) = elem.filter(|e| !self.elems.contains(e)) {
                self.elems.push(elem);
            }
        }
        for &(param, offset) in &self.elems {
            let x = get(&self.scratch, param, offset);
            let scratch = &mut self.scratch;
            // The closure needs the scratch mutably (to perturb) and an `Env` over it (to
            // evaluate); a fresh `Env` per evaluation is two references and a length check.
            let d = stencil(x, |v| {
                set(scratch, param, offset, v);
                Env::new(env.spec, scratch, env.sizes).score(pt)
            });
            set(scratch, param, offset, x);
            out.push((param, offset, d));
        }
    }
}

fn get(values: &ParamValues, param: usize, offset: usize) -> f64 {
    match &values.0[param] {
        ParamValue::Float(x) => *x,
        ParamValue::FloatTensor(v) => v[offset],
        other => panic!("parameter {param} is not f32: {other:?}"),
    }
}

fn set(values: &mut ParamValues, param: usize, offset: usize, x: f64) {
    match &mut values.0[param] {
        ParamValue::Float(v) => *v = x,
        ParamValue::FloatTensor(v) => v[offset] = x,
        other => panic!("parameter {param} is not f32: {other:?}"),
    }
}

/// Row-major offset of the element `param[idx]` reads at `pt`, with the evaluator's rules
/// (see [`crate::eval`]): a `Fixed(n)` index is clamped into `[0, n-1]`; `None` when a `batch`,
/// `heads` or `seq` index is out of range, which the forward pass can only meet in a branch it
/// does not take (it would panic otherwise).
pub fn element_offset(env: &Env, param: usize, idx: &[Expr], pt: &Point) -> Option<usize> {
    let ParamKind::Tensor { dims, .. } = &env.spec.params[param].kind else {
        panic!("parameter {param} is not a tensor")
    };
    let shape = crate::eval::tensor_shape(dims, env.sizes);
    let mut flat = 0usize;
    for ((dim, &size), e) in dims.iter().zip(&shape).zip(idx) {
        let i = env.eval(e, pt).as_i64();
        let i = match dim {
            Dim::Fixed(n) => i.clamp(0, *n as i64 - 1),
            _ if i < 0 || i as usize >= size => return None,
            _ => i,
        };
        flat = flat * size + i as usize;
    }
    Some(flat)
}

/// Float64 gradients of `L = Σ dO∘O`, with numeric score derivatives ([`NumericDerivative`]).
/// `dout` has the shape of `o`: `[batch, seq_q, heads_q, head_dim_v]`.
pub fn backward(spec: &VariantSpec, p: &Problem, dout: &[f64]) -> Gradients {
    backward_with(spec, p, dout, &mut NumericDerivative::new(spec, &p.params))
}

/// The visible keys of one query row: key position, evaluation point (with `s`), logit `Z`.
type RowScores = Vec<(usize, Point, f64)>;

/// [`backward`] with the score derivatives taken from `how`.
pub fn backward_with(
    spec: &VariantSpec,
    p: &Problem,
    dout: &[f64],
    how: &mut dyn ScoreDerivative,
) -> Gradients {
    backward_from(spec, p, dout, how, None)
}

/// [`backward`] with `D = rowsum(dO∘O)` read from `stored_o` (`[batch, seq_q, heads_q,
/// head_dim_v]`) instead of the exact O: FlashAttention's backward reads the O its forward
/// stored, rounded to the dtype. Against [`backward`] this isolates the error that rounding
/// alone puts into dQ, dK and the parameter gradients (dV does not read D) — an error the plain
/// implementation, which forms D from P∘dP, does not have, and which dominates on rows with
/// few visible keys (two keys: D is one rounded O against an exact sum). The GPU check allows
/// it on top of FlashAttention's 2× rule.
pub fn backward_stored_o(
    spec: &VariantSpec,
    p: &Problem,
    dout: &[f64],
    stored_o: &[f64],
) -> Gradients {
    assert_eq!(
        stored_o.len(),
        dout.len(),
        "the stored O has the shape of dO"
    );
    backward_from(
        spec,
        p,
        dout,
        &mut NumericDerivative::new(spec, &p.params),
        Some(stored_o),
    )
}

fn backward_from(
    spec: &VariantSpec,
    p: &Problem,
    dout: &[f64],
    how: &mut dyn ScoreDerivative,
    stored_o: Option<&[f64]>,
) -> Gradients {
    p.check(spec);
    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    check_dout(p, dout, dv);
    let env = Env::new(spec, &p.params, p.sizes());
    let drop = DropoutFactor::new(spec, &p.params, p.rng, p.heads_q);
    let scale = spec.softmax_scale();
    let mut g = Gradients::zeros(spec, p);
    let mut scores: RowScores = Vec::with_capacity(p.seq_k);
    let mut probs: Vec<f64> = Vec::with_capacity(p.seq_k);
    let mut o = vec![0.0; dv];
    let mut reads = Vec::new();
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            let kvh = p.kv_head(h);
            for i in 0..p.seq_q {
                let qoff = Problem::row(b, i, h, p.seq_q, p.heads_q, dqk);
                let qrow = &p.q[qoff..][..dqk];
                scores.clear();
                for (j, mut pt) in visible_keys(&env, p.seq_k, b, h, i) {
                    let krow = &p.k[Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dqk)..][..dqk];
                    pt.s = scale * dot(qrow, krow);
                    scores.push((j, pt, env.score(&pt)));
                }
                let m = scores.iter().map(|s| s.2).fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    continue; // no visible key: o = 0 is constant, nothing flows back
                }
                probs.clear();
                probs.extend(scores.iter().map(|s| (s.2 - m).exp()));
                let l: f64 = probs.iter().sum();
                probs.iter_mut().for_each(|w| *w /= l);
                o.iter_mut().for_each(|x| *x = 0.0);
                for (&(j, ..), &w) in scores.iter().zip(&probs) {
                    let vrow = &p.v[Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dv)..][..dv];
                    let w = w * drop.at(b, h, i, j);
                    o.iter_mut().zip(vrow).for_each(|(o, v)| *o += w * v);
                }
                let orow = Problem::row(b, i, h, p.seq_q, p.heads_q, dv);
                let dorow = &dout[orow..][..dv];
                let d = match stored_o {
                    Some(so) => dot(dorow, &so[orow..][..dv]),
                    None => dot(dorow, &o),
                };
                for (&(j, pt, _), &w) in scores.iter().zip(&probs) {
                    if w == 0.0 {
                        continue;
                    }
                    let koff = Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dqk);
                    let voff = Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dv);
                    // Dropout: O = Σ P·f·v with f = mask/(1 − p), so dV gets P·f·dO and the
                    // gradient of P is f·(dO·v); D = dO·O already holds the dropped O.
                    let f = drop.at(b, h, i, j);
                    for (g, x) in g.dv[voff..voff + dv].iter_mut().zip(dorow) {
                        *g += w * f * x;
                    }
                    let dp = f * dot(dorow, &p.v[voff..][..dv]);
                    let dz = w * (dp - d);
                    let ds = dz * how.d_ds(&env, &pt);
                    for t in 0..dqk {
                        g.dq[qoff + t] += scale * ds * p.k[koff + t];
                        g.dk[koff + t] += scale * ds * p.q[qoff + t];
                    }
                    reads.clear();
                    how.d_dparams(&env, &pt, &mut reads);
                    for &(param, offset, dzdp) in &reads {
                        g.add_param(param, offset, dz * dzdp);
                    }
                }
            }
        }
    }
    g
}

fn check_dout(p: &Problem, dout: &[f64], dv: usize) {
    let want = p.batch * p.seq_q * p.heads_q * dv;
    assert_eq!(
        dout.len(),
        want,
        "dout has {} elements, the shape of o needs {want}",
        dout.len()
    );
}

/// The plain same-precision backward: what autograd computes for the naive implementation
/// [`forward_lowp`](crate::model::reference::forward_lowp) run in bf16/f16, the baseline of
/// the correctness rule for gradients. `round` is `round_bf16` or `round_f16`.
///
/// The forward is recomputed exactly as `forward_lowp` does (inputs rounded, `q·scale` rounded,
/// `S = q·kᵀ` rounded, the score modification in f32 then rounded, softmax in f32, `P`
/// rounded). Then, as separate half-precision ops with f32 accumulation and one rounding of
/// each op's output:
/// - `dO` is rounded to the dtype;
/// - `dV = Pᵀ·dO`, `dP = dO·Vᵀ`: matmuls, rounded;
/// - `dZ = P∘(dP − rowsum(P∘dP))`: the softmax backward (in f32 from the rounded `P` and `dP`,
///   as frameworks do), rounded;
/// - `dS = dZ·∂Z/∂s`, rounded, with `∂Z/∂s` taken in float64 at the rounded `S` (kinder than an
///   op-by-op half-precision autograd of the score expression, by at most one rounding per op);
/// - `d(q·scale) = dS·K`, rounded, then `dQ = round(d(q·scale)·scale)`; `dK = dSᵀ·(q·scale)`,
///   rounded;
/// - with GQA, `dK` and `dV` are rounded per query head (each head's matmul output) and then
///   summed over the group in f32 and rounded (the backward of expanding K/V over heads);
/// - parameter gradients `Σ dZ·∂Z/∂θ` are accumulated in f32 (parameters are f32 tensors)
///   and not rounded to the dtype.
pub fn backward_lowp(
    spec: &VariantSpec,
    p: &Problem,
    dout: &[f64],
    round: fn(f32) -> f32,
) -> Gradients {
    p.check(spec);
    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    check_dout(p, dout, dv);
    let env = Env::new(spec, &p.params, p.sizes());
    let drop = DropoutFactor::new(spec, &p.params, p.rng, p.heads_q);
    let mut how = NumericDerivative::new(spec, &p.params);
    let scale = spec.softmax_scale() as f32;
    let rounded = |xs: &[f64]| -> Vec<f32> { xs.iter().map(|&x| round(x as f32)).collect() };
    let qs: Vec<f32> = rounded(&p.q).iter().map(|&x| round(x * scale)).collect();
    let (k, v, dout) = (rounded(&p.k), rounded(&p.v), rounded(dout));
    let dot32 = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();

    // Per query head accumulators for dK, dV (`[batch, seq_k, heads_q, d]`), dQs, params.
    let mut dk_h = vec![0f32; p.batch * p.seq_k * p.heads_q * dqk];
    let mut dv_h = vec![0f32; p.batch * p.seq_k * p.heads_q * dv];
    let mut dqs = vec![0f32; p.q.len()];
    let mut dparams: Vec<Option<Vec<f32>>> = Gradients::zeros(spec, p)
        .dparams
        .iter()
        .map(|g| match g {
            Some(ParamValue::Float(_)) => Some(vec![0.0]),
            Some(ParamValue::FloatTensor(t)) => Some(vec![0.0; t.len()]),
            _ => None,
        })
        .collect();
    let mut scores: Vec<(usize, Point, f32)> = Vec::with_capacity(p.seq_k);
    let mut reads = Vec::new();
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            let kvh = p.kv_head(h);
            for i in 0..p.seq_q {
                let qoff = Problem::row(b, i, h, p.seq_q, p.heads_q, dqk);
                scores.clear();
                for (j, mut pt) in visible_keys(&env, p.seq_k, b, h, i) {
                    let koff = Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dqk);
                    let s = round(dot32(&qs[qoff..][..dqk], &k[koff..][..dqk]));
                    pt.s = s as f64;
                    let z = match spec.score {
                        Some(_) => round(env.score(&pt) as f32),
                        None => s,
                    };
                    scores.push((j, pt, z));
                }
                let m = scores.iter().map(|s| s.2).fold(f32::NEG_INFINITY, f32::max);
                if m == f32::NEG_INFINITY {
                    continue;
                }
                let l: f32 = scores.iter().map(|&(.., z)| (z - m).exp()).sum();
                let dorow = &dout[Problem::row(b, i, h, p.seq_q, p.heads_q, dv)..][..dv];
                // P and dP of the row, then the softmax backward's rowsum(P∘dP).
                // With dropout, P·f (f = mask/(1 − p)) is the rounded product that met V, and
                // dP is the rounded f·(dO·vᵀ) (dropout's backward, one more half-precision op).
                let pd: Vec<(f32, f32, f32)> = scores
                    .iter()
                    .map(|&(j, _, z)| {
                        let voff = Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dv);
                        let w = round((z - m).exp() / l);
                        let dpd = round(dot32(dorow, &v[voff..][..dv]));
                        match spec.dropout {
                            None => (w, w, dpd),
                            Some(_) => {
                                let f = drop.at(b, h, i, j) as f32;
                                (w, round(w * f), round(dpd * f))
                            }
                        }
                    })
                    .collect();
                let d: f32 = pd.iter().map(|&(w, _, dp)| w * dp).sum();
                for (&(j, pt, _), &(w, wd, dp)) in scores.iter().zip(&pd) {
                    if w == 0.0 {
                        continue;
                    }
                    let koff = Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dqk);
                    let hk = Problem::row(b, j, h, p.seq_k, p.heads_q, dqk);
                    let hv = Problem::row(b, j, h, p.seq_k, p.heads_q, dv);
                    for (g, x) in dv_h[hv..hv + dv].iter_mut().zip(dorow) {
                        *g += wd * x;
                    }
                    let dz = round(w * (dp - d));
                    let ds = match spec.score {
                        Some(_) => round(dz * how.d_ds(&env, &pt) as f32),
                        None => dz,
                    };
                    for t in 0..dqk {
                        dqs[qoff + t] += ds * k[koff + t];
                        dk_h[hk + t] += ds * qs[qoff + t];
                    }
                    reads.clear();
                    how.d_dparams(&env, &pt, &mut reads);
                    for &(param, offset, dzdp) in &reads {
                        if let Some(acc) = &mut dparams[param] {
                            acc[offset] += dz * dzdp as f32;
                        }
                    }
                }
            }
        }
    }
    let mut g = Gradients::zeros(spec, p);
    for (dq, x) in g.dq.iter_mut().zip(&dqs) {
        *dq = round(round(*x) * scale) as f64;
    }
    group_sum(p, dqk, &dk_h, &mut g.dk, round);
    group_sum(p, dv, &dv_h, &mut g.dv, round);
    for (out, acc) in g.dparams.iter_mut().zip(dparams) {
        match (out, acc) {
            (Some(ParamValue::Float(x)), Some(acc)) => *x = acc[0] as f64,
            (Some(ParamValue::FloatTensor(xs)), Some(acc)) => {
                xs.iter_mut().zip(acc).for_each(|(x, a)| *x = a as f64)
            }
            _ => {}
        }
    }
    g
}

/// Rounds each query head's `[batch, seq_k, heads_q, d]` gradient, sums the heads of every
/// key/value group in f32 and rounds into `[batch, seq_k, heads_kv, d]`.
fn group_sum(p: &Problem, d: usize, per_head: &[f32], out: &mut [f64], round: fn(f32) -> f32) {
    let mut acc = vec![0f32; d];
    for b in 0..p.batch {
        for j in 0..p.seq_k {
            for kvh in 0..p.heads_kv {
                acc.iter_mut().for_each(|a| *a = 0.0);
                for h in (0..p.heads_q).filter(|&h| p.kv_head(h) == kvh) {
                    let src = &per_head[Problem::row(b, j, h, p.seq_k, p.heads_q, d)..][..d];
                    acc.iter_mut().zip(src).for_each(|(a, x)| *a += round(*x));
                }
                let dst = Problem::row(b, j, kvh, p.seq_k, p.heads_kv, d);
                for (o, a) in out[dst..dst + d].iter_mut().zip(&acc) {
                    *o = round(*a) as f64;
                }
            }
        }
    }
}
