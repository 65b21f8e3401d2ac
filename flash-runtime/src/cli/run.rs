//! `flash run`: one forward pass of a `.flash` variant on `.npy` inputs.
//!
//! ```text
//! flash run FILE --q q.npy --k k.npy --v v.npy [--param NAME=FILE.npy|NAME=VALUE ...]
//!           [--name V] [--head-dim D] [--dtype bf16|f16] [--tile ...] [--gpu N]
//!           --out o.npy [--lse lse.npy] [--out-dtype same|f32]
//! ```
//!
//! Q is `[batch, seq_q, heads_q, d]`, K and V `[batch, seq_k, heads_kv, d]` (see `npy` for the
//! element types read; anything but the variant's own 16-bit type is rounded to it). Tensor
//! params are read from `.npy` files and converted to the declared element type; scalars are
//! given inline. O is written in the variant's dtype (bf16 as `'<V2'`, see `npy`) or as f32 with
//! `--out-dtype f32`; the LSE `[batch, heads_q, seq_q]` as f32.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use flash_dsl::spec::{ParamKind, ScalarTy};
use flash_dsl::DType;

use crate::error::FlashError;
use crate::launch::{LseMut, Runtime, TensorMut, TensorRef};
use crate::npy::{NpyArray, NpyData};
use crate::variant::ParamArg;

use super::args::VariantArgs;

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub variant: VariantArgs,
    /// Queries, `[batch, seq_q, heads_q, head_dim]`.
    #[arg(long)]
    pub q: PathBuf,
    /// Keys, `[batch, seq_k, heads_kv, head_dim]`.
    #[arg(long)]
    pub k: PathBuf,
    /// Values, `[batch, seq_k, heads_kv, head_dim_v]`.
    #[arg(long)]
    pub v: PathBuf,
    /// A parameter: `NAME=FILE.npy` for tensors, `NAME=VALUE` for scalars (repeatable).
    #[arg(long = "param")]
    pub params: Vec<String>,
    /// Where to write O.
    #[arg(long)]
    pub out: PathBuf,
    /// Where to write the LSE (f32, natural log).
    #[arg(long)]
    pub lse: Option<PathBuf>,
    /// Element type of the written O.
    #[arg(long, value_enum, default_value = "same")]
    pub out_dtype: OutDType,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutDType {
    /// The variant's dtype.
    Same,
    F32,
}

fn invalid(msg: impl Into<String>) -> FlashError {
    FlashError::Invalid(msg.into())
}

fn shape4(name: &str, a: &NpyArray) -> Result<[usize; 4], FlashError> {
    <[usize; 4]>::try_from(a.shape.as_slice()).map_err(|_| {
        invalid(format!(
            "--{name} must be a 4-d array [batch, seq, heads, head_dim]; got shape {:?}",
            a.shape
        ))
    })
}

/// A parsed `--param`.
enum ParamValue {
    Scalar(String),
    File(NpyArray),
}

