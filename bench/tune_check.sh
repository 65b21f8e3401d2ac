#!/usr/bin/env bash
# Autotuning check. Two halves:
#   here:        bench/tune_check.sh --prepare   (builds the release `flash`, copies it to
#                .carry/flash-tune; name `.carry` in the device tool's `carry`)
#   GPU machine: bench/tune_check.sh             (from the repository root)
# On the GPU it tunes every example variant (examples/variants/*.flash, as declared: d=128 bf16,
# relative_bias d=64 f16) and the dense workloads (dense/causal at d=64; d=128 is the variants'
# own) at seq 4096, batch 4, heads 2048/d, then re-times default vs winner alternately, appending
# `flash_default` / `flash_tuned` rows to $OUT/tune.json (results format) and writing a table to
# $OUT/tune.md. Knobs: ROUNDS (default 7), PER_TIMEOUT seconds per workload (default 90),
# FLASH_CACHE_DIR (default a fresh /tmp folder, so tuning times include every compile).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
  cargo build --release -p flash-runtime --bin flash || exit 1
  mkdir -p .carry
  cp "${CARGO_TARGET_DIR:-target}/release/flash" .carry/flash-tune
  ls -la .carry/flash-tune
  exit 0
fi
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
BIN=.carry/flash-tune
export FLASH_CACHE_DIR=${FLASH_CACHE_DIR:-$(mktemp -d /tmp/flash-tune-cache.XXXX)}
JSON="$OUT/tune.json"
rm -f "$JSON"
status=0
run() { # FILE D EXTRA...
  local file=$1 d=$2; shift 2
  local h=$((2048 / d))
  echo "== $file d=$d $*"
  timeout "${PER_TIMEOUT:-90}" "$BIN" tune "$file" --shape "4,$h,$h,4096,4096" \
    --json "$JSON" --rounds "${ROUNDS:-7}" "$@" 2>&1 | tr '\r' '\n' | grep -v '^  compiled [0-9/]* *pruned [0-9]* *timed [0-9/]* *$' \
    || { echo "FAILED: $file $*"; status=1; }
}
for f in examples/variants/*.flash; do
  case "$f" in
    *relative_bias*) run "$f" 64 ;;
    *) run "$f" 128 ;;
  esac
done
run examples/variants/dense.flash 64 --head-dim 64
run examples/variants/causal.flash 64 --head-dim 64
python3 - "$JSON" "$OUT/tune.md" <<'EOF'
import json, statistics, sys
rows = json.load(open(sys.argv[1]))
by = {}
for r in rows:
    by.setdefault((r["variant"], r["d"], r["dtype"]), {})[r["backend"]] = r
lines = ["| variant | dtype | d | h | default config | default ms | tuned config | tuned ms | speedup | tuned TFLOP/s | tune s |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
sp, ts = [], []
for (v, d, dt), p in by.items():
    a, b = p.get("flash_default"), p.get("flash_tuned")
    if not a or not b:
        continue
    s = a["ms"] / b["ms"]; sp.append(s); ts.append(b["tune_s"])
    lines.append(f"| {v} | {dt} | {d} | {b['h']} | {a['config']} | {a['ms']:.3f} | {b['config']} | {b['ms']:.3f} | {s:.3f}x | {b['tflops']:.1f} | {b['tune_s']:.1f} |")
if sp:
    lines.append("")
    lines.append(f"GPU {rows[0]['gpu']}; seq 4096, batch 4. Median speedup {statistics.median(sp):.3f}x "
                 f"(min {min(sp):.3f}x, max {max(sp):.3f}x); tuning median {statistics.median(ts):.1f} s, max {max(ts):.1f} s.")
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
exit $status
