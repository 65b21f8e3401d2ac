//! Inputs: random Q/K/V rounded to the dtype, random params, and params on the device.

use flash_dsl::dropout::DropoutRng;
use flash_dsl::eval::{tensor_shape, ParamValue, ParamValues, Sizes};
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::spec::{Dim, ParamKind, ScalarTy};
use flash_dsl::{DType, VariantSpec};
use flash_runtime::cudarc::driver::CudaSlice;
use flash_runtime::{FlashError, ParamArg, Runtime};

pub fn nan_bits(dt: DType) -> u16 {
    match dt {
        DType::Bf16 => 0x7FC0,
        DType::F16 => 0x7E00,
    }
}

/// `n` normal draws rounded to `dt`: device bits and the exact values they hold.
pub fn draw(rng: &mut Rng, n: usize, dt: DType) -> (Vec<u16>, Vec<f64>) {
    let bits: Vec<u16> = (0..n).map(|_| dt.to_bits(rng.normal())).collect();
    let vals = bits.iter().map(|&b| dt.from_bits(b)).collect();
    (bits, vals)
}

/// [`random_params`] for the kernels that serve a variant (split-KV, paged, packed): a dropout
/// probability is 0 there (they apply none; the launch refuses any other value), so the
/// reference is the variant without dropout.
pub fn serving_params(spec: &VariantSpec, sizes: Sizes, rng: &mut Rng) -> ParamValues {
    let mut pv = random_params(spec, sizes, rng);
    if let Some(flash_dsl::spec::Dropout::Param(i)) = spec.dropout {
        pv.0[i] = ParamValue::Float(0.0);
    }
    pv
}

/// Random values for every param of `spec` at `sizes`.
pub fn random_params(spec: &VariantSpec, sizes: Sizes, rng: &mut Rng) -> ParamValues {
    let vals = spec
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| match &p.kind {
            ParamKind::Scalar(ScalarTy::I32) => {
                ParamValue::Int(rng.below(sizes.seq_k.max(sizes.seq_q) as u64 + 1) as i64)
            }
            ParamKind::Scalar(ScalarTy::F32) => ParamValue::Float(if p.name == "cap" {
                30.0
            } else if flash_dsl::dropout::is_probability(spec, i) {
                0.1 + 0.4 * rng.uniform() // a dropout probability
            } else {
                0.5 + rng.uniform()
            }),
            ParamKind::Tensor { .. } if spec.sparsity.is_some_and(|sp| sp.param == i) => {
                // A BigBird-style layout (2 local, 1 global, random blocks), a fifth of the
                // slots then emptied: rows with few or no blocks, repeats, any order.
                let sp = spec.sparsity.expect("checked");
                let mut v = flash_dsl::sparsity::bigbird_layout(&sp, sizes, (2, 1, 4), rng);
                for x in v.iter_mut() {
                    if rng.below(5) == 0 {
                        *x = -1;
                    }
                }
                ParamValue::IntTensor(v)
            }
            ParamKind::Tensor { elem, dims } => {
                let n: usize = tensor_shape(dims, sizes).iter().product();
                match elem {
                    ScalarTy::I32 => {
                        let mut v: Vec<i64> = (0..n).map(|_| rng.below(8) as i64).collect();
                        if dims.as_slice() == [Dim::Seq] {
                            v.sort(); // document ids
                        }
                        ParamValue::IntTensor(v)
                    }
                    ScalarTy::F32 => {
                        if dims.as_slice() == [Dim::Heads] {
                            // ALiBi slopes as in peers.py.
                            let h = sizes.heads as f64;
                            ParamValue::FloatTensor(
                                (0..n)
                                    .map(|i| (-8.0 * (i as f64 + 1.0) / h).exp2())
                                    .collect(),
                            )
                        } else {
                            ParamValue::FloatTensor((0..n).map(|_| 0.5 * rng.normal()).collect())
                        }
                    }
                }
            }
        })
        .collect();
    ParamValues::new(vals)
}

/// Device copies of param values; `args` borrows them.
pub struct DeviceParams {
    i32s: Vec<CudaSlice<i32>>,
    f32s: Vec<CudaSlice<f32>>,
}

