#!/usr/bin/env bash
# Session 28 call 1; carry [".whl", ".device_tree"].
# The weight preload (kernels/pdl.py, VOXFLOW_PDL_PRELOAD=1, off by default until this has run): the one-row GEMMs
# (norm_linear, skinny_linear) load their first K step of weights before the PDL wait, so HBM keeps streaming while
# the kernel before finishes.
# 1. GPU tests: PDL on / off / preload equal bits (chained kernels, the code predictor's frame, graphed); with the
#    preload on, the one-row layers and the fp32 engine against the CPU reference's codes;
# 2. tune_weight_preload.py: the code predictor's fused layer step and predict frame, the talker's one-row layer
#    step, off / on (predict frame 1,897-1,902 us in session 27);
# 3. 1.7B c=1 off / preload (RTF target 0.04: 0.044) and their step profiles (3.42 ms a step in session 27).
# Turn it on by default if the tests pass and c=1 is faster.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
gpu_tests 100 tests/gpu/test_gpu_pdl.py
mv $R/gpu_tests.txt $R/gpu_tests_pdl.txt
VOXFLOW_PDL_PRELOAD=1 gpu_tests 150 \
  "tests/gpu/test_gpu_engine.py::test_gpu_one_row_norm_linear_layers_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference"
pack_results
timeout 150 python3 benchmarks/scripts/tune_weight_preload.py 2>&1 | grep -v Warn | tee $R/tune_weight_preload.txt
pack_results
wait $CK
bench_1p7b_at 1 off
VOXFLOW_PDL_PRELOAD=1 bench_1p7b_at 1 preload
pack_results
for v in off preload; do
  case $v in off) e=(VOXFLOW_PDL_PRELOAD=0) ;; preload) e=(VOXFLOW_PDL_PRELOAD=1) ;; esac
  env "${e[@]}" timeout 120 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 --no-eager 2>&1 \
    | grep -v Warn > $R/profile_step_1p7b_1_$v.txt
  head -12 $R/profile_step_1p7b_1_$v.txt
done
echo "done at ${SECONDS}s"
