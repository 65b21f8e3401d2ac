//! The plan checked against the float64 reference: the tiled emulation (which skips the tiles
//! the plan classifies empty and drops the mask on tiles it classifies full) must agree with the
//! naive computation on every example variant and on random masks and shapes; tile
//! classification must be sound element by element; tile skipping must actually skip.

#[path = "common/specs.rs"]
mod specs;

use flash_dsl::eval::{tensor_shape, Env, ParamValue, ParamValues, Point, Sizes};
use flash_dsl::model::emulate;
use flash_dsl::model::reference::{self, max_abs_diff, Problem};
use flash_dsl::plan::{
    classify, hull, key_tile_classes, plan, KernelFamily, KernelPlan, MaskTree, TileClass,
    TileConfig, TileEnv,
};
use flash_dsl::spec::{BinOp, Dim, Expr, Func, ParamKind, ScalarTy, UnOp, Var, VariantSpec};
use proptest::prelude::*;
use specs::{bin, int, k, q, var};

const TOL: f64 = 1e-9;

fn cfg(block_m: u32, block_n: u32, warps: u32, stages: u32) -> TileConfig {
    TileConfig {
        block_m,
        block_n,
        warps,
        stages,
        family: KernelFamily::Sm80,
    }
}

/// Tile configurations the tests sweep (all valid for head dims up to 128).
fn configs() -> Vec<Option<TileConfig>> {
    vec![
        None,
        Some(cfg(64, 32, 4, 1)),
        Some(cfg(128, 128, 8, 2)),
        Some(cfg(256, 64, 8, 1)),
    ]
}

/// `spec` with smaller head dims, so shape sweeps stay cheap.
fn shrink(spec: &VariantSpec, dqk: u32, dv: u32) -> VariantSpec {
    VariantSpec {
        head_dim_qk: dqk,
        head_dim_v: dv,
        ..spec.clone()
    }
}

/// Deterministic parameter values for `spec`: `i32` scalars take `int_scalar`, `f32` scalars
/// 30.0; `i32` tensors hold non-decreasing document ids (a new document every 1..=23 positions),
/// `f32` tensors small varied values.
fn params_for(spec: &VariantSpec, sizes: Sizes, int_scalar: i64, seed: u64) -> ParamValues {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    ParamValues::new(
        spec.params
            .iter()
            .enumerate()
            .map(|(i, p)| match &p.kind {
                _ if flash_dsl::dropout::is_probability(spec, i) => ParamValue::Float(0.25),
                ParamKind::Scalar(ScalarTy::I32) => ParamValue::Int(int_scalar),
                ParamKind::Scalar(ScalarTy::F32) => ParamValue::Float(30.0),
                ParamKind::Tensor { elem, dims } => {
                    let n: usize = tensor_shape(dims, sizes).iter().product();
                    match elem {
                        ScalarTy::I32 => {
                            let mut doc = 0;
                            let mut left = 1 + next() % 23;
                            ParamValue::IntTensor(
                                (0..n)
                                    .map(|_| {
                                        if left == 0 {
                                            doc += 1;
                                            left = 1 + next() % 23;
                                        }
                                        left -= 1;
                                        doc
                                    })
                                    .collect(),
                            )
                        }
                        ScalarTy::F32 => ParamValue::FloatTensor(
                            (0..n)
                                .map(|_| (next() % 2001) as f64 / 1000.0 - 1.0)
                                .collect(),
                        ),
                    }
                }
            })
            .collect(),
    )
}

struct Shape {
    batch: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
}

fn problem(spec: &VariantSpec, s: &Shape, int_scalar: i64, seed: u64) -> Problem {
    let sizes = Sizes {
        batch: s.batch,
        heads: s.hq,
        seq_q: s.sq,
        seq_k: s.sk,
    };
    let params = params_for(spec, sizes, int_scalar, seed);
    Problem::random(spec, s.batch, s.hq, s.hkv, s.sq, s.sk, params, seed)
}

