#!/usr/bin/env bash
# Session 49, call 3; carry [".whl", ".device_tree"]. ~480 s.
# The fused fp16 residual unit (on by default since call 2) on the 1.7B, whose codec is the same: the codec call's
# kernel time at 64 SMs with the new tiles (two kernels / fused), and the 1.7B offline c=64 A/B (alternating,
# off / on) and c=1, so that the default changes no other target for the worse.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 1.7B
wait $CK
profile_codec_16 two_kernels VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=0
profile_codec_16 fused VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=1
pack_results
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=0
BENCH_LIMIT=330 bench_1p7b_c64 off_0                                 # (compiles the kernels)
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=1
bench_1p7b_c64 on_1
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=0
bench_1p7b_c64 off_1
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=1
bench_1p7b_c64 on_2
pack_results
bench_1p7b_at 1 on
export VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=0
bench_1p7b_at 1 off
summarize_steps "steps_*.jsonl*" 40
report_runs
pack_results
echo "done at ${SECONDS}s"
