//! Inputs of a tuning run: plausible params, the mask's density and the useful FLOPs.

use flash_dsl::eval::{tensor_shape, Env, ParamValue, ParamValues, Point, Sizes};
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::spec::{Dim, ParamKind, ScalarTy};
use flash_dsl::VariantSpec;

use crate::launch::ProblemShape;

/// Plausible values for every param the user did not give: document ids sorted in `[0, 8)` for
/// an i32 `[seq]` tensor, ALiBi slopes `2^(-8(h+1)/H)` for an f32 `[heads]` tensor, random
/// normals for other f32 tensors, random ints in `[0, 8)` for other i32 tensors, `seq_k / 4`
/// for an i32 scalar, 30 for an f32 scalar, and 0.1 for the dropout probability.
pub fn default_params(
    spec: &VariantSpec,
    sizes: Sizes,
    given: &[(String, ParamValue)],
    seed: u64,
) -> ParamValues {
    let mut rng = Rng(seed);
    let vals = spec
        .params
        .iter()
        .enumerate()
        .map(|(i, decl)| {
            if let Some((_, v)) = given.iter().find(|(n, _)| *n == decl.name) {
                return v.clone();
            }
            if flash_dsl::dropout::is_probability(spec, i) {
                return ParamValue::Float(0.1); // a training-time dropout probability
            }
            if let Some(sp) = spec.sparsity.filter(|sp| sp.param == i) {
                // A BigBird-style layout: 3 local, 2 global, 3 random key blocks.
                return ParamValue::IntTensor(flash_dsl::sparsity::bigbird_layout(
                    &sp,
                    sizes,
                    (3, 2, 3),
                    &mut rng,
                ));
            }
            match &decl.kind {
                ParamKind::Scalar(ScalarTy::I32) => ParamValue::Int((sizes.seq_k / 4) as i64),
                ParamKind::Scalar(ScalarTy::F32) => ParamValue::Float(30.0),
                ParamKind::Tensor { elem, dims } => {
                    let n: usize = tensor_shape(dims, sizes).iter().product();
                    match (elem, dims.as_slice()) {
                        (ScalarTy::I32, [Dim::Seq]) => {
                            let mut ids: Vec<i64> =
                                (0..n).map(|_| (rng.next_u64() % 8) as i64).collect();
                            ids.sort_unstable();
                            ParamValue::IntTensor(ids)
                        }
                        (ScalarTy::I32, _) => ParamValue::IntTensor(
                            (0..n).map(|_| (rng.next_u64() % 8) as i64).collect(),
                        ),
                        (ScalarTy::F32, [Dim::Heads]) => ParamValue::FloatTensor(
                            (0..n)
                                .map(|h| (2f64).powf(-8.0 * (h + 1) as f64 / n as f64))
                                .collect(),
                        ),
                        (ScalarTy::F32, _) => {
                            ParamValue::FloatTensor((0..n).map(|_| rng.normal()).collect())
                        }
                    }
                }
            }
        })
        .collect();
    ParamValues(vals)
}

/// Fraction of (query, key) pairs the mask keeps, estimated on a grid of at most 256 × 256
/// points of batch 0, head 0 (1 for a dense variant).
pub fn mask_density(spec: &VariantSpec, params: &ParamValues, sizes: Sizes) -> f64 {
    if spec.mask.is_none() || sizes.seq_q == 0 || sizes.seq_k == 0 {
        return 1.0;
    }
    let env = Env::new(spec, params, sizes);
    let (nq, nk) = (sizes.seq_q.min(256), sizes.seq_k.min(256));
    let mut kept = 0usize;
    for i in 0..nq {
        for j in 0..nk {
            let p = Point {
                b: 0,
                h: 0,
                q: (i * sizes.seq_q / nq) as i64,
                k: (j * sizes.seq_k / nk) as i64,
                s: 0.0,
            };
            kept += usize::from(env.mask(&p));
        }
    }
    kept as f64 / (nq * nk) as f64
}

/// Useful FLOPs of one forward pass: `2·B·H·Nq·Nk·(d_qk + d_v)` times the mask density.
pub fn forward_flops(spec: &VariantSpec, shape: &ProblemShape, density: f64) -> f64 {
    2.0 * (shape.batch * shape.heads_q) as f64
        * shape.seq_q as f64
        * shape.seq_k as f64
        * (spec.head_dim_qk + spec.head_dim_v) as f64
        * density
}
