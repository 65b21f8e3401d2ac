//! The launch API without a GPU: the typed entry point type-checks against macro-declared
//! variants, and a machine without a driver gets an error, never a panic. (The GPU side runs in
//! `flash-gpucheck`, on the lent machine.)

use flash_runtime::cudarc::driver::CudaSlice;
use flash_runtime::{FlashError, LseMut, Runtime, TensorMut, TensorRef, Variant};

flash_macros::attention! {
    /// Causal attention with a runtime soft-cap.
    pub Capped {
        head_dim: 64,
        dtype: bf16,
        params: { cap: f32 },
        mask: causal,
        score: cap * tanh(s / cap),
    }
    /// Packed documents.
    pub Docs {
        head_dim: 64,
        dtype: f16,
        params: { doc: [i32; seq] },
        mask: causal && doc[q] == doc[k],
    }
}

/// Compiles only if `forward_variant` accepts the macro's params types.
#[allow(dead_code, clippy::too_many_arguments)]
fn typed_calls(
    rt: &Runtime,
    q: &CudaSlice<u16>,
    kv: &CudaSlice<u16>,
    o: &mut CudaSlice<u16>,
    lse: &mut CudaSlice<f32>,
    doc: &CudaSlice<i32>,
) -> Result<(), FlashError> {
    let s = rt.stream();
    let shape = [1, 16, 2, 64];
    let (tq, tk) = (TensorRef::new(q, shape, s), TensorRef::new(kv, shape, s));
    {
        let mut to = TensorMut::new(o, shape, s);
        let mut tl = LseMut::new(lse, s);
        rt.forward_variant::<Capped>(&tq, &tk, &tk, &mut to, &mut tl, &CappedParams::new(30.0))?;
    }
    let mut to = TensorMut::new(o, shape, s);
    let mut tl = LseMut::new(lse, s);
    rt.forward_variant::<Docs>(&tk, &tk, &tk, &mut to, &mut tl, &DocsParams::new(doc))?;
    Ok(())
}

#[test]
fn variant_sources_reparse_to_their_specs() {
    for (name, src) in [(Capped::NAME, Capped::SOURCE), (Docs::NAME, Docs::SOURCE)] {
        let specs = flash_dsl::parse::parse_str(src).expect("the macro's SOURCE re-parses");
        assert!(specs.iter().any(|s| s.name == name), "{name} in its SOURCE");
    }
}

#[test]
fn runtime_without_a_gpu_is_an_error_not_a_panic() {
    match Runtime::new(0) {
        Ok(rt) => assert!(!rt.info().arch.is_empty()), // a machine with a GPU
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    // An ordinal no machine has.
    assert!(Runtime::new(4096).is_err());
}
