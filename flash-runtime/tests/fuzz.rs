//! Fuzzing in CI (issue 14), on stable Rust: seeded generators, bounded in cases and time.
//!
//! - `fuzz_declarations`: a grammar-aware generator of declarations over every operator,
//!   builtin, parameter kind and key, valid ones and almost-valid ones (token mutations of the
//!   valid ones), through parse → validate → plan → emit (forward and backward); a sample of
//!   the accepted ones is compiled by NVRTC. It asserts no panic, no case slower than
//!   [`CASE_LIMIT`], every accepted declaration plans and emits (and the sampled ones compile),
//!   every rejected one has a diagnostic with a span, and the planner's tile classification and
//!   key/query hulls agree with the CPU evaluator, element by element, on random small shapes
//!   and parameter values.
//! - `fuzz_parser_bytes` and `fuzz_npy_bytes`: random bytes and mutations of valid seeds into
//!   the `.flash` parser and the `.npy` reader; no panic, no hang.
//!
//! Each prints its counts (visible with `--nocapture`, which `scripts/test.sh` passes). The seed
//! is fixed (`FLASH_FUZZ_SEED` overrides it, `FLASH_FUZZ_SCALE` multiplies the case counts), so
//! a failure reproduces; the failing input is printed. Inputs that once failed are kept in
//! [`REGRESSIONS`] and run first.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use flash_dsl::eval::{tensor_shape, Env, ParamValue, ParamValues, Point, Sizes};
use flash_dsl::parse::parse_str;
use flash_dsl::plan::{
    analyse_mask, backward_pipeline, classify, default_backward_config_for, default_config_for,
    hull, plan, KernelFamily, TileClass, TileEnv,
};
use flash_dsl::rng::SplitMix;
use flash_dsl::spec::{ParamKind, ScalarTy, VariantSpec};
use flash_dsl::{emit, Diagnostic};
use flash_runtime::compile::{compile, CompileOptions};
use flash_runtime::npy::{NpyArray, NpyData};

/// The slowest a single case may be (debug build, 2 cores shared with the compiler).
const CASE_LIMIT: Duration = Duration::from_secs(20);

/// Accepted declarations compiled by NVRTC per run (about 2 s each on one core).
const NVRTC_SAMPLE: usize = 8;

/// Declarations that once crashed, hung or disagreed (kept as regression inputs).
const REGRESSIONS: &[&str] = &[
    // Stack overflow in the parser (10 KB of parentheses).
    "A { head_dim: 64, dtype: f16, mask: ((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((causal)))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))) }",
    // A remainder by a runtime zero, and INT_MIN % -1.
    "A { head_dim: 64, dtype: f16, params: { m: i32 }, mask: q % m == 0 }",
    "A { head_dim: 64, dtype: f16, params: { m: i32, n: i32 }, mask: m % n == 0 }",
    // `1 - prefix` overflowed the kernels' int for prefix = i32::MIN.
    "A { head_dim: 64, dtype: f16, params: { p: i32 }, mask: k < p }",
    // Non-ASCII names.
    "Aé { head_dim: 64, dtype: f16 }",
    WIDE,
];

/// Every 64-bit path of the arithmetic model (`validate::arith`): wide sums, `lrem`, `labs`,
/// `lmin`/`lmax`, `clampl` and 64-bit flat offsets. Always compiled by NVRTC.
const WIDE: &str = "W { head_dim: 64, dtype: bf16, params: { p: i32, m: i32, d: [i32; batch, seq], t: [f32; heads, 16] }, mask: (p + 1) % m != 0 && abs(p - q) > 0 && min(p + k, 3) < max(p * 2, k) && d[b, q] == d[b, k] && q % m == 1, score: s + t[h, p * 2 + k - q] }";

