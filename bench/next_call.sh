#!/usr/bin/env bash
# Runs ON the GPU machine: candidate builds against the committed kernels, alternated in one
# call. Here first, for a bf16 candidate (bench/results/history/2026-11-28-bf16-overlap-patches/
# timed the last two):
#   bench/build_patched.sh old= a=PATCH_A.diff b=PATCH_B.diff
# then, carrying .carry:
#   bash bench/next_call.sh ab      # bf16 d64 and variants, one round of each build (~15 s a build)
# And an fp8 candidate (bench/results/history/2026-11-28-fp8-turns-attempt/ timed the last two):
#   bench/build_patched.sh old= new=PATCH.diff
#   bash bench/next_call.sh fp8ab          # fp8 d 128 timing of BINS (default "old new"),
#                                          # NS=4096 by default (NS=4096,16384: both lengths); ~90 s a build
#                                          # (ROWS=perhead_n192,...: those rows alone)
#   bash bench/next_call.sh fp8check NAME  # NAME's check on the streamed declarations with blocks
#                                          # crossing items (a hang would be a barrier mismatch: the
#                                          # check runs under `timeout`)
# (Its `check` step, the first GPU run of `v_scales`, ran on 2026-11-28:
# bench/results/vscales-2026-11-28/.) Logs and tables land in $OUT.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
case "${1:-}" in
  ab)
    BINS="old a b" ROUNDS=1 NAME=bf16 TIME_ARGS="--time-set bf16,d64,n4096,n16384,variants" bash bench/ab_multi.sh
    ;;
  fp8ab)
    # An fp8 timing run takes ~110 s on a fresh machine (kernel compiles, host inputs).
    # ROWS=perhead_n192,perhead_vchannel times those rows alone (FLASH_FP8_TIME_ROWS; bf16 always).
    [ -n "${ROWS:-}" ] && export FLASH_FP8_TIME_ROWS=$ROWS
    # ROUNDS=2 alternates the builds twice: on 2026-11-29 the committed dense 192-key kernel
    # read 928-996 TFLOP/s at n 16k across calls and up to 3 % apart between two rounds of one.
    FLASH_FP8_TIME_DIMS=128 FLASH_FP8_TIME_NS=${NS:-4096} BINS=${BINS:-old new} ROUNDS=${ROUNDS:-1} \
      NAME=fp8 TIME_ARGS=--fp8-only TIME_TIMEOUT=200 bash bench/ab_multi.sh
    ;;
  fp8check | fp8check_items)
    # NAME's check with blocks crossing items (a hang would be a barrier or wgmma-group mismatch:
    # the check runs under `timeout`): `fp8check` on the streamed declarations, `fp8check_items`
    # on those that run the per-item loop.
    if [ "$1" = fp8check ]; then
      variants=Fp8CausalPerHead,Fp8DensePerTensor,Fp8CausalInt8PerHead,Fp8DenseInt8V16,Fp8CausalVRowsInt8PerHead,Fp8DenseVChannel,Fp8CausalPerHeadVChannel,Fp8CausalVHead,Fp8WindowVRowsChannel,Fp8CausalVTensor,Fp8DenseInt8VChannel
    else
      variants=Fp8Dense,Fp8Causal,Fp8Softcap,Fp8Window,Fp8Alibi,Fp8Document,Fp8Dense64,Fp8Window64,Fp8DenseInt8,Fp8CausalInt8,Fp8Causal64Int8,Fp8SoftcapInt8,Fp8CausalVRows,Fp8DensePerHeadVBlock
    fi
    log="$OUT/${2:?build name}-check${1#fp8check}.log"
    FLASH_PERSISTENT_BLOCKS=3 FLASH_FP8_ATTENTION_ONLY=1 FLASH_FP8_VARIANTS=$variants \
      timeout "${CHECK_TIMEOUT:-300}" ".carry/$2/flash-gpucheck" --fp8-only --no-time >"$log" 2>&1
    echo "check exit $?"
    grep -E '^#|^FAIL' "$log" | tail -20
    ;;
  trace)
    # Trace builds (bench/patches/trace-fp8-stream.diff or trace-fp8-items.diff, alone or on
    # top of a candidate):
    #   bench/build_patched.sh trace=bench/patches/trace-fp8-stream.diff
    # d 128 fp8 timings at n 16384 (b 1, h 16), then each build's trace table: the phases of
    # the fp8 stream's steady loop per consumer warpgroup (bench/trace_table.py).
    for b in ${2:-trace}; do
      FLASH_FP8_TIME_DIMS=128 FLASH_FP8_TIME_NS=${NS:-16384} timeout 250 ".carry/$b/flash-gpucheck" \
        --fp8-only --no-check >"$OUT/trace-$b.log" 2>&1
      echo "$b: exit $?"
      grep -E "^fwd .*(n192|bf16)" "$OUT/trace-$b.log"
      python3 bench/trace_table.py "$OUT/trace-$b.log" | tee "$OUT/trace-$b.md"
      # The item-boundary trace (bench/patches/trace-fp8-items.diff) adds TRACEB lines.
      if grep -q '^TRACEB' "$OUT/trace-$b.log"; then
        python3 bench/trace_items.py "$OUT/trace-$b.log" | tee "$OUT/trace-items-$b.md"
      fi
    done
    ;;
  probe)
    # Does the SM overlap e4m3 wgmma with MUFU.EX2 from another warpgroup (bench/overlap_probe_gen.py)?
    python3 bench/overlap_probe_gen.py >"$OUT/overlap_probe.cu" &&
      nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o "$OUT/overlap_probe" "$OUT/overlap_probe.cu" &&
      "$OUT/overlap_probe" | tee "$OUT/overlap-probe.log"
    rm -f "$OUT/overlap_probe" "$OUT/overlap_probe.cu"
    ;;
  quantab)
    # A quantiser candidate (as bench/results/quant-hadamard-registers-2026-11-28/ timed one):
    #   bench/build_patched.sh old= new=PATCH.diff
    # new's check (bit for bit against the host model), then old / new timings alternating.
    export FLASH_FP8_QUANT_ONLY=1
    timeout 300 ".carry/${2:-new}/flash-gpucheck" --fp8-only --no-time >"$OUT/quant-check.log" 2>&1
    echo "check exit $?"
    grep -E '^#|FAIL' "$OUT/quant-check.log" | head
    BINS="old ${2:-new}" ROUNDS=2 NAME=quant TIME_ARGS=--fp8-only bash bench/ab_multi.sh
    ;;
  *)
    echo "usage: bench/next_call.sh ab | fp8ab | fp8check NAME | fp8check_items NAME | quantab [NAME] | probe | trace [\"NAMES\"]" >&2
    exit 2
    ;;
esac
