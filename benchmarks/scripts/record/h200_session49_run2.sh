#!/usr/bin/env bash
# Session 49, call 2; carry [".whl", ".device_tree"]. ~500 s.
# The fused fp16 residual unit, now on by default with call 1's sweep winners as CONFIGS (96: 4 warps, 4 stages;
# 192: 64 rows, 4 warps, 3 stages): the codec's fp16 GPU tests with it, the probe's sweep around the new tiles,
# the served 0.6B c=64 <= 8 GB offline A/B (alternating, off / on) and one HTTP run with it on.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
gpu_tests 200 tests/gpu/test_gpu_codec.py -k "fp16 or tma or split_n or auto_codec"
timeout 100 python3 benchmarks/scripts/probe_residual_unit_tma.py --sweep 2>&1 | grep -v -i warn | tee $R/probe_residual_unit_tma.txt
pack_results
wait $CK6
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=0
bench_small_first off_0                                              # (compiles the kernels)
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=1
bench_small_traced on_1
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=0
bench_small_traced off_1
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=1
bench_small_traced on_2
pack_results
http_small on_h1
summarize_steps "steps_*.jsonl*" 40
grep -h "turnover" $R/step_summaries.txt
report_runs
pack_results
echo "done at ${SECONDS}s"
