#!/usr/bin/env bash
# flash as a dependency (README "Using flash as a dependency"; run by scripts/test.sh):
#  1. the declared MSRV (workspace `rust-version`) is at least every locked dependency's own
#     `rust-version` (the toolchain itself cannot be switched here, so this and clippy's
#     `incompatible_msrv` lint, which reads the same field, are the MSRV checks);
#  2. `cargo package` of flash-dsl, flash-macros and flash-runtime, in dependency order, each
#     verified by building it from its `.crate` alone (the templates travel inside flash-dsl's);
#  3. a scratch crate outside the workspace, depending on the packaged crates only, declares a
#     variant with `attention!`, generates its kernels and compiles them with NVRTC.
# Needs NVRTC (scripts/setup-nvrtc.sh) and network access to crates.io.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$(pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"

echo "--> MSRV against the locked dependencies"
cargo metadata --format-version 1 --locked | python3 -c '
import json, sys
m = json.load(sys.stdin)
ws = set(m["workspace_members"])
def v(s): return tuple(int(x) for x in s.split(".")[:3]) + (0,) * (3 - len(s.split(".")))
ours = {p["rust_version"] for p in m["packages"] if p["id"] in ws}
if len(ours) != 1 or None in ours:
    sys.exit(f"every workspace crate must declare the same rust-version; found {sorted(map(str, ours))}")
msrv = ours.pop()
worst = [(p["name"], p["version"], p["rust_version"]) for p in m["packages"]
         if p["id"] not in ws and p.get("rust_version") and v(p["rust_version"]) > v(msrv)]
if worst:
    sys.exit(f"declared rust-version {msrv} is below what these dependencies need: {worst}")
deps = sum(1 for p in m["packages"] if p["id"] not in ws)
print(f"rust-version {msrv}: no locked dependency (of {deps}) needs a newer toolchain")
'

echo "--> cargo package (each crate verified from its .crate alone)"
# Cargo treats a registry crate of an unchanged version as unchanged: it would reuse an earlier
# run's unpacked copy (under CARGO_HOME, keyed by the temporary registry's path) and its build.
# So the verification builds in a target folder of its own, and both start afresh, so the
# packages verified are this tree's.
rm -rf "$target/package" "$target/package-verify"
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/flash-{dsl,macros,runtime}-0.1.0
mkdir -p "$target/package"
# --allow-dirty: CI's checkout is clean; locally this checks the working tree as it is.
if ! CARGO_TARGET_DIR="$target/package-verify" cargo package --locked --allow-dirty -p flash-dsl -p flash-macros -p flash-runtime \
    >"$target/package.log" 2>&1; then
    cat "$target/package.log" >&2
    echo "check-packages: cargo package failed" >&2
    exit 1
fi
grep -E '^ *(Packaged|Verifying|warning)' "$target/package.log" || true
for c in flash-dsl flash-macros flash-runtime; do
    f="$target/package-verify/package/$c-0.1.0.crate"
    [[ -f "$f" ]] || { echo "check-packages: $f was not produced" >&2; exit 1; }
    echo "$c: $(tar -tzf "$f" | wc -l) files, $(du -k "$f" | cut -f1) KiB (verified)"
done
tar -tzf "$target/package-verify/package/flash-dsl-0.1.0.crate" >"$target/package/flash-dsl.files"
if ! grep -q '/templates/forward/sm90ws.cu.hbs$' "$target/package/flash-dsl.files"; then
    echo "check-packages: flash-dsl's package lacks its templates" >&2
    exit 1
fi

echo "--> a scratch crate outside the workspace, on the packaged crates"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for c in flash-dsl flash-macros flash-runtime; do
    tar -xzf "$target/package-verify/package/$c-0.1.0.crate" -C "$scratch"
done
mkdir -p "$scratch/user/src"
cat >"$scratch/user/Cargo.toml" <<EOF
[package]
name = "flash-user"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
flash-macros = "0.1.0"
flash-runtime = "0.1.0"

# The packaged crates stand in for the registry's.
[patch.crates-io]
flash-dsl = { path = "../flash-dsl-0.1.0" }
flash-macros = { path = "../flash-macros-0.1.0" }
flash-runtime = { path = "../flash-runtime-0.1.0" }

[workspace]
EOF
cat >"$scratch/user/src/main.rs" <<'EOF'
use flash_runtime::flash_dsl::plan::KernelFamily;
use flash_runtime::{KernelCache, Variant};

flash_macros::attention! {
    /// A user's variant: ALiBi on a causal mask with a learned slope per head.
    pub UserAlibi {
        head_dim: 64,
        dtype: bf16,
        params: { slopes: [f32; heads] },
        mask: causal,
        score: s + slopes[h] * (k - q),
    }
}

fn main() -> Result<(), flash_runtime::FlashError> {
    let cache = KernelCache::memory_only();
    for (family, arch) in [(KernelFamily::Sm80, "sm_80"), (KernelFamily::Sm90Ws, "sm_90a")] {
        let generated = UserAlibi::generate(family)?;
        let built = flash_runtime::build::compile_generated(&generated, arch, &cache)?;
        for b in &built {
            let r = &b.compiled.resources;
            println!(
                "{arch}: {} compiled ({} registers, {} B spilled)",
                b.source.kernel_name, r.registers, r.spill_stores
            );
        }
        assert_eq!(built.len(), generated.kernels().count());
    }
    Ok(())
}
EOF
# A fresh target folder for the same reason as above.
rm -rf "$target/scratch-user"
(cd "$scratch/user" && CARGO_TARGET_DIR="$target/scratch-user" \
    FLASH_NVRTC_DIR="${FLASH_NVRTC_DIR:-$root/.nvrtc}" cargo run --quiet)
echo "check-packages: ok"
