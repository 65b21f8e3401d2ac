//! FP8 quantisation on the GPU against the host model (`flash_dsl::fp8`), bit for bit, and its
//! bandwidth.

use flash_dsl::fp8::{
    attention_inputs, hadamard_rotate_f32, quantize, random_signs, smooth_keys_f32,
    transpose_for_pv, Fp8Format, Scaling,
};
use flash_dsl::plan::quantize::{QuantSpec, ScaleGroup};
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::DType;
use flash_runtime::{FlashError, Runtime, TensorRef};
use serde_json::{json, Value};

use crate::device::{param_args, random_params, upload_params};

/// One quantisation on the GPU: the codes and scales it wrote (both poisoned first, so a code or
/// scale the kernel does not write shows).
fn run(
    rt: &Runtime,
    q: &QuantSpec,
    bits: &[u16],
    shape: [usize; 4],
    signs: &[f32],
    n_scales: usize,
) -> Result<(Vec<u8>, Vec<f32>), FlashError> {
    run_at(rt, q, bits, 0, shape, signs, n_scales)
}

/// [`run`] with the input starting `offset` elements into its buffer (an odd offset leaves it
/// 2-byte aligned, which the launch refuses).
fn run_at(
    rt: &Runtime,
    q: &QuantSpec,
    bits: &[u16],
    offset: usize,
    shape: [usize; 4],
    signs: &[f32],
    n_scales: usize,
) -> Result<(Vec<u8>, Vec<f32>), FlashError> {
    let st = rt.stream();
    let drv = |e| FlashError::Driver(format!("quantisation buffers: {e:?}"));
    let [b, s, h, d] = shape;
    let padded: Vec<u16> = std::iter::repeat_n(0u16, offset)
        .chain(bits.iter().copied())
        .collect();
    let x = st.clone_htod(&padded).map_err(drv)?;
    let blocks = s.div_ceil(q.block_rows as usize);
    let n_codes = if q.transpose {
        b * h * d * blocks * q.block_rows as usize
    } else {
        b * s * h * d
    };
    let mut codes = st.clone_htod(&vec![0x7Fu8; n_codes.max(1)]).map_err(drv)?;
    let mut scales = st
        .clone_htod(&vec![f32::NAN; n_scales.max(1)])
        .map_err(drv)?;
    let dsigns = st.clone_htod(signs).map_err(drv)?;
    let kernel = rt.load_quantize(q)?;
    let xt = TensorRef::strided_at(
        &x,
        offset,
        shape,
        flash_runtime::launch::contiguous_strides(shape),
        st,
    );
    let signs = q.hadamard.then_some(&dsigns);
    rt.quantize(&kernel, &xt, signs, &mut codes, &mut scales)?;
    rt.synchronize()?;
    let mut codes = st.clone_dtoh(&codes).map_err(drv)?;
    codes.truncate(n_codes);
    Ok((codes, st.clone_dtoh(&scales).map_err(drv)?))
}

