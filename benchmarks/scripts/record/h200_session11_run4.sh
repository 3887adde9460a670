#!/usr/bin/env bash
# Session 11, call 4 (carry [".whl"]): the one-row heuristics call 3 chose (skinny ~N/512 columns and
# attention_o_proj 4 heads x 32 columns everywhere; norm_linear's 8-warp / 256-deep configs only at the talker's
# K >= 2048, the session-10 ones at the code predictor's K = 1024), top-k radix 2 bits a pass:
# GPU tests of the kernels and the engine at one row, profile_step c=1, HTTP c=1 (8 prompts) and c=64 (256).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 150 tests/gpu/test_gpu_cp_layer.py tests/gpu/test_gpu_skinny_linear.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_one_row_norm_linear_layers_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_single_request_equals_cpu_reference"
wait $CK
timeout 80 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_1_default.txt
grep -E "ms per step" $R/profile_step_1_default.txt
if serve_variant default; then
  bench_http --label http-default --concurrency 1 --num-prompts 8 --num-warmups 1 --output $R/h200_1p7b_http_c1_default.json
  [ $SECONDS -lt 450 ] && bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json
fi
stop_server default
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
