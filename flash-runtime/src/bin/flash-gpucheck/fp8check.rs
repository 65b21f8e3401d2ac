//! FP8 quantisation on the GPU against the host model (`flash_dsl::fp8`), bit for bit, and its
//! bandwidth.

use flash_dsl::fp8::{
    attention_inputs, hadamard_rotate_f32, quantize, random_signs, transpose_for_pv, Fp8Format,
    Scaling,
};
use flash_dsl::plan::quantize::QuantSpec;
use flash_dsl::DType;
use flash_runtime::{FlashError, Runtime, TensorRef};
use serde_json::{json, Value};

/// One quantisation on the GPU: the codes and scales it wrote (both poisoned first, so a code or
/// scale the kernel does not write shows).
fn run(
    rt: &Runtime,
    q: &QuantSpec,
    bits: &[u16],
    shape: [usize; 4],
    signs: &[f32],
) -> Result<(Vec<u8>, Vec<f32>), FlashError> {
    let st = rt.stream();
    let drv = |e| FlashError::Driver(format!("quantisation buffers: {e:?}"));
    let [b, s, h, d] = shape;
    let x = st.clone_htod(bits).map_err(drv)?;
    let blocks = s.div_ceil(q.block_rows as usize);
    let n_codes = if q.transpose {
        b * h * d * blocks * q.block_rows as usize
    } else {
        b * s * h * d
    };
    let mut codes = st.clone_htod(&vec![0x7Fu8; n_codes.max(1)]).map_err(drv)?;
    let mut scales = st
        .clone_htod(&vec![f32::NAN; (b * h * blocks).max(1)])
        .map_err(drv)?;
    let dsigns = st.clone_htod(signs).map_err(drv)?;
    let kernel = rt.load_quantize(q)?;
    let xt = TensorRef::new(&x, shape, st);
    let signs = q.hadamard.then_some(&dsigns);
    rt.quantize(&kernel, &xt, signs, &mut codes, &mut scales)?;
    rt.synchronize()?;
    let mut codes = st.clone_dtoh(&codes).map_err(drv)?;
    codes.truncate(n_codes);
    Ok((codes, st.clone_dtoh(&scales).map_err(drv)?))
}

/// bf16 and f16 inputs with outliers (0.1 % ×10) and a tiny batch element, odd shapes, blocks
/// of 64 and 128 rows, plain, rotated, transposed for P·V, and both: every code (the transposed
/// padding included) and every scale must equal the host model's. Returns (lines, failures).
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
            for block_rows in [64u32, 128] {
                for (hadamard, transpose) in
                    [(false, false), (true, false), (false, true), (true, true)]
                {
                    seed += 1;
                    n += 1;
                    let q = QuantSpec {
                        input,
                        head_dim: shape[3] as u32,
                        format: Fp8Format::E4m3,
                        block_rows,
                        hadamard,
                        transpose,
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
                    if hadamard {
                        hadamard_rotate_f32(&mut x, &signs, q.hadamard_norm());
                    }
                    let rows = block_rows as usize;
                    let want = quantize(&x, shape, Scaling::PerBlock { rows }, Fp8Format::E4m3);
                    let want_codes = if transpose {
                        transpose_for_pv(&want.codes, shape, rows)
                    } else {
                        want.codes.clone()
                    };
                    let label = format!(
                        "quant {} {shape:?} rows {block_rows} hadamard {hadamard} transposed {transpose}",
                        input.name()
                    );
                    match run(rt, &q, &bits, shape, &signs) {
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
    (n, fails)
}

/// GB/s of quantising Q-sized tensors (bf16, d 128, 16 heads, 16k tokens; blocks of 128, with
/// and without the rotation): bytes read plus codes and scales written.
pub fn timing_quantize(rt: &Runtime, rows: &mut Vec<Value>) -> Result<(), FlashError> {
    let shape = [1usize, 16384, 16, 128];
    let len: usize = shape.iter().product();
    let st = rt.stream();
    let drv = |e| FlashError::Driver(format!("quantisation buffers: {e:?}"));
    let bits: Vec<u16> = attention_inputs(len, true, 1)
        .iter()
        .map(|&v| DType::Bf16.to_bits(v))
        .collect();
    let x = st.clone_htod(&bits).map_err(drv)?;
    let mut codes = st.alloc_zeros::<u8>(len).map_err(drv)?;
    let mut scales = st.alloc_zeros::<f32>(16 * 128).map_err(drv)?;
    let signs: Vec<f32> = random_signs(128, 3).iter().map(|&s| s as f32).collect();
    let dsigns = st.clone_htod(&signs).map_err(drv)?;
    for hadamard in [false, true] {
        let q = QuantSpec {
            input: DType::Bf16,
            head_dim: 128,
            format: Fp8Format::E4m3,
            block_rows: 128,
            hadamard,
            transpose: false,
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
            "quant bf16->e4m3 {shape:?} rows 128 hadamard {hadamard}: {ms:.4} ms {gbps:.0} GB/s"
        );
        rows.push(json!({"backend": "flash", "variant": if hadamard { "quant_e4m3_hadamard" } else { "quant_e4m3" }, "dtype": "bf16",
            "d": 128, "n": 16384, "b": 1, "h": 16, "mode": "quantize", "ms": ms, "gbps": gbps}));
    }
    Ok(())
}