/// bf16 and f16 inputs with outliers (0.1 % ×10) and a tiny batch element, odd shapes, scales
/// per block of 64 and of 128 rows, per head and per tensor (the two-pass kernels), plain,
/// rotated, transposed for P·V, and both, per channel (the three-pass kernels; e4m3, plain and
/// transposed: V's), and K smoothed (plain and rotated e4m3, rotated int8;
/// the column-sum pass first): every code (the transposed padding included) and every scale must
/// equal the host model's. Returns (lines, failures).
pub fn check_quantize(rt: &Runtime) -> (usize, usize) {
    let (mut n, mut fails) = (0, 0);
    let shapes = [
        [2usize, 300, 3, 128],
        [1, 1000, 2, 64],
        [1, 129, 1, 256],
        [1, 1, 1, 64],
        [3, 64, 2, 128],
    ];
    let mut seed = 5u64;
    for input in [DType::Bf16, DType::F16] {
        for shape in shapes {
            for (block_rows, group) in [
                (64u32, ScaleGroup::Block),
                (128, ScaleGroup::Block),
                (128, ScaleGroup::Head),
                (64, ScaleGroup::Tensor),
                (128, ScaleGroup::Channel),
                (64, ScaleGroup::Channel),
            ] {
                // e4m3 plain, rotated, transposed for P·V, both; int8 (Q and K of `qk:
                // int8`) plain and rotated; K smoothed (plain and rotated e4m3, rotated int8).
                for (hadamard, transpose, format, smooth) in [
                    (false, false, Fp8Format::E4m3, false),
                    (true, false, Fp8Format::E4m3, false),
                    (false, true, Fp8Format::E4m3, false),
                    (true, true, Fp8Format::E4m3, false),
                    (false, false, Fp8Format::Int8, false),
                    (true, false, Fp8Format::Int8, false),
                    (false, false, Fp8Format::E4m3, true),
                    (true, false, Fp8Format::E4m3, true),
                    (true, false, Fp8Format::Int8, true),
                ] {
                    // Per channel is V's: e4m3, neither rotated nor smoothed (the plan refuses
                    // the rest).
                    if group == ScaleGroup::Channel
                        && (hadamard || smooth || format == Fp8Format::Int8)
                    {
                        continue;
                    }
                    seed += 1;
                    n += 1;
                    let q = QuantSpec {
                        hadamard,
                        transpose,
                        group,
                        smooth,
                        ..QuantSpec::new(input, shape[3] as u32, format, block_rows)
                    };
                    let len: usize = shape.iter().product();
                    // The last shape's second batch element is tiny (1e-37: `448 / amax`
                    // overflows f32, bf16 only; f16 flushes it to zero), the rest normal with
                    // outliers.
                    let per_batch = len / shape[0];
                    let bits: Vec<u16> = attention_inputs(len, true, seed)
                        .iter()
                        .enumerate()
                        .map(|(i, &v)| {
                            let tiny = shape == [3, 64, 2, 128] && i / per_batch == 1;
                            input.to_bits(if tiny { 1e-37 * v } else { 3.0 * v })
                        })
                        .collect();
                    let signs: Vec<f32> = random_signs(shape[3], seed)
                        .iter()
                        .map(|&s| s as f32)
                        .collect();
                    // The host model: the same values as f32, rotated the kernel's way, quantised.
                    let mut x: Vec<f32> = bits.iter().map(|&b| input.from_bits(b) as f32).collect();
                    if smooth {
                        smooth_keys_f32(&mut x, shape, block_rows as usize);
                    }
                    if hadamard {
                        hadamard_rotate_f32(&mut x, &signs, q.hadamard_norm());
                    }
                    let rows = block_rows as usize;
                    let scaling = group.scaling(rows);
                    let want = quantize(&x, shape, scaling, format);
                    let want_codes = if transpose {
                        transpose_for_pv(&want.codes, shape, rows)
                    } else {
                        want.codes.clone()
                    };
                    let label = format!(
                        "quant {} {shape:?} {} rows {block_rows} {group:?} hadamard {hadamard} transposed {transpose} smoothed {smooth}",
                        input.name(),
                        format.name()
                    );
                    match run(rt, &q, &bits, shape, &signs, want.scales.len()) {
                        Err(e) => {
                            fails += 1;
                            println!("FAIL {label}: {e}");
                        }
                        Ok((codes, scales)) => {
                            let bad_codes = codes
                                .iter()
                                .zip(&want_codes)
                                .filter(|(a, b)| a != b)
                                .count();
                            let bad_scales = scales
                                .iter()
                                .zip(&want.scales)
                                .filter(|(a, b)| a.to_bits() != b.to_bits())
                                .count();
                            let ok = bad_codes == 0
                                && bad_scales == 0
                                && codes.len() == want_codes.len()
                                && scales.len() >= want.scales.len();
                            if !ok {
                                fails += 1;
                            }
                            println!(
                                "{} {label}: {bad_codes} of {} codes and {bad_scales} of {} scales differ from the host model",
                                if ok { "ok  " } else { "FAIL" },
                                want_codes.len(),
                                want.scales.len()
                            );
                        }
                    }
                }
            }
        }
    }
    // The input one element into its buffer (2-byte aligned rows): the launch refuses it with
    // the address and the rule (the kernels' 16-byte loads), at each register-path head dim,
    // plain, rotated, per head and transposed.
    for (shape, hadamard, transpose, group) in [
        ([1usize, 300, 3, 128], false, false, ScaleGroup::Block),
        ([2, 129, 2, 64], true, false, ScaleGroup::Head),
        ([1, 200, 2, 256], false, true, ScaleGroup::Block),
        ([1, 77, 2, 128], true, true, ScaleGroup::Head),
    ] {
        n += 1;
        let q = QuantSpec {
            hadamard,
            transpose,
            group,
            ..QuantSpec::new(DType::Bf16, shape[3] as u32, Fp8Format::E4m3, 128)
        };
        let bits = vec![DType::Bf16.to_bits(1.0); shape.iter().product()];
        let signs = vec![1.0f32; shape[3]];
        let n_scales = shape[0] * shape[2] * shape[1].div_ceil(128);
        let label = format!(
            "quant bf16 {shape:?} one element into its buffer, {group:?} hadamard {hadamard} transposed {transpose}"
        );
        match run_at(rt, &q, &bits, 1, shape, &signs, n_scales) {
            Err(e) if e.to_string().contains("must be 16-byte aligned") => {
                println!("ok   {label}: refused ({e})")
            }
            Err(e) => {
                fails += 1;
                println!("FAIL {label}: refused with another error: {e}");
            }
            Ok(_) => {
                fails += 1;
                println!("FAIL {label}: launched on a misaligned input");
            }
        }
    }
    // Edge values, bf16, one block: exact ties of the int8 grid (amax 127 makes the inverse
    // exactly 1), −0, values past the format's range; then a block holding +∞ and NaN (scale 1,
    // the infinity saturates, NaN becomes 0 in int8 and the NaN code in e4m3).
    let ties: Vec<f64> = [127.0, 2.5, -3.5, 0.5, -0.0, 1.5, 126.5, -126.5, -127.0, 0.0]
        .into_iter()
        .cycle()
        .take(64)
        .collect();
    let specials: Vec<f64> = [f64::INFINITY, f64::NAN, -2.5, 3.0, -0.0, 1e30]
        .into_iter()
        .cycle()
        .take(64)
        .collect();
    for format in [Fp8Format::E4m3, Fp8Format::Int8] {
        for (what, vals) in [("ties", &ties), ("inf/NaN", &specials)] {
            n += 1;
            let shape = [1usize, 1, 1, 64];
            let q = QuantSpec::new(DType::Bf16, 64, format, 64);
            let bits: Vec<u16> = vals.iter().map(|&v| DType::Bf16.to_bits(v)).collect();
            let x: Vec<f32> = bits
                .iter()
                .map(|&b| DType::Bf16.from_bits(b) as f32)
                .collect();
            let want = quantize(&x, shape, Scaling::PerBlock { rows: 64 }, format);
            let label = format!("quant bf16 {} edge values ({what})", format.name());
            match run(rt, &q, &bits, shape, &[1.0; 64], 1) {
                Err(e) => {
                    fails += 1;
                    println!("FAIL {label}: {e}");
                }
                Ok((codes, scales)) => {
                    let ok = codes == want.codes
                        && scales.first().map(|s| s.to_bits()) == Some(want.scales[0].to_bits());
                    if !ok {
                        fails += 1;
                    }
                    println!(
                        "{} {label}: codes {:?} scale {:?}; host {:?} scale {:?}",
                        if ok { "ok  " } else { "FAIL" },
                        &codes[..10.min(codes.len())],
                        scales.first(),
                        &want.codes[..10],
                        want.scales[0]
                    );
                }
            }
        }
    }
    (n, fails)
}

/// GB/s of quantising Q-sized tensors (bf16, 16k tokens, d 128 with 16 heads and d 256 with 8;
/// blocks of 128, with and without the rotation): bytes read plus codes and scales written.
pub fn timing_quantize(rt: &Runtime, rows: &mut Vec<Value>) -> Result<(), FlashError> {
    for d in [128usize, 256] {
        let shape = [1usize, 16384, 2048 / d, d];
        let len: usize = shape.iter().product();
        let st = rt.stream();
        let drv = |e| FlashError::Driver(format!("quantisation buffers: {e:?}"));
        let bits: Vec<u16> = attention_inputs(len, true, 1)
            .iter()
            .map(|&v| DType::Bf16.to_bits(v))
            .collect();
        let x = st.clone_htod(&bits).map_err(drv)?;
        let mut codes = st.alloc_zeros::<u8>(len).map_err(drv)?;
        // Per block of 128 rows (128 blocks a head) or per channel (d a head).
        let mut scales = st.alloc_zeros::<f32>(shape[2] * d.max(128)).map_err(drv)?;
        let signs: Vec<f32> = random_signs(d, 3).iter().map(|&s| s as f32).collect();
        let dsigns = st.clone_htod(&signs).map_err(drv)?;
        // Plain, rotated, rotated with K smoothed (three launches: the column sums, their
        // means, then the codes reading them), V transposed with per-block scales and with
        // per-channel ones (three: the blocks' column amaxes, their reduction, the codes), and
        // one scale per head, plain and V transposed (two: the block amaxes, the codes); the
        // bytes counted are the codes kernel's alone.
        // (rotated, smoothed, transposed, scale group, what the line adds, the JSON variant)
        #[rustfmt::skip]
        let cases = [
            (false, false, false, ScaleGroup::Block, "", "quant_e4m3"),
            (true, false, false, ScaleGroup::Block, "", "quant_e4m3_hadamard"),
            (true, true, false, ScaleGroup::Block, "", "quant_e4m3_hadamard_smooth"),
            (false, false, true, ScaleGroup::Block, " V transposed", "quant_e4m3_v"),
            (false, false, true, ScaleGroup::Channel, " V transposed, per channel", "quant_e4m3_v_channel"),
            (false, false, false, ScaleGroup::Head, " per head", "quant_e4m3_head"),
            (false, false, true, ScaleGroup::Head, " V transposed, per head", "quant_e4m3_v_head"),
        ];
        for (hadamard, smooth, transpose, group, what, variant) in cases {
            let q = QuantSpec {
                hadamard,
                transpose,
                group,
                smooth,
                ..QuantSpec::new(DType::Bf16, d as u32, Fp8Format::E4m3, 128)
            };
            let kernel = rt.load_quantize(&q)?;
            let xt = TensorRef::new(&x, shape, st);
            let ms = rt.time_quantize(
                &kernel,
                &xt,
                hadamard.then_some(&dsigns),
                &mut codes,
                &mut scales,
                (5, 30),
            )?;
            let gbps = (len * 3) as f64 / ms as f64 / 1e6;
            println!(
                "quant bf16->e4m3 {shape:?} rows 128 hadamard {hadamard} smooth {smooth}{what}: {ms:.4} ms {gbps:.0} GB/s"
            );
            rows.push(json!({"backend": "flash", "variant": variant, "dtype": "bf16",
                "d": d, "n": 16384, "b": 1, "h": shape[2], "mode": "quantize", "ms": ms, "gbps": gbps}));
        }
    }
    Ok(())
}