/// Runs reference and emulation, asserts they agree and hold no NaN; returns the emulation.
fn agree(plan: &KernelPlan, p: &Problem, what: &str) -> reference::Output {
    let want = reference::forward(&plan.spec, p);
    let got = emulate::forward(plan, p);
    for (name, x) in [("o", &got.o), ("lse", &got.lse), ("ref o", &want.o)] {
        assert!(x.iter().all(|v| !v.is_nan()), "{what}: NaN in {name}");
    }
    let (eo, el) = (
        max_abs_diff(&want.o, &got.o),
        max_abs_diff(&want.lse, &got.lse),
    );
    assert!(
        eo < TOL && el < TOL,
        "{what}: emulation differs from reference: o {eo:e}, lse {el:e}"
    );
    got
}

fn example_specs_small_windows() -> Vec<(&'static str, VariantSpec)> {
    let mut v = specs::all();
    v.push(("sliding_window_7", specs::sliding_window_with(7)));
    v.push(("sliding_window_50", specs::sliding_window_with(50)));
    v.push(("softcap_window_33", specs::softcap_window_with(33)));
    v
}

#[test]
fn examples_match_reference_on_odd_shapes() {
    let shapes = [
        (1, 1),
        (17, 17),
        (113, 113),
        (17, 113),
        (113, 17),
        (1, 70),
        (70, 1),
    ];
    let heads = [(1, 1), (4, 2), (3, 1)];
    let mut cases = 0;
    for (name, spec) in example_specs_small_windows() {
        let spec = shrink(&spec, 16, 8);
        for (ci, config) in configs().into_iter().enumerate() {
            // A sparsity layout's blocks must hold whole tiles (the planner says so).
            let plan = match plan(&spec, config) {
                Err(flash_dsl::plan::PlanError::SparseTile { .. }) => continue,
                r => r.expect("valid config"),
            };
            for (si, &(sq, sk)) in shapes.iter().enumerate() {
                let (hq, hkv) = heads[(si + ci) % heads.len()];
                let shape = Shape {
                    batch: 1 + (si % 2),
                    hq,
                    hkv,
                    sq,
                    sk,
                };
                let p = problem(&spec, &shape, 9, (ci * 100 + si) as u64);
                agree(
                    &plan,
                    &p,
                    &format!("{name} {config:?} {sq}x{sk} heads {hq}/{hkv}"),
                );
                cases += 1;
            }
        }
    }
    assert!(cases > 200);
}

#[test]
fn examples_match_reference_at_seq_1023_and_1025() {
    for (name, spec) in [
        ("causal", specs::causal_spec()),
        ("sliding_window_100", specs::sliding_window_with(100)),
        ("document", specs::document()),
        ("prefix_lm", specs::prefix_lm()),
        ("relative_bias", specs::relative_bias()),
    ] {
        let spec = shrink(&spec, 8, 8);
        let plan = plan(&spec, None).unwrap();
        for (sq, sk) in [(1023, 1023), (1025, 700)] {
            let shape = Shape {
                batch: 1,
                hq: 1,
                hkv: 1,
                sq,
                sk,
            };
            let p = problem(&spec, &shape, 300, 5);
            agree(&plan, &p, &format!("{name} {sq}x{sk}"));
        }
    }
}

#[test]
fn head_dims_of_the_guide_are_planned_and_emulated() {
    for d in [40, 64, 96, 128, 256] {
        let spec = shrink(&specs::causal_spec(), d, d);
        let plan = plan(&spec, None).unwrap();
        let shape = Shape {
            batch: 1,
            hq: 9,
            hkv: 3,
            sq: 70,
            sk: 90,
        };
        agree(
            &plan,
            &problem(&spec, &shape, 0, d as u64),
            &format!("d{d}"),
        );
    }
}

