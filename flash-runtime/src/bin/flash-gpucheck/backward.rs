//! The backward check: for every example variant, dtype and head dim over a shape matrix, the
//! GPU gradients (dQ, dK, dV and every f32 parameter gradient, after a GPU forward that supplies
//! O and the LSE) against the float64 gradient reference, by FlashAttention's rule: the max
//! error may be at most twice the max error of the plain same-precision backward
//! (`model::backward::backward_lowp`) against the same reference, plus an absolute floor of
//! `1e-4 · max(1, max|reference|)` for near-zero gradients (and, for dQ and dK of variants with
//! dropout, the share of D = rowsum(dO∘O) that the stored O's rounding carries: see
//! `delta_floor`), plus the error that reading D from the stored O puts into each gradient,
//! measured exactly against the float64 reference (`model::backward::backward_stored_o` with
//! the O the GPU's forward wrote): FlashAttention's algorithm has it, the plain implementation
//! (D from P∘dP) does not, and on rows with two visible keys it exceeds the plain error. A
//! failing gradient names its largest error's element. Poisoned outputs (NaN) catch unwritten
//! elements.

use flash_dsl::eval::{ParamValue, ParamValues, Sizes};
use flash_dsl::model::backward::{backward, backward_lowp, backward_stored_o, Gradients};
use flash_dsl::model::reference::{max_abs_diff, rounding, Problem};
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::{TileConfig, VariantSpec};
use flash_runtime::cudarc::driver::CudaSlice;
use flash_runtime::launch::backward::{BackwardGrads, BackwardInputs, BackwardOptions, LseRef};
use flash_runtime::{FlashError, LseMut, Runtime, TensorMut, TensorRef};

use crate::device::{draw, nan_bits, param_args, random_params, upload_params, DeviceParams};

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

/// One case's verdict lines, with the main kernel's configuration `cfg` (its family named in
/// each line).
pub fn check_backward(
    rt: &Runtime,
    spec: &VariantSpec,
    seed: u64,
    cfg: TileConfig,
) -> Vec<(bool, String)> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, &sh)| check_backward_at(rt, spec, seed + i as u64, cfg, sh))
        .collect()
}

pub type Dims = (usize, usize, usize, usize, usize);

fn drv(what: &'static str) -> impl Fn(flash_runtime::cudarc::driver::DriverError) -> FlashError {
    move |e| FlashError::Driver(format!("{what}: {e:?}"))
}

/// One problem on the GPU after its forward pass: inputs, dO, O and the LSE, and the same
/// values (exactly, as drawn in the dtype) for the CPU references.
struct Prepared {
    dims: Dims,
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    dout: CudaSlice<u16>,
    o: CudaSlice<u16>,
    lse: CudaSlice<f32>,
    params: ParamValues,
    dparams: DeviceParams,
    problem: Problem,
    dov: Vec<f64>,
}

/// Draws a problem (normal inputs rounded to the dtype, random params), uploads it and runs
/// the forward pass for O and the LSE (both poisoned with NaN first).
fn prepare(
    rt: &Runtime,
    spec: &VariantSpec,
    dims: Dims,
    seed: u64,
) -> Result<Prepared, FlashError> {
    let (b, sq, sk, hq, hkv) = dims;
    let dt = spec.dtype;
    let st = rt.stream();
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
    let up = |v: &[u16]| {
        let mut v = v.to_vec();
        v.resize(v.len().max(8), 0);
        st.clone_htod(&v)
    };
    let mut p = Prepared {
        dims,
        q: up(&qb).map_err(drv("copying Q"))?,
        k: up(&kb).map_err(drv("copying K"))?,
        v: up(&vb).map_err(drv("copying V"))?,
        dout: up(&dob).map_err(drv("copying dO"))?,
        o: st
            .clone_htod(&vec![nan_bits(dt); (b * sq * hq * dv).max(8)])
            .map_err(drv("allocating O"))?,
        lse: st
            .clone_htod(&vec![f32::NAN; (b * hq * sq).max(1)])
            .map_err(drv("allocating the LSE"))?,
        dparams: upload_params(rt, &params)?,
        problem: Problem {
            batch: b,
            heads_q: hq,
            heads_kv: hkv,
            seq_q: sq,
            seq_k: sk,
            q: qv,
            k: kv,
            v: vv,
            params: params.clone(),
            rng: crate::device::CHECK_RNG,
        },
        params,
        dov,
    };
    let args = param_args(rt, spec, &p.params, &p.dparams);
    let kernel = rt.load(spec, None)?;
    rt.forward(
        &kernel,
        &TensorRef::new(&p.q, [b, sq, hq, d], st),
        &TensorRef::new(&p.k, [b, sk, hkv, d], st),
        &TensorRef::new(&p.v, [b, sk, hkv, dv], st),
        &mut TensorMut::new(&mut p.o, [b, sq, hq, dv], st),
        &mut LseMut::new(&mut p.lse, st),
        &args,
    )?;
    Ok(p)
}