/// The fp8 variants the attention check and timings run (`dtype: e4m3`: codes and block scales
/// in, bf16 out), from the one list CI's NVRTC test compiles too.
pub const FP8_SOURCE: &str = include_str!("../../../fp8_check.flash");

/// Host-side fp8 inputs of one problem: the codes and scales the kernel reads (V transposed),
/// and the dequantised Q, K, V (float64) the reference attends over.
struct Fp8Problem {
    q: (Vec<u8>, Vec<f32>),
    k: (Vec<u8>, Vec<f32>),
    v_t: (Vec<u8>, Vec<f32>),
    /// V's codes in rows, `[b, sk, hkv, d]` (`v_layout: rows`; the scales are `v_t`'s).
    v_rows: Vec<u8>,
    /// V as bf16 bits instead of `v_t` (`v: bf16`).
    v16: Option<Vec<u16>>,
    dequant: (Vec<f64>, Vec<f64>, Vec<f64>),
}

/// Quantises normal inputs (with outliers when asked) as `f` declares (its scales' grouping,
/// V's own, Q's and K's code format, bf16 V), as the quantisation kernel does (its GPU check
/// shows the two agree bit for bit).
fn fp8_problem(
    [b, sq, sk, hq, hkv]: [usize; 5],
    d: usize,
    outliers: bool,
    seed: u64,
    f: &flash_dsl::fp8::Fp8Spec,
) -> Fp8Problem {
    let (shape_q, shape_k) = ([b, sq, hq, d], [b, sk, hkv, d]);
    let draw = |n: usize, s: u64| -> Vec<f32> {
        attention_inputs(n, outliers, s)
            .iter()
            .map(|&x| x as f32)
            .collect()
    };
    let (q, k, v) = (
        draw(b * sq * hq * d, seed),
        draw(b * sk * hkv * d, seed + 1),
        draw(b * sk * hkv * d, seed + 2),
    );
    let x = flash_dsl::fp8::quantize_operands(f, [&q, &k, &v], shape_q, shape_k);
    let (dq, dk) = (x.q.dequantize(), x.k.dequantize());
    let v_t = x.v_codes(false).unwrap_or_default();
    let (q, k) = ((x.q.codes, x.q.scales), (x.k.codes, x.k.scales));
    match x.v {
        // bf16 V: its bits, and the values they hold as the reference's V.
        None => {
            let v16: Vec<u16> = v.iter().map(|&x| DType::Bf16.to_bits(x as f64)).collect();
            let v_deq = v16.iter().map(|&b| DType::Bf16.from_bits(b)).collect();
            Fp8Problem {
                dequant: (dq, dk, v_deq),
                q,
                k,
                v_t: (Vec::new(), Vec::new()),
                v_rows: Vec::new(),
                v16: Some(v16),
            }
        }
        Some(vq) => Fp8Problem {
            dequant: (dq, dk, vq.dequantize()),
            q,
            k,
            v_t: (v_t, vq.scales),
            v_rows: vq.codes,
            v16: None,
        },
    }
}