fn assert_masked_rows(
    out: &reference::Output,
    rows: &[usize],
    seq_q: usize,
    dv: usize,
    heads: usize,
) {
    for h in 0..heads {
        for &i in rows {
            let o = &out.o[(i * heads + h) * dv..][..dv];
            assert!(o.iter().all(|&x| x == 0.0), "row {i} head {h}: o = {o:?}");
            assert_eq!(
                out.lse[h * seq_q + i],
                f64::NEG_INFINITY,
                "row {i} head {h}"
            );
        }
    }
    assert!(out.o.iter().chain(&out.lse).all(|x| !x.is_nan()));
}

#[test]
fn fully_masked_rows_give_zero_and_minus_infinity() {
    // Causal with seq_q > seq_k, bottom-right aligned: query i sees keys j <= i - 40.
    let spec = shrink(&specs::causal_spec(), 8, 8);
    for config in configs() {
        let plan = plan(&spec, config).unwrap();
        let shape = Shape {
            batch: 1,
            hq: 2,
            hkv: 1,
            sq: 100,
            sk: 60,
        };
        let p = problem(&spec, &shape, 0, 1);
        let rows: Vec<usize> = (0..40).collect();
        let out = agree(&plan, &p, "causal 100x60");
        assert_masked_rows(&out, &rows, 100, 8, 2);
        assert_masked_rows(&reference::forward(&spec, &p), &rows, 100, 8, 2);
        let low = reference::forward_lowp(&spec, &p, reference::round_bf16);
        assert_masked_rows(&low, &rows, 100, 8, 2);
        assert!(out.lse[40].is_finite());
    }

    // A mask that is false everywhere: every tile empty, every row masked.
    let never = VariantSpec {
        mask: Some(bin(BinOp::Lt, k(), int(0))),
        ..specs::base("Never", 8, flash_dsl::DType::Bf16)
    };
    let never_plan = plan(&never, None).unwrap();
    assert_eq!(never_plan.mask.as_ref().unwrap().tree, MaskTree::Atom(0));
    let p = problem(
        &never,
        &Shape {
            batch: 1,
            hq: 1,
            hkv: 1,
            sq: 70,
            sk: 200,
        },
        0,
        2,
    );
    let out = agree(&never_plan, &p, "never");
    assert_masked_rows(&out, &(0..70).collect::<Vec<_>>(), 70, 8, 1);
    assert_eq!(out.tiles_visited, 0);

    // Rows masked by data: a document id that no key shares.
    let doc = shrink(&specs::document(), 8, 8);
    let plan = plan(&doc, None).unwrap();
    let mut p = problem(
        &doc,
        &Shape {
            batch: 1,
            hq: 1,
            hkv: 1,
            sq: 30,
            sk: 30,
        },
        0,
        3,
    );
    p.params = ParamValues::new(vec![ParamValue::IntTensor(
        (0..30).map(|i| i / 10).collect(),
    )]);
    let out = agree(&plan, &p, "document");
    assert!(
        out.lse.iter().all(|x| x.is_finite()),
        "each query sees itself"
    );
}

#[test]
fn seq_k_zero_and_seq_q_zero() {
    for (name, spec) in specs::all() {
        let spec = shrink(&spec, 8, 8);
        let plan = plan(&spec, None).unwrap();
        let p = problem(
            &spec,
            &Shape {
                batch: 2,
                hq: 2,
                hkv: 1,
                sq: 5,
                sk: 0,
            },
            0,
            4,
        );
        let out = agree(&plan, &p, name);
        assert_masked_rows(&out, &[], 5, 8, 2);
        assert!(out.o.iter().all(|&x| x == 0.0));
        assert!(out.lse.iter().all(|&x| x == f64::NEG_INFINITY));
        assert_eq!(out.tiles_visited + out.tiles_skipped, 0);
        let p = problem(
            &spec,
            &Shape {
                batch: 1,
                hq: 1,
                hkv: 1,
                sq: 0,
                sk: 5,
            },
            0,
            4,
        );
        let out = agree(&plan, &p, name);
        assert!(out.o.is_empty() && out.lse.is_empty());
    }
}