/// The GPU's gradients: dQ, dK, dV (as values) and, by param index, each f32 gradient.
struct GpuGrads {
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dparams: Vec<Option<Vec<f64>>>,
}

/// Runs the backward pass of `p` into NaN-poisoned buffers and copies the gradients back;
/// `frozen`: with no parameter gradient buffers (the kernels without their terms).
fn run_backward(
    rt: &Runtime,
    spec: &VariantSpec,
    p: &Prepared,
    opts: &BackwardOptions,
    frozen: bool,
) -> Result<GpuGrads, FlashError> {
    let (b, sq, sk, hq, hkv) = p.dims;
    let dt = spec.dtype;
    let st = rt.stream();
    let (d, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let poison = |n: usize| st.clone_htod(&vec![nan_bits(dt); n.max(8)]);
    let mut dq = poison(b * sq * hq * d).map_err(drv("allocating dQ"))?;
    let mut dk = poison(b * sk * hkv * d).map_err(drv("allocating dK"))?;
    let mut dvb = poison(b * sk * hkv * dv).map_err(drv("allocating dV"))?;
    let wanted = flash_dsl::plan::grad_params(spec);
    let mut gbufs: Vec<Option<CudaSlice<f32>>> = Vec::new();
    for (i, value) in p.params.0.iter().enumerate() {
        gbufs.push(if wanted.contains(&i) && !frozen {
            let n = match value {
                ParamValue::FloatTensor(v) => v.len(),
                _ => 1,
            };
            Some(
                st.clone_htod(&vec![f32::NAN; n.max(1)])
                    .map_err(drv("allocating a gradient"))?,
            )
        } else {
            None
        });
    }
    let args = param_args(rt, spec, &p.params, &p.dparams);
    {
        let (qs, ks, vs, os) = (
            [b, sq, hq, d],
            [b, sk, hkv, d],
            [b, sk, hkv, dv],
            [b, sq, hq, dv],
        );
        let input = BackwardInputs {
            q: TensorRef::new(&p.q, qs, st),
            k: TensorRef::new(&p.k, ks, st),
            v: TensorRef::new(&p.v, vs, st),
            o: TensorRef::new(&p.o, os, st),
            d_o: TensorRef::new(&p.dout, os, st),
            lse: LseRef::new(&p.lse, st),
        };
        let mut grads = BackwardGrads {
            dq: TensorMut::new(&mut dq, qs, st),
            dk: TensorMut::new(&mut dk, ks, st),
            dv: TensorMut::new(&mut dvb, vs, st),
            dparams: gbufs.iter_mut().map(|g| g.as_mut()).collect(),
        };
        rt.backward_spec_with(spec, opts, &input, &args, &mut grads)?;
    }
    rt.synchronize()?;
    let back = |x: &CudaSlice<u16>, n: usize| -> Result<Vec<f64>, FlashError> {
        let h: Vec<u16> = st.clone_dtoh(x).map_err(drv("copying back"))?;
        Ok(h[..n].iter().map(|&b| dt.from_bits(b)).collect())
    };
    let mut dparams = Vec::new();
    for g in &gbufs {
        dparams.push(match g {
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
    Ok(GpuGrads {
        dq: back(&dq, b * sq * hq * d)?,
        dk: back(&dk, b * sk * hkv * d)?,
        dv: back(&dvb, b * sk * hkv * dv)?,
        dparams,
    })
}

/// One case of the check at `dims` (batch, seq_q, seq_k, heads_q, heads_kv): each of `SHAPES`,
/// and the long shapes that reach the mask's query hulls (windows of 1024 keys) and many query
/// tiles per key block.
pub fn check_backward_at(
    rt: &Runtime,
    spec: &VariantSpec,
    seed: u64,
    cfg: TileConfig,
    dims: Dims,
) -> (bool, String) {
    match case(rt, spec, dims, seed, cfg) {
        Ok(v) => v,
        Err(e) => (
            false,
            format!(
                "FAIL bwd {} {} {} d{} {dims:?}: {e}",
                cfg.family.tag(),
                spec.name,
                spec.dtype.name(),
                spec.head_dim_qk
            ),
        ),
    }
}

/// The family of a backward configuration as the check's lines name it.
/// With dropout, FlashAttention's D = rowsum(dO∘O) reads the stored O, whose rounding to the
/// dtype (relative u) no longer cancels when O = rp·v is inexact: with a single visible key the
/// true dQ and dK are 0 (dS = P·(rp·dP − D) with D = rp·dP), the plain implementation — which
/// forms D from P∘dP — gets exactly 0, and the kernel gets u·|dO·O|·scale·|K|. This floor is that
/// term, 2·u·max_i Σ_c |dO_ic·O_ic| · scale · max(|Q|, |K|), for dQ and dK of dropout variants
/// only; wherever the plain error is not 0 (any row with two keys) 2× it dominates.
fn delta_floor(spec: &VariantSpec, p: &Prepared) -> f64 {
    if spec.dropout.is_none() {
        return 0.0;
    }
    let u = match spec.dtype {
        flash_dsl::DType::Bf16 => 2f64.powi(-8),
        flash_dsl::DType::F16 => 2f64.powi(-11),
    };
    let dv = spec.head_dim_v as usize;
    let o = flash_dsl::model::reference::forward(spec, &p.problem).o;
    let max_do_o = o
        .chunks(dv)
        .zip(p.dov.chunks(dv))
        .map(|(o, d)| o.iter().zip(d).map(|(a, b)| (a * b).abs()).sum::<f64>())
        .fold(0.0, f64::max);
    let max_qk = p
        .problem
        .q
        .iter()
        .chain(&p.problem.k)
        .fold(0.0f64, |m, x| m.max(x.abs()));
    2.0 * u * max_do_o * spec.softmax_scale() * max_qk
}

fn case(
    rt: &Runtime,
    spec: &VariantSpec,
    dims: Dims,
    seed: u64,
    cfg: TileConfig,
) -> Result<(bool, String), FlashError> {
    let (b, sq, sk, hq, hkv) = dims;
    let p = prepare(rt, spec, dims, seed)?;
    let opts = BackwardOptions {
        config: Some(cfg),
        deterministic: false,
    };
    let got = run_backward(rt, spec, &p, &opts, false)?;
    // With parameter gradients, the same problem with every parameter frozen too (no gradient
    // buffers: the kernels without the gradient terms), its dQ, dK, dV judged the same way.
    let frozen = if flash_dsl::plan::grad_params(spec).is_empty() {
        None
    } else {
        Some(run_backward(rt, spec, &p, &opts, true)?)
    };
    let r64 = backward(spec, &p.problem, &p.dov);
    let plain = backward_lowp(spec, &p.problem, &p.dov, rounding(spec.dtype));
    // The float64 backward with D from the O the GPU's forward stored (see the module doc).
    let stored: Vec<f64> = rt
        .stream()
        .clone_dtoh(&p.o)
        .map_err(drv("copying O back"))?
        .iter()
        .take(b * sq * hq * spec.head_dim_v as usize)
        .map(|&x| spec.dtype.from_bits(x))
        .collect();
    let r_stored = backward_stored_o(spec, &p.problem, &p.dov, &stored);
    let mut ok = true;
    let mut parts = Vec::new();
    let d_floor = delta_floor(spec, &p);
    let mut judge = |name: &str, got: &[f64], want: &[f64], low: &[f64], stored: &[f64]| {
        let nan = got.iter().filter(|x| !x.is_finite()).count();
        let err = max_abs_diff(got, want);
        let err_plain = max_abs_diff(low, want);
        let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let floor = if name.ends_with("dq") || name == "dk" {
            d_floor
        } else {
            0.0
        };
        let bound = 2.0 * err_plain + (1e-4 * scale).max(floor) + max_abs_diff(stored, want);
        let pass = nan == 0 && err <= bound;
        ok &= pass;
        let nan = if nan > 0 {
            format!(" nan {nan}")
        } else {
            String::new()
        };
        // A failure names its largest error's element, [batch, position, head, column] (a
        // parameter gradient: its flat index), so a report can be followed to a row.
        let at = if pass {
            String::new()
        } else {
            let i = (0..got.len())
                .max_by(|&x, &y| {
                    (got[x] - want[x])
                        .abs()
                        .total_cmp(&(got[y] - want[y]).abs())
                })
                .unwrap_or(0);
            let (seq, heads, d) = match name {
                "dq" | "frozen dq" => (sq, hq, spec.head_dim_qk as usize),
                "dk" => (sk, hkv, spec.head_dim_qk as usize),
                "dv" => (sk, hkv, spec.head_dim_v as usize),
                _ => (0, 0, 0),
            };
            if d == 0 {
                format!(" at {i}")
            } else {
                let (c, h, s, b) = (
                    i % d,
                    i / d % heads,
                    i / d / heads % seq,
                    i / d / heads / seq,
                );
                format!(" at [{b},{s},{h},{c}]")
            }
        };
        parts.push(format!(
            "{name} {err:.2e}/{bound:.2e}{nan}{}{at}",
            if pass { "" } else { " !" }
        ));
    };
    judge("dq", &got.dq, &r64.dq, &plain.dq, &r_stored.dq);
    judge("dk", &got.dk, &r64.dk, &plain.dk, &r_stored.dk);
    judge("dv", &got.dv, &r64.dv, &plain.dv, &r_stored.dv);
    for (i, g) in got.dparams.iter().enumerate() {
        if let Some(g) = g {
            let (want, low) = (grad_values(&r64, i), grad_values(&plain, i));
            let stored = grad_values(&r_stored, i);
            judge(
                &format!("d{}", spec.params[i].name),
                g,
                &want,
                &low,
                &stored,
            );
        }
    }
    if let Some(f) = &frozen {
        judge("frozen dq", &f.dq, &r64.dq, &plain.dq, &r_stored.dq);
        judge("dk", &f.dk, &r64.dk, &plain.dk, &r_stored.dk);
        judge("dv", &f.dv, &r64.dv, &plain.dv, &r_stored.dv);
    }
    Ok((
        ok,
        format!(
            "{} bwd {} {:<13} {:<4} d{:<3} b{b} {sq}x{sk} h{hq}/{hkv}  {}",
            if ok { "ok  " } else { "FAIL" },
            cfg.family.tag(),
            spec.name,
            spec.dtype.name(),
            head_dims(spec),
            parts.join("  ")
        ),
    ))
}

/// The head dims as a check line names them: `128`, or `128/64` where qk and v differ.
fn head_dims(spec: &VariantSpec) -> String {
    if spec.head_dim_qk == spec.head_dim_v {
        spec.head_dim_qk.to_string()
    } else {
        format!("{}/{}", spec.head_dim_qk, spec.head_dim_v)
    }
}

fn grad_values(g: &Gradients, i: usize) -> Vec<f64> {
    match g.dparams.get(i) {
        Some(Some(ParamValue::FloatTensor(v))) => v.clone(),
        Some(Some(ParamValue::Float(x))) => vec![*x],
        _ => Vec::new(),
    }
}

/// The deterministic mode: three backward runs give bit-identical dQ, dK and dV, close to the
/// default mode's dQ, with the main kernel's configuration `cfg`. One line per variant.
pub fn check_deterministic(
    rt: &Runtime,
    spec: &VariantSpec,
    cfg: TileConfig,
) -> Result<(bool, String), FlashError> {
    let dims = (2, 300, 300, 4, 2);
    let p = prepare(rt, spec, dims, 99)?;
    let det = BackwardOptions {
        config: Some(cfg),
        deterministic: true,
    };
    let runs = [
        run_backward(rt, spec, &p, &det, false)?,
        run_backward(rt, spec, &p, &det, false)?,
        run_backward(rt, spec, &p, &det, false)?,
    ];
    let nondet = BackwardOptions {
        config: Some(cfg),
        deterministic: false,
    };
    let default = run_backward(rt, spec, &p, &nondet, false)?;
    let bits = |g: &GpuGrads| -> Vec<u64> {
        g.dq.iter()
            .chain(&g.dk)
            .chain(&g.dv)
            .map(|x| x.to_bits())
            .collect()
    };
    let same = bits(&runs[0]) == bits(&runs[1]) && bits(&runs[1]) == bits(&runs[2]);
    let diff = max_abs_diff(&runs[0].dq, &default.dq);
    let scale = default.dq.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let ok = same && diff <= 1e-2 * scale.max(1.0);
    let (b, sq, sk, hq, hkv) = dims;
    Ok((
        ok,
        format!(
            "{} det {} {:<13} {:<4} d{:<3} b{b} {sq}x{sk} h{hq}/{hkv}  3 runs bit-identical: {same}; |dQ_det - dQ_default| {diff:.2e} (max|dQ| {scale:.2e})",
            if ok { "ok  " } else { "FAIL" },
            cfg.family.tag(),
            spec.name,
            spec.dtype.name(),
            head_dims(spec)
        ),
    ))
}
