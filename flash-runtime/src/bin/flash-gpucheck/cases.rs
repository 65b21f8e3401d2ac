//! The correctness cases: the shapes, and one case run on the GPU by every kernel family.

use flash_dsl::eval::{ParamValues, Sizes};
use flash_dsl::model::reference::Problem;
use flash_dsl::plan::splitkv::splitkv_unsupported;
use flash_dsl::plan::{default_config_for, default_config_for_launch, KernelFamily};
use flash_dsl::rng::SplitMix as Rng;
use flash_dsl::{TileConfig, VariantSpec};
use flash_runtime::launch::contiguous_strides;
use flash_runtime::{FlashError, LseMut, Runtime, TensorMut, TensorRef};

use crate::device::{draw, nan_bits, param_args, random_params, upload_params};

#[derive(Clone, Copy, Debug)]
pub struct Shape {
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hkv: usize,
    /// Q/K/V inside one packed `[b, s, 3, h, d]` buffer and O with padded rows.
    strided: bool,
}

const fn sh(b: usize, sq: usize, sk: usize, hq: usize, hkv: usize) -> Shape {
    Shape {
        b,
        sq,
        sk,
        hq,
        hkv,
        strided: false,
    }
}

pub fn shapes(small: bool) -> Vec<Shape> {
    let mut v = vec![
        sh(1, 1, 1, 1, 1),
        sh(2, 17, 17, 3, 3),
        sh(1, 113, 113, 6, 2), // GQA
        sh(1, 113, 300, 4, 1), // MQA, seq_q < seq_k
        sh(1, 300, 113, 2, 2), // seq_q > seq_k: early rows fully masked under causal
        sh(2, 17, 0, 2, 2),    // no keys at all
        Shape {
            strided: true,
            ..sh(2, 65, 65, 4, 4)
        },
    ];
    // Decode (one and four query tokens, GQA 4 and MQA, odd key counts), where the runtime takes
    // the split-KV pass.
    v.push(sh(3, 1, 4097, 16, 4));
    v.push(sh(2, 4, 1000, 8, 2));
    if !small {
        v.push(sh(1, 1, 33001, 8, 1));
        v.push(sh(1, 1023, 1023, 2, 1));
        v.push(sh(1, 4096, 4096, 1, 1));
    }
    v
}

/// One problem, run by every kernel family under test.
pub struct CaseResult {
    pub name: String,
    pub problem: Problem,
    pub spec: VariantSpec,
    /// Per family: its name and O, LSE, stray writes (elements of the O buffer outside the
    /// view that were overwritten), or the error.
    pub runs: Vec<(String, Result<GpuOut, String>)>,
}

/// How a case reaches the GPU: a forward kernel family's default tile, or the split-KV pass
/// with the runtime's split count or a forced one.
#[derive(Clone, Copy, Debug)]
enum Path {
    Forward(TileConfig),
    SplitKv(Option<usize>),
}

