#!/usr/bin/env bash
# Prepared in session 44, run in session 45 call 1; carry [".whl", ".device_tree"]. ~500 s, in the
# order of what matters (the call may be cut): 4, 2, 3, 1, 5.
# CP_JOINT_PREFILL is the default since session 44 (its calls 1-2), at every row count.
# 1. probe_gemm_layouts.py: whether cuBLAS serves the decode layers' 64- / 128-row GEMMs faster with the weight
#    stored [K, N] than F.linear's [N, K], or with fp32 split-K reductions (no engine change).
# 2. tune_splitk_linear.py --quick: the one-launch split-K residual GEMM (VOXFLOW_SPLITK_RESIDUAL, built in session
#    44, off) against cuBLAS's addmm_ at o_proj / down_proj, 64 and 128 rows; without a residual against cuBLAS's mm
#    at q|k|v and gate|up (K 1024).
# 3. GPU tests: splitk_linear at the real shapes (eager, graph, through the folded layers), the tests whose counts
#    follow the joint default (the fused layer at one row, folded norms and split prefill at 64 rows held to their
#    own paths), the joint ones, the engine above the skinny sizes (split held) and joint.
# 4. 0.6B c=64 offline (<= 8 GB configuration, 640 prompts): defaults / splitk / defaults / splitk, step traces;
#    then splitkall: VOXFLOW_SPLITK_PROJECTIONS too (q|k|v and gate|up through the kernel without a residual).
# 5. 0.6B c=64 over HTTP on the defaults, a second server (session 44 call 1: 741.08).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
for run in defaults_1 splitk_1 defaults_2 splitk_2 splitkall_1; do
  case $run in splitk*) export VOXFLOW_SPLITK_RESIDUAL=1 ;; *) export VOXFLOW_SPLITK_RESIDUAL=0 ;; esac
  case $run in splitkall*) export VOXFLOW_SPLITK_PROJECTIONS=1 ;; *) export VOXFLOW_SPLITK_PROJECTIONS=0 ;; esac
  bench_small_traced $run
  pack_results
done
unset VOXFLOW_SPLITK_RESIDUAL VOXFLOW_SPLITK_PROJECTIONS
grep -h "^| c=" $R/h200_0p6b_offline_c64_*.md
summarize_steps "steps_0p6b_*.jsonl" 12
grep -h "^span\|^| full |" $R/step_summaries.txt
timeout 120 python3 benchmarks/scripts/tune_splitk_linear.py --quick > $R/tune_splitk_linear.txt 2>&1
cut -c1-300 $R/tune_splitk_linear.txt | grep -v "^    "
pack_results
gpu_tests 170 tests/gpu/test_gpu_splitk_linear.py tests/gpu/test_gpu_cp_layer.py tests/gpu/test_gpu_engine.py \
  -k "splitk or fused_layer_on_vs_off or folded_norms_on_vs_off or split_prefill or joint or above_the_skinny"
echo "  at ${SECONDS}s"
pack_results
timeout 60 python3 benchmarks/scripts/probe_gemm_layouts.py > $R/probe_gemm_layouts.txt 2>&1
cut -c1-300 $R/probe_gemm_layouts.txt
pack_results
if serve_small defaults; then
  bench_http_small defaults
  stop_server defaults
fi
grep -h "^| c=" $R/h200_0p6b_http_c64_defaults.md
echo "done at ${SECONDS}s"
