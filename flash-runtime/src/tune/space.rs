//! The search space: every tile configuration an architecture runs, its label, and the
//! candidates (rows of the tuning table) with what became of each, pruned by layout, shared
//! memory and exclusion before anything is compiled.

use flash_dsl::plan::{config_is_valid, KernelFamily};
use flash_dsl::{TileConfig, VariantSpec};
use serde::Serialize;

use crate::compile::Resources;

/// Every tile configuration of every family `arch` runs, valid or not (pruning comes later).
/// `only` restricts the families.
pub fn search_space(arch: &str, only: Option<KernelFamily>) -> Vec<TileConfig> {
    let mut v = Vec::new();
    for family in [KernelFamily::Sm80, KernelFamily::Sm90, KernelFamily::Sm90Ws] {
        if !family.runs_on(arch) || only.is_some_and(|f| f != family) {
            continue;
        }
        for block_m in [64, 128, 192, 256] {
            for warps in [4, 8, 12, 16, 20] {
                for block_n in [32, 64, 128, 192] {
                    for stages in 1..=3 {
                        v.push(TileConfig {
                            block_m,
                            block_n,
                            warps,
                            stages,
                            family,
                        });
                    }
                }
            }
        }
    }
    v
}

/// `BMxBNxWxS` plus the kernel family: the label tables print and `--exclude` takes.
///
/// ```
/// use flash_dsl::plan::KernelFamily;
/// use flash_dsl::TileConfig;
/// use flash_runtime::tune::config_label;
///
/// let c = TileConfig {
///     block_m: 128,
///     block_n: 64,
///     warps: 8,
///     stages: 2,
///     family: KernelFamily::Sm90,
/// };
/// assert_eq!(config_label(&c), "128x64x8x2/sm90");
/// ```
pub fn config_label(c: &TileConfig) -> String {
    format!(
        "{}x{}x{}x{}/{}",
        c.block_m,
        c.block_n,
        c.warps,
        c.stages,
        c.family.tag()
    )
}

/// Where one candidate ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Status {
    /// Dropped before compiling or timing, with the reason.
    Pruned(String),
    /// NVRTC rejected it.
    CompileFailed(String),
    /// The launch or the timing failed.
    Failed(String),
    /// Its output disagreed with the reference.
    Wrong(String),
    /// Timed and correct.
    Ok,
    /// The fastest correct candidate.
    Winner,
}

impl Status {
    /// One line for a table cell: the status and the first line of its message.
    pub fn short(&self) -> String {
        match self {
            Status::Pruned(w) => format!("pruned: {w}"),
            Status::CompileFailed(w) => format!("compile failed: {}", first_line(w)),
            Status::Failed(w) => format!("failed: {}", first_line(w)),
            Status::Wrong(w) => format!("WRONG: {w}"),
            Status::Ok => "ok".into(),
            Status::Winner => "WINNER".into(),
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// One row of the tuning table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    /// The tile configuration tried.
    pub config: TileConfig,
    /// What ptxas reported, once compiled.
    pub resources: Option<Resources>,
    /// Median milliseconds of one forward pass, once timed.
    pub ms: Option<f64>,
    /// Throughput from [`TuneOptions::flops`](super::TuneOptions::flops) and `ms`, when both
    /// are known.
    pub tflops: Option<f64>,
    /// Where the candidate ended.
    pub status: Status,
}

/// Every configuration of [`search_space`] (`family` restricts it) as a candidate: `Ok`, or
/// pruned before anything is compiled because its label is in `exclude`, the MMA layout cannot
/// take it, or it asks for more than `max_smem` bytes of shared memory.
pub(super) fn prune(
    spec: &VariantSpec,
    arch: &str,
    family: Option<KernelFamily>,
    max_smem: u32,
    exclude: &[String],
) -> Vec<Candidate> {
    search_space(arch, family)
        .into_iter()
        .map(|config| {
            let status = match config_is_valid(spec, &config) {
                _ if exclude.contains(&config_label(&config)) => {
                    Status::Pruned("excluded (it faulted in an earlier attempt)".into())
                }
                Err(e) => Status::Pruned(format!("layout: {e}")),
                Ok(()) => {
                    let smem = flash_dsl::plan::smem_bytes(spec, &config);
                    if smem > max_smem {
                        Status::Pruned(format!(
                            "shared memory {smem} B > device opt-in limit {max_smem} B"
                        ))
                    } else {
                        Status::Ok
                    }
                }
            };
            Candidate {
                config,
                resources: None,
                ms: None,
                tflops: None,
                status,
            }
        })
        .collect()
}
