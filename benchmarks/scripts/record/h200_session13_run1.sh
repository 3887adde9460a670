#!/usr/bin/env bash
# (Ran on tree 193330c; cp_layer_batch.py, batch_linear.py and tune_batch_linear.py were removed after it: 94270a1, 34dbcfe.)
# Session 13, call 1 (carry [".whl"]): the code predictor's batch layer (voxflow/kernels/cp_layer_batch.py on
# batch_linear.py: five tensor-core kernels a layer with the norms folded into the weights, all PDL; switch
# VOXFLOW_CP_BATCH_LAYER=1, off by default until measured).
#  1. GPU tests: the new kernels and layer at the real shapes, predict on / off at 64 rows, the engine with it on
#     == the CPU reference (12 requests), and the tests session 12 could not fit (the whole engine file,
#     select_tokens and PDL after the draws' embedding-row copy);
#  2. tune_batch_linear.py at 8 / 16 / 64 / 256 rows (GEMMs vs the launches they replace, layer steps, predict);
#  3. profile_step with the switch on at c=8, 64, 256 (session 12, default: c=64 9.19 ms, c=256 20.86 ms).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 210 tests/gpu/test_gpu_batch_linear.py tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_select_tokens.py \
  tests/gpu/test_gpu_pdl.py
echo "tests done at ${SECONDS}s"
timeout 150 python3 benchmarks/scripts/tune_batch_linear.py --rows 8,16,64,256 --budget 45 2>&1 | grep -v Warn \
  > $R/tune_batch_linear.txt
tail -16 $R/tune_batch_linear.txt
wait $CK
VOXFLOW_CP_BATCH_LAYER=1 timeout 130 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64,8,256 2>&1 \
  | grep -v Warn > $R/profile_step_batch_64_8_256.txt
grep -E "ms per step|kernels per step" $R/profile_step_batch_64_8_256.txt
echo "done at ${SECONDS}s"
cd $OUT && tar czf res.tgz r && rm -rf r
