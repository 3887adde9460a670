#!/usr/bin/env bash
# Session 55 call 2; carry [".whl", ".device_tree"]. ~300 s (no checkpoint: random real-size codec weights).
# The codec's last convolution (96 -> 1 channel) on its own bandwidth-bound kernel (kernels/one_channel_conv_cl.py,
# VOXFLOW_CODEC_ONE_CHANNEL_KERNEL): 273 us of a 16-stream 25-frame call on the implicit GEMM (H100, 64 SMs,
# session 54), ~75 us of input to read.
# 1. Its GPU test, and the whole codec test module with the switch on (the stack against the plain decoder).
# 2. tune_one_channel_conv.py: its launches against the implicit GEMM at 16 x 25 frames on 64 SMs, then the whole
#    codec call (1 and 25 frames) alternating off / on / off / on.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call
VOXFLOW_CODEC_ONE_CHANNEL_KERNEL=1 gpu_tests 240 tests/gpu/test_gpu_codec_small_kernels.py tests/gpu/test_gpu_codec.py
pack_results
timeout 200 python3 benchmarks/scripts/tune_one_channel_conv.py 16 25 64 > "$R/tune_one_channel_conv.txt" 2>&1
grep -E "current|BEST|codec|failed|Error" "$R/tune_one_channel_conv.txt"
pack_results
echo "done at ${SECONDS}s"