fn seed() -> u64 {
    std::env::var("FLASH_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_f1a5)
}

fn scale(n: usize) -> usize {
    let f: f64 = std::env::var("FLASH_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    ((n as f64 * f) as usize).max(1)
}

/// Runs `f` over `inputs` on a worker thread with a 2 MiB stack (as small as a test thread's),
/// failing on a panic (with the input) or on an input that takes longer than `limit`.
fn run_cases<T: Send + Clone + std::fmt::Debug + 'static>(
    what: &str,
    inputs: Vec<T>,
    limit: Duration,
    f: impl Fn(&T) + Send + 'static,
) {
    let (tx, rx) = mpsc::channel::<Result<usize, String>>();
    let shown = inputs.clone();
    let worker = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            for (i, x) in inputs.iter().enumerate() {
                let r = catch_unwind(AssertUnwindSafe(|| f(x)));
                let msg = r.map(|_| i).map_err(|e| {
                    let text = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    format!("{text}\ninput #{i}: {x:?}")
                });
                let stop = msg.is_err();
                if tx.send(msg).is_err() || stop {
                    return;
                }
            }
        })
        .unwrap();
    for (i, x) in shown.iter().enumerate() {
        match rx.recv_timeout(limit) {
            Ok(Ok(_)) => {}
            Ok(Err(m)) => panic!("{what}: panicked: {m}"),
            Err(_) => {
                panic!("{what}: input #{i} took longer than {limit:?} (or the worker died): {x:?}")
            }
        }
    }
    worker.join().unwrap();
}

// ---------------------------------------------------------------------------------------------
// The declaration generator
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum T {
    Int,
    Float,
    Bool,
}

struct Param {
    name: String,
    elem: T,
    /// `None` for a scalar; else the written dimensions.
    dims: Option<Vec<&'static str>>,
}

struct Gen<'a> {
    rng: &'a mut SplitMix,
    params: &'a [Param],
    score: bool,
}

