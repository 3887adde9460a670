#!/usr/bin/env bash
# Session 52 call 2; carry [".whl", ".device_tree"]. ~450-560 s.
# 1. GPU tests: the packed prefill at its new defaults (32 queries a program, key loop pipelined over 2 stages, fp32
#    at 16-key tiles) and its K/V written by the row scatter kernel instead of index_put (the engine's fp32 packed /
#    joint prefill against the CPU reference).
# 2. 0.6B c=64 <= 8 GB offline, alternating on one machine: the new prefill defaults against the old ones
#    (VOXFLOW_PAGED_PREFILL_STAGES=1 VOXFLOW_PREFILL_TILE_ROWS=16; both with the row scatter).
# 3. A 0.6B wave's prefill profiled at the new defaults (call 1: 8.9 ms prefill attention, 3.3 ms index_put a wave).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
gpu_tests 200 tests/gpu/test_gpu_paged_prefill.py tests/gpu/test_gpu_engine.py -k "prefill or fp32_engine"
pack_results
wait $CK6
bench_small_first new_0                                               # (compiles the kernels)
pack_results
for run in old_1 new_1 old_2 new_2; do
  (( SECONDS < ${UNTIL:-470} )) || break   # (UNTIL: when the device time left is short)
  if [[ $run == old_* ]]; then
    VOXFLOW_PAGED_PREFILL_STAGES=1 VOXFLOW_PREFILL_TILE_ROWS=16 bench_small_traced $run
  else
    bench_small_traced $run
  fi
  pack_results
done
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
report_runs
pack_results
if (( SECONDS < ${UNTIL:-470} + 50 )); then
  timeout 70 python3 benchmarks/scripts/profile_wave_prefill.py /tmp/real-0.6b 64 codec_max_batch=16 \
    kv_cache_bytes=2400000000 2>&1 | grep -v -i warn > $R/profile_wave_prefill.txt; head -16 $R/profile_wave_prefill.txt
fi
pack_results
echo "done at ${SECONDS}s"
