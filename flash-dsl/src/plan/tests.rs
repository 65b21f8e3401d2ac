//! Unit tests of the planner: defaults, rules, mask atoms, classification.
use super::*;
use crate::eval::ParamValues;
use crate::spec::{BinOp, DType, Dim, Expr, ParamDecl, ParamKind, ScalarTy, UnOp, Var};

fn spec(params: Vec<ParamDecl>, mask: Option<Expr>) -> VariantSpec {
    VariantSpec {
        name: "Gemma-Local2".into(),
        doc: String::new(),
        head_dim_qk: 128,
        head_dim_v: 64,
        dtype: DType::Bf16,
        scale: None,
        params,
        mask,
        score: None,
        dropout: None,
        sparsity: None,
        fp8: None,
    }
}
fn var(v: Var) -> Expr {
    Expr::Var(v)
}
fn causal() -> Expr {
    Expr::bin(
        BinOp::Le,
        var(Var::K),
        Expr::bin(
            BinOp::Add,
            var(Var::Q),
            Expr::bin(BinOp::Sub, var(Var::SeqK), var(Var::SeqQ)),
        ),
    )
}
fn cfg(block_m: u32, block_n: u32, warps: u32, stages: u32) -> TileConfig {
    TileConfig {
        block_m,
        block_n,
        warps,
        stages,
        family: KernelFamily::Sm80,
    }
}

#[test]
fn defaults_by_head_dim() {
    let mut s = spec(vec![], None);
    for (dqk, dv, want) in [
        (64, 64, cfg(128, 64, 4, 2)),
        (128, 64, cfg(128, 32, 4, 2)),
        (96, 256, cfg(64, 64, 4, 1)),
        (256, 256, cfg(64, 64, 4, 1)),
    ] {
        (s.head_dim_qk, s.head_dim_v) = (dqk, dv);
        assert_eq!(default_config(&s), want, "d {dqk}x{dv}");
        assert!(plan(&s, None).is_ok());
        let sm90 = default_config_for(&s, KernelFamily::Sm90);
        assert_eq!(
            (sm90.block_m, sm90.warps, sm90.family),
            (128, 8, KernelFamily::Sm90)
        );
        assert!(
            plan(&s, Some(sm90)).is_ok(),
            "sm90 default for d {dqk}x{dv}"
        );
    }
}

#[test]
fn a_score_hook_reading_a_tensor_gets_16_row_warps() {
    let table = ParamDecl {
        name: "bias".into(),
        frozen: false,
        kind: ParamKind::Tensor {
            elem: ScalarTy::F32,
            dims: vec![crate::spec::Dim::Fixed(8)],
        },
    };
    let score = Expr::bin(BinOp::Add, var(Var::S), Expr::Index(0, vec![var(Var::H)]));
    let mut s = spec(vec![table], None);
    s.score = Some(score);
    assert_eq!(default_config(&s), cfg(64, 64, 4, 2));
}

#[test]
fn sm90_rules_name_the_value() {
    let s = spec(vec![], None);
    let sm90 = |block_m, block_n, warps, stages| TileConfig {
        family: KernelFamily::Sm90,
        ..cfg(block_m, block_n, warps, stages)
    };
    assert_eq!(
        plan(&s, Some(sm90(128, 64, 4, 2))).unwrap_err(),
        PlanError::Warpgroups {
            block_m: 128,
            warps: 4
        }
    );
    assert_eq!(
        plan(&s, Some(sm90(128, 32, 8, 2))).unwrap_err(),
        PlanError::Sm90Tile {
            block_n: 32,
            stages: 2
        }
    );
    let p = plan(&s, Some(sm90(128, 128, 8, 2))).unwrap();
    // Q 128×128, two stages of K (128×128) and V (128×64), plus the alignment slack.
    assert_eq!(
        p.smem_bytes(),
        1024 + 2 * (128 * 128 + 2 * 128 * (128 + 64))
    );
    assert!(p.kernel_name.ends_with("_sm90"));
    assert_eq!(KernelFamily::for_arch("sm_90a"), KernelFamily::Sm90Ws);
    assert_eq!(KernelFamily::for_arch("sm_90"), KernelFamily::Sm80);
    assert!(!KernelFamily::Sm90.runs_on("sm_80"));
    assert!(!KernelFamily::Sm90Ws.runs_on("sm_90"));
}

#[test]
fn warp_specialised_plans_carry_tma_descriptors() {
    let s = spec(vec![], None);
    let ws = |block_m, block_n, warps| TileConfig {
        family: KernelFamily::Sm90Ws,
        ..cfg(block_m, block_n, warps, 2)
    };
    // warps count the producer warpgroup: block_m / 16 + 4.
    assert_eq!(
        plan(&s, Some(ws(128, 128, 8))).unwrap_err(),
        PlanError::Warpgroups {
            block_m: 128,
            warps: 8
        }
    );
    let p = plan(&s, Some(ws(128, 128, 12))).unwrap();
    // 164 bytes of operands and scalars, no params: the descriptors start at the next
    // 128-byte boundary, one per operand loaded through TMA (Q, K, V).
    let tma: Vec<(ArgField, u32)> = p
        .args
        .slots
        .iter()
        .filter(|s| matches!(s.field, ArgField::Tma(_)))
        .map(|s| (s.field, s.offset))
        .collect();
    assert_eq!(
        tma,
        [
            (ArgField::Tma(0), 256),
            (ArgField::Tma(1), 384),
            (ArgField::Tma(2), 512)
        ]
    );
    assert_eq!(p.args.total_size, 256 + 3 * TMA_DESC_BYTES);
    assert_eq!(p.threads(), 384);
    assert!(p.kernel_name.ends_with("_sm90ws"));
    // Other families have no descriptors; above head dim 128 the default leaves sm90ws.
    assert!(!plan(&s, None)
        .unwrap()
        .args
        .slots
        .iter()
        .any(|s| matches!(s.field, ArgField::Tma(_))));
    let mut wide = s.clone();
    (wide.head_dim_qk, wide.head_dim_v) = (256, 256);
    assert_eq!(
        default_config_for(&wide, KernelFamily::Sm90Ws).family,
        KernelFamily::Sm90
    );
}

#[test]
fn invalid_configs_name_the_value() {
    let s = spec(vec![], None);
    let err = |c| plan(&s, Some(c)).unwrap_err();
    assert_eq!(err(cfg(128, 64, 2, 2)), PlanError::Warps(2));
    assert_eq!(
        err(cfg(96, 64, 4, 2)),
        PlanError::RowsPerWarp {
            block_m: 96,
            warps: 4
        }
    );
    assert_eq!(err(cfg(128, 48, 4, 2)), PlanError::BlockN(48));
    assert_eq!(err(cfg(128, 64, 4, 4)), PlanError::Stages(4));
    assert_eq!(err(cfg(128, 64, 4, 3)), PlanError::Stages(3));
    assert_eq!(
        err(cfg(128, 64, 4, 4)).to_string(),
        "the sm80 forward kernel takes stages 1 (K and V share one buffer pair) or 2 (double-buffered); got 4"
    );
    let mut big = s.clone();
    (big.head_dim_qk, big.head_dim_v) = (256, 256);
    let e = plan(&big, Some(cfg(128, 128, 4, 2))).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the tiles need 327680 bytes of shared memory; the limit is 232448"
    );
    for d in [0, 12, 264] {
        let mut bad = s.clone();
        bad.head_dim_v = d;
        assert_eq!(
            plan(&bad, None).unwrap_err(),
            PlanError::HeadDim {
                which: "head_dim_v",
                value: d
            }
        );
    }
}

