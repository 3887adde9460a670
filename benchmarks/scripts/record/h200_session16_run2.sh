#!/usr/bin/env bash
# Session 16, second call (`bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]): the code
# predictor's one-launch layer step (voxflow/kernels/cp_persistent_layer.py: five phases with grid barriers).
#  1. its GPU tests: one launch == the five phase launches (bits, 1..64 rows), vs the torch layer, a CUDA graph of
#     5 layers x 14 steps at 64 rows, predict on vs off; the engine with it == the CPU reference (cp head_dim 16);
#  2. tune_cp_persistent.py: us per layer step vs the per-layer path at 1 / 8 / 64 rows, config variants, predict;
#  3. profile_step c=1 / 64 with VOXFLOW_CP_PERSISTENT=1 (from one row) against the defaults, same machine.
# (Ran as call 2 of session 16 on tree e0f44e9; the kernel, its tests and tune_cp_persistent.py were removed after
# it, not adopted: benchmarks/results/h200/2026-12-02-session16/README.md. Run it from e0f44e9.)
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 200 tests/gpu/test_gpu_cp_persistent_layer.py "tests/gpu/test_gpu_engine.py::test_gpu_persistent_code_predictor_layers_equal_cpu_reference"
echo "tests done at ${SECONDS}s"
timeout 150 python3 benchmarks/scripts/tune_cp_persistent.py --rows 1,8,64 2>&1 | grep -v Warn > $R/tune_cp_persistent.txt
cat $R/tune_cp_persistent.txt
echo "tune done at ${SECONDS}s"
wait $CK
timeout 90 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1,64 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_1_64_default.txt
grep -E "ms per step" $R/profile_step_1_64_default.txt
VOXFLOW_CP_PERSISTENT=1 VOXFLOW_CP_PERSISTENT_MIN_ROWS=1 timeout 90 python3 benchmarks/scripts/profile_step.py \
  /tmp/real-1.7b 1,64 --no-eager 2>&1 | grep -v Warn > $R/profile_step_1_64_persistent.txt
grep -E "ms per step" $R/profile_step_1_64_persistent.txt
echo "done at ${SECONDS}s"
