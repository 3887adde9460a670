#!/usr/bin/env bash
# Session 28 call 4; carry [".whl", ".device_tree"].
# The codec's transposed convolutions in sub-pixel form (codec_waveform_cl.SUBPIXEL, VOXFLOW_CODEC_SUBPIXEL=1, off
# until measured): each upsampling block's SnakeBeta + GEMM + overlap-add becomes a SnakeBeta pass and one two-tap
# convolution (call 2: overlap-add 8% and the GEMMs ~7% of a 25-frame codec call).
# 1. GPU tests of the codec with it on (the whole file: fp32 against the plain decoder, fp16 / bf16 SNRs, TMA,
#    graphs, the partition);
# 2. the codec alone, fp16 on 64 SMs, 16 streams, 1 / 5 / 10 / 25 frames: off / on;
# 3. 0.6B c=64 in the <= 8 GB configuration: off / on (701.6 audio-s/s in session 27).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup /tmp/r
archive_results
real_checkpoint_bg
small_checkpoint_bg
wait $CK
VOXFLOW_CODEC_SUBPIXEL=1 gpu_tests 200 tests/gpu/test_gpu_codec.py
pack_results
for v in 0 1; do
  VOXFLOW_CODEC_SUBPIXEL=$v timeout 100 python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 16 fp16+sms64 \
    1,5,10,25 20 2>&1 | grep -v -i warn > $R/profile_codec_16_fp16_sms64_subpixel$v.txt
  grep -E "per call" $R/profile_codec_16_fp16_sms64_subpixel$v.txt
done
pack_results
wait $CK6
bench_small_traced subpixel0
VOXFLOW_CODEC_SUBPIXEL=1 bench_small_traced subpixel1
echo "done at ${SECONDS}s"