#[test]
fn smem_threads_name_and_layout() {
    let params = vec![
        ParamDecl {
            name: "cap".into(),
            frozen: false,
            kind: ParamKind::Scalar(ScalarTy::F32),
        },
        ParamDecl {
            name: "doc".into(),
            frozen: false,
            kind: ParamKind::Tensor {
                elem: ScalarTy::I32,
                dims: vec![Dim::Seq],
            },
        },
        ParamDecl {
            name: "n".into(),
            frozen: false,
            kind: ParamKind::Scalar(ScalarTy::I32),
        },
    ];
    let mut s = spec(params, None);
    s.head_dim_qk = 40;
    let p = plan(&s, Some(cfg(128, 32, 8, 2))).unwrap();
    // pad64(40) = 64, pad64(64) = 64.
    assert_eq!(p.smem_bytes(), 2 * (128 * 64 + 2 * 32 * 128));
    assert_eq!(p.threads(), 256);
    assert_eq!(
        p.kernel_name,
        "flash_fwd_gemma_local2_bf16_d40x64_m128n32w8s2"
    );
    // Q, K, V, O: pointer + 3 strides (32 bytes each), the LSE pointer, 5 sizes, 2 scales
    // = 164 bytes; then the params by the C rules.
    let offsets: Vec<(u32, u32)> = p
        .args
        .slots
        .iter()
        .filter(|s| matches!(s.field, ArgField::Param(_)))
        .map(|s| (s.offset, s.size))
        .collect();
    assert_eq!(offsets, [(164, 4), (168, 8), (176, 4)]);
    assert_eq!(p.args.total_size, 184);
    assert_eq!(
        plan(&spec(vec![], None), None).unwrap().args.total_size,
        168
    );
}

#[test]
fn causal_is_one_atom() {
    let m = analyse_mask(&spec(vec![], None), &causal());
    assert_eq!(m.tree, MaskTree::Atom(0));
    assert_eq!(
        m.atoms,
        [AffineAtom {
            cq: -1,
            ck: 1,
            offset: Expr::bin(BinOp::Sub, var(Var::SeqQ), var(Var::SeqK)),
            op: CmpOp::Le,
        }]
    );
}

#[test]
fn equal_atoms_are_shared_and_constants_fold() {
    let s = spec(vec![], None);
    // q >= k - (seq_k - seq_q) is causal spelled differently.
    let other = Expr::bin(
        BinOp::Ge,
        var(Var::Q),
        Expr::bin(
            BinOp::Sub,
            var(Var::K),
            Expr::bin(BinOp::Sub, var(Var::SeqK), var(Var::SeqQ)),
        ),
    );
    let m = analyse_mask(&s, &Expr::bin(BinOp::And, causal(), other));
    assert_eq!(m.atoms.len(), 1);
    assert_eq!(m.tree, MaskTree::Atom(0));
    // 3 < 4 || doc-like opaque: true.
    let t = Expr::bin(BinOp::Lt, Expr::Int(3), Expr::Int(4));
    let opaque = Expr::bin(
        BinOp::Eq,
        Expr::bin(BinOp::Rem, var(Var::Q), Expr::Int(2)),
        Expr::Int(0),
    );
    let m = analyse_mask(&s, &Expr::bin(BinOp::Or, t.clone(), opaque.clone()));
    assert_eq!(m.tree, MaskTree::Const(true));
    let m = analyse_mask(&s, &Expr::bin(BinOp::And, t, opaque.clone()));
    assert_eq!(m.tree, MaskTree::Opaque);
    let not_not = Expr::Unary(
        UnOp::Not,
        Box::new(Expr::Unary(UnOp::Not, Box::new(causal()))),
    );
    assert_eq!(analyse_mask(&s, &not_not).tree, MaskTree::Atom(0));
    // q * k is not affine; q * 3 and seq_q * seq_k are.
    let qk = Expr::bin(
        BinOp::Lt,
        Expr::bin(BinOp::Mul, var(Var::Q), var(Var::K)),
        Expr::Int(5),
    );
    assert_eq!(analyse_mask(&s, &qk).tree, MaskTree::Opaque);
    let ok = Expr::bin(
        BinOp::Gt,
        Expr::bin(BinOp::Mul, var(Var::Q), Expr::Int(3)),
        Expr::bin(BinOp::Mul, var(Var::SeqQ), var(Var::SeqK)),
    );
    let m = analyse_mask(&s, &ok);
    // -3q + seq_q·seq_k + 1 <= 0
    assert_eq!((m.atoms[0].cq, m.atoms[0].ck), (-3, 0));
    let env = TileEnv {
        seq_q: 4,
        seq_k: 5,
        b: 0,
        h: 0,
        scalars: vec![],
        int_tensors: vec![],
    };
    assert_eq!(env.offset(&m.atoms[0].offset), 21);
    // A float comparison is opaque.
    let f = Expr::bin(
        BinOp::Lt,
        Expr::ToFloat(Box::new(var(Var::Q))),
        Expr::float(2.5),
    );
    assert_eq!(analyse_mask(&s, &f).tree, MaskTree::Opaque);
}

#[test]
fn classification_of_causal_tiles() {
    let s = spec(vec![], Some(causal()));
    let p = plan(&s, Some(cfg(64, 64, 4, 1))).unwrap();
    let env = TileEnv {
        seq_q: 256,
        seq_k: 256,
        b: 0,
        h: 0,
        scalars: vec![],
        int_tensors: vec![],
    };
    use TileClass::*;
    assert_eq!(
        key_tile_classes(&p, &env, 1, 256, 256),
        [Full, Partial, Empty, Empty]
    );
    // Eq atoms: q == k is mixed on the diagonal, never off it; q != k the reverse.
    let eq = Expr::bin(BinOp::Eq, var(Var::Q), var(Var::K));
    let m = analyse_mask(&s, &eq);
    assert_eq!(classify(&m, &s, &env, 0, 63, 0, 63), Partial);
    assert_eq!(classify(&m, &s, &env, 0, 63, 64, 127), Empty);
    assert_eq!(classify(&m, &s, &env, 5, 5, 5, 5), Full);
    let ne = Expr::Unary(UnOp::Not, Box::new(eq));
    let m = analyse_mask(&s, &ne);
    assert_eq!(classify(&m, &s, &env, 0, 63, 64, 127), Full);
    assert_eq!(classify(&m, &s, &env, 5, 5, 5, 5), Empty);
}

// ---------------------------------------------------------------------------------------------
// Block maps
// ---------------------------------------------------------------------------------------------

fn parse_one(src: &str) -> VariantSpec {
    crate::parse::parse_str(src)
        .unwrap_or_else(|d| panic!("{d:?}"))
        .remove(0)
}

const DOC: &str = "pub Doc { head_dim: 64, dtype: bf16, params: { doc: [i32; seq] }, mask: causal && doc[q] == doc[k], }";

#[test]
fn block_maps_are_planned_only_for_masks_that_read_tensors() {
    let doc = parse_one(DOC);
    assert!(needs_block_map(&doc));
    for affine in [
        "pub C { head_dim: 64, dtype: bf16, mask: causal, }",
        "pub W { head_dim: 64, dtype: bf16, mask: causal && q - k < 128, }",
        "pub P { head_dim: 64, dtype: bf16, params: { prefix: i32 }, mask: causal || k < prefix, }",
        "pub D { head_dim: 64, dtype: bf16, }",
    ] {
        let s = parse_one(affine);
        assert!(!needs_block_map(&s), "{affine}");
        assert!(plan(&s, None).unwrap().block_map.is_none());
    }
    // The forward reads the map after its other operands; the backward main kernel reads the
    // transposed map at its own tile sizes.
    let f = plan(&doc, Some(default_config_for(&doc, KernelFamily::Sm90Ws))).unwrap();
    let m = f.block_map.expect("a forward map");
    assert_eq!(f.operands.last().unwrap().name, "block_map");
    assert_eq!(
        (m.tile_q, m.tile_k, m.along_keys),
        (f.config.block_m, f.config.block_n, false)
    );
    assert!(!m.per_batch && !m.per_head);
    let bc = default_backward_config_for(&doc, KernelFamily::Sm90);
    let b = backward::plan_backward_main(&doc, bc).unwrap();
    let bm = b.block_map.expect("a backward map");
    assert!(bm.along_keys);
    assert_eq!((bm.tile_q, bm.tile_k), (bc.block_m, bc.block_n));
    // Per batch / per head as the mask reads b / h.
    let per = parse_one(
        "pub H { head_dim: 64, dtype: bf16, params: { doc: [i32; heads, seq] }, mask: doc[h, q] == doc[h, k], }",
    );
    let m = BlockMapPlan::for_spec(&per, 64, 128, false).unwrap();
    assert!(m.per_head && !m.per_batch);
    assert_eq!(m.slots(3, 5), 5);
    assert_eq!(m.len(3, 5, 100, 300), 5 * 2 * (3 + 1));
    assert_eq!(m.slot(2, 4, 5), 4);
}

