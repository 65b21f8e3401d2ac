//! `flash gen` (the generated CUDA) and `flash plan` (the kernel plan; without `--json`, followed
//! by the symbolic derivative of the score and the backward pass's kernels).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use flash_dsl::deriv::{display, score_gradient};
use flash_dsl::plan::{backward_pipeline, default_backward_config_for, KernelFamily};
use flash_dsl::spec::Expr;
use flash_dsl::{CudaSource, VariantSpec};

use crate::error::FlashError;

use super::args::VariantArgs;

/// Arguments of `flash gen`.
#[derive(Debug, Args)]
pub struct GenArgs {
    /// Which declarations of which file, with overrides.
    #[command(flatten)]
    pub variant: VariantArgs,
    /// Write `<kernel>.cu` and its headers into this folder instead of printing.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Arguments of `flash plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Which declarations of which file, with overrides.
    #[command(flatten)]
    pub variant: VariantArgs,
    /// JSON Lines (the plan only, one JSON object per line and declaration, as `compile
    /// --json`) instead of Rust debug output followed by the score's derivative and the
    /// backward kernels.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn cmd_gen(a: &GenArgs) -> Result<ExitCode, FlashError> {
    let out = std::io::stdout();
    let mut out = out.lock();
    // Kernel names are unique per file (validation rejects names differing only by case);
    // this keeps a later kernel of the same run from silently replacing an earlier file.
    let mut written = std::collections::HashSet::new();
    for (_, _, src) in a.variant.generate(KernelFamily::Sm80)? {
        match &a.out {
            Some(dir) => {
                if !written.insert(src.kernel_name.clone()) {
                    return Err(FlashError::Invalid(format!(
                        "two selected declarations generate the kernel `{}`; select one with --name",
                        src.kernel_name
                    )));
                }
                write_sources(dir, &src)?;
                println!("{}", dir.join(format!("{}.cu", src.kernel_name)).display());
            }
            None => {
                let _ = writeln!(
                    out,
                    "// ===== {} (threads {}, dynamic smem {} B) =====",
                    src.kernel_name, src.threads, src.smem_bytes
                );
                for (name, contents) in &src.headers {
                    let _ = writeln!(out, "// ----- header \"{name}\" -----\n{contents}");
                }
                let _ = writeln!(out, "// ----- {}.cu -----\n{}", src.kernel_name, src.source);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn write_sources(dir: &Path, src: &CudaSource) -> Result<(), FlashError> {
    std::fs::create_dir_all(dir).map_err(|e| FlashError::io("creating", dir, e))?;
    let mut files = vec![(format!("{}.cu", src.kernel_name), &src.source)];
    files.extend(
        src.headers
            .iter()
            .map(|(n, c)| (n.replace(['/', '\\'], "_"), c)),
    );
    for (name, contents) in files {
        let p = dir.join(name);
        std::fs::write(&p, contents).map_err(|e| FlashError::io("writing", &p, e))?;
    }
    Ok(())
}

pub(crate) fn cmd_plan(a: &PlanArgs) -> Result<ExitCode, FlashError> {
    for spec in a.variant.load()? {
        let plan = a.variant.plan(&spec, KernelFamily::Sm80)?;
        if a.json {
            let s = serde_json::to_string(&plan)
                .map_err(|e| FlashError::Invalid(format!("serialising the plan: {e}")))?;
            println!("{s}");
        } else {
            println!("{plan:#?}");
            let family = a.variant.family.map(KernelFamily::from);
            print_backward(&spec, family.unwrap_or(KernelFamily::Sm80));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The symbolic derivative of the score (`d score / d s = ...`, then one line per `f32`
/// parameter read it depends on) and the kernels of the backward pass for `family`'s device,
/// or why there are none.
fn print_backward(spec: &VariantSpec, family: KernelFamily) {
    match score_gradient(spec) {
        None => println!("d score / d s = 1.0 (no score expression; no parameter gradients)"),
        Some(g) => {
            println!("d score / d s = {}", display(&g.d_ds, &spec.params));
            for p in &g.params {
                let read = if p.index.is_empty() {
                    display(&Expr::Scalar(p.param), &spec.params)
                } else {
                    display(&Expr::Index(p.param, p.index.clone()), &spec.params)
                };
                println!("d score / d {read} = {}", display(&p.d, &spec.params));
            }
        }
    }
    match backward_pipeline(spec, default_backward_config_for(spec, family)) {
        Ok(p) => println!(
            "backward kernels: {}",
            p.kernels
                .iter()
                .map(|k| k.kernel_name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Err(e) => println!("backward: not available: {e}"),
    }
}
