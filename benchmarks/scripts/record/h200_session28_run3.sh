#!/usr/bin/env bash
# Session 28 call 3 (tree b0af70a, 309 s); carry [".whl", ".device_tree"]. Its `--roles` mode and
# VOXFLOW_CP_PRELOAD were removed after this call (every role lost): on later trees they do nothing or fail.
# The weight preload on by default for the talker's one-row GEMMs (kernels/pdl.py: widths >= 2048; call 2: c=1 step
# 3.42 -> 3.36 ms, RTF 0.044 -> 0.043).
# 1. GPU tests: PDL on / off / preload (every width) equal bits; the one-row layers and the fp32 engine against the
#    CPU reference's codes under the new defaults;
# 2. tune_weight_preload.py --roles: the code predictor's predict frame with the preload forced on per GEMM role
#    (call 1: all roles at once 1,908 -> 2,143 us; its fused layer steps alone 25.6 -> 24.3);
# 3. 1.7B c=1: the new defaults, preload off, and the defaults + the code predictor's layer GEMMs
#    (VOXFLOW_CP_PRELOAD=qkv,gate_up,down); step profiles of the defaults and the latter.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
gpu_tests 200 tests/gpu/test_gpu_pdl.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_one_row_norm_linear_layers_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference"
pack_results
timeout 150 python3 benchmarks/scripts/tune_weight_preload.py --roles 2>&1 | grep -v Warn \
  | tee $R/tune_weight_preload_roles.txt
pack_results
wait $CK
bench_1p7b_at 1 defaults
VOXFLOW_PDL_PRELOAD=0 bench_1p7b_at 1 off
VOXFLOW_CP_PRELOAD=qkv,gate_up,down bench_1p7b_at 1 cp_layers
pack_results
for v in defaults cp_layers; do
  case $v in defaults) e=(VOXFLOW_CP_PRELOAD=) ;; *) e=(VOXFLOW_CP_PRELOAD=qkv,gate_up,down) ;; esac
  env "${e[@]}" timeout 120 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 --no-eager 2>&1 \
    | grep -v Warn > $R/profile_step_1p7b_1_$v.txt
  head -12 $R/profile_step_1p7b_1_$v.txt
done
echo "done at ${SECONDS}s"