/// Sorted document ids in `0..docs` for `n` positions: the `doc` param of [`DOC`].
fn sorted_doc_ids(rng: &mut crate::rng::SplitMix, n: usize, docs: u64) -> ParamValues {
    let mut ids: Vec<i64> = (0..n).map(|_| rng.below(docs) as i64).collect();
    ids.sort();
    ParamValues::new(vec![crate::eval::ParamValue::IntTensor(ids)])
}

/// Whether `env`'s mask shows key `k` to query `q` of head `h` (batch element 0).
fn shows(env: &crate::eval::Env, h: usize, q: usize, k: usize) -> bool {
    env.mask(&crate::eval::Point {
        b: 0,
        h: h as i64,
        q: q as i64,
        k: k as i64,
        s: 0.0,
    })
}

/// The evaluator of `spec` over one batch element and one head of `sq` queries and `sk` keys.
fn one_sequence_env<'a>(
    spec: &'a VariantSpec,
    pv: &'a ParamValues,
    sq: usize,
    sk: usize,
) -> crate::eval::Env<'a> {
    crate::eval::Env::new(
        spec,
        pv,
        crate::eval::Sizes {
            batch: 1,
            heads: 1,
            seq_q: sq,
            seq_k: sk,
        },
    )
}

/// The backward's map of 128-key tiles records the class of each 64-key part (the part a
/// warpgroup owns) exactly: empty when no element of it is visible, full when every element is
/// and it does not run past either sequence, partial otherwise; the tile's own partial bit is
/// set unless both parts are full. Only that map carries parts.
#[test]
fn backward_map_entries_record_their_parts() {
    let doc = parse_one(DOC);
    let mut rng = crate::rng::SplitMix(7);
    let (tq, tk) = (64usize, 128usize);
    assert_eq!(
        BlockMapPlan::for_spec(&doc, 64, 128, false)
            .unwrap()
            .sub_tiles(),
        0
    );
    assert_eq!(
        BlockMapPlan::for_spec(&doc, 64, 64, true)
            .unwrap()
            .sub_tiles(),
        0
    );
    let m = BlockMapPlan::for_spec(&doc, 64, 128, true).unwrap();
    assert_eq!((m.sub_tiles(), m.entry_shift()), (2, 5));
    let (mut empty, mut full) = (0, 0);
    for (sq, sk) in [(130, 77), (300, 113), (257, 257), (640, 640)] {
        let pv = sorted_doc_ids(&mut rng, sq.max(sk), 5);
        let eval = one_sequence_env(&doc, &pv, sq, sk);
        let visible = |q: usize, k: usize| shows(&eval, 0, q, k);
        let words = host_block_map(&doc, &m, &pv, 1, 1, sq, sk);
        let width = m.cols(sq, sk) + 1;
        for kt in 0..m.rows(sq, sk) {
            let row = &words[kt * width..(kt + 1) * width];
            let listed = block_map::map_row(&words, &m, 0, kt, sq, sk);
            for (i, &e) in row[1..=row[0] as usize].iter().enumerate() {
                let qt = (e >> 5) as usize;
                assert_eq!(listed[i], (qt, e & 1 == 1), "map_row decodes the entry");
                let (q0, q1) = (qt * tq, (qt * tq + tq).min(sq) - 1);
                let mut all_full = true;
                for part in 0..2 {
                    let ks0 = kt * tk + 64 * part;
                    let class = (e >> (1 + 2 * part)) & 3;
                    let ks1 = (ks0 + 63).min(sk.saturating_sub(1));
                    let vis: Vec<bool> = if ks0 >= sk {
                        Vec::new()
                    } else {
                        (q0..=q1)
                            .flat_map(|q| (ks0..=ks1).map(move |k| (q, k)))
                            .map(|(q, k)| visible(q, k))
                            .collect()
                    };
                    let over = q0 + tq > sq || ks0 + 64 > sk;
                    let want = if !vis.iter().any(|v| *v) {
                        0
                    } else if !over && vis.iter().all(|v| *v) {
                        2
                    } else {
                        1
                    };
                    assert_eq!(class, want, "{sq}x{sk} tile {qt},{kt} part {part}");
                    empty += (class == 0) as usize;
                    full += (class == 2) as usize;
                    all_full &= class == 2;
                }
                assert_eq!(e & 1 == 1, !all_full, "{sq}x{sk} tile {qt},{kt}");
            }
        }
    }
    assert!(empty > 0 && full > 0, "the cases hold empty and full parts");
}

/// The host map agrees with the kernels' three-valued classification wherever that is definite,
/// and lists exactly the tiles holding a visible element (brute force over every element).
#[test]
fn host_block_maps_are_exact() {
    let doc = parse_one(DOC);
    let mut rng = crate::rng::SplitMix(99);
    for (sq, sk) in [(1, 1), (17, 40), (300, 113), (257, 257)] {
        let pv = sorted_doc_ids(&mut rng, sq.max(sk), 6);
        let env = TileEnv::new(0, 0, sq, sk, &pv);
        let eval = one_sequence_env(&doc, &pv, sq, sk);
        let mask = doc.mask.as_ref().map(|m| analyse_mask(&doc, m)).unwrap();
        for along_keys in [false, true] {
            let m = BlockMapPlan::for_spec(&doc, 64, 32, along_keys).unwrap();
            let words = host_block_map(&doc, &m, &pv, 1, 1, sq, sk);
            for r in 0..m.rows(sq, sk) {
                let listed = block_map::map_row(&words, &m, 0, r, sq, sk);
                for c in 0..m.cols(sq, sk) {
                    let (qt, kt) = if along_keys { (c, r) } else { (r, c) };
                    let (q0, k0) = (qt * 64, kt * 32);
                    let (q1, k1) = ((q0 + 64).min(sq) - 1, (k0 + 32).min(sk) - 1);
                    let vis: Vec<bool> = (q0..=q1)
                        .flat_map(|q| (k0..=k1).map(move |k| (q, k)))
                        .map(|(q, k)| shows(&eval, 0, q, k))
                        .collect();
                    let entry = listed.iter().find(|e| e.0 == c);
                    let overhang = q0 + 64 > sq || k0 + 32 > sk;
                    match entry {
                        None => assert!(vis.iter().all(|v| !v), "{sq}x{sk} tile {qt},{kt} skipped"),
                        Some((_, true)) => assert!(
                            vis.iter().any(|v| *v) && (overhang || vis.iter().any(|v| !v)),
                            "{sq}x{sk} tile {qt},{kt} partial"
                        ),
                        Some((_, false)) => assert!(
                            !overhang && vis.iter().all(|v| *v),
                            "{sq}x{sk} tile {qt},{kt} full"
                        ),
                    }
                    let cls = classify(
                        &mask, &doc, &env, q0 as i64, q1 as i64, k0 as i64, k1 as i64,
                    );
                    match cls {
                        TileClass::Empty => assert!(entry.is_none()),
                        TileClass::Full => assert!(entry.is_some_and(|e| e.1 == overhang)),
                        TileClass::Partial => {}
                    }
                }
                // Entries ascend.
                assert!(listed.windows(2).all(|w| w[0].0 < w[1].0));
            }
        }
    }
}

