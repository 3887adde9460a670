#!/usr/bin/env bash
# Session 55 call 2; carry [".whl", ".device_tree"]. ~420 s (no checkpoint: random real-size codec weights).
# Two codec changes, both off by default until measured:
#  - the last convolution (96 -> 1 channel) on its own bandwidth-bound kernel (kernels/one_channel_conv_cl.py,
#    VOXFLOW_CODEC_ONE_CHANNEL_KERNEL): 273 us of a 16-stream 25-frame call on the implicit GEMM (H100, 64 SMs,
#    session 54), ~75 us of input to read;
#  - TMA tiles across a batch's sequences (VOXFLOW_CONV_TMA_FLAT) for the low-rate layers that took the pointer
#    kernel (the first upsampling convolution: 325 us at 39% of peak);
#  - with it, the first convolution channels-last (VOXFLOW_CODEC_FIRST_CONV_CL) instead of im2col + GEMM + bias +
#    two transposing copies + a SnakeBeta pass (~210 us).
# (in this order: the A/B first, so that a cut call keeps it)
# 1. Their GPU tests (the small kernels' module, and the flat / one-channel tests of the codec's).
# 2. tune_one_channel_conv.py: the kernel's launches against the implicit GEMM at 16 x 25 frames on 64 SMs.
# 3. ab_codec_call.py: the whole codec call (1 / 5 / 25 frames), base / one-channel / flat + first conv / all three,
#    two rounds.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call
W=models.qwen3_tts.codec_waveform_cl.ONE_CHANNEL_KERNEL=True
F=kernels.causal_conv.CONV_TMA_FLAT=True,models.qwen3_tts.codec_waveform_cl.FIRST_CONV_CL=True
timeout 240 python3 benchmarks/scripts/ab_codec_call.py --rounds 2 base "one:$W" "flat:$F" "all:$W,$F" \
  > "$R/ab_codec_call.txt" 2>&1
grep -E "codec|Error" "$R/ab_codec_call.txt"
pack_results
gpu_tests 150 tests/gpu/test_gpu_codec_small_kernels.py tests/gpu/test_gpu_codec.py -k "one_channel or flat"
pack_results
timeout 120 python3 benchmarks/scripts/tune_one_channel_conv.py 16 25 64 > "$R/tune_one_channel_conv.txt" 2>&1
grep -E "current|BEST|failed|Error" "$R/tune_one_channel_conv.txt"
pack_results
echo "done at ${SECONDS}s"
