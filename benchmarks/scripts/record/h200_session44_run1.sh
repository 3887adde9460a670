#!/usr/bin/env bash
# Session 44 call 1 (prepared in session 43); carry [".whl", ".device_tree"].
# ~480 s, in the order of what matters (the call may be cut).
# CP_JOINT_PREFILL (code_predictor.py, off until measured): the code predictor's 2-token first step as one pass of
# 2B rows through the folded layers (the attention core takes both positions: dense_decode_norm_rope.py's S-token
# form) instead of two passes of B rows. Why: session 40's 0.6B c=64 timeline (H100) has 16 layer passes a frame
# where 15 are needed, ~57 us each at 64 rows, mostly weight-streaming GEMMs that take 128 rows for about the
# price of 64; expected ~0.2 ms off a ~5.7 ms full step.
# 1. GPU tests: the S = 1 and S = 2 kernel (test_gpu_dense_attention: two tokens bit-equal to one at a time, eager
#    and replayed from a CUDA graph), the joint path against the split one at 64 rows, 0.6B and 1.7B shapes
#    (test_gpu_cp_layer -k joint / split_prefill).
# 2. 0.6B c=64 offline (<= 8 GB configuration, 640 prompts): split / joint / split / joint, step traces.
# 3. 0.6B c=64 over HTTP (the target's terms) with it on, one server; session 43 call 1's defaults: 710.9 / 711.3.
# 4. 1.7B c=64 offline (640 prompts): split / joint.
# 5. The fp32 engine above the skinny sizes with it on (a spy sees S = 2 in the captured step) and off against the
#    CPU reference (test_gpu_engine -k "joint or above_the_skinny").
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B 1.7B
gpu_tests 150 tests/gpu/test_gpu_dense_attention.py tests/gpu/test_gpu_cp_layer.py \
  -k "joint or split_prefill or norm_rope"
cp $R/gpu_tests.txt $R/gpu_tests_kernels.txt
echo "  at ${SECONDS}s"
pack_results
wait $CK6
for run in split_1 joint_1 split_2 joint_2; do
  case $run in joint*) export VOXFLOW_CP_JOINT_PREFILL=1 ;; *) export VOXFLOW_CP_JOINT_PREFILL=0 ;; esac
  bench_small_traced $run
  pack_results
done
grep -h "^| c=" $R/h200_0p6b_offline_c64_*.md
export VOXFLOW_CP_JOINT_PREFILL=1
if serve_small joint; then
  bench_http_small joint
  stop_server joint
fi
pack_results
wait $CK
for run in split joint; do
  case $run in joint*) export VOXFLOW_CP_JOINT_PREFILL=1 ;; *) export VOXFLOW_CP_JOINT_PREFILL=0 ;; esac
  bench_1p7b_c64 $run
  pack_results
done
summarize_steps "steps_*.jsonl" 12
grep -h "^span\|^| full |" $R/step_summaries.txt
gpu_tests 120 tests/gpu/test_gpu_engine.py -k "joint or above_the_skinny"
echo "done at ${SECONDS}s"
