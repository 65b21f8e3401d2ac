//! `flash cache list | clear | dir`: the on-disk kernel cache.

use std::process::ExitCode;

use clap::Subcommand;

use crate::cache::KernelCache;
use crate::error::FlashError;

use super::args::CacheDirArg;

/// `flash cache`'s subcommands, each with the cache folder to act on.
#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// List the entries (newest first).
    List(CacheDirArg),
    /// Remove every entry.
    Clear(CacheDirArg),
    /// Print the folder entries are stored in.
    Dir(CacheDirArg),
}

pub(crate) fn cmd_cache(c: &CacheCommand) -> Result<ExitCode, FlashError> {
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
            let entries = cache.try_list()?;
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
            match cache.root() {
                Some(root) => println!(
                    "{} entries in {}{}",
                    entries.len(),
                    root.join(format!("v{}", crate::cache::FORMAT_VERSION))
                        .display(),
                    if cache.is_persistent() {
                        ""
                    } else {
                        " (read-only)"
                    }
                ),
                None => println!(
                    "0 entries: no cache folder (FLASH_CACHE_DIR, XDG_CACHE_HOME and HOME unset)"
                ),
            }
        }
        CacheCommand::Clear(_) => {
            let n = cache.clear()?;
            println!("removed {n} entries");
        }
    }
    Ok(ExitCode::SUCCESS)
}