#[test]
fn lowp_reference_is_the_bound_a_kernel_gets() {
    // The same-precision implementation errs by a little, never NaN, and f16 beats bf16.
    let spec = shrink(&specs::softcap_window_with(40), 64, 64);
    let p = problem(
        &spec,
        &Shape {
            batch: 1,
            hq: 2,
            hkv: 1,
            sq: 113,
            sk: 113,
        },
        0,
        8,
    );
    let exact = reference::forward(&spec, &p);
    let bf = reference::forward_lowp(&spec, &p, reference::round_bf16);
    let hf = reference::forward_lowp(&spec, &p, reference::round_f16);
    let (ebf, ehf) = (max_abs_diff(&exact.o, &bf.o), max_abs_diff(&exact.o, &hf.o));
    assert!(ebf > 1e-4 && ebf < 3e-2, "bf16 error {ebf}");
    assert!(ehf > 0.0 && ehf < ebf, "f16 error {ehf}");
    assert!(max_abs_diff(&exact.lse, &bf.lse) < 5e-2);
}

// ---------------------------------------------------------------------------------------------
// Tile skipping
// ---------------------------------------------------------------------------------------------

/// (visited, total) (query tile, key tile) pairs of one head, from the classification.
fn tile_counts(plan: &KernelPlan, seq: usize, params: &ParamValues) -> (usize, usize, usize) {
    let env = TileEnv::new(0, 0, seq, seq, params);
    let (mut visited, mut full, mut total) = (0, 0, 0);
    for t in 0..plan.query_tiles(seq) {
        for c in key_tile_classes(plan, &env, t, seq, seq) {
            total += 1;
            visited += (c != TileClass::Empty) as usize;
            full += (c == TileClass::Full) as usize;
        }
    }
    (visited, full, total)
}

#[test]
fn tile_skipping_is_real() {
    let c64 = Some(cfg(64, 64, 4, 1));
    let none = ParamValues::none();

    // Causal, 1024, 64x64 tiles: the 16·17/2 tiles on or below the diagonal, 16 of them partial.
    let causal = plan(&specs::causal_spec(), c64).unwrap();
    assert_eq!(tile_counts(&causal, 1024, &none), (136, 120, 256));

    // Dense: everything, no mask code.
    let dense = plan(&specs::dense(), c64).unwrap();
    assert_eq!(tile_counts(&dense, 1024, &none), (256, 256, 256));

    // Window 128 over 4096: O(n·w) — at most 4 key tiles per query tile.
    let window = plan(&specs::sliding_window_with(128), c64).unwrap();
    let (visited, _, total) = tile_counts(&window, 4096, &none);
    assert_eq!(total, 64 * 64);
    // Query tile t sees min(t + 1, 3) key tiles.
    assert_eq!(visited, 1 + 2 + 62 * 3);
    let window_1024 = plan(&specs::sliding_window(), c64).unwrap();
    let (v1024, _, _) = tile_counts(&window_1024, 4096, &none);
    // Query tile t sees min(t + 1, 17) key tiles.
    assert_eq!(v1024, (1..=16).sum::<usize>() + 48 * 17);

    // Document (causal && a range atom over the document ids).
    let doc = plan(&specs::document(), c64).unwrap();
    let doc_params = params_for(
        &doc.spec,
        Sizes {
            batch: 1,
            heads: 1,
            seq_q: 1024,
            seq_k: 1024,
        },
        0,
        1,
    );
    // Documents of 1..23 tokens: the range atom `doc[q] == doc[k]` leaves only tiles near the
    // diagonal, never fewer than those with a visible element (soundness is tested against
    // the reference elsewhere), never more than the causal ones.
    let (visited, full, total) = tile_counts(&doc, 1024, &doc_params);
    assert_eq!((visited, full, total), (30, 0, 256));
    // Four documents of 256 tokens: each is 4 query tiles × 4 key tiles of which the causal
    // 10 are visited; the 6 below the diagonal hold one document only and are full.
    let four_docs = ParamValues::new(vec![ParamValue::IntTensor(
        (0..1024).map(|i| (i / 256) as i64).collect(),
    )]);
    assert_eq!(tile_counts(&doc, 1024, &four_docs), (40, 24, 256));

    // Prefix-LM with a runtime prefix of 256: causal tiles plus the prefix columns above it.
    let prefix = plan(&specs::prefix_lm(), c64).unwrap();
    let params = ParamValues::new(vec![ParamValue::Int(256)]);
    let (visited, full, _) = tile_counts(&prefix, 1024, &params);
    // Key tile j < 4 is also visible to the j query tiles above the diagonal, and its diagonal
    // tile becomes full.
    assert_eq!(visited, 136 + (0..4).sum::<usize>());
    assert_eq!(full, 120 + (0..4).sum::<usize>() + 4);

    // The emulation skips what the classification says (every batch and head).
    let spec = shrink(&specs::sliding_window_with(100), 8, 8);
    let plan_w = plan(&spec, c64).unwrap();
    let p = problem(
        &spec,
        &Shape {
            batch: 2,
            hq: 3,
            hkv: 1,
            sq: 1024,
            sk: 1024,
        },
        0,
        6,
    );
    let out = agree(&plan_w, &p, "window 100");
    let (visited, _, total) = tile_counts(&plan_w, 1024, &none);
    assert_eq!(out.tiles_visited as usize, 6 * visited);
    assert_eq!((out.tiles_visited + out.tiles_skipped) as usize, 6 * total);
}

