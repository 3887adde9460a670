#!/usr/bin/env bash
# Session 14, call 2 (carry [".whl"]):
#  1. the dense-attention GPU tests with the one-warp code-predictor attention now the default (call 1's failing
#     256-row bf16 case now attends over the query the kernel wrote);
#  2. the paged decode's candidates at every context for each served row count (tune_paged_decode.py --matrix, K/V
#     rotated past L2): the launch to choose on the host by batch alone;
#  3. the codec's kernels at the serving batch (16 streams) and at 64, fp32/TF32 and bf16 (profile_codec.py, top 30):
#     where the codec's ~45 us a stream-frame goes.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
real_checkpoint_bg
gpu_tests 90 tests/gpu/test_gpu_dense_attention.py
echo "tests done at ${SECONDS}s"
timeout 230 python3 benchmarks/scripts/tune_paged_decode.py --matrix --rows 16,64,128,256 \
  --contexts 64,128,256,512,1024,2048 > $R/tune_paged_decode_matrix.txt 2>&1
grep -E "most robust|Error" $R/tune_paged_decode_matrix.txt
echo "matrix done at ${SECONDS}s"
wait $CK
timeout $((560 - SECONDS)) python3 benchmarks/scripts/profile_codec.py /tmp/real-1.7b 16 fp32,bf16 2>&1 | grep -v Warn \
  > $R/profile_codec_16.txt
grep -E "per call" $R/profile_codec_16.txt
(which ncu nsys; nvcc --version | tail -1) > $R/tools.txt 2>&1
echo "done at ${SECONDS}s"