/// Runs one case on the GPU; the CPU comparison happens later, in parallel. Besides each
/// family's forward kernel, variants with a split-KV pass run it twice: with the split count
/// the runtime picks and with 3 forced splits (so the merge of splits runs on every shape).
pub fn run_case(
    rt: &Runtime,
    spec: &VariantSpec,
    s: Shape,
    seed: u64,
    families: &[KernelFamily],
) -> CaseResult {
    let dt = spec.dtype;
    let name = format!(
        "{:<13} {:<4} d{:<3} b{} {}x{} h{}/{}{}",
        spec.name,
        dt.name(),
        spec.head_dim_qk,
        s.b,
        s.sq,
        s.sk,
        s.hq,
        s.hkv,
        if s.strided { " strided" } else { "" }
    );
    let mut rng = Rng(seed);
    let d = spec.head_dim_qk as usize;
    let dv = spec.head_dim_v as usize;
    let sizes = Sizes {
        batch: s.b,
        heads: s.hq,
        seq_q: s.sq,
        seq_k: s.sk,
    };
    let params = random_params(spec, sizes, &mut rng);
    let (qb, qv) = draw(&mut rng, s.b * s.sq * s.hq * d, dt);
    let (kb, kv) = draw(&mut rng, s.b * s.sk * s.hkv * d, dt);
    let (vb, vv) = draw(&mut rng, s.b * s.sk * s.hkv * dv, dt);
    let problem = Problem {
        batch: s.b,
        heads_q: s.hq,
        heads_kv: s.hkv,
        seq_q: s.sq,
        seq_k: s.sk,
        q: qv,
        k: kv,
        v: vv,
        params: params.clone(),
        rng: crate::device::CHECK_RNG,
    };
    let mut paths: Vec<(String, Path)> = families
        .iter()
        .map(|&fam| {
            (
                fam.tag().to_string(),
                Path::Forward(default_config_for(spec, fam)),
            )
        })
        .collect();
    // Where a long launch takes another configuration (`default_config_for_launch`), that
    // kernel is checked here too, at this case's sizes.
    for &fam in families {
        let long = default_config_for_launch(spec, fam, usize::MAX);
        if long != default_config_for(spec, fam) {
            paths.push((format!("{}-long", fam.tag()), Path::Forward(long)));
        }
    }
    // A dropout variant's split-KV kernel serves it at p = 0 and this case's params draw p > 0:
    // the paged decode and chunked-prefill checks run its paged kernels at p = 0; the kernel
    // over contiguous K/V (the same code with another row lookup) is not checked on its own.
    if splitkv_unsupported(spec).is_none() && spec.dropout.is_none() {
        paths.push(("splitkv".into(), Path::SplitKv(None)));
        paths.push(("splitkv3".into(), Path::SplitKv(Some(3))));
    }
    let runs = paths
        .into_iter()
        .map(|(label, path)| {
            let r =
                gpu_case(rt, spec, path, s, &params, (&qb, &kb, &vb)).map_err(|e| e.to_string());
            (label, r)
        })
        .collect();
    CaseResult {
        name,
        problem,
        spec: spec.clone(),
        runs,
    }
}

pub type GpuOut = (Vec<f64>, Vec<f64>, usize);

