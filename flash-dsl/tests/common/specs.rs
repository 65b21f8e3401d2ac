//! The example variants of `examples/variants/*.flash`, built by hand as the validator lowers
//! them (`causal` is `k <= q + (seq_k - seq_q)`, ints meeting floats are wrapped in `ToFloat`).
//! `plan_reference.rs` checks that the parsed files plan exactly like these (so a change in the
//! lowering shows up there) and uses them, and variants built with the helpers below, as cases.
#![allow(dead_code)]

use flash_dsl::spec::{
    BinOp, DType, Dim, Expr, Func, ParamDecl, ParamKind, ScalarTy, Var, VariantSpec,
};

pub fn var(v: Var) -> Expr {
    Expr::Var(v)
}
pub fn q() -> Expr {
    var(Var::Q)
}
pub fn k() -> Expr {
    var(Var::K)
}
pub fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
    Expr::bin(op, a, b)
}
pub fn int(i: i64) -> Expr {
    Expr::Int(i)
}

/// `k <= q + (seq_k - seq_q)`.
pub fn causal() -> Expr {
    bin(
        BinOp::Le,
        k(),
        bin(
            BinOp::Add,
            q(),
            bin(BinOp::Sub, var(Var::SeqK), var(Var::SeqQ)),
        ),
    )
}

/// `causal && q - k < window`.
pub fn window(w: i64) -> Expr {
    bin(
        BinOp::And,
        causal(),
        bin(BinOp::Lt, bin(BinOp::Sub, q(), k()), int(w)),
    )
}

pub fn base(name: &str, d: u32, dtype: DType) -> VariantSpec {
    VariantSpec {
        name: name.into(),
        doc: String::new(),
        head_dim_qk: d,
        head_dim_v: d,
        dtype,
        scale: None,
        params: vec![],
        mask: None,
        score: None,
        dropout: None,
        sparsity: None,
        fp8: None,
    }
}

pub fn tensor(name: &str, elem: ScalarTy, dims: Vec<Dim>) -> ParamDecl {
    ParamDecl {
        name: name.into(),
        frozen: false,
        kind: ParamKind::Tensor { elem, dims },
    }
}

pub fn scalar(name: &str, ty: ScalarTy) -> ParamDecl {
    ParamDecl {
        name: name.into(),
        frozen: false,
        kind: ParamKind::Scalar(ty),
    }
}

pub fn dense() -> VariantSpec {
    base("Dense", 128, DType::Bf16)
}

pub fn causal_spec() -> VariantSpec {
    VariantSpec {
        mask: Some(causal()),
        ..base("Causal", 128, DType::Bf16)
    }
}

pub fn sliding_window_with(w: i64) -> VariantSpec {
    VariantSpec {
        mask: Some(window(w)),
        ..base("SlidingWindow", 128, DType::Bf16)
    }
}

pub fn sliding_window() -> VariantSpec {
    sliding_window_with(1024)
}

pub fn softcap() -> VariantSpec {
    // cap * tanh(s / cap)
    let cap = || Expr::Scalar(0);
    VariantSpec {
        params: vec![scalar("cap", ScalarTy::F32)],
        mask: Some(causal()),
        score: Some(bin(
            BinOp::Mul,
            cap(),
            Expr::Call(Func::Tanh, vec![bin(BinOp::Div, var(Var::S), cap())]),
        )),
        ..base("Softcap", 128, DType::Bf16)
    }
}

pub fn softcap_window_with(w: i64) -> VariantSpec {
    // 50.0 * tanh(s / 50.0)
    VariantSpec {
        mask: Some(window(w)),
        score: Some(bin(
            BinOp::Mul,
            Expr::float(50.0),
            Expr::Call(
                Func::Tanh,
                vec![bin(BinOp::Div, var(Var::S), Expr::float(50.0))],
            ),
        )),
        ..base("GemmaLocal", 128, DType::Bf16)
    }
}

pub fn softcap_window() -> VariantSpec {
    softcap_window_with(4096)
}

pub fn alibi() -> VariantSpec {
    // s + slopes[h] * (k - q)
    VariantSpec {
        params: vec![tensor("slopes", ScalarTy::F32, vec![Dim::Heads])],
        mask: Some(causal()),
        score: Some(bin(
            BinOp::Add,
            var(Var::S),
            bin(
                BinOp::Mul,
                Expr::Index(0, vec![var(Var::H)]),
                Expr::ToFloat(Box::new(bin(BinOp::Sub, k(), q()))),
            ),
        )),
        ..base("Alibi", 128, DType::Bf16)
    }
}

pub fn document() -> VariantSpec {
    // causal && doc[q] == doc[k]
    VariantSpec {
        params: vec![tensor("doc", ScalarTy::I32, vec![Dim::Seq])],
        mask: Some(bin(
            BinOp::And,
            causal(),
            bin(
                BinOp::Eq,
                Expr::Index(0, vec![q()]),
                Expr::Index(0, vec![k()]),
            ),
        )),
        ..base("Document", 128, DType::Bf16)
    }
}

pub fn bigbird() -> VariantSpec {
    // sparsity: blocks, blocks: [i32; heads, seq / 128, 8]
    VariantSpec {
        params: vec![tensor(
            "blocks",
            ScalarTy::I32,
            vec![Dim::Heads, Dim::SeqBlocks(128), Dim::Fixed(8)],
        )],
        sparsity: Some(flash_dsl::spec::Sparsity {
            param: 0,
            block: 128,
            slots: 8,
            per_batch: false,
            per_head: true,
        }),
        ..base("BigBird", 128, DType::Bf16)
    }
}

pub fn prefix_lm() -> VariantSpec {
    // causal || k < prefix
    VariantSpec {
        params: vec![scalar("prefix", ScalarTy::I32)],
        mask: Some(bin(
            BinOp::Or,
            causal(),
            bin(BinOp::Lt, k(), Expr::Scalar(0)),
        )),
        ..base("PrefixLm", 128, DType::Bf16)
    }
}

pub fn relative_bias() -> VariantSpec {
    // s + bias[h, q - k]
    VariantSpec {
        params: vec![tensor(
            "bias",
            ScalarTy::F32,
            vec![Dim::Heads, Dim::Fixed(256)],
        )],
        mask: Some(causal()),
        score: Some(bin(
            BinOp::Add,
            var(Var::S),
            Expr::Index(0, vec![var(Var::H), bin(BinOp::Sub, q(), k())]),
        )),
        ..base("RelativeBias", 64, DType::F16)
    }
}

pub fn dropout() -> VariantSpec {
    // causal, dropout: p
    VariantSpec {
        params: vec![scalar("p", ScalarTy::F32)],
        mask: Some(causal()),
        dropout: Some(flash_dsl::spec::Dropout::Param(0)),
        ..base("Dropout", 128, DType::Bf16)
    }
}

/// Every example variant with the file stem it comes from.
pub fn all() -> Vec<(&'static str, VariantSpec)> {
    vec![
        ("alibi", alibi()),
        ("bigbird", bigbird()),
        ("causal", causal_spec()),
        ("dense", dense()),
        ("document", document()),
        ("dropout", dropout()),
        ("prefix_lm", prefix_lm()),
        ("relative_bias", relative_bias()),
        ("sliding_window", sliding_window()),
        ("softcap", softcap()),
        ("softcap_window", softcap_window()),
    ]
}
