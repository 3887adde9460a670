#!/usr/bin/env bash
# Ran on tree 8ee6867 in 398 s. VOXFLOW_BATCH_SKINNY[_PROGRAMS] no longer exist (removed in ecb2178); its benches
# ran on the repeated bundled prompts (UNIQUE= set empty reruns them as they ran).
# Session 25 call 3. `bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]. About 520 s.
# 1. GPU tests: the preloaded text rows (EngineConfig.preload_text_rows, new default) and the fp32 engine == CPU loop.
# 2. 0.6B c=64 (<= 8 GB configuration, now with the 311 MB preloaded table: its footprint against call 2's 6.77 GiB)
#    and the batch skinny GEMMs under the codec's contention (call 2: step median unchanged, p10 4.83 -> 4.05 ms):
#    off / on with grids aimed at 64 programs / off and on with the codec partition off (codec_sms=none).
# 3. HTTP c=16 (1.7B) on fresh servers, two runs each, text rows preloaded and not (session 24 call 6: first runs
#    82-103 ms p99 against 49-60 on the second; prepare 22-44 ms per wave of 16 against 10-11).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
small_checkpoint_bg
real_checkpoint_bg
gpu_tests 100 tests/gpu/test_gpu_text_rows.py tests/gpu/test_gpu_engine.py -k "text_row or fp32_engine_equals"
wait $CK6
export VOXFLOW_BATCH_SKINNY=0
bench_small_traced base
VOXFLOW_BATCH_SKINNY=1 VOXFLOW_BATCH_SKINNY_PROGRAMS=64 bench_small_traced skinny_p64
VOXFLOW_BATCH_SKINNY=1 bench_small_traced skinny_whole --engine-arg codec_sms=none
bench_small_traced base_whole --engine-arg codec_sms=none
pack_results
wait $CK
for v in pre nopre; do
  args=(); [ $v = nopre ] && args=(--engine-arg preload_text_rows=false)
  if serve_variant $v "${args[@]}"; then
    bench_http_at 16 c16_${v}_a
    bench_http_at 16 c16_${v}_b
  fi
  stop_server $v
  pack_results
done
echo "done at ${SECONDS}s"
