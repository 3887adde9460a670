#!/usr/bin/env bash
# Session 29 call 4; carry [".whl", ".device_tree"].
# (The projected input tables it measures were removed after this call, slower: every single-token step 117 ->
# 137 us; their code, tests and select_tokens' embed2 are in 29a3345. The defaults this session lands are its
# "tables_off" timeline. Call 5, a c=1 bench of those, found no device time left to start a machine.)
# This session's final defaults: the fused 2-token first step (call 2), the code predictor's projected input tables
# (PROJECTED_TABLES: the draws copy the projected row, no projection GEMM a step), the slot scalars gathered one
# index_select per dtype, the decode inputs in one copy:
# 1. GPU tests: the engine file (fp32 engine == CPU reference, PDL on / off, graphs, ...), no hidden host sync (the
#    attach path changed), select_tokens, the fused first step's layer count;
# 2. 1.7B c=1 timelines with the projected tables on / off, and the bench;
# 3. 0.6B c=64 (<= 8 GB configuration) and, if time is left, 1.7B c=64.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg
gpu_tests 300 tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_no_host_sync.py tests/gpu/test_gpu_select_tokens.py \
  "tests/gpu/test_gpu_cp_layer.py::test_predict_fused_layer_on_vs_off"
pack_results
wait $CK
for v in default tables_off; do
  case $v in default) e=(VOXFLOW_PROJECTED_TABLES=1) ;; tables_off) e=(VOXFLOW_PROJECTED_TABLES=0) ;; esac
  env "${e[@]}" timeout 120 python3 benchmarks/scripts/step_timeline.py record /tmp/real-1.7b 1 \
    $R/timeline_1p7b_c1_$v.json.gz 2>&1 | grep -v -i warn
  python3 benchmarks/scripts/step_timeline.py report $R/timeline_1p7b_c1_$v.json.gz > $R/timeline_1p7b_c1_$v.txt
  head -1 $R/timeline_1p7b_c1_$v.txt
done
pack_results
bench_1p7b_at 1 defaults
pack_results
wait $CK6
bench_small_traced defaults
pack_results
if [ $SECONDS -lt 420 ]; then bench_1p7b_at 64 defaults; fi
echo "done at ${SECONDS}s"
