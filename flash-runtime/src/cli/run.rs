//! `flash run`: one forward pass of a `.flash` variant on `.npy` inputs, optionally followed by
//! the backward pass.
//!
//! ```text
//! flash run FILE --q q.npy --k k.npy --v v.npy [--param NAME=FILE.npy|NAME=VALUE ...]
//!           [--name V] [--head-dim D] [--dtype bf16|f16] [--tile ...] [--gpu N]
//!           --out o.npy [--lse lse.npy] [--out-dtype same|f32]
//!           [--do dO.npy [--dq dq.npy] [--dk dk.npy] [--dv dv.npy] [--dparam NAME=FILE.npy ...]]
//!           [--splits N] [--page-table table.npy --seqlens-k lens.npy]
//!           [--cu-seqlens-q cu_q.npy --cu-seqlens-k cu_k.npy]
//! ```
//!
//! Decode-sized launches (at most 64 query rows per KV head) take the split-KV kernel with the
//! runtime's split count, as `Runtime::forward_spec` does, unless `--tile` forces a forward tile;
//! `--splits N` forces the split-KV kernel with N splits. With `--page-table` (`[batch,
//! max_pages]` integers) and `--seqlens-k` (`[batch]` cached lengths), `--k` and `--v` are paged
//! caches `[pages, page_size, heads_kv, d]`; the table and lengths are checked before the launch.
//!
//! With `--cu-seqlens-q` and `--cu-seqlens-k` (each `[batch + 1]` integers, from 0,
//! non-decreasing, ending at the token counts) the batch is packed: Q is `[total_q, heads_q, d]`
//! (or `[1, total_q, heads_q, d]`), K and V `[total_k, heads_kv, d]`, every sequence's tokens back
//! to back, and the packed (variable-length) kernel runs; O is written with Q's rank and the LSE
//! as `[heads_q, total_q]` (`[1, heads_q, total_q]` for 4-d inputs). With `--cu-seqlens-q` and
//! `--page-table` instead (chunked prefill), the packed queries run against the paged cache
//! through the split-KV kernel, `--seqlens-k` counting the new tokens. The offsets are checked
//! before the GPU is touched; a packed batch has no backward pass.
//!
//! Q is `[batch, seq_q, heads_q, d]`, K and V `[batch, seq_k, heads_kv, d]` (see `npy` for the
//! element types read; anything but the variant's own 16-bit type is rounded to it). Tensor
//! params are read from `.npy` files and converted to the declared element type; scalars are
//! given inline. O is written in the variant's dtype (bf16 as `'<V2'`, see `npy`) or as f32 with
//! `--out-dtype f32`; the LSE `[batch, heads_q, seq_q]` as f32.
//!
//! With `--do` (dO, the gradient of the loss with respect to O, shaped like O and rounded to the
//! variant's dtype like the inputs), the backward pass runs after the forward on its O and LSE:
//! dQ, dK and dV are written like O (`--out-dtype` applies), and each `--dparam` gradient of an
//! `f32` parameter the score depends on as f32 with the parameter's shape (`[1]` for a scalar).
//! Gradient flags without `--do`, and `--dparam` naming a parameter without a gradient, are
//! errors found before the GPU is touched.
//!
//! An fp8 variant (`dtype: e4m3`) takes the same float inputs: Q, K and V are rounded to bf16,
//! quantised on the GPU into e4m3 codes and scales grouped as the variant's `scales:` declares
//! (V transposed for the second product; with `--hadamard-seed N` Q and K rotated first by the
//! random Hadamard matrix of that seed, which leaves Q·Kᵀ unchanged), then the fp8 forward runs;
//! O is bf16. Packed batches, paged caches, split-KV and the backward do not exist for fp8 and
//! are errors before the GPU is touched.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use cudarc::driver::{CudaSlice, CudaStream, DriverError};
use flash_dsl::dropout::DropoutRng;
use flash_dsl::eval::{tensor_shape, Sizes};
use flash_dsl::plan::{backward_pipeline, default_backward_config, grad_params};
use flash_dsl::spec::{Dropout, ParamKind, ScalarTy};
use flash_dsl::{DType, VariantSpec};

use crate::error::FlashError;
use crate::launch::backward::{BackwardGrads, BackwardInputs, LseRef};
use crate::launch::{LseMut, Runtime, TensorMut, TensorRef};
use crate::npy::{NpyArray, NpyData};
use crate::variant::ParamArg;

use super::args::VariantArgs;

