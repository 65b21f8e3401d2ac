//! Arguments shared by several subcommands: which declarations of which file with what
//! overrides ([`VariantArgs`]), and the kernel cache folder ([`CacheDirArg`]).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use flash_dsl::plan::KernelFamily;
use flash_dsl::{CudaSource, DType, KernelPlan, TileConfig, VariantSpec};

use crate::error::FlashError;

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
    pub(crate) dtype: Option<DTypeArg>,
    /// Override the tile configuration: `BLOCK_MxBLOCK_NxWARPSxSTAGES`, e.g. `128x64x4x2`.
    #[arg(long, value_parser = parse_tile)]
    pub tile: Option<TileOverride>,
    /// Kernel skeleton: `sm80` (mma.sync, any GPU from sm_80), `sm90` (wgmma, sm_90a only) or
    /// `sm90ws` (wgmma with a TMA producer warpgroup, persistent; sm_90a only). Without it the
    /// `FLASH_FAMILY` environment variable (same values) decides; without either, `compile`
    /// takes the fastest family of each `--arch` and the others `sm80`.
    #[arg(long, value_enum)]
    pub(crate) family: Option<FamilyArg>,
}

/// The family `FLASH_FAMILY` names, if it is set (the runtime reads the same variable).
pub fn env_family() -> Result<Option<KernelFamily>, FlashError> {
    std::env::var("FLASH_FAMILY")
        .ok()
        .map(|v| crate::device::parse_family(&v))
        .transpose()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum FamilyArg {
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
pub(crate) enum DTypeArg {
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
    /// Query rows per thread block ([`TileConfig::block_m`]).
    pub block_m: u32,
    /// Key columns per inner-loop step ([`TileConfig::block_n`]).
    pub block_n: u32,
    /// Warps per thread block ([`TileConfig::warps`]).
    pub warps: u32,
    /// K/V shared-memory buffers in flight ([`TileConfig::stages`]).
    pub stages: u32,
}

impl TileOverride {
    /// Overwrites the four tile sizes of `cfg`, leaving its other fields (the kernel family)
    /// as they are.
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
        let err = |e: &dyn std::fmt::Display| FlashError::plan(&spec.name, e);
        let family = match self.family {
            Some(f) => KernelFamily::from(f),
            None => env_family()?.unwrap_or(family),
        };
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

/// The `--cache-dir` option of the subcommands that use the kernel cache.
#[derive(Debug, Clone, Args)]
pub struct CacheDirArg {
    /// Cache root (default: $FLASH_CACHE_DIR, $XDG_CACHE_HOME/flash or ~/.cache/flash).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
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
}
