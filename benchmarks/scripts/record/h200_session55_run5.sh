#!/usr/bin/env bash
# Session 55, the codec part alone (~250 s; 13 of 14 starts refused, ~340 s of device time left): carry
# [".whl", ".device_tree"]. No checkpoint: random real-size codec weights.
# 1. ab_codec_call.py: 16 streams on 64 SMs, fp16, 1 / 5 / 25 frames, base against all three codec switches of this
#    session on (the last convolution's own kernel, TMA tiles across sequences, the first convolution channels-last),
#    two rounds;
# 2. the switches' GPU tests; 3. the one-channel kernel's launches (tune_one_channel_conv.py), if time is left.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call
W=models.qwen3_tts.codec_waveform_cl.ONE_CHANNEL_KERNEL=True
F=kernels.causal_conv.CONV_TMA_FLAT=True,models.qwen3_tts.codec_waveform_cl.FIRST_CONV_CL=True
timeout 150 python3 benchmarks/scripts/ab_codec_call.py --rounds 2 base "all:$W,$F" > "$R/ab_codec_call.txt" 2>&1
grep -E "codec|Error" "$R/ab_codec_call.txt"
pack_results
gpu_tests 60 tests/gpu/test_gpu_codec_small_kernels.py tests/gpu/test_gpu_codec.py -k "one_channel or flat"
pack_results
timeout 40 python3 benchmarks/scripts/tune_one_channel_conv.py 16 25 64 > "$R/tune_one_channel_conv.txt" 2>&1
grep -E "current|BEST|failed|Error" "$R/tune_one_channel_conv.txt"
pack_results
echo "done at ${SECONDS}s"