/// A declared layout: the planner keeps tiles inside its blocks, the map lists exactly the
/// layout's blocks (ANDed with the mask), and the reference agrees element by element.
#[test]
fn sparsity_layouts_plan_and_map() {
    let s = parse_one(
        "pub B { head_dim: 64, dtype: bf16, params: { blocks: [i32; heads, seq / 128, 3] }, mask: causal, sparsity: blocks, }",
    );
    assert!(needs_block_map(&s));
    let bad = TileConfig {
        block_m: 192,
        block_n: 128,
        warps: 12,
        stages: 2,
        family: KernelFamily::Sm90,
    };
    assert_eq!(
        config_is_valid(&s, &bad),
        Err(PlanError::SparseTile {
            block: 128,
            block_m: 192,
            block_n: 128
        })
    );
    let m = BlockMapPlan::for_spec(&s, 64, 64, false).unwrap();
    assert!(m.per_head && !m.per_batch && m.layout);
    // 2 heads, 300 positions: 3 query blocks of 128 per head, 3 slots each.
    let layout = vec![
        0, -1, -1, 1, 0, 1, 2, -1, 0, /* head 1 */ -1, -1, -1, 0, 0, 0, 1, 2, 2,
    ];
    let pv = ParamValues::new(vec![crate::eval::ParamValue::IntTensor(layout.clone())]);
    let words = host_block_map(&s, &m, &pv, 1, 2, 300, 300);
    assert_eq!(words.len(), m.len(1, 2, 300, 300));
    assert_eq!(
        &words[words.len() - 2..],
        &[0, 0],
        "no layout error on the host"
    );
    let sizes = crate::eval::Sizes {
        batch: 1,
        heads: 2,
        seq_q: 300,
        seq_k: 300,
    };
    let env = crate::eval::Env::new(&s, &pv, sizes);
    for h in 0..2usize {
        for qt in 0..m.rows(300, 300) {
            let listed = block_map::map_row(&words, &m, h, qt, 300, 300);
            for kt in 0..m.cols(300, 300) {
                let (qb, kb) = (qt * 64 / 128, kt * 64 / 128);
                let row = &layout[(h * 3 + qb) * 3..(h * 3 + qb + 1) * 3];
                let any = (qt * 64..(qt * 64 + 64).min(300))
                    .any(|q| (kt * 64..(kt * 64 + 64).min(300)).any(|k| shows(&env, h, q, k)));
                let is_listed = listed.iter().any(|e| e.0 == kt);
                assert_eq!(is_listed, any, "head {h} tile {qt},{kt}");
                if is_listed {
                    assert!(
                        row.contains(&(kb as i64)),
                        "a listed tile's block is in the layout"
                    );
                }
            }
        }
    }
}

#[test]
fn sm90ws_takes_two_or_three_stages_and_overlaps_score_variants() {
    let plain = spec(vec![], None);
    let ws = |stages| TileConfig {
        family: KernelFamily::Sm90Ws,
        ..cfg(128, 128, 12, stages)
    };
    assert!(plan(&plain, Some(ws(2))).is_ok());
    let three = plan(&plain, Some(ws(3))).unwrap();
    // Two Q tiles of 128×128 (`q_buffers`: the second fits), three stages of K (128×128) and V
    // (128×64) in bf16, plus the alignment slack.
    assert_eq!(
        three.smem_bytes(),
        1024 + 2 * (2 * 128 * 128 + 3 * 128 * (128 + 64))
    );
    assert_eq!(
        plan(&plain, Some(ws(4))).unwrap_err(),
        PlanError::Sm90WsTile {
            block_n: 128,
            stages: 4
        }
    );
    // 192 keys per step: two stages fit (Q 32 KiB, K 48 KiB and V 24 KiB per stage at head
    // dims 128/64; and a second Q tile), three do not.
    let wide = |stages| TileConfig {
        family: KernelFamily::Sm90Ws,
        ..cfg(128, 192, 12, stages)
    };
    assert_eq!(
        plan(&plain, Some(wide(2))).unwrap().smem_bytes(),
        1024 + 2 * (2 * 128 * 128 + 2 * 192 * (128 + 64))
    );
    assert!(matches!(
        plan(&plain, Some(wide(3))).unwrap_err(),
        PlanError::SharedMemory { .. }
    ));
    assert!(PlanError::Sm90WsTile {
        block_n: 128,
        stages: 4
    }
    .to_string()
    .contains("got block_n 128, stages 4"));
    // The default: the overlapped schedule where the variant has a score expression.
    assert_eq!(default_config_for(&plain, KernelFamily::Sm90Ws).stages, 2);
    let scored = VariantSpec {
        score: Some(Expr::Binary(
            BinOp::Mul,
            Box::new(Expr::Var(Var::S)),
            Box::new(Expr::Float(crate::spec::F64Bits::new(0.5))),
        )),
        ..plain.clone()
    };
    assert_eq!(default_config_for(&scored, KernelFamily::Sm90Ws).stages, 3);
    // ... and for masks at head dims up to 64 (a mask alone at d128 keeps two).
    let causal = crate::parse::parse_str("C { head_dim: 128, dtype: bf16, mask: causal }")
        .unwrap()
        .remove(0);
    assert_eq!(default_config_for(&causal, KernelFamily::Sm90Ws).stages, 2);
    let causal64 = VariantSpec {
        head_dim_qk: 64,
        head_dim_v: 64,
        ..causal.clone()
    };
    assert_eq!(
        default_config_for(&causal64, KernelFamily::Sm90Ws).stages,
        3
    );
    assert_eq!(
        default_config_for(&causal64, KernelFamily::Sm90Ws).block_m,
        128
    );
    // The plain dense variant at head dims up to 128: three consumer warpgroups.
    let dense64 = VariantSpec {
        mask: None,
        ..causal64.clone()
    };
    let wide = default_config_for(&dense64, KernelFamily::Sm90Ws);
    assert_eq!((wide.block_m, wide.warps, wide.stages), (192, 16, 2));
    assert!(plan(&dense64, Some(wide)).is_ok());
    assert_eq!(
        default_config_for(&plain, KernelFamily::Sm90Ws).block_m,
        192,
        "plain dense at head dim 128 takes three consumer warpgroups too"
    );
    // Long causal launches take them too (192 × 192 at d64 from 2048 queries, 192 × 128 at
    // d128 from 8192), short ones not.
    use crate::plan::default_config_for_launch;
    let ws = KernelFamily::Sm90Ws;
    let tile = |s: &VariantSpec, n| {
        let c = default_config_for_launch(s, ws, n);
        (c.block_m, c.block_n)
    };
    assert_eq!(tile(&causal64, 1024), (128, 128));
    assert_eq!(tile(&causal64, 2048), (192, 192));
    assert_eq!(tile(&causal, 4096), (128, 128));
    assert_eq!(tile(&causal, 8192), (192, 128));
    // At d128 other masks whose walks grow with the length do too; a band (sliding window) and a
    // block-map mask (documents) do not.
    let d128 = |src: &str| crate::parse::parse_str(src).unwrap().remove(0);
    let prefix = d128(
        "P { head_dim: 128, dtype: bf16, params: { prefix: i32 }, mask: causal || k < prefix }",
    );
    let window = d128("W { head_dim: 128, dtype: bf16, mask: causal && q - k < 1024 }");
    let window2 = d128("W { head_dim: 128, dtype: bf16, mask: k <= q && k + 1024 > q }");
    let docs = d128("D { head_dim: 128, dtype: bf16, params: { doc: [i32; seq] }, mask: causal && doc[q] == doc[k] }");
    assert_eq!(tile(&prefix, 16384), (192, 128));
    assert_eq!(tile(&window, 16384), (128, 128));
    assert_eq!(tile(&window2, 16384), (128, 128));
    assert_eq!(tile(&docs, 16384), (128, 128));
    // 192-row tiles of masked variants keep register stores.
    let wide128 = TileConfig {
        block_m: 192,
        warps: 16,
        ..default_config_for(&causal, ws)
    };
    assert!(!crate::plan::forward::o_by_tma(&causal, &wide128));
}