/// The figures of the report: visited / total tiles of each example at seq 4096 with its default
/// tiles (run with `--nocapture` to see them).
#[test]
fn tile_figures_of_the_examples() {
    for (name, spec) in specs::all() {
        let plan = plan(&spec, None).unwrap();
        let sizes = Sizes {
            batch: 1,
            heads: 1,
            seq_q: 4096,
            seq_k: 4096,
        };
        let params = params_for(&spec, sizes, 1024, 1);
        let (visited, full, total) = tile_counts(&plan, 4096, &params);
        eprintln!(
            "{name:16} {:>4}x{:<4} visited {visited:5} / {total:5} ({:5.1}%), full {full:5}",
            plan.config.block_m,
            plan.config.block_n,
            100.0 * visited as f64 / total as f64
        );
        assert!(visited <= total);
    }
}

// ---------------------------------------------------------------------------------------------
// Random masks
// ---------------------------------------------------------------------------------------------

/// Params of the random-mask spec: an int scalar `p` and a document tensor.
fn random_spec(mask: Expr, score: Option<Expr>) -> VariantSpec {
    VariantSpec {
        params: vec![
            specs::scalar("p", ScalarTy::I32),
            specs::tensor("doc", ScalarTy::I32, vec![Dim::Seq]),
        ],
        mask: Some(mask),
        score,
        ..specs::base("Random", 8, flash_dsl::DType::F16)
    }
}

fn random_params(p: i64, n: usize) -> ParamValues {
    ParamValues::new(vec![
        ParamValue::Int(p),
        ParamValue::IntTensor((0..n as i64).map(|i| i / 7).collect()),
    ])
}

/// `c · e`, spelled in one of the ways a user might.
fn times(c: i64, e: Expr, flip: bool) -> Option<Expr> {
    match c {
        0 => None,
        1 => Some(e),
        -1 => Some(Expr::Unary(UnOp::Neg, Box::new(e))),
        _ if flip => Some(bin(BinOp::Mul, e, int(c))),
        _ => Some(bin(BinOp::Mul, int(c), e)),
    }
}

fn sum(terms: Vec<Expr>) -> Expr {
    terms
        .into_iter()
        .reduce(|a, b| bin(BinOp::Add, a, b))
        .unwrap_or(int(0))
}

