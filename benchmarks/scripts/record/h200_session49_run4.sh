#!/usr/bin/env bash
# Session 49, call 4; carry [".whl", ".device_tree"]. ~250 s (the session's last 327 s of device time).
# Call 3's codec profile lost its two-kernel half to the 100 s limit (a fresh machine compiling), and its fused half
# gave 4.98 ms at 5 frames against call 1's 3.89 (two kernels) / 3.95 (fused, session 48's tiles) on another
# machine: the codec call at 64 SMs, 16 streams, 1 / 5 / 25 frames, two kernels and fused alternating on one machine.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
wait $CK6
export CODEC_MODEL=/tmp/real-0.6b
PROFILE_LIMIT=200 profile_codec_16 two_kernels_0 VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=0        # (compiles the kernels)
profile_codec_16 fused_1 VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=1
profile_codec_16 two_kernels_1 VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=0
profile_codec_16 fused_2 VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=1
pack_results
echo "done at ${SECONDS}s"
