//! `flash info`: the NVRTC and driver libraries found, the GPUs, the cache folder.

use std::process::ExitCode;

use crate::cache::KernelCache;
use crate::error::FlashError;
use crate::libs;

pub(crate) fn cmd_info(verbose: bool) -> Result<ExitCode, FlashError> {
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