/// An integer comparison whose sides are affine in (q, k) with tile-constant offsets, the terms
/// spread over both sides.
fn affine_leaf() -> impl Strategy<Value = Expr> {
    (
        prop::array::uniform7(-3i64..=3),
        -40i64..=40,
        0usize..6,
        any::<bool>(),
    )
        .prop_map(|(c, lit, op, flip)| {
            let bases = [
                q(),
                k(),
                var(Var::SeqQ),
                var(Var::SeqK),
                Expr::Scalar(0),
                // a product of tile constants times a literal
                bin(BinOp::Sub, var(Var::SeqK), var(Var::SeqQ)),
                // the block's head
                var(Var::H),
            ];
            let terms: Vec<Expr> = c
                .iter()
                .zip(bases)
                .enumerate()
                .filter_map(|(i, (&c, b))| times(c, b, flip ^ (i % 2 == 0)))
                .collect();
            let split = terms.len() / 2;
            let mut lhs = terms;
            let rhs: Vec<Expr> = lhs.split_off(split);
            let lhs = bin(BinOp::Add, sum(lhs), int(lit));
            let rhs = sum(rhs);
            let op = [
                BinOp::Lt,
                BinOp::Le,
                BinOp::Gt,
                BinOp::Ge,
                BinOp::Eq,
                BinOp::Ne,
            ][op];
            bin(op, lhs, rhs)
        })
}

/// A comparison the planner cannot decide per tile.
fn opaque_leaf() -> impl Strategy<Value = Expr> {
    prop_oneof![
        Just(bin(
            BinOp::Eq,
            Expr::Index(1, vec![q()]),
            Expr::Index(1, vec![k()])
        )),
        Just(bin(
            BinOp::Eq,
            bin(BinOp::Rem, bin(BinOp::Mul, q(), k()), int(3)),
            int(0)
        )),
        Just(bin(
            BinOp::Lt,
            Expr::ToFloat(Box::new(bin(BinOp::Sub, q(), k()))),
            Expr::float(3.5)
        )),
        (1i64..20).prop_map(|m| bin(
            BinOp::Lt,
            bin(BinOp::Mul, q(), var(Var::SeqQ)),
            bin(BinOp::Mul, int(m), k())
        )),
        any::<bool>().prop_map(Expr::Bool),
    ]
}

fn mask_expr(opaque: bool) -> BoxedStrategy<Expr> {
    let leaf = if opaque {
        prop_oneof![3 => affine_leaf(), 1 => opaque_leaf()].boxed()
    } else {
        affine_leaf().boxed()
    };
    leaf.prop_recursive(3, 12, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| bin(BinOp::And, a, b)),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| bin(BinOp::Or, a, b)),
            inner.prop_map(|a| Expr::Unary(UnOp::Not, Box::new(a))),
        ]
    })
    .boxed()
}

