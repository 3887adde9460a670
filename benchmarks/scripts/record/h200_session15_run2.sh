#!/usr/bin/env bash
# Prepared in session 14 for the next session's second call, carry [".whl"]:
#  1. tune_causal_conv.py at the serving codec batch (16 streams x 25 frames), fp32 (TF32) then bf16: the
#     candidates now include 128 x 128 tiles with registers capped at 128 (two 8-warp blocks an SM instead of one;
#     benchmarks/results/h200/2026-12-02-session14/conv_occupancy_sm90.txt: 40 B of spill a thread) and the
#     epilogue's sin.approx makes the old winners' register use differ (157 / 170 registers at 128 x 128, 8 warps);
#     paste the printed TUNED rows that win into causal_conv.TUNED;
#  2. the GPU codec tests with the fused residual unit on (VOXFLOW_FUSED_RESIDUAL_UNIT=1), if call 1's
#     conv_epilogue_cost.py showed it faster than its two kernels.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
timeout 300 python3 benchmarks/scripts/tune_causal_conv.py 16 25 float32,bfloat16 > $R/tune_causal_conv.txt 2>&1
grep -E "^BEST|per call|TUNED|^    \(" $R/tune_causal_conv.txt
echo "tune done at ${SECONDS}s"
VOXFLOW_FUSED_RESIDUAL_UNIT=1 gpu_tests $((560 - SECONDS)) tests/gpu/test_gpu_codec.py
echo "done at ${SECONDS}s"
