//! Unit tests of the launch checks and the packing, on plans of real declarations (no GPU).

use super::*;
use flash_dsl::plan::{ArgField, Extent, KernelFamily};
use flash_dsl::spec::ScalarTy;

fn arg(shape: &[usize], strides: &[i64], len: usize, elem: ElemType) -> OperandArg {
    OperandArg {
        ptr: 0x1000,
        len,
        shape: Some(shape.to_vec()),
        strides: strides.to_vec(),
        elem,
        ctx: 0,
    }
}

fn dense(shape: [usize; 4], elem: ElemType) -> OperandArg {
    arg(&shape, &contiguous_strides(shape), usize::MAX / 4, elem)
}

fn flat(len: usize) -> OperandArg {
    OperandArg {
        ptr: 0x1000,
        len,
        shape: None,
        strides: Vec::new(),
        elem: ElemType::F32,
        ctx: 0,
    }
}

fn plan_of(src: &str) -> KernelPlan {
    let spec = flash_dsl::parse::parse_str(src).expect("parses").remove(0);
    flash_dsl::plan(&spec, None).expect("plans")
}

/// Q [2, 100, 4, 64], K/V [2, 300, 2, 64], O like Q, LSE 2·4·100.
fn forward_args() -> Vec<OperandArg> {
    vec![
        dense([2, 100, 4, 64], ElemType::Bf16),
        dense([2, 300, 2, 64], ElemType::Bits16),
        dense([2, 300, 2, 64], ElemType::Bf16),
        dense([2, 100, 4, 64], ElemType::Bf16),
        flat(800),
    ]
}