/// Whether the mask is one inequality atom (or its negation): the corner test decides those
/// exactly. (`==` / `!=` atoms are only decided soundly: `3q - 3k == 1` spans 0 over a box yet
/// never holds.)
fn is_single_inequality(t: &MaskTree, atoms: &[flash_dsl::plan::AffineAtom]) -> bool {
    use flash_dsl::plan::CmpOp;
    match t {
        MaskTree::Atom(i) => !matches!(atoms[*i].op, CmpOp::Eq | CmpOp::Ne),
        MaskTree::Not(t) => is_single_inequality(t, atoms),
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Full means every element visible, Empty every element masked — checked element by element
    /// on random boxes; a lone atom (or its negation) is classified exactly.
    #[test]
    fn classification_is_sound(
        mask in mask_expr(true),
        seq_q in 1usize..300,
        seq_k in 1usize..300,
        p in -20i64..300,
        b0 in (0usize..300, 0usize..40),
        bk in (0usize..300, 0usize..40),
        head in 0usize..4,
    ) {
        let spec = random_spec(mask, None);
        let plan = plan(&spec, None).unwrap();
        let mplan = plan.mask.as_ref().unwrap();
        let q0 = b0.0 % seq_q;
        let q1 = (q0 + b0.1).min(seq_q - 1);
        let k0 = bk.0 % seq_k;
        let k1 = (k0 + bk.1).min(seq_k - 1);
        let sizes = Sizes { batch: 1, heads: 4, seq_q, seq_k };
        let params = random_params(p, seq_q.max(seq_k));
        let env = Env::new(&spec, &params, sizes);
        let tenv = TileEnv::new(0, head, seq_q, seq_k, &params);
        let class = classify(mplan, &spec, &tenv, q0 as i64, q1 as i64, k0 as i64, k1 as i64);
        let (mut any_true, mut any_false) = (false, false);
        for i in q0..=q1 {
            for j in k0..=k1 {
                let pt = Point { b: 0, h: head as i64, q: i as i64, k: j as i64, s: 0.0 };
                if env.mask(&pt) { any_true = true } else { any_false = true }
            }
        }
        match class {
            TileClass::Full => prop_assert!(!any_false, "Full tile has a masked element"),
            TileClass::Empty => prop_assert!(!any_true, "Empty tile has a visible element"),
            TileClass::Partial => {
                if is_single_inequality(&mplan.tree, &mplan.atoms) {
                    prop_assert!(any_true && any_false, "a lone atom must be decided exactly");
                }
            }
        }
        if let MaskTree::Const(c) = mplan.tree {
            prop_assert_eq!(class, if c { TileClass::Full } else { TileClass::Empty });
        }
    }

    /// The hulls are sound: every visible (query, key) with the query in the given range has its
    /// key inside `key_hull`, and with the key in the given range its query inside `query_hull`
    /// (the backward's walk over query tiles skips everything outside it).
    #[test]
    fn hulls_are_sound(
        mask in mask_expr(true),
        seq_q in 1usize..200,
        seq_k in 1usize..200,
        p in -20i64..200,
        r in (0usize..200, 0usize..70),
        head in 0usize..4,
        transposed in any::<bool>(),
    ) {
        let spec = random_spec(mask, None);
        let plan = plan(&spec, None).unwrap();
        let mplan = plan.mask.as_ref().unwrap();
        let n_given = if transposed { seq_k } else { seq_q };
        let a0 = r.0 % n_given;
        let a1 = (a0 + r.1).min(n_given - 1);
        let sizes = Sizes { batch: 1, heads: 4, seq_q, seq_k };
        let params = random_params(p, seq_q.max(seq_k));
        let env = Env::new(&spec, &params, sizes);
        let tenv = TileEnv::new(0, head, seq_q, seq_k, &params);
        let (lo, hi) = hull(mplan, &tenv, a0 as i64, a1 as i64, transposed);
        for i in 0..seq_q as i64 {
            for j in 0..seq_k as i64 {
                let (given, bounded) = if transposed { (j, i) } else { (i, j) };
                if given < a0 as i64 || given > a1 as i64 {
                    continue;
                }
                let pt = Point { b: 0, h: head as i64, q: i, k: j, s: 0.0 };
                if env.mask(&pt) {
                    prop_assert!(
                        lo <= bounded && bounded <= hi,
                        "visible (q {i}, k {j}) outside the hull [{lo}, {hi}] of [{a0}, {a1}] (transposed {transposed})"
                    );
                }
            }
        }
    }

    /// Purely affine masks never produce Opaque nodes.
    #[test]
    fn affine_masks_have_no_opaque_part(mask in mask_expr(false)) {
        let spec = random_spec(mask, None);
        let plan = plan(&spec, None).unwrap();
        let mut stack = vec![&plan.mask.as_ref().unwrap().tree];
        while let Some(t) = stack.pop() {
            match t {
                MaskTree::Opaque => prop_assert!(false, "opaque node in an affine mask"),
                MaskTree::And(xs) | MaskTree::Or(xs) => stack.extend(xs),
                MaskTree::Not(x) => stack.push(x),
                _ => {}
            }
        }
        let atoms = &plan.mask.as_ref().unwrap().atoms;
        for (i, a) in atoms.iter().enumerate() {
            prop_assert!(!atoms[..i].contains(a), "duplicate atom");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The tiled emulation equals the reference on random masks, score mods, shapes and tiles.
    #[test]
    fn emulation_matches_reference_on_random_problems(
        mask in mask_expr(true),
        score in 0usize..3,
        seq_q in 0usize..150,
        seq_k in 0usize..150,
        heads in 0usize..4,
        config in 0usize..4,
        p in -10i64..150,
        seed in any::<u64>(),
    ) {
        let score = match score {
            0 => None,
            1 => Some(bin(
                BinOp::Mul,
                Expr::float(2.0),
                Expr::Call(Func::Tanh, vec![bin(BinOp::Div, var(Var::S), Expr::float(2.0))]),
            )),
            _ => Some(bin(
                BinOp::Add,
                var(Var::S),
                bin(BinOp::Mul, Expr::float(0.05), Expr::ToFloat(Box::new(bin(BinOp::Sub, k(), q())))),
            )),
        };
        let spec = random_spec(mask, score);
        let plan = plan(&spec, configs()[config]).unwrap();
        let (hq, hkv) = [(1, 1), (2, 1), (4, 2), (3, 3)][heads];
        let batch = 1 + (seed % 2) as usize;
        let mut problem =
            Problem::random(&spec, batch, hq, hkv, seq_q, seq_k, ParamValues::none(), seed);
        problem.params = random_params(p, seq_q.max(seq_k));
        agree(&plan, &problem, "random");
    }
}

// ---------------------------------------------------------------------------------------------
// The example files
// ---------------------------------------------------------------------------------------------

/// Every `examples/variants/*.flash` file, parsed and validated, by file stem.
fn parsed_examples() -> Vec<(String, VariantSpec)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/variants");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples/variants")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "flash"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let src = std::fs::read_to_string(&path).unwrap();
            let mut specs = flash_dsl::parse::parse_str(&src)
                .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
            assert_eq!(specs.len(), 1, "{}", path.display());
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            (stem, specs.pop().unwrap())
        })
        .collect()
}

