//! The `flash` command line.
//!
//! ```text
//! flash gen     FILE [--name V] [--head-dim D] [--dtype bf16|f16] [--tile BMxBNxWxS] [--out DIR]
//! flash plan    FILE [...same selection...] [--json]
//! flash compile FILE [...same selection...] --arch sm_90a[,sm_80] [--no-cache] [--cache-dir DIR] [--json]
//! flash cache   list | clear | dir   [--cache-dir DIR]
//! flash info
//! ```
//!
//! **Adding a subcommand** (`flash run`, `flash tune`): add a variant to [`Command`] holding its
//! own `#[derive(Args)]` struct (flatten [`VariantArgs`] into it to get FILE/--name/--head-dim/
//! --dtype/--tile and [`VariantArgs::load`] for free) and one arm in [`run`] that calls the
//! owning module (`crate::launch::cli_run(&args)`); the function returns `Result<ExitCode,
//! FlashError>`. Nothing else here needs to change.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use flash_dsl::plan::KernelFamily;
use flash_dsl::{CudaSource, DType, KernelPlan, TileConfig, VariantSpec};

use crate::cache::{CacheOutcome, KernelCache};
use crate::compile::{compile, CompileOptions, CompiledKernel};
use crate::error::FlashError;
use crate::libs;

#[derive(Debug, Parser)]
#[command(
    name = "flash",
    version,
    about = "Attention-variant compiler: .flash declarations → CUDA → CUBIN"
)]
pub struct Cli {
    /// More log output on stderr (-v: one line per compile, -vv: debug). `RUST_LOG` overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the generated CUDA of each selected declaration.
    Gen(GenArgs),
    /// Print the kernel plan (the IR between the spec and the CUDA) of each declaration.
    Plan(PlanArgs),
    /// Compile each selected declaration with NVRTC and report registers, shared memory, spills.
    Compile(CompileArgs),
    /// Inspect or empty the on-disk kernel cache.
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Show which NVRTC and driver libraries were found, and the GPUs.
    Info,
    /// Run one forward pass on `.npy` inputs on the GPU.
    Run(crate::cli_run::RunArgs),
    /// Autotune the tile configuration for a shape on the GPU and remember the winner.
    Tune(crate::cli_tune::TuneArgs),
}

