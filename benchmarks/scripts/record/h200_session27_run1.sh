#!/usr/bin/env bash
# Prepared in session 26; ran as session 27 call 1 (tree c03b450, 326 s).
# Carry [".whl", ".device_tree"].
# The paged norm_rope and last-split merge that the switches below turn on were removed in 1d3e098 (their code is
# in c03b450): on later trees the switches do nothing, and every "nr" / "nr_lsm" / "both" run is the default path.
# Two launches fewer a talker layer at decode, both off by default until this has run:
#   VOXFLOW_PAGED_NORM_ROPE=1          the per-head q/k norms and RoPE inside the paged decode kernel (norm_rope,
#                                      PagedLayerView.attend_raw): no qk_norm_rope launch;
#   VOXFLOW_PAGED_LAST_SPLIT_MERGES=1  split-K merged by each (row, KV head)'s last split: no combine launch (at
#                                      small batches, where the split count is above one).
# 1. GPU tests with both on: the one-row (c=1) layers and the fp32 engine against the CPU reference's codes, the
#    whole paged-attention file (norm_rope against qk_norm_rope + the plain kernel; the last-split merge against
#    the combine kernel, in a replayed graph);
# 2. 1.7B c=1: off, norm_rope, both (RTF target 0.04: 0.044 in session 26), and their step profiles;
# 3. 1.7B c=64: off, both (the tensor-core variant takes norm_rope; one split at 64 rows, 2-3 while the batch
#    ramps up and drains (17-49 rows), where the last split merges).
# Turn each on by default (paged_attention.PAGED_NORM_ROPE, paged_decode_attention.LAST_SPLIT_MERGES) if the
# tests pass and no run is slower.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
both=(VOXFLOW_PAGED_NORM_ROPE=1 VOXFLOW_PAGED_LAST_SPLIT_MERGES=1)
# (a variable set in front of a shell function holds for that call only)
VOXFLOW_PAGED_NORM_ROPE=1 VOXFLOW_PAGED_LAST_SPLIT_MERGES=1 gpu_tests 200 \
  "tests/gpu/test_gpu_engine.py::test_gpu_one_row_norm_linear_layers_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_engine_equals_cpu_reference" tests/gpu/test_gpu_paged_attention.py
pack_results
wait $CK
bench_1p7b_at 1 off
VOXFLOW_PAGED_NORM_ROPE=1 bench_1p7b_at 1 nr
VOXFLOW_PAGED_NORM_ROPE=1 VOXFLOW_PAGED_LAST_SPLIT_MERGES=1 bench_1p7b_at 1 nr_lsm
pack_results
for v in off nr both; do
  case $v in off) e=() ;; nr) e=(VOXFLOW_PAGED_NORM_ROPE=1) ;; both) e=("${both[@]}") ;; esac
  env "${e[@]}" timeout 120 python3 benchmarks/scripts/profile_step.py /tmp/real-1.7b 1 --no-eager 2>&1 \
    | grep -v Warn > $R/profile_step_1p7b_1_$v.txt
  head -12 $R/profile_step_1p7b_1_$v.txt
done
pack_results
bench_1p7b_at 64 off
VOXFLOW_PAGED_NORM_ROPE=1 VOXFLOW_PAGED_LAST_SPLIT_MERGES=1 bench_1p7b_at 64 nr_lsm
echo "done at ${SECONDS}s"
