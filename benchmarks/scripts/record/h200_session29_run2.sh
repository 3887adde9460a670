#!/usr/bin/env bash
# Session 29 call 2; carry [".whl", ".device_tree"].
# (The radix-8 histogram select it measures was removed after this call, no faster: its code is in f31765a.)
# After call 1's c=1 timeline (the code predictor's 2-token first step 338 us against ~117 for a single-token step;
# the talker's c0 draw 31.7 us; four input copies a step):
# 1. GPU tests: select_tokens with the histogram select (radix 8), the fused layers and PDL, the engine's one-row
#    layers and fp32 run against the CPU reference's codes (the fused first step on by default now);
# 2. bench_select_tokens: radix 2 / 8 at 4-16 warps;
# 3. 1.7B c=1 timelines: the fused first step off, on (default), on + radix 8; then the bench with the best.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
gpu_tests 300 tests/gpu/test_gpu_select_tokens.py tests/gpu/test_gpu_cp_layer.py tests/gpu/test_gpu_pdl.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_one_row_norm_linear_layers_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference"
pack_results
timeout 100 python3 benchmarks/scripts/bench_select_tokens.py 2>&1 | grep -v -i warn > $R/bench_select_tokens.txt
cat $R/bench_select_tokens.txt
wait $CK
for v in prefill_off default radix8; do
  case $v in
    prefill_off) e=(VOXFLOW_CP_FUSED_PREFILL=0) ;;
    default) e=(VOXFLOW_CP_FUSED_PREFILL=1) ;;
    radix8) e=(VOXFLOW_SELECT_RADIX_BITS=8) ;;
  esac
  env "${e[@]}" timeout 120 python3 benchmarks/scripts/step_timeline.py record /tmp/real-1.7b 1 \
    $R/timeline_1p7b_c1_$v.json.gz 2>&1 | grep -v -i warn
  python3 benchmarks/scripts/step_timeline.py report $R/timeline_1p7b_c1_$v.json.gz > $R/timeline_1p7b_c1_$v.txt
  head -1 $R/timeline_1p7b_c1_$v.txt
  pack_results
done
bench_1p7b_at 1 default
VOXFLOW_SELECT_RADIX_BITS=8 bench_1p7b_at 1 radix8
echo "done at ${SECONDS}s"