#[test]
fn parsed_examples_plan_like_the_hand_built_specs() {
    let parsed = parsed_examples();
    let built = specs::all();
    assert_eq!(
        parsed.len(),
        built.len(),
        "one hand-built spec per example file"
    );
    for ((stem, got), (name, want)) in parsed.iter().zip(&built) {
        assert_eq!(stem, name);
        let (pg, pw) = (plan(got, None).unwrap(), plan(want, None).unwrap());
        assert_eq!(pg.config, pw.config, "{stem}");
        assert_eq!(pg.kernel_name, pw.kernel_name, "{stem}");
        assert_eq!(pg.args, pw.args, "{stem}");
        let (mg, mw) = (pg.mask.as_ref(), pw.mask.as_ref());
        assert_eq!(
            mg.map(|m| (&m.atoms, &m.tree)),
            mw.map(|m| (&m.atoms, &m.tree)),
            "{stem}"
        );
    }
}

#[test]
fn parsed_examples_match_reference() {
    for (stem, spec) in parsed_examples() {
        let spec = shrink(&spec, 16, 16);
        for config in configs() {
            let plan = match plan(&spec, config) {
                Err(flash_dsl::plan::PlanError::SparseTile { .. }) => continue,
                r => r.unwrap(),
            };
            for (sq, sk) in [(17, 113), (113, 17), (130, 130)] {
                let shape = Shape {
                    batch: 1,
                    hq: 2,
                    hkv: 1,
                    sq,
                    sk,
                };
                agree(
                    &plan,
                    &problem(&spec, &shape, 40, 11),
                    &format!("{stem} {sq}x{sk}"),
                );
            }
        }
    }
}
