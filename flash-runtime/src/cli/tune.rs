//! `flash tune`: autotune the tile configuration of a variant for one shape on the GPU.
//!
//! ```text
//! flash tune FILE --shape B,Hq,Hkv,Sq,Sk [--name V] [--head-dim D] [--dtype bf16|f16]
//!            [--family sm80|sm90] [--param NAME=VALUE|NAME=FILE.npy ...] [--gpu N]
//!            [--cache-dir DIR] [--all] [--json RESULTS.json [--rounds R]]
//! ```
//!
//! Prints a progress line on stderr (compiled / pruned / timed), then the table of candidates
//! (configuration, registers, spills, ms, TFLOP/s, status) and the winner, and writes the
//! tuning record beside the kernel cache (see [`crate::tune`]). Params not given get plausible
//! random values ([`crate::tune::default_params`]). With `--json`, the default and the winner
//! are re-timed alternately (`--rounds`) and two rows in the results format are appended to the
//! JSON array at that path (created if missing).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use flash_dsl::eval::ParamValue;
use flash_dsl::plan::KernelFamily;
use flash_dsl::spec::{ParamKind, ScalarTy};
use flash_dsl::VariantSpec;

use crate::cache::KernelCache;
use crate::error::FlashError;
use crate::launch::{ProblemShape, Runtime};
use crate::npy::NpyArray;
use crate::tune::{config_label, Progress, Status, TuneKnobs, TuneReport, CONTEXT_LOST};

use super::args::{CacheDirArg, VariantArgs};

/// Arguments of `flash tune`.
#[derive(Debug, Args)]
pub struct TuneArgs {
    /// Which declarations of which file, with overrides.
    #[command(flatten)]
    pub variant: VariantArgs,
    /// Problem shape: `BATCH,HEADS_Q,HEADS_KV,SEQ_Q,SEQ_K`.
    #[arg(long, value_parser = parse_shape)]
    pub shape: ShapeArg,
    /// A parameter: `NAME=VALUE` for scalars, `NAME=FILE.npy` for tensors (repeatable).
    #[arg(long = "param")]
    pub params: Vec<String>,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// The kernel cache folder (tuning records live in its `tune/` subfolder).
    #[command(flatten)]
    pub cache: CacheDirArg,
    /// Also list the configurations the MMA layout rules out.
    #[arg(long)]
    pub all: bool,
    /// Append `flash_default` and `flash_tuned` rows (results format) to this JSON array.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Alternating re-timing rounds of default vs winner for `--json`.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Leave out a configuration (`BMxBNxWxS/sm80`, as the table prints it; repeatable). A
    /// candidate that kills the CUDA context is excluded this way automatically: the command
    /// starts itself again without it (at most 4 times).
    #[arg(long)]
    pub exclude: Vec<String>,
    /// Keep the default unless the fastest candidate beats it by more than this fraction.
    #[arg(long, default_value_t = 0.02)]
    pub min_gain: f64,
    /// Tune the backward pass's main kernel instead of the forward kernel (its own records).
    #[arg(long)]
    pub backward: bool,
}

/// A `--shape`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShapeArg(pub ProblemShape);