#[test]
fn family_tags_round_trip_and_suffix_kernel_names() {
    for f in KernelFamily::ALL {
        assert_eq!(KernelFamily::from_tag(f.tag()), Some(f));
    }
    assert_eq!(KernelFamily::from_tag("sm90a"), None);
    let s = spec(vec![], None);
    let ws = plan(&s, Some(default_config_for(&s, KernelFamily::Sm90Ws))).unwrap();
    assert!(ws.kernel_name.ends_with("_sm90ws"));
    assert!(!plan(&s, None).unwrap().kernel_name.ends_with("_sm80"));
}

#[test]
fn packed_plans_take_offsets_and_totals() {
    use super::varlen::{plan_varlen, CU_SEQLENS_K_OPERAND, CU_SEQLENS_Q_OPERAND};
    let s = spec(vec![], Some(causal()));
    for family in [KernelFamily::Sm80, KernelFamily::Sm90, KernelFamily::Sm90Ws] {
        let p = plan_varlen(&s, default_config_for(&s, family)).unwrap();
        assert_eq!(p.kind, KernelKind::ForwardVarlen);
        assert!(
            p.kernel_name.starts_with("flash_fwdv_gemma_local2_"),
            "{}",
            p.kernel_name
        );
        let names: Vec<&str> = p.operands.iter().map(|o| o.name.as_str()).collect();
        let mut want = vec![
            "q",
            "k",
            "v",
            "o",
            "lse",
            CU_SEQLENS_Q_OPERAND,
            CU_SEQLENS_K_OPERAND,
        ];
        if family == KernelFamily::Sm90Ws {
            want.push(forward::SCHED_OPERAND);
        }
        assert_eq!(names, want, "{family:?}");
        assert_eq!(
            p.operands[0].dims,
            [
                Extent::Packed,
                Extent::TotalQ,
                Extent::HeadsQ,
                Extent::HeadDimQk
            ]
        );
        assert_eq!(
            p.operands[2].dims,
            [
                Extent::Packed,
                Extent::TotalK,
                Extent::HeadsKv,
                Extent::HeadDimV
            ]
        );
        assert_eq!(
            p.operands[4].dims,
            [Extent::Packed, Extent::HeadsQ, Extent::TotalQ]
        );
        assert_eq!(p.operands[5].dims, [Extent::CuLen]);
        // The kernel reads both totals (to clamp offsets, to index the LSE).
        for e in [Extent::TotalQ, Extent::TotalK] {
            assert!(
                p.args.slots.iter().any(|sl| sl.field == ArgField::Size(e)),
                "{e:?}"
            );
        }
        // Same tile rules as the forward kernel of the family; shared memory without O's staging
        // (register stores), and so with a second Q tile wherever one fits.
        let f = plan(&s, Some(p.config)).unwrap();
        assert_eq!(
            (p.launch.grid, p.launch.threads, p.config),
            (f.launch.grid, f.launch.threads, f.config)
        );
        let q_tiles = forward::q_buffers(&s, &p.config, false);
        assert_eq!(q_tiles, if family == KernelFamily::Sm90Ws { 2 } else { 1 });
        assert_eq!(
            p.launch.smem_bytes,
            crate::plan::smem_bytes(&s, &p.config)
                + (q_tiles - 1) * forward::q_tile_bytes(&s, &p.config)
        );
        // The emitted kernel is the forward skeleton with the packed addressing switched on.
        let src = crate::emit(&p).source;
        assert!(src.contains("constexpr bool VARLEN = true;"));
        assert!(src.contains("seq_span(args.cu_seqlens_q"));
        let dense_src = crate::emit(&f).source;
        assert!(dense_src.contains("constexpr bool VARLEN = false;"));
        assert!(!dense_src.contains("seq_span"));
    }
    // Dropout: no packed kernel, and the error says why.
    let mut d = spec(vec![], Some(causal()));
    d.dropout = Some(crate::spec::Dropout::Const(crate::spec::F64Bits::new(0.1)));
    let e = plan_varlen(&d, default_config(&d)).unwrap_err();
    assert!(e.to_string().contains("dropout"), "{e}");
}

