#!/usr/bin/env bash
# (Ran on tree 94270a1; batch_linear.py and BATCH_GEMMS were removed after it: 34dbcfe. Its tests then are in 94270a1.)
# Session 13, call 2 (carry [".whl"]). Call 1's norm-folded batch layer is gone (a Triton pipeliner race, and
# slower in the served step); what stays of it: batch_linear.py's epilogue GEMMs without a norm (o_proj / down_proj +
# residual, gate|up + silu * up) in the per-layer path above the skinny sizes, qwen3_layer.BATCH_GEMMS (off unless
# VOXFLOW_BATCH_GEMMS=cp|talker|all).
#  1. GPU tests: batch_linear at the real shapes, a layer with it in a CUDA graph, the engine with it on == the CPU
#     reference (cp, all), and the tests call 1 could not reach (select_tokens, PDL, the rest of the engine file);
#  2. profile_step c=64 and 256: default, BATCH_GEMMS=cp, BATCH_GEMMS=all.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 170 tests/gpu/test_gpu_batch_linear.py "tests/gpu/test_gpu_engine.py::test_gpu_batch_gemms_equal_cpu_reference" \
  tests/gpu/test_gpu_select_tokens.py tests/gpu/test_gpu_pdl.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_single_request_equals_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_prefill_graphs_survive_slot_buffer_growth" \
  "tests/gpu/test_gpu_engine.py::test_gpu_engine_with_and_without_programmatic_dependent_launch_equals_cpu_reference"
echo "tests done at ${SECONDS}s"
wait $CK
for v in default cp all; do
  [ $v = default ] || export VOXFLOW_BATCH_GEMMS=$v
  timeout 100 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64,256 --no-eager 2>&1 | grep -v Warn \
    > $R/profile_step_64_256_$v.txt
  echo "$v: $(grep -E 'ms per step|kernels per step' $R/profile_step_64_256_$v.txt | cut -c1-60 | tr '\n' ' ')"
  unset VOXFLOW_BATCH_GEMMS
done
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