#[test]
fn default_family_by_arch_and_flash_family() {
    assert_eq!(
        default_family("sm_90a", None).unwrap(),
        KernelFamily::Sm90Ws
    );
    assert_eq!(default_family("sm_80", None).unwrap(), KernelFamily::Sm80);
    assert_eq!(
        default_family("sm_90a", Some("sm90")).unwrap(),
        KernelFamily::Sm90
    );
    let e = default_family("sm_90a", Some("hopper"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sm80, sm90 or sm90ws") && e.contains("hopper"),
        "{e}"
    );
    let e = default_family("sm_80", Some("sm90ws"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("Sm90Ws") && e.contains("sm_80"), "{e}");
}

#[test]
fn extents_resolve_from_the_operand_list() {
    let plan = plan_of("C { head_dim: 64, dtype: bf16, mask: causal }");
    let ext = check::resolve_extents(&plan, &forward_args()).unwrap();
    for (e, n) in [
        (Extent::Batch, 2),
        (Extent::SeqQ, 100),
        (Extent::SeqK, 300),
        (Extent::HeadsQ, 4),
        (Extent::HeadsKv, 2),
        (Extent::HeadDimQk, 64),
    ] {
        assert_eq!(ext.get(e), n, "{e:?}");
    }
    assert_eq!(plan.launch.grid.grid(|e| ext.get(e), 132), [1, 4, 2]);
}

#[test]
fn shapes_must_agree() {
    let plan = plan_of("C { head_dim: 64, dtype: bf16, mask: causal }");
    let err = |i: usize, a: OperandArg| {
        let mut args = forward_args();
        args[i] = a;
        check::resolve_extents(&plan, &args)
            .unwrap_err()
            .to_string()
    };
    let e = err(0, dense([2, 100, 4, 64], ElemType::F16));
    assert!(
        e.contains("f16") && e.contains("bf16") && e.contains('q'),
        "{e}"
    );
    let e = err(1, dense([2, 300, 3, 64], ElemType::Bf16));
    assert!(e.contains("heads_kv is 3 (from k) but v has 2"), "{e}");
    let e = err(0, dense([2, 100, 4, 128], ElemType::Bf16));
    assert!(e.contains("head_dim_qk is 64") && e.contains("128"), "{e}");
    let e = err(3, dense([1, 100, 4, 64], ElemType::Bf16));
    assert!(e.contains("batch is 2") && e.contains("o has 1"), "{e}");
    let e = err(4, flat(799));
    assert!(e.contains("lse has 799") && e.contains("800"), "{e}");
    let e = err(4, dense([2, 4, 100, 1], ElemType::Bf16));
    assert!(e.contains("lse holds bf16") && e.contains("f32"), "{e}");
    // GQA: 4 query heads over 3 kv heads.
    let mut args = forward_args();
    args[1] = dense([2, 300, 3, 64], ElemType::Bf16);
    args[2] = dense([2, 300, 3, 64], ElemType::Bf16);
    let e = check::resolve_extents(&plan, &args)
        .unwrap_err()
        .to_string();
    assert!(e.contains("multiple of heads_kv 3"), "{e}");
    let e = check::resolve_extents(&plan, &args[..4])
        .unwrap_err()
        .to_string();
    assert!(e.contains("5 operands") && e.contains("got 4"), "{e}");
}

#[test]
fn layout_checks_name_value_and_limit() {
    let plan = plan_of("C { head_dim: 64, dtype: bf16, mask: causal }");
    let ext = check::resolve_extents(&plan, &forward_args()).unwrap();
    let q = &plan.operands[0];
    let s = [1usize, 2, 3, 64];
    let cs = contiguous_strides(s);
    assert_eq!(
        check::check_operand(q, &arg(&s, &cs, 384, ElemType::Bf16), &ext).unwrap(),
        768,
        "bytes from the element size"
    );
    let e = check::check_operand(q, &arg(&s, &cs, 383, ElemType::Bf16), &ext)
        .unwrap_err()
        .to_string();
    assert!(e.contains("384") && e.contains("383"), "{e}");
    let e = check::check_operand(
        q,
        &arg(&s, &[384, 196, 64, 1], 10_000, ElemType::Bf16),
        &ext,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("196") && e.contains("multiple of 8"), "{e}");
    let e = check::check_operand(
        q,
        &arg(&s, &[384, 192, 64, 2], 10_000, ElemType::Bf16),
        &ext,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("contiguous"), "{e}");
    let mut mis = arg(&s, &cs, 384, ElemType::Bf16);
    mis.ptr = 0x1008;
    let e = check::check_operand(q, &mis, &ext).unwrap_err().to_string();
    assert!(e.contains("16-byte"), "{e}");
    // The LSE is a flat f32 buffer, 4-byte aligned.
    let lse = &plan.operands[4];
    let mut l = flat(800);
    assert_eq!(check::check_operand(lse, &l, &ext).unwrap(), 3200);
    l.ptr = 0x1002;
    let e = check::check_operand(lse, &l, &ext).unwrap_err().to_string();
    assert!(e.contains("4-byte"), "{e}");
}

#[test]
fn strided_views_and_overlap() {
    let plan = plan_of("C { head_dim: 64, dtype: bf16, mask: causal }");
    let ext = check::resolve_extents(&plan, &forward_args()).unwrap();
    // q inside a packed [b, s, 3, h, d] buffer.
    let packed = arg(
        &[2, 5, 4, 64],
        &[5 * 3 * 4 * 64, 3 * 4 * 64, 64, 1],
        2 * 5 * 3 * 4 * 64,
        ElemType::Bf16,
    );
    check::check_operand(&plan.operands[0], &packed, &ext).unwrap();
    // An output whose batch stride is 0 writes one element twice.
    let alias = arg(&[2, 5, 4, 64], &[0, 256, 64, 1], 100_000, ElemType::Bf16);
    check::check_operand(&plan.operands[0], &alias, &ext).unwrap();
    let e = check::check_operand(&plan.operands[3], &alias, &ext)
        .unwrap_err()
        .to_string();
    assert!(e.contains("share memory"), "{e}");
    let empty = arg(&[2, 0, 4, 64], &[0, 0, 0, 0], 0, ElemType::Bf16);
    assert_eq!(check::extent(&[2, 0, 4, 64], &[0, 0, 0, 0]), Some(0));
    assert_eq!(
        check::check_operand(&plan.operands[1], &empty, &ext).unwrap(),
        0
    );
}

#[test]
fn args_are_packed_at_the_layout_offsets() {
    let plan = plan_of(
        "Doc { head_dim: 64, dtype: bf16, params: { cap: f32, doc: [i32; seq], n: i32 }, \
         mask: doc[q] == doc[k] && k < n, score: cap * tanh(s / cap) }",
    );
    let mut ops = forward_args();
    ops[1].ptr = 0x3000;
    // The mask reads a tensor: the kernel walks a block map, whose length is derived from the
    // plan's tiles and the launch sizes (one slot: the mask reads neither b nor h).
    let m = plan
        .block_map
        .expect("a data-dependent mask reads a block map");
    let words = m.len(2, 4, 100, 300);
    assert_eq!(
        words,
        100usize.div_ceil(m.tile_q as usize) * (300usize.div_ceil(m.tile_k as usize) + 1)
    );
    let mut short = flat(words - 1);
    short.elem = ElemType::I32;
    ops.push(short);
    let e = check::resolve_extents(&plan, &ops).unwrap_err().to_string();
    assert!(
        e.contains("block_map") && e.contains(&words.to_string()),
        "{e}"
    );
    ops.last_mut().unwrap().len = words;
    let ext = check::resolve_extents(&plan, &ops).unwrap();
    assert_eq!(ext.get(Extent::MapLen), words);
    let params = [
        ParamArg::F32(30.0),
        ParamArg::raw_tensor(0x2000, 300, ScalarTy::I32),
        ParamArg::I32(7),
    ];
    let p = pack::pack_args(&plan, &ops, &ext, &params, &[]).unwrap();
    assert_eq!(p.bytes.len(), plan.args.total_size as usize);
    assert_eq!(
        p.param_regions,
        vec![("param `doc`".to_string(), 0x2000, 1200)]
    );
    let at = |f: ArgField| {
        let s = plan.args.slots.iter().find(|s| s.field == f).unwrap();
        &p.bytes[s.offset as usize..(s.offset + s.size) as usize]
    };
    assert_eq!(at(ArgField::Pointer(1)), 0x3000u64.to_le_bytes());
    assert_eq!(at(ArgField::Strides(1))[8..16], (2 * 64i64).to_le_bytes());
    assert_eq!(at(ArgField::Size(Extent::SeqK)), 300i32.to_le_bytes());
    assert_eq!(at(ArgField::Size(Extent::HeadsKv)), 2i32.to_le_bytes());
    assert_eq!(at(ArgField::Scale), ((1.0 / 8.0f64) as f32).to_le_bytes());
    assert_eq!(at(ArgField::Param(0)), 30f32.to_le_bytes());
    assert_eq!(at(ArgField::Param(1)), 0x2000u64.to_le_bytes());
    assert_eq!(at(ArgField::Param(2)), 7i32.to_le_bytes());
    let words = pack::to_words(&p.bytes);
    assert_eq!(words.len() * 8, p.bytes.len().next_multiple_of(8));
}

#[test]
fn params_are_checked() {
    let plan = plan_of(
        "Doc { head_dim: 64, dtype: bf16, params: { cap: f32, doc: [i32; seq], n: i32 }, \
         mask: doc[q] == doc[k] && k < n, score: cap * tanh(s / cap) }",
    );
    let sizes = flash_dsl::eval::Sizes {
        batch: 2,
        heads: 4,
        seq_q: 100,
        seq_k: 300,
    };
    let ok = [
        ParamArg::F32(30.0),
        ParamArg::raw_tensor(0x2000, 300, ScalarTy::I32),
        ParamArg::I32(7),
    ];
    let err = |args: &[ParamArg<'_>]| {
        pack::check_params(&plan, sizes, args)
            .unwrap_err()
            .to_string()
    };
    // seq = max(seq_q, seq_k) = 300 elements.
    let short = [
        ok[0],
        ParamArg::raw_tensor(0x2000, 299, ScalarTy::I32),
        ok[2],
    ];
    let e = err(&short);
    assert!(
        e.contains("299") && e.contains("300") && e.contains("doc"),
        "{e}"
    );
    let e = err(&ok[..2]);
    assert!(e.contains("3 param(s)") && e.contains("got 2"), "{e}");
    let kind = [ParamArg::I32(30), ok[1], ok[2]];
    let e = err(&kind);
    assert!(
        e.contains("`cap` must be an f32 scalar; got an i32 scalar"),
        "{e}"
    );
    let elem = [
        ok[0],
        ParamArg::raw_tensor(0x2000, 300, ScalarTy::F32),
        ok[2],
    ];
    assert!(err(&elem).contains("must be an i32 tensor"));
    let misaligned = [
        ok[0],
        ParamArg::raw_tensor(0x2002, 300, ScalarTy::I32),
        ok[2],
    ];
    assert!(err(&misaligned).contains("4-byte aligned"));
}

/// The split-KV and packed kernels serve a dropout variant at p = 0 only (they apply no
/// dropout); its training kernels take any p in [0, 1).
#[test]
fn serving_kernels_of_a_dropout_variant_require_p_zero() {
    use flash_dsl::plan::splitkv::{default_splitkv_config, plan_splitkv_paged};
    use flash_dsl::plan::varlen::plan_varlen;
    let spec = flash_dsl::parse::parse_str(
        "D { head_dim: 64, dtype: bf16, params: { p: f32 }, mask: causal, dropout: p }",
    )
    .unwrap()
    .remove(0);
    let rng = ParamArg::dropout(1, 2);
    let serving = [
        plan_splitkv_paged(&spec, default_splitkv_config(&spec)).unwrap(),
        plan_varlen(&spec, flash_dsl::plan::default_config(&spec)).unwrap(),
    ];
    for plan in &serving {
        assert!(pack::check_probability(plan, &[ParamArg::F32(0.0), rng]).is_ok());
        let e = pack::check_probability(plan, &[ParamArg::F32(0.1), rng])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`p` = 0.1")
                && e.contains("does not apply dropout")
                && e.contains("pass p = 0"),
            "{e}"
        );
    }
    let training = flash_dsl::plan(&spec, None).unwrap();
    assert!(pack::check_probability(&training, &[ParamArg::F32(0.1), rng]).is_ok());
    // Through the argument packer too: the split-KV kernels' arguments carry no generator
    // state, and the probability is still checked (before any operand is looked at).
    let e = pack::pack_args(
        &serving[0],
        &[],
        &check::Extents::default(),
        &[ParamArg::F32(0.1), rng],
        &[],
    )
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(e.contains("does not apply dropout"), "{e}");
}

#[test]
fn dropout_state_and_probability_are_checked_and_packed() {
    let plan = plan_of("D { head_dim: 64, dtype: bf16, params: { p: f32 }, dropout: p }");
    let ops = forward_args();
    let ext = check::resolve_extents(&plan, &ops).unwrap();
    let pack = |params: &[ParamArg<'_>]| pack::pack_args(&plan, &ops, &ext, params, &[]);
    let rng = ParamArg::dropout(0x1122_3344_5566_7788, 0x99);
    let p = pack(&[ParamArg::F32(0.25), rng]).unwrap();
    let s = plan
        .args
        .slots
        .iter()
        .find(|s| s.field == ArgField::DropoutRng)
        .expect("a dropout variant's forward carries the generator state");
    let at = &p.bytes[s.offset as usize..(s.offset + s.size) as usize];
    assert_eq!(at[..8], 0x1122_3344_5566_7788u64.to_le_bytes());
    assert_eq!(at[8..], 0x99u64.to_le_bytes());
    let err = |params: &[ParamArg<'_>]| match pack(params) {
        Ok(_) => panic!("{params:?} packed"),
        Err(e) => e.to_string(),
    };
    let e = err(&[ParamArg::F32(0.25)]);
    assert!(
        e.contains("declares dropout") && e.contains("ParamArg::dropout(seed, offset)"),
        "{e}"
    );
    let e = err(&[rng, ParamArg::F32(0.25)]);
    assert!(e.contains("not last"), "{e}");
    for bad in [1.0f32, -0.1, f32::NAN] {
        let e = err(&[ParamArg::F32(bad), rng]);
        assert!(
            e.contains("dropout probability `p`") && e.contains("[0, 1)"),
            "{bad}: {e}"
        );
    }
    let plain = plan_of("N { head_dim: 64, dtype: bf16 }");
    assert!(!plain
        .args
        .slots
        .iter()
        .any(|s| s.field == ArgField::DropoutRng));
    let e = pack::pack_args(
        &plain,
        &ops,
        &check::resolve_extents(&plain, &ops).unwrap(),
        &[rng],
        &[],
    )
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(e.contains("declares no dropout"), "{e}");
}

#[test]
fn a_chunk_cannot_have_more_new_tokens_than_its_cached_length() {
    use super::splitkv::check_chunk_lengths;
    assert!(check_chunk_lengths(&[0, 3, 3, 10], &[3, 0, 500]).is_ok());
    let e = check_chunk_lengths(&[0, 3, 9], &[5, 4]).unwrap_err();
    assert!(
        e.contains("sequence 1 has 6 new tokens") && e.contains("seqlens_k[1] is 4"),
        "{e}"
    );
}

#[test]
fn a_backward_walk_past_2_pow_31_steps_is_refused_by_name() {
    use super::backward::walk_fits;
    // 16 heads per KV head × 64 tiles of 64 queries: far inside.
    assert!(walk_fits("v", 16, 4096, 64).is_ok());
    // 2^8 heads × 2^23 tile slots (2^29 queries) = 2^31 steps: one past the last int.
    let e = walk_fits("v", 256, 1 << 29, 64).unwrap_err().to_string();
    assert!(
        e.contains("256 query heads per KV head") && e.contains("8388608 query-tile slots"),
        "{e}"
    );
    // The tile count rounds up to a power of two: 255 heads × (2^23 + 1 tiles → 2^24 slots).
    assert!(walk_fits("v", 255, (1 << 29) + 64, 64).is_err());
    assert!(walk_fits("v", 255, 1 << 29, 64).is_ok());
}

#[test]
fn persistent_blocks_cap_by_environment() {
    assert_eq!(persistent_blocks(132, None).unwrap(), 132);
    assert_eq!(persistent_blocks(132, Some("")).unwrap(), 132);
    assert_eq!(persistent_blocks(132, Some("4")).unwrap(), 4);
    // A cap above the SM count keeps one block per SM.
    assert_eq!(persistent_blocks(132, Some("1000")).unwrap(), 132);
    for bad in ["0", "-3", "four", "2.5"] {
        let e = persistent_blocks(132, Some(bad)).unwrap_err().to_string();
        assert!(
            e.contains("FLASH_PERSISTENT_BLOCKS") && e.contains(bad),
            "{bad}: {e}"
        );
    }
}
