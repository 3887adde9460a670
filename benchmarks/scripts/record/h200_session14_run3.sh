#!/usr/bin/env bash
# Session 14, call 3 (carry [".whl"]):
#  1. the dense-attention GPU tests again (call 2: the key check's one-ulp rule failed once at 256 rows where the
#     rotation cancels; now one ulp + 1e-5);
#  2. conv_epilogue_cost.py: each residual-unit convolution of the serving codec call (16 x 25 frames) bare, + bias,
#     as served (SnakeBeta / residual epilogue), and the stand-alone SnakeBeta pass; fp32 (TF32) and bf16;
#  3. Nsight Compute on the 96-channel convolutions as served (k=7 + SnakeBeta, k=1 + residual), fp32.
set -uo pipefail
source benchmarks/scripts/device_lib.sh
device_setup $OUT/r
gpu_tests 90 tests/gpu/test_gpu_dense_attention.py
echo "tests done at ${SECONDS}s"
timeout 150 python3 benchmarks/scripts/conv_epilogue_cost.py 16 25 float32,bfloat16 > $R/conv_epilogue_cost.txt 2>&1
cat $R/conv_epilogue_cost.txt
echo "epilogue done at ${SECONDS}s"
NCU="ncu --kernel-name regex:_conv_cl_kernel --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats"
timeout 120 $NCU --launch-skip 22 python3 benchmarks/scripts/conv_epilogue_cost.py 16 25 float32 --only 96 \
  > $R/ncu_conv96_k7_served.txt 2>&1
timeout 120 $NCU --launch-skip 55 python3 benchmarks/scripts/conv_epilogue_cost.py 16 25 float32 --only 96 \
  > $R/ncu_conv96_k1_served.txt 2>&1
grep -E "Duration|Throughput|Registers|Achieved Occupancy|ERR|Warp Cycles Per Issued" $R/ncu_conv96_k7_served.txt | head -20
echo "done at ${SECONDS}s"