fn gpu_case(
    rt: &Runtime,
    spec: &VariantSpec,
    path: Path,
    s: Shape,
    params: &ParamValues,
    (qb, kb, vb): (&[u16], &[u16], &[u16]),
) -> Result<GpuOut, FlashError> {
    let st = rt.stream();
    let drv = |what: &'static str| move |e| FlashError::Driver(format!("{what}: {e:?}"));
    let dt = spec.dtype;
    let (d, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let run = |q: &TensorRef<'_>,
               k: &TensorRef<'_>,
               v: &TensorRef<'_>,
               o: &mut TensorMut<'_>,
               l: &mut LseMut<'_>,
               args: &[flash_runtime::ParamArg<'_>]|
     -> Result<(), FlashError> {
        match path {
            Path::Forward(cfg) => rt.forward(&*rt.load(spec, Some(cfg))?, q, k, v, o, l, args),
            Path::SplitKv(splits) => {
                let kernels = rt.load_split_kv(spec, None)?;
                rt.forward_split_kv(&kernels, q, k, v, o, l, args, splits)
                    .map(|_| ())
            }
        }
    };
    let q_shape = [s.b, s.sq, s.hq, d];
    let k_shape = [s.b, s.sk, s.hkv, d];
    let v_shape = [s.b, s.sk, s.hkv, dv];
    let o_shape = [s.b, s.sq, s.hq, dv];
    let pad = |mut v: Vec<u16>| {
        let n = v.len().max(8);
        v.resize(n, 0);
        v
    };
    // O: padded rows when strided, so stray writes land in checkable padding.
    let o_strides = if s.strided {
        let row = (s.hq * dv + 8) as i64;
        [row * s.sq as i64, row, dv as i64, 1]
    } else {
        contiguous_strides(o_shape)
    };
    let o_len = if s.strided {
        (s.b * s.sq * (s.hq * dv + 8)).max(8)
    } else {
        o_shape.iter().product::<usize>().max(8)
    };
    let mut o = st
        .clone_htod(&vec![nan_bits(dt); o_len])
        .map_err(drv("allocating O"))?;
    let n_lse = s.b * s.hq * s.sq;
    let mut lse = st
        .clone_htod(&vec![f32::NAN; n_lse.max(1)])
        .map_err(drv("allocating the LSE"))?;
    let dparams = upload_params(rt, params)?;
    let args = param_args(rt, spec, params, &dparams);

    if s.strided {
        // One packed [b, s, 3, h, d] buffer (needs sq == sk, hq == hkv, d == dv).
        assert!(s.sq == s.sk && s.hq == s.hkv && d == dv);
        let row = 3 * s.hq * d;
        let mut packed = vec![0u16; s.b * s.sq * row];
        for b in 0..s.b {
            for i in 0..s.sq {
                for h in 0..s.hq {
                    let src = ((b * s.sq + i) * s.hq + h) * d;
                    let dst = (b * s.sq + i) * row + h * d;
                    packed[dst..dst + d].copy_from_slice(&qb[src..src + d]);
                    let dst = dst + s.hq * d;
                    packed[dst..dst + d].copy_from_slice(&kb[src..src + d]);
                    let dst = dst + s.hq * d;
                    packed[dst..dst + d].copy_from_slice(&vb[src..src + d]);
                }
            }
        }
        let buf = st.clone_htod(&packed).map_err(drv("copying QKV"))?;
        let strides = [(s.sq * row) as i64, row as i64, d as i64, 1];
        // Views at element offsets 0, h·d, 2·h·d of the same buffer.
        let tq = TensorRef::strided(&buf, q_shape, strides, st);
        let tk = TensorRef::strided_at(&buf, s.hq * d, k_shape, strides, st);
        let tv = TensorRef::strided_at(&buf, 2 * s.hq * d, v_shape, strides, st);
        let mut to = TensorMut::strided(&mut o, o_shape, o_strides, st);
        let mut tl = LseMut::new(&mut lse, st);
        run(&tq, &tk, &tv, &mut to, &mut tl, &args)?;
    } else {
        let dq = st.clone_htod(&pad(qb.to_vec())).map_err(drv("copying Q"))?;
        let dk = st.clone_htod(&pad(kb.to_vec())).map_err(drv("copying K"))?;
        let dvv = st.clone_htod(&pad(vb.to_vec())).map_err(drv("copying V"))?;
        let tq = TensorRef::new(&dq, q_shape, st);
        let tk = TensorRef::new(&dk, k_shape, st);
        let tv = TensorRef::new(&dvv, v_shape, st);
        let mut to = TensorMut::strided(&mut o, o_shape, o_strides, st);
        let mut tl = LseMut::new(&mut lse, st);
        run(&tq, &tk, &tv, &mut to, &mut tl, &args)?;
    }
    rt.synchronize()?;
    let oh: Vec<u16> = st.clone_dtoh(&o).map_err(drv("copying O back"))?;
    let lh: Vec<f32> = st.clone_dtoh(&lse).map_err(drv("copying the LSE back"))?;
    let mut out = vec![0.0; o_shape.iter().product()];
    let mut touched = vec![false; oh.len()];
    for b in 0..s.b {
        for i in 0..s.sq {
            for h in 0..s.hq {
                for c in 0..dv {
                    let at = b as i64 * o_strides[0]
                        + i as i64 * o_strides[1]
                        + h as i64 * o_strides[2]
                        + c as i64;
                    touched[at as usize] = true;
                    out[((b * s.sq + i) * s.hq + h) * dv + c] = dt.from_bits(oh[at as usize]);
                }
            }
        }
    }
    let stray = oh
        .iter()
        .zip(&touched)
        .filter(|(x, t)| !**t && **x != nan_bits(dt))
        .count();
    Ok((out, lh[..n_lse].iter().map(|&x| x as f64).collect(), stray))
}