/// Which declarations of which file, with optional overrides. Shared by every subcommand that
/// works on variants.
#[derive(Debug, Clone, Args)]
pub struct VariantArgs {
    /// A `.flash` file with one or more declarations.
    pub file: PathBuf,
    /// Only the declaration with this name (default: all of them).
    #[arg(long)]
    pub name: Option<String>,
    /// Override the head dimension (of Q/K, and of V when they were equal).
    #[arg(long)]
    pub head_dim: Option<u32>,
    /// Override the element type of Q, K, V and O.
    #[arg(long, value_enum)]
    pub dtype: Option<DTypeArg>,
    /// Override the tile configuration: `BLOCK_MxBLOCK_NxWARPSxSTAGES`, e.g. `128x64x4x2`.
    #[arg(long, value_parser = parse_tile)]
    pub tile: Option<TileOverride>,
    /// Kernel skeleton: `sm80` (mma.sync, any GPU from sm_80) or `sm90` (wgmma, sm_90a only).
    /// `compile` defaults to the fastest family of each `--arch`; the others to `sm80`.
    #[arg(long, value_enum)]
    pub family: Option<FamilyArg>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FamilyArg {
    Sm80,
    Sm90,
    Sm90ws,
}

impl From<FamilyArg> for KernelFamily {
    fn from(f: FamilyArg) -> KernelFamily {
        match f {
            FamilyArg::Sm80 => KernelFamily::Sm80,
            FamilyArg::Sm90 => KernelFamily::Sm90,
            FamilyArg::Sm90ws => KernelFamily::Sm90Ws,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DTypeArg {
    Bf16,
    F16,
}

impl From<DTypeArg> for DType {
    fn from(d: DTypeArg) -> DType {
        match d {
            DTypeArg::Bf16 => DType::Bf16,
            DTypeArg::F16 => DType::F16,
        }
    }
}

/// A `--tile` override. It is applied on top of the planner's default configuration for the
/// spec, so fields the planner adds later keep their default values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileOverride {
    pub block_m: u32,
    pub block_n: u32,
    pub warps: u32,
    pub stages: u32,
}

impl TileOverride {
    pub fn apply(&self, cfg: &mut TileConfig) {
        cfg.block_m = self.block_m;
        cfg.block_n = self.block_n;
        cfg.warps = self.warps;
        cfg.stages = self.stages;
    }
}

fn parse_tile(s: &str) -> Result<TileOverride, String> {
    let parts: Vec<u32> = s
        .split(['x', 'X', ','])
        .map(|p| {
            p.trim()
                .parse::<u32>()
                .map_err(|_| format!("`{p}` is not a number"))
        })
        .collect::<Result<_, _>>()?;
    match parts.as_slice() {
        [block_m, block_n, warps, stages] => Ok(TileOverride {
            block_m: *block_m,
            block_n: *block_n,
            warps: *warps,
            stages: *stages,
        }),
        _ => Err(format!(
            "a tile is BLOCK_MxBLOCK_NxWARPSxSTAGES (e.g. 128x64x4x2); got `{s}`"
        )),
    }
}

impl VariantArgs {
    /// Parses and validates the file, selects by name and applies the overrides. Parse errors
    /// come back as [`FlashError::Parse`] holding the rendered diagnostics (`file:line:col`).
    pub fn load(&self) -> Result<Vec<VariantSpec>, FlashError> {
        let specs = flash_dsl::parse::parse_file(&self.file).map_err(FlashError::Parse)?;
        let mut specs: Vec<VariantSpec> = match &self.name {
            None => specs,
            Some(n) => {
                let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
                let picked: Vec<VariantSpec> = specs.into_iter().filter(|s| &s.name == n).collect();
                if picked.is_empty() {
                    return Err(FlashError::Invalid(format!(
                        "no declaration named `{n}` in {}; it declares: {}",
                        self.file.display(),
                        names.join(", ")
                    )));
                }
                picked
            }
        };
        for s in &mut specs {
            if let Some(d) = self.head_dim {
                if s.head_dim_v == s.head_dim_qk {
                    s.head_dim_v = d;
                }
                s.head_dim_qk = d;
            }
            if let Some(t) = self.dtype {
                s.dtype = t.into();
            }
        }
        Ok(specs)
    }

    /// Plans one spec with the `--tile` override (or the planner's default) for the `--family`
    /// given, else for `family`.
    pub fn plan(&self, spec: &VariantSpec, family: KernelFamily) -> Result<KernelPlan, FlashError> {
        let err = |e: &dyn std::fmt::Display| FlashError::Plan {
            variant: spec.name.clone(),
            message: e.to_string(),
        };
        let family = self.family.map(KernelFamily::from).unwrap_or(family);
        let mut cfg = flash_dsl::plan::default_config_for(spec, family);
        if let Some(t) = self.tile {
            t.apply(&mut cfg);
        }
        flash_dsl::plan(spec, Some(cfg)).map_err(|e| err(&e))
    }

    /// Loads, plans and emits every selected declaration (for `family` unless `--family`).
    pub fn generate(
        &self,
        family: KernelFamily,
    ) -> Result<Vec<(VariantSpec, KernelPlan, CudaSource)>, FlashError> {
        self.load()?
            .into_iter()
            .map(|s| {
                let p = self.plan(&s, family)?;
                let src = flash_dsl::emit(&p);
                Ok((s, p, src))
            })
            .collect()
    }
}

#[derive(Debug, Args)]
pub struct GenArgs {
    #[command(flatten)]
    pub variant: VariantArgs,
    /// Write `<kernel>.cu` and its headers into this folder instead of printing.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub variant: VariantArgs,
    /// JSON instead of Rust debug output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CompileArgs {
    #[command(flatten)]
    pub variant: VariantArgs,
    /// Target architectures, comma separated or repeated (`sm_80`, `sm_90`, `sm_90a`).
    #[arg(long, value_delimiter = ',', default_value = "sm_90a")]
    pub arch: Vec<String>,
    /// Extra NVRTC options (repeatable), e.g. `--nvrtc-opt=-lineinfo`.
    #[arg(long = "nvrtc-opt", allow_hyphen_values = true)]
    pub nvrtc_opt: Vec<String>,
    /// Compile even if cached, and do not store the result.
    #[arg(long)]
    pub no_cache: bool,
    #[command(flatten)]
    pub cache: CacheDirArg,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct CacheDirArg {
    /// Cache root (default: $FLASH_CACHE_DIR, $XDG_CACHE_HOME/flash or ~/.cache/flash).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// List the entries (newest first).
    List(CacheDirArg),
    /// Remove every entry.
    Clear(CacheDirArg),
    /// Print the folder entries are stored in.
    Dir(CacheDirArg),
}

/// Entry point of the `flash` binary. A closed stdout pipe (`flash plan F --json | head`) ends
/// the program quietly with status 0 rather than a `println!` panic.
pub fn main() -> ExitCode {
    crate::ffi::exit_quietly_on_sigpipe();
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            let msg = e.to_string();
            // Rendered parse diagnostics already start with `error:`.
            if msg.starts_with("error") {
                eprint!("{msg}");
                if !msg.ends_with('\n') {
                    eprintln!();
                }
            } else {
                eprintln!("error: {msg}");
            }
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(match verbose {
            0 => "warn",
            1 => "info",
            _ => "debug",
        })
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode, FlashError> {
    match cli.command {
        Command::Gen(a) => cmd_gen(&a),
        Command::Plan(a) => cmd_plan(&a),
        Command::Compile(a) => cmd_compile(&a),
        Command::Cache(c) => cmd_cache(&c),
        Command::Info => cmd_info(cli.verbose > 0),
        Command::Run(a) => crate::cli_run::cli_run(&a),
        Command::Tune(a) => crate::cli_tune::cli_tune(&a),
    }
}

fn cmd_gen(a: &GenArgs) -> Result<ExitCode, FlashError> {
    let out = std::io::stdout();
    let mut out = out.lock();
    for (_, _, src) in a.variant.generate(KernelFamily::Sm80)? {
        match &a.out {
            Some(dir) => {
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

fn cmd_plan(a: &PlanArgs) -> Result<ExitCode, FlashError> {
    for spec in a.variant.load()? {
        let plan = a.variant.plan(&spec, KernelFamily::Sm80)?;
        if a.json {
            let s = serde_json::to_string_pretty(&plan)
                .map_err(|e| FlashError::Invalid(format!("serialising the plan: {e}")))?;
            println!("{s}");
        } else {
            println!("{plan:#?}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One line of `flash compile` output.
#[derive(Debug, serde::Serialize)]
struct CompileReport<'a> {
    variant: &'a str,
    kernel: &'a str,
    arch: &'a str,
    registers: u32,
    smem_static: u32,
    smem_dynamic: u32,
    spill_stores: u32,
    spill_loads: u32,
    stack_frame: u32,
    compile_ms: f64,
    cache: &'a str,
}

fn cmd_compile(a: &CompileArgs) -> Result<ExitCode, FlashError> {
    let cache = (!a.no_cache).then(|| KernelCache::new(a.cache.cache_dir.clone()));
    let mut failed = 0usize;
    if !a.json {
        println!(
            "{:<28} {:<7} {:>5} {:>10} {:>12} {:>9}  cache",
            "variant", "arch", "regs", "smem B", "spill st/ld", "ms"
        );
    }
    for arch in &a.arch {
        let generated = a.variant.generate(KernelFamily::for_arch(arch))?;
        for (spec, plan, src) in &generated {
            if !plan.config.family.runs_on(arch) {
                failed += 1;
                eprintln!(
                    "error: {}: the {:?} kernel family cannot be compiled for {arch}",
                    spec.name, plan.config.family
                );
                continue;
            }
            let opts = CompileOptions {
                arch: arch.clone(),
                extra: a.nvrtc_opt.clone(),
            };
            let result: Result<(std::sync::Arc<CompiledKernel>, &str), FlashError> = match &cache {
                Some(c) => c.get_or_compile(src, &opts).map(|(k, o)| (k, o.as_str())),
                None => compile(src, &opts).map(|k| (std::sync::Arc::new(k), "off")),
            };
            match result {
                Ok((k, outcome)) => {
                    let r = k.resources;
                    let ms = if outcome == CacheOutcome::Miss.as_str() || outcome == "off" {
                        k.compile_ms
                    } else {
                        0.0
                    };
                    if a.json {
                        let rep = CompileReport {
                            variant: &spec.name,
                            kernel: &k.kernel_name,
                            arch,
                            registers: r.registers,
                            smem_static: r.smem_static,
                            smem_dynamic: src.smem_bytes,
                            spill_stores: r.spill_stores,
                            spill_loads: r.spill_loads,
                            stack_frame: r.stack_frame,
                            compile_ms: k.compile_ms,
                            cache: outcome,
                        };
                        println!("{}", serde_json::to_string(&rep).unwrap_or_default());
                    } else {
                        println!(
                            "{:<28} {:<7} {:>5} {:>10} {:>12} {:>9}  {}{}",
                            spec.name,
                            arch,
                            r.registers,
                            r.smem_static + src.smem_bytes,
                            format!("{}/{}", r.spill_stores, r.spill_loads),
                            if ms > 0.0 {
                                format!("{ms:.1}")
                            } else {
                                "-".into()
                            },
                            outcome,
                            if r.spills() { "  (spills!)" } else { "" },
                        );
                    }
                }
                Err(e @ FlashError::LibraryNotFound { .. }) => return Err(e),
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {} for {arch}: {e}", spec.name);
                }
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn cmd_cache(c: &CacheCommand) -> Result<ExitCode, FlashError> {
    let (CacheCommand::List(d) | CacheCommand::Clear(d) | CacheCommand::Dir(d)) = c;
    let cache = KernelCache::new(d.cache_dir.clone());
    match c {
        CacheCommand::Dir(_) => match cache.dir() {
            Some(dir) => println!("{}", dir.display()),
            None => {
                let root = cache
                    .root()
                    .map(|r| r.display().to_string())
                    .unwrap_or_else(|| "(none)".into());
                println!("memory-only: {root} is not writable");
            }
        },
        CacheCommand::List(_) => {
            let entries = cache.list();
            println!(
                "{:<16} {:<44} {:<7} {:>5} {:>9} {:>10}  ok",
                "key", "kernel", "arch", "regs", "bytes", "build ms"
            );
            for e in &entries {
                println!(
                    "{:<16} {:<44} {:<7} {:>5} {:>9} {:>10}  {}",
                    &e.key[..e.key.len().min(16)],
                    e.kernel_name.as_deref().unwrap_or("?"),
                    e.arch.as_deref().unwrap_or("?"),
                    e.resources
                        .map(|r| r.registers.to_string())
                        .unwrap_or_else(|| "?".into()),
                    e.bytes,
                    e.compile_ms
                        .map(|m| format!("{m:.1}"))
                        .unwrap_or_else(|| "?".into()),
                    if e.valid {
                        "yes"
                    } else {
                        "INVALID (will be rebuilt)"
                    },
                );
            }
            println!(
                "{} entries in {}",
                entries.len(),
                cache
                    .dir()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default()
            );
        }
        CacheCommand::Clear(_) => {
            let n = cache.clear()?;
            println!("removed {n} entries");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn cmd_info(verbose: bool) -> Result<ExitCode, FlashError> {
    match libs::ensure_nvrtc() {
        Ok(l) => {
            let (maj, min) = crate::compile::nvrtc_version()?;
            println!("nvrtc:  {maj}.{min} at {}", l.path.display());
            if let Some(b) = l.builtins {
                println!("        builtins {}", b.display());
            }
        }
        Err(e) => println!("nvrtc:  not found\n{e}"),
    }
    match libs::probe_gpus() {
        libs::GpuProbe::NoDriver(why) => {
            println!(
                "gpu:    no GPU found (no NVIDIA driver library; set FLASH_CUDA_LIB if it exists)"
            );
            if verbose {
                println!("{why}");
            }
        }
        libs::GpuProbe::NoDevice(why) => println!("gpu:    no GPU found ({why})"),
        libs::GpuProbe::Devices(devs) => {
            if let Ok(l) = libs::ensure_driver() {
                println!("driver: {}", l.path.display());
            }
            for d in devs {
                println!(
                    "gpu {}:  {} (sm_{}{}, {:.1} GiB) → compile for {}",
                    d.ordinal,
                    d.name,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    d.total_mem_bytes as f64 / (1u64 << 30) as f64,
                    d.arch()
                );
            }
        }
    }
    let cache = KernelCache::new(None);
    match cache.dir() {
        Some(d) => println!("cache:  {}", d.display()),
        None => println!("cache:  memory-only"),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_syntax() {
        assert_eq!(
            parse_tile("128x64x4x2").unwrap(),
            TileOverride {
                block_m: 128,
                block_n: 64,
                warps: 4,
                stages: 2
            }
        );
        assert!(parse_tile("128x64").is_err());
        assert!(parse_tile("ax64x4x2").is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