pub(crate) fn parse_shape(s: &str) -> Result<ShapeArg, String> {
    let v: Vec<usize> = s
        .split(',')
        .map(|p| {
            p.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{p}` is not a number"))
        })
        .collect::<Result<_, _>>()?;
    let [batch, heads_q, heads_kv, seq_q, seq_k] = v[..] else {
        return Err(format!(
            "a shape is BATCH,HEADS_Q,HEADS_KV,SEQ_Q,SEQ_K (e.g. 4,16,16,4096,4096); got `{s}`"
        ));
    };
    if heads_kv == 0 || heads_q % heads_kv != 0 || batch == 0 || seq_q == 0 || seq_k == 0 {
        return Err(format!(
            "batch, sequence lengths and heads must be positive and heads_q a multiple of heads_kv; got `{s}`"
        ));
    }
    Ok(ShapeArg(ProblemShape {
        batch,
        seq_q,
        seq_k,
        heads_q,
        heads_kv,
    }))
}

fn invalid(msg: impl Into<String>) -> FlashError {
    FlashError::Invalid(msg.into())
}

/// Parses `--param`s against the spec.
fn given_params(
    spec: &VariantSpec,
    raw: &[String],
) -> Result<Vec<(String, ParamValue)>, FlashError> {
    let mut out = Vec::new();
    for p in raw {
        let (name, value) = p
            .split_once('=')
            .ok_or_else(|| invalid(format!("--param takes NAME=VALUE; got `{p}`")))?;
        let decl = spec
            .params
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| invalid(format!("`{}` has no param `{name}`", spec.name)))?;
        let v = match &decl.kind {
            ParamKind::Scalar(ScalarTy::I32) => ParamValue::Int(
                value
                    .parse()
                    .map_err(|_| invalid(format!("param `{name}` is an i32; got `{value}`")))?,
            ),
            ParamKind::Scalar(ScalarTy::F32) => ParamValue::Float(
                value
                    .parse()
                    .map_err(|_| invalid(format!("param `{name}` is an f32; got `{value}`")))?,
            ),
            ParamKind::Tensor { elem, .. } => {
                let a = NpyArray::read(std::path::Path::new(value))?;
                match elem {
                    ScalarTy::I32 => {
                        ParamValue::IntTensor(a.data.to_i32()?.into_iter().map(i64::from).collect())
                    }
                    ScalarTy::F32 => ParamValue::FloatTensor(a.data.to_f64()),
                }
            }
        };
        out.push((name.to_string(), v));
    }
    Ok(out)
}

/// A `\r` progress line on stderr.
struct Bar {
    compiled: (usize, usize),
    pruned: usize,
    timed: (usize, usize),
}

impl Bar {
    fn update(&mut self, p: &Progress) {
        match p {
            Progress::Compiled { done, total } => self.compiled = (*done, *total),
            Progress::Pruned { .. } => self.pruned += 1,
            Progress::Timed { done, total } => self.timed = (*done, *total),
        }
        let mut e = std::io::stderr().lock();
        let _ = write!(
            e,
            "\r  compiled {}/{}  pruned {}  timed {}/{}   ",
            self.compiled.0, self.compiled.1, self.pruned, self.timed.0, self.timed.1
        );
        let _ = e.flush();
    }
}

/// Runs `flash tune`.
/// `flash tune --backward`: every candidate's spot check and time, the winner, the record.
fn tune_backward(
    rt: &Runtime,
    specs: &[VariantSpec],
    a: &TuneArgs,
    shape: ProblemShape,
) -> Result<ExitCode, FlashError> {
    for spec in specs {
        let given = given_params(spec, &a.params)?;
        let r = rt.tune_backward(spec, shape, &given, a.min_gain)?;
        println!(
            "{} backward at {:?}:",
            spec.name,
            r.record.shape.unwrap_or_default()
        );
        for (cfg, res) in &r.candidates {
            match res {
                Ok(ms) => println!("  {:<22} {ms:9.3} ms", config_label(cfg)),
                Err(e) => println!("  {:<22} dropped: {e}", config_label(cfg)),
            }
        }
        println!(
            "  winner {} ({:.3} ms; default {:.3} ms), record {}",
            config_label(&r.record.config),
            r.record.ms,
            r.record.default_ms,
            r.record_path
                .as_ref()
                .map_or("not written (memory-only cache)".to_string(), |p| p
                    .display()
                    .to_string())
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The inputs' type in the tuner's lines and rows: the codes' format for an fp8 variant (whose
/// `dtype` is its bf16 output), else the dtype.
fn dtype_label(spec: &flash_dsl::VariantSpec) -> String {
    match spec.fp8 {
        Some(f) => f.tag(),
        None => spec.dtype.name().to_string(),
    }
}

pub(crate) fn cmd_tune(a: &TuneArgs) -> Result<ExitCode, FlashError> {
    // An fp8 variant is tuned from codes and scales the timer quantises on the host (its key
    // tiles of 128 or 192, two or three stages); it has no backward kernel, so with `--backward`
    // fp8 variants are skipped with a note, and a selection of fp8 variants alone is refused,
    // before the GPU.
    let (fp8, specs): (Vec<_>, Vec<_>) = a
        .variant
        .load()?
        .into_iter()
        .partition(|s| a.backward && s.fp8.is_some());
    let why = |name: &str| {
        format!(
            "`flash tune --backward` has nothing to time for `{name}`: an fp8 (`dtype: e4m3`) variant has only the forward kernel"
        )
    };
    if specs.is_empty() {
        if let Some(s) = fp8.first() {
            return Err(FlashError::Invalid(why(&s.name)));
        }
    }
    for s in &fp8 {
        eprintln!("skipping {}", why(&s.name));
    }
    let rt = Runtime::with_cache(a.gpu, KernelCache::new(a.cache.cache_dir.clone()))?;
    let knobs = TuneKnobs {
        family: a.variant.family.map(KernelFamily::from),
        exclude: a.exclude.clone(),
        min_gain: a.min_gain,
    };
    let shape = a.shape.0;
    if a.backward {
        return tune_backward(&rt, &specs, a, shape);
    }
    for spec in &specs {
        let given = given_params(spec, &a.params)?;
        eprintln!(
            "tuning {} (d {}x{}, {}) for shape {:?} on {} ({})",
            spec.name,
            spec.head_dim_qk,
            spec.head_dim_v,
            dtype_label(spec),
            [
                shape.batch,
                shape.heads_q,
                shape.heads_kv,
                shape.seq_q,
                shape.seq_k
            ],
            rt.info().name,
            rt.info().arch
        );
        let mut bar = Bar {
            compiled: (0, 0),
            pruned: 0,
            timed: (0, 0),
        };
        let report = rt.tune(spec, shape, &given, &knobs, &mut |p| bar.update(p));
        eprintln!();
        let report = match report {
            Ok(r) => r,
            Err(e) => return retry_without_culprit(a, spec, e),
        };
        print_table(&report, a.all);
        let back = rt.load_tuned(spec, &shape)?;
        println!(
            "load_tuned for this shape -> {}",
            config_label(&back.plan.config)
        );
        if let Some(path) = &a.json {
            let (d_ms, t_ms) = rt.compare_configs(
                spec,
                shape,
                &given,
                report.result.default,
                report.result.winner,
                a.rounds,
                20,
            )?;
            println!(
                "re-timed ({} rounds): default {d_ms:.3} ms, tuned {t_ms:.3} ms, speedup {:.3}x",
                a.rounds,
                d_ms / t_ms
            );
            append_rows(path, &rt, spec, &shape, &report, d_ms, t_ms)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// After a candidate killed the CUDA context (which no process can recover), runs this command
/// again in a fresh process without that candidate (this declaration only).
fn retry_without_culprit(
    a: &TuneArgs,
    spec: &VariantSpec,
    e: FlashError,
) -> Result<ExitCode, FlashError> {
    let msg = e.to_string();
    let Some(rest) = msg.split(CONTEXT_LOST).nth(1) else {
        return Err(e);
    };
    let label = rest.split(':').next().unwrap_or("").to_string();
    if label.is_empty() || a.exclude.len() >= 4 || a.exclude.contains(&label) {
        return Err(e);
    }
    eprintln!("{msg}\nretrying in a fresh process without {label}");
    let exe = std::env::current_exe().map_err(|e| FlashError::io("locating", "flash", e))?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.extend(["--exclude".to_string(), label]);
    if a.variant.name.is_none() {
        args.extend(["--name".to_string(), spec.name.clone()]);
    }
    let status = std::process::Command::new(exe)
        .args(&args)
        .status()
        .map_err(|e| FlashError::io("starting", "flash", e))?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_table(r: &TuneReport, all: bool) {
    let res = &r.result;
    println!(
        "{:<18} {:>5} {:>11} {:>9} {:>8}  status",
        "config", "regs", "spill st/ld", "ms", "TFLOP/s"
    );
    let mut hidden = 0;
    for c in &res.candidates {
        if !all && matches!(&c.status, Status::Pruned(w) if w.starts_with("layout")) {
            hidden += 1;
            continue;
        }
        let (regs, spill) = match c.resources {
            Some(r) => (
                r.registers.to_string(),
                format!("{}/{}", r.spill_stores, r.spill_loads),
            ),
            None => ("-".into(), "-".into()),
        };
        let mark = if c.config == res.default {
            " (default)"
        } else {
            ""
        };
        println!(
            "{:<18} {:>5} {:>11} {:>9} {:>8}  {}{mark}",
            config_label(&c.config),
            regs,
            spill,
            c.ms.map(|m| format!("{m:.3}"))
                .unwrap_or_else(|| "-".into()),
            c.tflops
                .map(|t| format!("{t:.1}"))
                .unwrap_or_else(|| "-".into()),
            c.status.short()
        );
    }
    if hidden > 0 {
        println!("({hidden} configurations the MMA layout rules out not shown; --all lists them)");
    }
    println!(
        "winner {} {:.3} ms; default {} {}; {} candidates, {} timed, {:.1} s",
        config_label(&res.winner),
        res.winner_ms,
        config_label(&res.default),
        res.default_ms
            .map(|m| format!("{m:.3} ms ({:.3}x)", m / res.winner_ms))
            .unwrap_or_else(|| "not timed".into()),
        res.candidates.len(),
        res.count(|s| matches!(s, Status::Ok | Status::Winner | Status::Wrong(_))),
        res.tune_s
    );
    match &r.record_path {
        Some(p) => println!("record {}", p.display()),
        None => println!("record not written (memory-only cache)"),
    }
}

/// Appends two rows in the results format to the JSON array at `path`.
fn append_rows(
    path: &std::path::Path,
    rt: &Runtime,
    spec: &VariantSpec,
    shape: &ProblemShape,
    report: &TuneReport,
    default_ms: f64,
    tuned_ms: f64,
) -> Result<(), FlashError> {
    let mut rows: Vec<serde_json::Value> = match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map_err(|e| invalid(format!("{} is not a JSON array: {e}", path.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(FlashError::io("reading", path, e)),
    };
    let res = &report.result;
    for (backend, cfg, ms, tune_s) in [
        ("flash_default", res.default, default_ms, 0.0),
        ("flash_tuned", res.winner, tuned_ms, res.tune_s),
    ] {
        rows.push(serde_json::json!({
            "gpu": rt.info().name,
            "backend": backend,
            "variant": spec.name,
            "dtype": dtype_label(spec),
            "d": spec.head_dim_qk,
            "n": shape.seq_q,
            "b": shape.batch,
            "h": shape.heads_q,
            "causal": spec.mask.is_some(),
            "mode": "fwd",
            "ms": ms,
            "tflops": report.flops / (ms * 1e-3) / 1e12,
            "config": config_label(&cfg),
            "tune_s": tune_s,
        }));
    }
    let bytes = serde_json::to_vec_pretty(&rows)
        .map_err(|e| invalid(format!("serialising results: {e}")))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes).map_err(|e| FlashError::io("writing", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| FlashError::io("renaming", &tmp, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_syntax() {
        let s = parse_shape("4,16,2,4096,2048").unwrap().0;
        assert_eq!(
            (s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_k),
            (4, 16, 2, 4096, 2048)
        );
        assert!(parse_shape("4,16,3,4096,4096").is_err());
        assert!(parse_shape("4,16,4096").is_err());
        assert!(parse_shape("4,x,1,1,1").is_err());
    }
}
