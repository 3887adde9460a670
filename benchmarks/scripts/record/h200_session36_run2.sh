#!/usr/bin/env bash
# Session 36 call 2; carry [".whl", ".device_tree"]. PAGED_NORM_ROPE ran at ebf07ba and was removed afterwards
# (slower at c=1: step 3.07 -> 3.12 ms; neutral at c=64).
# PAGED_NORM_ROPE (voxflow/layers/paged_attention.py then): the talker's decode steps hand the
# raw q / k projections to the paged decode kernel, which applies the q/k RMSNorm and RoPE itself: one launch
# (qk_norm_rope) fewer a layer step, 28 a talker step. Why: beside the codec each launch costs ~1.9 us more (0.6B
# c=64), and the 1.7B c=1 RTF sits on its 0.04 line (a step ~3.07 ms; 28 launches ~2-3 us each).
# 1. GPU tests: the kernel variant against qk_norm_rope + the plain kernel (1 / 16 / 64 rows, fp32 / bf16), the
#    fp32 engine with it on == the CPU loop (one row, twelve rows), and call 1's new default CP_SPLIT_PREFILL:
#    the fp32 engine at twelve rows == the CPU loop.
# 2. 1.7B c=1 offline off / on / off / on; 0.6B c=64 (<= 8 GB) off / on / off with step traces; 1.7B c=64 off / on.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B 0.6B
gpu_tests 200 "tests/gpu/test_gpu_paged_attention.py::test_norm_rope_variant_equals_qk_norm_rope_then_the_kernel" \
  "tests/gpu/test_gpu_engine.py::test_gpu_paged_norm_rope_engine_equals_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_fp32_batch_above_the_skinny_sizes_equals_cpu_reference"
pack_results
wait $CK
bench_1p7b_at 1 defaults
(export VOXFLOW_PAGED_NORM_ROPE=1; bench_1p7b_at 1 paged_norm_rope)
bench_1p7b_at 1 defaults_again
(export VOXFLOW_PAGED_NORM_ROPE=1; bench_1p7b_at 1 paged_norm_rope_again)
pack_results
wait $CK6
bench_small_traced defaults
(export VOXFLOW_PAGED_NORM_ROPE=1; bench_small_traced paged_norm_rope)
bench_small_traced defaults_again
summarize_steps "steps_*.jsonl" 16
pack_results
bench_1p7b_at 64 c64_defaults
(export VOXFLOW_PAGED_NORM_ROPE=1; bench_1p7b_at 64 c64_paged_norm_rope)
pack_results
echo "done at ${SECONDS}s"
