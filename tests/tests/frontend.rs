//! The front-end end to end: the `attention!` macro against the `.flash` files.

use std::path::Path;

use flash_dsl::parse::{parse_file, parse_str};
use flash_runtime::Variant;

flash_macros::attention! {
    /// Packed documents: causal attention that never crosses a document boundary.
    pub Document {
        head_dim: 128,
        dtype: bf16,
        params: { doc: [i32; seq] },
        mask: causal && doc[q] == doc[k],
    }
    /// Causal attention with a learned relative-position bias per head (T5-style table); the
    /// distance index is clamped into the table.
    pub RelativeBias {
        head_dim: 64,
        dtype: f16,
        params: { bias: [f32; heads, 256] },
        mask: causal,
        score: s + bias[h, q - k],
    }
    Private { head_dim: 32, dtype: f16, params: { cap: f32, n: i32 }, score: softcap(s, cap) }
}

fn example(name: &str) -> flash_dsl::VariantSpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/variants")
        .join(name);
    parse_file(&path).unwrap().remove(0)
}

#[test]
fn macro_source_matches_the_flash_file() {
    assert_eq!(
        parse_str(Document::SOURCE).unwrap(),
        vec![example("document.flash")]
    );
    assert_eq!(
        parse_str(RelativeBias::SOURCE).unwrap(),
        vec![example("relative_bias.flash")]
    );
    assert_eq!(Document::NAME, "Document");
}

#[test]
fn params_struct_takes_parameters_in_order() {
    let p = PrivateParams::new(30.0, 7);
    assert_eq!((p.cap, p.n), (30.0, 7));
    let spec = parse_str(Private::SOURCE).unwrap().remove(0);
    let names: Vec<&str> = spec.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["cap", "n"]);
}

#[test]
fn rendered_file_errors_point_into_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.flash");
    std::fs::write(
        &path,
        "/// A broken variant.\npub Bad {\n    head_dim: 128,\n    dtype: bf16,\n    mask: causal && doc[q],\n}\n",
    )
    .unwrap();
    let err = parse_file(&path).unwrap_err();
    assert!(err.starts_with("error: unknown identifier `doc`"), "{err}");
    assert!(err.contains("bad.flash:5:21"), "{err}");
    assert!(
        err.contains("5 |     mask: causal && doc[q],\n  |                     ^^^\n"),
        "{err}"
    );
}
