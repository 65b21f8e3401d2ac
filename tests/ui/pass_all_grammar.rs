//! Every construct of the grammar, through the macro; the generated items are then used.

use flash_runtime::cudarc::driver::{CudaSlice, CudaStream};
use flash_runtime::{ParamArg, Variant};

flash_macros::attention! {
    /// Causal attention with ALiBi: a per-head linear penalty on distance.
    pub Alibi {
        head_dim: 128,
        dtype: bf16,
        params: { slopes: [f32; heads] },
        mask: causal,
        score: s + slopes[h] * (k - q),
    }
    /// Causal attention, bottom-right aligned when seq_q != seq_k.
    pub Causal { head_dim: 128, dtype: bf16, mask: causal }
    /// Plain softmax attention.
    pub Dense { head_dim: (192, 128), dtype: f16, scale: 0.125, }
    /// Packed documents, per batch row.
    pub Document {
        head_dim: 128,
        dtype: bf16,
        params: { doc: [i32; batch, seq] },
        mask: causal && doc[b, q] == doc[b, k],
    }
    /// Prefix-LM.
    pub PrefixLm {
        head_dim: 128,
        dtype: bf16,
        params: { prefix: i32 },
        mask: causal || k < prefix,
    }
    /// T5-style relative bias, both index spellings.
    pub RelativeBias {
        head_dim: 64,
        dtype: f16,
        params: { bias: [f32; heads, 256], bias2: [f32; 32] },
        mask: causal,
        score: s + bias[h, q - k] + bias[h][k - q] + bias2[clamp(q - k, 0, 31) % 32],
    }
    /// Gemma-2 local layers with a runtime window and cap.
    pub GemmaLocal {
        head_dim: 128,
        dtype: bf16,
        params: { doc: [i32; seq], slopes: [f32; heads], cap: f32, w: i32 },
        mask: window(w) && doc[q] == doc[k] && window(4096),
        score: softcap(s + alibi(slopes[h]), cap),
    }
    /// Dropout with a runtime probability, and with a constant one.
    pub Dropped { head_dim: 64, dtype: bf16, params: { p: f32 }, mask: causal, dropout: p }
    pub DroppedConst { head_dim: 64, dtype: bf16, dropout: 0.1 }
    pub Sparse {
        head_dim: 64,
        dtype: bf16,
        params: { blocks: [i32; batch, heads, seq / 128, 4] },
        mask: causal,
        sparsity: blocks,
    }
    /// Everything else: functions, unary operators, `if`, `/`, `%`, comparisons.
    Kitchen {
        head_dim: 32,
        dtype: f16,
        params: { t: f32, n: i32 },
        mask: !(q < k) && (q % 2 == 0 || k != n) && seq_q <= seq_k && k >= 0 && q > -1,
        score: if s > t { exp(s) - log(abs(s) + 1) } else { sigmoid(s) * sqrt(2) / 3 }
            + min(s, max(-s, 0.5)) + tanh(s) - q / k,
    }
}

fn check<V: Variant>(dims: (u32, u32)) {
    let spec = flash_dsl::parse::parse_str(V::SOURCE).unwrap().remove(0);
    assert_eq!(spec.name, V::NAME);
    assert_eq!((spec.head_dim_qk, spec.head_dim_v), dims);
}

/// Never called (there is no GPU here); it only has to type-check.
#[allow(dead_code)]
fn args<'a>(
    doc: &'a CudaSlice<i32>,
    slopes: &'a CudaSlice<f32>,
    stream: &CudaStream,
) -> Vec<ParamArg<'a>> {
    let p = GemmaLocalParams::new(doc, slopes, 50.0, 4096);
    let q = GemmaLocalParams { doc, slopes, cap: 30.0, w: 128, _marker: std::marker::PhantomData };
    let mut v = GemmaLocal::param_args(&p, stream);
    v.extend(GemmaLocal::param_args(&q, stream));
    v.extend(Causal::param_args(&CausalParams::new(), stream));
    v.extend(Kitchen::param_args(&KitchenParams::new(1.0, 3), stream));
    // Dropout: the generator state follows the declared params.
    v.extend(Dropped::param_args(&DroppedParams::new(0.1, 42, 7), stream));
    v.extend(DroppedConst::param_args(&DroppedConstParams::new(42, 8), stream));
    v
}

fn main() {
    check::<Alibi>((128, 128));
    check::<Causal>((128, 128));
    check::<Dense>((192, 128));
    check::<Document>((128, 128));
    check::<PrefixLm>((128, 128));
    check::<RelativeBias>((64, 64));
    check::<GemmaLocal>((128, 128));
    check::<Kitchen>((32, 32));
    let _: (Alibi, Causal, Dense, Document, PrefixLm, RelativeBias, Kitchen) = Default::default();
    assert_eq!(GemmaLocal::NAME, "GemmaLocal");
    assert!(GemmaLocal::SOURCE.contains("softcap"));
    let p = PrefixLmParams::new(7);
    assert_eq!(p.prefix, 7);
    let d = DroppedParams::new(0.1, 42, 7);
    assert_eq!((d.p, d.dropout_seed, d.dropout_offset), (0.1, 42, 7));
    let spec = flash_dsl::parse::parse_str(Dropped::SOURCE).unwrap().remove(0);
    assert_eq!(spec.dropout, Some(flash_dsl::spec::Dropout::Param(0)));
}