impl Gen<'_> {
    fn pick<'x, X>(&mut self, xs: &'x [X]) -> &'x X {
        &xs[self.rng.below(xs.len() as u64) as usize]
    }
    fn chance(&mut self, p: f64) -> bool {
        self.rng.uniform() < p
    }

    fn int_lit(&mut self) -> String {
        match self.rng.below(10) {
            0 => "2147483647".into(),
            1 => "0".into(),
            2 => format!("{}", self.rng.below(1 << 20)),
            _ => format!("{}", self.rng.below(40)),
        }
    }

    fn float_lit(&mut self) -> String {
        self.pick(&[
            "0.5", "1.0", "2.0", "0.125", "30.0", "1e-3", "3.0e38", "0.0",
        ])
        .to_string()
    }

    fn lookup(&mut self, want: T, depth: u32) -> Option<String> {
        let cands: Vec<usize> = (0..self.params.len())
            .filter(|&i| self.params[i].elem == want && self.params[i].dims.is_some())
            .collect();
        if cands.is_empty() {
            return None;
        }
        let p = &self.params[*self.pick(&cands)];
        let dims = p.dims.clone().unwrap();
        let name = p.name.clone();
        let idx: Vec<String> = dims
            .iter()
            .map(|d| match *d {
                "batch" => "b".to_string(),
                "heads" => "h".to_string(),
                "seq" => self.pick(&["q", "k"]).to_string(),
                _ => self.expr(T::Int, depth + 1),
            })
            .collect();
        Some(format!("{name}[{}]", idx.join(", ")))
    }

    fn scalar(&mut self, want: T) -> Option<String> {
        let cands: Vec<String> = self
            .params
            .iter()
            .filter(|p| p.elem == want && p.dims.is_none())
            .map(|p| p.name.clone())
            .collect();
        (!cands.is_empty()).then(|| self.pick(&cands).clone())
    }

    fn leaf(&mut self, want: T, depth: u32) -> String {
        for _ in 0..4 {
            let got = match (want, self.rng.below(6)) {
                (T::Int, 0) => Some(self.int_lit()),
                (T::Int, 1) => Some(
                    self.pick(&["q", "k", "b", "h", "seq_q", "seq_k"])
                        .to_string(),
                ),
                (T::Int, 2) => self.scalar(T::Int),
                (T::Int, 3) => self.lookup(T::Int, depth),
                (T::Int, _) => Some(self.pick(&["q", "k", "q", "k"]).to_string()),
                (T::Float, 0) => Some(self.float_lit()),
                (T::Float, 1) if self.score => Some("s".into()),
                (T::Float, 2) => self.scalar(T::Float),
                (T::Float, 3) => self.lookup(T::Float, depth),
                (T::Float, _) if self.score => Some("s".into()),
                (T::Float, _) => Some(self.float_lit()),
                (T::Bool, 0) => Some("causal".into()),
                (T::Bool, 1) => Some(format!("window({})", 1 + self.rng.below(64))),
                (T::Bool, 2) => self.scalar(T::Int).map(|w| format!("window({w})")),
                (T::Bool, 3) => Some(self.pick(&["true", "false"]).to_string()),
                (T::Bool, _) => None,
            };
            if let Some(g) = got {
                return g;
            }
        }
        match want {
            T::Int => "q".into(),
            T::Float => "1.5".into(),
            T::Bool => "causal".into(),
        }
    }

    /// A well-typed expression of type `want`.
    fn expr(&mut self, want: T, depth: u32) -> String {
        if depth > 5 || self.chance(0.25 + 0.1 * depth as f64) {
            if want == T::Bool {
                return self.cmp(depth);
            }
            return self.leaf(want, depth);
        }
        match want {
            T::Int => match self.rng.below(8) {
                0..=2 => {
                    let op = *self.pick(&["+", "-", "*", "%"]);
                    let (a, b) = (self.expr(T::Int, depth + 1), self.expr(T::Int, depth + 1));
                    format!("({a} {op} {b})")
                }
                3 => format!("-{}", self.expr(T::Int, depth + 1)),
                4 => {
                    let f = *self.pick(&["abs", "min", "max", "clamp"]);
                    let n = match f {
                        "abs" => 1,
                        "clamp" => 3,
                        _ => 2,
                    };
                    let args: Vec<String> = (0..n).map(|_| self.expr(T::Int, depth + 1)).collect();
                    format!("{f}({})", args.join(", "))
                }
                5 => {
                    let c = self.expr(T::Bool, depth + 1);
                    let (a, b) = (self.expr(T::Int, depth + 1), self.expr(T::Int, depth + 1));
                    format!("if {c} {{ {a} }} else {{ {b} }}")
                }
                _ => self.leaf(T::Int, depth),
            },
            T::Float => match self.rng.below(9) {
                0..=2 => {
                    let op = *self.pick(&["+", "-", "*", "/"]);
                    let ta = if self.chance(0.3) { T::Int } else { T::Float };
                    let (a, b) = (self.expr(ta, depth + 1), self.expr(T::Float, depth + 1));
                    format!("({a} {op} {b})")
                }
                3 => format!("-{}", self.expr(T::Float, depth + 1)),
                4 => {
                    let f = *self.pick(&["exp", "log", "tanh", "sigmoid", "sqrt", "abs"]);
                    format!("{f}({})", self.expr(T::Float, depth + 1))
                }
                5 => {
                    let f = *self.pick(&["min", "max", "softcap"]);
                    let (a, b) = (
                        self.expr(T::Float, depth + 1),
                        self.expr(T::Float, depth + 1),
                    );
                    format!("{f}({a}, {b})")
                }
                6 => {
                    let args: Vec<String> =
                        (0..3).map(|_| self.expr(T::Float, depth + 1)).collect();
                    format!("clamp({})", args.join(", "))
                }
                7 => format!("alibi({})", self.expr(T::Float, depth + 1)),
                _ => {
                    let c = self.expr(T::Bool, depth + 1);
                    let (a, b) = (
                        self.expr(T::Float, depth + 1),
                        self.expr(T::Float, depth + 1),
                    );
                    format!("if {c} {{ {a} }} else {{ {b} }}")
                }
            },
            T::Bool => match self.rng.below(6) {
                0 | 1 => {
                    let op = *self.pick(&["&&", "||"]);
                    let (a, b) = (self.expr(T::Bool, depth + 1), self.expr(T::Bool, depth + 1));
                    format!("({a} {op} {b})")
                }
                2 => format!("!{}", self.expr(T::Bool, depth + 1)),
                3 => self.leaf(T::Bool, depth),
                _ => self.cmp(depth),
            },
        }
    }

    fn cmp(&mut self, depth: u32) -> String {
        let op = *self.pick(&["<", "<=", ">", ">=", "==", "!="]);
        let t = if self.chance(0.8) { T::Int } else { T::Float };
        let (a, b) = (self.expr(t, depth + 1), self.expr(t, depth + 1));
        format!("({a} {op} {b})")
    }
}