/// Arguments of `flash run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Which declaration of which file, with overrides.
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
    /// Element type of the written O (and dQ, dK, dV).
    #[arg(long, value_enum, default_value = "same")]
    pub(crate) out_dtype: OutDType,
    /// dO, the gradient of the loss with respect to O (shaped like O): runs the backward pass
    /// after the forward.
    #[arg(long = "do", value_name = "DO")]
    pub d_o: Option<PathBuf>,
    /// Where to write dQ (needs --do).
    #[arg(long)]
    pub dq: Option<PathBuf>,
    /// Where to write dK (needs --do).
    #[arg(long)]
    pub dk: Option<PathBuf>,
    /// Where to write dV (needs --do).
    #[arg(long)]
    pub dv: Option<PathBuf>,
    /// Where to write the gradient of an f32 parameter: `NAME=FILE.npy` (f32, the parameter's
    /// shape; repeatable; needs --do).
    #[arg(long = "dparam")]
    pub dparams: Vec<String>,
    /// Seed of the dropout generator (variants that declare `dropout`): the same seed and
    /// offset give the same mask in the forward and the backward, on every GPU.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Offset of the dropout generator (its sub-stream; advance it between training steps).
    #[arg(long)]
    pub offset: Option<u64>,
    /// Where to write the dropout keep mask of this launch, `[batch, heads_q, seq_q, seq_k]`
    /// uint8, 1 = kept: the generator the kernels use, evaluated on the host (the GPU check
    /// compares it with the masks the kernels apply, bit for bit).
    #[arg(long, value_name = "MASK.npy")]
    pub dropout_mask: Option<PathBuf>,
    /// Run the split-KV kernel with this many key splits (1 to 256). Without it, decode-sized
    /// launches take the split-KV kernel with the runtime's split count.
    #[arg(long)]
    pub splits: Option<usize>,
    /// A paged KV cache: the `[batch, max_pages]` page table (integers); `--k` and `--v` are then
    /// `[pages, page_size, heads_kv, d]` caches.
    #[arg(long, requires = "seqlens_k")]
    pub page_table: Option<PathBuf>,
    /// The cached keys of each sequence, `[batch]` (integers; with --page-table).
    #[arg(long, requires = "page_table")]
    pub seqlens_k: Option<PathBuf>,
    /// A packed batch: the `[batch + 1]` cumulative query offsets (integers); `--q` is then
    /// `[total_q, heads_q, d]` (or `[1, total_q, heads_q, d]`). With `--cu-seqlens-k` K and V
    /// are packed too; with `--page-table` they are a paged cache (chunked prefill).
    #[arg(long)]
    pub cu_seqlens_q: Option<PathBuf>,
    /// The `[batch + 1]` cumulative key offsets of a packed batch (with --cu-seqlens-q); `--k`
    /// and `--v` are then `[total_k, heads_kv, d]`.
    #[arg(long, requires = "cu_seqlens_q", conflicts_with = "page_table")]
    pub cu_seqlens_k: Option<PathBuf>,
    /// fp8 variants: rotate Q and K by the random Hadamard matrix with this seed before
    /// quantising them (incoherent processing; Q·Kᵀ is unchanged up to rounding).
    #[arg(long)]
    pub hadamard_seed: Option<u64>,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
}

/// `--cu-seqlens-q` and `--cu-seqlens-k` as read (no key offsets: the keys are a paged cache),
/// and whether Q was 3-d.
struct PackedInputs {
    cu_q: Vec<i32>,
    cu_k: Option<Vec<i32>>,
    rank3: bool,
}

/// `--cu-seqlens-q` / `--cu-seqlens-k`, read and checked against the packed Q and K (the flags
/// that do not apply to a packed batch are refused here, before the GPU is touched).
fn read_packed(
    a: &RunArgs,
    q: &NpyArray,
    k: &NpyArray,
) -> Result<Option<PackedInputs>, FlashError> {
    let Some(qp) = &a.cu_seqlens_q else {
        return Ok(None);
    };
    let paged = a.page_table.is_some();
    if a.cu_seqlens_k.is_none() && !paged {
        return Err(invalid(
            "--cu-seqlens-q needs --cu-seqlens-k (packed K and V) or --page-table (a paged cache: chunked prefill)",
        ));
    }
    for (flag, given) in [
        ("--do", a.d_o.is_some()),
        ("--splits", a.splits.is_some() && !paged),
        ("--dropout-mask", a.dropout_mask.is_some()),
    ] {
        if given {
            return Err(invalid(format!(
                "{flag} does not apply to a packed batch (--cu-seqlens-q; --splits only with a --page-table)"
            )));
        }
    }
    let read1 = |flag: &str, p: &PathBuf| -> Result<Vec<i32>, FlashError> {
        let arr = NpyArray::read(p)?;
        if arr.shape.len() != 1 {
            return Err(invalid(format!(
                "{flag} must be 1-d, [batch + 1]; got shape {:?}",
                arr.shape
            )));
        }
        arr.data.to_i32()
    };
    let cu_q = read1("--cu-seqlens-q", qp)?;
    let cu_k = match &a.cu_seqlens_k {
        Some(kp) => Some(read1("--cu-seqlens-k", kp)?),
        None => None,
    };
    let total = |name: &str, x: &NpyArray| -> Result<usize, FlashError> {
        match x.shape.as_slice() {
            [t, _, _] | [1, t, _, _] => Ok(*t),
            s => Err(invalid(format!(
                "--{name} of a packed batch must be [total, heads, head_dim] (or [1, total, heads, head_dim]); got shape {s:?}"
            ))),
        }
    };
    let tq = total("q", q)?;
    flash_dsl::plan::varlen::check_cu_seqlens("--cu-seqlens-q", &cu_q, tq).map_err(invalid)?;
    if let Some(cu_k) = &cu_k {
        let tk = total("k", k)?;
        flash_dsl::plan::varlen::check_cu_seqlens("--cu-seqlens-k", cu_k, tk).map_err(invalid)?;
        if cu_q.len() != cu_k.len() {
            return Err(invalid(format!(
                "--cu-seqlens-q has {} entries and --cu-seqlens-k {}; both are batch + 1 long",
                cu_q.len(),
                cu_k.len()
            )));
        }
    }
    Ok(Some(PackedInputs {
        cu_q,
        cu_k,
        rank3: q.shape.len() == 3,
    }))
}

/// `--page-table` and `--seqlens-k` as read: (table, max_pages, lengths).
type PagedInputs = (Vec<i32>, usize, Vec<i32>);