/// fp8 tiles of 192 keys: only with one scale per head or tensor (a per-block scale is one
/// tile's keys) and at head dims up to 128 (registers); the default for dense and causal
/// attention there; Vᵀ in two 128-key boxes per stage; every refusal names what was asked.
#[test]
fn fp8_wide_key_tiles() {
    let parse = |src: &str| crate::parse::parse_str(src).unwrap().remove(0);
    let head = parse("pub F { head_dim: 128, dtype: e4m3, scales: per_head, mask: causal }");
    let cfg = default_config_for(&head, KernelFamily::Sm90Ws);
    assert_eq!(
        (cfg.block_m, cfg.block_n, cfg.warps, cfg.stages),
        (128, 192, 12, 3)
    );
    let p = plan(&head, Some(cfg)).unwrap();
    // Two Q tiles, three stages of K (192 rows) and Vᵀ (two boxes of 128 keys), and O's
    // staging of one 64-column plane (a two-plane one would leave room for one Q tile only).
    assert_eq!(
        p.smem_bytes(),
        1024 + 2 * 128 * 128 + 3 * (192 * 128 + 128 * 256) + 128 * 128
    );
    let src = crate::emit(&p).source;
    assert!(src.contains("wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3"));
    assert!(src.contains("constexpr int V_BOXES = V_CODES ? (BN + 127) / 128 : 1;"));
    let tensor = parse("pub F { head_dim: 64, dtype: e4m3, scales: per_tensor }");
    assert_eq!(
        default_config_for(&tensor, KernelFamily::Sm90Ws).block_n,
        192
    );
    // 128 keys: per-block scales, other masks, score hooks, head dim 256.
    for src in [
        "pub F { head_dim: 128, dtype: e4m3, mask: causal }",
        "pub F { head_dim: 128, dtype: e4m3, scales: per_head, mask: window(256) }",
        "pub F { head_dim: 128, dtype: e4m3, scales: per_head, score: softcap(s, 20.0) }",
        "pub F { head_dim: 256, dtype: e4m3, scales: per_head }",
        "pub F { head_dim: 128, dtype: e4m3, scales: per_head, v: bf16 }",
        "pub F { head_dim: 128, dtype: e4m3, qk: int8, scales: per_tensor, v: bf16, mask: causal }",
    ] {
        let s = parse(src);
        let d = default_config_for(&s, KernelFamily::Sm90Ws);
        assert_eq!(d.block_n, 128, "{src}");
        // Every default plans (fits in shared memory).
        assert!(plan(&s, Some(d)).is_ok(), "{src}");
    }
    // A window may still take 192 keys (the tuner's choice); per-block scales and d 256 may not.
    let window = parse("pub F { head_dim: 128, dtype: e4m3, scales: per_head, mask: window(256) }");
    assert!(plan(&window, Some(cfg)).is_ok());
    let block = parse("pub F { head_dim: 128, dtype: e4m3 }");
    let e = plan(&block, Some(cfg)).unwrap_err().to_string();
    assert!(
        e.contains("128 queries (one scale block) by 128 keys")
            && e.contains("got 128x192x12x3 (192 keys need Q's and K's scales per head or tensor"),
        "{e}"
    );
    // V's own grouping (`v_scales`): per channel keeps one V scale an item (192 keys with Q and
    // K per head; the stream with Q and K per block), per block ties the tile to 128 keys.
    let head_chan = parse("pub F { head_dim: 128, dtype: e4m3, scales: per_head, v_scales: per_channel, mask: causal }");
    assert_eq!(
        default_config_for(&head_chan, KernelFamily::Sm90Ws).block_n,
        192
    );
    let head_vblock =
        parse("pub F { head_dim: 128, dtype: e4m3, scales: per_head, v_scales: per_block(128) }");
    assert_eq!(
        default_config_for(&head_vblock, KernelFamily::Sm90Ws).block_n,
        128
    );
    assert!(plan(&head_vblock, Some(cfg)).is_err());
    let block_chan = parse("pub F { head_dim: 128, dtype: e4m3, v_scales: per_channel }");
    let d = default_config_for(&block_chan, KernelFamily::Sm90Ws);
    assert_eq!((d.block_n, d.stages), (128, 3));
    assert!(crate::plan::forward::fp8_item_stream(&block_chan, &d));
    assert!(!crate::plan::forward::fp8_item_stream(&block, &d));
    let p = plan(&block_chan, Some(d)).unwrap();
    let vs = p.operands.iter().find(|o| o.name == "v_scale").unwrap();
    assert_eq!(vs.dims, [Extent::Batch, Extent::HeadsKv, Extent::HeadDimV]);
    let qs = p.operands.iter().find(|o| o.name == "q_scale").unwrap();
    assert_eq!(
        qs.dims,
        [Extent::Batch, Extent::HeadsQ, Extent::ScaleBlocksQ]
    );
    // A spec built in Rust: Q/K per channel, or scales for bf16 V, are refused by the plan (the
    // language refuses them at their tokens); V's grouping spelled as Q's is the plain kernel.
    let mut q_chan = block_chan.clone();
    q_chan.fp8 = q_chan.fp8.map(|f| crate::fp8::Fp8Spec {
        scaling: crate::fp8::Scaling::PerChannel,
        ..f
    });
    let e = plan(&q_chan, Some(d)).unwrap_err().to_string();
    assert!(e.contains("cannot be per channel"), "{e}");
    let mut v16 = parse("pub F { head_dim: 128, dtype: e4m3, v: bf16 }");
    v16.fp8 = v16.fp8.map(|f| crate::fp8::Fp8Spec {
        v_scales: Some(crate::fp8::Scaling::PerChannel),
        ..f
    });
    let e = plan(&v16, None).unwrap_err().to_string();
    assert!(e.contains("bf16 V (`v: bf16`) has no scales"), "{e}");
    let mut spelled = parse("pub F { head_dim: 128, dtype: e4m3 }");
    spelled.fp8 = spelled.fp8.map(|f| crate::fp8::Fp8Spec {
        v_scales: Some(f.scaling),
        ..f
    });
    assert_eq!(
        crate::emit(&plan(&spelled, Some(d)).unwrap()).source,
        crate::emit(&plan(&block, Some(d)).unwrap()).source
    );
    let src = crate::emit(&p).source;
    assert!(
        src.contains("constexpr int V_UNIT = 3;")
            && src.contains("finish8c(cur, acc_o, row_max, row_sum, sc.vsp)")
    );
    let d256 = parse("pub F { head_dim: 256, dtype: e4m3, scales: per_head }");
    let e = plan(&d256, Some(cfg)).unwrap_err().to_string();
    assert!(
        e.contains("by 128 keys") && e.contains("got 128x192x12x3"),
        "{e}"
    );
    let e = plan(
        &head,
        Some(TileConfig {
            block_n: 256,
            ..cfg
        }),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("by 128 or 192 keys") && e.contains("got 128x256x12x3"),
        "{e}"
    );
}

/// `v_layout: rows`: V's codes `[batch, seq_k, heads_kv, d]` loaded in 128-byte rows as K's,
/// staged beside the Vᵀ boxes the kernel transposes them into; head dim 128 only; 128 keys by
/// default (three stages of 192 do not fit), 192 with two stages.
#[test]
fn fp8_v_rows_plan() {
    let parse = |src: &str| crate::parse::parse_str(src).unwrap().remove(0);
    let s = parse("pub F { head_dim: 128, dtype: e4m3, scales: per_head, v_layout: rows }");
    let cfg = default_config_for(&s, KernelFamily::Sm90Ws);
    assert_eq!((cfg.block_n, cfg.stages), (128, 3));
    let p = plan(&s, Some(cfg)).unwrap();
    assert!(p.kernel_name.contains("_e4m3_vrows_"), "{}", p.kernel_name);
    assert_eq!(
        p.operands[2].dims,
        [
            Extent::Batch,
            Extent::SeqK,
            Extent::HeadsKv,
            Extent::HeadDimV
        ]
    );
    assert_eq!(p.operands[2].tma_rows, Some(128));
    // Two Q tiles, three stages of K, Vᵀ and V rows, and O's staging (bf16: 128 rows of two
    // 128-byte planes) after them.
    assert_eq!(
        p.smem_bytes(),
        1024 + 2 * 128 * 128 + 3 * 3 * 128 * 128 + 128 * 2 * 128
    );
    let src = crate::emit(&p).source;
    assert!(src.contains("constexpr bool V_ROWS = true;"));
    assert!(src.contains("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"));
    let two = TileConfig {
        block_n: 192,
        stages: 2,
        ..cfg
    };
    assert!(plan(&s, Some(two)).is_ok());
    let e = plan(&s, Some(TileConfig { stages: 3, ..two }))
        .unwrap_err()
        .to_string();
    assert!(e.contains("shared memory"), "{e}");
    let d64 = parse("pub F { head_dim: 64, dtype: e4m3, v_layout: rows }");
    let e = plan(&d64, Some(default_config_for(&d64, KernelFamily::Sm90Ws)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "`v_layout: rows` (V transposed in shared memory) is built for head dim 128; got 64"
        ),
        "{e}"
    );
}

