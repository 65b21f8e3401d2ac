//! The backward check: for every example variant, dtype and head dim over a shape matrix, the
//! GPU gradients (dQ, dK, dV and every f32 parameter gradient, after a GPU forward that supplies
//! O and the LSE) against the float64 gradient reference, by FlashAttention's rule: the max
//! error may be at most twice the max error of the plain same-precision backward
//! (`model::backward::backward_lowp`) against the same reference, plus an absolute floor of
//! `1e-4 · max(1, max|reference|)` for near-zero gradients. Poisoned outputs (NaN) catch
//! unwritten elements.

use flash_dsl::eval::Sizes;
use flash_dsl::model::backward::{backward, backward_lowp, Gradients};
use flash_dsl::model::reference::{max_abs_diff, rounding, Problem};
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::VariantSpec;
use flash_runtime::cudarc::driver::CudaSlice;
use flash_runtime::launch::backward::{BackwardGrads, BackwardInputs, LseRef};
use flash_runtime::{FlashError, LseMut, Runtime, TensorMut, TensorRef};

use crate::device::{draw, nan_bits, param_args, random_params, upload_params};

/// (batch, seq_q, seq_k, heads_q, heads_kv)
const SHAPES: [(usize, usize, usize, usize, usize); 7] = [
    (1, 1, 1, 1, 1),
    (2, 17, 17, 2, 2),
    (1, 113, 113, 3, 1),
    (2, 130, 77, 4, 2),
    (1, 77, 130, 2, 1),
    (1, 200, 200, 2, 2),
    (1, 257, 300, 4, 4),
];

/// One case's verdict lines.
pub fn check_backward(rt: &Runtime, spec: &VariantSpec, seed: u64) -> Vec<(bool, String)> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, &sh)| match case(rt, spec, sh, seed + i as u64) {
            Ok(v) => v,
            Err(e) => (
                false,
                format!(
                    "FAIL bwd {} {} d{} {:?}: {e}",
                    spec.name,
                    spec.dtype.name(),
                    spec.head_dim_qk,
                    sh
                ),
            ),
        })
        .collect()
}

