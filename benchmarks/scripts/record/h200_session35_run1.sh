#!/usr/bin/env bash
# Prepared in session 34 (no device lent that session); carry [".whl", ".device_tree"]. Run as session 35 call 1;
# h200_session35_run2.sh follows.
# The talker's cuBLAS GEMMs planned for the SMs the codec leaves (EngineConfig.talker_gemm_sms, off until this has
# run; voxflow/engine/gemm_sm_target.py). Why: the 0.6B's c=64 step is 5.7 ms alone and ~7.4 ms beside the codec on
# its 64 SMs; cuBLAS plans its 64-row GEMMs for all 132 SMs, so beside the codec the wide ones run in two waves.
# 1. GPU tests: the SM target set and put back, a graph captured under it equals the plain product, the fp32 engine
#    replaying only busy-variant graphs equals the CPU loop (bucket 16).
# 2. probe_gemm_sm_target.py: each layer GEMM (0.6B / code predictor, 1.7B talker) at 16 / 32 / 64 rows, planned
#    for 132 (none) / 68 / 64 SMs, alone and beside a load on a 64-SM green context, with the kernel cuBLAS picked.
#    If no target changes the kernel, cuBLAS ignores it here and the A/B below will show nothing: say so.
# 3. 0.6B c=64 (the open target): defaults / talker_gemm_sms=rest (busy steps) / the same through cuBLASLt, one
#    machine, step traces (summaries: "(busy graph)" groups) and footprints (twice the graphs from bucket 16: mind
#    the 8 GB). ~400 s. Then h200_session35_run2.sh on the same (warm) machine.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
gpu_tests 200 -s tests/gpu/test_gpu_gemm_sm_target.py \
  "tests/gpu/test_gpu_engine.py::test_gpu_busy_gemm_sm_target_graphs_equal_cpu_reference" \
  "tests/gpu/test_gpu_engine.py::test_gpu_graph_copies_engine_equals_cpu_reference"
echo "  at ${SECONDS}s"
# both orders of the targets: a kernel that follows the first target asked means cuBLAS's heuristics cache does not
# tell targets apart (then the busy graphs, captured after the plain ones, reuse the plain kernels)
timeout 100 python3 benchmarks/scripts/probe_gemm_sm_target.py > "$R/probe_gemm_sm_target.txt" 2>&1
timeout 100 python3 benchmarks/scripts/probe_gemm_sm_target.py --targets 64,68,none \
  > "$R/probe_gemm_sm_target_reversed.txt" 2>&1
# and through cuBLASLt (VOXFLOW_GEMM_SM_TARGET_LT=1's mechanism), in case the handle's target is ignored
timeout 100 python3 benchmarks/scripts/probe_gemm_sm_target.py --lt > "$R/probe_gemm_sm_target_lt.txt" 2>&1
grep -v -i warn "$R/probe_gemm_sm_target.txt" | head -30
echo "  at ${SECONDS}s"
pack_results
wait $CK6
bench_small_traced defaults
bench_small_traced gemm_rest --engine-arg talker_gemm_sms=rest
pack_results
(export VOXFLOW_GEMM_SM_TARGET_LT=1; bench_small_traced gemm_rest_lt --engine-arg talker_gemm_sms=rest)
summarize_steps "steps_0p6b_*.jsonl" 16
pack_results
echo "done at ${SECONDS}s"