pub fn upload_params(rt: &Runtime, pv: &ParamValues) -> Result<DeviceParams, FlashError> {
    let s = rt.stream();
    let drv = |e| FlashError::Driver(format!("copying params: {e:?}"));
    let mut d = DeviceParams {
        i32s: Vec::new(),
        f32s: Vec::new(),
    };
    for v in &pv.0 {
        match v {
            ParamValue::IntTensor(x) => {
                let mut h: Vec<i32> = x.iter().map(|&i| i as i32).collect();
                h.resize(h.len().max(1), 0);
                d.i32s.push(s.clone_htod(&h).map_err(drv)?);
            }
            ParamValue::FloatTensor(x) => {
                let mut h: Vec<f32> = x.iter().map(|&f| f as f32).collect();
                h.resize(h.len().max(1), 0.0);
                d.f32s.push(s.clone_htod(&h).map_err(drv)?);
            }
            _ => {}
        }
    }
    Ok(d)
}

/// The dropout generator state every check and timing uses (odd, with both words non-zero, so
/// a kernel that ignored a half of the seed or the offset would fail the mask comparison).
pub const CHECK_RNG: DropoutRng = DropoutRng {
    seed: 0x5eed_1234_0bad_cafe,
    offset: 0x0000_0003_0000_0011,
};

/// The launch params of `pv`, and the generator state ([`CHECK_RNG`]) when `spec` has dropout.
pub fn param_args<'a>(
    rt: &Runtime,
    spec: &VariantSpec,
    pv: &ParamValues,
    d: &'a DeviceParams,
) -> Vec<ParamArg<'a>> {
    let (mut i, mut f) = (0, 0);
    let mut args: Vec<ParamArg<'a>> =
        pv.0.iter()
            .map(|v| match v {
                ParamValue::Int(x) => ParamArg::I32(*x as i32),
                ParamValue::Float(x) => ParamArg::F32(*x as f32),
                ParamValue::IntTensor(x) => {
                    let mut a = ParamArg::tensor_i32(&d.i32s[i], rt.stream());
                    if let ParamArg::Tensor { len, .. } = &mut a {
                        *len = x.len();
                    }
                    i += 1;
                    a
                }
                ParamValue::FloatTensor(x) => {
                    let mut a = ParamArg::tensor_f32(&d.f32s[f], rt.stream());
                    if let ParamArg::Tensor { len, .. } = &mut a {
                        *len = x.len();
                    }
                    f += 1;
                    a
                }
            })
            .collect();
    if spec.dropout.is_some() {
        args.push(ParamArg::Rng(CHECK_RNG));
    }
    args
}

/// The params of sequence `bi` of a batch whose `seq` tensors are sized for a longer one (the
/// launch's `launch` sizes), for the reference of that sequence alone (batch 1, `n` =
/// max(its seq_q, its seq_k) positions): 1-D `seq` tensors cut to its `n` positions (the only
/// `seq`-sized params the example variants have; the kernels index them by position, so the
/// prefix is what they read); a sparsity layout cut to its own query blocks (the first
/// ⌈n / block⌉ rows of each head's rows, of batch element `bi` where the layout has one slot per
/// batch element); the others unchanged.
pub fn seq_params(
    spec: &VariantSpec,
    params: &ParamValues,
    n: usize,
    bi: usize,
    launch: Sizes,
) -> ParamValues {
    ParamValues::new(
        params
            .0
            .iter()
            .zip(&spec.params)
            .enumerate()
            .map(|(i, (v, p))| match (v, &p.kind) {
                (ParamValue::IntTensor(t), _) if spec.sparsity.is_some_and(|sp| sp.param == i) => {
                    let sp = spec.sparsity.expect("checked");
                    let (blk, slots) = (sp.block as usize, sp.slots as usize);
                    let longest = launch.seq_q.max(launch.seq_k).div_ceil(blk);
                    let own = n.div_ceil(blk);
                    let heads = if sp.per_head { launch.heads } else { 1 };
                    let first = if sp.per_batch { bi * heads } else { 0 };
                    ParamValue::IntTensor(
                        (first..first + heads)
                            .flat_map(|r| t[r * longest * slots..][..own * slots].iter().copied())
                            .collect(),
                    )
                }
                (ParamValue::IntTensor(t), ParamKind::Tensor { dims, .. })
                    if dims.as_slice() == [Dim::Seq] =>
                {
                    ParamValue::IntTensor(t[..n].to_vec())
                }
                (ParamValue::FloatTensor(t), ParamKind::Tensor { dims, .. })
                    if dims.as_slice() == [Dim::Seq] =>
                {
                    ParamValue::FloatTensor(t[..n].to_vec())
                }
                (v, _) => v.clone(),
            })
            .collect(),
    )
}
