#!/usr/bin/env bash
# Session 55's last chance at a call (~400 s; 11 of 12 starts refused, ~520 s of device time left): carry
# [".whl", ".device_tree"]. In the order that keeps the most if cut:
# 1. the codec call alone (ab_codec_call.py: random real-size weights, fp16, 16 streams on 64 SMs, 1 / 5 / 25
#    frames), base against all three codec switches of this session on, two rounds (the last convolution's own
#    kernel, TMA tiles across sequences, the first convolution channels-last);
# 2. 0.6B c=64 over HTTP with chunk_ramp_factor=2 + codec_tail_chunk=10 (8 chunks a request): its underruns, then
#    the defaults on the same machine (session 54 call 2's H100 numbers for the other form beside it);
# 3. the switches' GPU tests.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
start_call 0.6B
W=models.qwen3_tts.codec_waveform_cl.ONE_CHANNEL_KERNEL=True
F=kernels.causal_conv.CONV_TMA_FLAT=True,models.qwen3_tts.codec_waveform_cl.FIRST_CONV_CL=True
timeout 150 python3 benchmarks/scripts/ab_codec_call.py --rounds 2 base "all:$W,$F" > "$R/ab_codec_call.txt" 2>&1
grep -E "codec|Error" "$R/ab_codec_call.txt"
pack_results
wait $CK6
http_small f2_1 --engine-arg chunk_ramp_factor=2 --engine-arg codec_tail_chunk=10
grep -H "ran dry" "$R"/*.md
pack_results
http_small d_1
pack_results
report_runs
gpu_tests 60 tests/gpu/test_gpu_codec_small_kernels.py tests/gpu/test_gpu_codec.py -k "one_channel or flat"
pack_results
echo "done at ${SECONDS}s"
