#!/usr/bin/env bash
# Session 11, call 2 (carry [".whl"]): one-row launch configs from the tunes (norm_linear 8 warps for plain GEMMs,
# K steps of 256 for the talker's gate|up; skinny_linear ~N/512 columns a program at one row; attention_o_proj 4
# heads x 32 columns) and the top-k radix select 4 bits a pass (was 1):
#  1. GPU tests of the kernels touched and the engine at one row (ONE_ROW_NORM_LINEAR now on by default, and off);
#  2. bench_select_tokens (radix bits 1 / 2 / 4 x warps 4 / 8), tune_talker_one_row, tune_cp_layer --rows 1,
#     tune_skinny_linear --rows 1: the new heuristics against their neighbours;
#  3. profile_step c=1 with the defaults and with code_predictor.CP_NORM_LINEAR_LM_HEAD (norm_linear's lm_head at
#     8 warps vs skinny_linear's norm prologue);
#  4. HTTP c=1 (8 prompts) and c=64 (256) with the defaults (call 1: c=1 RTF 0.049 with the one-row layers on).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 170 tests/gpu/test_gpu_select_tokens.py tests/gpu/test_gpu_cp_layer.py tests/gpu/test_gpu_skinny_linear.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_one_row_norm_linear_layers_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_single_request_equals_cpu_reference"
timeout 60 python3 benchmarks/scripts/bench_select_tokens.py > $R/bench_select_tokens.txt 2>&1; cat $R/bench_select_tokens.txt
timeout 90 python3 benchmarks/scripts/tune_talker_one_row.py --budget 40 2>&1 | grep -v Warn > $R/tune_talker_one_row.txt
tail -9 $R/tune_talker_one_row.txt
timeout 100 python3 benchmarks/scripts/tune_cp_layer.py --rows 1 --budget 40 2>&1 | grep -v Warn > $R/tune_cp_layer.txt
tail -14 $R/tune_cp_layer.txt
timeout 80 python3 benchmarks/scripts/tune_skinny_linear.py --rows 1 --budget 40 2>&1 | grep -v Warn > $R/tune_skinny_linear.txt
wait $CK
timeout 70 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_1_default.txt
grep -E "per step" $R/profile_step_1_default.txt
timeout 70 python3 -c "
import runpy, sys
import voxflow.models.qwen3_tts.code_predictor as cp
cp.CP_NORM_LINEAR_LM_HEAD = True
sys.argv = ['profile_step.py', '/tmp/real-1.7b', '1', '--no-eager']
runpy.run_path('benchmarks/scripts/profile_step.py', run_name='__main__')" 2>&1 | grep -v Warn > $R/profile_step_1_nl_lm_head.txt
grep -E "per step" $R/profile_step_1_nl_lm_head.txt
echo "at ${SECONDS}s"
if serve_variant default; then
  bench_http --label http-default --concurrency 1 --num-prompts 8 --num-warmups 1 --output $R/h200_1p7b_http_c1_default.json
  [ $SECONDS -lt 520 ] && bench_http --label http-default --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_default.json
fi
stop_server default
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
