#!/usr/bin/env bash
# Session 14, call 6 (carry [".whl"]; ~280 s of device time left): the convolutions' epilogue SnakeBeta on the
# hardware's sin.approx (causal_conv.FAST_EPILOGUE_SIN, VOXFLOW_CONV_FAST_SIN=1; off by default until this call):
#  1. conv_epilogue_cost.py: each served k=7 convolution with it, beside libdevice's sinf, fp32 (TF32) and bf16,
#     and the largest output difference;
#  2. the codec's streaming SNR tests with it on (TF32 >= 35 dB and bf16 against fp32 one pass).
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
timeout 70 python3 benchmarks/scripts/conv_epilogue_cost.py 16 25 float32,bfloat16 > $R/conv_epilogue_cost.txt 2>&1
cat $R/conv_epilogue_cost.txt
echo "epilogue done at ${SECONDS}s"
VOXFLOW_CONV_FAST_SIN=1 timeout 100 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider -s \
  tests/gpu/test_gpu_codec.py -k "tf32_streaming_snr or bf16_streaming_snr" > $R/gpu_tests.txt 2>&1
grep -E "snr|passed|failed|^E " $R/gpu_tests.txt | cut -c1-300 | tail -8
echo "done at ${SECONDS}s"