/// `dtype: e4m3`: the fp8 forward's plan — codes, Vᵀ's view, three scale operands, one byte
/// per element in shared memory, the warp-specialised family only — and a clear refusal of
/// everything it does not do.
#[test]
fn fp8_forward_plan_and_its_limits() {
    use super::backward::backward_pipeline;
    use super::splitkv::plan_splitkv;
    use super::varlen::plan_varlen;
    let parse = |src: &str| crate::parse::parse_str(src).unwrap().remove(0);
    let s = parse("pub F { head_dim: 128, dtype: e4m3, mask: causal }");
    let cfg = default_config_for(&s, KernelFamily::Sm90Ws);
    assert_eq!(
        (cfg.block_m, cfg.block_n, cfg.warps, cfg.stages),
        (128, 128, 12, 3)
    );
    let p = plan(&s, Some(cfg)).unwrap();
    assert_eq!(
        p.kernel_name,
        "flash_fwd_f_e4m3_d128x128_m128n128w12s3_sm90ws"
    );
    let names: Vec<&str> = p.operands.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(
        names,
        ["q", "k", "v", "o", "lse", "q_scale", "k_scale", "v_scale", "sched"]
    );
    let fp8 = OperandType::Fp8(crate::fp8::Fp8Format::E4m3);
    assert!(p.operands[..3].iter().all(|o| o.ty == fp8));
    assert_eq!(p.operands[3].ty, OperandType::Storage(DType::Bf16));
    assert_eq!(
        p.operands[2].dims,
        [
            Extent::Batch,
            Extent::HeadDimV,
            Extent::HeadsKv,
            Extent::SeqPadded
        ]
    );
    assert_eq!(p.operands[2].tma_rows, Some(128));
    assert_eq!(
        p.operands[5].dims,
        [Extent::Batch, Extent::HeadsQ, Extent::ScaleBlocksQ]
    );
    assert_eq!(
        p.operands[6].dims,
        [Extent::Batch, Extent::HeadsKv, Extent::ScaleBlocks]
    );
    // Two Q tiles (`q_buffers`), then three stages of K and Vᵀ, one byte each, after the
    // 1024-byte alignment.
    assert_eq!(p.smem_bytes(), 1024 + 2 * 128 * 128 + 3 * 128 * (128 + 128));
    let src = crate::emit(&p).source;
    assert!(src.contains("constexpr bool FP8 = true;"));
    assert!(src.contains("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"));
    assert!(src.contains("softmax_p_scaled<BN / 8>"));
    // Refusals, each naming what was asked.
    let err = |r: Result<KernelPlan, PlanError>| r.unwrap_err().to_string();
    let sm80 = default_config_for(&s, KernelFamily::Sm80);
    assert!(err(plan(&s, Some(sm80))).contains("got sm80"));
    let d96 = parse("pub F { head_dim: 96, dtype: e4m3 }");
    assert!(err(plan(&d96, Some(cfg)))
        .contains("head dim 64, 128 or 256, the same for Q, K and V; got 96/96"));
    // Head dim 256: two planes of codes per row, V's box 256 rows; with a mask two stages by
    // default, which leave room for a second Q tile; plain dense takes three (and one Q tile).
    let wide = parse("pub F { head_dim: 256, dtype: e4m3, mask: causal }");
    let pw = plan(&wide, Some(default_config_for(&wide, KernelFamily::Sm90Ws))).unwrap();
    assert_eq!(pw.config.stages, 2);
    assert_eq!(pw.operands[2].tma_rows, Some(256));
    assert_eq!(
        pw.smem_bytes(),
        1024 + 2 * 128 * 256 + 2 * 128 * (256 + 256)
    );
    let src = crate::emit(&pw).source;
    assert!(src.contains("wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3"));
    let dense = parse("pub F { head_dim: 256, dtype: e4m3 }");
    let pd = plan(
        &dense,
        Some(default_config_for(&dense, KernelFamily::Sm90Ws)),
    )
    .unwrap();
    assert_eq!(pd.config.stages, 3);
    assert_eq!(pd.smem_bytes(), 1024 + 128 * 256 + 3 * 128 * (256 + 256));
    // Head dim 64: Q and K rows still whole 128-byte planes (the TMA box's columns past 64
    // zero-filled), Vᵀ 64 rows; two Q tiles fit.
    let narrow = parse("pub F { head_dim: 64, dtype: e4m3 }");
    let pn = plan(
        &narrow,
        Some(default_config_for(&narrow, KernelFamily::Sm90Ws)),
    )
    .unwrap();
    assert_eq!(pn.operands[2].tma_rows, Some(64));
    assert_eq!(pn.smem_bytes(), 1024 + 2 * 128 * 128 + 3 * 128 * (128 + 64));
    // `qk: int8`: Q and K int8 codes for an s8 × s8 → s32 Q·Kᵀ, V e4m3 for P·V.
    let qk8 = parse("pub F { head_dim: 128, dtype: e4m3, qk: int8 }");
    let pi = plan(&qk8, Some(cfg)).unwrap();
    assert!(
        pi.kernel_name.contains("_e4m3_qkint8_"),
        "{}",
        pi.kernel_name
    );
    let int8 = OperandType::Fp8(crate::fp8::Fp8Format::Int8);
    assert_eq!((pi.operands[0].ty, pi.operands[1].ty), (int8, int8));
    assert_eq!(pi.operands[2].ty, fp8);
    let src = crate::emit(&pi).source;
    assert!(src.contains("constexpr bool QK_INT8 = true;"));
    assert!(src.contains("wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8"));
    assert!(src.contains("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"));
    // `v: bf16`: V bf16 `[batch, seq_k, heads_kv, dv]` in 128-key TMA boxes, no V scale, a
    // bf16 P·V (k16, V read transposed); at 256 two stages and one Q tile (225 KB).
    let v16 = parse("pub F { head_dim: 128, dtype: e4m3, qk: int8, v: bf16 }");
    let pv = plan(&v16, Some(cfg)).unwrap();
    let names: Vec<&str> = pv.operands.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(
        names,
        ["q", "k", "v", "o", "lse", "q_scale", "k_scale", "sched"]
    );
    assert_eq!(
        pv.operands[2].ty,
        OperandType::Storage(crate::spec::DType::Bf16)
    );
    assert_eq!(
        pv.operands[2].dims,
        [
            Extent::Batch,
            Extent::SeqK,
            Extent::HeadsKv,
            Extent::HeadDimV
        ]
    );
    assert_eq!(pv.operands[2].tma_rows, Some(128));
    let src = crate::emit(&pv).source;
    assert!(src.contains("constexpr bool V16 = true;"));
    assert!(src.contains("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"));
    assert!(src.contains("wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8"));
    let v16w = parse("pub F { head_dim: 256, dtype: e4m3, qk: int8, v: bf16 }");
    let pw = plan(&v16w, Some(default_config_for(&v16w, KernelFamily::Sm90Ws))).unwrap();
    assert_eq!(pw.config.stages, 2);
    assert_eq!(
        pw.smem_bytes(),
        1024 + 128 * 256 + 2 * 128 * (256 + 2 * 256)
    );
    // A spec built in Rust with an int8 V (or e5m2 Q/K) is refused, naming both formats.
    let mut bad = qk8.clone();
    bad.fp8.as_mut().unwrap().format = crate::fp8::Fp8Format::Int8;
    assert!(err(plan(&bad, Some(cfg)))
        .contains("V's codes are e4m3 and Q's and K's e4m3 or int8; got V int8 and Q/K int8"));
    let tile = TileConfig { stages: 4, ..cfg };
    assert!(err(plan(&s, Some(tile))).contains("2 or 3 stages; got 128x128x12x4"));
    let drop = parse("pub F { head_dim: 128, dtype: e4m3, dropout: 0.1 }");
    assert!(err(plan(&drop, Some(cfg))).contains("dropout"));
    let e = backward_pipeline(&s, cfg).unwrap_err().to_string();
    assert!(
        e.contains("the backward pass is not available for fp8"),
        "{e}"
    );
    assert!(err(plan_splitkv(&s, cfg)).contains("split-KV"));
    assert!(err(plan_varlen(&s, cfg)).contains("packed"));
}

/// O leaves the sm90ws forward by TMA stores from staged tiles for masked variants above head
/// dim 64 and plain dense ones up to it, where the staging fits: a fourth descriptor, 64-row
/// boxes, the staging in the plan's shared memory. Plain dense d128 and three stages at 128/128
/// keep register stores (fp8: `fp8_stream_stores_o_by_tma_with_128_key_tiles`).
#[test]
fn masked_sm90ws_forwards_store_o_by_tma_where_it_fits() {
    use crate::plan::forward::{o_by_tma, o_staging_bytes, o_tma_max_keys};
    let ws = |stages| TileConfig {
        family: KernelFamily::Sm90Ws,
        ..cfg(128, 128, 12, stages)
    };
    let mut causal = crate::parse::parse_str("C { head_dim: 128, dtype: bf16, mask: q >= k }")
        .unwrap()
        .remove(0);
    let p = plan(&causal, Some(ws(2))).unwrap();
    let (i, o) = p.operand("o").unwrap();
    assert_eq!(o.tma_rows, Some(64));
    assert!(p.args.slots.iter().any(|s| s.field == ArgField::Tma(i)));
    // The staging, and a second Q tile (`q_buffers`), which still fits beside it.
    assert_eq!(
        p.smem_bytes(),
        crate::plan::smem_bytes(&causal, &p.config) + 128 * 2 * 128 + 128 * 128 * 2
    );
    assert_eq!(o_staging_bytes(&causal, &p.config), 128 * 2 * 128);
    // Three stages of 128 × 128 (Q 32 KiB + 3 × 64 KiB) leave no room for 32 KiB more.
    assert!(!o_by_tma(&causal, &ws(3)));
    assert!(plan(&causal, Some(ws(3)))
        .unwrap()
        .operand("o")
        .unwrap()
        .1
        .tma_rows
        .is_none());
    // Plain dense at d128 keeps the register stores; masks at head dim 64 store by TMA, and so
    // does plain dense at head dim 64, up to 2048 keys (the kernel compares `seq_k`).
    let mut dense = crate::parse::parse_str("D { head_dim: 128, dtype: bf16 }")
        .unwrap()
        .remove(0);
    assert!(!o_by_tma(&dense, &ws(2)));
    causal.head_dim_qk = 64;
    causal.head_dim_v = 64;
    assert!(o_by_tma(&causal, &ws(2)));
    (dense.head_dim_qk, dense.head_dim_v) = (64, 64);
    assert!(o_by_tma(&dense, &ws(2)));
    assert_eq!(o_tma_max_keys(&dense), 2048);
    assert_eq!(o_tma_max_keys(&causal), i32::MAX as u32);
}