/// `--page-table` and `--seqlens-k`, read and shape-checked.
fn read_paged(a: &RunArgs, batch: usize) -> Result<Option<PagedInputs>, FlashError> {
    let (Some(tp), Some(lp)) = (&a.page_table, &a.seqlens_k) else {
        return Ok(None);
    };
    if a.d_o.is_some() {
        return Err(invalid(
            "--page-table is for inference: the backward pass (--do) reads contiguous K and V",
        ));
    }
    let (t, l) = (NpyArray::read(tp)?, NpyArray::read(lp)?);
    if t.shape.len() != 2 || t.shape[0] != batch {
        return Err(invalid(format!(
            "--page-table must be [batch, max_pages] with batch {batch}; got shape {:?}",
            t.shape
        )));
    }
    if l.shape != [batch] {
        return Err(invalid(format!(
            "--seqlens-k must be [batch] = [{batch}]; got shape {:?}",
            l.shape
        )));
    }
    Ok(Some((t.data.to_i32()?, t.shape[1], l.data.to_i32()?)))
}

/// The dropout generator state of the launch: `--seed`/`--offset` (0 when left out) for a
/// variant with dropout; an error for one without, which would silently ignore them.
fn dropout_rng(a: &RunArgs, spec: &VariantSpec) -> Result<Option<DropoutRng>, FlashError> {
    let given = a.seed.is_some() || a.offset.is_some() || a.dropout_mask.is_some();
    match (spec.dropout.is_some(), given) {
        (true, _) => Ok(Some(DropoutRng {
            seed: a.seed.unwrap_or(0),
            offset: a.offset.unwrap_or(0),
        })),
        (false, true) => Err(invalid(format!(
            "--seed, --offset and --dropout-mask apply to variants with dropout; `{}` declares none",
            spec.name
        ))),
        (false, false) => Ok(None),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutDType {
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

/// A packed input as the launch takes it, `[1, total, heads, head_dim]` (3-d inputs get the
/// leading 1; `read_packed` checked the rank).
fn packed4(name: &str, a: &NpyArray) -> Result<[usize; 4], FlashError> {
    match a.shape.as_slice() {
        [t, h, d] => Ok([1, *t, *h, *d]),
        [1, t, h, d] => Ok([1, *t, *h, *d]),
        s => Err(invalid(format!(
            "--{name} of a packed batch must be [total, heads, head_dim] (or [1, total, heads, head_dim]); got shape {s:?}"
        ))),
    }
}

/// A parsed `--param`.
enum ParamValue {
    Scalar(String),
    File(NpyArray),
}

/// Maps a [`cudarc`] driver error to a [`FlashError`] naming what was being done.
fn drv(what: &'static str) -> impl Fn(DriverError) -> FlashError {
    move |e| FlashError::Driver(format!("{what}: {e:?}"))
}

/// Runs `flash run`.
pub fn cmd_run(a: &RunArgs) -> Result<ExitCode, FlashError> {
    // Everything read from disk is checked before the GPU is touched, so a bad path or a
    // misspelt param fails fast, without a context creation.
    let spec = single_spec(a)?;
    let (q, k, v) = (
        NpyArray::read(&a.q)?,
        NpyArray::read(&a.k)?,
        NpyArray::read(&a.v)?,
    );
    let packed = read_packed(a, &q, &k)?;
    let (qs, ks, vs) = match &packed {
        Some(p) if p.cu_k.is_some() => (packed4("q", &q)?, packed4("k", &k)?, packed4("v", &v)?),
        // Chunked prefill: packed queries, a paged cache.
        Some(_) => (packed4("q", &q)?, shape4("k", &k)?, shape4("v", &v)?),
        None => (shape4("q", &q)?, shape4("k", &k)?, shape4("v", &v)?),
    };
    let given = read_params(&a.params, &spec)?;
    let o_shape = [qs[0], qs[1], qs[2], spec.head_dim_v as usize];
    if spec.fp8.is_some() {
        return run_fp8(a, &spec, [&q, &k, &v], [qs, ks, vs], given, o_shape);
    }
    if a.hadamard_seed.is_some() {
        return Err(invalid(format!(
            "--hadamard-seed rotates the inputs of an fp8 variant before quantising them; `{}` is not one (it declares `dtype: {}`)",
            spec.name,
            spec.dtype.name()
        )));
    }
    let batch = packed.as_ref().map_or(qs[0], |p| p.cu_q.len() - 1);
    let paged = read_paged(a, batch)?;
    let longest = |cu: &[i32]| {
        cu.windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0)
    };
    let sizes = match &packed {
        // A packed batch: `seq` params span the longest sequence (or a paged cache's capacity).
        Some(p) => Sizes {
            batch,
            heads: qs[2],
            seq_q: longest(&p.cu_q),
            seq_k: match (&p.cu_k, &paged) {
                (Some(cu_k), _) => longest(cu_k),
                (None, Some((_, mp, _))) => mp * ks[1],
                (None, None) => unreachable!("read_packed wants key offsets or a page table"),
            },
        },
        None => Sizes {
            batch: qs[0],
            heads: qs[2],
            seq_q: qs[1],
            // A paged cache: `seq` params span its capacity (max_pages · page_size).
            seq_k: paged.as_ref().map_or(ks[1], |(_, mp, _)| mp * ks[1]),
        },
    };
    let bwd = read_backward(a, &spec, o_shape, sizes)?;
    let rng = dropout_rng(a, &spec)?;

    let rt = Runtime::new(a.gpu)?;
    let family = rt.info().default_family;
    let plan = a.variant.plan(&spec, family)?;
    let shape = crate::launch::ProblemShape {
        batch: qs[0],
        seq_q: qs[1],
        seq_k: ks[1],
        heads_q: qs[2],
        heads_kv: ks[2],
    };
    let split_kv = packed.is_none()
        && (paged.is_some()
            || a.splits.is_some()
            || (a.variant.tile.is_none() && rt.takes_split_kv(&spec, shape)));
    let kernel = if packed.is_some() && paged.is_some() {
        rt.load_paged_varlen(&spec, None)?
    } else if packed.is_some() {
        rt.load_varlen(&spec, Some(plan.config))?
    } else if paged.is_some() {
        rt.load_paged(&spec, None)?
    } else if split_kv {
        rt.load_split_kv(&spec, None)?
    } else {
        rt.load(&spec, Some(plan.config))?
    };
    let stream = rt.stream().clone();
    let up = |x: &NpyArray| -> Result<_, FlashError> {
        let bits = x.data.to_half_bits(spec.dtype);
        stream
            .clone_htod(&pad(bits))
            .map_err(|e| FlashError::Driver(format!("copying an input to the GPU: {e:?}")))
    };
    let (q_dev, k_dev, v_dev) = (up(&q)?, up(&k)?, up(&v)?);
    let (mut o, mut lse, n_o, n_lse) = alloc_outputs(&stream, o_shape)?;
    let params = DeviceParams::upload(&spec, given, &stream)?;
    let mut args = params.args(&stream);
    if let Some(r) = rng {
        args.push(ParamArg::Rng(r));
    }

    {
        let (tq, tk, tv) = (
            TensorRef::new(&q_dev, qs, &stream),
            TensorRef::new(&k_dev, ks, &stream),
            TensorRef::new(&v_dev, vs, &stream),
        );
        let mut to = TensorMut::new(&mut o, o_shape, &stream);
        let mut tl = LseMut::new(&mut lse, &stream);
        if let Some((p, cu_k)) = packed.as_ref().and_then(|p| Some((p, p.cu_k.as_ref()?))) {
            let dq = stream
                .clone_htod(&p.cu_q)
                .map_err(drv("copying cu_seqlens_q"))?;
            let dk = stream
                .clone_htod(cu_k)
                .map_err(drv("copying cu_seqlens_k"))?;
            let seqs = crate::launch::VarlenBatch {
                cu_seqlens_q: &dq,
                cu_seqlens_k: &dk,
                host_q: &p.cu_q,
                host_k: cu_k,
            };
            rt.forward_varlen(&kernel, &tq, &tk, &tv, &mut to, &mut tl, &seqs, &args)?;
        } else if let Some((table, max_pages, lens)) = &paged {
            let dt = stream
                .clone_htod(table)
                .map_err(drv("copying the page table"))?;
            let dl = stream
                .clone_htod(lens)
                .map_err(drv("copying the cached lengths"))?;
            let kv = crate::launch::PagedKv {
                k: tk,
                v: tv,
                page_table: &dt,
                max_pages: *max_pages,
                seqlens_k: &dl,
                host: Some((table, lens)),
            };
            match &packed {
                Some(p) => {
                    let dq = stream
                        .clone_htod(&p.cu_q)
                        .map_err(drv("copying cu_seqlens_q"))?;
                    let queries = crate::launch::PackedQueries {
                        cu_seqlens_q: &dq,
                        host: &p.cu_q,
                    };
                    rt.forward_paged_varlen(
                        &kernel, &tq, &queries, &kv, &mut to, &mut tl, &args, a.splits,
                    )?;
                }
                None => {
                    rt.forward_paged(&kernel, &tq, &kv, &mut to, &mut tl, &args, a.splits)?;
                }
            }
        } else if split_kv {
            rt.forward_split_kv(&kernel, &tq, &tk, &tv, &mut to, &mut tl, &args, a.splits)?;
        } else {
            rt.forward(&kernel, &tq, &tk, &tv, &mut to, &mut tl, &args)?;
        }
    }
    rt.synchronize()?;
    let (o_host, lse_host) = read_outputs(&stream, &o, &lse)?;
    let [batch, seq_q, heads_q, dv] = o_shape;
    let (o_dims, lse_dims) = match &packed {
        Some(p) if p.rank3 => (vec![seq_q, heads_q, dv], vec![heads_q, seq_q]),
        _ => (o_shape.to_vec(), vec![batch, heads_q, seq_q]),
    };
    write_outputs(
        a,
        spec.dtype,
        o_dims,
        lse_dims,
        &o_host[..n_o],
        &lse_host[..n_lse],
    )?;
    if let (Some(path), Some(r)) = (&a.dropout_mask, rng) {
        let p = match spec.dropout {
            Some(Dropout::Const(v)) => v.get() as f32,
            Some(Dropout::Param(i)) => match args[i] {
                ParamArg::F32(p) => p,
                _ => unreachable!("the launch checked the dropout probability"),
            },
            None => unreachable!("`rng` is set only for a variant with dropout"),
        };
        let [batch, seq_q, heads_q, _] = o_shape;
        let mask = r.mask(p, batch, heads_q, seq_q, sizes.seq_k);
        NpyArray::new(vec![batch, heads_q, seq_q, sizes.seq_k], NpyData::U8(mask))?.write(path)?;
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

    let Some(bwd) = bwd else {
        return Ok(ExitCode::SUCCESS);
    };
    let d_o = up(&bwd.d_o)?;
    let alloc_half =
        |n: usize, what: &'static str| stream.alloc_zeros::<u16>(n.max(8)).map_err(drv(what));
    let mut gq = alloc_half(qs.iter().product(), "allocating dQ")?;
    let mut gk = alloc_half(ks.iter().product(), "allocating dK")?;
    let mut gv = alloc_half(vs.iter().product(), "allocating dV")?;
    // One buffer per requested parameter gradient, by param index; the others are scratch
    // inside the backward pass.
    let mut gparams: Vec<Option<CudaSlice<f32>>> = Vec::with_capacity(spec.params.len());
    for i in 0..spec.params.len() {
        gparams.push(match bwd.dparams.iter().find(|d| d.index == i) {
            Some(d) => Some(
                stream
                    .alloc_zeros::<f32>(d.shape.iter().product::<usize>().max(1))
                    .map_err(drv("allocating a parameter gradient"))?,
            ),
            None => None,
        });
    }
    {
        let input = BackwardInputs {
            q: TensorRef::new(&q_dev, qs, &stream),
            k: TensorRef::new(&k_dev, ks, &stream),
            v: TensorRef::new(&v_dev, vs, &stream),
            o: TensorRef::new(&o, o_shape, &stream),
            d_o: TensorRef::new(&d_o, o_shape, &stream),
            lse: LseRef::new(&lse, &stream),
        };
        let mut grads = BackwardGrads {
            dq: TensorMut::new(&mut gq, qs, &stream),
            dk: TensorMut::new(&mut gk, ks, &stream),
            dv: TensorMut::new(&mut gv, vs, &stream),
            dparams: gparams.iter_mut().map(|g| g.as_mut()).collect(),
        };
        rt.backward_spec(&spec, None, &input, &args, &mut grads)?;
    }
    rt.synchronize()?;
    for (path, buf, shape) in [(&a.dq, &gq, qs), (&a.dk, &gk, ks), (&a.dv, &gv, vs)] {
        if let Some(path) = path {
            let host: Vec<u16> = stream
                .clone_dtoh(buf)
                .map_err(drv("copying a gradient back"))?;
            let n = shape.iter().product();
            write_half(path, a.out_dtype, spec.dtype, shape.to_vec(), &host[..n])?;
        }
    }
    for d in &bwd.dparams {
        let buf = gparams[d.index].as_ref().expect("allocated above");
        let host: Vec<f32> = stream
            .clone_dtoh(buf)
            .map_err(drv("copying a parameter gradient back"))?;
        let n: usize = d.shape.iter().product();
        NpyArray::new(d.shape.clone(), NpyData::F32(host[..n].to_vec()))?.write(&d.path)?;
    }
    eprintln!(
        "backward of {} on {}: wrote {}",
        spec.name,
        rt.info().name,
        [("dq", &a.dq), ("dk", &a.dk), ("dv", &a.dv)]
            .iter()
            .filter(|(_, p)| p.is_some())
            .map(|(n, _)| n.to_string())
            .chain(bwd.dparams.iter().map(|d| format!("d{}", d.name)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(ExitCode::SUCCESS)
}

/// `flash run` of an fp8 variant (see the module docs): the float inputs quantised on the GPU
/// as the variant declares, then the fp8 forward.
fn run_fp8(
    a: &RunArgs,
    spec: &VariantSpec,
    [q, k, v]: [&NpyArray; 3],
    [qs, ks, vs]: [[usize; 4]; 3],
    given: HashMap<String, ParamValue>,
    o_shape: [usize; 4],
) -> Result<ExitCode, FlashError> {
    use flash_dsl::plan::quantize::{QuantSpec, ScaleGroup};
    let fp8 = spec.fp8.expect("an fp8 variant");
    for (set, flag) in [
        (a.cu_seqlens_q.is_some(), "--cu-seqlens-q"),
        (a.page_table.is_some(), "--page-table"),
        (a.splits.is_some(), "--splits"),
        (a.d_o.is_some(), "--do"),
        (a.dropout_mask.is_some(), "--dropout-mask"),
    ] {
        if set {
            return Err(invalid(format!(
                "{flag} is not available for fp8 variants (`{}` declares `dtype: e4m3`): only the forward over contiguous Q, K, V exists",
                spec.name
            )));
        }
    }
    if ks[1] != vs[1] || ks[0] != vs[0] || ks[2] != vs[2] {
        return Err(invalid(format!(
            "v {vs:?} must have k's batch, length and heads {ks:?}"
        )));
    }
    let rt = Runtime::new(a.gpu)?;
    let plan = a.variant.plan(spec, rt.info().default_family)?;
    let kernel = rt.load(spec, Some(plan.config))?;
    let stream = rt.stream().clone();
    let up = |x: &NpyArray| -> Result<_, FlashError> {
        stream
            .clone_htod(&pad(x.data.to_half_bits(DType::Bf16)))
            .map_err(drv("copying an input to the GPU"))
    };
    let (q_dev, k_dev, v_dev) = (up(q)?, up(k)?, up(v)?);
    let block = flash_dsl::spec::FP8_SCALE_BLOCK as usize;
    let signs: Vec<f32> = flash_dsl::fp8::random_signs(qs[3], a.hadamard_seed.unwrap_or(0))
        .iter()
        .map(|&s| s as f32)
        .collect();
    let dsigns = stream
        .clone_htod(&signs)
        .map_err(drv("copying the signs"))?;
    // One quantisation: codes and scales of `x` (`shape`), rotated and/or transposed, its
    // scales grouped as `scaling` (Q's and K's `scales:`, V's `v_scales:`).
    let quantise = |x: &CudaSlice<u16>,
                    shape: [usize; 4],
                    rotate: bool,
                    transpose: bool,
                    format: flash_dsl::fp8::Fp8Format,
                    scaling: flash_dsl::fp8::Scaling|
     -> Result<(CudaSlice<u8>, CudaSlice<f32>), FlashError> {
        let [b, s, h, d] = shape;
        let group = ScaleGroup::of(scaling);
        let blocks = s.div_ceil(block);
        let n_codes = if transpose {
            b * h * d * blocks * block
        } else {
            b * s * h * d
        };
        let n_scales: usize = scaling.scale_shape(shape).iter().product();
        let mut codes = stream
            .alloc_zeros::<u8>(n_codes.max(8))
            .map_err(drv("allocating fp8 codes"))?;
        let mut scales = stream
            .alloc_zeros::<f32>(n_scales.max(1))
            .map_err(drv("allocating fp8 scales"))?;
        let qspec = QuantSpec {
            hadamard: rotate,
            transpose,
            group,
            ..QuantSpec::new(DType::Bf16, d as u32, format, block as u32)
        };
        let qk = rt.load_quantize(&qspec)?;
        rt.quantize(
            &qk,
            &TensorRef::new(x, shape, &stream),
            rotate.then_some(&dsigns),
            &mut codes,
            &mut scales,
        )?;
        Ok((codes, scales))
    };
    let rotate = a.hadamard_seed.is_some();
    // Q and K in the variant's Q/K codes (int8 with `qk: int8`), V in its fp8 format —
    // transposed, or in rows for `v_layout: rows` — or the bf16 input itself with `v: bf16`.
    let (cq, sq) = quantise(&q_dev, qs, rotate, false, fp8.qk_format, fp8.scaling)?;
    let (ck, sk) = quantise(&k_dev, ks, rotate, false, fp8.qk_format, fp8.scaling)?;
    let v_codes = if fp8.v_bf16 {
        None
    } else {
        Some(quantise(
            &v_dev,
            vs,
            false,
            !fp8.v_rows,
            fp8.format,
            fp8.v_scaling(),
        )?)
    };
    let (mut o, mut lse, n_o, n_lse) = alloc_outputs(&stream, o_shape)?;
    let params = DeviceParams::upload(spec, given, &stream)?;
    let args = params.args(&stream);
    {
        let inputs = crate::launch::Fp8Inputs {
            q: TensorRef::new(&cq, qs, &stream),
            q_scale: &sq,
            k: TensorRef::new(&ck, ks, &stream),
            k_scale: &sk,
            v: match &v_codes {
                Some((cv, sv)) if fp8.v_rows => crate::launch::Fp8V::Rows {
                    v: TensorRef::new(cv, vs, &stream),
                    v_scale: sv,
                },
                Some((cv, sv)) => crate::launch::Fp8V::Codes {
                    v_t: cv,
                    v_scale: sv,
                },
                None => crate::launch::Fp8V::Bf16(TensorRef::new(&v_dev, vs, &stream)),
            },
        };
        let mut to = TensorMut::new(&mut o, o_shape, &stream);
        let mut tl = LseMut::new(&mut lse, &stream);
        rt.forward_fp8(&kernel, &inputs, &mut to, &mut tl, &args)?;
    }
    rt.synchronize()?;
    let (o_host, lse_host) = read_outputs(&stream, &o, &lse)?;
    write_outputs(
        a,
        spec.dtype,
        o_shape.to_vec(),
        vec![qs[0], qs[2], qs[1]],
        &o_host[..n_o],
        &lse_host[..n_lse],
    )?;
    eprintln!(
        "ran {} ({}, inputs quantised on the GPU{}) on {}: q {:?}, k {:?}",
        spec.name,
        kernel.plan.kernel_name,
        if rotate { ", Q and K rotated" } else { "" },
        rt.info().name,
        qs,
        ks
    );
    Ok(ExitCode::SUCCESS)
}

/// What `--do` asks for, read and checked before the GPU is touched.
struct BackwardRequest {
    d_o: NpyArray,
    dparams: Vec<DParam>,
}

/// One `--dparam NAME=FILE.npy`.
struct DParam {
    name: String,
    index: usize,
    /// The parameter's shape (`[1]` for a scalar).
    shape: Vec<usize>,
    path: PathBuf,
}

/// Checks the gradient flags: none without `--do`; with it, dO shaped like O, at least one
/// gradient to write, each `--dparam` an `f32` parameter the score depends on (once), and a
/// backward pass the planner supports for this spec.
fn read_backward(
    a: &RunArgs,
    spec: &VariantSpec,
    o_shape: [usize; 4],
    sizes: Sizes,
) -> Result<Option<BackwardRequest>, FlashError> {
    let mut wanted: Vec<&str> = [("--dq", &a.dq), ("--dk", &a.dk), ("--dv", &a.dv)]
        .iter()
        .filter(|(_, p)| p.is_some())
        .map(|(n, _)| *n)
        .collect();
    if !a.dparams.is_empty() {
        wanted.push("--dparam");
    }
    let Some(d_o_path) = &a.d_o else {
        if wanted.is_empty() {
            return Ok(None);
        }
        return Err(invalid(format!(
            "{} {} --do dO.npy: gradients come from the backward pass, which starts from dO, \
             the gradient of the loss with respect to O",
            wanted.join(", "),
            if wanted.len() == 1 { "needs" } else { "need" }
        )));
    };
    if wanted.is_empty() {
        return Err(invalid(
            "--do runs the backward pass, but no gradient is asked for: pass --dq, --dk, --dv \
             or --dparam NAME=FILE.npy",
        ));
    }
    backward_pipeline(spec, default_backward_config())
        .map_err(|e| FlashError::plan(&spec.name, format!("no backward pass: {e}")))?;
    let mut dparams: Vec<DParam> = Vec::new();
    for p in &a.dparams {
        let (name, file) = p
            .split_once('=')
            .ok_or_else(|| invalid(format!("--dparam takes NAME=FILE.npy; got `{p}`")))?;
        let index = spec.param_index(name).ok_or_else(|| {
            invalid(format!(
                "--dparam: `{}` has no param `{name}`; it declares: {}",
                spec.name,
                declared(spec)
            ))
        })?;
        let shape = match &spec.params[index].kind {
            ParamKind::Scalar(ScalarTy::F32) => vec![1],
            ParamKind::Tensor {
                elem: ScalarTy::F32,
                dims,
            } => tensor_shape(dims, sizes),
            ParamKind::Scalar(t) => {
                return Err(invalid(format!(
                    "--dparam: param `{name}` is an {} scalar; only f32 params have gradients",
                    t.name()
                )))
            }
            ParamKind::Tensor { elem, .. } => {
                return Err(invalid(format!(
                    "--dparam: param `{name}` is an {} tensor; only f32 params have gradients",
                    elem.name()
                )))
            }
        };
        if !grad_params(spec).contains(&index) {
            return Err(invalid(format!(
                "--dparam: the score of `{}` does not depend on `{name}`; it has no gradient",
                spec.name
            )));
        }
        if dparams.iter().any(|d| d.index == index) {
            return Err(invalid(format!("--dparam: `{name}` is given twice")));
        }
        if file.is_empty() {
            return Err(invalid(format!(
                "--dparam takes NAME=FILE.npy; got no file for `{name}`"
            )));
        }
        dparams.push(DParam {
            name: name.to_string(),
            index,
            shape,
            path: PathBuf::from(file),
        });
    }
    let d_o = NpyArray::read(d_o_path)?;
    let got = shape4("do", &d_o)?;
    if got != o_shape {
        return Err(invalid(format!(
            "--do must have O's shape {o_shape:?} ([batch, seq_q, heads_q, head_dim_v]); got {got:?}"
        )));
    }
    Ok(Some(BackwardRequest { d_o, dparams }))
}

/// The declared param names, for error messages.
fn declared(spec: &VariantSpec) -> String {
    if spec.params.is_empty() {
        return "no params".to_string();
    }
    spec.params
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The one declaration `flash run` runs: `--name` narrows a multi-variant file, and running
/// several at once would need several sets of inputs, so more than one is an error listing
/// them.
fn single_spec(a: &RunArgs) -> Result<VariantSpec, FlashError> {
    let specs = a.variant.load()?;
    match specs.as_slice() {
        [s] => Ok(s.clone()),
        _ => Err(invalid(format!(
            "{} declares {} variants ({}); pick one with --name",
            a.variant.file.display(),
            specs.len(),
            specs
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Parses the `--param` flags (reading `.npy` files) and rejects names the variant does not
/// declare; whether each value fits its declaration is checked on upload, in declaration order.
fn read_params(
    params: &[String],
    spec: &VariantSpec,
) -> Result<HashMap<String, ParamValue>, FlashError> {
    let mut given = HashMap::new();
    for p in params {
        let (name, value) = p.split_once('=').ok_or_else(|| {
            invalid(format!(
                "--param takes NAME=VALUE or NAME=FILE.npy; got `{p}`"
            ))
        })?;
        if spec.param_index(name).is_none() {
            return Err(invalid(format!(
                "`{}` has no param `{name}`; it declares: {}",
                spec.name,
                declared(spec)
            )));
        }
        let v = if value.ends_with(".npy") {
            ParamValue::File(NpyArray::read(std::path::Path::new(value))?)
        } else {
            ParamValue::Scalar(value.to_string())
        };
        given.insert(name.to_string(), v);
    }
    Ok(given)
}

/// One declared param, ready to become a [`ParamArg`].
enum Slot {
    I32(i32),
    F32(f32),
    /// Index into the buffers, and the element count the user gave.
    TI(usize, usize),
    TF(usize, usize),
}

/// The params on the device: tensor buffers live here until the launch has finished, since
/// the [`ParamArg`]s handed to the launch borrow them.
struct DeviceParams {
    bufs_i32: Vec<CudaSlice<i32>>,
    bufs_f32: Vec<CudaSlice<f32>>,
    /// One per declared param, in declaration order.
    slots: Vec<Slot>,
}

impl DeviceParams {
    /// Checks every declared param was given with a value of its kind, converts it to the
    /// declared element type and copies tensors to the GPU.
    fn upload(
        spec: &VariantSpec,
        mut given: HashMap<String, ParamValue>,
        stream: &Arc<CudaStream>,
    ) -> Result<Self, FlashError> {
        let mut dp = DeviceParams {
            bufs_i32: Vec::new(),
            bufs_f32: Vec::new(),
            slots: Vec::new(),
        };
        for decl in &spec.params {
            let v = given.remove(&decl.name).ok_or_else(|| {
                invalid(format!(
                    "param `{}` is missing: pass --param {}=...",
                    decl.name, decl.name
                ))
            })?;
            let slot = dp.slot(&decl.name, &decl.kind, v, stream)?;
            dp.slots.push(slot);
        }
        Ok(dp)
    }

    /// One param's slot (uploading its tensor, if it is one); errors name the param.
    fn slot(
        &mut self,
        name: &str,
        kind: &ParamKind,
        v: ParamValue,
        stream: &Arc<CudaStream>,
    ) -> Result<Slot, FlashError> {
        Ok(match (kind, v) {
            (ParamKind::Scalar(ScalarTy::I32), ParamValue::Scalar(s)) => Slot::I32(
                s.parse()
                    .map_err(|_| invalid(format!("param `{name}` is an i32; got `{s}`")))?,
            ),
            (ParamKind::Scalar(ScalarTy::F32), ParamValue::Scalar(s)) => Slot::F32(
                s.parse()
                    .map_err(|_| invalid(format!("param `{name}` is an f32; got `{s}`")))?,
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
                    .map_err(|e| invalid(format!("param `{name}`: {e}")))?;
                let n = data.len();
                self.bufs_i32.push(
                    stream
                        .clone_htod(&pad(data))
                        .map_err(drv("copying a param to the GPU"))?,
                );
                Slot::TI(self.bufs_i32.len() - 1, n)
            }
            (
                ParamKind::Tensor {
                    elem: ScalarTy::F32,
                    ..
                },
                ParamValue::File(arr),
            ) => {
                let n = arr.data.len();
                self.bufs_f32.push(
                    stream
                        .clone_htod(&pad(arr.data.to_f32()))
                        .map_err(drv("copying a param to the GPU"))?,
                );
                Slot::TF(self.bufs_f32.len() - 1, n)
            }
            (ParamKind::Tensor { .. }, ParamValue::Scalar(s)) => {
                return Err(invalid(format!(
                    "param `{name}` is a tensor: pass --param {name}=FILE.npy; got `{s}`"
                )))
            }
            (ParamKind::Scalar(_), ParamValue::File(_)) => {
                return Err(invalid(format!(
                    "param `{name}` is a scalar: pass --param {name}=VALUE"
                )))
            }
        })
    }

    /// The launch arguments, in declaration order. Tensors report the user's element count,
    /// not the padded buffer's, so the launch checks see the logical length.
    fn args(&self, stream: &CudaStream) -> Vec<ParamArg<'_>> {
        self.slots
            .iter()
            .map(|s| match s {
                Slot::I32(x) => ParamArg::I32(*x),
                Slot::F32(x) => ParamArg::F32(*x),
                Slot::TI(i, len) => {
                    with_len(ParamArg::tensor_i32(&self.bufs_i32[*i], stream), *len)
                }
                Slot::TF(i, len) => {
                    with_len(ParamArg::tensor_f32(&self.bufs_f32[*i], stream), *len)
                }
            })
            .collect()
    }
}

/// `p` with the element count `len` (a tensor's logical length; scalars pass through).
fn with_len(mut p: ParamArg<'_>, len: usize) -> ParamArg<'_> {
    if let ParamArg::Tensor { len: l, .. } = &mut p {
        *l = len;
    }
    p
}

/// O (`o_shape`, 16-bit elements) and the LSE (`[batch, heads_q, seq_q]` f32) of a launch on
/// `stream`, never empty, and their logical lengths.
fn alloc_outputs(
    stream: &Arc<CudaStream>,
    o_shape: [usize; 4],
) -> Result<(CudaSlice<u16>, CudaSlice<f32>, usize, usize), FlashError> {
    let n_o: usize = o_shape.iter().product();
    let n_lse = o_shape[0] * o_shape[2] * o_shape[1];
    let o = stream
        .alloc_zeros::<u16>(n_o.max(8))
        .map_err(drv("allocating O"))?;
    let lse = stream
        .alloc_zeros::<f32>(n_lse.max(1))
        .map_err(drv("allocating the LSE"))?;
    Ok((o, lse, n_o, n_lse))
}

/// O and the LSE copied back to the host (after the launch's stream synchronised).
fn read_outputs(
    stream: &Arc<CudaStream>,
    o: &CudaSlice<u16>,
    lse: &CudaSlice<f32>,
) -> Result<(Vec<u16>, Vec<f32>), FlashError> {
    Ok((
        stream.clone_dtoh(o).map_err(drv("copying O back"))?,
        stream
            .clone_dtoh(lse)
            .map_err(drv("copying the LSE back"))?,
    ))
}

/// Writes O (in the variant's dtype, or f32 with `--out-dtype f32`) and, with `--lse`, the LSE
/// as `[batch, heads_q, seq_q]` f32.
fn write_outputs(
    a: &RunArgs,
    dtype: DType,
    o_dims: Vec<usize>,
    lse_dims: Vec<usize>,
    o_host: &[u16],
    lse_host: &[f32],
) -> Result<(), FlashError> {
    write_half(&a.out, a.out_dtype, dtype, o_dims, o_host)?;
    if let Some(p) = &a.lse {
        NpyArray::new(lse_dims, NpyData::F32(lse_host.to_vec()))?.write(p)?;
    }
    Ok(())
}

/// Writes a tensor held as `dtype` bits: as is (`--out-dtype same`) or widened to f32.
fn write_half(
    path: &std::path::Path,
    out: OutDType,
    dtype: DType,
    shape: Vec<usize>,
    bits: &[u16],
) -> Result<(), FlashError> {
    let bits = bits.to_vec();
    let data = match (out, dtype) {
        (OutDType::Same, DType::Bf16) => NpyData::Bf16(bits),
        (OutDType::Same, DType::F16) => NpyData::F16(bits),
        (OutDType::F32, dtype) => {
            NpyData::F32(bits.iter().map(|&b| dtype.from_bits(b) as f32).collect())
        }
    };
    NpyArray::new(shape, data)?.write(path)
}

/// Never allocates zero elements (the driver refuses empty allocations); the launch checks use
/// the logical lengths, not the padded ones.
fn pad<T: Default + Clone>(mut v: Vec<T>) -> Vec<T> {
    if v.len() < 8 {
        v.resize(8, T::default());
    }
    v
}
