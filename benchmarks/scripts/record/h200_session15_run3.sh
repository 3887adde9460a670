#!/usr/bin/env bash
# Session 15, call 3 (carry [".whl"]): the codec in fp16 (codec_dtype=float16: the channels-last Triton stack now
# takes fp16, with bf16's tuned configs).
#  1. every GPU codec test, with the new fp16 ones (streamed SNR against the fp32 one pass; the channels-last stack
#     against the [B, C, T] fp16 path);
#  2. codec_snr at 150 frames in fp16 (real-size random weights), profile_codec 16 x {1, 25} frames in fp16;
#  3. an A/B on one machine, offline c=256: the fp16 codec against the default (fp32 with TF32);
#  4. if the clock allows: tune_causal_conv.py at the serving batch in fp16.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 200 tests/gpu/test_gpu_codec.py
echo "tests done at ${SECONDS}s"
wait $CK
timeout 60 python3 -m voxflow.tools.codec_snr --model /tmp/real-1.7b --dtype float16 > $R/codec_snr_fp16.txt 2>&1
head -1 $R/codec_snr_fp16.txt
timeout 70 python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 16 fp16 2>&1 | grep -v Warn > $R/profile_codec_16_fp16.txt
grep -E "per call" $R/profile_codec_16_fp16.txt
bench_offline fp16 --engine-arg codec_dtype=float16
bench_offline fp32
if [ $SECONDS -lt 470 ]; then
  timeout $((575 - SECONDS)) python3 benchmarks/scripts/tune_causal_conv.py 16 25 float16 > $R/tune_causal_conv_fp16.txt 2>&1
  grep -E "^BEST|per call" $R/tune_causal_conv_fp16.txt
fi
echo "done at ${SECONDS}s"
