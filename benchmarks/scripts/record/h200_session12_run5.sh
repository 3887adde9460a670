#!/usr/bin/env bash
# Session 12, call 5 (carry [".whl"]; ~6 minutes of device time left): two launch cuts at c=1, each switchable:
#  - the code predictor's 2-token first step through the norm-folded layer path (qwen3_layer.NORM_FOLDED_SEQUENCE_
#    TOKENS, VOXFLOW_NORM_FOLDED_SEQUENCE_TOKENS=0 off): rms_norm + cuBLAS + silu_mul -> norm_linear, PDL;
#  - the draws copy the drawn code's embedding row (code_predictor.DRAW_AND_EMBED, VOXFLOW_DRAW_AND_EMBED=0 off).
#  1. GPU tests: the engine at one row == the CPU reference (both on), PDL on / off equal, select_tokens;
#  2. profile_step c=1 with both, with each off (call 3: 3.53 ms);
#  3. HTTP c=1 (8 prompts) with both on.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 100 "tests/gpu/test_gpu_engine.py::test_gpu_one_row_norm_linear_layers_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_engine_codes_equal_with_pdl_on_and_off" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference" \
  tests/gpu/test_gpu_select_tokens.py tests/gpu/test_gpu_pdl.py
wait $CK
for v in both noseq noembed; do
  case $v in noseq) export VOXFLOW_NORM_FOLDED_SEQUENCE_TOKENS=0;; noembed) export VOXFLOW_DRAW_AND_EMBED=0;; esac
  timeout 60 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 --no-eager 2>&1 | grep -v Warn \
    > $R/profile_step_1_$v.txt
  echo "$v: $(grep -E 'ms per step' $R/profile_step_1_$v.txt | cut -c1-40) $(grep -E 'kernels per step' $R/profile_step_1_$v.txt | cut -c1-60)"
  unset VOXFLOW_NORM_FOLDED_SEQUENCE_TOKENS VOXFLOW_DRAW_AND_EMBED
done
if [ $SECONDS -lt 270 ] && serve_variant default; then
  bench_http --label http-default --concurrency 1 --num-prompts 8 --num-warmups 1 --output $R/h200_1p7b_http_c1_default.json
  stop_server default
fi
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