/// A random, mostly valid declaration.
fn declaration(rng: &mut SplitMix, id: usize) -> String {
    let mut params = Vec::new();
    for i in 0..rng.below(4) {
        let elem = if rng.below(2) == 0 { T::Int } else { T::Float };
        let dims = match rng.below(3) {
            0 => None,
            _ => {
                let shapes: &[&[&'static str]] = &[
                    &["seq"],
                    &["heads"],
                    &["batch", "seq"],
                    &["heads", "seq"],
                    &["heads", "16"],
                    &["7"],
                    &["batch", "heads", "seq"],
                    &["3", "seq"],
                ];
                Some(shapes[rng.below(shapes.len() as u64) as usize].to_vec())
            }
        };
        params.push(Param {
            name: format!("p{i}"),
            elem,
            dims,
        });
    }
    let mut sparse = false;
    if rng.below(8) == 0 {
        params.push(Param {
            name: "blk".into(),
            elem: T::Int,
            dims: Some(vec!["heads", "seq / 128", "4"]),
        });
        sparse = true;
    }
    let ty = |p: &Param| {
        let e = if p.elem == T::Int { "i32" } else { "f32" };
        match &p.dims {
            None => e.to_string(),
            Some(d) => format!("[{e}; {}]", d.join(", ")),
        }
    };
    let mut entries = vec![
        format!(
            "head_dim: {}",
            ["64", "128", "(128, 64)", "32"][rng.below(4) as usize]
        ),
        format!("dtype: {}", ["bf16", "f16"][rng.below(2) as usize]),
    ];
    if !params.is_empty() {
        let ps: Vec<String> = params
            .iter()
            .map(|p| format!("{}: {}", p.name, ty(p)))
            .collect();
        entries.push(format!("params: {{ {} }}", ps.join(", ")));
    }
    let usable: Vec<Param> = params
        .iter()
        .filter(|p| p.name != "blk")
        .map(|p| Param {
            name: p.name.clone(),
            elem: p.elem,
            dims: p.dims.clone(),
        })
        .collect();
    if rng.below(4) != 0 {
        let mut g = Gen {
            rng,
            params: &usable,
            score: false,
        };
        let m = g.expr(T::Bool, 0);
        entries.push(format!("mask: {m}"));
    }
    if rng.below(2) == 0 {
        let mut g = Gen {
            rng,
            params: &usable,
            score: true,
        };
        let s = g.expr(T::Float, 1);
        entries.push(format!("score: {s}"));
    }
    if rng.below(6) == 0 {
        entries.push(format!(
            "scale: {}",
            ["0.125", "1.0 / 8", "2", "0.5"][rng.below(4) as usize]
        ));
    }
    if rng.below(8) == 0 {
        entries.push("dropout: 0.1".into());
    }
    if sparse {
        entries.push("sparsity: blk".into());
    }
    format!("V{id} {{ {} }}", entries.join(", "))
}

/// Tokens a mutation may insert: valid ones, and the hostile ones issue 14 lists.
const VOCAB: &[&str] = &[
    "q",
    "k",
    "s",
    "b",
    "h",
    "seq_q",
    "seq_k",
    "causal",
    "+",
    "-",
    "*",
    "/",
    "%",
    "<",
    "==",
    "&&",
    "||",
    "!",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "0",
    "1",
    "2147483648",
    "1e39",
    "0.0",
    "if",
    "else",
    "r#type",
    "é",
    "tanh",
    "window",
    "alibi",
    "softcap",
    "params",
    "mask",
    "score",
    "i32",
    "f32",
    "seq",
    "heads",
    "batch",
    "/ 0",
    "% 0",
    "99999999999999999999",
];

/// An almost-valid declaration: `src` with a few token-level mutations.
fn mutate(rng: &mut SplitMix, src: &str) -> String {
    let mut toks: Vec<String> = src.split(' ').map(str::to_string).collect();
    for _ in 0..1 + rng.below(3) {
        if toks.is_empty() {
            break;
        }
        let i = rng.below(toks.len() as u64) as usize;
        match rng.below(4) {
            0 => {
                toks.remove(i);
            }
            1 => {
                let t = toks[i].clone();
                toks.insert(i, t);
            }
            2 => toks[i] = VOCAB[rng.below(VOCAB.len() as u64) as usize].to_string(),
            _ => {
                let j = rng.below(toks.len() as u64) as usize;
                toks.swap(i, j);
            }
        }
    }
    toks.join(" ")
}

// ---------------------------------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------------------------------

#[derive(Default, Debug)]
struct Counts {
    generated: usize,
    accepted: usize,
    rejected: usize,
    kernels_emitted: usize,
    tiles_checked: usize,
    elements_checked: usize,
}

/// A rejected input: at least one diagnostic, each with a span inside the source.
fn check_rejection(src: &str, diags: &[Diagnostic]) {
    assert!(!diags.is_empty(), "rejected without a diagnostic: {src}");
    let lines = src.lines().count().max(1);
    for d in diags {
        let (line, _) = d.line_col();
        assert!(
            (1..=lines).contains(&line),
            "diagnostic `{}` has no span in the source (line {line}): {src}",
            d.message
        );
        assert!(!d.message.is_empty());
    }
}

/// Random values for every parameter at `sizes`.
fn values(spec: &VariantSpec, sizes: Sizes, rng: &mut SplitMix) -> ParamValues {
    let int = |rng: &mut SplitMix| match rng.below(8) {
        0 => i32::MIN as i64,
        1 => i32::MAX as i64,
        2 => 0,
        _ => rng.below(9) as i64 - 4,
    };
    let vals = spec
        .params
        .iter()
        .map(|p| match &p.kind {
            ParamKind::Scalar(ScalarTy::I32) => ParamValue::Int(int(rng)),
            ParamKind::Scalar(ScalarTy::F32) => ParamValue::Float(rng.uniform() * 4.0 - 1.0),
            ParamKind::Tensor { elem, dims } => {
                let n: usize = tensor_shape(dims, sizes).iter().product();
                match elem {
                    ScalarTy::I32 => {
                        let mut v: Vec<i64> = (0..n).map(|_| int(rng)).collect();
                        if rng.below(2) == 0 {
                            v.sort();
                        }
                        ParamValue::IntTensor(v)
                    }
                    ScalarTy::F32 => {
                        ParamValue::FloatTensor((0..n).map(|_| rng.uniform()).collect())
                    }
                }
            }
        })
        .collect();
    ParamValues::new(vals)
}

/// The tile classification and the hulls of `spec`'s mask against the CPU evaluator, on
/// random small shapes, parameter values and tile boxes.
fn check_classification(spec: &VariantSpec, rng: &mut SplitMix, counts: &mut Counts) {
    let Some(mask) = &spec.mask else { return };
    let plan = analyse_mask(spec, mask);
    for _ in 0..3 {
        let sizes = Sizes {
            batch: 1 + rng.below(2) as usize,
            heads: 1 + rng.below(3) as usize,
            seq_q: 1 + rng.below(48) as usize,
            seq_k: 1 + rng.below(48) as usize,
        };
        let pv = values(spec, sizes, rng);
        let env = Env::new(spec, &pv, sizes);
        let (b, h) = (rng.below(sizes.batch as u64), rng.below(sizes.heads as u64));
        let tenv = TileEnv::new(b as usize, h as usize, sizes.seq_q, sizes.seq_k, &pv);
        let visible = |q: i64, k: i64| {
            env.eval(
                mask,
                &Point {
                    b: b as i64,
                    h: h as i64,
                    q,
                    k,
                    s: 0.0,
                },
            )
            .as_bool()
        };
        for _ in 0..6 {
            let (sq, sk) = (sizes.seq_q as i64, sizes.seq_k as i64);
            let q0 = rng.below(sq as u64) as i64;
            let q1 = q0 + rng.below((sq - q0) as u64) as i64;
            let k0 = rng.below(sk as u64) as i64;
            let k1 = k0 + rng.below((sk - k0) as u64) as i64;
            let class = classify(&plan, spec, &tenv, q0, q1, k0, k1);
            let (kh0, kh1) = hull(&plan, &tenv, q0, q1, false);
            let (qh0, qh1) = hull(&plan, &tenv, k0, k1, true);
            for q in q0..=q1 {
                for k in k0..=k1 {
                    let v = visible(q, k);
                    counts.elements_checked += 1;
                    match class {
                        TileClass::Full => {
                            assert!(v, "tile classified full but ({q}, {k}) is masked")
                        }
                        TileClass::Empty => {
                            assert!(!v, "tile classified empty but ({q}, {k}) is visible")
                        }
                        TileClass::Partial => {}
                    }
                    if v {
                        assert!(
                            (kh0..=kh1).contains(&k) && (qh0..=qh1).contains(&q),
                            "({q}, {k}) visible outside the hulls k∈[{kh0}, {kh1}], q∈[{qh0}, {qh1}]"
                        );
                    }
                }
            }
            counts.tiles_checked += 1;
        }
    }
}

/// Parse, validate, plan and emit one source; returns the accepted specs. Every accepted spec
/// plans and emits its sm80 forward kernel; with `all_kernels`, also its sm90ws forward and its
/// backward kernels (emission costs ~0.1 s per kernel in a debug build, so CI does that for a
/// quarter of the cases).
fn pipeline(src: &str, all_kernels: bool, counts: &mut Counts) -> Vec<VariantSpec> {
    counts.generated += 1;
    let specs = match parse_str(src) {
        Ok(s) => s,
        Err(diags) => {
            check_rejection(src, &diags);
            counts.rejected += 1;
            return vec![];
        }
    };
    counts.accepted += 1;
    for spec in &specs {
        let families: &[KernelFamily] = if all_kernels {
            &[KernelFamily::Sm80, KernelFamily::Sm90Ws]
        } else {
            &[KernelFamily::Sm80]
        };
        for &family in families {
            let p = plan(spec, Some(default_config_for(spec, family)))
                .unwrap_or_else(|e| panic!("accepted but not planned ({family:?}): {e}\n{src}"));
            let cuda = emit(&p);
            assert!(cuda.source.contains(&p.kernel_name));
            counts.kernels_emitted += 1;
        }
        if !all_kernels {
            continue;
        }
        // The backward pass has its own limits (head dims); where it plans, it emits.
        if let Ok(pipe) =
            backward_pipeline(spec, default_backward_config_for(spec, KernelFamily::Sm80))
        {
            for k in &pipe.kernels {
                assert!(!emit(k).source.is_empty());
                counts.kernels_emitted += 1;
            }
        }
    }
    specs
}

#[test]
fn fuzz_declarations() {
    let start = Instant::now();
    let mut rng = SplitMix(seed());
    let n = scale(250);
    let mut inputs: Vec<(String, u64)> = REGRESSIONS.iter().map(|s| (s.to_string(), 0)).collect();
    for i in 0..n {
        let valid = declaration(&mut rng, i);
        inputs.push((valid.clone(), rng.next_u64()));
        inputs.push((mutate(&mut rng, &valid), rng.next_u64()));
    }
    let (tx, rx) = mpsc::channel();
    run_cases(
        "fuzz_declarations",
        inputs,
        CASE_LIMIT,
        move |(src, seed)| {
            let mut counts = Counts::default();
            let mut rng = SplitMix(*seed);
            let specs = pipeline(src, seed % 4 == 0, &mut counts);
            for spec in &specs {
                check_classification(spec, &mut rng, &mut counts);
            }
            let _ = tx.send((counts, specs));
        },
    );
    let mut total = Counts::default();
    let mut accepted = Vec::new();
    for (c, specs) in rx.try_iter() {
        total.generated += c.generated;
        total.accepted += c.accepted;
        total.rejected += c.rejected;
        total.kernels_emitted += c.kernels_emitted;
        total.tiles_checked += c.tiles_checked;
        total.elements_checked += c.elements_checked;
        accepted.extend(specs);
    }
    assert_eq!(total.generated, total.accepted + total.rejected);
    // Both kinds must be exercised, or the generator has rotted.
    assert!(total.accepted * 5 > total.generated, "{total:?}");
    assert!(total.rejected * 10 > total.generated, "{total:?}");
    assert!(total.tiles_checked > 1000, "{total:?}");
    let host = start.elapsed();
    // The 64-bit paths are all present in WIDE's kernel (so compiling it covers them).
    let w = emit(&plan(&parse_str(WIDE).unwrap()[0], None).unwrap()).source;
    for helper in [
        "flash::lrem(",
        "flash::labs(",
        "flash::lmin(",
        "flash::lmax(",
        "flash::clampl(",
        "flash::irem(q",
        "(i64)flash::clampi(b",
    ] {
        assert!(w.contains(helper), "no {helper} in WIDE's kernel");
    }

    // NVRTC: WIDE for both families, then a sample of the accepted declarations, forward,
    // alternately for sm_80 (the mma.sync family) and sm_90a (the warp-specialised one).
    let mut compiled = 0;
    let t = Instant::now();
    if common::have_nvrtc("fuzz_declarations") {
        let stride = (accepted.len() / NVRTC_SAMPLE).max(1);
        let wide = parse_str(WIDE).unwrap().remove(0);
        let sample: Vec<(VariantSpec, &str)> = [wide.clone(), wide]
            .iter()
            .chain(accepted.iter().step_by(stride).take(NVRTC_SAMPLE))
            .enumerate()
            .map(|(i, s)| (s.clone(), if i % 2 == 0 { "sm_80" } else { "sm_90a" }))
            .collect();
        let results = common::par_map(&sample, |(spec, arch)| {
            let family = KernelFamily::for_arch(arch);
            let p = plan(spec, Some(default_config_for(spec, family))).unwrap();
            let src = emit(&p);
            compile(&src, &CompileOptions::new(*arch))
                .map(|_| ())
                .map_err(|e| format!("{} on {arch}: {e}\n{spec:?}", p.kernel_name))
        });
        for r in results {
            r.unwrap_or_else(|e| panic!("an accepted declaration does not compile: {e}"));
            compiled += 1;
        }
        assert!(compiled >= NVRTC_SAMPLE, "compiled only {compiled}");
    }
    println!(
        "fuzz_declarations: seed {:#x}: {} declarations generated, {} accepted, {} rejected (each with a spanned diagnostic); {} kernels emitted; {} tiles / {} elements of tile classification checked against the CPU evaluator, 0 disagreements; {} compiled by NVRTC; {:.1} s host + {:.1} s NVRTC",
        seed(),
        total.generated,
        total.accepted,
        total.rejected,
        total.kernels_emitted,
        total.tiles_checked,
        total.elements_checked,
        compiled,
        host.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
}

/// Random bytes, or a valid seed with byte-level mutations.
fn mutate_bytes(rng: &mut SplitMix, seeds: &[Vec<u8>]) -> Vec<u8> {
    if rng.below(4) == 0 {
        let n = rng.below(256) as usize;
        return (0..n).map(|_| rng.below(256) as u8).collect();
    }
    let mut b = seeds[rng.below(seeds.len() as u64) as usize].clone();
    for _ in 0..1 + rng.below(8) {
        let i = rng.below(b.len().max(1) as u64) as usize;
        match rng.below(5) {
            0 if !b.is_empty() => {
                b.remove(i.min(b.len() - 1));
            }
            1 => b.insert(i.min(b.len()), rng.below(256) as u8),
            2 if !b.is_empty() => {
                let j = i.min(b.len() - 1);
                b[j] = rng.below(256) as u8;
            }
            3 if !b.is_empty() => {
                // Repeat a slice (nesting, long chains).
                let j = i.min(b.len() - 1);
                let end = (j + 1 + rng.below(16) as usize).min(b.len());
                let piece = b[j..end].to_vec();
                for _ in 0..rng.below(64) {
                    b.splice(j..j, piece.iter().copied());
                }
            }
            _ => b.truncate(i),
        }
    }
    b
}

#[test]
fn fuzz_parser_bytes() {
    let start = Instant::now();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/variants");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "flash").then(|| std::fs::read(p).unwrap())
        })
        .collect();
    seeds.extend(REGRESSIONS.iter().map(|s| s.as_bytes().to_vec()));
    let mut rng = SplitMix(seed() ^ 2);
    for i in 0..40 {
        seeds.push(declaration(&mut rng, i).into_bytes());
    }
    let inputs: Vec<Vec<u8>> = (0..scale(30_000))
        .map(|_| mutate_bytes(&mut rng, &seeds))
        .collect();
    let bytes: usize = inputs.iter().map(Vec::len).sum();
    let n = inputs.len();
    run_cases("fuzz_parser_bytes", inputs, CASE_LIMIT, |b| {
        let src = String::from_utf8_lossy(b);
        if let Err(diags) = parse_str(&src) {
            assert!(!diags.is_empty());
            // Rendering never panics either (spans may point anywhere in odd input).
            let _ = flash_dsl::diag::render("fuzz.flash", &src, &diags);
        }
    });
    println!(
        "fuzz_parser_bytes: seed {:#x}: {n} inputs, {bytes} bytes fuzzed through the .flash parser, 0 crashes; {:.1} s",
        seed() ^ 2,
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn fuzz_npy_bytes() {
    let start = Instant::now();
    let arrays = [
        NpyArray::new(vec![2, 3], NpyData::F32(vec![1.0; 6])).unwrap(),
        NpyArray::new(vec![4], NpyData::I32(vec![1, 2, 3, 4])).unwrap(),
        NpyArray::new(vec![], NpyData::F64(vec![0.5])).unwrap(),
        NpyArray::new(vec![2, 1, 2], NpyData::Bf16(vec![1, 2, 3, 4])).unwrap(),
        NpyArray::new(vec![3], NpyData::U8(vec![1, 0, 1])).unwrap(),
        NpyArray::new(vec![0, 5], NpyData::I64(vec![])).unwrap(),
    ];
    let seeds: Vec<Vec<u8>> = arrays.iter().map(NpyArray::to_bytes).collect();
    // Every seed reads back as itself.
    for (a, b) in arrays.iter().zip(&seeds) {
        assert_eq!(&NpyArray::from_bytes(b).unwrap(), a);
    }
    let mut rng = SplitMix(seed() ^ 3);
    let inputs: Vec<Vec<u8>> = (0..scale(200_000))
        .map(|_| mutate_bytes(&mut rng, &seeds))
        .collect();
    let bytes: usize = inputs.iter().map(Vec::len).sum();
    let n = inputs.len();
    let (tx, rx) = mpsc::channel();
    run_cases("fuzz_npy_bytes", inputs, CASE_LIMIT, move |b| {
        if let Ok(a) = NpyArray::from_bytes(b) {
            // What is read is consistent: the shape's product is the element count, and it
            // writes back to bytes that read as the same array.
            let n = a.shape.iter().try_fold(1usize, |x, d| x.checked_mul(*d));
            assert_eq!(n, Some(a.data.len()));
            assert_eq!(NpyArray::from_bytes(&a.to_bytes()).unwrap(), a);
            let _ = tx.send(());
        }
    });
    let ok = rx.try_iter().count();
    println!(
        "fuzz_npy_bytes: seed {:#x}: {n} inputs, {bytes} bytes fuzzed through the .npy reader ({ok} read as arrays, the rest clear errors), 0 crashes; {:.1} s",
        seed() ^ 3,
        start.elapsed().as_secs_f64()
    );
}
