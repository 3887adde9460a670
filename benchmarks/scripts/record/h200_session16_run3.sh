#!/usr/bin/env bash
# Session 16, third call (`bash benchmarks/scripts/stamp_tree.sh` first; carry [".whl", ".device_tree"]): the second
# version of the persistent code-predictor layer (cp_persistent_layer.py: the norms folded into the weights and
# the epilogues, sums of squares left by the phase that writes the rows, every GEMM operand a plain pipelined load).
#  1. its GPU tests (one launch == the phase launches, first and chained layers; vs torch; a CUDA graph; predict);
#  2. tune_cp_persistent.py at 1 and 64 rows (call 2, first version: 46.3 / 101.6 us vs 22.4 / 37.1 today);
#  3. profile_step c=64, defaults vs VOXFLOW_CP_PERSISTENT=1 (from 2 rows), same machine.
# (Ran as call 3 of session 16 on tree d4ff870; the kernel, its tests and tune_cp_persistent.py were removed after
# it, not adopted: benchmarks/results/h200/2026-12-02-session16/README.md. Run it from d4ff870.)
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 130 tests/gpu/test_gpu_cp_persistent_layer.py
echo "tests done at ${SECONDS}s"
timeout 100 python3 benchmarks/scripts/tune_cp_persistent.py --rows 1,64 2>&1 | grep -v Warn > $R/tune_cp_persistent.txt
cat $R/tune_cp_persistent.txt
echo "tune done at ${SECONDS}s"
wait $CK
timeout 75 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 | grep -v Warn \
  > $R/profile_step_64_default.txt
grep -E "ms per step" $R/profile_step_64_default.txt
VOXFLOW_CP_PERSISTENT=1 timeout 75 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 64 --no-eager 2>&1 \
  | grep -v Warn > $R/profile_step_64_persistent.txt
grep -E "ms per step" $R/profile_step_64_persistent.txt
echo "done at ${SECONDS}s"