/// One fp8 forward on the GPU: O (as f64) and the LSE.
fn run_fp8(
    rt: &Runtime,
    kernel: &flash_runtime::LoadedKernel,
    x: &Fp8Problem,
    [b, sq, sk, hq, hkv]: [usize; 5],
    params: &[flash_runtime::ParamArg<'_>],
    time: Option<(usize, usize)>,
) -> Result<(Vec<f64>, Vec<f64>, f32), FlashError> {
    let st = rt.stream();
    let drv = |e| FlashError::Driver(format!("fp8 attention buffers: {e:?}"));
    let d = kernel.plan.spec.head_dim_qk as usize;
    let (q, qs) = (
        st.clone_htod(&x.q.0).map_err(drv)?,
        st.clone_htod(&x.q.1).map_err(drv)?,
    );
    let (k, ks) = (
        st.clone_htod(&x.k.0).map_err(drv)?,
        st.clone_htod(&x.k.1).map_err(drv)?,
    );
    // V on the device: the bf16 tensor (`v: bf16`), or the transposed codes and their scales.
    enum DevV {
        Bf16(cudarc::driver::CudaSlice<u16>),
        Codes(
            cudarc::driver::CudaSlice<u8>,
            cudarc::driver::CudaSlice<f32>,
        ),
    }
    // (`v_layout: rows`: the codes in rows, the same scales.)
    let rows = kernel.plan.spec.fp8.is_some_and(|f| f.v_rows);
    let dev_v = match &x.v16 {
        Some(bits) => DevV::Bf16(st.clone_htod(bits).map_err(drv)?),
        None => DevV::Codes(
            st.clone_htod(if rows { &x.v_rows } else { &x.v_t.0 })
                .map_err(drv)?,
            st.clone_htod(&x.v_t.1).map_err(drv)?,
        ),
    };
    // O poisoned (NaN bits) so that an element the kernel does not write shows.
    let mut o = st
        .clone_htod(&vec![0x7fc0u16; b * sq * hq * d])
        .map_err(drv)?;
    let mut lse = st.alloc_zeros::<f32>((b * hq * sq).max(1)).map_err(drv)?;
    let inputs = flash_runtime::Fp8Inputs {
        q: TensorRef::new(&q, [b, sq, hq, d], st),
        q_scale: &qs,
        k: TensorRef::new(&k, [b, sk, hkv, d], st),
        k_scale: &ks,
        v: match &dev_v {
            DevV::Bf16(v) => flash_runtime::Fp8V::Bf16(TensorRef::new(v, [b, sk, hkv, d], st)),
            DevV::Codes(v, vs) if rows => flash_runtime::Fp8V::Rows {
                v: TensorRef::new(v, [b, sk, hkv, d], st),
                v_scale: vs,
            },
            DevV::Codes(vt, vs) => flash_runtime::Fp8V::Codes {
                v_t: vt,
                v_scale: vs,
            },
        },
    };
    let mut ms = 0.0;
    {
        let mut om = flash_runtime::TensorMut::new(&mut o, [b, sq, hq, d], st);
        let mut lm = flash_runtime::LseMut::new(&mut lse, st);
        match time {
            Some((w, it)) => {
                ms = rt.time_forward_fp8(kernel, &inputs, &mut om, &mut lm, params, w, it)?
            }
            None => rt.forward_fp8(kernel, &inputs, &mut om, &mut lm, params)?,
        }
    }
    let o_host: Vec<u16> = st.clone_dtoh(&o).map_err(drv)?;
    let lse_host: Vec<f32> = st.clone_dtoh(&lse).map_err(drv)?;
    Ok((
        o_host
            .iter()
            .map(|&bits| DType::Bf16.from_bits(bits))
            .collect(),
        lse_host.iter().map(|&x| x as f64).collect(),
        ms,
    ))
}

/// A configuration in the check's lines: `s3` (stages), `s3 n192` with 192-key tiles.
fn cfg_tag(cfg: &flash_dsl::TileConfig) -> String {
    if cfg.block_n == flash_dsl::spec::FP8_SCALE_BLOCK {
        format!("s{}", cfg.stages)
    } else {
        format!("s{} n{}", cfg.stages, cfg.block_n)
    }
}

/// How far the LSE may be off (relative) where Q·Kᵀ runs on the e4m3 tensor cores. The plain
/// same-precision implementation there — Q·Kᵀ summed as those units sum it
/// (`reference::forward_fp8_tensor_core`: 13 fraction bits while summing, a small product
/// beside an outlier losing its low bits) — is off by up to 2.32·10⁻³ on the check's inputs
/// (`Fp8Causal`, 2048 keys, outliers; 570 of the 720 cases of 2026-11-29, the rest cut by the
/// call's time limit); the kernels, by up to 2.06·10⁻³ over all 720 (`Fp8Causal256VChannel`,
/// past the bound of 2·10⁻³ set before from the first run's worst case). 4·10⁻³ is 1.7× the
/// former and 1.9× the latter. The model is not a per-case baseline: it gets the error's size,
/// not which bits the unit drops (one case read 2.5× the model's own draw).
const LSE_TOL_E4M3: f64 = 4e-3;

/// The same where Q·Kᵀ runs on the integer tensor cores (exact sums): the f32 softmax's and
/// score hooks' error alone, at most 1.01·10⁻⁵ over the 800 cases of 2026-11-29 (softcap; 10⁻⁷
/// for most), so a tenth of that leaves the f32 arithmetic room without letting a wrong scale or
/// a lost tile through. (It was 2·10⁻³ for every kernel before.)
const LSE_TOL_INT8: f64 = 1e-4;

/// The largest relative error of an LSE against float64's (`max(|want|, 1)` below 1): rows
/// that see no key must be −inf in both.
fn lse_rel_err(got: &[f64], want: &[f64]) -> f64 {
    got.iter().zip(want).fold(0.0f64, |e, (&g, &w)| {
        if g.is_nan() {
            f64::INFINITY
        } else if w.is_finite() {
            e.max((g - w).abs() / w.abs().max(1.0))
        } else if g != w {
            f64::INFINITY
        } else {
            e
        }
    })
}

/// One case of [`check_attention`]: the kernel's O and LSE against the float64 attention of the
/// dequantised inputs in `p`, by the rule described there; (passed, the printed line).
fn judge_fp8(
    spec: &flash_dsl::VariantSpec,
    label: &str,
    p: &flash_dsl::model::reference::Problem,
    o: &[f64],
    lse: &[f64],
    tile_keys: usize,
) -> (bool, String) {
    use flash_dsl::model::reference;
    let ref64 = reference::forward(spec, p);
    // O's baseline: the plain fp8 implementation (f32 sums) with P rounded where a flash kernel
    // rounds it (the kernel's tiles of `tile_keys` keys, relative to the running max). The plain
    // implementation that rounds the normalised P instead differs only in that point; on inputs
    // with outliers their largest errors spread past 2× either way (`06_fp8_rule_spread`).
    let tiled = reference::forward_fp8_tiled(spec, p, tile_keys);
    let err_plain = reference::max_abs_diff(&tiled.o, &ref64.o);
    let err = reference::max_abs_diff(o, &ref64.o);
    let normalised = reference::forward_fp8_plain(spec, p);
    let err_normalised = reference::max_abs_diff(&normalised.o, &ref64.o);
    let nan = o.iter().chain(lse).filter(|x| x.is_nan()).count();
    let lse_err = lse_rel_err(lse, &ref64.lse);
    let e4m3_qk = spec
        .fp8
        .is_some_and(|f| f.qk_format == flash_dsl::fp8::Fp8Format::E4m3);
    let lse_tol = if e4m3_qk { LSE_TOL_E4M3 } else { LSE_TOL_INT8 };
    let ok = nan == 0 && err <= 2.0 * err_plain + 1e-6 && lse_err <= lse_tol;
    let line = format!(
        "{} {label}: max err {err:.3e} vs plain fp8 {err_plain:.3e} (bound {:.3e}); lse rel err {lse_err:.2e} (bound {lse_tol:.0e}); NaN {nan}; plain fp8 with P normalised {err_normalised:.3e}",
        if ok { "ok  " } else { "FAIL" },
        2.0 * err_plain + 1e-6
    );
    (ok, line)
}

/// The fp8 forward of each variant of [`FP8_SOURCE`] against the float64 attention of the
/// dequantised inputs, by FlashAttention's rule: O's largest error at most twice that of the
/// plain fp8 implementation (`reference::forward_fp8_tiled`: f32 arithmetic, P rounded to e4m3
/// ×256 where a flash kernel rounds it, per tile of the kernel's keys relative to the running
/// max; the error of `reference::forward_fp8_plain`, which rounds the normalised P, is printed
/// beside it) plus 1e-6; the LSE within [`LSE_TOL_E4M3`] (relative) where Q·Kᵀ runs on the
/// e4m3 tensor cores — whose 13-bit sums put ~10⁻³ into the LSE on inputs with outliers —
/// and within [`LSE_TOL_INT8`] where it runs on the integer ones; no NaN. Odd sizes, GQA,
/// seq_q ≠ seq_k, normal inputs and inputs with outliers.
pub fn check_attention(rt: &Runtime) -> (usize, usize) {
    use flash_dsl::model::reference::Problem;
    let specs = flash_dsl::parse::parse_str(FP8_SOURCE).expect("the fp8 check's variants parse");
    let shapes: [[usize; 5]; 5] = [
        [1, 128, 128, 1, 1],
        [2, 333, 517, 4, 2],
        [1, 1000, 1000, 2, 2],
        [1, 77, 1300, 3, 1],
        [1, 2048, 2048, 2, 2],
    ];
    let (mut n, mut fails) = (0, 0);
    let mut seed = 100u64;
    // Both schedules: two stages (in series) and three (Q·Kᵀ of the next tile under this one's
    // softmax and P·V); with one scale per head or tensor both again with 192-key tiles.
    let configs = |spec: &flash_dsl::VariantSpec| {
        let d = flash_dsl::plan::default_config_for(spec, flash_dsl::plan::KernelFamily::Sm90Ws);
        let mut keys = vec![128];
        if flash_dsl::plan::tile::fp8_block_n_ok(spec, 192) {
            keys.push(192);
        }
        keys.into_iter()
            .flat_map(move |block_n| {
                [2u32, 3].map(|stages| flash_dsl::TileConfig {
                    stages,
                    block_n,
                    ..d
                })
            })
            .collect::<Vec<_>>()
    };
    // `FLASH_FP8_VARIANTS=Fp8Dense256,Fp8Causal256` checks those alone (a device call's time).
    let only: Option<Vec<String>> = std::env::var("FLASH_FP8_VARIANTS")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    for (spec, cfg) in specs
        .iter()
        .filter(|s| only.as_ref().is_none_or(|o| o.contains(&s.name)))
        .flat_map(|s| configs(s).into_iter().map(move |c| (s, c)))
    {
        // Another configuration where the plan refuses it (three stages of bf16 V at d 256 do
        // not fit in shared memory): there is no such kernel to check. The default must load.
        let default =
            flash_dsl::plan::default_config_for(spec, flash_dsl::plan::KernelFamily::Sm90Ws);
        if cfg != default {
            if let Err(e) = flash_dsl::plan::config_is_valid(spec, &cfg) {
                println!(
                    "skip fp8 {} {}: the plan refuses it: {e}",
                    spec.name,
                    cfg_tag(&cfg)
                );
                continue;
            }
        }
        let kernel = match rt.load(spec, Some(cfg)) {
            Ok(k) => k,
            Err(e) => {
                n += 1;
                fails += 1;
                println!("FAIL fp8 {} {}: loading: {e}", spec.name, cfg_tag(&cfg));
                continue;
            }
        };
        // The GPU runs in turn, then the float64 references of the configuration's cases on
        // the host's cores at once (the 2048 × 2048 references at d 256 dominate a call).
        let mut jobs = Vec::new();
        for shape in shapes {
            for outliers in [false, true] {
                seed += 3;
                n += 1;
                let [b, sq, sk, hq, hkv] = shape;
                // The params (ALiBi slopes, document ids) drawn as the bf16 check draws them.
                let sizes = flash_dsl::eval::Sizes {
                    batch: b,
                    heads: hq,
                    seq_q: sq,
                    seq_k: sk,
                };
                let values = random_params(spec, sizes, &mut Rng(seed));
                let dp = match upload_params(rt, &values) {
                    Ok(d) => d,
                    Err(e) => {
                        fails += 1;
                        println!("FAIL fp8 {}: params: {e}", spec.name);
                        continue;
                    }
                };
                let params = param_args(rt, spec, &values, &dp);
                let f = spec.fp8.expect("an fp8 variant");
                let d = spec.head_dim_qk as usize;
                let x = fp8_problem(shape, d, outliers, seed, &f);
                let label = format!(
                    "fp8 {} {} shape (b {b}, sq {sq}, sk {sk}, hq {hq}, hkv {hkv}) {}",
                    spec.name,
                    cfg_tag(&cfg),
                    if outliers { "outliers" } else { "normal" }
                );
                let (o, lse, _) = match run_fp8(rt, &kernel, &x, shape, &params, None) {
                    Ok(r) => r,
                    Err(e) => {
                        fails += 1;
                        println!("FAIL {label}: {e}");
                        continue;
                    }
                };
                let mut p = Problem::random(spec, b, hq, hkv, sq, sk, values, 0);
                (p.q, p.k, p.v) = x.dequant;
                jobs.push((label, p, o, lse, cfg.block_n as usize));
            }
        }
        let judged: Vec<(bool, String)> = std::thread::scope(|sc| {
            let handles: Vec<_> = jobs
                .iter()
                .map(|(label, p, o, lse, keys)| {
                    sc.spawn(move || judge_fp8(spec, label, p, o, lse, *keys))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a reference thread panicked"))
                .collect()
        });
        for (ok, line) in judged {
            if !ok {
                fails += 1;
            }
            println!("{line}");
        }
    }
    (n, fails)
}

/// The fp8 forward (dense and causal, d 128 with h 16 and d 256 with h 8, b = 16384 / n, n 4096
/// and 16384) next to flash's own bf16 forward of the same shapes in the same call, and the fp8
/// forward with the quantisation of Q, K and V (bf16 → e4m3, V transposed) added — its own row, `+quant`; and the
/// same kernels with one scale per head (`scales: per_head`, rows `_perhead`), whose constant V
/// scale lets a warp skip the output's rescale where no row's max moved; and V scaled per
/// channel (`v_scales: per_channel`) with Q and K per block (`_vchannel`: the streamed schedule)
/// or per head (`_perhead_vchannel`: 192 keys at d 128).
pub fn timing_attention(rt: &Runtime, gpu: &str, rows: &mut Vec<Value>) -> Result<(), FlashError> {
    // `FLASH_FP8_TIME_DIMS=128` times that head dim alone (an A/B's alternations in one call).
    let dims: Vec<usize> = match std::env::var("FLASH_FP8_TIME_DIMS") {
        Ok(v) => v.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => vec![128, 256],
    };
    for d in dims {
        timing_attention_at(rt, gpu, d, rows)?;
    }
    Ok(())
}

/// [`timing_attention`] at head dim `d` (16 heads of 128, 8 of 256: the same bytes).
fn timing_attention_at(
    rt: &Runtime,
    gpu: &str,
    d: usize,
    rows: &mut Vec<Value>,
) -> Result<(), FlashError> {
    let specs = flash_dsl::parse::parse_str(&format!(
        "pub Fp8Dense {{ head_dim: {d}, dtype: e4m3 }}\npub Fp8Causal {{ head_dim: {d}, dtype: e4m3, mask: causal }}\npub Dense {{ head_dim: {d}, dtype: bf16 }}\npub Causal {{ head_dim: {d}, dtype: bf16, mask: causal }}\npub Fp8DenseH {{ head_dim: {d}, dtype: e4m3, scales: per_head }}\npub Fp8CausalH {{ head_dim: {d}, dtype: e4m3, scales: per_head, mask: causal }}\npub Fp8DenseI {{ head_dim: {d}, dtype: e4m3, qk: int8 }}\npub Fp8CausalI {{ head_dim: {d}, dtype: e4m3, qk: int8, mask: causal }}\npub Fp8DenseIV {{ head_dim: {d}, dtype: e4m3, qk: int8, v: bf16 }}\npub Fp8CausalIV {{ head_dim: {d}, dtype: e4m3, qk: int8, v: bf16, mask: causal }}\npub Fp8DenseR {{ head_dim: {d}, dtype: e4m3, v_layout: rows }}\npub Fp8CausalR {{ head_dim: {d}, dtype: e4m3, v_layout: rows, mask: causal }}\npub Fp8DenseVC {{ head_dim: {d}, dtype: e4m3, v_scales: per_channel }}\npub Fp8CausalVC {{ head_dim: {d}, dtype: e4m3, v_scales: per_channel, mask: causal }}\npub Fp8DenseHVC {{ head_dim: {d}, dtype: e4m3, scales: per_head, v_scales: per_channel }}\npub Fp8CausalHVC {{ head_dim: {d}, dtype: e4m3, scales: per_head, v_scales: per_channel, mask: causal }}",
    ))
    .expect("the timing variants parse");
    let st = rt.stream();
    let drv = |e| FlashError::Driver(format!("fp8 timing buffers: {e:?}"));
    let h = 2048 / d;
    // `FLASH_FP8_TIME_NS=16384` times that sequence length alone (divisors of 16384: b = 16384 / n).
    let ns: Vec<usize> = match std::env::var("FLASH_FP8_TIME_NS") {
        Ok(v) => v
            .split(',')
            .filter_map(|x| x.trim().parse().ok())
            .filter(|&n: &usize| n > 0 && 16384 % n == 0)
            .collect(),
        Err(_) => vec![4096, 16384],
    };
    // `FLASH_FP8_TIME_ROWS=perhead_n192,perhead_vchannel` times those rows alone (bf16 always
    // runs: the rows' peer): `default` (also gives `+quant`), `stages`, `perhead`, `perhead_n192`,
    // `qkint8`, `qkint8_vbf16`, `vchannel`, `perhead_vchannel`, `vrows`. A device call's time.
    let rows_only: Option<Vec<String>> = std::env::var("FLASH_FP8_TIME_ROWS")
        .ok()
        .map(|v| v.split(',').map(|x| x.trim().to_string()).collect());
    let want = |row: &str| {
        rows_only
            .as_ref()
            .is_none_or(|o| o.iter().any(|x| x == row))
    };
    for n in ns {
        let b = 16384 / n;
        let shape = [b, n, n, h, h];
        // The inputs as each timed declaration quantises them.
        let x_of = |name: &str| {
            let f = specs.iter().find(|s| s.name == name).and_then(|s| s.fp8);
            fp8_problem(shape, d, false, 7, &f.expect("an fp8 declaration"))
        };
        let x = x_of("Fp8Dense");
        // (Each quantised on the host only where one of its rows is timed.)
        let x_head = (want("perhead") || want("perhead_n192")).then(|| x_of("Fp8DenseH"));
        let x_int8 = want("qkint8").then(|| x_of("Fp8DenseI"));
        let x_int8_v16 = want("qkint8_vbf16").then(|| x_of("Fp8DenseIV"));
        // V per channel, Q and K per block (the streamed schedule) or per head (192 keys).
        let x_vc = want("vchannel").then(|| x_of("Fp8DenseVC"));
        let x_hvc = want("perhead_vchannel").then(|| x_of("Fp8DenseHVC"));
        let bits: Vec<u16> = x
            .dequant
            .0
            .iter()
            .map(|&v| DType::Bf16.to_bits(v))
            .collect();
        let xb = st.clone_htod(&bits).map_err(drv)?;
        let mut o16 = st.alloc_zeros::<u16>(b * n * h * d).map_err(drv)?;
        let mut lse = st.alloc_zeros::<f32>(b * h * n).map_err(drv)?;
        // The quantisation of Q, K and V (the same kernels for Q and K, the transposing one
        // for V), timed apart.
        let blocks = n.div_ceil(128);
        let mut codes = st.alloc_zeros::<u8>(b * n * h * d).map_err(drv)?;
        let mut scales = st.alloc_zeros::<f32>(b * h * blocks).map_err(drv)?;
        // (Q, K and V in rows for `v_layout: rows`: three of the non-transposing kernel.)
        // The per-head kernels' quantisation (`perhead_n192+quant`): one scale per (batch,
        // head), two launches each (block amaxes, then the codes), V transposed.
        let (mut quant_ms, mut quant_rows_ms, mut quant_head_ms) = (0.0, 0.0, 0.0);
        let groups: &[ScaleGroup] = if want("perhead_n192") {
            &[ScaleGroup::Block, ScaleGroup::Head]
        } else {
            &[ScaleGroup::Block]
        };
        for (&group, (transpose, times)) in groups
            .iter()
            .flat_map(|g| [(g, (false, 2.0f32)), (g, (true, 1.0))])
        {
            let q = QuantSpec {
                transpose,
                group,
                ..QuantSpec::new(DType::Bf16, d as u32, Fp8Format::E4m3, 128)
            };
            let kernel = rt.load_quantize(&q)?;
            let xt = TensorRef::new(&xb, [b, n, h, d], st);
            let ms = rt.time_quantize(&kernel, &xt, None, &mut codes, &mut scales, (5, 20))?;
            if group == ScaleGroup::Head {
                quant_head_ms += times * ms;
                continue;
            }
            quant_ms += times * ms;
            if !transpose {
                quant_rows_ms = 3.0 * ms;
            }
        }
        for causal in [false, true] {
            let mut fl = 4.0 * (b * h * n * n * d) as f64;
            if causal {
                fl /= 2.0;
            }
            let pick = |name: &str| specs.iter().find(|s| s.name == name).expect("declared");
            // `spec` at `cfg` (its default where None) on `x`, where `row` is wanted.
            let time_row = |row: &str,
                            spec: &flash_dsl::VariantSpec,
                            cfg: Option<flash_dsl::TileConfig>,
                            x: Option<&Fp8Problem>|
             -> Result<Option<f32>, FlashError> {
                match x {
                    Some(x) if want(row) => {
                        let kernel = rt.load(spec, cfg)?;
                        Ok(Some(run_fp8(rt, &kernel, x, shape, &[], Some((5, 20)))?.2))
                    }
                    _ => Ok(None),
                }
            };
            let (f8, bf, f8h, f8i, f8iv, f8r) = if causal {
                (
                    pick("Fp8Causal"),
                    pick("Causal"),
                    pick("Fp8CausalH"),
                    pick("Fp8CausalI"),
                    pick("Fp8CausalIV"),
                    pick("Fp8CausalR"),
                )
            } else {
                (
                    pick("Fp8Dense"),
                    pick("Dense"),
                    pick("Fp8DenseH"),
                    pick("Fp8DenseI"),
                    pick("Fp8DenseIV"),
                    pick("Fp8DenseR"),
                )
            };
            let default =
                flash_dsl::plan::default_config_for(f8, flash_dsl::plan::KernelFamily::Sm90Ws);
            let other = flash_dsl::TileConfig {
                stages: 5 - default.stages,
                ..default
            };
            // The default kernel runs for its row and as the V-rows row's bit-for-bit reference.
            let (o8, ms8) = if want("default") || want("vrows") {
                let kernel = rt.load(f8, Some(default))?;
                let (o8, _, ms8) = run_fp8(rt, &kernel, &x, shape, &[], Some((5, 20)))?;
                (o8, Some(ms8))
            } else {
                (Vec::new(), None)
            };
            let ms_other = time_row("stages", f8, Some(other), Some(&x))?;
            let ms_head = time_row("perhead", f8h, Some(default), x_head.as_ref())?;
            // One scale per head allows 192-key tiles (a tuner candidate).
            let wide = flash_dsl::TileConfig {
                block_n: 192,
                ..default
            };
            // V's codes in rows, transposed in shared memory (head dim 128), against Vᵀ from
            // the quantiser (`fp8` above): the same scales, the same default tile.
            let rows_cfg =
                flash_dsl::plan::default_config_for(f8r, flash_dsl::plan::KernelFamily::Sm90Ws);
            // Same codes, same tile and order of arithmetic: O must be equal bit for bit — a check
            // of the transposition on every (batch, head) of a launch with many items a block.
            let ms_rows =
                if want("vrows") && flash_dsl::plan::config_is_valid(f8r, &rows_cfg).is_ok() {
                    let k_rows = rt.load(f8r, Some(rows_cfg))?;
                    let (o_rows, _, ms) = run_fp8(rt, &k_rows, &x, shape, &[], Some((5, 20)))?;
                    let same = o_rows.len() == o8.len()
                        && o_rows
                            .iter()
                            .zip(&o8)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                    println!(
                        "{} fp8 V rows against Vᵀ, d {d} n {n}{}: O bit for bit {}",
                        if same { "ok  " } else { "FAIL" },
                        if causal { " causal" } else { "" },
                        if same { "equal" } else { "different" }
                    );
                    Some(ms)
                } else {
                    None
                };
            let ms_wide = if flash_dsl::plan::config_is_valid(f8h, &wide).is_ok() {
                time_row("perhead_n192", f8h, Some(wide), x_head.as_ref())?
            } else {
                None
            };
            let ms_int8 = time_row("qkint8", f8i, None, x_int8.as_ref())?;
            let ms_iv = time_row("qkint8_vbf16", f8iv, None, x_int8_v16.as_ref())?;
            let (vc, hvc) = if causal {
                (pick("Fp8CausalVC"), pick("Fp8CausalHVC"))
            } else {
                (pick("Fp8DenseVC"), pick("Fp8DenseHVC"))
            };
            let ms_vc = time_row("vchannel", vc, None, x_vc.as_ref())?;
            let ms_hvc = time_row("perhead_vchannel", hvc, None, x_hvc.as_ref())?;
            let kb = rt.load(bf, None)?;
            let ms16 = {
                let t = TensorRef::new(&xb, [b, n, h, d], st);
                let mut om = flash_runtime::TensorMut::new(&mut o16, [b, n, h, d], st);
                let mut lm = flash_runtime::LseMut::new(&mut lse, st);
                rt.time_forward(&kb, &t, &t, &t, &mut om, &mut lm, &[], 5, 20)?
            };
            let tag = if causal { "_causal" } else { "" };
            let ms8_row = ms8.filter(|_| want("default"));
            for (variant, dtype, ms) in [
                (format!("fp8{tag}"), "e4m3", ms8_row),
                (format!("fp8{tag}_s{}", other.stages), "e4m3", ms_other),
                (
                    format!("fp8{tag}+quant"),
                    "e4m3",
                    ms8_row.map(|ms| ms + quant_ms),
                ),
                (format!("fp8{tag}_perhead"), "e4m3", ms_head),
                (format!("fp8{tag}_qkint8"), "e4m3", ms_int8),
                (format!("fp8{tag}_qkint8_vbf16"), "e4m3", ms_iv),
                (format!("fp8{tag}_vchannel"), "e4m3", ms_vc),
                (format!("fp8{tag}_perhead_vchannel"), "e4m3", ms_hvc),
                (format!("bf16{tag}"), "bf16", Some(ms16)),
            ]
            .into_iter()
            .filter_map(|(v, d, ms)| ms.map(|ms| (v, d, ms)))
            .chain(ms_wide.map(|ms| (format!("fp8{tag}_perhead_n192"), "e4m3", ms)))
            .chain(ms_wide.map(|ms| {
                (
                    format!("fp8{tag}_perhead_n192+quant"),
                    "e4m3",
                    ms + quant_head_ms,
                )
            }))
            .chain(ms_rows.map(|ms| (format!("fp8{tag}_vrows"), "e4m3", ms)))
            .chain(ms_rows.map(|ms| (format!("fp8{tag}_vrows+quant"), "e4m3", ms + quant_rows_ms)))
            {
                let tf = fl / ms as f64 / 1e9;
                println!(
                    "fwd      d={d:3} n={n:6} b={b:3} h={h:3} causal={} {variant:<22} flash {ms:9.3} ms {tf:7.1} TFLOP/s",
                    causal as u8
                );
                rows.push(json!({"gpu": gpu, "backend": "flash", "variant": variant, "dtype": dtype,
                    "d": d, "n": n, "b": b, "h": h, "causal": causal, "mode": "fwd", "ms": ms, "tflops": tf}));
            }
            if let Some(ms8) = ms8_row {
                println!(
                    "fp8 / bf16 forward, n {n}{}: {:.2}x ({:.2}x with the quantisation)",
                    if causal { " causal" } else { "" },
                    ms16 / ms8,
                    ms16 / (ms8 + quant_ms)
                );
            }
        }
    }
    Ok(())
}

/// Issue 11's accuracy table through the fp8 kernel: O's RMSE and largest error against the
/// float64 attention of the *unquantised* inputs, d 64, 128 and 256 (the kernel's head dims), 1024 tokens, 4
/// heads, normal inputs and inputs with 0.1 % outliers ×10, for each scheme of
/// `flash_dsl::fp8::SCHEMES`, next to flash's bf16 forward of the same inputs. Each scheme runs
/// the kernel of its grouping (`scales: per_tensor`, `per_head`, `per_block(128)`); the rotation
/// and the smoothing of K are applied on the host before the quantisation (they leave Q·Kᵀ, and
/// the softmax, unchanged).
pub fn accuracy_table(rt: &Runtime) -> Result<(), FlashError> {
    for d in [64usize, 128, 256] {
        accuracy_table_at(rt, d)?;
    }
    Ok(())
}

/// [`accuracy_table`] at head dim `d`.
fn accuracy_table_at(rt: &Runtime, d: usize) -> Result<(), FlashError> {
    use flash_dsl::fp8::{hadamard_rotate, smooth_keys, Fp8Scheme, SCHEMES};
    use flash_dsl::model::reference::{self, Problem};
    let specs = flash_dsl::parse::parse_str(&format!(
        "pub Fp8Dense {{ head_dim: {d}, dtype: e4m3 }}\npub Dense {{ head_dim: {d}, dtype: bf16 }}\npub Fp8DenseH {{ head_dim: {d}, dtype: e4m3, scales: per_head }}\npub Fp8DenseT {{ head_dim: {d}, dtype: e4m3, scales: per_tensor }}\npub Fp8DenseI {{ head_dim: {d}, dtype: e4m3, qk: int8 }}\npub Fp8DenseIV {{ head_dim: {d}, dtype: e4m3, qk: int8, v: bf16 }}\npub Fp8DenseVC {{ head_dim: {d}, dtype: e4m3, v_scales: per_channel }}",
    ))
    .expect("the table's variants parse");
    let (f8, bf) = (&specs[0], &specs[1]);
    let kernel_of = |s: Scaling| {
        rt.load(
            match s {
                Scaling::PerBlock { .. } => f8,
                Scaling::PerHead => &specs[2],
                Scaling::PerTensor => &specs[3],
                Scaling::PerChannel => unreachable!("no scheme groups Q and K per channel"),
            },
            None,
        )
    };
    let (b, n, h) = (1usize, 1024usize, 4usize);
    let shape = [b, n, h, d];
    let st = rt.stream();
    let drv = |e| FlashError::Driver(format!("accuracy table buffers: {e:?}"));
    let kb = rt.load(bf, None)?;
    let rms = |a: &[f64], b: &[f64]| {
        (a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>() / a.len() as f64).sqrt()
    };
    let maxe = |a: &[f64], b: &[f64]| reference::max_abs_diff(a, b);
    let mut table: Vec<(String, [f64; 4])> = Vec::new();
    let mut cells = |name: &str, col: usize, v: (f64, f64)| {
        if let Some(row) = table.iter_mut().find(|r| r.0 == name) {
            row.1[col] = v.0;
            row.1[col + 1] = v.1;
        } else {
            let mut r = [f64::NAN; 4];
            r[col] = v.0;
            r[col + 1] = v.1;
            table.push((name.to_string(), r));
        }
    };
    for (col, outliers) in [(0usize, false), (2, true)] {
        let len = b * n * h * d;
        let q = attention_inputs(len, outliers, 41);
        let k = attention_inputs(len, outliers, 42);
        let v = attention_inputs(len, outliers, 43);
        let mut p = Problem::random(f8, b, h, h, n, n, flash_dsl::eval::ParamValues::none(), 0);
        (p.q, p.k, p.v) = (q.clone(), k.clone(), v.clone());
        let ref64 = reference::forward(f8, &p);
        // flash's bf16 forward of the same inputs.
        {
            let bits = |x: &[f64]| {
                x.iter()
                    .map(|&v| DType::Bf16.to_bits(v))
                    .collect::<Vec<u16>>()
            };
            let (dq, dk, dv) = (
                st.clone_htod(&bits(&q)).map_err(drv)?,
                st.clone_htod(&bits(&k)).map_err(drv)?,
                st.clone_htod(&bits(&v)).map_err(drv)?,
            );
            let mut o = st.alloc_zeros::<u16>(len).map_err(drv)?;
            let mut lse = st.alloc_zeros::<f32>(b * h * n).map_err(drv)?;
            {
                let mut om = flash_runtime::TensorMut::new(&mut o, shape, st);
                let mut lm = flash_runtime::LseMut::new(&mut lse, st);
                rt.forward(
                    &kb,
                    &TensorRef::new(&dq, shape, st),
                    &TensorRef::new(&dk, shape, st),
                    &TensorRef::new(&dv, shape, st),
                    &mut om,
                    &mut lm,
                    &[],
                )?;
            }
            let o: Vec<f64> = st
                .clone_dtoh(&o)
                .map_err(drv)?
                .iter()
                .map(|&x| DType::Bf16.from_bits(x))
                .collect();
            cells("bf16 (flash)", col, (rms(&o, &ref64.o), maxe(&o, &ref64.o)));
        }
        // Each scheme of the list with e4m3 Q and K, then int8 Q and K (`qk: int8`)
        // per block of 128 without and with the rotation; V e4m3 with the scheme's grouping.
        let int8 = |name, hadamard| Fp8Scheme {
            name,
            scaling: Scaling::PerBlock { rows: 128 },
            hadamard,
            smooth: false,
        };
        // (V per channel, `v_scales: per_channel`, beside the per-block + Hadamard scheme.)
        let rows = SCHEMES
            .iter()
            .map(|s| (format!("fp8 {}", s.name), *s, Fp8Format::E4m3, false))
            .chain([
                (
                    "fp8 per-block128+hadamard, V per-channel".to_string(),
                    Fp8Scheme {
                        name: "per-block128+hadamard, V per-channel",
                        scaling: Scaling::PerBlock { rows: 128 },
                        hadamard: true,
                        smooth: false,
                    },
                    Fp8Format::E4m3,
                    false,
                ),
                (
                    "int8 QK per-block128".to_string(),
                    int8("int8", false),
                    Fp8Format::Int8,
                    false,
                ),
                (
                    "int8 QK per-block128+hadamard".to_string(),
                    int8("int8+hadamard", true),
                    Fp8Format::Int8,
                    false,
                ),
                (
                    "int8 QK per-block128+hadamard, V bf16".to_string(),
                    int8("int8+hadamard, V bf16", true),
                    Fp8Format::Int8,
                    true,
                ),
            ]);
        for (label, scheme, qk_format, v_bf16) in rows {
            let (mut qr, mut kr) = (q.clone(), k.clone());
            if scheme.hadamard {
                let signs = random_signs(d, 44);
                hadamard_rotate(&mut qr, &signs);
                hadamard_rotate(&mut kr, &signs);
            }
            if scheme.smooth {
                smooth_keys(&mut kr, shape);
            }
            let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
            let qq = quantize(&f32s(&qr), shape, scheme.scaling, qk_format);
            let kq = quantize(&f32s(&kr), shape, scheme.scaling, qk_format);
            let v_channels = label.ends_with("V per-channel");
            let v_scaling = if v_channels {
                Scaling::PerChannel
            } else {
                scheme.scaling
            };
            let vq = quantize(&f32s(&v), shape, v_scaling, Fp8Format::E4m3);
            let x = Fp8Problem {
                q: (qq.codes, qq.scales),
                k: (kq.codes, kq.scales),
                v_t: (transpose_for_pv(&vq.codes, shape, 128), vq.scales),
                v_rows: Vec::new(),
                v16: v_bf16.then(|| v.iter().map(|&x| DType::Bf16.to_bits(x)).collect()),
                dequant: (Vec::new(), Vec::new(), Vec::new()),
            };
            let k8 = if v_bf16 {
                rt.load(&specs[5], None)?
            } else if qk_format == Fp8Format::Int8 {
                rt.load(&specs[4], None)?
            } else if v_channels {
                rt.load(&specs[6], None)?
            } else {
                kernel_of(scheme.scaling)?
            };
            let (o, _, _) = run_fp8(rt, &k8, &x, [b, n, n, h, h], &[], None)?;
            cells(&label, col, (rms(&o, &ref64.o), maxe(&o, &ref64.o)));
        }
    }
    println!("# fp8 accuracy through the kernel (d {d}, 1024 tokens, 4 heads; O against float64 attention of the unquantised inputs)");
    println!("| scheme | normal RMSE | normal max | outliers RMSE | outliers max |");
    println!("|---|---|---|---|---|");
    for (name, r) in &table {
        println!(
            "| {name} | {:.2e} | {:.2e} | {:.2e} | {:.2e} |",
            r[0], r[1], r[2], r[3]
        );
    }
    let get = |name: &str| table.iter().find(|r| r.0 == name).map(|r| r.1[2]);
    if let (Some(t), Some(bh)) = (get("fp8 per-tensor"), get("fp8 per-block128+hadamard")) {
        println!(
            "# outliers, d {d}: per-tensor RMSE / per-block + Hadamard RMSE = {:.2} (issue 11's Must: >= 2.6)",
            t / bh
        );
    }
    for row in [
        "int8 QK per-block128+hadamard",
        "int8 QK per-block128+hadamard, V bf16",
    ] {
        if let (Some(t), Some(ih)) = (get("fp8 per-tensor"), get(row)) {
            println!(
                "# outliers, d {d}: e4m3 per-tensor RMSE / {row} RMSE = {:.2} (issue 11's Must: >= 2.6)",
                t / ih
            );
        }
    }
    Ok(())
}