/// Runs `flash run`.
pub fn cmd_run(a: &RunArgs) -> Result<ExitCode, FlashError> {
    let specs = a.variant.load()?;
    let spec = match specs.as_slice() {
        [s] => s.clone(),
        _ => {
            return Err(invalid(format!(
                "{} declares {} variants ({}); pick one with --name",
                a.variant.file.display(),
                specs.len(),
                specs
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    };
    let (q, k, v) = (
        NpyArray::read(&a.q)?,
        NpyArray::read(&a.k)?,
        NpyArray::read(&a.v)?,
    );
    let (qs, ks, vs) = (shape4("q", &q)?, shape4("k", &k)?, shape4("v", &v)?);

    let mut given = std::collections::HashMap::new();
    for p in &a.params {
        let (name, value) = p.split_once('=').ok_or_else(|| {
            invalid(format!(
                "--param takes NAME=VALUE or NAME=FILE.npy; got `{p}`"
            ))
        })?;
        if spec.param_index(name).is_none() {
            return Err(invalid(format!(
                "`{}` has no param `{name}`; it declares: {}",
                spec.name,
                spec.params
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let v = if value.ends_with(".npy") {
            ParamValue::File(NpyArray::read(std::path::Path::new(value))?)
        } else {
            ParamValue::Scalar(value.to_string())
        };
        given.insert(name.to_string(), v);
    }

    let rt = Runtime::new(a.gpu)?;
    let family = rt.info().default_family;
    let plan = a.variant.plan(&spec, family)?;
    let kernel = rt.load(&spec, Some(plan.config))?;
    let stream = rt.stream().clone();
    let up = |x: &NpyArray| -> Result<_, FlashError> {
        let bits = x.data.to_half_bits(spec.dtype);
        stream
            .clone_htod(&pad(bits))
            .map_err(|e| FlashError::Driver(format!("copying an input to the GPU: {e:?}")))
    };
    let (dq, dk, dv) = (up(&q)?, up(&k)?, up(&v)?);
    let o_shape = [qs[0], qs[1], qs[2], spec.head_dim_v as usize];
    let n_o: usize = o_shape.iter().product();
    let n_lse = qs[0] * qs[2] * qs[1];
    let drv = |what: &str| {
        let what = what.to_string();
        move |e| FlashError::Driver(format!("{what}: {e:?}"))
    };
    let mut o = stream
        .alloc_zeros::<u16>(n_o.max(8))
        .map_err(drv("allocating O"))?;
    let mut lse = stream
        .alloc_zeros::<f32>(n_lse.max(1))
        .map_err(drv("allocating the LSE"))?;

    // Params: device buffers live in `bufs_i32` / `bufs_f32` until the launch has finished.
    let mut bufs_i32 = Vec::new();
    let mut bufs_f32 = Vec::new();
    enum Slot {
        I32(i32),
        F32(f32),
        /// Index into the buffers, and the element count the user gave.
        TI(usize, usize),
        TF(usize, usize),
    }
    let mut slots = Vec::new();
    for decl in &spec.params {
        let v = given.remove(&decl.name).ok_or_else(|| {
            invalid(format!(
                "param `{}` is missing: pass --param {}=...",
                decl.name, decl.name
            ))
        })?;
        let slot = match (&decl.kind, v) {
            (ParamKind::Scalar(ScalarTy::I32), ParamValue::Scalar(s)) => Slot::I32(
                s.parse()
                    .map_err(|_| invalid(format!("param `{}` is an i32; got `{s}`", decl.name)))?,
            ),
            (ParamKind::Scalar(ScalarTy::F32), ParamValue::Scalar(s)) => Slot::F32(
                s.parse()
                    .map_err(|_| invalid(format!("param `{}` is an f32; got `{s}`", decl.name)))?,
            ),
            (
                ParamKind::Tensor {
                    elem: ScalarTy::I32,
                    ..
                },
                ParamValue::File(arr),
            ) => {
                let data = arr
                    .data
                    .to_i32()
                    .map_err(|e| invalid(format!("param `{}`: {e}", decl.name)))?;
                let n = data.len();
                bufs_i32.push(
                    stream
                        .clone_htod(&pad(data))
                        .map_err(drv("copying a param to the GPU"))?,
                );
                Slot::TI(bufs_i32.len() - 1, n)
            }
            (
                ParamKind::Tensor {
                    elem: ScalarTy::F32,
                    ..
                },
                ParamValue::File(arr),
            ) => {
                let n = arr.data.len();
                bufs_f32.push(
                    stream
                        .clone_htod(&pad(arr.data.to_f32()))
                        .map_err(drv("copying a param to the GPU"))?,
                );
                Slot::TF(bufs_f32.len() - 1, n)
            }
            (ParamKind::Tensor { .. }, ParamValue::Scalar(s)) => {
                return Err(invalid(format!(
                    "param `{}` is a tensor: pass --param {}=FILE.npy; got `{s}`",
                    decl.name, decl.name
                )))
            }
            (ParamKind::Scalar(_), ParamValue::File(_)) => {
                return Err(invalid(format!(
                    "param `{}` is a scalar: pass --param {}=VALUE",
                    decl.name, decl.name
                )))
            }
        };
        slots.push(slot);
    }
    let args: Vec<ParamArg<'_>> = slots
        .iter()
        .map(|s| match s {
            Slot::I32(x) => ParamArg::I32(*x),
            Slot::F32(x) => ParamArg::F32(*x),
            Slot::TI(i, len) => {
                let mut p = ParamArg::tensor_i32(&bufs_i32[*i], &stream);
                if let ParamArg::Tensor { len: l, .. } = &mut p {
                    *l = *len;
                }
                p
            }
            Slot::TF(i, len) => {
                let mut p = ParamArg::tensor_f32(&bufs_f32[*i], &stream);
                if let ParamArg::Tensor { len: l, .. } = &mut p {
                    *l = *len;
                }
                p
            }
        })
        .collect();

    {
        let (tq, tk, tv) = (
            TensorRef::new(&dq, qs, &stream),
            TensorRef::new(&dk, ks, &stream),
            TensorRef::new(&dv, vs, &stream),
        );
        let mut to = TensorMut::new(&mut o, o_shape, &stream);
        let mut tl = LseMut::new(&mut lse, &stream);
        rt.forward(&kernel, &tq, &tk, &tv, &mut to, &mut tl, &args)?;
    }
    rt.synchronize()?;
    let o_host: Vec<u16> = stream.clone_dtoh(&o).map_err(drv("copying O back"))?;
    let lse_host: Vec<f32> = stream
        .clone_dtoh(&lse)
        .map_err(drv("copying the LSE back"))?;
    let o_host = o_host[..n_o].to_vec();
    let o_data = match (a.out_dtype, spec.dtype) {
        (OutDType::Same, DType::Bf16) => NpyData::Bf16(o_host),
        (OutDType::Same, DType::F16) => NpyData::F16(o_host),
        (OutDType::F32, dtype) => {
            NpyData::F32(o_host.iter().map(|&b| dtype.from_bits(b) as f32).collect())
        }
    };
    NpyArray::new(o_shape.to_vec(), o_data)?.write(&a.out)?;
    if let Some(p) = &a.lse {
        NpyArray::new(
            vec![qs[0], qs[2], qs[1]],
            NpyData::F32(lse_host[..n_lse].to_vec()),
        )?
        .write(p)?;
    }
    eprintln!(
        "ran {} ({}) on {}: q {:?}, k {:?}; kernel {} ms to load ({})",
        spec.name,
        kernel.plan.kernel_name,
        rt.info().name,
        qs,
        ks,
        kernel.load_ms.round(),
        kernel.outcome.as_str()
    );
    Ok(ExitCode::SUCCESS)
}

/// Never allocates zero elements (the driver refuses empty allocations); the launch checks use
/// the logical lengths, not the padded ones.
fn pad<T: Default + Clone>(mut v: Vec<T>) -> Vec<T> {
    if v.len() < 8 {
        v.resize(8, T::default());
    }
    v
}
