//! The `flash` command line.
//!
//! ```text
//! flash gen     FILE [--name V] [--head-dim D] [--dtype bf16|f16] [--tile BMxBNxWxS] [--out DIR]
//! flash plan    FILE [...same selection...] [--json]
//! flash compile FILE [...same selection...] --arch sm_90a[,sm_80] [--no-cache] [--cache-dir DIR] [--json]
//! flash cache   list | clear | dir   [--cache-dir DIR]
//! flash info
//! flash run     FILE --q Q.npy --k K.npy --v V.npy --out O.npy [...]   (see `run`)
//! flash tune    FILE --shape B,Hq,Hkv,Sq,Sk [...]                      (see `tune`)
//! flash quantize --x X.npy --codes C.npy --scales S.npy [...]          (see `quantize`)
//! ```
//!
//! One module per subcommand (`generate` for `gen` and `plan`, `compile`, `cache`, `info`,
//! `run`, `tune`, `quantize`), each with its `#[derive(Args)]` struct and a `cmd_*` function returning
//! `Result<ExitCode, FlashError>`; `args` holds what several of them share. This module only
//! parses the command line and dispatches: the subcommands never import it.
//!
//! **Adding a subcommand**: add a module beside the others holding its own `#[derive(Args)]`
//! struct (flatten [`VariantArgs`] into it to get FILE/--name/--head-dim/--dtype/--tile and
//! [`VariantArgs::load`] for free) and its `cmd_*` function, then a variant of [`Command`]
//! holding the struct and one arm in [`run()`] that calls the function (as
//! `Command::Run(a) => run::cmd_run(&a)` does). Nothing else here needs to change.

pub mod args;
pub mod cache;
pub mod compile;
pub mod generate;
pub mod info;
pub mod quantize;
pub mod run;
pub mod tune;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::error::FlashError;

pub use args::{CacheDirArg, TileOverride, VariantArgs};
pub use cache::CacheCommand;
pub use compile::CompileArgs;
pub use generate::{GenArgs, PlanArgs};
pub use run::RunArgs;
pub use tune::TuneArgs;

/// The parsed command line of `flash`.
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
    /// The subcommand and its arguments.
    #[command(subcommand)]
    pub command: Command,
}

/// One subcommand of `flash` (each variant's doc line is its `--help` summary).
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
    Run(Box<RunArgs>),
    /// Autotune the tile configuration for a shape on the GPU and remember the winner.
    Tune(TuneArgs),
    /// Quantise a `.npy` tensor to FP8 (e4m3) with block scales on the GPU.
    Quantize(quantize::QuantizeArgs),
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
    // Colours only on a terminal: a log captured by CI or a file stays plain text.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode, FlashError> {
    match cli.command {
        Command::Gen(a) => generate::cmd_gen(&a),
        Command::Plan(a) => generate::cmd_plan(&a),
        Command::Compile(a) => compile::cmd_compile(&a),
        Command::Cache(c) => cache::cmd_cache(&c),
        Command::Info => info::cmd_info(cli.verbose > 0),
        Command::Run(a) => run::cmd_run(&a),
        Command::Tune(a) => tune::cmd_tune(&a),
        Command::Quantize(a) => quantize::cmd_quantize(&a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
