//! Tutorial 2: run a macro-declared variant on the GPU with the runtime, check it against a
//! CPU reference and time it. Without a GPU (or NVRTC) it prints the runtime's error, which is
//! a value, not a panic, and exits cleanly.
//!
//! ```sh
//! cargo run --release -p flash-examples --example 02_run_on_gpu
//! ```

use flash_runtime::cudarc::driver::CudaSlice;
use flash_runtime::{FlashError, LseMut, Runtime, TensorMut, TensorRef, Variant};

flash_macros::attention! {
    /// Causal attention with a runtime soft-cap on the logits.
    pub Softcap {
        head_dim: 64,
        dtype: bf16,
        params: { cap: f32 },
        mask: causal,
        score: softcap(s, cap),
    }
}

const B: usize = 2;
const S: usize = 512;
const H: usize = 4;
const D: usize = 64;
const CAP: f32 = 30.0;

fn bf16_bits(x: f32) -> u16 {
    // Round to nearest even (inputs here are finite).
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}
fn bf16_value(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Deterministic pseudo-random inputs in [-1, 1), as bf16 bits.
fn inputs(seed: u64, n: usize) -> Vec<u16> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            bf16_bits(((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
        })
        .collect()
}

/// CPU reference of one output row `[b, i, h, :]` (f64).
fn reference_row(q: &[u16], k: &[u16], v: &[u16], b: usize, i: usize, h: usize) -> Vec<f64> {
    let at = |t: &[u16], b: usize, s: usize, d: usize| {
        bf16_value(t[((b * S + s) * H + h) * D + d]) as f64
    };
    let scale = 1.0 / (D as f64).sqrt();
    let scores: Vec<f64> = (0..=i) // causal: keys 0..=i (seq_q == seq_k)
        .map(|j| {
            let s = scale * (0..D).map(|d| at(q, b, i, d) * at(k, b, j, d)).sum::<f64>();
            CAP as f64 * (s / CAP as f64).tanh()
        })
        .collect();
    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let l: f64 = w.iter().sum();
    (0..D)
        .map(|d| {
            w.iter()
                .enumerate()
                .map(|(j, p)| p * at(v, b, j, d))
                .sum::<f64>()
                / l
        })
        .collect()
}

fn run(rt: &Runtime) -> Result<(), FlashError> {
    let info = rt.info();
    println!(
        "GPU 0: {} ({}, {} SMs)",
        info.name, info.arch, info.sm_count
    );

    let st = rt.stream();
    let drv = |what: &'static str| move |e| FlashError::Driver(format!("{what}: {e:?}"));
    let shape = [B, S, H, D];
    let n = B * S * H * D;
    let (hq, hk, hv) = (inputs(1, n), inputs(2, n), inputs(3, n));
    let q: CudaSlice<u16> = st.clone_htod(&hq).map_err(drv("copying Q"))?;
    let k: CudaSlice<u16> = st.clone_htod(&hk).map_err(drv("copying K"))?;
    let v: CudaSlice<u16> = st.clone_htod(&hv).map_err(drv("copying V"))?;
    let mut o: CudaSlice<u16> = st.alloc_zeros(n).map_err(drv("allocating O"))?;
    let mut lse: CudaSlice<f32> = st
        .alloc_zeros(B * H * S)
        .map_err(drv("allocating the LSE"))?;

    let (tq, tk, tv) = (
        TensorRef::new(&q, shape, st),
        TensorRef::new(&k, shape, st),
        TensorRef::new(&v, shape, st),
    );
    let params = SoftcapParams::new(CAP);
    let kernel = {
        let mut to = TensorMut::new(&mut o, shape, st);
        let mut tl = LseMut::new(&mut lse, st);
        // Parses `Softcap::SOURCE` once, plans for this GPU, compiles (or loads from the kernel
        // cache) and launches.
        rt.forward_variant::<Softcap>(&tq, &tk, &tv, &mut to, &mut tl, &params)?
    };
    rt.synchronize()?;
    println!(
        "ran {} with kernel {} ({:?}, loaded in {:.1} ms)",
        Softcap::NAME,
        kernel.plan.kernel_name,
        kernel.outcome,
        kernel.load_ms
    );

    let ho: Vec<u16> = st.clone_dtoh(&o).map_err(drv("copying O back"))?;
    let mut max_err = 0f64;
    for (b, i, h) in [(0, 0, 0), (0, 17, 1), (1, 300, 2), (1, S - 1, 3)] {
        let want = reference_row(&hq, &hk, &hv, b, i, h);
        for (d, w) in want.iter().enumerate() {
            let got = bf16_value(ho[((b * S + i) * H + h) * D + d]) as f64;
            max_err = max_err.max((got - w).abs());
        }
    }
    println!("max |O - reference| over 4 rows: {max_err:.2e}");
    if max_err > 2e-2 {
        return Err(FlashError::Invalid(format!(
            "output differs from the reference by {max_err}"
        )));
    }

    // Timing: the raw API takes the params as a checked list of ParamArg.
    let args = Softcap::param_args(&params, st);
    let mut to = TensorMut::new(&mut o, shape, st);
    let mut tl = LseMut::new(&mut lse, st);
    let ms = rt.time_forward(&kernel, &tq, &tk, &tv, &mut to, &mut tl, &args, 5, 20)?;
    // Causal: about half of the 4·B·H·S²·D dense FLOPs are useful.
    let flops = 4.0 * (B * H * S * S * D) as f64 * 0.5;
    println!(
        "median {ms:.3} ms, {:.1} TFLOP/s",
        flops / (ms as f64 * 1e-3) / 1e12
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    // Errors, not panics: no driver or no GPU comes back as a FlashError.
    let rt = match Runtime::new(0) {
        Ok(rt) => rt,
        Err(e) => {
            println!("no GPU found, nothing run: {e}");
            println!("(this example needs an NVIDIA GPU and its driver; `flash info` shows what was found)");
            return std::process::ExitCode::SUCCESS;
        }
    };
    match run(&rt) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
