#!/usr/bin/env bash
# Prepared in session 14 (its device time spent) for the next session's first call, carry [".whl"] (~10 MB now;
# add ".whl-official" only for the official / clone stages):
#  1. GPU tests with the convolutions' epilogue SnakeBeta on sin.approx (causal_conv.FAST_EPILOGUE_SIN, default on
#     since b5e58f6; session 14 call 6 ran only the SNR tests with it): every codec test, incl. the bf16
#     channels-last stack against the bf16 [B, C, T] kernels;
#  2. profile_codec.py 16 fp32 (session 14 call 4, before it: 16.64 ms of kernels a 16 x 25-frame call, 18.36 ms a
#     call);
#  3. an A/B on one machine, offline c=256 (512 prompts) with it (default) and without (VOXFLOW_CONV_FAST_SIN=0;
#     session 14 call 5 on another machine: 824.1 without), then HTTP c=64 with it (session 14: 462.4-479.0);
#  4. conv_epilogue_cost.py: the fused 96-channel residual unit (residual_unit.py, off by default) against its two
#     kernels; if it wins, the GPU codec tests with VOXFLOW_FUSED_RESIDUAL_UNIT=1 in the next call.
# (~600 s in all: the later steps are skipped when the clock says they would not fit.)
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 170 tests/gpu/test_gpu_codec.py
echo "tests done at ${SECONDS}s"
wait $CK
timeout 60 python3 benchmarks/scripts/conv_epilogue_cost.py 16 25 float32,bfloat16 > $R/conv_epilogue_cost.txt 2>&1
tail -3 $R/conv_epilogue_cost.txt
timeout 70 python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 16 fp32 2>&1 | grep -v Warn > $R/profile_codec_16.txt
grep -E "per call" $R/profile_codec_16.txt
bench_offline fastsin
[ $SECONDS -lt 470 ] && { export VOXFLOW_CONV_FAST_SIN=0; bench_offline libdevicesin; unset VOXFLOW_CONV_FAST_SIN; }
if [ $SECONDS -lt 420 ] && serve_variant fastsin; then
  bench_http --label http-fastsin --concurrency 64 --num-prompts 256 --num-warmups 8 \
    --output $R/h200_1p7b_http_c64_fastsin.json
fi
stop_server fastsin
echo "done at ${SECONDS}s"
