#!/usr/bin/env bash
# Prepared in session 51, run as session 52 call 1; carry [".whl", ".device_tree"]. ~100-350 s.
# 1. GPU tests of the paged attention kernels: the decode kernel's tensor-core loop now pipelined by default (call 1:
#    -13% attention, +6% offline), fp8 pools included; the prefill kernel's key loop pipelined (new,
#    VOXFLOW_PAGED_PREFILL_STAGES: bit-equal to the plain loop).
# 2. tune_paged_prefill.py: the prefill kernel's launch settings with / without the pipelined key loop, and with 32 /
#    64 queries a program (VOXFLOW_PREFILL_TILE_ROWS) (call 1's wave profile: 7.2 ms of a 0.6B wave's prefill in
#    it, ~30 TFLOP/s). Its winner then goes into step 3's A/B: WAVE_B="VOXFLOW_PAGED_PREFILL_STAGES=2
#    VOXFLOW_PREFILL_TILE_ROWS=32" bash ... (the default WAVE_B: the pipelined key loop alone). The engine's launch
#    takes those two; its key tiles stay 32 and its warps follow the tile size (4 at 16 queries, 8 above), so a
#    tune winner at 64-key tiles or other warps needs a code change first.
# 3. A 0.6B wave's prefill (64 prompts of ~200 positions at once, profile_wave_prefill.py), the plain key loop
#    against 2 stages: every step's wall (two waves each), then each one's kernels by GPU time.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
gpu_tests 150 tests/gpu/test_gpu_paged_attention.py tests/gpu/test_gpu_paged_prefill.py
timeout 180 python3 benchmarks/scripts/tune_paged_prefill.py 2>&1 | grep -v -i warn | tee $R/tune_paged_prefill.txt
pack_results
wait $CK6
# The candidate (WAVE_B, environment assignments; default: the pipelined key loop) against the defaults, A B A.
WAVE_B=${WAVE_B:-VOXFLOW_PAGED_PREFILL_STAGES=2}
n=0
for variant in defaults "$WAVE_B" defaults; do
  (( SECONDS < ${WAVES_UNTIL:-300} )) || break   # (WAVES_UNTIL=0: no wave profiles, when device time is short)
  n=$((n + 1))
  name=$([ "$variant" = defaults ] && echo defaults || echo candidate)
  echo "wave profile $n: $variant"
  env $([ "$variant" = defaults ] || echo "$variant") timeout 200 python3 benchmarks/scripts/profile_wave_prefill.py \
    /tmp/real-0.6b 64 codec_max_batch=16 kv_cache_bytes=2400000000 2>&1 | grep -v -i warn \
    > $R/profile_wave_prefill_${n}_$name.txt
  head -12 $R/profile_wave_prefill_${n}_$name.txt
  pack_results
  echo "  at ${SECONDS}s"
done
echo "done at ${SECONDS}s"
