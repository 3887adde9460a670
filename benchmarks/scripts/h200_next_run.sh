#!/usr/bin/env bash
# Prepared in session 26 (NOT YET RUN: that session's device time was spent; rename it to the session's run name
# once it has run, and keep it as that call's record). `bash benchmarks/scripts/stamp_tree.sh` first; carry
# [".whl", ".device_tree"]. About 400 s.
# The talker's decode with the per-head q/k norms and RoPE inside the paged decode kernel (paged_decode_attention's
# norm_rope, PagedLayerView.attend_raw; off by default until this has run: VOXFLOW_PAGED_NORM_ROPE=1):
# 1. GPU tests with it on: the one-row (c=1) layers and the fp32 engine against the CPU reference's codes, the kernel
#    variant against qk_norm_rope + the plain kernel at the talker's shapes (and the whole paged-attention file);
# 2. 1.7B c=1 off / on (RTF target 0.04: 0.044 in session 26) and the step profile (28 launches fewer a frame);
# 3. 1.7B c=64 off / on (the tensor-core variant takes it too).
# Turn it on by default (paged_attention.PAGED_NORM_ROPE) if the tests pass and neither run is slower.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
VOXFLOW_PAGED_NORM_ROPE=1 gpu_tests 200 \
  "tests/gpu/test_gpu_engine.py::test_gpu_one_row_norm_linear_layers_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference" tests/gpu/test_gpu_paged_attention.py
pack_results
wait $CK
bench_1p7b_at 1 nr_off
VOXFLOW_PAGED_NORM_ROPE=1 bench_1p7b_at 1 nr_on
pack_results
for v in 0 1; do
  VOXFLOW_PAGED_NORM_ROPE=$v timeout 120 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 --no-eager 2>&1 \
    | grep -v Warn > $R/profile_step_1p7b_1_nr$v.txt
  head -12 $R/profile_step_1p7b_1_nr$v.txt
done
pack_results
bench_1p7b_at 64 nr_off
VOXFLOW_PAGED_NORM_ROPE=1 bench_1p7b_at 64 nr_on
echo "done at ${SECONDS}s"