fn case(
    rt: &Runtime,
    spec: &VariantSpec,
    (b, sq, sk, hq, hkv): (usize, usize, usize, usize, usize),
    seed: u64,
) -> Result<(bool, String), FlashError> {
    let dt = spec.dtype;
    let st = rt.stream();
    let drv = |what: &'static str| move |e| FlashError::Driver(format!("{what}: {e:?}"));
    let (d, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let mut rng = Rng(seed);
    let sizes = Sizes {
        batch: b,
        heads: hq,
        seq_q: sq,
        seq_k: sk,
    };
    let params = random_params(spec, sizes, &mut rng);
    let (qb, qv) = draw(&mut rng, b * sq * hq * d, dt);
    let (kb, kv) = draw(&mut rng, b * sk * hkv * d, dt);
    let (vb, vv) = draw(&mut rng, b * sk * hkv * dv, dt);
    let (dob, dov) = draw(&mut rng, b * sq * hq * dv, dt);
    let problem = Problem {
        batch: b,
        heads_q: hq,
        heads_kv: hkv,
        seq_q: sq,
        seq_k: sk,
        q: qv,
        k: kv,
        v: vv,
        params: params.clone(),
    };

    // GPU: forward for O and the LSE, then the backward pass.
    let (qs, ks, vs, os) = (
        [b, sq, hq, d],
        [b, sk, hkv, d],
        [b, sk, hkv, dv],
        [b, sq, hq, dv],
    );
    let up = |v: &[u16]| {
        let mut v = v.to_vec();
        v.resize(v.len().max(8), 0);
        st.clone_htod(&v)
    };
    let q = up(&qb).map_err(drv("copying Q"))?;
    let k = up(&kb).map_err(drv("copying K"))?;
    let v = up(&vb).map_err(drv("copying V"))?;
    let dout = up(&dob).map_err(drv("copying dO"))?;
    let poison = |n: usize| st.clone_htod(&vec![nan_bits(dt); n.max(8)]);
    let mut o = poison(b * sq * hq * dv).map_err(drv("allocating O"))?;
    let mut lse: CudaSlice<f32> = st
        .clone_htod(&vec![f32::NAN; (b * hq * sq).max(1)])
        .map_err(drv("allocating the LSE"))?;
    let mut dq = poison(b * sq * hq * d).map_err(drv("allocating dQ"))?;
    let mut dk = poison(b * sk * hkv * d).map_err(drv("allocating dK"))?;
    let mut dvb = poison(b * sk * hkv * dv).map_err(drv("allocating dV"))?;
    let dparams = upload_params(rt, &params)?;
    let args = param_args(rt, &params, &dparams);
    let mut gbufs: Vec<Option<CudaSlice<f32>>> = Vec::new();
    for (i, p) in spec.params.iter().enumerate() {
        let want = flash_dsl::plan::grad_params(spec).contains(&i);
        gbufs.push(if want {
            let n = match &params.0[i] {
                flash_dsl::eval::ParamValue::FloatTensor(v) => v.len(),
                _ => 1,
            };
            let _ = p;
            Some(
                st.clone_htod(&vec![f32::NAN; n.max(1)])
                    .map_err(drv("allocating a gradient"))?,
            )
        } else {
            None
        });
    }
    {
        let (tq, tk, tv) = (
            TensorRef::new(&q, qs, st),
            TensorRef::new(&k, ks, st),
            TensorRef::new(&v, vs, st),
        );
        let kernel = rt.load(spec, None)?;
        rt.forward(
            &kernel,
            &tq,
            &tk,
            &tv,
            &mut TensorMut::new(&mut o, os, st),
            &mut LseMut::new(&mut lse, st),
            &args,
        )?;
        let input = BackwardInputs {
            q: tq,
            k: tk,
            v: tv,
            o: TensorRef::new(&o, os, st),
            d_o: TensorRef::new(&dout, os, st),
            lse: LseRef::new(&lse, st),
        };
        let mut grads = BackwardGrads {
            dq: TensorMut::new(&mut dq, qs, st),
            dk: TensorMut::new(&mut dk, ks, st),
            dv: TensorMut::new(&mut dvb, vs, st),
            dparams: gbufs.iter_mut().map(|g| g.as_mut()).collect(),
        };
        rt.backward_spec(spec, None, &input, &args, &mut grads)?;
    }
    rt.synchronize()?;
    let back = |x: &CudaSlice<u16>, n: usize| -> Result<Vec<f64>, FlashError> {
        let h: Vec<u16> = st.clone_dtoh(x).map_err(drv("copying back"))?;
        Ok(h[..n].iter().map(|&b| dt.from_bits(b)).collect())
    };
    let got_dq = back(&dq, b * sq * hq * d)?;
    let got_dk = back(&dk, b * sk * hkv * d)?;
    let got_dv = back(&dvb, b * sk * hkv * dv)?;
    let mut got_dp: Vec<Option<Vec<f64>>> = Vec::new();
    for g in &gbufs {
        got_dp.push(match g {
            Some(g) => Some(
                st.clone_dtoh(g)
                    .map_err(drv("copying a gradient back"))?
                    .iter()
                    .map(|&x| x as f64)
                    .collect(),
            ),
            None => None,
        });
    }

    // References.
    let r64 = backward(spec, &problem, &dov);
    let plain = backward_lowp(spec, &problem, &dov, rounding(dt));
    let mut ok = true;
    let mut parts = Vec::new();
    let mut judge = |name: &str, got: &[f64], want: &[f64], low: &[f64]| {
        let nan = got.iter().filter(|x| !x.is_finite()).count();
        let err = max_abs_diff(got, want);
        let err_plain = max_abs_diff(low, want);
        let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let bound = 2.0 * err_plain + 1e-4 * scale;
        let pass = nan == 0 && err <= bound;
        ok &= pass;
        parts.push(format!(
            "{name} {err:.2e}/{bound:.2e}{}{}",
            if nan > 0 {
                format!(" nan {nan}")
            } else {
                String::new()
            },
            if pass { "" } else { " !" }
        ));
    };
    judge("dq", &got_dq, &r64.dq, &plain.dq);
    judge("dk", &got_dk, &r64.dk, &plain.dk);
    judge("dv", &got_dv, &r64.dv, &plain.dv);
    for (i, got) in got_dp.iter().enumerate() {
        if let Some(got) = got {
            let (want, low) = (grad_values(&r64, i), grad_values(&plain, i));
            judge(&format!("d{}", spec.params[i].name), got, &want, &low);
        }
    }
    Ok((
        ok,
        format!(
            "{} bwd {:<13} {:<4} d{:<3} b{b} {sq}x{sk} h{hq}/{hkv}  {}",
            if ok { "ok  " } else { "FAIL" },
            spec.name,
            dt.name(),
            d,
            parts.join("  ")
        ),
    ))
}

fn grad_values(g: &Gradients, i: usize) -> Vec<f64> {
    match g.dparams.get(i) {
        Some(Some(flash_dsl::eval::ParamValue::FloatTensor(v))) => v.clone(),
        Some(Some(flash_dsl::eval::ParamValue::Float(x))) => vec![*x],
        _ => Vec::new(),
    }
}

/// The deterministic mode: three backward runs give bit-identical dQ (and dK, dV), close to the
/// default mode's dQ. One line per variant.
pub fn check_deterministic(rt: &Runtime, spec: &VariantSpec) -> Result<(bool, String), FlashError> {
    use flash_runtime::launch::backward::BackwardOptions;
    let dt = spec.dtype;
    let st = rt.stream();
    let drv = |what: &'static str| move |e| FlashError::Driver(format!("{what}: {e:?}"));
    let (b, sq, sk, hq, hkv) = (2usize, 300usize, 300usize, 4usize, 2usize);
    let (d, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let mut rng = Rng(99);
    let sizes = Sizes {
        batch: b,
        heads: hq,
        seq_q: sq,
        seq_k: sk,
    };
    let params = random_params(spec, sizes, &mut rng);
    let (qb, _) = draw(&mut rng, b * sq * hq * d, dt);
    let (kb, _) = draw(&mut rng, b * sk * hkv * d, dt);
    let (vb, _) = draw(&mut rng, b * sk * hkv * dv, dt);
    let (dob, _) = draw(&mut rng, b * sq * hq * dv, dt);
    let (qs, ks, vs, os) = (
        [b, sq, hq, d],
        [b, sk, hkv, d],
        [b, sk, hkv, dv],
        [b, sq, hq, dv],
    );
    let q = st.clone_htod(&qb).map_err(drv("copying Q"))?;
    let k = st.clone_htod(&kb).map_err(drv("copying K"))?;
    let v = st.clone_htod(&vb).map_err(drv("copying V"))?;
    let dout = st.clone_htod(&dob).map_err(drv("copying dO"))?;
    let mut o = st.alloc_zeros::<u16>(b * sq * hq * dv).map_err(drv("O"))?;
    let mut lse = st.alloc_zeros::<f32>(b * hq * sq).map_err(drv("LSE"))?;
    let dparams = upload_params(rt, &params)?;
    let args = param_args(rt, &params, &dparams);
    let (tq, tk, tv) = (
        TensorRef::new(&q, qs, st),
        TensorRef::new(&k, ks, st),
        TensorRef::new(&v, vs, st),
    );
    let kernel = rt.load(spec, None)?;
    rt.forward(
        &kernel,
        &tq,
        &tk,
        &tv,
        &mut TensorMut::new(&mut o, os, st),
        &mut LseMut::new(&mut lse, st),
        &args,
    )?;
    let mut runs: Vec<(Vec<u16>, Vec<u16>, Vec<u16>)> = Vec::new();
    for det in [true, true, true, false] {
        let mut dq = st.alloc_zeros::<u16>(b * sq * hq * d).map_err(drv("dQ"))?;
        let mut dk = st.alloc_zeros::<u16>(b * sk * hkv * d).map_err(drv("dK"))?;
        let mut dvb = st
            .alloc_zeros::<u16>(b * sk * hkv * dv)
            .map_err(drv("dV"))?;
        {
            let input = BackwardInputs {
                q: tq,
                k: tk,
                v: tv,
                o: TensorRef::new(&o, os, st),
                d_o: TensorRef::new(&dout, os, st),
                lse: LseRef::new(&lse, st),
            };
            let mut grads = BackwardGrads {
                dq: TensorMut::new(&mut dq, qs, st),
                dk: TensorMut::new(&mut dk, ks, st),
                dv: TensorMut::new(&mut dvb, vs, st),
                dparams: Vec::new(),
            };
            let opts = BackwardOptions {
                config: None,
                deterministic: det,
            };
            rt.backward_spec_with(spec, &opts, &input, &args, &mut grads)?;
        }
        rt.synchronize()?;
        runs.push((
            st.clone_dtoh(&dq).map_err(drv("dQ back"))?,
            st.clone_dtoh(&dk).map_err(drv("dK back"))?,
            st.clone_dtoh(&dvb).map_err(drv("dV back"))?,
        ));
    }
    let same = runs[0] == runs[1] && runs[1] == runs[2];
    let f = |x: &[u16]| -> Vec<f64> { x.iter().map(|&b| dt.from_bits(b)).collect() };
    let diff = max_abs_diff(&f(&runs[0].0), &f(&runs[3].0));
    let scale = f(&runs[3].0).iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let ok = same && diff <= 1e-2 * scale.max(1.0);
    Ok((
        ok,
        format!(
            "{} det {:<13} {:<4} d{:<3} b{b} {sq}x{sk} h{hq}/{hkv}  3 runs bit-identical: {same}; |dQ_det - dQ_default| {diff:.2e} (max|dQ| {scale:.2e})",
            if ok { "ok  " } else { "FAIL" },
            spec.name,
            dt.name(),
            d
        ),
    ))
}