/// The fp8 stream stores O by TMA, at every length, where its tiles have up to 128 keys (the
/// register stores' epilogue left the tensor cores idle at every item); 192-key tiles (measured
/// slower with the staging) and the per-item loop (V scaled per block) keep register stores.
#[test]
fn fp8_stream_stores_o_by_tma_with_128_key_tiles() {
    use crate::plan::forward::{fp8_item_stream, o_by_tma, o_staging_bytes, o_tma_max_keys};
    let ws = |block_n| TileConfig {
        family: KernelFamily::Sm90Ws,
        ..cfg(128, block_n, 12, 3)
    };
    let vc = crate::parse::parse_str("F { head_dim: 128, dtype: e4m3, v_scales: per_channel }")
        .unwrap()
        .remove(0);
    assert!(fp8_item_stream(&vc, &ws(128)));
    assert!(o_by_tma(&vc, &ws(128)));
    // 192-key tiles: by TMA where a mask ends items unevenly, one plane of 64 columns at a
    // time; unmasked from registers.
    assert!(!o_by_tma(&vc, &ws(192)));
    let causal =
        crate::parse::parse_str("F { head_dim: 128, dtype: e4m3, scales: per_head, mask: causal }")
            .unwrap()
            .remove(0);
    assert!(o_by_tma(&causal, &ws(192)));
    assert_eq!(o_staging_bytes(&causal, &ws(192)), 128 * 128);
    assert_eq!(o_tma_max_keys(&vc), i32::MAX as u32);
    let p = plan(&vc, Some(ws(128))).unwrap();
    let (i, o) = p.operand("o").unwrap();
    assert_eq!(o.tma_rows, Some(64));
    assert!(p.args.slots.iter().any(|s| s.field == ArgField::Tma(i)));
    // bf16 O: two planes of 64 columns per row of the staging, whatever V's codes take.
    assert_eq!(o_staging_bytes(&vc, &p.config), 128 * 2 * 128);
    assert!(
        p.smem_bytes() >= crate::plan::smem_bytes(&vc, &p.config) + o_staging_bytes(&vc, &p.config)
    );
    let blocks = crate::parse::parse_str("B { head_dim: 128, dtype: e4m3 }")
        .unwrap()
        .remove(0);
    assert!(!fp8_item_stream(&blocks, &ws(128)));
    assert!(!o_by_tma(&blocks, &ws(128)));
    assert!(plan(&blocks, Some(ws(128)))
        .unwrap()
        .operand("o")
        .unwrap()
        .1
        .tma_rows
        .is_none());
}

/// The wgmma backward stores dK and dV by TMA (64-row boxes of a warpgroup's keys, staged over
/// the dSᵀ buffers and dQ's staging tiles) where dQ goes by TMA and the boxes fit those buffers;
/// the deterministic mode (no dQ staging tiles) and the sm80 kernel keep the register stores,
/// and so does the 128-query step at head dim 64, whose dQ staging does not fit.
#[test]
fn the_wgmma_backward_stores_dk_and_dv_by_tma_where_the_boxes_fit() {
    use crate::plan::backward::{dkdv_by_tma, dq_by_tma, plan_backward_main_with};
    let sm90 = |bm| TileConfig {
        family: KernelFamily::Sm90,
        ..cfg(bm, 128, 8, 1)
    };
    let mut s = crate::parse::parse_str("C { head_dim: 128, dtype: bf16, mask: q >= k }")
        .unwrap()
        .remove(0);
    let p = plan_backward_main_with(&s, sm90(64), false).unwrap();
    for name in ["dk", "dv"] {
        let (i, o) = p.operand(name).unwrap();
        assert_eq!(o.tma_rows, Some(64), "{name}");
        assert!(p.args.slots.iter().any(|x| x.field == ArgField::Tma(i)));
    }
    // The boxes reuse buffers: no shared memory beyond the dQ staging.
    assert_eq!(
        p.smem_bytes(),
        crate::plan::backward::backward_smem_bytes(&s, &p.config)
            + crate::plan::backward::dq_staging_bytes(&s, &p.config)
    );
    let det = plan_backward_main_with(&s, sm90(64), true).unwrap();
    assert!(!dkdv_by_tma(&s, &sm90(64), true));
    assert!(det.operand("dk").unwrap().1.tma_rows.is_none());
    assert!(!dkdv_by_tma(&s, &cfg(64, 128, 8, 1), false));
    (s.head_dim_qk, s.head_dim_v) = (64, 64);
    assert!(!dq_by_tma(&s, &sm90(128), false));
    assert!(!dkdv_by_tma(&s, &sm90(128), false));
}

/// The fp8 forward runs its tiles as one stream across work items with one V scale an item
/// (per head or tensor, or bf16 V), three stages and head dim ≤ 128; per-block V scales, two
/// stages and head dim 256 keep items one after another — and the generated kernel says which.
#[test]
fn fp8_item_stream_where_one_v_scale() {
    use crate::plan::forward::fp8_item_stream;
    let parse = |src: &str| crate::parse::parse_str(src).unwrap().remove(0);
    let stream_of = |src: &str, stages: Option<u32>| {
        let spec = parse(src);
        let mut cfg = default_config_for(&spec, KernelFamily::Sm90Ws);
        if let Some(s) = stages {
            cfg.stages = s;
        }
        let on = fp8_item_stream(&spec, &cfg);
        let kernel = crate::emit(&plan(&spec, Some(cfg)).unwrap()).source;
        // The stream's epilogue helper exists only in the streamed kernel.
        assert_eq!(
            kernel.contains("auto next_live = [&](Item& it)"),
            on,
            "{src}"
        );
        on
    };
    assert!(stream_of(
        "pub F { head_dim: 128, dtype: e4m3, scales: per_head, mask: causal }",
        None
    ));
    assert!(stream_of(
        "pub F { head_dim: 128, dtype: e4m3, scales: per_tensor }",
        None
    ));
    assert!(stream_of(
        "pub F { head_dim: 64, dtype: e4m3, scales: per_head }",
        None
    ));
    assert!(stream_of(
        "pub F { head_dim: 128, dtype: e4m3, qk: int8, v: bf16 }",
        None
    ));
    assert!(!stream_of("pub F { head_dim: 128, dtype: e4m3 }", None));
    assert!(!stream_of(
        "pub F { head_dim: 128, dtype: e4m3, mask: causal }",
        None
    ));
    assert!(!stream_of(
        "pub F { head_dim: 256, dtype: e4m3, scales: per_head }",
        None
    ));
    assert!(!stream_of(
        "pub F { head_dim: 128, dtype: e4m3, scales: per_head }",
        Some(2)
    ));
    // Not fp8: the bf16 kernel's own schedule.
    let bf16 = parse("pub F { head_dim: 128, dtype: bf16 }");
    assert!(!fp8_item_stream(
        &bf16,
        &default_config_for(&bf16, KernelFamily::Sm90Ws)
    ));
}
